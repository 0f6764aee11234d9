//! Time travel on a busy mount: writer processes create, truncate and
//! rewrite small files in a loop while the test rolls the mount back,
//! takes and deletes snapshots and mounts clones, on an in-memory mount
//! and on a durable one in each durability mode. Every call, the writers'
//! and the test's, runs under a [`Watchdog`]: one that takes longer than
//! [`BOUND`] aborts the mount's FUSE connection and fails the test naming
//! it, so a hang is a failure with a name and never a stuck CI. Afterwards
//! the tree must be exactly the snapshot rolled back to plus the writes
//! made since (and, for a durable mount, the same after a remount).
//!
//! The writers are this test binary run again (`writer_process`, ignored
//! in normal runs), so that they are separate processes as a user's would
//! be: each reports `b` before and `e` after every open-write-close on its
//! standard output, which the test feeds to the watchdog.

mod common;

use common::{Mount, Watchdog, disk_dir, memfs, tree_dump};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest any one call may take: everything here takes milliseconds on an
/// idle machine, so 10 s only ever fires on a hang, never on a slow run.
const BOUND: Duration = Duration::from_secs(10);

/// Writer processes beside the control loop.
const WRITERS: usize = 3;

/// Files each writer cycles through.
const FILES: usize = 8;

/// How long the load runs per mount (`MEMFS_STRESS_SECS`, default 6).
fn load_time() -> Duration {
    let s = std::env::var("MEMFS_STRESS_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    Duration::from_secs(s)
}

/// Errors a writer may see from a rollback that replaced the file or
/// directory it was working on: the kernel's handle names a node the new
/// tree does not have.
fn expected_error(errno: i32) -> bool {
    errno == libc::ENOENT || errno == libc::ESTALE
}

/// The writer's body, when this binary runs as a writer process
/// (`MEMFS_STRESS_WRITER=DIR|STOPFILE`): open(O_WRONLY|O_CREAT|O_TRUNC), a
/// 100-byte write and close, over and over, until STOPFILE exists. Exits 1
/// on an error other than [`expected_error`].
#[test]
#[ignore = "a writer process of the busy-mount tests, not a test itself"]
fn writer_process() {
    let Ok(spec) = std::env::var("MEMFS_STRESS_WRITER") else {
        return;
    };
    let (dir, stop) = spec.split_once('|').expect("DIR|STOPFILE");
    let (dir, stop) = (PathBuf::from(dir), PathBuf::from(stop));
    let out = std::io::stdout();
    let mut out = out.lock();
    let data = [b'x'; 100];
    let (mut done, mut expected) = (0u64, 0u64);
    let mut i = 0usize;
    while !stop.exists() {
        let path = dir.join(format!("f{}", i % FILES));
        i += 1;
        writeln!(out, "b {}", path.display()).unwrap();
        out.flush().unwrap();
        let r = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .and_then(|mut f| f.write_all(&data));
        writeln!(out, "e").unwrap();
        out.flush().unwrap();
        match r {
            Ok(()) => done += 1,
            Err(e) if e.raw_os_error().is_some_and(expected_error) => expected += 1,
            Err(e) => {
                writeln!(out, "error {}: {e}", path.display()).unwrap();
                std::process::exit(1);
            }
        }
    }
    writeln!(out, "done {done} {expected}").unwrap();
}

/// A writer process, killed and reaped on drop (a panicking test too).
struct Writer {
    name: String,
    child: Option<Child>,
    reader: Option<std::thread::JoinHandle<Vec<String>>>,
}

impl Writer {
    fn start(name: String, dir: &Path, stop: &Path, wd: &Arc<Watchdog>) -> Writer {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "writer_process", "--ignored", "--nocapture"])
            .args(["--test-threads", "1"])
            .env(
                "MEMFS_STRESS_WRITER",
                format!("{}|{}", dir.display(), stop.display()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a writer process");
        let out = child.stdout.take().unwrap();
        let (wd, who) = (wd.clone(), name.clone());
        // The pipe ends when the writer does: this thread needs no bound.
        let reader = std::thread::spawn(move || {
            let mut tail = Vec::new();
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if let Some(what) = line.strip_prefix("b ") {
                    wd.begin(&who, &format!("open, write and close {what}"));
                } else if line == "e" {
                    wd.end(&who);
                } else if line.starts_with("error ") || line.starts_with("done ") {
                    tail.push(line);
                }
            }
            wd.end(&who);
            tail
        });
        Writer {
            name,
            child: Some(child),
            reader: Some(reader),
        }
    }

    /// Waits for the writer to exit (it was told to stop) under the
    /// watchdog; returns its successful and its expected-failed calls.
    fn finish(mut self, wd: &Watchdog) -> (u64, u64) {
        let mut child = self.child.take().unwrap();
        let status = wd.call(&self.name, "exit", || child.wait().unwrap());
        let tail = self.reader.take().unwrap().join().unwrap();
        wd.check();
        assert!(status.success(), "{} failed: {tail:?}", self.name);
        let done = tail
            .iter()
            .find_map(|l| l.strip_prefix("done "))
            .unwrap_or_else(|| panic!("{} said {tail:?}", self.name));
        let mut n = done.split(' ').map(|v| v.parse::<u64>().unwrap());
        (n.next().unwrap(), n.next().unwrap())
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `memfs ARGS` as the control loop's call `what` under the watchdog;
/// the command must succeed.
fn control(wd: &Watchdog, what: &str, args: &[&str]) -> String {
    let o = wd.call("control", what, || memfs(args));
    wd.check();
    assert!(
        o.status.success(),
        "{what}: memfs {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// What the control loop did, for the failure messages and the log.
#[derive(Debug, Default)]
struct Rounds {
    rollbacks: u64,
    snapshots: u64,
    clones: u64,
}

/// The load: writers beside rollbacks, snapshot creates and deletes, and
/// clones, for [`load_time`]. Then the tree is checked against the
/// snapshot plus later writes.
fn busy(mount_args: &[&str], data_dir: Option<&Path>) {
    let mut args: Vec<String> = mount_args.iter().map(|s| s.to_string()).collect();
    if let Some(d) = data_dir {
        args.extend(["--data-dir".into(), d.display().to_string()]);
    }
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let m = Mount::with_args(&argv);
    let root = m.path();
    let mp = root.to_str().unwrap().to_string();
    for w in 0..WRITERS {
        let d = root.join(format!("w{w}"));
        std::fs::create_dir(&d).unwrap();
        for f in 0..FILES / 2 {
            std::fs::write(d.join(format!("f{f}")), format!("before {w} {f}")).unwrap();
        }
    }
    let wd = Arc::new(Watchdog::new(&m, BOUND));
    control(
        &wd,
        "snapshot create s0",
        &["snapshot", "create", "s0", "--mount", &mp],
    );
    let s0 = wd.call("control", "read the tree", || tree_dump(&root));

    let stop_dir = tempfile::tempdir().unwrap();
    let stop = stop_dir.path().join("stop");
    let writers: Vec<Writer> = (0..WRITERS)
        .map(|w| {
            Writer::start(
                format!("writer {w}"),
                &root.join(format!("w{w}")),
                &stop,
                &wd,
            )
        })
        .collect();
    let clone_dir = tempfile::tempdir().unwrap();
    let clone_at = clone_dir.path().join("c");
    std::fs::create_dir(&clone_at).unwrap();
    let clone_at = clone_at.to_str().unwrap().to_string();
    let mut r = Rounds::default();
    let t0 = Instant::now();
    while t0.elapsed() < load_time() {
        let n = r.rollbacks;
        control(
            &wd,
            &format!("rollback #{n} to s0"),
            &["rollback", "--mount", &mp, "--to", "s0", "--yes"],
        );
        r.rollbacks += 1;
        let t = format!("t{n}");
        control(
            &wd,
            &format!("snapshot create {t}"),
            &["snapshot", "create", &t, "--mount", &mp],
        );
        r.snapshots += 1;
        if n % 4 == 0 {
            control(
                &wd,
                &format!("clone {t}"),
                &["clone", &t, &clone_at, "--mount", &mp],
            );
            // The clone holds what the snapshot held: the writers' folders.
            let listed = wd.call("control", "list the clone", || {
                std::fs::read_dir(&clone_at).map(|d| d.count())
            });
            wd.check();
            assert!(
                listed.unwrap() >= WRITERS,
                "clone {t} lacks the writers' folders"
            );
            control(&wd, &format!("unmount clone {t}"), &["umount", &clone_at]);
            r.clones += 1;
        }
        control(
            &wd,
            &format!("snapshot delete {t}"),
            &["snapshot", "delete", &t, "--mount", &mp],
        );
    }
    std::fs::write(&stop, b"").unwrap();
    let mut written = 0;
    for w in writers {
        let (done, expected) = w.finish(&wd);
        assert!(done > 0, "a writer never completed a write");
        written += done + expected;
    }
    eprintln!(
        "{mount_args:?} durable={}: {r:?}, {written} writer calls",
        data_dir.is_some()
    );
    assert!(r.rollbacks > 0 && written > 0, "no load ran: {r:?}");

    // The state of the last rollback plus the writes made after it.
    control(
        &wd,
        "final rollback to s0",
        &["rollback", "--mount", &mp, "--to", "s0", "--yes"],
    );
    let now = wd.call("control", "read the tree", || tree_dump(&root));
    wd.check();
    assert_eq!(now, s0, "the tree after rolling back to s0");
    for w in 0..WRITERS {
        let p = root.join(format!("w{w}/later"));
        wd.call("control", "a write after the rollback", || {
            std::fs::write(&p, format!("after {w}"))
        })
        .unwrap();
    }
    let expect = wd.call("control", "read the tree", || tree_dump(&root));
    assert_eq!(expect.len(), s0.len() + WRITERS, "{expect:#?}");
    for w in 0..WRITERS {
        let got = std::fs::read_to_string(root.join(format!("w{w}/later"))).unwrap();
        assert_eq!(got, format!("after {w}"));
    }
    wd.check();
    // The server must exit by itself, promptly: a thread stuck settling a
    // commit would keep it alive after the unmount.
    wd.call("control", "unmount", || m.unmount());
    wd.check();
    if let Some(d) = data_dir {
        // What recovery rebuilds from the journal is that same tree.
        let mut again: Vec<&str> = mount_args.to_vec();
        let ds = d.display().to_string();
        again.extend(["--data-dir", &ds]);
        let m2 = Mount::with_args(&again);
        let wd = Watchdog::new(&m2, BOUND);
        let got = wd.call("control", "read the remounted tree", || {
            tree_dump(&m2.path())
        });
        assert_eq!(got, expect, "the tree after a remount");
        wd.call("control", "unmount the remount", || m2.unmount());
        wd.check();
    }
}

#[test]
fn in_memory_mount() {
    busy(&[], None);
}

#[test]
fn durable_sync() {
    let d = disk_dir("memfs-busy-sync-");
    busy(&[], Some(d.path()));
}

#[test]
fn durable_async() {
    let d = disk_dir("memfs-busy-async-");
    busy(&["--durability", "async"], Some(d.path()));
}

#[test]
fn durable_relaxed() {
    let d = disk_dir("memfs-busy-relaxed-");
    busy(&["--durability", "relaxed=64"], Some(d.path()));
}

#[test]
fn durable_none() {
    let d = disk_dir("memfs-busy-none-");
    busy(&["--durability", "none"], Some(d.path()));
}
