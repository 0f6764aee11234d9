//! The one place every change passes through.
//!
//! Each mutating operation describes its effect as a [`Mutation`] and hands it
//! to [`crate::Fs`]'s recorder while it still holds the locks of the nodes it
//! changed, so the commit order equals the order in which conflicting changes
//! were applied.
//!
//! A mutation is *physical*: it names every node it touched by inode number
//! and carries each one's attributes as they are after the change, and the
//! directory entries it set or removed. Replaying one never depends on the
//! state it is replayed onto beyond the cells it overwrites (an attribute
//! set, a directory entry, a byte range, an xattr), which is what lets
//! recovery replay the journal onto a *fuzzy* checkpoint, copied while
//! writers ran (see `docs/durability.md`).

use crate::types::{Attr, FallocateMode};

/// The largest journal record of an operation, not counting its names'
/// and data's bytes: four attribute blocks, two names, framing.
pub(crate) const META_RECORD: u64 = 1024;

#[derive(Debug, Clone, Copy)]
pub enum Mutation<'a> {
    /// A node created in a directory (create, mknod, mkdir, symlink).
    Create {
        parent: Attr,
        name: &'a [u8],
        attr: Attr,
        symlink_target: Option<&'a [u8]>,
    },
    /// A new name for an existing node.
    Link {
        parent: Attr,
        name: &'a [u8],
        attr: Attr,
    },
    /// A name removed (unlink, rmdir); `attr` is the node after (nlink
    /// lowered; 0 for a directory).
    Remove {
        parent: Attr,
        name: &'a [u8],
        attr: Attr,
    },
    /// `parent/name` moved to `new_parent/new_name`. `moved` is the node that
    /// had `name`; `other` the node that had `new_name`, if any (replaced, or
    /// with `exchange` now at `parent/name`). Within one directory
    /// `new_parent` equals `parent`.
    Rename {
        parent: Attr,
        name: &'a [u8],
        new_parent: Attr,
        new_name: &'a [u8],
        moved: Attr,
        other: Option<Attr>,
        exchange: bool,
    },
    /// Attributes changed (chmod, chown, utimens, truncate: a smaller size
    /// drops the data beyond it).
    SetAttr {
        attr: Attr,
    },
    Write {
        attr: Attr,
        offset: u64,
        data: &'a [u8],
    },
    Fallocate {
        attr: Attr,
        offset: u64,
        len: u64,
        mode: FallocateMode,
    },
    SetXattr {
        attr: Attr,
        name: &'a [u8],
        value: &'a [u8],
    },
    RemoveXattr {
        attr: Attr,
        name: &'a [u8],
    },
    /// The last reference to an unlinked node is gone.
    Free {
        ino: u64,
    },
    /// A regular file created with no name (`O_TMPFILE`): `attr.nlink` is 0.
    /// It may get a name later by a `Link`; recovery drops it if it has none.
    Tmpfile {
        attr: Attr,
    },
    /// Inode flags replaced (`FS_IOC_SETFLAGS`); `attr` carries the new ctime.
    SetFlags {
        attr: Attr,
        flags: u32,
    },
}

impl Mutation<'_> {
    /// A short name for logs and `memfs log`.
    pub fn op_name(&self) -> &'static str {
        match self {
            Mutation::Create { attr, .. } => match attr.kind {
                crate::FileType::Directory => "mkdir",
                crate::FileType::Symlink => "symlink",
                crate::FileType::RegularFile => "create",
                _ => "mknod",
            },
            Mutation::Link { .. } => "link",
            Mutation::Remove { attr, .. } => {
                if attr.kind == crate::FileType::Directory {
                    "rmdir"
                } else {
                    "unlink"
                }
            }
            Mutation::Rename { exchange: true, .. } => "exchange",
            Mutation::Rename { .. } => "rename",
            Mutation::SetAttr { .. } => "setattr",
            Mutation::Write { .. } => "write",
            Mutation::Fallocate { .. } => "fallocate",
            Mutation::SetXattr { .. } => "setxattr",
            Mutation::RemoveXattr { .. } => "removexattr",
            Mutation::Free { .. } => "free",
            Mutation::Tmpfile { .. } => "tmpfile",
            Mutation::SetFlags { .. } => "setflags",
        }
    }
}

/// Receives every mutation while the nodes it touched are still locked.
pub trait Recorder: Send + Sync {
    /// Records `mutation` as the next commit and returns its id (strictly
    /// increasing). Must not wait for I/O: waiting for durability belongs in
    /// [`Recorder::settle`], after the locks are dropped, so that concurrent
    /// operations can share one fsync. An error makes the operation fail with
    /// `EIO`.
    fn record(&self, mutation: &Mutation<'_>) -> Result<u64, crate::Errno>;

    /// Records a write whose bytes lie in several slices (`parts`, in
    /// order): the same commit as [`Recorder::record`] of a
    /// [`Mutation::Write`] of their concatenation. By default they are
    /// gathered into one buffer; a recorder that can append them as they
    /// are should (a WRITE the FUSE adapter read into pages is then copied
    /// only into the journal, `Fs::write_pages_as`).
    fn record_write(
        &self,
        attr: &crate::Attr,
        offset: u64,
        parts: &[&[u8]],
    ) -> Result<u64, crate::Errno> {
        let data = parts.concat();
        self.record(&Mutation::Write {
            attr: *attr,
            offset,
            data: &data,
        })
    }

    /// Called before an operation changes anything, with a bound on its
    /// record's size: an error (ENOSPC) fails the operation untouched.
    fn admit(&self, bytes: u64) -> Result<(), crate::Errno> {
        let _ = bytes;
        Ok(())
    }

    /// Called by the operation's caller once its locks are dropped: waits
    /// until what this thread recorded is as durable as the mode promises.
    fn settle(&self) -> Result<(), crate::Errno> {
        Ok(())
    }

    /// `fsync`/`syncfs`: waits until every commit so far is durable (a no-op
    /// in a mode that promises nothing).
    fn sync(&self) -> Result<(), crate::Errno> {
        Ok(())
    }
}
