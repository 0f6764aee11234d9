//! The `READ-ONLY` marker a run leaves when it turned read-only after an
//! I/O error (see the module comment of `durable.rs`).

use std::path::Path;

use crate::error::Result;

/// The marker of a run that ended read-only (see the module comment).
pub const READ_ONLY_FILE: &str = "READ-ONLY";

/// What the `READ-ONLY` marker records about a run that turned read-only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadOnlyMarker {
    pub reason: String,
    pub time_ns: u64,
    /// The last commit known durable when it failed: later ones were
    /// refused (EIO, durability unknown) or never acknowledged.
    pub durable_commit: u64,
}

impl ReadOnlyMarker {
    pub(crate) fn encode(&self) -> String {
        format!(
            "memfs-read-only 1\ntime_ns={}\ndurable_commit={}\nreason={}\n",
            self.time_ns,
            self.durable_commit,
            self.reason.replace('\n', " ")
        )
    }

    fn decode(text: &str) -> Option<ReadOnlyMarker> {
        let mut m = ReadOnlyMarker::default();
        let mut lines = text.lines();
        if lines.next()? != "memfs-read-only 1" {
            return None;
        }
        for l in lines {
            match l.split_once('=')? {
                ("time_ns", v) => m.time_ns = v.parse().ok()?,
                ("durable_commit", v) => m.durable_commit = v.parse().ok()?,
                ("reason", v) => m.reason = v.to_string(),
                _ => {}
            }
        }
        Some(m)
    }
}

/// The `READ-ONLY` marker of `dir`, if its last run turned read-only and
/// the marker could be written. A marker that cannot be parsed is reported
/// with its raw text as the reason.
pub fn read_only_marker(dir: &Path) -> Result<Option<ReadOnlyMarker>> {
    Ok(
        memfs_journal::dir::read_file(dir, READ_ONLY_FILE)?.map(|b| {
            let t = String::from_utf8_lossy(&b);
            ReadOnlyMarker::decode(&t).unwrap_or(ReadOnlyMarker {
                reason: t.trim().replace('\n', " "),
                ..Default::default()
            })
        }),
    )
}
