//! Inodes and their lock-protected state.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};

use parking_lot::RwLock;

use crate::data::FileData;
use crate::dir::Dir;
use crate::locks::LockTable;
use crate::types::{Attr, FileType, PAGE_SIZE, Timespec};
use crate::xattr::Xattrs;

/// Size `stat` reports for a directory, per entry (as tmpfs does).
const DIRENT_SIZE: u64 = 20;

pub(crate) struct Inode {
    pub ino: u64,
    pub kind: FileType,
    /// References the kernel holds (lookup replies not yet forgotten).
    pub nlookup: AtomicU64,
    /// Open handles of direct (non-kernel) users and of the kernel.
    pub nopen: AtomicU32,
    /// Set once when the inode leaves the table, so it is freed exactly once.
    pub freed: AtomicBool,
    /// Set by [`Fs::tmpfile`] without `excl` until the file's first name:
    /// the only nodes with no link that `link` may name (Linux's
    /// `I_LINKABLE`). A flag in the node, in the padding beside `freed`,
    /// rather than a set beside the table, which every freed node would
    /// have had to visit, and a checkpoint asks while it holds the node's
    /// lock, so it is an atomic, not part of the locked state.
    ///
    /// [`Fs::tmpfile`]: crate::Fs::tmpfile
    pub linkable: AtomicBool,
    pub state: RwLock<State>,
}

// An `Arc<Inode>` (16-byte header + Inode) must stay within mimalloc's
// 160-byte size class: one class more (192) costs 32 MiB per million files,
// and issue 16's target is 300 MiB for a million empty files. btime took the
// room rdev left when it moved into `Body::Special`. mimalloc's classes here
// are 128, 160, 192 bytes (4 per doubling: `mi_bin`, the bin table in
// libmimalloc-sys 0.1.49's v3/src/init.c): an Inode of 113 to 144 bytes costs
// 160 either way, so shrinking it saves memory only at 112 bytes or less.
const _: () = assert!(std::mem::size_of::<Inode>() + 16 <= 160);
const _: () = assert!(std::mem::size_of::<Body>() <= 16);

pub(crate) struct State {
    pub meta: Meta,
    pub body: Body,
    /// Record and flock locks; allocated on first use.
    pub locks: Option<Box<LockTable>>,
    /// The snapshot epoch of the node's last change (`snapshot.rs`): a
    /// change in a later epoch first preserves the node for the snapshots.
    pub epoch: u64,
}

#[derive(Clone)]
pub(crate) struct Meta {
    /// Permission bits with setuid, setgid and sticky.
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    /// Creation time (statx's btime): set when the node is made, never
    /// changed after (not by setattr, writes or renames; links share it).
    pub btime: Timespec,
    pub xattrs: Option<Box<Xattrs>>,
    /// Inode flags (`FS_*_FL`, all in the low byte: see `flags.rs`).
    pub flags: u8,
}

impl Meta {
    /// Takes one link away (a name removed, a subdirectory gone). Checked in
    /// debug builds only, because the count may come from a data directory
    /// (an image or the journal) rather than from the engine; release
    /// builds stop at 0 instead of wrapping to a count that never frees.
    #[track_caller]
    pub fn drop_link(&mut self) {
        debug_assert!(self.nlink > 0, "link count below zero");
        self.nlink = self.nlink.saturating_sub(1);
    }
}

#[derive(Clone)]
pub(crate) enum Body {
    File(FileData),
    Dir(Box<Dir>),
    // Boxed twice so that the enum stays two words: symlinks are rare, inodes many.
    Symlink(Box<Box<[u8]>>),
    /// A device node, FIFO or socket, with its device number (0 but for
    /// character and block devices). Kept here, not in `Meta`, because only
    /// these nodes have one: it fits the enum's padding and keeps `Inode` small.
    Special(u32),
}

impl Body {
    /// The body of a new device node, FIFO or socket.
    pub fn special(kind: FileType, rdev: u32) -> Body {
        match kind {
            FileType::CharDevice | FileType::BlockDevice => Body::Special(rdev),
            _ => Body::Special(0),
        }
    }
}

impl Inode {
    pub fn new(ino: u64, kind: FileType, meta: Meta, body: Body) -> Inode {
        Inode {
            ino,
            kind,
            nlookup: AtomicU64::new(0),
            nopen: AtomicU32::new(0),
            freed: AtomicBool::new(false),
            linkable: AtomicBool::new(false),
            state: RwLock::new(State {
                meta,
                body,
                locks: None,
                epoch: 0,
            }),
        }
    }
}

/// The attributes `stat` shows for a node's metadata and contents (live or
/// frozen in a snapshot).
pub(crate) fn attr_of(m: &Meta, body: &Body, ino: u64, kind: FileType) -> Attr {
    let (size, blocks, rdev) = match body {
        Body::File(d) => (m.size, d.page_count() * (PAGE_SIZE as u64 / 512), 0),
        Body::Dir(d) => ((d.len() as u64 + 2) * DIRENT_SIZE, 0, 0),
        Body::Symlink(t) => (t.len() as u64, 0, 0),
        Body::Special(rdev) => (0, 0, *rdev),
    };
    Attr {
        ino,
        kind,
        perm: m.perm,
        nlink: m.nlink,
        uid: m.uid,
        gid: m.gid,
        rdev,
        size,
        blocks,
        atime: m.atime,
        mtime: m.mtime,
        ctime: m.ctime,
        btime: m.btime,
        blksize: PAGE_SIZE as u32,
    }
}

impl State {
    pub fn attr(&self, ino: u64, kind: FileType) -> Attr {
        attr_of(&self.meta, &self.body, ino, kind)
    }

    pub fn dir(&self) -> Option<&Dir> {
        match &self.body {
            Body::Dir(d) => Some(d),
            _ => None,
        }
    }

    pub fn dir_mut(&mut self) -> Option<&mut Dir> {
        match &mut self.body {
            Body::Dir(d) => Some(d),
            _ => None,
        }
    }

    /// A regular file's metadata and data, for changing both; `EISDIR` for a
    /// directory and `other` for any other type (Linux's answer differs by call).
    pub fn file_mut(&mut self, other: crate::Errno) -> crate::Result<(&mut Meta, &mut FileData)> {
        match &mut self.body {
            Body::File(d) => Ok((&mut self.meta, d)),
            Body::Dir(_) => Err(crate::Errno::EISDIR),
            _ => Err(other),
        }
    }

    /// Whether `name` may be added to this (locked) directory.
    pub fn check_new_entry(&self, name: &[u8]) -> crate::Result<()> {
        let d = self.dir().ok_or(crate::Errno::ENOTDIR)?;
        if self.meta.nlink == 0 {
            // The directory was removed while someone still had it open.
            return Err(crate::Errno::ENOENT);
        }
        if d.get(name).is_some() {
            return Err(crate::Errno::EEXIST);
        }
        Ok(())
    }

    /// Checks (debug builds) that a directory still linked has 2 + its
    /// subdirectories as link count: `.`, its name in its parent, and each
    /// subdirectory's `..`. Called under the directory's write lock after a
    /// change of its entries or its link count.
    pub fn check_dir_links(&self) {
        #[cfg(debug_assertions)]
        if let Body::Dir(d) = &self.body
            && self.meta.nlink != 0
        {
            debug_assert_eq!(
                self.meta.nlink,
                2 + d.subdirs(),
                "a directory's link count is 2 + its subdirectories"
            );
        }
    }

    pub fn touch_mc(&mut self, now: Timespec) {
        self.meta.mtime = now;
        self.meta.ctime = now;
    }
}

#[cfg(test)]
mod tests {
    /// An `Arc<Inode>` must fit the allocator's 160-byte class: one size class
    /// more costs 32 MiB per million files (the memory target is 300 MiB).
    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "link count below zero")]
    fn a_link_count_never_goes_below_zero() {
        let t = crate::types::Timespec { sec: 0, nsec: 0 };
        let mut m = super::Meta {
            perm: 0,
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
        m.drop_link();
        assert_eq!(m.nlink, 0);
        m.drop_link();
    }

    #[test]
    fn inode_stays_small() {
        assert!(std::mem::size_of::<super::Inode>() + 16 <= 160);
        assert!(std::mem::size_of::<super::Body>() <= 16);
    }
}
