//! memfs engine: an in-memory POSIX file system as a library.
//!
//! The API mirrors the kernel's low-level file system operations (inode
//! numbers, lookup counts, readdir offsets), so that a FUSE adapter is a thin
//! translation, plus a small path-based layer for direct users. Every error is
//! a Linux errno value. See `docs/engine.md` for the data structures and the
//! locking rules.
//!
//! Promises: no I/O and no knowledge of journals. Durability plugs in through
//! the [`Recorder`] seam (every mutation, in commit order) and the whole-tree
//! API of [`Node`]/[`NodeView`] and `Fs::apply` (checkpoints and recovery,
//! in `memfs-durable`). Depends on std and small data-structure crates only
//! (`parking_lot`, `hashbrown`, `crossbeam-utils`, `libc` for errno values).

pub mod acl;
mod core;
mod data;
mod dir;
mod error;
mod flags;
mod fs;
mod inode;
mod invariant;
mod lazy;
mod locks;
mod mutation;
mod nodes;
mod path;
mod replay;
mod snapshot;
mod table;
mod types;
mod xattr;

pub use data::INLINE_MAX;
pub use error::{Errno, Result};
pub use flags::{
    FS_APPEND_FL, FS_FL_SUPPORTED, FS_IMMUTABLE_FL, FS_NOATIME_FL, FS_NODUMP_FL, flags_to_xflags,
    xflags_to_flags,
};
pub use fs::{DirEntry, Fs, HeldLocks};
pub use locks::LockCallback;
pub use mutation::{Mutation, Recorder};
pub use nodes::{FIRST_ENTRY_OFFSET, Node, NodeView};
pub use snapshot::{MAX_SNAPSHOTS, Released, RollbackOutcome, SnapshotInfo};
pub use types::*;
