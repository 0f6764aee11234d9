//! `memfs bench cluster`: a memfs volume on a Redis Cluster (issue 37),
//! against two baselines measured in the same run: a local memfs mount
//! running the same workload, and the floor the cluster itself allows
//! (`redis-benchmark -c 1` on the volume's metadata master: one round trip,
//! one script call; and 1 MiB SET and GET values).
//!
//! The run starts its own cluster ([`LocalCluster`]: 3 masters and 3
//! replicas on free 127.0.0.1 ports, stopped on every path, after every
//! mount is gone), creates a volume and mounts it with this binary
//! (`memfs mount M --cluster URL --volume V`). It measures, in order:
//! - metadata per empty file: the metadata master's `used_memory` before and
//!   after N creates through a mount, divided by N; the change feed's growth
//!   (a stream trimmed to a fixed length: not a cost per file) is reported
//!   on its own and left out;
//! - the floor (`redis-benchmark`), at the start and again at the end;
//! - the workload of `memfs bench metadata` (its code: create, open, stat,
//!   unlink) for each threads x mounts shape, alternating with a local memfs
//!   mount running the same threads and files; then mkdir and rename, one
//!   thread, here;
//! - the four figures of `memfs bench fio` (its `randrw` jobs) and 1 MiB
//!   random reads of cached data alone (`randread`, direct and buffered),
//!   on the volume and on the local mount; then 1 MiB direct random reads,
//!   and writes, each alone, on a mount whose cache is much smaller than
//!   the file, against the 1 MiB GET / SET floor.
//!
//! Two mounts: each runs the workload with its threads in a directory of its
//! own, both started together. A phase's combined rate is all the files over
//! the slower mount's time: a lower bound, since only the first phase starts
//! at one barrier (the workload's own barriers are per mount).

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use memfs_cluster::local::Options as ClusterOptions;
use memfs_cluster::{Admin, CreateOptions, LocalCluster};
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use nix::unistd::UnlinkatFlags;

use crate::benchmarks::fio::{self as bench_fio, FioJob, FioResult};
use crate::benchmarks::metadata::{self as bench_metadata, PhaseRates, Workload};
use crate::common::{
    ChildGuard, Figure, MIB, MemfsMount, Report, Target, check_interrupted,
    install_interrupt_handler, mean_sd, progress, split_args,
};

/// The volume every measurement uses.
const VOLUME: &str = "bench";
const LOCAL: &str = "memfs (local mount)";
const SCRIPT_FLOOR: &str = "redis-benchmark -c 1: one EVALSHA";
const GET_FLOOR: &str = "redis-benchmark -c 1: GET of 1 MiB";
const SET_FLOOR: &str = "redis-benchmark -c 1: SET of 1 MiB";
/// The metadata workload's phases reported here: its last, rmdir, removes
/// one directory a thread, too few to time.
const PHASES: [&str; 4] = ["create", "open", "stat", "unlink"];
/// The key redis-benchmark's SET and GET tests use without `-r`.
const BENCH_KEY: &str = "key:__rand_int__";
/// The bound on one redis-benchmark run and on one command of ours.
const FLOOR_TIMEOUT: Duration = Duration::from_secs(300);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The smoke test's sizes: a few hundred files, one iteration, 1-second
    /// fio jobs on a 16 MiB file (overrides the size options).
    #[arg(long)]
    pub short: bool,
    /// Repetitions of each metadata shape; figures are mean ± sd over them.
    #[arg(long, default_value_t = 3)]
    pub iterations: usize,
    /// Files per metadata run, split across every thread of every mount.
    #[arg(long, default_value_t = 20_000)]
    pub objects: usize,
    /// Threads per mount, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    pub threads: Vec<usize>,
    /// Mounts of the volume running the workload together, comma-separated
    /// (1 or 2).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub mounts: Vec<usize>,
    /// Directories made then renamed (one thread) for the mkdir and rename
    /// figures.
    #[arg(long, default_value_t = 5000)]
    pub dirs: usize,
    /// Empty files created to measure the metadata master's bytes per file.
    #[arg(long, default_value_t = 100_000)]
    pub bytes_files: usize,
    /// Requests of each redis-benchmark round-trip and script floor.
    #[arg(long, default_value_t = 50_000)]
    pub floor_requests: usize,
    /// 1 MiB values of each redis-benchmark SET and GET floor.
    #[arg(long, default_value_t = 1000)]
    pub floor_values: usize,
    /// Size of fio's test file.
    #[arg(long, default_value = "512M")]
    pub fio_size: String,
    /// Seconds each fio job runs.
    #[arg(long, default_value_t = 10)]
    pub fio_runtime: u64,
    /// Leave out the fio figures.
    #[arg(long)]
    pub no_fio: bool,
    /// `--cache-size` of the mount that measures uncached 1 MiB I/O (much
    /// smaller than the file, so reads go to the cluster).
    #[arg(long, default_value = "4M")]
    pub uncached_cache_size: String,
    /// Extra `memfs mount` options for every mount, local and volume.
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub memfs_args: String,
    /// Extra `memfs mount` options for the volume's mounts only, e.g.
    /// "--cache-size 2G".
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub volume_args: String,
    /// `maxmemory` of each node of the local cluster (Redis's syntax).
    #[arg(long, default_value = "2gb")]
    pub maxmemory: String,
    /// The fio binary.
    #[arg(long, default_value = "fio")]
    pub fio: PathBuf,
    /// Where to write the JSON results.
    #[arg(long, default_value = "bench-cluster.json")]
    pub json: PathBuf,
}

impl Args {
    /// The arguments with `--short`'s sizes applied.
    fn sized(&self) -> Args {
        if !self.short {
            return self.clone();
        }
        Args {
            iterations: 1,
            objects: 400,
            dirs: 200,
            bytes_files: 2000,
            floor_requests: 2000,
            floor_values: 50,
            fio_size: "16M".into(),
            fio_runtime: 1,
            ..self.clone()
        }
    }

    fn validate(&self) -> anyhow::Result<()> {
        if self.iterations == 0 {
            bail!("--iterations must be at least 1");
        }
        if self.threads.is_empty() || self.threads.contains(&0) {
            bail!("--threads needs thread counts of at least 1");
        }
        if self.mounts.is_empty() || self.mounts.iter().any(|m| !(1..=2).contains(m)) {
            bail!("--mounts takes 1, 2 or both");
        }
        let most = self.threads.iter().max().copied().unwrap_or(1)
            * self.mounts.iter().max().copied().unwrap_or(1);
        if self.objects < most {
            bail!(
                "--objects ({}) must be at least the most threads of all mounts ({most})",
                self.objects
            );
        }
        if self.dirs == 0 || self.bytes_files == 0 {
            bail!("--dirs and --bytes-files must be at least 1");
        }
        if self.floor_requests == 0 || self.floor_values == 0 {
            bail!("--floor-requests and --floor-values must be at least 1");
        }
        bench_fio::parse_bytes(&self.fio_size)
            .with_context(|| format!("invalid --fio-size {:?}", self.fio_size))?;
        Ok(())
    }

    /// Options of a mount of the volume on the cluster `spec`.
    fn volume_mount_args(&self, spec: &str) -> Vec<String> {
        let mut a = vec![
            "--cluster".to_string(),
            spec.to_string(),
            "--volume".to_string(),
            VOLUME.to_string(),
        ];
        a.extend(split_args(&self.memfs_args));
        a.extend(split_args(&self.volume_args));
        a
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let report = report(&args)?;
    print!("{}", report.table());
    report.write_json(&args.json)?;
    eprintln!("cluster: results written to {}", args.json.display());
    Ok(())
}

/// Measures as `memfs bench cluster` does and returns the report (nothing
/// printed but progress, nothing written): `memfs bench all` calls this.
pub fn report(args: &Args) -> anyhow::Result<Report> {
    install_interrupt_handler();
    let args = args.sized();
    args.validate()?;
    check_tools(&args)?;
    let started = Instant::now();
    // Machine and load are recorded as they were when the run began.
    let mut report = Report::new("cluster", serde_json::Value::Null);
    let cluster = LocalCluster::start(ClusterOptions {
        maxmemory: args.maxmemory.clone(),
        ..ClusterOptions::default()
    })
    .context("cannot start a local Redis Cluster")?;
    // Every mount is made and dropped in there: unmounted while the cluster
    // still answers, which is dropped (stopped) after.
    let measured = measure(&args, &cluster);
    drop(cluster);
    let (figures, config) = measured?;
    report.subject = "memfs volume".into();
    report.config = config;
    report.figures = figures;
    report.duration_secs = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Whether the programs the run needs are here, with what to install.
fn check_tools(args: &Args) -> anyhow::Result<()> {
    for tool in ["redis-server", "redis-cli", "redis-benchmark"] {
        let ok = Command::new(tool)
            .arg("--version")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            bail!("{tool} not found: install redis-server and redis-tools (scripts/setup)");
        }
    }
    if !args.no_fio && !bench_fio::fio_available(&args.fio) {
        bail!(
            "{} not found or not working: install fio (apt-get install fio), or pass --no-fio",
            args.fio.display()
        );
    }
    Ok(())
}

/// `--cluster` of the mounts: every node, `redis://H:P,H:P,...`.
fn cluster_spec(urls: &[String]) -> String {
    let addrs: Vec<&str> = urls
        .iter()
        .map(|u| u.strip_prefix("redis://").unwrap_or(u))
        .collect();
    format!("redis://{}", addrs.join(","))
}

/// Everything measured on `cluster`, as figures, and the run's settings.
fn measure(
    args: &Args,
    cluster: &LocalCluster,
) -> anyhow::Result<(Vec<Figure>, serde_json::Value)> {
    let urls = cluster.urls();
    let spec = cluster_spec(&urls);
    let admin = Admin::connect(&urls).context("cannot reach the local cluster")?;
    let owner = CreateOptions {
        uid: nix::unistd::geteuid().as_raw(),
        gid: nix::unistd::getegid().as_raw(),
        ..CreateOptions::default()
    };
    admin
        .create(VOLUME, &owner)
        .with_context(|| format!("cannot create volume {VOLUME}"))?;
    let master = admin.status(VOLUME)?.metadata_master;
    let volume_args = args.volume_mount_args(&spec);
    let local_args = split_args(&args.memfs_args);
    eprintln!(
        "cluster: {} nodes, volume {VOLUME} with its metadata on {master}",
        cluster.len()
    );

    let mut floors = vec![measure_floor(cluster, &master, args)?];
    eprintln!("cluster: floor {:?}", floors[0]);
    let first = volume_mount(&volume_args)?;
    let bytes = bytes_per_file(&master, first.path(), args.bytes_files)?;
    let local = Target::Memfs(MemfsMount::new(&local_args).context("local memfs mount")?);
    let second = if args.mounts.contains(&2) {
        Some(volume_mount(&volume_args)?)
    } else {
        None
    };
    let mut vols = vec![&first];
    vols.extend(second.as_ref());
    let meta = metadata_runs(args, &vols, &local)?;
    let dirs = dirs_runs(args, &first, &local)?;
    let calls = calls_per_op(&first, args.dirs)?;
    drop(second);
    let fio = if args.no_fio {
        None
    } else {
        Some(fio_runs(args, &first, &local, &volume_args)?)
    };
    floors.push(measure_floor(cluster, &master, args)?);

    let floor = Floor::mean(&floors);
    let mut figures = floor.figures();
    figures.extend(bytes.figures());
    figures.extend(metadata_figures(&meta, &floor));
    figures.extend(dirs_figures(&dirs, &floor));
    figures.extend(calls_figures(&calls));
    if let Some(fio) = &fio {
        figures.extend(fio.figures(&floor));
    }
    let config = config(args, &master, &volume_args, &spec);
    Ok((figures, config))
}

/// A mount of the volume, as a target to measure on.
fn volume_mount(volume_args: &[String]) -> anyhow::Result<Target> {
    let m = MemfsMount::new(volume_args).context("memfs mount --cluster URL --volume bench")?;
    Ok(Target::Memfs(m))
}

/// The report's `config`: sizes, mounts (the cluster's URL as a
/// placeholder), the floor's commands.
fn config(args: &Args, master: &str, volume_args: &[String], spec: &str) -> serde_json::Value {
    let volume_args: Vec<String> = volume_args
        .iter()
        .map(|a| {
            if a == spec {
                "CLUSTER_URL".into()
            } else {
                a.clone()
            }
        })
        .collect();
    serde_json::json!({
        "cluster": "LocalCluster: 3 masters, 3 replicas, 127.0.0.1",
        "maxmemory": args.maxmemory,
        "volume": VOLUME,
        "metadata_master": master,
        "iterations": args.iterations,
        "objects": args.objects,
        "threads_per_mount": args.threads,
        "mounts": args.mounts,
        "dirs": args.dirs,
        "bytes_files": args.bytes_files,
        "fio": !args.no_fio,
        "fio_size": args.fio_size,
        "fio_runtime_secs": args.fio_runtime,
        "uncached_cache_size": args.uncached_cache_size,
        "volume_mount_args": volume_args,
        "local_mount_args": split_args(&args.memfs_args),
        "baselines": [LOCAL, "redis-benchmark on the metadata master"],
        "floor_commands": [
            format!("redis-benchmark -c 1 -n {} PING", args.floor_requests),
            format!("redis-benchmark -c 1 -n {} EVALSHA SHA 1 {{{VOLUME}}}:meta", args.floor_requests),
            format!("redis-benchmark -c 1 -n {} -d 1048576 -t set,get", args.floor_values),
        ],
        "short": args.short,
    })
}

// ---------------------------------------------------------------------
// The cluster's floor.

/// What `redis-benchmark -c 1` reaches on the cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Floor {
    /// One round trip (PING), µs.
    ping_us: f64,
    /// One EVALSHA of a trivial script on the metadata slot, µs.
    script_us: f64,
    /// One EVALSHA of a script that writes one key in that slot, µs: the
    /// least a change can cost (a write is also sent to the replica). No
    /// target names it; beside `script_us` it says whether writing, not
    /// the round trip, is what a change pays beyond the floor.
    write_script_us: f64,
    /// 1 MiB values, MiB/s.
    set_mibs: f64,
    get_mibs: f64,
    /// Standard deviations over the measurements, in the same order.
    sd: [Option<f64>; 5],
}

impl Floor {
    /// The mean of several measurements, with their deviations.
    fn mean(all: &[Floor]) -> Floor {
        let field = |f: fn(&Floor) -> f64| mean_sd(&all.iter().map(f).collect::<Vec<_>>());
        let (ping_us, a) = field(|f| f.ping_us);
        let (script_us, b) = field(|f| f.script_us);
        let (set_mibs, c) = field(|f| f.set_mibs);
        let (get_mibs, d) = field(|f| f.get_mibs);
        let (write_script_us, e) = field(|f| f.write_script_us);
        Floor {
            ping_us,
            script_us,
            set_mibs,
            get_mibs,
            write_script_us,
            sd: [a, b, c, d, e],
        }
    }

    /// The floor's own figures (no baseline: they are the baseline).
    fn figures(&self) -> Vec<Figure> {
        vec![
            Figure::new("cluster.floor.round_trip", "µs", self.ping_us)
                .stddev(self.sd[0])
                .lower_is_better(),
            Figure::new("cluster.floor.script", "µs", self.script_us)
                .stddev(self.sd[1])
                .lower_is_better(),
            Figure::new("cluster.floor.set_1m", "MiB/s", self.set_mibs).stddev(self.sd[2]),
            Figure::new("cluster.floor.get_1m", "MiB/s", self.get_mibs).stddev(self.sd[3]),
            Figure::new("cluster.floor.write_script", "µs", self.write_script_us)
                .stddev(self.sd[4])
                .lower_is_better(),
        ]
    }
}

/// One measurement of the floor: round trip and script call on the
/// metadata master `master`, SET and GET of 1 MiB on the master of
/// redis-benchmark's key.
fn measure_floor(cluster: &LocalCluster, master: &str, args: &Args) -> anyhow::Result<Floor> {
    check_interrupted()?;
    let n = args.floor_requests.to_string();
    let ping = redis_benchmark(master, &["-n", &n, "PING"])?;
    let sha = load_script(master, TRIVIAL_SCRIPT)?;
    let meta = format!("{{{VOLUME}}}:meta");
    let script = redis_benchmark(master, &["-n", &n, "EVALSHA", &sha, "1", &meta])?;
    let wsha = load_script(master, WRITE_SCRIPT)?;
    let scratch = format!("{{{VOLUME}}}:floor");
    let written = redis_benchmark(master, &["-n", &n, "EVALSHA", &wsha, "1", &scratch]);
    let mut meta_con = memfs_cluster::topology::connect(master, COMMAND_TIMEOUT)?;
    redis::cmd("DEL")
        .arg(&scratch)
        .exec(&mut meta_con)
        .context("DEL of the floor's key")?;
    let written = written?;
    let topology = cluster.topology()?;
    let data = topology
        .master_of_key(BENCH_KEY.as_bytes())
        .context("no master serves redis-benchmark's key")?
        .addr
        .clone();
    let v = args.floor_values.to_string();
    let sets = redis_benchmark(&data, &["-n", &v, "-d", "1048576", "-t", "set,get"])?;
    // Its 1 MiB is not the volume's: leave the master as it was.
    let mut con = memfs_cluster::topology::connect(&data, COMMAND_TIMEOUT)?;
    redis::cmd("DEL")
        .arg(BENCH_KEY)
        .exec(&mut con)
        .context("DEL of redis-benchmark's key")?;
    let rps = |rows: &[(String, f64)], test: &str| -> anyhow::Result<f64> {
        rows.iter()
            .find(|(t, _)| t == test)
            .map(|(_, r)| *r)
            .with_context(|| format!("redis-benchmark printed no {test} result: {rows:?}"))
    };
    // -c 1: one request at a time, so a request's time is 1 / rate; with
    // 1 MiB values, requests per second are MiB per second.
    Ok(Floor {
        ping_us: 1e6 / rps(&ping, "PING")?,
        script_us: 1e6 / script.first().context("no EVALSHA result")?.1,
        write_script_us: 1e6 / written.first().context("no EVALSHA result")?.1,
        set_mibs: rps(&sets, "SET")?,
        get_mibs: rps(&sets, "GET")?,
        sd: [None; 5],
    })
}

/// The floor's script: one read of `KEYS[1]`, the metadata key, so that
/// the call is routed like a volume's scripts.
const TRIVIAL_SCRIPT: &str = "return redis.call('EXISTS', KEYS[1])";
/// The floor's writing script: one `SET` of `KEYS[1]`, a scratch key in
/// the volume's slot (deleted after).
const WRITE_SCRIPT: &str = "return redis.call('SET', KEYS[1], '1')";

/// Loads `script` on `master`; its sha.
fn load_script(master: &str, script: &str) -> anyhow::Result<String> {
    let mut con = memfs_cluster::topology::connect(master, COMMAND_TIMEOUT)?;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(script)
        .query(&mut con)
        .with_context(|| format!("SCRIPT LOAD on {master}"))?;
    Ok(sha)
}

/// Runs `redis-benchmark -h H -p P -c 1 --csv ARGS` against `addr`
/// (`host:port`), bounded by [`FLOOR_TIMEOUT`]; its rows as (test, rps).
fn redis_benchmark(addr: &str, args: &[&str]) -> anyhow::Result<Vec<(String, f64)>> {
    let (host, port) = addr
        .rsplit_once(':')
        .with_context(|| format!("{addr:?} is not host:port"))?;
    let out = tempfile::tempfile().context("cannot create a file for redis-benchmark")?;
    let mut cmd = Command::new("redis-benchmark");
    ChildGuard::group(&mut cmd)
        .args(["-h", host, "-p", port, "-c", "1", "--csv"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out.try_clone()?);
    let mut guard = ChildGuard(Some(cmd.spawn().context("cannot run redis-benchmark")?));
    let deadline = Instant::now() + FLOOR_TIMEOUT;
    // On a timeout or an interrupt the guard, dropped, kills it.
    let status = loop {
        let child = guard.0.as_mut().context("redis-benchmark already reaped")?;
        if let Some(status) = child.try_wait()? {
            guard.0 = None;
            break status;
        }
        check_interrupted()?;
        if Instant::now() >= deadline {
            bail!("redis-benchmark {args:?} on {addr} ran over {FLOOR_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = read_all(out)?;
    let rows = parse_csv(&text);
    if !status.success() || rows.is_empty() || text.contains("Error") {
        bail!("redis-benchmark {args:?} on {addr} failed ({status}): {text}");
    }
    Ok(rows)
}

fn read_all(mut f: std::fs::File) -> anyhow::Result<String> {
    use std::io::{Read, Seek};
    let mut s = String::new();
    f.rewind()?;
    f.read_to_string(&mut s)?;
    Ok(s)
}

/// redis-benchmark's `--csv` rows (`"TEST","RPS",...`) as (test, rps);
/// the header and other lines are skipped.
fn parse_csv(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter_map(|l| {
            let mut cells = l.split(',').map(|c| c.trim().trim_matches('"'));
            let test = cells.next()?.to_string();
            let rps: f64 = cells.next()?.parse().ok()?;
            (rps > 0.0).then_some((test, rps))
        })
        .collect()
}

// ---------------------------------------------------------------------
// Metadata bytes per file.

/// The metadata master's bytes per empty file, and the feed's part.
#[derive(Clone, Copy, Debug)]
struct Bytes {
    per_file: f64,
    feed_per_file: f64,
}

impl Bytes {
    fn figures(&self) -> Vec<Figure> {
        vec![
            Figure::new("cluster.meta.bytes_per_file", "B", self.per_file)
                .lower_is_better()
                .target(Some(200.0)),
            Figure::new("cluster.meta.feed_bytes_per_file", "B", self.feed_per_file)
                .lower_is_better(),
        ]
    }
}

/// Creates `n` empty files in a fresh directory of the volume mounted at
/// `root` and divides the growth of `master`'s `used_memory` by `n` (less
/// the feed's growth). One file is created before the first reading, so
/// that loading the create script is not counted. Removes its files.
fn bytes_per_file(master: &str, root: &Path, n: usize) -> anyhow::Result<Bytes> {
    let dir = root.join("cluster-bytes");
    std::fs::create_dir(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
    let measured: anyhow::Result<Bytes> = (|| {
        let fd = open_dir(&dir)?;
        let name = |i: usize| CString::new(format!("f{i}")).expect("no NUL in generated names");
        bench_metadata::create_files(&fd, &dir, [name(0)], false, None)?;
        let mut con = memfs_cluster::topology::connect(master, COMMAND_TIMEOUT)?;
        let before = (used_memory(&mut con)?, feed_bytes(&mut con)?);
        bench_metadata::create_files(&fd, &dir, (1..=n).map(name), false, None)?;
        let after = (used_memory(&mut con)?, feed_bytes(&mut con)?);
        let feed = after.1 as f64 - before.1 as f64;
        let all = after.0 as f64 - before.0 as f64;
        Ok(Bytes {
            per_file: (all - feed) / n as f64,
            feed_per_file: feed / n as f64,
        })
    })();
    // Only our own directory with our own files in it.
    let removed = std::fs::remove_dir_all(&dir);
    let bytes = measured?;
    removed.with_context(|| format!("cannot remove {}", dir.display()))?;
    Ok(bytes)
}

fn used_memory(con: &mut redis::Connection) -> anyhow::Result<u64> {
    let info: String = redis::cmd("INFO").arg("memory").query(con)?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .context("INFO memory has no used_memory")
}

/// `MEMORY USAGE` of the volume's feed (every entry counted), 0 if absent.
fn feed_bytes(con: &mut redis::Connection) -> anyhow::Result<u64> {
    let n: Option<u64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(format!("{{{VOLUME}}}:feed"))
        .arg("SAMPLES")
        .arg(0)
        .query(con)?;
    Ok(n.unwrap_or(0))
}

fn open_dir(dir: &Path) -> anyhow::Result<OwnedFd> {
    nix::fcntl::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .with_context(|| format!("cannot open directory {}", dir.display()))
}

// ---------------------------------------------------------------------
// The metadata workload.

/// A shape of the metadata workload: threads on each of `mounts` mounts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    threads: usize,
    mounts: usize,
}

/// Every iteration's rates of one shape, on the volume and on the local
/// mount (same files, same threads in all).
struct ShapeRuns {
    shape: Shape,
    volume: Vec<PhaseRates>,
    local: Vec<PhaseRates>,
}

fn shapes(args: &Args) -> Vec<Shape> {
    let mut out = Vec::new();
    for &mounts in &args.mounts {
        for &threads in &args.threads {
            out.push(Shape { threads, mounts });
        }
    }
    out
}

/// Each shape `iterations` times, alternating the local mount and the
/// volume's (so that a burst of load elsewhere hits both).
fn metadata_runs(args: &Args, vols: &[&Target], local: &Target) -> anyhow::Result<Vec<ShapeRuns>> {
    let shapes = shapes(args);
    let bar = progress(
        (shapes.len() * args.iterations) as u64,
        "cluster metadata [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}",
    );
    let mut out = Vec::new();
    for shape in shapes {
        let mut runs = ShapeRuns {
            shape,
            volume: Vec::new(),
            local: Vec::new(),
        };
        bar.set_message(format!(
            "{} thread(s) x {} mount(s)",
            shape.threads, shape.mounts
        ));
        for i in 0..args.iterations {
            check_interrupted()?;
            let all = Workload {
                objects: args.objects,
                threads: shape.threads * shape.mounts,
                shared: false,
                sync: false,
            };
            let on_local = bench_metadata::run_once(local.path(), &all)
                .with_context(|| format!("iteration {} on the local mount", i + 1))?;
            let roots: Vec<&Path> = vols[..shape.mounts].iter().map(|t| t.path()).collect();
            let on_volume = run_on_mounts(&roots, args.objects, shape.threads)
                .with_context(|| format!("iteration {} on the volume", i + 1))?;
            runs.local.push(on_local);
            runs.volume.push(on_volume);
            bar.inc(1);
        }
        out.push(runs);
    }
    bar.finish_and_clear();
    Ok(out)
}

/// The metadata workload on the mounts at `roots` (one volume), `threads`
/// on each, `objects` split across the mounts; the combined rates.
fn run_on_mounts(roots: &[&Path], objects: usize, threads: usize) -> anyhow::Result<PhaseRates> {
    let w = |objects| Workload {
        objects,
        threads,
        shared: false,
        sync: false,
    };
    if let [root] = roots {
        return bench_metadata::run_once(root, &w(objects));
    }
    let m = roots.len();
    let counts: Vec<usize> = (0..m)
        .map(|i| objects / m + usize::from(i < objects % m))
        .collect();
    // A directory of its own for each mount, made through that mount.
    let dirs: Vec<PathBuf> = roots
        .iter()
        .enumerate()
        .map(|(i, r)| r.join(format!("cluster-mount-{i}")))
        .collect();
    for d in &dirs {
        std::fs::create_dir(d).with_context(|| format!("mkdir {}", d.display()))?;
    }
    let start = Barrier::new(m);
    let results: Vec<anyhow::Result<PhaseRates>> = std::thread::scope(|s| {
        let handles: Vec<_> = dirs
            .iter()
            .zip(&counts)
            .map(|(d, &n)| {
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    bench_metadata::run_once(d, &w(n))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a mount's run panicked")))
            })
            .collect()
    });
    for d in &dirs {
        let _ = std::fs::remove_dir(d);
    }
    let rates = results.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    Ok(combine(&counts, &rates))
}

/// The rate of all mounts together in each phase: every file over the
/// slowest mount's time.
fn combine(counts: &[usize], rates: &[PhaseRates]) -> PhaseRates {
    let mut out = [0.0; bench_metadata::PHASES.len()];
    for (p, o) in out.iter_mut().enumerate() {
        // rmdir counts directories, not files.
        let n = |c: usize| if p == 4 { 1.0 } else { c as f64 };
        let slowest = counts
            .iter()
            .zip(rates)
            .map(|(&c, r)| n(c) / r[p].max(1e-9))
            .fold(0.0, f64::max);
        *o = counts.iter().map(|&c| n(c)).sum::<f64>() / slowest.max(1e-9);
    }
    out
}

/// Figures of every shape: rates against the local mount, with the issue's
/// targets; on one thread and one mount also the µs create and unlink cost
/// beyond the local mount's, against one script call.
fn metadata_figures(runs: &[ShapeRuns], floor: &Floor) -> Vec<Figure> {
    let mut out = Vec::new();
    for r in runs {
        let Shape { threads, mounts } = r.shape;
        let prefix = format!("cluster.meta.t{threads}.m{mounts}");
        let single = threads == 1 && mounts == 1;
        for (p, phase) in PHASES.iter().enumerate() {
            let vol: Vec<f64> = r.volume.iter().map(|x| x[p]).collect();
            let local: Vec<f64> = r.local.iter().map(|x| x[p]).collect();
            let ratio = match p {
                0 if single => Some(0.25),
                // Stats and opens of what this mount holds: cached.
                1 | 2 => Some(0.8),
                _ => None,
            };
            out.push(rate_figure(
                &format!("{prefix}.{phase}"),
                &vol,
                &local,
                ratio,
            ));
            if single && (p == 0 || p == 3) {
                out.push(extra_figure(
                    &format!("{prefix}.{phase}"),
                    &vol,
                    &local,
                    floor,
                ));
            }
        }
    }
    out
}

/// A rate on the volume against the local mount's, with a target of
/// `ratio` times the local rate.
fn rate_figure(name: &str, vol: &[f64], local: &[f64], ratio: Option<f64>) -> Figure {
    let (v, vsd) = mean_sd(vol);
    let (l, lsd) = mean_sd(local);
    Figure::new(name, "ops/s", v)
        .stddev(vsd)
        .baseline(LOCAL, l, lsd)
        .target(ratio.map(|x| x * l))
}

/// `NAME.extra_us`: what one operation costs on the volume beyond the local
/// mount (per iteration, paired), against one script call's round trip:
/// the ratio is how many round trips it adds; the target, at most one.
fn extra_figure(name: &str, vol: &[f64], local: &[f64], floor: &Floor) -> Figure {
    let extra: Vec<f64> = vol
        .iter()
        .zip(local)
        .map(|(v, l)| 1e6 / v.max(1e-9) - 1e6 / l.max(1e-9))
        .collect();
    let (e, esd) = mean_sd(&extra);
    Figure::new(format!("{name}.extra_us"), "µs", e)
        .stddev(esd)
        .baseline(SCRIPT_FLOOR, floor.script_us, floor.sd[1])
        .lower_is_better()
        .target(Some(floor.script_us))
}

// ---------------------------------------------------------------------
// mkdir and rename.

/// mkdir and rename rates of every iteration: (volume, local).
type DirRuns = (Vec<[f64; 2]>, Vec<[f64; 2]>);

fn dirs_runs(args: &Args, vol: &Target, local: &Target) -> anyhow::Result<DirRuns> {
    let (mut v, mut l) = (Vec::new(), Vec::new());
    for i in 0..args.iterations {
        check_interrupted()?;
        l.push(
            dirs_once(local.path(), args.dirs)
                .with_context(|| format!("mkdir/rename iteration {} on the local mount", i + 1))?,
        );
        v.push(
            dirs_once(vol.path(), args.dirs)
                .with_context(|| format!("mkdir/rename iteration {} on the volume", i + 1))?,
        );
    }
    Ok((v, l))
}

/// Makes `n` directories in a fresh directory under `root`, renames each
/// (same parent), removes them: the mkdir and rename rates (ops/s).
fn dirs_once(root: &Path, n: usize) -> anyhow::Result<[f64; 2]> {
    let top = root.join("cluster-dirs");
    std::fs::create_dir(&top).with_context(|| format!("mkdir {}", top.display()))?;
    let timed: anyhow::Result<[f64; 2]> = (|| {
        let fd = open_dir(&top)?;
        let name = |p: &str, i: usize| CString::new(format!("{p}{i}")).expect("no NUL");
        let (from, to): (Vec<CString>, Vec<CString>) =
            (0..n).map(|i| (name("d", i), name("r", i))).unzip();
        let mode = Mode::from_bits_truncate(0o755);
        let t0 = Instant::now();
        for d in &from {
            nix::sys::stat::mkdirat(&fd, d.as_c_str(), mode)
                .with_context(|| format!("mkdir {}/{d:?}", top.display()))?;
        }
        let t1 = Instant::now();
        for (a, b) in from.iter().zip(&to) {
            nix::fcntl::renameat(&fd, a.as_c_str(), &fd, b.as_c_str())
                .with_context(|| format!("rename {}/{a:?}", top.display()))?;
        }
        let t2 = Instant::now();
        for d in &to {
            nix::unistd::unlinkat(&fd, d.as_c_str(), UnlinkatFlags::RemoveDir)
                .with_context(|| format!("rmdir {}/{d:?}", top.display()))?;
        }
        let rate = |d: Duration| n as f64 / d.as_secs_f64().max(1e-9);
        Ok([rate(t1 - t0), rate(t2 - t1)])
    })();
    // Only our own directories.
    let removed = std::fs::remove_dir_all(&top);
    let rates = timed?;
    removed.with_context(|| format!("cannot remove {}", top.display()))?;
    Ok(rates)
}

// ---------------------------------------------------------------------
// Calls per operation: counted by the mount, not timed.

const CALL_OPS: [&str; 4] = ["create", "unlink", "mkdir", "rename"];

/// The namespace scripts the volume mount sent, from its own counter
/// (`memfs status M`: "calls: N namespace scripts, ...").
fn scripts_of(mount: &Path) -> anyhow::Result<u64> {
    let exe = std::env::current_exe().context("cannot find the memfs executable")?;
    let out = Command::new(exe)
        .arg("status")
        .arg(mount)
        .stderr(Stdio::inherit())
        .output()
        .context("memfs status")?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("calls:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no call count in memfs status {}:\n{text}", mount.display()))
}

/// Namespace scripts per create (with its close), unlink, mkdir and
/// rename of `n` names each, in a directory the mount made: what the
/// kernel's calls cost beyond the local engine (which sends none).
/// Deterministic on one thread: it is a count.
fn calls_per_op(vol: &Target, n: usize) -> anyhow::Result<[f64; 4]> {
    let top = vol.path().join("cluster-calls");
    std::fs::create_dir(&top).with_context(|| format!("mkdir {}", top.display()))?;
    let counted: anyhow::Result<[f64; 4]> = (|| {
        let p = |k: &str, i: usize| top.join(format!("{k}{i}"));
        let mut out = [0.0; 4];
        let ops: [&dyn Fn(usize) -> std::io::Result<()>; 4] = [
            &|i| std::fs::File::create_new(p("f", i)).map(drop),
            &|i| std::fs::remove_file(p("f", i)),
            &|i| std::fs::create_dir(p("d", i)),
            &|i| std::fs::rename(p("d", i), p("r", i)),
        ];
        for (o, op) in ops.iter().enumerate() {
            let before = scripts_of(vol.path())?;
            for i in 0..n {
                op(i).with_context(|| format!("{} {i} in {}", CALL_OPS[o], top.display()))?;
            }
            let sent = scripts_of(vol.path())?.saturating_sub(before);
            out[o] = sent as f64 / n.max(1) as f64;
        }
        Ok(out)
    })();
    let removed = std::fs::remove_dir_all(&top);
    let calls = counted?;
    removed.with_context(|| format!("cannot remove {}", top.display()))?;
    Ok(calls)
}

/// `cluster.calls.OP`: namespace scripts per operation; the issue's target
/// is one beyond the local mount, which sends none.
fn calls_figures(calls: &[f64; 4]) -> Vec<Figure> {
    CALL_OPS
        .iter()
        .zip(calls)
        .map(|(op, &c)| {
            Figure::new(format!("cluster.calls.{op}"), "scripts/op", c)
                .lower_is_better()
                .target(Some(1.0))
        })
        .collect()
}

fn dirs_figures(runs: &DirRuns, floor: &Floor) -> Vec<Figure> {
    let mut out = Vec::new();
    for (p, op) in ["mkdir", "rename"].iter().enumerate() {
        let vol: Vec<f64> = runs.0.iter().map(|x| x[p]).collect();
        let local: Vec<f64> = runs.1.iter().map(|x| x[p]).collect();
        let name = format!("cluster.meta.t1.m1.{op}");
        out.push(rate_figure(&name, &vol, &local, None));
        out.push(extra_figure(&name, &vol, &local, floor));
    }
    out
}

// ---------------------------------------------------------------------
// fio.

/// fio's jobs on the volume and the local mount, and the uncached 1 MiB
/// jobs on a volume mount with a small cache.
struct FioRuns {
    jobs: Vec<FioJob>,
    volume: Vec<FioResult>,
    local: Vec<FioResult>,
    /// Random 1 MiB direct reads, then writes, on the small-cache mount.
    uncached: [FioResult; 2],
}

/// The 1 MiB job that reads only (`randread`: fio lays the file out
/// first, so on a volume its blocks are in this mount's cache), or
/// writes only (`randwrite`), tagged `tag`.
fn one_way(
    args: &Args,
    size: u64,
    direct: bool,
    rw: &'static str,
    tag: &str,
) -> anyhow::Result<FioJob> {
    let mut job = FioJob::new("1m", size, args.fio_runtime, direct, false)?;
    job.rw = rw;
    job.tag = Some(tag.into());
    Ok(job)
}

fn fio_runs(
    args: &Args,
    vol: &Target,
    local: &Target,
    volume_args: &[String],
) -> anyhow::Result<FioRuns> {
    let size = bench_fio::parse_bytes(&args.fio_size)?;
    let mut jobs = Vec::new();
    for bs in ["4k", "1m"] {
        for direct in [true, false] {
            jobs.push(FioJob::new(bs, size, args.fio_runtime, direct, false)?);
        }
    }
    // Reads of cached data alone: in the randrw jobs a job's reads and
    // writes complete in step, so their reads are bound by the write path.
    for direct in [true, false] {
        jobs.push(one_way(args, size, direct, "randread", "cached")?);
    }
    let mut all = bench_fio::measure(&args.fio, &[vol, local], &jobs)?;
    let local = all.pop().context("fio measured no local mount")?;
    let volume = all.pop().context("fio measured no volume")?;
    let mut small = volume_args.to_vec();
    small.extend(["--cache-size".to_string(), args.uncached_cache_size.clone()]);
    let mount = MemfsMount::new(&small).context("the volume's mount with a small cache")?;
    let mut uncached = [FioResult::default(); 2];
    for (i, rw) in ["randread", "randwrite"].into_iter().enumerate() {
        let job = one_way(args, size, true, rw, "uncached")?;
        uncached[i] = bench_fio::run_fio(&args.fio, &job, mount.path(), || {})
            .with_context(|| format!("fio 1m direct {rw} on the small-cache mount"))?;
    }
    Ok(FioRuns {
        jobs,
        volume,
        local,
        uncached,
    })
}

impl FioRuns {
    /// The fio benchmark's figures, named `cluster.fio...`, against the
    /// local mount (1 MiB reads of cached data: 0.8x); the uncached 1 MiB
    /// reads and writes against the GET / SET floor (0.5x), each measured
    /// alone as the floor is.
    fn figures(&self, floor: &Floor) -> Vec<Figure> {
        let mut out = bench_fio::figures(&self.jobs, &self.volume, Some((LOCAL, &self.local)));
        for f in &mut out {
            f.figure = format!("cluster.{}", f.figure);
            if f.figure.starts_with("cluster.fio.1m.") && f.figure.ends_with(".cached.read") {
                let target = f.baseline.map(|b| 0.8 * b);
                *f = f.clone().target(target);
            }
        }
        let [read, write] = &self.uncached;
        for (way, bw, base, name, sd) in [
            ("read", read.read_bw, floor.get_mibs, GET_FLOOR, floor.sd[3]),
            (
                "write",
                write.write_bw,
                floor.set_mibs,
                SET_FLOOR,
                floor.sd[2],
            ),
        ] {
            out.push(
                Figure::new(
                    format!("cluster.fio.1m.direct.uncached.{way}"),
                    "MiB/s",
                    bw / MIB,
                )
                .baseline(name, base, sd)
                .target(Some(0.5 * base)),
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_redis_benchmark_csv() {
        let out = "\"test\",\"rps\",\"avg_latency_ms\"\n\
                   \"PING\",\"13262.60\",\"0.070\"\n\
                   \"EVALSHA e0e1 1 {bench}:meta\",\"12338.06\",\"0.076\"\n";
        let rows = parse_csv(out);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0], ("PING".to_string(), 13262.60));
        assert_eq!(rows[1].0, "EVALSHA e0e1 1 {bench}:meta");
        assert!(parse_csv("Error from server: MOVED 1 127.0.0.1:1\n").is_empty());
    }

    #[test]
    fn cluster_spec_names_every_node_once() {
        let urls = [
            "redis://127.0.0.1:7000".to_string(),
            "127.0.0.1:7001".into(),
        ];
        assert_eq!(cluster_spec(&urls), "redis://127.0.0.1:7000,127.0.0.1:7001");
        let seeds = memfs_cluster::topology::seeds(&cluster_spec(&urls)).unwrap();
        assert_eq!(seeds.len(), 2);
    }

    #[test]
    fn two_mounts_combine_over_the_slower() {
        // 100 files at 100/s (1 s) and 300 at 100/s (3 s): 400 files in 3 s.
        let r = combine(&[100, 300], &[[100.0; 5], [100.0; 5]]);
        assert!((r[0] - 400.0 / 3.0).abs() < 1e-9, "{r:?}");
        // rmdir: one directory each.
        assert!((r[4] - 200.0).abs() < 1e-9, "{r:?}");
    }

    #[test]
    fn figures_carry_the_issue_targets() {
        let floor = Floor {
            ping_us: 50.0,
            script_us: 80.0,
            write_script_us: 110.0,
            set_mibs: 2000.0,
            get_mibs: 1800.0,
            sd: [None; 5],
        };
        let runs = [ShapeRuns {
            shape: Shape {
                threads: 1,
                mounts: 1,
            },
            volume: vec![[2500.0, 40_000.0, 90_000.0, 5000.0, 1.0]],
            local: vec![[10_000.0, 50_000.0, 100_000.0, 10_000.0, 1.0]],
        }];
        let f = metadata_figures(&runs, &floor);
        let names: Vec<&str> = f.iter().map(|f| f.figure.as_str()).collect();
        assert_eq!(
            names,
            [
                "cluster.meta.t1.m1.create",
                "cluster.meta.t1.m1.create.extra_us",
                "cluster.meta.t1.m1.open",
                "cluster.meta.t1.m1.stat",
                "cluster.meta.t1.m1.unlink",
                "cluster.meta.t1.m1.unlink.extra_us",
            ]
        );
        // 0.25x of 10,000 creates/s: met by 2,500.
        assert_eq!((f[0].target, f[0].met), (Some(2500.0), Some(true)));
        // 400 µs - 100 µs = 300 µs beyond local: more than one 80 µs call.
        assert!((f[1].value - 300.0).abs() < 1e-9);
        assert_eq!((f[1].target, f[1].met), (Some(80.0), Some(false)));
        assert_eq!(f[2].target, Some(40_000.0));
        assert_eq!(f[3].met, Some(true));
        assert_eq!(f[4].target, None);
        let b = Bytes {
            per_file: 150.0,
            feed_per_file: 40.0,
        }
        .figures();
        assert_eq!(b[0].met, Some(true));
        assert!(b[1].target.is_none());
    }

    #[test]
    fn short_sizes_and_bad_arguments() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            a: Args,
        }
        let a = Cli::parse_from(["x", "--short"]).a.sized();
        assert_eq!((a.iterations, a.objects, a.fio_runtime), (1, 400, 1));
        a.validate().unwrap();
        for bad in [
            &["x", "--mounts", "3"][..],
            &["x", "--threads", "0"],
            &["x", "--objects", "4"],
            &["x", "--iterations", "0"],
            &["x", "--fio-size", "lots"],
        ] {
            assert!(Cli::parse_from(bad).a.validate().is_err(), "{bad:?}");
        }
    }
}
