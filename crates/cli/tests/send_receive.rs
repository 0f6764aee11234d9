//! `memfs send` / `memfs receive` through the binary: full and incremental
//! round trips compared with `diff -r` between two mounts, refusals of
//! mounted directories and of a truncated stream, and SIGKILL of a receive
//! while it reads and inside its commit step: the receiving directory is
//! the old state afterwards.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use memfs_durable::{DurableFs, FsCheck};
use memfs_fs::{Ctx, ROOT_INO, RenameFlags};

mod common;
use common::{Mount, disk_dir, failed, memfs, memfs_bin, ok, sync_options};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `memfs send ... > file`.
fn send(data: &Path, name: &str, from: Option<&str>, file: &Path) {
    let mut args = vec!["send", name, "--data-dir", s(data)];
    if let Some(f) = from {
        args.extend(["--from", f]);
    }
    let out = std::fs::File::create(file).unwrap();
    let o = Command::new(memfs_bin())
        .args(&args)
        .stdout(out)
        .output()
        .unwrap();
    ok(o);
}

/// `memfs receive --data-dir D < file`.
fn receive(data: &Path, file: &Path) -> Output {
    Command::new(memfs_bin())
        .args(["receive", "--data-dir", s(data)])
        .stdin(std::fs::File::open(file).unwrap())
        .output()
        .unwrap()
}

fn mount(data: &Path) -> Mount {
    Mount::with_args(&["--data-dir", s(data)])
}

fn diff_r(a: &Path, b: &Path) {
    let o = Command::new("diff")
        .args(["-r", "--no-dereference"])
        .arg(a)
        .arg(b)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "diff -r found differences:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn snapshots(data: &Path) -> String {
    ok(memfs(["snapshot", "list", "--data-dir", s(data)]))
}

#[test]
fn full_and_incremental_round_trips_through_mounts_compare_equal() {
    let t = disk_dir("memfs-send-");
    let src = t.path().join("src");
    let dst = t.path().join("dst");
    let stream = t.path().join("stream");

    let m = mount(&src);
    std::fs::create_dir_all(m.p("d/e")).unwrap();
    std::fs::write(m.p("a"), b"first").unwrap();
    std::fs::write(m.p("d/c"), b"moves").unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(m.p("d/big"), &big).unwrap();
    std::os::unix::fs::symlink("d/c", m.p("link")).unwrap();
    std::fs::hard_link(m.p("d/big"), m.p("hard")).unwrap();
    m.unmount();
    ok(memfs(["snapshot", "create", "s1", "--data-dir", s(&src)]));

    send(&src, "s1", None, &stream);
    let o = receive(&dst, &stream);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    ok(o);
    assert!(err.contains("received snapshot s1"), "{err}");
    assert!(snapshots(&dst).contains("s1"));
    {
        let a = mount(&src);
        let b = mount(&dst);
        diff_r(&a.path(), &b.path());
        // Mounted directories are refused, both ways.
        let e = failed(receive(&dst, &stream));
        assert!(e.contains("in use by a running memfs"), "{e}");
        let e = failed(memfs(["send", "s1", "--data-dir", s(&src)]));
        assert!(e.contains("in use by a running memfs"), "{e}");
        a.unmount();
        b.unmount();
    }

    let m = mount(&src);
    std::fs::write(m.p("a"), b"FIRST and more").unwrap();
    std::fs::rename(m.p("d/c"), m.p("d/e/c2")).unwrap();
    std::fs::remove_file(m.p("hard")).unwrap();
    std::fs::create_dir_all(m.p("new/deep")).unwrap();
    std::fs::write(m.p("new/deep/f"), b"fresh").unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(m.p("d/big"))
        .unwrap();
    std::os::unix::fs::FileExt::write_at(&f, b"patched", 1_000_000).unwrap();
    drop(f);
    m.unmount();
    ok(memfs(["snapshot", "create", "s2", "--data-dir", s(&src)]));
    send(&src, "s2", Some("s1"), &stream);
    ok(receive(&dst, &stream));
    let list = snapshots(&dst);
    assert!(list.contains("s1") && list.contains("s2"), "{list}");
    let a = mount(&src);
    let b = mount(&dst);
    diff_r(&a.path(), &b.path());
    assert_eq!(std::fs::read(b.p("new/deep/f")).unwrap(), b"fresh");
    a.unmount();
    b.unmount();
}

/// A source directory with snapshots s1 and s2 (built in process: faster
/// than through a mount, and the mount is not what these tests are about).
fn source(dir: &Path) {
    let (d, _) = DurableFs::open(
        dir,
        memfs_durable::history::materialize_config(),
        sync_options(),
    )
    .unwrap();
    let fs = d.fs().clone();
    let c = Ctx::ROOT;
    fs.mkdir_all(c, ROOT_INO, "/d", 0o755).unwrap();
    for i in 0..20 {
        let data = vec![i as u8; 100_000 + i * 1000];
        fs.write_file(c, ROOT_INO, &format!("/d/f{i}"), &data)
            .unwrap();
    }
    fs.settle().unwrap();
    d.snapshot_create("s1").unwrap();
    for i in 0..20 {
        let data = vec![(i + 100) as u8; 50_000];
        fs.write_file(c, ROOT_INO, &format!("/d/g{i}"), &data)
            .unwrap();
    }
    fs.rename_path(ROOT_INO, "/d/f0", "/moved", RenameFlags::default())
        .unwrap();
    fs.settle().unwrap();
    d.snapshot_create("s2").unwrap();
    d.close().unwrap();
}

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

/// A `memfs receive` child, killed and reaped however the test ends.
struct Receiver(Child);

impl Receiver {
    fn spawn(data: &Path, stall: bool) -> Receiver {
        let mut c = Command::new(memfs_bin());
        c.args(["receive", "--data-dir", s(data)])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped());
        if stall {
            c.env("MEMFS_TEST_RECEIVE_STALL", "1");
        }
        Receiver(c.spawn().unwrap())
    }

    fn sigkill(&mut self) {
        self.0.kill().unwrap();
        let st = self.0.wait().unwrap();
        assert!(!st.success());
    }

    /// Feeds a whole stream to a stalling receive, waits until it reports
    /// that it stands at the commit point, and kills it there.
    fn kill_at_commit_point(data: &Path, stream: &[u8]) {
        let mut r = Receiver::spawn(data, true);
        r.0.stdin.as_mut().unwrap().write_all(stream).unwrap();
        drop(r.0.stdin.take());
        let mut err = BufReader::new(r.0.stderr.take().unwrap());
        let mut line = String::new();
        err.read_line(&mut line).unwrap();
        assert!(line.contains("stalled before the commit point"), "{line}");
        r.sigkill();
    }
}

/// The entries of `dir` a receive left beside its destination.
fn receive_leftovers(dir: &Path) -> Vec<std::ffi::OsString> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains("receive"))
        .collect()
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn dump(dir: &Path) -> Vec<String> {
    let (d, _) = DurableFs::open(
        dir,
        memfs_durable::history::materialize_config(),
        sync_options(),
    )
    .unwrap();
    let out = d.fs().canonical_dump();
    d.close().unwrap();
    out
}

#[test]
fn sigkill_of_a_receive_leaves_the_old_state() {
    let t = disk_dir("memfs-send-");
    let src = t.path().join("src");
    source(&src);
    let full = t.path().join("full");
    let inc = t.path().join("inc");
    send(&src, "s1", None, &full);
    send(&src, "s2", Some("s1"), &inc);
    let full_bytes = std::fs::read(&full).unwrap();
    let inc_bytes = std::fs::read(&inc).unwrap();

    // A truncated stream through the command: refused, nothing created.
    let fresh = t.path().join("fresh");
    let cut = t.path().join("cut");
    std::fs::write(&cut, &full_bytes[..full_bytes.len() / 2]).unwrap();
    let e = failed(receive(&fresh, &cut));
    assert!(e.contains("truncated"), "{e}");
    assert!(!fresh.exists());

    // Killed while reading a full stream: the directory never appears.
    let mut r = Receiver::spawn(&fresh, false);
    r.0.stdin
        .as_mut()
        .unwrap()
        .write_all(&full_bytes[..full_bytes.len() / 2])
        .unwrap();
    r.sigkill();
    assert!(!fresh.exists());
    let leftovers = receive_leftovers(t.path());
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // Killed after the whole checkpoint was written, checked and synced,
    // before it got a name (it is an unnamed O_TMPFILE until then): still
    // no directory and nothing beside it.
    Receiver::kill_at_commit_point(&fresh, &full_bytes);
    assert!(!fresh.exists());
    let leftovers = receive_leftovers(t.path());
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let names: Vec<_> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names
            .iter()
            .all(|n| ["src", "full", "inc", "cut"].contains(&n.as_str())),
        "{names:?}"
    );

    let dst = t.path().join("dst");
    ok(receive(&dst, &full));
    let s1 = dump(&dst);
    let before_open = files(&dst);

    // Killed while reading an incremental stream: byte for byte unchanged.
    let mut r = Receiver::spawn(&dst, false);
    r.0.stdin
        .as_mut()
        .unwrap()
        .write_all(&inc_bytes[..inc_bytes.len() / 2])
        .unwrap();
    r.sigkill();
    assert_eq!(files(&dst), before_open);

    // Killed inside the commit step (records appended, snapshot named, the
    // intent not cleared yet): the next open is back at s1.
    Receiver::kill_at_commit_point(&dst, &inc_bytes);
    assert_eq!(dump(&dst), s1);
    let list = snapshots(&dst);
    assert!(list.contains("s1") && !list.contains("s2"), "{list}");

    // And the same stream applies afterwards.
    ok(receive(&dst, &inc));
    let want = {
        let h = memfs_durable::History::load(&src).unwrap();
        let c = h.snapshots.iter().find(|s| s.name == "s2").unwrap().commit;
        memfs_durable::history::materialize(&src, c, memfs_durable::history::materialize_config())
            .unwrap()
            .canonical_dump()
    };
    assert_eq!(dump(&dst), want);
}
