//! STAND-IN UNTIL vol-data MERGES: the integrator takes A2's file.
//!
//! Record locks and flocks kept in the cluster are A2's (crates/cluster
//! locks.rs on branch vol-data). This stand-in only has the contract's
//! signatures, so that `Volume` compiles and its tests run: every lock
//! call answers ENOLCK, as a tree that keeps no locks does.

use std::sync::Arc;

use memfs_fs::{Errno, LockCallback, LockInfo, Result};

use crate::handle::Handle;

/// Locks of one mount (stand-in: none).
pub struct Locks {
    _h: Arc<Handle>,
}

impl Locks {
    pub fn new(h: Arc<Handle>) -> Locks {
        Locks { _h: h }
    }

    pub fn getlk(
        &self,
        _ino: u64,
        _owner: u64,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
    ) -> Result<LockInfo> {
        Err(Errno::ENOLCK)
    }

    pub fn setlk(
        &self,
        _ino: u64,
        _owner: u64,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
    ) -> Result<()> {
        Err(Errno::ENOLCK)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn setlkw(
        &self,
        _ino: u64,
        _owner: u64,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
        _token: u64,
        done: LockCallback,
    ) {
        done(Err(Errno::ENOLCK))
    }

    pub fn cancel_lock_wait(&self, _ino: u64, _token: u64) -> bool {
        false
    }

    pub fn release_locks(&self, _ino: u64, _owner: u64) {}

    /// The feed saw an unlock (or a reap) on `ino`.
    pub fn on_unlock(&self, _ino: u64) {}
}
