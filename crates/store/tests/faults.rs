//! A block that cannot be journaled (disk full) is refused with a typed
//! error, the store stays at the previous block and keeps working once
//! space is back (issue 15, part 1).

use std::sync::Arc;

use memfs_journal::storage::register_scoped;
use memfs_journal::{RecoverMode, SimStorage};
use memfs_store::{Store, StoreError, StoreOptions};

fn key(i: u64) -> Vec<u8> {
    i.to_le_bytes().to_vec()
}

#[test]
fn a_block_without_journal_space_is_refused_and_nothing_changes() {
    let sim = SimStorage::new();
    let prefix = std::path::PathBuf::from("/memfs-store-faults");
    let reg = register_scoped(&prefix, Arc::new(sim.clone()));
    let dir = prefix.join("data");
    let opts = StoreOptions {
        shards: 4,
        durability: "sync".parse().unwrap(),
        ..Default::default()
    };
    let s = Store::create(&dir, opts).unwrap();
    let mut block = 0;
    let mut refused = 0;
    for round in 0..40u64 {
        if round % 7 == 3 {
            sim.fail_next_alloc(nix::errno::Errno::ENOSPC as i32);
        }
        // Blocks big enough to need new journal space now and then.
        let ops: Vec<(Vec<u8>, Vec<u8>)> = (0..200)
            .map(|i| (key(round * 1000 + i), vec![round as u8; 900]))
            .collect();
        match s.set(block + 1, &ops) {
            Ok(()) => block += 1,
            Err(e) => {
                assert!(
                    matches!(e, StoreError::Journal(memfs_journal::Error::NoSpace { .. })),
                    "{e}"
                );
                refused += 1;
                assert_eq!(s.current_block(), block);
                assert_eq!(s.get(&key(round * 1000)).unwrap(), None);
            }
        }
        assert_eq!(s.current_block(), block);
    }
    assert!(refused > 0, "no reservation ever needed new space");
    let len = s.len();
    drop(s);
    reg.replace(Arc::new(sim.recover(RecoverMode::DropAll, 1)));
    let s = Store::open(&dir).unwrap();
    assert_eq!(s.current_block(), block);
    assert_eq!(s.len(), len);
    s.close().unwrap();
}
