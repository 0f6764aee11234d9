//! Every documented error case: clear message, nothing changed.

use memfs_store::{MAX_VALUE_LEN, Store, StoreError, StoreOptions};

fn opts() -> StoreOptions {
    StoreOptions {
        shards: 4,
        durability: "none".parse().unwrap(),
        ..Default::default()
    }
}

#[test]
fn wrong_key_width_is_refused_everywhere() {
    let t = tempfile::tempdir().unwrap();
    let s = Store::create(t.path(), opts()).unwrap();
    let err = s.set(1, &[(b"short".to_vec(), b"v".to_vec())]).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::KeyWidth {
                expected: 8,
                got: 5
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("8 bytes"));
    assert!(s.get(b"123456789").is_err());
    assert_eq!(s.current_block(), 0);
    s.close().unwrap();
    // Reopening with another width.
    let err = Store::open_or_create(
        t.path(),
        StoreOptions {
            key_width: 16,
            ..opts()
        },
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("created with 8-byte keys"),
        "{err}"
    );
    let err = Store::open_or_create(
        t.path(),
        StoreOptions {
            shards: 3,
            ..opts()
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("4 shards"), "{err}");
    // Invalid widths at creation.
    let t2 = tempfile::tempdir().unwrap();
    for kw in [0, 7, 65] {
        let err = Store::create(
            t2.path(),
            StoreOptions {
                key_width: kw,
                ..opts()
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("key width"), "{err}");
    }
}

#[test]
fn non_increasing_block_changes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let s = Store::create(t.path(), opts()).unwrap();
    s.set(5, &[(*b"aaaaaaaa", *b"1")]).unwrap();
    for b in [0, 3, 5] {
        let err = s.set(b, &[(*b"aaaaaaaa", *b"2")]).unwrap_err();
        assert!(
            matches!(err, StoreError::BlockNotIncreasing { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("strictly increase"));
    }
    assert!(s.start_block(5).is_err());
    assert_eq!(s.get(b"aaaaaaaa").unwrap().unwrap(), b"1");
    assert_eq!(s.current_block(), 5);
}

#[test]
fn value_too_large_changes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let s = Store::create(t.path(), opts()).unwrap();
    let big = vec![1u8; MAX_VALUE_LEN + 1];
    let ok = vec![2u8; MAX_VALUE_LEN];
    let err = s
        .set(
            1,
            &[
                (b"aaaaaaaa".to_vec(), ok.clone()),
                (b"bbbbbbbb".to_vec(), big),
            ],
        )
        .unwrap_err();
    assert!(matches!(err, StoreError::ValueTooLarge { len } if len == MAX_VALUE_LEN + 1));
    assert_eq!(s.get(b"aaaaaaaa").unwrap(), None);
    assert_eq!(s.current_block(), 0);
    s.set(1, &[(b"aaaaaaaa".to_vec(), ok.clone())]).unwrap();
    s.close().unwrap();
    let s = Store::open(t.path()).unwrap();
    assert_eq!(s.get(b"aaaaaaaa").unwrap().unwrap(), ok);
}

#[test]
fn rollback_outside_the_window_changes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let s = Store::create(
        t.path(),
        StoreOptions {
            rollback_window: 3,
            ..opts()
        },
    )
    .unwrap();
    for b in 1..=10u64 {
        s.set(b, &[(b.to_be_bytes(), b.to_le_bytes())]).unwrap();
    }
    let err = s.rollback(6).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::RollbackOutsideWindow {
                target: 6,
                oldest: 7,
                current: 10
            }
        ),
        "{err}"
    );
    assert!(s.rollback(11).is_err());
    assert_eq!(s.current_block(), 10);
    assert_eq!(s.len(), 10);
    s.rollback(7).unwrap();
    assert_eq!(s.current_block(), 7);
    assert_eq!(s.len(), 7);
    // pop returns the old value.
    assert_eq!(
        s.pop(8, &3u64.to_be_bytes()).unwrap().unwrap(),
        3u64.to_le_bytes()
    );
    assert_eq!(s.pop(9, &3u64.to_be_bytes()).unwrap(), None);
    let many: Vec<_> = (1..=10u64).map(|b| b.to_be_bytes()).collect();
    let got = s.multi_get(&many).unwrap();
    assert_eq!(got.iter().filter(|v| v.is_some()).count(), 6);
}

#[test]
fn opening_a_non_store_is_a_clear_error() {
    let t = tempfile::tempdir().unwrap();
    let err = Store::open(t.path()).unwrap_err();
    assert!(err.to_string().contains("not a memfs store"), "{err}");
    let err = Store::open(t.path().join("missing")).unwrap_err();
    assert!(err.to_string().contains("does not exist"), "{err}");
}

#[test]
fn metrics_report_activity() {
    let t = tempfile::tempdir().unwrap();
    let s = Store::create(
        t.path(),
        StoreOptions {
            snapshot_interval: 2,
            ..opts()
        },
    )
    .unwrap();
    for b in 1..=5u64 {
        let ops: Vec<_> = (0..100u64)
            .map(|i| ((b * 1000 + i).to_be_bytes(), [1u8; 8]))
            .collect();
        s.set(b, &ops).unwrap();
    }
    s.snapshot().unwrap();
    let m = s.metrics();
    assert_eq!(m.blocks, 5);
    assert_eq!(m.ops, 500);
    assert_eq!(m.entries, 500);
    assert_eq!(m.health, "ok");
    assert!(m.snapshots_written >= 1);
    assert!(m.snapshot_bytes > 0 && m.journal_bytes > 0);
    assert!(m.latency_p99_us >= m.latency_p50_us);
}

#[test]
fn parallel_application_matches_sequential_and_rolls_back() {
    let t = tempfile::tempdir().unwrap();
    let par = Store::create(
        t.path().join("p"),
        StoreOptions {
            threads: 4,
            shards: 16,
            ..opts()
        },
    )
    .unwrap();
    let seq = Store::create(
        t.path().join("s"),
        StoreOptions {
            threads: 1,
            shards: 16,
            ..opts()
        },
    )
    .unwrap();
    for b in 1..=6u64 {
        // Big enough to take the parallel path; overwrites, deletes and
        // repeated keys inside one block.
        let mut ops: Vec<([u8; 8], Vec<u8>)> = Vec::new();
        for i in 0..5000u64 {
            let k = ((b * 3000 + i) % 9000).to_be_bytes();
            let v = if i % 7 == 0 {
                Vec::new()
            } else {
                vec![(b + i) as u8 | 1; (i % 20) as usize + 1]
            };
            ops.push((k, v));
        }
        par.set(b, &ops).unwrap();
        seq.set(b, &ops).unwrap();
    }
    let dump = |s: &Store| {
        let mut v = Vec::new();
        s.for_each(|k, val| v.push((k.to_vec(), val.to_vec())));
        v.sort();
        v
    };
    assert_eq!(dump(&par), dump(&seq));
    par.rollback(3).unwrap();
    seq.rollback(3).unwrap();
    assert_eq!(dump(&par), dump(&seq));
    assert!(!dump(&par).is_empty());
}

/// Snapshots run in the background while blocks and rollbacks keep coming, so
/// the table copies are fuzzy; reopening (snapshot + replay) must still give
/// exactly the live state, and rollback must still work after it.
#[test]
fn fuzzy_background_snapshots_recover_exactly() {
    use std::collections::BTreeMap;
    let t = tempfile::tempdir().unwrap();
    let o = StoreOptions {
        shards: 4,
        threads: 2,
        durability: "async=4".parse().unwrap(),
        snapshot_interval: 1,
        rollback_window: 6,
        segment_size: 64 << 10,
        ..Default::default()
    };
    let s = Store::create(t.path(), o).unwrap();
    type State = BTreeMap<[u8; 8], Vec<u8>>;
    let mut hist: Vec<(u64, State)> = vec![(0, BTreeMap::new())];
    let mut block = 0u64;
    for step in 0..150u64 {
        if step % 7 == 6 && hist.len() > 3 {
            let target = hist[hist.len() - 3].0;
            s.rollback(target).unwrap();
            hist.truncate(hist.len() - 2);
            block = target;
            continue;
        }
        block += 1;
        let mut st = hist.last().unwrap().1.clone();
        let ops: Vec<([u8; 8], Vec<u8>)> = (0..3000u64)
            .map(|i| {
                let k = ((step * 7 + i * 13) % 5000).to_be_bytes();
                let v = if i % 5 == 0 {
                    Vec::new()
                } else {
                    vec![(step + i) as u8 | 1; 1 + (i % 11) as usize]
                };
                (k, v)
            })
            .collect();
        for (k, v) in &ops {
            if v.is_empty() {
                st.remove(k);
            } else {
                st.insert(*k, v.clone());
            }
        }
        s.set(block, &ops).unwrap();
        hist.push((block, st));
        if hist.len() > 7 {
            hist.remove(0);
        }
    }
    assert!(s.metrics().snapshots_written > 0 || s.snapshot().is_ok());
    s.close().unwrap();
    let s = Store::open(t.path()).unwrap();
    let check = |s: &Store, st: &State| {
        assert_eq!(s.len(), st.len() as u64);
        for (k, v) in st {
            assert_eq!(s.get(k).unwrap().as_ref(), Some(v));
        }
    };
    assert_eq!(s.current_block(), hist.last().unwrap().0);
    check(&s, &hist.last().unwrap().1);
    let (b, st) = hist[hist.len() - 4].clone();
    s.rollback(b).unwrap();
    check(&s, &st);
}
