//! [`LocalCluster`]: a real Redis Cluster of `redis-server` processes on
//! free 127.0.0.1 ports (or ports of another address of this host,
//! [`Options::host`]), each node in a temporary directory of its own, for
//! the tests and for `memfs bench cluster`.
//!
//! It never panics and never leaves a process behind: `Drop` stops every
//! node it started (SIGTERM, then SIGKILL after a bounded wait) and reaps
//! it, and the temporary directories go with it, on success, on an error
//! half-way through [`LocalCluster::start`], and on a panic's unwinding.
//! Every wait is a poll with a deadline.

use std::fs::File;
use std::io::ErrorKind;
use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tempfile::TempDir;

use crate::error::{Error, Result};
use crate::topology::{Topology, connect};

/// A cluster bus port is the client port plus this (Redis's default).
const BUS_OFFSET: u16 = 10000;
/// Between two looks at a condition being waited for.
const POLL: Duration = Duration::from_millis(25);
/// How long a stopped node has to exit before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// A command to one node during start-up and health checks.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// How to build a [`LocalCluster`].
#[derive(Clone, Debug)]
pub struct Options {
    /// Masters (at least 3: `redis-cli --cluster create` wants 3).
    pub masters: usize,
    /// Replicas of each master.
    pub replicas: usize,
    /// `cluster-node-timeout`: how long until a silent master is failed
    /// over.
    pub node_timeout: Duration,
    /// `maxmemory` of each node, in Redis's syntax (`256mb`).
    pub maxmemory: String,
    /// The bound on starting, forming the cluster and its health.
    pub start_timeout: Duration,
    /// The address every node listens on and announces: 127.0.0.1, or an
    /// address of this host that another network namespace reaches (the
    /// host's end of a veth pair), for a mount there.
    pub host: Ipv4Addr,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            masters: 3,
            replicas: 1,
            node_timeout: Duration::from_millis(3000),
            maxmemory: "256mb".into(),
            start_timeout: Duration::from_secs(60),
            host: Ipv4Addr::LOCALHOST,
        }
    }
}

struct Node {
    host: Ipv4Addr,
    port: u16,
    dir: TempDir,
    child: Option<Child>,
}

impl Node {
    fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    fn conf(&self) -> PathBuf {
        self.dir.path().join("redis.conf")
    }
}

/// A running Redis Cluster of local processes. Nodes are numbered in the
/// order they were started; `redis-cli --cluster create` makes the first
/// `masters` of them masters.
pub struct LocalCluster {
    nodes: Vec<Node>,
    options: Options,
}

impl LocalCluster {
    /// Starts `options.masters * (1 + options.replicas)` nodes, forms the
    /// cluster and waits until it is healthy ([`LocalCluster::wait_healthy`]).
    pub fn start(options: Options) -> Result<LocalCluster> {
        if options.masters < 3 {
            return Err(Error::BadOption(format!(
                "{} masters: a Redis Cluster wants at least 3",
                options.masters
            )));
        }
        check_installed("redis-server")?;
        check_installed("redis-cli")?;
        let count = options.masters * (1 + options.replicas);
        let mut cluster = LocalCluster {
            nodes: Vec::with_capacity(count),
            options,
        };
        let (ports, held) = free_ports(cluster.options.host, count)?;
        for port in ports {
            let dir = tempfile::Builder::new()
                .prefix("memfs-redis-")
                .tempdir()
                .map_err(Error::io("create a node's temporary directory"))?;
            let node = Node {
                host: cluster.options.host,
                port,
                dir,
                child: None,
            };
            std::fs::write(node.conf(), config(&node, &cluster.options))
                .map_err(Error::io("write redis.conf"))?;
            cluster.nodes.push(node);
        }
        // Held until now so that no two nodes, nor anyone else, got one.
        drop(held);
        for i in 0..cluster.nodes.len() {
            cluster.spawn(i)?;
        }
        for i in 0..cluster.nodes.len() {
            cluster.wait_answers(i)?;
        }
        cluster.create()?;
        cluster.wait_healthy(cluster.options.start_timeout)?;
        tracing::info!(nodes = count, urls = ?cluster.urls(), "local redis cluster up");
        Ok(cluster)
    }

    /// The nodes' URLs, `redis://HOST:P`, in node order.
    pub fn urls(&self) -> Vec<String> {
        (0..self.nodes.len()).map(|i| self.url(i)).collect()
    }

    /// Node `i`'s URL.
    pub fn url(&self, i: usize) -> String {
        format!("redis://{}", self.nodes[i].addr())
    }

    /// Node `i`'s `host:port`.
    pub fn addr(&self, i: usize) -> String {
        self.nodes[i].addr()
    }

    /// How many nodes there are (running or not).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Never: a cluster has at least 3 nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Node `i`'s log file.
    pub fn log(&self, i: usize) -> PathBuf {
        self.nodes[i].log()
    }

    /// Whether node `i`'s process runs (it has not exited).
    pub fn is_running(&mut self, i: usize) -> bool {
        match &mut self.nodes[i].child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The process ids of the nodes that run.
    pub fn pids(&self) -> Vec<u32> {
        self.nodes
            .iter()
            .filter_map(|n| n.child.as_ref().map(Child::id))
            .collect()
    }

    /// The topology as a running node sees it.
    pub fn topology(&self) -> Result<Topology> {
        let running: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(Node::addr)
            .collect();
        Topology::fetch(&running, COMMAND_TIMEOUT)
    }

    /// The node numbered by its `host:port`.
    pub fn node_of(&self, addr: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.addr() == addr)
    }

    /// The node that is master of `key`'s slot now.
    pub fn master_of(&self, key: &[u8]) -> Result<usize> {
        let t = self.topology()?;
        let m = t
            .master_of_key(key)
            .ok_or_else(|| Error::Protocol("a slot without a master".into()))?;
        self.node_of(&m.addr)
            .ok_or_else(|| Error::Protocol(format!("master {} is not one of ours", m.addr)))
    }

    /// The nodes that are masters now, in slot order.
    pub fn masters(&self) -> Result<Vec<usize>> {
        let t = self.topology()?;
        t.masters
            .iter()
            .map(|m| {
                self.node_of(&m.addr)
                    .ok_or_else(|| Error::Protocol(format!("master {} is not one of ours", m.addr)))
            })
            .collect()
    }

    /// SIGKILL to node `i`, and reap it: a crash.
    pub fn kill(&mut self, i: usize) -> Result<()> {
        if let Some(mut c) = self.nodes[i].child.take() {
            let what = format!("kill redis-server {}", c.id());
            match c.kill() {
                Ok(()) => {}
                // It had exited already.
                Err(e) if e.kind() == ErrorKind::InvalidInput => {}
                Err(e) => return Err(Error::io(what.clone())(e)),
            }
            c.wait().map_err(Error::io(what))?;
        }
        Ok(())
    }

    /// A clean stop of node `i` that keeps its data, as an operator's
    /// restart of a persistent Redis does: `SAVE` (the nodes run without
    /// save points, so SIGTERM alone would drop everything), then SIGTERM,
    /// SIGKILL if it has not exited within a bounded wait, and reap it. A
    /// node that cannot save is stopped all the same (its data is lost, as
    /// after [`LocalCluster::kill`]).
    pub fn stop(&mut self, i: usize) -> Result<()> {
        if let Some(c) = self.nodes[i].child.take() {
            let saved = connect(&self.nodes[i].addr(), COMMAND_TIMEOUT)
                .and_then(|mut con| Ok(redis::cmd("SAVE").exec(&mut con)?));
            if let Err(e) = saved {
                tracing::warn!(node = i, error = %e, "stop: SAVE failed; the node's data goes");
            }
            stop_all(vec![c]);
        }
        Ok(())
    }

    /// Starts node `i` again (stopping it first if it runs), with its
    /// configuration and `nodes.conf`, so that it rejoins the cluster as
    /// the node it was; waits until it answers.
    pub fn restart(&mut self, i: usize) -> Result<()> {
        self.stop(i)?;
        self.spawn(i)?;
        self.wait_answers(i)
    }

    /// Waits until every running node says `cluster_state:ok`, has every
    /// slot served, knows every node, and every running replica's link to
    /// its master is up.
    pub fn wait_healthy(&self, timeout: Duration) -> Result<()> {
        let total = self.nodes.len();
        let deadline = Instant::now() + timeout;
        loop {
            let Err((why, log)) = self.health(total) else {
                return Ok(());
            };
            if Instant::now() >= deadline {
                return Err(Error::Start {
                    what: format!("not healthy within {timeout:?}: {why}"),
                    log,
                });
            }
            std::thread::sleep(POLL);
        }
    }

    /// `Ok` when every running node is healthy by itself and sees every
    /// master and every running replica in `CLUSTER SLOTS` (a replica's own
    /// link can be up before gossip has told the other nodes whose replica
    /// it is); else why not, and the log to read.
    fn health(&self, total: usize) -> Result<(), (String, PathBuf)> {
        let running = || self.nodes.iter().filter(|n| n.child.is_some());
        let mut replicas = 0;
        for n in running() {
            replicas += usize::from(node_health(&n.addr(), total).map_err(|why| (why, n.log()))?);
        }
        for n in running() {
            let t = Topology::fetch(&[n.addr()], COMMAND_TIMEOUT)
                .map_err(|e| (format!("{}: CLUSTER SLOTS: {e}", n.addr()), n.log()))?;
            let seen: usize = t.masters.iter().map(|m| m.replicas.len()).sum();
            if t.masters.len() != self.options.masters || seen != replicas {
                let why = format!(
                    "{} sees {} masters and {seen} replicas, not {} and {replicas}",
                    n.addr(),
                    t.masters.len(),
                    self.options.masters
                );
                return Err((why, n.log()));
            }
        }
        Ok(())
    }

    fn spawn(&mut self, i: usize) -> Result<()> {
        let node = &mut self.nodes[i];
        let child = Command::new("redis-server")
            .arg(node.conf())
            .current_dir(node.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| match e.kind() {
                ErrorKind::NotFound => Error::NotInstalled("redis-server"),
                _ => Error::io("start redis-server")(e),
            })?;
        node.child = Some(child);
        Ok(())
    }

    /// Polls node `i` until it answers PING; fails at once if it exited.
    fn wait_answers(&mut self, i: usize) -> Result<()> {
        let deadline = Instant::now() + self.options.start_timeout;
        let (addr, log) = (self.nodes[i].addr(), self.nodes[i].log());
        loop {
            if let Some(c) = &mut self.nodes[i].child
                && let Ok(Some(status)) = c.try_wait()
            {
                self.nodes[i].child = None;
                return Err(Error::Start {
                    what: format!("redis-server on {addr} exited: {status}"),
                    log,
                });
            }
            let pong = connect(&addr, COMMAND_TIMEOUT)
                .and_then(|mut c| Ok(redis::cmd("PING").query::<String>(&mut c)?));
            match pong {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(Error::Start {
                        what: format!("redis-server on {addr} does not answer: {e}"),
                        log,
                    });
                }
                Err(_) => std::thread::sleep(POLL),
            }
        }
    }

    /// `redis-cli --cluster create`, bounded by the start timeout.
    fn create(&mut self) -> Result<()> {
        let out_path = self.nodes[0].dir.path().join("cluster-create.out");
        let out = File::create(&out_path).map_err(Error::io("create cluster-create.out"))?;
        let err = out
            .try_clone()
            .map_err(Error::io("dup cluster-create.out"))?;
        let mut cmd = Command::new("redis-cli");
        cmd.arg("--cluster").arg("create");
        cmd.args(self.nodes.iter().map(Node::addr));
        cmd.arg("--cluster-replicas")
            .arg(self.options.replicas.to_string())
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let mut child = cmd.spawn().map_err(|e| match e.kind() {
            ErrorKind::NotFound => Error::NotInstalled("redis-cli"),
            _ => Error::io("start redis-cli")(e),
        })?;
        let deadline = Instant::now() + self.options.start_timeout;
        let status = loop {
            match child.try_wait().map_err(Error::io("wait for redis-cli"))? {
                Some(status) => break status,
                None if Instant::now() >= deadline => {
                    stop_all(vec![child]);
                    return Err(Error::Start {
                        what: "redis-cli --cluster create did not finish".into(),
                        log: out_path,
                    });
                }
                None => std::thread::sleep(POLL),
            }
        };
        if !status.success() {
            return Err(Error::Start {
                what: format!("redis-cli --cluster create failed: {status}"),
                log: out_path,
            });
        }
        Ok(())
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        let children: Vec<Child> = self
            .nodes
            .iter_mut()
            .filter_map(|n| n.child.take())
            .collect();
        stop_all(children);
    }
}

/// SIGTERM to each, a bounded wait for all, then SIGKILL to those left, and
/// every one reaped. Errors are logged: this runs in `Drop`.
fn stop_all(mut children: Vec<Child>) {
    for c in &children {
        if let Ok(pid) = i32::try_from(c.id()) {
            // ESRCH: it has exited, and waits to be reaped.
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
    }
    let deadline = Instant::now() + STOP_GRACE;
    while !children.is_empty() {
        children.retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_)) | Err(_)));
        if children.is_empty() || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(POLL);
    }
    for mut c in children {
        tracing::warn!(pid = c.id(), "redis-server ignored SIGTERM: SIGKILL");
        let _ = c.kill();
        if let Err(e) = c.wait() {
            tracing::error!(pid = c.id(), "reaping redis-server: {e}");
        }
    }
}

/// Whether the node at `addr` is a replica, when it is healthy by itself;
/// else why not.
fn node_health(addr: &str, total: usize) -> Result<bool, String> {
    let mut c = connect(addr, COMMAND_TIMEOUT).map_err(|e| format!("{addr}: {e}"))?;
    let info: String = redis::cmd("CLUSTER")
        .arg("INFO")
        .query(&mut c)
        .map_err(|e| format!("{addr}: CLUSTER INFO: {e}"))?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
            .unwrap_or("")
    };
    if field("cluster_state") != "ok" {
        return Err(format!(
            "{addr}: cluster_state {:?}",
            field("cluster_state")
        ));
    }
    if field("cluster_slots_ok") != "16384" {
        return Err(format!("{addr}: {} slots ok", field("cluster_slots_ok")));
    }
    if field("cluster_known_nodes") != total.to_string() {
        return Err(format!(
            "{addr}: knows {} nodes",
            field("cluster_known_nodes")
        ));
    }
    let repl: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut c)
        .map_err(|e| format!("{addr}: INFO replication: {e}"))?;
    let is_replica = repl.lines().any(|l| l.trim() == "role:slave");
    if is_replica && !repl.lines().any(|l| l.trim() == "master_link_status:up") {
        return Err(format!("{addr}: replica's link to its master is not up"));
    }
    Ok(is_replica)
}

/// `n` distinct ports `p`, each with `p + 10000` (its cluster bus port)
/// free too, and the listeners that hold them until the nodes start.
fn free_ports(host: Ipv4Addr, n: usize) -> Result<(Vec<u16>, Vec<TcpListener>)> {
    let mut ports = Vec::with_capacity(n);
    let mut held = Vec::with_capacity(2 * n);
    let mut tries = 0;
    while ports.len() < n {
        tries += 1;
        if tries > 1000 {
            return Err(Error::Io {
                what: format!("find {n} free port pairs (P, P + {BUS_OFFSET}) on {host}"),
                source: ErrorKind::AddrInUse.into(),
            });
        }
        let l = TcpListener::bind((host, 0)).map_err(Error::io(format!("bind {host}:0")))?;
        let port = l.local_addr().map_err(Error::io("local_addr"))?.port();
        let Some(bus) = port.checked_add(BUS_OFFSET) else {
            continue;
        };
        // A taken bus port: drop this one and look again.
        if let Ok(b) = TcpListener::bind((host, bus)) {
            ports.push(port);
            held.push(l);
            held.push(b);
        }
    }
    Ok((ports, held))
}

fn config(node: &Node, o: &Options) -> String {
    format!(
        "port {port}\n\
         bind {host}\n\
         protected-mode {protected}\n\
         daemonize no\n\
         dir {dir}\n\
         logfile {log}\n\
         cluster-enabled yes\n\
         cluster-config-file nodes.conf\n\
         cluster-node-timeout {timeout}\n\
         appendonly no\n\
         save \"\"\n\
         maxmemory {maxmemory}\n\
         maxmemory-policy noeviction\n\
         shutdown-timeout 1\n",
        port = node.port,
        host = node.host,
        // Protected mode refuses every client but loopback ones (no password
        // is set): a node on another address of this host is there to be
        // reached from another namespace, and listens on that address only.
        protected = if node.host.is_loopback() { "yes" } else { "no" },
        dir = node.dir.path().display(),
        log = node.log().display(),
        timeout = o.node_timeout.as_millis(),
        maxmemory = o.maxmemory,
    )
}

fn check_installed(program: &'static str) -> Result<()> {
    match Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(s) if s.success() => Ok(()),
        Ok(_) => Err(Error::NotInstalled(program)),
        Err(e) if e.kind() == ErrorKind::NotFound => Err(Error::NotInstalled(program)),
        Err(e) => Err(Error::io(format!("run {program} --version"))(e)),
    }
}
