//! A blocking client of the store server, and a pool of them.
//!
//! Each [`Client`] owns one connection and two buffers it reuses for every
//! request: a get encodes into the send buffer, reads the reply into the
//! receive buffer and copies the value into the caller's buffer, so a get
//! allocates nothing once the buffers have grown. Reads are retried once on
//! a fresh connection after an I/O failure; writes are not retried (a block
//! may have been applied before the connection broke: the caller decides),
//! but the next call reconnects.

use super::protocol::{self as p, ErrorCode, Frame, Limits, Role, Welcome, op};
use super::{Stream, TlsError, is_timeout, server_name};
use parking_lot::Mutex;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::ops::{Deref, DerefMut, Range};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone)]
pub struct ClientConfig {
    /// `HOST:PORT`.
    pub addr: String,
    pub user: String,
    pub token: String,
    pub role: Role,
    /// TLS with these roots; plain TCP when `None`.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// Name checked against the certificate (default: the host of `addr`).
    pub server_name: Option<String>,
    /// Refuse a server whose keys are not this wide (0: accept any).
    pub key_width: u16,
    pub connect_timeout: Duration,
    /// Longest wait for a reply (and, subscribed, for any frame).
    pub io_timeout: Duration,
}

impl ClientConfig {
    pub fn new(addr: impl Into<String>, role: Role) -> ClientConfig {
        ClientConfig {
            addr: addr.into(),
            user: String::new(),
            token: String::new(),
            role,
            tls: None,
            server_name: None,
            key_width: 0,
            connect_timeout: Duration::from_secs(5),
            io_timeout: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: io::Error,
    },
    #[error("connection to {addr} failed: {source}")]
    Io {
        addr: String,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("the server refused ({code}): {message}")]
    Server { code: ErrorCode, message: String },
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("{path}: {source}")]
    File {
        path: String,
        #[source]
        source: io::Error,
    },
}

impl ClientError {
    /// The server's error code, for a refusal.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Server { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// A failure of the connection rather than of the request (a server
    /// that timed the idle connection out counts: it closed it).
    fn is_io(&self) -> bool {
        matches!(self, ClientError::Io { .. } | ClientError::Connect { .. })
            || matches!(
                self,
                ClientError::Server {
                    code: ErrorCode::Timeout | ErrorCode::ShuttingDown,
                    ..
                }
            )
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// Server status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub current: u64,
    pub oldest: u64,
    pub last_seq: u64,
}

/// One connection to a server.
pub struct Client {
    cfg: Arc<ClientConfig>,
    s: Option<Stream>,
    welcome: Welcome,
    out: Vec<u8>,
    inbuf: Vec<u8>,
    start: usize,
    end: usize,
}

const PIPELINE_CHUNK: usize = 128;

impl Client {
    pub fn connect(cfg: ClientConfig) -> Result<Client> {
        let mut c = Client {
            cfg: Arc::new(cfg),
            s: None,
            welcome: Welcome::default(),
            out: Vec::with_capacity(4096),
            inbuf: vec![0u8; 64 << 10],
            start: 0,
            end: 0,
        };
        c.reconnect()?;
        Ok(c)
    }

    /// What the server said at the last handshake.
    pub fn welcome(&self) -> &Welcome {
        &self.welcome
    }

    pub fn is_connected(&self) -> bool {
        self.s.is_some()
    }

    /// A second handle on the socket, to shut it down from another thread
    /// (which makes a call blocked on it return an error).
    pub fn socket(&self) -> Option<TcpStream> {
        self.s.as_ref().and_then(|s| s.tcp().try_clone().ok())
    }

    fn io(&self, source: io::Error) -> ClientError {
        ClientError::Io {
            addr: self.cfg.addr.clone(),
            source,
        }
    }

    /// Drops the connection (if any) and makes a new one.
    pub fn reconnect(&mut self) -> Result<()> {
        self.s = None;
        self.welcome = Welcome::default();
        self.start = 0;
        self.end = 0;
        let cfg = self.cfg.clone();
        let s = dial(&cfg)?;
        self.s = Some(s);
        self.out.clear();
        p::put_hello(
            &mut self.out,
            cfg.key_width,
            cfg.role,
            cfg.user.as_bytes(),
            cfg.token.as_bytes(),
        );
        let r = self.send().and_then(|_| self.recv());
        let (ty, body) = match r {
            Ok(x) => x,
            Err(e) => {
                self.s = None;
                return Err(e);
            }
        };
        match p::parse(ty, &self.inbuf[body], 0, &Limits::default()) {
            Ok(Frame::Welcome(w)) => self.welcome = w,
            other => {
                self.s = None;
                return Err(ClientError::Protocol(format!(
                    "expected WELCOME, got {other:?}"
                )));
            }
        }
        if cfg.key_width != 0 && self.welcome.key_width != cfg.key_width {
            self.s = None;
            return Err(ClientError::Protocol(format!(
                "the server's keys are {} bytes, not {}",
                self.welcome.key_width, cfg.key_width
            )));
        }
        Ok(())
    }

    fn send(&mut self) -> Result<()> {
        let Some(s) = self.s.as_mut() else {
            return Err(self.io(io::Error::new(io::ErrorKind::NotConnected, "not connected")));
        };
        let r = s.write_all(&self.out).and_then(|_| s.flush());
        self.out.clear();
        r.map_err(|e| {
            self.s = None;
            self.io(e)
        })
    }

    /// Reads one frame; returns its type and the body's place in `inbuf`
    /// (valid until the next call). An ERROR frame becomes `Err(Server)`.
    fn recv(&mut self) -> Result<(u8, Range<usize>)> {
        let max = if self.welcome.max_frame == 0 {
            p::DEFAULT_MAX_FRAME
        } else {
            self.welcome.max_frame
        }
        // Replies may be larger than requests (a multi_get); the server
        // bounds them by the batch limit and the value size.
        .max(p::DEFAULT_MAX_FRAME);
        loop {
            match p::split_frame(&self.inbuf[self.start..self.end], max) {
                Err(e) => {
                    self.s = None;
                    return Err(ClientError::Protocol(e.to_string()));
                }
                Ok(Some((ty, _, n))) => {
                    let body = self.start + p::LEN_BYTES + 1..self.start + n;
                    self.start += n;
                    if ty == op::ERROR {
                        return Err(self.server_error(body));
                    }
                    return Ok((ty, body));
                }
                Ok(None) => {}
            }
            if self.start == self.end {
                self.start = 0;
                self.end = 0;
            } else if self.start > 0 {
                self.inbuf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            if let Ok(Some(total)) = p::frame_len(&self.inbuf[..self.end], max)
                && total > self.inbuf.len()
            {
                self.inbuf.resize(total, 0);
            }
            let Some(s) = self.s.as_mut() else {
                return Err(self.io(io::Error::new(io::ErrorKind::NotConnected, "not connected")));
            };
            match s.read(&mut self.inbuf[self.end..]) {
                Ok(0) => {
                    self.s = None;
                    return Err(self.io(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the server closed the connection",
                    )));
                }
                Ok(n) => self.end += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.s = None;
                    let e = if is_timeout(&e) {
                        io::Error::new(io::ErrorKind::TimedOut, "no reply in time")
                    } else {
                        e
                    };
                    return Err(self.io(e));
                }
            }
        }
    }

    /// The error an ERROR frame (its body at `body` in `inbuf`) reports;
    /// forgets the connection when the server closes it after this error.
    fn server_error(&mut self, body: Range<usize>) -> ClientError {
        let lim = Limits::default();
        match p::parse(op::ERROR, &self.inbuf[body], 0, &lim) {
            Ok(Frame::Error { code, message }) => {
                let code = ErrorCode::from_u16(code);
                // Errors after which the server closes the connection.
                let closes = self.welcome.version == 0
                    || matches!(
                        code,
                        ErrorCode::Timeout
                            | ErrorCode::FrameTooLarge
                            | ErrorCode::HistoryDiverged
                            | ErrorCode::HistoryUnavailable
                            | ErrorCode::TooManyConnections
                            | ErrorCode::HandshakeRequired
                    );
                if closes {
                    self.s = None;
                }
                ClientError::Server {
                    code,
                    message: String::from_utf8_lossy(message).into_owned(),
                }
            }
            _ => ClientError::Protocol("malformed ERROR frame".into()),
        }
    }

    fn ensure(&mut self) -> Result<()> {
        if self.s.is_none() {
            self.reconnect()?;
        }
        Ok(())
    }

    /// Before a write (which is not retried): whether the server has already
    /// closed this connection (idle timeout, shutdown). Nothing should be
    /// waiting to be read between requests, so any byte or EOF means the
    /// connection is gone. One non-blocking peek.
    fn ensure_fresh(&mut self) -> Result<()> {
        if let Some(s) = &self.s {
            let t = s.tcp();
            let mut b = [0u8; 1];
            let stale = t.set_nonblocking(true).is_err()
                || !matches!(t.peek(&mut b), Err(ref e) if e.kind() == io::ErrorKind::WouldBlock)
                || t.set_nonblocking(false).is_err()
                || self.start != self.end;
            if stale {
                self.s = None;
            }
        }
        self.ensure()
    }

    /// Runs an idempotent request, once more on a new connection if the
    /// connection failed.
    fn read_retry<T>(&mut self, mut f: impl FnMut(&mut Client) -> Result<T>) -> Result<T> {
        self.ensure()?;
        match f(self) {
            Err(e) if e.is_io() => {
                tracing::debug!(error = %e, "reconnecting");
                self.reconnect()?;
                f(self)
            }
            r => r,
        }
    }

    fn check_key(&self, key: &[u8]) -> Result<()> {
        let kw = self.welcome.key_width as usize;
        if key.len() != kw {
            return Err(ClientError::Invalid(format!(
                "key is {} bytes but the store's keys are {kw} bytes",
                key.len()
            )));
        }
        Ok(())
    }

    fn unexpected(&self, ty: u8, want: &str) -> ClientError {
        ClientError::Protocol(format!("expected {want}, got {}", p::name_of(ty)))
    }

    /// Reads `key` into `out`; returns whether it is present. Allocates
    /// nothing once the buffers are large enough.
    pub fn get_into(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        self.check_key(key)?;
        self.read_retry(|c| {
            p::put_get(&mut c.out, key);
            c.send()?;
            let (ty, body) = c.recv()?;
            if ty != op::VALUE {
                return Err(c.unexpected(ty, "VALUE"));
            }
            out.clear();
            out.extend_from_slice(&c.inbuf[body]);
            Ok(!out.is_empty())
        })
    }

    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut v = Vec::new();
        Ok(self.get_into(key, &mut v)?.then_some(v))
    }

    /// Pipelined gets: sends the requests in chunks without waiting, then
    /// reads the replies; `f(i, value)` sees each in order.
    pub fn get_pipelined<K: AsRef<[u8]>>(
        &mut self,
        keys: &[K],
        mut f: impl FnMut(usize, Option<&[u8]>),
    ) -> Result<()> {
        for k in keys {
            self.check_key(k.as_ref())?;
        }
        for (ci, chunk) in keys.chunks(PIPELINE_CHUNK).enumerate() {
            self.read_retry(|c| {
                for k in chunk {
                    p::put_get(&mut c.out, k.as_ref());
                }
                c.send()?;
                for i in 0..chunk.len() {
                    let (ty, body) = c.recv()?;
                    if ty != op::VALUE {
                        return Err(c.unexpected(ty, "VALUE"));
                    }
                    let v = &c.inbuf[body];
                    f(ci * PIPELINE_CHUNK + i, (!v.is_empty()).then_some(v));
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Queues a GET without sending it (see [`Client::flush`]): with
    /// [`Client::recv_value`] this drives many connections from one thread.
    pub fn queue_get(&mut self, key: &[u8]) -> Result<()> {
        self.check_key(key)?;
        p::put_get(&mut self.out, key);
        Ok(())
    }

    /// Sends every queued request (an error if the connection broke: the
    /// queue is then dropped, and the next call reconnects).
    pub fn flush(&mut self) -> Result<()> {
        self.send()
    }

    /// Reads the reply to the oldest GET in flight into `out`; returns
    /// whether the key is present.
    pub fn recv_value(&mut self, out: &mut Vec<u8>) -> Result<bool> {
        let (ty, body) = self.recv()?;
        if ty != op::VALUE {
            return Err(self.unexpected(ty, "VALUE"));
        }
        out.clear();
        out.extend_from_slice(&self.inbuf[body]);
        Ok(!out.is_empty())
    }

    /// One MULTI_GET per `max_batch` keys; `f(i, value)` sees each in order.
    pub fn multi_get_with<K: AsRef<[u8]>>(
        &mut self,
        keys: &[K],
        mut f: impl FnMut(usize, Option<&[u8]>),
    ) -> Result<()> {
        for k in keys {
            self.check_key(k.as_ref())?;
        }
        let batch = (self.welcome.max_batch as usize).max(1);
        for (ci, chunk) in keys.chunks(batch).enumerate() {
            self.read_retry(|c| {
                p::put_multi_get(&mut c.out, chunk);
                c.send()?;
                let (ty, body) = c.recv()?;
                let lim = Limits {
                    max_frame: u32::MAX,
                    max_batch: u32::MAX,
                };
                match p::parse(ty, &c.inbuf[body], 0, &lim) {
                    Ok(Frame::Values { count, body }) if count as usize == chunk.len() => {
                        for (i, v) in p::values(body).enumerate() {
                            f(ci * batch + i, (!v.is_empty()).then_some(v));
                        }
                        Ok(())
                    }
                    other => Err(ClientError::Protocol(format!(
                        "expected VALUES of {} items, got {other:?}",
                        chunk.len()
                    ))),
                }
            })?;
        }
        Ok(())
    }

    pub fn multi_get<K: AsRef<[u8]>>(&mut self, keys: &[K]) -> Result<Vec<Option<Vec<u8>>>> {
        let mut r = vec![None; keys.len()];
        self.multi_get_with(keys, |i, v| r[i] = v.map(<[u8]>::to_vec))?;
        Ok(r)
    }

    pub fn status(&mut self) -> Result<Status> {
        self.read_retry(|c| {
            p::put_empty(&mut c.out, op::STATUS);
            c.send()?;
            let (ty, body) = c.recv()?;
            match p::parse(ty, &c.inbuf[body], 0, &Limits::default()) {
                Ok(Frame::StatusReply {
                    current,
                    oldest,
                    last_seq,
                }) => Ok(Status {
                    current,
                    oldest,
                    last_seq,
                }),
                _ => Err(c.unexpected(ty, "STATUS_REPLY")),
            }
        })
    }

    pub fn ping(&mut self) -> Result<()> {
        self.read_retry(|c| {
            p::put_empty(&mut c.out, op::PING);
            c.send()?;
            let (ty, _) = c.recv()?;
            if ty != op::PONG {
                return Err(c.unexpected(ty, "PONG"));
            }
            Ok(())
        })
    }

    fn done(&mut self) -> Result<(u64, u64)> {
        let (ty, body) = self.recv()?;
        match p::parse(ty, &self.inbuf[body], 0, &Limits::default()) {
            Ok(Frame::Done { current, seq }) => Ok((current, seq)),
            _ => Err(self.unexpected(ty, "DONE")),
        }
    }

    /// Applies a block (writer sessions); returns its event sequence number.
    pub fn set<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        block: u64,
        ops: &[(K, V)],
    ) -> Result<u64> {
        for (k, v) in ops {
            self.check_key(k.as_ref())?;
            if v.as_ref().len() > crate::MAX_VALUE_LEN {
                return Err(ClientError::Invalid(format!(
                    "value of {} bytes is too large (at most {} bytes)",
                    v.as_ref().len(),
                    crate::MAX_VALUE_LEN
                )));
            }
        }
        self.ensure_fresh()?;
        p::put_set(&mut self.out, block, ops);
        self.send()?;
        Ok(self.done()?.1)
    }

    /// Deletes `key` in block `block`; returns its previous value.
    pub fn pop(&mut self, block: u64, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.check_key(key)?;
        self.ensure_fresh()?;
        p::put_pop(&mut self.out, block, key);
        self.send()?;
        let (ty, body) = self.recv()?;
        match p::parse(ty, &self.inbuf[body], 0, &Limits::default()) {
            Ok(Frame::Popped { value, .. }) => Ok((!value.is_empty()).then(|| value.to_vec())),
            _ => Err(self.unexpected(ty, "POPPED")),
        }
    }

    /// Reports (a follow session) that every event up to `seq` is applied
    /// in this follower's replica; a writer serving with a follower-lag
    /// bound waits for it. Returns the (current block, last event) the
    /// writer's readers see. Idempotent, so retried once like a read.
    pub fn ack(&mut self, seq: u64) -> Result<(u64, u64)> {
        self.read_retry(|c| {
            p::put_u64s(&mut c.out, op::ACK, &[seq]);
            c.send()?;
            c.done()
        })
    }

    /// Rolls the store back to `target`; returns the block reached.
    pub fn rollback(&mut self, target: u64) -> Result<u64> {
        self.ensure_fresh()?;
        p::put_u64s(&mut self.out, op::ROLLBACK, &[target]);
        self.send()?;
        Ok(self.done()?.0)
    }

    /// Asks for a copy of the store's files (a follow session) and writes
    /// them into the directory `into`, each file synced; returns the number
    /// of files and bytes. The server closes the connection afterwards.
    pub fn fetch_snapshot(mut self, into: &std::path::Path) -> Result<(u32, u64)> {
        use std::fs::{File, OpenOptions};
        self.ensure_fresh()?;
        p::put_empty(&mut self.out, op::SNAPSHOT);
        self.send()?;
        let lim = Limits {
            max_frame: u32::MAX,
            max_batch: u32::MAX,
        };
        let mut cur: Option<(std::path::PathBuf, File, u64)> = None;
        let (mut files, mut bytes) = (0u32, 0u64);
        loop {
            let (ty, body) = self.recv()?;
            match p::parse(ty, &self.inbuf[body], 0, &lim) {
                Ok(Frame::SnapFile { size, name }) => {
                    finish_file(cur.take())?;
                    let path = into.join(name);
                    let f = OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&path)
                        .map_err(|e| file_error(&path, e))?;
                    cur = Some((path, f, size));
                    files += 1;
                }
                Ok(Frame::SnapData { data }) => {
                    let Some((path, f, left)) = cur.as_mut() else {
                        return Err(ClientError::Protocol("SNAP_DATA before SNAP_FILE".into()));
                    };
                    if data.len() as u64 > *left {
                        return Err(ClientError::Protocol(format!(
                            "more data than announced for {}",
                            path.display()
                        )));
                    }
                    f.write_all(data).map_err(|e| file_error(path, e))?;
                    *left -= data.len() as u64;
                    bytes += data.len() as u64;
                }
                Ok(Frame::SnapEnd {
                    files: nf,
                    bytes: nb,
                }) => {
                    finish_file(cur.take())?;
                    if (nf, nb) != (files, bytes) {
                        return Err(ClientError::Protocol(format!(
                            "snapshot ended after {files} files and {bytes} bytes, the server sent {nf} and {nb}"
                        )));
                    }
                    return Ok((files, bytes));
                }
                _ => return Err(self.unexpected(ty, "SNAP_FILE, SNAP_DATA or SNAP_END")),
            }
        }
    }

    /// Turns this connection into a subscription to the events after event
    /// `from_seq`, for a replica at block `from_block`.
    pub fn subscribe(mut self, from_seq: u64, from_block: u64) -> Result<Subscription> {
        self.ensure_fresh()?;
        p::put_u64s(&mut self.out, op::SUBSCRIBE, &[from_seq, from_block]);
        self.send()?;
        Ok(Subscription { c: self })
    }
}

/// One event of a subscription (borrowing the client's buffer).
#[derive(Debug)]
pub enum Event<'a> {
    /// `entries`: validated `[key][len u16][value]`; iterate with
    /// [`p::entries`].
    Block {
        seq: u64,
        prev: u64,
        block: u64,
        count: u32,
        entries: &'a [u8],
    },
    Rollback {
        seq: u64,
        prev: u64,
        target: u64,
        result: u64,
    },
    Heartbeat {
        last_seq: u64,
        current: u64,
    },
}

pub struct Subscription {
    c: Client,
}

impl Subscription {
    pub fn welcome(&self) -> &Welcome {
        self.c.welcome()
    }

    /// A second handle on the socket, to shut it down from another thread
    /// (which makes a blocked [`Subscription::next_event`] return an error).
    pub fn socket(&self) -> Option<TcpStream> {
        self.c.socket()
    }

    /// Receives the next stream frame and copies its type and body into
    /// `frame` (`[type][body]`), so that it can be handed to another
    /// thread. Only the framing is checked here (an ERROR frame is returned
    /// as the error): decode and check the body with [`decode_event`],
    /// once, where it is used.
    pub fn next_frame(&mut self, frame: &mut Vec<u8>) -> Result<()> {
        let (_, body) = self.c.recv()?;
        frame.clear();
        frame.extend_from_slice(&self.c.inbuf[body.start - 1..body.end]);
        Ok(())
    }

    /// Waits for the next event (a heartbeat comes every second or so when
    /// the writer is idle; silence beyond the I/O timeout is an error).
    pub fn next_event(&mut self) -> Result<Event<'_>> {
        let (ty, body) = self.c.recv()?;
        let kw = self.c.welcome.key_width as usize;
        decode_event(ty, &self.c.inbuf[body], kw)
    }
}

/// Decodes a stream frame's body (see [`Subscription::next_frame`]).
pub fn decode_event(ty: u8, body: &[u8], kw: usize) -> Result<Event<'_>> {
    {
        let lim = Limits {
            max_frame: u32::MAX,
            max_batch: u32::MAX,
        };
        match p::parse(ty, body, kw, &lim) {
            Ok(Frame::EvBlock {
                seq,
                prev,
                block,
                count,
                entries,
            }) => Ok(Event::Block {
                seq,
                prev,
                block,
                count,
                entries,
            }),
            Ok(Frame::EvRollback {
                seq,
                prev,
                target,
                result,
            }) => Ok(Event::Rollback {
                seq,
                prev,
                target,
                result,
            }),
            Ok(Frame::Heartbeat { last_seq, current }) => {
                Ok(Event::Heartbeat { last_seq, current })
            }
            Ok(_) => Err(ClientError::Protocol(format!(
                "unexpected {} in a subscription",
                p::name_of(ty)
            ))),
            Err(e) => Err(ClientError::Protocol(e.to_string())),
        }
    }
}

/// A pool of connections with the same configuration.
pub struct Pool {
    cfg: ClientConfig,
    idle: Mutex<Vec<Client>>,
    max_idle: usize,
}

impl Pool {
    pub fn new(cfg: ClientConfig, max_idle: usize) -> Pool {
        Pool {
            cfg,
            idle: Mutex::new(Vec::new()),
            max_idle,
        }
    }

    /// An idle connection, or a new one.
    pub fn get(&self) -> Result<Pooled<'_>> {
        let c = match self.idle.lock().pop() {
            Some(c) => c,
            None => Client::connect(self.cfg.clone())?,
        };
        Ok(Pooled {
            pool: self,
            c: Some(c),
        })
    }

    pub fn idle(&self) -> usize {
        self.idle.lock().len()
    }
}

/// A pooled connection; goes back to the pool when dropped (if still healthy).
pub struct Pooled<'a> {
    pool: &'a Pool,
    c: Option<Client>,
}

impl Deref for Pooled<'_> {
    type Target = Client;
    fn deref(&self) -> &Client {
        self.c.as_ref().expect("present until drop")
    }
}

impl DerefMut for Pooled<'_> {
    fn deref_mut(&mut self) -> &mut Client {
        self.c.as_mut().expect("present until drop")
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.c.take()
            && c.is_connected()
        {
            let mut idle = self.pool.idle.lock();
            if idle.len() < self.pool.max_idle {
                idle.push(c);
            }
        }
    }
}
fn file_error(path: &std::path::Path, source: io::Error) -> ClientError {
    ClientError::File {
        path: path.display().to_string(),
        source,
    }
}

/// Ends the snapshot file being received, if any: it must have had all its
/// announced bytes, and is synced.
fn finish_file(cur: Option<(std::path::PathBuf, std::fs::File, u64)>) -> Result<()> {
    if let Some((path, f, left)) = cur {
        if left != 0 {
            return Err(ClientError::Protocol(format!(
                "snapshot file {} ended {left} bytes short",
                path.display()
            )));
        }
        f.sync_all().map_err(|e| file_error(&path, e))?;
    }
    Ok(())
}

/// Connects to `cfg.addr` (the first of its addresses that answers), over
/// TLS when configured.
fn dial(cfg: &ClientConfig) -> Result<Stream> {
    let cerr = |source: io::Error| ClientError::Connect {
        addr: cfg.addr.clone(),
        source,
    };
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the address resolves to nothing");
    let mut sock = None;
    for a in cfg.addr.to_socket_addrs().map_err(cerr)? {
        match TcpStream::connect_timeout(&a, cfg.connect_timeout) {
            Ok(s) => {
                sock = Some(s);
                break;
            }
            Err(e) => last = e,
        }
    }
    let sock = sock.ok_or_else(|| cerr(last))?;
    sock.set_nodelay(true).map_err(cerr)?;
    sock.set_read_timeout(Some(cfg.io_timeout)).map_err(cerr)?;
    sock.set_write_timeout(Some(cfg.io_timeout)).map_err(cerr)?;
    Ok(match &cfg.tls {
        None => Stream::Plain(sock),
        Some(t) => {
            let host = match &cfg.server_name {
                Some(h) => h.clone(),
                None => cfg
                    .addr
                    .rsplit_once(':')
                    .map_or(cfg.addr.clone(), |(h, _)| h.to_string()),
            };
            let conn = rustls::ClientConnection::new(t.clone(), server_name(&host)?)
                .map_err(TlsError::Config)?;
            Stream::TlsClient(Box::new(rustls::StreamOwned::new(conn, sock)))
        }
    })
}
