//! Cross-process locks over sets of entities, using nothing but a file
//! system: `lock_files`, `byte_ranges`, `atomic_append` and `memory_map`.
//!
//! A caller asks for all its entities at once, shared or exclusive; the lock
//! avoids deadlock itself (see [`acquire_in_turn`] and `docs/lock.md`).
//!
//! Depends on `libc` and small crates only (no benchmark or plotting deps:
//! `memfs bench lock` lives in `memfs-bench`).
//!
//! ```no_run
//! use memfs_lock::{Algorithm, Deadline, Entity, SharedFsMutex};
//! let m = SharedFsMutex::open(Algorithm::ByteRanges, "/dev/shm/my.lock").unwrap();
//! let g = m.lock(&[Entity::from_str("a", true), Entity::new(7, false)], Deadline::Never).unwrap();
//! drop(g);
//! ```

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use smallvec::SmallVec;

mod atomic_append;
mod byte_ranges;
mod lock_files;
mod memory_map;
mod sys;

/// The errors a lock operation can report.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `try_lock` found an entity held by someone else.
    #[error("lock would block")]
    WouldBlock,
    /// The deadline passed before every entity could be taken.
    #[error("lock timed out")]
    TimedOut,
    /// A file-system call failed.
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file system (or environment) cannot support this algorithm or request.
    #[error("unsupported on {path}: {what}")]
    Unsupported { path: PathBuf, what: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn io_err(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

const EXCLUSIVE_BIT: u64 = 1 << 63;

/// A thing to lock: a 63-bit value plus an exclusive flag, packed in 64 bits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Entity(u64);

impl Entity {
    /// Largest value an entity can carry.
    pub const MAX_VALUE: u64 = EXCLUSIVE_BIT - 1;

    /// An entity with `value` (the top bit is dropped) and the given mode.
    pub const fn new(value: u64, exclusive: bool) -> Self {
        Entity((value & Self::MAX_VALUE) | if exclusive { EXCLUSIVE_BIT } else { 0 })
    }
    /// An entity whose value is a stable hash of `bytes`.
    pub fn from_bytes(bytes: &[u8], exclusive: bool) -> Self {
        Self::new(hash_bytes(bytes), exclusive)
    }
    /// An entity whose value is a stable hash of `s`.
    #[allow(clippy::should_implement_trait)]
    pub fn from_str(s: &str, exclusive: bool) -> Self {
        Self::from_bytes(s.as_bytes(), exclusive)
    }
    /// An entity with a random value.
    pub fn random(exclusive: bool) -> Self {
        Self::new(rand::random::<u64>(), exclusive)
    }
    pub const fn value(self) -> u64 {
        self.0 & Self::MAX_VALUE
    }
    pub const fn exclusive(self) -> bool {
        self.0 & EXCLUSIVE_BIT != 0
    }
    pub const fn raw(self) -> u64 {
        self.0
    }
    pub const fn from_raw(raw: u64) -> Self {
        Entity(raw)
    }
    pub(crate) const fn with_value(self, value: u64) -> Self {
        Self::new(value, self.exclusive())
    }
}

impl std::fmt::Debug for Entity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}{:#x}",
            if self.exclusive() { "X" } else { "S" },
            self.value()
        )
    }
}

/// Stable 64-bit hash (FNV-1a followed by a murmur finaliser for avalanche).
/// Stable across processes, versions and machines: it names entities on disk.
pub fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    mix64(h)
}

pub(crate) fn mix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// How long a lock call may wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deadline {
    /// Wait for ever.
    Never,
    /// Wait at most this long, measured on the monotonic clock.
    After(Duration),
    /// Wait until this wall-clock time.
    At(SystemTime),
}

/// A deadline resolved against the monotonic clock at the start of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Do not wait at all (`try_lock`): contention is `WouldBlock`.
    Try,
    Until(Instant),
    Forever,
}

impl Wait {
    pub(crate) fn resolve(d: Deadline) -> Wait {
        // No clock read for the common no-deadline case: it is a measurable
        // share of a memory_map lock.
        if d == Deadline::Never {
            return Wait::Forever;
        }
        let now = Instant::now();
        match d {
            Deadline::Never => Wait::Forever,
            Deadline::After(t) => now.checked_add(t).map(Wait::Until).unwrap_or(Wait::Forever),
            Deadline::At(at) => {
                let left = at
                    .duration_since(SystemTime::now())
                    .unwrap_or(Duration::ZERO);
                now.checked_add(left)
                    .map(Wait::Until)
                    .unwrap_or(Wait::Forever)
            }
        }
    }
    /// The error for running out of time.
    pub(crate) fn expired_error(self) -> Error {
        match self {
            Wait::Try => Error::WouldBlock,
            _ => Error::TimedOut,
        }
    }
    pub(crate) fn expired(self) -> bool {
        match self {
            Wait::Try => true,
            Wait::Until(d) => Instant::now() >= d,
            Wait::Forever => false,
        }
    }
}

/// Which algorithm a [`SharedFsMutex`] uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// One O_EXCL file per entity in a directory.
    LockFiles,
    /// One byte per entity in one lock file, with OFD byte-range locks.
    ByteRanges,
    /// 128-byte request records appended to one lock file.
    AtomicAppend,
    /// A shared-memory hash index of spinlocks, located through a lock file.
    MemoryMap,
}

impl Algorithm {
    pub const ALL: [Algorithm; 4] = [
        Algorithm::LockFiles,
        Algorithm::ByteRanges,
        Algorithm::AtomicAppend,
        Algorithm::MemoryMap,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::LockFiles => "lock_files",
            Algorithm::ByteRanges => "byte_ranges",
            Algorithm::AtomicAppend => "atomic_append",
            Algorithm::MemoryMap => "memory_map",
        }
    }
}

impl std::str::FromStr for Algorithm {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s || a.name().replace('_', "-") == s)
            .ok_or_else(|| {
                format!(
                    "unknown algorithm {s:?} (lock_files, byte_ranges, atomic_append, memory_map)"
                )
            })
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Options for opening a [`SharedFsMutex`].
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// memory_map only: behave as if the index could not be opened (as a user
    /// on another machine would), forcing every user onto the fallback.
    #[doc(hidden)]
    pub simulate_unreachable_index: bool,
    /// memory_map only: number of slots of the index, if this user creates
    /// it (a power of two, 64..=65536; default 4096). Later users follow the
    /// creator's size. Entities of different values that share a slot
    /// exclude each other across threads and processes (docs/lock.md gives
    /// the rate per size); a thread never waits for its own slots.
    pub memory_map_slots: Option<usize>,
    /// lock_files only: create entity files directly, as on a file system
    /// without hard links (for tests).
    #[doc(hidden)]
    pub lock_files_without_links: bool,
}

pub(crate) type Entities = SmallVec<[Entity; 8]>;

/// What a backend needs to remember to release a lock set.
pub(crate) struct Held {
    pub(crate) entities: Entities,
    /// Pool slot (OFD) used by byte_ranges / atomic_append, if any.
    pub(crate) slot: Option<byte_ranges::PoolItem>,
    /// atomic_append: offset of our record.
    pub(crate) offset: u64,
    /// memory_map: the set was taken through the fallback.
    pub(crate) fallback: bool,
}

impl Held {
    pub(crate) fn new(entities: Entities) -> Self {
        Held {
            entities,
            slot: None,
            offset: 0,
            fallback: false,
        }
    }
}

enum Inner {
    LockFiles(lock_files::LockFiles),
    ByteRanges(byte_ranges::ByteRanges),
    AtomicAppend(atomic_append::AtomicAppend),
    MemoryMap(memory_map::MemoryMap),
}

/// A lock over sets of entities shared by every process that opens the same
/// path with the same algorithm. Safe to use from many threads at once.
pub struct SharedFsMutex {
    inner: Inner,
    algorithm: Algorithm,
}

impl SharedFsMutex {
    /// Opens (creating if needed) the lock at `path`: a directory for
    /// `LockFiles`, a lock file for the others.
    pub fn open(algorithm: Algorithm, path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(algorithm, path, &Options::default())
    }

    pub fn open_with(
        algorithm: Algorithm,
        path: impl AsRef<Path>,
        options: &Options,
    ) -> Result<Self> {
        let path = path.as_ref();
        let inner = match algorithm {
            Algorithm::LockFiles => Inner::LockFiles(lock_files::LockFiles::open(
                path,
                options.lock_files_without_links,
            )?),
            Algorithm::ByteRanges => Inner::ByteRanges(byte_ranges::ByteRanges::open(path, 0)?),
            Algorithm::AtomicAppend => {
                Inner::AtomicAppend(atomic_append::AtomicAppend::open(path)?)
            }
            Algorithm::MemoryMap => Inner::MemoryMap(memory_map::MemoryMap::open(path, options)?),
        };
        Ok(SharedFsMutex { inner, algorithm })
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// memory_map: true when this instance runs on the byte_ranges fallback.
    pub fn is_fallback(&self) -> bool {
        match &self.inner {
            Inner::MemoryMap(m) => m.is_fallback(),
            _ => false,
        }
    }

    /// Takes every entity (shared or exclusive as each says), waiting until
    /// `deadline`. Sleeps while waiting.
    pub fn lock(&self, entities: &[Entity], deadline: Deadline) -> Result<Guard<'_>> {
        self.lock_with(entities, deadline, false)
    }

    /// As [`lock`](Self::lock); with `spin` the caller busy-waits (yielding)
    /// instead of sleeping, trading a core for latency.
    pub fn lock_with(
        &self,
        entities: &[Entity],
        deadline: Deadline,
        spin: bool,
    ) -> Result<Guard<'_>> {
        self.acquire(entities, Wait::resolve(deadline), spin)
    }

    /// Takes every entity now or fails with [`Error::WouldBlock`]; never waits.
    pub fn try_lock(&self, entities: &[Entity]) -> Result<Guard<'_>> {
        self.acquire(entities, Wait::Try, false)
    }

    #[inline]
    fn acquire(&self, entities: &[Entity], wait: Wait, spin: bool) -> Result<Guard<'_>> {
        let held = match &self.inner {
            Inner::LockFiles(b) => b.lock(normalize(entities), wait, spin)?,
            Inner::ByteRanges(b) => b.lock(normalize(entities), wait, spin)?,
            Inner::AtomicAppend(b) => b.lock(normalize(entities), wait, spin)?,
            Inner::MemoryMap(b) => b.lock(entities, wait, spin)?,
        };
        Ok(Guard {
            mutex: self,
            held: Some(held),
        })
    }

    #[inline]
    fn release(&self, held: Held) {
        match &self.inner {
            Inner::LockFiles(b) => b.unlock(held),
            Inner::ByteRanges(b) => b.unlock(held),
            Inner::AtomicAppend(b) => b.unlock(held),
            Inner::MemoryMap(b) => b.unlock(held),
        }
    }
}

/// Holds a set of entities; releases them on drop or [`unlock`](Guard::unlock).
#[must_use = "the lock is released when the guard is dropped"]
pub struct Guard<'a> {
    mutex: &'a SharedFsMutex,
    held: Option<Held>,
}

impl Guard<'_> {
    /// Releases the entities now.
    pub fn unlock(mut self) {
        if let Some(h) = self.held.take() {
            self.mutex.release(h);
        }
    }
    /// The entities held (after de-duplication).
    pub fn entities(&self) -> &[Entity] {
        self.held.as_ref().map(|h| &h.entities[..]).unwrap_or(&[])
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if let Some(h) = self.held.take() {
            self.mutex.release(h);
        }
    }
}

/// Removes duplicate values (exclusive wins), keeping first-seen order. Locking
/// a value twice in one call would otherwise self-deadlock (lock_files,
/// memory_map) or release it early (byte_ranges: one OFD lock per byte).
pub(crate) fn normalize(entities: &[Entity]) -> Entities {
    let mut out: Entities = SmallVec::with_capacity(entities.len());
    for &e in entities {
        if let Some(prev) = out.iter_mut().find(|p| p.value() == e.value()) {
            if e.exclusive() {
                *prev = e;
            }
        } else {
            out.push(e);
        }
    }
    out
}

/// Result of waiting for one contended entity.
pub(crate) enum Waited {
    /// The entity is now held by us.
    Acquired,
    /// The entity looked free; try the whole set again.
    Retry,
}

/// A backend that locks one entity at a time; [`acquire_in_turn`] builds the
/// deadlock-free multi-entity protocol on top of it.
pub(crate) trait PerEntity {
    type Ctx;
    /// Takes `e` if it is free now.
    fn try_one(&self, ctx: &Self::Ctx, e: Entity) -> Result<bool>;
    /// Waits (until `wait` runs out) for `e`, which was found held.
    fn wait_one(&self, ctx: &Self::Ctx, e: Entity, wait: Wait, spin: bool) -> Result<Waited>;
    fn release_one(&self, ctx: &Self::Ctx, e: Entity);
    /// Called when `try_lock` meets contention: a chance to break a lock left
    /// by a dead owner. Returns true if it may now be free.
    fn recover(&self, _ctx: &Self::Ctx, _e: Entity) -> Result<bool> {
        Ok(false)
    }
}

/// Takes `entities` in turn. On the first one that is busy, releases all,
/// moves the busy one to the front, shuffles the rest, waits for the busy one
/// and starts again. No process ever waits while holding anything, so no
/// cycle of waiters (deadlock) can form, whatever order others use.
#[inline]
pub(crate) fn acquire_in_turn<P: PerEntity>(
    p: &P,
    ctx: &P::Ctx,
    entities: &mut [Entity],
    wait: Wait,
    spin: bool,
) -> Result<()> {
    let n = entities.len();
    let mut first_held = false;
    let mut recovered = false;
    loop {
        let mut taken = if first_held { 1 } else { 0 };
        let mut contended = None;
        while taken < n {
            match p.try_one(ctx, entities[taken]) {
                Ok(true) => taken += 1,
                Ok(false) => {
                    contended = Some(taken);
                    break;
                }
                Err(e) => {
                    release_all(p, ctx, &entities[..taken]);
                    return Err(e);
                }
            }
        }
        let Some(c) = contended else { return Ok(()) };
        release_all(p, ctx, &entities[..taken]);
        first_held = false;
        if matches!(wait, Wait::Try) {
            // try_lock: one chance to clear a dead owner, never a wait.
            if !recovered && p.recover(ctx, entities[c])? {
                recovered = true;
                continue;
            }
            return Err(Error::WouldBlock);
        }
        if wait.expired() {
            return Err(Error::TimedOut);
        }
        entities[..=c].rotate_right(1);
        if n > 2 {
            shuffle(&mut entities[1..]);
        }
        match p.wait_one(ctx, entities[0], wait, spin)? {
            Waited::Acquired => first_held = true,
            Waited::Retry => {}
        }
    }
}

fn release_all<P: PerEntity>(p: &P, ctx: &P::Ctx, held: &[Entity]) {
    for &e in held.iter().rev() {
        p.release_one(ctx, e);
    }
}

fn shuffle(s: &mut [Entity]) {
    use rand::seq::SliceRandom;
    s.shuffle(&mut rand::rng());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entity_packs_value_and_mode() {
        let e = Entity::new(u64::MAX, true);
        assert_eq!(e.value(), Entity::MAX_VALUE);
        assert!(e.exclusive());
        let s = Entity::new(42, false);
        assert_eq!((s.value(), s.exclusive()), (42, false));
        assert_eq!(Entity::from_raw(e.raw()), e);
    }

    #[test]
    fn hashes_are_stable() {
        // Entity values name files on disk and slots shared between
        // versions: they must never change.
        assert_eq!(hash_bytes(b""), mix64(0xcbf2_9ce4_8422_2325));
        assert_eq!(hash_bytes(b"users"), 0x0522_fd2d_9ac9_984d);
        assert_eq!(
            Entity::from_str("users", true),
            Entity::from_bytes(b"users", true)
        );
        assert_ne!(
            Entity::from_str("users", true).value(),
            Entity::from_str("user", true).value()
        );
        assert_ne!(Entity::random(false), Entity::random(false));
    }

    #[test]
    fn normalize_merges_duplicates_exclusive_wins() {
        let n = normalize(&[
            Entity::new(1, false),
            Entity::new(2, false),
            Entity::new(1, true),
            Entity::new(2, false),
        ]);
        assert_eq!(&n[..], &[Entity::new(1, true), Entity::new(2, false)]);
    }

    #[test]
    fn algorithm_names_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(a.name().parse::<Algorithm>().unwrap(), a);
        }
        assert!("nope".parse::<Algorithm>().is_err());
    }

    #[test]
    fn bad_paths_are_errors_not_panics() {
        for a in Algorithm::ALL {
            let r = SharedFsMutex::open(a, "/proc/definitely/not/here/lock");
            assert!(matches!(r, Err(Error::Io { .. })), "{a}: {:?}", r.err());
        }
    }
}
