//! The feed reader (docs/cluster.md, "Many mounts, one truth"): one thread
//! per mount, on a plain connection of its own to the metadata master
//! (found with the topology, found again after an error or a failover,
//! with a capped backoff), doing `XREAD BLOCK 1000 STREAMS {V}:feed <last
//! id>`. Each entry another session made goes to the [`Sink`]; when the
//! connection was lost, or the stream was trimmed past the last id read,
//! entries may have been missed, and the sink is told to drop everything
//! ([`Sink::lost`]), and reading goes on from the stream's end.
//!
//! After a batch that held another session's entry is applied, the reader
//! acks it: `HSET {V}:acks <sid> <last id applied>`, which a writer's close
//! waits for (crate::data `Data::await_acks`). And it notes when it sent its
//! last *caught-up* read (one whose reply it applied whole, or that came
//! back empty after its block): an open is served from the cache only
//! shortly after one ([`State::fresh`], volume.rs `Inner::revalidate`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use redis::Value;

use crate::error::{Error, Result};
use crate::keys::Keys;
use crate::session::Stop;
use crate::topology::{Topology, connect};

/// Entries asked for per read.
const COUNT: usize = 1000;
/// The block of one read, in ms: also the bound on noticing a stop.
const BLOCK_MS: u64 = 1000;
/// The pause after a batch that held only this mount's own entries, before
/// the next read. Without it every change a mount makes wakes its own
/// reader (the blocked `XREAD` is served at once), and on a busy mount
/// that costs a thread wake here and a reply and a new `XREAD` on the
/// metadata master per change: 25 µs of a create's 190 measured
/// (tests/volume.rs `diag_metadata_path`, feed paused against running).
/// With it a busy mount's reader wakes at most 500 times a second, and
/// another mount's change reaches it at most this much later than one
/// feed round trip, only while this mount is itself changing the tree.
pub const OWN_PAUSE: Duration = Duration::from_millis(2);
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How recent the last caught-up read's send must be for an open to be
/// served from the cache: above [`BLOCK_MS`] (an idle reader sends one a
/// block apart) and below crate::data::ACK_WAIT (a writer's close that
/// did not get this reader's ack returns only after that: by then this
/// reader's last caught-up read, sent before the change, is too old).
pub const FRESH: Duration = Duration::from_millis(1500);

/// What the reader shares with the mount: when it was last caught up, and
/// a pause (tests: a reader that has stopped reading, deterministically).
#[derive(Default)]
pub struct State {
    /// The send instant of the last caught-up read, and the session id
    /// when it was sent.
    caught_up: Mutex<Option<(Instant, u64)>>,
    pause: Mutex<Pause>,
    cv: Condvar,
}

#[derive(Default)]
struct Pause {
    asked: bool,
    parked: bool,
}

impl State {
    /// Whether every entry another session appended before a moment less
    /// than [`FRESH`] ago is applied here, read under session `sid`.
    pub fn fresh(&self, sid: u64) -> bool {
        self.caught_up
            .lock()
            .is_some_and(|(sent, s)| s == sid && sent.elapsed() < FRESH)
    }

    fn caught_up(&self, sent: Instant, sid: u64) {
        *self.caught_up.lock() = Some((sent, sid));
    }

    /// Pauses the reader (`on`) between two reads, and waits until it is
    /// parked, at most `within` (its read in flight ends within its block
    /// plus the connection's timeout); or lets it go on. Returns whether it
    /// is parked (or, `on` false, true).
    pub fn pause(&self, on: bool, within: Duration) -> bool {
        let mut p = self.pause.lock();
        p.asked = on;
        self.cv.notify_all();
        if !on {
            return true;
        }
        let deadline = Instant::now() + within;
        while !p.parked {
            if self.cv.wait_until(&mut p, deadline).timed_out() {
                return p.parked;
            }
        }
        true
    }

    /// The reader's side: stays here while paused (or until `stop`,
    /// looked at every 50 ms).
    fn park(&self, stop: &Stop) {
        let mut p = self.pause.lock();
        if !p.asked {
            return;
        }
        p.parked = true;
        self.cv.notify_all();
        while p.asked && !stop.is_stopped() {
            self.cv.wait_for(&mut p, Duration::from_millis(50));
        }
        p.parked = false;
    }
}

/// One feed entry, as the scripts write it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    pub sid: u64,
    pub op: String,
    pub ino: u64,
    /// `parent`, `name`.
    pub name: Option<(u64, Vec<u8>)>,
    /// A rename's `parent2`, `name2`.
    pub name2: Option<(u64, Vec<u8>)>,
    /// A rename's replaced node (`ino2`), 0 for none.
    pub ino2: u64,
}

/// Where the entries go.
pub trait Sink: Send + Sync {
    /// Whether `sid` is (or was) this mount's session: its entries are
    /// skipped (the mount applied its own changes already).
    fn is_mine(&self, sid: u64) -> bool;
    fn entry(&self, e: &Entry);
    /// Entries may have been missed: drop every cache.
    fn lost(&self);
    /// The mount's session now (its acks are filed under it); 0: none.
    fn sid(&self) -> u64;
}

/// A stream id `ms-seq`, ordered.
pub(crate) fn id_of(s: &str) -> (u64, u64) {
    let (a, b) = s.split_once('-').unwrap_or((s, "0"));
    (a.parse().unwrap_or(0), b.parse().unwrap_or(0))
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn raw(v: &Value) -> Vec<u8> {
    match v {
        Value::BulkString(b) => b.clone(),
        Value::SimpleString(s) => s.clone().into_bytes(),
        _ => Vec::new(),
    }
}

/// The entry of one stream item's field list.
fn parse_entry(fields: &[Value]) -> Entry {
    let mut e = Entry::default();
    let (mut p, mut n, mut p2, mut n2) = (None, None, None, None);
    for kv in fields.chunks(2) {
        let [k, v] = kv else { continue };
        let num = || text(v).and_then(|t| t.parse::<u64>().ok()).unwrap_or(0);
        match text(k).as_deref() {
            Some("sid") => e.sid = num(),
            Some("op") => e.op = text(v).unwrap_or_default(),
            Some("ino") => e.ino = num(),
            Some("ino2") => e.ino2 = num(),
            Some("parent") => p = Some(num()),
            Some("name") => n = Some(raw(v)),
            Some("parent2") => p2 = Some(num()),
            Some("name2") => n2 = Some(raw(v)),
            _ => {}
        }
    }
    e.name = p.zip(n);
    e.name2 = p2.zip(n2);
    e
}

/// The items of an XREAD reply: `(id, entry)`.
fn parse_read(v: &Value) -> Result<Vec<(String, Entry)>> {
    let bad = || Error::Protocol(format!("XREAD: {v:?}"));
    let streams: Vec<&Value> = match v {
        Value::Nil => return Ok(Vec::new()),
        Value::Array(a) => a.iter().collect(),
        Value::Map(m) => m.iter().map(|(_, v)| v).collect(),
        _ => return Err(bad()),
    };
    let mut out = Vec::new();
    for s in streams {
        let items = match s {
            Value::Array(a) if a.len() == 2 => &a[1],
            other => other,
        };
        let Value::Array(items) = items else {
            return Err(bad());
        };
        for it in items {
            let Value::Array(pair) = it else {
                return Err(bad());
            };
            let (Some(id), Some(Value::Array(fields))) = (pair.first().and_then(text), pair.get(1))
            else {
                return Err(bad());
            };
            out.push((id, parse_entry(fields)));
        }
    }
    Ok(out)
}

/// The reader; [`Reader::run`] is the thread's body.
pub struct Reader {
    pub seeds: Vec<String>,
    pub keys: Keys,
    pub timeout: Duration,
    pub state: Arc<State>,
}

impl Reader {
    fn connect(&self) -> Result<redis::Connection> {
        let meta = self.keys.meta();
        let t = Topology::fetch(&self.seeds, self.timeout)?;
        let m = t
            .master_of_key(meta.as_bytes())
            .ok_or_else(|| Error::Protocol("no master serves the volume's slot".into()))?;
        // Longer than a read's block, or every empty read would time out.
        connect(
            &m.addr,
            self.timeout.max(Duration::from_millis(BLOCK_MS * 3)),
        )
    }

    /// The stream's last id now.
    fn end_id(&self, c: &mut redis::Connection) -> Result<String> {
        let v: Value = redis::cmd("XREVRANGE")
            .arg(self.keys.feed_key())
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query(c)?;
        Ok(first_id(&v).unwrap_or_else(|| "0-0".into()))
    }

    /// Whether entries after `last` were trimmed away.
    fn trimmed(&self, c: &mut redis::Connection, last: &str) -> Result<bool> {
        let v: Value = redis::cmd("XRANGE")
            .arg(self.keys.feed_key())
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(1)
            .query(c)?;
        Ok(first_id(&v).is_some_and(|first| id_of(&first) > id_of(last)))
    }

    /// Reads from `start` until `stop`.
    pub fn run(self, start: String, stop: Arc<Stop>, sink: Arc<dyn Sink>) {
        let mut last = start;
        let mut con: Option<redis::Connection> = None;
        let mut backoff = BACKOFF_MIN;
        // The first connection starts where the session was registered:
        // nothing was missed. Any later one follows a failure.
        let mut lost = false;
        while !stop.is_stopped() {
            self.state.park(&stop);
            if stop.is_stopped() {
                break;
            }
            let c = match con.as_mut() {
                Some(c) => c,
                None => match self.connect() {
                    Ok(mut c) => {
                        if lost {
                            // Whatever happened while away is unknown:
                            // drop it all and go on from the end. The end
                            // first, then the drop: a read that fills the
                            // cache after the drop is then covered by the
                            // entries after that end (the other order lost
                            // a change made between the two for good).
                            if let Ok(id) = self.end_id(&mut c) {
                                last = id;
                            }
                            sink.lost();
                        }
                        lost = true;
                        con.insert(c)
                    }
                    Err(e) => {
                        lost = true;
                        tracing::warn!(error = %e, "feed: cannot reach the metadata master");
                        if stop.wait(backoff) {
                            break;
                        }
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                        continue;
                    }
                },
            };
            match self.read(c, &mut last, sink.as_ref()) {
                // The backoff starts again only once a read succeeded: a
                // node that accepts connections but fails every read
                // (CLUSTERDOWN while a failover is decided) would
                // otherwise be asked again at once, thousands of times a
                // second, each time emptying the cache.
                Ok(own_only) => {
                    backoff = BACKOFF_MIN;
                    if own_only && stop.wait(OWN_PAUSE) {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, ?backoff, "feed: read failed; reconnecting");
                    con = None;
                    sink.lost();
                    if stop.wait(backoff) {
                        break;
                    }
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }

    /// One read and its batch applied; true when the batch held entries
    /// and all were this mount's own.
    fn read(&self, c: &mut redis::Connection, last: &mut String, sink: &dyn Sink) -> Result<bool> {
        // Before the send: the session the read is made under, and when.
        let sid = sink.sid();
        let sent = Instant::now();
        let v: Value = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(COUNT)
            .arg("BLOCK")
            .arg(BLOCK_MS)
            .arg("STREAMS")
            .arg(self.keys.feed_key())
            .arg(last.as_str())
            .query(c)?;
        let items = parse_read(&v)?;
        if items.len() >= COUNT && self.trimmed(c, last)? {
            sink.lost();
        }
        let mut others = false;
        for (id, e) in &items {
            if !sink.is_mine(e.sid) {
                sink.entry(e);
                others = true;
            }
            last.clone_from(id);
        }
        // Applied: a writer waiting for this mount may go on. One call per
        // batch, on this connection, in the volume's slot. A refused ack
        // (a master over `maxmemory`: OOM) only makes writers wait their
        // bound; it is no reason to drop the cache, as a lost connection is.
        let now = sink.sid();
        if others && now != 0 {
            let acked = redis::cmd("HSET")
                .arg(self.keys.acks_key())
                .arg(now)
                .arg(last.as_str())
                .exec(c);
            match acked {
                Err(e) if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() => {
                    return Err(e.into());
                }
                Err(e) => tracing::debug!(error = %e, "feed: ack refused"),
                Ok(()) => {}
            }
        }
        // A full batch may have left entries behind: not caught up.
        if items.len() < COUNT {
            self.state.caught_up(sent, sid);
        }
        Ok(!items.is_empty() && !others)
    }
}

fn first_id(v: &Value) -> Option<String> {
    let Value::Array(a) = v else { return None };
    let Value::Array(item) = a.first()? else {
        return None;
    };
    item.first().and_then(text)
}

/// The feed's keys.
pub trait FeedKey {
    fn feed_key(&self) -> String;
    /// `{V}:acks`: session id → the last feed id its reader applied.
    fn acks_key(&self) -> String;
}

impl FeedKey for Keys {
    fn feed_key(&self) -> String {
        format!("{{{}}}:feed", self.name())
    }

    fn acks_key(&self) -> String {
        format!("{{{}}}:acks", self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse() {
        let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let v = Value::Array(vec![Value::Array(vec![
            b("{v}:feed"),
            Value::Array(vec![Value::Array(vec![
                b("5-1"),
                Value::Array(vec![
                    b("sid"),
                    b("3"),
                    b("op"),
                    b("rename"),
                    b("ino"),
                    b("9"),
                    b("parent"),
                    b("1"),
                    b("name"),
                    b("a"),
                    b("parent2"),
                    b("2"),
                    b("name2"),
                    b("b"),
                ]),
            ])]),
        ])]);
        let items = parse_read(&v).unwrap();
        assert_eq!(items.len(), 1);
        let (id, e) = &items[0];
        assert_eq!(id, "5-1");
        assert_eq!((e.sid, e.op.as_str(), e.ino), (3, "rename", 9));
        assert_eq!(e.name, Some((1, b"a".to_vec())));
        assert_eq!(e.name2, Some((2, b"b".to_vec())));
        assert!(id_of("10-0") > id_of("9-5"));
        assert!(parse_read(&Value::Nil).unwrap().is_empty());
    }
}
