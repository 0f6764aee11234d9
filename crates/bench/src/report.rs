//! `memfs bench report DIR`: the markdown report of a `memfs bench all`
//! results folder (machine, commands, tables, plots), and `memfs bench compare
//! OLD NEW`: each figure's change between two folders, flagging those worse by
//! more than the noise (docs/bench.md, "Comparing runs").

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::common::{Better, Figure, fmt_num};
use crate::results::{KINDS, Results, RunFigure, Status, StepRecord};

#[derive(clap::Args, Debug, Clone)]
pub struct ReportArgs {
    /// A results folder written by `memfs bench all`.
    pub dir: PathBuf,
    /// The markdown file to write; its images go to a folder of the same name
    /// next to it (`docs/benchmarks/` for `docs/benchmarks.md`).
    #[arg(long, default_value = "docs/benchmarks.md")]
    pub output: PathBuf,
    /// Exit non-zero if the folder is incomplete: a benchmark kind missing, a
    /// failed step, a step skipped without a reason or without figures. The
    /// report is written either way.
    #[arg(long)]
    pub check: bool,
}

#[derive(clap::Args, Debug, Clone)]
pub struct CompareArgs {
    /// The earlier results folder (or its results.json).
    pub old: PathBuf,
    /// The later results folder (or its results.json).
    pub new: PathBuf,
    /// Smallest change (percent) ever flagged, whatever the recorded noise.
    #[arg(long, default_value_t = 5.0)]
    pub floor: f64,
    /// Smallest change (percent) flagged for a figure without a recorded
    /// standard deviation in both runs (single measurements: noise unknown).
    #[arg(long, default_value_t = 10.0)]
    pub floor_unmeasured: f64,
    /// Compare each figure's ratio to its baseline (measured in the same run)
    /// instead of its value, where both runs have one: steadier on a shared
    /// machine whose load changes between runs.
    #[arg(long)]
    pub ratios: bool,
    /// Only print: exit 0 even when figures regressed.
    #[arg(long)]
    pub no_fail: bool,
}

fn with_sd(v: f64, sd: Option<f64>) -> String {
    match sd {
        Some(sd) => format!("{} ± {}", fmt_num(v), fmt_num(sd)),
        None => fmt_num(v),
    }
}

fn target_cell(f: &Figure) -> String {
    f.target.map_or_else(
        || "-".into(),
        |t| {
            let op = if f.better == Better::Higher {
                "≥"
            } else {
                "≤"
            };
            format!("{op} {}", fmt_num(t))
        },
    )
}

fn met_cell(f: &Figure) -> &'static str {
    match f.met {
        Some(true) => "yes",
        Some(false) => "**no**",
        None => "-",
    }
}

/// Markdown-safe table cell.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn kind_title(kind: &str) -> &'static str {
    match kind {
        "metadata" => "Metadata (create / open / stat / unlink)",
        "fio" => "fio random read/write",
        "workload" => "Shell workload",
        "block" => "Block store",
        "lock" => "Cross-process locks",
        "memory" => "Server memory",
        "cluster" => "Volumes on a Redis Cluster",
        _ => "Other",
    }
}

/// Units whose ratio to the baseline compares speed (memory figures are
/// compared with an idle server, which is not a competitor).
fn is_speed(unit: &str) -> bool {
    matches!(unit, "ops/s" | "MiB/s" | "ms")
}

/// memfs's speed relative to its baseline (> 1: memfs is faster), for rates
/// and times alike.
pub fn speedup(f: &Figure) -> Option<f64> {
    let r = f.ratio?;
    let s = if f.better == Better::Lower {
        1.0 / r
    } else {
        r
    };
    (is_speed(&f.unit) && s.is_finite() && s > 0.0).then_some(s)
}

/// A one-line summary of a kind: how memfs compares with its baselines.
fn kind_summary(figs: &[&RunFigure]) -> String {
    let mut speedups: Vec<f64> = figs.iter().filter_map(|f| speedup(&f.figure)).collect();
    speedups.sort_by(f64::total_cmp);
    let with_target = figs.iter().filter(|f| f.figure.met.is_some()).count();
    let met = figs.iter().filter(|f| f.figure.met == Some(true)).count();
    let mut s = format!("{} figures", figs.len());
    if !speedups.is_empty() {
        let ahead = speedups.iter().filter(|&&x| x >= 1.0).count();
        let _ = write!(
            s,
            "; memfs against its baseline: median {:.2}x the speed, ahead in {ahead} of {}",
            speedups[speedups.len() / 2],
            speedups.len()
        );
    }
    if with_target > 0 {
        let _ = write!(s, "; targets met: {met} of {with_target}");
    }
    s
}

/// The markdown text of a report whose images are under `images` (a path
/// relative to the report).
pub fn render(r: &Results, images: &str) -> String {
    let mut md = String::new();
    run_section(&mut md, r);
    machine_section(&mut md, r);
    summary_section(&mut md, r);
    for kind in KINDS {
        kind_section(&mut md, r, kind, images);
    }
    let _ = writeln!(
        md,
        "\nValues are means ± sample standard deviation over the repetitions the \
         benchmark makes (none shown for a single measurement); ratio = memfs / \
         baseline; for times (ms) lower is better."
    );
    md
}

/// The title, what the report is, and the run's command and time.
fn run_section(md: &mut String, r: &Results) {
    let _ = writeln!(md, "# memfs benchmarks\n");
    let _ = writeln!(
        md,
        "Generated by `memfs bench report` from a `memfs bench all` results folder; \
         do not edit by hand (re-run the two commands instead). Every figure is \
         compared with its baseline measured in the same run: on a shared, noisy \
         machine the ratio is the number to quote.\n"
    );
    let _ = writeln!(md, "## Run\n");
    let _ = writeln!(md, "- command: `{}`", r.command);
    let _ = writeln!(
        md,
        "- memfs {}, started {} UTC, took {:.1} min{}",
        r.memfs_version,
        utc_human(r.started_unix),
        r.duration_secs / 60.0,
        if r.quick {
            " (`--quick`: small sizes)"
        } else {
            ""
        }
    );
}

/// The machine and the file systems the run used.
fn machine_section(md: &mut String, r: &Results) {
    let m = &r.machine;
    let _ = writeln!(md, "\n## Machine\n");
    let _ = writeln!(md, "| | |\n|---|---|");
    let _ = writeln!(md, "| CPU | {} |", cell(&m.cpu_model));
    let _ = writeln!(md, "| cores | {} |", m.cpus);
    let _ = writeln!(
        md,
        "| memory | {:.1} GiB |",
        m.memory_bytes as f64 / (1u64 << 30) as f64
    );
    let _ = writeln!(md, "| kernel | {} |", cell(&m.kernel));
    let _ = writeln!(
        md,
        "| load average at start | {} |",
        m.load_average
            .map_or_else(|| "-".into(), |l| format!("{l:.2}"))
    );
    for fs in &r.file_systems {
        let _ = writeln!(
            md,
            "| {} | `{}` ({}) |",
            cell(&fs.role),
            cell(&fs.path),
            cell(&fs.fs_type)
        );
    }
}

/// One line a benchmark kind: its steps that ran and how memfs compares.
fn summary_section(md: &mut String, r: &Results) {
    let _ = writeln!(md, "\n## Summary\n");
    let _ = writeln!(md, "| benchmark | steps | result |\n|---|---|---|");
    for kind in KINDS {
        let steps: Vec<_> = r.steps.iter().filter(|s| s.kind == kind).collect();
        let figs: Vec<&RunFigure> = r.figures.iter().filter(|f| f.kind == kind).collect();
        let ok = steps.iter().filter(|s| s.status == Status::Ok).count();
        let result = if figs.is_empty() {
            steps
                .iter()
                .find_map(|s| s.reason.clone())
                .map_or_else(|| "not run".into(), |r| format!("not run: {r}"))
        } else {
            kind_summary(&figs)
        };
        let _ = writeln!(
            md,
            "| [{}](#{}) | {ok} of {} ran | {} |",
            kind_title(kind),
            kind,
            steps.len(),
            cell(&result)
        );
    }
}

/// A benchmark kind: its plots, then each of its steps.
fn kind_section(md: &mut String, r: &Results, kind: &str, images: &str) {
    let _ = writeln!(md, "\n<a id=\"{kind}\"></a>\n## {}\n", kind_title(kind));
    for p in r.plots.iter().filter(|p| plot_kind(p) == Some(kind)) {
        let name = Path::new(p)
            .file_name()
            .map_or_else(|| p.clone(), |n| n.to_string_lossy().into_owned());
        let _ = writeln!(
            md,
            "[![{name}]({images}/{name}.png)]({images}/{name}.svg)\n"
        );
    }
    for s in r.steps.iter().filter(|s| s.kind == kind) {
        step_section(md, r, s);
    }
}

/// A step: its command, and its figures' table (or why it has none).
fn step_section(md: &mut String, r: &Results, s: &StepRecord) {
    let _ = writeln!(md, "### {}\n", cell(&s.title));
    let _ = writeln!(md, "`{}`\n", s.command);
    match s.status {
        Status::Skipped => {
            let _ = writeln!(
                md,
                "Skipped: {}\n",
                s.reason.as_deref().unwrap_or("(no reason recorded)")
            );
            return;
        }
        Status::Failed => {
            let _ = writeln!(
                md,
                "**Failed** after {:.1} s: {}\n",
                s.duration_secs,
                cell(s.reason.as_deref().unwrap_or("(no error recorded)"))
            );
            return;
        }
        Status::Ok => {}
    }
    let figs: Vec<&RunFigure> = r.figures.iter().filter(|f| f.step == s.id).collect();
    let mut names: Vec<&str> = Vec::new();
    for n in figs
        .iter()
        .filter_map(|f| f.figure.baseline_name.as_deref())
    {
        if !names.contains(&n) {
            names.push(n);
        }
    }
    let base = if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    };
    let _ = writeln!(md, "{:.1} s. Baseline: {}.\n", s.duration_secs, cell(&base));
    let _ = writeln!(
        md,
        "| figure | unit | memfs | baseline | ratio | target | met |\n|---|---|--:|--:|--:|--:|---|"
    );
    for f in figs {
        let f = &f.figure;
        let _ = writeln!(
            md,
            "| `{}` | {} | {} | {} | {} | {} | {} |",
            f.figure,
            cell(&f.unit),
            with_sd(f.value, f.stddev),
            f.baseline
                .map_or_else(|| "-".into(), |b| with_sd(b, f.baseline_stddev)),
            f.ratio.map_or_else(|| "-".into(), |x| format!("{x:.2}x")),
            target_cell(f),
            met_cell(f)
        );
    }
    let _ = writeln!(md);
}

/// `2026-11-23 07:05:21` (UTC).
fn utc_human(t: u64) -> String {
    let s = crate::results::utc_stamp(t);
    let (date, time) = s.split_once('T').unwrap_or((&s, ""));
    format!("{date} {}", time.trim_end_matches('Z').replace('-', ":"))
}

/// Which benchmark a plot belongs to, from its file name.
fn plot_kind(stem: &str) -> Option<&'static str> {
    let name = Path::new(stem).file_name()?.to_str()?;
    KINDS
        .iter()
        .copied()
        .find(|k| name == *k || name.starts_with(&format!("{k}-")))
}

pub fn run_report(args: ReportArgs) -> anyhow::Result<()> {
    let r = Results::load(&args.dir)?;
    let problems = r.problems();
    let out_dir = args
        .output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let stem = args
        .output
        .file_stem()
        .context("--output needs a file name")?
        .to_string_lossy()
        .into_owned();
    let images = out_dir.join(&stem);
    std::fs::create_dir_all(&images)
        .with_context(|| format!("cannot create {}", images.display()))?;
    let src = if args.dir.is_dir() {
        args.dir.clone()
    } else {
        args.dir.parent().unwrap_or(Path::new(".")).to_path_buf()
    };
    let mut missing = Vec::new();
    for p in &r.plots {
        let name = Path::new(p).file_name().context("bad plot name")?;
        for ext in ["svg", "png"] {
            let from = src.join(format!("{p}.{ext}"));
            let to = images.join(format!("{}.{ext}", name.to_string_lossy()));
            if let Err(e) = std::fs::copy(&from, &to) {
                missing.push(format!("plot {} ({e})", from.display()));
            }
        }
    }
    let md = render(&r, &stem);
    std::fs::write(&args.output, md)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    eprintln!(
        "report: wrote {} and {} plots under {}",
        args.output.display(),
        r.plots.len(),
        images.display()
    );
    let mut problems = problems;
    problems.extend(missing);
    if r.plots.is_empty() && r.figures.iter().any(|f| f.kind != "memory") {
        problems.push("no plots in the results folder".into());
    }
    if !problems.is_empty() {
        for p in &problems {
            eprintln!("report: incomplete: {p}");
        }
        if args.check {
            bail!(
                "{} is incomplete ({} problem(s) above)",
                args.dir.display(),
                problems.len()
            );
        }
    }
    Ok(())
}

/// How one figure moved between two runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub key: String,
    pub unit: String,
    pub old: f64,
    pub new: f64,
    /// (new - old) / old; positive = larger.
    pub change: f64,
    /// The relative change below which a move is noise.
    pub noise: f64,
    pub verdict: Verdict,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Same,
    Better,
    Worse,
    Regressed,
}

/// Compares one figure: the relative noise is twice the combined relative
/// standard deviation of both runs, at least `floor` (or `floor_unmeasured`
/// when either run recorded no standard deviation). A change beyond the noise
/// in the worse direction is a regression; within it, only "worse".
pub fn compare_one(
    old: (f64, Option<f64>),
    new: (f64, Option<f64>),
    better: Better,
    floor: f64,
    floor_unmeasured: f64,
) -> (f64, f64, Verdict) {
    let rel = |(v, sd): (f64, Option<f64>)| sd.map(|s| if v != 0.0 { s / v.abs() } else { 0.0 });
    let (ro, rn) = (rel(old), rel(new));
    let combined = (ro.unwrap_or(0.0).powi(2) + rn.unwrap_or(0.0).powi(2)).sqrt();
    let floor = if ro.is_some() && rn.is_some() {
        floor
    } else {
        floor_unmeasured
    };
    let noise = (2.0 * combined).max(floor);
    let change = if old.0 != 0.0 {
        (new.0 - old.0) / old.0.abs()
    } else if new.0 == 0.0 {
        0.0
    } else {
        f64::INFINITY.copysign(new.0)
    };
    let worse = match better {
        Better::Higher => change < 0.0,
        Better::Lower => change > 0.0,
    };
    let verdict = if change == 0.0 {
        Verdict::Same
    } else if !worse {
        if change.abs() > noise {
            Verdict::Better
        } else {
            Verdict::Same
        }
    } else if change.abs() > noise {
        Verdict::Regressed
    } else {
        Verdict::Worse
    };
    (change, noise, verdict)
}

/// The metric compared: the value, or with `ratios` the ratio to the
/// baseline (its relative deviation combining both sides').
fn metric(f: &Figure, ratios: bool) -> (f64, Option<f64>) {
    if ratios && let (Some(r), Some(b)) = (f.ratio, f.baseline) {
        let rel = |v: f64, sd: Option<f64>| sd.map(|s| s / v.abs().max(1e-300));
        let sd = match (rel(f.value, f.stddev), rel(b, f.baseline_stddev)) {
            (Some(a), Some(c)) => Some(r * (a * a + c * c).sqrt()),
            _ => None,
        };
        return (r, sd);
    }
    (f.value, f.stddev)
}

pub fn compare(old: &Results, new: &Results, args: &CompareArgs) -> (Vec<Change>, Vec<String>) {
    let floor = args.floor / 100.0;
    let floor_u = args.floor_unmeasured / 100.0;
    let key = |f: &RunFigure| format!("{}/{}", f.step, f.figure.figure);
    let mut changes = Vec::new();
    let mut notes = Vec::new();
    for nf in &new.figures {
        let k = key(nf);
        let Some(of) = old.figures.iter().find(|o| key(o) == k) else {
            notes.push(format!("new figure {k}"));
            continue;
        };
        let ratios = args.ratios && of.figure.ratio.is_some() && nf.figure.ratio.is_some();
        let (o, n) = (metric(&of.figure, ratios), metric(&nf.figure, ratios));
        let (change, noise, verdict) = compare_one(o, n, nf.figure.better, floor, floor_u);
        changes.push(Change {
            key: k,
            unit: if ratios {
                "x baseline".into()
            } else {
                nf.figure.unit.clone()
            },
            old: o.0,
            new: n.0,
            change,
            noise,
            verdict,
        });
    }
    for of in &old.figures {
        let k = key(of);
        if !new.figures.iter().any(|n| key(n) == k) {
            notes.push(format!("figure {k} is gone"));
        }
    }
    (changes, notes)
}

pub fn run_compare(args: CompareArgs) -> anyhow::Result<()> {
    if !(args.floor >= 0.0 && args.floor_unmeasured >= 0.0) {
        bail!("--floor and --floor-unmeasured must be non-negative percentages");
    }
    let old = Results::load(&args.old)?;
    let new = Results::load(&args.new)?;
    let (changes, notes) = compare(&old, &new, &args);
    print_changes(&changes);
    for n in &notes {
        println!("note: {n}");
    }
    let regressed: Vec<&Change> = changes
        .iter()
        .filter(|c| c.verdict == Verdict::Regressed)
        .collect();
    let better = changes
        .iter()
        .filter(|c| c.verdict == Verdict::Better)
        .count();
    println!(
        "{} figures compared: {} regressed, {better} better beyond the noise, {} within it",
        changes.len(),
        regressed.len(),
        changes.len() - regressed.len() - better
    );
    if !regressed.is_empty() && !args.no_fail {
        bail!(
            "{} figure(s) regressed beyond the noise: {}",
            regressed.len(),
            regressed
                .iter()
                .map(|c| c.key.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}

/// The comparison's table: one line a figure, with its verdict.
fn print_changes(changes: &[Change]) {
    let w = changes
        .iter()
        .map(|c| c.key.len())
        .max()
        .unwrap_or(6)
        .max(6);
    println!(
        "{:<w$}  {:>12}  {:>12}  {:>9}  {:>7}  {:<10}  verdict",
        "figure", "old", "new", "change", "noise", "unit"
    );
    for c in changes {
        let fmt = |v: f64| {
            if c.unit == "x baseline" {
                format!("{v:.3}")
            } else {
                fmt_num(v)
            }
        };
        println!(
            "{:<w$}  {:>12}  {:>12}  {:>+8.1}%  {:>6.1}%  {:<10}  {}",
            c.key,
            fmt(c.old),
            fmt(c.new),
            c.change * 100.0,
            c.noise * 100.0,
            c.unit,
            match c.verdict {
                Verdict::Same => "same",
                Verdict::Better => "better",
                Verdict::Worse => "worse (within noise)",
                Verdict::Regressed => "REGRESSED",
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_rule() {
        // 10 % worse with 1 % deviations: beyond the 5 % floor.
        let (c, n, v) = compare_one(
            (100.0, Some(1.0)),
            (90.0, Some(1.0)),
            Better::Higher,
            0.05,
            0.1,
        );
        assert!((c + 0.1).abs() < 1e-12 && (n - 0.05).abs() < 1e-12);
        assert_eq!(v, Verdict::Regressed);
        // The same move with 10 % deviations is within 2 * 14 % noise.
        let (_, n, v) = compare_one(
            (100.0, Some(10.0)),
            (90.0, Some(9.0)),
            Better::Higher,
            0.05,
            0.1,
        );
        assert!(n > 0.28 && n < 0.29, "{n}");
        assert_eq!(v, Verdict::Worse);
        // Lower is better: a time that grows regresses, one that shrinks improves.
        assert_eq!(
            compare_one(
                (10.0, Some(0.1)),
                (12.0, Some(0.1)),
                Better::Lower,
                0.05,
                0.1
            )
            .2,
            Verdict::Regressed
        );
        assert_eq!(
            compare_one(
                (10.0, Some(0.1)),
                (8.0, Some(0.1)),
                Better::Lower,
                0.05,
                0.1
            )
            .2,
            Verdict::Better
        );
        // Without deviations the larger floor applies: 8 % is noise.
        assert_eq!(
            compare_one((100.0, None), (92.0, None), Better::Higher, 0.05, 0.1).2,
            Verdict::Worse
        );
        assert_eq!(
            compare_one((100.0, None), (100.0, None), Better::Higher, 0.05, 0.1).2,
            Verdict::Same
        );
    }

    #[test]
    fn ratio_metric_combines_deviations() {
        let f =
            Figure::new("x", "ops/s", 50.0)
                .stddev(Some(5.0))
                .baseline("tmpfs", 100.0, Some(10.0));
        let (r, sd) = metric(&f, true);
        assert!((r - 0.5).abs() < 1e-12);
        assert!((sd.unwrap() - 0.5 * (0.02f64).sqrt()).abs() < 1e-9);
        assert_eq!(metric(&f, false), (50.0, Some(5.0)));
    }

    #[test]
    fn plot_kinds() {
        assert_eq!(plot_kind("plots/metadata-shared"), Some("metadata"));
        assert_eq!(plot_kind("plots/lock-byte_ranges-memfs"), Some("lock"));
        assert_eq!(plot_kind("plots/fio"), Some("fio"));
        assert_eq!(plot_kind("plots/other"), None);
    }
}
