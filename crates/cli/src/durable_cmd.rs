//! `memfs snapshot`, `memfs log`, `memfs rollback` and `memfs fsck`: history
//! and repair of a data directory. While the directory is mounted, snapshot
//! commands go to the running memfs through its control socket; `log`
//! reads the journal directly; `rollback` and `fsck --repair` refuse.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use memfs_durable::{self as durable, Error as DError, FsCheck, SnapshotEntry};
use memfs_fs::Config;

use crate::control;
use memfs_durable::journal as memfs_journal;

#[derive(clap::Args, Debug)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    pub cmd: SnapshotCmd,
}

/// Which data directory a history command works on: named directly, or
/// through the durable mount that serves it.
#[derive(clap::Args, Debug, Clone)]
#[group(required = true, multiple = false)]
pub struct Where {
    /// The data directory (mounted or not).
    #[arg(long, value_name = "PATH")]
    pub data_dir: Option<PathBuf>,
    /// A mounted memfs: its server is asked through its control socket.
    #[arg(long, value_name = "MOUNTPOINT")]
    pub mount: Option<PathBuf>,
}

impl Where {
    fn dir(&self) -> anyhow::Result<PathBuf> {
        match (&self.data_dir, &self.mount) {
            (Some(d), _) => {
                check_dir(d)?;
                Ok(d.clone())
            }
            (None, Some(m)) => control::data_dir_of_mount(m),
            (None, None) => bail!("give --data-dir PATH or --mount MOUNTPOINT"),
        }
    }

    /// The example option shown in hints.
    fn flag(&self) -> String {
        match (&self.data_dir, &self.mount) {
            (Some(d), _) => format!("--data-dir {}", d.display()),
            (None, Some(m)) => format!("--mount {}", m.display()),
            (None, None) => String::new(),
        }
    }
}

#[derive(clap::Subcommand, Debug)]
pub enum SnapshotCmd {
    /// Name the current state (pins its commit against pruning).
    Create {
        name: String,
        #[command(flatten)]
        at: Where,
    },
    /// List named snapshots.
    List {
        #[command(flatten)]
        at: Where,
    },
    /// Forget a named snapshot (its commit may then be pruned).
    Delete {
        name: String,
        #[command(flatten)]
        at: Where,
    },
}

#[derive(clap::Args, Debug)]
pub struct DiffArgs {
    /// The old side: a snapshot name, a commit id (memfs log), or - for the live tree.
    pub a: String,
    /// The new side, as A (default: -, the live tree).
    #[arg(default_value = "-")]
    pub b: String,
    #[command(flatten)]
    pub at: Where,
}

#[derive(clap::Args, Debug)]
pub struct LogArgs {
    #[arg(long, value_name = "PATH")]
    pub data_dir: PathBuf,
    /// How many of the most recent commits to show.
    #[arg(short = 'n', long, default_value_t = 20)]
    pub count: usize,
}

#[derive(clap::Args, Debug)]
pub struct RollbackArgs {
    #[command(flatten)]
    pub at: Where,
    /// A commit id (from memfs log) or a snapshot name.
    #[arg(long, value_name = "COMMIT|SNAPSHOT")]
    pub to: String,
    /// Discard the later commits without asking.
    #[arg(long, short = 'y')]
    pub yes: bool,
}

#[derive(clap::Args, Debug)]
pub struct FsckArgs {
    #[arg(long, value_name = "PATH")]
    pub data_dir: PathBuf,
    /// Cut the journal back to its last intact commit (says first what is lost).
    #[arg(long)]
    pub repair: bool,
    /// With --repair: do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub yes: bool,
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// The mount point of a durable memfs, or of a volume (memfs mount --cluster).
    #[arg(required_unless_present = "data_dir")]
    pub mountpoint: Option<PathBuf>,
    /// Or its data directory (also when it is not mounted).
    #[arg(long, value_name = "PATH", conflicts_with = "mountpoint")]
    pub data_dir: Option<PathBuf>,
}

fn is_locked(e: &DError) -> bool {
    matches!(e, DError::Journal(memfs_journal::Error::Locked { .. }))
}

fn check_dir(dir: &Path) -> anyhow::Result<()> {
    if !dir.is_dir() {
        bail!("data directory {} does not exist", dir.display());
    }
    Ok(())
}

fn fmt_time_ns(ns: u64) -> String {
    fmt_time((ns / 1_000_000_000) as i64, (ns % 1_000_000_000) as u32)
}

/// UTC `YYYY-MM-DD HH:MM:SS.mmm`.
fn fmt_time(sec: i64, nsec: u32) -> String {
    let (y, m, d, h, min, s) = memfs_bench::common::civil_utc(sec);
    format!(
        "{y:04}-{m:02}-{d:02} {h:02}:{min:02}:{s:02}.{:03}",
        nsec / 1_000_000
    )
}

fn print_snapshot(s: &SnapshotEntry) {
    println!(
        "{:<24} commit {:<10} {}",
        s.name,
        s.commit,
        fmt_time_ns(s.time_ns)
    );
}

fn parse_snapshot_line(l: &str) -> anyhow::Result<SnapshotEntry> {
    let f: Vec<&str> = l.split(' ').collect();
    match f.as_slice() {
        [n, c, t] => Ok(SnapshotEntry {
            name: n.to_string(),
            commit: c.parse()?,
            time_ns: t.parse()?,
        }),
        _ => bail!("unexpected reply line {l:?}"),
    }
}

/// The in-memory mount `at` names, if it names one (its snapshots are the
/// engine's, asked for through the mount's control socket).
fn memory_mount(at: &Where) -> Option<&Path> {
    let m = at.mount.as_deref()?;
    (at.data_dir.is_none() && memfs_fuse::mounts::is_mounted(m) && !control::is_durable_mount(m))
        .then_some(m)
}

/// One line of `snap-list`: `NAME ID CREATED_NS NODES BYTES`.
fn print_snap_line(l: &str) -> anyhow::Result<()> {
    let f: Vec<&str> = l.rsplitn(5, ' ').collect();
    let [bytes, nodes, ns, id, name] = f.as_slice() else {
        bail!("unexpected reply line {l:?}");
    };
    println!(
        "{name:<24} id {id:<10} {}  {nodes} nodes, {} of data",
        fmt_time_ns(ns.parse()?),
        crate::human::bytes(bytes.parse()?)
    );
    Ok(())
}

/// `memfs snapshot ... --mount M` for an in-memory mount.
fn run_memory_snapshot(cmd: SnapshotCmd, mp: &Path) -> anyhow::Result<()> {
    match cmd {
        SnapshotCmd::Create { name, .. } => {
            durable::check_snapshot_name(&name)?;
            control::mount_request(mp, &format!("snap-create {name}"))?;
            println!(
                "snapshot {name} created; browse it in {}",
                mp.join(".snapshots").join(&name).display()
            );
        }
        SnapshotCmd::Delete { name, .. } => {
            control::mount_request(mp, &format!("snap-delete {name}"))?;
            println!("snapshot {name} deleted");
        }
        SnapshotCmd::List { .. } => {
            let lines = control::mount_request(mp, "snap-list")?;
            if lines.is_empty() {
                println!(
                    "no snapshots (create one with: memfs snapshot create NAME --mount {})",
                    mp.display()
                );
            }
            for l in &lines {
                print_snap_line(l)?;
            }
        }
    }
    Ok(())
}

pub fn run_snapshot(a: SnapshotArgs) -> anyhow::Result<()> {
    let at = match &a.cmd {
        SnapshotCmd::Create { at, .. }
        | SnapshotCmd::List { at }
        | SnapshotCmd::Delete { at, .. } => at,
    };
    if let Some(mp) = memory_mount(at) {
        let mp = mp.to_path_buf();
        return run_memory_snapshot(a.cmd, &mp);
    }
    match a.cmd {
        SnapshotCmd::Create { name, at } => {
            durable::check_snapshot_name(&name)?;
            let data_dir = at.dir()?;
            let s = match durable::snapshot_create_offline(&data_dir, &name) {
                Err(e) if is_locked(&e) => parse_snapshot_line(
                    control::request(&data_dir, &format!("snapshot-create {name}"))?
                        .first()
                        .context("empty reply")?,
                )?,
                r => r?,
            };
            println!("snapshot {} created at commit {}", s.name, s.commit);
        }
        SnapshotCmd::Delete { name, at } => {
            let data_dir = at.dir()?;
            let s = match durable::snapshot_delete_offline(&data_dir, &name) {
                Err(e) if is_locked(&e) => parse_snapshot_line(
                    control::request(&data_dir, &format!("snapshot-delete {name}"))?
                        .first()
                        .context("empty reply")?,
                )?,
                r => r?,
            };
            println!("snapshot {} (commit {}) deleted", s.name, s.commit);
        }
        SnapshotCmd::List { at } => {
            let data_dir = at.dir()?;
            let list = match memfs_journal::DataDir::open(&data_dir, false) {
                Err(memfs_journal::Error::Locked { .. }) => {
                    control::request(&data_dir, "snapshot-list")?
                        .iter()
                        .map(|l| parse_snapshot_line(l))
                        .collect::<anyhow::Result<Vec<_>>>()?
                }
                Err(e) => return Err(e.into()),
                Ok(_lock) => durable::History::load(&data_dir)?.snapshots,
            };
            if list.is_empty() {
                println!(
                    "no snapshots (create one with: memfs snapshot create NAME {})",
                    at.flag()
                );
            }
            for s in &list {
                print_snapshot(s);
            }
        }
    }
    Ok(())
}

/// `+ path`, `- path`, `M path`, `R old -> new`, one per line, like `zfs diff`.
pub fn run_diff(a: DiffArgs) -> anyhow::Result<()> {
    for side in [&a.a, &a.b] {
        if side.contains(char::is_whitespace) {
            bail!("bad side {side:?}: a snapshot name, a commit id or -");
        }
    }
    if let Some(mp) = memory_mount(&a.at) {
        let lines = control::mount_request(mp, &format!("snap-diff {} {}", a.a, a.b))?;
        let mut out = std::io::stdout().lock();
        for l in lines {
            writeln!(out, "{l}")?;
        }
        return Ok(());
    }
    let dir = a.at.dir()?;
    let lines: Vec<String> = match durable::history::diff_offline(&dir, &a.a, &a.b) {
        Err(e) if is_locked(&e) => control::request(&dir, &format!("diff {} {}", a.a, a.b))?,
        r => r?.iter().map(ToString::to_string).collect(),
    };
    let mut out = std::io::stdout().lock();
    for l in lines {
        writeln!(out, "{l}")?;
    }
    Ok(())
}

pub fn run_log(a: LogArgs) -> anyhow::Result<()> {
    check_dir(&a.data_dir)?;
    let entries = durable::log(&a.data_dir, a.count)?;
    if entries.is_empty() {
        println!("no commits in the retained journal");
    }
    println!(
        "{:>10}  {:<23}  {:<11} {:>8}  {:>9}  what",
        "commit", "time (UTC)", "operation", "inode", "bytes"
    );
    for e in entries {
        let time = e
            .time
            .map_or_else(|| "-".to_string(), |(s, n)| fmt_time(s, n));
        let what = match (&e.name, e.data) {
            (Some(n), _) => format!("{n:?}"),
            (None, d) if d > 0 => format!("{d} bytes of data"),
            _ => String::new(),
        };
        println!(
            "{:>10}  {:<23}  {:<11} {:>8}  {:>9}  {what}",
            e.commit, time, e.op, e.ino, e.bytes
        );
    }
    Ok(())
}

fn confirm(question: &str, yes: bool) -> anyhow::Result<()> {
    if yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        bail!("{question}: refusing without confirmation (pass --yes)");
    }
    eprint!("{question}? [y/N] ");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    if !matches!(line.trim(), "y" | "Y" | "yes") {
        bail!("cancelled; nothing changed");
    }
    Ok(())
}

/// Online rollback of an in-memory mount to one of its snapshots.
fn run_memory_rollback(a: &RollbackArgs, mp: &Path) -> anyhow::Result<()> {
    confirm(
        &format!(
            "roll {} back to snapshot {}: every change since is lost",
            mp.display(),
            a.to
        ),
        a.yes,
    )?;
    let reply = control::mount_request(mp, &format!("snap-rollback {}", a.to))?;
    let f: Vec<&str> = reply
        .first()
        .map(|l| l.split(' ').collect())
        .unwrap_or_default();
    let [inodes, names, us, rest @ ..] = f.as_slice() else {
        bail!("unexpected reply {reply:?}");
    };
    let ms = |us: &str| us.parse::<f64>().unwrap_or(0.0) / 1000.0;
    let detail = match rest {
        [changed, entries, _wait, engine, inval] => format!(
            "engine {:.1} ms, kernel invalidation {:.1} ms: {inodes} of {changed} changed nodes and \
             {names} of {entries} names invalidated, the others not cached by the kernel",
            ms(engine),
            ms(inval)
        ),
        _ => format!("{inodes} nodes and {names} names invalidated"),
    };
    println!(
        "rolled {} back to snapshot {} in {:.1} ms ({detail}); the mount shows it now",
        mp.display(),
        a.to,
        ms(us)
    );
    Ok(())
}

pub fn run_rollback(a: RollbackArgs) -> anyhow::Result<()> {
    if let Some(mp) = memory_mount(&a.at) {
        let mp = mp.to_path_buf();
        return run_memory_rollback(&a, &mp);
    }
    let dir = a.at.dir()?;
    let online = match memfs_journal::DataDir::open(&dir, false) {
        Err(memfs_journal::Error::Locked { .. }) => true,
        Err(e) => return Err(e.into()),
        Ok(lock) => {
            drop(lock);
            false
        }
    };
    if a.at.mount.is_some() && !online {
        bail!("{} is not served by a running memfs", dir.display());
    }
    if a.at.mount.is_none() && online {
        // Naming the mount is the consent to change what its users see.
        bail!(
            "{} is in use by a running memfs: roll it back online with memfs rollback --mount MOUNTPOINT, or unmount it first (memfs umount MOUNTPOINT)",
            dir.display()
        );
    }
    let target = durable::resolve_target(&dir, &a.to)?;
    let plan = durable::plan_rollback(&dir, target)?;
    if plan.commits_lost() == 0 {
        println!("already at commit {target}: nothing to do");
        return Ok(());
    }
    println!(
        "rolling back {}{} from commit {} to commit {target}: {} later commits will be discarded",
        dir.display(),
        if online { " (mounted)" } else { "" },
        plan.last,
        plan.commits_lost()
    );
    for s in &plan.lost_snapshots {
        println!(
            "  snapshot {} (commit {}) will be deleted",
            s.name, s.commit
        );
    }
    confirm(
        &format!("discard commits {}..={}", target + 1, plan.last),
        a.yes,
    )?;
    if online {
        control::request(&dir, &format!("rollback {target}"))?;
        println!("rolled back to commit {target}; the mount shows it now");
        return Ok(());
    }
    durable::rollback(&dir, &plan)?;
    println!("rolled back to commit {target}; mount it to use it");
    Ok(())
}

fn print_marker(m: &durable::ReadOnlyMarker) {
    println!(
        "last run: turned READ-ONLY at {} after commit {}: {}",
        fmt_time_ns(m.time_ns),
        m.durable_commit,
        m.reason
    );
    println!(
        "  (operations refused with EIO then may or may not be in the journal; everything acknowledged is)"
    );
}

/// The data directory `memfs status` reports on: given, or the one a
/// durable mount names as its source.
fn status_data_dir(a: &StatusArgs) -> anyhow::Result<PathBuf> {
    Ok(match (&a.data_dir, &a.mountpoint) {
        (Some(d), _) => d.clone(),
        (None, Some(mp)) => {
            if !memfs_fuse::mounts::is_mounted(mp) {
                bail!("{} is not mounted", mp.display());
            }
            crate::mount_table::source(mp)
                .map(PathBuf::from)
                .filter(|p| p.is_absolute() && control::socket_path(p).exists())
                .with_context(|| {
                    format!(
                        "{} is not a durable memfs mount (no data directory with a control socket as its source)",
                        mp.display()
                    )
                })?
        }
        (None, None) => bail!("give a mount point or --data-dir"),
    })
}

pub fn run_status(a: StatusArgs) -> anyhow::Result<()> {
    if a.data_dir.is_none()
        && let Some(mp) = &a.mountpoint
        && crate::volume_mount::is_volume_mount(mp)
    {
        return crate::volume_mount::print_status(mp);
    }
    let data_dir = status_data_dir(&a)?;
    check_dir(&data_dir)?;
    // Ask the server first: a directory on a disk gone read-only cannot
    // even be locked to find out whether it is in use.
    let lines = match control::request(&data_dir, "status") {
        Ok(lines) => lines,
        Err(e) => match memfs_journal::DataDir::open(&data_dir, false) {
            Err(memfs_journal::Error::Locked { .. }) => return Err(e.into()),
            Err(e) => return Err(e.into()),
            Ok(lock) => {
                // Nobody serves it: what the directory itself tells.
                println!("data dir: {}", data_dir.display());
                println!("state: not mounted");
                match durable::read_only_marker(&data_dir)? {
                    Some(m) => print_marker(&m),
                    None => println!("last run: ended writable"),
                }
                drop(lock);
                return Ok(());
            }
        },
    };
    let field = |key: &str| {
        lines
            .iter()
            .flat_map(|l| l.split(' '))
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or("?")
            .to_string()
    };
    println!("data dir: {}", data_dir.display());
    if let Some(mp) = &a.mountpoint {
        println!("mount: {}", mp.display());
    }
    println!("mode: {}", field("durability"));
    println!(
        "commit: {} (durable through {})",
        field("last_commit"),
        field("durable_commit")
    );
    let ro = lines
        .iter()
        .find_map(|l| l.strip_prefix("read_only="))
        .unwrap_or("?");
    match ro.strip_prefix("yes") {
        Some(reason) => println!(
            "state: READ-ONLY (every change fails with EROFS, reads are served): {}",
            reason.trim()
        ),
        None => println!("state: read-write"),
    }
    Ok(())
}

pub fn run_fsck(a: FsckArgs) -> anyhow::Result<()> {
    check_dir(&a.data_dir)?;
    let lock = match memfs_journal::DataDir::open(&a.data_dir, false) {
        Err(memfs_journal::Error::Locked { .. }) => bail!(
            "{} is in use by a running memfs: unmount it first",
            a.data_dir.display()
        ),
        r => r?,
    };
    let dir = &a.data_dir;
    check_journal(&a)?;
    let manifest = memfs_journal::Manifest::load(dir)?;
    let base = manifest.as_ref().and_then(|m| m.checkpoint);
    match &base {
        Some(b) => println!(
            "checkpoint: commit {} (journal needed through {})",
            b.commit, b.required_end
        ),
        None => println!("checkpoint: none (the journal starts the history)"),
    }
    if let Some(m) = durable::read_only_marker(dir)? {
        print_marker(&m);
    }
    let h = durable::History::load(dir)?;
    println!(
        "history: {} checkpoints kept, {} named snapshots",
        h.checkpoints.len(),
        h.snapshots.len()
    );
    drop(lock);
    check_tree(dir, base)?;
    println!("clean");
    Ok(())
}

/// The journal's part of `fsck`: its segments, a torn tail, damage, and the
/// repair of that damage when asked.
fn check_journal(a: &FsckArgs) -> anyhow::Result<()> {
    let dir = &a.data_dir;
    let v = memfs_journal::recovery::verify(dir)?;
    println!(
        "journal: {} segments, {} bytes, commits {}..={}",
        v.segments,
        v.bytes,
        v.first_commit.unwrap_or(0),
        v.last_commit
    );
    if let Some(t) = &v.torn_tail {
        println!(
            "journal: torn last commit at {}:{} ({} bytes; an interrupted write, dropped at mount)",
            t.file.display(),
            t.offset,
            v.bytes_after_damage
        );
    }
    if let Some(d) = &v.corruption {
        println!(
            "journal: DAMAGED at {} offset {}: {}",
            d.file.display(),
            d.offset,
            d.reason
        );
        println!(
            "journal: intact up to commit {}; a repair drops {} bytes and {} later segments",
            v.last_commit, v.bytes_after_damage, v.segments_after_damage
        );
        if !a.repair {
            bail!(
                "the journal is damaged; run memfs fsck --data-dir {} --repair to recover to commit {}",
                dir.display(),
                v.last_commit
            );
        }
        confirm(
            &format!(
                "drop everything after commit {} ({} bytes)",
                v.last_commit, v.bytes_after_damage
            ),
            a.yes,
        )?;
        let r = memfs_journal::recovery::repair(dir)?;
        println!(
            "journal: repaired; it now ends at commit {} ({} bytes dropped, {} files removed)",
            r.last_commit,
            r.bytes_dropped,
            r.files_removed.len()
        );
    }
    Ok(())
}

/// The tree's part of `fsck`: rebuilt from the checkpoint and the journal,
/// then checked for consistency.
fn check_tree(dir: &Path, base: Option<memfs_journal::CheckpointRef>) -> anyhow::Result<()> {
    let (fs, last) = durable::rebuild(dir, base, None, Config::default())
        .context("rebuilding the file system from the checkpoint and journal")?;
    let problems = fs.check_consistency();
    println!(
        "tree: {} nodes at commit {last}, {} problems",
        fs.inode_count(),
        problems.len()
    );
    for p in &problems {
        println!("  {p}");
    }
    if !problems.is_empty() {
        bail!("the file system tree is inconsistent");
    }
    Ok(())
}

#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["data_dir", "cluster"])))]
pub struct SendArgs {
    /// The snapshot to send; with --cluster, the snapshot name the stream
    /// gives the volume's tree (default: the volume's name).
    pub name: Option<String>,
    /// Send only the changes since this older snapshot (the receiver's latest).
    #[arg(long, value_name = "BASE", conflicts_with = "cluster")]
    pub from: Option<String>,
    /// The data directory (not mounted).
    #[arg(long, value_name = "PATH")]
    pub data_dir: Option<PathBuf>,
    #[command(flatten)]
    pub volume: VolumeAt,
    /// Write the stream to FILE instead of standard output.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// A volume as the source or the target of a stream.
#[derive(clap::Args, Debug)]
pub struct VolumeAt {
    /// Send or receive a volume of this Redis Cluster instead of a data
    /// directory: redis://HOST:PORT[,HOST:PORT...] (with --volume).
    #[arg(
        long,
        value_name = "URL",
        requires = "volume",
        conflicts_with = "data_dir"
    )]
    pub cluster: Option<String>,
    /// The volume: sent whole (always a full stream); received into if it
    /// is empty, created if it does not exist.
    #[arg(long, value_name = "NAME", requires = "cluster")]
    pub volume: Option<String>,
}

impl VolumeAt {
    fn at(&self) -> Option<crate::volume_send::At<'_>> {
        match (&self.cluster, &self.volume) {
            (Some(cluster), Some(volume)) => Some(crate::volume_send::At { cluster, volume }),
            _ => None,
        }
    }
}

#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["data_dir", "cluster"])))]
pub struct ReceiveArgs {
    /// The data directory to rebuild into (not mounted): new or empty for a
    /// full stream, holding BASE as its latest snapshot for an incremental one.
    #[arg(long, value_name = "PATH")]
    pub data_dir: Option<PathBuf>,
    #[command(flatten)]
    pub volume: VolumeAt,
}

fn mib_per_s(bytes: u64, t: std::time::Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / t.as_secs_f64().max(1e-9)
}

/// Where the stream goes: `-o FILE`, or stdout (never a terminal).
fn stream_out(a: &SendArgs, example: &str) -> anyhow::Result<std::fs::File> {
    use std::os::fd::AsFd;
    if let Some(p) = &a.output {
        return std::fs::File::create(p).with_context(|| format!("creating {}", p.display()));
    }
    let stdout = std::io::stdout();
    if stdout.is_terminal() {
        bail!(
            "memfs send writes a binary stream: redirect it to a file or a pipe, or give -o FILE ({example} > FILE)"
        );
    }
    // Straight to the descriptor: Stdout is line-buffered, which would cut
    // binary data at every newline byte.
    let fd = stdout
        .as_fd()
        .try_clone_to_owned()
        .context("duplicating stdout")?;
    Ok(std::fs::File::from(fd))
}

/// `memfs send NAME [--from BASE] --data-dir D > FILE`, or `memfs send
/// [NAME] --cluster URL --volume V > FILE`: the stream goes to stdout (or
/// `-o FILE`), the summary to stderr.
pub fn run_send(a: SendArgs) -> anyhow::Result<()> {
    let t0 = std::time::Instant::now();
    let r = if let Some(at) = a.volume.at() {
        let example = format!("memfs send --cluster {} --volume {}", at.cluster, at.volume);
        let mut out = std::io::BufWriter::with_capacity(1 << 20, stream_out(&a, &example)?);
        let r = crate::volume_send::send(&at, a.name.as_deref(), &mut out)?;
        out.flush().context("writing the stream")?;
        r
    } else {
        let (Some(dir), Some(name)) = (&a.data_dir, &a.name) else {
            bail!(
                "memfs send NAME --data-dir D: name the snapshot to send (memfs snapshot list --data-dir D shows them)"
            );
        };
        check_dir(dir)?;
        let example = format!("memfs send {name} --data-dir {}", dir.display());
        let mut out = std::io::BufWriter::with_capacity(1 << 20, stream_out(&a, &example)?);
        let r = durable::send::send(dir, name, a.from.as_deref(), &mut out)?;
        out.flush().context("writing the stream")?;
        r
    };
    let t = t0.elapsed();
    let what = match &r.header.base {
        Some((b, bc, _)) => format!(
            "changes from snapshot {b} (commit {bc}) to {} (commit {}): {} commits",
            r.header.name, r.header.commit, r.records
        ),
        None if a.volume.at().is_some() => {
            format!("{} as snapshot {}", r.header.source, r.header.name)
        }
        None => format!("snapshot {} (commit {})", r.header.name, r.header.commit),
    };
    eprintln!(
        "sent {what}; {} MiB in {:.2} s ({:.0} MiB/s); tree: {}",
        r.bytes >> 20,
        t.as_secs_f64(),
        mib_per_s(r.bytes, t),
        r.tree
    );
    Ok(())
}

/// Crash tests stop `memfs receive` inside its commit step with this (an
/// environment variable, not an option: nobody should find it in --help).
fn stall_before_commit_point() {
    eprintln!("memfs receive: stalled before the commit point");
    loop {
        std::thread::park();
    }
}

/// What `memfs receive` rebuilds a stream in.
enum Target<'a> {
    Dir(&'a Path),
    Volume(crate::volume_send::At<'a>),
}

/// `memfs receive --data-dir D2 < FILE`, or `memfs receive --cluster URL
/// --volume V < FILE`.
pub fn run_receive(a: ReceiveArgs) -> anyhow::Result<()> {
    use std::os::fd::AsFd;
    let target = match (a.data_dir.as_deref(), a.volume.at()) {
        (Some(d), _) => Target::Dir(d),
        (None, Some(at)) => Target::Volume(at),
        (None, None) => bail!("memfs receive: give --data-dir D or --cluster URL --volume V"),
    };
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        let args = match &target {
            Target::Dir(d) => format!("--data-dir {}", d.display()),
            Target::Volume(at) => format!("--cluster {} --volume {}", at.cluster, at.volume),
        };
        bail!(
            "memfs receive reads a stream from memfs send on its standard input (memfs receive {args} < FILE)"
        );
    }
    let fd = stdin
        .as_fd()
        .try_clone_to_owned()
        .context("duplicating stdin")?;
    // Unbuffered: the receiver reads whole frames (a 9-byte header, then
    // up to 1 MiB straight into its frame buffer); a BufReader would copy
    // every byte once more.
    let mut inp = std::fs::File::from(fd);
    let t0 = std::time::Instant::now();
    let (r, into) = match target {
        Target::Dir(dir) => {
            let opts = durable::send::ReceiveOptions {
                before_commit_point: std::env::var_os("MEMFS_TEST_RECEIVE_STALL")
                    .map(|_| stall_before_commit_point as fn()),
            };
            let r = durable::send::receive(dir, &mut inp, opts)?;
            (r, dir.display().to_string())
        }
        Target::Volume(at) => {
            let r = crate::volume_send::receive(&at, &mut inp)?;
            (r, format!("volume {}", at.volume))
        }
    };
    let t = t0.elapsed();
    let what = match &r.header.base {
        Some((b, _, _)) => format!(
            "changes from snapshot {b} to {} ({} commits)",
            r.header.name, r.records
        ),
        None => format!("snapshot {}", r.header.name),
    };
    let tree = match r.tree {
        Some(t) => t.to_string(),
        None => "not computed (the stream carries none to compare)".into(),
    };
    eprintln!(
        "received {what} into {into}; {} MiB in {:.2} s ({:.0} MiB/s); tree: {tree}",
        r.bytes >> 20,
        t.as_secs_f64(),
        mib_per_s(r.bytes, t),
    );
    Ok(())
}
