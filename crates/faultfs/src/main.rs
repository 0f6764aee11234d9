//! `memfs-faultfs BACKING MOUNT [--fault CMD]...`: a FUSE pass-through of
//! BACKING at MOUNT that fails chosen operations on command (issue 15 part 3).
//! See `faults.rs` for the command language and docs/faultfs.md.

#![forbid(unsafe_code)]

mod faults;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Parser;
use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    SessionACL, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

use faults::{Command, Op, Plan};

/// The control file, in the root directory only.
const CTL_NAME: &str = ".faultfs-ctl";
const CTL_INO: u64 = u64::MAX - 1;
/// Zero TTLs: the kernel asks us for every size and name, so its view never
/// diverges from the backing directory after a `crash` truncation.
const TTL: Duration = Duration::ZERO;

#[derive(Parser, Debug)]
#[command(about = "FUSE pass-through file system that injects faults (memfs tests)")]
struct Args {
    /// Directory to mirror.
    backing: PathBuf,
    /// Mount point.
    mountpoint: PathBuf,
    /// A fault command to apply at mount time (repeatable), e.g.
    /// "fail write ENOSPC after 100".
    #[arg(long = "fault")]
    faults: Vec<String>,
}

#[derive(Default)]
struct Inodes {
    paths: HashMap<u64, PathBuf>,
    by_path: HashMap<PathBuf, u64>,
    next: u64,
}

impl Inodes {
    fn ino_for(&mut self, p: &Path) -> u64 {
        if let Some(&i) = self.by_path.get(p) {
            return i;
        }
        self.next += 1;
        let i = self.next;
        self.paths.insert(i, p.to_path_buf());
        self.by_path.insert(p.to_path_buf(), i);
        i
    }

    fn forget_path(&mut self, p: &Path) {
        if let Some(i) = self.by_path.remove(p) {
            self.paths.remove(&i);
        }
    }

    /// Moves `from` and everything under it to `to` (a rename).
    fn rename(&mut self, from: &Path, to: &Path) {
        self.forget_path(to);
        let moved: Vec<(PathBuf, u64)> = self
            .by_path
            .iter()
            .filter(|(p, _)| p.starts_with(from))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        for (p, i) in moved {
            let rest = p.strip_prefix(from).expect("prefix checked");
            // join("") would add a trailing slash, which lstat refuses (ENOTDIR).
            let np = if rest.as_os_str().is_empty() {
                to.to_path_buf()
            } else {
                to.join(rest)
            };
            self.by_path.remove(&p);
            self.by_path.insert(np.clone(), i);
            self.paths.insert(i, np);
        }
    }
}

struct Handle {
    file: File,
    ino: u64,
}

/// What a power cut keeps, per file (by our inode number): the length at
/// its last successful fsync (or when faultfs first saw it).
type Synced = HashMap<u64, u64>;

struct FaultFs {
    root: PathBuf,
    inodes: Mutex<Inodes>,
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: Mutex<u64>,
    plan: Mutex<Plan>,
    synced: Mutex<Synced>,
    /// Status text the control file reads back, refreshed at each open.
    ctl_text: Mutex<Vec<u8>>,
}

fn errno(e: &io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH
    }
}

fn attr(ino: u64, m: &std::fs::Metadata) -> FileAttr {
    let ft = m.file_type();
    let kind = if ft.is_dir() {
        FileType::Directory
    } else if ft.is_symlink() {
        FileType::Symlink
    } else if ft.is_socket() {
        FileType::Socket
    } else if ft.is_fifo() {
        FileType::NamedPipe
    } else {
        FileType::RegularFile
    };
    FileAttr {
        ino: INodeNo(ino),
        size: m.size(),
        blocks: m.blocks(),
        atime: time(m.atime(), m.atime_nsec()),
        mtime: time(m.mtime(), m.mtime_nsec()),
        ctime: time(m.ctime(), m.ctime_nsec()),
        crtime: UNIX_EPOCH,
        kind,
        perm: (m.mode() & 0o7777) as u16,
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev() as u32,
        blksize: m.blksize() as u32,
        flags: 0,
    }
}

fn ctl_attr(len: u64) -> FileAttr {
    FileAttr {
        ino: INodeNo(CTL_INO),
        size: len,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0o600,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl FaultFs {
    fn new(root: PathBuf) -> FaultFs {
        let mut inodes = Inodes {
            next: 1,
            ..Default::default()
        };
        inodes.paths.insert(1, root.clone());
        inodes.by_path.insert(root.clone(), 1);
        FaultFs {
            root,
            inodes: Mutex::new(inodes),
            handles: Mutex::new(HashMap::new()),
            next_fh: Mutex::new(1),
            plan: Mutex::new(Plan::default()),
            synced: Mutex::new(HashMap::new()),
            ctl_text: Mutex::new(Vec::new()),
        }
    }

    fn path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        self.inodes
            .lock()
            .paths
            .get(&ino.0)
            .cloned()
            .ok_or(Errno::ESTALE)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        Ok(self.path(parent)?.join(name))
    }

    fn fault(&self, op: Op) -> Result<(), Errno> {
        match self.plan.lock().check(op) {
            Some(e) => {
                tracing::info!(op = op.name(), errno = e, "injected fault");
                Err(Errno::from_i32(e))
            }
            None => Ok(()),
        }
    }

    fn disk_full(&self) -> bool {
        self.plan.lock().full
    }

    fn entry(&self, p: &Path) -> Result<FileAttr, Errno> {
        let m = std::fs::symlink_metadata(p).map_err(|e| errno(&e))?;
        let ino = self.inodes.lock().ino_for(p);
        Ok(attr(ino, &m))
    }

    fn add_handle(&self, file: File, ino: u64) -> u64 {
        let mut n = self.next_fh.lock();
        *n += 1;
        let fh = *n;
        self.handles.lock().insert(fh, Handle { file, ino });
        fh
    }

    fn with_file<T>(
        &self,
        fh: FileHandle,
        f: impl FnOnce(&File, u64) -> io::Result<T>,
    ) -> Result<T, Errno> {
        let h = self.handles.lock();
        let h = h.get(&fh.0).ok_or(Errno::EBADF)?;
        f(&h.file, h.ino).map_err(|e| errno(&e))
    }

    /// Runs one control command; its error is the write's error (EINVAL).
    fn control(&self, text: &str) -> Result<(), Errno> {
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let cmd = faults::parse(line).map_err(|e| {
                tracing::warn!("bad control command {line:?}: {e}");
                Errno::EINVAL
            })?;
            tracing::info!("control: {line}");
            match cmd {
                Command::Add(r) => self.plan.lock().add(r),
                Command::Full => self.plan.lock().full = true,
                Command::Clear => self.plan.lock().clear(),
                Command::Crash => self.crash(),
            }
        }
        Ok(())
    }

    /// Models a power cut for the append-only files memfs writes: every file
    /// is cut back to its length at its last successful fsync. Overwrites
    /// inside the synced length and unsynced directory entries are kept
    /// (the page cache of BACKING is not ours to drop); see docs/faultfs.md.
    fn crash(&self) {
        let synced = self.synced.lock().clone();
        let inodes = self.inodes.lock();
        let mut cut = 0;
        for (ino, len) in synced {
            let Some(p) = inodes.paths.get(&ino) else {
                continue;
            };
            let Ok(f) = OpenOptions::new().write(true).open(p) else {
                continue;
            };
            let cur = f.metadata().map(|m| m.len()).unwrap_or(0);
            if cur > len {
                match f.set_len(len) {
                    Ok(()) => cut += cur - len,
                    Err(e) => tracing::warn!("crash: cannot cut {}: {e}", p.display()),
                }
            }
        }
        tracing::info!("crash: cut {cut} unsynced bytes");
        self.plan.lock().crash_cut += cut;
    }

    fn note_seen(&self, ino: u64, len: u64) {
        self.synced.lock().entry(ino).or_insert(len);
    }

    fn note_synced(&self, ino: u64, file: &File) {
        if let Ok(m) = file.metadata() {
            self.synced.lock().insert(ino, m.len());
        }
    }

    fn open_file(&self, p: &Path, flags: i32) -> io::Result<File> {
        let acc = flags & libc::O_ACCMODE;
        // O_APPEND is dropped: the kernel already turned it into the offset
        // of each write, which pwrite then honours.
        let custom = flags & !(libc::O_ACCMODE | libc::O_APPEND | libc::O_CREAT | libc::O_EXCL);
        OpenOptions::new()
            .read(acc != libc::O_WRONLY)
            .write(acc != libc::O_RDONLY)
            .custom_flags(custom & !libc::O_TRUNC)
            .open(p)
    }
}

impl Filesystem for FaultFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == INodeNo::ROOT && name == CTL_NAME {
            let len = self.ctl_text.lock().len() as u64;
            return reply.entry(&TTL, &ctl_attr(len), Generation(0));
        }
        match self.child(parent, name).and_then(|p| self.entry(&p)) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino.0 == CTL_INO {
            let len = self.ctl_text.lock().len() as u64;
            return reply.attr(&TTL, &ctl_attr(len));
        }
        let r = self.path(ino).and_then(|p| {
            std::fs::symlink_metadata(&p)
                .map(|m| attr(ino.0, &m))
                .map_err(|e| errno(&e))
        });
        match r {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if ino.0 == CTL_INO {
            return reply.attr(&TTL, &ctl_attr(0));
        }
        let r = (|| -> Result<FileAttr, Errno> {
            let p = self.path(ino)?;
            if let Some(len) = size {
                self.fault(Op::Truncate)?;
                if self.disk_full() && std::fs::metadata(&p).is_ok_and(|m| len > m.blocks() * 512) {
                    return Err(Errno::ENOSPC);
                }
                match fh {
                    Some(fh) => self.with_file(fh, |f, _| f.set_len(len))?,
                    None => OpenOptions::new()
                        .write(true)
                        .open(&p)
                        .and_then(|f| f.set_len(len))
                        .map_err(|e| errno(&e))?,
                }
                // A cut below the synced length is as durable as the cut
                // itself would be: conservatively, lower the mark.
                let mut s = self.synced.lock();
                if let Some(m) = s.get_mut(&ino.0) {
                    *m = (*m).min(len);
                }
            }
            if let Some(mode) = mode {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode & 0o7777))
                    .map_err(|e| errno(&e))?;
            }
            let m = std::fs::symlink_metadata(&p).map_err(|e| errno(&e))?;
            Ok(attr(ino.0, &m))
        })();
        match r {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let r = (|| {
            let p = self.child(parent, name)?;
            self.fault(Op::Create)?;
            if self.disk_full() {
                return Err(Errno::ENOSPC);
            }
            std::fs::create_dir(&p).map_err(|e| errno(&e))?;
            let _ = std::fs::set_permissions(
                &p,
                std::fs::Permissions::from_mode(mode & !umask & 0o7777),
            );
            self.entry(&p)
        })();
        match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        // memfs binds its control socket in the data directory.
        let r = (|| {
            let p = self.child(parent, name)?;
            self.fault(Op::Create)?;
            if self.disk_full() {
                return Err(Errno::ENOSPC);
            }
            let kind = nix::sys::stat::SFlag::from_bits_truncate(mode & libc::S_IFMT);
            let perm = nix::sys::stat::Mode::from_bits_truncate(mode & !umask & 0o7777);
            nix::sys::stat::mknod(&p, kind, perm, u64::from(rdev))
                .map_err(|e| Errno::from_i32(e as i32))?;
            self.entry(&p)
        })();
        match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = (|| {
            let p = self.child(parent, name)?;
            self.fault(Op::Unlink)?;
            std::fs::remove_file(&p).map_err(|e| errno(&e))?;
            self.inodes.lock().forget_path(&p);
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = (|| {
            let p = self.child(parent, name)?;
            self.fault(Op::Unlink)?;
            std::fs::remove_dir(&p).map_err(|e| errno(&e))?;
            self.inodes.lock().forget_path(&p);
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let r = (|| {
            let from = self.child(parent, name)?;
            let to = self.child(newparent, newname)?;
            self.fault(Op::Rename)?;
            if flags.is_empty() {
                std::fs::rename(&from, &to).map_err(|e| errno(&e))?;
            } else {
                nix::fcntl::renameat2(
                    nix::fcntl::AT_FDCWD,
                    &from,
                    nix::fcntl::AT_FDCWD,
                    &to,
                    nix::fcntl::RenameFlags::from_bits_truncate(flags.bits()),
                )
                .map_err(|e| Errno::from_i32(e as i32))?;
            }
            self.inodes.lock().rename(&from, &to);
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if ino.0 == CTL_INO {
            *self.ctl_text.lock() = self.plan.lock().status().into_bytes();
            return reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
        }
        let r = (|| {
            let p = self.path(ino)?;
            let f = self.open_file(&p, flags.0).map_err(|e| errno(&e))?;
            if let Ok(m) = f.metadata() {
                self.note_seen(ino.0, m.len());
            }
            Ok(self.add_handle(f, ino.0))
        })();
        match r {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let r = (|| {
            let p = self.child(parent, name)?;
            self.fault(Op::Create)?;
            if self.disk_full() {
                return Err(Errno::ENOSPC);
            }
            let acc = flags & libc::O_ACCMODE;
            let f = OpenOptions::new()
                .read(acc != libc::O_WRONLY)
                .write(true)
                .create(true)
                .truncate(flags & libc::O_TRUNC != 0)
                .mode(mode & !umask & 0o7777)
                .custom_flags(flags & libc::O_EXCL)
                .open(&p)
                .map_err(|e| errno(&e))?;
            let a = self.entry(&p)?;
            // A file created and never synced vanishes (is emptied) in a crash.
            self.synced.lock().insert(a.ino.0, 0);
            let fh = self.add_handle(f, a.ino.0);
            Ok((a, fh))
        })();
        match r {
            Ok((a, fh)) => {
                reply.created(&TTL, &a, Generation(0), FileHandle(fh), FopenFlags::empty())
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if ino.0 == CTL_INO {
            let t = self.ctl_text.lock();
            let start = (offset as usize).min(t.len());
            let end = (start + size as usize).min(t.len());
            return reply.data(&t[start..end]);
        }
        let r = self.with_file(fh, |f, _| {
            let mut buf = vec![0u8; size as usize];
            let mut done = 0;
            while done < buf.len() {
                match f.read_at(&mut buf[done..], offset + done as u64)? {
                    0 => break,
                    n => done += n,
                }
            }
            buf.truncate(done);
            Ok(buf)
        });
        match r {
            Ok(b) => reply.data(&b),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if ino.0 == CTL_INO {
            return match std::str::from_utf8(data)
                .map_err(|_| Errno::EINVAL)
                .and_then(|t| self.control(t))
            {
                Ok(()) => reply.written(data.len() as u32),
                Err(e) => reply.error(e),
            };
        }
        let r = (|| {
            self.fault(Op::Write)?;
            let full = self.disk_full();
            self.with_file(fh, |f, _| {
                if full {
                    let m = f.metadata()?;
                    if offset + data.len() as u64 > m.blocks() * 512 {
                        return Err(io::Error::from_raw_os_error(libc::ENOSPC));
                    }
                }
                f.write_all_at(data, offset)?;
                Ok(data.len() as u32)
            })
        })();
        match r {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.handles.lock().remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        if ino.0 == CTL_INO {
            return reply.ok();
        }
        let r = (|| {
            self.fault(Op::Fsync)?;
            self.with_file(fh, |f, ino| {
                if datasync {
                    f.sync_data()?;
                } else {
                    f.sync_all()?;
                }
                self.note_synced(ino, f);
                Ok(())
            })
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = (|| {
            let p = self.path(ino)?;
            let mut out = vec![
                (ino.0, FileType::Directory, ".".into()),
                (ino.0, FileType::Directory, "..".into()),
            ];
            for e in std::fs::read_dir(&p).map_err(|e| errno(&e))? {
                let e = e.map_err(|e| errno(&e))?;
                let kind = match e.file_type() {
                    Ok(t) if t.is_dir() => FileType::Directory,
                    Ok(t) if t.is_symlink() => FileType::Symlink,
                    _ => FileType::RegularFile,
                };
                let ino = self.inodes.lock().ino_for(&e.path());
                out.push((ino, kind, e.file_name()));
            }
            Ok(out)
        })();
        match r {
            Ok(entries) => {
                for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize)
                {
                    if reply.add(INodeNo(ino), (i + 1) as u64, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let r = (|| {
            let p = self.path(ino)?;
            self.fault(Op::Fsync)?;
            File::open(&p)
                .and_then(|f| f.sync_all())
                .map_err(|e| errno(&e))
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match nix::sys::statvfs::statvfs(&self.root) {
            Ok(s) => {
                let full = self.disk_full();
                let free = if full { 0 } else { s.blocks_free() };
                let avail = if full { 0 } else { s.blocks_available() };
                reply.statfs(
                    s.blocks(),
                    free,
                    avail,
                    s.files(),
                    s.files_free(),
                    s.block_size() as u32,
                    s.name_max() as u32,
                    s.fragment_size() as u32,
                )
            }
            Err(e) => reply.error(Errno::from_i32(e as i32)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let r = (|| {
            self.fault(Op::Fallocate)?;
            if self.disk_full() {
                return Err(Errno::ENOSPC);
            }
            let off = i64::try_from(offset).map_err(|_| Errno::EFBIG)?;
            let len = i64::try_from(length).map_err(|_| Errno::EFBIG)?;
            self.with_file(fh, |f, _| {
                nix::fcntl::fallocate(
                    f,
                    nix::fcntl::FallocateFlags::from_bits_truncate(mode),
                    off,
                    len,
                )
                .map_err(io::Error::from)
            })
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "memfs_faultfs=info".into()),
        )
        .with_writer(io::stderr)
        .init();
    let args = Args::parse();
    let root = args
        .backing
        .canonicalize()
        .with_context(|| format!("backing directory {}", args.backing.display()))?;
    anyhow::ensure!(root.is_dir(), "{} is not a directory", root.display());
    let fs = FaultFs::new(root);
    for f in &args.faults {
        let cmd = faults::parse(f).with_context(|| format!("--fault {f:?}"))?;
        if cmd == Command::Crash {
            anyhow::bail!("--fault crash makes no sense at mount time");
        }
        fs.control(f)
            .map_err(|_| anyhow::anyhow!("--fault {f:?} refused"))?;
    }
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("faultfs".into()),
        MountOption::Subtype("memfs-faultfs".into()),
    ];
    config.acl = SessionACL::Owner;
    config.n_threads = Some(2);
    let mut session = fuser::Session::new(fs, &args.mountpoint, &config)
        .with_context(|| format!("mount {}", args.mountpoint.display()))?;
    let mut unmounter = session.unmount_callable();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .context("signal handler")?;
    std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            tracing::info!("signal {sig}: unmounting");
            if let Err(e) = unmounter.unmount() {
                tracing::warn!("unmount: {e}");
            }
        }
    });
    session.run().context("serve")?;
    Ok(())
}
