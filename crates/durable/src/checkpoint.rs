//! Writing checkpoints while writers run: the background loop, the image
//! written, read back and published, and the fallback past a damaged one.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use memfs_fs::Fs;
use memfs_journal::checkpoint::checkpoint_file_name;
use memfs_journal::{CheckpointReader, CheckpointRef, CheckpointWriter, Manifest};

use crate::clock::now_ns;
use crate::error::{Error, Result, image_err};
use crate::history_file::{CheckpointEntry, History};
use crate::image::{self, ImageInfo};
use crate::prune::prune;
use crate::shared::Shared;

/// What a checkpoint did.
#[derive(Debug, Clone, Copy)]
pub struct CheckpointReport {
    pub info: ImageInfo,
    pub bytes: u64,
    pub elapsed: Duration,
    pub segments_pruned: usize,
    pub checkpoints_deleted: usize,
}

/// After recovering around a damaged checkpoint: write a good one, then set
/// the damaged file aside (`.damaged`, for inspection) so that nothing
/// points to it. Failures only delay this to the next open.
pub(crate) fn replace_damaged(fs: &Fs, shared: &Shared, bad: CheckpointRef) {
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
        let name = checkpoint_file_name(bad.commit);
        std::fs::rename(dir.join(&name), dir.join(format!("{name}.damaged")))
            .map_err(|e| Error::Invalid(format!("cannot set {name} aside: {e}")))?;
        Ok(())
    })();
    match r {
        Ok(()) => tracing::warn!(
            "replaced damaged checkpoint {} (kept as .damaged)",
            checkpoint_file_name(bad.commit)
        ),
        Err(e) => tracing::error!("could not replace the damaged checkpoint yet: {e}"),
    }
}

/// Reads a just-written checkpoint back through the loader's checks.
fn validate_checkpoint(path: &Path, want: &ImageInfo) -> Result<()> {
    let mut r = CheckpointReader::open(path)
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

pub(crate) fn checkpoint_loop(fs: &Fs, shared: &Shared) {
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
pub(crate) fn checkpoint(fs: &Fs, shared: &Shared) -> Result<Option<CheckpointReport>> {
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
pub(crate) fn checkpoint_io_fault(e: &Error) -> bool {
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
pub(crate) fn rewrite_checkpoint(fs: &Fs, shared: &Shared) -> Result<bool> {
    let _g = shared.admin.lock();
    let _nice = BackgroundPriority::enter();
    let dir = shared.path.as_path();
    let commit = shared.journal.last_commit();
    let current = CheckpointRef {
        commit,
        required_end: commit,
    };
    let history = History::load(dir)?;
    let newest = history.checkpoints.last();
    if newest.is_none_or(|c| c.commit != commit || c.required_end != commit)
        || Manifest::load(dir)?.and_then(|m| m.checkpoint) != Some(current)
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
        let _ = memfs_journal::dir::remove_file(dir, &checkpoint_file_name(commit));
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
    m.checkpoint = Some(CheckpointRef {
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
) -> Result<(CheckpointWriter, ImageInfo)> {
    let mut w = CheckpointWriter::create(dir, commit)?;
    let (nodes, pages) = match image::write_nodes(fs, commit, &mut w) {
        Ok(n) => n,
        Err(e) => {
            w.abandon();
            return Err(image_write_err(&dir.join(checkpoint_file_name(commit)), e));
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
        return Err(image_write_err(&dir.join(checkpoint_file_name(commit)), e));
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
}
