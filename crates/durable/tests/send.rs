//! send / receive without mounts: full and incremental round trips rebuild
//! exactly the sender's snapshots (same tree, same inode numbers, same
//! commit ids), chains of incrementals work, and every damaged, truncated,
//! foreign or misplaced stream is refused with the receiving directory left
//! byte for byte as it was.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use memfs_durable::send::{self, ReceiveOptions, STREAM_VERSION, tree_sum};
use memfs_durable::{self as durable, DurableFs, FsCheck, History, history};
use memfs_fs::{Ctx, ROOT_INO, RenameFlags, XattrMode};
use rand::{SeedableRng, rngs::StdRng};

mod common;
use common::random_op;

fn open(dir: &Path) -> DurableFs {
    common::open_mode(dir, "sync")
}

/// The names of `d`'s snapshots, oldest first.
fn snapshot_names(d: &DurableFs) -> Vec<String> {
    let history = d.history().unwrap();
    history.snapshots.iter().map(|s| s.name.clone()).collect()
}

/// Every file of a directory tree with its bytes (what "unchanged" means).
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    if !dir.exists() {
        return out;
    }
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.insert(p.clone(), std::fs::read(&p).unwrap());
        }
    }
    out
}

fn send_to_vec(dir: &Path, name: &str, from: Option<&str>) -> Vec<u8> {
    let mut out = Vec::new();
    send::send(dir, name, from, &mut out).unwrap();
    out
}

fn receive(dir: &Path, stream: &[u8]) -> durable::Result<send::ReceiveReport> {
    let mut inp = stream;
    send::receive(dir, &mut inp, ReceiveOptions::default())
}

/// The tree of snapshot `name` of an unmounted directory.
fn snapshot_tree(dir: &Path, name: &str) -> memfs_fs::Fs {
    let h = History::load(dir).unwrap();
    let s = h.snapshots.iter().find(|s| s.name == name).unwrap();
    history::materialize(dir, s.commit, history::materialize_config()).unwrap()
}

/// The sender: a tree with every kind of node, snapshot `s1`; then changes
/// of every kind, snapshot `s2`; then more, snapshot `s3`.
fn source(dir: &Path) {
    let d = open(dir);
    let fs = d.fs().clone();
    let c = Ctx::ROOT;
    fs.mkdir_all(c, ROOT_INO, "/d/e", 0o755).unwrap();
    fs.write_file(c, ROOT_INO, "/a", b"first").unwrap();
    fs.write_file(c, ROOT_INO, "/d/c", b"moves").unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
    let b = fs.write_file(c, ROOT_INO, "/d/big", &big).unwrap();
    fs.symlink(c, ROOT_INO, b"link", b"d/c").unwrap();
    fs.mknod(c, ROOT_INO, b"fifo", libc::S_IFIFO | 0o644, 0)
        .unwrap();
    fs.setxattr(b.ino, b"user.tag", b"v1", XattrMode::Any)
        .unwrap();
    fs.link(b.ino, ROOT_INO, b"hard").unwrap();
    fs.settle().unwrap();
    d.snapshot_create("s1").unwrap();
    fs.write_file(c, ROOT_INO, "/a", b"FIRST and more").unwrap();
    fs.rename_path(ROOT_INO, "/d/c", "/d/e/c2", RenameFlags::default())
        .unwrap();
    fs.unlink_path(ROOT_INO, "/fifo").unwrap();
    fs.write(c, b.ino, 100_000, b"patched", false).unwrap();
    fs.setxattr(b.ino, b"user.tag", b"v2", XattrMode::Any)
        .unwrap();
    fs.mkdir_all(c, ROOT_INO, "/new/deep", 0o700).unwrap();
    fs.write_file(c, ROOT_INO, "/new/deep/f", b"fresh").unwrap();
    fs.settle().unwrap();
    d.checkpoint().unwrap();
    d.snapshot_create("s2").unwrap();
    fs.mkdir_all(c, ROOT_INO, "/p/r", 0o755).unwrap();
    fs.mkdir_all(c, ROOT_INO, "/q", 0o755).unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    for _ in 0..200 {
        random_op(&fs, &mut rng).unwrap();
    }
    fs.settle().unwrap();
    d.snapshot_create("s3").unwrap();
    d.close().unwrap();
}

fn same_as_sender(src: &Path, dst: &Path, name: &str) {
    let a = snapshot_tree(src, name);
    let b = snapshot_tree(dst, name);
    assert_eq!(a.canonical_dump(), b.canonical_dump(), "snapshot {name}");
    assert!(history::diff_trees(&a, &b).is_empty(), "snapshot {name}");
    assert_eq!(tree_sum(&a), tree_sum(&b));
}

#[test]
fn full_and_incremental_round_trips_rebuild_the_snapshots() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    let dst = t.path().join("dst");
    source(&src);

    let full = send_to_vec(&src, "s1", None);
    let rep = receive(&dst, &full).unwrap();
    assert_eq!(rep.header.name, "s1");
    same_as_sender(&src, &dst, "s1");
    // Nothing but the data directory is left beside it.
    let names: Vec<_> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");

    let inc = send_to_vec(&src, "s2", Some("s1"));
    let rep = receive(&dst, &inc).unwrap();
    assert!(rep.records > 0);
    same_as_sender(&src, &dst, "s2");
    let inc = send_to_vec(&src, "s3", Some("s2"));
    receive(&dst, &inc).unwrap();
    same_as_sender(&src, &dst, "s3");

    // The received directory opens as a file system at s3, and keeps working.
    let d = open(&dst);
    assert_eq!(
        d.fs().canonical_dump(),
        snapshot_tree(&src, "s3").canonical_dump()
    );
    d.fs()
        .write_file(Ctx::ROOT, ROOT_INO, "/after", b"x")
        .unwrap();
    d.fs().settle().unwrap();
    assert_eq!(snapshot_names(&d), ["s1", "s2", "s3"]);
    d.close().unwrap();
    let d = open(&dst);
    assert!(d.fs().check_consistency().is_empty());
    d.fs().resolve(ROOT_INO, "/after", true).unwrap();
}

#[test]
fn an_incremental_stream_straight_from_a_full_one_skips_nothing() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    let dst = t.path().join("dst");
    source(&src);
    // From s1 straight to s3: more commits in one stream.
    receive(&dst, &send_to_vec(&src, "s1", None)).unwrap();
    receive(&dst, &send_to_vec(&src, "s3", Some("s1"))).unwrap();
    same_as_sender(&src, &dst, "s3");
    // s3 has a checkpoint at its commit (the close's): streamed as it is,
    // without a TreeSum; s1 has none and is rebuilt, with one.
    let mut sink = Vec::new();
    assert_eq!(
        send::send(&src, "s3", None, &mut sink).unwrap().tree.nodes,
        0
    );
    assert!(send::send(&src, "s1", None, &mut sink).unwrap().tree.nodes > 1);
    // A full stream of a later snapshot, into an empty directory that exists.
    let empty = t.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    receive(&empty, &send_to_vec(&src, "s3", None)).unwrap();
    same_as_sender(&src, &empty, "s3");
}

fn assert_refused(dir: &Path, stream: &[u8], what: &str, want: &[&str]) {
    let before = files(dir);
    let err = receive(dir, stream)
        .err()
        .unwrap_or_else(|| panic!("{what}: accepted"))
        .to_string();
    assert!(
        want.iter().any(|w| err.contains(w)),
        "{what}: unexpected error {err}"
    );
    assert_eq!(files(dir), before, "{what}: the directory changed");
    if let Some(parent) = dir.parent() {
        for e in std::fs::read_dir(parent).unwrap() {
            let n = e.unwrap().file_name();
            assert!(
                !n.to_string_lossy().contains(".receive-"),
                "{what}: staging left behind: {n:?}"
            );
        }
    }
}

#[test]
fn truncated_and_damaged_streams_are_refused_and_change_nothing() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    source(&src);
    let full = send_to_vec(&src, "s1", None);
    let inc = send_to_vec(&src, "s2", Some("s1"));
    let fresh = t.path().join("fresh");
    let base = t.path().join("base");
    receive(&base, &full).unwrap();

    for (stream, dir, kind) in [(&full, &fresh, "full"), (&inc, &base, "incremental")] {
        let n = stream.len();
        for cut in [0, 5, 12, 20, n / 3, n / 2, n - 60, n - 1] {
            assert_refused(
                dir,
                &stream[..cut],
                &format!("{kind} cut at {cut} of {n}"),
                &["truncated", "ends", "too short"],
            );
        }
        for at in [9, 14, 30, 100, n / 4, n / 2, n - 30, n - 2] {
            let mut bad = stream.clone();
            bad[at] ^= 0x10;
            assert_refused(
                dir,
                &bad,
                &format!("{kind} bit flipped at {at} of {n}"),
                &["damaged", "version", "magic", "checksum"],
            );
        }
        let mut longer = stream.clone();
        longer.push(0);
        assert_refused(
            dir,
            &longer,
            &format!("{kind} with a byte more"),
            &["follow"],
        );
    }
    assert!(!fresh.exists());

    let mut v2 = full.clone();
    v2[8..12].copy_from_slice(&(STREAM_VERSION + 1).to_le_bytes());
    assert_refused(&fresh, &v2, "next version", &["version 2"]);
    assert_refused(&fresh, b"#!/bin/sh\necho hi\n", "not a stream", &["magic"]);
    // Still good after all that.
    receive(&base, &inc).unwrap();
    same_as_sender(&src, &base, "s2");
}

#[test]
fn streams_that_do_not_apply_are_refused_and_change_nothing() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    source(&src);
    let s1 = send_to_vec(&src, "s1", None);
    let s2_from_s1 = send_to_vec(&src, "s2", Some("s1"));
    let s3_from_s2 = send_to_vec(&src, "s3", Some("s2"));

    // Incremental into nothing, or into a directory whose latest is not BASE.
    let none = t.path().join("none");
    assert_refused(&none, &s2_from_s1, "no directory", &["does not exist"]);
    let dst = t.path().join("dst");
    receive(&dst, &s1).unwrap();
    assert_refused(&dst, &s3_from_s2, "wrong base", &["latest snapshot"]);
    // A full stream into a directory that has contents.
    assert_refused(&dst, &s1, "full into non-empty", &["not empty"]);

    // Another tree under the same snapshot name and commit.
    let s1_commit = History::load(&dst).unwrap().snapshots[0].commit;
    let alias = t.path().join("alias");
    {
        let d = open(&alias);
        let fs = d.fs().clone();
        while d.last_commit() < s1_commit {
            fs.write_file(Ctx::ROOT, ROOT_INO, "/x", b"other").unwrap();
            fs.settle().unwrap();
        }
        d.snapshot_create("s1").unwrap();
        d.close().unwrap();
    }
    assert_refused(
        &alias,
        &s2_from_s1,
        "same name, other tree",
        &["different trees"],
    );

    // A directory changed since BASE.
    {
        let d = open(&dst);
        d.fs()
            .write_file(Ctx::ROOT, ROOT_INO, "/local", b"x")
            .unwrap();
        d.fs().settle().unwrap();
        d.close().unwrap();
    }
    assert_refused(&dst, &s2_from_s1, "changed since base", &["changed since"]);

    // A directory in use.
    let d = open(&dst);
    let err = receive(&dst, &s2_from_s1).err().unwrap().to_string();
    assert!(err.contains("in use"), "{err}");
    let mut sink = Vec::new();
    let err = send::send(&dst, "s1", None, &mut sink)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("in use"), "{err}");
    drop(d);

    // The sender names snapshots that exist, older first.
    let err = send::send(&src, "nope", None, &mut sink)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("no snapshot named"), "{err}");
    let err = send::send(&src, "s1", Some("s2"), &mut sink)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("newer"), "{err}");
}

#[test]
fn a_crash_inside_the_incremental_commit_leaves_the_base() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    source(&src);
    let dst = t.path().join("dst");
    receive(&dst, &send_to_vec(&src, "s1", None)).unwrap();
    let s1 = snapshot_tree(&dst, "s1").canonical_dump();
    // The hook panics where a crash would stop the process: records in the
    // journal, snapshot named, intent not cleared.
    let inc = send_to_vec(&src, "s2", Some("s1"));
    let r = std::panic::catch_unwind(|| {
        let mut inp: &[u8] = &inc;
        let o = ReceiveOptions {
            before_commit_point: Some(|| panic!("simulated crash")),
        };
        let _ = send::receive(&dst, &mut inp, o);
    });
    assert!(r.is_err());
    // The next open finishes the intent: back at s1, s2 not named.
    let d = open(&dst);
    assert_eq!(d.fs().canonical_dump(), s1);
    assert_eq!(snapshot_names(&d), ["s1"]);
    d.close().unwrap();
    // And the stream still applies.
    receive(&dst, &inc).unwrap();
    same_as_sender(&src, &dst, "s2");
}

/// The payload of a snapshot (checkpoint) file, its chunks checked.
fn checkpoint_payload(path: &Path) -> Vec<u8> {
    use std::io::Read;
    let mut r = memfs_journal::CheckpointReader::open(path).unwrap();
    let mut v = Vec::new();
    r.read_to_end(&mut v).unwrap();
    r.finish().unwrap();
    v
}

#[test]
fn a_full_receive_keeps_the_streams_image_as_its_checkpoint() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    source(&src);
    let h = History::load(&src).unwrap();
    let s3 = h.snapshots.iter().find(|s| s.name == "s3").unwrap().commit;
    let name = memfs_journal::checkpoint::checkpoint_file_name(s3);

    // s3 has a checkpoint at its commit: the stream is that image, with no
    // TreeSum, so none is computed, and the received checkpoint holds the
    // very same image bytes (written as they arrived, not re-serialized).
    let dst = t.path().join("dst");
    let rep = receive(&dst, &send_to_vec(&src, "s3", None)).unwrap();
    assert_eq!(rep.tree, None);
    assert!(checkpoint_payload(&dst.join(&name)) == checkpoint_payload(&src.join(&name)));
    same_as_sender(&src, &dst, "s3");

    // s1 is rebuilt by the sender: its trailer has a TreeSum, checked.
    let dst1 = t.path().join("dst1");
    let rep = receive(&dst1, &send_to_vec(&src, "s1", None)).unwrap();
    assert_eq!(rep.tree, Some(tree_sum(&snapshot_tree(&src, "s1"))));
    same_as_sender(&src, &dst1, "s1");

    // Stopped after the checkpoint was written and synced but before it
    // got a name: no directory, and nothing beside it.
    let mut before: Vec<_> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    before.sort();
    let dst2 = t.path().join("dst2");
    let full = send_to_vec(&src, "s3", None);
    let r = std::panic::catch_unwind(|| {
        let mut inp: &[u8] = &full;
        let o = ReceiveOptions {
            before_commit_point: Some(|| panic!("simulated crash")),
        };
        let _ = send::receive(&dst2, &mut inp, o);
    });
    assert!(r.is_err());
    let mut after: Vec<_> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    after.sort();
    assert_eq!(before, after);
    receive(&dst2, &full).unwrap();
    same_as_sender(&src, &dst2, "s3");
}
