//! Pieces shared by the store's integration tests.

use std::collections::BTreeMap;

/// The contents a store must hold after blocks `1..=upto`, each given by
/// `block_ops` (an empty value deletes its key).
pub fn replay(
    upto: u64,
    block_ops: impl Fn(u64) -> Vec<([u8; 8], Vec<u8>)>,
) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut m = BTreeMap::new();
    for b in 1..=upto {
        for (k, v) in block_ops(b) {
            if v.is_empty() {
                m.remove(k.as_slice());
            } else {
                m.insert(k.to_vec(), v);
            }
        }
    }
    m
}
