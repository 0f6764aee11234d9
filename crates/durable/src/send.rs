//! `memfs send` / `memfs receive`: a named snapshot of a data directory (or
//! the changes since an older snapshot) as one self-describing, checksummed
//! byte stream, and rebuilding it in another data directory, like
//! `zfs send | zfs recv`. The stream format is in `docs/snapshots.md`.
//!
//! - A *full* stream carries the snapshot's tree as a checkpoint image
//!   (the `MFSIMG01` format of `docs/durability.md`), cut into frames.
//! - An *incremental* stream (`--from BASE`) carries the journal records of
//!   the commits after BASE up to the snapshot: physical records, keyed by
//!   inode number. A full receive keeps the sender's inode numbers and commit
//!   ids (the image is loaded as it is, at the sender's commit), so the
//!   receiver's BASE is the same tree under the same numbers and the records
//!   apply as they did on the sender; the receiver's journal continues with
//!   the same commit ids, so chains of incrementals work.
//!
//! Both sides check a [`TreeSum`] (CRC32C over a canonical listing of the
//! tree: attributes but access times, names, symlink targets, xattrs, data):
//! the receiver's BASE must match the sender's before anything is applied,
//! and the rebuilt tree must match the sender's snapshot before anything is
//! committed. Every frame carries a CRC32C and the trailer a CRC32C of the
//! whole stream, so a truncated or damaged stream is refused.
//!
//! A tree already in memory (a volume read into an [`Fs`] by
//! `memfs_cluster::transfer`) goes out through [`send_tree`], as a full
//! stream of the same format, and [`receive_tree`] reads a full stream back
//! into a new [`Fs`], handed over only once every check passed: the caller
//! (a volume) is changed only then.
//!
//! Receive validates everything first; only then does it change the
//! receiving directory, in one crash-safe step:
//! - full: the stream's image is written as it arrives, as the new
//!   checkpoint, into an unnamed `O_TMPFILE` beside the target, and parsed
//!   meanwhile (the tree is built, from that file, only when the trailer
//!   carries a TreeSum to compare); then a new data directory is made beside
//!   the target (the checkpoint linked into it, `HISTORY`, `MANIFEST`) and
//!   renamed over it (a new or empty directory) in one `rename(2)`;
//! - incremental: the records are applied to BASE rebuilt in memory; then
//!   a rollback intent to BASE is published in the manifest
//!   (the same intent `memfs rollback` uses), the records are appended to
//!   the journal, the snapshot is named, then the intent is cleared. A crash
//!   before the clear leaves the intent, which the next open (or receive)
//!   finishes: the directory is back at BASE.

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use memfs_fs::{FIRST_ENTRY_OFFSET, FileType, Fs, NodeView, ROOT_INO};
use memfs_journal::checkpoint::checkpoint_file_name;
use memfs_journal::{
    CheckpointReader, CheckpointRef, DataDir, Durability, Journal, JournalOptions, Manifest,
};

use crate::codec::kind_code;
use crate::error::{Error, Result};
use crate::history_file::{CheckpointEntry, History, SnapshotEntry, check_snapshot_name};
use crate::image::{self, ImageInfo};
use crate::reach::reach;
use crate::rebuild::{materialize, materialize_config};
use crate::rollback::{ROLLBACK_PREFIX, finish_rollback};

/// The first 8 bytes of every stream.
pub const STREAM_MAGIC: &[u8; 8] = b"MFSSEND\0";
/// The format this build writes and reads.
pub const STREAM_VERSION: u32 = 1;

const F_HEADER: u8 = 1;
const F_DATA: u8 = 2;
const F_TRAILER: u8 = 3;
/// Largest frame payload: bounds the memory of both sides.
const MAX_FRAME: usize = 1 << 20;
const FRAME_HEADER: usize = 9;

const KIND_FULL: u8 = 1;
const KIND_INCREMENTAL: u8 = 2;

/// A journal record in a stream may not exceed the journal's own limit.
const MAX_RECORD: usize = memfs_journal::format::MAX_PAYLOAD;

fn invalid(msg: impl Into<String>) -> Error {
    Error::Invalid(msg.into())
}

fn io_error(what: &str, e: io::Error) -> Error {
    invalid(format!("{what}: {e}"))
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The content identity of a tree: a CRC32C over a canonical listing (nodes
/// by inode number; per node its attributes except the access time, its
/// sorted directory entries, symlink target, sorted xattrs and file data),
/// with the number of nodes and data bytes. It detects accidental
/// mismatches (another tree under the same snapshot name, a bug in the
/// rebuild), not deliberate forgeries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeSum {
    pub crc: u32,
    pub nodes: u64,
    pub bytes: u64,
}

impl std::fmt::Display for TreeSum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} nodes, {} data bytes, crc32c {:08x}",
            self.nodes, self.bytes, self.crc
        )
    }
}

impl TreeSum {
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.crc.to_le_bytes());
        out.extend_from_slice(&self.nodes.to_le_bytes());
        out.extend_from_slice(&self.bytes.to_le_bytes());
    }

    fn get(c: &mut Cur<'_>) -> Result<TreeSum> {
        Ok(TreeSum {
            crc: c.u32()?,
            nodes: c.u64()?,
            bytes: c.u64()?,
        })
    }
}

/// Computes the [`TreeSum`] of a tree nobody changes meanwhile.
pub fn tree_sum(fs: &Fs) -> TreeSum {
    const CHUNK: usize = 256 << 10;
    let mut nodes = fs.nodes();
    nodes.sort_by_key(|n| n.ino());
    let mut sum = TreeSum::default();
    let mut crc = 0u32;
    let mut buf = Vec::new();
    let mut data = vec![0u8; CHUNK];
    for node in nodes {
        buf.clear();
        let size = node.read(|v| {
            if v.nlink() == 0 && node.ino() != ROOT_INO {
                return None;
            }
            list_node(v, &mut buf);
            let a = v.attr();
            Some((a.kind == FileType::RegularFile).then_some(a.size))
        });
        let Some(size) = size else { continue };
        crc = crc32c::crc32c_append(crc, &buf);
        sum.nodes += 1;
        if let Some(size) = size {
            let mut off = 0u64;
            while off < size {
                let n = CHUNK.min((size - off) as usize);
                node.read(|v| v.read_data(off, &mut data[..n]));
                crc = crc32c::crc32c_append(crc, &data[..n]);
                off += n as u64;
            }
            sum.bytes += size;
        }
    }
    sum.crc = crc;
    sum
}

/// Appends a node's canonical listing (all but its file data) to `buf`.
fn list_node(v: &NodeView<'_>, buf: &mut Vec<u8>) {
    let a = v.attr();
    buf.extend_from_slice(&a.ino.to_le_bytes());
    buf.push(kind_code(a.kind));
    buf.extend_from_slice(&a.perm.to_le_bytes());
    buf.extend_from_slice(&a.nlink.to_le_bytes());
    buf.extend_from_slice(&a.uid.to_le_bytes());
    buf.extend_from_slice(&a.gid.to_le_bytes());
    buf.extend_from_slice(&a.rdev.to_le_bytes());
    buf.extend_from_slice(&a.size.to_le_bytes());
    for t in [a.mtime, a.ctime] {
        buf.extend_from_slice(&t.sec.to_le_bytes());
        buf.extend_from_slice(&t.nsec.to_le_bytes());
    }
    let target = v.symlink_target().unwrap_or(b"");
    buf.extend_from_slice(&(target.len() as u64).to_le_bytes());
    buf.extend_from_slice(target);
    let mut xs: Vec<(&[u8], &[u8])> = v.xattrs().collect();
    xs.sort();
    buf.extend_from_slice(&(xs.len() as u64).to_le_bytes());
    for (k, val) in xs {
        buf.extend_from_slice(&(k.len() as u64).to_le_bytes());
        buf.extend_from_slice(k);
        buf.extend_from_slice(&(val.len() as u64).to_le_bytes());
        buf.extend_from_slice(val);
    }
    let mut entries = Vec::new();
    v.entries_from(FIRST_ENTRY_OFFSET, |name, ino, kind, _| {
        entries.push((name.to_vec(), ino, kind_code(kind)));
        true
    });
    entries.sort();
    buf.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for (name, ino, k) in entries {
        buf.extend_from_slice(&(name.len() as u64).to_le_bytes());
        buf.extend_from_slice(&name);
        buf.extend_from_slice(&ino.to_le_bytes());
        buf.push(k);
    }
}

/// What a stream's header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamHeader {
    /// The snapshot this stream rebuilds.
    pub name: String,
    /// Its commit on the sender.
    pub commit: u64,
    /// For an incremental stream: the snapshot it applies to, its commit and
    /// content identity.
    pub base: Option<(String, u64, TreeSum)>,
    /// When the stream was written (ns since the epoch).
    pub time_ns: u64,
    /// The sending data directory (informational).
    pub source: String,
}

impl StreamHeader {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.push(if self.base.is_some() {
            KIND_INCREMENTAL
        } else {
            KIND_FULL
        });
        put16(&mut out, self.name.as_bytes());
        out.extend_from_slice(&self.commit.to_le_bytes());
        let (bn, bc, bs) = self
            .base
            .clone()
            .unwrap_or((String::new(), 0, TreeSum::default()));
        put16(&mut out, bn.as_bytes());
        out.extend_from_slice(&bc.to_le_bytes());
        bs.put(&mut out);
        out.extend_from_slice(&self.time_ns.to_le_bytes());
        put16(&mut out, self.source.as_bytes());
        out
    }

    fn decode(p: &[u8]) -> Result<StreamHeader> {
        let mut c = Cur {
            b: p,
            what: "header",
        };
        let kind = c.u8()?;
        if kind != KIND_FULL && kind != KIND_INCREMENTAL {
            return Err(invalid(format!(
                "stream header: unknown stream kind {kind}"
            )));
        }
        let name = c.str16()?;
        let commit = c.u64()?;
        let bn = c.str16()?;
        let bc = c.u64()?;
        let bs = TreeSum::get(&mut c)?;
        let time_ns = c.u64()?;
        let source = c.str16()?;
        c.end()?;
        check_snapshot_name(&name).map_err(|e| invalid(format!("stream header: {e}")))?;
        let base = if kind == KIND_INCREMENTAL {
            check_snapshot_name(&bn).map_err(|e| invalid(format!("stream header: {e}")))?;
            if bc > commit {
                return Err(invalid(format!(
                    "stream header: base commit {bc} is after the snapshot's commit {commit}"
                )));
            }
            Some((bn, bc, bs))
        } else {
            None
        };
        Ok(StreamHeader {
            name,
            commit,
            base,
            time_ns,
            source,
        })
    }
}

fn put16(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
    out.extend_from_slice(b);
}

/// Little-endian reader of a header or trailer payload.
struct Cur<'a> {
    b: &'a [u8],
    what: &'static str,
}

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.b.len() < n {
            return Err(invalid(format!("stream {} is too short", self.what)));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn str16(&mut self) -> Result<String> {
        let n = self.u16()? as usize;
        let b = self.take(n)?;
        String::from_utf8(b.to_vec())
            .map_err(|_| invalid(format!("stream {}: a name is not UTF-8", self.what)))
    }
    fn end(&self) -> Result<()> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(invalid(format!("stream {} has trailing bytes", self.what)))
        }
    }
}

/// The stream's end: totals and a checksum over everything before it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Trailer {
    data_frames: u64,
    data_bytes: u64,
    records: u64,
    tree: TreeSum,
    stream_crc: u32,
}

impl Trailer {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(48);
        out.extend_from_slice(&self.data_frames.to_le_bytes());
        out.extend_from_slice(&self.data_bytes.to_le_bytes());
        out.extend_from_slice(&self.records.to_le_bytes());
        self.tree.put(&mut out);
        out.extend_from_slice(&self.stream_crc.to_le_bytes());
        out
    }

    fn decode(p: &[u8]) -> Result<Trailer> {
        let mut c = Cur {
            b: p,
            what: "trailer",
        };
        let t = Trailer {
            data_frames: c.u64()?,
            data_bytes: c.u64()?,
            records: c.u64()?,
            tree: TreeSum::get(&mut c)?,
            stream_crc: c.u32()?,
        };
        c.end()?;
        Ok(t)
    }
}

/// Frame checksum: CRC32C over the type, the length and the payload, from
/// the payload's own CRC32C (`payload_crc`), which a reader computes once
/// and reuses for the stream checksum and a received checkpoint's chunk.
fn frame_crc(kind: u8, len: usize, payload_crc: u32) -> u32 {
    let mut h = [0u8; 5];
    h[0] = kind;
    h[1..5].copy_from_slice(&(len as u32).to_le_bytes());
    crc32c::crc32c_combine(crc32c::crc32c(&h), payload_crc, len)
}

/// Writes the stream: data written to it is cut into data frames.
struct FrameWriter<'a> {
    out: &'a mut dyn Write,
    buf: Vec<u8>,
    stream_crc: u32,
    data_frames: u64,
    data_bytes: u64,
}

impl<'a> FrameWriter<'a> {
    fn new(out: &'a mut dyn Write, header: &StreamHeader) -> io::Result<Self> {
        let mut w = FrameWriter {
            out,
            buf: Vec::with_capacity(MAX_FRAME),
            stream_crc: 0,
            data_frames: 0,
            data_bytes: 0,
        };
        let mut pre = Vec::with_capacity(12);
        pre.extend_from_slice(STREAM_MAGIC);
        pre.extend_from_slice(&STREAM_VERSION.to_le_bytes());
        w.raw(&pre)?;
        w.frame(F_HEADER, &header.encode())?;
        Ok(w)
    }

    fn raw(&mut self, b: &[u8]) -> io::Result<()> {
        self.stream_crc = crc32c::crc32c_append(self.stream_crc, b);
        self.out.write_all(b)
    }

    fn frame(&mut self, kind: u8, payload: &[u8]) -> io::Result<()> {
        let mut h = [0u8; FRAME_HEADER];
        h[0] = kind;
        h[1..5].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        let crc = frame_crc(kind, payload.len(), crc32c::crc32c(payload));
        h[5..9].copy_from_slice(&crc.to_le_bytes());
        self.raw(&h)?;
        self.raw(payload)
    }

    fn flush_data(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let buf = std::mem::take(&mut self.buf);
        self.frame(F_DATA, &buf)?;
        self.data_frames += 1;
        self.data_bytes += buf.len() as u64;
        self.buf = buf;
        self.buf.clear();
        Ok(())
    }

    fn finish(mut self, records: u64, tree: TreeSum) -> io::Result<u64> {
        self.flush_data()?;
        let t = Trailer {
            data_frames: self.data_frames,
            data_bytes: self.data_bytes,
            records,
            tree,
            stream_crc: self.stream_crc,
        };
        self.frame(F_TRAILER, &t.encode())?;
        self.out.flush()?;
        Ok(self.data_bytes)
    }
}

impl Write for FrameWriter<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        let n = b.len().min(MAX_FRAME - self.buf.len());
        self.buf.extend_from_slice(&b[..n]);
        if self.buf.len() == MAX_FRAME {
            self.flush_data()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn bad_data(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Reads the stream: yields the data frames' payloads as one byte stream,
/// checking each frame's checksum, and ends (returns 0) at the trailer,
/// whose totals and stream checksum it checks.
struct FrameReader<'a> {
    inp: &'a mut dyn Read,
    buf: Vec<u8>,
    pos: usize,
    offset: u64,
    stream_crc: u32,
    data_frames: u64,
    data_bytes: u64,
    trailer: Option<Trailer>,
    /// A full receive's checkpoint, written from the data frames as they
    /// are read (each frame becomes one chunk of it).
    sink: Option<CheckpointSink>,
}

impl<'a> FrameReader<'a> {
    /// Reads and checks the preamble and the header frame.
    fn open(inp: &'a mut dyn Read) -> Result<(Self, StreamHeader)> {
        let mut r = FrameReader {
            inp,
            buf: Vec::new(),
            pos: 0,
            offset: 0,
            stream_crc: 0,
            data_frames: 0,
            data_bytes: 0,
            trailer: None,
            sink: None,
        };
        let mut pre = [0u8; 12];
        r.exact(&mut pre)
            .map_err(|e| io_error("reading the stream's first bytes", e))?;
        if &pre[..8] != STREAM_MAGIC {
            return Err(invalid(
                "not a memfs send stream (bad magic): give receive the output of memfs send",
            ));
        }
        let version = u32::from_le_bytes(pre[8..12].try_into().expect("4"));
        if version != STREAM_VERSION {
            return Err(invalid(format!(
                "stream format version {version}, but this memfs reads version {STREAM_VERSION} only"
            )));
        }
        let (kind, payload, _) = r
            .next_frame()
            .map_err(|e| io_error("reading the stream header", e))?;
        if kind != F_HEADER {
            return Err(invalid(format!(
                "stream damaged: frame type {kind} where the header was expected"
            )));
        }
        let h = StreamHeader::decode(&payload)?;
        Ok((r, h))
    }

    fn exact(&mut self, b: &mut [u8]) -> io::Result<()> {
        self.exact_unsummed(b)?;
        self.stream_crc = crc32c::crc32c_append(self.stream_crc, b);
        Ok(())
    }

    /// [`FrameReader::exact`] without the stream checksum: the caller adds
    /// the bytes' CRC32C itself (computed once for every use).
    fn exact_unsummed(&mut self, b: &mut [u8]) -> io::Result<()> {
        self.inp.read_exact(b).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                bad_data(format!(
                    "stream truncated or damaged: it ends within {} bytes after offset {} (no trailer)",
                    b.len(),
                    self.offset
                ))
            } else {
                e
            }
        })?;
        self.offset += b.len() as u64;
        Ok(())
    }

    /// The next frame, its checksum checked, and the CRC32C of its payload.
    /// The payload is summed once: the frame's checksum and the stream's
    /// are derived from that sum (`crc32c_combine`), and a full receive
    /// reuses it for the checkpoint chunk.
    fn next_frame(&mut self) -> io::Result<(u8, Vec<u8>, u32)> {
        let at = self.offset;
        let crc_before = self.stream_crc;
        let mut h = [0u8; FRAME_HEADER];
        self.exact(&mut h)?;
        let kind = h[0];
        let len = u32::from_le_bytes(h[1..5].try_into().expect("4")) as usize;
        let crc = u32::from_le_bytes(h[5..9].try_into().expect("4"));
        if len > MAX_FRAME {
            return Err(bad_data(format!(
                "stream damaged: frame at offset {at} claims {len} bytes (at most {MAX_FRAME})"
            )));
        }
        let mut payload = std::mem::take(&mut self.buf);
        payload.resize(len, 0);
        self.exact_unsummed(&mut payload)?;
        let sum = crc32c::crc32c(&payload);
        if frame_crc(kind, len, sum) != crc {
            return Err(bad_data(format!(
                "stream damaged: checksum mismatch in the frame at offset {at}"
            )));
        }
        self.stream_crc = if kind == F_TRAILER {
            // The trailer's own bytes are not part of the stream checksum.
            crc_before
        } else {
            crc32c::crc32c_combine(self.stream_crc, sum, len)
        };
        Ok((kind, payload, sum))
    }

    fn read_trailer(&mut self, payload: &[u8]) -> io::Result<()> {
        let t = Trailer::decode(payload).map_err(|e| bad_data(e.to_string()))?;
        if t.stream_crc != self.stream_crc {
            return Err(bad_data(
                "stream damaged: the checksum over the whole stream does not match its trailer"
                    .into(),
            ));
        }
        if (t.data_frames, t.data_bytes) != (self.data_frames, self.data_bytes) {
            return Err(bad_data(format!(
                "stream damaged: the trailer counts {} frames and {} bytes, the stream held {} and {}",
                t.data_frames, t.data_bytes, self.data_frames, self.data_bytes
            )));
        }
        let mut extra = [0u8; 1];
        loop {
            match self.inp.read(&mut extra) {
                Ok(0) => break,
                Ok(_) => return Err(bad_data("bytes follow the stream's trailer".into())),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.trailer = Some(t);
        Ok(())
    }

    /// The trailer, once the data has been read to its end.
    fn finish(&mut self) -> Result<Trailer> {
        if self.trailer.is_none() {
            let mut b = [0u8; 1];
            let n = self
                .read(&mut b)
                .map_err(|e| io_error("reading the stream", e))?;
            if n != 0 {
                return Err(invalid(
                    "stream damaged: data follows the end of its contents",
                ));
            }
        }
        Ok(self.trailer.expect("set by read at the end"))
    }
}

impl Read for FrameReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.buf.len() {
            if self.trailer.is_some() {
                return Ok(0);
            }
            let (kind, payload, sum) = self.next_frame()?;
            match kind {
                F_DATA => {
                    if let Some(sink) = &mut self.sink {
                        sink.chunk(&payload, sum)?;
                    }
                    self.data_frames += 1;
                    self.data_bytes += payload.len() as u64;
                    self.buf = payload;
                    self.pos = 0;
                }
                F_TRAILER => {
                    self.read_trailer(&payload)?;
                    self.buf = payload;
                    self.buf.clear();
                    self.pos = 0;
                }
                k => {
                    return Err(bad_data(format!(
                        "stream damaged: unexpected frame type {k}"
                    )));
                }
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// What [`send`] wrote.
#[derive(Debug, Clone)]
pub struct SendReport {
    pub header: StreamHeader,
    /// Data bytes (frame payloads) written.
    pub bytes: u64,
    /// Journal records (incremental streams).
    pub records: u64,
    pub tree: TreeSum,
}

/// Locks a data directory that must not be in use, saying so clearly if a
/// running memfs holds it.
fn lock_unmounted(dir: &Path, what: &str) -> Result<DataDir> {
    match DataDir::open(dir, false) {
        Err(memfs_journal::Error::Locked { .. }) => Err(invalid(format!(
            "{} is in use by a running memfs (mounted?): {what} works on unmounted data directories; unmount it first",
            dir.display()
        ))),
        r => Ok(r?),
    }
}

fn find_snapshot(h: &History, dir: &Path, name: &str) -> Result<SnapshotEntry> {
    h.snapshots
        .iter()
        .find(|s| s.name == name)
        .cloned()
        .ok_or_else(|| {
            invalid(format!(
                "no snapshot named {name:?} in {} (memfs snapshot list shows them)",
                dir.display()
            ))
        })
}

/// Writes snapshot `name` of the unmounted data directory `dir` to `out`:
/// the whole tree, or with `from` only the commits since that older
/// snapshot. The tree is rebuilt in memory (as `memfs diff` does) and
/// streamed from there file by file; the stream itself is never held whole.
pub fn send(dir: &Path, name: &str, from: Option<&str>, out: &mut dyn Write) -> Result<SendReport> {
    let _lock = lock_unmounted(dir, "send")?;
    // A rollback a crash interrupted is finished first, as any open does.
    finish_rollback(dir)?;
    let h = History::load(dir)?;
    let snap = find_snapshot(&h, dir, name)?;
    let source = std::fs::canonicalize(dir)
        .unwrap_or_else(|_| dir.to_path_buf())
        .to_string_lossy()
        .into_owned();
    match from {
        None => {
            let header = StreamHeader {
                name: name.into(),
                commit: snap.commit,
                base: None,
                time_ns: now_ns(),
                source,
            };
            // A checkpoint begun and finished at the snapshot's commit
            // (nothing committed during its copy: an unmount's, or one taken
            // on an idle directory) is the snapshot's exact tree as an image:
            // it is streamed as it is, without rebuilding the tree in memory.
            if h.checkpoints
                .iter()
                .any(|c| c.commit == snap.commit && c.required_end == snap.commit)
            {
                return send_checkpoint(dir, header, out);
            }
            send_rebuilt(dir, header, out)
        }
        Some(base_name) => {
            let base = find_snapshot(&h, dir, base_name)?;
            if base.commit > snap.commit {
                return Err(invalid(format!(
                    "snapshot {base_name:?} (commit {}) is newer than {name:?} (commit {}): --from names the older one",
                    base.commit, snap.commit
                )));
            }
            send_incremental(
                dir,
                name,
                snap.commit,
                (base_name, base.commit),
                source,
                out,
            )
        }
    }
}

fn write_err(e: io::Error) -> Error {
    io_error("writing the stream", e)
}

/// A full stream of the checkpoint at the snapshot's commit, copied as it
/// is. Its chunks' CRC32Cs are checked as it is read.
fn send_checkpoint(dir: &Path, header: StreamHeader, out: &mut dyn Write) -> Result<SendReport> {
    let path = dir.join(checkpoint_file_name(header.commit));
    let mut img = CheckpointReader::open(&path)?;
    let mut w = FrameWriter::new(out, &header).map_err(write_err)?;
    io::copy(&mut img, &mut w).map_err(|e| io_error(&format!("copying {}", path.display()), e))?;
    // No TreeSum: the receiver checks the stream's CRC32Cs and
    // the image's own structure and counts.
    let bytes = w.finish(0, TreeSum::default()).map_err(write_err)?;
    Ok(SendReport {
        header,
        bytes,
        records: 0,
        tree: TreeSum::default(),
    })
}

/// A full stream of the snapshot's tree rebuilt in memory, written as an
/// image.
fn send_rebuilt(dir: &Path, header: StreamHeader, out: &mut dyn Write) -> Result<SendReport> {
    let fs = materialize(dir, header.commit, materialize_config())?;
    write_tree(&fs, header, out)
}

/// A full stream of `fs` (a tree nobody changes meanwhile) as an image at
/// the header's commit, with the tree's [`TreeSum`] in the trailer.
fn write_tree(fs: &Fs, header: StreamHeader, out: &mut dyn Write) -> Result<SendReport> {
    let commit = header.commit;
    let tree = tree_sum(fs);
    let mut w = FrameWriter::new(out, &header).map_err(write_err)?;
    let (nodes, pages) = image::write_nodes(fs, commit, &mut w).map_err(write_err)?;
    let info = ImageInfo {
        commit,
        required_end: commit,
        nodes,
        pages,
    };
    image::write_trailer(&mut w, &info).map_err(write_err)?;
    let bytes = w.finish(0, tree).map_err(write_err)?;
    Ok(SendReport {
        header,
        bytes,
        records: 0,
        tree,
    })
}

/// An incremental stream: the journal records after the base snapshot up
/// to the snapshot (at `commit`), applied meanwhile to the base rebuilt in
/// memory for the TreeSums of both.
fn send_incremental(
    dir: &Path,
    name: &str,
    commit: u64,
    (base_name, base_commit): (&str, u64),
    source: String,
    out: &mut dyn Write,
) -> Result<SendReport> {
    let fs = materialize(dir, base_commit, materialize_config())?;
    let base_sum = tree_sum(&fs);
    let header = StreamHeader {
        name: name.into(),
        commit,
        base: Some((base_name.into(), base_commit, base_sum)),
        time_ns: now_ns(),
        source,
    };
    let mut w = FrameWriter::new(out, &header).map_err(write_err)?;
    let records = send_records(dir, &fs, base_commit, commit, &mut w)?;
    fs.finish_rebuild(commit);
    let tree = tree_sum(&fs);
    let bytes = w.finish(records, tree).map_err(write_err)?;
    Ok(SendReport {
        header,
        bytes,
        records,
        tree,
    })
}

/// Writes the journal's records of the commits after `base_commit` up to
/// `commit` to `w`, each applied to `fs`; returns how many.
fn send_records(
    dir: &Path,
    fs: &Fs,
    base_commit: u64,
    commit: u64,
    w: &mut FrameWriter<'_>,
) -> Result<u64> {
    let mut records = 0u64;
    let mut failure: Option<Error> = None;
    let mut expected = base_commit + 1;
    memfs_journal::recovery::replay_readonly(dir, base_commit, &mut |id, p| {
        if id > commit {
            return Ok(());
        }
        let r = (|| -> Result<()> {
            if id != expected {
                return Err(invalid(format!(
                    "the journal has commit {id} where {expected} was expected"
                )));
            }
            let m = crate::codec::decode(p).map_err(|e| invalid(format!("commit {id}: {e}")))?;
            fs.apply(&m);
            w.write_all(&id.to_le_bytes()).map_err(write_err)?;
            w.write_all(&(p.len() as u32).to_le_bytes())
                .map_err(write_err)?;
            w.write_all(p).map_err(write_err)?;
            Ok(())
        })();
        match r {
            Ok(()) => {
                records += 1;
                expected += 1;
                Ok(())
            }
            Err(e) => {
                let s = e.to_string();
                failure = Some(e);
                Err(s)
            }
        }
    })
    .map_err(|e| failure.take().unwrap_or(e.into()))?;
    if expected != commit + 1 {
        return Err(invalid(format!(
            "the journal of {} stops at commit {}, before the snapshot's commit {}",
            dir.display(),
            expected - 1,
            commit
        )));
    }
    Ok(records)
}

/// What [`receive`] did.
#[derive(Debug, Clone)]
pub struct ReceiveReport {
    pub header: StreamHeader,
    pub bytes: u64,
    pub records: u64,
    /// The rebuilt tree's identity; `None` when the stream's trailer had
    /// none to compare with (a full stream copied from a checkpoint), so
    /// it was not computed.
    pub tree: Option<TreeSum>,
}

/// Test hooks of [`receive`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ReceiveOptions {
    /// Called just before the commit step: for an incremental receive in
    /// its middle (intent published, records appended, snapshot named,
    /// intent not cleared yet); for a full receive once the checkpoint is
    /// written, checked and synced but still unnamed, before the staging
    /// directory exists. Crash tests stop the process there.
    pub before_commit_point: Option<fn()>,
}

/// Rebuilds a stream written by [`send`] in the unmounted data directory
/// `dir`. Refuses, changing nothing, a stream that is truncated, damaged,
/// of another format version, or incremental from a snapshot that is not
/// `dir`'s latest (with nothing changed since).
pub fn receive(dir: &Path, input: &mut dyn Read, opts: ReceiveOptions) -> Result<ReceiveReport> {
    let (mut r, header) = FrameReader::open(input)?;
    match header.base.clone() {
        None => receive_full(dir, &mut r, header, opts),
        Some(base) => receive_incremental(dir, &mut r, header, base, opts),
    }
}

fn stream_err(e: impl std::fmt::Display) -> Error {
    invalid(format!("refused the stream: {e}"))
}

/// Compares the rebuilt tree with the sender's; a full stream sent straight
/// from a checkpoint carries no TreeSum (0 nodes: a real tree has its root).
fn check_tree(built: TreeSum, trailer: &Trailer) -> Result<()> {
    if trailer.tree.nodes != 0 && built != trailer.tree {
        return Err(invalid(format!(
            "refused the stream: the rebuilt tree ({built}) differs from the sender's ({})",
            trailer.tree
        )));
    }
    Ok(())
}

/// Whether `dir` is a directory with nothing in it.
fn is_empty_dir(dir: &Path) -> Result<bool> {
    let mut it = std::fs::read_dir(dir).map_err(|e| io_error(&dir.display().to_string(), e))?;
    Ok(it.next().is_none())
}

/// Removes a staging directory unless the receive got to rename it.
struct Staging(Option<PathBuf>);

impl Drop for Staging {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

fn receive_full(
    dir: &Path,
    r: &mut FrameReader<'_>,
    header: StreamHeader,
    opts: ReceiveOptions,
) -> Result<ReceiveReport> {
    let (parent, file_name) = full_target(dir)?;
    let commit = header.commit;
    let (mut sink, tree) = receive_checkpoint(r, &parent, &file_name, commit)?;
    if let Some(hook) = opts.before_commit_point {
        hook();
    }
    install_received(dir, &parent, &file_name, &mut sink, &header.name, commit)?;
    Ok(ReceiveReport {
        header,
        bytes: r.data_bytes,
        records: 0,
        tree,
    })
}

/// The directory a full stream is received into, as its parent (made if
/// need be) and its name. Refuses early, before reading the stream, what
/// cannot work.
fn full_target(dir: &Path) -> Result<(PathBuf, String)> {
    if dir.exists() {
        if !dir.is_dir() {
            return Err(invalid(format!("{} is not a directory", dir.display())));
        }
        if !is_empty_dir(dir)? {
            drop(lock_unmounted(dir, "receive")?);
            return Err(invalid(format!(
                "{} is not empty: a full stream is received into a new or empty data directory (an incremental one, memfs send --from BASE, applies to a directory holding BASE)",
                dir.display()
            )));
        }
    }
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = dir
        .file_name()
        .ok_or_else(|| invalid(format!("{} names no directory", dir.display())))?
        .to_string_lossy()
        .into_owned();
    std::fs::create_dir_all(&parent).map_err(|e| io_error(&parent.display().to_string(), e))?;
    Ok((parent, file_name))
}

/// Reads a full stream to its end into a new checkpoint at `commit` beside
/// the target, checked and synced but still unnamed; with the rebuilt
/// tree's identity when the stream carries one to compare with.
fn receive_checkpoint(
    r: &mut FrameReader<'_>,
    parent: &Path,
    file_name: &str,
    commit: u64,
) -> Result<(CheckpointSink, Option<TreeSum>)> {
    // The image is the new checkpoint: its bytes go to an unnamed file on
    // D2's file system as they arrive, parsed meanwhile by the checks the
    // image loader makes (every record, without building the tree: zeroing
    // and filling 1 GiB of fresh pages was 63 % of a receive's time).
    r.sink = Some(CheckpointSink::create(parent, file_name, commit)?);
    let checked = image::validate_image(r);
    let sink_failed = r.sink.as_mut().and_then(|k| k.failed.take());
    if let Some(e) = sink_failed {
        return Err(io_error("writing the received checkpoint", e));
    }
    let info = checked.map_err(stream_err)?;
    let trailer = r.finish()?;
    let mut sink = r.sink.take().expect("set above");
    if info.commit != commit || info.required_end != commit {
        return Err(invalid(format!(
            "refused the stream: its image is at commit {} but its header says {commit}",
            info.commit
        )));
    }
    sink.finish()
        .map_err(|e| io_error("writing the received checkpoint", e))?;
    // A stream copied from a checkpoint carries no TreeSum: nothing to
    // compare, so the tree is never built. A stream the sender rebuilt
    // carries one: the tree is loaded from the checkpoint just written (a
    // second pass, from the page cache) and compared.
    let tree = if trailer.tree.nodes != 0 {
        let fs = sink
            .load(commit)
            .map_err(|e| invalid(format!("refused the stream: {e}")))?;
        let tree = tree_sum(&fs);
        check_tree(tree, &trailer)?;
        Some(tree)
    } else {
        None
    };
    Ok((sink, tree))
}

/// Everything checked: makes the new directory aside (the checkpoint
/// linked into it, snapshot `name` at `commit`), then renames it into place
/// at `dir` in one step.
fn install_received(
    dir: &Path,
    parent: &Path,
    file_name: &str,
    sink: &mut CheckpointSink,
    name: &str,
    commit: u64,
) -> Result<()> {
    let staging_path = parent.join(format!(".{file_name}.receive-{}", std::process::id()));
    if staging_path.exists() {
        std::fs::remove_dir_all(&staging_path)
            .map_err(|e| io_error(&staging_path.display().to_string(), e))?;
    }
    let mut staging = Staging(Some(staging_path.clone()));
    let lock = DataDir::open(&staging_path, true)?;
    let checkpoint = staging_path.join(checkpoint_file_name(commit));
    sink.link(&checkpoint)
        .map_err(|e| io_error(&checkpoint.display().to_string(), e))?;
    let t = now_ns();
    History {
        checkpoints: vec![CheckpointEntry {
            commit,
            required_end: commit,
            time_ns: t,
        }],
        snapshots: vec![SnapshotEntry {
            name: name.to_owned(),
            commit,
            time_ns: t,
        }],
    }
    .save(&staging_path)?;
    let mut m = Manifest {
        checkpoint: Some(CheckpointRef {
            commit,
            required_end: commit,
        }),
        ..Default::default()
    };
    m.publish(&staging_path)?;
    lock.sync()?;
    // rename(2) replaces an empty directory and fails on a non-empty one, so
    // a directory filled meanwhile is never overwritten.
    std::fs::rename(&staging_path, dir).map_err(|e| {
        io_error(
            &format!(
                "moving the received directory {} to {}",
                staging_path.display(),
                dir.display()
            ),
            e,
        )
    })?;
    staging.0 = None;
    File::open(parent)
        .and_then(|f| f.sync_all())
        .map_err(|e| io_error(&parent.display().to_string(), e))?;
    drop(lock);
    Ok(())
}

/// How much a full receive writes before it asks the kernel to start
/// writing it back (`sync_file_range`), so that the final fsync finds most
/// of the checkpoint on disk already instead of starting from 1 GiB dirty.
const WRITE_BEHIND: u64 = 16 << 20;

/// The checkpoint of a full receive, written chunk by chunk from the
/// stream's data frames into a file nobody can see: an `O_TMPFILE` in the
/// directory that will hold D2 (so on its file system), linked under its
/// name only after every check passed. A refused stream, an error or a
/// SIGKILL leaves nothing behind. On a file system without `O_TMPFILE` it
/// is a named file beside D2, removed on every error path.
struct CheckpointSink {
    file: File,
    /// The fallback's name (`None`: an unnamed `O_TMPFILE`).
    named: Option<PathBuf>,
    /// Payload bytes in chunks so far.
    total: u64,
    /// File bytes written, and how far write-back was started.
    written: u64,
    started: u64,
    /// A write error, kept so that it is reported as one (the image loader
    /// reading through the frames would call it a damaged stream).
    failed: Option<io::Error>,
}

impl CheckpointSink {
    fn create(parent: &Path, file_name: &str, commit: u64) -> Result<CheckpointSink> {
        use std::os::unix::fs::OpenOptionsExt;
        let tmp = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .mode(0o644)
            .open(parent);
        let (mut file, named) = match tmp {
            Ok(f) => (f, None),
            Err(_) => {
                let p = parent.join(format!(
                    ".{file_name}.receive-{}.checkpoint",
                    std::process::id()
                ));
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o644)
                    .open(&p)
                    .map_err(|e| io_error(&p.display().to_string(), e))?;
                (f, Some(p))
            }
        };
        let head = memfs_journal::checkpoint::checkpoint_header(commit);
        file.write_all(&head)
            .map_err(|e| io_error("writing the received checkpoint", e))?;
        Ok(CheckpointSink {
            file,
            named,
            total: 0,
            written: head.len() as u64,
            started: 0,
            failed: None,
        })
    }

    /// Appends one data frame as one chunk (`sum` is its CRC32C).
    fn chunk(&mut self, payload: &[u8], sum: u32) -> io::Result<()> {
        if payload.is_empty() {
            // A zero-length chunk is the end marker: nothing to write.
            return Ok(());
        }
        let r = self.write_chunk(payload, sum);
        r.map_err(|e| {
            let msg = format!("writing the received checkpoint: {e}");
            self.failed = Some(e);
            io::Error::other(msg)
        })
    }

    fn write_chunk(&mut self, payload: &[u8], sum: u32) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let head = memfs_journal::checkpoint::checkpoint_chunk_header(payload.len(), sum);
        self.file.write_all(&head)?;
        self.file.write_all(payload)?;
        self.total += payload.len() as u64;
        self.written += (head.len() + payload.len()) as u64;
        if self.written - self.started >= WRITE_BEHIND {
            // SAFETY: sync_file_range only reads its integer arguments; the
            // descriptor is ours and open. A failure is not an error here:
            // the final fsync writes (and checks) everything anyway.
            unsafe {
                libc::sync_file_range(
                    self.file.as_raw_fd(),
                    self.started as libc::off64_t,
                    (self.written - self.started) as libc::off64_t,
                    libc::SYNC_FILE_RANGE_WRITE,
                );
            }
            self.started = self.written;
        }
        Ok(())
    }

    /// The file's name through /proc (an `O_TMPFILE` has no other).
    fn proc_path(&self) -> PathBuf {
        use std::os::fd::AsRawFd;
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }

    /// Writes the end marker and makes the file durable.
    fn finish(&mut self) -> io::Result<()> {
        let end = memfs_journal::checkpoint::checkpoint_end_marker(self.total);
        self.file.write_all(&end)?;
        self.file.sync_all()
    }

    /// Loads the written (finished) checkpoint into a new tree.
    fn load(&self, commit: u64) -> std::result::Result<Fs, String> {
        let path = self.proc_path();
        let mut rd = CheckpointReader::open(&path).map_err(|e| e.to_string())?;
        let fs = Fs::new(materialize_config());
        let info = image::read_image(&fs, &mut rd)?;
        rd.finish().map_err(|e| e.to_string())?;
        if info.commit != commit {
            return Err(format!("its image loads at commit {}", info.commit));
        }
        fs.finish_rebuild(commit);
        Ok(fs)
    }

    /// Gives the file its name `to` (in a directory on the same file
    /// system). The caller syncs `to`'s directory.
    fn link(&mut self, to: &Path) -> io::Result<()> {
        use std::os::unix::ffi::{OsStrExt, OsStringExt};
        if let Some(p) = self.named.take() {
            return std::fs::rename(&p, to).inspect_err(|_| self.named = Some(p));
        }
        // linkat(2) of /proc/self/fd/N with AT_SYMLINK_FOLLOW links an
        // O_TMPFILE without privileges (AT_EMPTY_PATH needs
        // CAP_DAC_READ_SEARCH).
        let from = std::ffi::CString::new(self.proc_path().into_os_string().into_vec())
            .expect("no NUL in a number");
        let to_c = std::ffi::CString::new(to.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a path"))?;
        // SAFETY: both pointers are NUL-terminated C strings that live
        // across the call; linkat does not keep them.
        let rc = unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                from.as_ptr(),
                libc::AT_FDCWD,
                to_c.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for CheckpointSink {
    fn drop(&mut self) {
        if let Some(p) = self.named.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Reads `b.len()` bytes, or returns false at a clean end of the data.
fn read_or_end(r: &mut dyn Read, b: &mut [u8]) -> Result<bool> {
    let mut got = 0;
    while got < b.len() {
        match r.read(&mut b[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(invalid("refused the stream: it ends inside a record")),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(stream_err(e)),
        }
    }
    Ok(true)
}

/// A spool file nobody can see: created unnamed in `dir` (`O_TMPFILE`), so
/// it vanishes with the process whatever happens.
fn spool_file(dir: &Path) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .mode(0o600)
        .open(dir);
    match tmp {
        Ok(f) => Ok(f),
        Err(_) => {
            // File systems without O_TMPFILE: a named file unlinked at once.
            let p = dir.join(format!(".receive-spool-{}", std::process::id()));
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&p)
                .map_err(|e| io_error(&p.display().to_string(), e))?;
            std::fs::remove_file(&p).map_err(|e| io_error(&p.display().to_string(), e))?;
            Ok(f)
        }
    }
}

fn receive_incremental(
    dir: &Path,
    r: &mut FrameReader<'_>,
    header: StreamHeader,
    (base_name, base_commit, base_sum): (String, u64, TreeSum),
    opts: ReceiveOptions,
) -> Result<ReceiveReport> {
    if !dir.is_dir() {
        return Err(invalid(format!(
            "{} does not exist: an incremental stream (from {base_name:?}) applies to a data directory holding snapshot {base_name:?}; receive a full stream first",
            dir.display()
        )));
    }
    let lock = lock_unmounted(dir, "receive")?;
    finish_rollback(dir)?;
    let fs = base_tree(dir, &header, (&base_name, base_commit, base_sum))?;

    // Apply every record to the tree in memory (which validates them) and
    // keep them in a spool for the commit step.
    let mut payload = Vec::new();
    let (records, tree, mut spool) = apply_stream(dir, r, fs, &header, base_commit, &mut payload)?;

    // Commit: the intent makes everything below one step. Until it is
    // cleared, a crash brings the directory back to BASE at the next open.
    let mut m = Manifest::load(dir)?.unwrap_or_default();
    let after = m.checkpoint.map_or(0, |s| s.commit);
    m.user = format!("{ROLLBACK_PREFIX}{base_commit}").into_bytes();
    m.publish(dir)?;
    append_records(
        &lock,
        dir,
        (after, base_commit),
        records,
        &mut spool,
        &mut payload,
    )?;
    let mut h = History::load(dir)?;
    h.snapshots.push(SnapshotEntry {
        name: header.name.clone(),
        commit: header.commit,
        time_ns: now_ns(),
    });
    h.save(dir)?;
    if let Some(hook) = opts.before_commit_point {
        hook();
    }
    m.user.clear();
    m.publish(dir)?;
    drop(lock);
    Ok(ReceiveReport {
        header,
        bytes: r.data_bytes,
        records,
        tree: Some(tree),
    })
}

fn spool_err(e: io::Error) -> Error {
    io_error("writing the receive spool", e)
}

/// Applies an incremental stream's records to its base's tree `fs` and
/// checks the result against the sender's; returns how many records, the
/// tree's identity, and the records spooled for the commit step.
fn apply_stream(
    dir: &Path,
    r: &mut FrameReader<'_>,
    fs: Fs,
    header: &StreamHeader,
    base_commit: u64,
    payload: &mut Vec<u8>,
) -> Result<(u64, TreeSum, io::BufReader<File>)> {
    let mut spool = io::BufWriter::with_capacity(1 << 20, spool_file(dir)?);
    let records = apply_records(r, &fs, (base_commit, header.commit), &mut spool, payload)?;
    let trailer = r.finish()?;
    if base_commit + records != header.commit || trailer.records != records {
        return Err(invalid(format!(
            "refused the stream: it holds {records} commits, {} were announced",
            header.commit - base_commit
        )));
    }
    fs.finish_rebuild(header.commit);
    let tree = tree_sum(&fs);
    check_tree(tree, &trailer)?;
    drop(fs);
    let mut spool = spool.into_inner().map_err(|e| spool_err(e.into_error()))?;
    spool.rewind().map_err(spool_err)?;
    Ok((records, tree, io::BufReader::with_capacity(1 << 20, spool)))
}

/// The base snapshot of an incremental stream rebuilt in memory, once
/// `dir` is found to hold it as its latest snapshot, unchanged since, with
/// the sender's content, and without the stream's snapshot name.
fn base_tree(
    dir: &Path,
    header: &StreamHeader,
    (base_name, base_commit, base_sum): (&str, u64, TreeSum),
) -> Result<Fs> {
    let h = History::load(dir)?;
    let latest = h
        .snapshots
        .iter()
        .enumerate()
        .max_by_key(|(i, s)| (s.commit, *i))
        .map(|(_, s)| s.clone());
    match &latest {
        Some(s) if s.name == base_name && s.commit == base_commit => {}
        Some(s) => {
            return Err(invalid(format!(
                "refused the stream: it applies to snapshot {base_name:?} (commit {base_commit}), but the latest snapshot of {} is {:?} (commit {})",
                dir.display(),
                s.name,
                s.commit
            )));
        }
        None => {
            return Err(invalid(format!(
                "refused the stream: it applies to snapshot {base_name:?} (commit {base_commit}), but {} has no snapshots",
                dir.display()
            )));
        }
    }
    if h.snapshots.iter().any(|s| s.name == header.name) {
        return Err(invalid(format!(
            "refused the stream: {} already has a snapshot named {:?}",
            dir.display(),
            header.name
        )));
    }
    let last = reach(dir)?.last;
    if last != base_commit {
        return Err(invalid(format!(
            "refused the stream: {} changed since snapshot {base_name:?} (commit {base_commit}; it is at commit {last} now); memfs rollback --data-dir {} --to {base_name} first to discard those changes",
            dir.display(),
            dir.display()
        )));
    }
    let fs = materialize(dir, base_commit, materialize_config())?;
    let have = tree_sum(&fs);
    if have != base_sum {
        return Err(invalid(format!(
            "refused the stream: snapshot {base_name:?} of {} ({have}) is not the sender's {base_name:?} ({base_sum}): they are different trees",
            dir.display()
        )));
    }
    Ok(fs)
}

/// Reads the stream's records of the commits after `base_commit` up to
/// `commit`, applies each to `fs` and copies it to `spool`; returns how
/// many.
fn apply_records(
    r: &mut FrameReader<'_>,
    fs: &Fs,
    (base_commit, commit): (u64, u64),
    spool: &mut impl Write,
    payload: &mut Vec<u8>,
) -> Result<u64> {
    let mut expected = base_commit + 1;
    let mut head = [0u8; 12];
    while read_or_end(r, &mut head)? {
        let id = u64::from_le_bytes(head[..8].try_into().expect("8"));
        let len = u32::from_le_bytes(head[8..12].try_into().expect("4")) as usize;
        if id != expected || id > commit {
            return Err(invalid(format!(
                "refused the stream: record for commit {id} where {expected} was expected"
            )));
        }
        if len > MAX_RECORD {
            return Err(invalid(format!(
                "refused the stream: record of {len} bytes for commit {id}"
            )));
        }
        payload.resize(len, 0);
        if !read_or_end(r, payload)? && len > 0 {
            return Err(invalid("refused the stream: it ends inside a record"));
        }
        let m = crate::codec::decode(payload)
            .map_err(|e| invalid(format!("refused the stream: commit {id}: {e}")))?;
        fs.apply(&m);
        spool.write_all(&head).map_err(spool_err)?;
        spool.write_all(payload).map_err(spool_err)?;
        expected += 1;
    }
    Ok(expected - base_commit - 1)
}

/// Appends the `records` spooled records to the journal of `dir` (at
/// `base_commit`, its checkpoint at `after`), under the same commit ids.
fn append_records(
    lock: &DataDir,
    dir: &Path,
    (after, base_commit): (u64, u64),
    records: u64,
    spool: &mut impl Read,
    payload: &mut Vec<u8>,
) -> Result<()> {
    let jopts = JournalOptions {
        durability: Durability::None,
        ..Default::default()
    };
    let (journal, _) = Journal::open(lock, jopts, after, &mut |_, _| Ok(()))?;
    if journal.last_commit() != base_commit {
        return Err(invalid(format!(
            "{} changed while receiving: its journal is at commit {}",
            dir.display(),
            journal.last_commit()
        )));
    }
    let mut head = [0u8; 12];
    for _ in 0..records {
        spool.read_exact(&mut head).map_err(spool_err)?;
        let id = u64::from_le_bytes(head[..8].try_into().expect("8"));
        let len = u32::from_le_bytes(head[8..12].try_into().expect("4")) as usize;
        payload.resize(len, 0);
        spool.read_exact(payload).map_err(spool_err)?;
        let got = journal.commit(payload)?;
        if got != id {
            return Err(invalid(format!(
                "journal gave commit {got} to the stream's commit {id}"
            )));
        }
    }
    journal.sync()?;
    journal.close()?;
    Ok(())
}

/// The commit a stream of a tree without history (a volume) carries: a
/// data directory receiving it starts with its snapshot at this commit, and
/// its journal continues after it. Not 0, which a data directory's first
/// commit never is.
pub const TREE_COMMIT: u64 = 1;

/// Writes a full stream of `fs`, a tree already in memory that nobody
/// changes meanwhile (a volume read into an [`Fs`]), as snapshot `name` at
/// commit [`TREE_COMMIT`]. `source` says where it came from, for people
/// (the header's informational field). The same format as [`send`] of a
/// data directory, so `memfs receive --data-dir` takes it as it is.
/// Refuses a tree whose names and link counts do not add up.
pub fn send_tree(fs: &Fs, name: &str, source: &str, out: &mut dyn Write) -> Result<SendReport> {
    check_snapshot_name(name)?;
    // A tree read from a volume while another mount changed it may not add
    // up; the receiver would refuse it, so it is refused here, first.
    let problems = crate::check::FsCheck::check_consistency(fs);
    if let Some(p) = problems.first() {
        return Err(invalid(format!(
            "refused to send {source}: its tree is inconsistent ({} problems; the first: {p})",
            problems.len()
        )));
    }
    let header = StreamHeader {
        name: name.into(),
        commit: TREE_COMMIT,
        base: None,
        time_ns: now_ns(),
        source: source.into(),
    };
    let r = write_tree(fs, header, out)?;
    debug_assert!(r.tree.nodes >= 1, "a tree has its root");
    Ok(r)
}

/// Reads a whole full stream from `input` into a new tree in memory and
/// hands it over only once everything is checked: every frame's CRC32C and
/// the stream's, the image's structure and counts, the tree's link counts
/// and names, and its [`TreeSum`] against the sender's when the stream
/// carries one (a stream copied from a checkpoint does not). Refuses an
/// incremental stream: it needs its base, and a tree in memory has none.
pub fn receive_tree(input: &mut dyn Read) -> Result<(Fs, ReceiveReport)> {
    let (mut r, header) = FrameReader::open(input)?;
    if let Some((base, _, _)) = &header.base {
        return Err(invalid(format!(
            "refused the stream: it is incremental (the changes since snapshot {base:?}), and only a full stream can be received here: send it without --from"
        )));
    }
    let fs = Fs::new(materialize_config());
    let info = image::read_image_here(&fs, &mut r).map_err(stream_err)?;
    let trailer = r.finish()?;
    if info.commit != header.commit || info.required_end != header.commit {
        return Err(invalid(format!(
            "refused the stream: its image is at commit {} but its header says {}",
            info.commit, header.commit
        )));
    }
    fs.finish_rebuild(header.commit);
    let problems = crate::check::FsCheck::check_consistency(&fs);
    if let Some(p) = problems.first() {
        return Err(invalid(format!(
            "refused the stream: its tree is inconsistent ({} problems; the first: {p})",
            problems.len()
        )));
    }
    let tree = if trailer.tree.nodes != 0 {
        let t = tree_sum(&fs);
        check_tree(t, &trailer)?;
        Some(t)
    } else {
        None
    };
    let report = ReceiveReport {
        header,
        bytes: r.data_bytes,
        records: 0,
        tree,
    };
    Ok((fs, report))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_a_flipped_bit_is_caught() {
        let h = StreamHeader {
            name: "a".into(),
            commit: 7,
            base: None,
            time_ns: 1,
            source: "/x".into(),
        };
        let mut out = Vec::new();
        let mut w = FrameWriter::new(&mut out, &h).unwrap();
        let data: Vec<u8> = (0..3 * MAX_FRAME + 5).map(|i| i as u8).collect();
        w.write_all(&data).unwrap();
        w.finish(0, TreeSum::default()).unwrap();
        let mut inp: &[u8] = &out;
        let (mut r, got) = FrameReader::open(&mut inp).unwrap();
        assert_eq!(got, h);
        let mut back = Vec::new();
        r.read_to_end(&mut back).unwrap();
        assert_eq!(back, data);
        assert_eq!(r.finish().unwrap().data_frames, 4);

        let mut bad = out.clone();
        bad[40] ^= 1;
        let mut inp: &[u8] = &bad;
        let err = match FrameReader::open(&mut inp) {
            Err(e) => e.to_string(),
            Ok((mut r, _)) => r.read_to_end(&mut Vec::new()).unwrap_err().to_string(),
        };
        assert!(err.contains("damaged"), "{err}");
    }

    fn small_tree() -> Fs {
        use memfs_fs::Ctx;
        let fs = Fs::new(materialize_config());
        let c = Ctx::ROOT;
        fs.mkdir_all(c, ROOT_INO, "/d/e", 0o700).unwrap();
        fs.write_file(c, ROOT_INO, "/d/f", b"contents").unwrap();
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        fs.write_file(c, ROOT_INO, "/big", &big).unwrap();
        fs
    }

    #[test]
    fn a_tree_round_trips_and_damage_or_an_increment_is_refused() {
        let fs = small_tree();
        let mut out = Vec::new();
        let sent = send_tree(&fs, "vol", "test", &mut out).unwrap();
        assert_eq!(sent.header.commit, TREE_COMMIT);
        let (back, got) = receive_tree(&mut &out[..]).unwrap();
        assert_eq!(got.tree, Some(sent.tree));
        assert_eq!(tree_sum(&back), tree_sum(&fs));
        assert_eq!(got.header.name, "vol");

        let cut = &out[..out.len() - 10];
        let e = receive_tree(&mut &cut[..]).err().unwrap().to_string();
        assert!(e.contains("truncated"), "{e}");
        let mut bad = out.clone();
        let at = bad.len() / 2;
        bad[at] ^= 0x40;
        let e = receive_tree(&mut &bad[..]).err().unwrap().to_string();
        assert!(e.contains("damaged"), "{e}");
        let e = send_tree(&fs, "-bad", "test", &mut Vec::new())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("bad snapshot name"), "{e}");

        // An incremental stream's header alone is enough to be refused.
        let h = StreamHeader {
            name: "b".into(),
            commit: 3,
            base: Some(("a".into(), 2, TreeSum::default())),
            time_ns: 1,
            source: "/x".into(),
        };
        let mut inc = Vec::new();
        let w = FrameWriter::new(&mut inc, &h).unwrap();
        w.finish(1, TreeSum::default()).unwrap();
        let e = receive_tree(&mut &inc[..]).err().unwrap().to_string();
        assert!(e.contains("incremental"), "{e}");
    }
}
