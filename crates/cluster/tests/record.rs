//! The node record codec through the crate's public face: a round trip of
//! every kind, and bad input refused with an error that names the fault.

use memfs_cluster::Error;
use memfs_cluster::record::{self, FIXED_LEN, Kind, MAX_TARGET, Record};
use proptest::prelude::*;

proptest! {
    #[test]
    fn round_trip(kind in proptest::sample::select(Kind::ALL.to_vec()),
                  mode in 0u16..=0o7777, now in any::<i64>(), size in any::<u64>(),
                  target in proptest::collection::vec(any::<u8>(), 1..=MAX_TARGET)) {
        let mut r = Record::new(kind, mode, 1000, 1000, now);
        r.size = size;
        if kind == Kind::Symlink {
            r.target = target;
        }
        let b = record::to_vec(&r);
        prop_assert_eq!(b.len(), FIXED_LEN + r.target.len());
        prop_assert_eq!(record::decode(&b).unwrap(), r);
    }
}

#[test]
fn bad_input_is_an_error() {
    let good = record::to_vec(&Record::new(Kind::File, 0o644, 0, 0, 1));
    for (bytes, fault) in [
        (good[..10].to_vec(), "10 bytes"),
        ([&[9u8][..], &good[1..]].concat(), "type code 9"),
        ([&good[..1], &[0u8][..], &good[2..]].concat(), "version 0"),
    ] {
        match record::decode(&bytes) {
            Err(e @ Error::BadRecord(_)) => assert!(e.to_string().contains(fault), "{e}"),
            other => panic!("{fault}: {other:?}"),
        }
    }
}
