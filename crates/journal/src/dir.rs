//! The data directory and its exclusive lock.

use crate::storage::{self, DirLock, OpenMode, Storage};
use crate::{Error, Result, io_err};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Name of the lock file inside a data directory.
pub const LOCK_FILE: &str = "LOCK";

/// A data directory owned by this process for as long as the value lives.
///
/// The lock is an `flock` on `LOCK`: the kernel drops it when the process dies,
/// so a crash never leaves a stale lock behind (unlike a pid file).
#[derive(Debug)]
pub struct DataDir {
    path: PathBuf,
    storage: Arc<dyn Storage>,
    _lock: Box<dyn DirLock>,
}

impl DataDir {
    /// Opens (creating it when `create`) and locks a data directory. A second
    /// holder, in this or another process, gets [`Error::Locked`].
    pub fn open(path: impl AsRef<Path>, create: bool) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let storage = storage::for_path(&path);
        if create {
            // The directories created here must be durable before anything in
            // them is: sync the parent of each one created.
            let mut missing = Vec::new();
            let mut at = path.as_path();
            while !storage.is_dir(at) {
                missing.push(at);
                match at.parent() {
                    Some(p) if !p.as_os_str().is_empty() => at = p,
                    _ => break,
                }
            }
            storage.create_dir_all(&path).map_err(io_err(&path))?;
            for d in missing {
                let parent = match d.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p,
                    _ => Path::new("."),
                };
                sync_dir_with(&*storage, parent)?;
            }
        } else if !storage.is_dir(&path) {
            return Err(Error::Invalid(format!(
                "data directory {} does not exist",
                path.display()
            )));
        }
        let lock_path = path.join(LOCK_FILE);
        let lock = match storage.lock(&lock_path) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(Error::Locked { path });
            }
            Err(e) => return Err(io_err(&lock_path)(e)),
        };
        Ok(DataDir {
            path,
            storage,
            _lock: lock,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes directory entries (created, renamed, removed files) durable.
    pub fn sync(&self) -> Result<()> {
        sync_dir_with(&*self.storage, &self.path)
    }

    /// The storage this directory lives on (resolved once at open).
    pub(crate) fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }
}

pub(crate) fn sync_dir_with(storage: &dyn Storage, path: &Path) -> Result<()> {
    storage.sync_dir(path).map_err(io_err(path))
}

/// Writes `bytes` to `dir/name` atomically: temp file, fsync, rename, fsync dir.
pub fn write_file_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let st = storage::for_path(dir);
    let tmp = dir.join(format!("{name}.tmp"));
    let dst = dir.join(name);
    let mut f = st
        .open(&tmp, OpenMode::CreateTruncate)
        .map_err(io_err(&tmp))?;
    f.write_all(bytes).map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    drop(f);
    st.rename(&tmp, &dst).map_err(io_err(&dst))?;
    sync_dir_with(&*st, dir)
}

/// Reads `dir/name`, or `None` when it does not exist.
pub fn read_file(dir: &Path, name: &str) -> Result<Option<Vec<u8>>> {
    let path = dir.join(name);
    match storage::for_path(&path).read(&path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(&path)(e)),
    }
}

/// Removes `dir/name` if it exists and makes the removal durable.
pub fn remove_file(dir: &Path, name: &str) -> Result<()> {
    let path = dir.join(name);
    let st = storage::for_path(&path);
    match st.remove_file(&path) {
        Ok(()) => sync_dir_with(&*st, dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err(&path)(e)),
    }
}

/// Whether `dir/name` exists.
pub fn exists(dir: &Path, name: &str) -> Result<bool> {
    let path = dir.join(name);
    storage::for_path(&path)
        .exists(&path)
        .map_err(io_err(&path))
}

/// Names of the entries of `dir` (sorted; names that are not UTF-8 are
/// skipped: the journal never creates such names).
pub fn list_names(dir: &Path) -> Result<Vec<String>> {
    let mut v: Vec<String> = storage::for_path(dir)
        .read_dir(dir)
        .map_err(io_err(dir))?
        .into_iter()
        .filter_map(|n| n.into_string().ok())
        .collect();
    v.sort();
    Ok(v)
}

/// Length of the file at `path`.
pub fn file_len(path: &Path) -> Result<u64> {
    storage::for_path(path).len(path).map_err(io_err(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_holder_is_refused_until_first_drops() {
        let t = tempfile::tempdir().unwrap();
        let a = DataDir::open(t.path(), true).unwrap();
        let err = DataDir::open(t.path(), false).unwrap_err();
        assert!(matches!(err, Error::Locked { .. }), "{err}");
        assert!(err.to_string().contains("in use by another process"));
        drop(a);
        DataDir::open(t.path(), false).unwrap();
    }

    #[test]
    fn missing_dir_without_create_is_an_error() {
        let t = tempfile::tempdir().unwrap();
        let err = DataDir::open(t.path().join("nope"), false).unwrap_err();
        assert!(err.to_string().contains("does not exist"));
    }
}
