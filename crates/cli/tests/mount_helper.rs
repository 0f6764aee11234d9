//! memfs as mount(8) sees it: every mount has type `fuse.memfs` with the
//! fsname as its source, and (as root, with mount(8) and mount.fuse3)
//! `mount -t fuse.memfs memfs DIR -o size=...` and an fstab line work with
//! `memfs` on the PATH. mount.fuse3 runs `memfs` from PATH, so each test puts
//! a temporary directory with a `memfs` symlink to the built binary in front.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{Mount, fuse_available, have, is_mount_point, memfs_bin};

/// `(type, source)` of the mount at `path`, from /proc/self/mountinfo.
fn mount_type_and_source(path: &Path) -> Option<(String, String)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = path.to_string_lossy();
    // The last matching line is the mount on top.
    info.lines()
        .rev()
        .filter(|l| l.split(' ').nth(4) == Some(&*want))
        .filter_map(|l| {
            let (_, tail) = l.split_once(" - ")?;
            let mut f = tail.split(' ');
            Some((f.next()?.to_string(), f.next()?.to_string()))
        })
        .next()
}

#[test]
fn a_mount_has_type_fuse_memfs() {
    if !fuse_available() {
        eprintln!("skipped: /dev/fuse is missing");
        return;
    }
    let m = Mount::new();
    let (kind, source) = mount_type_and_source(&m.path()).expect("mount listed");
    assert_eq!(kind, "fuse.memfs");
    assert_eq!(source, "memfs");
    m.unmount();
}

/// mount(8) runs its helpers with a PATH of its own (the caller's is not
/// passed on), so `memfs` must be installed where that PATH looks, as
/// `scripts/setup` leaves it. Where it is not, the test links it for its
/// own duration; the tests that do so run one at a time.
const SYSTEM_MEMFS: &str = "/usr/local/bin/memfs";
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A mount point and a PATH directory holding `memfs`; detaches whatever is
/// still mounted at the end, also when the test panics (the server exits
/// once its mount is gone), and removes a `memfs` link it installed.
struct Helper {
    mountpoint: tempfile::TempDir,
    bin: tempfile::TempDir,
    installed: Option<PathBuf>,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Helper {
    /// `None` (with the reason printed) where mount(8) cannot be tested.
    fn new() -> Option<Helper> {
        let skip = if !nix::unistd::geteuid().is_root() {
            Some("not root: mount(8) with a FUSE helper needs root")
        } else if !fuse_available() {
            Some("/dev/fuse is missing")
        } else if !have("mount") {
            Some("no mount(8)")
        } else if !Path::new("/sbin/mount.fuse3").exists()
            && !Path::new("/usr/sbin/mount.fuse3").exists()
        {
            Some("no mount.fuse3 (package fuse3)")
        } else {
            None
        };
        if let Some(why) = skip {
            eprintln!("skipped: {why}");
            return None;
        }
        let mountpoint = tempfile::Builder::new()
            .prefix("memfs-mount8-")
            .tempdir()
            .expect("tempdir");
        let bin = tempfile::Builder::new()
            .prefix("memfs-path-")
            .tempdir()
            .expect("tempdir");
        std::os::unix::fs::symlink(memfs_bin(), bin.path().join("memfs")).expect("symlink memfs");
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let system = PathBuf::from(SYSTEM_MEMFS);
        let installed = if std::fs::symlink_metadata(&system).is_err() {
            std::os::unix::fs::symlink(memfs_bin(), &system).expect("link /usr/local/bin/memfs");
            Some(system)
        } else {
            None
        };
        Some(Helper {
            mountpoint,
            bin,
            installed,
            _serial: serial,
        })
    }

    fn path(&self) -> PathBuf {
        self.mountpoint.path().canonicalize().unwrap()
    }

    /// Runs mount(8) with `memfs` first on the PATH.
    fn mount(&self, args: &[&str]) -> Output {
        let path = format!(
            "{}:{}",
            self.bin.path().display(),
            std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into())
        );
        let out = Command::new("mount")
            .args(args)
            .env("PATH", path)
            .output()
            .expect("run mount(8)");
        assert!(
            out.status.success(),
            "mount {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Checks the mount is a working memfs of `size` bytes from `source`,
    /// then unmounts it with `memfs umount`.
    fn check_and_unmount(&self, source: &str, size: u64) {
        let mp = self.path();
        assert!(is_mount_point(&mp), "nothing mounted at {}", mp.display());
        let (kind, src) = mount_type_and_source(&mp).expect("mount listed");
        assert_eq!(kind, "fuse.memfs");
        assert_eq!(src, source);
        let st = nix::sys::statvfs::statvfs(&mp).expect("statvfs");
        let total = st.blocks() * st.fragment_size();
        assert!(
            total.abs_diff(size) <= size / 16,
            "capacity {total}, mounted with {size}"
        );
        std::fs::write(mp.join("f"), b"through mount(8)").unwrap();
        assert_eq!(std::fs::read(mp.join("f")).unwrap(), b"through mount(8)");
        let st = Command::new(memfs_bin())
            .arg("umount")
            .arg(&mp)
            .status()
            .unwrap();
        assert!(st.success(), "memfs umount failed");
        assert!(!is_mount_point(&mp), "still mounted after memfs umount");
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let path = self.mountpoint.path().to_path_buf();
        if is_mount_point(&path) {
            let _ = nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH);
        }
        if let Some(link) = self.installed.take() {
            let _ = std::fs::remove_file(link);
        }
    }
}

#[test]
fn mount_t_fuse_memfs() {
    let Some(h) = Helper::new() else { return };
    let mp = h.path();
    h.mount(&[
        "-t",
        "fuse.memfs",
        "memfs",
        mp.to_str().unwrap(),
        "-o",
        "size=64M",
    ]);
    h.check_and_unmount("memfs", 64 << 20);
}

#[test]
fn fstab_line() {
    let Some(h) = Helper::new() else { return };
    let mp = h.path();
    let fstab = h.bin.path().join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "scratch {} fuse.memfs size=32M,nr_inodes=1k 0 0\n",
            mp.display()
        ),
    )
    .unwrap();
    h.mount(&["-T", fstab.to_str().unwrap(), mp.to_str().unwrap()]);
    h.check_and_unmount("scratch", 32 << 20);
}

/// A mistyped command is answered as one, with clap's suggestion, not
/// taken for mount(8)'s `memfs SOURCE MOUNTPOINT` and mounted.
#[test]
fn typos_get_a_suggestion_not_a_mount() {
    let out = common::memfs(["snapshots", "list"]);
    let err = common::failed(out);
    assert!(
        err.contains("unrecognized subcommand 'snapshots'")
            && err.contains("similar subcommand exists: 'snapshot'"),
        "no suggestion: {err}"
    );
    assert!(!err.contains("mount point"), "taken for a mount: {err}");

    let out = common::memfs(["volumes", "--help"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = common::failed(out);
    assert!(
        err.contains("unrecognized subcommand 'volumes'")
            && err.contains("similar subcommand exists: 'volume'"),
        "no suggestion: {err}"
    );
    let mount_help = String::from_utf8(common::memfs(["mount", "--help"]).stdout).unwrap();
    assert!(
        !stdout.contains(&mount_help) && !err.contains(&mount_help),
        "printed mount's help: {stdout}{err}"
    );
}
