//! Block data over RESP connections of our own (docs/cluster.md, "The
//! block path"): a block's bytes go from its `Arc` straight to the socket
//! (`writev`), and a `GET` reply is read straight into the `Vec` that
//! becomes the cached block. The `redis` crate copies each block into its
//! command and again into a pipeline buffer per master, and parses
//! replies with a combinator over a growing buffer: on 1 MiB reads and
//! writes that was most of a mount's CPU beside the kernel's own copies.
//!
//! Only `SET`, `GET` and `UNLINK` of block keys, only the replies they
//! give when all is well. Anything else (`MOVED` or `ASK` after a
//! failover or a resharding, an error reply such as `OOM`, a broken or
//! slow connection, a slot map not known yet) is a [`Miss`]: the caller
//! runs the same batch through the `redis` crate, which follows
//! redirections, retries what is transient and maps errors to errnos.
//! Every command here may run twice (a block id is never reused; an
//! `UNLINK` of a gone key changes nothing), so a batch that half ran
//! before its miss is safe to send again. The slot map is dropped on any
//! miss and read again at most every [`REFETCH_EVERY`], so a failover
//! costs the fast path, never correctness.
//!
//! Bounds: connecting, every read and every write wait at most the pool's
//! timeout; a miss then costs the crate's own bounded retry on top.

use std::collections::HashMap;
use std::io::{self, IoSlice, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::slot::{SLOTS, key_slot};
use crate::topology::Topology;

/// Idle connections kept per master.
const IDLE_PER_MASTER: usize = 16;
/// The least time between two reads of the slot map: a failover makes
/// every batch miss until the cluster agrees again, and each would
/// otherwise open a connection to ask.
const REFETCH_EVERY: Duration = Duration::from_millis(250);
/// The longest reply line this path accepts (`+OK`, `:1`, `$65536`).
const MAX_LINE: usize = 512;
/// Bytes of a connection's read buffer: the small replies and the head
/// of a bulk reply; a bulk's body is read past it into its own `Vec`.
const READ_BUF: usize = 16 << 10;
/// The largest bulk reply Redis sends (`proto-max-bulk-len`).
const MAX_BULK: usize = 512 << 20;

/// Why a batch did not go through this path; the caller sends it again
/// through the `redis` crate.
#[derive(Debug)]
pub struct Miss {
    pub why: String,
    /// Whether the slot map may be what failed (a redirection, a node
    /// gone): then it is read again before the next batch.
    reroute: bool,
}

impl Miss {
    fn new(why: impl Into<String>) -> Miss {
        Miss {
            why: why.into(),
            reroute: false,
        }
    }

    /// A miss that the slot map may explain.
    fn reroute(why: impl Into<String>) -> Miss {
        Miss {
            why: why.into(),
            reroute: true,
        }
    }
}

type Fast<T> = std::result::Result<T, Miss>;

impl From<io::Error> for Miss {
    fn from(e: io::Error) -> Miss {
        Miss::reroute(format!("I/O: {e}"))
    }
}

/// Which master serves each slot, as one `CLUSTER SLOTS` said: the
/// masters as read (the fsync's `WAIT`s go by them: one slot map a mount,
/// read once after a failover for both) and a table for this path.
struct Route {
    topology: Arc<Topology>,
    masters: Vec<SocketAddr>,
    /// Index into `masters` per slot; `u16::MAX`: not served.
    of_slot: Vec<u16>,
}

impl Route {
    fn new(t: Arc<Topology>) -> Fast<Route> {
        let mut masters = Vec::with_capacity(t.masters.len());
        let mut of_slot = vec![u16::MAX; usize::from(SLOTS)];
        for (i, m) in t.masters.iter().enumerate() {
            let addr = m
                .addr
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| Miss::new(format!("master address {:?}", m.addr)))?;
            let i = u16::try_from(i).map_err(|_| Miss::new("over 65535 masters"))?;
            masters.push(addr);
            for &(a, b) in &m.slots {
                for s in a..=b.min(SLOTS - 1) {
                    of_slot[usize::from(s)] = i;
                }
            }
        }
        Ok(Route {
            topology: t,
            masters,
            of_slot,
        })
    }

    /// The master of `key`.
    fn master(&self, key: &[u8]) -> Fast<usize> {
        match self.of_slot[usize::from(key_slot(key))] {
            u16::MAX => Err(Miss::reroute("a slot no master serves")),
            i => Ok(usize::from(i)),
        }
    }
}

/// One command of a batch, as it goes out.
#[derive(Clone, Copy)]
enum Op<'a> {
    Set(&'a [u8], &'a [u8]),
    Get(&'a [u8]),
    Unlink(&'a [u8]),
}

impl Op<'_> {
    fn key(&self) -> &[u8] {
        match self {
            Op::Set(k, _) | Op::Get(k) | Op::Unlink(k) => k,
        }
    }
}

/// A reply as this path reads it.
enum Reply {
    Ok,
    Int,
    Null,
    Bulk(usize),
}

/// A connection to one master, with a read buffer of its own.
struct Conn {
    s: TcpStream,
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
}

impl Conn {
    fn open(addr: SocketAddr, timeout: Duration) -> Fast<Conn> {
        let s = TcpStream::connect_timeout(&addr, timeout)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        Ok(Conn {
            s,
            buf: vec![0; READ_BUF].into_boxed_slice(),
            pos: 0,
            end: 0,
        })
    }

    /// Sends `ops` in one stream of `writev`s: the heads of the commands
    /// from one small buffer, each `SET`'s value from where it lies.
    fn send(&mut self, ops: &[Op]) -> Fast<()> {
        let mut heads = Vec::with_capacity(ops.len() * 48);
        let mut cuts = Vec::with_capacity(ops.len());
        for op in ops {
            let (name, argc): (&[u8], usize) = match op {
                Op::Set(..) => (b"SET", 3),
                Op::Get(_) => (b"GET", 2),
                Op::Unlink(_) => (b"UNLINK", 2),
            };
            push_head(&mut heads, argc, &[name, op.key()]);
            if let Op::Set(_, v) = op {
                push_len(&mut heads, b'$', v.len());
            }
            cuts.push(heads.len());
            if matches!(op, Op::Set(..)) {
                // The value's CRLF leads the next head (or the tail).
                heads.extend_from_slice(b"\r\n");
            }
        }
        let mut slices = Vec::with_capacity(ops.len() * 2 + 1);
        let mut from = 0;
        for (op, &cut) in ops.iter().zip(&cuts) {
            slices.push(IoSlice::new(&heads[from..cut]));
            if let Op::Set(_, v) = op {
                slices.push(IoSlice::new(v));
            }
            from = cut;
        }
        slices.push(IoSlice::new(&heads[from..]));
        write_all(&mut self.s, &mut slices)?;
        Ok(())
    }

    /// The next reply's kind; an error reply is a miss.
    fn reply(&mut self) -> Fast<Reply> {
        let line = self.line()?;
        let (&kind, rest) = line
            .split_first()
            .ok_or_else(|| Miss::new("an empty reply line"))?;
        let number = || -> Fast<i64> {
            std::str::from_utf8(rest)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| Miss::new(format!("reply {:?}", String::from_utf8_lossy(line))))
        };
        match kind {
            b'+' if rest == b"OK" => Ok(Reply::Ok),
            b':' => number().map(|_| Reply::Int),
            b'$' => match number()? {
                -1 => Ok(Reply::Null),
                n if (0..=MAX_BULK as i64).contains(&n) => Ok(Reply::Bulk(n as usize)),
                n => Err(Miss::new(format!("a bulk of {n} bytes"))),
            },
            b'-' if [&b"MOVED "[..], b"ASK ", b"CLUSTERDOWN ", b"TRYAGAIN "]
                .iter()
                .any(|p| rest.starts_with(p)) =>
            {
                Err(Miss::reroute(String::from_utf8_lossy(rest)))
            }
            _ => Err(Miss::new(format!(
                "reply {:?}",
                String::from_utf8_lossy(line)
            ))),
        }
    }

    /// The next line, without its CRLF.
    fn line(&mut self) -> Fast<&[u8]> {
        loop {
            let have = &self.buf[self.pos..self.end];
            if let Some(i) = have.iter().position(|&b| b == b'\n') {
                let start = self.pos;
                self.pos += i + 1;
                if i == 0 || self.buf[start + i - 1] != b'\r' {
                    return Err(Miss::new("a reply line without CRLF"));
                }
                return Ok(&self.buf[start..start + i - 1]);
            }
            if have.len() >= MAX_LINE {
                return Err(Miss::new("a reply line too long"));
            }
            self.fill()?;
        }
    }

    /// Reads more into the buffer, moving what is left to its start.
    fn fill(&mut self) -> Fast<()> {
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.end, 0);
            self.end -= self.pos;
            self.pos = 0;
        }
        let n = read_some(&mut self.s, &mut self.buf[self.end..])?;
        self.end += n;
        Ok(())
    }

    /// A bulk reply's `n` bytes and its CRLF: what the buffer holds, then
    /// the rest straight from the socket into the block's own `Vec`
    /// (reserved, never zeroed: `read_to_end` reads into spare capacity).
    fn bulk(&mut self, n: usize) -> Fast<Vec<u8>> {
        let mut v = Vec::with_capacity(n);
        let buffered = (self.end - self.pos).min(n);
        v.extend_from_slice(&self.buf[self.pos..self.pos + buffered]);
        self.pos += buffered;
        let rest = (n - buffered) as u64;
        if rest > 0 {
            (&mut self.s).take(rest).read_to_end(&mut v)?;
        }
        if v.len() != n {
            return Err(Miss::new(format!("a bulk cut at {} of {n} bytes", v.len())));
        }
        if !self.line()?.is_empty() {
            return Err(Miss::new("a bulk longer than it said"));
        }
        Ok(v)
    }
}

/// One read, again after EINTR; end of stream is an error.
fn read_some(s: &mut TcpStream, into: &mut [u8]) -> io::Result<usize> {
    loop {
        match s.read(into) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// `writev` until every slice is out (`Write::write_all_vectored` is not
/// stable yet).
fn write_all(s: &mut TcpStream, mut slices: &mut [IoSlice]) -> io::Result<()> {
    while !slices.is_empty() {
        match s.write_vectored(slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `*argc`, then each of `parts` as a bulk string.
fn push_head(out: &mut Vec<u8>, argc: usize, parts: &[&[u8]]) {
    push_len(out, b'*', argc);
    for p in parts {
        push_len(out, b'$', p.len());
        out.extend_from_slice(p);
        out.extend_from_slice(b"\r\n");
    }
}

fn push_len(out: &mut Vec<u8>, kind: u8, n: usize) {
    out.push(kind);
    out.extend_from_slice(n.to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Block commands over connections of our own, shared by a mount's
/// threads (each batch takes a connection per master it needs and puts
/// it back after a clean exchange).
pub struct Direct {
    seeds: Vec<String>,
    timeout: Duration,
    route: RwLock<Option<Arc<Route>>>,
    /// When the slot map was last asked for.
    fetched: Mutex<Option<Instant>>,
    idle: Mutex<HashMap<SocketAddr, Vec<Conn>>>,
}

impl Direct {
    pub fn new(seeds: &[String], timeout: Duration) -> Direct {
        Direct {
            seeds: seeds.to_vec(),
            timeout,
            route: RwLock::new(None),
            fetched: Mutex::new(None),
            idle: Mutex::new(HashMap::new()),
        }
    }

    /// `SET` each `(key, value)`, then `UNLINK` each of `unlink`.
    pub fn set(&self, blocks: &[(&[u8], &[u8])], unlink: &[&[u8]]) -> Fast<()> {
        let ops: Vec<Op> = blocks
            .iter()
            .map(|&(k, v)| Op::Set(k, v))
            .chain(unlink.iter().map(|&k| Op::Unlink(k)))
            .collect();
        self.run(&ops, |_, r| match r {
            Reply::Ok | Reply::Int => Ok(()),
            _ => Err(Miss::new(
                "a SET or UNLINK reply that is neither OK nor a count",
            )),
        })
        .map(|_: Vec<()>| ())
    }

    /// `GET` each of `keys`: its value, or `None` where the cluster has no
    /// such key.
    pub fn get(&self, keys: &[&[u8]]) -> Fast<Vec<Option<Vec<u8>>>> {
        let ops: Vec<Op> = keys.iter().map(|&k| Op::Get(k)).collect();
        self.run(&ops, |c, r| match r {
            Reply::Null => Ok(None),
            Reply::Bulk(n) => c.bulk(n).map(Some),
            _ => Err(Miss::new("a GET reply that is neither a bulk nor nil")),
        })
    }

    /// Sends every master its share of `ops` before reading any reply, so
    /// that the masters work at once, then reads each master's replies in
    /// order through `each`; the results in the order of `ops`. A miss
    /// anywhere drops every connection of the batch (their streams may
    /// hold unread replies), and the slot map where it may be the cause.
    fn run<T>(
        &self,
        ops: &[Op],
        mut each: impl FnMut(&mut Conn, Reply) -> Fast<T>,
    ) -> Fast<Vec<T>> {
        let route = self.route()?;
        let out = self.exchange(&route, ops, &mut each);
        if matches!(&out, Err(m) if m.reroute) {
            // Only the map this batch went by: another thread may have
            // stored a newer one meanwhile, which must stay.
            let mut known = self.route.write();
            if known.as_ref().is_some_and(|r| Arc::ptr_eq(r, &route)) {
                *known = None;
            }
        }
        out
    }

    fn exchange<T>(
        &self,
        route: &Route,
        ops: &[Op],
        each: &mut impl FnMut(&mut Conn, Reply) -> Fast<T>,
    ) -> Fast<Vec<T>> {
        let mut per: Vec<Vec<usize>> = vec![Vec::new(); route.masters.len()];
        for (i, op) in ops.iter().enumerate() {
            per[route.master(op.key())?].push(i);
        }
        let mut conns = Vec::new();
        for (m, idx) in per.iter().enumerate().filter(|(_, v)| !v.is_empty()) {
            let mut c = self.take(route.masters[m])?;
            let mine: Vec<Op> = idx.iter().map(|&i| ops[i]).collect();
            c.send(&mine)?;
            conns.push((m, c));
        }
        let mut got: Vec<Option<T>> = (0..ops.len()).map(|_| None).collect();
        for (m, c) in &mut conns {
            for &i in &per[*m] {
                let r = c.reply()?;
                got[i] = Some(each(c, r)?);
            }
        }
        for (m, c) in conns {
            self.put(route.masters[m], c);
        }
        debug_assert!(got.iter().all(Option::is_some), "every op has its reply");
        got.into_iter()
            .map(|g| g.ok_or_else(|| Miss::new("a reply missing")))
            .collect()
    }

    /// The slot map: the one known, or a fresh one if the last ask is
    /// [`REFETCH_EVERY`] ago. Its misses do not drop the slot map: there
    /// was none when they began, and another thread may have stored one
    /// since, which must stay.
    fn route(&self) -> Fast<Arc<Route>> {
        if let Some(r) = self.route.read().clone() {
            return Ok(r);
        }
        {
            let mut fetched = self.fetched.lock();
            if let Some(r) = self.route.read().clone() {
                return Ok(r);
            }
            if fetched.is_some_and(|t| t.elapsed() < REFETCH_EVERY) {
                return Err(Miss::new("the slot map is being read again"));
            }
            *fetched = Some(Instant::now());
        }
        let t = Topology::fetch(&self.seeds, self.timeout)
            .map_err(|e| Miss::new(format!("CLUSTER SLOTS: {e}")))?;
        self.store(Arc::new(t))
    }

    /// Keeps `t` as the slot map if every slot is served and every master
    /// reachable by address; a miss otherwise (nothing stored).
    fn store(&self, t: Arc<Topology>) -> Fast<Arc<Route>> {
        if t.uncovered() > 0 {
            return Err(Miss::new(format!("{} slots unserved", t.uncovered())));
        }
        let r = Arc::new(Route::new(t)?);
        *self.route.write() = Some(r.clone());
        Ok(r)
    }

    /// The cluster's masters as this path knows them, or (`fresh`, or
    /// none known) as read now, which this path then routes by too. Not
    /// held to [`REFETCH_EVERY`]: its one caller, an fsync's `WAIT`s, reads
    /// at most twice per fsync (no map known, then a `WAIT` that failed),
    /// and must see a failover.
    pub fn topology(&self, fresh: bool) -> crate::error::Result<Arc<Topology>> {
        if !fresh && let Some(r) = self.route.read().clone() {
            return Ok(r.topology.clone());
        }
        let t = Arc::new(Topology::fetch(&self.seeds, self.timeout)?);
        *self.fetched.lock() = Some(Instant::now());
        if let Err(m) = self.store(t.clone()) {
            tracing::debug!(why = %m.why, "the block path keeps no slot map");
        }
        Ok(t)
    }

    fn take(&self, addr: SocketAddr) -> Fast<Conn> {
        let idle = self.idle.lock().get_mut(&addr).and_then(Vec::pop);
        match idle {
            Some(c) => Ok(c),
            None => Conn::open(addr, self.timeout),
        }
    }

    fn put(&self, addr: SocketAddr, c: Conn) {
        debug_assert_eq!(c.pos, c.end, "a connection put back with unread bytes");
        let mut idle = self.idle.lock();
        let v = idle.entry(addr).or_default();
        if v.len() < IDLE_PER_MASTER {
            v.push(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_are_resp() {
        let mut out = Vec::new();
        push_head(&mut out, 2, &[b"GET", b"b:{v.1}"]);
        assert_eq!(out, b"*2\r\n$3\r\nGET\r\n$7\r\nb:{v.1}\r\n");
    }
}
