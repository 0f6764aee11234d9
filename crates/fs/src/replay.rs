//! Applying recorded mutations and checkpoint images to a file system that
//! is being rebuilt (recovery, rollback). Nothing else runs on it meanwhile.
//! Public so that `memfs-durable` can rebuild an `Fs` from its journal and
//! images (with `nodes.rs`); the engine itself reads no records.
//!
//! Every step overwrites whole cells (a node's attributes, one directory
//! entry, a byte range, one xattr) with values carried by the record, and
//! never reads the state it replaces. So replaying commits `C+1..=R` onto an
//! image copied while commits up to `R` ran (a fuzzy checkpoint) ends in
//! exactly the state after `R`: each cell holds the value of the last record
//! that wrote it, or, if none did, the value it had at `C`, which the image
//! copied unchanged. Capacity limits are not enforced here: what was
//! accepted once is recovered even under a smaller `--size`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::data::FileData;
use crate::dir::Dir;
use crate::fs::Fs;
use crate::inode::{Body, Inode, Meta, State};
use crate::invariant::uncount;
use crate::mutation::Mutation;
use crate::types::{Attr, FallocateMode, FileType, PAGE_SIZE, ROOT_INO, Timespec, XattrMode};
use crate::xattr::Xattrs;

const PAGE: u64 = PAGE_SIZE as u64;

fn empty_body(a: &Attr, parent: u64, target: Option<&[u8]>) -> Body {
    match a.kind {
        FileType::RegularFile => Body::File(FileData::default()),
        FileType::Directory => Body::Dir(Box::new(Dir::new(parent))),
        FileType::Symlink => Body::Symlink(Box::new(target.unwrap_or_default().into())),
        _ => Body::special(a.kind, a.rdev),
    }
}

fn meta_of(a: &Attr) -> Meta {
    Meta {
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        size: match a.kind {
            FileType::RegularFile => a.size,
            _ => 0,
        },
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        // A create's record carries its time as ctime, and an image node
        // without a btime record was made when its ctime was.
        btime: a.btime,
        xattrs: None,
        flags: 0,
    }
}

impl Fs {
    /// Installs a fresh node (a create, or a node read from an image),
    /// replacing any node of that number.
    pub(crate) fn install(&self, a: &Attr, body: Body) -> Arc<Inode> {
        let inode = self.new_inode(a.ino, a.kind, meta_of(a), body);
        if a.ino == ROOT_INO {
            inode.nlookup.store(1, Ordering::Relaxed);
        }
        match self.core.inodes.insert(a.ino, inode.clone()) {
            Some(old) => self.drop_pages_of(&old),
            None => {
                self.used_inodes.fetch_add(1, Ordering::AcqRel);
            }
        }
        self.next_ino.fetch_max(a.ino + 1, Ordering::AcqRel);
        inode
    }

    fn drop_pages_of(&self, old: &Inode) {
        if let Body::File(d) = &old.state.read().body {
            uncount(&self.used_pages, d.page_count(), "pages");
        }
    }

    /// The node `a` names, created empty if the image did not hold it (it
    /// was freed before the copy reached it, or is being rebuilt).
    fn node(&self, a: &Attr) -> Arc<Inode> {
        // The table's read guard must be gone before `install` takes the
        // shard's write lock (a `match` on `get` would keep it to the end).
        let found = self.core.inodes.get(&a.ino).map(|n| n.clone());
        match found {
            Some(n) if n.kind == a.kind => n,
            _ => self.install(a, empty_body(a, ROOT_INO, None)),
        }
    }

    /// Overwrites a node's attributes; a smaller size drops the data beyond.
    fn set_attr(&self, a: &Attr) -> Arc<Inode> {
        let inode = self.node(a);
        let mut st = self.write_state(&inode);
        let State { meta, body, .. } = &mut *st;
        if let Body::File(d) = body {
            if a.size < meta.size {
                self.give_back(d.truncate(a.size));
            }
            meta.size = a.size;
        }
        meta.perm = a.perm;
        meta.nlink = a.nlink;
        meta.uid = a.uid;
        meta.gid = a.gid;
        if let Body::Special(rdev) = body {
            *rdev = a.rdev;
        }
        meta.atime = a.atime;
        meta.mtime = a.mtime;
        meta.ctime = a.ctime;
        drop(st);
        inode
    }

    fn set_entry(&self, dir: &Attr, name: &[u8], child: Option<&Attr>) {
        let d = self.node(dir);
        let mut st = self.write_state(&d);
        if let Some(dir) = st.dir_mut() {
            match child {
                Some(c) => dir.upsert(name, c.ino, c.kind),
                None => {
                    dir.remove(name);
                }
            }
        }
    }

    fn set_dir_parent(&self, a: &Attr, parent: u64) {
        if a.kind == FileType::Directory {
            let n = self.node(a);
            if let Some(d) = self.write_state(&n).dir_mut() {
                d.parent = parent;
            }
        }
    }

    fn with_file(&self, a: &Attr, f: impl FnOnce(&mut FileData) -> i64) {
        if a.kind != FileType::RegularFile {
            return;
        }
        let n = self.node(a);
        let mut st = self.write_state(&n);
        if let Body::File(d) = &mut st.body {
            let delta = f(d);
            if delta >= 0 {
                self.used_pages.fetch_add(delta as u64, Ordering::AcqRel);
            } else {
                uncount(&self.used_pages, delta.unsigned_abs(), "pages");
            }
        }
    }

    /// Rebuild: writes whole pages read from an image into file `ino`
    /// (ignored if `ino` is not a regular file).
    pub fn apply_pages(&self, ino: u64, first: u64, data: &[u8]) {
        let Some(n) = self.core.inodes.get(&ino).map(|n| n.clone()) else {
            return;
        };
        let mut st = self.write_state(&n);
        if let Body::File(d) = &mut st.body {
            let added = d.write(first * PAGE, data);
            self.used_pages.fetch_add(added, Ordering::AcqRel);
        }
    }

    /// Rebuild: sets directory entries of `dir` (ignored if not a directory).
    pub fn apply_entries<'a>(
        &self,
        dir: u64,
        entries: impl Iterator<Item = (&'a [u8], u64, FileType)>,
    ) {
        let Some(n) = self.core.inodes.get(&dir).map(|n| n.clone()) else {
            return;
        };
        let mut st = self.write_state(&n);
        if let Some(d) = st.dir_mut() {
            for (name, ino, kind) in entries {
                d.upsert(name, ino, kind);
            }
        }
    }

    /// Rebuild: sets the creation time of node `ino` (an image's R_BTIME).
    pub fn apply_btime(&self, ino: u64, btime: Timespec) {
        let Some(n) = self.core.inodes.get(&ino).map(|n| n.clone()) else {
            return;
        };
        self.write_state(&n).meta.btime = btime;
    }

    /// Rebuild: sets extended attributes of node `ino`.
    pub fn apply_xattrs<'a>(&self, ino: u64, xs: impl Iterator<Item = (&'a [u8], &'a [u8])>) {
        let Some(n) = self.core.inodes.get(&ino).map(|n| n.clone()) else {
            return;
        };
        let mut st = self.write_state(&n);
        for (name, value) in xs {
            let x = st
                .meta
                .xattrs
                .get_or_insert_with(|| Box::new(Xattrs::default()));
            let _ = x.set(name, value, XattrMode::Any);
        }
    }

    /// Applies one recorded mutation (see the module comment for why this is
    /// correct on a fuzzy image).
    pub fn apply(&self, m: &Mutation<'_>) {
        match *m {
            Mutation::Create {
                parent,
                name,
                attr,
                symlink_target,
            } => {
                self.install(&attr, empty_body(&attr, parent.ino, symlink_target));
                self.set_entry(&parent, name, Some(&attr));
                self.set_attr(&parent);
            }
            Mutation::Link { parent, name, attr } => {
                self.set_attr(&attr);
                self.set_entry(&parent, name, Some(&attr));
                self.set_attr(&parent);
            }
            Mutation::Remove { parent, name, attr } => {
                self.set_entry(&parent, name, None);
                self.set_attr(&parent);
                if self.core.inodes.contains_key(&attr.ino) {
                    self.set_attr(&attr);
                }
            }
            Mutation::Rename {
                parent,
                name,
                new_parent,
                new_name,
                moved,
                other,
                exchange,
            } => self.apply_rename(
                (&parent, name),
                (&new_parent, new_name),
                &moved,
                other.as_ref(),
                exchange,
            ),
            Mutation::SetAttr { attr } => {
                self.set_attr(&attr);
            }
            Mutation::Write { attr, offset, data } => self.apply_write(&attr, offset, data),
            Mutation::Fallocate {
                attr,
                offset,
                len,
                mode,
            } => self.apply_fallocate(&attr, offset, len, mode),
            Mutation::SetXattr { attr, name, value } => {
                self.node(&attr);
                self.apply_xattrs(attr.ino, std::iter::once((name, value)));
                self.set_attr(&attr);
            }
            Mutation::RemoveXattr { attr, name } => self.apply_remove_xattr(&attr, name),
            Mutation::SetFlags { attr, flags } => {
                let n = self.set_attr(&attr);
                crate::flags::set_raw(&n, flags);
            }
            Mutation::Free { ino } => self.apply_free(ino),
            Mutation::Tmpfile { attr } => {
                self.install(&attr, empty_body(&attr, ROOT_INO, None));
            }
        }
    }

    /// [`Fs::apply`] of a rename of `name` in `parent` to `new_name` in
    /// `new_parent`, or of an exchange of the two.
    fn apply_rename(
        &self,
        (parent, name): (&Attr, &[u8]),
        (new_parent, new_name): (&Attr, &[u8]),
        moved: &Attr,
        other: Option<&Attr>,
        exchange: bool,
    ) {
        if exchange {
            let o = other.expect("decoded exchange has two nodes");
            self.set_entry(parent, name, Some(o));
            self.set_dir_parent(o, parent.ino);
        } else {
            self.set_entry(parent, name, None);
        }
        self.set_entry(new_parent, new_name, Some(moved));
        self.set_dir_parent(moved, new_parent.ino);
        self.set_attr(moved);
        if let Some(o) = other
            && self.core.inodes.contains_key(&o.ino)
        {
            self.set_attr(o);
        }
        self.set_attr(parent);
        self.set_attr(new_parent);
    }

    /// [`Fs::apply`] of a write.
    fn apply_write(&self, attr: &Attr, offset: u64, data: &[u8]) {
        self.with_file(attr, |d| {
            let missing = if data.is_empty() {
                0
            } else {
                d.missing_pages(offset / PAGE, (offset + data.len() as u64 - 1) / PAGE)
            };
            d.write(offset, data);
            missing as i64
        });
        self.set_attr(attr);
    }

    /// [`Fs::apply`] of a fallocate.
    fn apply_fallocate(&self, attr: &Attr, offset: u64, len: u64, mode: FallocateMode) {
        // Zeroing a range punches it and allocates it again: the same
        // pages and bytes whether or not the punch is clipped at the
        // old size, which the record does not carry.
        self.with_file(attr, |d| {
            if mode.punch_hole {
                // Clipped at the size as the engine does, so pages
                // allocated beyond the end (keep-size) stay.
                -d.punch(offset, len.min(attr.size.saturating_sub(offset)))
            } else {
                let mut delta = 0i64;
                if mode.zero_range {
                    delta -= d.punch(offset, len);
                }
                delta + d.allocate(offset, len) as i64
            }
        });
        self.set_attr(attr);
    }

    /// [`Fs::apply`] of an xattr's removal.
    fn apply_remove_xattr(&self, attr: &Attr, name: &[u8]) {
        let n = self.node(attr);
        {
            let mut st = self.write_state(&n);
            if let Some(x) = st.meta.xattrs.as_mut() {
                let _ = x.remove(name);
                if x.is_empty() {
                    st.meta.xattrs = None;
                }
            }
        }
        self.set_attr(attr);
    }

    /// [`Fs::apply`] of the free of a node.
    fn apply_free(&self, ino: u64) {
        if ino != ROOT_INO
            && let Some((_, old)) = self.core.inodes.remove(&ino)
        {
            self.drop_pages_of(&old);
            uncount(&self.used_inodes, 1, "inodes");
        }
    }

    /// Ends a rebuild: drops nodes that no directory names any more (they
    /// were unlinked but open when the state was recorded, and nobody holds
    /// them now) and sets the commit counter.
    pub fn finish_rebuild(&self, last_commit: u64) {
        let orphans: Vec<u64> = self
            .core
            .inodes
            .iter()
            .filter(|e| *e.key() != ROOT_INO && e.value().state.read().meta.nlink == 0)
            .map(|e| *e.key())
            .collect();
        for ino in orphans {
            self.apply(&Mutation::Free { ino });
        }
        // A fuzzy image may hold bytes past the size its node had when
        // copied: the records after it must have cut them again.
        #[cfg(debug_assertions)]
        for e in self.core.inodes.iter() {
            let st = e.value().state.read();
            if let Body::File(d) = &st.body {
                d.check(st.meta.size, true);
            }
        }
        self.commit.store(last_commit, Ordering::Release);
    }
}
