//! The control socket of a mounted durable memfs: `<data-dir>/control.sock`.
//!
//! While a data directory is mounted its lock is held, so `memfs snapshot`
//! and friends cannot open it; they ask the running server instead. The
//! protocol is one request line per connection and a reply of lines: first
//! `ok` or `error MESSAGE`, then the payload. Requests:
//! `snapshot-create NAME`, `snapshot-delete NAME`, `snapshot-list`, `diff A B`, `rollback COMMIT`, `sync`,
//! `checkpoint`, `status`. Only the owner of the data directory can connect
//! (the socket is created with mode 0600).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, bail};
use memfs_durable::DurableFs;
use memfs_fuse::swap::Swapper;

pub use memfs_durable::control::{request, socket_path};

/// A running control server; [`Control::stop`] ends it and removes the socket.
pub struct Control {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Control {
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept loop with a connection of our own.
        let _ = UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.shutdown();
        }
    }
}

/// The durable file system a mount serves; an online rollback replaces it
/// (hence the mutex), and `swapper` replaces the tree the adapter serves.
pub type Served = Arc<Mutex<DurableFs>>;

pub fn serve(d: Served, swapper: Option<Swapper>) -> anyhow::Result<Control> {
    let path = socket_path(d.lock().unwrap_or_else(|e| e.into_inner()).path());
    // We hold the data directory's lock: any socket file left is stale.
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)
        .with_context(|| format!("cannot create the control socket {}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot restrict {}", path.display()))?;
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("memfs-control".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    match conn {
                        Ok(c) => {
                            let mut d = d.lock().unwrap_or_else(|e| e.into_inner());
                            if let Err(e) = handle(&mut d, swapper.as_ref(), c) {
                                tracing::warn!("control request failed: {e:#}");
                            }
                        }
                        Err(e) => tracing::warn!("control socket: {e}"),
                    }
                }
            })
            .context("cannot start the control thread")?
    };
    Ok(Control {
        path,
        stop,
        thread: Some(thread),
    })
}

fn handle(d: &mut DurableFs, swapper: Option<&Swapper>, conn: UnixStream) -> anyhow::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line)?;
    let line = line.trim();
    let r = match line.strip_prefix("rollback ") {
        Some(target) => rollback(d, swapper, target),
        None => answer(d, line),
    };
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
    (&conn).write_all(reply.as_bytes())?;
    Ok(())
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

fn answer(d: &DurableFs, req: &str) -> anyhow::Result<Vec<String>> {
    let (cmd, arg) = match req.split_once(' ') {
        Some((c, a)) => (c, Some(a)),
        None => (req, None),
    };
    let need = || arg.with_context(|| format!("{cmd} needs an argument"));
    Ok(match cmd {
        "snapshot-create" => vec![snapshot_line(&d.snapshot_create(need()?)?)],
        "snapshot-delete" => vec![snapshot_line(&d.snapshot_delete(need()?)?)],
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
    let source = crate::mount::mount_source(mountpoint).with_context(|| {
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
        "{} is an in-memory memfs mount (source {source:?}): snapshots, diff and rollback need a data directory in this version (mount with --data-dir)",
        mountpoint.display()
    )
}
