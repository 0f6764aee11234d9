//! `memfs mount` and `memfs umount`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use memfs_fs::{Config, Fs};
use memfs_fuse::MountOptions;
use memfs_fuse::mounts::unescape_mount_path;
pub use memfs_fuse::mounts::{is_mounted, is_root};

use crate::serving::{UnmountOnSignal, parse_secs, parse_size, report_ready};
use crate::{mount_table, remount_options};

/// Set in the background server process: its standard output is a pipe on
/// which it reports the outcome of mounting to the process that started it.
const NOTIFY_ENV: &str = "MEMFS_NOTIFY_PARENT";

#[derive(clap::Args, Debug, Clone)]
pub struct MountArgs {
    /// Directory to mount on (must exist).
    pub mountpoint: PathBuf,
    /// Capacity for file data, e.g. 512M, 4G, or a percentage of RAM like 50% (default: half of RAM).
    #[arg(long)]
    pub size: Option<String>,
    /// Largest number of inodes (default: one per 4 KiB page of the size).
    #[arg(long)]
    pub inodes: Option<String>,
    /// FUSE worker threads (default: one per CPU, at least 2).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Let the kernel cache writes and flush them in the background.
    #[arg(long)]
    pub writeback_cache: bool,
    /// Let other users access the mount.
    #[arg(long)]
    pub allow_other: bool,
    /// Let idmapped mounts of this mount be made (mount_setattr
    /// MOUNT_ATTR_IDMAP; Linux 6.12+). Off by default: every request then
    /// costs memfs a read of /proc to learn its caller's ids.
    #[arg(long)]
    pub allow_idmap: bool,
    /// Seconds the kernel may cache names.
    #[arg(long, value_name = "SECS")]
    pub entry_timeout: Option<f64>,
    /// Seconds the kernel may cache attributes.
    #[arg(long, value_name = "SECS")]
    pub attr_timeout: Option<f64>,
    /// Who keeps POSIX record locks: kernel (default; as on tmpfs, and opens and
    /// closes cost no FUSE message) or engine (every lock, open and close goes
    /// to memfs).
    #[arg(long, value_name = "MODE")]
    pub locks: Option<String>,
    /// Serve requests through per-CPU io_uring queues (FUSE over io_uring,
    /// Linux 6.14+) when the kernel offers it (root: echo Y >
    /// /sys/module/fuse/parameters/enable_uring); /dev/fuse otherwise, and
    /// always with --locks engine (a blocked lock request would hold a ring
    /// entry).
    #[arg(long)]
    pub io_uring: bool,
    /// Microseconds that one worker keeps polling /dev/fuse for the next
    /// request after a short one, before it sleeps (default 50, at most
    /// 1000; 0: never).
    /// Saves waking a worker on another, halted CPU per round trip; costs
    /// CPU only while requests keep coming.
    #[arg(long, value_name = "MICROS")]
    pub poll_us: Option<u64>,
    /// How file data travels: fuse (every read and write is a request to
    /// memfs), passthrough (the kernel reads and writes a backing file in a
    /// private tmpfs itself: needs root and Linux 6.9+; falls back to fuse
    /// with a warning), or auto (passthrough where available, else fuse).
    /// Default: fuse. A --data-dir mount always uses fuse: every
    /// acknowledged write must be journaled; so does --writeback-cache.
    #[arg(long, value_name = "PATH")]
    pub data_path: Option<String>,
    /// On the fuse data path, copy each write's data out of the request
    /// buffer into the file instead of reading it into pages the file
    /// keeps (the default: one copy per byte instead of two). For
    /// comparison.
    #[arg(long)]
    pub copy_writes: bool,
    /// Whether readdir of the root lists the snapshot directory: hidden
    /// (default; `cd .snapshots` works anyway) or visible.
    #[arg(long, value_name = "hidden|visible")]
    pub snapdir: Option<String>,
    /// The name of the snapshot directory in the root (default .snapshots).
    #[arg(long, value_name = "NAME")]
    pub snapdir_name: Option<String>,
    /// Stay in the foreground (for service managers); SIGINT and SIGTERM unmount.
    #[arg(long, short = 'f')]
    pub foreground: bool,
    /// Make the file system durable in this directory (created if missing):
    /// every change is journaled, and mounting it again restores the contents.
    #[arg(long, value_name = "PATH")]
    pub data_dir: Option<PathBuf>,
    /// With --data-dir: none | sync | async[=N] | relaxed=N | async-relaxed[=N] (default sync:
    /// an operation returns once it is on stable storage).
    #[arg(long, value_name = "MODE")]
    pub durability: Option<String>,
    /// With --data-dir: write a checkpoint this often when anything changed (e.g. 30s, 5m; default 5m).
    #[arg(long, value_name = "DURATION")]
    pub checkpoint_interval: Option<String>,
    /// With --data-dir: how far back history reaches: commits=N, age=DURATION, bytes=SIZE
    /// (comma-separated), or all (default age=1h).
    #[arg(long, value_name = "LIMITS")]
    pub retention: Option<String>,
    /// Mount a memfs volume kept in this Redis Cluster instead of a tree of
    /// this process: redis://HOST:PORT[,HOST:PORT...] (any of its nodes).
    /// Needs --volume (created with memfs volume create). Any number of
    /// mounts, on any machines, serve the same tree.
    #[arg(long, value_name = "URL", requires = "volume")]
    pub cluster: Option<String>,
    /// With --cluster: the volume to mount.
    #[arg(long, value_name = "NAME", requires = "cluster")]
    pub volume: Option<String>,
    /// With --cluster: bytes of data blocks and metadata this mount caches
    /// (e.g. 256M, 4G; default 1G).
    #[arg(long, value_name = "SIZE")]
    pub cache_size: Option<String>,
    /// With --cluster: seconds any call to the cluster may take before it
    /// fails with EIO (default 30).
    #[arg(long, value_name = "SECS")]
    pub cluster_timeout: Option<String>,
    /// With --cluster: seconds of this mount's session lease (default 20):
    /// how long its locks outlive it if it dies. For tests.
    #[arg(long, value_name = "SECS", hide = true)]
    pub lease_secs: Option<String>,
    /// Mount options, comma-separated: size=, inodes= (or nr_inodes=), threads=,
    /// writeback_cache, allow_other, allow_idmap, io_uring, copy_writes, poll_us=, data_path=, entry_timeout=, attr_timeout=, locks=, data_dir=, durability=,
    /// checkpoint_interval=, retention=, cluster= (its HOST:PORT list may go on after
    /// commas), volume=, cache_size=, cluster_timeout=, and kernel options (ro, noexec, ...).
    #[arg(short = 'o', value_name = "OPTIONS")]
    pub options: Vec<String>,
    /// Set when mount(8) runs memfs as its helper: the source argument (the
    /// device column of /proc/mounts); the helper prints nothing on success.
    #[arg(long, hide = true, value_name = "SOURCE")]
    pub helper_source: Option<String>,
}

#[derive(clap::Args, Debug)]
pub struct UmountArgs {
    /// The mount point to unmount.
    pub mountpoint: PathBuf,
    /// Detach now even if busy, clean up when no longer in use.
    #[arg(long, short = 'l')]
    pub lazy: bool,
}

/// Fully resolved mount settings.
struct Settings {
    config: Config,
    fuse: MountOptions,
    /// The data directory and its options; `None`: a pure in-memory mount.
    durable: Option<(PathBuf, memfs_durable::Options)>,
    /// `-o remount`: change the running mount's flags to these instead of mounting.
    remount: Option<nix::mount::MsFlags>,
    /// `--cluster`/`--volume`: the volume to serve instead of a tree of ours.
    volume: Option<crate::volume_mount::VolumeSettings>,
}

fn parse_count(s: &str) -> anyhow::Result<u64> {
    let v = parse_size::Config::new()
        .parse_size(s.trim())
        .map_err(|e| anyhow::anyhow!("invalid inode count {s:?}: {e}"))?;
    if v < 2 {
        bail!("invalid inode count {s:?}: must be at least 2");
    }
    Ok(v)
}

fn parse_locks(name: &str, s: &str) -> anyhow::Result<memfs_fuse::LockMode> {
    s.parse()
        .map_err(|e: String| anyhow::anyhow!("{name}: {e}"))
}

fn parse_data_path(name: &str, s: &str) -> anyhow::Result<memfs_fuse::DataPath> {
    s.parse()
        .map_err(|e: String| anyhow::anyhow!("{name}: {e}"))
}

fn parse_snapdir(name: &str, s: &str) -> anyhow::Result<bool> {
    match s {
        "visible" => Ok(true),
        "hidden" => Ok(false),
        _ => bail!("{name}: {s:?} is neither hidden nor visible"),
    }
}

/// The longest poll accepted: beyond a millisecond a poll no longer saves a
/// wake-up worth its CPU (a wake-up costs tens of µs).
const MAX_POLL_US: u64 = 1_000;

fn parse_poll_us(name: &str, s: &str) -> anyhow::Result<Duration> {
    let us: u64 = s
        .parse()
        .ok()
        .filter(|us| *us <= MAX_POLL_US)
        .with_context(|| {
            format!("invalid {name} {s:?}: expected microseconds from 0 to {MAX_POLL_US}")
        })?;
    Ok(Duration::from_micros(us))
}

/// Options that /etc/fstab and mount(8) pass along but that mean nothing here.
const IGNORED_OPTIONS: &[&str] = &[
    "defaults",
    // mount.fuse3 and the kernel add these; memfs always checks permissions
    // in the kernel.
    "default_permissions",
    "user_id",
    "group_id",
    "rootmode",
    "blksize",
    "max_read",
    // The engine never updates a directory's atime (readdir records no
    // access), as with nodiratime; norelatime and nostrictatime leave
    // Linux's default, relatime.
    "nodiratime",
    "diratime",
    "nostrictatime",
    "iversion",
    "noiversion",
    "mand",
    "nomand",
    "auto",
    "noauto",
    "user",
    "users",
    "nouser",
    "nofail",
    "_netdev",
    "norelatime",
    "lazytime",
    "nolazytime",
    "silent",
    "loud",
];

/// What the flags and `-o` ask for beyond the FUSE options, as given (a
/// `-o` value overrides its flag); [`MountArgs::settings`] resolves it.
pub(crate) struct Requested {
    size: Option<u64>,
    inodes: Option<u64>,
    pub(crate) data_dir: Option<PathBuf>,
    pub(crate) durability: Option<String>,
    pub(crate) interval: Option<String>,
    pub(crate) retention: Option<String>,
    remount: bool,
    /// What `--cluster` and its company ask for (volume_mount.rs resolves it).
    pub(crate) volume: crate::volume_mount::Requested,
    /// Whether any option that only a tree of this process has was given
    /// (size, inodes, snapshot directory): a volume mount refuses them.
    pub(crate) local_only: Vec<&'static str>,
}

impl MountArgs {
    fn settings(&self) -> anyhow::Result<Settings> {
        let mut req = Requested {
            size: self.size.as_deref().map(parse_size).transpose()?,
            inodes: self.inodes.as_deref().map(parse_count).transpose()?,
            data_dir: self.data_dir.clone(),
            durability: self.durability.clone(),
            interval: self.checkpoint_interval.clone(),
            retention: self.retention.clone(),
            remount: false,
            volume: crate::volume_mount::Requested {
                cluster: self.cluster.clone(),
                volume: self.volume.clone(),
                cache_size: self.cache_size.clone(),
                timeout: self.cluster_timeout.clone(),
                lease: self.lease_secs.clone(),
                kernel_locks: self.locks.as_deref() == Some("kernel"),
            },
            local_only: self.local_only_flags(),
        };
        let mut fuse = self.fuse_flags()?;
        let opts: Vec<&str> = self
            .options
            .iter()
            .flat_map(|o| o.split(','))
            .filter(|o| !o.is_empty())
            .collect();
        let mut in_cluster = false;
        for opt in opts {
            // `-o cluster=redis://a:1,b:2`: the list goes on after the comma.
            if in_cluster && crate::volume_mount::is_seed(opt) {
                req.volume.add_seed(opt);
                continue;
            }
            in_cluster = opt.starts_with("cluster=");
            apply_option(opt, &mut fuse, &mut req)?;
        }
        memfs_fuse::snapdir::check_dir_name(&fuse.snapdir_name).map_err(anyhow::Error::msg)?;
        if fuse.threads == 0 {
            bail!("--threads must be at least 1");
        }
        let remount = req
            .remount
            .then(|| remount_options::mount_flags(self.options.iter().flat_map(|o| o.split(','))));
        let mut config = Config::default();
        if let Some(s) = req.size {
            config.capacity = s;
            config.max_inodes = (s / memfs_fs::PAGE_SIZE as u64).max(1024);
        }
        if let Some(i) = req.inodes {
            config.max_inodes = i;
        }
        fuse.data_capacity = config.capacity;
        if req.data_dir.is_some() && fuse.data_path != memfs_fuse::DataPath::Fuse {
            if fuse.data_path == memfs_fuse::DataPath::Passthrough {
                tracing::warn!(
                    "--data-dir: serving the fuse data path (passthrough writes would bypass the journal)"
                );
            }
            fuse.data_path = memfs_fuse::DataPath::Fuse;
        }
        let volume = crate::volume_mount::settings(&req.volume, &req.local_only(), &mut fuse)?;
        Ok(Settings {
            config,
            fuse,
            durable: durable_settings(req)?,
            remount,
            volume,
        })
    }

    /// The flags (not `-o`) that only a tree of this process has.
    fn local_only_flags(&self) -> Vec<&'static str> {
        [
            (self.size.is_some(), "--size"),
            (self.inodes.is_some(), "--inodes"),
            (self.snapdir.is_some(), "--snapdir"),
            (self.snapdir_name.is_some(), "--snapdir-name"),
        ]
        .into_iter()
        .filter_map(|(given, name)| given.then_some(name))
        .collect()
    }

    /// The FUSE options the flags (not `-o`) ask for.
    fn fuse_flags(&self) -> anyhow::Result<MountOptions> {
        let mut fuse = MountOptions::default();
        if let Some(t) = self.threads {
            fuse.threads = t;
        }
        fuse.writeback_cache = self.writeback_cache;
        fuse.allow_other = self.allow_other;
        fuse.allow_idmap = self.allow_idmap;
        fuse.io_uring = self.io_uring;
        fuse.paged_writes = !self.copy_writes;
        if let Some(us) = self.poll_us {
            fuse.poll = parse_poll_us("--poll-us", &us.to_string())?;
        }
        if let Some(t) = self.entry_timeout {
            fuse.entry_timeout = parse_secs("--entry-timeout", &t.to_string())?;
        }
        if let Some(t) = self.attr_timeout {
            fuse.attr_timeout = parse_secs("--attr-timeout", &t.to_string())?;
        }
        if let Some(l) = &self.locks {
            fuse.locks = parse_locks("--locks", l)?;
        }
        if let Some(p) = &self.data_path {
            fuse.data_path = parse_data_path("--data-path", p)?;
        }
        if let Some(v) = &self.snapdir {
            fuse.snapdir_visible = parse_snapdir("--snapdir", v)?;
        }
        if let Some(n) = &self.snapdir_name {
            fuse.snapdir_name = n.as_bytes().to_vec();
        }
        if let Some(src) = &self.helper_source
            && !src.is_empty()
            && !src.contains([',', ' ', '\t', '\n', '\\'])
        {
            fuse.fsname = src.clone();
        }
        Ok(fuse)
    }
}

impl Requested {
    /// The options given that only a tree of this process has (its size,
    /// its snapshot directory, its data directory).
    fn local_only(&self) -> Vec<&'static str> {
        let mut given = self.local_only.clone();
        for (set, name) in [
            (self.data_dir.is_some(), "--data-dir"),
            (self.durability.is_some(), "--durability"),
            (self.interval.is_some(), "--checkpoint-interval"),
            (self.retention.is_some(), "--retention"),
        ] {
            if set {
                given.push(name);
            }
        }
        given
    }
}

/// One `-o` option, onto the FUSE options or what else it asks for.
// One piece: one arm per option memfs takes, the whole table in one place.
fn apply_option(opt: &str, fuse: &mut MountOptions, req: &mut Requested) -> anyhow::Result<()> {
    let (key, value) = match opt.split_once('=') {
        Some((k, v)) => (k, Some(v)),
        None => (opt, None),
    };
    let need = || value.with_context(|| format!("mount option {key} needs a value ({key}=...)"));
    match key {
        "size" => {
            req.size = Some(parse_size(need()?)?);
            req.local_only.push("size=");
        }
        "inodes" | "nr_inodes" => {
            req.inodes = Some(parse_count(need()?)?);
            req.local_only.push("inodes=");
        }
        "cluster" => req.volume.cluster = Some(need()?.to_string()),
        "volume" => req.volume.volume = Some(need()?.to_string()),
        "cache_size" => req.volume.cache_size = Some(need()?.to_string()),
        "cluster_timeout" => req.volume.timeout = Some(need()?.to_string()),
        "lease_secs" => req.volume.lease = Some(need()?.to_string()),
        "threads" => {
            fuse.threads = need()?
                .parse()
                .ok()
                .filter(|&t: &usize| t > 0)
                .with_context(|| format!("invalid threads {:?}", value.unwrap_or_default()))?
        }
        "writeback_cache" => fuse.writeback_cache = true,
        "allow_other" => fuse.allow_other = true,
        "allow_idmap" => fuse.allow_idmap = true,
        "io_uring" => fuse.io_uring = true,
        "copy_writes" => fuse.paged_writes = false,
        "poll_us" => fuse.poll = parse_poll_us("mount option poll_us", need()?)?,
        "data_path" => fuse.data_path = parse_data_path("mount option data_path", need()?)?,
        "entry_timeout" | "attr_timeout" => {
            let t = parse_secs(key, need()?)?;
            if key == "entry_timeout" {
                fuse.entry_timeout = t;
            } else {
                fuse.attr_timeout = t;
            }
        }
        "locks" => {
            fuse.locks = parse_locks("mount option locks", need()?)?;
            req.volume.kernel_locks = fuse.locks == memfs_fuse::LockMode::Kernel;
        }
        "fsname" => fuse.fsname = need()?.to_string(),
        "subtype" => fuse.subtype = need()?.to_string(),
        "data_dir" => req.data_dir = Some(PathBuf::from(need()?)),
        "durability" => req.durability = Some(need()?.to_string()),
        "checkpoint_interval" => req.interval = Some(need()?.to_string()),
        "retention" => req.retention = Some(need()?.to_string()),
        "remount" => req.remount = true,
        "snapdir" => {
            fuse.snapdir_visible = parse_snapdir("mount option snapdir", need()?)?;
            req.local_only.push("snapdir=");
        }
        "snapdir_name" => {
            fuse.snapdir_name = need()?.as_bytes().to_vec();
            req.local_only.push("snapdir_name=");
        }
        // The FUSE kernel never updates atime itself: the policy is
        // the engine's (noatime is also passed on as the mount flag).
        "relatime" | "strictatime" => {
            fuse.atime.apply([key]);
        }
        "atime" | "noatime" => {
            fuse.atime.apply([key]);
            fuse.extra.push(opt.to_string())
        }
        k if IGNORED_OPTIONS.contains(&k) || k.starts_with("x-") => {}
        "ro" | "rw" | "exec" | "noexec" | "suid" | "nosuid" | "dev" | "nodev" | "sync"
        | "async" | "dirsync" => {
            // Reading a read-only file system records no access
            // (generic/003), until a `remount,rw`.
            fuse.atime.apply([key]);
            fuse.extra.push(opt.to_string())
        }
        _ => bail!("unknown mount option {opt:?}"),
    }
    Ok(())
}

/// The data directory and its options; `None`: a pure in-memory mount.
fn durable_settings(req: Requested) -> anyhow::Result<Option<(PathBuf, memfs_durable::Options)>> {
    Ok(match req.data_dir {
        None => {
            if req.durability.is_some() || req.interval.is_some() || req.retention.is_some() {
                bail!(
                    "--durability, --checkpoint-interval and --retention need --data-dir (without it memfs keeps nothing)"
                );
            }
            None
        }
        Some(dir) => {
            use memfs_durable as durable;
            let mut o = durable::Options::default();
            if let Some(d) = req.durability {
                o.durability = durable::parse_durability(&d).map_err(|e| {
                    anyhow::anyhow!(
                        "invalid durability {d:?}: {e} (use none, sync, async, relaxed=N)"
                    )
                })?;
            }
            if let Some(i) = req.interval {
                let d = durable::parse_duration_arg(&i)
                    .map_err(|e| anyhow::anyhow!("invalid checkpoint interval: {e}"))?;
                o.checkpoint_interval = (!d.is_zero()).then_some(d);
            }
            if let Some(r) = req.retention {
                o.retention = r
                    .parse()
                    .map_err(|e| anyhow::anyhow!("invalid retention {r:?}: {e}"))?;
            }
            Some((dir, o))
        }
    })
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A mount point as `memfs mount` and `memfs clone` take it, canonical: an
/// existing directory that is not a mount point yet.
pub(crate) fn mount_point(mountpoint: &Path) -> anyhow::Result<PathBuf> {
    let meta = std::fs::metadata(mountpoint).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            anyhow::anyhow!(
                "mount point {} does not exist (create it with mkdir -p)",
                mountpoint.display()
            )
        }
        _ => anyhow::anyhow!("cannot access mount point {}: {e}", mountpoint.display()),
    })?;
    if !meta.is_dir() {
        bail!("mount point {} is not a directory", mountpoint.display());
    }
    let canon = mountpoint
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", mountpoint.display()))?;
    if is_mounted(&canon) {
        bail!(
            "{} is already a mount point (unmount it first: memfs umount {})",
            canon.display(),
            canon.display()
        );
    }
    Ok(canon)
}

/// Everything that can be checked before mounting, with messages a user can act on.
fn preflight(mountpoint: &Path) -> anyhow::Result<PathBuf> {
    let canon = mount_point(mountpoint)?;
    match std::fs::metadata("/dev/fuse") {
        Ok(m) if m.file_type().is_char_device() => {}
        _ => bail!(
            "/dev/fuse is missing: load the FUSE module (modprobe fuse) or run where FUSE is available"
        ),
    }
    if !is_root() && find_in_path("fusermount3").is_none() {
        bail!("fusermount3 not found: install the fuse3 package (apt-get install fuse3)");
    }
    Ok(canon)
}

/// `mount -o remount,...`: the kernel changes a FUSE mount's flags itself
/// (read-only is enforced by the VFS before a request reaches memfs), so the
/// helper only has to make the mount(2) call that mount(8) left to it.
fn remount(mountpoint: &Path, flags: nix::mount::MsFlags) -> anyhow::Result<()> {
    if !is_mounted(mountpoint) {
        bail!(
            "{} is not mounted: nothing to remount",
            mountpoint.display()
        );
    }
    if !is_root() {
        bail!(
            "remounting {} needs root (fusermount3 cannot remount)",
            mountpoint.display()
        );
    }
    nix::mount::mount::<str, Path, str, str>(None, mountpoint, None, flags, None)
        .with_context(|| format!("cannot remount {}", mountpoint.display()))
}

/// The other half of `mount -o remount,...`: the kernel does not tell a
/// FUSE server about a remount, and the server keeps the atime policy
/// (the kernel never updates a FUSE inode's atime), so the options that
/// change it (`noatime`, `relatime`, `strictatime`, `atime`, `ro`, `rw`),
/// in their order, go to the running server through its control socket.
fn remount_atime(mountpoint: &Path, options: &[String]) -> anyhow::Result<()> {
    let opts: Vec<&str> = options
        .iter()
        .flat_map(|o| o.split(','))
        .filter(|o| remount_options::ATIME_POLICY.contains(o))
        .collect();
    if opts.is_empty() {
        return Ok(());
    }
    crate::control::mount_request(mountpoint, &format!("remount {}", opts.join(",")))
        .with_context(|| {
            format!(
                "remounted {}, but its memfs server did not take the new atime policy",
                mountpoint.display()
            )
        })?;
    Ok(())
}

pub fn run_mount(args: MountArgs) -> anyhow::Result<()> {
    let settings = args.settings()?;
    if let Some(flags) = settings.remount {
        remount(&args.mountpoint, flags)?;
        return remount_atime(&args.mountpoint, &args.options);
    }
    let mountpoint = preflight(&args.mountpoint)?;
    let notify = std::env::var_os(NOTIFY_ENV).is_some();
    if !args.foreground && !notify {
        return spawn_background(&mountpoint, &settings, args.helper_source.is_some());
    }
    let result = serve(&mountpoint, settings, notify);
    if notify && let Err(e) = &result {
        // The parent is still waiting on our stdout for the outcome.
        let mut out = std::io::stdout();
        let _ = writeln!(out, "error: {e:#}");
        let _ = out.flush();
    }
    result
}

/// Starts a server process in its own session and waits until it reports
/// that the mount is usable (or why it is not).
fn spawn_background(mountpoint: &Path, settings: &Settings, quiet: bool) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the memfs executable")?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut child = Command::new(exe)
        .args(&args)
        .env(NOTIFY_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .context("cannot start the memfs server process")?;
    let out = child.stdout.take().expect("stdout is piped");
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).ok();
    let line = line.trim();
    if let Some(rest) = line.strip_prefix("ready") {
        if quiet {
            return Ok(());
        }
        if let Some(v) = &settings.volume {
            println!(
                "memfs: mounted volume {} of {} at {} ({} cache, {} threads; server pid {})",
                v.name,
                v.cluster,
                mountpoint.display(),
                crate::human::bytes(v.cache_size),
                settings.fuse.threads,
                child.id()
            );
            println!("memfs: unmount with: memfs umount {}", mountpoint.display());
            return Ok(());
        }
        let c = settings.config;
        let what = match &settings.durable {
            None => "in memory".to_string(),
            Some((dir, o)) => format!("durable in {}, {} mode", dir.display(), o.durability),
        };
        println!(
            "memfs: mounted at {} ({what}: {} capacity, {} inodes, {} threads; server pid {})",
            mountpoint.display(),
            crate::human::bytes(c.capacity),
            c.max_inodes,
            settings.fuse.threads,
            child.id()
        );
        if let Some(report) = rest.strip_prefix('\t') {
            println!("memfs: recovery: {report}");
        }
        println!(
            "memfs: use it like any directory; unmount with: memfs umount {}",
            mountpoint.display()
        );
        return Ok(());
    }
    let status = child.wait().ok();
    match line.strip_prefix("error: ") {
        Some(msg) => bail!("{msg}"),
        None => bail!("the memfs server exited before the mount was ready ({status:?})"),
    }
}

/// A durable mount's data directory, shared with the control socket.
type SharedDurable = Arc<std::sync::Mutex<memfs_durable::DurableFs>>;

fn serve(mountpoint: &Path, settings: Settings, notify: bool) -> anyhow::Result<()> {
    if notify {
        // Leave the starter's session so its terminal's signals and hangups pass us by.
        let _ = nix::unistd::setsid();
    }
    if let Some(v) = &settings.volume {
        return crate::volume_mount::serve(mountpoint, &settings.fuse, v, notify);
    }
    let (fs, durable, report) = open_tree(&settings)?;
    let fuse_opts = fuse_options(&settings);
    if !notify && let Some(r) = &report {
        // Before the mount appears: whoever sees the mount can read the report.
        eprintln!("memfs: recovery: {r}");
    }
    let mut mounted = memfs_fuse::mount(fs, mountpoint, &fuse_opts)
        .map_err(|e| anyhow::anyhow!("cannot mount memfs at {}: {e}", mountpoint.display()))?;
    if let Some(d) = &durable {
        // Before the first request: `.snapshots` shows the data
        // directory's snapshots, rebuilt when browsed.
        crate::control::show_durable_snapshots(
            &d.lock().unwrap_or_else(|e| e.into_inner()),
            &mounted.swapper(),
            true,
        );
    }
    let ro_watch = durable
        .as_ref()
        .map(|d| ReadOnlyWatch::start(&d.lock().unwrap_or_else(|e| e.into_inner()), mountpoint));
    // After the mount (the control socket can swap the served tree), before
    // it is reported ready.
    let clones = crate::control::Clones::default();
    let control = crate::control::serve(crate::control::Mount {
        mountpoint: mountpoint.to_path_buf(),
        durable: durable.clone(),
        swapper: mounted.swapper(),
        config: settings.config,
        fuse: fuse_opts.clone(),
        clones: clones.clone(),
    })?;
    let signals = UnmountOnSignal::start(mounted.unmounter(), mountpoint)?;
    report_ready(mountpoint, notify, report.as_deref())?;
    let result = mounted.run();
    signals.stop();
    let result = result.with_context(|| format!("serving {}", mountpoint.display()));
    drop(ro_watch);
    control.stop();
    // The origin's clones are served by this process: they go with it.
    clones.unmount_all();
    if let Some(d) = durable {
        close_data_dir(d)?;
    }
    result
}

/// The tree to serve: a new one, or the data directory's as recovered, with
/// the recovery report.
fn open_tree(
    settings: &Settings,
) -> anyhow::Result<(Arc<Fs>, Option<SharedDurable>, Option<String>)> {
    let Some((dir, opts)) = &settings.durable else {
        return Ok((Arc::new(Fs::new(settings.config)), None, None));
    };
    let (d, report) = open_taking_over(dir, settings.config, opts)
        .with_context(|| format!("cannot open data directory {}", dir.display()))?;
    // Before the mount: nothing can change the tree yet.
    if let Some(snapshots) = crate::control::durable_snapshots(&d) {
        crate::control::share_recovered_snapshots(&d, &snapshots);
    }
    let fs = d.fs().clone();
    Ok((
        fs,
        Some(Arc::new(std::sync::Mutex::new(d))),
        Some(report.to_string()),
    ))
}

/// The FUSE options to mount with: a durable mount names its data directory
/// as its source.
fn fuse_options(settings: &Settings) -> MountOptions {
    let mut fuse_opts = settings.fuse.clone();
    if let Some((dir, _)) = &settings.durable
        && fuse_opts.fsname == "memfs"
        && !dir.to_string_lossy().contains([',', ' ', '\t', '\n', '\\'])
    {
        // Shown as the source in /proc/mounts; `memfs umount` finds the data
        // directory there to wait for the server to let go of it.
        fuse_opts.fsname = dir
            .canonicalize()
            .unwrap_or_else(|_| dir.clone())
            .to_string_lossy()
            .into_owned();
    }
    fuse_opts
}

fn close_data_dir(d: SharedDurable) -> anyhow::Result<()> {
    // The session's workers are gone with `mounted`: this is the last reference.
    match Arc::try_unwrap(d) {
        Ok(d) => d
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .close()
            .context("closing the data directory")?,
        Err(d) => {
            d.lock()
                .unwrap_or_else(|e| e.into_inner())
                .sync()
                .context("syncing the data directory")?;
        }
    }
    Ok(())
}

/// When the data directory fails and the file system turns read-only, a
/// thread remounts the server's own FUSE mount read-only (what
/// `mount -o remount,ro` does), so statvfs shows ST_RDONLY and findmnt
/// `ro`: a FUSE statfs reply has no flags field, the mount is the only
/// place the kernel reports it. It runs off the FUSE workers because the
/// remount syncs the file system through them, and through
/// `own_mount::call` because a SIGKILL during it must not leave the process
/// behind (see there). The path is still our mount:
/// a new server of the same data directory cannot mount before we let go
/// of its lock, at close.
struct ReadOnlyWatch {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ReadOnlyWatch {
    fn start(d: &memfs_durable::DurableFs, mountpoint: &Path) -> ReadOnlyWatch {
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        d.on_read_only(move |reason| {
            let _ = tx.send(reason.to_string());
        });
        let stop = Arc::new(AtomicBool::new(false));
        let mp = mountpoint.to_path_buf();
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("memfs-readonly".into())
                .spawn(move || {
                    if let Some(reason) = wait_for_read_only(&rx, &stop) {
                        remount_read_only_when_free(&mp, &stop, &reason);
                    }
                })
                .ok()
        };
        ReadOnlyWatch { stop, thread }
    }
}

/// Why the file system turned read-only, once it does; `None`: stopped first.
fn wait_for_read_only(rx: &std::sync::mpsc::Receiver<String>, stop: &AtomicBool) -> Option<String> {
    loop {
        if stop.load(Ordering::Acquire) {
            return None;
        }
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(r) => return Some(r),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(_) => return None,
        }
    }
}

fn remount_read_only_when_free(mp: &Path, stop: &AtomicBool, reason: &str) {
    // EBUSY while a file is open for writing (or an unlinked
    // file is open): the kernel refuses a read-only remount
    // then, so try again until it is free.
    let mut told = false;
    while !stop.load(Ordering::Acquire) {
        let m = mp.to_path_buf();
        let r = match crate::own_mount::call(
            "the read-only remount",
            crate::own_mount::LIMIT,
            move || remount_read_only(&m),
        ) {
            Ok(r) => r,
            // No thread, or a remount that did not return:
            // not retried (that would pile up threads).
            Err(e) => {
                tracing::warn!(
                    "cannot remount {} read-only ({e}); mutations still fail with EROFS",
                    mp.display()
                );
                return;
            }
        };
        match r {
            Ok(()) => {
                tracing::warn!("remounted {} read-only: {reason}", mp.display());
                return;
            }
            Err(nix::errno::Errno::EBUSY) => {
                if !told {
                    tracing::info!(
                        "{} is busy (files open for writing): remounting it read-only once they close",
                        mp.display()
                    );
                    told = true;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => {
                tracing::warn!(
                    "cannot remount {} read-only ({e}); mutations still fail with EROFS",
                    mp.display()
                );
                return;
            }
        }
    }
}

impl Drop for ReadOnlyWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// MS_REMOUNT|MS_RDONLY keeping the mount's other flags (a remount
/// replaces them all).
fn remount_read_only(mp: &Path) -> nix::Result<()> {
    use nix::mount::MsFlags;
    use nix::sys::statvfs::FsFlags;
    let cur = nix::sys::statvfs::statvfs(mp)?.flags();
    let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
    for (f, m) in [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_SYNCHRONOUS, MsFlags::MS_SYNCHRONOUS),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if cur.contains(f) {
            flags |= m;
        }
    }
    nix::mount::mount::<str, Path, str, str>(None, mp, None, flags, None)
}

pub fn run_umount(args: UmountArgs) -> anyhow::Result<()> {
    let mp = &args.mountpoint;
    if !mp.exists() {
        bail!("{} does not exist", mp.display());
    }
    if !is_mounted(mp) {
        bail!("{} is not mounted", mp.display());
    }
    let data_dir = mount_table::source(mp)
        .map(PathBuf::from)
        .filter(|p| p.is_absolute() && p.join(memfs_durable::journal::dir::LOCK_FILE).is_file());
    unmount(mp, args.lazy)?;
    if let Some(dir) = data_dir
        && !args.lazy
    {
        wait_for_data_dir(&dir)?;
    }
    Ok(())
}

/// How long a new mount waits for the exiting server of its data directory.
const TAKEOVER_WAIT: Duration = Duration::from_secs(30);

/// Opens `dir`; if another process holds it but no mount serves it any more
/// (a server unmounted with plain umount(8), still writing its final
/// checkpoint), waits for that server to let go, for at most
/// [`TAKEOVER_WAIT`]. A directory that is still mounted is refused at once.
fn open_taking_over(
    dir: &Path,
    config: memfs_fs::Config,
    opts: &memfs_durable::Options,
) -> anyhow::Result<(memfs_durable::DurableFs, memfs_durable::OpenReport)> {
    use memfs_durable::{DurableFs, Error, journal};
    let deadline = std::time::Instant::now() + TAKEOVER_WAIT;
    loop {
        let err = match DurableFs::open(dir, config, opts.clone()) {
            Ok(r) => return Ok(r),
            Err(e @ Error::Journal(journal::Error::Locked { .. })) => e,
            Err(e) => return Err(e.into()),
        };
        if served_by_a_mount(dir) {
            return Err(anyhow::Error::new(err)
                .context(format!("{} is mounted by another memfs", dir.display())));
        }
        if std::time::Instant::now() >= deadline {
            return Err(anyhow::Error::new(err).context(format!(
                "no memfs mount serves it, but its holder did not let go within {}s",
                TAKEOVER_WAIT.as_secs()
            )));
        }
        tracing::info!(
            "{} is held by a server that is no longer mounted; waiting for it to exit",
            dir.display()
        );
        // Polling a lock another process holds: there is nothing to wait on.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether some mount's source is `dir` (a durable memfs names its data
/// directory there).
fn served_by_a_mount(dir: &Path) -> bool {
    let Ok(canon) = dir.canonicalize() else {
        return false;
    };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    info.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let Some(dash) = f.iter().position(|x| *x == "-") else {
            return false;
        };
        f.get(dash + 2)
            .is_some_and(|s| Path::new(&unescape_mount_path(s)) == canon)
    })
}

/// After an unmount the server still makes the journal durable and writes a
/// final checkpoint: wait until it lets go of the data directory, so that a
/// command run next (rollback, fsck, mount) finds it free.
fn wait_for_data_dir(dir: &Path) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    let mut told = false;
    loop {
        match memfs_durable::journal::DataDir::open(dir, false) {
            Ok(_) => return Ok(()),
            Err(memfs_durable::journal::Error::Locked { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "unmounted, but the server still holds {} after 10 minutes",
                dir.display()
            );
        }
        if !told {
            eprintln!(
                "memfs: unmounted; waiting for the server to finish writing {}",
                dir.display()
            );
            told = true;
        }
        // Polling a lock another process holds: there is nothing to wait on.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How long `memfs umount` retries a mount that is busy (see [`unmount`]).
const BUSY_RETRY: Duration = Duration::from_millis(500);

fn unmount(mp: &Path, lazy: bool) -> anyhow::Result<()> {
    if is_root() {
        let flags = if lazy {
            nix::mount::MntFlags::MNT_DETACH
        } else {
            nix::mount::MntFlags::empty()
        };
        // A path walk through the mount point by any process (a `stat`, a
        // `findmnt --target`) holds the mount for an instant and makes
        // umount2 fail with EBUSY: retry for a short while before calling
        // the mount busy. Open files and working directories stay busy.
        let deadline = std::time::Instant::now() + BUSY_RETRY;
        loop {
            match nix::mount::umount2(mp, flags) {
                Err(nix::errno::Errno::EBUSY) if std::time::Instant::now() < deadline => {
                    // Another process's transient reference: nothing to wait on.
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(nix::errno::Errno::EBUSY) => bail!(
                    "{} is busy (files are open or a process is inside it); close them or use --lazy",
                    mp.display()
                ),
                Err(e) => bail!("cannot unmount {}: {e}", mp.display()),
                Ok(()) => return Ok(()),
            }
        }
    }
    let mut cmd = Command::new("fusermount3");
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd
        .arg(mp)
        .output()
        .context("cannot run fusermount3 (install fuse3)")?;
    if !out.status.success() {
        bail!(
            "cannot unmount {}: {}",
            mp.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
