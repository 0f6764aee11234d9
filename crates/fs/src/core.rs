//! The part of a file system that its lazy clones read: the node table and
//! the snapshots, as structures. What they do lives with what uses them:
//! lazy clones in `lazy.rs`, snapshots in `snapshot.rs`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError};

use crossbeam_utils::sync::{ShardedLock, ShardedLockReadGuard, ShardedLockWriteGuard};
use parking_lot::{Mutex, RwLock};

use crate::inode::{Body, Inode, Meta};
use crate::invariant::uncount;
use crate::table::InodeTable;
use crate::types::{FileType, Timespec};
use crate::{Errno, Result};

/// Where a lazy clone finds the nodes it has not copied yet.
pub(crate) struct Base {
    /// The origin's table and snapshots: kept alive by the clone, so the
    /// origin `Fs` may go first.
    pub(crate) core: Arc<Core>,
    /// The snapshot read; the origin deletes it only after making every
    /// clone still reading it whole ([`Core::detach`]).
    pub(crate) snap: Arc<Snap>,
    pub(crate) id: u64,
}

/// The part of a file system that its lazy clones read.
pub(crate) struct Core {
    /// Keyed by inode numbers this table hands out itself, never by a
    /// caller's choice, so the default SipHash's resistance to chosen keys
    /// buys nothing, while every lookup, create and unlink hashes one to
    /// three inode numbers here (`table.rs`).
    pub(crate) inodes: InodeTable,
    pub(crate) snaps: Snapshots,
    pub(crate) base: RwLock<Option<Base>>,
    /// Numbers below this come from the base (0: not a clone). Fixed at
    /// the clone: new nodes are numbered from it on.
    pub(crate) limit: AtomicU64,
    /// Numbers copied from the base and freed since: never copied again.
    pub(crate) gone: Mutex<HashSet<u64>>,
    pub(crate) used_pages: Arc<AtomicU64>,
    pub(crate) used_inodes: Arc<AtomicU64>,
}

impl Core {
    pub(crate) fn new(
        inodes: InodeTable,
        used_pages: Arc<AtomicU64>,
        used_inodes: Arc<AtomicU64>,
    ) -> Core {
        Core {
            inodes,
            snaps: Default::default(),
            base: RwLock::new(None),
            limit: AtomicU64::new(0),
            gone: Mutex::new(HashSet::new()),
            used_pages,
            used_inodes,
        }
    }

    /// The one place the engine finds a node by number.
    #[inline]
    pub(crate) fn get(&self, ino: u64) -> Result<Arc<Inode>> {
        if let Some(n) = self.inodes.get(&ino) {
            return Ok(n.value().clone());
        }
        if ino < self.limit.load(Ordering::Acquire) {
            return self.materialize(ino);
        }
        Err(Errno::ENOENT)
    }
}

/// A node as a snapshot holds it: the state it had before its first change
/// after the snapshot. What it holds counts in the file system's usage
/// until it goes.
pub(crate) struct Frozen {
    pub(crate) kind: FileType,
    pub(crate) meta: Meta,
    pub(crate) body: Body,
    /// The file system's page and node counters (shared with it).
    pub(crate) used: (Arc<AtomicU64>, Arc<AtomicU64>),
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if let Body::File(d) = &mut self.body {
            let freed = std::mem::take(d).release();
            uncount(&self.used.0, freed, "pages");
        }
        uncount(&self.used.1, 1, "inodes");
    }
}

/// What a snapshot keeps of the nodes changed since it: the state each had
/// at the snapshot (`None`: the node did not exist then).
pub(crate) type Preserved = HashMap<u64, Option<Arc<Frozen>>>;

pub(crate) struct Snap {
    pub(crate) id: u64,
    pub(crate) name: Vec<u8>,
    pub(crate) created: Timespec,
    /// The epoch this snapshot closed: nodes whose last change is in this
    /// epoch or an earlier one read as they are in the live table.
    pub(crate) epoch: u64,
    /// Nodes changed after this snapshot and before the next one, as they
    /// were. A node changed after several snapshots is kept once, in the
    /// newest of them; older snapshots find it there (see [`Core::snap_node`]).
    pub(crate) map: Mutex<Preserved>,
    /// Lazy clones still reading this snapshot (`lazy.rs`): deleting it
    /// first makes them whole.
    pub(crate) clones: Mutex<Vec<std::sync::Weak<Core>>>,
}

/// The snapshots of one file system.
#[derive(Default)]
pub(crate) struct Snapshots {
    /// Oldest first; ids and epochs ascend. Readers of a snapshot hold this
    /// shared while they resolve a node, so that a deletion (exclusive)
    /// never moves a preserved node under them. They and writers preserving
    /// a node (under the node's lock) take it with `read_recursive`: a
    /// reader waits for a node lock while holding this shared, and a fair
    /// `read` would queue behind a waiting create or delete (deadlock).
    pub(crate) list: RwLock<Vec<Arc<Snap>>>,
    /// `list.len()`, readable without its lock.
    pub(crate) count: AtomicUsize,
    pub(crate) next_id: AtomicU64,
    /// The current epoch; taking a snapshot closes it.
    pub(crate) epoch: AtomicU64,
    /// Held shared by every operation that changes the tree, for its whole
    /// body, and exclusively while a snapshot is taken or a rollback runs:
    /// so a snapshot never sees half of a rename. Readers never take it.
    pub(crate) gate: Gate,
}

/// The lock behind [`Snapshots::gate`]: a reader-writer lock split into
/// shards on cache lines of their own, a thread taking it shared touching
/// only its shard (`crossbeam_utils::sync::ShardedLock`), and taking it
/// exclusive taking every shard. Every change takes it shared; one lock
/// word shared by all of them bounced between the CPUs on each change:
/// `memfs bench workload` on 2 threads ran creates and deletes ~20 %
/// slower than with no gate at all (docs/engine.md "The gate and the benchmark's clock"). Taken
/// exclusively only to take a snapshot or roll back, where the cost of
/// taking eight shards does not matter.
#[derive(Default)]
pub(crate) struct Gate(ShardedLock<()>);

impl Gate {
    pub(crate) fn read(&self) -> ShardedLockReadGuard<'_, ()> {
        // Poisoned only by a panic inside an operation; the lock guards no
        // data, so there is nothing to distrust.
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn write(&self) -> ShardedLockWriteGuard<'_, ()> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}
