//! Byte encoding of mutations (journal records) and attributes (shared with
//! checkpoint images). Little-endian, no padding; the layout is specified in
//! `docs/durability.md`. Decoding never panics: every read is bounds-checked
//! and a malformed record is an error naming what was wrong.

use memfs_fs::{Attr, FallocateMode, FileType, Mutation, PAGE_SIZE, Timespec};

/// Version byte at the start of every journal record.
pub const RECORD_VERSION: u8 = 1;

/// Encoded size of an [`Attr`].
pub const ATTR_LEN: usize = 8 + 1 + 2 + 4 * 4 + 8 + 3 * 12;

const T_CREATE: u8 = 1;
const T_LINK: u8 = 2;
const T_REMOVE: u8 = 3;
const T_RENAME: u8 = 4;
const T_SETATTR: u8 = 5;
const T_WRITE: u8 = 6;
const T_FALLOCATE: u8 = 7;
const T_SETXATTR: u8 = 8;
const T_REMOVEXATTR: u8 = 9;
const T_FREE: u8 = 10;
/// Added after the first release: older journals never hold it.
const T_TMPFILE: u8 = 11;
/// Added after the first release: older journals never hold it.
const T_SETFLAGS: u8 = 12;

pub(crate) fn kind_code(k: FileType) -> u8 {
    match k {
        FileType::RegularFile => 1,
        FileType::Directory => 2,
        FileType::Symlink => 3,
        FileType::CharDevice => 4,
        FileType::BlockDevice => 5,
        FileType::NamedPipe => 6,
        FileType::Socket => 7,
    }
}

pub(crate) fn kind_from(c: u8) -> Result<FileType, String> {
    Ok(match c {
        1 => FileType::RegularFile,
        2 => FileType::Directory,
        3 => FileType::Symlink,
        4 => FileType::CharDevice,
        5 => FileType::BlockDevice,
        6 => FileType::NamedPipe,
        7 => FileType::Socket,
        _ => return Err(format!("unknown file type code {c}")),
    })
}

pub(crate) fn put_attr(out: &mut Vec<u8>, a: &Attr) {
    out.extend_from_slice(&a.ino.to_le_bytes());
    out.push(kind_code(a.kind));
    out.extend_from_slice(&a.perm.to_le_bytes());
    out.extend_from_slice(&a.nlink.to_le_bytes());
    out.extend_from_slice(&a.uid.to_le_bytes());
    out.extend_from_slice(&a.gid.to_le_bytes());
    out.extend_from_slice(&a.rdev.to_le_bytes());
    out.extend_from_slice(&a.size.to_le_bytes());
    for t in [a.atime, a.mtime, a.ctime] {
        out.extend_from_slice(&t.sec.to_le_bytes());
        out.extend_from_slice(&t.nsec.to_le_bytes());
    }
}

pub(crate) fn put_bytes16(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
    out.extend_from_slice(b);
}

pub(crate) fn put_bytes32(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// The record of a write of `len` bytes up to its data, which follows it:
/// what [`encode`] puts before a [`Mutation::Write`]'s data, for a writer
/// that appends the data from several slices
/// (`JournalRecorder::record_write`).
pub fn encode_write_head(attr: &Attr, offset: u64, len: usize, out: &mut Vec<u8>) {
    out.push(RECORD_VERSION);
    put_write_head(out, attr, offset, len);
}

fn put_write_head(out: &mut Vec<u8>, attr: &Attr, offset: u64, len: usize) {
    out.push(T_WRITE);
    put_attr(out, attr);
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&(len as u32).to_le_bytes());
}

/// Encodes `m` as a journal record. Bulk data (a write's bytes) is not
/// copied here: it is returned as the second part for a vectored commit.
pub fn encode<'a>(m: &Mutation<'a>, out: &mut Vec<u8>) -> Option<&'a [u8]> {
    out.push(RECORD_VERSION);
    match *m {
        Mutation::Create {
            parent,
            name,
            attr,
            symlink_target,
        } => {
            out.push(T_CREATE);
            put_attr(out, &parent);
            put_bytes16(out, name);
            put_attr(out, &attr);
            match symlink_target {
                Some(t) => {
                    out.push(1);
                    put_bytes16(out, t);
                }
                None => out.push(0),
            }
        }
        Mutation::Link { parent, name, attr } => {
            out.push(T_LINK);
            put_attr(out, &parent);
            put_bytes16(out, name);
            put_attr(out, &attr);
        }
        Mutation::Remove { parent, name, attr } => {
            out.push(T_REMOVE);
            put_attr(out, &parent);
            put_bytes16(out, name);
            put_attr(out, &attr);
        }
        Mutation::Rename {
            parent,
            name,
            new_parent,
            new_name,
            moved,
            other,
            exchange,
        } => {
            out.push(T_RENAME);
            put_attr(out, &parent);
            put_bytes16(out, name);
            put_attr(out, &new_parent);
            put_bytes16(out, new_name);
            put_attr(out, &moved);
            out.push(u8::from(exchange) | (u8::from(other.is_some()) << 1));
            if let Some(o) = other {
                put_attr(out, &o);
            }
        }
        Mutation::SetAttr { attr } => {
            out.push(T_SETATTR);
            put_attr(out, &attr);
        }
        Mutation::Write { attr, offset, data } => {
            put_write_head(out, &attr, offset, data.len());
            return Some(data);
        }
        Mutation::Fallocate {
            attr,
            offset,
            len,
            mode,
        } => {
            out.push(T_FALLOCATE);
            put_attr(out, &attr);
            out.extend_from_slice(&offset.to_le_bytes());
            out.extend_from_slice(&len.to_le_bytes());
            out.push(
                u8::from(mode.keep_size)
                    | (u8::from(mode.punch_hole) << 1)
                    | (u8::from(mode.zero_range) << 2),
            );
        }
        Mutation::SetXattr { attr, name, value } => {
            out.push(T_SETXATTR);
            put_attr(out, &attr);
            put_bytes16(out, name);
            put_bytes32(out, value);
        }
        Mutation::RemoveXattr { attr, name } => {
            out.push(T_REMOVEXATTR);
            put_attr(out, &attr);
            put_bytes16(out, name);
        }
        Mutation::Free { ino } => {
            out.push(T_FREE);
            out.extend_from_slice(&ino.to_le_bytes());
        }
        Mutation::Tmpfile { attr } => {
            out.push(T_TMPFILE);
            put_attr(out, &attr);
        }
        Mutation::SetFlags { attr, flags } => {
            out.push(T_SETFLAGS);
            put_attr(out, &attr);
            out.extend_from_slice(&flags.to_le_bytes());
        }
    }
    None
}

/// A bounds-checked reader over a record or image.
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    pub fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                format!(
                    "record truncated: {n} bytes wanted at offset {} of {}",
                    self.pos,
                    self.buf.len()
                )
            })?;
        let b = &self.buf[self.pos..end];
        self.pos = end;
        Ok(b)
    }

    pub fn u8(&mut self) -> Result<u8, String> {
        Ok(self.bytes(1)?[0])
    }

    pub fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.bytes(2)?.try_into().expect("2")))
    }

    pub fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.bytes(4)?.try_into().expect("4")))
    }

    pub fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.bytes(8)?.try_into().expect("8")))
    }

    fn time(&mut self) -> Result<Timespec, String> {
        let sec = self.u64()? as i64;
        let nsec = self.u32()?;
        if nsec >= 1_000_000_000 {
            return Err(format!("nanoseconds out of range: {nsec}"));
        }
        Ok(Timespec { sec, nsec })
    }

    pub fn attr(&mut self) -> Result<Attr, String> {
        let ino = self.u64()?;
        if ino == 0 {
            return Err("inode number 0".into());
        }
        let kind = kind_from(self.u8()?)?;
        let perm = self.u16()?;
        if perm > 0o7777 {
            return Err(format!("permission bits out of range: {perm:o}"));
        }
        let (nlink, uid, gid, rdev, size) = (
            self.u32()?,
            self.u32()?,
            self.u32()?,
            self.u32()?,
            self.u64()?,
        );
        let (atime, mtime, ctime) = (self.time()?, self.time()?, self.time()?);
        Ok(Attr {
            ino,
            kind,
            perm,
            nlink,
            uid,
            gid,
            rdev,
            size,
            blocks: 0,
            atime,
            mtime,
            ctime,
            // Not encoded: a record's btime is its ctime. Replay reads it only
            // where a node is made (create, tmpfile), whose ctime is its
            // creation time; images carry other btimes in R_BTIME records.
            btime: ctime,
            blksize: PAGE_SIZE as u32,
        })
    }

    pub fn bytes16(&mut self) -> Result<&'a [u8], String> {
        let n = self.u16()? as usize;
        self.bytes(n)
    }

    pub fn bytes32(&mut self) -> Result<&'a [u8], String> {
        let n = self.u32()? as usize;
        self.bytes(n)
    }

    fn name(&mut self) -> Result<&'a [u8], String> {
        let n = self.bytes16()?;
        if n.is_empty() || n.len() > memfs_fs::NAME_MAX || n.contains(&b'/') {
            return Err(format!("invalid name of {} bytes", n.len()));
        }
        Ok(n)
    }

    fn dir_attr(&mut self) -> Result<Attr, String> {
        let a = self.attr()?;
        if a.kind != FileType::Directory {
            return Err(format!("inode {} should be a directory", a.ino));
        }
        Ok(a)
    }
}

/// Decodes a journal record; names and data borrow from `payload`.
pub fn decode(payload: &[u8]) -> Result<Mutation<'_>, String> {
    let mut c = Cursor::new(payload);
    let v = c.u8()?;
    if v != RECORD_VERSION {
        return Err(format!("unknown record version {v}"));
    }
    let tag = c.u8()?;
    let m = match tag {
        T_CREATE => {
            let parent = c.dir_attr()?;
            let name = c.name()?;
            let attr = c.attr()?;
            let symlink_target = match c.u8()? {
                0 => None,
                _ => Some(c.bytes16()?),
            };
            Mutation::Create {
                parent,
                name,
                attr,
                symlink_target,
            }
        }
        T_LINK | T_REMOVE => {
            let parent = c.dir_attr()?;
            let name = c.name()?;
            let attr = c.attr()?;
            if tag == T_LINK {
                Mutation::Link { parent, name, attr }
            } else {
                Mutation::Remove { parent, name, attr }
            }
        }
        T_RENAME => {
            let parent = c.dir_attr()?;
            let name = c.name()?;
            let new_parent = c.dir_attr()?;
            let new_name = c.name()?;
            let moved = c.attr()?;
            let flags = c.u8()?;
            let other = if flags & 2 != 0 {
                Some(c.attr()?)
            } else {
                None
            };
            let exchange = flags & 1 != 0;
            if exchange && other.is_none() {
                return Err("exchange without a second node".into());
            }
            Mutation::Rename {
                parent,
                name,
                new_parent,
                new_name,
                moved,
                other,
                exchange,
            }
        }
        T_SETATTR => Mutation::SetAttr { attr: c.attr()? },
        T_WRITE => {
            let attr = c.attr()?;
            let offset = c.u64()?;
            let data = c.bytes32()?;
            offset
                .checked_add(data.len() as u64)
                .filter(|&e| e <= memfs_fs::MAX_FILE_SIZE)
                .ok_or("write beyond the largest file size")?;
            Mutation::Write { attr, offset, data }
        }
        T_FALLOCATE => {
            let attr = c.attr()?;
            let offset = c.u64()?;
            let len = c.u64()?;
            offset
                .checked_add(len)
                .filter(|&e| e <= memfs_fs::MAX_FILE_SIZE)
                .ok_or("fallocate beyond the largest file size")?;
            let f = c.u8()?;
            Mutation::Fallocate {
                attr,
                offset,
                len,
                mode: FallocateMode {
                    keep_size: f & 1 != 0,
                    punch_hole: f & 2 != 0,
                    zero_range: f & 4 != 0,
                },
            }
        }
        T_SETXATTR => {
            let attr = c.attr()?;
            let name = c.bytes16()?;
            let value = c.bytes32()?;
            Mutation::SetXattr { attr, name, value }
        }
        T_REMOVEXATTR => {
            let attr = c.attr()?;
            let name = c.bytes16()?;
            Mutation::RemoveXattr { attr, name }
        }
        T_FREE => Mutation::Free { ino: c.u64()? },
        T_TMPFILE => {
            let attr = c.attr()?;
            if attr.kind != FileType::RegularFile || attr.nlink != 0 {
                return Err(format!(
                    "tmpfile {} must be a regular file with no link",
                    attr.ino
                ));
            }
            Mutation::Tmpfile { attr }
        }
        T_SETFLAGS => Mutation::SetFlags {
            attr: c.attr()?,
            flags: c.u32()?,
        },
        t => return Err(format!("unknown record type {t}")),
    };
    if !c.is_empty() {
        return Err("trailing bytes after the record".into());
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(ino: u64, kind: FileType) -> Attr {
        Attr {
            ino,
            kind,
            perm: 0o644,
            nlink: 1,
            uid: 1,
            gid: 2,
            rdev: 0,
            size: 10,
            blocks: 0,
            atime: Timespec { sec: 1, nsec: 2 },
            mtime: Timespec { sec: 3, nsec: 4 },
            ctime: Timespec { sec: -5, nsec: 6 },
            // What decoding gives back: the journal does not carry btime.
            btime: Timespec { sec: -5, nsec: 6 },
            blksize: PAGE_SIZE as u32,
        }
    }

    #[test]
    fn every_record_round_trips_and_every_truncation_is_an_error() {
        let d = attr(1, FileType::Directory);
        let f = attr(7, FileType::RegularFile);
        let cases = [
            Mutation::Create {
                parent: d,
                name: b"a",
                attr: attr(9, FileType::Symlink),
                symlink_target: Some(b"target"),
            },
            Mutation::Link {
                parent: d,
                name: b"l",
                attr: f,
            },
            Mutation::Remove {
                parent: d,
                name: b"r",
                attr: f,
            },
            Mutation::Rename {
                parent: d,
                name: b"x",
                new_parent: attr(3, FileType::Directory),
                new_name: b"y",
                moved: f,
                other: Some(attr(8, FileType::RegularFile)),
                exchange: true,
            },
            Mutation::SetAttr { attr: f },
            Mutation::Write {
                attr: f,
                offset: 5,
                data: b"hello",
            },
            Mutation::Fallocate {
                attr: f,
                offset: 1,
                len: 2,
                mode: FallocateMode {
                    keep_size: true,
                    punch_hole: true,
                    zero_range: false,
                },
            },
            Mutation::SetXattr {
                attr: f,
                name: b"user.k",
                value: b"v",
            },
            Mutation::RemoveXattr {
                attr: f,
                name: b"user.k",
            },
            Mutation::Free { ino: 12 },
            Mutation::Tmpfile {
                attr: Attr { nlink: 0, ..f },
            },
            Mutation::SetFlags {
                attr: f,
                flags: memfs_fs::FS_APPEND_FL | memfs_fs::FS_NODUMP_FL,
            },
        ];
        for m in cases {
            let mut out = Vec::new();
            if let Some(data) = encode(&m, &mut out) {
                out.extend_from_slice(data);
            }
            let back = decode(&out).unwrap();
            assert_eq!(format!("{m:?}"), format!("{back:?}"));
            for cut in 0..out.len() {
                assert!(decode(&out[..cut]).is_err(), "{m:?} cut at {cut}");
            }
        }
    }

    #[test]
    fn a_tmpfile_record_with_a_link_or_of_another_kind_is_rejected() {
        for attr in [
            attr(7, FileType::RegularFile),
            Attr {
                nlink: 0,
                ..attr(7, FileType::Directory)
            },
        ] {
            let mut out = Vec::new();
            encode(&Mutation::Tmpfile { attr }, &mut out);
            let e = decode(&out).unwrap_err();
            assert!(e.contains("tmpfile 7"), "{e}");
        }
    }
}
