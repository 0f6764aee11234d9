//! A real memfs mount for integration tests: a `memfs mount --foreground`
//! child process, unmounted and reaped in every path (Drop runs on panics too).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Mount {
    pub dir: tempfile::TempDir,
    child: Option<Child>,
}

pub fn memfs_bin() -> &'static str {
    env!("CARGO_BIN_EXE_memfs")
}

fn is_mount_point(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = path.to_string_lossy();
    info.lines().any(|l| l.split(' ').nth(4) == Some(&*want))
}

/// Whether this machine can mount FUSE file systems at all.
pub fn fuse_available() -> bool {
    Path::new("/dev/fuse").exists()
}

impl Mount {
    pub fn new() -> Mount {
        Mount::with_args(&[])
    }

    pub fn with_args(args: &[&str]) -> Mount {
        assert!(
            fuse_available(),
            "/dev/fuse is missing: these tests need FUSE"
        );
        let dir = tempfile::Builder::new()
            .prefix("memfs-test-")
            .tempdir()
            .expect("tempdir");
        let path = dir.path().canonicalize().expect("canonical tempdir");
        let child = Command::new(memfs_bin())
            .arg("mount")
            .arg(&path)
            .arg("--foreground")
            .args(args)
            .stdin(Stdio::null())
            .spawn()
            .expect("start memfs");
        let mut m = Mount {
            dir,
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !is_mount_point(&path) {
            if let Some(status) = m.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("memfs exited before mounting: {status}");
            }
            assert!(Instant::now() < deadline, "memfs did not mount within 20 s");
            std::thread::sleep(Duration::from_millis(5));
        }
        m
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().canonicalize().unwrap()
    }

    pub fn p(&self, rel: &str) -> PathBuf {
        self.path().join(rel)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Unmounts and checks that the server exits by itself, cleanly.
    pub fn unmount(mut self) {
        let path = self.path();
        let st = Command::new(memfs_bin())
            .arg("umount")
            .arg(&path)
            .status()
            .unwrap();
        assert!(st.success(), "memfs umount failed");
        let mut child = self.child.take().unwrap();
        let status = child.wait().unwrap();
        assert!(status.success(), "memfs server exited with {status}");
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let path = self.dir.path().to_path_buf();
        if is_mount_point(&path) {
            let _ = nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH);
            let _ = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&path)
                .stderr(Stdio::null())
                .status();
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn have(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}
