//! The seam between the adapter and the tree it serves (docs/architecture.md,
//! "The adapter's seam").
//!
//! [`MemFuse`](crate::MemFuse) is generic over a [`Tree`]: every FUSE
//! handler reaches the served tree through this trait, with the engine's own
//! vocabulary (`Attr`, `Ctx`, `Errno`, ...), so another tree (a memfs volume
//! kept in a Redis Cluster) plugs into the same adapter. The adapter is
//! monomorphised for each tree: for the local engine, `Fs`, every method
//! below is an `#[inline]` delegation to the inherent method of the same
//! name, and the handlers compile to the calls they made before the seam. No
//! `dyn`: the trait is not object safe on purpose (its listing and read
//! methods take closures by value, as the engine's do).
//!
//! What only the local engine has (copy-on-write snapshots and
//! `.snapshots`, online rollback and swap, kernel passthrough backing files)
//! is reached through [`Tree::local`], which answers `Some(self)` for `Fs`
//! (a constant once inlined: the branches cost nothing) and `None` for any
//! other tree (they fold away). Those features keep their `Fs`-typed code
//! instead of growing trait methods that a second tree could only refuse.
//! Record locks are POSIX and a cluster volume needs them (they must hold
//! across machines), so they are trait methods, with defaults for a tree
//! that keeps none (`--locks kernel` then: the kernel keeps them).

use memfs_fs::{
    AtimeMode, Attr, Ctx, DirEntry, Errno, FallocateMode, Fs, LockCallback, LockInfo, PAGE_SIZE,
    RenameFlags, Result, SetAttr, StatFs, XattrMode,
};

/// What another mount changed in a [`Tree::SHARED`] tree, for the kernel
/// to forget ([`Tree::watch`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A node's attributes or data: its cached attributes and pages go.
    Inode(u64),
    /// A name in a directory (created, removed, renamed): its dentry goes.
    Entry { parent: u64, name: Vec<u8> },
    /// Anything may have changed (the tree lost track of the others'
    /// changes): every name the kernel holds is looked up again at its
    /// next use (FUSE_NOTIFY_INC_EPOCH), and no open keeps pages until the
    /// tree checked the file afresh ([`Tree::open`]). The tree names its
    /// open files with [`Change::Inode`] first: their attributes are
    /// reached through no name.
    All,
}

/// What the adapter needs of the tree it serves. Node ids are the tree's
/// inode numbers, at most `snapdir::INO_MASK` (the ids above name the nodes
/// of `.snapshots`); `memfs_fs::ROOT_INO` is the root. Methods mean what the
/// `Fs` methods of the same name mean (crates/fs/src/fs.rs), errors included.
pub trait Tree: Send + Sync + 'static {
    /// The local engine, for what only it has (snapshots, `.snapshots`,
    /// online rollback and swap, passthrough backing files); `None` for
    /// any other tree, whose mount then has none of those.
    #[inline]
    fn local(&self) -> Option<&Fs> {
        None
    }

    /// Whether other mounts change this tree behind this kernel's back (a
    /// volume on a Redis Cluster): the adapter then answers OPEN and FLUSH
    /// (close-to-open: [`Tree::flush`]), lets an open keep the page cache
    /// (FOPEN_KEEP_CACHE) only when [`Tree::open`] says that no other mount
    /// wrote the file since its pages were read,
    /// keeps flock locks in the tree too (FUSE_FLOCK_LOCKS), and hands the
    /// tree a way to tell the kernel what changed ([`Tree::watch`]).
    /// `false` for the local engine: every change passes through this
    /// kernel. A constant: the adapter's branches on it fold away.
    const SHARED: bool = false;

    /// Whether the tree keeps POSIX ACLs (`system.posix_acl_*` xattrs): the
    /// adapter then has the kernel enforce them (FUSE_POSIX_ACL) and send
    /// the umask unapplied (FUSE_DONT_MASK). A tree that keeps none answers
    /// those names EOPNOTSUPP, and the kernel, told nothing, applies the
    /// umask and the mode bits alone; told FUSE_POSIX_ACL, it would fail
    /// chmod and permission checks on the EOPNOTSUPP. `true` for `Fs`.
    const POSIX_ACLS: bool = false;

    /// close(2) of a file (FUSE FLUSH, sent only for a [`Tree::SHARED`]
    /// tree): what this mount wrote to `ino` is the tree's for every other
    /// mount when it returns.
    #[inline]
    fn flush(&self, _ino: u64) -> Result<()> {
        Ok(())
    }

    /// Hands a [`Tree::SHARED`] tree the function that makes the kernel
    /// forget what another mount changed. `tell` never blocks: it queues
    /// the invalidation for the adapter's notification thread
    /// (notify.rs), so the tree may call it from any thread of its own.
    #[inline]
    fn watch(&self, _tell: Box<dyn Fn(Change) + Send + Sync>) {}

    /// Waits until what the calling request changed is as durable as the
    /// tree promises; called after each change, with no lock of the tree held.
    fn settle(&self) -> Result<()>;

    fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr>;
    /// The kernel dropped `n` of its references to `ino` (from lookups and creates).
    fn forget(&self, ino: u64, n: u64);
    fn getattr(&self, ino: u64) -> Result<Attr>;
    /// `getattr` with the inode flags (`FS_*_FL`) statx shows.
    #[inline]
    fn getattr_flags(&self, ino: u64) -> Result<(Attr, u32)> {
        self.getattr(ino).map(|a| (a, 0))
    }
    fn setattr_as(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        ino: u64,
        set: &SetAttr,
    ) -> Result<Attr>;
    fn readlink(&self, ino: u64) -> Result<Vec<u8>>;

    fn mknod_umask(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u32,
        umask: u32,
    ) -> Result<Attr>;
    fn mkdir_umask(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Attr>;
    fn symlink(&self, ctx: Ctx, parent: u64, name: &[u8], target: &[u8]) -> Result<Attr>;
    /// Returns the node and whether it was created (not opened).
    fn create_umask(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        excl: bool,
        umask: u32,
    ) -> Result<(Attr, bool)>;
    /// `open(dir, O_TMPFILE)`.
    #[inline]
    fn tmpfile_umask(
        &self,
        _ctx: Ctx,
        _dir: u64,
        _mode: u32,
        _umask: u32,
        _excl: bool,
    ) -> Result<Attr> {
        Err(Errno::EOPNOTSUPP)
    }
    fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr>;
    fn unlink(&self, parent: u64, name: &[u8]) -> Result<()>;
    fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()>;
    fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
    ) -> Result<()>;
    /// `RENAME_WHITEOUT` (overlayfs): leaves a whiteout device at the old name.
    #[inline]
    fn rename_whiteout(
        &self,
        _ctx: Ctx,
        _parent: u64,
        _name: &[u8],
        _newparent: u64,
        _newname: &[u8],
        _flags: RenameFlags,
    ) -> Result<()> {
        Err(Errno::EINVAL)
    }

    /// An open the kernel sends (not every open: see `MemFuse::declines_open`).
    /// Returns whether the pages of `ino` that this kernel may hold (read
    /// or written on this mount) are still the file's: the adapter then
    /// lets the open keep them (FOPEN_KEEP_CACHE). Always `true` for the
    /// local engine, whose every change passes through this kernel (and
    /// the adapter does not look at it for a tree that is not
    /// [`Tree::SHARED`]); for a shared tree, `true` only when the open
    /// found that no other mount changed the file since (docs/cluster.md,
    /// "Many mounts, one truth").
    fn open(&self, ino: u64, flags: i32) -> Result<bool>;
    /// The end of an open that `open` saw.
    fn release(&self, ino: u64);
    /// Hands `f` the bytes of `[off, off + len)` (fewer at the end of the
    /// file) as a gather list, and returns what `f` returns.
    fn read_with<R>(
        &self,
        ino: u64,
        off: u64,
        len: usize,
        mode: AtimeMode,
        f: impl FnOnce(&[&[u8]]) -> R,
    ) -> Result<R>;
    fn read_atime(&self, ino: u64, off: u64, buf: &mut [u8], mode: AtimeMode) -> Result<usize>;
    #[allow(clippy::too_many_arguments)]
    fn write_as(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        kill_suidgid: bool,
        ino: u64,
        off: u64,
        data: &[u8],
        append: bool,
    ) -> Result<usize>;
    /// A write of `len` bytes held in `pages` (the first at `off`'s page
    /// offset), which the tree may take.
    #[allow(clippy::too_many_arguments)]
    fn write_pages_as(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        kill_suidgid: bool,
        ino: u64,
        off: u64,
        len: usize,
        pages: &mut [Option<Box<[u8; PAGE_SIZE]>>],
        append: bool,
    ) -> Result<usize>;
    fn fsync(&self, ino: u64) -> Result<()>;
    fn lseek(&self, ino: u64, off: u64, whence: i32) -> Result<u64>;
    #[allow(clippy::too_many_arguments)]
    fn fallocate_as(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        kill_suidgid: bool,
        ino: u64,
        off: u64,
        len: u64,
        mode: FallocateMode,
    ) -> Result<()>;
    #[allow(clippy::too_many_arguments)]
    fn copy_file_range_as(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        ino_in: u64,
        off_in: u64,
        ino_out: u64,
        off_out: u64,
        len: u64,
    ) -> Result<u64>;

    /// The entries of directory `ino` after `offset`, while `f` returns true.
    fn readdir(&self, ino: u64, offset: u64, f: impl FnMut(DirEntry<'_>) -> bool) -> Result<()>;
    fn readdirplus(
        &self,
        ino: u64,
        offset: u64,
        f: impl FnMut(DirEntry<'_>, &Attr) -> bool,
    ) -> Result<()>;
    fn statfs(&self) -> StatFs;

    fn setxattr_as(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        ino: u64,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
    ) -> Result<()>;
    fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>>;
    fn listxattr(&self, ino: u64) -> Result<Vec<u8>>;
    fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()>;

    /// Inode flags (`chattr`): none by default.
    #[inline]
    fn get_flags(&self, _ino: u64) -> Result<u32> {
        Err(Errno(libc::ENOTTY))
    }
    #[inline]
    fn set_flags(&self, _ctx: Ctx, _ino: u64, _flags: u32) -> Result<Attr> {
        Err(Errno(libc::ENOTTY))
    }

    /// POSIX record locks (`--locks engine`); a tree that keeps none
    /// answers ENOLCK, and is mounted with the kernel keeping them.
    #[inline]
    fn keeps_locks(&self) -> bool {
        false
    }
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn getlk(
        &self,
        _ino: u64,
        _owner: u64,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
    ) -> Result<LockInfo> {
        Err(Errno(libc::ENOLCK))
    }
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn setlk(
        &self,
        _ino: u64,
        _owner: u64,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
    ) -> Result<()> {
        Err(Errno(libc::ENOLCK))
    }
    /// A blocking lock: `done` is called once, from whichever thread grants
    /// it (or cancels it: [`Tree::cancel_lock_wait`] with `token`).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn setlkw(
        &self,
        _ino: u64,
        _owner: u64,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
        _token: u64,
        done: LockCallback,
    ) {
        done(Err(Errno(libc::ENOLCK)))
    }
    #[inline]
    fn cancel_lock_wait(&self, _ino: u64, _token: u64) -> bool {
        false
    }
    #[inline]
    fn release_locks(&self, _ino: u64, _owner: u64) {}
}

/// The local engine: every method is the inherent one.
impl Tree for Fs {
    const POSIX_ACLS: bool = true;

    #[inline]
    fn local(&self) -> Option<&Fs> {
        Some(self)
    }
    #[inline]
    fn settle(&self) -> Result<()> {
        Fs::settle(self)
    }
    #[inline]
    fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        Fs::lookup(self, parent, name)
    }
    #[inline]
    fn forget(&self, ino: u64, n: u64) {
        Fs::forget(self, ino, n)
    }
    #[inline]
    fn getattr(&self, ino: u64) -> Result<Attr> {
        Fs::getattr(self, ino)
    }
    #[inline]
    fn getattr_flags(&self, ino: u64) -> Result<(Attr, u32)> {
        Fs::getattr_flags(self, ino)
    }
    #[inline]
    fn setattr_as(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        ino: u64,
        set: &SetAttr,
    ) -> Result<Attr> {
        Fs::setattr_as(self, ctx, in_group, ino, set)
    }
    #[inline]
    fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        Fs::readlink(self, ino)
    }
    #[inline]
    fn mknod_umask(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u32,
        umask: u32,
    ) -> Result<Attr> {
        Fs::mknod_umask(self, ctx, parent, name, mode, rdev, umask)
    }
    #[inline]
    fn mkdir_umask(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Attr> {
        Fs::mkdir_umask(self, ctx, parent, name, mode, umask)
    }
    #[inline]
    fn symlink(&self, ctx: Ctx, parent: u64, name: &[u8], target: &[u8]) -> Result<Attr> {
        Fs::symlink(self, ctx, parent, name, target)
    }
    #[inline]
    fn create_umask(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        excl: bool,
        umask: u32,
    ) -> Result<(Attr, bool)> {
        Fs::create_umask(self, ctx, parent, name, mode, excl, umask)
    }
    #[inline]
    fn tmpfile_umask(&self, ctx: Ctx, dir: u64, mode: u32, umask: u32, excl: bool) -> Result<Attr> {
        Fs::tmpfile_umask(self, ctx, dir, mode, umask, excl)
    }
    #[inline]
    fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr> {
        Fs::link(self, ino, newparent, newname)
    }
    #[inline]
    fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        Fs::unlink(self, parent, name)
    }
    #[inline]
    fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        Fs::rmdir(self, parent, name)
    }
    #[inline]
    fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        Fs::rename(self, parent, name, newparent, newname, flags)
    }
    #[inline]
    fn rename_whiteout(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        Fs::rename_whiteout(self, ctx, parent, name, newparent, newname, flags)
    }
    #[inline]
    fn open(&self, ino: u64, flags: i32) -> Result<bool> {
        Fs::open(self, ino, flags).map(|()| true)
    }
    #[inline]
    fn release(&self, ino: u64) {
        Fs::release(self, ino)
    }
    #[inline]
    fn read_with<R>(
        &self,
        ino: u64,
        off: u64,
        len: usize,
        mode: AtimeMode,
        f: impl FnOnce(&[&[u8]]) -> R,
    ) -> Result<R> {
        Fs::read_with(self, ino, off, len, mode, f)
    }
    #[inline]
    fn read_atime(&self, ino: u64, off: u64, buf: &mut [u8], mode: AtimeMode) -> Result<usize> {
        Fs::read_atime(self, ino, off, buf, mode)
    }
    #[inline]
    fn write_as(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        kill_suidgid: bool,
        ino: u64,
        off: u64,
        data: &[u8],
        append: bool,
    ) -> Result<usize> {
        Fs::write_as(self, ctx, in_group, kill_suidgid, ino, off, data, append)
    }
    #[inline]
    fn write_pages_as(
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
        Fs::write_pages_as(
            self,
            ctx,
            in_group,
            kill_suidgid,
            ino,
            off,
            len,
            pages,
            append,
        )
    }
    #[inline]
    fn fsync(&self, ino: u64) -> Result<()> {
        Fs::fsync(self, ino)
    }
    #[inline]
    fn lseek(&self, ino: u64, off: u64, whence: i32) -> Result<u64> {
        Fs::lseek(self, ino, off, whence)
    }
    #[inline]
    fn fallocate_as(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        kill_suidgid: bool,
        ino: u64,
        off: u64,
        len: u64,
        mode: FallocateMode,
    ) -> Result<()> {
        Fs::fallocate_as(self, ctx, in_group, kill_suidgid, ino, off, len, mode)
    }
    #[inline]
    fn copy_file_range_as(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        ino_in: u64,
        off_in: u64,
        ino_out: u64,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        Fs::copy_file_range_as(self, ctx, in_group, ino_in, off_in, ino_out, off_out, len)
    }
    #[inline]
    fn readdir(&self, ino: u64, offset: u64, f: impl FnMut(DirEntry<'_>) -> bool) -> Result<()> {
        Fs::readdir(self, ino, offset, f)
    }
    #[inline]
    fn readdirplus(
        &self,
        ino: u64,
        offset: u64,
        f: impl FnMut(DirEntry<'_>, &Attr) -> bool,
    ) -> Result<()> {
        Fs::readdirplus(self, ino, offset, f)
    }
    #[inline]
    fn statfs(&self) -> StatFs {
        Fs::statfs(self)
    }
    #[inline]
    fn setxattr_as(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        ino: u64,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
    ) -> Result<()> {
        Fs::setxattr_as(self, ctx, in_group, ino, name, value, mode)
    }
    #[inline]
    fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        Fs::getxattr(self, ino, name)
    }
    #[inline]
    fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        Fs::listxattr(self, ino)
    }
    #[inline]
    fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        Fs::removexattr(self, ino, name)
    }
    #[inline]
    fn get_flags(&self, ino: u64) -> Result<u32> {
        Fs::get_flags(self, ino)
    }
    #[inline]
    fn set_flags(&self, ctx: Ctx, ino: u64, flags: u32) -> Result<Attr> {
        Fs::set_flags(self, ctx, ino, flags)
    }
    #[inline]
    fn keeps_locks(&self) -> bool {
        true
    }
    #[inline]
    fn getlk(
        &self,
        ino: u64,
        owner: u64,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
    ) -> Result<LockInfo> {
        Fs::getlk(self, ino, owner, start, end, typ, pid)
    }
    #[inline]
    fn setlk(&self, ino: u64, owner: u64, start: u64, end: u64, typ: i32, pid: u32) -> Result<()> {
        Fs::setlk(self, ino, owner, start, end, typ, pid)
    }
    #[inline]
    fn setlkw(
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
        Fs::setlkw(self, ino, owner, start, end, typ, pid, token, done)
    }
    #[inline]
    fn cancel_lock_wait(&self, ino: u64, token: u64) -> bool {
        Fs::cancel_lock_wait(self, ino, token)
    }
    #[inline]
    fn release_locks(&self, ino: u64, owner: u64) {
        Fs::release_locks(self, ino, owner)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use memfs_fs::{
        AtimeMode, Attr, Config, Ctx, DirEntry, Errno, FallocateMode, Fs, PAGE_SIZE, ROOT_INO,
        RenameFlags, Result, SetAttr, StatFs, XattrMode,
    };

    use super::Tree;
    use crate::{MountOptions, Mounted};

    /// A second kind of tree: what a cluster volume must provide, no more
    /// (here answered by an engine that it does not show as `local`).
    struct Plain(Fs);

    impl Tree for Plain {
        fn settle(&self) -> Result<()> {
            self.0.settle()
        }
        fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
            self.0.lookup(parent, name)
        }
        fn forget(&self, ino: u64, n: u64) {
            self.0.forget(ino, n)
        }
        fn getattr(&self, ino: u64) -> Result<Attr> {
            self.0.getattr(ino)
        }
        fn setattr_as(
            &self,
            ctx: Ctx,
            in_group: &dyn Fn(u32) -> bool,
            ino: u64,
            set: &SetAttr,
        ) -> Result<Attr> {
            self.0.setattr_as(ctx, in_group, ino, set)
        }
        fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
            self.0.readlink(ino)
        }
        fn mknod_umask(
            &self,
            ctx: Ctx,
            parent: u64,
            name: &[u8],
            mode: u32,
            rdev: u32,
            umask: u32,
        ) -> Result<Attr> {
            self.0.mknod_umask(ctx, parent, name, mode, rdev, umask)
        }
        fn mkdir_umask(
            &self,
            ctx: Ctx,
            parent: u64,
            name: &[u8],
            mode: u32,
            umask: u32,
        ) -> Result<Attr> {
            self.0.mkdir_umask(ctx, parent, name, mode, umask)
        }
        fn symlink(&self, ctx: Ctx, parent: u64, name: &[u8], target: &[u8]) -> Result<Attr> {
            self.0.symlink(ctx, parent, name, target)
        }
        fn create_umask(
            &self,
            ctx: Ctx,
            parent: u64,
            name: &[u8],
            mode: u32,
            excl: bool,
            umask: u32,
        ) -> Result<(Attr, bool)> {
            self.0.create_umask(ctx, parent, name, mode, excl, umask)
        }
        fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr> {
            self.0.link(ino, newparent, newname)
        }
        fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
            self.0.unlink(parent, name)
        }
        fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
            self.0.rmdir(parent, name)
        }
        fn rename(
            &self,
            parent: u64,
            name: &[u8],
            newparent: u64,
            newname: &[u8],
            flags: RenameFlags,
        ) -> Result<()> {
            self.0.rename(parent, name, newparent, newname, flags)
        }
        fn open(&self, ino: u64, flags: i32) -> Result<bool> {
            self.0.open(ino, flags).map(|()| true)
        }
        fn release(&self, ino: u64) {
            self.0.release(ino)
        }
        fn read_with<R>(
            &self,
            ino: u64,
            off: u64,
            len: usize,
            mode: AtimeMode,
            f: impl FnOnce(&[&[u8]]) -> R,
        ) -> Result<R> {
            self.0.read_with(ino, off, len, mode, f)
        }
        fn read_atime(&self, ino: u64, off: u64, buf: &mut [u8], mode: AtimeMode) -> Result<usize> {
            self.0.read_atime(ino, off, buf, mode)
        }
        fn write_as(
            &self,
            ctx: Ctx,
            in_group: &dyn Fn(u32) -> bool,
            kill_suidgid: bool,
            ino: u64,
            off: u64,
            data: &[u8],
            append: bool,
        ) -> Result<usize> {
            self.0
                .write_as(ctx, in_group, kill_suidgid, ino, off, data, append)
        }
        fn write_pages_as(
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
            self.0
                .write_pages_as(ctx, in_group, kill_suidgid, ino, off, len, pages, append)
        }
        fn fsync(&self, ino: u64) -> Result<()> {
            self.0.fsync(ino)
        }
        fn lseek(&self, ino: u64, off: u64, whence: i32) -> Result<u64> {
            self.0.lseek(ino, off, whence)
        }
        fn fallocate_as(
            &self,
            ctx: Ctx,
            in_group: &dyn Fn(u32) -> bool,
            kill_suidgid: bool,
            ino: u64,
            off: u64,
            len: u64,
            mode: FallocateMode,
        ) -> Result<()> {
            self.0
                .fallocate_as(ctx, in_group, kill_suidgid, ino, off, len, mode)
        }
        fn copy_file_range_as(
            &self,
            ctx: Ctx,
            in_group: &dyn Fn(u32) -> bool,
            ino_in: u64,
            off_in: u64,
            ino_out: u64,
            off_out: u64,
            len: u64,
        ) -> Result<u64> {
            self.0
                .copy_file_range_as(ctx, in_group, ino_in, off_in, ino_out, off_out, len)
        }
        fn readdir(
            &self,
            ino: u64,
            offset: u64,
            f: impl FnMut(DirEntry<'_>) -> bool,
        ) -> Result<()> {
            self.0.readdir(ino, offset, f)
        }
        fn readdirplus(
            &self,
            ino: u64,
            offset: u64,
            f: impl FnMut(DirEntry<'_>, &Attr) -> bool,
        ) -> Result<()> {
            self.0.readdirplus(ino, offset, f)
        }
        fn statfs(&self) -> StatFs {
            self.0.statfs()
        }
        fn setxattr_as(
            &self,
            ctx: Ctx,
            in_group: &dyn Fn(u32) -> bool,
            ino: u64,
            name: &[u8],
            value: &[u8],
            mode: XattrMode,
        ) -> Result<()> {
            self.0.setxattr_as(ctx, in_group, ino, name, value, mode)
        }
        fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
            self.0.getxattr(ino, name)
        }
        fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
            self.0.listxattr(ino)
        }
        fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
            self.0.removexattr(ino, name)
        }
    }

    #[test]
    fn a_second_tree_plugs_into_the_same_adapter() {
        // The whole adapter, monomorphised for another tree.
        let _mount: fn(Arc<Plain>, &Path, &MountOptions) -> std::io::Result<Mounted<Plain>> =
            crate::mount_tree::<Plain>;
        let t = Plain(Fs::new(Config::default()));
        assert!(t.local().is_none());
        assert!(!t.keeps_locks());
        assert_eq!(t.get_flags(ROOT_INO), Err(Errno(libc::ENOTTY)));
        assert_eq!(
            t.getlk(ROOT_INO, 1, 0, 0, libc::F_WRLCK, 1).map(|_| ()),
            Err(Errno(libc::ENOLCK))
        );
        let a = t
            .mkdir_umask(Ctx::ROOT, ROOT_INO, b"d", 0o755, 0o022)
            .expect("mkdir");
        assert_eq!(
            t.getattr_flags(a.ino).map(|(b, f)| (b.ino, f)),
            Ok((a.ino, 0))
        );
    }

    #[test]
    fn the_local_engine_is_local() {
        let fs = Fs::new(Config::default());
        assert!(fs.local().is_some_and(|l| std::ptr::eq(l, &fs)));
        assert!(fs.keeps_locks());
    }
}
