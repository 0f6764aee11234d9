//! Bounded follower lag (`ServerConfig::max_follower_lag`, `memfs store
//! serve --max-follower-lag K`): a write's reply waits until every follower
//! in sync has reported the event K before it applied; a silent follower
//! holds the writer back once (`follower_wait`), a departed one not at all.

mod net;

use memfs_store::net::client::ClientConfig;
use memfs_store::net::protocol::{ErrorCode, Role};
use memfs_store::net::server::ServerConfig;
use net::{Follower, TestServer, contents, create_store, key, poll_until};
use rand::{Rng, SeedableRng, rngs::StdRng};
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

const WINDOW: u64 = 8;

/// A served store in `dir` with the given lag bound and wait.
fn serve(dir: &Path, max_follower_lag: u64, follower_wait: Duration) -> TestServer {
    create_store(dir, WINDOW);
    TestServer::start(
        dir,
        ServerConfig {
            max_follower_lag: Some(max_follower_lag),
            follower_wait,
            ..Default::default()
        },
        None,
    )
}

fn metric(srv: &TestServer, name: &str) -> f64 {
    let text = srv.handle.metrics_text();
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("memfs_store_{name} ")))
        .unwrap_or_else(|| panic!("no metric {name} in:\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// Runs blocks, pops and rollbacks against a served writer with a real
/// follower and returns the largest lag seen when a write returned.
fn largest_lag(max_follower_lag: u64) -> u64 {
    let tmp = tempfile::tempdir().unwrap();
    let wdir = tmp.path().join("w");
    // The wait is longer than any write can take on a loaded CI machine: a
    // wait that runs out would end the bound, and the test says so.
    let srv = serve(&wdir, max_follower_lag, Duration::from_secs(60));
    let f = Follower::start(srv.config("", "", Role::Follow), &tmp.path().join("r"));
    poll_until("the follower's first position report", || {
        f.progress.reports.load(Relaxed) > 0
    });
    let mut w = srv.client("", "", Role::Write).unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    let mut block = 0u64;
    let mut worst = 0;
    for step in 0..150 {
        let seq = if step % 25 == 24 && block > 2 {
            w.rollback(block - 2).unwrap();
            block -= 2;
            w.status().unwrap().last_seq
        } else if step % 10 == 9 {
            block += 1;
            w.pop(block, &key(rng.random_range(0..500))).unwrap();
            w.status().unwrap().last_seq
        } else {
            block += 1;
            let ops: Vec<([u8; 8], Vec<u8>)> = (0..rng.random_range(1..400))
                .map(|_| {
                    (
                        key(rng.random_range(0..500)),
                        vec![1u8; rng.random_range(0..64)],
                    )
                })
                .collect();
            w.set(block, &ops).unwrap()
        };
        worst = worst.max(seq.saturating_sub(f.progress.seq.load(Relaxed)));
    }
    assert_eq!(metric(&srv, "follower_timeouts_total"), 0.0);
    let last = w.status().unwrap().last_seq;
    poll_until("the follower catches up", || {
        f.progress.seq.load(Relaxed) == last
    });
    f.finish().unwrap();
    srv.stop();
    // The replica holds what the writer holds.
    assert_eq!(contents(&wdir), contents(&tmp.path().join("r")));
    worst
}

#[test]
fn every_write_returns_with_the_follower_at_most_the_bound_behind() {
    assert!(largest_lag(1) <= 1);
    // Fully synchronous: the follower holds the event before the reply.
    assert_eq!(largest_lag(0), 0);
}

#[test]
fn a_silent_follower_holds_the_writer_once_and_a_departed_one_not_at_all() {
    let tmp = tempfile::tempdir().unwrap();
    let srv = serve(&tmp.path().join("w"), 1, Duration::from_millis(200));
    let mut w = srv.client("", "", Role::Write).unwrap();
    // A follower that reports event 0 and then nothing (stalled).
    let mut f = srv.client("", "", Role::Follow).unwrap();
    f.ack(0).unwrap();
    assert_eq!(metric(&srv, "followers_in_sync"), 1.0);
    // Event 1 needs event 0: no wait. Event 2 needs event 1: the writer
    // waits, gives up, and the follower no longer holds writes back.
    assert_eq!(w.set(1, &[(key(1), b"a")]).unwrap(), 1);
    assert_eq!(metric(&srv, "follower_waits_total"), 0.0);
    assert_eq!(w.set(2, &[(key(2), b"b")]).unwrap(), 2);
    assert_eq!(metric(&srv, "follower_waits_total"), 1.0);
    assert_eq!(metric(&srv, "follower_timeouts_total"), 1.0);
    assert_eq!(metric(&srv, "followers_in_sync"), 0.0);
    w.set(3, &[(key(3), b"c")]).unwrap();
    assert_eq!(metric(&srv, "follower_waits_total"), 1.0);
    // Caught up again: in sync, and the writer's position comes back.
    assert_eq!(f.ack(3).unwrap(), (3, 3));
    assert_eq!(metric(&srv, "followers_in_sync"), 1.0);
    assert_eq!(metric(&srv, "follower_applied_seq_min"), 3.0);
    // An ACK beyond the writer's history is refused; the session goes on.
    assert_eq!(
        f.ack(99).unwrap_err().code(),
        Some(ErrorCode::HistoryDiverged)
    );
    f.ping().unwrap();
    // Gone: forgotten, and no write waits for it.
    drop(f);
    poll_until("the server forgets the follower", || {
        metric(&srv, "followers_reporting") == 0.0
    });
    w.set(4, &[(key(4), b"d")]).unwrap();
    w.set(5, &[(key(5), b"e")]).unwrap();
    assert_eq!(metric(&srv, "follower_waits_total"), 1.0);
    assert_eq!(metric(&srv, "follower_timeouts_total"), 1.0);
}

#[test]
fn a_follower_that_disconnects_releases_a_waiting_write() {
    let tmp = tempfile::tempdir().unwrap();
    // The wait is never reached: the disconnect must end it.
    let srv = serve(&tmp.path().join("w"), 0, Duration::from_secs(60));
    let mut f = srv.client("", "", Role::Follow).unwrap();
    f.ack(0).unwrap();
    let sock = f.socket().unwrap();
    let addr = srv.addr.to_string();
    let writer = std::thread::spawn(move || {
        let mut w = memfs_store::net::client::Client::connect(ClientConfig::new(addr, Role::Write))
            .unwrap();
        w.set(1, &[(key(1), b"a")]).unwrap()
    });
    poll_until("the write waits for the follower", || {
        metric(&srv, "follower_waits_total") == 1.0
    });
    sock.shutdown(std::net::Shutdown::Both).unwrap();
    assert_eq!(writer.join().unwrap(), 1);
    assert_eq!(metric(&srv, "follower_timeouts_total"), 0.0);
}
