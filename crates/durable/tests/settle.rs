//! The settle protocol across an online rollback: an operation records its
//! commit under the engine's locks and settles it (waits for the disk)
//! after dropping them, through a per-thread token. When an online
//! rollback replaces the journal between the two halves, as it does under
//! a busy mount, the token must settle at once: the rollback synced the
//! old journal before it swapped, and then kept or undid the commit like
//! any other. It once settled against the new journal instead, whose last
//! commit lay before it, and waited for ever holding the journal's lock.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::open_mode;
use memfs_durable::FsCheck;
use memfs_fs::{Ctx, ROOT_INO};

/// Runs `f` on a thread of its own (the token lives in a thread-local),
/// failing the test, not hanging it, if it takes longer than 30 s.
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("{what} did not return within 30 s"))
}

#[test]
fn a_token_of_a_journal_a_rollback_replaced_settles_at_once() {
    for mode in ["sync", "async", "relaxed=8", "async-relaxed=8", "none"] {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().to_path_buf();
        let (pending, last_before, now) =
            within(&format!("{mode}: rollback, then settle"), move || {
                let mut d = open_mode(&dir, mode);
                let fs = d.fs().clone();
                fs.write_file(Ctx::ROOT, ROOT_INO, "/kept", b"k").unwrap();
                fs.settle().unwrap();
                let snap = d.snapshot_create("s").unwrap();
                for i in 0..20 {
                    fs.write_file(Ctx::ROOT, ROOT_INO, &format!("/gone{i}"), b"g")
                        .unwrap();
                    fs.settle().unwrap();
                }
                // Recorded, not settled: this thread holds its token.
                fs.write_file(Ctx::ROOT, ROOT_INO, "/pending", b"p")
                    .unwrap();
                let pending = fs.last_commit();
                d.rollback_online(snap.commit).unwrap();
                let last_before = d.last_commit();
                // What the FUSE adapter does: settle on the tree served now.
                d.fs().settle().unwrap();
                // The new journal goes on as usual.
                d.fs()
                    .write_file(Ctx::ROOT, ROOT_INO, "/after", b"a")
                    .unwrap();
                d.fs().settle().unwrap();
                let now = d.fs().canonical_dump();
                d.close().unwrap();
                (pending, last_before, now)
            });
        assert!(
            pending > last_before + 1,
            "{mode}: the settled commit {pending} must lie past the new journal's {last_before}"
        );
        let text = now.join("\n");
        assert!(
            text.contains("kept") && text.contains("after"),
            "{mode}: {text}"
        );
        assert!(
            !text.contains("pending") && !text.contains("gone"),
            "{mode}: {text}"
        );
        // And the directory holds exactly that after a reopen.
        let again = open_mode(t.path(), mode);
        assert_eq!(again.fs().canonical_dump(), now, "{mode}: after a reopen");
        again.close().unwrap();
    }
}
