//! lock_files: one file per entity in a directory, named by the entity value
//! in 16 hex digits, created with O_EXCL and removed on unlock. Shared
//! requests behave as exclusive.
//!
//! Each file records its owner (pid, process start time, boot id). A file
//! whose owner is dead is broken, but only under a per-entity OFD lock on
//! `.break` in the directory, and only after re-reading the file under that
//! lock: two breakers can then never remove a live owner's fresh file.

use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use crate::sys::{self, Liveness, LockKind, ProcessId};
use crate::{
    Entities, Entity, Error, Held, PerEntity, Result, Wait, Waited, acquire_in_turn, io_err,
};

const MAGIC: &str = "memfs-lock-file v1";
/// A file with no complete owner record (its creator died between create and
/// write) counts as abandoned after this long.
const BIRTH_GRACE: Duration = Duration::from_secs(2);

pub(crate) struct LockFiles {
    dir: PathBuf,
    dirfd: OwnedFd,
    break_file: File,
    record: Vec<u8>,
}

fn name(e: Entity) -> [u8; 17] {
    let mut b = [0u8; 17];
    let s = format!("{:016x}", e.value());
    b[..16].copy_from_slice(s.as_bytes());
    b
}

fn owner_record(me: ProcessId) -> Vec<u8> {
    format!(
        "{MAGIC}\npid {}\nstart {}\nboot {}\n",
        me.pid, me.start, me.boot
    )
    .into_bytes()
}

fn parse_owner(s: &str) -> Option<ProcessId> {
    let mut lines = s.lines();
    if lines.next()? != MAGIC {
        return None;
    }
    let mut field = |k: &str| -> Option<u64> { lines.next()?.strip_prefix(k)?.trim().parse().ok() };
    let pid = field("pid ")? as u32;
    let start = field("start ")?;
    let boot = field("boot ")?;
    Some(ProcessId { pid, start, boot })
}

impl LockFiles {
    pub(crate) fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
        let c =
            CString::new(dir.as_os_str().as_encoded_bytes()).map_err(|_| Error::Unsupported {
                path: dir.to_path_buf(),
                what: "path contains a NUL byte".into(),
            })?;
        // SAFETY: c is a valid C string.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io_err(dir, std::io::Error::last_os_error()));
        }
        // SAFETY: fd was just returned by open and is owned by nobody else.
        let dirfd = unsafe { OwnedFd::from_raw_fd(fd) };
        let bpath = dir.join(".break");
        let break_file = crate::byte_ranges::open_lock_file(&bpath)?;
        crate::byte_ranges::check_ofd(&bpath, &break_file)?;
        Ok(LockFiles {
            dir: dir.to_path_buf(),
            dirfd,
            break_file,
            record: owner_record(sys::current_process()),
        })
    }

    fn err(&self, e: Entity, source: std::io::Error) -> Error {
        io_err(&self.dir.join(format!("{:016x}", e.value())), source)
    }

    pub(crate) fn lock(&self, mut entities: Entities, wait: Wait, spin: bool) -> Result<Held> {
        acquire_in_turn(self, &(), &mut entities, wait, spin)?;
        Ok(Held::new(entities))
    }

    pub(crate) fn unlock(&self, held: Held) {
        for &e in held.entities.iter().rev() {
            self.release_one(&(), e);
        }
    }

    fn open_existing(&self, e: Entity) -> std::io::Result<Option<File>> {
        let n = name(e);
        // SAFETY: dirfd is valid; n is NUL-terminated.
        let fd = unsafe {
            libc::openat(
                self.dirfd.as_raw_fd(),
                n.as_ptr().cast(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let err = std::io::Error::last_os_error();
            return if err.raw_os_error() == Some(libc::ENOENT) {
                Ok(None)
            } else {
                Err(err)
            };
        }
        // SAFETY: fd is freshly opened and owned here.
        Ok(Some(unsafe { File::from_raw_fd(fd) }))
    }

    /// Is the file for `e` left behind by a dead owner?
    fn is_stale(&self, e: Entity) -> std::io::Result<bool> {
        let Some(mut f) = self.open_existing(e)? else {
            return Ok(false);
        };
        let mut s = String::new();
        if f.read_to_string(&mut s).is_err() {
            s.clear();
        }
        match parse_owner(&s) {
            Some(owner) => Ok(sys::liveness(owner) == Liveness::Dead),
            None => {
                // Incomplete record: its creator is between create and write,
                // or died there.
                let age = f
                    .metadata()?
                    .modified()
                    .ok()
                    .and_then(|m| SystemTime::now().duration_since(m).ok())
                    .unwrap_or(Duration::ZERO);
                Ok(age > BIRTH_GRACE)
            }
        }
    }

    /// Breaks the file of `e` if its owner is dead. Returns true if removed.
    fn break_if_stale(&self, e: Entity) -> Result<bool> {
        if !self.is_stale(e).map_err(|err| self.err(e, err))? {
            return Ok(false);
        }
        let bpath = || self.dir.join(".break");
        let fd = self.break_file.as_fd();
        // Serialise breakers of this entity; the lock dies with its holder.
        sys::ofd_setlkw(fd, LockKind::Exclusive, e.value(), 1)
            .map_err(|err| io_err(&bpath(), err))?;
        let result = (|| {
            // Re-check under the lock: another breaker may have removed the
            // dead file and a live owner created a new one since.
            if !self.is_stale(e)? {
                return Ok(false);
            }
            let n = name(e);
            // SAFETY: valid dirfd and NUL-terminated name.
            if unsafe { libc::unlinkat(self.dirfd.as_raw_fd(), n.as_ptr().cast(), 0) } != 0 {
                let err = std::io::Error::last_os_error();
                if err.raw_os_error() != Some(libc::ENOENT) {
                    return Err(err);
                }
            }
            tracing::warn!(dir = %self.dir.display(), entity = ?e, "broke lock file of a dead owner");
            Ok(true)
        })()
        .map_err(|err| self.err(e, err));
        let _ = sys::ofd_setlk(fd, LockKind::Unlock, e.value(), 1);
        result
    }
}

impl PerEntity for LockFiles {
    type Ctx = ();

    fn try_one(&self, _: &(), e: Entity) -> Result<bool> {
        let n = name(e);
        // SAFETY: valid dirfd and NUL-terminated name.
        let fd = unsafe {
            libc::openat(
                self.dirfd.as_raw_fd(),
                n.as_ptr().cast(),
                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
                0o644,
            )
        };
        if fd < 0 {
            let err = std::io::Error::last_os_error();
            return if err.raw_os_error() == Some(libc::EEXIST) {
                Ok(false)
            } else {
                Err(self.err(e, err))
            };
        }
        // SAFETY: fd is freshly created and owned here.
        let f = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: valid fd and buffer.
        let w = unsafe {
            libc::write(
                f.as_raw_fd(),
                self.record.as_ptr().cast(),
                self.record.len(),
            )
        };
        if w != self.record.len() as isize {
            let err = if w < 0 {
                std::io::Error::last_os_error()
            } else {
                std::io::ErrorKind::WriteZero.into()
            };
            drop(f);
            self.release_one(&(), e);
            return Err(self.err(e, err));
        }
        Ok(true)
    }

    fn wait_one(&self, _: &(), e: Entity, wait: Wait, spin: bool) -> Result<Waited> {
        // Nothing to sleep on portably (this algorithm must work on network
        // file systems): poll with exponential backoff, capped so a release
        // is noticed quickly, and check for a dead owner now and then.
        let mut sleep = Duration::from_micros(20);
        let mut polls: u32 = 0;
        loop {
            if polls % 32 == 0 && self.break_if_stale(e)? {
                return Ok(Waited::Retry);
            }
            if self.try_one(&(), e)? {
                return Ok(Waited::Acquired);
            }
            polls += 1;
            let now = Instant::now();
            let mut nap = sleep;
            match wait {
                Wait::Try => return Err(Error::WouldBlock),
                Wait::Until(d) => {
                    if now >= d {
                        return Err(Error::TimedOut);
                    }
                    nap = nap.min(d - now);
                }
                Wait::Forever => {}
            }
            if spin {
                std::thread::yield_now();
            } else {
                std::thread::sleep(nap);
                sleep = (sleep * 2).min(Duration::from_millis(2));
            }
        }
    }

    fn release_one(&self, _: &(), e: Entity) {
        let n = name(e);
        // SAFETY: valid dirfd and NUL-terminated name.
        if unsafe { libc::unlinkat(self.dirfd.as_raw_fd(), n.as_ptr().cast(), 0) } != 0 {
            let err = std::io::Error::last_os_error();
            tracing::error!(dir = %self.dir.display(), entity = ?e, %err, "lock_files unlock failed");
        }
    }

    fn recover(&self, _: &(), e: Entity) -> Result<bool> {
        self.break_if_stale(e)
    }
}
