//! POSIX semantics through real system calls on a real memfs mount.

mod common;

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use common::Mount;

fn errno<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    r.expect_err("expected an error")
        .raw_os_error()
        .expect("an OS error")
}

fn nix_errno<T: std::fmt::Debug>(r: nix::Result<T>) -> i32 {
    r.expect_err("expected an error") as i32
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn setxattr(p: &Path, name: &str, value: &[u8], flags: i32) -> std::io::Result<()> {
    let (p, n) = (cpath(p), CString::new(name).unwrap());
    // SAFETY: valid NUL-terminated strings and a valid buffer of the given length.
    let r = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn getxattr(p: &Path, name: &str, size: usize) -> std::io::Result<Vec<u8>> {
    let (p, n) = (cpath(p), CString::new(name).unwrap());
    let mut buf = vec![0u8; size];
    // SAFETY: valid NUL-terminated strings and a writable buffer of `size` bytes.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), size) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(if size == 0 { 0 } else { r as usize });
    if size == 0 {
        buf = vec![0; r as usize];
    }
    Ok(buf)
}

fn listxattr(p: &Path) -> Vec<String> {
    let p = cpath(p);
    let mut buf = vec![0u8; 4096];
    // SAFETY: a valid path and a writable buffer of its length.
    let r = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(r >= 0, "listxattr: {}", std::io::Error::last_os_error());
    buf.truncate(r as usize);
    buf.split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8(s.to_vec()).unwrap())
        .collect()
}

fn removexattr(p: &Path, name: &str) -> std::io::Result<()> {
    let (p, n) = (cpath(p), CString::new(name).unwrap());
    // SAFETY: valid NUL-terminated strings.
    let r = unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[test]
fn files_directories_and_errnos() {
    let m = Mount::new();
    let root = m.path();
    fs::write(m.p("a"), b"hello").unwrap();
    assert_eq!(fs::read(m.p("a")).unwrap(), b"hello");
    assert_eq!(errno(File::open(m.p("missing"))), libc::ENOENT);
    fs::create_dir(m.p("d")).unwrap();
    assert_eq!(errno(fs::create_dir(m.p("d"))), libc::EEXIST);
    fs::write(m.p("d/f"), b"x").unwrap();
    assert_eq!(errno(fs::remove_dir(m.p("d"))), libc::ENOTEMPTY);
    assert_eq!(errno(fs::remove_dir(m.p("a"))), libc::ENOTDIR);
    assert_eq!(errno(fs::remove_file(m.p("d"))), libc::EISDIR);
    assert_eq!(errno(fs::write(m.p("a/x"), b"")), libc::ENOTDIR);
    let long = "n".repeat(256);
    assert_eq!(errno(fs::write(root.join(&long), b"")), libc::ENAMETOOLONG);
    fs::write(root.join("n".repeat(255)), b"ok").unwrap();
    // Hard links: not to directories; nlink counts.
    assert_eq!(errno(fs::hard_link(m.p("d"), m.p("dl"))), libc::EPERM);
    fs::hard_link(m.p("a"), m.p("b")).unwrap();
    assert_eq!(fs::metadata(m.p("a")).unwrap().nlink(), 2);
    assert_eq!(errno(fs::hard_link(m.p("a"), m.p("b"))), libc::EEXIST);
    // A directory's nlink counts its subdirectories.
    fs::create_dir(m.p("d/s1")).unwrap();
    fs::create_dir(m.p("d/s2")).unwrap();
    assert_eq!(fs::metadata(m.p("d")).unwrap().nlink(), 4);
    fs::remove_dir(m.p("d/s2")).unwrap();
    assert_eq!(fs::metadata(m.p("d")).unwrap().nlink(), 3);
    // Symlinks, with the 4095-byte target limit.
    std::os::unix::fs::symlink("a", m.p("s")).unwrap();
    assert_eq!(fs::read(m.p("s")).unwrap(), b"hello");
    assert_eq!(fs::read_link(m.p("s")).unwrap(), Path::new("a"));
    let t4095 = "t".repeat(4095);
    std::os::unix::fs::symlink(&t4095, m.p("s4095")).unwrap();
    assert_eq!(fs::read_link(m.p("s4095")).unwrap().as_os_str().len(), 4095);
    let t4096 = "t".repeat(4096);
    assert_eq!(
        errno(std::os::unix::fs::symlink(&t4096, m.p("s4096"))),
        libc::ENAMETOOLONG
    );
    // readdir sees everything once.
    let mut names: Vec<_> = fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 6, "{names:?}");
    m.unmount();
}

/// O_CREAT in each open mode: the default mount declines OPEN and CREATE (the
/// kernel creates with MKNOD and opens with no message), `--locks engine`
/// answers both; what a caller sees must not differ.
#[test]
fn o_creat_is_the_same_whether_create_is_answered_or_declined() {
    for args in [&[][..], &["--locks", "engine"][..]] {
        let m = Mount::with_args(args);
        let p = m.p("f");
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o640)
            .open(&p)
            .unwrap();
        f.write_all(b"hello").unwrap();
        let md = fs::metadata(&p).unwrap();
        assert!(md.is_file(), "{args:?}");
        // The test process's umask (022 or stricter) leaves 0640 as it is.
        assert_eq!(md.mode() & 0o7777, 0o640, "{args:?}");
        assert_eq!(
            errno(OpenOptions::new().write(true).create_new(true).open(&p)),
            libc::EEXIST
        );
        // O_CREAT without O_EXCL opens the existing file and keeps its bytes.
        drop(
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(&p)
                .unwrap(),
        );
        assert_eq!(fs::read(&p).unwrap(), b"hello", "{args:?}");
        // O_CREAT|O_TRUNC of an existing file empties it.
        drop(File::create(&p).unwrap());
        assert_eq!(fs::metadata(&p).unwrap().len(), 0, "{args:?}");
        // The descriptor of a created file works after its name is gone.
        let mut g = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(m.p("g"))
            .unwrap();
        fs::remove_file(m.p("g")).unwrap();
        g.write_all(b"kept").unwrap();
        g.seek(SeekFrom::Start(0)).unwrap();
        let mut back = String::new();
        g.read_to_string(&mut back).unwrap();
        assert_eq!(back, "kept", "{args:?}");
        // Creating in a missing or read-only-by-mode directory fails as on tmpfs.
        assert_eq!(errno(File::create(m.p("missing/f"))), libc::ENOENT);
        drop((f, g));
        m.unmount();
    }
}

#[test]
fn rename_rules() {
    use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
    let m = Mount::new();
    fs::create_dir_all(m.p("d/sub/deep")).unwrap();
    fs::create_dir(m.p("e")).unwrap();
    fs::write(m.p("f"), b"f").unwrap();
    fs::write(m.p("g"), b"g").unwrap();
    assert_eq!(errno(fs::rename(m.p("d"), m.p("d/sub/x"))), libc::EINVAL);
    assert_eq!(errno(fs::rename(m.p("f"), m.p("e"))), libc::EISDIR);
    assert_eq!(errno(fs::rename(m.p("e"), m.p("f"))), libc::ENOTDIR);
    assert_eq!(errno(fs::rename(m.p("e"), m.p("d"))), libc::ENOTEMPTY);
    // Replace a file, then an empty directory.
    fs::rename(m.p("f"), m.p("g")).unwrap();
    assert_eq!(fs::read(m.p("g")).unwrap(), b"f");
    assert!(!m.p("f").exists());
    fs::create_dir(m.p("empty")).unwrap();
    fs::rename(m.p("e"), m.p("empty")).unwrap();
    assert!(!m.p("e").exists());
    // Moving a directory updates both parents' link counts and its `..`.
    let before = fs::metadata(m.p("d")).unwrap().nlink();
    fs::rename(m.p("empty"), m.p("d/moved")).unwrap();
    assert_eq!(fs::metadata(m.p("d")).unwrap().nlink(), before + 1);
    assert_eq!(
        fs::metadata(m.p("d/moved/..")).unwrap().ino(),
        fs::metadata(m.p("d")).unwrap().ino()
    );
    // RENAME_NOREPLACE and RENAME_EXCHANGE.
    fs::write(m.p("x"), b"x").unwrap();
    fs::write(m.p("y"), b"y").unwrap();
    assert_eq!(
        nix_errno(renameat2(
            AT_FDCWD,
            &m.p("x"),
            AT_FDCWD,
            &m.p("y"),
            RenameFlags::RENAME_NOREPLACE
        )),
        libc::EEXIST
    );
    renameat2(
        AT_FDCWD,
        &m.p("x"),
        AT_FDCWD,
        &m.p("y"),
        RenameFlags::RENAME_EXCHANGE,
    )
    .unwrap();
    assert_eq!(fs::read(m.p("x")).unwrap(), b"y");
    assert_eq!(fs::read(m.p("y")).unwrap(), b"x");
    assert_eq!(
        nix_errno(renameat2(
            AT_FDCWD,
            &m.p("x"),
            AT_FDCWD,
            &m.p("nope"),
            RenameFlags::RENAME_EXCHANGE
        )),
        libc::ENOENT
    );
    // Exchanging a file with a directory in another directory.
    renameat2(
        AT_FDCWD,
        &m.p("x"),
        AT_FDCWD,
        &m.p("d/sub"),
        RenameFlags::RENAME_EXCHANGE,
    )
    .unwrap();
    assert!(m.p("x/deep").is_dir());
    assert_eq!(fs::read(m.p("d/sub")).unwrap(), b"y");
    m.unmount();
}

#[test]
fn unlinked_open_file_stays_usable() {
    let m = Mount::new();
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("tmp"))
        .unwrap();
    f.write_all(b"before").unwrap();
    fs::remove_file(m.p("tmp")).unwrap();
    assert!(!m.p("tmp").exists());
    f.write_all(b" after").unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "before after");
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    drop(f);
    m.unmount();
}

#[test]
fn sparse_files_holes_and_fallocate() {
    use nix::fcntl::{FallocateFlags, fallocate};
    let m = Mount::new();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("sparse"))
        .unwrap();
    // A 1 TiB sparse file costs (almost) nothing.
    f.set_len(1 << 40).unwrap();
    let md = f.metadata().unwrap();
    assert_eq!(md.len(), 1 << 40);
    assert_eq!(md.blocks(), 0);
    f.write_all_at(b"data", 1 << 30).unwrap();
    let mut buf = [1u8; 8];
    f.read_exact_at(&mut buf, (1 << 30) - 4).unwrap();
    assert_eq!(&buf, b"\0\0\0\0data");
    // SEEK_DATA / SEEK_HOLE.
    let fd = f.as_raw_fd();
    // SAFETY: lseek on a valid descriptor.
    let data = unsafe { libc::lseek(fd, 0, libc::SEEK_DATA) };
    assert_eq!(data, 1 << 30);
    // SAFETY: as above.
    let hole = unsafe { libc::lseek(fd, 1 << 30, libc::SEEK_HOLE) };
    assert_eq!(hole, (1 << 30) + 4096);
    // Writes extend the size to max(size, off + len) and never shrink it.
    let g = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("grow"))
        .unwrap();
    g.write_all_at(b"abc", 10).unwrap();
    g.write_all_at(b"z", 0).unwrap();
    assert_eq!(g.metadata().unwrap().len(), 13);
    assert_eq!(fs::read(m.p("grow")).unwrap(), b"z\0\0\0\0\0\0\0\0\0abc");
    // Truncate down then up: no stale bytes come back.
    g.set_len(11).unwrap();
    g.set_len(13).unwrap();
    assert_eq!(fs::read(m.p("grow")).unwrap(), b"z\0\0\0\0\0\0\0\0\0a\0\0");
    // fallocate: allocate, keep-size, punch-hole, zero-range; unsupported modes.
    let h = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("fa"))
        .unwrap();
    fallocate(&h, FallocateFlags::empty(), 0, 8192).unwrap();
    assert_eq!(h.metadata().unwrap().len(), 8192);
    assert_eq!(h.metadata().unwrap().blocks(), 16);
    fallocate(&h, FallocateFlags::FALLOC_FL_KEEP_SIZE, 8192, 8192).unwrap();
    assert_eq!(h.metadata().unwrap().len(), 8192);
    h.write_all_at(&[7u8; 8192], 0).unwrap();
    fallocate(
        &h,
        FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
        0,
        4096,
    )
    .unwrap();
    let mut b = vec![0u8; 8192];
    h.read_exact_at(&mut b, 0).unwrap();
    assert!(b[..4096].iter().all(|&x| x == 0) && b[4096..].iter().all(|&x| x == 7));
    fallocate(&h, FallocateFlags::FALLOC_FL_ZERO_RANGE, 4096, 100).unwrap();
    h.read_exact_at(&mut b, 0).unwrap();
    assert!(b[4096..4196].iter().all(|&x| x == 0) && b[4196..].iter().all(|&x| x == 7));
    assert_eq!(
        nix_errno(fallocate(
            &h,
            FallocateFlags::FALLOC_FL_COLLAPSE_RANGE,
            0,
            4096
        )),
        libc::EOPNOTSUPP
    );
    drop((f, g, h));
    m.unmount();
}

#[test]
fn extended_attributes() {
    let m = Mount::new();
    let p = m.p("x");
    fs::write(&p, b"").unwrap();
    setxattr(&p, "user.a", b"1", 0).unwrap();
    assert_eq!(getxattr(&p, "user.a", 64).unwrap(), b"1");
    assert_eq!(
        errno(setxattr(&p, "user.a", b"2", libc::XATTR_CREATE)),
        libc::EEXIST
    );
    assert_eq!(
        errno(setxattr(&p, "user.b", b"2", libc::XATTR_REPLACE)),
        libc::ENODATA
    );
    setxattr(&p, "user.a", b"22", libc::XATTR_REPLACE).unwrap();
    assert_eq!(getxattr(&p, "user.a", 0).unwrap().len(), 2, "size query");
    assert_eq!(errno(getxattr(&p, "user.a", 1)), libc::ERANGE);
    assert_eq!(errno(getxattr(&p, "user.none", 64)), libc::ENODATA);
    setxattr(&p, "trusted.t", b"t", 0).unwrap();
    setxattr(&p, "security.s", b"s", 0).unwrap();
    let mut names = listxattr(&p);
    names.sort();
    assert_eq!(names, ["security.s", "trusted.t", "user.a"]);
    assert_eq!(
        errno(setxattr(&p, "user.big", &vec![0u8; 65537], 0)),
        libc::E2BIG
    );
    assert_eq!(
        errno(setxattr(&p, &format!("user.{}", "n".repeat(251)), b"", 0)),
        libc::ERANGE
    );
    removexattr(&p, "user.a").unwrap();
    assert_eq!(errno(removexattr(&p, "user.a")), libc::ENODATA);
    m.unmount();
}

#[test]
fn capacity_and_inode_limits_give_enospc() {
    let m = Mount::with_args(&["--size", "1M", "--inodes", "20"]);
    let st = nix::sys::statvfs::statvfs(&m.path()).unwrap();
    assert_eq!(st.blocks() * st.fragment_size(), 1 << 20);
    assert_eq!(st.files(), 20);
    let mut f = File::create(m.p("big")).unwrap();
    let chunk = vec![1u8; 64 << 10];
    let mut written = 0;
    let err = loop {
        match f.write_all(&chunk) {
            Ok(()) => written += chunk.len(),
            Err(e) => break e,
        }
        assert!(written <= 2 << 20, "wrote past the capacity");
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    assert!(written >= 900 << 10, "only {written} bytes fit in 1 MiB");
    drop(f);
    let st = nix::sys::statvfs::statvfs(&m.path()).unwrap();
    assert!(st.blocks_free() < 16);
    fs::remove_file(m.p("big")).unwrap();
    // The server lets `big` go when the kernel forgets it, a message the
    // kernel sends after the unlink has returned (over io_uring possibly on
    // the other CPU's queue, later still).
    common::poll_until("the unlinked file's inode to be freed", || {
        nix::sys::statvfs::statvfs(&m.path()).unwrap().files_free() == 19
    });
    // Inodes: the root and `big` (gone) leave 19 for new files.
    let mut created = 0;
    let err = loop {
        match File::create(m.p(&format!("f{created}"))) {
            Ok(_) => created += 1,
            Err(e) => break e,
        }
        assert!(created <= 20, "created past the inode limit");
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    assert_eq!(created, 19);
    m.unmount();
}

#[test]
fn times_and_permission_bits() {
    let m = Mount::new();
    let p = m.p("t");
    fs::write(&p, b"a").unwrap();
    let t0 = fs::metadata(&p).unwrap();
    // Wait for the clock to move on (polling, not a fixed sleep).
    let start = std::time::SystemTime::now();
    while std::time::SystemTime::now() == start {}
    fs::write(&p, b"bb").unwrap();
    let t1 = fs::metadata(&p).unwrap();
    assert!(
        t1.mtime_nsec() != t0.mtime_nsec() || t1.mtime() != t0.mtime(),
        "write updates mtime"
    );
    fs::set_permissions(&p, fs::Permissions::from_mode(0o4755)).unwrap();
    let t2 = fs::metadata(&p).unwrap();
    assert_eq!(t2.mode() & 0o7777, 0o4755);
    assert!((t2.ctime(), t2.ctime_nsec()) >= (t1.ctime(), t1.ctime_nsec()));
    // chown clears setuid.
    std::os::unix::fs::chown(&p, Some(1), Some(1)).unwrap();
    let t3 = fs::metadata(&p).unwrap();
    assert_eq!((t3.uid(), t3.gid()), (1, 1));
    assert_eq!(t3.mode() & 0o4000, 0, "setuid cleared by chown");
    // New nodes in a setgid directory take its group; subdirectories keep the bit.
    fs::create_dir(m.p("g")).unwrap();
    std::os::unix::fs::chown(m.p("g"), None, Some(1234)).unwrap();
    fs::set_permissions(m.p("g"), fs::Permissions::from_mode(0o2775)).unwrap();
    fs::write(m.p("g/f"), b"").unwrap();
    fs::create_dir(m.p("g/sub")).unwrap();
    assert_eq!(fs::metadata(m.p("g/f")).unwrap().gid(), 1234);
    let sub = fs::metadata(m.p("g/sub")).unwrap();
    assert_eq!(sub.gid(), 1234);
    assert_ne!(sub.mode() & 0o2000, 0, "subdirectory inherits setgid");
    // utimensat with explicit nanosecond times.
    let ts = nix::sys::time::TimeSpec::new(1_000_000_000, 123_456_789);
    nix::sys::stat::utimensat(
        nix::fcntl::AT_FDCWD,
        &p,
        &ts,
        &ts,
        nix::sys::stat::UtimensatFlags::FollowSymlink,
    )
    .unwrap();
    let t4 = fs::metadata(&p).unwrap();
    assert_eq!((t4.mtime(), t4.mtime_nsec()), (1_000_000_000, 123_456_789));
    assert_eq!((t4.atime(), t4.atime_nsec()), (1_000_000_000, 123_456_789));
    m.unmount();
}

#[test]
fn special_nodes() {
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};
    let m = Mount::new();
    mknod(
        &m.p("fifo"),
        SFlag::S_IFIFO,
        Mode::from_bits_truncate(0o644),
        0,
    )
    .unwrap();
    mknod(
        &m.p("chr"),
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o600),
        makedev(1, 3),
    )
    .unwrap();
    mknod(
        &m.p("blk"),
        SFlag::S_IFBLK,
        Mode::from_bits_truncate(0o600),
        makedev(7, 0),
    )
    .unwrap();
    mknod(
        &m.p("sock"),
        SFlag::S_IFSOCK,
        Mode::from_bits_truncate(0o600),
        0,
    )
    .unwrap();
    use std::os::unix::fs::FileTypeExt;
    assert!(fs::metadata(m.p("fifo")).unwrap().file_type().is_fifo());
    let chr = fs::metadata(m.p("chr")).unwrap();
    assert!(chr.file_type().is_char_device());
    assert_eq!(chr.rdev(), makedev(1, 3));
    assert!(
        fs::metadata(m.p("blk"))
            .unwrap()
            .file_type()
            .is_block_device()
    );
    assert!(
        fs::symlink_metadata(m.p("sock"))
            .unwrap()
            .file_type()
            .is_socket()
    );
    // A FIFO on memfs works as a FIFO (the kernel handles its data).
    let p = m.p("fifo");
    let w = std::thread::spawn(move || fs::write(p, b"through the pipe").unwrap());
    assert_eq!(fs::read(m.p("fifo")).unwrap(), b"through the pipe");
    w.join().unwrap();
    m.unmount();
}

/// The default: the kernel keeps record locks, as for tmpfs.
#[test]
fn record_locks_kept_by_the_kernel() {
    record_locks_across_open_file_descriptions(Mount::new());
}

/// `--locks engine`: the same rules, kept by memfs through FUSE.
#[test]
fn record_locks_kept_by_the_engine() {
    record_locks_across_open_file_descriptions(Mount::with_args(&["--locks", "engine"]));
}

fn record_locks_across_open_file_descriptions(m: Mount) {
    use nix::fcntl::{FcntlArg, fcntl};
    fs::write(m.p("lock"), b"0123456789").unwrap();
    let a = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("lock"))
        .unwrap();
    let b = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("lock"))
        .unwrap();
    let lk = common::range_lock;
    fcntl(&a, FcntlArg::F_OFD_SETLK(&lk(libc::F_WRLCK, 0, 5))).unwrap();
    assert_eq!(
        nix_errno(fcntl(&b, FcntlArg::F_OFD_SETLK(&lk(libc::F_RDLCK, 4, 2)))),
        libc::EAGAIN
    );
    fcntl(&b, FcntlArg::F_OFD_SETLK(&lk(libc::F_WRLCK, 5, 5))).unwrap();
    let mut q = lk(libc::F_WRLCK, 0, 1);
    fcntl(&b, FcntlArg::F_OFD_GETLK(&mut q)).unwrap();
    assert_eq!(q.l_type as i32, libc::F_WRLCK);
    assert_eq!((q.l_start, q.l_len), (0, 5));
    // A blocked waiter sleeps until the range is released.
    let waiter = std::thread::spawn(move || {
        fcntl(&b, FcntlArg::F_OFD_SETLKW(&lk(libc::F_WRLCK, 0, 1))).unwrap();
        b
    });
    fcntl(&a, FcntlArg::F_OFD_SETLK(&lk(libc::F_UNLCK, 0, 5))).unwrap();
    let b = waiter.join().unwrap();
    assert_eq!(
        nix_errno(fcntl(&a, FcntlArg::F_OFD_SETLK(&lk(libc::F_RDLCK, 0, 1)))),
        libc::EAGAIN
    );
    // Closing the description releases its locks. With engine locks, FUSE
    // delivers RELEASE (which carries the unlock) after close() has returned, so
    // the lock frees soon, not at once; anything but EAGAIN while waiting is a
    // real failure.
    drop(b);
    common::poll_until(
        "the closed description's locks to be released",
        || match fcntl(&a, FcntlArg::F_OFD_SETLK(&lk(libc::F_WRLCK, 0, 10))) {
            Ok(_) => true,
            Err(nix::errno::Errno::EAGAIN) => false,
            Err(e) => panic!("F_OFD_SETLK: {e}"),
        },
    );
    // Classic POSIX locks belong to the process: closing any descriptor of the
    // file drops them, synchronously (the rule OFD locks were made to escape).
    let classic = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("lock"))
        .unwrap();
    fcntl(&classic, FcntlArg::F_SETLK(&lk(libc::F_WRLCK, 20, 5))).unwrap();
    let other = File::open(m.p("lock")).unwrap();
    assert_eq!(
        nix_errno(fcntl(
            &other,
            FcntlArg::F_OFD_SETLK(&lk(libc::F_RDLCK, 22, 1))
        )),
        libc::EAGAIN
    );
    drop(File::open(m.p("lock")).unwrap());
    fcntl(&other, FcntlArg::F_OFD_SETLK(&lk(libc::F_RDLCK, 22, 1))).unwrap();
    drop((classic, other));
    // flock works too (exclusive between descriptions).
    let c = File::open(m.p("lock")).unwrap();
    let d = File::open(m.p("lock")).unwrap();
    let held = nix::fcntl::Flock::lock(c, nix::fcntl::FlockArg::LockExclusiveNonblock).unwrap();
    let (d, e) = nix::fcntl::Flock::lock(d, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .expect_err("second exclusive flock must fail");
    assert_eq!(e, nix::errno::Errno::EWOULDBLOCK);
    drop(held);
    // Flock::drop unlocks with LOCK_UN before closing: synchronous, no wait.
    let again = nix::fcntl::Flock::lock(d, nix::fcntl::FlockArg::LockExclusiveNonblock).unwrap();
    drop((a, again));
    m.unmount();
}

#[test]
fn copy_file_range_and_direct_io() {
    let m = Mount::new();
    let data: Vec<u8> = (0..3 << 20).map(|i| (i % 253) as u8).collect();
    fs::write(m.p("src"), &data).unwrap();
    let src = File::open(m.p("src")).unwrap();
    let dst = File::create(m.p("dst")).unwrap();
    let mut off_in = 0i64;
    let mut off_out = 0i64;
    let mut left = data.len();
    while left > 0 {
        // SAFETY: valid descriptors and offset pointers.
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &mut off_in,
                dst.as_raw_fd(),
                &mut off_out,
                left,
                0,
            )
        };
        assert!(
            n > 0,
            "copy_file_range: {}",
            std::io::Error::last_os_error()
        );
        left -= n as usize;
    }
    drop(dst);
    assert_eq!(fs::read(m.p("dst")).unwrap(), data);
    // O_DIRECT with aligned buffers.
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(m.p("direct"))
        .unwrap();
    let layout = std::alloc::Layout::from_size_align(1 << 20, 4096).unwrap();
    // SAFETY: non-zero size; freed below with the same layout.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    assert!(!ptr.is_null());
    // SAFETY: ptr is valid for layout.size() bytes and exclusively ours.
    let buf = unsafe { std::slice::from_raw_parts_mut(ptr, layout.size()) };
    buf.iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = (i % 249) as u8);
    f.write_all_at(buf, 4096).unwrap();
    let expect = buf.to_vec();
    buf.fill(0);
    f.read_exact_at(buf, 4096).unwrap();
    assert_eq!(*buf, expect[..]);
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(ptr, layout) };
    drop((src, f));
    m.unmount();
}

#[test]
fn forgotten_inodes_are_freed() {
    let m = Mount::with_args(&["--inodes", "1000"]);
    let free0 = nix::sys::statvfs::statvfs(&m.path()).unwrap().files_free();
    // Far more cycles than the inode limit: each freed inode must be returned.
    for i in 0..20_000 {
        let p = m.p(&format!("c{}", i % 7));
        File::create(&p).unwrap();
        fs::remove_file(&p).unwrap();
    }
    let statvfs_free = || nix::sys::statvfs::statvfs(&m.path()).unwrap().files_free();
    common::poll_until("every freed inode to be returned", || {
        statvfs_free() == free0
    });
    m.unmount();
}

#[test]
fn mount_errors_are_clear() {
    let bin = common::memfs_bin();
    let out = std::process::Command::new(bin)
        .args(["mount", "/nonexistent/memfs-dir"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
    let file = tempfile::NamedTempFile::new().unwrap();
    let out = std::process::Command::new(bin)
        .arg("mount")
        .arg(file.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a directory"));
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(bin)
        .arg("mount")
        .arg(dir.path())
        .args(["--size", "12Q"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid size"));
    // Each bad option is refused before mounting, with a message that says why.
    for (bad, want) in [
        (&["--locks", "sometimes"][..], "kernel or engine"),
        (&["-o", "locks=sometimes"][..], "kernel or engine"),
        (&["-o", "bogus"][..], "unknown mount option"),
        // A poll longer than the limit, or not a number.
        (
            &["--poll-us", "1001"][..],
            "expected microseconds from 0 to 1000",
        ),
        (
            &["-o", "poll_us=5000"][..],
            "expected microseconds from 0 to 1000",
        ),
        (
            &["-o", "poll_us=-1"][..],
            "expected microseconds from 0 to 1000",
        ),
    ] {
        let out = std::process::Command::new(bin)
            .arg("mount")
            .arg(dir.path())
            .args(bad)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{bad:?}: {err}");
    }
    // Already mounted.
    let m = Mount::new();
    let out = std::process::Command::new(bin)
        .arg("mount")
        .arg(m.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already a mount point"));
    m.unmount();
}

#[test]
fn background_mount_returns_when_usable_and_umount_stops_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().canonicalize().unwrap();
    struct Cleanup(std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let out = std::process::Command::new(common::memfs_bin())
        .arg("mount")
        .arg(&path)
        .args(["-o", "size=64M,nr_inodes=1000"])
        .output()
        .unwrap();
    let _cleanup = Cleanup(path.clone());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let msg = String::from_utf8_lossy(&out.stdout);
    assert!(msg.contains("memfs umount"), "{msg}");
    // Usable at once: no waiting.
    fs::write(path.join("now"), b"ready").unwrap();
    assert_eq!(fs::read(path.join("now")).unwrap(), b"ready");
    let st = nix::sys::statvfs::statvfs(&path).unwrap();
    assert_eq!(st.blocks() * st.fragment_size(), 64 << 20);
    // An open file keeps the mount busy (after the short retry for
    // transient references), and the mount keeps serving.
    let held = File::open(path.join("now")).unwrap();
    let busy = std::process::Command::new(common::memfs_bin())
        .arg("umount")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!busy.status.success());
    assert!(
        String::from_utf8_lossy(&busy.stderr).contains("is busy"),
        "{}",
        String::from_utf8_lossy(&busy.stderr)
    );
    assert_eq!(fs::read(path.join("now")).unwrap(), b"ready");
    drop(held);
    let st = std::process::Command::new(common::memfs_bin())
        .arg("umount")
        .arg(&path)
        .status()
        .unwrap();
    assert!(st.success());
    assert!(!path.join("now").exists());
}

/// Context switches of the server's io_uring threads so far.
fn uring_switches(pid: u32) -> u64 {
    fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| {
            let t = t.ok()?.path();
            let comm = fs::read_to_string(t.join("comm")).ok()?;
            if !comm.starts_with("fuser-uring-") {
                return None;
            }
            let status = fs::read_to_string(t.join("status")).ok()?;
            status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .sum()
}

#[test]
fn the_mount_reads_ahead_one_whole_request() {
    let m = Mount::new();
    // A file inside shows the mount's device; its bdi is named after it.
    fs::write(m.p("f"), b"x").unwrap();
    let dev = fs::metadata(m.p("f")).unwrap().dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let knob = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    let kb: u64 = fs::read_to_string(&knob)
        .unwrap_or_else(|e| panic!("{knob}: {e}"))
        .trim()
        .parse()
        .unwrap();
    if nix::unistd::geteuid().is_root() {
        // One READ of max_write (1 MiB) instead of eight of 128 KiB.
        assert_eq!(kb, 1024, "{knob}");
    } else {
        // Without root the kernel's default stays.
        assert!(kb > 0, "{knob}");
    }
}

/// `--io-uring` with `--locks engine` serves /dev/fuse: over the rings a
/// blocked `F_SETLKW` kept its request's ring entry until granted, and a
/// CPU has 8 of them, so 8 waiters on one CPU left every later request of
/// that CPU (the holder's unlock too) waiting for ever. Here 20 waiters,
/// all blocked first, and the holder share CPU 0, and every waiter gets the
/// lock.
#[test]
fn engine_locks_never_wedge_a_cpu_with_io_uring_asked_for() {
    use nix::fcntl::{FcntlArg, fcntl};
    use std::sync::mpsc;
    const WAITERS: usize = 20;
    let mut m = Mount::with_args(&["--io-uring", "--locks", "engine"]);
    assert_eq!(
        common::uring_threads(m.pid()),
        0,
        "engine locks serve /dev/fuse"
    );
    fs::write(m.p("f"), b"x").unwrap();
    fn pin_to_cpu0() {
        // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and
        // sched_setaffinity(0, ...) only touch this thread's own set.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            assert_eq!(
                libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set),
                0
            );
        }
    }
    fn lk(typ: i32) -> libc::flock {
        common::range_lock(typ, 0, 1)
    }
    let rw = || common::open_rw(&m.p("f"));
    let holder = rw();
    fcntl(&holder, FcntlArg::F_OFD_SETLK(&lk(libc::F_WRLCK))).unwrap();
    // Opened before any waiter blocks: from here on this thread does
    // nothing on the mount that a wedged CPU could hold up.
    let files: Vec<File> = (0..WAITERS).map(|_| rw()).collect();
    let (done_tx, done) = mpsc::channel();
    let (tid_tx, tids) = mpsc::channel();
    for f in files {
        let (done_tx, tid_tx) = (done_tx.clone(), tid_tx.clone());
        std::thread::spawn(move || {
            pin_to_cpu0();
            tid_tx.send(nix::unistd::gettid().as_raw()).unwrap();
            let r = fcntl(&f, FcntlArg::F_OFD_SETLKW(&lk(libc::F_WRLCK)))
                .and_then(|_| fcntl(&f, FcntlArg::F_OFD_SETLK(&lk(libc::F_UNLCK))));
            done_tx.send(r.map(drop)).unwrap();
        });
    }
    // Every waiter is in fcntl before the unlock.
    for _ in 0..WAITERS {
        common::await_in_fcntl(tids.recv().unwrap());
    }
    // The unlock comes from CPU 0 too, on a thread: wedged, it would never
    // return, and the wait below fails instead.
    std::thread::spawn(move || {
        pin_to_cpu0();
        fcntl(&holder, FcntlArg::F_OFD_SETLK(&lk(libc::F_UNLCK))).unwrap();
    });
    for i in 0..WAITERS {
        let Ok(r) = done.recv_timeout(std::time::Duration::from_secs(60)) else {
            // Free the stuck threads (and let this process exit) first.
            m.abort();
            panic!("{i} of {WAITERS} lock waiters were granted: the mount is wedged");
        };
        assert_eq!(r, Ok(()));
    }
    m.unmount();
}

#[test]
fn io_uring_transport_serves_requests_or_falls_back() {
    // Offered: the fuse module has it on, and io_uring is not disabled.
    let offered = fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
        .is_ok_and(|v| v.trim() == "Y")
        && fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
            .map_or(true, |v| v.trim() == "0");
    let m = Mount::with_args(&["--io-uring"]);
    let pid = m.pid();
    if offered {
        common::poll_until("the io_uring threads", || common::uring_threads(pid) > 0);
    } else {
        // Not offered: the mount serves through /dev/fuse alone.
        assert_eq!(common::uring_threads(pid), 0);
    }
    let before = uring_switches(pid);
    // Requests with a payload (writes, names) and without (reads, getattr),
    // large and small, so both reply paths and the buffer bounds are used.
    let big: Vec<u8> = (0..(3 << 20) + 123).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(m.p("big"), &big).unwrap();
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(m.p("big"))
        .unwrap();
    let mut back = Vec::new();
    f.read_to_end(&mut back).unwrap();
    drop(f);
    assert!(back == big, "3 MiB file read back differs");
    fs::create_dir(m.p("d")).unwrap();
    for i in 0..200 {
        fs::write(m.p(&format!("d/f{i}")), i.to_string()).unwrap();
    }
    let mut names: Vec<_> = fs::read_dir(m.p("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 200);
    assert_eq!(fs::read_to_string(m.p("d/f42")).unwrap(), "42");
    assert_eq!(errno(fs::read(m.p("d/missing"))), libc::ENOENT);
    setxattr(&m.p("big"), "user.k", b"v", 0).unwrap();
    assert_eq!(getxattr(&m.p("big"), "user.k", 64).unwrap(), b"v");
    if offered {
        assert!(
            uring_switches(pid) > before + 100,
            "the rings served almost nothing: {} -> {}",
            before,
            uring_switches(pid)
        );
    }
    m.unmount();
}

/// The server's `/dev/fuse` descriptors: how many, and how many of them
/// were opened non-blocking (`flags:` in /proc/PID/fdinfo is octal).
fn dev_fuse_fds(pid: u32) -> (usize, usize) {
    let (mut all, mut nonblocking) = (0, 0);
    for fd in fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
        if fs::read_link(fd.path()).is_ok_and(|t| t == Path::new("/dev/fuse")) {
            all += 1;
            let info = fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                fd.file_name().to_string_lossy()
            ))
            .unwrap_or_default();
            let flags = info
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
                .unwrap_or(0);
            if flags & libc::O_NONBLOCK as u32 != 0 {
                nonblocking += 1;
            }
        }
    }
    (all, nonblocking)
}

#[test]
fn one_worker_polls_a_nonblocking_clone_of_the_device() {
    if common::extra_mount_args()
        .iter()
        .any(|a| a.contains("io-uring") || a.contains("io_uring"))
    {
        // Over io_uring nothing polls /dev/fuse (it carries only FORGET
        // and INTERRUPT); the io_uring test covers that transport.
        return;
    }
    // Three workers, each reading its own clone, and the poller's clone:
    // the only one opened non-blocking, so that no worker switches its
    // descriptor's mode per request.
    let m = Mount::with_args(&["--threads", "3"]);
    fs::write(m.p("f"), b"polled").unwrap();
    assert_eq!(fs::read(m.p("f")).unwrap(), b"polled");
    let pid = m.pid();
    common::poll_until("the poller's descriptor", || dev_fuse_fds(pid).1 == 1);
    let (all, nonblocking) = dev_fuse_fds(pid);
    assert!(
        all >= 4,
        "{all} /dev/fuse descriptors for 3 workers and a poller"
    );
    assert_eq!(nonblocking, 1);
    // Requests keep being answered whichever descriptor read them.
    for i in 0..500 {
        fs::write(m.p(&format!("f{i}")), i.to_string()).unwrap();
        assert_eq!(
            fs::read_to_string(m.p(&format!("f{i}"))).unwrap(),
            i.to_string()
        );
        fs::remove_file(m.p(&format!("f{i}"))).unwrap();
    }
    m.unmount();
    // --poll-us 0: no poller, no non-blocking descriptor.
    let m = Mount::with_args(&["--poll-us", "0"]);
    fs::write(m.p("f"), b"slept").unwrap();
    assert_eq!(fs::read(m.p("f")).unwrap(), b"slept");
    let (all, nonblocking) = dev_fuse_fds(m.pid());
    assert!(all >= 2, "{all}");
    assert_eq!(nonblocking, 0);
    m.unmount();
}

/// Linux native AIO through its system calls (what libaio wraps; fstests'
/// generic/451 uses it): writes the kernel queues and completes later.
mod aio {
    use std::os::fd::RawFd;

    /// `struct iocb` of linux/aio_abi.h (x86-64 and other little-endian).
    #[repr(C)]
    #[derive(Default)]
    struct Iocb {
        data: u64,
        key: u32,
        rw_flags: i32,
        opcode: u16,
        reqprio: i16,
        fildes: u32,
        buf: u64,
        nbytes: u64,
        offset: i64,
        reserved2: u64,
        flags: u32,
        resfd: u32,
    }

    /// `struct io_event`.
    #[repr(C)]
    #[derive(Default, Clone, Copy)]
    struct Event {
        data: u64,
        obj: u64,
        res: i64,
        res2: i64,
    }

    const IOCB_CMD_PWRITE: u16 = 1;

    pub struct Ctx(libc::c_ulong);

    impl Ctx {
        pub fn new(depth: usize) -> Ctx {
            let mut id: libc::c_ulong = 0;
            // SAFETY: io_setup writes the context id into `id`, which we own.
            let r = unsafe { libc::syscall(libc::SYS_io_setup, depth as libc::c_long, &mut id) };
            assert_eq!(r, 0, "io_setup: {}", std::io::Error::last_os_error());
            Ctx(id)
        }

        /// Submits every write at once, waits for all; the results in order.
        pub fn pwrite(&self, fd: RawFd, writes: &[(&[u8], u64)]) -> Vec<i64> {
            let mut cbs: Vec<Iocb> = writes
                .iter()
                .enumerate()
                .map(|(i, (b, off))| Iocb {
                    data: i as u64,
                    opcode: IOCB_CMD_PWRITE,
                    fildes: fd as u32,
                    buf: b.as_ptr() as u64,
                    nbytes: b.len() as u64,
                    offset: *off as i64,
                    ..Iocb::default()
                })
                .collect();
            let mut ptrs: Vec<*mut Iocb> = cbs.iter_mut().map(|c| c as *mut Iocb).collect();
            // SAFETY: the control blocks and the buffers they point at live
            // until every event has been reaped below.
            let n = unsafe {
                libc::syscall(
                    libc::SYS_io_submit,
                    self.0,
                    ptrs.len() as libc::c_long,
                    ptrs.as_mut_ptr(),
                )
            };
            assert_eq!(
                n,
                ptrs.len() as libc::c_long,
                "io_submit: {}",
                std::io::Error::last_os_error()
            );
            let mut evs = vec![Event::default(); ptrs.len()];
            let mut got = 0;
            while got < evs.len() {
                // SAFETY: room for `evs.len() - got` events at `evs[got..]`.
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_io_getevents,
                        self.0,
                        1 as libc::c_long,
                        (evs.len() - got) as libc::c_long,
                        evs[got..].as_mut_ptr(),
                        std::ptr::null::<libc::timespec>(),
                    )
                };
                if r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                assert!(r > 0, "io_getevents: {}", std::io::Error::last_os_error());
                got += r as usize;
            }
            let mut res = vec![0; evs.len()];
            for e in evs {
                res[e.data as usize] = e.res;
            }
            drop(cbs);
            res
        }
    }

    impl Drop for Ctx {
        fn drop(&mut self) {
            // SAFETY: our context; nothing is in flight once `pwrite` returned.
            unsafe { libc::syscall(libc::SYS_io_destroy, self.0) };
        }
    }
}

/// A 4 KiB-aligned slice of `v` of `len` bytes (O_DIRECT buffers), filled.
fn aligned(v: &mut Vec<u8>, len: usize, fill: u8) -> &mut [u8] {
    v.resize(len + 4096, 0);
    let at = v.as_ptr().align_offset(4096);
    let s = &mut v[at..at + len];
    s.fill(fill);
    s
}

/// Runs `work` on its own threads; if it has not finished after a generous
/// limit (a deadlock in the kernel, never slowness: the work takes seconds),
/// aborts the FUSE connection so that every blocked request fails and the
/// threads come back, then fails the test instead of hanging it.
fn finishes<F>(m: &mut Mount, what: &str, work: Vec<F>) -> Vec<String>
where
    F: FnOnce() -> Result<(), String> + Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    let n = work.len();
    let handles: Vec<_> = work
        .into_iter()
        .map(|w| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let r = w();
                let _ = tx.send(());
                r
            })
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    let mut done = 0;
    while done < n {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(()) => done += 1,
            Err(_) => {
                m.abort();
                for h in handles {
                    let _ = h.join();
                }
                panic!(
                    "{what}: {} of {n} threads still blocked after 180 s",
                    n - done
                );
            }
        }
    }
    handles
        .into_iter()
        .filter_map(|h| h.join().expect("worker panicked").err())
        .collect()
}

/// fstests generic/451: an asynchronous O_DIRECT write that has completed is
/// seen by the next buffered read, while other processes keep reading the
/// file through the page cache. With FUSE_ASYNC_DIO the kernel skips its
/// invalidation after such a write; memfs answers it only after invalidating
/// the pages the readers may have cached meanwhile.
#[test]
fn async_direct_writes_are_seen_by_buffered_reads() {
    const SIZE: usize = 160 * 4096;
    const ROUNDS: usize = 1500;
    let mut m = Mount::new();
    let f = m.p("aio-dio");
    fs::write(&f, vec![0x55u8; SIZE]).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut work: Vec<Box<dyn FnOnce() -> Result<(), String> + Send>> = Vec::new();
    for _ in 0..3 {
        let (f, stop) = (f.clone(), stop.clone());
        work.push(Box::new(move || {
            let mut buf = vec![0u8; SIZE];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = File::open(&f).and_then(|h| h.read_exact_at(&mut buf, 0));
                r.map_err(|e| format!("buffered reader: {e}"))?;
            }
            Ok(())
        }));
    }
    let (wf, wstop) = (f.clone(), stop.clone());
    work.push(Box::new(move || {
        let _stop_readers = StopOnDrop(wstop);
        let ctx = aio::Ctx::new(1);
        let direct = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&wf)
            .map_err(|e| e.to_string())?;
        let (mut wbuf, mut rbuf) = (Vec::new(), vec![0u8; SIZE]);
        for round in 0..ROUNDS {
            let fill = if round % 2 == 0 { 0xaa } else { 0x55 };
            let data = aligned(&mut wbuf, SIZE, fill);
            let res = ctx.pwrite(direct.as_raw_fd(), &[(&*data, 0)]);
            if res[0] != SIZE as i64 {
                return Err(format!("round {round}: aio write gave {}", res[0]));
            }
            File::open(&wf)
                .and_then(|h| h.read_exact_at(&mut rbuf, 0))
                .map_err(|e| e.to_string())?;
            if let Some(at) = rbuf.iter().position(|&b| b != fill) {
                return Err(format!(
                    "round {round}: a buffered read after the direct write completed \
                     saw {:#x} at byte {at}, not {fill:#x} (stale page cache)",
                    rbuf[at]
                ));
            }
        }
        Ok(())
    }));
    let errors = finishes(&mut m, "direct writes racing buffered readers", work);
    assert!(errors.is_empty(), "{errors:#?}");
    m.unmount();
}

struct StopOnDrop(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Buffered, direct (synchronous and asynchronous, aligned and not) and
/// mapped I/O on one file from several threads at once must all finish: a
/// page cache invalidation that waits for a page lock whose holder waits for
/// a request memfs does not serve would hang them in the kernel. A watchdog
/// kills the server rather than hang the test.
#[test]
fn buffered_direct_and_mapped_io_on_one_file_finish() {
    const SIZE: usize = 1 << 20;
    const OPS: usize = 1500;
    let mut m = Mount::new();
    let f = m.p("mixed");
    fs::write(&f, vec![1u8; SIZE]).unwrap();
    type Work = Box<dyn FnOnce() -> Result<(), String> + Send>;
    let open = |f: &Path, flags: i32| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(flags)
            .open(f)
            .map_err(|e| e.to_string())
    };
    // Offsets from a fixed sequence: the same run every time.
    let at = |i: usize, seed: usize, align: usize, len: usize| {
        let x = i
            .wrapping_mul(2_654_435_761)
            .wrapping_add(seed.wrapping_mul(40_503))
            % (SIZE - len);
        x / align * align
    };
    let mut work: Vec<Work> = Vec::new();
    let path = f.clone();
    work.push(Box::new(move || {
        // Asynchronous direct writes, four in flight, 64 KiB each.
        let fd = open(&path, libc::O_DIRECT)?;
        let ctx = aio::Ctx::new(4);
        let mut bufs: Vec<Vec<u8>> = (0..4).map(|_| Vec::new()).collect();
        for i in 0..OPS / 4 {
            let mut writes = Vec::new();
            for (k, b) in bufs.iter_mut().enumerate() {
                let off = at(4 * i + k, 1, 4096, 65536) as u64;
                writes.push((&*aligned(b, 65536, (i + k) as u8), off));
            }
            for (k, r) in ctx.pwrite(fd.as_raw_fd(), &writes).into_iter().enumerate() {
                if r != 65536 {
                    return Err(format!("aio write {i}/{k}: {r}"));
                }
            }
        }
        Ok(())
    }));
    let path = f.clone();
    work.push(Box::new(move || {
        // Synchronous direct writes and reads, aligned and not.
        let fd = open(&path, libc::O_DIRECT)?;
        let mut v = Vec::new();
        for i in 0..OPS {
            let (len, align) = if i % 3 == 0 { (1000, 1) } else { (4096, 4096) };
            let off = at(i, 2, align, len) as u64;
            let buf = aligned(&mut v, len, i as u8);
            if i % 2 == 0 {
                fd.write_all_at(buf, off)
            } else {
                fd.read_exact_at(buf, off)
            }
            .map_err(|e| format!("direct op {i} at {off}: {e}"))?;
        }
        Ok(())
    }));
    for seed in [3, 4] {
        let path = f.clone();
        work.push(Box::new(move || {
            // Buffered reads of unaligned ranges, and small unaligned
            // buffered writes (a partial page stays locked while its WRITE
            // is in flight).
            let fd = open(&path, 0)?;
            let mut buf = vec![0u8; 20_000];
            for i in 0..OPS {
                let len = 100 + (i * 37) % 19_000;
                let off = at(i, seed, 1, len) as u64;
                if (i + seed) % 4 == 0 {
                    fd.write_all_at(&buf[..len.min(300)], off)
                } else {
                    fd.read_exact_at(&mut buf[..len], off)
                }
                .map_err(|e| format!("buffered op {i} at {off}: {e}"))?;
            }
            Ok(())
        }));
    }
    let path = cpath(&f);
    work.push(Box::new(move || {
        // Page faults through a shared mapping: READs that fill the cache.
        // In a child process: after an abort by the watchdog a fault gets
        // SIGBUS, which must not take the test (and its cleanup) with it.
        // SAFETY: the child makes only system calls (open, mmap, madvise,
        // munmap, _exit) and reads its own mapping, within bounds, as
        // allowed after fork in a multithreaded process; the path was made
        // before the fork.
        let pid = unsafe {
            let pid = libc::fork();
            if pid == 0 {
                let fd = libc::open(path.as_ptr(), libc::O_RDONLY);
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    SIZE,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    fd,
                    0,
                );
                if fd < 0 || p == libc::MAP_FAILED {
                    libc::_exit(1);
                }
                for i in 0..OPS * 4 {
                    std::ptr::read_volatile(p.cast::<u8>().add(at(i, 5, 1, 1)));
                    if i % 64 == 0 {
                        // Drop the mapped pages so that later touches fault again.
                        libc::madvise(p, SIZE, libc::MADV_DONTNEED);
                    }
                }
                libc::munmap(p, SIZE);
                libc::_exit(0);
            }
            pid
        };
        if pid < 0 {
            return Err(format!("fork: {}", std::io::Error::last_os_error()));
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
            return Err(format!("waitpid: {}", std::io::Error::last_os_error()));
        }
        if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
            return Err(format!("the mmap reader ended with status {status:#x}"));
        }
        Ok(())
    }));
    let errors = finishes(&mut m, "mixed buffered, direct and mapped I/O", work);
    assert!(errors.is_empty(), "{errors:#?}");
    assert_eq!(fs::metadata(&f).unwrap().len(), SIZE as u64);
    // And the result is coherent: a direct write is seen by buffered reads.
    let fd = open(&f, libc::O_DIRECT).unwrap();
    let mut v = Vec::new();
    fd.write_all_at(aligned(&mut v, SIZE, 0x77), 0).unwrap();
    assert!(fs::read(&f).unwrap().iter().all(|&b| b == 0x77));
    drop(fd);
    m.unmount();
}

/// The whole file as the server holds it: read with O_DIRECT, past the
/// kernel's page cache.
fn read_direct(p: &Path) -> Vec<u8> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(p)
        .unwrap();
    let size = f.metadata().unwrap().len() as usize;
    let mut v = Vec::new();
    let buf = aligned(&mut v, size.next_multiple_of(4096).max(4096), 0xee);
    let mut got = 0;
    while got < size {
        let n = f.read_at(&mut buf[got..], got as u64).unwrap();
        assert!(n > 0, "short file");
        got += n;
    }
    buf[..size].to_vec()
}

/// Large WRITEs reach the engine in pages it keeps when they are page
/// aligned, and are copied when not (docs/fuse.md, "Copies per byte"):
/// aligned direct writes, unaligned buffered ones (write-through sends
/// them at the caller's offset), appends and small writes in between must
/// all read back exactly, on the default mount and with --copy-writes.
#[test]
fn large_writes_at_any_offset_read_back() {
    for args in [&[][..], &["--copy-writes"][..]] {
        let m = Mount::with_args(args);
        let p = m.p("f");
        let mut model: Vec<u8> = Vec::new();
        let put = |model: &mut Vec<u8>, off: usize, data: &[u8]| {
            if model.len() < off + data.len() {
                model.resize(off + data.len(), 0);
            }
            model[off..off + data.len()].copy_from_slice(data);
        };
        let direct = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(&p)
            .unwrap();
        let buffered = OpenOptions::new().write(true).open(&p).unwrap();
        let mut v = Vec::new();
        // (offset, length, direct): the first 1 MiB write turns pages on.
        let steps: &[(usize, usize, bool)] = &[
            (0, 1 << 20, true),
            (3 << 20, 1 << 20, true),
            (4096, 256 << 10, true),
            (4095, (1 << 20) + 3, false),
            (5 << 20, 4096, true),
            (100, 10, false),
            ((2 << 20) + 1, 700 << 10, false),
            ((1 << 20) - 4096, 2 << 20, true),
        ];
        for (g, &(off, len, is_direct)) in steps.iter().enumerate() {
            let data = aligned(&mut v, len, 0);
            data.iter_mut()
                .enumerate()
                .for_each(|(i, b)| *b = (i % 251) as u8 ^ (g as u8 * 37));
            let f = if is_direct { &direct } else { &buffered };
            f.write_all_at(data, off as u64).unwrap();
            put(&mut model, off, data);
            assert_eq!(
                read_direct(&p),
                model,
                "after step {g} ({off}, {len}, direct {is_direct}) with {args:?}"
            );
        }
        // Appends, large and small.
        let mut app = OpenOptions::new().append(true).open(&p).unwrap();
        for (g, len) in [(1 << 20) + 17, 3, 200 << 10].into_iter().enumerate() {
            let data: Vec<u8> = (0..len).map(|i| (i % 241) as u8 ^ g as u8).collect();
            app.write_all(&data).unwrap();
            let end = model.len();
            put(&mut model, end, &data);
        }
        assert_eq!(read_direct(&p), model, "after the appends with {args:?}");
        assert_eq!(fs::read(&p).unwrap(), model, "buffered read with {args:?}");
        drop((direct, buffered, app));
        m.unmount();
    }
}

/// A tmpfs on a temporary directory, the reference for what Linux does;
/// unmounted in every path (Drop runs on panics too).
struct Tmpfs {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
}

impl Tmpfs {
    fn new() -> Tmpfs {
        let dir = tempfile::Builder::new()
            .prefix("memfs-tmpfs-")
            .tempdir()
            .expect("tempdir");
        let path = dir.path().canonicalize().expect("canonical tempdir");
        let t = Tmpfs { _dir: dir, path };
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=16m", "tmpfs"])
            .arg(&t.path)
            .status()
            .expect("run mount(8)");
        assert!(st.success(), "mount -t tmpfs failed: {st}");
        t
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if common::is_mount_point(&self.path) {
            let _ = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// The mode left on a file of uid and gid 2000 and mode 06755 once `writer`
/// (a command line that writes its standard output) has written to it
/// through a descriptor opened by root: not its owner, nor in its group, it
/// could not open the file itself.
fn mode_after_write_by(dir: &Path, writer: &[&str]) -> u32 {
    let f = dir.join("suid");
    fs::write(&f, b"old").unwrap();
    std::os::unix::fs::chown(&f, Some(2000), Some(2000)).unwrap();
    // After the chown, which clears setuid.
    fs::set_permissions(&f, fs::Permissions::from_mode(0o6755)).unwrap();
    assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o6755);
    let out = OpenOptions::new().write(true).open(&f).unwrap();
    let st = std::process::Command::new(writer[0])
        .args(&writer[1..])
        .stdout(out)
        .status()
        .unwrap_or_else(|e| panic!("run {writer:?}: {e}"));
    assert!(st.success(), "{writer:?} failed: {st}");
    assert_eq!(fs::read(&f).unwrap(), b"xld", "{writer:?} wrote");
    fs::metadata(&f).unwrap().mode() & 0o7777
}

/// A write clears setuid and setgid (group-exec set) when the writer lacks
/// CAP_FSETID, which the kernel tells memfs with FUSE_WRITE_KILL_SUIDGID:
/// its uid does not tell (root without the capability loses the bits, a
/// user holding it keeps them). Checked against tmpfs, written the same way.
#[test]
fn writes_clear_setuid_and_setgid_as_the_kernel_says() {
    if !nix::unistd::geteuid().is_root() || !common::have("setpriv") {
        eprintln!("skipped: needs root and setpriv(1) to drop privileges");
        return;
    }
    const USER: [&str; 7] = [
        "setpriv",
        "--reuid=1000",
        "--regid=1000",
        "--clear-groups",
        "--",
        "printf",
        "x",
    ];
    let writers: [(&str, &[&str], u32); 4] = [
        ("root", &["printf", "x"], 0o6755),
        ("uid 1000", &USER, 0o755),
        (
            "root without CAP_FSETID",
            &["setpriv", "--bounding-set=-fsetid", "--", "printf", "x"],
            0o755,
        ),
        (
            "uid 1000 with CAP_FSETID",
            &[
                "setpriv",
                "--reuid=1000",
                "--regid=1000",
                "--clear-groups",
                "--inh-caps=+fsetid",
                "--ambient-caps=+fsetid",
                "--",
                "printf",
                "x",
            ],
            0o6755,
        ),
    ];
    let tmpfs = Tmpfs::new();
    let m = Mount::with_args(&["--allow-other"]);
    for (who, writer, want) in writers {
        let reference = mode_after_write_by(&tmpfs.path, writer);
        assert_eq!(reference, want, "tmpfs, written by {who}");
        let got = mode_after_write_by(&m.path(), writer);
        assert_eq!(got, reference, "memfs against tmpfs, written by {who}");
    }
    m.unmount();
    drop(tmpfs);
}

/// Reads one byte of `f` through a descriptor opened with `flags`, after
/// dropping its cached pages so that the read reaches the file system.
fn read_one_byte(f: &Path, flags: i32) {
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(f)
        .unwrap();
    nix::fcntl::posix_fadvise(
        &file,
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    )
    .unwrap();
    let mut b = [0u8; 1];
    file.read_exact(&mut b).unwrap();
}

/// LTP's open12: `touch -a -d 2020-01-01 f`, then a 1-byte read through
/// `open(f, O_RDONLY | O_NOATIME)` leaves the atime at 2020-01-01; a plain
/// read moves it (relatime: an access more than a day old). As on tmpfs.
fn o_noatime_check(dir: &Path, what: &str) {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};
    let f = dir.join("noatime");
    fs::write(&f, b"data").unwrap();
    let y2020 = UNIX_EPOCH + Duration::from_secs(1_577_836_800);
    File::open(&f)
        .unwrap()
        .set_times(fs::FileTimes::new().set_accessed(y2020))
        .unwrap();
    let atime = || fs::metadata(&f).unwrap().accessed().unwrap();
    assert_eq!(atime(), y2020);
    read_one_byte(&f, libc::O_NOATIME);
    assert_eq!(atime(), y2020, "{what}: a read with O_NOATIME");
    let before = SystemTime::now() - Duration::from_secs(60);
    read_one_byte(&f, 0);
    assert!(atime() > before, "{what}: a plain read moves the atime");
}

#[test]
fn o_noatime_reads_leave_the_atime_alone() {
    if nix::unistd::geteuid().is_root() {
        let tmpfs = Tmpfs::new();
        o_noatime_check(&tmpfs.path, "tmpfs");
    }
    let m = Mount::new();
    o_noatime_check(&m.path(), "memfs");
    m.unmount();
}
