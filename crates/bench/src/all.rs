//! `memfs bench all`: every benchmark in turn, each against its baseline
//! measured in the same run, into one results folder (see docs/bench.md,
//! "memfs bench all"): `results.json` with every figure, one CSV per
//! benchmark, each step's own JSON report, and plots (SVG and PNG).
//!
//! A step is one call of a benchmark's `report()` with its arguments. Adding
//! a benchmark is adding steps in [`plan`] (and its kind to [`KINDS`]). A step
//! that cannot run here (no FUSE, no fio) is skipped with its reason; a step
//! that fails is recorded with its error and the run goes on.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};

use crate::benchmarks::{
    block as bench_block, cluster as bench_cluster, fio as bench_fio, lock as bench_lock,
    memory as bench_memory, metadata as bench_metadata, workload as bench_workload,
};
use crate::common::{
    DiskDir, Figure, Machine, MemfsMount, Report, TmpfsDir, install_interrupt_handler, interrupted,
    mean_sd,
};
use crate::results::{FORMAT, FsInfo, KINDS, Results, RunFigure, Status, StepRecord, utc_stamp};

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Small sizes, few thread counts, short runs (under 5 minutes on 2 cores);
    /// every benchmark kind still runs.
    #[arg(long)]
    pub quick: bool,
    /// Results folder (default `bench-results/<UTC date-time>/`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Run only these benchmark kinds (comma-separated: metadata, fio,
    /// workload, block, lock, memory, cluster); the others are recorded as
    /// skipped.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

/// What a step needs from the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    Fuse,
    Fio,
    /// redis-server, redis-cli and redis-benchmark (a local Redis Cluster).
    Redis,
}

type StepFn = Box<dyn Fn() -> anyhow::Result<Report>>;

struct Step {
    kind: &'static str,
    id: String,
    title: String,
    command: String,
    /// Rough seconds, for the ETA (all repetitions).
    estimate: f64,
    /// Times to run it; with 2 or more, each figure is the mean of the runs
    /// and its standard deviation is over them (for benchmarks that measure
    /// each figure once, so that `compare` knows their noise).
    repeat: usize,
    needs: &'static [Need],
    run: StepFn,
}

/// Sizes of a run.
struct Sizes {
    meta_threads: &'static [usize],
    meta_objects: usize,
    meta_iterations: usize,
    fio_size: &'static str,
    fio_runtime: u64,
    fio_verify_runtime: u64,
    wl_ops: &'static [usize],
    wl_threads: &'static [usize],
    wl_runs: usize,
    block_blocks: u64,
    block_repeat: usize,
    lock_max: usize,
    lock_seconds: f64,
    mem_files: u64,
    mem_data: &'static str,
    /// `memfs bench cluster`: files per metadata run, its iterations, files
    /// for the bytes per file, fio's file and seconds per job.
    cl_objects: usize,
    cl_iterations: usize,
    cl_bytes_files: usize,
    cl_fio_size: &'static str,
    cl_fio_runtime: u64,
    /// Repetitions of the steps that measure each figure once (fio, lock).
    repeat: usize,
}

const FULL: Sizes = Sizes {
    meta_threads: &[1, 2, 4, 8],
    meta_objects: 20_000,
    meta_iterations: 3,
    fio_size: "1G",
    fio_runtime: 10,
    fio_verify_runtime: 5,
    wl_ops: &[100, 1000, 10_000],
    wl_threads: &[1, 2, 4, 8, 16],
    wl_runs: 3,
    block_blocks: 1000,
    block_repeat: 3,
    lock_max: 4,
    lock_seconds: 0.5,
    mem_files: 1_000_000,
    mem_data: "1G",
    cl_objects: 20_000,
    cl_iterations: 3,
    cl_bytes_files: 100_000,
    cl_fio_size: "512M",
    cl_fio_runtime: 10,
    repeat: 2,
};

const QUICK: Sizes = Sizes {
    meta_threads: &[1, 4],
    meta_objects: 2000,
    meta_iterations: 2,
    fio_size: "64M",
    fio_runtime: 2,
    fio_verify_runtime: 2,
    wl_ops: &[1000],
    wl_threads: &[1, 2, 4],
    wl_runs: 2,
    block_blocks: 30,
    block_repeat: 2,
    lock_max: 2,
    lock_seconds: 0.25,
    mem_files: 20_000,
    mem_data: "64M",
    cl_objects: 1000,
    cl_iterations: 1,
    cl_bytes_files: 5000,
    cl_fio_size: "32M",
    cl_fio_runtime: 2,
    repeat: 2,
};

fn join<T: ToString>(v: &[T]) -> String {
    v.iter().map(T::to_string).collect::<Vec<_>>().join(",")
}

/// Every step of a run, in order.
fn plan(s: &Sizes, out: &Path) -> Vec<Step> {
    let scratch = out.join("scratch");
    let mut steps = metadata_steps(s, &scratch);
    steps.extend(fio_steps(s, &scratch));
    steps.extend(workload_steps(s, &scratch));
    steps.push(block_step(s, &scratch));
    steps.push(lock_step(s));
    steps.push(memory_step(s, &scratch));
    steps.push(cluster_step(s, &scratch));
    steps
}

/// The metadata steps: threads x (private, shared) x (tmpfs, disk).
fn metadata_steps(s: &Sizes, scratch: &Path) -> Vec<Step> {
    let mut steps = Vec::new();
    for &threads in s.meta_threads {
        for shared in [false, true] {
            for (base, bname) in [
                (bench_metadata::Baseline::Tmpfs, "tmpfs"),
                (bench_metadata::Baseline::Disk, "disk"),
            ] {
                let args = bench_metadata::Args {
                    path: None,
                    iterations: s.meta_iterations,
                    objects: s.meta_objects,
                    threads,
                    shared,
                    sync: false,
                    json: scratch.join("metadata.json"),
                    baseline: base,
                    memfs_args: String::new(),
                    durability: None,
                };
                let sh = if shared { "-shared" } else { "" };
                steps.push(Step {
                    kind: "metadata",
                    id: format!("metadata-t{threads}{sh}-{bname}"),
                    title: format!(
                        "metadata, {threads} thread(s){}, memfs against {bname}",
                        if shared { ", one shared directory" } else { "" }
                    ),
                    command: format!(
                        "memfs bench metadata --objects {} --iterations {} --threads {threads}{} --baseline {bname}",
                        s.meta_objects,
                        s.meta_iterations,
                        if shared { " --shared" } else { "" }
                    ),
                    estimate: (s.meta_iterations * s.meta_objects) as f64 * 4.0 / 12_000.0 + 1.0,
                    needs: &[Need::Fuse],
                    repeat: 1,
                    run: Box::new(move || bench_metadata::report(&args)),
                });
            }
        }
    }
    steps
}

/// The fio steps: 4 KiB and 1 MiB randrw direct, then the same verified.
fn fio_steps(s: &Sizes, scratch: &Path) -> Vec<Step> {
    let mut steps = Vec::new();
    for verify in [false, true] {
        let runtime = if verify {
            s.fio_verify_runtime
        } else {
            s.fio_runtime
        };
        let args = bench_fio::Args {
            size: s.fio_size.into(),
            runtime,
            bs: vec!["4k".into(), "1m".into()],
            // Verified runs only direct, to keep `bench all` short.
            direct: if verify {
                vec![true]
            } else {
                vec![true, false]
            },
            verify,
            json: scratch.join("fio.json"),
            baseline: bench_fio::Baseline::Tmpfs,
            memfs_args: String::new(),
            durability: None,
            fio: "fio".into(),
        };
        steps.push(Step {
            kind: "fio",
            id: if verify { "fio-verify" } else { "fio-direct" }.into(),
            title: format!(
                "fio randrw 4 KiB and 1 MiB, direct{}, memfs against tmpfs",
                if verify {
                    ", md5 verified"
                } else {
                    " and buffered"
                }
            ),
            command: format!(
                "memfs bench fio --size {} --runtime {runtime} --bs 4k,1m --direct {}",
                s.fio_size,
                if verify {
                    "true --verify"
                } else {
                    "true,false"
                }
            ),
            estimate: if verify { 4.0 } else { 8.0 } * (runtime as f64 + 2.0) * s.repeat as f64,
            needs: &[Need::Fuse, Need::Fio],
            repeat: s.repeat,
            run: Box::new(move || bench_fio::report(&args)),
        });
    }
    steps
}

/// The workload steps: in process, then on a mount; both against a fresh
/// tmpfs.
fn workload_steps(s: &Sizes, scratch: &Path) -> Vec<Step> {
    let mut steps = Vec::new();
    for mounted in [false, true] {
        let wl = bench_workload::Args {
            ops: s.wl_ops.to_vec(),
            threads: s.wl_threads.to_vec(),
            path: None,
            baseline: String::new(),
            shared_dir: false,
            write_size: 64,
            runs: s.wl_runs,
            warmup: 1,
            probe_memory: None,
            json: scratch.join("workload.json"),
            plot: scratch.join("workload"),
        };
        let ops: usize = s.wl_ops.iter().sum();
        let rate = if mounted { 15_000.0 } else { 300_000.0 };
        let estimate = (s.wl_runs + 1) as f64
            * s.wl_threads.len() as f64
            * ops as f64
            * 4.0
            * (1.0 / rate + 1.0 / 150_000.0)
            + 2.0;
        steps.push(Step {
            kind: "workload",
            id: if mounted {
                "workload-mounted"
            } else {
                "workload-engine"
            }
            .into(),
            title: if mounted {
                "shell workload on a memfs mount, against tmpfs"
            } else {
                "shell workload on the engine in process, against tmpfs"
            }
            .into(),
            command: format!(
                "memfs bench workload --ops {} --threads {} --runs {}{} --baseline TMPFS",
                join(s.wl_ops),
                join(s.wl_threads),
                s.wl_runs,
                if mounted { " --path MEMFS_MOUNT" } else { "" }
            ),
            estimate,
            needs: if mounted { &[Need::Fuse] } else { &[] },
            repeat: 1,
            run: Box::new(move || workload_on_fresh(&wl, mounted)),
        });
    }
    steps
}

/// The workload against a fresh tmpfs, on a fresh memfs mount if `mounted`
/// (else on the engine in process).
fn workload_on_fresh(wl: &bench_workload::Args, mounted: bool) -> anyhow::Result<Report> {
    let tmpfs = TmpfsDir::new(1 << 30)?;
    let memfs = if mounted {
        Some(MemfsMount::new(&[])?)
    } else {
        None
    };
    let args = bench_workload::Args {
        path: memfs.as_ref().map(|m| m.path().to_path_buf()),
        baseline: tmpfs.path().display().to_string(),
        ..wl.clone()
    };
    let mut r = bench_workload::report(&args)?;
    // Name the baseline by what it is, not by its temporary path.
    for f in &mut r.figures {
        if f.baseline_name.is_some() {
            f.baseline_name = Some(tmpfs.describe().into());
        }
    }
    r.config["baseline"] = tmpfs.describe().into();
    if memfs.is_some() {
        r.config["path"] = "memfs (fresh mount)".into();
    }
    Ok(r)
}

/// The block store step: every durability mode against LMDB.
fn block_step(s: &Sizes, scratch: &Path) -> Step {
    let block = bench_block::Args {
        blocks: s.block_blocks,
        threads: 2,
        shards: 16,
        durability: "all".into(),
        lmdb: true,
        snapshot_interval: 1000,
        dir: None,
        json: scratch.join("block.json"),
        repeat: s.block_repeat,
        child_scenario: None,
        child_out: None,
    };
    Step {
        kind: "block",
        id: "block".into(),
        title: "block store, every durability mode, against LMDB".into(),
        command: format!(
            "memfs bench block --blocks {} --lmdb --repeat {}",
            s.block_blocks, s.block_repeat
        ),
        estimate: 8.0 * s.block_repeat as f64 * (s.block_blocks as f64 * 19_000.0 / 3e6 + 0.5),
        needs: &[],
        repeat: 1,
        run: Box::new(move || bench_block::report(&block)),
    }
}

/// The lock step: the matrix on tmpfs, the disk and a memfs mount.
fn lock_step(s: &Sizes) -> Step {
    let (max, seconds) = (s.lock_max, s.lock_seconds);
    Step {
        kind: "lock",
        id: "lock".into(),
        title: "lock algorithms, entities x waiters, on tmpfs, disk and memfs, against flock(2)"
            .into(),
        command: format!(
            "memfs bench lock --matrix --max {max} --seconds {seconds} --dir TMPFS --dir DISK --dir MEMFS_MOUNT"
        ),
        estimate: 3.0 * (4.0 * (max * max) as f64 + max as f64) * (seconds + 0.2) * s.repeat as f64,
        needs: &[Need::Fuse],
        repeat: s.repeat,
        run: Box::new(move || {
            let tmpfs = TmpfsDir::new(64 << 20)?;
            let disk = DiskDir::new()?;
            let memfs = MemfsMount::new(&[])?;
            let args = bench_lock::Args {
                algorithm: None,
                entities: 1,
                waiters: 1,
                uncontended: false,
                dirs: vec![
                    tmpfs.path().to_path_buf(),
                    disk.path().to_path_buf(),
                    memfs.path().to_path_buf(),
                ],
                seconds,
                matrix: true,
                max,
                out: PathBuf::new(),
                worker: None,
            };
            bench_lock::report(&args, &["tmpfs".into(), "disk".into(), "memfs".into()])
        }),
    }
}

/// The memory step: the server's resident size against its targets.
fn memory_step(s: &Sizes, scratch: &Path) -> Step {
    let mem = bench_memory::Args {
        files: s.mem_files,
        data: s.mem_data.into(),
        threads: 2,
        json: scratch.join("memory.json"),
        memfs_args: String::new(),
    };
    Step {
        kind: "memory",
        id: "memory".into(),
        title: "memfs server memory: empty files and file data".into(),
        command: format!(
            "memfs bench memory --files {} --data {}",
            s.mem_files, s.mem_data
        ),
        estimate: s.mem_files as f64 / 15_000.0 + 5.0,
        needs: &[Need::Fuse],
        repeat: 1,
        run: Box::new(move || bench_memory::report(&mem)),
    }
}

/// The cluster step: a volume on a local Redis Cluster against a local
/// mount and the cluster's floor (redis-benchmark).
fn cluster_step(s: &Sizes, scratch: &Path) -> Step {
    let args = bench_cluster::Args {
        short: false,
        iterations: s.cl_iterations,
        objects: s.cl_objects,
        threads: vec![1, 4],
        mounts: vec![1, 2],
        dirs: s.cl_objects / 4,
        bytes_files: s.cl_bytes_files,
        floor_requests: 20_000,
        floor_values: 500,
        fio_size: s.cl_fio_size.into(),
        fio_runtime: s.cl_fio_runtime,
        no_fio: false,
        uncached_cache_size: "4M".into(),
        memfs_args: String::new(),
        volume_args: String::new(),
        maxmemory: "2gb".into(),
        fio: "fio".into(),
        json: scratch.join("cluster.json"),
    };
    // 4 shapes x (volume + local) x 4 phases, at some 5,000 ops/s; 5 fio jobs
    // on 2 mounts; the bytes' creates; the cluster's start and the floor.
    let meta = (s.cl_iterations * s.cl_objects) as f64 * 4.0 * 2.0 * 4.0 / 5000.0;
    let fio = 9.0 * (s.cl_fio_runtime as f64 + 2.0);
    Step {
        kind: "cluster",
        id: "cluster".into(),
        title: "a volume on a local Redis Cluster (3 masters, 3 replicas), against a local \
                memfs mount and redis-benchmark's floor"
            .into(),
        command: format!(
            "memfs bench cluster --objects {} --iterations {} --dirs {} --bytes-files {} \
             --floor-requests 20000 --floor-values 500 --fio-size {} --fio-runtime {}",
            s.cl_objects,
            s.cl_iterations,
            s.cl_objects / 4,
            s.cl_bytes_files,
            s.cl_fio_size,
            s.cl_fio_runtime
        ),
        estimate: meta + fio + s.cl_bytes_files as f64 / 3000.0 + 15.0,
        needs: &[Need::Fuse, Need::Fio, Need::Redis],
        repeat: 1,
        run: Box::new(move || bench_cluster::report(&args)),
    }
}

/// Why a need is not met here, if it is not.
fn missing(need: Need) -> Option<String> {
    match need {
        Need::Fuse => {
            if !Path::new("/dev/fuse").exists() {
                return Some("no /dev/fuse (FUSE is not available here)".into());
            }
            let fusermount = std::process::Command::new("fusermount3")
                .arg("--version")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok();
            if !crate::system::is_root() && !fusermount {
                return Some("not root and no fusermount3: cannot mount memfs".into());
            }
            None
        }
        Need::Fio => (!bench_fio::fio_available(Path::new("fio")))
            .then(|| "fio is not installed (apt-get install fio)".into()),
        Need::Redis => ["redis-server", "redis-cli", "redis-benchmark"]
            .into_iter()
            .find(|tool| {
                !std::process::Command::new(tool)
                    .arg("--version")
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            })
            .map(|tool| {
                format!("{tool} is not installed (scripts/setup: redis-server, redis-tools)")
            }),
    }
}

/// The file system type of `path` (from /proc/self/mountinfo: the longest
/// mount point that is a prefix of it).
pub fn fs_type(path: &Path) -> String {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut best: Option<(usize, String)> = None;
    for line in info.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let Some(dash) = f.iter().position(|x| *x == "-") else {
            continue;
        };
        let (Some(mp), Some(ty)) = (f.get(4), f.get(dash + 1)) else {
            continue;
        };
        let mp = mp.replace("\\040", " ");
        if path.starts_with(&mp) && best.as_ref().is_none_or(|(l, _)| mp.len() >= *l) {
            best = Some((mp.len(), ty.to_string()));
        }
    }
    best.map_or_else(|| "unknown".into(), |(_, t)| t)
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn csv_cell(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// One CSV per benchmark kind: every figure of its steps.
fn write_csvs(dir: &Path, results: &Results) -> anyhow::Result<()> {
    let opt = |v: Option<f64>| v.map_or_else(String::new, |x| x.to_string());
    for kind in KINDS {
        let figs: Vec<&RunFigure> = results.figures.iter().filter(|f| f.kind == kind).collect();
        if figs.is_empty() {
            continue;
        }
        let mut out = String::from(
            "step,figure,unit,value,stddev,baseline_name,baseline,baseline_stddev,ratio,target,better,met\n",
        );
        for rf in figs {
            let f = &rf.figure;
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{},{},{},{},{}",
                csv_cell(&rf.step),
                csv_cell(&f.figure),
                csv_cell(&f.unit),
                f.value,
                opt(f.stddev),
                csv_cell(f.baseline_name.as_deref().unwrap_or("")),
                opt(f.baseline),
                opt(f.baseline_stddev),
                opt(f.ratio),
                opt(f.target),
                match f.better {
                    crate::common::Better::Higher => "higher",
                    crate::common::Better::Lower => "lower",
                },
                f.met.map_or_else(String::new, |m| m.to_string()),
            );
        }
        let path = dir.join(format!("{kind}.csv"));
        std::fs::write(&path, out).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

fn write_results(dir: &Path, results: &Results) -> anyhow::Result<()> {
    let path = dir.join("results.json");
    let text = serde_json::to_string_pretty(results)? + "\n";
    // Written whole to a temporary file then renamed: an interrupted run
    // never leaves a torn results.json.
    let tmp = dir.join("results.json.tmp");
    std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

pub fn run(args: Args) -> anyhow::Result<()> {
    install_interrupt_handler();
    for k in &args.only {
        if !KINDS.contains(&k.as_str()) {
            bail!(
                "--only {k:?}: not a benchmark (one of {})",
                KINDS.join(", ")
            );
        }
    }
    let started_unix = now_unix();
    let out = results_folder(&args, started_unix)?;
    let sizes = if args.quick { &QUICK } else { &FULL };
    let steps = plan(sizes, &out);
    let mut results = new_results(&args, &out, started_unix);
    let total: f64 = steps.iter().map(|s| s.estimate).sum();
    let progress = Progress::new(total);
    progress.say(format!(
        "bench all: {} steps{} into {} (estimated {:.0} min)",
        steps.len(),
        if args.quick { " (quick)" } else { "" },
        out.display(),
        total / 60.0
    ));
    let n = steps.len();
    let mut done_estimate = 0.0;
    for (i, step) in steps.into_iter().enumerate() {
        let at = format!("[{}/{n}] {}", i + 1, step.id);
        let record = run_step(&step, &at, &args.only, &out, &progress, &mut results)?;
        results.steps.push(record);
        done_estimate += step.estimate;
        progress.bar.set_position(done_estimate as u64);
        results.duration_secs = (now_unix() - started_unix) as f64;
        // After every step, so that an interrupted run keeps what it measured.
        write_results(&out, &results)?;
    }
    progress.bar.finish_and_clear();
    let _ = std::fs::remove_dir_all(out.join("scratch"));
    write_csvs(&out, &results)?;
    match crate::plot::plot_all(&results, &out.join("plots")) {
        Ok(plots) => results.plots = plots,
        Err(e) => eprintln!("bench all: plots failed: {e:#}"),
    }
    results.duration_secs = (now_unix() - started_unix) as f64;
    write_results(&out, &results)?;
    println!("{}", summary(&results));
    println!("results in {}", out.display());
    if interrupted() {
        bail!("interrupted (the results so far are in {})", out.display());
    }
    Ok(())
}

/// The results folder, created (with its `json/`) and canonical; never one
/// that already holds results.
fn results_folder(args: &Args, started_unix: u64) -> anyhow::Result<PathBuf> {
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("bench-results").join(utc_stamp(started_unix)));
    if out.join("results.json").exists() {
        bail!(
            "{} already holds results; choose another --out",
            out.display()
        );
    }
    std::fs::create_dir_all(out.join("json"))
        .with_context(|| format!("cannot create {}", out.display()))?;
    Ok(out.canonicalize()?)
}

/// The results of a run before its first step: where and how it runs.
fn new_results(args: &Args, out: &Path, started_unix: u64) -> Results {
    // As a user would type it, whatever path the binary was run by.
    let command = std::iter::once("memfs".to_string())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ");
    Results {
        format: FORMAT,
        memfs_version: env!("CARGO_PKG_VERSION").into(),
        command,
        quick: args.quick,
        started_unix,
        duration_secs: 0.0,
        machine: Machine::describe(),
        file_systems: [
            ("results folder", out.to_path_buf()),
            (
                "temporary directories (memfs and tmpfs mount points)",
                std::env::temp_dir(),
            ),
            ("disk baseline", PathBuf::from("/var/tmp")),
            ("/dev/shm", PathBuf::from("/dev/shm")),
        ]
        .into_iter()
        .map(|(role, p)| FsInfo {
            role: role.into(),
            fs_type: fs_type(&p),
            path: p.display().to_string(),
        })
        .collect(),
        steps: Vec::new(),
        figures: Vec::new(),
        plots: Vec::new(),
    }
}

/// The run's progress bar (over the steps' estimates) and the lines
/// printed above it.
struct Progress {
    /// Shared with the benchmarks' own bars, which it draws with this one.
    _multi: indicatif::MultiProgress,
    bar: indicatif::ProgressBar,
}

impl Progress {
    fn new(total: f64) -> Self {
        let multi = indicatif::MultiProgress::new();
        crate::common::share_progress(multi.clone());
        let bar = multi.add(indicatif::ProgressBar::new(total.ceil() as u64));
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "bench all [{elapsed_precise}] {wide_bar} {percent}% (about {eta} left) {msg}",
        ) {
            bar.set_style(style);
        }
        bar.enable_steady_tick(std::time::Duration::from_millis(500));
        Progress { _multi: multi, bar }
    }

    // Progress lines also when standard error is not a terminal (CI logs).
    fn say(&self, line: String) {
        if self.bar.is_hidden() {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }
}

/// Why `step` does not run now, if it does not.
fn skip_reason(step: &Step, only: &[String]) -> Option<String> {
    if interrupted() {
        Some("interrupted before it started".to_string())
    } else if !only.is_empty() && !only.iter().any(|k| k == step.kind) {
        Some("not selected (--only)".to_string())
    } else {
        step.needs.iter().find_map(|&n| missing(n))
    }
}

/// One step, `at` its place in the run: skipped with its reason, or run
/// with its report written to `json/` and its figures added to `results`.
/// A failure is the record's, not the run's.
fn run_step(
    step: &Step,
    at: &str,
    only: &[String],
    out: &Path,
    progress: &Progress,
    results: &mut Results,
) -> anyhow::Result<StepRecord> {
    let command = if step.repeat > 1 {
        format!(
            "{}  # run {} times: figures are mean ± sd over the runs",
            step.command, step.repeat
        )
    } else {
        step.command.clone()
    };
    let mut record = StepRecord {
        id: step.id.clone(),
        kind: step.kind.into(),
        title: step.title.clone(),
        command: command.clone(),
        status: Status::Skipped,
        reason: None,
        duration_secs: 0.0,
        json: None,
    };
    if let Some(reason) = skip_reason(step, only) {
        progress.say(format!("{at}: skipped: {reason}"));
        record.reason = Some(reason);
        return Ok(record);
    }
    progress.bar.set_message(at.to_string());
    progress.say(format!("{at}: {}", step.title));
    let t0 = Instant::now();
    let outcome = run_repeated(step);
    record.duration_secs = t0.elapsed().as_secs_f64();
    match outcome {
        Ok(mut report) => {
            report.command = command;
            let rel = format!("json/{}.json", step.id);
            report.write_json(&out.join(&rel))?;
            record.json = Some(rel);
            record.status = Status::Ok;
            progress.say(format!(
                "{at}: {} figures in {:.1} s\n{}",
                report.figures.len(),
                record.duration_secs,
                report.table()
            ));
            results
                .figures
                .extend(report.figures.into_iter().map(|figure| RunFigure {
                    step: step.id.clone(),
                    kind: step.kind.into(),
                    figure,
                }));
        }
        Err(e) => {
            progress.say(format!("{at}: FAILED: {e:#}"));
            record.status = Status::Failed;
            record.reason = Some(format!("{e:#}"));
        }
    }
    Ok(record)
}

/// The step's report, merged over its repetitions; a panic is an error.
fn run_repeated(step: &Step) -> anyhow::Result<Report> {
    (0..step.repeat.max(1))
        .map(|_| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(&step.run))
                .unwrap_or_else(|p| Err(anyhow::anyhow!("panicked: {}", panic_message(&*p))))
        })
        .collect::<anyhow::Result<Vec<Report>>>()
        .map(merge)
}

/// Several runs of one step as one report: each figure's mean over the runs,
/// with the standard deviation over them (its baseline's likewise); ratio and
/// target re-derived. Figures missing from a run are averaged over the others.
fn merge(mut runs: Vec<Report>) -> Report {
    if runs.len() < 2 {
        return runs.pop().expect("at least one run");
    }
    let mut out = runs[0].clone();
    out.duration_secs = runs.iter().map(|r| r.duration_secs).sum();
    if let serde_json::Value::Object(m) = &mut out.config {
        m.insert("repetitions".into(), runs.len().into());
    }
    for f in &mut out.figures {
        let same: Vec<&Figure> = runs
            .iter()
            .filter_map(|r| r.figures.iter().find(|g| g.figure == f.figure))
            .collect();
        let (value, sd) = mean_sd(&same.iter().map(|g| g.value).collect::<Vec<_>>());
        let mut g = Figure::new(f.figure.clone(), f.unit.clone(), value);
        if f.better == crate::common::Better::Lower {
            g = g.lower_is_better();
        }
        g = g.stddev(sd);
        let bases: Vec<f64> = same.iter().filter_map(|g| g.baseline).collect();
        if let (false, Some(name)) = (bases.is_empty(), f.baseline_name.clone()) {
            let (bm, bsd) = mean_sd(&bases);
            g = g.baseline(name, bm, bsd);
        }
        *f = g.target(f.target);
    }
    out
}

/// One line per step: status, time, figures and targets met.
pub fn summary(r: &Results) -> String {
    let mut s = String::new();
    let w = r.steps.iter().map(|s| s.id.len()).max().unwrap_or(4);
    for st in &r.steps {
        let figs: Vec<&RunFigure> = r.figures.iter().filter(|f| f.step == st.id).collect();
        let with_target = figs.iter().filter(|f| f.figure.met.is_some()).count();
        let met = figs.iter().filter(|f| f.figure.met == Some(true)).count();
        let status = match st.status {
            Status::Ok => format!(
                "ok      {:>7.1} s  {:>4} figures, targets met {met}/{with_target}",
                st.duration_secs,
                figs.len()
            ),
            Status::Skipped => {
                format!("skipped: {}", st.reason.as_deref().unwrap_or("(no reason)"))
            }
            Status::Failed => format!("FAILED: {}", st.reason.as_deref().unwrap_or("(no error)")),
        };
        let _ = writeln!(s, "{:<w$}  {status}", st.id);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamps() {
        assert_eq!(utc_stamp(0), "1970-01-01T00-00-00Z");
        assert_eq!(utc_stamp(951_782_400), "2000-02-29T00-00-00Z");
        assert_eq!(utc_stamp(1_795_408_709), "2026-11-23T04-38-29Z");
    }

    #[test]
    fn plans_every_kind_in_both_sizes() {
        let dir = Path::new("/nonexistent");
        for sizes in [&FULL, &QUICK] {
            let steps = plan(sizes, dir);
            for kind in KINDS {
                assert!(steps.iter().any(|s| s.kind == kind), "{kind} missing");
            }
            let mut ids: Vec<&str> = steps.iter().map(|s| s.id.as_str()).collect();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(ids.len(), steps.len(), "step ids must be unique");
        }
        // The quick run stays inside its 5 minutes by its own estimate.
        let quick: f64 = plan(&QUICK, dir).iter().map(|s| s.estimate).sum();
        assert!(quick < 300.0, "{quick}");
    }

    #[test]
    fn repetitions_merge_into_mean_and_deviation() {
        let run = |v: f64, b: f64| {
            let mut r = Report::new("x", serde_json::json!({}));
            r.figures.push(
                Figure::new("t", "ms", v)
                    .lower_is_better()
                    .baseline("tmpfs", b, None)
                    .target(Some(2.5)),
            );
            r.duration_secs = 1.0;
            r
        };
        let m = merge(vec![run(2.0, 4.0), run(4.0, 8.0)]);
        let f = &m.figures[0];
        assert_eq!((f.value, f.baseline), (3.0, Some(6.0)));
        assert!((f.stddev.unwrap() - 2f64.sqrt()).abs() < 1e-12);
        assert!((f.baseline_stddev.unwrap() - 8f64.sqrt()).abs() < 1e-12);
        assert_eq!(f.ratio, Some(0.5));
        assert_eq!(f.met, Some(false), "3 ms misses a 2.5 ms target");
        assert_eq!(m.duration_secs, 2.0);
        assert_eq!(m.config["repetitions"], 2);
        assert_eq!(merge(vec![run(1.0, 1.0)]).figures[0].stddev, None);
    }

    #[test]
    fn csv_quotes_when_needed() {
        assert_eq!(csv_cell("a.b"), "a.b");
        assert_eq!(csv_cell("x, y"), "\"x, y\"");
        assert_eq!(csv_cell("say \"hi\""), "\"say \"\"hi\"\"\"");
    }

    #[test]
    fn file_system_types() {
        assert_eq!(fs_type(Path::new("/proc/self")), "proc");
        assert_ne!(fs_type(Path::new("/")), "unknown");
    }
}
