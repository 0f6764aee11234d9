//! POSIX ACLs in the engine: the xattr format, validation, the mode an
//! access ACL implies, chmod rewriting the mask, inheritance at creation,
//! and `access` evaluating named entries.

use memfs_fs::acl::{ACL_ACCESS, ACL_DEFAULT, Acl, AclEntry, Tag};
use memfs_fs::*;

const ROOT: Ctx = Ctx::ROOT;
const OWNER: Ctx = Ctx {
    uid: 1000,
    gid: 1000,
    pid: 1,
};
const NAMED: Ctx = Ctx {
    uid: 2000,
    gid: 2000,
    pid: 2,
};
const STRANGER: Ctx = Ctx {
    uid: 3000,
    gid: 3000,
    pid: 3,
};

fn fs() -> Fs {
    Fs::new(Config {
        capacity: 1 << 26,
        max_inodes: 1 << 10,
    })
}

fn e(tag: Tag, perm: u16) -> AclEntry {
    AclEntry { tag, perm }
}

/// owner rw, user 2000 given `named`, group r, mask `mask`, other none.
fn acl_named(named: u16, mask: u16) -> Acl {
    Acl {
        entries: vec![
            e(Tag::UserObj, 6),
            e(Tag::User(2000), named),
            e(Tag::GroupObj, 4),
            e(Tag::Mask, mask),
            e(Tag::Other, 0),
        ],
    }
}

fn file(fs: &Fs, ctx: Ctx, parent: u64, name: &str, mode: u32, umask: u32) -> Attr {
    let (a, created) = fs
        .create_umask(ctx, parent, name.as_bytes(), mode, true, umask)
        .unwrap();
    assert!(created);
    fs.release(a.ino);
    a
}

fn acl_of(fs: &Fs, ino: u64, name: &[u8]) -> Option<Acl> {
    match fs.getxattr(ino, name) {
        Ok(v) => Acl::parse(&v).unwrap(),
        Err(Errno::ENODATA) => None,
        Err(e) => panic!("getxattr: {e:?}"),
    }
}

#[test]
fn xattr_round_trip_and_malformed_values() {
    let a = acl_named(7, 6);
    let bytes = a.to_xattr();
    assert_eq!(bytes.len(), 4 + 8 * 5);
    assert_eq!(&bytes[..4], &2u32.to_le_bytes());
    assert_eq!(Acl::parse(&bytes).unwrap(), Some(a.clone()));
    assert_eq!(Acl::parse_valid(&bytes).unwrap(), Some(a));
    // A header alone is the empty ACL: removal.
    assert_eq!(Acl::parse(&2u32.to_le_bytes()).unwrap(), None);
    assert_eq!(Acl::parse(&[2, 0]), Err(Errno::EINVAL));
    assert_eq!(Acl::parse(&1u32.to_le_bytes()), Err(Errno::EOPNOTSUPP));
    let mut ragged = Acl::from_mode(0o644).to_xattr();
    ragged.push(0);
    assert_eq!(Acl::parse(&ragged), Err(Errno::EINVAL));
    let mut bad_tag = Acl::from_mode(0o644).to_xattr();
    bad_tag[4] = 0x40;
    assert_eq!(Acl::parse(&bad_tag), Err(Errno::EINVAL));
}

#[test]
fn validation_follows_posix_acl_valid() {
    assert!(Acl::from_mode(0o750).validate().is_ok());
    assert!(acl_named(7, 7).validate().is_ok());
    // Named entry without a mask.
    let mut no_mask = acl_named(7, 7);
    no_mask.entries.remove(3);
    assert_eq!(no_mask.validate(), Err(Errno::EINVAL));
    // Out of order, missing other, bad permission bits.
    let mut swapped = Acl::from_mode(0o644);
    swapped.entries.swap(0, 1);
    assert_eq!(swapped.validate(), Err(Errno::EINVAL));
    let mut short = Acl::from_mode(0o644);
    short.entries.pop();
    assert_eq!(short.validate(), Err(Errno::EINVAL));
    let mut wide = Acl::from_mode(0o644);
    wide.entries[0].perm = 8;
    assert_eq!(wide.validate(), Err(Errno::EINVAL));

    let fs = fs();
    let f = file(&fs, ROOT, ROOT_INO, "f", 0o644, 0);
    assert_eq!(
        fs.setxattr(f.ino, ACL_ACCESS, &no_mask.to_xattr(), XattrMode::Any),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        fs.setxattr(f.ino, ACL_ACCESS, &[1, 2, 3], XattrMode::Any),
        Err(Errno::EINVAL)
    );
    // A default ACL belongs to directories only.
    assert_eq!(
        fs.setxattr(
            f.ino,
            ACL_DEFAULT,
            &acl_named(7, 7).to_xattr(),
            XattrMode::Any
        ),
        Err(Errno::EACCES)
    );
    // Other system names stay unsupported.
    assert_eq!(
        fs.setxattr(f.ino, b"system.foo", b"x", XattrMode::Any),
        Err(Errno::EOPNOTSUPP)
    );
}

#[test]
fn access_acl_sets_mode_and_equivalent_acl_is_only_the_mode() {
    let fs = fs();
    let f = file(&fs, ROOT, ROOT_INO, "f", 0o600, 0);
    // Equivalent to 0754: stored as the mode alone.
    let plain = Acl::from_mode(0o754);
    assert_eq!(plain.equiv_mode(), (0o754, true));
    fs.setxattr(f.ino, ACL_ACCESS, &plain.to_xattr(), XattrMode::Any)
        .unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().perm, 0o754);
    assert_eq!(fs.getxattr(f.ino, ACL_ACCESS), Err(Errno::ENODATA));
    assert!(fs.listxattr(f.ino).unwrap().is_empty());

    // With a named entry: stored, and the group bits are the mask's.
    let a = acl_named(7, 5);
    assert_eq!(a.equiv_mode(), (0o650, false));
    fs.setxattr(f.ino, ACL_ACCESS, &a.to_xattr(), XattrMode::Any)
        .unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().perm, 0o650);
    assert_eq!(acl_of(&fs, f.ino, ACL_ACCESS), Some(a));
    assert_eq!(fs.listxattr(f.ino).unwrap(), b"system.posix_acl_access\0");

    // An empty ACL removes it; the mode stays.
    fs.setxattr(f.ino, ACL_ACCESS, &2u32.to_le_bytes(), XattrMode::Any)
        .unwrap();
    assert_eq!(fs.getxattr(f.ino, ACL_ACCESS), Err(Errno::ENODATA));
    assert_eq!(fs.getattr(f.ino).unwrap().perm, 0o650);
}

#[test]
fn an_acl_refused_for_want_of_xattr_space_leaves_the_mode() {
    let fs = fs();
    let f = file(&fs, ROOT, ROOT_INO, "f", 0o700, 0);
    // Fill the node's xattr name list (XATTR_LIST_MAX) with long names,
    // then with short ones, as xfstests generic/449 does, until less room
    // is left than the ACL's 24-byte name needs.
    for width in [240, 1] {
        let mut i = 0;
        loop {
            let name = format!("trusted.{width}.{i:0>width$}");
            match fs.setxattr(f.ino, name.as_bytes(), b"", XattrMode::Create) {
                Ok(()) => i += 1,
                Err(e) => {
                    assert_eq!(e, Errno::ENOSPC);
                    break;
                }
            }
        }
    }
    // `setfacl -m m:r`: u::rwx g::--- m::r-- o::---, which needs storing.
    let a = Acl {
        entries: vec![
            e(Tag::UserObj, 7),
            e(Tag::GroupObj, 0),
            e(Tag::Mask, 4),
            e(Tag::Other, 0),
        ],
    };
    assert_eq!(a.equiv_mode(), (0o740, false));
    assert_eq!(
        fs.setxattr(f.ino, ACL_ACCESS, &a.to_xattr(), XattrMode::Any),
        Err(Errno::ENOSPC)
    );
    assert_eq!(fs.getattr(f.ino).unwrap().perm, 0o700);
    assert_eq!(fs.getxattr(f.ino, ACL_ACCESS), Err(Errno::ENODATA));
    // An ACL equivalent to a mode needs no space and still applies.
    fs.setxattr(
        f.ino,
        ACL_ACCESS,
        &Acl::from_mode(0o750).to_xattr(),
        XattrMode::Any,
    )
    .unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().perm, 0o750);
}

#[test]
fn only_owner_or_root_sets_acls_and_setgid_is_cleared_outside_the_group() {
    let fs = fs();
    let f = file(&fs, OWNER, ROOT_INO, "f", 0o2770, 0);
    for set in [
        SetAttr {
            gid: Some(4242),
            ..Default::default()
        },
        // After the chown, which drops setgid.
        SetAttr {
            mode: Some(0o2770),
            ..Default::default()
        },
    ] {
        fs.setattr(ROOT, f.ino, &set).unwrap();
    }
    let value = acl_named(7, 7).to_xattr();
    assert_eq!(
        fs.setxattr_as(
            STRANGER,
            &|_| false,
            f.ino,
            ACL_ACCESS,
            &value,
            XattrMode::Any
        ),
        Err(Errno::EPERM)
    );
    // The owner, in group 4242 through a supplementary group: setgid stays.
    fs.setxattr_as(
        OWNER,
        &|g| g == 4242,
        f.ino,
        ACL_ACCESS,
        &value,
        XattrMode::Any,
    )
    .unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().perm, 0o2670);
    // Not in it: cleared, as generic/375 expects.
    fs.setxattr_as(OWNER, &|_| false, f.ino, ACL_ACCESS, &value, XattrMode::Any)
        .unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().perm, 0o670);
}

#[test]
fn chmod_rewrites_mask_or_group_entry() {
    let fs = fs();
    let f = file(&fs, ROOT, ROOT_INO, "f", 0o644, 0);
    fs.setxattr(
        f.ino,
        ACL_ACCESS,
        &acl_named(7, 7).to_xattr(),
        XattrMode::Any,
    )
    .unwrap();
    let chmod = |mode| {
        fs.setattr(
            ROOT,
            f.ino,
            &SetAttr {
                mode: Some(mode),
                ..Default::default()
            },
        )
        .unwrap()
    };
    chmod(0o741);
    let a = acl_of(&fs, f.ino, ACL_ACCESS).unwrap();
    assert_eq!(
        a.entries,
        vec![
            e(Tag::UserObj, 7),
            e(Tag::User(2000), 7),
            e(Tag::GroupObj, 4),
            e(Tag::Mask, 4),
            e(Tag::Other, 1),
        ]
    );
    // Without a mask the owning group's entry follows the group bits.
    let mut m = Acl::from_mode(0o644);
    m.chmod(0o751);
    assert_eq!(m, Acl::from_mode(0o751));
    // The mask now denies user 2000 writing.
    assert_eq!(fs.access(NAMED, f.ino, libc::W_OK), Err(Errno::EACCES));
    assert_eq!(fs.access(NAMED, f.ino, libc::R_OK), Ok(()));
}

#[test]
fn access_evaluates_named_entries_and_mask() {
    let fs = fs();
    let f = file(&fs, OWNER, ROOT_INO, "f", 0o600, 0);
    assert_eq!(fs.access(NAMED, f.ino, libc::R_OK), Err(Errno::EACCES));
    fs.setxattr_as(
        OWNER,
        &|_| false,
        f.ino,
        ACL_ACCESS,
        &acl_named(6, 4).to_xattr(),
        XattrMode::Any,
    )
    .unwrap();
    assert_eq!(fs.access(NAMED, f.ino, libc::R_OK), Ok(()));
    // rw- for the user, r-- mask: writing is masked away.
    assert_eq!(fs.access(NAMED, f.ino, libc::W_OK), Err(Errno::EACCES));
    assert_eq!(fs.access(STRANGER, f.ino, libc::R_OK), Err(Errno::EACCES));
    assert_eq!(fs.access(OWNER, f.ino, libc::R_OK | libc::W_OK), Ok(()));
    // A named group, reached through a supplementary group.
    let g = Acl {
        entries: vec![
            e(Tag::UserObj, 6),
            e(Tag::GroupObj, 0),
            e(Tag::Group(5000), 4),
            e(Tag::Mask, 4),
            e(Tag::Other, 0),
        ],
    };
    fs.setxattr(f.ino, ACL_ACCESS, &g.to_xattr(), XattrMode::Any)
        .unwrap();
    assert_eq!(
        fs.access_as(STRANGER, &|g| g == 5000, f.ino, libc::R_OK),
        Ok(())
    );
    assert_eq!(
        fs.access_as(STRANGER, &|_| false, f.ino, libc::R_OK),
        Err(Errno::EACCES)
    );
}

#[test]
fn new_nodes_inherit_the_default_acl_and_ignore_the_umask() {
    let fs = fs();
    let d = fs.mkdir_umask(ROOT, ROOT_INO, b"d", 0o777, 0o022).unwrap();
    assert_eq!(d.perm, 0o755, "no default ACL: the umask applies");
    let def = Acl {
        entries: vec![
            e(Tag::UserObj, 7),
            e(Tag::User(2000), 7),
            e(Tag::GroupObj, 5),
            e(Tag::Mask, 7),
            e(Tag::Other, 5),
        ],
    };
    fs.setxattr(d.ino, ACL_DEFAULT, &def.to_xattr(), XattrMode::Any)
        .unwrap();
    assert_eq!(acl_of(&fs, d.ino, ACL_DEFAULT), Some(def.clone()));

    // A file asking for 0640 with umask 077: the umask is ignored, the
    // ACL narrowed by the mode and the mode by the ACL.
    let f = file(&fs, ROOT, d.ino, "f", 0o640, 0o077);
    assert_eq!(f.perm, 0o640);
    let fa = acl_of(&fs, f.ino, ACL_ACCESS).unwrap();
    assert_eq!(
        fa.entries,
        vec![
            e(Tag::UserObj, 6),
            e(Tag::User(2000), 7),
            e(Tag::GroupObj, 5),
            e(Tag::Mask, 4),
            e(Tag::Other, 0),
        ]
    );
    assert_eq!(acl_of(&fs, f.ino, ACL_DEFAULT), None);
    assert_eq!(fs.access(NAMED, f.ino, libc::R_OK), Ok(()));
    assert_eq!(fs.access(NAMED, f.ino, libc::W_OK), Err(Errno::EACCES));

    // A directory takes it as its default ACL too.
    let sub = fs.mkdir_umask(ROOT, d.ino, b"sub", 0o755, 0o077).unwrap();
    assert_eq!(sub.perm, 0o755);
    assert_eq!(acl_of(&fs, sub.ino, ACL_DEFAULT), Some(def));
    assert!(acl_of(&fs, sub.ino, ACL_ACCESS).is_some());

    // A default ACL equivalent to a mode gives no access ACL, only bits.
    let plain = fs.mkdir(ROOT, ROOT_INO, b"plain", 0o777).unwrap();
    fs.setxattr(
        plain.ino,
        ACL_DEFAULT,
        &Acl::from_mode(0o750).to_xattr(),
        XattrMode::Any,
    )
    .unwrap();
    let n = fs
        .mknod_umask(ROOT, plain.ino, b"n", libc::S_IFIFO | 0o666, 0, 0o000)
        .unwrap();
    assert_eq!(n.perm, 0o640);
    assert_eq!(acl_of(&fs, n.ino, ACL_ACCESS), None);
    // Symlinks take nothing and refuse ACLs.
    let l = fs.symlink(ROOT, plain.ino, b"l", b"n").unwrap();
    assert!(fs.listxattr(l.ino).unwrap().is_empty());
    assert_eq!(
        fs.setxattr(
            l.ino,
            ACL_ACCESS,
            &acl_named(7, 7).to_xattr(),
            XattrMode::Any
        ),
        Err(Errno::EOPNOTSUPP)
    );
}

/// generic/079: an immutable or append-only node refuses every ACL change,
/// set or removal, access or default, to root too (EPERM), and keeps its
/// ACL and mode; once the flag is cleared the same change is accepted.
#[test]
fn flagged_nodes_refuse_acl_changes() {
    let fs = fs();
    let f = file(&fs, ROOT, ROOT_INO, "f", 0o640, 0);
    let d = fs.mkdir(ROOT, ROOT_INO, b"d", 0o750).unwrap();
    let a = acl_named(6, 6);
    let plain = Acl {
        entries: vec![e(Tag::UserObj, 6), e(Tag::GroupObj, 4), e(Tag::Other, 0)],
    };
    for flag in [FS_IMMUTABLE_FL, FS_APPEND_FL] {
        fs.setxattr(f.ino, ACL_ACCESS, &a.to_xattr(), XattrMode::Any)
            .unwrap();
        fs.setxattr(d.ino, ACL_DEFAULT, &a.to_xattr(), XattrMode::Any)
            .unwrap();
        let mode = fs.getattr(f.ino).unwrap().perm;
        fs.set_flags(ROOT, f.ino, flag).unwrap();
        fs.set_flags(ROOT, d.ino, flag).unwrap();
        let eperm = |r: Result<()>, what: &str| {
            assert_eq!(r, Err(Errno::EPERM), "{what} with flag {flag:#x}")
        };
        for ctx in [ROOT, OWNER] {
            let set =
                |ino, name, v: &[u8]| fs.setxattr_as(ctx, &|_| true, ino, name, v, XattrMode::Any);
            eperm(
                set(f.ino, ACL_ACCESS, &acl_named(7, 7).to_xattr()),
                "set access",
            );
            eperm(
                set(f.ino, ACL_ACCESS, &plain.to_xattr()),
                "set an equivalent access ACL",
            );
            // A header without entries is a removal.
            eperm(
                set(f.ino, ACL_ACCESS, &2u32.to_le_bytes()),
                "set an empty access ACL",
            );
            eperm(set(d.ino, ACL_DEFAULT, &plain.to_xattr()), "set default");
            eperm(
                set(d.ino, ACL_DEFAULT, &2u32.to_le_bytes()),
                "set an empty default ACL",
            );
        }
        eperm(fs.removexattr(f.ino, ACL_ACCESS), "remove access");
        eperm(fs.removexattr(d.ino, ACL_DEFAULT), "remove default");
        assert_eq!(acl_of(&fs, f.ino, ACL_ACCESS), Some(a.clone()));
        assert_eq!(acl_of(&fs, d.ino, ACL_DEFAULT), Some(a.clone()));
        assert_eq!(fs.getattr(f.ino).unwrap().perm, mode);
        // Cleared: the same changes go through.
        fs.set_flags(ROOT, f.ino, 0).unwrap();
        fs.set_flags(ROOT, d.ino, 0).unwrap();
        fs.removexattr(f.ino, ACL_ACCESS).unwrap();
        fs.removexattr(d.ino, ACL_DEFAULT).unwrap();
        assert_eq!(acl_of(&fs, f.ino, ACL_ACCESS), None);
        assert_eq!(acl_of(&fs, d.ino, ACL_DEFAULT), None);
    }
}
