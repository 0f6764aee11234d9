//! The requests that reach `.snapshots` and the snapshots under it (node
//! ids in snapdir.rs). Everything here reads: a change answers EROFS.

use std::ffi::OsStr;
use std::ops::Deref;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::Duration;

use fuser::{INodeNo, ReplyDirectory, ReplyDirectoryPlus};
use memfs_fs::{Attr, Errno, FileType, Fs, ROOT_INO, Result};

use crate::snapdir::{self, Listed, Node, SNAPDIR, SNAPDIR_ENTRY_OFFSET, Target};
use crate::swap::FsGuard;
use crate::{GENERATION, MemFuse, Tree, kind};

/// The tree a snapshot's slot reads, held for one request: the served tree
/// (one of its engine snapshots) or a durable snapshot's tree built aside.
/// Only the local engine has snapshots ([`Tree::local`]): a served tree
/// without one has no slot that shows it.
pub(crate) enum SnapFs<'a, T: Tree> {
    Served(FsGuard<'a, T>),
    Aside(Arc<Fs>),
}

impl<T: Tree> Deref for SnapFs<'_, T> {
    type Target = Fs;
    fn deref(&self) -> &Fs {
        match self {
            SnapFs::Served(g) => g.local().expect("a served slot of a tree with snapshots"),
            SnapFs::Aside(fs) => fs,
        }
    }
}

pub(crate) const EROFS: Errno = Errno(libc::EROFS);

/// Offsets of `.snapshots`' listing: `.`, `..`, then snapshot `i` (oldest
/// first) at `FIRST + i`.
const FIRST: u64 = 2;

impl<T: Tree> MemFuse<T> {
    /// A change to `nodeid` (or a new name in it): only live nodes change.
    pub(crate) fn writable(&self, nodeid: u64) -> Result<()> {
        match snapdir::classify(nodeid) {
            Node::Live(_) => Ok(()),
            _ => Err(EROFS),
        }
    }

    /// A new name `name` in `parent`: the snapshot directory's name in the
    /// root is taken (it shadows any live node of that name).
    pub(crate) fn new_name(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.writable(parent)?;
        if parent == ROOT_INO && name == self.snapdir_name.as_slice() {
            return Err(Errno::EEXIST);
        }
        Ok(())
    }

    /// Removing or renaming `name` away from `parent`.
    pub(crate) fn old_name(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.writable(parent)?;
        if parent == ROOT_INO && name == self.snapdir_name.as_slice() {
            return Err(EROFS);
        }
        Ok(())
    }

    pub(crate) fn is_snapdir_name(&self, parent: u64, name: &[u8]) -> bool {
        parent == ROOT_INO && name == self.snapdir_name.as_slice()
    }

    /// `.snapshots`: the root's owner and times, read-only.
    pub(crate) fn snapdir_attr(&self) -> Result<Attr> {
        let mut a = self.fs.get().getattr(ROOT_INO)?;
        a.ino = SNAPDIR;
        a.perm = 0o555;
        a.nlink = 2;
        a.size = 0;
        a.blocks = 0;
        Ok(a)
    }

    /// The tree and engine snapshot id that `slot` shows; a durable
    /// snapshot's tree is built here on first use, with no lock of the
    /// served tree held (only requests for the same snapshot wait for it).
    fn snap_at(&self, slot: u64) -> Result<(SnapFs<'_, T>, u64)> {
        match self.slots.target(slot)? {
            Target::Served(id) => {
                let served = self.fs.get();
                if served.local().is_none() {
                    return Err(Errno::ENOENT);
                }
                Ok((SnapFs::Served(served), id))
            }
            Target::Aside(view) => {
                let (fs, id) = view.get()?;
                Ok((SnapFs::Aside(fs), id))
            }
        }
    }

    /// An engine attribute of a snapshot node, renumbered for the kernel.
    fn renumber(slot: u64, mut a: Attr) -> Result<Attr> {
        a.ino = snapdir::snap_nodeid(slot, a.ino)?;
        Ok(a)
    }

    /// The root of snapshot `name`: an engine snapshot of the served tree,
    /// else a durable snapshot (its tree built now if need be).
    pub(crate) fn lookup_snapshot(&self, name: &[u8]) -> Result<Attr> {
        {
            let served = self.fs.get();
            // By name only: `snapshot_by_name` would sum what each snapshot preserved.
            if let Some(fs) = served.local()
                && let Some(id) = fs.snapshot_id(name)
            {
                let slot = self.slots.slot_of(id)?;
                return Self::renumber(slot, fs.snap_getattr(id, ROOT_INO)?);
            }
            // The served tree is let go before a build: an online rollback
            // waiting for it must not wait for the build too.
        }
        let (slot, view) = self.slots.durable(name)?.ok_or(Errno::ENOENT)?;
        let (fs, id) = view.get()?;
        Self::renumber(slot, fs.snap_getattr(id, ROOT_INO)?)
    }

    /// Attributes of any node that is not live.
    pub(crate) fn snap_getattr(&self, node: Node) -> Result<Attr> {
        match node {
            Node::SnapDir => self.snapdir_attr(),
            Node::Snap { slot, ino } => {
                let (fs, id) = self.snap_at(slot)?;
                Self::renumber(slot, fs.snap_getattr(id, ino)?)
            }
            Node::Live(_) => Err(Errno::EINVAL),
        }
    }

    pub(crate) fn snap_lookup(&self, node: Node, name: &[u8]) -> Result<Attr> {
        match node {
            Node::SnapDir => self.lookup_snapshot(name),
            Node::Snap { slot, ino } => {
                let (fs, id) = self.snap_at(slot)?;
                Self::renumber(slot, fs.snap_lookup(id, ino, name)?)
            }
            Node::Live(_) => Err(Errno::EINVAL),
        }
    }

    /// A snapshot's pages as slices, under its node's read lock (see
    /// [`Fs::read_with`]).
    pub(crate) fn snap_read_with<R>(
        &self,
        slot: u64,
        ino: u64,
        off: u64,
        len: usize,
        f: impl FnOnce(&[&[u8]]) -> R,
    ) -> Result<R> {
        let (fs, id) = self.snap_at(slot)?;
        fs.snap_read_with(id, ino, off, len, f)
    }

    pub(crate) fn snap_readlink(&self, slot: u64, ino: u64) -> Result<Vec<u8>> {
        let (fs, id) = self.snap_at(slot)?;
        fs.snap_readlink(id, ino)
    }

    pub(crate) fn snap_getxattr(&self, node: Node, name: &[u8]) -> Result<Vec<u8>> {
        match node {
            Node::Snap { slot, ino } => {
                let (fs, id) = self.snap_at(slot)?;
                fs.snap_getxattr(id, ino, name)
            }
            _ => Err(Errno::ENODATA),
        }
    }

    pub(crate) fn snap_listxattr(&self, node: Node) -> Result<Vec<u8>> {
        match node {
            Node::Snap { slot, ino } => {
                let (fs, id) = self.snap_at(slot)?;
                fs.snap_listxattr(id, ino)
            }
            _ => Ok(Vec::new()),
        }
    }

    /// The root attributes of a snapshot listed in `.snapshots` and how
    /// long the kernel may keep them; `None`: deleted meanwhile.
    fn listed_root(&self, s: &Listed) -> Option<(Attr, Duration)> {
        let root = match &s.target {
            Target::Served(id) => self
                .fs
                .get()
                .local()
                .ok_or(Errno::ENOENT)
                .and_then(|fs| fs.snap_getattr(*id, ROOT_INO)),
            Target::Aside(v) if v.is_built() => {
                v.get().and_then(|(fs, id)| fs.snap_getattr(id, ROOT_INO))
            }
            Target::Aside(_) => {
                // A listing does not build a durable snapshot's tree (that
                // costs a rebuild from the data directory): the entry gets
                // `.snapshots`' own attributes, expired at once, so the
                // next stat or lookup of it asks (and builds it).
                let mut a = self.snapdir_attr().ok()?;
                a.ino = snapdir::snap_root(s.slot);
                return Some((a, Duration::ZERO));
            }
        };
        Some((Self::renumber(s.slot, root.ok()?).ok()?, self.entry_ttl))
    }

    /// The listing of a node that is not live, through `add(ino, offset,
    /// kind, name, attr)` (true: the reply is full); attributes are
    /// computed only when `plus`, and come with how long the kernel may
    /// keep them.
    fn snap_list(
        &self,
        node: Node,
        offset: u64,
        plus: bool,
        mut add: impl FnMut(u64, u64, FileType, &[u8], Option<(&Attr, Duration)>) -> bool,
    ) -> Result<()> {
        match node {
            Node::SnapDir => self.snapdir_list(offset, plus, &mut add),
            Node::Snap { slot, ino } => self.snap_dir_list(slot, ino, offset, plus, &mut add),
            Node::Live(_) => Err(Errno::EINVAL),
        }
    }

    /// [`Self::snap_list`] of `.snapshots` itself: `.`, `..`, a directory
    /// per snapshot.
    fn snapdir_list(
        &self,
        offset: u64,
        plus: bool,
        add: &mut impl FnMut(u64, u64, FileType, &[u8], Option<(&Attr, Duration)>) -> bool,
    ) -> Result<()> {
        let ttl = self.entry_ttl;
        let attr = |a: Result<Attr>| if plus { a.ok() } else { None };
        if offset == 0
            && add(
                SNAPDIR,
                1,
                FileType::Directory,
                b".",
                attr(self.snapdir_attr()).as_ref().map(|a| (a, ttl)),
            )
        {
            return Ok(());
        }
        if offset <= 1 {
            let root = attr(self.fs.get().getattr(ROOT_INO));
            if add(
                ROOT_INO,
                FIRST,
                FileType::Directory,
                b"..",
                root.as_ref().map(|a| (a, ttl)),
            ) {
                return Ok(());
            }
        }
        // Names only: sizes would cost O(what each preserved).
        let engine = self
            .fs
            .get()
            .local()
            .map_or_else(Vec::new, |fs| fs.snapshot_names());
        let list = self.slots.listing(&engine);
        for (i, s) in list
            .iter()
            .enumerate()
            .skip(offset.saturating_sub(FIRST) as usize)
        {
            let a = if plus {
                match self.listed_root(s) {
                    Some(a) => Some(a),
                    // Deleted meanwhile.
                    None => continue,
                }
            } else {
                None
            };
            if add(
                snapdir::snap_root(s.slot),
                FIRST + i as u64 + 1,
                FileType::Directory,
                &s.name,
                a.as_ref().map(|(a, t)| (a, *t)),
            ) {
                break;
            }
        }
        Ok(())
    }

    /// [`Self::snap_list`] of directory `ino` in the snapshot in `slot`.
    fn snap_dir_list(
        &self,
        slot: u64,
        ino: u64,
        offset: u64,
        plus: bool,
        add: &mut impl FnMut(u64, u64, FileType, &[u8], Option<(&Attr, Duration)>) -> bool,
    ) -> Result<()> {
        let ttl = self.entry_ttl;
        let (fs, id) = self.snap_at(slot)?;
        let mut failed = None;
        fs.snap_readdir(id, ino, offset, |e| {
            let up_from_root = ino == ROOT_INO && e.name == b"..";
            let nodeid = if up_from_root {
                SNAPDIR
            } else {
                match snapdir::snap_nodeid(slot, e.ino) {
                    Ok(n) => n,
                    Err(err) => {
                        failed = Some(err);
                        return false;
                    }
                }
            };
            let a = if !plus {
                None
            } else if up_from_root {
                self.snapdir_attr().ok()
            } else {
                fs.snap_getattr(id, e.ino)
                    .and_then(|a| Self::renumber(slot, a))
                    .ok()
            };
            if plus && a.is_none() {
                return true;
            }
            !add(
                nodeid,
                e.offset,
                e.kind,
                e.name,
                a.as_ref().map(|a| (a, ttl)),
            )
        })?;
        failed.map_or(Ok(()), Err)
    }

    pub(crate) fn snap_readdir(
        &self,
        node: Node,
        offset: u64,
        reply: &mut ReplyDirectory,
    ) -> Result<()> {
        self.snap_list(node, offset, false, |ino, off, k, name, _| {
            reply.add(INodeNo(ino), off, kind(k), OsStr::from_bytes(name))
        })
    }

    pub(crate) fn snap_readdirplus(
        &self,
        node: Node,
        offset: u64,
        reply: &mut ReplyDirectoryPlus,
    ) -> Result<()> {
        self.snap_list(node, offset, true, |ino, off, _, name, a| {
            let Some((a, ttl)) = a else { return false };
            reply.add(
                INodeNo(ino),
                off,
                OsStr::from_bytes(name),
                &ttl,
                &crate::fuse_attr(a),
                GENERATION,
            )
        })
    }

    /// The root listing's extra entry, `.snapshots`, after the engine's
    /// entries when `snapdir=visible` (see `readdir` in lib.rs).
    pub(crate) fn snapdir_entry_due(&self, offset: u64) -> bool {
        self.snapdir_visible && offset < SNAPDIR_ENTRY_OFFSET
    }
}
