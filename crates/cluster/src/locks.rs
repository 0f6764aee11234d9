//! POSIX record locks and flocks kept in the cluster, so that they hold
//! across mounts (docs/cluster.md, "Locks").
//!
//! `{V}:l:<ino hex>` has a field `<sid>:<owner>` per lock owner of a
//! session, whose value is that owner's locks: 21 bytes each, `kind u8`
//! (bit 0: exclusive, bit 1: a flock), `start u64`, `end u64` (inclusive),
//! `pid u32`, little-endian, sorted and merged as the engine keeps them
//! (crates/fs/src/locks.rs: split, replace and merge of an owner's own
//! ranges; conflicts only between different owners, within one family).
//! The field `v` is a version: a volume-wide counter (`{V}:next` `lock`)
//! stamped by every change, so a version is never seen twice.
//!
//! The range arithmetic is in Rust, where u64 is exact (Lua's numbers are
//! doubles): read the hash, decide, then one fenced script writes this
//! owner's field only if `v` is still what was read (compare and set),
//! sets or clears `l:<ino hex>` in the session's hash `{V}:s:<sid>` (the
//! reaper of a dead session reads it), and feeds `unlock` when any range
//! was released or weakened. A reaper's deletion of a dead session's fields
//! does not change `v`: a removal never makes a conflict, so a compare and
//! set that raced with one still decided right.
//!
//! A blocked `F_SETLKW` is parked (no thread sleeps for it): a waiter
//! thread retries the waiters of an inode when the feed reports an unlock
//! there ([`Locks::on_unlock`]), and every waiter at least once a
//! [`ROUND`], which also covers an unlock whose feed entry was missed.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use memfs_fs::{Errno, LockCallback, LockInfo};
use nix::libc;
use parking_lot::{Condvar, Mutex};
use redis::Script;

use crate::blocks::retry;
use crate::error::{Error, Result};
use crate::handle::Handle;

/// The longest a parked waiter goes without a retry.
pub const ROUND: Duration = Duration::from_secs(1);
/// Compare-and-set attempts of one request before it gives up (EAGAIN).
const CAS_ATTEMPTS: usize = 16;
/// Bytes of one encoded lock.
const LOCK_LEN: usize = 21;

/// Writes one owner's locks if the version is unchanged (module doc).
/// KEYS: {V}:meta, the lock hash, the session hash.
/// ARGV 4..: version read (empty: none), field, value (empty: delete),
/// session field (`l:<ino hex>`), '1' if the session holds locks on the
/// inode afterwards, '1' to feed `unlock`, ino (decimal).
/// Returns 1 when written, 0 when the version moved.
const CAS: &str = r"
fence()
local lk, sk = KEYS[2], KEYS[3]
local v = redis.call('HGET', lk, 'v') or ''
if v ~= ARGV[4] then return 0 end
if ARGV[6] == '' then
  redis.call('HDEL', lk, ARGV[5])
else
  redis.call('HSET', lk, ARGV[5], ARGV[6])
end
local n = redis.call('HLEN', lk) - redis.call('HEXISTS', lk, 'v')
if n == 0 then
  redis.call('DEL', lk)
else
  redis.call('HSET', lk, 'v', redis.call('HINCRBY', P .. 'next', 'lock', 1))
end
if ARGV[8] == '1' then
  redis.call('HSET', sk, ARGV[7], 1)
else
  redis.call('HDEL', sk, ARGV[7])
end
if ARGV[9] == '1' then
  feed('op', 'unlock', 'ino', ARGV[10])
end
return 1
";

/// Which family a lock is of: they never conflict with each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Posix,
    Flock,
}

/// One held lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lock {
    pub family: Family,
    pub write: bool,
    pub start: u64,
    /// Inclusive.
    pub end: u64,
    pub pid: u32,
}

impl Lock {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }

    fn conflicts(&self, req: &Lock) -> bool {
        self.family == req.family && self.overlaps(req.start, req.end) && (self.write || req.write)
    }
}

/// An owner's locks as stored.
pub fn encode(locks: &[Lock]) -> Vec<u8> {
    let mut out = Vec::with_capacity(locks.len() * LOCK_LEN);
    for l in locks {
        let kind = u8::from(l.write) | (u8::from(l.family == Family::Flock) << 1);
        out.push(kind);
        out.extend_from_slice(&l.start.to_le_bytes());
        out.extend_from_slice(&l.end.to_le_bytes());
        out.extend_from_slice(&l.pid.to_le_bytes());
    }
    out
}

/// An owner's locks from what is stored.
pub fn decode(b: &[u8]) -> Result<Vec<Lock>> {
    if !b.len().is_multiple_of(LOCK_LEN) {
        return Err(Error::Protocol(format!("lock value of {} bytes", b.len())));
    }
    let u64_at = |c: &[u8], o: usize| {
        let mut a = [0; 8];
        a.copy_from_slice(&c[o..o + 8]);
        u64::from_le_bytes(a)
    };
    b.chunks_exact(LOCK_LEN)
        .map(|c| {
            if c[0] > 3 {
                return Err(Error::Protocol(format!("lock kind {}", c[0])));
            }
            Ok(Lock {
                family: if c[0] & 2 != 0 {
                    Family::Flock
                } else {
                    Family::Posix
                },
                write: c[0] & 1 != 0,
                start: u64_at(c, 1),
                end: u64_at(c, 9),
                pid: u32::from_le_bytes([c[17], c[18], c[19], c[20]]),
            })
        })
        .collect()
}

/// `mine` after setting (or with `set` false, clearing) `req`'s range:
/// the engine's split, replace and merge (crates/fs/src/locks.rs).
pub fn apply(mine: &[Lock], req: Lock, set: bool) -> Vec<Lock> {
    let mut out = Vec::with_capacity(mine.len() + 2);
    for &l in mine {
        if l.family != req.family || !l.overlaps(req.start, req.end) {
            out.push(l);
            continue;
        }
        if l.start < req.start {
            out.push(Lock {
                end: req.start - 1,
                ..l
            });
        }
        if l.end > req.end {
            out.push(Lock {
                start: req.end + 1,
                ..l
            });
        }
    }
    if set {
        let mut new = req;
        out.retain(|l| {
            let touches = l.family == new.family
                && l.write == new.write
                && l.start <= new.end.saturating_add(1)
                && new.start <= l.end.saturating_add(1);
            if touches {
                new.start = new.start.min(l.start);
                new.end = new.end.max(l.end);
            }
            !touches
        });
        out.push(new);
    }
    out.sort_by_key(|l| (l.family == Family::Flock, l.start));
    out
}

/// Whether `new` lets go of anything `old` held: a byte unlocked, or an
/// exclusive byte made shared. Then waiters elsewhere may now get in.
pub fn weakens(old: &[Lock], new: &[Lock]) -> bool {
    old.iter().any(|o| {
        // Walk `o`'s range over the new locks of its family that are at
        // least as strong.
        let mut strong: Vec<&Lock> = new
            .iter()
            .filter(|n| n.family == o.family && (n.write || !o.write) && n.overlaps(o.start, o.end))
            .collect();
        strong.sort_by_key(|n| n.start);
        let mut at = o.start;
        for n in strong {
            if n.start > at {
                return true;
            }
            if n.end >= o.end {
                return false;
            }
            at = n.end + 1;
        }
        true
    })
}

/// The request of a `(start, end, typ)`, and whether it sets a lock.
fn request(family: Family, start: u64, end: u64, typ: i32, pid: u32) -> Result<(Lock, bool)> {
    if end < start {
        return Err(Error::Errno(Errno::EINVAL));
    }
    let set = match typ {
        libc::F_RDLCK | libc::F_WRLCK => true,
        libc::F_UNLCK => false,
        _ => return Err(Error::Errno(Errno::EINVAL)),
    };
    let lock = Lock {
        family,
        write: typ == libc::F_WRLCK,
        start,
        end,
        pid,
    };
    Ok((lock, set))
}

struct Waiter {
    ino: u64,
    owner: u64,
    req: Lock,
    token: u64,
    done: LockCallback,
}

struct Inner {
    h: Arc<Handle>,
    cas: Script,
    waiters: Mutex<Vec<Waiter>>,
    /// Inodes with an unlock since the waiter thread last looked.
    kicked: Mutex<HashSet<u64>>,
    wake: Condvar,
    thread: Mutex<bool>,
    /// Inodes where this session holds a lock, as its last change left
    /// them: a close of any other file asks the cluster nothing.
    held: Mutex<HashSet<u64>>,
    /// Waiters taken out of `waiters` for a retry.
    in_flight: AtomicUsize,
    /// Owners (inode, owner, family) that released their locks while some
    /// waiter was in flight: such a waiter ends with EINTR, not parked
    /// again. Locked inside `waiters` when both are.
    closing: Mutex<Vec<(u64, u64, Family)>>,
}

/// The locks of one mount.
pub struct Locks {
    inner: Arc<Inner>,
}

/// What a lock hash holds: its version and every owner's locks.
struct Table {
    version: String,
    owners: HashMap<String, Vec<Lock>>,
}

impl Inner {
    fn lock_key(&self, ino: u64) -> String {
        format!("{{{}}}:l:{ino:x}", self.h.keys.name())
    }

    fn field(&self, owner: u64) -> String {
        format!("{}:{owner}", self.h.sid())
    }

    fn read(&self, ino: u64) -> Result<Table> {
        let key = self.lock_key(ino);
        let raw: Vec<(String, Vec<u8>)> =
            retry(&self.h, |c| redis::cmd("HGETALL").arg(&key).query(c))?;
        let mut t = Table {
            version: String::new(),
            owners: HashMap::new(),
        };
        for (f, v) in raw {
            if f == "v" {
                t.version = String::from_utf8_lossy(&v).into_owned();
            } else {
                t.owners.insert(f, decode(&v)?);
            }
        }
        Ok(t)
    }

    /// The first lock of another owner that conflicts with `req`.
    fn conflict(t: &Table, me: &str, req: &Lock) -> Option<Lock> {
        t.owners
            .iter()
            .filter(|(f, _)| f.as_str() != me)
            .flat_map(|(_, ls)| ls.iter())
            .find(|l| l.conflicts(req))
            .copied()
    }

    /// One try at setting or clearing `req` for `owner`: Ok(false) when
    /// another owner's lock is in the way.
    fn attempt(&self, ino: u64, owner: u64, req: Lock, set: bool) -> Result<bool> {
        let me = self.field(owner);
        for _ in 0..CAS_ATTEMPTS {
            let t = self.read(ino)?;
            if set && Self::conflict(&t, &me, &req).is_some() {
                return Ok(false);
            }
            let old = t.owners.get(&me).cloned().unwrap_or_default();
            let new = apply(&old, req, set);
            if new == old {
                return Ok(true);
            }
            let prefix = format!("{}:", self.h.sid());
            let held = !new.is_empty()
                || t.owners
                    .iter()
                    .any(|(f, ls)| f != &me && f.starts_with(&prefix) && !ls.is_empty());
            let released = weakens(&old, &new);
            if self.cas(ino, &t.version, &me, &new, held, released)? {
                if held {
                    self.held.lock().insert(ino);
                } else {
                    self.held.lock().remove(&ino);
                }
                if released {
                    self.kick(ino);
                }
                return Ok(true);
            }
        }
        tracing::warn!(ino, "lock table kept changing: giving up");
        Err(Error::Errno(Errno::EAGAIN))
    }

    fn cas(
        &self,
        ino: u64,
        version: &str,
        field: &str,
        new: &[Lock],
        held: bool,
        released: bool,
    ) -> Result<bool> {
        let session = format!("{{{}}}:s:{}", self.h.keys.name(), self.h.sid());
        let value = encode(new);
        // Retried after a lost reply: a second run finds the version moved
        // (by the first) and returns 0, and the caller's next round reads
        // its own change back and is done.
        let written: i64 = retry(&self.h, |c| {
            self.h
                .invocation(&self.cas)
                .key(self.lock_key(ino))
                .key(&session)
                .arg(version)
                .arg(field)
                .arg(&value[..])
                .arg(format!("l:{ino:x}"))
                .arg(if held { "1" } else { "0" })
                .arg(if released { "1" } else { "0" })
                .arg(ino)
                .invoke(c)
        })?;
        Ok(written == 1)
    }

    fn kick(&self, ino: u64) {
        self.kicked.lock().insert(ino);
        self.wake.notify_all();
    }

    /// Retries the waiters of the kicked inodes (all of them with `all`).
    fn retry_waiters(&self, all: bool) {
        let kicked = std::mem::take(&mut *self.kicked.lock());
        // Nothing is in flight between two rounds (this thread alone
        // retries): the closes noted for the last round are done with.
        self.closing.lock().clear();
        let mine: Vec<Waiter> = {
            let mut ws = self.waiters.lock();
            let (go, stay): (Vec<Waiter>, Vec<Waiter>) =
                ws.drain(..).partition(|w| all || kicked.contains(&w.ino));
            *ws = stay;
            self.in_flight.fetch_add(go.len(), Ordering::AcqRel);
            go
        };
        // A waiter being retried is out of the list: a cancel meanwhile
        // answers false, and the kernel sends its interrupt again.
        for w in mine {
            let r = self.attempt(w.ino, w.owner, w.req, true);
            let me = (w.ino, w.owner, w.req.family);
            let mut ws = self.waiters.lock();
            let closed = self.closing.lock().contains(&me);
            match r {
                Ok(false) | Err(Error::Errno(Errno::EAGAIN)) if !closed => ws.push(w),
                Ok(true) if !closed => {
                    drop(ws);
                    (w.done)(Ok(()));
                }
                Ok(true) => {
                    // Granted as its owner closed the file: the close wins.
                    drop(ws);
                    let all = Lock {
                        start: 0,
                        end: u64::MAX,
                        ..w.req
                    };
                    let _ = self.attempt(w.ino, w.owner, all, false);
                    (w.done)(Err(Errno::EINTR));
                }
                Ok(false) | Err(Error::Errno(Errno::EAGAIN)) => {
                    drop(ws);
                    (w.done)(Err(Errno::EINTR));
                }
                Err(e) => {
                    drop(ws);
                    (w.done)(Err(crate::errno::errno_of(&e)));
                }
            }
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The waiter thread: until the [`Locks`] is dropped, retries waiters when
/// kicked, and all of them every [`ROUND`].
fn waiter_thread(inner: Weak<Inner>) {
    loop {
        let Some(i) = inner.upgrade() else { return };
        let all = {
            let mut k = i.kicked.lock();
            if k.is_empty() {
                i.wake.wait_for(&mut k, ROUND).timed_out()
            } else {
                false
            }
        };
        if i.waiters.lock().is_empty() {
            i.kicked.lock().clear();
            continue;
        }
        i.retry_waiters(all);
    }
}

impl Locks {
    pub fn new(h: Arc<Handle>) -> Locks {
        Locks {
            inner: Arc::new(Inner {
                h,
                cas: Script::new(&crate::lua::script(CAS)),
                waiters: Mutex::new(Vec::new()),
                kicked: Mutex::new(HashSet::new()),
                wake: Condvar::new(),
                thread: Mutex::new(false),
                held: Mutex::new(HashSet::new()),
                in_flight: AtomicUsize::new(0),
                closing: Mutex::new(Vec::new()),
            }),
        }
    }

    /// `F_GETLK`: the first lock of another owner (of any mount) that
    /// would block the request, or `F_UNLCK`.
    pub fn getlk(
        &self,
        ino: u64,
        owner: u64,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
    ) -> memfs_fs::Result<LockInfo> {
        let (req, _) =
            request(Family::Posix, start, end, typ, pid).map_err(|e| crate::errno::errno_of(&e))?;
        let t = self
            .inner
            .read(ino)
            .map_err(|e| crate::errno::errno_of(&e))?;
        Ok(LockInfo::reported(
            start,
            end,
            Inner::conflict(&t, &self.inner.field(owner), &req)
                .map(|l| (l.start, l.end, l.write, l.pid)),
        ))
    }

    /// `F_SETLK`: sets or clears a record lock without waiting (EAGAIN on
    /// a conflict).
    pub fn setlk(
        &self,
        ino: u64,
        owner: u64,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
    ) -> memfs_fs::Result<()> {
        self.set(Family::Posix, ino, owner, start, end, typ, pid)
            .map_err(|e| crate::errno::errno_of(&e))
    }

    #[allow(clippy::too_many_arguments)]
    fn set(
        &self,
        family: Family,
        ino: u64,
        owner: u64,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
    ) -> Result<()> {
        let (req, set) = request(family, start, end, typ, pid)?;
        match self.inner.attempt(ino, owner, req, set)? {
            true => Ok(()),
            false => Err(Error::Errno(Errno::EAGAIN)),
        }
    }

    /// `F_SETLKW`: like [`Locks::setlk`], but a conflicting request is
    /// parked and `done` runs once it is granted, or with EINTR when it is
    /// cancelled ([`Locks::cancel_lock_wait`] with `token`, or its owner
    /// releasing its locks). `done` may run before this returns.
    #[allow(clippy::too_many_arguments)]
    pub fn setlkw(
        &self,
        ino: u64,
        owner: u64,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        token: u64,
        done: LockCallback,
    ) {
        self.wait(Family::Posix, ino, owner, start, end, typ, pid, token, done);
    }

    #[allow(clippy::too_many_arguments)]
    fn wait(
        &self,
        family: Family,
        ino: u64,
        owner: u64,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        token: u64,
        done: LockCallback,
    ) {
        let (req, set) = match request(family, start, end, typ, pid) {
            Ok(r) => r,
            Err(e) => return done(Err(crate::errno::errno_of(&e))),
        };
        match self.inner.attempt(ino, owner, req, set) {
            Ok(true) => done(Ok(())),
            Ok(false) | Err(Error::Errno(Errno::EAGAIN)) => {
                self.ensure_thread();
                self.inner.waiters.lock().push(Waiter {
                    ino,
                    owner,
                    req,
                    token,
                    done,
                });
                // An unlock between the attempt and the push is not lost:
                // this kick makes the waiter thread try once more.
                self.inner.kick(ino);
            }
            Err(e) => done(Err(crate::errno::errno_of(&e))),
        }
    }

    fn ensure_thread(&self) {
        let mut started = self.inner.thread.lock();
        if *started {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        match std::thread::Builder::new()
            .name("memfs-lock-wait".into())
            .spawn(move || waiter_thread(weak))
        {
            Ok(_) => *started = true,
            Err(e) => tracing::error!(error = %e, "cannot start the lock waiter thread"),
        }
    }

    /// `flock(2)` across mounts: `typ` is `F_RDLCK` (shared), `F_WRLCK`
    /// (exclusive) or `F_UNLCK`; `wait` parks a conflicting request as
    /// [`Locks::setlkw`] does. (The FUSE library in use cannot tell a
    /// flock from a record lock, so the adapter does not call it yet.)
    pub fn flock(
        &self,
        ino: u64,
        owner: u64,
        typ: i32,
        wait: Option<(u64, LockCallback)>,
    ) -> memfs_fs::Result<()> {
        match wait {
            Some((token, done)) => {
                self.wait(Family::Flock, ino, owner, 0, u64::MAX, typ, 0, token, done);
                Ok(())
            }
            None => self
                .set(Family::Flock, ino, owner, 0, u64::MAX, typ, 0)
                .map_err(|e| crate::errno::errno_of(&e)),
        }
    }

    /// Cancels the parked request `token`: its callback runs with EINTR.
    /// False if no such request is parked (granted, or being retried).
    pub fn cancel_lock_wait(&self, ino: u64, token: u64) -> bool {
        let w = {
            let mut ws = self.inner.waiters.lock();
            let Some(i) = ws.iter().position(|w| w.ino == ino && w.token == token) else {
                return false;
            };
            ws.remove(i)
        };
        (w.done)(Err(Errno::EINTR));
        true
    }

    /// Drops every record lock and parked request of `owner` on `ino` (a
    /// close by the owning process).
    pub fn release_locks(&self, ino: u64, owner: u64) {
        self.release(Family::Posix, ino, owner);
    }

    /// Drops the flock of `owner` (an open file description) on `ino`.
    pub fn release_flock(&self, ino: u64, owner: u64) {
        self.release(Family::Flock, ino, owner);
    }

    fn release(&self, family: Family, ino: u64, owner: u64) {
        let gone: Vec<Waiter> = {
            let mut ws = self.inner.waiters.lock();
            let (gone, stay) = ws
                .drain(..)
                .partition(|w| w.ino == ino && w.owner == owner && w.req.family == family);
            *ws = stay;
            if self.inner.in_flight.load(Ordering::Acquire) > 0 {
                self.inner.closing.lock().push((ino, owner, family));
            }
            gone
        };
        for w in gone {
            (w.done)(Err(Errno::EINTR));
        }
        if !self.inner.held.lock().contains(&ino) {
            return;
        }
        let all = Lock {
            family,
            write: false,
            start: 0,
            end: u64::MAX,
            pid: 0,
        };
        if let Err(e) = self.inner.attempt(ino, owner, all, false) {
            tracing::warn!(ino, owner, error = %e, "could not release locks");
        }
    }

    /// The feed saw an unlock (or a reap) on `ino`: wake the waiters of
    /// `ino` to retry.
    pub fn on_unlock(&self, ino: u64) {
        self.inner.kick(ino);
    }

    /// Parked requests, those being retried included (for tests and
    /// status).
    pub fn waiting(&self) -> usize {
        // In this order: a retried waiter is put back before it leaves
        // `in_flight`, so none is missed (one may count twice).
        let n = self.inner.in_flight.load(Ordering::Acquire);
        n + self.inner.waiters.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(start: u64, end: u64, write: bool) -> Lock {
        Lock {
            family: Family::Posix,
            write,
            start,
            end,
            pid: 7,
        }
    }

    #[test]
    fn split_and_merge() {
        let a = apply(&[], l(0, 99, true), true);
        let b = apply(&a, l(40, 59, false), false);
        assert_eq!(b, vec![l(0, 39, true), l(60, 99, true)]);
        assert!(weakens(&a, &b));
        let c = apply(&b, l(40, 59, true), true);
        assert_eq!(c, vec![l(0, 99, true)]);
        assert!(!weakens(&b, &c));
        let d = apply(&c, l(10, 19, false), true);
        assert_eq!(d, vec![l(0, 9, true), l(10, 19, false), l(20, 99, true)]);
        assert!(weakens(&c, &d), "exclusive made shared");
        let e = apply(&[], l(5, u64::MAX, true), true);
        assert_eq!(apply(&e, l(0, u64::MAX, false), false), vec![]);
    }

    #[test]
    fn families_and_encoding() {
        let f = Lock {
            family: Family::Flock,
            ..l(0, u64::MAX, true)
        };
        assert!(!f.conflicts(&l(0, 1, true)));
        assert!(l(0, 9, false).conflicts(&l(9, 9, true)));
        assert!(!l(0, 9, false).conflicts(&l(0, 9, false)));
        let v = vec![l(1, 2, false), f];
        assert_eq!(decode(&encode(&v)).unwrap(), v);
        assert!(decode(&[0; 20]).is_err());
        let mut bad = encode(&v);
        bad[0] = 9;
        assert!(decode(&bad).is_err());
    }
}
