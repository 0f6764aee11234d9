//! Hundreds of randomly damaged journal, snapshot and manifest files: opening
//! never panics and either recovers to a state the model produced at the block
//! it reports, or fails with a clear error.

mod common;

use memfs_store::{Store, StoreOptions};
use rand::{Rng, SeedableRng, rngs::StdRng};
use std::collections::BTreeMap;
use std::path::Path;

fn opts() -> StoreOptions {
    StoreOptions {
        key_width: 8,
        shards: 3,
        capacity_per_shard: 16,
        threads: 1,
        durability: "none".parse().unwrap(),
        snapshot_interval: 0,
        rollback_window: 4,
        segment_size: 4096,
    }
}

fn block_ops(b: u64) -> Vec<([u8; 8], Vec<u8>)> {
    let mut ops: Vec<([u8; 8], Vec<u8>)> = (0..20u64)
        .map(|i| {
            (
                (b * 20 + i).to_be_bytes(),
                vec![(b + i) as u8 | 1; 1 + (i % 12) as usize],
            )
        })
        .collect();
    if b > 1 {
        ops.extend((0..15u64).map(|i| (((b - 1) * 20 + i).to_be_bytes(), Vec::new())));
    }
    ops
}

fn model(upto: u64) -> BTreeMap<Vec<u8>, Vec<u8>> {
    common::replay(upto, block_ops)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_name() != "LOCK" {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn random_damage_never_panics_and_never_yields_a_wrong_state() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("base");
    {
        let s = Store::create(&base, opts()).unwrap();
        for b in 1..=40u64 {
            s.set(b, &block_ops(b)).unwrap();
            if b == 20 || b == 30 {
                s.snapshot().unwrap();
            }
        }
        s.close().unwrap();
    }
    let files: Vec<_> = std::fs::read_dir(&base)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "LOCK")
        .collect();
    assert!(
        files
            .iter()
            .any(|f| f.to_string_lossy().starts_with("snapshot-"))
    );
    assert!(
        files
            .iter()
            .filter(|f| f.to_string_lossy().starts_with("journal-"))
            .count()
            >= 2
    );
    let mut rng = StdRng::seed_from_u64(42);
    let (mut ok, mut err) = (0, 0);
    for case in 0..300 {
        let dir = t.path().join(format!("case{case}"));
        copy_dir(&base, &dir);
        let f = &files[rng.random_range(0..files.len())];
        let p = dir.join(f);
        let mut data = std::fs::read(&p).unwrap();
        let what = if data.is_empty() || rng.random_bool(0.4) {
            let cut = rng.random_range(0..=data.len());
            data.truncate(cut);
            format!("truncate {f:?} at {cut}")
        } else {
            let at = rng.random_range(0..data.len());
            data[at] ^= rng.random_range(1..=255u8);
            format!("flip {f:?} at {at}")
        };
        std::fs::write(&p, &data).unwrap();
        match Store::open(&dir) {
            Ok(s) => {
                ok += 1;
                let b = s.current_block();
                assert!(b <= 40, "case {case} ({what}): block {b}");
                let m = model(b);
                assert_eq!(s.len(), m.len() as u64, "case {case} ({what}) block {b}");
                for (k, v) in &m {
                    assert_eq!(s.get(k).unwrap().as_ref(), Some(v), "case {case} ({what})");
                }
            }
            Err(e) => {
                err += 1;
                assert!(!e.to_string().is_empty());
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
    assert!(ok > 10 && err > 10, "ok {ok} err {err}");
}

#[test]
fn verify_reports_damage_and_repair_recovers_an_earlier_block() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    {
        let s = Store::create(&dir, opts()).unwrap();
        for b in 1..=12u64 {
            s.set(b, &block_ops(b)).unwrap();
        }
        s.close().unwrap();
    }
    let clean = memfs_store::verify(&dir).unwrap();
    assert!(clean.is_clean(), "{:?}", clean.problems);
    assert_eq!(clean.block, Some(12));
    // Verify needs the lock: refused while the store is open.
    {
        let _s = Store::open(&dir).unwrap();
        assert!(
            memfs_store::verify(&dir)
                .unwrap_err()
                .to_string()
                .contains("in use")
        );
    }
    // Damage the first segment: corruption before the tail.
    let mut segs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("journal-")
        })
        .collect();
    segs.sort();
    let mut data = std::fs::read(&segs[0]).unwrap();
    let at = data.len() / 2;
    data[at] ^= 0x55;
    std::fs::write(&segs[0], &data).unwrap();
    let v = memfs_store::verify(&dir).unwrap();
    assert!(!v.is_clean());
    assert!(
        v.problems[0].contains(&segs[0].display().to_string()),
        "{:?}",
        v.problems
    );
    assert!(Store::open(&dir).is_err());
    let r = memfs_store::repair(&dir).unwrap();
    assert!(r.bytes_dropped > 0);
    let s = Store::open(&dir).unwrap();
    let b = s.current_block();
    assert!(b < 12);
    assert_eq!(s.len(), model(b).len() as u64);
}
