//! Benchmark engine for `memfs bench lock`: W worker processes each lock E
//! entities in a loop for a fixed time; the total ops/s is reported. Workers
//! are separate processes (the caller says how to start one: the `memfs`
//! binary re-runs itself with a hidden argument) and start together on a
//! signal from the parent, after all of them have opened the lock.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use memfs_lock::{Algorithm, Deadline, Entity, SharedFsMutex};

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Lock(#[from] memfs_lock::Error),
    #[error("worker: {0}")]
    Worker(String),
    #[error("plot: {0}")]
    Plot(String),
}

/// One benchmark cell.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Config {
    pub algorithm: String,
    pub entities: usize,
    pub waiters: usize,
    pub uncontended: bool,
    pub dir: PathBuf,
    pub seconds: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Measurement {
    pub algorithm: String,
    pub file_system: String,
    pub dir: PathBuf,
    pub entities: usize,
    pub waiters: usize,
    pub uncontended: bool,
    pub seconds: f64,
    pub ops: u64,
    pub ops_per_sec: f64,
    /// CPU seconds the workers used (user + system). On a shared, loaded
    /// machine `ops / cpu_seconds` is steadier than ops/s.
    pub cpu_seconds: f64,
}

/// What a worker is told on its command line (one JSON argument).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerSpec {
    pub algorithm: String,
    pub path: PathBuf,
    pub entities: usize,
    pub index: usize,
    pub uncontended: bool,
    pub seconds: f64,
}

/// Name of the file system holding `dir` (from its statfs magic).
pub fn file_system_name(dir: &Path) -> String {
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return "unknown".into();
    };
    // SAFETY: zeroed statfs is a valid out buffer.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out pointer.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return "unknown".into();
    }
    match st.f_type as u64 {
        0x0102_1994 => "tmpfs".into(),
        0xEF53 => "ext4".into(),
        0x6573_5546 => "fuse".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683E => "btrfs".into(),
        0x794C_7630 => "overlayfs".into(),
        0x6969 => "nfs".into(),
        other => format!("fs-{other:#x}"),
    }
}

/// Name of the baseline: flock(2) on one whole file, the kernel's own
/// cross-process lock (entities are ignored: one lock per operation).
pub const BASELINE: &str = "flock";

fn lock_path(alg: Option<Algorithm>, dir: &Path) -> PathBuf {
    let Some(alg) = alg else {
        return dir.join("memfs-bench-flock.lock");
    };
    match alg {
        Algorithm::LockFiles => dir.join(format!("memfs-bench-{}.d", alg.name())),
        _ => dir.join(format!("memfs-bench-{}.lock", alg.name())),
    }
}

/// Runs one cell: spawns `waiters` workers with `spawn` (given the worker's
/// JSON spec) and sums their counts.
pub fn run_one(cfg: &Config, spawn: &dyn Fn(&str) -> Command) -> Result<Measurement, BenchError> {
    let alg = parse_alg(&cfg.algorithm)?;
    std::fs::create_dir_all(&cfg.dir)?;
    let path = lock_path(alg, &cfg.dir);
    let mut kids = Kids(Vec::new());
    let mut outs = Vec::new();
    for index in 0..cfg.waiters {
        let spec = WorkerSpec {
            algorithm: cfg.algorithm.clone(),
            path: if alg.is_none() && cfg.uncontended {
                cfg.dir.join(format!("memfs-bench-flock-{index}.lock"))
            } else {
                path.clone()
            },
            entities: cfg.entities,
            index,
            uncontended: cfg.uncontended,
            seconds: cfg.seconds,
        };
        let json = serde_json::to_string(&spec).map_err(|e| BenchError::Worker(e.to_string()))?;
        let mut c = spawn(&json)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        outs.push(BufReader::new(c.stdout.take().expect("piped")));
        kids.0.push(c);
    }
    let mut line = String::new();
    for o in &mut outs {
        read_tagged(o, &mut line, "ready")?;
    }
    for c in &mut kids.0 {
        let mut stdin = c.stdin.take().expect("piped");
        stdin.write_all(b"go\n")?;
    }
    let mut ops = 0u64;
    let mut rate = 0.0;
    let mut cpu = 0.0;
    for o in &mut outs {
        let (n, secs, c) = parse_ops(&read_tagged(o, &mut line, "ops")?)?;
        ops += n;
        rate += n as f64 / secs.max(1e-9);
        cpu += c;
    }
    for c in &mut kids.0 {
        let st = c.wait()?;
        if !st.success() {
            return Err(BenchError::Worker(format!("worker failed: {st}")));
        }
    }
    kids.0.clear();
    Ok(Measurement {
        algorithm: cfg.algorithm.clone(),
        file_system: file_system_name(&cfg.dir),
        dir: cfg.dir.clone(),
        entities: cfg.entities,
        waiters: cfg.waiters,
        uncontended: cfg.uncontended,
        seconds: cfg.seconds,
        ops,
        ops_per_sec: rate,
        cpu_seconds: cpu,
    })
}

/// The workers of a cell, killed if the cell ends early.
struct Kids(Vec<Child>);

impl Drop for Kids {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The rest of the first line of `r` that starts with `tag` (`line` is
/// the buffer to read it into).
fn read_tagged(
    r: &mut BufReader<std::process::ChildStdout>,
    line: &mut String,
    tag: &str,
) -> Result<String, BenchError> {
    loop {
        line.clear();
        if r.read_line(line)? == 0 {
            return Err(BenchError::Worker(format!(
                "worker exited before reporting {tag}"
            )));
        }
        if let Some(rest) = line.trim().strip_prefix(tag) {
            return Ok(rest.trim().to_string());
        }
    }
}

/// A worker's report `N SECONDS [CPU]`: operations, seconds, CPU seconds.
fn parse_ops(r: &str) -> Result<(u64, f64, f64), BenchError> {
    let mut it = r.split_whitespace();
    let n: u64 = it
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| BenchError::Worker(r.to_string()))?;
    let secs: f64 = it
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| BenchError::Worker(r.to_string()))?;
    let c: f64 = it.next().and_then(|s| s.parse().ok()).unwrap_or(0.0);
    Ok((n, secs, c))
}

/// Body of a worker process: open, report ready, wait for "go" on stdin,
/// lock/unlock in a loop for the given time, report "ops N SECONDS".
pub fn worker_main(spec_json: &str) -> Result<(), BenchError> {
    let spec: WorkerSpec =
        serde_json::from_str(spec_json).map_err(|e| BenchError::Worker(e.to_string()))?;
    let Some(alg) = parse_alg(&spec.algorithm)? else {
        return flock_worker(&spec);
    };
    let m = SharedFsMutex::open(alg, &spec.path)?;
    let base = if spec.uncontended {
        (spec.index * spec.entities) as u64
    } else {
        0
    };
    let ents: Vec<Entity> = (0..spec.entities as u64)
        .map(|i| Entity::new(base + i, true))
        .collect();
    start_signal()?;
    let limit = Duration::from_secs_f64(spec.seconds);
    let c0 = cpu_time();
    let t0 = Instant::now();
    let mut n = 0u64;
    loop {
        for _ in 0..64 {
            let g = m.lock(&ents, Deadline::Never)?;
            drop(g);
        }
        n += 64;
        if t0.elapsed() >= limit {
            break;
        }
    }
    report(&mut std::io::stdout().lock(), n, t0, c0)
}

fn report(out: &mut impl Write, n: u64, t0: Instant, c0: f64) -> Result<(), BenchError> {
    let secs = t0.elapsed().as_secs_f64();
    writeln!(out, "ops {n} {secs} {}", cpu_time() - c0)?;
    out.flush()?;
    Ok(())
}

fn parse_alg(name: &str) -> Result<Option<Algorithm>, BenchError> {
    if name == BASELINE {
        return Ok(None);
    }
    name.parse().map(Some).map_err(BenchError::Worker)
}

/// CPU seconds used by this process so far.
/// Tells the parent this worker is set up, then waits for its go, so that
/// every worker starts measuring at the same moment.
fn start_signal() -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()?;
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    Ok(())
}

fn cpu_time() -> f64 {
    // SAFETY: zeroed rusage is a valid out buffer.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid who and out pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// The baseline worker: flock(2) exclusive / unlock on one file.
fn flock_worker(spec: &WorkerSpec) -> Result<(), BenchError> {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&spec.path)?;
    let fd = f.as_raw_fd();
    start_signal()?;
    let limit = Duration::from_secs_f64(spec.seconds);
    let c0 = cpu_time();
    let t0 = Instant::now();
    let mut n = 0u64;
    loop {
        for _ in 0..64 {
            // SAFETY: fd is a valid open descriptor for the whole loop (`f`
            // owns it and outlives the loop).
            if unsafe { libc::flock(fd, libc::LOCK_EX) } != 0
                // SAFETY: as above.
                || unsafe { libc::flock(fd, libc::LOCK_UN) } != 0
            {
                return Err(std::io::Error::last_os_error().into());
            }
        }
        n += 64;
        if t0.elapsed() >= limit {
            break;
        }
    }
    report(&mut std::io::stdout().lock(), n, t0, c0)
}

/// Sweeps entities and waiters over 1..=max for each algorithm and dir,
/// calling `progress` after every cell.
pub fn run_matrix(
    algorithms: &[Algorithm],
    dirs: &[PathBuf],
    max: usize,
    uncontended: bool,
    seconds: f64,
    spawn: &dyn Fn(&str) -> Command,
    progress: &mut dyn FnMut(&Measurement),
) -> Result<Vec<Measurement>, BenchError> {
    let mut all = Vec::new();
    for dir in dirs {
        // Baseline in the same run: flock(2), one lock, 1..=max waiters.
        for w in 1..=max {
            let cfg = Config {
                algorithm: BASELINE.into(),
                entities: 1,
                waiters: w,
                uncontended,
                dir: dir.clone(),
                seconds,
            };
            let m = run_one(&cfg, spawn)?;
            progress(&m);
            all.push(m);
        }
        for &alg in algorithms {
            for e in 1..=max {
                for w in 1..=max {
                    let cfg = Config {
                        algorithm: alg.name().into(),
                        entities: e,
                        waiters: w,
                        uncontended,
                        dir: dir.clone(),
                        seconds,
                    };
                    let m = run_one(&cfg, spawn)?;
                    progress(&m);
                    all.push(m);
                }
            }
        }
    }
    Ok(all)
}

impl Measurement {
    /// Operations per CPU second of the workers: steadier than ops/s when
    /// the machine is shared (waiters that sleep use no CPU).
    pub fn ops_per_cpu_sec(&self) -> f64 {
        self.ops as f64 / self.cpu_seconds.max(1e-9)
    }
}

/// A markdown table per (file system, algorithm): rows = entities, columns =
/// waiters; cells are ops/s, or ops per CPU second with `per_cpu`.
pub fn matrix_table(results: &[Measurement], per_cpu: bool) -> String {
    let unit = if per_cpu {
        "ops per CPU second"
    } else {
        "ops/s"
    };
    let mut s = String::new();
    let mut groups: Vec<(String, String, PathBuf)> = Vec::new();
    for m in results {
        let k = (m.file_system.clone(), m.algorithm.clone(), m.dir.clone());
        if !groups.contains(&k) {
            groups.push(k);
        }
    }
    for (fs, alg, dir) in groups {
        let cells: Vec<&Measurement> = results
            .iter()
            .filter(|m| m.file_system == fs && m.algorithm == alg && m.dir == dir)
            .collect();
        let max_w = cells.iter().map(|m| m.waiters).max().unwrap_or(0);
        let max_e = cells.iter().map(|m| m.entities).max().unwrap_or(0);
        let mode = if cells.first().is_some_and(|m| m.uncontended) {
            "uncontended"
        } else {
            "contended"
        };
        s += &format!(
            "\n{alg} on {fs} ({}), {mode}, {unit}; rows = entities, columns = waiters\n\n",
            dir.display()
        );
        s += "| E \\ W |";
        for w in 1..=max_w {
            s += &format!(" {w} |");
        }
        s += "\n|---|";
        for _ in 1..=max_w {
            s += "---:|";
        }
        s += "\n";
        for e in 1..=max_e {
            s += &format!("| {e} |");
            for w in 1..=max_w {
                match cells.iter().find(|m| m.entities == e && m.waiters == w) {
                    Some(m) => {
                        let v = if per_cpu {
                            m.ops_per_cpu_sec()
                        } else {
                            m.ops_per_sec
                        };
                        s += &format!(" {} |", crate::common::human(v));
                    }
                    None => s += " |",
                }
            }
            s += "\n";
        }
    }
    s
}

/// Writes one SVG heat map per (file system, algorithm) into `out`; returns
/// the files written.
pub fn heat_maps(results: &[Measurement], out: &Path) -> Result<Vec<PathBuf>, BenchError> {
    crate::common::register_plot_font().map_err(|e| BenchError::Plot(e.to_string()))?;
    std::fs::create_dir_all(out)?;
    let mut written = Vec::new();
    let mut groups: Vec<(String, String)> = Vec::new();
    for m in results.iter().filter(|m| m.algorithm != BASELINE) {
        let k = (m.file_system.clone(), m.algorithm.clone());
        if !groups.contains(&k) {
            groups.push(k);
        }
    }
    for (fs, alg) in groups {
        let cells: Vec<&Measurement> = results
            .iter()
            .filter(|m| m.file_system == fs && m.algorithm == alg)
            .collect();
        let file = out.join(format!("lock-{alg}-{fs}.svg"));
        heat_map(&cells, &fs, &alg, &file)?;
        written.push(file);
    }
    Ok(written)
}

/// One heat map: `alg` on `fs`, ops/s by waiters and entities, into `file`
/// (drawn as the report draws its own, crate::plot).
fn heat_map(cells: &[&Measurement], fs: &str, alg: &str, file: &Path) -> Result<(), BenchError> {
    use plotters::prelude::*;
    let h = crate::plot::HeatMap {
        title: format!("{alg} on {fs}: ops/s (log colour)"),
        cells: cells
            .iter()
            .map(|m| (m.waiters as u32, m.entities as u32, m.ops_per_sec))
            .collect(),
    };
    let root = SVGBackend::new(file, (720, 640)).into_drawing_area();
    crate::plot::draw_heat(root, &h).map_err(|e| BenchError::Plot(e.to_string()))
}

/// Writes the machine-readable results: the command, the machine and every cell.
pub fn write_json(
    path: &Path,
    command: &str,
    machine: &str,
    results: &[Measurement],
) -> Result<(), BenchError> {
    let body = serde_json::json!({ "command": command, "machine": machine, "results": results });
    let text =
        serde_json::to_string_pretty(&body).map_err(|e| BenchError::Worker(e.to_string()))?;
    std::fs::write(path, text)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(alg: &str, fs: &str, waiters: usize, entities: usize, ops: f64) -> Measurement {
        Measurement {
            algorithm: alg.into(),
            file_system: fs.into(),
            dir: PathBuf::from("/tmp"),
            entities,
            waiters,
            uncontended: false,
            seconds: 1.0,
            ops: ops as u64,
            ops_per_sec: ops,
            cpu_seconds: 1.0,
        }
    }

    #[test]
    fn one_heat_map_per_algorithm_and_file_system_with_every_cell_labelled() {
        let dir = tempfile::tempdir().unwrap();
        let results = [
            cell("mkdir", "tmpfs", 1, 1, 1_500_000.0),
            cell("mkdir", "tmpfs", 2, 1, 45_600.0),
            cell("mkdir", "memfs", 1, 1, 789.0),
            cell(BASELINE, "tmpfs", 1, 1, 9e6),
        ];
        let files = heat_maps(&results, dir.path()).unwrap();
        assert_eq!(files.len(), 2, "the baseline gets no map: {files:?}");
        let svg = std::fs::read_to_string(dir.path().join("lock-mkdir-tmpfs.svg")).unwrap();
        assert!(svg.contains("<svg"), "not an SVG");
        for label in ["1.50M", "45.6k", "mkdir on tmpfs"] {
            assert!(svg.contains(label), "{label} missing");
        }
        assert!(!svg.contains("789"), "memfs's cell on tmpfs's map");
    }
}
