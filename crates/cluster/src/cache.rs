//! The metadata cache of one mount (docs/cluster.md, "The local cache"):
//! node records, directory entries (positive and negative) and directory
//! listings, so that a stat, lookup, open or readdir of what this mount
//! holds sends nothing to the cluster.
//!
//! Sharded by inode (a directory's entries and listing live in the
//! directory's shard), each shard behind its own short lock that is never
//! held across a cluster call. Staleness is ruled out by an epoch: every
//! invalidation bumps it, and a value read from the cluster is stored only
//! if the epoch is still the one taken before the read; otherwise the key
//! is dropped (a change the feed reported may have overtaken the read).
//! The byte count is bounded: a shard that would pass its share of the
//! bound is emptied first (crude, but bounded and lock-light).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::record::Record;

const SHARDS: usize = 32;
/// Bytes counted per cached item beyond its own bytes (map overhead).
const OVERHEAD: u64 = 64;

/// One directory's listing: `..`'s ino and the entries, sorted by their
/// stable readdir offset.
pub struct Listing {
    pub parent: u64,
    /// `(offset, name, ino, type code)`, offsets strictly increasing, ≥ 3.
    pub entries: Vec<(u64, Vec<u8>, u64, u8)>,
    pub bytes: u64,
}

#[derive(Default)]
struct Shard {
    recs: HashMap<u64, Record>,
    /// parent → name → the child's ino, or `None`: known absent.
    ents: HashMap<u64, HashMap<Vec<u8>, Option<u64>>>,
    lists: HashMap<u64, Arc<Listing>>,
    bytes: u64,
}

impl Shard {
    fn clear(&mut self) {
        *self = Shard::default();
    }
}

/// The cache; see the module doc.
pub struct Cache {
    shards: Vec<Mutex<Shard>>,
    epoch: AtomicU64,
    limit: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
}

fn shard_of(ino: u64) -> usize {
    (ino.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 59) as usize % SHARDS
}

impl Cache {
    /// A cache of at most `limit` bytes.
    pub fn new(limit: u64) -> Cache {
        Cache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            epoch: AtomicU64::new(0),
            limit: AtomicU64::new(limit),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// Taken before a cluster read whose result is to be stored.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Sets the bound (the mount's cache size less what blocks hold).
    pub fn set_limit(&self, limit: u64) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    fn shard(&self, ino: u64) -> parking_lot::MutexGuard<'_, Shard> {
        self.shards[shard_of(ino)].lock()
    }

    fn count(&self, hit: bool) {
        let c = if hit { &self.hits } else { &self.misses };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Makes room for `n` more bytes in `s`.
    fn admit(&self, s: &mut Shard, n: u64) {
        let share = self.limit.load(Ordering::Relaxed) / SHARDS as u64;
        if s.bytes + n > share {
            s.clear();
        }
        s.bytes += n;
    }

    pub fn rec(&self, ino: u64) -> Option<Record> {
        let r = self.shard(ino).recs.get(&ino).cloned();
        self.count(r.is_some());
        r
    }

    /// Stores `r` as `ino`'s record if nothing was invalidated since `epoch`
    /// was taken; drops what is cached of it otherwise.
    pub fn put_rec(&self, epoch: u64, ino: u64, r: Record) {
        let mut s = self.shard(ino);
        if self.epoch() != epoch {
            s.recs.remove(&ino);
            return;
        }
        self.admit(&mut s, OVERHEAD + r.len() as u64);
        s.recs.insert(ino, r);
    }

    /// Changes a cached record in place (a write this mount made).
    pub fn update_rec(&self, ino: u64, f: impl FnOnce(&mut Record)) {
        if let Some(r) = self.shard(ino).recs.get_mut(&ino) {
            f(r);
        }
    }

    /// `Some(Some(ino))`: `name` in `parent` is `ino`; `Some(None)`: known
    /// absent; `None`: not cached.
    pub fn ent(&self, parent: u64, name: &[u8]) -> Option<Option<u64>> {
        let e = self
            .shard(parent)
            .ents
            .get(&parent)
            .and_then(|m| m.get(name).copied());
        self.count(e.is_some());
        e
    }

    pub fn put_ent(&self, epoch: u64, parent: u64, name: &[u8], ino: Option<u64>) {
        let mut s = self.shard(parent);
        if self.epoch() != epoch {
            if let Some(m) = s.ents.get_mut(&parent) {
                m.remove(name);
            }
            return;
        }
        self.admit(&mut s, OVERHEAD + name.len() as u64);
        s.ents.entry(parent).or_default().insert(name.to_vec(), ino);
    }

    pub fn list(&self, ino: u64) -> Option<Arc<Listing>> {
        let l = self.shard(ino).lists.get(&ino).cloned();
        self.count(l.is_some());
        l
    }

    pub fn put_list(&self, epoch: u64, ino: u64, l: Arc<Listing>) {
        let mut s = self.shard(ino);
        if self.epoch() != epoch {
            s.lists.remove(&ino);
            return;
        }
        self.admit(&mut s, OVERHEAD + l.bytes);
        s.lists.insert(ino, l);
    }

    fn bump(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// `ino`'s record changed.
    pub fn forget_rec(&self, ino: u64) {
        self.bump();
        self.shard(ino).recs.remove(&ino);
    }

    /// `name` in `parent` changed: the entry and the parent's listing go.
    pub fn forget_ent(&self, parent: u64, name: &[u8]) {
        self.bump();
        let mut s = self.shard(parent);
        if let Some(m) = s.ents.get_mut(&parent) {
            m.remove(name);
        }
        s.lists.remove(&parent);
    }

    /// Drops one entry without bumping the epoch: for this mount's own
    /// change, when every fill that could have read the old value began
    /// before an earlier bump.
    pub fn drop_ent(&self, parent: u64, name: &[u8]) {
        if let Some(m) = self.shard(parent).ents.get_mut(&parent) {
            m.remove(name);
        }
    }

    /// Directory `ino`'s entries, all of them (it was removed or moved).
    pub fn forget_dir(&self, ino: u64) {
        self.bump();
        let mut s = self.shard(ino);
        s.ents.remove(&ino);
        s.lists.remove(&ino);
    }

    /// Everything (the feed lost its place).
    pub fn clear(&self) {
        self.bump();
        for s in &self.shards {
            s.lock().clear();
        }
    }

    /// Bytes held, by the count of the admissions since each shard was
    /// last emptied.
    pub fn bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.lock().bytes).sum()
    }

    /// `(hits, misses)`.
    pub fn hits(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Kind;

    #[test]
    fn a_fill_overtaken_by_an_invalidation_is_dropped() {
        let c = Cache::new(1 << 20);
        let r = Record::new(Kind::File, 0o644, 0, 0, 0);
        let e = c.epoch();
        c.put_rec(e, 5, r.clone());
        assert!(c.rec(5).is_some());
        let e = c.epoch();
        c.forget_ent(1, b"x");
        c.put_rec(e, 5, r.clone());
        assert!(c.rec(5).is_none(), "a stale fill stayed");
        let e = c.epoch();
        c.put_ent(e, 1, b"x", None);
        assert_eq!(c.ent(1, b"x"), Some(None));
        c.forget_ent(1, b"x");
        assert_eq!(c.ent(1, b"x"), None);
    }

    #[test]
    fn the_bound_holds() {
        let c = Cache::new(SHARDS as u64 * 1000);
        let r = Record::new(Kind::File, 0o644, 0, 0, 0);
        for ino in 0..10_000 {
            c.put_rec(c.epoch(), ino, r.clone());
        }
        assert!(c.bytes() <= SHARDS as u64 * 1000, "{}", c.bytes());
    }
}
