//! Named snapshots of the whole tree, read-only views of them, rollback of
//! the live tree to one, and clones (issue 12; docs/snapshots.md).

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{RwLock, RwLockReadGuard};

use crate::dir::FIRST_SLOT_OFFSET;
use crate::fs::{DirEntry, Fs, check_access};
use crate::inode::{Body, Inode, Meta, attr_of};
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
}

/// A node as a snapshot holds it.
pub(crate) struct Frozen {
    kind: FileType,
    meta: Meta,
    body: Body,
}

impl Frozen {
    fn attr(&self, ino: u64) -> Attr {
        attr_of(&self.meta, &self.body, ino, self.kind)
    }

    fn pages(&self) -> u64 {
        match &self.body {
            Body::File(d) => d.page_count(),
            _ => 0,
        }
    }
}

struct Snap {
    id: u64,
    name: Vec<u8>,
    created: Timespec,
    nodes: HashMap<u64, Arc<Frozen>>,
    pages: u64,
}

impl Snap {
    fn info(&self) -> SnapshotInfo {
        let nodes = self.nodes.len() as u64;
        SnapshotInfo {
            id: self.id,
            name: self.name.clone(),
            created: self.created,
            nodes,
            bytes: self.pages * PAGE_SIZE as u64 + nodes * std::mem::size_of::<Frozen>() as u64,
        }
    }
}

/// The snapshots of one file system.
#[derive(Default)]
pub(crate) struct Snapshots {
    /// Oldest first; ids ascend.
    list: RwLock<Vec<Arc<Snap>>>,
    next_id: AtomicU64,
    /// Held shared by every operation that changes the tree, for its whole
    /// body, and exclusively while a snapshot is taken or a rollback runs:
    /// so a snapshot never sees half of a rename. Readers never take it.
    gate: RwLock<()>,
}

thread_local! {
    /// How deep this thread is inside gated operations: an operation that
    /// calls another (`copy_file_range` calls `write`) must not take the gate
    /// twice, as a waiting snapshot would deadlock a fair lock.
    static GATE_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// The gate held shared for one mutating operation.
pub(crate) struct GateGuard<'a> {
    _guard: Option<RwLockReadGuard<'a, ()>>,
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

fn frozen_of(kind: FileType, meta: &Meta, body: &Body) -> Frozen {
    Frozen {
        kind,
        meta: meta.clone(),
        body: body.clone(),
    }
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

impl Fs {
    /// Enters an operation that changes the tree (see [`Snapshots::gate`]).
    pub(crate) fn enter(&self) -> GateGuard<'_> {
        let depth = GATE_DEPTH.with(|d| {
            let v = d.get();
            d.set(v + 1);
            v
        });
        GateGuard {
            _guard: (depth == 0).then(|| self.snaps.gate.read()),
        }
    }

    fn snap(&self, id: u64) -> Result<Arc<Snap>> {
        let list = self.snaps.list.read();
        let i = list
            .binary_search_by_key(&id, |s| s.id)
            .map_err(|_| Errno::ESTALE)?;
        Ok(list[i].clone())
    }

    fn snap_named(&self, name: &[u8]) -> Result<Arc<Snap>> {
        let list = self.snaps.list.read();
        list.iter()
            .find(|s| s.name == name)
            .cloned()
            .ok_or(Errno::ENOENT)
    }

    fn frozen(&self, snap: u64, ino: u64) -> Result<Arc<Frozen>> {
        self.snap(snap)?
            .nodes
            .get(&ino)
            .cloned()
            .ok_or(Errno::ENOENT)
    }

    /// Freezes the tree as it is now under `name`.
    pub fn snapshot_create(&self, name: &[u8]) -> Result<SnapshotInfo> {
        check_snapshot_name(name)?;
        let _gate = self.snaps.gate.write();
        {
            let list = self.snaps.list.read();
            if list.iter().any(|s| s.name == name) {
                return Err(Errno::EEXIST);
            }
            if list.len() >= MAX_SNAPSHOTS {
                return Err(Errno::ENOSPC);
            }
        }
        let mut nodes = HashMap::new();
        let mut pages = 0;
        for node in self.nodes_raw() {
            let st = node.state.read();
            if st.meta.nlink == 0 && node.ino != ROOT_INO {
                // Unlinked but open: not part of the tree.
                continue;
            }
            let f = frozen_of(node.kind, &st.meta, &st.body);
            pages += f.pages();
            nodes.insert(node.ino, Arc::new(f));
        }
        self.used_pages.fetch_add(pages, Ordering::AcqRel);
        self.used_inodes
            .fetch_add(nodes.len() as u64, Ordering::AcqRel);
        let snap = Arc::new(Snap {
            id: self.snaps.next_id.fetch_add(1, Ordering::AcqRel) + 1,
            name: name.to_vec(),
            created: Timespec::now(),
            nodes,
            pages,
        });
        let info = snap.info();
        self.snaps.list.write().push(snap);
        Ok(info)
    }

    /// Deletes the snapshot named `name`.
    pub fn snapshot_delete(&self, name: &[u8]) -> Result<()> {
        let snap = {
            let mut list = self.snaps.list.write();
            let i = list
                .iter()
                .position(|s| s.name == name)
                .ok_or(Errno::ENOENT)?;
            list.remove(i)
        };
        self.used_pages.fetch_sub(snap.pages, Ordering::AcqRel);
        self.used_inodes
            .fetch_sub(snap.nodes.len() as u64, Ordering::AcqRel);
        Ok(())
    }

    /// Every snapshot, oldest first.
    pub fn snapshot_list(&self) -> Vec<SnapshotInfo> {
        self.snaps.list.read().iter().map(|s| s.info()).collect()
    }

    pub fn snapshot_by_name(&self, name: &[u8]) -> Option<SnapshotInfo> {
        self.snap_named(name).ok().map(|s| s.info())
    }

    /// Attributes of `ino` in snapshot `snap` (an id; `ESTALE` once deleted).
    pub fn snap_getattr(&self, snap: u64, ino: u64) -> Result<Attr> {
        Ok(self.frozen(snap, ino)?.attr(ino))
    }

    /// Looks `name` up in directory `parent` of snapshot `snap`; takes no
    /// kernel reference.
    pub fn snap_lookup(&self, snap: u64, parent: u64, name: &[u8]) -> Result<Attr> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let s = self.snap(snap)?;
        let get = |ino: u64| s.nodes.get(&ino).cloned().ok_or(Errno::ENOENT);
        let dir = get(parent)?;
        if name == b"." {
            return Ok(dir.attr(parent));
        }
        let Body::Dir(d) = &dir.body else {
            return Err(Errno::ENOTDIR);
        };
        let ino = match name {
            b".." => d.parent,
            _ => d.get(name).ok_or(Errno::ENOENT)?.0,
        };
        Ok(get(ino)?.attr(ino))
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
        let node = self.frozen(snap, ino)?;
        let Body::Dir(d) = &node.body else {
            return Err(Errno::ENOTDIR);
        };
        if offset == 0
            && !f(DirEntry {
                ino,
                kind: FileType::Directory,
                name: b".",
                offset: 1,
            })
        {
            return Ok(());
        }
        if offset <= 1
            && !f(DirEntry {
                ino: d.parent,
                kind: FileType::Directory,
                name: b"..",
                offset: FIRST_SLOT_OFFSET,
            })
        {
            return Ok(());
        }
        d.list_from(offset.max(FIRST_SLOT_OFFSET), |s, next| {
            f(DirEntry {
                ino: s.ino,
                kind: s.kind,
                name: s.name,
                offset: next,
            })
        });
        Ok(())
    }

    /// Reads file `ino` of snapshot `snap`; returns the count (0 at its end).
    pub fn snap_read(&self, snap: u64, ino: u64, off: u64, buf: &mut [u8]) -> Result<usize> {
        let node = self.frozen(snap, ino)?;
        let data = match &node.body {
            Body::File(d) => d,
            Body::Dir(_) => return Err(Errno::EISDIR),
            _ => return Err(Errno::EINVAL),
        };
        if off >= node.meta.size {
            return Ok(0);
        }
        let n = ((node.meta.size - off) as usize).min(buf.len());
        data.read(off, &mut buf[..n]);
        Ok(n)
    }

    pub fn snap_readlink(&self, snap: u64, ino: u64) -> Result<Vec<u8>> {
        match &self.frozen(snap, ino)?.body {
            Body::Symlink(t) => Ok(t.to_vec()),
            _ => Err(Errno::EINVAL),
        }
    }

    pub fn snap_getxattr(&self, snap: u64, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        crate::xattr::check_name(name)?;
        self.frozen(snap, ino)?
            .meta
            .xattrs
            .as_ref()
            .and_then(|x| x.get(name))
            .map(|v| v.to_vec())
            .ok_or(Errno::ENODATA)
    }

    /// Names, each followed by NUL.
    pub fn snap_listxattr(&self, snap: u64, ino: u64) -> Result<Vec<u8>> {
        Ok(self
            .frozen(snap, ino)?
            .meta
            .xattrs
            .as_ref()
            .map(|x| x.list())
            .unwrap_or_default())
    }

    /// `access(2)` on a snapshot's node: as on the live tree, but `W_OK` is
    /// `EROFS` (a snapshot is read-only).
    pub fn snap_access(&self, ctx: Ctx, snap: u64, ino: u64, mask: i32) -> Result<()> {
        let node = self.frozen(snap, ino)?;
        if mask & libc::W_OK != 0 {
            return Err(Errno::EROFS);
        }
        let acl = Fs::access_acl(&node.meta);
        check_access(ctx, &|_| false, &node.attr(ino), acl, mask)
    }

    /// Makes the live tree equal to snapshot `name`'s. The snapshot stays,
    /// and so do the snapshots taken after it. Nodes the snapshot does not
    /// have lose their names; those the kernel or an open handle still
    /// refers to live on unlinked, as after `unlink`.
    pub fn rollback_to_snapshot(&self, name: &[u8]) -> Result<RollbackOutcome> {
        if self.recorder.is_some() {
            // A durable rollback must be journaled: not built yet.
            return Err(Errno::EOPNOTSUPP);
        }
        let snap = self.snap_named(name)?;
        let _gate = self.snaps.gate.write();
        let mut out = RollbackOutcome::default();
        let mut doomed = Vec::new();
        for node in self.nodes_raw() {
            if snap.nodes.contains_key(&node.ino) {
                continue;
            }
            let mut st = node.state.write();
            if st.meta.nlink == 0 {
                continue;
            }
            for name in entries_of(&st.body).into_keys() {
                out.entries.push((node.ino, name));
            }
            st.meta.nlink = 0;
            if let Body::Dir(d) = &mut st.body {
                **d = crate::dir::Dir::new(d.parent);
            }
            out.changed.push(node.ino);
            drop(st);
            doomed.push(node);
        }
        for (&ino, f) in &snap.nodes {
            let live = self
                .inodes
                .get(&ino)
                .map(|r| r.value().clone())
                .filter(|n| !n.freed.load(Ordering::Acquire) && n.kind == f.kind);
            match live {
                Some(node) => {
                    let mut st = node.state.write();
                    let (old, new) = (entries_of(&st.body), entries_of(&f.body));
                    for (name, i) in &old {
                        if new.get(name) != Some(i) {
                            out.entries.push((ino, name.clone()));
                        }
                    }
                    for name in new.keys() {
                        if !old.contains_key(name) {
                            out.entries.push((ino, name.clone()));
                        }
                    }
                    let old_pages = match &st.body {
                        Body::File(d) => d.page_count(),
                        _ => 0,
                    };
                    st.meta = f.meta.clone();
                    st.body = f.body.clone();
                    self.used_pages.fetch_add(f.pages(), Ordering::AcqRel);
                    self.used_pages.fetch_sub(old_pages, Ordering::AcqRel);
                }
                None => {
                    for name in entries_of(&f.body).into_keys() {
                        out.entries.push((ino, name));
                    }
                    let node = Arc::new(Inode::new(ino, f.kind, f.meta.clone(), f.body.clone()));
                    if ino == ROOT_INO {
                        node.nlookup.store(1, Ordering::Relaxed);
                    }
                    self.inodes.insert(ino, node);
                    self.used_pages.fetch_add(f.pages(), Ordering::AcqRel);
                    self.used_inodes.fetch_add(1, Ordering::AcqRel);
                }
            }
            out.changed.push(ino);
        }
        for node in &doomed {
            self.maybe_free(node);
        }
        out.changed.sort_unstable();
        out.changed.dedup();
        out.entries.sort_unstable();
        out.entries.dedup();
        Ok(out)
    }

    /// A new, independent file system whose tree is snapshot `name`'s, with
    /// the same inode numbers.
    pub fn clone_snapshot(&self, name: &[u8], config: Config) -> Result<Fs> {
        let snap = self.snap_named(name)?;
        if snap.nodes.len() as u64 > config.max_inodes
            || snap.pages > config.capacity / PAGE_SIZE as u64
        {
            return Err(Errno::ENOSPC);
        }
        let fs = Fs::new(config);
        fs.inodes.clear();
        for (&ino, f) in &snap.nodes {
            let node = Arc::new(Inode::new(ino, f.kind, f.meta.clone(), f.body.clone()));
            if ino == ROOT_INO {
                node.nlookup.store(1, Ordering::Relaxed);
            }
            fs.inodes.insert(ino, node);
        }
        fs.used_inodes
            .store(snap.nodes.len() as u64, Ordering::Release);
        fs.used_pages.store(snap.pages, Ordering::Release);
        fs.next_ino
            .store(self.next_ino.load(Ordering::Acquire), Ordering::Release);
        Ok(fs)
    }

    fn nodes_raw(&self) -> Vec<Arc<Inode>> {
        self.inodes.iter().map(|e| e.value().clone()).collect()
    }
}
