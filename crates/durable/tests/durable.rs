//! The durable file system: every change survives a reopen, checkpoints
//! copied while writers run recover exactly, snapshots and rollback return
//! to earlier states, and damaged files give errors, never panics.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use memfs_durable::{self as durable, DurableFs, FsCheck};
use memfs_fs::{
    AtimeMode, Ctx, FallocateMode, Fs, ROOT_INO, RenameFlags, SetAttr, SetTime, Timespec, XattrMode,
};
use rand::{Rng, SeedableRng, rngs::StdRng};

mod common;
use common::{config, opts, random_op};

fn open(dir: &Path, mode: &str) -> DurableFs {
    common::open_mode(dir, mode)
}

/// Builds a tree with every node type, xattrs, sparse data, hard links,
/// renames and an unlinked-but-open file.
fn populate(fs: &Fs, tag: u8) {
    let c = Ctx::ROOT;
    let d = fs
        .mkdir_all(c, ROOT_INO, &format!("/d{tag}/sub"), 0o755)
        .unwrap();
    fs.write_file(c, d, "f", &vec![tag; 10_000]).unwrap();
    let f = fs
        .resolve(ROOT_INO, &format!("/d{tag}/sub/f"), true)
        .unwrap();
    // Sparse: a byte far out, a punched hole, a keep-size allocation.
    fs.write(c, f, 1 << 30, b"end", false).unwrap();
    fs.fallocate(
        f,
        4096,
        4096,
        FallocateMode {
            keep_size: true,
            punch_hole: true,
            zero_range: false,
        },
    )
    .unwrap();
    fs.setxattr(f, b"user.tag", &[tag, 1, 2], XattrMode::Any)
        .unwrap();
    fs.setxattr(f, b"user.gone", b"x", XattrMode::Any).unwrap();
    fs.removexattr(f, b"user.gone").unwrap();
    fs.link_path(
        ROOT_INO,
        &format!("/d{tag}/sub/f"),
        &format!("/d{tag}/hard"),
    )
    .unwrap();
    fs.symlink_path(c, ROOT_INO, "sub/f", &format!("/d{tag}/sym"))
        .unwrap();
    let top = fs.resolve(ROOT_INO, &format!("/d{tag}"), true).unwrap();
    fs.mknod(c, top, b"fifo", libc::S_IFIFO | 0o640, 0).unwrap();
    fs.mknod(c, top, b"chr", libc::S_IFCHR | 0o600, 0x0103)
        .unwrap();
    fs.mknod(c, top, b"sock", libc::S_IFSOCK | 0o600, 0)
        .unwrap();
    fs.setattr(
        c,
        top,
        &SetAttr {
            mode: Some(0o2750),
            uid: Some(7),
            gid: Some(8),
            ..Default::default()
        },
    )
    .unwrap();
    fs.write_file(c, top, "a", b"aaa").unwrap();
    fs.write_file(c, top, "b", b"bbb").unwrap();
    fs.rename(top, b"a", top, b"b", RenameFlags::default())
        .unwrap();
    fs.mkdir(c, top, b"x", 0o700).unwrap();
    fs.rename(top, b"x", d, b"moved", RenameFlags::default())
        .unwrap();
    fs.write_file(c, top, "t", b"truncate me").unwrap();
    let t = fs.resolve(ROOT_INO, &format!("/d{tag}/t"), true).unwrap();
    fs.setattr(
        c,
        t,
        &SetAttr {
            size: Some(4),
            ..Default::default()
        },
    )
    .unwrap();
    // Unlinked while open: gone after a restart.
    let (o, _) = fs.create(c, top, b"open", 0o644, true).unwrap();
    fs.write(c, o.ino, 0, b"still here", false).unwrap();
    fs.unlink(top, b"open").unwrap();
    fs.release(o.ino);
    fs.forget(o.ino, 1);
    fs.settle().unwrap();
}

#[test]
fn every_mode_recovers_every_change_from_the_journal() {
    for mode in ["sync", "none", "relaxed=3", "async"] {
        let t = tempfile::tempdir().unwrap();
        let d = open(t.path(), mode);
        populate(d.fs(), 1);
        let before = d.fs().canonical_dump();
        d.sync().unwrap();
        drop(d); // no checkpoint: everything comes from the journal
        let (d2, rep) = DurableFs::open(t.path(), config(), opts(mode)).unwrap();
        // Only the empty checkpoint a new directory starts with: the rest is journal.
        assert_eq!(rep.checkpoint.map(|c| c.commit), Some(0), "{mode}: {rep}");
        assert!(rep.journal.commits_replayed > 20, "{mode}: {rep}");
        assert_eq!(d2.fs().canonical_dump(), before, "mode {mode}");
        assert_eq!(d2.fs().check_consistency(), Vec::<String>::new());
    }
}

#[test]
fn checkpoint_then_journal_then_reopen() {
    let t = tempfile::tempdir().unwrap();
    let d = open(t.path(), "sync");
    populate(d.fs(), 1);
    let r = d.checkpoint().unwrap().expect("a checkpoint");
    assert!(r.info.nodes > 10);
    populate(d.fs(), 2);
    let before = d.fs().canonical_dump();
    drop(d);
    let (d2, rep) = DurableFs::open(t.path(), config(), opts("sync")).unwrap();
    assert!(rep.checkpoint.is_some(), "{rep}");
    assert_eq!(d2.fs().canonical_dump(), before);
    // A clean close writes a final checkpoint: nothing to replay next time.
    d2.close().unwrap();
    let (d3, rep) = DurableFs::open(t.path(), config(), opts("sync")).unwrap();
    assert_eq!(rep.journal.commits_replayed, 0, "{rep}");
    assert_eq!(d3.fs().canonical_dump(), before);
}

#[test]
fn checkpoints_copied_while_writers_run_recover_exactly() {
    let t = tempfile::tempdir().unwrap();
    let d = open(t.path(), "none");
    let fs = d.fs().clone();
    fs.mkdir_all(Ctx::ROOT, ROOT_INO, "/p/r", 0o755).unwrap();
    fs.mkdir_all(Ctx::ROOT, ROOT_INO, "/q", 0o755).unwrap();
    // Writers keep going until at least two checkpoints were copied while
    // they ran, however the scheduler orders the threads (the op cap only
    // bounds the run if the checkpointing thread is starved).
    let done = Arc::new(AtomicUsize::new(0));
    let writers: Vec<_> = (0..2)
        .map(|i| {
            let fs = fs.clone();
            let done = done.clone();
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(i);
                let mut n = 0;
                while n < 10_000 || (done.load(Ordering::Acquire) < 2 && n < 500_000) {
                    random_op(&fs, &mut rng).unwrap();
                    n += 1;
                }
            })
        })
        .collect();
    while writers.iter().any(|w| !w.is_finished()) {
        if d.checkpoint().unwrap().is_some() {
            done.fetch_add(1, Ordering::AcqRel);
        }
    }
    for w in writers {
        w.join().unwrap();
    }
    let before = fs.canonical_dump();
    assert_eq!(fs.check_consistency(), Vec::<String>::new());
    d.sync().unwrap();
    drop(fs);
    drop(d);
    let d2 = open(t.path(), "none");
    assert_same_lines(&before, &d2.fs().canonical_dump());
    assert_eq!(d2.fs().check_consistency(), Vec::<String>::new());
}

fn assert_same_lines(a: &[String], b: &[String]) {
    if a != b {
        let only_a: Vec<_> = a.iter().filter(|l| !b.contains(l)).collect();
        let only_b: Vec<_> = b.iter().filter(|l| !a.contains(l)).collect();
        panic!("trees differ\nonly before: {only_a:#?}\nonly after: {only_b:#?}");
    }
}

#[test]
fn rollback_returns_to_every_earlier_commit_and_snapshot() {
    let t = tempfile::tempdir().unwrap();
    let d = open(t.path(), "sync");
    let fs = d.fs().clone();
    fs.mkdir_all(Ctx::ROOT, ROOT_INO, "/p/r", 0o755).unwrap();
    fs.mkdir_all(Ctx::ROOT, ROOT_INO, "/q", 0o755).unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    let mut states = Vec::new();
    for i in 0..60 {
        random_op(&fs, &mut rng).unwrap();
        if i % 10 == 5 {
            d.checkpoint().unwrap();
        }
        states.push((d.last_commit(), fs.canonical_dump()));
    }
    populate(&fs, 3);
    let snap = d.snapshot_create("before-rm").unwrap();
    let at_snap = fs.canonical_dump();
    fs.unlink_path(ROOT_INO, "/d3/hard").unwrap();
    fs.rmdir_path(ROOT_INO, "/d3/sub/moved").unwrap();
    d.sync().unwrap();
    drop(fs);
    d.close().unwrap();

    // To the named snapshot.
    let c = durable::resolve_target(t.path(), "before-rm").unwrap();
    assert_eq!(c, snap.commit);
    let plan = durable::plan_rollback(t.path(), c).unwrap();
    assert!(plan.commits_lost() >= 2);
    durable::rollback(t.path(), &plan).unwrap();
    let d = open(t.path(), "sync");
    assert_same_lines(&at_snap, &d.fs().canonical_dump());
    drop(d);
    // Then to several earlier commits, newest first.
    for (commit, dump) in states.iter().rev().step_by(13) {
        let plan = durable::plan_rollback(t.path(), *commit).unwrap();
        durable::rollback(t.path(), &plan).unwrap();
        let (d, _) = DurableFs::open(t.path(), config(), opts("sync")).unwrap();
        assert_same_lines(dump, &d.fs().canonical_dump());
        assert_eq!(d.last_commit(), *commit);
        // The history goes on from there.
        d.fs()
            .mkdir(Ctx::ROOT, ROOT_INO, b"after-rollback", 0o755)
            .unwrap();
        d.fs().settle().unwrap();
        assert_eq!(d.last_commit(), commit + 1);
        d.fs().rmdir(ROOT_INO, b"after-rollback").unwrap();
        d.fs().settle().unwrap();
        drop(d);
        let plan = durable::plan_rollback(t.path(), *commit).unwrap();
        durable::rollback(t.path(), &plan).unwrap();
    }
    // Beyond the end and unknown names are refused with a clear message.
    let err = durable::plan_rollback(t.path(), 1 << 40)
        .unwrap_err()
        .to_string();
    assert!(err.contains("does not exist"), "{err}");
    let err = durable::resolve_target(t.path(), "nope")
        .unwrap_err()
        .to_string();
    assert!(err.contains("neither a commit id nor a snapshot"), "{err}");
}

#[test]
fn a_second_opener_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let _d = open(t.path(), "sync");
    let err = DurableFs::open(t.path(), config(), opts("sync"))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("in use by another process"), "{err}");
}

#[test]
fn damaged_files_give_errors_or_an_earlier_state_never_a_panic() {
    let t = tempfile::tempdir().unwrap();
    {
        let d = open(t.path(), "sync");
        populate(d.fs(), 1);
        d.checkpoint().unwrap();
        populate(d.fs(), 2);
        d.sync().unwrap();
    }
    let pristine: Vec<(std::path::PathBuf, Vec<u8>)> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap() != "LOCK")
        .map(|p| (p.clone(), std::fs::read(&p).unwrap()))
        .collect();
    let mut rng = StdRng::seed_from_u64(1);
    let (mut ok, mut errors) = (0, 0);
    for case in 0..300 {
        let (path, bytes) = &pristine[case % pristine.len()];
        let mut damaged = bytes.clone();
        if damaged.is_empty() {
            continue;
        }
        if rng.random_bool(0.3) {
            damaged.truncate(rng.random_range(0..damaged.len()));
        } else {
            for _ in 0..rng.random_range(1..4) {
                let i = rng.random_range(0..damaged.len());
                damaged[i] ^= 1 << rng.random_range(0..8);
            }
        }
        std::fs::write(path, &damaged).unwrap();
        match DurableFs::open(t.path(), config(), opts("sync")) {
            Ok((d, _)) => {
                assert_eq!(
                    d.fs().check_consistency(),
                    Vec::<String>::new(),
                    "case {case} {}",
                    path.display()
                );
                ok += 1;
            }
            Err(e) => {
                let msg = e.to_string();
                assert!(!msg.is_empty());
                errors += 1;
            }
        }
        for (p, b) in &pristine {
            std::fs::write(p, b).unwrap();
        }
        // Files recovery created or cut are put back too.
        for e in std::fs::read_dir(t.path()).unwrap() {
            let p = e.unwrap().path();
            if p.file_name().unwrap() != "LOCK" && !pristine.iter().any(|(q, _)| *q == p) {
                std::fs::remove_file(p).unwrap();
            }
        }
    }
    assert!(ok > 0 && errors > 0, "ok {ok} errors {errors}");
}

/// Small files live inline in the engine (up to `INLINE_MAX` bytes) and show
/// as page 0 to checkpoint images: at and across the limit, through a
/// checkpoint, the journal and a restart, every byte, size and page count
/// comes back, and a small file comes back inline.
#[test]
fn inline_files_at_the_limit_survive_checkpoint_journal_and_restart() {
    use memfs_fs::INLINE_MAX;
    let c = Ctx::ROOT;
    let make = |fs: &Fs, tag: &str| {
        let dir = fs
            .mkdir_all(c, ROOT_INO, &format!("/{tag}"), 0o755)
            .unwrap();
        let sizes = [1, 64, INLINE_MAX - 1, INLINE_MAX, INLINE_MAX + 1, 4096];
        for n in sizes {
            let bytes: Vec<u8> = (0..n).map(|i| (i % 250 + 1) as u8).collect();
            fs.write_file(c, dir, &format!("s{n}"), &bytes).unwrap();
        }
        // Paged, then cut back below the limit: inline again.
        fs.write_file(c, dir, "cut", &[3u8; 5000]).unwrap();
        let cut = fs.resolve(dir, "cut", true).unwrap();
        let size = |s| SetAttr {
            size: Some(s),
            ..Default::default()
        };
        fs.setattr(c, cut, &size(100)).unwrap();
        // Grown by truncate (a hole), and zeros written past the limit.
        fs.write_file(c, dir, "grown", b"xyz").unwrap();
        let g = fs.resolve(dir, "grown", true).unwrap();
        fs.setattr(c, g, &size(3000)).unwrap();
        fs.write(c, g, 2500, &[0u8; 100], false).unwrap();
        // Page 0 allocated but empty.
        fs.write_file(c, dir, "alloc", b"").unwrap();
        let a = fs.resolve(dir, "alloc", true).unwrap();
        let keep = FallocateMode {
            keep_size: true,
            punch_hole: false,
            zero_range: false,
        };
        fs.fallocate(a, 0, 10, keep).unwrap();
        [cut, g, a]
    };
    let t = tempfile::tempdir().unwrap();
    let d = open(t.path(), "sync");
    let first = make(d.fs(), "a");
    for ino in first {
        assert!(d.fs().stores_inline(ino), "{ino}");
    }
    d.checkpoint().unwrap().expect("a checkpoint");
    let second = make(d.fs(), "b"); // from the journal only
    let before = d.fs().canonical_dump();
    drop(d);
    let (d2, rep) = DurableFs::open(t.path(), config(), opts("sync")).unwrap();
    assert!(rep.checkpoint.is_some(), "{rep}");
    assert_eq!(d2.fs().canonical_dump(), before);
    for ino in first.into_iter().chain(second) {
        assert!(d2.fs().stores_inline(ino), "{ino} not inline after restart");
    }
    let big = d2.fs().resolve(ROOT_INO, "/a/s4096", true).unwrap();
    assert!(!d2.fs().stores_inline(big));
    assert_eq!(d2.fs().check_consistency(), Vec::<String>::new());
}

/// A read moves an atime with no commit (a commit per read would make every
/// read a write); close keeps it by writing the newest checkpoint again, at
/// the same commit, when no commit came since it (generic/003 on a durable
/// mount: the strictatime reads before its last remount). Whether the
/// newest durable state is the one recovered at open or a checkpoint written
/// during the run, the close makes no commit and leaves HISTORY as it was:
/// a received directory that is mounted and read stays at its snapshot's
/// commit, which an incremental receive requires.
#[test]
fn atimes_moved_by_reads_survive_close_without_a_commit() {
    let t = tempfile::tempdir().unwrap();
    let old = Timespec {
        sec: 1_000_000,
        nsec: 5,
    };
    let set_old = |fs: &Fs, ino| {
        let set = SetAttr {
            atime: Some(SetTime::At(old)),
            ..Default::default()
        };
        fs.setattr(Ctx::ROOT, ino, &set).unwrap();
    };
    let read = |fs: &Fs, ino| {
        let mut buf = [0u8; 4];
        fs.read_atime(ino, 0, &mut buf, AtimeMode::Strict).unwrap();
        let atime = fs.getattr(ino).unwrap().atime;
        assert_ne!(atime, old, "a strictatime read sets the atime");
        atime
    };
    let d = open(t.path(), "async");
    let ino = d
        .fs()
        .write_file(Ctx::ROOT, ROOT_INO, "f", b"data")
        .unwrap()
        .ino;
    set_old(d.fs(), ino);
    d.close().unwrap();
    // Opens the directory again: no commit and no HISTORY change since
    // `commits`/`history`, and the atime the last run's read set.
    let reopened_as_closed = |commits, history: &_, atime| {
        let d = open(t.path(), "async");
        assert_eq!(d.last_commit(), commits, "close after a read committed");
        assert_eq!(&d.history().unwrap(), history, "close after a read");
        assert_eq!(
            d.fs().getattr(ino).unwrap().atime,
            atime,
            "read's atime lost at close"
        );
        d
    };

    // Read in a run that opened a state with nothing to replay.
    let d = open(t.path(), "async");
    let commits = d.last_commit();
    let history = d.history().unwrap();
    assert_eq!(d.fs().getattr(ino).unwrap().atime, old);
    let atime = read(d.fs(), ino);
    d.close().unwrap();
    let d = reopened_as_closed(commits, &history, atime);
    d.close().unwrap();

    // Read after a checkpoint written during the run.
    let d = open(t.path(), "async");
    set_old(d.fs(), ino);
    assert!(d.checkpoint().unwrap().is_some());
    let commits = d.last_commit();
    let history = d.history().unwrap();
    let atime = read(d.fs(), ino);
    d.close().unwrap();
    let d = reopened_as_closed(commits, &history, atime);

    // A read before a change: the final checkpoint, written for the
    // change, holds the atime too.
    let atime = read(d.fs(), ino);
    d.fs().write_file(Ctx::ROOT, ROOT_INO, "g", b"x").unwrap();
    d.close().unwrap();
    let d = open(t.path(), "async");
    assert_eq!(d.fs().getattr(ino).unwrap().atime, atime);
    d.close().unwrap();
}

/// Writes from pages (`Fs::write_pages_as`, the FUSE adapter's WRITE path)
/// are journaled from the file's pages in several slices
/// (`Recorder::record_write`): replayed, they give exactly the file the
/// live mount had, aligned or not, over pages a snapshot keeps or not.
#[test]
fn writes_from_pages_replay_exactly() {
    use memfs_fs::PAGE_SIZE as P;
    let c = Ctx::ROOT;
    let paged = |data: &[u8]| -> Vec<Option<Box<[u8; P]>>> {
        data.chunks(P)
            .map(|ch| {
                let mut p = Box::new([0u8; P]);
                p[..ch.len()].copy_from_slice(ch);
                Some(p)
            })
            .collect()
    };
    for mode in ["sync", "none"] {
        let t = tempfile::tempdir().unwrap();
        let d = open(t.path(), mode);
        let fs = d.fs();
        let f = fs.create(c, ROOT_INO, b"f", 0o644, true).unwrap().0.ino;
        // (offset, length): aligned with a tail, over itself after a
        // snapshot, unaligned, past a hole, appended.
        let steps: [(u64, usize); 5] = [
            (0, 3 * P + 100),
            (P as u64, 2 * P),
            (7, P + 9),
            (64 * P as u64, 5 * P),
            (0, 70 * P),
        ];
        for (g, (off, len)) in steps.into_iter().enumerate() {
            if g == 1 {
                fs.snapshot_create(b"s").unwrap();
            }
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8 ^ (g as u8 * 41)).collect();
            let n = fs
                .write_pages_as(c, &|_| true, false, f, off, len, &mut paged(&data), g == 4)
                .unwrap();
            assert_eq!(n, len);
        }
        let before = fs.canonical_dump();
        let want = fs.read_vec(f, 0, usize::MAX).unwrap();
        d.sync().unwrap();
        drop(d); // from the journal alone
        let (d2, rep) = DurableFs::open(t.path(), config(), opts(mode)).unwrap();
        assert!(rep.journal.commits_replayed >= 5, "{mode}: {rep}");
        assert_eq!(d2.fs().read_vec(f, 0, usize::MAX).unwrap(), want, "{mode}");
        assert_eq!(d2.fs().canonical_dump(), before, "{mode}");
    }
}
