//! Moving a whole tree between a volume and an engine tree in memory
//! (`memfs_fs::Fs`): what `memfs send --cluster` and `memfs receive
//! --cluster` are made of (docs/cluster.md, "Send and receive"). The stream
//! itself is memfs-durable's format; this crate may not depend on
//! memfs-durable (docs/architecture.md), so the binary glues the halves:
//! [`volume_to_fs`] here, then `memfs_durable::send::send_tree`; and
//! `memfs_durable::send::receive_tree`, then [`fs_to_volume`] here.
//!
//! Both directions hold the whole tree in memory (the `Fs` is the tree):
//! memory is bounded by nothing but the tree's size.
//!
//! Only the volume's public operations are used, as a mount would use them,
//! and only the engine's public rebuild and whole-tree API on the `Fs`
//! side. What a volume does not keep is refused before anything is
//! written: inode flags, POSIX ACLs and other `system.` xattrs.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use memfs_fs::{
    AtimeMode, Attr, Config, Ctx, Errno, FIRST_ENTRY_OFFSET, FileType, Fs, Node, PAGE_SIZE,
    ROOT_INO, SetAttr, SetTime, XattrMode,
};

use crate::volume::Volume;

/// Bytes read from or written to the volume per call.
const CHUNK: usize = 1 << 20;
/// Engine pages copied per hold of a node's lock (256 KiB).
const PAGES_PER_HOLD: usize = 64;
/// The xattr namespaces a volume keeps (as `Volume::setxattr_as` checks).
const XATTR_PREFIXES: [&[u8]; 3] = [b"user.", b"trusted.", b"security."];

/// What can go wrong moving a tree; each says what it concerns.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// An operation on the volume failed (the path it concerned, the errno).
    #[error("{what}: {errno}")]
    Volume { what: String, errno: Errno },
    /// A tree is received only into a volume with an empty root.
    #[error(
        "the volume is not empty (its root holds {first:?}): a tree is received into a new or \
         empty volume only (memfs volume delete it first, or name another)"
    )]
    NotEmpty { first: String },
    /// The tree holds what a volume does not keep.
    #[error("{0}")]
    Unsupported(String),
    /// Another mount changed the volume while it was read.
    #[error(
        "another mount changed the volume while it was read, so the copy could mix two states: \
         send again while nothing writes to it"
    )]
    Changed,
    /// The engine tree is not a tree (an entry names a missing node).
    #[error("the tree to write is damaged: {0}")]
    Damaged(String),
}

type Result<T> = std::result::Result<T, TransferError>;

fn on(what: impl std::fmt::Display) -> impl FnOnce(Errno) -> TransferError {
    move |errno| TransferError::Volume {
        what: what.to_string(),
        errno,
    }
}

fn join(dir: &str, name: &[u8]) -> String {
    let name = String::from_utf8_lossy(name);
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// What [`fs_to_volume`] wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Written {
    /// Nodes created (the root is not counted: it existed).
    pub nodes: u64,
    /// Further names of hard-linked nodes.
    pub links: u64,
    /// File bytes written (holes are not written).
    pub bytes: u64,
}

/// Reads the whole tree of `vol` into a new [`Fs`]: every node once, under
/// its volume inode number (so hard links stay links), with its type,
/// mode, owner, times, rdev, symlink target, xattrs and data. Holes of the
/// volume's block maps stay holes, and so do pages of zeros inside blocks
/// (a block is 64 KiB, a page 4 KiB: a page of zeros reads as a hole, as
/// it does on the engine). Fails with [`TransferError::Changed`] when the
/// volume's feed reports a change by another mount during the walk (for
/// which it takes the volume's [`Volume::on_change`] callback: a volume
/// opened for the copy, not one a mount serves).
pub fn volume_to_fs(vol: &Volume) -> Result<Fs> {
    let changed = Arc::new(AtomicBool::new(false));
    let seen = changed.clone();
    vol.on_change(Box::new(move |_| seen.store(true, Ordering::Release)));
    let r = read_tree(vol);
    vol.on_change(Box::new(|_| {}));
    let fs = r?;
    if changed.load(Ordering::Acquire) {
        return Err(TransferError::Changed);
    }
    Ok(fs)
}

/// Breadth first from the root: a directory's entries are set once its
/// node is installed, each child installed the first time a name of it is
/// met.
fn read_tree(vol: &Volume) -> Result<Fs> {
    let fs = Fs::new(Config {
        capacity: u64::MAX / 2,
        max_inodes: u64::MAX / 2,
    });
    let root = vol.getattr(ROOT_INO).map_err(on("the root"))?;
    read_node(vol, &fs, &root, ROOT_INO, "/")?;
    let mut seen = HashSet::from([ROOT_INO]);
    let mut dirs = VecDeque::from([(ROOT_INO, String::from("/"))]);
    while let Some((dir, path)) = dirs.pop_front() {
        let entries = list(vol, dir, &path)?;
        fs.apply_entries(
            dir,
            entries.iter().map(|(n, a)| (n.as_slice(), a.ino, a.kind)),
        );
        for (name, a) in &entries {
            if !seen.insert(a.ino) {
                continue;
            }
            let p = join(&path, name);
            read_node(vol, &fs, a, dir, &p)?;
            if a.kind == FileType::Directory {
                dirs.push_back((a.ino, p));
            }
        }
    }
    debug_assert!(fs.find_node(ROOT_INO).is_some());
    Ok(fs)
}

/// A directory's entries with their attributes, without `.` and `..`.
fn list(vol: &Volume, dir: u64, path: &str) -> Result<Vec<(Vec<u8>, Attr)>> {
    let mut out = Vec::new();
    vol.readdirplus(dir, 0, |e, a| {
        if e.name != b"." && e.name != b".." {
            out.push((e.name.to_vec(), *a));
        }
        true
    })
    .map_err(on(format!("listing {path}")))?;
    Ok(out)
}

/// Installs one node of the volume in `fs`, with its target, xattrs and data.
fn read_node(vol: &Volume, fs: &Fs, a: &Attr, parent: u64, path: &str) -> Result<()> {
    let target = match a.kind {
        FileType::Symlink => vol
            .readlink(a.ino)
            .map_err(on(format!("reading the symlink {path}")))?,
        _ => Vec::new(),
    };
    fs.install_node(a, parent, &target);
    let names = vol
        .listxattr(a.ino)
        .map_err(on(format!("listing the xattrs of {path}")))?;
    for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let value = vol.getxattr(a.ino, name).map_err(on(format!(
            "reading xattr {} of {path}",
            String::from_utf8_lossy(name)
        )))?;
        fs.apply_xattrs(a.ino, std::iter::once((name, value.as_slice())));
    }
    if a.kind == FileType::RegularFile {
        read_data(vol, fs, a.ino, a.size, path)?;
    }
    Ok(())
}

/// Copies a file's data extents (SEEK_DATA to SEEK_HOLE, which follow the
/// block map) into `fs`, page by page, leaving pages of zeros out.
fn read_data(vol: &Volume, fs: &Fs, ino: u64, size: u64, path: &str) -> Result<()> {
    let mut buf = vec![0u8; CHUNK];
    let mut off = 0u64;
    while off < size {
        let data = match vol.lseek(ino, off, libc::SEEK_DATA) {
            Ok(d) => d,
            Err(e) if e == Errno::ENXIO => break,
            Err(e) => return Err(on(format!("finding the data of {path}"))(e)),
        };
        let hole = vol
            .lseek(ino, data, libc::SEEK_HOLE)
            .map_err(on(format!("finding the holes of {path}")))?
            .min(size);
        if hole <= data || data < off {
            // The map changed under the walk; never loop on it.
            return Err(TransferError::Changed);
        }
        let mut at = data - data % PAGE_SIZE as u64;
        while at < hole {
            let n = CHUNK.min((hole - at) as usize);
            let got = vol
                .read_atime(ino, at, &mut buf[..n], AtimeMode::Never)
                .map_err(on(format!("reading {path} at {at}")))?;
            // A short read is a file cut meanwhile; what is missing reads
            // as zeros, as past the end of a file.
            buf[got.min(n)..n].fill(0);
            put_pages(fs, ino, at, &buf[..n]);
            at += n as u64;
        }
        off = hole;
    }
    Ok(())
}

fn put_pages(fs: &Fs, ino: u64, at: u64, data: &[u8]) {
    debug_assert_eq!(at % PAGE_SIZE as u64, 0, "pages start on a page");
    let first = at / PAGE_SIZE as u64;
    for (i, page) in data.chunks(PAGE_SIZE).enumerate() {
        if page.iter().any(|&b| b != 0) {
            fs.apply_pages(ino, first + i as u64, page);
        }
    }
}

/// Whether `vol`'s root is empty: [`TransferError::NotEmpty`] names its
/// first entry otherwise.
pub fn check_empty(vol: &Volume) -> Result<()> {
    let mut first = None;
    vol.readdir(ROOT_INO, 0, |e| {
        if e.name == b"." || e.name == b".." {
            return true;
        }
        first = Some(String::from_utf8_lossy(e.name).into_owned());
        false
    })
    .map_err(on("listing the volume's root"))?;
    match first {
        Some(first) => Err(TransferError::NotEmpty { first }),
        None => Ok(()),
    }
}

/// Refuses, before anything is written, a tree holding what a volume does
/// not keep: inode flags (`chattr`), POSIX ACLs and other xattrs outside
/// `user.`, `trusted.` and `security.`.
pub fn check_supported(fs: &Fs) -> Result<()> {
    for node in fs.nodes() {
        let (ino, nlink, flags, odd) = node.read(|v| {
            let odd = v
                .xattrs()
                .find(|(k, _)| !XATTR_PREFIXES.iter().any(|p| k.starts_with(p)))
                .map(|(k, _)| String::from_utf8_lossy(k).into_owned());
            (v.attr().ino, v.nlink(), v.flags(), odd)
        });
        if nlink == 0 && ino != ROOT_INO {
            continue;
        }
        if flags != 0 {
            return Err(TransferError::Unsupported(format!(
                "node {ino} has inode flags {flags:#x} (chattr), which a volume does not keep: \
                 clear them (chattr -i -a ...) and send again"
            )));
        }
        if let Some(k) = odd {
            return Err(TransferError::Unsupported(format!(
                "node {ino} has xattr {k:?}, which a volume does not keep (POSIX ACLs and \
                 system. xattrs): remove it (setfacl -b for an ACL) and send again"
            )));
        }
    }
    Ok(())
}

const ROOT: Ctx = Ctx::ROOT;

fn anyone(_gid: u32) -> bool {
    true
}

/// Writes the tree `fs` into `vol`, whose root must be empty: parents
/// before children, each node once (further names as hard links), then
/// every node's owner, mode and times, last, so that nothing written after
/// them moves a time. Checks [`check_supported`] and [`check_empty`] before
/// it writes anything. The volume's inode numbers are its own; change
/// times are the tree's (set explicitly), creation times the receive's.
pub fn fs_to_volume(fs: &Fs, vol: &Volume) -> Result<Written> {
    check_supported(fs)?;
    check_empty(vol)?;
    let root = fs
        .find_node(ROOT_INO)
        .ok_or_else(|| TransferError::Damaged("it has no root".into()))?;
    let mut w = Written::default();
    write_xattrs(vol, &root, ROOT_INO, "/")?;
    // Engine inode → volume inode, and the order they were made in.
    let mut made: HashMap<u64, u64> = HashMap::from([(ROOT_INO, ROOT_INO)]);
    let mut order = vec![(ROOT_INO, root.clone())];
    let mut dirs = VecDeque::from([(root, String::from("/"))]);
    while let Some((dir, path)) = dirs.pop_front() {
        let vdir = made[&dir.ino()];
        for (name, ino) in entries(&dir) {
            let p = join(&path, &name);
            if let Some(&v) = made.get(&ino) {
                vol.link(v, vdir, &name)
                    .map_err(on(format!("linking {p}")))?;
                w.links += 1;
                continue;
            }
            let node = fs
                .find_node(ino)
                .ok_or_else(|| TransferError::Damaged(format!("{p} names no node ({ino})")))?;
            let v = write_node(vol, &node, vdir, &name, &p, &mut w)?;
            made.insert(ino, v);
            order.push((ino, node.clone()));
            if node.kind() == FileType::Directory {
                dirs.push_back((node, p));
            }
        }
    }
    for (ino, node) in &order {
        set_attrs(vol, node, made[ino])?;
    }
    Ok(w)
}

/// A directory's entries (name, engine inode), copied out of its lock.
fn entries(dir: &Node) -> Vec<(Vec<u8>, u64)> {
    let mut out = Vec::new();
    dir.read(|v| {
        v.entries_from(FIRST_ENTRY_OFFSET, |name, ino, _, _| {
            out.push((name.to_vec(), ino));
            true
        })
    });
    out
}

/// Creates one node under `vdir` (as root, private modes: [`set_attrs`]
/// gives the real ones at the end), with its data and xattrs; returns its
/// volume inode.
fn write_node(
    vol: &Volume,
    node: &Node,
    vdir: u64,
    name: &[u8],
    path: &str,
    w: &mut Written,
) -> Result<u64> {
    let (a, target) = node.read(|v| (v.attr(), v.symlink_target().map(<[u8]>::to_vec)));
    let what = || format!("creating {path}");
    let v = match a.kind {
        FileType::Directory => vol.mkdir_umask(ROOT, vdir, name, 0o700, 0),
        FileType::Symlink => vol.symlink(ROOT, vdir, name, &target.unwrap_or_default()),
        FileType::RegularFile => vol
            .create_umask(ROOT, vdir, name, 0o600, true, 0)
            .map(|(a, _)| a),
        k => vol.mknod_umask(ROOT, vdir, name, k.mode_bits() | 0o600, a.rdev, 0),
    }
    .map_err(on(what()))?
    .ino;
    if a.kind == FileType::RegularFile {
        // create_umask opened it: closed whatever the write did.
        let r = write_data(vol, node, v, a.size, path);
        let flushed = vol.flush(v).map_err(on(format!("writing {path}")));
        vol.release(v);
        w.bytes += r?;
        flushed?;
    }
    write_xattrs(vol, node, v, path)?;
    w.nodes += 1;
    Ok(v)
}

fn write_xattrs(vol: &Volume, node: &Node, v: u64, path: &str) -> Result<()> {
    let xs: Vec<(Vec<u8>, Vec<u8>)> =
        node.read(|n| n.xattrs().map(|(k, x)| (k.to_vec(), x.to_vec())).collect());
    for (k, x) in xs {
        vol.setxattr_as(ROOT, &anyone, v, &k, &x, XattrMode::Create)
            .map_err(on(format!(
                "setting xattr {} of {path}",
                String::from_utf8_lossy(&k)
            )))?;
    }
    Ok(())
}

/// Writes the pages a file holds (holes stay holes), in runs of up to
/// [`CHUNK`] bytes, then its size; returns the bytes written.
fn write_data(vol: &Volume, node: &Node, v: u64, size: u64, path: &str) -> Result<u64> {
    let mut run: Vec<u8> = Vec::with_capacity(CHUNK);
    let mut run_at = 0u64;
    let mut written = 0u64;
    let mut start = Some(0u64);
    while let Some(s) = start {
        let mut pages: Vec<(u64, Vec<u8>)> = Vec::new();
        start =
            node.read(|n| n.pages_from(s, PAGES_PER_HOLD, |idx, p| pages.push((idx, p.to_vec()))));
        for (idx, page) in pages {
            let at = idx * PAGE_SIZE as u64;
            if at >= size {
                break;
            }
            if run.len() == CHUNK || (!run.is_empty() && run_at + run.len() as u64 != at) {
                written += put_run(vol, v, run_at, &run, path)?;
                run.clear();
            }
            if run.is_empty() {
                run_at = at;
            }
            let keep = (size - at).min(PAGE_SIZE as u64) as usize;
            run.extend_from_slice(&page[..keep]);
        }
    }
    if !run.is_empty() {
        written += put_run(vol, v, run_at, &run, path)?;
    }
    let set = SetAttr {
        size: Some(size),
        ..SetAttr::default()
    };
    vol.setattr_as(ROOT, &anyone, v, &set)
        .map_err(on(format!("setting the size of {path}")))?;
    Ok(written)
}

fn put_run(vol: &Volume, v: u64, at: u64, run: &[u8], path: &str) -> Result<u64> {
    let n = vol
        .write_as(ROOT, &anyone, false, v, at, run, false)
        .map_err(on(format!("writing {path} at {at}")))?;
    if n != run.len() {
        return Err(on(format!(
            "writing {path} at {at} ({n} of {} bytes)",
            run.len()
        ))(Errno::EIO));
    }
    Ok(n as u64)
}

/// Gives volume node `v` the engine node's owner, then its mode and times
/// (two steps: a change of owner clears setuid, as on the engine).
fn set_attrs(vol: &Volume, node: &Node, v: u64) -> Result<()> {
    let a = node.read(|n| n.attr());
    let what = || format!("setting the attributes of node {v}");
    let owner = SetAttr {
        uid: Some(a.uid),
        gid: Some(a.gid),
        ..SetAttr::default()
    };
    vol.setattr_as(ROOT, &anyone, v, &owner)
        .map_err(on(what()))?;
    let rest = SetAttr {
        mode: (a.kind != FileType::Symlink).then_some(u32::from(a.perm)),
        atime: Some(SetTime::At(a.atime)),
        mtime: Some(SetTime::At(a.mtime)),
        ctime: Some(a.ctime),
        ..SetAttr::default()
    };
    vol.setattr_as(ROOT, &anyone, v, &rest)
        .map_err(on(what()))?;
    Ok(())
}
