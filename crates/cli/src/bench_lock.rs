//! `memfs bench lock`: throughput of the cross-process lock algorithms.
//!
//! Workers are this same binary re-run with the hidden `--worker SPEC` flag,
//! so the benchmark needs nothing but `memfs` itself.

use std::path::PathBuf;
use std::process::Command;

use anyhow::Context;
use memfs_lock::Algorithm;
use memfs_lock::bench::{self, Config, Measurement};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// lock_files, byte_ranges, atomic_append or memory_map (with --matrix:
    /// default all four).
    #[arg(long)]
    algorithm: Option<Algorithm>,
    /// Entities locked per operation.
    #[arg(long, default_value_t = 1)]
    entities: usize,
    /// Worker processes.
    #[arg(long, default_value_t = 1)]
    waiters: usize,
    /// Each worker locks its own entities instead of everyone locking 0..E.
    #[arg(long)]
    uncontended: bool,
    /// Directory for the lock (repeat for several file systems).
    #[arg(long = "dir", default_value = "/dev/shm")]
    dirs: Vec<PathBuf>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Sweep entities and waiters over 1..=--max; write a table, JSON and heat maps.
    #[arg(long)]
    matrix: bool,
    /// Largest entities / waiters in the matrix.
    #[arg(long, default_value_t = 8)]
    max: usize,
    /// Where the matrix writes its results.
    #[arg(long, default_value = "bench-results/lock")]
    out: PathBuf,
    /// Internal: run as a benchmark worker.
    #[arg(long, hide = true)]
    worker: Option<String>,
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
    let algs: Vec<Algorithm> = match args.algorithm {
        Some(a) => vec![a],
        None => Algorithm::ALL.to_vec(),
    };
    let total = (args.dirs.len() * (algs.len() * args.max * args.max + args.max)) as u64;
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} {msg} (eta {eta})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
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
    crate::bench_util::register_plot_font()?;
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
