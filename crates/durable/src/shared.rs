//! The state of an open data directory that the file system, its recorder
//! and its checkpointer share, and the switch to read-only.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use memfs_journal::{DataDir, Journal};
use parking_lot::{Condvar, Mutex};

use crate::clock::now_ns;
use crate::marker::{READ_ONLY_FILE, ReadOnlyMarker};
use crate::options::Options;

pub(crate) struct Shared {
    pub(crate) path: PathBuf,
    /// The directory's lock; dropped at close, so the directory can be
    /// reopened (or rolled back) while the old `Fs` is still referenced.
    pub(crate) dir: Mutex<Option<DataDir>>,
    /// Set at close: the old file system may no longer journal anything.
    pub(crate) closed: AtomicBool,
    pub(crate) journal: Journal,
    pub(crate) opts: Options,
    /// Serialises checkpoints, snapshot edits and pruning.
    pub(crate) admin: Mutex<()>,
    pub(crate) stop: Mutex<bool>,
    pub(crate) wake: Condvar,
    pub(crate) failed: AtomicBool,
    /// Why, when the failure was not the journal's own (a checkpoint).
    pub(crate) failed_why: Mutex<Option<String>>,
    /// Whether the `READ-ONLY` marker is on disk (written best effort).
    pub(crate) marked: AtomicBool,
    /// Called once when the file system turns read-only (the mount uses it
    /// to remount itself read-only).
    pub(crate) on_read_only: Mutex<Option<ReadOnlyHook>>,
}

pub(crate) type ReadOnlyHook = Box<dyn Fn(&str) + Send + Sync>;

impl Shared {
    /// Records that the journal failed: from now on the file system is
    /// read-only. Logs, writes the marker and calls the hook only once.
    pub(crate) fn mark_failed(&self, what: &str, e: &dyn std::fmt::Display) {
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

    pub(crate) fn read_only_reason(&self) -> String {
        self.journal
            .stats()
            .failed
            .or_else(|| self.failed_why.lock().clone())
            .unwrap_or_else(|| "a journal operation failed".into())
    }

    /// Best effort: the disk that failed may refuse this too; close retries.
    pub(crate) fn write_marker(&self) {
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
