//! Idmapped mounts of a memfs mount (`-o allow_idmap`, FUSE_ALLOW_IDMAP,
//! Linux 6.12+), made with the raw mount API as `mount -o X-mount.idmap`
//! would (util-linux 2.38 here ignores that option): open_tree(OPEN_TREE_CLONE),
//! mount_setattr(MOUNT_ATTR_IDMAP) with the user namespace of a child given a
//! uid_map and gid_map, move_mount. Without the option the kernel refuses the
//! idmapping (EINVAL), as for any FUSE server that does not opt in.
//!
//! The mapping swaps 0 and 1000 (both uids and gids): a node that memfs
//! stores as owned by 1000 is seen as root's through the idmapped mount, and
//! root creating through it makes a node memfs stores as 1000's.

mod common;

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::Mount;

const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// `struct mount_attr` (uapi linux/mount.h, MOUNT_ATTR_SIZE_VER0).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MAP: &str = "0 1000 1\n1000 0 1\n";

/// Whether this machine can run these tests; says why not.
fn runnable() -> bool {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: idmapped mounts need root (CAP_SYS_ADMIN)");
        return false;
    }
    let release = nix::sys::utsname::uname().unwrap();
    let release = release.release().to_string_lossy().into_owned();
    let mut v = release.split(|c: char| !c.is_ascii_digit());
    let major: u32 = v.next().and_then(|x| x.parse().ok()).unwrap_or(0);
    let minor: u32 = v.next().and_then(|x| x.parse().ok()).unwrap_or(0);
    if (major, minor) < (6, 12) {
        eprintln!("skipped: FUSE idmapped mounts need Linux 6.12+ (this is {release})");
        return false;
    }
    true
}

/// A child in a new user namespace with [`MAP`] as its uid and gid map;
/// killed and reaped on drop. Only its namespace is used.
struct Userns {
    child: Child,
}

impl Userns {
    fn new() -> Userns {
        let mut cmd = Command::new("sleep");
        // Bounded: the child is killed on drop, and goes away by itself
        // anyway if this process dies first.
        cmd.arg("120").stdin(Stdio::null());
        // SAFETY: unshare(2) is async-signal-safe; it runs in the forked
        // child before exec and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        // spawn returns after the exec, so after the unshare.
        let child = cmd.spawn().expect("start a child in a new user namespace");
        let ns = Userns { child };
        let pid = ns.child.id();
        // Root of the parent namespace may write any map, without denying setgroups.
        std::fs::write(format!("/proc/{pid}/uid_map"), MAP).expect("write uid_map");
        std::fs::write(format!("/proc/{pid}/gid_map"), MAP).expect("write gid_map");
        ns
    }

    fn fd(&self) -> OwnedFd {
        let f = std::fs::File::open(format!("/proc/{}/ns/user", self.child.id()))
            .expect("open the child's user namespace");
        OwnedFd::from(f)
    }
}

impl Drop for Userns {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// A detached copy of the mount at `src` (open_tree with OPEN_TREE_CLONE).
fn clone_tree(src: &Path) -> OwnedFd {
    let path = cstr(src);
    // SAFETY: a valid NUL-terminated path; the returned descriptor, if any,
    // is owned by nothing else.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | AT_RECURSIVE,
        )
    };
    assert!(
        fd >= 0,
        "open_tree({}): {}",
        src.display(),
        std::io::Error::last_os_error()
    );
    // SAFETY: a fresh descriptor returned by open_tree.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// mount_setattr(MOUNT_ATTR_IDMAP) on a detached tree.
fn set_idmap(tree: &OwnedFd, userns: &OwnedFd) -> std::io::Result<()> {
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: both descriptors are open; the path is an empty C string and
    // `attr` a live struct of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// An idmapped mount attached at a directory of its own; detached on drop.
struct Idmapped {
    dir: tempfile::TempDir,
}

impl Idmapped {
    fn attach(tree: OwnedFd) -> Idmapped {
        let dir = tempfile::Builder::new()
            .prefix("memfs-idmapped-")
            .tempdir()
            .unwrap();
        let target = cstr(dir.path());
        // SAFETY: an open detached tree and a valid target path.
        let r = unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                tree.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_FDCWD,
                target.as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH,
            )
        };
        assert_eq!(r, 0, "move_mount: {}", std::io::Error::last_os_error());
        let m = Idmapped { dir };
        assert!(common::is_mount_point(m.dir.path()));
        m
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
}

impl Drop for Idmapped {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.dir.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

fn owner(p: &Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.uid(), m.gid())
}

fn idmapped_mount(m: &Mount) -> Idmapped {
    let userns = Userns::new();
    let tree = clone_tree(&m.path());
    set_idmap(&tree, &userns.fd()).expect("mount_setattr(MOUNT_ATTR_IDMAP) with allow_idmap");
    Idmapped::attach(tree)
}

#[test]
fn idmapped_mount_maps_owners() {
    if !runnable() {
        return;
    }
    // Without allow_other: also checks that requests with the unset uid
    // are served (the kernel keeps other users out itself).
    let m = Mount::with_args(&["-o", "allow_idmap"]);
    let idm = idmapped_mount(&m);

    // The root directory, root's in memfs, is 1000's through the mapping.
    assert_eq!(owner(idm.dir.path()), (1000, 1000));

    // Created by root through the idmapped mount: stored as 1000's.
    std::fs::write(idm.p("f"), b"x").unwrap();
    assert_eq!(owner(&m.p("f")), (1000, 1000));
    assert_eq!(owner(&idm.p("f")), (0, 0));
    std::fs::create_dir(idm.p("d")).unwrap();
    assert_eq!(owner(&m.p("d")), (1000, 1000));
    std::os::unix::fs::symlink("f", idm.p("l")).unwrap();
    assert_eq!(owner(&m.p("l")), (1000, 1000));
    nix::unistd::mkfifo(&idm.p("p"), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    assert_eq!(owner(&m.p("p")), (1000, 1000));
    // Created through the plain mount: root's, so 1000's through the idmapped one.
    std::fs::write(m.p("g"), b"y").unwrap();
    assert_eq!(owner(&m.p("g")), (0, 0));
    assert_eq!(owner(&idm.p("g")), (1000, 1000));

    // chown through the idmapped mount stores the mapped ids.
    std::os::unix::fs::chown(idm.p("f"), Some(1000), Some(1000)).unwrap();
    assert_eq!(owner(&m.p("f")), (0, 0));
    assert_eq!(owner(&idm.p("f")), (1000, 1000));
    // An id with no mapping cannot be set through it.
    let e = std::os::unix::fs::chown(idm.p("f"), Some(5), None).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EOVERFLOW), "{e}");
    std::os::unix::fs::chown(idm.p("f"), Some(0), Some(0)).unwrap();
    assert_eq!(owner(&m.p("f")), (1000, 1000));

    // Requests that carry no ids (uid -1 once FUSE_ALLOW_IDMAP is on): memfs
    // learns root's ids from /proc, so root may chmod and set times of a
    // node it does not own, on either mount.
    std::fs::set_permissions(m.p("f"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(idm.p("f"), std::fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(std::fs::metadata(m.p("f")).unwrap().mode() & 0o7777, 0o640);
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    std::fs::File::options()
        .write(true)
        .open(idm.p("f"))
        .and_then(|f| f.set_times(std::fs::FileTimes::new().set_modified(t)))
        .unwrap();
    assert_eq!(std::fs::metadata(m.p("f")).unwrap().mtime(), 1_000_000);
    // Data, rename and unlink through it.
    std::fs::write(idm.p("f"), b"data").unwrap();
    assert_eq!(std::fs::read(m.p("f")).unwrap(), b"data");
    std::fs::rename(idm.p("f"), idm.p("d/f")).unwrap();
    assert_eq!(owner(&m.p("d/f")), (1000, 1000));
    std::fs::remove_file(idm.p("d/f")).unwrap();
    assert!(!m.p("d/f").exists());

    drop(idm);
    m.unmount();
}

/// A user other than root, through the plain mount of an allow_idmap
/// memfs: requests that create nothing carry no uid, and memfs must take
/// the caller's own (not root's, not -1) for its checks.
#[test]
fn unset_ids_are_the_callers() {
    if !runnable() {
        return;
    }
    let m = Mount::with_args(&["-o", "allow_idmap,allow_other"]);
    std::fs::create_dir(m.p("home")).unwrap();
    std::os::unix::fs::chown(m.p("home"), Some(1000), Some(1000)).unwrap();
    let as_1000 = |script: &str| {
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(m.path())
            .uid(1000)
            .gid(1000)
            .output()
            .unwrap()
    };
    // Created by 1000: 1000's. Then chmod, times, truncate: its owner's
    // requests, which memfs checks with the ids from /proc.
    let out = as_1000(
        "touch home/a && chmod 600 home/a && truncate -s 3 home/a \
         && touch -d @5000000 home/a && chmod g+s home/a",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta = std::fs::metadata(m.p("home/a")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (1000, 1000));
    assert_eq!(meta.mode() & 0o7777, 0o2600);
    assert_eq!(meta.mtime(), 5_000_000);
    assert_eq!(meta.len(), 3);
    // Not 1000's: refused, by the kernel and by memfs alike.
    std::fs::write(m.p("root-file"), b"").unwrap();
    let out = as_1000("chmod 777 root-file");
    assert!(
        !out.status.success(),
        "1000 changed the mode of root's file"
    );
    assert_eq!(
        std::fs::metadata(m.p("root-file")).unwrap().mode() & 0o777,
        0o644
    );
    // A write by a caller without CAP_FSETID drops a setgid that means
    // "run as group" (group execute set); root's write keeps it. The engine
    // decides from the writer's ids: -1 would count as a user.
    std::os::unix::fs::chown(m.p("home/a"), None, Some(0)).unwrap();
    std::fs::set_permissions(m.p("home/a"), std::fs::Permissions::from_mode(0o2676)).unwrap();
    let out = as_1000("echo x >> home/a");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fresh_mode(&m.p("home/a")), 0o676);
    std::fs::set_permissions(m.p("home/a"), std::fs::Permissions::from_mode(0o2676)).unwrap();
    std::fs::OpenOptions::new()
        .append(true)
        .open(m.p("home/a"))
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"y"))
        .unwrap();
    assert_eq!(fresh_mode(&m.p("home/a")), 0o2676);
    m.unmount();
}

/// The mode bits as memfs has them now: statx with AT_STATX_FORCE_SYNC
/// makes the kernel ask instead of answering from its attribute cache.
fn fresh_mode(p: &Path) -> u32 {
    let path = cstr(p);
    // SAFETY: statx is plain data; all zeroes is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a valid path and a live statx buffer.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_STATX_FORCE_SYNC,
            libc::STATX_MODE,
            &mut stx,
        )
    };
    assert_eq!(
        r,
        0,
        "statx {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
    u32::from(stx.stx_mode) & 0o7777
}

#[test]
fn refused_without_allow_idmap() {
    if !runnable() {
        return;
    }
    let m = Mount::new();
    let userns = Userns::new();
    let tree = clone_tree(&m.path());
    let e = set_idmap(&tree, &userns.fd()).expect_err("idmapped a mount without allow_idmap");
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
    // The plain mount works as before: requests carry the caller's ids.
    std::fs::write(m.p("f"), b"x").unwrap();
    assert_eq!(owner(&m.p("f")), (0, 0));
    drop(tree);
    m.unmount();
}
