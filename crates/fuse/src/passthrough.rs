//! Kernel FUSE passthrough (`--data-path passthrough`): backing files.
//!
//! With FUSE_PASSTHROUGH the kernel serves read, write and mmap of a file
//! opened with FOPEN_PASSTHROUGH straight from a backing file, with no request
//! to memfs. The backing files live in a private tmpfs instance that the
//! server mounts with `size=` equal to the mount's capacity, opens, and
//! detaches at once: nobody else can reach it, and its ENOSPC enforces
//! `--size` for writes memfs never sees.
//!
//! A regular file becomes *backed* at its first open: its bytes are copied
//! from the engine into a fresh O_TMPFILE file and dropped from the engine.
//! From then on the backing file is the authority for the file's data, size,
//! blocks, and (merged with the engine's) timestamps; every data request that
//! still reaches memfs for a backed file (truncate, fallocate, SEEK_DATA/HOLE,
//! copy_file_range, reads and writes of handles not in passthrough) is applied
//! to the backing file. Everything else (names, modes, owners, xattrs, links)
//! stays in the engine. Inode numbers are never reused by the engine, so a
//! stale entry can never be taken for a new file. See docs/fuse.md.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use fuser::BackingId;
use memfs_fs::{AtimeMode, Attr, Ctx, Errno, FileType, SetAttr, SetTime, Timespec};

use crate::Tree;
use nix::fcntl::{FallocateFlags, OFlag};
use nix::mount::{MntFlags, MsFlags};
use nix::sys::stat::Mode;
use nix::sys::time::TimeSpec;

/// How the data of open regular files travels (`--data-path`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataPath {
    /// Every read and write is a FUSE request served from the engine.
    Fuse,
    /// The kernel reads and writes backing files itself; falls back to
    /// `Fuse` (with a warning) where it is not available.
    Passthrough,
    /// Passthrough where available, silently `Fuse` elsewhere.
    Auto,
}

impl std::str::FromStr for DataPath {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fuse" => Ok(DataPath::Fuse),
            "passthrough" => Ok(DataPath::Passthrough),
            "auto" => Ok(DataPath::Auto),
            _ => Err(format!(
                "unknown data path {s:?} (fuse, passthrough or auto)"
            )),
        }
    }
}

/// Bit set in the file handle of an open served in passthrough.
pub(crate) const PASSTHROUGH_FH: u64 = 1 << 63;

/// One backed file.
pub(crate) struct Backed {
    pub(crate) file: File,
    /// Registered with the kernel at the first passthrough open and kept
    /// while the inode lives: every passthrough open of an inode must name
    /// the same backing file, and the kernel looks the id up only after our
    /// reply. `Err(())`: registration failed, this file is served by FUSE.
    id: Mutex<Option<Result<BackingId, ()>>>,
    /// Opens of this inode being served in passthrough now.
    pt_opens: AtomicU32,
    /// The backing file's ctime once set up: changes of ours before it
    /// (the copy, setting the times) are not changes a user made.
    base_ctime: Timespec,
}

impl Backed {
    /// Whether the next open may be served in passthrough. A passthrough
    /// write does not drop setuid/setgid (the kernel writes the backing file,
    /// not ours), so a file that has them is opened through FUSE, where the
    /// engine drops them; unless passthrough opens are still running: the
    /// kernel requires every open of an inode open in passthrough to be one
    /// (a setuid bit set during such an open stays through its writes).
    pub(crate) fn passthrough_ok(&self, perm: u16) -> bool {
        perm & 0o6000 == 0 || self.pt_opens.load(Ordering::Acquire) > 0
    }

    pub(crate) fn pt_opened(&self) {
        self.pt_opens.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn pt_released(&self) {
        let _ = self
            .pt_opens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_sub(1))
            });
    }

    /// The kernel's id for this backing file, registered with `register` the
    /// first time (`Some(Err(()))`: registration failed, now or before). The
    /// guard is held while the caller replies with it.
    pub(crate) fn id(
        &self,
        register: impl FnOnce(&File) -> io::Result<BackingId>,
    ) -> MutexGuard<'_, Option<Result<BackingId, ()>>> {
        let mut id = self.id.lock().unwrap_or_else(|e| e.into_inner());
        if id.is_none() {
            *id = Some(register(&self.file).map_err(|e| {
                tracing::warn!(
                    "FUSE_DEV_IOC_BACKING_OPEN failed ({e}): this file is served through FUSE"
                );
            }));
        }
        id
    }
}

#[derive(Default)]
struct State {
    backed: HashMap<u64, Arc<Backed>>,
    /// Open handles not in passthrough, by inode: such an inode must not
    /// become backed while they are open (the kernel refuses, with EIO, a
    /// passthrough open of an inode open in caching mode).
    fuse_opens: HashMap<u64, u32>,
}

/// The private tmpfs and the backed files in it.
pub struct Backing {
    dir: OwnedFd,
    state: RwLock<State>,
}

fn errno(e: nix::errno::Errno) -> Errno {
    Errno(e as i32)
}

fn io_errno(e: io::Error) -> Errno {
    Errno(e.raw_os_error().unwrap_or(libc::EIO))
}

fn ts(sec: i64, nsec: i64) -> Timespec {
    Timespec {
        sec,
        nsec: nsec as u32,
    }
}

fn time_spec(t: Option<SetTime>) -> TimeSpec {
    match t {
        None => TimeSpec::UTIME_OMIT,
        Some(SetTime::Now) => TimeSpec::UTIME_NOW,
        Some(SetTime::At(t)) => TimeSpec::new(t.sec, t.nsec as i64),
    }
}

static INSTANCE: AtomicU64 = AtomicU64::new(0);

impl Backing {
    /// Mounts a private tmpfs of `capacity` bytes, keeps a descriptor of its
    /// root and detaches it. Needs CAP_SYS_ADMIN (as passthrough itself).
    pub fn new(capacity: u64) -> io::Result<Backing> {
        let base = PathBuf::from("/run/memfs");
        std::fs::create_dir_all(&base)?;
        let dir = base.join(format!(
            "backing-{}-{}",
            std::process::id(),
            INSTANCE.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&dir)?;
        let mounted = (|| {
            // nr_inodes=0: no inode limit of its own; the engine's applies.
            let data = format!("size={capacity},nr_inodes=0,mode=0700");
            nix::mount::mount(
                Some("memfs-backing"),
                &dir,
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some(data.as_str()),
            )?;
            let fd = nix::fcntl::open(
                &dir,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            );
            // Invisible from now on, usable through `fd` until it is closed.
            let detached = nix::mount::umount2(&dir, MntFlags::MNT_DETACH);
            let fd = fd?;
            detached?;
            Ok::<_, nix::Error>(fd)
        })();
        let _ = std::fs::remove_dir(&dir);
        Ok(Backing {
            dir: mounted.map_err(io::Error::from)?,
            state: RwLock::new(State::default()),
        })
    }

    pub(crate) fn get(&self, ino: u64) -> Option<Arc<Backed>> {
        let st = self.state.read().unwrap_or_else(|e| e.into_inner());
        if st.backed.is_empty() {
            return None;
        }
        st.backed.get(&ino).cloned()
    }

    /// The backing file of `ino`, made now if the file is not backed yet.
    /// `Err` leaves the file in the engine (to be served through FUSE): it is
    /// open through FUSE already, has setuid/setgid (which passthrough writes
    /// would not drop), or its bytes do not fit.
    pub(crate) fn back<T: Tree>(&self, fs: &T, ino: u64) -> Result<Arc<Backed>, Errno> {
        if let Some(b) = self.get(ino) {
            return Ok(b);
        }
        let mut st = self.state.write().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = st.backed.get(&ino) {
            return Ok(b.clone());
        }
        if st.fuse_opens.get(&ino).is_some_and(|&n| n > 0) {
            return Err(Errno::EBUSY);
        }
        let a = fs.getattr(ino)?;
        if a.kind != FileType::RegularFile {
            return Err(Errno::EINVAL);
        }
        if a.perm & 0o6000 != 0 {
            return Err(Errno::EPERM);
        }
        let b = Arc::new(self.make(fs, &a)?);
        st.backed.insert(ino, b.clone());
        Ok(b)
    }

    fn make<T: Tree>(&self, fs: &T, a: &Attr) -> Result<Backed, Errno> {
        let fd = nix::fcntl::openat(
            self.dir.as_fd(),
            ".",
            OFlag::O_TMPFILE | OFlag::O_RDWR | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(errno)?;
        let file = File::from(fd);
        // Copy what the engine holds, leaving its holes as holes.
        const CHUNK: usize = 1 << 20;
        let mut buf = vec![0u8; CHUNK.min(a.size as usize)];
        let mut off = 0u64;
        while off < a.size {
            let want = ((a.size - off) as usize).min(CHUNK);
            let n = fs.read_atime(a.ino, off, &mut buf[..want], AtimeMode::Relative)?;
            if n == 0 {
                break;
            }
            if buf[..n].iter().any(|&b| b != 0) {
                file.write_all_at(&buf[..n], off).map_err(io_errno)?;
            }
            off += n as u64;
        }
        file.set_len(a.size).map_err(io_errno)?;
        nix::sys::stat::futimens(
            file.as_fd(),
            &TimeSpec::new(a.atime.sec, a.atime.nsec as i64),
            &TimeSpec::new(a.mtime.sec, a.mtime.nsec as i64),
        )
        .map_err(errno)?;
        let m = file.metadata().map_err(io_errno)?;
        // The engine's copy goes; its times stay as they were.
        if a.size > 0 {
            fs.setattr_as(
                Ctx::ROOT,
                &|_| true,
                a.ino,
                &SetAttr {
                    size: Some(0),
                    atime: Some(SetTime::At(a.atime)),
                    mtime: Some(SetTime::At(a.mtime)),
                    ctime: Some(a.ctime),
                    ..Default::default()
                },
            )?;
        }
        Ok(Backed {
            file,
            id: Mutex::new(None),
            pt_opens: AtomicU32::new(0),
            base_ctime: ts(m.ctime(), m.ctime_nsec()),
        })
    }

    /// Whether an open of the backed `ino` (mode bits `perm`) may be served
    /// in passthrough: not while it is open through FUSE (the kernel would
    /// refuse it with EIO), and see [`Backed::passthrough_ok`].
    pub(crate) fn can_passthrough(&self, ino: u64, bk: &Backed, perm: u16) -> bool {
        let st = self.state.read().unwrap_or_else(|e| e.into_inner());
        !st.fuse_opens.contains_key(&ino) && bk.passthrough_ok(perm)
    }

    /// An open of `ino` that is served through FUSE began.
    pub(crate) fn fuse_opened(&self, ino: u64) {
        let mut st = self.state.write().unwrap_or_else(|e| e.into_inner());
        *st.fuse_opens.entry(ino).or_default() += 1;
    }

    /// An open of `ino` that was served through FUSE ended.
    pub(crate) fn fuse_released(&self, ino: u64) {
        let mut st = self.state.write().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = st.fuse_opens.get_mut(&ino) {
            *n -= 1;
            if *n == 0 {
                st.fuse_opens.remove(&ino);
            }
        }
    }

    /// Drops the backing file of `ino` once the engine has freed the inode
    /// (after its last FORGET or RELEASE).
    pub(crate) fn maybe_drop<T: Tree>(&self, fs: &T, ino: u64) {
        if self.get(ino).is_some() && fs.getattr(ino) == Err(Errno::ENOENT) {
            let mut st = self.state.write().unwrap_or_else(|e| e.into_inner());
            st.backed.remove(&ino);
        }
    }

    /// The file's attributes with what the backing file knows better: size,
    /// blocks, and the later of each timestamp.
    pub(crate) fn merge(&self, a: &mut Attr) {
        if a.kind != FileType::RegularFile {
            return;
        }
        let Some(b) = self.get(a.ino) else { return };
        let Ok(m) = b.file.metadata() else { return };
        a.size = m.size();
        a.blocks = m.blocks();
        a.atime = a.atime.max(ts(m.atime(), m.atime_nsec()));
        a.mtime = a.mtime.max(ts(m.mtime(), m.mtime_nsec()));
        let c = ts(m.ctime(), m.ctime_nsec());
        if c > b.base_ctime {
            a.ctime = a.ctime.max(c);
        }
    }

    /// Bytes used by backing files and bytes still free in the tmpfs.
    pub fn usage(&self) -> Option<(u64, u64)> {
        let s = nix::sys::statvfs::fstatvfs(self.dir.as_fd()).ok()?;
        let f = s.fragment_size();
        Some(((s.blocks() - s.blocks_free()) * f, s.blocks_available() * f))
    }
}

/// Data operations on a backing file, with the engine's errors.
impl Backed {
    pub(crate) fn read_at(&self, off: u64, buf: &mut [u8]) -> Result<usize, Errno> {
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], off + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_errno(e)),
            }
        }
        Ok(done)
    }

    pub(crate) fn write_at(&self, off: u64, data: &[u8]) -> Result<usize, Errno> {
        self.file.write_all_at(data, off).map_err(io_errno)?;
        Ok(data.len())
    }

    pub(crate) fn size(&self) -> Result<u64, Errno> {
        Ok(self.file.metadata().map_err(io_errno)?.size())
    }

    pub(crate) fn truncate(&self, size: u64) -> Result<(), Errno> {
        self.file.set_len(size).map_err(io_errno)
    }

    pub(crate) fn set_times(&self, atime: Option<SetTime>, mtime: Option<SetTime>) {
        if atime.is_some() || mtime.is_some() {
            let _ =
                nix::sys::stat::futimens(self.file.as_fd(), &time_spec(atime), &time_spec(mtime));
        }
    }

    /// `fallocate` as the engine offers it (tmpfs has no ZERO_RANGE: a
    /// punch and an allocation instead).
    pub(crate) fn fallocate(
        &self,
        off: u64,
        len: u64,
        keep_size: bool,
        punch_hole: bool,
        zero_range: bool,
    ) -> Result<(), Errno> {
        let keep = if keep_size {
            FallocateFlags::FALLOC_FL_KEEP_SIZE
        } else {
            FallocateFlags::empty()
        };
        let fd = self.file.as_fd();
        if punch_hole || zero_range {
            let size = self.size()?;
            if off < size {
                nix::fcntl::fallocate(
                    fd,
                    FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
                    off as i64,
                    len.min(size - off) as i64,
                )
                .map_err(errno)?;
            }
            if punch_hole {
                return Ok(());
            }
        }
        nix::fcntl::fallocate(fd, keep, off as i64, len as i64).map_err(errno)
    }

    pub(crate) fn seek(&self, off: u64, whence: i32) -> Result<u64, Errno> {
        let w = match whence {
            libc::SEEK_DATA => nix::unistd::Whence::SeekData,
            libc::SEEK_HOLE => nix::unistd::Whence::SeekHole,
            _ => return Err(Errno::EINVAL),
        };
        nix::unistd::lseek(self.file.as_fd(), off as i64, w)
            .map(|o| o as u64)
            .map_err(errno)
    }

    /// `copy_file_range` between two backing files.
    pub(crate) fn copy_to(
        &self,
        off_in: u64,
        out: &Backed,
        off_out: u64,
        len: u64,
    ) -> Result<u64, Errno> {
        let mut oi = off_in as i64;
        let mut oo = off_out as i64;
        let mut done = 0u64;
        while done < len {
            let n = nix::fcntl::copy_file_range(
                self.file.as_fd(),
                Some(&mut oi),
                out.file.as_fd(),
                Some(&mut oo),
                (len - done) as usize,
            )
            .map_err(errno)?;
            if n == 0 {
                break;
            }
            done += n as u64;
        }
        Ok(done)
    }
}
