//! Kernel FUSE passthrough (`memfs mount --data-path passthrough`): that the
//! kernel really serves the data without requests to memfs, that the files
//! stay correct through every operation that still reaches memfs, that
//! `--size` holds, and that the mount falls back to the fuse path cleanly.
//! Root only (passthrough needs CAP_SYS_ADMIN).

mod common;

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::process::Stdio;

use common::{Mount, poll_until};

/// Root, and no `MEMFS_TEST_MOUNT_ARGS`: these tests choose the data path
/// of each mount themselves.
fn is_root() -> bool {
    nix::unistd::geteuid().is_root() && common::extra_mount_args().is_empty()
}

/// Bytes the server has read with read(2) (`/dev/fuse` requests included).
fn server_rchar(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).expect("read /proc/PID/io");
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .and_then(|v| v.trim().parse().ok())
        .expect("rchar in /proc/PID/io")
}

/// A mount whose server log goes to a file, so the test can read what it said.
fn mount_logged(args: &[&str]) -> (Mount, tempfile::NamedTempFile) {
    let log = tempfile::NamedTempFile::new().unwrap();
    let m = Mount::spawn(args, Stdio::from(log.reopen().unwrap()));
    (m, log)
}

fn log_text(log: &tempfile::NamedTempFile) -> String {
    std::fs::read_to_string(log.path()).unwrap_or_default()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Writes and reads back `mib` MiB; returns how much the server read from
/// `/dev/fuse` meanwhile.
fn io_cost(m: &Mount, mib: usize) -> u64 {
    let data = pattern(1 << 20, 7);
    let before = server_rchar(m.pid());
    let mut f = File::create(m.p("big")).unwrap();
    for _ in 0..mib {
        f.write_all(&data).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    let mut f = File::open(m.p("big")).unwrap();
    let mut buf = vec![0; 1 << 20];
    for _ in 0..mib {
        f.read_exact(&mut buf).unwrap();
        assert!(buf == data, "read back what was written");
    }
    server_rchar(m.pid()) - before
}

/// Whether this kernel offers passthrough (the server says when it does not).
fn kernel_lacks_passthrough(log: &tempfile::NamedTempFile) -> bool {
    log_text(log).contains("does not offer FUSE passthrough")
}

#[test]
fn passthrough_serves_data_without_requests() {
    if !is_root() {
        eprintln!("skipped: needs root and no MEMFS_TEST_MOUNT_ARGS");
        return;
    }
    let (m, log) = mount_logged(&["--data-path", "passthrough"]);
    let cost = io_cost(&m, 32);
    if kernel_lacks_passthrough(&log) {
        eprintln!("skipped: the kernel does not offer FUSE passthrough");
        return;
    }
    assert!(
        cost < 4 << 20,
        "passthrough: the server read {cost} bytes for 32 MiB written (requests reached it); log:\n{}",
        log_text(&log)
    );
    // The same work over the fuse path costs the data itself: the measure
    // tells the two paths apart.
    let (f, _log) = mount_logged(&["--data-path", "fuse"]);
    let cost = io_cost(&f, 32);
    assert!(cost >= 32 << 20, "fuse path: only {cost} bytes read");
    m.unmount();
    f.unmount();
}

#[test]
fn passthrough_writes_drop_setuid() {
    if !is_root() || !common::have("setpriv") {
        eprintln!("skipped: needs root and setpriv");
        return;
    }
    let (m, _log) = mount_logged(&["--data-path", "passthrough", "--allow-other"]);
    std::fs::set_permissions(m.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    // Backed first (written through passthrough), setuid afterwards.
    std::fs::write(m.p("prog"), b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(m.p("prog"), std::fs::Permissions::from_mode(0o6777)).unwrap();
    let st = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
        ])
        .arg(format!("echo x >> {}", m.p("prog").display()))
        .status()
        .unwrap();
    assert!(st.success());
    let mode = std::fs::metadata(m.p("prog")).unwrap().mode();
    assert_eq!(
        mode & 0o6000,
        0,
        "an unprivileged write drops setuid/setgid: {mode:o}"
    );
    assert_eq!(std::fs::read(m.p("prog")).unwrap(), b"#!/bin/sh\nx\n");
    m.unmount();
}

#[test]
fn passthrough_falls_back_cleanly() {
    if !is_root() {
        eprintln!("skipped: needs root and no MEMFS_TEST_MOUNT_ARGS");
        return;
    }
    // Writeback caching excludes passthrough: the mount works over fuse and says so.
    let (m, log) = mount_logged(&["--data-path", "passthrough", "--writeback-cache"]);
    let cost = io_cost(&m, 8);
    assert!(cost >= 8 << 20, "fell back to fuse: {cost} bytes read");
    assert!(
        log_text(&log).contains("serving the fuse data path"),
        "the fallback is logged: {}",
        log_text(&log)
    );
    m.unmount();
}

#[test]
fn passthrough_enforces_size() {
    if !is_root() {
        eprintln!("skipped: needs root and no MEMFS_TEST_MOUNT_ARGS");
        return;
    }
    let (m, log) = mount_logged(&["--data-path", "passthrough", "--size", "16M"]);
    let data = vec![0x5a; 1 << 20];
    let mut f = File::create(m.p("fill")).unwrap();
    let mut written = 0;
    let e = loop {
        match f.write(&data) {
            Ok(n) => written += n,
            Err(e) => break e,
        }
        assert!(
            written <= 17 << 20,
            "wrote {written} bytes into a 16 MiB mount"
        );
    };
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    assert!(written >= 8 << 20, "only {written} bytes fit");
    let full = nix::sys::statvfs::statvfs(&m.path()).unwrap();
    assert!(
        full.blocks_free() * full.fragment_size() < 1 << 20,
        "statfs counts the backing files: {} bytes free",
        full.blocks_free() * full.fragment_size()
    );
    drop(f);
    std::fs::remove_file(m.p("fill")).unwrap();
    // The backing file goes with the inode (after the kernel's FORGET).
    poll_until("the space to come back", || {
        let s = nix::sys::statvfs::statvfs(&m.path()).unwrap();
        s.blocks_free() * s.fragment_size() > 15 << 20
    });
    let mut f = File::create(m.p("again")).unwrap();
    f.write_all(&vec![1; 8 << 20]).unwrap();
    drop(f);
    assert!(!kernel_lacks_passthrough(&log));
    m.unmount();
}

#[test]
fn passthrough_files_stay_consistent() {
    if !is_root() {
        eprintln!("skipped: needs root and no MEMFS_TEST_MOUNT_ARGS");
        return;
    }
    let (m, _log) = mount_logged(&["--data-path", "passthrough"]);
    // Write, read back, truncate down and up; sizes through stat.
    let a = pattern(300_000, 1);
    std::fs::write(m.p("a"), &a).unwrap();
    assert_eq!(std::fs::read(m.p("a")).unwrap(), a);
    assert_eq!(std::fs::metadata(m.p("a")).unwrap().len(), a.len() as u64);
    let f = OpenOptions::new().write(true).open(m.p("a")).unwrap();
    f.set_len(100_000).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 100_000);
    assert_eq!(std::fs::read(m.p("a")).unwrap(), a[..100_000]);
    f.set_len(200_000).unwrap();
    let back = std::fs::read(m.p("a")).unwrap();
    assert_eq!(back[..100_000], a[..100_000]);
    assert!(
        back[100_000..].iter().all(|&b| b == 0),
        "extended with zeros"
    );
    // A hole punched, then SEEK_DATA / SEEK_HOLE see it.
    let fd = f.as_raw_fd();
    let r = unsafe {
        // SAFETY: fallocate on a descriptor we own, no memory involved.
        libc::fallocate(
            fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            0,
            65536,
        )
    };
    assert_eq!(r, 0, "punch: {}", std::io::Error::last_os_error());
    let mut g = File::open(m.p("a")).unwrap();
    let mut head = vec![1; 65536];
    g.read_exact(&mut head).unwrap();
    assert!(
        head.iter().all(|&b| b == 0),
        "the punched range reads zeros"
    );
    let data = nix::unistd::lseek(&g, 0, nix::unistd::Whence::SeekData).unwrap();
    assert_eq!(data, 65536, "SEEK_DATA skips the hole");
    // Extending fallocate changes the size.
    let r = unsafe {
        // SAFETY: as above.
        libc::fallocate(fd, 0, 0, 300_000)
    };
    assert_eq!(r, 0, "fallocate: {}", std::io::Error::last_os_error());
    assert_eq!(std::fs::metadata(m.p("a")).unwrap().len(), 300_000);
    drop((f, g));
    // copy_file_range between two passthrough files.
    let b = pattern(200_000, 9);
    std::fs::write(m.p("b"), &b).unwrap();
    let src = File::open(m.p("b")).unwrap();
    let dst = File::create(m.p("c")).unwrap();
    let mut oi = 1000i64;
    let mut oo = 0i64;
    let n = nix::fcntl::copy_file_range(&src, Some(&mut oi), &dst, Some(&mut oo), 150_000).unwrap();
    assert_eq!(n, 150_000);
    drop((src, dst));
    assert_eq!(std::fs::read(m.p("c")).unwrap(), b[1000..151_000]);
    // Hard links share the data; an unlinked open file stays readable.
    std::fs::hard_link(m.p("b"), m.p("b2")).unwrap();
    let mut w = OpenOptions::new().write(true).open(m.p("b2")).unwrap();
    w.seek(SeekFrom::Start(0)).unwrap();
    w.write_all(b"linked").unwrap();
    drop(w);
    assert_eq!(&std::fs::read(m.p("b")).unwrap()[..6], b"linked");
    let keep = File::open(m.p("b")).unwrap();
    std::fs::remove_file(m.p("b")).unwrap();
    std::fs::remove_file(m.p("b2")).unwrap();
    let mut buf = vec![0; 6];
    keep.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"linked");
    drop(keep);
    // mtime moves on a passthrough write and utimens sticks.
    let t0 = std::fs::metadata(m.p("c")).unwrap().mtime();
    let p = std::ffi::CString::new(m.p("c").to_str().unwrap()).unwrap();
    let times = [
        libc::timespec {
            tv_sec: 1000,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: 2000,
            tv_nsec: 0,
        },
    ];
    // SAFETY: a valid C path and two timespecs.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), times.as_ptr(), 0) };
    assert_eq!(r, 0);
    let md = std::fs::metadata(m.p("c")).unwrap();
    assert_eq!((md.atime(), md.mtime()), (1000, 2000));
    assert!(t0 > 2000);
    let f = OpenOptions::new().write(true).open(m.p("c")).unwrap();
    f.write_all_at(b"x", 0).unwrap();
    drop(f);
    assert!(std::fs::metadata(m.p("c")).unwrap().mtime() >= t0);
    // mmap through passthrough sees what write put there.
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("c"))
        .unwrap();
    // SAFETY: a shared read-only mapping of 4096 bytes of a file we keep
    // open, read within the file's size and unmapped before it is closed.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        let s = std::slice::from_raw_parts(p as *const u8, 2);
        assert_eq!(s, &[b'x', b[1001]]);
        libc::munmap(p, 4096);
    }
    drop(f);
    m.unmount();
}
