//! byte_ranges: entity value = byte offset in one lock file, locked shared or
//! exclusive with open file description (OFD) locks.
//!
//! Thread safety: OFD locks belong to an open file description, and one
//! description holds at most one lock per byte. If two threads shared a
//! description, the second shared lock on a byte would merge with the first
//! and either unlock would drop both (defect 4 of the reference). So every
//! lock call checks a description out of a per-instance pool and keeps it
//! until the guard releases: threads of one process then contend exactly like
//! processes do.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::sys::{self, LockKind};
use crate::{Entities, Error, Held, PerEntity, Result, Wait, Waited, acquire_in_turn, io_err};

/// One open file description of the lock file (plus a second one for
/// atomic_append, which needs a non-O_APPEND description for in-place writes).
pub(crate) struct PoolItem {
    pub(crate) file: File,
    pub(crate) aux: Option<File>,
}

pub(crate) struct ByteRanges {
    path: PathBuf,
    base: u64,
    pool: Mutex<Vec<PoolItem>>,
}

pub(crate) fn open_lock_file(path: &Path) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o666)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| io_err(path, e))
}

/// Checks that the file system supports OFD locks on `file`.
pub(crate) fn check_ofd(path: &Path, file: &File) -> Result<()> {
    match sys::ofd_is_locked(file.as_fd(), u64::MAX >> 2, 1) {
        Ok(_) => Ok(()),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP)
            ) =>
        {
            Err(Error::Unsupported {
                path: path.to_path_buf(),
                what: format!("OFD byte-range locks: {e}"),
            })
        }
        Err(e) => Err(io_err(path, e)),
    }
}

impl ByteRanges {
    /// `base` offsets every entity (memory_map's fallback keeps its bytes
    /// clear of the control bytes).
    pub(crate) fn open(path: &Path, base: u64) -> Result<Self> {
        let file = open_lock_file(path)?;
        check_ofd(path, &file)?;
        Ok(ByteRanges {
            path: path.to_path_buf(),
            base,
            pool: Mutex::new(vec![PoolItem { file, aux: None }]),
        })
    }

    fn checkout(&self) -> Result<PoolItem> {
        if let Some(item) = self.pool.lock().pop() {
            return Ok(item);
        }
        // A new description, not a dup: dup shares the description (and so
        // its locks).
        Ok(PoolItem {
            file: open_lock_file(&self.path)?,
            aux: None,
        })
    }

    fn checkin(&self, item: PoolItem) {
        self.pool.lock().push(item);
    }

    fn offset(&self, v: u64) -> u64 {
        self.base + v
    }

    pub(crate) fn lock(&self, mut entities: Entities, wait: Wait, spin: bool) -> Result<Held> {
        let item = self.checkout()?;
        match acquire_in_turn(self, &item, &mut entities, wait, spin) {
            Ok(()) => {
                let mut h = Held::new(entities);
                h.slot = Some(item);
                Ok(h)
            }
            Err(e) => {
                self.checkin(item);
                Err(e)
            }
        }
    }

    pub(crate) fn unlock(&self, mut held: Held) {
        if let Some(item) = held.slot.take() {
            for &e in held.entities.iter().rev() {
                self.release_one(&item, e);
            }
            self.checkin(item);
        }
    }
}

fn kind(e: crate::Entity) -> LockKind {
    if e.exclusive() {
        LockKind::Exclusive
    } else {
        LockKind::Shared
    }
}

impl PerEntity for ByteRanges {
    type Ctx = PoolItem;

    fn try_one(&self, ctx: &Self::Ctx, e: crate::Entity) -> Result<bool> {
        sys::ofd_setlk(ctx.file.as_fd(), kind(e), self.offset(e.value()), 1)
            .map_err(|err| io_err(&self.path, err))
    }

    fn wait_one(
        &self,
        ctx: &Self::Ctx,
        e: crate::Entity,
        wait: Wait,
        spin: bool,
    ) -> Result<Waited> {
        let off = self.offset(e.value());
        let fd = ctx.file.as_fd();
        if spin {
            loop {
                if sys::ofd_setlk(fd, kind(e), off, 1).map_err(|err| io_err(&self.path, err))? {
                    return Ok(Waited::Acquired);
                }
                if wait.expired() {
                    return Err(wait.expired_error());
                }
                std::thread::yield_now();
            }
        }
        match wait {
            Wait::Try => Err(Error::WouldBlock),
            Wait::Forever => {
                sys::ofd_setlkw(fd, kind(e), off, 1).map_err(|err| io_err(&self.path, err))?;
                Ok(Waited::Acquired)
            }
            Wait::Until(d) => {
                if sys::ofd_setlkw_until(fd, kind(e), off, 1, d)
                    .map_err(|err| io_err(&self.path, err))?
                {
                    Ok(Waited::Acquired)
                } else {
                    Err(Error::TimedOut)
                }
            }
        }
    }

    fn release_one(&self, ctx: &Self::Ctx, e: crate::Entity) {
        if let Err(err) = sys::ofd_setlk(
            ctx.file.as_fd(),
            LockKind::Unlock,
            self.offset(e.value()),
            1,
        ) {
            tracing::error!(path = %self.path.display(), %err, "byte_ranges unlock failed");
        }
    }
}
