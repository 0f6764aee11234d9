//! Whole-tree views for fsck and tests: a canonical listing of everything a
//! user can observe (two equal listings mean two equal file systems), and a
//! consistency check of the structure (link counts, parents, dangling
//! entries, unreachable nodes).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hasher;

use memfs_fs::{FIRST_ENTRY_OFFSET, FileType, Fs, Node, NodeView, ROOT_INO};

fn esc(b: &[u8]) -> String {
    b.escape_ascii().to_string()
}

/// Whole-tree views of an [`Fs`], as methods (`fs.canonical_dump()`).
pub trait FsCheck {
    /// One line per path, sorted: type, permissions, owner, link count,
    /// size, modification and change times, device, symlink target, xattrs
    /// and a hash of the contents; a further name of a hard-linked node says
    /// which path it shares. Access times are left out: reads change them
    /// without a commit (like `lazytime`).
    fn canonical_dump(&self) -> Vec<String>;

    /// Structural problems, each described in one line; empty when sound.
    fn check_consistency(&self) -> Vec<String>;
}

impl FsCheck for Fs {
    /// One line per path, sorted: type, permissions, owner, link count,
    /// size, modification and change times, device, symlink target, xattrs
    /// and a hash of the contents; a further name of a hard-linked node says
    /// which path it shares. Access times are left out: reads change them
    /// without a commit (like `lazytime`).
    fn canonical_dump(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut seen: HashMap<u64, String> = HashMap::new();
        let mut stack = vec![(ROOT_INO, String::from("/"))];
        while let Some((ino, path)) = stack.pop() {
            let Some(inode) = self.find_node(ino) else {
                out.push(format!("{path} MISSING inode {ino}"));
                continue;
            };
            if let Some(first) = seen.get(&ino) {
                out.push(format!("{path} = {first}"));
                continue;
            }
            seen.insert(ino, path.clone());
            let line = inode.read(|st| dump_line(&path, st, &mut stack));
            out.push(line);
        }
        out.sort();
        out
    }

    /// Structural problems, each described in one line; empty when sound.
    fn check_consistency(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let inodes = self.nodes();
        let (names, subdirs) = count_names(self, &inodes, &mut problems);
        check_link_counts(&inodes, &names, &subdirs, &mut problems);
        problems
    }
}

/// A node's line of [`FsCheck::canonical_dump`]; a directory's children
/// go on `stack`, first name on top.
fn dump_line(path: &str, st: &NodeView<'_>, stack: &mut Vec<(u64, String)>) -> String {
    let a = st.attr();
    let mut line = format!(
        "{path} {:?} {:o} {}:{} n{} s{} m{}.{} c{}.{} r{}",
        a.kind,
        a.perm,
        a.uid,
        a.gid,
        a.nlink,
        a.size,
        { a.mtime.sec },
        { a.mtime.nsec },
        { a.ctime.sec },
        { a.ctime.nsec },
        a.rdev
    );
    let mut v: Vec<_> = st.xattrs().collect();
    v.sort();
    for (k, val) in v {
        line.push_str(&format!(" x[{}={}]", esc(k), esc(val)));
    }
    if let Some(t) = st.symlink_target() {
        line.push_str(&format!(" -> {}", esc(t)));
    } else if let Some(page_count) = st.page_count() {
        // Only pages holding data: a sparse file of 8 EiB must
        // not be read byte by byte. Zero pages equal holes.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let mut start = Some(0);
        while let Some(s) = start {
            start = st.pages_from(s, usize::MAX, |idx, page| {
                if page.iter().any(|&b| b != 0) {
                    h.write_u64(idx);
                    h.write(page);
                }
            });
        }
        line.push_str(&format!(" h{:016x} p{}", h.finish(), page_count));
    } else {
        let mut kids = Vec::new();
        if st.entries_from(FIRST_ENTRY_OFFSET, |name, ino, _, _| {
            kids.push((name.to_vec(), ino));
            true
        }) {
            kids.sort();
            let base = if path == "/" {
                String::new()
            } else {
                path.to_owned()
            };
            for (name, child) in kids.into_iter().rev() {
                stack.push((child, format!("{base}/{}", esc(&name))));
            }
        }
    }
    line
}

/// Counts the names and subdirectories each node has, noting entries that
/// name a missing node or disagree with it.
fn count_names(
    fs: &Fs,
    inodes: &[Node],
    problems: &mut Vec<String>,
) -> (BTreeMap<u64, u32>, BTreeMap<u64, u32>) {
    let mut names: BTreeMap<u64, u32> = BTreeMap::new();
    let mut subdirs: BTreeMap<u64, u32> = BTreeMap::new();
    for inode in inodes {
        let (ino, kind) = (inode.ino(), inode.kind());
        inode.read(|st| {
            if kind != FileType::Directory || st.nlink() == 0 {
                return;
            }
            st.entries_from(FIRST_ENTRY_OFFSET, |name, s_ino, s_kind, _| {
                *names.entry(s_ino).or_default() += 1;
                match fs.find_node(s_ino) {
                    None => problems.push(format!(
                        "directory {} names missing inode {} ({})",
                        ino,
                        s_ino,
                        esc(name)
                    )),
                    Some(c) => {
                        if c.kind() != s_kind {
                            problems.push(format!(
                                "directory {} entry {} says {:?}, inode {} is {:?}",
                                ino,
                                esc(name),
                                s_kind,
                                s_ino,
                                c.kind()
                            ));
                        }
                        if c.kind() == FileType::Directory {
                            *subdirs.entry(ino).or_default() += 1;
                            let parent = c.read(|cs| cs.dir_parent());
                            if parent != Some(ino) {
                                problems.push(format!(
                                    "directory {} is in {} but its .. is {:?}",
                                    s_ino, ino, parent
                                ));
                            }
                        }
                    }
                }
                true
            });
        });
    }
    (names, subdirs)
}

/// Notes link counts that disagree with the names counted.
fn check_link_counts(
    inodes: &[Node],
    names: &BTreeMap<u64, u32>,
    subdirs: &BTreeMap<u64, u32>,
    problems: &mut Vec<String>,
) {
    for inode in inodes {
        let (ino, kind) = (inode.ino(), inode.kind());
        let nlink = inode.read(|st| st.nlink());
        let n = names.get(&ino).copied().unwrap_or(0);
        let want = if kind == FileType::Directory {
            if ino == ROOT_INO || n > 0 {
                2 + subdirs.get(&ino).copied().unwrap_or(0)
            } else {
                0
            }
        } else {
            n
        };
        if ino != ROOT_INO && n == 0 && nlink > 0 {
            problems.push(format!(
                "inode {} has link count {} but no directory names it",
                ino, nlink
            ));
        } else if nlink != want && (n > 0 || ino == ROOT_INO) {
            problems.push(format!(
                "inode {} has link count {}, expected {want}",
                ino, nlink
            ));
        }
        if kind == FileType::Directory && n > 1 {
            problems.push(format!("directory {} has {n} names", ino));
        }
    }
}
