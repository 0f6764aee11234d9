//! `M/.snapshots/NAME/`: the engine's copy-on-write snapshots, shown
//! read-only inside the mount (docs/snapshots.md, "Browsing").
//!
//! The kernel knows every node by one 64-bit node id, so the ids of the
//! live tree and of every snapshot must not collide:
//!
//! - live node `i` keeps id `i` (`i < 2^40`: the engine hands out inode
//!   numbers from a counter, so a mount would have to create 2^40 nodes
//!   first; a larger one is refused with EOVERFLOW rather than aliased);
//! - node `i` of the snapshot in slot `s` is `(s << 40) | i`, `1 <= s < 2^23`;
//! - `.snapshots` itself is [`SNAPDIR`] (`2^63`, outside both ranges).
//!
//! A slot is given to a snapshot the first time the kernel sees it and is
//! never given again during the mount's life: a handle of a deleted snapshot
//! (an open descriptor, a cwd) can only name a slot that no longer maps to
//! anything, and answers ESTALE, never the content of a newer snapshot.
//! The node ids also serve as the inode numbers `stat` shows, so `find`,
//! `cp -a` and `diff -r` see distinct files in distinct snapshots.
//!
//! A slot shows either an engine snapshot of the served tree or, on a
//! durable mount, a *durable* snapshot (a commit pinned in the data
//! directory) that has no engine snapshot (taken before a restart, a crash
//! or an online rollback): its tree is rebuilt aside from the data
//! directory on first use ([`AsideView`]) and kept until the snapshot is
//! deleted, the served tree is swapped or the mount ends.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use memfs_fs::{Errno, Fs, ROOT_INO};
use parking_lot::Mutex;

pub const SLOT_SHIFT: u32 = 40;
/// Largest live inode number the adapter can serve.
pub const INO_MASK: u64 = (1 << SLOT_SHIFT) - 1;
/// Slots are `1..MAX_SLOTS`.
pub const MAX_SLOTS: u64 = 1 << 23;
/// The node id of `.snapshots`.
pub const SNAPDIR: u64 = 1 << 63;
/// The readdir offset after `.snapshots` in a listing of the root (the
/// engine's own offsets stay far below).
pub const SNAPDIR_ENTRY_OFFSET: u64 = u64::MAX - 1;

/// What a node id names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    Live(u64),
    SnapDir,
    /// Inode `ino` of the snapshot in `slot`.
    Snap {
        slot: u64,
        ino: u64,
    },
}

pub fn classify(nodeid: u64) -> Node {
    if nodeid == SNAPDIR {
        Node::SnapDir
    } else if nodeid <= INO_MASK {
        Node::Live(nodeid)
    } else {
        Node::Snap {
            slot: nodeid >> SLOT_SHIFT,
            ino: nodeid & INO_MASK,
        }
    }
}

/// The node id of inode `ino` of the snapshot in `slot`.
pub fn snap_nodeid(slot: u64, ino: u64) -> Result<u64, Errno> {
    if ino > INO_MASK {
        return Err(Errno::EOVERFLOW);
    }
    Ok((slot << SLOT_SHIFT) | ino)
}

/// The snapshot root's node id in `slot`.
pub fn snap_root(slot: u64) -> u64 {
    (slot << SLOT_SHIFT) | ROOT_INO
}

/// Rebuilds the tree of a durable snapshot (given its commit) aside: a new
/// `Fs` that nothing writes. Called from a FUSE worker with no lock of the
/// adapter held; the error is logged.
pub type BuildTree = Arc<dyn Fn(u64) -> Result<Fs, String> + Send + Sync>;

/// A durable snapshot as the data directory's history names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DurableSnapshot {
    pub name: Vec<u8>,
    pub commit: u64,
}

/// The tree of one durable snapshot, built on first use by one thread (the
/// others asking for it meanwhile wait for that one), then shared by every
/// request under its slot. The tree gets one engine snapshot, so the same
/// read-only views serve it as serve the served tree's snapshots. Dropped
/// (memory released) with the last request holding it once its slot is
/// retired.
pub struct AsideView {
    snap: DurableSnapshot,
    /// Replaced when the data directory is (an online rollback re-opens it).
    build: Mutex<BuildTree>,
    built: OnceLock<(Arc<Fs>, u64)>,
    building: Mutex<()>,
}

impl AsideView {
    fn new(snap: DurableSnapshot, build: BuildTree) -> Arc<AsideView> {
        Arc::new(AsideView {
            snap,
            build: Mutex::new(build),
            built: OnceLock::new(),
            building: Mutex::new(()),
        })
    }

    pub fn is_built(&self) -> bool {
        self.built.get().is_some()
    }

    /// The tree and the id of its engine snapshot, built now if need be.
    /// A failed build is not remembered: the next request tries again.
    pub fn get(&self) -> Result<(Arc<Fs>, u64), Errno> {
        if let Some((fs, id)) = self.built.get() {
            return Ok((fs.clone(), *id));
        }
        let _one_builder = self.building.lock();
        if let Some((fs, id)) = self.built.get() {
            return Ok((fs.clone(), *id));
        }
        let name = String::from_utf8_lossy(&self.snap.name).into_owned();
        let t = std::time::Instant::now();
        let build = self.build.lock().clone();
        let fs = build(self.snap.commit).map_err(|e| {
            tracing::warn!(
                "snapshot {name} (commit {}): cannot rebuild its tree for browsing: {e}",
                self.snap.commit
            );
            Errno::EIO
        })?;
        // The engine's name rules are not the data directory's (`.` is a
        // valid durable name): the view's own snapshot has a fixed name.
        let id = fs
            .snapshot_create(VIEW_SNAPSHOT)
            .map_err(|e| {
                tracing::warn!("snapshot {name}: cannot take the view's snapshot: {e}");
                Errno::EIO
            })?
            .id;
        tracing::info!(
            "snapshot {name} (commit {}): tree rebuilt for browsing in {:?}, {} nodes",
            self.snap.commit,
            t.elapsed(),
            fs.inode_count()
        );
        let fs = Arc::new(fs);
        // Only the holder of `building` sets it: this cannot fail.
        let _ = self.built.set((fs.clone(), id));
        Ok((fs, id))
    }
}

/// The name of the engine snapshot a durable snapshot's rebuilt tree takes
/// of itself (what its view shows and its clones start from).
pub(crate) const VIEW_SNAPSHOT: &[u8] = b"view";

/// What a slot shows.
#[derive(Clone)]
pub enum Target {
    /// The engine snapshot with this id of the served tree.
    Served(u64),
    /// A durable snapshot's tree built aside.
    Aside(Arc<AsideView>),
}

/// One entry of `.snapshots`, in listing order.
pub struct Listed {
    pub name: Vec<u8>,
    pub slot: u64,
    pub target: Target,
}

/// Snapshot ids (the engine's) and durable snapshots to slots (ours) and back.
#[derive(Default)]
pub struct Slots {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_id: HashMap<u64, u64>,
    by_slot: HashMap<u64, Target>,
    /// Last slot given; slots are never given twice.
    last: u64,
    /// The data directory's snapshots, oldest first (empty in memory).
    durable: Vec<DurableEntry>,
}

struct DurableEntry {
    view: Arc<AsideView>,
    /// Given the first time the kernel sees the snapshot.
    slot: Option<u64>,
}

impl Inner {
    fn give(&mut self, target: Target) -> Result<u64, Errno> {
        if self.last + 1 >= MAX_SLOTS {
            return Err(Errno::ENOSPC);
        }
        self.last += 1;
        self.by_slot.insert(self.last, target);
        Ok(self.last)
    }

    fn slot_of(&mut self, id: u64) -> Result<u64, Errno> {
        if let Some(&s) = self.by_id.get(&id) {
            return Ok(s);
        }
        let s = self.give(Target::Served(id))?;
        self.by_id.insert(id, s);
        Ok(s)
    }

    /// The slot of durable entry `i`, given now if it has none.
    fn durable_slot(&mut self, i: usize) -> Result<u64, Errno> {
        if let Some(s) = self.durable[i].slot {
            return Ok(s);
        }
        let s = self.give(Target::Aside(self.durable[i].view.clone()))?;
        self.durable[i].slot = Some(s);
        Ok(s)
    }
}

/// `.` and `..` are valid names in a data directory's history but name
/// other directories in a listing: those snapshots are not shown.
fn listable(name: &[u8]) -> bool {
    name != b"." && name != b".."
}

impl Slots {
    /// The slot of snapshot `id`, given now if it has none.
    pub fn slot_of(&self, id: u64) -> Result<u64, Errno> {
        self.inner.lock().slot_of(id)
    }

    /// What `slot` shows; ESTALE once it was forgotten.
    pub fn target(&self, slot: u64) -> Result<Target, Errno> {
        self.inner
            .lock()
            .by_slot
            .get(&slot)
            .cloned()
            .ok_or(Errno::ESTALE)
    }

    /// The snapshot id in `slot` if it shows one of the served tree's.
    #[cfg(test)]
    pub fn id_of(&self, slot: u64) -> Result<u64, Errno> {
        match self.target(slot)? {
            Target::Served(id) => Ok(id),
            Target::Aside(_) => Err(Errno::EINVAL),
        }
    }

    /// Snapshot `id` was deleted: its slot is retired.
    pub fn forget_id(&self, id: u64) {
        let mut g = self.inner.lock();
        if let Some(s) = g.by_id.remove(&id) {
            g.by_slot.remove(&s);
        }
    }

    /// The served tree was replaced (a durable rollback): every snapshot id
    /// belonged to the old tree, and every durable view is built again on
    /// demand (the caller sets the new list). Slots stay used.
    pub fn forget_all(&self) {
        let mut g = self.inner.lock();
        g.by_id.clear();
        g.by_slot.clear();
        for e in &mut g.durable {
            e.slot = None;
            let build = e.view.build.lock().clone();
            e.view = AsideView::new(e.view.snap.clone(), build);
        }
    }

    /// Sets the durable snapshots and how to build their trees. Entries
    /// whose name and commit are unchanged keep their slot and tree; the
    /// others' slots are retired. Returns the names that appeared or went.
    pub fn set_durable(&self, build: BuildTree, list: Vec<DurableSnapshot>) -> Vec<Vec<u8>> {
        let mut g = self.inner.lock();
        let mut old = std::mem::take(&mut g.durable);
        let mut changed = Vec::new();
        for snap in list {
            match old.iter().position(|e| e.view.snap == snap) {
                Some(i) => {
                    let e = old.swap_remove(i);
                    *e.view.build.lock() = build.clone();
                    g.durable.push(e);
                }
                None => {
                    changed.push(snap.name.clone());
                    g.durable.push(DurableEntry {
                        view: AsideView::new(snap, build.clone()),
                        slot: None,
                    });
                }
            }
        }
        for e in old {
            if let Some(s) = e.slot {
                g.by_slot.remove(&s);
            }
            changed.push(e.view.snap.name.clone());
        }
        changed
    }

    /// The names of every durable snapshot.
    pub fn durable_names(&self) -> Vec<Vec<u8>> {
        let g = self.inner.lock();
        g.durable.iter().map(|e| e.view.snap.name.clone()).collect()
    }

    /// The durable snapshot `name` (with its slot, given now if need be).
    pub fn durable(&self, name: &[u8]) -> Result<Option<(u64, Arc<AsideView>)>, Errno> {
        if !listable(name) {
            return Ok(None);
        }
        let mut g = self.inner.lock();
        let Some(i) = g.durable.iter().position(|e| e.view.snap.name == name) else {
            return Ok(None);
        };
        let s = g.durable_slot(i)?;
        Ok(Some((s, g.durable[i].view.clone())))
    }

    /// `.snapshots`' entries: the durable snapshots, oldest first (shown
    /// through the served tree's engine snapshot of the same name when it
    /// has one, taken with it), then the engine snapshots `engine` of the
    /// served tree that are not durable. Slots are given now: a listing
    /// and a later lookup show the same inode number. Entries without a
    /// slot (ENOSPC) are left out.
    /// `engine`: the served tree's snapshots as `(id, name)`, oldest first.
    pub fn listing(&self, engine: &[(u64, Vec<u8>)]) -> Vec<Listed> {
        let mut g = self.inner.lock();
        let mut out = Vec::with_capacity(g.durable.len() + engine.len());
        for i in 0..g.durable.len() {
            let name = g.durable[i].view.snap.name.clone();
            if !listable(&name) {
                continue;
            }
            let (slot, target) = match engine.iter().find(|(_, n)| *n == name) {
                Some(&(id, _)) => (g.slot_of(id), Target::Served(id)),
                None => (g.durable_slot(i), Target::Aside(g.durable[i].view.clone())),
            };
            if let Ok(slot) = slot {
                out.push(Listed { name, slot, target });
            }
        }
        for (id, name) in engine {
            if g.durable.iter().any(|e| e.view.snap.name == *name) {
                continue;
            }
            if let Ok(slot) = g.slot_of(*id) {
                out.push(Listed {
                    name: name.clone(),
                    slot,
                    target: Target::Served(*id),
                });
            }
        }
        out
    }
}

/// Checks a name for `.snapshots` (`-o snapdir_name=`).
pub fn check_dir_name(name: &[u8]) -> Result<(), String> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
        return Err(format!(
            "invalid snapshot directory name {:?}: one path component, not . or ..",
            String::from_utf8_lossy(name)
        ));
    }
    if name.len() > 255 || name.contains(&0) {
        return Err("invalid snapshot directory name: at most 255 bytes, no NUL".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn node_ids_do_not_collide() {
        assert_eq!(classify(1), Node::Live(1));
        assert_eq!(classify(INO_MASK), Node::Live(INO_MASK));
        assert_eq!(classify(SNAPDIR), Node::SnapDir);
        let id = snap_nodeid(5, 77).unwrap();
        assert_eq!(classify(id), Node::Snap { slot: 5, ino: 77 });
        assert_eq!(
            classify(snap_root(MAX_SLOTS - 1)),
            Node::Snap {
                slot: MAX_SLOTS - 1,
                ino: 1
            }
        );
        assert!(snap_root(MAX_SLOTS - 1) < SNAPDIR);
        assert_eq!(snap_nodeid(1, INO_MASK + 1), Err(Errno::EOVERFLOW));
    }

    #[test]
    fn slots_are_never_given_twice() {
        let s = Slots::default();
        let a = s.slot_of(10).unwrap();
        assert_eq!(s.slot_of(10).unwrap(), a);
        assert_eq!(s.id_of(a).unwrap(), 10);
        s.forget_id(10);
        assert_eq!(s.id_of(a), Err(Errno::ESTALE));
        let b = s.slot_of(10).unwrap();
        assert_ne!(a, b);
        s.forget_all();
        assert_eq!(s.id_of(b), Err(Errno::ESTALE));
        assert!(s.slot_of(10).unwrap() > b);
    }

    fn durable(names: &[(&str, u64)]) -> Vec<DurableSnapshot> {
        names
            .iter()
            .map(|(n, c)| DurableSnapshot {
                name: n.as_bytes().to_vec(),
                commit: *c,
            })
            .collect()
    }

    fn engine(fs: &Fs, name: &str) -> memfs_fs::SnapshotInfo {
        fs.snapshot_create(name.as_bytes()).unwrap()
    }

    /// A way to build a snapshot's tree that counts its builds, and fails
    /// for commit `fails`.
    fn counting_build(fails: Option<u64>) -> (BuildTree, Arc<AtomicUsize>) {
        let builds = Arc::new(AtomicUsize::new(0));
        let b = builds.clone();
        let build: BuildTree = Arc::new(move |commit| {
            b.fetch_add(1, Ordering::SeqCst);
            if Some(commit) == fails {
                return Err("no such commit".into());
            }
            Ok(Fs::new(memfs_fs::Config::default()))
        });
        (build, builds)
    }

    #[test]
    fn durable_snapshots_are_listed_built_once_and_retired() {
        let (build, builds) = counting_build(Some(99));
        let s = Slots::default();
        s.set_durable(
            build.clone(),
            durable(&[("old", 5), (".", 6), ("both", 7), ("bad", 99)]),
        );
        let served = Fs::new(memfs_fs::Config::default());
        let both = engine(&served, "both");
        let mem = engine(&served, "mem");
        let list = s.listing(&[(both.id, both.name.clone()), (mem.id, mem.name.clone())]);
        let names: Vec<&[u8]> = list.iter().map(|l| l.name.as_slice()).collect();
        // Durable first (oldest first, `.` left out), then the engine's own.
        assert_eq!(names, [&b"old"[..], b"both", b"bad", b"mem"]);
        assert!(matches!(list[0].target, Target::Aside(_)));
        assert!(matches!(list[1].target, Target::Served(id) if id == both.id));
        assert!(matches!(list[3].target, Target::Served(id) if id == mem.id));
        // A lookup finds the slot the listing gave; nothing is built yet.
        let (slot, view) = s.durable(b"old").unwrap().unwrap();
        assert_eq!(slot, list[0].slot);
        assert!(!view.is_built());
        assert_eq!(builds.load(Ordering::SeqCst), 0);
        let (fs1, id) = view.get().unwrap();
        let (fs2, _) = view.get().unwrap();
        assert!(Arc::ptr_eq(&fs1, &fs2));
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        assert!(fs1.snap_getattr(id, ROOT_INO).is_ok());
        // A failed build is an EIO, tried again next time.
        let (_, bad) = s.durable(b"bad").unwrap().unwrap();
        assert_eq!(bad.get().err(), Some(Errno::EIO));
        assert_eq!(bad.get().err(), Some(Errno::EIO));
        assert_eq!(builds.load(Ordering::SeqCst), 3);
        assert!(s.durable(b".").unwrap().is_none());
        assert!(s.durable(b"nope").unwrap().is_none());
        // Deleting `old` retires its slot (ESTALE) and lets its tree go
        // once the last holder drops it; unchanged entries keep theirs.
        let bad_slot = s.durable(b"bad").unwrap().unwrap().0;
        let gone = s.set_durable(build.clone(), durable(&[("both", 7), ("bad", 99)]));
        assert_eq!(gone, [b"old".to_vec(), b".".to_vec()]);
        assert!(matches!(s.target(slot), Err(Errno::ESTALE)));
        assert!(matches!(s.target(bad_slot), Ok(Target::Aside(_))));
        drop((view, list));
        assert_eq!(Arc::strong_count(&fs1), 2);
        drop(fs2);
        assert_eq!(Arc::strong_count(&fs1), 1);
        // Same name, other commit: a new snapshot (a new slot).
        s.set_durable(build.clone(), durable(&[("both", 7), ("bad", 100)]));
        let (slot2, _) = s.durable(b"bad").unwrap().unwrap();
        assert!(slot2 > bad_slot);
        assert!(matches!(s.target(bad_slot), Err(Errno::ESTALE)));
        // A swapped tree (the data directory re-opened, a new way to
        // build): every slot retired, views unbuilt again, built the new way.
        let (build2, builds2) = counting_build(None);
        s.set_durable(build2, durable(&[("both", 7), ("bad", 100)]));
        s.forget_all();
        assert!(matches!(s.target(slot2), Err(Errno::ESTALE)));
        let (slot3, v3) = s.durable(b"bad").unwrap().unwrap();
        assert!(slot3 > slot2);
        assert!(!v3.is_built());
        let before = builds.load(Ordering::SeqCst);
        v3.get().unwrap();
        assert_eq!(builds2.load(Ordering::SeqCst), 1);
        assert_eq!(builds.load(Ordering::SeqCst), before);
    }

    #[test]
    fn dir_names() {
        assert!(check_dir_name(b".snapshots").is_ok());
        assert!(check_dir_name(b".zfs").is_ok());
        for bad in [&b""[..], b".", b"..", b"a/b"] {
            assert!(check_dir_name(bad).is_err());
        }
    }
}
