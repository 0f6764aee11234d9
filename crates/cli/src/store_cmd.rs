//! `memfs store ...`: operate on a block store directory.
//!
//! Keys and values are given in hex (`0x` prefix optional) unless `--text`
//! is passed, in which case they are taken as UTF-8 bytes. Keys must have the
//! store's exact width.

use anyhow::{Context, Result, bail};
use memfs_store::net::client::{Client, ClientConfig};
use memfs_store::net::protocol::{Limits, Role};
use memfs_store::net::{auth::Auth, follower, server};
use memfs_store::{Durability, Store, StoreOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Debug)]
struct DirArg {
    /// The store's data directory.
    #[arg(long, short = 'd')]
    dir: PathBuf,
}

/// Where a command operates: a local directory or a server.
#[derive(clap::Args, Debug)]
struct Target {
    /// The store's data directory.
    #[arg(long, short = 'd', conflicts_with = "remote")]
    dir: Option<PathBuf>,
    /// A `memfs store serve` server, HOST:PORT.
    #[arg(long)]
    remote: Option<String>,
    #[command(flatten)]
    conn: RemoteOpts,
}

#[derive(clap::Args, Debug, Clone)]
struct RemoteOpts {
    /// User name for the server's --auth file.
    #[arg(long, default_value = "")]
    user: String,
    /// Token for the server's --auth file.
    #[arg(long, default_value = "")]
    token: String,
    /// Speak TLS, trusting the certificate(s) in this PEM file.
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// Name to check the server's certificate against (default: the host of the address).
    #[arg(long)]
    server_name: Option<String>,
}

impl RemoteOpts {
    fn config(&self, addr: &str, role: Role) -> Result<ClientConfig> {
        let mut c = ClientConfig::new(addr, role);
        c.user = self.user.clone();
        c.token = self.token.clone();
        c.server_name = self.server_name.clone();
        if let Some(ca) = &self.tls_ca {
            c.tls = Some(memfs_store::net::client_tls(ca)?);
        }
        Ok(c)
    }
}

enum Place {
    Dir(PathBuf),
    Remote(Client),
}

impl Target {
    fn open(&self, role: Role) -> Result<Place> {
        match (&self.dir, &self.remote) {
            (Some(d), None) => Ok(Place::Dir(d.clone())),
            (None, Some(a)) => {
                let c = Client::connect(self.conn.config(a, role)?)
                    .with_context(|| format!("store server {a}"))?;
                Ok(Place::Remote(c))
            }
            _ => bail!("give either --dir DIR or --remote HOST:PORT"),
        }
    }
}

#[derive(clap::Subcommand, Debug)]
enum Cmd {
    /// Create a new store.
    Create(CreateArgs),
    /// Recover the store and print its state, layout and metrics.
    Info {
        #[command(flatten)]
        dir: DirArg,
    },
    /// Print the values of keys.
    Get {
        #[command(flatten)]
        target: Target,
        /// Keys and values as UTF-8 text instead of hex.
        #[arg(long)]
        text: bool,
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// Apply one block of KEY=VALUE operations (an empty VALUE deletes).
    Set {
        #[command(flatten)]
        target: Target,
        /// Block id (default: current block + 1).
        #[arg(long)]
        block: Option<u64>,
        #[arg(long)]
        text: bool,
        #[arg(required = true)]
        ops: Vec<String>,
    },
    /// Restore the state after block TO (inside the rollback window).
    Rollback {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        to: u64,
    },
    /// Serve the store over TCP (TLS with --tls-cert/--tls-key) until SIGTERM.
    Serve(ServeArgs),
    /// Keep a replica of a served store in DIR up to date (until SIGTERM).
    Follow(FollowArgs),
    /// Write a snapshot now (and prune the journal behind it).
    Snapshot {
        #[command(flatten)]
        dir: DirArg,
    },
    /// Check every checksum and that journal and snapshot agree.
    Verify {
        #[command(flatten)]
        dir: DirArg,
        /// Truncate a damaged journal to its last intact commit.
        #[arg(long)]
        repair: bool,
    },
}

#[derive(clap::Args, Debug)]
struct CreateArgs {
    #[command(flatten)]
    dir: DirArg,
    /// Fixed key width in bytes (8 to 64).
    #[arg(long, default_value_t = 8)]
    key_width: usize,
    #[arg(long, default_value_t = 16)]
    shards: usize,
    /// Initial capacity of each shard (entries).
    #[arg(long, default_value_t = 1024)]
    capacity: usize,
    /// Threads applying a block.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// none | sync | relaxed[=N] | async[=N] | async-relaxed[=N]
    #[arg(long, default_value = "sync")]
    durability: String,
    /// Snapshot every N blocks (0 = only on request).
    #[arg(long, default_value_t = 1000)]
    snapshot_interval: u64,
    /// How many recent blocks can be rolled back.
    #[arg(long, default_value_t = 100)]
    rollback_window: u64,
}

#[derive(clap::Args, Debug)]
struct ServeArgs {
    #[command(flatten)]
    dir: DirArg,
    /// HOST:PORT to listen on (port 0: any free port, printed at start).
    #[arg(long)]
    listen: String,
    /// Certificate chain (PEM).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// Private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Allow plain TCP on a non-loopback address.
    #[arg(long, conflicts_with = "tls_cert")]
    insecure: bool,
    /// Credentials: a file of USER:TOKEN:ROLE lines, or such entries separated by commas.
    #[arg(long)]
    auth: Option<String>,
    /// Serve /metrics (Prometheus text) and /health over HTTP on HOST:PORT.
    #[arg(long)]
    metrics: Option<String>,
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Largest frame in bytes.
    #[arg(long, default_value_t = memfs_store::net::protocol::DEFAULT_MAX_FRAME)]
    max_frame: u32,
    /// Most keys in a multi_get or operations in a block.
    #[arg(long, default_value_t = memfs_store::net::protocol::DEFAULT_MAX_BATCH)]
    max_batch: u32,
    /// Seconds a connection may stay silent between frames.
    #[arg(long, default_value_t = 300.0)]
    idle_timeout: f64,
    /// Seconds a begun frame (or the handshake) may take to arrive.
    #[arg(long, default_value_t = 10.0)]
    frame_timeout: f64,
    /// Events kept in memory for followers that are behind.
    #[arg(long, default_value_t = 10_000)]
    history: usize,
    /// Bound how far followers trail: a write's reply waits until every
    /// follower in sync has applied the event this many before it (1: when
    /// a set returns, followers hold every earlier block). Off by default.
    #[arg(long, value_name = "EVENTS")]
    max_follower_lag: Option<u64>,
    /// Seconds one write waits for a follower before that follower stops
    /// holding writes back (until it is within --max-follower-lag again).
    #[arg(long, default_value_t = 1.0, requires = "max_follower_lag")]
    follower_wait: f64,
}

#[derive(clap::Args, Debug)]
struct FollowArgs {
    /// The writer's server, HOST:PORT.
    addr: String,
    #[command(flatten)]
    dir: DirArg,
    #[command(flatten)]
    conn: RemoteOpts,
    /// Durability of the replica: none | sync | relaxed[=N] | async[=N] | async-relaxed[=N]
    #[arg(long, default_value = "sync")]
    durability: String,
    /// Threads applying a block.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Also serve the replica read-only (get, multi_get, status) on HOST:PORT.
    #[arg(long)]
    listen: Option<String>,
    /// Certificate chain (PEM) of the --listen server.
    #[arg(long, requires_all = ["tls_key", "listen"])]
    tls_cert: Option<PathBuf>,
    /// Private key (PEM) of the --listen server.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Allow plain TCP on a non-loopback --listen address.
    #[arg(long, conflicts_with = "tls_cert", requires = "listen")]
    insecure: bool,
    /// Credentials of the --listen server (as for `serve --auth`).
    #[arg(long, requires = "listen")]
    auth: Option<String>,
}

fn parse_bytes(s: &str, text: bool) -> Result<Vec<u8>> {
    if text {
        return Ok(s.as_bytes().to_vec());
    }
    let h = s.strip_prefix("0x").unwrap_or(s);
    if !h.len().is_multiple_of(2) {
        bail!("{s:?} is not hex (odd length); use --text for text keys");
    }
    (0..h.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&h[i..i + 2], 16)
                .with_context(|| format!("{s:?} is not hex; use --text for text keys"))
        })
        .collect()
}

fn show(v: &[u8], text: bool) -> String {
    if text {
        String::from_utf8_lossy(v).into_owned()
    } else {
        v.iter().map(|b| format!("{b:02x}")).collect()
    }
}

pub fn run(args: Args) -> Result<()> {
    match args.cmd {
        Cmd::Create(a) => create(a),
        Cmd::Info { dir } => info(&dir.dir),
        Cmd::Get { target, text, keys } => get(&target, text, &keys),
        Cmd::Set {
            target,
            block,
            text,
            ops,
        } => set(&target, block, text, &ops),
        Cmd::Rollback { target, to } => rollback(&target, to),
        Cmd::Serve(a) => serve(a),
        Cmd::Follow(a) => follow(a),
        Cmd::Snapshot { dir } => snapshot(&dir.dir),
        Cmd::Verify { dir, repair } => verify(&dir.dir, repair),
    }
}

fn parse_durability(s: &str) -> Result<Durability> {
    s.parse().map_err(|e: String| anyhow::anyhow!(e))
}

fn create(a: CreateArgs) -> Result<()> {
    let durability = parse_durability(&a.durability)?;
    let s = Store::create(
        &a.dir.dir,
        StoreOptions {
            key_width: a.key_width,
            shards: a.shards,
            capacity_per_shard: a.capacity,
            threads: a.threads,
            durability,
            snapshot_interval: a.snapshot_interval,
            rollback_window: a.rollback_window,
            ..Default::default()
        },
    )?;
    s.close()?;
    println!(
        "created store in {} ({}-byte keys, {} shards, durability {durability})",
        a.dir.dir.display(),
        a.key_width,
        a.shards
    );
    Ok(())
}

fn info(dir: &Path) -> Result<()> {
    let s = Store::open(dir)?;
    let r = s.open_report().clone();
    let o = s.options().clone();
    let m = s.metrics();
    println!("directory:        {}", dir.display());
    println!("block:            {}", s.current_block());
    println!("oldest rollback:  {}", s.oldest_rollback_block());
    println!("journal commit:   {}", r.commit);
    println!("keys:             {}", m.entries);
    println!(
        "layout:           {}-byte keys, {} shards, durability {}, snapshot every {} blocks, rollback window {}",
        o.key_width, o.shards, o.durability, o.snapshot_interval, o.rollback_window
    );
    println!(
        "recovery:         snapshot {}, {} commits ({} bytes) replayed in {:.3}s{}",
        r.snapshot_commit
            .map_or("none".into(), |c| format!("at commit {c}")),
        r.commits_replayed,
        r.bytes_replayed,
        r.elapsed.as_secs_f64(),
        r.truncated_tail
            .as_ref()
            .map_or(String::new(), |(f, o, b)| format!(
                "; cut a torn tail of {b} bytes at {}:{o}",
                f.display()
            ))
    );
    println!("journal bytes:    {}", m.journal_bytes);
    println!("snapshot bytes:   {}", m.snapshot_bytes);
    println!("table memory:     {} bytes", m.table_bytes);
    println!(
        "window:           {} blocks, {} bytes",
        m.window_blocks, m.window_bytes
    );
    println!("health:           {}", m.health);
    s.close()?;
    Ok(())
}

fn get(target: &Target, text: bool, keys: &[String]) -> Result<()> {
    let parsed = keys
        .iter()
        .map(|k| parse_bytes(k, text))
        .collect::<Result<Vec<_>>>()?;
    let values = match target.open(Role::Read)? {
        Place::Dir(d) => {
            let s = Store::open(&d)?;
            let v = s.multi_get(&parsed)?;
            s.close()?;
            v
        }
        Place::Remote(mut c) => {
            let kw = c.welcome().key_width as usize;
            if let Some(k) = parsed.iter().find(|k| k.len() != kw) {
                bail!(
                    "key is {} bytes but this store's keys are {kw} bytes",
                    k.len()
                );
            }
            c.multi_get(&parsed)?
        }
    };
    for (k, v) in keys.iter().zip(values) {
        match v {
            Some(v) => println!("{k}\t{}", show(&v, text)),
            None => println!("{k}\t(absent)"),
        }
    }
    Ok(())
}

fn set(target: &Target, block: Option<u64>, text: bool, ops: &[String]) -> Result<()> {
    let mut kv = Vec::new();
    for op in ops {
        let (k, v) = op
            .split_once('=')
            .with_context(|| format!("{op:?}: expected KEY=VALUE"))?;
        kv.push((parse_bytes(k, text)?, parse_bytes(v, text)?));
    }
    let block = match target.open(Role::Write)? {
        Place::Dir(d) => {
            let s = Store::open(&d)?;
            let block = block.unwrap_or(s.current_block() + 1);
            s.set(block, &kv)?;
            s.close()?;
            block
        }
        Place::Remote(mut c) => {
            let block = match block {
                Some(b) => b,
                None => c.status()?.current + 1,
            };
            c.set(block, &kv)?;
            block
        }
    };
    println!("block {block}: {} operations applied", kv.len());
    Ok(())
}

fn rollback(target: &Target, to: u64) -> Result<()> {
    let (from, now) = match target.open(Role::Write)? {
        Place::Dir(d) => {
            let s = Store::open(&d)?;
            let from = s.current_block();
            s.rollback(to)?;
            let now = s.current_block();
            s.close()?;
            (from, now)
        }
        Place::Remote(mut c) => {
            let from = c.status()?.current;
            (from, c.rollback(to)?)
        }
    };
    println!("rolled back from block {from} to block {now}");
    Ok(())
}

fn follow(a: FollowArgs) -> Result<()> {
    let durability = parse_durability(&a.durability)?;
    let stop = Arc::new(AtomicBool::new(false));
    let replica = follower::Replica::new();
    let reads = match &a.listen {
        Some(l) => Some(serve_replica(&a, &replica, l)?),
        None => None,
    };
    on_signals(&stop, reads.as_ref().map(|(h, _)| h.clone()))?;
    let cfg = follower::FollowerConfig {
        client: a.conn.config(&a.addr, Role::Follow)?,
        dir: a.dir.dir,
        durability,
        threads: a.threads,
        max_backoff: Duration::from_secs(2),
        on_caught_up: Some(Box::new(|seq, block| {
            use std::io::Write as _;
            let mut o = std::io::stdout();
            let _ = writeln!(o, "caught up at event {seq} (block {block})");
            let _ = o.flush();
        })),
    };
    let progress = follower::Progress::default();
    let r = follower::follow_into(cfg, &replica, &stop, &progress);
    if let Some((h, t)) = reads {
        h.shutdown();
        t.join()
            .map_err(|_| anyhow::anyhow!("the replica server panicked"))??;
    }
    r?;
    println!(
        "follower stopped at event {} (block {})",
        progress.seq.load(std::sync::atomic::Ordering::Relaxed),
        progress.block.load(std::sync::atomic::Ordering::Relaxed)
    );
    Ok(())
}

/// `follow --listen`: the replica served read-only on a thread of its own.
fn serve_replica(
    a: &FollowArgs,
    replica: &Arc<follower::Replica>,
    listen: &str,
) -> Result<(
    server::ShutdownHandle,
    std::thread::JoinHandle<std::result::Result<(), server::ServerError>>,
)> {
    let cfg = server_config(
        server::ServerConfig::default(),
        a.tls_cert.clone().zip(a.tls_key.clone()).as_ref(),
        a.insecure,
        a.auth.as_deref(),
    )?;
    let srv = server::Server::bind_replica(replica.clone(), listen, cfg)?;
    println!("serving the replica read-only on {}", srv.local_addr());
    let h = srv.handle();
    let t = std::thread::Builder::new()
        .name("replica-server".into())
        .spawn(move || srv.run())?;
    Ok((h, t))
}

fn snapshot(dir: &Path) -> Result<()> {
    let s = Store::open(dir)?;
    let c = s.snapshot()?;
    let b = s.current_block();
    s.close()?;
    println!("snapshot written at commit {c} (block {b})");
    Ok(())
}

fn verify(dir: &Path, repair: bool) -> Result<()> {
    let r = memfs_store::verify(dir)?;
    let j = &r.journal;
    println!(
        "journal: {} segments, {} bytes, commits {}..={}{}",
        j.segments,
        j.bytes,
        j.first_commit.unwrap_or(0),
        j.last_commit,
        j.torn_tail.as_ref().map_or(String::new(), |d| format!(
            "; torn tail at {}:{} (recovery discards it)",
            d.file.display(),
            d.offset
        ))
    );
    match r.snapshot {
        Some((c, n)) => println!("snapshot: commit {c}, {n} entries, checksums ok"),
        None => println!("snapshot: none"),
    }
    if let Some(b) = r.block {
        println!("replay: {} commits, reaches block {b}", r.commits_replayed);
    }
    for p in &r.problems {
        println!("PROBLEM: {p}");
    }
    if r.is_clean() {
        println!("ok");
    } else if repair {
        if let Some(d) = &j.corruption {
            println!(
                "repair will drop {} bytes from {} at offset {} on, and {} later segment files: every commit after {} is lost",
                j.bytes_after_damage,
                d.file.display(),
                d.offset,
                j.segments_after_damage,
                j.last_commit
            );
        }
        let rep = memfs_store::repair(dir)?;
        println!(
            "repaired: journal now ends at commit {}; {} bytes dropped, {} files removed",
            rep.last_commit,
            rep.bytes_dropped,
            rep.files_removed.len()
        );
    } else {
        bail!(
            "{} problem(s) found (see above); `--repair` truncates the journal to its last intact commit",
            r.problems.len()
        );
    }
    Ok(())
}

fn secs(s: f64, what: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(s).with_context(|| format!("{what} {s}: not a number of seconds"))
}

/// Sets `stop` (and shuts the server down) on SIGTERM or SIGINT.
fn on_signals(stop: &Arc<AtomicBool>, server: Option<server::ShutdownHandle>) -> Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
    let stop = stop.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                tracing::info!(sig, "stopping");
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                if let Some(h) = &server {
                    h.shutdown();
                }
            }
        })?;
    Ok(())
}

/// TLS, --insecure and --auth on top of `cfg`.
fn server_config(
    mut cfg: server::ServerConfig,
    tls: Option<&(PathBuf, PathBuf)>,
    insecure: bool,
    auth: Option<&str>,
) -> Result<server::ServerConfig> {
    cfg.insecure = insecure;
    if let Some((cert, key)) = tls {
        cfg.tls = Some(memfs_store::net::server_tls(cert, key)?);
    }
    if let Some(spec) = auth {
        let p = std::path::Path::new(spec);
        let text = if p.exists() {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?
        } else if spec.contains(':') {
            spec.to_string()
        } else {
            bail!("--auth {spec}: no such file (nor USER:TOKEN:ROLE entries)");
        };
        let auth = Auth::parse(&text).map_err(|e| anyhow::anyhow!("--auth {spec}: {e}"))?;
        cfg.auth = Some(Arc::new(auth));
    }
    Ok(cfg)
}

impl ServeArgs {
    /// The server's limits and timeouts, then TLS, --insecure and --auth.
    fn config(&self) -> Result<server::ServerConfig> {
        let cfg = server::ServerConfig {
            max_connections: self.max_connections,
            limits: Limits {
                max_frame: self.max_frame,
                max_batch: self.max_batch,
            },
            idle_timeout: secs(self.idle_timeout, "--idle-timeout")?,
            frame_timeout: secs(self.frame_timeout, "--frame-timeout")?,
            log_events: self.history.max(1),
            max_follower_lag: self.max_follower_lag,
            follower_wait: secs(self.follower_wait, "--follower-wait")?,
            ..Default::default()
        };
        server_config(
            cfg,
            self.tls().as_ref(),
            self.insecure,
            self.auth.as_deref(),
        )
    }

    fn tls(&self) -> Option<(PathBuf, PathBuf)> {
        self.tls_cert.clone().zip(self.tls_key.clone())
    }
}

fn serve(a: ServeArgs) -> Result<()> {
    let cfg = a.config()?;
    let dir = &a.dir.dir;
    let store =
        Store::open(dir).with_context(|| format!("opening the store in {}", dir.display()))?;
    let srv = server::Server::bind(store, &a.listen, cfg)?;
    let handle = srv.handle();
    let stop = Arc::new(AtomicBool::new(false));
    on_signals(&stop, Some(handle.clone()))?;
    let metrics = match &a.metrics {
        Some(m) => Some(server::serve_metrics(handle.clone(), m)?),
        None => None,
    };
    use std::io::Write as _;
    let mut out = std::io::stdout();
    writeln!(
        out,
        "serving {} on {}{}{}",
        dir.display(),
        srv.local_addr(),
        if a.tls().is_some() { " (TLS)" } else { "" },
        metrics.as_ref().map_or(String::new(), |(m, _)| format!(
            "; metrics on http://{m}/metrics"
        ))
    )?;
    out.flush()?;
    srv.run()?;
    if let Some((_, t)) = metrics {
        let _ = t.join();
    }
    println!("server stopped");
    Ok(())
}
