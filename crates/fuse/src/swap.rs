//! Replacing the served tree while mounted (online rollback): every request
//! reads the tree through [`FsCell::get`], a shared lock held for the
//! request's statement; [`Swapper::swap`] takes it exclusively, so no
//! request ever sees part of one tree and part of the other. Afterwards the
//! kernel is told to forget what it cached of the old tree (attributes,
//! pages, names), with the lock released: the kernel takes directory locks
//! to drop names, which a request waiting for ours may hold.

use std::cell::Cell;
use std::ffi::OsStr;
use std::ops::Deref;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use fuser::{INodeNo, Notifier};
use memfs_fs::{Config, Errno, FIRST_ENTRY_OFFSET, Fs, RollbackOutcome, SnapshotInfo};

use crate::snapdir::{BuildTree, DurableSnapshot, SNAPDIR, Slots};
use parking_lot::{RwLock, RwLockReadGuard};

thread_local! {
    /// Guards of the cell this thread holds: a nested `get` (an argument
    /// evaluated while another guard lives) must not queue behind a waiting
    /// swap, or the two would wait for each other.
    static HELD: Cell<usize> = const { Cell::new(0) };
}

/// The tree a mount serves.
pub struct FsCell {
    current: RwLock<Arc<Fs>>,
}

/// The served tree, held for as long as this lives.
pub struct FsGuard<'a>(RwLockReadGuard<'a, Arc<Fs>>);

impl Deref for FsGuard<'_> {
    type Target = Fs;
    fn deref(&self) -> &Fs {
        &self.0
    }
}

impl Drop for FsGuard<'_> {
    fn drop(&mut self) {
        HELD.with(|h| h.set(h.get() - 1));
    }
}

impl FsCell {
    pub fn new(fs: Arc<Fs>) -> Self {
        FsCell {
            current: RwLock::new(fs),
        }
    }

    pub fn get(&self) -> FsGuard<'_> {
        let nested = HELD.with(|h| {
            let n = h.get();
            h.set(n + 1);
            n > 0
        });
        FsGuard(if nested {
            self.current.read_recursive()
        } else {
            self.current.read()
        })
    }
}

/// Replaces the tree of a running mount; see the module comment.
#[derive(Clone)]
pub struct Swapper {
    cell: Arc<FsCell>,
    notifier: Notifier,
    slots: Arc<Slots>,
    snapdir_name: Vec<u8>,
}

impl Swapper {
    pub(crate) fn new(
        cell: Arc<FsCell>,
        notifier: Notifier,
        slots: Arc<Slots>,
        snapdir_name: Vec<u8>,
    ) -> Self {
        Swapper {
            cell,
            notifier,
            slots,
            snapdir_name,
        }
    }

    /// The tree served now.
    pub fn fs(&self) -> Arc<Fs> {
        self.cell.current.read().clone()
    }

    /// Takes a snapshot of the served tree; `.snapshots/NAME` appears at once.
    pub fn snapshot_create(&self, name: &[u8]) -> Result<SnapshotInfo, Errno> {
        let info = self.cell.get().snapshot_create(name)?;
        self.snapdir_changed(name);
        Ok(info)
    }

    /// Deletes a snapshot; `.snapshots/NAME` disappears at once, and what
    /// the kernel still holds of it (open files, working directories)
    /// answers ESTALE from now on.
    pub fn snapshot_delete(&self, name: &[u8]) -> Result<(), Errno> {
        let fs = self.cell.get();
        let id = fs.snapshot_by_name(name).map(|i| i.id);
        fs.snapshot_delete(name)?;
        drop(fs);
        if let Some(id) = id {
            self.slots.forget_id(id);
        }
        self.snapdir_changed(name);
        Ok(())
    }

    pub fn snapshot_list(&self) -> Vec<SnapshotInfo> {
        self.cell.get().snapshot_list()
    }

    /// A writable copy-on-write clone of snapshot `name`, to be mounted elsewhere.
    pub fn clone_snapshot(&self, name: &[u8], config: Config) -> Result<Fs, Errno> {
        self.cell.get().clone_snapshot(name, config)
    }

    /// Online rollback of the live tree to snapshot `name`: no request runs
    /// while the engine switches (they hold the cell shared), then the
    /// kernel forgets what it cached of every node and name that changed
    /// (with the lock released, as in [`Swapper::swap`]). Returns how many
    /// nodes and names were invalidated.
    pub fn rollback_to_snapshot(&self, name: &[u8]) -> Result<(usize, usize), Errno> {
        let cur = self.cell.current.write();
        let out: RollbackOutcome = cur.rollback_to_snapshot(name)?;
        drop(cur);
        for &ino in &out.changed {
            // ENOENT: the kernel does not know the node; nothing to drop.
            let _ = self.notifier.inval_inode(INodeNo(ino), 0, 0);
        }
        for (parent, n) in &out.entries {
            let _ = self
                .notifier
                .inval_entry(INodeNo(*parent), OsStr::from_bytes(n));
        }
        tracing::info!(
            "rolled back to snapshot {}: invalidated {} inodes and {} names",
            String::from_utf8_lossy(name),
            out.changed.len(),
            out.entries.len()
        );
        Ok((out.changed.len(), out.entries.len()))
    }

    /// Shows a data directory's snapshots in `.snapshots` (a durable
    /// mount): those without an engine snapshot of the served tree (taken
    /// before a restart, a crash or an online rollback) get their tree
    /// rebuilt aside by `build` on first use. Call it again with the new
    /// list after every change of the history; names that appeared or went
    /// are dropped from the kernel's caches, and a snapshot that went takes
    /// its tree with it.
    pub fn set_durable_snapshots(&self, build: BuildTree, list: Vec<DurableSnapshot>) {
        for name in self.slots.set_durable(build, list) {
            self.snapdir_changed(&name);
        }
    }

    /// [`Swapper::set_durable_snapshots`] from inside [`Swapper::swap`]'s
    /// `make` (or before the mount serves): tells the kernel nothing, which
    /// must not be done while the served tree is held; `swap` invalidates
    /// every name of `.snapshots` afterwards.
    pub fn stage_durable_snapshots(&self, build: BuildTree, list: Vec<DurableSnapshot>) {
        self.slots.set_durable(build, list);
    }

    /// `.snapshots` gained or lost `name`.
    fn snapdir_changed(&self, name: &[u8]) {
        let _ = self
            .notifier
            .inval_entry(INodeNo(SNAPDIR), OsStr::from_bytes(name));
        let _ = self.notifier.inval_inode(INodeNo(SNAPDIR), 0, 0);
    }

    /// The name of the snapshot directory in the root.
    pub fn snapdir_name(&self) -> &[u8] {
        &self.snapdir_name
    }

    /// Blocks every request, calls `make` with the current tree, serves what
    /// it returns (on `Err` nothing changes), then invalidates the kernel's
    /// caches of every node and name of the old tree. Returns `make`'s value.
    pub fn swap<T, E>(
        &self,
        make: impl FnOnce(&Arc<Fs>) -> Result<(Arc<Fs>, T), E>,
    ) -> Result<T, E> {
        let mut cur = self.cell.current.write();
        let mut names: Vec<Vec<u8>> = cur.snapshot_list().into_iter().map(|s| s.name).collect();
        names.extend(self.slots.durable_names());
        let (new, v) = make(&cur)?;
        let old = std::mem::replace(&mut *cur, new);
        // The old tree's snapshots went with it.
        self.slots.forget_all();
        drop(cur);
        // Every name `.snapshots` showed: a snapshot the swap dropped must
        // answer ENOENT, not ESTALE through a cached name.
        for n in &names {
            let _ = self
                .notifier
                .inval_entry(INodeNo(SNAPDIR), OsStr::from_bytes(n));
        }
        let _ = self.notifier.inval_inode(INodeNo(SNAPDIR), 0, 0);
        self.invalidate(&old);
        Ok(v)
    }

    fn invalidate(&self, old: &Fs) {
        let (mut inodes, mut entries) = (0usize, 0usize);
        for node in old.nodes() {
            // ENOENT: the kernel does not know the node; nothing to drop.
            let _ = self.notifier.inval_inode(INodeNo(node.ino()), 0, 0);
            inodes += 1;
            let mut names = Vec::new();
            node.read(|v| {
                v.entries_from(FIRST_ENTRY_OFFSET, |name, _, _, _| {
                    names.push(name.to_vec());
                    true
                })
            });
            for n in names {
                let _ = self
                    .notifier
                    .inval_entry(INodeNo(node.ino()), OsStr::from_bytes(&n));
                entries += 1;
            }
        }
        tracing::info!("swapped the served tree; invalidated {inodes} inodes and {entries} names");
    }
}
