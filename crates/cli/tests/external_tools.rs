//! Real fio and stress-ng runs against a real memfs mount.

mod common;

use std::process::Command;

use common::{Mount, have};

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().expect("spawn");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// fio with md5 verification: 4 KiB and 1 MiB random read/write, buffered and O_DIRECT.
#[test]
fn fio_verified_randrw() {
    assert!(have("fio"), "fio is not installed: run scripts/setup");
    let m = Mount::new();
    for bs in ["4k", "1m"] {
        for direct in [0, 1] {
            let name = format!("v-{bs}-{direct}");
            let (ok, out) = run(Command::new("fio")
                .current_dir(m.path())
                .arg("--verify_state_save=0")
                .arg(format!("--name={name}"))
                .arg(format!("--filename={}", m.p(&name).display()))
                .args([
                    "--rw=randrw",
                    "--size=256M",
                    "--ioengine=libaio",
                    "--iodepth=16",
                ])
                .arg(format!("--bs={bs}"))
                .arg(format!("--direct={direct}"))
                .args([
                    "--verify=md5",
                    "--do_verify=1",
                    "--verify_fatal=1",
                    "--fallocate=none",
                ]));
            assert!(ok, "fio {name} failed:\n{out}");
            assert!(
                !out.contains("verify: bad"),
                "fio {name} verification failed:\n{out}"
            );
            assert!(
                out.contains("READ:") && out.contains("WRITE:"),
                "fio {name} did no I/O:\n{out}"
            );
            std::fs::remove_file(m.p(&name)).unwrap();
        }
    }
    m.unmount();
}

/// Issue 12: fio's verified random writes stay exact while snapshots are
/// taken and deleted during the run (the first write to each page after a
/// snapshot preserves it), and a kept snapshot's copy of the file reads back
/// the same twice over while the live file keeps changing.
#[test]
fn fio_verify_with_snapshots_taken_during_the_run() {
    assert!(have("fio"), "fio is not installed: run scripts/setup");
    if common::passthrough_mounts() {
        eprintln!("skipped: a passthrough mount refuses snapshots (docs/snapshots.md)");
        return;
    }
    let m = Mount::new();
    let snaps = common::Snapshotter::start(&m.path());
    let (ok, out) = run(Command::new("fio")
        .current_dir(m.path())
        .arg("--verify_state_save=0")
        .arg("--name=snap")
        .arg(format!("--filename={}", m.p("snap").display()))
        .args([
            "--rw=randrw",
            "--size=64M",
            "--bs=4k",
            "--ioengine=libaio",
            "--iodepth=16",
            "--verify=md5",
            "--do_verify=1",
            "--verify_fatal=1",
            "--fallocate=none",
        ]));
    let (taken, kept) = snaps.finish();
    assert!(ok, "fio failed with snapshots being taken:\n{out}");
    assert!(
        !out.contains("verify: bad") && out.contains("WRITE:"),
        "fio verification failed with snapshots being taken:\n{out}"
    );
    eprintln!("fio verify with {taken} snapshots taken during the run");
    // The newest kept snapshot is frozen: rewrite the live file, then its
    // copy must read the same as before.
    let frozen = m.p(&format!(".snapshots/{}/snap", kept.last().unwrap()));
    let before = std::fs::read(&frozen).ok();
    std::fs::write(m.p("snap"), vec![0x5au8; 1 << 20]).unwrap();
    assert_eq!(before, std::fs::read(&frozen).ok(), "a snapshot changed");
    m.unmount();
}

/// One stressor, two instances, 3 s, verifying; true if it completed cleanly.
fn stress_ng(stressor: &str, dir: &std::path::Path) -> (bool, String) {
    let (ok, out) = run(Command::new("timeout")
        .args(["-k", "10", "120", "stress-ng"])
        .arg(format!("--{stressor}"))
        .args(["2", "--timeout", "3s", "--verify", "--metrics-brief"])
        .arg("--temp-path")
        .arg(dir));
    (ok && out.contains("successful run completed"), out)
}

/// stress-ng file system stressors, with verification where they offer it.
#[test]
fn stress_ng_file_system_stressors() {
    assert!(
        have("stress-ng"),
        "stress-ng is not installed: run scripts/setup"
    );
    let m = Mount::new();
    let stressors = [
        "dir",
        "dentry",
        "rename",
        "link",
        "symlink",
        "hdd",
        "seek",
        "lockf",
        "flock",
        "fcntl",
        "xattr",
        "fallocate",
        "mmap",
    ];
    let mut failed = Vec::new();
    for s in stressors {
        let (ok, out) = stress_ng(s, &m.path());
        if !ok {
            failed.push(format!("{s}:\n{out}"));
        }
    }
    assert!(
        failed.is_empty(),
        "stress-ng stressors failed:\n{}",
        failed.join("\n")
    );
    m.unmount();

    // The record-lock stressors again with the engine keeping the locks
    // (`--locks engine`): blocking waits, interrupts and unlock-at-close
    // through FUSE.
    let m = Mount::with_args(&["--locks", "engine"]);
    for s in ["lockf", "fcntl"] {
        let (ok, out) = stress_ng(s, &m.path());
        assert!(ok, "stress-ng {s} with engine locks failed:\n{out}");
    }
    m.unmount();
}
