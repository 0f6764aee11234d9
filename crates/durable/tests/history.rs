//! History on a data directory in use: any retained commit rebuilt aside
//! equals the tree as it was, and `diff` names created, deleted, modified
//! and renamed paths, on the running file system and offline alike.

use std::path::Path;

use memfs_durable::history::{self, Change};
use memfs_durable::{DurableFs, FsCheck};
use memfs_fs::{Ctx, ROOT_INO, RenameFlags};
use rand::{SeedableRng, rngs::StdRng};

mod common;
use common::random_op;

fn open(dir: &Path) -> DurableFs {
    common::open_mode(dir, "sync")
}

fn lines(c: &[Change]) -> Vec<String> {
    c.iter().map(ToString::to_string).collect()
}

#[test]
fn every_retained_commit_materializes_as_it_was() {
    let t = tempfile::tempdir().unwrap();
    let d = open(t.path());
    let fs = d.fs().clone();
    fs.mkdir_all(Ctx::ROOT, ROOT_INO, "/p/r", 0o755).unwrap();
    fs.mkdir_all(Ctx::ROOT, ROOT_INO, "/q", 0o755).unwrap();
    let mut rng = StdRng::seed_from_u64(12);
    let mut states = Vec::new();
    for i in 0..80 {
        random_op(&fs, &mut rng).unwrap();
        if i % 20 == 7 {
            d.checkpoint().unwrap();
        }
        states.push((d.last_commit(), fs.canonical_dump()));
    }
    for (commit, dump) in states.iter().step_by(9) {
        let old = d.materialize(*commit).unwrap();
        assert_eq!(&old.canonical_dump(), dump, "commit {commit}");
        // A tree compared with itself, rebuilt or live, has no changes.
        assert!(history::diff_trees(&old, &old).is_empty());
    }
    let now = d.materialize(d.last_commit()).unwrap();
    assert_eq!(now.canonical_dump(), fs.canonical_dump());
    assert!(history::diff_trees(&now, &fs).is_empty());
    let err = d.materialize(1 << 40).err().unwrap().to_string();
    assert!(err.contains("does not exist"), "{err}");
}

#[test]
fn diff_names_created_deleted_modified_and_renamed_paths() {
    let t = tempfile::tempdir().unwrap();
    let d = open(t.path());
    let fs = d.fs().clone();
    let c = Ctx::ROOT;
    fs.mkdir_all(c, ROOT_INO, "/d/e", 0o755).unwrap();
    fs.write_file(c, ROOT_INO, "/a", b"first").unwrap();
    fs.write_file(c, ROOT_INO, "/b", b"gone soon").unwrap();
    fs.write_file(c, ROOT_INO, "/d/c", b"moves").unwrap();
    fs.write_file(c, ROOT_INO, "/keep", b"same").unwrap();
    fs.write_file(c, ROOT_INO, "/d/e/odd name", b"x").unwrap();
    fs.settle().unwrap();
    d.snapshot_create("s1").unwrap();
    // Same size, other bytes: only the data comparison can tell.
    fs.write_file(c, ROOT_INO, "/a", b"FIRST").unwrap();
    fs.unlink_path(ROOT_INO, "/b").unwrap();
    fs.rename_path(ROOT_INO, "/d/c", "/d/e/c2", RenameFlags::default())
        .unwrap();
    fs.write_file(c, ROOT_INO, "/new", b"hello").unwrap();
    fs.settle().unwrap();
    let want = [
        "M /",
        "M /a",
        "- /b",
        "M /d",
        "M /d/e",
        "R /d/c -> /d/e/c2",
        "+ /new",
    ];
    let got = lines(&history::diff_running(&d, "s1", "-").unwrap());
    let mut sorted_want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    sorted_want.sort_by(|x, y| key(x).cmp(key(y)));
    assert_eq!(got, sorted_want);
    // The reverse direction swaps creations and deletions.
    let back = lines(&history::diff_running(&d, "live", "s1").unwrap());
    assert!(back.contains(&"- /new".to_string()), "{back:?}");
    assert!(back.contains(&"+ /b".to_string()), "{back:?}");
    assert!(back.contains(&"R /d/e/c2 -> /d/c".to_string()), "{back:?}");
    // Between a snapshot and itself nothing changed.
    assert!(history::diff_running(&d, "s1", "s1").unwrap().is_empty());
    let err = history::diff_running(&d, "nope", "-")
        .unwrap_err()
        .to_string();
    assert!(err.contains("neither a commit id"), "{err}");
    drop(fs);
    d.close().unwrap();
    // Offline, from the data directory alone: the same answer.
    let offline = lines(&history::diff_offline(t.path(), "s1", "-").unwrap());
    assert_eq!(offline, got);
    // While it is in use, offline refuses (the caller asks the server).
    let d = open(t.path());
    assert!(history::diff_offline(t.path(), "s1", "-").is_err());
    drop(d);
}

/// The path a line is sorted by: the new path of a rename.
fn key(line: &str) -> &str {
    line.rsplit(' ').next().unwrap()
}

#[test]
fn online_rollback_returns_to_a_snapshot_and_history_goes_on() {
    let t = tempfile::tempdir().unwrap();
    let mut d = open(t.path());
    let fs = d.fs().clone();
    fs.mkdir_all(Ctx::ROOT, ROOT_INO, "/p/r", 0o755).unwrap();
    fs.mkdir_all(Ctx::ROOT, ROOT_INO, "/q", 0o755).unwrap();
    let mut rng = StdRng::seed_from_u64(5);
    for i in 0..40 {
        random_op(&fs, &mut rng).unwrap();
        if i == 20 {
            d.checkpoint().unwrap();
        }
    }
    let snap = d.snapshot_create("good").unwrap();
    let at_snap = fs.canonical_dump();
    for _ in 0..40 {
        random_op(&fs, &mut rng).unwrap();
    }
    d.checkpoint().unwrap();
    d.snapshot_create("later").unwrap();
    fs.write_file(Ctx::ROOT, ROOT_INO, "/after", b"x").unwrap();
    fs.settle().unwrap();
    let last_ino = fs.next_ino();

    let (plan, _) = d.rollback_online(snap.commit).unwrap();
    assert_eq!(plan.target, snap.commit);
    assert_eq!(plan.lost_snapshots.len(), 1);
    // The old tree refuses changes; the new one is the snapshot's.
    let err = fs
        .write_file(Ctx::ROOT, ROOT_INO, "/late", b"y")
        .unwrap_err();
    assert_eq!(err, memfs_fs::Errno(libc_erofs()));
    assert_eq!(d.fs().canonical_dump(), at_snap);
    assert_eq!(d.last_commit(), snap.commit);
    let names: Vec<String> = d
        .history()
        .unwrap()
        .snapshots
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["good"]);
    // History goes on from the target, and numbers the old tree gave out
    // are not handed out again.
    let a = d
        .fs()
        .write_file(Ctx::ROOT, ROOT_INO, "/next", b"z")
        .unwrap();
    d.fs().settle().unwrap();
    assert!(a.ino >= last_ino, "{} < {last_ino}", a.ino);
    // Commit ids continue right after the target.
    let c = d.last_commit();
    assert!(c > snap.commit && c <= snap.commit + 3, "{c}");
    let now = d.fs().canonical_dump();
    drop(fs);
    d.close().unwrap();
    let d = open(t.path());
    assert_eq!(d.fs().canonical_dump(), now);
    assert!(d.fs().check_consistency().is_empty());
}

fn libc_erofs() -> i32 {
    30
}
