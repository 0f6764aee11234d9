//! `memfs clone NAME M2 --data-dir D` (issue 12, item 4): from a data
//! directory nobody serves (a new server rebuilds the snapshot's tree and
//! serves it in memory; D stays free and unchanged), from one a running
//! durable mount serves (its server mounts the clone, as with `--mount`),
//! and the refusals. Real mounts through the memfs binary.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::{Mount, disk_dir, failed, memfs, ok, poll_until, tree_dump as dump, xattr_set};

/// A tree with what a rebuild must get right: directories, a file of many
/// pages, a symlink, a hard link, an xattr, odd permissions, an empty file.
fn build_tree(root: &Path) {
    fs::create_dir_all(root.join("d/e")).unwrap();
    fs::write(root.join("d/a"), b"one").unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(root.join("d/e/big"), &big).unwrap();
    fs::write(root.join("gone"), b"removed after s1").unwrap();
    fs::write(root.join("empty"), b"").unwrap();
    fs::set_permissions(root.join("empty"), fs::Permissions::from_mode(0o640)).unwrap();
    std::os::unix::fs::symlink("d/a", root.join("link")).unwrap();
    fs::hard_link(root.join("d/a"), root.join("d/e/a-again")).unwrap();
    xattr_set(&root.join("d/a"), "user.color", b"blue");
}

/// Changes after the snapshot, so that it differs from the live tree.
fn change_tree(root: &Path) {
    fs::write(root.join("d/a"), b"two, longer").unwrap();
    fs::remove_file(root.join("gone")).unwrap();
    fs::rename(root.join("d/e/big"), root.join("big-moved")).unwrap();
    fs::create_dir(root.join("new-dir")).unwrap();
    fs::write(root.join("new-dir/n"), b"new after s1").unwrap();
    xattr_set(&root.join("d/a"), "user.color", b"green");
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn mount_durable(data: &Path) -> Mount {
    Mount::with_args(&["--data-dir", s(data)])
}

/// Whether process `pid` still runs (a zombie does not).
fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses.
        Ok(st) => st
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// A clone mounted by `memfs clone`: unmounted, and its own server (an
/// offline clone's) gone, in every path, panics included.
struct CloneMount {
    dir: tempfile::TempDir,
    /// The server of an offline clone (a clone served by the origin's
    /// server has none of its own).
    pid: Option<u32>,
    /// What `memfs clone` printed.
    out: String,
}

impl CloneMount {
    /// `memfs clone NAME M2 --data-dir D`, which must succeed.
    fn of_data_dir(name: &str, data: &Path) -> CloneMount {
        let dir = tempfile::Builder::new()
            .prefix("memfs-clone-")
            .tempdir()
            .unwrap();
        let path = dir.path().canonicalize().unwrap();
        let o = memfs(["clone", name, s(&path), "--data-dir", s(data)]);
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        // The pid first, so that the guard stops the server even if the
        // command's report is wrong.
        let pid = out
            .split("server pid ")
            .nth(1)
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|p| p.parse().ok());
        let c = CloneMount { dir, pid, out };
        assert!(
            o.status.success(),
            "memfs clone failed: {}{}",
            c.out,
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(c.out.contains("mounted at"), "{}", c.out);
        assert!(common::is_mount_point(&c.path()), "{}", c.out);
        c
    }

    fn path(&self) -> PathBuf {
        self.dir.path().canonicalize().unwrap()
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.path().join(rel)
    }

    /// `memfs umount M2`, which must succeed; an offline clone's server
    /// then exits by itself.
    fn umount(self) {
        ok(memfs(["umount", s(&self.path())]));
        assert!(!common::is_mount_point(&self.path()));
        if let Some(pid) = self.pid {
            poll_until("the clone's server to exit", || !alive(pid));
        }
    }
}

impl Drop for CloneMount {
    fn drop(&mut self) {
        let path = self.dir.path().to_path_buf();
        if common::is_mount_point(&path) {
            let _ = nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH);
        }
        if let Some(pid) = self.pid
            && alive(pid)
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

fn fsck_clean(data: &Path) {
    let out = ok(memfs(["fsck", "--data-dir", s(data)]));
    assert!(out.contains("clean"), "{out}");
}

/// D unmounted: the clone shows the snapshot's tree exactly, its writes
/// never reach D, D can be mounted (and changed) while the clone runs
/// without either seeing the other, and D is intact afterwards.
#[test]
fn a_clone_of_an_unmounted_data_directory_is_its_snapshot_and_leaves_it_alone() {
    let data = disk_dir("memfs-clonedd-");
    let m = mount_durable(data.path());
    build_tree(&m.path());
    let t1 = dump(&m.path());
    ok(memfs(["snapshot", "create", "s1", "--mount", s(&m.path())]));
    change_tree(&m.path());
    let t2 = dump(&m.path());
    assert_ne!(t1, t2);
    m.unmount();

    let c = CloneMount::of_data_dir("s1", data.path());
    assert!(c.pid.is_some(), "a server of its own: {}", c.out);
    assert!(c.out.contains("rebuilt"), "{}", c.out);
    assert_eq!(dump(&c.path()), t1);
    // Writable, and an in-memory mount of its own (snapshots work).
    fs::write(c.p("d/a"), b"clone").unwrap();
    fs::write(c.p("only-in-clone"), b"x").unwrap();
    fs::remove_file(c.p("gone")).unwrap();
    ok(memfs(["snapshot", "create", "c1", "--mount", s(&c.path())]));
    assert_eq!(fs::read(c.p(".snapshots/c1/d/a")).unwrap(), b"clone");
    assert_eq!(fs::read(c.p("d/e/a-again")).unwrap(), b"clone");
    let tc = dump(&c.path());

    // D is free while the clone runs: it mounts, as it was, and its
    // changes do not reach the clone.
    let m = mount_durable(data.path());
    assert_eq!(dump(&m.path()), t2);
    assert_eq!(dump(&m.p(".snapshots/s1")), t1);
    assert!(!m.p("only-in-clone").exists());
    fs::write(m.p("d/a"), b"origin, later").unwrap();
    fs::write(m.p("only-in-origin"), b"y").unwrap();
    assert_eq!(dump(&c.path()), tc);
    let t3 = dump(&m.path());
    m.unmount();

    c.umount();
    fsck_clean(data.path());
    let m = mount_durable(data.path());
    assert_eq!(dump(&m.path()), t3);
    assert_eq!(dump(&m.p(".snapshots/s1")), t1);
    m.unmount();
}

/// D served by a durable mount: its server mounts the clone (no server of
/// its own), isolated both ways; also for a snapshot not rebuilt since a
/// restart; the origin's unmount takes its clone.
#[test]
fn a_clone_of_a_mounted_data_directory_is_served_by_its_server() {
    let data = disk_dir("memfs-clonedd-on-");
    let m = mount_durable(data.path());
    build_tree(&m.path());
    let t1 = dump(&m.path());
    ok(memfs(["snapshot", "create", "s1", "--mount", s(&m.path())]));
    change_tree(&m.path());

    let c = CloneMount::of_data_dir("s1", data.path());
    assert!(c.pid.is_none(), "{}", c.out);
    assert!(c.out.contains("served by the memfs of"), "{}", c.out);
    assert_eq!(dump(&c.path()), t1);
    fs::write(c.p("d/a"), b"clone").unwrap();
    fs::write(c.p("only-in-clone"), b"x").unwrap();
    fs::write(m.p("d/a"), b"origin").unwrap();
    fs::write(m.p("only-in-origin"), b"y").unwrap();
    assert_eq!(fs::read(c.p("d/a")).unwrap(), b"clone");
    assert_eq!(fs::read(m.p("d/a")).unwrap(), b"origin");
    assert!(!c.p("only-in-origin").exists());
    assert!(!m.p("only-in-clone").exists());
    assert_eq!(fs::read(m.p(".snapshots/s1/d/a")).unwrap(), b"one");
    c.umount();
    let t2 = dump(&m.path());
    m.unmount();

    // After a restart s1 is only in HISTORY: the server rebuilds it aside.
    let m = mount_durable(data.path());
    assert_eq!(dump(&m.path()), t2);
    let c = CloneMount::of_data_dir("s1", data.path());
    assert!(c.pid.is_none(), "{}", c.out);
    assert_eq!(dump(&c.path()), t1);
    fs::write(c.p("d/a"), b"clone again").unwrap();
    assert_eq!(dump(&m.path()), t2);
    let cp = c.path();
    m.unmount();
    assert!(
        !common::is_mount_point(&cp),
        "the origin's unmount takes its clones"
    );
    drop(c);
    fsck_clean(data.path());
}

/// SIGTERM to an offline clone's server unmounts the clone, like a mount's.
#[test]
fn an_offline_clones_server_unmounts_on_sigterm() {
    let data = disk_dir("memfs-clonedd-term-");
    let m = mount_durable(data.path());
    fs::write(m.p("f"), b"v1").unwrap();
    ok(memfs(["snapshot", "create", "s1", "--mount", s(&m.path())]));
    m.unmount();
    let c = CloneMount::of_data_dir("s1", data.path());
    assert_eq!(fs::read(c.p("f")).unwrap(), b"v1");
    let pid = c.pid.expect("an offline clone has a server of its own");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    poll_until("the clone's server to exit", || !alive(pid));
    assert!(!common::is_mount_point(&c.path()));
}

#[test]
fn clone_refuses_bad_input_clearly() {
    let data = disk_dir("memfs-clonedd-err-");
    let d = s(data.path()).to_string();
    let m = mount_durable(data.path());
    fs::write(m.p("f"), b"v1").unwrap();
    ok(memfs(["snapshot", "create", "s1", "--mount", s(&m.path())]));
    let mp = s(&m.path()).to_string();
    let target = tempfile::tempdir().unwrap();
    let t = s(target.path()).to_string();

    // Online (D mounted): an unknown snapshot, a target already mounted.
    let e = failed(memfs(["clone", "nope", &t, "--data-dir", &d]));
    assert!(e.contains("no snapshot \"nope\""), "{e}");
    let e = failed(memfs(["clone", "nope", &t, "--mount", &mp]));
    assert!(e.contains("no snapshot \"nope\""), "{e}");
    let e = failed(memfs(["clone", "s1", &mp, "--data-dir", &d]));
    assert!(e.contains("already a mount point"), "{e}");
    m.unmount();

    // Neither or both of --mount and --data-dir.
    let e = failed(memfs(["clone", "s1", &t]));
    assert!(e.contains("--mount") && e.contains("--data-dir"), "{e}");
    let e = failed(memfs(["clone", "s1", &t, "--mount", &t, "--data-dir", &d]));
    assert!(e.contains("cannot be used with"), "{e}");
    // Offline: an unknown snapshot, a bad name.
    let e = failed(memfs(["clone", "nope", &t, "--data-dir", &d]));
    assert!(e.contains("no snapshot \"nope\""), "{e}");
    let e = failed(memfs(["clone", "a/b", &t, "--data-dir", &d]));
    assert!(e.contains("bad snapshot name"), "{e}");
    // D missing, D not a data directory (and left without a LOCK file).
    let e = failed(memfs([
        "clone",
        "s1",
        &t,
        "--data-dir",
        "/nonexistent/memfs",
    ]));
    assert!(e.contains("does not exist"), "{e}");
    let plain = tempfile::tempdir().unwrap();
    let e = failed(memfs(["clone", "s1", &t, "--data-dir", s(plain.path())]));
    assert!(e.contains("not a memfs data directory"), "{e}");
    assert_eq!(fs::read_dir(plain.path()).unwrap().count(), 0);
    // M2 missing, or a file.
    let missing = target.path().join("missing");
    let e = failed(memfs(["clone", "s1", s(&missing), "--data-dir", &d]));
    assert!(e.contains("does not exist"), "{e}");
    let file = target.path().join("file");
    fs::write(&file, b"").unwrap();
    let e = failed(memfs(["clone", "s1", s(&file), "--data-dir", &d]));
    assert!(e.contains("not a directory"), "{e}");
    // M2 already mounted (offline form: refused before a server starts).
    let other = Mount::new();
    let e = failed(memfs(["clone", "s1", s(&other.path()), "--data-dir", &d]));
    assert!(e.contains("already a mount point"), "{e}");
    other.unmount();

    assert!(!common::is_mount_point(target.path()));
    // Nothing above changed D.
    fsck_clean(data.path());
}

#[test]
fn clone_help_describes_both_forms() {
    let out = ok(memfs(["clone", "--help"]));
    for want in ["--data-dir", "--mount", "memfs umount M2", "rebuilds"] {
        assert!(out.contains(want), "{want} missing from:\n{out}");
    }
}
