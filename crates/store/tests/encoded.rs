//! `Store::set_encoded` (a block in its wire/journal form, applied in place)
//! against `Store::set` with the same operations: same contents, same
//! journal (a reopened store replays it to the same state), same errors.

use memfs_store::{Store, StoreError, StoreOptions};
use std::collections::BTreeMap;

fn opts(threads: usize) -> StoreOptions {
    StoreOptions {
        shards: 4,
        threads,
        durability: "none".parse().unwrap(),
        rollback_window: 8,
        snapshot_interval: 0,
        ..Default::default()
    }
}

fn encode(ops: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut b = Vec::new();
    for (k, v) in ops {
        b.extend_from_slice(k);
        b.extend_from_slice(&(v.len() as u16).to_le_bytes());
        b.extend_from_slice(v);
    }
    b
}

fn contents(s: &Store) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut m = BTreeMap::new();
    s.for_each(|k, v| {
        m.insert(k.to_vec(), v.to_vec());
    });
    m
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Random blocks (small ones on the caller's thread, large ones on the
/// parallel path; values of 0..=40 bytes, so inline and side-heap values and
/// deletes of present and absent keys) and rollbacks, applied to one store
/// with `set` and to another with `set_encoded`.
#[test]
fn set_encoded_equals_set_and_replays() {
    for threads in [1, 2] {
        let (ta, tb) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let a = Store::create(ta.path(), opts(threads)).unwrap();
        let b = Store::create(tb.path(), opts(threads)).unwrap();
        let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ threads as u64;
        let mut block = 0;
        for step in 0..40 {
            if step % 7 == 6 {
                let target = block - xorshift(&mut rng) % 4;
                a.rollback(target).unwrap();
                b.rollback(target).unwrap();
                block = target;
                continue;
            }
            block += 1 + xorshift(&mut rng) % 3;
            let n = if step % 3 == 0 { 3_000 } else { 50 };
            let ops: Vec<(Vec<u8>, Vec<u8>)> = (0..n)
                .map(|_| {
                    let k = (xorshift(&mut rng) % 4_000).to_le_bytes().to_vec();
                    let len = (xorshift(&mut rng) % 41) as usize;
                    (k, vec![step as u8 + 1; len])
                })
                .collect();
            a.set(block, &ops).unwrap();
            b.set_encoded(block, &encode(&ops)).unwrap();
            assert_eq!(b.current_block(), block);
            assert_eq!(b.last_commit(), a.last_commit());
        }
        let want = contents(&a);
        assert!(want.len() > 1_000, "the workload fills the store");
        assert_eq!(contents(&b), want);
        // Rollbacks after set_encoded blocks use the undo entries it kept.
        a.rollback(block - 3).unwrap();
        b.rollback(block - 3).unwrap();
        let want = contents(&a);
        assert_eq!(contents(&b), want);
        let at = a.current_block();
        assert_eq!(b.current_block(), at);
        a.close().unwrap();
        b.close().unwrap();
        let b = Store::open(tb.path()).unwrap();
        assert_eq!(b.current_block(), at);
        assert_eq!(
            contents(&b),
            want,
            "the journal written from the encoded form replays"
        );
    }
}

#[test]
fn malformed_encoded_blocks_change_nothing() {
    let t = tempfile::tempdir().unwrap();
    let s = Store::create(t.path(), opts(2)).unwrap();
    let good = encode(&[(b"aaaaaaaa".to_vec(), b"1".to_vec())]);
    s.set_encoded(1, &good).unwrap();
    let before = (contents(&s), s.current_block(), s.last_commit());
    let mut ops: Vec<(Vec<u8>, Vec<u8>)> = (0..3_000u64)
        .map(|i| (i.to_le_bytes().to_vec(), b"vv".to_vec()))
        .collect();
    ops.push((b"zzzzzzzz".to_vec(), vec![7; 30]));
    let full = encode(&ops);
    // Cut inside the last key, inside its length, inside its value.
    for cut in [full.len() - 35, full.len() - 31, full.len() - 1] {
        let err = s.set_encoded(2, &full[..cut]).unwrap_err();
        assert!(matches!(err, StoreError::Malformed(_)), "{err}");
        assert!(err.to_string().contains("entry 3000"), "{err}");
        assert_eq!((contents(&s), s.current_block(), s.last_commit()), before);
    }
    let err = s.set_encoded(1, &good).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::BlockNotIncreasing {
                block: 1,
                current: 1
            }
        ),
        "{err}"
    );
    // An empty block is a block.
    s.set_encoded(5, &[]).unwrap();
    assert_eq!(s.current_block(), 5);
    assert_eq!(contents(&s), before.0);
    // The store still works after the refusals.
    s.set_encoded(6, &full).unwrap();
    assert_eq!(s.get(b"zzzzzzzz").unwrap(), Some(vec![7; 30]));
    assert_eq!(s.len(), 3_002);
}

/// `set_encoded_with` hands each committed block's journal id to its
/// callback exactly once, with the id `set_encoded_with` returns and
/// `last_commit` then gives, small blocks and large (the large ones commit
/// on the journal's thread in `sync`); a refused block never calls it.
#[test]
fn set_encoded_with_reports_each_commit_once() {
    use std::sync::Mutex;
    for durability in ["none", "sync"] {
        let t = tempfile::tempdir().unwrap();
        let mut o = opts(2);
        o.durability = durability.parse().unwrap();
        let s = Store::create(t.path(), o).unwrap();
        let seen = Mutex::new(Vec::new());
        let record = |id: u64| seen.lock().unwrap().push(id);
        for (block, n) in [(1u64, 3usize), (2, 3_000), (3, 1)] {
            let ops: Vec<(Vec<u8>, Vec<u8>)> = (0..n as u64)
                .map(|i| ((block * 10_000 + i).to_le_bytes().to_vec(), b"v".to_vec()))
                .collect();
            let id = s.set_encoded_with(block, &encode(&ops), &record).unwrap();
            assert_eq!(id, s.last_commit(), "{durability}");
            assert_eq!(seen.lock().unwrap().last(), Some(&id), "{durability}");
            assert_eq!(s.current_block(), block, "{durability}");
        }
        let err = s
            .set_encoded_with(
                3,
                &encode(&[(b"aaaaaaaa".to_vec(), b"1".to_vec())]),
                &record,
            )
            .unwrap_err();
        assert!(
            matches!(err, StoreError::BlockNotIncreasing { .. }),
            "{err}"
        );
        let err = s.set_encoded_with(9, &[1, 2, 3], &record).unwrap_err();
        assert!(matches!(err, StoreError::Malformed(_)), "{err}");
        assert_eq!(*seen.lock().unwrap(), vec![1, 2, 3], "{durability}");
        assert_eq!(s.len(), 3_004, "{durability}");
    }
}

/// `set_prepared` (the follower's path: entries indexed and hashed on its
/// receiving thread) gives what `set` gives, and refuses a block that was
/// not prepared, or prepared for another layout, without changing anything.
#[test]
fn set_prepared_equals_set_and_checks_its_layout() {
    use memfs_store::PreparedBlock;
    let (ta, tb) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Store::create(ta.path(), opts(2)).unwrap();
    let b = Store::create(tb.path(), opts(2)).unwrap();
    let mut pb = PreparedBlock::default();
    let mut rng = 7u64;
    for block in 1..=12u64 {
        let ops: Vec<(Vec<u8>, Vec<u8>)> = (0..2_500)
            .map(|_| {
                let k = (xorshift(&mut rng) % 3_000).to_le_bytes().to_vec();
                let len = (xorshift(&mut rng) % 12) as usize;
                (k, vec![block as u8; len])
            })
            .collect();
        a.set(block, &ops).unwrap();
        // Entries after a 5-byte header, as in a received frame.
        let buf = pb.bytes_mut();
        buf.clear();
        buf.extend_from_slice(b"head:");
        buf.extend_from_slice(&encode(&ops));
        let end = pb.bytes().len();
        pb.prepare(5..end, 8, 4).unwrap();
        b.set_prepared(block, &pb).unwrap();
    }
    assert_eq!(contents(&b), contents(&a));
    let before = (contents(&b), b.current_block(), b.last_commit());
    // Refilling the buffer undoes the preparation.
    pb.bytes_mut().truncate(5);
    let err = b.set_prepared(20, &pb).unwrap_err();
    assert!(err.to_string().contains("not prepared"), "{err}");
    // Prepared for another shard count or key width.
    pb.bytes_mut()
        .extend_from_slice(&encode(&[(vec![1; 8], vec![2])]));
    pb.prepare(5..16, 8, 3).unwrap();
    let err = b.set_prepared(20, &pb).unwrap_err();
    assert!(err.to_string().contains("3 shards"), "{err}");
    assert!(
        pb.prepare(5..16, 10, 4).is_err(),
        "cut short for 10-byte keys"
    );
    assert!(pb.prepare(5..17, 8, 4).is_err(), "range outside the buffer");
    assert_eq!((contents(&b), b.current_block(), b.last_commit()), before);
    pb.prepare(5..16, 8, 4).unwrap();
    b.set_prepared(20, &pb).unwrap();
    assert_eq!(b.get(&[1; 8]).unwrap(), Some(vec![2]));
}
