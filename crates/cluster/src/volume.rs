//! [`Volume`]: one mount of a volume (docs/cluster.md). Its methods have
//! the signatures of `memfs_fuse::Tree`'s (crates/fuse/src/tree.rs), so the
//! adapter delegates to them one for one; they mean what the engine's
//! methods of the same name mean, errors included.
//!
//! A volume is served by: the namespace scripts (crate::namespace), one
//! atomic script per operation on the metadata master; the metadata cache
//! (crate::cache), filled by reads and by the replies of this mount's own
//! changes, emptied by the feed; file data (crate::data) and locks
//! (crate::locks); the session and its lease thread (crate::session); the
//! feed reader thread (crate::feed). Nothing here panics on a cluster
//! failure: every error becomes an errno by `errno::errno_of` (ESTALE when
//! fenced, ENOSPC when the master is full, EIO on a timeout or a lost
//! cluster), and every call is bounded by the options' timeout.
//!
//! What a volume does not have (yet): POSIX ACLs (their xattr names are
//! EOPNOTSUPP: mount without `posix_acl`, so the kernel applies the
//! umask), inode flags (`chattr`: ENOTTY), O_TMPFILE (EOPNOTSUPP),
//! RENAME_WHITEOUT (EINVAL), and access times (reads leave atime alone, as
//! `noatime`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;

use memfs_fs::{
    AtimeMode, Attr, Ctx, DirEntry, Errno, FIRST_ENTRY_OFFSET, FallocateMode, FileType,
    LockCallback, LockInfo, MAX_FILE_SIZE, NAME_MAX, PAGE_SIZE, ROOT_INO, RenameFlags, SYMLINK_MAX,
    SetAttr, SetTime, StatFs, Timespec, XATTR_NAME_MAX, XattrMode,
};
use parking_lot::{Mutex, RwLock};

use crate::admin::DEFAULT_TIMEOUT;
use crate::cache::{Cache, Listing};
use crate::data::Data;
use crate::errno::errno_of;
use crate::error::{Error, Result};
use crate::feed::{self, Sink};
use crate::handle::{Handle, now_ns};
use crate::keys::Keys;
use crate::locks::Locks;
use crate::namespace::{MetaSet, Renamed, Scripts};
use crate::pool::Pool;
use crate::record::{Kind, Record};
use crate::session::{Reaped, Session, Stop};
use crate::space::{Room, Space};

type Fres<T> = memfs_fs::Result<T>;

/// How a volume is mounted.
#[derive(Clone, Debug)]
pub struct VolumeOptions {
    /// Bytes of blocks + metadata cached (default 1 GiB).
    pub cache_size: u64,
    /// The bound on every cluster call (default 30 s).
    pub timeout: Duration,
    /// The session's lease (default 20 s), renewed every lease/4.
    pub lease: Duration,
    /// Recorded in the session hash.
    pub mountpoint: String,
}

impl Default for VolumeOptions {
    fn default() -> VolumeOptions {
        VolumeOptions {
            cache_size: 1 << 30,
            timeout: DEFAULT_TIMEOUT,
            lease: Duration::from_secs(20),
            mountpoint: String::new(),
        }
    }
}

/// A change another mount made, for the kernel's caches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Inode(u64),
    Entry {
        parent: u64,
        name: Vec<u8>,
    },
    /// Anything may have changed (the files open here are each named
    /// with `Inode` just before).
    All,
}

/// What `memfs status` shows of a volume mount.
#[derive(Clone, Debug)]
pub struct VolumeStatus {
    pub volume: String,
    pub seeds: Vec<String>,
    pub session: u64,
    pub lease_ok: bool,
    pub cache_bytes: u64,
    pub cache_limit: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub block_size: u32,
    /// Namespace scripts this mount sent (crate::handle::CallCounts).
    pub scripts: u64,
    /// Calls of its data path.
    pub data_calls: u64,
}

type Callback = Box<dyn Fn(Change) + Send + Sync>;

/// What the threads share with the calls.
struct Inner {
    h: Arc<Handle>,
    ns: Scripts,
    cache: Cache,
    data: Data,
    locks: Locks,
    /// This mount's opens, by ino.
    opens: Mutex<HashMap<u64, u32>>,
    /// Orphans (unlinked, open here) whose hold this session registered.
    held: Mutex<HashSet<u64>>,
    on_change: RwLock<Option<Callback>>,
    /// Sessions this mount had before its lease was lost.
    old_sids: Mutex<Vec<u64>>,
    session: Arc<Session>,
    /// The cluster's memory, for statfs.
    space: Space,
    opts: VolumeOptions,
    /// The feed reader's progress ([`Inner::fresh`]).
    feed: Arc<feed::State>,
}

/// One mount of a volume; see the module doc.
pub struct Volume {
    inner: Arc<Inner>,
    stop: Arc<Stop>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

fn err(e: Error) -> Errno {
    errno_of(&e)
}

fn ts(ns: i64) -> Timespec {
    Timespec {
        sec: ns.div_euclid(1_000_000_000),
        nsec: ns.rem_euclid(1_000_000_000) as u32,
    }
}

fn ns_of(t: Timespec) -> i64 {
    t.sec
        .saturating_mul(1_000_000_000)
        .saturating_add(i64::from(t.nsec))
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::Char => FileType::CharDevice,
        Kind::Block => FileType::BlockDevice,
    }
}

fn kind_of(t: FileType) -> Kind {
    match t {
        FileType::RegularFile => Kind::File,
        FileType::Directory => Kind::Dir,
        FileType::Symlink => Kind::Symlink,
        FileType::NamedPipe => Kind::Fifo,
        FileType::Socket => Kind::Socket,
        FileType::CharDevice => Kind::Char,
        FileType::BlockDevice => Kind::Block,
    }
}

fn type_of_code(c: u8) -> FileType {
    match c {
        2 => FileType::Directory,
        3 => FileType::Symlink,
        4 => FileType::NamedPipe,
        5 => FileType::Socket,
        6 => FileType::CharDevice,
        7 => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

/// The engine's name checks (crates/fs `check_name`).
fn check_name(name: &[u8]) -> Fres<()> {
    if name.is_empty() {
        return Err(Errno::ENOENT);
    }
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if name.contains(&b'/') || name.contains(&0) {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

fn check_new_name(name: &[u8]) -> Fres<()> {
    check_name(name)?;
    if is_dot(name) {
        return Err(Errno::EEXIST);
    }
    Ok(())
}

/// The engine's xattr name check; the POSIX ACLs are not kept on a volume.
fn check_xattr_name(name: &[u8]) -> Fres<()> {
    if name.is_empty() || name.len() > XATTR_NAME_MAX {
        return Err(Errno::ERANGE);
    }
    let known = [&b"user."[..], b"trusted.", b"security."];
    if !known
        .iter()
        .any(|p| name.starts_with(p) && name.len() > p.len())
    {
        return Err(Errno::EOPNOTSUPP);
    }
    Ok(())
}

/// Clears setuid, and setgid with group-exec (the engine's `kill_priv`).
fn kill_priv(perm: u16) -> u16 {
    let mut p = perm & !(libc::S_ISUID as u16);
    if p & libc::S_IXGRP as u16 != 0 {
        p &= !(libc::S_ISGID as u16);
    }
    p
}

/// The engine's `drop_privs`: what a write by a caller without CAP_FSETID
/// leaves of setuid and setgid.
fn drop_privs(perm: u16, gid: u32, ctx: Ctx, in_group: &dyn Fn(u32) -> bool) -> u16 {
    let mut p = kill_priv(perm);
    if p & libc::S_ISGID as u16 != 0 && ctx.gid != gid && !in_group(gid) {
        p &= !(libc::S_ISGID as u16);
    }
    p
}

/// A stable readdir offset for `name` (FNV-1a, above the offsets of `.`
/// and `..`): the same name has the same offset for as long as it exists,
/// whatever else changes in the directory.
fn name_offset(name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    FIRST_ENTRY_OFFSET + 1 + (h >> 2)
}

fn time_arg(t: Option<SetTime>) -> Vec<u8> {
    match t {
        None => Vec::new(),
        Some(SetTime::Now) => b"now".to_vec(),
        Some(SetTime::At(t)) => ns_of(t).to_le_bytes().to_vec(),
    }
}

impl Volume {
    /// Mounts volume `name` of the cluster reached through `urls`: reads
    /// `{V}:meta` for the block size, registers a session, starts the
    /// lease and feed threads.
    pub fn open(urls: &[String], name: &str, opts: &VolumeOptions) -> Result<Arc<Volume>> {
        let keys = Keys::new(name)?;
        if opts.lease < Duration::from_millis(200) {
            return Err(Error::BadOption(format!(
                "lease {:?}: at least 200 ms",
                opts.lease
            )));
        }
        let pool = Pool::connect(urls, opts.timeout)?;
        let bs: Option<u32> = pool.with(|c| {
            redis::cmd("HGET")
                .arg(keys.meta())
                .arg("block_size")
                .query(c)
        })?;
        let bs = bs.ok_or_else(|| Error::NotFound(name.to_string()))?;
        if !bs.is_power_of_two() {
            return Err(Error::Protocol(format!("volume {name:?}: block size {bs}")));
        }
        let h = Arc::new(Handle::new(pool, keys.clone(), bs));
        let session = Arc::new(Session::new(opts.lease, &opts.mountpoint));
        let start = session.register(&h)?;
        let inner = Arc::new(Inner {
            ns: Scripts::new(),
            cache: Cache::new(opts.cache_size),
            data: Data::new(h.clone(), opts.cache_size),
            locks: Locks::new(h.clone()),
            opens: Mutex::default(),
            held: Mutex::default(),
            on_change: RwLock::new(None),
            old_sids: Mutex::default(),
            session: session.clone(),
            space: Space::pooled(h.clone()),
            opts: opts.clone(),
            h: h.clone(),
            feed: Arc::default(),
        });
        let stop = Arc::new(Stop::default());
        let mut threads = Vec::new();
        let (i2, s2) = (inner.clone(), stop.clone());
        let free = Box::new(move |r: Reaped| i2.reaped(r));
        let i3 = inner.clone();
        let lost = Box::new(move |sid: u64| i3.session_lost(sid));
        let h2 = h.clone();
        threads.push(spawn("memfs-lease", move || {
            session.run(h2, s2, free, lost)
        })?);
        let reader = feed::Reader {
            seeds: urls.to_vec(),
            keys,
            timeout: opts.timeout,
            state: inner.feed.clone(),
        };
        let (s3, sink) = (stop.clone(), inner.clone() as Arc<dyn Sink>);
        threads.push(spawn("memfs-feed", move || reader.run(start, s3, sink))?);
        Ok(Arc::new(Volume {
            inner,
            stop,
            threads: Mutex::new(threads),
        }))
    }

    /// Called from the feed thread for each change another mount made
    /// (never with a lock of the volume held).
    pub fn on_change(&self, f: Box<dyn Fn(Change) + Send + Sync>) {
        *self.inner.on_change.write() = Some(f);
    }

    pub fn status(&self) -> VolumeStatus {
        let i = &self.inner;
        let (hits, misses) = i.cache.hits();
        let (dh, dm) = i.data.hits();
        let calls = i.h.calls();
        VolumeStatus {
            volume: i.h.keys.name().to_string(),
            seeds: i.h.pool.seeds().to_vec(),
            session: i.h.sid(),
            lease_ok: i.session.lease.ok.load(Ordering::Acquire),
            cache_bytes: i.cache.bytes() + i.data.cached_bytes(),
            cache_limit: i.opts.cache_size,
            cache_hits: hits + dh,
            cache_misses: misses + dm,
            block_size: i.h.block_size,
            scripts: calls.scripts,
            data_calls: calls.data,
        }
    }

    /// Flushes every dirty file, ends the session (its opens of unlinked
    /// files are released), stops the threads. Idempotent.
    pub fn close(&self) -> Result<()> {
        let threads = std::mem::take(&mut *self.threads.lock());
        if threads.is_empty() {
            return Ok(());
        }
        let i = &self.inner;
        let open: Vec<u64> = i.opens.lock().keys().copied().collect();
        let mut first_err = None;
        for ino in open {
            if let Err(e) = i.data.flush(ino) {
                tracing::error!(ino, error = %e, "close: dirty data not written");
                first_err.get_or_insert(e);
            }
        }
        i.data.free_pending();
        let held: Vec<u64> = i.held.lock().drain().collect();
        for ino in held {
            i.release_hold(ino);
        }
        self.stop.stop();
        for t in threads {
            let _ = t.join();
        }
        if let Err(e) = i.session.end(&i.h) {
            first_err.get_or_insert(e);
        }
        first_err.map_or(Ok(()), Err)
    }

    /// close(2) of a file: what this mount wrote to `ino` is in the cluster
    /// when it returns, and every other live mount has applied the feed
    /// entry of it, or 2 s passed (close-to-open: [`Inner::revalidate`]).
    pub fn flush(&self, ino: u64) -> Fres<()> {
        let i = &self.inner;
        let e = i.cache.epoch();
        if let Some(r) = i.data.flush(ino).map_err(err)? {
            i.cache.put_rec(e, ino, r);
        }
        i.data.await_acks(ino);
        Ok(())
    }

    /// Tests: pauses this mount's feed reader between two reads (`on`),
    /// waiting at most `within` until it is parked, or lets it go on.
    /// Returns whether it is parked (`on` false: true). A paused reader
    /// applies and acks nothing, as one whose mount hangs.
    #[doc(hidden)]
    pub fn pause_feed(&self, on: bool, within: Duration) -> bool {
        self.inner.feed.pause(on, within)
    }

    /// Whether an open of a cached file is served from the cache now, with
    /// no round trip ([`Inner::fresh`]): `memfs status` and the tests.
    pub fn cache_trusted(&self) -> bool {
        self.inner.fresh()
    }

    /// Closes and fsyncs whose wait for the other mounts' acks ran out.
    pub fn ack_timeouts(&self) -> u64 {
        self.inner.data.ack_timeouts()
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(Error::io(format!("start thread {name}")))
}

impl Drop for Volume {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::warn!(error = %e, "volume close on drop");
        }
    }
}

impl Sink for Inner {
    fn is_mine(&self, sid: u64) -> bool {
        sid == self.h.sid() || self.old_sids.lock().contains(&sid)
    }

    fn sid(&self) -> u64 {
        self.h.sid()
    }

    fn entry(&self, e: &feed::Entry) {
        let mut changes = Vec::new();
        for ino in [e.ino, e.ino2].into_iter().filter(|&i| i != 0) {
            self.cache.forget_rec(ino);
            changes.push(Change::Inode(ino));
        }
        for (parent, name) in [&e.name, &e.name2].into_iter().flatten() {
            self.cache.forget_ent(*parent, name);
            self.cache.forget_rec(*parent);
            changes.push(Change::Entry {
                parent: *parent,
                name: name.clone(),
            });
            changes.push(Change::Inode(*parent));
        }
        match e.op.as_str() {
            "write" | "truncate" | "setattr" => self.data.invalidate(e.ino),
            "rename" => self.cache.forget_ent(e.ino, b".."),
            "rmdir" => self.cache.forget_dir(e.ino),
            "reap" => {
                self.data.forget(e.ino);
                self.held.lock().remove(&e.ino);
            }
            "unlock" => self.locks.on_unlock(e.ino),
            "orphan" => self.hold_if_open(e.ino),
            _ => {}
        }
        if e.op == "reap" || e.op == "unlink" {
            self.locks.on_unlock(e.ino);
        }
        if let Some(f) = self.on_change.read().as_ref() {
            for c in changes {
                f(c);
            }
        }
    }

    fn lost(&self) {
        self.cache.clear();
        self.data.invalidate_all();
        // The kernel reaches an open file's attributes through its handle,
        // not a name: All (every name looked up again) would leave them.
        let open: Vec<u64> = self.opens.lock().keys().copied().collect();
        if let Some(f) = self.on_change.read().as_ref() {
            for ino in open {
                f(Change::Inode(ino));
            }
            f(Change::All);
        }
    }
}

impl Inner {
    fn grace_ms(&self) -> u64 {
        self.opts.lease.as_millis() as u64
    }

    /// Another mount orphaned `ino`: hold it if it is open here.
    fn hold_if_open(&self, ino: u64) {
        if !self.opens.lock().contains_key(&ino) {
            return;
        }
        match self.ns.hold(&self.h, ino, true, self.grace_ms()) {
            Ok(_) => {
                self.held.lock().insert(ino);
            }
            Err(e) => tracing::warn!(ino, error = %e, "cannot hold an orphan open here"),
        }
    }

    /// The last open here of orphan `ino` ended.
    fn release_hold(&self, ino: u64) {
        match self.ns.hold(&self.h, ino, false, self.grace_ms()) {
            Ok(freed) if !freed.is_empty() => {
                self.data.free_blocks(&freed);
                self.data.forget(ino);
                self.cache.forget_rec(ino);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(ino, error = %e, "orphan left for the reaper"),
        }
    }

    /// This mount's renewal freed orphans (its own feed entries of that
    /// are skipped, so its caches hear of it here).
    fn reaped(&self, r: Reaped) {
        self.data.free_blocks(&r.freed);
        for ino in r.unlocked {
            self.locks.on_unlock(ino);
        }
        for ino in r.inos {
            self.cache.forget_rec(ino);
            self.data.forget(ino);
            self.held.lock().remove(&ino);
            if let Some(f) = self.on_change.read().as_ref() {
                f(Change::Inode(ino));
            }
        }
    }

    /// The lease thread lost session `sid`.
    fn session_lost(&self, sid: u64) {
        self.old_sids.lock().push(sid);
        let held = std::mem::take(&mut *self.held.lock());
        if !held.is_empty() {
            tracing::error!(
                sid,
                orphans = held.len(),
                "holds of unlinked open files lost with the session"
            );
        }
        let open: Vec<u64> = self.opens.lock().keys().copied().collect();
        for ino in open {
            if self.data.dirty(ino).is_some() {
                tracing::error!(sid, ino, "dirty data of a fenced session is lost");
                self.data.forget(ino);
            }
        }
    }

    /// The metadata cache gets what the block cache leaves of the mount's
    /// cache size.
    fn fit_cache(&self) {
        let blocks = self.data.cached_bytes();
        self.cache
            .set_limit(self.opts.cache_size.saturating_sub(blocks));
    }

    /// `ino`'s record, from the cache or the cluster.
    fn rec(&self, ino: u64) -> Fres<Record> {
        if let Some(r) = self.cache.rec(ino) {
            return Ok(r);
        }
        self.fit_cache();
        let e = self.cache.epoch();
        let mut recs = self.ns.records(&self.h, &[ino]).map_err(err)?;
        let r = recs.pop().flatten().ok_or(Errno::ENOENT)?;
        self.cache.put_rec(e, ino, r.clone());
        Ok(r)
    }

    /// Whether the feed has told this mount of every change another one
    /// closed before now, so that an open may trust the cache (see
    /// [`Inner::revalidate`]): the feed reader's last caught-up read was
    /// sent less than [`feed::FRESH`] ago, under the session this mount has
    /// now, and that session's lease surely still runs by this process's
    /// clock (so it was live throughout: a lapsed lease is never renewed).
    fn fresh(&self) -> bool {
        let sid = self.h.sid();
        sid != 0 && self.session.lease.live() && self.feed.fresh(sid)
    }

    /// Close-to-open (docs/cluster.md, "Many mounts, one truth"): the first
    /// open here of a file that this mount has no unwritten data of is
    /// served from the cache, with no round trip, when the mount is
    /// [`Inner::fresh`]; otherwise it reads the record from the cluster
    /// (one round trip), so what another mount wrote and closed before
    /// this open is what it reads, whether or not the feed entry has
    /// arrived yet. A file already open here is kept current by the feed,
    /// and costs none.
    ///
    /// Why the cache is enough when fresh: say a writer W committed a
    /// change at C (its feed entry exists from C on) and its close returned
    /// at R, and this mount opens at O > R. W's commit named this session
    /// if it was live at C by the server's clock. Then either (a) this
    /// mount acked the entry before R: its feed reader applied it (the
    /// cache forgot the record and the block map) before the ack; or (b)
    /// W gave up waiting: R >= C + 2 s (`data::ACK_WAIT`). In (b), a
    /// caught-up read sent at S with O - S < 1.5 s (`feed::FRESH`) has
    /// S > O - 1.5 s > R - 1.5 s >= C + 0.5 s > C: sent after the entry
    /// existed, and applied whole, so it brought the entry. Or (c) the
    /// session was not live at C (or stopped being live while W waited):
    /// then this session id's lease lapsed, and it can never be renewed,
    /// so [`Inner::fresh`] fails (a new session is a new id, whose
    /// caught-up reads must have been sent after it registered). The
    /// instants are this process's monotonic clock, compared only with
    /// each other; the server's clock decides liveness only in the scripts.
    /// A changed record drops the file's block map here and its attributes
    /// and pages in the kernel. A record this mount did not have cached
    /// cannot be compared: the map is dropped too.
    ///
    /// Returns the record and whether the kernel's pages of the file from
    /// this mount are still current (the open may keep them:
    /// [`Data::pages_current`]): when the record is unchanged, or the file
    /// is kept current by the feed (open here) or has writes of this mount
    /// only.
    fn revalidate(&self, ino: u64) -> Fres<(Record, bool)> {
        let cached = self.cache.rec(ino);
        let open_here = self.opens.lock().contains_key(&ino);
        if let Some(r) = &cached
            && (r.kind != Kind::File || open_here || self.data.dirty(ino).is_some() || self.fresh())
        {
            let current = r.kind != Kind::File || self.data.pages_current(ino, true);
            return Ok((r.clone(), current));
        }
        self.fit_cache();
        let e = self.cache.epoch();
        let mut recs = self.ns.records(&self.h, &[ino]).map_err(err)?;
        let fresh = recs.pop().flatten().ok_or(Errno::ENOENT)?;
        if fresh.kind != Kind::File {
            self.cache.put_rec(e, ino, fresh.clone());
            return Ok((fresh, true));
        }
        let unchanged = cached.as_ref() == Some(&fresh) || open_here;
        if unchanged {
            self.cache.put_rec(e, ino, fresh.clone());
            return Ok((fresh, self.data.pages_current(ino, true)));
        }
        self.data.pages_current(ino, false);
        // Not stored: forgetting moves the epoch on, and the next read of
        // the record fetches it after whatever the feed brings meanwhile.
        self.data.invalidate(ino);
        self.cache.forget_rec(ino);
        if cached.is_some()
            && let Some(f) = self.on_change.read().as_ref()
        {
            f(Change::Inode(ino));
        }
        Ok((fresh, false))
    }

    /// The attributes of `ino` with record `r`, this mount's unwritten
    /// data included.
    fn attr(&self, ino: u64, r: &Record) -> Attr {
        let (mut size, mut mtime, mut ctime) = (r.size, r.mtime, r.ctime);
        if r.kind == Kind::File
            && let Some((s, m)) = self.data.dirty(ino)
        {
            size = s;
            mtime = m;
            ctime = ctime.max(m);
        }
        let blocks = if r.kind == Kind::File {
            size.div_ceil(512)
        } else {
            0
        };
        Attr {
            ino,
            kind: file_type(r.kind),
            perm: r.mode,
            nlink: r.nlink,
            uid: r.uid,
            gid: r.gid,
            rdev: r.rdev,
            size,
            blocks,
            atime: ts(r.atime),
            mtime: ts(mtime),
            ctime: ts(ctime),
            btime: ts(r.btime),
            blksize: self.h.block_size,
        }
    }

    fn size_of(&self, ino: u64, r: &Record) -> u64 {
        self.data.dirty(ino).map_or(r.size, |(s, _)| s)
    }

    /// The ino of `name` in `parent` if this mount has it open (0 if not):
    /// a node removed while open here becomes an orphan.
    fn held_target(&self, parent: u64, name: &[u8]) -> u64 {
        if self.opens.lock().is_empty() {
            return 0;
        }
        let ino = match self.cache.ent(parent, name) {
            Some(Some(ino)) => ino,
            Some(None) => return 0,
            None => match self.ns.lookup(&self.h, parent, name) {
                Ok(Some((ino, _))) => ino,
                _ => return 0,
            },
        };
        if self.opens.lock().contains_key(&ino) {
            ino
        } else {
            0
        }
    }

    fn lookup(&self, parent: u64, name: &[u8]) -> Fres<Attr> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        if name == b"." || (name == b".." && parent == ROOT_INO) {
            let r = self.rec(parent)?;
            if name == b".." && r.kind != Kind::Dir {
                return Err(Errno::ENOTDIR);
            }
            if r.nlink == 0 {
                return Err(Errno::ENOENT);
            }
            return Ok(self.attr(parent, &r));
        }
        match self.cache.ent(parent, name) {
            Some(None) => return Err(Errno::ENOENT),
            Some(Some(ino)) => {
                if let Ok(r) = self.rec(ino) {
                    return Ok(self.attr(ino, &r));
                }
            }
            None => {}
        }
        let e = self.cache.epoch();
        match self.ns.lookup(&self.h, parent, name).map_err(err)? {
            None => {
                self.cache.put_ent(e, parent, name, None);
                Err(Errno::ENOENT)
            }
            Some((ino, r)) => {
                self.cache.put_ent(e, parent, name, Some(ino));
                self.cache.put_rec(e, ino, r.clone());
                Ok(self.attr(ino, &r))
            }
        }
    }

    /// Makes a node: `r` is its record as the caller asks for it.
    fn make(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        r: &Record,
        open_existing: bool,
        op: &str,
    ) -> Fres<(Attr, bool)> {
        let e = self.cache.epoch();
        let owner = (ctx.uid, ctx.gid);
        let m = match self
            .ns
            .make(&self.h, parent, name, r, owner, open_existing, op)
        {
            Ok(m) => m,
            Err(x) => {
                // The cache may have called the name free when another
                // mount had just taken it (within the feed's lag).
                self.cache.forget_ent(parent, name);
                return Err(err(x));
            }
        };
        let e = self.cache.changed(e);
        let now = Some((m.ino, m.rec.kind as u8));
        self.cache.own_ent(e, parent, name, name_offset(name), now);
        self.cache.put_rec(e, m.ino, m.rec.clone());
        self.cache.put_rec(e, parent, m.parent);
        if m.created && m.rec.kind == Kind::Dir {
            self.cache.new_dir(e, m.ino, parent);
        }
        Ok((self.attr(m.ino, &m.rec), m.created))
    }

    fn new_record(&self, kind: Kind, mode: u32, umask: u32, ctx: Ctx) -> Record {
        let mut r = Record::new(
            kind,
            (mode & 0o7777 & !(umask & 0o777)) as u16,
            ctx.uid,
            ctx.gid,
            now_ns(),
        );
        if kind == Kind::Dir {
            r.size = 40;
        }
        r
    }

    fn remove(&self, parent: u64, name: &[u8], want_dir: bool) -> Fres<()> {
        check_name(name)?;
        if want_dir && name == b"." {
            return Err(Errno::EINVAL);
        }
        if want_dir && name == b".." {
            return Err(Errno::ENOTEMPTY);
        }
        if !want_dir && is_dot(name) {
            return Err(Errno::EISDIR);
        }
        let held = self.held_target(parent, name);
        let e = self.cache.epoch();
        let r = match self.ns.remove(&self.h, parent, name, want_dir, held) {
            Ok(r) => r,
            Err(x) => {
                self.cache.forget_ent(parent, name);
                return Err(err(x));
            }
        };
        let e = self.cache.changed(e);
        self.cache.own_ent(e, parent, name, name_offset(name), None);
        self.cache.put_rec(e, parent, r.parent);
        match r.rec {
            Some(rec) => {
                if rec.nlink == 0 && held == r.ino {
                    self.held.lock().insert(r.ino);
                }
                self.cache.put_rec(e, r.ino, rec);
            }
            None => self.gone(r.ino),
        }
        if !r.freed.is_empty() {
            self.data.free_blocks(&r.freed);
        }
        Ok(())
    }

    /// A node this mount removed is gone: its record, its listing if a
    /// directory, and its file state.
    fn gone(&self, ino: u64) {
        self.cache.forget_rec(ino);
        self.cache.forget_dir(ino);
        self.data.forget(ino);
    }

    fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
    ) -> Fres<()> {
        check_name(name)?;
        check_name(newname)?;
        if is_dot(name) || is_dot(newname) {
            return Err(Errno::EBUSY);
        }
        if flags.noreplace && flags.exchange {
            return Err(Errno::EINVAL);
        }
        let held = if flags.exchange {
            0
        } else {
            self.held_target(newparent, newname)
        };
        let e = self.cache.epoch();
        let r = self.ns.rename(
            &self.h,
            parent,
            name,
            newparent,
            newname,
            flags.noreplace,
            flags.exchange,
            held,
        );
        let r = match r {
            Ok(r) => r,
            Err(x) => {
                self.cache.forget_ent(parent, name);
                self.cache.forget_ent(newparent, newname);
                return Err(err(x));
            }
        };
        // Stores first: a forget bumps the epoch, which would refuse them.
        let e = self.cache.changed(e);
        if r.src != 0 {
            self.renamed(e, &r, (parent, name), (newparent, newname), flags.exchange);
        }
        let mut gone = Vec::new();
        for (ino, rec) in r.recs {
            match rec {
                Some(rec) => {
                    if rec.nlink == 0 && ino == held {
                        self.held.lock().insert(ino);
                    }
                    self.cache.put_rec(e, ino, rec);
                }
                None => gone.push(ino),
            }
        }
        for ino in gone {
            self.gone(ino);
        }
        if !r.freed.is_empty() {
            self.data.free_blocks(&r.freed);
        }
        Ok(())
    }

    /// The entries rename `r` changed, from `from` to `to` (`e` is
    /// `Cache::changed`'s): the two names, and a moved directory's `..`.
    fn renamed(&self, e: u64, r: &Renamed, from: (u64, &[u8]), to: (u64, &[u8]), exchange: bool) {
        let kind = |ino: u64| {
            r.recs
                .iter()
                .find(|x| x.0 == ino)
                .and_then(|x| x.1.as_ref())
                .map(|r| r.kind)
        };
        let (src, victim) = (kind(r.src), kind(r.victim));
        let Some(sk) = src.filter(|_| !exchange || victim.is_some()) else {
            // The script returns both records: a reply without is not
            // trusted for the names.
            self.cache.forget_ent(from.0, from.1);
            self.cache.forget_ent(to.0, to.1);
            return;
        };
        let left = victim.filter(|_| exchange).map(|k| (r.victim, k as u8));
        self.cache
            .own_ent(e, from.0, from.1, name_offset(from.1), left);
        let now = Some((r.src, sk as u8));
        self.cache.own_ent(e, to.0, to.1, name_offset(to.1), now);
        if from.0 != to.0 {
            if sk == Kind::Dir {
                self.cache.moved_dir(e, r.src, to.0);
            }
            if exchange && victim == Some(Kind::Dir) {
                self.cache.moved_dir(e, r.victim, from.0);
            }
        }
    }

    fn setattr(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        ino: u64,
        set: &SetAttr,
    ) -> Fres<Attr> {
        let explicit = [set.atime, set.mtime]
            .into_iter()
            .flatten()
            .filter_map(|t| match t {
                SetTime::At(t) => Some(t),
                SetTime::Now => None,
            });
        if explicit.chain(set.ctime).any(|t| t.nsec >= 1_000_000_000) {
            return Err(Errno::EINVAL);
        }
        let mut r = self.rec(ino)?;
        let e = self.cache.epoch();
        if let Some(size) = set.size {
            match r.kind {
                Kind::File => {}
                Kind::Dir => return Err(Errno::EISDIR),
                _ => return Err(Errno::EINVAL),
            }
            if size > MAX_FILE_SIZE {
                return Err(Errno::EFBIG);
            }
            r = self.data.truncate(ino, size).map_err(err)?;
            self.cache.put_rec(e, ino, r.clone());
        }
        let meta = set.mode.is_some()
            || set.uid.is_some()
            || set.gid.is_some()
            || set.atime.is_some()
            || set.mtime.is_some()
            || set.ctime.is_some();
        let nothing = *set == SetAttr::default();
        let truncated = set.size.is_some() && ctx.uid != 0;
        if meta || nothing || truncated {
            let s = MetaSet {
                mode: set.mode,
                uid: set.uid,
                gid: set.gid,
                atime: time_arg(set.atime),
                mtime: time_arg(set.mtime),
                ctime: set
                    .ctime
                    .map(|t| ns_of(t).to_le_bytes().to_vec())
                    .unwrap_or_default(),
                ctx_uid: ctx.uid,
                ctx_gid: ctx.gid,
                in_group: (r.gid, in_group(r.gid)),
                truncated,
                nothing,
            };
            let e = self.cache.epoch();
            r = match self.ns.setattr(&self.h, ino, &s) {
                Ok(r) => r,
                Err(x) => {
                    self.cache.forget_rec(ino);
                    return Err(err(x));
                }
            };
            let e = self.cache.changed(e);
            self.cache.put_rec(e, ino, r.clone());
        }
        Ok(self.attr(ino, &r))
    }

    /// A regular file's record for a change of its data; EISDIR for a
    /// directory, `other` for the rest.
    fn file(&self, ino: u64, other: Errno) -> Fres<Record> {
        let r = self.rec(ino)?;
        match r.kind {
            Kind::File => Ok(r),
            Kind::Dir => Err(Errno::EISDIR),
            _ => Err(other),
        }
    }

    /// A write by a caller without CAP_FSETID drops setuid and setgid.
    fn kill_suidgid(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        ino: u64,
        r: &Record,
    ) -> Fres<()> {
        let p = drop_privs(r.mode, r.gid, ctx, in_group);
        if p == r.mode {
            return Ok(());
        }
        let set = SetAttr {
            mode: Some(u32::from(p)),
            ..SetAttr::default()
        };
        self.setattr(Ctx::ROOT, &|_| true, ino, &set).map(drop)
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        kill_suidgid: bool,
        ino: u64,
        off: u64,
        parts: &[&[u8]],
        append: bool,
    ) -> Fres<usize> {
        let r = self.file(ino, Errno::EINVAL)?;
        let size = self.size_of(ino, &r);
        let off = if append { size } else { off };
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if off.saturating_add(len as u64) > MAX_FILE_SIZE {
            return Err(Errno::EFBIG);
        }
        if len == 0 {
            return Ok(0);
        }
        if kill_suidgid {
            self.kill_suidgid(ctx, in_group, ino, &r)?;
        }
        let new = self.data.write_parts(ino, off, parts, size).map_err(err)?;
        let now = now_ns();
        self.cache.update_rec(ino, |r| {
            r.size = r.size.max(new);
            r.mtime = now;
            r.ctime = now;
        });
        Ok(len)
    }

    fn listing(&self, ino: u64) -> Fres<(Arc<Listing>, Record)> {
        if let Some(l) = self.cache.list(ino)
            && let Ok(r) = self.rec(ino)
        {
            return Ok((l, r));
        }
        self.fit_cache();
        let e = self.cache.epoch();
        let (r, ents) = self.ns.list(&self.h, ino).map_err(err)?;
        let mut parent = ino;
        let mut entries = Vec::with_capacity(ents.len());
        let mut bytes = 0;
        for (name, child, code) in ents {
            if name == b".." {
                parent = child;
                continue;
            }
            bytes += name.len() as u64 + 32;
            entries.push((name_offset(&name), name, child, code));
        }
        entries.sort();
        for i in 1..entries.len() {
            // Two names of one hash (2^-62): the later one moves on by one.
            if entries[i].0 <= entries[i - 1].0 {
                entries[i].0 = entries[i - 1].0 + 1;
            }
        }
        let l = Arc::new(Listing {
            parent,
            entries,
            bytes,
        });
        self.cache.put_list(e, ino, l.clone());
        self.cache.put_rec(e, ino, r.clone());
        Ok((l, r))
    }

    /// Records of the entries of `l` from `offset` on that are not cached
    /// (up to a batch), fetched in one call.
    fn prefetch(&self, l: &Listing, offset: u64) {
        let want: Vec<u64> = l
            .entries
            .iter()
            .filter(|e| e.0 > offset)
            .take(512)
            .map(|e| e.2)
            .filter(|&i| self.cache.rec(i).is_none())
            .collect();
        if want.is_empty() {
            return;
        }
        let e = self.cache.epoch();
        if let Ok(recs) = self.ns.records(&self.h, &want) {
            for (ino, r) in want.into_iter().zip(recs) {
                if let Some(r) = r {
                    self.cache.put_rec(e, ino, r);
                }
            }
        }
    }

    fn readdirplus(
        &self,
        ino: u64,
        offset: u64,
        mut f: impl FnMut(DirEntry<'_>, &Attr) -> bool,
    ) -> Fres<()> {
        let (l, r) = self.listing(ino)?;
        if offset == 0 {
            let e = DirEntry {
                ino,
                kind: FileType::Directory,
                name: b".",
                offset: 1,
            };
            if !f(e, &self.attr(ino, &r)) {
                return Ok(());
            }
        }
        if offset <= 1 {
            let pr = self.rec(l.parent)?;
            let e = DirEntry {
                ino: l.parent,
                kind: FileType::Directory,
                name: b"..",
                offset: FIRST_ENTRY_OFFSET,
            };
            if !f(e, &self.attr(l.parent, &pr)) {
                return Ok(());
            }
        }
        let mut fetched_from = None;
        for (off, name, child, code) in l.entries.iter().filter(|e| e.0 > offset) {
            if fetched_from.is_none_or(|n: usize| n >= 512) {
                self.prefetch(&l, off - 1);
                fetched_from = Some(0);
            }
            fetched_from = fetched_from.map(|n| n + 1);
            let Ok(cr) = self.rec(*child) else { continue };
            let e = DirEntry {
                ino: *child,
                kind: type_of_code(*code),
                name,
                offset: *off,
            };
            if !f(e, &self.attr(*child, &cr)) {
                break;
            }
        }
        Ok(())
    }
}

/// The methods of `memfs_fuse::Tree`, with its signatures.
impl Volume {
    /// Every change is in the cluster when its call returns.
    pub fn settle(&self) -> Fres<()> {
        Ok(())
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> Fres<Attr> {
        self.inner.lookup(parent, name)
    }

    /// Nothing is kept per kernel reference.
    pub fn forget(&self, _ino: u64, _n: u64) {}

    pub fn getattr(&self, ino: u64) -> Fres<Attr> {
        let r = self.inner.rec(ino)?;
        Ok(self.inner.attr(ino, &r))
    }

    pub fn getattr_flags(&self, ino: u64) -> Fres<(Attr, u32)> {
        self.getattr(ino).map(|a| (a, 0))
    }

    pub fn setattr_as(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        ino: u64,
        set: &SetAttr,
    ) -> Fres<Attr> {
        self.inner.setattr(ctx, in_group, ino, set)
    }

    pub fn readlink(&self, ino: u64) -> Fres<Vec<u8>> {
        let r = self.inner.rec(ino)?;
        if r.kind != Kind::Symlink {
            return Err(Errno::EINVAL);
        }
        Ok(r.target)
    }

    pub fn mknod_umask(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u32,
        umask: u32,
    ) -> Fres<Attr> {
        let kind = kind_of(FileType::of_mknod(mode)?);
        check_new_name(name)?;
        let mut r = self.inner.new_record(kind, mode, umask, ctx);
        if matches!(kind, Kind::Char | Kind::Block) {
            r.rdev = rdev;
        }
        let op = if kind == Kind::File {
            "create"
        } else {
            "mknod"
        };
        self.inner
            .make(ctx, parent, name, &r, false, op)
            .map(|(a, _)| a)
    }

    pub fn mkdir_umask(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Fres<Attr> {
        check_new_name(name)?;
        let r = self.inner.new_record(Kind::Dir, mode, umask, ctx);
        self.inner
            .make(ctx, parent, name, &r, false, "mkdir")
            .map(|(a, _)| a)
    }

    pub fn symlink(&self, ctx: Ctx, parent: u64, name: &[u8], target: &[u8]) -> Fres<Attr> {
        if target.is_empty() {
            return Err(Errno::ENOENT);
        }
        if target.len() > SYMLINK_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        check_new_name(name)?;
        let mut r = self.inner.new_record(Kind::Symlink, 0o777, 0, ctx);
        r.target = target.to_vec();
        r.size = target.len() as u64;
        self.inner
            .make(ctx, parent, name, &r, false, "symlink")
            .map(|(a, _)| a)
    }

    /// Returns the node and whether it was created (not opened); the node
    /// is open either way (see [`Volume::release`]).
    pub fn create_umask(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        excl: bool,
        umask: u32,
    ) -> Fres<(Attr, bool)> {
        check_new_name(name)?;
        let r = self.inner.new_record(Kind::File, mode, umask, ctx);
        let (attr, created) = self.inner.make(ctx, parent, name, &r, !excl, "create")?;
        if !created {
            return self
                .open_file(attr.ino, libc::O_RDWR)
                .map(|_| (attr, false));
        }
        *self.inner.opens.lock().entry(attr.ino).or_default() += 1;
        Ok((attr, true))
    }

    pub fn tmpfile_umask(
        &self,
        _ctx: Ctx,
        _dir: u64,
        _mode: u32,
        _umask: u32,
        _excl: bool,
    ) -> Fres<Attr> {
        Err(Errno::EOPNOTSUPP)
    }

    pub fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> Fres<Attr> {
        check_new_name(newname)?;
        let i = &self.inner;
        i.cache.forget_ent(newparent, newname);
        let e = i.cache.epoch();
        let (r, pr) = i.ns.link(&i.h, ino, newparent, newname).map_err(err)?;
        i.cache.put_ent(e, newparent, newname, Some(ino));
        i.cache.put_rec(e, ino, r.clone());
        i.cache.put_rec(e, newparent, pr);
        Ok(i.attr(ino, &r))
    }

    pub fn unlink(&self, parent: u64, name: &[u8]) -> Fres<()> {
        self.inner.remove(parent, name, false)
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Fres<()> {
        self.inner.remove(parent, name, true)
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
    ) -> Fres<()> {
        self.inner.rename(parent, name, newparent, newname, flags)
    }

    pub fn rename_whiteout(
        &self,
        _ctx: Ctx,
        _parent: u64,
        _name: &[u8],
        _newparent: u64,
        _newname: &[u8],
        _flags: RenameFlags,
    ) -> Fres<()> {
        Err(Errno::EINVAL)
    }

    /// `Tree::open` (named apart from [`Volume::open`], the constructor the
    /// contract names: Rust has one namespace for inherent methods).
    ///
    /// Returns whether the kernel's pages of `ino` from this mount are still
    /// the file's (`Tree::open`: the open may keep them).
    pub fn open_file(&self, ino: u64, flags: i32) -> Fres<bool> {
        let i = &self.inner;
        let (r, current) = i.revalidate(ino)?;
        let acc = flags & libc::O_ACCMODE;
        let trunc = flags & libc::O_TRUNC != 0;
        if r.kind == Kind::Dir && (acc != libc::O_RDONLY || trunc) {
            return Err(Errno::EISDIR);
        }
        if trunc && acc != libc::O_RDONLY && r.kind == Kind::File {
            i.cache.forget_rec(ino);
            let e = i.cache.epoch();
            let r = i.data.truncate(ino, 0).map_err(err)?;
            i.cache.put_rec(e, ino, r);
        }
        *i.opens.lock().entry(ino).or_default() += 1;
        Ok(current)
    }

    pub fn release(&self, ino: u64) {
        let i = &self.inner;
        let last = {
            let mut opens = i.opens.lock();
            match opens.get_mut(&ino) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                Some(_) => {
                    opens.remove(&ino);
                    true
                }
                None => false,
            }
        };
        if !last {
            return;
        }
        if i.data.dirty(ino).is_some()
            && let Err(e) = self.flush(ino)
        {
            tracing::error!(ino, error = ?e, "release: dirty data not written");
        }
        if i.held.lock().remove(&ino) {
            i.release_hold(ino);
        }
    }

    pub fn read_with<R>(
        &self,
        ino: u64,
        off: u64,
        len: usize,
        _mode: AtimeMode,
        f: impl FnOnce(&[&[u8]]) -> R,
    ) -> Fres<R> {
        let i = &self.inner;
        let r = i.file(ino, Errno::EINVAL)?;
        let size = i.size_of(ino, &r);
        i.data.read_with(ino, off, len, size, f).map_err(err)
    }

    pub fn read_atime(&self, ino: u64, off: u64, buf: &mut [u8], mode: AtimeMode) -> Fres<usize> {
        let len = buf.len();
        self.read_with(ino, off, len, mode, |slices| {
            let mut n = 0;
            for s in slices {
                // Never past the buffer, whatever the data layer hands over.
                let k = s.len().min(buf.len() - n);
                buf[n..n + k].copy_from_slice(&s[..k]);
                n += k;
            }
            n
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub fn write_as(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        kill_suidgid: bool,
        ino: u64,
        off: u64,
        data: &[u8],
        append: bool,
    ) -> Fres<usize> {
        self.inner
            .write(ctx, in_group, kill_suidgid, ino, off, &[data], append)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn write_pages_as(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        kill_suidgid: bool,
        ino: u64,
        off: u64,
        len: usize,
        pages: &mut [Option<Box<[u8; PAGE_SIZE]>>],
        append: bool,
    ) -> Fres<usize> {
        // The pages go to the dirty blocks as they are: one copy per byte.
        static ZERO_PAGE: [u8; PAGE_SIZE] = [0; PAGE_SIZE];
        let mut skip = (off % PAGE_SIZE as u64) as usize;
        let mut left = len;
        let mut parts: Vec<&[u8]> = Vec::with_capacity(pages.len() + 1);
        for p in pages.iter() {
            if left == 0 {
                break;
            }
            let page: &[u8] = p.as_deref().map_or(&ZERO_PAGE[..], |p| &p[..]);
            let s = &page[skip..];
            skip = 0;
            let k = s.len().min(left);
            parts.push(&s[..k]);
            left -= k;
        }
        // Pages short of `len` (never sent so) read as zeros, as before.
        while left > 0 {
            let k = left.min(PAGE_SIZE);
            parts.push(&ZERO_PAGE[..k]);
            left -= k;
        }
        self.inner
            .write(ctx, in_group, kill_suidgid, ino, off, &parts, append)
    }

    pub fn fsync(&self, ino: u64) -> Fres<()> {
        let i = &self.inner;
        let e = i.cache.epoch();
        if let Some(r) = i.data.sync(ino).map_err(err)? {
            i.cache.put_rec(e, ino, r);
        }
        i.data.await_acks(ino);
        Ok(())
    }

    pub fn lseek(&self, ino: u64, off: u64, whence: i32) -> Fres<u64> {
        let i = &self.inner;
        let r = i.rec(ino)?;
        let size = i.size_of(ino, &r);
        i.data.lseek(ino, off, whence, size).map_err(err)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn fallocate_as(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        kill_suidgid: bool,
        ino: u64,
        off: u64,
        len: u64,
        mode: FallocateMode,
    ) -> Fres<()> {
        let i = &self.inner;
        let r = i.file(ino, Errno::ENODEV)?;
        if len == 0 {
            return Err(Errno::EINVAL);
        }
        if off.checked_add(len).is_none_or(|end| end > MAX_FILE_SIZE) {
            return Err(Errno::EFBIG);
        }
        if kill_suidgid {
            i.kill_suidgid(ctx, in_group, ino, &r)?;
        }
        let size = i.size_of(ino, &r);
        i.cache.forget_rec(ino);
        let e = i.cache.epoch();
        let r = i.data.fallocate(ino, off, len, mode, size).map_err(err)?;
        i.cache.put_rec(e, ino, r);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub fn copy_file_range_as(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        ino_in: u64,
        off_in: u64,
        ino_out: u64,
        off_out: u64,
        len: u64,
    ) -> Fres<u64> {
        let i = &self.inner;
        let rin = i.file(ino_in, Errno::EINVAL)?;
        let rout = i.file(ino_out, Errno::EINVAL)?;
        if off_out.saturating_add(len) > MAX_FILE_SIZE {
            return Err(Errno::EFBIG);
        }
        i.kill_suidgid(ctx, in_group, ino_out, &rout)?;
        let (size_in, size_out) = (i.size_of(ino_in, &rin), i.size_of(ino_out, &rout));
        i.cache.forget_rec(ino_out);
        let e = i.cache.epoch();
        let (n, r) = i
            .data
            .copy_range(ino_in, off_in, ino_out, off_out, len, size_in, size_out)
            .map_err(err)?;
        i.cache.put_rec(e, ino_out, r);
        Ok(n)
    }

    /// The entries of directory `ino` after `offset`, while `f` returns
    /// true. Offsets are stable: a name's offset is a hash of it (see
    /// `name_offset`), so a listing continued after changes neither skips
    /// nor repeats a name that stayed.
    pub fn readdir(
        &self,
        ino: u64,
        offset: u64,
        mut f: impl FnMut(DirEntry<'_>) -> bool,
    ) -> Fres<()> {
        let (l, _) = self.inner.listing(ino)?;
        if offset == 0
            && !f(DirEntry {
                ino,
                kind: FileType::Directory,
                name: b".",
                offset: 1,
            })
        {
            return Ok(());
        }
        if offset <= 1
            && !f(DirEntry {
                ino: l.parent,
                kind: FileType::Directory,
                name: b"..",
                offset: FIRST_ENTRY_OFFSET,
            })
        {
            return Ok(());
        }
        for (off, name, child, code) in l.entries.iter().filter(|e| e.0 > offset) {
            let e = DirEntry {
                ino: *child,
                kind: type_of_code(*code),
                name,
                offset: *off,
            };
            if !f(e) {
                break;
            }
        }
        Ok(())
    }

    pub fn readdirplus(
        &self,
        ino: u64,
        offset: u64,
        f: impl FnMut(DirEntry<'_>, &Attr) -> bool,
    ) -> Fres<()> {
        self.inner.readdirplus(ino, offset, f)
    }

    /// Files from the volume's counters; space as the cluster's (not
    /// measured: a large round figure, so that df shows room).
    /// Space is the cluster's memory (crate::space); files are inode
    /// numbers, 2^32 of them. Unknown room (a cluster never reached) reads
    /// as 2^50 bytes, all free, rather than failing `df`.
    pub fn statfs(&self) -> StatFs {
        let i = &self.inner;
        let used: u64 =
            i.h.pool
                .with(|c| {
                    redis::cmd("HGET")
                        .arg(i.h.keys.next())
                        .arg("inodes")
                        .query(c)
                })
                .unwrap_or(0);
        let bsize = i.h.block_size;
        let room = i.space.room().unwrap_or(Room {
            total: 1 << 50,
            used: 0,
        });
        let blocks = room.total / u64::from(bsize);
        let bfree = room.free() / u64::from(bsize);
        let files = 1u64 << 32;
        StatFs {
            blocks,
            bfree,
            bavail: bfree,
            files,
            ffree: files.saturating_sub(used),
            bsize,
            namelen: NAME_MAX as u32,
            frsize: bsize,
        }
    }

    pub fn setxattr_as(
        &self,
        _ctx: Ctx,
        _in_group: &dyn Fn(u32) -> bool,
        ino: u64,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
    ) -> Fres<()> {
        check_xattr_name(name)?;
        let i = &self.inner;
        let m = match mode {
            XattrMode::Any => 0,
            XattrMode::Create => 1,
            XattrMode::Replace => 2,
        };
        i.cache.forget_rec(ino);
        let e = i.cache.epoch();
        let r = i.ns.setxattr(&i.h, ino, name, value, m).map_err(err)?;
        i.cache.put_rec(e, ino, r);
        Ok(())
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Fres<Vec<u8>> {
        check_xattr_name(name)?;
        let i = &self.inner;
        i.ns.getxattr(&i.h, ino, name).map_err(err)
    }

    /// Names, each followed by NUL.
    pub fn listxattr(&self, ino: u64) -> Fres<Vec<u8>> {
        let i = &self.inner;
        let names = i.ns.listxattr(&i.h, ino).map_err(err)?;
        let mut out = Vec::new();
        for n in names {
            out.extend_from_slice(&n);
            out.push(0);
        }
        Ok(out)
    }

    pub fn removexattr(&self, ino: u64, name: &[u8]) -> Fres<()> {
        check_xattr_name(name)?;
        let i = &self.inner;
        i.cache.forget_rec(ino);
        let e = i.cache.epoch();
        let r = i.ns.removexattr(&i.h, ino, name).map_err(err)?;
        i.cache.put_rec(e, ino, r);
        Ok(())
    }

    /// Inode flags are not kept on a volume.
    pub fn get_flags(&self, _ino: u64) -> Fres<u32> {
        Err(Errno(libc::ENOTTY))
    }

    pub fn set_flags(&self, _ctx: Ctx, _ino: u64, _flags: u32) -> Fres<Attr> {
        Err(Errno(libc::ENOTTY))
    }

    /// Locks are kept in the cluster (crate::locks), across mounts.
    pub fn keeps_locks(&self) -> bool {
        true
    }

    #[allow(clippy::too_many_arguments)]
    pub fn getlk(
        &self,
        ino: u64,
        owner: u64,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
    ) -> Fres<LockInfo> {
        self.inner.locks.getlk(ino, owner, start, end, typ, pid)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn setlk(
        &self,
        ino: u64,
        owner: u64,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
    ) -> Fres<()> {
        self.inner.locks.setlk(ino, owner, start, end, typ, pid)
    }

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
        self.inner
            .locks
            .setlkw(ino, owner, start, end, typ, pid, token, done)
    }

    pub fn cancel_lock_wait(&self, ino: u64, token: u64) -> bool {
        self.inner.locks.cancel_lock_wait(ino, token)
    }

    pub fn release_locks(&self, ino: u64, owner: u64) {
        self.inner.locks.release_locks(ino, owner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_stable_and_above_dot_dot() {
        assert_eq!(name_offset(b"a"), name_offset(b"a"));
        assert_ne!(name_offset(b"a"), name_offset(b"b"));
        assert!(name_offset(b"") > FIRST_ENTRY_OFFSET);
        assert_eq!(
            ts(-1),
            Timespec {
                sec: -1,
                nsec: 999_999_999
            }
        );
        assert_eq!(ns_of(ts(1_234_567_890_123)), 1_234_567_890_123);
    }

    #[test]
    fn names_are_checked_as_the_engine_does() {
        assert_eq!(check_new_name(b"."), Err(Errno::EEXIST));
        assert_eq!(check_name(&[b'a'; 256]), Err(Errno::ENAMETOOLONG));
        assert_eq!(check_name(b"a/b"), Err(Errno::EINVAL));
        assert_eq!(check_xattr_name(b"user."), Err(Errno::EOPNOTSUPP));
        assert_eq!(check_xattr_name(b""), Err(Errno::ERANGE));
        assert_eq!(check_xattr_name(b"user.a"), Ok(()));
    }
}
