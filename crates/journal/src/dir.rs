//! The data directory and its exclusive lock.

use crate::{Error, Result, io_err};
use nix::fcntl::{Flock, FlockArg};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

/// Name of the lock file inside a data directory.
pub const LOCK_FILE: &str = "LOCK";

/// A data directory owned by this process for as long as the value lives.
///
/// The lock is an `flock` on `LOCK`: the kernel drops it when the process dies,
/// so a crash never leaves a stale lock behind (unlike a pid file).
#[derive(Debug)]
pub struct DataDir {
    path: PathBuf,
    _lock: Flock<File>,
}

impl DataDir {
    /// Opens (creating it when `create`) and locks a data directory. A second
    /// holder, in this or another process, gets [`Error::Locked`].
    pub fn open(path: impl AsRef<Path>, create: bool) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        if create {
            std::fs::create_dir_all(&path).map_err(io_err(&path))?;
        } else if !path.is_dir() {
            return Err(Error::Invalid(format!(
                "data directory {} does not exist",
                path.display()
            )));
        }
        let lock_path = path.join(LOCK_FILE);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&lock_path)
            .map_err(io_err(&lock_path))?;
        let lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => l,
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => return Err(Error::Locked { path }),
            Err((_, e)) => {
                return Err(Error::Io {
                    path: lock_path,
                    source: std::io::Error::from(e),
                });
            }
        };
        Ok(DataDir { path, _lock: lock })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes directory entries (created, renamed, removed files) durable.
    pub fn sync(&self) -> Result<()> {
        sync_dir(&self.path)
    }
}

pub(crate) fn sync_dir(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(io_err(path))
}

/// Writes `bytes` to `dir/name` atomically: temp file, fsync, rename, fsync dir.
pub fn write_file_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let tmp = dir.join(format!("{name}.tmp"));
    let dst = dir.join(name);
    let mut f = File::create(&tmp).map_err(io_err(&tmp))?;
    f.write_all(bytes).map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, &dst).map_err(io_err(&dst))?;
    sync_dir(dir)
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
