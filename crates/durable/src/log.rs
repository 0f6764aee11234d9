//! `memfs log`: the last commits of a data directory, decoded.

use std::path::Path;

use memfs_fs::Mutation;
use memfs_journal::recovery;

use crate::error::Result;
use crate::reach::journal_first_commit;

/// One commit as `memfs log` shows it.
#[derive(Debug, Clone)]
pub struct LogEntry {
    pub commit: u64,
    /// The change time the operation set (seconds, nanoseconds), if it has one.
    pub time: Option<(i64, u32)>,
    pub op: &'static str,
    pub ino: u64,
    pub name: Option<String>,
    /// Payload bytes of the commit.
    pub bytes: usize,
    /// Data bytes the operation wrote (writes), 0 otherwise.
    pub data: usize,
}

/// The last `limit` commits of a data directory (in use or not: the
/// journal is only read; a commit being written is not shown).
pub fn log(dir: &Path, limit: usize) -> Result<Vec<LogEntry>> {
    let first = journal_first_commit(dir)?.unwrap_or(1);
    let mut ring = std::collections::VecDeque::with_capacity(limit.min(1 << 16));
    recovery::replay_readonly(dir, first - 1, &mut |id, p| {
        let m = crate::codec::decode(p)?;
        let (ino, time, name, data) = match m {
            Mutation::Create { attr, name, .. }
            | Mutation::Link { attr, name, .. }
            | Mutation::Remove { attr, name, .. } => (attr.ino, Some(attr.ctime), Some(name), 0),
            Mutation::Rename {
                moved, new_name, ..
            } => (moved.ino, Some(moved.ctime), Some(new_name), 0),
            Mutation::SetAttr { attr } => (attr.ino, Some(attr.ctime), None, 0),
            Mutation::Write { attr, data, .. } => (attr.ino, Some(attr.mtime), None, data.len()),
            Mutation::Fallocate { attr, .. } => (attr.ino, Some(attr.mtime), None, 0),
            Mutation::SetXattr { attr, name, .. } | Mutation::RemoveXattr { attr, name } => {
                (attr.ino, Some(attr.ctime), Some(name), 0)
            }
            Mutation::Free { ino } => (ino, None, None, 0),
            Mutation::Tmpfile { attr } => (attr.ino, Some(attr.ctime), None, 0),
            Mutation::SetFlags { attr, .. } => (attr.ino, Some(attr.ctime), None, 0),
        };
        if ring.len() == limit {
            ring.pop_front();
        }
        if limit > 0 {
            ring.push_back(LogEntry {
                commit: id,
                time: time.map(|t| (t.sec, t.nsec)),
                op: m.op_name(),
                ino,
                name: name.map(|n| String::from_utf8_lossy(n).into_owned()),
                bytes: p.len(),
                data,
            });
        }
        Ok(())
    })?;
    Ok(ring.into_iter().collect())
}
