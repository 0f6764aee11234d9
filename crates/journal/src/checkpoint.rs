//! Checkpoint files: a client-defined byte stream cut into checksummed chunks.
//!
//! Layout: a 32-byte header (magic, version, commit id, checksum), then chunks
//! `[len u32][crc32c u32][len bytes]`, then an end marker `[0u32][crc32c of the
//! total payload length as u64 LE]`, then end of file. The client streams its
//! state through [`CheckpointWriter`] (an `io::Write`) and reads it back through
//! [`CheckpointReader`] (an `io::Read`) which verifies every chunk before handing
//! out a byte of it.

use crate::storage::{self, OpenMode, Storage, StorageFile};
use crate::{Error, Result, io_err};
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const CHECKPOINT_MAGIC: [u8; 8] = *b"MEMFSSNP";
pub const CHECKPOINT_VERSION: u32 = 1;
const HEADER_LEN: usize = 32;
const CHUNK: usize = 1 << 20;
/// The largest chunk a checkpoint file may hold.
pub const CHECKPOINT_MAX_CHUNK: usize = CHUNK;

/// The 32-byte header of a checkpoint file at `commit`.
pub fn checkpoint_header(commit: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..8].copy_from_slice(&CHECKPOINT_MAGIC);
    h[8..12].copy_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
    h[16..24].copy_from_slice(&commit.to_le_bytes());
    let crc = crc32c::crc32c(&h[0..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h
}

/// The 8 bytes before a chunk of `len` (1 ..= [`CHECKPOINT_MAX_CHUNK`]) bytes
/// whose CRC32C is `crc`: writers that already know the checksum of their
/// bytes (a received stream) write chunks without another pass over them.
pub fn checkpoint_chunk_header(len: usize, crc: u32) -> [u8; 8] {
    debug_assert!(len > 0 && len <= CHUNK);
    let mut h = [0u8; 8];
    h[0..4].copy_from_slice(&(len as u32).to_le_bytes());
    h[4..8].copy_from_slice(&crc.to_le_bytes());
    h
}

/// The end marker after chunks holding `total` bytes in all.
pub fn checkpoint_end_marker(total: u64) -> [u8; 8] {
    let mut end = [0u8; 8];
    end[4..8].copy_from_slice(&crc32c::crc32c(&total.to_le_bytes()).to_le_bytes());
    end
}

/// The files keep the name (and the magic `MEMFSSNP`) they had when these
/// images were called snapshots: data directories and stores written before
/// the rename open unchanged, and no reader has to accept two names.
pub fn checkpoint_file_name(commit: u64) -> String {
    format!("snapshot-{commit:020}.snap")
}

pub fn parse_checkpoint_file_name(name: &str) -> Option<u64> {
    crate::format::parse_numbered_name(name, "snapshot-", ".snap")
}

/// Streams a checkpoint into a temporary file; [`CheckpointWriter::finish`]
/// makes it durable under its final name.
pub struct CheckpointWriter {
    storage: Arc<dyn Storage>,
    file: Box<dyn StorageFile>,
    tmp: PathBuf,
    dst: PathBuf,
    dir: PathBuf,
    buf: Vec<u8>,
    total: u64,
}

impl CheckpointWriter {
    pub fn create(dir: &Path, commit: u64) -> Result<Self> {
        let name = checkpoint_file_name(commit);
        let tmp = dir.join(format!("{name}.tmp"));
        let dst = dir.join(name);
        let storage = storage::for_path(&tmp);
        let mut file = storage
            .open(&tmp, OpenMode::CreateTruncate)
            .map_err(io_err(&tmp))?;
        file.write_all(&checkpoint_header(commit))
            .map_err(io_err(&tmp))?;
        Ok(CheckpointWriter {
            storage,
            file,
            tmp,
            dst,
            dir: dir.to_path_buf(),
            buf: Vec::with_capacity(CHUNK),
            total: 0,
        })
    }

    fn flush_chunk(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let h = checkpoint_chunk_header(self.buf.len(), crc32c::crc32c(&self.buf));
        self.file.write_all(&h)?;
        self.file.write_all(&self.buf)?;
        self.total += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }

    /// Writes the end marker, fsyncs, renames into place and fsyncs the
    /// directory. Returns the final path.
    pub fn finish(self) -> Result<PathBuf> {
        self.seal()?.publish()
    }

    /// Writes the end marker and fsyncs, leaving the file under its
    /// temporary name: it can be read back ([`SealedCheckpoint::path`]) before
    /// it replaces a checkpoint of the same commit.
    pub fn seal(mut self) -> Result<SealedCheckpoint> {
        self.flush_chunk().map_err(io_err(&self.tmp))?;
        let end = checkpoint_end_marker(self.total);
        self.file.write_all(&end).map_err(io_err(&self.tmp))?;
        self.file.sync_all().map_err(io_err(&self.tmp))?;
        Ok(SealedCheckpoint {
            storage: self.storage,
            tmp: self.tmp,
            dst: self.dst,
            dir: self.dir,
        })
    }

    /// Drops the temporary file (after a failed checkpoint).
    pub fn abandon(self) {
        let _ = self.storage.remove_file(&self.tmp);
    }
}

/// A complete, durable checkpoint file not yet under its final name.
pub struct SealedCheckpoint {
    storage: Arc<dyn Storage>,
    tmp: PathBuf,
    dst: PathBuf,
    dir: PathBuf,
}

impl SealedCheckpoint {
    /// Where it is now (for reading it back).
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// Renames it into place (atomically replacing a checkpoint of the same
    /// commit) and fsyncs the directory. Returns the final path.
    pub fn publish(self) -> Result<PathBuf> {
        self.storage
            .rename(&self.tmp, &self.dst)
            .map_err(io_err(&self.dst))?;
        crate::dir::sync_dir_with(&*self.storage, &self.dir)?;
        Ok(self.dst)
    }

    /// Drops the file; a checkpoint of the same commit stays as it was.
    pub fn abandon(self) {
        let _ = self.storage.remove_file(&self.tmp);
    }
}

impl Write for CheckpointWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = CHUNK - self.buf.len();
        let n = room.min(data.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == CHUNK {
            self.flush_chunk()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reads a checkpoint back, verifying each chunk. Errors carry the file and
/// offset of the damage (as `io::ErrorKind::InvalidData`).
pub struct CheckpointReader {
    inner: BufReader<Box<dyn StorageFile>>,
    path: PathBuf,
    commit: u64,
    offset: u64,
    chunk: Vec<u8>,
    pos: usize,
    total: u64,
    done: bool,
}

impl CheckpointReader {
    pub fn open(path: &Path) -> Result<Self> {
        let file = storage::for_path(path)
            .open(path, OpenMode::Read)
            .map_err(io_err(path))?;
        let mut inner = BufReader::with_capacity(CHUNK, file);
        let mut h = [0u8; HEADER_LEN];
        let corrupt = |reason: &str| Error::Corrupt {
            file: path.to_path_buf(),
            offset: 0,
            reason: reason.to_string(),
        };
        inner
            .read_exact(&mut h)
            .map_err(|_| corrupt("checkpoint header truncated"))?;
        if h[0..8] != CHECKPOINT_MAGIC {
            return Err(corrupt("bad checkpoint magic"));
        }
        if u32::from_le_bytes(h[28..32].try_into().unwrap()) != crc32c::crc32c(&h[0..28]) {
            return Err(corrupt("checkpoint header checksum mismatch"));
        }
        let version = u32::from_le_bytes(h[8..12].try_into().unwrap());
        if version != CHECKPOINT_VERSION {
            return Err(corrupt(&format!(
                "unsupported checkpoint version {version}"
            )));
        }
        Ok(CheckpointReader {
            inner,
            path: path.to_path_buf(),
            commit: u64::from_le_bytes(h[16..24].try_into().unwrap()),
            offset: HEADER_LEN as u64,
            chunk: Vec::new(),
            pos: 0,
            total: 0,
            done: false,
        })
    }

    pub fn commit(&self) -> u64 {
        self.commit
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn bad(&self, offset: u64, reason: &str) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "corrupt checkpoint {} at offset {offset}: {reason}",
                self.path.display()
            ),
        )
    }

    fn next_chunk(&mut self) -> io::Result<()> {
        let at = self.offset;
        let mut h = [0u8; 8];
        self.inner
            .read_exact(&mut h)
            .map_err(|_| self.bad(at, "truncated (chunk header missing)"))?;
        let len = u32::from_le_bytes(h[0..4].try_into().unwrap()) as usize;
        let crc = u32::from_le_bytes(h[4..8].try_into().unwrap());
        if len == 0 {
            if crc != crc32c::crc32c(&self.total.to_le_bytes()) {
                return Err(self.bad(at, "end marker does not match the data length"));
            }
            let mut rest = [0u8; 1];
            if self.inner.read(&mut rest)? != 0 {
                return Err(self.bad(at + 8, "trailing bytes after the end marker"));
            }
            self.done = true;
            self.chunk.clear();
            self.pos = 0;
            return Ok(());
        }
        if len > CHUNK {
            return Err(self.bad(at, &format!("chunk length {len} out of range")));
        }
        self.chunk.resize(len, 0);
        let mut chunk = std::mem::take(&mut self.chunk);
        let r = self.inner.read_exact(&mut chunk);
        self.chunk = chunk;
        r.map_err(|_| self.bad(at, "truncated chunk"))?;
        if crc32c::crc32c(&self.chunk) != crc {
            return Err(self.bad(at, "chunk checksum mismatch"));
        }
        self.offset += 8 + len as u64;
        self.total += len as u64;
        self.pos = 0;
        Ok(())
    }

    /// Confirms that the whole stream was consumed and the end marker is valid.
    pub fn finish(mut self) -> io::Result<()> {
        if self.pos < self.chunk.len() {
            return Err(self.bad(self.offset, "checkpoint has unread data"));
        }
        while !self.done {
            self.next_chunk()?;
            if !self.chunk.is_empty() {
                return Err(self.bad(self.offset, "checkpoint has unread data"));
            }
        }
        Ok(())
    }
}

impl Read for CheckpointReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.chunk.len() {
            if self.done {
                return Ok(0);
            }
            self.next_chunk()?;
        }
        let n = out.len().min(self.chunk.len() - self.pos);
        out[..n].copy_from_slice(&self.chunk[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Lists checkpoint files in `dir` as (commit, path), oldest first.
pub fn list_checkpoints(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut v = Vec::new();
    for name in storage::for_path(dir).read_dir(dir).map_err(io_err(dir))? {
        if let Some(c) = name.to_str().and_then(parse_checkpoint_file_name) {
            v.push((c, dir.join(&name)));
        }
    }
    v.sort();
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, data: &[u8]) -> PathBuf {
        let mut w = CheckpointWriter::create(dir, 9).unwrap();
        w.write_all(data).unwrap();
        w.finish().unwrap()
    }

    #[test]
    fn round_trip_and_every_damage_detected() {
        let t = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..3 * CHUNK + 77).map(|i| (i * 31 % 251) as u8).collect();
        let p = write(t.path(), &data);
        let mut r = CheckpointReader::open(&p).unwrap();
        assert_eq!(r.commit(), 9);
        let mut back = Vec::new();
        r.read_to_end(&mut back).unwrap();
        assert!(back == data);
        r.finish().unwrap();

        let small = write(t.path(), b"0123456789abcdef");
        let orig = std::fs::read(&small).unwrap();
        for i in 0..orig.len() {
            let mut b = orig.clone();
            b[i] ^= 0x10;
            std::fs::write(&small, &b).unwrap();
            let res = CheckpointReader::open(&small).and_then(|mut r| {
                let mut v = Vec::new();
                r.read_to_end(&mut v).map_err(io_err(&small))?;
                r.finish().map_err(io_err(&small))
            });
            assert!(res.is_err(), "flip at byte {i} undetected");
        }
        for cut in 0..orig.len() {
            std::fs::write(&small, &orig[..cut]).unwrap();
            let res = CheckpointReader::open(&small).and_then(|mut r| {
                let mut v = Vec::new();
                r.read_to_end(&mut v).map_err(io_err(&small))?;
                r.finish().map_err(io_err(&small))
            });
            assert!(res.is_err(), "truncation at {cut} undetected");
        }
    }

    /// Directories written before the images were called checkpoints hold
    /// these names and this magic: changing either would orphan them.
    #[test]
    fn checkpoint_files_keep_their_published_name_and_magic() {
        assert_eq!(
            checkpoint_file_name(7),
            "snapshot-00000000000000000007.snap"
        );
        assert_eq!(
            parse_checkpoint_file_name("snapshot-00000000000000000007.snap"),
            Some(7)
        );
        assert_eq!(&CHECKPOINT_MAGIC, b"MEMFSSNP");
        let dir = tempfile::tempdir().unwrap();
        let mut w = CheckpointWriter::create(dir.path(), 7).unwrap();
        w.write_all(b"old").unwrap();
        w.finish().unwrap();
        let listed = list_checkpoints(dir.path()).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].0, 7);
        assert_eq!(read_back(&listed[0].1), b"old");
    }

    fn read_back(p: &Path) -> Vec<u8> {
        let mut r = CheckpointReader::open(p).unwrap();
        let mut v = Vec::new();
        r.read_to_end(&mut v).unwrap();
        r.finish().unwrap();
        v
    }

    /// A sealed checkpoint is complete and readable under its temporary name
    /// while the one of the same commit stays; abandoning it leaves that one,
    /// publishing replaces it.
    #[test]
    fn sealed_checkpoint_replaces_only_when_published() {
        let t = tempfile::tempdir().unwrap();
        let p = write(t.path(), b"first");
        let mut w = CheckpointWriter::create(t.path(), 9).unwrap();
        w.write_all(b"second").unwrap();
        let sealed = w.seal().unwrap();
        assert_ne!(sealed.path(), p.as_path());
        assert_eq!(read_back(sealed.path()), b"second");
        assert_eq!(read_back(&p), b"first");
        let tmp = sealed.path().to_path_buf();
        sealed.abandon();
        assert!(!tmp.exists(), "abandon removes the sealed file");
        assert_eq!(read_back(&p), b"first");

        let mut w = CheckpointWriter::create(t.path(), 9).unwrap();
        w.write_all(b"third").unwrap();
        let sealed = w.seal().unwrap();
        assert_eq!(sealed.publish().unwrap(), p);
        assert!(!tmp.exists());
        assert_eq!(read_back(&p), b"third");
    }
}
