//! The frame decoder on arbitrary input: it returns a frame, "need more", or
//! a typed error; it never panics and never claims more bytes than it has.

use memfs_store::net::protocol::{self as p, Limits, ProtoError, Role};
use proptest::prelude::*;

fn drive(buf: &[u8], kw: usize, lim: &Limits) -> usize {
    let mut at = 0;
    let mut frames = 0;
    loop {
        match p::decode(&buf[at..], kw, lim) {
            Ok(None) => return frames,
            Ok(Some((parsed, n))) => {
                assert!(
                    n > p::LEN_BYTES && n <= buf.len() - at,
                    "used {n} of {}",
                    buf.len() - at
                );
                if let Err(e) = parsed {
                    // Every body error has a wire code and a message.
                    assert!(!e.to_string().is_empty());
                    let _ = e.code();
                }
                at += n;
                frames += 1;
            }
            Err(e) => {
                assert!(e.is_fatal(), "{e:?} returned as fatal framing error");
                assert!(matches!(
                    e,
                    ProtoError::EmptyFrame | ProtoError::FrameTooLarge { .. }
                ));
                return frames;
            }
        }
    }
}

fn valid_stream(kw: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let key = vec![7u8; kw];
    p::put_hello(&mut out, kw as u16, Role::Write, b"user", b"token");
    p::put_get(&mut out, &key);
    p::put_multi_get(&mut out, &[key.clone(), key.clone()]);
    p::put_set(
        &mut out,
        9,
        &[(key.clone(), vec![1u8; 20]), (key.clone(), vec![])],
    );
    p::put_pop(&mut out, 10, &key);
    p::put_u64s(&mut out, p::op::ROLLBACK, &[3]);
    p::put_u64s(&mut out, p::op::SUBSCRIBE, &[1, 2]);
    p::put_u64s(&mut out, p::op::ACK, &[4]);
    p::put_value(&mut out, Some(b"abc"));
    p::put_ev_block(&mut out, 1, 0, &{
        let mut b = Vec::new();
        b.extend_from_slice(&5u64.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&key);
        b.extend_from_slice(&2u16.to_le_bytes());
        b.extend_from_slice(b"hi");
        b
    });
    p::put_u64s(&mut out, p::op::EV_ROLLBACK, &[2, 5, 1, 1]);
    p::put_empty(&mut out, p::op::SNAPSHOT);
    p::put_snap_file(&mut out, 3, "journal-00000000000000000001.log");
    let at = p::begin(&mut out, p::op::SNAP_DATA);
    out.extend_from_slice(b"abc");
    p::end(&mut out, at);
    p::put_snap_end(&mut out, 1, 3);
    p::put_error(&mut out, p::ErrorCode::Forbidden, "nope");
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(buf in proptest::collection::vec(any::<u8>(), 0..600), kw in prop_oneof![Just(0usize), Just(8), Just(13), Just(64)]) {
        let lim = Limits { max_frame: 256, max_batch: 16 };
        drive(&buf, kw, &lim);
    }

    #[test]
    fn arbitrary_bodies(ty in any::<u8>(), body in proptest::collection::vec(any::<u8>(), 0..300)) {
        let lim = Limits { max_frame: 1 << 20, max_batch: 16 };
        for kw in [0usize, 8, 32] {
            let _ = p::parse(ty, &body, kw, &lim);
        }
    }

    #[test]
    fn mutated_valid_frames(flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6), cut in any::<usize>()) {
        let lim = Limits::default();
        let mut buf = valid_stream(8);
        assert_eq!(drive(&buf, 8, &lim), 16);
        for (at, b) in flips {
            let i = at % buf.len();
            buf[i] = b;
        }
        let cut = cut % (buf.len() + 1);
        drive(&buf[..cut], 8, &lim);
        drive(&buf, 8, &lim);
    }
}

/// A snapshot transfer may only create plain files inside the directory it
/// fills: names with a path separator, `..`, a leading dot or control bytes
/// are malformed frames.
#[test]
fn snapshot_file_names_are_plain() {
    let lim = Limits::default();
    for bad in ["", "..", "../x", "a/b", ".hidden", "a\\b", "a b", "a\nb"] {
        let mut out = Vec::new();
        p::put_snap_file(&mut out, 1, bad);
        let (ty, body, _) = p::split_frame(&out, u32::MAX).unwrap().unwrap();
        assert!(
            matches!(
                p::parse(ty, body, 8, &lim),
                Err(ProtoError::Malformed { .. })
            ),
            "{bad:?} accepted"
        );
    }
    let mut out = Vec::new();
    p::put_snap_file(&mut out, 7, "snapshot-00000000000000000042.snap");
    let (ty, body, _) = p::split_frame(&out, u32::MAX).unwrap().unwrap();
    assert!(matches!(
        p::parse(ty, body, 8, &lim),
        Ok(p::Frame::SnapFile {
            size: 7,
            name: "snapshot-00000000000000000042.snap"
        })
    ));
}
