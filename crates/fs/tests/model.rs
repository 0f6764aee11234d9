//! Model-based property test of the engine.
//!
//! Long random sequences of operations run against both the engine and a
//! small, deliberately naive reference model; every result and errno is
//! compared, and after every step the whole tree (names, types, link counts,
//! modes, owners, sizes, allocated pages, contents, symlink targets, xattrs,
//! inode and page accounting) is compared too.
//!
//! The model keeps as little derived state as possible so that it is
//! obviously right: link counts and parents are recomputed from the directory
//! entries, a node exists while a name or an open handle refers to it, and
//! file contents are a map of the non-zero bytes plus the set of allocated
//! pages (so 1 TiB offsets cost nothing).
//!
//! The name space is tiny (a handful of names, few directories) so that
//! collisions, `EEXIST`, `ENOTEMPTY`, `EISDIR`, `ENOTDIR` and the
//! rename-into-own-subtree `EINVAL` come up all the time. The default case
//! count keeps the run short; set `PROPTEST_CASES` for a longer soak.

use std::collections::{BTreeMap, BTreeSet};

use memfs_fs::*;
use proptest::prelude::*;

const P: u64 = PAGE_SIZE as u64;
const USER: Ctx = Ctx {
    uid: 1000,
    gid: 1000,
    pid: 7,
};
/// An inode number that never exists.
const STALE: u64 = u64::MAX / 2;

// ---- the reference model ---------------------------------------------------------

#[derive(Clone, Debug, Default)]
struct MFile {
    size: u64,
    /// Non-zero bytes only: holes and zeros are absent.
    bytes: BTreeMap<u64, u8>,
    /// Allocated pages (what `st_blocks`, `SEEK_DATA` and capacity see).
    pages: BTreeSet<u64>,
}

#[derive(Clone, Debug)]
enum MBody {
    File(MFile),
    Dir(BTreeMap<Vec<u8>, u64>),
    Symlink(Vec<u8>),
    Special(FileType, u32),
}

#[derive(Clone, Debug)]
struct MNode {
    body: MBody,
    perm: u16,
    uid: u32,
    gid: u32,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    open: u32,
    /// Kernel references (lookups not yet forgotten).
    lookups: u32,
}

impl MNode {
    fn kind(&self) -> FileType {
        match &self.body {
            MBody::File(_) => FileType::RegularFile,
            MBody::Dir(_) => FileType::Directory,
            MBody::Symlink(_) => FileType::Symlink,
            MBody::Special(k, _) => *k,
        }
    }
    fn is_dir(&self) -> bool {
        matches!(self.body, MBody::Dir(_))
    }
    fn entries(&self) -> Option<&BTreeMap<Vec<u8>, u64>> {
        match &self.body {
            MBody::Dir(e) => Some(e),
            _ => None,
        }
    }
}

struct Model {
    nodes: BTreeMap<u64, MNode>,
    max_pages: u64,
    max_inodes: u64,
}

fn err<T>(e: Errno) -> Result<T> {
    Err(e)
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() {
        return err(Errno::ENOENT);
    }
    if name.len() > NAME_MAX {
        return err(Errno::ENAMETOOLONG);
    }
    if name.contains(&b'/') {
        return err(Errno::EINVAL);
    }
    Ok(())
}

fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

fn kill_priv(perm: u16) -> u16 {
    let mut p = perm & !(libc::S_ISUID as u16);
    if p & libc::S_IXGRP as u16 != 0 {
        p &= !(libc::S_ISGID as u16);
    }
    p
}

fn xattr_name_check(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > XATTR_NAME_MAX {
        return err(Errno::ERANGE);
    }
    let ok = [&b"user."[..], b"trusted.", b"security."]
        .iter()
        .any(|p| name.starts_with(p) && name.len() > p.len());
    if !ok {
        return err(Errno::EOPNOTSUPP);
    }
    Ok(())
}

impl Model {
    fn new(root_uid: u32, root_gid: u32, max_pages: u64, max_inodes: u64) -> Model {
        let mut nodes = BTreeMap::new();
        nodes.insert(
            ROOT_INO,
            MNode {
                body: MBody::Dir(BTreeMap::new()),
                perm: 0o1777,
                uid: root_uid,
                gid: root_gid,
                xattrs: BTreeMap::new(),
                open: 0,
                lookups: 0,
            },
        );
        Model {
            nodes,
            max_pages,
            max_inodes,
        }
    }

    fn node(&self, ino: u64) -> Result<&MNode> {
        self.nodes.get(&ino).ok_or(Errno::ENOENT)
    }

    /// Number of directory entries naming `ino` (directories: 0 or 1).
    fn refs(&self, ino: u64) -> u32 {
        self.nodes
            .values()
            .filter_map(|n| n.entries())
            .map(|e| e.values().filter(|&&i| i == ino).count() as u32)
            .sum()
    }

    /// The directory holding directory `ino` (the root is its own parent).
    fn parent_of(&self, ino: u64) -> Option<u64> {
        if ino == ROOT_INO {
            return Some(ROOT_INO);
        }
        self.nodes
            .iter()
            .find(|(_, n)| n.entries().is_some_and(|e| e.values().any(|&i| i == ino)))
            .map(|(&p, _)| p)
    }

    /// A directory is removed once no entry names it.
    fn removed(&self, ino: u64) -> bool {
        ino != ROOT_INO && self.refs(ino) == 0
    }

    fn nlink(&self, ino: u64) -> u32 {
        let n = &self.nodes[&ino];
        match &n.body {
            MBody::Dir(e) => {
                if self.removed(ino) {
                    0
                } else {
                    2 + e.values().filter(|i| self.nodes[i].is_dir()).count() as u32
                }
            }
            _ => self.refs(ino),
        }
    }

    /// `ino` and its ancestors up to the root.
    fn ancestors(&self, mut ino: u64) -> Vec<u64> {
        let mut v = vec![ino];
        while ino != ROOT_INO {
            match self.parent_of(ino) {
                Some(p) => {
                    ino = p;
                    v.push(p);
                }
                None => break,
            }
        }
        v
    }

    fn used_pages(&self) -> u64 {
        self.nodes
            .values()
            .map(|n| match &n.body {
                MBody::File(f) => f.pages.len() as u64,
                _ => 0,
            })
            .sum()
    }

    fn free_pages(&self) -> u64 {
        self.max_pages - self.used_pages()
    }

    /// Drops nodes nothing refers to any more.
    fn gc(&mut self) {
        let dead: Vec<u64> = self
            .nodes
            .iter()
            .filter(|&(&i, n)| i != ROOT_INO && n.open == 0 && n.lookups == 0 && self.refs(i) == 0)
            .map(|(&i, _)| i)
            .collect();
        for i in dead {
            self.nodes.remove(&i);
        }
    }

    /// Every reachable (path, ino) in a deterministic order.
    fn reachable(&self) -> Vec<(String, u64)> {
        let mut out = vec![("/".to_string(), ROOT_INO)];
        let mut i = 0;
        while i < out.len() {
            let (path, ino) = out[i].clone();
            if let Some(e) = self.nodes[&ino].entries() {
                for (name, &child) in e {
                    let n = String::from_utf8_lossy(name);
                    let p = if path == "/" {
                        format!("/{n}")
                    } else {
                        format!("{path}/{n}")
                    };
                    out.push((p, child));
                }
            }
            i += 1;
        }
        out
    }

    /// Checks shared by every node-creating call (the engine's order).
    fn check_new(&self, parent: u64, name: &[u8]) -> Result<()> {
        check_name(name)?;
        if is_dot(name) {
            return err(Errno::EEXIST);
        }
        let p = self.node(parent)?;
        let e = p.entries().ok_or(Errno::ENOTDIR)?;
        if self.removed(parent) {
            return err(Errno::ENOENT);
        }
        if e.contains_key(name) {
            return err(Errno::EEXIST);
        }
        Ok(())
    }

    fn new_node(&self, ctx: Ctx, parent: u64, mode: u32, body: MBody) -> MNode {
        let dir = &self.nodes[&parent];
        let mut perm = (mode & 0o7777) as u16;
        let sgid = dir.perm & libc::S_ISGID as u16 != 0;
        let gid = if sgid { dir.gid } else { ctx.gid };
        let is_dir = matches!(body, MBody::Dir(_));
        if is_dir && sgid {
            perm |= libc::S_ISGID as u16;
        } else if !is_dir && ctx.uid != 0 && gid != ctx.gid {
            perm &= !(libc::S_ISGID as u16);
        }
        MNode {
            body,
            perm,
            uid: ctx.uid,
            gid,
            xattrs: BTreeMap::new(),
            open: 0,
            lookups: 0,
        }
    }

    /// Validates a creation; the node is inserted once the engine has named it.
    fn make(&self, ctx: Ctx, parent: u64, name: &[u8], mode: u32, body: MBody) -> Result<MNode> {
        self.check_new(parent, name)?;
        if self.nodes.len() as u64 >= self.max_inodes {
            return err(Errno::ENOSPC);
        }
        Ok(self.new_node(ctx, parent, mode, body))
    }

    fn insert(&mut self, parent: u64, name: &[u8], ino: u64, node: MNode) {
        assert!(
            !self.nodes.contains_key(&ino),
            "engine reused live inode {ino}"
        );
        self.nodes.insert(ino, node);
        self.dir_mut(parent).insert(name.to_vec(), ino);
    }

    fn dir_mut(&mut self, ino: u64) -> &mut BTreeMap<Vec<u8>, u64> {
        match &mut self.nodes.get_mut(&ino).unwrap().body {
            MBody::Dir(e) => e,
            _ => panic!("not a dir"),
        }
    }

    fn file_mut(&mut self, ino: u64) -> &mut MFile {
        match &mut self.nodes.get_mut(&ino).unwrap().body {
            MBody::File(f) => f,
            _ => panic!("not a file"),
        }
    }

    fn link(&mut self, ino: u64, parent: u64, name: &[u8]) -> Result<()> {
        check_name(name)?;
        if is_dot(name) {
            return err(Errno::EEXIST);
        }
        let n = self.node(ino)?;
        if n.is_dir() {
            return err(Errno::EPERM);
        }
        let p = self.node(parent)?;
        let e = p.entries().ok_or(Errno::ENOTDIR)?;
        if self.removed(parent) {
            return err(Errno::ENOENT);
        }
        if e.contains_key(name) {
            return err(Errno::EEXIST);
        }
        if self.refs(ino) == 0 {
            return err(Errno::ENOENT);
        }
        self.dir_mut(parent).insert(name.to_vec(), ino);
        Ok(())
    }

    fn remove(&mut self, parent: u64, name: &[u8], want_dir: bool) -> Result<()> {
        check_name(name)?;
        if want_dir && name == b"." {
            return err(Errno::EINVAL);
        }
        if want_dir && name == b".." {
            return err(Errno::ENOTEMPTY);
        }
        if !want_dir && is_dot(name) {
            return err(Errno::EISDIR);
        }
        let p = self.node(parent)?;
        let e = p.entries().ok_or(Errno::ENOTDIR)?;
        let &child = e.get(name).ok_or(Errno::ENOENT)?;
        let c = &self.nodes[&child];
        match (want_dir, c.is_dir()) {
            (true, false) => return err(Errno::ENOTDIR),
            (false, true) => return err(Errno::EISDIR),
            _ => {}
        }
        if want_dir && !c.entries().unwrap().is_empty() {
            return err(Errno::ENOTEMPTY);
        }
        self.dir_mut(parent).remove(name);
        Ok(())
    }

    /// `None` when the model cannot predict the exact errno (a rename touching
    /// a removed directory, whose stale parent chain the engine may walk):
    /// then any error is accepted, and nothing may change.
    fn rename(
        &mut self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
    ) -> Option<Result<()>> {
        let r = (|| {
            check_name(name)?;
            check_name(newname)?;
            if is_dot(name) || is_dot(newname) {
                return err(Errno::EBUSY);
            }
            let src_entries = self.node(parent)?.entries().cloned();
            let dst_entries = self.node(newparent)?.entries().cloned();
            let (Some(se), Some(de)) = (src_entries, dst_entries) else {
                return err(Errno::ENOTDIR);
            };
            let cross = parent != newparent;
            let &sino = se.get(name).ok_or(Errno::ENOENT)?;
            let sdir = self.nodes[&sino].is_dir();
            let target = de.get(newname).copied();
            if cross {
                if sdir && self.ancestors(newparent).contains(&sino) {
                    return err(Errno::EINVAL);
                }
                if flags.exchange
                    && let Some(d) = target
                    && self.nodes[&d].is_dir()
                    && self.ancestors(parent).contains(&d)
                {
                    return err(Errno::EINVAL);
                }
            }
            if self.removed(newparent) {
                return err(Errno::ENOENT);
            }
            if target.is_none() && flags.exchange {
                return err(Errno::ENOENT);
            }
            if let Some(dino) = target {
                if flags.noreplace {
                    return err(Errno::EEXIST);
                }
                if dino == sino {
                    return Ok(());
                }
                let ddir = self.nodes[&dino].is_dir();
                if !flags.exchange {
                    if sdir && !ddir {
                        return err(Errno::ENOTDIR);
                    }
                    if !sdir && ddir {
                        return err(Errno::EISDIR);
                    }
                    if ddir && !self.nodes[&dino].entries().unwrap().is_empty() {
                        return err(Errno::ENOTEMPTY);
                    }
                }
            }
            if flags.exchange {
                let dino = target.unwrap();
                self.dir_mut(parent).insert(name.to_vec(), dino);
                self.dir_mut(newparent).insert(newname.to_vec(), sino);
            } else {
                self.dir_mut(parent).remove(name);
                self.dir_mut(newparent).insert(newname.to_vec(), sino);
            }
            Ok(())
        })();
        let murky = [parent, newparent]
            .iter()
            .any(|&d| self.nodes.get(&d).is_some_and(|n| n.is_dir()) && self.removed(d));
        if murky {
            assert!(
                !matches!(r, Ok(())) || parent == newparent && name == newname,
                "model renamed inside a removed directory"
            );
            return None;
        }
        Some(r)
    }

    fn file_of(&self, ino: u64) -> Result<&MFile> {
        match &self.node(ino)?.body {
            MBody::File(f) => Ok(f),
            MBody::Dir(_) => err(Errno::EISDIR),
            _ => err(Errno::EINVAL),
        }
    }

    /// `lookup`; `None` for `..` of a removed directory (whose stale parent
    /// the model does not track).
    fn lookup(&self, parent: u64, name: &[u8]) -> Option<Result<u64>> {
        if name.len() > NAME_MAX {
            return Some(err(Errno::ENAMETOOLONG));
        }
        let Ok(p) = self.node(parent) else {
            return Some(err(Errno::ENOENT));
        };
        if name == b"." {
            // Any node: how the kernel decodes file handles; a removed one is stale.
            if self.nlink(parent) == 0 {
                return Some(err(Errno::ENOENT));
            }
            return Some(Ok(parent));
        }
        let Some(e) = p.entries() else {
            return Some(err(Errno::ENOTDIR));
        };
        Some(match name {
            b"." => Ok(parent),
            b".." => return self.parent_of(parent).map(Ok),
            _ => e.get(name).copied().ok_or(Errno::ENOENT),
        })
    }

    fn copy_file_range(
        &mut self,
        ctx: Ctx,
        src: u64,
        off_in: u64,
        dst: u64,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        let (s, d) = (self.node(src)?.kind(), self.node(dst)?.kind());
        if s == FileType::Directory || d == FileType::Directory {
            return err(Errno::EISDIR);
        }
        if s != FileType::RegularFile || d != FileType::RegularFile {
            return err(Errno::EINVAL);
        }
        let size_in = self.file_of(src)?.size;
        let len = len.min(size_in.saturating_sub(off_in));
        if src == dst
            && off_in < off_out.saturating_add(len)
            && off_out < off_in.saturating_add(len)
        {
            return err(Errno::EINVAL);
        }
        let data = self.read(src, off_in, len as usize)?;
        if data.is_empty() {
            return Ok(0);
        }
        self.write(ctx, dst, off_out, &data, false)?;
        Ok(data.len() as u64)
    }

    fn read(&self, ino: u64, off: u64, len: usize) -> Result<Vec<u8>> {
        let f = self.file_of(ino)?;
        if off >= f.size {
            return Ok(Vec::new());
        }
        let n = (f.size - off).min(len as u64);
        let mut out = vec![0u8; n as usize];
        for (&o, &b) in f.bytes.range(off..off + n) {
            out[(o - off) as usize] = b;
        }
        Ok(out)
    }

    fn write(&mut self, ctx: Ctx, ino: u64, off: u64, data: &[u8], append: bool) -> Result<usize> {
        let free = self.free_pages();
        let f = self.file_of(ino)?;
        let off = if append { f.size } else { off };
        if data.is_empty() {
            return Ok(0);
        }
        let end = off.checked_add(data.len() as u64).ok_or(Errno::EFBIG)?;
        if end > MAX_FILE_SIZE {
            return err(Errno::EFBIG);
        }
        let missing = (off / P..=(end - 1) / P)
            .filter(|p| !f.pages.contains(p))
            .count() as u64;
        if missing > free {
            return err(Errno::ENOSPC);
        }
        let f = self.file_mut(ino);
        for (i, &b) in data.iter().enumerate() {
            let o = off + i as u64;
            if b == 0 {
                f.bytes.remove(&o);
            } else {
                f.bytes.insert(o, b);
            }
        }
        f.pages.extend(off / P..=(end - 1) / P);
        f.size = f.size.max(end);
        if ctx.uid != 0 {
            let n = self.nodes.get_mut(&ino).unwrap();
            n.perm = kill_priv(n.perm);
        }
        Ok(data.len())
    }

    fn truncate(&mut self, ctx: Ctx, ino: u64, size: u64) -> Result<()> {
        self.file_of(ino)?;
        if size > MAX_FILE_SIZE {
            return err(Errno::EFBIG);
        }
        let f = self.file_mut(ino);
        if size < f.size {
            f.bytes.split_off(&size);
            f.pages.split_off(&size.div_ceil(P));
        }
        f.size = size;
        if ctx.uid != 0 {
            let n = self.nodes.get_mut(&ino).unwrap();
            n.perm = kill_priv(n.perm);
        }
        Ok(())
    }

    fn fallocate(&mut self, ino: u64, off: u64, len: u64, bits: i32) -> Result<()> {
        let known =
            libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
        let keep = bits & libc::FALLOC_FL_KEEP_SIZE != 0;
        let punch = bits & libc::FALLOC_FL_PUNCH_HOLE != 0;
        let zero = bits & libc::FALLOC_FL_ZERO_RANGE != 0;
        if bits & !known != 0 || punch && (!keep || zero) {
            return err(Errno::EOPNOTSUPP);
        }
        if len == 0 {
            return err(Errno::EINVAL);
        }
        let end = off.checked_add(len).ok_or(Errno::EFBIG)?;
        if end > MAX_FILE_SIZE {
            return err(Errno::EFBIG);
        }
        let free = self.free_pages();
        let f = match &self.node(ino)?.body {
            MBody::File(f) => f,
            MBody::Dir(_) => return err(Errno::EISDIR),
            _ => return err(Errno::ENODEV),
        };
        if !punch {
            // Zeroing re-allocates whatever it frees, so only absent pages count.
            let missing = (off / P..=(end - 1) / P)
                .filter(|p| !f.pages.contains(p))
                .count() as u64;
            if missing > free {
                return err(Errno::ENOSPC);
            }
        }
        let f = self.file_mut(ino);
        if punch || zero {
            // Only the part inside the file: nothing beyond EOF holds data.
            let zend = end.min(f.size.max(off));
            let doomed: Vec<u64> = f.bytes.range(off..zend).map(|(&o, _)| o).collect();
            for o in doomed {
                f.bytes.remove(&o);
            }
            if punch {
                let whole: Vec<u64> = f
                    .pages
                    .iter()
                    .copied()
                    .filter(|&p| p * P >= off && (p + 1) * P <= zend)
                    .collect();
                for p in whole {
                    f.pages.remove(&p);
                }
            }
        }
        if !punch {
            f.pages.extend(off / P..=(end - 1) / P);
            if !keep {
                f.size = f.size.max(end);
            }
        }
        Ok(())
    }

    fn setxattr(&mut self, ino: u64, name: &[u8], value: &[u8], mode: XattrMode) -> Result<()> {
        xattr_name_check(name)?;
        let n = self.node(ino)?;
        if name.starts_with(b"user.")
            && !matches!(n.kind(), FileType::RegularFile | FileType::Directory)
        {
            return err(Errno::EPERM);
        }
        if value.len() > XATTR_SIZE_MAX {
            return err(Errno::E2BIG);
        }
        let exists = n.xattrs.contains_key(name);
        match (exists, mode) {
            (true, XattrMode::Create) => return err(Errno::EEXIST),
            (false, XattrMode::Replace) => return err(Errno::ENODATA),
            _ => {}
        }
        let list_len: usize = n.xattrs.keys().map(|k| k.len() + 1).sum();
        if !exists && list_len + name.len() + 1 > XATTR_LIST_MAX {
            return err(Errno::ENOSPC);
        }
        let n = self.nodes.get_mut(&ino).unwrap();
        n.xattrs.insert(name.to_vec(), value.to_vec());
        Ok(())
    }

    fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        xattr_name_check(name)?;
        self.node(ino)?
            .xattrs
            .get(name)
            .cloned()
            .ok_or(Errno::ENODATA)
    }

    fn removexattr(&mut self, ino: u64, name: &[u8]) -> Result<()> {
        xattr_name_check(name)?;
        self.node(ino)?;
        let n = self.nodes.get_mut(&ino).unwrap();
        n.xattrs.remove(name).map(|_| ()).ok_or(Errno::ENODATA)
    }

    fn chmod(&mut self, _ctx: Ctx, ino: u64, mode: u32) -> Result<()> {
        let n = self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
        n.perm = (mode & 0o7777) as u16;
        Ok(())
    }

    fn chown(&mut self, _ctx: Ctx, ino: u64, uid: Option<u32>, gid: Option<u32>) -> Result<()> {
        let n = self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
        if uid.is_none() && gid.is_none() {
            return Ok(());
        }
        if let Some(u) = uid {
            n.uid = u;
        }
        if let Some(g) = gid {
            n.gid = g;
        }
        // Linux kills privileges on every chown of a non-directory, by root
        // too and to the same owner (generic/193).
        if !n.is_dir() {
            n.perm = kill_priv(n.perm);
        }
        Ok(())
    }
}

// ---- operations ------------------------------------------------------------------

/// Picks a node at run time from what exists then (strategies cannot see state).
#[derive(Clone, Copy, Debug)]
enum Sel {
    /// A reachable directory.
    Dir(u8),
    /// Any reachable node.
    Any(u8),
    /// A node held open (possibly unlinked), else any reachable node.
    Handle(u8),
    /// A reachable regular file, else any reachable node.
    File(u8),
    /// An inode number that does not exist.
    Stale,
}

/// Contents to write: cheap to generate, with zero bytes so the model's
/// "non-zero bytes only" representation is exercised.
#[derive(Clone, Copy, Debug)]
struct Pattern {
    len: u32,
    seed: u8,
}

impl Pattern {
    fn bytes(self) -> Vec<u8> {
        (0..self.len)
            .map(|i| {
                if (i + self.seed as u32).is_multiple_of(5) {
                    0
                } else {
                    self.seed.wrapping_add(i as u8).wrapping_mul(31) | 1
                }
            })
            .collect()
    }
}

#[derive(Clone, Debug)]
enum Op {
    Create {
        user: bool,
        parent: Sel,
        name: Name,
        mode: u32,
        excl: bool,
        keep_open: bool,
    },
    Mkdir {
        user: bool,
        parent: Sel,
        name: Name,
        mode: u32,
    },
    Symlink {
        parent: Sel,
        name: Name,
        target: u8,
    },
    Mknod {
        parent: Sel,
        name: Name,
        kind: u8,
        rdev: u32,
    },
    Link {
        src: Sel,
        parent: Sel,
        name: Name,
    },
    Unlink {
        parent: Sel,
        name: Name,
    },
    Rmdir {
        parent: Sel,
        name: Name,
    },
    Rename {
        parent: Sel,
        name: Name,
        newparent: Sel,
        newname: Name,
        flags: u8,
    },
    Open {
        target: Sel,
        rdonly: bool,
    },
    Close {
        handle: u8,
    },
    Write {
        user: bool,
        target: Sel,
        off: u64,
        data: Pattern,
        append: bool,
    },
    Read {
        target: Sel,
        off: u64,
        len: u32,
    },
    Truncate {
        user: bool,
        target: Sel,
        size: u64,
    },
    Fallocate {
        target: Sel,
        off: u64,
        len: u64,
        bits: i32,
    },
    SetXattr {
        target: Sel,
        name: u8,
        value: Pattern,
        mode: u8,
    },
    GetXattr {
        target: Sel,
        name: u8,
    },
    RemoveXattr {
        target: Sel,
        name: u8,
    },
    Chmod {
        user: bool,
        target: Sel,
        mode: u32,
    },
    Chown {
        user: bool,
        target: Sel,
        uid: Option<u32>,
        gid: Option<u32>,
    },
    Readdir {
        target: Sel,
        chunk: u8,
    },
    /// A kernel lookup: takes a reference that keeps the node alive.
    Lookup {
        parent: Sel,
        name: Name,
    },
    /// Drops one of the references taken by `Lookup`.
    Forget {
        which: u8,
    },
    CopyFileRange {
        user: bool,
        src: Sel,
        off_in: u64,
        dst: Sel,
        off_out: u64,
        len: u64,
    },
}

/// A name: one of a few fixed ones (including invalid ones), or whichever
/// entry the directory has at run time (so removals and renames hit often).
#[derive(Clone, Copy, Debug)]
enum Name {
    Fixed(u8),
    Existing(u8),
}

fn name_of(i: u8) -> Vec<u8> {
    match i {
        0..=4 => vec![b'a' + i],
        5 => b".".to_vec(),
        6 => b"..".to_vec(),
        7 => Vec::new(),
        8 => vec![b'n'; NAME_MAX + 1],
        9 => b"x/y".to_vec(),
        _ => vec![b'n'; NAME_MAX],
    }
}

fn xattr_name_of(i: u8) -> Vec<u8> {
    match i {
        0 => b"user.a".to_vec(),
        1 => b"user.b".to_vec(),
        2 => b"trusted.t".to_vec(),
        3 => b"security.s".to_vec(),
        4 => b"user.".to_vec(),
        5 => b"other.x".to_vec(),
        6 => Vec::new(),
        _ => {
            let mut v = b"user.".to_vec();
            v.resize(XATTR_NAME_MAX + 1, b'x');
            v
        }
    }
}

fn symlink_target_of(i: u8) -> Vec<u8> {
    match i {
        0 => b"a".to_vec(),
        1 => b"../b/c".to_vec(),
        2 => b"/abs/path".to_vec(),
        3 => Vec::new(),
        4 => vec![b't'; SYMLINK_MAX],
        _ => vec![b't'; SYMLINK_MAX + 1],
    }
}

fn sel() -> impl Strategy<Value = Sel> {
    prop_oneof![
        6 => any::<u8>().prop_map(Sel::Dir),
        3 => any::<u8>().prop_map(Sel::Any),
        2 => any::<u8>().prop_map(Sel::Handle),
        1 => Just(Sel::Stale),
    ]
}

fn file_sel() -> impl Strategy<Value = Sel> {
    prop_oneof![
        8 => any::<u8>().prop_map(Sel::File),
        2 => any::<u8>().prop_map(Sel::Any),
        3 => any::<u8>().prop_map(Sel::Handle),
        1 => any::<u8>().prop_map(Sel::Dir),
        1 => Just(Sel::Stale),
    ]
}

fn name() -> impl Strategy<Value = Name> {
    prop_oneof![
        24 => (0u8..5).prop_map(Name::Fixed),
        1 => (5u8..11).prop_map(Name::Fixed),
        12 => any::<u8>().prop_map(Name::Existing),
    ]
}

/// Parents: mostly directories, so that the operation itself gets tested.
fn dir_sel() -> impl Strategy<Value = Sel> {
    prop_oneof![
        16 => any::<u8>().prop_map(Sel::Dir),
        1 => any::<u8>().prop_map(Sel::Any),
        1 => any::<u8>().prop_map(Sel::Handle),
        1 => Just(Sel::Stale),
    ]
}

fn offset() -> impl Strategy<Value = u64> {
    prop_oneof![
        8 => 0..3 * P,
        3 => (P - 3)..(P + 3),
        // Small files live inline up to INLINE_MAX: cross it both ways.
        3 => (INLINE_MAX as u64 - 3)..(INLINE_MAX as u64 + 3),
        2 => (1u64 << 20)..(1u64 << 20) + 2 * P,
        1 => (1u64 << 40)..(1u64 << 40) + P,
        1 => (MAX_FILE_SIZE - 2 * P)..=MAX_FILE_SIZE,
    ]
}

fn pattern(max: u32) -> impl Strategy<Value = Pattern> {
    (
        prop_oneof![
            8 => 0..300u32,
            2 => Just(PAGE_SIZE as u32),
            2 => (INLINE_MAX as u32 - 2)..(INLINE_MAX as u32 + 2),
            1 => 0..=max
        ],
        any::<u8>(),
    )
        .prop_map(|(len, seed)| Pattern { len, seed })
}

fn mode() -> impl Strategy<Value = u32> {
    prop::sample::select(vec![0o644, 0o755, 0o2755, 0o4755, 0o6775, 0o2644, 0o1777])
}

fn id() -> impl Strategy<Value = u32> {
    prop::sample::select(vec![0u32, 1000, 2000])
}

fn fallocate_bits() -> impl Strategy<Value = i32> {
    let valid = prop::sample::select(vec![
        0,
        libc::FALLOC_FL_KEEP_SIZE,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        libc::FALLOC_FL_ZERO_RANGE,
        libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
    ]);
    let invalid = prop::sample::select(vec![
        libc::FALLOC_FL_PUNCH_HOLE,
        libc::FALLOC_FL_COLLAPSE_RANGE,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
    ]);
    prop_oneof![8 => valid, 1 => invalid]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<bool>(), dir_sel(), name(), mode(), any::<bool>(), prop::bool::weighted(0.3)).prop_map(
            |(user, parent, name, mode, excl, keep_open)| Op::Create { user, parent, name, mode, excl, keep_open }
        ),
        5 => (any::<bool>(), dir_sel(), name(), mode()).prop_map(|(user, parent, name, mode)| Op::Mkdir { user, parent, name, mode }),
        1 => (dir_sel(), name(), 0u8..6).prop_map(|(parent, name, target)| Op::Symlink { parent, name, target }),
        1 => (dir_sel(), name(), 0u8..4, 0u32..300).prop_map(|(parent, name, kind, rdev)| Op::Mknod { parent, name, kind, rdev }),
        3 => (file_sel(), dir_sel(), name()).prop_map(|(src, parent, name)| Op::Link { src, parent, name }),
        4 => (dir_sel(), name()).prop_map(|(parent, name)| Op::Unlink { parent, name }),
        3 => (dir_sel(), name()).prop_map(|(parent, name)| Op::Rmdir { parent, name }),
        8 => (dir_sel(), name(), dir_sel(), name(), 0u8..4).prop_map(|(parent, name, newparent, newname, flags)| Op::Rename { parent, name, newparent, newname, flags }),
        2 => (file_sel(), any::<bool>()).prop_map(|(target, rdonly)| Op::Open { target, rdonly }),
        2 => any::<u8>().prop_map(|handle| Op::Close { handle }),
        8 => (any::<bool>(), file_sel(), offset(), pattern(3 * PAGE_SIZE as u32), prop::bool::weighted(0.15)).prop_map(
            |(user, target, off, data, append)| Op::Write { user, target, off, data, append }
        ),
        3 => (file_sel(), offset(), 0u32..(3 * PAGE_SIZE as u32)).prop_map(|(target, off, len)| Op::Read { target, off, len }),
        3 => (any::<bool>(), file_sel(), prop_oneof![10 => offset(), 1 => Just(u64::MAX)]).prop_map(|(user, target, size)| Op::Truncate { user, target, size }),
        4 => (file_sel(), offset(), prop_oneof![20 => 1..3 * P, 1 => Just(0u64), 1 => Just(u64::MAX)], fallocate_bits()).prop_map(|(target, off, len, bits)| Op::Fallocate { target, off, len, bits }),
        3 => (file_sel(), prop_oneof![6 => 0u8..4, 1 => 4u8..8], pattern(XATTR_SIZE_MAX as u32 + 1), 0u8..3).prop_map(
            |(target, name, value, mode)| Op::SetXattr { target, name, value, mode }
        ),
        2 => (file_sel(), prop_oneof![6 => 0u8..4, 1 => 4u8..8]).prop_map(|(target, name)| Op::GetXattr { target, name }),
        2 => (file_sel(), prop_oneof![6 => 0u8..4, 1 => 4u8..8]).prop_map(|(target, name)| Op::RemoveXattr { target, name }),
        2 => (any::<bool>(), file_sel(), mode()).prop_map(|(user, target, mode)| Op::Chmod { user, target, mode }),
        2 => (any::<bool>(), file_sel(), prop::option::of(id()), prop::option::of(id())).prop_map(
            |(user, target, uid, gid)| Op::Chown { user, target, uid, gid }
        ),
        2 => (sel(), 1u8..5).prop_map(|(target, chunk)| Op::Readdir { target, chunk }),
        3 => (dir_sel(), prop_oneof![8 => name(), 1 => Just(Name::Fixed(6)), 1 => Just(Name::Fixed(5))])
            .prop_map(|(parent, name)| Op::Lookup { parent, name }),
        2 => any::<u8>().prop_map(|which| Op::Forget { which }),
        3 => (any::<bool>(), file_sel(), offset(), file_sel(), offset(), 0..3 * P).prop_map(
            |(user, src, off_in, dst, off_out, len)| Op::CopyFileRange { user, src, off_in, dst, off_out, len }
        ),
    ]
}

// ---- running both side by side ---------------------------------------------------

/// Outcome counts per operation, printed with `MODEL_STATS=1` to show that the
/// generator reaches the interesting errors (a model test that only ever
/// sees ENOENT proves little).
static STATS: std::sync::Mutex<BTreeMap<(&str, &str), u64>> =
    std::sync::Mutex::new(BTreeMap::new());

fn note<T>(what: &'static str, r: &Result<T>) {
    let outcome = match r {
        Ok(_) => "ok",
        Err(e) => e.name(),
    };
    *STATS.lock().unwrap().entry((what, outcome)).or_default() += 1;
}

fn print_stats() {
    if std::env::var_os("MODEL_STATS").is_some() {
        let s = STATS.lock().unwrap();
        let mut line = String::new();
        let mut last = "";
        for ((what, outcome), n) in s.iter() {
            if *what != last {
                line.push_str(&format!("\n{what:>12}:"));
                last = what;
            }
            line.push_str(&format!(" {outcome}={n}"));
        }
        eprintln!("model outcomes:{line}");
    }
}

struct Harness {
    fs: Fs,
    m: Model,
    /// Inodes held open, one entry per handle.
    handles: Vec<u64>,
    /// Kernel references taken by `Lookup`, one entry per reference.
    lookups: Vec<u64>,
}

fn ctx(user: bool) -> Ctx {
    if user { USER } else { Ctx::ROOT }
}

impl Harness {
    fn new(max_pages: u64, max_inodes: u64) -> Harness {
        let fs = Fs::new(Config {
            capacity: max_pages * P,
            max_inodes,
        });
        let root = fs.getattr(ROOT_INO).unwrap();
        Harness {
            fs,
            m: Model::new(root.uid, root.gid, max_pages, max_inodes),
            handles: Vec::new(),
            lookups: Vec::new(),
        }
    }

    fn pick(&self, s: Sel) -> u64 {
        let all = self.m.reachable();
        match s {
            Sel::Stale => STALE,
            Sel::Handle(i) if !self.handles.is_empty() => {
                self.handles[i as usize % self.handles.len()]
            }
            Sel::Dir(i) => {
                let dirs: Vec<u64> = all
                    .iter()
                    .map(|&(_, ino)| ino)
                    .filter(|i| self.m.nodes[i].is_dir())
                    .collect();
                dirs[i as usize % dirs.len()]
            }
            Sel::File(i) => {
                let files: Vec<u64> = all
                    .iter()
                    .map(|&(_, ino)| ino)
                    .filter(|i| matches!(self.m.nodes[i].body, MBody::File(_)))
                    .collect();
                if files.is_empty() {
                    all[i as usize % all.len()].1
                } else {
                    files[i as usize % files.len()]
                }
            }
            Sel::Any(i) | Sel::Handle(i) => all[i as usize % all.len()].1,
        }
    }

    fn name_in(&self, dir: u64, n: Name) -> Vec<u8> {
        match n {
            Name::Fixed(i) => name_of(i),
            Name::Existing(i) => match self.m.nodes.get(&dir).and_then(|d| d.entries()) {
                Some(e) if !e.is_empty() => e.keys().nth(i as usize % e.len()).unwrap().clone(),
                _ => name_of(i % 5),
            },
        }
    }

    /// Compares a creation's outcome and records the new node in the model.
    fn created(
        &mut self,
        what: &'static str,
        parent: u64,
        name: &[u8],
        want: Result<MNode>,
        got: Result<Attr>,
    ) -> Option<u64> {
        note(what, &got);
        match (want, got) {
            (Ok(node), Ok(attr)) => {
                assert_eq!(attr.kind, node.kind(), "{what}: kind");
                assert_eq!(attr.perm, node.perm, "{what}: perm");
                assert_eq!((attr.uid, attr.gid), (node.uid, node.gid), "{what}: owner");
                self.m.insert(parent, name, attr.ino, node);
                Some(attr.ino)
            }
            (Err(e), Err(g)) => {
                assert_eq!(g, e, "{what}: errno");
                None
            }
            (w, g) => panic!(
                "{what}: model {:?} engine {:?}",
                w.map(|_| ()),
                g.map(|a| a.ino)
            ),
        }
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Create {
                user,
                parent,
                name,
                mode,
                excl,
                keep_open,
            } => {
                let (p, n, c) = (
                    self.pick(parent),
                    self.name_in(self.pick(parent), name),
                    ctx(user),
                );
                let got = self.fs.create(c, p, &n, mode, excl);
                let want = self.m.make(
                    c,
                    p,
                    &n,
                    libc::S_IFREG | mode,
                    MBody::File(MFile::default()),
                );
                let existing = self.m.nodes.get(&p).and_then(|d| d.entries()?.get(&n));
                if let (Err(Errno::EEXIST), false, false, Some(&ino)) =
                    (&want, excl, is_dot(&n), existing)
                {
                    // Opens the existing node instead.
                    if self.m.nodes[&ino].is_dir() {
                        assert_eq!(got.map(|_| ()), Err(Errno::EISDIR), "create over a dir");
                        return;
                    }
                    let (attr, created) = got.expect("create of an existing name");
                    assert!(!created);
                    assert_eq!(attr.ino, ino);
                    self.fs.forget(ino, 1);
                    self.m.nodes.get_mut(&ino).unwrap().open += 1;
                    self.handles.push(ino);
                    return;
                }
                let got_attr = got.map(|(a, created)| {
                    assert!(created);
                    a
                });
                if let Some(ino) = self.created("create", p, &n, want, got_attr) {
                    self.fs.forget(ino, 1);
                    if keep_open {
                        self.m.nodes.get_mut(&ino).unwrap().open += 1;
                        self.handles.push(ino);
                    } else {
                        self.fs.release(ino);
                    }
                }
            }
            Op::Mkdir {
                user,
                parent,
                name,
                mode,
            } => {
                let (p, n, c) = (
                    self.pick(parent),
                    self.name_in(self.pick(parent), name),
                    ctx(user),
                );
                let got = self.fs.mkdir(c, p, &n, mode);
                let want = self.m.make(c, p, &n, mode, MBody::Dir(BTreeMap::new()));
                if let Some(ino) = self.created("mkdir", p, &n, want, got) {
                    self.fs.forget(ino, 1);
                }
            }
            Op::Symlink {
                parent,
                name,
                target,
            } => {
                let (p, n, t) = (
                    self.pick(parent),
                    self.name_in(self.pick(parent), name),
                    symlink_target_of(target),
                );
                let got = self.fs.symlink(Ctx::ROOT, p, &n, &t);
                let want = if t.is_empty() {
                    err(Errno::ENOENT)
                } else if t.len() > SYMLINK_MAX {
                    err(Errno::ENAMETOOLONG)
                } else {
                    self.m
                        .make(Ctx::ROOT, p, &n, 0o777, MBody::Symlink(t.clone()))
                };
                if let Some(ino) = self.created("symlink", p, &n, want, got) {
                    self.fs.forget(ino, 1);
                }
            }
            Op::Mknod {
                parent,
                name,
                kind,
                rdev,
            } => {
                let p = self.pick(parent);
                let n = self.name_in(p, name);
                let (fmt, kind) = [
                    (libc::S_IFIFO, FileType::NamedPipe),
                    (libc::S_IFSOCK, FileType::Socket),
                    (libc::S_IFCHR, FileType::CharDevice),
                    (libc::S_IFBLK, FileType::BlockDevice),
                ][kind as usize];
                let got = self.fs.mknod(Ctx::ROOT, p, &n, fmt | 0o640, rdev);
                let rdev = if matches!(kind, FileType::CharDevice | FileType::BlockDevice) {
                    rdev
                } else {
                    0
                };
                let want = self
                    .m
                    .make(Ctx::ROOT, p, &n, 0o640, MBody::Special(kind, rdev));
                if let Some(ino) = self.created("mknod", p, &n, want, got) {
                    self.fs.forget(ino, 1);
                }
            }
            Op::Link { src, parent, name } => {
                let (s, p) = (self.pick(src), self.pick(parent));
                let n = self.name_in(p, name);
                let got = self.fs.link(s, p, &n);
                let want = self.m.link(s, p, &n);
                note("link", &got);
                assert_eq!(got.map(|a| a.ino), want.map(|_| s), "link");
                if got.is_ok() {
                    self.fs.forget(s, 1);
                }
            }
            Op::Unlink { parent, name } => {
                let p = self.pick(parent);
                let n = self.name_in(p, name);
                let got = self.fs.unlink(p, &n);
                note("unlink", &got);
                assert_eq!(got, self.m.remove(p, &n, false), "unlink");
            }
            Op::Rmdir { parent, name } => {
                let p = self.pick(parent);
                let n = self.name_in(p, name);
                let got = self.fs.rmdir(p, &n);
                note("rmdir", &got);
                assert_eq!(got, self.m.remove(p, &n, true), "rmdir");
            }
            Op::Rename {
                parent,
                name,
                newparent,
                newname,
                flags,
            } => {
                let p = self.pick(parent);
                let n = self.name_in(p, name);
                let np = self.pick(newparent);
                let nn = self.name_in(np, newname);
                let bits = [
                    0,
                    libc::RENAME_NOREPLACE,
                    libc::RENAME_EXCHANGE,
                    libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE,
                ][flags as usize];
                let Ok(fl) = RenameFlags::from_bits(bits) else {
                    assert_eq!(flags, 3, "only the conflicting pair is invalid");
                    return;
                };
                let got = self.fs.rename(p, &n, np, &nn, fl);
                match self.m.rename(p, &n, np, &nn, fl) {
                    Some(want) => {
                        note("rename", &got);
                        assert_eq!(got, want, "rename")
                    }
                    None => assert!(got.is_err(), "rename in a removed directory succeeded"),
                }
            }
            Op::Open { target, rdonly } => {
                let t = self.pick(target);
                let flags = if rdonly { libc::O_RDONLY } else { libc::O_RDWR };
                let got = self.fs.open(t, flags);
                let want = match self.m.nodes.get(&t) {
                    None => err(Errno::ENOENT),
                    Some(n) if n.is_dir() && !rdonly => err(Errno::EISDIR),
                    Some(_) => Ok(()),
                };
                note("open", &got);
                assert_eq!(got, want, "open");
                if got.is_ok() {
                    self.m.nodes.get_mut(&t).unwrap().open += 1;
                    self.handles.push(t);
                }
            }
            Op::Close { handle } => {
                if self.handles.is_empty() {
                    return;
                }
                let ino = self
                    .handles
                    .swap_remove(handle as usize % self.handles.len());
                self.fs.release(ino);
                self.m.nodes.get_mut(&ino).unwrap().open -= 1;
            }
            Op::Write {
                user,
                target,
                off,
                data,
                append,
            } => {
                let (t, c, data) = (self.pick(target), ctx(user), data.bytes());
                let got = self.fs.write(c, t, off, &data, append);
                let want = self.m.write(c, t, off, &data, append);
                note("write", &got);
                assert_eq!(got, want, "write {} bytes at {off}", data.len());
            }
            Op::Read { target, off, len } => {
                let t = self.pick(target);
                let mut buf = vec![0xAA; len as usize];
                let got = self.fs.read(t, off, &mut buf).map(|n| {
                    buf.truncate(n);
                    buf
                });
                note("read", &got);
                assert_eq!(got, self.m.read(t, off, len as usize), "read");
            }
            Op::Truncate { user, target, size } => {
                let (t, c) = (self.pick(target), ctx(user));
                let set = SetAttr {
                    size: Some(size),
                    ..Default::default()
                };
                let got = self.fs.setattr(c, t, &set).map(|_| ());
                note("truncate", &got);
                assert_eq!(got, self.m.truncate(c, t, size), "truncate to {size}");
            }
            Op::Fallocate {
                target,
                off,
                len,
                bits,
            } => {
                let t = self.pick(target);
                let got =
                    FallocateMode::from_bits(bits).and_then(|m| self.fs.fallocate(t, off, len, m));
                let want = self.m.fallocate(t, off, len, bits);
                note("fallocate", &got);
                assert_eq!(got, want, "fallocate {bits:#x} {off}+{len}");
            }
            Op::SetXattr {
                target,
                name,
                value,
                mode,
            } => {
                let (t, n, v) = (self.pick(target), xattr_name_of(name), value.bytes());
                let mode = [XattrMode::Any, XattrMode::Create, XattrMode::Replace][mode as usize];
                let got = self.fs.setxattr(t, &n, &v, mode);
                note("setxattr", &got);
                assert_eq!(got, self.m.setxattr(t, &n, &v, mode), "setxattr");
            }
            Op::GetXattr { target, name } => {
                let (t, n) = (self.pick(target), xattr_name_of(name));
                let got = self.fs.getxattr(t, &n);
                note("getxattr", &got);
                assert_eq!(got, self.m.getxattr(t, &n), "getxattr");
            }
            Op::RemoveXattr { target, name } => {
                let (t, n) = (self.pick(target), xattr_name_of(name));
                let got = self.fs.removexattr(t, &n);
                note("removexattr", &got);
                assert_eq!(got, self.m.removexattr(t, &n), "removexattr");
            }
            Op::Chmod { user, target, mode } => {
                let (t, c) = (self.pick(target), ctx(user));
                let set = SetAttr {
                    mode: Some(mode),
                    ..Default::default()
                };
                let got = self.fs.setattr(c, t, &set).map(|_| ());
                note("chmod", &got);
                assert_eq!(got, self.m.chmod(c, t, mode), "chmod");
            }
            Op::Chown {
                user,
                target,
                uid,
                gid,
            } => {
                let (t, c) = (self.pick(target), ctx(user));
                let set = SetAttr {
                    uid,
                    gid,
                    ..Default::default()
                };
                let got = self.fs.setattr(c, t, &set).map(|_| ());
                note("chown", &got);
                assert_eq!(got, self.m.chown(c, t, uid, gid), "chown");
            }
            Op::Lookup { parent, name } => {
                let p = self.pick(parent);
                let n = self.name_in(p, name);
                let got = self.fs.lookup(p, &n).map(|a| a.ino);
                note("lookup", &got);
                if let Some(want) = self.m.lookup(p, &n) {
                    assert_eq!(got, want, "lookup");
                }
                if let Ok(ino) = got {
                    if ino == ROOT_INO {
                        // The kernel never forgets the root; neither does the engine count it.
                        self.fs.forget(ino, 1);
                    } else {
                        self.m.nodes.get_mut(&ino).unwrap().lookups += 1;
                        self.lookups.push(ino);
                    }
                }
            }
            Op::Forget { which } => {
                if self.lookups.is_empty() {
                    return;
                }
                let ino = self
                    .lookups
                    .swap_remove(which as usize % self.lookups.len());
                self.fs.forget(ino, 1);
                self.m.nodes.get_mut(&ino).unwrap().lookups -= 1;
            }
            Op::CopyFileRange {
                user,
                src,
                off_in,
                dst,
                off_out,
                len,
            } => {
                let (s, d, c) = (self.pick(src), self.pick(dst), ctx(user));
                let got = self.fs.copy_file_range(c, s, off_in, d, off_out, len);
                note("copy_range", &got);
                let want = self.m.copy_file_range(c, s, off_in, d, off_out, len);
                assert_eq!(got, want, "copy_file_range {off_in}+{len} -> {off_out}");
            }
            Op::Readdir { target, chunk } => {
                let t = self.pick(target);
                let got = self.list(t, chunk as usize);
                match self.m.nodes.get(&t) {
                    None => assert_eq!(got.map(|_| ()), Err(Errno::ENOENT)),
                    Some(n) if !n.is_dir() => assert_eq!(got.map(|_| ()), Err(Errno::ENOTDIR)),
                    Some(_) => self.check_listing(t, got.expect("readdir")),
                }
            }
        }
        self.m.gc();
        self.check_all();
    }

    /// Lists a directory `chunk` entries per call, resuming from the last offset.
    fn list(&self, ino: u64, chunk: usize) -> Result<Vec<(Vec<u8>, u64, FileType)>> {
        let mut out = Vec::new();
        let mut off = 0;
        loop {
            let mut got = 0;
            self.fs.readdir(ino, off, |e| {
                if got == chunk {
                    return false;
                }
                out.push((e.name.to_vec(), e.ino, e.kind));
                off = e.offset;
                got += 1;
                true
            })?;
            if got < chunk {
                return Ok(out);
            }
        }
    }

    fn check_listing(&self, dir: u64, got: Vec<(Vec<u8>, u64, FileType)>) {
        assert!(got.len() >= 2, "no . and ..");
        assert_eq!((&got[0].0[..], got[0].1), (&b"."[..], dir), ". entry");
        assert_eq!(&got[1].0[..], b"..");
        if let Some(p) = self.m.parent_of(dir) {
            assert_eq!(got[1].1, p, ".. of {dir}");
        }
        let mut seen = BTreeMap::new();
        for (name, ino, kind) in &got[2..] {
            assert_eq!(*kind, self.m.nodes[ino].kind(), "readdir kind");
            assert!(
                seen.insert(name.clone(), *ino).is_none(),
                "{} listed twice",
                String::from_utf8_lossy(name)
            );
        }
        assert_eq!(
            &seen,
            self.m.nodes[&dir].entries().unwrap(),
            "listing of {dir}"
        );
    }

    /// Compares the whole tree, open nodes and the accounting.
    fn check_all(&self) {
        let reach = self.m.reachable();
        for (path, ino) in &reach {
            let n = &self.m.nodes[ino];
            if n.is_dir() {
                let got = self.list(*ino, usize::MAX).expect("readdir");
                self.check_listing(*ino, got);
                for (name, &child) in n.entries().unwrap() {
                    let a = self.fs.lookup_noref(*ino, name).expect("lookup");
                    assert_eq!(a.ino, child, "lookup {path}/{name:?}");
                }
            }
            self.check_node(path, *ino);
        }
        for &h in self.handles.iter().chain(&self.lookups) {
            self.check_node("<held>", h);
        }
        assert_eq!(
            self.fs.inode_count(),
            self.m.nodes.len(),
            "inode table size (leak or early free)"
        );
        let s = self.fs.statfs();
        assert_eq!(s.blocks, self.m.max_pages);
        assert_eq!(s.bfree, self.m.free_pages(), "statfs free pages");
        assert_eq!(s.files, self.m.max_inodes);
        assert_eq!(
            s.ffree,
            self.m.max_inodes - self.m.nodes.len() as u64,
            "statfs free inodes"
        );
    }

    fn check_node(&self, path: &str, ino: u64) {
        let n = &self.m.nodes[&ino];
        let a = self.fs.getattr(ino).expect("getattr");
        assert_eq!(a.kind, n.kind(), "{path}: kind");
        assert_eq!(a.perm, n.perm, "{path}: perm {:o} vs {:o}", a.perm, n.perm);
        assert_eq!((a.uid, a.gid), (n.uid, n.gid), "{path}: owner");
        assert_eq!(a.nlink, self.m.nlink(ino), "{path}: nlink");
        let mut xs: Vec<Vec<u8>> = self
            .fs
            .listxattr(ino)
            .unwrap()
            .split(|&b| b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| s.to_vec())
            .collect();
        xs.sort();
        assert_eq!(
            xs,
            n.xattrs.keys().cloned().collect::<Vec<_>>(),
            "{path}: xattr names"
        );
        for (k, v) in &n.xattrs {
            assert_eq!(&self.fs.getxattr(ino, k).unwrap(), v, "{path}: xattr value");
        }
        match &n.body {
            MBody::File(f) => {
                assert_eq!(a.size, f.size, "{path}: size");
                assert_eq!(a.blocks, f.pages.len() as u64 * (P / 512), "{path}: blocks");
                self.check_data(path, ino, f);
            }
            MBody::Symlink(t) => {
                assert_eq!(a.size, t.len() as u64);
                assert_eq!(&self.fs.readlink(ino).unwrap(), t, "{path}: target");
            }
            MBody::Special(_, rdev) => assert_eq!(a.rdev, *rdev, "{path}: rdev"),
            MBody::Dir(_) => {}
        }
    }

    /// Walks the data segments with SEEK_DATA/SEEK_HOLE; they must be exactly
    /// the allocated pages inside the size, and hold exactly the model's bytes.
    fn check_data(&self, path: &str, ino: u64, f: &MFile) {
        let mut want = Vec::new();
        for &p in &f.pages {
            let (s, e) = (p * P, ((p + 1) * P).min(f.size));
            if s >= f.size {
                continue;
            }
            match want.last_mut() {
                Some((_, end)) if *end == s => *end = e,
                _ => want.push((s, e)),
            }
        }
        let mut got = Vec::new();
        let mut pos = 0;
        while pos < f.size {
            let d = match self.fs.lseek(ino, pos, libc::SEEK_DATA) {
                Ok(d) => d,
                Err(e) => {
                    assert_eq!(e, Errno::ENXIO, "{path}: SEEK_DATA");
                    break;
                }
            };
            let h = self.fs.lseek(ino, d, libc::SEEK_HOLE).expect("SEEK_HOLE");
            assert!(h > d && h <= f.size, "{path}: SEEK_HOLE {h} after {d}");
            got.push((d, h));
            pos = h;
        }
        assert_eq!(got, want, "{path}: data segments");
        for o in f.bytes.keys() {
            assert!(f.pages.contains(&(o / P)), "model: byte outside a page");
        }
        for (s, e) in got {
            let mut buf = vec![0xAA; (e - s) as usize];
            assert_eq!(self.fs.read(ino, s, &mut buf), Ok(buf.len()));
            let mut expect = vec![0u8; buf.len()];
            for (&o, &b) in f.bytes.range(s..e) {
                expect[(o - s) as usize] = b;
            }
            assert!(buf == expect, "{path}: contents of [{s}, {e}) differ");
        }
    }

    /// Closes every handle: then exactly the reachable nodes remain.
    fn finish(&mut self) {
        for ino in std::mem::take(&mut self.handles) {
            self.fs.release(ino);
            self.m.nodes.get_mut(&ino).unwrap().open -= 1;
        }
        for ino in std::mem::take(&mut self.lookups) {
            self.fs.forget(ino, 1);
            self.m.nodes.get_mut(&ino).unwrap().lookups -= 1;
        }
        self.m.gc();
        self.check_all();
        print_stats();
        let distinct: BTreeSet<u64> = self.m.reachable().iter().map(|&(_, i)| i).collect();
        assert_eq!(self.fs.inode_count(), distinct.len());
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 4096,
        ..ProptestConfig::default()
    })]

    /// Roomy limits: the semantics of every operation.
    #[test]
    fn engine_matches_model(ops in prop::collection::vec(op(), 1..200)) {
        let mut h = Harness::new(1 << 20, 1 << 20);
        for op in &ops {
            h.step(op);
        }
        h.finish();
    }

    /// Tight limits: ENOSPC for pages and inodes, and that failures change nothing.
    #[test]
    fn engine_matches_model_when_full(
        ops in prop::collection::vec(op(), 1..200),
        pages in 4u64..40,
        inodes in 3u64..14,
    ) {
        let mut h = Harness::new(pages, inodes);
        for op in &ops {
            h.step(op);
        }
        h.finish();
    }
}
