//! memory_map: a hash index of shared/exclusive locks in a file under
//! /dev/shm, mapped by every user; its path is kept in the lock file.
//!
//! Life cycle (all on OFD locks of the lock file; see docs/lock.md):
//! - `INIT` (exclusive) serialises joining and leaving.
//! - `INUSE` is held shared by every user for its whole life. A joiner that
//!   can take it exclusively is alone: it creates the index. A leaver that can
//!   convert it to exclusive is last: it removes the index. The lock is
//!   converted in place on one description and never dropped in between (the
//!   reference lost it, defect 1, and a late joiner then made a second index).
//! - `MAPUSE` is held shared by every user of the index. A user that cannot
//!   open the index marks the lock file "fallback pending", waits for
//!   `MAPUSE` exclusively (every index user has left; joiners wait on `INIT`),
//!   then switches the lock file to byte_ranges; from then until the last
//!   user leaves, everyone uses byte_ranges on the slot numbers.
//! - `USER_BASE + uid`: each index user holds its own byte exclusively, so
//!   others can tell whether the owner of an exclusive slot is alive.
//!
//! Slot word (u32): bit 31 = someone sleeps on it, bit 30 = exclusive,
//! bits 0..30 = owner uid (exclusive) or reader count (shared).
//!
//! Reentrancy: entities share slots, so a thread holding a slot must not
//! wait for itself when a later call of its own maps to the same slot. Per
//! instance and slot, process-local words record which thread holds the
//! slot exclusively and how many further holds it nested on it (`local`),
//! and which thread alone holds this instance's shared holds (`lshared`), so
//! that the thread can upgrade them when nobody else reads the slot.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use smallvec::SmallVec;

use crate::byte_ranges::{ByteRanges, check_ofd, open_lock_file};
use crate::sys::{self, LockKind};
use crate::{
    Entities, Entity, Error, Held, PerEntity, Result, Wait, Waited, acquire_in_turn, io_err, mix64,
};

const INUSE: u64 = 1 << 20;
const MAPUSE: u64 = (1 << 20) + 1;
const INIT: u64 = (1 << 20) + 2;
const USER_BASE: u64 = 1 << 21;
/// Fallback byte_ranges lock slot numbers from here on.
const FALLBACK_BASE: u64 = 1 << 32;

/// Default number of slots (the reference's 4096).
pub(crate) const DEFAULT_SLOTS: usize = 4096;
/// Index sizes a creator may choose (powers of two).
pub(crate) const MIN_SLOTS: usize = 64;
pub(crate) const MAX_SLOTS: usize = 1 << 16;
const MAX_USERS: usize = 1024;
/// One slot per cache line: neighbouring entities must not false-share.
const SLOT_STRIDE: usize = 64;
const INDEX_HEADER: usize = 4096;
const USERS_OFF: usize = INDEX_HEADER;
const SLOTS_OFF: usize = USERS_OFF + MAX_USERS * 4;
fn holds_off(nslots: usize) -> usize {
    SLOTS_OFF + nslots * SLOT_STRIDE
}
/// Per user, per slot: how many shared holds the user has on the slot, so
/// the shared holds of a dead user can be given back. Sparse: a user only
/// touches the pages of the slots it uses.
fn index_len(nslots: usize) -> usize {
    holds_off(nslots) + MAX_USERS * nslots * 4
}
/// Version 1 indexes (older versions) have 4096 slots; version 2 records its
/// slot count at offset 8. Older versions cannot join a version-2 index and
/// fall back to byte_ranges, which is safe.
const INDEX_MAGIC_V1: u64 = u64::from_le_bytes(*b"MFSIDX01");
const INDEX_MAGIC: u64 = u64::from_le_bytes(*b"MFSIDX02");

/// Process-local reentrancy words: (thread token << 24) | count.
const COUNT_BITS: u32 = 24;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
/// `lshared` token when several threads hold shared holds on the slot.
const MULTI: u64 = (1 << 40) - 1;

/// A process-wide unique token of the calling thread (never reused).
#[inline]
fn thread_token() -> u64 {
    use std::cell::Cell;
    thread_local!(static TOKEN: Cell<u64> = const { Cell::new(0) });
    static NEXT: AtomicU64 = AtomicU64::new(1);
    TOKEN.with(|t| {
        let v = t.get();
        if v != 0 {
            return v;
        }
        let n = NEXT.fetch_add(1, Ordering::Relaxed) % MULTI;
        t.set(n.max(1));
        n.max(1)
    })
}

const WAITERS: u32 = 1 << 31;
const EXCL: u32 = 1 << 30;
const VALUE: u32 = EXCL - 1;

/// Busy-wait this many times before sleeping: most holds are shorter than a
/// futex round trip.
const SPIN_TRIES: u32 = 200;
/// Sleepers wake this often to check whether an exclusive owner died.
const DEAD_CHECK: Duration = Duration::from_millis(50);

const HDR_MAGIC: &[u8; 8] = b"MFSMMAP1";
const HDR_LEN: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    None = 0,
    Map = 1,
    FallbackPending = 2,
    Fallback = 3,
}

fn write_header(f: &File, mode: Mode, index: &str) -> std::io::Result<()> {
    let mut h = vec![0u8; HDR_LEN];
    h[0..8].copy_from_slice(HDR_MAGIC);
    h[16..20].copy_from_slice(&(mode as u32).to_le_bytes());
    h[20..24].copy_from_slice(&(index.len() as u32).to_le_bytes());
    h[24..24 + index.len()].copy_from_slice(index.as_bytes());
    let c = crate::hash_bytes(&h[16..]);
    h[8..16].copy_from_slice(&c.to_le_bytes());
    f.write_all_at(&h, 0)
}

fn read_header(f: &File) -> (Mode, String) {
    let mut h = vec![0u8; HDR_LEN];
    let ok = matches!(f.read_at(&mut h, 0), Ok(n) if n == HDR_LEN)
        && &h[0..8] == HDR_MAGIC
        && u64::from_le_bytes(h[8..16].try_into().unwrap()) == crate::hash_bytes(&h[16..]);
    if !ok {
        return (Mode::None, String::new());
    }
    let mode = match u32::from_le_bytes(h[16..20].try_into().unwrap()) {
        1 => Mode::Map,
        2 => Mode::FallbackPending,
        3 => Mode::Fallback,
        _ => Mode::None,
    };
    let n = (u32::from_le_bytes(h[20..24].try_into().unwrap()) as usize).min(HDR_LEN - 24);
    (mode, String::from_utf8_lossy(&h[24..24 + n]).into_owned())
}

/// A mapped index.
struct Index {
    base: *mut u8,
    path: String,
    /// Number of slots (a power of two) and its mask.
    nslots: usize,
    len: usize,
}

// SAFETY: the mapping is shared memory accessed only through atomics.
unsafe impl Send for Index {}
// SAFETY: as above.
unsafe impl Sync for Index {}

impl Index {
    fn map(file: &File, nslots: usize) -> std::io::Result<Self> {
        let len = index_len(nslots);
        // SAFETY: mapping a file we opened read-write, shared; its length
        // (len) was set by the caller (create) or checked (join).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Index {
            base: p.cast(),
            path: String::new(),
            nslots,
            len,
        })
    }

    fn create(dir: &Path, nslots: usize) -> std::io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = dir.join(format!("memfs-lock-{:016x}", rand::random::<u64>()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o666)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)?;
        let r = (|| {
            f.set_len(index_len(nslots) as u64)?;
            let mut idx = Index::map(&f, nslots)?;
            idx.nslots_word().store(nslots as u64, Ordering::Relaxed);
            idx.magic().store(INDEX_MAGIC, Ordering::Release);
            idx.path = path.to_string_lossy().into_owned();
            Ok(idx)
        })();
        if r.is_err() {
            let _ = std::fs::remove_file(&path);
        }
        r
    }

    fn join(path: &str) -> std::io::Result<Self> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        let bad =
            |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
        let mut head = [0u8; 16];
        f.read_exact_at(&mut head, 0)?;
        let magic = u64::from_le_bytes(head[0..8].try_into().unwrap());
        let nslots = match magic {
            INDEX_MAGIC_V1 => DEFAULT_SLOTS,
            INDEX_MAGIC => u64::from_le_bytes(head[8..16].try_into().unwrap()) as usize,
            _ => return Err(bad("not a memfs lock index")),
        };
        if !nslots.is_power_of_two() || !(MIN_SLOTS..=MAX_SLOTS).contains(&nslots) {
            return Err(bad("index has an invalid slot count"));
        }
        if f.metadata()?.len() != index_len(nslots) as u64 {
            return Err(bad("index has the wrong size"));
        }
        let mut idx = Index::map(&f, nslots)?;
        idx.path = path.to_string();
        Ok(idx)
    }

    fn nslots_word(&self) -> &AtomicU64 {
        // SAFETY: offset 8 is inside the 4 KiB header and 8-byte aligned.
        unsafe { &*(self.base.add(8) as *const AtomicU64) }
    }

    #[inline]
    fn slot_of(&self, value: u64) -> u64 {
        mix64(value) & (self.nslots as u64 - 1)
    }

    fn magic(&self) -> &AtomicU64 {
        // SAFETY: offset 0 is inside the mapping and 8-byte aligned (page).
        unsafe { &*(self.base as *const AtomicU64) }
    }

    fn user(&self, uid: usize) -> &AtomicU32 {
        debug_assert!(uid < MAX_USERS);
        // SAFETY: uid < MAX_USERS keeps the word inside the users table,
        // 4-byte aligned.
        unsafe { &*(self.base.add(USERS_OFF + uid * 4) as *const AtomicU32) }
    }

    #[inline]
    fn hold(&self, uid: u32, s: u64) -> &AtomicU32 {
        let i = (uid as usize % MAX_USERS) * self.nslots + (s as usize & (self.nslots - 1));
        // SAFETY: i < MAX_USERS * nslots keeps the word inside the holds
        // table, 4-byte aligned.
        unsafe { &*(self.base.add(holds_off(self.nslots) + i * 4) as *const AtomicU32) }
    }

    #[inline]
    fn slot(&self, s: u64) -> &AtomicU32 {
        let s = (s as usize) & (self.nslots - 1);
        // SAFETY: s < nslots keeps the word inside the slot table, aligned.
        unsafe { &*(self.base.add(SLOTS_OFF + s * SLOT_STRIDE) as *const AtomicU32) }
    }
}

impl Drop for Index {
    fn drop(&mut self) {
        // SAFETY: base/len are the mapping created in `map`.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

enum Engine {
    Map {
        index: Index,
        uid: u32,
        /// Per slot: thread holding it exclusively through this instance
        /// and the number of holds nested on it (see `MapLocks`).
        local: Box<[AtomicU64]>,
        /// Per slot: the thread holding all of this instance's shared holds
        /// (or MULTI) and their number.
        lshared: Box<[AtomicU64]>,
    },
    Fallback(ByteRanges),
}

pub(crate) struct MemoryMap {
    path: PathBuf,
    /// Our description of the lock file: holds INUSE, MAPUSE and our USER byte.
    ctrl: File,
    engine: Engine,
    recovering: Mutex<()>,
}

/// Fallback slots (byte_ranges on the lock file) use the default index size.
fn fallback_slot_of(value: u64) -> u64 {
    mix64(value) % DEFAULT_SLOTS as u64
}

fn shm_dir() -> PathBuf {
    std::env::var_os("MEMFS_LOCK_SHM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev/shm"))
}

impl MemoryMap {
    pub(crate) fn open(path: &Path, options: &crate::Options) -> Result<Self> {
        let nslots = options.memory_map_slots.unwrap_or(DEFAULT_SLOTS);
        if !nslots.is_power_of_two() || !(MIN_SLOTS..=MAX_SLOTS).contains(&nslots) {
            return Err(Error::Unsupported {
                path: path.to_path_buf(),
                what: format!(
                    "memory_map index size {nslots}: must be a power of two in {MIN_SLOTS}..={MAX_SLOTS}"
                ),
            });
        }
        let ctrl = open_lock_file(path)?;
        check_ofd(path, &ctrl)?;
        let e = |err| io_err(path, err);
        let fd = ctrl.as_fd();
        sys::ofd_setlkw(fd, LockKind::Exclusive, INIT, 1).map_err(e)?;
        let r = Self::join(path, &ctrl, options);
        let _ = sys::ofd_setlk(fd, LockKind::Unlock, INIT, 1);
        let engine = r?;
        Ok(MemoryMap {
            path: path.to_path_buf(),
            ctrl,
            engine,
            recovering: Mutex::new(()),
        })
    }

    /// Runs under INIT.
    fn join(path: &Path, ctrl: &File, options: &crate::Options) -> Result<Engine> {
        let e = |err| io_err(path, err);
        let fd = ctrl.as_fd();
        let fallback = || ByteRanges::open(path, FALLBACK_BASE).map(Engine::Fallback);
        if sys::ofd_setlk(fd, LockKind::Exclusive, INUSE, 1).map_err(e)? {
            // Alone: anything in the header is left over from dead users.
            let (_, old) = read_header(ctrl);
            if !old.is_empty() {
                let _ = std::fs::remove_file(&old);
            }
            let made = if options.simulate_unreachable_index {
                None
            } else {
                Index::create(
                    &shm_dir(),
                    options.memory_map_slots.unwrap_or(DEFAULT_SLOTS),
                )
                .ok()
            };
            let engine = match made {
                Some(index) => {
                    write_header(ctrl, Mode::Map, &index.path).map_err(e)?;
                    Some(index)
                }
                None => {
                    write_header(ctrl, Mode::Fallback, "").map_err(e)?;
                    None
                }
            };
            // Convert in place: the lock is never released in between.
            sys::ofd_setlk(fd, LockKind::Shared, INUSE, 1).map_err(e)?;
            return match engine {
                Some(index) => Self::become_map_user(path, ctrl, index),
                None => fallback(),
            };
        }
        // Others are users. Nobody holds INUSE exclusively while we hold INIT.
        sys::ofd_setlkw(fd, LockKind::Shared, INUSE, 1).map_err(e)?;
        let (mode, index_path) = read_header(ctrl);
        let r = match mode {
            Mode::Map => {
                let joined = if options.simulate_unreachable_index {
                    None
                } else {
                    Index::join(&index_path).ok()
                };
                match joined {
                    Some(index) => return Self::become_map_user(path, ctrl, index),
                    None => Self::request_fallback(path, ctrl, &index_path),
                }
            }
            Mode::FallbackPending => Self::request_fallback(path, ctrl, &index_path),
            Mode::Fallback => Ok(()),
            Mode::None => Err(Error::Unsupported {
                path: path.to_path_buf(),
                what: "lock file in use but its header is unreadable (not a memory_map lock file?)"
                    .into(),
            }),
        };
        match r {
            Ok(()) => fallback(),
            Err(err) => {
                let _ = sys::ofd_setlk(fd, LockKind::Unlock, INUSE, 1);
                Err(err)
            }
        }
    }

    /// We cannot use the index: make everyone move to byte_ranges. Runs under
    /// INIT, so no new index user can join meanwhile.
    fn request_fallback(path: &Path, ctrl: &File, index_path: &str) -> Result<()> {
        let e = |err| io_err(path, err);
        let fd = ctrl.as_fd();
        write_header(ctrl, Mode::FallbackPending, index_path).map_err(e)?;
        tracing::warn!(lock = %path.display(), "memory_map index unreachable: waiting for index users to leave, then falling back to byte_ranges");
        sys::ofd_setlkw(fd, LockKind::Exclusive, MAPUSE, 1).map_err(e)?;
        let _ = std::fs::remove_file(index_path);
        write_header(ctrl, Mode::Fallback, "").map_err(e)?;
        let _ = sys::ofd_setlk(fd, LockKind::Unlock, MAPUSE, 1);
        Ok(())
    }

    fn become_map_user(path: &Path, ctrl: &File, index: Index) -> Result<Engine> {
        let e = |err| io_err(path, err);
        let fd = ctrl.as_fd();
        sys::ofd_setlk(fd, LockKind::Shared, MAPUSE, 1).map_err(e)?;
        for uid in 0..MAX_USERS {
            if sys::ofd_setlk(fd, LockKind::Exclusive, USER_BASE + uid as u64, 1).map_err(e)? {
                // Whoever had this uid before is dead: give back what it held.
                recover_uid(&index, uid as u32);
                index.user(uid).store(std::process::id(), Ordering::Release);
                let words = || (0..index.nslots).map(|_| AtomicU64::new(0)).collect();
                return Ok(Engine::Map {
                    local: words(),
                    lshared: words(),
                    index,
                    uid: uid as u32,
                });
            }
        }
        let _ = sys::ofd_setlk(fd, LockKind::Unlock, MAPUSE, 1);
        Err(Error::Unsupported {
            path: path.to_path_buf(),
            what: format!("more than {MAX_USERS} memory_map users"),
        })
    }

    pub(crate) fn is_fallback(&self) -> bool {
        matches!(self.engine, Engine::Fallback(_))
    }

    #[inline]
    pub(crate) fn lock(&self, entities: &[Entity], wait: Wait, spin: bool) -> Result<Held> {
        // Entities become slots; two entities in one slot are one lock.
        let mut slots: Entities = SmallVec::new();
        for &e in entities {
            let v = match &self.engine {
                Engine::Map { index, .. } => index.slot_of(e.value()),
                Engine::Fallback(_) => fallback_slot_of(e.value()),
            };
            match slots.iter_mut().find(|p| p.value() == v) {
                Some(p) if e.exclusive() => *p = e.with_value(v),
                Some(_) => {}
                None => slots.push(e.with_value(v)),
            }
        }
        match &self.engine {
            Engine::Map {
                index,
                uid,
                local,
                lshared,
            } => {
                let m = MapLocks {
                    index,
                    uid: *uid,
                    ctrl: &self.ctrl,
                    recovering: &self.recovering,
                    local,
                    lshared,
                    me: thread_token(),
                };
                let mut slots = slots;
                acquire_in_turn(&m, &(), &mut slots, wait, spin)?;
                Ok(Held::new(slots))
            }
            Engine::Fallback(b) => {
                let mut h = b.lock(slots, wait, spin)?;
                h.fallback = true;
                Ok(h)
            }
        }
    }

    #[inline]
    pub(crate) fn unlock(&self, held: Held) {
        match &self.engine {
            Engine::Map {
                index,
                uid,
                local,
                lshared,
            } => {
                let m = MapLocks {
                    index,
                    uid: *uid,
                    ctrl: &self.ctrl,
                    recovering: &self.recovering,
                    local,
                    lshared,
                    me: 0, // releases never depend on the releasing thread
                };
                for &e in held.entities.iter().rev() {
                    m.release_one(&(), e);
                }
            }
            Engine::Fallback(b) => b.unlock(held),
        }
    }
}

impl Drop for MemoryMap {
    fn drop(&mut self) {
        let fd = self.ctrl.as_fd();
        if let Engine::Map { index, uid, .. } = &self.engine {
            index.user(*uid as usize).store(0, Ordering::Release);
            // Last index user while a fallback is pending removes the index.
            if let Ok(true) = sys::ofd_setlk(fd, LockKind::Exclusive, MAPUSE, 1) {
                let (mode, p) = read_header(&self.ctrl);
                if mode == Mode::FallbackPending && p == index.path {
                    let _ = std::fs::remove_file(&p);
                }
            }
            let _ = sys::ofd_setlk(fd, LockKind::Unlock, MAPUSE, 1);
            let _ = sys::ofd_setlk(fd, LockKind::Unlock, USER_BASE + *uid as u64, 1);
        }
        if sys::ofd_setlkw(fd, LockKind::Exclusive, INIT, 1).is_ok() {
            if let Ok(true) = sys::ofd_setlk(fd, LockKind::Exclusive, INUSE, 1) {
                // Last user: remove the index and clear the header.
                let (_, p) = read_header(&self.ctrl);
                if !p.is_empty() {
                    let _ = std::fs::remove_file(&p);
                }
                let _ = write_header(&self.ctrl, Mode::None, "");
            }
            let _ = sys::ofd_setlk(fd, LockKind::Unlock, INUSE, 1);
            let _ = sys::ofd_setlk(fd, LockKind::Unlock, INIT, 1);
        }
        let _ = &self.path;
    }
}

struct MapLocks<'a> {
    index: &'a Index,
    uid: u32,
    ctrl: &'a File,
    recovering: &'a Mutex<()>,
    local: &'a [AtomicU64],
    lshared: &'a [AtomicU64],
    /// Token of the locking thread (0 when releasing).
    me: u64,
}

/// `lshared` value while its thread upgrades its shared holds.
const UPGRADING: u64 = u64::MAX;

impl MapLocks<'_> {
    #[inline]
    fn at(&self, s: u64) -> usize {
        s as usize & (self.index.nslots - 1)
    }

    /// Takes slot `s`, reentrantly for a thread that holds it already.
    #[inline]
    fn try_slot(&self, s: u64, exclusive: bool) -> bool {
        let i = self.at(s);
        let local = &self.local[i];
        // Fast path first: a slot this thread holds is never free.
        if self.try_word(s, exclusive) {
            if exclusive {
                local.store(self.me << COUNT_BITS, Ordering::Release);
            } else {
                self.lshared_add(i);
            }
            return true;
        }
        let l = local.load(Ordering::Acquire);
        if l != 0 && l >> COUNT_BITS == self.me {
            // This thread holds the slot exclusively: nest on that hold. (The
            // CAS fails only if a guard moved to another thread released
            // the slot meanwhile; then it is simply busy or free next try.)
            return l & COUNT_MASK < COUNT_MASK
                && local
                    .compare_exchange(l, l + 1, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok();
        }
        if exclusive {
            let sh = self.lshared[i].load(Ordering::Acquire);
            if sh != 0 && sh != UPGRADING && sh >> COUNT_BITS == self.me {
                return self.try_upgrade(s, sh);
            }
        }
        false
    }

    fn lshared_add(&self, i: usize) {
        let w = &self.lshared[i];
        let mut v = w.load(Ordering::Relaxed);
        loop {
            if v == UPGRADING {
                std::hint::spin_loop();
                v = w.load(Ordering::Relaxed);
                continue;
            }
            let (t, c) = (v >> COUNT_BITS, v & COUNT_MASK);
            let t = if c == 0 || t == self.me {
                self.me
            } else {
                MULTI
            };
            let nv = (t << COUNT_BITS) | (c + 1).min(COUNT_MASK);
            match w.compare_exchange_weak(v, nv, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return,
                Err(cur) => v = cur,
            }
        }
    }

    /// This thread alone holds this instance's `sh & COUNT_MASK` shared holds
    /// on `s` and wants it exclusively: if nobody else reads the slot, turn
    /// them into one exclusive hold with the shared ones nested on it.
    #[cold]
    fn try_upgrade(&self, s: u64, sh: u64) -> bool {
        let i = self.at(s);
        let c = (sh & COUNT_MASK) as u32;
        // Claim: releasers and other acquirers of this instance wait on it.
        if self.lshared[i]
            .compare_exchange(sh, UPGRADING, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        let w = self.index.slot(s);
        let v = w.load(Ordering::Acquire);
        let hold = self.index.hold(self.uid, s);
        let done = v & EXCL == 0 && v & VALUE == c && {
            // Hold counts first: a crash in between leaks readers (safe);
            // the other order could give back readers twice.
            hold.fetch_sub(c, Ordering::Relaxed);
            let ok = w
                .compare_exchange(
                    v,
                    (v & WAITERS) | EXCL | self.uid,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_ok();
            if !ok {
                hold.fetch_add(c, Ordering::Relaxed);
            }
            ok
        };
        if done {
            // The c shared holds and this one: c + 1 holds nested as one.
            self.local[i].store((self.me << COUNT_BITS) | c as u64, Ordering::Release);
            self.lshared[i].store(0, Ordering::Release);
        } else {
            self.lshared[i].store(sh, Ordering::Release);
        }
        done
    }

    /// Releases one hold counted in `local` (the slot is ours exclusively).
    #[inline]
    fn release_nested(&self, s: u64, mut l: u64) {
        let local = &self.local[self.at(s)];
        if l & COUNT_MASK == 0 && l >> COUNT_BITS == thread_token() {
            // The last hold, released by its own thread: nobody else can
            // nest on it meanwhile, so a plain store is enough.
            local.store(0, Ordering::Release);
        } else {
            loop {
                let nl = if l & COUNT_MASK > 0 { l - 1 } else { 0 };
                match local.compare_exchange_weak(l, nl, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) if nl != 0 => return,
                    Ok(_) => break,
                    Err(cur) => l = cur,
                }
            }
        }
        let w = self.index.slot(s);
        let old = w.swap(0, Ordering::Release);
        if old & WAITERS != 0 {
            sys::futex_wake_all(w);
        }
    }

    #[inline]
    fn try_word(&self, s: u64, exclusive: bool) -> bool {
        let w = self.index.slot(s);
        let v = w.load(Ordering::Relaxed);
        if exclusive {
            v & !WAITERS == 0
                && w.compare_exchange(
                    v,
                    (v & WAITERS) | EXCL | self.uid,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_ok()
        } else {
            let ok = v & EXCL == 0
                && (v & VALUE) < VALUE
                && w.compare_exchange(v, v + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok();
            if ok {
                // After the slot: dying in between leaks one reader (safe);
                // the other order could give back a hold that was never taken.
                self.index.hold(self.uid, s).fetch_add(1, Ordering::Relaxed);
            }
            ok
        }
    }

    /// Gives back what dead users hold on slot `s`: its exclusive owner, or
    /// (for a reader count) every registered user with shared holds on it.
    fn recover_dead(&self, s: u64) {
        let v = self.index.slot(s).load(Ordering::Acquire);
        if v & EXCL != 0 {
            self.try_recover(v & VALUE);
        } else if v & VALUE != 0 {
            for uid in 0..MAX_USERS as u32 {
                if uid != self.uid
                    && self.index.user(uid as usize).load(Ordering::Relaxed) != 0
                    && self.index.hold(uid, s).load(Ordering::Relaxed) != 0
                {
                    self.try_recover(uid);
                }
            }
        }
    }

    fn try_recover(&self, uid: u32) {
        if uid == self.uid || uid as usize >= MAX_USERS {
            return;
        }
        // One recoverer per instance: threads share our description, so the
        // byte lock below does not exclude them from each other.
        let _g = self.recovering.lock();
        let fd = self.ctrl.as_fd();
        // Holding the dead user's byte keeps joiners from reusing its uid
        // while we give its holds back.
        if let Ok(true) = sys::ofd_setlk(fd, LockKind::Exclusive, USER_BASE + uid as u64, 1) {
            tracing::warn!(uid, "memory_map: giving back the locks of a dead user");
            recover_uid(self.index, uid);
            let _ = sys::ofd_setlk(fd, LockKind::Unlock, USER_BASE + uid as u64, 1);
        }
    }
}

/// Frees every slot user `uid` held. The caller holds the user's byte
/// exclusively: the user is dead and nobody else recovers or reuses it.
fn recover_uid(index: &Index, uid: u32) {
    for s in 0..index.nslots as u64 {
        let w = index.slot(s);
        let v = w.load(Ordering::Acquire);
        if v & EXCL != 0
            && v & VALUE == uid
            && w.compare_exchange(v, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            sys::futex_wake_all(w);
        }
        // Swap before subtracting: a recoverer dying in between leaks
        // readers (safe) instead of subtracting twice.
        let c = index.hold(uid, s).swap(0, Ordering::AcqRel);
        if c != 0 {
            sub_readers(w, c);
        }
    }
    index.user(uid as usize).store(0, Ordering::Release);
}

fn sub_readers(w: &AtomicU32, c: u32) {
    let mut v = w.load(Ordering::Relaxed);
    loop {
        if v & EXCL != 0 {
            return;
        }
        let n = (v & VALUE).saturating_sub(c);
        let mut nv = (v & !VALUE) | n;
        if n == 0 {
            nv &= !WAITERS;
        }
        match w.compare_exchange_weak(v, nv, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => {
                if n == 0 && v & WAITERS != 0 {
                    sys::futex_wake_all(w);
                }
                return;
            }
            Err(cur) => v = cur,
        }
    }
}

impl PerEntity for MapLocks<'_> {
    type Ctx = ();

    #[inline]
    fn try_one(&self, _: &(), e: Entity) -> Result<bool> {
        Ok(self.try_slot(e.value(), e.exclusive()))
    }

    #[cold]
    fn wait_one(&self, _: &(), e: Entity, wait: Wait, spin: bool) -> Result<Waited> {
        let w = self.index.slot(e.value());
        let x = e.exclusive();
        for _ in 0..SPIN_TRIES {
            if self.try_slot(e.value(), x) {
                return Ok(Waited::Acquired);
            }
            std::hint::spin_loop();
        }
        let mut last_check = Instant::now();
        loop {
            if self.try_slot(e.value(), x) {
                return Ok(Waited::Acquired);
            }
            let now = Instant::now();
            let left = match wait {
                Wait::Try => return Err(Error::WouldBlock),
                Wait::Until(d) if now >= d => return Err(Error::TimedOut),
                Wait::Until(d) => Some(d - now),
                Wait::Forever => None,
            };
            if now.duration_since(last_check) >= DEAD_CHECK {
                self.recover_dead(e.value());
                last_check = now;
            }
            if spin {
                std::thread::yield_now();
                continue;
            }
            let v = w.load(Ordering::Relaxed);
            let busy = if x { v & !WAITERS != 0 } else { v & EXCL != 0 };
            if !busy {
                continue;
            }
            // Announce a sleeper so the releaser knows to wake us.
            if v & WAITERS == 0
                && w.compare_exchange(v, v | WAITERS, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            let t = left.map_or(DEAD_CHECK, |l| l.min(DEAD_CHECK));
            sys::futex_wait(w, v | WAITERS, Some(t));
        }
    }

    #[inline]
    fn release_one(&self, _: &(), e: Entity) {
        let s = e.value();
        let i = self.at(s);
        // Exclusive holds, and every hold nested on one, are counted in
        // `local`; only plain shared holds touch the reader count.
        loop {
            let l = self.local[i].load(Ordering::Acquire);
            if l != 0 {
                return self.release_nested(s, l);
            }
            let sh = &self.lshared[i];
            let v = sh.load(Ordering::Acquire);
            if v == UPGRADING || v & COUNT_MASK == 0 {
                // Being upgraded, or just upgraded (our hold now nests on
                // the exclusive one): look again.
                std::hint::spin_loop();
                continue;
            }
            let nv = if v & COUNT_MASK == 1 { 0 } else { v - 1 };
            if sh
                .compare_exchange(v, nv, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                break;
            }
        }
        let w = self.index.slot(s);
        self.index.hold(self.uid, s).fetch_sub(1, Ordering::Relaxed);
        let mut v = w.load(Ordering::Relaxed);
        loop {
            let mut nv = v - 1;
            let last = nv & VALUE == 0;
            if last {
                nv &= !WAITERS;
            }
            match w.compare_exchange_weak(v, nv, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => {
                    if last && v & WAITERS != 0 {
                        sys::futex_wake_all(w);
                    }
                    return;
                }
                Err(cur) => v = cur,
            }
        }
    }
}
