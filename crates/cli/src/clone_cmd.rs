//! `memfs clone NAME M2 (--mount M | --data-dir D)`: a writable
//! copy-on-write clone of a snapshot, mounted at M2. It returns once M2 is
//! usable, like `memfs mount`, and `memfs umount M2` removes it.
//!
//! - `--mount M`, or `--data-dir D` of a data directory a running memfs
//!   serves (its lock is held): the request goes to that server's control
//!   socket (`clone NAME M2`, see `control.rs`), which mounts a lazy clone
//!   in its own process; unmounting the origin unmounts its clones.
//! - `--data-dir D` of a data directory nobody serves: a new server process
//!   rebuilds the snapshot's tree from D (`history::materialize`, the same
//!   rebuild as `memfs diff --data-dir`) under D's lock, lets go of the
//!   lock, and serves the tree as an in-memory mount. D is only read, and
//!   only while the tree is built: the clone holds nothing of D afterwards,
//!   so D can be mounted (or cloned, rolled back, checked) while the clone
//!   runs, and neither sees the other's changes.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use memfs_durable::{self as durable, SnapshotEntry, journal};
use memfs_fs::Config;

use crate::control;

/// Set in the background server of an offline clone: its standard output
/// is a pipe on which it reports the outcome to the command that started it.
const SERVE_ENV: &str = "MEMFS_CLONE_SERVER";

#[derive(clap::Args, Debug)]
pub struct CloneArgs {
    /// The snapshot to clone (memfs snapshot list --mount M, or --data-dir D).
    pub name: String,
    /// Where to mount the clone (an existing directory, not a mount point).
    #[arg(value_name = "M2")]
    pub target: PathBuf,
    #[command(flatten)]
    pub from: CloneFrom,
}

/// Whose snapshot: exactly one of the two.
#[derive(clap::Args, Debug)]
#[group(required = true, multiple = false)]
pub struct CloneFrom {
    /// A mounted memfs: its server mounts the clone in its own process
    /// (unmounting M unmounts the clone too).
    #[arg(long, value_name = "MOUNTPOINT")]
    pub mount: Option<PathBuf>,
    /// A data directory. Mounted: its server mounts the clone, as with
    /// --mount. Not mounted: a new server process rebuilds the snapshot's
    /// tree from it and serves it in memory; D is only read, and is free
    /// again (mountable) once the clone is mounted.
    #[arg(long, value_name = "PATH")]
    pub data_dir: Option<PathBuf>,
}

pub fn run_clone(a: CloneArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    durable::check_snapshot_name(&a.name)?;
    if std::env::var_os(SERVE_ENV).is_some() {
        return run_server(&a);
    }
    let target = check_target(&a.target)?;
    match (&a.from.mount, &a.from.data_dir) {
        (Some(m), None) => clone_of_mount(&a.name, &target, m),
        (None, Some(d)) => clone_of_data_dir(&a.name, &target, d, started),
        _ => bail!("give either --mount MOUNTPOINT or --data-dir PATH"),
    }
}

/// The clone's mount point, canonical: an existing directory that is not a
/// mount point yet (checked again by whoever mounts).
fn check_target(t: &Path) -> anyhow::Result<PathBuf> {
    let canon = crate::mount::mount_point(t)?;
    // The control protocol is one line per request.
    if canon.to_string_lossy().contains('\n') {
        bail!("mount point {} has a newline in its name", canon.display());
    }
    Ok(canon)
}

fn ms(us: f64) -> f64 {
    us / 1000.0
}

/// `--mount M`: the request on M's per-device control socket.
fn clone_of_mount(name: &str, target: &Path, mount: &Path) -> anyhow::Result<()> {
    let reply = control::mount_request(mount, &format!("clone {name} {}", target.display()))?;
    let us: f64 = reply.first().and_then(|l| l.parse().ok()).unwrap_or(0.0);
    println!(
        "memfs: clone of snapshot {name} mounted at {} in {:.1} ms (served by the server of {}; unmount with: memfs umount {})",
        target.display(),
        ms(us),
        mount.display(),
        target.display()
    );
    Ok(())
}

/// `--data-dir D`: through D's server if one holds it, else a new server.
fn clone_of_data_dir(
    name: &str,
    target: &Path,
    dir: &Path,
    started: Instant,
) -> anyhow::Result<()> {
    let dir = check_data_dir(dir)?;
    match journal::DataDir::open(&dir, false) {
        Err(journal::Error::Locked { .. }) => clone_through_server(name, target, &dir),
        Err(e) => Err(e.into()),
        Ok(lock) => {
            // Refused here, before a server is started: an unknown name.
            find_snapshot(&dir, name)?;
            drop(lock);
            spawn_server(name, target, &dir, started)
        }
    }
}

/// An existing memfs data directory, canonical. Its `LOCK` file is checked
/// first: locking a directory creates one, which must not appear in a
/// directory that is not memfs's.
fn check_data_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    if !dir.is_dir() {
        bail!("data directory {} does not exist", dir.display());
    }
    if !dir.join(journal::dir::LOCK_FILE).is_file() {
        bail!(
            "{} is not a memfs data directory (no {} file: memfs mount M --data-dir {} makes one)",
            dir.display(),
            journal::dir::LOCK_FILE,
            dir.display()
        );
    }
    let canon = dir
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", dir.display()))?;
    if canon.to_string_lossy().contains('\n') {
        bail!(
            "data directory {} has a newline in its name",
            canon.display()
        );
    }
    Ok(canon)
}

/// Snapshot `name` of `dir`'s HISTORY (the caller holds the directory's lock).
fn find_snapshot(dir: &Path, name: &str) -> anyhow::Result<SnapshotEntry> {
    let h = durable::History::load(dir)?;
    h.snapshots
        .into_iter()
        .find(|s| s.name == name)
        .with_context(|| {
            format!(
                "no snapshot {name:?} in {} (memfs snapshot list --data-dir {} lists them)",
                dir.display(),
                dir.display()
            )
        })
}

/// The mount point whose source is `dir` (a durable memfs names its data
/// directory there), for the messages.
fn mount_of(dir: &Path) -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let dash = f.iter().position(|x| *x == "-")?;
        let source = memfs_fuse::mounts::unescape_mount_path(f.get(dash + 2)?);
        let point = f.get(4)?;
        (Path::new(&source) == dir)
            .then(|| PathBuf::from(memfs_fuse::mounts::unescape_mount_path(point)))
    })
}

/// D is served: the same request as `--mount`, on D's `control.sock`.
fn clone_through_server(name: &str, target: &Path, dir: &Path) -> anyhow::Result<()> {
    let reply = control::request(dir, &format!("clone {name} {}", target.display()))?;
    let us: f64 = reply.first().and_then(|l| l.parse().ok()).unwrap_or(0.0);
    let by = match mount_of(dir) {
        Some(m) => format!(
            "served by the memfs of {} mounted at {}: unmounting {} unmounts the clone too",
            dir.display(),
            m.display(),
            m.display()
        ),
        None => format!("served by the memfs of {}", dir.display()),
    };
    println!(
        "memfs: clone of snapshot {name} mounted at {} in {:.1} ms ({by}; unmount with: memfs umount {})",
        target.display(),
        ms(us),
        target.display()
    );
    Ok(())
}

/// Starts the clone's server process and waits until it reports that the
/// mount is usable (or why it is not).
fn spawn_server(name: &str, target: &Path, dir: &Path, started: Instant) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the memfs executable")?;
    let mut child = Command::new(exe)
        .arg("clone")
        .arg(name)
        .arg(target)
        .arg("--data-dir")
        .arg(dir)
        .env(SERVE_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start the clone's server process")?;
    let out = child.stdout.take().expect("stdout is piped");
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).ok();
    let line = line.trim();
    if let Some(rest) = line.strip_prefix("ready ") {
        let f: Vec<&str> = rest.split(' ').collect();
        let [commit, nodes, build_us] = f.as_slice() else {
            bail!("unexpected report from the clone's server: {line:?}");
        };
        let build: f64 = build_us.parse().unwrap_or(0.0);
        println!(
            "memfs: clone of snapshot {name} (commit {commit} of {}) mounted at {} in {:.1} ms: \
             tree rebuilt from the data directory in {:.1} ms ({nodes} nodes), served in memory \
             by server pid {}",
            dir.display(),
            target.display(),
            started.elapsed().as_secs_f64() * 1000.0,
            ms(build),
            child.id()
        );
        println!(
            "memfs: {} is not held by the clone (mount it as usual); the clone's changes never reach it; \
             unmount with: memfs umount {}",
            dir.display(),
            target.display()
        );
        return Ok(());
    }
    let status = child.wait().ok();
    match line.strip_prefix("error: ") {
        Some(msg) => bail!("{msg}"),
        None => bail!("the clone's server exited before the mount was ready ({status:?})"),
    }
}

/// The server process of an offline clone: reports `ready COMMIT NODES
/// BUILD_US` or `error: MESSAGE` on its standard output, then serves until
/// unmounted (or SIGINT/SIGTERM).
fn run_server(a: &CloneArgs) -> anyhow::Result<()> {
    // Leave the starter's session so its terminal's signals and hangups pass us by.
    let _ = nix::unistd::setsid();
    let r = serve(a);
    if let Err(e) = &r {
        // The starter waits on our stdout for the outcome (until it is
        // reported, stdout is still the pipe).
        let mut out = std::io::stdout();
        let _ = writeln!(out, "error: {e:#}");
        let _ = out.flush();
    }
    r
}

fn serve(a: &CloneArgs) -> anyhow::Result<()> {
    let dir = a
        .from
        .data_dir
        .as_deref()
        .context("the clone's server needs --data-dir")?;
    let target = check_target(&a.target)?;
    let config = Config::default();
    let t = Instant::now();
    let (fs, snap) = {
        // Held while the tree is rebuilt, as `memfs diff` does: no server
        // may prune the checkpoint it starts from meanwhile. The rebuilt
        // tree is a separate copy in memory: nothing of it refers to D.
        let _lock = match journal::DataDir::open(dir, false) {
            Err(journal::Error::Locked { .. }) => bail!(
                "{} was mounted meanwhile: run the command again to clone through its server",
                dir.display()
            ),
            r => r?,
        };
        let snap = find_snapshot(dir, &a.name)?;
        let fs = durable::history::materialize(dir, snap.commit, config).with_context(|| {
            format!(
                "rebuilding snapshot {} (commit {}) from {}",
                snap.name,
                snap.commit,
                dir.display()
            )
        })?;
        (fs, snap)
    };
    let build = t.elapsed();
    let nodes = fs.inode_count();
    let fuse = memfs_fuse::MountOptions {
        data_capacity: config.capacity,
        // In memory, not D: `memfs umount` and `--mount` take it for an
        // in-memory mount (a durable mount's source is its data directory).
        fsname: "memfs".into(),
        ..Default::default()
    };
    let mut mounted = memfs_fuse::mount(Arc::new(fs), &target, &fuse)
        .map_err(|e| anyhow::anyhow!("cannot mount the clone at {}: {e}", target.display()))?;
    let clones = control::Clones::default();
    let control = control::serve(control::Mount {
        mountpoint: target.clone(),
        durable: None,
        swapper: mounted.swapper(),
        config,
        fuse,
        clones: clones.clone(),
    })?;
    let signals = crate::serving::UnmountOnSignal::start(mounted.unmounter(), &target)?;
    let mut out = std::io::stdout();
    writeln!(out, "ready {} {nodes} {}", snap.commit, build.as_micros())
        .context("cannot report readiness")?;
    out.flush().ok();
    // From now on nobody reads our output.
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = nix::unistd::dup2_stdout(&null);
    }
    let result = mounted.run();
    signals.stop();
    control.stop();
    // Clones of this clone are served by this process: they go with it.
    clones.unmount_all();
    result.with_context(|| format!("serving {}", target.display()))
}
