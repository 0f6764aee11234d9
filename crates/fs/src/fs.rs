//! The engine: inode-level operations with Linux semantics.
//!
//! # Concurrency
//! There is no global lock on lookup, read or write. The inode table is a
//! sharded map; each inode has its own reader-writer lock over its metadata and
//! contents. Locks are taken in this order, which rules out deadlock:
//! 1. `rename_lock`, only by renames between two directories (it keeps the
//!    tree's shape stable while such a rename checks ancestry, as Linux's
//!    per-superblock rename mutex does);
//! 2. directory inodes: an ancestor before its descendants, otherwise in
//!    ascending inode number;
//! 3. the inodes named by entries of those directories (the node being
//!    linked, unlinked, renamed or replaced): a directory before a
//!    non-directory (a file may have a hard link inside the directory it is
//!    exchanged with, and `readdirplus` holds a directory while it reads its
//!    entries), otherwise in ascending inode number.
//!
//! Table shard locks are leaves: no inode lock is taken while one is held.
//! A node's kernel lookup count is raised while its parent directory is still
//! locked, so an unlink cannot free a node that a lookup is about to return.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLockWriteGuard};

use crate::acl::{self, Acl};
use crate::data::{FileData, Spare};
use crate::dir::{Dir, FIRST_SLOT_OFFSET};
use crate::inode::{Body, Inode, Meta, State};
use crate::invariant::uncount;
use crate::locks::{Family, LockCallback, LockTable, RangeLock};
use crate::mutation::{META_RECORD, Mutation, Recorder};
use crate::types::*;
use crate::xattr::{self, Xattrs};
use crate::{Errno, Result};

const PAGE: u64 = PAGE_SIZE as u64;

/// One directory entry as `readdir` returns it.
#[derive(Debug, Clone, Copy)]
pub struct DirEntry<'a> {
    pub ino: u64,
    pub kind: FileType,
    pub name: &'a [u8],
    /// Offset to pass to `readdir` to continue after this entry.
    pub offset: u64,
}

/// An in-memory POSIX file system.
pub struct Fs {
    /// The node table and the snapshots, shared with the lazy clones taken
    /// of this file system's snapshots (`lazy.rs`), which read them after
    /// this object is gone.
    pub(crate) core: Arc<crate::core::Core>,
    pub(crate) next_ino: AtomicU64,
    config: Config,
    max_pages: u64,
    /// Shared with the snapshots' frozen nodes, which give back what they
    /// held when they go.
    pub(crate) used_pages: Arc<AtomicU64>,
    pub(crate) used_inodes: Arc<AtomicU64>,
    rename_lock: Mutex<()>,
    pub(crate) commit: AtomicU64,
    pub(crate) recorder: Option<Arc<dyn Recorder>>,
    /// Set when a read moved an access time: reads make no commit (that
    /// would make every read a write), so a recorder that keeps the tree in
    /// checkpoints asks, with [`Fs::take_unrecorded_atimes`], whether the
    /// tree holds atimes no commit carries.
    unrecorded_atimes: AtomicBool,
    /// Set once some node has had a lock table: until then
    /// [`Fs::take_locks`] has nothing to look for and skips its pass over
    /// every node (a mount whose kernel keeps the locks never sets it).
    locked: AtomicBool,
}

fn check_name(name: &[u8]) -> Result<()> {
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

/// Names a new node may not take.
fn check_new_name(name: &[u8]) -> Result<()> {
    check_name(name)?;
    if name == b"." || name == b".." {
        return Err(Errno::EEXIST);
    }
    Ok(())
}

fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

/// Lists directory `ino` (its entries `d`) from `offset` (0 to start): `.`,
/// `..`, then the entries, until `f` returns false. The live tree and the
/// snapshot views list through this one function, so their offsets agree.
pub(crate) fn list_dir(ino: u64, d: &Dir, offset: u64, f: &mut impl FnMut(DirEntry<'_>) -> bool) {
    if offset == 0
        && !f(DirEntry {
            ino,
            kind: FileType::Directory,
            name: b".",
            offset: 1,
        })
    {
        return;
    }
    if offset <= 1
        && !f(DirEntry {
            ino: d.parent,
            kind: FileType::Directory,
            name: b"..",
            offset: FIRST_SLOT_OFFSET,
        })
    {
        return;
    }
    d.list_from(offset.max(FIRST_SLOT_OFFSET), |s, next| {
        f(DirEntry {
            ino: s.ino,
            kind: s.kind,
            name: s.name,
            offset: next,
        })
    });
}

/// The file capability xattr, dropped with setuid when an unprivileged caller writes.
const SECURITY_CAPABILITY: &[u8] = b"security.capability";

/// [`drop_privs`] for a caller taken to hold CAP_FSETID if it is root: for
/// the changes whose request does not say (a FUSE SETATTR's size or owner).
fn kill_priv_of(perm: u16, gid: u32, ctx: Ctx, in_group: &dyn Fn(u32) -> bool) -> u16 {
    if ctx.uid == 0 {
        return perm;
    }
    drop_privs(perm, gid, ctx, in_group)
}

/// Clears setuid and setgid as Linux does when a caller without CAP_FSETID
/// modifies a file (`setattr_should_drop_suidgid`): setuid always; setgid when
/// it means "run as group" (group-exec set) or when the caller is not in the
/// file's group. `in_group` is asked only when it decides.
fn drop_privs(perm: u16, gid: u32, ctx: Ctx, in_group: &dyn Fn(u32) -> bool) -> u16 {
    let mut p = kill_priv(perm);
    if p & libc::S_ISGID as u16 != 0 && ctx.gid != gid && !in_group(gid) {
        p &= !(libc::S_ISGID as u16);
    }
    p
}

/// Clears setuid, and setgid where it means "run as group" (group-exec set).
fn kill_priv(perm: u16) -> u16 {
    let mut p = perm;
    p &= !(libc::S_ISUID as u16);
    if p & libc::S_IXGRP as u16 != 0 {
        p &= !(libc::S_ISGID as u16);
    }
    p
}

/// The contents of a new node of `kind` in directory `parent`.
fn new_body(kind: FileType, parent: u64, symlink: Option<&[u8]>, rdev: u32) -> Body {
    match kind {
        FileType::RegularFile => Body::File(FileData::default()),
        FileType::Directory => Body::Dir(Box::new(Dir::new(parent))),
        FileType::Symlink => Body::Symlink(Box::new(symlink.unwrap_or_default().into())),
        _ => Body::special(kind, rdev),
    }
}

/// utimensat's EINVAL. The FUSE adapter's times are always in range; a
/// direct caller's need not be, and a journal record of such a time would
/// not decode again (recovery would fail on it).
fn check_set_times(set: &SetAttr) -> Result<()> {
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
    Ok(())
}

/// A setattr's new owner or group (at least one of them is set).
fn set_owner(
    meta: &mut Meta,
    kind: FileType,
    set: &SetAttr,
    ctx: Ctx,
    in_group: &dyn Fn(u32) -> bool,
    now: Timespec,
) {
    // Whether setgid goes depends on the group the file had.
    let old_gid = meta.gid;
    if let Some(uid) = set.uid {
        meta.uid = uid;
    }
    if let Some(gid) = set.gid {
        meta.gid = gid;
    }
    // Linux's chown_common asks to kill setuid (and setgid with
    // group-exec) on every chown of a non-directory, by root too and
    // to the same owner (generic/193); with HANDLE_KILLPRIV_V2 the
    // kernel leaves that to us. An unprivileged caller outside the
    // file's (old) group loses setgid too (chown_common asks
    // setattr_should_drop_sgid).
    if kind != FileType::Directory {
        meta.perm = kill_priv(meta.perm);
        meta.perm = kill_priv_of(meta.perm, old_gid, ctx, in_group);
    }
    meta.ctime = now;
}

/// A setattr's times (each changes ctime too).
fn set_times(meta: &mut Meta, set: &SetAttr, now: Timespec) {
    if let Some(t) = set.atime {
        meta.atime = match t {
            SetTime::Now => now,
            SetTime::At(t) => t,
        };
        meta.ctime = now;
    }
    if let Some(t) = set.mtime {
        meta.mtime = match t {
            SetTime::Now => now,
            SetTime::At(t) => t,
        };
        meta.ctime = now;
    }
    if let Some(t) = set.ctime {
        meta.ctime = t;
    }
    if *set == SetAttr::default() {
        // chown(f, -1, -1) reaches us as a change of nothing: it still
        // changes ctime, as on tmpfs.
        meta.ctime = now;
    }
}

/// The permission check of `access(2)` on a node's attributes and access ACL.
pub(crate) fn check_access(
    ctx: Ctx,
    in_group: &dyn Fn(u32) -> bool,
    attr: &Attr,
    acl: Option<Acl>,
    mask: i32,
) -> Result<()> {
    if mask == 0 {
        return Ok(());
    }
    if ctx.uid != 0
        && ctx.uid != attr.uid
        && let Some(acl) = acl
    {
        let want = (mask & 7) as u16;
        return if acl.permits(ctx, attr.uid, attr.gid, in_group, want) {
            Ok(())
        } else {
            Err(Errno::EACCES)
        };
    }
    let perm = attr.perm as u32;
    if ctx.uid == 0 {
        // Root may do anything but execute a file nobody may execute.
        if mask & libc::X_OK != 0 && attr.kind != FileType::Directory && perm & 0o111 == 0 {
            return Err(Errno::EACCES);
        }
        return Ok(());
    }
    let bits = if ctx.uid == attr.uid {
        perm >> 6
    } else if ctx.gid == attr.gid {
        perm >> 3
    } else {
        perm
    } & 7;
    if (mask as u32) & !bits & 7 != 0 {
        return Err(Errno::EACCES);
    }
    Ok(())
}

impl Fs {
    pub fn new(config: Config) -> Fs {
        Fs::with_recorder(config, None)
    }

    /// From now on every mutation is passed to `recorder` (set before the
    /// file system is shared: a rebuilt one is filled first, then recorded).
    pub fn set_recorder(&mut self, recorder: Option<Arc<dyn Recorder>>) {
        self.recorder = recorder;
    }

    /// A file system whose every mutation is passed to `recorder`.
    pub fn with_recorder(config: Config, recorder: Option<Arc<dyn Recorder>>) -> Fs {
        let now = Timespec::now();
        let ctx = Ctx::current();
        let root = Inode::new(
            ROOT_INO,
            FileType::Directory,
            Meta {
                perm: 0o1777,
                nlink: 2,
                uid: ctx.uid,
                gid: ctx.gid,
                size: 0,
                atime: now,
                mtime: now,
                ctime: now,
                btime: now,
                xattrs: None,
                flags: 0,
            },
            Body::Dir(Box::new(Dir::new(ROOT_INO))),
        );
        // The kernel never forgets the root.
        root.nlookup.store(1, Ordering::Relaxed);
        let inodes = crate::table::InodeTable::default();
        inodes.insert(ROOT_INO, Arc::new(root));
        let used_pages = Arc::new(AtomicU64::new(0));
        let used_inodes = Arc::new(AtomicU64::new(1));
        Fs {
            core: Arc::new(crate::core::Core::new(
                inodes,
                used_pages.clone(),
                used_inodes.clone(),
            )),
            next_ino: AtomicU64::new(ROOT_INO + 1),
            max_pages: config.capacity / PAGE,
            config,
            used_pages,
            used_inodes,
            rename_lock: Mutex::new(()),
            commit: AtomicU64::new(0),
            recorder,
            unrecorded_atimes: AtomicBool::new(false),
            locked: AtomicBool::new(false),
        }
    }

    pub fn config(&self) -> Config {
        self.config
    }

    /// Number of inodes in the table (the root included).
    /// A lazy clone copies its whole tree first.
    pub fn inode_count(&self) -> usize {
        self.materialize_all();
        self.core.inodes.len()
    }

    /// Id of the last commit.
    pub fn last_commit(&self) -> u64 {
        self.commit.load(Ordering::Acquire)
    }

    /// Records a change as the next commit. The mutation is built only when
    /// a recorder wants it: a pure in-memory file system pays one atomic add.
    pub(crate) fn log<'m>(&self, m: impl FnOnce() -> Mutation<'m>) -> Result<()> {
        match &self.recorder {
            None => {
                self.commit.fetch_add(1, Ordering::AcqRel);
                Ok(())
            }
            Some(r) => {
                let id = r.record(&m())?;
                self.commit.fetch_max(id, Ordering::AcqRel);
                Ok(())
            }
        }
    }

    /// Before an operation changes anything: lets the recorder make sure its
    /// commit (at most `bytes`) can be stored, so that a full disk fails the
    /// operation (ENOSPC) instead of leaving memory ahead of the journal.
    pub(crate) fn admit(&self, bytes: u64) -> Result<()> {
        match &self.recorder {
            Some(r) => r.admit(bytes),
            None => Ok(()),
        }
    }

    /// Waits until what this thread changed is as durable as the recorder's
    /// mode promises. Call once the operation has returned (no lock held).
    pub fn settle(&self) -> Result<()> {
        match &self.recorder {
            Some(r) => r.settle(),
            None => Ok(()),
        }
    }

    /// Makes every change so far durable (`fsync`, `syncfs`).
    pub fn sync_all(&self) -> Result<()> {
        match &self.recorder {
            Some(r) => r.sync(),
            None => Ok(()),
        }
    }

    pub(crate) fn get(&self, ino: u64) -> Result<Arc<Inode>> {
        self.core.get(ino)
    }

    fn reserve_pages(&self, n: u64) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.used_pages
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&t| t <= self.max_pages)
            })
            .map(|_| ())
            .map_err(|_| Errno::ENOSPC)
    }

    fn release_pages(&self, n: u64) {
        if n > 0 {
            uncount(&self.used_pages, n, "pages");
        }
    }

    /// Gives back `n` pages, or takes `-n` (a truncation that copied a page
    /// a snapshot shares: allowed past the capacity by that page, rather
    /// than failing a shrink).
    pub(crate) fn give_back(&self, n: i64) {
        if n >= 0 {
            self.release_pages(n as u64);
        } else {
            self.used_pages
                .fetch_add(n.unsigned_abs(), Ordering::AcqRel);
        }
    }

    fn reserve_inode(&self) -> Result<u64> {
        self.used_inodes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used < self.config.max_inodes).then_some(used + 1)
            })
            .map_err(|_| Errno::ENOSPC)?;
        Ok(self.next_ino.fetch_add(1, Ordering::Relaxed))
    }

    /// Frees a node once nothing refers to it: no link, no kernel reference, no open handle.
    pub(crate) fn maybe_free(&self, inode: &Arc<Inode>) {
        if inode.ino == ROOT_INO {
            return;
        }
        // Whoever drops the last of these references calls again, so a node
        // still referenced can be passed over without taking its lock (a
        // close of a file the kernel still knows, every create's release).
        if inode.nlookup.load(Ordering::Acquire) > 0 || inode.nopen.load(Ordering::Acquire) > 0 {
            return;
        }
        let pages = {
            // Not `write_state`: nothing reaches the node any more, and the
            // snapshots kept it when its last name went.
            let mut st = inode.state.write();
            if st.meta.nlink > 0
                || inode.nlookup.load(Ordering::Acquire) > 0
                || inode.nopen.load(Ordering::Acquire) > 0
            {
                return;
            }
            // Nothing can raise the counts again: no directory names the node
            // and nobody holds a reference through which to open it.
            if inode.freed.swap(true, Ordering::AcqRel) {
                return;
            }
            match &mut st.body {
                // Shared pages a snapshot holds stay counted until it goes.
                Body::File(d) => std::mem::take(d).release(),
                _ => 0,
            }
        };
        // Only this object: a rollback may have put another node of the
        // same number into the table meanwhile.
        self.core.forget(inode.ino);
        self.core
            .inodes
            .remove_if(&inode.ino, |_, v| Arc::ptr_eq(v, inode));
        self.release_pages(pages);
        uncount(&self.used_inodes, 1, "inodes");
        // No commit: the node left the tree when its last name went (that
        // was recorded), nobody can reach it since, and recovery drops every
        // node without a name. Half the commits of an unlink-heavy load.
    }

    // ---- lookup and attributes -------------------------------------------------

    /// Looks `name` up in `parent` and takes a kernel reference on the result
    /// (released by [`Fs::forget`]).
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        self.lookup_inner(parent, name, true)
    }

    /// Looks `name` up without taking a reference (for direct users).
    pub fn lookup_noref(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        self.lookup_inner(parent, name, false)
    }

    fn lookup_inner(&self, parent: u64, name: &[u8], take_ref: bool) -> Result<Attr> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        if name == b"." {
            // Of any kind of node, not only directories: the kernel decodes a
            // file handle (open_by_handle_at, NFS export) of an inode it no
            // longer holds by looking up "." in it.
            let inode = self.get(parent)?;
            let attr = inode.state.read().attr(parent, inode.kind);
            if attr.nlink == 0 {
                // Removed, kept only for a holder (or the journal): a handle
                // to it is stale, as on tmpfs.
                return Err(Errno::ENOENT);
            }
            if take_ref {
                inode.nlookup.fetch_add(1, Ordering::AcqRel);
            }
            return Ok(attr);
        }
        let dir = self.get(parent)?;
        let st = dir.state.read();
        let d = st.dir().ok_or(Errno::ENOTDIR)?;
        let ino = match name {
            b"." => parent,
            b".." if d.parent != parent => {
                // Locks go ancestor first: never wait for the parent while
                // holding the child (a rename or rmdir holding the parent
                // and waiting for this directory would deadlock).
                drop(st);
                return self.lookup_dotdot(&dir, take_ref);
            }
            b".." => parent,
            _ => d.get(name).ok_or(Errno::ENOENT)?.0,
        };
        let child = if ino == parent {
            dir.clone()
        } else {
            self.get(ino)?
        };
        let attr = if ino == parent {
            st.attr(ino, child.kind)
        } else {
            child.state.read().attr(ino, child.kind)
        };
        if take_ref {
            child.nlookup.fetch_add(1, Ordering::AcqRel);
        }
        Ok(attr)
    }

    /// `lookup(dir, "..")` without holding `dir` while locking its parent.
    /// Only renames between directories change a directory's parent, and they
    /// hold `rename_lock`; under it the parent found stays the parent (a
    /// retry loop instead could lock a stale parent that has meanwhile moved
    /// below `dir`). `..` lookups are rare (NFS export), so sharing that lock
    /// costs nothing where it matters. The parent's lock is held while the
    /// reference is taken: a linked parent cannot be freed under it.
    fn lookup_dotdot(&self, dir: &Arc<Inode>, take_ref: bool) -> Result<Attr> {
        let _shape = self.rename_lock.lock();
        let up = dir.state.read().dir().ok_or(Errno::ENOTDIR)?.parent;
        let p = self.get(up)?;
        let pst = p.state.read();
        if pst.meta.nlink == 0 {
            // `dir` was removed, and its old parent after it.
            return Err(Errno::ENOENT);
        }
        let attr = pst.attr(up, p.kind);
        if take_ref {
            p.nlookup.fetch_add(1, Ordering::AcqRel);
        }
        Ok(attr)
    }

    /// Drops `n` kernel references to `ino`.
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        if let Ok(inode) = self.get(ino) {
            // Saturating on purpose, not an invariant: `n` is the kernel's
            // count, and a tree rebuilt under a mount (rollback, lazy clone)
            // starts every node at one reference whatever the kernel holds.
            let prev = inode
                .nlookup
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                    Some(c.saturating_sub(n))
                })
                .unwrap_or(0);
            if prev <= n {
                self.maybe_free(&inode);
            }
        }
    }

    /// Whether a regular file's contents are stored inline (small files,
    /// see `INLINE_MAX`): for tests and memory figures, not semantics.
    pub fn stores_inline(&self, ino: u64) -> bool {
        self.get(ino)
            .is_ok_and(|n| matches!(&n.state.read().body, Body::File(d) if d.is_inline()))
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        let inode = self.get(ino)?;
        let attr = inode.state.read().attr(ino, inode.kind);
        Ok(attr)
    }

    /// `setattr` by `ctx`, taken to be in every group it names: a truncate
    /// by a caller without CAP_FSETID then keeps setgid without group-exec.
    /// Callers that know the caller's supplementary groups use
    /// [`Fs::setattr_as`].
    pub fn setattr(&self, ctx: Ctx, ino: u64, set: &SetAttr) -> Result<Attr> {
        self.setattr_as(ctx, &|_| true, ino, set)
    }

    /// `setattr` on behalf of `ctx`, whose supplementary groups `in_group`
    /// knows: a truncate, or a chown of a non-directory, by a caller without
    /// CAP_FSETID drops setuid, and setgid when group-exec is set or the
    /// caller is outside the file's group (Linux's
    /// `setattr_should_drop_sgid`; for chown, the group before the change).
    pub fn setattr_as(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        ino: u64,
        set: &SetAttr,
    ) -> Result<Attr> {
        check_set_times(set)?;
        let _gate = self.enter();
        let inode = self.get(ino)?;
        self.admit(META_RECORD + self.chmod_acl_bytes(&inode, set))?;
        let mut st = self.write_state(&inode);
        st.meta.check_setattr(set)?;
        let now = Timespec::now();
        let mut chmod_acl = None;
        if let Some(size) = set.size {
            self.set_size(&mut st, inode.kind, size, ctx, in_group, now)?;
        }
        if let Some(mode) = set.mode {
            // Stored as given: whether an unprivileged caller may keep setgid
            // depends on its supplementary groups, which only the kernel knows
            // (it strips the bit before the request reaches us).
            st.meta.perm = (mode & 0o7777) as u16;
            st.meta.ctime = now;
            chmod_acl = Self::access_acl(&st.meta).map(|mut a| {
                a.chmod(st.meta.perm);
                a.to_xattr()
            });
        }
        if set.uid.is_some() || set.gid.is_some() {
            set_owner(&mut st.meta, inode.kind, set, ctx, in_group, now);
        }
        set_times(&mut st.meta, set, now);
        let attr = st.attr(ino, inode.kind);
        self.log(|| Mutation::SetAttr { attr })?;
        if let Some(value) = chmod_acl {
            // posix_acl_chmod: the ACL follows the new mode.
            let xs = st.meta.xattrs.as_mut().expect("the ACL was read from it");
            xs.set(acl::ACL_ACCESS, &value, XattrMode::Any)?;
            let name = acl::ACL_ACCESS;
            self.log(|| Mutation::SetXattr {
                attr,
                name,
                value: &value,
            })?;
        }
        Ok(attr)
    }

    /// The bytes of the access ACL's record that a chmod by `set` rewrites
    /// too, admitted with it.
    fn chmod_acl_bytes(&self, inode: &Inode, set: &SetAttr) -> u64 {
        match (&self.recorder, set.mode) {
            (Some(_), Some(_)) => inode.state.read().meta.xattrs.as_ref().map_or(0, |x| {
                x.get(acl::ACL_ACCESS).map_or(0, |v| {
                    META_RECORD + (acl::ACL_ACCESS.len() + v.len()) as u64
                })
            }),
            _ => 0,
        }
    }

    /// A setattr's new size: a truncate (or extension) of a regular file,
    /// which drops setuid and setgid as [`kill_priv_of`] says.
    fn set_size(
        &self,
        st: &mut State,
        kind: FileType,
        size: u64,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        now: Timespec,
    ) -> Result<()> {
        match kind {
            FileType::RegularFile => {}
            FileType::Directory => return Err(Errno::EISDIR),
            _ => return Err(Errno::EINVAL),
        }
        if size > MAX_FILE_SIZE {
            return Err(Errno::EFBIG);
        }
        let State { meta, body, .. } = st;
        if let Body::File(data) = body {
            if size < meta.size {
                self.give_back(data.truncate(size));
            }
            meta.size = size;
            #[cfg(debug_assertions)]
            data.check(size, true);
        }
        meta.mtime = now;
        meta.ctime = now;
        meta.perm = kill_priv_of(meta.perm, meta.gid, ctx, in_group);
        Ok(())
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let inode = self.get(ino)?;
        let st = inode.state.read();
        match &st.body {
            Body::Symlink(t) => Ok(t.to_vec()),
            _ => Err(Errno::EINVAL),
        }
    }

    /// Permission check as the kernel does it for `access(2)`: `mask` is a
    /// combination of `R_OK`, `W_OK`, `X_OK` (0 checks existence).
    pub fn access(&self, ctx: Ctx, ino: u64, mask: i32) -> Result<()> {
        self.access_as(ctx, &|_| false, ino, mask)
    }

    /// [`Fs::access`] for a caller whose supplementary groups `in_group`
    /// knows: they count for the access ACL's group entries.
    pub fn access_as(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        ino: u64,
        mask: i32,
    ) -> Result<()> {
        let inode = self.get(ino)?;
        let (attr, acl) = {
            let st = inode.state.read();
            (st.attr(ino, inode.kind), Self::access_acl(&st.meta))
        };
        check_access(ctx, in_group, &attr, acl, mask)
    }

    // ---- creating nodes ----------------------------------------------------------

    /// Creates a node of any type in `parent`. `mode` carries the type bits.
    #[allow(clippy::too_many_arguments)]
    fn make_node(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u32,
        symlink: Option<&[u8]>,
        take_ref: bool,
        umask: u32,
    ) -> Result<Attr> {
        self.make_node_open(
            ctx, parent, name, mode, rdev, symlink, take_ref, false, umask,
        )
    }

    /// [`Fs::make_node`], the node born open when `open` (`create`): setting
    /// the count before the node is published saves finding it again.
    #[allow(clippy::too_many_arguments)]
    fn make_node_open(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u32,
        symlink: Option<&[u8]>,
        take_ref: bool,
        open: bool,
        umask: u32,
    ) -> Result<Attr> {
        let _gate = self.enter();
        let target = symlink.map_or(0, |t| t.len() as u64);
        self.admit(META_RECORD + target + self.inherited_bytes(parent))?;
        check_new_name(name)?;
        let kind = FileType::from_mode(mode).ok_or(Errno::EINVAL)?;
        let dir = self.get(parent)?;
        let mut st = self.write_state(&dir);
        st.check_new_entry(name)?;
        st.meta.check_add_entry()?;
        if kind == FileType::Directory && st.meta.nlink >= LINK_MAX {
            return Err(Errno::EMLINK);
        }
        let ino = self.reserve_inode()?;
        let now = Timespec::now();
        let nlink = if kind == FileType::Directory { 2 } else { 1 };
        let meta = Self::new_meta(&st.meta, ctx, kind, mode, umask, nlink, now);
        let inherited_flags = meta.flags;
        let inherited_acls = meta.xattrs.is_some();
        let body = new_body(kind, parent, symlink, rdev);
        let inode = self.new_inode(ino, kind, meta, body);
        let attr = inode.state.read().attr(ino, kind);
        if take_ref {
            inode.nlookup.store(1, Ordering::Relaxed);
        }
        if open {
            inode.nopen.store(1, Ordering::Relaxed);
        }
        let inherited = inherited_acls.then(|| inode.clone());
        self.core.inodes.insert(ino, inode);
        st.dir_mut().expect("checked above").insert(name, ino, kind);
        if kind == FileType::Directory {
            st.meta.nlink += 1;
        }
        st.touch_mc(now);
        st.check_dir_links();
        self.log(|| Mutation::Create {
            parent: st.attr(parent, FileType::Directory),
            name,
            attr,
            symlink_target: symlink,
        })?;
        if let Some(node) = inherited {
            // The inherited ACLs, recorded while the parent is still locked:
            // no one can reach the node to change them before.
            self.log_xattrs(attr, &node.state.read().meta)?;
        }
        if inherited_flags != 0 {
            self.log(|| Mutation::SetFlags {
                attr,
                flags: inherited_flags as u32,
            })?;
        }
        Ok(attr)
    }

    /// Records the xattrs of new node `attr` (the ACLs it inherited).
    fn log_xattrs(&self, attr: Attr, meta: &Meta) -> Result<()> {
        for (name, value) in meta.xattrs.iter().flat_map(|x| x.iter()) {
            self.log(|| Mutation::SetXattr { attr, name, value })?;
        }
        Ok(())
    }

    /// A bound on the records of the ACLs a node created in `parent` would
    /// inherit (an access and a default ACL, each at most the parent's
    /// default ACL) and of its inherited flags, for admission before
    /// anything is locked (none without a recorder: nothing to admit).
    fn inherited_bytes(&self, parent: u64) -> u64 {
        if self.recorder.is_none() {
            return 0;
        }
        let Ok(dir) = self.get(parent) else {
            return 0;
        };
        let st = dir.state.read();
        // Inherited inode flags are one more record.
        let flags = if st.meta.inherited_flags() != 0 {
            META_RECORD
        } else {
            0
        };
        flags
            + st.meta
                .xattrs
                .as_ref()
                .and_then(|x| x.get(acl::ACL_DEFAULT))
                .map_or(0, |v| {
                    2 * (META_RECORD + (acl::ACL_DEFAULT.len() + v.len()) as u64)
                })
    }

    /// What a new node of `kind` made by `ctx` takes from its directory
    /// `parent`: its group (a setgid directory's own, and the bit for a
    /// subdirectory; setgid dropped from a file whose group the creator is
    /// not in, as Linux does), its ACLs or the umask (see
    /// [`Fs::inherit_acl`]; none for a symlink), and the inode flags that
    /// pass to new regular files and directories (nodump, noatime, as on
    /// tmpfs). Returns the group, the xattrs and the flags; `perm` is
    /// narrowed in place.
    fn inherit_from_parent(
        parent: &Meta,
        ctx: Ctx,
        kind: FileType,
        umask: u32,
        perm: &mut u16,
    ) -> (u32, Option<Box<Xattrs>>, u8) {
        let parent_sgid = parent.perm & libc::S_ISGID as u16 != 0;
        let gid = if parent_sgid { parent.gid } else { ctx.gid };
        if kind == FileType::Directory && parent_sgid {
            *perm |= libc::S_ISGID as u16;
        } else if kind != FileType::Directory && ctx.uid != 0 && gid != ctx.gid {
            *perm &= !(libc::S_ISGID as u16);
        }
        let xattrs = if kind == FileType::Symlink {
            None
        } else {
            Self::inherit_acl(parent, kind, umask, perm)
        };
        let flags = match kind {
            FileType::RegularFile | FileType::Directory => parent.inherited_flags(),
            _ => 0,
        };
        (gid, xattrs, flags)
    }

    /// The metadata of a new node of `kind` made by `ctx` in directory
    /// `parent` with `mode` (and `umask`, see [`Fs::inherit_from_parent`]),
    /// born at `now` with `nlink` links.
    fn new_meta(
        parent: &Meta,
        ctx: Ctx,
        kind: FileType,
        mode: u32,
        umask: u32,
        nlink: u32,
        now: Timespec,
    ) -> Meta {
        let mut perm = (mode & 0o7777) as u16;
        let (gid, xattrs, flags) = Self::inherit_from_parent(parent, ctx, kind, umask, &mut perm);
        Meta {
            perm,
            nlink,
            uid: ctx.uid,
            gid,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            btime: now,
            xattrs,
            flags,
        }
    }

    /// `posix_acl_create`: a new node in a directory with a default ACL
    /// takes it as its access ACL, narrowed by the mode asked for (and a
    /// directory also as its own default); elsewhere `umask` applies. The
    /// new node's xattrs, if any.
    fn inherit_acl(
        parent: &Meta,
        kind: FileType,
        umask: u32,
        perm: &mut u16,
    ) -> Option<Box<Xattrs>> {
        let default = parent
            .xattrs
            .as_ref()
            .and_then(|x| x.get(acl::ACL_DEFAULT))
            .and_then(|v| Acl::parse(v).ok().flatten());
        let Some(mut acl) = default else {
            *perm &= !((umask & 0o777) as u16);
            return None;
        };
        let mut xs = Xattrs::default();
        if kind == FileType::Directory {
            // Fits: the parent held the same value under the same name.
            let _ = xs.set(acl::ACL_DEFAULT, &acl.to_xattr(), XattrMode::Any);
        }
        if acl.create_masq(perm) {
            let _ = xs.set(acl::ACL_ACCESS, &acl.to_xattr(), XattrMode::Any);
        }
        (!xs.is_empty()).then(|| Box::new(xs))
    }

    /// `mknod`: regular files, FIFOs, sockets and device nodes (`mode` has the type).
    pub fn mknod(&self, ctx: Ctx, parent: u64, name: &[u8], mode: u32, rdev: u32) -> Result<Attr> {
        self.mknod_umask(ctx, parent, name, mode, rdev, 0)
    }

    /// [`Fs::mknod`] with the mode not yet masked: `umask` applies unless
    /// the parent has a default ACL (FUSE_DONT_MASK).
    pub fn mknod_umask(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u32,
        umask: u32,
    ) -> Result<Attr> {
        let t = FileType::of_mknod(mode)?;
        let mode = t.mode_bits() | (mode & !libc::S_IFMT);
        self.make_node(ctx, parent, name, mode, rdev, None, true, umask)
    }

    pub fn mkdir(&self, ctx: Ctx, parent: u64, name: &[u8], mode: u32) -> Result<Attr> {
        self.mkdir_umask(ctx, parent, name, mode, 0)
    }

    /// [`Fs::mkdir`] with the mode not yet masked (see [`Fs::mknod_umask`]).
    pub fn mkdir_umask(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Attr> {
        self.make_node(
            ctx,
            parent,
            name,
            libc::S_IFDIR | (mode & 0o7777),
            0,
            None,
            true,
            umask,
        )
    }

    pub fn symlink(&self, ctx: Ctx, parent: u64, name: &[u8], target: &[u8]) -> Result<Attr> {
        if target.is_empty() {
            return Err(Errno::ENOENT);
        }
        if target.len() > SYMLINK_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        self.make_node(
            ctx,
            parent,
            name,
            libc::S_IFLNK | 0o777,
            0,
            Some(target),
            true,
            0,
        )
    }

    /// `open(O_CREAT)`: creates a regular file, or with `excl == false` opens an
    /// existing one of that name. Returns the attributes and whether it was created.
    /// The result is open (see [`Fs::release`]) and referenced (see [`Fs::forget`]).
    pub fn create(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        excl: bool,
    ) -> Result<(Attr, bool)> {
        self.create_umask(ctx, parent, name, mode, excl, 0)
    }

    /// [`Fs::create`] with the mode not yet masked (see [`Fs::mknod_umask`]).
    pub fn create_umask(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        excl: bool,
        umask: u32,
    ) -> Result<(Attr, bool)> {
        match self.make_node_open(
            ctx,
            parent,
            name,
            libc::S_IFREG | (mode & 0o7777),
            0,
            None,
            true,
            true,
            umask,
        ) {
            Ok(attr) => Ok((attr, true)),
            Err(Errno::EEXIST) if !excl && !is_dot(name) => {
                let attr = self.lookup(parent, name)?;
                if attr.kind == FileType::Directory {
                    self.forget(attr.ino, 1);
                    return Err(Errno::EISDIR);
                }
                self.open(attr.ino, libc::O_RDWR)?;
                Ok((attr, false))
            }
            Err(e) => Err(e),
        }
    }

    /// `open(dir, O_TMPFILE)`: a regular file with no name and no link,
    /// open (see [`Fs::release`]) and referenced (see [`Fs::forget`]); it is
    /// freed when both are dropped, like an unlinked open file, unless
    /// [`Fs::link`] names it first, which `excl` (`O_EXCL`) forbids. Owner,
    /// group and mode are set as by [`Fs::create`] in `dir`, whose entries
    /// and times do not change.
    pub fn tmpfile(&self, ctx: Ctx, dir: u64, mode: u32, excl: bool) -> Result<Attr> {
        self.tmpfile_umask(ctx, dir, mode, 0, excl)
    }

    /// [`Fs::tmpfile`] with the mode not yet masked: `umask` applies unless
    /// `dir` has a default ACL, which the file then inherits (see
    /// [`Fs::mknod_umask`]).
    pub fn tmpfile_umask(
        &self,
        ctx: Ctx,
        dir: u64,
        mode: u32,
        umask: u32,
        excl: bool,
    ) -> Result<Attr> {
        let _gate = self.enter();
        self.admit(META_RECORD + self.inherited_bytes(dir))?;
        let d = self.get(dir)?;
        let kind = FileType::RegularFile;
        let now = Timespec::now();
        let meta = {
            let st = d.state.read();
            st.dir().ok_or(Errno::ENOTDIR)?;
            Self::new_meta(&st.meta, ctx, kind, mode, umask, 0, now)
        };
        let inherited_flags = meta.flags;
        let ino = self.reserve_inode()?;
        let inode = self.new_inode(ino, kind, meta, Body::File(FileData::default()));
        inode.nlookup.store(1, Ordering::Relaxed);
        inode.nopen.store(1, Ordering::Relaxed);
        if !excl {
            inode.linkable.store(true, Ordering::Relaxed);
        }
        // Published, then recorded under the node's lock, as a create is: a
        // checkpoint that copies the node sees it with its record already
        // counted, or replays the record over it.
        let st = self.write_state(&inode);
        let attr = st.attr(ino, kind);
        self.core.inodes.insert(ino, inode.clone());
        let logged = self.log(|| Mutation::Tmpfile { attr }).and_then(|()| {
            // The inherited ACLs, after the node's record: no one else can
            // reach the node before this returns.
            self.log_xattrs(attr, &st.meta)?;
            if inherited_flags != 0 {
                self.log(|| Mutation::SetFlags {
                    attr,
                    flags: inherited_flags as u32,
                })?;
            }
            Ok(())
        });
        if let Err(e) = logged {
            // Nobody else knows the number yet: take the node back whole.
            drop(st);
            self.core.inodes.remove(&ino);
            uncount(&self.used_inodes, 1, "inodes");
            return Err(e);
        }
        Ok(attr)
    }

    /// Whether `ino` is a tmpfile that [`Fs::link`] may still name. A
    /// checkpoint keeps such a node although it has no link: a link
    /// recorded after the copy began finds its data there.
    pub fn is_linkable_tmpfile(&self, ino: u64) -> bool {
        self.core
            .inodes
            .get(&ino)
            .is_some_and(|n| n.linkable.load(Ordering::Acquire))
    }

    /// A new hard link `newparent/newname` to `ino` (takes a kernel reference).
    pub fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr> {
        let _gate = self.enter();
        self.admit(META_RECORD)?;
        check_new_name(newname)?;
        let inode = self.get(ino)?;
        if inode.kind == FileType::Directory {
            return Err(Errno::EPERM);
        }
        let dir = self.get(newparent)?;
        let mut dst = self.write_state(&dir);
        dst.check_new_entry(newname)?;
        dst.meta.check_add_entry()?;
        let mut st = self.write_state(&inode);
        // A removed node stays removed, except a linkable tmpfile's first
        // name; it is an ordinary file from then on, as with Linux's I_LINKABLE.
        if st.meta.nlink == 0 && !inode.linkable.swap(false, Ordering::AcqRel) {
            return Err(Errno::ENOENT);
        }
        st.meta.check_modify()?;
        if st.meta.nlink >= LINK_MAX {
            return Err(Errno::EMLINK);
        }
        let now = Timespec::now();
        st.meta.nlink += 1;
        st.meta.ctime = now;
        dst.dir_mut()
            .expect("checked")
            .insert(newname, ino, inode.kind);
        dst.touch_mc(now);
        dst.check_dir_links();
        inode.nlookup.fetch_add(1, Ordering::AcqRel);
        let attr = st.attr(ino, inode.kind);
        self.log(|| Mutation::Link {
            parent: dst.attr(newparent, FileType::Directory),
            name: newname,
            attr,
        })?;
        Ok(attr)
    }

    // ---- removing nodes ------------------------------------------------------------

    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.remove(parent, name, false)
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.remove(parent, name, true)
    }

    fn remove(&self, parent: u64, name: &[u8], want_dir: bool) -> Result<()> {
        let _gate = self.enter();
        self.admit(META_RECORD)?;
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
        let dir = self.get(parent)?;
        let mut pst = self.write_state(&dir);
        let (ino, kind) = pst
            .dir()
            .ok_or(Errno::ENOTDIR)?
            .get(name)
            .ok_or(Errno::ENOENT)?;
        match (want_dir, kind == FileType::Directory) {
            (true, false) => return Err(Errno::ENOTDIR),
            (false, true) => return Err(Errno::EISDIR),
            _ => {}
        }
        pst.meta.check_modify()?;
        let child = self.get(ino)?;
        let now = Timespec::now();
        {
            let mut cst = self.write_state(&child);
            cst.meta.check_modify()?;
            if want_dir {
                if !cst.dir().is_some_and(|d| d.is_empty()) {
                    return Err(Errno::ENOTEMPTY);
                }
                cst.meta.nlink = 0;
                pst.meta.drop_link();
            } else {
                cst.meta.drop_link();
            }
            cst.meta.ctime = now;
            pst.dir_mut().expect("checked").remove(name);
            pst.touch_mc(now);
            pst.check_dir_links();
            self.log(|| Mutation::Remove {
                parent: pst.attr(parent, FileType::Directory),
                name,
                attr: cst.attr(ino, kind),
            })?;
        }
        drop(pst);
        self.maybe_free(&child);
        Ok(())
    }

    // ---- rename ---------------------------------------------------------------------

    /// Ancestors of `ino` up to the root, `ino` first. Only meaningful under
    /// `rename_lock`, which keeps directories from moving.
    fn ancestors(&self, mut ino: u64) -> Result<Vec<u64>> {
        let mut chain = vec![ino];
        while ino != ROOT_INO {
            let inode = self.get(ino)?;
            let parent = inode.state.read().dir().ok_or(Errno::ENOTDIR)?.parent;
            if parent == ino {
                break;
            }
            ino = parent;
            chain.push(ino);
        }
        Ok(chain)
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        self.rename_inner(parent, name, newparent, newname, flags, None)
    }

    /// `rename(2)` with `RENAME_WHITEOUT`: the rename, and in the same step
    /// (both directories stay locked) a whiteout, a 0/0 character device
    /// owned by `ctx`, where the source was (what overlayfs uses to hide a
    /// lower file). `flags.exchange` is `EINVAL`, as in Linux.
    pub fn rename_whiteout(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        if flags.exchange {
            return Err(Errno::EINVAL);
        }
        self.rename_inner(parent, name, newparent, newname, flags, Some(ctx))
    }

    fn rename_inner(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
        whiteout: Option<Ctx>,
    ) -> Result<()> {
        let _gate = self.enter();
        self.admit(META_RECORD)?;
        check_name(name)?;
        check_name(newname)?;
        if is_dot(name) || is_dot(newname) {
            return Err(Errno::EBUSY);
        }
        let src_dir = self.get(parent)?;
        if parent == newparent {
            let mut st = self.write_state(&src_dir);
            if st.dir().is_none() {
                return Err(Errno::ENOTDIR);
            }
            let mut pair = DirPair::Same(&mut st);
            let victim = self.rename_then_whiteout(
                &mut pair, parent, name, newparent, newname, flags, None, whiteout,
            )?;
            drop(st);
            if let Some(v) = victim {
                self.maybe_free(&v);
            }
            return Ok(());
        }
        let dst_dir = self.get(newparent)?;
        let _shape = self.rename_lock.lock();
        let src_chain = self.ancestors(parent)?;
        let dst_chain = self.ancestors(newparent)?;
        // Lock the two directories, ancestor first, else by inode number.
        let src_first = if dst_chain.contains(&parent) {
            true
        } else if src_chain.contains(&newparent) {
            false
        } else {
            parent < newparent
        };
        let (mut a, mut b);
        let mut pair = if src_first {
            a = self.write_state(&src_dir);
            b = self.write_state(&dst_dir);
            DirPair::Two(&mut a, &mut b)
        } else {
            b = self.write_state(&dst_dir);
            a = self.write_state(&src_dir);
            DirPair::Two(&mut a, &mut b)
        };
        if pair.src().dir().is_none() || pair.dst().dir().is_none() {
            return Err(Errno::ENOTDIR);
        }
        let chains = Some((&src_chain[..], &dst_chain[..]));
        let victim = self.rename_then_whiteout(
            &mut pair, parent, name, newparent, newname, flags, chains, whiteout,
        )?;
        let _ = pair;
        drop(a);
        drop(b);
        if let Some(v) = victim {
            self.maybe_free(&v);
        }
        Ok(())
    }

    /// [`Fs::rename_locked`], then the whiteout `whiteout` asks for. Its
    /// inode is reserved first, so that a full inode table fails the whole
    /// call before anything moved.
    #[allow(clippy::too_many_arguments)]
    fn rename_then_whiteout(
        &self,
        pair: &mut DirPair<'_, '_>,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
        chains: Option<(&[u64], &[u64])>,
        whiteout: Option<Ctx>,
    ) -> Result<Option<Arc<Inode>>> {
        let Some(ctx) = whiteout else {
            return self.rename_locked(pair, parent, name, newparent, newname, flags, chains);
        };
        let wino = self.reserve_inode()?;
        let victim = match self.rename_locked(pair, parent, name, newparent, newname, flags, chains)
        {
            Ok(v) => v,
            Err(e) => {
                uncount(&self.used_inodes, 1, "inodes");
                return Err(e);
            }
        };
        let src = pair.src();
        if src.dir().is_some_and(|d| d.get(name).is_some()) {
            // Two names of one node: the rename did nothing, so there is no hole.
            uncount(&self.used_inodes, 1, "inodes");
            return Ok(victim);
        }
        let now = Timespec::now();
        let gid = if src.meta.perm & libc::S_ISGID as u16 != 0 {
            src.meta.gid
        } else {
            ctx.gid
        };
        let meta = Meta {
            perm: 0,
            nlink: 1,
            uid: ctx.uid,
            gid,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            btime: now,
            xattrs: None,
            flags: 0,
        };
        let kind = FileType::CharDevice;
        let inode = self.new_inode(wino, kind, meta, Body::Special(0));
        let attr = inode.state.read().attr(wino, kind);
        self.core.inodes.insert(wino, inode);
        src.dir_mut().expect("dir").insert(name, wino, kind);
        src.touch_mc(now);
        src.check_dir_links();
        self.log(|| Mutation::Create {
            parent: src.attr(parent, FileType::Directory),
            name,
            attr,
            symlink_target: None,
        })?;
        Ok(victim)
    }

    /// The rename itself, with both directories locked. Returns the replaced
    /// node, to be freed by the caller once the locks are dropped. `chains`
    /// holds the ancestors of both directories for a rename between two.
    #[allow(clippy::too_many_arguments)]
    fn rename_locked(
        &self,
        pair: &mut DirPair<'_, '_>,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
        chains: Option<(&[u64], &[u64])>,
    ) -> Result<Option<Arc<Inode>>> {
        let cross = parent != newparent;
        let Some(((sino, skind), target)) =
            check_rename(pair, parent, name, newparent, newname, flags, chains)?
        else {
            return Ok(None);
        };
        let sdir = skind == FileType::Directory;
        let moved = self.get(sino)?;
        let other = target.map(|(dino, _)| self.get(dino)).transpose()?;
        let odir = target.is_some_and(|(_, dkind)| dkind == FileType::Directory);
        let (mut ms, mut os) = self.lock_rename_children(&moved, other.as_deref(), sdir, odir);
        check_rename_flags(pair, &ms, os.as_deref())?;
        let now = Timespec::now();
        if flags.exchange {
            let (dino, dkind) = target.expect("checked");
            let os = os.as_mut().expect("exchange has two nodes");
            pair.src_dir().replace(name, dino, dkind);
            pair.dst_dir().replace(newname, sino, skind);
            if cross {
                exchange_across(pair, &mut ms, os, parent, newparent, sdir, odir);
            }
            os.meta.ctime = now;
        } else {
            if let Some(os) = os.as_mut() {
                unlink_replaced(pair.dst(), os, sdir, now)?;
            }
            pair.src_dir().remove(name);
            let dst = pair.dst_dir();
            match target {
                Some(_) => dst.replace(newname, sino, skind),
                None => dst.insert(newname, sino, skind),
            }
            if sdir {
                if let Some(d) = ms.dir_mut() {
                    d.parent = newparent;
                }
                if cross {
                    pair.src().meta.drop_link();
                    pair.dst().meta.nlink += 1;
                }
            }
        }
        ms.meta.ctime = now;
        pair.src().touch_mc(now);
        pair.dst().touch_mc(now);
        pair.src().check_dir_links();
        pair.dst().check_dir_links();
        self.log(|| Mutation::Rename {
            parent: pair.src().attr(parent, FileType::Directory),
            name,
            new_parent: pair.dst().attr(newparent, FileType::Directory),
            new_name: newname,
            moved: ms.attr(sino, skind),
            other: target.and_then(|(dino, dkind)| os.as_ref().map(|o| o.attr(dino, dkind))),
            exchange: flags.exchange,
        })?;
        drop(ms);
        drop(os);
        Ok(if flags.exchange { None } else { other })
    }

    /// Locks the node a rename moves and the one it replaces or exchanges
    /// with (`other`), in the child order. `sdir` and `odir`: whether each
    /// is a directory.
    fn lock_rename_children<'a>(
        &self,
        moved: &'a Inode,
        other: Option<&'a Inode>,
        sdir: bool,
        odir: bool,
    ) -> (
        RwLockWriteGuard<'a, State>,
        Option<RwLockWriteGuard<'a, State>>,
    ) {
        // Child locks: a directory before a non-directory, else in ascending
        // inode number. A file may also be an entry of the directory it is
        // exchanged with (a hard link), and `readdirplus` holds a directory
        // while it reads its entries; locking the file first would deadlock
        // against it.
        match other {
            Some(o)
                if if odir != sdir {
                    odir
                } else {
                    o.ino < moved.ino
                } =>
            {
                let os = self.write_state(o);
                (self.write_state(moved), Some(os))
            }
            Some(o) => {
                let ms = self.write_state(moved);
                (ms, Some(self.write_state(o)))
            }
            None => (self.write_state(moved), None),
        }
    }

    // ---- open files ------------------------------------------------------------------

    /// Opens `ino` with `open(2)` flags; pair with [`Fs::release`].
    pub fn open(&self, ino: u64, flags: i32) -> Result<()> {
        let inode = self.get(ino)?;
        let acc = flags & libc::O_ACCMODE;
        if inode.kind == FileType::Directory
            && (acc != libc::O_RDONLY || flags & libc::O_TRUNC != 0)
        {
            return Err(Errno::EISDIR);
        }
        inode.state.read().meta.check_open(flags)?;
        if flags & libc::O_TRUNC != 0
            && acc != libc::O_RDONLY
            && inode.kind == FileType::RegularFile
        {
            self.setattr(
                Ctx::ROOT,
                ino,
                &SetAttr {
                    size: Some(0),
                    ..Default::default()
                },
            )?;
        }
        inode.nopen.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Closes one handle opened by [`Fs::open`] or [`Fs::create`].
    pub fn release(&self, ino: u64) {
        if let Ok(inode) = self.get(ino) {
            // Saturating on purpose: a handle opened on the tree an online
            // rollback replaced is closed on the new one, whose nodes start
            // with no open count.
            let prev = inode
                .nopen
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                    Some(c.saturating_sub(1))
                })
                .unwrap_or(0);
            if prev <= 1 {
                self.maybe_free(&inode);
            }
        }
    }

    /// Reads up to `buf.len()` bytes at `off`; returns the count (0 at end of file).
    pub fn read(&self, ino: u64, off: u64, buf: &mut [u8]) -> Result<usize> {
        self.read_atime(ino, off, buf, AtimeMode::Relative)
    }

    /// [`Fs::read`] with the mount's atime policy.
    pub fn read_atime(&self, ino: u64, off: u64, buf: &mut [u8], mode: AtimeMode) -> Result<usize> {
        self.read_in(ino, off, buf.len(), mode, |data, n| {
            data.read(off, &mut buf[..n]);
            n
        })
    }

    /// Reads up to `len` bytes at `off` without copying them: calls `f`
    /// with slices that cover `[off, off + n)` in order, `n` clipped at the
    /// end of file (no slice at all past it). Holes read from a shared
    /// static page of zeros. The file's lock is held shared while `f` runs,
    /// so the bytes cannot change under it: `f` must not write to this file
    /// (that would wait for itself). The access time and errors are those
    /// of [`Fs::read_atime`] (EISDIR for a directory, EINVAL for other
    /// non-files; permissions are the caller's, as there).
    pub fn read_with<R>(
        &self,
        ino: u64,
        off: u64,
        len: usize,
        mode: AtimeMode,
        f: impl FnOnce(&[&[u8]]) -> R,
    ) -> Result<R> {
        self.read_in(ino, off, len, mode, |data, n| data.with_slices(off, n, f))
    }

    /// A read of up to `len` bytes at `off`: the access time moves as the
    /// mount's policy says, then `f` gets the file and the count clipped at
    /// the end of file, under the node's read lock.
    ///
    /// The access time moves first because `f` may be the reply itself (the
    /// FUSE READ): once the kernel has it, it drops its cached atime, and a
    /// `stat` right after the read may be answered by another worker before
    /// a later update, and then cached stale (seen once in 25 runs of
    /// `atime_policy_at_mount_time`).
    fn read_in<R>(
        &self,
        ino: u64,
        off: u64,
        len: usize,
        mode: AtimeMode,
        f: impl FnOnce(&FileData, usize) -> R,
    ) -> Result<R> {
        // relatime, as Linux's relatime_need_update: the access is news when
        // the last one is not later than the last change, or a day old (a
        // day needs no finer clock than the tick's).
        let stale = |m: &Meta| {
            m.atime <= m.mtime
                || m.atime <= m.ctime
                || Timespec::coarse_now().sec - m.atime.sec >= 86_400
        };
        let inode = self.get(ino)?;
        let mut atime_done = false;
        loop {
            let st = inode.state.read();
            let data = match &st.body {
                Body::File(d) => d,
                Body::Dir(_) => return Err(Errno::EISDIR),
                _ => return Err(Errno::EINVAL),
            };
            if off >= st.meta.size {
                return Ok(f(data, 0));
            }
            // The noatime inode flag (chattr +A) wins over any mount policy.
            let needs_atime = !atime_done
                && match mode {
                    _ if st.meta.noatime() => false,
                    AtimeMode::Never => false,
                    AtimeMode::Strict => true,
                    AtimeMode::Relative => stale(&st.meta),
                };
            if !needs_atime {
                let n = ((st.meta.size - off) as usize).min(len);
                return Ok(f(data, n));
            }
            drop(st);
            let now = Timespec::now();
            let mut st = self.write_state(&inode);
            if mode == AtimeMode::Strict || stale(&st.meta) {
                st.meta.atime = now;
                // Checked first: under strictatime every read comes here,
                // and a store each time would bounce the line between CPUs.
                if !self.unrecorded_atimes.load(Ordering::Relaxed) {
                    self.unrecorded_atimes.store(true, Ordering::Release);
                }
            }
            drop(st);
            // Once per read: the data is read under a fresh read lock.
            atime_done = true;
        }
    }

    /// Whether a read moved an access time since the last call (or since
    /// the file system was made), and clears that. A copy of the tree that
    /// starts after this call holds every atime moved before it; one moved
    /// later sets it again.
    pub fn take_unrecorded_atimes(&self) -> bool {
        self.unrecorded_atimes.swap(false, Ordering::AcqRel)
    }

    /// Convenience: reads into a new buffer.
    pub fn read_vec(&self, ino: u64, off: u64, len: usize) -> Result<Vec<u8>> {
        let inode = self.get(ino)?;
        let size = inode.state.read().meta.size;
        let len = len.min(size.saturating_sub(off) as usize);
        let mut buf = vec![0; len];
        let n = self.read(ino, off, &mut buf)?;
        buf.truncate(n);
        Ok(buf)
    }

    /// Writes `data` at `off` (at the end of file with `append`); returns the
    /// count written, which is all of it or an error.
    ///
    /// `write` by `ctx`, taken to be in every group it names and to hold
    /// CAP_FSETID if it is root: a caller without it then keeps setgid
    /// without group-exec. Callers that know the caller's supplementary
    /// groups or capabilities use [`Fs::write_as`].
    pub fn write(&self, ctx: Ctx, ino: u64, off: u64, data: &[u8], append: bool) -> Result<usize> {
        self.write_as(ctx, &|_| true, ctx.uid != 0, ino, off, data, append)
    }

    /// `write` on behalf of `ctx`. With `kill_suidgid` (the caller lacks
    /// CAP_FSETID: through FUSE, the kernel's FUSE_WRITE_KILL_SUIDGID says
    /// so, which a uid cannot) the file loses setuid, its file capability,
    /// and setgid when group-exec is set or when the caller is outside the
    /// file's group (`in_group(gid)`: its supplementary groups, which only
    /// the caller's side knows; asked only when it decides).
    // `kill_suidgid` is the caller's to know, like `in_group`.
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
    ) -> Result<usize> {
        let src = WriteSrc::Bytes(data);
        self.write_from(ctx, in_group, kill_suidgid, ino, off, src, append)
    }

    /// [`Fs::write_as`] of the first `len` bytes held by `pages` (page `i`
    /// holds bytes `[i * PAGE_SIZE, (i + 1) * PAGE_SIZE)`). At a
    /// page-aligned offset the file takes each whole page as it is instead
    /// of copying it: a caller that reads the data into page allocations in
    /// the first place (the FUSE adapter) then copies it once, not twice.
    /// A taken page's slot is left `None`, or holds the page of the file
    /// that it replaced (garbage to the caller, for reading the next write
    /// into). Every page left in `pages` is the caller's to reuse. EINVAL
    /// if a page the data needs is missing. A recorder records the bytes
    /// from the file's pages ([`Recorder::record_write`]).
    // `write_as`'s arguments, with the data as a length and its pages.
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
    ) -> Result<usize> {
        let need = len.div_ceil(PAGE_SIZE);
        if pages.len() < need || pages[..need].iter().any(Option::is_none) {
            return Err(Errno::EINVAL);
        }
        self.write_from(
            ctx,
            in_group,
            kill_suidgid,
            ino,
            off,
            WriteSrc::Pages { len, pages },
            append,
        )
    }

    // One piece: the write hot path. Split into helpers (d1a0b42), fio's
    // 4k buffered figure fell from 54-60 to 27-48 MiB/s in alternated runs,
    // and came back when it was one body again (docs/architecture.md, "The
    // rooms refactor, measured"); keep it whole until a split is measured.
    #[allow(clippy::too_many_arguments)]
    fn write_from(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        kill_suidgid: bool,
        ino: u64,
        off: u64,
        src: WriteSrc<'_>,
        append: bool,
    ) -> Result<usize> {
        let len = src.len();
        let _gate = self.enter();
        self.admit(META_RECORD + len as u64)?;
        let inode = self.get(ino)?;
        // Declared before the lock's guard, so that pages left over are
        // freed after it is released.
        let mut spare = Spare::default();
        let mut st = self.write_state(&inode);
        let (meta, file, off, end, reserved) = loop {
            let (meta, file) = st.file_mut(Errno::EINVAL)?;
            meta.check_write(append)?;
            let off = if append { meta.size } else { off };
            if len == 0 {
                return Ok(0);
            }
            let end = off.checked_add(len as u64).ok_or(Errno::EFBIG)?;
            if end > MAX_FILE_SIZE {
                return Err(Errno::EFBIG);
            }
            let (first, last) = (off / PAGE, (end - 1) / PAGE);
            // A page a snapshot shares costs a copy on its first write.
            let reserved = file.pages_to_reserve(first, last);
            // The pages this write adds are made without the lock, once
            // (`Spare`): then the state is looked at again, as it may have
            // changed meanwhile. Files not yet in pages (empty or inline:
            // most small files) and writes the engine takes as pages skip
            // it, as do writes needing more than `Spare::MAX`.
            let ahead = matches!(src, WriteSrc::Bytes(_)) && file.is_paged();
            if ahead && spare.len() == 0 && (1..=Spare::MAX).contains(&reserved) {
                drop(st);
                spare.fill(reserved);
                st = self.write_state(&inode);
                continue;
            }
            break (meta, file, off, end, reserved);
        };
        self.reserve_pages(reserved)?;
        let (allocated, data) = match src {
            WriteSrc::Bytes(data) => (file.write_spare(off, data, &mut spare), Some(data)),
            // The bytes are the file's now: recorded from its pages below.
            WriteSrc::Pages { len, pages } => (file.write_pages(off, len, pages), None),
        };
        // Cheap, and past it the subtraction below would wrap in release
        // builds: a write that used more than it reserved went past the
        // capacity unnoticed.
        assert!(
            allocated <= reserved,
            "a write allocated {allocated} pages with {reserved} reserved"
        );
        self.release_pages(reserved - allocated);
        meta.size = meta.size.max(end);
        #[cfg(debug_assertions)]
        file.check(meta.size, false);
        let now = Timespec::now();
        meta.mtime = now;
        meta.ctime = now;
        // The FUSE adapter negotiates HANDLE_KILLPRIV_V2, so the kernel leaves
        // to us what it would otherwise do with a GETXATTR round trip before
        // every write: drop setuid/setgid and the file capability.
        let mut dropped_caps = false;
        if kill_suidgid {
            meta.perm = drop_privs(meta.perm, meta.gid, ctx, in_group);
            if let Some(xs) = meta.xattrs.as_mut() {
                dropped_caps = xs.remove(SECURITY_CAPABILITY).is_ok();
                if xs.is_empty() {
                    meta.xattrs = None;
                }
            }
        }
        match data {
            Some(data) => self.log(|| Mutation::Write {
                attr: st.attr(ino, inode.kind),
                offset: off,
                data,
            })?,
            None => match &self.recorder {
                None => {
                    self.commit.fetch_add(1, Ordering::AcqRel);
                }
                Some(r) => {
                    let attr = st.attr(ino, inode.kind);
                    let Body::File(file) = &st.body else {
                        unreachable!("written as a file above")
                    };
                    // Under the node's write lock: exactly the bytes just
                    // written, from the pages the file took.
                    let id =
                        file.with_slices(off, len, |parts| r.record_write(&attr, off, parts))?;
                    self.commit.fetch_max(id, Ordering::AcqRel);
                }
            },
        }
        if dropped_caps {
            self.log(|| Mutation::RemoveXattr {
                attr: st.attr(ino, inode.kind),
                name: SECURITY_CAPABILITY,
            })?;
        }
        Ok(len)
    }

    /// `fsync`: every change is already in memory; with a recorder, waits
    /// until every commit so far is durable (one journal orders all changes,
    /// so making this file durable makes everything before it durable too).
    pub fn fsync(&self, ino: u64) -> Result<()> {
        self.get(ino)?;
        self.sync_all()
    }

    /// `lseek` with `SEEK_DATA` or `SEEK_HOLE` (other whences are the caller's).
    pub fn lseek(&self, ino: u64, off: u64, whence: i32) -> Result<u64> {
        let inode = self.get(ino)?;
        let st = inode.state.read();
        let Body::File(d) = &st.body else {
            return Err(Errno::EINVAL);
        };
        let size = st.meta.size;
        match whence {
            libc::SEEK_DATA => d.seek_data(off, size).ok_or(Errno::ENXIO),
            libc::SEEK_HOLE => d.seek_hole(off, size).ok_or(Errno::ENXIO),
            libc::SEEK_SET => Ok(off),
            libc::SEEK_END => Ok(size),
            _ => Err(Errno::EINVAL),
        }
    }

    pub fn fallocate(&self, ino: u64, off: u64, len: u64, mode: FallocateMode) -> Result<()> {
        self.fallocate_as(Ctx::ROOT, &|_| true, false, ino, off, len, mode)
    }

    /// `fallocate` on behalf of `ctx`: like a write, with `kill_suidgid` (a
    /// caller without CAP_FSETID) the file loses setuid, and setgid unless
    /// the caller is in the file's group (`in_group(gid)`: its supplementary
    /// groups, which only the caller's side knows) and group-exec is off.
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
    ) -> Result<()> {
        let _gate = self.enter();
        self.admit(META_RECORD)?;
        if len == 0 {
            return Err(Errno::EINVAL);
        }
        let end = off.checked_add(len).ok_or(Errno::EFBIG)?;
        if end > MAX_FILE_SIZE {
            return Err(Errno::EFBIG);
        }
        let inode = self.get(ino)?;
        let mut st = self.write_state(&inode);
        let (meta, file) = st.file_mut(Errno::ENODEV)?;
        // vfs_fallocate: only a plain allocation may touch an append-only file.
        meta.check_write(!(mode.punch_hole || mode.zero_range))?;
        let now = Timespec::now();
        if mode.punch_hole {
            self.give_back(file.punch(off, len.min(meta.size.saturating_sub(off))));
        } else {
            // Reserve before zeroing, so that ENOSPC leaves the file untouched.
            // Whole pages the zeroing frees are allocated again just below, so
            // they keep their reservation: only absent pages need capacity,
            // and shared ones (a snapshot keeps the old page).
            let (first, last) = (off / PAGE, (end - 1) / PAGE);
            let reserved = file.pages_to_reserve(first, last);
            self.reserve_pages(reserved)?;
            let mut net = 0i64;
            if mode.zero_range {
                net -= file.punch(off, len.min(meta.size.saturating_sub(off)));
            }
            net += file.allocate(off, len) as i64;
            self.give_back(reserved as i64 - net);
            if !mode.keep_size {
                meta.size = meta.size.max(end);
            }
        }
        #[cfg(debug_assertions)]
        file.check(meta.size, mode.punch_hole || mode.zero_range);
        meta.mtime = now;
        meta.ctime = now;
        if kill_suidgid {
            meta.perm = drop_privs(meta.perm, meta.gid, ctx, in_group);
        }
        self.log(|| Mutation::Fallocate {
            attr: st.attr(ino, inode.kind),
            offset: off,
            len,
            mode,
        })?;
        Ok(())
    }

    /// Copies a range between files inside the engine (no user-space round
    /// trip), by `ctx` taken to be in every group it names (see [`Fs::write`]).
    pub fn copy_file_range(
        &self,
        ctx: Ctx,
        ino_in: u64,
        off_in: u64,
        ino_out: u64,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        self.copy_file_range_as(ctx, &|_| true, ino_in, off_in, ino_out, off_out, len)
    }

    /// [`Fs::copy_file_range`] on behalf of `ctx`, whose supplementary groups
    /// `in_group` knows: the destination loses setuid and setgid as by
    /// [`Fs::write_as`], root taken to hold CAP_FSETID (FUSE's
    /// COPY_FILE_RANGE does not say whether the caller does).
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
    ) -> Result<u64> {
        // No gate of its own: each chunk's write takes it, so a snapshot
        // waits for one chunk, not for a copy of gigabytes.
        const CHUNK: u64 = 1 << 20;
        let src = self.get(ino_in)?;
        let dst = self.get(ino_out)?;
        if src.kind == FileType::Directory || dst.kind == FileType::Directory {
            return Err(Errno::EISDIR);
        }
        if src.kind != FileType::RegularFile || dst.kind != FileType::RegularFile {
            return Err(Errno::EINVAL);
        }
        // Like Linux, clamp the count to the source's size once, up front: a
        // copy within one file that extends it must not go on to copy what it
        // has just written.
        let size_in = src.state.read().meta.size;
        let len = len.min(size_in.saturating_sub(off_in));
        if ino_in == ino_out
            && off_in < off_out.saturating_add(len)
            && off_out < off_in.saturating_add(len)
        {
            return Err(Errno::EINVAL);
        }
        let mut done = 0;
        let mut buf = Vec::new();
        while done < len {
            let want = (len - done).min(CHUNK) as usize;
            buf.resize(want, 0);
            let n = self.read(ino_in, off_in + done, &mut buf)?;
            if n == 0 {
                break;
            }
            let kill = ctx.uid != 0;
            self.write_as(
                ctx,
                in_group,
                kill,
                ino_out,
                off_out + done,
                &buf[..n],
                false,
            )?;
            done += n as u64;
        }
        Ok(done)
    }

    // ---- directories -------------------------------------------------------------------

    /// Lists `ino` from `offset` (0 to start): `.`, `..`, then the entries.
    /// `f` returns false when it wants no more.
    pub fn readdir(
        &self,
        ino: u64,
        offset: u64,
        mut f: impl FnMut(DirEntry<'_>) -> bool,
    ) -> Result<()> {
        let inode = self.get(ino)?;
        let st = inode.state.read();
        let d = st.dir().ok_or(Errno::ENOTDIR)?;
        list_dir(ino, d, offset, &mut f);
        Ok(())
    }

    /// Like [`Fs::readdir`] with each entry's attributes; every entry that `f`
    /// accepts (returns true for), other than `.` and `..`, takes a kernel reference.
    pub fn readdirplus(
        &self,
        ino: u64,
        offset: u64,
        mut f: impl FnMut(DirEntry<'_>, &Attr) -> bool,
    ) -> Result<()> {
        let inode = self.get(ino)?;
        // The attributes of `..` are read before the directory is locked:
        // waiting for a parent while holding its child breaks the
        // ancestor-first lock order. They may be a moment stale, as any
        // listing may.
        let dotdot = if offset <= 1 {
            let up = inode.state.read().dir().ok_or(Errno::ENOTDIR)?.parent;
            Some(self.getattr(up)?)
        } else {
            None
        };
        let st = inode.state.read();
        let d = st.dir().ok_or(Errno::ENOTDIR)?;
        if offset == 0 {
            let attr = st.attr(ino, inode.kind);
            let e = DirEntry {
                ino,
                kind: FileType::Directory,
                name: b".",
                offset: 1,
            };
            if !f(e, &attr) {
                return Ok(());
            }
        }
        if let Some(attr) = dotdot {
            let e = DirEntry {
                ino: attr.ino,
                kind: FileType::Directory,
                name: b"..",
                offset: FIRST_SLOT_OFFSET,
            };
            if !f(e, &attr) {
                return Ok(());
            }
        }
        d.list_from(offset.max(FIRST_SLOT_OFFSET), |s, next| {
            let Ok(child) = self.get(s.ino) else {
                return true;
            };
            let attr = child.state.read().attr(s.ino, child.kind);
            let e = DirEntry {
                ino: s.ino,
                kind: s.kind,
                name: s.name,
                offset: next,
            };
            let accepted = f(e, &attr);
            if accepted {
                child.nlookup.fetch_add(1, Ordering::AcqRel);
            }
            accepted
        });
        Ok(())
    }

    pub fn statfs(&self) -> StatFs {
        let used = self.used_pages.load(Ordering::Acquire);
        let files_used = self.used_inodes.load(Ordering::Acquire);
        StatFs {
            blocks: self.max_pages,
            // Usage may pass the capacity (a truncate that copies a shared
            // page, a clone's copies: docs/snapshots.md): nothing is free then.
            bfree: self.max_pages.saturating_sub(used),
            bavail: self.max_pages.saturating_sub(used),
            files: self.config.max_inodes,
            // A clone's copies may pass the limit too.
            ffree: self.config.max_inodes.saturating_sub(files_used),
            bsize: PAGE_SIZE as u32,
            namelen: NAME_MAX as u32,
            frsize: PAGE_SIZE as u32,
        }
    }

    // ---- extended attributes -----------------------------------------------------------

    /// Sets an xattr as root would (see [`Fs::setxattr_as`]).
    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], mode: XattrMode) -> Result<()> {
        self.setxattr_as(Ctx::ROOT, &|_| true, ino, name, value, mode)
    }

    /// Sets an xattr on behalf of `ctx` (`in_group(gid)`: its supplementary
    /// groups). A POSIX ACL is validated and applied (see [`Fs::set_acl`]).
    pub fn setxattr_as(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        ino: u64,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
    ) -> Result<()> {
        let _gate = self.enter();
        self.admit(META_RECORD + (name.len() + value.len()) as u64)?;
        xattr::check_name(name)?;
        if name == acl::ACL_ACCESS || name == acl::ACL_DEFAULT {
            return self.set_acl(ctx, in_group, ino, name, value);
        }
        let inode = self.get(ino)?;
        if name.starts_with(b"user.")
            && !matches!(inode.kind, FileType::RegularFile | FileType::Directory)
        {
            return Err(Errno::EPERM);
        }
        let mut st = self.write_state(&inode);
        st.meta.check_modify()?;
        let xs = st
            .meta
            .xattrs
            .get_or_insert_with(|| Box::new(Xattrs::default()));
        let r = xs.set(name, value, mode);
        if xs.is_empty() {
            st.meta.xattrs = None;
        }
        r?;
        let now = Timespec::now();
        st.meta.ctime = now;
        self.log(|| Mutation::SetXattr {
            attr: st.attr(ino, inode.kind),
            name,
            value,
        })?;
        Ok(())
    }

    /// Sets (or with an empty ACL removes) a POSIX ACL as Linux's
    /// `set_posix_acl` and `posix_acl_update_mode` do: not on an immutable or
    /// append-only node; only the owner or root; a default ACL only on a
    /// directory; an access ACL rewrites the mode's rwx bits, clears setgid
    /// when the caller is not in the file's group, and is stored only when
    /// the mode cannot say it.
    fn set_acl(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        ino: u64,
        name: &[u8],
        value: &[u8],
    ) -> Result<()> {
        let acl = Acl::parse_valid(value)?;
        let inode = self.get(ino)?;
        if inode.kind == FileType::Symlink {
            return Err(Errno::EOPNOTSUPP);
        }
        let mut st = self.write_state(&inode);
        // Immutable and append-only nodes refuse an ACL change, to root
        // too, as any xattr change (`may_write_xattr` in `vfs_set_acl`);
        // the kernel cannot, as it never sees the flags (flags.rs).
        st.meta.check_modify()?;
        if ctx.uid != 0 && ctx.uid != st.meta.uid {
            return Err(Errno::EPERM);
        }
        let access = name == acl::ACL_ACCESS;
        if !access && inode.kind != FileType::Directory {
            return if acl.is_some() {
                Err(Errno::EACCES)
            } else {
                Ok(())
            };
        }
        let mut stored = acl.as_ref().map(Acl::to_xattr);
        let mut new_perm = None;
        if access && let Some(a) = &acl {
            let (bits, equiv) = a.equiv_mode();
            let mut perm = (st.meta.perm & !0o777) | bits;
            if ctx.uid != 0 && ctx.gid != st.meta.gid && !in_group(st.meta.gid) {
                perm &= !(libc::S_ISGID as u16);
            }
            new_perm = Some(perm);
            if equiv {
                stored = None;
            }
        }
        let xs = st
            .meta
            .xattrs
            .get_or_insert_with(|| Box::new(Xattrs::default()));
        let r = match &stored {
            Some(v) => xs.set(name, v, XattrMode::Any),
            None => xs.remove(name).or(Ok(())),
        };
        if xs.is_empty() {
            st.meta.xattrs = None;
        }
        // The mode changes only with the ACL: an ACL refused for want of
        // xattr space (ENOSPC) leaves the mode as it was (xfstests
        // generic/449), as Linux's `set_posix_acl` does.
        r?;
        if let Some(perm) = new_perm {
            st.meta.perm = perm;
        }
        st.meta.ctime = Timespec::now();
        let attr = st.attr(ino, inode.kind);
        match &stored {
            Some(value) => self.log(|| Mutation::SetXattr { attr, name, value }),
            None => self.log(|| Mutation::RemoveXattr { attr, name }),
        }
    }

    /// The access ACL of a node, if it has one beyond its mode.
    pub(crate) fn access_acl(meta: &Meta) -> Option<Acl> {
        let v = meta.xattrs.as_ref()?.get(acl::ACL_ACCESS)?;
        Acl::parse(v).ok().flatten()
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        xattr::check_name(name)?;
        let inode = self.get(ino)?;
        let st = inode.state.read();
        st.meta
            .xattrs
            .as_ref()
            .and_then(|x| x.get(name))
            .map(|v| v.to_vec())
            .ok_or(Errno::ENODATA)
    }

    /// Names, each followed by NUL.
    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        let inode = self.get(ino)?;
        let st = inode.state.read();
        Ok(st
            .meta
            .xattrs
            .as_ref()
            .map(|x| x.list())
            .unwrap_or_default())
    }

    pub fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        let _gate = self.enter();
        self.admit(META_RECORD + name.len() as u64)?;
        xattr::check_name(name)?;
        let inode = self.get(ino)?;
        let mut st = self.write_state(&inode);
        st.meta.check_modify()?;
        let xs = st.meta.xattrs.as_mut().ok_or(Errno::ENODATA)?;
        xs.remove(name)?;
        if xs.is_empty() {
            st.meta.xattrs = None;
        }
        let now = Timespec::now();
        st.meta.ctime = now;
        self.log(|| Mutation::RemoveXattr {
            attr: st.attr(ino, inode.kind),
            name,
        })?;
        Ok(())
    }

    // ---- locks -------------------------------------------------------------------------

    fn lock_request(
        start: u64,
        end: u64,
        typ: i32,
        owner: u64,
        pid: u32,
    ) -> Result<(RangeLock, bool)> {
        if end < start {
            return Err(Errno::EINVAL);
        }
        let set = match typ {
            libc::F_RDLCK | libc::F_WRLCK => true,
            libc::F_UNLCK => false,
            _ => return Err(Errno::EINVAL),
        };
        Ok((
            RangeLock {
                start,
                end,
                write: typ == libc::F_WRLCK,
                owner,
                pid,
            },
            set,
        ))
    }

    fn file_lock_table<'a>(&self, st: &'a mut RwLockWriteGuard<'_, State>) -> &'a mut LockTable {
        if st.locks.is_none() {
            self.locked.store(true, Ordering::Release);
        }
        st.locks.get_or_insert_with(Default::default)
    }

    fn run_callbacks(done: Vec<(LockCallback, Result<()>)>) {
        for (cb, r) in done {
            cb(r);
        }
    }

    /// `F_GETLK`: the first lock that would block the request, or `F_UNLCK`.
    pub fn getlk(
        &self,
        ino: u64,
        owner: u64,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
    ) -> Result<LockInfo> {
        let (req, _) = Self::lock_request(start, end, typ, owner, pid)?;
        let inode = self.get(ino)?;
        let st = inode.state.read();
        let conflict = st
            .locks
            .as_ref()
            .and_then(|t| t.conflict(Family::Posix, &req));
        Ok(LockInfo::reported(
            start,
            end,
            conflict.map(|l| (l.start, l.end, l.write, l.pid)),
        ))
    }

    /// `F_SETLK`: sets or clears a record lock without waiting (`EAGAIN` on conflict).
    pub fn setlk(
        &self,
        ino: u64,
        owner: u64,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
    ) -> Result<()> {
        self.lock_common(Family::Posix, ino, owner, start, end, typ, pid, None)
    }

    /// `F_SETLKW`: like [`Fs::setlk`], but a conflicting request is parked and
    /// `done` runs once it is granted, or with `EINTR` when it is cancelled
    /// ([`Fs::cancel_lock_wait`] with the same `token`, or its owner releasing
    /// its locks). `done` may run before this returns.
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
        // With a callback every outcome, errors included, is delivered through it.
        let _ = self.lock_common(
            Family::Posix,
            ino,
            owner,
            start,
            end,
            typ,
            pid,
            Some((token, done)),
        );
    }

    /// `flock(2)`: `typ` is `F_RDLCK` (shared), `F_WRLCK` (exclusive) or `F_UNLCK`.
    pub fn flock(
        &self,
        ino: u64,
        owner: u64,
        typ: i32,
        wait: Option<(u64, LockCallback)>,
    ) -> Result<()> {
        self.lock_common(Family::Flock, ino, owner, 0, u64::MAX, typ, 0, wait)
    }

    /// Cancels the blocked lock request named `token`: its callback runs with
    /// `EINTR`. Returns false if no such request is waiting (already granted).
    pub fn cancel_lock_wait(&self, ino: u64, token: u64) -> bool {
        let Ok(inode) = self.get(ino) else {
            return false;
        };
        let cb = inode
            .state
            .write()
            .locks
            .as_mut()
            .and_then(|t| t.cancel(token));
        match cb {
            Some(cb) => {
                cb(Err(Errno::EINTR));
                true
            }
            None => false,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn lock_common(
        &self,
        family: Family,
        ino: u64,
        owner: u64,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        wait: Option<(u64, LockCallback)>,
    ) -> Result<()> {
        let fail = |e: Errno, wait: Option<(u64, LockCallback)>| -> Result<()> {
            match wait {
                Some((_, cb)) => {
                    cb(Err(e));
                    Ok(())
                }
                None => Err(e),
            }
        };
        let (req, set) = match Self::lock_request(start, end, typ, owner, pid) {
            Ok(r) => r,
            Err(e) => return fail(e, wait),
        };
        let inode = match self.get(ino) {
            Ok(i) => i,
            Err(e) => return fail(e, wait),
        };
        let mut st = inode.state.write();
        let table = self.file_lock_table(&mut st);
        if set && let Some(blocker) = table.conflict(family, &req) {
            let Some((token, cb)) = wait else {
                return Err(Errno::EAGAIN);
            };
            // A waiter whose blocker waits (on this file) for the waiter is a deadlock.
            if family == Family::Posix && table.blockers_of(blocker.owner).contains(&owner) {
                drop(st);
                cb(Err(Errno::EDEADLK));
                return Ok(());
            }
            table.park(family, req, token, cb);
            return Ok(());
        }
        // Flock conversions drop the old lock first, as Linux does.
        let done = table.apply(family, req, set);
        if table.is_empty() {
            st.locks = None;
        }
        drop(st);
        Self::run_callbacks(done);
        if let Some((_, cb)) = wait {
            cb(Ok(()));
        }
        Ok(())
    }

    /// Drops every record lock (and pending wait) of `owner` on `ino`: a close by
    /// the owning process, or the end of an open file description.
    pub fn release_locks(&self, ino: u64, owner: u64) {
        self.release_family(ino, owner, Family::Posix);
    }

    /// Drops the flock lock of `owner` (an open file description) on `ino`.
    pub fn release_flock(&self, ino: u64, owner: u64) {
        self.release_family(ino, owner, Family::Flock);
    }

    fn release_family(&self, ino: u64, owner: u64, family: Family) {
        let Ok(inode) = self.get(ino) else { return };
        // Closes are frequent and locks rare: do not queue behind writers for nothing.
        if inode.state.read().locks.is_none() {
            return;
        }
        let mut st = inode.state.write();
        let Some(table) = st.locks.as_mut() else {
            return;
        };
        let done = table.release_owner(family, owner);
        if table.is_empty() {
            st.locks = None;
        }
        drop(st);
        Self::run_callbacks(done);
    }

    /// Takes every node's record and flock locks (held and waiting) out of
    /// this tree, for the tree that replaces it ([`Fs::adopt_locks`]): a
    /// server that swaps trees (a durable mount's online rollback) would
    /// otherwise lose the locks its processes hold, and leave their waiters
    /// parked in a tree nobody serves. O(nodes) once any lock was ever
    /// taken (the swap is O(nodes) anyway); nothing before.
    pub fn take_locks(&self) -> HeldLocks {
        let mut held = Vec::new();
        if !self.locked.load(Ordering::Acquire) {
            return HeldLocks(held);
        }
        for item in self.core.inodes.iter() {
            let node = item.value();
            // Not `write_state`: locks are not part of the tree a snapshot
            // keeps, so taking them is no change to preserve.
            if let Some(table) = node.state.write().locks.take() {
                held.push((node.ino, node.kind, table));
            }
        }
        HeldLocks(held)
    }

    /// Installs locks taken from the tree this one replaces, on the nodes
    /// with the same number and type. A node that is gone (the new tree
    /// does not have the file) takes its locks with it, and its waiters are
    /// answered ESTALE, as every request that names it is.
    pub fn adopt_locks(&self, held: HeldLocks) {
        let mut done = Vec::new();
        for (ino, kind, table) in held.0 {
            let node = self
                .get(ino)
                .ok()
                .filter(|n| n.kind == kind && !n.freed.load(Ordering::Acquire));
            let Some(node) = node else {
                done.extend(table.abandon(Errno::ESTALE));
                continue;
            };
            let mut st = node.state.write();
            match st.locks {
                None => {
                    self.locked.store(true, Ordering::Release);
                    st.locks = Some(table);
                }
                // A new tree starts without locks; if it has some, they were
                // taken since, and win.
                Some(_) => done.extend(table.abandon(Errno::ESTALE)),
            }
        }
        Self::run_callbacks(done);
    }
}

/// Locks taken out of one tree for another ([`Fs::take_locks`]). Dropped
/// unadopted, its waiters are answered EIO by their reply's own drop.
pub struct HeldLocks(Vec<(u64, FileType, Box<LockTable>)>);

impl HeldLocks {
    /// How many nodes had locks.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The source and target directories of a rename, locked; one guard when they are the same.
enum DirPair<'a, 'g> {
    Same(&'a mut RwLockWriteGuard<'g, State>),
    Two(
        &'a mut RwLockWriteGuard<'g, State>,
        &'a mut RwLockWriteGuard<'g, State>,
    ),
}

impl DirPair<'_, '_> {
    fn src(&mut self) -> &mut State {
        match self {
            DirPair::Same(s) => s,
            DirPair::Two(s, _) => s,
        }
    }

    fn dst(&mut self) -> &mut State {
        match self {
            DirPair::Same(s) => s,
            DirPair::Two(_, d) => d,
        }
    }

    /// The source directory's entries: a pair is made of directories only.
    fn src_dir(&mut self) -> &mut Dir {
        self.src().dir_mut().expect("dir")
    }

    fn dst_dir(&mut self) -> &mut Dir {
        self.dst().dir_mut().expect("dir")
    }
}

/// A directory entry's node and type.
type Entry = (u64, FileType);

/// The checks of a rename on the entries of its locked directories (the
/// names may have changed since the caller looked them up): the source's
/// entry and the target's, if any; `None` when there is nothing to do.
fn check_rename(
    pair: &mut DirPair<'_, '_>,
    parent: u64,
    name: &[u8],
    newparent: u64,
    newname: &[u8],
    flags: RenameFlags,
    chains: Option<(&[u64], &[u64])>,
) -> Result<Option<(Entry, Option<Entry>)>> {
    let cross = parent != newparent;
    let (sino, skind) = pair
        .src()
        .dir()
        .expect("dir")
        .get(name)
        .ok_or(Errno::ENOENT)?;
    let target = pair.dst().dir().expect("dir").get(newname);
    if let Some((src_chain, dst_chain)) = chains {
        // A directory cannot move into its own subtree (checked on the
        // locked entries: the names may have changed since the chains were taken).
        if skind == FileType::Directory && dst_chain.contains(&sino) {
            return Err(Errno::EINVAL);
        }
        if flags.exchange
            && let Some((dino, FileType::Directory)) = target
            && src_chain.contains(&dino)
        {
            return Err(Errno::EINVAL);
        }
    }
    if pair.dst().meta.nlink == 0 {
        return Err(Errno::ENOENT);
    }
    if target.is_none() && flags.exchange {
        return Err(Errno::ENOENT);
    }
    if let Some((dino, _)) = target {
        if flags.noreplace {
            return Err(Errno::EEXIST);
        }
        if dino == sino {
            // Two names of one node: POSIX says do nothing.
            return Ok(None);
        }
    }
    let sdir = skind == FileType::Directory;
    if !flags.exchange
        && let Some(replaced) = target
    {
        check_replace(sdir, replaced, parent, chains)?;
    }
    if !flags.exchange && target.is_none() && sdir && cross && pair.dst().meta.nlink >= LINK_MAX {
        return Err(Errno::EMLINK);
    }
    Ok(Some(((sino, skind), target)))
}

/// What a rename that replaces entry `(dino, dkind)` with a node that is a
/// directory or not (`sdir`) requires of it.
fn check_replace(
    sdir: bool,
    (dino, dkind): Entry,
    parent: u64,
    chains: Option<(&[u64], &[u64])>,
) -> Result<()> {
    let ddir = dkind == FileType::Directory;
    if sdir && !ddir {
        return Err(Errno::ENOTDIR);
    }
    if !sdir && ddir {
        return Err(Errno::EISDIR);
    }
    // A target that is an ancestor of the source's directory is not
    // empty (Linux's rename trap). Decided here, before the child
    // locks: locking an ancestor of a held directory breaks the lock order.
    let ancestor = match chains {
        Some((src_chain, _)) => src_chain.contains(&dino),
        None => dino == parent,
    };
    if ddir && ancestor {
        return Err(Errno::ENOTEMPTY);
    }
    Ok(())
}

/// The inode flags of a rename's nodes (both directories, the node moved
/// and the one replaced or exchanged, `os`) must allow it.
fn check_rename_flags(pair: &mut DirPair<'_, '_>, ms: &State, os: Option<&State>) -> Result<()> {
    pair.src().meta.check_modify()?;
    match os {
        Some(o) => {
            pair.dst().meta.check_modify()?;
            o.meta.check_modify()?;
        }
        None => pair.dst().meta.check_add_entry()?,
    }
    ms.meta.check_modify()
}

/// An exchange between two directories: a directory exchanged points its
/// `..` at its new parent, and one exchanged with a non-directory takes a
/// link from its old parent to its new one. `sdir`, `odir`: whether the
/// moved node and the other are directories.
fn exchange_across(
    pair: &mut DirPair<'_, '_>,
    ms: &mut State,
    os: &mut State,
    parent: u64,
    newparent: u64,
    sdir: bool,
    odir: bool,
) {
    if let Some(d) = ms.dir_mut() {
        d.parent = newparent;
    }
    if let Some(d) = os.dir_mut() {
        d.parent = parent;
    }
    match (sdir, odir) {
        (true, false) => {
            pair.src().meta.drop_link();
            pair.dst().meta.nlink += 1;
        }
        (false, true) => {
            pair.src().meta.nlink += 1;
            pair.dst().meta.drop_link();
        }
        _ => {}
    }
}

/// The node a rename replaces loses the name (`os`: its locked state; `dst`:
/// the target directory's). A directory must be empty; it loses its links
/// and the target directory its `..`.
fn unlink_replaced(dst: &mut State, os: &mut State, sdir: bool, now: Timespec) -> Result<()> {
    if os.dir().is_some_and(|d| !d.is_empty()) {
        return Err(Errno::ENOTEMPTY);
    }
    if sdir {
        os.meta.nlink = 0;
        dst.meta.drop_link();
    } else {
        os.meta.drop_link();
    }
    os.meta.ctime = now;
    Ok(())
}

/// A write's bytes: one slice, or pages the file may take as they are
/// ([`Fs::write_pages_as`]).
enum WriteSrc<'a> {
    Bytes(&'a [u8]),
    Pages {
        len: usize,
        pages: &'a mut [Option<Box<[u8; PAGE_SIZE]>>],
    },
}

impl WriteSrc<'_> {
    fn len(&self) -> usize {
        match self {
            WriteSrc::Bytes(d) => d.len(),
            WriteSrc::Pages { len, .. } => *len,
        }
    }
}
