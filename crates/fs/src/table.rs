//! The inode table: inode number -> node, in 64 shards, each a hash table
//! under its own lock.
//!
//! A bucket holds only the `Arc<Inode>` (8 bytes): the number is the node's
//! own `ino`, so it is not stored again beside it. `DashMap<u64, Arc<Inode>>`
//! kept both (16 bytes a bucket), and with a million nodes the table has
//! 2,097,152 buckets (64 shards at 48 % occupancy): 16 MiB less per million
//! nodes. The price is a look at the node itself when a probe's 7-bit tag
//! matches (the node found is read next anyway) and when a shard grows
//! (every node of that shard is hashed again from its number).
//!
//! The methods are the subset of `DashMap`'s the engine used, with the same
//! meaning, so that its call sites did not change; one difference: [`iter`]
//! hands out nodes collected one shard at a time, holding no lock while the
//! caller works through them (shard locks are leaves, docs/engine.md).
//!
//! [`iter`]: InodeTable::iter

use std::hash::BuildHasher;
use std::ops::Deref;
use std::sync::Arc;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;
use parking_lot::{MappedRwLockReadGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::inode::Inode;

pub(crate) type InoHasher = hashbrown::DefaultHashBuilder;

const SHARD_BITS: u32 = 6;

/// One shard, on cache lines of its own (as `DashMap`'s): threads working
/// on different shards do not contend for a line.
#[repr(align(128))]
#[derive(Default)]
struct Shard(RwLock<HashTable<Arc<Inode>>>);

pub(crate) struct InodeTable {
    shards: Box<[Shard]>,
    hasher: InoHasher,
}

/// A node found in the table; holds its shard's read lock (as `DashMap`'s
/// `Ref` does), so keep it short.
pub(crate) struct Ref<'a>(MappedRwLockReadGuard<'a, Arc<Inode>>);

impl Ref<'_> {
    pub fn value(&self) -> &Arc<Inode> {
        &self.0
    }
}

impl Deref for Ref<'_> {
    type Target = Arc<Inode>;

    fn deref(&self) -> &Arc<Inode> {
        &self.0
    }
}

/// A node handed out by [`InodeTable::iter`].
pub(crate) struct Item(Arc<Inode>);

impl Item {
    pub fn key(&self) -> &u64 {
        &self.0.ino
    }

    pub fn value(&self) -> &Arc<Inode> {
        &self.0
    }
}

impl Default for InodeTable {
    fn default() -> InodeTable {
        InodeTable {
            shards: (0..1 << SHARD_BITS).map(|_| Shard::default()).collect(),
            hasher: InoHasher::default(),
        }
    }
}

impl InodeTable {
    fn hash(&self, ino: u64) -> u64 {
        self.hasher.hash_one(ino)
    }

    /// The shard of a hash: bits 51-56, as `DashMap` takes them, clear of
    /// the low bits that pick a bucket and of the top 7 that tag it.
    fn shard(&self, hash: u64) -> &RwLock<HashTable<Arc<Inode>>> {
        &self.shards[((hash << 7) >> (64 - SHARD_BITS)) as usize].0
    }

    /// The node numbered `ino`. A recursive read: a caller that holds a
    /// `Ref` of the same shard does not wait behind a queued writer.
    pub fn get(&self, ino: &u64) -> Option<Ref<'_>> {
        let h = self.hash(*ino);
        let guard = self.shard(h).read_recursive();
        RwLockReadGuard::try_map(guard, |t| t.find(h, |n| n.ino == *ino))
            .ok()
            .map(Ref)
    }

    pub fn contains_key(&self, ino: &u64) -> bool {
        let h = self.hash(*ino);
        self.shard(h)
            .read_recursive()
            .find(h, |n| n.ino == *ino)
            .is_some()
    }

    /// Puts `node` in as number `ino` (its own number); returns the node it
    /// replaces.
    pub fn insert(&self, ino: u64, node: Arc<Inode>) -> Option<Arc<Inode>> {
        debug_assert_eq!(ino, node.ino, "a node is filed under its own number");
        let h = self.hash(ino);
        let mut t = self.shard(h).write();
        match t.entry(h, |n| n.ino == ino, |n| self.hash(n.ino)) {
            Entry::Occupied(mut e) => Some(std::mem::replace(e.get_mut(), node)),
            Entry::Vacant(e) => {
                e.insert(node);
                None
            }
        }
    }

    pub fn remove(&self, ino: &u64) -> Option<(u64, Arc<Inode>)> {
        self.remove_if(ino, |_, _| true)
    }

    /// Removes node `ino` if `f` says so.
    pub fn remove_if(
        &self,
        ino: &u64,
        f: impl FnOnce(&u64, &Arc<Inode>) -> bool,
    ) -> Option<(u64, Arc<Inode>)> {
        let h = self.hash(*ino);
        let mut t = self.shard(h).write();
        let e = t.find_entry(h, |n| n.ino == *ino).ok()?;
        if !f(ino, e.get()) {
            return None;
        }
        Some((*ino, e.remove().0))
    }

    /// The node numbered `ino`, or the one `make` makes, which is put in;
    /// `make` runs under the shard's write lock, so that two threads never
    /// both make it and no removal of that number runs meanwhile.
    pub fn get_or_try_insert_with<E>(
        &self,
        ino: u64,
        make: impl FnOnce() -> Result<Arc<Inode>, E>,
    ) -> Result<Arc<Inode>, E> {
        let h = self.hash(ino);
        let mut t: RwLockWriteGuard<'_, _> = self.shard(h).write();
        if let Some(n) = t.find(h, |n| n.ino == ino) {
            return Ok(n.clone());
        }
        let node = make()?;
        debug_assert_eq!(ino, node.ino, "a node is filed under its own number");
        t.insert_unique(h, node.clone(), |n| self.hash(n.ino));
        Ok(node)
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.0.read_recursive().len()).sum()
    }

    pub fn clear(&self) {
        for s in self.shards.iter() {
            // Dropped outside the lock: a node's last reference may free a
            // whole tree's worth of memory.
            let old = std::mem::take(&mut *s.0.write());
            drop(old);
        }
    }

    /// Every node, one shard's worth at a time (no lock held between).
    pub fn iter(&self) -> impl Iterator<Item = Item> + '_ {
        self.shards.iter().flat_map(|s| {
            let nodes: Vec<Arc<Inode>> = s.0.read_recursive().iter().cloned().collect();
            nodes.into_iter().map(Item)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inode::{Body, Meta};
    use crate::types::{FileType, Timespec};

    fn node(ino: u64) -> Arc<Inode> {
        let t = Timespec::default();
        let meta = Meta {
            perm: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            size: 0,
            atime: t,
            mtime: t,
            ctime: t,
            btime: t,
            xattrs: None,
            flags: 0,
        };
        Arc::new(Inode::new(
            ino,
            FileType::RegularFile,
            meta,
            Body::File(Default::default()),
        ))
    }

    /// A bucket is one pointer: the saving this table exists for.
    #[test]
    fn buckets_hold_one_pointer() {
        assert_eq!(std::mem::size_of::<Arc<Inode>>(), 8);
    }

    #[test]
    fn insert_get_replace_remove_iter() {
        let t = InodeTable::default();
        let n = 20_000u64;
        for ino in 1..=n {
            assert!(t.insert(ino, node(ino)).is_none());
        }
        assert_eq!(t.len(), n as usize);
        // Spread over every shard.
        assert!(t.shards.iter().all(|s| !s.0.read().is_empty()));
        for ino in 1..=n {
            assert_eq!(t.get(&ino).map(|r| r.ino), Some(ino));
            assert_eq!(t.get(&ino).map(|r| r.value().ino), Some(ino));
        }
        assert!(t.get(&(n + 1)).is_none());
        assert!(!t.contains_key(&0));

        let again = node(7);
        let old = t.insert(7, again.clone()).expect("replaced");
        assert!(!Arc::ptr_eq(&old, &again));
        assert!(Arc::ptr_eq(&t.get(&7).unwrap(), &again));
        assert_eq!(t.len(), n as usize);

        // remove_if removes only the node it is asked about.
        assert!(t.remove_if(&7, |_, v| Arc::ptr_eq(v, &old)).is_none());
        assert!(t.contains_key(&7));
        let (k, v) = t.remove_if(&7, |_, v| Arc::ptr_eq(v, &again)).unwrap();
        assert_eq!((k, Arc::ptr_eq(&v, &again)), (7, true));
        assert!(t.remove(&7).is_none());
        assert_eq!(t.remove(&8).map(|(k, v)| (k, v.ino)), Some((8, 8)));

        let mut seen: Vec<u64> = t.iter().map(|e| *e.key()).collect();
        seen.sort_unstable();
        let want: Vec<u64> = (1..=n).filter(|&i| i != 7 && i != 8).collect();
        assert_eq!(seen, want);
        assert!(t.iter().all(|e| e.value().ino == *e.key()));

        t.clear();
        assert_eq!(t.len(), 0);
        assert!(t.get(&1).is_none());
    }

    #[test]
    fn get_or_try_insert_with_makes_once() {
        let t = InodeTable::default();
        let made = t
            .get_or_try_insert_with(5, || Ok::<_, ()>(node(5)))
            .unwrap();
        let found = t
            .get_or_try_insert_with(5, || -> Result<Arc<Inode>, ()> { panic!("made twice") })
            .unwrap();
        assert!(Arc::ptr_eq(&made, &found));
        let refused = t.get_or_try_insert_with(6, || Err::<Arc<Inode>, _>("no"));
        assert_eq!(refused.err(), Some("no"));
        assert!(!t.contains_key(&6));
        assert_eq!(t.len(), 1);
    }

    /// A reader holding a `Ref` may look up again in the same shard while
    /// a writer waits for it (`DashMap` allowed that too).
    #[test]
    fn nested_reads_do_not_wait_for_a_queued_writer() {
        let t = InodeTable::default();
        t.insert(1, node(1));
        let held = t.get(&1).unwrap();
        std::thread::scope(|s| {
            let w = s.spawn(|| t.insert(1, node(1)));
            // Whether or not the writer queued yet, this must not block.
            assert!(t.get(&1).is_some());
            drop(held);
            assert!(w.join().unwrap().is_some());
        });
    }
}
