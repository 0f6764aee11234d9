//! The storage the journal does its file I/O through.
//!
//! Every file operation of the journal (segments, manifest, checkpoints, the data
//! directory lock, atomic small files) goes through a [`Storage`]. The real one,
//! [`RealStorage`], is `std::fs` plus `flock`. Tests register another one (the
//! crash simulator [`SimStorage`](crate::sim::SimStorage)) for a path prefix with
//! [`register`]; every journal function working on a path under that prefix
//! then uses it, without any change to the public API.
//!
//! Cost on the commit path: the storage is resolved once when a
//! [`DataDir`](crate::DataDir), [`Journal`](crate::Journal) or
//! [`CheckpointWriter`](crate::CheckpointWriter) is opened and kept as an `Arc`;
//! each write or fsync is then one dynamic call. The lookup itself is one
//! relaxed atomic load while nothing is registered.

use std::ffi::OsString;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, RwLock};

/// How to open a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Read only; the file must exist.
    Read,
    /// Read and write an existing file, from offset 0, without truncating.
    Write,
    /// Read and write, creating the file if it does not exist (never truncates).
    CreateOrOpen,
    /// Write, creating the file or truncating it to zero length.
    CreateTruncate,
}

/// An open file: a cursor for `Read`/`Write`/`Seek`, plus length and sync.
pub trait StorageFile: Read + Write + Seek + Send + Sync + Debug {
    /// Sets the file length (truncating or zero-extending).
    fn set_len(&mut self, len: u64) -> io::Result<()>;
    /// Makes the file's data (and the size needed to read it) durable.
    fn sync_data(&mut self) -> io::Result<()>;
    /// Makes the file's data and metadata durable (not its directory entry).
    fn sync_all(&mut self) -> io::Result<()>;
    /// Current length of the file.
    fn len(&self) -> io::Result<u64>;
    /// Whether the file is empty.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Allocates disk space for bytes `0..len` without changing the length
    /// (`fallocate(FALLOC_FL_KEEP_SIZE)`): later writes there cannot fail
    /// for lack of space. The default (no preallocation) does nothing.
    fn allocate(&mut self, len: u64) -> io::Result<()> {
        let _ = len;
        Ok(())
    }
}

/// A held data-directory lock; released when dropped.
pub trait DirLock: Send + Sync + Debug {}

/// Every file operation the journal performs. Errors are plain `io::Error`s;
/// the journal adds the path when it reports them.
pub trait Storage: Send + Sync + Debug {
    /// Opens `path` as `mode` says.
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>>;
    /// Reads a whole file.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// Renames `from` to `to` (replacing `to`); durable after [`Storage::sync_dir`].
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes a file; durable after [`Storage::sync_dir`].
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Names of the entries of a directory (any order).
    fn read_dir(&self, dir: &Path) -> io::Result<Vec<OsString>>;
    /// Makes the directory's entries (creations, renames, removals) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Creates a directory and its missing parents (durable once each parent
    /// is synced).
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Whether `path` is an existing directory.
    fn is_dir(&self, path: &Path) -> bool;
    /// Whether `path` exists.
    fn exists(&self, path: &Path) -> io::Result<bool>;
    /// Length of the file at `path`.
    fn len(&self, path: &Path) -> io::Result<u64>;
    /// Takes the exclusive lock on the lock file `lock_file` (creating it).
    /// Fails with [`io::ErrorKind::WouldBlock`] when another holder has it.
    fn lock(&self, lock_file: &Path) -> io::Result<Box<dyn DirLock>>;
}

/// `std::fs` and `flock`: what the journal does on a real disk.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealStorage;

#[derive(Debug)]
struct RealFile(File);

impl Read for RealFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
    fn read_to_end(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        self.0.read_to_end(buf)
    }
    fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        self.0.read_exact(buf)
    }
}

impl Write for RealFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.0.write_all(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl Seek for RealFile {
    fn seek(&mut self, pos: io::SeekFrom) -> io::Result<u64> {
        self.0.seek(pos)
    }
}

impl StorageFile for RealFile {
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn sync_data(&mut self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn sync_all(&mut self) -> io::Result<()> {
        self.0.sync_all()
    }
    fn len(&self) -> io::Result<u64> {
        self.0.metadata().map(|m| m.len())
    }
    fn allocate(&mut self, len: u64) -> io::Result<()> {
        use nix::fcntl::{FallocateFlags, fallocate};
        let len = i64::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc_efbig()))?;
        match fallocate(&self.0, FallocateFlags::FALLOC_FL_KEEP_SIZE, 0, len) {
            Ok(()) => Ok(()),
            // A file system without fallocate: no guarantee, but no failure.
            Err(nix::errno::Errno::EOPNOTSUPP) => Ok(()),
            Err(e) => Err(io::Error::from(e)),
        }
    }
}

fn libc_efbig() -> i32 {
    nix::errno::Errno::EFBIG as i32
}

#[derive(Debug)]
struct RealLock(#[allow(dead_code)] nix::fcntl::Flock<File>);

impl DirLock for RealLock {}

impl Storage for RealStorage {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        let mut o = OpenOptions::new();
        match mode {
            OpenMode::Read => o.read(true),
            OpenMode::Write => o.read(true).write(true),
            OpenMode::CreateOrOpen => o.read(true).write(true).create(true).truncate(false),
            OpenMode::CreateTruncate => o.write(true).create(true).truncate(true),
        };
        Ok(Box::new(RealFile(o.open(path)?)))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn read_dir(&self, dir: &Path) -> io::Result<Vec<OsString>> {
        std::fs::read_dir(dir)?
            .map(|e| e.map(|e| e.file_name()))
            .collect()
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        path.try_exists()
    }

    fn len(&self, path: &Path) -> io::Result<u64> {
        std::fs::metadata(path).map(|m| m.len())
    }

    fn lock(&self, lock_file: &Path) -> io::Result<Box<dyn DirLock>> {
        use nix::fcntl::{Flock, FlockArg};
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(lock_file)?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => Ok(Box::new(RealLock(l))),
            Err((_, e)) => Err(io::Error::from(e)),
        }
    }
}

static ANY: AtomicBool = AtomicBool::new(false);
type Registry = Vec<(PathBuf, Arc<dyn Storage>)>;
static REGISTRY: RwLock<Registry> = RwLock::new(Vec::new());
static REAL: LazyLock<Arc<dyn Storage>> = LazyLock::new(|| Arc::new(RealStorage));

fn registry_write() -> std::sync::RwLockWriteGuard<'static, Registry> {
    // The registry is a plain list: a panic while it was held cannot leave it
    // inconsistent, so a poisoned lock is still usable.
    REGISTRY.write().unwrap_or_else(|e| e.into_inner())
}

/// Routes every journal operation on a path under `prefix` to `storage`
/// (replacing an earlier registration of the same prefix). The longest
/// registered prefix wins. Values already opened keep the storage they
/// resolved at open.
pub fn register(prefix: &Path, storage: Arc<dyn Storage>) {
    let mut r = registry_write();
    r.retain(|(p, _)| p != prefix);
    r.push((prefix.to_path_buf(), storage));
    ANY.store(true, Ordering::Release);
}

/// Removes the registration of `prefix` (if any).
pub fn unregister(prefix: &Path) {
    let mut r = registry_write();
    r.retain(|(p, _)| p != prefix);
    ANY.store(!r.is_empty(), Ordering::Release);
}

/// A registration that ends when dropped (see [`register_scoped`]).
#[must_use = "the registration ends when this is dropped"]
#[derive(Debug)]
pub struct Registration {
    prefix: PathBuf,
}

impl Registration {
    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    /// Routes the prefix to another storage (e.g. the disk recovered after a
    /// simulated crash).
    pub fn replace(&self, storage: Arc<dyn Storage>) {
        register(&self.prefix, storage);
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        unregister(&self.prefix);
    }
}

/// [`register`], undone when the returned value is dropped (also when a
/// test panics).
pub fn register_scoped(prefix: &Path, storage: Arc<dyn Storage>) -> Registration {
    register(prefix, storage);
    Registration {
        prefix: prefix.to_path_buf(),
    }
}

/// The storage for `path`: the one registered for the longest prefix of it
/// (component-wise), else [`RealStorage`].
pub fn for_path(path: &Path) -> Arc<dyn Storage> {
    if !ANY.load(Ordering::Relaxed) {
        return REAL.clone();
    }
    let r = REGISTRY.read().unwrap_or_else(|e| e.into_inner());
    r.iter()
        .filter(|(p, _)| path.starts_with(p))
        .max_by_key(|(p, _)| p.components().count())
        .map_or_else(|| REAL.clone(), |(_, s)| s.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Routing compares storages by identity, so two distinct `RealStorage`
    // allocations tell the registrations apart without the simulator.
    #[test]
    fn longest_prefix_wins_and_unregister_falls_back_to_real() {
        let a: Arc<dyn Storage> = Arc::new(RealStorage);
        let b: Arc<dyn Storage> = Arc::new(RealStorage);
        let pa = Path::new("/memfs-storage-unit/a");
        let pb = Path::new("/memfs-storage-unit/a/b");
        register(pa, a.clone());
        register(pb, b.clone());
        assert!(Arc::ptr_eq(&for_path(&pa.join("x")), &a));
        assert!(Arc::ptr_eq(&for_path(&pb.join("x")), &b));
        // Component-wise: "/…/ab" is not under "/…/a".
        assert!(Arc::ptr_eq(
            &for_path(Path::new("/memfs-storage-unit/ab")),
            &*REAL
        ));
        unregister(pb);
        assert!(Arc::ptr_eq(&for_path(&pb.join("x")), &a));
        unregister(pa);
        assert!(Arc::ptr_eq(&for_path(&pa.join("x")), &*REAL));
    }

    #[test]
    fn scoped_registration_can_be_replaced_and_ends_on_drop() {
        let pc = Path::new("/memfs-storage-unit/c");
        let a: Arc<dyn Storage> = Arc::new(RealStorage);
        let b: Arc<dyn Storage> = Arc::new(RealStorage);
        {
            let r = register_scoped(pc, a.clone());
            assert!(Arc::ptr_eq(&for_path(&pc.join("x")), &a));
            r.replace(b.clone());
            assert!(Arc::ptr_eq(&for_path(&pc.join("x")), &b));
            assert_eq!(r.prefix(), pc);
        }
        assert!(Arc::ptr_eq(&for_path(&pc.join("x")), &*REAL));
    }
}
