//! `memfs send` from a volume and `memfs receive` into one, through the
//! binary, on a real local Redis Cluster (3 masters, no replicas: nothing
//! here fails over, and the cluster then starts in seconds; it is stopped
//! when the test ends, passes or panics, by `LocalCluster`'s Drop).
//!
//! A tree made in a data directory (data, a sparse file, a hard link, a
//! symlink, xattrs, a private directory, a setuid file of another owner, a
//! fifo, a device, a fixed mtime) goes `memfs send S --data-dir D | memfs
//! receive --cluster URL --volume V`, then `memfs send --cluster URL
//! --volume V | memfs receive --data-dir D2`; the canonical dumps (paths,
//! types, modes, owners, link counts, sizes, mtimes and ctimes, rdev,
//! targets, xattrs, the hash and page count of each file's data) of S, of
//! the volume and of D2 are equal, and D2 takes further commits. Then the
//! refusals: a non-empty volume, a truncated and a damaged stream, an
//! incremental stream, a tree with an inode flag; each changes nothing.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::{disk_dir, failed, memfs, memfs_bin, ok, sync_options};
use memfs_cluster::{Volume, VolumeOptions};
use memfs_durable::history::{materialize, materialize_config};
use memfs_durable::{self as durable, DurableFs, FsCheck};
use memfs_fs::{Ctx, ROOT_INO, SetAttr, SetTime, Timespec, XattrMode};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The tree of snapshot s1 in `dir`, made in process (what is moved is the
/// subject here, not how it was made).
fn source(dir: &Path) {
    let (d, _) = DurableFs::open(dir, materialize_config(), sync_options()).unwrap();
    let fs = d.fs().clone();
    let c = Ctx::ROOT;
    fs.mkdir_all(c, ROOT_INO, "/d", 0o755).unwrap();
    let f1 = fs.write_file(c, ROOT_INO, "/d/f1", b"hello").unwrap().ino;
    fs.setxattr(f1, b"user.color", b"blue", XattrMode::Create)
        .unwrap();
    fs.setxattr(f1, b"trusted.note", b"", XattrMode::Create)
        .unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8 + 1).collect();
    fs.write_file(c, ROOT_INO, "/d/big", &big).unwrap();
    fs.link_path(ROOT_INO, "/d/big", "/d/hard").unwrap();
    fs.symlink_path(c, ROOT_INO, "d/f1", "/link").unwrap();
    // Sparse: a page at 0 and one 10 MiB further, nothing between.
    let sp = fs.write_file(c, ROOT_INO, "/sparse", b"head").unwrap().ino;
    fs.write(c, sp, 10 << 20, b"tail", false).unwrap();
    let private = fs.mkdir_all(c, ROOT_INO, "/private", 0o700).unwrap();
    let secret = fs.write_file(c, ROOT_INO, "/private/s", b"x").unwrap().ino;
    let owner = SetAttr {
        uid: Some(1000),
        gid: Some(1000),
        ..SetAttr::default()
    };
    fs.setattr(c, secret, &owner).unwrap();
    let mode = SetAttr {
        mode: Some(0o4750),
        mtime: Some(SetTime::At(Timespec {
            sec: 1_000_000_000,
            nsec: 123,
        })),
        ..SetAttr::default()
    };
    fs.setattr(c, secret, &mode).unwrap();
    fs.setattr(c, private, &owner).unwrap();
    fs.mknod(c, ROOT_INO, b"fifo", libc::S_IFIFO | 0o644, 0)
        .unwrap();
    let rdev = libc::makedev(1, 3) as u32;
    fs.mknod(c, ROOT_INO, b"null", libc::S_IFCHR | 0o666, rdev)
        .unwrap();
    fs.settle().unwrap();
    d.snapshot_create("s1").unwrap();
    fs.write_file(c, ROOT_INO, "/later", b"after s1").unwrap();
    fs.settle().unwrap();
    d.snapshot_create("s2").unwrap();
    d.close().unwrap();
}

/// The canonical dump of snapshot `name` of an unmounted data directory.
fn dump_of(dir: &Path, name: &str) -> Vec<String> {
    let h = durable::History::load(dir).unwrap();
    let c = h.snapshots.iter().find(|x| x.name == name).unwrap().commit;
    materialize(dir, c, materialize_config())
        .unwrap()
        .canonical_dump()
}

/// The canonical dump of a volume, read through a session of this process.
fn volume_dump(urls: &[String], name: &str) -> Vec<String> {
    let vol = Volume::open(urls, name, &VolumeOptions::default()).unwrap();
    let fs = memfs_cluster::volume_to_fs(&vol).unwrap();
    vol.close().unwrap();
    fs.canonical_dump()
}

/// `memfs A... | memfs B...`: both outputs.
fn pipe(a: &[&str], b: &[&str]) -> (Output, Output) {
    let mut left = Command::new(memfs_bin())
        .args(a)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = left.stdout.take().unwrap();
    let right = Command::new(memfs_bin())
        .args(b)
        .stdin(out)
        .output()
        .unwrap();
    (left.wait_with_output().unwrap(), right)
}

fn receive_file(args: &[&str], file: &Path) -> Output {
    Command::new(memfs_bin())
        .args(args)
        .stdin(std::fs::File::open(file).unwrap())
        .output()
        .unwrap()
}

#[test]
fn a_tree_moves_to_a_volume_and_back_and_bad_streams_change_nothing() {
    let cluster = common::cluster_without_replicas();
    let urls = cluster.urls();
    let spec = format!("{},{}", urls[0], cluster.addr(1));
    let t = disk_dir("memfs-vsend-");
    let src = t.path().join("src");
    source(&src);
    let want = dump_of(&src, "s1");
    // The tree is what the comparisons below are about.
    let rdev = libc::makedev(1, 3) as u32;
    for line in [
        "/d/hard = /d/big".to_string(),
        "/private Directory 700 1000:1000 n2 ".into(),
        "/private/s RegularFile 4750 1000:1000 n1 s1 m1000000000.123 ".into(),
        "/fifo NamedPipe 644 ".into(),
        "/null CharDevice 666 ".into(),
        "/link Symlink ".into(),
        format!("/sparse RegularFile 644 0:0 n1 s{} ", (10 << 20) + 4),
    ] {
        assert!(
            want.iter().any(|l| l.starts_with(&line)),
            "{line}: {want:#?}"
        );
    }
    assert!(
        want.iter().any(|l| l.contains(&format!(" r{rdev}"))),
        "{want:#?}"
    );
    assert!(
        want.iter().any(|l| l.contains("x[user.color=blue]")),
        "{want:#?}"
    );
    assert!(want.iter().any(|l| l.ends_with(" p2")), "{want:#?}");

    // Data directory → a volume that does not exist yet: created.
    let into_v1 = ["receive", "--cluster", &spec, "--volume", "v1"];
    let (l, r) = pipe(&["send", "s1", "--data-dir", s(&src)], &into_v1);
    ok(l);
    let err = String::from_utf8_lossy(&r.stderr).into_owned();
    ok(r);
    assert!(err.contains("received snapshot s1 into volume v1"), "{err}");
    assert_eq!(volume_dump(&urls, "v1"), want);

    // The volume's block map keeps the hole: data, then a hole from the
    // end of the first block (64 KiB) to the last one.
    {
        let vol = Volume::open(&urls, "v1", &VolumeOptions::default()).unwrap();
        let ino = vol.lookup(ROOT_INO, b"sparse").unwrap().ino;
        assert_eq!(vol.lseek(ino, 0, libc::SEEK_HOLE).unwrap(), 65536);
        let data = vol.lseek(ino, 65536, libc::SEEK_DATA).unwrap();
        assert_eq!(data, (10 << 20) / 65536 * 65536);
        vol.close().unwrap();
    }

    // And back: volume → a new data directory, by a pipe and by -o FILE.
    let dst = t.path().join("dst");
    let (l, r) = pipe(
        &["send", "--cluster", &spec, "--volume", "v1"],
        &["receive", "--data-dir", s(&dst)],
    );
    let err = String::from_utf8_lossy(&l.stderr).into_owned();
    ok(l);
    ok(r);
    assert!(err.contains("as snapshot v1"), "{err}");
    assert_eq!(dump_of(&dst, "v1"), want);
    let file = t.path().join("v1.stream");
    ok(memfs([
        "send",
        "back",
        "--cluster",
        &spec,
        "--volume",
        "v1",
        "-o",
        s(&file),
    ]));
    let dst2 = t.path().join("dst2");
    ok(receive_file(&["receive", "--data-dir", s(&dst2)], &file));
    assert_eq!(dump_of(&dst2, "back"), want);
    // The received directory is a data directory like any other: its
    // journal goes on after the stream's commit, and keeps what it is given.
    let list = ok(memfs(["snapshot", "list", "--data-dir", s(&dst2)]));
    assert!(list.contains("back"), "{list}");
    {
        let (d, _) = DurableFs::open(&dst2, materialize_config(), sync_options()).unwrap();
        d.fs()
            .write_file(Ctx::ROOT, ROOT_INO, "/new", b"after")
            .unwrap();
        d.fs().settle().unwrap();
        d.close().unwrap();
        let (d, _) = DurableFs::open(&dst2, materialize_config(), sync_options()).unwrap();
        assert_eq!(d.fs().read_file(ROOT_INO, "/new").unwrap(), b"after");
        d.close().unwrap();
    }

    // A non-empty volume is refused, and keeps what it had.
    let e = failed(receive_file(&into_v1, &file));
    assert!(e.contains("not empty"), "{e}");
    assert_eq!(volume_dump(&urls, "v1"), want);

    // Damaged or truncated streams: refused before the volume is touched,
    // so a missing volume is not created and an empty one stays empty.
    let bytes = std::fs::read(&file).unwrap();
    let cut = t.path().join("cut");
    std::fs::write(&cut, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let e = failed(receive_file(
        &["receive", "--cluster", &spec, "--volume", "v2"],
        &cut,
    ));
    assert!(e.contains("truncated"), "{e}");
    let vols = ok(memfs(["volume", "list", "--cluster", &spec]));
    assert_eq!(vols, "v1\n");

    ok(memfs(["volume", "create", "v3", "--cluster", &spec]));
    let empty = volume_dump(&urls, "v3");
    assert_eq!(empty.len(), 1, "{empty:?}");
    let mut bad = bytes.clone();
    let at = bad.len() / 2;
    bad[at] ^= 0x10;
    let damaged = t.path().join("damaged");
    std::fs::write(&damaged, &bad).unwrap();
    let into_v3 = ["receive", "--cluster", &spec, "--volume", "v3"];
    let e = failed(receive_file(&into_v3, &damaged));
    assert!(e.contains("damaged"), "{e}");
    assert_eq!(volume_dump(&urls, "v3"), empty);

    // An incremental stream needs its base: a volume has none.
    let inc = t.path().join("inc");
    ok(memfs([
        "send",
        "s2",
        "--from",
        "s1",
        "--data-dir",
        s(&src),
        "-o",
        s(&inc),
    ]));
    let e = failed(receive_file(&into_v3, &inc));
    assert!(e.contains("incremental"), "{e}");
    assert_eq!(volume_dump(&urls, "v3"), empty);
    let e = failed(memfs([
        "send",
        "s2",
        "--from",
        "s1",
        "--cluster",
        &spec,
        "--volume",
        "v1",
    ]));
    assert!(e.contains("cannot be used with"), "{e}");

    // What a volume does not keep (here an inode flag) is refused before
    // anything is written: no volume is created.
    let odd = t.path().join("odd");
    {
        let (d, _) = DurableFs::open(&odd, materialize_config(), sync_options()).unwrap();
        let ino = d
            .fs()
            .write_file(Ctx::ROOT, ROOT_INO, "/f", b"x")
            .unwrap()
            .ino;
        d.fs()
            .set_flags(Ctx::ROOT, ino, memfs_fs::FS_NODUMP_FL)
            .unwrap();
        d.fs().settle().unwrap();
        d.snapshot_create("f").unwrap();
        d.close().unwrap();
    }
    let (l, r) = pipe(
        &["send", "f", "--data-dir", s(&odd)],
        &["receive", "--cluster", &spec, "--volume", "v4"],
    );
    ok(l);
    let e = failed(r);
    assert!(e.contains("inode flags"), "{e}");
    let vols = ok(memfs(["volume", "list", "--cluster", &spec]));
    assert_eq!(vols, "v1\nv3\n");

    let e = failed(memfs(["send", "--cluster", &spec, "--volume", "none"]));
    assert!(e.contains("no volume \"none\""), "{e}");

    // The empty volume takes the stream afterwards.
    ok(receive_file(&into_v3, &file));
    assert_eq!(volume_dump(&urls, "v3"), want);
}
