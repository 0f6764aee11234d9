//! What every part of a mounted volume needs to reach it: the connection
//! pool, the volume's keys, its block size and this mount's session id;
//! and the count of the calls it made, by kind ([`Calls`]), which `memfs
//! status` shows and the tests and the benchmark read per operation.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use redis::Script;

use crate::keys::Keys;
use crate::pool::Pool;

/// A mount's handle on its volume, shared by its threads.
pub struct Handle {
    pub pool: Pool,
    pub keys: Keys,
    /// Bytes per data block (`{V}:meta` `block_size`): a power of two.
    pub block_size: u32,
    /// This mount's session: 0 until registered, a new one after the
    /// lease was lost and won again.
    sid: AtomicU64,
    calls: Calls,
}

/// Round trips this mount made, by kind. Relaxed counters: a count, not a
/// synchronisation; one uncontended atomic add per call, beside a network
/// round trip.
#[derive(Default)]
struct Calls {
    scripts: AtomicU64,
    data: AtomicU64,
}

/// [`Handle::calls`]: what the counters hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallCounts {
    /// Namespace scripts (crate::namespace: lookup, getattr, create,
    /// unlink, rename, readdir, ...) on the metadata master. The lease's
    /// renewals (crate::session) are not counted: they come every lease/4
    /// whatever the mount does.
    pub scripts: u64,
    /// Calls of the data path (crate::blocks `retry`): block reads and
    /// writes (one pipeline per master is one), block maps, commits, locks.
    pub data: u64,
}

impl Handle {
    pub fn new(pool: Pool, keys: Keys, block_size: u32) -> Handle {
        assert!(block_size.is_power_of_two(), "block size {block_size}");
        Handle {
            pool,
            keys,
            block_size,
            sid: AtomicU64::new(0),
            calls: Calls::default(),
        }
    }

    /// One namespace script is about to be sent.
    pub fn count_script(&self) {
        self.calls.scripts.fetch_add(1, Ordering::Relaxed);
    }

    /// One call of the data path is about to be sent.
    pub fn count_data(&self) {
        self.calls.data.fetch_add(1, Ordering::Relaxed);
    }

    /// The calls made so far.
    pub fn calls(&self) -> CallCounts {
        CallCounts {
            scripts: self.calls.scripts.load(Ordering::Relaxed),
            data: self.calls.data.load(Ordering::Relaxed),
        }
    }

    /// The session id every script is called with.
    pub fn sid(&self) -> u64 {
        self.sid.load(Ordering::Acquire)
    }

    pub fn set_sid(&self, sid: u64) {
        self.sid.store(sid, Ordering::Release);
    }

    /// `script` with the three arguments of every volume script
    /// (crate::lua: name, session, the caller's clock) already given: add
    /// the keys and the operation's own arguments, then invoke.
    pub fn invocation<'a>(&self, script: &'a Script) -> redis::ScriptInvocation<'a> {
        self.invocation_as(script, self.sid())
    }

    /// [`Handle::invocation`] fenced on session `sid`, which may be an
    /// earlier one of this mount's: a commit is fenced on the session its
    /// blocks were written under (crate::data, `Data::flush_ordered`).
    pub fn invocation_as<'a>(&self, script: &'a Script, sid: u64) -> redis::ScriptInvocation<'a> {
        let mut inv = script.prepare_invoke();
        inv.key(self.keys.meta())
            .arg(self.keys.name())
            .arg(sid)
            .arg(now_ns().to_le_bytes().as_slice());
        inv
    }
}

/// This machine's clock in ns since the epoch: the times a mount stamps on
/// what it changes (as JuiceFS does: the server's clock is for leases).
pub fn now_ns() -> i64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}
