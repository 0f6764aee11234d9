//! Snapshots, their read-only views, rollback and clones (issue 12).
//!
//! The model of a snapshot is the live tree itself at the instant it was
//! taken: every check dumps the whole tree (paths, attributes, contents,
//! xattrs) through the live API when the snapshot is taken and compares it
//! later with the same dump through the snapshot API.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use memfs_fs::*;
use proptest::prelude::*;

const C: Ctx = Ctx::ROOT;

fn fs() -> Fs {
    Fs::new(Config {
        capacity: 1 << 30,
        max_inodes: 1 << 16,
    })
}

/// One node of a dump: what `stat`, `read`/`readlink`/`readdir` and the
/// xattr calls show, the access time excepted (reads change it).
#[derive(Clone, Debug, PartialEq, Eq)]
struct N {
    attr: Attr,
    body: Vec<u8>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

type Tree = BTreeMap<Vec<u8>, N>;

/// The live tree (`None`) or a snapshot's (`Some(id)`).
fn dump(fs: &Fs, snap: Option<u64>) -> Result<Tree> {
    let mut out = Tree::new();
    dump_at(fs, snap, ROOT_INO, b"/".to_vec(), &mut out)?;
    Ok(out)
}

fn dump_at(fs: &Fs, snap: Option<u64>, ino: u64, path: Vec<u8>, out: &mut Tree) -> Result<()> {
    let mut attr = match snap {
        None => fs.getattr(ino)?,
        Some(s) => fs.snap_getattr(s, ino)?,
    };
    attr.atime = Timespec::default();
    let names = match snap {
        None => fs.listxattr(ino)?,
        Some(s) => fs.snap_listxattr(s, ino)?,
    };
    let mut xattrs = Vec::new();
    for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let v = match snap {
            None => fs.getxattr(ino, name)?,
            Some(s) => fs.snap_getxattr(s, ino, name)?,
        };
        xattrs.push((name.to_vec(), v));
    }
    xattrs.sort();
    let mut children = Vec::new();
    let body = match attr.kind {
        FileType::RegularFile => {
            let mut buf = vec![0u8; attr.size as usize];
            let n = match snap {
                None => fs.read_atime(ino, 0, &mut buf, AtimeMode::Never)?,
                Some(s) => fs.snap_read(s, ino, 0, &mut buf)?,
            };
            assert_eq!(n, buf.len(), "short read of {ino}");
            buf
        }
        FileType::Symlink => match snap {
            None => fs.readlink(ino)?,
            Some(s) => fs.snap_readlink(s, ino)?,
        },
        FileType::Directory => {
            let mut listing = Vec::new();
            let mut f = |e: DirEntry<'_>| {
                listing.push((e.name.to_vec(), e.ino, e.kind));
                true
            };
            match snap {
                None => fs.readdir(ino, 0, &mut f)?,
                Some(s) => fs.snap_readdir(s, ino, 0, &mut f)?,
            }
            let mut body = Vec::new();
            for (name, child, kind) in listing {
                body.extend_from_slice(&name);
                body.extend_from_slice(format!("={child}:{kind:?};").as_bytes());
                if name != b"." && name != b".." {
                    // Lookup agrees with readdir.
                    let a = match snap {
                        None => fs.lookup_noref(ino, &name)?,
                        Some(s) => fs.snap_lookup(s, ino, &name)?,
                    };
                    assert_eq!((a.ino, a.kind), (child, kind));
                    children.push((name, child));
                }
            }
            body
        }
        _ => Vec::new(),
    };
    out.insert(path.clone(), N { attr, body, xattrs });
    for (name, child) in children {
        let mut p = path.clone();
        if p.len() > 1 {
            p.push(b'/');
        }
        p.extend_from_slice(&name);
        dump_at(fs, snap, child, p, out)?;
    }
    Ok(())
}

/// Compares two dumps, naming the first path that differs (whole dumps
/// are too long to print).
#[track_caller]
fn same(got: &Tree, want: &Tree, what: &str) {
    if got == want {
        return;
    }
    let short = |n: Option<&N>| {
        n.map(|n| {
            let head = &n.body[..n.body.len().min(64)];
            format!(
                "{:?} body {} bytes {:?} xattrs {:?}",
                n.attr,
                n.body.len(),
                String::from_utf8_lossy(head),
                n.xattrs
            )
        })
    };
    for k in got.keys().chain(want.keys()) {
        if got.get(k) != want.get(k) {
            panic!(
                "{what}: {:?} differs\n got:  {:?}\n want: {:?}",
                String::from_utf8_lossy(k),
                short(got.get(k)),
                short(want.get(k))
            );
        }
    }
}

fn used(fs: &Fs) -> (u64, u64) {
    let s = fs.statfs();
    (s.blocks - s.bfree, s.files - s.ffree)
}

/// Pages and nodes of the live tree, counted node by node.
fn live_usage(fs: &Fs) -> (u64, u64) {
    let nodes = fs.nodes();
    let pages = nodes
        .iter()
        .map(|n| n.read(|v| v.page_count().unwrap_or(0)))
        .sum();
    (pages, nodes.len() as u64)
}

#[test]
fn names_limits_and_stale_ids() {
    let fs = fs();
    for bad in [&b""[..], b".", b"..", b"a/b", b"a\0b"] {
        assert_eq!(
            fs.snapshot_create(bad).unwrap_err(),
            Errno::EINVAL,
            "{bad:?}"
        );
    }
    assert_eq!(
        fs.snapshot_create(&[b'x'; 256]).unwrap_err(),
        Errno::ENAMETOOLONG
    );
    let a = fs.snapshot_create(&[b'x'; 255]).unwrap();
    assert_eq!(fs.snapshot_create(&[b'x'; 255]).unwrap_err(), Errno::EEXIST);
    let b = fs.snapshot_create(b"b").unwrap();
    assert!(b.id > a.id);
    assert_eq!(
        fs.snapshot_list()
            .iter()
            .map(|s| s.name.clone())
            .collect::<Vec<_>>(),
        vec![vec![b'x'; 255], b"b".to_vec()]
    );
    assert_eq!(fs.snapshot_by_name(b"b"), Some(b.clone()));
    assert_eq!(fs.snapshot_by_name(b"nope"), None);
    fs.snapshot_delete(b"b").unwrap();
    assert_eq!(fs.snapshot_delete(b"b").unwrap_err(), Errno::ENOENT);
    assert_eq!(fs.snap_getattr(b.id, ROOT_INO).unwrap_err(), Errno::ESTALE);
    assert_eq!(
        fs.snap_readdir(b.id, ROOT_INO, 0, |_| true).unwrap_err(),
        Errno::ESTALE
    );
    assert_eq!(fs.snap_getattr(9999, ROOT_INO).unwrap_err(), Errno::ESTALE);
    // A new snapshot never gets a deleted one's id.
    let c = fs.snapshot_create(b"b").unwrap();
    assert!(c.id > b.id);
    assert_eq!(fs.rollback_to_snapshot(b"nope").unwrap_err(), Errno::ENOENT);
    assert_eq!(
        fs.clone_snapshot(b"nope", fs.config()).err(),
        Some(Errno::ENOENT)
    );
}

#[test]
fn at_most_max_snapshots() {
    let fs = fs();
    for i in 0..MAX_SNAPSHOTS {
        fs.snapshot_create(format!("s{i}").as_bytes()).unwrap();
    }
    assert_eq!(fs.snapshot_create(b"one-more").unwrap_err(), Errno::ENOSPC);
    fs.snapshot_delete(b"s0").unwrap();
    fs.snapshot_create(b"one-more").unwrap();
}

struct CountingRecorder(AtomicU64);

impl Recorder for CountingRecorder {
    fn record(&self, _: &Mutation<'_>) -> std::result::Result<u64, Errno> {
        Ok(self.0.fetch_add(1, Ordering::AcqRel) + 1)
    }
}

#[test]
fn with_a_recorder_snapshots_work_but_rollback_is_refused() {
    let fs = Fs::with_recorder(
        Config {
            capacity: 1 << 20,
            max_inodes: 100,
        },
        Some(Arc::new(CountingRecorder(AtomicU64::new(0)))),
    );
    fs.write_file(C, ROOT_INO, "/f", b"one").unwrap();
    let s = fs.snapshot_create(b"s").unwrap();
    fs.write_file(C, ROOT_INO, "/f", b"two").unwrap();
    let f = fs.lookup_noref(ROOT_INO, b"f").unwrap().ino;
    let mut buf = [0u8; 8];
    assert_eq!(fs.snap_read(s.id, f, 0, &mut buf).unwrap(), 3);
    assert_eq!(&buf[..3], b"one");
    assert_eq!(
        fs.rollback_to_snapshot(b"s").unwrap_err(),
        Errno::EOPNOTSUPP
    );
    fs.snapshot_delete(b"s").unwrap();
}

#[test]
fn views_are_read_only_and_frozen() {
    let fs = fs();
    fs.mkdir_all(C, ROOT_INO, "/d/e", 0o755).unwrap();
    fs.write_file(C, ROOT_INO, "/d/f", b"hello").unwrap();
    fs.symlink_path(C, ROOT_INO, "f", "/d/l").unwrap();
    let f = fs.resolve(ROOT_INO, "/d/f", false).unwrap();
    let d = fs.resolve(ROOT_INO, "/d", false).unwrap();
    fs.setxattr(f, b"user.k", b"v1", XattrMode::Any).unwrap();
    let before = dump(&fs, None).unwrap();
    let s = fs.snapshot_create(b"s").unwrap();
    same(&dump(&fs, Some(s.id)).unwrap(), &before, "snapshot");

    fs.write(C, f, 0, b"HELLO, world", false).unwrap();
    fs.setxattr(f, b"user.k", b"v2", XattrMode::Any).unwrap();
    fs.rename_path(ROOT_INO, "/d/l", "/l2", RenameFlags::default())
        .unwrap();
    fs.rmdir_path(ROOT_INO, "/d/e").unwrap();
    fs.write_file(C, ROOT_INO, "/new", b"x").unwrap();
    assert_ne!(dump(&fs, None).unwrap(), before);
    same(&dump(&fs, Some(s.id)).unwrap(), &before, "snapshot");

    assert_eq!(
        fs.snap_access(C, s.id, f, libc::W_OK).unwrap_err(),
        Errno::EROFS
    );
    fs.snap_access(C, s.id, f, libc::R_OK).unwrap();
    let user = Ctx {
        uid: 1000,
        gid: 1000,
        pid: 1,
    };
    fs.setattr(
        C,
        f,
        &SetAttr {
            mode: Some(0o600),
            ..Default::default()
        },
    )
    .unwrap();
    // The snapshot keeps the mode it had (0644 from the umask-free create).
    assert_eq!(fs.access(user, f, libc::R_OK).unwrap_err(), Errno::EACCES);
    assert_eq!(
        fs.snap_access(user, s.id, f, libc::R_OK).is_ok(),
        before[&b"/d/f".to_vec()].attr.perm & 0o004 != 0
    );
    assert_eq!(
        fs.snap_read(s.id, d, 0, &mut [0; 4]).unwrap_err(),
        Errno::EISDIR
    );
    assert_eq!(fs.snap_readlink(s.id, f).unwrap_err(), Errno::EINVAL);
    assert_eq!(
        fs.snap_lookup(s.id, d, b"e").unwrap().kind,
        FileType::Directory
    );
    assert_eq!(fs.snap_lookup(s.id, d, b"..").unwrap().ino, ROOT_INO);
    assert_eq!(fs.snap_lookup(s.id, d, b".").unwrap().ino, d);
    assert_eq!(
        fs.snap_lookup(s.id, ROOT_INO, b"new").unwrap_err(),
        Errno::ENOENT
    );
    assert_eq!(fs.snap_lookup(s.id, f, b"x").unwrap_err(), Errno::ENOTDIR);
    assert_eq!(
        fs.snap_getxattr(s.id, f, b"user.none").unwrap_err(),
        Errno::ENODATA
    );
    // Readdir offsets resume like the live readdir's.
    let mut all = Vec::new();
    fs.snap_readdir(s.id, d, 0, |e| {
        all.push((e.name.to_vec(), e.offset));
        true
    })
    .unwrap();
    assert_eq!(all.len(), 5);
    let mut rest = Vec::new();
    fs.snap_readdir(s.id, d, all[2].1, |e| {
        rest.push(e.name.to_vec());
        true
    })
    .unwrap();
    assert_eq!(
        rest,
        all[3..].iter().map(|x| x.0.clone()).collect::<Vec<_>>()
    );
}

#[test]
fn rollback_restores_and_reports_changes() {
    let fs = fs();
    fs.mkdir_all(C, ROOT_INO, "/d", 0o755).unwrap();
    fs.write_file(C, ROOT_INO, "/d/keep", b"keep").unwrap();
    fs.write_file(C, ROOT_INO, "/d/gone", &vec![7u8; 10_000])
        .unwrap();
    let keep = fs.resolve(ROOT_INO, "/d/keep", false).unwrap();
    let d = fs.resolve(ROOT_INO, "/d", false).unwrap();
    let before = dump(&fs, None).unwrap();
    let (pages0, nodes0) = live_usage(&fs);
    fs.snapshot_create(b"s").unwrap();
    // Changes after the snapshot: a new file held by the kernel, a removal,
    // an overwrite.
    let (n, _) = fs.create(C, d, b"new", 0o644, true).unwrap();
    fs.release(n.ino);
    fs.write(C, keep, 0, b"KEEP!", false).unwrap();
    fs.unlink_path(ROOT_INO, "/d/gone").unwrap();
    let out = fs.rollback_to_snapshot(b"s").unwrap();
    same(&dump(&fs, None).unwrap(), &before, "live");
    assert!(out.changed.contains(&keep));
    assert!(out.changed.contains(&n.ino));
    assert!(out.entries.contains(&(d, b"new".to_vec())));
    assert!(out.entries.contains(&(d, b"gone".to_vec())));
    assert!(!out.entries.contains(&(d, b"keep".to_vec())));
    // The node the kernel still knows lives on unlinked until forgotten.
    assert_eq!(fs.getattr(n.ino).unwrap().nlink, 0);
    fs.forget(n.ino, 1);
    assert_eq!(fs.getattr(n.ino).unwrap_err(), Errno::ENOENT);
    // The snapshot stays usable, and a second rollback changes nothing visible.
    fs.write_file(C, ROOT_INO, "/d/keep", b"again").unwrap();
    fs.rollback_to_snapshot(b"s").unwrap();
    same(&dump(&fs, None).unwrap(), &before, "live");
    fs.snapshot_delete(b"s").unwrap();
    assert_eq!(used(&fs), (pages0, nodes0));
}

#[test]
fn rollback_reports_the_changed_pages_of_files_the_kernel_holds() {
    let fs = fs();
    let page = 4096usize;
    // Held by the kernel (created with a reference), 16 pages.
    let (big, _) = fs.create(C, ROOT_INO, b"big", 0o644, true).unwrap();
    fs.release(big.ino);
    fs.write(C, big.ino, 0, &vec![1u8; 16 * page], false)
        .unwrap();
    // Held, but its size changes: the kernel drops its page cache anyway.
    let (grown, _) = fs.create(C, ROOT_INO, b"grown", 0o644, true).unwrap();
    fs.release(grown.ino);
    fs.write(C, grown.ino, 0, &vec![2u8; page], false).unwrap();
    // Not held by the kernel: nothing to report.
    fs.write_file(C, ROOT_INO, "/quiet", &vec![3u8; 4 * page])
        .unwrap();
    let quiet = fs.resolve(ROOT_INO, "/quiet", false).unwrap();
    // Held, only its mode changes.
    let (moded, _) = fs.create(C, ROOT_INO, b"moded", 0o644, true).unwrap();
    fs.release(moded.ino);
    fs.write(C, moded.ino, 0, &vec![4u8; 2 * page], false)
        .unwrap();
    fs.snapshot_create(b"s").unwrap();
    fs.write(C, big.ino, (3 * page + 7) as u64, b"x", false)
        .unwrap();
    fs.write(C, big.ino, (4 * page) as u64, b"y", false)
        .unwrap();
    fs.write(C, big.ino, (12 * page) as u64, &vec![9u8; 2 * page], false)
        .unwrap();
    fs.write(C, grown.ino, page as u64, b"more", false).unwrap();
    fs.write(C, quiet, 0, b"q", false).unwrap();
    fs.setattr(
        C,
        moded.ino,
        &SetAttr {
            mode: Some(0o600),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(fs.kernel_holds(big.ino) && !fs.kernel_holds(quiet));
    let out = fs.rollback_to_snapshot(b"s").unwrap();
    for ino in [big.ino, grown.ino, quiet, moded.ino] {
        assert!(out.changed.contains(&ino), "{ino} not in {:?}", out.changed);
    }
    assert_eq!(
        out.page_runs,
        vec![(big.ino, vec![(3, 2), (12, 2)]), (moded.ino, vec![])]
    );
    let mut buf = vec![0u8; 16 * page];
    assert_eq!(fs.read(big.ino, 0, &mut buf).unwrap(), 16 * page);
    assert!(buf.iter().all(|&b| b == 1));
    assert_eq!(fs.getattr(grown.ino).unwrap().size, page as u64);
    fs.snapshot_delete(b"s").unwrap();
}

#[test]
fn clones_are_independent() {
    let fs = fs();
    fs.write_file(C, ROOT_INO, "/a", &vec![1u8; 9000]).unwrap();
    let before = dump(&fs, None).unwrap();
    fs.snapshot_create(b"s").unwrap();
    let clone = fs.clone_snapshot(b"s", fs.config()).unwrap();
    same(&dump(&clone, None).unwrap(), &before, "clone");
    fs.write_file(C, ROOT_INO, "/a", b"origin").unwrap();
    clone.write_file(C, ROOT_INO, "/a", b"clone").unwrap();
    clone
        .write_file(C, ROOT_INO, "/b", b"only in clone")
        .unwrap();
    assert_eq!(fs.read_file(ROOT_INO, "/a").unwrap(), b"origin");
    assert_eq!(clone.read_file(ROOT_INO, "/a").unwrap(), b"clone");
    assert_eq!(
        fs.resolve(ROOT_INO, "/b", false).unwrap_err(),
        Errno::ENOENT
    );
    fs.snapshot_delete(b"s").unwrap();
    assert_eq!(clone.read_file(ROOT_INO, "/a").unwrap(), b"clone");
    assert_eq!(used(&clone), live_usage(&clone));
    assert_eq!(used(&fs), live_usage(&fs));
    let tiny = Config {
        capacity: 4096,
        max_inodes: 10,
    };
    fs.write_file(C, ROOT_INO, "/big", &vec![1u8; 20_000])
        .unwrap();
    fs.snapshot_create(b"t").unwrap();
    // A lazy clone's config limits what it allocates, not what it copies
    // from the snapshot: reads never fail for the capacity.
    let small = fs.clone_snapshot(b"t", tiny).unwrap();
    assert_eq!(
        small.read_file(ROOT_INO, "/big").unwrap(),
        vec![1u8; 20_000]
    );
    assert_eq!(
        small
            .write_file(C, ROOT_INO, "/more", &[2u8; 5000])
            .unwrap_err(),
        Errno::ENOSPC
    );
}

/// Two files always written together by one rename: each snapshot must show
/// the pair of one generation.
#[test]
fn concurrent_writers_see_consistent_snapshots() {
    let fs = Arc::new(fs());
    fs.mkdir_all(C, ROOT_INO, "/p", 0o755).unwrap();
    fs.write_file(C, ROOT_INO, "/p/a", b"0").unwrap();
    fs.write_file(C, ROOT_INO, "/p/b", b"0").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for t in 0..2u64 {
        let fs = fs.clone();
        let stop = stop.clone();
        let rounds = rounds.clone();
        writers.push(std::thread::spawn(move || {
            let mut g = 0u64;
            while !stop.load(Ordering::Acquire) {
                g += 1;
                let generation = format!("{t}-{g}");
                // Build a directory holding both files, then swap it in.
                let tmp = format!("/tmp{t}");
                fs.mkdir_all(C, ROOT_INO, &tmp, 0o755).unwrap();
                fs.write_file(C, ROOT_INO, &format!("{tmp}/a"), generation.as_bytes())
                    .unwrap();
                fs.write_file(C, ROOT_INO, &format!("{tmp}/b"), generation.as_bytes())
                    .unwrap();
                fs.rename_path(
                    ROOT_INO,
                    &tmp,
                    "/p",
                    RenameFlags {
                        exchange: true,
                        ..Default::default()
                    },
                )
                .unwrap();
                // The old pair is now at tmp: empty it for the next round.
                fs.unlink_path(ROOT_INO, &format!("{tmp}/a")).unwrap();
                fs.unlink_path(ROOT_INO, &format!("{tmp}/b")).unwrap();
                fs.rmdir_path(ROOT_INO, &tmp).unwrap();
                rounds.fetch_add(1, Ordering::AcqRel);
            }
        }));
    }
    while rounds.load(Ordering::Acquire) == 0 {
        std::thread::yield_now();
    }
    let mut i = 0;
    // At least 200 snapshots, and until the writers got 100 rounds in.
    while i < 200 || rounds.load(Ordering::Acquire) < 100 {
        i += 1;
        let name = format!("s{i}");
        let s = fs.snapshot_create(name.as_bytes()).unwrap();
        let p = fs.snap_lookup(s.id, ROOT_INO, b"p").unwrap().ino;
        let read = |n: &[u8]| {
            let ino = fs.snap_lookup(s.id, p, n).unwrap().ino;
            let mut buf = [0u8; 64];
            let k = fs.snap_read(s.id, ino, 0, &mut buf).unwrap();
            buf[..k].to_vec()
        };
        assert_eq!(read(b"a"), read(b"b"), "snapshot {name} mixes generations");
        if i % 3 != 0 || fs.snapshot_list().len() >= MAX_SNAPSHOTS / 2 {
            fs.snapshot_delete(name.as_bytes()).unwrap();
        }
    }
    stop.store(true, Ordering::Release);
    for w in writers {
        w.join().unwrap();
    }
    // Every snapshot still reads consistently after the writers stopped.
    for info in fs.snapshot_list() {
        dump(&fs, Some(info.id)).unwrap();
    }
}

// ---- model test ---------------------------------------------------------------

const DIRS: [&str; 3] = ["", "/d", "/d/e"];
const NAMES: [&str; 3] = ["a", "b", "e"];

fn path(d: usize, n: usize) -> String {
    format!("{}/{}", DIRS[d % DIRS.len()], NAMES[n % NAMES.len()])
}

#[derive(Clone, Debug)]
enum Op {
    Create(usize, usize),
    Write(usize, usize, u16, u8, u8),
    Truncate(usize, usize, u16),
    Unlink(usize, usize),
    Mkdir(usize, usize),
    Rmdir(usize, usize),
    Rename(usize, usize, usize, usize),
    Link(usize, usize, usize, usize),
    Chmod(usize, usize, u16),
    Xattr(usize, usize, u8),
    Snap,
    Delete(usize),
    Rollback(usize),
    Clone(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let p = || (0..3usize, 0..3usize);
    prop_oneof![
        p().prop_map(|(d, n)| Op::Create(d, n)),
        (p(), 0..3usize, any::<u16>(), any::<u8>()).prop_map(|((d, n), pg, len, b)| Op::Write(
            d,
            n,
            // x64 in `apply`: near 0, 128 KiB and 256 KiB, so that writes
            // cross the page table's chunk boundary (64 pages).
            pg as u16 * 2047 + len % 97,
            b,
            (len % 7) as u8
        )),
        (p(), any::<u16>()).prop_map(|((d, n), s)| Op::Truncate(d, n, s % 12_000)),
        p().prop_map(|(d, n)| Op::Unlink(d, n)),
        p().prop_map(|(d, n)| Op::Mkdir(d, n)),
        p().prop_map(|(d, n)| Op::Rmdir(d, n)),
        (p(), p()).prop_map(|((a, b), (c, d))| Op::Rename(a, b, c, d)),
        (p(), p()).prop_map(|((a, b), (c, d))| Op::Link(a, b, c, d)),
        (p(), any::<u16>()).prop_map(|((d, n), m)| Op::Chmod(d, n, m & 0o777)),
        (p(), any::<u8>()).prop_map(|((d, n), v)| Op::Xattr(d, n, v)),
        Just(Op::Snap),
        Just(Op::Snap),
        (0..4usize).prop_map(Op::Delete),
        (0..4usize).prop_map(Op::Rollback),
        (0..4usize).prop_map(Op::Clone),
    ]
}

fn apply(fs: &Fs, op: &Op) {
    let ino = |d, n| fs.resolve(ROOT_INO, &path(d, n), false);
    // Errors are part of the engine's behaviour, not of this test's.
    match *op {
        Op::Create(d, n) => {
            let _ = fs.create_path(C, ROOT_INO, &path(d, n), 0o644, true);
        }
        Op::Write(d, n, off, b, pages) => {
            if let Ok(i) = ino(d, n) {
                let len = 1 + pages as usize * 3000;
                let _ = fs.write(C, i, off as u64 * 64, &vec![b; len], false);
            }
        }
        Op::Truncate(d, n, s) => {
            if let Ok(i) = ino(d, n) {
                let _ = fs.setattr(
                    C,
                    i,
                    &SetAttr {
                        // Up to 300 KB: across the first chunk boundary.
                        size: Some(s as u64 * 25),
                        ..Default::default()
                    },
                );
            }
        }
        Op::Unlink(d, n) => {
            let _ = fs.unlink_path(ROOT_INO, &path(d, n));
        }
        Op::Mkdir(d, n) => {
            let _ = fs.mkdir_path(C, ROOT_INO, &path(d, n), 0o755);
        }
        Op::Rmdir(d, n) => {
            let _ = fs.rmdir_path(ROOT_INO, &path(d, n));
        }
        Op::Rename(a, b, c, d) => {
            let _ = fs.rename_path(ROOT_INO, &path(a, b), &path(c, d), RenameFlags::default());
        }
        Op::Link(a, b, c, d) => {
            let _ = fs.link_path(ROOT_INO, &path(a, b), &path(c, d));
        }
        Op::Chmod(d, n, m) => {
            if let Ok(i) = ino(d, n) {
                let _ = fs.setattr(
                    C,
                    i,
                    &SetAttr {
                        mode: Some(m as u32),
                        ..Default::default()
                    },
                );
            }
        }
        Op::Xattr(d, n, v) => {
            if let Ok(i) = ino(d, n) {
                let _ = fs.setxattr(i, b"user.v", &[v], XattrMode::Any);
            }
        }
        _ => unreachable!("snapshot ops are the test's"),
    }
}

fn run_model(ops: Vec<Op>) {
    let fs = fs();
    let (pages0, nodes0) = used(&fs);
    assert_eq!((pages0, nodes0), live_usage(&fs));
    // (name, id, tree at creation)
    let mut snaps: Vec<(Vec<u8>, u64, Tree)> = Vec::new();
    let mut clones: Vec<(Fs, Tree)> = Vec::new();
    // Lazy clones nobody walks until the end (each with the snapshot's
    // tree): they copy only what single lookups reach, then are made whole
    // by the deletion of their snapshot. Clones of their own snapshot
    // (clones of a lazy clone) among them.
    let mut lazy: Vec<(Fs, Tree)> = Vec::new();
    let mut next = 0;
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Snap => {
                let name = format!("s{next}").into_bytes();
                next += 1;
                let tree = dump(&fs, None).unwrap();
                let info = fs.snapshot_create(&name).unwrap();
                snaps.push((name, info.id, tree));
            }
            Op::Delete(k) if !snaps.is_empty() => {
                let (name, _, _) = snaps.remove(k % snaps.len());
                fs.snapshot_delete(&name).unwrap();
            }
            Op::Rollback(k) if !snaps.is_empty() => {
                let (name, _, tree) = &snaps[k % snaps.len()];
                fs.rollback_to_snapshot(name).unwrap();
                same(&dump(&fs, None).unwrap(), tree, "live after rollback");
            }
            Op::Clone(k) if !snaps.is_empty() && k % 2 == 1 => {
                let (name, _, tree) = &snaps[k % snaps.len()];
                let c = fs.clone_snapshot(name, fs.config()).unwrap();
                if k == 3 {
                    c.snapshot_create(b"l").unwrap();
                    let cc = c.clone_snapshot(b"l", c.config()).unwrap();
                    lazy.push((cc, tree.clone()));
                }
                lazy.push((c, tree.clone()));
            }
            Op::Clone(k) if !snaps.is_empty() => {
                let (name, _, tree) = &snaps[k % snaps.len()];
                let c = fs.clone_snapshot(name, fs.config()).unwrap();
                same(&dump(&c, None).unwrap(), tree, "fresh clone");
                // The clone diverges; the origin must not notice.
                let origin = dump(&fs, None).unwrap();
                c.write_file(C, ROOT_INO, "/clone-only", b"c").unwrap();
                for o in ops.iter().take(5) {
                    if !matches!(o, Op::Snap | Op::Delete(_) | Op::Rollback(_) | Op::Clone(_)) {
                        apply(&c, o);
                    }
                }
                assert_eq!(
                    dump(&fs, None).unwrap(),
                    origin,
                    "origin after clone writes"
                );
                let ct = dump(&c, None).unwrap();
                clones.push((c, ct));
            }
            Op::Delete(_) | Op::Rollback(_) | Op::Clone(_) => {}
            _ => apply(&fs, op),
        }
        for (name, id, tree) in &snaps {
            let got = dump(&fs, Some(*id)).unwrap();
            assert_eq!(
                &got,
                tree,
                "snapshot {:?} after {op:?}",
                String::from_utf8_lossy(name)
            );
        }
        for (c, tree) in &clones {
            same(
                &dump(c, None).unwrap(),
                tree,
                &format!("clone changed by {op:?}"),
            );
        }
        for (c, tree) in &lazy {
            // One path, copying only what its lookup needs.
            let (d, n) = (step % DIRS.len(), (step / DIRS.len()) % NAMES.len());
            let p = path(d, n);
            let got = c.resolve(ROOT_INO, &p, false).and_then(|i| c.getattr(i));
            match tree.get(p.as_bytes()) {
                Some(want) => {
                    let mut a = got.unwrap();
                    a.atime = Timespec::default();
                    assert_eq!(a, want.attr, "lazy clone {p} after {op:?}");
                }
                None => assert_eq!(got.unwrap_err(), Errno::ENOENT, "lazy clone {p}"),
            }
        }
    }
    for (name, _, _) in snaps.drain(..) {
        fs.snapshot_delete(&name).unwrap();
    }
    assert_eq!(
        used(&fs),
        live_usage(&fs),
        "memory held after the last snapshot"
    );
    for (c, _) in &clones {
        assert_eq!(used(c), live_usage(c), "clone accounting");
    }
    for (c, tree) in &lazy {
        same(&dump(c, None).unwrap(), tree, "lazy clone at the end");
        assert_eq!(used(c), live_usage(c), "lazy clone accounting");
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        // PROPTEST_CASES overrides, for a longer run by hand.
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64),
        ..ProptestConfig::default()
    })]
    #[test]
    fn snapshots_match_the_model(ops in proptest::collection::vec(op(), 1..60)) {
        run_model(ops);
    }
}

#[test]
fn a_snapshot_shares_pages_until_written() {
    let fs = fs();
    let data: Vec<u8> = (0..10 * PAGE_SIZE).map(|i| (i % 251) as u8).collect();
    fs.write_file(C, ROOT_INO, "/f", &data).unwrap();
    let f = fs.resolve(ROOT_INO, "/f", false).unwrap();
    assert_eq!(used(&fs).0, 10);
    let s = fs.snapshot_create(b"s").unwrap();
    assert_eq!(used(&fs).0, 10, "a snapshot copies nothing");
    // The first write to a page copies that page only.
    fs.write(C, f, 5, b"x", false).unwrap();
    assert_eq!(used(&fs).0, 11);
    fs.write(C, f, 6, b"y", false).unwrap();
    assert_eq!(used(&fs).0, 11, "the copy is the file's own now");
    let info = fs.snapshot_by_name(b"s").unwrap();
    assert_eq!(info.nodes, 1);
    assert!(info.bytes >= PAGE_SIZE as u64, "{info:?}");
    // Truncating the live file frees nothing the snapshot still holds.
    fs.setattr(
        C,
        f,
        &SetAttr {
            size: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(used(&fs).0, 10);
    let mut back = vec![0u8; data.len()];
    assert_eq!(fs.snap_read(s.id, f, 0, &mut back).unwrap(), data.len());
    assert_eq!(back, data);
    // A clone shares the pages' memory but counts them as its own.
    let clone = fs.clone_snapshot(b"s", fs.config()).unwrap();
    // Lazy: nothing copied, nothing counted until the clone needs the node.
    assert_eq!(used(&clone), (0, 0));
    assert_eq!(clone.read_vec(f, 0, 1).unwrap(), &data[..1]);
    assert_eq!(used(&clone).0, 10);
    clone.write(C, f, 0, b"c", false).unwrap();
    assert_eq!(used(&clone).0, 10);
    assert_eq!(clone.read_vec(f, 1, 2).unwrap(), &data[1..3]);
    fs.snapshot_delete(b"s").unwrap();
    assert_eq!(used(&fs).0, 0, "the last holder gave the pages back");
    assert_eq!(clone.read_vec(f, 4096, 3).unwrap(), &data[4096..4099]);
    // Rollback shares the snapshot's pages again.
    fs.write_file(C, ROOT_INO, "/f", &data).unwrap();
    fs.snapshot_create(b"t").unwrap();
    fs.write_file(C, ROOT_INO, "/f", b"short").unwrap();
    fs.rollback_to_snapshot(b"t").unwrap();
    assert_eq!(fs.read_file(ROOT_INO, "/f").unwrap(), data);
    assert_eq!(used(&fs).0, 10);
    fs.snapshot_delete(b"t").unwrap();
    assert_eq!(used(&fs), live_usage(&fs));
}

/// A readdirplus on a snapshot calls back into the views from inside
/// `snap_readdir` while other threads take and delete snapshots: it must
/// neither deadlock nor see another snapshot's entries.
#[test]
fn views_may_call_back_while_snapshots_come_and_go() {
    let fs = Arc::new(fs());
    for i in 0..50 {
        fs.write_file(C, ROOT_INO, &format!("/f{i}"), b"x").unwrap();
    }
    let s = fs.snapshot_create(b"base").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let churn = {
        let (fs, stop, rounds) = (fs.clone(), stop.clone(), rounds.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Acquire) {
                fs.snapshot_create(format!("c{n}").as_bytes()).unwrap();
                fs.write_file(C, ROOT_INO, &format!("/f{}", n % 50), b"yy")
                    .unwrap();
                fs.snapshot_delete(format!("c{n}").as_bytes()).unwrap();
                n += 1;
                rounds.store(n, Ordering::Release);
            }
        })
    };
    let mut listings = 0;
    // At least 200 listings, and until the churn got 50 rounds in.
    while listings < 200 || rounds.load(Ordering::Acquire) < 50 {
        listings += 1;
        let mut seen = 0;
        fs.snap_readdir(s.id, ROOT_INO, 2, |e| {
            let a = fs.snap_getattr(s.id, e.ino).unwrap();
            assert_eq!(a.size, 1, "{:?} is not as it was", e.name);
            seen += 1;
            true
        })
        .unwrap();
        assert_eq!(seen, 50);
    }
    stop.store(true, Ordering::Release);
    churn.join().unwrap();
}

/// A lazy clone never copies back from its snapshot a node it freed, and
/// numbers its new nodes past the snapshot's.
#[test]
fn lazy_clone_forgets_what_it_freed() {
    let fs = fs();
    fs.write_file(C, ROOT_INO, "/a", b"a").unwrap();
    let a = fs.resolve(ROOT_INO, "/a", false).unwrap();
    fs.snapshot_create(b"s").unwrap();
    let clone = fs.clone_snapshot(b"s", fs.config()).unwrap();
    clone.unlink_path(ROOT_INO, "/a").unwrap();
    assert_eq!(clone.getattr(a).unwrap_err(), Errno::ENOENT);
    assert_eq!(fs.getattr(a).unwrap().ino, a);
    let b = clone.write_file(C, ROOT_INO, "/b", b"b").unwrap();
    assert!(b.ino > a);
    assert_eq!(
        fs.resolve(ROOT_INO, "/b", false).unwrap_err(),
        Errno::ENOENT
    );
    // Made whole by the deletion: still gone, the rest still there.
    fs.snapshot_delete(b"s").unwrap();
    assert_eq!(clone.getattr(a).unwrap_err(), Errno::ENOENT);
    assert_eq!(clone.read_file(ROOT_INO, "/b").unwrap(), b"b");
    assert_eq!(used(&clone), live_usage(&clone));
}

/// A lazy clone reads its snapshot after the origin changed everything
/// and after the origin itself is gone; so does a clone of that clone.
#[test]
fn lazy_clone_outlives_its_origin() {
    let fs = fs();
    fs.mkdir_path(C, ROOT_INO, "/d", 0o755).unwrap();
    for i in 0..20 {
        fs.write_file(C, ROOT_INO, &format!("/d/f{i}"), &vec![i as u8; 5000])
            .unwrap();
    }
    let tree = dump(&fs, None).unwrap();
    fs.snapshot_create(b"s").unwrap();
    let clone = fs.clone_snapshot(b"s", fs.config()).unwrap();
    clone.snapshot_create(b"c").unwrap();
    let clone2 = clone.clone_snapshot(b"c", clone.config()).unwrap();
    for i in 0..20 {
        if i % 2 == 0 {
            fs.unlink_path(ROOT_INO, &format!("/d/f{i}")).unwrap();
        } else {
            fs.write_file(C, ROOT_INO, &format!("/d/f{i}"), b"new")
                .unwrap();
        }
    }
    assert_eq!(clone.read_file(ROOT_INO, "/d/f3").unwrap(), vec![3u8; 5000]);
    drop(fs);
    same(&dump(&clone2, None).unwrap(), &tree, "clone of the clone");
    same(&dump(&clone, None).unwrap(), &tree, "clone");
    assert_eq!(used(&clone2), live_usage(&clone2));
    // The clone's snapshot goes: its clone is made whole first.
    clone.snapshot_delete(b"c").unwrap();
    assert_eq!(used(&clone), live_usage(&clone));
    drop(clone);
    same(
        &dump(&clone2, None).unwrap(),
        &tree,
        "clone of the clone, alone",
    );
}

/// Readers walk lazy clones while the origin changes and deletes the
/// snapshot they read (making them whole) and takes new ones.
#[test]
fn lazy_clones_read_while_their_snapshot_goes() {
    let fs = Arc::new(fs());
    for d in 0..4 {
        fs.mkdir_path(C, ROOT_INO, &format!("/d{d}"), 0o755)
            .unwrap();
        for i in 0..25 {
            fs.write_file(C, ROOT_INO, &format!("/d{d}/f{i}"), &[d as u8; 3000])
                .unwrap();
        }
    }
    for round in 0..20 {
        let tree = dump(&fs, None).unwrap();
        let name = format!("s{round}").into_bytes();
        fs.snapshot_create(&name).unwrap();
        let clone = Arc::new(fs.clone_snapshot(&name, fs.config()).unwrap());
        let readers: Vec<_> = (0..2)
            .map(|t| {
                let (clone, tree) = (clone.clone(), tree.clone());
                std::thread::spawn(move || {
                    // Different orders, so the two copy different nodes first.
                    for d in (0..4).map(|d| if t == 0 { d } else { 3 - d }) {
                        let p = format!("/d{d}/f{}", round % 25);
                        let i = clone.resolve(ROOT_INO, &p, false).unwrap();
                        let mut a = clone.getattr(i).unwrap();
                        a.atime = Timespec::default();
                        assert_eq!(a, tree[p.as_bytes()].attr);
                    }
                    same(&dump(&clone, None).unwrap(), &tree, "lazy clone");
                })
            })
            .collect();
        fs.write_file(C, ROOT_INO, &format!("/d{}/f{round}", round % 4), b"x")
            .unwrap();
        fs.snapshot_delete(&name).unwrap();
        for r in readers {
            r.join().unwrap();
        }
        same(&dump(&clone, None).unwrap(), &tree, "lazy clone after");
        assert_eq!(used(&clone), live_usage(&clone));
    }
}
