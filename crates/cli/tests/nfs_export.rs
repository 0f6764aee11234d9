//! NFS export of a memfs mount (issue 14): a memfs mount exported by
//! nfs-ganesha's VFS FSAL and used through libnfs's client tools. The VFS
//! FSAL reaches the exported file system only through file handles
//! (`name_to_handle_at`, `open_by_handle_at` against the mount), the
//! interface knfsd's exports rely on too; this machine's kernel has no nfsd
//! and no NFS client, so a userspace server and client stand in for them.
//!
//! The point is stable handles: objects that ganesha knows by handle are
//! reopened after the kernel dropped their inodes, which the kernel does by
//! asking memfs for "." in the inode (and ".." up to the root for a
//! directory). memfs logs those LOOKUPs (`MEMFS_LOG=memfs::export=debug`), and
//! the test checks that they happened, not only that the bytes came back.
//!
//! NFSv3, which ganesha only serves registered with rpcbind: libnfs 4.0's
//! NFSv4 client fails writes of more than ~2 KiB against ganesha, on tmpfs
//! too. rpcbind, ganesha and the client tools run in network and mount
//! namespaces of the test's own (loopback only, a private /run): no rpcbind
//! or NFS server of the machine is used or disturbed, and two runs of the
//! test at once do not meet.

mod common;

use common::{Mount, drop_caches, have, poll_until};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// A daemon started by the test, stopped on every path (its Drop): SIGTERM
/// to its own PID (ganesha then closes its files on the mount), SIGKILL if
/// it is still there after a few seconds, and reaped.
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

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Fails the test if the daemon exited (a bad config, a port in use).
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

/// In the child of `rpcbind`'s spawn, before exec: new network and mount
/// namespaces, mounts of the parent still propagating in (memfs's unmount
/// reaches the copy here), a tmpfs on /run (rpcbind's socket and lock file,
/// and no D-Bus for ganesha to register with), the loopback interface up.
fn enter_new_namespaces() -> std::io::Result<()> {
    fn check(r: libc::c_int) -> std::io::Result<libc::c_int> {
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(r)
        }
    }
    // SAFETY: system calls only, on C string literals and a zeroed ifreq on
    // this stack: nothing of the parent's heap is touched between fork and
    // exec.
    unsafe {
        check(libc::unshare(libc::CLONE_NEWNET | libc::CLONE_NEWNS))?;
        let none = std::ptr::null();
        check(libc::mount(
            none,
            c"/".as_ptr(),
            none,
            libc::MS_REC | libc::MS_SLAVE,
            std::ptr::null(),
        ))?;
        check(libc::mount(
            c"tmpfs".as_ptr(),
            c"/run".as_ptr(),
            c"tmpfs".as_ptr(),
            0,
            std::ptr::null(),
        ))?;
        let sock = check(libc::socket(
            libc::AF_INET,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            0,
        ))?;
        let mut ifr: libc::ifreq = std::mem::zeroed();
        ifr.ifr_name[0] = b'l' as libc::c_char;
        ifr.ifr_name[1] = b'o' as libc::c_char;
        check(libc::ioctl(sock, libc::SIOCGIFFLAGS, &mut ifr))?;
        ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        check(libc::ioctl(sock, libc::SIOCSIFFLAGS, &ifr))?;
        libc::close(sock);
    }
    Ok(())
}

/// The test's own network and mount namespaces, held by the rpcbind that
/// runs in them; every NFS program of the test is started in them.
struct Namespaces {
    /// Holds the namespaces: they go away when it is stopped (its Drop).
    _rpcbind: Daemon,
    net: File,
    mnt: File,
}

impl Namespaces {
    fn new() -> Namespaces {
        let mut cmd = Command::new("rpcbind");
        cmd.arg("-f");
        // SAFETY: see enter_new_namespaces.
        unsafe { cmd.pre_exec(enter_new_namespaces) };
        let mut rpcbind = Daemon::start("rpcbind", &mut cmd);
        let pid = rpcbind.pid();
        // /proc/PID/net/tcp lists the sockets of PID's network namespace:
        // rpcbind listens on port 111 (6F), state 0A.
        poll_until("rpcbind to listen in its namespace", || {
            rpcbind.check_alive();
            std::fs::read_to_string(format!("/proc/{pid}/net/tcp"))
                .is_ok_and(|t| t.lines().any(|l| l.contains(":006F 00000000:0000 0A")))
        });
        let ns = |kind: &str| {
            File::open(format!("/proc/{pid}/ns/{kind}"))
                .unwrap_or_else(|e| panic!("open rpcbind's {kind} namespace: {e}"))
        };
        Namespaces {
            net: ns("net"),
            mnt: ns("mnt"),
            _rpcbind: rpcbind,
        }
    }

    /// `program`, to be run in the namespaces. Entering a mount namespace
    /// moves the working directory to its root: every path given must be
    /// absolute.
    fn command(&self, program: &str) -> Command {
        let (net, mnt) = (self.net.as_raw_fd(), self.mnt.as_raw_fd());
        let mut cmd = Command::new(program);
        // SAFETY: setns(2) only, on descriptors this process keeps open
        // (in the child until exec; they are close-on-exec).
        unsafe {
            cmd.pre_exec(move || {
                for (fd, kind) in [(net, libc::CLONE_NEWNET), (mnt, libc::CLONE_NEWNS)] {
                    if libc::setns(fd, kind) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            })
        };
        cmd
    }

    fn nfs(&self, tool: &str, args: &[&str]) -> Output {
        self.command(tool)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run {tool}: {e}"))
    }

    fn start_ganesha(&self, dir: &Path, conf: &Path) -> Daemon {
        Daemon::start(
            "ganesha.nfsd",
            self.command("ganesha.nfsd")
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

    /// Waits until the export answers a listing, failing if ganesha died.
    fn await_export(&self, g: &mut Daemon, url: &str) {
        poll_until("the NFS export to answer", || {
            g.check_alive();
            self.nfs("nfs-ls", &[url]).status.success()
        });
    }
}

/// ganesha on NFSv3's port 2049 of the namespace, which has only the
/// loopback interface (Bind_addr stays 0.0.0.0: with no IPv4 address but
/// 127.0.0.1, ganesha's getaddrinfo of "127.0.0.1" fails). Its state (the
/// NFSv4 recovery directory, the log, the pid file) stays in `dir`.
fn ganesha_config(dir: &Path, export: &Path) -> PathBuf {
    let conf = dir.join("ganesha.conf");
    std::fs::write(
        &conf,
        format!(
            "NFS_CORE_PARAM {{
    Protocols = 3;
    Enable_NLM = false;
    Enable_RQUOTA = false;
}}
# No grace period after a start: during it ganesha answers a truncating
# SETATTR (an NFSv3 create with O_TRUNC) with NFS3ERR_JUKEBOX.
NFSv4 {{
    Graceless = true;
    RecoveryRoot = {recovery};
}}
EXPORT {{
    Export_Id = 1;
    Path = {export};
    Pseudo = {export};
    Access_Type = RW;
    Squash = None;
    Protocols = 3;
    SecType = sys;
    # Names and attributes once seen stay trusted (no 60 s expiry): after
    # the kernel dropped its caches, ganesha reaches what it listed by the
    # handles it holds, not by looking the names up again.
    Attr_Expiration_Time = -1;
    FSAL {{ Name = VFS; }}
}}
",
            recovery = dir.join("recovery").display(),
            export = export.display()
        ),
    )
    .unwrap();
    conf
}

/// The LOOKUPs of "." and ".." that memfs logged, as (name, inode) pairs.
fn handle_lookups(log: &Path) -> Vec<(String, u64)> {
    let log = std::fs::read_to_string(log).unwrap();
    log.lines()
        .filter_map(|l| {
            let (_, rest) = l.split_once("file handle: LOOKUP \"")?;
            let (name, rest) = rest.split_once("\" in inode ")?;
            let (ino, result) = rest.split_once(": ")?;
            assert!(result.starts_with("inode "), "memfs failed a lookup: {l}");
            Some((name.to_string(), ino.parse().ok()?))
        })
        .collect()
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

#[test]
fn a_memfs_mount_is_exported_over_nfs_by_file_handles() {
    let tools = ["ganesha.nfsd", "rpcbind", "nfs-ls", "nfs-cp", "nfs-cat"];
    if !nix::unistd::geteuid().is_root() || tools.iter().any(|t| !have(t)) {
        eprintln!("skipped: needs root and {tools:?} (scripts/setup installs them)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("memfs.log");
    let m = Mount::spawn_env(
        &[],
        Stdio::from(File::create(&log).unwrap()),
        &[("MEMFS_LOG", "warn,memfs::export=debug")],
    );
    let root = m.path();
    std::fs::write(m.p("direct.txt"), b"written on the mount\n").unwrap();
    std::fs::create_dir(m.p("d")).unwrap();
    std::fs::create_dir(m.p("e")).unwrap();
    std::fs::write(m.p("e/f.txt"), b"listed, then read by handle\n").unwrap();
    let e_ino = std::fs::metadata(m.p("e")).unwrap().ino();
    let f_ino = std::fs::metadata(m.p("e/f.txt")).unwrap().ino();

    // After the mount: the namespaces' copy of the mount table has it.
    let ns = Namespaces::new();
    let conf = ganesha_config(tmp.path(), &root);
    let mut g = ns.start_ganesha(tmp.path(), &conf);
    let url = |rel: &str| format!("nfs://127.0.0.1{}{rel}", root.display());
    ns.await_export(&mut g, &url("/"));

    // Read what was written on the mount; list the root.
    let cat = ns.nfs("nfs-cat", &[&url("/direct.txt")]);
    assert!(cat.status.success(), "nfs-cat: {cat:?}");
    assert_eq!(cat.stdout, b"written on the mount\n");
    let ls = ns.nfs("nfs-ls", &[&url("/")]);
    assert!(ls.status.success(), "nfs-ls: {ls:?}");
    let listing = String::from_utf8_lossy(&ls.stdout);
    for name in ["direct.txt", "d", "e"] {
        assert!(
            listing.lines().any(|l| l.ends_with(&format!(" {name}"))),
            "no {name} in the listing of the root:\n{listing}"
        );
    }

    // Write through NFS: 3 MiB and a bit, so several WRITEs and a tail.
    let data = pattern(3 * 1024 * 1024 + 4321, 0);
    let src = tmp.path().join("src.bin");
    std::fs::write(&src, &data).unwrap();
    let cp = ns.nfs("nfs-cp", &[src.to_str().unwrap(), &url("/d/copy.bin")]);
    assert!(cp.status.success(), "nfs-cp to the export: {cp:?}");
    assert!(
        std::fs::read(m.p("d/copy.bin")).unwrap() == data,
        "the mount does not hold what was written through NFS"
    );

    // ganesha lists e: it now holds handles of e and f.txt, and no open
    // file of either. Then the kernel forgets both inodes.
    let ls = ns.nfs("nfs-ls", &[&url("/e")]);
    assert!(
        ls.status.success() && String::from_utf8_lossy(&ls.stdout).contains(" f.txt"),
        "nfs-ls of e: {ls:?}"
    );
    // Reading f.txt opens it by the handle ganesha holds: memfs is asked
    // for "." in an inode the kernel no longer has. drop_caches frees what
    // it can at that moment, and an inode used just now can outlive a pass
    // (seen under load): until memfs has been asked, drop and read again.
    poll_until("f.txt to be reopened by its handle", || {
        drop_caches();
        let cat = ns.nfs("nfs-cat", &[&url("/e/f.txt")]);
        assert!(cat.status.success(), "nfs-cat after drop_caches: {cat:?}");
        assert_eq!(cat.stdout, b"listed, then read by handle\n");
        handle_lookups(&log).contains(&(".".into(), f_ino))
    });
    // Creating a file in e opens the directory by handle: "." in it, and
    // ".." to reconnect it to the root. The drop above let e go too (only
    // f.txt was read since); if it did not, drop again and create another.
    let more = pattern(200_000, 7);
    let src2 = tmp.path().join("src2.bin");
    std::fs::write(&src2, &more).unwrap();
    let mut tries = 0;
    poll_until("e to be reopened by its handle", || {
        tries += 1;
        let name = format!("/e/new-{tries}.bin");
        let cp = ns.nfs("nfs-cp", &[src2.to_str().unwrap(), &url(&name)]);
        assert!(
            cp.status.success(),
            "nfs-cp into e after drop_caches: {cp:?}"
        );
        assert!(
            std::fs::read(m.p(&name[1..])).unwrap() == more,
            "the mount does not hold what was written into e through NFS"
        );
        let lookups = handle_lookups(&log);
        let done = [".", ".."]
            .iter()
            .all(|n| lookups.contains(&((*n).into(), e_ino)));
        if !done {
            drop_caches();
        }
        done
    });

    // A fresh NFS server and a kernel that forgot the inodes again: the
    // file written before is read back whole. (libnfs's tools look every
    // name up again, so this checks the restart, not handle decoding.)
    g.stop();
    drop_caches();
    let mut g = ns.start_ganesha(tmp.path(), &conf);
    ns.await_export(&mut g, &url("/"));
    let back = tmp.path().join("back.bin");
    let cp = ns.nfs("nfs-cp", &[&url("/d/copy.bin"), back.to_str().unwrap()]);
    assert!(cp.status.success(), "nfs-cp from the export: {cp:?}");
    assert!(
        std::fs::read(&back).unwrap() == data,
        "read back through NFS after a server restart and dropped caches differs"
    );
    let ls = ns.nfs("nfs-ls", &[&url("/d")]);
    let listing = String::from_utf8_lossy(&ls.stdout);
    assert!(
        listing
            .lines()
            .any(|l| l.ends_with(" copy.bin") && l.contains(&data.len().to_string())),
        "{listing}"
    );
    // Stopped in this order on every path (drops run in reverse): ganesha,
    // rpcbind and with it the namespaces, the mount, the temporary files.
}
