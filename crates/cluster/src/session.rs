//! Sessions (docs/cluster.md, "Sessions and fencing"): a mount registers
//! one (`HINCRBY {V}:next session 1`, the hash `{V}:s:<sid>` with host,
//! pid, mountpoint and start time, and its lease deadline in
//! `{V}:sessions` by the server's clock), renews it every lease/4 from a
//! thread of its own, and on each renewal reaps what dead sessions left:
//! their locks (the `l:<ino hex>` fields of their hash name the lock
//! hashes; their fields `<sid>:...` go, and an `unlock` feed entry wakes
//! the waiters), their holds of orphans, and orphans older than one lease
//! that nobody holds (freed, with a `reap` feed entry). All in one script.
//!
//! The session id in keys and in the sorted set is decimal (as the scripts
//! get it in `ARGV[2]`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use redis::{Script, Value};

use crate::errno::errno_of;
use crate::error::Result;
use crate::handle::{Handle, now_ns};
use crate::lua;
use crate::namespace::{self, NS_PRELUDE, run};

/// Registers a session: ARGV host, pid, mountpoint, started, lease ms →
/// `{sid, the feed's last id}`. Not fenced: there is no session yet.
/// EBUSY while `memfs volume clean` runs (`{V}:cleaning`): it frees the
/// blocks no map names, which a session's commits could still name.
const REGISTER: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then fail('ENOENT') end
if redis.call('EXISTS', P .. 'cleaning') == 1 then fail('EBUSY') end
local sid = redis.call('HINCRBY', P .. 'next', 'session', 1)
redis.call('HSET', P .. 's:' .. sid, 'host', ARGV[4], 'pid', ARGV[5],
  'mountpoint', ARGV[6], 'started', ARGV[7])
redis.call('ZADD', P .. 'sessions', now_ms() + tonumber(ARGV[8]), sid)
local last = redis.call('XREVRANGE', P .. 'feed', '+', '-', 'COUNT', 1)
local id = '0-0'
if last[1] then id = last[1][1] end
return {sid, id}
"#;

/// Renews the caller's lease (ARGV lease ms, grace ms) and reaps; →
/// `{sessions reaped, freed block map values, freed inos, unlocked inos}`
/// (the inos: the reaping mount skips its own feed entries, so it is told
/// here).
const RENEW: &str = r#"
local lease, grace = tonumber(ARGV[4]), tonumber(ARGV[5])
fence()
local now = now_ms()
redis.call('ZADD', P .. 'sessions', 'XX', now + lease, SID)
local freed, inos, unlocked, reaped = {}, {}, {}, 0
for _, s in ipairs(redis.call('ZRANGEBYSCORE', P .. 'sessions', '-inf', '(' .. now, 'LIMIT', 0, 16)) do
  local sk = P .. 's:' .. s
  local pre = s .. ':'
  for _, field in ipairs(redis.call('HKEYS', sk)) do
    if string.sub(field, 1, 2) == 'l:' then
      local lk = P .. 'l:' .. string.sub(field, 3)
      for _, lf in ipairs(redis.call('HKEYS', lk)) do
        if string.sub(lf, 1, #pre) == pre then redis.call('HDEL', lk, lf) end
      end
      local lino = tonumber(string.sub(field, 3), 16)
      unlocked[#unlocked + 1] = lino
      feed('op', 'unlock', 'ino', lino)
    end
  end
  redis.call('DEL', sk)
  redis.call('ZREM', P .. 'sessions', s)
  redis.call('HDEL', P .. 'acks', s)
  reaped = reaped + 1
end
local live = redis.call('ZRANGE', P .. 'sessions', 0, -1)
for _, o in ipairs(redis.call('ZRANGEBYSCORE', P .. 'orphans', '-inf', now - grace, 'LIMIT', 0, 64)) do
  local ino = tonumber(o)
  local field = 'o:' .. hex(ino)
  local held = false
  for _, s in ipairs(live) do
    if redis.call('HEXISTS', P .. 's:' .. s, field) == 1 then held = true; break end
  end
  if not held then
    for _, v in ipairs(free_node(ino, true)) do freed[#freed + 1] = v end
    inos[#inos + 1] = ino
    feed('op', 'reap', 'ino', ino)
  end
end
return {reaped, freed, inos, unlocked}
"#;

/// Ends the caller's session (its holds go with its hash).
const END: &str = r#"
redis.call('DEL', P .. 's:' .. SID)
redis.call('ZREM', P .. 'sessions', SID)
redis.call('HDEL', P .. 'acks', SID)
return 1
"#;

/// A stop signal every thread of a mount waits on, with a bound.
#[derive(Default)]
pub struct Stop {
    stopped: Mutex<bool>,
    cv: Condvar,
}

impl Stop {
    pub fn stop(&self) {
        *self.stopped.lock() = true;
        self.cv.notify_all();
    }

    pub fn is_stopped(&self) -> bool {
        *self.stopped.lock()
    }

    /// Waits `d` or until stopped; true when stopped.
    pub fn wait(&self, d: Duration) -> bool {
        let deadline = Instant::now() + d;
        let mut s = self.stopped.lock();
        while !*s {
            if self.cv.wait_until(&mut s, deadline).timed_out() {
                break;
            }
        }
        *s
    }
}

/// The state of this mount's lease, shared with the lease thread.
pub struct Lease {
    pub ok: AtomicBool,
    /// Until when the lease surely runs by this process's clock: the send
    /// instant of the last registration or renewal that succeeded, plus
    /// the lease, minus [`Lease::margin`] (the server set its deadline
    /// after that send, by its clock: only the two clocks' rates may
    /// differ). None: not known to be live.
    valid_until: Mutex<Option<Instant>>,
    /// Sessions this mount's renewals reaped.
    pub reaped: AtomicU64,
    lease: Duration,
    mountpoint: String,
}

impl Lease {
    /// What the estimate of [`Lease::live`] leaves for the clocks' rates
    /// and the time between the check and its use.
    fn margin(&self) -> Duration {
        self.lease / 8
    }

    /// Whether the session surely still holds its lease. A session whose
    /// deadline passed can never renew again (`fence`), so live now and
    /// the same session id means live since it was registered.
    pub fn live(&self) -> bool {
        self.valid_until.lock().is_some_and(|t| Instant::now() < t)
    }

    fn renewed(&self, sent: Instant) {
        let until = (sent + self.lease).checked_sub(self.margin());
        *self.valid_until.lock() = until;
    }

    fn dead(&self) {
        *self.valid_until.lock() = None;
    }
}

/// What a renewal's reap freed.
pub struct Reaped {
    /// The block map values of the freed nodes.
    pub freed: Vec<Vec<u8>>,
    pub inos: Vec<u64>,
    /// Inodes whose locks a dead session held.
    pub unlocked: Vec<u64>,
}

/// The session scripts.
pub struct Session {
    register: Script,
    renew: Script,
    end: Script,
    pub lease: Arc<Lease>,
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u128::from(u64::MAX)) as u64
}

impl Session {
    pub fn new(lease: Duration, mountpoint: &str) -> Session {
        let s = |b: &str| Script::new(&lua::script_with(NS_PRELUDE, b));
        Session {
            register: s(REGISTER),
            renew: s(RENEW),
            end: s(END),
            lease: Arc::new(Lease {
                ok: AtomicBool::new(false),
                valid_until: Mutex::new(None),
                reaped: AtomicU64::new(0),
                lease,
                mountpoint: mountpoint.to_string(),
            }),
        }
    }

    /// Registers a new session and makes it `h`'s; returns the feed's last
    /// id at that moment (where the feed reader starts).
    pub fn register(&self, h: &Handle) -> Result<String> {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let sent = Instant::now();
        let v: Value = run(h, &self.register, |i| {
            i.arg(host)
                .arg(std::process::id())
                .arg(&self.lease.mountpoint)
                .arg(now_ns())
                .arg(ms(self.lease.lease));
        })
        .map_err(|e| match errno_of(&e) {
            memfs_fs::Errno::EBUSY => crate::error::Error::Cleaning(h.keys.name().to_string()),
            _ => e,
        })?;
        let a = namespace::array(v)?;
        let sid = namespace::int(a.first())?;
        let id = String::from_utf8_lossy(&namespace::bytes(a.get(1))?).into_owned();
        h.set_sid(sid);
        self.lease.renewed(sent);
        self.lease.ok.store(true, Ordering::Release);
        tracing::info!(volume = h.keys.name(), sid, "session registered");
        Ok(id)
    }

    /// One renewal and reap: the freed block map values and inos.
    pub fn renew(&self, h: &Handle) -> Result<Reaped> {
        let sent = Instant::now();
        let v: Value = run(h, &self.renew, |i| {
            i.arg(ms(self.lease.lease)).arg(ms(self.lease.lease));
        })?;
        self.lease.renewed(sent);
        let a = namespace::array(v)?;
        let reaped = namespace::int(a.first())?;
        if reaped > 0 {
            tracing::info!(volume = h.keys.name(), reaped, "expired sessions reaped");
            self.lease.reaped.fetch_add(reaped, Ordering::Relaxed);
        }
        let freed = match a.get(1) {
            Some(v) => namespace::array(v.clone())?
                .iter()
                .map(|b| namespace::bytes(Some(b)))
                .collect::<Result<Vec<_>>>()?,
            None => Vec::new(),
        };
        let inos_at = |i: usize| -> Result<Vec<u64>> {
            match a.get(i) {
                Some(v) => namespace::array(v.clone())?
                    .iter()
                    .map(|i| namespace::int(Some(i)))
                    .collect(),
                None => Ok(Vec::new()),
            }
        };
        Ok(Reaped {
            freed,
            inos: inos_at(2)?,
            unlocked: inos_at(3)?,
        })
    }

    /// Ends the session in the cluster.
    pub fn end(&self, h: &Handle) -> Result<()> {
        self.lease.dead();
        let _: i64 = run(h, &self.end, |_| {})?;
        self.lease.ok.store(false, Ordering::Release);
        Ok(())
    }

    /// The lease thread's loop: renews every lease/4 until `stop`; frees
    /// what a reap freed with `free`. A renewal refused as fenced (the
    /// lease ran out, the session was reaped) registers a new session: the
    /// old one's holds and locks are gone, and `lost` is told so that it
    /// can log what it drops.
    pub fn run(
        self: Arc<Session>,
        h: Arc<Handle>,
        stop: Arc<Stop>,
        free: Box<dyn Fn(Reaped) + Send>,
        lost: Box<dyn Fn(u64) + Send>,
    ) {
        let every = (self.lease.lease / 4).max(Duration::from_millis(50));
        let mut last_ok = Instant::now();
        while !stop.wait(every) {
            match self.renew(&h) {
                Ok(reaped) => {
                    last_ok = Instant::now();
                    self.lease.ok.store(true, Ordering::Release);
                    if !reaped.inos.is_empty() || !reaped.unlocked.is_empty() {
                        free(reaped);
                    }
                }
                Err(e) if errno_of(&e) == memfs_fs::Errno::ESTALE => {
                    let old = h.sid();
                    self.lease.dead();
                    self.lease.ok.store(false, Ordering::Release);
                    tracing::error!(
                        volume = h.keys.name(),
                        sid = old,
                        "the session's lease ran out: its locks and holds are lost; registering anew"
                    );
                    lost(old);
                    if self.register(&h).is_ok() {
                        last_ok = Instant::now();
                    }
                }
                Err(e) => {
                    if last_ok.elapsed() > self.lease.lease {
                        self.lease.ok.store(false, Ordering::Release);
                    }
                    tracing::warn!(volume = h.keys.name(), error = %e, "lease renewal failed");
                }
            }
        }
    }
}
