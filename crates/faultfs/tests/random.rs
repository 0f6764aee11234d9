//! faultfs's `random` and `crash` modes under durable memfs (issue 15
//! part 3): faults at random points chosen by a seed, then SIGKILL and
//! restart, checked against the model of acknowledged operations; and power
//! cuts under the modes that acknowledge before fsync, where the recovered
//! tree must be a prefix of the acknowledged history that holds every
//! commit acknowledged before the last fsync. A few seeds each for CI;
//! `FAULTFS_ROUNDS=N` for a longer soak (`FAULTFS_SEED` replays one).

#![forbid(unsafe_code)]

mod common;

use std::path::Path;

use common::ops::{Failed, Tree, describe, read_tree, step};
use common::{Memfs, Rng, Stack, seed};

fn rounds() -> u64 {
    std::env::var("FAULTFS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

/// Random ENOSPC on fallocate (the journal's reservations), EIO on write
/// and fsync, on every file memfs touches (journal, checkpoints, spares):
/// ENOSPC changes nothing, the first EIO is the one operation whose
/// durability is unknown, EROFS follows and only after an EIO; after
/// SIGKILL and restart, the tree is the acknowledged one (or includes the
/// EIO operation).
#[test]
fn random_faults_under_a_sync_mount_keep_everything_acknowledged() {
    let base = seed("random_faults");
    let (mut nospace, mut eio) = (0, 0);
    for round in 0..rounds() {
        let seed = base.wrapping_add(round);
        let mut rng = Rng::new(seed);
        let (Stack { ffs, data, mp, log }, mut m) = Stack::start("sync");
        // Per mille: ENOSPC often (it is survivable), EIO rarely.
        ffs.ctl(&format!("random fallocate ENOSPC 400 {seed}"));
        ffs.ctl(&format!("random write EIO 3 {}", seed ^ 1));
        ffs.ctl(&format!("random fsync EIO 3 {}", seed ^ 2));
        let mut model = Tree::new();
        let mut alt: Option<Tree> = None;
        for n in 1..=120 {
            let mut after = model.clone();
            match step(&mp, &mut after, &mut rng, n) {
                Ok(()) => {
                    assert!(alt.is_none(), "seed {seed} op {n}: a change after EIO");
                    model = after;
                }
                Err(Failed { err, before, would }) => match err.raw_os_error() {
                    Some(libc::ENOSPC) => {
                        assert!(alt.is_none(), "seed {seed} op {n}: ENOSPC after EIO");
                        nospace += 1;
                        model = before;
                        // Memory did not run ahead of the journal.
                        assert_eq!(read_tree(&mp), model, "seed {seed}: after ENOSPC at op {n}");
                    }
                    Some(libc::EIO) => {
                        eio += 1;
                        model = before;
                        alt = Some(would);
                        // Read-only now. (Memory holds the EIO operation, so
                        // the model's names no longer fit: new names only.)
                        for (what, r) in [
                            ("mkdir", std::fs::create_dir(mp.join("after-eio-d"))),
                            ("create", std::fs::write(mp.join("after-eio-f"), b"x")),
                        ] {
                            let e = r.expect_err(what);
                            assert_eq!(
                                e.raw_os_error(),
                                Some(libc::EROFS),
                                "seed {seed}: {what} after EIO: {e}"
                            );
                        }
                        break;
                    }
                    Some(libc::EROFS) => {
                        panic!("seed {seed} op {n}: EROFS before any EIO");
                    }
                    _ => panic!("seed {seed} op {n}: unexpected error {err}"),
                },
            }
        }
        ffs.ctl("clear");
        m.kill();
        m.assert_no_panic();
        let m = Memfs::start(&mp, &data, &log);
        let got = read_tree(&mp);
        assert!(
            got == model || Some(&got) == alt.as_ref(),
            "seed {seed}: after SIGKILL and restart\n got: {}\nwant: {}",
            describe(&got),
            describe(&model)
        );
        m.assert_no_panic();
        drop(m);
        ffs.stop();
    }
    eprintln!(
        "random_faults: {} rounds from seed {base}: {nospace} ENOSPC, {eio} EIO",
        rounds()
    );
}

/// fsync(2) of a file on the mount: every commit before it is durable, in
/// every mode.
fn fsync_any(root: &Path) {
    let f = std::fs::File::open(root).unwrap();
    f.sync_all().expect("fsync on the memfs mount");
}

/// A power cut under a mode that acknowledges before fsync: the recovered
/// tree must be one of the acknowledged states, no older than the last
/// fsync(2) made durable.
fn power_cut(test: &str, durability: &str) {
    let base = seed(test);
    let mut cut_total = 0u64;
    for round in 0..rounds() {
        let seed = base.wrapping_add(round);
        let mut rng = Rng::new(seed);
        let (Stack { ffs, data, mp, log }, mut m) = Stack::start(durability);
        // Every acknowledged state, in order (one per acknowledged system
        // call that changes the tree).
        let mut history: Vec<Tree> = vec![Tree::new()];
        let mut synced = 0;
        let mut model = Tree::new();
        let ops = 30 + rng.below(30);
        for n in 1..=ops {
            let before = model.clone();
            if let Err(f) = step(&mp, &mut model, &mut rng, n) {
                panic!("seed {seed} op {n}: {} without a fault", f.err);
            }
            // A create then write is two acknowledged calls: both states.
            if let Some(mid) = intermediate(&before, &model)
                && history.last() != Some(&mid)
            {
                history.push(mid);
            }
            if history.last() != Some(&model) {
                history.push(model.clone());
            }
            if rng.below(6) == 0 {
                fsync_any(&mp);
                synced = history.len() - 1;
            }
        }
        m.kill();
        ffs.ctl("crash");
        let status = ffs.status();
        let cut: u64 = status
            .split_whitespace()
            .find_map(|w| w.strip_prefix("crash_cut=")?.parse().ok())
            .unwrap_or(0);
        cut_total += cut;
        let m = Memfs::start_with(&mp, &data, &log, durability);
        let got = read_tree(&mp);
        let at = history.iter().rposition(|t| *t == got);
        assert!(
            at.is_some_and(|i| i >= synced),
            "seed {seed} ({durability}): the recovered tree is {} (state {at:?} of {}, synced through {synced})\n got: {}\nlast synced: {}",
            if at.is_some() {
                "older than the last fsync"
            } else {
                "not an acknowledged state"
            },
            history.len() - 1,
            describe(&got),
            describe(&history[synced])
        );
        m.assert_no_panic();
        eprintln!(
            "{test}: seed {seed}: {} states, synced through {synced}, recovered state {}, {cut} bytes cut",
            history.len() - 1,
            at.unwrap()
        );
        drop(m);
        ffs.stop();
    }
    eprintln!(
        "{test}: {cut_total} unsynced bytes dropped over {} rounds",
        rounds()
    );
}

/// The state between the two calls of a create-and-write or a
/// truncate-and-write step (the file present and empty), if the step was one.
fn intermediate(before: &Tree, after: &Tree) -> Option<Tree> {
    use common::ops::Node;
    let changed: Vec<_> = after
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(*v))
        .collect();
    match changed.as_slice() {
        [(k, Node::File(d))] if !d.is_empty() && before.len() <= after.len() => {
            let mut mid = before.clone();
            mid.insert((*k).clone(), Node::File(Vec::new()));
            (mid != *before).then_some(mid)
        }
        _ => None,
    }
}

#[test]
fn power_cut_under_async_recovers_an_acknowledged_prefix() {
    power_cut("power_cut_async", "async");
}

#[test]
fn power_cut_under_relaxed_recovers_an_acknowledged_prefix() {
    power_cut("power_cut_relaxed", "relaxed=8");
}
