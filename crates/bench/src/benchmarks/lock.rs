//! `memfs bench lock`: throughput of the cross-process lock algorithms.
//!
//! Workers are this same binary re-run with the hidden `--worker SPEC` flag,
//! so the benchmark needs nothing but `memfs` itself.

use std::path::PathBuf;
use std::process::Command;

use crate::benchmarks::lock_engine::{self as bench, Config, Measurement};
use anyhow::Context;
use memfs_lock::Algorithm;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// lock_files, byte_ranges, atomic_append or memory_map (with --matrix:
    /// default all four).
    #[arg(long)]
    pub algorithm: Option<Algorithm>,
    /// Entities locked per operation.
    #[arg(long, default_value_t = 1)]
    pub entities: usize,
    /// Worker processes.
    #[arg(long, default_value_t = 1)]
    pub waiters: usize,
    /// Each worker locks its own entities instead of everyone locking 0..E.
    #[arg(long)]
    pub uncontended: bool,
    /// Directory for the lock (repeat for several file systems).
    #[arg(long = "dir", default_value = "/dev/shm")]
    pub dirs: Vec<PathBuf>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Sweep entities and waiters over 1..=--max; write a table, JSON and heat maps.
    #[arg(long)]
    pub matrix: bool,
    /// Largest entities / waiters in the matrix.
    #[arg(long, default_value_t = 8)]
    pub max: usize,
    /// Where the matrix writes its results.
    #[arg(long, default_value = "bench-results/lock")]
    pub out: PathBuf,
    /// Internal: run as a benchmark worker.
    #[arg(long, hide = true)]
    pub worker: Option<String>,
}

fn spawner() -> anyhow::Result<impl Fn(&str) -> Command> {
    let exe = std::env::current_exe().context("locating the memfs binary")?;
    Ok(move |spec: &str| {
        let mut c = Command::new(&exe);
        c.args(["bench", "lock", "--worker", spec]);
        c
    })
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(spec) = &args.worker {
        return bench::worker_main(spec).context("benchmark worker");
    }
    anyhow::ensure!(args.seconds > 0.0, "--seconds must be positive");
    anyhow::ensure!(
        args.entities >= 1 && args.waiters >= 1 && args.max >= 1,
        "entities, waiters and max must be >= 1"
    );
    let spawn = spawner()?;
    if args.matrix {
        return matrix(&args, &spawn);
    }
    let alg = args
        .algorithm
        .context("--algorithm is required without --matrix")?;
    println!(
        "| algorithm | file system | entities | waiters | mode | ops/s | ops/CPU-s | vs flock |"
    );
    println!("|---|---|---:|---:|---|---:|---:|---:|");
    for dir in &args.dirs {
        let cfg = Config {
            algorithm: alg.name().into(),
            entities: args.entities,
            waiters: args.waiters,
            uncontended: args.uncontended,
            dir: dir.clone(),
            seconds: args.seconds,
        };
        let m = bench::run_one(&cfg, &spawn)
            .with_context(|| format!("benchmark in {}", dir.display()))?;
        // Baseline measured in the same run, same waiters: the machine is
        // shared and noisy, so the ratio is the number to quote.
        let base_cfg = Config {
            algorithm: bench::BASELINE.into(),
            entities: 1,
            ..cfg
        };
        let base = bench::run_one(&base_cfg, &spawn)
            .with_context(|| format!("baseline in {}", dir.display()))?;
        print_row(&m, &base);
        print_row(&base, &base);
    }
    Ok(())
}

fn print_row(m: &Measurement, base: &Measurement) {
    println!(
        "| {} | {} | {} | {} | {} | {:.0} | {:.0} | {:.2}x |",
        m.algorithm,
        m.file_system,
        m.entities,
        m.waiters,
        if m.uncontended {
            "uncontended"
        } else {
            "contended"
        },
        m.ops_per_sec,
        m.ops_per_cpu_sec(),
        m.ops_per_sec / base.ops_per_sec.max(1e-9),
    );
}

fn matrix(args: &Args, spawn: &dyn Fn(&str) -> Command) -> anyhow::Result<()> {
    let results = matrix_results(args, spawn)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let mode = if args.uncontended {
        "uncontended"
    } else {
        "contended"
    };
    let table = format!(
        "## ops/s\n{}\n## ops per CPU second\n{}",
        bench::matrix_table(&results, false),
        bench::matrix_table(&results, true)
    );
    println!("{table}");
    let md = args.out.join(format!("lock-matrix-{mode}.md"));
    std::fs::write(&md, &table).with_context(|| format!("writing {}", md.display()))?;
    let json = args.out.join(format!("lock-matrix-{mode}.json"));
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    bench::write_json(&json, &command, &machine(), &results)
        .with_context(|| format!("writing {}", json.display()))?;
    let maps = bench::heat_maps(&results, &args.out.join(mode))?;
    println!(
        "wrote {}, {} and {} heat maps under {}",
        md.display(),
        json.display(),
        maps.len(),
        args.out.display()
    );
    Ok(())
}

/// The matrix's cells (the flock baseline first in each directory), with a
/// progress bar.
fn matrix_results(
    args: &Args,
    spawn: &dyn Fn(&str) -> Command,
) -> anyhow::Result<Vec<Measurement>> {
    let algs: Vec<Algorithm> = match args.algorithm {
        Some(a) => vec![a],
        None => Algorithm::ALL.to_vec(),
    };
    let total = (args.dirs.len() * (algs.len() * args.max * args.max + args.max)) as u64;
    let bar = crate::common::progress(total, "{bar:40} {pos}/{len} {msg} (eta {eta})");
    let results = bench::run_matrix(
        &algs,
        &args.dirs,
        args.max,
        args.uncontended,
        args.seconds,
        spawn,
        &mut |m| {
            bar.set_message(format!(
                "{} {} E={} W={}",
                m.algorithm, m.file_system, m.entities, m.waiters
            ));
            bar.inc(1);
        },
    )?;
    bar.finish_and_clear();
    Ok(results)
}

/// Runs the matrix as `memfs bench lock --matrix` does and returns it in the
/// common report format (nothing printed but progress, nothing written):
/// `memfs bench all` calls this. `labels[i]` names `args.dirs[i]` in figure
/// names (the file system's own name otherwise). Figures
/// `lock.<fs>.<algorithm>.e<E>.w<W>` (ops/s) have the flock(2) cell with the
/// same waiters in the same directory as their baseline; `lock.<fs>.flock.w<W>`
/// is the baseline itself.
pub fn report(args: &Args, labels: &[String]) -> anyhow::Result<crate::common::Report> {
    use crate::common::{Figure, Report};
    anyhow::ensure!(args.seconds > 0.0, "--seconds must be positive");
    anyhow::ensure!(args.max >= 1, "--max must be >= 1");
    let started = std::time::Instant::now();
    let mut report = Report::new(
        "lock",
        serde_json::json!({
            "algorithms": args.algorithm.map_or_else(
                || Algorithm::ALL.iter().map(|a| a.name()).collect::<Vec<_>>(),
                |a| vec![a.name()],
            ),
            "dirs": args.dirs,
            "labels": labels,
            "max": args.max,
            "seconds": args.seconds,
            "uncontended": args.uncontended,
        }),
    );
    let spawn = spawner()?;
    let results = matrix_results(args, &spawn)?;
    let label = |m: &Measurement| {
        args.dirs
            .iter()
            .position(|d| *d == m.dir)
            .and_then(|i| labels.get(i))
            .cloned()
            .unwrap_or_else(|| m.file_system.clone())
    };
    for m in &results {
        let fs = label(m);
        if m.algorithm == bench::BASELINE {
            report.figures.push(Figure::new(
                format!("lock.{fs}.{}.w{}", m.algorithm, m.waiters),
                "ops/s",
                m.ops_per_sec,
            ));
            continue;
        }
        let mut f = Figure::new(
            format!("lock.{fs}.{}.e{}.w{}", m.algorithm, m.entities, m.waiters),
            "ops/s",
            m.ops_per_sec,
        );
        if let Some(b) = results
            .iter()
            .find(|b| b.algorithm == bench::BASELINE && b.dir == m.dir && b.waiters == m.waiters)
        {
            f = f.baseline(format!("flock on {fs}"), b.ops_per_sec, None);
        }
        report.figures.push(f);
    }
    report.duration_secs = started.elapsed().as_secs_f64();
    Ok(report)
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    format!("{cpu}, {cores} cores")
}
