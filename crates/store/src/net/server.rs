//! The store server: one thread per connection (blocking I/O), a bounded
//! number of connections, one writer at a time, and an in-memory log of the
//! latest committed events for subscribers.
//!
//! Why threads and not an async runtime: every request is a short in-memory
//! operation or a journal commit that blocks on fsync anyway; a thread per
//! connection keeps the request path a plain loop (read frames, answer, flush
//! once per batch of pipelined frames), TLS is rustls's blocking
//! `StreamOwned`, and the connection limit bounds the threads. Idle
//! connections cost a parked thread with a small stack each.

use super::auth::Auth;
use super::follower::Replica;
use super::protocol::{self as p, ErrorCode, Frame, Limits, ProtoError, Role, Welcome, op};
use super::{Stream, is_timeout};
use crate::stages::{self, Stage};
use crate::{MetricsSnapshot, Store, StoreError};
use parking_lot::{Condvar, MappedRwLockReadGuard, Mutex};
use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Server settings.
#[derive(Clone)]
pub struct ServerConfig {
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Allow plain TCP on a non-loopback address.
    pub insecure: bool,
    pub auth: Option<Arc<Auth>>,
    pub max_connections: usize,
    pub limits: Limits,
    /// How long a connection may stay silent between frames.
    pub idle_timeout: Duration,
    /// How long the rest of a frame may take once its first byte arrived
    /// (and the whole handshake, TLS included).
    pub frame_timeout: Duration,
    /// How long a write to a client that does not read may block.
    pub write_timeout: Duration,
    /// Events kept for subscribers that are behind (count and bytes).
    pub log_events: usize,
    pub log_bytes: usize,
    /// A subscription with nothing to send sends a HEARTBEAT this often.
    pub heartbeat: Duration,
    /// Bounded follower lag (`--max-follower-lag K`): the reply to a write
    /// that made event `e` waits until every follower in sync has reported
    /// (ACK) event `e - K` applied. `Some(1)`: when a writer's `set`
    /// returns, each such follower holds every block before it. `None`:
    /// followers never hold a write back.
    pub max_follower_lag: Option<u64>,
    /// How long one write waits for a follower; one that has not caught up
    /// by then stops holding writes back until it is within the bound again,
    /// so a stalled or partitioned follower costs the writer this once, not
    /// every block.
    pub follower_wait: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            tls: None,
            insecure: false,
            auth: None,
            max_connections: 1024,
            limits: Limits::default(),
            idle_timeout: Duration::from_secs(300),
            frame_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
            log_events: 10_000,
            log_bytes: 256 << 20,
            heartbeat: Duration::from_secs(1),
            max_follower_lag: None,
            follower_wait: Duration::from_secs(1),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: io::Error,
    },
    #[error(
        "refusing plain TCP on {0}, which is not a loopback address: give --tls-cert/--tls-key, or --insecure"
    )]
    PlainNotLoopback(SocketAddr),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Io(#[from] io::Error),
}

struct Event {
    seq: u64,
    /// The whole encoded frame (EV_BLOCK or EV_ROLLBACK).
    frame: Arc<Vec<u8>>,
}

struct Log {
    events: VecDeque<Event>,
    bytes: usize,
    /// Sequence number of the last committed event (retained or not).
    last_seq: u64,
    /// Current block after `last_seq`.
    current: u64,
    /// (last event, current block) that this server's readers are sure to
    /// see: a SET is published before the writer's tables have it, so this
    /// trails (`last_seq`, `current`) until the SET returns.
    visible: (u64, u64),
}

impl Log {
    /// The first sequence number still retained (last_seq + 1 when none).
    fn first_seq(&self) -> u64 {
        self.events.front().map_or(self.last_seq + 1, |e| e.seq)
    }
}

/// A follower that reports its position over its own connection (ACK).
struct Acker {
    /// Every event up to this one is applied in the follower's replica.
    seq: u64,
    /// Within `max_follower_lag` of the writer: writes wait for it. Cleared
    /// when a write gave up waiting, set again once it is within the bound.
    in_sync: bool,
}

/// Counters exported on the metrics endpoint.
#[derive(Default)]
pub struct Counters {
    pub connections_total: AtomicU64,
    pub connections_active: AtomicUsize,
    pub connections_rejected: AtomicU64,
    pub subscribers_active: AtomicUsize,
    pub requests: AtomicU64,
    pub gets: AtomicU64,
    pub blocks: AtomicU64,
    pub events_sent: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    /// Writes whose reply waited for a follower, the time they waited, and
    /// the waits that ran out (`max_follower_lag`).
    pub follower_waits: AtomicU64,
    pub follower_wait_nanos: AtomicU64,
    pub follower_timeouts: AtomicU64,
    errors: [AtomicU64; 23],
}

impl Counters {
    fn error(&self, c: ErrorCode) {
        let i = (c as usize).min(22);
        self.errors[i].fetch_add(1, Relaxed);
    }

    pub fn errors(&self, c: ErrorCode) -> u64 {
        self.errors[(c as usize).min(22)].load(Relaxed)
    }
}

/// What a server serves: a store it owns (the writer), or a follower's
/// replica, read-only, which the follower applies events to.
enum Backing {
    Owned(Box<Store>),
    Replica(Arc<Replica>),
}

/// A store borrowed for one request.
enum StoreRef<'a> {
    Owned(&'a Store),
    Replica(MappedRwLockReadGuard<'a, Store>),
}

impl std::ops::Deref for StoreRef<'_> {
    type Target = Store;
    fn deref(&self) -> &Store {
        match self {
            StoreRef::Owned(s) => s,
            StoreRef::Replica(g) => g,
        }
    }
}

struct Shared {
    store: Backing,
    cfg: ServerConfig,
    /// Serialises writers: a block, its log event and its reply go together.
    write: Mutex<()>,
    log: Mutex<Log>,
    log_cv: Condvar,
    stopping: AtomicBool,
    /// Clones of live sockets, to shut their reading side down on stop.
    conns: Mutex<HashMap<u64, TcpStream>>,
    /// Followers that report their position, by connection id.
    acks: Mutex<HashMap<u64, Acker>>,
    acks_cv: Condvar,
    counters: Counters,
    next_id: AtomicU64,
}

impl Shared {
    /// The store, or `None` while a follower's replica has none yet. A
    /// replica stays read-locked while the guard lives, so one request sees
    /// the state after a whole event.
    fn store(&self) -> Option<StoreRef<'_>> {
        match &self.store {
            Backing::Owned(s) => Some(StoreRef::Owned(s)),
            Backing::Replica(r) => r.read().map(StoreRef::Replica),
        }
    }

    fn is_replica(&self) -> bool {
        matches!(self.store, Backing::Replica(_))
    }

    /// (last event, current block): the published position for a writer,
    /// the replica's own for a follower.
    fn position(&self, store: &Store) -> (u64, u64) {
        if self.is_replica() {
            (store.last_commit(), store.current_block())
        } else {
            self.log.lock().visible
        }
    }
}

/// A running server (see [`Server::bind`] and [`Server::run`]).
pub struct Server {
    shared: Arc<Shared>,
    listener: TcpListener,
    addr: SocketAddr,
}

/// Stops a server from another thread (a signal handler thread, a test).
#[derive(Clone)]
pub struct ShutdownHandle {
    shared: Arc<Shared>,
    addr: SocketAddr,
}

impl ShutdownHandle {
    /// Stops accepting, lets each connection finish the request it is
    /// serving, and makes [`Server::run`] sync and close the store.
    pub fn shutdown(&self) {
        if self.shared.stopping.swap(true, Relaxed) {
            return;
        }
        tracing::info!("store server: shutting down");
        // Wake the accept loop.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        self.shared.log_cv.notify_all();
        self.shared.acks_cv.notify_all();
    }

    pub fn metrics_text(&self) -> String {
        metrics_text(&self.shared)
    }

    pub fn health(&self) -> String {
        match self.shared.store() {
            Some(s) => s.metrics().health,
            None => "the replica has no store yet".into(),
        }
    }

    pub fn counters(&self) -> &Counters {
        &self.shared.counters
    }
}

impl Server {
    /// Takes the store and listens on `addr`.
    pub fn bind(store: Store, addr: &str, cfg: ServerConfig) -> Result<Server, ServerError> {
        Server::bind_backing(Backing::Owned(Box::new(store)), addr, cfg)
    }

    /// Serves a follower's replica read-only: GET, MULTI_GET, STATUS and
    /// PING; SET, POP, ROLLBACK and SUBSCRIBE get `ReadOnlyReplica`. The
    /// follower keeps applying events to it meanwhile.
    pub fn bind_replica(
        replica: Arc<Replica>,
        addr: &str,
        cfg: ServerConfig,
    ) -> Result<Server, ServerError> {
        Server::bind_backing(Backing::Replica(replica), addr, cfg)
    }

    fn bind_backing(store: Backing, addr: &str, cfg: ServerConfig) -> Result<Server, ServerError> {
        let listener = TcpListener::bind(addr).map_err(|source| ServerError::Bind {
            addr: addr.to_string(),
            source,
        })?;
        let local = listener.local_addr()?;
        if cfg.tls.is_none() && !cfg.insecure && !local.ip().is_loopback() {
            return Err(ServerError::PlainNotLoopback(local));
        }
        let mut log = Log {
            events: VecDeque::new(),
            bytes: 0,
            last_seq: 0,
            current: 0,
            visible: (0, 0),
        };
        if let Backing::Owned(store) = &store {
            log.last_seq = store.last_commit();
            log.current = store.current_block();
            log.visible = (log.last_seq, log.current);
            seed_log(store, &mut log, &cfg);
        }
        let (block, last_seq) = (log.current, log.last_seq);
        tracing::info!(
            addr = %local,
            tls = cfg.tls.is_some(),
            replica = matches!(store, Backing::Replica(_)),
            block,
            seq = last_seq,
            history_from = log.first_seq(),
            "store server listening"
        );
        Ok(Server {
            shared: Arc::new(Shared {
                store,
                cfg,
                write: Mutex::new(()),
                log: Mutex::new(log),
                log_cv: Condvar::new(),
                stopping: AtomicBool::new(false),
                conns: Mutex::new(HashMap::new()),
                acks: Mutex::new(HashMap::new()),
                acks_cv: Condvar::new(),
                counters: Counters::default(),
                next_id: AtomicU64::new(1),
            }),
            listener,
            addr: local,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            shared: self.shared.clone(),
            addr: self.addr,
        }
    }

    /// Serves until [`ShutdownHandle::shutdown`], then waits for the
    /// connections to finish, syncs and closes the store.
    pub fn run(self) -> Result<(), ServerError> {
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        let rejecting = Arc::new(AtomicUsize::new(0));
        for incoming in self.listener.incoming() {
            if self.shared.stopping.load(Relaxed) {
                break;
            }
            let sock = match incoming {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    // EMFILE and the like: give the process a moment.
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            threads.retain(|t| !t.is_finished());
            let sh = self.shared.clone();
            sh.counters.connections_total.fetch_add(1, Relaxed);
            if sh.counters.connections_active.load(Relaxed) >= sh.cfg.max_connections {
                turn_away(sh, sock, &rejecting);
                continue;
            }
            threads.extend(start_connection(sh, sock));
        }
        let stuck = finish_connections(&self.shared, threads);
        let Backing::Owned(store) = &self.shared.store else {
            // The follower owns the replica and closes it.
            tracing::info!("replica server stopped");
            return Ok(());
        };
        let _w = self.shared.write.lock();
        store.sync()?;
        tracing::info!(
            block = store.current_block(),
            "store synced; server stopped"
        );
        drop(_w);
        match Arc::try_unwrap(self.shared) {
            Ok(Shared {
                store: Backing::Owned(store),
                ..
            }) => (*store).close()?,
            Ok(_) => {}
            // A stuck connection thread or a live ShutdownHandle (metrics,
            // health) still holds it: the store is synced; dropping the last
            // reference closes it. Only the first is worth a warning.
            Err(_) if stuck > 0 => {
                tracing::warn!(stuck, "connections did not finish in time")
            }
            Err(_) => tracing::debug!("the store closes when the last shutdown handle goes"),
        }
        Ok(())
    }
}

/// Refuses a connection over `max_connections`, telling the client why.
fn turn_away(sh: Arc<Shared>, sock: TcpStream, rejecting: &Arc<AtomicUsize>) {
    sh.counters.connections_rejected.fetch_add(1, Relaxed);
    sh.counters.error(ErrorCode::TooManyConnections);
    tracing::warn!(peer = ?sock.peer_addr().ok(), limit = sh.cfg.max_connections, "connection refused: too many connections");
    // Tell the client why, off the accept thread (a TLS handshake
    // may be needed), but never with more than a few threads.
    if rejecting.fetch_add(1, Relaxed) < 16 {
        let r = rejecting.clone();
        let _ = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || {
                reject(&sh, sock);
                r.fetch_sub(1, Relaxed);
            });
    } else {
        rejecting.fetch_sub(1, Relaxed);
    }
}

/// Serves an accepted connection on a thread of its own.
fn start_connection(sh: Arc<Shared>, sock: TcpStream) -> Option<JoinHandle<()>> {
    sh.counters.connections_active.fetch_add(1, Relaxed);
    let id = sh.next_id.fetch_add(1, Relaxed);
    if let Ok(c) = sock.try_clone() {
        sh.conns.lock().insert(id, c);
    }
    let spawned = std::thread::Builder::new()
        .name(format!("store-conn-{id}"))
        .stack_size(256 << 10)
        .spawn({
            let sh = sh.clone();
            move || connection(&sh, sock, id)
        });
    match spawned {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::error!(error = %e, "cannot start a connection thread");
            sh.conns.lock().remove(&id);
            sh.counters.connections_active.fetch_sub(1, Relaxed);
            None
        }
    }
}

/// A connection's thread: serves it, then forgets it.
fn connection(sh: &Arc<Shared>, sock: TcpStream, id: u64) {
    let peer = sock.peer_addr().ok();
    if let Err(e) = serve(sh, sock, id)
        && !matches!(
            e.kind(),
            io::ErrorKind::UnexpectedEof
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::ConnectionReset
        )
    {
        tracing::info!(?peer, error = %e, "connection closed");
    }
    sh.conns.lock().remove(&id);
    if sh.acks.lock().remove(&id).is_some() {
        // A write waiting for this follower stops waiting.
        sh.acks_cv.notify_all();
        tracing::info!(connection = id, "a follower's position reports ended");
    }
    sh.counters.connections_active.fetch_sub(1, Relaxed);
}

/// Ends every connection and waits for their threads until the write
/// timeout; returns how many did not finish.
fn finish_connections(shared: &Shared, threads: Vec<JoinHandle<()>>) -> usize {
    // Stop reading on every connection: a thread blocked in read sees EOF,
    // one serving a request finishes it and answers first.
    for c in shared.conns.lock().values() {
        let _ = c.shutdown(std::net::Shutdown::Read);
    }
    shared.log_cv.notify_all();
    let deadline = Instant::now() + shared.cfg.write_timeout + Duration::from_secs(1);
    let mut stuck = 0usize;
    for t in threads {
        while !t.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if t.is_finished() {
            let _ = t.join();
        } else {
            stuck += 1;
        }
    }
    stuck
}

/// Fills the log from the journal since the last snapshot, so that a
/// follower that was behind when the writer restarted can catch up.
fn seed_log(store: &Store, log: &mut Log, cfg: &ServerConfig) {
    let after = store.open_report().snapshot_commit.unwrap_or(0);
    let kw = store.key_width();
    let last_seq = log.last_seq;
    // The block after the previous event: 0 before the first commit of a
    // store; unknown for the first event after a snapshot (what preceded it
    // is only in the snapshot), which is therefore not kept.
    let mut prev_after: Option<u64> = (after == 0).then_some(0);
    let dir = store.shared.dir.clone();
    let res = crate::journal::recovery::replay_readonly(&dir, after, &mut |id, payload| {
        if id > last_seq {
            return Ok(());
        }
        let (after_block, frame) = match crate::codec::decode(payload)? {
            crate::codec::Decoded::Block { block, body } => {
                let prev = prev_after.unwrap_or(0);
                (block, block_event(id, prev, block, body, kw)?)
            }
            crate::codec::Decoded::Rollback {
                target, current, ..
            } => {
                let mut f = Vec::new();
                p::put_u64s(
                    &mut f,
                    op::EV_ROLLBACK,
                    &[id, prev_after.unwrap_or(0), target, current],
                );
                (current, f)
            }
        };
        if prev_after.is_some() {
            push_event(
                log,
                cfg,
                Event {
                    seq: id,
                    frame: Arc::new(frame),
                },
            );
        }
        prev_after = Some(after_block);
        Ok(())
    });
    if let Err(e) = res {
        tracing::warn!(error = %e, "could not read the journal for the event history; followers start from now");
        log.events.clear();
        log.bytes = 0;
        return;
    }
    // Only a history that ends where the store is can be served.
    if log.events.back().is_some_and(|e| e.seq != log.last_seq) {
        log.events.clear();
        log.bytes = 0;
    }
}

/// The EV_BLOCK frame of journal commit `id`, a block of the store's
/// encoded `body`, that followed block `prev`.
fn block_event(id: u64, prev: u64, block: u64, body: &[u8], kw: usize) -> Result<Vec<u8>, String> {
    let mut f = Vec::with_capacity(body.len() + 40);
    let at = p::begin(&mut f, op::EV_BLOCK);
    f.extend_from_slice(&id.to_le_bytes());
    f.extend_from_slice(&prev.to_le_bytes());
    f.extend_from_slice(&block.to_le_bytes());
    let count_at = f.len();
    f.extend_from_slice(&0u32.to_le_bytes());
    let mut n = 0u32;
    for e in crate::codec::entries(body, kw) {
        let e = e?;
        f.extend_from_slice(e.key);
        f.extend_from_slice(&(e.value.len() as u16).to_le_bytes());
        f.extend_from_slice(e.value);
        n += 1;
    }
    f[count_at..count_at + 4].copy_from_slice(&n.to_le_bytes());
    p::end(&mut f, at);
    Ok(f)
}

fn push_event(log: &mut Log, cfg: &ServerConfig, ev: Event) {
    log.bytes += ev.frame.len();
    log.events.push_back(ev);
    while log.events.len() > cfg.log_events.max(1)
        || (log.bytes > cfg.log_bytes && log.events.len() > 1)
    {
        let old = log.events.pop_front().expect("non-empty");
        log.bytes -= old.frame.len();
    }
}

fn reject(sh: &Shared, sock: TcpStream) {
    let _ = sock.set_read_timeout(Some(sh.cfg.frame_timeout));
    let _ = sock.set_write_timeout(Some(sh.cfg.frame_timeout));
    let mut s = match wrap(sh, sock) {
        Ok(s) => s,
        Err(_) => return,
    };
    let mut out = Vec::new();
    p::put_error(
        &mut out,
        ErrorCode::TooManyConnections,
        &format!("the server allows {} connections", sh.cfg.max_connections),
    );
    let _ = s.write_all(&out).and_then(|_| s.flush());
    close_gracefully(&mut s);
}

/// Ends a connection after a final error frame so that the client gets to
/// read it: closing a socket with unread input would reset the connection
/// and could discard the frame on the client's side. Reads (and drops) what
/// the client still sends for a moment.
fn close_gracefully(s: &mut Stream) {
    let _ = s.flush();
    let _ = s.tcp().shutdown(std::net::Shutdown::Write);
    let _ = s.tcp().set_read_timeout(Some(Duration::from_millis(200)));
    let mut sink = [0u8; 4096];
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(500) {
        match s.tcp().read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
}

fn wrap(sh: &Shared, sock: TcpStream) -> io::Result<Stream> {
    Ok(match &sh.cfg.tls {
        None => Stream::Plain(sock),
        Some(cfg) => {
            let conn = rustls::ServerConnection::new(cfg.clone()).map_err(io::Error::other)?;
            Stream::TlsServer(Box::new(rustls::StreamOwned::new(conn, sock)))
        }
    })
}

struct Session {
    /// The connection's id (its key in `conns` and `acks`).
    id: u64,
    role: Option<Role>,
    kw: usize,
    out: Vec<u8>,
}

fn store_code(e: &StoreError) -> ErrorCode {
    match e {
        StoreError::KeyWidth { .. } => ErrorCode::KeyWidth,
        StoreError::BlockNotIncreasing { .. } => ErrorCode::BlockNotIncreasing,
        StoreError::RollbackOutsideWindow { .. } => ErrorCode::RollbackOutsideWindow,
        StoreError::ValueTooLarge { .. } => ErrorCode::ValueTooLarge,
        StoreError::Failed(_) => ErrorCode::StoreFailed,
        _ => ErrorCode::Internal,
    }
}

fn send_error(sh: &Shared, out: &mut Vec<u8>, code: ErrorCode, msg: &str) {
    sh.counters.error(code);
    tracing::warn!(code = %code, "request refused: {msg}");
    p::put_error(out, code, msg);
}

/// What to do after a frame.
enum Next {
    Continue,
    Close,
    Subscribe { from_seq: u64, from_block: u64 },
    Snapshot,
}

fn serve(sh: &Arc<Shared>, sock: TcpStream, id: u64) -> io::Result<()> {
    sock.set_nodelay(true)?;
    sock.set_write_timeout(Some(sh.cfg.write_timeout))?;
    sock.set_read_timeout(Some(sh.cfg.frame_timeout))?;
    let mut s = wrap(sh, sock)?;
    let mut ss = Session {
        id,
        role: None,
        kw: 0,
        out: Vec::with_capacity(64 << 10),
    };
    let mut inbuf = vec![0u8; 64 << 10];
    let lim = sh.cfg.limits;
    let (mut start, mut end) = (0usize, 0usize);
    // When the frame now in the buffer started arriving.
    let mut frame_started: Option<Instant> = None;
    loop {
        // Answer every complete frame in the buffer, then flush once.
        loop {
            match p::split_frame(&inbuf[start..end], lim.max_frame) {
                Err(e) => {
                    send_error(sh, &mut ss.out, e.code(), &e.to_string());
                    let _ = s.write_all(&ss.out).and_then(|_| s.flush());
                    close_gracefully(&mut s);
                    return Ok(());
                }
                Ok(None) => break,
                Ok(Some((ty, body, n))) => {
                    sh.counters.requests.fetch_add(1, Relaxed);
                    let next = handle(sh, &mut ss, ty, body);
                    start += n;
                    frame_started = None;
                    if !go_on(sh, &mut s, &mut ss, next)? {
                        return Ok(());
                    }
                }
            }
        }
        flush_replies(sh, &mut s, &mut ss)?;
        if sh.stopping.load(Relaxed) {
            return Ok(());
        }
        make_room(&mut inbuf, &mut start, &mut end, lim.max_frame);
        let timeout = read_timeout(sh, &ss, end, &mut frame_started);
        s.tcp().set_read_timeout(Some(timeout))?;
        match s.read(&mut inbuf[end..]) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                sh.counters.bytes_in.fetch_add(n as u64, Relaxed);
                if end == 0 && ss.role.is_some() {
                    frame_started = Some(Instant::now());
                }
                end += n;
            }
            Err(e) if is_timeout(&e) => {
                time_out(sh, &mut s, &mut ss, end, timeout);
                return Ok(());
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Tells the client which wait ran out, then closes.
fn time_out(sh: &Shared, s: &mut Stream, ss: &mut Session, end: usize, timeout: Duration) {
    let what = if ss.role.is_none() {
        "no complete handshake"
    } else if end == 0 {
        "idle"
    } else {
        "half-sent frame"
    };
    let msg = format!("timeout: {what} after {:?}", timeout);
    send_error(sh, &mut ss.out, ErrorCode::Timeout, &msg);
    let _ = s.write_all(&ss.out).and_then(|_| s.flush());
    close_gracefully(s);
}

/// Acts on what `handle` said after a frame. `Ok(false)`: the session is
/// over, closed or handed on to a subscription or a snapshot (both end it).
fn go_on(sh: &Shared, s: &mut Stream, ss: &mut Session, next: Next) -> io::Result<bool> {
    match next {
        Next::Continue => return Ok(true),
        Next::Close => {
            let _ = s.write_all(&ss.out).and_then(|_| s.flush());
            close_gracefully(s);
        }
        Next::Subscribe {
            from_seq,
            from_block,
        } => {
            s.write_all(&ss.out)?;
            s.flush()?;
            ss.out.clear();
            subscribe(sh, s, &mut ss.out, from_seq, from_block)?;
        }
        Next::Snapshot => {
            s.write_all(&ss.out)?;
            ss.out.clear();
            send_snapshot(sh, s, &mut ss.out)?;
            close_gracefully(s);
        }
    }
    Ok(false)
}

/// Sends the replies to the frames just answered, in one write.
fn flush_replies(sh: &Shared, s: &mut Stream, ss: &mut Session) -> io::Result<()> {
    if !ss.out.is_empty() {
        sh.counters
            .bytes_out
            .fetch_add(ss.out.len() as u64, Relaxed);
        s.write_all(&ss.out)?;
        s.flush()?;
        ss.out.clear();
        if ss.out.capacity() > 4 << 20 {
            ss.out.shrink_to(64 << 10);
        }
    }
    Ok(())
}

/// Makes room to read into: moves a partial frame to the front, grows for a
/// big one.
fn make_room(inbuf: &mut Vec<u8>, start: &mut usize, end: &mut usize, max_frame: u32) {
    if *start == *end {
        *start = 0;
        *end = 0;
        if inbuf.len() > 1 << 20 {
            // A big SET came and went: do not keep its buffer per connection.
            inbuf.truncate(64 << 10);
            inbuf.shrink_to_fit();
        }
    } else if *start > 0 {
        inbuf.copy_within(*start..*end, 0);
        *end -= *start;
        *start = 0;
    }
    if let Ok(Some(total)) = p::frame_len(&inbuf[..*end], max_frame)
        && total > inbuf.len()
    {
        inbuf.resize(total, 0);
    }
    if *end == inbuf.len() {
        let n = inbuf.len() * 2;
        inbuf.resize(n, 0);
    }
}

/// Idle between frames; a frame (or the handshake) once begun must arrive
/// within the frame timeout.
fn read_timeout(
    sh: &Shared,
    ss: &Session,
    end: usize,
    frame_started: &mut Option<Instant>,
) -> Duration {
    if ss.role.is_none() {
        sh.cfg.frame_timeout
    } else if end == 0 {
        sh.cfg.idle_timeout
    } else {
        let t0 = *frame_started.get_or_insert_with(Instant::now);
        sh.cfg
            .frame_timeout
            .saturating_sub(t0.elapsed())
            .max(Duration::from_millis(1))
    }
}

fn handle(sh: &Shared, ss: &mut Session, ty: u8, body: &[u8]) -> Next {
    let lim = sh.cfg.limits;
    if ss.role.is_none() && ty != op::HELLO {
        return handshake_required(sh, ss);
    }
    let frame = match p::parse(ty, body, ss.kw, &lim) {
        Ok(f) => f,
        Err(e) => {
            let fatal = e.is_fatal() || ss.role.is_none();
            send_error(sh, &mut ss.out, e.code(), &e.to_string());
            return if fatal { Next::Close } else { Next::Continue };
        }
    };
    let Some(store) = sh.store() else {
        send_error(
            sh,
            &mut ss.out,
            ErrorCode::ReplicaNotReady,
            "this follower has not reached the writer yet: its replica has no store",
        );
        return if ss.role.is_none() {
            Next::Close
        } else {
            Next::Continue
        };
    };
    let store = &*store;
    let Some(role) = ss.role else {
        return hello(sh, ss, store, frame);
    };
    request(sh, ss, store, role, ty, body, frame)
}

/// One request of a session past its handshake, by command.
fn request(
    sh: &Shared,
    ss: &mut Session,
    store: &Store,
    role: Role,
    ty: u8,
    body: &[u8],
    frame: Frame,
) -> Next {
    let replica = sh.is_replica();
    let need = |r: Role| -> bool { role == r && !replica };
    match frame {
        Frame::Hello { .. } => {
            send_error(sh, &mut ss.out, ErrorCode::Malformed, "HELLO sent twice");
        }
        Frame::Ping => p::put_empty(&mut ss.out, op::PONG),
        Frame::Get { key } => get(sh, ss, store, key),
        Frame::MultiGet { count, keys } => multi_get(sh, ss, store, count, keys),
        Frame::Status => {
            let (last_seq, current) = sh.position(store);
            p::put_u64s(
                &mut ss.out,
                op::STATUS_REPLY,
                &[current, store.oldest_rollback_block(), last_seq],
            );
        }
        Frame::Set { block, entries, .. } if need(Role::Write) => {
            set(sh, ss, store, body, block, entries);
        }
        Frame::Pop { block, key } if need(Role::Write) => pop(sh, ss, store, block, key),
        Frame::Rollback { target } if need(Role::Write) => rollback(sh, ss, store, target),
        Frame::Subscribe {
            from_seq,
            from_block,
        } if need(Role::Follow) => {
            return Next::Subscribe {
                from_seq,
                from_block,
            };
        }
        Frame::Snapshot if need(Role::Follow) => return Next::Snapshot,
        Frame::Ack { seq } if need(Role::Follow) => ack(sh, ss, seq),
        Frame::Set { .. }
        | Frame::Pop { .. }
        | Frame::Rollback { .. }
        | Frame::Subscribe { .. }
        | Frame::Ack { .. }
        | Frame::Snapshot => refuse(sh, ss, role, replica, ty),
        _ => {
            let msg = format!("{} is not a request", p::name_of(ty));
            send_error(sh, &mut ss.out, ErrorCode::UnknownType, &msg);
        }
    }
    Next::Continue
}

/// A request this session's role (or a replica) may not make.
fn refuse(sh: &Shared, ss: &mut Session, role: Role, replica: bool, ty: u8) {
    if replica {
        let msg = format!(
            "this server is a follower's read-only replica: {} goes to the writer",
            p::name_of(ty)
        );
        send_error(sh, &mut ss.out, ErrorCode::ReadOnlyReplica, &msg);
    } else {
        let msg = format!("a {role} session may not send {}", p::name_of(ty));
        send_error(sh, &mut ss.out, ErrorCode::Forbidden, &msg);
    }
}

/// A session's first frame was not HELLO: it is told so and closed.
fn handshake_required(sh: &Shared, ss: &mut Session) -> Next {
    send_error(
        sh,
        &mut ss.out,
        ErrorCode::HandshakeRequired,
        "the first frame must be HELLO",
    );
    Next::Close
}

/// The handshake: the session's first frame, which must be HELLO, fixes its
/// key width and role once the key width and credentials check out.
fn hello(sh: &Shared, ss: &mut Session, store: &Store, frame: Frame) -> Next {
    let lim = sh.cfg.limits;
    let Frame::Hello {
        key_width,
        role,
        user,
        token,
    } = frame
    else {
        return handshake_required(sh, ss);
    };
    let kw = store.key_width();
    if key_width != 0 && key_width as usize != kw {
        let e = ProtoError::KeyWidth {
            expected: kw,
            got: key_width as usize,
        };
        send_error(sh, &mut ss.out, ErrorCode::KeyWidth, &e.to_string());
        return Next::Close;
    }
    if let Some(auth) = &sh.cfg.auth
        && let Err((code, msg)) = auth.check(user, token, role)
    {
        tracing::warn!(user = %String::from_utf8_lossy(user), %role, "handshake refused: {msg}");
        send_error(sh, &mut ss.out, code, &msg);
        return Next::Close;
    }
    ss.role = Some(role);
    ss.kw = kw;
    let (last_seq, current) = sh.position(store);
    p::put_welcome(
        &mut ss.out,
        &Welcome {
            version: p::VERSION,
            key_width: kw as u16,
            shards: store.options().shards as u32,
            rollback_window: store.options().rollback_window,
            current,
            oldest: store.oldest_rollback_block(),
            last_seq,
            max_frame: lim.max_frame,
            max_batch: lim.max_batch,
        },
    );
    Next::Continue
}

fn get(sh: &Shared, ss: &mut Session, store: &Store, key: &[u8]) {
    sh.counters.gets.fetch_add(1, Relaxed);
    let out = &mut ss.out;
    if let Err(e) = store.get_with(key, |v| p::put_value(out, v)) {
        send_error(sh, &mut ss.out, store_code(&e), &e.to_string());
    }
}

fn multi_get(sh: &Shared, ss: &mut Session, store: &Store, count: u32, keys: &[u8]) {
    sh.counters.gets.fetch_add(count as u64, Relaxed);
    let out = &mut ss.out;
    let at = p::begin(out, op::VALUES);
    out.extend_from_slice(&count.to_le_bytes());
    for k in keys.chunks_exact(ss.kw) {
        let r = store.get_with(k, |v| {
            let v = v.unwrap_or(&[]);
            out.extend_from_slice(&(v.len() as u16).to_le_bytes());
            out.extend_from_slice(v);
        });
        if r.is_err() {
            // Unreachable: the parser checked every key's width.
            out.truncate(at);
            send_error(sh, out, ErrorCode::Internal, "multi_get failed");
            return;
        }
    }
    p::end(out, at);
}

/// A SET: journals and applies the block, publishing it to the followers as
/// soon as the journal has it.
fn set(sh: &Shared, ss: &mut Session, store: &Store, body: &[u8], block: u64, entries: &[u8]) {
    // The SET body (block, count, entries) is the event's body as is,
    // and its entries are the journal's form: applied in place.
    let set_body = body;
    let received = stages::enabled().then(Instant::now);
    let _w = sh.write.lock();
    let locked = stages::enabled().then(Instant::now);
    let prev = store.current_block();
    // Published the moment the journal has the block, before the
    // writer's tables are updated: a follower then applies it while
    // the writer does, not after (a follower's work per block equals
    // the writer's, so in series it could not keep within one block).
    // This server's own readers see the block (and STATUS its
    // position) only once `set_encoded_with` returns.
    let publish_block = |seq: u64| {
        if let (Some(r), Some(l)) = (received, locked) {
            stages::mark_at(seq, Stage::SetReceived, r);
            stages::mark_at(seq, Stage::WriterLocked, l);
        }
        let mut f = Vec::with_capacity(set_body.len() + 21);
        p::put_ev_block(&mut f, seq, prev, set_body);
        publish(sh, seq, block, f, false);
        stages::mark(seq, Stage::Published);
    };
    match store.set_encoded_with(block, entries, &publish_block) {
        Ok(seq) => {
            sh.log.lock().visible = (seq, block);
            sh.counters.blocks.fetch_add(1, Relaxed);
            wait_for_followers(sh, seq);
            p::put_u64s(&mut ss.out, op::DONE, &[block, seq]);
        }
        Err(e) => send_error(sh, &mut ss.out, store_code(&e), &e.to_string()),
    }
}

fn pop(sh: &Shared, ss: &mut Session, store: &Store, block: u64, key: &[u8]) {
    let _w = sh.write.lock();
    let prev = store.current_block();
    match store.pop(block, key) {
        Ok(old) => {
            let seq = store.last_commit();
            let mut b = Vec::new();
            b.extend_from_slice(&block.to_le_bytes());
            b.extend_from_slice(&1u32.to_le_bytes());
            b.extend_from_slice(key);
            b.extend_from_slice(&0u16.to_le_bytes());
            let mut f = Vec::new();
            p::put_ev_block(&mut f, seq, prev, &b);
            publish(sh, seq, block, f, true);
            sh.counters.blocks.fetch_add(1, Relaxed);
            wait_for_followers(sh, seq);
            p::put_popped(&mut ss.out, block, seq, old.as_deref());
        }
        Err(e) => send_error(sh, &mut ss.out, store_code(&e), &e.to_string()),
    }
}

fn rollback(sh: &Shared, ss: &mut Session, store: &Store, target: u64) {
    let _w = sh.write.lock();
    let prev = store.current_block();
    let seq_before = store.last_commit();
    match store.rollback(target) {
        Ok(()) => {
            let now = store.current_block();
            let seq = store.last_commit();
            if seq != seq_before {
                let mut f = Vec::new();
                p::put_u64s(&mut f, op::EV_ROLLBACK, &[seq, prev, target, now]);
                publish(sh, seq, now, f, true);
                wait_for_followers(sh, seq);
            }
            p::put_u64s(&mut ss.out, op::DONE, &[now, seq]);
        }
        Err(e) => send_error(sh, &mut ss.out, store_code(&e), &e.to_string()),
    }
}

/// A follower's ACK: records how far it has applied, and marks it in sync
/// (so that writes wait for it) once it is within `max_follower_lag`.
fn ack(sh: &Shared, ss: &mut Session, seq: u64) {
    let (last, visible) = {
        let l = sh.log.lock();
        (l.last_seq, l.visible)
    };
    if seq > last {
        let msg = format!(
            "ACK of event {seq}, but the writer's last event is {last}: this follower does not follow this writer's history"
        );
        send_error(sh, &mut ss.out, ErrorCode::HistoryDiverged, &msg);
        return;
    }
    let bound = sh.cfg.max_follower_lag.unwrap_or(0);
    let mut acks = sh.acks.lock();
    let f = acks.entry(ss.id).or_insert(Acker {
        seq: 0,
        in_sync: false,
    });
    f.seq = f.seq.max(seq);
    if !f.in_sync && last - f.seq <= bound {
        f.in_sync = true;
        if sh.cfg.max_follower_lag.is_some() {
            tracing::info!(
                connection = ss.id,
                seq = f.seq,
                "a follower is in sync: writes wait for it"
            );
        }
    }
    drop(acks);
    sh.acks_cv.notify_all();
    p::put_u64s(&mut ss.out, op::DONE, &[visible.1, visible.0]);
}

/// With `max_follower_lag` K, holds the reply to the write that made event
/// `seq` (the caller holds the writer lock, so the next write waits too)
/// until every follower in sync has applied event `seq - K`. A follower
/// that has not within `follower_wait` stops holding writes back (logged,
/// counted) until it is within K again: a stalled follower costs the writer
/// one wait, not one per block. A follower that disconnects is forgotten at
/// once.
fn wait_for_followers(sh: &Shared, seq: u64) {
    let Some(k) = sh.cfg.max_follower_lag else {
        return;
    };
    let need = seq.saturating_sub(k);
    let behind = |a: &HashMap<u64, Acker>| a.values().any(|f| f.in_sync && f.seq < need);
    let mut acks = sh.acks.lock();
    if !behind(&acks) {
        return;
    }
    let t0 = Instant::now();
    let deadline = t0 + sh.cfg.follower_wait;
    sh.counters.follower_waits.fetch_add(1, Relaxed);
    while behind(&acks) && !sh.stopping.load(Relaxed) {
        if sh.acks_cv.wait_until(&mut acks, deadline).timed_out() && behind(&acks) {
            for (id, f) in acks.iter_mut().filter(|(_, f)| f.in_sync && f.seq < need) {
                f.in_sync = false;
                sh.counters.follower_timeouts.fetch_add(1, Relaxed);
                tracing::warn!(
                    connection = id,
                    applied = f.seq,
                    needed = need,
                    wait = ?sh.cfg.follower_wait,
                    "a follower fell more than --max-follower-lag behind: writes no longer wait for it until it catches up"
                );
            }
            break;
        }
    }
    sh.counters
        .follower_wait_nanos
        .fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
}

/// Appends an event to the history and wakes the subscribers. `applied`:
/// this server's readers already see it (else the caller sets `visible`
/// once they do).
fn publish(sh: &Shared, seq: u64, after: u64, frame: Vec<u8>, applied: bool) {
    let mut l = sh.log.lock();
    l.last_seq = seq;
    l.current = after;
    if applied {
        l.visible = (seq, after);
    }
    push_event(
        &mut l,
        &sh.cfg,
        Event {
            seq,
            frame: Arc::new(frame),
        },
    );
    drop(l);
    sh.log_cv.notify_all();
}

/// Streams events after `from_seq` until the client goes away or the server
/// stops. The client's claimed position is checked against the history.
fn subscribe(
    sh: &Shared,
    s: &mut Stream,
    out: &mut Vec<u8>,
    from_seq: u64,
    from_block: u64,
) -> io::Result<()> {
    let check = check_position(&sh.log.lock(), from_seq, from_block);
    if let Err((code, msg)) = check {
        send_error(sh, out, code, &msg);
        s.write_all(out)?;
        return s.flush();
    }
    sh.counters.subscribers_active.fetch_add(1, Relaxed);
    struct Dec<'a>(&'a AtomicUsize);
    impl Drop for Dec<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Relaxed);
        }
    }
    let _dec = Dec(&sh.counters.subscribers_active);
    tracing::info!(from_seq, from_block, "subscription started");
    stream_events(sh, s, out, from_seq)
}

/// Whether a follower at event `from_seq` with block `from_block` can be
/// sent the events after it: it must be on this writer's history, and the
/// history must still hold the next event.
fn check_position(l: &Log, from_seq: u64, from_block: u64) -> Result<(), (ErrorCode, String)> {
    if from_seq > l.last_seq {
        Err((
            ErrorCode::HistoryDiverged,
            format!(
                "the follower is at event {from_seq} (block {from_block}) but the writer's history ends at event {} (block {}): the follower does not follow this writer's history (a writer that lost blocks in a crash?)",
                l.last_seq, l.current
            ),
        ))
    } else if from_seq == l.last_seq {
        if from_block == l.current {
            Ok(())
        } else {
            Err((
                ErrorCode::HistoryDiverged,
                format!(
                    "the follower is at event {from_seq} with block {from_block}, the writer at the same event has block {}",
                    l.current
                ),
            ))
        }
    } else if from_seq + 1 < l.first_seq() {
        Err((
            ErrorCode::HistoryUnavailable,
            format!(
                "the follower needs events from {} on, but the writer keeps events {}..={} only; it must fetch a snapshot (SNAPSHOT)",
                from_seq + 1,
                l.first_seq(),
                l.last_seq
            ),
        ))
    } else {
        let next = &l.events[(from_seq + 1 - l.first_seq()) as usize];
        let prev = p::split_frame(&next.frame, u32::MAX)
            .ok()
            .flatten()
            .and_then(|(_, b, _)| b.get(8..16))
            .map(|b| u64::from_le_bytes(b.try_into().expect("8")));
        if prev == Some(from_block) {
            Ok(())
        } else {
            Err((
                ErrorCode::HistoryDiverged,
                format!(
                    "the follower is at event {from_seq} with block {from_block}, the writer's event {} follows block {}",
                    from_seq + 1,
                    prev.unwrap_or(0)
                ),
            ))
        }
    }
}

/// Sends the events after `sent`, in batches, and a heartbeat when there are
/// none for a while, until the client goes away or the server stops.
fn stream_events(sh: &Shared, s: &mut Stream, out: &mut Vec<u8>, mut sent: u64) -> io::Result<()> {
    let mut batch: Vec<(u64, Arc<Vec<u8>>)> = Vec::new();
    loop {
        {
            let mut l = sh.log.lock();
            loop {
                if sh.stopping.load(Relaxed) {
                    return Ok(());
                }
                if l.last_seq > sent {
                    break;
                }
                if sh.log_cv.wait_for(&mut l, sh.cfg.heartbeat).timed_out() {
                    out.clear();
                    p::put_u64s(out, op::HEARTBEAT, &[l.last_seq, l.current]);
                    break;
                }
            }
            if l.last_seq > sent {
                if sent + 1 < l.first_seq() {
                    let msg = format!(
                        "this subscriber fell behind: it needs event {} but the writer keeps {}..={} only",
                        sent + 1,
                        l.first_seq(),
                        l.last_seq
                    );
                    drop(l);
                    out.clear();
                    send_error(sh, out, ErrorCode::HistoryUnavailable, &msg);
                    s.write_all(out)?;
                    return s.flush();
                }
                let first = (sent + 1 - l.first_seq()) as usize;
                batch.extend(
                    l.events
                        .iter()
                        .skip(first)
                        .take(64)
                        .map(|e| (e.seq, e.frame.clone())),
                );
                sent = l
                    .events
                    .get(first + batch.len() - 1)
                    .map_or(sent, |e| e.seq);
            }
        }
        // A client that stops reading blocks this write until the write
        // timeout, then the subscription ends.
        if !out.is_empty() {
            s.write_all(out)?;
            out.clear();
        }
        for (seq, f) in batch.drain(..) {
            stages::mark(seq, Stage::SubscriberTook);
            sh.counters.bytes_out.fetch_add(f.len() as u64, Relaxed);
            sh.counters.events_sent.fetch_add(1, Relaxed);
            s.write_all(&f)?;
            stages::mark(seq, Stage::SubscriberWritten);
        }
        s.flush()?;
    }
}

/// Bytes of file data per SNAP_DATA frame.
const SNAP_CHUNK: usize = 1 << 20;

/// A file of the copy: its name, its bytes from the start, and its length.
type CopyFile = (String, Box<dyn Read + Send>, u64);

/// The files that make up the store: `STORE`, `MANIFEST`, the snapshots and
/// the journal segments (not the lock, spare or temporary files), each
/// opened with its length at that moment. An open file stays readable if the
/// store prunes it meanwhile. The manifest is rewritten in place (two slots,
/// one inode), so its bytes are read before the listing and again after it:
/// if they changed, files the listed manifest needs may have been pruned, or
/// the new one may name files the listing missed, so the listing starts
/// over; the copy carries the bytes read, never the live file.
fn open_store_files(dir: &std::path::Path) -> io::Result<Vec<CopyFile>> {
    let wanted = |n: &str| {
        n == crate::meta::META_FILE
            || (n.starts_with("snapshot-") && n.ends_with(".snap"))
            || (n.starts_with("journal-") && n.ends_with(".log"))
    };
    let manifest_path = dir.join(memfs_journal::manifest::MANIFEST_FILE);
    let read_manifest = || match std::fs::read(&manifest_path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    };
    for _ in 0..20 {
        let manifest = read_manifest()?;
        let mut names: Vec<String> = std::fs::read_dir(dir)?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| wanted(n))
            .collect();
        names.sort();
        let mut files: Vec<CopyFile> = Vec::with_capacity(names.len() + 1);
        for n in names {
            match std::fs::File::open(dir.join(&n)) {
                Ok(f) => {
                    let len = f.metadata()?.len();
                    files.push((n, Box::new(f), len));
                }
                // Pruned after the listing: the manifest held does not need it.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        if read_manifest()? == manifest {
            if let Some(m) = manifest {
                let len = m.len() as u64;
                files.push((
                    memfs_journal::manifest::MANIFEST_FILE.to_string(),
                    Box::new(io::Cursor::new(m)),
                    len,
                ));
            }
            return Ok(files);
        }
    }
    Err(io::Error::other(
        "the store kept publishing snapshots while its files were being listed",
    ))
}

/// Streams a copy of the store's files (a snapshot and the journal after
/// it) in chunks: SNAP_FILE, SNAP_DATA*, ..., SNAP_END. Memory stays at one
/// chunk whatever the store's size; the writer is not paused. The copy is
/// what a crash at the moment of the listing would have left, so opening
/// it recovers a prefix of the writer's history, and the follower subscribes
/// from there.
fn send_snapshot(sh: &Shared, s: &mut Stream, out: &mut Vec<u8>) -> io::Result<()> {
    let Backing::Owned(store) = &sh.store else {
        unreachable!("a replica refuses SNAPSHOT before this");
    };
    let dir = store.shared.dir.clone();
    // Make the journal files hold every event published so far (a non-sync
    // store may still buffer them), so that the copy ends no earlier than
    // now and the history kept in memory covers what follows.
    let files = match store
        .sync()
        .map_err(io::Error::other)
        .and_then(|()| open_store_files(&dir))
    {
        Ok(f) => f,
        Err(e) => {
            send_error(sh, out, ErrorCode::Internal, &format!("snapshot: {e}"));
            s.write_all(out)?;
            return s.flush();
        }
    };
    tracing::info!(
        files = files.len(),
        "sending a snapshot of the store's files"
    );
    let mut buf = vec![0u8; SNAP_CHUNK];
    let mut total = 0u64;
    let nfiles = files.len() as u32;
    for (name, mut f, size) in files {
        out.clear();
        p::put_snap_file(out, size, &name);
        s.write_all(out)?;
        let mut left = size;
        while left > 0 {
            let n = (left as usize).min(SNAP_CHUNK);
            f.read_exact(&mut buf[..n])?;
            let mut hdr = Vec::with_capacity(p::LEN_BYTES + 1);
            let at = p::begin(&mut hdr, op::SNAP_DATA);
            hdr[at..at + p::LEN_BYTES].copy_from_slice(&(n as u32 + 1).to_le_bytes());
            s.write_all(&hdr)?;
            s.write_all(&buf[..n])?;
            sh.counters
                .bytes_out
                .fetch_add((n + hdr.len()) as u64, Relaxed);
            left -= n as u64;
        }
        total += size;
    }
    out.clear();
    p::put_snap_end(out, nfiles, total);
    s.write_all(out)?;
    out.clear();
    s.flush()
}

fn metrics_text(sh: &Shared) -> String {
    let Some(store) = sh.store() else {
        return "# HELP memfs_store_healthy 1 when the store accepts writes.\n# TYPE memfs_store_healthy gauge\nmemfs_store_healthy 0\n".into();
    };
    let m = store.metrics();
    let oldest = store.oldest_rollback_block();
    let (last_seq, _) = sh.position(&store);
    drop(store);
    let c = &sh.counters;
    let mut t = String::new();
    store_activity(&mut t, &m, oldest);
    store_durability(&mut t, &m);
    store_contents(&mut t, &m);
    connection_metrics(&mut t, c);
    follower_metrics(&mut t, sh);
    traffic_metrics(&mut t, c);
    event_metrics(&mut t, sh, last_seq);
    error_metrics(&mut t, c);
    t
}

/// One metric in Prometheus text: its HELP and TYPE lines, then its value.
fn metric(t: &mut String, name: &str, kind: &str, help: &str, v: f64) {
    use std::fmt::Write as _;
    let _ = writeln!(
        t,
        "# HELP memfs_store_{name} {help}\n# TYPE memfs_store_{name} {kind}\nmemfs_store_{name} {v}"
    );
}

fn store_activity(t: &mut String, m: &MetricsSnapshot, oldest: u64) {
    metric(t, "block", "gauge", "Current block.", m.block as f64);
    metric(
        t,
        "oldest_rollback_block",
        "gauge",
        "Oldest block a rollback can reach.",
        oldest as f64,
    );
    metric(
        t,
        "blocks_total",
        "counter",
        "Blocks applied since start.",
        m.blocks as f64,
    );
    metric(
        t,
        "ops_total",
        "counter",
        "Operations applied since start.",
        m.ops as f64,
    );
    metric(
        t,
        "rollbacks_total",
        "counter",
        "Rollbacks since start.",
        m.rollbacks as f64,
    );
    metric(
        t,
        "block_latency_p50_seconds",
        "gauge",
        "Block latency, median.",
        m.latency_p50_us as f64 / 1e6,
    );
    metric(
        t,
        "block_latency_p99_seconds",
        "gauge",
        "Block latency, 99th percentile.",
        m.latency_p99_us as f64 / 1e6,
    );
}

fn store_durability(t: &mut String, m: &MetricsSnapshot) {
    metric(
        t,
        "pending_blocks",
        "gauge",
        "Blocks committed but not yet durable.",
        m.pending_blocks as f64,
    );
    metric(
        t,
        "durable_commit",
        "gauge",
        "Last durable journal commit.",
        m.durable_commit as f64,
    );
    metric(
        t,
        "fsyncs_total",
        "counter",
        "fsync calls.",
        m.fsyncs as f64,
    );
    metric(
        t,
        "journal_bytes",
        "gauge",
        "Journal bytes on disk.",
        m.journal_bytes as f64,
    );
    metric(
        t,
        "snapshots_total",
        "counter",
        "Snapshots written.",
        m.snapshots_written as f64,
    );
}

fn store_contents(t: &mut String, m: &MetricsSnapshot) {
    metric(t, "entries", "gauge", "Live keys.", m.entries as f64);
    metric(
        t,
        "table_bytes",
        "gauge",
        "Memory of the tables.",
        m.table_bytes as f64,
    );
    metric(
        t,
        "window_blocks",
        "gauge",
        "Blocks in the rollback window.",
        m.window_blocks as f64,
    );
    metric(
        t,
        "healthy",
        "gauge",
        "1 when the store accepts writes.",
        if m.health == "ok" { 1.0 } else { 0.0 },
    );
}

fn connection_metrics(t: &mut String, c: &Counters) {
    metric(
        t,
        "connections_active",
        "gauge",
        "Open connections.",
        c.connections_active.load(Relaxed) as f64,
    );
    metric(
        t,
        "connections_total",
        "counter",
        "Connections accepted.",
        c.connections_total.load(Relaxed) as f64,
    );
    metric(
        t,
        "connections_rejected_total",
        "counter",
        "Connections refused at the limit.",
        c.connections_rejected.load(Relaxed) as f64,
    );
    metric(
        t,
        "subscribers_active",
        "gauge",
        "Open subscriptions.",
        c.subscribers_active.load(Relaxed) as f64,
    );
}

fn follower_metrics(t: &mut String, sh: &Shared) {
    let c = &sh.counters;
    {
        let a = sh.acks.lock();
        metric(
            t,
            "followers_reporting",
            "gauge",
            "Followers that report their position (ACK).",
            a.len() as f64,
        );
        metric(
            t,
            "followers_in_sync",
            "gauge",
            "Followers within --max-follower-lag, whom writes wait for.",
            a.values().filter(|f| f.in_sync).count() as f64,
        );
        metric(
            t,
            "follower_applied_seq_min",
            "gauge",
            "Lowest event a reporting follower has applied (0 with none).",
            a.values().map(|f| f.seq).min().unwrap_or(0) as f64,
        );
    }
    metric(
        t,
        "follower_waits_total",
        "counter",
        "Writes whose reply waited for a follower.",
        c.follower_waits.load(Relaxed) as f64,
    );
    metric(
        t,
        "follower_wait_seconds_total",
        "counter",
        "Time writes waited for followers.",
        c.follower_wait_nanos.load(Relaxed) as f64 / 1e9,
    );
    metric(
        t,
        "follower_timeouts_total",
        "counter",
        "Followers writes stopped waiting for (--follower-wait ran out).",
        c.follower_timeouts.load(Relaxed) as f64,
    );
}

fn traffic_metrics(t: &mut String, c: &Counters) {
    metric(
        t,
        "requests_total",
        "counter",
        "Frames received.",
        c.requests.load(Relaxed) as f64,
    );
    metric(
        t,
        "gets_total",
        "counter",
        "Keys read.",
        c.gets.load(Relaxed) as f64,
    );
    metric(
        t,
        "events_sent_total",
        "counter",
        "Events sent to subscribers.",
        c.events_sent.load(Relaxed) as f64,
    );
    metric(
        t,
        "bytes_in_total",
        "counter",
        "Bytes received.",
        c.bytes_in.load(Relaxed) as f64,
    );
    metric(
        t,
        "bytes_out_total",
        "counter",
        "Bytes sent.",
        c.bytes_out.load(Relaxed) as f64,
    );
}

fn event_metrics(t: &mut String, sh: &Shared, last_seq: u64) {
    {
        let l = sh.log.lock();
        metric(
            t,
            "event_seq",
            "gauge",
            "Sequence number of the last event.",
            last_seq as f64,
        );
        metric(
            t,
            "event_history_first",
            "gauge",
            "First event kept for subscribers.",
            l.first_seq() as f64,
        );
    }
}

fn error_metrics(t: &mut String, c: &Counters) {
    use std::fmt::Write as _;
    let _ = writeln!(
        t,
        "# HELP memfs_store_errors_total Error frames sent, by code.\n# TYPE memfs_store_errors_total counter"
    );
    for code in ErrorCode::ALL {
        let _ = writeln!(
            t,
            "memfs_store_errors_total{{code=\"{}\"}} {}",
            code.name(),
            c.errors(code)
        );
    }
}

/// Serves `GET /metrics` (Prometheus text) and `GET /health` on `addr`
/// until the server stops. Returns the bound address.
pub fn serve_metrics(
    handle: ShutdownHandle,
    addr: &str,
) -> Result<(SocketAddr, JoinHandle<()>), ServerError> {
    let l = TcpListener::bind(addr).map_err(|source| ServerError::Bind {
        addr: addr.to_string(),
        source,
    })?;
    let local = l.local_addr()?;
    l.set_nonblocking(true)?;
    let t = std::thread::Builder::new()
        .name("store-metrics".into())
        .spawn(move || {
            while !handle.shared.stopping.load(Relaxed) {
                match l.accept() {
                    Ok((s, _)) => {
                        let _ = http_reply(&handle, s);
                    }
                    // The listener is non-blocking so that the loop sees a stop.
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        })?;
    Ok((local, t))
}

fn http_reply(h: &ShutdownHandle, mut s: TcpStream) -> io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut buf = [0u8; 2048];
    let mut n = 0;
    while n < buf.len() {
        let k = s.read(&mut buf[n..])?;
        if k == 0 {
            break;
        }
        n += k;
        if buf[..n].windows(4).any(|w| w == b"\r\n\r\n")
            || buf[..n].windows(2).any(|w| w == b"\n\n")
        {
            break;
        }
    }
    let req = String::from_utf8_lossy(&buf[..n]);
    let path = req.split_whitespace().nth(1).unwrap_or("");
    let (status, body) = match path {
        "/metrics" => ("200 OK", metrics_text(&h.shared)),
        "/health" | "/healthz" => {
            let health = h.health();
            if health == "ok" {
                ("200 OK", "ok\n".to_string())
            } else {
                ("503 Service Unavailable", format!("{health}\n"))
            }
        }
        _ => ("404 Not Found", "try /metrics or /health\n".to_string()),
    };
    write!(
        s,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    s.flush()
}
