//! A small path-based layer over the inode API, for direct users (the shell,
//! tests, tools) that have no kernel to resolve paths for them.

use crate::fs::Fs;
use crate::types::{Attr, Ctx, FileType, ROOT_INO, RenameFlags, SetAttr};
use crate::{Errno, Result};

/// Linux's limit on symlinks followed in one resolution.
const MAX_SYMLINKS: usize = 40;

fn components(path: &[u8]) -> impl DoubleEndedIterator<Item = &[u8]> {
    path.split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
}

impl Fs {
    /// Resolves `path` (absolute, or relative to `cwd`) to an inode number.
    /// A final symlink is followed only with `follow`.
    pub fn resolve(&self, cwd: u64, path: &str, follow: bool) -> Result<u64> {
        let path = path.as_bytes();
        if path.is_empty() {
            return Err(Errno::ENOENT);
        }
        let mut pending: Vec<Vec<u8>> = components(path).rev().map(|c| c.to_vec()).collect();
        let mut cur = if path[0] == b'/' { ROOT_INO } else { cwd };
        let mut links = 0;
        while let Some(name) = pending.pop() {
            let attr = self.lookup_noref(cur, &name)?;
            if attr.kind == FileType::Symlink && (follow || !pending.is_empty()) {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(Errno::ELOOP);
                }
                let target = self.readlink(attr.ino)?;
                if target.first() == Some(&b'/') {
                    cur = ROOT_INO;
                }
                pending.extend(components(&target).rev().map(|c| c.to_vec()));
                continue;
            }
            if !pending.is_empty() && attr.kind != FileType::Directory {
                return Err(Errno::ENOTDIR);
            }
            cur = attr.ino;
        }
        if path.ends_with(b"/") && self.getattr(cur)?.kind != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        Ok(cur)
    }

    /// The directory holding the last component of `path`, and that component.
    pub fn resolve_parent(&self, cwd: u64, path: &str) -> Result<(u64, Vec<u8>)> {
        let trimmed = path.trim_end_matches('/');
        if trimmed.is_empty() {
            return if path.is_empty() {
                Err(Errno::ENOENT)
            } else {
                Ok((ROOT_INO, b".".to_vec()))
            };
        }
        let (dir, name) = match trimmed.rfind('/') {
            Some(i) => (&trimmed[..i.max(1)], &trimmed[i + 1..]),
            None => (".", trimmed),
        };
        let dir_ino = if trimmed.starts_with('/') && !dir.starts_with('/') {
            ROOT_INO
        } else {
            self.resolve(cwd, dir, true)?
        };
        if self.getattr(dir_ino)?.kind != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        Ok((dir_ino, name.as_bytes().to_vec()))
    }

    pub fn stat_path(&self, cwd: u64, path: &str) -> Result<Attr> {
        self.getattr(self.resolve(cwd, path, true)?)
    }

    pub fn lstat_path(&self, cwd: u64, path: &str) -> Result<Attr> {
        self.getattr(self.resolve(cwd, path, false)?)
    }

    pub fn mkdir_path(&self, ctx: Ctx, cwd: u64, path: &str, mode: u32) -> Result<Attr> {
        let (dir, name) = self.resolve_parent(cwd, path)?;
        let attr = self.mkdir(ctx, dir, &name, mode)?;
        self.forget(attr.ino, 1);
        Ok(attr)
    }

    /// `mkdir -p`: creates missing directories along `path`.
    pub fn mkdir_all(&self, ctx: Ctx, cwd: u64, path: &str, mode: u32) -> Result<u64> {
        let mut cur = if path.starts_with('/') { ROOT_INO } else { cwd };
        for c in components(path.as_bytes()) {
            cur = match self.lookup_noref(cur, c) {
                Ok(a) if a.kind == FileType::Directory => a.ino,
                Ok(a) if a.kind == FileType::Symlink => {
                    let s = String::from_utf8_lossy(c).into_owned();
                    let ino = self.resolve(cur, &s, true)?;
                    if self.getattr(ino)?.kind != FileType::Directory {
                        return Err(Errno::ENOTDIR);
                    }
                    ino
                }
                Ok(_) => return Err(Errno::ENOTDIR),
                Err(Errno::ENOENT) => {
                    let a = self.mkdir(ctx, cur, c, mode)?;
                    self.forget(a.ino, 1);
                    a.ino
                }
                Err(e) => return Err(e),
            };
        }
        Ok(cur)
    }

    /// Creates an empty regular file (or opens an existing one unless `excl`).
    pub fn create_path(
        &self,
        ctx: Ctx,
        cwd: u64,
        path: &str,
        mode: u32,
        excl: bool,
    ) -> Result<Attr> {
        let (dir, name) = self.resolve_parent(cwd, path)?;
        let (attr, _) = self.create(ctx, dir, &name, mode, excl)?;
        self.release(attr.ino);
        self.forget(attr.ino, 1);
        Ok(attr)
    }

    /// Replaces the contents of the file at `path` (created if missing).
    pub fn write_file(&self, ctx: Ctx, cwd: u64, path: &str, data: &[u8]) -> Result<Attr> {
        let attr = self.create_path(ctx, cwd, path, 0o644, false)?;
        self.setattr(
            ctx,
            attr.ino,
            &SetAttr {
                size: Some(0),
                ..Default::default()
            },
        )?;
        self.write(ctx, attr.ino, 0, data, false)?;
        self.getattr(attr.ino)
    }

    /// Appends to the file at `path` (created if missing).
    pub fn append_file(&self, ctx: Ctx, cwd: u64, path: &str, data: &[u8]) -> Result<Attr> {
        let attr = self.create_path(ctx, cwd, path, 0o644, false)?;
        self.write(ctx, attr.ino, 0, data, true)?;
        self.getattr(attr.ino)
    }

    pub fn read_file(&self, cwd: u64, path: &str) -> Result<Vec<u8>> {
        let ino = self.resolve(cwd, path, true)?;
        let attr = self.getattr(ino)?;
        match attr.kind {
            FileType::Directory => Err(Errno::EISDIR),
            FileType::RegularFile => self.read_vec(ino, 0, attr.size as usize),
            _ => Err(Errno::EINVAL),
        }
    }

    /// Entries of a directory (without `.` and `..`) with their attributes.
    pub fn list_dir(&self, cwd: u64, path: &str) -> Result<Vec<(Vec<u8>, Attr)>> {
        let ino = self.resolve(cwd, path, true)?;
        let mut names = Vec::new();
        self.readdir(ino, 2, |e| {
            names.push((e.name.to_vec(), e.ino));
            true
        })?;
        Ok(names
            .into_iter()
            .filter_map(|(n, ino)| self.getattr(ino).ok().map(|a| (n, a)))
            .collect())
    }

    pub fn unlink_path(&self, cwd: u64, path: &str) -> Result<()> {
        let (dir, name) = self.resolve_parent(cwd, path)?;
        self.unlink(dir, &name)
    }

    pub fn rmdir_path(&self, cwd: u64, path: &str) -> Result<()> {
        let (dir, name) = self.resolve_parent(cwd, path)?;
        self.rmdir(dir, &name)
    }

    pub fn rename_path(&self, cwd: u64, from: &str, to: &str, flags: RenameFlags) -> Result<()> {
        let (d1, n1) = self.resolve_parent(cwd, from)?;
        let (d2, n2) = self.resolve_parent(cwd, to)?;
        self.rename(d1, &n1, d2, &n2, flags)
    }

    pub fn symlink_path(&self, ctx: Ctx, cwd: u64, target: &str, path: &str) -> Result<Attr> {
        let (dir, name) = self.resolve_parent(cwd, path)?;
        let a = self.symlink(ctx, dir, &name, target.as_bytes())?;
        self.forget(a.ino, 1);
        Ok(a)
    }

    pub fn link_path(&self, cwd: u64, existing: &str, path: &str) -> Result<Attr> {
        let ino = self.resolve(cwd, existing, false)?;
        let (dir, name) = self.resolve_parent(cwd, path)?;
        let a = self.link(ino, dir, &name)?;
        self.forget(a.ino, 1);
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    fn fs() -> Fs {
        Fs::new(Config {
            capacity: 1 << 30,
            max_inodes: 10_000,
        })
    }

    #[test]
    fn resolve_follows_symlinks_and_dotdot() {
        let fs = fs();
        let c = Ctx::ROOT;
        fs.mkdir_all(c, ROOT_INO, "/a/b/c", 0o755).unwrap();
        fs.write_file(c, ROOT_INO, "/a/b/c/f", b"hi").unwrap();
        fs.symlink_path(c, ROOT_INO, "b/c", "/a/l").unwrap();
        fs.symlink_path(c, ROOT_INO, "/a/l/f", "/abs").unwrap();
        assert_eq!(fs.read_file(ROOT_INO, "/a/l/f").unwrap(), b"hi");
        assert_eq!(fs.read_file(ROOT_INO, "/abs").unwrap(), b"hi");
        assert_eq!(fs.read_file(ROOT_INO, "/a/b/c/../c/./f").unwrap(), b"hi");
        assert_eq!(
            fs.lstat_path(ROOT_INO, "/abs").unwrap().kind,
            FileType::Symlink
        );
        assert_eq!(fs.resolve(ROOT_INO, "/a/b/c/f/", true), Err(Errno::ENOTDIR));
        assert_eq!(
            fs.resolve(ROOT_INO, "/a/b/c/f/x", true),
            Err(Errno::ENOTDIR)
        );
        fs.symlink_path(c, ROOT_INO, "/loop2", "/loop1").unwrap();
        fs.symlink_path(c, ROOT_INO, "/loop1", "/loop2").unwrap();
        assert_eq!(fs.resolve(ROOT_INO, "/loop1", true), Err(Errno::ELOOP));
    }
}
