//! Replacing the served tree while mounted (online rollback): every request
//! reads the tree through [`FsCell::get`], a shared lock held for the
//! request's statement; [`Swapper::swap`] takes it exclusively, so no
//! request ever sees part of one tree and part of the other. Afterwards the
//! kernel is told to forget what it cached of the old tree (attributes,
//! pages, names), with the lock released and from the notification thread
//! (crate::notify): the kernel takes directory locks to drop names, which
//! a request waiting for ours may hold.

use std::cell::Cell;
use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, Instant};

use memfs_fs::{
    Config, Errno, FIRST_ENTRY_OFFSET, Fs, PAGE_SIZE, Released, RollbackOutcome, SnapshotInfo,
};

use crate::Tree;
use crate::notify::{Inval, Notifications};
use crate::snapdir::{BuildTree, DurableSnapshot, SNAPDIR, Slots, VIEW_SNAPSHOT};
use parking_lot::{RwLock, RwLockReadGuard};

thread_local! {
    /// Guards of the cell this thread holds: a nested `get` (an argument
    /// evaluated while another guard lives) must not queue behind a waiting
    /// swap, or the two would wait for each other.
    static HELD: Cell<usize> = const { Cell::new(0) };
}

/// The engine's page: its rollback reports changed runs in pages.
const PAGE: u64 = PAGE_SIZE as u64;

/// What an online rollback did ([`Swapper::rollback_to_snapshot`]).
#[derive(Debug, Default, Clone)]
pub struct RollbackReport {
    /// Nodes and `(directory, name)` entries the rollback changed.
    pub changed: usize,
    pub entries: usize,
    /// Of those, how many the kernel was told to forget (the rest it did not hold).
    pub inodes: usize,
    pub names: usize,
    /// Waiting for the requests in flight, the engine's rollback, and the
    /// kernel notifications.
    pub wait: Duration,
    pub engine: Duration,
    pub invalidate: Duration,
    /// Inode notifications sent (one per changed page run of a file whose
    /// size stayed, else one per node).
    pub notifications: usize,
    /// From the end of the engine's part until the replaced contents were
    /// freed (beside the invalidation).
    pub freed: Duration,
}

/// The tree a mount serves (any [`Tree`]; only the local engine's is
/// ever replaced, by a [`Swapper`]).
pub struct FsCell<T: Tree = Fs> {
    current: RwLock<Arc<T>>,
}

/// The served tree, held for as long as this lives.
pub struct FsGuard<'a, T: Tree = Fs>(RwLockReadGuard<'a, Arc<T>>);

impl<T: Tree> Deref for FsGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Tree> Drop for FsGuard<'_, T> {
    fn drop(&mut self) {
        HELD.with(|h| h.set(h.get() - 1));
    }
}

impl<T: Tree> FsCell<T> {
    pub fn new(fs: Arc<T>) -> Self {
        FsCell {
            current: RwLock::new(fs),
        }
    }

    #[inline]
    pub fn get(&self) -> FsGuard<'_, T> {
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

/// Replaces the tree of a running mount; see the module comment. Only the
/// local engine's ([`Tree::local`]): online rollback, swaps and snapshots
/// are the engine's own, so every method is on `Swapper<Fs>`.
pub struct Swapper<T: Tree = Fs> {
    cell: Arc<FsCell<T>>,
    notify: Notifications,
    slots: Arc<Slots>,
    snapdir_name: Vec<u8>,
}

impl<T: Tree> Clone for Swapper<T> {
    fn clone(&self) -> Self {
        Swapper {
            cell: self.cell.clone(),
            notify: self.notify.clone(),
            slots: self.slots.clone(),
            snapdir_name: self.snapdir_name.clone(),
        }
    }
}

impl<T: Tree> Swapper<T> {
    pub(crate) fn new(
        cell: Arc<FsCell<T>>,
        notify: Notifications,
        slots: Arc<Slots>,
        snapdir_name: Vec<u8>,
    ) -> Self {
        Swapper {
            cell,
            notify,
            slots,
            snapdir_name,
        }
    }
}

impl Swapper {
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
        let id = fs.snapshot_id(name);
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

    /// A writable copy-on-write clone of snapshot `name`, to be mounted
    /// elsewhere: of the served tree's engine snapshot, else of a durable
    /// snapshot's tree rebuilt aside (`.snapshots`' view of it, built now if
    /// need be).
    pub fn clone_snapshot(&self, name: &[u8], config: Config) -> Result<Fs, Errno> {
        // A statement of its own: the served tree is let go before a build
        // (an online rollback waiting for it must not wait for the build).
        let served = self.cell.get().clone_snapshot(name, config);
        match served {
            Err(e) if e == Errno::ENOENT => {}
            r => return r,
        }
        let (_, view) = self.slots.durable(name)?.ok_or(Errno::ENOENT)?;
        let (fs, _) = view.get()?;
        fs.clone_snapshot(VIEW_SNAPSHOT, config)
    }

    /// Online rollback of the live tree to snapshot `name`: no request runs
    /// while the engine switches (they hold the cell shared), then the
    /// kernel forgets what it cached of every node and name that changed
    /// (with the lock released, as in [`Swapper::swap`]). Nodes the kernel
    /// does not hold, and names in directories it does not hold, are
    /// skipped: it has nothing cached for them ([`Fs::kernel_holds`]).
    pub fn rollback_to_snapshot(&self, name: &[u8]) -> Result<RollbackReport, Errno> {
        let t0 = Instant::now();
        let cur = self.cell.current.write();
        let locked = Instant::now();
        let (out, released): (RollbackOutcome, Released) =
            cur.rollback_to_snapshot_deferred(name)?;
        let fs: Arc<Fs> = (*cur).clone();
        drop(cur);
        let engine = locked.elapsed();
        let t1 = Instant::now();
        // The replaced contents are freed beside the notifications (O(pages)
        // of a big file rewritten since the snapshot), joined before the
        // reply so that the usage is exact when the command returns.
        let freeing = std::thread::Builder::new()
            .name("memfs-rollback-free".into())
            .spawn(move || drop(released));
        let mut r = RollbackReport {
            changed: out.changed.len(),
            entries: out.entries.len(),
            wait: locked - t0,
            engine,
            ..Default::default()
        };
        let mut inval = inode_invalidations(&fs, &out, &mut r);
        r.notifications = inval.len();
        for (parent, name) in out.entries {
            if fs.kernel_holds(parent) {
                inval.push(Inval::Entry { parent, name });
                r.names += 1;
            }
        }
        // Nothing held: the cell was released above, and the caller holds
        // no lock a request waits for (docs/fuse.md, "Notifications").
        self.notify.send_and_wait("online rollback", inval);
        r.invalidate = t1.elapsed();
        if let Ok(t) = freeing {
            let _ = t.join();
        }
        r.freed = t1.elapsed();
        tracing::info!(
            "rolled back to snapshot {}: {} nodes and {} names changed, {} and {} invalidated \
             ({} inode notifications); lock {:?}, engine {:?}, invalidation {:?}, \
             freeing the old contents done after {:?}",
            String::from_utf8_lossy(name),
            r.changed,
            r.entries,
            r.inodes,
            r.names,
            r.notifications,
            r.wait,
            r.engine,
            r.invalidate,
            r.freed
        );
        Ok(r)
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
        self.notify.send_and_wait(
            "the snapshot directory",
            vec![
                Inval::Entry {
                    parent: SNAPDIR,
                    name: name.to_vec(),
                },
                Inval::Inode {
                    ino: SNAPDIR,
                    off: 0,
                    len: 0,
                },
            ],
        );
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
        let mut names: Vec<Vec<u8>> = cur.snapshot_names().into_iter().map(|(_, n)| n).collect();
        names.extend(self.slots.durable_names());
        let (new, v) = make(&cur)?;
        // Record locks (`--locks engine`) belong to processes, not to a
        // commit: they stay on every file the new tree still has, and the
        // waiters of those it lacks are answered, not left in the old tree.
        // No request runs meanwhile (the cell is held).
        let locks = cur.take_locks();
        if !locks.is_empty() {
            tracing::info!(
                "carrying the locks of {} files into the new tree",
                locks.len()
            );
        }
        new.adopt_locks(locks);
        let old = std::mem::replace(&mut *cur, new);
        // The old tree's snapshots went with it.
        self.slots.forget_all();
        drop(cur);
        // Every name `.snapshots` showed: a snapshot the swap dropped must
        // answer ENOENT, not ESTALE through a cached name.
        let mut inval: Vec<Inval> = names
            .into_iter()
            .map(|name| Inval::Entry {
                parent: SNAPDIR,
                name,
            })
            .collect();
        inval.push(Inval::Inode {
            ino: SNAPDIR,
            off: 0,
            len: 0,
        });
        let (inodes, entries) = old_tree(&old, &mut inval);
        drop(old);
        // The cell is released; the caller holds no lock a request waits
        // for (docs/fuse.md, "Notifications").
        let sent = self.notify.send_and_wait("swap of the served tree", inval);
        tracing::info!(
            "swapped the served tree; invalidated {inodes} inodes and {entries} names{}",
            sent.map_or(" (not all taken yet)".into(), |s| format!(
                " in {:?}",
                s.took
            ))
        );
        Ok(v)
    }
}

/// Every node and name of `old`, to be forgotten; returns how many of each.
fn old_tree(old: &Fs, inval: &mut Vec<Inval>) -> (usize, usize) {
    let (mut inodes, mut entries) = (0usize, 0usize);
    for node in old.nodes() {
        // ENOENT: the kernel does not know the node; nothing to drop.
        inval.push(Inval::Inode {
            ino: node.ino(),
            off: 0,
            len: 0,
        });
        inodes += 1;
        node.read(|v| {
            v.entries_from(FIRST_ENTRY_OFFSET, |name, _, _, _| {
                inval.push(Inval::Entry {
                    parent: node.ino(),
                    name: name.to_vec(),
                });
                entries += 1;
                true
            })
        });
    }
    (inodes, entries)
}

/// What the kernel must drop of the nodes an online rollback changed and it
/// holds (counted in `r`).
fn inode_invalidations(fs: &Fs, out: &RollbackOutcome, r: &mut RollbackReport) -> Vec<Inval> {
    // What to drop: offset -1 is the attributes only, length 0 to the
    // end of the file.
    let mut inval: Vec<Inval> = Vec::new();
    for &ino in &out.changed {
        if !fs.kernel_holds(ino) {
            continue;
        }
        r.inodes += 1;
        match out.page_runs.binary_search_by_key(&ino, |p| p.0) {
            // Only these pages changed: the rest of the page cache stays
            // (dropping cached pages costs the kernel about a microsecond
            // each, a whole big file's far more than its changes).
            Ok(i) if out.page_runs[i].1.is_empty() => inval.push(Inval::Inode {
                ino,
                off: -1,
                len: 0,
            }),
            Ok(i) => inval.extend(out.page_runs[i].1.iter().map(|&(first, n)| Inval::Inode {
                ino,
                off: (first * PAGE) as i64,
                len: n.saturating_mul(PAGE).min(i64::MAX as u64) as i64,
            })),
            Err(_) => inval.push(Inval::Inode {
                ino,
                off: 0,
                len: 0,
            }),
        }
    }
    inval
}
