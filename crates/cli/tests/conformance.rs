//! pjdfstest, an independent POSIX conformance suite (the Rust port published
//! on crates.io; `scripts/test` installs a pinned version into
//! `target/tools`), run as root against tmpfs, an in-memory memfs mount and a
//! durable one. tmpfs is the reference: memfs must fail no case and pass
//! every case tmpfs passes.

mod common;

use std::process::Command;

use common::pjdfstest::{Outcome, run_suite};
use common::{Mount, is_mount_point};

/// A fresh tmpfs, unmounted when dropped, whatever happens in between.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn new() -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            dir.path(),
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=256m"),
        )
        .expect("mount a tmpfs");
        Tmpfs(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if is_mount_point(self.0.path()) {
            let _ = nix::mount::umount2(self.0.path(), nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

fn assert_conforms(what: &str, got: &Outcome, reference: &Outcome) {
    assert_eq!(
        got.failed, 0,
        "{what}: pjdfstest failures {:?}\n{}",
        got.failures, got.output
    );
    assert!(
        got.passed >= reference.passed,
        "{what}: {} cases passed, tmpfs passed {} ({} skipped here)\n{}",
        got.passed,
        reference.passed,
        got.skipped,
        got.output
    );
}

#[test]
fn memfs_passes_every_case_tmpfs_passes() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: pjdfstest needs root (it switches users); CI runs as root");
        return;
    }
    let tmpfs = Tmpfs::new();
    let reference = run_suite(tmpfs.0.path(), None);
    assert_eq!(
        reference.failed, 0,
        "the harness itself is off: tmpfs fails {:?}\n{}",
        reference.failures, reference.output
    );
    assert!(reference.passed > 300, "{}", reference.output);
    drop(tmpfs);

    // Other users must reach the mount, as on tmpfs.
    let m = Mount::with_args(&["--allow-other"]);
    let in_memory = run_suite(&m.path(), None);
    m.unmount();
    assert_conforms("memfs", &in_memory, &reference);

    // Issue 12: the same answers while snapshots are taken and deleted during
    // the run (every change then first preserves the node for them), and
    // the snapshots kept stay browsable. Passthrough mounts refuse snapshots.
    if !common::passthrough_mounts() {
        let m = Mount::with_args(&["--allow-other"]);
        let snaps = common::Snapshotter::start(&m.path());
        let with_snapshots = run_suite(&m.path(), None);
        let (taken, kept) = snaps.finish();
        assert!(taken >= 1 && !kept.is_empty());
        for name in &kept {
            let find = Command::new("find")
                .arg(m.p(&format!(".snapshots/{name}")))
                .output()
                .unwrap();
            assert!(
                find.status.success() && !find.stdout.is_empty(),
                "find .snapshots/{name}: {}",
                String::from_utf8_lossy(&find.stderr)
            );
        }
        m.unmount();
        eprintln!("pjdfstest with {taken} snapshots taken during the run");
        assert_conforms("memfs with snapshots", &with_snapshots, &reference);
    }

    // The durable path records and acknowledges every operation: the same
    // answers, and a secondary file system lets the EXDEV cases run too.
    let data = tempfile::tempdir().unwrap();
    let secondary = Tmpfs::new();
    let m = Mount::with_args(&[
        "--allow-other",
        "--data-dir",
        data.path().to_str().unwrap(),
        "--durability",
        "sync",
    ]);
    let durable = run_suite(&m.path(), Some(secondary.0.path()));
    m.unmount();
    assert_conforms("memfs --durability sync", &durable, &reference);
    assert!(
        durable.skipped < in_memory.skipped,
        "the EXDEV cases did not run: {} skipped",
        durable.skipped
    );
    let fsck = Command::new(common::memfs_bin())
        .args(["fsck", "--data-dir"])
        .arg(data.path())
        .output()
        .unwrap();
    assert!(
        fsck.status.success(),
        "fsck after the suite: {}",
        String::from_utf8_lossy(&fsck.stderr)
    );
}
