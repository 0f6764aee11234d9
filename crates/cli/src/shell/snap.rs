//! The engine's copy-on-write snapshots in the shell: `snapshot`, `rollback`
//! and `diff` without a data directory, and browsing `.snapshots/NAME/...`
//! with `ls` and `read`, as a mount shows them.
//!
//! A snapshot path is one whose first component (from the root: an absolute
//! path, or a relative one while the working directory is the root) is
//! `.snapshots`. It is resolved through the engine's read-only snapshot
//! views, never through the live tree, so a live file of that name is hidden
//! here as it is on a mount.

use std::io::Write;

use memfs_fs::{Attr, Errno, FileType, Fs, ROOT_INO};

use super::format::{format_time, ls_line_with, name_str};
use super::{CmdError, CmdResult, Shell, err, fs_err};

/// The directory that shows the snapshots, as on a mount.
pub const SNAPDIR: &str = ".snapshots";

/// What a snapshot path names.
pub enum Target {
    /// `.snapshots` itself: one entry per snapshot.
    Dir,
    /// A node of snapshot `snap`.
    Node { snap: u64, attr: Attr },
}

/// The components after `.snapshots`, or `None` when `path` is not a snapshot
/// path. `.` is dropped and `..` taken lexically (it cannot leave
/// `.snapshots` other than to the root, which is not a snapshot path).
pub fn split(cwd: u64, path: &str) -> Option<Vec<&str>> {
    if !path.starts_with('/') && cwd != ROOT_INO {
        return None;
    }
    let mut comps: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                comps.pop();
            }
            c => comps.push(c),
        }
    }
    match comps.first() {
        Some(&SNAPDIR) => Some(comps.split_off(1)),
        _ => None,
    }
}

/// Resolves the components after `.snapshots` (symbolic links are not
/// followed: a snapshot's links name paths of the live tree).
pub fn resolve(fs: &Fs, comps: &[&str], path: &str) -> Result<Target, CmdError> {
    let Some((name, rest)) = comps.split_first() else {
        return Ok(Target::Dir);
    };
    let Some(info) = fs.snapshot_by_name(name.as_bytes()) else {
        return Err(fs_err(Errno::ENOENT, path));
    };
    let mut attr = fs
        .snap_getattr(info.id, ROOT_INO)
        .map_err(|e| fs_err(e, path))?;
    for c in rest {
        if attr.kind != FileType::Directory {
            return Err(fs_err(Errno::ENOTDIR, path));
        }
        attr = fs
            .snap_lookup(info.id, attr.ino, c.as_bytes())
            .map_err(|e| fs_err(e, path))?;
    }
    Ok(Target::Node {
        snap: info.id,
        attr,
    })
}

/// `ls` of a snapshot path.
pub fn ls(sh: &mut Shell, path: &str, comps: &[&str], long: bool, all: bool) -> CmdResult {
    let fs = sh.fs.clone();
    match resolve(&fs, comps, path)? {
        Target::Dir => {
            for s in fs.snapshot_list() {
                let line = match fs.snap_getattr(s.id, ROOT_INO) {
                    Ok(a) => ls_line_with(&s.name, &a, long, |_| None),
                    Err(_) => name_str(&s.name),
                };
                writeln!(sh.out, "{line}")?;
            }
            Ok(())
        }
        Target::Node { snap, attr } if attr.kind != FileType::Directory => {
            let name = comps.last().map_or(path, |c| *c);
            let line = ls_line_with(name.as_bytes(), &attr, long, |ino| {
                fs.snap_readlink(snap, ino).ok()
            });
            writeln!(sh.out, "{line}")?;
            Ok(())
        }
        Target::Node { snap, attr } => {
            let mut entries: Vec<(Vec<u8>, u64)> = Vec::new();
            fs.snap_readdir(snap, attr.ino, if all { 0 } else { 2 }, |e| {
                entries.push((e.name.to_vec(), e.ino));
                true
            })
            .map_err(|e| fs_err(e, path))?;
            entries.sort();
            for (name, ino) in entries {
                let a = match name.as_slice() {
                    b"." => Ok(attr),
                    b".." => fs.snap_lookup(snap, attr.ino, b".."),
                    _ => fs.snap_getattr(snap, ino),
                };
                let Ok(a) = a else { continue };
                let line = ls_line_with(&name, &a, long, |ino| fs.snap_readlink(snap, ino).ok());
                writeln!(sh.out, "{line}")?;
            }
            Ok(())
        }
    }
}

/// The whole contents of a regular file in a snapshot.
pub fn read(fs: &Fs, path: &str, comps: &[&str]) -> Result<Vec<u8>, CmdError> {
    match resolve(fs, comps, path)? {
        Target::Dir => Err(fs_err(Errno::EISDIR, path)),
        Target::Node { attr, .. } if attr.kind == FileType::Directory => {
            Err(fs_err(Errno::EISDIR, path))
        }
        Target::Node { attr, .. } if attr.kind != FileType::RegularFile => {
            err(format!("not a regular file: {path}"))
        }
        Target::Node { snap, attr } => {
            let size = usize::try_from(attr.size)
                .map_err(|_| CmdError(format!("too large to read: {path}")))?;
            let mut buf = vec![0u8; size];
            let mut done = 0;
            while done < size {
                let n = fs
                    .snap_read(snap, attr.ino, done as u64, &mut buf[done..])
                    .map_err(|e| fs_err(e, path))?;
                if n == 0 {
                    break;
                }
                done += n;
            }
            buf.truncate(done);
            Ok(buf)
        }
    }
}

/// `snapshot create|list|delete` on the engine (no data directory).
pub fn manage(sh: &mut Shell, ops: &[&str]) -> CmdResult {
    let fs = sh.fs.clone();
    match ops {
        ["create", n] => {
            fs.snapshot_create(n.as_bytes())
                .map_err(|e| snap_err(e, n))?;
        }
        ["delete", n] => fs
            .snapshot_delete(n.as_bytes())
            .map_err(|e| snap_err(e, n))?,
        _ => {
            for s in fs.snapshot_list() {
                writeln!(
                    sh.out,
                    "{} {} (keeps {} nodes, {} of its own)",
                    name_str(&s.name),
                    format_time(s.created, false),
                    s.nodes,
                    crate::human::bytes(s.bytes)
                )?;
            }
        }
    }
    Ok(())
}

/// `rollback --to NAME` on the engine: the live tree becomes the snapshot's,
/// in place (the snapshot and later ones stay).
pub fn rollback(sh: &mut Shell, to: &str) -> CmdResult {
    sh.fs
        .rollback_to_snapshot(to.as_bytes())
        .map_err(|e| snap_err(e, to))?;
    // The working directory may not exist in the target state.
    if sh.fs.getattr(sh.cwd()).is_err() {
        sh.cwd.store(ROOT_INO, std::sync::atomic::Ordering::Release);
    }
    Ok(())
}

/// `diff A [B]`: A and B name snapshots, `-` (B's default) the live tree.
pub fn diff(sh: &mut Shell, a: &str, b: &str) -> CmdResult {
    let fs = sh.fs.clone();
    let side = |s: &str| -> Result<Option<Fs>, CmdError> {
        if s == "-" {
            return Ok(None);
        }
        fs.clone_snapshot(s.as_bytes(), fs.config())
            .map(Some)
            .map_err(|e| snap_err(e, s))
    };
    let (ta, tb) = (side(a)?, side(b)?);
    let changes =
        memfs_durable::history::diff_trees(ta.as_ref().unwrap_or(&fs), tb.as_ref().unwrap_or(&fs));
    for c in changes {
        writeln!(sh.out, "{c}")?;
    }
    Ok(())
}

fn snap_err(e: Errno, name: &str) -> CmdError {
    match e {
        Errno::ENOENT => CmdError(format!("no snapshot named {name}")),
        Errno::EEXIST => CmdError(format!("a snapshot named {name} exists already")),
        Errno::EINVAL | Errno::ENAMETOOLONG => CmdError(format!(
            "bad snapshot name {name:?}: 1-255 bytes, no '/', not . or .."
        )),
        Errno::ENOSPC => CmdError("too many snapshots: delete some first".into()),
        e => fs_err(e, name),
    }
}
