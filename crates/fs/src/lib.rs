//! memfs engine: an in-memory POSIX file system as a library.
//!
//! The API mirrors the kernel's low-level file system operations (inode
//! numbers, lookup counts, readdir offsets), so that a FUSE adapter is a thin
//! translation, plus a small path-based layer for direct users. Every error is
//! a Linux errno value. See `docs/engine.md` for the data structures and the
//! locking rules.

mod data;
mod dir;
mod error;
mod fs;
mod inode;
mod locks;
mod mutation;
mod nodes;
mod path;
mod replay;
mod types;
mod xattr;

pub use error::{Errno, Result};
pub use fs::{DirEntry, Fs};
pub use locks::LockCallback;
pub use mutation::{Mutation, Recorder};
pub use nodes::{FIRST_ENTRY_OFFSET, Node, NodeView};
pub use types::*;
