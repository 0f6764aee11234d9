//! The few facts about the running system the benchmarks need (who we are,
//! what is mounted, how to detach a mount: `memfs_fuse::mounts`, shared with
//! the command), and the control socket of a durable mount (its client is
//! `memfs_durable::control`, shared with the command too).

pub use memfs_durable::control::request as control_request;
pub use memfs_fuse::mounts::{is_mounted, is_root, lazy_unmount};
