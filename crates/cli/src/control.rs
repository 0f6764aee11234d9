//! The control channels of a mounted memfs.
//!
//! Every mount listens on `/run/memfs/ctl/MAJOR:MINOR.sock` (the FUSE
//! connection's device number, as `stat -c %d M` and /proc/self/mountinfo
//! show it; `$XDG_RUNTIME_DIR/memfs/ctl` or `/tmp/memfs-ctl-UID` when not
//! root), so `--mount M` finds the server of any mount, durable or not. A
//! durable mount also listens on `<data-dir>/control.sock`: while a data
//! directory is mounted its lock is held, so `memfs snapshot --data-dir`
//! and friends cannot open it; they ask the running server instead.
//!
//! The protocol is one request line per connection and a reply of lines:
//! first `ok` or `error MESSAGE`, then the payload. Requests of a durable
//! mount: `snapshot-create NAME`, `snapshot-delete NAME`, `snapshot-list`,
//! `diff A B`, `rollback COMMIT`, `sync`, `checkpoint`, `status`. Requests
//! of every mount (the engine's copy-on-write snapshots, browsable in
//! `.snapshots`): `snap-create NAME`, `snap-delete NAME`, `snap-list`, `snap-diff A B`,
//! `snap-rollback NAME`, `clone NAME MOUNTPOINT`, `kind`. Only the owner can
//! connect (sockets 0600 in a 0700 directory).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use memfs_durable::{DurableFs, SnapshotEntry};
use memfs_fuse::swap::Swapper;

pub use memfs_durable::control::{request, socket_path};

/// A running control server; [`Control::stop`] ends it and removes its sockets.
pub struct Control {
    listeners: Vec<Listening>,
    stop: Arc<AtomicBool>,
}

struct Listening {
    path: PathBuf,
    /// The socket file's identity: once our mount is gone its device
    /// number may name another mount at once, whose server replaces the
    /// file; ours must then leave that one alone.
    file: Option<(u64, u64)>,
    listener: UnixListener,
    thread: JoinHandle<()>,
}

fn file_id(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

impl Control {
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        for l in self.listeners.drain(..) {
            // Wake the accept loop: shutdown(2) of a listening socket ends
            // a blocked accept (a connection to the path might reach
            // another server, see `Listening::file`).
            // SAFETY: the descriptor belongs to `l.listener`, alive here;
            // shutdown(2) changes no memory. Exercised by every test that
            // unmounts (crates/cli/tests/snapshots.rs).
            unsafe {
                libc::shutdown(
                    std::os::fd::AsRawFd::as_raw_fd(&l.listener),
                    libc::SHUT_RDWR,
                )
            };
            let _ = l.thread.join();
            if l.file.is_some() && file_id(&l.path) == l.file {
                let _ = std::fs::remove_file(&l.path);
            }
        }
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The durable file system a mount serves; an online rollback replaces it
/// (hence the mutex), and `swapper` replaces the tree the adapter serves.
pub type Served = Arc<Mutex<DurableFs>>;

/// What a mount's control server acts on.
pub struct Mount {
    pub mountpoint: PathBuf,
    /// `None`: an in-memory mount.
    pub durable: Option<Served>,
    pub swapper: Swapper,
    /// The engine's limits and the adapter's options, for clones.
    pub config: memfs_fs::Config,
    pub fuse: memfs_fuse::MountOptions,
    /// Clones mounted by this server from this mount's snapshots.
    pub clones: Clones,
}

/// Clones served by this process; dropping this unmounts them all (the
/// origin's unmount takes its clones with it).
#[derive(Default, Clone)]
pub struct Clones(Arc<Mutex<Vec<CloneMount>>>);

struct CloneMount {
    mountpoint: PathBuf,
    unmounter: memfs_fuse::Unmounter,
    thread: Option<JoinHandle<()>>,
}

impl Clones {
    /// Unmounts every clone still mounted and waits for their servers.
    pub fn unmount_all(&self) {
        let list = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        for mut c in list {
            if memfs_fuse::mounts::is_mounted(&c.mountpoint) && c.unmounter.unmount().is_err() {
                memfs_fuse::mounts::lazy_unmount(&c.mountpoint);
            }
            if let Some(t) = c.thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// Where the control socket of the mount with device `dev` ("MAJOR:MINOR") lives.
pub fn ctl_socket(dev: &str) -> PathBuf {
    ctl_dir().join(format!("{dev}.sock"))
}

fn ctl_dir() -> PathBuf {
    if memfs_fuse::mounts::is_root() {
        return PathBuf::from("/run/memfs/ctl");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("memfs/ctl"),
        _ => PathBuf::from(format!("/tmp/memfs-ctl-{}", nix::unistd::geteuid())),
    }
}

fn listen(path: &Path) -> anyhow::Result<UnixListener> {
    // Only one mount has a device number at a time: a socket file left
    // under ours is stale (a server that was killed).
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)
        .with_context(|| format!("cannot create the control socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot restrict {}", path.display()))?;
    Ok(listener)
}

/// Starts the control server of `m` (mounted now): the per-device socket,
/// and `<data-dir>/control.sock` for a durable mount.
pub fn serve(m: Mount) -> anyhow::Result<Control> {
    let extra = m
        .durable
        .as_ref()
        .map(|d| socket_path(d.lock().unwrap_or_else(|e| e.into_inner()).path()));
    let mountpoint = m.mountpoint.clone();
    let handler: Handler = Arc::new(move |line: &str| {
        flush_kernel_writeback(&m, line).and_then(|()| dispatch(&m, line))
    });
    serve_with(&mountpoint, extra, handler)
}

/// What answers a control request line: the reply's payload lines.
pub type Handler = Arc<dyn Fn(&str) -> anyhow::Result<Vec<String>> + Send + Sync>;

/// Starts a control server answering with `handler` on the per-device
/// socket of the mount at `mountpoint` (mounted now), and on `extra`.
pub fn serve_with(
    mountpoint: &Path,
    extra: Option<PathBuf>,
    handler: Handler,
) -> anyhow::Result<Control> {
    let dev = memfs_fuse::mounts::mount_dev(mountpoint).with_context(|| {
        format!(
            "cannot find the device number of the mount at {}",
            mountpoint.display()
        )
    })?;
    let dir = ctl_dir();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let paths: Vec<PathBuf> = std::iter::once(ctl_socket(&dev)).chain(extra).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let mut control = Control {
        listeners: Vec::new(),
        stop: stop.clone(),
    };
    for path in paths {
        let listener = listen(&path)?;
        let file = file_id(&path);
        let accepting = listener
            .try_clone()
            .context("cannot duplicate the control socket")?;
        let (m, stop) = (handler.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("memfs-control".into())
            .spawn(move || {
                for conn in accepting.incoming() {
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    match conn {
                        Ok(c) => {
                            if let Err(e) = handle(&m, c) {
                                tracing::warn!("control request failed: {e:#}");
                            }
                        }
                        Err(e) => tracing::warn!("control socket: {e}"),
                    }
                }
            })
            .context("cannot start the control thread")?;
        control.listeners.push(Listening {
            path,
            file,
            listener,
            thread,
        });
    }
    Ok(control)
}

fn handle(m: &Handler, conn: UnixStream) -> anyhow::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line)?;
    let line = line.trim();
    let r = m(line);
    let reply = match r {
        Ok(lines) => {
            let mut s = String::from("ok\n");
            for l in lines {
                s.push_str(&l);
                s.push('\n');
            }
            s
        }
        Err(e) => format!("error {}\n", format!("{e:#}").replace('\n', " ")),
    };
    send_reply(&conn, &reply)
}

/// How long the control thread waits for room in a client's socket while
/// it writes a reply. A client reads its reply as it comes (a few ms per
/// socket buffer); one that has not made room for 10 s stopped reading, and
/// without a bound the one control thread, and every later request (the
/// mount helper's `remount`, a rollback), would wait for it for good.
#[cfg(not(test))]
const REPLY_WRITE_TIMEOUT: Duration = Duration::from_secs(10);
#[cfg(test)]
const REPLY_WRITE_TIMEOUT: Duration = Duration::from_millis(50);

fn send_reply(conn: &UnixStream, reply: &str) -> anyhow::Result<()> {
    conn.set_write_timeout(Some(REPLY_WRITE_TIMEOUT))?;
    let mut w = conn;
    w.write_all(reply.as_bytes()).map_err(|e| {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            anyhow::anyhow!(
                "the control client did not read its reply of {} bytes within {REPLY_WRITE_TIMEOUT:?}; dropped it",
                reply.len()
            )
        } else {
            anyhow::Error::new(e).context("sending a control reply")
        }
    })
}

/// One control request: the engine's, or (durable mounts) the journal's.
fn dispatch(m: &Mount, line: &str) -> anyhow::Result<Vec<String>> {
    if let Some(r) = engine_request(m, line).transpose() {
        return r;
    }
    match &m.durable {
        None => Err(anyhow::anyhow!(
            "{} is an in-memory memfs mount: {line:?} needs a data directory (commit history); \
             snapshots of an in-memory mount are memfs snapshot create|list|delete and memfs rollback --to NAME",
            m.mountpoint.display()
        )),
        Some(d) => {
            let mut d = d.lock().unwrap_or_else(|e| e.into_inner());
            match line.strip_prefix("rollback ") {
                Some(target) => rollback(&mut d, Some(&m.swapper), target),
                None => answer(&d, Some(&m.swapper), line),
            }
        }
    }
}

/// Written data the kernel still holds as dirty pages (every write with
/// `--writeback-cache`; stores through a shared writable mapping on any
/// mount) reaches memfs only at writeback. A snapshot must hold every
/// write that returned before the command, and a rollback must not get
/// such pages after it (the kernel writes dirty pages back when a rollback
/// invalidates them, into the rolled-back tree). So the requests that take
/// or compare a point in time first make the kernel write back the whole
/// mount (`syncfs`), on this control thread, which holds no lock the FUSE
/// workers serving those WRITEs need. With nothing dirty it costs a
/// SYNCFS round trip.
fn flush_kernel_writeback(m: &Mount, line: &str) -> anyhow::Result<()> {
    let cmd = line.split(' ').next().unwrap_or("");
    let point_in_time = matches!(
        cmd,
        "snap-create" | "snap-rollback" | "snap-diff" | "snapshot-create" | "rollback" | "diff"
    );
    if !point_in_time {
        return Ok(());
    }
    if m.fuse.writeback_cache && matches!(cmd, "snap-rollback" | "rollback") {
        // The kernel keeps its own size (and mtime) of a cached regular
        // file with writeback caching and takes no size from memfs while it
        // holds the inode (fuse_get_cache_mask): after a rollback it would
        // go on showing the later size, with the rolled-back bytes under it.
        bail!(
            "{} caches writes in the kernel (--writeback-cache), which keeps its own file sizes \
             and would show the later ones after an online rollback: mount without \
             --writeback-cache to roll back online, or unmount and roll back with --data-dir",
            m.mountpoint.display()
        );
    }
    // Through `own_mount::call`: a SIGKILL while the SYNCFS waits must not
    // leave the process behind.
    let (mp, what) = (m.mountpoint.clone(), cmd.to_string());
    crate::own_mount::call("the syncfs", crate::own_mount::LIMIT, move || {
        let dir = std::fs::File::open(&mp)
            .with_context(|| format!("cannot open {} to write back its cache", mp.display()))?;
        nix::unistd::syncfs(&dir).with_context(|| {
            format!(
                "cannot write back the kernel's cached writes of {} before {what}",
                mp.display()
            )
        })
    })
    .with_context(|| {
        format!(
            "writing back the kernel's cached writes of {} before {cmd}",
            m.mountpoint.display()
        )
    })??;
    Ok(())
}

/// `memfs diff A B` between two engine snapshots of a mount, or a snapshot
/// and the live tree (`-`): each snapshot side is a clone (O(1): its nodes
/// are copied from the snapshot as the walk reaches them) compared by the
/// same code as the durable diff, so the output is the same.
fn snap_diff(swapper: &Swapper, a: &str, b: &str) -> anyhow::Result<Vec<String>> {
    let live = swapper.fs();
    let side = |s: &str| -> anyhow::Result<Option<memfs_fs::Fs>> {
        if s == "-" || s == "live" {
            return Ok(None);
        }
        swapper
            .clone_snapshot(s.as_bytes(), live.config())
            .map(Some)
            .map_err(|e| errno(e, &format!("no snapshot {s:?} of this mount")))
    };
    let (ta, tb) = (side(a)?, side(b)?);
    Ok(memfs_durable::history::diff_trees(
        ta.as_ref().unwrap_or(&live),
        tb.as_ref().unwrap_or(&live),
    )
    .iter()
    .map(ToString::to_string)
    .collect())
}

fn errno(e: memfs_fs::Errno, what: &str) -> anyhow::Error {
    anyhow::anyhow!("{what}: {e}")
}

/// `NAME ID CREATED_NS NODES BYTES`.
pub fn snap_line(s: &memfs_fs::SnapshotInfo) -> String {
    let t = s.created;
    let ns = (t.sec.max(0) as u64) * 1_000_000_000 + t.nsec as u64;
    format!(
        "{} {} {ns} {} {}",
        String::from_utf8_lossy(&s.name),
        s.id,
        s.nodes,
        s.bytes
    )
}

/// The requests every mount answers (the engine's snapshots); `None`: not one of them.
fn engine_request(m: &Mount, line: &str) -> anyhow::Result<Option<Vec<String>>> {
    let (cmd, arg) = match line.split_once(' ') {
        Some((c, a)) => (c, a),
        None => (line, ""),
    };
    let name = arg.as_bytes();
    let need = || -> anyhow::Result<()> {
        if arg.is_empty() {
            bail!("{cmd} needs a snapshot name");
        }
        Ok(())
    };
    Ok(Some(match cmd {
        // `mount -o remount,...` (mount.rs, `remount_atime`): the options
        // the atime policy follows, comma-separated, in order.
        "remount" => vec![remount(m, arg)?],
        "kind" => vec![
            if m.durable.is_some() {
                "durable"
            } else {
                "memory"
            }
            .into(),
        ],
        "snap-create" => {
            need()?;
            vec![snap_create(m, arg)?]
        }
        "snap-delete" => {
            need()?;
            m.swapper
                .snapshot_delete(name)
                .map_err(|e| errno(e, &format!("cannot delete snapshot {arg:?}")))?;
            Vec::new()
        }
        "snap-list" => m.swapper.snapshot_list().iter().map(snap_line).collect(),
        "snap-diff" => {
            let (a, b) = arg
                .split_once(' ')
                .context("snap-diff needs two sides: A B")?;
            snap_diff(&m.swapper, a, b)?
        }
        "snap-rollback" => {
            need()?;
            vec![snap_rollback(m, arg)?]
        }
        "clone" => {
            let (snap, target) = arg
                .split_once(' ')
                .context("clone needs a snapshot name and a mount point")?;
            let t = Instant::now();
            clone(m, snap, Path::new(target))?;
            vec![t.elapsed().as_micros().to_string()]
        }
        _ => return Ok(None),
    }))
}

/// `remount OPTIONS`: the server's side of `mount -o remount,...`; the
/// atime policy it has now.
fn remount(m: &Mount, arg: &str) -> anyhow::Result<String> {
    let opts: Vec<&str> = arg.split(',').filter(|o| !o.is_empty()).collect();
    if let Some(bad) = opts
        .iter()
        .find(|o| !crate::remount_options::ATIME_POLICY.contains(o))
    {
        bail!("remount: {bad:?} is not an option the server changes live");
    }
    let now = m.fuse.atime.apply(opts.iter().copied());
    tracing::info!(options = arg, atime = ?now, "remounted");
    Ok(format!("{now:?}"))
}

/// `snap-create NAME`: the new snapshot's `snap-list` line.
fn snap_create(m: &Mount, arg: &str) -> anyhow::Result<String> {
    if m.fuse.data_path != memfs_fuse::DataPath::Fuse {
        // The kernel writes a passthrough file's bytes straight to its
        // backing file: the engine never sees them, so it could not
        // preserve a page before its first change (docs/snapshots.md).
        bail!(
            "{} serves file data through kernel passthrough (--data-path passthrough|auto), \
             whose writes bypass the engine: snapshots need the fuse data path \
             (memfs mount --data-path fuse, the default)",
            m.mountpoint.display()
        );
    }
    let s = m
        .swapper
        .snapshot_create(arg.as_bytes())
        .map_err(|e| errno(e, &format!("cannot create snapshot {arg:?}")))?;
    Ok(snap_line(&s))
}

/// `snap-rollback NAME`: the line of counts and times it reports.
fn snap_rollback(m: &Mount, arg: &str) -> anyhow::Result<String> {
    if m.durable.is_some() {
        bail!(
            "a durable mount rolls back through its journal: memfs rollback --mount {} --to NAME|COMMIT",
            m.mountpoint.display()
        );
    }
    let t = Instant::now();
    let r = m
        .swapper
        .rollback_to_snapshot(arg.as_bytes())
        .map_err(|e| errno(e, &format!("cannot roll back to snapshot {arg:?}")))?;
    // INODES NAMES TOTAL_US, then the breakdown: CHANGED ENTRIES
    // WAIT_US ENGINE_US INVALIDATION_US.
    Ok(format!(
        "{} {} {} {} {} {} {} {}",
        r.inodes,
        r.names,
        t.elapsed().as_micros(),
        r.changed,
        r.entries,
        r.wait.as_micros(),
        r.engine.as_micros(),
        r.invalidate.as_micros()
    ))
}

/// Mounts a writable clone of snapshot `snap` at `target`, served by this
/// process until it is unmounted (or the origin is).
fn clone(m: &Mount, snap: &str, target: &Path) -> anyhow::Result<()> {
    let target = target
        .canonicalize()
        .with_context(|| format!("mount point {} does not exist", target.display()))?;
    if memfs_fuse::mounts::is_mounted(&target) {
        bail!("{} is already a mount point", target.display());
    }
    let fs = m
        .swapper
        .clone_snapshot(snap.as_bytes(), m.config)
        .map_err(|e| match e {
            memfs_fs::Errno::ENOENT => anyhow::anyhow!(
                "no snapshot {snap:?} of {} (memfs snapshot list --mount {} lists them)",
                m.mountpoint.display(),
                m.mountpoint.display()
            ),
            e => errno(e, &format!("cannot clone snapshot {snap:?}")),
        })?;
    let mut opts = m.fuse.clone();
    // Its own policy (a remount of one must not change the other's), the
    // origin's as given; a clone is writable.
    opts.atime = memfs_fuse::AtimePolicy::new(m.fuse.atime.base());
    // Not the origin's data directory: a clone keeps no journal.
    opts.fsname = "memfs".into();
    let mut mounted = memfs_fuse::mount(Arc::new(fs), &target, &opts)
        .map_err(|e| anyhow::anyhow!("cannot mount the clone at {}: {e}", target.display()))?;
    let clones = Clones::default();
    let control = serve(Mount {
        mountpoint: target.clone(),
        durable: None,
        swapper: mounted.swapper(),
        config: m.config,
        fuse: opts,
        clones: clones.clone(),
    });
    let unmounter = mounted.unmounter();
    let mp = target.clone();
    let thread = std::thread::Builder::new()
        .name("memfs-clone".into())
        .spawn(move || {
            if let Err(e) = mounted.run() {
                tracing::warn!("serving the clone at {}: {e}", mp.display());
            }
            clones.unmount_all();
            drop(control);
        })
        .context("cannot start the clone's server thread")?;
    m.clones
        .0
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(CloneMount {
            mountpoint: target,
            unmounter,
            thread: Some(thread),
        });
    Ok(())
}

/// Sends one request to the server of the memfs mounted at `mountpoint`
/// through its per-device socket; returns the payload lines of an `ok` reply.
pub fn mount_request(mountpoint: &Path, req: &str) -> anyhow::Result<Vec<String>> {
    if !mountpoint.exists() {
        bail!("{} does not exist", mountpoint.display());
    }
    let dev = memfs_fuse::mounts::mount_dev(mountpoint)
        .with_context(|| format!("{} is not mounted", mountpoint.display()))?;
    let socket = ctl_socket(&dev);
    let conn = UnixStream::connect(&socket).with_context(|| {
        format!(
            "{} is mounted, but no memfs control socket answers at {} (not a memfs mount, another user's, or a server of an older version)",
            mountpoint.display(),
            socket.display()
        )
    })?;
    conn.set_read_timeout(Some(Duration::from_secs(600)))?;
    (&conn).write_all(format!("{req}\n").as_bytes())?;
    conn.shutdown(std::net::Shutdown::Write)?;
    let mut lines = BufReader::new(&conn).lines();
    let first = lines
        .next()
        .context("the running memfs closed the control connection without a reply")??;
    if let Some(msg) = first.strip_prefix("error ") {
        bail!("{msg}");
    }
    if first != "ok" {
        bail!("unexpected reply from the running memfs: {first:?}");
    }
    Ok(lines.collect::<Result<_, _>>()?)
}

/// Whether the memfs at `mountpoint` has a data directory (else: in memory).
pub fn is_durable_mount(mountpoint: &Path) -> bool {
    crate::mount_table::source(mountpoint)
        .map(PathBuf::from)
        .is_some_and(|d| {
            d.is_absolute() && d.join(memfs_durable::journal::dir::LOCK_FILE).is_file()
        })
}

pub fn snapshot_line(s: &memfs_durable::SnapshotEntry) -> String {
    format!("{} {} {}", s.name, s.commit, s.time_ns)
}

/// `rollback COMMIT`: the durable rollback and the swap of the served tree
/// under one exclusive hold of every FUSE request (see memfs_fuse::swap).
/// Reply: `TARGET PREVIOUS_LAST SNAPSHOTS_DELETED`.
fn rollback(
    d: &mut DurableFs,
    swapper: Option<&Swapper>,
    target: &str,
) -> anyhow::Result<Vec<String>> {
    let sw = swapper.context("this server cannot swap its tree (no mount)")?;
    let commit: u64 = target
        .parse()
        .with_context(|| format!("rollback needs a commit id, not {target:?}"))?;
    // Refused targets are refused before requests are blocked.
    memfs_durable::plan_rollback(d.path(), commit)?;
    let r = sw.swap(|_| {
        // Whatever the rollback did, `d` now holds the tree to serve: the
        // new one, or the old one if recovery could not open again.
        let r = d.rollback_online(commit);
        // The snapshots the rollback kept, before any request runs again:
        // the new tree has no engine snapshot but of those at the target
        // commit, taken now.
        // One read of HISTORY for both, while requests are held.
        if let Some(kept) = durable_snapshots(d) {
            share_recovered_snapshots(d, &kept);
            show_snapshots(d, sw, true, kept);
        }
        Ok::<_, std::convert::Infallible>((d.fs().clone(), r))
    });
    let (plan, report) = match r {
        Ok(v) => v?,
        Err(never) => match never {},
    };
    tracing::info!("online rollback to commit {commit}: {report}");
    Ok(vec![format!(
        "{} {} {}",
        plan.target,
        plan.last,
        plan.lost_snapshots.len()
    )])
}

/// Shows the data directory's snapshots in `.snapshots`: those the served
/// tree has no engine snapshot of (taken before a restart, a crash or an
/// online rollback) are rebuilt aside from the data directory on first use
/// (docs/snapshots.md, "Durable mounts"). `staged`: from inside a swap or
/// before the mount serves (the kernel is told nothing).
pub fn show_durable_snapshots(d: &DurableFs, sw: &Swapper, staged: bool) {
    if let Some(snapshots) = durable_snapshots(d) {
        show_snapshots(d, sw, staged, snapshots);
    }
}

/// The snapshots in `d`'s `HISTORY`; `None` (logged) if it cannot be read.
pub fn durable_snapshots(d: &DurableFs) -> Option<Vec<SnapshotEntry>> {
    match d.history() {
        Ok(h) => Some(h.snapshots),
        Err(e) => {
            tracing::warn!("cannot read the history of {}: {e}", d.path().display());
            None
        }
    }
}

/// [`show_durable_snapshots`] of `snapshots`, read from `d`'s `HISTORY`.
fn show_snapshots(d: &DurableFs, sw: &Swapper, staged: bool, snapshots: Vec<SnapshotEntry>) {
    let list = snapshots
        .into_iter()
        .map(|s| memfs_fuse::snapdir::DurableSnapshot {
            name: s.name.into_bytes(),
            commit: s.commit,
        })
        .collect();
    let m = d.materializer();
    let build: memfs_fuse::snapdir::BuildTree =
        Arc::new(move |commit| m.materialize(commit).map_err(|e| e.to_string()));
    if staged {
        sw.stage_durable_snapshots(build, list);
    } else {
        sw.set_durable_snapshots(build, list);
    }
}

/// Gives each durable snapshot of the commit `d`'s tree was just recovered
/// to (by a mount, or by an online rollback) an engine snapshot of that
/// tree: it *is* that tree, so it needs no rebuild from the data directory
/// on first use, which costs as long as reading the tree (seconds for
/// gigabytes) and a full copy of it. O(1) each, sharing every page, like a
/// snapshot taken live. The usual case: a snapshot, then an unmount, or an
/// online rollback to a snapshot. Call it only where no request can have
/// changed the tree since recovery: before the mount, or inside the swap
/// of an online rollback. `snapshots`: those of `d`'s `HISTORY`
/// ([`durable_snapshots`]).
pub fn share_recovered_snapshots(d: &DurableFs, snapshots: &[SnapshotEntry]) {
    let last = d.last_commit();
    for s in snapshots.iter().filter(|s| s.commit == last) {
        match d.fs().snapshot_create(s.name.as_bytes()) {
            Ok(_) => tracing::info!(
                "snapshot {} is the recovered tree (commit {last}): an engine snapshot of it, no rebuild",
                s.name
            ),
            // A name the engine does not take: rebuilt when browsed.
            Err(e) => tracing::debug!("snapshot {}: no engine snapshot ({e})", s.name),
        }
    }
}

fn answer(d: &DurableFs, swapper: Option<&Swapper>, req: &str) -> anyhow::Result<Vec<String>> {
    let (cmd, arg) = match req.split_once(' ') {
        Some((c, a)) => (c, Some(a)),
        None => (req, None),
    };
    let need = || arg.with_context(|| format!("{cmd} needs an argument"));
    Ok(match cmd {
        "snapshot-create" => {
            let s = d.snapshot_create(need()?)?;
            // The same name in the engine, so `.snapshots/NAME` shows it
            // at once, sharing pages with the live tree (after a restart
            // it is rebuilt from the data directory: docs/snapshots.md).
            if let Some(sw) = swapper {
                if let Err(e) = sw.snapshot_create(s.name.as_bytes()) {
                    tracing::warn!(
                        "snapshot {}: no engine snapshot ({e}): rebuilt from the data directory when browsed",
                        s.name
                    );
                }
                show_durable_snapshots(d, sw, false);
            }
            vec![snapshot_line(&s)]
        }
        "snapshot-delete" => {
            let s = d.snapshot_delete(need()?)?;
            if let Some(sw) = swapper {
                show_durable_snapshots(d, sw, false);
                // ENOENT: no engine snapshot (taken before a restart).
                let _ = sw.snapshot_delete(s.name.as_bytes());
            }
            vec![snapshot_line(&s)]
        }
        "snapshot-list" => d.history()?.snapshots.iter().map(snapshot_line).collect(),
        "diff" => {
            let (a, b) = need()?
                .split_once(' ')
                .context("diff needs two sides: A B")?;
            memfs_durable::history::diff_running(d, a, b)?
                .iter()
                .map(ToString::to_string)
                .collect()
        }
        "sync" => vec![d.sync()?.to_string()],
        "checkpoint" => match d.checkpoint()? {
            Some(r) => vec![format!(
                "{} {} {} {}",
                r.info.commit,
                r.info.nodes,
                r.info.pages,
                r.elapsed.as_secs_f64()
            )],
            None => vec!["unchanged".into()],
        },
        "status" => status(d),
        _ => bail!("unknown request {cmd:?}"),
    })
}

/// `status`: the journal's figures, then `data_dir=PATH`, then
/// `read_only=no` or `read_only=yes REASON` (the journal failed).
fn status(d: &DurableFs) -> Vec<String> {
    let st = d.journal_stats();
    vec![
        format!(
            "durability={} last_commit={} durable_commit={} segments={} fsyncs={}",
            d.durability(),
            st.last_commit,
            st.durable_commit,
            st.segments,
            st.fsyncs
        ),
        format!("data_dir={}", d.path().display()),
        match d.read_only_reason() {
            None => "read_only=no".into(),
            Some(r) => format!("read_only=yes {}", r.replace('\n', " ")),
        },
    ]
}

/// The data directory of the memfs mounted at `mountpoint` (a durable mount
/// names it as its source in /proc/mounts). An in-memory mount has no
/// history in this version: that is an error saying so.
pub fn data_dir_of_mount(mountpoint: &Path) -> anyhow::Result<PathBuf> {
    if !mountpoint.exists() {
        bail!("{} does not exist", mountpoint.display());
    }
    if !memfs_fuse::mounts::is_mounted(mountpoint) {
        bail!("{} is not mounted", mountpoint.display());
    }
    let source = crate::mount_table::source(mountpoint).with_context(|| {
        format!(
            "cannot read the mount table entry of {}",
            mountpoint.display()
        )
    })?;
    let dir = PathBuf::from(&source);
    if dir.is_absolute() && dir.join(memfs_durable::journal::dir::LOCK_FILE).is_file() {
        return Ok(dir);
    }
    bail!(
        "{} is an in-memory memfs mount (source {source:?}): diff, log and rollback to a commit need a data directory (mount with --data-dir); its snapshots are memfs snapshot create|list|delete NAME --mount M and memfs rollback --mount M --to NAME",
        mountpoint.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_that_does_not_read_its_reply_is_dropped_with_an_error() {
        let (server, client) = UnixStream::pair().unwrap();
        // Larger than both socket buffers: the write has to wait for room.
        let reply = "x".repeat(16 << 20);
        let e = send_reply(&server, &reply).unwrap_err();
        assert!(e.to_string().contains("did not read its reply"), "{e:#}");
        drop(client);
    }
}
