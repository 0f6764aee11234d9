//! The `HISTORY` file: the checkpoints kept and the named snapshots, with
//! its line format and the grammar of snapshot names.

use std::path::Path;

use crate::error::{Error, Result};

const HISTORY_FILE: &str = "HISTORY";
const HISTORY_HEADER: &str = "memfs-history 1";

/// A checkpoint kept for recovery and rollback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointEntry {
    pub commit: u64,
    pub required_end: u64,
    pub time_ns: u64,
}

/// A named snapshot: a pinned commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotEntry {
    pub name: String,
    pub commit: u64,
    pub time_ns: u64,
}

/// The `HISTORY` file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    pub checkpoints: Vec<CheckpointEntry>,
    pub snapshots: Vec<SnapshotEntry>,
}

/// Snapshot names: what is safe in a line-based file and on a command line.
pub fn check_snapshot_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-@:+".contains(&b))
        && !name.bytes().all(|b| b.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "bad snapshot name {name:?}: 1-64 characters of letters, digits and . _ - @ : +, not all digits, not starting with -"
        )))
    }
}

impl History {
    pub fn load(dir: &Path) -> Result<History> {
        let Some(bytes) = memfs_journal::dir::read_file(dir, HISTORY_FILE)? else {
            return Ok(History::default());
        };
        let path = dir.join(HISTORY_FILE);
        let bad = |line: usize, why: &str| {
            Error::Invalid(format!(
                "{} is damaged at line {line}: {why}",
                path.display()
            ))
        };
        let text = std::str::from_utf8(&bytes).map_err(|_| bad(1, "not text"))?;
        let mut lines = text.lines();
        if lines.next() != Some(HISTORY_HEADER) {
            return Err(bad(1, "unknown header"));
        }
        let mut h = History::default();
        for (i, line) in lines.enumerate() {
            let f: Vec<&str> = line.split(' ').collect();
            let num = |s: &str| s.parse::<u64>().map_err(|_| bad(i + 2, "bad number"));
            match f.as_slice() {
                ["checkpoint", c, r, t] => h.checkpoints.push(CheckpointEntry {
                    commit: num(c)?,
                    required_end: num(r)?,
                    time_ns: num(t)?,
                }),
                ["snapshot", n, c, t] => {
                    check_snapshot_name(n).map_err(|_| bad(i + 2, "bad snapshot name"))?;
                    h.snapshots.push(SnapshotEntry {
                        name: n.to_string(),
                        commit: num(c)?,
                        time_ns: num(t)?,
                    })
                }
                _ => return Err(bad(i + 2, "unknown line")),
            }
        }
        h.checkpoints.sort_by_key(|c| c.commit);
        Ok(h)
    }

    pub fn save(&self, dir: &Path) -> Result<()> {
        let mut s = String::from(HISTORY_HEADER);
        s.push('\n');
        for c in &self.checkpoints {
            s.push_str(&format!(
                "checkpoint {} {} {}\n",
                c.commit, c.required_end, c.time_ns
            ));
        }
        for n in &self.snapshots {
            s.push_str(&format!("snapshot {} {} {}\n", n.name, n.commit, n.time_ns));
        }
        memfs_journal::dir::write_file_atomic(dir, HISTORY_FILE, s.as_bytes())?;
        Ok(())
    }

    /// The newest checkpoint that can rebuild the state at `commit`.
    pub fn base_for(&self, commit: u64) -> Option<CheckpointEntry> {
        self.checkpoints
            .iter()
            .rev()
            .find(|c| c.required_end <= commit)
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_names_are_checked() {
        assert!(check_snapshot_name("123").is_err());
        assert!(check_snapshot_name("before upgrade").is_err());
        check_snapshot_name("before-upgrade.2").unwrap();
    }
}
