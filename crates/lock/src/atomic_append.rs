//! atomic_append: every lock request is one 128-byte record appended to the
//! lock file with O_APPEND; a request owns its entities when no earlier live
//! record conflicts with it. See docs/lock.md for the format.
//!
//! - Ownership of a record: its writer holds an exclusive OFD lock on the
//!   record's 128 bytes from just after the append until it has zeroed the
//!   record at unlock. A waiter sleeps in the kernel by asking for a shared
//!   lock on the blocking record (F_OFD_SETLKW): no spinning, and the kernel
//!   wakes it when the owner unlocks or dies.
//! - Dead owners: a valid record with nobody holding its byte range belongs
//!   either to a writer between its append and its lock (microseconds) or to
//!   a dead process. Each instance holds an exclusive OFD lock on its own
//!   owner byte (`OWNER_BASE + token`, token in the record) for its whole
//!   life; the kernel drops it when the process exits (before the reap,
//!   whatever its pid namespace), so an unlocked owner byte proves death.
//!   Records of older versions carry a pid instead, judged by /proc.
//! - Deadlock freedom: a request only ever waits for earlier records, so no
//!   cycle of waiters exists; it never needs the release-and-retry protocol.
//! - Growth: the header keeps the first record that may still be live, so
//!   scans start there; space before it is punched out (it reads back as
//!   zeros, i.e. free records), and the file is truncated when the last user
//!   leaves or the first one arrives.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::byte_ranges::{PoolItem, check_ofd, open_lock_file};
use crate::sys::{self, Liveness, LockKind, ProcessId};
use crate::{Entities, Entity, Error, Held, Result, Wait, io_err, mix64};

pub(crate) const RECORD: u64 = 128;
pub(crate) const MAX_ENTITIES: usize = 12;
const MAGIC: u64 = u64::from_le_bytes(*b"MFSAPND1");
/// Byte 0 of the header: every user holds it shared for its lifetime; the
/// first and last user take it exclusively to reset the file.
const USERS_BYTE: u64 = 0;
/// Punch the dead prefix out in steps of this size.
const PUNCH_STEP: u64 = 1 << 20;
/// Only rewrite the header once the first live record moved this far.
const HEADER_STEP: u64 = 16 * RECORD;
/// Owner bytes: `OWNER_BASE + token`, far beyond any record.
const OWNER_BASE: u64 = 1 << 62;
const TOKEN_BITS: u32 = 40;
/// Version-2 records store `boot hash ^ V2_TAG` in their boot field and the
/// owner token in place of the start time. Older readers then see a foreign
/// boot and treat the record as live (never as dead, which the pid check
/// across pid namespaces would wrongly conclude).
const V2_TAG: u64 = u64::from_le_bytes(*b"mfs-ofd2");
/// Sleep bounds while a record's writer is between its append and its lock.
const BACKOFF_MIN: std::time::Duration = std::time::Duration::from_micros(20);
const BACKOFF_MAX: std::time::Duration = std::time::Duration::from_millis(2);

pub(crate) struct AtomicAppend {
    path: PathBuf,
    /// Holds the lifetime shared lock on USERS_BYTE.
    users: File,
    pool: Mutex<Vec<PoolItem>>,
    me: ProcessId,
    punched: AtomicU64,
    /// First record that may be live, as far as this instance knows. Scans
    /// start here; it only grows (records before it stay free).
    first: AtomicU64,
    /// Last first-live value this instance wrote to the header.
    header_at: AtomicU64,
}

fn checksum(body: &[u8]) -> u64 {
    let mut h = 0x9e37_79b9_7f4a_7c15u64;
    for c in body.chunks_exact(8) {
        h = mix64(h ^ u64::from_le_bytes(c.try_into().unwrap()));
    }
    // 0 marks a free record: never produce it for a valid one.
    h.max(1)
}

fn encode(me: ProcessId, entities: &[Entity]) -> [u8; RECORD as usize] {
    let mut r = [0u8; RECORD as usize];
    r[8..12].copy_from_slice(&me.pid.to_le_bytes());
    r[12..16].copy_from_slice(&(entities.len() as u32).to_le_bytes());
    r[16..24].copy_from_slice(&me.start.to_le_bytes());
    r[24..32].copy_from_slice(&me.boot.to_le_bytes());
    for (i, e) in entities.iter().enumerate() {
        r[32 + i * 8..40 + i * 8].copy_from_slice(&e.raw().to_le_bytes());
    }
    let c = checksum(&r[8..]);
    r[0..8].copy_from_slice(&c.to_le_bytes());
    r
}

struct Record<'a> {
    bytes: &'a [u8],
}

impl<'a> Record<'a> {
    /// A valid (possibly live) record, or None for a free, torn or zeroed one.
    fn parse(bytes: &'a [u8]) -> Option<Self> {
        let c = u64::from_le_bytes(bytes[0..8].try_into().unwrap());
        if c == 0 || c != checksum(&bytes[8..]) {
            return None;
        }
        let n = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
        if n == 0 || n > MAX_ENTITIES {
            return None;
        }
        Some(Record { bytes })
    }
    fn owner(&self) -> ProcessId {
        let b = self.bytes;
        ProcessId {
            pid: u32::from_le_bytes(b[8..12].try_into().unwrap()),
            start: u64::from_le_bytes(b[16..24].try_into().unwrap()),
            boot: u64::from_le_bytes(b[24..32].try_into().unwrap()),
        }
    }
    fn entities(&self) -> impl Iterator<Item = Entity> + '_ {
        let n = u32::from_le_bytes(self.bytes[12..16].try_into().unwrap()) as usize;
        (0..n).map(|i| {
            Entity::from_raw(u64::from_le_bytes(
                self.bytes[32 + i * 8..40 + i * 8].try_into().unwrap(),
            ))
        })
    }
    fn conflicts(&self, mine: &[Entity]) -> bool {
        self.entities().any(|t| {
            mine.iter()
                .any(|m| m.value() == t.value() && (m.exclusive() || t.exclusive()))
        })
    }
}

fn header(first_live: u64) -> [u8; RECORD as usize] {
    let mut h = [0u8; RECORD as usize];
    h[8..16].copy_from_slice(&MAGIC.to_le_bytes());
    h[16..24].copy_from_slice(&first_live.to_le_bytes());
    let c = checksum(&h[8..]);
    h[0..8].copy_from_slice(&c.to_le_bytes());
    h
}

fn parse_header(h: &[u8]) -> Option<u64> {
    if h.len() < RECORD as usize {
        return None;
    }
    let c = u64::from_le_bytes(h[0..8].try_into().unwrap());
    if c != checksum(&h[8..]) || u64::from_le_bytes(h[8..16].try_into().unwrap()) != MAGIC {
        return None;
    }
    let first = u64::from_le_bytes(h[16..24].try_into().unwrap());
    (first >= RECORD && first % RECORD == 0).then_some(first)
}

impl AtomicAppend {
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let users = open_lock_file(path)?;
        check_ofd(path, &users)?;
        let fd = users.as_fd();
        let e = |err| io_err(path, err);
        let mut first = RECORD;
        // Our owner byte, for our whole life: its lock is our liveness.
        let mut token = None;
        for _ in 0..64 {
            let t = rand::random::<u64>() >> (64 - TOKEN_BITS);
            if sys::ofd_setlk(fd, LockKind::Exclusive, OWNER_BASE + t, 1).map_err(e)? {
                token = Some(t);
                break;
            }
        }
        let Some(token) = token else {
            return Err(Error::Unsupported {
                path: path.to_path_buf(),
                what: "no free atomic_append owner byte after 64 random tries".into(),
            });
        };
        if sys::ofd_setlk(fd, LockKind::Exclusive, USERS_BYTE, 1).map_err(e)? {
            // First user: whatever is in the file was left by dead users.
            Self::reset(&users).map_err(e)?;
            // Atomic conversion on the same description: never unlocked in between.
            sys::ofd_setlk(fd, LockKind::Shared, USERS_BYTE, 1).map_err(e)?;
        } else {
            // Waits only while a first/last user resets the file.
            sys::ofd_setlkw(fd, LockKind::Shared, USERS_BYTE, 1).map_err(e)?;
            let mut h = [0u8; RECORD as usize];
            let n = users.read_at(&mut h, 0).map_err(e)?;
            match parse_header(&h[..n]) {
                Some(f) => first = f,
                // Torn or missing header: only the scan start is lost.
                None => users.write_all_at(&header(RECORD), 0).map_err(e)?,
            }
        }
        Ok(AtomicAppend {
            path: path.to_path_buf(),
            users,
            pool: Mutex::new(Vec::new()),
            me: ProcessId {
                pid: std::process::id(),
                start: token,
                boot: sys::boot_id_hash() ^ V2_TAG,
            },
            punched: AtomicU64::new(0),
            first: AtomicU64::new(first),
            header_at: AtomicU64::new(first),
        })
    }

    fn reset(f: &File) -> std::io::Result<()> {
        f.set_len(RECORD)?;
        f.write_all_at(&header(RECORD), 0)
    }

    fn err(&self, e: std::io::Error) -> Error {
        io_err(&self.path, e)
    }

    fn checkout(&self) -> Result<PoolItem> {
        if let Some(i) = self.pool.lock().pop() {
            return Ok(i);
        }
        use std::os::unix::fs::OpenOptionsExt;
        let append = std::fs::OpenOptions::new()
            .append(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&self.path)
            .map_err(|e| self.err(e))?;
        let rw = open_lock_file(&self.path)?;
        Ok(PoolItem {
            file: rw,
            aux: Some(append),
        })
    }

    pub(crate) fn lock(&self, entities: Entities, wait: Wait, spin: bool) -> Result<Held> {
        if entities.is_empty() {
            return Ok(Held::new(entities));
        }
        if entities.len() > MAX_ENTITIES {
            return Err(Error::Unsupported {
                path: self.path.clone(),
                what: format!("atomic_append locks at most {MAX_ENTITIES} entities per call"),
            });
        }
        let item = self.checkout()?;
        let mut held = Held::new(entities);
        match self.append_and_wait(&item, &mut held, wait, spin) {
            Ok(()) => {
                held.slot = Some(item);
                Ok(held)
            }
            Err(e) => {
                self.pool.lock().push(item);
                Err(e)
            }
        }
    }

    fn append_and_wait(
        &self,
        item: &PoolItem,
        held: &mut Held,
        wait: Wait,
        spin: bool,
    ) -> Result<()> {
        use std::io::{Seek, Write};
        let rec = encode(self.me, &held.entities);
        let mut append = item.aux.as_ref().expect("append description");
        let rw = &item.file;
        let start = self.first.load(Ordering::Relaxed);
        append.write_all(&rec).map_err(|e| self.err(e))?;
        // The description is ours alone, so its position is the end of our write.
        let end = append.stream_position().map_err(|e| self.err(e))?;
        let me = end - RECORD;
        if !me.is_multiple_of(RECORD) {
            // Someone wrote a partial record: the file is not ours to use.
            let _ = rw.write_all_at(&[0u8; RECORD as usize], me);
            return Err(Error::Unsupported {
                path: self.path.clone(),
                what: "lock file is not a memfs atomic_append lock file (misaligned record)".into(),
            });
        }
        held.offset = me;
        // Blocking only while a scanner briefly holds a shared lock on it.
        sys::ofd_setlkw(rw.as_fd(), LockKind::Exclusive, me, RECORD).map_err(|e| self.err(e))?;
        match self.scan(rw, start.min(me), me, &held.entities, wait, spin) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.release_record(rw, me);
                Err(e)
            }
        }
    }

    /// Waits until no valid record in [from, me) conflicts with `mine`.
    ///
    /// Waits on the *nearest* conflicting record before ours, not the first:
    /// under contention the requests then form a queue in which each release
    /// wakes one waiter, instead of every waiter rescanning.
    fn scan(
        &self,
        rw: &File,
        mut from: u64,
        me: u64,
        mine: &[Entity],
        wait: Wait,
        spin: bool,
    ) -> Result<()> {
        // Scans are short (they start at the first possibly-live record), so
        // a stack buffer avoids an allocation per lock.
        let mut buf = [0u8; 32 * RECORD as usize];
        loop {
            let mut pos = from;
            // While every record seen so far is free, the first live one is later.
            let mut prefix_free = true;
            let mut new_first = from;
            let mut nearest = None;
            while pos < me {
                let len = ((me - pos) as usize).min(buf.len());
                let n = read_full(rw, &mut buf[..len], pos).map_err(|e| self.err(e))?;
                let whole = n - n % RECORD as usize;
                for (i, r) in buf[..whole].chunks_exact(RECORD as usize).enumerate() {
                    let at = pos + i as u64 * RECORD;
                    match Record::parse(r) {
                        None if prefix_free => new_first = at + RECORD,
                        None => {}
                        Some(rec) => {
                            prefix_free = false;
                            if rec.conflicts(mine) {
                                nearest = Some((at, rec.owner()));
                            }
                        }
                    }
                }
                if whole < len {
                    // Beyond EOF (truncated by a reset we cannot see yet):
                    // nothing there is live.
                    if prefix_free {
                        new_first = me;
                    }
                    break;
                }
                pos += whole as u64;
            }
            self.advance(rw, new_first.min(me));
            let Some((at, owner)) = nearest else {
                return Ok(());
            };
            self.wait_record(rw, at, owner, wait, spin)?;
            from = new_first.min(me);
        }
    }

    /// Sleeps until the record at `at` is released or its owner is dead.
    fn wait_record(
        &self,
        rw: &File,
        at: u64,
        owner: ProcessId,
        wait: Wait,
        spin: bool,
    ) -> Result<()> {
        let fd = rw.as_fd();
        let mut nap = BACKOFF_MIN;
        loop {
            if !self.lock_record(rw, at, wait, spin)? {
                return Err(wait.expired_error());
            }
            // We hold a shared lock on the record: its owner has released it,
            // died, or has not locked it yet.
            let yet_to_lock = self.owner_yet_to_lock(rw, at, owner)?;
            let _ = sys::ofd_setlk(fd, LockKind::Unlock, at, RECORD);
            if !yet_to_lock {
                return Ok(());
            }
            // Its writer is between append and lock (microseconds,
            // unless descheduled or stopped): sleep, never spin.
            let now = std::time::Instant::now();
            match wait {
                Wait::Try => return Err(Error::WouldBlock),
                Wait::Until(d) if now >= d => return Err(Error::TimedOut),
                Wait::Until(d) => nap = nap.min(d - now),
                Wait::Forever => {}
            }
            if spin {
                std::thread::yield_now();
            } else {
                std::thread::sleep(nap);
                nap = (nap * 2).min(BACKOFF_MAX);
            }
        }
    }

    /// Takes a shared lock on the record at `at`, waiting as `wait` allows;
    /// `Ok(false)` when the wait ran out.
    fn lock_record(&self, rw: &File, at: u64, wait: Wait, spin: bool) -> Result<bool> {
        let fd = rw.as_fd();
        let e = |err| self.err(err);
        Ok(match wait {
            Wait::Try => sys::ofd_setlk(fd, LockKind::Shared, at, RECORD).map_err(e)?,
            _ if spin => loop {
                if sys::ofd_setlk(fd, LockKind::Shared, at, RECORD).map_err(e)? {
                    break true;
                }
                if wait.expired() {
                    break false;
                }
                std::thread::yield_now();
            },
            Wait::Forever => {
                sys::ofd_setlkw(fd, LockKind::Shared, at, RECORD).map_err(e)?;
                true
            }
            Wait::Until(d) => {
                sys::ofd_setlkw_until(fd, LockKind::Shared, at, RECORD, d).map_err(e)?
            }
        })
    }

    /// With the record at `at` locked shared: whether it is still `owner`'s
    /// and the owner may be alive, so it is between its append and its lock.
    /// A dead owner's record is zeroed.
    fn owner_yet_to_lock(&self, rw: &File, at: u64, owner: ProcessId) -> Result<bool> {
        let e = |err| self.err(err);
        let mut r = [0u8; RECORD as usize];
        let n = read_full(rw, &mut r, at).map_err(e)?;
        let still = n == RECORD as usize && Record::parse(&r).is_some_and(|x| x.owner() == owner);
        if !still {
            return Ok(false);
        }
        Ok(match self.liveness(rw, owner).map_err(e)? {
            Liveness::Dead => {
                // Zero it so nobody else has to check again.
                let _ = rw.write_all_at(&[0u8; RECORD as usize], at);
                false
            }
            // Between its append and its lock: let it run.
            Liveness::Alive | Liveness::Unknown => true,
        })
    }

    /// Liveness of a record's owner.
    fn liveness(&self, rw: &File, owner: ProcessId) -> std::io::Result<Liveness> {
        let boot = sys::boot_id_hash();
        if owner.boot == boot ^ V2_TAG {
            // Version 2: the owner byte is locked exactly while it lives.
            if owner.start >> TOKEN_BITS != 0 {
                return Ok(Liveness::Unknown);
            }
            return Ok(
                if sys::ofd_is_locked(rw.as_fd(), OWNER_BASE + owner.start, 1)? {
                    Liveness::Alive
                } else {
                    Liveness::Dead
                },
            );
        }
        // An older version's record: pid and start time (same boot only).
        Ok(sys::liveness(owner))
    }

    /// Records a later first-live record and punches out the dead prefix.
    fn advance(&self, rw: &File, new_first: u64) {
        self.first.fetch_max(new_first, Ordering::Relaxed);
        let written = self.header_at.load(Ordering::Relaxed);
        if new_first < written + HEADER_STEP
            || self
                .header_at
                .compare_exchange(written, new_first, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        // For joiners only. Racing writers may store an older value: that
        // only makes scans start earlier, never skip a live record.
        let _ = rw.write_all_at(&header(new_first), 0);
        let target = new_first / PUNCH_STEP * PUNCH_STEP;
        let done = self.punched.load(Ordering::Relaxed);
        if target > done.max(RECORD)
            && self
                .punched
                .compare_exchange(done, target, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            use std::os::fd::AsRawFd;
            // SAFETY: valid fd; the range lies before the first live record.
            let r = unsafe {
                libc::fallocate(
                    rw.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    RECORD as libc::off_t,
                    (target - RECORD) as libc::off_t,
                )
            };
            if r != 0 {
                tracing::debug!(err = %std::io::Error::last_os_error(), "punch hole not supported");
            }
        }
    }

    fn release_record(&self, rw: &File, at: u64) {
        // Zero first, then unlock: an unlocked valid record must never
        // belong to a live owner that has finished with it.
        if let Err(err) = rw.write_all_at(&[0u8; RECORD as usize], at) {
            tracing::error!(path = %self.path.display(), %err, "atomic_append: zeroing record failed");
        }
        let _ = sys::ofd_setlk(rw.as_fd(), LockKind::Unlock, at, RECORD);
    }

    pub(crate) fn unlock(&self, mut held: Held) {
        if let Some(item) = held.slot.take() {
            self.release_record(&item.file, held.offset);
            self.pool.lock().push(item);
        }
    }
}

fn read_full(f: &File, buf: &mut [u8], mut off: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], off) {
            Ok(0) => break,
            Ok(n) => {
                done += n;
                off += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

impl Drop for AtomicAppend {
    fn drop(&mut self) {
        let fd = self.users.as_fd();
        // Last user out resets the file. Conversion to exclusive fails (no
        // wait) while anyone else is still a user.
        if let Ok(true) = sys::ofd_setlk(fd, LockKind::Exclusive, USERS_BYTE, 1) {
            let _ = Self::reset(&self.users);
        }
        let _ = sys::ofd_setlk(fd, LockKind::Unlock, USERS_BYTE, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Wait;
    use std::time::{Duration, Instant};

    /// A record whose writer is between its append and its record lock, with
    /// a pid that means nothing here (as from another pid namespace): it is
    /// live while its owner byte is locked, and dead once it is not.
    #[test]
    fn unlocked_record_of_a_live_owner_is_live_whatever_its_pid() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = dir.path().join("lock");
        let owner = AtomicAppend::open(&path).unwrap();
        let waiter = AtomicAppend::open(&path).unwrap();
        let e = Entity::new(5, true);
        // No process has pid u32::MAX - 1 (pid_max <= 2^22).
        let forged = ProcessId {
            pid: u32::MAX - 1,
            ..owner.me
        };
        {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .unwrap();
            f.write_all(&encode(forged, &[e])).unwrap();
        }
        let ents: Entities = [e].into_iter().collect();
        let t = Instant::now();
        let r = waiter.lock(
            ents.clone(),
            Wait::Until(Instant::now() + Duration::from_millis(200)),
            false,
        );
        assert!(matches!(r, Err(Error::TimedOut)), "{:?}", r.map(|_| ()));
        assert!(t.elapsed() >= Duration::from_millis(195));
        // The owner goes away (its owner byte is unlocked): the record is
        // dead and is skipped.
        drop(owner);
        let h = waiter
            .lock(
                ents,
                Wait::Until(Instant::now() + Duration::from_secs(10)),
                false,
            )
            .expect("record of a gone owner is dead");
        waiter.unlock(h);
    }
}
