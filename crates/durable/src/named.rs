//! Creating and deleting named snapshots (HISTORY entries), in a running
//! file system or in a directory not in use.

use std::path::Path;

use memfs_journal::DataDir;

use crate::clock::now_ns;
use crate::error::{Error, Result};
use crate::history_file::{History, SnapshotEntry, check_snapshot_name};
use crate::reach::reach;

/// Records a named snapshot of `commit` in HISTORY (the caller holds the
/// directory or the admin lock).
pub(crate) fn snapshot_add(dir: &Path, name: &str, commit: u64) -> Result<SnapshotEntry> {
    let mut h = History::load(dir)?;
    if h.snapshots.iter().any(|s| s.name == name) {
        return Err(Error::Invalid(format!("snapshot {name:?} already exists")));
    }
    let e = SnapshotEntry {
        name: name.into(),
        commit,
        time_ns: now_ns(),
    };
    h.snapshots.push(e.clone());
    h.save(dir)?;
    Ok(e)
}

pub(crate) fn snapshot_delete(dir: &Path, name: &str) -> Result<SnapshotEntry> {
    let mut h = History::load(dir)?;
    let i = h
        .snapshots
        .iter()
        .position(|s| s.name == name)
        .ok_or_else(|| Error::Invalid(format!("no snapshot named {name:?}")))?;
    let e = h.snapshots.remove(i);
    h.save(dir)?;
    Ok(e)
}

/// Creates a named snapshot of the newest state of a directory not in use.
pub fn snapshot_create_offline(dir: &Path, name: &str) -> Result<SnapshotEntry> {
    check_snapshot_name(name)?;
    let _lock = DataDir::open(dir, false)?;
    let r = reach(dir)?;
    snapshot_add(dir, name, r.last)
}

pub fn snapshot_delete_offline(dir: &Path, name: &str) -> Result<SnapshotEntry> {
    let _lock = DataDir::open(dir, false)?;
    snapshot_delete(dir, name)
}
