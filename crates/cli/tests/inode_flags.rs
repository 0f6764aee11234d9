//! Mounted tests of inode flags (issue 14): FS_IOC_GETFLAGS/SETFLAGS
//! through the kernel with raw ioctls and with e2fsprogs' `chattr`/`lsattr`
//! (when installed), append-only and immutable enforced on files and
//! directories, and the flags surviving a remount (checkpoint) and a crash
//! (journal replay) of a durable mount. Run as root: setting append-only or
//! immutable needs CAP_LINUX_IMMUTABLE.

mod common;

use std::fs::{self, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::{Mount, have};

const IMMUTABLE: u32 = 0x10;
const APPEND: u32 = 0x20;
const NODUMP: u32 = 0x40;
const NOATIME: u32 = 0x80;

/// One test at a time: a test that forks gives its child copies of every
/// descriptor open in this process, and a concurrent test's unmount fails
/// (EBUSY) while the child holds one of its files.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

// FS_IOC_GETFLAGS/SETFLAGS are declared with `long` but pass an int, as
// e2fsprogs does.
nix::ioctl_read!(getflags_ioctl, b'f', 1, libc::c_long);
nix::ioctl_write_ptr!(setflags_ioctl, b'f', 2, libc::c_long);

fn open_node(p: &Path) -> fs::File {
    // O_RDONLY works on directories too; O_NONBLOCK as lsattr uses.
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(p)
        .unwrap_or_else(|e| panic!("open {}: {e}", p.display()))
}

fn get_flags(p: &Path) -> std::io::Result<u32> {
    let f = open_node(p);
    let mut v: libc::c_int = 0;
    // SAFETY: the kernel writes one int into `v`, which outlives the call.
    unsafe { getflags_ioctl(f.as_raw_fd(), (&mut v as *mut libc::c_int).cast()) }?;
    Ok(v as u32)
}

fn set_flags(p: &Path, flags: u32) -> std::io::Result<()> {
    let f = open_node(p);
    let v = flags as libc::c_int;
    // SAFETY: the kernel reads one int from `v`, which outlives the call.
    unsafe { setflags_ioctl(f.as_raw_fd(), (&v as *const libc::c_int).cast()) }?;
    Ok(())
}

fn assert_eperm<T: std::fmt::Debug>(r: std::io::Result<T>, what: &str) {
    let e = r.expect_err(what);
    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{what}: {e}");
}

/// A write by a process that opened `p` for writing (with O_APPEND or
/// not). In the default `--locks kernel` mode the kernel sends no OPEN, so
/// the refusal comes at the first write instead of at open.
fn open_and_write(p: &Path, append: bool) -> std::io::Result<()> {
    let mut f = OpenOptions::new().write(true).append(append).open(p)?;
    f.write_all(b"more")
}

fn lsattr(p: &Path) -> String {
    let o = Command::new("lsattr").arg("-d").arg(p).output().unwrap();
    assert!(o.status.success(), "lsattr: {o:?}");
    String::from_utf8(o.stdout).unwrap()
}

fn chattr(arg: &str, p: &Path) -> std::process::Output {
    Command::new("chattr").arg(arg).arg(p).output().unwrap()
}

#[test]
fn flags_round_trip_and_are_enforced_through_the_kernel() {
    let _serial = serial();
    if !is_root() {
        eprintln!("skipped: setting append-only/immutable needs CAP_LINUX_IMMUTABLE");
        return;
    }
    let m = Mount::new();
    let f = m.p("f");
    let d = m.p("d");
    fs::write(&f, b"data").unwrap();
    fs::create_dir(&d).unwrap();
    fs::write(d.join("inside"), b"x").unwrap();

    assert_eq!(get_flags(&f).unwrap(), 0);
    set_flags(&f, NODUMP | NOATIME).unwrap();
    assert_eq!(get_flags(&f).unwrap(), NODUMP | NOATIME);
    // Flags tmpfs does not keep (FS_SYNC_FL here) are refused.
    let e = set_flags(&f, 0x8).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP), "{e}");
    set_flags(&f, 0).unwrap();

    // Append-only file.
    set_flags(&f, APPEND).unwrap();
    assert_eq!(get_flags(&f).unwrap(), APPEND);
    open_and_write(&f, true).unwrap();
    assert_eq!(fs::read(&f).unwrap(), b"datamore");
    assert_eperm(open_and_write(&f, false), "write without O_APPEND");
    assert_eperm(
        OpenOptions::new().write(true).truncate(true).open(&f),
        "O_TRUNC",
    );
    assert_eperm(fs::remove_file(&f), "unlink append-only");
    assert_eperm(fs::rename(&f, m.p("g")), "rename append-only");
    assert_eperm(fs::hard_link(&f, m.p("g")), "link append-only");
    assert_eperm(
        fs::set_permissions(&f, fs::Permissions::from_mode(0o600)),
        "chmod append-only",
    );
    assert_eq!(fs::read(&f).unwrap(), b"datamore");

    // Immutable file.
    set_flags(&f, IMMUTABLE).unwrap();
    assert_eperm(open_and_write(&f, true), "append to immutable");
    assert_eperm(fs::remove_file(&f), "unlink immutable");
    assert_eperm(
        std::os::unix::fs::chown(&f, Some(1), None),
        "chown immutable",
    );
    assert_eq!(fs::read(&f).unwrap(), b"datamore", "reads still work");

    // Directories: immutable refuses new and removed entries, append-only
    // takes new ones only.
    set_flags(&d, IMMUTABLE).unwrap();
    assert_eq!(get_flags(&d).unwrap(), IMMUTABLE);
    assert_eperm(fs::write(d.join("new"), b""), "create in immutable dir");
    assert_eperm(fs::remove_file(d.join("inside")), "unlink in immutable dir");
    set_flags(&d, APPEND).unwrap();
    fs::write(d.join("new"), b"").unwrap();
    assert_eperm(fs::remove_file(d.join("new")), "unlink in append dir");
    assert_eperm(fs::remove_dir(&d), "rmdir append dir");

    // e2fsprogs' view of the same flags.
    if have("chattr") && have("lsattr") {
        let o = chattr("-a", &d);
        assert!(o.status.success(), "chattr -a: {o:?}");
        let o = chattr("+d", &d);
        assert!(o.status.success(), "chattr +d: {o:?}");
        let attrs = lsattr(&d);
        assert!(attrs.starts_with("------d"), "lsattr -d: {attrs}");
        let attrs = lsattr(&f);
        assert!(attrs.starts_with("----i"), "lsattr: {attrs}");
        let o = chattr("-i", &f);
        assert!(o.status.success(), "chattr -i: {o:?}");
        assert!(lsattr(&f).starts_with("-----"), "{}", lsattr(&f));
        fs::remove_file(&f).unwrap();
    } else {
        eprintln!("chattr/lsattr not installed (e2fsprogs): raw ioctls only");
        set_flags(&f, 0).unwrap();
        fs::remove_file(&f).unwrap();
    }
    set_flags(&d, 0).unwrap();
    fs::remove_dir_all(&d).unwrap();
    m.unmount();
}

#[test]
fn unprivileged_owner_cannot_set_append_or_immutable() {
    let _serial = serial();
    if !is_root() {
        eprintln!("skipped: needs root to switch users");
        return;
    }
    // Other users may use a FUSE mount only with allow_other.
    let m = Mount::with_args(&["--allow-other"]);
    let f = m.p("f");
    fs::write(&f, b"").unwrap();
    std::os::unix::fs::chown(&f, Some(65534), Some(65534)).unwrap();
    let c = std::ffi::CString::new(f.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: the child calls only async-signal-safe functions (setgid,
    // setuid, open, ioctl, _exit); the parent only waits for it.
    let results = unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                libc::_exit(100);
            }
            let fd = libc::open(c.as_ptr(), libc::O_RDONLY);
            if fd < 0 {
                libc::_exit(101);
            }
            let nodump = NODUMP as libc::c_int;
            if libc::ioctl(fd, 0x4008_6602, &nodump) != 0 {
                libc::_exit(102);
            }
            let append = APPEND as libc::c_int;
            let r = libc::ioctl(fd, 0x4008_6602, &append);
            libc::_exit(if r == 0 { 0 } else { *libc::__errno_location() });
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        assert!(libc::WIFEXITED(status), "child died: {status}");
        libc::WEXITSTATUS(status)
    };
    assert_eq!(results, libc::EPERM, "owner setting append-only");
    assert_eq!(get_flags(&f).unwrap(), NODUMP, "the owner set nodump");
    m.unmount();
}

#[test]
fn flags_survive_remount_and_crash_of_a_durable_mount() {
    let _serial = serial();
    if !is_root() {
        eprintln!("skipped: setting append-only/immutable needs CAP_LINUX_IMMUTABLE");
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().to_str().unwrap();
    let args = ["--data-dir", dir, "--durability", "sync"];
    let m = Mount::with_args(&args);
    fs::write(m.p("f"), b"data").unwrap();
    fs::create_dir(m.p("d")).unwrap();
    set_flags(&m.p("f"), IMMUTABLE | NODUMP).unwrap();
    set_flags(&m.p("d"), APPEND).unwrap();
    // A clean unmount writes a checkpoint: the flags come back from it.
    m.unmount();
    let mut m = Mount::with_args(&args);
    assert_eq!(get_flags(&m.p("f")).unwrap(), IMMUTABLE | NODUMP);
    assert_eq!(get_flags(&m.p("d")).unwrap(), APPEND);
    assert_eperm(fs::remove_file(m.p("f")), "unlink after remount");
    // Changed after the checkpoint, then a crash: the journal brings the
    // change back.
    set_flags(&m.p("f"), NOATIME).unwrap();
    set_flags(&m.p("d"), 0).unwrap();
    m.kill();
    drop(m);
    let m = Mount::with_args(&args);
    assert_eq!(get_flags(&m.p("f")).unwrap(), NOATIME);
    assert_eq!(get_flags(&m.p("d")).unwrap(), 0);
    fs::remove_file(m.p("f")).unwrap();
    let e = fs::read(m.p("f")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    m.unmount();
}
