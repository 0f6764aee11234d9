//! The node record of docs/cluster.md ("Keys"): 64 bytes, little-endian, no
//! padding, then a symlink's target. It is the value of field `<ino & 63>`
//! of `{V}:i:<ino >> 6>`. Decoding never panics: every input is checked and
//! a bad one is an error naming what was wrong.

use crate::error::{Error, Result};

/// The record version this code writes and reads.
pub const VERSION: u8 = 1;
/// Bytes before a symlink's target.
pub const FIXED_LEN: usize = 64;
/// The longest symlink target (`PATH_MAX` less its NUL).
pub const MAX_TARGET: usize = 4095;
/// The permission bits a record keeps (with setuid, setgid, sticky).
pub const MODE_MASK: u16 = 0o7777;
/// In [`Record::flags`]: the node has xattrs (`{V}:x:<ino>` exists). The
/// low bits are the inode flags (`FS_APPEND_FL`, `FS_IMMUTABLE_FL`, ...).
pub const FLAG_HAS_XATTRS: u32 = 1 << 31;

/// A node's type, with its code in the record's first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    File = 1,
    Dir = 2,
    Symlink = 3,
    Fifo = 4,
    Socket = 5,
    Char = 6,
    Block = 7,
}

impl Kind {
    /// Every kind, in code order.
    pub const ALL: [Kind; 7] = [
        Kind::File,
        Kind::Dir,
        Kind::Symlink,
        Kind::Fifo,
        Kind::Socket,
        Kind::Char,
        Kind::Block,
    ];

    fn from_code(c: u8) -> Option<Kind> {
        Kind::ALL.get(usize::from(c).checked_sub(1)?).copied()
    }
}

/// A node's attributes (times in ns since the epoch, signed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub kind: Kind,
    /// Permission bits, setuid, setgid, sticky (within [`MODE_MASK`]).
    pub mode: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    pub btime: i64,
    pub rdev: u32,
    /// Inode flags and [`FLAG_HAS_XATTRS`].
    pub flags: u32,
    /// A symlink's target (at most [`MAX_TARGET`] bytes); empty otherwise.
    pub target: Vec<u8>,
}

impl Record {
    /// The record of a new node: `nlink` 1 (2 for a directory), size 0, all
    /// four times `now`.
    pub fn new(kind: Kind, mode: u16, uid: u32, gid: u32, now: i64) -> Record {
        Record {
            kind,
            mode: mode & MODE_MASK,
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            uid,
            gid,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            btime: now,
            rdev: 0,
            flags: 0,
            target: Vec::new(),
        }
    }

    /// Its encoded length.
    pub fn len(&self) -> usize {
        FIXED_LEN + self.target.len()
    }

    /// Never: a record has at least its fixed part.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// Appends `r`'s encoding to `out`.
///
/// # Panics
/// When `r` breaks the record's rules (a mode outside [`MODE_MASK`], a
/// target on a non-symlink, a target over [`MAX_TARGET`]): the caller's bug,
/// and a record that would not decode. Cheap, and it stops a corrupt value.
pub fn encode(r: &Record, out: &mut Vec<u8>) {
    assert!(r.mode & !MODE_MASK == 0, "mode {:o} over 7777", r.mode);
    assert!(
        r.kind == Kind::Symlink || r.target.is_empty(),
        "a target on a {:?}",
        r.kind
    );
    assert!(
        r.target.len() <= MAX_TARGET,
        "target of {} bytes",
        r.target.len()
    );
    let start = out.len();
    out.push(r.kind as u8);
    out.push(VERSION);
    out.extend_from_slice(&r.mode.to_le_bytes());
    for n in [r.nlink, r.uid, r.gid] {
        out.extend_from_slice(&n.to_le_bytes());
    }
    out.extend_from_slice(&r.size.to_le_bytes());
    for t in [r.atime, r.mtime, r.ctime, r.btime] {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(&r.rdev.to_le_bytes());
    out.extend_from_slice(&r.flags.to_le_bytes());
    out.extend_from_slice(&r.target);
    #[cfg(debug_assertions)]
    check(r, &out[start..]);
    #[cfg(not(debug_assertions))]
    let _ = start;
}

/// `r`'s encoding.
pub fn to_vec(r: &Record) -> Vec<u8> {
    let mut out = Vec::with_capacity(r.len());
    encode(r, &mut out);
    out
}

/// What [`encode`] wrote decodes to what it was given: the codec's two
/// halves cannot drift apart unnoticed.
#[cfg(debug_assertions)]
fn check(r: &Record, bytes: &[u8]) {
    debug_assert_eq!(bytes.len(), r.len());
    match decode(bytes) {
        Ok(back) => debug_assert_eq!(&back, r, "record does not decode to itself"),
        Err(e) => panic!("encoded record does not decode: {e}"),
    }
}

/// The record in `b`.
pub fn decode(b: &[u8]) -> Result<Record> {
    let bad = |why: String| Error::BadRecord(why);
    if b.len() < FIXED_LEN {
        return Err(bad(format!("{} bytes, under {FIXED_LEN}", b.len())));
    }
    let kind = Kind::from_code(b[0]).ok_or_else(|| bad(format!("unknown type code {}", b[0])))?;
    if b[1] != VERSION {
        return Err(bad(format!("version {}, not {VERSION}", b[1])));
    }
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    let u64_at = |o: usize| {
        let mut a = [0; 8];
        a.copy_from_slice(&b[o..o + 8]);
        u64::from_le_bytes(a)
    };
    let mode = u16_at(2);
    if mode & !MODE_MASK != 0 {
        return Err(bad(format!("mode {mode:o} over 7777")));
    }
    let target = &b[FIXED_LEN..];
    if kind != Kind::Symlink && !target.is_empty() {
        return Err(bad(format!(
            "{} bytes after a {kind:?}'s record",
            target.len()
        )));
    }
    if target.len() > MAX_TARGET {
        return Err(bad(format!("symlink target of {} bytes", target.len())));
    }
    Ok(Record {
        kind,
        mode,
        nlink: u32_at(4),
        uid: u32_at(8),
        gid: u32_at(12),
        size: u64_at(16),
        atime: u64_at(24) as i64,
        mtime: u64_at(32) as i64,
        ctime: u64_at(40) as i64,
        btime: u64_at(48) as i64,
        rdev: u32_at(56),
        flags: u32_at(60),
        target: target.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kind() -> impl Strategy<Value = Kind> {
        proptest::sample::select(Kind::ALL.to_vec())
    }

    prop_compose! {
        fn record()(
            kind in kind(),
            mode in 0..=MODE_MASK,
            ids in any::<(u32, u32, u32, u64)>(),
            times in any::<(i64, i64, i64, i64)>(),
            rf in any::<(u32, u32)>(),
            target in proptest::collection::vec(any::<u8>(), 0..=MAX_TARGET),
        ) -> Record {
            Record {
                kind,
                mode,
                nlink: ids.0,
                uid: ids.1,
                gid: ids.2,
                size: ids.3,
                atime: times.0,
                mtime: times.1,
                ctime: times.2,
                btime: times.3,
                rdev: rf.0,
                flags: rf.1,
                target: if kind == Kind::Symlink { target } else { Vec::new() },
            }
        }
    }

    proptest! {
        #[test]
        fn round_trip(r in record()) {
            let b = to_vec(&r);
            prop_assert_eq!(b.len(), r.len());
            prop_assert_eq!(decode(&b).unwrap(), r);
        }

        #[test]
        fn any_bytes_decode_or_fail_cleanly(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(r) = decode(&b) {
                prop_assert_eq!(to_vec(&r), b);
            }
        }
    }

    #[test]
    fn layout() {
        let mut r = Record::new(Kind::Dir, 0o755, 1000, 100, -2);
        r.size = 0x0102_0304_0506_0708;
        r.rdev = 7;
        r.flags = FLAG_HAS_XATTRS | 0x10;
        let b = to_vec(&r);
        assert_eq!(b.len(), 64);
        assert_eq!(&b[..4], &[2, 1, 0xed, 0x01], "dir, version 1, 0o755");
        assert_eq!(&b[4..8], &2u32.to_le_bytes());
        assert_eq!(&b[8..12], &1000u32.to_le_bytes());
        assert_eq!(&b[12..16], &100u32.to_le_bytes());
        assert_eq!(&b[16..24], &r.size.to_le_bytes());
        assert_eq!(&b[24..32], &(-2i64).to_le_bytes());
        assert_eq!(&b[48..56], &(-2i64).to_le_bytes());
        assert_eq!(&b[56..60], &7u32.to_le_bytes());
        assert_eq!(&b[60..64], &(FLAG_HAS_XATTRS | 0x10).to_le_bytes());
    }

    #[test]
    fn bad_input() {
        let good = to_vec(&Record::new(Kind::File, 0o644, 0, 0, 0));
        let err = |b: &[u8]| decode(b).unwrap_err().to_string();
        assert!(
            err(&good[..63]).contains("63 bytes"),
            "{}",
            err(&good[..63])
        );
        assert!(err(&[]).contains("0 bytes"));
        let mut b = good.clone();
        b[0] = 0;
        assert!(err(&b).contains("type code 0"));
        b[0] = 8;
        assert!(err(&b).contains("type code 8"));
        let mut b = good.clone();
        b[1] = 2;
        assert!(err(&b).contains("version 2"));
        let mut b = good.clone();
        b[3] = 0x10;
        assert!(err(&b).contains("mode"));
        let mut b = good.clone();
        b.push(b'x');
        assert!(err(&b).contains("after a File"));
        let mut s = Record::new(Kind::Symlink, 0o777, 0, 0, 0);
        s.target = vec![b'a'; MAX_TARGET];
        let mut b = to_vec(&s);
        assert_eq!(decode(&b).unwrap(), s);
        b.push(b'a');
        assert!(err(&b).contains("4096 bytes"));
    }

    #[test]
    #[should_panic(expected = "a target on a File")]
    fn encode_refuses_a_target_on_a_file() {
        let mut r = Record::new(Kind::File, 0o644, 0, 0, 0);
        r.target = b"x".to_vec();
        to_vec(&r);
    }
}
