//! History beyond the journal itself: materializing any retained commit as a
//! separate, read-only tree (without touching the running file system), and
//! `diff` between two trees, like `zfs diff`. See `docs/time-travel.md`.

use std::collections::HashMap;
use std::path::Path;

use memfs_fs::{Attr, FIRST_ENTRY_OFFSET, FileType, Fs, ROOT_INO};

use crate::durable::DurableFs;
use crate::error::{Error, Result};
use crate::history_file::History;
use crate::reach::reach;
/// Rebuilding a retained commit lives with the rest of rebuilding.
pub use crate::rebuild::{materialize, materialize_config};

/// One side of a diff: a retained commit, or the live tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Commit(u64),
    Live,
}

/// Resolves `-`/`live`, a commit id or a snapshot name in `dir`'s history.
pub fn resolve_side(h: &History, spec: &str) -> Result<Side> {
    if spec == "-" || spec == "live" {
        return Ok(Side::Live);
    }
    if let Ok(c) = spec.parse::<u64>() {
        return Ok(Side::Commit(c));
    }
    h.snapshots
        .iter()
        .find(|s| s.name == spec)
        .map(|s| Side::Commit(s.commit))
        .ok_or_else(|| {
            Error::Invalid(format!(
                "{spec:?} is neither a commit id, a snapshot name nor - (the live tree); memfs snapshot list shows the names"
            ))
        })
}

/// The changes from `a` to `b` in a data directory that is not in use.
pub fn diff_offline(dir: &Path, a: &str, b: &str) -> Result<Vec<Change>> {
    let _lock = memfs_journal::DataDir::open(dir, false)?;
    let h = History::load(dir)?;
    let last = reach(dir)?.last;
    let tree = |s: Side| {
        let c = match s {
            Side::Commit(c) => c,
            Side::Live => last,
        };
        materialize(dir, c, materialize_config())
    };
    let ta = tree(resolve_side(&h, a)?)?;
    let tb = tree(resolve_side(&h, b)?)?;
    Ok(diff_trees(&ta, &tb))
}

/// The changes from `a` to `b` on a running durable file system: retained
/// commits are rebuilt aside, the live side is the running tree itself
/// (read while writers run).
pub fn diff_running(d: &DurableFs, a: &str, b: &str) -> Result<Vec<Change>> {
    let h = d.history()?;
    let sa = resolve_side(&h, a)?;
    let sb = resolve_side(&h, b)?;
    let built = |s: Side| match s {
        Side::Commit(c) => d.materialize(c).map(Some),
        Side::Live => Ok(None),
    };
    let ta = built(sa)?;
    let tb = built(sb)?;
    let live = d.fs();
    Ok(diff_trees(
        ta.as_ref().unwrap_or(live),
        tb.as_ref().unwrap_or(live),
    ))
}

/// One difference between two trees. Paths start with `/` (the file
/// system's root).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    /// `+ path`: a name that exists only on the new side.
    Created(Vec<u8>),
    /// `- path`: a name that exists only on the old side.
    Deleted(Vec<u8>),
    /// `M path`: the same node with other contents or attributes.
    Modified(Vec<u8>),
    /// `R old -> new`: the same node (inode number) under another name.
    Renamed(Vec<u8>, Vec<u8>),
}

/// Bytes as `zfs diff` prints them: printable ASCII as is, anything else
/// (and `\` and space) as `\ooo` octal, so one change is one line.
fn escape(p: &[u8]) -> String {
    let mut s = String::with_capacity(p.len());
    for &b in p {
        if b.is_ascii_graphic() && b != b'\\' {
            s.push(b as char);
        } else {
            s.push_str(&format!("\\{b:03o}"));
        }
    }
    s
}

impl Change {
    fn key(&self) -> &[u8] {
        match self {
            Change::Created(p) | Change::Deleted(p) | Change::Modified(p) => p,
            Change::Renamed(_, p) => p,
        }
    }
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Change::Created(p) => write!(f, "+ {}", escape(p)),
            Change::Deleted(p) => write!(f, "- {}", escape(p)),
            Change::Modified(p) => write!(f, "M {}", escape(p)),
            Change::Renamed(a, b) => write!(f, "R {} -> {}", escape(a), escape(b)),
        }
    }
}

/// What the diff needs of one node: attributes, every path naming it.
struct Entry {
    attr: Attr,
    paths: Vec<Vec<u8>>,
}

/// Every node reachable from the root, by inode number, with its names.
/// Each directory is read under its lock in slices; on a live tree writers
/// keep running, so a tree changing meanwhile is seen as a mix (like
/// `zfs diff` against a live file system).
fn index(fs: &Fs) -> HashMap<u64, Entry> {
    let mut out: HashMap<u64, Entry> = HashMap::new();
    let mut stack = vec![(ROOT_INO, b"/".to_vec())];
    while let Some((ino, path)) = stack.pop() {
        let Some(node) = fs.find_node(ino) else {
            continue;
        };
        let attr = node.read(|v| v.attr());
        if let Some(e) = out.get_mut(&ino) {
            // Another hard link: directories have one name, so no descent.
            e.paths.push(path);
            continue;
        }
        if attr.kind == FileType::Directory {
            let mut off = FIRST_ENTRY_OFFSET;
            loop {
                let mut batch = Vec::new();
                let mut next = None;
                node.read(|v| {
                    v.entries_from(off, |name, child, _, after| {
                        batch.push((name.to_vec(), child));
                        next = Some(after);
                        batch.len() < 1024
                    })
                });
                let full = batch.len() == 1024;
                for (name, child) in batch {
                    let mut p = path.clone();
                    if p.len() > 1 {
                        p.push(b'/');
                    }
                    p.extend_from_slice(&name);
                    stack.push((child, p));
                }
                match next {
                    Some(n) if full => off = n,
                    _ => break,
                }
            }
        }
        out.insert(
            ino,
            Entry {
                attr,
                paths: vec![path],
            },
        );
    }
    for e in out.values_mut() {
        e.paths.sort();
    }
    out
}

/// Whether two regular files hold different bytes (sizes are equal).
fn data_differs(a: &Fs, b: &Fs, ino: u64, size: u64) -> bool {
    let (Some(na), Some(nb)) = (a.find_node(ino), b.find_node(ino)) else {
        return true;
    };
    const CHUNK: usize = 256 << 10;
    let mut ba = vec![0u8; CHUNK];
    let mut bb = vec![0u8; CHUNK];
    let mut off = 0u64;
    while off < size {
        let n = CHUNK.min((size - off) as usize);
        na.read(|v| v.read_data(off, &mut ba[..n]));
        nb.read(|v| v.read_data(off, &mut bb[..n]));
        if ba[..n] != bb[..n] {
            return true;
        }
        off += n as u64;
    }
    false
}

fn node_differs(a: &Fs, b: &Fs, x: &Attr, y: &Attr) -> bool {
    if (x.perm, x.uid, x.gid, x.rdev, x.size) != (y.perm, y.uid, y.gid, y.rdev, y.size) {
        return true;
    }
    let (Some(na), Some(nb)) = (a.find_node(x.ino), b.find_node(y.ino)) else {
        return true;
    };
    let side = |n: &memfs_fs::Node| {
        n.read(|v| {
            let mut xs: Vec<(Vec<u8>, Vec<u8>)> = v
                .xattrs()
                .map(|(k, val)| (k.to_vec(), val.to_vec()))
                .collect();
            xs.sort();
            (v.symlink_target().map(<[u8]>::to_vec), xs)
        })
    };
    if side(&na) != side(&nb) {
        return true;
    }
    if x.mtime == y.mtime {
        // Same size and modification time: the data is taken as unchanged
        // (what rsync assumes); only a changed mtime costs a comparison.
        return false;
    }
    match x.kind {
        // A directory's mtime changes exactly when its entries do.
        FileType::Directory => true,
        FileType::RegularFile => data_differs(a, b, x.ino, x.size),
        _ => false,
    }
}

/// The changes that turn tree `a` into tree `b`, sorted by (new) path.
/// Nodes are matched by inode number (numbers are never reused within one
/// history), so a node found under other names is a rename; a node whose
/// type changed is a deletion and a creation.
pub fn diff_trees(a: &Fs, b: &Fs) -> Vec<Change> {
    let ia = index(a);
    let ib = index(b);
    let mut out = Vec::new();
    for (ino, ea) in &ia {
        match ib.get(ino) {
            Some(eb) if eb.attr.kind == ea.attr.kind => {
                let gone: Vec<&Vec<u8>> =
                    ea.paths.iter().filter(|p| !eb.paths.contains(p)).collect();
                let new: Vec<&Vec<u8>> =
                    eb.paths.iter().filter(|p| !ea.paths.contains(p)).collect();
                for (i, p) in gone.iter().enumerate() {
                    match new.get(i) {
                        Some(q) => out.push(Change::Renamed((*p).clone(), (*q).clone())),
                        None => out.push(Change::Deleted((*p).clone())),
                    }
                }
                for q in new.iter().skip(gone.len()) {
                    out.push(Change::Created((*q).clone()));
                }
                if node_differs(a, b, &ea.attr, &eb.attr) {
                    out.push(Change::Modified(eb.paths[0].clone()));
                }
            }
            other => {
                out.extend(ea.paths.iter().cloned().map(Change::Deleted));
                if let Some(eb) = other {
                    out.extend(eb.paths.iter().cloned().map(Change::Created));
                }
            }
        }
    }
    for (ino, eb) in &ib {
        if !ia.contains_key(ino) {
            out.extend(eb.paths.iter().cloned().map(Change::Created));
        }
    }
    out.sort_by(|x, y| x.key().cmp(y.key()).then_with(|| x.cmp(y)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use memfs_fs::{Config, Ctx};

    #[test]
    fn names_are_escaped_to_one_line() {
        assert_eq!(
            Change::Renamed(b"/a b".to_vec(), b"/n\nl\\".to_vec()).to_string(),
            "R /a\\040b -> /n\\012l\\134"
        );
    }

    #[test]
    fn diff_of_a_tree_with_itself_is_empty_and_sees_each_kind() {
        let ctx = Ctx {
            uid: 0,
            gid: 0,
            pid: 1,
        };
        let fs = Fs::new(Config::default());
        let d = fs.mkdir(ctx, ROOT_INO, b"d", 0o755).unwrap();
        let (f, _) = fs.create(ctx, d.ino, b"f", 0o644, false).unwrap();
        fs.write(ctx, f.ino, 0, b"hello", false).unwrap();
        assert!(diff_trees(&fs, &fs).is_empty());
    }
}
