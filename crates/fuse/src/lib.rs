//! memfs kernel adapter: serves a [`memfs_fs::Fs`] through FUSE, or any
//! other [`Tree`] (tree.rs: the seam; [`mount_tree`]).
//!
//! This crate is a translation layer only: every decision about file system
//! semantics lives in the engine. What is decided here is how the kernel is
//! talked to: worker threads (one cloned `/dev/fuse` descriptor each), the
//! capabilities negotiated at INIT, cache timeouts, and replies to blocking
//! lock requests that are sent later, from whichever thread releases the lock.
//!
//! Depends on `memfs-fs`, `fuser` (vendored, `vendor/fuser`) and
//! `memfs-cluster` (a volume on a Redis Cluster is the other tree: volume.rs):
//! a durable mount is the same `Fs` with a recorder installed, so this crate
//! needs nothing of `memfs-durable`. Mounts appear as type `fuse.memfs`.

mod atime;
mod caller;
mod dio;
pub mod mounts;
mod notify;
pub mod passthrough;
pub mod snapdir;
mod snapops;

pub use atime::AtimePolicy;
pub use passthrough::DataPath;
use passthrough::{Backing, PASSTHROUGH_FH};
use snapdir::Node;
use snapops::EROFS;
pub mod swap;
mod tree;
mod volume;
pub use tree::{Change, Tree};

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use fuser::{
    Config, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLock, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyStatx, ReplyWrite, ReplyXattr, Request, SessionACL, StatxExtra, TimeOrNow, WriteFlags,
    WritePages,
};
use memfs_fs::{
    AtimeMode, Attr, Ctx, Errno, FallocateMode, FileType, Fs, RenameFlags, SetAttr, SetTime,
    Timespec, XattrMode,
};

/// Largest request the kernel sends us: 1 MiB (256 pages).
pub const MAX_WRITE: u32 = 1 << 20;

/// Default entry and attribute cache timeout.
pub const CACHE_TIMEOUT: Duration = Duration::from_secs(86_400);

/// The entry and attribute timeouts of a [`Tree::SHARED`] tree on a kernel
/// that cannot be told to drop every name at once (FUSE_NOTIFY_INC_EPOCH,
/// protocol 7.44): then a tree that lost track of other mounts' changes
/// ([`Change::All`]) relies on the kernel's caches running out, and this
/// is how stale a name or an attribute may get.
pub const SHARED_FALLBACK_TIMEOUT: Duration = Duration::from_secs(1);

/// The first protocol minor version with FUSE_NOTIFY_INC_EPOCH (Linux 6.16).
const INC_EPOCH_MINOR: u32 = 44;

/// Ring entries per CPU with FUSE over io_uring: requests of one CPU that
/// can be in flight at once (each entry holds a request buffer of up to
/// 1 MiB, resident once touched).
const URING_QUEUE_DEPTH: usize = 8;

/// O_DIRECT writes whose replies may wait at once for the page cache
/// invalidation (dio.rs): well under `max_background` (64), which every
/// direct write and readahead READ shares, and under half of an io_uring
/// queue, whose entries they hold.
const MAX_HELD_DIRECT_WRITES: usize = 16;

/// How the file system is presented to the kernel.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Worker threads reading requests, each from its own cloned /dev/fuse descriptor.
    pub threads: usize,
    /// Let the kernel cache writes and send them in the background.
    pub writeback_cache: bool,
    /// Let users other than the one who mounted use the file system.
    pub allow_other: bool,
    /// How long the kernel may cache names and attributes.
    pub entry_timeout: Duration,
    pub attr_timeout: Duration,
    /// Who keeps POSIX record locks (fcntl, lockf, OFD).
    pub locks: LockMode,
    /// Serve requests through per-CPU io_uring queues (FUSE over io_uring)
    /// when the kernel offers it; `/dev/fuse` otherwise.
    pub io_uring: bool,
    /// How long one worker that has just answered a short request keeps
    /// polling `/dev/fuse` before it sleeps (`--poll-us`); zero: never.
    /// Not used over io_uring.
    pub poll: Duration,
    /// How the data of open regular files travels (`--data-path`).
    pub data_path: DataPath,
    /// Bytes of file data the mount may hold: the size of the backing tmpfs
    /// with passthrough.
    pub data_capacity: u64,
    /// Name shown as the source in /proc/mounts.
    pub fsname: String,
    /// The type is `fuse.SUBTYPE` in /proc/mounts (so that mount(8) finds the
    /// helper for `mount -o remount`); empty: plain `fuse`, as fstests'
    /// `FSTYP=fuse` expects.
    pub subtype: String,
    /// Further mount options passed to the kernel as they are.
    pub extra: Vec<String>,
    /// When reads update atime (`relatime`, `strictatime`, `noatime`, and
    /// never on a read-only mount): the FUSE kernel leaves atime to the
    /// server whatever the mount flags say. Shared with the running
    /// adapter: a remount changes it live.
    pub atime: AtimePolicy,
    /// List `.snapshots` in readdir of the root (`-o snapdir=visible`); it
    /// can be entered by name either way.
    pub snapdir_visible: bool,
    /// The name of the snapshot directory in the root (`-o snapdir_name=`).
    pub snapdir_name: Vec<u8>,
    /// Let idmapped mounts of this mount be made (`-o allow_idmap`:
    /// FUSE_ALLOW_IDMAP, Linux 6.12+). Off by default: once negotiated the
    /// kernel sends uid = gid = -1 on every request that does not create a
    /// node (on the plain mount too), so each such request that needs its
    /// caller's ids costs a read of /proc/PID/status, and through an
    /// idmapped mount the engine's own checks then see the caller's
    /// unmapped ids (the kernel has checked the mapped ones before).
    pub allow_idmap: bool,
    /// Read each WRITE's data into pages that the engine keeps, one copy
    /// per byte instead of two (`--copy-writes` turns it off); a durable
    /// mount journals the bytes from those pages.
    pub paged_writes: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            threads: default_threads(),
            writeback_cache: false,
            allow_other: false,
            // Every change passes through the kernel that caches, and it
            // updates or drops what a change touches: nothing can go stale, so
            // a day (like tmpfs, whose dentries never expire). 1 s cost a
            // LOOKUP or GETATTR per name and second (docs/fuse.md).
            entry_timeout: CACHE_TIMEOUT,
            attr_timeout: CACHE_TIMEOUT,
            locks: LockMode::Kernel,
            io_uring: false,
            poll: DEFAULT_POLL,
            data_path: DataPath::Fuse,
            data_capacity: memfs_fs::Config::default().capacity,
            fsname: "memfs".into(),
            subtype: "memfs".into(),
            extra: Vec::new(),
            atime: AtimePolicy::default(),
            snapdir_visible: false,
            snapdir_name: b".snapshots".to_vec(),
            allow_idmap: false,
            paged_writes: true,
        }
    }
}

/// Where POSIX record locks live. Both give the same semantics on one
/// machine; they differ in cost (docs/fuse.md, "Record locks").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    /// The kernel keeps them, as it does for tmpfs. FUSE then needs no
    /// message at open or close: OPEN and FLUSH exist only so a server can
    /// tie locks to handles and drop them at close, so both are declined
    /// (ENOSYS) and the kernel stops sending them (and RELEASE after opens).
    Kernel,
    /// The engine keeps them (FUSE_POSIX_LOCKS): every lock request, and
    /// every open and close, is a round trip to memfs.
    Engine,
}

impl std::str::FromStr for LockMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "kernel" => Ok(LockMode::Kernel),
            "engine" => Ok(LockMode::Engine),
            _ => Err(format!("unknown lock mode {s:?} (kernel or engine)")),
        }
    }
}

/// How long a worker polls for the next request before it sleeps. A
/// request that finds every worker asleep wakes one on another CPU, which on
/// an idle VM has halted: 10-20 µs of wake-up per round trip. Measured
/// (docs/fuse.md, "Polling before sleeping"): 50 µs halves a lookup's round
/// trip and lifts creates, unlinks and fio's buffered 4 KiB figure by a
/// fifth to a half; 20 µs gained less, 200 µs no more.
pub const DEFAULT_POLL: Duration = Duration::from_micros(50);

/// One worker per CPU, at least two. Measured (docs/fuse.md): on an idle
/// 2-vCPU VM two workers are 4-5x faster than one (each request otherwise
/// waits for a halted vCPU to be woken); on a saturated one the order flips.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(2, 16)
}

/// A mounted file system that is not served yet; [`Mounted::run`] serves it.
pub struct Mounted<T: Tree = Fs> {
    session: fuser::Session<MemFuse<T>>,
    swapper: swap::Swapper<T>,
}

/// Unmounts a [`Mounted`] from another thread (signal handlers).
pub struct Unmounter(fuser::SessionUnmounter);

impl Unmounter {
    pub fn unmount(&mut self) -> io::Result<()> {
        self.0.unmount()
    }
}

impl Mounted {
    /// Replaces the served tree while mounted (online rollback).
    pub fn swapper(&self) -> swap::Swapper {
        self.swapper.clone()
    }
}

impl<T: Tree> Mounted<T> {
    pub fn unmounter(&mut self) -> Unmounter {
        Unmounter(self.session.unmount_callable())
    }

    /// Serves requests until the file system is unmounted.
    pub fn run(self) -> io::Result<()> {
        self.session.run()
    }
}

/// Mounts `fs` at `mountpoint`. Returns once the kernel has completed the
/// FUSE handshake, so the mount is usable when this returns.
pub fn mount(fs: Arc<Fs>, mountpoint: &Path, opts: &MountOptions) -> io::Result<Mounted> {
    mount_tree(fs, mountpoint, opts)
}

/// [`mount`] for any [`Tree`]. What only the local engine has
/// ([`Tree::local`]) is off for another tree whatever `opts` says:
/// `.snapshots`, passthrough backing files (they would keep the data on
/// this machine), and record locks kept by a tree that keeps none.
pub fn mount_tree<T: Tree>(
    fs: Arc<T>,
    mountpoint: &Path,
    opts: &MountOptions,
) -> io::Result<Mounted<T>> {
    let local = fs.local().is_some();
    let opts = &served_options(&*fs, local, opts);
    let config = session_config(opts);
    let backing = passthrough_backing(opts);
    if local {
        snapdir::check_dir_name(&opts.snapdir_name).map_err(io::Error::other)?;
    }
    let io_uring = serves_io_uring(opts);
    let notifier = Arc::new(OnceLock::new());
    let cell = Arc::new(swap::FsCell::new(fs));
    let slots = Arc::new(snapdir::Slots::default());
    let adapter = MemFuse {
        fs: cell.clone(),
        next_fh: AtomicU64::new(1),
        lock_owners: Mutex::new(HashMap::new()),
        waits: Arc::new(Mutex::new(HashMap::new())),
        entry_ttl: opts.entry_timeout,
        attr_ttl: opts.attr_timeout,
        writeback: opts.writeback_cache,
        io_uring,
        engine_locks: opts.locks == LockMode::Engine,
        strict_opens: opts.atime.effective() == AtimeMode::Strict,
        atime: opts.atime.clone(),
        any_locks: AtomicBool::new(false),
        no_opendir: AtomicBool::new(false),
        data_path: opts.data_path,
        backing,
        dio: dio::DirectWrites::new(
            notifier.clone(),
            if io_uring {
                MAX_HELD_DIRECT_WRITES.min(URING_QUEUE_DEPTH / 2)
            } else {
                MAX_HELD_DIRECT_WRITES
            },
        ),
        notifier: notifier.clone(),
        slots: slots.clone(),
        snapdir_name: opts.snapdir_name.clone(),
        snapdir_visible: opts.snapdir_visible,
        allow_idmap: opts.allow_idmap,
    };
    let session = fuser::Session::new(adapter, mountpoint, &config)?;
    widen_readahead(mountpoint);
    let _ = notifier.set(session.notifier());
    let notify = notify::Notifications::start(session.notifier()).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("cannot start the notification thread: {e}"),
        )
    })?;
    if T::SHARED {
        watch_changes(&*cell.get(), notify.clone());
    }
    let swapper = swap::Swapper::new(cell, notify, slots, opts.snapdir_name.clone());
    Ok(Mounted { session, swapper })
}

/// Hands a shared tree the function that turns what another mount changed
/// into kernel invalidations, queued for the notification thread (the
/// tree's thread that calls it never waits for the kernel: notify.rs).
fn watch_changes<T: Tree>(fs: &T, notify: notify::Notifications) {
    fs.watch(Box::new(move |c| {
        let item = match c {
            // The attributes and every cached page: another mount wrote.
            Change::Inode(ino) => notify::Inval::Inode {
                ino,
                off: 0,
                len: 0,
            },
            Change::Entry { parent, name } => notify::Inval::Entry { parent, name },
            Change::All => {
                // Every name the kernel holds is looked up again at its next
                // use, which refreshes the attributes of what it names; the
                // root is reached by no name. Open files' attributes and
                // pages: the tree names them (Change::Inode) before this,
                // and no open keeps pages until the tree checked the file
                // afresh (Tree::open). A kernel without the epoch keeps
                // names at most SHARED_FALLBACK_TIMEOUT (init).
                tracing::info!("the tree lost track of other mounts' changes");
                notify.post(notify::Inval::Epoch);
                notify::Inval::Inode {
                    ino: memfs_fs::ROOT_INO,
                    off: -1,
                    len: 0,
                }
            }
        };
        notify.post(item);
    }));
}

/// `opts` as served for `fs`: what only the local engine has is turned off
/// for another tree (see [`mount_tree`]).
fn served_options<T: Tree>(fs: &T, local: bool, opts: &MountOptions) -> MountOptions {
    let mut opts = opts.clone();
    if !local {
        if opts.data_path != DataPath::Fuse {
            tracing::info!("passthrough is the local engine's only: serving the fuse data path");
            opts.data_path = DataPath::Fuse;
        }
        // An empty name is never looked up: no `.snapshots`.
        opts.snapdir_name = Vec::new();
        opts.snapdir_visible = false;
    }
    if opts.locks == LockMode::Engine && !fs.keeps_locks() {
        tracing::warn!("the served tree keeps no record locks: the kernel keeps them");
        opts.locks = LockMode::Kernel;
    }
    opts
}

/// The kernel's mount options: ours, then the user's, a later flag
/// overriding an earlier one.
fn kernel_mount_options(opts: &MountOptions) -> Vec<MountOption> {
    let mut mount_options = vec![
        MountOption::FSName(opts.fsname.clone()),
        MountOption::DefaultPermissions,
        // Like tmpfs: device nodes and setuid programs work unless the user says otherwise.
        MountOption::Dev,
        MountOption::Suid,
    ];
    if !opts.subtype.is_empty() {
        mount_options.push(MountOption::Subtype(opts.subtype.clone()));
    }
    for o in &opts.extra {
        let o = kernel_option(o);
        // A later flag overrides an earlier one (nodev after the default dev).
        let opposite = match o {
            MountOption::NoDev => Some(MountOption::Dev),
            MountOption::NoSuid => Some(MountOption::Suid),
            MountOption::Atime => Some(MountOption::NoAtime),
            MountOption::NoAtime => Some(MountOption::Atime),
            _ => None,
        };
        mount_options.retain(|m| Some(m) != opposite.as_ref());
        mount_options.push(o);
    }
    mount_options
}

/// The fuser session's configuration.
fn session_config(opts: &MountOptions) -> Config {
    let mut config = Config::default();
    config.mount_options = kernel_mount_options(opts);
    config.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(opts.threads.max(1));
    config.clone_fd = true;
    config.uring_queue_depth = Some(URING_QUEUE_DEPTH);
    config.spin_poll = Some(opts.poll);
    config.paged_writes = opts.paged_writes;
    config
}

/// The private tmpfs for passthrough backing files, when `opts` asks for
/// passthrough (or auto) and it combines with the other options.
fn passthrough_backing(opts: &MountOptions) -> Option<Arc<Backing>> {
    match opts.data_path {
        DataPath::Fuse => None,
        p if opts.writeback_cache => {
            if p == DataPath::Passthrough {
                tracing::warn!(
                    "passthrough does not combine with --writeback-cache: serving the fuse data path"
                );
            }
            None
        }
        p => match Backing::new(opts.data_capacity) {
            Ok(b) => Some(Arc::new(b)),
            Err(e) => {
                let msg = format!(
                    "no private tmpfs for passthrough backing files ({e}; needs root): \
                     serving the fuse data path"
                );
                if p == DataPath::Passthrough {
                    tracing::warn!("{msg}");
                } else {
                    tracing::info!("{msg}");
                }
                None
            }
        },
    }
}

/// Whether requests come over io_uring: when asked for, unless record locks
/// are the engine's.
fn serves_io_uring(opts: &MountOptions) -> bool {
    let io_uring = opts.io_uring && opts.locks != LockMode::Engine;
    if opts.io_uring && !io_uring {
        // A blocked F_SETLKW keeps its request's ring entry until the lock
        // is granted, and a CPU's queue has URING_QUEUE_DEPTH of them: that
        // many waiters on one CPU left every later request from it, the
        // holder's unlock included, waiting for an entry for ever (measured:
        // 12 waiters pinned to one CPU wedged it). /dev/fuse has no such
        // bound.
        tracing::warn!(
            "--io-uring does not combine with --locks engine (blocked lock requests would hold \
             the rings' entries): serving /dev/fuse"
        );
    }
    io_uring
}

/// Raises the mount's readahead window to one FUSE request (`MAX_WRITE`).
///
/// The kernel gives a FUSE mount the default 128 KiB window (INIT's
/// `max_readahead` can only lower it), so a 1 MiB read that misses the page
/// cache becomes eight sequential 128 KiB READ round trips instead of one.
/// fio's buffered jobs miss often: fio drops a file's cached pages each time
/// it starts over the file, and a FUSE file system, unlike tmpfs, loses them.
/// Measured (docs/fuse.md): fio 1 MiB buffered randrw 441-516 -> 651-667
/// MiB/s; 4 KiB random reads read one page either way. Needs root (sysfs);
/// a window the user already widened is left alone.
fn widen_readahead(mountpoint: &Path) {
    let Some(dev) = mounts::mount_dev(mountpoint) else {
        return;
    };
    // The bdi of a `fuse` mount is named after its device, "MAJOR:MINOR".
    let knob = Path::new("/sys/class/bdi").join(&dev).join("read_ahead_kb");
    let want = u64::from(MAX_WRITE / 1024);
    let current = std::fs::read_to_string(&knob)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok());
    match current {
        Some(kb) if kb >= want => {}
        Some(_) => match std::fs::write(&knob, want.to_string()) {
            Ok(()) => tracing::debug!("readahead window {want} KiB ({})", knob.display()),
            Err(e) => tracing::debug!("readahead window left as is ({}: {e})", knob.display()),
        },
        None => tracing::debug!("no readahead knob at {}", knob.display()),
    }
}

fn kernel_option(o: &str) -> MountOption {
    match o {
        "ro" => MountOption::RO,
        "rw" => MountOption::RW,
        "exec" => MountOption::Exec,
        "noexec" => MountOption::NoExec,
        "suid" => MountOption::Suid,
        "nosuid" => MountOption::NoSuid,
        "dev" => MountOption::Dev,
        "nodev" => MountOption::NoDev,
        "atime" => MountOption::Atime,
        "noatime" => MountOption::NoAtime,
        "sync" => MountOption::Sync,
        "async" => MountOption::Async,
        "dirsync" => MountOption::DirSync,
        other => MountOption::CUSTOM(other.to_string()),
    }
}

/// The FUSE face of a [`Tree`], monomorphised for each (tree.rs).
pub struct MemFuse<T: Tree = Fs> {
    /// The served tree: replaced whole by an online rollback (swap.rs).
    fs: Arc<swap::FsCell<T>>,
    /// Every open gets its own handle, so that locks can be tied to it.
    next_fh: AtomicU64,
    /// Lock owners that set record locks through each handle. The kernel
    /// tells a FUSE server nothing when an open file description with OFD
    /// locks is closed except the RELEASE of its handle, so the locks are
    /// dropped then. (Classic POSIX locks are dropped at FLUSH; by the time a
    /// handle is released, every process that used it has closed it.)
    /// Touched only by lock requests and releases of handles that locked.
    lock_owners: Mutex<HashMap<u64, Vec<u64>>>,
    /// Blocked lock requests by FUSE request id, so an interrupt can cancel them.
    waits: Arc<Mutex<HashMap<u64, u64>>>,
    entry_ttl: Duration,
    attr_ttl: Duration,
    writeback: bool,
    io_uring: bool,
    /// [`LockMode::Engine`]: locks, opens and closes come to us.
    engine_locks: bool,
    /// The atime policy of reads, changed live by remounts. With `Strict`,
    /// opens are answered without FOPEN_KEEP_CACHE, so that a read after
    /// each open reaches us and is recorded (reads served from the page
    /// cache never are).
    atime: AtimePolicy,
    /// The mount started with `strictatime`, so OPEN is answered. Fixed at
    /// start: once OPEN has been declined the kernel never sends it again
    /// on this connection, so a later `remount,strictatime` records only
    /// the reads that reach memfs.
    strict_opens: bool,
    /// Whether any handle ever locked: keeps the map out of the release path until then.
    any_locks: AtomicBool,
    /// The kernel accepted NO_OPENDIR_SUPPORT: OPENDIR is declined.
    no_opendir: AtomicBool,
    data_path: DataPath,
    /// Passthrough is on: backing files of opened regular files. Every open
    /// is answered (to hand over the backing file), so this overrides the
    /// zero-message opens of kernel locks.
    backing: Option<Arc<Backing>>,
    /// Set once the session exists; see [`MemFuse::privileges_may_drop`].
    notifier: Arc<OnceLock<fuser::Notifier>>,
    /// Page cache invalidation after O_DIRECT writes (xfstests generic/451).
    dio: dio::DirectWrites,
    /// Which snapshot each slot of the node id space shows (snapdir.rs).
    slots: Arc<snapdir::Slots>,
    snapdir_name: Vec<u8>,
    snapdir_visible: bool,
    /// Ask for FUSE_ALLOW_IDMAP at INIT ([`MountOptions::allow_idmap`]).
    allow_idmap: bool,
}

fn err(e: Errno) -> fuser::Errno {
    fuser::Errno::from_i32(e.0)
}

/// A request about a node the kernel holds that the engine no longer has:
/// after an online rollback to a snapshot, the files created since (open
/// descriptors, working directories) answer ESTALE, as on ZFS.
fn stale(e: Errno) -> Errno {
    if e == Errno::ENOENT { Errno::ESTALE } else { e }
}

fn kind(k: FileType) -> fuser::FileType {
    match k {
        FileType::RegularFile => fuser::FileType::RegularFile,
        FileType::Directory => fuser::FileType::Directory,
        FileType::Symlink => fuser::FileType::Symlink,
        FileType::NamedPipe => fuser::FileType::NamedPipe,
        FileType::Socket => fuser::FileType::Socket,
        FileType::CharDevice => fuser::FileType::CharDevice,
        FileType::BlockDevice => fuser::FileType::BlockDevice,
    }
}

fn fuse_attr(a: &Attr) -> fuser::FileAttr {
    fuser::FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: a.atime.to_system_time(),
        mtime: a.mtime.to_system_time(),
        ctime: a.ctime.to_system_time(),
        // statx's btime (the vendored fuser carries it in `crtime`).
        crtime: a.btime.to_system_time(),
        kind: kind(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
        flags: 0,
    }
}

/// The fields a statx reply fills: the basic stats and btime (the kernel
/// passes nothing else of a FUSE reply on).
const STATX_FIELDS: u32 = 0x7ff | 0x800; // STATX_BASIC_STATS | STATX_BTIME
const STATX_ATTR_IMMUTABLE: u64 = 0x10;
const STATX_ATTR_APPEND: u64 = 0x20;
const STATX_ATTR_NODUMP: u64 = 0x40;
/// The statx attributes memfs knows, as tmpfs reports them (shmem_getattr).
const STATX_ATTRS_SUPPORTED: u64 = STATX_ATTR_APPEND | STATX_ATTR_IMMUTABLE | STATX_ATTR_NODUMP;

/// statx's attribute bits for a node's inode flags (`FS_*_FL`).
fn statx_attributes(flags: u32) -> u64 {
    let mut out = 0;
    for (fl, attr) in [
        (memfs_fs::FS_APPEND_FL, STATX_ATTR_APPEND),
        (memfs_fs::FS_IMMUTABLE_FL, STATX_ATTR_IMMUTABLE),
        (memfs_fs::FS_NODUMP_FL, STATX_ATTR_NODUMP),
    ] {
        if flags & fl != 0 {
            out |= attr;
        }
    }
    out
}

/// The caller of a request. With FUSE_ALLOW_IDMAP negotiated, a request
/// that creates no node carries uid = gid = -1: the caller's fsuid and fsgid
/// are then read from /proc (caller.rs). A creating request carries the
/// ids the new node is to have (mapped through an idmapped mount).
fn ctx(req: &Request) -> Ctx {
    let (uid, gid) = caller::fs_ids(req.pid(), req.uid(), req.gid());
    Ctx {
        uid,
        gid,
        pid: req.pid(),
    }
}

/// Whether the caller of a request has a group among its supplementary
/// groups, for the engine's setgid drops: asked only when it decides (a
/// setgid file without group-exec outside the caller's fsgid), as it costs a
/// read of /proc.
fn caller_in_group(who: Ctx) -> impl Fn(u32) -> bool {
    move |gid| caller::in_group(who.pid, gid)
}

fn set_time(t: Option<TimeOrNow>) -> Option<SetTime> {
    t.map(|t| match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(st) => SetTime::At(Timespec::from_system_time(st)),
    })
}

thread_local! {
    // Reads reuse one buffer per worker instead of allocating up to 1 MiB per request.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Answers a READ with `pages` gathered in one `writev`. Up to four slices
/// (every read of 8 KiB or less) need no allocation.
fn reply_pages(reply: ReplyData, pages: &[&[u8]]) {
    const INLINE: usize = 4;
    if pages.len() <= INLINE {
        let mut iov = [io::IoSlice::new(&[]); INLINE];
        for (v, p) in iov.iter_mut().zip(pages) {
            *v = io::IoSlice::new(p);
        }
        reply.data_vectored(&iov[..pages.len()]);
    } else {
        let iov: Vec<io::IoSlice<'_>> = pages.iter().map(|p| io::IoSlice::new(p)).collect();
        reply.data_vectored(&iov);
    }
}

/// Kernel lock owners and flock ids are distinct spaces; memfs keeps POSIX
/// record locks in the engine and lets the kernel emulate flock locally (the
/// FUSE library in use cannot tell a flock request from a record lock).
const GENERATION: Generation = Generation(0);

impl<T: Tree> MemFuse<T> {
    /// Whether a write or fallocate that `kill`s setuid/setgid (its caller
    /// lacks CAP_FSETID) may clear them on `ino`: the engine drops them
    /// (HANDLE_KILLPRIV_V2), but the kernel's reply to WRITE and FALLOCATE
    /// carries no attributes and it does not mark the mode stale, so `stat`
    /// would show the old mode until the attribute timeout. A file without
    /// them (the common case) keeps nothing to clear, and a caller that does
    /// not kill costs no lookup.
    fn privileges_may_drop(&self, kill: bool, ino: u64) -> bool {
        kill && self
            .fs
            .get()
            .getattr(ino)
            .is_ok_and(|a| a.perm & (libc::S_ISUID | libc::S_ISGID) as u16 != 0)
    }

    /// Makes the kernel fetch `ino`'s attributes again (only attributes: a
    /// negative offset leaves the page cache alone, so this takes no page
    /// locks and is safe while the caller holds the inode lock).
    fn attributes_changed(&self, ino: u64) {
        if let Some(n) = self.notifier.get()
            && let Err(e) = n.inval_inode(INodeNo(ino), -1, 0)
        {
            tracing::debug!("invalidating the attributes of inode {ino}: {e}");
        }
    }

    /// Waits until what this request changed is as durable as the mount's
    /// durability mode promises (nothing to do without a data directory).
    /// Runs after the engine has dropped its locks, so that concurrent
    /// requests share one fsync.
    fn settled<V>(&self, r: memfs_fs::Result<V>) -> memfs_fs::Result<V> {
        let s = self.fs.get().settle();
        r.and_then(|v| s.map(|()| v))
    }

    fn entry(&self, reply: ReplyEntry, r: memfs_fs::Result<Attr>) {
        match self.settled(r) {
            // Beyond INO_MASK the number would name a snapshot's node (snapdir.rs).
            Ok(a) if a.ino > snapdir::INO_MASK => reply.error(fuser::Errno::EOVERFLOW),
            Ok(a) => {
                reply.entry_with_ttls(&self.entry_ttl, &self.attr_ttl, &self.attr(a), GENERATION)
            }
            Err(e) => reply.error(err(e)),
        }
    }

    /// A node of `.snapshots` (already renumbered; never backed).
    fn snap_entry(&self, reply: ReplyEntry, r: memfs_fs::Result<Attr>) {
        match r {
            Ok(a) => {
                reply.entry_with_ttls(&self.entry_ttl, &self.attr_ttl, &fuse_attr(&a), GENERATION)
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn empty(reply: ReplyEmpty, r: memfs_fs::Result<()>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    /// What the kernel is told about a node: with passthrough, a backed
    /// file's size, blocks and times come from its backing file (the kernel
    /// writes there without telling us).
    fn attr(&self, mut a: Attr) -> fuser::FileAttr {
        if let Some(b) = &self.backing {
            b.merge(&mut a);
        }
        fuse_attr(&a)
    }

    /// The engine's side of a data change made in a backing file: mtime and
    /// ctime, and setuid/setgid dropped as for a write (a punch over no
    /// engine data changes nothing else).
    fn touch(&self, caller: Ctx, kill: bool, ino: u64) -> memfs_fs::Result<()> {
        let punch = FallocateMode {
            keep_size: true,
            punch_hole: true,
            zero_range: false,
        };
        self.fs
            .get()
            .fallocate_as(caller, &caller_in_group(caller), kill, ino, 0, 1, punch)
    }

    fn backed(&self, ino: u64) -> Option<Arc<passthrough::Backed>> {
        self.backing.as_ref()?.get(ino)
    }

    fn new_fh(&self) -> FileHandle {
        FileHandle(self.next_fh.fetch_add(1, Ordering::Relaxed))
    }

    /// The reply to CREATE and TMPFILE: the new node, open. With kernel
    /// passthrough the handle is backed by the node's backing file when one
    /// can be opened, else served here like any fuse-path handle.
    fn reply_created(&self, a: Attr, reply: ReplyCreate) {
        let fh = self.new_fh();
        if let Some(b) = &self.backing {
            if let Ok(bk) = b.back(&*self.fs.get(), a.ino) {
                let id = bk.id(|f| reply.open_backing(f));
                if let Some(Ok(id)) = id.as_ref() {
                    bk.pt_opened();
                    return reply.created_passthrough(
                        &self.entry_ttl,
                        &self.attr(a),
                        GENERATION,
                        FileHandle(fh.0 | PASSTHROUGH_FH),
                        FopenFlags::empty(),
                        id,
                    );
                }
            }
            b.fuse_opened(a.ino);
        }
        reply.created(
            &self.entry_ttl,
            &self.attr(a),
            GENERATION,
            fh,
            // A new node has no pages to keep; on a shared tree the name
            // may have been another mount's file by then.
            self.open_flags(false),
        );
    }

    fn note_lock_owner(&self, fh: FileHandle, owner: u64) {
        let mut map = self.lock_owners.lock().unwrap_or_else(|e| e.into_inner());
        let owners = map.entry(fh.0).or_default();
        if !owners.contains(&owner) {
            owners.push(owner);
        }
        self.any_locks.store(true, Ordering::Release);
    }

    /// Whether OPEN is answered with ENOSYS (the kernel then opens and closes
    /// with no message): nothing per open to keep, i.e. record locks are the
    /// kernel's, atimes need no open (not strictatime), and no backing file
    /// must be named in an open reply (not passthrough).
    fn declines_open(&self) -> bool {
        self.backing.is_none() && !self.engine_locks && !self.strict_opens && !T::SHARED
    }

    /// The flags of an open whose tree said `pages_current` ([`Tree::open`]).
    #[inline]
    fn open_flags(&self, pages_current: bool) -> FopenFlags {
        // Every change goes through this kernel, so its page cache never goes
        // stale: keep it across opens (except for strictatime, see `atime`).
        // Direct writes to one file may run in parallel: the engine
        // serialises them per inode itself.
        // A shared tree's other mounts may have written the file since
        // these pages were read: the open keeps them only if the tree found
        // the file unchanged (close-to-open). `T::SHARED` is a constant: for
        // the local engine this is the test of strictatime alone.
        if (T::SHARED && !pages_current) || self.atime.effective() == AtimeMode::Strict {
            FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
        } else {
            FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
        }
    }
}

impl<T: Tree> Filesystem for MemFuse<T> {
    // One piece: the FUSE INIT negotiation, one capability after another,
    // each with what the adapter does when the kernel lacks it.
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let wanted = [
            InitFlags::FUSE_ASYNC_READ,
            InitFlags::FUSE_BIG_WRITES,
            InitFlags::FUSE_MAX_PAGES,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_READDIRPLUS_AUTO,
            InitFlags::FUSE_EXPORT_SUPPORT,
            InitFlags::FUSE_CACHE_SYMLINKS,
            // Asynchronous direct I/O is sent as it comes (libaio, io_uring)
            // instead of one request at a time per caller.
            InitFlags::FUSE_ASYNC_DIO,
            // Without it, the kernel asks for security.capability (a GETXATTR
            // round trip, under the inode lock) before every write; the engine
            // drops setuid/setgid and the capability itself.
            InitFlags::FUSE_HANDLE_KILLPRIV_V2,
            // OPENDIR and RELEASEDIR carry nothing the engine needs.
            InitFlags::FUSE_NO_OPENDIR_SUPPORT,
        ];
        // The kernel enforces the ACLs the engine keeps (it fetches and
        // caches system.posix_acl_access), and sends the umask unapplied: it
        // must not apply where the parent has a default ACL.
        let acls = [InitFlags::FUSE_POSIX_ACL, InitFlags::FUSE_DONT_MASK]
            .into_iter()
            .filter(|_| T::POSIX_ACLS);
        let engine = self.engine_locks.then_some(InitFlags::FUSE_POSIX_LOCKS);
        // flock(2) must hold across the mounts of a shared tree: the kernel
        // then sends it as a whole-file lock owned by the open file
        // description, dropped at its RELEASE.
        let flock = (self.engine_locks && T::SHARED).then_some(InitFlags::FUSE_FLOCK_LOCKS);
        for f in wanted.into_iter().chain(acls).chain(engine).chain(flock) {
            match config.add_capabilities(f) {
                Ok(()) if f == InitFlags::FUSE_NO_OPENDIR_SUPPORT => {
                    self.no_opendir.store(true, Ordering::Relaxed)
                }
                Ok(()) => {}
                Err(missing) => tracing::debug!("kernel lacks capability {missing:?}"),
            }
        }
        if self.io_uring
            && config
                .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
                .is_err()
        {
            tracing::warn!(
                "the kernel does not offer FUSE over io_uring \
                 (/sys/module/fuse/parameters/enable_uring is off): serving /dev/fuse"
            );
        }
        if self.backing.is_some() {
            let ok = config
                .add_capabilities(InitFlags::FUSE_PASSTHROUGH)
                .is_ok()
                // The backing files are on tmpfs (depth 0).
                && config.set_max_stack_depth(1).is_ok();
            if ok {
                tracing::info!("data path: kernel passthrough");
            } else {
                self.backing = None;
                let msg = "the kernel does not offer FUSE passthrough (Linux 6.9+, \
                           CONFIG_FUSE_PASSTHROUGH): serving the fuse data path";
                if self.data_path == DataPath::Passthrough {
                    tracing::warn!("{msg}");
                } else {
                    tracing::info!("{msg}");
                }
            }
        }
        // The kernel also needs default_permissions (always set, see
        // `kernel_mount_options`), or it fails the whole INIT.
        if self.allow_idmap
            && let Err(e) = config.add_capabilities(InitFlags::FUSE_ALLOW_IDMAP)
        {
            tracing::warn!(
                "the kernel does not offer idmapped FUSE mounts (FUSE_ALLOW_IDMAP, \
                 Linux 6.12+; {e:?}): allow_idmap ignored"
            );
        }
        if self.writeback {
            config
                .add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE)
                .map_err(|_| io::Error::other("the kernel does not support writeback caching"))?;
        }
        if T::SHARED && config.kernel_abi().1 < INC_EPOCH_MINOR {
            // Change::All could not reach the names the kernel holds: keep
            // them (and their attributes) only as long as staleness may last.
            self.entry_ttl = self.entry_ttl.min(SHARED_FALLBACK_TIMEOUT);
            self.attr_ttl = self.attr_ttl.min(SHARED_FALLBACK_TIMEOUT);
            tracing::info!(
                "the kernel's FUSE protocol is {}, before FUSE_NOTIFY_INC_EPOCH (7.{INC_EPOCH_MINOR}): \
                 names and attributes of this shared tree are cached for at most {:?}",
                config.kernel_abi(),
                SHARED_FALLBACK_TIMEOUT
            );
        }
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_readahead(MAX_WRITE);
        let _ = config.set_max_background(64);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = name.as_bytes();
        match snapdir::classify(parent.0) {
            Node::Live(p) if self.is_snapdir_name(p, name) => {
                self.snap_entry(reply, self.snapdir_attr())
            }
            Node::Live(p) if name == b"." || name == b".." => {
                // The kernel asks for these only to decode a file handle
                // (open_by_handle_at, an NFS export) of an inode it no longer
                // holds, and to reconnect a directory so found to its parent
                // (fuse_get_dentry, fuse_get_parent): rare, and worth seeing
                // with MEMFS_LOG=memfs::export=debug.
                let r = self.fs.get().lookup(p, name);
                tracing::debug!(
                    target: "memfs::export",
                    "file handle: LOOKUP {:?} in inode {p}: {}",
                    String::from_utf8_lossy(name),
                    match &r {
                        Ok(a) => format!("inode {}", a.ino),
                        Err(e) => format!("{e:?}"),
                    }
                );
                self.entry(reply, r)
            }
            Node::Live(p) => self.entry(reply, self.fs.get().lookup(p, name)),
            node => self.snap_entry(reply, self.snap_lookup(node, name)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        // Snapshot nodes keep no lookup counts.
        if self.writable(ino.0).is_err() {
            return;
        }
        self.fs.get().forget(ino.0, nlookup);
        // The kernel forgets an inode when it evicts it, pages and all.
        self.dio.forget(ino.0);
        if let Some(b) = &self.backing {
            b.maybe_drop(&*self.fs.get(), ino.0);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let node = snapdir::classify(ino.0);
        if node != Node::Live(ino.0) {
            return match self.snap_getattr(node) {
                Ok(a) => reply.attr(&self.attr_ttl, &fuse_attr(&a)),
                Err(e) => reply.error(err(e)),
            };
        }
        match self.fs.get().getattr(ino.0).map_err(stale) {
            Ok(a) => reply.attr(&self.attr_ttl, &self.attr(a)),
            Err(e) => reply.error(err(e)),
        }
    }

    /// statx(2) asking for btime: the attributes of `getattr` with the
    /// creation time and the inode flags statx shows.
    fn statx(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: Option<FileHandle>,
        _flags: u32,
        _mask: u32,
        reply: ReplyStatx,
    ) {
        let node = snapdir::classify(ino.0);
        let (attr, flags) = if node != Node::Live(ino.0) {
            // Snapshot views show no inode flags (as their getattr).
            match self.snap_getattr(node) {
                Ok(a) => (fuse_attr(&a), 0),
                Err(e) => return reply.error(err(e)),
            }
        } else {
            match self.fs.get().getattr_flags(ino.0).map_err(stale) {
                Ok((a, flags)) => (self.attr(a), flags),
                Err(e) => return reply.error(err(e)),
            }
        };
        let extra = StatxExtra {
            mask: STATX_FIELDS,
            attributes: statx_attributes(flags),
            attributes_mask: STATX_ATTRS_SUPPORTED,
        };
        reply.statx(&self.attr_ttl, &attr, &extra);
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: set_time(atime),
            mtime: set_time(mtime),
            ctime: ctime.map(Timespec::from_system_time),
        };
        if let Err(e) = self.writable(ino.0) {
            return reply.error(err(e));
        }
        let caller = ctx(req);
        let mut r = self
            .fs
            .get()
            .setattr_as(caller, &caller_in_group(caller), ino.0, &set)
            .map_err(stale);
        if let (Ok(_), Some(b)) = (&r, self.backed(ino.0)) {
            // The engine checked and recorded the change; the data is here.
            if let Some(size) = size
                && let Err(e) = b.truncate(size)
            {
                r = Err(e);
            }
            b.set_times(set.atime, set.mtime);
        }
        match self.settled(r) {
            Ok(a) => reply.attr(&self.attr_ttl, &self.attr(a)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let r = match snapdir::classify(ino.0) {
            Node::Live(i) => self.fs.get().readlink(i),
            Node::Snap { slot, ino } => self.snap_readlink(slot, ino),
            Node::SnapDir => Err(Errno::EINVAL),
        };
        match r {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(err(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let r = self.new_name(parent.0, name.as_bytes()).and_then(|()| {
            self.fs
                .get()
                .mknod_umask(ctx(req), parent.0, name.as_bytes(), mode, rdev, umask)
        });
        self.entry(reply, r);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let r = self.new_name(parent.0, name.as_bytes()).and_then(|()| {
            self.fs
                .get()
                .mkdir_umask(ctx(req), parent.0, name.as_bytes(), mode, umask)
        });
        self.entry(reply, r);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self
            .old_name(parent.0, name.as_bytes())
            .and_then(|()| self.fs.get().unlink(parent.0, name.as_bytes()));
        Self::empty(reply, self.settled(r));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self
            .old_name(parent.0, name.as_bytes())
            .and_then(|()| self.fs.get().rmdir(parent.0, name.as_bytes()));
        Self::empty(reply, self.settled(r));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let r = self
            .new_name(parent.0, link_name.as_bytes())
            .and_then(|()| {
                self.fs.get().symlink(
                    ctx(req),
                    parent.0,
                    link_name.as_bytes(),
                    target.as_os_str().as_bytes(),
                )
            });
        self.entry(reply, r);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        // The kernel has checked CAP_MKNOD for a whiteout before sending it.
        let whiteout = flags.bits() & libc::RENAME_WHITEOUT != 0;
        let bits = flags.bits() & !libc::RENAME_WHITEOUT;
        let (p, n, np, nn) = (parent.0, name.as_bytes(), newparent.0, newname.as_bytes());
        let names = self.old_name(p, n).and_then(|()| self.new_name(np, nn));
        let r = names.and(RenameFlags::from_bits(bits)).and_then(|f| {
            if whiteout {
                self.fs.get().rename_whiteout(ctx(req), p, n, np, nn, f)
            } else {
                self.fs.get().rename(p, n, np, nn, f)
            }
        });
        Self::empty(reply, self.settled(r));
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        // A snapshot's node cannot gain a live name: another file system, as far as link(2) goes.
        let r = self
            .new_name(newparent.0, newname.as_bytes())
            .and_then(|()| self.writable(ino.0).map_err(|_| Errno::EXDEV))
            .and_then(|()| self.fs.get().link(ino.0, newparent.0, newname.as_bytes()));
        self.entry(reply, r);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if self.writable(ino.0).is_err() {
            // A snapshot never changes: its pages may stay cached across opens.
            let writes = flags.0 & (libc::O_ACCMODE | libc::O_TRUNC) != libc::O_RDONLY;
            return if writes {
                reply.error(err(EROFS))
            } else {
                match self.snap_getattr(snapdir::classify(ino.0)) {
                    Ok(_) => reply.opened(self.new_fh(), FopenFlags::FOPEN_KEEP_CACHE),
                    Err(e) => reply.error(err(e)),
                }
            };
        }
        if let Some(b) = &self.backing {
            let current = match self.fs.get().open(ino.0, flags.0) {
                Ok(c) => c,
                Err(e) => return reply.error(err(e)),
            };
            let fh = self.new_fh();
            if let Ok(bk) = b.back(&*self.fs.get(), ino.0)
                && self
                    .fs
                    .get()
                    .getattr(ino.0)
                    .is_ok_and(|a| b.can_passthrough(ino.0, &bk, a.perm))
            {
                let id = bk.id(|f| reply.open_backing(f));
                if let Some(Ok(id)) = id.as_ref() {
                    bk.pt_opened();
                    return reply.opened_passthrough(
                        FileHandle(fh.0 | PASSTHROUGH_FH),
                        FopenFlags::empty(),
                        id,
                    );
                }
            }
            b.fuse_opened(ino.0);
            return reply.opened(fh, self.open_flags(current));
        }
        if self.declines_open() {
            // Zero-message opens from now on: the kernel has checked access,
            // sends O_TRUNC as a SETATTR, and holds a lookup reference while
            // the file is open, so an unlinked open file lives until FORGET.
            return reply.error(fuser::Errno::ENOSYS);
        }
        match self.fs.get().open(ino.0, flags.0) {
            Ok(current) => reply.opened(self.new_fh(), self.open_flags(current)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // Before the engine is read: a page cache READ serving old data
        // must be seen by a direct write applied after it (dio.rs).
        if flags.0 & libc::O_DIRECT == 0 && snapdir::classify(ino.0) == Node::Live(ino.0) {
            self.dio.note_cached(ino.0);
        }
        // The kernel never moves a FUSE file's atime itself, so O_NOATIME is
        // ours to honour. READs made for a mapping's page faults and read-ahead
        // carry the flags of the mapped file, so mmap is covered too.
        let atime = self.atime.effective().for_open_flags(flags.0);
        // The engine's pages (and a snapshot's) go to the kernel as a gather
        // list, under the file's read lock: no copy into a buffer first.
        let mut reply = Some(reply);
        let mut send = |pages: &[&[u8]]| {
            if let Some(reply) = reply.take() {
                reply_pages(reply, pages);
            }
        };
        let r = match (snapdir::classify(ino.0), self.backed(ino.0)) {
            (Node::Snap { slot, ino }, _) => {
                self.snap_read_with(slot, ino, offset, size as usize, send)
            }
            (Node::SnapDir, _) => Err(Errno::EISDIR),
            // A backing file's bytes are the kernel's: read into a buffer.
            // Its atime is the backing tmpfs's to keep (merged into ours,
            // `Backing::merge`), so O_NOATIME is not honoured on this path,
            // nor on passthrough opens, whose reads never reach us.
            (_, Some(b)) => READ_BUF.with_borrow_mut(|buf| {
                if buf.len() < size as usize {
                    buf.resize(size as usize, 0);
                }
                let buf = &mut buf[..size as usize];
                b.read_at(offset, buf).map(|n| send(&[&buf[..n]]))
            }),
            (_, None) => self
                .fs
                .get()
                .read_with(ino.0, offset, size as usize, atime, send)
                .map_err(stale),
        };
        if let (Err(e), Some(reply)) = (r, reply) {
            reply.error(err(e));
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let data = WriteData::Bytes(data);
        self.write_from(req, ino, offset, data, write_flags, flags, reply)
    }

    fn write_pages(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &mut WritePages,
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let data = WriteData::Pages(data);
        self.write_from(req, ino, offset, data, write_flags, flags, reply)
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        if !self.engine_locks && !T::SHARED {
            // Nothing to flush (no data is buffered here) and no locks to drop:
            // declining makes the kernel stop sending FLUSH at every close.
            return reply.error(fuser::Errno::ENOSYS);
        }
        if self.writable(ino.0).is_err() {
            // A snapshot's node holds no locks. Not ENOSYS: the kernel takes
            // that for the whole connection (`fc->no_flush`), and every later
            // close of a live file would then keep its process's locks.
            return reply.ok();
        }
        // Close-to-open: the writes are the tree's before the locks go, so
        // that whoever takes a lock next reads them.
        let r = if T::SHARED {
            self.fs.get().flush(ino.0)
        } else {
            Ok(())
        };
        // close(2) by a process drops all of its record locks on the file.
        // Every close sends a FLUSH: skip the engine until anyone has locked.
        if self.engine_locks && self.any_locks.load(Ordering::Acquire) {
            self.fs.get().release_locks(ino.0, lock_owner.0);
        }
        Self::empty(reply, r);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if self.writable(ino.0).is_err() {
            return reply.ok();
        }
        if let Some(owner) = lock_owner {
            self.fs.get().release_locks(ino.0, owner.0);
        }
        if self.any_locks.load(Ordering::Acquire) {
            let owners = self
                .lock_owners
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&fh.0);
            // The end of an open file description ends its OFD locks.
            for owner in owners.into_iter().flatten() {
                self.fs.get().release_locks(ino.0, owner);
            }
        }
        self.fs.get().release(ino.0);
        if let Some(b) = &self.backing {
            if fh.0 & PASSTHROUGH_FH == 0 {
                b.fuse_released(ino.0);
            } else if let Some(bk) = b.get(ino.0) {
                bk.pt_released();
            }
            b.maybe_drop(&*self.fs.get(), ino.0);
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        if self.writable(ino.0).is_err() {
            return reply.ok();
        }
        Self::empty(reply, self.fs.get().fsync(ino.0));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // With NO_OPENDIR_SUPPORT negotiated, this answer makes the kernel stop
        // sending OPENDIR and RELEASEDIR; older kernels treat ENOSYS as an error.
        if self.no_opendir.load(Ordering::Relaxed) {
            return reply.error(fuser::Errno::ENOSYS);
        }
        let a = match snapdir::classify(ino.0) {
            Node::Live(i) => self.fs.get().getattr(i),
            node => self.snap_getattr(node),
        };
        match a {
            Ok(a) if a.kind == FileType::Directory => {
                reply.opened(FileHandle(0), FopenFlags::empty())
            }
            Ok(_) => reply.error(fuser::Errno::ENOTDIR),
            Err(e) => reply.error(err(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let node = snapdir::classify(ino.0);
        if node != Node::Live(ino.0) {
            return match self.snap_readdir(node, offset, &mut reply) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(err(e)),
            };
        }
        let root = ino.0 == memfs_fs::ROOT_INO;
        let mut full = false;
        let r = if offset >= snapdir::SNAPDIR_ENTRY_OFFSET {
            Ok(())
        } else {
            self.fs.get().readdir(ino.0, offset, |e| {
                // A live node of the snapshot directory's name is shadowed.
                if root && self.is_snapdir_name(ino.0, e.name) {
                    return true;
                }
                full = reply.add(
                    INodeNo(e.ino),
                    e.offset,
                    kind(e.kind),
                    OsStr::from_bytes(e.name),
                );
                !full
            })
        };
        if r.is_ok() && root && !full && self.snapdir_entry_due(offset) {
            let _ = reply.add(
                INodeNo(snapdir::SNAPDIR),
                snapdir::SNAPDIR_ENTRY_OFFSET,
                fuser::FileType::Directory,
                OsStr::from_bytes(&self.snapdir_name),
            );
        }
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let node = snapdir::classify(ino.0);
        if node != Node::Live(ino.0) {
            return match self.snap_readdirplus(node, offset, &mut reply) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(err(e)),
            };
        }
        let root = ino.0 == memfs_fs::ROOT_INO;
        let mut full = false;
        let r = if offset >= snapdir::SNAPDIR_ENTRY_OFFSET {
            Ok(())
        } else {
            self.fs.get().readdirplus(ino.0, offset, |e, a| {
                // A shadowed live node (accepted unseen: false would end the listing).
                if root && self.is_snapdir_name(ino.0, e.name) {
                    return true;
                }
                full = reply.add(
                    INodeNo(e.ino),
                    e.offset,
                    OsStr::from_bytes(e.name),
                    &self.entry_ttl,
                    &self.attr(*a),
                    GENERATION,
                );
                !full
            })
        };
        if r.is_ok()
            && root
            && !full
            && self.snapdir_entry_due(offset)
            && let Ok(a) = self.snapdir_attr()
        {
            let _ = reply.add(
                INodeNo(snapdir::SNAPDIR),
                snapdir::SNAPDIR_ENTRY_OFFSET,
                OsStr::from_bytes(&self.snapdir_name),
                &self.entry_ttl,
                &fuse_attr(&a),
                GENERATION,
            );
        }
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
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
        if self.writable(ino.0).is_err() {
            return reply.ok();
        }
        Self::empty(reply, self.fs.get().fsync(ino.0));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        if stall_statfs() {
            tracing::warn!("{STALL_STATFS_ENV} is set: this statfs is never answered");
            loop {
                std::thread::park();
            }
        }
        let mut s = self.fs.get().statfs();
        if let Some((used, avail)) = self.backing.as_ref().and_then(|b| b.usage()) {
            // One capacity for both: the engine's pages and the backing files.
            let bs = s.bsize as u64;
            let used = s.blocks - s.bfree + used.div_ceil(bs);
            s.bfree = s.blocks.saturating_sub(used).min(avail / bs);
            s.bavail = s.bfree;
        }
        reply.statfs(
            s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
        );
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        // Setting an access ACL clears setgid when the caller is not in the
        // file's group. The kernel would say so only with FUSE_SETXATTR_EXT,
        // whose longer request the vendored fuser cannot parse, so the
        // engine asks /proc, as for fallocate.
        let caller = ctx(req);
        let r = self
            .writable(ino.0)
            .and(XattrMode::from_flags(flags))
            .and_then(|m| {
                self.fs.get().setxattr_as(
                    caller,
                    &caller_in_group(caller),
                    ino.0,
                    name.as_bytes(),
                    value,
                    m,
                )
            });
        Self::empty(reply, self.settled(r));
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let r = match snapdir::classify(ino.0) {
            Node::Live(i) => self.fs.get().getxattr(i, name.as_bytes()),
            node => self.snap_getxattr(node, name.as_bytes()),
        };
        xattr_reply(reply, size, r);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let r = match snapdir::classify(ino.0) {
            Node::Live(i) => self.fs.get().listxattr(i),
            node => self.snap_listxattr(node),
        };
        xattr_reply(reply, size, r);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self
            .writable(ino.0)
            .and_then(|()| self.fs.get().removexattr(ino.0, name.as_bytes()));
        Self::empty(reply, self.settled(r));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        if self.declines_open() {
            // The kernel then creates with MKNOD and opens with no message
            // (`fc->no_create`): LOOKUP + MKNOD instead of LOOKUP + CREATE and
            // a RELEASE at close. O_CREAT holds the parent's lock across the
            // lookup and the mknod, so no racing creator can turn a plain
            // O_CREAT into EEXIST on this kernel.
            return reply.error(fuser::Errno::ENOSYS);
        }
        let excl = flags & libc::O_EXCL != 0;
        let r = self.settled(self.new_name(parent.0, name.as_bytes()).and_then(|()| {
            self.fs
                .get()
                .create_umask(ctx(req), parent.0, name.as_bytes(), mode, excl, umask)
        }));
        match r {
            Ok((a, _)) => self.reply_created(a, reply),
            Err(e) => reply.error(err(e)),
        }
    }

    /// `open(dir, O_TMPFILE)` (Linux 6.1+): answered as a create is, with a
    /// node that has no link. The kernel enforces `O_EXCL` (no later link)
    /// itself; the engine is told too, so that its own `link` agrees.
    fn tmpfile(
        &self,
        req: &Request,
        parent: INodeNo,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let excl = flags & libc::O_EXCL != 0;
        // With FUSE_DONT_MASK the kernel leaves the umask to the server, as for create.
        let r = self.settled(self.writable(parent.0).and_then(|()| {
            self.fs
                .get()
                .tmpfile_umask(ctx(req), parent.0, mode, umask, excl)
        }));
        match r {
            Ok(a) => self.reply_created(a, reply),
            Err(e) => reply.error(err(e)),
        }
    }

    fn getlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        if self.writable(ino.0).is_err() {
            return reply.error(fuser::Errno::ENOLCK);
        }
        match self
            .fs
            .get()
            .getlk(ino.0, lock_owner.0, start, end, typ, pid)
        {
            Ok(l) => reply.locked(l.start, l.end, l.typ, l.pid),
            Err(e) => reply.error(err(e)),
        }
    }

    fn interrupt(&self, _req: &Request, unique: fuser::RequestId) -> Result<(), fuser::Errno> {
        // Only lock waits block for long; anything else finishes by itself.
        let ino = self
            .waits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&unique.0)
            .copied();
        match ino {
            Some(ino) if self.fs.get().cancel_lock_wait(ino, unique.0) => Ok(()),
            // Not parked yet (or already answered: then the kernel drops this reply).
            _ => Err(fuser::Errno::EAGAIN),
        }
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        if self.writable(ino.0).is_err() {
            return reply.error(fuser::Errno::ENOLCK);
        }
        if typ != libc::F_UNLCK {
            self.note_lock_owner(fh, lock_owner.0);
        }
        if sleep {
            // The reply travels with the waiter and is sent by whichever thread
            // grants the lock: no worker sleeps while a lock is held elsewhere.
            let unique = req.unique().0;
            self.waits
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(unique, ino.0);
            let waits = self.waits.clone();
            self.fs.get().setlkw(
                ino.0,
                lock_owner.0,
                start,
                end,
                typ,
                pid,
                unique,
                Box::new(move |r| {
                    waits
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&unique);
                    Self::empty(reply, r)
                }),
            );
        } else {
            Self::empty(
                reply,
                self.fs
                    .get()
                    .setlk(ino.0, lock_owner.0, start, end, typ, pid),
            );
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        // The kernel leaves killing setuid/setgid on fallocate to us
        // (HANDLE_KILLPRIV_V2), but unlike WRITE's FUSE_WRITE_KILL_SUIDGID,
        // FALLOCATE carries no flag saying whether the caller has CAP_FSETID
        // (`fuse_fallocate_in` is fh, offset, length, mode): root is taken
        // to have it.
        if let Err(e) = self.writable(ino.0) {
            return reply.error(err(e));
        }
        let caller = ctx(req);
        let kill = caller.uid != 0;
        let drops = self.privileges_may_drop(kill, ino.0);
        let r = FallocateMode::from_bits(mode).and_then(|m| match self.backed(ino.0) {
            None => self.fs.get().fallocate_as(
                caller,
                &caller_in_group(caller),
                kill,
                ino.0,
                offset,
                length,
                m,
            ),
            Some(b) => {
                if length == 0 {
                    return Err(Errno::EINVAL);
                }
                if offset
                    .checked_add(length)
                    .is_none_or(|e| e > i64::MAX as u64)
                {
                    return Err(Errno::EFBIG);
                }
                b.fallocate(offset, length, m.keep_size, m.punch_hole, m.zero_range)?;
                self.touch(caller, kill, ino.0)
            }
        });
        if drops && r.is_ok() {
            self.attributes_changed(ino.0);
        }
        Self::empty(reply, self.settled(r));
    }

    /// Inode flags (`chattr`/`lsattr`). The kernel sends these ioctls from
    /// `fuse_fileattr_get/set` (fs/fuse/ioctl.c) after its own checks
    /// (owner, CAP_LINUX_IMMUTABLE): FS_IOC_GETFLAGS/SETFLAGS with an
    /// `unsigned int` (4 bytes, though the command number is encoded with
    /// `long`; 8 bytes are accepted too) and FS_IOC_FSGETXATTR/FSSETXATTR
    /// with a `struct fsxattr` (28 bytes). Both reach regular files and
    /// directories without FUSE_IOCTL_DIR, which only gates ioctls the VFS
    /// does not handle itself. Anything else is ENOTTY.
    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        const GETFLAGS: [u32; 2] = [0x8008_6601, 0x8004_6601];
        const SETFLAGS: [u32; 2] = [0x4008_6602, 0x4004_6602];
        const FSGETXATTR: u32 = 0x801c_581f;
        const FSSETXATTR: u32 = 0x401c_5820;
        const FSXATTR_LEN: usize = 28;
        if self.writable(ino.0).is_err() {
            // The engine keeps no flags for snapshot nodes' readers to see.
            return reply.error(fuser::Errno::from_i32(libc::ENOTTY));
        }
        let fs = self.fs.get();
        let u32_at = |b: &[u8], at: usize| -> memfs_fs::Result<u32> {
            b.get(at..at + 4)
                .map(|v| u32::from_le_bytes(v.try_into().expect("4 bytes")))
                .ok_or(Errno::EINVAL)
        };
        let r: memfs_fs::Result<Vec<u8>> = match cmd {
            c if GETFLAGS.contains(&c) => fs.get_flags(ino.0).map(|f| {
                let mut out = (f as u64).to_le_bytes().to_vec();
                out.truncate(out_size as usize);
                out
            }),
            c if SETFLAGS.contains(&c) => u32_at(in_data, 0)
                .and_then(|f| self.settled(fs.set_flags(ctx(req), ino.0, f)))
                .map(|_| Vec::new()),
            FSGETXATTR => fs.get_flags(ino.0).map(|f| {
                let mut out = vec![0; FSXATTR_LEN];
                out[..4].copy_from_slice(&memfs_fs::flags_to_xflags(f).to_le_bytes());
                out.truncate(out_size as usize);
                out
            }),
            FSSETXATTR => {
                // extsize, nextents, projid and cowextsize must stay zero:
                // tmpfs refuses them too (fileattr_has_fsx).
                let extra = (1..5).any(|i| u32_at(in_data, 4 * i).is_ok_and(|v| v != 0));
                u32_at(in_data, 0)
                    .and_then(|x| {
                        if extra {
                            Err(Errno::EOPNOTSUPP)
                        } else {
                            memfs_fs::xflags_to_flags(x)
                        }
                    })
                    .and_then(|f| self.settled(fs.set_flags(ctx(req), ino.0, f)))
                    .map(|_| Vec::new())
            }
            _ => Err(Errno(libc::ENOTTY)),
        };
        match r {
            Ok(out) => {
                if matches!(cmd, c if SETFLAGS.contains(&c) || c == FSSETXATTR) {
                    // The ctime changed behind the kernel's attribute cache.
                    self.attributes_changed(ino.0);
                }
                reply.ioctl(0, &out)
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        if offset < 0 {
            return reply.error(fuser::Errno::ENXIO);
        }
        if let node @ (Node::Snap { .. } | Node::SnapDir) = snapdir::classify(ino.0) {
            // Without a map of a snapshot's holes: all data, as a file system
            // without SEEK_HOLE support answers.
            let r = self.snap_getattr(node).and_then(|a| match whence {
                libc::SEEK_DATA if (offset as u64) < a.size => Ok(offset as u64),
                libc::SEEK_HOLE if (offset as u64) < a.size => Ok(a.size),
                libc::SEEK_DATA | libc::SEEK_HOLE => Err(Errno::ENXIO),
                _ => Err(Errno::EINVAL),
            });
            return match r {
                Ok(o) => reply.offset(o as i64),
                Err(e) => reply.error(err(e)),
            };
        }
        let r = match self.backed(ino.0) {
            Some(b) => b.seek(offset as u64, whence),
            None => self.fs.get().lseek(ino.0, offset as u64, whence),
        };
        match r {
            Ok(o) => reply.offset(o as i64),
            Err(e) => reply.error(err(e)),
        }
    }

    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        // The kernel caps one request; it loops for larger copies.
        let len = len.min(u32::MAX as u64 & !0xfff);
        if let Err(e) = self.writable(ino_out.0) {
            return reply.error(err(e));
        }
        if self.writable(ino_in.0).is_err() {
            // From a snapshot: the kernel copies through read and write.
            return reply.error(fuser::Errno::EXDEV);
        }
        // The destination loses setuid/setgid as by a write; the kernel
        // marks its size and times stale after the copy, not its mode. As
        // for FALLOCATE, no flag says whether the caller has CAP_FSETID:
        // root is taken to have it.
        let caller = ctx(req);
        let drops = self.privileges_may_drop(caller.uid != 0, ino_out.0);
        let (b_in, b_out) = (self.backed(ino_in.0), self.backed(ino_out.0));
        let r = if b_in.is_some() || b_out.is_some() {
            self.copy_backed(
                caller,
                (ino_in.0, b_in.as_deref(), offset_in),
                (ino_out.0, b_out.as_deref(), offset_out),
                len,
            )
        } else {
            self.fs.get().copy_file_range_as(
                caller,
                &caller_in_group(caller),
                ino_in.0,
                offset_in,
                ino_out.0,
                offset_out,
                len,
            )
        };
        match self.settled(r) {
            Ok(n) => {
                if drops {
                    self.attributes_changed(ino_out.0);
                }
                reply.written(n as u32)
            }
            Err(e) => reply.error(err(e)),
        }
    }
}

/// A WRITE's data as fuser hands it over: one buffer, or pages the engine
/// may keep (`Config::paged_writes`).
enum WriteData<'a> {
    Bytes(&'a [u8]),
    Pages(&'a mut WritePages),
}

impl<T: Tree> MemFuse<T> {
    // A WRITE's arguments, its data either way.
    #[allow(clippy::too_many_arguments)]
    fn write_from(
        &self,
        req: &Request,
        ino: INodeNo,
        offset: u64,
        data: WriteData<'_>,
        write_flags: WriteFlags,
        flags: OpenFlags,
        reply: ReplyWrite,
    ) {
        // With writeback caching the kernel places every page itself; honouring
        // O_APPEND here too would move cached pages to the end of the file.
        let append = !self.writeback && flags.0 & libc::O_APPEND != 0;
        if let Err(e) = self.writable(ino.0) {
            return reply.error(err(e));
        }
        let direct = flags.0 & libc::O_DIRECT != 0;
        if !direct {
            // Write-through leaves these bytes in the page cache (dio.rs).
            self.dio.note_cached(ino.0);
        }
        // The caller's ids once per request: under allow_idmap each
        // ctx() may read /proc.
        let caller = ctx(req);
        // With HANDLE_KILLPRIV_V2 the kernel says whether the writer lacks
        // CAP_FSETID, which its uid does not tell (root with the capability
        // dropped, a user granted it). Writes from the page cache never
        // carry it: the kernel writes through, flagged, when they would kill.
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        let drops = self.privileges_may_drop(kill, ino.0);
        let in_group = caller_in_group(caller);
        let r = match (self.backed(ino.0), data) {
            (Some(b), data) => self.write_backed(&b, data, append, offset, (caller, kill), ino.0),
            (None, WriteData::Bytes(data)) => self
                .fs
                .get()
                .write_as(caller, &in_group, kill, ino.0, offset, data, append)
                .map_err(stale),
            (None, WriteData::Pages(p)) => {
                let len = p.len();
                self.fs
                    .get()
                    .write_pages_as(
                        caller,
                        &in_group,
                        kill,
                        ino.0,
                        offset,
                        len,
                        p.pages_mut(),
                        append,
                    )
                    .map_err(stale)
            }
        };
        match self.settled(r) {
            Ok(n) => {
                if drops {
                    self.attributes_changed(ino.0);
                }
                if direct {
                    let at = (!append).then_some(offset);
                    self.dio.written(ino.0, at, n as u32, reply)
                } else {
                    reply.written(n as u32)
                }
            }
            Err(e) => reply.error(err(e)),
        }
    }

    /// A WRITE to a file that has a backing file: the data goes there (at
    /// its end for `append`), the engine keeps the times and privileges.
    #[inline]
    fn write_backed(
        &self,
        b: &passthrough::Backed,
        data: WriteData<'_>,
        append: bool,
        offset: u64,
        (caller, kill): (Ctx, bool),
        ino: u64,
    ) -> memfs_fs::Result<usize> {
        let copy;
        let data = match data {
            WriteData::Bytes(d) => d,
            WriteData::Pages(p) => {
                copy = p.to_vec();
                &copy[..]
            }
        };
        (if append { b.size() } else { Ok(offset) })
            .and_then(|off| b.write_at(off, data))
            .and_then(|n| self.touch(caller, kill, ino).map(|()| n))
    }

    /// copy_file_range where either side is a backing file: kernel to kernel
    /// between two backing files, else through a buffer.
    fn copy_backed(
        &self,
        caller: Ctx,
        (ino_in, b_in, off_in): (u64, Option<&passthrough::Backed>, u64),
        (ino_out, b_out, off_out): (u64, Option<&passthrough::Backed>, u64),
        len: u64,
    ) -> memfs_fs::Result<u64> {
        // As Linux: clamp to the source's size once, and refuse overlapping
        // ranges of one file.
        let size_in = match b_in {
            Some(b) => b.size()?,
            None => self.fs.get().getattr(ino_in)?.size,
        };
        let len = len.min(size_in.saturating_sub(off_in));
        if ino_in == ino_out
            && off_in < off_out.saturating_add(len)
            && off_out < off_in.saturating_add(len)
        {
            return Err(Errno::EINVAL);
        }
        let done = match (b_in, b_out) {
            (Some(i), Some(o)) => i.copy_to(off_in, o, off_out, len)?,
            _ => {
                const CHUNK: u64 = 1 << 20;
                let mut buf = Vec::new();
                let mut done = 0;
                while done < len {
                    buf.resize((len - done).min(CHUNK) as usize, 0);
                    let n = match b_in {
                        Some(b) => b.read_at(off_in + done, &mut buf)?,
                        None => self.fs.get().read_atime(
                            ino_in,
                            off_in + done,
                            &mut buf,
                            self.atime.effective(),
                        )?,
                    };
                    if n == 0 {
                        break;
                    }
                    match b_out {
                        Some(b) => b.write_at(off_out + done, &buf[..n])?,
                        None => self.fs.get().write_as(
                            caller,
                            &caller_in_group(caller),
                            caller.uid != 0,
                            ino_out,
                            off_out + done,
                            &buf[..n],
                            false,
                        )?,
                    };
                    done += n as u64;
                }
                done
            }
        };
        if b_out.is_some() && done > 0 {
            self.touch(caller, caller.uid != 0, ino_out)?;
        }
        Ok(done)
    }
}

fn xattr_reply(reply: ReplyXattr, size: u32, r: memfs_fs::Result<Vec<u8>>) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(fuser::Errno::ERANGE),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(err(e)),
    }
}

/// For a test only: a server started with this variable set never answers
/// a statfs, so that a test can kill it while one of its own calls on its
/// mount waits for the reply (crates/cli/tests/disk_faults.rs).
pub const STALL_STATFS_ENV: &str = "MEMFS_TEST_STALL_STATFS";

fn stall_statfs() -> bool {
    static STALL: OnceLock<bool> = OnceLock::new();
    *STALL.get_or_init(|| std::env::var_os(STALL_STATFS_ENV).is_some())
}
