//! Random operation sequences on a durable file system whose disk crashes
//! at a random write or fsync (crates/journal/src/sim.rs: unsynced writes
//! kept, dropped or torn by sector; unsynced directory changes undone).
//! After recovery the tree must equal the state after some commit that is
//! at least the last one acknowledged as durable: never a state that no
//! commit produced, never less than was promised.

use std::path::PathBuf;
use std::sync::Arc;

use memfs_durable::{self as durable, DurableFs, FsCheck, Options};
use memfs_journal::storage::register_scoped;
use memfs_journal::{RecoverMode, SimStorage};
use rand::{Rng, SeedableRng, rngs::StdRng};

mod common;
use common::config;

use memfs_fs::{Ctx, Fs, ROOT_INO, RenameFlags, SetAttr, XattrMode};

/// One random operation that is exactly one commit (the path layer's
/// composite helpers are several), so that the tree is recorded after every
/// commit a crash can end at. Returns `settle`'s result (durability).
fn one_commit_op(fs: &Fs, rng: &mut StdRng) -> memfs_fs::Result<()> {
    let c = Ctx::ROOT;
    let dirs = ["/", "/p", "/q", "/p/r"];
    let dir = dirs[rng.random_range(0..dirs.len())];
    let Ok(d) = fs.resolve(ROOT_INO, dir, true) else {
        return fs.settle();
    };
    let name = format!("n{}", rng.random_range(0..6));
    let n = name.as_bytes();
    let file = || fs.lookup_noref(d, n);
    let _ = match rng.random_range(0..11) {
        0 => fs.mkdir(c, d, n, 0o755).map(|a| fs.forget(a.ino, 1)),
        1 => fs.create(c, d, n, 0o644, true).map(|(a, _)| {
            fs.release(a.ino);
            fs.forget(a.ino, 1)
        }),
        2 | 3 => file().and_then(|a| {
            let len = rng.random_range(1..20_000);
            fs.write(
                c,
                a.ino,
                rng.random_range(0..40_000),
                &vec![rng.random(); len],
                false,
            )
            .map(|_| ())
        }),
        4 => fs.unlink(d, n),
        5 => fs.rmdir(d, n),
        6 => {
            let to = dirs[rng.random_range(0..dirs.len())];
            let new = format!("n{}", rng.random_range(0..6));
            fs.resolve(ROOT_INO, to, true)
                .and_then(|t| fs.rename(d, n, t, new.as_bytes(), RenameFlags::default()))
        }
        7 => file().and_then(|a| {
            let set = SetAttr {
                size: Some(rng.random_range(0..30_000)),
                ..Default::default()
            };
            fs.setattr(c, a.ino, &set).map(|_| ())
        }),
        8 => {
            file().and_then(|a| fs.setxattr(a.ino, b"user.k", &[rng.random(); 10], XattrMode::Any))
        }
        9 => file().and_then(|a| {
            fs.link(
                a.ino,
                ROOT_INO,
                format!("l{}", rng.random_range(0..4)).as_bytes(),
            )
            .map(|l| fs.forget(l.ino, 1))
        }),
        _ => file().and_then(|a| {
            let set = SetAttr {
                mode: Some(rng.random_range(0..0o7777)),
                ..Default::default()
            };
            fs.setattr(c, a.ino, &set).map(|_| ())
        }),
    };
    fs.settle()
}

fn opts(mode: &str) -> Options {
    Options {
        durability: durable::parse_durability(mode).unwrap(),
        checkpoint_interval: None,
        checkpoint_bytes: u64::MAX,
        retention: if mode == "sync" {
            "commits=20".parse().unwrap()
        } else {
            "all".parse().unwrap()
        },
        // Small segments: rotations and pruning happen within a short run.
        segment_size: 16 << 10,
    }
}

/// Runs `ops` random operations (with checkpoints and syncs mixed in) until
/// they end or the disk crashes. Returns the tree after every commit seen and
/// the last commit acknowledged as durable.
fn run(
    dir: &std::path::Path,
    mode: &str,
    rng: &mut StdRng,
    ops: usize,
    crash_after: Option<(&SimStorage, u64)>,
) -> (Vec<(u64, Vec<String>)>, u64) {
    let (d, _) = DurableFs::open(dir, config(), opts(mode)).expect("open before the crash");
    let fs = d.fs().clone();
    let mut states = vec![(d.last_commit(), fs.canonical_dump())];
    let mut acked = d.durable_commit();
    if let Some((sim, n)) = crash_after {
        sim.set_crash_after(n);
    }
    for i in 0..ops {
        if i == 0 {
            for p in ["/p", "/p/r", "/q"] {
                let made = fs.mkdir_path(Ctx::ROOT, ROOT_INO, p, 0o755).is_ok();
                let settled = fs.settle().is_ok();
                let commit = fs.last_commit();
                states.push((commit, fs.canonical_dump()));
                if made && settled && mode == "sync" {
                    acked = acked.max(commit);
                }
            }
        }
        let before = fs.last_commit();
        let r = one_commit_op(&fs, rng);
        let commit = fs.last_commit();
        if states.last().map(|s| s.0) != Some(commit) {
            states.push((commit, fs.canonical_dump()));
        }
        // `settle` vouches only for what this operation committed.
        if r.is_ok() && commit > before && mode == "sync" {
            acked = acked.max(commit);
        }
        match rng.random_range(0..20) {
            0 => {
                if let Ok(c) = d.sync() {
                    acked = acked.max(c);
                }
            }
            1 => {
                let _ = d.checkpoint();
            }
            2 if mode == "sync" => {
                let _ = d.snapshot_create(&format!("s{i}"));
            }
            _ => {}
        }
        if crash_after.is_some_and(|(sim, _)| sim.is_crashed()) {
            break;
        }
    }
    drop(fs);
    drop(d);
    (states, acked)
}

#[test]
fn recovery_after_a_crash_at_any_write_or_fsync_is_a_committed_state() {
    let cases: u64 = std::env::var("MEMFS_FS_CRASH_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    for (m, mode) in ["sync", "async", "none", "relaxed=3"].iter().enumerate() {
        for case in 0..cases {
            let seed = m as u64 * 1_000_000 + case;
            let mut rng = StdRng::seed_from_u64(seed);
            let sim = SimStorage::new();
            let prefix = PathBuf::from(format!("/memfs-sim/{seed}"));
            let reg = register_scoped(&prefix, Arc::new(sim.clone()));
            let dir = prefix.join("data");
            // A dry run on a clean disk measures how many disk operations the
            // sequence takes, so that the crash can land anywhere in it.
            let mut dry_rng = rng.clone();
            let ops = rng.random_range(20..120);
            let before = sim.ops();
            run(&dir, mode, &mut dry_rng, ops, None);
            let total = sim.ops() - before;
            // The real run, on a fresh disk, crashing at a random operation.
            let sim = SimStorage::new();
            reg.replace(Arc::new(sim.clone()));
            let crash_at = rng.random_range(1..=total.max(1));
            let (states, acked) = run(&dir, mode, &mut rng, ops, Some((&sim, crash_at)));
            let recover = [
                RecoverMode::KeepAll,
                RecoverMode::DropAll,
                RecoverMode::Random,
            ][(case % 3) as usize];
            let disk = sim.recover(recover, seed);
            reg.replace(Arc::new(disk));
            let (d, report) = DurableFs::open(&dir, config(), opts(mode)).unwrap_or_else(|e| {
                panic!("seed {seed} mode {mode} crash at {crash_at}/{total} {recover:?}: recovery failed: {e}")
            });
            let got = d.fs().canonical_dump();
            let problems = d.fs().check_consistency();
            assert!(problems.is_empty(), "seed {seed}: {problems:?}");
            let c = d.last_commit();
            let matching: Vec<u64> = states.iter().filter(|s| s.1 == got).map(|s| s.0).collect();
            if matching.is_empty() {
                let near = states
                    .iter()
                    .rev()
                    .find(|s| s.0 <= c)
                    .or(states.first())
                    .unwrap();
                let only_got: Vec<_> = got.iter().filter(|l| !near.1.contains(l)).collect();
                let only_exp: Vec<_> = near.1.iter().filter(|l| !got.contains(l)).collect();
                eprintln!(
                    "nearest state: commit {}\nonly recovered: {only_got:#?}\nonly expected: {only_exp:#?}\ncommits: {:?}",
                    near.0,
                    states.iter().map(|s| s.0).collect::<Vec<_>>()
                );
            }
            assert!(
                !matching.is_empty(),
                "seed {seed} mode {mode} crash at {crash_at}/{total} {recover:?}: recovered a state no commit produced (commit {c}, {report})"
            );
            assert!(
                c >= acked,
                "seed {seed} mode {mode} crash at {crash_at}/{total} {recover:?}: recovered commit {c} but {acked} was acknowledged as durable"
            );
            // The file system goes on working after recovery.
            d.fs()
                .mkdir(Ctx::ROOT, ROOT_INO, b"after", 0o755)
                .expect("a change after recovery");
            d.sync().expect("sync after recovery");
        }
    }
}
