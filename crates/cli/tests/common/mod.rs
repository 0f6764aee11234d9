//! A real memfs mount for integration tests: a `memfs mount --foreground`
//! child process, unmounted and reaped in every path (Drop runs on panics too).

#![allow(dead_code)]

pub mod pjdfstest;

use std::fs;
use std::os::unix::fs::MetadataExt;
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

pub fn is_mount_point(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = path.to_string_lossy();
    info.lines().any(|l| l.split(' ').nth(4) == Some(&*want))
}

/// Whether this machine can mount FUSE file systems at all.
pub fn fuse_available() -> bool {
    Path::new("/dev/fuse").exists()
}

/// Extra arguments for every test mount, from `MEMFS_TEST_MOUNT_ARGS`
/// (whitespace-separated): `scripts/test` reruns the mounted suites with
/// `--io-uring`.
pub fn extra_mount_args() -> Vec<String> {
    std::env::var("MEMFS_TEST_MOUNT_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// How many of the server's threads serve an io_uring (named `fuser-uring-N`).
pub fn uring_threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .filter(|c| c.starts_with("fuser-uring-"))
                .count()
        })
        .unwrap_or(0)
}

impl Mount {
    pub fn new() -> Mount {
        Mount::with_args(&[])
    }

    pub fn with_args(args: &[&str]) -> Mount {
        Mount::spawn(args, Stdio::inherit())
    }

    /// Like [`Mount::with_args`], with the server's standard error sent to
    /// `stderr` (e.g. a log file: a foreground server reports recovery there).
    pub fn spawn(args: &[&str], stderr: Stdio) -> Mount {
        Mount::spawn_env(args, stderr, &[])
    }

    /// Like [`Mount::spawn_env`], with the server's standard error appended
    /// to the file `log` (created if need be), so that one log spans a
    /// test's restarts.
    pub fn spawn_logged(args: &[&str], log: &Path, env: &[(&str, &str)]) -> Mount {
        let err = std::fs::File::options()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("open {}: {e}", log.display()));
        Mount::spawn_env(args, Stdio::from(err), env)
    }

    /// Like [`Mount::spawn`], with `env` added to the server's environment
    /// (e.g. `MEMFS_LOG` for debug messages that a test looks for).
    pub fn spawn_env(args: &[&str], stderr: Stdio, env: &[(&str, &str)]) -> Mount {
        Mount::spawn_in(None, args, stderr, env)
    }

    /// Like [`Mount::with_args`], with the server in the network namespace
    /// `netns` (a file such as /run/netns/NAME), entered by `nsenter` before
    /// it runs: the mount itself is in this process's mount namespace, so
    /// the test sees and unmounts it as any other.
    pub fn in_net_namespace(netns: &Path, args: &[&str]) -> Mount {
        Mount::spawn_in(Some(netns), args, Stdio::inherit(), &[])
    }

    fn spawn_in(netns: Option<&Path>, args: &[&str], stderr: Stdio, env: &[(&str, &str)]) -> Mount {
        assert!(
            fuse_available(),
            "/dev/fuse is missing: these tests need FUSE"
        );
        let dir = tempfile::Builder::new()
            .prefix("memfs-test-")
            .tempdir()
            .expect("tempdir");
        let path = dir.path().canonicalize().expect("canonical tempdir");
        let extra: Vec<String> = extra_mount_args()
            .into_iter()
            .filter(|a| !args.contains(&a.as_str()))
            .collect();
        // nsenter execs memfs in place: the child is the server itself.
        let mut cmd = match netns {
            None => Command::new(memfs_bin()),
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net={}", ns.display())).arg(memfs_bin());
                c
            }
        };
        let child = cmd
            .arg("mount")
            .arg(&path)
            .arg("--foreground")
            .args(args)
            .args(&extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start memfs");
        let mut m = Mount {
            dir,
            child: Some(child),
        };
        poll_until("memfs to mount", || {
            if let Some(status) = m.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("memfs exited before mounting: {status}");
            }
            is_mount_point(&path)
        });
        // The mount shows in mountinfo as soon as mount(2) returns, before
        // the server has answered INIT; what INIT settles (FUSE_ALLOW_IDMAP,
        // for one) is not in force yet, and mount_setattr, which sends no
        // request, would see the superblock as it was before (CI saw EINVAL
        // that way). A GETATTR of the root waits for the handshake: the
        // kernel holds every request until INIT is answered.
        std::fs::metadata(&path).expect("stat the new mount's root");
        // `--locks engine` serves /dev/fuse by design (a blocked lock
        // request would hold a ring entry): the rings start without it.
        let engine_locks = args.windows(2).any(|w| w == ["--locks", "engine"]);
        if extra_mount_args().iter().any(|a| a == "--io-uring") && !engine_locks {
            // The run is only worth its time if the rings really serve: a
            // silent fallback to /dev/fuse must fail it.
            let pid = m.pid();
            poll_until("the io_uring threads", || uring_threads(pid) > 0);
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

    /// Crashes the server: SIGKILL, reaps it, then detaches the dead mount
    /// (its requests fail with ENOTCONN until then). The data directory's lock
    /// is an flock, released by the kernel when the process dies.
    pub fn kill(&mut self) {
        self.kill_server();
        self.detach();
    }

    /// SIGKILLs and reaps the server but leaves the dead mount attached:
    /// every system call under it fails (ENOTCONN) until [`Mount::detach`].
    /// Processes still working under the mount point must stop before the
    /// detach, or their next calls land in the directory underneath.
    ///
    /// A server that has not exited 60 s after the SIGKILL has a thread
    /// stuck in the kernel: see [`Mount::kill_server_within`].
    pub fn kill_server(&mut self) {
        self.kill_server_within(Duration::from_secs(60));
    }

    /// SIGKILLs the server and polls up to `limit` for it to exit, then
    /// reaps it. One that has not exited by then has a thread stuck in the
    /// kernel: its connection is aborted (so that it exits and the test
    /// leaves nothing behind) and the test fails saying so, rather than
    /// waiting until CI's limit.
    pub fn kill_server_within(&mut self, limit: Duration) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        c.kill().expect("SIGKILL the memfs server");
        let deadline = Instant::now() + limit;
        while c.try_wait().expect("poll the memfs server").is_none() {
            if Instant::now() > deadline {
                self.abort_connection();
                let _ = c.wait();
                panic!(
                    "the memfs server had not exited {limit:?} after SIGKILL: a thread of it \
                     was stuck in the kernel (its FUSE connection was aborted to clean up)"
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Detaches the (dead) mount.
    pub fn detach(&mut self) {
        let path = self.dir.path().to_path_buf();
        if is_mount_point(&path) {
            nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH)
                .expect("detach the dead mount");
        }
        assert!(!is_mount_point(&path), "the dead mount is still attached");
    }

    /// The FUSE connection's number (the minor of the mount's device), read
    /// from mountinfo: no request to the server, which may be stuck.
    pub fn connection(&self) -> Option<u32> {
        fuse_connection(self.dir.path())
    }

    /// Aborts the FUSE connection (fusectl, mounted if needed; root only)
    /// so that every request in flight fails with ENOTCONN, then kills the
    /// server and detaches the mount. For a deadlock in the kernel: a killed
    /// server whose threads wait for page locks cannot exit, and its
    /// /dev/fuse is only closed when it does.
    pub fn abort(&mut self) {
        self.abort_connection();
        self.kill();
    }

    /// Aborts the FUSE connection only (fusectl, mounted if needed).
    fn abort_connection(&self) {
        abort_fuse_connection(self.dir.path());
    }

    /// Unmounts and checks that the server exits by itself, cleanly.
    pub fn unmount(mut self) {
        let path = self.path();
        let out = Command::new(memfs_bin())
            .arg("umount")
            .arg(&path)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "memfs umount {} failed ({}): {}",
            path.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
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

/// Polls `done` until it holds, failing with `what` after 20 s. For effects the
/// kernel delivers asynchronously (FUSE RELEASE after close, FORGET after unlink):
/// the test waits exactly as long as it has to and never longer.
/// Has the kernel drop its clean caches (pages, dentries, inodes), after
/// writing back what is dirty. Best effort: what is in use, or was used a
/// moment ago, can survive a pass, so tests that need an inode gone poll.
pub fn drop_caches() {
    nix::unistd::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
}

pub fn poll_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
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

/// A data directory on the disk (not tmpfs), removed at the end.
pub fn disk_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/var/tmp")
        .expect("data directory under /var/tmp")
}

/// Runs the memfs binary with `args` (no standard input) to completion.
pub fn memfs<I, S>(args: I) -> std::process::Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    Command::new(memfs_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run memfs")
}

/// The standard output of a memfs run that must have succeeded.
pub fn ok(o: std::process::Output) -> String {
    assert!(
        o.status.success(),
        "memfs failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// The standard error of a memfs run that must have failed.
pub fn failed(o: std::process::Output) -> String {
    assert!(!o.status.success(), "memfs should have failed");
    String::from_utf8(o.stderr).unwrap()
}

/// Whether this run's mounts use kernel passthrough, which refuses
/// snapshots (its writes bypass the engine: docs/snapshots.md).
pub fn passthrough_mounts() -> bool {
    extra_mount_args().iter().any(|a| a.contains("passthrough"))
}

/// Takes snapshots of a mount through `memfs snapshot create`, one after
/// the other, until dropped, deleting all but the newest two as it goes, so
/// that creation, preservation on first write and deletion all happen while
/// a workload runs. Stopped and joined on drop, also when a test panics.
pub struct Snapshotter {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Taken>>,
}

/// How many snapshots were taken and the names kept, or the command that failed.
type Taken = Result<(u64, Vec<String>), String>;

impl Snapshotter {
    pub fn start(mount: &Path) -> Snapshotter {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mount = mount.to_str().expect("UTF-8 mount path").to_string();
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut kept: Vec<String> = Vec::new();
            let mut made = 0u64;
            // At least one snapshot, whatever the workload's speed.
            loop {
                let name = format!("during-{made}");
                let out = memfs(["snapshot", "create", &name, "--mount", &mount]);
                if !out.status.success() {
                    return Err(format!(
                        "snapshot create {name}: {}",
                        String::from_utf8_lossy(&out.stderr)
                    ));
                }
                made += 1;
                kept.push(name);
                if kept.len() > 2 {
                    let old = kept.remove(0);
                    let out = memfs(["snapshot", "delete", &old, "--mount", &mount]);
                    if !out.status.success() {
                        return Err(format!(
                            "snapshot delete {old}: {}",
                            String::from_utf8_lossy(&out.stderr)
                        ));
                    }
                }
                if flag.load(Ordering::Acquire) {
                    return Ok((made, kept));
                }
            }
        });
        Snapshotter {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops taking snapshots; returns how many were taken and the names
    /// of those still kept (the newest last). Panics with the first command
    /// that failed.
    pub fn finish(mut self) -> (u64, Vec<String>) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        let r = self.thread.take().unwrap().join().expect("snapshot thread");
        r.unwrap_or_else(|e| panic!("{e}"))
    }
}

impl Drop for Snapshotter {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sets xattr `name` of `p` to `v`, or panics.
pub fn xattr_set(p: &Path, name: &str, v: &[u8]) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: valid NUL-terminated strings and a buffer of v.len() bytes.
    let r = unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
    assert_eq!(
        r,
        0,
        "setxattr {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

/// The value of xattr `name` of `p` (at most 256 bytes).
pub fn xattr_get(p: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 256];
    // SAFETY: valid NUL-terminated strings and a buffer of buf.len() bytes.
    let r = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(r as usize);
    Ok(buf)
}

/// Everything a snapshot or a clone must keep of a tree, path by path
/// (sorted): kind, permissions, owner, link count, size, modification time,
/// contents or link target, and the `user.color` xattr. Not the inode
/// numbers (a snapshot's are its own) nor access times.
pub fn tree_dump(root: &Path) -> Vec<String> {
    fn walk(root: &Path, rel: &Path, out: &mut Vec<String>) {
        let p = root.join(rel);
        let md = fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let mut line = format!(
            "{} mode {:o} uid {} nlink {} size {} mtime {}.{:09}",
            rel.display(),
            md.mode(),
            md.uid(),
            md.nlink(),
            md.size(),
            md.mtime(),
            md.mtime_nsec()
        );
        if md.file_type().is_symlink() {
            line += &format!(" -> {}", fs::read_link(&p).unwrap().display());
        } else if md.is_file() {
            let data = fs::read(&p).unwrap();
            let sum = data.iter().fold(0u64, |h, &b| {
                h.wrapping_mul(1_099_511_628_211) ^ u64::from(b)
            });
            line += &format!(" data {sum:016x}");
            if let Ok(v) = xattr_get(&p, "user.color") {
                line += &format!(" user.color={}", String::from_utf8_lossy(&v));
            }
        }
        out.push(line);
        if md.is_dir() {
            let mut names: Vec<_> = fs::read_dir(&p)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            names.sort();
            for n in names {
                walk(root, &rel.join(n), out);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, Path::new(""), &mut out);
    out
}

/// A `struct flock` for `fcntl` over `[start, start + len)` (`len` 0: to the
/// end of the file), offsets from the file's start.
#[allow(dead_code)]
pub fn range_lock(typ: i32, start: i64, len: i64) -> libc::flock {
    libc::flock {
        l_type: typ as i16,
        l_whence: libc::SEEK_SET as i16,
        l_start: start,
        l_len: len,
        l_pid: 0,
    }
}

/// `path` opened for reading and writing, which must succeed.
#[allow(dead_code)]
pub fn open_rw(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

/// Waits until thread `tid` of this process sits in `fcntl` (x86-64
/// syscall 72), e.g. blocked in `F_SETLKW`. Other architectures: not
/// waited for; callers check an outcome that is the same either way, the
/// wait only makes it likely that the request is parked in the server.
#[allow(dead_code)]
pub fn await_in_fcntl(tid: i32) {
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    poll_until("a lock waiter to block in fcntl", || {
        std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall"))
            .is_ok_and(|s| s.split(' ').next() == Some("72"))
    });
}

/// Names a hang instead of letting it stall CI: every call a test wants
/// bounded runs between [`Watchdog::begin`] and [`Watchdog::end`] (or
/// through [`Watchdog::call`]), and a call that has run longer than the
/// bound aborts the mount's FUSE connection through fusectl. Every request
/// in flight then fails with ENOTCONN, so whatever waited on the mount
/// (the test's own threads, its child processes, the kernel) returns, and
/// the test fails with the name of the call that hung ([`Watchdog::check`]).
/// The server is SIGKILLed after the abort: a thread of it that spins or
/// waits in user space (the hang itself, often) would keep it alive, and
/// with it every call that waits for its answer on the control socket.
/// The thread waits on a condition variable with the nearest deadline as
/// its timeout: it wakes when a call begins or ends, or when one is due.
pub struct Watchdog {
    shared: std::sync::Arc<WatchShared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct WatchShared {
    state: std::sync::Mutex<WatchState>,
    cv: std::sync::Condvar,
    bound: Duration,
    mount_dir: PathBuf,
    server: u32,
}

#[derive(Default)]
struct WatchState {
    calls: std::collections::HashMap<String, (String, Instant)>,
    fired: Option<String>,
    stop: bool,
}

impl Watchdog {
    /// Watches calls on `m`, each of which must end within `bound`.
    pub fn new(m: &Mount, bound: Duration) -> Watchdog {
        let shared = std::sync::Arc::new(WatchShared {
            state: std::sync::Mutex::new(WatchState::default()),
            cv: std::sync::Condvar::new(),
            bound,
            mount_dir: m.dir.path().to_path_buf(),
            server: m.pid(),
        });
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("watchdog".into())
            .spawn(move || watch(&sh))
            .expect("start the watchdog thread");
        Watchdog {
            shared,
            thread: Some(thread),
        }
    }

    /// `who` (one caller: a thread, a child process) starts `what`.
    pub fn begin(&self, who: &str, what: &str) {
        let mut st = self.shared.state.lock().unwrap();
        st.calls
            .insert(who.to_string(), (what.to_string(), Instant::now()));
        self.shared.cv.notify_all();
    }

    /// `who`'s call ended.
    pub fn end(&self, who: &str) {
        let mut st = self.shared.state.lock().unwrap();
        st.calls.remove(who);
        self.shared.cv.notify_all();
    }

    /// Runs `f` as `who`'s call `what`.
    /// A call that fails because the watchdog aborted the mount under it
    /// fails the test with the hang's name, not with its own error.
    pub fn call<T>(&self, who: &str, what: &str, f: impl FnOnce() -> T) -> T {
        self.begin(who, what);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        self.end(who);
        match r {
            Ok(v) => v,
            Err(p) => {
                self.check();
                std::panic::resume_unwind(p)
            }
        }
    }

    /// The hang that fired, if any: `who: what` and how long it had run.
    pub fn fired(&self) -> Option<String> {
        self.shared.state.lock().unwrap().fired.clone()
    }

    /// Fails the test if a call hung.
    pub fn check(&self) {
        if let Some(h) = self.fired() {
            panic!("hang: {h}");
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.state.lock().unwrap().stop = true;
        self.shared.cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn watch(sh: &WatchShared) {
    let mut st = sh.state.lock().unwrap();
    loop {
        if st.stop || st.fired.is_some() {
            return;
        }
        let now = Instant::now();
        let late = st
            .calls
            .iter()
            .filter(|(_, (_, t0))| now.duration_since(*t0) >= sh.bound)
            .map(|(who, (what, t0))| format!("{who}: {what} ran for {:?}", now.duration_since(*t0)))
            .next();
        if let Some(h) = late {
            eprintln!(
                "watchdog: {h}: aborting the FUSE connection of {} and killing its server",
                sh.mount_dir.display()
            );
            report_threads(sh.server);
            report_blocked_tasks();
            st.fired = Some(h);
            drop(st);
            abort_fuse_connection(&sh.mount_dir);
            if sh.server != 0 {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(sh.server as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            return;
        }
        let next = st
            .calls
            .values()
            .map(|(_, t0)| (*t0 + sh.bound).saturating_duration_since(now))
            .min()
            .unwrap_or(Duration::from_secs(3600));
        st = sh.cv.wait_timeout(st, next).unwrap().0;
    }
}

/// Each thread of process `pid`: name, state and where it waits in the
/// kernel (a thread that spins shows as R).
pub fn report_threads(pid: u32) {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    for t in tasks.flatten() {
        let comm = fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let stat = fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        let state = stat.rsplit(") ").next().and_then(|r| r.split(' ').next());
        let wchan = fs::read_to_string(t.path().join("wchan")).unwrap_or_default();
        eprintln!(
            "  server thread {} {}: {} {}",
            t.file_name().to_string_lossy(),
            comm.trim(),
            state.unwrap_or("?"),
            wchan
        );
    }
}

/// What a hang looks like from outside: every task in state D with its
/// kernel stack, so that the failure says where it was stuck.
pub fn report_blocked_tasks() {
    let Ok(procs) = fs::read_dir("/proc") else {
        return;
    };
    for p in procs.flatten() {
        let Ok(tasks) = fs::read_dir(p.path().join("task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let status = fs::read_to_string(t.path().join("status")).unwrap_or_default();
            if !status
                .lines()
                .any(|l| l.starts_with("State:") && l.contains("D ("))
            {
                continue;
            }
            let comm = fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            let stack = fs::read_to_string(t.path().join("stack")).unwrap_or_default();
            eprintln!(
                "  blocked: {} task {} ({}):\n{}",
                p.file_name().to_string_lossy(),
                t.file_name().to_string_lossy(),
                comm.trim(),
                stack.lines().take(12).collect::<Vec<_>>().join("\n")
            );
        }
    }
}

/// The FUSE connection number of the mount at `dir` (the minor of its
/// device), read from mountinfo: no request to the server, which may hang.
pub fn fuse_connection(dir: &Path) -> Option<u32> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = dir.to_string_lossy().into_owned();
    let line = info.lines().find(|l| l.split(' ').nth(4) == Some(&*want))?;
    line.split(' ').nth(2)?.split(':').nth(1)?.parse().ok()
}

/// Aborts the FUSE connection of the mount at `dir` (fusectl, mounted if
/// needed; root only): every request in flight fails with ENOTCONN.
pub fn abort_fuse_connection(dir: &Path) {
    let ctl = Path::new("/sys/fs/fuse/connections");
    if let Some(conn) = fuse_connection(dir) {
        if std::fs::read_dir(ctl).is_ok_and(|mut d| d.next().is_none()) {
            let _ = nix::mount::mount(
                Some("fusectl"),
                ctl,
                Some("fusectl"),
                nix::mount::MsFlags::empty(),
                None::<&str>,
            );
        }
        let _ = std::fs::write(ctl.join(conn.to_string()).join("abort"), "1");
    }
}

/// Options of a data directory a test builds in process: every change
/// synced, no checkpoint by time or size, every snapshot kept.
pub fn sync_options() -> memfs_durable::Options {
    memfs_durable::Options {
        durability: memfs_durable::parse_durability("sync").unwrap(),
        checkpoint_interval: None,
        checkpoint_bytes: u64::MAX,
        retention: "all".parse().unwrap(),
        segment_size: 1 << 20,
    }
}

/// A local Redis Cluster of 3 masters and no replicas, for tests that fail
/// nothing over (it then starts in seconds). It is stopped when the value
/// is dropped, so when the test ends, passes or panics. Panics when no
/// cluster can be started (redis-server and redis-cli are missing).
pub fn cluster_without_replicas() -> memfs_cluster::local::LocalCluster {
    memfs_cluster::local::LocalCluster::start(memfs_cluster::local::Options {
        replicas: 0,
        ..memfs_cluster::local::Options::default()
    })
    .unwrap_or_else(|e| panic!("a local Redis Cluster (run scripts/setup): {e}"))
}
