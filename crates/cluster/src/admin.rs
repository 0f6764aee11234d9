//! Volume administration: `memfs volume create|list|status|delete` against
//! a cluster's URLs (docs/cluster.md, "Volumes: administration").

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::cluster::{ClusterClient, ClusterClientBuilder, ClusterConnection};
use redis::{Connection, Script};

use crate::error::{Error, Result};
use crate::keys::{Keys, REGISTRY};
use crate::record::{self, Kind, Record};
use crate::slot::key_slot;
use crate::topology::{Master, Topology, connect};

/// The format a volume is created in (`{V}:meta` `format`).
pub const FORMAT: u32 = 1;
/// The default block size.
pub const DEFAULT_BLOCK_SIZE: u32 = 65536;
/// The default bound on one command, connecting included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Keys asked for per `SCAN` call, and unlinked per round trip.
const BATCH: usize = 1000;

/// Writes a new volume's keys if `{V}:meta` does not exist, in one step:
/// of two creates of one name, exactly one finds it absent. Without
/// `allow-oom` a full master refuses it before it runs.
const CREATE: &str = r"#!lua
-- KEYS: {V}:meta, {V}:next, {V}:i:0
-- ARGV: block_size, created (ns), root record, features
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'format', '1', 'block_size', ARGV[1],
  'created', ARGV[2], 'root', '1', 'features', ARGV[4])
redis.call('HSET', KEYS[2], 'ino', '1', 'block', '0', 'session', '0',
  'seq', '0', 'used_bytes', '0', 'inodes', '1')
redis.call('HSET', KEYS[3], '\1', ARGV[3])
return 1
";

/// Sessions whose lease has not run out, by the server's clock.
const LIVE_SESSIONS: &str = r"#!lua flags=no-writes
-- KEYS: {V}:sessions
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], now, '+inf')
";

/// What a new volume is made with.
#[derive(Clone, Debug)]
pub struct CreateOptions {
    /// Bytes per data block: a power of two from 4 KiB to 4 MiB.
    pub block_size: u32,
    /// The root directory's owner: the caller's ids.
    pub uid: u32,
    pub gid: u32,
    /// The root directory's permission bits.
    pub mode: u16,
}

impl Default for CreateOptions {
    fn default() -> CreateOptions {
        CreateOptions {
            block_size: DEFAULT_BLOCK_SIZE,
            uid: 0,
            gid: 0,
            mode: 0o755,
        }
    }
}

/// The counters of `{V}:next`: the last number handed out of each kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub ino: u64,
    pub block: u64,
    pub session: u64,
    pub seq: u64,
    pub used_bytes: u64,
    pub inodes: u64,
}

/// What `status` reports.
#[derive(Clone, Debug)]
pub struct Status {
    pub name: String,
    pub format: u32,
    pub block_size: u32,
    /// ns since the epoch, by the creating client's clock.
    pub created: i64,
    pub root: u64,
    pub features: u64,
    pub counters: Counters,
    /// Sessions whose lease has not run out.
    pub live_sessions: u64,
    /// The slot of every metadata key.
    pub metadata_slot: u16,
    /// `host:port` of the master holding it.
    pub metadata_master: String,
    /// That master's `used_memory`.
    pub metadata_master_used_memory: u64,
}

/// What `delete` removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deleted {
    pub metadata_keys: u64,
    pub block_keys: u64,
}

/// Administration of the volumes of one cluster.
pub struct Admin {
    seeds: Vec<String>,
    client: ClusterClient,
    timeout: Duration,
}

impl Admin {
    /// An administrator of the cluster reached through `urls`
    /// (`redis://host:port`), each command bounded by [`DEFAULT_TIMEOUT`].
    pub fn connect(urls: &[String]) -> Result<Admin> {
        Admin::with_timeout(urls, DEFAULT_TIMEOUT)
    }

    /// The same, each command bounded by `timeout`.
    pub fn with_timeout(urls: &[String], timeout: Duration) -> Result<Admin> {
        if urls.is_empty() {
            return Err(Error::BadOption("no cluster URL given".into()));
        }
        let client = ClusterClientBuilder::new(urls.to_vec())
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .build()?;
        Ok(Admin {
            seeds: urls.to_vec(),
            client,
            timeout,
        })
    }

    /// Creates volume `name`: its metadata and root directory in one
    /// script, then its entry in the registry. Refuses a taken name, and a
    /// cluster with a master that may evict keys.
    pub fn create(&self, name: &str, options: &CreateOptions) -> Result<()> {
        let keys = Keys::new(name)?;
        let bs = options.block_size;
        if !bs.is_power_of_two() || !(4096..=4 << 20).contains(&bs) {
            return Err(Error::BadOption(format!(
                "block size {bs}: a power of two from 4096 to 4194304"
            )));
        }
        self.check_policy(&self.topology()?)?;
        let now = now_ns();
        let root = Record::new(Kind::Dir, options.mode, options.uid, options.gid, now);
        let mut con = self.cluster()?;
        let created: i64 = Script::new(CREATE)
            .key(keys.meta())
            .key(keys.next())
            .key(keys.records(1))
            .arg(bs)
            .arg(now)
            .arg(record::to_vec(&root))
            .arg(0)
            .invoke(&mut con)?;
        if created == 0 {
            return Err(Error::Exists(name.to_string()));
        }
        // A crash here leaves a volume that `list` misses and that
        // `status`, `delete` and a second `create` (Exists) still find.
        redis::cmd("SADD").arg(REGISTRY).arg(name).exec(&mut con)?;
        tracing::info!(volume = name, block_size = bs, "volume created");
        Ok(())
    }

    /// The names of the registered volumes, sorted.
    pub fn list(&self) -> Result<Vec<String>> {
        let mut names: Vec<String> = redis::cmd("SMEMBERS")
            .arg(REGISTRY)
            .query(&mut self.cluster()?)?;
        names.sort();
        Ok(names)
    }

    /// Volume `name`'s format, counters, sessions and metadata master.
    pub fn status(&self, name: &str) -> Result<Status> {
        let keys = Keys::new(name)?;
        let mut con = self.cluster()?;
        let meta: HashMap<String, String> =
            redis::cmd("HGETALL").arg(keys.meta()).query(&mut con)?;
        if meta.is_empty() {
            return Err(Error::NotFound(name.to_string()));
        }
        let next: HashMap<String, String> =
            redis::cmd("HGETALL").arg(keys.next()).query(&mut con)?;
        let live_sessions = live_sessions(&keys, &mut con)?;
        let slot = key_slot(keys.meta().as_bytes());
        let topology = self.topology()?;
        let master = master_of(&topology, slot)?;
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query(&mut self.node(&master.addr)?)?;
        let number = |map: &HashMap<String, String>, f: &str| -> Result<u64> {
            let v = map.get(f).map_or("0", String::as_str);
            v.parse()
                .map_err(|_| Error::Protocol(format!("volume {name:?}: field {f} is {v:?}")))
        };
        Ok(Status {
            name: name.to_string(),
            format: number(&meta, "format")? as u32,
            block_size: number(&meta, "block_size")? as u32,
            created: number(&meta, "created")? as i64,
            root: number(&meta, "root")?,
            features: number(&meta, "features")?,
            counters: Counters {
                ino: number(&next, "ino")?,
                block: number(&next, "block")?,
                session: number(&next, "session")?,
                seq: number(&next, "seq")?,
                used_bytes: number(&next, "used_bytes")?,
                inodes: number(&next, "inodes")?,
            },
            live_sessions,
            metadata_slot: slot,
            metadata_master: master.addr.clone(),
            metadata_master_used_memory: info_field(&info, "used_memory")?,
        })
    }

    /// Deletes volume `name`: its blocks on every master, its metadata
    /// keys, `{V}:meta` last, then its registry entry. So a delete that
    /// stopped half-way is finished by running it again. Refuses while a
    /// session's lease runs, unless `force`.
    pub fn delete(&self, name: &str, force: bool) -> Result<Deleted> {
        let keys = Keys::new(name)?;
        let mut con = self.cluster()?;
        let exists: bool = redis::cmd("EXISTS").arg(keys.meta()).query(&mut con)?;
        let registered: bool = redis::cmd("SISMEMBER")
            .arg(REGISTRY)
            .arg(name)
            .query(&mut con)?;
        if !exists && !registered {
            return Err(Error::NotFound(name.to_string()));
        }
        let sessions = live_sessions(&keys, &mut con)?;
        if sessions > 0 && !force {
            return Err(Error::Busy {
                name: name.to_string(),
                sessions,
            });
        }
        let topology = self.topology()?;
        let mut deleted = Deleted::default();
        for m in &topology.masters {
            let mut node = self.node(&m.addr)?;
            deleted.block_keys +=
                unlink_matching(&mut node, &keys.block_pattern(), |k| keys.is_block(k))?;
        }
        let master = master_of(&topology, key_slot(keys.meta().as_bytes()))?;
        let mut node = self.node(&master.addr)?;
        let meta = keys.meta();
        deleted.metadata_keys +=
            unlink_matching(&mut node, &keys.meta_pattern(), |k| k != meta.as_bytes())?;
        let n: u64 = redis::cmd("UNLINK").arg(&meta).query(&mut node)?;
        deleted.metadata_keys += n;
        redis::cmd("SREM").arg(REGISTRY).arg(name).exec(&mut con)?;
        tracing::info!(volume = name, ?deleted, force, "volume deleted");
        Ok(deleted)
    }

    /// Refuses a cluster with a master whose `maxmemory-policy` is not
    /// `noeviction`: an evicted key of a volume is a corrupt volume.
    pub fn check_policy(&self, topology: &Topology) -> Result<()> {
        for m in &topology.masters {
            let reply: Vec<String> = redis::cmd("CONFIG")
                .arg("GET")
                .arg("maxmemory-policy")
                .query(&mut self.node(&m.addr)?)?;
            let policy = reply.get(1).cloned().unwrap_or_default();
            if policy != "noeviction" {
                return Err(Error::Policy {
                    node: m.addr.clone(),
                    policy,
                });
            }
        }
        Ok(())
    }

    /// The masters and their slots now.
    pub fn topology(&self) -> Result<Topology> {
        Topology::fetch(&self.seeds, self.timeout)
    }

    pub(crate) fn cluster(&self) -> Result<ClusterConnection> {
        Ok(self.client.get_connection()?)
    }

    pub(crate) fn node(&self, addr: &str) -> Result<Connection> {
        connect(addr, self.timeout)
    }
}

fn live_sessions(keys: &Keys, con: &mut ClusterConnection) -> Result<u64> {
    Ok(Script::new(LIVE_SESSIONS)
        .key(keys.sessions())
        .invoke(con)?)
}

fn master_of(topology: &Topology, slot: u16) -> Result<&Master> {
    topology
        .master_of_slot(slot)
        .ok_or_else(|| Error::Protocol(format!("no master serves slot {slot}")))
}

/// `SCAN`s one node for `pattern`, handing `each` every batch of keys
/// found (and the node, for its pipelines). A `SCAN` ends when its cursor
/// comes back to 0: each step is bounded by the cluster timeout, and the
/// node's key count bounds the steps.
pub(crate) fn scan_each(
    node: &mut Connection,
    pattern: &str,
    mut each: impl FnMut(&mut Connection, Vec<Vec<u8>>) -> Result<()>,
) -> Result<()> {
    let mut cursor: u64 = 0;
    loop {
        let (next, found): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(BATCH)
            .query(node)?;
        if !found.is_empty() {
            each(node, found)?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// `SCAN`s one node for `pattern` and unlinks the keys `keep` accepts, a
/// batch per round trip (one `UNLINK` each: block keys are in many slots).
fn unlink_matching(
    node: &mut Connection,
    pattern: &str,
    keep: impl Fn(&[u8]) -> bool,
) -> Result<u64> {
    let mut unlinked = 0;
    scan_each(node, pattern, |node, found| {
        let mut pipe = redis::pipe();
        let mut n = 0;
        for key in found.iter().filter(|k| keep(k)) {
            pipe.cmd("UNLINK").arg(key);
            n += 1;
        }
        if n > 0 {
            let counts: Vec<u64> = pipe.query(node)?;
            unlinked += counts.iter().sum::<u64>();
        }
        Ok(())
    })?;
    Ok(unlinked)
}

fn info_field(info: &str, name: &str) -> Result<u64> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| Error::Protocol(format!("INFO has no {name}")))
}

fn now_ns() -> i64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}
