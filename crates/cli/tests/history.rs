//! Time travel on a live mount, through the `memfs` binary and real system
//! calls: snapshots and diff of a running durable mount (`--mount`), the
//! clear refusal on an in-memory mount, and the snapshots surviving a
//! SIGKILL of the server.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output};

mod common;
use common::{Mount, memfs_bin};

fn disk_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("memfs-history-")
        .tempdir_in("/var/tmp")
        .expect("data directory under /var/tmp")
}

fn memfs<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    Command::new(memfs_bin()).args(args).output().unwrap()
}

fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "memfs failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn failed(o: Output) -> String {
    assert!(!o.status.success(), "memfs should have failed");
    String::from_utf8(o.stderr).unwrap()
}

fn mount_durable(data: &Path) -> Mount {
    Mount::with_args(&["--data-dir", data.to_str().unwrap()])
}

fn m(mnt: &Mount) -> String {
    mnt.path().to_str().unwrap().to_string()
}

#[test]
fn snapshots_and_diff_of_a_running_mount_survive_sigkill() {
    let data = disk_dir();
    let mut mnt = mount_durable(data.path());
    let mp = m(&mnt);
    std::fs::create_dir(mnt.p("d")).unwrap();
    std::fs::write(mnt.p("a"), b"first").unwrap();
    std::fs::write(mnt.p("b"), b"gone soon").unwrap();
    std::fs::write(mnt.p("d/c"), b"moves").unwrap();
    let out = ok(memfs(["snapshot", "create", "s1", "--mount", &mp]));
    assert!(out.contains("snapshot s1 created at commit"), "{out}");
    std::fs::write(mnt.p("a"), b"FIRST").unwrap();
    std::fs::remove_file(mnt.p("b")).unwrap();
    std::fs::rename(mnt.p("d/c"), mnt.p("d/c2")).unwrap();
    std::fs::write(mnt.p("new"), b"hello").unwrap();
    ok(memfs(["snapshot", "create", "s2", "--mount", &mp]));
    let err = failed(memfs(["snapshot", "create", "s2", "--mount", &mp]));
    assert!(err.contains("already exists"), "{err}");
    let list = ok(memfs(["snapshot", "list", "--mount", &mp]));
    assert!(list.contains("s1") && list.contains("s2"), "{list}");

    let diff = ok(memfs(["diff", "s1", "-", "--mount", &mp]));
    let lines: Vec<&str> = diff.lines().collect();
    assert_eq!(
        lines,
        ["M /", "M /a", "- /b", "M /d", "R /d/c -> /d/c2", "+ /new"],
        "{diff}"
    );
    // Between two snapshots, through the data directory (in use: the
    // server answers), the same.
    let diff2 = ok(memfs([
        "diff",
        "s1",
        "s2",
        "--data-dir",
        data.path().to_str().unwrap(),
    ]));
    assert_eq!(diff2, diff);
    assert_eq!(ok(memfs(["diff", "s2", "-", "--mount", &mp])), "");
    let err = failed(memfs(["diff", "nope", "-", "--mount", &mp]));
    assert!(err.contains("neither a commit id"), "{err}");

    ok(memfs(["snapshot", "delete", "s2", "--mount", &mp]));
    // A crash keeps the snapshots that were acknowledged.
    mnt.kill();
    let mnt = mount_durable(data.path());
    let mp = m(&mnt);
    let list = ok(memfs(["snapshot", "list", "--mount", &mp]));
    assert!(list.contains("s1") && !list.contains("s2"), "{list}");
    let diff3 = ok(memfs(["diff", "s1", "live", "--mount", &mp]));
    assert_eq!(diff3, diff);
    mnt.unmount();
    // Offline, from the data directory alone.
    let diff4 = ok(memfs([
        "diff",
        "s1",
        "-",
        "--data-dir",
        data.path().to_str().unwrap(),
    ]));
    assert_eq!(diff4, diff);
}

#[test]
fn an_in_memory_mount_says_snapshots_need_a_data_dir() {
    let mnt = Mount::new();
    let mp = m(&mnt);
    for args in [
        vec!["snapshot", "create", "x", "--mount", &mp],
        vec!["snapshot", "list", "--mount", &mp],
        vec!["diff", "x", "-", "--mount", &mp],
    ] {
        let err = failed(memfs(&args));
        assert!(err.contains("need a data directory"), "{args:?}: {err}");
    }
    let err = failed(memfs(["snapshot", "list", "--mount", "/nonexistent-memfs"]));
    assert!(err.contains("does not exist"), "{err}");
    let err = failed(memfs(["snapshot", "list"]));
    assert!(
        err.contains("--data-dir") && err.contains("--mount"),
        "{err}"
    );
    mnt.unmount();
}
