//! Stage marks (`memfs_store::stages`): with a server and a follower in
//! process, every block event gets every stage of the path, once, in an
//! order each mark's place in the code guarantees; nothing is recorded when
//! the marks are off. A binary of its own: the marks are process-global.

mod net;

use memfs_store::Durability;
use memfs_store::net::follower::{self, FollowerConfig, Progress};
use memfs_store::net::protocol::Role;
use memfs_store::net::server::ServerConfig;
use memfs_store::stages::{self, Stage};
use net::{TestServer, create_store, key, poll_until};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

#[test]
fn every_event_passes_every_stage_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let wdir = tmp.path().join("w");
    create_store(&wdir, 8);
    let srv = TestServer::start(&wdir, ServerConfig::default(), None);
    let stop = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(Progress::default());
    let cfg = FollowerConfig {
        client: srv.config("", "", Role::Follow),
        dir: tmp.path().join("f"),
        durability: Durability::None,
        threads: 1,
        max_backoff: Duration::from_millis(200),
        on_caught_up: None,
    };
    let (s, pr) = (stop.clone(), progress.clone());
    let f = std::thread::spawn(move || follower::follow(cfg, &s, &pr));
    // Stops and joins the follower on every path (a failed assert too).
    struct Stop(
        Arc<AtomicBool>,
        Option<std::thread::JoinHandle<Result<(), follower::FollowError>>>,
    );
    impl Drop for Stop {
        fn drop(&mut self) {
            self.0.store(true, Relaxed);
            if let Some(t) = self.1.take() {
                let _ = t.join();
            }
        }
    }
    let mut guard = Stop(stop, Some(f));
    poll_until("the follower to connect", || {
        progress.connected.load(Relaxed)
    });

    let mut w = srv.client("", "", Role::Write).unwrap();
    const BLOCKS: u64 = 20;
    stages::enable();
    for b in 1..=BLOCKS {
        let ops: Vec<([u8; 8], [u8; 8])> = (0..3000)
            .map(|i| (key(b * 10_000 + i), [b as u8; 8]))
            .collect();
        let t = Instant::now();
        let seq = w.set(b, &ops).unwrap();
        stages::mark_at(seq, Stage::ClientSend, t);
        stages::mark(seq, Stage::ClientDone);
    }
    poll_until("the follower to apply every block", || {
        progress.seq.load(Relaxed) == BLOCKS
    });
    // The server's subscriber marks SubscriberWritten when its write
    // returns, which may be after the follower has applied the block.
    poll_until("every stage of every block to be marked", || {
        stages::recorded() >= BLOCKS as usize * stages::PATH.len()
    });
    let marks = stages::take();
    guard.0.store(true, Relaxed);
    guard.1.take().unwrap().join().unwrap().unwrap();

    let mut by: BTreeMap<u64, BTreeMap<Stage, Vec<Instant>>> = BTreeMap::new();
    for (seq, st, at) in &marks {
        by.entry(*seq)
            .or_default()
            .entry(*st)
            .or_default()
            .push(*at);
    }
    assert_eq!(
        by.keys().copied().collect::<Vec<_>>(),
        (1..=BLOCKS).collect::<Vec<_>>()
    );
    for (seq, m) in &by {
        for st in stages::PATH {
            assert_eq!(
                m.get(&st).map_or(0, Vec::len),
                1,
                "event {seq}: stage {st:?} marked {:?}",
                m.get(&st)
            );
        }
        let at = |s: Stage| m[&s][0];
        // Edges the code orders: one thread's sequence, or a mark taken
        // before the action the next stage waits for.
        let edges = [
            (Stage::ClientSend, Stage::SetReceived),
            (Stage::SetReceived, Stage::WriterLocked),
            (Stage::WriterLocked, Stage::WriterJournal),
            (Stage::WriterJournal, Stage::Published),
            // The block is published once the journal has it, before the
            // writer's tables (this store's durability is `none`: the
            // tables follow the commit on the same thread).
            (Stage::Published, Stage::WriterTables),
            (Stage::WriterJournal, Stage::SubscriberTook),
            (Stage::WriterTables, Stage::ClientDone),
            (Stage::SubscriberTook, Stage::SubscriberWritten),
            (Stage::SubscriberTook, Stage::FollowerReceived),
            (Stage::FollowerReceived, Stage::FollowerPrepared),
            (Stage::FollowerPrepared, Stage::FollowerDequeued),
            (Stage::FollowerDequeued, Stage::FollowerLocked),
            (Stage::FollowerLocked, Stage::FollowerJournal),
            (Stage::FollowerJournal, Stage::FollowerTables),
            (Stage::FollowerTables, Stage::FollowerApplied),
        ];
        for (a, b) in edges {
            assert!(
                at(a) <= at(b),
                "event {seq}: {a:?} after {b:?} ({:?} later)",
                at(a) - at(b)
            );
        }
    }
    let report = stages::report(&marks);
    for st in &stages::PATH[1..] {
        assert!(
            report.contains(&format!("{st:?}:")),
            "{st:?} missing from the report:\n{report}"
        );
    }
    // Every ClientDone is one lag sample, and so is every publication:
    // BLOCKS of them in each histogram.
    for at in ["ClientDone", "Published"] {
        let hist = report
            .lines()
            .find_map(|l| l.strip_prefix(&format!("lag at {at} (from the marks): ")))
            .unwrap_or_else(|| panic!("no lag line at {at}:\n{report}"));
        let samples: usize = hist
            .trim_matches(|c| c == '{' || c == '}')
            .split(", ")
            .map(|kv| kv.split(": ").nth(1).unwrap().parse::<usize>().unwrap())
            .sum();
        assert_eq!(samples, BLOCKS as usize, "{at}: {report}");
    }

    // Off: another block leaves no mark.
    w.set(BLOCKS + 1, &[(key(1), [1u8; 8])]).unwrap();
    assert!(stages::take().is_empty());
}
