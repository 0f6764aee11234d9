//! Plain data types of the engine's API.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Unit of file data storage: holes cost nothing, written ranges cost whole pages.
pub const PAGE_SIZE: usize = 4096;
/// Longest name in a directory (Linux NAME_MAX).
pub const NAME_MAX: usize = 255;
/// Longest symlink target (Linux PATH_MAX - 1).
pub const SYMLINK_MAX: usize = 4095;
/// Inode number of the root directory (FUSE_ROOT_ID).
pub const ROOT_INO: u64 = 1;
/// Largest file size (Linux MAX_LFS_FILESIZE on 64-bit).
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;
/// Largest number of hard links to one inode.
pub const LINK_MAX: u32 = u32::MAX - 1;
/// Linux XATTR_NAME_MAX, XATTR_SIZE_MAX and XATTR_LIST_MAX.
pub const XATTR_NAME_MAX: usize = 255;
pub const XATTR_SIZE_MAX: usize = 65536;
pub const XATTR_LIST_MAX: usize = 65536;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FileType {
    RegularFile,
    Directory,
    Symlink,
    NamedPipe,
    Socket,
    CharDevice,
    BlockDevice,
}

impl FileType {
    /// The type from the `S_IFMT` bits of a mode; `None` for an invalid type.
    pub fn from_mode(mode: u32) -> Option<FileType> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => FileType::RegularFile,
            libc::S_IFDIR => FileType::Directory,
            libc::S_IFLNK => FileType::Symlink,
            libc::S_IFIFO => FileType::NamedPipe,
            libc::S_IFSOCK => FileType::Socket,
            libc::S_IFCHR => FileType::CharDevice,
            libc::S_IFBLK => FileType::BlockDevice,
            _ => return None,
        })
    }

    /// The type mknod(2) makes of `mode`: no type bits mean a regular file
    /// (as Linux does); a directory, a symlink or an unknown type is EINVAL
    /// (they have calls of their own). The engine and a volume both ask here.
    pub fn of_mknod(mode: u32) -> Result<FileType, crate::Errno> {
        if mode & libc::S_IFMT == 0 {
            return Ok(FileType::RegularFile);
        }
        match FileType::from_mode(mode) {
            Some(FileType::Directory | FileType::Symlink) | None => Err(crate::Errno::EINVAL),
            Some(t) => Ok(t),
        }
    }

    pub fn mode_bits(self) -> u32 {
        match self {
            FileType::RegularFile => libc::S_IFREG,
            FileType::Directory => libc::S_IFDIR,
            FileType::Symlink => libc::S_IFLNK,
            FileType::NamedPipe => libc::S_IFIFO,
            FileType::Socket => libc::S_IFSOCK,
            FileType::CharDevice => libc::S_IFCHR,
            FileType::BlockDevice => libc::S_IFBLK,
        }
    }

    /// One letter as `ls -l` shows it.
    pub fn letter(self) -> char {
        match self {
            FileType::RegularFile => '-',
            FileType::Directory => 'd',
            FileType::Symlink => 'l',
            FileType::NamedPipe => 'p',
            FileType::Socket => 's',
            FileType::CharDevice => 'c',
            FileType::BlockDevice => 'b',
        }
    }
}

/// A point in time with nanoseconds, as in `struct timespec`.
///
/// Packed to 4-byte alignment: 12 bytes instead of 16, and every inode holds
/// three of them (part of what keeps a million empty files under 300 MiB).
/// Fields are read by value; a reference to `sec` is refused by the compiler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
#[repr(C, packed(4))]
pub struct Timespec {
    pub sec: i64,
    pub nsec: u32,
}

impl Timespec {
    pub fn now() -> Timespec {
        Timespec::clock(libc::CLOCK_REALTIME)
    }

    /// The wall clock as of the last timer tick (a few ms old): for checks
    /// that only need seconds. A read costs ~6 ns here against ~30 ns for
    /// [`Timespec::now`] (vDSO, measured on the 2-vCPU VM), and relatime
    /// asks on every read of a file read before.
    pub fn coarse_now() -> Timespec {
        Timespec::clock(libc::CLOCK_REALTIME_COARSE)
    }

    fn clock(id: libc::clockid_t) -> Timespec {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes a timespec into the valid, exclusively borrowed `ts`.
        unsafe { libc::clock_gettime(id, &mut ts) };
        Timespec {
            sec: ts.tv_sec,
            nsec: ts.tv_nsec as u32,
        }
    }

    pub fn from_system_time(t: SystemTime) -> Timespec {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Timespec {
                sec: d.as_secs() as i64,
                nsec: d.subsec_nanos(),
            },
            Err(e) => {
                let d = e.duration();
                let mut sec = -(d.as_secs() as i64);
                let mut nsec = d.subsec_nanos();
                if nsec > 0 {
                    sec -= 1;
                    nsec = 1_000_000_000 - nsec;
                }
                Timespec { sec, nsec }
            }
        }
    }

    pub fn to_system_time(self) -> SystemTime {
        if self.sec >= 0 {
            UNIX_EPOCH + Duration::new(self.sec as u64, self.nsec)
        } else {
            UNIX_EPOCH - Duration::new(self.sec.unsigned_abs(), 0) + Duration::new(0, self.nsec)
        }
    }
}

/// The caller of an operation: new nodes take its uid and gid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ctx {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl Ctx {
    pub const ROOT: Ctx = Ctx {
        uid: 0,
        gid: 0,
        pid: 0,
    };

    /// The calling process's own credentials.
    pub fn current() -> Ctx {
        // SAFETY: these calls have no preconditions and cannot fail.
        unsafe {
            Ctx {
                uid: libc::geteuid(),
                gid: libc::getegid(),
                pid: libc::getpid() as u32,
            }
        }
    }
}

/// Attributes of a node, as `stat` shows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub kind: FileType,
    /// Permission bits including setuid, setgid and sticky (no type bits).
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub size: u64,
    /// 512-byte blocks actually allocated.
    pub blocks: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    /// Creation time (statx's btime), never changed after the node is made.
    pub btime: Timespec,
    pub blksize: u32,
}

impl Attr {
    pub fn mode(&self) -> u32 {
        self.kind.mode_bits() | self.perm as u32
    }
}

/// A time in `setattr`: the current time or an explicit one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetTime {
    Now,
    At(Timespec),
}

/// What `setattr` changes; `None` leaves a field alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    pub ctime: Option<Timespec>,
}

/// Capacity and usage, as `statfs` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// Limits of one file system instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Bytes of file data (whole pages) the file system may hold.
    pub capacity: u64,
    /// Number of inodes the file system may hold, the root included.
    pub max_inodes: u64,
}

impl Default for Config {
    /// Like tmpfs: half of physical memory, and one inode per page of that.
    fn default() -> Self {
        let half = physical_memory() / 2;
        Config {
            capacity: half,
            max_inodes: (half / PAGE_SIZE as u64).max(1024),
        }
    }
}

/// Physical memory of this machine in bytes.
pub fn physical_memory() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages <= 0 || size <= 0 {
        return 1 << 30;
    }
    pages as u64 * size as u64
}

/// When reading a file updates its access time: the mount's atime policy
/// (`relatime`, `strictatime`, `noatime`). A FUSE kernel never updates atime
/// itself (it marks every inode S_NOATIME), so the policy has to live here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AtimeMode {
    /// `relatime`, Linux's default: when the last access is not later than
    /// the last change, or is a day old.
    #[default]
    Relative,
    /// `strictatime`: on every read.
    Strict,
    /// `noatime`: never.
    Never,
}

impl AtimeMode {
    /// The policy for a read through a descriptor opened with `flags`
    /// (`open(2)` flags, as a FUSE READ carries them): `O_NOATIME` records
    /// nothing, whatever the mount's policy. Whether the opener may ask for
    /// it (owner or CAP_FOWNER) was checked by the kernel at open.
    pub fn for_open_flags(self, flags: i32) -> AtimeMode {
        if flags & libc::O_NOATIME != 0 {
            AtimeMode::Never
        } else {
            self
        }
    }
}

/// Flags of `rename`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
}

impl RenameFlags {
    /// From Linux `RENAME_*` bits; `EINVAL` for unknown or conflicting bits.
    pub fn from_bits(bits: u32) -> crate::Result<RenameFlags> {
        let known = libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE | libc::RENAME_WHITEOUT;
        if bits & !known != 0 {
            return Err(crate::Errno::EINVAL);
        }
        if bits & libc::RENAME_WHITEOUT != 0 {
            return Err(crate::Errno::EINVAL);
        }
        let f = RenameFlags {
            noreplace: bits & libc::RENAME_NOREPLACE != 0,
            exchange: bits & libc::RENAME_EXCHANGE != 0,
        };
        if f.noreplace && f.exchange {
            return Err(crate::Errno::EINVAL);
        }
        Ok(f)
    }
}

/// Flags of `setxattr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrMode {
    /// Create or replace.
    Any,
    /// Fail with EEXIST if present (XATTR_CREATE).
    Create,
    /// Fail with ENODATA if absent (XATTR_REPLACE).
    Replace,
}

impl XattrMode {
    pub fn from_flags(flags: i32) -> crate::Result<XattrMode> {
        match flags {
            0 => Ok(XattrMode::Any),
            libc::XATTR_CREATE => Ok(XattrMode::Create),
            libc::XATTR_REPLACE => Ok(XattrMode::Replace),
            _ => Err(crate::Errno::EINVAL),
        }
    }
}

/// Modes of `fallocate`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FallocateMode {
    pub keep_size: bool,
    pub punch_hole: bool,
    pub zero_range: bool,
}

impl FallocateMode {
    pub const ALLOCATE: FallocateMode = FallocateMode {
        keep_size: false,
        punch_hole: false,
        zero_range: false,
    };

    /// From Linux `FALLOC_FL_*` bits; `EOPNOTSUPP` for modes memfs does not offer.
    pub fn from_bits(mode: i32) -> crate::Result<FallocateMode> {
        let known =
            libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
        if mode & !known != 0 {
            return Err(crate::Errno::EOPNOTSUPP);
        }
        let m = FallocateMode {
            keep_size: mode & libc::FALLOC_FL_KEEP_SIZE != 0,
            punch_hole: mode & libc::FALLOC_FL_PUNCH_HOLE != 0,
            zero_range: mode & libc::FALLOC_FL_ZERO_RANGE != 0,
        };
        if m.punch_hole && (!m.keep_size || m.zero_range) {
            // Linux: punching a hole must keep the size, and cannot be combined with zeroing.
            return Err(crate::Errno::EOPNOTSUPP);
        }
        Ok(m)
    }
}

/// A POSIX record lock as `F_GETLK` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockInfo {
    pub start: u64,
    /// Inclusive end; `u64::MAX` for "to end of file".
    pub end: u64,
    /// `F_RDLCK`, `F_WRLCK` or `F_UNLCK`.
    pub typ: i32,
    pub pid: u32,
}

impl LockInfo {
    /// What `F_GETLK` reports for `[start, end]`: the first conflicting
    /// lock `(start, end, write, pid)`, or `F_UNLCK` over the range asked.
    pub fn reported(start: u64, end: u64, conflict: Option<(u64, u64, bool, u32)>) -> LockInfo {
        match conflict {
            Some((start, end, write, pid)) => LockInfo {
                start,
                end,
                typ: if write { libc::F_WRLCK } else { libc::F_RDLCK },
                pid,
            },
            None => LockInfo {
                start,
                end,
                typ: libc::F_UNLCK,
                pid: 0,
            },
        }
    }
}

#[cfg(test)]
mod clock_tests {
    use super::Timespec;

    #[test]
    fn the_coarse_clock_is_the_same_wall_clock_at_tick_precision() {
        let fine = Timespec::now();
        let coarse = Timespec::coarse_now();
        let again = Timespec::now();
        // At most a tick behind the fine clock read before it, never
        // ahead of the one read after it.
        assert!(coarse <= again, "{coarse:?} after {again:?}");
        assert!(
            fine.sec - coarse.sec <= 1,
            "{coarse:?} long before {fine:?}"
        );
        assert!(coarse.nsec < 1_000_000_000);
    }
}
