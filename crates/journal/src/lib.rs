//! memfs-journal: the shared durable commit journal of memfs.
//!
//! One journal format, one durability engine and one recovery procedure serve
//! both the block store (`memfs-store`) and the file system. Payloads are opaque
//! bytes: each client encodes its own operations (and undo information) and the
//! journal guarantees that a commit is either wholly recovered or not at all.
//!
//! Pieces:
//! - [`DataDir`]: a data directory held exclusively by one process (flock).
//! - [`Journal`]: append commits with strictly increasing ids; durability modes
//!   ([`Durability`]) with group commit and a background writer.
//! - [`recovery`]: replay, verify (fsck) and repair of the segment files.
//! - [`manifest`] and [`checkpoint`]: checksummed checkpoint files published through
//!   two alternating manifest slots.
//! - [`storage`]: the file operations all of the above go through; a
//!   [`SimStorage`] registered for a path prefix simulates crashes at any write
//!   or sync (for tests).
//!
//! The on-disk format is described in `docs/journal.md`.
//!
//! Promises: a commit is recovered whole or not at all, as durable as its
//! mode says. Depends on std, `nix` and `crc32c` only; no memfs crate.

#![forbid(unsafe_code)]

pub mod checkpoint;
pub mod dir;
pub mod durability;
pub mod format;
pub mod manifest;
pub mod recovery;
pub mod sim;
pub mod storage;
pub mod writer;

pub use checkpoint::{CheckpointReader, CheckpointWriter, SealedCheckpoint};
pub use dir::DataDir;
pub use durability::Durability;
pub use manifest::{CheckpointRef, Manifest};
pub use recovery::{Damage, RecoveryReport, RepairReport, VerifyReport};
pub use sim::{RecoverMode, SimStorage, SplitMix64};
pub use storage::{OpenMode, RealStorage, Storage, StorageFile};
pub use writer::{Journal, JournalId, JournalOptions, JournalStats, Token};

use std::path::PathBuf;

/// A commit id: strictly increasing, consecutive, starting at 1.
pub type CommitId = u64;

/// The replay callback: receives each commit's id and payload in order; an
/// `Err(reason)` aborts recovery with [`Error::Apply`].
pub type ReplayFn<'a> = dyn FnMut(CommitId, &[u8]) -> std::result::Result<(), String> + 'a;

/// Everything that can go wrong in the journal. Every variant names what it
/// concerns so the message alone is actionable.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("data directory {path} is in use by another process (lock on {path}/LOCK is held)")]
    Locked { path: PathBuf },
    #[error("corrupt journal data in {file} at offset {offset}: {reason}")]
    Corrupt {
        file: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("the journal failed earlier and refuses further commits: {0}")]
    Failed(String),
    /// Space for the commit could not be reserved: nothing was written and
    /// the journal keeps working (a later reservation may succeed).
    #[error("no space left in {path} to journal this commit: {source}")]
    NoSpace {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A commit to wait for that this journal never appended (a token of
    /// another journal, or an id past its last commit): a caller's bug,
    /// answered instead of waited on for ever.
    #[error("commit {commit} was never appended to this journal (its last commit is {last})")]
    UnknownCommit { commit: CommitId, last: CommitId },
    #[error("replay callback rejected commit {commit}: {reason}")]
    Apply { commit: CommitId, reason: String },
    /// A wait for other commits passed its bound ([`writer::STALL_LIMIT`]):
    /// nothing was written or reserved, and the journal keeps working.
    #[error("gave up after {waited:?} waiting for {what}")]
    Stalled {
        what: &'static str,
        waited: std::time::Duration,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io { path, source }
}
