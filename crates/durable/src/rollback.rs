//! Rolling a data directory back to a retained commit: the plan, and the
//! crash-safe protocol (an intent in the manifest, finished at next open).

use std::path::Path;

use memfs_journal::checkpoint::checkpoint_file_name;
use memfs_journal::recovery;
use memfs_journal::{CheckpointRef, DataDir, Manifest};

use crate::error::{Error, Result};
use crate::history_file::{CheckpointEntry, History, SnapshotEntry};
use crate::reach::reach;

pub(crate) const ROLLBACK_PREFIX: &str = "rollback=";

/// What a rollback would discard.
#[derive(Debug, Clone)]
pub struct RollbackPlan {
    pub target: u64,
    pub last: u64,
    pub base: Option<CheckpointEntry>,
    /// Named snapshots after the target (deleted by the rollback).
    pub lost_snapshots: Vec<SnapshotEntry>,
}

impl RollbackPlan {
    pub fn commits_lost(&self) -> u64 {
        self.last - self.target
    }
}

/// Resolves a commit id or a snapshot name.
pub fn resolve_target(dir: &Path, target: &str) -> Result<u64> {
    if let Ok(c) = target.parse::<u64>() {
        return Ok(c);
    }
    let h = History::load(dir)?;
    h.snapshots
        .iter()
        .find(|s| s.name == target)
        .map(|s| s.commit)
        .ok_or_else(|| {
            Error::Invalid(format!(
                "{target:?} is neither a commit id nor a snapshot name (memfs snapshot list shows them)"
            ))
        })
}

/// Checks that `target` is reachable; says what a rollback would discard.
pub fn plan_rollback(dir: &Path, target: u64) -> Result<RollbackPlan> {
    let r = reach(dir)?;
    r.check(target)?;
    let h = History::load(dir)?;
    Ok(RollbackPlan {
        target,
        last: r.last,
        base: h.base_for(target),
        lost_snapshots: h
            .snapshots
            .iter()
            .filter(|s| s.commit > target)
            .cloned()
            .collect(),
    })
}

/// Rolls a data directory that is not in use back to `plan.target`. The
/// intent is published in the manifest first, so a crash part-way is
/// finished at the next open; commits after the target are gone after this.
pub fn rollback(dir: &Path, plan: &RollbackPlan) -> Result<()> {
    let _lock = DataDir::open(dir, false)?;
    let fresh = plan_rollback(dir, plan.target)?;
    if fresh.last != plan.last {
        return Err(Error::Invalid(
            "the data directory changed since the rollback was planned".into(),
        ));
    }
    publish_rollback(dir, plan)
}

/// The rollback protocol proper (the caller holds the directory's lock).
pub(crate) fn publish_rollback(dir: &Path, plan: &RollbackPlan) -> Result<()> {
    let mut m = Manifest::load(dir)?.unwrap_or_default();
    m.checkpoint = plan.base.map(|b| CheckpointRef {
        commit: b.commit,
        required_end: b.required_end,
    });
    m.user = format!("{ROLLBACK_PREFIX}{}", plan.target).into_bytes();
    m.publish(dir)?;
    finish_rollback(dir)?;
    Ok(())
}

/// Completes a rollback recorded in the manifest: cuts the journal, drops
/// later checkpoints and snapshots, then clears the intent. Idempotent.
pub(crate) fn finish_rollback(dir: &Path) -> Result<Option<u64>> {
    let Some(mut m) = Manifest::load(dir)? else {
        return Ok(None);
    };
    let Some(target) = std::str::from_utf8(&m.user)
        .ok()
        .and_then(|u| u.strip_prefix(ROLLBACK_PREFIX))
        .and_then(|t| t.parse::<u64>().ok())
    else {
        return Ok(None);
    };
    recovery::truncate_after(dir, target)?;
    let mut h = History::load(dir)?;
    let keep = m.checkpoint.map(|s| s.commit);
    let doomed: Vec<u64> = h
        .checkpoints
        .iter()
        .filter(|c| c.required_end > target && Some(c.commit) != keep)
        .map(|c| c.commit)
        .collect();
    h.checkpoints
        .retain(|c| c.required_end <= target || Some(c.commit) == keep);
    h.snapshots.retain(|s| s.commit <= target);
    h.save(dir)?;
    for c in doomed {
        memfs_journal::dir::remove_file(dir, &checkpoint_file_name(c))?;
    }
    m.user.clear();
    m.publish(dir)?;
    Ok(Some(target))
}
