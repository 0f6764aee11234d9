//! The wire protocol of the store server (see `docs/store-protocol.md`).
//!
//! Every frame is `[len u32 LE][type u8][body]`, `len` counting the type byte
//! and the body. Decoding is split in two steps so that a bad body does not
//! cost the connection: [`split_frame`] finds frame boundaries (its errors are
//! fatal: the stream can no longer be framed) and [`parse`] checks one body
//! against the store's key width and the batch limit (its errors are answered
//! with an error frame and the connection goes on). Neither ever panics.

use std::fmt;

pub const MAGIC: [u8; 4] = *b"MFSP";
pub const VERSION: u16 = 1;
/// Bytes of the length prefix.
pub const LEN_BYTES: usize = 4;
pub const DEFAULT_MAX_FRAME: u32 = 64 << 20;
pub const DEFAULT_MAX_BATCH: u32 = 1 << 20;
/// Longest user name or token in a HELLO.
pub const MAX_CREDENTIAL: usize = 255;

/// Frame type bytes. Requests are below 0x80, replies and stream frames above.
pub mod op {
    pub const HELLO: u8 = 0x01;
    pub const PING: u8 = 0x02;
    pub const GET: u8 = 0x10;
    pub const MULTI_GET: u8 = 0x11;
    pub const STATUS: u8 = 0x12;
    pub const SET: u8 = 0x20;
    pub const POP: u8 = 0x21;
    pub const ROLLBACK: u8 = 0x22;
    pub const SUBSCRIBE: u8 = 0x30;
    pub const SNAPSHOT: u8 = 0x31;
    pub const ACK: u8 = 0x32;
    pub const WELCOME: u8 = 0x81;
    pub const PONG: u8 = 0x82;
    pub const VALUE: u8 = 0x90;
    pub const VALUES: u8 = 0x91;
    pub const STATUS_REPLY: u8 = 0x92;
    pub const DONE: u8 = 0xA0;
    pub const POPPED: u8 = 0xA1;
    pub const EV_BLOCK: u8 = 0xB0;
    pub const EV_ROLLBACK: u8 = 0xB1;
    pub const HEARTBEAT: u8 = 0xB2;
    pub const SNAP_FILE: u8 = 0xB3;
    pub const SNAP_DATA: u8 = 0xB4;
    pub const SNAP_END: u8 = 0xB5;
    pub const ERROR: u8 = 0xEE;
}

/// The role a connection asks for in its HELLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Read = 1,
    Write = 2,
    Follow = 3,
}

impl Role {
    pub fn from_u8(b: u8) -> Option<Role> {
        match b {
            1 => Some(Role::Read),
            2 => Some(Role::Write),
            3 => Some(Role::Follow),
            _ => None,
        }
    }

    /// Whether a credential holding `self` may open a session as `asked`.
    pub fn grants(self, asked: Role) -> bool {
        self == asked || asked == Role::Read
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Role, String> {
        match s {
            "read" => Ok(Role::Read),
            "write" => Ok(Role::Write),
            "follow" => Ok(Role::Follow),
            _ => Err(format!("unknown role {s:?} (read, write or follow)")),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Read => "read",
            Role::Write => "write",
            Role::Follow => "follow",
        })
    }
}

/// Error codes carried by ERROR frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    Malformed = 1,
    FrameTooLarge = 2,
    UnknownType = 3,
    BadVersion = 4,
    BadMagic = 5,
    AuthFailed = 6,
    Forbidden = 7,
    KeyWidth = 8,
    BlockNotIncreasing = 9,
    RollbackOutsideWindow = 10,
    ValueTooLarge = 11,
    BatchTooLarge = 12,
    TooManyConnections = 13,
    Timeout = 14,
    HistoryUnavailable = 15,
    HistoryDiverged = 16,
    StoreFailed = 17,
    ShuttingDown = 18,
    Internal = 19,
    HandshakeRequired = 20,
    /// A write or a subscription sent to a follower's read-only replica.
    ReadOnlyReplica = 21,
    /// A follower's replica has no store yet (it has not reached the writer).
    ReplicaNotReady = 22,
    /// Not a server code: a code this client does not know.
    Unknown = 0xFFFF,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 22] = [
        ErrorCode::Malformed,
        ErrorCode::FrameTooLarge,
        ErrorCode::UnknownType,
        ErrorCode::BadVersion,
        ErrorCode::BadMagic,
        ErrorCode::AuthFailed,
        ErrorCode::Forbidden,
        ErrorCode::KeyWidth,
        ErrorCode::BlockNotIncreasing,
        ErrorCode::RollbackOutsideWindow,
        ErrorCode::ValueTooLarge,
        ErrorCode::BatchTooLarge,
        ErrorCode::TooManyConnections,
        ErrorCode::Timeout,
        ErrorCode::HistoryUnavailable,
        ErrorCode::HistoryDiverged,
        ErrorCode::StoreFailed,
        ErrorCode::ShuttingDown,
        ErrorCode::Internal,
        ErrorCode::HandshakeRequired,
        ErrorCode::ReadOnlyReplica,
        ErrorCode::ReplicaNotReady,
    ];

    pub fn from_u16(c: u16) -> ErrorCode {
        Self::ALL
            .iter()
            .copied()
            .find(|e| *e as u16 == c)
            .unwrap_or(ErrorCode::Unknown)
    }

    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::Malformed => "malformed",
            ErrorCode::FrameTooLarge => "frame_too_large",
            ErrorCode::UnknownType => "unknown_type",
            ErrorCode::BadVersion => "bad_version",
            ErrorCode::BadMagic => "bad_magic",
            ErrorCode::AuthFailed => "auth_failed",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::KeyWidth => "key_width",
            ErrorCode::BlockNotIncreasing => "block_not_increasing",
            ErrorCode::RollbackOutsideWindow => "rollback_outside_window",
            ErrorCode::ValueTooLarge => "value_too_large",
            ErrorCode::BatchTooLarge => "batch_too_large",
            ErrorCode::TooManyConnections => "too_many_connections",
            ErrorCode::Timeout => "timeout",
            ErrorCode::HistoryUnavailable => "history_unavailable",
            ErrorCode::HistoryDiverged => "history_diverged",
            ErrorCode::StoreFailed => "store_failed",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::Internal => "internal",
            ErrorCode::HandshakeRequired => "handshake_required",
            ErrorCode::ReadOnlyReplica => "read_only_replica",
            ErrorCode::ReplicaNotReady => "replica_not_ready",
            ErrorCode::Unknown => "unknown",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A decoding error. [`ProtoError::is_fatal`] tells whether the stream can
/// still be framed after it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    FrameTooLarge { len: u64, max: u32 },
    #[error("frame length 0 (a frame holds at least its type byte)")]
    EmptyFrame,
    #[error("unknown frame type 0x{0:02x}")]
    UnknownType(u8),
    #[error("malformed {what} frame: {why}")]
    Malformed { what: &'static str, why: String },
    #[error("key is {got} bytes but this store's keys are {expected} bytes")]
    KeyWidth { expected: usize, got: usize },
    #[error("batch of {count} exceeds the limit of {max}")]
    BatchTooLarge { count: u64, max: u32 },
    #[error("not a memfs store protocol stream (bad magic)")]
    BadMagic,
    #[error("protocol version {got} is not supported (this side speaks {VERSION})")]
    BadVersion { got: u16 },
}

impl ProtoError {
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            ProtoError::FrameTooLarge { .. }
                | ProtoError::EmptyFrame
                | ProtoError::BadMagic
                | ProtoError::BadVersion { .. }
        )
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            ProtoError::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
            ProtoError::EmptyFrame | ProtoError::Malformed { .. } => ErrorCode::Malformed,
            ProtoError::UnknownType(_) => ErrorCode::UnknownType,
            ProtoError::KeyWidth { .. } => ErrorCode::KeyWidth,
            ProtoError::BatchTooLarge { .. } => ErrorCode::BatchTooLarge,
            ProtoError::BadMagic => ErrorCode::BadMagic,
            ProtoError::BadVersion { .. } => ErrorCode::BadVersion,
        }
    }
}

/// Limits a decoder enforces.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_frame: u32,
    pub max_batch: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame: DEFAULT_MAX_FRAME,
            max_batch: DEFAULT_MAX_BATCH,
        }
    }
}

/// What the server tells a client after a good HELLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Welcome {
    pub version: u16,
    pub key_width: u16,
    pub shards: u32,
    pub rollback_window: u64,
    pub current: u64,
    pub oldest: u64,
    pub last_seq: u64,
    pub max_frame: u32,
    pub max_batch: u32,
}

const WELCOME_LEN: usize = 2 + 2 + 4 + 8 * 4 + 4 + 4;

/// One decoded frame, borrowing the receive buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame<'a> {
    Hello {
        key_width: u16,
        role: Role,
        user: &'a [u8],
        token: &'a [u8],
    },
    Ping,
    Get {
        key: &'a [u8],
    },
    /// `keys` holds `count` keys back to back.
    MultiGet {
        count: u32,
        keys: &'a [u8],
    },
    Status,
    /// `entries`: `count` validated `[key][len u16][value]` entries.
    Set {
        block: u64,
        count: u32,
        entries: &'a [u8],
    },
    Pop {
        block: u64,
        key: &'a [u8],
    },
    Rollback {
        target: u64,
    },
    Subscribe {
        from_seq: u64,
        from_block: u64,
    },
    Snapshot,
    /// A follower's report: it has applied every event up to `seq`.
    Ack {
        seq: u64,
    },
    Welcome(Welcome),
    Pong,
    /// An empty value means absent.
    Value {
        value: &'a [u8],
    },
    /// `body`: `count` validated `[len u16][value]` items.
    Values {
        count: u32,
        body: &'a [u8],
    },
    StatusReply {
        current: u64,
        oldest: u64,
        last_seq: u64,
    },
    Done {
        current: u64,
        seq: u64,
    },
    Popped {
        current: u64,
        seq: u64,
        value: &'a [u8],
    },
    EvBlock {
        seq: u64,
        prev: u64,
        block: u64,
        count: u32,
        entries: &'a [u8],
    },
    EvRollback {
        seq: u64,
        prev: u64,
        target: u64,
        result: u64,
    },
    Heartbeat {
        last_seq: u64,
        current: u64,
    },
    /// A file of a snapshot transfer follows in SNAP_DATA frames; `name` is
    /// checked to be a plain file name.
    SnapFile {
        size: u64,
        name: &'a str,
    },
    SnapData {
        data: &'a [u8],
    },
    SnapEnd {
        files: u32,
        bytes: u64,
    },
    Error {
        code: u16,
        message: &'a [u8],
    },
}

/// A frame found in a buffer: its type, its body, and its total length.
pub type Split<'a> = (u8, &'a [u8], usize);

/// Finds the first frame in `buf`: `Ok(None)` if more bytes are needed
/// ([`frame_len`] tells how many once the prefix is there), else its type,
/// body and total length including the prefix.
pub fn split_frame(buf: &[u8], max_frame: u32) -> Result<Option<Split<'_>>, ProtoError> {
    let Some(total) = frame_len(buf, max_frame)? else {
        return Ok(None);
    };
    if buf.len() < total {
        return Ok(None);
    }
    Ok(Some((buf[LEN_BYTES], &buf[LEN_BYTES + 1..total], total)))
}

/// The total length (prefix included) of the frame starting `buf`, once its
/// prefix is there.
pub fn frame_len(buf: &[u8], max_frame: u32) -> Result<Option<usize>, ProtoError> {
    let Some(prefix) = buf.get(..LEN_BYTES) else {
        return Ok(None);
    };
    let len = u32::from_le_bytes(prefix.try_into().expect("4 bytes"));
    if len == 0 {
        return Err(ProtoError::EmptyFrame);
    }
    if len > max_frame {
        return Err(ProtoError::FrameTooLarge {
            len: len as u64,
            max: max_frame,
        });
    }
    Ok(Some(LEN_BYTES + len as usize))
}

/// A little cursor that never panics.
struct Rd<'a> {
    b: &'a [u8],
    what: &'static str,
}

impl<'a> Rd<'a> {
    fn bad(&self, why: impl Into<String>) -> ProtoError {
        ProtoError::Malformed {
            what: self.what,
            why: why.into(),
        }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if self.b.len() < n {
            return Err(self.bad(format!("needs {n} more bytes, has {}", self.b.len())));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u8(&mut self) -> Result<u8, ProtoError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, ProtoError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, ProtoError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, ProtoError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn end(&self) -> Result<(), ProtoError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(self.bad(format!("{} trailing bytes", self.b.len())))
        }
    }
    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.b)
    }
}

fn check_batch(count: u32, lim: &Limits) -> Result<(), ProtoError> {
    if count > lim.max_batch {
        return Err(ProtoError::BatchTooLarge {
            count: count as u64,
            max: lim.max_batch,
        });
    }
    Ok(())
}

/// Checks that `body` holds exactly `count` `[key][len u16][value]` entries.
fn check_entries(what: &'static str, body: &[u8], count: u32, kw: usize) -> Result<(), ProtoError> {
    let mut r = Rd { b: body, what };
    for _ in 0..count {
        r.take(kw)?;
        let len = r.u16()? as usize;
        r.take(len)?;
    }
    r.end()
}

/// Parses one frame body. `kw` is the store's key width (0 before the
/// handshake told it: then key-carrying frames are refused).
///
/// The frames a client sends are parsed here, first, as they are a server's
/// whole traffic; a server's frames are left to `parse_reply`.
pub fn parse<'a>(ty: u8, body: &'a [u8], kw: usize, lim: &Limits) -> Result<Frame<'a>, ProtoError> {
    let what = name_of(ty);
    let mut r = Rd { b: body, what };
    let f = match ty {
        op::HELLO => parse_hello(&mut r)?,
        op::PING => {
            r.end()?;
            Frame::Ping
        }
        op::GET => Frame::Get {
            key: of_width(body, kw)?,
        },
        op::MULTI_GET => parse_multi_get(&mut r, kw, lim)?,
        op::STATUS => {
            r.end()?;
            Frame::Status
        }
        op::SET => {
            let block = r.u64()?;
            let (count, entries) = block_entries(&mut r, kw, lim)?;
            Frame::Set {
                block,
                count,
                entries,
            }
        }
        op::POP => {
            let block = r.u64()?;
            let key = of_width(r.rest(), kw)?;
            Frame::Pop { block, key }
        }
        op::ROLLBACK => {
            let target = r.u64()?;
            r.end()?;
            Frame::Rollback { target }
        }
        op::SNAPSHOT => {
            r.end()?;
            Frame::Snapshot
        }
        op::SUBSCRIBE => {
            let from_seq = r.u64()?;
            let from_block = r.u64()?;
            r.end()?;
            Frame::Subscribe {
                from_seq,
                from_block,
            }
        }
        op::ACK => {
            let seq = r.u64()?;
            r.end()?;
            Frame::Ack { seq }
        }
        _ => return parse_reply(ty, r, kw, lim),
    };
    Ok(f)
}

fn parse_hello<'a>(r: &mut Rd<'a>) -> Result<Frame<'a>, ProtoError> {
    if r.take(4).map_err(|_| ProtoError::BadMagic)? != MAGIC {
        return Err(ProtoError::BadMagic);
    }
    let version = r.u16()?;
    if version != VERSION {
        return Err(ProtoError::BadVersion { got: version });
    }
    let key_width = r.u16()?;
    let role = r.u8()?;
    let role = Role::from_u8(role).ok_or_else(|| r.bad(format!("unknown role {role}")))?;
    let ulen = r.u8()? as usize;
    let user = r.take(ulen)?;
    let tlen = r.u8()? as usize;
    let token = r.take(tlen)?;
    r.end()?;
    Ok(Frame::Hello {
        key_width,
        role,
        user,
        token,
    })
}

/// `key`, if it is one key of the store's width.
fn of_width(key: &[u8], kw: usize) -> Result<&[u8], ProtoError> {
    if key.len() != kw {
        return Err(ProtoError::KeyWidth {
            expected: kw,
            got: key.len(),
        });
    }
    Ok(key)
}

fn parse_multi_get<'a>(r: &mut Rd<'a>, kw: usize, lim: &Limits) -> Result<Frame<'a>, ProtoError> {
    let count = r.u32()?;
    check_batch(count, lim)?;
    let keys = r.rest();
    if kw == 0 || keys.len() as u64 != count as u64 * kw as u64 {
        return Err(ProtoError::KeyWidth {
            expected: kw,
            got: if count == 0 {
                keys.len()
            } else {
                keys.len() / count as usize
            },
        });
    }
    Ok(Frame::MultiGet { count, keys })
}

/// The `count` and entries that end a SET or a block event, checked against
/// the batch limit and the key width.
fn block_entries<'a>(
    r: &mut Rd<'a>,
    kw: usize,
    lim: &Limits,
) -> Result<(u32, &'a [u8]), ProtoError> {
    let count = r.u32()?;
    check_batch(count, lim)?;
    let entries = r.rest();
    if kw == 0 {
        return Err(ProtoError::KeyWidth {
            expected: kw,
            got: 0,
        });
    }
    check_entries(r.what, entries, count, kw)?;
    Ok((count, entries))
}

/// A server's replies to requests; its streams (events, snapshot files) are
/// left to `parse_stream`.
fn parse_reply<'a>(
    ty: u8,
    mut r: Rd<'a>,
    kw: usize,
    lim: &Limits,
) -> Result<Frame<'a>, ProtoError> {
    let body = r.b;
    let f = match ty {
        op::WELCOME => parse_welcome(&mut r)?,
        op::PONG => {
            r.end()?;
            Frame::Pong
        }
        op::VALUE => Frame::Value { value: body },
        op::VALUES => {
            let count = r.u32()?;
            check_batch(count, lim)?;
            let rest = r.rest();
            let mut c = Rd {
                b: rest,
                what: r.what,
            };
            for _ in 0..count {
                let len = c.u16()? as usize;
                c.take(len)?;
            }
            c.end()?;
            Frame::Values { count, body: rest }
        }
        op::STATUS_REPLY => {
            let f = Frame::StatusReply {
                current: r.u64()?,
                oldest: r.u64()?,
                last_seq: r.u64()?,
            };
            r.end()?;
            f
        }
        op::DONE => {
            let f = Frame::Done {
                current: r.u64()?,
                seq: r.u64()?,
            };
            r.end()?;
            f
        }
        op::POPPED => Frame::Popped {
            current: r.u64()?,
            seq: r.u64()?,
            value: r.rest(),
        },
        op::ERROR => {
            let code = r.u16()?;
            let len = r.u16()? as usize;
            let message = r.take(len)?;
            r.end()?;
            Frame::Error { code, message }
        }
        _ => return parse_stream(ty, r, kw, lim),
    };
    Ok(f)
}

fn parse_welcome<'a>(r: &mut Rd<'a>) -> Result<Frame<'a>, ProtoError> {
    if r.b.len() != WELCOME_LEN {
        return Err(r.bad(format!("{} bytes, expected {WELCOME_LEN}", r.b.len())));
    }
    Ok(Frame::Welcome(Welcome {
        version: r.u16()?,
        key_width: r.u16()?,
        shards: r.u32()?,
        rollback_window: r.u64()?,
        current: r.u64()?,
        oldest: r.u64()?,
        last_seq: r.u64()?,
        max_frame: r.u32()?,
        max_batch: r.u32()?,
    }))
}

/// What a server streams: events to a subscriber, a snapshot's files.
fn parse_stream<'a>(
    ty: u8,
    mut r: Rd<'a>,
    kw: usize,
    lim: &Limits,
) -> Result<Frame<'a>, ProtoError> {
    let f = match ty {
        op::EV_BLOCK => {
            let seq = r.u64()?;
            let prev = r.u64()?;
            let block = r.u64()?;
            let (count, entries) = block_entries(&mut r, kw, lim)?;
            Frame::EvBlock {
                seq,
                prev,
                block,
                count,
                entries,
            }
        }
        op::EV_ROLLBACK => {
            let f = Frame::EvRollback {
                seq: r.u64()?,
                prev: r.u64()?,
                target: r.u64()?,
                result: r.u64()?,
            };
            r.end()?;
            f
        }
        op::HEARTBEAT => {
            let f = Frame::Heartbeat {
                last_seq: r.u64()?,
                current: r.u64()?,
            };
            r.end()?;
            f
        }
        op::SNAP_FILE => {
            let size = r.u64()?;
            let len = r.u16()? as usize;
            let name = r.take(len)?;
            r.end()?;
            let name = std::str::from_utf8(name)
                .ok()
                .filter(|n| is_plain_file_name(n))
                .ok_or_else(|| {
                    r.bad(format!(
                        "{:?} is not a plain file name",
                        String::from_utf8_lossy(name)
                    ))
                })?;
            Frame::SnapFile { size, name }
        }
        op::SNAP_DATA => Frame::SnapData { data: r.rest() },
        op::SNAP_END => {
            let f = Frame::SnapEnd {
                files: r.u32()?,
                bytes: r.u64()?,
            };
            r.end()?;
            f
        }
        other => return Err(ProtoError::UnknownType(other)),
    };
    Ok(f)
}

/// Splits and parses the first frame of `buf`: `Ok(None)` when incomplete,
/// else the frame (or its body error) and the bytes it used. The outer error
/// is fatal (the stream cannot be framed any more).
#[allow(clippy::type_complexity)]
pub fn decode<'a>(
    buf: &'a [u8],
    kw: usize,
    lim: &Limits,
) -> Result<Option<(Result<Frame<'a>, ProtoError>, usize)>, ProtoError> {
    Ok(split_frame(buf, lim.max_frame)?.map(|(ty, body, n)| (parse(ty, body, kw, lim), n)))
}

pub fn name_of(ty: u8) -> &'static str {
    match ty {
        op::HELLO => "HELLO",
        op::PING => "PING",
        op::GET => "GET",
        op::MULTI_GET => "MULTI_GET",
        op::STATUS => "STATUS",
        op::SET => "SET",
        op::POP => "POP",
        op::ROLLBACK => "ROLLBACK",
        op::SUBSCRIBE => "SUBSCRIBE",
        op::SNAPSHOT => "SNAPSHOT",
        op::ACK => "ACK",
        op::SNAP_FILE => "SNAP_FILE",
        op::SNAP_DATA => "SNAP_DATA",
        op::SNAP_END => "SNAP_END",
        op::WELCOME => "WELCOME",
        op::PONG => "PONG",
        op::VALUE => "VALUE",
        op::VALUES => "VALUES",
        op::STATUS_REPLY => "STATUS_REPLY",
        op::DONE => "DONE",
        op::POPPED => "POPPED",
        op::EV_BLOCK => "EV_BLOCK",
        op::EV_ROLLBACK => "EV_ROLLBACK",
        op::HEARTBEAT => "HEARTBEAT",
        op::ERROR => "ERROR",
        _ => "unknown",
    }
}

/// Iterates validated `[key][len u16][value]` entries (from `Set`/`EvBlock`).
pub fn entries(buf: &[u8], kw: usize) -> impl Iterator<Item = (&[u8], &[u8])> {
    let mut r = Rd {
        b: buf,
        what: "entries",
    };
    std::iter::from_fn(move || {
        if r.b.is_empty() {
            return None;
        }
        let k = r.take(kw).ok()?;
        let len = r.u16().ok()? as usize;
        let v = r.take(len).ok()?;
        Some((k, v))
    })
}

/// Iterates validated `[len u16][value]` items (from `Values`).
pub fn values(buf: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut r = Rd {
        b: buf,
        what: "values",
    };
    std::iter::from_fn(move || {
        if r.b.is_empty() {
            return None;
        }
        let len = r.u16().ok()? as usize;
        r.take(len).ok()
    })
}

// ---- encoding: every writer appends one whole frame to `out` ----

/// Starts a frame; returns where its length goes. Close it with [`end`].
pub fn begin(out: &mut Vec<u8>, ty: u8) -> usize {
    let at = out.len();
    out.extend_from_slice(&[0, 0, 0, 0, ty]);
    at
}

/// Writes the length of the frame started at `at`.
pub fn end(out: &mut [u8], at: usize) {
    let len = (out.len() - at - LEN_BYTES) as u32;
    out[at..at + LEN_BYTES].copy_from_slice(&len.to_le_bytes());
}

pub fn put_hello(out: &mut Vec<u8>, key_width: u16, role: Role, user: &[u8], token: &[u8]) {
    let at = begin(out, op::HELLO);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&key_width.to_le_bytes());
    out.push(role as u8);
    let user = &user[..user.len().min(MAX_CREDENTIAL)];
    let token = &token[..token.len().min(MAX_CREDENTIAL)];
    out.push(user.len() as u8);
    out.extend_from_slice(user);
    out.push(token.len() as u8);
    out.extend_from_slice(token);
    end(out, at);
}

pub fn put_welcome(out: &mut Vec<u8>, w: &Welcome) {
    let at = begin(out, op::WELCOME);
    out.extend_from_slice(&w.version.to_le_bytes());
    out.extend_from_slice(&w.key_width.to_le_bytes());
    out.extend_from_slice(&w.shards.to_le_bytes());
    for x in [w.rollback_window, w.current, w.oldest, w.last_seq] {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.extend_from_slice(&w.max_frame.to_le_bytes());
    out.extend_from_slice(&w.max_batch.to_le_bytes());
    end(out, at);
}

pub fn put_empty(out: &mut Vec<u8>, ty: u8) {
    let at = begin(out, ty);
    end(out, at);
}

pub fn put_get(out: &mut Vec<u8>, key: &[u8]) {
    let at = begin(out, op::GET);
    out.extend_from_slice(key);
    end(out, at);
}

pub fn put_multi_get<K: AsRef<[u8]>>(out: &mut Vec<u8>, keys: &[K]) {
    let at = begin(out, op::MULTI_GET);
    out.extend_from_slice(&(keys.len() as u32).to_le_bytes());
    for k in keys {
        out.extend_from_slice(k.as_ref());
    }
    end(out, at);
}

fn put_entries<K: AsRef<[u8]>, V: AsRef<[u8]>>(out: &mut Vec<u8>, ops: &[(K, V)]) {
    out.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for (k, v) in ops {
        let v = v.as_ref();
        out.extend_from_slice(k.as_ref());
        out.extend_from_slice(&(v.len().min(u16::MAX as usize) as u16).to_le_bytes());
        out.extend_from_slice(&v[..v.len().min(u16::MAX as usize)]);
    }
}

/// Encodes a SET. Values longer than 65,535 bytes cannot be encoded: callers
/// check first ([`crate::MAX_VALUE_LEN`]).
pub fn put_set<K: AsRef<[u8]>, V: AsRef<[u8]>>(out: &mut Vec<u8>, block: u64, ops: &[(K, V)]) {
    let at = begin(out, op::SET);
    out.extend_from_slice(&block.to_le_bytes());
    put_entries(out, ops);
    end(out, at);
}

pub fn put_pop(out: &mut Vec<u8>, block: u64, key: &[u8]) {
    let at = begin(out, op::POP);
    out.extend_from_slice(&block.to_le_bytes());
    out.extend_from_slice(key);
    end(out, at);
}

/// A name a snapshot transfer may create: one path component of at most
/// 255 bytes, printable ASCII, not `.` or `..`, nothing hidden.
pub fn is_plain_file_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 255
        && !n.starts_with('.')
        && n.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'/' && b != b'\\')
}

pub fn put_snap_file(out: &mut Vec<u8>, size: u64, name: &str) {
    let at = begin(out, op::SNAP_FILE);
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(name.as_bytes());
    end(out, at);
}

pub fn put_snap_end(out: &mut Vec<u8>, files: u32, bytes: u64) {
    let at = begin(out, op::SNAP_END);
    out.extend_from_slice(&files.to_le_bytes());
    out.extend_from_slice(&bytes.to_le_bytes());
    end(out, at);
}

pub fn put_u64s(out: &mut Vec<u8>, ty: u8, xs: &[u64]) {
    let at = begin(out, ty);
    for x in xs {
        out.extend_from_slice(&x.to_le_bytes());
    }
    end(out, at);
}

pub fn put_value(out: &mut Vec<u8>, v: Option<&[u8]>) {
    let at = begin(out, op::VALUE);
    out.extend_from_slice(v.unwrap_or(&[]));
    end(out, at);
}

pub fn put_popped(out: &mut Vec<u8>, current: u64, seq: u64, v: Option<&[u8]>) {
    let at = begin(out, op::POPPED);
    out.extend_from_slice(&current.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(v.unwrap_or(&[]));
    end(out, at);
}

/// An EV_BLOCK frame: the SET body (block, count, entries) as received.
pub fn put_ev_block(out: &mut Vec<u8>, seq: u64, prev: u64, set_body: &[u8]) {
    let at = begin(out, op::EV_BLOCK);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&prev.to_le_bytes());
    out.extend_from_slice(set_body);
    end(out, at);
}

pub fn put_error(out: &mut Vec<u8>, code: ErrorCode, message: &str) {
    let at = begin(out, op::ERROR);
    out.extend_from_slice(&(code as u16).to_le_bytes());
    // Cut on a character boundary so the message stays UTF-8.
    let mut n = message.len().min(1024);
    while !message.is_char_boundary(n) {
        n -= 1;
    }
    out.extend_from_slice(&(n as u16).to_le_bytes());
    out.extend_from_slice(&message.as_bytes()[..n]);
    end(out, at);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let lim = Limits::default();
        let mut out = Vec::new();
        put_hello(&mut out, 8, Role::Write, b"u", b"t");
        put_get(&mut out, &[1; 8]);
        put_set(&mut out, 7, &[([2u8; 8], vec![9u8; 3]), ([3u8; 8], vec![])]);
        put_error(&mut out, ErrorCode::Forbidden, "no");
        let mut at = 0;
        let mut seen = Vec::new();
        while let Some((f, n)) = decode(&out[at..], 8, &lim).unwrap() {
            seen.push(format!("{:?}", f.unwrap()));
            at += n;
        }
        assert_eq!(at, out.len());
        assert_eq!(seen.len(), 4);
        assert!(seen[2].contains("block: 7, count: 2"), "{}", seen[2]);
        let (ty, body, _) = split_frame(&out[..], lim.max_frame).unwrap().unwrap();
        assert_eq!(ty, op::HELLO);
        assert!(matches!(
            parse(ty, body, 0, &lim).unwrap(),
            Frame::Hello {
                key_width: 8,
                role: Role::Write,
                ..
            }
        ));
    }

    #[test]
    fn typed_errors() {
        let lim = Limits {
            max_frame: 100,
            max_batch: 2,
        };
        assert_eq!(
            split_frame(&[0, 0, 0, 0], 100).unwrap_err(),
            ProtoError::EmptyFrame
        );
        assert!(matches!(
            split_frame(&[101, 0, 0, 0], 100).unwrap_err(),
            ProtoError::FrameTooLarge { len: 101, .. }
        ));
        assert_eq!(split_frame(&[5, 0, 0], 100).unwrap(), None);
        assert!(matches!(
            parse(op::GET, &[0; 7], 8, &lim).unwrap_err(),
            ProtoError::KeyWidth {
                expected: 8,
                got: 7
            }
        ));
        let mut out = Vec::new();
        put_multi_get(&mut out, &[[0u8; 8]; 3]);
        assert!(matches!(
            parse(op::MULTI_GET, &out[5..], 8, &lim).unwrap_err(),
            ProtoError::BatchTooLarge { count: 3, .. }
        ));
        assert_eq!(
            parse(0x7f, &[], 8, &lim).unwrap_err(),
            ProtoError::UnknownType(0x7f)
        );
        let mut h = Vec::new();
        put_hello(&mut h, 8, Role::Read, b"", b"");
        h[9] = 9; // version low byte
        assert_eq!(
            parse(op::HELLO, &h[5..], 0, &lim).unwrap_err(),
            ProtoError::BadVersion { got: 9 }
        );
        // A SET whose last entry is cut short.
        let mut s = Vec::new();
        put_set(&mut s, 1, &[([1u8; 8], vec![1u8; 4])]);
        assert!(matches!(
            parse(op::SET, &s[5..s.len() - 1], 8, &lim).unwrap_err(),
            ProtoError::Malformed { .. }
        ));
    }
}
