//! Durable mounts under faults and restarts, through real processes
//! (issue 15): a mount right after a plain umount(8) takes the data
//! directory over from the exiting server.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::{is_mount_point, memfs_bin, poll_until};

/// A foreground `memfs mount` on a given mount point, killed and detached
/// in every path (Drop runs on panics too).
struct Server {
    mp: PathBuf,
    child: Option<Child>,
}

impl Server {
    fn start(mp: &Path, data: &Path) -> Server {
        let child = Command::new(memfs_bin())
            .arg("mount")
            .arg(mp)
            .arg("--foreground")
            .arg("--data-dir")
            .arg(data)
            .stdin(Stdio::null())
            .spawn()
            .expect("start memfs");
        let mut s = Server {
            mp: mp.to_path_buf(),
            child: Some(child),
        };
        poll_until("memfs to mount", || {
            if let Some(c) = s.child.as_mut()
                && let Some(status) = c.try_wait().unwrap()
            {
                panic!("memfs exited before mounting ({status})");
            }
            is_mount_point(mp)
        });
        s
    }

    /// Waits for the server to exit by itself and checks it exited cleanly.
    /// Its mount is gone: the mount point may already hold the next one,
    /// which the guard must leave alone.
    fn wait(mut self) {
        let status = self.child.take().unwrap().wait().unwrap();
        self.mp = PathBuf::new();
        assert!(status.success(), "memfs server exited with {status}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if !self.mp.as_os_str().is_empty() && is_mount_point(&self.mp) {
            let _ = nix::mount::umount2(&self.mp, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

#[test]
fn mount_right_after_plain_umount_takes_the_data_directory_over() {
    let mp = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let mpp = mp.path().canonicalize().unwrap();
    let mut previous: Option<Server> = None;
    for round in 0..4u8 {
        let s = Server::start(&mpp, data.path());
        if let Some(p) = previous.take() {
            p.wait();
        }
        // The exiting server must not have taken the new mount down with it.
        assert!(is_mount_point(&mpp), "round {round}: the new mount is gone");
        // Everything written before survived the takeover.
        for r in 0..round {
            let got = std::fs::read(mpp.join(format!("f{r}"))).unwrap();
            assert_eq!(got, vec![r + 1; 8 << 20], "file of round {r}");
        }
        // Enough data that the final checkpoint keeps the server busy
        // after the kernel has already unmounted.
        std::fs::write(mpp.join(format!("f{round}")), vec![round + 1; 8 << 20]).unwrap();
        let st = Command::new("umount").arg(&mpp).status().unwrap();
        assert!(st.success(), "umount(8) failed");
        previous = Some(s);
    }
    let s = Server::start(&mpp, data.path());
    previous.take().unwrap().wait();
    // A directory that is still mounted is refused at once, not waited for.
    let other = tempfile::tempdir().unwrap();
    let t0 = std::time::Instant::now();
    let out = Command::new(memfs_bin())
        .arg("mount")
        .arg(other.path())
        .arg("--foreground")
        .arg("--data-dir")
        .arg(data.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use by another process"), "{err}");
    assert!(err.contains("mounted by another memfs"), "{err}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(10));
    let st = Command::new("umount").arg(&mpp).status().unwrap();
    assert!(st.success());
    s.wait();
}
