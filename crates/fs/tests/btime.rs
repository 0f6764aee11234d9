//! Creation time (btime, statx's `stx_btime`) through the engine's API: set
//! when a node is made, to the nanosecond, and never changed after: not by
//! setattr, writes, truncate, renames, links, flags or xattrs. Snapshots and
//! clones show it; replay of a recorded create gives it back.

use memfs_fs::*;

const ROOT: Ctx = Ctx::ROOT;

fn fs() -> Fs {
    Fs::new(Config {
        capacity: 1 << 26,
        max_inodes: 1 << 12,
    })
}

/// A time far from now, so that a field set to it cannot be mistaken for
/// one the engine set itself.
const OLD: Timespec = Timespec {
    sec: 1_000_000_000,
    nsec: 123_456_789,
};

#[test]
fn every_kind_of_node_is_born_with_btime_equal_to_its_times() {
    let fs = fs();
    let (f, _) = fs.create(ROOT, ROOT_INO, b"f", 0o644, true).unwrap();
    let d = fs.mkdir(ROOT, ROOT_INO, b"d", 0o755).unwrap();
    let s = fs.symlink(ROOT, ROOT_INO, b"s", b"f").unwrap();
    let c = fs
        .mknod(ROOT, ROOT_INO, b"c", libc::S_IFCHR | 0o600, 0x0102)
        .unwrap();
    let p = fs
        .mknod(ROOT, ROOT_INO, b"p", libc::S_IFIFO | 0o600, 0)
        .unwrap();
    let t = fs.tmpfile(ROOT, ROOT_INO, 0o600, false).unwrap();
    for a in [f, d, s, c, p, t] {
        assert_eq!(a.btime, a.ctime, "{:?}", a.kind);
        assert_eq!(a.btime, a.mtime, "{:?}", a.kind);
        assert_eq!(fs.getattr(a.ino).unwrap().btime, a.btime, "{:?}", a.kind);
    }
    // The device number moved out of the common metadata: still shown.
    assert_eq!(fs.getattr(c.ino).unwrap().rdev, 0x0102);
    assert_eq!(fs.getattr(p.ino).unwrap().rdev, 0);
}

#[test]
fn nothing_after_creation_changes_btime() {
    let fs = fs();
    let (a, _) = fs.create(ROOT, ROOT_INO, b"f", 0o644, true).unwrap();
    let born = a.btime;
    let check = |what: &str| {
        assert_eq!(fs.getattr(a.ino).unwrap().btime, born, "after {what}");
    };
    // Every other time set far back: btime must not follow any of them.
    let set = SetAttr {
        atime: Some(SetTime::At(OLD)),
        mtime: Some(SetTime::At(OLD)),
        ctime: Some(OLD),
        ..Default::default()
    };
    let after = fs.setattr(ROOT, a.ino, &set).unwrap();
    assert_eq!((after.ctime, after.mtime, after.atime), (OLD, OLD, OLD));
    check("utimens and ctime");
    fs.write(ROOT, a.ino, 0, b"data", false).unwrap();
    check("write");
    let set = SetAttr {
        mode: Some(0o600),
        uid: Some(7),
        gid: Some(8),
        size: Some(1),
        ..Default::default()
    };
    fs.setattr(ROOT, a.ino, &set).unwrap();
    check("chmod, chown, truncate");
    fs.rename(ROOT_INO, b"f", ROOT_INO, b"g", RenameFlags::default())
        .unwrap();
    check("rename");
    let l = fs.link(a.ino, ROOT_INO, b"h").unwrap();
    assert_eq!(l.btime, born, "a hard link shares the node's btime");
    check("link");
    fs.setxattr(a.ino, b"user.x", b"1", XattrMode::Any).unwrap();
    check("setxattr");
    fs.set_flags(ROOT, a.ino, FS_NODUMP_FL).unwrap();
    check("set_flags");
    fs.unlink(ROOT_INO, b"g").unwrap();
    check("unlink of one name");
    assert_eq!(fs.lookup_noref(ROOT_INO, b"h").unwrap().btime, born);
}

#[test]
fn snapshots_and_clones_show_btime() {
    let fs = fs();
    let (a, _) = fs.create(ROOT, ROOT_INO, b"f", 0o644, true).unwrap();
    let snap = fs.snapshot_create(b"s").unwrap();
    // Changed and then removed in the live tree: the snapshot keeps a copy.
    fs.setattr(
        ROOT,
        a.ino,
        &SetAttr {
            ctime: Some(OLD),
            ..Default::default()
        },
    )
    .unwrap();
    fs.unlink(ROOT_INO, b"f").unwrap();
    let frozen = fs.snap_getattr(snap.id, a.ino).unwrap();
    assert_eq!(frozen.btime, a.btime);
    assert_eq!(frozen.ctime, a.ctime);
    let clone = fs
        .clone_snapshot(
            b"s",
            Config {
                capacity: 1 << 26,
                max_inodes: 1 << 12,
            },
        )
        .unwrap();
    let c = clone.lookup_noref(ROOT_INO, b"f").unwrap();
    assert_eq!(c.btime, a.btime);
}

#[test]
fn replay_installs_a_create_with_its_btime_and_keeps_it() {
    let fs = fs();
    let root = fs.getattr(ROOT_INO).unwrap();
    let mut attr = root;
    attr.ino = 50;
    attr.kind = FileType::RegularFile;
    attr.perm = 0o644;
    attr.nlink = 1;
    attr.size = 0;
    attr.ctime = OLD;
    attr.btime = OLD;
    fs.apply(&Mutation::Create {
        parent: root,
        name: b"r",
        attr,
        symlink_target: None,
    });
    assert_eq!(fs.getattr(50).unwrap().btime, OLD);
    // A later record carries a newer ctime and, decoded from the journal,
    // btime = ctime: replay must not copy it.
    let mut later = attr;
    later.ctime = Timespec::now();
    later.btime = later.ctime;
    fs.apply(&Mutation::SetAttr { attr: later });
    let now = fs.getattr(50).unwrap();
    assert_eq!((now.ctime, now.btime), (later.ctime, OLD));
    // An image's btime record.
    let b = Timespec {
        sec: -3,
        nsec: 999_999_999,
    };
    fs.apply_btime(50, b);
    assert_eq!(fs.getattr(50).unwrap().btime, b);
}
