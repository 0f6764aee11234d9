//! File contents and locks of a volume on a real local Redis Cluster of 3
//! masters and 3 replicas (`memfs_cluster::data`, `blocks`, `locks`).
//!
//! One cluster serves every case, as in tests/cluster.rs (whose doc says
//! why this file is its own harness): `main` starts it, runs each case
//! under `catch_unwind`, and drops it whatever happened. `cargo test -p
//! memfs-cluster --test data -- NAME` runs the cases whose name contains
//! NAME. Files are made here by writing their record directly (the
//! namespace scripts are another module's), and each "mount" is a
//! [`Handle`] of its own with a session registered the way a mount does it.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::watchdog;
use memfs_cluster::blocks::{Entry, map_key};
use memfs_cluster::data::Data;
use memfs_cluster::direct::Direct;
use memfs_cluster::errno::errno_of;
use memfs_cluster::handle::Handle;
use memfs_cluster::keys::Keys;
use memfs_cluster::local::{LocalCluster, Options};
use memfs_cluster::locks::Locks;
use memfs_cluster::pool::Pool;
use memfs_cluster::record::{self, Kind, Record};
use memfs_cluster::topology::connect;
use memfs_cluster::{Admin, CreateOptions, Error};
use memfs_fs::{Errno, FallocateMode};
use nix::libc;

const T: Duration = Duration::from_secs(10);
/// Small blocks, so that short writes cross block boundaries.
const BS: u32 = 4096;

type Case = (&'static str, fn(&mut LocalCluster));

const CASES: &[Case] = &[
    (
        "direct_block_commands_and_their_misses",
        direct_block_commands_and_their_misses,
    ),
    ("random_writes_match_a_model", random_writes_match_a_model),
    ("sparse_files_and_truncate", sparse_files_and_truncate),
    ("fallocate_modes", fallocate_modes),
    ("copy_range_copies", copy_range_copies),
    (
        "reads_share_blocks_and_writes_take_parts",
        reads_share_blocks_and_writes_take_parts,
    ),
    (
        "pages_stay_current_until_a_change_or_a_loss",
        pages_stay_current_until_a_change_or_a_loss,
    ),
    ("close_to_open_across_mounts", close_to_open_across_mounts),
    ("a_stale_map_is_read_again", a_stale_map_is_read_again),
    ("the_dirty_bound_flushes", the_dirty_bound_flushes),
    (
        "reads_run_beside_writes_and_flushes",
        reads_run_beside_writes_and_flushes,
    ),
    ("fsync_is_on_a_replica", fsync_is_on_a_replica),
    (
        "an_fsync_of_a_lost_block_fails",
        an_fsync_of_a_lost_block_fails,
    ),
    (
        "an_fsync_of_a_lost_commit_fails_once",
        an_fsync_of_a_lost_commit_fails_once,
    ),
    (
        "a_fenced_session_changes_nothing",
        a_fenced_session_changes_nothing,
    ),
    (
        "oom_is_enospc_with_the_old_contents",
        oom_is_enospc_with_the_old_contents,
    ),
    (
        "locks_conflict_across_owners_and_sessions",
        locks_conflict_across_owners_and_sessions,
    ),
    ("unlock_wakes_a_waiter", unlock_wakes_a_waiter),
    ("close_releases_locks", close_releases_locks),
    (
        "synced_data_survives_the_metadata_masters_death",
        synced_data_survives_the_metadata_masters_death,
    ),
];

/// Not tests: run only when named in full (`-- diag_data_path`), they
/// print where the time of the data path goes and assert nothing of it.
const DIAGNOSTICS: &[Case] = &[("diag_data_path", diag_data_path)];

fn main() {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    if let Some(&(name, diag)) = DIAGNOSTICS.iter().find(|d| filter.as_deref() == Some(d.0)) {
        let mut cluster = LocalCluster::start(Options::default()).expect("a local cluster");
        let ok = catch_unwind(AssertUnwindSafe(|| diag(&mut cluster))).is_ok();
        drop(cluster);
        println!("{name}: {}", if ok { "done" } else { "FAILED" });
        std::process::exit(i32::from(!ok));
    }
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
    println!("cluster up in {:.1?}", started.elapsed());
    let current = watchdog(CASE_LIMIT);
    for &(name, case) in CASES.iter().filter(|c| wanted(c.0)) {
        let t = Instant::now();
        *current.lock().unwrap() = Some((name, t));
        let ok = catch_unwind(AssertUnwindSafe(|| case(&mut cluster))).is_ok();
        println!("  ({:.1?})", t.elapsed());
        record(name, ok);
    }
    *current.lock().unwrap() = None;
    drop(cluster);
    if wanted("sync_without_replicas_does_not_wait") {
        let t = Instant::now();
        *current.lock().unwrap() = Some(("sync_without_replicas_does_not_wait", t));
        let ok = catch_unwind(sync_without_replicas_does_not_wait).is_ok();
        *current.lock().unwrap() = None;
        record("sync_without_replicas_does_not_wait", ok);
    }
    println!("all in {:.1?}", started.elapsed());
    println!("{passed} passed, {failed} failed");
    std::process::exit(i32::from(failed > 0));
}

/// A case that runs longer than this has hung.
const CASE_LIMIT: Duration = Duration::from_secs(180);

// ---- helpers ------------------------------------------------------------------------

static VOLUMES: AtomicUsize = AtomicUsize::new(0);

/// A new volume with small blocks.
fn volume(c: &LocalCluster) -> String {
    volume_with(c, BS)
}

/// A new volume with blocks of `bs` bytes.
fn volume_with(c: &LocalCluster, bs: u32) -> String {
    let name = format!("d{}", VOLUMES.fetch_add(1, Ordering::SeqCst));
    let opts = CreateOptions {
        block_size: bs,
        ..CreateOptions::default()
    };
    Admin::with_timeout(&c.urls(), T)
        .unwrap()
        .create(&name, &opts)
        .unwrap();
    name
}

/// A mount's handle with a session of its own, registered as a mount does
/// it (a counter, then a lease deadline an hour ahead by the server's
/// clock).
fn mount(c: &LocalCluster, name: &str) -> Arc<Handle> {
    mount_with(c, name, BS)
}

/// [`mount`] of a volume whose blocks are `bs` bytes.
fn mount_with(c: &LocalCluster, name: &str, bs: u32) -> Arc<Handle> {
    let pool = Pool::connect(&c.urls(), T).unwrap();
    let keys = Keys::new(name).unwrap();
    let h = Handle::new(pool, keys, bs);
    let sid: u64 = h
        .pool
        .with(|con| {
            redis::cmd("HINCRBY")
                .arg(h.keys.next())
                .arg("session")
                .arg(1)
                .query(con)
        })
        .unwrap();
    lease(&h, sid, 3_600_000);
    h.set_sid(sid);
    Arc::new(h)
}

/// Sets session `sid`'s deadline to the server's now plus `ms` (negative:
/// in the past).
fn lease(h: &Handle, sid: u64, ms: i64) {
    let now = server_ms(h);
    h.pool
        .with(|con| {
            redis::cmd("ZADD")
                .arg(h.keys.sessions())
                .arg(now + ms)
                .arg(sid)
                .exec(con)
        })
        .unwrap();
}

fn server_ms(h: &Handle) -> i64 {
    let (s, us): (i64, i64) = h.pool.with(|con| redis::cmd("TIME").query(con)).unwrap();
    s * 1000 + us / 1000
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

/// A new empty file's inode (its record written directly).
fn file(h: &Handle) -> u64 {
    let ino: u64 = h
        .pool
        .with(|con| {
            redis::cmd("HINCRBY")
                .arg(h.keys.next())
                .arg("ino")
                .arg(1)
                .query(con)
        })
        .unwrap();
    let r = Record::new(Kind::File, 0o644, 0, 0, now_ns());
    h.pool
        .with(|con| {
            redis::cmd("HSET")
                .arg(h.keys.records(ino))
                .arg(&Keys::record_field(ino)[..])
                .arg(record::to_vec(&r))
                .exec(con)
        })
        .unwrap();
    ino
}

fn record_of(h: &Handle, ino: u64) -> Record {
    let raw: Vec<u8> = h
        .pool
        .with(|con| {
            redis::cmd("HGET")
                .arg(h.keys.records(ino))
                .arg(&Keys::record_field(ino)[..])
                .query(con)
        })
        .unwrap();
    record::decode(&raw).unwrap()
}

fn read(d: &Data, ino: u64, off: u64, len: usize, size: u64) -> Vec<u8> {
    d.read_with(ino, off, len, size, |parts| parts.concat())
        .unwrap()
}

fn block_map(h: &Handle, ino: u64) -> Vec<(String, Entry)> {
    let raw: Vec<(String, Vec<u8>)> = h
        .pool
        .with(|con| redis::cmd("HGETALL").arg(map_key(h, ino)).query(con))
        .unwrap();
    raw.into_iter()
        .map(|(f, v)| (f, Entry::decode(&v).unwrap()))
        .collect()
}

/// Volume `name`'s feed entries, newest first.
fn feed_newest_first(h: &Handle, name: &str) -> Vec<(String, redis::Value)> {
    h.pool
        .with(|con| {
            redis::cmd("XREVRANGE")
                .arg(format!("{{{name}}}:feed"))
                .arg("+")
                .arg("-")
                .query(con)
        })
        .unwrap()
}

/// How many block keys of volume `name` the masters hold.
fn block_keys(c: &LocalCluster, name: &str) -> usize {
    let keys = Keys::new(name).unwrap();
    c.masters()
        .unwrap()
        .into_iter()
        .map(|m| {
            let found: Vec<Vec<u8>> = redis::cmd("KEYS")
                .arg(keys.block_pattern())
                .query(&mut connect(&c.addr(m), T).unwrap())
                .unwrap();
            found.iter().filter(|k| keys.is_block(k)).count()
        })
        .sum()
}

/// The block path of our own (`memfs_cluster::direct`): values of every
/// size come back byte for byte from every master (a 1 MiB one runs past
/// the connection's read buffer, an empty one is a bulk of 0), a missing
/// key is `None`; what it does not handle is a miss, never a wrong value:
/// a key of another type (WRONGTYPE), and a master demoted by a failover
/// (MOVED), after which it reads the slot map again and goes on.
fn direct_block_commands_and_their_misses(c: &mut LocalCluster) {
    let d = Direct::new(&c.urls(), T);
    let keys: Vec<String> = (0..40).map(|i| format!("b:{{direct.{i}}}")).collect();
    let values: Vec<Vec<u8>> = (0..40usize)
        .map(|i| match i {
            0 => Vec::new(),
            1 => (0..1 << 20).map(|j: usize| (j * 7 + 3) as u8).collect(),
            _ => vec![i as u8; 1 + i * 1000],
        })
        .collect();
    let k: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
    let sets: Vec<(&[u8], &[u8])> = k.iter().zip(&values).map(|(k, v)| (*k, &v[..])).collect();
    d.set(&sets, &[]).expect("SETs");
    let got = d.get(&k).expect("GETs");
    for (i, (g, v)) in got.iter().zip(&values).enumerate() {
        assert_eq!(g.as_deref(), Some(&v[..]), "value {i}");
    }
    let masters: std::collections::BTreeSet<usize> = keys
        .iter()
        .map(|k| c.master_of(k.as_bytes()).unwrap())
        .collect();
    assert_eq!(masters.len(), 3, "the keys span every master");
    d.set(&[], &k[..2]).expect("UNLINKs");
    let got = d.get(&k[..3]).expect("GETs after UNLINK");
    assert_eq!(got[..2], [None, None], "unlinked keys read as missing");
    assert_eq!(got[2].as_deref(), Some(&values[2][..]));

    let hash = "b:{direct.hash}";
    let mut con = connect(&c.addr(c.master_of(hash.as_bytes()).unwrap()), T).unwrap();
    redis::cmd("HSET")
        .arg(hash)
        .arg("f")
        .arg("v")
        .exec(&mut con)
        .unwrap();
    let miss = d
        .get(&[hash.as_bytes(), k[3]])
        .expect_err("WRONGTYPE is a miss");
    assert!(miss.why.contains("WRONGTYPE"), "{miss:?}");
    let after = d.get(&k[5..6]).expect("an error reply keeps the slot map");
    assert_eq!(after[0].as_deref(), Some(&values[5][..]));

    // A graceful failover of the master of key 5: its old master answers
    // MOVED, the path misses, then finds the new master by itself.
    let old = c.master_of(k[5]).unwrap();
    let t = c.topology().unwrap();
    let replica = t.master_of_key(k[5]).unwrap().replicas[0].clone();
    let mut r = connect(&replica, T).unwrap();
    redis::cmd("CLUSTER").arg("FAILOVER").exec(&mut r).unwrap();
    poll(
        || c.master_of(k[5]).is_ok_and(|m| m != old),
        "the replica took over",
    );
    c.wait_healthy(Duration::from_secs(30)).unwrap();
    let mut missed = false;
    poll(
        || match d.get(&k[5..6]) {
            Ok(got) => got[0].as_deref() == Some(&values[5][..]),
            Err(m) => {
                missed |= m.why.contains("MOVED");
                false
            }
        },
        "the path found the new master",
    );
    assert!(missed, "the stale slot map went unnoticed");
    redis::cmd("DEL").arg(hash).exec(&mut con).unwrap();
    d.set(&[], &k).unwrap();
}

/// Polls `f` until it holds, failing the case named `what` after `T`.
fn poll(mut f: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + T;
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within {T:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn errno(r: memfs_cluster::Result<impl std::fmt::Debug>) -> Errno {
    errno_of(&r.expect_err("an error"))
}

/// A small deterministic generator (xorshift64*), so that a failing run
/// can be replayed from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

// ---- cases --------------------------------------------------------------------------

/// Writes, reads, flushes and truncates at random offsets across block
/// boundaries, checked against a plain byte vector; a second mount reads
/// what the first committed.
fn random_writes_match_a_model(c: &mut LocalCluster) {
    let name = volume(c);
    let h = mount(c, &name);
    let d = Data::new(h.clone(), 1 << 20);
    let other = Data::new(mount(c, &name), 0);
    let ino = file(&h);
    let mut model: Vec<u8> = Vec::new();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for step in 0..400 {
        match rng.below(10) {
            0..=4 => {
                let off = rng.below(40_000);
                let len = rng.below(9_000) as usize;
                let byte = (step % 251 + 1) as u8;
                let data = vec![byte; len];
                let size = d.write(ino, off, &data, model.len() as u64).unwrap();
                if len > 0 && model.len() < off as usize + len {
                    model.resize(off as usize + len, 0);
                }
                model[off as usize..off as usize + len].copy_from_slice(&data);
                assert_eq!(size, model.len() as u64, "step {step}: size after a write");
            }
            5..=7 => {
                let off = rng.below(model.len() as u64 + 5_000);
                let len = rng.below(12_000) as usize;
                let got = read(&d, ino, off, len, model.len() as u64);
                let (a, z) = (
                    (off as usize).min(model.len()),
                    (off as usize + len).min(model.len()),
                );
                assert!(got == model[a..z], "step {step}: read [{off}, +{len})");
            }
            8 => {
                if let Some(r) = d.flush(ino).unwrap() {
                    assert_eq!(r.size, model.len() as u64, "step {step}: committed size");
                }
            }
            _ => {
                let size = rng.below(model.len() as u64 + 8_000);
                let r = d.truncate(ino, size).unwrap();
                model.resize(size as usize, 0);
                assert_eq!(r.size, size, "step {step}: truncated size");
            }
        }
        if step % 50 == 49 {
            d.flush(ino).unwrap();
            other.invalidate(ino);
            let size = record_of(&h, ino).size;
            assert_eq!(size, model.len() as u64, "step {step}");
            assert!(
                read(&other, ino, 0, model.len() + 10, size) == model,
                "step {step}: the other mount reads what was committed"
            );
        }
    }
    // What this mount wrote it keeps; the other caches nothing.
    assert!(d.hits().0 > 0, "{:?}", d.hits());
    assert!(
        other.hits().1 > 0 && other.cached_bytes() == 0,
        "{:?}",
        other.hits()
    );
    assert!(d.cached_bytes() <= 1 << 20);
}

/// A read hands out the blocks themselves (the same memory twice, one
/// slice a block, zeros for a hole); a write given in parts (the kernel's
/// pages) lands as the same bytes as one buffer would, across blocks.
fn reads_share_blocks_and_writes_take_parts(c: &mut LocalCluster) {
    let name = volume(c);
    let h = mount(c, &name);
    let d = Data::new(h.clone(), 1 << 20);
    let ino = file(&h);
    let bs = BS as usize;
    let data: Vec<u8> = (0..3 * bs + 100).map(|i| (i % 253) as u8).collect();
    // Parts of odd lengths that straddle the block boundaries.
    let cuts = [0, 1, 700, bs - 3, bs + 5, 2 * bs, 3 * bs + 99, data.len()];
    let parts: Vec<&[u8]> = cuts.windows(2).map(|w| &data[w[0]..w[1]]).collect();
    let off = 10;
    let size = d.write_parts(ino, off, &parts, 0).unwrap();
    assert_eq!(size, off + data.len() as u64);
    assert_eq!(read(&d, ino, off, data.len(), size), data);
    // A hole of two blocks, then the data: committed, then read twice.
    let far = 6 * BS as u64;
    let size = d.write(ino, far, &data[..bs], size).unwrap();
    d.flush(ino).unwrap();
    let shape = |d: &Data| {
        d.read_with(ino, 0, far as usize + bs, size, |p| {
            p.iter()
                .map(|s| (s.as_ptr() as usize, s.len()))
                .collect::<Vec<_>>()
        })
        .unwrap()
    };
    let (a, b) = (shape(&d), shape(&d));
    assert_eq!(a, b, "two reads of cached blocks hand out the same memory");
    assert_eq!(a.iter().map(|s| s.1).sum::<usize>(), far as usize + bs);
    assert!(a.len() >= 7, "one slice a block at least: {a:?}");
    let got = read(&d, ino, 0, far as usize + bs, size);
    assert_eq!(&got[off as usize..off as usize + data.len()], &data[..]);
    assert!(
        got[off as usize + data.len()..far as usize]
            .iter()
            .all(|&x| x == 0)
    );
    assert_eq!(&got[far as usize..], &data[..bs]);
    // A write into a block a read still holds changes what it hands out
    // next, never what the read held.
    d.read_with(ino, far, bs, size, |held| {
        let before = held.concat();
        d.write(ino, far, b"new", size).unwrap();
        assert_eq!(held.concat(), before, "a held block never changes");
    })
    .unwrap();
    assert_eq!(read(&d, ino, far, 3, size), b"new");
}

/// The kernel's pages of a file stay current from one open to the next
/// only while the record is unchanged and the mount kept track of the
/// feed since an earlier open checked the file.
fn pages_stay_current_until_a_change_or_a_loss(c: &mut LocalCluster) {
    let name = volume(c);
    let d = Data::new(mount(c, &name), 0);
    let (ino, other) = (7, 8);
    assert!(
        !d.pages_current(ino, true),
        "the first open: nothing checked"
    );
    assert!(d.pages_current(ino, true), "unchanged since that open");
    assert!(!d.pages_current(ino, false), "the record changed");
    assert!(d.pages_current(ino, true));
    assert!(
        !d.pages_current(other, true),
        "files are checked one by one"
    );
    d.invalidate_all();
    assert!(!d.pages_current(ino, true), "the mount lost the feed");
    assert!(d.pages_current(ino, true));
    d.forget(ino);
    assert!(!d.pages_current(ino, true), "a forgotten file starts over");
}

/// A hole reads as zeros, SEEK_DATA and SEEK_HOLE find the blocks, and a
/// file truncated down then extended reads zeros past the cut.
fn sparse_files_and_truncate(c: &mut LocalCluster) {
    let name = volume(c);
    let h = mount(c, &name);
    let d = Data::new(h.clone(), 1 << 20);
    let ino = file(&h);
    let far = 10 * u64::from(BS) + 100;
    d.write(ino, far, b"tail", 0).unwrap();
    let size = far + 4;
    assert_eq!(d.dirty(ino).map(|x| x.0), Some(size));
    assert_eq!(read(&d, ino, 0, 8, size), vec![0; 8]);
    assert_eq!(
        d.lseek(ino, 0, libc::SEEK_DATA, size).unwrap(),
        10 * u64::from(BS)
    );
    assert_eq!(d.lseek(ino, 0, libc::SEEK_HOLE, size).unwrap(), 0);
    assert_eq!(d.lseek(ino, far, libc::SEEK_HOLE, size).unwrap(), size);
    assert_eq!(
        errno(d.lseek(ino, size, libc::SEEK_DATA, size)),
        Errno::ENXIO
    );
    let r = d.flush(ino).unwrap().unwrap();
    assert_eq!(r.size, size);
    assert_eq!(block_map(&h, ino).len(), 1, "one block for a sparse file");
    assert_eq!(
        d.lseek(ino, 5, libc::SEEK_DATA, size).unwrap(),
        10 * u64::from(BS)
    );
    // Truncate into the middle of the written block, then extend.
    d.write(ino, 0, &[7u8; 3 * BS as usize], size).unwrap();
    d.flush(ino).unwrap();
    let r = d.truncate(ino, 5000).unwrap();
    assert_eq!(r.size, 5000);
    assert_eq!(
        block_map(&h, ino).len(),
        2,
        "blocks past the end are dropped"
    );
    let r = d.truncate(ino, 3 * u64::from(BS)).unwrap();
    assert_eq!(r.size, 3 * u64::from(BS));
    let fresh = Data::new(mount(c, &name), 0);
    let got = read(&fresh, ino, 0, 3 * BS as usize, r.size);
    assert_eq!(&got[..5000], &[7u8; 5000][..]);
    assert!(
        got[5000..].iter().all(|&b| b == 0),
        "an extension reads zeros"
    );
    assert_eq!(read(&d, ino, 4000, 2000, r.size)[1000..], [0u8; 1000][..]);
    // A write past the cut keeps the zeros between.
    d.write(ino, 6000, b"x", r.size).unwrap();
    d.flush(ino).unwrap();
    fresh.invalidate(ino);
    let got = read(&fresh, ino, 4990, 1100, r.size);
    assert_eq!(&got[..10], &[7u8; 10][..]);
    assert!(got[10..1010].iter().all(|&b| b == 0));
    assert_eq!(got[1010], b'x');
}

fn fallocate_modes(c: &mut LocalCluster) {
    let name = volume(c);
    let h = mount(c, &name);
    let d = Data::new(h.clone(), 1 << 20);
    let ino = file(&h);
    let bs = u64::from(BS);
    let n = 4 * bs;
    d.write(ino, 0, &vec![9u8; n as usize], 0).unwrap();
    d.flush(ino).unwrap();
    let keep = FallocateMode {
        keep_size: true,
        ..FallocateMode::ALLOCATE
    };
    let r = d.fallocate(ino, 0, 10 * bs, keep, n).unwrap();
    assert_eq!(r.size, n, "keep size");
    let r = d
        .fallocate(ino, 0, 5 * bs, FallocateMode::ALLOCATE, n)
        .unwrap();
    assert_eq!(r.size, 5 * bs);
    let size = r.size;
    let punch = FallocateMode {
        keep_size: true,
        punch_hole: true,
        zero_range: false,
    };
    // From the middle of block 0 to the middle of block 2: block 1 goes.
    let r = d.fallocate(ino, 100, 2 * bs, punch, size).unwrap();
    assert_eq!(r.size, size);
    let fresh = Data::new(mount(c, &name), 0);
    let got = read(&fresh, ino, 0, size as usize, size);
    assert!(got[..100].iter().all(|&b| b == 9));
    assert!(got[100..(2 * bs + 100) as usize].iter().all(|&b| b == 0));
    assert!(
        got[(2 * bs + 100) as usize..n as usize]
            .iter()
            .all(|&b| b == 9)
    );
    assert!(got[n as usize..].iter().all(|&b| b == 0));
    assert!(
        !block_map(&h, ino).iter().any(|(f, _)| f == "1"),
        "the hole's block left the map"
    );
    let zero = FallocateMode {
        keep_size: false,
        punch_hole: false,
        zero_range: true,
    };
    let r = d.fallocate(ino, 3 * bs, 4 * bs, zero, size).unwrap();
    assert_eq!(r.size, 7 * bs, "zero range extends");
    fresh.invalidate(ino);
    let got = read(&fresh, ino, 0, r.size as usize, r.size);
    assert!(got[3 * bs as usize..].iter().all(|&b| b == 0));
    assert!(got[..100].iter().all(|&b| b == 9));
    assert_eq!(errno(d.fallocate(ino, 0, 0, zero, r.size)), Errno::EINVAL);
    let bad = FallocateMode {
        keep_size: false,
        ..punch
    };
    assert_eq!(
        errno(d.fallocate(ino, 0, 1, bad, r.size)),
        Errno::EOPNOTSUPP
    );
}

fn copy_range_copies(c: &mut LocalCluster) {
    let name = volume(c);
    let h = mount(c, &name);
    let d = Data::new(h.clone(), 1 << 20);
    let (a, b) = (file(&h), file(&h));
    let src: Vec<u8> = (0..20_000u32).map(|i| (i % 253) as u8).collect();
    d.write(a, 0, &src, 0).unwrap();
    // Copied from the dirty buffer, before any flush.
    let (n, r) = d.copy_range(a, 1000, b, 50, 100_000, 0, 0).unwrap();
    assert_eq!(n, 19_000, "clipped to the source's size");
    assert_eq!(r.size, 19_050);
    let fresh = Data::new(mount(c, &name), 0);
    let got = read(&fresh, b, 0, 20_000, r.size);
    assert!(got[..50].iter().all(|&x| x == 0));
    assert!(got[50..] == src[1000..]);
    assert_eq!(
        errno(d.copy_range(a, 0, a, 10, 100, 20_000, 20_000)),
        Errno::EINVAL
    );
}

/// What one mount flushed, another reads after the feed's invalidation.
fn close_to_open_across_mounts(c: &mut LocalCluster) {
    let name = volume(c);
    let h1 = mount(c, &name);
    let h2 = mount(c, &name);
    let (d1, d2) = (Data::new(h1.clone(), 1 << 20), Data::new(h2, 1 << 20));
    let ino = file(&h1);
    d1.write(ino, 0, &[1u8; 10_000], 0).unwrap();
    assert_eq!(
        record_of(&h1, ino).size,
        0,
        "nothing is committed before flush"
    );
    d1.flush(ino).unwrap();
    assert_eq!(read(&d2, ino, 0, 10_000, 10_000), vec![1u8; 10_000]);
    // The second mount overwrites the middle, across a block boundary.
    d2.write(ino, 4000, &[2u8; 200], 10_000).unwrap();
    d2.flush(ino).unwrap();
    d1.invalidate(ino);
    let got = read(&d1, ino, 0, 10_000, record_of(&h1, ino).size);
    assert!(got[..4000].iter().all(|&b| b == 1));
    assert!(got[4000..4200].iter().all(|&b| b == 2));
    assert!(got[4200..].iter().all(|&b| b == 1));
    // Two mounts writing different blocks of one file keep both.
    d1.write(ino, 0, b"one", 10_000).unwrap();
    d2.write(ino, 9000, b"two", 10_000).unwrap();
    d1.flush(ino).unwrap();
    d2.flush(ino).unwrap();
    let fresh = Data::new(mount(c, &name), 0);
    let got = read(&fresh, ino, 0, 10_000, 10_000);
    assert_eq!(&got[..3], b"one");
    assert_eq!(&got[9000..9003], b"two");
    d1.invalidate_all();
    d1.forget(ino);
    assert!(d1.dirty(ino).is_none());
}

/// A mount that caches no blocks and was not told of a change finds the
/// blocks its map names gone, and reads the map again.
fn a_stale_map_is_read_again(c: &mut LocalCluster) {
    let name = volume(c);
    let h1 = mount(c, &name);
    let (d1, d2) = (
        Data::new(h1.clone(), 0),
        Data::new(mount(c, &name), 1 << 20),
    );
    let ino = file(&h1);
    d2.write(ino, 0, &[1u8; 5000], 0).unwrap();
    d2.flush(ino).unwrap();
    assert_eq!(read(&d1, ino, 0, 5000, 5000), vec![1u8; 5000]);
    let before = block_keys(c, &name);
    d2.write(ino, 0, &[2u8; 5000], 5000).unwrap();
    d2.flush(ino).unwrap();
    // The replaced blocks go out in the next flush's pipeline.
    assert_eq!(block_keys(c, &name), before + 2, "two replaced, queued");
    d2.write(ino, 0, &[3u8; 5000], 5000).unwrap();
    d2.flush(ino).unwrap();
    assert_eq!(
        block_keys(c, &name),
        before + 2,
        "the queued blocks were freed with the next flush, its own queued"
    );
    d2.free_pending();
    assert_eq!(
        block_keys(c, &name),
        before,
        "the replaced blocks were freed"
    );
    assert_eq!(read(&d1, ino, 0, 5000, 5000), vec![3u8; 5000]);
}

/// Past the mount's dirty bound a write first flushes the file with the
/// most dirty bytes: memory stays bounded, and nothing is lost.
fn the_dirty_bound_flushes(c: &mut LocalCluster) {
    let name = volume(c);
    let h = mount(c, &name);
    let d = Data::new(h.clone(), 0);
    let limit = 8 * u64::from(BS);
    d.set_dirty_limit(limit);
    let files: Vec<u64> = (0..3).map(|_| file(&h)).collect();
    let mut sizes = [0u64; 3];
    for round in 0..20u64 {
        for (i, &ino) in files.iter().enumerate() {
            let chunk = vec![(round + i as u64) as u8; 3000];
            sizes[i] = d.write(ino, round * 3000, &chunk, sizes[i]).unwrap();
            assert!(
                d.dirty_bytes() <= limit + u64::from(BS),
                "{} dirty",
                d.dirty_bytes()
            );
        }
    }
    assert!(record_of(&h, files[0]).size > 0, "flushed before any close");
    for (i, &ino) in files.iter().enumerate() {
        d.flush(ino).unwrap();
        let got = read(&d, ino, 0, sizes[i] as usize, sizes[i]);
        for round in 0..20u64 {
            let at = (round * 3000) as usize;
            assert!(
                got[at..at + 3000]
                    .iter()
                    .all(|&b| b == (round + i as u64) as u8)
            );
        }
    }
    assert_eq!(d.dirty_bytes(), 0);
}

/// Threads reading a file while another writes whole blocks of it and
/// flushes (freeing the blocks it replaced) never see an error nor a
/// block half of one write and half of another.
fn reads_run_beside_writes_and_flushes(c: &mut LocalCluster) {
    let name = volume(c);
    let h = mount(c, &name);
    let d = Arc::new(Data::new(h.clone(), 0));
    let ino = file(&h);
    let bs = BS as usize;
    let size = 8 * bs as u64;
    d.write(ino, 0, &vec![1u8; 8 * bs], 0).unwrap();
    d.flush(ino).unwrap();
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let d = d.clone();
            std::thread::spawn(move || {
                for _ in 0..100 {
                    let got = read(&d, ino, 0, 8 * bs, size);
                    for b in got.chunks(bs) {
                        assert!(b.iter().all(|&x| x == b[0]), "a torn block");
                    }
                }
            })
        })
        .collect();
    for round in 0..50u8 {
        let idx = u64::from(round % 8);
        d.write(ino, idx * BS as u64, &vec![round; bs], size)
            .unwrap();
        if round % 3 == 0 {
            d.flush(ino).unwrap();
        }
    }
    for r in readers {
        r.join().unwrap();
    }
}

/// An acknowledged sync's blocks and record are on the replicas.
fn fsync_is_on_a_replica(c: &mut LocalCluster) {
    let name = volume(c);
    let h = mount(c, &name);
    let d = Data::new(h.clone(), 1 << 20);
    let ino = file(&h);
    d.write(ino, 0, &[5u8; 6 * BS as usize], 0).unwrap();
    let r = d.sync(ino).unwrap().unwrap();
    assert_eq!(r.size, 6 * u64::from(BS));
    let t = c.topology().unwrap();
    let on_replica = |key: &str| -> bool {
        let m = t.master_of_key(key.as_bytes()).unwrap();
        let mut con = connect(&m.replicas[0], T).unwrap();
        redis::cmd("READONLY").exec(&mut con).unwrap();
        redis::cmd("EXISTS")
            .arg(key)
            .query::<i64>(&mut con)
            .unwrap()
            == 1
    };
    for (_, e) in block_map(&h, ino) {
        assert!(
            on_replica(&h.keys.block(e.id)),
            "block {} on a replica",
            e.id
        );
    }
    assert!(on_replica(&map_key(&h, ino)));
    // A sync with nothing new waits again for what the last flush sent.
    d.write(ino, 0, b"again", r.size).unwrap();
    d.flush(ino).unwrap();
    assert!(d.sync(ino).unwrap().is_none());
}

/// A block the cluster lost after acknowledging it (a master that died
/// before replicating it, played here by deleting the key): the fsync that
/// follows is EIO, and stays EIO until the block is written again; blocks
/// replaced before the fsync (and unlinked by right) fail nothing.
fn an_fsync_of_a_lost_block_fails(c: &mut LocalCluster) {
    let name = volume(c);
    let h = mount(c, &name);
    let d = Data::new(h.clone(), 1 << 20);
    let ino = file(&h);
    // Replaced twice before any sync: the first id is unlinked by the
    // third flush, and must not count as lost.
    for round in 0..3u8 {
        let size = if round == 0 { 0 } else { 3 * u64::from(BS) };
        d.write(ino, 0, &[round; 3 * BS as usize], size).unwrap();
        d.flush(ino).unwrap();
    }
    d.sync(ino).unwrap();
    d.write(ino, 0, &[7u8; 3 * BS as usize], 3 * u64::from(BS))
        .unwrap();
    d.flush(ino).unwrap();
    let map = block_map(&h, ino);
    let (field, lost) = map.iter().find(|(f, _)| f == "1").expect("block 1 mapped");
    assert_eq!(field, "1");
    let gone: i64 = h
        .pool
        .with(|con| redis::cmd("DEL").arg(h.keys.block(lost.id)).query(con))
        .unwrap();
    assert_eq!(gone, 1, "the block was there to lose");
    assert_eq!(
        errno(d.sync(ino)),
        Errno::EIO,
        "a lost block went unnoticed"
    );
    assert_eq!(errno(d.sync(ino)), Errno::EIO, "the second fsync forgot it");
    // Written again, the block is a new one, and the file is whole.
    d.write(ino, u64::from(BS), &[8u8; BS as usize], 3 * u64::from(BS))
        .unwrap();
    d.sync(ino).unwrap();
    assert_eq!(
        read(&d, ino, u64::from(BS), 4, 3 * u64::from(BS)),
        vec![8u8; 4]
    );
}

/// A commit the cluster lost after acknowledging it (a metadata master
/// that died before replicating the script, played here by putting the
/// map back as it was and deleting the commit's feed entry, as the
/// promoted replica would hold them): the fsync that follows is EIO, the
/// next one is not (the file is whole, only older, and Linux tells a
/// writeback error once), and this mount then reads what the cluster holds.
fn an_fsync_of_a_lost_commit_fails_once(c: &mut LocalCluster) {
    let name = volume(c);
    let h = mount(c, &name);
    let d = Data::new(h.clone(), 1 << 20);
    let ino = file(&h);
    let size = 2 * u64::from(BS);
    d.write(ino, 0, &[1u8; 2 * BS as usize], 0).unwrap();
    d.sync(ino).unwrap();
    let before = block_map(&h, ino);
    d.write(ino, 0, &[2u8; 2 * BS as usize], size).unwrap();
    d.flush(ino).unwrap();
    assert_ne!(block_map(&h, ino), before, "the commit changed the map");
    let last = feed_newest_first(&h, &name);
    let (id, _) = last.first().expect("the commit's feed entry");
    h.pool
        .with(|con| {
            let mut p = redis::cluster::cluster_pipe();
            p.cmd("XDEL").arg(format!("{{{name}}}:feed")).arg(id);
            p.cmd("DEL").arg(map_key(&h, ino));
            for (f, e) in &before {
                p.cmd("HSET")
                    .arg(map_key(&h, ino))
                    .arg(f)
                    .arg(&e.encode()[..]);
            }
            p.query::<()>(con)
        })
        .unwrap();
    assert_eq!(
        errno(d.sync(ino)),
        Errno::EIO,
        "a lost commit went unnoticed"
    );
    d.sync(ino).expect("the loss was told once");
    assert_eq!(
        read(&d, ino, 0, 4, size),
        vec![1u8; 4],
        "the mount still reads the lost commit's blocks"
    );
    // A sync with a commit that did reach the cluster passes.
    d.write(ino, 0, &[3u8; 4], size).unwrap();
    d.sync(ino).unwrap();
    assert_eq!(
        read(&Data::new(h.clone(), 0), ino, 0, 4, size),
        vec![3u8; 4]
    );
}

/// A session whose lease ran out gets ESTALE, and the file is unchanged.
fn a_fenced_session_changes_nothing(c: &mut LocalCluster) {
    let name = volume(c);
    let h = mount(c, &name);
    let d = Data::new(h.clone(), 1 << 20);
    let ino = file(&h);
    d.write(ino, 0, b"old", 0).unwrap();
    d.flush(ino).unwrap();
    let blocks = block_keys(c, &name);
    lease(&h, h.sid(), -1000);
    d.write(ino, 0, b"new", 3).unwrap();
    assert_eq!(errno(d.flush(ino)), Errno::ESTALE);
    assert_eq!(errno(d.truncate(ino, 0)), Errno::ESTALE);
    assert_eq!(
        block_keys(c, &name),
        blocks,
        "the refused blocks were deleted"
    );
    let fresh = Data::new(mount(c, &name), 0);
    assert_eq!(read(&fresh, ino, 0, 3, record_of(&h, ino).size), b"old");
}

fn set_maxmemory(c: &LocalCluster, nodes: &[usize], value: &str) {
    for &m in nodes {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(value)
            .exec(&mut connect(&c.addr(m), T).unwrap())
            .unwrap();
    }
}

/// A full cluster is ENOSPC, the file keeps its old contents, and no
/// block is left that no map names: with every master full (nothing
/// runs), and with only the data masters full (some blocks were written,
/// the script never ran).
fn oom_is_enospc_with_the_old_contents(c: &mut LocalCluster) {
    let name = volume(c);
    let h = mount(c, &name);
    let d = Data::new(h.clone(), 1 << 20);
    let ino = file(&h);
    let old = vec![1u8; 8 * BS as usize];
    d.write(ino, 0, &old, 0).unwrap();
    d.flush(ino).unwrap();
    let blocks = block_keys(c, &name);
    let masters = c.masters().unwrap();
    let meta = c.master_of(h.keys.meta().as_bytes()).unwrap();
    let data_only: Vec<usize> = masters.iter().copied().filter(|&m| m != meta).collect();
    let size = old.len() as u64;
    for full in [&masters[..], &data_only[..]] {
        set_maxmemory(c, full, "1");
        let r = d
            .write(ino, 10, &vec![2u8; 7 * BS as usize], size)
            .and_then(|_| d.flush(ino));
        set_maxmemory(c, full, "256mb");
        assert_eq!(errno(r), Errno::ENOSPC);
        assert_eq!(block_keys(c, &name), blocks, "no block left behind");
        let fresh = Data::new(mount(c, &name), 0);
        assert!(
            read(&fresh, ino, 0, old.len(), size) == old,
            "the old contents"
        );
        assert_eq!(record_of(&h, ino).size, size);
    }
    // The dirty data is still there, and commits once there is room.
    d.flush(ino).unwrap();
    let fresh = Data::new(mount(c, &name), 0);
    assert_eq!(read(&fresh, ino, 10, 3, size), vec![2u8; 3]);
}

fn locks_conflict_across_owners_and_sessions(c: &mut LocalCluster) {
    let name = volume(c);
    let (h1, h2) = (mount(c, &name), mount(c, &name));
    let (l1, l2) = (Locks::new(h1.clone()), Locks::new(h2.clone()));
    let ino = file(&h1);
    let (w, r, u) = (libc::F_WRLCK, libc::F_RDLCK, libc::F_UNLCK);
    l1.setlk(ino, 1, 0, 99, w, 11).unwrap();
    assert_eq!(
        l1.setlk(ino, 2, 50, 50, r, 12),
        Err(Errno::EAGAIN),
        "another owner"
    );
    assert_eq!(
        l2.setlk(ino, 1, 99, 200, r, 21),
        Err(Errno::EAGAIN),
        "another session"
    );
    l1.setlk(ino, 1, 50, 60, w, 11).unwrap();
    let info = l2.getlk(ino, 1, 0, u64::MAX, r, 21).unwrap();
    assert_eq!((info.start, info.end, info.typ, info.pid), (0, 99, w, 11));
    assert_eq!(
        l1.getlk(ino, 1, 0, 10, w, 11).unwrap().typ,
        u,
        "own locks never conflict"
    );
    // Unlock the middle: the split leaves 0..39 and 60..99.
    l1.setlk(ino, 1, 40, 59, u, 11).unwrap();
    l2.setlk(ino, 1, 40, 59, w, 21).unwrap();
    assert_eq!(l2.setlk(ino, 1, 60, 60, r, 21), Err(Errno::EAGAIN));
    // Shared locks share.
    l1.setlk(ino, 1, 0, 99, u, 11).unwrap();
    l1.setlk(ino, 1, 200, 300, r, 11).unwrap();
    l2.setlk(ino, 7, 250, 400, r, 21).unwrap();
    assert_eq!(l2.setlk(ino, 8, 300, 300, w, 22), Err(Errno::EAGAIN));
    assert_eq!(l1.setlk(ino, 1, 0, 0, 99, 11), Err(Errno::EINVAL));
    assert_eq!(l1.setlk(ino, 1, 5, 4, w, 11), Err(Errno::EINVAL));
    // The session hash says who holds locks on the inode.
    let field = format!("l:{ino:x}");
    let holds = |h: &Handle| -> bool {
        let key = format!("{{{}}}:s:{}", h.keys.name(), h.sid());
        h.pool
            .with(|con| {
                redis::cmd("HEXISTS")
                    .arg(&key)
                    .arg(&field)
                    .query::<i64>(con)
            })
            .unwrap()
            == 1
    };
    assert!(holds(&h1) && holds(&h2));
    l1.release_locks(ino, 1);
    assert!(!holds(&h1));
    l2.release_locks(ino, 1);
    l2.release_locks(ino, 7);
    assert!(!holds(&h2));
    let lock_key = format!("{{{name}}}:l:{ino:x}");
    let exists: i64 = h1
        .pool
        .with(|con| redis::cmd("EXISTS").arg(&lock_key).query(con))
        .unwrap();
    assert_eq!(exists, 0, "no lock left: no key");
    // Flocks are a family of their own.
    l1.setlk(ino, 1, 0, u64::MAX, w, 11).unwrap();
    l2.flock(ino, 5, w, None).unwrap();
    assert_eq!(l1.flock(ino, 6, r, None), Err(Errno::EAGAIN));
    l2.release_flock(ino, 5);
    l1.flock(ino, 6, r, None).unwrap();
    l1.release_flock(ino, 6);
    l1.release_locks(ino, 1);
}

/// A waiter parked on a conflict is granted when the holder unlocks (the
/// feed's call to `on_unlock` wakes it), and a cancelled one gets EINTR.
fn unlock_wakes_a_waiter(c: &mut LocalCluster) {
    let name = volume(c);
    let (h1, h2) = (mount(c, &name), mount(c, &name));
    let (l1, l2) = (Locks::new(h1.clone()), Locks::new(h2));
    let ino = file(&h1);
    l1.setlk(ino, 1, 0, 9, libc::F_WRLCK, 11).unwrap();
    let (tx, rx) = mpsc::channel();
    let tx2 = tx.clone();
    l2.setlkw(
        ino,
        2,
        5,
        5,
        libc::F_WRLCK,
        22,
        100,
        Box::new(move |r| tx.send((100, r)).unwrap()),
    );
    l2.setlkw(
        ino,
        3,
        0,
        0,
        libc::F_RDLCK,
        23,
        101,
        Box::new(move |r| tx2.send((101, r)).unwrap()),
    );
    assert!(l2.waiting() >= 2, "both parked");
    // A waiter being retried cannot be cancelled at that moment (the
    // kernel sends its interrupt again): poll, with a deadline.
    poll(
        || l2.cancel_lock_wait(ino, 101),
        "cancel of a parked waiter",
    );
    assert_eq!(rx.recv_timeout(T).unwrap(), (101, Err(Errno::EINTR)));
    assert!(!l2.cancel_lock_wait(ino, 101), "only once");
    l1.setlk(ino, 1, 0, 9, libc::F_UNLCK, 11).unwrap();
    // What the feed thread does on the `unlock` entry.
    l2.on_unlock(ino);
    assert_eq!(rx.recv_timeout(T).unwrap(), (100, Ok(())));
    poll(|| l2.waiting() == 0, "no waiter left");
    assert_eq!(
        l1.setlk(ino, 1, 5, 5, libc::F_RDLCK, 11),
        Err(Errno::EAGAIN),
        "granted: held"
    );
    let feed = feed_newest_first(&h1, &name);
    assert!(
        format!("{feed:?}").contains("unlock"),
        "an unlock feed entry"
    );
    l2.release_locks(ino, 2);
}

/// Closing (release_locks) frees the owner's locks for others, and ends
/// its parked requests with EINTR.
fn close_releases_locks(c: &mut LocalCluster) {
    let name = volume(c);
    let (h1, h2) = (mount(c, &name), mount(c, &name));
    let (l1, l2) = (Locks::new(h1.clone()), Locks::new(h2));
    let ino = file(&h1);
    l1.setlk(ino, 1, 0, u64::MAX, libc::F_WRLCK, 11).unwrap();
    let (tx, rx) = mpsc::channel();
    l2.setlkw(
        ino,
        4,
        0,
        0,
        libc::F_WRLCK,
        24,
        7,
        Box::new(move |r| tx.send(r).unwrap()),
    );
    l2.release_locks(ino, 4);
    assert_eq!(rx.recv_timeout(T).unwrap(), Err(Errno::EINTR));
    assert_eq!(
        l2.setlk(ino, 4, 0, 0, libc::F_RDLCK, 24),
        Err(Errno::EAGAIN)
    );
    l1.release_locks(ino, 1);
    l2.setlk(ino, 4, 0, 0, libc::F_RDLCK, 24).unwrap();
    l2.release_locks(ino, 4);
}

/// Kill the metadata master after an acknowledged sync: after the
/// failover every synced byte is there, for the same mount and a new one.
fn synced_data_survives_the_metadata_masters_death(c: &mut LocalCluster) {
    let name = volume(c);
    let h = mount(c, &name);
    let d = Data::new(h.clone(), 0);
    let ino = file(&h);
    let data: Vec<u8> = (0..12 * BS).map(|i| (i % 241) as u8).collect();
    d.write(ino, 0, &data, 0).unwrap();
    d.sync(ino).unwrap();
    let meta = c.master_of(h.keys.meta().as_bytes()).unwrap();
    c.kill(meta).unwrap();
    c.wait_healthy(Duration::from_secs(60)).unwrap();
    let after = c.master_of(h.keys.meta().as_bytes()).unwrap();
    assert_ne!(after, meta, "a replica took over");
    let size = data.len() as u64;
    assert_eq!(read(&d, ino, 0, data.len(), size), data, "the same mount");
    let fresh = Data::new(mount(c, &name), 0);
    assert_eq!(record_of(&h, ino).size, size);
    assert_eq!(read(&fresh, ino, 0, data.len(), size), data, "a new mount");
    // And the mount writes on.
    d.write(ino, 0, b"after", size).unwrap();
    d.flush(ino).unwrap();
    c.restart(meta).unwrap();
    c.wait_healthy(Duration::from_secs(60)).unwrap();
}

/// On a cluster without replicas an fsync has nothing to wait for: it
/// succeeds (decided from the topology), rather than failing for ever.
fn sync_without_replicas_does_not_wait() {
    let c = LocalCluster::start(Options {
        replicas: 0,
        ..Options::default()
    })
    .unwrap();
    let name = volume(&c);
    let h = mount(&c, &name);
    let d = Data::new(h.clone(), 1 << 20);
    let ino = file(&h);
    d.write(ino, 0, b"no replica", 0).unwrap();
    assert_eq!(d.sync(ino).unwrap().unwrap().size, 10);
}

// ---- diagnostics --------------------------------------------------------------------

/// The median of `n` runs of `f`, in µs.
fn median_us(n: usize, mut f: impl FnMut(usize)) -> f64 {
    let mut t: Vec<f64> = (0..n)
        .map(|i| {
            let s = Instant::now();
            f(i);
            s.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[n / 2]
}

/// Where 1 MiB reads and writes of the data layer spend their time, beside
/// raw SET and GET of 1 MiB (one key) and of 16 blocks of 64 KiB (one
/// cluster pipeline) on the same pool. On a shared machine only the ratios
/// of one run mean anything: this finds hot spots, it records no figure.
fn diag_data_path(c: &mut LocalCluster) {
    const MIB: usize = 1 << 20;
    const N: usize = 16;
    let bs = 65536u32;
    let name = volume_with(c, bs);
    let h = mount_with(c, &name, bs);
    let mib = vec![0x5au8; MIB];
    let blk = vec![0xa5u8; bs as usize];
    let raw_set = median_us(N, |i| {
        h.pool
            .with(|con| {
                redis::cmd("SET")
                    .arg(format!("raw{i}"))
                    .arg(&mib[..])
                    .exec(con)
            })
            .unwrap()
    });
    let raw_get = median_us(N, |i| {
        let v: Vec<u8> = h
            .pool
            .with(|con| redis::cmd("GET").arg(format!("raw{i}")).query(con))
            .unwrap();
        assert_eq!(v.len(), MIB);
    });
    let pipe_set = median_us(N, |i| {
        h.pool
            .with(|con| {
                let mut p = redis::cluster::cluster_pipe();
                for j in 0..16 {
                    p.cmd("SET").arg(format!("p{i}.{j}")).arg(&blk[..]).ignore();
                }
                p.exec(con)
            })
            .unwrap()
    });
    let pipe_get = median_us(N, |i| {
        let v: Vec<Vec<u8>> = h
            .pool
            .with(|con| {
                let mut p = redis::cluster::cluster_pipe();
                for j in 0..16 {
                    p.cmd("GET").arg(format!("p{i}.{j}"));
                }
                p.query(con)
            })
            .unwrap();
        assert_eq!(v.len(), 16);
    });
    // The same on connections with TCP_NODELAY (the pool's have Nagle on).
    let client = redis::cluster::ClusterClientBuilder::new(c.urls())
        .tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true))
        .build()
        .unwrap();
    let mut nd = client.get_connection().unwrap();
    let nd_set = median_us(N, |i| {
        redis::cmd("SET")
            .arg(format!("raw{i}"))
            .arg(&mib[..])
            .exec(&mut nd)
            .unwrap()
    });
    let nd_pipe_set = median_us(N, |i| {
        let mut p = redis::cluster::cluster_pipe();
        for j in 0..16 {
            p.cmd("SET").arg(format!("p{i}.{j}")).arg(&blk[..]).ignore();
        }
        p.exec(&mut nd).unwrap()
    });
    let nd_pipe_get = median_us(N, |i| {
        let mut p = redis::cluster::cluster_pipe();
        for j in 0..16 {
            p.cmd("GET").arg(format!("p{i}.{j}"));
        }
        let v: Vec<Vec<u8>> = p.query(&mut nd).unwrap();
        assert_eq!(v.len(), 16);
    });
    let d = Data::new(h.clone(), 1 << 30);
    let ino = file(&h);
    let mut size = 0;
    let write = median_us(N, |i| {
        size = d.write(ino, (i * MIB) as u64, &mib, size).unwrap();
    });
    let flush = median_us(N, |i| {
        d.write(ino, (i * MIB) as u64, &mib, size).unwrap();
        d.flush(ino).unwrap();
    });
    let sync = median_us(N, |i| {
        d.write(ino, (i * MIB) as u64, &mib, size).unwrap();
        d.sync(ino).unwrap();
    });
    let cached = median_us(N, |i| {
        let n = d
            .read_with(ino, (i * MIB) as u64, MIB, size, |p| {
                p.iter().map(|s| s.len()).sum::<usize>()
            })
            .unwrap();
        assert_eq!(n, MIB);
    });
    let cold = Data::new(mount_with(c, &name, bs), 0);
    let uncached = median_us(N, |i| {
        let n = cold
            .read_with(ino, (i * MIB) as u64, MIB, size, |p| {
                p.iter().map(|s| s.len()).sum::<usize>()
            })
            .unwrap();
        assert_eq!(n, MIB);
    });
    // Commands the masters ran for one 1 MiB write and flush over written
    // blocks, and for one uncached 1 MiB read: counts, not times.
    let before = command_counts(c);
    d.write(ino, 0, &mib, size).unwrap();
    d.flush(ino).unwrap();
    let flush_cmds = command_counts(c);
    let fresh = Data::new(mount_with(c, &name, bs), 0);
    fresh.read_with(ino, 0, MIB, size, |p| p.len()).unwrap();
    let read_cmds = command_counts(c);
    println!(
        "commands for a 1 MiB write + flush: {:?}",
        delta(&before, &flush_cmds)
    );
    println!(
        "commands for an uncached 1 MiB read: {:?}",
        delta(&flush_cmds, &read_cmds)
    );
    println!("loaded machine, medians of {N}, µs per MiB:");
    println!("  raw SET 1 MiB {raw_set:.0}, GET 1 MiB {raw_get:.0}");
    println!("  pipeline 16 x 64 KiB: SET {pipe_set:.0}, GET {pipe_get:.0}");
    println!(
        "  TCP_NODELAY: SET 1 MiB {nd_set:.0}, pipeline SET {nd_pipe_set:.0}, GET {nd_pipe_get:.0}"
    );
    println!("  Data::write (buffered) {write:.0}, write+flush {flush:.0}, write+sync {sync:.0}");
    println!("  Data::read_with cached {cached:.0}, uncached {uncached:.0}");
    println!(
        "  ratios: flush/pipe SET {:.2}, uncached/pipe GET {:.2}, uncached/raw GET {:.2}",
        flush / pipe_set,
        uncached / pipe_get,
        uncached / raw_get
    );
}

/// `INFO commandstats` calls per command, summed over the masters.
fn command_counts(c: &LocalCluster) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    for m in c.masters().unwrap() {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut connect(&c.addr(m), T).unwrap())
            .unwrap();
        for line in info.lines() {
            let Some((name, rest)) = line
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            let calls = rest
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            *out.entry(name.to_string()).or_default() += calls;
        }
    }
    out
}

/// What `after` counts beyond `before`, leaving out INFO itself.
fn delta(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> Vec<(String, u64)> {
    after
        .iter()
        .map(|(k, &v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(k, n)| *n > 0 && k != "info")
        .collect()
}
