//! Whole-tree access for layers above the engine (checkpoint images, fsck,
//! tests): a read-only view of every node with its contents, and the steps
//! that rebuild a file system from such views (with `replay.rs`).
//!
//! This is the engine's one door for `memfs-durable`: it lets that crate
//! copy and restore the tree without the engine knowing of journals or files,
//! and without the node internals (`Inode`, `Body`, page maps) being public.
//! A [`Node`] is a handle that stays valid after the node is removed; a
//! [`NodeView`] holds the node's read lock for as long as it lives, so
//! callers copy in bounded slices and drop it in between.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::data::FileData;
use crate::dir::Dir;
use crate::fs::Fs;
use crate::inode::{Body, Inode, State};
use crate::types::{Attr, FileType, PAGE_SIZE};

/// The readdir offset of a directory's first real entry (after `.` and `..`).
pub const FIRST_ENTRY_OFFSET: u64 = crate::dir::FIRST_SLOT_OFFSET;

/// A handle on one node.
#[derive(Clone)]
pub struct Node(Arc<Inode>);

impl Node {
    pub fn ino(&self) -> u64 {
        self.0.ino
    }

    pub fn kind(&self) -> FileType {
        self.0.kind
    }

    /// Runs `f` with the node's state read-locked: writers to this node wait
    /// until it returns, so keep it short.
    pub fn read<R>(&self, f: impl FnOnce(&NodeView<'_>) -> R) -> R {
        let st = self.0.state.read();
        f(&NodeView {
            ino: self.0.ino,
            kind: self.0.kind,
            st: &st,
        })
    }
}

/// One node's state under its read lock.
pub struct NodeView<'a> {
    ino: u64,
    kind: FileType,
    st: &'a State,
}

impl NodeView<'_> {
    pub fn attr(&self) -> Attr {
        self.st.attr(self.ino, self.kind)
    }

    /// Link count; 0 for a node that is unlinked but still open.
    pub fn nlink(&self) -> u32 {
        self.st.meta.nlink
    }

    /// Inode flags (`FS_*_FL`, see [`crate::Fs::set_flags`]).
    pub fn flags(&self) -> u32 {
        self.st.meta.flags as u32
    }

    /// A directory's `..`; `None` for other types.
    pub fn dir_parent(&self) -> Option<u64> {
        self.st.dir().map(|d| d.parent)
    }

    /// A symlink's target; `None` for other types.
    pub fn symlink_target(&self) -> Option<&[u8]> {
        match &self.st.body {
            Body::Symlink(t) => Some(t),
            _ => None,
        }
    }

    /// Extended attributes (name, value), in no particular order.
    pub fn xattrs(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.st.meta.xattrs.iter().flat_map(|x| x.iter())
    }

    /// A directory's entries from readdir offset `offset` (at least
    /// [`FIRST_ENTRY_OFFSET`]) on, as `(name, ino, kind, offset after it)`,
    /// until `f` returns false. Returns false for a node that is not a
    /// directory (and calls nothing).
    pub fn entries_from(
        &self,
        offset: u64,
        mut f: impl FnMut(&[u8], u64, FileType, u64) -> bool,
    ) -> bool {
        let Some(d) = self.st.dir() else {
            return false;
        };
        d.list_from(offset, |s, off| f(s.name, s.ino, s.kind, off));
        true
    }

    /// A regular file's allocated pages from index `start` on, at most `max`
    /// of them, as `(index, page)`; returns the index to continue from, or
    /// `None` at the end or for a node that is not a regular file.
    pub fn pages_from(
        &self,
        start: u64,
        max: usize,
        f: impl FnMut(u64, &[u8; PAGE_SIZE]),
    ) -> Option<u64> {
        self.file()?.pages_from(start, max, f)
    }

    /// Reads a regular file's bytes at `off` into `buf` (holes read as
    /// zeros); returns false for other types.
    pub fn read_data(&self, off: u64, buf: &mut [u8]) -> bool {
        match self.file() {
            Some(d) => {
                d.read(off, buf);
                true
            }
            None => false,
        }
    }

    /// Pages a regular file holds; `None` for other types.
    pub fn page_count(&self) -> Option<u64> {
        self.file().map(|d| d.page_count())
    }

    fn file(&self) -> Option<&FileData> {
        match &self.st.body {
            Body::File(d) => Some(d),
            _ => None,
        }
    }
}

impl Fs {
    /// Handles on every node, collected first so that no table shard stays
    /// locked while the caller works through them.
    /// A lazy clone copies its whole tree first.
    pub fn nodes(&self) -> Vec<Node> {
        self.materialize_all();
        self.core
            .inodes
            .iter()
            .map(|e| Node(e.value().clone()))
            .collect()
    }

    /// The node numbered `ino`, if it exists.
    pub fn find_node(&self, ino: u64) -> Option<Node> {
        self.get(ino).ok().map(Node)
    }

    /// The number the next new node would get at least.
    pub fn next_ino(&self) -> u64 {
        self.next_ino.load(Ordering::Acquire)
    }

    /// Rebuild: numbers below `n` are never handed out again.
    pub fn raise_next_ino(&self, n: u64) {
        self.next_ino.fetch_max(n, Ordering::AcqRel);
    }

    /// Rebuild: installs an empty node with attributes `a` (a directory with
    /// `..` = `parent`, a symlink to `symlink_target`), replacing any node
    /// of that number. Contents follow with [`Fs::apply_pages`],
    /// [`Fs::apply_entries`] and [`Fs::apply_xattrs`].
    pub fn install_node(&self, a: &Attr, parent: u64, symlink_target: &[u8]) {
        let body = match a.kind {
            FileType::RegularFile => Body::File(FileData::default()),
            FileType::Directory => Body::Dir(Box::new(Dir::new(parent))),
            FileType::Symlink => Body::Symlink(Box::new(symlink_target.into())),
            _ => Body::special(a.kind, a.rdev),
        };
        self.install(a, body);
    }
}
