//! Lazy clones: a clone of a snapshot starts with an empty table and a
//! *base* (the origin's table and snapshots, and the snapshot), and copies
//! a node from the base the first time it needs it (issue 12;
//! docs/snapshots.md, "Clone"). What they work on is [`Core`] (`core.rs`).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::core::{Base, Core, Snap};
use crate::dir::FIRST_SLOT_OFFSET;
use crate::inode::{Body, Inode};
use crate::types::{FileType, ROOT_INO};
use crate::{Errno, Result};

impl Core {
    /// Makes this (new, empty) table a lazy clone of `base`, whose numbers
    /// are all below `limit`.
    pub(crate) fn attach(&self, base: Base, limit: u64) {
        self.limit.store(limit, Ordering::Release);
        *self.base.write() = Some(base);
    }

    /// Whether this table still reads snapshot `snap`.
    pub(crate) fn reads(&self, snap: &Arc<Snap>) -> bool {
        self.base
            .read_recursive()
            .as_ref()
            .is_some_and(|b| Arc::ptr_eq(&b.snap, snap))
    }

    /// Copies node `ino` from the base as its snapshot has it (file pages
    /// shared, the rest copied), under the table shard's lock: two threads
    /// never both copy it, and a free ([`Core::forget`]) never races it.
    /// Counted in the usage from now on. Its epoch is 0: it is as old as
    /// every snapshot of this table, so the first change preserves it.
    #[cold]
    pub(crate) fn materialize(&self, ino: u64) -> Result<Arc<Inode>> {
        let base = self.base.read_recursive();
        let Some(b) = base.as_ref() else {
            return Err(Errno::ENOENT);
        };
        self.inodes
            .get_or_try_insert_with(ino, || self.copy_from(b, ino))
    }

    /// [`Core::materialize`]'s copy, under the table shard's lock.
    fn copy_from(&self, b: &Base, ino: u64) -> Result<Arc<Inode>> {
        if self.gone.lock().contains(&ino) {
            return Err(Errno::ENOENT);
        }
        let got = b.core.snap_node(b.id, ino, |kind, m, body| {
            let body = match body {
                Body::File(d) => Body::File(d.import()),
                other => other.clone(),
            };
            Ok((m.nlink > 0 || ino == ROOT_INO).then(|| (kind, m.clone(), body)))
        })?;
        let Some((kind, meta, body)) = got else {
            return Err(Errno::ENOENT);
        };
        let pages = match &body {
            Body::File(d) => d.page_count(),
            _ => 0,
        };
        let node = Arc::new(Inode::new(ino, kind, meta, body));
        if ino == ROOT_INO {
            // The kernel never forgets the root.
            node.nlookup.store(1, Ordering::Relaxed);
        }
        // Never refused for the capacity: a read must not fail for it; new
        // allocations meet the limit as usual.
        self.used_pages.fetch_add(pages, Ordering::AcqRel);
        self.used_inodes.fetch_add(1, Ordering::AcqRel);
        Ok(node)
    }

    /// A node is leaving the table for good: if it came from the base, it
    /// must not come back from there. Called before it leaves (see
    /// [`Core::materialize`]).
    pub(crate) fn forget(&self, ino: u64) {
        if ino < self.limit.load(Ordering::Acquire) && self.base.read_recursive().is_some() {
            self.gone.lock().insert(ino);
        }
    }

    /// Copies every node of the tree not copied yet: a walk from the root
    /// (a node of the base that no directory names any more was copied
    /// when it lost its last name). Complete only if the tree does not
    /// change meanwhile ([`Core::detach`] holds the gate).
    fn materialize_all(&self) -> Result<()> {
        if self.base.read_recursive().is_none() {
            return Ok(());
        }
        let mut seen = HashSet::new();
        let mut stack = vec![ROOT_INO];
        while let Some(ino) = stack.pop() {
            let node = match self.get(ino) {
                Ok(n) => n,
                Err(Errno::ENOENT) => continue,
                Err(e) => return Err(e),
            };
            if node.kind != FileType::Directory {
                continue;
            }
            let st = node.state.read();
            if let Body::Dir(d) = &st.body {
                d.list_from(FIRST_SLOT_OFFSET, |e, _| {
                    if seen.insert(e.ino) {
                        stack.push(e.ino);
                    }
                    true
                });
            }
        }
        Ok(())
    }

    /// Makes this clone whole and independent of its base (the base's
    /// snapshot is being deleted, or every node is wanted): O(nodes not
    /// copied yet), with changes to this tree held back meanwhile. Not from
    /// inside an operation that holds the gate.
    pub(crate) fn detach(&self) -> Result<()> {
        if self.base.read_recursive().is_none() {
            return Ok(());
        }
        // Most of the copying first, while the clone's writers go on; then
        // again with them held back, to catch a name moved behind the walk.
        self.materialize_all()?;
        let _gate = self.snaps.gate.write();
        self.materialize_all()?;
        *self.base.write() = None;
        Ok(())
    }
}
