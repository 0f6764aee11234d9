//! `memfs bench report` and `memfs bench compare` on synthetic results
//! folders (the format `memfs bench all` writes), through the real binary:
//! verdicts and exit codes of compare, the report's tables and image links,
//! and an incomplete folder rejected by `report --check`. (`bench all --quick`
//! itself runs in CI, scripts/test, not here.)

use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

const KINDS: [&str; 7] = [
    "metadata", "fio", "workload", "block", "lock", "memory", "cluster",
];

fn memfs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memfs"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("cannot run memfs")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A figure as `bench all` records it.
fn figure(step: &str, kind: &str, name: &str, value: f64, sd: Option<f64>, better: &str) -> Value {
    json!({
        "step": step, "kind": kind, "figure": name, "unit": if better == "lower" { "ms" } else { "ops/s" },
        "value": value, "stddev": sd,
        "baseline": value * 2.0, "baseline_stddev": null, "baseline_name": "tmpfs (fresh mount)",
        "ratio": 0.5, "target": 100.0, "better": better,
        "met": if better == "lower" { value <= 100.0 } else { value >= 100.0 },
    })
}

fn step(id: &str, kind: &str, status: &str, reason: Option<&str>) -> Value {
    json!({
        "id": id, "kind": kind, "title": format!("{kind} step"),
        "command": format!("memfs bench {kind} --quick-ish"),
        "status": status, "reason": reason, "duration_secs": 1.5,
        "json": if status == "ok" { Some(format!("json/{id}.json")) } else { None },
    })
}

/// Writes `results.json` (and the plot files it names) into `dir`.
fn write_folder(dir: &Path, steps: Vec<Value>, figures: Vec<Value>, plots: &[&str]) {
    std::fs::create_dir_all(dir.join("plots")).unwrap();
    for p in plots {
        std::fs::write(dir.join(format!("{p}.svg")), "<svg/>").unwrap();
        std::fs::write(dir.join(format!("{p}.png")), b"\x89PNG").unwrap();
    }
    let results = json!({
        "format": 1, "memfs_version": "0.1.0", "command": "memfs bench all --quick",
        "quick": true, "started_unix": 1_795_408_709u64, "duration_secs": 61.0,
        "machine": {
            "cpu_model": "Test CPU", "cpus": 2, "memory_bytes": 25_769_803_776u64,
            "kernel": "6.1.0-test", "hostname": "h", "load_average": 0.5
        },
        "file_systems": [ { "role": "disk baseline", "path": "/var/tmp", "fs_type": "ext4" } ],
        "steps": steps, "figures": figures,
        "plots": plots,
    });
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(&results).unwrap(),
    )
    .unwrap();
}

/// A complete folder: metadata and workload ran, the others were skipped
/// with a reason. `create`, `stat` and `unlink` values are parameters.
fn complete(dir: &Path, create: f64, stat: f64, unlink_ms: f64) {
    let mut steps = vec![
        step("metadata-t1-tmpfs", "metadata", "ok", None),
        step("workload-engine", "workload", "ok", None),
    ];
    for kind in ["fio", "block", "lock", "memory", "cluster"] {
        steps.push(step(kind, kind, "skipped", Some("fio is not installed")));
    }
    let figures = vec![
        figure(
            "metadata-t1-tmpfs",
            "metadata",
            "metadata.t1.create",
            create,
            Some(create * 0.01),
            "higher",
        ),
        figure(
            "metadata-t1-tmpfs",
            "metadata",
            "metadata.t1.stat",
            stat,
            Some(stat * 0.01),
            "higher",
        ),
        figure(
            "workload-engine",
            "workload",
            "workload.engine.n1000.t1.delete",
            unlink_ms,
            Some(unlink_ms * 0.01),
            "lower",
        ),
    ];
    write_folder(
        dir,
        steps,
        figures,
        &["plots/metadata", "plots/workload-engine"],
    );
}

#[test]
fn compare_flags_regressions_beyond_the_noise() {
    let tmp = tempfile::tempdir().unwrap();
    let (old, new) = (tmp.path().join("old"), tmp.path().join("new"));
    complete(&old, 1000.0, 5000.0, 10.0);
    // create improved by 20 %, stat unchanged (within 1 % noise), delete
    // took 30 % longer (a regression: lower is better).
    complete(&new, 1200.0, 5010.0, 13.0);
    let o = memfs(&[
        "bench",
        "compare",
        old.to_str().unwrap(),
        new.to_str().unwrap(),
    ]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}\n{err}");
    let line = |name: &str| {
        out.lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("no line for {name} in\n{out}"))
            .to_string()
    };
    assert!(line("metadata.t1.create").ends_with("better"), "{out}");
    assert!(line("metadata.t1.create").contains("+20.0%"), "{out}");
    assert!(line("metadata.t1.stat").ends_with("same"), "{out}");
    assert!(
        line("workload.engine.n1000.t1.delete").ends_with("REGRESSED"),
        "{out}"
    );
    assert!(
        err.contains("1 figure(s) regressed") && err.contains("delete"),
        "{err}"
    );

    // --no-fail only prints.
    let o = memfs(&[
        "bench",
        "compare",
        old.to_str().unwrap(),
        new.to_str().unwrap(),
        "--no-fail",
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(text(&o).0.contains("REGRESSED"));

    // The other way round, delete improved and create regressed.
    let o = memfs(&[
        "bench",
        "compare",
        new.to_str().unwrap(),
        old.to_str().unwrap(),
    ]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        out.lines()
            .any(|l| l.contains("t1.create") && l.ends_with("REGRESSED")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.contains("delete") && l.ends_with("better")),
        "{out}"
    );

    // A run against itself: nothing moves, exit 0.
    let o = memfs(&[
        "bench",
        "compare",
        old.to_str().unwrap(),
        old.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(text(&o).0.contains("0 regressed"));
}

#[test]
fn compare_uses_the_recorded_noise() {
    let tmp = tempfile::tempdir().unwrap();
    let (old, new) = (tmp.path().join("old"), tmp.path().join("new"));
    let one = |dir: &Path, value: f64, sd: f64| {
        write_folder(
            dir,
            vec![step("s", "metadata", "ok", None)],
            vec![figure(
                "s",
                "metadata",
                "metadata.t1.open",
                value,
                Some(sd),
                "higher",
            )],
            &[],
        )
    };
    // 15 % lower but each run varies by 10 %: noise 2 * 14 % = 28 %.
    one(&old, 1000.0, 100.0);
    one(&new, 850.0, 85.0);
    let o = memfs(&[
        "bench",
        "compare",
        old.to_str().unwrap(),
        new.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(
        text(&o).0.contains("worse (within noise)"),
        "{:?}",
        text(&o)
    );
    // The same change with 1 % deviations is a regression.
    one(&old, 1000.0, 10.0);
    one(&new, 850.0, 8.5);
    let o = memfs(&[
        "bench",
        "compare",
        old.to_str().unwrap(),
        new.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{:?}", text(&o));
}

#[test]
fn compare_rejects_what_is_not_a_results_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let o = memfs(&[
        "bench",
        "compare",
        tmp.path().to_str().unwrap(),
        tmp.path().to_str().unwrap(),
    ]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err.contains("cannot read") && err.contains("results.json"),
        "{err}"
    );
    std::fs::write(tmp.path().join("results.json"), "{\"format\": 1}").unwrap();
    let o = memfs(&[
        "bench",
        "compare",
        tmp.path().to_str().unwrap(),
        tmp.path().to_str().unwrap(),
    ]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err.contains("not a `memfs bench all` results file"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn report_has_machine_commands_tables_and_images() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    complete(&dir, 1000.0, 5000.0, 10.0);
    let md = tmp.path().join("docs/benchmarks.md");
    std::fs::create_dir_all(md.parent().unwrap()).unwrap();
    let o = memfs(&[
        "bench",
        "report",
        dir.to_str().unwrap(),
        "--output",
        md.to_str().unwrap(),
        "--check",
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    let report = std::fs::read_to_string(&md).unwrap();
    for want in [
        "Test CPU",
        "| cores | 2 |",
        "6.1.0-test",
        "`/var/tmp` (ext4)",
        "`memfs bench all --quick`",
        "`memfs bench metadata --quick-ish`",
        "| figure | unit | memfs | baseline | ratio | target | met |",
        "| `metadata.t1.create` | ops/s | 1,000 ± 10.0 | 2,000 | 0.50x | ≥ 100 | yes |",
        "| `workload.engine.n1000.t1.delete` | ms | 10.0 ± 0.1 | 20.0 | 0.50x | ≤ 100 | yes |",
        "[![metadata](benchmarks/metadata.png)](benchmarks/metadata.svg)",
        "[![workload-engine](benchmarks/workload-engine.png)](benchmarks/workload-engine.svg)",
        "Skipped: fio is not installed",
    ] {
        assert!(report.contains(want), "missing {want:?} in\n{report}");
    }
    // Every kind has its section.
    for kind in KINDS {
        assert!(report.contains(&format!("<a id=\"{kind}\"></a>")), "{kind}");
    }
    for f in [
        "metadata.svg",
        "metadata.png",
        "workload-engine.svg",
        "workload-engine.png",
    ] {
        assert!(
            tmp.path().join("docs/benchmarks").join(f).is_file(),
            "{f} not copied"
        );
    }
}

#[test]
fn report_check_rejects_an_incomplete_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    // No lock step at all, a failed fio step, a skip without a reason.
    let steps = vec![
        step("metadata-t1-tmpfs", "metadata", "ok", None),
        step(
            "fio-direct",
            "fio",
            "failed",
            Some("fio exited with status 1"),
        ),
        step("workload-engine", "workload", "skipped", None),
        step("block", "block", "skipped", Some("not selected (--only)")),
        step("memory", "memory", "skipped", Some("no /dev/fuse")),
    ];
    let figures = vec![figure(
        "metadata-t1-tmpfs",
        "metadata",
        "metadata.t1.create",
        1.0,
        None,
        "higher",
    )];
    write_folder(&dir, steps, figures, &["plots/metadata"]);
    let md = tmp.path().join("out.md");
    let o = memfs(&[
        "bench",
        "report",
        dir.to_str().unwrap(),
        "--output",
        md.to_str().unwrap(),
        "--check",
    ]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    for want in [
        "no lock benchmark",
        "step fio-direct failed: fio exited with status 1",
        "step workload-engine skipped without a reason",
        "is incomplete",
    ] {
        assert!(err.contains(want), "missing {want:?} in\n{err}");
    }
    // Written anyway, with the failure in it; without --check it succeeds.
    assert!(std::fs::read_to_string(&md).unwrap().contains("**Failed**"));
    let o = memfs(&[
        "bench",
        "report",
        dir.to_str().unwrap(),
        "--output",
        md.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{:?}", text(&o));

    // A plot named in results.json but missing from the folder.
    complete(&dir, 1.0, 1.0, 1.0);
    std::fs::remove_file(dir.join("plots/metadata.png")).unwrap();
    let o = memfs(&[
        "bench",
        "report",
        dir.to_str().unwrap(),
        "--output",
        md.to_str().unwrap(),
        "--check",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("metadata.png"), "{:?}", text(&o));
}
