//! The one place every change passes through.
//!
//! Each mutating operation describes itself as a [`Mutation`] and hands it to
//! [`crate::Fs`]'s recorder while it still holds the locks of the nodes it
//! changed, so the commit order equals the order in which conflicting changes
//! were applied. Records carry everything needed to redo the change
//! deterministically (allocated inode numbers, the timestamps used), which is
//! what a journal needs to replay them.

use crate::types::{Attr, FallocateMode, RenameFlags, SetAttr, Timespec};

#[derive(Debug)]
pub enum Mutation<'a> {
    /// A node created in `parent` (create, mknod, mkdir, symlink).
    Create {
        parent: u64,
        name: &'a [u8],
        attr: Attr,
        symlink_target: Option<&'a [u8]>,
    },
    Link {
        ino: u64,
        parent: u64,
        name: &'a [u8],
        time: Timespec,
    },
    Unlink {
        parent: u64,
        name: &'a [u8],
        time: Timespec,
    },
    Rmdir {
        parent: u64,
        name: &'a [u8],
        time: Timespec,
    },
    Rename {
        parent: u64,
        name: &'a [u8],
        new_parent: u64,
        new_name: &'a [u8],
        flags: RenameFlags,
        time: Timespec,
    },
    SetAttr {
        ino: u64,
        set: SetAttr,
        time: Timespec,
    },
    Write {
        ino: u64,
        offset: u64,
        data: &'a [u8],
        time: Timespec,
    },
    Fallocate {
        ino: u64,
        offset: u64,
        len: u64,
        mode: FallocateMode,
        time: Timespec,
    },
    SetXattr {
        ino: u64,
        name: &'a [u8],
        value: &'a [u8],
        time: Timespec,
    },
    RemoveXattr {
        ino: u64,
        name: &'a [u8],
        time: Timespec,
    },
    /// The last reference to an unlinked node is gone.
    Free { ino: u64 },
}

/// Receives every mutation with its commit id (strictly increasing).
pub trait Recorder: Send + Sync {
    fn record(&self, commit: u64, mutation: &Mutation<'_>);
}
