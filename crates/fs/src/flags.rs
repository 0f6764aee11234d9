//! Inode flags (`FS_IOC_GETFLAGS`/`FS_IOC_SETFLAGS`, `chattr`/`lsattr`).
//!
//! memfs keeps the flags tmpfs keeps (mm/shmem.c, `SHMEM_FL_USER_MODIFIABLE`
//! without casefold): append-only, immutable, nodump and noatime. They are
//! enforced here, in the engine, and not by the kernel: the VFS checks
//! `IS_IMMUTABLE`/`IS_APPEND` on `inode->i_flags`, which FUSE never sets, so
//! without these checks a FUSE mount, the shell and a durable mount would
//! all ignore them. The errors follow the VFS (`notify_change`,
//! `may_delete`, `vfs_link`, `xattr_permission`, `vfs_fallocate`, `may_open`),
//! which returns EPERM for every refusal, to root too.

use crate::fs::Fs;
use crate::inode::{Inode, Meta};
use crate::mutation::{META_RECORD, Mutation};
use crate::types::{Attr, Ctx, FileType, SetAttr, SetTime, Timespec};
use crate::{Errno, Result};

/// `FS_IMMUTABLE_FL`: no change at all, by anyone.
pub const FS_IMMUTABLE_FL: u32 = 0x0000_0010;
/// `FS_APPEND_FL`: data may only be added at the end; the node cannot be
/// removed, renamed, linked or have its attributes changed.
pub const FS_APPEND_FL: u32 = 0x0000_0020;
/// `FS_NODUMP_FL`: stored for dump(8); memfs gives it no meaning.
pub const FS_NODUMP_FL: u32 = 0x0000_0040;
/// `FS_NOATIME_FL`: reads leave the access time alone.
pub const FS_NOATIME_FL: u32 = 0x0000_0080;

/// Every flag memfs stores. Setting any other bit is `EOPNOTSUPP`, as on
/// tmpfs (`shmem_fileattr_set`).
pub const FS_FL_SUPPORTED: u32 = FS_IMMUTABLE_FL | FS_APPEND_FL | FS_NODUMP_FL | FS_NOATIME_FL;

/// The `fsx_xflags` of `struct fsxattr` (FS_IOC_FSGETXATTR) for the same
/// four flags, as the VFS translates them (`fileattr_fill_flags`).
const XFLAGS: [(u32, u32); 4] = [
    (FS_IMMUTABLE_FL, 0x0000_0008), // FS_XFLAG_IMMUTABLE
    (FS_APPEND_FL, 0x0000_0010),    // FS_XFLAG_APPEND
    (FS_NOATIME_FL, 0x0000_0040),   // FS_XFLAG_NOATIME
    (FS_NODUMP_FL, 0x0000_0080),    // FS_XFLAG_NODUMP
];

/// `FS_*_FL` flags as `FS_XFLAG_*` flags.
pub fn flags_to_xflags(flags: u32) -> u32 {
    XFLAGS
        .iter()
        .filter(|(f, _)| flags & f != 0)
        .fold(0, |x, (_, xf)| x | xf)
}

/// `FS_XFLAG_*` flags as `FS_*_FL` flags; `EOPNOTSUPP` for any other
/// xflag, as tmpfs answers FS_IOC_FSSETXATTR beyond the common flags.
pub fn xflags_to_flags(xflags: u32) -> Result<u32> {
    let known = XFLAGS.iter().fold(0, |x, (_, xf)| x | xf);
    if xflags & !known != 0 {
        return Err(Errno::EOPNOTSUPP);
    }
    Ok(XFLAGS
        .iter()
        .filter(|(_, xf)| xflags & xf != 0)
        .fold(0, |f, (fl, _)| f | fl))
}

/// Flags a new node takes from its directory (`SHMEM_FL_INHERITED`).
const INHERITED: u32 = FS_NODUMP_FL | FS_NOATIME_FL;

/// Flags whose change needs CAP_LINUX_IMMUTABLE (`fileattr_set_prepare`).
const PRIVILEGED: u32 = FS_IMMUTABLE_FL | FS_APPEND_FL;

// The supported flags all live in the low byte, which is how they are
// stored (one byte in `Meta`, which keeps an inode in its allocator class).
const _: () = assert!(FS_FL_SUPPORTED <= u8::MAX as u32);

impl Meta {
    pub(crate) fn immutable(&self) -> bool {
        self.flags as u32 & FS_IMMUTABLE_FL != 0
    }

    pub(crate) fn append_only(&self) -> bool {
        self.flags as u32 & FS_APPEND_FL != 0
    }

    pub(crate) fn noatime(&self) -> bool {
        self.flags as u32 & FS_NOATIME_FL != 0
    }

    /// A change of the node's attributes, xattrs, links or name: refused
    /// for immutable and append-only nodes.
    pub(crate) fn check_modify(&self) -> Result<()> {
        if self.flags as u32 & (FS_IMMUTABLE_FL | FS_APPEND_FL) != 0 {
            return Err(Errno::EPERM);
        }
        Ok(())
    }

    /// A write of data: refused if immutable, and if append-only unless
    /// at the end of the file (`append`: O_APPEND).
    pub(crate) fn check_write(&self, append: bool) -> Result<()> {
        if self.immutable() || (self.append_only() && !append) {
            return Err(Errno::EPERM);
        }
        Ok(())
    }

    /// A directory gaining an entry (create, link, rename into it):
    /// refused if immutable; append-only directories accept new entries.
    pub(crate) fn check_add_entry(&self) -> Result<()> {
        if self.immutable() {
            return Err(Errno::EPERM);
        }
        Ok(())
    }

    /// `setattr` under the VFS rules (`notify_change`, `do_truncate`):
    /// mode, owner, explicit times and size are refused on immutable and
    /// append-only nodes; times set to "now" only on immutable ones.
    pub(crate) fn check_setattr(&self, set: &SetAttr) -> Result<()> {
        let explicit_time =
            matches!(set.atime, Some(SetTime::At(_))) || matches!(set.mtime, Some(SetTime::At(_)));
        if set.mode.is_some()
            || set.uid.is_some()
            || set.gid.is_some()
            || set.size.is_some()
            || explicit_time
        {
            self.check_modify()?;
        }
        if (set.atime.is_some() || set.mtime.is_some()) && self.immutable() {
            return Err(Errno::EPERM);
        }
        Ok(())
    }

    /// The flags a new regular file or directory in this directory takes.
    pub(crate) fn inherited_flags(&self) -> u8 {
        (self.flags as u32 & INHERITED) as u8
    }

    /// `open` under the VFS rules (`may_open`, `inode_permission`): writing to
    /// an immutable file, and writing other than with O_APPEND (or truncating)
    /// an append-only one, is refused at open.
    pub(crate) fn check_open(&self, flags: i32) -> Result<()> {
        let writes = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let trunc = flags & libc::O_TRUNC != 0;
        if self.immutable() && (writes || trunc) {
            return Err(Errno::EPERM);
        }
        if self.append_only() && ((writes && flags & libc::O_APPEND == 0) || trunc) {
            return Err(Errno::EPERM);
        }
        Ok(())
    }
}

impl Fs {
    /// `FS_IOC_GETFLAGS`: the node's flags (a subset of [`FS_FL_SUPPORTED`]).
    pub fn get_flags(&self, ino: u64) -> Result<u32> {
        let inode = self.get(ino)?;
        let flags = inode.state.read().meta.flags as u32;
        Ok(flags)
    }

    /// The node's attributes and flags, read together (statx shows both):
    /// one lookup and one lock instead of [`Fs::getattr`] then
    /// [`Fs::get_flags`], and no change can fall between the two.
    pub fn getattr_flags(&self, ino: u64) -> Result<(Attr, u32)> {
        let inode = self.get(ino)?;
        let st = inode.state.read();
        Ok((st.attr(ino, inode.kind), st.meta.flags as u32))
    }

    /// `FS_IOC_SETFLAGS` by `ctx`: replaces the node's flags with `flags`.
    /// Only regular files and directories carry flags (others `ENOTTY`, as
    /// the ioctl cannot reach them). Unsupported bits are `EOPNOTSUPP`.
    /// Only the owner or root may set flags, and only root (standing for
    /// CAP_LINUX_IMMUTABLE, which the engine cannot see) may change
    /// append-only or immutable: `EPERM` otherwise. Changes ctime.
    pub fn set_flags(&self, ctx: Ctx, ino: u64, flags: u32) -> Result<Attr> {
        let _gate = self.enter();
        self.admit(META_RECORD)?;
        if flags & !FS_FL_SUPPORTED != 0 {
            return Err(Errno::EOPNOTSUPP);
        }
        let inode = self.get(ino)?;
        if !matches!(inode.kind, FileType::RegularFile | FileType::Directory) {
            return Err(Errno(libc::ENOTTY));
        }
        let mut st = self.write_state(&inode);
        if ctx.uid != 0 && ctx.uid != st.meta.uid {
            return Err(Errno::EPERM);
        }
        if (flags ^ st.meta.flags as u32) & PRIVILEGED != 0 && ctx.uid != 0 {
            return Err(Errno::EPERM);
        }
        st.meta.flags = flags as u8;
        st.meta.ctime = Timespec::now();
        let attr = st.attr(ino, inode.kind);
        self.log(|| Mutation::SetFlags { attr, flags })?;
        Ok(attr)
    }

    /// Rebuild: sets node `ino`'s flags (from a checkpoint image).
    pub fn apply_flags(&self, ino: u64, flags: u32) {
        if let Some(n) = self.core.inodes.get(&ino).map(|n| n.clone()) {
            set_raw(&n, flags);
        }
    }
}

pub(crate) fn set_raw(inode: &Inode, flags: u32) {
    inode.state.write().meta.flags = (flags & FS_FL_SUPPORTED) as u8;
}
