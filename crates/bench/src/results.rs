//! The results folder of `memfs bench all` (`results.json`): its records,
//! loading and checking. Shared by the runner (`all.rs`), the plots and the
//! report; it depends only on `common.rs`, so none of those import each other
//! for these types.

use std::path::Path;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use crate::common::{Figure, Machine};

/// Every benchmark kind a complete results folder has (run or skipped with a
/// reason), in the order they run.
pub const KINDS: [&str; 7] = [
    "metadata", "fio", "workload", "block", "lock", "memory", "cluster",
];

/// Version of the results folder's format (`results.json`).
pub const FORMAT: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    Skipped,
    Failed,
}

/// One step's record in `results.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StepRecord {
    /// Unique in a run, e.g. `metadata-t4-shared-disk`; figures refer to it.
    pub id: String,
    /// One of [`KINDS`].
    pub kind: String,
    pub title: String,
    /// The equivalent stand-alone command (paths of temporary mounts are
    /// written as placeholders).
    pub command: String,
    pub status: Status,
    /// Why it was skipped, or its error.
    pub reason: Option<String>,
    pub duration_secs: f64,
    /// The step's own report, relative to the results folder.
    pub json: Option<String>,
}

/// A figure of the run: the benchmark's figure and the step it comes from.
/// `(step, figure)` identifies it across runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunFigure {
    pub step: String,
    pub kind: String,
    #[serde(flatten)]
    pub figure: Figure,
}

/// A file system a run used, for the report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FsInfo {
    pub role: String,
    pub path: String,
    pub fs_type: String,
}

/// `results.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Results {
    pub format: u32,
    pub memfs_version: String,
    pub command: String,
    pub quick: bool,
    pub started_unix: u64,
    pub duration_secs: f64,
    pub machine: Machine,
    pub file_systems: Vec<FsInfo>,
    pub steps: Vec<StepRecord>,
    pub figures: Vec<RunFigure>,
    /// Plot files without extension, relative to the folder (each has an
    /// `.svg` and a `.png`).
    pub plots: Vec<String>,
}

impl Results {
    pub fn load(dir: &Path) -> anyhow::Result<Self> {
        let path = if dir.is_dir() {
            dir.join("results.json")
        } else {
            dir.to_path_buf()
        };
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let r: Results = serde_json::from_str(&text).with_context(|| {
            format!("{} is not a `memfs bench all` results file", path.display())
        })?;
        if r.format != FORMAT {
            bail!(
                "{}: results format {} (this memfs reads format {FORMAT})",
                path.display(),
                r.format
            );
        }
        Ok(r)
    }

    /// What makes the folder incomplete: a kind with no step, a failed step,
    /// a skipped step without a reason, an ok step without figures.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        for kind in KINDS {
            if !self.steps.iter().any(|s| s.kind == kind) {
                out.push(format!("no {kind} benchmark (neither run nor skipped)"));
            }
        }
        for s in &self.steps {
            match s.status {
                Status::Failed => out.push(format!(
                    "step {} failed: {}",
                    s.id,
                    s.reason.as_deref().unwrap_or("(no error recorded)")
                )),
                Status::Skipped if s.reason.as_deref().is_none_or(|r| r.trim().is_empty()) => {
                    out.push(format!("step {} skipped without a reason", s.id));
                }
                Status::Ok if !self.figures.iter().any(|f| f.step == s.id) => {
                    out.push(format!("step {} has no figures", s.id));
                }
                _ => {}
            }
        }
        out
    }
}

/// `2026-11-23T07-41-05Z` for a Unix time (UTC; no colons, for file names).
pub fn utc_stamp(t: u64) -> String {
    let (y, m, d, h, min, sec) = crate::common::civil_utc(t as i64);
    format!("{y:04}-{m:02}-{d:02}T{h:02}-{min:02}-{sec:02}Z")
}
