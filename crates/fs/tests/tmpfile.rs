//! `O_TMPFILE` through the engine's API: an unnamed file that is freed on
//! its last release and forget, or named once by `link` unless made with
//! `O_EXCL`; owner, group and mode as for `create`; space counted as for
//! any file.

use memfs_fs::*;

const C: Ctx = Ctx::ROOT;
const USER: Ctx = Ctx {
    uid: 1000,
    gid: 1000,
    pid: 42,
};

fn fs() -> Fs {
    Fs::new(Config {
        capacity: 1 << 30,
        max_inodes: 1 << 16,
    })
}

fn names(fs: &Fs, dir: u64) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    fs.readdir(dir, 0, |e| {
        out.push(e.name.to_vec());
        true
    })
    .unwrap();
    out.retain(|n| n != b"." && n != b"..");
    out
}

#[test]
fn a_tmpfile_has_no_link_no_name_and_holds_data() {
    let fs = fs();
    let before = fs.statfs();
    let a = fs.tmpfile(C, ROOT_INO, 0o600, false).unwrap();
    assert_eq!(a.kind, FileType::RegularFile);
    assert_eq!(a.nlink, 0);
    assert_eq!(a.perm, 0o600);
    assert!(names(&fs, ROOT_INO).is_empty());
    assert_eq!(
        fs.write(C, a.ino, 0, &[7u8; 10_000], false).unwrap(),
        10_000
    );
    assert_eq!(fs.read_vec(a.ino, 0, 20_000).unwrap(), vec![7u8; 10_000]);
    let during = fs.statfs();
    assert_eq!(during.ffree, before.ffree - 1);
    assert_eq!(during.bfree, before.bfree - 3, "three pages of data");
    assert_eq!(fs.getattr(a.ino).unwrap().nlink, 0);
}

#[test]
fn the_last_release_and_forget_free_an_unnamed_tmpfile() {
    let fs = fs();
    let before = fs.statfs();
    let a = fs.tmpfile(C, ROOT_INO, 0o644, false).unwrap();
    fs.write(C, a.ino, 0, &[1u8; 8192], false).unwrap();
    // The kernel forgets only after release; either order frees it once.
    fs.release(a.ino);
    assert!(fs.getattr(a.ino).is_ok(), "still referenced by the kernel");
    fs.forget(a.ino, 1);
    assert_eq!(fs.getattr(a.ino), Err(Errno::ENOENT));
    let after = fs.statfs();
    assert_eq!((after.bfree, after.ffree), (before.bfree, before.ffree));
    assert_eq!(fs.link(a.ino, ROOT_INO, b"late"), Err(Errno::ENOENT));
}

#[test]
fn link_names_a_tmpfile_once_and_it_survives_its_release() {
    let fs = fs();
    let d = fs.mkdir(C, ROOT_INO, b"d", 0o755).unwrap().ino;
    let a = fs.tmpfile(C, d, 0o640, false).unwrap();
    fs.write(C, a.ino, 0, b"payload", false).unwrap();
    let l = fs.link(a.ino, d, b"named").unwrap();
    assert_eq!(l.ino, a.ino);
    assert_eq!(l.nlink, 1);
    assert_eq!(names(&fs, d), vec![b"named".to_vec()]);
    // link took a reference of its own, as a lookup does.
    fs.release(a.ino);
    fs.forget(a.ino, 2);
    let f = fs.lookup_noref(d, b"named").unwrap();
    assert_eq!(f.ino, a.ino);
    assert_eq!(fs.read_vec(f.ino, 0, 100).unwrap(), b"payload");
    // From now on an ordinary file: unlinked, it cannot come back.
    let a2 = fs.lookup(d, b"named").unwrap();
    fs.open(a2.ino, libc::O_RDWR).unwrap();
    fs.unlink(d, b"named").unwrap();
    assert_eq!(fs.link(a2.ino, d, b"again"), Err(Errno::ENOENT));
    fs.release(a2.ino);
    fs.forget(a2.ino, 1);
    assert_eq!(fs.getattr(a2.ino), Err(Errno::ENOENT));
}

#[test]
fn a_tmpfile_made_with_o_excl_cannot_be_linked() {
    let fs = fs();
    let a = fs.tmpfile(C, ROOT_INO, 0o600, true).unwrap();
    assert_eq!(fs.link(a.ino, ROOT_INO, b"x"), Err(Errno::ENOENT));
    assert!(names(&fs, ROOT_INO).is_empty());
    assert_eq!(fs.getattr(a.ino).unwrap().nlink, 0);
    // Nothing was taken by the failed link: release and forget free it.
    fs.release(a.ino);
    fs.forget(a.ino, 1);
    assert_eq!(fs.getattr(a.ino), Err(Errno::ENOENT));
}

#[test]
fn two_links_of_one_tmpfile_give_two_names() {
    let fs = fs();
    let a = fs.tmpfile(C, ROOT_INO, 0o600, false).unwrap();
    assert_eq!(fs.link(a.ino, ROOT_INO, b"one").unwrap().nlink, 1);
    assert_eq!(fs.link(a.ino, ROOT_INO, b"two").unwrap().nlink, 2);
    // A name taken fails as for any link, and leaves the count alone.
    assert_eq!(fs.link(a.ino, ROOT_INO, b"one"), Err(Errno::EEXIST));
    assert_eq!(fs.getattr(a.ino).unwrap().nlink, 2);
}

#[test]
fn owner_group_and_mode_are_set_as_by_create() {
    let fs = fs();
    // A setgid directory owned by group 500: the file takes its group, and
    // loses setgid since its creator (gid 1000) is not in that group.
    let d = fs.mkdir(C, ROOT_INO, b"sg", 0o777).unwrap().ino;
    fs.setattr(
        C,
        d,
        &SetAttr {
            mode: Some(0o2777),
            gid: Some(500),
            ..Default::default()
        },
    )
    .unwrap();
    let a = fs.tmpfile(USER, d, 0o2755, false).unwrap();
    assert_eq!((a.uid, a.gid), (1000, 500));
    assert_eq!(a.perm, 0o755);
    let (b, _) = fs.create(USER, d, b"c", 0o2755, true).unwrap();
    assert_eq!((b.uid, b.gid, b.perm), (a.uid, a.gid, a.perm));
    // Root keeps setgid.
    assert_eq!(fs.tmpfile(C, d, 0o2755, false).unwrap().perm, 0o2755);
    // Elsewhere the creator's group.
    let p = fs.tmpfile(USER, ROOT_INO, 0o600, false).unwrap();
    assert_eq!((p.uid, p.gid), (1000, 1000));
}

#[test]
fn a_tmpfile_does_not_change_its_directory() {
    let fs = fs();
    let d = fs.mkdir(C, ROOT_INO, b"d", 0o755).unwrap();
    let old = Timespec {
        sec: 1_000_000,
        nsec: 5,
    };
    fs.setattr(
        C,
        d.ino,
        &SetAttr {
            mtime: Some(SetTime::At(old)),
            ctime: Some(old),
            ..Default::default()
        },
    )
    .unwrap();
    fs.tmpfile(C, d.ino, 0o600, false).unwrap();
    let after = fs.getattr(d.ino).unwrap();
    assert_eq!((after.mtime, after.ctime), (old, old));
    assert_eq!(after.size, d.size);
}

#[test]
fn bad_directories_and_full_tables_give_errors() {
    let fs = fs();
    let f = fs.create(C, ROOT_INO, b"f", 0o644, true).unwrap().0;
    assert_eq!(
        fs.tmpfile(C, f.ino, 0o600, false).unwrap_err(),
        Errno::ENOTDIR
    );
    assert_eq!(
        fs.tmpfile(C, 9999, 0o600, false).unwrap_err(),
        Errno::ENOENT
    );
    let small = Fs::new(Config {
        capacity: 1 << 20,
        max_inodes: 2,
    });
    let t = small.tmpfile(C, ROOT_INO, 0o600, false).unwrap();
    assert_eq!(
        small.tmpfile(C, ROOT_INO, 0o600, false).unwrap_err(),
        Errno::ENOSPC
    );
    // Its data counts against the capacity (1 MiB) like any file's.
    assert_eq!(
        small.write(C, t.ino, 0, &vec![1u8; 2 << 20], false),
        Err(Errno::ENOSPC)
    );
    small
        .write(C, t.ino, 0, &vec![1u8; 1 << 20], false)
        .unwrap();
    assert_eq!(small.statfs().bfree, 0);
    small.release(t.ino);
    small.forget(t.ino, 1);
    assert_eq!(small.statfs().bfree, 256);
    assert_eq!(small.statfs().ffree, 1);
}

#[test]
fn a_tmpfile_is_recorded_and_rebuilt_without_its_name_until_linked() {
    use std::sync::{Arc, Mutex};
    // Records what recovery would replay: (tag, inode, link count).
    #[derive(Default)]
    struct Rec(Mutex<Vec<(&'static str, u64, u32)>>);
    impl Recorder for Rec {
        fn record(&self, m: &Mutation<'_>) -> std::result::Result<u64, Errno> {
            let (ino, nlink) = match *m {
                Mutation::Tmpfile { attr } | Mutation::Link { attr, .. } => (attr.ino, attr.nlink),
                Mutation::Write { attr, .. } => (attr.ino, attr.nlink),
                _ => (0, 0),
            };
            let mut v = self.0.lock().unwrap();
            v.push((m.op_name(), ino, nlink));
            Ok(v.len() as u64)
        }
    }
    let rec = Arc::new(Rec::default());
    let fs = Fs::with_recorder(
        Config {
            capacity: 1 << 30,
            max_inodes: 1 << 16,
        },
        Some(rec.clone()),
    );
    let a = fs.tmpfile(C, ROOT_INO, 0o600, false).unwrap();
    fs.write(C, a.ino, 0, b"x", false).unwrap();
    fs.link(a.ino, ROOT_INO, b"n").unwrap();
    assert_eq!(
        *rec.0.lock().unwrap(),
        vec![
            ("tmpfile", a.ino, 0),
            ("write", a.ino, 0),
            ("link", a.ino, 1)
        ]
    );
    // Replayed onto a fresh engine: the file exists with no name until the
    // link, and a rebuild that ends before it drops the orphan.
    let re = fs_rebuilt(&[Mutation::Tmpfile { attr: a }]);
    assert_eq!(re.getattr(a.ino), Err(Errno::ENOENT));
    let linked = fs.getattr(a.ino).unwrap();
    let root = fs.getattr(ROOT_INO).unwrap();
    let re = fs_rebuilt(&[
        Mutation::Tmpfile { attr: a },
        Mutation::Write {
            attr: linked,
            offset: 0,
            data: b"x",
        },
        Mutation::Link {
            parent: root,
            name: b"n",
            attr: linked,
        },
    ]);
    assert_eq!(re.lookup_noref(ROOT_INO, b"n").unwrap().ino, a.ino);
    assert_eq!(re.read_vec(a.ino, 0, 10).unwrap(), b"x");
}

fn fs_rebuilt(ms: &[Mutation<'_>]) -> Fs {
    let re = fs();
    for m in ms {
        re.apply(m);
    }
    re.finish_rebuild(ms.len() as u64);
    re
}
