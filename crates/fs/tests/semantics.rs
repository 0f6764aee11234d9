//! Unit tests of the engine's POSIX rules: timestamps, setgid inheritance,
//! privilege clearing, limits (ENOSPC, ENAMETOOLONG), xattr errors,
//! SEEK_DATA/SEEK_HOLE, fallocate modes and record locks.
//!
//! Timestamps are checked without sleeping: every node's times are first set
//! to a fixed old instant, so "changed" is "no longer that instant".

use std::sync::mpsc;

use memfs_fs::*;

const C: Ctx = Ctx::ROOT;
const USER: Ctx = Ctx {
    uid: 1000,
    gid: 1000,
    pid: 42,
};
const P: u64 = PAGE_SIZE as u64;
const OLD: Timespec = Timespec {
    sec: 1_000_000,
    nsec: 5,
};

fn fs() -> Fs {
    Fs::new(Config {
        capacity: 1 << 30,
        max_inodes: 1 << 16,
    })
}

fn mkfile(fs: &Fs, ctx: Ctx, parent: u64, name: &str, mode: u32) -> Attr {
    let (a, created) = fs.create(ctx, parent, name.as_bytes(), mode, true).unwrap();
    assert!(created);
    fs.release(a.ino);
    fs.forget(a.ino, 1);
    a
}

fn mkdir(fs: &Fs, ctx: Ctx, parent: u64, name: &str, mode: u32) -> Attr {
    let a = fs.mkdir(ctx, parent, name.as_bytes(), mode).unwrap();
    fs.forget(a.ino, 1);
    a
}

fn set(fs: &Fs, ino: u64, s: SetAttr) -> Attr {
    fs.setattr(C, ino, &s).unwrap()
}

/// Sets all three times of each node to `OLD`.
fn age(fs: &Fs, inos: &[u64]) {
    for &ino in inos {
        set(
            fs,
            ino,
            SetAttr {
                atime: Some(SetTime::At(OLD)),
                mtime: Some(SetTime::At(OLD)),
                ctime: Some(OLD),
                ..Default::default()
            },
        );
    }
}

/// Which of (atime, mtime, ctime) moved away from `OLD`.
fn changed(fs: &Fs, ino: u64) -> (bool, bool, bool) {
    let a = fs.getattr(ino).unwrap();
    (a.atime != OLD, a.mtime != OLD, a.ctime != OLD)
}

const NONE: (bool, bool, bool) = (false, false, false);
const MC: (bool, bool, bool) = (false, true, true);
const CT: (bool, bool, bool) = (false, false, true);

// ---- timestamps ----------------------------------------------------------------------

#[test]
fn times_of_creation_and_removal() {
    let fs = fs();
    let d = mkdir(&fs, C, ROOT_INO, "d", 0o755).ino;
    age(&fs, &[ROOT_INO, d]);
    let f = mkfile(&fs, C, d, "f", 0o644);
    assert_eq!(
        (f.atime, f.mtime),
        (f.ctime, f.ctime),
        "new node: all times equal"
    );
    assert!(f.ctime > OLD);
    assert_eq!(
        changed(&fs, d),
        MC,
        "create changes the parent's mtime and ctime"
    );
    assert_eq!(changed(&fs, ROOT_INO), NONE, "grandparent untouched");

    for (what, op) in [
        (
            "mkdir",
            Box::new(|fs: &Fs| {
                mkdir(fs, C, d, "sub", 0o755);
            }) as Box<dyn Fn(&Fs)>,
        ),
        (
            "symlink",
            Box::new(|fs: &Fs| {
                let a = fs.symlink(C, d, b"l", b"target").unwrap();
                fs.forget(a.ino, 1);
            }),
        ),
        (
            "mknod",
            Box::new(|fs: &Fs| {
                let a = fs.mknod(C, d, b"p", libc::S_IFIFO | 0o644, 0).unwrap();
                fs.forget(a.ino, 1);
            }),
        ),
    ] {
        age(&fs, &[d]);
        op(&fs);
        assert_eq!(changed(&fs, d), MC, "{what}: parent times");
    }

    // link: the node's ctime, the directory's mtime and ctime.
    age(&fs, &[d, f.ino]);
    let l = fs.link(f.ino, d, b"f2").unwrap();
    fs.forget(l.ino, 1);
    assert_eq!(changed(&fs, f.ino), CT, "link: node ctime");
    assert_eq!(changed(&fs, d), MC, "link: dir");

    // unlink of one of two names: the node's ctime, the directory's mtime and ctime.
    age(&fs, &[d, f.ino]);
    fs.unlink(d, b"f2").unwrap();
    assert_eq!(changed(&fs, f.ino), CT, "unlink: node ctime");
    assert_eq!(changed(&fs, d), MC, "unlink: dir");

    age(&fs, &[d]);
    fs.rmdir(d, b"sub").unwrap();
    assert_eq!(changed(&fs, d), MC, "rmdir: parent");
}

#[test]
fn times_of_rename() {
    let fs = fs();
    let a = mkdir(&fs, C, ROOT_INO, "a", 0o755).ino;
    let b = mkdir(&fs, C, ROOT_INO, "b", 0o755).ino;
    let f = mkfile(&fs, C, a, "f", 0o644).ino;
    let victim = mkfile(&fs, C, b, "g", 0o644).ino;
    fs.link(victim, ROOT_INO, b"keep")
        .map(|x| fs.forget(x.ino, 1))
        .unwrap();
    age(&fs, &[ROOT_INO, a, b, f, victim]);
    fs.rename(a, b"f", b, b"g", RenameFlags::default()).unwrap();
    assert_eq!(changed(&fs, a), MC, "source dir");
    assert_eq!(changed(&fs, b), MC, "target dir");
    assert_eq!(changed(&fs, f), CT, "moved node: ctime only");
    assert_eq!(changed(&fs, victim), CT, "replaced node: ctime");
    assert_eq!(changed(&fs, ROOT_INO), NONE);
    assert_eq!(fs.getattr(victim).unwrap().nlink, 1);
}

#[test]
fn atime_modes_of_reads() {
    let fs = fs();
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o644).ino;
    fs.write(C, f, 0, b"hello", false).unwrap();
    let mut buf = [0u8; 5];
    let set_atime = |t: Timespec| {
        set(
            &fs,
            f,
            SetAttr {
                atime: Some(SetTime::At(t)),
                ..Default::default()
            },
        )
    };
    let atime = || fs.getattr(f).unwrap().atime;

    // noatime: even an access older than the last change stays.
    set_atime(OLD);
    fs.take_unrecorded_atimes();
    fs.read_atime(f, 0, &mut buf, AtimeMode::Never).unwrap();
    assert_eq!(atime(), OLD, "noatime");
    assert!(!fs.take_unrecorded_atimes(), "noatime moved no atime");

    // relatime: an access later than the last change, less than a day old, stays...
    let mtime = fs.getattr(f).unwrap().mtime;
    let recent = Timespec {
        sec: mtime.sec + 1,
        nsec: 0,
    };
    set_atime(recent);
    fs.read_atime(f, 0, &mut buf, AtimeMode::Relative).unwrap();
    assert_eq!(atime(), recent, "relatime, recent access");
    assert!(!fs.take_unrecorded_atimes(), "relatime moved no atime");
    // ...while strictatime records every read. A read makes no commit: the
    // engine says so once, for a durable close to keep the atime.
    fs.read_atime(f, 0, &mut buf, AtimeMode::Strict).unwrap();
    assert_ne!(atime(), recent, "strictatime");
    assert!(fs.take_unrecorded_atimes(), "a read moved an atime");
    assert!(!fs.take_unrecorded_atimes(), "taken");

    // relatime: a day-old access is renewed even when later than the last change.
    let day_old = Timespec {
        sec: Timespec::now().sec - 86_401,
        nsec: 0,
    };
    set(
        &fs,
        f,
        SetAttr {
            atime: Some(SetTime::At(day_old)),
            mtime: Some(SetTime::At(OLD)),
            ctime: Some(OLD),
            ..Default::default()
        },
    );
    fs.read_atime(f, 0, &mut buf, AtimeMode::Relative).unwrap();
    assert!(atime().sec > day_old.sec, "relatime, day-old access");
}

/// A read through a descriptor opened with O_NOATIME (LTP open12) leaves
/// the access time alone under every mount policy, even one that a plain
/// read of the same file would move; other open flags change nothing.
#[test]
fn o_noatime_reads_record_nothing() {
    let fs = fs();
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o644).ino;
    fs.write(C, f, 0, b"hello", false).unwrap();
    // 2020-01-01, as `touch -a -d 2020-01-01`: older than the last change
    // and than a day, so relatime would move it.
    let y2020 = Timespec {
        sec: 1_577_836_800,
        nsec: 0,
    };
    let atime = || fs.getattr(f).unwrap().atime;
    let mut buf = [0u8; 1];
    for mode in [AtimeMode::Relative, AtimeMode::Strict, AtimeMode::Never] {
        let set_atime = || {
            set(
                &fs,
                f,
                SetAttr {
                    atime: Some(SetTime::At(y2020)),
                    ..Default::default()
                },
            )
        };
        set_atime();
        fs.take_unrecorded_atimes();
        let noatime = mode.for_open_flags(libc::O_RDONLY | libc::O_NOATIME);
        assert_eq!(noatime, AtimeMode::Never);
        fs.read_atime(f, 0, &mut buf, noatime).unwrap();
        assert_eq!(atime(), y2020, "{mode:?}: O_NOATIME");
        assert!(!fs.take_unrecorded_atimes(), "{mode:?}: O_NOATIME");

        let plain = mode.for_open_flags(libc::O_RDWR | libc::O_APPEND | libc::O_CLOEXEC);
        assert_eq!(plain, mode, "only O_NOATIME changes the policy");
        fs.read_atime(f, 0, &mut buf, plain).unwrap();
        assert_eq!(atime() != y2020, mode != AtimeMode::Never, "{mode:?}");
    }
}

#[test]
fn times_of_data_and_attribute_changes() {
    let fs = fs();
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o644).ino;

    age(&fs, &[ROOT_INO, f]);
    fs.write(C, f, 0, b"hello", false).unwrap();
    assert_eq!(changed(&fs, f), MC, "write");
    assert_eq!(
        changed(&fs, ROOT_INO),
        NONE,
        "write leaves the directory alone"
    );

    age(&fs, &[f]);
    assert_eq!(fs.write(C, f, 0, b"", false), Ok(0));
    assert_eq!(changed(&fs, f), NONE, "an empty write changes nothing");

    age(&fs, &[f]);
    let mut buf = [0u8; 5];
    assert_eq!(fs.read(f, 0, &mut buf), Ok(5));
    assert_eq!(changed(&fs, f), (true, false, false), "read: atime only");
    // relatime: a second read right after does not write atime again.
    let at = fs.getattr(f).unwrap().atime;
    fs.read(f, 0, &mut buf).unwrap();
    assert_eq!(fs.getattr(f).unwrap().atime, at);

    age(&fs, &[f]);
    set(
        &fs,
        f,
        SetAttr {
            size: Some(2),
            ..Default::default()
        },
    );
    assert_eq!(changed(&fs, f), MC, "truncate");

    age(&fs, &[f]);
    set(
        &fs,
        f,
        SetAttr {
            mode: Some(0o600),
            ..Default::default()
        },
    );
    assert_eq!(changed(&fs, f), CT, "chmod");

    age(&fs, &[f]);
    set(
        &fs,
        f,
        SetAttr {
            uid: Some(5),
            ..Default::default()
        },
    );
    assert_eq!(changed(&fs, f), CT, "chown");

    age(&fs, &[f]);
    fs.setxattr(f, b"user.k", b"v", XattrMode::Any).unwrap();
    assert_eq!(changed(&fs, f), CT, "setxattr");
    age(&fs, &[f]);
    fs.removexattr(f, b"user.k").unwrap();
    assert_eq!(changed(&fs, f), CT, "removexattr");

    age(&fs, &[f]);
    fs.fallocate(f, 0, P, FallocateMode::ALLOCATE).unwrap();
    assert_eq!(changed(&fs, f), MC, "fallocate");

    // utimensat: explicit times stick, ctime becomes now.
    let t = Timespec { sec: 77, nsec: 999 };
    let a = set(
        &fs,
        f,
        SetAttr {
            atime: Some(SetTime::At(t)),
            mtime: Some(SetTime::At(t)),
            ..Default::default()
        },
    );
    assert_eq!((a.atime, a.mtime), (t, t));
    assert!(a.ctime > OLD);
    // UTIME_NOW.
    let a = set(
        &fs,
        f,
        SetAttr {
            mtime: Some(SetTime::Now),
            ..Default::default()
        },
    );
    assert_eq!(a.atime, t);
    assert!(a.mtime > t);
}

// ---- ownership and privilege bits --------------------------------------------------------

#[test]
fn new_nodes_take_caller_ids_or_setgid_directory_group() {
    let fs = fs();
    let plain = mkdir(&fs, C, ROOT_INO, "plain", 0o777).ino;
    let f = mkfile(&fs, USER, plain, "f", 0o644);
    assert_eq!((f.uid, f.gid), (1000, 1000));

    let sg = mkdir(&fs, C, ROOT_INO, "sg", 0o2777).ino;
    set(
        &fs,
        sg,
        SetAttr {
            gid: Some(500),
            ..Default::default()
        },
    );
    assert_eq!(
        fs.getattr(sg).unwrap().perm,
        0o2777,
        "chown of a dir keeps setgid"
    );
    let f = mkfile(&fs, USER, sg, "f", 0o644);
    assert_eq!((f.uid, f.gid), (1000, 500), "file inherits the group");
    assert_eq!(f.perm, 0o644, "files do not get the bit");
    let d = mkdir(&fs, USER, sg, "d", 0o755);
    assert_eq!((d.uid, d.gid), (1000, 500), "dir inherits the group");
    assert_eq!(d.perm, 0o2755, "and the setgid bit");
    // ... and passes both on again.
    let dd = mkdir(&fs, USER, d.ino, "dd", 0o700);
    assert_eq!((dd.gid, dd.perm), (500, 0o2700));
    let s = fs.symlink(USER, sg, b"l", b"x").unwrap();
    assert_eq!(s.gid, 500);
    let n = fs.mknod(USER, sg, b"n", libc::S_IFIFO | 0o600, 0).unwrap();
    assert_eq!(n.gid, 500);
    // A non-member creating a setgid file in the directory loses the bit.
    let g = mkfile(&fs, USER, sg, "g", 0o2755);
    assert_eq!(g.perm & libc::S_ISGID as u16, 0);
    // Root keeps it.
    let r = mkfile(&fs, C, sg, "r", 0o2755);
    assert_eq!(r.perm, 0o2755);
}

#[test]
fn chown_and_write_clear_setuid_and_setgid() {
    let fs = fs();
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o6755).ino;
    assert_eq!(fs.getattr(f).unwrap().perm, 0o6755);
    let a = set(
        &fs,
        f,
        SetAttr {
            uid: Some(1000),
            ..Default::default()
        },
    );
    assert_eq!(a.perm, 0o755, "chown clears setuid and (group-exec) setgid");

    // setgid without group execute is a locking marker, not a privilege: kept.
    set(
        &fs,
        f,
        SetAttr {
            mode: Some(0o6745),
            ..Default::default()
        },
    );
    let a = set(
        &fs,
        f,
        SetAttr {
            gid: Some(7),
            ..Default::default()
        },
    );
    assert_eq!(a.perm, 0o2745);

    // An unprivileged write clears setuid; a privileged one does not.
    set(
        &fs,
        f,
        SetAttr {
            mode: Some(0o4755),
            ..Default::default()
        },
    );
    fs.write(C, f, 0, b"x", false).unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm, 0o4755);
    fs.write(USER, f, 0, b"x", false).unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm, 0o755);

    // Same for truncate.
    set(
        &fs,
        f,
        SetAttr {
            mode: Some(0o6755),
            ..Default::default()
        },
    );
    fs.setattr(
        USER,
        f,
        &SetAttr {
            size: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm, 0o755);
}

/// The FUSE adapter negotiates HANDLE_KILLPRIV_V2: the engine, not the
/// kernel, drops a file capability when an unprivileged caller writes.
#[test]
fn unprivileged_write_drops_the_file_capability() {
    let fs = fs();
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o755).ino;
    fs.setxattr(f, b"security.capability", b"cap", XattrMode::Any)
        .unwrap();
    fs.setxattr(f, b"user.k", b"v", XattrMode::Any).unwrap();
    fs.write(C, f, 0, b"x", false).unwrap();
    assert_eq!(fs.getxattr(f, b"security.capability").unwrap(), b"cap");
    fs.write(USER, f, 0, b"x", false).unwrap();
    assert_eq!(fs.getxattr(f, b"security.capability"), Err(Errno::ENODATA));
    assert_eq!(fs.getxattr(f, b"user.k").unwrap(), b"v");
}

/// Whether a write or fallocate clears setuid/setgid is the caller's
/// CAP_FSETID, which the FUSE kernel states per write
/// (FUSE_WRITE_KILL_SUIDGID), not its uid: root without the capability loses
/// the bits, a user holding it keeps them.
#[test]
fn kill_suidgid_is_the_callers_capability_not_its_uid() {
    let fs = fs();
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o644).ino;
    let not_member = |_gid: u32| false;
    let owner = SetAttr {
        uid: Some(2000),
        gid: Some(2000),
        ..Default::default()
    };
    set(&fs, f, owner);
    // Apart from the chown, which drops setuid.
    let reset = || {
        set(
            &fs,
            f,
            SetAttr {
                mode: Some(0o6755),
                ..Default::default()
            },
        );
    };
    let mode = || fs.getattr(f).unwrap().perm;
    let alloc = FallocateMode::ALLOCATE;
    for (who, ctx, kill, after) in [
        ("root without CAP_FSETID", C, true, 0o755),
        ("root", C, false, 0o6755),
        ("a user", USER, true, 0o755),
        ("a user with CAP_FSETID", USER, false, 0o6755),
    ] {
        reset();
        fs.write_as(ctx, &not_member, kill, f, 0, b"x", false)
            .unwrap();
        assert_eq!(mode(), after, "write by {who}");
        reset();
        let mut pages = vec![Some(Box::new([7u8; PAGE_SIZE]))];
        fs.write_pages_as(ctx, &not_member, kill, f, 0, PAGE_SIZE, &mut pages, false)
            .unwrap();
        assert_eq!(mode(), after, "write of pages by {who}");
        reset();
        fs.fallocate_as(ctx, &not_member, kill, f, 0, P, alloc)
            .unwrap();
        assert_eq!(mode(), after, "fallocate by {who}");
    }
}

// ---- limits ------------------------------------------------------------------------------

#[test]
fn capacity_enospc_changes_nothing_and_statfs_tells_the_truth() {
    let fs = Fs::new(Config {
        capacity: 4 * P,
        max_inodes: 100,
    });
    let s = fs.statfs();
    assert_eq!(
        (s.blocks, s.bfree, s.bavail, s.bsize),
        (4, 4, 4, PAGE_SIZE as u32)
    );
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o644).ino;
    fs.write(C, f, 0, &[1u8; 3 * PAGE_SIZE], false).unwrap();
    assert_eq!(fs.statfs().bfree, 1);
    // Needs two more pages: refused whole, nothing written.
    assert_eq!(
        fs.write(C, f, 3 * P, &[2u8; PAGE_SIZE + 1], false),
        Err(Errno::ENOSPC)
    );
    let a = fs.getattr(f).unwrap();
    assert_eq!((a.size, a.blocks), (3 * P, 3 * 8));
    assert_eq!(fs.statfs().bfree, 1);
    // Rewriting allocated pages needs no capacity.
    fs.write(C, f, 5, &[3u8; 100], false).unwrap();
    // A sparse 1 TiB file costs one page.
    let g = mkfile(&fs, C, ROOT_INO, "g", 0o644).ino;
    fs.write(C, g, 1 << 40, b"end", false).unwrap();
    assert_eq!(fs.getattr(g).unwrap().size, (1 << 40) + 3);
    assert_eq!(fs.statfs().bfree, 0);
    assert_eq!(fs.write(C, g, 0, b"x", false), Err(Errno::ENOSPC));
    assert_eq!(
        fs.fallocate(g, 0, 1, FallocateMode::ALLOCATE),
        Err(Errno::ENOSPC)
    );
    // Truncating frees pages; statfs sees it at once.
    set(
        &fs,
        f,
        SetAttr {
            size: Some(P),
            ..Default::default()
        },
    );
    assert_eq!(fs.statfs().bfree, 2);
    fs.write(C, g, 0, b"x", false).unwrap();
    // Unlinking frees the rest.
    fs.unlink(ROOT_INO, b"f").unwrap();
    fs.unlink(ROOT_INO, b"g").unwrap();
    assert_eq!(fs.statfs().bfree, 4);
}

#[test]
fn inode_limit_enospc_and_statfs() {
    let fs = Fs::new(Config {
        capacity: 1 << 20,
        max_inodes: 4,
    });
    assert_eq!(fs.statfs().files, 4);
    assert_eq!(fs.statfs().ffree, 3, "the root counts");
    mkfile(&fs, C, ROOT_INO, "a", 0o644);
    mkdir(&fs, C, ROOT_INO, "d", 0o755);
    let s = fs.symlink(C, ROOT_INO, b"l", b"a").unwrap();
    fs.forget(s.ino, 1);
    assert_eq!(fs.statfs().ffree, 0);
    assert_eq!(
        fs.create(C, ROOT_INO, b"b", 0o644, true).map(|_| ()),
        Err(Errno::ENOSPC)
    );
    assert_eq!(
        fs.mkdir(C, ROOT_INO, b"e", 0o755).map(|_| ()),
        Err(Errno::ENOSPC)
    );
    assert_eq!(
        fs.mknod(C, ROOT_INO, b"p", libc::S_IFIFO | 0o644, 0)
            .map(|_| ()),
        Err(Errno::ENOSPC)
    );
    assert_eq!(
        fs.symlink(C, ROOT_INO, b"m", b"x").map(|_| ()),
        Err(Errno::ENOSPC)
    );
    // Hard links cost no inode.
    fs.link(s.ino, ROOT_INO, b"l2")
        .map(|a| fs.forget(a.ino, 1))
        .unwrap();
    // An existing name is still EEXIST, not ENOSPC.
    assert_eq!(
        fs.mkdir(C, ROOT_INO, b"d", 0o755).map(|_| ()),
        Err(Errno::EEXIST)
    );
    assert_eq!(fs.lookup_noref(ROOT_INO, b"b"), Err(Errno::ENOENT));
    fs.unlink(ROOT_INO, b"a").unwrap();
    assert_eq!(fs.statfs().ffree, 1);
    mkfile(&fs, C, ROOT_INO, "b", 0o644);
    assert_eq!(fs.inode_count(), 4);
}

#[test]
fn names_longer_than_255_bytes_are_enametoolong() {
    let fs = fs();
    let ok = "n".repeat(255);
    let long = "n".repeat(256);
    let lb = long.as_bytes();
    let f = mkfile(&fs, C, ROOT_INO, &ok, 0o644).ino;
    assert_eq!(fs.lookup_noref(ROOT_INO, ok.as_bytes()).unwrap().ino, f);
    assert_eq!(
        fs.create(C, ROOT_INO, lb, 0o644, true).map(|_| ()),
        Err(Errno::ENAMETOOLONG)
    );
    assert_eq!(
        fs.mkdir(C, ROOT_INO, lb, 0o755).map(|_| ()),
        Err(Errno::ENAMETOOLONG)
    );
    assert_eq!(
        fs.mknod(C, ROOT_INO, lb, libc::S_IFIFO | 0o644, 0)
            .map(|_| ()),
        Err(Errno::ENAMETOOLONG)
    );
    assert_eq!(
        fs.symlink(C, ROOT_INO, lb, b"x").map(|_| ()),
        Err(Errno::ENAMETOOLONG)
    );
    assert_eq!(
        fs.link(f, ROOT_INO, lb).map(|_| ()),
        Err(Errno::ENAMETOOLONG)
    );
    assert_eq!(fs.lookup_noref(ROOT_INO, lb), Err(Errno::ENAMETOOLONG));
    assert_eq!(fs.unlink(ROOT_INO, lb), Err(Errno::ENAMETOOLONG));
    assert_eq!(fs.rmdir(ROOT_INO, lb), Err(Errno::ENAMETOOLONG));
    let plain = RenameFlags::default();
    assert_eq!(
        fs.rename(ROOT_INO, ok.as_bytes(), ROOT_INO, lb, plain),
        Err(Errno::ENAMETOOLONG)
    );
    assert_eq!(
        fs.rename(ROOT_INO, lb, ROOT_INO, b"x", plain),
        Err(Errno::ENAMETOOLONG)
    );
    assert_eq!(
        fs.create_path(C, ROOT_INO, &format!("/{long}"), 0o644, true)
            .map(|_| ()),
        Err(Errno::ENAMETOOLONG)
    );
    // Symlink targets: up to 4095 bytes.
    let t = vec![b't'; SYMLINK_MAX];
    let s = fs.symlink(C, ROOT_INO, b"s", &t).unwrap();
    assert_eq!(s.size, SYMLINK_MAX as u64);
    assert_eq!(fs.readlink(s.ino).unwrap(), t);
    let t = vec![b't'; SYMLINK_MAX + 1];
    assert_eq!(
        fs.symlink(C, ROOT_INO, b"s2", &t).map(|_| ()),
        Err(Errno::ENAMETOOLONG)
    );
    assert_eq!(fs.statfs().namelen, 255);
}

// ---- xattrs ---------------------------------------------------------------------------------

#[test]
fn xattr_errors_follow_linux() {
    let fs = fs();
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o644).ino;
    assert_eq!(fs.getxattr(f, b"user.a"), Err(Errno::ENODATA));
    assert_eq!(fs.removexattr(f, b"user.a"), Err(Errno::ENODATA));
    assert_eq!(
        fs.setxattr(f, b"user.a", b"1", XattrMode::Replace),
        Err(Errno::ENODATA)
    );
    fs.setxattr(f, b"user.a", b"1", XattrMode::Create).unwrap();
    assert_eq!(
        fs.setxattr(f, b"user.a", b"2", XattrMode::Create),
        Err(Errno::EEXIST)
    );
    fs.setxattr(f, b"user.a", b"3", XattrMode::Replace).unwrap();
    assert_eq!(fs.getxattr(f, b"user.a").unwrap(), b"3");
    fs.setxattr(f, b"user.a", b"", XattrMode::Any).unwrap();
    assert_eq!(
        fs.getxattr(f, b"user.a").unwrap(),
        b"",
        "empty values exist"
    );

    // Name length: 255 bytes in all, ERANGE beyond (and for an empty name).
    let mut name = b"user.".to_vec();
    name.resize(XATTR_NAME_MAX, b'x');
    fs.setxattr(f, &name, b"v", XattrMode::Any).unwrap();
    name.push(b'x');
    assert_eq!(
        fs.setxattr(f, &name, b"v", XattrMode::Any),
        Err(Errno::ERANGE)
    );
    assert_eq!(fs.getxattr(f, &name), Err(Errno::ERANGE));
    assert_eq!(
        fs.setxattr(f, b"", b"v", XattrMode::Any),
        Err(Errno::ERANGE)
    );

    // Value size: 64 KiB, E2BIG beyond; a failed set leaves the old value.
    fs.setxattr(f, b"user.big", &vec![7u8; XATTR_SIZE_MAX], XattrMode::Any)
        .unwrap();
    assert_eq!(
        fs.setxattr(
            f,
            b"user.big",
            &vec![8u8; XATTR_SIZE_MAX + 1],
            XattrMode::Any
        ),
        Err(Errno::E2BIG)
    );
    assert_eq!(
        fs.getxattr(f, b"user.big").unwrap(),
        vec![7u8; XATTR_SIZE_MAX]
    );

    // Namespaces.
    fs.setxattr(f, b"trusted.t", b"1", XattrMode::Any).unwrap();
    fs.setxattr(f, b"security.s", b"1", XattrMode::Any).unwrap();
    for bad in [
        &b"os2.x"[..],
        b"user",
        b"user.",
        b"system.posix_acl_access_x",
    ] {
        assert_eq!(
            fs.setxattr(f, bad, b"1", XattrMode::Any),
            Err(Errno::EOPNOTSUPP),
            "{bad:?}"
        );
    }
    // user.* only on regular files and directories.
    let s = fs.symlink(C, ROOT_INO, b"l", b"f").unwrap().ino;
    assert_eq!(
        fs.setxattr(s, b"user.a", b"1", XattrMode::Any),
        Err(Errno::EPERM)
    );
    fs.setxattr(s, b"trusted.a", b"1", XattrMode::Any).unwrap();

    let mut names: Vec<&[u8]> = Vec::new();
    let list = fs.listxattr(f).unwrap();
    assert_eq!(list.last(), Some(&0), "NUL-terminated");
    names.extend(list.split(|&b| b == 0).filter(|n| !n.is_empty()));
    names.sort();
    let mut want: Vec<&[u8]> = vec![
        b"security.s",
        b"trusted.t",
        b"user.a",
        b"user.big",
        &name[..name.len() - 1],
    ];
    want.sort();
    assert_eq!(names, want);
    fs.removexattr(f, b"user.a").unwrap();
    assert_eq!(fs.getxattr(f, b"user.a"), Err(Errno::ENODATA));
    assert_eq!(fs.getxattr(ROOT_INO + 1000, b"user.a"), Err(Errno::ENOENT));
}

// ---- sparse data ------------------------------------------------------------------------------

#[test]
fn seek_data_and_seek_hole() {
    let fs = fs();
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o644).ino;
    // [data 0..P) [hole P..3P) [data 3P..5P) [hole to size 10P]
    fs.write(C, f, 10, b"a", false).unwrap();
    fs.write(C, f, 3 * P + 7, &vec![1u8; PAGE_SIZE], false)
        .unwrap();
    set(
        &fs,
        f,
        SetAttr {
            size: Some(10 * P),
            ..Default::default()
        },
    );
    let seek = |off, whence| fs.lseek(f, off, whence);
    assert_eq!(seek(0, libc::SEEK_DATA), Ok(0));
    assert_eq!(seek(5, libc::SEEK_DATA), Ok(5));
    assert_eq!(seek(0, libc::SEEK_HOLE), Ok(P));
    assert_eq!(seek(P, libc::SEEK_HOLE), Ok(P));
    assert_eq!(seek(P + 1, libc::SEEK_DATA), Ok(3 * P));
    assert_eq!(seek(3 * P, libc::SEEK_HOLE), Ok(5 * P));
    assert_eq!(
        seek(5 * P, libc::SEEK_DATA),
        Err(Errno::ENXIO),
        "only a hole follows"
    );
    assert_eq!(seek(7 * P, libc::SEEK_HOLE), Ok(7 * P));
    assert_eq!(seek(10 * P, libc::SEEK_DATA), Err(Errno::ENXIO), "at EOF");
    assert_eq!(seek(10 * P, libc::SEEK_HOLE), Err(Errno::ENXIO), "at EOF");
    // Data up to EOF: the hole is at EOF.
    set(
        &fs,
        f,
        SetAttr {
            size: Some(4 * P),
            ..Default::default()
        },
    );
    assert_eq!(seek(3 * P, libc::SEEK_HOLE), Ok(4 * P));
    // Holes read as zeros.
    assert_eq!(fs.read_vec(f, P, 10).unwrap(), vec![0u8; 10]);
    let d = mkdir(&fs, C, ROOT_INO, "d", 0o755).ino;
    assert_eq!(fs.lseek(d, 0, libc::SEEK_DATA), Err(Errno::EINVAL));
}

#[test]
fn truncate_never_exposes_old_bytes() {
    let fs = fs();
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o644).ino;
    fs.write(C, f, 0, &vec![0xEEu8; 2 * PAGE_SIZE], false)
        .unwrap();
    set(
        &fs,
        f,
        SetAttr {
            size: Some(100),
            ..Default::default()
        },
    );
    set(
        &fs,
        f,
        SetAttr {
            size: Some(2 * P),
            ..Default::default()
        },
    );
    let back = fs.read_vec(f, 0, 2 * PAGE_SIZE).unwrap();
    assert!(back[..100].iter().all(|&b| b == 0xEE));
    assert!(back[100..].iter().all(|&b| b == 0), "old bytes came back");
    assert_eq!(
        fs.getattr(f).unwrap().blocks,
        8,
        "the page beyond 100 bytes was freed"
    );
}

#[test]
fn fallocate_modes() {
    let fs = fs();
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o644).ino;
    let mode = |bits| FallocateMode::from_bits(bits).unwrap();
    let blocks = |fs: &Fs| fs.getattr(f).unwrap().blocks;
    let size = |fs: &Fs| fs.getattr(f).unwrap().size;

    fs.fallocate(f, 0, 2 * P, FallocateMode::ALLOCATE).unwrap();
    assert_eq!((size(&fs), blocks(&fs)), (2 * P, 16), "allocate extends");
    assert_eq!(
        fs.lseek(f, 0, libc::SEEK_DATA),
        Ok(0),
        "allocated pages are data"
    );
    fs.fallocate(f, 4 * P, P, mode(libc::FALLOC_FL_KEEP_SIZE))
        .unwrap();
    assert_eq!(
        (size(&fs), blocks(&fs)),
        (2 * P, 24),
        "keep-size allocates past EOF"
    );

    fs.write(C, f, 0, &vec![9u8; 2 * PAGE_SIZE], false).unwrap();
    let punch = mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE);
    fs.fallocate(f, 100, P + 50, punch).unwrap();
    let back = fs.read_vec(f, 0, 2 * PAGE_SIZE).unwrap();
    assert!(back[..100].iter().all(|&b| b == 9));
    assert!(back[100..P as usize + 150].iter().all(|&b| b == 0));
    assert!(back[P as usize + 150..].iter().all(|&b| b == 9));
    assert_eq!(size(&fs), 2 * P, "punch keeps the size");
    fs.fallocate(f, 0, P, punch).unwrap();
    assert_eq!(blocks(&fs), 16, "a whole punched page is freed");
    assert_eq!(fs.lseek(f, 0, libc::SEEK_HOLE), Ok(0));

    fs.write(C, f, 0, &vec![5u8; 2 * PAGE_SIZE], false).unwrap();
    fs.fallocate(f, 10, 3 * P, mode(libc::FALLOC_FL_ZERO_RANGE))
        .unwrap();
    assert_eq!(size(&fs), 3 * P + 10, "zero-range extends");
    let back = fs.read_vec(f, 0, 3 * PAGE_SIZE + 10).unwrap();
    assert!(back[..10].iter().all(|&b| b == 5));
    assert!(back[10..].iter().all(|&b| b == 0));
    assert_eq!(
        fs.lseek(f, 0, libc::SEEK_HOLE),
        Ok(size(&fs)),
        "zeroed range is allocated"
    );
    fs.fallocate(
        f,
        0,
        8 * P,
        mode(libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE),
    )
    .unwrap();
    assert_eq!(size(&fs), 3 * P + 10);

    // Modes memfs does not offer, and invalid combinations.
    for bits in [
        libc::FALLOC_FL_PUNCH_HOLE,
        libc::FALLOC_FL_COLLAPSE_RANGE,
        libc::FALLOC_FL_INSERT_RANGE,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
        0x40, // FALLOC_FL_UNSHARE_RANGE
    ] {
        assert_eq!(
            FallocateMode::from_bits(bits),
            Err(Errno::EOPNOTSUPP),
            "{bits:#x}"
        );
    }
    assert_eq!(
        fs.fallocate(f, 0, 0, FallocateMode::ALLOCATE),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        fs.fallocate(f, MAX_FILE_SIZE, 1, FallocateMode::ALLOCATE),
        Err(Errno::EFBIG)
    );
    let d = mkdir(&fs, C, ROOT_INO, "d", 0o755).ino;
    assert_eq!(
        fs.fallocate(d, 0, 1, FallocateMode::ALLOCATE),
        Err(Errno::EISDIR)
    );
}

// ---- locks ----------------------------------------------------------------------------------------

type Outcome = mpsc::Receiver<Result<()>>;

fn waiter() -> (LockCallback, Outcome) {
    let (tx, rx) = mpsc::channel();
    (Box::new(move |r| tx.send(r).unwrap()), rx)
}

const END: u64 = u64::MAX;

#[test]
fn getlk_reports_the_conflicting_lock() {
    let fs = fs();
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o644).ino;
    fs.setlk(f, 1, 100, 199, libc::F_WRLCK, 11).unwrap();
    let l = fs.getlk(f, 2, 150, 150, libc::F_RDLCK, 22).unwrap();
    assert_eq!(
        l,
        LockInfo {
            start: 100,
            end: 199,
            typ: libc::F_WRLCK,
            pid: 11
        }
    );
    // No conflict: outside the range, or the owner's own lock.
    assert_eq!(
        fs.getlk(f, 2, 200, END, libc::F_WRLCK, 22).unwrap().typ,
        libc::F_UNLCK
    );
    assert_eq!(
        fs.getlk(f, 1, 0, END, libc::F_WRLCK, 11).unwrap().typ,
        libc::F_UNLCK
    );
    // Read locks share, writes conflict with reads.
    fs.setlk(f, 3, 300, 399, libc::F_RDLCK, 33).unwrap();
    assert_eq!(
        fs.getlk(f, 2, 300, 300, libc::F_RDLCK, 22).unwrap().typ,
        libc::F_UNLCK
    );
    let l = fs.getlk(f, 2, 350, 500, libc::F_WRLCK, 22).unwrap();
    assert_eq!(
        (l.typ, l.pid, l.start, l.end),
        (libc::F_RDLCK, 33, 300, 399)
    );
    assert_eq!(
        fs.setlk(f, 2, 350, 350, libc::F_WRLCK, 22),
        Err(Errno::EAGAIN)
    );
    assert_eq!(fs.setlk(f, 2, 10, 5, libc::F_WRLCK, 22), Err(Errno::EINVAL));
    assert_eq!(fs.setlk(f, 2, 0, 5, 99, 22), Err(Errno::EINVAL));
}

#[test]
fn record_locks_split_and_merge() {
    let fs = fs();
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o644).ino;
    let probe = |start, end| fs.getlk(f, 2, start, end, libc::F_WRLCK, 2).unwrap();
    fs.setlk(f, 1, 0, 99, libc::F_WRLCK, 1).unwrap();
    // Unlock the middle: two locks remain.
    fs.setlk(f, 1, 40, 59, libc::F_UNLCK, 1).unwrap();
    assert_eq!(probe(40, 59).typ, libc::F_UNLCK);
    let l = probe(0, 50);
    assert_eq!((l.start, l.end), (0, 39));
    let l = probe(50, 200);
    assert_eq!((l.start, l.end), (60, 99));
    // Downgrade part to a read lock: three pieces of two types.
    fs.setlk(f, 1, 70, 79, libc::F_RDLCK, 1).unwrap();
    let l = fs.getlk(f, 2, 70, 79, libc::F_WRLCK, 2).unwrap();
    assert_eq!((l.typ, l.start, l.end), (libc::F_RDLCK, 70, 79));
    assert_eq!(
        fs.getlk(f, 2, 70, 79, libc::F_RDLCK, 2).unwrap().typ,
        libc::F_UNLCK
    );
    // Fill everything with one write lock again: merged into a single range.
    fs.setlk(f, 1, 40, 79, libc::F_WRLCK, 1).unwrap();
    let l = probe(50, 50);
    assert_eq!((l.start, l.end, l.typ), (0, 99, libc::F_WRLCK));
    // Adjacent ranges of the same type merge too.
    fs.setlk(f, 1, 100, 149, libc::F_WRLCK, 1).unwrap();
    let l = probe(120, 120);
    assert_eq!((l.start, l.end), (0, 149));
    // To end of file.
    fs.setlk(f, 1, 1000, END, libc::F_RDLCK, 1).unwrap();
    let l = probe(1 << 50, 1 << 50);
    assert_eq!((l.start, l.end), (1000, END));
    fs.release_locks(f, 1);
    assert_eq!(probe(0, END).typ, libc::F_UNLCK);
}

/// A server that replaces its tree (a durable mount's online rollback)
/// carries the locks over: held locks still conflict in the new tree,
/// waiters are granted there, and a waiter on a file the new tree lacks is
/// answered ESTALE.
#[test]
fn locks_move_to_a_tree_that_replaces_this_one() {
    let old = fs();
    let f = mkfile(&old, C, ROOT_INO, "f", 0o644).ino;
    let g = mkfile(&old, C, ROOT_INO, "g", 0o644).ino;
    assert!(old.take_locks().is_empty(), "nothing locked yet");
    old.setlk(f, 1, 0, 9, libc::F_WRLCK, 1).unwrap();
    let (cb, wf) = waiter();
    old.setlkw(f, 2, 5, 5, libc::F_WRLCK, 2, 2, cb);
    old.setlk(g, 1, 0, 9, libc::F_WRLCK, 1).unwrap();
    let (cb, wg) = waiter();
    old.setlkw(g, 2, 0, 0, libc::F_WRLCK, 2, 3, cb);
    // The new tree has f under the same number, not g.
    let new = fs();
    assert_eq!(mkfile(&new, C, ROOT_INO, "f", 0o644).ino, f);
    let held = old.take_locks();
    assert_eq!(held.len(), 2);
    assert_eq!(
        old.getlk(f, 9, 0, 9, libc::F_WRLCK, 9).unwrap().typ,
        libc::F_UNLCK
    );
    new.adopt_locks(held);
    assert_eq!(wg.try_recv(), Ok(Err(Errno::ESTALE)));
    assert!(wf.try_recv().is_err(), "still waiting");
    assert_eq!(new.setlk(f, 3, 0, 0, libc::F_RDLCK, 3), Err(Errno::EAGAIN));
    // The waiter is answered from the new tree, once.
    new.release_locks(f, 1);
    assert_eq!(wf.try_recv(), Ok(Ok(())));
    let l = new.getlk(f, 9, 5, 5, libc::F_RDLCK, 9).unwrap();
    assert_eq!((l.pid, l.typ), (2, libc::F_WRLCK));
    assert!(wf.try_recv().is_err(), "callbacks run exactly once");
}

#[test]
fn blocked_waiters_are_granted_on_release_and_cancelled_on_close() {
    let fs = fs();
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o644).ino;
    fs.setlk(f, 1, 0, 9, libc::F_WRLCK, 1).unwrap();
    let (cb, w2) = waiter();
    fs.setlkw(f, 2, 5, 5, libc::F_WRLCK, 2, 2, cb);
    let (cb, w3) = waiter();
    fs.setlkw(f, 3, 8, 20, libc::F_RDLCK, 3, 3, cb);
    assert!(w2.try_recv().is_err(), "granted while the range is held");
    assert!(w3.try_recv().is_err());
    // A non-conflicting request is granted at once.
    let (cb, w4) = waiter();
    fs.setlkw(f, 4, 50, 60, libc::F_WRLCK, 4, 4, cb);
    assert_eq!(w4.try_recv(), Ok(Ok(())));

    // Unlocking part of the range wakes the waiter whose range it frees.
    fs.setlk(f, 1, 5, 5, libc::F_UNLCK, 1).unwrap();
    assert_eq!(w2.try_recv(), Ok(Ok(())), "woken by the unlock");
    assert!(w3.try_recv().is_err(), "8..=9 still held by owner 1");
    let l = fs.getlk(f, 9, 5, 5, libc::F_RDLCK, 9).unwrap();
    assert_eq!(
        (l.pid, l.typ),
        (2, libc::F_WRLCK),
        "the waiter now holds its lock"
    );

    // Closing (releasing all of owner 1's locks) grants the next waiter.
    fs.release_locks(f, 1);
    assert_eq!(w3.try_recv(), Ok(Ok(())));
    let l = fs.getlk(f, 9, 15, 15, libc::F_WRLCK, 9).unwrap();
    assert_eq!((l.pid, l.typ), (3, libc::F_RDLCK));

    // A waiter whose owner goes away is cancelled with EINTR, never granted.
    let (cb, w5) = waiter();
    fs.setlkw(f, 5, 0, END, libc::F_WRLCK, 5, 5, cb);
    fs.release_locks(f, 5);
    assert_eq!(w5.try_recv(), Ok(Err(Errno::EINTR)));
    fs.release_locks(f, 2);
    fs.release_locks(f, 3);
    fs.release_locks(f, 4);
    assert_eq!(
        fs.getlk(f, 9, 0, END, libc::F_WRLCK, 9).unwrap().typ,
        libc::F_UNLCK
    );
    assert!(w5.try_recv().is_err(), "callbacks run exactly once");
}

#[test]
fn two_owner_cycle_is_edeadlk() {
    let fs = fs();
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o644).ino;
    fs.setlk(f, 1, 0, 9, libc::F_WRLCK, 1).unwrap();
    fs.setlk(f, 2, 10, 19, libc::F_WRLCK, 2).unwrap();
    let (cb, w1) = waiter();
    fs.setlkw(f, 1, 10, 10, libc::F_WRLCK, 1, 1, cb);
    assert!(w1.try_recv().is_err(), "owner 1 waits for owner 2");
    let (cb, w2) = waiter();
    fs.setlkw(f, 2, 0, 0, libc::F_WRLCK, 2, 2, cb);
    assert_eq!(
        w2.try_recv(),
        Ok(Err(Errno::EDEADLK)),
        "owner 2 would wait for owner 1"
    );
    // Owner 2 gives up its lock: owner 1 proceeds.
    fs.setlk(f, 2, 10, 19, libc::F_UNLCK, 2).unwrap();
    assert_eq!(w1.try_recv(), Ok(Ok(())));
}

#[test]
fn flock_is_whole_file_and_independent_of_record_locks() {
    let fs = fs();
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o644).ino;
    fs.flock(f, 1, libc::F_RDLCK, None).unwrap();
    fs.flock(f, 2, libc::F_RDLCK, None).unwrap();
    assert_eq!(fs.flock(f, 3, libc::F_WRLCK, None), Err(Errno::EAGAIN));
    // Record locks do not see flock locks.
    fs.setlk(f, 3, 0, END, libc::F_WRLCK, 3).unwrap();
    let (cb, w) = waiter();
    fs.flock(f, 3, libc::F_WRLCK, Some((3, cb))).unwrap();
    assert!(w.try_recv().is_err());
    fs.release_flock(f, 1);
    assert!(w.try_recv().is_err(), "owner 2 still shares it");
    fs.flock(f, 2, libc::F_UNLCK, None).unwrap();
    assert_eq!(w.try_recv(), Ok(Ok(())));
    assert_eq!(fs.flock(f, 1, libc::F_RDLCK, None), Err(Errno::EAGAIN));
}

#[test]
fn cancelled_lock_waits_get_eintr_and_leave_no_trace() {
    let fs = fs();
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o644).ino;
    fs.setlk(f, 1, 0, 9, libc::F_WRLCK, 1).unwrap();
    let (cb, w) = waiter();
    fs.setlkw(f, 2, 0, 0, libc::F_WRLCK, 2, 77, cb);
    assert!(w.try_recv().is_err());
    assert!(!fs.cancel_lock_wait(f, 78), "no such token");
    assert!(fs.cancel_lock_wait(f, 77));
    assert_eq!(w.try_recv(), Ok(Err(Errno::EINTR)));
    assert!(!fs.cancel_lock_wait(f, 77), "cancelled once");
    // Releasing the blocker grants nothing to the cancelled request.
    fs.release_locks(f, 1);
    assert!(w.try_recv().is_err());
    assert_eq!(
        fs.getlk(f, 9, 0, END, libc::F_WRLCK, 9).unwrap().typ,
        libc::F_UNLCK
    );
    // A granted request cannot be cancelled any more.
    fs.setlk(f, 1, 0, 9, libc::F_WRLCK, 1).unwrap();
    let (cb, w) = waiter();
    fs.setlkw(f, 2, 0, 0, libc::F_WRLCK, 2, 80, cb);
    fs.release_locks(f, 1);
    assert_eq!(w.try_recv(), Ok(Ok(())));
    assert!(!fs.cancel_lock_wait(f, 80));
    // Flock waits are cancellable too.
    let (cb, w) = waiter();
    fs.flock(f, 3, libc::F_WRLCK, None).unwrap();
    fs.flock(f, 4, libc::F_WRLCK, Some((81, cb))).unwrap();
    assert!(fs.cancel_lock_wait(f, 81));
    assert_eq!(w.try_recv(), Ok(Err(Errno::EINTR)));
}

// ---- rename rules -----------------------------------------------------------------------------

#[test]
fn rename_errors_and_link_counts() {
    let fs = fs();
    let plain = RenameFlags::default();
    let noreplace = RenameFlags {
        noreplace: true,
        exchange: false,
    };
    let exchange = RenameFlags {
        noreplace: false,
        exchange: true,
    };
    let a = mkdir(&fs, C, ROOT_INO, "a", 0o755).ino;
    let b = mkdir(&fs, C, a, "b", 0o755).ino;
    let c = mkdir(&fs, C, b, "c", 0o755).ino;
    let e = mkdir(&fs, C, ROOT_INO, "empty", 0o755).ino;
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o644).ino;
    mkfile(&fs, C, c, "inner", 0o644);

    // A directory into its own subtree.
    assert_eq!(
        fs.rename(ROOT_INO, b"a", c, b"x", plain),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        fs.rename(ROOT_INO, b"a", a, b"x", plain),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        fs.rename(ROOT_INO, b"a", c, b"inner", exchange),
        Err(Errno::EINVAL)
    );
    // Onto an ancestor of the source, or any non-empty directory.
    assert_eq!(
        fs.rename(b, b"c", ROOT_INO, b"a", plain),
        Err(Errno::ENOTEMPTY)
    );
    assert_eq!(
        fs.rename(ROOT_INO, b"empty", a, b"b", plain),
        Err(Errno::ENOTEMPTY)
    );
    // Type mismatches.
    assert_eq!(
        fs.rename(ROOT_INO, b"f", ROOT_INO, b"empty", plain),
        Err(Errno::EISDIR)
    );
    assert_eq!(
        fs.rename(ROOT_INO, b"empty", ROOT_INO, b"f", plain),
        Err(Errno::ENOTDIR)
    );
    // Flags.
    assert_eq!(
        fs.rename(ROOT_INO, b"f", c, b"inner", noreplace),
        Err(Errno::EEXIST)
    );
    assert_eq!(
        fs.rename(ROOT_INO, b"f", c, b"nope", exchange),
        Err(Errno::ENOENT)
    );
    assert_eq!(
        fs.rename(ROOT_INO, b"nope", c, b"inner", plain),
        Err(Errno::ENOENT)
    );
    assert_eq!(fs.rename(ROOT_INO, b".", c, b"x", plain), Err(Errno::EBUSY));
    assert_eq!(fs.rename(a, b"b", c, b"..", plain), Err(Errno::EBUSY));
    assert_eq!(
        RenameFlags::from_bits(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        RenameFlags::from_bits(libc::RENAME_WHITEOUT),
        Err(Errno::EINVAL)
    );
    assert_eq!(RenameFlags::from_bits(1 << 10), Err(Errno::EINVAL));
    assert_eq!(
        fs.rename(f, b"x", ROOT_INO, b"y", plain),
        Err(Errno::ENOTDIR)
    );

    // Two names of one node: nothing happens, both stay.
    fs.link(f, ROOT_INO, b"f2")
        .map(|x| fs.forget(x.ino, 1))
        .unwrap();
    fs.rename(ROOT_INO, b"f", ROOT_INO, b"f2", plain).unwrap();
    assert_eq!(fs.lookup_noref(ROOT_INO, b"f").unwrap().ino, f);
    assert_eq!(fs.getattr(f).unwrap().nlink, 2);
    fs.unlink(ROOT_INO, b"f2").unwrap();

    // Moving a directory moves a link from the old parent to the new one.
    let nl = |ino| fs.getattr(ino).unwrap().nlink;
    assert_eq!((nl(ROOT_INO), nl(a), nl(e)), (4, 3, 2));
    fs.rename(a, b"b", e, b"b", plain).unwrap();
    assert_eq!((nl(a), nl(e)), (2, 3));
    assert_eq!(fs.lookup_noref(b, b"..").unwrap().ino, e);
    // Replacing an empty directory: the victim is gone, the parent loses its link.
    mkdir(&fs, C, a, "victim", 0o755);
    assert_eq!(nl(a), 3);
    fs.rename(e, b"b", a, b"victim", plain).unwrap();
    assert_eq!((nl(a), nl(e)), (3, 2));
    assert_eq!(fs.lookup_noref(a, b"victim").unwrap().ino, b);
    // Exchanging a directory and a file across parents swaps the links too.
    fs.rename(a, b"victim", ROOT_INO, b"f", exchange).unwrap();
    assert_eq!((nl(ROOT_INO), nl(a)), (5, 2));
    assert_eq!(fs.lookup_noref(ROOT_INO, b"f").unwrap().ino, b);
    assert_eq!(fs.lookup_noref(a, b"victim").unwrap().ino, f);
    assert_eq!(fs.lookup_noref(b, b"..").unwrap().ino, ROOT_INO);
}

/// Linux drops setgid on fallocate, punch-hole and zero-range by a caller
/// outside the file's group even without group-exec (xfstests 683-685), keeps
/// it for a member when group-exec is off, and never touches root's.
#[test]
fn fallocate_kills_setgid_of_non_members() {
    let fs = fs();
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o666).ino;
    fs.write(C, f, 0, &vec![1u8; 3 * PAGE_SIZE], false).unwrap();
    let mode_of = |fs: &Fs| fs.getattr(f).unwrap().perm;
    let modes = [
        FallocateMode::ALLOCATE,
        FallocateMode::from_bits(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE).unwrap(),
        FallocateMode::from_bits(libc::FALLOC_FL_ZERO_RANGE).unwrap(),
    ];
    let not_member = |_gid: u32| false;
    let member = |gid: u32| gid == 0;
    for m in modes {
        set(
            &fs,
            f,
            SetAttr {
                mode: Some(0o6666),
                ..Default::default()
            },
        );
        fs.fallocate_as(USER, &not_member, true, f, 0, P, m)
            .unwrap();
        assert_eq!(
            mode_of(&fs),
            0o666,
            "{m:?}: non-member loses setuid and setgid"
        );

        set(
            &fs,
            f,
            SetAttr {
                mode: Some(0o2666),
                ..Default::default()
            },
        );
        fs.fallocate_as(USER, &member, true, f, 0, P, m).unwrap();
        assert_eq!(
            mode_of(&fs),
            0o2666,
            "{m:?}: a member keeps setgid without group-exec"
        );

        set(
            &fs,
            f,
            SetAttr {
                mode: Some(0o2676),
                ..Default::default()
            },
        );
        fs.fallocate_as(USER, &member, true, f, 0, P, m).unwrap();
        assert_eq!(
            mode_of(&fs),
            0o676,
            "{m:?}: group-exec setgid goes even for a member"
        );

        set(
            &fs,
            f,
            SetAttr {
                mode: Some(0o6777),
                ..Default::default()
            },
        );
        fs.fallocate_as(C, &not_member, false, f, 0, P, m).unwrap();
        assert_eq!(mode_of(&fs), 0o6777, "{m:?}: root keeps both");
    }
}

/// Every other data change by a caller without CAP_FSETID drops setgid as
/// fallocate does (Linux's `setattr_should_drop_sgid`): a write, a truncate
/// (and so `open(O_TRUNC)`, a SETATTR through FUSE), the destination of a
/// copy_file_range, and a chown (against the group before it). Each is
/// checked outside the file's group, in it by a supplementary group, and in
/// it by the caller's own gid; root keeps both bits.
#[test]
fn data_changes_kill_setgid_of_non_members() {
    type Change = fn(&Fs, Ctx, &dyn Fn(u32) -> bool, u64, u64);
    let changes: [(&str, Change); 4] = [
        ("write", |fs, ctx, g, f, _| {
            fs.write_as(ctx, g, ctx.uid != 0, f, 0, b"x", false)
                .unwrap();
        }),
        ("truncate", |fs, ctx, g, f, _| {
            let t = SetAttr {
                size: Some(P),
                ..Default::default()
            };
            fs.setattr_as(ctx, g, f, &t).unwrap();
        }),
        ("copy_file_range", |fs, ctx, g, f, src| {
            assert_eq!(fs.copy_file_range_as(ctx, g, src, 0, f, 0, 4).unwrap(), 4);
        }),
        ("chown", |fs, ctx, g, f, _| {
            // To the caller's own uid, the group unchanged: the check is
            // against the group the file had.
            let c = SetAttr {
                uid: Some(ctx.uid),
                ..Default::default()
            };
            fs.setattr_as(ctx, g, f, &c).unwrap();
        }),
    ];
    let fs = fs();
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o666).ino;
    let src = mkfile(&fs, C, ROOT_INO, "src", 0o644).ino;
    fs.write(C, src, 0, b"data", false).unwrap();
    let asked = std::cell::Cell::new(0);
    let not_member = |_gid: u32| {
        asked.set(asked.get() + 1);
        false
    };
    let member = |gid: u32| gid == 0;
    let reset = |mode: u32| {
        let m = SetAttr {
            mode: Some(mode),
            uid: Some(USER.uid),
            gid: Some(0),
            ..Default::default()
        };
        set(&fs, f, m);
        // A chown by root drops setuid: the mode again.
        set(
            &fs,
            f,
            SetAttr {
                mode: Some(mode),
                ..Default::default()
            },
        );
        assert_eq!(fs.getattr(f).unwrap().perm as u32, mode);
    };
    let mode = |fs: &Fs| fs.getattr(f).unwrap().perm;
    for (name, change) in changes {
        // The owner, outside group 0: loses both (the owner is no exception).
        reset(0o6666);
        asked.set(0);
        change(&fs, USER, &not_member, f, src);
        assert_eq!(
            mode(&fs),
            0o666,
            "{name}: non-member loses setuid and setgid"
        );
        assert_eq!(asked.get(), 1, "{name}: the groups are asked once");

        // A member by a supplementary group keeps setgid without group-exec.
        reset(0o6666);
        change(&fs, USER, &member, f, src);
        assert_eq!(mode(&fs), 0o2666, "{name}: a member keeps setgid");

        // So does a caller whose own gid is the file's: the groups are not asked.
        reset(0o2666);
        asked.set(0);
        let own = Ctx { gid: 0, ..USER };
        change(&fs, own, &not_member, f, src);
        assert_eq!(mode(&fs), 0o2666, "{name}: the file's group keeps setgid");
        assert_eq!(asked.get(), 0, "{name}: the caller's gid decided");

        // With group-exec, setgid goes even for a member.
        reset(0o2676);
        change(&fs, USER, &member, f, src);
        assert_eq!(mode(&fs), 0o676, "{name}: group-exec setgid goes");

        // Root (CAP_FSETID) keeps both, but for chown, which drops setuid
        // for everyone (generic/193).
        reset(0o6666);
        change(&fs, Ctx { uid: 0, ..USER }, &not_member, f, src);
        let kept = if name == "chown" { 0o2666 } else { 0o6666 };
        assert_eq!(mode(&fs), kept, "{name}: root keeps its bits");
    }
    // Without the caller's groups, write, setattr and copy_file_range take
    // the caller to be a member, as before the `_as` variants.
    reset(0o2666);
    fs.write(USER, f, 0, b"x", false).unwrap();
    assert_eq!(mode(&fs), 0o2666);
}

/// chown(f, -1, -1) reaches the engine as a setattr of nothing; like tmpfs it
/// still updates ctime (and nothing else).
#[test]
fn empty_setattr_updates_ctime() {
    let fs = fs();
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o644).ino;
    age(&fs, &[f]);
    fs.setattr(C, f, &SetAttr::default()).unwrap();
    assert_eq!(changed(&fs, f), (false, false, true));
}

/// The kernel decodes a file handle of an inode it no longer holds by looking
/// up "." in it (and ".." for a directory's parent): both must answer for any
/// existing inode, files included.
#[test]
fn dot_lookup_answers_for_any_inode() {
    let fs = fs();
    let d = mkdir(&fs, C, ROOT_INO, "d", 0o755).ino;
    let f = mkfile(&fs, C, d, "f", 0o644).ino;
    assert_eq!(fs.lookup(f, b".").unwrap().ino, f);
    fs.forget(f, 1);
    assert_eq!(fs.lookup(d, b".").unwrap().ino, d);
    fs.forget(d, 1);
    assert_eq!(fs.lookup(d, b"..").unwrap().ino, ROOT_INO);
    assert_eq!(fs.lookup(f, b".."), Err(Errno::ENOTDIR));
    fs.unlink(d, b"f").unwrap();
    assert_eq!(
        fs.lookup(f, b".").map(|a| a.ino),
        Err(Errno::ENOENT),
        "gone once unlinked and forgotten"
    );
    // Unlinked while the kernel still holds it (its FORGET not yet served):
    // the node lives on for its holder, but a handle to it is stale, as on
    // tmpfs (the kernel asks for "." only of an inode it no longer has).
    let g = mkfile(&fs, C, d, "g", 0o644).ino;
    assert_eq!(fs.lookup(d, b"g").unwrap().ino, g, "the kernel's reference");
    fs.unlink(d, b"g").unwrap();
    assert_eq!(fs.getattr(g).unwrap().nlink, 0);
    assert_eq!(fs.lookup(g, b".").map(|a| a.ino), Err(Errno::ENOENT));
    fs.forget(g, 1);
}

/// Small files are stored inline up to `INLINE_MAX`; every transition at the
/// limit behaves exactly as pages would: contents, size, `st_blocks`,
/// capacity, SEEK_DATA/SEEK_HOLE, reads beyond the end.
#[test]
fn inline_files_behave_as_page_zero_across_the_limit() {
    const ALLOC: FallocateMode = FallocateMode {
        keep_size: false,
        punch_hole: false,
        zero_range: false,
    };
    let fs = fs();
    let used = |fs: &Fs| fs.statfs().blocks - fs.statfs().bfree;
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o644).ino;
    let m = INLINE_MAX as u64;
    let pattern = |n: usize, seed: u8| -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(7) ^ seed | 1)
            .collect()
    };
    // Up to the limit: inline, one page as far as anyone can tell.
    let a = pattern(INLINE_MAX, 1);
    fs.write(C, f, 0, &a, false).unwrap();
    assert!(fs.stores_inline(f));
    assert_eq!(fs.getattr(f).unwrap().blocks, P / 512);
    assert_eq!(used(&fs), 1);
    assert_eq!(fs.read_vec(f, 0, 3 * INLINE_MAX).unwrap(), a);
    assert_eq!(fs.read_vec(f, m, 10).unwrap(), b"");
    assert_eq!(fs.lseek(f, 0, libc::SEEK_HOLE).unwrap(), m);
    // Across it: page 0 becomes a page, still one page.
    fs.write(C, f, m - 1, b"XY", false).unwrap();
    assert!(!fs.stores_inline(f));
    assert_eq!(used(&fs), 1);
    let mut want = a.clone();
    want[INLINE_MAX - 1] = b'X';
    want.push(b'Y');
    assert_eq!(fs.read_vec(f, 0, 2 * INLINE_MAX + 1).unwrap(), want);
    // Truncated below: inline again, old bytes gone; grown again: zeros.
    let size = |s| SetAttr {
        size: Some(s),
        ..Default::default()
    };
    fs.setattr(C, f, &size(10)).unwrap();
    assert!(fs.stores_inline(f));
    fs.setattr(C, f, &size(m + 100)).unwrap();
    let back = fs.read_vec(f, 0, INLINE_MAX + 200).unwrap();
    assert_eq!(back.len(), INLINE_MAX + 100);
    assert_eq!(&back[..10], &a[..10]);
    assert!(back[10..].iter().all(|&b| b == 0));
    assert_eq!(used(&fs), 1);
    // A hole before data past page 0: two pages, the gap reads zeros.
    fs.write(C, f, 3 * P, b"far", false).unwrap();
    assert_eq!(used(&fs), 2);
    assert_eq!(fs.lseek(f, 20, libc::SEEK_HOLE).unwrap(), P);
    assert_eq!(fs.lseek(f, P, libc::SEEK_DATA).unwrap(), 3 * P);
    assert_eq!(fs.read_vec(f, 3 * P - 2, 10).unwrap(), b"\0\0far");
    // Truncate to 0 frees everything; fallocate of page 0 alone stays inline.
    fs.setattr(C, f, &size(0)).unwrap();
    assert_eq!(used(&fs), 0);
    fs.fallocate(f, 0, 100, ALLOC).unwrap();
    assert!(fs.stores_inline(f));
    assert_eq!(used(&fs), 1);
    assert_eq!(fs.read_vec(f, 0, 200).unwrap(), vec![0; 100]);
    // A punch is clamped to the size (100): page 0 stays, zeroed, as with
    // pages; fallocate across the limit turns the file into pages.
    let punch = FallocateMode {
        keep_size: true,
        punch_hole: true,
        zero_range: false,
    };
    fs.write(C, f, 0, b"zz", false).unwrap();
    fs.fallocate(f, 0, P, punch).unwrap();
    assert_eq!(used(&fs), 1);
    assert!(fs.stores_inline(f));
    assert_eq!(fs.read_vec(f, 0, 200).unwrap(), vec![0; 100]);
    fs.write(C, f, 0, b"abc", false).unwrap();
    fs.fallocate(f, 0, P + 1, ALLOC).unwrap();
    assert!(!fs.stores_inline(f));
    assert_eq!(used(&fs), 2);
    assert_eq!(&fs.read_vec(f, 0, 4).unwrap(), b"abc\0");
    // copy_file_range from an inline file into the middle of another one,
    // across the limit of the destination.
    let g = mkfile(&fs, C, ROOT_INO, "g", 0o644).ino;
    let src = pattern(300, 9);
    fs.write(C, g, 0, &src, false).unwrap();
    let h = mkfile(&fs, C, ROOT_INO, "h", 0o644).ino;
    fs.write(C, h, 0, b"h", false).unwrap();
    assert_eq!(fs.copy_file_range(C, g, 0, h, m - 100, 1000).unwrap(), 300);
    assert!(!fs.stores_inline(h));
    let got = fs.read_vec(h, 0, 4 * INLINE_MAX).unwrap();
    assert_eq!(got.len(), INLINE_MAX + 200);
    assert_eq!(got[0], b'h');
    assert!(got[1..INLINE_MAX - 100].iter().all(|&b| b == 0));
    assert_eq!(&got[INLINE_MAX - 100..], &src[..]);
    // An overwrite of the same size keeps the file inline.
    fs.write(C, g, 0, &pattern(300, 3), false).unwrap();
    assert!(fs.stores_inline(g));
    assert_eq!(fs.read_vec(g, 0, 400).unwrap(), pattern(300, 3));
}

#[test]
fn chown_by_root_to_the_same_owner_clears_setuid() {
    // Linux asks to kill privileges on every chown of a non-directory
    // (generic/193): setuid always, setgid only with group execute.
    let fs = fs();
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o6644).ino;
    let a = set(
        &fs,
        f,
        SetAttr {
            uid: Some(0),
            ..Default::default()
        },
    );
    assert_eq!(a.perm, 0o2644);
    set(
        &fs,
        f,
        SetAttr {
            mode: Some(0o6754),
            ..Default::default()
        },
    );
    let a = set(
        &fs,
        f,
        SetAttr {
            gid: Some(0),
            ..Default::default()
        },
    );
    assert_eq!(a.perm, 0o754);
    // Directories keep them.
    let d = mkdir(&fs, C, ROOT_INO, "d", 0o6755).ino;
    let a = set(
        &fs,
        d,
        SetAttr {
            uid: Some(0),
            ..Default::default()
        },
    );
    assert_eq!(a.perm & 0o6000, 0o6000);
}

#[test]
fn rename_whiteout_leaves_a_char_device_at_the_source() {
    let fs = fs();
    let plain = RenameFlags::default();
    let d = mkdir(&fs, C, ROOT_INO, "d", 0o755).ino;
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o644).ino;
    fs.rename_whiteout(USER, ROOT_INO, b"f", d, b"g", plain)
        .unwrap();
    assert_eq!(fs.lookup(d, b"g").unwrap().ino, f);
    let w = fs.lookup(ROOT_INO, b"f").unwrap();
    assert_eq!(w.kind, FileType::CharDevice);
    assert_eq!((w.rdev, w.perm, w.nlink), (0, 0, 1));
    assert_eq!((w.uid, w.gid), (USER.uid, USER.gid));
    assert_ne!(w.ino, f);

    // Over an existing target, in one directory: the target is replaced.
    mkfile(&fs, C, d, "h", 0o644);
    fs.rename_whiteout(C, d, b"g", d, b"h", plain).unwrap();
    assert_eq!(fs.lookup(d, b"h").unwrap().ino, f);
    assert_eq!(fs.lookup(d, b"g").unwrap().kind, FileType::CharDevice);

    // Errors leave everything as it was, and use no inode.
    let exchange = RenameFlags {
        noreplace: false,
        exchange: true,
    };
    assert_eq!(
        fs.rename_whiteout(C, d, b"h", ROOT_INO, b"f", exchange),
        Err(Errno::EINVAL)
    );
    let noreplace = RenameFlags {
        noreplace: true,
        exchange: false,
    };
    let before = fs.statfs();
    assert_eq!(
        fs.rename_whiteout(C, d, b"h", ROOT_INO, b"f", noreplace),
        Err(Errno::EEXIST)
    );
    assert_eq!(
        fs.rename_whiteout(C, d, b"missing", ROOT_INO, b"x", plain),
        Err(Errno::ENOENT)
    );
    assert_eq!(fs.statfs().ffree, before.ffree);
    assert_eq!(fs.lookup(d, b"h").unwrap().ino, f);
}

/// A time past its second would reach the journal as a record that does
/// not decode again: refused as utimensat refuses it.
#[test]
fn nanoseconds_out_of_range_are_einval() {
    let fs = fs();
    let f = mkfile(&fs, C, ROOT_INO, "f", 0o644).ino;
    let bad = Timespec {
        sec: 1,
        nsec: 1_000_000_000,
    };
    for s in [
        SetAttr {
            atime: Some(SetTime::At(bad)),
            ..Default::default()
        },
        SetAttr {
            mtime: Some(SetTime::At(bad)),
            ..Default::default()
        },
        SetAttr {
            ctime: Some(bad),
            ..Default::default()
        },
    ] {
        assert_eq!(fs.setattr(C, f, &s), Err(Errno::EINVAL));
    }
    assert_ne!(fs.getattr(f).unwrap().mtime, bad);
}
