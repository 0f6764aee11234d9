//! memfs volumes on a Redis Cluster: the foundation of issue 37.
//!
//! A *volume* is one memfs tree kept in a Redis Cluster, its metadata in
//! one hash slot (`{V}`) and its data blocks spread over every master
//! (docs/cluster.md is the design: keys, scripts, feed, sessions, faults).
//! This crate has, so far:
//!
//! - [`local`]: [`LocalCluster`], a real cluster of `redis-server`
//!   processes on free 127.0.0.1 ports, for the tests and `memfs bench
//!   cluster`; it stops every process it started, in every path;
//! - [`record`]: the node record codec (64 bytes, little-endian, then a
//!   symlink's target);
//! - [`admin`]: [`Admin`], volume administration (`create`, `list`,
//!   `status`, `delete`) against a cluster's URLs, and [`clean`], which
//!   frees the blocks a crash left that no file names;
//! - [`keys`], [`slot`], [`topology`]: key names, hash slots, and which
//!   master serves what;
//! - [`transfer`]: a volume's whole tree read into a `memfs_fs::Fs`, and
//!   an `Fs` written into an empty volume (`memfs send`/`receive`).
//!
//! What it promises: no panic on bad input or a failing cluster (errors are
//! [`Error`], saying what to do where there is something to do); every
//! command to the cluster bounded by a timeout; volume creation atomic (of
//! two creates of one name exactly one wins); no volume on a cluster that
//! may evict keys.
//!
//! What it may depend on: `redis`, small crates, and later `memfs-fs` for
//! the engine's types (`Attr`, `Errno`, ...). Never `memfs-fuse`: the rule
//! is cli → fuse → (durable → fs | cluster), so the adapter depends on this
//! crate (or the binary glues the two), and `Volume`'s `memfs_fuse::Tree`
//! impl lives on the adapter's side of the seam (docs/architecture.md).

#![forbid(unsafe_code)]

pub mod admin;
pub mod blocks;
pub mod cache;
pub mod clean;
pub mod data;
pub mod direct;
pub mod errno;
pub mod error;
pub mod feed;
pub mod handle;
pub mod keys;
pub mod local;
pub mod locks;
pub mod lua;
pub mod namespace;
pub mod pool;
pub mod record;
pub mod session;
pub mod slot;
pub mod space;
pub mod topology;
pub mod transfer;
pub mod volume;

pub use admin::{Admin, CreateOptions};
pub use clean::Cleaned;
pub use error::{Error, Result};
pub use local::LocalCluster;
pub use transfer::{TransferError, Written, fs_to_volume, volume_to_fs};
pub use volume::{Change, Volume, VolumeOptions, VolumeStatus};
