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
    let lk = |typ: i32, start: i64, len: i64| libc::flock {
        l_type: typ as i16,
        l_whence: libc::SEEK_SET as i16,
        l_start: start,
        l_len: len,
        l_pid: 0,
    };
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
    for bad in [&["--locks", "sometimes"][..], &["-o", "locks=sometimes"]] {
        let out = std::process::Command::new(bin)
            .arg("mount")
            .arg(dir.path())
            .args(bad)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("kernel or engine"), "{bad:?}: {err}");
    }
    let out = std::process::Command::new(bin)
        .arg("mount")
        .arg(dir.path())
        .args(["-o", "bogus"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown mount option"));
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
