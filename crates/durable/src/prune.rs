//! Deleting the checkpoints and journal segments that retention and the
//! named snapshots no longer need, and files nothing names.

use std::path::Path;

use memfs_journal::CheckpointRef;
use memfs_journal::checkpoint::{checkpoint_file_name, list_checkpoints};
use memfs_journal::recovery;

use crate::clock::now_ns;
use crate::error::Result;
use crate::history_file::{CheckpointEntry, History};
use crate::options::Retention;
use crate::shared::Shared;

/// Deletes checkpoints and journal segments that retention and the named
/// snapshots no longer need. The oldest kept checkpoint (the *base*) must
/// be able to rebuild every commit still reachable.
pub(crate) fn prune(shared: &Shared, h: &mut History) -> Result<(usize, usize)> {
    let dir = shared.path.as_path();
    let last = shared.journal.last_commit();
    let r = shared.opts.retention;
    // The oldest commit that must stay reachable: the largest window any
    // set limit allows (no limit: everything stays).
    if r.commits.is_none() && r.age.is_none() && r.bytes.is_none() {
        return Ok((0, 0));
    }
    let horizon = horizon(dir, last, r, h)?;
    // With no checkpoint at or before the horizon, nothing can go: the
    // journal from commit 1 is what rebuilds it.
    let Some(mut base) = h.base_for(horizon) else {
        return Ok((0, 0));
    };
    // The checkpoint before the newest always stays, with the journal since
    // it: if the newest is ever found damaged, a restart falls back to it.
    if let Some(prev) = h.checkpoints.iter().rev().nth(1)
        && prev.commit < base.commit
    {
        base = *prev;
    }
    let doomed: Vec<CheckpointEntry> = h
        .checkpoints
        .iter()
        .filter(|c| c.commit < base.commit)
        .copied()
        .collect();
    if doomed.is_empty() && !segments_before(dir, base.commit)? {
        return Ok((0, 0));
    }
    h.checkpoints.retain(|c| c.commit >= base.commit);
    h.save(dir)?;
    for c in &doomed {
        memfs_journal::dir::remove_file(dir, &checkpoint_file_name(c.commit))?;
    }
    let pruned = shared.journal.prune(base.commit)?;
    Ok((pruned, doomed.len()))
}

/// The oldest commit that must stay reachable under retention `r` and the
/// named snapshots (some limit is set).
fn horizon(dir: &Path, last: u64, r: Retention, h: &History) -> Result<u64> {
    let mut horizon = last;
    if let Some(n) = r.commits {
        horizon = horizon.min(last.saturating_sub(n));
    }
    if let Some(age) = r.age {
        let cutoff = now_ns().saturating_sub(age.as_nanos() as u64);
        // Everything since the newest checkpoint older than the cutoff.
        let c = h
            .checkpoints
            .iter()
            .rev()
            .find(|c| c.time_ns <= cutoff)
            .map_or(0, |c| c.required_end);
        horizon = horizon.min(c);
    }
    if let Some(limit) = r.bytes {
        // Keep the newest segments up to `limit` bytes: the horizon is the
        // first commit of the oldest segment that fits.
        let segs = recovery::list_segments(dir)?;
        let mut total = 0u64;
        let mut keep_from = last;
        for (first, p) in segs.iter().rev() {
            total += memfs_journal::dir::file_len(p).unwrap_or(0);
            if total > limit {
                break;
            }
            keep_from = first.saturating_sub(1);
        }
        horizon = horizon.min(keep_from);
    }
    if let Some(min_pin) = h.snapshots.iter().map(|s| s.commit).min() {
        horizon = horizon.min(min_pin);
    }
    Ok(horizon)
}

fn segments_before(dir: &Path, commit: u64) -> Result<bool> {
    let segs = recovery::list_segments(dir)?;
    Ok(segs.len() > 1 && segs[1].0 <= commit + 1)
}

/// Deletes checkpoint files neither HISTORY nor the manifest names (a crash
/// between writing one and recording it) and unfinished temporaries.
pub(crate) fn remove_stray_checkpoints(
    dir: &Path,
    h: &History,
    current: Option<CheckpointRef>,
) -> Result<()> {
    for (c, _) in list_checkpoints(dir)? {
        let known =
            h.checkpoints.iter().any(|k| k.commit == c) || current.is_some_and(|s| s.commit == c);
        if !known {
            tracing::warn!("removing unrecorded checkpoint {}", checkpoint_file_name(c));
            memfs_journal::dir::remove_file(dir, &checkpoint_file_name(c))?;
        }
    }
    Ok(())
}
