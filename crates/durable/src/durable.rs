//! A file system backed by a data directory: every mutation is a journal
//! commit, checkpoints are written in the background, and opening the
//! directory recovers the newest state. Also: named snapshots, history and
//! rollback. The protocol and formats are in `docs/durability.md`.
//!
//! Data directory contents, beyond the journal's own files (`LOCK`,
//! `journal-*.log`, `MANIFEST`, `snapshot-*.snap`, see `docs/journal.md`):
//! - `HISTORY`: the checkpoints kept (commit, required end, time) and the
//!   named snapshots (name, commit, time); rewritten atomically.
//! - `READ-ONLY`: present when a run turned read-only after an I/O error
//!   (written when the disk lets us, at the failure or at close); the next
//!   open reports and removes it, so `memfs fsck` can tell meanwhile.
//!
//! The manifest's user data holds a pending rollback ("rollback=C"), so a
//! crash in the middle of one is finished at the next open.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use memfs_journal::recovery::{self, RecoveryReport};
use memfs_journal::snapshot::{list_snapshots, snapshot_file_name};
use memfs_journal::{
    DataDir, Journal, JournalOptions, Manifest, SnapshotReader, SnapshotRef, SnapshotWriter, Token,
};
use parking_lot::{Condvar, Mutex};

/// The journal underneath (verify, repair, the data directory lock).
pub use memfs_journal as journal;
pub use memfs_journal::Durability;

use crate::image::{self, ImageInfo};
use memfs_fs::{Config, Errno, Fs, Mutation, Recorder};

const HISTORY_FILE: &str = "HISTORY";
const HISTORY_HEADER: &str = "memfs-history 1";
pub(crate) const ROLLBACK_PREFIX: &str = "rollback=";
/// The marker of a run that ended read-only (see the module comment).
pub const READ_ONLY_FILE: &str = "READ-ONLY";

/// Errors of a durable file system; each names what it concerns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Journal(#[from] memfs_journal::Error),
    #[error("checkpoint {file} is damaged: {reason}")]
    Image { file: PathBuf, reason: String },
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How far back history reaches; the journal and checkpoints behind it are
/// deleted. Any limit that is set is honoured (the window is the largest
/// that all allow). Named snapshots are always kept reachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub commits: Option<u64>,
    pub age: Option<Duration>,
    pub bytes: Option<u64>,
}

impl Default for Retention {
    /// An hour of history.
    fn default() -> Self {
        Retention {
            commits: None,
            age: Some(Duration::from_secs(3600)),
            bytes: None,
        }
    }
}

fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("bad duration {s:?}: expected e.g. 90s, 10m, 1h, 7d"))?;
    let mult = match unit {
        "" | "s" => 1,
        "ms" => return Ok(Duration::from_millis(n)),
        "m" | "min" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return Err(format!("bad duration unit in {s:?}: use ms, s, m, h or d")),
    };
    Ok(Duration::from_secs(n.saturating_mul(mult)))
}

/// Parses `90s`, `10m`, `1h`, `7d`, `250ms`.
pub fn parse_duration_arg(s: &str) -> std::result::Result<Duration, String> {
    parse_duration(s)
}

fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("bad size {s:?}: expected e.g. 512M, 4G"))?;
    let shift = match unit
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("bad size unit in {s:?}: use K, M, G or T")),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

impl std::str::FromStr for Retention {
    type Err = String;

    /// `commits=N`, `age=DURATION`, `bytes=SIZE`, comma-separated; `all`
    /// keeps everything.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let mut r = Retention {
            commits: None,
            age: None,
            bytes: None,
        };
        if s == "all" {
            return Ok(r);
        }
        for part in s.split(',') {
            let (k, v) = part.split_once('=').ok_or_else(|| {
                format!("bad retention {part:?}: use commits=N, age=DURATION or bytes=SIZE")
            })?;
            match k.trim() {
                "commits" => {
                    r.commits = Some(
                        v.trim()
                            .parse()
                            .map_err(|_| format!("bad commit count {v:?}"))?,
                    )
                }
                "age" => r.age = Some(parse_duration(v)?),
                "bytes" => r.bytes = Some(parse_bytes(v)?),
                _ => {
                    return Err(format!(
                        "unknown retention limit {k:?}: use commits, age or bytes"
                    ));
                }
            }
        }
        Ok(r)
    }
}

/// Parses a durability mode. Plain `async` queues up to 4096 commits (a
/// file system commits once per operation, far more often than a block
/// store); the journal's own syntax is accepted too.
pub fn parse_durability(s: &str) -> std::result::Result<Durability, String> {
    match s {
        "async" => Ok(Durability::Async {
            max_pending: 4096,
            max_pending_bytes: memfs_journal::durability::DEFAULT_MAX_PENDING_BYTES,
        }),
        "relaxed" => Err("relaxed needs a commit count: relaxed=N".into()),
        _ => s.parse(),
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    pub durability: Durability,
    /// Write a checkpoint this often when anything changed (`None`: only
    /// by journal volume and at close).
    pub checkpoint_interval: Option<Duration>,
    /// ... or once the journal has grown this much since the last one.
    pub checkpoint_bytes: u64,
    pub retention: Retention,
    pub segment_size: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            durability: Durability::Sync,
            checkpoint_interval: Some(Duration::from_secs(300)),
            checkpoint_bytes: 256 << 20,
            retention: Retention::default(),
            segment_size: 64 << 20,
        }
    }
}

/// What opening a data directory did.
#[derive(Debug, Clone, Default)]
pub struct OpenReport {
    pub created: bool,
    /// The checkpoint loaded, if any.
    pub checkpoint: Option<ImageInfo>,
    pub load_time: Duration,
    pub journal: RecoveryReport,
    pub last_commit: u64,
    /// A rollback interrupted by a crash and finished now.
    pub finished_rollback: Option<u64>,
    /// The manifest's checkpoint could not be loaded: why, and what was
    /// used instead (an older checkpoint, or the journal from commit 1).
    pub fell_back: Option<String>,
    /// The previous run turned read-only after an I/O error: its marker.
    pub previous_read_only: Option<ReadOnlyMarker>,
}

/// What the `READ-ONLY` marker records about a run that turned read-only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadOnlyMarker {
    pub reason: String,
    pub time_ns: u64,
    /// The last commit known durable when it failed: later ones were
    /// refused (EIO, durability unknown) or never acknowledged.
    pub durable_commit: u64,
}

impl ReadOnlyMarker {
    fn encode(&self) -> String {
        format!(
            "memfs-read-only 1\ntime_ns={}\ndurable_commit={}\nreason={}\n",
            self.time_ns,
            self.durable_commit,
            self.reason.replace('\n', " ")
        )
    }

    fn decode(text: &str) -> Option<ReadOnlyMarker> {
        let mut m = ReadOnlyMarker::default();
        let mut lines = text.lines();
        if lines.next()? != "memfs-read-only 1" {
            return None;
        }
        for l in lines {
            match l.split_once('=')? {
                ("time_ns", v) => m.time_ns = v.parse().ok()?,
                ("durable_commit", v) => m.durable_commit = v.parse().ok()?,
                ("reason", v) => m.reason = v.to_string(),
                _ => {}
            }
        }
        Some(m)
    }
}

/// The `READ-ONLY` marker of `dir`, if its last run turned read-only and
/// the marker could be written. A marker that cannot be parsed is reported
/// with its raw text as the reason.
pub fn read_only_marker(dir: &Path) -> Result<Option<ReadOnlyMarker>> {
    Ok(
        memfs_journal::dir::read_file(dir, READ_ONLY_FILE)?.map(|b| {
            let t = String::from_utf8_lossy(&b);
            ReadOnlyMarker::decode(&t).unwrap_or(ReadOnlyMarker {
                reason: t.trim().replace('\n', " "),
                ..Default::default()
            })
        }),
    )
}

impl std::fmt::Display for OpenReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.created {
            return write!(f, "new data directory");
        }
        match &self.checkpoint {
            Some(c) => write!(
                f,
                "checkpoint at commit {} ({} nodes, {} pages) loaded in {:.3}s; ",
                c.commit,
                c.nodes,
                c.pages,
                self.load_time.as_secs_f64()
            )?,
            None => write!(f, "no checkpoint; ")?,
        }
        let secs = self.journal.elapsed.as_secs_f64();
        write!(
            f,
            "replayed {} commits ({:.1} MB, {:.0} MB/s) in {:.3}s; at commit {}",
            self.journal.commits_replayed,
            self.journal.bytes_replayed as f64 / 1e6,
            if secs > 0.0 {
                self.journal.bytes_replayed as f64 / 1e6 / secs
            } else {
                0.0
            },
            secs,
            self.last_commit
        )?;
        if let Some((file, off, n)) = &self.journal.truncated_tail {
            write!(
                f,
                "; cut a torn last commit ({n} bytes at {}:{off})",
                file.display()
            )?;
        }
        if let Some(c) = self.finished_rollback {
            write!(f, "; finished an interrupted rollback to commit {c}")?;
        }
        if let Some(why) = &self.fell_back {
            write!(f, "; WARNING: {why}")?;
        }
        if let Some(m) = &self.previous_read_only {
            write!(
                f,
                "; WARNING: the previous run turned read-only after commit {}: {}",
                m.durable_commit, m.reason
            )?;
        }
        Ok(())
    }
}

/// A checkpoint kept for recovery and rollback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointEntry {
    pub commit: u64,
    pub required_end: u64,
    pub time_ns: u64,
}

/// A named snapshot: a pinned commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotEntry {
    pub name: String,
    pub commit: u64,
    pub time_ns: u64,
}

/// The `HISTORY` file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    pub checkpoints: Vec<CheckpointEntry>,
    pub snapshots: Vec<SnapshotEntry>,
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Snapshot names: what is safe in a line-based file and on a command line.
pub fn check_snapshot_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-@:+".contains(&b))
        && !name.bytes().all(|b| b.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "bad snapshot name {name:?}: 1-64 characters of letters, digits and . _ - @ : +, not all digits, not starting with -"
        )))
    }
}

impl History {
    pub fn load(dir: &Path) -> Result<History> {
        let Some(bytes) = memfs_journal::dir::read_file(dir, HISTORY_FILE)? else {
            return Ok(History::default());
        };
        let path = dir.join(HISTORY_FILE);
        let bad = |line: usize, why: &str| {
            Error::Invalid(format!(
                "{} is damaged at line {line}: {why}",
                path.display()
            ))
        };
        let text = std::str::from_utf8(&bytes).map_err(|_| bad(1, "not text"))?;
        let mut lines = text.lines();
        if lines.next() != Some(HISTORY_HEADER) {
            return Err(bad(1, "unknown header"));
        }
        let mut h = History::default();
        for (i, line) in lines.enumerate() {
            let f: Vec<&str> = line.split(' ').collect();
            let num = |s: &str| s.parse::<u64>().map_err(|_| bad(i + 2, "bad number"));
            match f.as_slice() {
                ["checkpoint", c, r, t] => h.checkpoints.push(CheckpointEntry {
                    commit: num(c)?,
                    required_end: num(r)?,
                    time_ns: num(t)?,
                }),
                ["snapshot", n, c, t] => {
                    check_snapshot_name(n).map_err(|_| bad(i + 2, "bad snapshot name"))?;
                    h.snapshots.push(SnapshotEntry {
                        name: n.to_string(),
                        commit: num(c)?,
                        time_ns: num(t)?,
                    })
                }
                _ => return Err(bad(i + 2, "unknown line")),
            }
        }
        h.checkpoints.sort_by_key(|c| c.commit);
        Ok(h)
    }

    pub fn save(&self, dir: &Path) -> Result<()> {
        let mut s = String::from(HISTORY_HEADER);
        s.push('\n');
        for c in &self.checkpoints {
            s.push_str(&format!(
                "checkpoint {} {} {}\n",
                c.commit, c.required_end, c.time_ns
            ));
        }
        for n in &self.snapshots {
            s.push_str(&format!("snapshot {} {} {}\n", n.name, n.commit, n.time_ns));
        }
        memfs_journal::dir::write_file_atomic(dir, HISTORY_FILE, s.as_bytes())?;
        Ok(())
    }

    /// The newest checkpoint that can rebuild the state at `commit`.
    pub fn base_for(&self, commit: u64) -> Option<CheckpointEntry> {
        self.checkpoints
            .iter()
            .rev()
            .find(|c| c.required_end <= commit)
            .copied()
    }
}

thread_local! {
    /// The last commit this thread recorded and has not waited for yet,
    /// with the journal that appended it: the engine's recorder interface
    /// passes no value from `record` to `settle`, and the two may reach
    /// different file systems when an online rollback swaps the tree
    /// between them (docs/durability.md, "Settling").
    static PENDING: Cell<Option<Token>> = const { Cell::new(None) };
    /// Journal space this thread reserved for the operation it is running
    /// (with the id of the journal it belongs to), not yet used by a commit.
    static RESERVED: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

struct Shared {
    path: PathBuf,
    /// The directory's lock; dropped at close, so the directory can be
    /// reopened (or rolled back) while the old `Fs` is still referenced.
    dir: Mutex<Option<DataDir>>,
    /// Set at close: the old file system may no longer journal anything.
    closed: AtomicBool,
    journal: Journal,
    opts: Options,
    /// Serialises checkpoints, snapshot edits and pruning.
    admin: Mutex<()>,
    stop: Mutex<bool>,
    wake: Condvar,
    failed: AtomicBool,
    /// Why, when the failure was not the journal's own (a checkpoint).
    failed_why: Mutex<Option<String>>,
    /// Whether the `READ-ONLY` marker is on disk (written best effort).
    marked: AtomicBool,
    /// Called once when the file system turns read-only (the mount uses it
    /// to remount itself read-only).
    on_read_only: Mutex<Option<ReadOnlyHook>>,
}

type ReadOnlyHook = Box<dyn Fn(&str) + Send + Sync>;

impl Shared {
    /// Records that the journal failed: from now on the file system is
    /// read-only. Logs, writes the marker and calls the hook only once.
    fn mark_failed(&self, what: &str, e: &dyn std::fmt::Display) {
        {
            // Set before `failed`, so whoever sees `failed` finds the reason.
            let mut why = self.failed_why.lock();
            if self.failed.load(Ordering::Acquire) {
                return;
            }
            why.get_or_insert_with(|| format!("{what}: {e}"));
            self.failed.store(true, Ordering::Release);
        }
        tracing::error!(
            "journal {what} failed; the file system is now read-only (EROFS for every change, reads still served): {e}"
        );
        self.write_marker();
        if let Some(hook) = self.on_read_only.lock().as_ref() {
            hook(&self.read_only_reason());
        }
    }

    fn read_only_reason(&self) -> String {
        self.journal
            .stats()
            .failed
            .or_else(|| self.failed_why.lock().clone())
            .unwrap_or_else(|| "a journal operation failed".into())
    }

    /// Best effort: the disk that failed may refuse this too; close retries.
    fn write_marker(&self) {
        if !self.failed.load(Ordering::Acquire) || self.marked.load(Ordering::Acquire) {
            return;
        }
        let m = ReadOnlyMarker {
            reason: self.read_only_reason(),
            time_ns: now_ns(),
            durable_commit: self.journal.durable_commit(),
        };
        match memfs_journal::dir::write_file_atomic(
            &self.path,
            READ_ONLY_FILE,
            m.encode().as_bytes(),
        ) {
            Ok(()) => self.marked.store(true, Ordering::Release),
            Err(e) => tracing::warn!(
                "cannot write the read-only marker {} (will retry at close): {e}",
                self.path.join(READ_ONLY_FILE).display()
            ),
        }
    }
}

/// The recorder the engine calls: a journal append per mutation.
struct JournalRecorder {
    shared: Arc<Shared>,
}

impl JournalRecorder {
    /// Appends one commit: `encode` fills the record buffer (this thread's,
    /// reused) and appends it with whatever follows it to the journal,
    /// using the bytes `admit` reserved.
    fn append(
        &self,
        encode: impl FnOnce(&mut Vec<u8>, &Journal, u64) -> memfs_journal::Result<Token>,
    ) -> std::result::Result<u64, Errno> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(Errno(libc::EROFS));
        }

        let key = self.shared.journal.id().get();
        let reserved = RESERVED.with(|r| {
            let (k, n) = r.get();
            if k == key {
                r.set((0, 0));
                n
            } else {
                0
            }
        });
        thread_local! {
            static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let r = BUF.with(|b| {
            let mut buf = b.borrow_mut();
            buf.clear();
            encode(&mut buf, &self.shared.journal, reserved)
        });
        let token = r.map_err(|e| self.fail("append", e))?;
        // An operation that records several commits settles the last,
        // which covers the earlier ones only if ids grow within a journal.
        let earlier = PENDING.with(|p| p.replace(Some(token)));
        debug_assert!(
            earlier.is_none_or(|e| e.journal() != token.journal() || e.commit() < token.commit()),
            "{earlier:?} then {token:?}"
        );
        Ok(token.commit())
    }

    fn fail(&self, what: &str, e: memfs_journal::Error) -> Errno {
        self.shared.mark_failed(what, &e);
        Errno::EIO
    }

    /// Gives back what this thread reserved and no commit used.
    fn release_reserved(&self) {
        let key = self.shared.journal.id().get();
        let (k, n) = RESERVED.with(|r| r.replace((0, 0)));
        if n > 0 && k == key {
            self.shared.journal.release(n);
        }
    }
}

impl Recorder for JournalRecorder {
    fn admit(&self, bytes: u64) -> std::result::Result<(), Errno> {
        if self.shared.closed.load(Ordering::Acquire) || self.shared.failed.load(Ordering::Acquire)
        {
            return Err(Errno(libc::EROFS));
        }
        // A reservation left by an earlier operation of this thread that
        // failed before committing.
        self.release_reserved();
        match self.shared.journal.reserve(bytes) {
            Ok(n) => {
                RESERVED.with(|r| r.set((self.shared.journal.id().get(), n)));
                Ok(())
            }
            Err(memfs_journal::Error::NoSpace { source, .. }) => {
                tracing::debug!("journal reservation refused: {source}");
                Err(Errno::ENOSPC)
            }
            Err(e) => Err(self.fail("space reservation", e)),
        }
    }

    fn record(&self, m: &Mutation<'_>) -> std::result::Result<u64, Errno> {
        self.append(
            |buf, journal, reserved| match crate::codec::encode(m, buf) {
                Some(data) => journal.append_reserved(&[&buf[..], data], reserved),
                None => journal.append_reserved(&[&buf[..]], reserved),
            },
        )
    }

    fn record_write(
        &self,
        attr: &memfs_fs::Attr,
        offset: u64,
        parts: &[&[u8]],
    ) -> std::result::Result<u64, Errno> {
        let len = parts.iter().map(|p| p.len()).sum();
        self.append(|buf, journal, reserved| {
            crate::codec::encode_write_head(attr, offset, len, buf);
            // The same commit as `record` of the bytes in one slice: the
            // journal appends the parts as they are.
            let mut all: Vec<&[u8]> = Vec::with_capacity(parts.len() + 1);
            all.push(&buf[..]);
            all.extend_from_slice(parts);
            journal.append_reserved(&all, reserved)
        })
    }

    fn settle(&self) -> std::result::Result<(), Errno> {
        self.release_reserved();
        let Some(token) = PENDING.with(|p| p.take()) else {
            return Ok(());
        };
        if token.journal() != self.shared.journal.id() {
            // Recorded in a journal an online rollback has replaced since:
            // the rollback synced that journal before it swapped, so the
            // commit is durable there, and then either kept (at or before
            // the target) or undone with everything after the target, as
            // any write just before a rollback. Nothing is left to wait
            // for; the operation succeeded as it ran.
            tracing::debug!(
                commit = token.commit(),
                "settled a commit of a journal that was rolled back and replaced"
            );
            return Ok(());
        }
        self.shared
            .journal
            .complete(token)
            .map_err(|e| self.fail("write", e))
    }

    fn sync(&self) -> std::result::Result<(), Errno> {
        PENDING.with(|p| p.set(None));
        if self.shared.opts.durability == Durability::None {
            return Ok(());
        }
        self.shared
            .journal
            .sync()
            .map(|_| ())
            .map_err(|e| self.fail("sync", e))
    }
}

/// A file system with a data directory.
pub struct DurableFs {
    fs: Arc<Fs>,
    shared: Arc<Shared>,
    checkpointer: Option<JoinHandle<()>>,
}

/// See [`DurableFs::materializer`].
#[derive(Clone)]
pub struct Materializer(std::sync::Weak<Shared>);

impl Materializer {
    /// The tree as it was after `commit` (a retained commit), rebuilt aside
    /// under the admin lock (no checkpoint is pruned meanwhile).
    pub fn materialize(&self, commit: u64) -> Result<Fs> {
        let shared = self
            .0
            .upgrade()
            .filter(|s| !s.closed.load(Ordering::Acquire));
        let Some(shared) = shared else {
            return Err(Error::Invalid(
                "the data directory was closed or rolled back".into(),
            ));
        };
        materialize_in(&shared, commit)
    }
}

/// The tree as it was after `commit`, rebuilt aside while the directory is
/// in use (`crate::history::materialize`) from the synced journal; the admin
/// lock keeps checkpoints from being pruned meanwhile.
fn materialize_in(shared: &Shared, commit: u64) -> Result<Fs> {
    shared.journal.sync()?;
    let _g = shared.admin.lock();
    crate::history::materialize(&shared.path, commit, crate::history::materialize_config())
}

/// What a checkpoint did.
#[derive(Debug, Clone, Copy)]
pub struct CheckpointReport {
    pub info: ImageInfo,
    pub bytes: u64,
    pub elapsed: Duration,
    pub segments_pruned: usize,
    pub checkpoints_deleted: usize,
}

fn image_err(file: &Path, reason: impl Into<String>) -> Error {
    Error::Image {
        file: file.to_path_buf(),
        reason: reason.into(),
    }
}

/// Loads checkpoint `c` of `dir` into `fs`.
fn load_checkpoint(dir: &Path, c: &SnapshotRef, fs: &Fs) -> Result<ImageInfo> {
    let path = dir.join(snapshot_file_name(c.commit));
    let mut r = SnapshotReader::open(&path).map_err(|e| {
        image_err(
            &path,
            format!("the manifest names this checkpoint but it cannot be opened: {e}"),
        )
    })?;
    let info = image::read_image(fs, &mut r).map_err(|e| image_err(&path, e))?;
    if info.commit != c.commit || info.required_end != c.required_end {
        return Err(image_err(
            &path,
            format!(
                "image covers commits {}..{} but the manifest says {}..{}",
                info.commit, info.required_end, c.commit, c.required_end
            ),
        ));
    }
    Ok(info)
}

/// Loads the newest checkpoint that passes validation: the manifest's, or,
/// if that one is damaged, the newest older one in HISTORY from which the
/// journal still continues, or none if the journal starts at commit 1.
/// Returns the tree, the checkpoint used, its info, and the damaged one
/// with the reason.
#[allow(clippy::type_complexity)]
fn load_base(
    dir: &Path,
    config: Config,
    named: Option<SnapshotRef>,
) -> Result<(
    Fs,
    Option<SnapshotRef>,
    Option<ImageInfo>,
    Option<(SnapshotRef, String)>,
)> {
    let Some(named) = named else {
        return Ok((Fs::new(config), None, None, None));
    };
    let fs = Fs::new(config);
    let err = match load_checkpoint(dir, &named, &fs) {
        Ok(info) => return Ok((fs, Some(named), Some(info), None)),
        Err(e) => e,
    };
    let journal_from = recovery::list_segments(dir)?.first().map(|s| s.0);
    let reachable = |c: u64| journal_from.is_some_and(|f| f <= c + 1);
    let older: Vec<CheckpointEntry> = History::load(dir)
        .map(|h| h.checkpoints)
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.commit < named.commit && reachable(c.commit))
        .rev()
        .collect();
    for c in older {
        let r = SnapshotRef {
            commit: c.commit,
            required_end: c.required_end,
        };
        let fs = Fs::new(config);
        match load_checkpoint(dir, &r, &fs) {
            Ok(info) => return Ok((fs, Some(r), Some(info), Some((named, err.to_string())))),
            Err(e) => tracing::error!("older checkpoint is damaged too: {e}"),
        }
    }
    if reachable(0) {
        return Ok((Fs::new(config), None, None, Some((named, err.to_string()))));
    }
    Err(err)
}

/// After recovering around a damaged checkpoint: write a good one, then set
/// the damaged file aside (`.damaged`, for inspection) so that nothing
/// points to it. Failures only delay this to the next open.
fn replace_damaged(fs: &Fs, shared: &Shared, bad: SnapshotRef) {
    let dir = shared.path.as_path();
    let r = (|| -> Result<()> {
        {
            let _g = shared.admin.lock();
            let mut h = History::load(dir)?;
            h.checkpoints.retain(|c| c.commit != bad.commit);
            h.save(dir)?;
        }
        if checkpoint(fs, shared)?.is_none() {
            return Err(Error::Invalid("no checkpoint was written".into()));
        }
        let name = snapshot_file_name(bad.commit);
        std::fs::rename(dir.join(&name), dir.join(format!("{name}.damaged")))
            .map_err(|e| Error::Invalid(format!("cannot set {name} aside: {e}")))?;
        Ok(())
    })();
    match r {
        Ok(()) => tracing::warn!(
            "replaced damaged checkpoint {} (kept as .damaged)",
            snapshot_file_name(bad.commit)
        ),
        Err(e) => tracing::error!("could not replace the damaged checkpoint yet: {e}"),
    }
}

/// Reads a just-written checkpoint back through the loader's checks.
fn validate_checkpoint(path: &Path, want: &ImageInfo) -> Result<()> {
    let mut r = SnapshotReader::open(path)
        .map_err(|e| image_err(path, format!("cannot be read back: {e}")))?;
    let got = image::validate_image(&mut r).map_err(|e| image_err(path, e))?;
    if got != *want {
        return Err(image_err(
            path,
            format!("read back as {got:?}, written as {want:?}"),
        ));
    }
    Ok(())
}

/// Rebuilds the state at `upto` (or the newest) from `base` and the journal,
/// without opening the journal for writing. For `log`-like readers, fsck and
/// rollback previews.
pub fn rebuild(
    dir: &Path,
    base: Option<SnapshotRef>,
    upto: Option<u64>,
    config: Config,
) -> Result<(Fs, u64)> {
    let fs = Fs::new(config);
    let after = match &base {
        Some(b) => {
            load_checkpoint(dir, b, &fs)?;
            b.commit
        }
        None => 0,
    };
    let mut last = after;
    let mut decode_err = None;
    recovery::replay_readonly(dir, after, &mut |id, p| {
        if upto.is_some_and(|u| id > u) {
            return Ok(());
        }
        match crate::codec::decode(p) {
            Ok(m) => {
                fs.apply(&m);
                last = id;
                Ok(())
            }
            Err(e) => {
                decode_err = Some(id);
                Err(e)
            }
        }
    })?;
    fs.finish_rebuild(last);
    Ok((fs, last))
}

impl DurableFs {
    /// Opens (or creates) the data directory at `path` and recovers its
    /// newest state. A second opener of the same directory gets
    /// [`memfs_journal::Error::Locked`].
    pub fn open(path: &Path, config: Config, opts: Options) -> Result<(DurableFs, OpenReport)> {
        let dir = DataDir::open(path, true)?;
        Self::open_locked(path, dir, config, opts)
    }

    /// [`DurableFs::open`] with the directory's lock already held.
    fn open_locked(
        path: &Path,
        dir: DataDir,
        config: Config,
        opts: Options,
    ) -> Result<(DurableFs, OpenReport)> {
        let created = !memfs_journal::dir::exists(path, memfs_journal::manifest::MANIFEST_FILE)
            .unwrap_or(false)
            && recovery::list_segments(path).map_or(true, |s| s.is_empty());
        let mut report = OpenReport {
            created,
            ..Default::default()
        };
        report.finished_rollback = finish_rollback(path)?;
        let manifest = Manifest::load(path)?;
        let t0 = Instant::now();
        let named = manifest.as_ref().and_then(|m| m.snapshot);
        let (fs, base, info, damaged) = load_base(path, config, named)?;
        report.checkpoint = info;
        if let Some((bad, why)) = &damaged {
            let msg = format!(
                "checkpoint {} is damaged ({why}); recovered from {} and the journal instead",
                snapshot_file_name(bad.commit),
                base.map_or("commit 0".to_string(), |b| snapshot_file_name(b.commit))
            );
            tracing::error!("{msg}");
            report.fell_back = Some(msg);
        }
        report.load_time = t0.elapsed();
        let jopts = JournalOptions {
            durability: opts.durability,
            segment_size: opts.segment_size,
        };
        let after = base.map_or(0, |b| b.commit);
        let (journal, jrep) = Journal::open(&dir, jopts, after, &mut |_, p| {
            let m = crate::codec::decode(p)?;
            fs.apply(&m);
            Ok(())
        })?;
        // A damaged checkpoint was published, so the journal was durable
        // through its required end: the fallback must reach that far too.
        for b in base.iter().chain(damaged.iter().map(|(b, _)| b)) {
            if jrep.last_commit < b.required_end {
                return Err(Error::Invalid(format!(
                    "the journal in {} ends at commit {} but checkpoint {} needs it to reach commit {}: segments are missing (run memfs fsck)",
                    path.display(),
                    jrep.last_commit,
                    b.commit,
                    b.required_end
                )));
            }
        }
        fs.finish_rebuild(jrep.last_commit);
        report.previous_read_only = read_only_marker(path)?;
        if let Some(m) = &report.previous_read_only {
            tracing::warn!(
                "the previous run of {} turned read-only after commit {}: {}",
                path.display(),
                m.durable_commit,
                m.reason
            );
            // This run starts writable: the marker described the last one.
            memfs_journal::dir::remove_file(path, READ_ONLY_FILE)?;
        }
        report.last_commit = jrep.last_commit;
        report.journal = jrep;
        remove_stray_checkpoints(path, &History::load(path)?, base)?;
        let shared = Arc::new(Shared {
            path: path.to_path_buf(),
            dir: Mutex::new(Some(dir)),
            closed: AtomicBool::new(false),
            journal,
            opts,
            admin: Mutex::new(()),
            stop: Mutex::new(false),
            wake: Condvar::new(),
            failed: AtomicBool::new(false),
            failed_why: Mutex::new(None),
            marked: AtomicBool::new(false),
            on_read_only: Mutex::new(None),
        });
        let mut fs = fs;
        fs.set_recorder(Some(Arc::new(JournalRecorder {
            shared: shared.clone(),
        })));
        let fs = Arc::new(fs);
        if created {
            // The root's attributes (times, owner) exist from the start but
            // no commit records them: an empty checkpoint at commit 0 does.
            checkpoint(&fs, &shared)?;
        }
        if let Some((bad, _)) = damaged {
            replace_damaged(&fs, &shared, bad);
        }
        let checkpointer = {
            let fs = fs.clone();
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("memfs-checkpoint".into())
                .spawn(move || checkpoint_loop(&fs, &shared))
                .map_err(|e| Error::Invalid(format!("cannot start the checkpoint thread: {e}")))?
        };
        tracing::info!("opened {}: {report}", path.display());
        Ok((
            DurableFs {
                fs,
                shared,
                checkpointer: Some(checkpointer),
            },
            report,
        ))
    }

    pub fn fs(&self) -> &Arc<Fs> {
        &self.fs
    }

    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    pub fn durability(&self) -> Durability {
        self.shared.opts.durability
    }

    pub fn last_commit(&self) -> u64 {
        self.shared.journal.last_commit()
    }

    pub fn durable_commit(&self) -> u64 {
        self.shared.journal.durable_commit()
    }

    /// Why the file system turned read-only (the journal failed), if it did.
    pub fn read_only_reason(&self) -> Option<String> {
        if !self.shared.failed.load(Ordering::Acquire) {
            return None;
        }
        Some(self.shared.read_only_reason())
    }

    /// Calls `hook` with the reason once the file system turns read-only
    /// (at once if it already has). It runs on the thread whose operation
    /// failed, maybe a FUSE worker: it must not block on the file system.
    pub fn on_read_only(&self, hook: impl Fn(&str) + Send + Sync + 'static) {
        let mut slot = self.shared.on_read_only.lock();
        if self.shared.failed.load(Ordering::Acquire) {
            hook(&self.shared.read_only_reason());
        }
        *slot = Some(Box::new(hook));
    }

    pub fn journal_stats(&self) -> memfs_journal::JournalStats {
        self.shared.journal.stats()
    }

    /// Makes everything so far durable (in every mode, `none` included).
    pub fn sync(&self) -> Result<u64> {
        self.shared.journal.sync().map_err(|e| {
            self.shared.mark_failed("sync", &e);
            e.into()
        })
    }

    /// Writes a checkpoint now (see [`checkpoint`]).
    pub fn checkpoint(&self) -> Result<Option<CheckpointReport>> {
        checkpoint(&self.fs, &self.shared)
    }

    /// Names the current state: pins the last commit (made durable first).
    pub fn snapshot_create(&self, name: &str) -> Result<SnapshotEntry> {
        check_snapshot_name(name)?;
        let commit = self.shared.journal.sync()?;
        let _g = self.shared.admin.lock();
        snapshot_add(self.path(), name, commit)
    }

    pub fn snapshot_delete(&self, name: &str) -> Result<SnapshotEntry> {
        let _g = self.shared.admin.lock();
        snapshot_delete(self.path(), name)
    }

    /// Rebuilds the tree at `commit` aside while the directory is in use
    /// (`crate::history::materialize`); the admin lock keeps checkpoints
    /// from being pruned meanwhile.
    pub fn materialize(&self, commit: u64) -> Result<Fs> {
        materialize_in(&self.shared, commit)
    }

    /// A handle that rebuilds retained commits aside like
    /// [`DurableFs::materialize`] without borrowing this `DurableFs`: the
    /// mount builds the trees of browsed snapshots with it from FUSE
    /// workers while the control channel owns the `DurableFs`. It keeps
    /// nothing alive: once this file system is closed or replaced (an
    /// online rollback), it answers an error.
    pub fn materializer(&self) -> Materializer {
        Materializer(Arc::downgrade(&self.shared))
    }

    /// Rolls the open file system back to `target` (a retained commit)
    /// without letting go of the directory: the same crash-safe protocol as
    /// the offline [`rollback`] (the intent is published in the manifest
    /// first, so a crash leaves the old state or an intent the next open
    /// finishes), then the directory is recovered again and `self` becomes
    /// the new file system. The old [`Fs`] refuses every later change
    /// (`EROFS`); the caller swaps it out wherever it is served and must
    /// keep changes out meanwhile. Inode numbers given out before stay
    /// unused until the next restart, so that a kernel still holding one
    /// never finds another file under it.
    pub fn rollback_online(&mut self, target: u64) -> Result<(RollbackPlan, OpenReport)> {
        if let Some(why) = self.read_only_reason() {
            return Err(Error::Invalid(format!(
                "the file system is read-only after a journal failure ({why}): no rollback"
            )));
        }
        let path = self.shared.path.clone();
        self.shared.journal.sync()?;
        let plan = plan_rollback(&path, target)?;
        let config = self.fs.config();
        let next_ino = self.fs.next_ino();
        self.stop_checkpointer();
        let shared = self.shared.clone();
        let admin = shared.admin.lock();
        let Some(lock) = shared.dir.lock().take() else {
            return Err(Error::Invalid(
                "the data directory is already closed".into(),
            ));
        };
        shared.closed.store(true, Ordering::Release);
        let r = publish_rollback(&path, &plan);
        drop(admin);
        // Whatever happened, recover again: the directory holds the old
        // state, the new one, or an intent that the open finishes.
        let (new, report) = DurableFs::open_locked(&path, lock, config, shared.opts.clone())?;
        new.fs.raise_next_ino(next_ino);
        // Whoever watches for the read-only switch keeps watching the tree
        // that replaces this one.
        *new.shared.on_read_only.lock() = shared.on_read_only.lock().take();
        drop(std::mem::replace(self, new));
        r?;
        Ok((plan, report))
    }

    pub fn history(&self) -> Result<History> {
        let _g = self.shared.admin.lock();
        History::load(self.path())
    }

    /// Stops the checkpointer, makes everything durable and writes a final
    /// checkpoint (so the next open replays nothing).
    pub fn close(mut self) -> Result<()> {
        self.stop_checkpointer();
        self.sync()?;
        // After a failed append the journal lacks changes the tree has: a
        // checkpoint of the tree would make them durable behind the user's back.
        if self.shared.failed.load(Ordering::Acquire) {
            self.shared.write_marker();
            return Ok(());
        }
        // Everything is in the synced journal already: a final checkpoint
        // that fails (a full disk) only means the next open replays more.
        match checkpoint(&self.fs, &self.shared) {
            Ok(Some(_)) => {}
            Ok(None) => self.keep_atimes(),
            Err(e) => tracing::warn!(
                "final checkpoint of {} failed, the journal holds every change and the next open replays it: {e}",
                self.path().display()
            ),
        }
        self.release();
        Ok(())
    }

    /// At close, when no commit came since the newest checkpoint (so no
    /// final one was written) but reads moved atimes, which no commit
    /// records (that would make every read a write): rewrites that
    /// checkpoint with them (generic/003's remounts). Best effort: a failure
    /// loses only those atimes.
    fn keep_atimes(&self) {
        if !self.fs.take_unrecorded_atimes() {
            return;
        }
        let r = rewrite_checkpoint(&self.fs, &self.shared);
        if let Err(e) = &r
            && checkpoint_io_fault(e)
        {
            self.shared.mark_failed("checkpoint", e);
        }
        match r {
            Ok(true) => {}
            Ok(false) => tracing::debug!(
                "{}: the newest checkpoint is not the current state: atimes moved by reads are not kept",
                self.path().display()
            ),
            Err(e) => tracing::warn!(
                "cannot keep the atimes moved by reads in {} (they are lost at this close): {e}",
                self.path().display()
            ),
        }
    }

    /// Ends journaling for good and lets go of the directory's lock.
    fn release(&self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.dir.lock().take();
    }

    fn stop_checkpointer(&mut self) {
        *self.shared.stop.lock() = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.checkpointer.take() {
            let _ = t.join();
        }
    }
}

impl Drop for DurableFs {
    fn drop(&mut self) {
        self.stop_checkpointer();
        if let Err(e) = self.shared.journal.sync() {
            self.shared.mark_failed("final sync", &e);
        }
        self.shared.write_marker();
        self.release();
    }
}

fn checkpoint_loop(fs: &Fs, shared: &Shared) {
    let mut last_bytes = shared.journal.stats().bytes_written;
    let mut last_time = Instant::now();
    let mut last_commit = shared.journal.last_commit();
    loop {
        {
            let mut stop = shared.stop.lock();
            if *stop {
                return;
            }
            // A timer, not a wait for a condition: checkpoints are periodic.
            shared.wake.wait_for(&mut stop, Duration::from_millis(500));
            if *stop {
                return;
            }
        }
        if shared.failed.load(Ordering::Acquire) {
            continue;
        }
        let st = shared.journal.stats();
        let grown = st.bytes_written.saturating_sub(last_bytes) >= shared.opts.checkpoint_bytes;
        let due = shared
            .opts
            .checkpoint_interval
            .is_some_and(|i| last_time.elapsed() >= i && st.last_commit != last_commit);
        if grown || due {
            match checkpoint(fs, shared) {
                Ok(Some(r)) => tracing::info!(
                    "checkpoint at commit {} ({} nodes, {} pages) in {:.3}s",
                    r.info.commit,
                    r.info.nodes,
                    r.info.pages,
                    r.elapsed.as_secs_f64()
                ),
                Ok(None) => {}
                Err(e) => tracing::error!("checkpoint failed (will retry): {e}"),
            }
            last_bytes = shared.journal.stats().bytes_written;
            last_time = Instant::now();
            last_commit = shared.journal.last_commit();
        }
    }
}

/// Writes a checkpoint (see [`write_checkpoint`]). An I/O error (EIO,
/// EROFS) while writing or syncing it turns the file system read-only, as a
/// journal I/O error does: after a failed fsync the kernel may have dropped
/// dirty pages of any file in the directory, so nothing more is written
/// there (PostgreSQL's rule since 2018). A full disk only fails this
/// checkpoint: nothing is damaged and the next one retries.
fn checkpoint(fs: &Fs, shared: &Shared) -> Result<Option<CheckpointReport>> {
    let r = write_checkpoint(fs, shared);
    if let Err(e) = &r
        && checkpoint_io_fault(e)
    {
        shared.mark_failed("checkpoint", e);
    }
    r
}

/// Whether a checkpoint failure is the disk misbehaving, not a lack of
/// space (or a validation failure, which the previous checkpoint covers).
fn checkpoint_io_fault(e: &Error) -> bool {
    matches!(
        e,
        Error::Journal(memfs_journal::Error::Io { source, .. })
            if matches!(source.raw_os_error(), Some(libc::EIO | libc::EROFS))
    )
}

/// A failed write of a new image is the disk's error on that file, not
/// damage: it keeps its errno for [`checkpoint_io_fault`].
fn image_write_err(path: &Path, source: std::io::Error) -> Error {
    Error::Journal(memfs_journal::Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes the newest checkpoint again, at the same commit, when it is the
/// current state (no commit since: it needs nothing from the journal), for
/// the atimes reads moved since (see [`DurableFs::keep_atimes`]). No commit
/// is made: a received directory mounted and read stays at its snapshot's
/// commit, as an incremental receive requires, and its tree identity
/// ([`crate::send::TreeSum`]) leaves atimes out. HISTORY and the manifest
/// stay as they are. The new file is read back before it atomically
/// replaces the old one, which a failure leaves in place. `Ok(false)`: the
/// newest checkpoint is not the current state (nothing written).
fn rewrite_checkpoint(fs: &Fs, shared: &Shared) -> Result<bool> {
    let _g = shared.admin.lock();
    let _nice = BackgroundPriority::enter();
    let dir = shared.path.as_path();
    let commit = shared.journal.last_commit();
    let current = SnapshotRef {
        commit,
        required_end: commit,
    };
    let history = History::load(dir)?;
    let newest = history.checkpoints.last();
    if newest.is_none_or(|c| c.commit != commit || c.required_end != commit)
        || Manifest::load(dir)?.and_then(|m| m.snapshot) != Some(current)
    {
        return Ok(false);
    }
    let (w, info) = write_image(fs, dir, commit, || commit)?;
    let sealed = w.seal()?;
    if let Err(e) = validate_checkpoint(sealed.path(), &info) {
        tracing::error!("rewritten checkpoint failed validation, keeping the previous one: {e}");
        sealed.abandon();
        return Err(e);
    }
    sealed.publish()?;
    Ok(true)
}

/// Writes a checkpoint without stopping writers: note commit C, copy the
/// tree (fuzzy), note R = the last commit the copy may contain, make the
/// journal durable through R, then publish. Returns `None` when nothing
/// changed since the newest checkpoint.
fn write_checkpoint(fs: &Fs, shared: &Shared) -> Result<Option<CheckpointReport>> {
    let _g = shared.admin.lock();
    let _nice = BackgroundPriority::enter();
    let t0 = Instant::now();
    let dir = shared.path.as_path();
    let commit = shared.journal.last_commit();
    let mut history = History::load(dir)?;
    if history
        .checkpoints
        .last()
        .is_some_and(|c| c.commit == commit)
    {
        return Ok(None);
    }
    // The copy below holds every atime reads moved before this.
    fs.take_unrecorded_atimes();
    let (w, info) = write_image(fs, dir, commit, || shared.journal.last_commit())?;
    shared.journal.wait_durable(info.required_end)?;
    let path = w.finish()?;
    // Read back before it replaces anything: an image this build cannot load
    // must never become the one a restart depends on.
    if let Err(e) = validate_checkpoint(&path, &info) {
        tracing::error!("new checkpoint failed validation, keeping the previous one: {e}");
        let _ = memfs_journal::dir::remove_file(dir, &snapshot_file_name(commit));
        return Err(e);
    }
    let bytes = memfs_journal::dir::file_len(&path).unwrap_or(0);
    history.checkpoints.push(CheckpointEntry {
        commit,
        required_end: info.required_end,
        time_ns: now_ns(),
    });
    // HISTORY first: a checkpoint the manifest names is always listed there.
    history.save(dir)?;
    let mut m = Manifest::load(dir)?.unwrap_or_default();
    m.snapshot = Some(SnapshotRef {
        commit,
        required_end: info.required_end,
    });
    m.publish(dir)?;
    let (segments_pruned, checkpoints_deleted) = prune(shared, &mut history)?;
    Ok(Some(CheckpointReport {
        info,
        bytes,
        elapsed: t0.elapsed(),
        segments_pruned,
        checkpoints_deleted,
    }))
}

/// Copies the tree into a new checkpoint file of `dir` at `commit`, then
/// its trailer, whose `required_end` is asked after the copy (the last
/// commit a fuzzy copy may contain). The file is abandoned on failure;
/// the caller makes it durable and names it.
fn write_image(
    fs: &Fs,
    dir: &Path,
    commit: u64,
    required_end: impl FnOnce() -> u64,
) -> Result<(SnapshotWriter, ImageInfo)> {
    let mut w = SnapshotWriter::create(dir, commit)?;
    let (nodes, pages) = match image::write_nodes(fs, commit, &mut w) {
        Ok(n) => n,
        Err(e) => {
            w.abandon();
            return Err(image_write_err(&dir.join(snapshot_file_name(commit)), e));
        }
    };
    let info = ImageInfo {
        commit,
        required_end: required_end(),
        nodes,
        pages,
    };
    if let Err(e) = image::write_trailer(&mut w, &info) {
        w.abandon();
        return Err(image_write_err(&dir.join(snapshot_file_name(commit)), e));
    }
    Ok((w, info))
}

/// Lowers the calling thread's CPU priority while a checkpoint copies the
/// tree: on a machine with few cores the copy must not take CPU time from
/// the threads answering requests (their latency is what users see).
struct BackgroundPriority {
    old: Option<i32>,
}

impl BackgroundPriority {
    fn enter() -> Self {
        // SAFETY: gettid, getpriority and setpriority only read or set this
        // thread's scheduling priority; no memory is passed.
        unsafe {
            let tid = libc::gettid() as libc::id_t;
            *libc::__errno_location() = 0;
            let old = libc::getpriority(libc::PRIO_PROCESS, tid);
            if *libc::__errno_location() != 0 {
                return BackgroundPriority { old: None };
            }
            let ok = libc::setpriority(libc::PRIO_PROCESS, tid, 19) == 0;
            BackgroundPriority {
                old: ok.then_some(old),
            }
        }
    }
}

impl Drop for BackgroundPriority {
    fn drop(&mut self) {
        if let Some(old) = self.old {
            // SAFETY: as above. Raising the priority back may be refused
            // to an unprivileged process; the thread then stays niced.
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, old);
            }
        }
    }
}

/// Deletes checkpoints and journal segments that retention and the named
/// snapshots no longer need. The oldest kept checkpoint (the *base*) must
/// be able to rebuild every commit still reachable.
fn prune(shared: &Shared, h: &mut History) -> Result<(usize, usize)> {
    let dir = shared.path.as_path();
    let last = shared.journal.last_commit();
    let r = shared.opts.retention;
    // The oldest commit that must stay reachable: the largest window any
    // set limit allows (no limit: everything stays).
    if r.commits.is_none() && r.age.is_none() && r.bytes.is_none() {
        return Ok((0, 0));
    }
    let mut horizon = last;
    if let Some(n) = r.commits {
        horizon = horizon.min(last.saturating_sub(n));
    }
    if let Some(age) = r.age {
        let cutoff = now_ns().saturating_sub(age.as_nanos() as u64);
        // Everything since the newest checkpoint older than the cutoff.
        let c = h
            .checkpoints
            .iter()
            .rev()
            .find(|c| c.time_ns <= cutoff)
            .map_or(0, |c| c.required_end);
        horizon = horizon.min(c);
    }
    if let Some(limit) = r.bytes {
        // Keep the newest segments up to `limit` bytes: the horizon is the
        // first commit of the oldest segment that fits.
        let segs = recovery::list_segments(dir)?;
        let mut total = 0u64;
        let mut keep_from = last;
        for (first, p) in segs.iter().rev() {
            total += memfs_journal::dir::file_len(p).unwrap_or(0);
            if total > limit {
                break;
            }
            keep_from = first.saturating_sub(1);
        }
        horizon = horizon.min(keep_from);
    }
    if let Some(min_pin) = h.snapshots.iter().map(|s| s.commit).min() {
        horizon = horizon.min(min_pin);
    }
    // With no checkpoint at or before the horizon, nothing can go: the
    // journal from commit 1 is what rebuilds it.
    let Some(mut base) = h.base_for(horizon) else {
        return Ok((0, 0));
    };
    // The checkpoint before the newest always stays, with the journal since
    // it: if the newest is ever found damaged, a restart falls back to it.
    if let Some(prev) = h.checkpoints.iter().rev().nth(1)
        && prev.commit < base.commit
    {
        base = *prev;
    }
    let doomed: Vec<CheckpointEntry> = h
        .checkpoints
        .iter()
        .filter(|c| c.commit < base.commit)
        .copied()
        .collect();
    if doomed.is_empty() && !segments_before(dir, base.commit)? {
        return Ok((0, 0));
    }
    h.checkpoints.retain(|c| c.commit >= base.commit);
    h.save(dir)?;
    for c in &doomed {
        memfs_journal::dir::remove_file(dir, &snapshot_file_name(c.commit))?;
    }
    let pruned = shared.journal.prune(base.commit)?;
    Ok((pruned, doomed.len()))
}

fn segments_before(dir: &Path, commit: u64) -> Result<bool> {
    let segs = recovery::list_segments(dir)?;
    Ok(segs.len() > 1 && segs[1].0 <= commit + 1)
}

/// Deletes checkpoint files neither HISTORY nor the manifest names (a crash
/// between writing one and recording it) and unfinished temporaries.
fn remove_stray_checkpoints(dir: &Path, h: &History, current: Option<SnapshotRef>) -> Result<()> {
    for (c, _) in list_snapshots(dir)? {
        let known =
            h.checkpoints.iter().any(|k| k.commit == c) || current.is_some_and(|s| s.commit == c);
        if !known {
            tracing::warn!("removing unrecorded checkpoint {}", snapshot_file_name(c));
            memfs_journal::dir::remove_file(dir, &snapshot_file_name(c))?;
        }
    }
    Ok(())
}

/// Records a named snapshot of `commit` in HISTORY (the caller holds the
/// directory or the admin lock).
fn snapshot_add(dir: &Path, name: &str, commit: u64) -> Result<SnapshotEntry> {
    let mut h = History::load(dir)?;
    if h.snapshots.iter().any(|s| s.name == name) {
        return Err(Error::Invalid(format!("snapshot {name:?} already exists")));
    }
    let e = SnapshotEntry {
        name: name.into(),
        commit,
        time_ns: now_ns(),
    };
    h.snapshots.push(e.clone());
    h.save(dir)?;
    Ok(e)
}

fn snapshot_delete(dir: &Path, name: &str) -> Result<SnapshotEntry> {
    let mut h = History::load(dir)?;
    let i = h
        .snapshots
        .iter()
        .position(|s| s.name == name)
        .ok_or_else(|| Error::Invalid(format!("no snapshot named {name:?}")))?;
    let e = h.snapshots.remove(i);
    h.save(dir)?;
    Ok(e)
}

// ---- offline operations (the data directory is not in use) ----------------

/// Where history can reach in a data directory that is not in use.
#[derive(Debug, Clone)]
pub struct Reach {
    /// The oldest commit a rollback can reach.
    pub oldest: u64,
    /// The last intact commit.
    pub last: u64,
}

fn journal_first_commit(dir: &Path) -> Result<Option<u64>> {
    Ok(recovery::list_segments(dir)?.first().map(|s| s.0))
}

pub fn reach(dir: &Path) -> Result<Reach> {
    let v = recovery::verify(dir)?;
    if let Some(d) = &v.corruption {
        return Err(Error::Invalid(format!(
            "the journal is damaged ({} at offset {}: {}); run memfs fsck --data-dir {} first",
            d.file.display(),
            d.offset,
            d.reason,
            dir.display()
        )));
    }
    let h = History::load(dir)?;
    let manifest = Manifest::load(dir)?;
    let base_commit = manifest.and_then(|m| m.snapshot).map(|s| s.commit);
    let from_journal = match journal_first_commit(dir)? {
        Some(1) => Some(0),
        _ => None,
    };
    let oldest = from_journal
        .or(h.checkpoints.first().map(|c| c.required_end))
        .or(base_commit)
        .unwrap_or(0);
    let last = v.last_commit.max(base_commit.unwrap_or(0));
    Ok(Reach { oldest, last })
}

/// Creates a named snapshot of the newest state of a directory not in use.
pub fn snapshot_create_offline(dir: &Path, name: &str) -> Result<SnapshotEntry> {
    check_snapshot_name(name)?;
    let _lock = DataDir::open(dir, false)?;
    let r = reach(dir)?;
    snapshot_add(dir, name, r.last)
}

pub fn snapshot_delete_offline(dir: &Path, name: &str) -> Result<SnapshotEntry> {
    let _lock = DataDir::open(dir, false)?;
    snapshot_delete(dir, name)
}

/// One commit as `memfs log` shows it.
#[derive(Debug, Clone)]
pub struct LogEntry {
    pub commit: u64,
    /// The change time the operation set (seconds, nanoseconds), if it has one.
    pub time: Option<(i64, u32)>,
    pub op: &'static str,
    pub ino: u64,
    pub name: Option<String>,
    /// Payload bytes of the commit.
    pub bytes: usize,
    /// Data bytes the operation wrote (writes), 0 otherwise.
    pub data: usize,
}

/// The last `limit` commits of a data directory (in use or not: the
/// journal is only read; a commit being written is not shown).
pub fn log(dir: &Path, limit: usize) -> Result<Vec<LogEntry>> {
    let first = journal_first_commit(dir)?.unwrap_or(1);
    let mut ring = std::collections::VecDeque::with_capacity(limit.min(1 << 16));
    recovery::replay_readonly(dir, first - 1, &mut |id, p| {
        let m = crate::codec::decode(p)?;
        let (ino, time, name, data) = match m {
            Mutation::Create { attr, name, .. }
            | Mutation::Link { attr, name, .. }
            | Mutation::Remove { attr, name, .. } => (attr.ino, Some(attr.ctime), Some(name), 0),
            Mutation::Rename {
                moved, new_name, ..
            } => (moved.ino, Some(moved.ctime), Some(new_name), 0),
            Mutation::SetAttr { attr } => (attr.ino, Some(attr.ctime), None, 0),
            Mutation::Write { attr, data, .. } => (attr.ino, Some(attr.mtime), None, data.len()),
            Mutation::Fallocate { attr, .. } => (attr.ino, Some(attr.mtime), None, 0),
            Mutation::SetXattr { attr, name, .. } | Mutation::RemoveXattr { attr, name } => {
                (attr.ino, Some(attr.ctime), Some(name), 0)
            }
            Mutation::Free { ino } => (ino, None, None, 0),
            Mutation::Tmpfile { attr } => (attr.ino, Some(attr.ctime), None, 0),
            Mutation::SetFlags { attr, .. } => (attr.ino, Some(attr.ctime), None, 0),
        };
        if ring.len() == limit {
            ring.pop_front();
        }
        if limit > 0 {
            ring.push_back(LogEntry {
                commit: id,
                time: time.map(|t| (t.sec, t.nsec)),
                op: m.op_name(),
                ino,
                name: name.map(|n| String::from_utf8_lossy(n).into_owned()),
                bytes: p.len(),
                data,
            });
        }
        Ok(())
    })?;
    Ok(ring.into_iter().collect())
}

/// What a rollback would discard.
#[derive(Debug, Clone)]
pub struct RollbackPlan {
    pub target: u64,
    pub last: u64,
    pub base: Option<CheckpointEntry>,
    /// Named snapshots after the target (deleted by the rollback).
    pub lost_snapshots: Vec<SnapshotEntry>,
}

impl RollbackPlan {
    pub fn commits_lost(&self) -> u64 {
        self.last - self.target
    }
}

/// Resolves a commit id or a snapshot name.
pub fn resolve_target(dir: &Path, target: &str) -> Result<u64> {
    if let Ok(c) = target.parse::<u64>() {
        return Ok(c);
    }
    let h = History::load(dir)?;
    h.snapshots
        .iter()
        .find(|s| s.name == target)
        .map(|s| s.commit)
        .ok_or_else(|| {
            Error::Invalid(format!(
                "{target:?} is neither a commit id nor a snapshot name (memfs snapshot list shows them)"
            ))
        })
}

/// Checks that `target` is reachable; says what a rollback would discard.
pub fn plan_rollback(dir: &Path, target: u64) -> Result<RollbackPlan> {
    let r = reach(dir)?;
    if target > r.last {
        return Err(Error::Invalid(format!(
            "commit {target} does not exist: the newest is {}",
            r.last
        )));
    }
    if target < r.oldest {
        return Err(Error::Invalid(format!(
            "commit {target} is older than the retained history, which reaches back to commit {}",
            r.oldest
        )));
    }
    let h = History::load(dir)?;
    Ok(RollbackPlan {
        target,
        last: r.last,
        base: h.base_for(target),
        lost_snapshots: h
            .snapshots
            .iter()
            .filter(|s| s.commit > target)
            .cloned()
            .collect(),
    })
}

/// Rolls a data directory that is not in use back to `plan.target`. The
/// intent is published in the manifest first, so a crash part-way is
/// finished at the next open; commits after the target are gone after this.
pub fn rollback(dir: &Path, plan: &RollbackPlan) -> Result<()> {
    let _lock = DataDir::open(dir, false)?;
    let fresh = plan_rollback(dir, plan.target)?;
    if fresh.last != plan.last {
        return Err(Error::Invalid(
            "the data directory changed since the rollback was planned".into(),
        ));
    }
    publish_rollback(dir, plan)
}

/// The rollback protocol proper (the caller holds the directory's lock).
fn publish_rollback(dir: &Path, plan: &RollbackPlan) -> Result<()> {
    let mut m = Manifest::load(dir)?.unwrap_or_default();
    m.snapshot = plan.base.map(|b| SnapshotRef {
        commit: b.commit,
        required_end: b.required_end,
    });
    m.user = format!("{ROLLBACK_PREFIX}{}", plan.target).into_bytes();
    m.publish(dir)?;
    finish_rollback(dir)?;
    Ok(())
}

/// Completes a rollback recorded in the manifest: cuts the journal, drops
/// later checkpoints and snapshots, then clears the intent. Idempotent.
pub(crate) fn finish_rollback(dir: &Path) -> Result<Option<u64>> {
    let Some(mut m) = Manifest::load(dir)? else {
        return Ok(None);
    };
    let Some(target) = std::str::from_utf8(&m.user)
        .ok()
        .and_then(|u| u.strip_prefix(ROLLBACK_PREFIX))
        .and_then(|t| t.parse::<u64>().ok())
    else {
        return Ok(None);
    };
    recovery::truncate_after(dir, target)?;
    let mut h = History::load(dir)?;
    let keep = m.snapshot.map(|s| s.commit);
    let doomed: Vec<u64> = h
        .checkpoints
        .iter()
        .filter(|c| c.required_end > target && Some(c.commit) != keep)
        .map(|c| c.commit)
        .collect();
    h.checkpoints
        .retain(|c| c.required_end <= target || Some(c.commit) == keep);
    h.snapshots.retain(|s| s.commit <= target);
    h.save(dir)?;
    for c in doomed {
        memfs_journal::dir::remove_file(dir, &snapshot_file_name(c))?;
    }
    m.user.clear();
    m.publish(dir)?;
    Ok(Some(target))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn my_priority() -> i32 {
        // SAFETY: reads this thread's priority.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
    }

    #[test]
    fn a_checkpoint_runs_at_low_priority_and_restores_it() {
        let before = my_priority();
        {
            let _g = BackgroundPriority::enter();
            assert_eq!(my_priority(), 19);
        }
        assert_eq!(my_priority(), before);
    }

    #[test]
    fn retention_and_durations_parse_or_say_why_not() {
        let r: Retention = "commits=10,age=2h,bytes=1G".parse().unwrap();
        assert_eq!(r.commits, Some(10));
        assert_eq!(r.age, Some(Duration::from_secs(7200)));
        assert_eq!(r.bytes, Some(1 << 30));
        assert_eq!("all".parse::<Retention>().unwrap().age, None);
        assert!(
            "age=soon"
                .parse::<Retention>()
                .unwrap_err()
                .contains("bad duration")
        );
        assert!(
            "forever"
                .parse::<Retention>()
                .unwrap_err()
                .contains("commits=N")
        );
        assert!(
            parse_durability("relaxed")
                .unwrap_err()
                .contains("relaxed=N")
        );
        assert!(check_snapshot_name("123").is_err());
        assert!(check_snapshot_name("before upgrade").is_err());
        check_snapshot_name("before-upgrade.2").unwrap();
    }
}
