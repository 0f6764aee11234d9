//! Real-process crash tests: a child process (this test binary re-executed)
//! writes blocks and acknowledges each one on stdout; the parent SIGKILLs it at
//! a random moment, reopens the store and compares it with the model.

mod common;

use memfs_store::{Store, StoreOptions};
use rand::{Rng, SeedableRng, rngs::StdRng};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

const ENV_DIR: &str = "MEMFS_STORE_CRASH_DIR";
const ENV_MODE: &str = "MEMFS_STORE_CRASH_MODE";

fn opts(mode: &str) -> StoreOptions {
    StoreOptions {
        key_width: 8,
        shards: 4,
        capacity_per_shard: 64,
        threads: 2,
        durability: mode.parse().unwrap(),
        snapshot_interval: 9,
        rollback_window: 5,
        segment_size: 256 << 10,
    }
}

/// The operations of block `b`: deterministic, so the parent can model any
/// prefix. Inserts 300 new keys and deletes the oldest 250 still alive; every
/// 5th block also overwrites a few keys with longer values.
fn block_ops(b: u64) -> Vec<([u8; 8], Vec<u8>)> {
    let mut ops = Vec::new();
    for i in 0..300u64 {
        ops.push(((b * 300 + i).to_be_bytes(), (b ^ i).to_le_bytes().to_vec()));
    }
    if b > 1 {
        let first = (b - 2) * 300 + 50;
        for i in 0..250u64 {
            ops.push(((first + i).to_be_bytes(), Vec::new()));
        }
    }
    if b.is_multiple_of(5) {
        for i in 0..10u64 {
            ops.push(((b * 300 + i).to_be_bytes(), vec![b as u8; 20 + i as usize]));
        }
    }
    ops
}

fn model(upto: u64) -> BTreeMap<Vec<u8>, Vec<u8>> {
    common::replay(upto, block_ops)
}

/// Child entry point; ignored in normal runs, executed via `--ignored`.
#[test]
#[ignore = "child process of the crash tests"]
fn crash_child() {
    let Ok(dir) = std::env::var(ENV_DIR) else {
        return;
    };
    let mode = std::env::var(ENV_MODE).unwrap();
    // The harness has printed "test crash_child ... " without a newline.
    println!();
    let store = match Store::open_or_create(&dir, opts(&mode)) {
        Ok(s) => s,
        Err(e) => {
            println!("OPEN-ERROR {e}");
            return;
        }
    };
    let mut b = store.current_block();
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    loop {
        b += 1;
        store.set(b, &block_ops(b)).unwrap();
        writeln!(out, "ACK {b}").unwrap();
        out.flush().unwrap();
    }
}

/// Kills and reaps the child in every path, including a failing assertion.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_child(dir: &Path, mode: &str) -> ChildGuard {
    let exe = std::env::current_exe().unwrap();
    let child = Command::new(exe)
        .args([
            "--ignored",
            "--exact",
            "crash_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ENV_DIR, dir)
        .env(ENV_MODE, mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    ChildGuard(child)
}

fn run_rounds(mode: &str, rounds: usize, seed: u64) {
    let t = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut acked_max = 0u64;
    for round in 0..rounds {
        let mut g = spawn_child(t.path(), mode);
        let stdout = g.0.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let kill_after = rng.random_range(1..40);
        let mut last_ack = None;
        let mut seen = 0;
        while seen < kill_after {
            let Some(Ok(line)) = lines.next() else {
                panic!("child exited early (round {round})");
            };
            assert!(!line.starts_with("OPEN-ERROR"), "{line}");
            if let Some(b) = line.strip_prefix("ACK ") {
                last_ack = Some(b.parse::<u64>().unwrap());
                seen += 1;
            }
        }
        g.0.kill().unwrap();
        g.0.wait().unwrap();
        drop(g);
        let acked = last_ack.unwrap();
        acked_max = acked_max.max(acked);
        let s = Store::open(t.path()).unwrap();
        let b = s.current_block();
        if mode == "sync" {
            assert!(
                b >= acked,
                "round {round}: recovered block {b} < acknowledged {acked}"
            );
        }
        let m = model(b);
        assert_eq!(s.len(), m.len() as u64, "round {round} block {b}");
        for (k, v) in &m {
            assert_eq!(
                s.get(k).unwrap().as_ref(),
                Some(v),
                "round {round} block {b}"
            );
        }
        // Rollback still works on recovered state.
        if b > 2 {
            s.rollback(b - 1).unwrap();
            assert_eq!(s.len(), model(b - 1).len() as u64);
        }
        s.close().unwrap();
    }
    assert!(acked_max > 0);
}

#[test]
fn sigkill_during_sync_loses_nothing_acknowledged() {
    run_rounds("sync", 12, 1);
}

#[test]
fn sigkill_during_async_recovers_a_prefix() {
    run_rounds("async=8", 8, 2);
    run_rounds("async-relaxed=8", 6, 3);
}

#[test]
fn a_second_process_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let held = Store::create(t.path(), opts("sync")).unwrap();
    let mut g = spawn_child(t.path(), "sync");
    let stdout = g.0.stdout.take().unwrap();
    let first = BufReader::new(stdout)
        .lines()
        .map(|l| l.unwrap())
        .find(|l| l.contains("OPEN-ERROR") || l.starts_with("ACK"))
        .expect("child printed its outcome");
    assert!(first.starts_with("OPEN-ERROR"), "{first}");
    assert!(first.contains("in use by another process"), "{first}");
    drop(held);
}
