//! Processes for the fault tests: a faultfs mount and memfs servers on top
//! of it, each stopped, unmounted and reaped in every path (Drop runs on
//! panics too).

#![allow(dead_code)]

pub mod ops;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn faultfs_bin() -> &'static str {
    env!("CARGO_BIN_EXE_memfs-faultfs")
}

/// The `memfs` binary under test: `MEMFS_BIN`, else the workspace's
/// target/release/memfs (`cargo build --release --bin memfs`).
pub fn memfs_bin() -> PathBuf {
    let p = std::env::var_os("MEMFS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release/memfs")
        });
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --release --bin memfs` (or set MEMFS_BIN)",
        p.display()
    );
    p
}

pub fn is_mount_point(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = path.to_string_lossy();
    info.lines().any(|l| l.split(' ').nth(4) == Some(&*want))
}

/// Polls `done` until it holds, failing with `what` after 20 s.
pub fn poll_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn detach(p: &Path) {
    if is_mount_point(p) {
        let _ = nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH);
    }
}

fn wait_mounted(child: &mut Child, mp: &Path, what: &str, log: &Path) {
    poll_until(what, || {
        if let Some(status) = child.try_wait().unwrap() {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            panic!("{what}: exited before mounting ({status}): {log}");
        }
        is_mount_point(mp)
    });
}

/// Aborts the FUSE connection of the mount at `mp` through fusectl (root;
/// mounted at /sys/fs/fuse/connections if it is not): every request in
/// flight fails, and a server stuck on one can exit.
fn abort_connection(mp: &Path) {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = mp.to_string_lossy();
    let Some(minor) = info
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(&*want))
        .and_then(|l| l.split(' ').nth(2)?.split(':').nth(1).map(str::to_owned))
    else {
        return;
    };
    let ctl = Path::new("/sys/fs/fuse/connections");
    if std::fs::read_dir(ctl).is_ok_and(|mut d| d.next().is_none()) {
        let _ = std::process::Command::new("mount")
            .args(["-t", "fusectl", "none"])
            .arg(ctl)
            .status();
    }
    let _ = std::fs::write(ctl.join(minor).join("abort"), "1");
}

/// `memfs-faultfs BACKING MNT` over fresh temporary directories.
pub struct FaultFs {
    pub dir: tempfile::TempDir,
    child: Option<Child>,
}

impl FaultFs {
    pub fn start() -> FaultFs {
        assert!(Path::new("/dev/fuse").exists(), "these tests need FUSE");
        let dir = tempfile::Builder::new()
            .prefix("faultfs-test-")
            .tempdir()
            .unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir(root.join("backing")).unwrap();
        std::fs::create_dir(root.join("mnt")).unwrap();
        let log = root.join("faultfs.log");
        let mut child = Command::new(faultfs_bin())
            .arg(root.join("backing"))
            .arg(root.join("mnt"))
            .stdin(Stdio::null())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .expect("start memfs-faultfs");
        let r = wait_mounted_guarded(&mut child, &root.join("mnt"), "faultfs", &log);
        let f = FaultFs {
            dir,
            child: Some(child),
        };
        if let Err(p) = r {
            drop(f);
            std::panic::resume_unwind(p);
        }
        f
    }

    pub fn mnt(&self) -> PathBuf {
        self.dir.path().canonicalize().unwrap().join("mnt")
    }

    pub fn backing(&self) -> PathBuf {
        self.dir.path().canonicalize().unwrap().join("backing")
    }

    /// Sends one control command; panics if faultfs refuses it.
    pub fn ctl(&self, cmd: &str) {
        std::fs::write(self.mnt().join(".faultfs-ctl"), format!("{cmd}\n"))
            .unwrap_or_else(|e| panic!("faultfs refused {cmd:?}: {e}"));
    }

    pub fn status(&self) -> String {
        std::fs::read_to_string(self.mnt().join(".faultfs-ctl")).unwrap()
    }

    /// SIGTERM and checks that faultfs unmounts and exits by itself.
    pub fn stop(mut self) {
        let mut c = self.child.take().unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(c.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let st = c.wait().unwrap();
        assert!(st.success(), "faultfs exited with {st}");
        assert!(!is_mount_point(&self.mnt()), "faultfs left its mount");
    }
}

fn wait_mounted_guarded(
    child: &mut Child,
    mp: &Path,
    what: &str,
    log: &Path,
) -> std::thread::Result<()> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_mounted(child, mp, what, log)
    }))
}

impl Drop for FaultFs {
    fn drop(&mut self) {
        let mnt = self.dir.path().join("mnt");
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        detach(&mnt);
    }
}

/// A foreground `memfs mount MP --data-dir D --durability sync`, its
/// standard error in `log`.
/// faultfs, and a durable memfs on top of it: its data directory is
/// `data` on faultfs, its mount point and log in faultfs's work directory.
pub struct Stack {
    pub ffs: FaultFs,
    pub data: PathBuf,
    pub mp: PathBuf,
    pub log: PathBuf,
}

impl Stack {
    /// Both mounted, memfs in `durability` mode.
    pub fn start(durability: &str) -> (Stack, Memfs) {
        let ffs = FaultFs::start();
        let work = ffs.dir.path().canonicalize().unwrap();
        let data = ffs.mnt().join("data");
        let mp = work.join("m");
        let log = work.join("memfs.log");
        let m = Memfs::start_with(&mp, &data, &log, durability);
        (Stack { ffs, data, mp, log }, m)
    }
}

pub struct Memfs {
    pub mp: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
}

impl Memfs {
    pub fn start(mp: &Path, data: &Path, log: &Path) -> Memfs {
        Memfs::start_with(mp, data, log, "sync")
    }

    /// With another `--durability` mode.
    pub fn start_with(mp: &Path, data: &Path, log: &Path, durability: &str) -> Memfs {
        std::fs::create_dir_all(mp).unwrap();
        let err = File::options().create(true).append(true).open(log).unwrap();
        let child = Command::new(memfs_bin())
            .arg("mount")
            .arg(mp)
            .arg("--foreground")
            .arg("--data-dir")
            .arg(data)
            .args(["--durability", durability])
            .stdin(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("start memfs");
        let mut m = Memfs {
            mp: mp.to_path_buf(),
            log: log.to_path_buf(),
            child: Some(child),
        };
        let c = m.child.as_mut().unwrap();
        wait_mounted(c, mp, "memfs", log);
        m
    }

    /// SIGKILL, reap, detach the dead mount. A server that has not exited
    /// 60 s after the SIGKILL has a thread stuck in the kernel: its FUSE
    /// connection is aborted so that it exits, and the test fails saying
    /// so rather than waiting until CI's limit.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            while c.try_wait().unwrap().is_none() {
                if Instant::now() > deadline {
                    abort_connection(&self.mp);
                    let _ = c.wait();
                    detach(&self.mp);
                    panic!(
                        "the memfs server had not exited 60 s after SIGKILL: a thread of it \
                         was stuck in the kernel (its FUSE connection was aborted to clean up)"
                    );
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        detach(&self.mp);
        assert!(!is_mount_point(&self.mp));
    }

    /// SIGTERM: the server unmounts and closes its data directory; returns
    /// whether it exited successfully.
    pub fn stop(&mut self) -> bool {
        let mut c = self.child.take().unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(c.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let ok = c.wait().unwrap().success();
        detach(&self.mp);
        ok
    }

    pub fn assert_no_panic(&self) {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        assert!(
            !log.contains("panicked"),
            "the memfs server panicked:\n{log}"
        );
    }
}

impl Drop for Memfs {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        detach(&self.mp);
    }
}

/// xorshift64*: a seeded generator without a dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // splitmix64 first: neighbouring seeds must give different streams
        // (a plain `| 1` made 2k and 2k+1 the same).
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `FAULTFS_SEED`, else one derived from the clock; printed so a failure
/// can be replayed.
pub fn seed(test: &str) -> u64 {
    let s = std::env::var("FAULTFS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("{test}: FAULTFS_SEED={s}");
    s
}
