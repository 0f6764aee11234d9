//! Whole-tree views for fsck and tests: a canonical listing of everything a
//! user can observe (two equal listings mean two equal file systems), and a
//! consistency check of the structure (link counts, parents, dangling
//! entries, unreachable nodes).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hasher;

use crate::Fs;
use crate::inode::Body;
use crate::types::{FileType, ROOT_INO};

fn esc(b: &[u8]) -> String {
    b.escape_ascii().to_string()
}

impl Fs {
    /// One line per path, sorted: type, permissions, owner, link count,
    /// size, modification and change times, device, symlink target, xattrs
    /// and a hash of the contents; a further name of a hard-linked node says
    /// which path it shares. Access times are left out: reads change them
    /// without a commit (like `lazytime`).
    pub fn canonical_dump(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut seen: HashMap<u64, String> = HashMap::new();
        let mut stack = vec![(ROOT_INO, String::from("/"))];
        while let Some((ino, path)) = stack.pop() {
            let Ok(inode) = self.get(ino) else {
                out.push(format!("{path} MISSING inode {ino}"));
                continue;
            };
            if let Some(first) = seen.get(&ino) {
                out.push(format!("{path} = {first}"));
                continue;
            }
            seen.insert(ino, path.clone());
            let st = inode.state.read();
            let a = st.attr(ino, inode.kind);
            let mut line = format!(
                "{path} {:?} {:o} {}:{} n{} s{} m{}.{} c{}.{} r{}",
                a.kind,
                a.perm,
                a.uid,
                a.gid,
                a.nlink,
                a.size,
                a.mtime.sec,
                a.mtime.nsec,
                a.ctime.sec,
                a.ctime.nsec,
                a.rdev
            );
            if let Some(xs) = &st.meta.xattrs {
                let mut v: Vec<_> = xs.iter().collect();
                v.sort();
                for (k, val) in v {
                    line.push_str(&format!(" x[{}={}]", esc(k), esc(val)));
                }
            }
            match &st.body {
                Body::Symlink(t) => line.push_str(&format!(" -> {}", esc(t))),
                Body::File(d) => {
                    // Only pages holding data: a sparse file of 8 EiB must
                    // not be read byte by byte. Zero pages equal holes.
                    let mut h = std::collections::hash_map::DefaultHasher::new();
                    let mut start = Some(0);
                    while let Some(s) = start {
                        start = d.pages_from(s, usize::MAX, |idx, page| {
                            if page.iter().any(|&b| b != 0) {
                                h.write_u64(idx);
                                h.write(page);
                            }
                        });
                    }
                    line.push_str(&format!(" h{:016x} p{}", h.finish(), d.page_count()));
                }
                Body::Dir(d) => {
                    let mut kids = Vec::new();
                    d.list_from(crate::dir::FIRST_SLOT_OFFSET, |s, _| {
                        kids.push((s.name.to_vec(), s.ino));
                        true
                    });
                    kids.sort();
                    let base = if path == "/" {
                        String::new()
                    } else {
                        path.clone()
                    };
                    for (name, child) in kids.into_iter().rev() {
                        stack.push((child, format!("{base}/{}", esc(&name))));
                    }
                }
                Body::Special => {}
            }
            out.push(line);
        }
        out.sort();
        out
    }

    /// Structural problems, each described in one line; empty when sound.
    pub fn check_consistency(&self) -> Vec<String> {
        let mut problems = Vec::new();
        // Count the names and subdirectories each node has.
        let mut names: BTreeMap<u64, u32> = BTreeMap::new();
        let mut subdirs: BTreeMap<u64, u32> = BTreeMap::new();
        let inodes: Vec<_> = self.inodes.iter().map(|e| e.value().clone()).collect();
        for inode in &inodes {
            let st = inode.state.read();
            if let Body::Dir(d) = &st.body {
                if st.meta.nlink == 0 {
                    continue;
                }
                d.list_from(crate::dir::FIRST_SLOT_OFFSET, |s, _| {
                    *names.entry(s.ino).or_default() += 1;
                    match self.get(s.ino) {
                        Err(_) => problems.push(format!(
                            "directory {} names missing inode {} ({})",
                            inode.ino,
                            s.ino,
                            esc(&s.name)
                        )),
                        Ok(c) => {
                            if c.kind != s.kind {
                                problems.push(format!(
                                    "directory {} entry {} says {:?}, inode {} is {:?}",
                                    inode.ino,
                                    esc(&s.name),
                                    s.kind,
                                    s.ino,
                                    c.kind
                                ));
                            }
                            if c.kind == FileType::Directory {
                                *subdirs.entry(inode.ino).or_default() += 1;
                                let parent = c.state.read().dir().map(|d| d.parent);
                                if parent != Some(inode.ino) {
                                    problems.push(format!(
                                        "directory {} is in {} but its .. is {:?}",
                                        s.ino, inode.ino, parent
                                    ));
                                }
                            }
                        }
                    }
                    true
                });
            }
        }
        for inode in &inodes {
            let st = inode.state.read();
            let n = names.get(&inode.ino).copied().unwrap_or(0);
            let want = if inode.kind == FileType::Directory {
                if inode.ino == ROOT_INO || n > 0 {
                    2 + subdirs.get(&inode.ino).copied().unwrap_or(0)
                } else {
                    0
                }
            } else {
                n
            };
            if inode.ino != ROOT_INO && n == 0 && st.meta.nlink > 0 {
                problems.push(format!(
                    "inode {} has link count {} but no directory names it",
                    inode.ino, st.meta.nlink
                ));
            } else if st.meta.nlink != want && (n > 0 || inode.ino == ROOT_INO) {
                problems.push(format!(
                    "inode {} has link count {}, expected {want}",
                    inode.ino, st.meta.nlink
                ));
            }
            if inode.kind == FileType::Directory && n > 1 {
                problems.push(format!("directory {} has {n} names", inode.ino));
            }
        }
        problems
    }
}
