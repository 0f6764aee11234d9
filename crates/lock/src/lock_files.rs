//! lock_files: one file per entity in a directory, named by the entity value
//! in 16 hex digits, and removed on unlock. Shared requests behave as
//! exclusive.
//!
//! Ownership is proved by an OS lock, not by a pid: each instance creates an
//! owner file `.owner-<random>`, takes an exclusive OFD lock on it for its
//! whole life and writes its record into it, and only then locks entities by
//! hard-linking that file to their names (`link` fails with EEXIST when the
//! name exists, as `O_EXCL` would). The kernel drops the OFD lock when the
//! owner dies, whatever its pid namespace, before it is even reaped; a
//! waiter judges an owner dead only if it can lock the file itself. A pid is
//! meaningless outside its namespace, so it is only consulted (to keep a
//! live owner alive, never to kill one) in our own namespace.
//!
//! On file systems without hard links each entity file is created with
//! `O_EXCL`, locked and written (the "direct" mode); its birth window
//! (created, not yet locked and written) is judged by age, as before.
//!
//! A file whose owner is dead is broken under a per-entity OFD lock on
//! `.break` in the directory, after re-judging the file under that lock: two
//! breakers can then never remove a live owner's fresh file.

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

use crate::sys::{self, Liveness, LockKind, ProcessId};
use crate::{
    Entities, Entity, Error, Held, PerEntity, Result, Wait, Waited, acquire_in_turn, io_err,
};

/// First line of every owner record. The version-2 fields follow the version-1
/// ones, so that older readers still parse the pid, start and boot.
const MAGIC: &str = "memfs-lock-file v1";
/// Last line of a version-2 record: its owner holds an OFD lock on the file.
const OFD_MARK: &str = "owner-lock ofd";
/// A file with no complete owner record (its creator died between create and
/// write) counts as abandoned after this long. Only files made in direct mode
/// or by older versions have such a window.
const BIRTH_GRACE: Duration = Duration::from_secs(2);
/// An owner file never completed (its creator died inside `open`) is removed
/// after this long.
const OWNER_GRACE: Duration = Duration::from_secs(60);
const OWNER_PREFIX: &str = ".owner-";

pub(crate) struct LockFiles {
    dir: PathBuf,
    dirfd: OwnedFd,
    break_file: File,
    record: Vec<u8>,
    /// Link mode: our owner file (name, NUL-terminated) and the description
    /// holding its OFD lock. None: direct mode.
    owner: Option<([u8; 24], File)>,
    /// Entities held in direct mode: the description that locks each file.
    direct: Mutex<HashMap<u64, File>>,
}

fn name(e: Entity) -> [u8; 17] {
    let mut b = [0u8; 17];
    let s = format!("{:016x}", e.value());
    b[..16].copy_from_slice(s.as_bytes());
    b
}

fn owner_record(me: ProcessId, pidns: u64) -> Vec<u8> {
    format!(
        "{MAGIC}\npid {}\nstart {}\nboot {}\npidns {pidns}\n{OFD_MARK}\n",
        me.pid, me.start, me.boot
    )
    .into_bytes()
}

/// A parsed owner record.
#[derive(Debug, PartialEq, Eq)]
struct Owner {
    id: ProcessId,
    /// Version 2: pid namespace inode and the OFD lock promise.
    pidns: Option<u64>,
}

fn parse_owner(s: &str) -> Option<Owner> {
    let mut lines = s.lines();
    if lines.next()? != MAGIC {
        return None;
    }
    let mut field = |k: &str| -> Option<u64> { lines.next()?.strip_prefix(k)?.trim().parse().ok() };
    let pid = field("pid ")? as u32;
    let start = field("start ")?;
    let boot = field("boot ")?;
    let v2 = field("pidns ");
    let id = ProcessId { pid, start, boot };
    match v2 {
        // Version 2 counts only once complete (written in one `write`, but a
        // reader must not trust a torn one).
        Some(ns) if lines.next() == Some(OFD_MARK) => Some(Owner {
            id,
            pidns: Some(ns),
        }),
        Some(_) => None,
        None => Some(Owner { id, pidns: None }),
    }
}

/// What a prober concluded about an entity file.
enum Verdict {
    Free,
    Alive,
    /// Dead owner; the description holds a shared OFD lock on the file.
    Dead(File),
}

fn cstring(dir: &Path) -> Result<CString> {
    CString::new(dir.as_os_str().as_encoded_bytes()).map_err(|_| Error::Unsupported {
        path: dir.to_path_buf(),
        what: "path contains a NUL byte".into(),
    })
}

fn age(f: &File) -> std::io::Result<Duration> {
    Ok(f.metadata()?
        .modified()
        .ok()
        .and_then(|m| SystemTime::now().duration_since(m).ok())
        .unwrap_or(Duration::ZERO))
}

impl LockFiles {
    pub(crate) fn open(dir: &Path, without_links: bool) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
        let c = cstring(dir)?;
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
        let mut m = LockFiles {
            dir: dir.to_path_buf(),
            dirfd,
            break_file,
            record: owner_record(sys::current_process(), sys::pid_ns()),
            owner: None,
            direct: Mutex::new(HashMap::new()),
        };
        m.collect_dead_owner_files();
        if !without_links {
            m.owner = m.make_owner_file().map_err(|e| io_err(dir, e))?;
        }
        Ok(m)
    }

    fn err(&self, e: Entity, source: std::io::Error) -> Error {
        io_err(&self.dir.join(format!("{:016x}", e.value())), source)
    }

    fn openat(&self, n: &[u8], flags: libc::c_int, mode: libc::c_uint) -> std::io::Result<File> {
        debug_assert_eq!(n.last(), Some(&0));
        // SAFETY: dirfd is valid; n is NUL-terminated.
        let fd = unsafe {
            libc::openat(
                self.dirfd.as_raw_fd(),
                n.as_ptr().cast(),
                flags | libc::O_CLOEXEC,
                mode,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is freshly opened and owned here.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    fn unlinkat(&self, n: &[u8]) -> std::io::Result<()> {
        // SAFETY: valid dirfd and NUL-terminated name.
        if unsafe { libc::unlinkat(self.dirfd.as_raw_fd(), n.as_ptr().cast(), 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn linkat(&self, from: &[u8], to: &[u8]) -> std::io::Result<()> {
        let d = self.dirfd.as_raw_fd();
        // SAFETY: valid dirfd and NUL-terminated names.
        if unsafe { libc::linkat(d, from.as_ptr().cast(), d, to.as_ptr().cast(), 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Creates, locks and fills our owner file, and checks that the file
    /// system can hard-link it. None: no hard links here (direct mode).
    fn make_owner_file(&self) -> std::io::Result<Option<([u8; 24], File)>> {
        let mut n = [0u8; 24];
        let s = format!("{OWNER_PREFIX}{:016x}", rand::random::<u64>());
        n[..23].copy_from_slice(s.as_bytes());
        let f = self.openat(&n, libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o644)?;
        let r = (|| {
            // Lock before writing: a complete record promises the lock.
            if !sys::ofd_setlk(f.as_fd(), LockKind::Exclusive, 0, 1)? {
                return Err(std::io::Error::other(
                    "fresh owner file locked by someone else",
                ));
            }
            use std::io::Write;
            (&f).write_all(&self.record)?;
            let mut probe = [0u8; 24];
            let p = format!(".probe-{:016x}", rand::random::<u64>());
            probe[..23].copy_from_slice(p.as_bytes());
            match self.linkat(&n, &probe) {
                Ok(()) => {
                    let _ = self.unlinkat(&probe);
                    Ok(true)
                }
                Err(e) => {
                    tracing::info!(dir = %self.dir.display(), err = %e, "lock_files: no hard links, creating entity files directly");
                    Ok(false)
                }
            }
        })();
        match r {
            Ok(true) => Ok(Some((n, f))),
            Ok(false) => {
                let _ = self.unlinkat(&n);
                Ok(None)
            }
            Err(e) => {
                let _ = self.unlinkat(&n);
                Err(e)
            }
        }
    }

    /// Removes owner files of dead instances that no entity links to any
    /// more (their entity files are broken by waiters).
    fn collect_dead_owner_files(&self) {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for ent in rd.flatten() {
            let fname = ent.file_name();
            let Some(fname) = fname.to_str() else {
                continue;
            };
            if !fname.starts_with(OWNER_PREFIX) || fname.len() != 23 {
                continue;
            }
            let mut n = fname.as_bytes().to_vec();
            n.push(0);
            let Ok(mut f) = self.openat(&n, libc::O_RDONLY, 0) else {
                continue;
            };
            if !matches!(sys::ofd_setlk(f.as_fd(), LockKind::Shared, 0, 1), Ok(true)) {
                continue; // a live owner
            }
            let mut s = String::new();
            let _ = f.read_to_string(&mut s);
            let complete = parse_owner(&s).is_some_and(|o| o.pidns.is_some());
            let old = age(&f).is_ok_and(|a| a > OWNER_GRACE);
            let unlinked = f.metadata().is_ok_and(|m| m.nlink() <= 1);
            if unlinked && (complete || old) {
                let _ = self.unlinkat(&n);
            }
        }
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

    /// Judges the file of `e` as it is now.
    fn judge(&self, e: Entity) -> std::io::Result<Verdict> {
        let mut f = match self.openat(&name(e), libc::O_RDONLY, 0) {
            Ok(f) => f,
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return Ok(Verdict::Free),
            Err(err) => return Err(err),
        };
        // A live owner (version 2) holds an exclusive lock on the file.
        if !sys::ofd_setlk(f.as_fd(), LockKind::Shared, 0, 1)? {
            return Ok(Verdict::Alive);
        }
        let mut s = String::new();
        if f.read_to_string(&mut s).is_err() {
            s.clear();
        }
        let dead = match parse_owner(&s) {
            Some(Owner {
                id,
                pidns: Some(ns),
            }) => {
                if id.boot != sys::boot_id_hash() {
                    // Another machine (sharing a network file system): its
                    // locks may not reach us, so an unlocked file proves
                    // nothing.
                    false
                } else if ns == sys::pid_ns() && sys::proc_is_ours() {
                    // Same namespace: the pid can be checked, but only to keep
                    // an owner alive (it closed its lock description without
                    // unlocking, e.g. a leaked guard of a dropped instance).
                    sys::liveness(id) == Liveness::Dead
                } else {
                    // The kernel dropped the lock: the owner is dead,
                    // whatever its namespace.
                    true
                }
            }
            // An older version's record (no OS lock): pid, start and boot.
            Some(Owner { id, pidns: None }) => sys::liveness(id) == Liveness::Dead,
            // Incomplete record: its creator is between create and write, or
            // died there (direct mode and older versions only).
            None => age(&f)? > BIRTH_GRACE,
        };
        Ok(if dead {
            Verdict::Dead(f)
        } else {
            Verdict::Alive
        })
    }

    /// Breaks the file of `e` if its owner is dead. Returns true if removed.
    fn break_if_stale(&self, e: Entity) -> Result<bool> {
        if !matches!(
            self.judge(e).map_err(|err| self.err(e, err))?,
            Verdict::Dead(_)
        ) {
            return Ok(false);
        }
        let bpath = || self.dir.join(".break");
        let fd = self.break_file.as_fd();
        // Serialise breakers of this entity; the lock dies with its holder.
        sys::ofd_setlkw(fd, LockKind::Exclusive, e.value(), 1)
            .map_err(|err| io_err(&bpath(), err))?;
        let result = (|| {
            // Re-judge under the lock: another breaker may have removed the
            // dead file and a live owner created a new one since. Dead owners
            // never unlink and breakers are serialised, so the name keeps
            // naming the file judged here until we unlink it.
            let Verdict::Dead(_proof) = self.judge(e)? else {
                return Ok(false);
            };
            if let Err(err) = self.unlinkat(&name(e))
                && err.raw_os_error() != Some(libc::ENOENT)
            {
                return Err(err);
            }
            tracing::warn!(dir = %self.dir.display(), entity = ?e, "broke lock file of a dead owner");
            Ok(true)
        })()
        .map_err(|err| self.err(e, err));
        let _ = sys::ofd_setlk(fd, LockKind::Unlock, e.value(), 1);
        result
    }

    /// Direct mode: create the file, lock it, then write the record.
    fn try_direct(&self, e: Entity) -> Result<bool> {
        let f = match self.openat(&name(e), libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o644) {
            Ok(f) => f,
            Err(err) if err.raw_os_error() == Some(libc::EEXIST) => return Ok(false),
            Err(err) => return Err(self.err(e, err)),
        };
        let r = (|| {
            // May wait for a prober that holds its shared lock for a moment.
            sys::ofd_setlkw(f.as_fd(), LockKind::Exclusive, 0, 1)?;
            use std::io::Write;
            (&f).write_all(&self.record)
        })();
        if let Err(err) = r {
            let _ = self.unlinkat(&name(e));
            return Err(self.err(e, err));
        }
        self.direct.lock().insert(e.value(), f);
        Ok(true)
    }
}

impl Drop for LockFiles {
    fn drop(&mut self) {
        if let Some((n, _)) = &self.owner {
            // Entity links of leaked guards keep the file (and so the record)
            // reachable; its lock goes with our description.
            let _ = self.unlinkat(n);
        }
    }
}

impl PerEntity for LockFiles {
    type Ctx = ();

    fn try_one(&self, _: &(), e: Entity) -> Result<bool> {
        let Some((owner, _)) = &self.owner else {
            return self.try_direct(e);
        };
        match self.linkat(owner, &name(e)) {
            Ok(()) => Ok(true),
            Err(err) if err.raw_os_error() == Some(libc::EEXIST) => Ok(false),
            // Too many links to our owner file: this one is made directly.
            Err(err) if err.raw_os_error() == Some(libc::EMLINK) => self.try_direct(e),
            Err(err) => Err(self.err(e, err)),
        }
    }

    fn wait_one(&self, _: &(), e: Entity, wait: Wait, spin: bool) -> Result<Waited> {
        // Nothing to sleep on portably (this algorithm must work on network
        // file systems): poll with exponential backoff, capped so a release
        // is noticed quickly, and check for a dead owner now and then.
        let mut sleep = Duration::from_micros(20);
        let mut polls: u32 = 0;
        loop {
            if polls.is_multiple_of(32) && self.break_if_stale(e)? {
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
        // Unlink before closing a direct file's description: a prober must
        // never find our name unlocked with our complete record in it.
        let direct = self.direct.lock().remove(&e.value());
        if let Err(err) = self.unlinkat(&n) {
            tracing::error!(dir = %self.dir.display(), entity = ?e, %err, "lock_files unlock failed");
        }
        drop(direct);
    }

    fn recover(&self, _: &(), e: Entity) -> Result<bool> {
        self.break_if_stale(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_records_parse_both_versions() {
        let id = ProcessId {
            pid: 42,
            start: 7,
            boot: 9,
        };
        let v2 = String::from_utf8(owner_record(id, 4026531836)).unwrap();
        assert_eq!(
            parse_owner(&v2),
            Some(Owner {
                id,
                pidns: Some(4026531836)
            })
        );
        let v1 = format!("{MAGIC}\npid 42\nstart 7\nboot 9\n");
        assert_eq!(parse_owner(&v1), Some(Owner { id, pidns: None }));
        // A torn version-2 record is incomplete, not version 1.
        let torn = &v2[..v2.len() - 4];
        assert_eq!(parse_owner(torn), None);
        assert_eq!(parse_owner(""), None);
        assert_eq!(parse_owner("garbage\n"), None);
    }
}
