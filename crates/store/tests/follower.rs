//! Followers in process: equality with the writer across random blocks and
//! rollbacks and a follower restart; refusal of streams that skip an event
//! or do not continue the replica's history.

mod net;

use memfs_store::net::follower::{self, FollowError, FollowerConfig, Progress};
use memfs_store::net::protocol::{self as p, ErrorCode, Role, Welcome};
use memfs_store::net::server::ServerConfig;
use memfs_store::{Durability, Store};
use net::{Follower, TestServer, contents, create_store, key, poll_until};
use rand::{Rng, SeedableRng, rngs::StdRng};

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::Duration;

fn random_work(w: &mut memfs_store::net::client::Client, rng: &mut StdRng, steps: usize) {
    for _ in 0..steps {
        let st = w.status().unwrap();
        if rng.random_range(0..6) == 0 && st.current > st.oldest {
            w.rollback(rng.random_range(st.oldest..st.current)).unwrap();
        } else {
            let ops: Vec<([u8; 8], Vec<u8>)> = (0..rng.random_range(1..20))
                .map(|_| {
                    (
                        key(rng.random_range(0..50)),
                        vec![rng.random::<u8>(); rng.random_range(0..30)],
                    )
                })
                .collect();
            w.set(st.current + rng.random_range(1..3), &ops).unwrap();
        }
    }
}

#[test]
fn follower_equals_writer_across_restarts() {
    let tmp = tempfile::tempdir().unwrap();
    let wdir = tmp.path().join("writer");
    let fdir = tmp.path().join("replica");
    create_store(&wdir, 6);
    let srv = TestServer::start(&wdir, ServerConfig::default(), None);
    let mut w = srv.client("", "", Role::Write).unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    random_work(&mut w, &mut rng, 30);
    let f = Follower::start(srv.config("", "", Role::Follow), &fdir);
    random_work(&mut w, &mut rng, 30);
    let last = w.status().unwrap().last_seq;
    let pr = f.progress.clone();
    poll_until("the follower catches up", || pr.seq.load(Relaxed) == last);
    f.finish().unwrap();
    // Stopped, then more work, then a fresh follower process resumes.
    random_work(&mut w, &mut rng, 40);
    let f = Follower::start(srv.config("", "", Role::Follow), &fdir);
    random_work(&mut w, &mut rng, 20);
    let last = w.status().unwrap().last_seq;
    let pr = f.progress.clone();
    poll_until("the follower catches up again", || {
        pr.seq.load(Relaxed) == last
    });
    f.finish().unwrap();
    // The writer moves on and restarts while the follower is away: the
    // events it missed come from the restarted writer's journal.
    random_work(&mut w, &mut rng, 25);
    drop(w);
    srv.stop();
    let srv = TestServer::start(&wdir, ServerConfig::default(), None);
    let mut w = srv.client("", "", Role::Write).unwrap();
    let f = Follower::start(srv.config("", "", Role::Follow), &fdir);
    random_work(&mut w, &mut rng, 5);
    let last = w.status().unwrap().last_seq;
    let pr = f.progress.clone();
    poll_until("the follower catches up after the writer restarted", || {
        pr.seq.load(Relaxed) == last
    });
    f.finish().unwrap();
    drop(w);
    srv.stop();
    assert_eq!(contents(&wdir), contents(&fdir));
}

#[test]
fn follower_ahead_of_writer_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let wdir = tmp.path().join("writer");
    let fdir = tmp.path().join("replica");
    create_store(&wdir, 6);
    let srv = TestServer::start(&wdir, ServerConfig::default(), None);
    let mut w = srv.client("", "", Role::Write).unwrap();
    for b in 1..=5 {
        w.set(b, &[(key(b), b"v")]).unwrap();
    }
    let f = Follower::start(srv.config("", "", Role::Follow), &fdir);
    let pr = f.progress.clone();
    poll_until("the follower catches up", || pr.seq.load(Relaxed) == 5);
    f.finish().unwrap();
    drop(w);
    srv.stop();
    // A different writer history: 3 blocks only, other values.
    let w2 = tmp.path().join("writer2");
    create_store(&w2, 6);
    let srv = TestServer::start(&w2, ServerConfig::default(), None);
    let mut w = srv.client("", "", Role::Write).unwrap();
    for b in 1..=3 {
        w.set(b, &[(key(b), b"other")]).unwrap();
    }
    let f = Follower::start(srv.config("", "", Role::Follow), &fdir);
    let e = f.finish_when_done();
    let FollowError::Client(c) = &e else {
        panic!("{e}")
    };
    assert_eq!(c.code(), Some(ErrorCode::HistoryDiverged), "{e}");
    assert!(
        e.to_string().contains("ahead") || e.to_string().contains("history"),
        "{e}"
    );
    // The replica is untouched.
    let (b, m) = contents(&fdir);
    assert_eq!((b, m.len()), (5, 5));
}

impl Follower {
    /// Waits for the follower to stop by itself (with an error).
    fn finish_when_done(mut self) -> FollowError {
        let t = self.thread.take().unwrap();
        poll_until("the follower stops", || t.is_finished());
        t.join().unwrap().expect_err("the follower should refuse")
    }
}

/// A fake writer that sends the given frames after the subscription.
fn fake_writer(frames: Vec<Vec<u8>>) -> (String, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        // Only one connection: the follower's position reports are refused.
        drop(l);
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut buf = [0u8; 256];
        let _ = s.read(&mut buf); // HELLO
        let mut out = Vec::new();
        p::put_welcome(
            &mut out,
            &Welcome {
                version: p::VERSION,
                key_width: 8,
                shards: 4,
                rollback_window: 6,
                current: 9,
                oldest: 0,
                last_seq: 9,
                max_frame: p::DEFAULT_MAX_FRAME,
                max_batch: p::DEFAULT_MAX_BATCH,
            },
        );
        s.write_all(&out).unwrap();
        let _ = s.read(&mut buf); // SUBSCRIBE
        for f in frames {
            if s.write_all(&f).is_err() {
                return;
            }
        }
        // Hold the connection until the follower hangs up.
        let _ = s.read(&mut buf);
    });
    (addr, t)
}

fn ev_block(seq: u64, prev: u64, block: u64) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&block.to_le_bytes());
    body.extend_from_slice(&1u32.to_le_bytes());
    body.extend_from_slice(&key(block));
    body.extend_from_slice(&1u16.to_le_bytes());
    body.push(1);
    let mut f = Vec::new();
    p::put_ev_block(&mut f, seq, prev, &body);
    f
}

fn follow_fake(frames: Vec<Vec<u8>>, dir: PathBuf) -> FollowError {
    let (addr, t) = fake_writer(frames);
    let cfg = memfs_store::net::client::ClientConfig::new(addr, Role::Follow);
    let f = Follower::start(cfg, &dir);
    let e = f.finish_when_done();
    t.join().unwrap();
    e
}

#[test]
fn stream_that_skips_an_event_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    let e = follow_fake(vec![ev_block(1, 0, 1), ev_block(3, 1, 2)], dir.clone());
    assert!(
        matches!(
            e,
            FollowError::Skipped {
                expected: 2,
                got: 3
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("skips"), "{e}");
    // Block 1 was applied, nothing after.
    assert_eq!(contents(&dir).0, 1);
}

#[test]
fn stream_that_does_not_continue_the_history_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    let e = follow_fake(vec![ev_block(1, 0, 4), ev_block(2, 3, 5)], dir.clone());
    assert!(matches!(e, FollowError::Diverged(_)), "{e}");
    assert!(e.to_string().contains("replica is at block 4"), "{e}");
    assert_eq!(contents(&dir).0, 4);
    // A block id that does not increase is refused too.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    let e = follow_fake(vec![ev_block(1, 0, 4), ev_block(2, 4, 4)], dir.clone());
    assert!(matches!(e, FollowError::Diverged(_)), "{e}");
    assert!(e.to_string().contains("strictly increase"), "{e}");
    assert_eq!(contents(&dir).0, 4);
}

/// A read-only server on a follower's replica, stopped by a Drop guard.
struct ReplicaServer {
    addr: std::net::SocketAddr,
    handle: memfs_store::net::server::ShutdownHandle,
    thread: Option<JoinHandle<()>>,
}

impl ReplicaServer {
    fn start(replica: Arc<follower::Replica>) -> ReplicaServer {
        let srv = memfs_store::net::server::Server::bind_replica(
            replica,
            "127.0.0.1:0",
            ServerConfig::default(),
        )
        .unwrap();
        let (addr, handle) = (srv.local_addr(), srv.handle());
        let thread = Some(std::thread::spawn(move || {
            srv.run().expect("replica server")
        }));
        ReplicaServer {
            addr,
            handle,
            thread,
        }
    }

    fn client(&self, role: Role) -> Result<memfs_store::net::client::Client, ClientError> {
        memfs_store::net::client::Client::connect(memfs_store::net::client::ClientConfig::new(
            self.addr.to_string(),
            role,
        ))
    }
}

impl Drop for ReplicaServer {
    fn drop(&mut self) {
        self.handle.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

use memfs_store::net::client::ClientError;

/// Reads on a follower's replica see the state after whole events: every
/// block writes the same value to all keys, so a read that mixes two values
/// saw a block half applied.
#[test]
fn replica_serves_reads_of_whole_blocks_while_following() {
    const KEYS: u64 = 512;
    let tmp = tempfile::tempdir().unwrap();
    let wdir = tmp.path().join("writer");
    create_store(&wdir, 8);
    let srv = TestServer::start(&wdir, ServerConfig::default(), None);
    let replica = follower::Replica::new();
    let rsrv = ReplicaServer::start(replica.clone());
    // No store yet: a typed refusal.
    let e = rsrv.client(Role::Read).err().expect("no store yet");
    assert_eq!(e.code(), Some(ErrorCode::ReplicaNotReady), "{e}");

    let stop = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(Progress::default());
    let cfg = FollowerConfig {
        client: srv.config("", "", Role::Follow),
        dir: tmp.path().join("replica"),
        durability: Durability::None,
        threads: 2,
        max_backoff: Duration::from_millis(200),
        on_caught_up: None,
    };
    let f = {
        let (s, pr, r) = (stop.clone(), progress.clone(), replica.clone());
        std::thread::spawn(move || follower::follow_into(cfg, &r, &s, &pr))
    };
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Relaxed);
        }
    }
    let _stop_guard = StopOnDrop(stop.clone());
    poll_until("the replica opens", || replica.read().is_some());

    let keys: Vec<[u8; 8]> = (0..KEYS).map(key).collect();
    let readers_done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (done, keys) = (readers_done.clone(), keys.clone());
        let mut c = rsrv.client(Role::Read).unwrap();
        std::thread::spawn(move || {
            let (mut reads, mut seen) = (0u64, std::collections::BTreeSet::new());
            while !done.load(Relaxed) {
                let vals = c.multi_get(&keys).unwrap();
                let first = vals[0].clone();
                assert!(
                    vals.iter().all(|v| *v == first),
                    "a read mixed two blocks: {:?} and {:?}",
                    first,
                    vals.iter().find(|v| **v != first)
                );
                seen.insert(first);
                reads += 1;
            }
            (reads, seen.len())
        })
    };
    let mut w = srv.client("", "", Role::Write).unwrap();
    for b in 1..=60u64 {
        let ops: Vec<([u8; 8], [u8; 8])> = keys.iter().map(|k| (*k, b.to_le_bytes())).collect();
        w.set(b, &ops).unwrap();
        if b % 10 == 0 {
            w.rollback(b - 3).unwrap();
        }
    }
    let last = w.status().unwrap().last_seq;
    poll_until("the follower catches up", || {
        progress.seq.load(Relaxed) == last
    });
    readers_done.store(true, Relaxed);
    let (reads, distinct) = reader.join().unwrap();
    assert!(
        reads > 0 && distinct >= 1,
        "{reads} reads, {distinct} states"
    );

    // The replica answers like the writer, and refuses writes.
    let mut r = rsrv.client(Role::Read).unwrap();
    assert_eq!(r.multi_get(&keys).unwrap(), w.multi_get(&keys).unwrap());
    let (rs, ws) = (r.status().unwrap(), w.status().unwrap());
    assert_eq!((rs.current, rs.last_seq), (ws.current, ws.last_seq));
    let mut rw = rsrv.client(Role::Write).unwrap();
    let e = rw.set(1000, &[(key(1), [1u8; 8])]).unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::ReadOnlyReplica), "{e}");
    let e = rw.rollback(ws.current - 1).unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::ReadOnlyReplica), "{e}");
    let e = rw.pop(1000, &key(1)).unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::ReadOnlyReplica), "{e}");
    assert_eq!(r.get(&key(1)).unwrap(), w.get(&key(1)).unwrap());

    stop.store(true, Relaxed);
    f.join().unwrap().unwrap();
    assert!(replica.read().is_none(), "the follower closed the replica");
    drop(rsrv);
    drop(w);
    srv.stop();
}

/// Waits until the follower applied event `last`; fails with the follower's
/// error if it stopped.
fn wait_caught_up(mut f: Follower, last: u64, what: &str) -> Follower {
    let pr = f.progress.clone();
    poll_until(what, || {
        if f.thread.as_ref().unwrap().is_finished() {
            let r = f.thread.take().unwrap().join().unwrap();
            panic!("the follower stopped: {r:?}");
        }
        pr.seq.load(Relaxed) == last
    });
    f
}

/// A follower whose position is older than the writer's kept history gets a
/// copy of the writer's files (snapshot + journal) and then the stream; the
/// writer keeps writing, snapshotting and pruning during the transfer.
#[test]
fn follower_behind_the_history_gets_a_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let wdir = tmp.path().join("writer");
    let fdir = tmp.path().join("replica");
    Store::create(
        &wdir,
        memfs_store::StoreOptions {
            key_width: 8,
            shards: 4,
            threads: 1,
            durability: Durability::None,
            rollback_window: 4,
            snapshot_interval: 7,
            segment_size: 4096,
            ..Default::default()
        },
    )
    .unwrap()
    .close()
    .unwrap();
    let cfg = ServerConfig {
        log_events: 8,
        ..Default::default()
    };
    let srv = TestServer::start(&wdir, cfg.clone(), None);
    let mut w = srv.client("", "", Role::Write).unwrap();
    let mut rng = StdRng::seed_from_u64(11);
    random_work(&mut w, &mut rng, 80);
    let f = Follower::start(srv.config("", "", Role::Follow), &fdir);
    random_work(&mut w, &mut rng, 30);
    let last = w.status().unwrap().last_seq;
    let pr = f.progress.clone();
    let f = wait_caught_up(f, last, "the follower catches up");
    assert!(pr.snapshots.load(Relaxed) >= 1, "no snapshot was installed");
    f.finish().unwrap();
    // Away while the writer moves past the history again: the existing
    // replica is replaced by a newer copy.
    random_work(&mut w, &mut rng, 40);
    let f = Follower::start(srv.config("", "", Role::Follow), &fdir);
    random_work(&mut w, &mut rng, 10);
    let last = w.status().unwrap().last_seq;
    let pr = f.progress.clone();
    let f = wait_caught_up(f, last, "the follower catches up again");
    assert!(pr.snapshots.load(Relaxed) >= 1, "no second snapshot");
    f.finish().unwrap();
    drop(w);
    srv.stop();
    assert_eq!(contents(&wdir), contents(&fdir));
    let snaps = std::fs::read_dir(&wdir)
        .unwrap()
        .filter(|e| {
            let n = e.as_ref().unwrap().file_name().into_string().unwrap();
            n.starts_with("snapshot-") && n.ends_with(".snap")
        })
        .count();
    assert!(
        snaps >= 1,
        "the writer never snapshotted: the test lost its point"
    );
    assert!(!tmp.path().join("replica.snapshot-incoming").exists());
    assert!(!tmp.path().join("replica.snapshot-old").exists());
}
