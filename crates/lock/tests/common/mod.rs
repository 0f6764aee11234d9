//! Shared helpers: test directories, and child processes made by re-running
//! this test binary with a role in the environment (see `child_entry`).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use memfs_lock::{Algorithm, Deadline, Entity, Error, SharedFsMutex};

pub const ROLE: &str = "MEMFS_LOCK_CHILD";

/// Directories to run cross-process tests in: tmpfs, the disk file system,
/// and anything in MEMFS_LOCK_TEST_DIRS (colon-separated).
pub fn test_dirs() -> Vec<tempfile::TempDir> {
    let mut roots = vec![PathBuf::from("/dev/shm"), PathBuf::from("/var/tmp")];
    if let Some(extra) = std::env::var_os("MEMFS_LOCK_TEST_DIRS") {
        roots.extend(std::env::split_paths(&extra).filter(|p| !p.as_os_str().is_empty()));
    }
    roots
        .into_iter()
        .map(|r| {
            tempfile::Builder::new()
                .prefix("memfs-lock-test-")
                .tempdir_in(&r)
                .unwrap_or_else(|e| panic!("cannot make a test dir in {}: {e}", r.display()))
        })
        .collect()
}

pub fn lock_path(alg: Algorithm, dir: &Path) -> PathBuf {
    // One path per algorithm: tests may run several in one directory.
    match alg {
        Algorithm::LockFiles => dir.join("lock_files.d"),
        _ => dir.join(format!("{}.lock", alg.name())),
    }
}

/// "x5,s7" -> exclusive 5, shared 7.
pub fn parse_ents(s: &str) -> Vec<Entity> {
    s.split(',')
        .filter(|t| !t.is_empty())
        .map(|t| {
            let (x, v) = t.split_at(1);
            Entity::new(v.parse().unwrap(), x == "x")
        })
        .collect()
}

pub fn x(v: u64) -> Entity {
    Entity::new(v, true)
}
pub fn s(v: u64) -> Entity {
    Entity::new(v, false)
}

/// A child process that is killed and reaped whatever happens to the test.
pub struct Proc {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    pub stdout: BufReader<ChildStdout>,
}

impl Proc {
    pub fn spawn(
        role: &str,
        alg: Algorithm,
        path: &Path,
        ents: &str,
        extra: &[(&str, String)],
    ) -> Proc {
        Self::spawn_via(&[], role, alg, path, ents, extra)
    }

    /// As `spawn`, run through `prefix` (e.g. `unshare --pid --fork ...`).
    pub fn spawn_via(
        prefix: &[&str],
        role: &str,
        alg: Algorithm,
        path: &Path,
        ents: &str,
        extra: &[(&str, String)],
    ) -> Proc {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = match prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        cmd.args(["child_entry", "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE, role)
            .env("MEMFS_LOCK_ALG", alg.name())
            .env("MEMFS_LOCK_PATH", path)
            .env("MEMFS_LOCK_ENTS", ents)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn child");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Proc {
            child,
            stdin,
            stdout,
        }
    }

    /// Blocks until the child prints `ready` (it holds its locks then).
    pub fn wait_ready(&mut self) {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).unwrap();
            assert!(n > 0, "child exited before becoming ready");
            if line.contains("MEMFS-LOCK-READY") {
                return;
            }
        }
    }

    /// Closes stdin (the child's signal to release and leave) and returns
    /// its exit code.
    pub fn finish(&mut self) -> i32 {
        self.stdin.take();
        let st = self.child.wait().unwrap();
        st.code().unwrap_or(-1)
    }

    pub fn sigkill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGKILLs the child and leaves it unreaped (a zombie) until `reap` or
    /// drop; returns once /proc shows it as a zombie (bounded poll).
    pub fn kill_leave_zombie(&mut self) {
        let pid = self.child.id();
        // SAFETY: kill takes a pid and a signal number only; the child is
        // ours and not reaped, so the pid cannot have been reused.
        assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) }, 0);
        let until = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = st
                .rfind(')')
                .and_then(|i| st[i + 1..].split_whitespace().next());
            if state == Some("Z") {
                return;
            }
            assert!(
                std::time::Instant::now() < until,
                "child {pid} never became a zombie"
            );
            std::thread::yield_now();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The counter file: [writer inside: u64][count: u64][readers inside: u64].
pub struct Counter(std::fs::File);

impl Counter {
    pub fn create(path: &Path) -> Counter {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .unwrap();
        Counter(f)
    }
    fn get(&self, i: u64) -> u64 {
        let mut b = [0u8; 8];
        match self.0.read_at(&mut b, i * 8) {
            Ok(8) => u64::from_le_bytes(b),
            _ => 0,
        }
    }
    fn set(&self, i: u64, v: u64) {
        self.0.write_all_at(&v.to_le_bytes(), i * 8).unwrap();
    }
    pub fn count(&self) -> u64 {
        self.get(1)
    }
    /// Under an exclusive lock: nobody else may be inside. Returns false on a
    /// violation.
    pub fn write_step(&self) -> bool {
        if self.get(0) != 0 || self.get(2) != 0 {
            return false;
        }
        self.set(0, 1);
        let c = self.get(1);
        std::thread::yield_now();
        self.set(1, c + 1);
        let ok = self.get(0) == 1;
        self.set(0, 0);
        ok
    }
    /// Under a shared lock: no writer may be inside.
    pub fn read_step(&self) -> bool {
        self.get(0) == 0
    }
}

/// Runs `f` on a helper thread and fails the test if it has not returned
/// within `limit` (so a lock call that hangs fails instead of hanging CI).
pub fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("call did not return within {limit:?}"))
}

/// The body of a child process; returns its exit code.
pub fn child_main(role: &str) -> i32 {
    // Die with the test that spawned us, even if it is killed itself.
    // SAFETY: prctl with PR_SET_PDEATHSIG takes a signal number only.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let alg: Algorithm = std::env::var("MEMFS_LOCK_ALG").unwrap().parse().unwrap();
    let path = PathBuf::from(std::env::var_os("MEMFS_LOCK_PATH").unwrap());
    let ents = parse_ents(&std::env::var("MEMFS_LOCK_ENTS").unwrap());
    let var = |k: &str| std::env::var(k).ok();
    let opts = memfs_lock::Options {
        lock_files_without_links: var("MEMFS_LOCK_DIRECT").is_some(),
        ..Default::default()
    };
    let m = match SharedFsMutex::open_with(alg, &path, &opts) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("child: open failed: {e}");
            return 10;
        }
    };
    let out = std::io::stdout();
    match role {
        "hold" => {
            let g = m
                .lock(&ents, Deadline::After(Duration::from_secs(60)))
                .expect("child lock");
            writeln!(out.lock(), "\nMEMFS-LOCK-READY").unwrap();
            out.lock().flush().unwrap();
            // Hold until the parent closes stdin.
            let mut sink = String::new();
            let _ = std::io::stdin().read_line(&mut sink);
            drop(g);
            0
        }
        // Lock with a deadline of MEMFS_LOCK_WAIT_MS: 0 got it, 4 timed out.
        "lock" => {
            let ms: u64 = var("MEMFS_LOCK_WAIT_MS").unwrap().parse().unwrap();
            match m.lock(&ents, Deadline::After(Duration::from_millis(ms))) {
                Ok(_) => 0,
                Err(Error::TimedOut) => 4,
                Err(e) => {
                    eprintln!("child: lock: {e}");
                    1
                }
            }
        }
        "try" => match m.try_lock(&ents) {
            Ok(_) => 0,
            Err(Error::WouldBlock) => 2,
            Err(e) => {
                eprintln!("child: try_lock: {e}");
                1
            }
        },
        "count" => {
            let iters: u64 = var("MEMFS_LOCK_ITERS").unwrap().parse().unwrap();
            let counter = Counter::create(Path::new(&var("MEMFS_LOCK_COUNTER").unwrap()));
            let writer = ents.iter().any(|e| e.exclusive());
            let mut order = ents.clone();
            for i in 0..iters {
                if var("MEMFS_LOCK_REVERSE").is_some() && i % 2 == 1 {
                    order.reverse();
                }
                // A deadlock would show up as a timeout here, not a hang.
                let g = match m.lock(&order, Deadline::After(Duration::from_secs(60))) {
                    Ok(g) => g,
                    Err(e) => {
                        eprintln!("child: lock: {e}");
                        return 1;
                    }
                };
                let ok = if writer {
                    counter.write_step()
                } else {
                    counter.read_step()
                };
                drop(g);
                if !ok {
                    eprintln!("child: mutual exclusion violated at iteration {i}");
                    return 3;
                }
            }
            0
        }
        other => panic!("unknown role {other}"),
    }
}
