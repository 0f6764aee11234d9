//! `memfs bench workload`: the student shell workload (section 2 of the
//! reference workloads) — create, write, read and delete phases of N
//! operations at several thread counts — on the engine in process, or on real
//! files under a directory, next to a baseline (tmpfs) measured in the same run.
//!
//! Each phase starts all threads at a barrier and is timed from its release
//! to the last thread's end; every operation is also timed on its own for the
//! latency percentiles, from the end of the one before it. File names are
//! built before the clock starts, so the phases time the file system, not
//! string formatting.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use memfs_fs::{Config, Ctx, Fs, ROOT_INO};
use serde::Serialize;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Operations per phase, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "100,1000,10000")]
    pub ops: Vec<usize>,
    /// Thread counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    pub threads: Vec<usize>,
    /// Run on real files under this directory (a memfs mount, tmpfs, a disk)
    /// instead of the engine in process.
    #[arg(long, value_name = "DIR")]
    pub path: Option<PathBuf>,
    /// Baseline measured in the same run: the same workload on files under
    /// this directory; `none` to skip.
    #[arg(long, value_name = "DIR", default_value = "/dev/shm")]
    pub baseline: String,
    /// Put every thread's files in one shared directory (the student shell's
    /// flat namespace) instead of one directory per thread.
    #[arg(long)]
    pub shared_dir: bool,
    /// Bytes appended to each file in the write phase.
    #[arg(long, default_value_t = 64, value_name = "BYTES")]
    pub write_size: usize,
    /// Runs per configuration; each phase reports its median run.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub runs: usize,
    /// Discarded runs before the measured ones, so that first-touch page
    /// faults of the allocator do not land on whichever configuration runs first.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub warmup: usize,
    /// Internal: measure the resident memory of N small files in this fresh
    /// process and print it in KiB (the benchmark runs itself with this).
    #[arg(long, hide = true, value_name = "N")]
    pub probe_memory: Option<usize>,
    /// Machine-readable results.
    #[arg(long, default_value = "workload.json", value_name = "FILE")]
    pub json: PathBuf,
    /// Plot of time per phase against threads (largest --ops): PREFIX.svg and PREFIX.png.
    #[arg(long, default_value = "workload", value_name = "PREFIX")]
    pub plot: PathBuf,
}

const PHASES: [&str; 4] = ["create", "write", "read", "delete"];

/// The published student shell figures for 10,000 operations (ms, min..max over 1-16 threads).
const STUDENT_MS: [(f64, f64); 4] = [(15.0, 45.0), (10.0, 27.0), (30.0, 34.0), (6.0, 30.0)];

#[derive(Serialize, Clone, Debug)]
struct PhaseResult {
    target: String,
    ops: usize,
    threads: usize,
    phase: &'static str,
    total_ms: f64,
    mean_us: f64,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
    ops_per_sec: f64,
    /// CPU time over wall time, in percent of one core (can exceed 100).
    cpu_percent: f64,
    /// Peak resident memory of the process during this configuration so far.
    peak_rss_mib: f64,
    /// Resident memory growth since just before the create phase (the
    /// allocator reuses what earlier runs freed: see the fresh-process probe).
    rss_growth_mib: f64,
    /// Standard deviation of `total_ms` over the measured runs (not in this
    /// command's JSON; `memfs bench all` records it for its noise rule).
    #[serde(skip)]
    total_ms_sd: Option<f64>,
}

/// Where the workload runs.
enum Target {
    Engine,
    Files(PathBuf),
}

impl Target {
    fn label(&self) -> String {
        match self {
            Target::Engine => "memfs engine (in process)".into(),
            Target::Files(p) => format!("files under {}", p.display()),
        }
    }
}

/// One run's prepared state: the names each thread works on.
enum Prepared {
    Engine {
        fs: Arc<Fs>,
        /// Per thread: its directory and its file names.
        work: Vec<(u64, Vec<Vec<u8>>)>,
    },
    Files {
        root: PathBuf,
        work: Vec<Vec<PathBuf>>,
    },
}

fn split(ops: usize, threads: usize, t: usize) -> std::ops::Range<usize> {
    let per = ops / threads;
    let extra = ops % threads;
    let start = t * per + t.min(extra);
    start..start + per + usize::from(t < extra)
}

fn prepare(target: &Target, ops: usize, threads: usize, shared: bool) -> anyhow::Result<Prepared> {
    let name = |t: usize, i: usize| {
        if shared {
            format!("t{t}-f{i}")
        } else {
            format!("f{i}")
        }
    };
    match target {
        Target::Engine => {
            let fs = Arc::new(Fs::new(Config {
                capacity: 4 << 30,
                max_inodes: (ops as u64 + threads as u64) * 2 + 1024,
            }));
            let ctx = Ctx::current();
            let mut work = Vec::new();
            for t in 0..threads {
                let dir = if shared {
                    ROOT_INO
                } else {
                    let a = fs
                        .mkdir(ctx, ROOT_INO, format!("t{t}").as_bytes(), 0o755)
                        .map_err(|e| anyhow::anyhow!("mkdir: {e}"))?;
                    fs.forget(a.ino, 1);
                    a.ino
                };
                let names = split(ops, threads, t)
                    .map(|i| name(t, i).into_bytes())
                    .collect();
                work.push((dir, names));
            }
            Ok(Prepared::Engine { fs, work })
        }
        Target::Files(base) => {
            let root = base.join(format!("memfs-workload-{}", std::process::id()));
            if root.exists() {
                std::fs::remove_dir_all(&root)
                    .with_context(|| format!("cleaning {}", root.display()))?;
            }
            std::fs::create_dir(&root).with_context(|| format!("creating {}", root.display()))?;
            let mut work = Vec::new();
            for t in 0..threads {
                let dir = if shared {
                    root.clone()
                } else {
                    let d = root.join(format!("t{t}"));
                    std::fs::create_dir(&d)?;
                    d
                };
                work.push(
                    split(ops, threads, t)
                        .map(|i| dir.join(name(t, i)))
                        .collect(),
                );
            }
            Ok(Prepared::Files { root, work })
        }
    }
}

/// Records the time since `start` as one operation's latency and starts the
/// next operation's clock where this one's stopped: one clock read per
/// operation (see [`Prepared::run_thread`]).
fn lap(start: &mut Instant, lat: &mut Vec<u64>) {
    let end = Instant::now();
    lat.push(end.duration_since(*start).as_nanos() as u64);
    *start = end;
}

impl Prepared {
    fn threads(&self) -> usize {
        match self {
            Prepared::Engine { work, .. } => work.len(),
            Prepared::Files { work, .. } => work.len(),
        }
    }

    /// Runs operation `phase` on thread `t`'s files, recording each latency in ns.
    fn run_thread(
        &self,
        phase: usize,
        t: usize,
        data: &[u8],
        lat: &mut Vec<u64>,
    ) -> anyhow::Result<()> {
        let mut buf = vec![0u8; data.len().max(4096)];
        match self {
            Prepared::Engine { fs, work } => {
                let (dir, names) = &work[t];
                engine_phase(fs, *dir, names, phase, data, &mut buf, lat)
            }
            Prepared::Files { work, .. } => files_phase(&work[t], phase, data, &mut buf, lat),
        }
    }

    fn cleanup(&self) {
        if let Prepared::Files { root, .. } = self {
            let _ = std::fs::remove_dir_all(root);
        }
    }
}

/// Operation `phase` on each of `names` in directory `dir` of the engine.
fn engine_phase(
    fs: &Fs,
    dir: u64,
    names: &[Vec<u8>],
    phase: usize,
    data: &[u8],
    buf: &mut [u8],
    lat: &mut Vec<u64>,
) -> anyhow::Result<()> {
    let ctx = Ctx::current();
    // One clock read per operation: each ends where the next
    // starts. A read costs ~23 ns here (vDSO), a tenth of an
    // engine operation, so two per operation were a fifth of
    // the phase's time.
    let mut start = Instant::now();
    for name in names {
        let r = match phase {
            0 => fs.create(ctx, dir, name, 0o644, true).map(|(a, _)| {
                fs.release(a.ino);
                fs.forget(a.ino, 1);
            }),
            1 => fs
                .lookup_noref(dir, name)
                .and_then(|a| fs.write(ctx, a.ino, 0, data, true))
                .map(|_| ()),
            2 => fs
                .lookup_noref(dir, name)
                .and_then(|a| fs.read(a.ino, 0, buf))
                .and_then(|n| {
                    if n == data.len() {
                        Ok(())
                    } else {
                        Err(memfs_fs::Errno::EIO)
                    }
                }),
            _ => fs.unlink(dir, name),
        };
        lap(&mut start, lat);
        r.map_err(|e| anyhow::anyhow!("{} {}: {e}", PHASES[phase], String::from_utf8_lossy(name)))?;
    }
    Ok(())
}

/// Operation `phase` on each of `paths` through the kernel.
fn files_phase(
    paths: &[PathBuf],
    phase: usize,
    data: &[u8],
    buf: &mut [u8],
    lat: &mut Vec<u64>,
) -> anyhow::Result<()> {
    let mut start = Instant::now();
    for path in paths {
        let r = match phase {
            0 => OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .map(drop),
            1 => OpenOptions::new()
                .append(true)
                .open(path)
                .and_then(|mut f| f.write_all(data)),
            2 => std::fs::File::open(path).and_then(|mut f| {
                let n = f.read(buf)?;
                if n == data.len() {
                    Ok(())
                } else {
                    Err(std::io::Error::other("short read"))
                }
            }),
            _ => std::fs::remove_file(path),
        };
        lap(&mut start, lat);
        r.with_context(|| format!("{} {}", PHASES[phase], path.display()))?;
    }
    Ok(())
}

/// User + system CPU time of this process.
fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into the zeroed struct we own; RUSAGE_SELF is valid.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// A field of /proc/self/status in KiB (VmRSS, VmHWM).
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Resets VmHWM to the current RSS (Linux >= 4.0), so that each configuration's
/// peak is its own; harmless where unsupported.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

/// One run of the four phases; returns (wall, cpu, latencies, peak, growth) per phase.
fn run_once(
    target: &Target,
    ops: usize,
    threads: usize,
    args: &Args,
) -> anyhow::Result<Vec<PhaseResult>> {
    let prepared = prepare(target, ops, threads, args.shared_dir)?;
    let data = vec![b'x'; args.write_size];
    reset_peak_rss();
    let rss0 = status_kib("VmRSS:");
    let mut out = Vec::new();
    let result = (|| -> anyhow::Result<()> {
        for (phase, name) in PHASES.iter().enumerate() {
            let (wall, cpu, mut lats) = run_phase(&prepared, phase, ops, &data)?;
            lats.sort_unstable();
            let wall_s = wall.as_secs_f64().max(1e-9);
            let mean = lats.iter().sum::<u64>() as f64 / lats.len().max(1) as f64 / 1000.0;
            out.push(PhaseResult {
                target: target.label(),
                ops,
                threads,
                phase: name,
                total_ms: wall_s * 1000.0,
                mean_us: mean,
                p50_us: percentile(&lats, 0.50),
                p99_us: percentile(&lats, 0.99),
                max_us: lats.last().map_or(0.0, |&v| v as f64 / 1000.0),
                ops_per_sec: ops as f64 / wall_s,
                cpu_percent: cpu.as_secs_f64() / wall_s * 100.0,
                peak_rss_mib: status_kib("VmHWM:") as f64 / 1024.0,
                rss_growth_mib: (status_kib("VmRSS:") as f64 - rss0 as f64) / 1024.0,
                total_ms_sd: None,
            });
        }
        Ok(())
    })();
    prepared.cleanup();
    result.map(|_| out)
}

/// Operation `phase` on every thread of `prepared` at once: the phase's
/// wall time (first start to last end), CPU time, and every latency in ns.
fn run_phase(
    prepared: &Prepared,
    phase: usize,
    ops: usize,
    data: &[u8],
) -> anyhow::Result<(Duration, Duration, Vec<u64>)> {
    let n = prepared.threads();
    let barrier = Barrier::new(n + 1);
    std::thread::scope(|s| -> anyhow::Result<_> {
        let handles: Vec<_> = (0..n)
            .map(|t| {
                let (p, b, d) = (prepared, &barrier, data);
                s.spawn(move || {
                    let mut lat = Vec::with_capacity(split(ops, n, t).len());
                    b.wait();
                    // Each thread stamps its own start: on a busy machine the
                    // workers may run long before the main thread is scheduled.
                    let start = Instant::now();
                    let r = p.run_thread(phase, t, d, &mut lat);
                    r.map(|_| (start, Instant::now(), lat))
                })
            })
            .collect();
        let cpu0 = cpu_time();
        barrier.wait();
        let mut lats = Vec::with_capacity(ops);
        let mut first_err = None;
        let (mut t0, mut t1): (Option<Instant>, Option<Instant>) = (None, None);
        for h in handles {
            match h.join() {
                Ok(Ok((a, b, l))) => {
                    t0 = Some(t0.map_or(a, |t| t.min(a)));
                    t1 = Some(t1.map_or(b, |t| t.max(b)));
                    lats.extend(l)
                }
                Ok(Err(e)) => first_err = first_err.or(Some(e)),
                Err(_) => first_err = first_err.or(Some(anyhow::anyhow!("a worker panicked"))),
            }
        }
        let cpu = cpu_time().saturating_sub(cpu0);
        let wall = match (t0, t1) {
            (Some(a), Some(b)) => b.duration_since(a),
            _ => Duration::ZERO,
        };
        match first_err {
            Some(e) => Err(e),
            None => Ok((wall, cpu, lats)),
        }
    })
}

/// Each phase's median over `runs` runs (by total time).
fn run_config(
    target: &Target,
    ops: usize,
    threads: usize,
    args: &Args,
) -> anyhow::Result<Vec<PhaseResult>> {
    for _ in 0..args.warmup {
        run_once(target, ops, threads, args)?;
    }
    let mut runs = Vec::new();
    for _ in 0..args.runs.max(1) {
        runs.push(run_once(target, ops, threads, args)?);
    }
    Ok((0..PHASES.len())
        .map(|p| {
            let mut v: Vec<&PhaseResult> = runs.iter().map(|r| &r[p]).collect();
            v.sort_by(|a, b| a.total_ms.total_cmp(&b.total_ms));
            let times: Vec<f64> = v.iter().map(|r| r.total_ms).collect();
            PhaseResult {
                total_ms_sd: crate::common::mean_sd(&times).1,
                ..v[v.len() / 2].clone()
            }
        })
        .collect())
}

#[derive(Serialize)]
struct Report<'a> {
    command: String,
    machine: Machine,
    shared_dir: bool,
    write_size: usize,
    runs: usize,
    results: &'a [PhaseResult],
    checks: &'a [Check],
}

#[derive(Serialize)]
struct Machine {
    cpus: usize,
    cpu_model: String,
    kernel: String,
    memory_gib: f64,
}

fn machine() -> Machine {
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    Machine {
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu_model,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        memory_gib: memfs_fs::physical_memory() as f64 / (1u64 << 30) as f64,
    }
}

/// One of the targets, checked against this run's figures.
#[derive(Serialize, Clone)]
struct Check {
    what: String,
    measured: String,
    target: String,
    pass: bool,
}

fn checks(
    results: &[PhaseResult],
    main: &str,
    base: Option<&str>,
    args: &Args,
    files_kib: Option<u64>,
) -> Vec<Check> {
    let mut out = Vec::new();
    let big = *args.ops.iter().max().unwrap_or(&0);
    let find = |target: &str, ops: usize, threads: usize, phase: &str| {
        results.iter().find(|r| {
            r.target == target && r.ops == ops && r.threads == threads && r.phase == phase
        })
    };
    let (tmin, tmax) = (
        *args.threads.iter().min().unwrap_or(&1),
        *args.threads.iter().max().unwrap_or(&1),
    );
    speed_checks(&mut out, &find, main, big, (tmin, tmax));
    if let Some(kib) = files_kib {
        out.push(Check {
            what: format!(
                "memory for 10,000 small files ({} B each), fresh process",
                args.write_size
            ),
            measured: format!("{:.2} MiB RSS growth", kib as f64 / 1024.0),
            target: "< 10 MiB".into(),
            pass: kib < 10 * 1024,
        });
    }
    student_checks(&mut out, results, main);
    if let Some(base) = base {
        for phase in PHASES {
            for &t in &args.threads {
                if let (Some(m), Some(b)) = (find(main, big, t, phase), find(base, big, t, phase)) {
                    out.push(Check {
                        what: format!("{phase}, {big} ops, {t} threads vs baseline"),
                        measured: format!(
                            "{:.2} ms vs {:.2} ms: {:.1}x",
                            m.total_ms,
                            b.total_ms,
                            b.total_ms / m.total_ms
                        ),
                        target: "information (baseline in the same run)".into(),
                        pass: true,
                    });
                }
            }
        }
    }
    out
}

/// The row of `target` at `ops` operations and `threads` threads, `phase`.
type Find<'a> = dyn Fn(&str, usize, usize, &str) -> Option<&'a PhaseResult> + 'a;

/// 10,000 creates on one thread, and the most threads at least as fast as
/// the fewest at `big` operations.
fn speed_checks(
    out: &mut Vec<Check>,
    find: &Find<'_>,
    main: &str,
    big: usize,
    (tmin, tmax): (usize, usize),
) {
    if let Some(r) = find(main, 10_000, 1, "create") {
        out.push(Check {
            what: "10,000 creates on 1 thread".into(),
            measured: format!("{:.2} ms", r.total_ms),
            target: "< 5 ms (in process)".into(),
            pass: r.total_ms < 5.0,
        });
    }
    if tmax > tmin {
        for phase in PHASES {
            if let (Some(a), Some(b)) = (find(main, big, tmin, phase), find(main, big, tmax, phase))
            {
                out.push(Check {
                    what: format!("{phase}, {big} ops: {tmax} threads vs {tmin}"),
                    measured: format!(
                        "{:.2} ms vs {:.2} ms ({:.2}x the speed)",
                        b.total_ms,
                        a.total_ms,
                        a.total_ms / b.total_ms
                    ),
                    target: "at least as fast (>= 1.00x)".into(),
                    pass: b.total_ms <= a.total_ms,
                });
            }
        }
    }
}

/// Each phase at 10,000 operations, its worst over the thread counts,
/// against the student shell's best.
fn student_checks(out: &mut Vec<Check>, results: &[PhaseResult], main: &str) {
    for (i, phase) in PHASES.iter().enumerate() {
        let worst = results
            .iter()
            .filter(|r| r.target == main && r.ops == 10_000 && r.phase == *phase)
            .map(|r| r.total_ms)
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
        if let Some(worst) = worst {
            let ratio = STUDENT_MS[i].0 / worst;
            out.push(Check {
                what: format!(
                    "{phase}, 10,000 ops vs the student shell (best {:.0} ms)",
                    STUDENT_MS[i].0
                ),
                measured: format!("worst {worst:.2} ms over all thread counts: {ratio:.1}x faster"),
                target: ">= 10x faster".into(),
                pass: ratio >= 10.0,
            });
        }
    }
}

fn print_table(results: &[PhaseResult]) {
    println!(
        "{:<32} {:>6} {:>4} {:<7} {:>10} {:>9} {:>9} {:>9} {:>12} {:>6} {:>9} {:>9}",
        "target",
        "ops",
        "thr",
        "phase",
        "total ms",
        "mean us",
        "p50 us",
        "p99 us",
        "ops/s",
        "cpu%",
        "peak MiB",
        "grow MiB"
    );
    for r in results {
        println!(
            "{:<32} {:>6} {:>4} {:<7} {:>10.3} {:>9.2} {:>9.2} {:>9.2} {:>9.0} {:>12.0} {:>6.0} {:>9.1} {:>9.2}",
            r.target,
            r.ops,
            r.threads,
            r.phase,
            r.total_ms,
            r.mean_us,
            r.p50_us,
            r.p99_us,
            r.max_us,
            r.ops_per_sec,
            r.cpu_percent,
            r.peak_rss_mib,
            r.rss_growth_mib
        );
    }
}

fn plot(results: &[PhaseResult], ops: usize, prefix: &Path) -> anyhow::Result<Vec<PathBuf>> {
    use plotters::prelude::*;
    crate::common::register_plot_font()?;
    let rows: Vec<&PhaseResult> = results.iter().filter(|r| r.ops == ops).collect();
    let mut targets: Vec<&str> = Vec::new();
    for r in &rows {
        if !targets.contains(&r.target.as_str()) {
            targets.push(&r.target);
        }
    }
    let tmax = rows.iter().map(|r| r.threads).max().unwrap_or(1).max(2) as f64;
    let ymin = rows
        .iter()
        .map(|r| r.total_ms)
        .fold(f64::MAX, f64::min)
        .max(1e-3)
        / 2.0;
    // Headroom above the curves for the legend.
    let ymax = rows.iter().map(|r| r.total_ms).fold(0.0, f64::max) * 12.0;
    let svg = prefix.with_extension("svg");
    let png = prefix.with_extension("png");
    draw(
        SVGBackend::new(&svg, (900, 560)).into_drawing_area(),
        &rows,
        &targets,
        ops,
        tmax,
        (ymin, ymax),
    )?;
    draw(
        BitMapBackend::new(&png, (900, 560)).into_drawing_area(),
        &rows,
        &targets,
        ops,
        tmax,
        (ymin, ymax),
    )?;
    Ok(vec![svg, png])
}

/// The workload plot on `root`: time per phase against threads, memfs's
/// lines bold and the baseline's faint.
///
/// One piece: a single plotters chart from caption to legend, every step on
/// the one `ChartContext`, whose type (a generic backend, two log axes)
/// would have to be spelled out to hand it to a helper.
fn draw<DB: plotters::prelude::DrawingBackend>(
    root: plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    rows: &[&PhaseResult],
    targets: &[&str],
    ops: usize,
    tmax: f64,
    (ymin, ymax): (f64, f64),
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    use plotters::prelude::*;
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("plot: {e:?}");
    root.fill(&WHITE).map_err(e)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("memfs bench workload: {ops} operations per phase"),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((0.9f64..tmax * 1.15).log_scale(), (ymin..ymax).log_scale())
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("threads")
        .y_desc("time per phase (ms, log)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()
        .map_err(e)?;
    let colors = [RED, BLUE, GREEN, MAGENTA];
    for (ti, target) in targets.iter().enumerate() {
        for (pi, phase) in PHASES.iter().enumerate() {
            let pts = phase_points(rows, target, phase);
            let color = colors[pi];
            let style = if ti == 0 {
                color.stroke_width(2)
            } else {
                color.mix(0.45).stroke_width(1)
            };
            let short = if ti == 0 { "memfs" } else { "baseline" };
            chart
                .draw_series(LineSeries::new(pts.clone(), style))
                .map_err(e)?
                .label(format!("{short} {phase}"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], style));
            if ti == 0 {
                chart
                    .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
                    .map_err(e)?;
            } else {
                chart
                    .draw_series(
                        pts.iter()
                            .map(|&p| TriangleMarker::new(p, 4, color.mix(0.45))),
                    )
                    .map_err(e)?;
            }
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

/// (threads, total ms) of `target`'s `phase`, by threads.
fn phase_points(rows: &[&PhaseResult], target: &str, phase: &str) -> Vec<(f64, f64)> {
    let mut pts: Vec<(f64, f64)> = rows
        .iter()
        .filter(|r| r.target == target && r.phase == phase)
        .map(|r| (r.threads as f64, r.total_ms))
        .collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    pts
}

/// Resident memory taken by `n` files of `size` bytes in a fresh engine, in
/// KiB: measured in this process, which must be fresh (no earlier frees for
/// the allocator to reuse, which would hide the growth).
fn probe_memory(n: usize, size: usize) -> anyhow::Result<u64> {
    let fs = Fs::new(Config {
        capacity: 4 << 30,
        max_inodes: n as u64 + 1024,
    });
    let ctx = Ctx::current();
    let names: Vec<Vec<u8>> = (0..n).map(|i| format!("f{i}").into_bytes()).collect();
    let data = vec![b'x'; size];
    let before = status_kib("VmRSS:");
    for name in &names {
        let (a, _) = fs
            .create(ctx, ROOT_INO, name, 0o644, true)
            .map_err(|e| anyhow::anyhow!("create: {e}"))?;
        fs.write(ctx, a.ino, 0, &data, true)
            .map_err(|e| anyhow::anyhow!("write: {e}"))?;
        fs.release(a.ino);
        fs.forget(a.ino, 1);
    }
    let after = status_kib("VmRSS:");
    drop(fs);
    Ok(after.saturating_sub(before))
}

/// Runs [`probe_memory`] in a child process of this binary.
fn memory_in_child(n: usize, size: usize) -> anyhow::Result<u64> {
    let exe = std::env::current_exe()?;
    let out = std::process::Command::new(exe)
        .args(["bench", "workload", "--write-size", &size.to_string()])
        .args(["--probe-memory", &n.to_string()])
        .stdin(std::process::Stdio::null())
        .output()
        .context("running the memory probe")?;
    if !out.status.success() {
        bail!(
            "memory probe failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .context("memory probe output")
}

/// What one `memfs bench workload` run measured.
struct Measured {
    results: Vec<PhaseResult>,
    main_label: String,
    base_label: Option<String>,
    /// Resident growth of 10,000 small files in a fresh engine (KiB).
    files_kib: Option<u64>,
    engine: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(n) = args.probe_memory {
        println!("{}", probe_memory(n, args.write_size)?);
        return Ok(());
    }
    let m = measure(&args)?;
    let Measured {
        results,
        main_label,
        base_label,
        files_kib,
        ..
    } = &m;
    print_table(results);
    let checks = checks(
        results,
        main_label,
        base_label.as_deref(),
        &args,
        *files_kib,
    );
    println!();
    for c in &checks {
        let mark = if c.target.starts_with("information") {
            "    "
        } else if c.pass {
            "PASS"
        } else {
            "MISS"
        };
        println!("{mark} {}: {} (target {})", c.what, c.measured, c.target);
    }
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let report = Report {
        command,
        machine: machine(),
        shared_dir: args.shared_dir,
        write_size: args.write_size,
        runs: args.runs,
        results,
        checks: &checks,
    };
    let json = serde_json::to_string_pretty(&report)?;
    std::fs::write(&args.json, json).with_context(|| format!("writing {}", args.json.display()))?;
    println!("\nresults: {}", args.json.display());
    let big = *args.ops.iter().max().expect("checked non-empty");
    match plot(results, big, &args.plot) {
        Ok(files) => {
            for f in files {
                println!("plot: {}", f.display());
            }
        }
        Err(e) => eprintln!("workload: no plot: {e:#}"),
    }
    Ok(())
}

/// Measures as `memfs bench workload` does and returns the figures in the
/// common report format (nothing printed but progress, nothing written):
/// `memfs bench all` calls this. Figures `workload.<engine|files>.n<OPS>.t<T>.<phase>`
/// are the phase times (ms, lower is better) against the baseline's; the
/// issue's targets are attached where they apply.
pub fn report(args: &Args) -> anyhow::Result<crate::common::Report> {
    use crate::common::{Figure, Report};
    let started = Instant::now();
    let mut report = Report::new(
        "workload",
        serde_json::json!({
            "ops": args.ops,
            "threads": args.threads,
            "path": args.path,
            "baseline": args.baseline,
            "shared_dir": args.shared_dir,
            "write_size": args.write_size,
            "runs": args.runs,
            "warmup": args.warmup,
        }),
    );
    let m = measure(args)?;
    let kind = if m.engine { "engine" } else { "files" };
    report.subject = m.main_label.clone();
    for r in m.results.iter().filter(|r| r.target == m.main_label) {
        let p = PHASES.iter().position(|p| *p == r.phase).unwrap_or(0);
        let mut f = Figure::new(
            format!("workload.{kind}.n{}.t{}.{}", r.ops, r.threads, r.phase),
            "ms",
            r.total_ms,
        )
        .stddev(r.total_ms_sd);
        if let Some(b) = m.base_label.as_ref().and_then(|base| {
            m.results.iter().find(|b| {
                &b.target == base && b.ops == r.ops && b.threads == r.threads && b.phase == r.phase
            })
        }) {
            f = f.baseline(b.target.clone(), b.total_ms, b.total_ms_sd);
        }
        // The checks of `checks()` as per-figure targets: 10x faster than
        // the student shell's best at 10,000 operations, and 10,000 creates
        // on one thread in under 5 ms in process.
        let mut target = None;
        if r.ops == 10_000 {
            target = Some(STUDENT_MS[p].0 / 10.0);
            if m.engine && r.threads == 1 && r.phase == "create" {
                target = target.map(|t: f64| t.min(5.0));
            }
        }
        report.figures.push(f.target(target).lower_is_better());
    }
    if let Some(kib) = m.files_kib {
        report.figures.push(
            Figure::new(
                "workload.engine.files10000.rss_growth",
                "MiB",
                kib as f64 / 1024.0,
            )
            .target(Some(10.0))
            .lower_is_better(),
        );
    }
    report.duration_secs = started.elapsed().as_secs_f64();
    Ok(report)
}

fn measure(args: &Args) -> anyhow::Result<Measured> {
    if args.ops.is_empty() || args.ops.contains(&0) {
        bail!("--ops needs positive counts");
    }
    if args.threads.is_empty() || args.threads.contains(&0) {
        bail!("--threads needs positive counts");
    }
    if let Some(&t) = args.threads.iter().find(|&&t| t > 1024) {
        bail!("--threads {t}: at most 1024");
    }
    let main = match &args.path {
        Some(p) => {
            if !p.is_dir() {
                bail!("--path {}: not a directory", p.display());
            }
            Target::Files(p.clone())
        }
        None => Target::Engine,
    };
    let baseline = match args.baseline.as_str() {
        "none" | "" => None,
        p => {
            let p = PathBuf::from(p);
            if !p.is_dir() {
                bail!(
                    "--baseline {}: not a directory (use --baseline none to skip)",
                    p.display()
                );
            }
            Some(Target::Files(p))
        }
    };
    let mut targets = vec![&main];
    targets.extend(baseline.as_ref());
    let mut results = Vec::new();
    for target in &targets {
        for &ops in &args.ops {
            for &threads in &args.threads {
                eprintln!("workload: {} ops={ops} threads={threads}", target.label());
                results.extend(run_config(target, ops, threads, args)?);
            }
        }
    }
    let files_kib = match main {
        Target::Engine => match memory_in_child(10_000, args.write_size) {
            Ok(k) => Some(k),
            Err(e) => {
                eprintln!("workload: {e:#}");
                None
            }
        },
        Target::Files(_) => None,
    };
    Ok(Measured {
        main_label: main.label(),
        base_label: baseline.as_ref().map(|b| b.label()),
        engine: matches!(main, Target::Engine),
        results,
        files_kib,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_covers_every_op_once() {
        for ops in [1, 7, 100, 10_001] {
            for threads in [1, 2, 3, 16] {
                let mut next = 0;
                for t in 0..threads {
                    let r = split(ops, threads, t);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, ops);
            }
        }
    }

    #[test]
    fn engine_run_does_every_phase() {
        let args = Args {
            ops: vec![50],
            threads: vec![3],
            path: None,
            baseline: "none".into(),
            shared_dir: false,
            write_size: 10,
            runs: 1,
            warmup: 0,
            probe_memory: None,
            json: "x".into(),
            plot: "x".into(),
        };
        let r = run_once(&Target::Engine, 50, 3, &args).unwrap();
        assert_eq!(r.len(), 4);
        assert!(
            r.iter()
                .all(|p| p.ops == 50 && p.total_ms > 0.0 && p.p99_us >= p.p50_us)
        );
        assert!(r.iter().all(|p| p.max_us >= p.p99_us));
    }

    #[test]
    fn files_run_does_every_phase_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let args = Args {
            ops: vec![20],
            threads: vec![2],
            path: Some(dir.path().to_path_buf()),
            baseline: "none".into(),
            shared_dir: true,
            write_size: 7,
            runs: 1,
            warmup: 0,
            probe_memory: None,
            json: "x".into(),
            plot: "x".into(),
        };
        let target = Target::Files(dir.path().to_path_buf());
        let r = run_once(&target, 20, 2, &args).unwrap();
        assert_eq!(r.iter().map(|p| p.phase).collect::<Vec<_>>(), PHASES);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        // A file left in the way makes the create phase fail with a clear error.
        let prepared = prepare(&target, 4, 1, true).unwrap();
        if let Prepared::Files { work, .. } = &prepared {
            std::fs::write(&work[0][0], b"in the way").unwrap();
        }
        let mut lat = Vec::new();
        let e = prepared.run_thread(0, 0, b"x", &mut lat).unwrap_err();
        assert!(format!("{e:#}").starts_with("create "), "{e:#}");
        prepared.cleanup();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
