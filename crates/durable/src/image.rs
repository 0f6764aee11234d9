//! Checkpoint images: the whole tree written as a stream of records, copied
//! while writers keep running.
//!
//! The copy takes one node's read lock at a time and only for a bounded
//! slice of it (64 pages or 1024 directory entries), so no operation waits
//! behind a checkpoint for more than a few tens of microseconds, however big
//! the file system. The result is *fuzzy*: each slice is consistent, the
//! whole is not; recovery replays the journal from the commit the copy began
//! at over it, which makes it exact (see `replay.rs`). Format in
//! `docs/durability.md`.

use std::io::{self, Read, Write};

use crate::codec::{ATTR_LEN, Cursor, kind_code, kind_from, put_attr, put_bytes16, put_bytes32};
use memfs_fs::{FIRST_ENTRY_OFFSET, FileType, Fs, Node, PAGE_SIZE};

pub const IMAGE_MAGIC: &[u8; 8] = b"MFSIMG01";

const R_NODE: u8 = 1;
const R_ENTRIES: u8 = 2;
const R_PAGES: u8 = 3;
/// A node's inode flags (`chattr`), after its R_NODE; only for nodes that
/// have any, so images without flags are as before and older images load.
const R_FLAGS: u8 = 4;
/// A node's creation time (btime), after its R_NODE; only where it differs
/// from the node's ctime, so older images (which have none) load with
/// btime = ctime.
const R_BTIME: u8 = 5;
const R_END: u8 = 0xFF;

/// Pages copied per lock hold (256 KiB: tens of microseconds of memcpy).
const PAGES_PER_SLICE: usize = 64;
/// Directory entries copied per lock hold.
const ENTRIES_PER_SLICE: usize = 1024;

/// What an image holds, from its header and trailer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImageInfo {
    /// Every commit up to this one is in the image.
    pub commit: u64,
    /// Effects of commits up to this one may be in it too: recovery must
    /// replay the journal at least this far.
    pub required_end: u64,
    pub nodes: u64,
    pub pages: u64,
}

/// Writes the image header and every node; returns nodes and pages written.
/// The caller appends the trailer with [`write_trailer`] once it knows how
/// far the journal got while this ran.
pub(crate) fn write_nodes(fs: &Fs, commit: u64, w: &mut dyn Write) -> io::Result<(u64, u64)> {
    w.write_all(IMAGE_MAGIC)?;
    w.write_all(&commit.to_le_bytes())?;
    w.write_all(&fs.next_ino().to_le_bytes())?;
    // Collected first so that no table shard stays locked while we copy.
    let nodes: Vec<Node> = fs.nodes();
    let mut buf = Vec::with_capacity(PAGES_PER_SLICE * (PAGE_SIZE + 32));
    let (mut count, mut pages) = (0u64, 0u64);
    for inode in nodes {
        if write_node(fs, &inode, &mut buf)? {
            count += 1;
        }
        w.write_all(&buf)?;
        buf.clear();
        match inode.kind() {
            FileType::Directory => write_entries(&inode, &mut buf, w)?,
            FileType::RegularFile => pages += write_pages(fs, &inode, &mut buf, w)?,
            _ => {}
        }
    }
    Ok((count, pages))
}

/// Writes a directory's entries, a slice per lock hold.
fn write_entries(inode: &Node, buf: &mut Vec<u8>, w: &mut dyn Write) -> io::Result<()> {
    let mut offset = FIRST_ENTRY_OFFSET;
    loop {
        let next = inode.read(|st| {
            let at = buf.len();
            buf.push(R_ENTRIES);
            buf.extend_from_slice(&inode.ino().to_le_bytes());
            let count_at = buf.len();
            buf.extend_from_slice(&0u32.to_le_bytes());
            let mut n = 0u32;
            let mut next = None;
            let is_dir = st.entries_from(offset, |name, ino, kind, off| {
                if n as usize == ENTRIES_PER_SLICE {
                    next = Some(off - 1);
                    return false;
                }
                put_bytes16(buf, name);
                buf.extend_from_slice(&ino.to_le_bytes());
                buf.push(kind_code(kind));
                n += 1;
                true
            });
            if !is_dir {
                buf.truncate(at);
                return Err(());
            }
            buf[count_at..count_at + 4].copy_from_slice(&n.to_le_bytes());
            Ok(next)
        });
        let Ok(next) = next else { break };
        w.write_all(buf)?;
        buf.clear();
        match next {
            Some(o) => offset = o,
            None => break,
        }
    }
    Ok(())
}

/// Writes a regular file's pages, a slice per lock hold; returns how many.
fn write_pages(fs: &Fs, inode: &Node, buf: &mut Vec<u8>, w: &mut dyn Write) -> io::Result<u64> {
    let mut pages = 0u64;
    let mut start = Some(0u64);
    let ino = inode.ino();
    while let Some(s) = start {
        let next = inode.read(|st| {
            if st.page_count().is_none() || !kept(fs, ino, st.nlink()) {
                return Err(());
            }
            Ok(st.pages_from(s, PAGES_PER_SLICE, |idx, page| {
                buf.push(R_PAGES);
                buf.extend_from_slice(&ino.to_le_bytes());
                buf.extend_from_slice(&idx.to_le_bytes());
                buf.extend_from_slice(page);
                pages += 1;
            }))
        });
        let Ok(next) = next else { break };
        start = next;
        w.write_all(buf)?;
        buf.clear();
    }
    Ok(pages)
}

/// Whether the image holds a node. Nodes no directory names (unlinked but
/// still open) are left out: nobody can hold them after a restart. Except a
/// tmpfile that may still be linked: a link recorded after the copy began
/// is replayed onto this image and must find the data written before it.
/// Recovery drops it again if no such link comes.
fn kept(fs: &Fs, ino: u64, nlink: u32) -> bool {
    nlink > 0 || ino == memfs_fs::ROOT_INO || fs.is_linkable_tmpfile(ino)
}

/// One node's attributes, symlink target, `..` and xattrs, if [`kept`].
fn write_node(fs: &Fs, inode: &Node, buf: &mut Vec<u8>) -> io::Result<bool> {
    inode.read(|st| {
        if !kept(fs, inode.ino(), st.nlink()) {
            return Ok(false);
        }
        buf.push(R_NODE);
        let attr = st.attr();
        put_attr(buf, &attr);
        let parent = st.dir_parent().unwrap_or(0);
        buf.extend_from_slice(&parent.to_le_bytes());
        put_bytes16(buf, st.symlink_target().unwrap_or(b""));
        let xs: Vec<(&[u8], &[u8])> = st.xattrs().collect();
        buf.extend_from_slice(&(xs.len() as u16).to_le_bytes());
        for (n, v) in xs {
            put_bytes16(buf, n);
            put_bytes32(buf, v);
        }
        let flags = st.flags();
        if flags != 0 {
            buf.push(R_FLAGS);
            buf.extend_from_slice(&inode.ino().to_le_bytes());
            buf.extend_from_slice(&flags.to_le_bytes());
        }
        if attr.btime != attr.ctime {
            buf.push(R_BTIME);
            buf.extend_from_slice(&inode.ino().to_le_bytes());
            buf.extend_from_slice(&attr.btime.sec.to_le_bytes());
            buf.extend_from_slice(&attr.btime.nsec.to_le_bytes());
        }
        Ok(true)
    })
}

pub(crate) fn write_trailer(w: &mut dyn Write, info: &ImageInfo) -> io::Result<()> {
    w.write_all(&[R_END])?;
    w.write_all(&info.required_end.to_le_bytes())?;
    w.write_all(&info.nodes.to_le_bytes())?;
    w.write_all(&info.pages.to_le_bytes())
}

fn read_n(r: &mut dyn Read, buf: &mut Vec<u8>, n: usize) -> Result<(), String> {
    buf.resize(n, 0);
    r.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => "image ends before its trailer (truncated)".to_string(),
        _ => e.to_string(),
    })
}

fn read_u64(r: &mut dyn Read, buf: &mut Vec<u8>) -> Result<u64, String> {
    read_n(r, buf, 8)?;
    Ok(u64::from_le_bytes(buf[..8].try_into().expect("8")))
}

/// A variable-length tail: a 16- or 32-bit length, then that many bytes,
/// appended to `buf`.
fn read_var(r: &mut dyn Read, buf: &mut Vec<u8>, wide: bool) -> Result<(), String> {
    let mut len = [0u8; 4];
    let w = if wide { 4 } else { 2 };
    r.read_exact(&mut len[..w])
        .map_err(|e| format!("image truncated in a record: {e}"))?;
    buf.extend_from_slice(&len[..w]);
    let n = u32::from_le_bytes(len) as usize;
    if n > (64 << 20) {
        return Err(format!("field of {n} bytes is implausibly large"));
    }
    let at = buf.len();
    buf.resize(at + n, 0);
    r.read_exact(&mut buf[at..])
        .map_err(|e| format!("image truncated in a record: {e}"))
}

/// Reads an image into `fs` (a fresh file system). Errors say what is wrong;
/// the caller adds the file and offset. The image must be all that `r`
/// holds: it is read ahead to its end on a helper thread ([`read_ahead`]).
pub(crate) fn read_image(fs: &Fs, r: &mut (dyn Read + Send)) -> Result<ImageInfo, String> {
    read_ahead(r, |r| read_image_into(Some(fs), r))
        .map_err(|e| format!("cannot start the read-ahead thread: {e}"))?
}

/// [`read_image`] from a reader that cannot cross threads (a stream's
/// frames), parsed on this thread without the read-ahead.
pub(crate) fn read_image_here(fs: &Fs, r: &mut dyn Read) -> Result<ImageInfo, String> {
    read_image_into(Some(fs), r)
}

/// Bytes a read-ahead block holds.
const AHEAD_BLOCK: usize = 256 * 1024;
/// Blocks read ahead and not yet parsed, at most: a bound on the memory
/// (1 MiB) and on the bytes read past a parse error.
const AHEAD_BLOCKS: usize = 4;

/// Runs `f` over `r` read ahead by a helper thread, in blocks.
///
/// Why: a load was one thread doing everything in turn: the kernel's copy
/// out of the page cache and the checksums of [`CheckpointReader`]'s chunks
/// (about a third of its time), then parsing and building the tree, while
/// the machine's other CPU idled (`perf record -a` of a 1 GiB mount's
/// recovery: 50 % idle). Reading and checking the next block now overlaps
/// building from the last one (docs/durability.md, "Loading a checkpoint").
///
/// An error of `r` reaches `f` after every byte before it, as it would
/// without the helper. When `f` returns early the helper stops at its next
/// block. Blocks go back to the helper once parsed, so a load of any size
/// touches `AHEAD_BLOCKS + 2` blocks of memory.
///
/// [`CheckpointReader`]: memfs_journal::checkpoint::CheckpointReader
fn read_ahead<T>(r: &mut (dyn Read + Send), f: impl FnOnce(&mut dyn Read) -> T) -> io::Result<T> {
    use std::sync::mpsc::{channel, sync_channel};
    let (tx, rx) = sync_channel::<io::Result<Vec<u8>>>(AHEAD_BLOCKS);
    let (back_tx, back_rx) = channel::<Vec<u8>>();
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("memfs-read-ahead".into())
            .spawn_scoped(s, move || {
                loop {
                    let mut b = back_rx.try_recv().unwrap_or_default();
                    b.resize(AHEAD_BLOCK, 0);
                    let mut n = 0;
                    let err = loop {
                        if n == b.len() {
                            break None;
                        }
                        match r.read(&mut b[n..]) {
                            Ok(0) => break None,
                            Ok(k) => n += k,
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => break Some(e),
                        }
                    };
                    b.truncate(n);
                    // A short block without an error is the end: sent, then
                    // an empty one says so (also when the end falls exactly
                    // on a block's end).
                    let end = n < AHEAD_BLOCK || err.is_some();
                    if n > 0 && tx.send(Ok(b)).is_err() {
                        return;
                    }
                    if end {
                        let _ = tx.send(err.map_or(Ok(Vec::new()), Err));
                        return;
                    }
                }
            })?;
        let mut ahead = ReadAhead {
            rx,
            back: back_tx,
            block: Vec::new(),
            pos: 0,
            ended: false,
        };
        // `ahead` (the receiving end) goes when `f` returns, which stops a
        // helper still reading before the scope waits for it.
        Ok(f(&mut ahead))
    })
}

/// The parsing side of [`read_ahead`].
struct ReadAhead {
    rx: std::sync::mpsc::Receiver<io::Result<Vec<u8>>>,
    back: std::sync::mpsc::Sender<Vec<u8>>,
    block: Vec<u8>,
    pos: usize,
    ended: bool,
}

impl Read for ReadAhead {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.block.len() {
            if self.ended {
                return Ok(0);
            }
            match self.rx.recv() {
                Ok(Ok(b)) if b.is_empty() => self.ended = true,
                Ok(Ok(b)) => {
                    let done = std::mem::replace(&mut self.block, b);
                    // The helper may be gone (at the end): then it is freed.
                    let _ = self.back.send(done);
                    self.pos = 0;
                }
                Ok(Err(e)) => {
                    self.ended = true;
                    return Err(e);
                }
                Err(_) => {
                    self.ended = true;
                    return Err(io::Error::other("the read-ahead thread stopped"));
                }
            }
        }
        let n = out.len().min(self.block.len() - self.pos);
        out[..n].copy_from_slice(&self.block[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Parses and checks a whole image without building a tree: what a new
/// checkpoint must pass before it replaces the previous one.
pub(crate) fn validate_image(r: &mut dyn Read) -> Result<ImageInfo, String> {
    read_image_into(None, r)
}

fn read_image_into(fs: Option<&Fs>, r: &mut dyn Read) -> Result<ImageInfo, String> {
    let mut buf = Vec::new();
    read_n(r, &mut buf, 24)?;
    if &buf[..8] != IMAGE_MAGIC {
        return Err("not a memfs image (bad magic)".into());
    }
    let mut info = ImageInfo {
        commit: u64::from_le_bytes(buf[8..16].try_into().expect("8")),
        ..Default::default()
    };
    let next_ino = u64::from_le_bytes(buf[16..24].try_into().expect("8"));
    if let Some(fs) = fs {
        fs.raise_next_ino(next_ino);
    }
    let mut pages = 0u64;
    let mut nodes = 0u64;
    loop {
        read_n(r, &mut buf, 1)?;
        match buf[0] {
            R_NODE => {
                read_node(fs, r, &mut buf)?;
                nodes += 1;
            }
            R_ENTRIES => read_entries(fs, r, &mut buf)?,
            R_PAGES => {
                read_page(fs, r, &mut buf)?;
                pages += 1;
            }
            R_FLAGS => read_flags(fs, r, &mut buf)?,
            R_BTIME => read_btime(fs, r, &mut buf)?,
            R_END => {
                read_end(r, &mut buf, &mut info, nodes, pages)?;
                return Ok(info);
            }
            t => return Err(format!("unknown image record type {t}")),
        }
    }
}

/// An R_NODE record: a node's attributes, parent, symlink target, xattrs.
fn read_node(fs: Option<&Fs>, r: &mut dyn Read, buf: &mut Vec<u8>) -> Result<(), String> {
    read_n(r, buf, ATTR_LEN + 8)?;
    read_var(r, buf, false)?;
    let mut rest = [0u8; 2];
    r.read_exact(&mut rest)
        .map_err(|e| format!("image truncated in a node: {e}"))?;
    let nx = u16::from_le_bytes(rest);
    buf.extend_from_slice(&rest);
    for _ in 0..nx {
        read_var(r, buf, false)?;
        read_var(r, buf, true)?;
    }
    let mut c = Cursor::new(buf);
    let attr = c.attr()?;
    let parent = c.u64()?;
    let target = c.bytes16()?;
    let nx = c.u16()?;
    let mut xs = Vec::with_capacity(nx as usize);
    for _ in 0..nx {
        xs.push((c.bytes16()?, c.bytes32()?));
    }
    if let Some(fs) = fs {
        fs.install_node(&attr, parent.max(1), target);
        fs.apply_xattrs(attr.ino, xs.into_iter());
    }
    Ok(())
}

/// An R_ENTRIES record: a slice of a directory's entries.
fn read_entries(fs: Option<&Fs>, r: &mut dyn Read, buf: &mut Vec<u8>) -> Result<(), String> {
    read_n(r, buf, 12)?;
    let dir = u64::from_le_bytes(buf[..8].try_into().expect("8"));
    let n = u32::from_le_bytes(buf[8..12].try_into().expect("4"));
    if n as usize > ENTRIES_PER_SLICE {
        return Err(format!("{n} entries in one slice"));
    }
    buf.clear();
    for _ in 0..n {
        read_var(r, buf, false)?;
        let at = buf.len();
        buf.resize(at + 9, 0);
        r.read_exact(&mut buf[at..])
            .map_err(|e| format!("image truncated in entries: {e}"))?;
    }
    let mut c = Cursor::new(buf);
    let mut entries = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let name = c.bytes16()?;
        if name.is_empty() || name.len() > memfs_fs::NAME_MAX {
            return Err(format!("directory {dir}: invalid entry name"));
        }
        let ino = c.u64()?;
        let kind = kind_from(c.u8()?)?;
        entries.push((name, ino, kind));
    }
    if let Some(fs) = fs {
        fs.apply_entries(dir, entries.into_iter());
    }
    Ok(())
}

/// An R_PAGES record: one page of a file.
fn read_page(fs: Option<&Fs>, r: &mut dyn Read, buf: &mut Vec<u8>) -> Result<(), String> {
    read_n(r, buf, 16 + PAGE_SIZE)?;
    let ino = u64::from_le_bytes(buf[..8].try_into().expect("8"));
    let idx = u64::from_le_bytes(buf[8..16].try_into().expect("8"));
    // The last valid byte is MAX_FILE_SIZE - 1; its page must load.
    if idx > (memfs_fs::MAX_FILE_SIZE - 1) / PAGE_SIZE as u64 {
        return Err(format!("page index {idx} beyond the largest file"));
    }
    if let Some(fs) = fs {
        fs.apply_pages(ino, idx, &buf[16..]);
    }
    Ok(())
}

/// An R_FLAGS record: a node's inode flags.
fn read_flags(fs: Option<&Fs>, r: &mut dyn Read, buf: &mut Vec<u8>) -> Result<(), String> {
    read_n(r, buf, 12)?;
    let ino = u64::from_le_bytes(buf[..8].try_into().expect("8"));
    let flags = u32::from_le_bytes(buf[8..12].try_into().expect("4"));
    if flags & !memfs_fs::FS_FL_SUPPORTED != 0 {
        return Err(format!("node {ino}: unknown inode flags {flags:#x}"));
    }
    if let Some(fs) = fs {
        fs.apply_flags(ino, flags);
    }
    Ok(())
}

/// An R_BTIME record: a node's creation time.
fn read_btime(fs: Option<&Fs>, r: &mut dyn Read, buf: &mut Vec<u8>) -> Result<(), String> {
    read_n(r, buf, 20)?;
    let ino = u64::from_le_bytes(buf[..8].try_into().expect("8"));
    let sec = i64::from_le_bytes(buf[8..16].try_into().expect("8"));
    let nsec = u32::from_le_bytes(buf[16..20].try_into().expect("4"));
    if nsec >= 1_000_000_000 {
        return Err(format!(
            "node {ino}: btime nanoseconds out of range: {nsec}"
        ));
    }
    if let Some(fs) = fs {
        fs.apply_btime(ino, memfs_fs::Timespec { sec, nsec });
    }
    Ok(())
}

/// The R_END trailer: checks its counts against the `nodes` and `pages`
/// read, and that nothing follows it.
fn read_end(
    r: &mut dyn Read,
    buf: &mut Vec<u8>,
    info: &mut ImageInfo,
    nodes: u64,
    pages: u64,
) -> Result<(), String> {
    info.required_end = read_u64(r, buf)?;
    info.nodes = read_u64(r, buf)?;
    info.pages = read_u64(r, buf)?;
    if info.nodes != nodes || info.pages != pages {
        return Err(format!(
            "trailer counts {} nodes and {} pages, the image holds {nodes} and {pages}",
            info.nodes, info.pages
        ));
    }
    if info.required_end < info.commit {
        return Err("trailer's required end precedes the image's commit".into());
    }
    let mut extra = [0u8; 1];
    if r.read(&mut extra).map_err(|e| e.to_string())? != 0 {
        return Err("bytes after the image trailer".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands out `data` in reads of at most `step` bytes, then fails with
    /// `fail` (or ends).
    struct Source {
        data: Vec<u8>,
        at: usize,
        step: usize,
        fail: Option<io::ErrorKind>,
    }

    impl Read for Source {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            if self.at == self.data.len() {
                return match self.fail.take() {
                    Some(k) => Err(io::Error::new(k, "bad chunk")),
                    None => Ok(0),
                };
            }
            let n = out.len().min(self.step).min(self.data.len() - self.at);
            out[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    fn bytes(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn read_ahead_hands_on_every_byte_in_order() {
        // Ends inside a block, exactly on a block's end, and at nothing.
        for n in [
            0,
            1,
            AHEAD_BLOCK - 1,
            AHEAD_BLOCK,
            3 * AHEAD_BLOCK,
            10 * AHEAD_BLOCK + 17,
        ] {
            let data = bytes(n);
            let mut src = Source {
                data: data.clone(),
                at: 0,
                step: 10_000,
                fail: None,
            };
            let got = read_ahead(&mut src, |r| {
                let mut v = Vec::new();
                r.read_to_end(&mut v).map(|_| v)
            })
            .expect("the helper starts");
            assert_eq!(got.expect("no error"), data, "{n} bytes");
        }
    }

    #[test]
    fn read_ahead_gives_an_error_after_the_bytes_before_it() {
        let data = bytes(2 * AHEAD_BLOCK + 5);
        let mut src = Source {
            data: data.clone(),
            at: 0,
            step: 4096,
            fail: Some(io::ErrorKind::InvalidData),
        };
        let (before, err) = read_ahead(&mut src, |r| {
            let mut v = vec![0u8; data.len()];
            r.read_exact(&mut v).expect("the bytes before the error");
            let mut one = [0u8; 1];
            (v, r.read(&mut one).expect_err("then the error"))
        })
        .expect("the helper starts");
        assert_eq!(before, data);
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn read_ahead_stops_when_the_parser_returns_early() {
        // Far more than the helper may hold: it must stop, not read it all.
        let mut src = Source {
            data: bytes(64 * AHEAD_BLOCK),
            at: 0,
            step: AHEAD_BLOCK,
            fail: None,
        };
        let first = read_ahead(&mut src, |r| {
            let mut b = [0u8; 3];
            r.read_exact(&mut b).map(|_| b)
        })
        .expect("the helper starts");
        assert_eq!(first.expect("three bytes"), [0, 7, 14]);
        assert!(
            src.at <= (AHEAD_BLOCKS + 3) * AHEAD_BLOCK,
            "read {} bytes ahead",
            src.at
        );
    }

    #[test]
    fn an_image_loads_the_same_through_read_ahead() {
        let fs = Fs::new(Default::default());
        let ctx = memfs_fs::Ctx::ROOT;
        let (attr, _) = fs
            .create(ctx, memfs_fs::ROOT_INO, b"big", 0o644, true)
            .expect("create");
        let big = attr.ino;
        let data = bytes(3 * AHEAD_BLOCK + 1234);
        fs.write(ctx, big, 0, &data, false).expect("write");
        let mut image = Vec::new();
        let (nodes, pages) = write_nodes(&fs, 7, &mut image).expect("image");
        let want = ImageInfo {
            commit: 7,
            required_end: 7,
            nodes,
            pages,
        };
        write_trailer(&mut image, &want).expect("trailer");
        let loaded = Fs::new(Default::default());
        let info = read_image(&loaded, &mut io::Cursor::new(&image)).expect("loads");
        assert_eq!(info, want);
        let mut back = vec![0u8; data.len()];
        assert_eq!(loaded.read(big, 0, &mut back).expect("read"), data.len());
        assert_eq!(back, data);
        // Cut short: refused, as without the helper.
        let cut = &image[..image.len() - 5];
        assert!(read_image(&Fs::new(Default::default()), &mut io::Cursor::new(cut)).is_err());
    }
}
