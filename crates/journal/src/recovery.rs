//! Reading the journal back: replay at open, `verify` (fsck) and `repair`.
//!
//! Rules (see `docs/journal.md`):
//! - segments are read in commit order; each must start right after the
//!   previous one ended (a missing segment is corruption);
//! - inside a segment, frames must carry consecutive commit ids;
//! - in the *last* segment, a bad or incomplete frame after which no valid frame
//!   follows, or whose share of some 512-byte sector is all zeros (an unsynced
//!   write that never landed while later ones did), is a torn tail: it is
//!   reported and truncated by the writer;
//! - any other bad frame is corruption: an error naming file and offset.
//!   Nothing is dropped silently; `repair` truncates only on request.

use crate::format::{self, Frame, SEGMENT_HEADER_LEN};
use crate::storage::{self, OpenMode, Storage};
use crate::{Error, Result, io_err};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What recovery did, for the caller to report.
#[derive(Debug, Clone, Default)]
pub struct RecoveryReport {
    /// Replay started after this commit (the checkpoint's commit, or 0).
    pub start_after: u64,
    /// Highest commit present in the journal after recovery.
    pub last_commit: u64,
    pub commits_replayed: u64,
    pub bytes_replayed: u64,
    /// Segment files present.
    pub segments: usize,
    /// A torn tail that was cut: file, offset, bytes dropped.
    pub truncated_tail: Option<(PathBuf, u64, u64)>,
    pub elapsed: Duration,
}

/// One damaged place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    pub file: PathBuf,
    pub offset: u64,
    pub reason: String,
}

/// The result of scanning a journal without changing it.
#[derive(Debug, Clone, Default)]
pub struct VerifyReport {
    pub segments: usize,
    pub commits: u64,
    pub first_commit: Option<u64>,
    /// Last intact commit before any damage.
    pub last_commit: u64,
    pub bytes: u64,
    /// A torn tail (harmless: recovery cuts it).
    pub torn_tail: Option<Damage>,
    /// Corruption before the tail: recovery refuses until `repair`.
    pub corruption: Option<Damage>,
    /// Bytes and segment files that a repair would drop.
    pub bytes_after_damage: u64,
    pub segments_after_damage: usize,
}

impl VerifyReport {
    pub fn is_clean(&self) -> bool {
        self.corruption.is_none()
    }
}

/// What `repair` cut.
#[derive(Debug, Clone, Default)]
pub struct RepairReport {
    pub before: VerifyReport,
    /// Commits kept: the journal now ends here.
    pub last_commit: u64,
    pub bytes_dropped: u64,
    pub files_removed: Vec<PathBuf>,
    pub truncated: Option<(PathBuf, u64)>,
}

pub fn list_segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    list_segments_with(&*storage::for_path(dir), dir)
}

pub(crate) fn list_segments_with(st: &dyn Storage, dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut v = Vec::new();
    for name in st.read_dir(dir).map_err(io_err(dir))? {
        if let Some(first) = name.to_str().and_then(format::parse_segment_file_name) {
            v.push((first, dir.join(&name)));
        }
    }
    v.sort();
    Ok(v)
}

/// Where the writer continues after a scan.
#[derive(Debug)]
pub(crate) enum Tail {
    /// No segment exists.
    Empty,
    /// Append to `path` (first commit `first`) at byte `len`; `rewrite_header`
    /// when the header itself was torn (a crash right after rotation).
    Append {
        first: u64,
        path: PathBuf,
        len: u64,
        rewrite_header: bool,
    },
}

pub(crate) struct Scan {
    pub report: RecoveryReport,
    pub tail: Tail,
    pub segments: Vec<(u64, PathBuf)>,
}

fn corrupt(file: &Path, offset: u64, reason: impl Into<String>) -> Error {
    Error::Corrupt {
        file: file.to_path_buf(),
        offset,
        reason: reason.into(),
    }
}

/// Scans every segment; calls `cb` for each commit after `after`. With
/// `skip_covered`, segments wholly at or below `after` are not read.
pub(crate) fn scan(
    st: &dyn Storage,
    dir: &Path,
    after: u64,
    skip_covered: bool,
    cb: &mut crate::ReplayFn<'_>,
) -> Result<Scan> {
    let t0 = Instant::now();
    let segments = list_segments_with(st, dir)?;
    let mut report = RecoveryReport {
        start_after: after,
        segments: segments.len(),
        ..Default::default()
    };
    let mut tail = Tail::Empty;
    let mut expected: Option<u64> = None;
    let n = segments.len();
    for (i, (first, path)) in segments.iter().enumerate() {
        let is_last = i + 1 == n;
        check_start(path, *first, expected, i == 0, after)?;
        if skip_covered && !is_last && segments[i + 1].0 <= after + 1 {
            expected = Some(segments[i + 1].0);
            continue;
        }
        let data = st.read(path).map_err(io_err(path))?;
        if let Some(torn) = check_header(&data, path, *first, is_last, &mut report)? {
            tail = torn;
            expected = Some(*first);
            break;
        }
        let (pos, next) = replay_segment(&data, path, *first, after, is_last, cb, &mut report)?;
        if is_last {
            tail = Tail::Append {
                first: *first,
                path: path.clone(),
                len: pos as u64,
                rewrite_header: false,
            };
        }
        expected = Some(next);
    }
    report.last_commit = expected.map_or(0, |e| e - 1);
    if !segments.is_empty() && report.last_commit < after {
        let path = &segments[n - 1].1;
        return Err(corrupt(
            path,
            0,
            format!(
                "the journal ends at commit {} but the checkpoint needs it to reach commit {after}",
                report.last_commit
            ),
        ));
    }
    report.last_commit = report.last_commit.max(after);
    report.elapsed = t0.elapsed();
    Ok(Scan {
        report,
        tail,
        segments,
    })
}

/// A segment must start where the previous one ended (`expected`), and the
/// first one no later than the first commit replay needs.
fn check_start(
    path: &Path,
    first: u64,
    expected: Option<u64>,
    is_first: bool,
    after: u64,
) -> Result<()> {
    if let Some(e) = expected
        && first != e
    {
        return Err(corrupt(
            path,
            0,
            format!(
                "segment starts at commit {first} but the previous segment ends at commit {} (a segment is missing or damaged)",
                e - 1
            ),
        ));
    }
    if is_first && first > after + 1 {
        return Err(corrupt(
            path,
            0,
            format!(
                "the journal starts at commit {first} but replay must start at commit {} (earlier segments are missing)",
                after + 1
            ),
        ));
    }
    Ok(())
}

/// Checks the header of the segment `data` read from `path`. `Ok(Some(tail))`
/// when it is the last segment's torn header: the scan ends there.
fn check_header(
    data: &[u8],
    path: &Path,
    first: u64,
    is_last: bool,
    report: &mut RecoveryReport,
) -> Result<Option<Tail>> {
    let header = data.get(..SEGMENT_HEADER_LEN);
    match header.map(format::decode_segment_header) {
        Some(Ok(h)) if h == first => Ok(None),
        Some(Ok(h)) => Err(corrupt(
            path,
            16,
            format!("segment header says first commit {h}, file name says {first}"),
        )),
        other => {
            // A crash right after creating the next segment leaves a
            // short or zero-filled header in the last file: nothing in it
            // was ever acknowledged.
            if is_last && data.iter().all(|&b| b == 0) {
                if !data.is_empty() {
                    report.truncated_tail = Some((path.to_path_buf(), 0, data.len() as u64));
                }
                return Ok(Some(Tail::Append {
                    first,
                    path: path.to_path_buf(),
                    len: 0,
                    rewrite_header: true,
                }));
            }
            let reason = match other {
                Some(Err(r)) => r,
                _ => format!("segment header truncated ({} bytes)", data.len()),
            };
            Err(corrupt(path, 0, reason))
        }
    }
}

/// Replays the commits of one segment past its header, those after `after`
/// through `cb`. Returns where its valid frames end and the id the next
/// commit must have.
fn replay_segment(
    data: &[u8],
    path: &Path,
    first: u64,
    after: u64,
    is_last: bool,
    cb: &mut crate::ReplayFn<'_>,
    report: &mut RecoveryReport,
) -> Result<(usize, u64)> {
    let mut pos = SEGMENT_HEADER_LEN;
    let mut next = first;
    while pos < data.len() {
        match format::decode_frame(&data[pos..]) {
            Frame::Ok { id, payload, len } => {
                if id != next {
                    return Err(corrupt(
                        path,
                        pos as u64 + 8,
                        format!("commit id {id} where {next} was expected"),
                    ));
                }
                if id > after {
                    cb(id, payload).map_err(|reason| Error::Apply { commit: id, reason })?;
                    report.commits_replayed += 1;
                    report.bytes_replayed += len as u64;
                }
                next += 1;
                pos += len;
            }
            bad => {
                let reason = match bad {
                    Frame::Bad(r) => r,
                    _ => "frame extends past the end of the file".into(),
                };
                // In the last segment, damage is a torn tail when nothing
                // valid follows, or when the frame is a write the crash
                // cut short (zero sectors) and what follows are later
                // unsynced writes that happened to land first.
                if is_last
                    && (format::find_valid_frame_after(data, pos + 1).is_none()
                        || format::torn_by_crash(data, pos))
                {
                    report.truncated_tail =
                        Some((path.to_path_buf(), pos as u64, (data.len() - pos) as u64));
                    break;
                }
                return Err(corrupt(
                    path,
                    pos as u64,
                    format!("{reason} (intact commits follow, so this is not a torn tail)"),
                ));
            }
        }
    }
    Ok((pos, next))
}

/// Replays every commit after `after` without changing any file (a torn tail
/// is reported, not cut). For read-only checks such as `verify`.
pub fn replay_readonly(
    dir: &Path,
    after: u64,
    cb: &mut crate::ReplayFn<'_>,
) -> Result<RecoveryReport> {
    scan(&*storage::for_path(dir), dir, after, true, cb).map(|s| s.report)
}

/// Checks every segment without changing anything.
pub fn verify(dir: &Path) -> Result<VerifyReport> {
    let st = &*storage::for_path(dir);
    let segments = list_segments_with(st, dir)?;
    let mut v = VerifyReport {
        segments: segments.len(),
        ..Default::default()
    };
    let mut count = 0u64;
    let mut first_commit = None;
    // A journal pruned behind a checkpoint starts later than commit 1: that is
    // not damage (whether the checkpoint covers the gap is the client's check).
    let start = segments.first().map_or(0, |s| s.0.saturating_sub(1));
    let res = scan(st, dir, start, false, &mut |id, p| {
        count += 1;
        first_commit.get_or_insert(id);
        let _ = p;
        Ok(())
    });
    v.commits = count;
    v.first_commit = first_commit;
    match res {
        Ok(s) => {
            v.last_commit = s.report.last_commit;
            v.torn_tail = s
                .report
                .truncated_tail
                .clone()
                .map(|(file, offset, _)| Damage {
                    file,
                    offset,
                    reason: "torn tail (an incomplete last commit; recovery discards it)".into(),
                });
            if let Some((_, _, b)) = &s.report.truncated_tail {
                v.bytes_after_damage = *b;
            }
        }
        Err(Error::Corrupt {
            file,
            offset,
            reason,
        }) => {
            v.last_commit = first_commit.map_or(0, |f| f + count - 1);
            let idx = segments.iter().position(|(_, p)| *p == file);
            let mut after = 0u64;
            let mut later = 0usize;
            if let Some(idx) = idx {
                let len = st.len(&file).unwrap_or(0);
                after += len.saturating_sub(offset);
                for (_, p) in &segments[idx + 1..] {
                    after += st.len(p).unwrap_or(0);
                    later += 1;
                }
            }
            v.bytes_after_damage = after;
            v.segments_after_damage = later;
            v.corruption = Some(Damage {
                file,
                offset,
                reason,
            });
        }
        Err(e) => return Err(e),
    }
    for (_, p) in &segments {
        v.bytes += st.len(p).map_err(io_err(p))?;
    }
    Ok(v)
}

/// Truncates the journal to its last intact commit. The report says what was
/// dropped; callers should print `before` to the user before calling.
pub fn repair(dir: &Path) -> Result<RepairReport> {
    let before = verify(dir)?;
    let mut r = RepairReport {
        last_commit: before.last_commit,
        ..Default::default()
    };
    if let Some(d) = &before.corruption {
        let st = &*storage::for_path(dir);
        let segments = list_segments_with(st, dir)?;
        let idx = segments
            .iter()
            .position(|(_, p)| *p == d.file)
            .ok_or_else(|| Error::Invalid(format!("{} vanished", d.file.display())))?;
        if d.offset < SEGMENT_HEADER_LEN as u64 {
            st.remove_file(&d.file).map_err(io_err(&d.file))?;
            r.files_removed.push(d.file.clone());
        } else {
            let mut f = st.open(&d.file, OpenMode::Write).map_err(io_err(&d.file))?;
            f.set_len(d.offset).map_err(io_err(&d.file))?;
            f.sync_all().map_err(io_err(&d.file))?;
            r.truncated = Some((d.file.clone(), d.offset));
        }
        for (_, p) in &segments[idx + 1..] {
            st.remove_file(p).map_err(io_err(p))?;
            r.files_removed.push(p.clone());
        }
        crate::dir::sync_dir_with(st, dir)?;
        r.bytes_dropped = before.bytes_after_damage;
    }
    r.before = before;
    Ok(r)
}

/// Discards every commit after `keep` (a rollback): segments that hold only
/// later commits are deleted, last first, and the segment holding commit
/// `keep + 1` is cut there. Each step is made durable before the next, so a
/// crash in the middle leaves a journal that is still a prefix of the old one
/// (callers record their intent first and finish the cut at the next open).
/// Returns the number of commits dropped. Refuses a damaged journal: repair
/// it first.
pub fn truncate_after(dir: &Path, keep: u64) -> Result<u64> {
    let st = &*storage::for_path(dir);
    let segments = list_segments_with(st, dir)?;
    let mut dropped = 0u64;
    for (first, path) in segments.iter().rev() {
        let data = st.read(path).map_err(io_err(path))?;
        if data.len() < SEGMENT_HEADER_LEN {
            if *first > keep {
                // A torn header right after rotation: nothing in it was ever acknowledged.
                st.remove_file(path).map_err(io_err(path))?;
                crate::dir::sync_dir_with(st, dir)?;
                continue;
            }
            return Err(corrupt(path, 0, "segment header truncated"));
        }
        // Find the byte offset of commit keep+1 (or the end) and count what follows.
        let mut pos = SEGMENT_HEADER_LEN;
        let mut cut = None;
        while pos < data.len() {
            match format::decode_frame(&data[pos..]) {
                Frame::Ok { id, len, .. } => {
                    if id > keep {
                        cut.get_or_insert(pos);
                        dropped += 1;
                    }
                    pos += len;
                }
                _ => break, // a torn tail: it goes with the cut or is cut at the next open
            }
        }
        if *first > keep {
            st.remove_file(path).map_err(io_err(path))?;
            crate::dir::sync_dir_with(st, dir)?;
            continue;
        }
        if let Some(cut) = cut.or((pos < data.len()).then_some(pos)) {
            let mut f = st.open(path, OpenMode::Write).map_err(io_err(path))?;
            f.set_len(cut as u64).map_err(io_err(path))?;
            f.sync_all().map_err(io_err(path))?;
        }
        break;
    }
    Ok(dropped)
}
