//! Building a tree from a checkpoint and the journal after it: at open,
//! for readers of a directory in use or not, and for past commits.

use std::path::Path;

use memfs_fs::{Config, Fs};
use memfs_journal::checkpoint::checkpoint_file_name;
use memfs_journal::recovery;
use memfs_journal::{CheckpointReader, CheckpointRef};

use crate::error::{Error, Result, image_err};
use crate::history_file::{CheckpointEntry, History};
use crate::image::{self, ImageInfo};
use crate::reach::reach;

/// Loads checkpoint `c` of `dir` into `fs`.
pub(crate) fn load_checkpoint(dir: &Path, c: &CheckpointRef, fs: &Fs) -> Result<ImageInfo> {
    let path = dir.join(checkpoint_file_name(c.commit));
    let mut r = CheckpointReader::open(&path).map_err(|e| {
        image_err(
            &path,
            format!("the manifest names this checkpoint but it cannot be opened: {e}"),
        )
    })?;
    let info = image::read_image(fs, &mut r).map_err(|e| image_err(&path, e))?;
    if info.commit != c.commit || info.required_end != c.required_end {
        return Err(image_err(
            &path,
            format!(
                "image covers commits {}..{} but the manifest says {}..{}",
                info.commit, info.required_end, c.commit, c.required_end
            ),
        ));
    }
    Ok(info)
}

/// Loads the newest checkpoint that passes validation: the manifest's, or,
/// if that one is damaged, the newest older one in HISTORY from which the
/// journal still continues, or none if the journal starts at commit 1.
/// Returns the tree, the checkpoint used, its info, and the damaged one
/// with the reason.
#[allow(clippy::type_complexity)]
pub(crate) fn load_base(
    dir: &Path,
    config: Config,
    named: Option<CheckpointRef>,
) -> Result<(
    Fs,
    Option<CheckpointRef>,
    Option<ImageInfo>,
    Option<(CheckpointRef, String)>,
)> {
    let Some(named) = named else {
        return Ok((Fs::new(config), None, None, None));
    };
    let fs = Fs::new(config);
    let err = match load_checkpoint(dir, &named, &fs) {
        Ok(info) => return Ok((fs, Some(named), Some(info), None)),
        Err(e) => e,
    };
    let journal_from = recovery::list_segments(dir)?.first().map(|s| s.0);
    let reachable = |c: u64| journal_from.is_some_and(|f| f <= c + 1);
    let older: Vec<CheckpointEntry> = History::load(dir)
        .map(|h| h.checkpoints)
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.commit < named.commit && reachable(c.commit))
        .rev()
        .collect();
    for c in older {
        let r = CheckpointRef {
            commit: c.commit,
            required_end: c.required_end,
        };
        let fs = Fs::new(config);
        match load_checkpoint(dir, &r, &fs) {
            Ok(info) => return Ok((fs, Some(r), Some(info), Some((named, err.to_string())))),
            Err(e) => tracing::error!("older checkpoint is damaged too: {e}"),
        }
    }
    if reachable(0) {
        return Ok((Fs::new(config), None, None, Some((named, err.to_string()))));
    }
    Err(err)
}

/// Rebuilds the state at `upto` (or the newest) from `base` and the journal,
/// without opening the journal for writing. For `log`-like readers, fsck and
/// rollback previews.
pub fn rebuild(
    dir: &Path,
    base: Option<CheckpointRef>,
    upto: Option<u64>,
    config: Config,
) -> Result<(Fs, u64)> {
    let fs = Fs::new(config);
    let after = match &base {
        Some(b) => {
            load_checkpoint(dir, b, &fs)?;
            b.commit
        }
        None => 0,
    };
    let mut last = after;
    let mut decode_err = None;
    recovery::replay_readonly(dir, after, &mut |id, p| {
        if upto.is_some_and(|u| id > u) {
            return Ok(());
        }
        match crate::codec::decode(p) {
            Ok(m) => {
                fs.apply(&m);
                last = id;
                Ok(())
            }
            Err(e) => {
                decode_err = Some(id);
                Err(e)
            }
        }
    })?;
    fs.finish_rebuild(last);
    Ok((fs, last))
}

/// Rebuilds the tree as it was after `commit`, from the newest checkpoint
/// before it and the journal, into a new [`Fs`] with no recorder. The data
/// directory is only read; the caller keeps checkpoints from being pruned
/// meanwhile (the directory lock, or the running server's admin lock).
pub fn materialize(dir: &Path, commit: u64, config: Config) -> Result<Fs> {
    let r = reach(dir)?;
    r.check(commit)?;
    let base = History::load(dir)?.base_for(commit).map(|c| CheckpointRef {
        commit: c.commit,
        required_end: c.required_end,
    });
    let (fs, last) = rebuild(dir, base, Some(commit), config)?;
    if last != commit {
        return Err(Error::Invalid(format!(
            "the journal in {} stops at commit {last}, before commit {commit}",
            dir.display()
        )));
    }
    Ok(fs)
}

/// A materialized tree gets room for anything a retained commit can hold.
pub fn materialize_config() -> Config {
    Config {
        capacity: u64::MAX / 2,
        max_inodes: u64::MAX / 2,
    }
}
