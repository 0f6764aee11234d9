//! `memfs bench durability`: the targets of issue 3 in one run.
//!
//! - metadata creates on memfs without a data directory, with one in `none`,
//!   `async` and `sync` mode, against the disk file system (ext4 here) with
//!   and without fsync after each create;
//! - fio 4 KiB randrw direct on memfs in `none` and `async` mode against the
//!   in-memory memfs;
//! - the latency of small operations while a checkpoint of a large file
//!   system is written (requested through the control socket);
//! - recovery: journal replay speed after the server was killed.
//!
//! Also the helpers `memfs bench metadata|fio --durability MODE` use: a fresh
//! data directory on the disk, removed afterwards.

use std::io::Write as _;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::benchmarks::fio::{FioJob, fio_available};
use crate::benchmarks::metadata::{PHASES, PhaseRates, Workload};
use crate::common::{
    DiskDir, Figure, MIB, MemfsMount, Report, Target, check_interrupted, durable_args, fmt_num,
    install_interrupt_handler, mean_sd,
};

/// A memfs mount with a data directory of its own; the mount goes first.
struct DurableTarget {
    target: Target,
    _data: DiskDir,
}

impl DurableTarget {
    fn new(mode: &str) -> anyhow::Result<Self> {
        let data = DiskDir::new().context("cannot create a data directory")?;
        let mount = MemfsMount::new(&durable_args(data.path(), mode))
            .with_context(|| format!("mounting memfs --durability {mode}"))?;
        Ok(DurableTarget {
            target: Target::Memfs(mount),
            _data: data,
        })
    }
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Metadata,
    Fio,
    Checkpoint,
    Recovery,
}

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Small sizes and short runs (seconds in all), for a smoke test.
    #[arg(long)]
    pub quick: bool,
    /// Which parts to run, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "metadata,fio,checkpoint,recovery"
    )]
    pub parts: Vec<Part>,
    /// Files created per metadata iteration without fsync (default 20000; quick 300).
    #[arg(long)]
    pub objects: Option<usize>,
    /// Files created per metadata iteration with fsync after each (default 2000; quick 50).
    #[arg(long)]
    pub sync_objects: Option<usize>,
    /// Repetitions of the metadata and fio runs, alternating targets (default 3; quick 1).
    #[arg(long)]
    pub iterations: Option<usize>,
    /// fio test file size (default 1G; quick 8M).
    #[arg(long)]
    pub fio_size: Option<String>,
    /// Seconds per fio run (default 20; quick 1).
    #[arg(long)]
    pub fio_runtime: Option<u64>,
    /// File data written before the measured checkpoint (default 1G; quick 16M).
    #[arg(long)]
    pub checkpoint_size: Option<String>,
    /// Seconds of latency sampling before the checkpoint (default 5; quick 0.3).
    #[arg(long)]
    pub window: Option<f64>,
    /// File data written, then replayed after a kill (default 200M; quick 8M). The
    /// server checkpoints by itself after 256 MiB of journal: above that only
    /// the journal since its last checkpoint is replayed.
    #[arg(long)]
    pub recovery_size: Option<String>,
    /// Where to write the JSON results.
    #[arg(long, default_value = "bench-durability.json")]
    pub json: PathBuf,
    /// The fio binary.
    #[arg(long, default_value = "fio")]
    pub fio: PathBuf,
}

/// Settings with the defaults (or the quick ones) filled in.
#[derive(Debug, Clone, serde::Serialize)]
struct Settings {
    parts: Vec<String>,
    objects: usize,
    sync_objects: usize,
    iterations: usize,
    fio_size: u64,
    fio_runtime: u64,
    checkpoint_size: u64,
    window_secs: f64,
    recovery_size: u64,
}

fn parse_bytes(name: &str, s: &str) -> anyhow::Result<u64> {
    memfs_durable::parse_bytes(s)
        .map_err(|e| anyhow::anyhow!("invalid {name} {s:?}: {e} (use e.g. 16M, 1G)"))
}

impl Args {
    fn settings(&self) -> anyhow::Result<Settings> {
        let q = self.quick;
        let size = |name: &str, v: &Option<String>, full: &str, quick: &str| {
            parse_bytes(name, v.as_deref().unwrap_or(if q { quick } else { full }))
        };
        let s = Settings {
            parts: self
                .parts
                .iter()
                .map(|p| format!("{p:?}").to_lowercase())
                .collect(),
            objects: self.objects.unwrap_or(if q { 300 } else { 20_000 }),
            sync_objects: self.sync_objects.unwrap_or(if q { 50 } else { 2_000 }),
            iterations: self.iterations.unwrap_or(if q { 1 } else { 3 }),
            fio_size: size("--fio-size", &self.fio_size, "1G", "8M")?,
            fio_runtime: self.fio_runtime.unwrap_or(if q { 1 } else { 20 }),
            checkpoint_size: size("--checkpoint-size", &self.checkpoint_size, "1G", "16M")?,
            window_secs: self.window.unwrap_or(if q { 0.3 } else { 5.0 }),
            recovery_size: size("--recovery-size", &self.recovery_size, "200M", "8M")?,
        };
        if self.parts.is_empty() {
            bail!("--parts needs at least one part");
        }
        if s.objects == 0 || s.sync_objects == 0 {
            bail!("--objects and --sync-objects must be at least 1");
        }
        if s.iterations == 0 {
            bail!("--iterations must be at least 1");
        }
        if !(s.window_secs.is_finite() && s.window_secs > 0.0 && s.window_secs <= 3600.0) {
            bail!("--window must be a number of seconds in (0, 3600]");
        }
        if s.checkpoint_size < MIB as u64 || s.recovery_size < MIB as u64 {
            bail!("--checkpoint-size and --recovery-size must be at least 1M");
        }
        Ok(s)
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    install_interrupt_handler();
    let s = args.settings()?;
    let fio_job = if args.parts.contains(&Part::Fio) {
        if !fio_available(&args.fio) {
            bail!(
                "{} not found or not working: install fio (apt-get install fio), or leave fio out of --parts",
                args.fio.display()
            );
        }
        Some(FioJob::new("4k", s.fio_size, s.fio_runtime, true, false)?)
    } else {
        None
    };
    let started = Instant::now();
    let mut report = Report::new("durability", serde_json::to_value(&s)?);
    let mut extra = serde_json::Map::new();
    if args.parts.contains(&Part::Metadata) {
        eprintln!(
            "durability: metadata creates (memfs none/async/sync, ext4 with and without fsync)"
        );
        report.figures.extend(metadata_part(&s)?);
    }
    if let Some(job) = &fio_job {
        eprintln!("durability: fio 4k randrw direct (memfs in memory, none, async)");
        report
            .figures
            .extend(fio_part(&args.fio, job, s.iterations)?);
    }
    if args.parts.contains(&Part::Checkpoint) {
        eprintln!(
            "durability: latency during a checkpoint of {} MiB",
            s.checkpoint_size >> 20
        );
        let (figs, info) = checkpoint_part(&s)?;
        report.figures.extend(figs);
        extra.insert("checkpoint".into(), info);
    }
    if args.parts.contains(&Part::Recovery) {
        eprintln!(
            "durability: recovery after a kill with {} MiB of journal",
            s.recovery_size >> 20
        );
        let (figs, info) = recovery_part(&s)?;
        report.figures.extend(figs);
        extra.insert("recovery".into(), info);
    }
    if let serde_json::Value::Object(c) = &mut report.config {
        c.extend(extra);
    }
    report.duration_secs = started.elapsed().as_secs_f64();
    print!("{}", report.table_with(num));
    report.write_json(&args.json)?;
    eprintln!("durability: results written to {}", args.json.display());
    Ok(())
}

/// Mean of one phase over iterations.
fn phase(rates: &[PhaseRates], p: usize) -> (f64, Option<f64>) {
    mean_sd(&rates.iter().map(|r| r[p]).collect::<Vec<_>>())
}

fn rate_figure(
    name: String,
    subject: &[PhaseRates],
    p: usize,
    base_name: &str,
    base: &[PhaseRates],
    target_ratio: Option<f64>,
) -> Figure {
    let (v, sd) = phase(subject, p);
    let (b, bsd) = phase(base, p);
    Figure::new(name, "ops/s", v)
        .stddev(sd)
        .baseline(base_name, b, bsd)
        .target(target_ratio.map(|r| r * b))
}

fn metadata_part(s: &Settings) -> anyhow::Result<Vec<Figure>> {
    let w = Workload {
        objects: s.objects,
        threads: 1,
        shared: false,
        sync: false,
    };
    let ws = Workload {
        objects: s.sync_objects,
        sync: true,
        ..w
    };
    let disk = Target::Disk(DiskDir::new()?);
    let memory = Target::Memfs(MemfsMount::new(&[])?);
    let none = DurableTarget::new("none")?;
    let asyn = DurableTarget::new("async")?;
    let sync = DurableTarget::new("sync")?;
    let r = crate::benchmarks::metadata::measure(
        &[&memory, &none.target, &asyn.target, &disk],
        &w,
        s.iterations,
    )?;
    let rs = crate::benchmarks::metadata::measure(&[&sync.target, &disk], &ws, s.iterations)?;
    let ext4 = "ext4 (/var/tmp)";
    let ext4_sync = "ext4 (/var/tmp) fsync each";
    let mut out = vec![
        rate_figure(
            "durability.metadata.memory.create".into(),
            &r[0],
            0,
            ext4,
            &r[3],
            None,
        ),
        rate_figure(
            "durability.metadata.none.create".into(),
            &r[1],
            0,
            ext4,
            &r[3],
            None,
        ),
    ];
    // Issue 3: async within 15 % of none, on every phase of the benchmark.
    for (p, ph) in PHASES.iter().enumerate() {
        out.push(rate_figure(
            format!("durability.metadata.async.{ph}"),
            &r[2],
            p,
            "memfs none",
            &r[1],
            Some(0.85),
        ));
    }
    // ... and sync creates at least 3x ext4 with fsync after each create.
    out.push(rate_figure(
        "durability.metadata.sync.create".into(),
        &rs[0],
        0,
        ext4_sync,
        &rs[1],
        Some(3.0),
    ));
    drop((memory, none, asyn, sync, disk));
    Ok(out)
}

fn fio_part(fio: &Path, job: &FioJob, rounds: usize) -> anyhow::Result<Vec<Figure>> {
    use crate::benchmarks::fio::FioResult;
    let memory = Target::Memfs(MemfsMount::new(&[])?);
    let none = DurableTarget::new("none")?;
    let asyn = DurableTarget::new("async")?;
    let targets = [&memory, &none.target, &asyn.target];
    // results[target][round]; each round starts with another target, so that
    // a burst of load from other work on the machine is spread over all.
    let mut results: Vec<Vec<FioResult>> = vec![Vec::new(); targets.len()];
    for round in 0..rounds {
        let order: Vec<usize> = (0..targets.len())
            .map(|i| (i + round) % targets.len())
            .collect();
        let list: Vec<&Target> = order.iter().map(|&i| targets[i]).collect();
        let r = crate::benchmarks::fio::measure(fio, &list, std::slice::from_ref(job)).map_err(
            |e| {
                e.context(format!(
                    "round {} (server logs: in memory: {}; none: {}; async: {})",
                    round + 1,
                    server_log(&memory),
                    server_log(&none.target),
                    server_log(&asyn.target)
                ))
            },
        )?;
        for (k, &i) in order.iter().enumerate() {
            results[i].push(r[k][0]);
        }
    }
    let stat = |t: usize, get: fn(&FioResult) -> f64| {
        mean_sd(&results[t].iter().map(|r| get(r) / MIB).collect::<Vec<_>>())
    };
    let mut out = Vec::new();
    for (way, get) in [
        ("read", (|r: &FioResult| r.read_bw) as fn(&FioResult) -> f64),
        ("write", |r| r.write_bw),
    ] {
        let (m, msd) = stat(0, get);
        let (n, nsd) = stat(1, get);
        let (a, asd) = stat(2, get);
        out.push(
            Figure::new(format!("durability.fio.4k.direct.none.{way}"), "MiB/s", n)
                .stddev(nsd)
                .baseline("memfs in memory", m, msd),
        );
        // Issue 3: async within 25 % of none.
        out.push(
            Figure::new(format!("durability.fio.4k.direct.async.{way}"), "MiB/s", a)
                .stddev(asd)
                .baseline("memfs none", n, nsd)
                .target(Some(0.75 * n)),
        );
    }
    drop((memory, none, asyn));
    Ok(out)
}

fn server_log(t: &Target) -> String {
    match t {
        Target::Memfs(m) => m.server_log(),
        _ => String::new(),
    }
}

/// A buffer of bytes that do not compress to nothing.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Writes `total` bytes of file data under `dir` in files of at most 64 MiB.
fn write_bulk(dir: &Path, total: u64) -> anyhow::Result<()> {
    const FILE: u64 = 64 << 20;
    let buf = pattern(1 << 20, 7);
    let mut left = total;
    let mut i = 0;
    while left > 0 {
        check_interrupted()?;
        let path = dir.join(format!("bulk-{i}"));
        let mut f = std::fs::File::create(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        let mut n = left.min(FILE);
        left -= n;
        while n > 0 {
            let k = n.min(buf.len() as u64) as usize;
            f.write_all(&buf[..k])
                .with_context(|| format!("cannot write {}", path.display()))?;
            n -= k as u64;
        }
        i += 1;
    }
    Ok(())
}

/// One timed small operation: when it started and how long it took.
type Sample = (Instant, Duration);

/// Small operations in `dir` (a 4 KiB pwrite at a varying offset of one
/// file, then create and unlink of a file), each timed, until `stop` says so.
struct Prober {
    dir: PathBuf,
    file: std::fs::File,
    buf: Vec<u8>,
    n: u64,
}

impl Prober {
    const SPAN: u64 = 16 << 20;

    fn new(dir: &Path) -> anyhow::Result<Self> {
        let path = dir.join("probe");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        Ok(Prober {
            dir: dir.to_path_buf(),
            file,
            buf: pattern(4096, 11),
            n: 0,
        })
    }

    fn run(&mut self, out: &mut Vec<Sample>, stop: impl Fn() -> bool) -> anyhow::Result<()> {
        while !stop() {
            check_interrupted()?;
            self.n += 1;
            let off = (self.n.wrapping_mul(2_654_435_761) % (Self::SPAN / 4096)) * 4096;
            let t = Instant::now();
            self.file
                .write_all_at(&self.buf, off)
                .context("probe pwrite")?;
            out.push((t, t.elapsed()));
            let name = self.dir.join(format!("probe-{}", self.n));
            let t = Instant::now();
            std::fs::File::create(&name)
                .with_context(|| format!("probe create {}", name.display()))?;
            out.push((t, t.elapsed()));
            let t = Instant::now();
            std::fs::remove_file(&name)
                .with_context(|| format!("probe unlink {}", name.display()))?;
            out.push((t, t.elapsed()));
        }
        Ok(())
    }
}

/// p50, p99 and max in milliseconds (zeros for no samples).
fn percentiles(samples: &[Duration]) -> [f64; 3] {
    if samples.is_empty() {
        return [0.0; 3];
    }
    let mut v: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    [at(0.5), at(0.99), v[v.len() - 1]]
}

/// A checkpoint requested on another thread while `prober` runs into
/// `during`: the reply, and when the request started and ended.
fn probed_checkpoint(
    prober: &mut Prober,
    dir: &Path,
    during: &mut Vec<Sample>,
) -> anyhow::Result<(Vec<String>, Instant, Instant)> {
    let done = Arc::new(AtomicBool::new(false));
    let dir = dir.to_path_buf();
    let (reply, start, end) = std::thread::scope(|sc| {
        let done2 = done.clone();
        let h = sc.spawn(move || {
            let start = Instant::now();
            let r = crate::system::control_request(&dir, "checkpoint");
            let end = Instant::now();
            done2.store(true, Ordering::Release);
            (r, start, end)
        });
        let probed = prober.run(during, || done.load(Ordering::Acquire));
        let (r, start, end) = h.join().expect("checkpoint thread panicked");
        probed.map(|()| (r, start, end))
    })?;
    Ok((reply.context("checkpoint request")?, start, end))
}

/// The pages and server seconds of a `checkpoint` reply.
fn checkpoint_reply(reply: &[String]) -> anyhow::Result<(u64, f64)> {
    let fields: Vec<&str> = reply
        .first()
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    if fields.len() != 4 {
        bail!("unexpected checkpoint reply {reply:?} (expected: COMMIT NODES PAGES SECONDS)");
    }
    let pages: u64 = fields[2].parse().context("checkpoint reply: pages")?;
    let server_secs: f64 = fields[3].parse().context("checkpoint reply: seconds")?;
    Ok((pages, server_secs))
}

fn checkpoint_part(s: &Settings) -> anyhow::Result<(Vec<Figure>, serde_json::Value)> {
    let data = DiskDir::new().context("cannot create a data directory")?;
    let mount = MemfsMount::new(&durable_args(data.path(), "async"))?;
    let t = Instant::now();
    write_bulk(mount.path(), s.checkpoint_size)?;
    let write_secs = t.elapsed().as_secs_f64();
    // Let any checkpoint the journal's volume started finish, and make the
    // one we measure cover everything written.
    std::thread::sleep(Duration::from_secs(1));
    crate::system::control_request(data.path(), "checkpoint").context("settling checkpoint")?;

    let mut prober = Prober::new(mount.path())?;
    let mut outside = Vec::new();
    let window = Duration::from_secs_f64(s.window_secs);
    let t = Instant::now();
    prober.run(&mut outside, || t.elapsed() >= window)?;

    let mut during = Vec::new();
    let (reply, ck_start, ck_end) = probed_checkpoint(&mut prober, data.path(), &mut during)?;
    let (pages, server_secs) = checkpoint_reply(&reply)?;
    let wall = (ck_end - ck_start).as_secs_f64();
    let in_ck: Vec<Duration> = during
        .iter()
        .filter(|(at, _)| *at >= ck_start && *at <= ck_end)
        .map(|(_, d)| *d)
        .collect();
    let out_ck: Vec<Duration> = outside.iter().map(|(_, d)| *d).collect();
    let pin = percentiles(&in_ck);
    let pout = percentiles(&out_ck);
    let mut figs = vec![
        Figure::new("durability.checkpoint.seconds", "s", server_secs).lower_is_better(),
        Figure::new(
            "durability.checkpoint.throughput",
            "MiB/s",
            pages as f64 * 4096.0 / MIB / server_secs.max(1e-9),
        ),
    ];
    for (i, q) in ["p50", "p99", "max"].iter().enumerate() {
        let target = (*q == "p99").then_some(10.0);
        figs.push(
            Figure::new(
                format!("durability.checkpoint.op_latency.{q}"),
                "ms",
                pin[i],
            )
            .baseline("outside a checkpoint", pout[i], None)
            .target(target)
            .lower_is_better(),
        );
    }
    let info = serde_json::json!({
        "durability": "async",
        "data_written_bytes": s.checkpoint_size,
        "write_secs": write_secs,
        "checkpoint_pages": pages,
        "checkpoint_reply": reply,
        "checkpoint_wall_secs": wall,
        "ops_during": in_ck.len(),
        "ops_outside": out_ck.len(),
    });
    drop(prober);
    drop(mount);
    drop(data);
    Ok((figs, info))
}

/// What a recovery line says about the journal replay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Replay {
    pub commits: u64,
    pub mb: f64,
    pub secs: f64,
    pub checkpoint_load_secs: Option<f64>,
}

/// Parses `memfs: recovery: ... replayed N commits (X MB, R MB/s) in Ts; ...`
/// out of the server's output.
pub fn parse_recovery(log: &str) -> anyhow::Result<Replay> {
    let line = log
        .lines()
        .find_map(|l| l.split_once("memfs: recovery: ").map(|(_, r)| r))
        .context("the server printed no recovery line")?;
    let bad = || format!("cannot read the recovery line {line:?}");
    let rest = line.split_once("replayed ").with_context(bad)?.1;
    let (commits, rest) = rest.split_once(" commits (").with_context(bad)?;
    let (mb, rest) = rest.split_once(" MB, ").with_context(bad)?;
    let rest = rest.split_once("MB/s) in ").with_context(bad)?.1;
    let secs = rest.split_once('s').with_context(bad)?.0;
    let checkpoint_load_secs = line
        .split_once(" loaded in ")
        .and_then(|(_, r)| r.split_once('s'))
        .and_then(|(v, _)| v.parse().ok());
    Ok(Replay {
        commits: commits.trim().parse().with_context(bad)?,
        mb: mb.trim().parse().with_context(bad)?,
        secs: secs.trim().parse().with_context(bad)?,
        checkpoint_load_secs,
    })
}

fn recovery_part(s: &Settings) -> anyhow::Result<(Vec<Figure>, serde_json::Value)> {
    let data = DiskDir::new().context("cannot create a data directory")?;
    let args = durable_args(data.path(), "none");
    let mount = MemfsMount::new(&args)?;
    write_bulk(mount.path(), s.recovery_size)?;
    // `none` leaves the journal in the server's buffers: hand it to the OS.
    crate::system::control_request(data.path(), "sync").context("sync before the kill")?;
    let pid = nix::unistd::Pid::from_raw(mount.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL)
        .context("cannot kill the memfs server")?;
    // Detaches the dead mount and reaps the server.
    drop(mount);

    let t = Instant::now();
    let mount = MemfsMount::new(&args).context("remounting after the kill")?;
    let mount_secs = t.elapsed().as_secs_f64();
    let log = mount.server_log();
    let replay = parse_recovery(&log)?;
    // Everything written must be back.
    let mut found = 0u64;
    for e in std::fs::read_dir(mount.path())? {
        found += e?.metadata()?.len();
    }
    if found != s.recovery_size {
        bail!(
            "after recovery the files hold {found} bytes, {} were written: {log}",
            s.recovery_size
        );
    }
    let rate = replay.mb / replay.secs.max(1e-9);
    let figs = vec![
        Figure::new("durability.recovery.replay_rate", "MB/s", rate).target(Some(500.0)),
        Figure::new("durability.recovery.replayed", "MB", replay.mb),
        Figure::new("durability.recovery.replay_seconds", "s", replay.secs).lower_is_better(),
        Figure::new("durability.recovery.mount_seconds", "s", mount_secs).lower_is_better(),
    ];
    let info = serde_json::json!({
        "durability": "none",
        "data_written_bytes": s.recovery_size,
        "commits_replayed": replay.commits,
        "checkpoint_load_secs": replay.checkpoint_load_secs,
        "recovery_line": log.lines().find(|l| l.contains("memfs: recovery:")),
    });
    drop(mount);
    drop(data);
    Ok((figs, info))
}

/// Like [`fmt_num`], with three decimals below 10 (seconds, milliseconds).
fn num(v: f64) -> String {
    if v.is_finite() && v.abs() < 10.0 {
        format!("{v:.3}")
    } else {
        fmt_num(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::DurableSubject;

    #[test]
    fn parses_recovery_lines() {
        let log = "x\nmemfs: recovery: checkpoint at commit 5 (3 nodes, 9 pages) loaded in 0.250s; \
                   replayed 1200 commits (210.5 MB, 700 MB/s) in 0.301s; at commit 1205\nmemfs: mounted";
        let r = parse_recovery(log).unwrap();
        assert_eq!(r.commits, 1200);
        assert_eq!(r.mb, 210.5);
        assert_eq!(r.secs, 0.301);
        assert_eq!(r.checkpoint_load_secs, Some(0.25));
        let r = parse_recovery(
            "memfs: recovery: no checkpoint; replayed 0 commits (0.0 MB, 0 MB/s) in 0.000s; at commit 0",
        )
        .unwrap();
        assert_eq!((r.commits, r.checkpoint_load_secs), (0, None));
        assert!(parse_recovery("memfs: mounted").is_err());
        assert!(parse_recovery("memfs: recovery: new data directory").is_err());
    }

    #[test]
    fn percentiles_and_labels() {
        let d: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let [p50, p99, max] = percentiles(&d);
        assert!((50.0..=51.0).contains(&p50), "{p50}");
        assert_eq!((p99, max), (99.0, 100.0));
        assert_eq!(percentiles(&[]), [0.0; 3]);
        assert!(DurableSubject::new(Some("fast")).is_err());
        let d = DurableSubject::new(Some("relaxed=8")).unwrap().unwrap();
        assert_eq!(d.label(), "durable-relaxed-8");
        assert!(!d.is_sync());
        assert!(
            DurableSubject::new(Some("sync"))
                .unwrap()
                .unwrap()
                .is_sync()
        );
        assert!(DurableSubject::new(None).unwrap().is_none());
    }
}
