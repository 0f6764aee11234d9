//! `memfs mount` and `memfs umount`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use memfs_fs::{Config, Fs};
use memfs_fuse::MountOptions;

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
    /// Seconds the kernel may cache names.
    #[arg(long, value_name = "SECS")]
    pub entry_timeout: Option<f64>,
    /// Seconds the kernel may cache attributes.
    #[arg(long, value_name = "SECS")]
    pub attr_timeout: Option<f64>,
    /// Stay in the foreground (for service managers); SIGINT and SIGTERM unmount.
    #[arg(long, short = 'f')]
    pub foreground: bool,
    /// Mount options, comma-separated: size=, inodes= (or nr_inodes=), threads=,
    /// writeback_cache, allow_other, entry_timeout=, attr_timeout=, and kernel options (ro, noexec, ...).
    #[arg(short = 'o', value_name = "OPTIONS")]
    pub options: Vec<String>,
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
}

fn parse_size(s: &str) -> anyhow::Result<u64> {
    let s = s.trim();
    if let Some(p) = s.strip_suffix('%') {
        let pct: f64 = p
            .parse()
            .ok()
            .filter(|v: &f64| *v > 0.0 && *v <= 100.0)
            .with_context(|| format!("invalid size {s:?}: a percentage must be in (0, 100]"))?;
        return Ok((memfs_fs::physical_memory() as f64 * pct / 100.0) as u64);
    }
    let v = parse_size::Config::new()
        .with_binary()
        .parse_size(s)
        .map_err(|e| anyhow::anyhow!("invalid size {s:?}: {e} (use e.g. 512M, 4G, 50%)"))?;
    if v < memfs_fs::PAGE_SIZE as u64 {
        bail!("invalid size {s:?}: must be at least one page (4K)");
    }
    Ok(v)
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

fn parse_secs(name: &str, s: &str) -> anyhow::Result<Duration> {
    let v: f64 = s
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v >= 0.0)
        .with_context(|| format!("invalid {name} {s:?}: expected seconds, e.g. 1 or 0.5"))?;
    Ok(Duration::from_secs_f64(v))
}

/// Options that /etc/fstab and mount(8) pass along but that mean nothing here.
const IGNORED_OPTIONS: &[&str] = &[
    "defaults",
    "auto",
    "noauto",
    "user",
    "users",
    "nouser",
    "nofail",
    "_netdev",
    "relatime",
    "norelatime",
    "strictatime",
    "lazytime",
    "nolazytime",
    "silent",
    "loud",
];

impl MountArgs {
    fn settings(&self) -> anyhow::Result<Settings> {
        let mut size = self.size.as_deref().map(parse_size).transpose()?;
        let mut inodes = self.inodes.as_deref().map(parse_count).transpose()?;
        let mut fuse = MountOptions::default();
        if let Some(t) = self.threads {
            fuse.threads = t;
        }
        fuse.writeback_cache = self.writeback_cache;
        fuse.allow_other = self.allow_other;
        if let Some(t) = self.entry_timeout {
            fuse.entry_timeout = parse_secs("--entry-timeout", &t.to_string())?;
        }
        if let Some(t) = self.attr_timeout {
            fuse.attr_timeout = parse_secs("--attr-timeout", &t.to_string())?;
        }
        for opt in self
            .options
            .iter()
            .flat_map(|o| o.split(','))
            .filter(|o| !o.is_empty())
        {
            let (key, value) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt, None),
            };
            let need =
                || value.with_context(|| format!("mount option {key} needs a value ({key}=...)"));
            match key {
                "size" => size = Some(parse_size(need()?)?),
                "inodes" | "nr_inodes" => inodes = Some(parse_count(need()?)?),
                "threads" => {
                    fuse.threads = need()?
                        .parse()
                        .ok()
                        .filter(|&t: &usize| t > 0)
                        .with_context(|| {
                            format!("invalid threads {:?}", value.unwrap_or_default())
                        })?
                }
                "writeback_cache" => fuse.writeback_cache = true,
                "allow_other" => fuse.allow_other = true,
                "entry_timeout" => fuse.entry_timeout = parse_secs(key, need()?)?,
                "attr_timeout" => fuse.attr_timeout = parse_secs(key, need()?)?,
                "fsname" => fuse.fsname = need()?.to_string(),
                k if IGNORED_OPTIONS.contains(&k) || k.starts_with("x-") => {}
                "ro" | "rw" | "exec" | "noexec" | "suid" | "nosuid" | "dev" | "nodev" | "atime"
                | "noatime" | "sync" | "async" | "dirsync" => fuse.extra.push(opt.to_string()),
                _ => bail!("unknown mount option {opt:?}"),
            }
        }
        if fuse.threads == 0 {
            bail!("--threads must be at least 1");
        }
        let mut config = Config::default();
        if let Some(s) = size {
            config.capacity = s;
            config.max_inodes = (s / memfs_fs::PAGE_SIZE as u64).max(1024);
        }
        if let Some(i) = inodes {
            config.max_inodes = i;
        }
        Ok(Settings { config, fuse })
    }
}

/// Mount points currently mounted, from /proc/self/mountinfo (octal escapes decoded).
fn mount_points() -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mount_path(p)))
        .collect()
}

fn unescape_mount_path(p: &str) -> String {
    let b = p.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn is_mounted(path: &Path) -> bool {
    let Ok(canon) = path.canonicalize() else {
        return false;
    };
    mount_points().contains(&canon)
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Everything that can be checked before mounting, with messages a user can act on.
fn preflight(mountpoint: &Path) -> anyhow::Result<PathBuf> {
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

pub fn run_mount(args: MountArgs) -> anyhow::Result<()> {
    let settings = args.settings()?;
    let mountpoint = preflight(&args.mountpoint)?;
    let notify = std::env::var_os(NOTIFY_ENV).is_some();
    if !args.foreground && !notify {
        return spawn_background(&mountpoint, &settings);
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
fn spawn_background(mountpoint: &Path, settings: &Settings) -> anyhow::Result<()> {
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
    if line == "ready" {
        let c = settings.config;
        println!(
            "memfs: mounted at {} (in memory: {} capacity, {} inodes, {} threads; server pid {})",
            mountpoint.display(),
            human_bytes(c.capacity),
            c.max_inodes,
            settings.fuse.threads,
            child.id()
        );
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

pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn serve(mountpoint: &Path, settings: Settings, notify: bool) -> anyhow::Result<()> {
    if notify {
        // Leave the starter's session so its terminal's signals and hangups pass us by.
        let _ = nix::unistd::setsid();
    }
    let fs = Arc::new(Fs::new(settings.config));
    let mut mounted = memfs_fuse::mount(fs, mountpoint, &settings.fuse)
        .map_err(|e| anyhow::anyhow!("cannot mount memfs at {}: {e}", mountpoint.display()))?;
    let mut unmounter = mounted.unmounter();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .context("cannot install signal handlers")?;
    let handle = signals.handle();
    let mp = mountpoint.to_path_buf();
    let signal_thread = std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            tracing::info!("signal {sig}: unmounting {}", mp.display());
            if unmounter.unmount().is_err() {
                // Busy: detach now, the kernel finishes when the last user leaves.
                lazy_unmount(&mp);
            }
        }
    });
    if notify {
        let mut out = std::io::stdout();
        writeln!(out, "ready").context("cannot report readiness")?;
        out.flush().ok();
        // From now on nobody reads our output.
        if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
            let _ = nix::unistd::dup2_stdout(&null);
        }
    } else {
        eprintln!(
            "memfs: mounted at {} (foreground; Ctrl-C or memfs umount {} to stop)",
            mountpoint.display(),
            mountpoint.display()
        );
    }
    let result = mounted.run();
    handle.close();
    let _ = signal_thread.join();
    result.with_context(|| format!("serving {}", mountpoint.display()))
}

/// Detaches a mount now; the kernel finishes when its last user leaves.
pub fn lazy_unmount(mp: &Path) {
    if is_root() {
        let _ = nix::mount::umount2(mp, nix::mount::MntFlags::MNT_DETACH);
    } else {
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg("-z")
            .arg(mp)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

pub fn run_umount(args: UmountArgs) -> anyhow::Result<()> {
    let mp = &args.mountpoint;
    if !mp.exists() {
        bail!("{} does not exist", mp.display());
    }
    if !is_mounted(mp) {
        bail!("{} is not mounted", mp.display());
    }
    if is_root() {
        let flags = if args.lazy {
            nix::mount::MntFlags::MNT_DETACH
        } else {
            nix::mount::MntFlags::empty()
        };
        return nix::mount::umount2(mp.as_path(), flags).map_err(|e| match e {
            nix::errno::Errno::EBUSY => anyhow::anyhow!(
                "{} is busy (files are open or a process is inside it); close them or use --lazy",
                mp.display()
            ),
            e => anyhow::anyhow!("cannot unmount {}: {e}", mp.display()),
        });
    }
    let mut cmd = Command::new("fusermount3");
    cmd.arg("-u");
    if args.lazy {
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
