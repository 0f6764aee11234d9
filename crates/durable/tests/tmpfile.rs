//! `O_TMPFILE` files on the durable file system: one linked before the
//! restart comes back with its data, from the journal or from a checkpoint
//! taken while it had no name; one never linked leaves nothing behind.

use std::path::Path;

use memfs_durable::{self as durable, DurableFs, Options};
use memfs_fs::{Config, Ctx, ROOT_INO};

const C: Ctx = Ctx::ROOT;

fn open(dir: &Path) -> DurableFs {
    let opts = Options {
        durability: durable::parse_durability("sync").unwrap(),
        checkpoint_interval: None,
        checkpoint_bytes: u64::MAX,
        retention: "all".parse().unwrap(),
        segment_size: 1 << 20,
    };
    let config = Config {
        capacity: 1 << 30,
        max_inodes: 1 << 20,
    };
    DurableFs::open(dir, config, opts).unwrap().0
}

fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

/// Compares file contents without printing them on failure.
fn same(got: &[u8], want: &[u8]) {
    let first_diff = got.iter().zip(want).position(|(a, b)| a != b);
    assert!(
        got.len() == want.len() && first_diff.is_none(),
        "read {} bytes, wanted {}; first difference at {first_diff:?}",
        got.len(),
        want.len()
    );
}

#[test]
fn a_linked_tmpfile_survives_a_restart_from_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let ino = {
        let d = open(dir.path());
        let fs = d.fs();
        let a = fs.tmpfile(C, ROOT_INO, 0o640, false).unwrap();
        fs.write(C, a.ino, 0, &data(50_000), false).unwrap();
        fs.link(a.ino, ROOT_INO, b"kept").unwrap();
        fs.settle().unwrap();
        a.ino
    };
    let d = open(dir.path());
    let fs = d.fs();
    let f = fs.lookup_noref(ROOT_INO, b"kept").unwrap();
    assert_eq!((f.ino, f.nlink, f.perm, f.size), (ino, 1, 0o640, 50_000));
    same(&fs.read_vec(ino, 0, 60_000).unwrap(), &data(50_000));
}

#[test]
fn a_tmpfile_linked_after_a_checkpoint_keeps_the_data_written_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let ino = {
        let d = open(dir.path());
        let fs = d.fs().clone();
        let a = fs.tmpfile(C, ROOT_INO, 0o600, false).unwrap();
        fs.write(C, a.ino, 0, &data(300_000), false).unwrap();
        // The image is copied while the file has no name; only the link
        // comes after it, in the journal.
        d.checkpoint().unwrap().expect("a checkpoint was written");
        fs.link(a.ino, ROOT_INO, b"late").unwrap();
        fs.settle().unwrap();
        a.ino
    };
    let d = open(dir.path());
    let fs = d.fs();
    assert_eq!(fs.lookup_noref(ROOT_INO, b"late").unwrap().ino, ino);
    same(&fs.read_vec(ino, 0, 400_000).unwrap(), &data(300_000));
}

#[test]
fn unlinked_tmpfiles_leave_nothing_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (before, inos) = {
        let d = open(dir.path());
        let fs = d.fs().clone();
        let before = fs.statfs();
        let plain = fs.tmpfile(C, ROOT_INO, 0o600, false).unwrap();
        let excl = fs.tmpfile(C, ROOT_INO, 0o600, true).unwrap();
        for a in [plain, excl] {
            fs.write(C, a.ino, 0, &data(100_000), false).unwrap();
        }
        // One checkpoint holds the linkable one (nameless), the journal
        // after it more writes; neither file is ever linked, and both are
        // still open when the file system goes away.
        d.checkpoint().unwrap().expect("a checkpoint was written");
        for a in [plain, excl] {
            fs.write(C, a.ino, 100_000, b"more", false).unwrap();
        }
        fs.settle().unwrap();
        (before, [plain.ino, excl.ino])
    };
    let d = open(dir.path());
    let fs = d.fs();
    for ino in inos {
        assert!(fs.getattr(ino).is_err(), "inode {ino} came back");
    }
    let after = fs.statfs();
    assert_eq!((after.bfree, after.ffree), (before.bfree, before.ffree));
    // And once more through a checkpoint of the recovered state.
    d.checkpoint().unwrap();
    drop(d);
    let d = open(dir.path());
    let after = d.fs().statfs();
    assert_eq!((after.bfree, after.ffree), (before.bfree, before.ffree));
}
