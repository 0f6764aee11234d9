//! pjdfstest (the Rust port) run on a mounted directory: shared by
//! conformance.rs (tmpfs, in-memory and durable mounts) and
//! volume_mount.rs (a volume on a Redis Cluster).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The suite's binary: `MEMFS_PJDFSTEST`, else where `scripts/test` puts it.
pub fn pjdfstest() -> PathBuf {
    let p = std::env::var_os("MEMFS_PJDFSTEST").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tools/bin/pjdfstest"),
        PathBuf::from,
    );
    assert!(
        p.is_file(),
        "pjdfstest not found at {}: run scripts/test, or install it with \
         `cargo install --locked --root target/tools --version 0.2.2 pjdfstest`",
        p.display()
    );
    p
}

/// The two users the suite switches to exist on every Debian system. Its
/// sleeps between timestamp checks must exceed tmpfs's clock granularity
/// (a timer tick), or tmpfs itself fails them.
const CONFIG: &str = r#"
[features]
posix_fallocate = {}
utime_now = {}
utimensat = {}
rename_ctime = {}

[settings]
naptime = 0.02
allow_remount = false

[dummy_auth]
entries = [["nobody", "nogroup"], ["daemon", "daemon"]]
"#;

#[derive(Debug)]
pub struct Outcome {
    pub passed: u64,
    pub failed: u64,
    pub skipped: u64,
    pub failures: Vec<String>,
    pub output: String,
}

pub fn run_suite(dir: &Path, secondary: Option<&Path>) -> Outcome {
    let cfg = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(cfg.path(), CONFIG).unwrap();
    let mut cmd = Command::new(pjdfstest());
    cmd.arg("-c")
        .arg(cfg.path())
        .arg("-p")
        .arg(dir)
        .current_dir(dir);
    if let Some(s) = secondary {
        cmd.arg("-s").arg(s);
    }
    let out = cmd.output().expect("run pjdfstest");
    let output =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    // "Summary: 0 failed, 16 skipped, 382 passed, 0 expected failures, 398 total"
    let summary = output
        .lines()
        .find_map(|l| l.strip_prefix("Summary: "))
        .unwrap_or_else(|| panic!("pjdfstest printed no summary:\n{output}"));
    let count = |what: &str| -> u64 {
        summary
            .split(", ")
            .find_map(|part| part.strip_suffix(what)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no '{what}' count in: {summary}"))
    };
    let failures = output
        .lines()
        .filter(|l| l.trim_end().ends_with("FAILED"))
        .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
        .collect();
    Outcome {
        passed: count(" passed"),
        failed: count(" failed"),
        skipped: count(" skipped"),
        failures,
        output,
    }
}
