//! Inode flags through the engine's API: round trip, who may set what, each
//! operation an immutable or append-only node refuses (EPERM, to root too,
//! as on ext4 and tmpfs), noatime, and replay of the recorded change.

use std::sync::{Arc, Mutex};

use memfs_fs::*;

const ROOT: Ctx = Ctx::ROOT;
const USER: Ctx = Ctx {
    uid: 1000,
    gid: 1000,
    pid: 1,
};

fn fs() -> Fs {
    Fs::new(Config {
        capacity: 1 << 26,
        max_inodes: 1 << 12,
    })
}

fn file(fs: &Fs, name: &str) -> u64 {
    let (a, _) = fs
        .create(ROOT, ROOT_INO, name.as_bytes(), 0o666, true)
        .unwrap();
    fs.write(ROOT, a.ino, 0, b"hello", false).unwrap();
    a.ino
}

fn eperm<T: std::fmt::Debug>(r: Result<T>, what: &str) {
    assert_eq!(r.unwrap_err(), Errno::EPERM, "{what}");
}

/// statx's one read: the attributes `getattr` gives and the flags
/// `get_flags` gives, for files and directories, and ENOENT for a node that
/// is gone.
#[test]
fn getattr_flags_is_getattr_and_get_flags() {
    let fs = fs();
    let f = file(&fs, "f");
    let d = fs.mkdir(ROOT, ROOT_INO, b"d", 0o755).unwrap().ino;
    fs.set_flags(ROOT, f, FS_APPEND_FL | FS_NODUMP_FL).unwrap();
    fs.set_flags(ROOT, d, FS_NOATIME_FL).unwrap();
    for (ino, flags) in [
        (f, FS_APPEND_FL | FS_NODUMP_FL),
        (d, FS_NOATIME_FL),
        (ROOT_INO, 0),
    ] {
        let (attr, got) = fs.getattr_flags(ino).unwrap();
        assert_eq!(got, flags);
        assert_eq!(got, fs.get_flags(ino).unwrap());
        assert_eq!(attr, fs.getattr(ino).unwrap());
    }
    let g = file(&fs, "g");
    fs.unlink(ROOT_INO, b"g").unwrap();
    // Its open (create's) and lookup go: the node with them.
    fs.release(g);
    fs.forget(g, 1);
    assert_eq!(fs.getattr_flags(g).unwrap_err(), Errno::ENOENT);
}

#[test]
fn flags_round_trip_and_validation() {
    let fs = fs();
    let f = file(&fs, "f");
    assert_eq!(fs.get_flags(f).unwrap(), 0);
    let before = fs.getattr(f).unwrap().ctime;
    let all = FS_APPEND_FL | FS_IMMUTABLE_FL | FS_NODUMP_FL | FS_NOATIME_FL;
    let attr = fs.set_flags(ROOT, f, all).unwrap();
    assert!(attr.ctime >= before);
    assert_eq!(fs.get_flags(f).unwrap(), all);
    fs.set_flags(ROOT, f, 0).unwrap();
    assert_eq!(fs.get_flags(f).unwrap(), 0);
    // Bits tmpfs does not keep (FS_SYNC_FL, FS_EXTENT_FL...) are refused.
    assert_eq!(fs.set_flags(ROOT, f, 0x8).unwrap_err(), Errno::EOPNOTSUPP);
    assert_eq!(
        fs.set_flags(ROOT, f, 0x0008_0000).unwrap_err(),
        Errno::EOPNOTSUPP
    );
    // Directories carry flags; symlinks and devices do not.
    let d = fs.mkdir(ROOT, ROOT_INO, b"d", 0o755).unwrap().ino;
    fs.set_flags(ROOT, d, FS_NODUMP_FL).unwrap();
    assert_eq!(fs.get_flags(d).unwrap(), FS_NODUMP_FL);
    let l = fs.symlink(ROOT, ROOT_INO, b"l", b"f").unwrap().ino;
    assert_eq!(
        fs.set_flags(ROOT, l, FS_NODUMP_FL).unwrap_err(),
        Errno(libc::ENOTTY)
    );
    assert_eq!(fs.set_flags(ROOT, 9999, 0).unwrap_err(), Errno::ENOENT);
}

#[test]
fn only_owner_sets_flags_and_only_root_append_or_immutable() {
    let fs = fs();
    let f = file(&fs, "f");
    // Not the owner: EPERM even for nodump.
    eperm(fs.set_flags(USER, f, FS_NODUMP_FL), "non-owner sets nodump");
    fs.setattr(
        ROOT,
        f,
        &SetAttr {
            uid: Some(USER.uid),
            ..Default::default()
        },
    )
    .unwrap();
    fs.set_flags(USER, f, FS_NODUMP_FL | FS_NOATIME_FL).unwrap();
    eperm(fs.set_flags(USER, f, FS_APPEND_FL), "owner sets append");
    eperm(
        fs.set_flags(USER, f, FS_IMMUTABLE_FL),
        "owner sets immutable",
    );
    fs.set_flags(ROOT, f, FS_IMMUTABLE_FL).unwrap();
    eperm(fs.set_flags(USER, f, 0), "owner clears immutable");
    // Leaving the privileged bits as they are is allowed to the owner.
    fs.set_flags(USER, f, FS_IMMUTABLE_FL | FS_NODUMP_FL)
        .unwrap();
    assert_eq!(fs.get_flags(f).unwrap(), FS_IMMUTABLE_FL | FS_NODUMP_FL);
}

#[test]
fn immutable_file_refuses_every_change() {
    let fs = fs();
    let f = file(&fs, "f");
    fs.setxattr(f, b"user.a", b"1", XattrMode::Any).unwrap();
    fs.set_flags(ROOT, f, FS_IMMUTABLE_FL).unwrap();
    let set = |s: SetAttr| fs.setattr(ROOT, f, &s);
    eperm(fs.write(ROOT, f, 0, b"x", false), "write");
    eperm(fs.write(ROOT, f, 0, b"x", true), "append write");
    eperm(
        set(SetAttr {
            size: Some(0),
            ..Default::default()
        }),
        "truncate",
    );
    eperm(
        set(SetAttr {
            mode: Some(0o600),
            ..Default::default()
        }),
        "chmod",
    );
    eperm(
        set(SetAttr {
            uid: Some(1),
            ..Default::default()
        }),
        "chown",
    );
    eperm(
        set(SetAttr {
            mtime: Some(SetTime::Now),
            ..Default::default()
        }),
        "touch",
    );
    eperm(
        set(SetAttr {
            atime: Some(SetTime::At(Timespec { sec: 1, nsec: 0 })),
            ..Default::default()
        }),
        "utimes",
    );
    eperm(
        fs.fallocate(f, 0, 4096, FallocateMode::ALLOCATE),
        "fallocate",
    );
    eperm(fs.setxattr(f, b"user.b", b"1", XattrMode::Any), "setxattr");
    eperm(fs.removexattr(f, b"user.a"), "removexattr");
    eperm(fs.link(f, ROOT_INO, b"g"), "link");
    eperm(fs.unlink(ROOT_INO, b"f"), "unlink");
    eperm(
        fs.rename(ROOT_INO, b"f", ROOT_INO, b"g", RenameFlags::default()),
        "rename",
    );
    let other = file(&fs, "o");
    eperm(
        fs.rename(ROOT_INO, b"o", ROOT_INO, b"f", RenameFlags::default()),
        "rename over it",
    );
    eperm(fs.open(f, libc::O_WRONLY), "open for write");
    eperm(fs.open(f, libc::O_RDONLY | libc::O_TRUNC), "open O_TRUNC");
    eperm(
        fs.copy_file_range(ROOT, other, 0, f, 0, 5),
        "copy_file_range into it",
    );
    // Reading, opening read-only and chown(-1, -1) still work.
    fs.open(f, libc::O_RDONLY).unwrap();
    fs.release(f);
    assert_eq!(fs.read_vec(f, 0, 10).unwrap(), b"hello");
    fs.setattr(ROOT, f, &SetAttr::default()).unwrap();
    // Nothing changed.
    let a = fs.getattr(f).unwrap();
    assert_eq!((a.size, a.perm, a.nlink), (5, 0o666, 1));
    assert_eq!(fs.getxattr(f, b"user.a").unwrap(), b"1");
    // Clearing the flag lifts it all.
    fs.set_flags(ROOT, f, 0).unwrap();
    fs.write(ROOT, f, 0, b"x", false).unwrap();
    fs.unlink(ROOT_INO, b"f").unwrap();
}

#[test]
fn append_only_file_accepts_only_appends() {
    let fs = fs();
    let f = file(&fs, "f");
    fs.set_flags(ROOT, f, FS_APPEND_FL).unwrap();
    eperm(fs.write(ROOT, f, 0, b"x", false), "write in place");
    assert_eq!(fs.write(ROOT, f, 0, b" world", true).unwrap(), 6);
    assert_eq!(fs.read_vec(f, 0, 100).unwrap(), b"hello world");
    eperm(
        fs.open(f, libc::O_WRONLY),
        "open for write without O_APPEND",
    );
    eperm(
        fs.open(f, libc::O_WRONLY | libc::O_APPEND | libc::O_TRUNC),
        "open O_TRUNC",
    );
    fs.open(f, libc::O_WRONLY | libc::O_APPEND).unwrap();
    fs.release(f);
    eperm(
        fs.setattr(
            ROOT,
            f,
            &SetAttr {
                size: Some(0),
                ..Default::default()
            },
        ),
        "truncate",
    );
    eperm(
        fs.setattr(
            ROOT,
            f,
            &SetAttr {
                mode: Some(0o600),
                ..Default::default()
            },
        ),
        "chmod",
    );
    // Touching to "now" is allowed on append-only files (notify_change).
    fs.setattr(
        ROOT,
        f,
        &SetAttr {
            mtime: Some(SetTime::Now),
            ..Default::default()
        },
    )
    .unwrap();
    eperm(
        fs.fallocate(
            f,
            0,
            4096,
            FallocateMode {
                punch_hole: true,
                keep_size: true,
                zero_range: false,
            },
        ),
        "punch hole",
    );
    fs.fallocate(f, 0, 8192, FallocateMode::ALLOCATE).unwrap();
    eperm(fs.setxattr(f, b"user.b", b"1", XattrMode::Any), "setxattr");
    eperm(fs.link(f, ROOT_INO, b"g"), "link");
    eperm(fs.unlink(ROOT_INO, b"f"), "unlink");
    eperm(
        fs.rename(ROOT_INO, b"f", ROOT_INO, b"g", RenameFlags::default()),
        "rename",
    );
}

#[test]
fn flagged_directories_guard_their_entries() {
    let fs = fs();
    let d = fs.mkdir(ROOT, ROOT_INO, b"d", 0o755).unwrap().ino;
    let e = fs.mkdir(ROOT, ROOT_INO, b"e", 0o755).unwrap().ino;
    fs.create(ROOT, d, b"old", 0o644, true).unwrap();
    fs.create(ROOT, e, b"x", 0o644, true).unwrap();
    let outside = file(&fs, "f");

    fs.set_flags(ROOT, d, FS_IMMUTABLE_FL).unwrap();
    eperm(
        fs.create(ROOT, d, b"new", 0o644, true),
        "create in immutable",
    );
    eperm(fs.mkdir(ROOT, d, b"sub", 0o755), "mkdir in immutable");
    eperm(fs.symlink(ROOT, d, b"s", b"t"), "symlink in immutable");
    eperm(fs.mknod(ROOT, d, b"p", libc::S_IFIFO | 0o644, 0), "mknod");
    eperm(fs.link(outside, d, b"ln"), "link into immutable");
    eperm(fs.unlink(d, b"old"), "unlink from immutable");
    eperm(
        fs.rename(d, b"old", d, b"new", RenameFlags::default()),
        "rename within immutable",
    );
    eperm(
        fs.rename(e, b"x", d, b"x", RenameFlags::default()),
        "rename into immutable",
    );
    eperm(
        fs.rename(ROOT_INO, b"d", ROOT_INO, b"d2", RenameFlags::default()),
        "rename the immutable directory",
    );
    eperm(fs.rmdir(ROOT_INO, b"d"), "rmdir the immutable directory");
    // Files inside stay writable: the flag is the directory's.
    let old = fs.lookup(d, b"old").unwrap().ino;
    fs.write(ROOT, old, 0, b"ok", false).unwrap();

    fs.set_flags(ROOT, d, FS_APPEND_FL).unwrap();
    fs.create(ROOT, d, b"new", 0o644, true).unwrap();
    fs.mkdir(ROOT, d, b"sub", 0o755).unwrap();
    fs.link(outside, d, b"ln").unwrap();
    fs.rename(e, b"x", d, b"x", RenameFlags::default()).unwrap();
    eperm(fs.unlink(d, b"new"), "unlink from append-only");
    eperm(fs.rmdir(d, b"sub"), "rmdir from append-only");
    eperm(
        fs.rename(d, b"x", e, b"x", RenameFlags::default()),
        "rename out of append-only",
    );
    fs.create(ROOT, e, b"y", 0o644, true).unwrap();
    eperm(
        fs.rename(e, b"y", d, b"new", RenameFlags::default()),
        "rename over an entry of append-only",
    );
    fs.set_flags(ROOT, d, 0).unwrap();
    fs.unlink(d, b"new").unwrap();
}

#[test]
fn noatime_keeps_access_time() {
    let fs = fs();
    let f = file(&fs, "f");
    let old = Timespec { sec: 1, nsec: 0 };
    fs.setattr(
        ROOT,
        f,
        &SetAttr {
            atime: Some(SetTime::At(old)),
            ..Default::default()
        },
    )
    .unwrap();
    fs.set_flags(ROOT, f, FS_NOATIME_FL).unwrap();
    fs.read_vec(f, 0, 5).unwrap();
    assert_eq!(fs.getattr(f).unwrap().atime, old, "noatime read");
    fs.set_flags(ROOT, f, 0).unwrap();
    fs.read_vec(f, 0, 5).unwrap();
    assert!(fs.getattr(f).unwrap().atime > old, "read without noatime");
}

#[test]
fn new_nodes_inherit_nodump_and_noatime() {
    let fs = fs();
    let d = fs.mkdir(ROOT, ROOT_INO, b"d", 0o755).unwrap().ino;
    fs.set_flags(ROOT, d, FS_NODUMP_FL | FS_NOATIME_FL | FS_APPEND_FL)
        .unwrap();
    let (f, _) = fs.create(ROOT, d, b"f", 0o644, true).unwrap();
    let sub = fs.mkdir(ROOT, d, b"sub", 0o755).unwrap();
    // Append-only is not inherited; nodump and noatime are (tmpfs).
    assert_eq!(fs.get_flags(f.ino).unwrap(), FS_NODUMP_FL | FS_NOATIME_FL);
    assert_eq!(fs.get_flags(sub.ino).unwrap(), FS_NODUMP_FL | FS_NOATIME_FL);
    let (plain, _) = fs.create(ROOT, ROOT_INO, b"p", 0o644, true).unwrap();
    assert_eq!(fs.get_flags(plain.ino).unwrap(), 0);
}

/// Keeps the SetFlags records a file system makes.
#[derive(Default)]
struct Keep(Mutex<Vec<(Attr, u32)>>);

impl Recorder for Keep {
    fn record(&self, m: &Mutation<'_>) -> std::result::Result<u64, Errno> {
        let mut v = self.0.lock().unwrap();
        if let Mutation::SetFlags { attr, flags } = *m {
            v.push((attr, flags));
        }
        Ok(v.len() as u64)
    }
}

#[test]
fn set_flags_is_recorded_and_replayed() {
    let keep = Arc::new(Keep::default());
    let mut fs = fs();
    fs.set_recorder(Some(keep.clone()));
    let f = file(&fs, "f");
    fs.set_flags(ROOT, f, FS_APPEND_FL | FS_NODUMP_FL).unwrap();
    let recorded = keep.0.lock().unwrap().clone();
    assert_eq!(recorded.len(), 1);
    // Inherited flags are recorded with the create, so replay keeps them.
    let d = fs.mkdir(ROOT, ROOT_INO, b"d", 0o755).unwrap().ino;
    fs.set_flags(ROOT, d, FS_NOATIME_FL).unwrap();
    let (g, _) = fs.create(ROOT, d, b"g", 0o644, true).unwrap();
    let last = *keep.0.lock().unwrap().last().unwrap();
    assert_eq!((last.0.ino, last.1), (g.ino, FS_NOATIME_FL));
    let (attr, flags) = recorded[0];
    assert_eq!(flags, FS_APPEND_FL | FS_NODUMP_FL);

    // Replayed onto a rebuilt tree, the flags hold and are enforced.
    let copy = self::fs();
    copy.install_node(&attr, ROOT_INO, b"");
    copy.apply(&Mutation::SetFlags { attr, flags });
    assert_eq!(copy.get_flags(f).unwrap(), FS_APPEND_FL | FS_NODUMP_FL);
    eperm(copy.write(ROOT, f, 0, b"x", false), "write after replay");
    // And a later SetAttr record leaves them alone.
    copy.apply(&Mutation::SetAttr { attr });
    assert_eq!(copy.get_flags(f).unwrap(), FS_APPEND_FL | FS_NODUMP_FL);
    copy.apply_flags(f, 0);
    assert_eq!(copy.get_flags(f).unwrap(), 0);
}
