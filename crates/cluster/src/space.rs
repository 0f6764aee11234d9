//! How much memory a volume's cluster has and uses, for `statfs` (`df`).
//!
//! A volume's data blocks are spread over every master, so its capacity is
//! the masters' together: each master's `maxmemory` (or, where that is 0,
//! the machine's memory as `INFO memory` reports it), less what each uses
//! (`used_memory`, every volume and the cluster's own overhead included,
//! which is what a write would run into). Replicas hold copies and add no
//! room. The figure is the cluster's, not the volume's: volumes share it.
//!
//! Asking is one `INFO memory` to each master, sent over a connection of
//! the mount's pool ([`Space::pooled`]): that connection already holds the
//! slot map and a socket to every master, so a `df` opens no connection
//! and asks no `CLUSTER SLOTS`. An answer is still kept for [`FRESH`]: `df`
//! in a loop, or a tool that calls statfs per file, costs the cluster
//! nothing more. When the cluster does not answer, the last answer stands
//! (or none). The masters are asked one after another, each reply bounded
//! by the pool's timeout, so statfs waits at most masters × timeout on a
//! lost cluster, never for ever. A master lost to I/O or a timeout closes
//! the pooled connection (crate::pool), so the next ask reads the slot map
//! anew.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::Value;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};

use crate::error::{Error, Result};
use crate::handle::Handle;
use crate::pool::Pool;

/// How long one answer is reused.
pub const FRESH: Duration = Duration::from_secs(1);

/// Bytes of memory in the cluster's masters together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Room {
    pub total: u64,
    pub used: u64,
}

impl Room {
    pub fn free(&self) -> u64 {
        self.total.saturating_sub(self.used)
    }
}

/// The last answer and when it was fetched.
pub struct Space {
    via: Via,
    last: Mutex<Option<(Instant, Room)>>,
}

/// Where the masters are asked.
enum Via {
    /// A mount's pool, shared with everything else the mount sends.
    Mount(Arc<Handle>),
    /// A pool of its own, made for each ask: for a caller with no mount
    /// (a test, a one-off command), which asks once or rarely.
    Seeds {
        seeds: Vec<String>,
        timeout: Duration,
    },
}

impl Space {
    /// Asking through the pool of the mount `h`.
    pub fn pooled(h: Arc<Handle>) -> Space {
        Space {
            via: Via::Mount(h),
            last: Mutex::new(None),
        }
    }

    /// Asking the cluster reached through `seeds`, each ask on a pool made
    /// for it (connecting and every command bounded by `timeout`). A mount
    /// has a pool already: [`Space::pooled`].
    pub fn new(seeds: &[String], timeout: Duration) -> Space {
        assert!(!seeds.is_empty(), "a volume has at least one seed");
        Space {
            via: Via::Seeds {
                seeds: seeds.to_vec(),
                timeout,
            },
            last: Mutex::new(None),
        }
    }

    /// The cluster's room, at most [`FRESH`] old if the cluster answers;
    /// else the last answer, or `None` if there never was one.
    pub fn room(&self) -> Option<Room> {
        let last = *self.last.lock();
        if let Some((at, room)) = last
            && at.elapsed() < FRESH
        {
            return Some(room);
        }
        // Fetched without the lock held: two callers at once may both ask,
        // which costs a round trip, never a wait on the other.
        let fetched = match &self.via {
            Via::Mount(h) => fetch(&h.pool),
            Via::Seeds { seeds, timeout } => Pool::connect(seeds, *timeout).and_then(|p| fetch(&p)),
        };
        match fetched {
            Ok(room) => {
                *self.last.lock() = Some((Instant::now(), room));
                Some(room)
            }
            Err(e) => {
                tracing::debug!(error = %e, "statfs: the cluster's memory unknown");
                last.map(|(_, r)| r)
            }
        }
    }
}

/// Every master's memory added up: `INFO memory` routed to all the masters
/// of the connection's slot map, one reply per master, keyed by address.
fn fetch(pool: &Pool) -> Result<Room> {
    let replies = pool.with(|c| {
        c.route_command(
            redis::cmd("INFO").arg("memory"),
            RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
        )
    })?;
    let Value::Map(replies) = replies else {
        return Err(Error::Protocol(format!(
            "INFO memory to every master: {replies:?}, not one reply per master"
        )));
    };
    if replies.is_empty() {
        // No master is no figure: a room of 0 bytes would make df say full.
        return Err(Error::Protocol("INFO memory: no master answered".into()));
    }
    let mut room = Room { total: 0, used: 0 };
    for (addr, info) in &replies {
        let addr = redis::from_redis_value_ref::<String>(addr).unwrap_or_default();
        let info: String = redis::from_redis_value_ref(info).map_err(redis::RedisError::from)?;
        room = room.plus(&addr, &info)?;
    }
    Ok(room)
}

impl Room {
    /// `self` with the master at `addr` added, from its `INFO memory`.
    fn plus(self, addr: &str, info: &str) -> Result<Room> {
        let field = |name: &str| -> Result<u64> {
            info_field(info, name)
                .ok_or_else(|| Error::Protocol(format!("{addr}: INFO memory has no {name}")))
        };
        let max = match field("maxmemory")? {
            0 => field("total_system_memory")?,
            n => n,
        };
        Ok(Room {
            total: self.total.saturating_add(max),
            used: self.used.saturating_add(field("used_memory")?),
        })
    }
}

/// The number after `name:` on a line of an `INFO` reply.
fn info_field(info: &str, name: &str) -> Option<u64> {
    info.lines().find_map(|l| {
        let (k, v) = l.trim_end().split_once(':')?;
        if k == name { v.parse().ok() } else { None }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_fields_are_read_by_exact_name() {
        let info = "# Memory\r\nused_memory:1024\r\nused_memory_human:1.00K\r\n\
                    maxmemory:0\r\ntotal_system_memory:25000000000\r\n";
        assert_eq!(info_field(info, "used_memory"), Some(1024));
        assert_eq!(info_field(info, "maxmemory"), Some(0));
        assert_eq!(
            info_field(info, "total_system_memory"),
            Some(25_000_000_000)
        );
        assert_eq!(info_field(info, "used_memory_human"), None, "not a number");
        assert_eq!(info_field(info, "memory"), None);
    }

    #[test]
    fn a_master_adds_its_maxmemory_or_else_the_machines() {
        let capped = "maxmemory:100\r\nused_memory:40\r\ntotal_system_memory:999\r\n";
        let open = "maxmemory:0\r\nused_memory:5\r\ntotal_system_memory:1000\r\n";
        let room = Room { total: 0, used: 0 }
            .plus("a:1", capped)
            .and_then(|r| r.plus("b:2", open))
            .unwrap();
        assert_eq!(
            room,
            Room {
                total: 1100,
                used: 45
            }
        );
        let err = Room { total: 0, used: 0 }
            .plus("c:3", "maxmemory:0\r\nused_memory:5\r\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("c:3") && err.contains("total_system_memory"),
            "{err}"
        );
    }

    #[test]
    fn free_never_underflows() {
        let r = Room {
            total: 10,
            used: 20,
        };
        assert_eq!(r.free(), 0);
        assert_eq!(
            Room {
                total: 30,
                used: 20
            }
            .free(),
            10
        );
    }
}
