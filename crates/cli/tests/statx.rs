//! Mounted tests of statx(2) (issue 14, xfstests generic/528): the creation
//! time (btime) of every node, set at create to the nanosecond and unchanged
//! by writes, chmod, renames and links; kept across a durable remount
//! (checkpoint) and a SIGKILL crash (journal replay); and the statx
//! attributes of chattr +a/+i/+d as far as the kernel passes them on.

mod common;

use std::ffi::CString;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::Mount;

/// One test at a time: a forked child of a concurrent test could hold a
/// descriptor of this test's mount and make its unmount fail (EBUSY).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Times {
    btime: (i64, u32),
    ctime: (i64, u32),
}

struct Sx {
    mask: u32,
    times: Times,
    attributes: u64,
    attributes_mask: u64,
}

/// statx(2) of `p` (not following a last symlink), asking for btime and
/// forcing the kernel to ask the file system rather than its cache.
fn statx(p: &Path) -> Sx {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: all-zero bytes are a valid `struct statx`.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `sx` a writable statx buffer,
    // both alive for the call.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW | libc::AT_STATX_FORCE_SYNC,
            libc::STATX_BASIC_STATS | libc::STATX_BTIME,
            &mut sx,
        )
    };
    assert_eq!(
        r,
        0,
        "statx {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
    Sx {
        mask: sx.stx_mask,
        times: Times {
            btime: (sx.stx_btime.tv_sec, sx.stx_btime.tv_nsec),
            ctime: (sx.stx_ctime.tv_sec, sx.stx_ctime.tv_nsec),
        },
        attributes: sx.stx_attributes,
        attributes_mask: sx.stx_attributes_mask,
    }
}

fn btime(p: &Path) -> (i64, u32) {
    let s = statx(p);
    assert!(
        s.mask & libc::STATX_BTIME != 0,
        "{}: statx shows no btime (mask {:#x})",
        p.display(),
        s.mask
    );
    s.times.btime
}

#[test]
fn btime_is_set_at_create_and_never_changed() {
    let _serial = serial();
    let m = Mount::new();
    let f = m.p("f");
    fs::write(&f, b"x").unwrap();
    fs::create_dir(m.p("d")).unwrap();
    std::os::unix::fs::symlink("f", m.p("s")).unwrap();
    for p in [m.p("f"), m.p("d"), m.p("s")] {
        let s = statx(&p);
        assert!(s.mask & libc::STATX_BTIME != 0, "{}: no btime", p.display());
        // Born with ctime = btime, except the file, written once since.
        if p != f {
            assert_eq!(s.times.btime, s.times.ctime, "{}", p.display());
        }
    }
    let born = btime(&f);
    assert!(born.0 > 0, "a real creation time, not 0: {born:?}");
    let check = |p: &Path, what: &str| {
        assert_eq!(btime(p), born, "btime after {what}");
    };
    fs::write(&f, b"more data").unwrap();
    check(&f, "write");
    fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
    check(&f, "chmod");
    let g = m.p("d/g");
    fs::rename(&f, &g).unwrap();
    check(&g, "rename");
    fs::hard_link(&g, m.p("h")).unwrap();
    check(&g, "link");
    check(&m.p("h"), "link (the new name)");
    let s = statx(&g);
    assert!(
        s.times.ctime > born,
        "ctime moved on while btime stayed: {:?}",
        s.times
    );
    m.unmount();
}

// FS_IOC_SETFLAGS takes an int, declared `long` (as e2fsprogs uses it).
nix::ioctl_write_ptr!(setflags_ioctl, b'f', 2, libc::c_long);

fn set_flags(p: &Path, flags: u32) {
    let f = fs::File::open(p).unwrap();
    let v = flags as libc::c_int;
    // SAFETY: the kernel reads one int from `v`, which outlives the call.
    unsafe { setflags_ioctl(f.as_raw_fd(), (&v as *const libc::c_int).cast()) }
        .unwrap_or_else(|e| panic!("FS_IOC_SETFLAGS {}: {e}", p.display()));
}

const FS_IMMUTABLE_FL: u32 = 0x10;
const FS_APPEND_FL: u32 = 0x20;
const FS_NODUMP_FL: u32 = 0x40;

#[test]
fn statx_attributes_of_inode_flags() {
    let _serial = serial();
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: setting append-only/immutable needs CAP_LINUX_IMMUTABLE");
        return;
    }
    let m = Mount::new();
    for (name, fl) in [
        ("a", FS_APPEND_FL),
        ("i", FS_IMMUTABLE_FL),
        ("d", FS_NODUMP_FL),
        ("none", 0),
    ] {
        let p = m.p(name);
        fs::write(&p, b"x").unwrap();
        let born = btime(&p);
        if fl != 0 {
            set_flags(&p, fl);
        }
        let s = statx(&p);
        assert_eq!(s.times.btime, born, "{name}: chattr changed btime");
        // memfs answers with tmpfs's attributes and mask; the kernel passes
        // on only those it fills itself (fuse_do_statx copies neither
        // stx_attributes nor the mask on Linux 6.18), so either memfs's
        // bits arrive whole or none of them does.
        let known =
            (libc::STATX_ATTR_APPEND | libc::STATX_ATTR_IMMUTABLE | libc::STATX_ATTR_NODUMP) as u64;
        if s.attributes_mask & known != 0 {
            assert_eq!(s.attributes_mask & known, known, "{name}");
            assert_eq!(s.attributes & known, fl as u64, "{name}");
        } else {
            assert_eq!(s.attributes & known, 0, "{name}: attributes without a mask");
        }
        if fl != 0 {
            set_flags(&p, 0);
        }
    }
    m.unmount();
}

#[test]
fn btime_survives_remount_and_crash_of_a_durable_mount() {
    let _serial = serial();
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().to_str().unwrap();
    let args = ["--data-dir", dir, "--durability", "sync"];
    let m = Mount::with_args(&args);
    fs::write(m.p("f"), b"data").unwrap();
    fs::create_dir(m.p("d")).unwrap();
    let (f_born, d_born) = (btime(&m.p("f")), btime(&m.p("d")));
    // ctime moves past btime: the checkpoint must carry btime on its own.
    fs::set_permissions(m.p("f"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_ne!(statx(&m.p("f")).times.ctime, f_born);
    // A clean unmount writes a checkpoint.
    m.unmount();
    let mut m = Mount::with_args(&args);
    assert_eq!(btime(&m.p("f")), f_born, "f after remount");
    assert_eq!(btime(&m.p("d")), d_born, "d after remount");
    // Created and changed after the checkpoint, then a crash: the journal
    // gives the btimes back.
    fs::write(m.p("g"), b"new").unwrap();
    let g_born = btime(&m.p("g"));
    fs::write(m.p("g"), b"newer").unwrap();
    fs::set_permissions(m.p("d"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::rename(m.p("f"), m.p("d/f")).unwrap();
    m.kill();
    drop(m);
    let m = Mount::with_args(&args);
    assert_eq!(btime(&m.p("d/f")), f_born, "f after crash");
    assert_eq!(btime(&m.p("d")), d_born, "d after crash");
    assert_eq!(btime(&m.p("g")), g_born, "g after crash");
    m.unmount();
}
