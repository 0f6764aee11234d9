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
//!
//! A directory is *complete* when the cache holds every entry of it (`..`
//! included): one this mount just made, or one whose listing was fetched
//! with no invalidation meanwhile. A name missing from a complete
//! directory is absent, answered here (a negative lookup, as the kernel
//! sends before every create, costs no call). This mount's own changes keep
//! a directory complete (their scripts say what the name is now); any
//! change the feed reports in it, a lost feed, or its shard being emptied
//! ends it.
//!
//! This mount's own change follows [`Cache::changed`]: the epoch taken
//! before its script must still be the current one after it, and is then
//! moved on by one, so that a fill that read the old value (whenever it
//! began) is refused, and what the script returned is stored; if anything
//! else moved the epoch meanwhile, what the change touched is forgotten
//! (in a complete directory the name is marked unknown, so the rest of the
//! directory still answers, and the listing goes).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::record::Record;

const SHARDS: usize = 32;
/// Bytes counted per cached item beyond its own bytes (map overhead).
const OVERHEAD: u64 = 64;

/// Listings of more entries than this are dropped rather than edited by
/// this mount's changes (an edit shifts the entries after it).
const EDIT_MAX: usize = 1024;

/// One directory's listing: `..`'s ino and the entries, sorted by their
/// stable readdir offset.
#[derive(Clone)]
pub struct Listing {
    pub parent: u64,
    /// `(offset, name, ino, type code)`, offsets strictly increasing, ≥ 3.
    pub entries: Vec<(u64, Vec<u8>, u64, u8)>,
    pub bytes: u64,
}

/// What the cache holds of one name in a directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Node(u64),
    Absent,
    /// Not known, in a complete directory (a store of it was refused): the
    /// rest of the directory is still held whole, this name is asked for.
    Unknown,
}

#[derive(Default)]
struct Shard {
    recs: HashMap<u64, Record>,
    /// parent → name → what it is.
    ents: HashMap<u64, HashMap<Vec<u8>, Slot>>,
    lists: HashMap<u64, Arc<Listing>>,
    /// Directories whose every entry is in `ents` (module doc).
    complete: HashSet<u64>,
    bytes: u64,
}

impl Shard {
    fn clear(&mut self) {
        *self = Shard::default();
    }

    /// What is cached of `name` in `parent`, and what depended on it.
    fn drop_name(&mut self, parent: u64, name: &[u8]) {
        if let Some(m) = self.ents.get_mut(&parent) {
            m.remove(name);
        }
        self.lists.remove(&parent);
        self.complete.remove(&parent);
    }

    /// A store of `name` in `parent` was refused: a complete directory
    /// stays so with the name unknown, any other forgets the name.
    fn unknown(&mut self, parent: u64, name: &[u8]) {
        let Some(m) = self.ents.get_mut(&parent) else {
            return;
        };
        if self.complete.contains(&parent) {
            m.insert(name.to_vec(), Slot::Unknown);
        } else {
            m.remove(name);
        }
    }

    fn drop_dir(&mut self, ino: u64) {
        self.ents.remove(&ino);
        self.lists.remove(&ino);
        self.complete.remove(&ino);
    }
}

/// Puts this mount's change of `name` (at readdir offset `off`) into `l`:
/// `now` is the name's node and type code, `None` when it is gone. False
/// when `l` is better fetched again (large, or offsets that collided).
fn edit(l: &mut Listing, name: &[u8], off: u64, now: Option<(u64, u8)>) -> bool {
    if l.entries.len() > EDIT_MAX {
        return false;
    }
    match (l.entries.binary_search_by_key(&off, |e| e.0), now) {
        (Ok(i), _) if l.entries[i].1 != name => false,
        (Ok(i), Some((ino, code))) => {
            l.entries[i].2 = ino;
            l.entries[i].3 = code;
            true
        }
        (Ok(i), None) => {
            l.entries.remove(i);
            true
        }
        // The name moved on by a collision: not worth an edit.
        (Err(i), _) if l.entries.get(i).is_some_and(|e| e.1 == name) => false,
        (Err(i), Some((ino, code))) => {
            l.entries.insert(i, (off, name.to_vec(), ino, code));
            l.bytes += name.len() as u64 + 32;
            true
        }
        (Err(_), None) => true,
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
    /// absent (cached so, or missing from a complete directory); `None`:
    /// not cached.
    pub fn ent(&self, parent: u64, name: &[u8]) -> Option<Option<u64>> {
        let s = self.shard(parent);
        let e = match s.ents.get(&parent).and_then(|m| m.get(name)) {
            Some(Slot::Node(ino)) => Some(Some(*ino)),
            Some(Slot::Absent) => Some(None),
            Some(Slot::Unknown) => None,
            None if s.complete.contains(&parent) => Some(None),
            None => None,
        };
        drop(s);
        self.count(e.is_some());
        e
    }

    /// Whether every entry of directory `ino` is cached.
    pub fn is_complete(&self, ino: u64) -> bool {
        self.shard(ino).complete.contains(&ino)
    }

    /// After this mount's change whose script ran since `epoch` was taken:
    /// the epoch to store what the script returned with, or one that
    /// stores nothing (so forgets what the change touched, a name in a
    /// complete directory becoming unknown) when anything else moved the
    /// epoch meanwhile. Either way the epoch moves on, so a fill
    /// that read the value before the change is refused.
    pub fn changed(&self, epoch: u64) -> u64 {
        match self
            .epoch
            .compare_exchange(epoch, epoch + 1, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => epoch + 1,
            Err(_) => {
                self.bump();
                u64::MAX
            }
        }
    }

    /// This mount's change of `name` in `parent` (at readdir offset `off`),
    /// as its script returned it: `now` is the name's node and type code,
    /// `None` when the name is gone. `epoch` is [`Cache::changed`]'s: the
    /// directory stays complete and its listing is edited; when refused,
    /// the name is unknown and the listing goes.
    pub fn own_ent(&self, epoch: u64, parent: u64, name: &[u8], off: u64, now: Option<(u64, u8)>) {
        let mut s = self.shard(parent);
        if self.epoch() != epoch {
            s.unknown(parent, name);
            s.lists.remove(&parent);
            return;
        }
        self.admit(&mut s, OVERHEAD + name.len() as u64);
        let complete = s.complete.contains(&parent);
        let m = s.ents.entry(parent).or_default();
        match now {
            Some((ino, _)) => {
                m.insert(name.to_vec(), Slot::Node(ino));
            }
            None if complete => {
                m.remove(name);
            }
            None => {
                m.insert(name.to_vec(), Slot::Absent);
            }
        }
        if let Some(l) = s.lists.get_mut(&parent)
            && !edit(Arc::make_mut(l), name, off, now)
        {
            s.lists.remove(&parent);
        }
    }

    /// Directory `ino`, which this mount just made in `parent`: complete
    /// and empty. `epoch` is [`Cache::changed`]'s.
    pub fn new_dir(&self, epoch: u64, ino: u64, parent: u64) {
        let mut s = self.shard(ino);
        if self.epoch() != epoch {
            s.drop_dir(ino);
            return;
        }
        self.admit(&mut s, 2 * OVERHEAD + 2);
        let ents = HashMap::from([(b"..".to_vec(), Slot::Node(parent))]);
        s.ents.insert(ino, ents);
        let l = Listing {
            parent,
            entries: Vec::new(),
            bytes: 0,
        };
        s.lists.insert(ino, Arc::new(l));
        s.complete.insert(ino);
    }

    /// Directory `ino` moved to `parent` by this mount's rename: its `..`.
    /// `epoch` is [`Cache::changed`]'s.
    pub fn moved_dir(&self, epoch: u64, ino: u64, parent: u64) {
        let mut s = self.shard(ino);
        if self.epoch() != epoch {
            s.unknown(ino, b"..");
            s.lists.remove(&ino);
            return;
        }
        if let Some(m) = s.ents.get_mut(&ino) {
            m.insert(b"..".to_vec(), Slot::Node(parent));
        }
        if let Some(l) = s.lists.get_mut(&ino) {
            Arc::make_mut(l).parent = parent;
        }
    }

    pub fn put_ent(&self, epoch: u64, parent: u64, name: &[u8], ino: Option<u64>) {
        let mut s = self.shard(parent);
        if self.epoch() != epoch {
            s.unknown(parent, name);
            return;
        }
        self.admit(&mut s, OVERHEAD + name.len() as u64);
        let slot = ino.map_or(Slot::Absent, Slot::Node);
        s.ents
            .entry(parent)
            .or_default()
            .insert(name.to_vec(), slot);
    }

    pub fn list(&self, ino: u64) -> Option<Arc<Listing>> {
        let l = self.shard(ino).lists.get(&ino).cloned();
        self.count(l.is_some());
        l
    }

    /// Stores directory `ino`'s listing, which also makes it complete: its
    /// entries (and `..`, but for the root, whose listing names itself)
    /// answer lookups.
    pub fn put_list(&self, epoch: u64, ino: u64, l: Arc<Listing>) {
        let mut s = self.shard(ino);
        if self.epoch() != epoch {
            s.drop_dir(ino);
            return;
        }
        self.admit(&mut s, 2 * (OVERHEAD + l.bytes));
        let mut ents: HashMap<Vec<u8>, Slot> = l
            .entries
            .iter()
            .map(|(_, name, child, _)| (name.clone(), Slot::Node(*child)))
            .collect();
        if l.parent != ino {
            ents.insert(b"..".to_vec(), Slot::Node(l.parent));
        }
        s.ents.insert(ino, ents);
        s.lists.insert(ino, l);
        s.complete.insert(ino);
    }

    fn bump(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// `ino`'s record changed.
    pub fn forget_rec(&self, ino: u64) {
        self.bump();
        self.shard(ino).recs.remove(&ino);
    }

    /// `name` in `parent` changed: the entry, the parent's listing and its
    /// completeness go.
    pub fn forget_ent(&self, parent: u64, name: &[u8]) {
        self.bump();
        self.shard(parent).drop_name(parent, name);
    }

    /// Directory `ino`'s entries, all of them (it was removed or moved).
    pub fn forget_dir(&self, ino: u64) {
        self.bump();
        self.shard(ino).drop_dir(ino);
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
    fn a_complete_directory_answers_for_absent_names() {
        let c = Cache::new(1 << 20);
        c.new_dir(c.changed(c.epoch()), 7, 1);
        assert_eq!(c.ent(7, b"x"), Some(None));
        assert_eq!(c.ent(7, b".."), Some(Some(1)));
        c.own_ent(c.changed(c.epoch()), 7, b"x", 100, Some((9, 1)));
        c.own_ent(c.changed(c.epoch()), 7, b"w", 50, Some((8, 1)));
        assert_eq!(c.ent(7, b"x"), Some(Some(9)));
        let offsets: Vec<u64> = c.list(7).unwrap().entries.iter().map(|e| e.0).collect();
        assert_eq!(offsets, [50, 100], "the listing edited in order");
        c.own_ent(c.changed(c.epoch()), 7, b"w", 50, None);
        assert_eq!(c.ent(7, b"w"), Some(None));
        assert_eq!(c.list(7).unwrap().entries.len(), 1);
        // Another change moved the epoch during this mount's own: that
        // name is unknown, the rest of the directory still held whole.
        let before = c.epoch();
        c.forget_rec(3);
        c.own_ent(c.changed(before), 7, b"y", 200, Some((10, 1)));
        assert_eq!(c.ent(7, b"y"), None, "the refused name is asked for");
        assert_eq!(c.ent(7, b"v"), Some(None), "the others still answered");
        assert!(c.list(7).is_none() && c.is_complete(7));
        let before = c.epoch();
        c.forget_rec(3);
        c.put_ent(before, 7, b"v", Some(11));
        assert_eq!(c.ent(7, b"v"), None, "a refused fill: unknown too");
        c.put_ent(c.epoch(), 7, b"y", Some(10));
        assert_eq!(c.ent(7, b"y"), Some(Some(10)), "known again once read");
        c.forget_dir(7);
        assert!(!c.is_complete(7));
        // A listing makes it complete; the feed's report ends it.
        let l = Listing {
            parent: 1,
            entries: vec![(100, b"x".to_vec(), 9, 1)],
            bytes: 33,
        };
        c.put_list(c.epoch(), 7, Arc::new(l));
        assert_eq!(c.ent(7, b"z"), Some(None));
        assert_eq!(c.ent(7, b"x"), Some(Some(9)));
        c.forget_ent(7, b"q");
        assert_eq!(c.ent(7, b"z"), None);
        assert_eq!(c.ent(7, b"x"), Some(Some(9)), "other names stay");
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
