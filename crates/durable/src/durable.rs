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

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use memfs_journal::checkpoint::checkpoint_file_name;
use memfs_journal::recovery::{self, RecoveryReport};
use memfs_journal::{CheckpointRef, DataDir, Durability, Journal, JournalOptions, Manifest};
use parking_lot::{Condvar, Mutex};

use crate::checkpoint::{
    CheckpointReport, checkpoint, checkpoint_io_fault, checkpoint_loop, replace_damaged,
    rewrite_checkpoint,
};
use crate::error::{Error, Result};
use crate::history_file::{History, SnapshotEntry, check_snapshot_name};
use crate::image::ImageInfo;
use crate::marker::{READ_ONLY_FILE, ReadOnlyMarker, read_only_marker};
use crate::named::{snapshot_add, snapshot_delete};
use crate::options::Options;
use crate::prune::remove_stray_checkpoints;
use crate::rebuild::load_base;
use crate::recorder::JournalRecorder;
use crate::rollback::{RollbackPlan, finish_rollback, plan_rollback, publish_rollback};
use crate::shared::Shared;
use memfs_fs::{Config, Fs};

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
    crate::rebuild::materialize(&shared.path, commit, crate::rebuild::materialize_config())
}

/// What recovery gives [`DurableFs::open_locked`].
struct Recovered {
    fs: Fs,
    journal: Journal,
    /// The checkpoint the tree was loaded from (`None`: commit 0).
    base: Option<CheckpointRef>,
    /// A checkpoint found damaged (recovery fell back from it), and why.
    damaged: Option<(CheckpointRef, String)>,
}

/// Recovers the newest state of the data directory at `path`: its newest
/// sound checkpoint loaded, the journal since replayed over it. Fills in
/// what `report` tells of it.
fn recover(
    path: &Path,
    dir: &DataDir,
    config: Config,
    opts: &Options,
    report: &mut OpenReport,
) -> Result<Recovered> {
    let manifest = Manifest::load(path)?;
    let t0 = Instant::now();
    let named = manifest.as_ref().and_then(|m| m.checkpoint);
    let (fs, base, info, damaged) = load_base(path, config, named)?;
    report.checkpoint = info;
    if let Some((bad, why)) = &damaged {
        let msg = format!(
            "checkpoint {} is damaged ({why}); recovered from {} and the journal instead",
            checkpoint_file_name(bad.commit),
            base.map_or("commit 0".to_string(), |b| checkpoint_file_name(b.commit))
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
    let (journal, jrep) = Journal::open(dir, jopts, after, &mut |_, p| {
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
    report.last_commit = jrep.last_commit;
    report.journal = jrep;
    Ok(Recovered {
        fs,
        journal,
        base,
        damaged,
    })
}

/// The recovered tree, from now on recording every mutation in `journal`.
fn attach_journal(
    path: &Path,
    dir: DataDir,
    journal: Journal,
    opts: Options,
    fs: Fs,
) -> (Arc<Fs>, Arc<Shared>) {
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
    (fs, shared)
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
        let Recovered {
            fs,
            journal,
            base,
            damaged,
        } = recover(path, &dir, config, &opts, &mut report)?;
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
        remove_stray_checkpoints(path, &History::load(path)?, base)?;
        let (fs, shared) = attach_journal(path, dir, journal, opts, fs);
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
