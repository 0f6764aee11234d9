//! Named snapshots of the whole tree, read-only views of them, rollback of
//! the live tree to one, and clones (issue 12; docs/snapshots.md).

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::sync::ShardedLockReadGuard;
use parking_lot::RwLockWriteGuard;

use crate::core::{Base, Core, Frozen, Preserved, Snap};
use crate::dir::FIRST_SLOT_OFFSET;
use crate::fs::{DirEntry, Fs, check_access, list_dir};
use crate::inode::{Body, Inode, Meta, State, attr_of};
use crate::invariant::uncount;
use crate::types::{Attr, Config, Ctx, FileType, NAME_MAX, PAGE_SIZE, ROOT_INO, Timespec};
use crate::{Errno, Result};

/// Most snapshots one file system keeps at once.
pub const MAX_SNAPSHOTS: usize = 1024;

/// What [`Fs::snapshot_list`] tells of one snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Never reused within one `Fs`.
    pub id: u64,
    pub name: Vec<u8>,
    /// Wall clock at creation.
    pub created: Timespec,
    /// Nodes the snapshot keeps alive on its own (preserved copies).
    pub nodes: u64,
    /// Memory it keeps alive on its own (pages only it holds, copies): an estimate.
    pub bytes: u64,
}

/// What a rollback changed, for the layer above to drop kernel caches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RollbackOutcome {
    /// Inodes whose attributes, data or entries changed (kernel caches to drop).
    pub changed: Vec<u64>,
    /// (parent, name) of every entry added, removed or re-pointed in a
    /// directory by the rollback (kernel dentries to drop).
    pub entries: Vec<(u64, Vec<u8>)>,
    /// For regular files of `changed` whose size did not change and that
    /// the kernel holds: the page runs `(first page, pages)` whose contents
    /// changed (possibly none: only attributes did), so that the kernel
    /// keeps the rest of its page cache. A changed node not listed here
    /// may have changed anywhere. Sorted by inode.
    pub page_runs: Vec<(u64, Vec<(u64, u64)>)>,
}

/// Beyond this many changed page runs in one file, a rollback reports the
/// whole file as changed (16 bytes a run: 16 MiB at most per file).
const MAX_PAGE_RUNS: usize = 1 << 20;

/// The contents a rollback replaced ([`Fs::rollback_to_snapshot_deferred`]):
/// freed, and their pages given back to the file system's usage, when this
/// is dropped.
pub struct Released {
    bodies: Vec<Body>,
    used_pages: Arc<AtomicU64>,
}

impl Released {
    fn keep(&mut self, body: Body) {
        // Directories and symlinks are small: only file pages are worth deferring.
        match body {
            Body::File(_) => self.bodies.push(body),
            other => drop(other),
        }
    }
}

impl Drop for Released {
    fn drop(&mut self) {
        let freed: u64 = self.bodies.drain(..).map(release_body).sum();
        if freed > 0 {
            uncount(&self.used_pages, freed, "pages");
        }
    }
}

impl Frozen {
    /// Pages only this copy holds.
    fn unique_pages(&self) -> u64 {
        match &self.body {
            Body::File(d) => d.unique_pages(),
            _ => 0,
        }
    }
}

/// A copy of a body that shares a file's pages (and copies the rest), with
/// the pages the copy adds to the file system's usage.
fn copy_body(body: &Body) -> (Body, u64) {
    match body {
        Body::File(d) => {
            let (d, added) = d.clone_shared();
            (Body::File(d), added)
        }
        other => (other.clone(), 0),
    }
}

/// Lets a body go; returns the pages that gives back.
fn release_body(body: Body) -> u64 {
    match body {
        Body::File(d) => d.release(),
        _ => 0,
    }
}

impl Snap {
    fn info(&self) -> SnapshotInfo {
        let map = self.map.lock();
        let mut nodes = 0;
        let mut bytes = 0;
        for f in map.values().flatten() {
            nodes += 1;
            bytes +=
                (std::mem::size_of::<Frozen>() + 48) as u64 + f.unique_pages() * PAGE_SIZE as u64;
        }
        SnapshotInfo {
            id: self.id,
            name: self.name.clone(),
            created: self.created,
            nodes,
            bytes,
        }
    }
}

thread_local! {
    /// How deep this thread is inside gated operations: an operation that
    /// calls another (`copy_file_range` calls `write`) must not take the gate
    /// twice, as a waiting snapshot would deadlock a fair lock.
    static GATE_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// The gate held shared for one mutating operation.
pub(crate) struct GateGuard<'a> {
    _guard: Option<ShardedLockReadGuard<'a, ()>>,
}

impl Drop for GateGuard<'_> {
    fn drop(&mut self) {
        GATE_DEPTH.with(|d| d.set(d.get() - 1));
    }
}

fn check_snapshot_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

fn entries_of(body: &Body) -> HashMap<Vec<u8>, u64> {
    let mut out = HashMap::new();
    if let Body::Dir(d) = body {
        d.list_from(FIRST_SLOT_OFFSET, |e, _| {
            out.insert(e.name.to_vec(), e.ino);
            true
        });
    }
    out
}

/// Entries added, removed or re-pointed between two versions of a directory.
fn entry_changes(ino: u64, old: &Body, new: &Body, out: &mut Vec<(u64, Vec<u8>)>) {
    let (old, new) = (entries_of(old), entries_of(new));
    for (name, i) in &old {
        if new.get(name) != Some(i) {
            out.push((ino, name.clone()));
        }
    }
    for name in new.keys() {
        if !old.contains_key(name) {
            out.push((ino, name.clone()));
        }
    }
}

impl Core {
    /// [`Fs::with_snap_node`]. A clone's copy of a file
    /// ([`crate::data::FileData::import`]) makes its pages shared itself,
    /// under each chunk's lock, so a live node is only read here.
    pub(crate) fn snap_node<R>(
        &self,
        snap: u64,
        ino: u64,
        f: impl FnOnce(FileType, &Meta, &Body) -> Result<R>,
    ) -> Result<R> {
        // Recursive: `f` may call back into snapshot views (a readdirplus
        // built on `snap_readdir` + `snap_getattr`), and a fair read would
        // queue behind a waiting create or delete while this one is held.
        let list = self.snaps.list.read_recursive();
        let i = list
            .binary_search_by_key(&snap, |s| s.id)
            .map_err(|_| Errno::ESTALE)?;
        let epoch = list[i].epoch;
        // A writer that changes the node between the two looks preserves
        // it first, so the second round finds it; more rounds than writers
        // could ever race would be a bug in the preservation: an error,
        // never a hang.
        for _ in 0..1_000_000 {
            for s in &list[i..] {
                let found = s.map.lock().get(&ino).cloned();
                if let Some(v) = found {
                    let fr = v.ok_or(Errno::ENOENT)?;
                    return f(fr.kind, &fr.meta, &fr.body);
                }
            }
            let node = self.get(ino)?;
            let st = node.state.read();
            if st.epoch <= epoch {
                return f(node.kind, &st.meta, &st.body);
            }
        }
        tracing::error!(snap, ino, "snapshot node neither preserved nor unchanged");
        Err(Errno::EIO)
    }
}

impl Fs {
    /// Enters an operation that changes the tree (see [`Snapshots::gate`]).
    pub(crate) fn enter(&self) -> GateGuard<'_> {
        let depth = GATE_DEPTH.with(|d| {
            let v = d.get();
            d.set(v + 1);
            v
        });
        GateGuard {
            _guard: (depth == 0).then(|| self.core.snaps.gate.read()),
        }
    }

    /// A new node, born in the current epoch. While snapshots exist, the
    /// newest one notes that it had no such node, so that no snapshot shows
    /// it (inode numbers are never reused).
    pub(crate) fn new_inode(&self, ino: u64, kind: FileType, meta: Meta, body: Body) -> Arc<Inode> {
        let mut inode = Inode::new(ino, kind, meta, body);
        inode.state.get_mut().epoch = self.core.snaps.epoch.load(Ordering::Acquire);
        // Callers hold the gate (or are a rebuild nobody sees), so no
        // snapshot comes or goes meanwhile: no lock when there are none.
        if self.core.snaps.count.load(Ordering::Acquire) > 0
            && let Some(newest) = self.core.snaps.list.read_recursive().last()
        {
            newest.map.lock().entry(ino).or_insert(None);
        }
        Arc::new(inode)
    }

    /// Locks a node's state for a change. The first change after a
    /// snapshot first preserves the node as it is, for the snapshots that
    /// see it (every change to a node goes through here).
    pub(crate) fn write_state<'a>(&self, inode: &'a Inode) -> RwLockWriteGuard<'a, State> {
        let mut st = inode.state.write();
        if st.epoch < self.core.snaps.epoch.load(Ordering::Acquire) {
            self.preserve(inode, &mut st);
        }
        st
    }

    #[cold]
    fn preserve(&self, inode: &Inode, st: &mut State) {
        let list = self.core.snaps.list.read_recursive();
        // A snapshot is added and its epoch closed under the list's write
        // lock, so the two agree here.
        let epoch = self.core.snaps.epoch.load(Ordering::Acquire);
        if let Some(newest) = list.last()
            && st.epoch <= newest.epoch
            && !newest.map.lock().contains_key(&inode.ino)
        {
            // Copied outside the map's lock (a big file's chunk table, or a
            // big directory, takes a while); nobody else can add this node meanwhile: its lock is
            // held here, and deletions wait for the list.
            let frozen = Arc::new(self.freeze(inode.kind, st));
            newest.map.lock().insert(inode.ino, Some(frozen));
        }
        st.epoch = epoch;
    }

    /// The node's state as a snapshot keeps it: a file's chunk table is
    /// copied, its chunks shared (O(pages / 64), no page touched; the live
    /// file's first write to a chunk unshares it); a directory's entries, a symlink's target and the
    /// xattrs are copied (a directory costs O(entries) once per snapshot
    /// that sees it change).
    fn freeze(&self, kind: FileType, st: &mut State) -> Frozen {
        let (body, added) = match &mut st.body {
            Body::File(d) => {
                let (d, added) = d.share();
                (Body::File(d), added)
            }
            other => (other.clone(), 0),
        };
        self.used_pages.fetch_add(added, Ordering::AcqRel);
        self.used_inodes.fetch_add(1, Ordering::AcqRel);
        Frozen {
            kind,
            meta: st.meta.clone(),
            body,
            used: (self.used_pages.clone(), self.used_inodes.clone()),
        }
    }

    /// Runs `f` on node `ino` as snapshot `snap` has it: the first preserved
    /// copy in that snapshot or a newer one, else the live node, if it has
    /// not changed since (if it has, a writer preserved it meanwhile: look
    /// again).
    fn with_snap_node<R>(
        &self,
        snap: u64,
        ino: u64,
        f: impl FnOnce(FileType, &Meta, &Body) -> Result<R>,
    ) -> Result<R> {
        self.core.snap_node(snap, ino, f)
    }

    /// Freezes the tree as it is now under `name`: O(1), no copy. Every
    /// change waits for it (the gate), for an instant.
    pub fn snapshot_create(&self, name: &[u8]) -> Result<SnapshotInfo> {
        check_snapshot_name(name)?;
        let _gate = self.core.snaps.gate.write();
        let mut list = self.core.snaps.list.write();
        if list.iter().any(|s| s.name == name) {
            return Err(Errno::EEXIST);
        }
        if list.len() >= MAX_SNAPSHOTS {
            return Err(Errno::ENOSPC);
        }
        let epoch = self.core.snaps.epoch.load(Ordering::Acquire);
        let snap = Arc::new(Snap {
            id: self.core.snaps.next_id.fetch_add(1, Ordering::AcqRel) + 1,
            name: name.to_vec(),
            created: Timespec::now(),
            epoch,
            map: Default::default(),
            clones: Default::default(),
        });
        list.push(snap.clone());
        self.core.snaps.count.store(list.len(), Ordering::Release);
        self.core.snaps.epoch.store(epoch + 1, Ordering::Release);
        drop(list);
        Ok(snap.info())
    }

    /// Deletes the snapshot named `name`. What it preserved passes to the
    /// next older snapshot where that one has nothing for the node (it was
    /// that snapshot's state too); the rest is freed.
    pub fn snapshot_delete(&self, name: &[u8]) -> Result<()> {
        let mut leftovers = Vec::new();
        loop {
            // Lazy clones reading it become whole first, without this
            // file system's locks (they read through its views).
            let readers: Vec<Arc<Core>> = {
                let list = self.core.snaps.list.read();
                let snap = list.iter().find(|s| s.name == name).ok_or(Errno::ENOENT)?;
                let clones = snap.clones.lock();
                clones
                    .iter()
                    .filter_map(|c| c.upgrade())
                    .filter(|c| c.reads(snap))
                    .collect()
            };
            for c in &readers {
                c.detach()?;
            }
            let mut list = self.core.snaps.list.write();
            let i = list
                .iter()
                .position(|s| s.name == name)
                .ok_or(Errno::ENOENT)?;
            let cloned_meanwhile = list[i]
                .clones
                .lock()
                .iter()
                .filter_map(|c| c.upgrade())
                .any(|c| c.reads(&list[i]));
            if cloned_meanwhile {
                continue;
            }
            let snap = list.remove(i);
            self.core.snaps.count.store(list.len(), Ordering::Release);
            let map = std::mem::take(&mut *snap.map.lock());
            match i.checked_sub(1) {
                Some(older) => {
                    let mut om = list[older].map.lock();
                    for (ino, v) in map {
                        match om.entry(ino) {
                            std::collections::hash_map::Entry::Vacant(e) => {
                                e.insert(v);
                            }
                            std::collections::hash_map::Entry::Occupied(_) => leftovers.push(v),
                        }
                    }
                }
                None => leftovers.extend(map.into_values()),
            }
            break;
        }
        // Freed outside the list lock: a big snapshot takes a while.
        drop(leftovers);
        Ok(())
    }

    /// Every snapshot, oldest first.
    pub fn snapshot_list(&self) -> Vec<SnapshotInfo> {
        self.core
            .snaps
            .list
            .read()
            .iter()
            .map(|s| s.info())
            .collect()
    }

    pub fn snapshot_by_name(&self, name: &[u8]) -> Option<SnapshotInfo> {
        let list = self.core.snaps.list.read();
        list.iter().find(|s| s.name == name).map(|s| s.info())
    }

    /// The id of snapshot `name`: O(snapshots), where
    /// [`Fs::snapshot_by_name`] also sums what the snapshot preserved
    /// (O(its nodes and their pages)), which a lookup of `.snapshots/NAME`
    /// does not need.
    pub fn snapshot_id(&self, name: &[u8]) -> Option<u64> {
        let list = self.core.snaps.list.read();
        list.iter().find(|s| s.name == name).map(|s| s.id)
    }

    /// `(id, name)` of every snapshot, oldest first, without the sizes of
    /// [`Fs::snapshot_list`] (a listing of `.snapshots` needs none).
    pub fn snapshot_names(&self) -> Vec<(u64, Vec<u8>)> {
        let list = self.core.snaps.list.read();
        list.iter().map(|s| (s.id, s.name.clone())).collect()
    }

    /// Whether the kernel may hold node `ino` (it was looked up and not
    /// forgotten since): a node it does not hold has nothing cached, and a
    /// directory it does not hold has no cached names (positive or
    /// negative) below it, so invalidating either is a wasted notification.
    /// Every reply that hands the kernel a node counts the reference first
    /// (lookup, create, readdirplus), so `false` cannot be a node the
    /// kernel is about to learn with stale contents.
    pub fn kernel_holds(&self, ino: u64) -> bool {
        ino == ROOT_INO
            || self
                .core
                .inodes
                .get(&ino)
                .is_some_and(|n| n.nlookup.load(Ordering::Acquire) > 0)
    }

    /// Attributes of `ino` in snapshot `snap` (an id; `ESTALE` once deleted).
    pub fn snap_getattr(&self, snap: u64, ino: u64) -> Result<Attr> {
        self.with_snap_node(snap, ino, |kind, m, b| Ok(attr_of(m, b, ino, kind)))
    }

    /// Looks `name` up in directory `parent` of snapshot `snap`; takes no
    /// kernel reference.
    pub fn snap_lookup(&self, snap: u64, parent: u64, name: &[u8]) -> Result<Attr> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let child = self.with_snap_node(snap, parent, |_, _, b| {
            if name == b"." {
                return Ok(parent);
            }
            let Body::Dir(d) = b else {
                return Err(Errno::ENOTDIR);
            };
            match name {
                b".." => Ok(d.parent),
                _ => Ok(d.get(name).ok_or(Errno::ENOENT)?.0),
            }
        })?;
        self.snap_getattr(snap, child)
    }

    /// Lists directory `ino` of snapshot `snap` with the offsets and contract
    /// of [`Fs::readdir`].
    pub fn snap_readdir(
        &self,
        snap: u64,
        ino: u64,
        offset: u64,
        mut f: impl FnMut(DirEntry<'_>) -> bool,
    ) -> Result<()> {
        self.with_snap_node(snap, ino, |_, _, b| {
            let Body::Dir(d) = b else {
                return Err(Errno::ENOTDIR);
            };
            list_dir(ino, d, offset, &mut f);
            Ok(())
        })
    }

    /// Reads file `ino` of snapshot `snap`; returns the count (0 at its end).
    pub fn snap_read(&self, snap: u64, ino: u64, off: u64, buf: &mut [u8]) -> Result<usize> {
        self.snap_read_with(snap, ino, off, buf.len(), |parts| {
            let mut n = 0;
            for p in parts {
                buf[n..n + p.len()].copy_from_slice(p);
                n += p.len();
            }
            n
        })
    }

    /// [`Fs::read_with`] on file `ino` of snapshot `snap`: `f` gets slices
    /// covering up to `len` bytes at `off` (clipped at the snapshot's end of
    /// file), with no copy; nothing can change them meanwhile.
    pub fn snap_read_with<R>(
        &self,
        snap: u64,
        ino: u64,
        off: u64,
        len: usize,
        f: impl FnOnce(&[&[u8]]) -> R,
    ) -> Result<R> {
        self.with_snap_node(snap, ino, |_, m, b| {
            let data = match b {
                Body::File(d) => d,
                Body::Dir(_) => return Err(Errno::EISDIR),
                _ => return Err(Errno::EINVAL),
            };
            let n = (m.size.saturating_sub(off) as usize).min(len);
            Ok(data.with_slices(off, n, f))
        })
    }

    pub fn snap_readlink(&self, snap: u64, ino: u64) -> Result<Vec<u8>> {
        self.with_snap_node(snap, ino, |_, _, b| match b {
            Body::Symlink(t) => Ok(t.to_vec()),
            _ => Err(Errno::EINVAL),
        })
    }

    pub fn snap_getxattr(&self, snap: u64, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        crate::xattr::check_name(name)?;
        self.with_snap_node(snap, ino, |_, m, _| {
            m.xattrs
                .as_ref()
                .and_then(|x| x.get(name))
                .map(|v| v.to_vec())
                .ok_or(Errno::ENODATA)
        })
    }

    /// Names, each followed by NUL.
    pub fn snap_listxattr(&self, snap: u64, ino: u64) -> Result<Vec<u8>> {
        self.with_snap_node(snap, ino, |_, m, _| {
            Ok(m.xattrs.as_ref().map(|x| x.list()).unwrap_or_default())
        })
    }

    /// `access(2)` on a snapshot's node: as on the live tree, but `W_OK` is
    /// `EROFS` (a snapshot is read-only).
    pub fn snap_access(&self, ctx: Ctx, snap: u64, ino: u64, mask: i32) -> Result<()> {
        let (attr, acl) = self.with_snap_node(snap, ino, |kind, m, b| {
            Ok((attr_of(m, b, ino, kind), Fs::access_acl(m)))
        })?;
        if mask & libc::W_OK != 0 {
            return Err(Errno::EROFS);
        }
        check_access(ctx, &|_| false, &attr, acl, mask)
    }

    /// Every node snapshot `name` preserved or marked absent, with those of
    /// the newer snapshots (the first found wins): the nodes that changed
    /// since it. Everything else is in the live table as it was.
    fn changed_since(&self, name: &[u8]) -> Result<(u64, Preserved)> {
        let list = self.core.snaps.list.read();
        let i = list
            .iter()
            .position(|s| s.name == name)
            .ok_or(Errno::ENOENT)?;
        let mut out = Preserved::new();
        for s in &list[i..] {
            for (&ino, v) in s.map.lock().iter() {
                out.entry(ino).or_insert_with(|| v.clone());
            }
        }
        Ok((list[i].id, out))
    }

    /// Makes the live tree equal to snapshot `name`'s, restoring only what
    /// changed since it. The snapshot stays, and so do the snapshots taken
    /// after it (each restore is a change, preserved for them first). Nodes
    /// the snapshot does not have lose their names; those the kernel or an
    /// open handle still refers to live on unlinked, as after `unlink`.
    pub fn rollback_to_snapshot(&self, name: &[u8]) -> Result<RollbackOutcome> {
        self.rollback_to_snapshot_deferred(name)
            .map(|(out, _released)| out)
    }

    /// [`Fs::rollback_to_snapshot`], handing back what the live nodes held
    /// before instead of freeing it: dropping [`Released`] frees it and
    /// gives its pages back to the usage (O(its pages): a big file
    /// rewritten since the snapshot has many), so the caller may do that
    /// after releasing its own locks, or on another thread. Until then the
    /// usage counts both the old and the restored contents.
    pub fn rollback_to_snapshot_deferred(
        &self,
        name: &[u8],
    ) -> Result<(RollbackOutcome, Released)> {
        if self.recorder.is_some() {
            // A durable rollback must be journaled: not built yet.
            return Err(Errno::EOPNOTSUPP);
        }
        let _gate = self.core.snaps.gate.write();
        let (_, target) = self.changed_since(name)?;
        let mut out = RollbackOutcome::default();
        let mut released = Released {
            bodies: Vec::new(),
            used_pages: self.used_pages.clone(),
        };
        let mut doomed = Vec::new();
        for (ino, want) in target {
            let live = self
                .core
                .inodes
                .get(&ino)
                .map(|r| r.value().clone())
                .filter(|n| !n.freed.load(Ordering::Acquire));
            match (want, live) {
                (None, None) => {}
                (None, Some(node)) => {
                    if self.rollback_unname(ino, &node, &mut out) {
                        doomed.push(node);
                    }
                }
                (Some(f), Some(node)) if node.kind == f.kind => {
                    self.rollback_restore(ino, &node, &f, &mut out, &mut released);
                }
                // Freed since: born again under its old number.
                (Some(f), _) => self.rollback_rebirth(ino, &f, &mut out),
            }
        }
        for node in &doomed {
            self.maybe_free(node);
        }
        out.changed.sort_unstable();
        out.entries.sort_unstable();
        out.entries.dedup();
        out.page_runs.sort_unstable_by_key(|r| r.0);
        Ok((out, released))
    }

    /// [`Fs::rollback_to_snapshot_deferred`] of a node the snapshot does not
    /// have: it loses its links (a directory its entries too); true if it
    /// had any, and is to be freed once nothing refers to it.
    fn rollback_unname(&self, ino: u64, node: &Inode, out: &mut RollbackOutcome) -> bool {
        let mut st = self.write_state(node);
        if st.meta.nlink == 0 {
            return false;
        }
        entry_changes(ino, &st.body, &Body::Special(0), &mut out.entries);
        st.meta.nlink = 0;
        if let Body::Dir(d) = &mut st.body {
            **d = crate::dir::Dir::new(d.parent);
        }
        out.changed.push(ino);
        true
    }

    /// [`Fs::rollback_to_snapshot_deferred`] of a node changed since the
    /// snapshot: it takes back the state `f` the snapshot kept, and what it
    /// held goes to `released`.
    fn rollback_restore(
        &self,
        ino: u64,
        node: &Inode,
        f: &Frozen,
        out: &mut RollbackOutcome,
        released: &mut Released,
    ) {
        let mut st = self.write_state(node);
        entry_changes(ino, &st.body, &f.body, &mut out.entries);
        if let (Body::File(old), Body::File(new)) = (&st.body, &f.body)
            && st.meta.size == f.meta.size
            && node.nlookup.load(Ordering::Acquire) > 0
            && let Some(runs) = old.changed_runs(new, MAX_PAGE_RUNS)
        {
            // (A size change makes the kernel drop the file's
            // whole page cache when it reads the new size.)
            out.page_runs.push((ino, runs));
        }
        let (body, added) = copy_body(&f.body);
        st.meta = f.meta.clone();
        released.keep(std::mem::replace(&mut st.body, body));
        self.give_back(-(added as i64));
        out.changed.push(ino);
    }

    /// [`Fs::rollback_to_snapshot_deferred`] of a node freed since the
    /// snapshot (or of another type now): a node as `f` under its old number.
    fn rollback_rebirth(&self, ino: u64, f: &Frozen, out: &mut RollbackOutcome) {
        entry_changes(ino, &Body::Special(0), &f.body, &mut out.entries);
        let (body, added) = copy_body(&f.body);
        let node = self.new_inode(ino, f.kind, f.meta.clone(), body);
        if ino == ROOT_INO {
            node.nlookup.store(1, Ordering::Relaxed);
        }
        self.core.inodes.insert(ino, node);
        self.used_pages.fetch_add(added, Ordering::AcqRel);
        self.used_inodes.fetch_add(1, Ordering::AcqRel);
        out.changed.push(ino);
    }

    /// A new, independent file system whose tree is snapshot `name`'s,
    /// with the same inode numbers: O(1). It copies each node from this
    /// one the first time it needs it (`lazy.rs`); deleting the snapshot
    /// makes it whole first. Its usage counts the nodes copied so far, and
    /// `config` limits what it allocates, not what it copies.
    pub fn clone_snapshot(&self, name: &[u8], config: Config) -> Result<Fs> {
        let fs = Fs::new(config);
        fs.core.inodes.clear();
        fs.used_inodes.store(0, Ordering::Release);
        let list = self.core.snaps.list.read();
        let snap = list
            .iter()
            .find(|s| s.name == name)
            .ok_or(Errno::ENOENT)?
            .clone();
        // Every number the snapshot has is below this.
        let limit = self.next_ino.load(Ordering::Acquire);
        fs.next_ino.store(limit, Ordering::Release);
        let id = snap.id;
        {
            let mut clones = snap.clones.lock();
            clones.retain(|c| c.strong_count() > 0);
            clones.push(Arc::downgrade(&fs.core));
        }
        fs.core.attach(
            Base {
                core: self.core.clone(),
                snap,
                id,
            },
            limit,
        );
        drop(list);
        Ok(fs)
    }

    /// Copies every node a lazy clone has not copied yet (a walk of its
    /// tree, changes held back meanwhile), which makes it independent of
    /// its origin; nothing for other file systems.
    pub(crate) fn materialize_all(&self) {
        if let Err(e) = self.core.detach() {
            tracing::error!(%e, "lazy clone: copying its tree failed");
        }
    }
}
