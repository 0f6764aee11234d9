//! Mounted tests of what xfstests (issue 14) holds memfs to: setgid cleared
//! by fallocate, write, truncate and copy_file_range for callers outside the
//! group, chown(f, -1, -1) updating
//! ctime, and the mount(8) helper conventions (silent, source as fsname,
//! fuse.memfs type, generic options, remount ro/rw).

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Mount, drop_caches, memfs_bin, poll_until};

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Runs `op` on `path` in a child process with uid and gid 65534 and no
/// supplementary groups; returns the child's errno (0: success).
fn as_nobody(path: &Path, op: fn(libc::c_int) -> libc::c_int) -> i32 {
    as_user(path, &[], libc::O_RDWR, op)
}

/// Runs `op` on `path`, opened with `flags`, in a child process with uid and
/// gid 65534 and the supplementary `groups`; returns the child's errno (0:
/// success). A child still running after 20 s (a request the server never
/// answers) is killed and the test fails.
fn as_user(
    path: &Path,
    groups: &[libc::gid_t],
    flags: libc::c_int,
    op: fn(libc::c_int) -> libc::c_int,
) -> i32 {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: the child calls only async-signal-safe functions (setgroups,
    // setgid, setuid, open, the operation, _exit) before exiting, as required
    // after fork in a multithreaded process; `c` and `groups` were made
    // before the fork. The parent only waits for it, and kills it on timeout.
    let pid = unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                || libc::setgid(65534) != 0
                || libc::setuid(65534) != 0
            {
                libc::_exit(100);
            }
            let fd = libc::open(c.as_ptr(), flags);
            if fd < 0 {
                libc::_exit(101);
            }
            let r = op(fd);
            libc::_exit(if r == 0 { 0 } else { *libc::__errno_location() });
        }
        pid
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child; `status` is ours.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        assert_eq!(r, 0, "waitpid failed");
        if std::time::Instant::now() > deadline {
            // SAFETY: our own child, not yet reaped; reaped right after.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            panic!(
                "the child's operation on {} did not finish in 20 s",
                path.display()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert!(libc::WIFEXITED(status), "child died: {status}");
    libc::WEXITSTATUS(status)
}

fn falloc_plain(fd: libc::c_int) -> libc::c_int {
    // SAFETY: fd is an open descriptor of the child; plain syscall.
    unsafe { libc::fallocate(fd, 0, 0, 4096) }
}

fn falloc_punch(fd: libc::c_int) -> libc::c_int {
    // SAFETY: as above.
    unsafe {
        libc::fallocate(
            fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            0,
            4096,
        )
    }
}

fn falloc_zero(fd: libc::c_int) -> libc::c_int {
    // SAFETY: as above.
    unsafe { libc::fallocate(fd, libc::FALLOC_FL_ZERO_RANGE, 0, 4096) }
}

fn write_some(fd: libc::c_int) -> libc::c_int {
    let b = [1u8; 16];
    // SAFETY: fd is an open descriptor of the child; b outlives the call.
    let n = unsafe { libc::pwrite(fd, b.as_ptr().cast(), b.len(), 0) };
    if n == b.len() as isize { 0 } else { -1 }
}

fn truncate_some(fd: libc::c_int) -> libc::c_int {
    // SAFETY: fd is an open descriptor of the child; plain syscall.
    unsafe { libc::ftruncate(fd, 100) }
}

/// Nothing: the open (with O_TRUNC) was the change.
fn opened(_fd: libc::c_int) -> libc::c_int {
    0
}

/// Copies the file's first 16 bytes to offset 8192 of itself.
fn copy_some(fd: libc::c_int) -> libc::c_int {
    let (mut off_in, mut off_out): (libc::loff_t, libc::loff_t) = (0, 8192);
    // SAFETY: fd is an open descriptor of the child; the offsets are ours.
    let n = unsafe { libc::copy_file_range(fd, &mut off_in, fd, &mut off_out, 16, 0) };
    if n == 16 { 0 } else { -1 }
}

/// The mode as `stat -c %a` sees it: statx asking for STATX_MODE only, which
/// the kernel answers from its attribute cache unless the mode was marked
/// stale (std's metadata asks for mtime too, which WRITE and FALLOCATE do
/// mark stale, and so would hide a stale mode).
fn cached_mode(path: &Path) -> u32 {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: statx fills the zeroed struct we own; c is a valid C string.
    let (r, stx) = unsafe {
        let mut stx: libc::statx = std::mem::zeroed();
        let r = libc::statx(libc::AT_FDCWD, c.as_ptr(), 0, libc::STATX_MODE, &mut stx);
        (r, stx)
    };
    assert_eq!(r, 0, "statx {}", path.display());
    u32::from(stx.stx_mode) & 0o7777
}

#[test]
fn fallocate_by_non_member_clears_setgid() {
    if !is_root() {
        eprintln!("skipped: needs root to switch users");
        return;
    }
    let m = Mount::with_args(&["--allow-other"]);
    let f = m.p("f");
    std::fs::write(&f, vec![7u8; 3 * 4096]).unwrap();
    for (name, op) in [
        ("allocate", falloc_plain as fn(_) -> _),
        ("punch hole", falloc_punch),
        ("zero range", falloc_zero),
    ] {
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o6666)).unwrap();
        // Fills the kernel's attribute cache with the setuid/setgid mode.
        assert_eq!(cached_mode(&f), 0o6666);
        assert_eq!(as_nobody(&f, op), 0, "{name} as nobody");
        assert_eq!(
            cached_mode(&f),
            0o666,
            "{name}: setuid and setgid are cleared, and the kernel sees it"
        );
        let mode = std::fs::metadata(&f).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o666, "{name}: setuid and setgid are cleared");
    }
    // A write clears setuid, and setgid where group-exec is set (generic/193, 355).
    for (before, after) in [(0o4666, 0o666), (0o6676, 0o676)] {
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(before)).unwrap();
        assert_eq!(cached_mode(&f), before);
        assert_eq!(as_nobody(&f, write_some), 0, "write as nobody");
        assert_eq!(cached_mode(&f), after, "write on {before:o}");
    }
    // Root (CAP_FSETID) keeps them.
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o6666)).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    nix::fcntl::fallocate(&file, nix::fcntl::FallocateFlags::empty(), 0, 4096).unwrap();
    assert_eq!(std::fs::metadata(&f).unwrap().mode() & 0o7777, 0o6666);
}

/// A write, a truncate, an `open(O_TRUNC)` and the destination of a
/// copy_file_range by a caller outside the file's group clear setgid even
/// without group-exec, as Linux's `setattr_should_drop_sgid` does; a member
/// by a supplementary group (which FUSE does not send: the server reads it)
/// keeps it and loses only setuid. The kernel sees the new mode at once.
#[test]
fn data_changes_by_non_members_clear_setgid() {
    if !is_root() {
        eprintln!("skipped: needs root to switch users");
        return;
    }
    let m = Mount::with_args(&["--allow-other"]);
    let f = m.p("f");
    for (name, flags, op) in [
        ("write", libc::O_RDWR, write_some as fn(_) -> _),
        ("truncate", libc::O_RDWR, truncate_some),
        ("open(O_TRUNC)", libc::O_RDWR | libc::O_TRUNC, opened),
        ("copy_file_range", libc::O_RDWR, copy_some),
    ] {
        for (who, groups, before, after) in [
            ("non-member", &[][..], 0o2666, 0o666),
            ("non-member", &[][..], 0o6666, 0o666),
            ("member", &[0][..], 0o6666, 0o2666),
            ("member", &[0][..], 0o2676, 0o676),
        ] {
            // Root's write keeps the bits; the mode is set after it anyway.
            std::fs::write(&f, vec![7u8; 3 * 4096]).unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(before)).unwrap();
            // Fills the kernel's attribute cache with the old mode.
            assert_eq!(cached_mode(&f), before);
            assert_eq!(
                as_user(&f, groups, flags, op),
                0,
                "{name} by a {who} on {before:o}"
            );
            assert_eq!(
                cached_mode(&f),
                after,
                "{name} by a {who} on {before:o}: the kernel sees the new mode"
            );
            let mode = std::fs::metadata(&f).unwrap().mode() & 0o7777;
            assert_eq!(mode, after, "{name} by a {who} on {before:o}");
        }
    }
}

#[test]
fn chown_to_nothing_updates_ctime() {
    let m = Mount::new();
    let f = m.p("f");
    std::fs::write(&f, b"x").unwrap();
    let before = std::fs::metadata(&f).unwrap();
    let before = (before.ctime(), before.ctime_nsec());
    // Wait for the clock to pass the ctime, so that "updated" is visible.
    poll_until("the clock to move past ctime", || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        (now.as_secs() as i64, now.subsec_nanos() as i64) > before
    });
    std::os::unix::fs::chown(&f, None, None).unwrap();
    let after = std::fs::metadata(&f).unwrap();
    assert!(
        (after.ctime(), after.ctime_nsec()) > before,
        "chown(f, -1, -1) updates ctime"
    );
}

/// Unmounts (lazily) in every path.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

fn mountinfo_line(mp: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = mp.to_string_lossy().into_owned();
    info.lines()
        .find(|l| l.split(' ').nth(4) == Some(want.as_str()))
        .map(str::to_string)
}

#[test]
fn mount_helper_conventions_and_remount() {
    if !is_root() {
        eprintln!("skipped: remount needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().canonicalize().unwrap();
    // mount(8) through mount.fuse3 runs `memfs SOURCE MOUNTPOINT -o OPTIONS`.
    let out = Command::new(memfs_bin())
        .arg("helper_src")
        .arg(&mp)
        .args([
            "-o",
            "rw,nodiratime,noatime,_netdev,x-systemd.foo,defaults,size=64M,dev,suid",
        ])
        .output()
        .unwrap();
    let _guard = Unmount(mp.clone());
    assert!(
        out.status.success(),
        "helper mount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stdout.is_empty(),
        "the helper prints nothing on success"
    );
    let line = mountinfo_line(&mp).expect("mounted");
    let fields: Vec<&str> = line.split(" - ").nth(1).unwrap().split(' ').collect();
    assert_eq!(fields[0], "fuse.memfs", "type: {line}");
    assert_eq!(
        fields[1], "helper_src",
        "source is the device column: {line}"
    );

    std::fs::write(mp.join("f"), b"data").unwrap();
    let remount = |opts: &str| helper_remount("helper_src", &mp, opts);
    remount("ro,noatime,remount,user_id=0,group_id=0,default_permissions,dev,suid");
    let err = std::fs::write(mp.join("g"), b"x").unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(libc::EROFS),
        "read-only after remount"
    );
    assert_eq!(
        std::fs::read(mp.join("f")).unwrap(),
        b"data",
        "contents kept"
    );
    remount("rw,remount");
    std::fs::write(mp.join("g"), b"x").expect("writable again");
    assert_eq!(std::fs::read(mp.join("f")).unwrap(), b"data");

    let bad = Command::new(memfs_bin())
        .arg("helper_src")
        .arg(&mp)
        .args(["-o", "remount,bogus_option"])
        .output()
        .unwrap();
    assert!(!bad.status.success(), "unknown options are still refused");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("bogus_option"));
}

/// A file handle from name_to_handle_at(2).
struct Handle {
    buf: Vec<u64>,
}

fn name_to_handle(path: &Path) -> Handle {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // Room for MAX_HANDLE_SZ (128) bytes after the header, 8-byte aligned.
    let mut buf = vec![0u64; (8 + 128) / 8];
    let fh = buf.as_mut_ptr() as *mut libc::file_handle;
    let mut mount_id = 0;
    // SAFETY: `fh` points to a zeroed, aligned buffer large enough for the
    // header and MAX_HANDLE_SZ bytes, whose size handle_bytes announces.
    let r = unsafe {
        (*fh).handle_bytes = 128;
        libc::name_to_handle_at(libc::AT_FDCWD, c.as_ptr(), fh, &mut mount_id, 0)
    };
    assert_eq!(
        r,
        0,
        "name_to_handle_at: {}",
        std::io::Error::last_os_error()
    );
    Handle { buf }
}

fn open_by_handle(mount: &std::fs::File, h: &mut Handle) -> std::io::Result<std::fs::File> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let fh = h.buf.as_mut_ptr() as *mut libc::file_handle;
    // SAFETY: `fh` is a handle filled in by name_to_handle_at in a buffer
    // that outlives the call; the returned descriptor is owned by the File.
    let fd = unsafe { libc::open_by_handle_at(mount.as_raw_fd(), fh, libc::O_RDONLY) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// Handles stay valid after the kernel drops its caches (it then looks up
/// "." in the inode number the handle carries), and go stale once the file
/// is gone.
#[test]
fn file_handles_survive_cache_drops() {
    if !is_root() {
        eprintln!("skipped: open_by_handle_at and drop_caches need root");
        return;
    }
    let m = Mount::new();
    std::fs::create_dir(m.p("d")).unwrap();
    std::fs::write(m.p("d/f"), b"handle data").unwrap();
    let mut hf = name_to_handle(&m.p("d/f"));
    let mut hd = name_to_handle(&m.p("d"));
    let mount_fd = std::fs::File::open(m.path()).unwrap();
    drop_caches();
    let f = open_by_handle(&mount_fd, &mut hf).expect("file handle after drop_caches");
    assert_eq!(std::io::read_to_string(f).unwrap(), "handle data");
    let d = open_by_handle(&mount_fd, &mut hd).expect("directory handle after drop_caches");
    assert!(d.metadata().unwrap().is_dir());
    drop(d);
    std::fs::remove_file(m.p("d/f")).unwrap();
    // Once the kernel has let the inode go, the handle is stale. The first
    // decode above left an anonymous dentry that still holds the inode, and
    // drop_caches frees what it can at that moment: a dentry used just now
    // can outlive a pass (seen under load), and while it does the handle
    // still opens the unlinked file, from the kernel's cache (tmpfs too).
    // So drop until it has gone; memfs must then answer the LOOKUP of "."
    // that the decode sends with an error, never with the removed file.
    poll_until("the removed file's handle to go stale", || {
        drop_caches();
        match open_by_handle(&mount_fd, &mut hf) {
            Ok(_) => false,
            Err(e) => {
                assert_eq!(
                    e.raw_os_error(),
                    Some(libc::ESTALE),
                    "a removed file's handle is stale: {e}"
                );
                true
            }
        }
    });
}

fn rename_whiteout(from: &Path, to: &Path) -> std::io::Result<()> {
    let a = CString::new(from.as_os_str().as_bytes()).unwrap();
    let b = CString::new(to.as_os_str().as_bytes()).unwrap();
    // SAFETY: both are valid C strings that outlive the call.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_WHITEOUT,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn assert_whiteout(path: &Path) {
    use std::os::unix::fs::FileTypeExt;
    let md = std::fs::symlink_metadata(path).unwrap();
    assert!(md.file_type().is_char_device(), "{}", path.display());
    assert_eq!((md.rdev(), md.mode() & 0o7777), (0, 0));
}

#[test]
fn rename_whiteout_in_memory_and_durable() {
    if !is_root() {
        eprintln!("skipped: RENAME_WHITEOUT needs CAP_MKNOD");
        return;
    }
    let m = Mount::new();
    std::fs::write(m.p("f"), b"data").unwrap();
    rename_whiteout(&m.p("f"), &m.p("g")).unwrap();
    assert_eq!(std::fs::read(m.p("g")).unwrap(), b"data");
    assert_whiteout(&m.p("f"));
    // A whiteout is an ordinary node afterwards: it can be removed.
    std::fs::remove_file(m.p("f")).unwrap();
    drop(m);

    // On a durable mount it is journaled: it is still there after a remount.
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().to_str().unwrap();
    let m = Mount::with_args(&["--data-dir", dir]);
    std::fs::create_dir(m.p("d")).unwrap();
    std::fs::write(m.p("d/f"), b"data").unwrap();
    rename_whiteout(&m.p("d/f"), &m.p("moved")).unwrap();
    m.unmount();
    let m = Mount::with_args(&["--data-dir", dir]);
    assert_whiteout(&m.p("d/f"));
    assert_eq!(std::fs::read(m.p("moved")).unwrap(), b"data");
    m.unmount();
}

/// Reads `path` whole through a new open (as `cat` does), then returns its
/// atime as statx gives it (the kernel refetches atime after a READ).
fn read_then_atime(path: &Path) -> std::time::SystemTime {
    std::fs::read(path).unwrap();
    std::fs::metadata(path).unwrap().accessed().unwrap()
}

fn set_atime(path: &Path, t: std::time::SystemTime) {
    let f = std::fs::File::open(path).unwrap();
    f.set_times(std::fs::FileTimes::new().set_accessed(t))
        .unwrap();
}

/// Runs memfs as mount(8) runs a mount helper (`SOURCE MOUNTPOINT -o
/// OPTS`), asserting that it succeeds and prints nothing.
fn helper_remount(source: &str, mp: &Path, opts: &str) {
    let out = Command::new(memfs_bin())
        .arg(source)
        .arg(mp)
        .args(["-o", opts])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "remount {opts}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stdout.is_empty(),
        "the helper prints nothing on success"
    );
}

/// `mount -o remount,...` changes the atime policy of a running mount: the
/// kernel does not tell a FUSE server about a remount, so the helper sends
/// the options to the server. Each read below reaches memfs (a partial page
/// written just before is not cached as up to date).
#[test]
fn atime_policy_follows_remount() {
    use std::time::{Duration, SystemTime};
    if !is_root() {
        eprintln!("skipped: remounting needs root");
        return;
    }
    let past = SystemTime::now() - Duration::from_secs(1000);
    let future = SystemTime::now() + Duration::from_secs(1000);
    let m = Mount::new();
    let (mp, f) = (m.path(), m.p("f"));
    let remount = |opts: &str| helper_remount("memfs", &mp, &format!("remount,{opts}"));
    // A fresh change, then an access before it: relatime would record a read.
    let fresh = |atime: SystemTime| {
        std::fs::write(&f, b"data").unwrap();
        set_atime(&f, atime);
    };

    remount("noatime");
    fresh(past);
    assert_eq!(read_then_atime(&f), past, "remount,noatime records no read");

    remount("strictatime");
    fresh(future);
    assert_ne!(
        read_then_atime(&f),
        future,
        "remount,strictatime records a read relatime would not"
    );

    fresh(past);
    remount("ro");
    assert_eq!(
        read_then_atime(&f),
        past,
        "a read-only mount records no read"
    );
    remount("rw");
    fresh(future);
    assert_ne!(
        read_then_atime(&f),
        future,
        "remount,rw brings back the policy (strictatime)"
    );

    remount("relatime");
    fresh(future);
    assert_eq!(
        read_then_atime(&f),
        future,
        "relatime: a later access stays"
    );
    fresh(past);
    assert!(
        read_then_atime(&f) > past,
        "relatime records the first read"
    );
}

/// The atime policy given at mount time (generic/003) is the engine's: a
/// FUSE kernel never updates atime itself. relatime (the default) records a
/// read when the last access is not later than the last change; strictatime
/// records every read after an open (the page cache is not kept across
/// opens, or a cached read would go unseen); noatime none.
#[test]
fn atime_policy_at_mount_time() {
    use std::time::{Duration, SystemTime};
    let past = SystemTime::now() - Duration::from_secs(1000);
    let future = SystemTime::now() + Duration::from_secs(1000);

    let m = Mount::new();
    let f = m.p("f");
    std::fs::write(&f, b"data").unwrap();
    // Setting it changes ctime, so an access in the past predates the change.
    set_atime(&f, past);
    let first = read_then_atime(&f);
    assert!(
        first > past,
        "relatime records the first read after a change"
    );
    set_atime(&f, future);
    assert_eq!(
        read_then_atime(&f),
        future,
        "relatime: a later access stays"
    );
    drop(m);

    let m = Mount::with_args(&["-o", "strictatime"]);
    let f = m.p("f");
    std::fs::write(&f, b"data").unwrap();
    for round in 0..2 {
        set_atime(&f, future);
        assert_ne!(
            read_then_atime(&f),
            future,
            "strictatime records every read (open {round})"
        );
    }
    drop(m);

    let m = Mount::with_args(&["-o", "noatime,nodiratime"]);
    let f = m.p("f");
    std::fs::write(&f, b"data").unwrap();
    set_atime(&f, past);
    assert_eq!(read_then_atime(&f), past, "noatime records no read");
    let line = mountinfo_line(&m.path()).expect("mounted");
    assert!(
        line.split(' ')
            .nth(5)
            .unwrap()
            .split(',')
            .any(|o| o == "noatime"),
        "noatime is the mount's flag too: {line}"
    );
}
