//! Follower equality with real processes (the release `memfs` binary): a
//! writer server and a follower; random blocks and rollbacks; the follower
//! and then the writer are SIGKILLed and restarted midway. At the end both
//! stores hold the same keys and values at the same block.
//!
//! Needs `cargo build --release --bin memfs` (scripts/test builds it first);
//! `MEMFS_BIN` overrides the path.

mod net;

use memfs_store::Store;
use memfs_store::net::client::{Client, ClientConfig};
use memfs_store::net::protocol::Role;
use net::key;
use rand::{Rng, SeedableRng, rngs::StdRng};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

fn memfs_bin() -> PathBuf {
    let p = std::env::var_os("MEMFS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release/memfs")
        });
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --release --bin memfs` first (or set MEMFS_BIN)",
        p.display()
    );
    p
}

/// A child process killed and reaped on drop; its stdout lines on a channel.
struct Proc {
    child: Child,
    lines: Receiver<String>,
}

impl Proc {
    fn spawn(args: &[&str]) -> Proc {
        let mut child = Command::new(memfs_bin())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Proc { child, lines }
    }

    /// Waits (up to 60 s) for a stdout line satisfying `f`.
    fn wait_line(&self, what: &str, mut f: impl FnMut(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if f(&l) => return l,
                Ok(_) => {}
                Err(e) => panic!("no line {what}: {e}"),
            }
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        self.child.wait().unwrap()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn writer(dir: &Path, port: u16) -> Proc {
    let p = Proc::spawn(&[
        "store",
        "serve",
        "--dir",
        dir.to_str().unwrap(),
        "--listen",
        &format!("127.0.0.1:{port}"),
    ]);
    p.wait_line("serving", |l| l.starts_with("serving"));
    p
}

fn follower(addr: &str, dir: &Path) -> Proc {
    Proc::spawn(&["store", "follow", addr, "--dir", dir.to_str().unwrap()])
}

/// Runs `memfs ARGS` to completion.
fn run(args: &[&str]) -> std::process::Output {
    Command::new(memfs_bin()).args(args).output().unwrap()
}

/// `memfs store create --dir DIR`, which must succeed.
fn create(dir: &Path) {
    let o = run(&["store", "create", "--dir", dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// `memfs store follow ADDR` into `dir` (no durability) serving its replica
/// read-only; returns the process and the replica's address.
fn serving_follower(addr: &str, dir: &Path) -> (Proc, String) {
    let f = Proc::spawn(&[
        "store",
        "follow",
        addr,
        "--dir",
        dir.to_str().unwrap(),
        "--durability",
        "none",
        "--listen",
        "127.0.0.1:0",
    ]);
    let line = f.wait_line("serving the replica", |l| {
        l.starts_with("serving the replica read-only on ")
    });
    let raddr = line.rsplit(' ').next().unwrap().to_string();
    (f, raddr)
}

fn work(addr: &str, rng: &mut StdRng, steps: usize) -> u64 {
    let mut w = Client::connect(ClientConfig::new(addr, Role::Write)).unwrap();
    for _ in 0..steps {
        let st = w.status().unwrap();
        if rng.random_range(0..5) == 0 && st.current > st.oldest {
            w.rollback(rng.random_range(st.oldest..st.current)).unwrap();
        } else {
            let ops: Vec<([u8; 8], Vec<u8>)> = (0..rng.random_range(1..40))
                .map(|_| {
                    (
                        key(rng.random_range(0..200)),
                        vec![rng.random::<u8>(); rng.random_range(0..20)],
                    )
                })
                .collect();
            w.set(st.current + rng.random_range(1..3), &ops).unwrap();
        }
    }
    w.status().unwrap().last_seq
}

fn contents(dir: &Path) -> (u64, u64, BTreeMap<Vec<u8>, Vec<u8>>) {
    let s = Store::open(dir).unwrap();
    let mut m = BTreeMap::new();
    s.for_each(|k, v| {
        m.insert(k.to_vec(), v.to_vec());
    });
    let r = (s.current_block(), s.last_commit(), m);
    s.close().unwrap();
    r
}

#[test]
fn follower_equality_with_sigkill_of_follower_and_writer() {
    let tmp = tempfile::tempdir().unwrap();
    let wdir = tmp.path().join("writer");
    let fdir = tmp.path().join("replica");
    let st = Command::new(memfs_bin())
        .args([
            "store",
            "create",
            "--dir",
            wdir.to_str().unwrap(),
            "--key-width",
            "8",
            "--rollback-window",
            "10",
        ])
        .status()
        .unwrap();
    assert!(st.success());
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut rng = StdRng::seed_from_u64(42);
    let mut w = writer(&wdir, port);
    let mut f = follower(&addr, &fdir);
    work(&addr, &mut rng, 40);
    f.kill();
    work(&addr, &mut rng, 40);
    let f = follower(&addr, &fdir);
    work(&addr, &mut rng, 20);
    w.kill();
    // The follower keeps retrying while the writer is down.
    let w = writer(&wdir, port);
    let last = work(&addr, &mut rng, 40);
    f.wait_line("caught up", |l| {
        l.starts_with(&format!("caught up at event {last} "))
    });
    let mut f = f;
    assert!(f.terminate().success());
    let mut w = w;
    assert!(w.terminate().success());
    let (wb, wc, wm) = contents(&wdir);
    let (fb, fc, fm) = contents(&fdir);
    assert_eq!((wb, wc), (fb, fc));
    assert_eq!(wc, last);
    assert!(!wm.is_empty());
    assert!(wm == fm, "the replica's keys differ from the writer's");
}

#[test]
fn cli_remote_forms_and_wrong_credentials() {
    let tmp = tempfile::tempdir().unwrap();
    let wdir = tmp.path().join("w");
    create(&wdir);
    let auth = tmp.path().join("auth");
    std::fs::write(&auth, "w:secret:write\nr:rs:read\n").unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let w = Proc::spawn(&[
        "store",
        "serve",
        "--dir",
        wdir.to_str().unwrap(),
        "--listen",
        &addr,
        "--auth",
        auth.to_str().unwrap(),
    ]);
    w.wait_line("serving", |l| l.starts_with("serving"));
    let o = run(&[
        "store",
        "set",
        "--remote",
        &addr,
        "--user",
        "w",
        "--token",
        "secret",
        "0102030405060708=aabb",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "block 1: 1 operations applied\n"
    );
    let o = run(&[
        "store",
        "get",
        "--remote",
        &addr,
        "--user",
        "r",
        "--token",
        "rs",
        "0102030405060708",
        "0000000000000000",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "0102030405060708\taabb\n0000000000000000\t(absent)\n"
    );
    // Wrong token, and a reader that tries to write: clear errors, non-zero exit.
    let o = run(&[
        "store",
        "get",
        "--remote",
        &addr,
        "--user",
        "r",
        "--token",
        "bad",
        "0102030405060708",
    ]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("authentication failed"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = run(&[
        "store", "rollback", "--remote", &addr, "--user", "r", "--token", "rs", "--to", "0",
    ]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("does not allow"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = run(&[
        "store", "rollback", "--remote", &addr, "--user", "w", "--token", "secret", "--to", "0",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "rolled back from block 1 to block 0\n"
    );
    let mut w = w;
    assert!(w.terminate().success());
    // The local form reads the same store.
    let o = run(&[
        "store",
        "get",
        "--dir",
        wdir.to_str().unwrap(),
        "0102030405060708",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "0102030405060708\t(absent)\n"
    );
}

/// `memfs store follow --listen`: the replica answers `get --remote` like
/// the writer, refuses `set --remote` (non-zero exit, ReadOnlyReplica), and
/// the follower stops cleanly on SIGTERM.
#[test]
fn cli_follower_serves_reads() {
    let tmp = tempfile::tempdir().unwrap();
    let wdir = tmp.path().join("w");
    let fdir = tmp.path().join("f");
    create(&wdir);
    let addr = format!("127.0.0.1:{}", free_port());
    let _w = writer(&wdir, addr.rsplit(':').next().unwrap().parse().unwrap());
    let o = run(&["store", "set", "--remote", &addr, "0102030405060708=aabb"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (mut f, raddr) = serving_follower(&addr, &fdir);
    f.wait_line("caught up", |l| l.starts_with("caught up at event 1 "));
    let o = run(&["store", "get", "--remote", &raddr, "0102030405060708"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "0102030405060708\taabb\n"
    );
    let o = run(&["store", "set", "--remote", &raddr, "0102030405060708=cc"]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("read-only replica"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(f.terminate().success());
}

/// `GET /metrics` of a server's metrics endpoint: the value of `name`.
fn metric(addr: &str, name: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("memfs_store_{name} ")))?;
    line.rsplit(' ').next()?.parse().ok()
}

#[test]
fn cli_bounded_lag_holds_every_set_until_the_follower_has_it() {
    let tmp = tempfile::tempdir().unwrap();
    let wdir = tmp.path().join("w");
    let fdir = tmp.path().join("f");
    create(&wdir);
    let addr = format!("127.0.0.1:{}", free_port());
    let maddr = format!("127.0.0.1:{}", free_port());
    // K = 0: a set returns only once the follower holds it. The wait is
    // longer than any set takes, so a read of the replica right after each
    // set must find it.
    let w = Proc::spawn(&[
        "store",
        "serve",
        "--dir",
        wdir.to_str().unwrap(),
        "--listen",
        &addr,
        "--metrics",
        &maddr,
        "--max-follower-lag",
        "0",
        "--follower-wait",
        "60",
    ]);
    w.wait_line("serving", |l| l.starts_with("serving"));
    let (mut f, raddr) = serving_follower(&addr, &fdir);
    let t0 = std::time::Instant::now();
    while metric(&maddr, "followers_in_sync") != Some(1.0) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "follower not in sync"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    for b in 1..=5u32 {
        let kv = format!("01020304050607{b:02x}={b:02x}");
        let o = run(&["store", "set", "--remote", &addr, &kv]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let o = run(&["store", "get", "--remote", &raddr, &kv[..16]]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            format!("{}\t{b:02x}\n", &kv[..16]),
            "block {b} is not on the replica when its set returned"
        );
    }
    assert_eq!(metric(&maddr, "follower_timeouts_total"), Some(0.0));
    assert!(f.terminate().success());
}
