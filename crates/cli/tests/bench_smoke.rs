//! Runs `memfs bench metadata`, `fio` and `memory` with tiny sizes through the
//! real binary, on real mounts, and checks that the JSON reports carry every
//! field the suite (`memfs bench all`) relies on, and that nothing is left
//! mounted or running afterwards.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A bench run that is killed and reaped whatever happens to the test.
struct ChildGuard(Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn skip_reason() -> Option<String> {
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse is missing".into());
    }
    let fio = Command::new("fio")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !fio.is_ok_and(|s| s.success()) {
        return Some("fio is not installed".into());
    }
    let root = nix::unistd::geteuid().is_root();
    let fusermount = Command::new("fusermount3")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !root && !fusermount {
        return Some("not root and no fusermount3".into());
    }
    None
}

/// Runs `memfs ARGS` with its temporary directories under `tmp`, fails the
/// test on a non-zero exit or after `timeout`, and returns the parsed JSON.
fn run_bench(tmp: &Path, args: &[&str], json: &Path, timeout: Duration) -> Value {
    let mut guard = ChildGuard(Some(
        Command::new(env!("CARGO_BIN_EXE_memfs"))
            .args(args)
            .arg("--json")
            .arg(json)
            .env("TMPDIR", tmp)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot start memfs"),
    ));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(s) = guard.0.as_mut().unwrap().try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "memfs {args:?} still running after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let child = guard.0.take().unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        status.success(),
        "memfs {args:?} failed ({status}):\n{stdout}\n{stderr}"
    );
    // The table is printed.
    assert!(
        stdout.contains("figure") && stdout.contains("ratio"),
        "{stdout}"
    );
    assert_no_leftovers(tmp);
    serde_json::from_str(&std::fs::read_to_string(json).expect("JSON written"))
        .expect("JSON parses")
}

fn assert_no_leftovers(tmp: &Path) {
    let tmp = tmp.canonicalize().unwrap();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let needle = tmp.to_string_lossy().into_owned();
    assert!(
        !info.lines().any(|l| l.contains(&needle)),
        "mounts left behind under {needle}:\n{info}"
    );
    let left: Vec<PathBuf> = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

fn check_report(v: &Value, benchmark: &str) -> Vec<Value> {
    assert_eq!(v["benchmark"], benchmark);
    assert!(v["command"].as_str().unwrap().contains(benchmark));
    assert!(v["duration_secs"].as_f64().unwrap() > 0.0);
    let m = &v["machine"];
    assert!(!m["cpu_model"].as_str().unwrap().is_empty());
    assert!(m["cpus"].as_u64().unwrap() >= 1);
    assert!(m["memory_bytes"].as_u64().unwrap() > 0);
    assert!(!m["kernel"].as_str().unwrap().is_empty());
    assert!(v["config"].is_object());
    let figures = v["figures"].as_array().unwrap().clone();
    for f in &figures {
        for key in [
            "figure",
            "unit",
            "value",
            "stddev",
            "baseline",
            "baseline_name",
            "ratio",
            "target",
            "better",
            "met",
        ] {
            assert!(f.get(key).is_some(), "{key} missing in {f}");
        }
        assert!(f["value"].as_f64().unwrap() >= 0.0, "{f}");
        assert_eq!(f["met"].is_null(), f["target"].is_null(), "{f}");
    }
    figures
}

fn names(figures: &[Value]) -> Vec<&str> {
    figures
        .iter()
        .map(|f| f["figure"].as_str().unwrap())
        .collect()
}

#[test]
fn metadata_fio_and_memory_benchmarks_report_every_field() {
    if let Some(why) = skip_reason() {
        eprintln!("skipping the bench smoke test: {why}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();

    // metadata: memfs against tmpfs.
    let v = run_bench(
        tmp.path(),
        &["bench", "metadata", "--objects", "200", "--iterations", "2"],
        &out.path().join("metadata.json"),
        Duration::from_secs(60),
    );
    let figs = check_report(&v, "metadata");
    assert_eq!(
        names(&figs),
        [
            "metadata.t1.create",
            "metadata.t1.open",
            "metadata.t1.stat",
            "metadata.t1.unlink",
            "metadata.t1.rmdir"
        ]
    );
    for f in &figs {
        assert!(f["value"].as_f64().unwrap() > 0.0, "{f}");
        assert!(f["baseline"].as_f64().unwrap() > 0.0, "{f}");
        assert!(f["ratio"].as_f64().unwrap() > 0.0, "{f}");
        assert!(
            f["stddev"].is_number(),
            "two iterations give a deviation: {f}"
        );
    }
    // Issue 16's targets: ratios to tmpfs in the same run.
    for (f, ratio) in [(&figs[0], 0.25), (&figs[1], 0.70), (&figs[3], 0.40)] {
        let want = ratio * f["baseline"].as_f64().unwrap();
        assert!(
            (f["target"].as_f64().unwrap() - want).abs() <= 1e-9 * want,
            "{f}"
        );
        assert!(f["met"].is_boolean(), "{f}");
    }
    assert!(figs[2]["target"].is_null());

    // metadata on a given path: no mount, no baseline, nothing left there.
    let dir = tempfile::tempdir().unwrap();
    let v = run_bench(
        tmp.path(),
        &[
            "bench",
            "metadata",
            "--path",
            dir.path().to_str().unwrap(),
            "--objects",
            "200",
            "--iterations",
            "1",
            "--threads",
            "2",
            "--shared",
        ],
        &out.path().join("path.json"),
        Duration::from_secs(30),
    );
    let figs = check_report(&v, "metadata");
    assert_eq!(figs[0]["figure"], "metadata.t2.shared.create");
    assert!(figs.iter().all(|f| f["baseline"].is_null()));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

    // fio: both block sizes, direct and buffered (the default), memfs against tmpfs.
    let v = run_bench(
        tmp.path(),
        &[
            "bench",
            "fio",
            "--size",
            "8M",
            "--runtime",
            "1",
            "--bs",
            "4k,1m",
        ],
        &out.path().join("fio.json"),
        Duration::from_secs(60),
    );
    let figs = check_report(&v, "fio");
    assert_eq!(
        names(&figs),
        [
            "fio.4k.direct.read",
            "fio.4k.direct.write",
            "fio.4k.buffered.read",
            "fio.4k.buffered.write",
            "fio.1m.direct.read",
            "fio.1m.direct.write",
            "fio.1m.buffered.read",
            "fio.1m.buffered.write",
            "fio.server_vmhwm"
        ]
    );
    for f in &figs[..8] {
        assert_eq!(f["unit"], "MiB/s");
        assert!(f["value"].as_f64().unwrap() > 0.0, "{f}");
        assert!(f["baseline"].as_f64().unwrap() > 0.0, "{f}");
        // Issue 16's targets: ratios to tmpfs in the same run, each way.
        let name = f["figure"].as_str().unwrap();
        let ratio = match (name.contains(".4k."), name.contains(".direct.")) {
            (true, true) => 0.8,
            (true, false) => 0.5,
            (false, true) => 0.95,
            (false, false) => 0.9,
        };
        let want = ratio * f["baseline"].as_f64().unwrap();
        assert!(
            (f["target"].as_f64().unwrap() - want).abs() <= 1e-9 * want,
            "{f}"
        );
        assert!(f["met"].is_boolean(), "{f}");
    }

    // fio with verification fails loudly if a byte is wrong; here it must pass.
    let v = run_bench(
        tmp.path(),
        &[
            "bench",
            "fio",
            "--size",
            "8M",
            "--runtime",
            "1",
            "--bs",
            "4k",
            "--verify",
            "--baseline",
            "none",
        ],
        &out.path().join("verify.json"),
        Duration::from_secs(60),
    );
    let figs = check_report(&v, "fio");
    assert_eq!(figs[0]["figure"], "fio.4k.direct.verify.read");
    // fio's verify state file must not land in our working directory.
    let cwd = std::env::current_dir().unwrap();
    let stray: Vec<_> = std::fs::read_dir(&cwd)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with("-verify.state"))
        .map(|e| e.path())
        .collect();
    assert!(stray.is_empty(), "fio left {stray:?}");
    assert!(figs[0]["baseline"].is_null());

    // memory: server resident size against the idle server.
    let v = run_bench(
        tmp.path(),
        &["bench", "memory", "--files", "2000", "--data", "32M"],
        &out.path().join("memory.json"),
        Duration::from_secs(60),
    );
    let figs = check_report(&v, "memory");
    assert_eq!(
        names(&figs),
        [
            "memory.files.vmrss",
            "memory.files.vmhwm",
            "memory.files.per_unit",
            "memory.data.vmrss",
            "memory.data.vmhwm",
            "memory.data.per_unit"
        ]
    );
    // 32 MiB written must be resident on top of the idle server (whose own
    // size varies by a couple of MiB between runs).
    let data_rss = figs[3]["value"].as_f64().unwrap();
    let idle = figs[3]["baseline"].as_f64().unwrap();
    assert!(data_rss >= idle + 28.0, "{data_rss} MiB vs idle {idle} MiB");
}

#[test]
fn snapshot_benchmark_reports_every_figure() {
    if let Some(why) = skip_reason() {
        eprintln!("skipping the snapshot bench smoke test: {why}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    // The bench itself checks the clone's contents and the rollback's
    // result, and fails the run if either is wrong.
    let v = run_bench(
        tmp.path(),
        &[
            "bench",
            "snapshot",
            "--files",
            "300",
            "--data",
            "4M",
            "--runtime",
            "1",
        ],
        &out.path().join("snapshot.json"),
        Duration::from_secs(120),
    );
    let figs = check_report(&v, "snapshot");
    assert_eq!(
        names(&figs),
        [
            "snapshot.create",
            "snapshot.command_floor",
            "snapshot.write_stall",
            "snapshot.memory_unchanged",
            "snapshot.randwrite_4k_after",
            "snapshot.fresh_memory",
            "snapshot.read_1m_snapshot",
            "snapshot.clone",
            "snapshot.rollback_1pct",
            "snapshot.rollback_data",
        ]
    );
    for f in &figs {
        if [
            "snapshot.command_floor",
            "snapshot.fresh_memory",
            "snapshot.rollback_data",
        ]
        .contains(&f["figure"].as_str().unwrap_or_default())
        {
            // What any command costs, what fresh memory costs, and a
            // rollback of more than the change: no target.
            assert!(f["value"].as_f64().unwrap() > 0.0, "{f}");
            continue;
        }
        assert!(f["target"].as_f64().is_some(), "{f}");
        if f["figure"] != "snapshot.memory_unchanged" {
            assert!(f["value"].as_f64().unwrap() > 0.0, "{f}");
            assert!(f["baseline"].as_f64().unwrap() > 0.0, "{f}");
        }
    }
}

#[test]
fn durability_benchmark_reports_every_figure() {
    if let Some(why) = skip_reason() {
        eprintln!("skipping the durability bench smoke test: {why}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let var_tmp_before = memfs_dirs_in_var_tmp();
    let v = run_bench(
        tmp.path(),
        &["bench", "durability", "--quick"],
        &out.path().join("durability.json"),
        Duration::from_secs(120),
    );
    let figs = check_report(&v, "durability");
    assert_eq!(
        names(&figs),
        [
            "durability.metadata.memory.create",
            "durability.metadata.none.create",
            "durability.metadata.async.create",
            "durability.metadata.async.open",
            "durability.metadata.async.stat",
            "durability.metadata.async.unlink",
            "durability.metadata.async.rmdir",
            "durability.metadata.sync.create",
            "durability.fio.4k.direct.none.read",
            "durability.fio.4k.direct.async.read",
            "durability.fio.4k.direct.none.write",
            "durability.fio.4k.direct.async.write",
            "durability.checkpoint.seconds",
            "durability.checkpoint.throughput",
            "durability.checkpoint.op_latency.p50",
            "durability.checkpoint.op_latency.p99",
            "durability.checkpoint.op_latency.max",
            "durability.recovery.replay_rate",
            "durability.recovery.replayed",
            "durability.recovery.replay_seconds",
            "durability.recovery.mount_seconds",
        ]
    );
    for f in &figs[..12] {
        assert!(f["baseline"].as_f64().unwrap() > 0.0, "{f}");
    }
    for name in [
        "durability.metadata.async.create",
        "durability.metadata.sync.create",
        "durability.fio.4k.direct.async.write",
        "durability.checkpoint.op_latency.p99",
        "durability.recovery.replay_rate",
    ] {
        let f = figs.iter().find(|f| f["figure"] == name).unwrap();
        assert!(f["met"].is_boolean(), "{f}");
    }
    assert!(
        v["config"]["recovery"]["commits_replayed"]
            .as_u64()
            .unwrap()
            > 0
    );
    // The data directories on the disk are gone too.
    let after = memfs_dirs_in_var_tmp();
    let new: Vec<_> = after.difference(&var_tmp_before).collect();
    assert!(new.is_empty(), "left in /var/tmp: {new:?}");

    // --durability on the single benchmarks: memfs with a data directory
    // against the disk, figure names saying the mode.
    let v = run_bench(
        tmp.path(),
        &[
            "bench",
            "metadata",
            "--objects",
            "50",
            "--iterations",
            "1",
            "--durability",
            "sync",
        ],
        &out.path().join("metadata-sync.json"),
        Duration::from_secs(60),
    );
    let figs = check_report(&v, "metadata");
    assert_eq!(figs[0]["figure"], "metadata.t1.durable-sync.create");
    assert_eq!(figs[0]["baseline_name"], "disk (/var/tmp)");
    assert_eq!(v["config"]["sync"], true);
    let v = run_bench(
        tmp.path(),
        &[
            "bench",
            "fio",
            "--size",
            "8M",
            "--runtime",
            "1",
            "--bs",
            "4k",
            "--durability",
            "async",
        ],
        &out.path().join("fio-async.json"),
        Duration::from_secs(60),
    );
    let figs = check_report(&v, "fio");
    assert_eq!(figs[0]["figure"], "fio.4k.direct.durable-async.read");
    assert_eq!(figs[0]["baseline_name"], "disk (/var/tmp)");
    let after = memfs_dirs_in_var_tmp();
    let new: Vec<_> = after.difference(&var_tmp_before).collect();
    assert!(new.is_empty(), "left in /var/tmp: {new:?}");
}

/// memfs benchmark directories in /var/tmp (data directories, disk baselines);
/// other runs on the machine may add theirs, so compare names, not counts.
fn memfs_dirs_in_var_tmp() -> std::collections::BTreeSet<PathBuf> {
    std::fs::read_dir("/var/tmp")
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("memfs-bench-"))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn bad_arguments_give_clear_errors() {
    let bin = env!("CARGO_BIN_EXE_memfs");
    for (args, want) in [
        (
            &["bench", "metadata", "--threads", "0"][..],
            "--threads must be at least 1",
        ),
        (
            &["bench", "metadata", "--path", "/nonexistent/x"][..],
            "cannot use --path",
        ),
        (&["bench", "fio", "--bs", "100"][..], "multiple of 512"),
        (&["bench", "fio", "--size", "lots"][..], "invalid --size"),
        (&["bench", "memory", "--data", "x"][..], "invalid --data"),
        (
            &["bench", "metadata", "--durability", "fast"][..],
            "invalid --durability",
        ),
        (
            &["bench", "durability", "--checkpoint-size", "lots"][..],
            "invalid --checkpoint-size",
        ),
        (
            &["bench", "durability", "--window", "0"][..],
            "--window must be",
        ),
    ] {
        let out = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
