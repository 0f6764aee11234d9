//! Volumes on a real local Redis Cluster of 3 masters and 3 replicas.
//!
//! One cluster serves every case: starting one takes seconds, and a libtest
//! harness has no hook after its last test to stop a shared one (a static
//! is never dropped, so its processes would outlive the run). So this file
//! is its own harness (`harness = false`): `main` starts the cluster, runs
//! each case under `catch_unwind`, drops the cluster whatever happened, and
//! then checks that no process it started is left. `cargo test -p
//! memfs-cluster --test cluster -- NAME` runs the cases whose name contains
//! NAME. A missing `redis-server` fails the run, with "run scripts/setup".

mod common;

use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::watchdog;
use memfs_cluster::keys::Keys;
use memfs_cluster::local::{LocalCluster, Options};
use memfs_cluster::record::{self, Kind};
use memfs_cluster::slot::key_slot;
use memfs_cluster::space::Space;
use memfs_cluster::topology::connect;
use memfs_cluster::{Admin, CreateOptions, Error};

const T: Duration = Duration::from_secs(10);

type Case = (&'static str, fn(&mut LocalCluster));

const CASES: &[Case] = &[
    ("topology_and_slots", topology_and_slots),
    ("create_list_status_delete", create_list_status_delete),
    ("same_name_twice_is_refused", same_name_twice_is_refused),
    ("concurrent_creates_one_wins", concurrent_creates_one_wins),
    (
        "bad_names_and_options_are_refused",
        bad_names_and_options_are_refused,
    ),
    ("eviction_policy_is_refused", eviction_policy_is_refused),
    ("delete_removes_every_key", delete_removes_every_key),
    ("live_sessions_hold_a_volume", live_sessions_hold_a_volume),
    ("a_killed_replica_restarts", a_killed_replica_restarts),
    (
        "space_is_the_masters_together",
        space_is_the_masters_together,
    ),
];

fn main() {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let wanted = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));
    let (mut passed, mut failed) = (0, 0);
    let mut record = |name: &str, ok: bool| {
        println!("test {name} ... {}", if ok { "ok" } else { "FAILED" });
        if ok { passed += 1 } else { failed += 1 }
    };
    let started = Instant::now();
    let mut cluster = match LocalCluster::start(Options::default()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cannot start a local Redis Cluster (3 masters, 3 replicas): {e}");
            if matches!(e, Error::NotInstalled(_)) {
                eprintln!("redis-server and redis-cli are needed: run scripts/setup");
            }
            println!("0 passed, 1 failed");
            std::process::exit(1);
        }
    };
    println!(
        "cluster of {} nodes up in {:.1?}",
        cluster.len(),
        started.elapsed()
    );
    let current = watchdog(CASE_LIMIT);
    for &(name, case) in CASES.iter().filter(|c| wanted(c.0)) {
        let t = Instant::now();
        *current.lock().unwrap() = Some((name, t));
        let ok = catch_unwind(AssertUnwindSafe(|| case(&mut cluster))).is_ok();
        println!("  ({:.1?})", t.elapsed());
        record(name, ok);
    }
    *current.lock().unwrap() = None;
    let pids = cluster.pids();
    let dirs: Vec<PathBuf> = (0..cluster.len())
        .filter_map(|i| cluster.log(i).parent().map(PathBuf::from))
        .collect();
    drop(cluster);
    if wanted("drop_leaves_nothing") {
        let ok = catch_unwind(|| assert_gone(&pids, &dirs)).is_ok();
        record("drop_leaves_nothing", ok);
    }
    if wanted("a_panic_leaves_nothing") {
        let ok = catch_unwind(a_panic_leaves_nothing).is_ok();
        record("a_panic_leaves_nothing", ok);
    }
    println!("all in {:.1?}", started.elapsed());
    println!("{passed} passed, {failed} failed");
    std::process::exit(i32::from(failed > 0));
}

/// A case that runs longer than this has hung.
const CASE_LIMIT: Duration = Duration::from_secs(180);

fn admin(c: &LocalCluster) -> Admin {
    Admin::with_timeout(&c.urls(), T).unwrap()
}

fn node(c: &LocalCluster, i: usize) -> redis::Connection {
    connect(&c.addr(i), T).unwrap()
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

/// Every key on every master, by master.
fn keys_by_master(c: &LocalCluster) -> Vec<(usize, HashSet<Vec<u8>>)> {
    c.masters()
        .unwrap()
        .into_iter()
        .map(|m| {
            let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(&mut node(c, m)).unwrap();
            (m, keys.into_iter().collect())
        })
        .collect()
}

fn all_keys(c: &LocalCluster) -> HashSet<Vec<u8>> {
    keys_by_master(c).into_iter().flat_map(|(_, k)| k).collect()
}

fn dbsize(c: &LocalCluster) -> u64 {
    c.masters()
        .unwrap()
        .into_iter()
        .map(|m| redis::cmd("DBSIZE").query::<u64>(&mut node(c, m)).unwrap())
        .sum()
}

fn cluster_con(c: &LocalCluster) -> redis::cluster::ClusterConnection {
    redis::cluster::ClusterClient::new(c.urls())
        .unwrap()
        .get_connection()
        .unwrap()
}

fn topology_and_slots(c: &mut LocalCluster) {
    let t = c.topology().unwrap();
    assert_eq!(t.masters.len(), 3, "{t:?}");
    assert_eq!(t.uncovered(), 0);
    for m in &t.masters {
        assert_eq!(m.replicas.len(), 1, "{m:?}");
    }
    let mut con = node(c, 0);
    let mut masters_seen = HashSet::new();
    for key in [
        "foo",
        "{vol}:meta",
        "b:{vol.1f}",
        "b:{vol.20}",
        "memfs:volumes",
        "x",
    ] {
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut con)
            .unwrap();
        assert_eq!(key_slot(key.as_bytes()), slot, "{key}");
        let m = c.master_of(key.as_bytes()).unwrap();
        assert!(t.master_of_slot(slot).unwrap().addr == c.addr(m));
        masters_seen.insert(m);
    }
    assert!(
        masters_seen.len() > 1,
        "six keys on one master: {masters_seen:?}"
    );
}

fn create_list_status_delete(c: &mut LocalCluster) {
    let a = admin(c);
    let before = dbsize(c);
    let opts = CreateOptions {
        uid: 1000,
        gid: 1001,
        ..CreateOptions::default()
    };
    let t0 = now_ns();
    a.create("vol-a", &opts).unwrap();
    let t1 = now_ns();
    assert!(a.list().unwrap().contains(&"vol-a".to_string()));
    let s = a.status("vol-a").unwrap();
    assert_eq!(
        (s.format, s.block_size, s.root, s.features),
        (1, 65536, 1, 0)
    );
    assert!((t0..=t1).contains(&s.created), "created {}", s.created);
    assert_eq!(
        (s.counters.ino, s.counters.inodes, s.counters.block),
        (1, 1, 0)
    );
    assert_eq!(s.live_sessions, 0);
    assert_eq!(s.metadata_slot, key_slot(b"{vol-a}:meta"));
    assert_eq!(s.metadata_master, c.addr(c.master_of(b"{vol-a}").unwrap()));
    assert!(s.metadata_master_used_memory > 100_000, "{s:?}");

    // The root directory's record, as the design lays it out.
    let keys = Keys::new("vol-a").unwrap();
    let raw: Vec<u8> = redis::cmd("HGET")
        .arg(keys.records(1))
        .arg(&Keys::record_field(1)[..])
        .query(&mut cluster_con(c))
        .unwrap();
    assert_eq!(raw.len(), 64);
    let root = record::decode(&raw).unwrap();
    assert_eq!((root.kind, root.mode, root.nlink), (Kind::Dir, 0o755, 2));
    assert_eq!((root.uid, root.gid, root.size), (1000, 1001, 0));
    assert_eq!(
        [root.atime, root.mtime, root.ctime, root.btime],
        [s.created; 4]
    );
    assert_eq!(dbsize(c), before + 4, "meta, next, i:0 and the registry");

    let d = a.delete("vol-a", false).unwrap();
    assert_eq!((d.metadata_keys, d.block_keys), (3, 0));
    assert!(!a.list().unwrap().contains(&"vol-a".to_string()));
    assert!(matches!(a.status("vol-a"), Err(Error::NotFound(_))));
    assert!(matches!(a.delete("vol-a", false), Err(Error::NotFound(_))));
    // The registry is empty again, so it is gone.
    assert_eq!(dbsize(c), before);
}

fn same_name_twice_is_refused(c: &mut LocalCluster) {
    let a = admin(c);
    a.create("dup", &CreateOptions::default()).unwrap();
    let e = a
        .create(
            "dup",
            &CreateOptions {
                block_size: 4096,
                ..CreateOptions::default()
            },
        )
        .unwrap_err();
    assert!(matches!(&e, Error::Exists(n) if n == "dup"), "{e}");
    assert_eq!(
        a.status("dup").unwrap().block_size,
        65536,
        "the first one stands"
    );
    a.delete("dup", false).unwrap();
}

fn concurrent_creates_one_wins(c: &mut LocalCluster) {
    let urls = c.urls();
    for round in 0..20 {
        let name = format!("race-{round}");
        let barrier = Arc::new(Barrier::new(2));
        // Both threads are spawned before either is joined: they meet at the
        // barrier.
        let threads: Vec<_> = (0..2)
            .map(|uid| {
                let (urls, name, barrier) = (urls.clone(), name.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let a = Admin::with_timeout(&urls, T).unwrap();
                    barrier.wait();
                    let opts = CreateOptions {
                        uid,
                        ..CreateOptions::default()
                    };
                    a.create(&name, &opts)
                })
            })
            .collect();
        let results: Vec<_> = threads.into_iter().map(|h| h.join().unwrap()).collect();
        let wins = results.iter().filter(|r| r.is_ok()).count();
        let exists = results
            .iter()
            .filter(|r| matches!(r, Err(Error::Exists(_))))
            .count();
        assert_eq!((wins, exists), (1, 1), "round {round}: {results:?}");
        admin(c).delete(&name, false).unwrap();
    }
}

fn bad_names_and_options_are_refused(c: &mut LocalCluster) {
    let a = admin(c);
    let before = all_keys(c);
    let long = "x".repeat(65);
    for bad in ["", long.as_str(), "a b", "a{b}", "x}", "a*", "a/b", "é"] {
        let is_bad = |r: Result<(), Error>| matches!(r, Err(Error::BadName { .. }));
        assert!(is_bad(a.create(bad, &CreateOptions::default())), "{bad:?}");
        assert!(is_bad(a.status(bad).map(drop)), "{bad:?}");
        assert!(is_bad(a.delete(bad, true).map(drop)), "{bad:?}");
    }
    a.create(&"x".repeat(64), &CreateOptions::default())
        .unwrap();
    a.delete(&"x".repeat(64), false).unwrap();
    for bs in [0, 1000, 2048, 65537, 8 << 20] {
        let o = CreateOptions {
            block_size: bs,
            ..CreateOptions::default()
        };
        assert!(
            matches!(a.create("bs", &o), Err(Error::BadOption(_))),
            "{bs}"
        );
    }
    assert_eq!(all_keys(c), before, "a refused create wrote something");
}

/// Puts a master's `maxmemory-policy` back, whatever the test did.
struct RestorePolicy(redis::Connection);

impl Drop for RestorePolicy {
    fn drop(&mut self) {
        let r: redis::RedisResult<()> = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory-policy")
            .arg("noeviction")
            .query(&mut self.0);
        r.expect("restore maxmemory-policy");
    }
}

fn eviction_policy_is_refused(c: &mut LocalCluster) {
    let a = admin(c);
    let m = c.masters().unwrap()[1];
    let mut con = node(c, m);
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query(&mut con)
        .unwrap();
    let restore = RestorePolicy(con);
    let before = all_keys(c);
    let e = a
        .create("evictable", &CreateOptions::default())
        .unwrap_err();
    match &e {
        Error::Policy { node, policy } => {
            assert_eq!(
                (node.as_str(), policy.as_str()),
                (c.addr(m).as_str(), "allkeys-lru")
            );
        }
        _ => panic!("{e}"),
    }
    assert!(e.to_string().contains("noeviction"), "{e}");
    assert_eq!(all_keys(c), before);
    drop(restore);
    a.create("evictable", &CreateOptions::default()).unwrap();
    a.delete("evictable", false).unwrap();
}

fn delete_removes_every_key(c: &mut LocalCluster) {
    let a = admin(c);
    let baseline = all_keys(c);
    a.create("full", &CreateOptions::default()).unwrap();
    // A neighbour whose block keys match `b:{full.*` too.
    a.create("full.b", &CreateOptions::default()).unwrap();
    a.create("ful", &CreateOptions::default()).unwrap();
    let (k, nb) = (Keys::new("full").unwrap(), Keys::new("full.b").unwrap());
    let mut con = cluster_con(c);
    for id in 1..=300u64 {
        let _: () = redis::cmd("SET")
            .arg(k.block(id))
            .arg(b"data")
            .query(&mut con)
            .unwrap();
    }
    for id in 1..=5u64 {
        let _: () = redis::cmd("SET")
            .arg(nb.block(id))
            .arg(b"x")
            .query(&mut con)
            .unwrap();
    }
    for key in [k.entries(1), k.records(64), k.entries(0xabc)] {
        let _: () = redis::cmd("HSET")
            .arg(key)
            .arg("f")
            .arg("v")
            .query(&mut con)
            .unwrap();
    }
    // An expired session does not hold the volume.
    let _: () = redis::cmd("ZADD")
        .arg(k.sessions())
        .arg(1)
        .arg(7)
        .query(&mut con)
        .unwrap();

    let by_master = keys_by_master(c);
    for (m, keys) in &by_master {
        let blocks = keys.iter().filter(|key| k.is_block(key)).count();
        assert!(blocks > 50, "master {m} holds {blocks} of 300 blocks");
    }
    let d = a.delete("full", false).unwrap();
    assert_eq!(d.block_keys, 300);
    assert_eq!(
        d.metadata_keys,
        3 + 3 + 1,
        "meta, next, i:0, 3 more, sessions"
    );
    let left = all_keys(c);
    let mine: Vec<_> = left
        .iter()
        .filter(|key| key.starts_with(b"{full}") || k.is_block(key))
        .map(|key| String::from_utf8_lossy(key).into_owned())
        .collect();
    assert!(mine.is_empty(), "left behind: {mine:?}");
    for id in 1..=5 {
        assert!(
            left.contains(nb.block(id).as_bytes()),
            "a neighbour's block went"
        );
    }
    assert_eq!(
        a.list().unwrap(),
        vec!["ful".to_string(), "full.b".to_string()]
    );
    assert_eq!(a.status("full.b").unwrap().format, 1);
    assert_eq!(a.delete("full.b", false).unwrap().block_keys, 5);
    a.delete("ful", false).unwrap();
    assert_eq!(all_keys(c), baseline);
}

fn live_sessions_hold_a_volume(c: &mut LocalCluster) {
    let a = admin(c);
    a.create("busy", &CreateOptions::default()).unwrap();
    let k = Keys::new("busy").unwrap();
    let mut con = node(c, c.master_of(k.sessions().as_bytes()).unwrap());
    let (sec, usec): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
    let deadline = sec * 1000 + usec / 1000 + 60_000;
    let _: () = redis::cmd("ZADD")
        .arg(k.sessions())
        .arg(deadline)
        .arg(1)
        .arg(1)
        .arg(2)
        .query(&mut con)
        .unwrap();
    assert_eq!(
        a.status("busy").unwrap().live_sessions,
        1,
        "one live, one expired"
    );
    let e = a.delete("busy", false).unwrap_err();
    assert!(matches!(e, Error::Busy { sessions: 1, .. }), "{e}");
    assert!(a.list().unwrap().contains(&"busy".to_string()));
    let d = a.delete("busy", true).unwrap();
    assert_eq!(d.metadata_keys, 4);
    assert!(matches!(a.status("busy"), Err(Error::NotFound(_))));
}

fn a_killed_replica_restarts(c: &mut LocalCluster) {
    let masters = c.masters().unwrap();
    let replica = (0..c.len()).find(|i| !masters.contains(i)).unwrap();
    let pid = c.pids().len();
    c.kill(replica).unwrap();
    assert!(!c.is_running(replica));
    assert_eq!(c.pids().len(), pid - 1);
    assert!(connect(&c.addr(replica), Duration::from_millis(500)).is_err());
    c.restart(replica).unwrap();
    assert!(c.is_running(replica));
    c.wait_healthy(Duration::from_secs(60)).unwrap();
    let t = c.topology().unwrap();
    assert_eq!(t.masters.len(), 3);
    let addr = c.addr(replica);
    assert!(
        t.masters.iter().any(|m| m.replicas.contains(&addr)),
        "{t:?}"
    );
    // And a stopped one, the same.
    c.stop(replica).unwrap();
    assert!(!c.is_running(replica));
    c.restart(replica).unwrap();
    c.wait_healthy(Duration::from_secs(60)).unwrap();
}

/// Neither the processes nor their directories are left.
fn assert_gone(pids: &[u32], dirs: &[PathBuf]) {
    assert!(!pids.is_empty());
    for pid in pids {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&cmdline).contains("redis-server"),
            "redis-server {pid} still runs"
        );
    }
    for d in dirs {
        assert!(!d.exists(), "{} is left", d.display());
    }
}

fn a_panic_leaves_nothing() {
    let seen: Mutex<(Vec<u32>, Vec<PathBuf>)> = Mutex::default();
    let r = catch_unwind(AssertUnwindSafe(|| {
        let options = Options {
            replicas: 0,
            ..Options::default()
        };
        let c = LocalCluster::start(options).unwrap();
        let dirs = (0..c.len())
            .filter_map(|i| c.log(i).parent().map(PathBuf::from))
            .collect();
        *seen.lock().unwrap() = (c.pids(), dirs);
        panic!("on purpose, with a cluster of {} nodes up", c.len());
    }));
    assert!(r.is_err());
    let (pids, dirs) = seen.into_inner().unwrap();
    assert_eq!(pids.len(), 3);
    assert_gone(&pids, &dirs);
}

/// statfs's room: every master's `maxmemory` (256 MiB each here), what
/// they use counted, a value written on one master seen in `used`.
fn space_is_the_masters_together(c: &mut LocalCluster) {
    let masters = c.masters().unwrap().len() as u64;
    assert_eq!(masters, 3);
    let fresh = Space::new(&c.urls(), T)
        .room()
        .expect("the cluster answers");
    assert_eq!(fresh.total, masters * 256 * 1024 * 1024);
    assert!(fresh.used > 0 && fresh.used < fresh.total, "{fresh:?}");
    let mut con = cluster_con(c);
    let value = vec![7u8; 4 << 20];
    let _: () = redis::cmd("SET")
        .arg("space-test")
        .arg(&value)
        .query(&mut con)
        .unwrap();
    // A new Space, so the answer is not the one kept for a second.
    let after = Space::new(&c.urls(), T).room().unwrap();
    let _: () = redis::cmd("DEL").arg("space-test").query(&mut con).unwrap();
    assert!(
        after.used >= fresh.used + (4 << 20),
        "4 MiB written, used {} -> {}",
        fresh.used,
        after.used
    );
    assert_eq!(after.free(), after.total - after.used);
    let gone = Space::new(&["redis://127.0.0.1:1".to_string()], T);
    assert_eq!(gone.room(), None, "no cluster, no figure, no hang");
}
