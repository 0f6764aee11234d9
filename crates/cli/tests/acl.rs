//! Mounted POSIX ACLs (issue 14): `setfacl`/`getfacl` work, the kernel
//! enforces named entries and the mask for another user, new nodes inherit
//! a directory's default ACL instead of taking the umask, and a durable
//! mount keeps ACLs across a restart.

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use common::{Mount, have};

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Whether this machine can run these tests; says why not.
fn runnable() -> bool {
    if !is_root() {
        eprintln!("skipped: needs root to switch users");
        return false;
    }
    if !have("setfacl") || !have("getfacl") {
        eprintln!("skipped: setfacl/getfacl missing (Debian package `acl`)");
        return false;
    }
    true
}

fn setfacl(args: &[&str], path: &Path) {
    let out = Command::new("setfacl")
        .args(args)
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "setfacl {args:?} {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `getfacl` without comments or effective-rights notes, one entry a line.
fn getfacl(path: &Path) -> Vec<String> {
    let out = Command::new("getfacl")
        .args(["--omit-header", "--no-effective"])
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "getfacl {}", path.display());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// Opens `path` for reading (`write == false`) or writing in a child running
/// as uid and gid 65534 with no supplementary groups; returns the child's
/// errno (0: success).
fn open_as_nobody(path: &Path, write: bool) -> i32 {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let flags = if write {
        libc::O_WRONLY
    } else {
        libc::O_RDONLY
    };
    // SAFETY: the child calls only async-signal-safe functions (setgroups,
    // setresgid, setresuid, open, _exit) before exiting, as required after
    // fork in a multithreaded process; the parent only waits for it.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(65534, 65534, 65534) != 0
                || libc::setresuid(65534, 65534, 65534) != 0
            {
                libc::_exit(100);
            }
            let fd = libc::open(c.as_ptr(), flags);
            libc::_exit(if fd >= 0 {
                0
            } else {
                *libc::__errno_location()
            });
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        assert!(libc::WIFEXITED(status), "child died: {status}");
        libc::WEXITSTATUS(status)
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().mode() & 0o7777
}

#[test]
fn kernel_enforces_named_entries_and_the_mask() {
    if !runnable() {
        return;
    }
    let m = Mount::with_args(&["--allow-other"]);
    let f = m.p("f");
    std::fs::write(&f, b"secret").unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(open_as_nobody(&f, false), libc::EACCES);

    setfacl(&["-m", "u:65534:rw"], &f);
    assert_eq!(
        getfacl(&f),
        [
            "user::rw-",
            "user:nobody:rw-",
            "group::---",
            "mask::rw-",
            "other::---"
        ]
    );
    assert_eq!(mode(&f), 0o660, "the group bits show the mask");
    assert_eq!(open_as_nobody(&f, false), 0);
    assert_eq!(open_as_nobody(&f, true), 0);

    // chmod rewrites the mask, and the kernel forgets the ACL it cached.
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
    assert!(getfacl(&f).contains(&"mask::r--".to_string()));
    assert_eq!(open_as_nobody(&f, false), 0);
    assert_eq!(open_as_nobody(&f, true), libc::EACCES);

    // Removing the entry takes the access away again; an ACL the mode can
    // say is stored as the mode alone.
    setfacl(&["-x", "u:65534"], &f);
    assert_eq!(open_as_nobody(&f, false), libc::EACCES);
    setfacl(&["-b"], &f);
    let names = xattr_names(&f);
    assert!(names.is_empty(), "no ACL left: {names:?}");

    // A default ACL on a file is refused, a malformed ACL too.
    let out = Command::new("setfacl")
        .args(["-d", "-m", "u:65534:r"])
        .arg(&f)
        .output()
        .unwrap();
    assert!(!out.status.success(), "default ACL on a file was accepted");
    let c = CString::new(f.as_os_str().as_bytes()).unwrap();
    let bad = [2u8, 0, 0, 0, 1, 0];
    // SAFETY: c and bad outlive the call; plain syscall.
    let r = unsafe {
        libc::setxattr(
            c.as_ptr(),
            c"system.posix_acl_access".as_ptr(),
            bad.as_ptr().cast(),
            bad.len(),
            0,
        )
    };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EINVAL)
    );
}

fn xattr_names(path: &Path) -> Vec<u8> {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: buf is writable for its length; c is a valid C string.
    let n = unsafe { libc::listxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n >= 0, "listxattr {}", path.display());
    buf.truncate(n as usize);
    buf
}

#[test]
fn default_acl_is_inherited_instead_of_the_umask() {
    if !runnable() {
        return;
    }
    let m = Mount::with_args(&["--allow-other"]);
    // SAFETY: umask has no preconditions; the test binary's threads create
    // files only inside their own mounts, and the old mask is restored.
    let old = unsafe { libc::umask(0o077) };
    let d = m.p("d");
    std::fs::create_dir(&d).unwrap();
    let plain = m.p("plain");
    std::fs::write(&plain, b"").unwrap();
    // setfacl derives the rest of the default ACL from the mode.
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    setfacl(&["-d", "-m", "u:65534:rwx"], &d);
    std::fs::write(d.join("f"), b"").unwrap();
    std::fs::create_dir(d.join("sub")).unwrap();
    // SAFETY: as above.
    unsafe { libc::umask(old) };

    assert_eq!(mode(&plain), 0o600, "no default ACL: the umask applies");
    // 0666 narrowed by the default ACL (other r-x, mask rwx), umask ignored.
    assert_eq!(mode(&d.join("f")), 0o664);
    assert_eq!(
        getfacl(&d.join("f")),
        [
            "user::rw-",
            "user:nobody:rwx",
            "group::r-x",
            "mask::rw-",
            "other::r--"
        ]
    );
    assert_eq!(open_as_nobody(&d.join("f"), true), 0);
    let sub = getfacl(&d.join("sub"));
    assert!(
        sub.contains(&"default:user:nobody:rwx".to_string()),
        "a new directory keeps the default ACL: {sub:?}"
    );
    assert_eq!(mode(&d.join("sub")), 0o775);
}

#[test]
fn durable_mount_keeps_acls_across_a_restart() {
    if !runnable() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().to_str().unwrap();
    let m = Mount::with_args(&["--data-dir", dir, "--allow-other"]);
    std::fs::create_dir(m.p("d")).unwrap();
    // Explicit: another test of this binary changes the umask for a while.
    std::fs::set_permissions(m.p("d"), std::fs::Permissions::from_mode(0o755)).unwrap();
    setfacl(&["-d", "-m", "u:65534:rx"], &m.p("d"));
    std::fs::write(m.p("d/f"), b"x").unwrap();
    std::fs::write(m.p("g"), b"y").unwrap();
    std::fs::set_permissions(m.p("g"), std::fs::Permissions::from_mode(0o600)).unwrap();
    setfacl(&["-m", "u:65534:r"], &m.p("g"));
    std::fs::set_permissions(m.p("g"), std::fs::Permissions::from_mode(0o610)).unwrap();
    let before = ["d", "d/f", "g"].map(|p| (getfacl(&m.p(p)), mode(&m.p(p))));
    m.unmount();

    let m = Mount::with_args(&["--data-dir", dir, "--allow-other"]);
    let after = ["d", "d/f", "g"].map(|p| (getfacl(&m.p(p)), mode(&m.p(p))));
    assert_eq!(before, after);
    assert!(after[2].0.contains(&"mask::--x".to_string()), "{after:?}");
    assert_eq!(open_as_nobody(&m.p("g"), false), libc::EACCES);
    assert_eq!(open_as_nobody(&m.p("d/f"), false), 0);
    m.unmount();
}
