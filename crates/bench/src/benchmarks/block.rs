//! `memfs bench block`: the block-store workload (workloads.md section 4)
//! against LMDB through `heed`, one write transaction per block, with LMDB's
//! sync both off (as published) and on.
//!
//! Per block: 10,000 inserts of new 8-byte keys with 8-byte values, then 9,000
//! deletes of the oldest keys (net +1,000 live keys per block). Every scenario
//! runs in a fresh directory; its timing includes closing the store (so async
//! modes are charged for making everything durable at the end).

use anyhow::{Context, Result};
use memfs_store::{Durability, Store, StoreOptions};
use std::path::{Path, PathBuf};
use std::time::Instant;

const INSERTS: u64 = 10_000;
const DELETES: u64 = 9_000;
const OPS_PER_BLOCK: u64 = INSERTS + DELETES;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Number of blocks per scenario.
    #[arg(long, default_value_t = 1000)]
    pub blocks: u64,
    /// Threads applying a block in memfs.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Shards (hash tables) in memfs.
    #[arg(long, default_value_t = 16)]
    pub shards: usize,
    /// memfs durability mode, or `all` (none, async-relaxed, async, relaxed, sync).
    #[arg(long, default_value = "all")]
    pub durability: String,
    /// Also run LMDB (sync off and sync on) for the ratios.
    #[arg(long)]
    pub lmdb: bool,
    /// Snapshot every N blocks during the run (0 = never).
    #[arg(long, default_value_t = 1000)]
    pub snapshot_interval: u64,
    /// Directory for the scenario data (a fresh subdirectory per scenario).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Where to write the machine-readable results.
    #[arg(long, default_value = "bench-results/block.json")]
    pub json: PathBuf,
    /// Run the whole sequence of scenarios this many times, interleaved, and
    /// report each scenario's median run: on a shared, noisy machine this keeps
    /// a load spike from landing on one scenario only.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Internal: run only scenario K in this process and write its result to
    /// --child-out (the parent runs each scenario in a fresh process so peak
    /// memory and heap state are not inherited from the previous one).
    #[arg(long, hide = true)]
    pub child_scenario: Option<usize>,
    #[arg(long, hide = true)]
    pub child_out: Option<PathBuf>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Scenario {
    name: String,
    engine: String,
    durability: String,
    threads: usize,
    blocks: u64,
    ops: u64,
    seconds: f64,
    blocks_per_sec: f64,
    ops_per_sec: f64,
    /// Throughput over the first min(1000, blocks) blocks.
    first_1000_ops_per_sec: f64,
    peak_rss_bytes: u64,
    disk_bytes: u64,
    /// memfs only: bytes of table memory per live entry beyond key and value.
    overhead_bytes_per_entry: Option<f64>,
    latency_p50_us: Option<u64>,
    latency_p99_us: Option<u64>,
    /// memfs only: reopening the directory afterwards.
    recovery: Option<Recovery>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Recovery {
    /// Full open: snapshot load + journal replay applied to the tables.
    open_seconds: f64,
    commits_replayed: u64,
    bytes_replayed: u64,
    /// Journal scan alone (read, checksum, frame) over every segment.
    scan_seconds: f64,
    scan_bytes: u64,
    scan_mb_per_sec: f64,
}

fn measure_recovery(dir: &Path) -> Result<Recovery> {
    let t0 = Instant::now();
    let s = Store::open(dir)?;
    let open_seconds = t0.elapsed().as_secs_f64();
    let r = s.open_report().clone();
    drop(s);
    let t1 = Instant::now();
    let mut bytes = 0u64;
    memfs_store::journal::recovery::replay_readonly(dir, 0, &mut |_, p| {
        bytes += p.len() as u64;
        Ok(())
    })
    .or_else(|e| match e {
        // Segments before the snapshot were pruned: scan what is there.
        memfs_store::journal::Error::Corrupt { .. } => {
            let first = memfs_store::journal::recovery::list_segments(dir)?
                .first()
                .map_or(0, |s| s.0.saturating_sub(1));
            memfs_store::journal::recovery::replay_readonly(dir, first, &mut |_, p| {
                bytes += p.len() as u64;
                Ok(())
            })
        }
        e => Err(e),
    })?;
    let scan_seconds = t1.elapsed().as_secs_f64();
    Ok(Recovery {
        open_seconds,
        commits_replayed: r.commits_replayed,
        bytes_replayed: r.bytes_replayed,
        scan_seconds,
        scan_bytes: bytes,
        scan_mb_per_sec: bytes as f64 / 1e6 / scan_seconds.max(1e-9),
    })
}

/// The published Rust store's figures on these machines (ops/s, midpoints of
/// the ranges in issue 4), at 1,000 and 3,000 blocks.
fn published(name: &str, blocks: u64) -> Option<f64> {
    let (a, b) = match name {
        n if n.starts_with("memfs async-relaxed") => (1.815e6, 1.605e6),
        "memfs async, 1 thread" => (1.73e6, 1.44e6),
        n if n.starts_with("memfs async") => (1.90e6, 1.48e6),
        n if n.starts_with("memfs sync") => (1.395e6, 1.125e6),
        "LMDB sync off" => (2.13e6, 1.38e6),
        _ => return None,
    };
    match blocks {
        1000 => Some(a),
        3000 => Some(b),
        _ => None,
    }
}

fn reset_peak_rss() {
    // Linux >= 4.0: writing 5 resets VmHWM to the current RSS.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn peak_rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn disk_usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.blocks() * 512)
                .sum()
        })
        .unwrap_or(0)
}

/// Keys inserted and deleted by block `b` (1-based).
fn block_ranges(b: u64) -> (std::ops::Range<u64>, std::ops::Range<u64>) {
    (
        (b - 1) * INSERTS..b * INSERTS,
        (b - 1) * DELETES..b * DELETES,
    )
}

fn run_memfs(
    dir: &Path,
    name: &str,
    mode: Durability,
    threads: usize,
    args: &Args,
) -> Result<Scenario> {
    reset_peak_rss();
    let final_keys = args.blocks * (INSERTS - DELETES) + DELETES;
    let store = Store::create(
        dir,
        StoreOptions {
            key_width: 8,
            shards: args.shards,
            capacity_per_shard: (final_keys / args.shards as u64) as usize + 1,
            threads,
            durability: mode,
            snapshot_interval: args.snapshot_interval,
            rollback_window: 100,
            ..Default::default()
        },
    )?;
    let t0 = Instant::now();
    let mut first = None;
    let mut ops: Vec<([u8; 8], Val)> = Vec::with_capacity(OPS_PER_BLOCK as usize);
    for b in 1..=args.blocks {
        let (ins, del) = block_ranges(b);
        ops.clear();
        ops.extend(ins.map(|k| (k.to_be_bytes(), Val((k ^ 0x5555).to_le_bytes(), 8))));
        ops.extend(del.map(|k| (k.to_be_bytes(), Val([0u8; 8], 0))));
        store.set(b, &ops)?;
        if b == args.blocks.min(1000) {
            first = Some(t0.elapsed());
        }
    }
    let m = store.metrics();
    store.close()?;
    let secs = t0.elapsed().as_secs_f64();
    let peak = peak_rss();
    let recovery = Some(measure_recovery(dir)?);
    let n = args.blocks.min(1000);
    Ok(Scenario {
        name: name.to_string(),
        engine: "memfs".into(),
        durability: mode.to_string(),
        threads,
        blocks: args.blocks,
        ops: args.blocks * OPS_PER_BLOCK,
        seconds: secs,
        blocks_per_sec: args.blocks as f64 / secs,
        ops_per_sec: (args.blocks * OPS_PER_BLOCK) as f64 / secs,
        first_1000_ops_per_sec: (n * OPS_PER_BLOCK) as f64
            / first.map_or(secs, |d| d.as_secs_f64()),
        peak_rss_bytes: peak,
        disk_bytes: disk_usage(dir),
        overhead_bytes_per_entry: (m.entries > 0)
            .then(|| m.table_bytes as f64 / m.entries as f64 - 16.0),
        latency_p50_us: Some(m.latency_p50_us),
        latency_p99_us: Some(m.latency_p99_us),
        recovery,
    })
}

fn run_lmdb(dir: &Path, sync: bool, args: &Args) -> Result<Scenario> {
    use heed::types::Bytes;
    use heed::{Database, EnvFlags, EnvOpenOptions};
    reset_peak_rss();
    std::fs::create_dir_all(dir)?;
    let mut o = EnvOpenOptions::new();
    o.map_size(256 << 30);
    if !sync {
        // SAFETY: the published baseline's flags; they trade durability for
        // speed, which is the point of this scenario. No other process uses
        // this environment.
        unsafe {
            o.flags(EnvFlags::NO_SYNC | EnvFlags::NO_META_SYNC | EnvFlags::MAP_ASYNC);
        }
    }
    // SAFETY: a fresh directory used by this process only, for the lifetime
    // of `env`; the map is never modified behind LMDB's back.
    let env = unsafe { o.open(dir) }.context("opening LMDB")?;
    let mut wtxn = env.write_txn()?;
    let db: Database<Bytes, Bytes> = env.create_database(&mut wtxn, None)?;
    wtxn.commit()?;
    let t0 = Instant::now();
    let mut first = None;
    for b in 1..=args.blocks {
        let (ins, del) = block_ranges(b);
        let mut txn = env.write_txn()?;
        for k in ins {
            db.put(&mut txn, &k.to_be_bytes(), &(k ^ 0x5555).to_le_bytes())?;
        }
        for k in del {
            db.delete(&mut txn, &k.to_be_bytes())?;
        }
        txn.commit()?;
        if b == args.blocks.min(1000) {
            first = Some(t0.elapsed());
        }
    }
    env.force_sync()?;
    drop(env);
    let secs = t0.elapsed().as_secs_f64();
    let n = args.blocks.min(1000);
    Ok(Scenario {
        name: format!("LMDB sync {}", if sync { "on" } else { "off" }),
        engine: "lmdb".into(),
        durability: if sync { "sync".into() } else { "nosync".into() },
        threads: 1,
        blocks: args.blocks,
        ops: args.blocks * OPS_PER_BLOCK,
        seconds: secs,
        blocks_per_sec: args.blocks as f64 / secs,
        ops_per_sec: (args.blocks * OPS_PER_BLOCK) as f64 / secs,
        first_1000_ops_per_sec: (n * OPS_PER_BLOCK) as f64
            / first.map_or(secs, |d| d.as_secs_f64()),
        peak_rss_bytes: peak_rss(),
        disk_bytes: disk_usage(dir),
        overhead_bytes_per_entry: None,
        latency_p50_us: None,
        latency_p99_us: None,
        recovery: None,
    })
}

/// An inline value of up to 8 bytes (length 0 = delete).
struct Val([u8; 8], u8);

impl AsRef<[u8]> for Val {
    fn as_ref(&self) -> &[u8] {
        &self.0[..self.1 as usize]
    }
}

fn fmt_ops(x: f64) -> String {
    format!("{:.2} M", x / 1e6)
}

/// Runs every scenario (each in a child process); `None` in a child.
fn measure(args: &Args) -> Result<Option<Measured>> {
    anyhow::ensure!(args.blocks > 0, "--blocks must be at least 1");
    anyhow::ensure!(args.threads > 0, "--threads must be at least 1");
    anyhow::ensure!(args.shards > 0, "--shards must be at least 1");
    let modes = modes(args)?;
    let base = base_dir(args)?;
    // The run's own directory goes on every path, a failed scenario too (a
    // scenario child leaves it to its parent).
    let _cleanup = RemoveOnDrop(args.child_scenario.is_none().then(|| base.clone()));
    // Scenario k < modes.len() is a memfs mode; then LMDB sync off, on.
    let count = modes.len() + if args.lmdb { 2 } else { 0 };
    if let Some(k) = args.child_scenario {
        anyhow::ensure!(k < count, "no scenario {k}");
        let r = run_scenario(k, &modes, &base, args)?;
        let out = args.child_out.as_ref().context("--child-out is required")?;
        std::fs::write(out, serde_json::to_vec(&r)?)?;
        return Ok(None);
    }
    let mut results = Vec::new();
    anyhow::ensure!(args.repeat > 0, "--repeat must be at least 1");
    let runs = run_rounds(args, &modes, count, &base)?;
    let all_runs = runs.clone();
    for mut v in runs {
        v.sort_by(|a, b| a.ops_per_sec.total_cmp(&b.ops_per_sec));
        results.push(v.swap_remove(v.len() / 2));
    }
    std::fs::remove_dir_all(&base).ok();
    Ok(Some(Measured { results, all_runs }))
}

/// A memfs scenario: its name, durability mode and threads.
type Mode = (String, Durability, usize);

/// The memfs scenarios `--durability` asks for.
fn modes(args: &Args) -> Result<Vec<Mode>> {
    Ok(if args.durability == "all" {
        let mut v: Vec<Mode> = ["none", "async-relaxed", "async", "relaxed", "sync"]
            .iter()
            .map(|m| {
                let d: Durability = m.parse().expect("valid mode");
                (
                    format!("memfs {m}, {} threads", args.threads),
                    d,
                    args.threads,
                )
            })
            .collect();
        if args.threads > 1 {
            v.push((
                "memfs async, 1 thread".into(),
                "async".parse().expect("valid mode"),
                1,
            ));
        }
        v
    } else {
        let d: Durability = args
            .durability
            .parse()
            .map_err(|e: String| anyhow::anyhow!(e))?;
        vec![(
            format!("memfs {}, {} threads", args.durability, args.threads),
            d,
            args.threads,
        )]
    })
}

/// The run's base directory: a scenario child's is its parent's.
fn base_dir(args: &Args) -> Result<PathBuf> {
    Ok(match (&args.dir, args.child_scenario) {
        (Some(d), Some(_)) => d.clone(),
        (Some(d), None) => {
            std::fs::create_dir_all(d)?;
            tempfile_in(d)?
        }
        (None, _) => tempfile_in(&std::env::temp_dir())?,
    })
}

/// A directory removed when dropped (if any).
struct RemoveOnDrop(Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

/// Scenario `k`, in this process, in its own directory under `base`.
fn run_scenario(k: usize, modes: &[Mode], base: &Path, args: &Args) -> Result<Scenario> {
    if k < modes.len() {
        let (name, d, threads) = &modes[k];
        let dir = base.join(format!("memfs-{k}"));
        let r = run_memfs(&dir, name, *d, *threads, args);
        std::fs::remove_dir_all(&dir).ok();
        r
    } else {
        let sync = k > modes.len();
        let dir = base.join(format!("lmdb-{sync}"));
        let r = run_lmdb(&dir, sync, args);
        std::fs::remove_dir_all(&dir).ok();
        r
    }
}

/// The child's arguments, but for its scenario and output.
fn child_args(args: &Args) -> Vec<String> {
    // The child gets the settings that shape a scenario (not our own command
    // line: `memfs bench all` runs this too) and the run's base directory.
    let mut child_args: Vec<String> = vec![
        "bench".into(),
        "block".into(),
        "--blocks".into(),
        args.blocks.to_string(),
        "--threads".into(),
        args.threads.to_string(),
        "--shards".into(),
        args.shards.to_string(),
        "--durability".into(),
        args.durability.clone(),
        "--snapshot-interval".into(),
        args.snapshot_interval.to_string(),
    ];
    if args.lmdb {
        child_args.push("--lmdb".into());
    }
    child_args
}

/// Every scenario `--repeat` times, each in a child process, in turns:
/// `runs[scenario][round]`.
fn run_rounds(
    args: &Args,
    modes: &[Mode],
    count: usize,
    base: &Path,
) -> Result<Vec<Vec<Scenario>>> {
    let exe = std::env::current_exe().context("locating the memfs binary")?;
    let child_args = child_args(args);
    let mut runs: Vec<Vec<Scenario>> = vec![Vec::new(); count];
    for round in 0..args.repeat {
        for (k, runs_k) in runs.iter_mut().enumerate() {
            let label = if k < modes.len() {
                modes[k].0.clone()
            } else if k == modes.len() {
                "LMDB sync off".into()
            } else {
                "LMDB sync on".into()
            };
            eprintln!(
                "round {}/{}: running {label} ({} blocks)...",
                round + 1,
                args.repeat,
                args.blocks
            );
            let out = base.join(format!("result-{k}.json"));
            let status = std::process::Command::new(&exe)
                .args(&child_args)
                .arg("--child-scenario")
                .arg(k.to_string())
                .arg("--child-out")
                .arg(&out)
                .arg("--dir")
                .arg(base)
                .status()
                .context("starting a scenario process")?;
            anyhow::ensure!(status.success(), "scenario {label} failed ({status})");
            let bytes =
                std::fs::read(&out).with_context(|| format!("reading {}", out.display()))?;
            runs_k.push(serde_json::from_slice::<Scenario>(&bytes)?);
        }
    }
    Ok(runs)
}

/// Every scenario's median run, and all runs (`runs[scenario][round]`).
struct Measured {
    results: Vec<Scenario>,
    all_runs: Vec<Vec<Scenario>>,
}

pub fn run(args: Args) -> Result<()> {
    let Some(Measured { results, all_runs }) = measure(&args)? else {
        return Ok(()); // a scenario child: it wrote its result
    };
    print_table(&args, &results);
    write_json(&args, &results, &all_runs)
}

/// The scenarios' table, each row against both LMDB runs and the published
/// figure.
fn print_table(args: &Args, results: &[Scenario]) {
    let lmdb_off = results
        .iter()
        .find(|r| r.name == "LMDB sync off")
        .map(|r| r.ops_per_sec);
    let lmdb_on = results
        .iter()
        .find(|r| r.name == "LMDB sync on")
        .map(|r| r.ops_per_sec);
    let ratio = |x: f64, base: Option<f64>| base.map_or("-".into(), |b| format!("{:.2}x", x / b));
    println!(
        "block workload: {} blocks x ({INSERTS} inserts + {DELETES} deletes), {} shards, 8-byte keys and values",
        args.blocks, args.shards
    );
    println!(
        "{:<30} {:>8} {:>10} {:>10} {:>12} {:>9} {:>9} {:>10} {:>9} {:>9} {:>9}",
        "scenario",
        "secs",
        "blocks/s",
        "ops/s",
        "first1k ops",
        "vs LMDB0",
        "vs LMDB1",
        "vs publ.",
        "peak MiB",
        "disk MiB",
        "ovh B/e"
    );
    for r in results {
        println!(
            "{:<30} {:>8.2} {:>10.1} {:>10} {:>12} {:>9} {:>9} {:>10} {:>9.0} {:>9.0} {:>9}",
            r.name,
            r.seconds,
            r.blocks_per_sec,
            fmt_ops(r.ops_per_sec),
            fmt_ops(r.first_1000_ops_per_sec),
            ratio(r.ops_per_sec, lmdb_off),
            ratio(r.ops_per_sec, lmdb_on),
            ratio(r.ops_per_sec, published(&r.name, args.blocks)),
            r.peak_rss_bytes as f64 / (1 << 20) as f64,
            r.disk_bytes as f64 / (1 << 20) as f64,
            r.overhead_bytes_per_entry
                .map_or("-".into(), |o| format!("{o:.1}")),
        );
    }
    print_recoveries(results);
    if args.repeat > 1 {
        println!(
            "each row is the median of {} interleaved runs (all runs in the JSON)",
            args.repeat
        );
    }
    println!(
        "vs LMDB0/LMDB1: ratio to LMDB with sync off/on in this run; vs publ.: ratio to the published store's figure on these machines (issue 4; only at 1000 and 3000 blocks)"
    );
}

fn print_recoveries(results: &[Scenario]) {
    for r in results {
        if let Some(rc) = &r.recovery {
            println!(
                "recovery after {:<30} open {:.2}s ({} commits, {:.0} MB replayed into the tables); journal scan {:.0} MB at {:.0} MB/s",
                r.name,
                rc.open_seconds,
                rc.commits_replayed,
                rc.bytes_replayed as f64 / 1e6,
                rc.scan_bytes as f64 / 1e6,
                rc.scan_mb_per_sec
            );
        }
    }
}

/// The JSON results: every scenario's median run and all the runs.
fn write_json(args: &Args, results: &[Scenario], all_runs: &[Vec<Scenario>]) -> Result<()> {
    if let Some(parent) = args.json.parent() {
        std::fs::create_dir_all(parent).ok();
    }
    let doc = serde_json::json!({
        "benchmark": "block",
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "blocks": args.blocks,
        "shards": args.shards,
        "threads": args.threads,
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "repeat": args.repeat,
        "scenarios": results,
        "all_runs": all_runs,
    });
    std::fs::write(&args.json, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {}", args.json.display()))?;
    eprintln!("wrote {}", args.json.display());
    Ok(())
}

/// Figure-name slug of a scenario: `memfs async, 2 threads` -> `memfs_async_t2`,
/// `LMDB sync off` -> `lmdb_sync_off`.
fn slug(name: &str) -> String {
    let mut out = String::new();
    for word in name.split([' ', ',']).filter(|w| !w.is_empty()) {
        let w = word.to_ascii_lowercase().replace('-', "_");
        if w == "threads" || w == "thread" {
            // `2 threads` -> `t2`
            if let Some(pos) = out.rfind('_') {
                let n = out[pos + 1..].to_string();
                out.truncate(pos);
                out.push_str(&format!("_t{n}"));
            }
            continue;
        }
        if w.starts_with('(') || w.ends_with(')') {
            continue;
        }
        if !out.is_empty() {
            out.push('_');
        }
        out.push_str(&w);
    }
    out
}

/// Measures as `memfs bench block` does and returns the figures in the common
/// report format (nothing printed but progress, nothing written): `memfs bench
/// all` calls this. `block.<scenario>.ops_per_sec` for every scenario; memfs's
/// `sync` mode is compared with LMDB sync on, every other mode with LMDB sync
/// off (the published baseline); the standard deviation is over `--repeat`.
pub fn report(args: &Args) -> Result<crate::common::Report> {
    use crate::common::{Figure, Report, mean_sd};
    anyhow::ensure!(
        args.child_scenario.is_none(),
        "a scenario child has no report"
    );
    let started = Instant::now();
    let mut report = Report::new(
        "block",
        serde_json::json!({
            "blocks": args.blocks,
            "threads": args.threads,
            "shards": args.shards,
            "durability": args.durability,
            "lmdb": args.lmdb,
            "snapshot_interval": args.snapshot_interval,
            "repeat": args.repeat,
            "inserts_per_block": INSERTS,
            "deletes_per_block": DELETES,
        }),
    );
    let m = measure(args)?.context("no results")?;
    let find = |name: &str| {
        m.results
            .iter()
            .zip(&m.all_runs)
            .find(|(r, _)| r.name == name)
    };
    let sd = |runs: &[Scenario]| mean_sd(&runs.iter().map(|r| r.ops_per_sec).collect::<Vec<_>>()).1;
    for (r, runs) in m.results.iter().zip(&m.all_runs) {
        let mut f = Figure::new(
            format!("block.{}.ops_per_sec", slug(&r.name)),
            "ops/s",
            r.ops_per_sec,
        )
        .stddev(sd(runs));
        if r.engine == "memfs" {
            let base = if r.durability == "sync" {
                "LMDB sync on"
            } else {
                "LMDB sync off"
            };
            if let Some((b, bruns)) = find(base) {
                f = f.baseline(base, b.ops_per_sec, sd(bruns));
            }
        }
        report.figures.push(f);
    }
    report.duration_secs = started.elapsed().as_secs_f64();
    Ok(report)
}

fn tempfile_in(dir: &Path) -> Result<PathBuf> {
    let p = dir.join(format!("memfs-bench-block-{}", std::process::id()));
    std::fs::create_dir_all(&p)?;
    Ok(p)
}
