//! Property test: the store equals a simple model after every step of random
//! blocks, rollbacks (inside and outside the window), snapshots and reopens.

use memfs_store::{Durability, Store, StoreError, StoreOptions};
use proptest::prelude::*;
use std::collections::{BTreeMap, VecDeque};
use std::path::Path;

type State = BTreeMap<Vec<u8>, Vec<u8>>;

#[derive(Debug, Clone)]
enum Step {
    Block {
        gap: u64,
        ops: Vec<(u8, Option<Vec<u8>>)>,
    },
    Rollback(u64),
    Reopen,
    Snapshot,
}

fn step() -> impl Strategy<Value = Step> {
    let val = prop_oneof![
        4 => prop::collection::vec(any::<u8>(), 1..9),
        1 => prop::collection::vec(any::<u8>(), 9..100),
    ];
    let op = (
        0u8..40,
        prop_oneof![3 => val.prop_map(Some), 1 => Just(None)],
    );
    prop_oneof![
        10 => (0u64..3, prop::collection::vec(op, 0..30)).prop_map(|(gap, ops)| Step::Block { gap, ops }),
        2 => (0u64..12).prop_map(Step::Rollback),
        1 => Just(Step::Reopen),
        1 => Just(Step::Snapshot),
    ]
}

struct Model {
    base: (u64, State),
    hist: VecDeque<(u64, State)>,
    window: usize,
}

impl Model {
    fn current(&self) -> &(u64, State) {
        self.hist.back().unwrap_or(&self.base)
    }
}

fn key(kw: usize, i: u8) -> Vec<u8> {
    let mut k = vec![0xA5u8; kw];
    k[kw - 1] = i;
    k[0] = i.wrapping_mul(31);
    k
}

fn check(store: &Store, m: &Model, kw: usize) {
    let (block, state) = m.current();
    assert_eq!(store.current_block(), *block);
    assert_eq!(store.len(), state.len() as u64);
    for i in 0..40u8 {
        let k = key(kw, i);
        assert_eq!(
            store.get(&k).unwrap(),
            state.get(&k).cloned(),
            "key {i} at block {block}"
        );
    }
    assert_eq!(store.oldest_rollback_block(), m.base.0);
}

fn open(dir: &Path, kw: usize, window: u64, durability: Durability, threads: usize) -> Store {
    Store::open_or_create(
        dir,
        StoreOptions {
            key_width: kw,
            shards: 5,
            capacity_per_shard: 4,
            threads,
            durability,
            snapshot_interval: 4,
            rollback_window: window,
            segment_size: 4096,
        },
    )
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]
    #[test]
    fn store_equals_model(
        kw in prop_oneof![Just(8usize), Just(13), Just(64)],
        window in 1u64..8,
        mode in prop_oneof![Just("sync"), Just("none"), Just("async=2"), Just("relaxed=3"), Just("async-relaxed=2")],
        threads in 1usize..3,
        steps in prop::collection::vec(step(), 1..60),
    ) {
        let t = tempfile::tempdir().unwrap();
        let d: Durability = mode.parse().unwrap();
        let mut store = open(t.path(), kw, window, d, threads);
        let mut m = Model { base: (0, State::new()), hist: VecDeque::new(), window: window as usize };
        for s in steps {
            match s {
                Step::Block { gap, ops } => {
                    let block = m.current().0 + 1 + gap;
                    let kv: Vec<(Vec<u8>, Vec<u8>)> = ops
                        .iter()
                        .map(|(k, v)| (key(kw, *k), v.clone().unwrap_or_default()))
                        .collect();
                    // Half the blocks go through the builder.
                    if gap == 1 {
                        let mut b = store.start_block(block).unwrap();
                        for (k, v) in &kv {
                            b.put(k, v).unwrap();
                            let seen = b.get(k).unwrap();
                            prop_assert_eq!(seen, (!v.is_empty()).then(|| v.clone()));
                        }
                        b.commit().unwrap();
                    } else {
                        store.set(block, &kv).unwrap();
                    }
                    let mut st = m.current().1.clone();
                    for (k, v) in kv {
                        if v.is_empty() { st.remove(&k); } else { st.insert(k, v); }
                    }
                    m.hist.push_back((block, st));
                    while m.hist.len() > m.window {
                        m.base = m.hist.pop_front().unwrap();
                    }
                    // A repeated block id is refused and changes nothing.
                    let err = store.set(block, &[(key(kw, 0), b"x".to_vec())]).unwrap_err();
                    let refused = matches!(err, StoreError::BlockNotIncreasing { .. });
                    prop_assert!(refused);
                }
                Step::Rollback(back) => {
                    let cur = m.current().0;
                    let target = cur.saturating_sub(back);
                    let res = store.rollback(target);
                    if target < m.base.0 {
                        let outside = matches!(res, Err(StoreError::RollbackOutsideWindow { .. }));
                        prop_assert!(outside, "{:?}", res);
                    } else {
                        res.unwrap();
                        while m.hist.back().is_some_and(|(b, _)| *b > target) {
                            m.hist.pop_back();
                        }
                    }
                }
                Step::Reopen => {
                    store.close().unwrap();
                    store = if kw == 8 { Store::open(t.path()).unwrap() } else { open(t.path(), kw, window, d, threads) };
                }
                Step::Snapshot => {
                    store.snapshot().unwrap();
                }
            }
            check(&store, &m, kw);
        }
        store.close().unwrap();
        let store = Store::open(t.path()).unwrap();
        check(&store, &m, kw);
    }
}
