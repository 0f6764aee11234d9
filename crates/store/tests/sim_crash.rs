//! The store on the journal's simulated disk: every file access of the store
//! (journal, snapshots, manifest, STORE file, lock) goes through the
//! `SimStorage` registered for its directory; a crash at a random operation
//! (with background snapshots running) must recover a model prefix holding
//! every acknowledged block.

mod common;

use memfs_store::journal::{RecoverMode, SimStorage, storage};
use memfs_store::{Store, StoreError, StoreOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn opts(mode: &str) -> StoreOptions {
    StoreOptions {
        key_width: 8,
        shards: 2,
        capacity_per_shard: 64,
        threads: 1,
        durability: mode.parse().unwrap(),
        snapshot_interval: 4,
        rollback_window: 3,
        segment_size: 4096,
    }
}

/// Block `b`: 30 new keys, deletes 20 of the keys of block b-2, and every
/// third block overwrites a few keys with longer values.
fn block_ops(b: u64) -> Vec<([u8; 8], Vec<u8>)> {
    let mut ops = Vec::new();
    for i in 0..30u64 {
        ops.push(((b * 30 + i).to_be_bytes(), (b ^ i).to_le_bytes().to_vec()));
    }
    if b > 2 {
        for i in 0..20u64 {
            ops.push((((b - 2) * 30 + 5 + i).to_be_bytes(), Vec::new()));
        }
    }
    if b.is_multiple_of(3) {
        for i in 0..4u64 {
            ops.push(((b * 30 + i).to_be_bytes(), vec![b as u8; 40 + i as usize]));
        }
    }
    ops
}

/// Writes blocks 1..=n; returns (blocks attempted, highest acknowledged
/// durable block). Stops at the first error, which must be the crash.
fn workload(dir: &Path, mode: &str, n: u64, sim: &SimStorage) -> (u64, u64) {
    let store = match Store::create(dir, opts(mode)) {
        Ok(s) => s,
        Err(e) => {
            assert!(sim.is_crashed(), "create failed without a crash: {e}");
            return (0, 0);
        }
    };
    let (mut attempts, mut acked) = (0, 0);
    for b in 1..=n {
        attempts = b;
        if let Err(e) = store.set(b, &block_ops(b)) {
            assert!(sim.is_crashed(), "set failed without a crash: {e}");
            return (attempts, acked);
        }
        if mode == "sync" {
            acked = b;
        }
        if b % 5 == 0 {
            match store.sync() {
                Ok(()) => acked = b,
                Err(e) => {
                    assert!(sim.is_crashed(), "sync failed without a crash: {e}");
                    return (attempts, acked);
                }
            }
        }
    }
    (attempts, acked)
}

/// Crashes at every operation of the run (as measured by a dry run).
fn run(mode: &str) {
    let n = 14;
    let total = {
        let sim = SimStorage::new();
        let p = PathBuf::from(format!("/memfs-store-sim/{mode}-dry"));
        let _reg = storage::register_scoped(&p, Arc::new(sim.clone()));
        let (attempts, acked) = workload(&p.join("store"), mode, n, &sim);
        // Snapshots (background and published) ran on the simulated disk.
        let snaps = memfs_store::journal::checkpoint::list_checkpoints(&p.join("store")).unwrap();
        assert!(!snaps.is_empty(), "no snapshot written");
        assert_eq!(attempts, n);
        assert!(acked >= n - n % 5, "dry run acknowledged {acked}");
        sim.ops()
    };
    let mut recovered_some = false;
    for crash_at in 1..=total {
        let case = crash_at;
        let sim = SimStorage::new();
        let p = PathBuf::from(format!("/memfs-store-sim/{mode}/{case}"));
        let reg = storage::register_scoped(&p, Arc::new(sim.clone()));
        let dir = p.join("store");
        sim.set_crash_after(crash_at);
        let (attempts, acked) = workload(&dir, mode, n, &sim);
        sim.crash_now();
        for (m, rmode) in [
            RecoverMode::KeepAll,
            RecoverMode::DropAll,
            RecoverMode::Random,
        ]
        .into_iter()
        .enumerate()
        {
            let ctx = format!("{mode} crash at op {crash_at}/{total} {rmode:?} acked {acked}");
            reg.replace(Arc::new(sim.recover(rmode, case * 3 + m as u64)));
            let s = match Store::open(&dir) {
                Ok(s) => s,
                // Crashed before the store was created durably.
                Err(e) if acked == 0 => {
                    let msg = e.to_string();
                    assert!(
                        matches!(e, StoreError::Layout(_)) && msg.contains("not a memfs store")
                            || msg.contains("does not exist"),
                        "{ctx}: {e}"
                    );
                    continue;
                }
                Err(e) => panic!("{ctx}: reopen failed: {e}"),
            };
            let b = s.current_block();
            assert!(b >= acked, "{ctx}: recovered block {b}");
            assert!(b <= attempts, "{ctx}: recovered block {b} of {attempts}");
            let model = common::replay(b, block_ops);
            assert_eq!(s.len(), model.len() as u64, "{ctx}: block {b}");
            for (k, v) in &model {
                assert_eq!(s.get(k).unwrap().as_ref(), Some(v), "{ctx}: block {b}");
            }
            recovered_some |= b > 0;
            s.close().unwrap();
        }
    }
    assert!(recovered_some, "no case recovered any block");
    // Nothing reached the real disk.
    assert!(!Path::new("/memfs-store-sim").exists());
}

#[test]
fn sync_store_on_simulated_disk_survives_a_crash_at_every_operation() {
    run("sync");
}

#[test]
fn async_store_on_simulated_disk_recovers_a_prefix_after_a_crash_at_every_operation() {
    run("async=4");
}
