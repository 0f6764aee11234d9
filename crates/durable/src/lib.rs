//! memfs durable file system: the engine (`memfs-fs`) with every mutation
//! recorded as a commit in a journal (`memfs-journal`) in a data directory,
//! checkpoint images written while writers run, recovery, named snapshots,
//! history and rollback.
//!
//! Promises: opening a data directory restores the state after the last
//! commit the durability mode promised (see `docs/durability.md`); record and
//! image formats are stable on disk. Depends on `memfs-fs` (through its
//! `Recorder` seam and its whole-tree API only) and `memfs-journal`; nothing
//! above it (FUSE, CLI).

mod check;
mod checkpoint;
mod clock;
mod codec;
pub mod control;
mod durable;
mod error;
pub mod history;
mod history_file;
mod image;
mod log;
mod marker;
mod named;
mod options;
mod prune;
mod reach;
mod rebuild;
mod recorder;
mod rollback;
pub mod send;
mod shared;

/// The journal underneath (verify, repair, the data directory lock).
pub use memfs_journal as journal;

pub use check::FsCheck;
pub use checkpoint::CheckpointReport;
pub use codec::{decode as decode_record, encode as encode_record};
pub use durable::{DurableFs, Materializer, OpenReport};
pub use error::{Error, Result};
pub use history_file::{CheckpointEntry, History, SnapshotEntry, check_snapshot_name};
pub use image::ImageInfo;
pub use log::{LogEntry, log};
pub use marker::{READ_ONLY_FILE, ReadOnlyMarker, read_only_marker};
pub use named::{snapshot_create_offline, snapshot_delete_offline};
pub use options::{
    Durability, Options, Retention, parse_bytes, parse_durability, parse_duration_arg,
};
pub use reach::{Reach, reach};
pub use rebuild::rebuild;
pub use rollback::{RollbackPlan, plan_rollback, resolve_target, rollback};
