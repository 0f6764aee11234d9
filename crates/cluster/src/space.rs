//! How much memory a volume's cluster has and uses, for `statfs` (`df`).
//!
//! A volume's data blocks are spread over every master, so its capacity is
//! the masters' together: each master's `maxmemory` (or, where that is 0,
//! the machine's memory as `INFO memory` reports it), less what each uses
//! (`used_memory`, every volume and the cluster's own overhead included,
//! which is what a write would run into). Replicas hold copies and add no
//! room. The figure is the cluster's, not the volume's: volumes share it.
//!
//! Asking costs one round trip per master plus `CLUSTER SLOTS`, so an
//! answer is kept for [`FRESH`]: `df` in a loop, or a tool that calls
//! statfs per file, costs the cluster nothing more. When the cluster does
//! not answer, the last answer stands (or none), each connection bounded by
//! the mount's timeout: statfs never hangs on a lost cluster.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::topology::{Topology, connect};

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
    seeds: Vec<String>,
    timeout: Duration,
    last: Mutex<Option<(Instant, Room)>>,
}

impl Space {
    pub fn new(seeds: &[String], timeout: Duration) -> Space {
        assert!(!seeds.is_empty(), "a volume has at least one seed");
        Space {
            seeds: seeds.to_vec(),
            timeout,
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
        match self.fetch() {
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

    fn fetch(&self) -> Result<Room> {
        let t = Topology::fetch(&self.seeds, self.timeout)?;
        let mut room = Room { total: 0, used: 0 };
        for m in &t.masters {
            let mut c = connect(&m.addr, self.timeout)?;
            let info: String = redis::cmd("INFO").arg("memory").query(&mut c)?;
            let field = |name: &str| -> Result<u64> {
                info_field(&info, name).ok_or_else(|| {
                    Error::Protocol(format!("{}: INFO memory has no {name}", m.addr))
                })
            };
            let max = match field("maxmemory")? {
                0 => field("total_system_memory")?,
                n => n,
            };
            room.total = room.total.saturating_add(max);
            room.used = room.used.saturating_add(field("used_memory")?);
        }
        debug_assert!(
            t.masters.is_empty() || room.total > 0,
            "a master with no memory"
        );
        Ok(room)
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
