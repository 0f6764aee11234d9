//! `memfs bench store-server`: the store server against Redis on loopback.
//!
//! - remote get, 8-byte keys, 64 connections with 16 requests pipelined on
//!   each (8 threads each driving 8 connections), against
//!   `redis-benchmark -t get -P 16 -c 64`; plain TCP, then TLS;
//! - multi_get of 1,000 keys on one connection: p99 latency against `MGET` of
//!   1,000 keys (`redis-benchmark -c 1 MGET ...`);
//! - follower lag while a writer applies the standard block (10,000 inserts
//!   and 9,000 deletes) as fast as it can.
//!
//! Redis is started on a free loopback port and stopped after
//! (`redis-server` and `redis-benchmark` from Debian's packages).

use anyhow::{Context, Result, bail};
use memfs_store::net::client::{Client, ClientConfig};
use memfs_store::net::follower::{self, FollowerConfig, Progress};
use memfs_store::net::protocol::Role;
use memfs_store::net::server::{Server, ServerConfig, ShutdownHandle};
use memfs_store::{Durability, Store, StoreOptions};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Keys in the store (and in Redis).
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Seconds per get run.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// multi_get calls for the latency figure.
    #[arg(long, default_value_t = 1000)]
    mget_calls: usize,
    /// Blocks of the follower-lag run (and of the writer-alone run before it).
    #[arg(long, default_value_t = 300)]
    blocks: u64,
    /// Skip the Redis baseline.
    #[arg(long)]
    no_redis: bool,
    /// Only the follower-lag run.
    #[arg(long)]
    lag_only: bool,
    /// Threads the follower applies a block with. 2 by default: since events
    /// are published at the writer's journal commit, two kept the lag lower
    /// than one in most idle runs on two shared cores (docs/store.md).
    #[arg(long, default_value_t = 2)]
    follower_threads: usize,
    /// Durability of the follower's replica (the writer's is `async`).
    #[arg(long, default_value = "async")]
    follower_durability: Durability,
    /// Record when each event passes each stage (server, subscription,
    /// follower; `memfs_store::stages`) in the run with a follower, and
    /// print where the time went.
    #[arg(long)]
    stages: bool,
    /// Serve the lag runs with `--max-follower-lag K`: the writer's `set`
    /// returns only once the follower has applied the event K before it
    /// (bounded lag; the writer waits when the follower falls behind).
    #[arg(long, value_name = "K")]
    max_follower_lag: Option<u64>,
}

/// Whether `prog` can be run (`prog --version`).
fn have(prog: &str) -> bool {
    Command::new(prog)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

struct Served {
    addr: String,
    handle: ShutdownHandle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Served {
    fn start(dir: &Path, tls: Option<(&Path, &Path)>, max_lag: Option<u64>) -> Result<Served> {
        let store = Store::open(dir)?;
        let mut cfg = ServerConfig {
            max_follower_lag: max_lag,
            ..Default::default()
        };
        if let Some((c, k)) = tls {
            cfg.tls = Some(memfs_store::net::server_tls(c, k)?);
        }
        let srv = Server::bind(store, "127.0.0.1:0", cfg)?;
        let addr = srv.local_addr().to_string();
        let handle = srv.handle();
        let thread = Some(std::thread::spawn(move || {
            if let Err(e) = srv.run() {
                eprintln!("server: {e}");
            }
        }));
        Ok(Served {
            addr,
            handle,
            thread,
        })
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.handle.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A child process killed and reaped on drop.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

fn fill(dir: &Path, keys: u64) -> Result<()> {
    let s = Store::create(
        dir,
        StoreOptions {
            key_width: 8,
            durability: Durability::None,
            capacity_per_shard: (keys as usize / 16).max(1024) * 2,
            ..Default::default()
        },
    )?;
    let mut b = 1;
    let mut i = 0;
    while i < keys {
        let ops: Vec<([u8; 8], [u8; 8])> = (i..keys.min(i + 10_000))
            .map(|k| (k.to_le_bytes(), (k * 3).to_le_bytes()))
            .collect();
        s.set(b, &ops)?;
        b += 1;
        i += 10_000;
    }
    s.close()?;
    Ok(())
}

/// Gets per second: 64 connections, 16 pipelined each, 8 threads.
fn get_rate(addr: &str, tls_ca: Option<&Path>, keys: u64, secs: f64) -> Result<f64> {
    let mut cfg = ClientConfig::new(addr, Role::Read);
    if let Some(ca) = tls_ca {
        cfg.tls = Some(memfs_store::net::client_tls(ca)?);
        cfg.server_name = Some("localhost".into());
    }
    let total = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for t in 0..8u64 {
        let conns: Vec<Client> = (0..8)
            .map(|_| Client::connect(cfg.clone()))
            .collect::<Result<_, _>>()?;
        let (total, stop) = (total.clone(), stop.clone());
        threads.push(std::thread::spawn(move || -> Result<()> {
            let mut conns = conns;
            let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (t + 1);
            let mut v = Vec::with_capacity(64);
            let mut n = 0u64;
            while !stop.load(Relaxed) {
                for c in conns.iter_mut() {
                    for _ in 0..16 {
                        c.queue_get(&(xorshift(&mut rng) % keys).to_le_bytes())?;
                    }
                    c.flush()?;
                }
                for c in conns.iter_mut() {
                    for _ in 0..16 {
                        if !c.recv_value(&mut v)? {
                            bail!("a key is missing");
                        }
                    }
                }
                n += 8 * 16;
            }
            total.fetch_add(n, Relaxed);
            Ok(())
        }));
    }
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Relaxed);
    for t in threads {
        t.join()
            .map_err(|_| anyhow::anyhow!("client thread panicked"))??;
    }
    Ok(total.load(Relaxed) as f64 / t0.elapsed().as_secs_f64())
}

fn mget_p99(addr: &str, keys: u64, calls: usize) -> Result<(f64, f64)> {
    let mut c = Client::connect(ClientConfig::new(addr, Role::Read))?;
    let mut rng = 12345u64;
    let mut lat = Vec::with_capacity(calls);
    let mut ks: Vec<[u8; 8]> = Vec::with_capacity(1000);
    for _ in 0..calls {
        ks.clear();
        ks.extend((0..1000).map(|_| (xorshift(&mut rng) % keys).to_le_bytes()));
        let t0 = Instant::now();
        let mut found = 0;
        c.multi_get_with(&ks, |_, v| found += v.is_some() as usize)?;
        lat.push(t0.elapsed().as_secs_f64() * 1e3);
        if found != 1000 {
            bail!("multi_get found {found} of 1000 keys");
        }
    }
    lat.sort_by(f64::total_cmp);
    Ok((lat[lat.len() / 2], lat[(lat.len() * 99).div_ceil(100) - 1]))
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Runs redis-benchmark; returns [requests/s, avg, min, p50, p95, p99, max]
/// (latencies in ms) from its summary (custom commands such as MGET ignore
/// `--csv`, so the summary text is parsed).
fn redis_csv(args: &[String]) -> Result<Vec<f64>> {
    let out = Command::new("redis-benchmark")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("redis-benchmark (apt-get install redis-tools)")?;
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "\n");
    let rps = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("throughput summary:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse::<f64>().ok())
        .with_context(|| format!("no throughput in redis-benchmark's output: {text}"))?;
    let mut lines = text
        .lines()
        .skip_while(|l| !l.contains("avg") || !l.contains("p99"));
    lines.next();
    let lat: Vec<f64> = lines
        .next()
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect();
    if lat.len() != 6 {
        bail!("no latency summary in redis-benchmark's output: {text}");
    }
    Ok(std::iter::once(rps).chain(lat).collect())
}

fn self_signed(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let st = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-addext",
            "basicConstraints=critical,CA:FALSE",
            "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("openssl")?;
    if !st.success() {
        bail!("openssl could not make a certificate");
    }
    Ok((cert, key))
}

/// One run of the standard block workload against a served writer.
struct Lag {
    /// Blocks written.
    blocks: u64,
    blocks_per_sec: f64,
    /// Lag samples, one per block (empty without a follower): the writer's
    /// last committed event (its `set` reply) minus the follower's last
    /// applied event, read right after the writer's `set` returned.
    samples: Vec<u64>,
    /// Milliseconds per block: the writer's `set` round trip, the
    /// follower's apply, the follower's wait for a frame.
    writer_ms: f64,
    apply_ms: f64,
    idle_ms: f64,
    /// With a follower-lag bound: writes that waited for the follower, the
    /// mean wait per block in ms, and waits that ran out.
    waits: u64,
    wait_ms: f64,
    timeouts: u64,
}

impl Lag {
    fn mean(&self) -> f64 {
        self.samples.iter().sum::<u64>() as f64 / self.samples.len().max(1) as f64
    }

    /// The `q` quantile of the samples (nearest rank).
    fn quantile(&self, q: f64) -> u64 {
        let mut v = self.samples.clone();
        v.sort_unstable();
        let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len().max(1)) - 1;
        v.get(i).copied().unwrap_or(0)
    }

    fn within_one(&self) -> f64 {
        self.samples.iter().filter(|&&l| l <= 1).count() as f64 / self.samples.len().max(1) as f64
    }
}

/// The writer applies `blocks` standard blocks (10,000 inserts of new keys,
/// 9,000 deletes of the oldest live keys) through the server as fast as it
/// can, with a follower subscribed (`follow`) or alone (the writer's own
/// rate, the baseline for what a follower costs it).
fn follower_lag(tmp: &Path, name: &str, a: &Args, follow: bool) -> Result<Lag> {
    let (blocks, threads, follower_durability, max_lag) = (
        a.blocks,
        a.follower_threads,
        a.follower_durability,
        a.max_follower_lag,
    );
    let wdir = tmp.join(format!("{name}-writer"));
    let fdir = tmp.join(format!("{name}-replica"));
    create_writer_store(&wdir)?;
    let srv = Served::start(&wdir, None, max_lag)?;
    let stop = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(Progress::default());
    let f = if follow {
        let cfg = FollowerConfig {
            client: ClientConfig::new(srv.addr.clone(), Role::Follow),
            dir: fdir,
            durability: follower_durability,
            threads,
            max_backoff: Duration::from_millis(200),
            on_caught_up: None,
        };
        let (s, p) = (stop.clone(), progress.clone());
        Some(std::thread::spawn(move || follower::follow(cfg, &s, &p)))
    } else {
        None
    };
    if follow && max_lag.is_some() {
        // Bounded lag holds from the first block only once the writer knows
        // the follower.
        first_report(&progress)?;
    }
    let mut w = Client::connect(ClientConfig::new(srv.addr.clone(), Role::Write))?;
    let stages = a.stages && follow;
    if stages {
        memfs_store::stages::enable();
    }
    let written = write_blocks(&mut w, blocks, &progress, follow, stages)?;
    let last = w.status()?.last_seq;
    if let Some(f) = f {
        catch_up(f, &progress, &stop, last)?;
    }
    if stages {
        print!(
            "{}",
            memfs_store::stages::report(&memfs_store::stages::take())
        );
    }
    let c = srv.handle.counters();
    Ok(Lag {
        waits: c.follower_waits.load(Relaxed),
        wait_ms: c.follower_wait_nanos.load(Relaxed) as f64 / 1e6 / blocks as f64,
        timeouts: c.follower_timeouts.load(Relaxed),
        blocks,
        blocks_per_sec: blocks as f64 / written.elapsed,
        samples: written.samples,
        writer_ms: written.set_time.as_secs_f64() * 1e3 / blocks as f64,
        apply_ms: progress.apply_nanos.load(Relaxed) as f64 / 1e6 / blocks as f64,
        idle_ms: progress.idle_nanos.load(Relaxed) as f64 / 1e6 / blocks as f64,
    })
}

/// The writer's store: empty, 8-byte keys, `async` durability.
fn create_writer_store(wdir: &Path) -> Result<()> {
    Store::create(
        wdir,
        StoreOptions {
            key_width: 8,
            durability: "async"
                .parse::<Durability>()
                .map_err(|e| anyhow::anyhow!(e))?,
            ..Default::default()
        },
    )?
    .close()?;
    Ok(())
}

/// Waits (up to 30 s) for the follower's first position report.
fn first_report(progress: &Progress) -> Result<()> {
    let t1 = Instant::now();
    while progress.reports.load(Relaxed) == 0 {
        if t1.elapsed() > Duration::from_secs(30) {
            bail!("the follower did not report its position within 30 s");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// Waits (up to 60 s) for the follower to apply event `last`, then stops it.
fn catch_up(
    f: std::thread::JoinHandle<Result<(), follower::FollowError>>,
    progress: &Progress,
    stop: &AtomicBool,
    last: u64,
) -> Result<()> {
    let t1 = Instant::now();
    while progress.seq.load(Relaxed) < last && t1.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, Relaxed);
    f.join()
        .map_err(|_| anyhow::anyhow!("follower panicked"))??;
    if progress.seq.load(Relaxed) != last {
        bail!(
            "the follower reached event {} of {last} within 60 s of the writer's end",
            progress.seq.load(Relaxed)
        );
    }
    Ok(())
}

/// What the writer measured over its blocks.
struct Written {
    /// The lag after each block (empty without a follower).
    samples: Vec<u64>,
    /// The time spent in `set`.
    set_time: Duration,
    /// Seconds for all the blocks.
    elapsed: f64,
}

/// The timed run: `blocks` standard blocks through `w`, each followed by a
/// lag sample if a follower (`follow`) reports to `progress`.
fn write_blocks(
    w: &mut Client,
    blocks: u64,
    progress: &Progress,
    follow: bool,
    stages: bool,
) -> Result<Written> {
    let mut next = 0u64;
    let mut live: std::collections::VecDeque<u64> = Default::default();
    let mut samples = Vec::with_capacity(blocks as usize);
    let mut set_time = Duration::ZERO;
    let mut ops: Vec<([u8; 8], &[u8])> = Vec::with_capacity(19_000);
    let t0 = Instant::now();
    for b in 1..=blocks {
        ops.clear();
        for _ in 0..10_000 {
            ops.push((next.to_le_bytes(), &[1u8; 8]));
            live.push_back(next);
            next += 1;
        }
        for _ in 0..9_000.min(live.len().saturating_sub(10_000)) {
            let k = live.pop_front().expect("non-empty");
            ops.push((k.to_le_bytes(), &[]));
        }
        let t_set = Instant::now();
        let seq = w.set(b, &ops)?;
        set_time += t_set.elapsed();
        if stages {
            use memfs_store::stages::{Stage, mark, mark_at};
            mark_at(seq, Stage::ClientSend, t_set);
            mark(seq, Stage::ClientDone);
        }
        if follow {
            samples.push(seq.saturating_sub(progress.seq.load(Relaxed)));
        }
    }
    let elapsed = t0.elapsed().as_secs_f64();
    Ok(Written {
        samples,
        set_time,
        elapsed,
    })
}

fn print_lag(a: &Args, tmp: &Path) -> Result<()> {
    // The writer alone first, then with a follower, in fresh directories.
    let alone = follower_lag(tmp, "alone", a, false)?;
    let l = follower_lag(tmp, "lag", a, true)?;
    if let Some(k) = a.max_follower_lag {
        println!(
            "served with --max-follower-lag {k}: {} of {} writes waited for the follower ({:.2} ms per block on average), {} waits ran out",
            l.waits, l.blocks, l.wait_ms, l.timeouts
        );
    }
    println!(
        "writer alone, 10k inserts + 9k deletes per block: {:.1} blocks/s ({:.2} ms per set)",
        alone.blocks_per_sec, alone.writer_ms
    );
    println!(
        "follower lag over {} blocks at {:.1} blocks/s ({:.2}x the writer alone): mean {:.2}, p99 {}, max {} blocks; {:.0} % of samples within 1",
        l.blocks,
        l.blocks_per_sec,
        l.blocks_per_sec / alone.blocks_per_sec,
        l.mean(),
        l.quantile(0.99),
        l.quantile(1.0),
        l.within_one() * 100.0
    );
    println!(
        "  per block: writer set round trip {:.2} ms; follower apply {:.2} ms, idle {:.2} ms (waiting for the next frame)",
        l.writer_ms, l.apply_ms, l.idle_ms
    );
    Ok(())
}

pub fn run(a: Args) -> Result<()> {
    let tmp = tempfile::tempdir()?;
    if a.lag_only {
        return print_lag(&a, tmp.path());
    }
    let dir = tmp.path().join("store");
    fill(&dir, a.keys)?;
    println!(
        "store-server benchmark: {} keys, 8-byte keys and values",
        a.keys
    );

    let redis = start_redis(&a)?;
    let plain = Served::start(&dir, None, None)?;
    let ours = get_rate(&plain.addr, None, a.keys, a.seconds)?;
    println!("memfs get, 64 conns x 16 pipelined:      {ours:>12.0} /s");
    let (m50, m99) = mget_p99(&plain.addr, a.keys, a.mget_calls)?;
    println!("memfs multi_get 1000 keys:               p50 {m50:.3} ms, p99 {m99:.3} ms");
    drop(plain);
    let (cert, key) = self_signed(tmp.path())?;
    let tls = Served::start(&dir, Some((&cert, &key)), None)?;
    let ours_tls = get_rate(&tls.addr, Some(&cert), a.keys, a.seconds)?;
    drop(tls);
    println!(
        "memfs get over TLS:                      {:>12.0} /s ({:.2}x plain)",
        ours_tls,
        ours_tls / ours
    );
    if let Some((_g, p)) = &redis {
        redis_baseline(&a, p, ours, m99)?;
    }
    print_lag(&a, tmp.path())
}

/// Redis on a free loopback port, filled with `--keys` keys, and its port;
/// `None` if skipped (`--no-redis`, or not installed: said so).
fn start_redis(a: &Args) -> Result<Option<(ChildGuard, String)>> {
    let mut redis = None;
    let redis_missing = [
        ("redis-server", "redis-server"),
        ("redis-benchmark", "redis-tools"),
    ]
    .into_iter()
    .filter(|(prog, _)| !have(prog))
    .map(|(_, pkg)| pkg)
    .collect::<Vec<_>>();
    if !a.no_redis && !redis_missing.is_empty() {
        println!(
            "Redis baseline skipped: apt-get install {} (scripts/setup installs them)",
            redis_missing.join(" ")
        );
    }
    if !a.no_redis && redis_missing.is_empty() {
        let port = free_port()?;
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .spawn()
            .context("redis-server (apt-get install redis-server)")?;
        let g = ChildGuard(child);
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if t0.elapsed() > Duration::from_secs(10) {
                bail!("redis-server did not start");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let p = port.to_string();
        let fill_n = (a.keys * 3).to_string();
        let r = a.keys.to_string();
        redis_csv(&[
            "-p".into(),
            p.clone(),
            "-t".into(),
            "set".into(),
            "-n".into(),
            fill_n,
            "-r".into(),
            r,
            "-P".into(),
            "64".into(),
        ])?;
        redis = Some((g, p));
    }
    Ok(redis)
}

/// Redis's get rate and MGET latency on port `p`, beside memfs's (`ours`
/// gets a second, `m99` the multi_get p99).
fn redis_baseline(a: &Args, p: &str, ours: f64, m99: f64) -> Result<()> {
    let n = ((ours * a.seconds) as u64).max(100_000).to_string();
    let g = redis_csv(&[
        "-p".into(),
        p.to_string(),
        "-t".into(),
        "get".into(),
        "-P".into(),
        "16".into(),
        "-c".into(),
        "64".into(),
        "-n".into(),
        n,
        "-r".into(),
        a.keys.to_string(),
    ])?;
    let mut mget: Vec<String> = vec![
        "-p".into(),
        p.to_string(),
        "-c".into(),
        "1".into(),
        "-n".into(),
        a.mget_calls.to_string(),
        "MGET".into(),
    ];
    let mut rng = 12345u64;
    mget.extend((0..1000).map(|_| format!("key:{:012}", xorshift(&mut rng) % a.keys)));
    let m = redis_csv(&mget)?;
    println!(
        "redis get (redis-benchmark -P 16 -c 64): {:>12.0} /s -> memfs {:.2}x",
        g[0],
        ours / g[0]
    );
    println!(
        "redis MGET 1000 keys:                    p50 {:.3} ms, p99 {:.3} ms -> memfs p99 {:.2}x",
        m[3],
        m[5],
        m99 / m[5]
    );
    Ok(())
}
