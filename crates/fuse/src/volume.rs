//! A memfs volume on a Redis Cluster (crates/cluster) served through the
//! same adapter as the local engine: [`Tree`] for [`memfs_cluster::Volume`].
//!
//! Every method is the volume's inherent method of the same name (as for
//! `Fs` in tree.rs; `open` is the volume's `open_file`, its `open` opening
//! the volume). What makes it a shared tree ([`Tree::SHARED`]): its
//! closes commit the file's writes ([`Volume::flush`], close-to-open), and
//! the volume's feed of the other mounts' changes ([`Volume::on_change`])
//! reaches the kernel as invalidations through the adapter's notification
//! thread (notify.rs).

use memfs_cluster::Volume;
use memfs_fs::{
    AtimeMode, Attr, Ctx, DirEntry, FallocateMode, LockCallback, LockInfo, PAGE_SIZE, RenameFlags,
    Result, SetAttr, StatFs, XattrMode,
};

use crate::tree::{Change, Tree};

/// The volume's change, in the adapter's words.
fn change(c: memfs_cluster::Change) -> Change {
    match c {
        memfs_cluster::Change::Inode(ino) => Change::Inode(ino),
        memfs_cluster::Change::Entry { parent, name } => Change::Entry { parent, name },
        memfs_cluster::Change::All => Change::All,
    }
}

impl Tree for Volume {
    const SHARED: bool = true;
    #[inline]
    fn flush(&self, ino: u64) -> Result<()> {
        Volume::flush(self, ino)
    }
    fn watch(&self, tell: Box<dyn Fn(Change) + Send + Sync>) {
        self.on_change(Box::new(move |c| tell(change(c))));
    }
    #[inline]
    fn settle(&self) -> Result<()> {
        Volume::settle(self)
    }
    #[inline]
    fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        Volume::lookup(self, parent, name)
    }
    #[inline]
    fn forget(&self, ino: u64, n: u64) {
        Volume::forget(self, ino, n)
    }
    #[inline]
    fn getattr(&self, ino: u64) -> Result<Attr> {
        Volume::getattr(self, ino)
    }
    #[inline]
    fn getattr_flags(&self, ino: u64) -> Result<(Attr, u32)> {
        Volume::getattr_flags(self, ino)
    }
    #[inline]
    fn setattr_as(
        &self,
        ctx: Ctx,
        in_group: &dyn Fn(u32) -> bool,
        ino: u64,
        set: &SetAttr,
    ) -> Result<Attr> {
        Volume::setattr_as(self, ctx, in_group, ino, set)
    }
    #[inline]
    fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        Volume::readlink(self, ino)
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
        Volume::mknod_umask(self, ctx, parent, name, mode, rdev, umask)
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
        Volume::mkdir_umask(self, ctx, parent, name, mode, umask)
    }
    #[inline]
    fn symlink(&self, ctx: Ctx, parent: u64, name: &[u8], target: &[u8]) -> Result<Attr> {
        Volume::symlink(self, ctx, parent, name, target)
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
        Volume::create_umask(self, ctx, parent, name, mode, excl, umask)
    }
    #[inline]
    fn tmpfile_umask(&self, ctx: Ctx, dir: u64, mode: u32, umask: u32, excl: bool) -> Result<Attr> {
        Volume::tmpfile_umask(self, ctx, dir, mode, umask, excl)
    }
    #[inline]
    fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr> {
        Volume::link(self, ino, newparent, newname)
    }
    #[inline]
    fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        Volume::unlink(self, parent, name)
    }
    #[inline]
    fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        Volume::rmdir(self, parent, name)
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
        Volume::rename(self, parent, name, newparent, newname, flags)
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
        Volume::rename_whiteout(self, ctx, parent, name, newparent, newname, flags)
    }
    #[inline]
    fn open(&self, ino: u64, flags: i32) -> Result<bool> {
        Volume::open_file(self, ino, flags)
    }
    #[inline]
    fn release(&self, ino: u64) {
        Volume::release(self, ino)
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
        Volume::read_with(self, ino, off, len, mode, f)
    }
    #[inline]
    fn read_atime(&self, ino: u64, off: u64, buf: &mut [u8], mode: AtimeMode) -> Result<usize> {
        Volume::read_atime(self, ino, off, buf, mode)
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
        Volume::write_as(self, ctx, in_group, kill_suidgid, ino, off, data, append)
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
        Volume::write_pages_as(
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
        Volume::fsync(self, ino)
    }
    #[inline]
    fn lseek(&self, ino: u64, off: u64, whence: i32) -> Result<u64> {
        Volume::lseek(self, ino, off, whence)
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
        Volume::fallocate_as(self, ctx, in_group, kill_suidgid, ino, off, len, mode)
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
        Volume::copy_file_range_as(self, ctx, in_group, ino_in, off_in, ino_out, off_out, len)
    }
    #[inline]
    fn readdir(&self, ino: u64, offset: u64, f: impl FnMut(DirEntry<'_>) -> bool) -> Result<()> {
        Volume::readdir(self, ino, offset, f)
    }
    #[inline]
    fn readdirplus(
        &self,
        ino: u64,
        offset: u64,
        f: impl FnMut(DirEntry<'_>, &Attr) -> bool,
    ) -> Result<()> {
        Volume::readdirplus(self, ino, offset, f)
    }
    #[inline]
    fn statfs(&self) -> StatFs {
        Volume::statfs(self)
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
        Volume::setxattr_as(self, ctx, in_group, ino, name, value, mode)
    }
    #[inline]
    fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        Volume::getxattr(self, ino, name)
    }
    #[inline]
    fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        Volume::listxattr(self, ino)
    }
    #[inline]
    fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        Volume::removexattr(self, ino, name)
    }
    #[inline]
    fn get_flags(&self, ino: u64) -> Result<u32> {
        Volume::get_flags(self, ino)
    }
    #[inline]
    fn set_flags(&self, ctx: Ctx, ino: u64, flags: u32) -> Result<Attr> {
        Volume::set_flags(self, ctx, ino, flags)
    }
    #[inline]
    fn keeps_locks(&self) -> bool {
        Volume::keeps_locks(self)
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
        Volume::getlk(self, ino, owner, start, end, typ, pid)
    }
    #[inline]
    fn setlk(&self, ino: u64, owner: u64, start: u64, end: u64, typ: i32, pid: u32) -> Result<()> {
        Volume::setlk(self, ino, owner, start, end, typ, pid)
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
        Volume::setlkw(self, ino, owner, start, end, typ, pid, token, done)
    }
    #[inline]
    fn cancel_lock_wait(&self, ino: u64, token: u64) -> bool {
        Volume::cancel_lock_wait(self, ino, token)
    }
    #[inline]
    fn release_locks(&self, ino: u64, owner: u64) {
        Volume::release_locks(self, ino, owner)
    }
}
