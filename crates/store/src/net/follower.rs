//! A follower: keeps a local replica of a served store up to date.
//!
//! The replica's journal numbers its commits exactly like the writer's (one
//! commit per block or rollback, from 1, no gaps), so the replica's own
//! recovered state `(last commit, current block)` is its position in the
//! writer's event stream: no separate progress file can disagree with it
//! after a crash. Each event says which event number it is and which block
//! it follows; the follower refuses one that skips a number or does not
//! continue from its own block.

use super::client::{Client, ClientConfig, ClientError, Event, Subscription, decode_event};
use super::protocol::{ErrorCode, Role, Welcome};
use crate::stages::{self, Stage};
use crate::{Durability, PreparedBlock, Store, StoreError, StoreOptions};
use parking_lot::{Condvar, MappedRwLockReadGuard, Mutex, RwLock, RwLockReadGuard};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, mpsc};
use std::time::Duration;

pub struct FollowerConfig {
    pub client: ClientConfig,
    pub dir: PathBuf,
    /// Durability of the replica's own journal.
    pub durability: Durability,
    pub threads: usize,
    /// Longest pause between reconnection attempts.
    pub max_backoff: Duration,
    /// Called with (event, block) each time the replica has caught up with
    /// the writer (seen on a heartbeat), once per position.
    pub on_caught_up: Option<Box<dyn Fn(u64, u64) + Send>>,
}

#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error("replica store in {dir}: {source}")]
    Store {
        dir: PathBuf,
        #[source]
        source: StoreError,
    },
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("the stream skips events: expected event {expected}, got {got}; refusing to apply it")]
    Skipped { expected: u64, got: u64 },
    #[error("the stream does not continue this replica's history: {0}")]
    Diverged(String),
    #[error("snapshot transfer into {dir}: {why}")]
    Snapshot { dir: PathBuf, why: String },
}

/// Consecutive snapshot transfers after which a follower that still cannot
/// subscribe gives up (the writer moves faster than a copy can be made).
const MAX_SNAPSHOT_TRIES: u32 = 3;

/// `DIR.snapshot-incoming` or `DIR.snapshot-old`, next to the replica.
fn sibling(dir: &Path, what: &str) -> Result<PathBuf, FollowError> {
    let name = dir.file_name().ok_or_else(|| FollowError::Snapshot {
        dir: dir.to_path_buf(),
        why: "the replica directory needs a name (not / or ..)".into(),
    })?;
    let mut n = name.to_os_string();
    n.push(format!(".snapshot-{what}"));
    Ok(dir.with_file_name(n))
}

/// Marks a completely received copy, before it replaces the replica.
const COMPLETE: &str = ".complete";

/// Finishes or undoes a replacement of the replica that a crash interrupted
/// (see [`install_snapshot`]).
fn recover_swap(dir: &Path) -> Result<(), FollowError> {
    let incoming = sibling(dir, "incoming")?;
    let old = sibling(dir, "old")?;
    let io = |why: std::io::Error| FollowError::Snapshot {
        dir: dir.to_path_buf(),
        why: why.to_string(),
    };
    if incoming.exists() {
        if !dir.exists() && incoming.join(COMPLETE).exists() {
            std::fs::rename(&incoming, dir).map_err(io)?;
        } else {
            std::fs::remove_dir_all(&incoming).map_err(io)?;
        }
    }
    if old.exists() {
        if dir.exists() {
            std::fs::remove_dir_all(&old).map_err(io)?;
        } else {
            std::fs::rename(&old, dir).map_err(io)?;
        }
    }
    let _ = std::fs::remove_file(dir.join(COMPLETE));
    Ok(())
}

/// Replaces the replica with a copy of the writer's files: received into
/// `DIR.snapshot-incoming` (the old replica stays readable meanwhile), then,
/// with readers held off, the old store is closed, the directories are
/// swapped by renames and the copy is opened (which recovers it like any
/// store after a crash). A crash at any point leaves either the old replica
/// or the complete copy, found by [`recover_swap`] at the next start.
fn install_snapshot(
    ccfg: &ClientConfig,
    dir: &Path,
    opts: &StoreOptions,
    replica: &Replica,
) -> Result<(), FollowError> {
    let incoming = sibling(dir, "incoming")?;
    let old = sibling(dir, "old")?;
    let io = |why: std::io::Error| FollowError::Snapshot {
        dir: dir.to_path_buf(),
        why: why.to_string(),
    };
    if incoming.exists() {
        std::fs::remove_dir_all(&incoming).map_err(io)?;
    }
    std::fs::create_dir_all(&incoming).map_err(io)?;
    let t0 = std::time::Instant::now();
    let (files, bytes) = Client::connect(ccfg.clone())?.fetch_snapshot(&incoming)?;
    std::fs::File::create(incoming.join(COMPLETE))
        .and_then(|f| f.sync_all())
        .map_err(io)?;
    sync_dir(&incoming).map_err(io)?;
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
    let mut g = replica.store.write();
    if let Some(s) = g.take() {
        s.close().map_err(|source| FollowError::Store {
            dir: dir.to_path_buf(),
            source,
        })?;
    }
    if dir.exists() {
        std::fs::rename(dir, &old).map_err(io)?;
    }
    std::fs::rename(&incoming, dir).map_err(io)?;
    if let Some(p) = parent {
        sync_dir(p).map_err(io)?;
    }
    if old.exists() {
        std::fs::remove_dir_all(&old).map_err(io)?;
    }
    std::fs::remove_file(dir.join(COMPLETE)).map_err(io)?;
    let st = Store::open_or_create(dir, opts.clone()).map_err(|source| FollowError::Store {
        dir: dir.to_path_buf(),
        source,
    })?;
    tracing::info!(
        files,
        bytes,
        seq = st.last_commit(),
        block = st.current_block(),
        secs = t0.elapsed().as_secs_f64(),
        "follower: installed a snapshot of the writer"
    );
    *g = Some(st);
    Ok(())
}

fn sync_dir(p: &Path) -> std::io::Result<()> {
    std::fs::File::open(p)?.sync_all()
}

/// The follower's store, shared with readers (a read-only server, see
/// [`super::server::Server::bind_replica`]). The follower holds the write
/// lock while it applies one event, so a reader sees the state after some
/// whole event of the writer's history, never a block half applied.
#[derive(Default)]
pub struct Replica {
    store: RwLock<Option<Store>>,
}

impl Replica {
    pub fn new() -> Arc<Replica> {
        Arc::new(Replica::default())
    }

    /// The store, read-locked (the follower waits until the guard is
    /// dropped), or `None` before the follower has opened it.
    pub fn read(&self) -> Option<MappedRwLockReadGuard<'_, Store>> {
        RwLockReadGuard::try_map(self.store.read(), Option::as_ref).ok()
    }
}

/// Where the replica is, for observers (tests, metrics).
#[derive(Default)]
pub struct Progress {
    pub seq: AtomicU64,
    pub block: AtomicU64,
    /// The writer's last event number, from the latest event or heartbeat.
    pub writer_seq: AtomicU64,
    pub connected: AtomicBool,
    /// Snapshots of the writer installed.
    pub snapshots: AtomicU64,
    /// Time spent applying events (replica write lock held), and waiting
    /// for the next frame with nothing to apply, in nanoseconds.
    pub apply_nanos: AtomicU64,
    pub idle_nanos: AtomicU64,
    /// Position reports (ACK) the writer has accepted.
    pub reports: AtomicU64,
    /// Wakes the thread that reports the position when `seq` moves.
    applied: Mutex<()>,
    applied_cv: Condvar,
}

impl Progress {
    fn set_applied(&self, seq: u64) {
        self.seq.store(seq, Relaxed);
        self.wake_reporter();
    }

    fn wake_reporter(&self) {
        // Taken so that the reporter, which checks under it before it
        // waits, cannot miss this wake-up.
        drop(self.applied.lock());
        self.applied_cv.notify_one();
    }
}

fn fatal(e: &ClientError) -> bool {
    matches!(
        e.code(),
        Some(
            ErrorCode::AuthFailed
                | ErrorCode::Forbidden
                | ErrorCode::BadVersion
                | ErrorCode::KeyWidth
                | ErrorCode::HistoryDiverged
                | ErrorCode::HistoryUnavailable
        )
    ) || matches!(e, ClientError::Tls(_) | ClientError::Protocol(_))
}

/// Follows until `stop` is set (returns `Ok`) or the stream cannot be
/// followed (returns the reason). Connection failures are retried with
/// backoff; the replica resumes from its last applied event.
pub fn follow(
    cfg: FollowerConfig,
    stop: &AtomicBool,
    progress: &Progress,
) -> Result<(), FollowError> {
    follow_into(cfg, &Replica::new(), stop, progress)
}

/// [`follow`], keeping the store in `replica` so that others can read it
/// meanwhile. The store is closed and removed from `replica` on return.
pub fn follow_into(
    cfg: FollowerConfig,
    replica: &Replica,
    stop: &AtomicBool,
    progress: &Progress,
) -> Result<(), FollowError> {
    let mut ccfg = cfg.client.clone();
    ccfg.role = Role::Follow;
    recover_swap(&cfg.dir)?;
    // The position goes to the writer on a connection of its own: the
    // subscription's carries events one way only, and a TLS stream cannot
    // be read and written from two threads.
    let reporting = AtomicBool::new(true);
    let report_sock = Mutex::new(None);
    std::thread::scope(|sc| {
        let reporter = std::thread::Builder::new()
            .name("follower-ack".into())
            .spawn_scoped(sc, || {
                report_position(
                    &ccfg,
                    stop,
                    &reporting,
                    &report_sock,
                    progress,
                    cfg.max_backoff,
                )
            });
        if let Err(e) = reporter {
            tracing::warn!(error = %e, "follower: cannot start the thread that reports its position; a writer with --max-follower-lag will not wait for it");
        }
        let r = follow_loop(&cfg, &ccfg, replica, stop, progress);
        // End the reporter without waiting for a report in flight: the flag
        // first, then its socket (see `report_position`).
        reporting.store(false, Relaxed);
        if let Some(s) = report_sock.lock().take() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        progress.wake_reporter();
        r
    })
}

fn follow_loop(
    cfg: &FollowerConfig,
    ccfg: &ClientConfig,
    replica: &Replica,
    stop: &AtomicBool,
    progress: &Progress,
) -> Result<(), FollowError> {
    let serr = |source| FollowError::Store {
        dir: cfg.dir.clone(),
        source,
    };
    let mut backoff = Duration::from_millis(50);
    let mut snapshots = 0u32;
    let result = loop {
        if stop.load(Relaxed) {
            break Ok(());
        }
        let client = match Client::connect(ccfg.clone()) {
            Ok(c) => c,
            Err(e) if !fatal(&e) => {
                tracing::warn!(error = %e, "follower: cannot reach the writer; retrying");
                pause(&|| stop.load(Relaxed), &mut backoff, cfg.max_backoff);
                continue;
            }
            Err(e) => break Err(e.into()),
        };
        let opts = replica_options(cfg, client.welcome());
        if let Err(e) = open_replica(cfg, replica, &opts) {
            break Err(e);
        }
        let (seq, r) = follow_stream(cfg, replica, client, stop, progress, &mut backoff);
        if progress.seq.load(Relaxed) > seq {
            snapshots = 0;
        }
        match r {
            Ok(()) => break Ok(()),
            Err(FollowError::Client(e))
                if e.code() == Some(ErrorCode::HistoryUnavailable)
                    && snapshots < MAX_SNAPSHOT_TRIES =>
            {
                snapshots += 1;
                tracing::info!(error = %e, "follower: the writer no longer has the events this replica needs; fetching a snapshot");
                match install_snapshot(ccfg, &cfg.dir, &opts, replica) {
                    Ok(()) => {
                        progress.snapshots.fetch_add(1, Relaxed);
                    }
                    Err(FollowError::Client(e)) if !fatal(&e) => {
                        tracing::warn!(error = %e, "follower: snapshot transfer failed; retrying");
                        pause(&|| stop.load(Relaxed), &mut backoff, cfg.max_backoff);
                    }
                    Err(e) => break Err(e),
                }
            }
            Err(FollowError::Client(e)) if !fatal(&e) => {
                tracing::warn!(error = %e, "follower: connection lost; resuming");
                pause(&|| stop.load(Relaxed), &mut backoff, cfg.max_backoff);
            }
            Err(e) => break Err(e),
        }
    };
    if let Err(e) = &result {
        tracing::error!(error = %e, "follower stopped");
    }
    let store = replica.store.write().take();
    if let Some(s) = store {
        s.close().map_err(serr)?;
    }
    result
}

/// The replica's options: the layout the writer announced, the durability
/// and threads configured here.
fn replica_options(cfg: &FollowerConfig, w: &Welcome) -> StoreOptions {
    StoreOptions {
        key_width: w.key_width as usize,
        shards: w.shards as usize,
        rollback_window: w.rollback_window,
        durability: cfg.durability,
        threads: cfg.threads,
        ..Default::default()
    }
}

/// Opens the replica's store, unless it is open already.
fn open_replica(
    cfg: &FollowerConfig,
    replica: &Replica,
    opts: &StoreOptions,
) -> Result<(), FollowError> {
    if replica.store.read().is_none() {
        recover_swap(&cfg.dir)?;
        match Store::open_or_create(&cfg.dir, opts.clone()) {
            Ok(s) => *replica.store.write() = Some(s),
            Err(source) => {
                return Err(FollowError::Store {
                    dir: cfg.dir.clone(),
                    source,
                });
            }
        }
    }
    Ok(())
}

/// Subscribes from the replica's position and applies the stream until it
/// ends. Returns the position it started from, and how the stream ended.
fn follow_stream(
    cfg: &FollowerConfig,
    replica: &Replica,
    client: Client,
    stop: &AtomicBool,
    progress: &Progress,
    backoff: &mut Duration,
) -> (u64, Result<(), FollowError>) {
    let (seq, block) = {
        let st = replica.read().expect("opened");
        (st.last_commit(), st.current_block())
    };
    progress.set_applied(seq);
    progress.block.store(block, Relaxed);
    let writer_seq = client.welcome().last_seq;
    tracing::info!(seq, block, writer_seq, "follower: subscribing");
    let sub = client.subscribe(seq, block);
    let r = sub.map_err(FollowError::from).and_then(|sub| {
        progress.connected.store(true, Relaxed);
        progress.wake_reporter();
        let r = apply_stream(replica, sub, stop, progress, backoff, &cfg.on_caught_up);
        progress.connected.store(false, Relaxed);
        r
    });
    (seq, r)
}

/// Tells the writer, on a connection of its own, each time the replica has
/// applied more events (the latest position only: a report that finds
/// several new events sends one ACK), until `stop` or until `reporting`
/// ends. Failures only delay the reports: the writer stops waiting for a
/// follower that is silent (`--follower-wait`), and the stream itself is
/// the subscription's business.
fn report_position(
    ccfg: &ClientConfig,
    stop: &AtomicBool,
    reporting: &AtomicBool,
    sock: &Mutex<Option<std::net::TcpStream>>,
    progress: &Progress,
    max_backoff: Duration,
) {
    let ended = || stop.load(Relaxed) || !reporting.load(Relaxed);
    // An ACK is answered without the writer's lock, so its round trip is
    // short: a writer that takes seconds is gone, and the follower must not
    // wait that long to stop (only the handshake cannot be interrupted).
    let mut ccfg = ccfg.clone();
    ccfg.connect_timeout = ccfg.connect_timeout.min(Duration::from_secs(1));
    ccfg.io_timeout = ccfg.io_timeout.min(Duration::from_secs(2));
    let mut client: Option<Client> = None;
    // None on a new connection: the writer learns the position at once,
    // which is what makes it wait for this follower from the first block.
    let mut acked: Option<u64> = None;
    let mut backoff = Duration::from_millis(50);
    loop {
        let Some(seq) = next_position(progress, acked, &ended) else {
            return;
        };
        let c = match &mut client {
            Some(c) => c,
            None => match Client::connect(ccfg.clone()) {
                Ok(c) => {
                    // Stored, then the flag checked: the follower sets the
                    // flag, then takes the socket, so one of the two sees
                    // the other.
                    *sock.lock() = c.socket();
                    if ended() {
                        return;
                    }
                    client.insert(c)
                }
                Err(e) if fatal(&e) => {
                    tracing::info!(error = %e, "follower: the writer does not take position reports");
                    return;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "follower: cannot report the position yet");
                    pause(&ended, &mut backoff, max_backoff);
                    continue;
                }
            },
        };
        match c.ack(seq) {
            Ok(_) => {
                acked = Some(seq);
                progress.reports.fetch_add(1, Relaxed);
                backoff = Duration::from_millis(50);
            }
            Err(e) if e.code() == Some(ErrorCode::UnknownType) => {
                tracing::info!(error = %e, "follower: the writer does not take position reports");
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, "follower: position report failed; retrying");
                client = None;
                acked = None;
                pause(&ended, &mut backoff, max_backoff);
            }
        }
    }
}

/// Waits for a position to report: one past `acked` (any, with none yet).
/// `None` once `ended`.
fn next_position(progress: &Progress, acked: Option<u64>, ended: &dyn Fn() -> bool) -> Option<u64> {
    let mut g = progress.applied.lock();
    loop {
        if ended() {
            return None;
        }
        // Only while subscribed: a writer that does not stream to
        // this follower has no use for its position.
        let s = progress.seq.load(Relaxed);
        if progress.connected.load(Relaxed) && acked.is_none_or(|a| s > a) {
            return Some(s);
        }
        progress
            .applied_cv
            .wait_for(&mut g, Duration::from_millis(100));
    }
}

fn pause(stop: &dyn Fn() -> bool, backoff: &mut Duration, max: Duration) {
    let until = std::time::Instant::now() + *backoff;
    while std::time::Instant::now() < until && !stop() {
        std::thread::sleep(Duration::from_millis(10));
    }
    *backoff = (*backoff * 2).min(max);
}

/// Frames received but not yet applied: the reader runs at most this far
/// ahead of the applier (bounded memory: a few blocks).
const READ_AHEAD: usize = 4;

/// An event as the applier needs it; a block's entries are in the
/// [`PreparedBlock`] that travels with it.
#[derive(Clone, Copy)]
enum Ev {
    Block {
        seq: u64,
        prev: u64,
        block: u64,
    },
    Rollback {
        seq: u64,
        prev: u64,
        target: u64,
        result: u64,
    },
    Heartbeat {
        last_seq: u64,
    },
}

type Received = Result<(Ev, PreparedBlock), ClientError>;

/// Receives the next frame into `pb`, checks it and, for a block, indexes,
/// hashes and buckets its entries (all of it off the applier's thread).
fn receive(sub: &mut Subscription, mut pb: PreparedBlock, kw: usize, shards: usize) -> Received {
    sub.next_frame(pb.bytes_mut())?;
    let received = stages::enabled().then(std::time::Instant::now);
    let f = pb.bytes();
    let (ev, entries) = match decode_event(f[0], &f[1..], kw)? {
        Event::Block {
            seq,
            prev,
            block,
            entries,
            ..
        } => {
            // `entries` borrows `f`: its position in the buffer.
            let at = entries.as_ptr() as usize - f.as_ptr() as usize;
            (Ev::Block { seq, prev, block }, Some(at..at + entries.len()))
        }
        Event::Rollback {
            seq,
            prev,
            target,
            result,
        } => (
            Ev::Rollback {
                seq,
                prev,
                target,
                result,
            },
            None,
        ),
        Event::Heartbeat { last_seq, .. } => (Ev::Heartbeat { last_seq }, None),
    };
    if let Some(r) = entries {
        pb.prepare(r, kw, shards)
            .map_err(|e| ClientError::Protocol(format!("event block: {e}")))?;
    }
    if let (Some(t), Ev::Block { seq, .. } | Ev::Rollback { seq, .. }) = (received, ev) {
        stages::mark_at(seq, Stage::FollowerReceived, t);
        stages::mark(seq, Stage::FollowerPrepared);
    }
    Ok((ev, pb))
}

/// Applies the stream. A reader thread receives, checks and prepares
/// (indexes and hashes) the next blocks while this thread applies the
/// current one, so the transfer and decoding of block N+1 overlap the
/// application of block N, and the applier does only the table and journal
/// work.
fn apply_stream(
    replica: &Replica,
    sub: Subscription,
    stop: &AtomicBool,
    progress: &Progress,
    backoff: &mut Duration,
    on_caught_up: &Option<Box<dyn Fn(u64, u64) + Send>>,
) -> Result<(), FollowError> {
    let sock = sub.socket();
    let (kw, shards) = {
        let st = replica.read().expect("opened");
        (st.key_width(), st.options().shards)
    };
    let (tx, rx) = mpsc::sync_channel::<Received>(READ_AHEAD);
    let (free_tx, free_rx) = mpsc::channel::<PreparedBlock>();
    std::thread::scope(|sc| {
        std::thread::Builder::new()
            .name("follower-recv".into())
            .spawn_scoped(sc, move || {
                let mut sub = sub;
                loop {
                    let pb = free_rx.try_recv().unwrap_or_default();
                    let r = receive(&mut sub, pb, kw, shards);
                    let failed = r.is_err();
                    if tx.send(r).is_err() || failed {
                        return;
                    }
                }
            })
            .map_err(|e| {
                FollowError::Client(ClientError::Io {
                    addr: "follower-recv thread".into(),
                    source: e,
                })
            })?;
        let r = apply_frames(
            replica,
            &rx,
            &free_tx,
            stop,
            progress,
            backoff,
            on_caught_up,
        );
        // Unblock the reader (it may wait for the next frame) and let it end.
        if let Some(s) = &sock {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        drop(rx);
        r
    })
}

fn apply_frames(
    replica: &Replica,
    rx: &mpsc::Receiver<Received>,
    free: &mpsc::Sender<PreparedBlock>,
    stop: &AtomicBool,
    progress: &Progress,
    backoff: &mut Duration,
    on_caught_up: &Option<Box<dyn Fn(u64, u64) + Send>>,
) -> Result<(), FollowError> {
    let mut reported = None;
    loop {
        if stop.load(Relaxed) {
            return Ok(());
        }
        let t_wait = std::time::Instant::now();
        let got = rx.recv_timeout(Duration::from_millis(50));
        progress
            .idle_nanos
            .fetch_add(t_wait.elapsed().as_nanos() as u64, Relaxed);
        let (ev, pb) = match got {
            Ok(r) => r?,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(FollowError::Client(ClientError::Protocol(
                    "the subscription reader stopped".into(),
                )));
            }
        };
        *backoff = Duration::from_millis(50);
        let (seq, prev) = match ev {
            Ev::Heartbeat { last_seq } => {
                heartbeat(replica, progress, last_seq, &mut reported, on_caught_up);
                let _ = free.send(pb);
                continue;
            }
            Ev::Block { seq, prev, .. } | Ev::Rollback { seq, prev, .. } => (seq, prev),
        };
        // Readers wait while this one event is applied.
        let t_apply = std::time::Instant::now();
        stages::mark_at(seq, Stage::FollowerDequeued, t_apply);
        let guard = replica.store.write();
        stages::mark(seq, Stage::FollowerLocked);
        let st = guard.as_ref().expect("opened");
        apply_event(st, ev, &pb, seq, prev)?;
        progress.block.store(st.current_block(), Relaxed);
        progress.writer_seq.fetch_max(seq, Relaxed);
        stages::mark(seq, Stage::FollowerApplied);
        drop(guard);
        progress.set_applied(seq);
        progress
            .apply_nanos
            .fetch_add(t_apply.elapsed().as_nanos() as u64, Relaxed);
        let _ = free.send(pb);
    }
}

/// A heartbeat: notes the writer's position, and tells `on_caught_up` once
/// per position when the replica has reached it.
fn heartbeat(
    replica: &Replica,
    progress: &Progress,
    last_seq: u64,
    reported: &mut Option<(u64, u64)>,
    on_caught_up: &Option<Box<dyn Fn(u64, u64) + Send>>,
) {
    progress.writer_seq.store(last_seq, Relaxed);
    let here = {
        let st = replica.read().expect("opened");
        (st.last_commit(), st.current_block())
    };
    if last_seq == here.0 && *reported != Some(here) {
        *reported = Some(here);
        if let Some(f) = on_caught_up {
            f(here.0, here.1);
        }
    }
}

/// Applies event `seq` (a block or a rollback, which followed block `prev`)
/// to the replica's store, checking that it is the next one and leaves the
/// replica where it left the writer.
fn apply_event(
    st: &Store,
    ev: Ev,
    pb: &PreparedBlock,
    seq: u64,
    prev: u64,
) -> Result<(), FollowError> {
    let diverged = |e: StoreError| FollowError::Diverged(e.to_string());
    let last = st.last_commit();
    if seq != last + 1 {
        return Err(FollowError::Skipped {
            expected: last + 1,
            got: seq,
        });
    }
    let current = st.current_block();
    if prev != current {
        return Err(FollowError::Diverged(format!(
            "event {seq} follows block {prev}, the replica is at block {current}"
        )));
    }
    match ev {
        Ev::Block { block, .. } => {
            st.set_prepared(block, pb).map_err(diverged)?;
        }
        Ev::Rollback { target, result, .. } => {
            st.rollback(target).map_err(diverged)?;
            if st.current_block() != result {
                return Err(FollowError::Diverged(format!(
                    "rollback to {target} reached block {} here, {result} on the writer",
                    st.current_block()
                )));
            }
        }
        Ev::Heartbeat { .. } => unreachable!("handled above"),
    }
    if st.last_commit() != seq {
        return Err(FollowError::Diverged(format!(
            "the replica's journal numbers event {seq} as commit {}: was this directory written by something other than this follower?",
            st.last_commit()
        )));
    }
    Ok(())
}
