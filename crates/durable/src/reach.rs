//! How far back a data directory's history reaches.

use std::path::Path;

use memfs_journal::Manifest;
use memfs_journal::recovery;

use crate::error::{Error, Result};
use crate::history_file::History;

/// Where history can reach in a data directory that is not in use.
#[derive(Debug, Clone)]
pub struct Reach {
    /// The oldest commit a rollback can reach.
    pub oldest: u64,
    /// The last intact commit.
    pub last: u64,
}

impl Reach {
    /// Whether `commit` lies in the retained history: the one check every
    /// operation on a past commit (rollback, rebuild, diff) starts with.
    pub fn check(&self, commit: u64) -> Result<()> {
        if commit > self.last {
            return Err(Error::Invalid(format!(
                "commit {commit} does not exist: the newest is {}",
                self.last
            )));
        }
        if commit < self.oldest {
            return Err(Error::Invalid(format!(
                "commit {commit} is older than the retained history, which reaches back to commit {}",
                self.oldest
            )));
        }
        Ok(())
    }
}

pub(crate) fn journal_first_commit(dir: &Path) -> Result<Option<u64>> {
    Ok(recovery::list_segments(dir)?.first().map(|s| s.0))
}

pub fn reach(dir: &Path) -> Result<Reach> {
    let v = recovery::verify(dir)?;
    if let Some(d) = &v.corruption {
        return Err(Error::Invalid(format!(
            "the journal is damaged ({} at offset {}: {}); run memfs fsck --data-dir {} first",
            d.file.display(),
            d.offset,
            d.reason,
            dir.display()
        )));
    }
    let h = History::load(dir)?;
    let manifest = Manifest::load(dir)?;
    let base_commit = manifest.and_then(|m| m.checkpoint).map(|s| s.commit);
    let from_journal = match journal_first_commit(dir)? {
        Some(1) => Some(0),
        _ => None,
    };
    let oldest = from_journal
        .or(h.checkpoints.first().map(|c| c.required_end))
        .or(base_commit)
        .unwrap_or(0);
    let last = v.last_commit.max(base_commit.unwrap_or(0));
    Ok(Reach { oldest, last })
}
