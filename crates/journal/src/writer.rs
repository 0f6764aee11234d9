//! The durability engine: appending commits, group commit, background writer.
//!
//! Committers encode their frame into an in-memory pending buffer under a short
//! lock (a memcpy; the payload checksum is computed before the lock). One thread
//! at a time, the *flusher*, takes the whole pending buffer, releases the lock,
//! writes it (rotating segments as needed) and fsyncs if the mode asks for it.
//! Commits appended meanwhile are taken by the next flush: that is group commit
//! in `sync` mode (one fsync covers every waiter) and batching in the others.

use crate::durability::Durability;
use crate::format::{self, FRAME_HEADER_LEN, SEGMENT_HEADER_LEN};
use crate::recovery::{self, RecoveryReport, Tail};
use crate::storage::{OpenMode, Storage, StorageFile};
use crate::{CommitId, DataDir, Error, Result, io_err};
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::VecDeque;
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct JournalOptions {
    pub durability: Durability,
    /// A segment is rotated once it would exceed this size (a single commit
    /// larger than this gets a segment of its own).
    pub segment_size: u64,
}

impl Default for JournalOptions {
    fn default() -> Self {
        JournalOptions {
            durability: Durability::Sync,
            segment_size: 64 << 20,
        }
    }
}

/// Names one commit of one open journal: what [`Journal::append_reserved`]
/// hands out and [`Journal::complete`] waits on. The split lets a committer
/// append under its own locks and wait for the disk after dropping them;
/// the token keeps the second half tied to the journal of the first, so a
/// commit id can never be settled against a journal that did not append it
/// (an online rollback replaces the journal between the two halves).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token {
    journal: JournalId,
    commit: CommitId,
}

impl Token {
    pub fn journal(&self) -> JournalId {
        self.journal
    }

    pub fn commit(&self) -> CommitId {
        self.commit
    }
}

/// Which open journal, unique for the life of the process (never reused,
/// unlike an address): two opens of the same directory get different ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JournalId(u64);

impl JournalId {
    fn next() -> JournalId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        JournalId(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The raw id, for a caller that keeps it in a plain integer (a
    /// thread-local cell); never 0.
    pub fn get(self) -> u64 {
        self.0
    }
}

/// Counters for metrics.
#[derive(Debug, Clone, Default)]
pub struct JournalStats {
    pub last_commit: u64,
    pub written_commit: u64,
    pub durable_commit: u64,
    /// Commits appended but not yet durable.
    pub pending_commits: u64,
    /// Bytes appended but not yet written to the OS.
    pub pending_bytes: u64,
    pub fsyncs: u64,
    pub bytes_written: u64,
    pub segments: usize,
    /// Committers waiting right now for the disk to catch up (queue full).
    pub throttled: u64,
    pub failed: Option<String>,
}

/// In `none` mode, pending bytes are written to the OS once they reach this.
const NONE_FLUSH_BYTES: usize = 4 << 20;

/// In `none` and `relaxed` modes, committers that find this much queued while
/// another thread is writing wait for that write: without a bound, writers
/// that outpace the disk would queue the whole journal in memory.
const MAX_QUEUED_BYTES: usize = 16 << 20;

struct Chunk {
    /// Start a new segment (whose first commit is this) before writing `buf`,
    /// in the preallocated spare file given, if any.
    new_segment: Option<(u64, Option<PathBuf>)>,
    buf: Vec<u8>,
}

/// How long a committer waits for journal I/O another thread is doing (a
/// flush's write or fsync, a reservation's `fallocate`), or for the
/// reservations ahead of a large one, before it gives up. Past it the disk
/// is taken as hung: the journal fails as after an EIO (never retried, every
/// later commit refused) and says what it waited for, instead of every
/// committer hanging for good. 120 s is the kernel's own verdict on a task
/// blocked that long (`hung_task_timeout_secs`); a healthy disk answers a
/// flush of the largest queue (16 MiB) in well under a second, a slow or
/// overloaded one in seconds.
pub const STALL_LIMIT: Duration = Duration::from_secs(120);

/// Preallocated files are grown in steps of this much (or what a single
/// reservation needs, if more).
const ALLOC_STEP: u64 = 1 << 20;

struct Segment {
    file: Box<dyn StorageFile>,
    path: PathBuf,
}

struct State {
    pending: VecDeque<Chunk>,
    spare: Vec<Vec<u8>>,
    pending_bytes: usize,
    last_appended: u64,
    written: u64,
    durable: u64,
    /// Commits written since the last fsync.
    unsynced: u64,
    last_sync: Instant,
    flushing: bool,
    /// The async writer is holding a group window open: appends only wake
    /// it once the queue reaches the group size.
    gathering: bool,
    seg: Option<Segment>,
    /// Size the current segment will have once pending bytes are written.
    logical_seg_len: u64,
    segments: Vec<(u64, PathBuf)>,
    /// Space reservations (see [`Journal::reserve`]), all as seen by appends:
    /// the file the current segment's frames go to (a spare not yet renamed
    /// while a rotation is being written), and how much of it is allocated.
    append_file: PathBuf,
    alloc_end: u64,
    /// Bytes reserved and not yet appended or released.
    reserved: u64,
    /// A preallocated file for the next segment, and its allocated size.
    next_spare: Option<(PathBuf, u64)>,
    spare_seq: u64,
    allocating: bool,
    /// When the flush (`flushing`) and the allocation (`allocating`) in
    /// progress began: a waiter gives up on one older than `stall_limit`.
    flush_since: Instant,
    alloc_since: Instant,
    stall_limit: Duration,
    error: Option<String>,
    shutdown: bool,
    fsyncs: u64,
    bytes_written: u64,
    throttled: u64,
}

struct Inner {
    id: JournalId,
    state: Mutex<State>,
    durable_cv: Condvar,
    space_cv: Condvar,
    work_cv: Condvar,
    dir: PathBuf,
    opts: JournalOptions,
    /// Resolved once at open: one dynamic call per write or fsync.
    storage: Arc<dyn Storage>,
}

/// An open journal. Commit from any number of threads.
pub struct Journal {
    inner: Arc<Inner>,
    bg: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("dir", &self.inner.dir)
            .field("durability", &self.inner.opts.durability)
            .finish()
    }
}

impl Journal {
    /// Recovers the journal in `dir` and opens it for appending. Every commit
    /// after `after` (the checkpoint's commit, or 0) is passed to `replay` in
    /// order; an error from it aborts the open. A torn tail is truncated.
    pub fn open(
        dir: &DataDir,
        opts: JournalOptions,
        after: u64,
        replay: &mut crate::ReplayFn<'_>,
    ) -> Result<(Journal, RecoveryReport)> {
        if opts.segment_size < (SEGMENT_HEADER_LEN + FRAME_HEADER_LEN) as u64 {
            return Err(Error::Invalid("segment size too small".into()));
        }
        let path = dir.path().to_path_buf();
        let storage = dir.storage().clone();
        let st = &*storage;
        let scan = recovery::scan(st, &path, after, true, replay)?;
        let report = scan.report;
        let mut segments = scan.segments;
        let last = report.last_commit;
        let (seg, len) = open_tail(st, &path, scan.tail, &report, &mut segments)?;
        remove_stale_spares(st, &path);
        let state = State::recovered(seg, len, segments, last);
        let inner = Arc::new(Inner {
            id: JournalId::next(),
            state: Mutex::new(state),
            durable_cv: Condvar::new(),
            space_cv: Condvar::new(),
            work_cv: Condvar::new(),
            dir: path,
            opts,
            storage,
        });
        let needs_bg = !matches!(inner.opts.durability, Durability::None | Durability::Sync);
        let bg = if needs_bg {
            let i = inner.clone();
            Some(
                std::thread::Builder::new()
                    .name("journal-writer".into())
                    .spawn(move || background(&i))
                    .map_err(io_err(&inner.dir))?,
            )
        } else {
            None
        };
        Ok((Journal { inner, bg }, report))
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// This open journal's id: the one its [`Token`]s carry.
    pub fn id(&self) -> JournalId {
        self.inner.id
    }

    pub fn durability(&self) -> Durability {
        self.inner.opts.durability
    }

    /// Appends one commit and returns its id once the durability mode allows:
    /// `sync` waits until it is on stable storage; `async` modes wait only if
    /// the pending bound is reached.
    pub fn commit(&self, payload: &[u8]) -> Result<CommitId> {
        self.commit_vectored(&[payload])
    }

    /// Like [`Journal::commit`] with the payload given as consecutive parts,
    /// which saves the caller a concatenation.
    pub fn commit_vectored(&self, parts: &[&[u8]]) -> Result<CommitId> {
        let t = self.append_vectored(parts)?;
        self.complete(t)?;
        Ok(t.commit)
    }

    /// [`Journal::commit_vectored`] for a commit that reserved `reserved`
    /// bytes with [`Journal::reserve`].
    pub fn commit_reserved(&self, parts: &[&[u8]], reserved: u64) -> Result<CommitId> {
        let t = self.append_reserved(parts, reserved)?;
        self.complete(t)?;
        Ok(t.commit)
    }

    /// The first half of a commit: takes the next id and queues the frame,
    /// without any I/O (it may only wait for queue space in async modes).
    /// For callers that append while holding their own locks and do the
    /// waiting half, [`Journal::complete`], once they have dropped them, so
    /// that concurrent committers share one fsync. Until `complete` (or a
    /// later flush) runs, the commit is not even written in `sync` and
    /// `relaxed` modes.
    pub fn append_vectored(&self, parts: &[&[u8]]) -> Result<Token> {
        self.append_reserved(parts, 0)
    }

    /// [`Journal::append_vectored`] for a commit that reserved `reserved`
    /// bytes with [`Journal::reserve`]: the reservation is used up by this
    /// append (in the same critical section, so the space stays counted).
    pub fn append_reserved(&self, parts: &[&[u8]], reserved: u64) -> Result<Token> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > format::MAX_PAYLOAD {
            return Err(Error::Invalid(format!(
                "commit of {len} bytes exceeds the maximum of {} bytes",
                format::MAX_PAYLOAD
            )));
        }
        // Checksum before taking the lock: it is the expensive part.
        let mut pcrc = 0u32;
        for p in parts {
            pcrc = crc32c::crc32c_append(pcrc, p);
        }
        let inner = &*self.inner;
        let mode = inner.opts.durability;
        let mut g = inner.state.lock();
        if let Some((max_commits, max_bytes)) = mode.bounds() {
            while g.error.is_none()
                && (g.last_appended - g.written >= max_commits as u64
                    || (g.pending_bytes > 0 && g.pending_bytes + len > max_bytes))
            {
                wait_for_space(inner, &mut g);
            }
        }
        if let Some(e) = &g.error {
            return Err(Error::Failed(e.clone()));
        }
        let id = g.last_appended + 1;
        let frame_len = (FRAME_HEADER_LEN + len) as u64;
        let rotate = g.logical_seg_len > SEGMENT_HEADER_LEN as u64
            && g.logical_seg_len + frame_len > inner.opts.segment_size;
        if rotate || g.pending.is_empty() {
            start_chunk(inner, &mut g, id, rotate);
        }
        let header = format::encode_frame_header(id, len, pcrc);
        let chunk = g.pending.back_mut().expect("pending chunk exists");
        chunk.buf.reserve(FRAME_HEADER_LEN + len);
        chunk.buf.extend_from_slice(&header);
        for p in parts {
            chunk.buf.extend_from_slice(p);
        }
        g.pending_bytes += FRAME_HEADER_LEN + len;
        g.logical_seg_len += frame_len;
        if reserved > 0 {
            // A reservation is used by the one append it was made for:
            // more than is outstanding means a caller counted twice.
            debug_assert!(
                g.reserved >= reserved,
                "append uses {reserved} reserved bytes, {} outstanding",
                g.reserved
            );
            g.reserved = g.reserved.saturating_sub(reserved);
            inner.space_cv.notify_all();
        }
        // Ids are dense and increasing: recovery reads a gap as damage.
        assert_eq!(id, g.last_appended + 1);
        g.last_appended = id;
        if mode.is_async() && (!g.gathering || g.last_appended - g.written >= group_size(mode)) {
            inner.work_cv.notify_one();
        }
        Ok(Token {
            journal: inner.id,
            commit: id,
        })
    }

    /// Reserves journal space for a commit of up to `payload` bytes before
    /// the caller changes anything: the space is preallocated on disk
    /// (`fallocate`), so the commit's write cannot fail for lack of space.
    /// Returns the amount reserved, to pass to [`Journal::append_reserved`]
    /// or [`Journal::release`]. Fails with [`Error::NoSpace`] (nothing
    /// changed; retry later) when the disk is full.
    ///
    /// Safe under group commit: the sum of outstanding reservations always
    /// fits either in the current segment's allocated tail or, wholly, in
    /// the preallocated spare the next rotation renames into place, so every
    /// reserved frame lands in allocated space in whatever order the
    /// reservers append.
    pub fn reserve(&self, payload: u64) -> Result<u64> {
        let inner = &*self.inner;
        let need = payload + FRAME_HEADER_LEN as u64;
        let hdr = SEGMENT_HEADER_LEN as u64;
        let seg_size = inner.opts.segment_size;
        let mut g = inner.state.lock();
        // When this call first waited for the reservations ahead of it.
        let mut queued: Option<Instant> = None;
        loop {
            if let Some(e) = &g.error {
                return Err(Error::Failed(e.clone()));
            }
            let want = g.reserved + need;
            // Reservations that together exceed a segment could span two
            // rotations: one at a time then. The ones ahead end at their
            // operation's append or release; one still held after the stall
            // limit (leaked, or behind a hung disk) refuses this one.
            if hdr + want > seg_size && g.reserved > 0 {
                wait_behind_reservations(inner, &mut g, &mut queued, need)?;
                continue;
            }
            // Frames land in the current segment while they fit in
            // `segment_size`, else in the spare. A reservation is granted
            // when every order of appends lands in allocated space.
            let in_cur = g.logical_seg_len + want <= seg_size;
            let fits = if in_cur {
                g.alloc_end >= g.logical_seg_len + want
            } else {
                g.alloc_end >= seg_size && g.next_spare.as_ref().is_some_and(|s| hdr + want <= s.1)
            };
            if fits {
                g.reserved = want;
                return Ok(need);
            }
            if g.allocating {
                wait_bounded(inner, &inner.space_cv, &mut g, None);
                continue;
            }
            preallocate(inner, &mut g, in_cur, want)?;
        }
    }

    /// Sets how long waits for another thread's journal I/O may last
    /// ([`STALL_LIMIT`] unless set): for tests, and for disks known to be
    /// slower.
    pub fn set_stall_limit(&self, limit: Duration) {
        let mut g = self.inner.state.lock();
        g.stall_limit = limit;
        // Waiters take the new bound at their next wake-up.
        self.inner.space_cv.notify_all();
        self.inner.durable_cv.notify_all();
    }

    /// Gives back a reservation that no commit used (the operation failed
    /// before it changed anything).
    pub fn release(&self, reserved: u64) {
        if reserved == 0 {
            return;
        }
        let mut g = self.inner.state.lock();
        // Given back once, by the operation that reserved it.
        debug_assert!(
            g.reserved >= reserved,
            "release of {reserved} reserved bytes, {} outstanding",
            g.reserved
        );
        g.reserved = g.reserved.saturating_sub(reserved);
        self.inner.space_cv.notify_all();
    }

    /// The second half of a commit appended with [`Journal::append_vectored`]:
    /// what the durability mode promises for the token's commit (`sync`:
    /// wait until it is durable; `relaxed`: write, fsync when due; `none`:
    /// write once enough is pending; async modes: nothing, the background
    /// writer has it). A token this journal did not hand out is an error
    /// ([`Error::UnknownCommit`]; an assertion in debug builds), never a
    /// wait: a commit that was never appended would never become durable.
    pub fn complete(&self, token: Token) -> Result<()> {
        let inner = &*self.inner;
        let mode = inner.opts.durability;
        let id = token.commit;
        if token.journal != inner.id {
            debug_assert!(false, "{token:?} settled on journal {:?}", inner.id);
            return Err(Error::UnknownCommit {
                commit: id,
                last: self.last_commit(),
            });
        }
        if mode.is_async() {
            return Ok(());
        }
        let mut g = inner.state.lock();
        // Tokens are only made by `append_reserved` of this journal, which
        // never takes an id back: anything else is a bug in this file.
        if id == 0 || id > g.last_appended {
            debug_assert!(false, "{token:?} past the last commit {}", g.last_appended);
            return Err(Error::UnknownCommit {
                commit: id,
                last: g.last_appended,
            });
        }
        if matches!(mode, Durability::None | Durability::Relaxed { .. }) {
            while g.error.is_none() && g.flushing && g.pending_bytes >= MAX_QUEUED_BYTES {
                wait_for_space(inner, &mut g);
            }
        }
        if let Some(e) = &g.error {
            return Err(Error::Failed(e.clone()));
        }
        match mode {
            Durability::None => {
                if g.pending_bytes >= NONE_FLUSH_BYTES && !g.flushing {
                    flush(inner, &mut g, false)?;
                }
            }
            Durability::Sync => wait_durable_locked(inner, &mut g, id)?,
            Durability::Relaxed { .. } => {
                if !g.flushing && g.written < id {
                    let due = relaxed_due(inner, &g);
                    flush(inner, &mut g, due)?;
                }
            }
            Durability::Async { .. } | Durability::AsyncRelaxed { .. } => {}
        }
        Ok(())
    }

    /// Makes every commit appended so far durable; returns the last one.
    pub fn sync(&self) -> Result<CommitId> {
        let mut g = self.inner.state.lock();
        let id = g.last_appended;
        wait_durable_locked(&self.inner, &mut g, id)?;
        Ok(id)
    }

    /// Waits until `id` is durable, forcing a flush if nobody else will.
    pub fn wait_durable(&self, id: CommitId) -> Result<()> {
        let mut g = self.inner.state.lock();
        wait_durable_locked(&self.inner, &mut g, id)
    }

    pub fn last_commit(&self) -> CommitId {
        self.inner.state.lock().last_appended
    }

    pub fn durable_commit(&self) -> CommitId {
        self.inner.state.lock().durable
    }

    pub fn stats(&self) -> JournalStats {
        let g = self.inner.state.lock();
        JournalStats {
            last_commit: g.last_appended,
            written_commit: g.written,
            durable_commit: g.durable,
            pending_commits: g.last_appended - g.durable,
            pending_bytes: g.pending_bytes as u64,
            fsyncs: g.fsyncs,
            bytes_written: g.bytes_written,
            segments: g.segments.len(),
            throttled: g.throttled,
            failed: g.error.clone(),
        }
    }

    /// Total size of the segment files on disk.
    pub fn disk_bytes(&self) -> u64 {
        let paths: Vec<PathBuf> = {
            let g = self.inner.state.lock();
            g.segments.iter().map(|(_, p)| p.clone()).collect()
        };
        paths
            .iter()
            .filter_map(|p| self.inner.storage.len(p).ok())
            .sum()
    }

    /// Deletes segments whose commits are all at or below `upto` (covered by a
    /// published checkpoint). The segment being appended to is never deleted.
    /// Returns the number of files removed.
    pub fn prune(&self, upto: CommitId) -> Result<usize> {
        let doomed: Vec<PathBuf> = {
            let mut g = self.inner.state.lock();
            let n = g.segments.len();
            let mut k = 0;
            while k + 1 < n && g.segments[k + 1].0 <= upto + 1 {
                k += 1;
            }
            g.segments.drain(..k).map(|(_, p)| p).collect()
        };
        let st = &*self.inner.storage;
        for p in &doomed {
            st.remove_file(p).map_err(io_err(p))?;
        }
        if !doomed.is_empty() {
            crate::dir::sync_dir_with(st, &self.inner.dir)?;
        }
        Ok(doomed.len())
    }

    /// Flushes and fsyncs everything, stops the background writer.
    pub fn close(mut self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<()> {
        {
            let mut g = self.inner.state.lock();
            g.shutdown = true;
            self.inner.work_cv.notify_all();
        }
        if let Some(h) = self.bg.take() {
            let _ = h.join();
        }
        let mut g = self.inner.state.lock();
        let id = g.last_appended;
        wait_durable_locked(&self.inner, &mut g, id)
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::error!(error = %e, "journal: final flush failed");
        }
    }
}

/// Waits, in [`Journal::reserve`], for the reservations ahead to end; refuses
/// once it has waited the stall limit since it was first `queued`.
fn wait_behind_reservations(
    inner: &Inner,
    g: &mut MutexGuard<'_, State>,
    queued: &mut Option<Instant>,
    need: u64,
) -> Result<()> {
    let since = *queued.get_or_insert_with(Instant::now);
    let waited = since.elapsed();
    if waited >= g.stall_limit {
        tracing::error!(
            journal = %inner.dir.display(),
            reserved = g.reserved,
            wanted = need,
            "journal: a reservation waited {waited:?} for the {} bytes reserved ahead of it; refused",
            g.reserved
        );
        return Err(Error::Stalled {
            what: "the journal reservations ahead of this one",
            waited,
        });
    }
    wait_bounded(inner, &inner.space_cv, g, Some(since));
    Ok(())
}

/// The space to allocate for reservations of `want` bytes in all: whether
/// it grows the current segment (else the spare), which file, up to which
/// length, and whether that file is a new spare to create.
fn alloc_target(
    inner: &Inner,
    g: &mut State,
    in_cur: bool,
    want: u64,
) -> (bool, PathBuf, u64, bool) {
    let hdr = SEGMENT_HEADER_LEN as u64;
    let seg_size = inner.opts.segment_size;
    let grow_cur = if in_cur { true } else { g.alloc_end < seg_size };
    let (path, target, is_new) = if grow_cur {
        let t = if in_cur {
            (g.logical_seg_len + want + ALLOC_STEP).min(seg_size)
        } else {
            seg_size
        };
        (g.append_file.clone(), t, false)
    } else {
        let t = (hdr + want + ALLOC_STEP).min(seg_size).max(hdr + want);
        match &g.next_spare {
            Some((p, _)) => (p.clone(), t, false),
            None => {
                g.spare_seq += 1;
                let name = format!("journal-spare-{}.tmp", g.spare_seq);
                (inner.dir.join(name), t, true)
            }
        }
    };
    (grow_cur, path, target, is_new)
}

/// Allocates, without the lock, the space [`alloc_target`] chose, and
/// records it. `Ok` also when the file moved on meanwhile: the caller looks
/// again.
fn preallocate(
    inner: &Inner,
    g: &mut MutexGuard<'_, State>,
    in_cur: bool,
    want: u64,
) -> Result<()> {
    g.allocating = true;
    g.alloc_since = Instant::now();
    let (grow_cur, path, target, is_new) = alloc_target(inner, g, in_cur, want);
    let r = MutexGuard::unlocked(g, || -> std::io::Result<()> {
        let mode = if is_new {
            OpenMode::CreateTruncate
        } else {
            OpenMode::Write
        };
        let mut f = inner.storage.open(&path, mode)?;
        f.allocate(target)
    });
    g.allocating = false;
    inner.space_cv.notify_all();
    match r {
        Ok(()) => {
            if grow_cur {
                if g.append_file == path {
                    g.alloc_end = g.alloc_end.max(target);
                }
            } else if is_new {
                g.next_spare = Some((path, target));
            } else if let Some(s) = g.next_spare.as_mut()
                && s.0 == path
            {
                s.1 = s.1.max(target);
            }
            Ok(())
        }
        Err(e) => alloc_failed(inner, g, e, path, is_new),
    }
}

/// What a failed preallocation of `path` means: the file moved on (look
/// again), the current segment is not written yet (write it, look again),
/// or a real failure.
fn alloc_failed(
    inner: &Inner,
    g: &mut MutexGuard<'_, State>,
    e: std::io::Error,
    path: PathBuf,
    is_new: bool,
) -> Result<()> {
    match e {
        // The spare was renamed or the segment rotated meanwhile:
        // look again (a file that vanished otherwise is an error).
        e if e.kind() == std::io::ErrorKind::NotFound
            && !is_new
            && g.append_file != path
            && g.next_spare.as_ref().is_none_or(|s| s.0 != path) =>
        {
            Ok(())
        }
        // The current segment is not created yet (an unreserved
        // frame rotated without a spare): write it out, look again.
        e if e.kind() == std::io::ErrorKind::NotFound
            && !is_new
            && g.append_file == path
            && !g.segments.iter().any(|s| s.1 == path) =>
        {
            if g.flushing {
                wait_bounded(inner, &inner.durable_cv, g, None);
            } else {
                flush(inner, g, false)?;
            }
            Ok(())
        }
        e => {
            if is_new {
                let _ = inner.storage.remove_file(&path);
            }
            Err(match e.raw_os_error() {
                Some(c)
                    if c == nix::errno::Errno::ENOSPC as i32
                        || c == nix::errno::Errno::EDQUOT as i32 =>
                {
                    Error::NoSpace { path, source: e }
                }
                _ => Error::Io { path, source: e },
            })
        }
    }
}

impl State {
    /// The state of a journal just recovered up to commit `last`, appending
    /// to `seg` (`len` bytes long), the last of `segments`.
    fn recovered(seg: Segment, len: u64, segments: Vec<(u64, PathBuf)>, last: u64) -> State {
        let append_file = segments.last().map(|s| s.1.clone()).unwrap_or_default();
        State {
            pending: VecDeque::new(),
            spare: Vec::new(),
            pending_bytes: 0,
            last_appended: last,
            written: last,
            durable: last,
            unsynced: 0,
            last_sync: Instant::now(),
            flushing: false,
            gathering: false,
            seg: Some(seg),
            logical_seg_len: len,
            segments,
            append_file,
            alloc_end: 0,
            reserved: 0,
            next_spare: None,
            spare_seq: 0,
            allocating: false,
            flush_since: Instant::now(),
            alloc_since: Instant::now(),
            stall_limit: STALL_LIMIT,
            error: None,
            shutdown: false,
            fsyncs: 0,
            bytes_written: 0,
            throttled: 0,
        }
    }
}

/// The segment to append to after recovery, and its length: a new one
/// after an empty journal, else the last one, its torn header rewritten or
/// its torn tail cut.
fn open_tail(
    st: &dyn Storage,
    path: &Path,
    tail: Tail,
    report: &RecoveryReport,
    segments: &mut Vec<(u64, PathBuf)>,
) -> Result<(Segment, u64)> {
    let last = report.last_commit;
    Ok(match tail {
        Tail::Empty => {
            let first = last + 1;
            let seg = create_segment(st, path, first)?;
            segments.push((first, seg.path.clone()));
            (seg, SEGMENT_HEADER_LEN as u64)
        }
        Tail::Append {
            first,
            path: p,
            len,
            rewrite_header,
        } => {
            let mut file = st.open(&p, OpenMode::Write).map_err(io_err(&p))?;
            let mut len = len;
            if rewrite_header {
                file.set_len(0).map_err(io_err(&p))?;
                file.write_all(&format::encode_segment_header(first))
                    .map_err(io_err(&p))?;
                len = SEGMENT_HEADER_LEN as u64;
                file.sync_all().map_err(io_err(&p))?;
            } else if report.truncated_tail.is_some() {
                file.set_len(len).map_err(io_err(&p))?;
                file.sync_all().map_err(io_err(&p))?;
                tracing::warn!(
                    file = %p.display(),
                    offset = len,
                    "truncated a torn journal tail"
                );
            }
            file.seek(std::io::SeekFrom::Start(len))
                .map_err(io_err(&p))?;
            (Segment { file, path: p }, len)
        }
    })
}

/// Begins a new chunk of pending frames for commit `id`; with `rotate`, the
/// chunk starts a new segment.
fn start_chunk(inner: &Inner, g: &mut State, id: u64, rotate: bool) {
    let buf = g.spare.pop().unwrap_or_default();
    let mut new_segment = None;
    if rotate {
        // The new segment goes into the preallocated spare, whose
        // space the reservations were counted against.
        let spare = g.next_spare.take();
        let (file, alloc) = match &spare {
            Some((p, n)) => (p.clone(), *n),
            None => (inner.dir.join(format::segment_file_name(id)), 0),
        };
        g.append_file = file;
        g.alloc_end = alloc;
        new_segment = Some((id, spare.map(|s| s.0)));
        g.logical_seg_len = SEGMENT_HEADER_LEN as u64;
    }
    g.pending.push_back(Chunk { new_segment, buf });
}

fn create_segment(st: &dyn Storage, dir: &Path, first: u64) -> Result<Segment> {
    create_segment_in(st, dir, first, None)
}

/// Creates segment `first`, in the preallocated (empty) `spare` if given:
/// renamed into place, its allocated space takes the header and the frames.
fn create_segment_in(
    st: &dyn Storage,
    dir: &Path,
    first: u64,
    spare: Option<&Path>,
) -> Result<Segment> {
    let path = dir.join(format::segment_file_name(first));
    if let Some(s) = spare {
        st.rename(s, &path).map_err(io_err(s))?;
    }
    let mode = if spare.is_some() {
        OpenMode::Write
    } else {
        OpenMode::CreateTruncate
    };
    let mut file = st.open(&path, mode).map_err(io_err(&path))?;
    file.write_all(&format::encode_segment_header(first))
        .map_err(io_err(&path))?;
    // The header is made durable before the name: otherwise a crash after the
    // directory sync could keep the name and later unsynced frames but not the
    // header, which recovery could not tell from a damaged segment.
    file.sync_data().map_err(io_err(&path))?;
    // The name must be durable before any commit in the file is called durable.
    crate::dir::sync_dir_with(st, dir)?;
    Ok(Segment { file, path })
}

/// Spares of an earlier run (a crash between allocating and using one).
fn remove_stale_spares(st: &dyn Storage, dir: &Path) {
    for name in st.read_dir(dir).unwrap_or_default() {
        let n = name.to_string_lossy();
        if n.starts_with("journal-spare-") && n.ends_with(".tmp") {
            let _ = st.remove_file(&dir.join(&*n));
        }
    }
}

fn relaxed_due(inner: &Inner, g: &State) -> bool {
    match inner.opts.durability.relaxed() {
        Some((n, interval)) => {
            let new = g.last_appended - g.written;
            g.unsynced + new >= n as u64 || g.last_sync.elapsed() >= interval
        }
        None => true,
    }
}

fn wait_for_space(inner: &Inner, g: &mut MutexGuard<'_, State>) {
    g.throttled += 1;
    wait_bounded(inner, &inner.space_cv, g, None);
    g.throttled -= 1;
}

/// One wait on `cv` for another thread's progress, bounded: it returns by
/// the time the flush or allocation in progress (or, from `since`, the
/// caller's own wait) reaches the stall limit, and a flush or allocation
/// that did fails the journal (see [`STALL_LIMIT`]). Callers loop on their
/// condition and check `error`, as for any wake-up.
fn wait_bounded(
    inner: &Inner,
    cv: &Condvar,
    g: &mut MutexGuard<'_, State>,
    since: Option<Instant>,
) {
    let limit = g.stall_limit;
    let timeout = [
        g.flushing.then_some(g.flush_since),
        g.allocating.then_some(g.alloc_since),
        since,
    ]
    .into_iter()
    .flatten()
    .map(|t| limit.saturating_sub(t.elapsed()))
    .min()
    .unwrap_or(limit);
    if !timeout.is_zero() {
        cv.wait_for(g, timeout);
    }
    if g.error.is_some() {
        return;
    }
    let stuck = if g.flushing && g.flush_since.elapsed() >= limit {
        Some(("a write or fsync", g.flush_since))
    } else if g.allocating && g.alloc_since.elapsed() >= limit {
        Some(("a space allocation (fallocate)", g.alloc_since))
    } else {
        None
    };
    if let Some((what, t)) = stuck {
        let msg = format!(
            "{what} of the journal in {} has not returned for {:?}: the disk is taken as hung",
            inner.dir.display(),
            t.elapsed()
        );
        tracing::error!("journal: {msg}; the journal refuses further commits");
        g.error = Some(msg);
        inner.durable_cv.notify_all();
        inner.space_cv.notify_all();
        inner.work_cv.notify_all();
    }
}

/// Waits until commit `id` is durable. Ends because every round either
/// returns, or runs a flush (which writes everything appended, so `durable`
/// reaches `last_appended >= id` or `error` is set), or waits for the
/// flusher, which clears `flushing` and notifies `durable_cv` on every path
/// of [`flush`]; a flusher stuck in the disk past [`STALL_LIMIT`] fails
/// the journal ([`wait_bounded`]). An id past the last commit would make it spin: refused.
fn wait_durable_locked(inner: &Inner, g: &mut MutexGuard<'_, State>, id: u64) -> Result<()> {
    if id > g.last_appended {
        debug_assert!(
            false,
            "commit {id} waited for, {} appended",
            g.last_appended
        );
        return Err(Error::UnknownCommit {
            commit: id,
            last: g.last_appended,
        });
    }
    loop {
        if let Some(e) = &g.error {
            return Err(Error::Failed(e.clone()));
        }
        if g.durable >= id {
            return Ok(());
        }
        if !g.flushing {
            flush(inner, g, true)?;
            // A flush writes and syncs all that was appended, `id` with it.
            debug_assert!(g.error.is_some() || g.durable >= id);
            continue;
        }
        wait_bounded(inner, &inner.durable_cv, g, None);
    }
}

/// Writes everything pending (and fsyncs when `sync`). Called with the lock
/// held and `flushing` false; drops the lock during I/O.
fn flush(inner: &Inner, g: &mut MutexGuard<'_, State>, sync: bool) -> Result<()> {
    debug_assert!(!g.flushing);
    if g.pending.is_empty() && (!sync || g.unsynced == 0) {
        return Ok(());
    }
    g.flushing = true;
    g.flush_since = Instant::now();
    let mut chunks = std::mem::take(&mut g.pending);
    let bytes = g.pending_bytes;
    g.pending_bytes = 0;
    let last = g.last_appended;
    let mut seg = g.seg.take().expect("segment present when not flushing");
    let mut new_segments = Vec::new();
    let res = MutexGuard::unlocked(g, || {
        write_out(
            &*inner.storage,
            &inner.dir,
            &mut seg,
            &mut chunks,
            sync,
            &mut new_segments,
        )
    });
    g.seg = Some(seg);
    g.flushing = false;
    for c in &chunks {
        if let Some((first, Some(spare))) = &c.new_segment
            && g.append_file == *spare
        {
            g.append_file = inner.dir.join(format::segment_file_name(*first));
        }
    }
    g.segments.extend(new_segments);
    for mut c in chunks {
        // Reuse keeps appends from reallocating; the cap keeps one burst
        // from pinning its peak memory for the life of the journal.
        if g.spare.len() < 4 && c.buf.capacity() <= (8 << 20) {
            c.buf.clear();
            g.spare.push(c.buf);
        }
    }
    match res {
        Ok(()) => {
            let newly = last - g.written;
            g.written = last;
            g.bytes_written += bytes as u64;
            if sync {
                g.durable = last;
                g.unsynced = 0;
                g.last_sync = Instant::now();
                g.fsyncs += 1;
            } else {
                g.unsynced += newly;
            }
            inner.durable_cv.notify_all();
            inner.space_cv.notify_all();
            Ok(())
        }
        Err(e) => {
            // fsync failures are not retryable (the kernel may have dropped
            // the dirty pages): fail every later commit instead of lying.
            let msg = e.to_string();
            g.error = Some(msg.clone());
            inner.durable_cv.notify_all();
            inner.space_cv.notify_all();
            Err(Error::Failed(msg))
        }
    }
}

fn write_out(
    st: &dyn Storage,
    dir: &Path,
    seg: &mut Segment,
    chunks: &mut VecDeque<Chunk>,
    sync: bool,
    new_segments: &mut Vec<(u64, PathBuf)>,
) -> Result<()> {
    for c in chunks.iter() {
        if let Some((first, spare)) = &c.new_segment {
            // The old segment is made durable before the new one starts, so
            // the durable prefix never has holes whatever the mode.
            seg.file.sync_data().map_err(io_err(&seg.path))?;
            *seg = create_segment_in(st, dir, *first, spare.as_deref())?;
            new_segments.push((*first, seg.path.clone()));
        }
        seg.file.write_all(&c.buf).map_err(io_err(&seg.path))?;
    }
    if sync {
        seg.file.sync_data().map_err(io_err(&seg.path))?;
    }
    Ok(())
}

/// How long the async writer waits for more commits before one flush takes
/// them all: one fsync per 10 milliseconds instead of one per wake-up (a
/// file system commits once per operation, and each fsync costs CPU and disk
/// time that the operations share on a small machine). `sync()` and
/// `wait_durable` callers never wait for it: they flush themselves.
const GROUP_WINDOW: Duration = Duration::from_millis(10);

/// Commits queued that end a group window early: a quarter of the bound.
fn group_size(mode: Durability) -> u64 {
    mode.bounds().map_or(1, |(n, _)| (n as u64 / 4).max(1))
}

fn background(inner: &Inner) {
    let mode = inner.opts.durability;
    let interval = mode
        .relaxed()
        .map(|(_, i)| i)
        .unwrap_or(Duration::from_millis(100));
    let mut g = inner.state.lock();
    let mut window: Option<Instant> = None;
    loop {
        if g.error.is_some() {
            break;
        }
        if !g.flushing && !g.pending.is_empty() && mode.is_async() {
            let queued = g.last_appended - g.written;
            if !g.shutdown && queued < group_size(mode) {
                let opened = *window.get_or_insert_with(Instant::now);
                let left = GROUP_WINDOW.saturating_sub(opened.elapsed());
                if !left.is_zero() {
                    g.gathering = true;
                    inner.work_cv.wait_for(&mut g, left);
                    continue;
                }
            }
            g.gathering = false;
            window = None;
            let sync = match mode {
                Durability::AsyncRelaxed { .. } => relaxed_due(inner, &g) || g.shutdown,
                _ => true,
            };
            if flush(inner, &mut g, sync).is_err() {
                break;
            }
            continue;
        }
        if g.shutdown {
            break;
        }
        let stale = g.unsynced > 0 || (!g.pending.is_empty() && !mode.is_async());
        if stale && !g.flushing && g.last_sync.elapsed() >= interval {
            if flush(inner, &mut g, true).is_err() {
                break;
            }
            continue;
        }
        let wait = if stale {
            interval
                .saturating_sub(g.last_sync.elapsed())
                .max(Duration::from_millis(1))
        } else {
            interval
        };
        inner.work_cv.wait_for(&mut g, wait);
    }
}
