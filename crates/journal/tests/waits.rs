//! Waits for another thread's journal I/O are bounded (docs/reliability.md,
//! "Every wait is bounded or proven"): past the stall limit the waiter gets
//! an error that names what it waited for, instead of hanging.

use memfs_journal::{DataDir, Durability, Error, Journal, JournalOptions, SimStorage, storage};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A journal on the simulated disk `sim`, registered for as long as the
/// returned registration lives.
fn open(
    sim: &SimStorage,
    name: &str,
    durability: Durability,
    segment_size: u64,
) -> (storage::Registration, Journal) {
    let prefix = PathBuf::from(format!("/memfs-stall/{name}"));
    let reg = storage::register_scoped(&prefix, Arc::new(sim.clone()));
    let dd = DataDir::open(prefix.join("d"), true).unwrap();
    let o = JournalOptions {
        durability,
        segment_size,
    };
    (reg, Journal::open(&dd, o, 0, &mut |_, _| Ok(())).unwrap().0)
}

#[test]
fn a_flush_stuck_past_the_stall_limit_fails_the_journal_instead_of_hanging() {
    let sim = SimStorage::new();
    let mode = Durability::Async {
        max_pending: 4,
        max_pending_bytes: 1 << 20,
    };
    let (_reg, j) = open(&sim, "flush", mode, 1 << 20);
    j.set_stall_limit(Duration::from_millis(100));
    // The background writer's fsync never returns: the queue fills up, and
    // the next committer waits for a flush that is stuck.
    sim.hold_file_syncs(true);
    let err = (0..1000)
        .find_map(|_| j.commit(b"payload").err())
        .expect("a commit behind the stuck flush fails");
    assert!(
        matches!(&err, Error::Failed(m) if m.contains("write or fsync") && m.contains("has not returned")),
        "{err}"
    );
    assert!(j.stats().failed.is_some(), "the journal is failed");
    // Every later commit is refused at once, as after an EIO.
    assert!(matches!(j.commit(b"later"), Err(Error::Failed(_))));
    sim.hold_file_syncs(false);
}

#[test]
fn a_reservation_held_past_the_stall_limit_refuses_the_next_large_one() {
    let sim = SimStorage::new();
    let (_reg, j) = open(&sim, "reserve", Durability::Sync, 64 << 10);
    j.set_stall_limit(Duration::from_millis(50));
    // Two reservations that together exceed a segment are taken one at a
    // time; the first is never appended nor released.
    let held = j.reserve(40_000).unwrap();
    let err = j.reserve(40_000).unwrap_err();
    assert!(
        matches!(err, Error::Stalled { what, .. } if what.contains("reservations ahead")),
        "{err}"
    );
    // Nothing was reserved by the refused call, and the journal still works.
    j.release(held);
    let again = j.reserve(40_000).unwrap();
    j.release(again);
    j.commit(b"still works").unwrap();
    assert!(j.stats().failed.is_none());
}
