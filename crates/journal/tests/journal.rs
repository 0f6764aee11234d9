//! Journal behaviour on real files: modes, rotation, recovery, damage.

#![forbid(unsafe_code)]

use memfs_journal::recovery::{repair, verify};
use memfs_journal::{DataDir, Durability, Error, Journal, JournalOptions, SimStorage, storage};
use rand::{Rng, SeedableRng, rngs::StdRng};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn poll_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn payload(i: u64) -> Vec<u8> {
    let len = (i * 37 % 300) as usize;
    (0..len).map(|j| (i as usize * 7 + j) as u8).collect()
}

fn opts(d: Durability, seg: u64) -> JournalOptions {
    JournalOptions {
        durability: d,
        segment_size: seg,
    }
}

fn replay_all(dir: &Path, after: u64) -> memfs_journal::Result<Vec<(u64, Vec<u8>)>> {
    let dd = DataDir::open(dir, false)?;
    let mut got = Vec::new();
    let (j, rep) = Journal::open(&dd, opts(Durability::Sync, 4096), after, &mut |id, p| {
        got.push((id, p.to_vec()));
        Ok(())
    })?;
    assert_eq!(rep.commits_replayed as usize, got.len());
    j.close()?;
    Ok(got)
}

#[test]
fn every_mode_round_trips_across_segments() {
    let modes = ["none", "sync", "relaxed=3", "async=4", "async-relaxed=4"];
    for m in modes {
        let t = tempfile::tempdir().unwrap();
        let dd = DataDir::open(t.path(), true).unwrap();
        let d: Durability = m.parse().unwrap();
        let (j, rep) = Journal::open(&dd, opts(d, 2048), 0, &mut |_, _| Ok(())).unwrap();
        assert_eq!(rep.last_commit, 0);
        for i in 1..=200u64 {
            assert_eq!(j.commit(&payload(i)).unwrap(), i);
        }
        assert_eq!(j.sync().unwrap(), 200);
        assert_eq!(j.durable_commit(), 200);
        assert!(j.stats().segments > 5, "mode {m}: rotation expected");
        j.close().unwrap();
        drop(dd);
        let got = replay_all(t.path(), 0).unwrap();
        assert_eq!(got.len(), 200, "mode {m}");
        for (i, (id, p)) in got.iter().enumerate() {
            assert_eq!(*id, i as u64 + 1);
            assert_eq!(*p, payload(*id), "mode {m} commit {id}");
        }
        // Replay after a point yields only the later commits.
        let tail = replay_all(t.path(), 150).unwrap();
        assert_eq!(tail.first().map(|c| c.0), Some(151));
        assert_eq!(tail.len(), 50);
    }
}

#[test]
fn concurrent_sync_committers_get_unique_consecutive_ids() {
    let t = tempfile::tempdir().unwrap();
    let dd = DataDir::open(t.path(), true).unwrap();
    let (j, _) =
        Journal::open(&dd, opts(Durability::Sync, 1 << 20), 0, &mut |_, _| Ok(())).unwrap();
    let mut ids: Vec<u64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    (0..50)
                        .map(|i| {
                            let id = j.commit(&payload(i)).unwrap();
                            // Sync mode: durable when commit returns.
                            assert!(j.durable_commit() >= id);
                            id
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    ids.sort();
    assert_eq!(ids, (1..=200).collect::<Vec<_>>());
    assert!(j.stats().fsyncs <= 200);
    j.close().unwrap();
    drop(dd);
    assert_eq!(replay_all(t.path(), 0).unwrap().len(), 200);
}

#[test]
fn prune_removes_only_covered_segments() {
    let t = tempfile::tempdir().unwrap();
    let dd = DataDir::open(t.path(), true).unwrap();
    let (j, _) = Journal::open(&dd, opts(Durability::None, 1024), 0, &mut |_, _| Ok(())).unwrap();
    for i in 1..=100 {
        j.commit(&payload(i)).unwrap();
    }
    j.sync().unwrap();
    let before = j.stats().segments;
    let removed = j.prune(60).unwrap();
    assert!(removed > 0 && removed < before);
    j.close().unwrap();
    drop(dd);
    let got = replay_all(t.path(), 60).unwrap();
    assert_eq!(got.first().unwrap().0, 61);
    assert_eq!(got.last().unwrap().0, 100);
    // Replaying from before the pruned range is a clear error, not a silent gap.
    let dd = DataDir::open(t.path(), false).unwrap();
    let err = Journal::open(&dd, JournalOptions::default(), 0, &mut |_, _| Ok(())).unwrap_err();
    assert!(
        err.to_string().contains("earlier segments are missing"),
        "{err}"
    );
}

fn write_journal(dir: &Path, n: u64, seg: u64) {
    let dd = DataDir::open(dir, true).unwrap();
    let (j, _) = Journal::open(&dd, opts(Durability::None, seg), 0, &mut |_, _| Ok(())).unwrap();
    for i in 1..=n {
        j.commit(&payload(i)).unwrap();
    }
    j.close().unwrap();
}

fn last_segment(dir: &Path) -> std::path::PathBuf {
    memfs_journal::recovery::list_segments(dir)
        .unwrap()
        .pop()
        .unwrap()
        .1
}

#[test]
fn torn_tail_is_truncated_and_writing_continues() {
    let t = tempfile::tempdir().unwrap();
    write_journal(t.path(), 20, 1 << 20);
    let seg = last_segment(t.path());
    let len = std::fs::metadata(&seg).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    f.set_len(len - 5).unwrap();
    drop(f);
    let v = verify(t.path()).unwrap();
    assert!(v.is_clean());
    assert!(v.torn_tail.is_some());
    assert_eq!(v.last_commit, 19);
    let dd = DataDir::open(t.path(), false).unwrap();
    let (j, rep) = Journal::open(&dd, JournalOptions::default(), 0, &mut |_, _| Ok(())).unwrap();
    assert_eq!(rep.last_commit, 19);
    assert!(rep.truncated_tail.is_some());
    assert_eq!(j.commit(b"after").unwrap(), 20);
    j.close().unwrap();
    drop(dd);
    let got = replay_all(t.path(), 0).unwrap();
    assert_eq!(got.len(), 20);
    assert_eq!(got[19].1, b"after");
}

#[test]
fn corruption_before_the_tail_is_an_error_naming_file_and_offset() {
    let t = tempfile::tempdir().unwrap();
    write_journal(t.path(), 20, 1 << 20);
    let seg = last_segment(t.path());
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[32 + 25] ^= 0xff; // inside commit 1's payload
    std::fs::write(&seg, &bytes).unwrap();
    let dd = DataDir::open(t.path(), false).unwrap();
    let err = Journal::open(&dd, JournalOptions::default(), 0, &mut |_, _| Ok(())).unwrap_err();
    match &err {
        Error::Corrupt { file, offset, .. } => {
            assert_eq!(file, &seg);
            assert_eq!(*offset, 32);
        }
        e => panic!("unexpected {e}"),
    }
    assert!(err.to_string().contains("offset 32"));
    drop(dd);
    let v = verify(t.path()).unwrap();
    assert!(!v.is_clean());
    assert_eq!(v.last_commit, 0);
    let r = repair(t.path()).unwrap();
    assert!(r.bytes_dropped > 0);
    assert_eq!(replay_all(t.path(), 0).unwrap().len(), 0);
}

#[test]
fn hundreds_of_random_damages_never_panic_and_yield_a_prefix_or_an_error() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("base");
    write_journal(&base, 60, 3000);
    let files: Vec<_> = memfs_journal::recovery::list_segments(&base).unwrap();
    let originals: Vec<Vec<u8>> = files
        .iter()
        .map(|(_, p)| std::fs::read(p).unwrap())
        .collect();
    let mut rng = StdRng::seed_from_u64(7);
    let (mut ok, mut errs) = (0, 0);
    for case in 0..300 {
        let dir = t.path().join(format!("c{case}"));
        std::fs::create_dir(&dir).unwrap();
        for ((_, p), data) in files.iter().zip(&originals) {
            std::fs::write(dir.join(p.file_name().unwrap()), data).unwrap();
        }
        let k = rng.random_range(0..files.len());
        let target = dir.join(files[k].1.file_name().unwrap());
        let mut data = originals[k].clone();
        if rng.random_bool(0.5) {
            let cut = rng.random_range(0..data.len());
            data.truncate(cut);
        } else {
            for _ in 0..rng.random_range(1..4) {
                let at = rng.random_range(0..data.len());
                data[at] ^= rng.random_range(1..=255u8);
            }
        }
        std::fs::write(&target, &data).unwrap();
        match replay_all(&dir, 0) {
            Ok(got) => {
                ok += 1;
                for (i, (id, p)) in got.iter().enumerate() {
                    assert_eq!(*id, i as u64 + 1, "case {case}");
                    assert_eq!(*p, payload(*id), "case {case}: altered payload accepted");
                }
            }
            Err(e) => {
                errs += 1;
                assert!(matches!(e, Error::Corrupt { .. }), "case {case}: {e}");
                // repair always makes it recoverable again.
                repair(&dir).unwrap();
                let got = replay_all(&dir, 0).unwrap();
                for (id, p) in &got {
                    assert_eq!(*p, payload(*id));
                }
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
    assert!(ok > 0 && errs > 0, "ok {ok} errs {errs}");
}

#[test]
fn replay_callback_error_aborts_open() {
    let t = tempfile::tempdir().unwrap();
    write_journal(t.path(), 5, 1 << 20);
    let dd = DataDir::open(t.path(), false).unwrap();
    let err = Journal::open(&dd, JournalOptions::default(), 0, &mut |id, _| {
        if id == 3 {
            Err("bad op".into())
        } else {
            Ok(())
        }
    })
    .unwrap_err();
    assert!(matches!(err, Error::Apply { commit: 3, .. }), "{err}");
}

#[test]
fn truncate_after_keeps_exactly_a_prefix_and_the_journal_continues() {
    for keep in [0u64, 1, 37, 99, 100, 150] {
        let t = tempfile::tempdir().unwrap();
        {
            let dd = DataDir::open(t.path(), true).unwrap();
            let (j, _) =
                Journal::open(&dd, opts(Durability::Sync, 1024), 0, &mut |_, _| Ok(())).unwrap();
            for i in 1..=150u64 {
                j.commit(&payload(i)).unwrap();
            }
            j.close().unwrap();
        }
        let dropped = memfs_journal::recovery::truncate_after(t.path(), keep).unwrap();
        assert_eq!(dropped, 150 - keep.min(150), "keep {keep}");
        let got = replay_all(t.path(), 0).unwrap();
        assert_eq!(got.len() as u64, keep.min(150), "keep {keep}");
        assert!(got.iter().all(|(id, p)| *p == payload(*id)));
        // The next commit takes the id right after the kept prefix.
        let dd = DataDir::open(t.path(), false).unwrap();
        let (j, rep) =
            Journal::open(&dd, opts(Durability::Sync, 1024), 0, &mut |_, _| Ok(())).unwrap();
        assert_eq!(rep.last_commit, keep.min(150));
        assert_eq!(j.commit(b"again").unwrap(), keep.min(150) + 1);
        j.close().unwrap();
        assert!(verify(t.path()).unwrap().is_clean());
    }
}

#[test]
fn unsynced_writes_landing_out_of_order_are_a_torn_tail_but_flips_are_corruption() {
    // 20 commits in one segment; then a frame in the middle loses its share
    // of a sector (zeros: a write that never landed while later ones did).
    let t = tempfile::tempdir().unwrap();
    write_journal(t.path(), 20, 1 << 20);
    let seg = last_segment(t.path());
    let orig = std::fs::read(&seg).unwrap();
    // Offsets of the frames.
    let mut offs = Vec::new();
    let mut pos = 32;
    while pos < orig.len() {
        offs.push(pos);
        let len = u32::from_le_bytes(orig[pos + 4..pos + 8].try_into().unwrap()) as usize;
        pos += 20 + len;
    }
    // Frame k (commit k+1) loses its share of one 512-byte sector.
    let k = 10;
    let (o, end) = (offs[k], offs[k + 1]);
    let s = (o + end) / 2 / 512 * 512;
    let (from, to) = (o.max(s), end.min(s + 512));
    assert!(orig[from..to].iter().any(|&b| b != 0));
    let mut holed = orig.clone();
    holed[from..to].fill(0);
    std::fs::write(&seg, &holed).unwrap();
    let v = verify(t.path()).unwrap();
    assert!(v.is_clean(), "{:?}", v.corruption);
    assert_eq!(v.last_commit, k as u64);
    let got = replay_all(t.path(), 0).unwrap();
    assert_eq!(got.len(), k, "commits after the hole are dropped with it");
    assert!(got.iter().all(|(id, p)| *p == payload(*id)));
    // The same frame with one flipped byte instead: corruption, not a tail.
    let mut flipped = orig.clone();
    flipped[(from + to) / 2] ^= 0x01;
    std::fs::write(&seg, &flipped).unwrap();
    let dd = DataDir::open(t.path(), false).unwrap();
    let err = Journal::open(&dd, JournalOptions::default(), 0, &mut |_, _| Ok(())).unwrap_err();
    assert!(
        matches!(err, Error::Corrupt { offset, .. } if offset == offs[k] as u64),
        "{err}"
    );
}

/// Writers that outpace the disk wait for it in every mode: in `none` and
/// `relaxed`, a flush stuck in a slow fsync must not let the queue grow
/// without bound (it once grew to gigabytes and got the process killed).
#[test]
fn a_slow_flush_bounds_the_queue_in_none_and_relaxed_modes() {
    const MIB: usize = 1 << 20;
    for mode in ["none", "relaxed=1000000"] {
        let sim = SimStorage::new();
        let prefix = PathBuf::from(format!("/memfs-slow-disk/{mode}"));
        let _reg = storage::register_scoped(&prefix, Arc::new(sim.clone()));
        let dd = DataDir::open(prefix.join("d"), true).unwrap();
        let o = opts(mode.parse().unwrap(), 1 << 40);
        let j = Arc::new(Journal::open(&dd, o, 0, &mut |_, _| Ok(())).unwrap().0);
        j.commit(b"first").unwrap();
        // A sync gets stuck in its fsync, holding the flusher's role.
        sim.hold_file_syncs(true);
        let syncer = std::thread::spawn({
            let j = j.clone();
            move || j.sync()
        });
        poll_until("the sync to reach the disk", || sim.syncs_waiting() == 1);
        let writer = std::thread::spawn({
            let j = j.clone();
            move || {
                let (payload, mut most) = (vec![7u8; MIB], 0);
                for _ in 0..200 {
                    j.commit(&payload).unwrap();
                    most = most.max(j.stats().pending_bytes);
                }
                most
            }
        });
        poll_until("the writer to finish or be throttled", || {
            writer.is_finished() || j.stats().throttled == 1
        });
        sim.hold_file_syncs(false);
        let most = writer.join().unwrap();
        assert!(
            most <= 17 * MIB as u64,
            "{mode}: {most} bytes queued behind a stuck flush"
        );
        syncer.join().unwrap().unwrap();
        assert_eq!(j.sync().unwrap(), 201, "{mode}");
    }
}

/// Every durability mode, as the mount options name them.
fn every_mode() -> Vec<Durability> {
    [
        "sync",
        "async",
        "async=4",
        "relaxed=8",
        "async-relaxed=8",
        "none",
    ]
    .iter()
    .map(|m| m.parse().unwrap())
    .collect()
}

/// Settles `token` on `j` on a thread of its own, failing the test (not
/// hanging it) if that takes longer than a bound far beyond any fsync.
fn complete_within(
    j: &Arc<Journal>,
    token: memfs_journal::Token,
) -> std::thread::Result<memfs_journal::Result<()>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let j = j.clone();
    let t = std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| j.complete(token)));
        let _ = tx.send(r);
    });
    let r = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("complete() of a token did not return within 10 s");
    // It has sent: the join is immediate, and lets go of its journal.
    t.join().unwrap();
    r
}

#[test]
fn a_token_names_its_journal_and_commit() {
    for mode in every_mode() {
        let t = tempfile::tempdir().unwrap();
        let dd = DataDir::open(t.path(), true).unwrap();
        let (j, _) = Journal::open(&dd, opts(mode, 1 << 20), 0, &mut |_, _| Ok(())).unwrap();
        let a = j.append_vectored(&[b"one"]).unwrap();
        let b = j.append_vectored(&[b"two"]).unwrap();
        assert_eq!((a.commit(), b.commit()), (1, 2), "{mode:?}");
        assert_eq!(a.journal(), j.id());
        assert_eq!(b.journal(), j.id());
        j.complete(a).unwrap();
        j.complete(b).unwrap();
        j.sync().unwrap();
        assert_eq!(
            j.durable_commit(),
            2,
            "{mode:?}: sync() makes every commit durable"
        );
        j.close().unwrap();
    }
}

/// The wedge of an online rollback under load: a commit id taken from one
/// journal and settled on the journal that replaced it, past that one's
/// last commit. It must be answered (an error; an assertion in debug
/// builds), never waited for, in every mode.
#[test]
fn a_token_of_another_journal_is_an_error_not_a_wait() {
    for mode in every_mode() {
        let (t1, t2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (d1, d2) = (
            DataDir::open(t1.path(), true).unwrap(),
            DataDir::open(t2.path(), true).unwrap(),
        );
        let (old, _) = Journal::open(&d1, opts(mode, 1 << 20), 0, &mut |_, _| Ok(())).unwrap();
        let (new, _) = Journal::open(&d2, opts(mode, 1 << 20), 0, &mut |_, _| Ok(())).unwrap();
        let old = Arc::new(old);
        let new = Arc::new(new);
        for i in 0..5 {
            old.commit(&payload(i)).unwrap();
        }
        let token = old.append_vectored(&[b"late"]).unwrap();
        assert_ne!(old.id(), new.id());
        let r = complete_within(&new, token);
        // Debug builds assert: a foreign token is a bug of the caller.
        let asserted = cfg!(debug_assertions);
        match r {
            Err(_) if asserted => {}
            Ok(Err(Error::UnknownCommit { commit: 6, last: 0 })) if !asserted => {}
            Err(_) => panic!("{mode:?}: panicked in a release build"),
            Ok(other) => panic!("{mode:?}: {other:?} (debug assertions: {asserted})"),
        }
        // The journal that took it settles it as usual, and neither broke.
        complete_within(&old, token).unwrap().unwrap();
        assert_eq!(new.commit(b"first").unwrap(), 1, "{mode:?}");
        assert_eq!(new.stats().failed, None);
        for j in [old, new] {
            Arc::into_inner(j).unwrap().close().unwrap();
        }
    }
}
