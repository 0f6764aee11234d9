//! NFS export of a memfs mount (issue 14): a memfs mount exported by
//! nfs-ganesha's VFS FSAL on 127.0.0.1 and used through libnfs's client
//! tools. The VFS FSAL reaches the exported file system only through file
//! handles (`name_to_handle_at`, `open_by_handle_at` against the mount), the
//! interface knfsd's exports rely on too; this machine's kernel has no nfsd
//! and no NFS client, so a userspace server and client stand in for them.
//! Between writing a file and reading it back, the NFS server is restarted
//! and the kernel's caches are dropped: the server must reopen every object
//! by handle, for inodes the kernel no longer holds.
//!
//! NFSv3 (with rpcbind, started here when none runs): libnfs 4.0's NFSv4
//! client fails writes of more than ~2 KiB against ganesha on tmpfs too.

mod common;

use common::{Mount, have, poll_until};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// A daemon started by the test, stopped on every path: SIGTERM (ganesha
/// then unregisters from rpcbind), SIGKILL if it is still there after a
/// few seconds, and reaped.
struct Daemon {
    name: &'static str,
    child: Option<Child>,
}

impl Daemon {
    fn start(name: &'static str, cmd: &mut Command) -> Daemon {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        Daemon {
            name,
            child: Some(child),
        }
    }

    /// Fails the test if the daemon exited (a port in use, a bad config).
    fn check_alive(&mut self) {
        if let Some(status) = self
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
        {
            panic!("{} exited: {status}", self.name);
        }
    }

    fn stop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(c.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        for _ in 0..500 {
            if c.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = c.kill();
        let _ = c.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

fn tcp_listening(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// Two distinct ports nobody listens on right now, for the NFS and mount
/// services (both bound at once, so they differ).
fn free_ports() -> (u16, u16) {
    let bind = || std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let (a, b) = (bind(), bind());
    (
        a.local_addr().unwrap().port(),
        b.local_addr().unwrap().port(),
    )
}

fn ganesha_config(dir: &Path, export: &Path, port: u16, mnt_port: u16) -> PathBuf {
    let conf = dir.join("ganesha.conf");
    std::fs::write(
        &conf,
        format!(
            "NFS_CORE_PARAM {{
    Protocols = 3;
    NFS_Port = {port};
    MNT_Port = {mnt_port};
    Bind_addr = 127.0.0.1;
    Enable_NLM = false;
    Enable_RQUOTA = false;
}}
# No grace period after a start: during it ganesha answers a truncating
# SETATTR (an NFSv3 create with O_TRUNC) with NFS3ERR_JUKEBOX.
NFSv4 {{
    Graceless = true;
}}
EXPORT {{
    Export_Id = 1;
    Path = {export};
    Pseudo = {export};
    Access_Type = RW;
    Squash = No_Root_Squash;
    Protocols = 3;
    SecType = sys;
    FSAL {{ Name = VFS; }}
}}
",
            export = export.display()
        ),
    )
    .unwrap();
    conf
}

fn start_ganesha(dir: &Path, conf: &Path) -> Daemon {
    Daemon::start(
        "ganesha.nfsd",
        Command::new("ganesha.nfsd")
            .arg("-F")
            .arg("-f")
            .arg(conf)
            .arg("-L")
            .arg(dir.join("ganesha.log"))
            .arg("-p")
            .arg(dir.join("ganesha.pid"))
            .args(["-N", "NIV_EVENT"]),
    )
}

fn nfs(tool: &str, args: &[&str]) -> Output {
    Command::new(tool)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {tool}: {e}"))
}

/// Waits until the export answers a listing, failing if the server died.
fn await_export(g: &mut Daemon, url: &str) {
    poll_until("the NFS export to answer", || {
        g.check_alive();
        nfs("nfs-ls", &[url]).status.success()
    });
}

#[test]
fn a_memfs_mount_is_exported_over_nfs_by_file_handles() {
    let tools = ["ganesha.nfsd", "rpcbind", "nfs-ls", "nfs-cp", "nfs-cat"];
    if !nix::unistd::geteuid().is_root() || tools.iter().any(|t| !have(t)) {
        eprintln!("skipped: needs root and {tools:?} (scripts/setup installs them)");
        return;
    }
    let m = Mount::new();
    let root = m.path();
    std::fs::write(m.p("direct.txt"), b"written on the mount\n").unwrap();
    std::fs::create_dir(m.p("d")).unwrap();
    let tmp = tempfile::tempdir().unwrap();

    // ganesha's NFSv3 services register with rpcbind (it exits without
    // one): use the machine's if one runs, else one of our own for the
    // test's duration. The client is given both ports, so it never asks
    // rpcbind and cannot reach another NFS server registered there.
    let _rpcbind =
        (!tcp_listening(111)).then(|| Daemon::start("rpcbind", Command::new("rpcbind").arg("-f")));
    poll_until("rpcbind to listen", || tcp_listening(111));
    let (port, mnt_port) = free_ports();
    let conf = ganesha_config(tmp.path(), &root, port, mnt_port);
    let mut g = start_ganesha(tmp.path(), &conf);
    let url = |rel: &str| {
        format!(
            "nfs://127.0.0.1{}{rel}?nfsport={port}&mountport={mnt_port}",
            root.display()
        )
    };
    await_export(&mut g, &url("/"));

    // Read what was written on the mount; list the root.
    let cat = nfs("nfs-cat", &[&url("/direct.txt")]);
    assert!(cat.status.success(), "nfs-cat: {cat:?}");
    assert_eq!(cat.stdout, b"written on the mount\n");
    let ls = nfs("nfs-ls", &[&url("/")]);
    let listing = String::from_utf8_lossy(&ls.stdout);
    assert!(
        listing.contains("direct.txt") && listing.contains(" d\n"),
        "{listing}"
    );

    // Write through NFS: 3 MiB and a bit, so several WRITEs and a tail.
    let src = tmp.path().join("src.bin");
    let data: Vec<u8> = (0..3 * 1024 * 1024 + 4321u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    let cp = nfs("nfs-cp", &[src.to_str().unwrap(), &url("/d/copy.bin")]);
    assert!(cp.status.success(), "nfs-cp to the export: {cp:?}");
    assert!(
        std::fs::read(m.p("d/copy.bin")).unwrap() == data,
        "the mount does not hold what was written through NFS"
    );

    // A fresh NFS server and a kernel that forgot memfs's inodes: every
    // object is reopened from its handle (open_by_handle_at), which memfs
    // answers with LOOKUPs of "." and ".." by inode number.
    g.stop();
    nix::unistd::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    let mut g = start_ganesha(tmp.path(), &conf);
    await_export(&mut g, &url("/"));
    let back = tmp.path().join("back.bin");
    let cp = nfs("nfs-cp", &[&url("/d/copy.bin"), back.to_str().unwrap()]);
    assert!(cp.status.success(), "nfs-cp from the export: {cp:?}");
    assert!(
        std::fs::read(&back).unwrap() == data,
        "read back through NFS after a server restart and dropped caches differs"
    );
    let ls = nfs("nfs-ls", &[&url("/d")]);
    let listing = String::from_utf8_lossy(&ls.stdout);
    assert!(
        listing
            .lines()
            .any(|l| l.ends_with(" copy.bin") && l.contains(&data.len().to_string())),
        "{listing}"
    );
    g.stop();
}
