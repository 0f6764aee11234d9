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
mod codec;
pub mod control;
mod durable;
pub mod history;
mod image;
pub mod send;

pub use check::FsCheck;
pub use codec::{decode as decode_record, encode as encode_record};
pub use durable::*;
pub use image::ImageInfo;
