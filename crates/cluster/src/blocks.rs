//! Data blocks in the cluster (docs/cluster.md, "A write, from write(2) to
//! a replica"): `b:{V.<id hex>}`, each in a slot of its own, immutable once
//! written, ids from `HINCRBY {V}:next block n` and never reused.
//!
//! Gets, sets and deletes of many blocks go in one cluster pipeline: the
//! `redis` crate groups the commands per master, sends every master its
//! batch before reading any reply, so the masters work in parallel. A
//! bounded LRU cache keeps blocks read or written: a block never changes,
//! so a cached one is never stale; only block *maps* go stale.
//!
//! `WAIT 1` covers only the writes of the connection it is sent on, and a
//! file's blocks may have gone out on other connections of the pool (an
//! earlier flush, another thread). So [`Blocks::wait_replicas`] first writes
//! on each master, on its own connection, a marker that a script sets and
//! deletes in one step (it leaves nothing behind, but it is replicated),
//! then sends `WAIT 1`: the replication stream is ordered, so a replica
//! that has the marker has every write before it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::cluster::{ClusterConnection, cluster_pipe};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{RedisResult, Script, Value};

use crate::direct::{Direct, Miss};
use crate::error::{Error, Result};
use crate::handle::Handle;
use crate::slot::key_slot;
use crate::topology::Topology;

/// Bytes of block data per pipeline. The `redis` crate packs a
/// pipeline into one buffer per master that grows by doubling, each step
/// a copy into fresh pages the kernel zeroes: at 16 MiB those copies and
/// faults took a sixth of a mount's CPU. At 1 MiB a flush of 64 MiB is 64
/// round trips of ~60 µs beside ~35 ms of transfer, and 1 MiB random
/// direct I/O ran 23% faster than at 16 MiB (median of five alternating
/// runs each; 4 MiB and 256 KiB fell between: docs/cluster.md, "Measured").
/// Measured through the crate; blocks now go by `crate::direct`, which
/// copies nothing, and the crate carries only its misses: the size has
/// not been measured again on that path.
const PIPELINE_BYTES: usize = 1 << 20;
/// Blocks asked for per pipeline of `GET`s.
const PIPELINE_GETS: usize = 256;
/// Block ids a mount reserves ahead in one `HINCRBY`, so that most flushes
/// cost no round trip for their ids (unused ones are skipped, never
/// reused).
const RESERVE_AHEAD: u64 = 1024;

/// Written and deleted in one step on a master before `WAIT`: replicated,
/// and leaves no key. `allow-oom`: an fsync of what is already written
/// must not fail because the master is full.
const MARKER: &str = "#!lua flags=allow-oom
redis.call('SET', KEYS[1], '1')
redis.call('DEL', KEYS[1])
return 1
";

/// A block's bytes, shared without copying: a block fetched from the
/// cluster keeps the buffer the reply was read into, and a dirty block
/// becomes the cached block of its new id when it is committed. Writers
/// change a dirty block through `Arc::make_mut`, which copies it only while
/// a read still holds it.
pub type Block = Arc<Vec<u8>>;

/// A block as a block map names it: its id and the bytes of it that count
/// (bytes past `len` read as zeros, even if the stored block is longer:
/// a truncate cuts `len` and leaves the immutable block alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub id: u64,
    pub len: u32,
}

impl Entry {
    /// The 12-byte block map value: id u64 LE, len u32 LE.
    pub fn encode(&self) -> [u8; 12] {
        let mut v = [0; 12];
        v[..8].copy_from_slice(&self.id.to_le_bytes());
        v[8..].copy_from_slice(&self.len.to_le_bytes());
        v
    }

    /// A block map value, or why it is not one.
    pub fn decode(v: &[u8]) -> Result<Entry> {
        let (Some(id), Some(len)) = (v.get(..8), v.get(8..12)) else {
            return Err(Error::Protocol(format!(
                "block map value of {} bytes, not 12",
                v.len()
            )));
        };
        if v.len() != 12 {
            return Err(Error::Protocol(format!(
                "block map value of {} bytes, not 12",
                v.len()
            )));
        }
        let mut a = [0; 8];
        a.copy_from_slice(id);
        let mut b = [0; 4];
        b.copy_from_slice(len);
        Ok(Entry {
            id: u64::from_le_bytes(a),
            len: u32::from_le_bytes(b),
        })
    }
}

/// `{V}:c:<ino hex>`: a file's block map.
pub fn map_key(h: &Handle, ino: u64) -> String {
    format!("{}{ino:x}", map_prefix(&h.keys))
}

/// What every block map's key starts with: `SCAN MATCH` it with a `*` to
/// find them all (`Admin::clean`, which must not miss one).
pub fn map_prefix(keys: &crate::keys::Keys) -> String {
    format!("{{{}}}:c:", keys.name())
}

/// The field of block `idx` in a block map: lowercase hex.
pub fn map_field(idx: u64) -> String {
    format!("{idx:x}")
}

/// A failure worth another try on a fresh connection: the server was not
/// reached, or the cluster is between two slot maps (a failover).
pub fn transient(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
        || matches!(
            e.code(),
            Some("CLUSTERDOWN" | "TRYAGAIN" | "MASTERDOWN" | "LOADING")
        )
}

/// Runs `f` on a connection of the pool, again on a fresh one after a
/// transient failure, until the pool's timeout from now has passed. Only
/// for what may run twice (reads, sets of new blocks, deletes, scripts
/// whose second run changes nothing more).
pub fn retry<R>(
    h: &Handle,
    mut f: impl FnMut(&mut ClusterConnection) -> RedisResult<R>,
) -> Result<R> {
    let deadline = Instant::now() + h.pool.timeout();
    let mut pause = Duration::from_millis(50);
    loop {
        h.count_data();
        match h.pool.with(&mut f) {
            Err(Error::Redis(e)) if transient(&e) && Instant::now() + pause < deadline => {
                tracing::debug!(error = %e, "cluster call failed, trying again");
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            other => return other,
        }
    }
}

/// A pipeline's failure with the errno of its cause: a pipeline error
/// carries no code of its own, so an OOM among its replies would read as
/// EIO.
fn pipeline_error(e: Error) -> Error {
    if let Error::Redis(r) = &e
        && let Some(items) = r.clone().into_server_errors()
        && items.iter().any(|(_, s)| s.code() == "OOM")
    {
        return Error::Errno(memfs_fs::Errno::ENOSPC);
    }
    e
}

/// The least recently used blocks, bounded in bytes.
struct Lru {
    blocks: HashMap<u64, (Block, u64)>,
    by_age: BTreeMap<u64, u64>,
    tick: u64,
    bytes: u64,
    limit: u64,
}

impl Lru {
    fn get(&mut self, id: u64) -> Option<Block> {
        let (b, t) = self.blocks.get_mut(&id)?;
        self.by_age.remove(t);
        self.tick += 1;
        *t = self.tick;
        self.by_age.insert(self.tick, id);
        Some(b.clone())
    }

    fn insert(&mut self, id: u64, b: Block) {
        let len = b.len() as u64;
        if len > self.limit || self.blocks.contains_key(&id) {
            return;
        }
        while self.bytes + len > self.limit {
            let Some((_, old)) = self.by_age.pop_first() else {
                break;
            };
            self.remove(old);
        }
        self.tick += 1;
        self.blocks.insert(id, (b, self.tick));
        self.by_age.insert(self.tick, id);
        self.bytes += len;
    }

    fn remove(&mut self, id: u64) {
        if let Some((b, t)) = self.blocks.remove(&id) {
            self.by_age.remove(&t);
            self.bytes -= b.len() as u64;
        }
    }
}

/// The blocks of one mount: the cluster's and the cache.
pub struct Blocks {
    h: Arc<Handle>,
    cache: Mutex<Lru>,
    hits: AtomicU64,
    misses: AtomicU64,
    marker: Script,
    /// Block reads, writes and deletes, straight to the masters; what
    /// misses goes through the pool (`crate::direct`).
    direct: Direct,
    /// Ids reserved and not handed out yet: `[next, end)`.
    ids: Mutex<(u64, u64)>,
}

impl Blocks {
    pub fn new(h: Arc<Handle>, cache_bytes: u64) -> Blocks {
        Blocks {
            direct: Direct::new(h.pool.seeds(), h.pool.timeout()),
            h,
            cache: Mutex::new(Lru {
                blocks: HashMap::new(),
                by_age: BTreeMap::new(),
                tick: 0,
                bytes: 0,
                limit: cache_bytes,
            }),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            marker: Script::new(MARKER),
            ids: Mutex::new((0, 0)),
        }
    }

    pub fn cached_bytes(&self) -> u64 {
        self.cache.lock().bytes
    }

    /// Blocks found in the cache and blocks fetched.
    pub fn hits(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }

    /// `n` new block ids, in one range: the first of them. From the ids
    /// this mount reserved ahead, or a new range of at least
    /// [`RESERVE_AHEAD`] (what is left of the old one is skipped).
    pub fn reserve(&self, n: u64) -> Result<u64> {
        let mut ids = self.ids.lock();
        if ids.1 - ids.0 < n {
            let want = n.max(RESERVE_AHEAD);
            let next = self.h.keys.next();
            // Retried: a second HINCRBY after a lost reply only wastes ids.
            let last: u64 = retry(&self.h, |c| {
                redis::cmd("HINCRBY")
                    .arg(&next)
                    .arg("block")
                    .arg(want)
                    .query(c)
            })?;
            *ids = (last + 1 - want, last + 1);
        }
        let first = ids.0;
        ids.0 += n;
        debug_assert!(ids.0 <= ids.1 && first > 0, "ids {first}+{n} of {ids:?}");
        Ok(first)
    }

    /// The blocks `ids`, from the cache or the cluster; `None` for a block
    /// the cluster does not have (replaced and freed by another mount: the
    /// map that named it is stale).
    pub fn get_many(&self, ids: &[u64]) -> Result<Vec<Option<Block>>> {
        let mut out: Vec<Option<Block>> = {
            let mut cache = self.cache.lock();
            ids.iter().map(|&id| cache.get(id)).collect()
        };
        let missing: Vec<usize> = (0..ids.len()).filter(|&i| out[i].is_none()).collect();
        let found = ids.len() - missing.len();
        self.hits.fetch_add(found as u64, Ordering::Relaxed);
        self.misses
            .fetch_add(missing.len() as u64, Ordering::Relaxed);
        for chunk in missing.chunks(PIPELINE_GETS) {
            let keys: Vec<String> = chunk.iter().map(|&i| self.h.keys.block(ids[i])).collect();
            let direct: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
            self.h.count_data();
            let got: Vec<Option<Vec<u8>>> = match self.direct.get(&direct) {
                Ok(got) => got,
                Err(m) => {
                    tracing::debug!(why = %m.why, "block GETs through the pool");
                    retry(&self.h, |c| {
                        let mut p = cluster_pipe();
                        for k in &keys {
                            p.cmd("GET").arg(k);
                        }
                        p.query(c)
                    })?
                }
            };
            let mut cache = self.cache.lock();
            for (&i, b) in chunk.iter().zip(got) {
                if let Some(b) = b {
                    let b: Block = Arc::new(b);
                    cache.insert(ids[i], b.clone());
                    out[i] = Some(b);
                }
            }
        }
        Ok(out)
    }

    /// Those of `written` (`(index, id)`: blocks committed to file `ino`)
    /// that the file's map in the cluster still names but the cluster does
    /// not hold. After a `WAIT` ([`Blocks::wait_replicas`]) this tells an
    /// fsync whether a master acknowledged a block and then died before
    /// replicating it: the replica promoted in its place never had it, and
    /// a `WAIT` on the new master succeeds all the same. Blocks the map no
    /// longer names were replaced or cut (by this mount or another) and
    /// may be gone by right. One pipeline per 256 blocks: an `HMGET` of
    /// their map fields and an `EXISTS` of each, grouped per master by the
    /// client, the masters in parallel.
    pub fn lost(&self, ino: u64, written: &[(u64, u64)]) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        let key = map_key(&self.h, ino);
        for chunk in written.chunks(PIPELINE_GETS) {
            let got: Vec<Value> = retry(&self.h, |c| {
                let mut p = cluster_pipe();
                p.cmd("HMGET").arg(&key);
                for &(idx, _) in chunk {
                    p.arg(map_field(idx));
                }
                for &(_, id) in chunk {
                    p.cmd("EXISTS").arg(self.h.keys.block(id));
                }
                p.query(c)
            })?;
            let bad = || Error::Protocol(format!("fsync check of {key}: {got:?}"));
            let (fields, exists) = got.split_first().ok_or_else(bad)?;
            let Value::Array(fields) = fields else {
                return Err(bad());
            };
            if fields.len() != chunk.len() || exists.len() != chunk.len() {
                return Err(bad());
            }
            for ((&(_, id), field), there) in chunk.iter().zip(fields).zip(exists) {
                let named = match field {
                    Value::BulkString(v) => Entry::decode(v)?.id == id,
                    _ => false,
                };
                if named && matches!(there, Value::Int(0)) {
                    out.push(id);
                }
            }
        }
        Ok(out)
    }

    /// Writes new blocks (ids never written before), then caches them. On
    /// a failure (OOM: ENOSPC) deletes what may have been written, so that
    /// nothing is left that no map names. `free`: blocks no map names any
    /// more, unlinked in the same pipeline (best effort, as [`Blocks::delete`]).
    pub fn put_many(&self, blocks: &[(u64, Block)], free: &[u64]) -> Result<()> {
        self.uncache(free);
        let mut start = 0;
        while start < blocks.len() {
            let mut end = start;
            let mut bytes = 0;
            while end < blocks.len() && (end == start || bytes < PIPELINE_BYTES) {
                bytes += blocks[end].1.len();
                end += 1;
            }
            let batch = &blocks[start..end];
            let unlink = if start == 0 { free } else { &[] };
            if let Err(e) = self.store(batch, unlink) {
                let mut ids: Vec<u64> = blocks[..end].iter().map(|b| b.0).collect();
                ids.extend_from_slice(free);
                self.delete(&ids);
                return Err(pipeline_error(e));
            }
            start = end;
        }
        let mut cache = self.cache.lock();
        for (id, b) in blocks {
            cache.insert(*id, b.clone());
        }
        Ok(())
    }

    /// Deletes blocks no map names any more. Best effort: a failure is
    /// logged and leaves garbage for the cleaner, never a wrong file.
    pub fn delete(&self, ids: &[u64]) {
        self.uncache(ids);
        for chunk in ids.chunks(PIPELINE_GETS * 4) {
            if let Err(e) = self.store(&[], chunk) {
                tracing::warn!(error = %e, blocks = chunk.len(), "could not free blocks");
            }
        }
    }

    /// `SET`s of `blocks`, then `UNLINK`s of `unlink`: straight to the
    /// masters, or after a miss in one pipeline of the crate, retried.
    fn store(&self, blocks: &[(u64, Block)], unlink: &[u64]) -> Result<()> {
        self.store_direct(blocks, unlink).or_else(|m| {
            tracing::debug!(why = %m.why, "block SETs and UNLINKs through the pool");
            retry(&self.h, |c| {
                let mut p = cluster_pipe();
                for (id, b) in blocks {
                    p.cmd("SET")
                        .arg(self.h.keys.block(*id))
                        .arg(&b[..])
                        .ignore();
                }
                for &id in unlink {
                    p.cmd("UNLINK").arg(self.h.keys.block(id)).ignore();
                }
                p.exec(c)
            })
        })
    }

    /// [`Blocks::store`] on `crate::direct` (counted as one data call, as
    /// the pipeline it replaces).
    fn store_direct(
        &self,
        blocks: &[(u64, Block)],
        unlink: &[u64],
    ) -> std::result::Result<(), Miss> {
        let keys: Vec<String> = blocks
            .iter()
            .map(|(id, _)| self.h.keys.block(*id))
            .collect();
        let gone: Vec<String> = unlink.iter().map(|&id| self.h.keys.block(id)).collect();
        let sets: Vec<(&[u8], &[u8])> = keys
            .iter()
            .zip(blocks)
            .map(|(k, (_, b))| (k.as_bytes(), &b[..]))
            .collect();
        let gone: Vec<&[u8]> = gone.iter().map(|k| k.as_bytes()).collect();
        self.h.count_data();
        self.direct.set(&sets, &gone)
    }

    /// Drops blocks from the cache (no map names them any more).
    pub fn uncache(&self, ids: &[u64]) {
        if ids.is_empty() {
            return;
        }
        let mut cache = self.cache.lock();
        for &id in ids {
            cache.remove(id);
        }
    }

    /// The cluster's masters, as last seen (fetched again with `fresh`):
    /// the block path's slot map, one a mount.
    fn topology(&self, fresh: bool) -> Result<Arc<Topology>> {
        self.direct.topology(fresh)
    }

    /// Waits until a replica of every master that serves one of `keys`
    /// has every write made to that master before this call (module doc).
    /// A master without a replica now has nothing to wait for (see
    /// `wait_once`); a master with one that does not acknowledge within the
    /// bound fails with EIO, after one more try on a fresh topology (a
    /// failover may have changed who serves what).
    pub fn wait_replicas(&self, keys: &[String]) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let mut topology = self.topology(false)?;
        for attempt in 0..2 {
            match self.wait_once(&topology, keys) {
                Err(e) if attempt == 0 => {
                    tracing::debug!(error = %e, "WAIT failed: reading the topology again");
                    topology = self.topology(true)?;
                }
                other => return other,
            }
        }
        unreachable!("the second attempt returns")
    }

    fn wait_once(&self, topology: &Topology, keys: &[String]) -> Result<()> {
        // One key per master: the marker goes in its slot. A master with
        // no replica now (a cluster without replicas, or a replica promoted
        // after its master died, until a new replica joins) has none to
        // wait for: its fsyncs are on one node, as a cluster without
        // replicas promises, and the log says so. Refusing them instead
        // would stop every fsync of a mount until an operator adds a node.
        let mut per_master: BTreeMap<&str, &String> = BTreeMap::new();
        for k in keys {
            let Some(m) = topology.master_of_key(k.as_bytes()) else {
                return Err(Error::Protocol(format!("no master serves {k}")));
            };
            if m.replicas.is_empty() {
                tracing::debug!(master = %m.addr, "fsync: the master has no replica to wait for");
                continue;
            }
            per_master.entry(m.id.as_str()).or_insert(k);
        }
        if per_master.is_empty() {
            return Ok(());
        }
        let ms = u64::try_from(self.h.pool.timeout().as_millis() * 3 / 4)
            .unwrap_or(u64::MAX)
            .max(1);
        // The masters wait at once, one thread each: an fsync costs one
        // marker and one WAIT of latency, not that for every master.
        let keys: Vec<&String> = per_master.into_values().collect();
        let got: Vec<Result<Value>> = if let [k] = keys[..] {
            vec![self.wait_one(k, ms)]
        } else {
            std::thread::scope(|s| {
                let hs: Vec<_> = keys
                    .iter()
                    .map(|&k| s.spawn(move || self.wait_one(k, ms)))
                    .collect();
                hs.into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(Error::Protocol("a WAIT thread panicked".into()))
                        })
                    })
                    .collect()
            })
        };
        for (k, v) in keys.into_iter().zip(got) {
            let v = v?;
            if !matches!(v, Value::Int(n) if n >= 1) {
                tracing::warn!(key = %k, reply = ?v, "no replica acknowledged within {ms} ms");
                return Err(Error::Errno(memfs_fs::Errno::EIO));
            }
        }
        Ok(())
    }

    /// The marker in the slot of `k`, then `WAIT 1` on the master that
    /// took it, on one connection (module doc).
    fn wait_one(&self, k: &str, ms: u64) -> Result<Value> {
        retry(&self.h, |c| {
            let marker = format!("{k}:w");
            self.marker.key(&marker).invoke::<i64>(c)?;
            let route = Route::new(key_slot(marker.as_bytes()), SlotAddr::Master);
            let info = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
            c.route_command(redis::cmd("WAIT").arg(1).arg(ms), info)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip() {
        let e = Entry {
            id: 0x0102_0304_0506_0708,
            len: 65536,
        };
        assert_eq!(Entry::decode(&e.encode()).unwrap(), e);
        assert!(Entry::decode(&[0; 11]).is_err());
        assert!(Entry::decode(&[0; 13]).is_err());
    }

    #[test]
    fn the_cache_keeps_to_its_bound() {
        let mut l = Lru {
            blocks: HashMap::new(),
            by_age: BTreeMap::new(),
            tick: 0,
            bytes: 0,
            limit: 10,
        };
        l.insert(1, Arc::new(vec![0; 4]));
        l.insert(2, Arc::new(vec![0; 4]));
        assert!(l.get(1).is_some());
        l.insert(3, Arc::new(vec![0; 4]));
        assert_eq!(l.bytes, 8);
        assert!(l.get(2).is_none(), "the least recently used went first");
        assert!(l.get(1).is_some() && l.get(3).is_some());
        l.insert(4, Arc::new(vec![0; 11]));
        assert!(l.get(4).is_none(), "a block over the bound is not kept");
    }
}
