//! Time travel on a live mount, through the `memfs` binary and real system
//! calls: snapshots and diff of a running durable mount (`--mount`), the
//! clear refusal on an in-memory mount, and the snapshots surviving a
//! SIGKILL of the server; online rollback while readers run, open
//! descriptors across it, and a SIGKILL in the middle of one.

use std::io::Read;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

mod common;
use common::{Mount, disk_dir, failed, memfs, memfs_bin, ok};

fn mount_durable(data: &Path) -> Mount {
    Mount::with_args(&["--data-dir", data.to_str().unwrap()])
}

fn m(mnt: &Mount) -> String {
    mnt.path().to_str().unwrap().to_string()
}

#[test]
fn snapshots_and_diff_of_a_running_mount_survive_sigkill() {
    let data = disk_dir("memfs-history-");
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
fn an_in_memory_mount_has_snapshots_but_no_commit_history() {
    let mnt = Mount::new();
    let mp = m(&mnt);
    // Its snapshots are the engine's (crates/cli/tests/snapshots.rs, where
    // its diff is tested too); a commit history it has not.
    let list = ok(memfs(["snapshot", "list", "--mount", &mp]));
    assert!(list.contains("no snapshots"), "{list}");
    let err = failed(memfs(["diff", "x", "-", "--mount", &mp]));
    assert!(err.contains("no snapshot \"x\""), "{err}");
    let err = failed(memfs(["rollback", "--to", "7", "--yes", "--mount", &mp]));
    assert!(err.contains("cannot roll back to snapshot \"7\""), "{err}");
    let err = failed(memfs(["snapshot", "list", "--mount", "/nonexistent-memfs"]));
    assert!(err.contains("does not exist"), "{err}");
    let err = failed(memfs(["snapshot", "list"]));
    assert!(
        err.contains("--data-dir") && err.contains("--mount"),
        "{err}"
    );
    mnt.unmount();
}

const FILES: usize = 8;

fn write_generation(mnt: &Mount, generation: u32) {
    for i in 0..FILES {
        std::fs::write(
            mnt.p(&format!("f{i}")),
            format!("generation {generation:04}"),
        )
        .unwrap();
    }
}

fn generation_of(root: &Path, i: usize) -> std::io::Result<String> {
    std::fs::read_to_string(root.join(format!("f{i}")))
}

fn fsck_clean(dir: &Path) {
    let out = ok(memfs([
        "fsck".as_ref(),
        "--data-dir".as_ref(),
        dir.as_os_str(),
    ]));
    assert_eq!(out.lines().last(), Some("clean"), "{out}");
}

#[test]
fn online_rollback_shows_the_target_at_once_while_readers_run() {
    let data = disk_dir("memfs-history-");
    let mnt = mount_durable(data.path());
    let mp = m(&mnt);
    write_generation(&mnt, 1);
    std::fs::write(mnt.p("deleted-later"), b"back again").unwrap();
    ok(memfs(["snapshot", "create", "g1", "--mount", &mp]));
    write_generation(&mnt, 2);
    std::fs::remove_file(mnt.p("deleted-later")).unwrap();
    std::fs::create_dir(mnt.p("newdir")).unwrap();
    std::fs::write(mnt.p("newdir/young"), b"not in g1").unwrap();
    let mut young = std::fs::File::open(mnt.p("newdir/young")).unwrap();
    let kept = std::fs::File::open(mnt.p("f0")).unwrap();

    // Readers never see anything but one whole generation per file.
    let stop = Arc::new(AtomicBool::new(false));
    let root = mnt.path();
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (stop, root) = (stop.clone(), root.clone());
            std::thread::spawn(move || {
                let mut reads = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for i in 0..FILES {
                        let s = generation_of(&root, i).unwrap();
                        assert!(
                            s == "generation 0001" || s == "generation 0002",
                            "f{i} reads {s:?}"
                        );
                        reads += 1;
                    }
                }
                reads
            })
        })
        .collect();
    let out = ok(memfs(["rollback", "--mount", &mp, "--to", "g1", "--yes"]));
    assert!(out.contains("rolled back to commit"), "{out}");
    // At once: contents, names and attributes are the snapshot's.
    for i in 0..FILES {
        assert_eq!(generation_of(&root, i).unwrap(), "generation 0001");
    }
    assert_eq!(
        std::fs::read(mnt.p("deleted-later")).unwrap(),
        b"back again"
    );
    assert!(!mnt.p("newdir").exists());
    let names: Vec<String> = std::fs::read_dir(mnt.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), FILES + 1, "{names:?}");
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    // A descriptor of a file the target lacks fails; one of a file it
    // has reads the target's contents.
    let mut buf = Vec::new();
    let e = young.read_to_end(&mut buf).unwrap_err();
    assert!(
        matches!(e.raw_os_error(), Some(libc::ESTALE) | Some(libc::ENOENT)),
        "{e}"
    );
    let mut s = String::new();
    (&kept).read_to_string(&mut s).unwrap();
    assert_eq!(s, "generation 0001");
    drop((young, kept));
    // Writes go on, and the snapshots after the target are gone.
    write_generation(&mnt, 3);
    let list = ok(memfs(["snapshot", "list", "--mount", &mp]));
    assert!(list.contains("g1"), "{list}");
    mnt.unmount();
    fsck_clean(data.path());
    let mnt = mount_durable(data.path());
    assert_eq!(generation_of(&mnt.path(), 3).unwrap(), "generation 0003");
    assert!(mnt.p("deleted-later").exists());
    mnt.unmount();
}

#[test]
fn sigkill_during_an_online_rollback_leaves_the_old_or_the_new_state() {
    let data = disk_dir("memfs-history-");
    for round in 0..3u64 {
        let mut mnt = mount_durable(data.path());
        let mp = m(&mnt);
        write_generation(&mnt, 1);
        let name = format!("r{round}");
        ok(memfs(["snapshot", "create", &name, "--mount", &mp]));
        write_generation(&mnt, 2);
        let mut child = Command::new(memfs_bin())
            .args(["rollback", "--mount", &mp, "--to", &name, "--yes"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Round 0 kills before the request can arrive, later rounds
        // progressively later; either outcome is right, a mix is not.
        std::thread::sleep(std::time::Duration::from_millis(round * 3));
        mnt.kill();
        let _ = child.wait();
        fsck_clean(data.path());
        let mnt = mount_durable(data.path());
        let gens: Vec<String> = (0..FILES)
            .map(|i| generation_of(&mnt.path(), i).unwrap())
            .collect();
        assert!(
            gens.iter().all(|g| *g == gens[0]),
            "round {round}: a mixed state {gens:?}"
        );
        mnt.unmount();
    }
}
