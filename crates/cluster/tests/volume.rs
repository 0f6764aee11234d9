//! Mounted volumes (`Volume`) on a real local Redis Cluster: two `Volume`s
//! on one volume stand for two mounts.
//!
//! The same harness as tests/cluster.rs (`harness = false`): `main` starts
//! one cluster, runs each case under `catch_unwind`, and drops the cluster
//! whatever happened. `cargo test -p memfs-cluster --test volume -- NAME`
//! runs the cases whose name contains NAME. Every wait polls a condition
//! with a deadline and names what it waited for.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use common::watchdog;
use memfs_cluster::keys::Keys;
use memfs_cluster::local::{LocalCluster, Options};
use memfs_cluster::topology::connect;
use memfs_cluster::{Admin, Change, CreateOptions, Volume, VolumeOptions};
use memfs_fs::{
    AtimeMode, Config, Ctx, Errno, FileType, Fs, ROOT_INO, RenameFlags, SetAttr, XattrMode,
};

const T: Duration = Duration::from_secs(10);
/// How long a condition another mount brings about may take.
const DEADLINE: Duration = Duration::from_secs(20);

type Case = (&'static str, fn(&LocalCluster));

const CASES: &[Case] = &[
    ("namespace_basics", namespace_basics),
    ("same_name_at_once_one_wins", same_name_at_once_one_wins),
    ("rename_is_atomic", rename_is_atomic),
    (
        "changes_reach_the_other_mount",
        changes_reach_the_other_mount,
    ),
    (
        "unlinked_while_open_elsewhere",
        unlinked_while_open_elsewhere,
    ),
    (
        "a_fenced_session_changes_nothing",
        a_fenced_session_changes_nothing,
    ),
    ("out_of_memory_is_enospc", out_of_memory_is_enospc),
    ("errors_match_the_engine", errors_match_the_engine),
    ("close_ends_the_session", close_ends_the_session),
    (
        "a_lost_connection_drops_the_cache",
        a_lost_connection_drops_the_cache,
    ),
    (
        "modes_and_owners_match_the_engine",
        modes_and_owners_match_the_engine,
    ),
    ("one_script_per_change", one_script_per_change),
    (
        "another_mounts_change_ends_completeness",
        another_mounts_change_ends_completeness,
    ),
    (
        "threads_keep_a_directory_complete",
        threads_keep_a_directory_complete,
    ),
    (
        "closes_wait_for_the_others_acks",
        closes_wait_for_the_others_acks,
    ),
    ("a_lone_writer_pays_nothing", a_lone_writer_pays_nothing),
    (
        "a_reader_whose_feed_stopped_revalidates",
        a_reader_whose_feed_stopped_revalidates,
    ),
    (
        "clean_frees_only_what_no_map_names",
        clean_frees_only_what_no_map_names,
    ),
];

/// Not tests: run only when named in full (`-- diag_metadata_path`), they
/// print where the time of a create goes and assert nothing of it.
const DIAGNOSTICS: &[Case] = &[("diag_metadata_path", diag_metadata_path)];

fn main() {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    if let Some(&(name, diag)) = DIAGNOSTICS.iter().find(|d| filter.as_deref() == Some(d.0)) {
        let cluster = LocalCluster::start(Options::default()).expect("a local cluster");
        let ok = catch_unwind(AssertUnwindSafe(|| diag(&cluster))).is_ok();
        drop(cluster);
        println!("{name}: {}", if ok { "done" } else { "FAILED" });
        std::process::exit(i32::from(!ok));
    }
    let wanted = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));
    let (mut passed, mut failed) = (0, 0);
    let started = Instant::now();
    let cluster = match LocalCluster::start(Options::default()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cannot start a local Redis Cluster: {e} (run scripts/setup)");
            println!("0 passed, 1 failed");
            std::process::exit(1);
        }
    };
    println!("cluster up in {:.1?}", started.elapsed());
    let current = watchdog(Duration::from_secs(240));
    for &(name, case) in CASES.iter().filter(|c| wanted(c.0)) {
        let t = Instant::now();
        *current.lock().unwrap() = Some((name, t));
        let ok = catch_unwind(AssertUnwindSafe(|| case(&cluster))).is_ok();
        println!(
            "test {name} ... {} ({:.1?})",
            if ok { "ok" } else { "FAILED" },
            t.elapsed()
        );
        if ok { passed += 1 } else { failed += 1 }
    }
    *current.lock().unwrap() = None;
    drop(cluster);
    println!("{passed} passed, {failed} failed");
    std::process::exit(i32::from(failed > 0));
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A new volume on `c`, named after `what`.
fn new_volume(c: &LocalCluster, what: &str) -> String {
    let name = format!("{what}-{}", NEXT.fetch_add(1, Ordering::Relaxed));
    let name: String = name.chars().take(60).collect();
    Admin::with_timeout(&c.urls(), T)
        .unwrap()
        .create(&name, &CreateOptions::default())
        .unwrap();
    name
}

fn opts(lease: Duration) -> VolumeOptions {
    VolumeOptions {
        timeout: T,
        lease,
        mountpoint: "/test".into(),
        ..VolumeOptions::default()
    }
}

fn mount(c: &LocalCluster, name: &str) -> Arc<Volume> {
    Volume::open(&c.urls(), name, &opts(Duration::from_secs(2))).unwrap()
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn meta_node(c: &LocalCluster, name: &str) -> redis::Connection {
    let keys = Keys::new(name).unwrap();
    let m = c.master_of(keys.meta().as_bytes()).unwrap();
    connect(&c.addr(m), T).unwrap()
}

const R: Ctx = Ctx::ROOT;

fn names(v: &Volume, dir: u64) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    v.readdir(dir, 0, |e| {
        out.push(e.name.to_vec());
        true
    })
    .unwrap();
    out.sort();
    out
}

fn namespace_basics(c: &LocalCluster) {
    let name = new_volume(c, "basics");
    let v = mount(c, &name);
    let d = v.mkdir_umask(R, ROOT_INO, b"d", 0o755, 0o022).unwrap();
    assert_eq!((d.kind, d.perm, d.nlink), (FileType::Directory, 0o755, 2));
    assert_eq!(v.getattr(ROOT_INO).unwrap().nlink, 3);
    // What this mount made is cached: its stat and lookup ask nothing.
    let misses = v.status().cache_misses;
    assert_eq!(v.getattr(d.ino).unwrap().ino, d.ino);
    assert_eq!(v.lookup(ROOT_INO, b"d").unwrap().ino, d.ino);
    assert_eq!(v.status().cache_misses, misses, "a cached stat missed");
    let (f, created) = v.create_umask(R, d.ino, b"f", 0o666, true, 0o022).unwrap();
    assert!(created);
    assert_eq!(f.perm, 0o644);
    assert_eq!(
        v.write_as(R, &|_| true, false, f.ino, 0, b"hello", false),
        Ok(5)
    );
    let mut buf = [0; 16];
    assert_eq!(v.read_atime(f.ino, 0, &mut buf, AtimeMode::Never), Ok(5));
    assert_eq!(&buf[..5], b"hello");
    assert_eq!(v.getattr(f.ino).unwrap().size, 5);
    v.release(f.ino);
    assert_eq!(v.lookup(d.ino, b"f").unwrap().ino, f.ino);
    assert_eq!(v.lookup(d.ino, b"..").unwrap().ino, ROOT_INO);
    let s = v.symlink(R, d.ino, b"s", b"f").unwrap();
    assert_eq!(v.readlink(s.ino).unwrap(), b"f");
    let l = v.link(f.ino, ROOT_INO, b"hard").unwrap();
    assert_eq!(l.nlink, 2);
    v.rename(d.ino, b"f", ROOT_INO, b"moved", RenameFlags::default())
        .unwrap();
    assert_eq!(
        names(&v, d.ino),
        vec![b".".to_vec(), b"..".to_vec(), b"s".to_vec()]
    );
    assert_eq!(v.lookup(d.ino, b"f"), Err(Errno::ENOENT));
    v.setxattr_as(R, &|_| true, f.ino, b"user.a", b"1", XattrMode::Create)
        .unwrap();
    assert_eq!(v.getxattr(f.ino, b"user.a").unwrap(), b"1");
    assert_eq!(v.listxattr(f.ino).unwrap(), b"user.a\0");
    let set = SetAttr {
        mode: Some(0o4755),
        ..SetAttr::default()
    };
    assert_eq!(
        v.setattr_as(R, &|_| true, f.ino, &set).unwrap().perm,
        0o4755
    );
    let chown = SetAttr {
        uid: Some(7),
        ..SetAttr::default()
    };
    let a = v.setattr_as(R, &|_| true, f.ino, &chown).unwrap();
    assert_eq!((a.uid, a.perm), (7, 0o755), "chown drops setuid");
    let trunc = SetAttr {
        size: Some(2),
        ..SetAttr::default()
    };
    assert_eq!(v.setattr_as(R, &|_| true, f.ino, &trunc).unwrap().size, 2);
    assert_eq!(v.read_atime(f.ino, 0, &mut buf, AtimeMode::Never), Ok(2));
    v.unlink(ROOT_INO, b"moved").unwrap();
    v.unlink(ROOT_INO, b"hard").unwrap();
    assert_eq!(
        v.getattr(f.ino),
        Err(Errno::ENOENT),
        "freed with its last link"
    );
    // Long listings keep their offsets when continued.
    for i in 0..300 {
        v.mknod_umask(R, d.ino, format!("n{i}").as_bytes(), 0o644, 0, 0)
            .unwrap();
    }
    let mut seen = Vec::new();
    let mut off = 0;
    loop {
        let mut batch = Vec::new();
        v.readdir(d.ino, off, |e| {
            batch.push((e.name.to_vec(), e.offset));
            batch.len() < 7
        })
        .unwrap();
        let Some(&(_, last)) = batch.last() else {
            break;
        };
        off = last;
        seen.extend(batch.into_iter().map(|(n, _)| n));
    }
    assert_eq!(seen.len(), 303, "., .., s and 300");
    let mut plus = Vec::new();
    v.readdirplus(d.ino, 0, |e, a| {
        assert_eq!(e.ino, a.ino, "{:?}", String::from_utf8_lossy(e.name));
        plus.push((e.name.to_vec(), a.kind));
        true
    })
    .unwrap();
    assert_eq!(plus.len(), 303);
    assert!(plus.contains(&(b"s".to_vec(), FileType::Symlink)));
    assert!(plus.contains(&(b"n7".to_vec(), FileType::RegularFile)));
    v.close().unwrap();
}

fn same_name_at_once_one_wins(c: &LocalCluster) {
    let name = new_volume(c, "race");
    let (a, b) = (mount(c, &name), mount(c, &name));
    for round in 0..20 {
        let n = format!("f{round}");
        let barrier = Arc::new(Barrier::new(2));
        let threads: Vec<_> = [a.clone(), b.clone()]
            .into_iter()
            .map(|v| {
                let (n, barrier) = (n.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    let r = if round % 2 == 0 {
                        v.create_umask(R, ROOT_INO, n.as_bytes(), 0o644, true, 0)
                            .map(|(a, _)| a.ino)
                    } else {
                        v.mkdir_umask(R, ROOT_INO, n.as_bytes(), 0o755, 0)
                            .map(|a| a.ino)
                    };
                    if let Ok(ino) = r
                        && round % 2 == 0
                    {
                        v.release(ino);
                    }
                    r
                })
            })
            .collect();
        let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let wins = results.iter().filter(|r| r.is_ok()).count();
        let exists = results.iter().filter(|r| **r == Err(Errno::EEXIST)).count();
        assert_eq!((wins, exists), (1, 1), "round {round}: {results:?}");
    }
    // Once the feed brought B's wins: ten directories, each made once.
    wait_until("the root to show ten directories", || {
        a.getattr(ROOT_INO).unwrap().nlink == 2 + 10
    });
    let mut node = meta_node(c, &name);
    let entries: u64 = redis::cmd("HLEN")
        .arg(format!("{{{name}}}:d:1"))
        .query(&mut node)
        .unwrap();
    assert_eq!(entries, 20, "each name made once");
}

fn rename_is_atomic(c: &LocalCluster) {
    let name = new_volume(c, "rename");
    let (a, b) = (mount(c, &name), mount(c, &name));
    let d = a.mkdir_umask(R, ROOT_INO, b"d", 0o755, 0).unwrap();
    a.mknod_umask(R, d.ino, b"x", 0o644, 0, 0).unwrap();
    a.mknod_umask(R, d.ino, b"y", 0o644, 0, 0).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (a2, stop2) = (a.clone(), stop.clone());
    let mover = std::thread::spawn(move || {
        let mut n = 0;
        while !stop2.load(Ordering::Relaxed) {
            let (from, to): (&[u8], &[u8]) = if n % 2 == 0 {
                (b"x", b"z")
            } else {
                (b"z", b"x")
            };
            a2.rename(d.ino, from, d.ino, to, RenameFlags::default())
                .unwrap();
            let ex = RenameFlags {
                exchange: true,
                ..RenameFlags::default()
            };
            a2.rename(d.ino, to, d.ino, b"y", ex).unwrap();
            n += 1;
        }
        n
    });
    // Every listing B takes is one state: two names, never one or three.
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut listings = 0;
    while Instant::now() < deadline {
        let seen = names(&b, d.ino);
        assert_eq!(seen.len(), 4, "a listing mid-rename: {seen:?}");
        listings += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let renames = mover.join().unwrap();
    assert!(renames > 0 && listings > 0);
    let noreplace = RenameFlags {
        noreplace: true,
        ..RenameFlags::default()
    };
    assert_eq!(
        b.rename(d.ino, b"y", d.ino, b"y", noreplace),
        Err(Errno::EEXIST)
    );
}

fn changes_reach_the_other_mount(c: &LocalCluster) {
    let name = new_volume(c, "feed");
    let (a, b) = (mount(c, &name), mount(c, &name));
    let changes: Arc<Mutex<Vec<Change>>> = Arc::default();
    let seen = changes.clone();
    b.on_change(Box::new(move |ch| seen.lock().unwrap().push(ch)));
    assert_eq!(
        b.lookup(ROOT_INO, b"f"),
        Err(Errno::ENOENT),
        "cached as absent"
    );
    let (f, _) = a.create_umask(R, ROOT_INO, b"f", 0o644, true, 0).unwrap();
    a.write_as(R, &|_| true, false, f.ino, 0, b"one", false)
        .unwrap();
    a.flush(f.ino).unwrap();
    wait_until("B to see the new name", || b.lookup(ROOT_INO, b"f").is_ok());
    let mut buf = [0; 8];
    assert_eq!(b.read_atime(f.ino, 0, &mut buf, AtimeMode::Never), Ok(3));
    assert_eq!(&buf[..3], b"one");
    a.write_as(R, &|_| true, false, f.ino, 0, b"two!", false)
        .unwrap();
    a.flush(f.ino).unwrap();
    wait_until("B to see the new size", || {
        b.getattr(f.ino).is_ok_and(|x| x.size == 4)
    });
    assert_eq!(b.read_atime(f.ino, 0, &mut buf, AtimeMode::Never), Ok(4));
    assert_eq!(&buf[..4], b"two!");
    wait_until("B's callback to hear of the entry", || {
        changes.lock().unwrap().contains(&Change::Entry {
            parent: ROOT_INO,
            name: b"f".to_vec(),
        })
    });
    a.release(f.ino);
    let set = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    a.setattr_as(R, &|_| true, f.ino, &set).unwrap();
    wait_until("B to see the new mode", || {
        b.getattr(f.ino).is_ok_and(|x| x.perm == 0o600)
    });
    a.unlink(ROOT_INO, b"f").unwrap();
    wait_until("B to see the name go", || {
        b.lookup(ROOT_INO, b"f") == Err(Errno::ENOENT)
    });
    assert!(b.status().cache_hits > 0);
}

fn unlinked_while_open_elsewhere(c: &LocalCluster) {
    let name = new_volume(c, "orphan");
    let (a, b) = (mount(c, &name), mount(c, &name));
    let keys = Keys::new(&name).unwrap();
    let mut node = meta_node(c, &name);
    let (f, _) = a.create_umask(R, ROOT_INO, b"f", 0o644, true, 0).unwrap();
    a.write_as(R, &|_| true, false, f.ino, 0, b"kept", false)
        .unwrap();
    wait_until("B to see f", || b.lookup(ROOT_INO, b"f").is_ok());
    b.unlink(ROOT_INO, b"f").unwrap();
    assert_eq!(b.lookup(ROOT_INO, b"f"), Err(Errno::ENOENT));
    let field = format!("o:{:x}", f.ino);
    let session = format!("{{{name}}}:s:{}", a.status().session);
    wait_until("A to hold the orphan", || {
        redis::cmd("HEXISTS")
            .arg(&session)
            .arg(&field)
            .query::<bool>(&mut node)
            .unwrap()
    });
    // Past the grace (one lease) and some renewals: still there, as A holds it.
    let orphans = format!("{{{name}}}:orphans");
    let since: u64 = redis::cmd("ZSCORE")
        .arg(&orphans)
        .arg(f.ino)
        .query(&mut node)
        .unwrap();
    wait_until("the grace to pass by the server's clock", || {
        let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut node).unwrap();
        s * 1000 + us / 1000 > since + 3 * 2000
    });
    let mut buf = [0; 8];
    assert_eq!(a.read_atime(f.ino, 0, &mut buf, AtimeMode::Never), Ok(4));
    assert_eq!(&buf[..4], b"kept");
    assert_eq!(
        a.write_as(R, &|_| true, false, f.ino, 4, b"!", false),
        Ok(1)
    );
    assert_eq!(a.getattr(f.ino).unwrap().nlink, 0);
    a.release(f.ino);
    let rec = keys.records(f.ino);
    let map = format!("{{{name}}}:c:{:x}", f.ino);
    wait_until("the orphan to be freed after the last close", || {
        let r: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(&rec)
            .arg(&Keys::record_field(f.ino)[..])
            .query(&mut node)
            .unwrap();
        let m: bool = redis::cmd("EXISTS").arg(&map).query(&mut node).unwrap();
        r.is_none() && !m
    });
    let left: u64 = redis::cmd("ZCARD").arg(&orphans).query(&mut node).unwrap();
    assert_eq!(left, 0);
}

fn a_fenced_session_changes_nothing(c: &LocalCluster) {
    let name = new_volume(c, "fence");
    // A long lease: its renewal does not come during the case.
    let v = Volume::open(&c.urls(), &name, &opts(Duration::from_secs(600))).unwrap();
    v.mkdir_umask(R, ROOT_INO, b"before", 0o755, 0).unwrap();
    let sid = v.status().session;
    let mut node = meta_node(c, &name);
    let _: () = redis::cmd("ZADD")
        .arg(format!("{{{name}}}:sessions"))
        .arg(1)
        .arg(sid)
        .query(&mut node)
        .unwrap();
    assert_eq!(
        v.mkdir_umask(R, ROOT_INO, b"after", 0o755, 0),
        Err(Errno::ESTALE)
    );
    assert_eq!(v.unlink(ROOT_INO, b"before"), Err(Errno::ESTALE));
    assert_eq!(
        v.rename(ROOT_INO, b"before", ROOT_INO, b"x", RenameFlags::default()),
        Err(Errno::ESTALE)
    );
    let other = mount(c, &name);
    assert_eq!(other.lookup(ROOT_INO, b"after"), Err(Errno::ENOENT));
    assert!(other.lookup(ROOT_INO, b"before").is_ok());
    assert_eq!(other.getattr(ROOT_INO).unwrap().nlink, 3);
}

/// Puts the metadata master's maxmemory back, whatever the case did.
struct RestoreMemory(redis::Connection);

impl Drop for RestoreMemory {
    fn drop(&mut self) {
        let r: redis::RedisResult<()> = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg("256mb")
            .query(&mut self.0);
        r.expect("restore maxmemory");
    }
}

fn out_of_memory_is_enospc(c: &LocalCluster) {
    let name = new_volume(c, "oom");
    let v = mount(c, &name);
    let d = v.mkdir_umask(R, ROOT_INO, b"d", 0o755, 0).unwrap();
    let before = v.getattr(ROOT_INO).unwrap();
    let mut node = meta_node(c, &name);
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query(&mut node)
        .unwrap();
    let restore = RestoreMemory(node);
    assert_eq!(
        v.mkdir_umask(R, ROOT_INO, b"full", 0o755, 0).map(drop),
        Err(Errno::ENOSPC)
    );
    assert_eq!(
        v.create_umask(R, d.ino, b"f", 0o644, true, 0).map(drop),
        Err(Errno::ENOSPC)
    );
    assert_eq!(
        v.rename(ROOT_INO, b"d", ROOT_INO, b"e", RenameFlags::default()),
        Err(Errno::ENOSPC)
    );
    drop(restore);
    let other = mount(c, &name);
    assert_eq!(other.lookup(ROOT_INO, b"full"), Err(Errno::ENOENT));
    assert_eq!(other.lookup(d.ino, b"f"), Err(Errno::ENOENT));
    assert_eq!(other.lookup(ROOT_INO, b"d").unwrap().ino, d.ino);
    let after = other.getattr(ROOT_INO).unwrap();
    assert_eq!((after.nlink, after.mtime), (before.nlink, before.mtime));
    v.mkdir_umask(R, ROOT_INO, b"full", 0o755, 0).unwrap();
}

/// One namespace operation, run the same way on the engine and a volume.
enum Op {
    Mkdir(&'static str),
    Create(&'static str),
    Symlink(&'static str, &'static [u8]),
    Link(&'static str, &'static str),
    Unlink(&'static str),
    Rmdir(&'static str),
    Rename(&'static str, &'static str, u32),
    Lookup(&'static str),
    Readlink(&'static str),
    Truncate(&'static str, u64),
    SetX(&'static str, &'static [u8], XattrMode),
    GetX(&'static str, &'static [u8]),
    RemoveX(&'static str, &'static [u8]),
}

/// The tree both sides share, enough of it to name nodes by path.
trait Ns {
    fn lookup(&self, p: u64, n: &[u8]) -> memfs_fs::Result<(u64, FileType, u32)>;
    fn run(
        &self,
        p: u64,
        n: &[u8],
        op: &Op,
        other: Option<(u64, u64, Vec<u8>)>,
    ) -> memfs_fs::Result<()>;
}

fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

/// `(parent ino, name)` of `path`, walking from the root.
fn resolve(t: &dyn Ns, path: &str) -> memfs_fs::Result<(u64, Vec<u8>)> {
    let (dir, name) = split(path);
    let mut ino = ROOT_INO;
    for part in dir.split('/').filter(|p| !p.is_empty()) {
        ino = t.lookup(ino, part.as_bytes())?.0;
    }
    Ok((ino, name.as_bytes().to_vec()))
}

fn apply(t: &dyn Ns, op: &Op) -> memfs_fs::Result<()> {
    let path = match op {
        Op::Mkdir(p) | Op::Create(p) | Op::Symlink(p, _) | Op::Unlink(p) | Op::Rmdir(p) => p,
        Op::Link(p, _) | Op::Rename(p, _, _) | Op::Lookup(p) | Op::Readlink(p) => p,
        Op::Truncate(p, _) | Op::SetX(p, _, _) | Op::GetX(p, _) | Op::RemoveX(p, _) => p,
    };
    let (p, n) = resolve(t, path)?;
    let other = match op {
        Op::Link(_, to) | Op::Rename(_, to, _) => {
            let (p2, n2) = resolve(t, to)?;
            Some((0, p2, n2))
        }
        _ => None,
    };
    t.run(p, &n, op, other)
}

struct Engine(Fs);

impl Ns for Engine {
    fn lookup(&self, p: u64, n: &[u8]) -> memfs_fs::Result<(u64, FileType, u32)> {
        self.0.lookup_noref(p, n).map(|a| (a.ino, a.kind, a.nlink))
    }

    fn run(
        &self,
        p: u64,
        n: &[u8],
        op: &Op,
        other: Option<(u64, u64, Vec<u8>)>,
    ) -> memfs_fs::Result<()> {
        let fs = &self.0;
        let node = || fs.lookup_noref(p, n).map(|a| a.ino);
        match op {
            Op::Mkdir(_) => fs.mkdir_umask(R, p, n, 0o755, 0).map(drop),
            Op::Create(_) => fs.mknod_umask(R, p, n, 0o644, 0, 0).map(drop),
            Op::Symlink(_, t) => fs.symlink(R, p, n, t).map(drop),
            Op::Link(..) => {
                let (_, p2, n2) = other.unwrap();
                fs.link(node()?, p2, &n2).map(drop)
            }
            Op::Unlink(_) => fs.unlink(p, n),
            Op::Rmdir(_) => fs.rmdir(p, n),
            Op::Rename(_, _, flags) => {
                let (_, p2, n2) = other.unwrap();
                fs.rename(p, n, p2, &n2, RenameFlags::from_bits(*flags)?)
            }
            Op::Lookup(_) => node().map(drop),
            Op::Readlink(_) => fs.readlink(node()?).map(drop),
            Op::Truncate(_, s) => {
                let set = SetAttr {
                    size: Some(*s),
                    ..SetAttr::default()
                };
                fs.setattr(R, node()?, &set).map(drop)
            }
            Op::SetX(_, x, m) => fs.setxattr(node()?, x, b"v", *m),
            Op::GetX(_, x) => fs.getxattr(node()?, x).map(drop),
            Op::RemoveX(_, x) => fs.removexattr(node()?, x),
        }
    }
}

impl Ns for Volume {
    fn lookup(&self, p: u64, n: &[u8]) -> memfs_fs::Result<(u64, FileType, u32)> {
        Volume::lookup(self, p, n).map(|a| (a.ino, a.kind, a.nlink))
    }

    fn run(
        &self,
        p: u64,
        n: &[u8],
        op: &Op,
        other: Option<(u64, u64, Vec<u8>)>,
    ) -> memfs_fs::Result<()> {
        let node = || Volume::lookup(self, p, n).map(|a| a.ino);
        match op {
            Op::Mkdir(_) => self.mkdir_umask(R, p, n, 0o755, 0).map(drop),
            Op::Create(_) => self.mknod_umask(R, p, n, 0o644, 0, 0).map(drop),
            Op::Symlink(_, t) => self.symlink(R, p, n, t).map(drop),
            Op::Link(..) => {
                let (_, p2, n2) = other.unwrap();
                self.link(node()?, p2, &n2).map(drop)
            }
            Op::Unlink(_) => self.unlink(p, n),
            Op::Rmdir(_) => self.rmdir(p, n),
            Op::Rename(_, _, flags) => {
                let (_, p2, n2) = other.unwrap();
                Volume::rename(self, p, n, p2, &n2, RenameFlags::from_bits(*flags)?)
            }
            Op::Lookup(_) => node().map(drop),
            Op::Readlink(_) => self.readlink(node()?).map(drop),
            Op::Truncate(_, s) => {
                let set = SetAttr {
                    size: Some(*s),
                    ..SetAttr::default()
                };
                self.setattr_as(R, &|_| true, node()?, &set).map(drop)
            }
            Op::SetX(_, x, m) => self.setxattr_as(R, &|_| true, node()?, x, b"v", *m),
            Op::GetX(_, x) => self.getxattr(node()?, x).map(drop),
            Op::RemoveX(_, x) => self.removexattr(node()?, x),
        }
    }
}

const NOREPLACE: u32 = libc::RENAME_NOREPLACE;
const EXCHANGE: u32 = libc::RENAME_EXCHANGE;

fn sequence() -> Vec<Op> {
    use Op::*;
    const LONG: &str = "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn";
    vec![
        Mkdir("d"),
        Mkdir("d"),
        Create("d/f"),
        Create("d/f"),
        Mkdir(LONG),
        Create("d/."),
        Mkdir("d/.."),
        Lookup("d/nope"),
        Lookup("d/f/x"),
        Rmdir("d"),
        Unlink("d"),
        Rmdir("d/f"),
        Unlink("d/nope"),
        Rmdir("d/."),
        Rmdir("d/.."),
        Unlink("d/.."),
        Symlink("d/s", b""),
        Symlink("d/s", b"f"),
        Readlink("d/s"),
        Readlink("d/f"),
        Link("d", "d/dlink"),
        Link("d/f", "d/g"),
        Link("d/f", "d/g"),
        Link("d/f", "nodir/g"),
        Rename("d/f", "d/g", 0),
        Rename("d/g", "d/s", NOREPLACE),
        Rename("d/g", "d/none", EXCHANGE),
        Rename("d/.", "d/x", 0),
        Rename("d/g", "d/g", NOREPLACE | EXCHANGE),
        Mkdir("e"),
        Mkdir("e/sub"),
        Rename("d/g", "e", 0),
        Rename("e", "d/s", 0),
        Rename("e", "e/sub/deeper", 0),
        Rename("d", "e", 0),
        Rename("e/sub", "e", 0),
        Rename("d", "e/sub", 0),
        Lookup("e/sub/s"),
        Rename("e/sub", "zz", EXCHANGE),
        Mkdir("zz"),
        Rename("e/sub", "zz", EXCHANGE),
        Rename("zz/s", "e/s2", 0),
        Rmdir("e"),
        Rmdir("e/sub"),
        Truncate("zz", 0),
        Truncate("e/s2", 0),
        Create("zz/t"),
        Truncate("zz/t", 100),
        SetX("zz/t", b"user.a", XattrMode::Replace),
        SetX("zz/t", b"user.a", XattrMode::Create),
        SetX("zz/t", b"user.a", XattrMode::Create),
        SetX("zz/t", b"user.a", XattrMode::Replace),
        SetX("zz/t", b"bogus.a", XattrMode::Any),
        SetX("zz/t", b"", XattrMode::Any),
        SetX("e/s2", b"user.a", XattrMode::Any),
        SetX("e/s2", b"trusted.a", XattrMode::Any),
        GetX("zz/t", b"user.b"),
        GetX("zz/t", b"user.a"),
        RemoveX("zz/t", b"user.b"),
        RemoveX("zz/t", b"user.a"),
        GetX("zz/t", b"user.a"),
        Unlink("zz/t"),
        Lookup("zz/t"),
        Rmdir("zz"),
    ]
}

fn errors_match_the_engine(c: &LocalCluster) {
    let name = new_volume(c, "diff");
    let v = mount(c, &name);
    let fs = Engine(Fs::new(Config::default()));
    let mut wrong = Vec::new();
    let mut errnos = std::collections::HashSet::new();
    let mut oks = 0;
    for (i, op) in sequence().iter().enumerate() {
        let (want, got) = (apply(&fs, op), apply(&*v, op));
        if want != got {
            wrong.push(format!("op {i}: engine {want:?}, volume {got:?}"));
        }
        match want {
            Ok(()) => oks += 1,
            Err(e) => {
                errnos.insert(e.name());
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The sequence means something: both succeed and fail, in many ways.
    assert!(oks >= 20 && errnos.len() >= 10, "{oks} ok, {errnos:?}");
    // And the trees agree where they ended: every name, type and link count.
    fn walk(t: &dyn Ns, list: &dyn Fn(u64) -> Vec<Vec<u8>>, dir: u64, out: &mut Vec<String>) {
        for n in list(dir) {
            if n == b"." || n == b".." {
                continue;
            }
            let (ino, kind, nlink) = t.lookup(dir, &n).unwrap();
            out.push(format!(
                "{dir}/{} {kind:?} {nlink}",
                String::from_utf8_lossy(&n)
            ));
            if kind == FileType::Directory {
                walk(t, list, ino, out);
            }
        }
    }
    let list_fs = |d: u64| {
        let mut o = Vec::new();
        fs.0.readdir(d, 0, |e| {
            o.push(e.name.to_vec());
            true
        })
        .unwrap();
        o.sort();
        o
    };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    walk(&fs, &list_fs, ROOT_INO, &mut a);
    walk(&*v, &|d| names(&v, d), ROOT_INO, &mut b);
    let strip = |v: Vec<String>| -> Vec<String> {
        v.into_iter()
            .map(|s| s.split_once('/').map(|x| x.1.to_string()).unwrap_or(s))
            .collect()
    };
    assert_eq!(strip(a), strip(b));
    assert_eq!(
        fs.0.getattr(ROOT_INO).unwrap().nlink,
        v.getattr(ROOT_INO).unwrap().nlink
    );
}

fn close_ends_the_session(c: &LocalCluster) {
    let name = new_volume(c, "close");
    let v = mount(c, &name);
    let sid = v.status().session;
    assert!(v.status().lease_ok);
    let mut node = meta_node(c, &name);
    let score: Option<u64> = redis::cmd("ZSCORE")
        .arg(format!("{{{name}}}:sessions"))
        .arg(sid)
        .query(&mut node)
        .unwrap();
    assert!(score.is_some());
    v.close().unwrap();
    let score: Option<u64> = redis::cmd("ZSCORE")
        .arg(format!("{{{name}}}:sessions"))
        .arg(sid)
        .query(&mut node)
        .unwrap();
    assert_eq!(score, None);
    let exists: bool = redis::cmd("EXISTS")
        .arg(format!("{{{name}}}:s:{sid}"))
        .query(&mut node)
        .unwrap();
    assert!(!exists);
    v.close().unwrap();
    // A session that dies without closing is reaped by another's renewal:
    // its locks go (the contract's `l:` fields), and an orphan only it held
    // is freed.
    let alive = mount(c, &name);
    let dead = mount(c, &name);
    let dsid = dead.status().session;
    let (f, _) = dead
        .create_umask(R, ROOT_INO, b"f", 0o644, true, 0)
        .unwrap();
    dead.write_as(R, &|_| true, false, f.ino, 0, b"x", false)
        .unwrap();
    dead.unlink(ROOT_INO, b"f").unwrap();
    // Its process dies holding the orphan: the hold stays in its session,
    // and the mount itself (still running here) has nothing open.
    dead.release(f.ino);
    let _: () = redis::cmd("HSET")
        .arg(format!("{{{name}}}:s:{dsid}"))
        .arg(format!("o:{:x}", f.ino))
        .arg(1)
        .query(&mut node)
        .unwrap();
    let locks = format!("{{{name}}}:l:{:x}", f.ino);
    let other = format!("{}:9", alive.status().session);
    let _: () = redis::cmd("HSET")
        .arg(&locks)
        .arg(format!("{dsid}:7"))
        .arg("dead's")
        .arg(&other)
        .arg("alive's")
        .query(&mut node)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(format!("{{{name}}}:s:{dsid}"))
        .arg(format!("l:{:x}", f.ino))
        .arg(1)
        .query(&mut node)
        .unwrap();
    let held: bool = redis::cmd("HEXISTS")
        .arg(format!("{{{name}}}:s:{dsid}"))
        .arg(format!("o:{:x}", f.ino))
        .query(&mut node)
        .unwrap();
    assert!(held, "the dead session holds the orphan");
    let _: () = redis::cmd("ZADD")
        .arg(format!("{{{name}}}:sessions"))
        .arg(1)
        .arg(dsid)
        .query(&mut node)
        .unwrap();
    wait_until("the dead session to be reaped", || {
        !redis::cmd("EXISTS")
            .arg(format!("{{{name}}}:s:{dsid}"))
            .query::<bool>(&mut node)
            .unwrap()
    });
    let fields: Vec<String> = redis::cmd("HKEYS").arg(&locks).query(&mut node).unwrap();
    // The orphan's freeing deletes its lock hash too; until then only the
    // live session's lock may be left.
    assert!(fields.iter().all(|f| *f == other), "{fields:?}");
    wait_until("the orphan only the dead session held to be freed", || {
        alive.getattr(f.ino) == Err(Errno::ENOENT)
            && redis::cmd("ZCARD")
                .arg(format!("{{{name}}}:orphans"))
                .query::<u64>(&mut node)
                .unwrap()
                == 0
    });
}

fn a_lost_connection_drops_the_cache(c: &LocalCluster) {
    let name = new_volume(c, "lost");
    let (a, b) = (mount(c, &name), mount(c, &name));
    let changes: Arc<Mutex<Vec<Change>>> = Arc::default();
    let seen = changes.clone();
    b.on_change(Box::new(move |ch| seen.lock().unwrap().push(ch)));
    let d = a.mkdir_umask(R, ROOT_INO, b"d", 0o755, 0).unwrap();
    wait_until("B to see d", || b.lookup(ROOT_INO, b"d").is_ok());
    // B's reader has connected and read (a lookup is a script of its own:
    // on a loaded machine the reader's thread could connect only after the
    // kill below, and a first connection has missed nothing to report).
    wait_until("B's feed to be caught up", || b.cache_trusted());
    // Every client of the metadata master loses its connection (the feed's
    // and the pools' alike), as when the master restarts.
    let mut node = meta_node(c, &name);
    let _: redis::Value = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query(&mut node)
        .unwrap();
    wait_until("B's feed to report everything changed", || {
        changes.lock().unwrap().contains(&Change::All)
    });
    // Both mounts carry on: a failed call at most, then answers again.
    wait_until("A to make a name again", || {
        // EEXIST: an earlier try made it, and its reply was what got lost.
        matches!(
            a.mkdir_umask(R, d.ino, b"again", 0o755, 0),
            Ok(_) | Err(Errno::EEXIST)
        )
    });
    wait_until("B to see it", || b.lookup(d.ino, b"again").is_ok());
}

/// The setgid inheritance of new nodes and the setuid/setgid a truncate,
/// a chown or a write drops: the volume's scripts against the engine.
fn modes_and_owners_match_the_engine(c: &LocalCluster) {
    let name = new_volume(c, "modes");
    let v = mount(c, &name);
    let fs = Fs::new(Config::default());
    let user = Ctx {
        uid: 1000,
        gid: 1000,
        pid: 1,
    };
    let no_groups = |_: u32| false;
    let mut got = Vec::new();
    let mut want = Vec::new();
    let chmod = |m: u32| SetAttr {
        mode: Some(m),
        ..SetAttr::default()
    };
    // A setgid directory of group 50: children take the group, subdirectories the bit.
    let vd = v.mkdir_umask(R, ROOT_INO, b"sg", 0o777, 0).unwrap().ino;
    let fd = fs.mkdir_umask(R, ROOT_INO, b"sg", 0o777, 0).unwrap().ino;
    let to50 = SetAttr {
        gid: Some(50),
        mode: Some(0o2777),
        ..SetAttr::default()
    };
    v.setattr_as(R, &|_| true, vd, &to50).unwrap();
    fs.setattr(R, fd, &to50).unwrap();
    let va = v.mkdir_umask(user, vd, b"sub", 0o755, 0).unwrap();
    let fa = fs.mkdir_umask(user, fd, b"sub", 0o755, 0).unwrap();
    got.push((va.perm, va.gid));
    want.push((fa.perm, fa.gid));
    let va = v.mknod_umask(user, vd, b"f", 0o2755, 0, 0).unwrap();
    let fa = fs.mknod_umask(user, fd, b"f", 0o2755, 0, 0).unwrap();
    got.push((va.perm, va.gid));
    want.push((fa.perm, fa.gid));
    // A setuid+setgid file of the user's: truncate, write, chown by the user.
    for (i, kind) in ["truncate", "write", "chown"].into_iter().enumerate() {
        let n = format!("p{i}");
        let vf = v
            .mknod_umask(user, ROOT_INO, n.as_bytes(), 0o644, 0, 0)
            .unwrap()
            .ino;
        let ff = fs
            .mknod_umask(user, ROOT_INO, n.as_bytes(), 0o644, 0, 0)
            .unwrap()
            .ino;
        v.setattr_as(R, &|_| true, vf, &chmod(0o6775)).unwrap();
        fs.setattr(R, ff, &chmod(0o6775)).unwrap();
        match kind {
            "truncate" => {
                let t = SetAttr {
                    size: Some(1),
                    ..SetAttr::default()
                };
                v.setattr_as(user, &no_groups, vf, &t).unwrap();
                fs.setattr_as(user, &no_groups, ff, &t).unwrap();
            }
            "write" => {
                v.write_as(user, &no_groups, true, vf, 0, b"x", false)
                    .unwrap();
                fs.write_as(user, &no_groups, true, ff, 0, b"x", false)
                    .unwrap();
            }
            _ => {
                let o = SetAttr {
                    gid: Some(1000),
                    ..SetAttr::default()
                };
                v.setattr_as(user, &no_groups, vf, &o).unwrap();
                fs.setattr_as(user, &no_groups, ff, &o).unwrap();
            }
        }
        let (va, fa) = (v.getattr(vf).unwrap(), fs.getattr(ff).unwrap());
        got.push((va.perm, va.gid));
        want.push((fa.perm, fa.gid));
    }
    assert_eq!(got, want, "(perm, gid): volume, engine");
    // The cases mean something: the bit was inherited, and dropped.
    assert_eq!(
        want[0],
        (0o2755, 50),
        "a subdirectory of a setgid directory"
    );
    assert!(want[2..].iter().all(|w| w.0 & 0o4000 == 0), "{want:?}");
}

/// Namespace scripts `f` sent on `v`.
fn scripts(v: &Volume, f: impl FnOnce()) -> u64 {
    let before = v.status().scripts;
    f();
    v.status().scripts - before
}

/// What the kernel sends for a create, an unlink, a mkdir and a rename
/// (a LOOKUP of each name first) costs one script each in a directory this
/// mount made (issue 37): its negative lookups are answered here.
fn one_script_per_change(c: &LocalCluster) {
    let name = new_volume(c, "calls");
    let v = mount(c, &name);
    let d = v.mkdir_umask(R, ROOT_INO, b"d", 0o755, 0o022).unwrap();
    let e = v.mkdir_umask(R, ROOT_INO, b"e", 0o755, 0o022).unwrap();
    let mut files = Vec::new();
    for i in 0..5 {
        let n = format!("f{i}");
        let n = n.as_bytes();
        let cost = scripts(&v, || {
            assert_eq!(v.lookup(d.ino, n), Err(Errno::ENOENT));
            let (a, created) = v.create_umask(R, d.ino, n, 0o644, true, 0).unwrap();
            assert!(created);
            v.release(a.ino);
            files.push(a.ino);
        });
        assert_eq!(cost, 1, "create {i}: lookup and create");
    }
    let sub = scripts(&v, || {
        assert_eq!(v.lookup(d.ino, b"sub"), Err(Errno::ENOENT));
        v.mkdir_umask(R, d.ino, b"sub", 0o755, 0).unwrap();
    });
    assert_eq!(sub, 1, "mkdir: lookup and mkdir");
    let sub = v.lookup(d.ino, b"sub").unwrap();
    let cost = scripts(&v, || {
        assert_eq!(v.lookup(sub.ino, b"x"), Err(Errno::ENOENT));
        assert_eq!(v.lookup(sub.ino, b"..").unwrap().ino, d.ino);
    });
    assert_eq!(cost, 0, "a new directory is complete and empty");
    let cost = scripts(&v, || {
        assert_eq!(v.lookup(d.ino, b"f0").unwrap().ino, files[0]);
        v.unlink(d.ino, b"f0").unwrap();
        assert_eq!(v.lookup(d.ino, b"f0"), Err(Errno::ENOENT));
    });
    assert_eq!(cost, 1, "unlink: lookup and unlink");
    renames_cost_one(&v, d.ino, e.ino, &files, sub.ino);
    // The cache agrees with the cluster: a fresh mount sees the same.
    let w = mount(c, &name);
    for dir in [d.ino, e.ino, sub.ino] {
        assert_eq!(names(&v, dir), names(&w, dir), "dir {dir}");
        for n in names(&w, dir).iter().filter(|n| n.as_slice() != b".") {
            let here = v.lookup(dir, n).map(|a| a.ino);
            assert_eq!(here, w.lookup(dir, n).map(|a| a.ino), "{n:?} in {dir}");
        }
    }
    let cost = scripts(&v, || {
        names(&v, d.ino);
    });
    assert_eq!(cost, 0, "listings edited, not dropped, by this mount");
}

fn renames_cost_one(v: &Volume, d: u64, e: u64, files: &[u64], sub: u64) {
    let plain = RenameFlags::default();
    let cost = scripts(v, || {
        assert_eq!(v.lookup(d, b"f1").unwrap().ino, files[1]);
        assert_eq!(v.lookup(d, b"g1"), Err(Errno::ENOENT));
        v.rename(d, b"f1", d, b"g1", plain).unwrap();
    });
    assert_eq!(cost, 1, "rename in one directory");
    let cost = scripts(v, || {
        assert_eq!(v.lookup(e, b"f2"), Err(Errno::ENOENT));
        v.rename(d, b"f2", e, b"f2", plain).unwrap();
    });
    assert_eq!(cost, 1, "rename across directories");
    let cost = scripts(v, || {
        v.rename(d, b"f3", d, b"f4", plain).unwrap();
        v.rename(d, b"sub", e, b"sub", plain).unwrap();
        let ex = RenameFlags {
            exchange: true,
            ..plain
        };
        v.rename(d, b"g1", e, b"f2", ex).unwrap();
    });
    assert_eq!(cost, 3, "a replacing rename, a directory's, an exchange");
    let cost = scripts(v, || {
        assert_eq!(v.lookup(d, b"f1"), Err(Errno::ENOENT));
        assert_eq!(v.lookup(d, b"g1").unwrap().ino, files[2]);
        assert_eq!(v.lookup(e, b"f2").unwrap().ino, files[1]);
        assert_eq!(v.lookup(d, b"f4").unwrap().ino, files[3]);
        assert_eq!(v.lookup(d, b"f3"), Err(Errno::ENOENT));
        assert_eq!(v.lookup(d, b"sub"), Err(Errno::ENOENT));
        assert_eq!(v.lookup(e, b"sub").unwrap().ino, sub);
        assert_eq!(v.lookup(sub, b"..").unwrap().ino, e);
    });
    assert_eq!(cost, 0, "every name after the renames, from the cache");
    assert_eq!(
        v.getattr(files[4]),
        Err(Errno::ENOENT),
        "replaced and freed"
    );
}

/// A directory this mount holds whole stops answering negative lookups
/// itself once another mount changed it, and a listing makes it whole
/// again.
fn another_mounts_change_ends_completeness(c: &LocalCluster) {
    let name = new_volume(c, "complete");
    let (a, b) = (mount(c, &name), mount(c, &name));
    let d = a.mkdir_umask(R, ROOT_INO, b"d", 0o755, 0).unwrap();
    let cost = scripts(&a, || {
        assert_eq!(a.lookup(d.ino, b"x"), Err(Errno::ENOENT));
    });
    assert_eq!(cost, 0, "answered by the complete directory");
    assert_eq!(b.lookup(ROOT_INO, b"d").unwrap().ino, d.ino);
    let (x, _) = b.create_umask(R, d.ino, b"x", 0o644, true, 0).unwrap();
    b.release(x.ino);
    wait_until("A to see B's x", || {
        a.lookup(d.ino, b"x").map(|n| n.ino) == Ok(x.ino)
    });
    let cost = scripts(&a, || {
        assert_eq!(a.lookup(d.ino, b"y"), Err(Errno::ENOENT));
    });
    assert_eq!(cost, 1, "no longer complete: the cluster is asked");
    let cost = scripts(&a, || {
        assert!(names(&a, d.ino).contains(&b"x".to_vec()));
        assert_eq!(a.lookup(d.ino, b"z"), Err(Errno::ENOENT));
        assert_eq!(a.lookup(d.ino, b"x").unwrap().ino, x.ino);
    });
    assert_eq!(cost, 1, "a listing makes it complete again");
}

/// This mount's threads changing one complete directory at once: a store
/// refused by another thread's change leaves that name unknown (asked for
/// again), never the directory's other names, nor a wrong answer.
fn threads_keep_a_directory_complete(c: &LocalCluster) {
    let name = new_volume(c, "threads");
    let v = mount(c, &name);
    let d = v.mkdir_umask(R, ROOT_INO, b"d", 0o755, 0).unwrap();
    let made: Vec<Vec<(Vec<u8>, u64)>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let v = &v;
                s.spawn(move || {
                    let mut out = Vec::new();
                    for i in 0..50 {
                        let n = format!("t{t}-{i}").into_bytes();
                        let (a, _) = v.create_umask(R, d.ino, &n, 0o644, true, 0).unwrap();
                        v.release(a.ino);
                        if i % 5 == 0 {
                            v.unlink(d.ino, &n).unwrap();
                        } else {
                            out.push((n, a.ino));
                        }
                    }
                    out
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let cost = scripts(&v, || {
        assert_eq!(v.lookup(d.ino, b"never"), Err(Errno::ENOENT));
    });
    assert_eq!(cost, 0, "still complete after the threads' changes");
    for (n, ino) in made.iter().flatten() {
        assert_eq!(v.lookup(d.ino, n).map(|a| a.ino), Ok(*ino), "{n:?}");
    }
    for t in 0..4 {
        let gone = format!("t{t}-5").into_bytes();
        assert_eq!(v.lookup(d.ino, &gone), Err(Errno::ENOENT));
    }
    let w = mount(c, &name);
    assert_eq!(names(&v, d.ino), names(&w, d.ino));
    assert_eq!(names(&w, d.ino).len(), 2 + 4 * 40);
}

/// Every call `v` made (namespace scripts and the data path).
fn all_calls(v: &Volume) -> u64 {
    let s = v.status();
    s.scripts + s.data_calls
}

/// `f`'s whole content on `v`, as an open, a read and a close do it.
fn open_read(v: &Volume, ino: u64) -> Vec<u8> {
    v.open_file(ino, libc::O_RDONLY).unwrap();
    let mut buf = vec![0; 64];
    let n = v.read_atime(ino, 0, &mut buf, AtimeMode::Never).unwrap();
    v.release(ino);
    buf.truncate(n);
    buf
}

/// `content` written over the start of `ino` on `v`, then closed.
fn write_close(v: &Volume, ino: u64, content: &[u8]) {
    v.open_file(ino, libc::O_WRONLY).unwrap();
    v.write_as(R, &|_| true, false, ino, 0, content, false)
        .unwrap();
    v.flush(ino).unwrap();
    v.release(ino);
}

/// Close-to-open with opens served from the cache (issue 37): what A
/// closed, B's next open reads, round after round, because A's close
/// waited for B's feed to apply it (no ack ran out); and B's opens of a
/// file nobody changed send nothing.
fn closes_wait_for_the_others_acks(c: &LocalCluster) {
    let name = new_volume(c, "acks");
    let (a, b) = (mount(c, &name), mount(c, &name));
    let (f, _) = a.create_umask(R, ROOT_INO, b"f", 0o644, true, 0).unwrap();
    a.release(f.ino);
    let (g, _) = a.create_umask(R, ROOT_INO, b"g", 0o644, true, 0).unwrap();
    a.write_as(R, &|_| true, false, g.ino, 0, b"unchanged", false)
        .unwrap();
    a.flush(g.ino).unwrap();
    a.release(g.ino);
    wait_until("B to see both names", || {
        b.lookup(ROOT_INO, b"f").is_ok() && b.lookup(ROOT_INO, b"g").is_ok()
    });
    assert_eq!(open_read(&b, g.ino), b"unchanged");
    for round in 0..50 {
        let content = format!("round {round:02} of 50");
        write_close(&a, f.ino, content.as_bytes());
        assert_eq!(
            open_read(&b, f.ino),
            content.as_bytes(),
            "round {round}: B reads what A closed"
        );
        // The window is 1.5 s after a caught-up read; an idle reader sends
        // one every second. Waiting for it keeps a stalled machine from
        // making the count below fail for the wrong reason.
        wait_until("B's cache to be trusted", || b.cache_trusted());
        let before = all_calls(&b);
        assert_eq!(open_read(&b, g.ino), b"unchanged");
        assert_eq!(
            all_calls(&b) - before,
            0,
            "round {round}: an open of a cached, unchanged file"
        );
    }
    assert_eq!(a.ack_timeouts(), 0, "B acked every change in time");
}

/// One mount alone: a write and its close cost what they cost before the
/// acks existed (the block, the commit), no poll of the acks; with a
/// second mount live the close polls; once it has gone, it no longer does.
fn a_lone_writer_pays_nothing(c: &LocalCluster) {
    let name = new_volume(c, "lone");
    let a = mount(c, &name);
    let (f, _) = a.create_umask(R, ROOT_INO, b"f", 0o644, true, 0).unwrap();
    a.release(f.ino);
    // The first write reserves block ids ahead: not counted below.
    write_close(&a, f.ino, b"warm");
    // Data calls only: the open's revalidation (a namespace script) comes
    // whenever the feed's last caught-up read is older than FRESH, which
    // a loaded machine decides, not the writer.
    let cost = |v: &Volume, what: &[u8]| {
        let before = v.status().data_calls;
        write_close(v, f.ino, what);
        v.status().data_calls - before
    };
    assert_eq!(cost(&a, b"alone"), 2, "one block, one commit");
    let b = mount(c, &name);
    assert!(cost(&a, b"watched") > 2, "the close polls B's ack");
    assert_eq!(a.ack_timeouts(), 0);
    b.close().unwrap();
    assert_eq!(cost(&a, b"alone again"), 2, "B's session ended");
}

/// A reader whose feed stopped (paused between two reads: it applies and
/// acks nothing) is not served from its cache: A's close gives up waiting
/// for it (and says so), and B's next open asks the cluster and reads the
/// new content.
fn a_reader_whose_feed_stopped_revalidates(c: &LocalCluster) {
    let name = new_volume(c, "stalled");
    let (a, b) = (mount(c, &name), mount(c, &name));
    let (f, _) = a.create_umask(R, ROOT_INO, b"f", 0o644, true, 0).unwrap();
    a.write_as(R, &|_| true, false, f.ino, 0, b"old", false)
        .unwrap();
    a.flush(f.ino).unwrap();
    a.release(f.ino);
    wait_until("B to see f", || b.lookup(ROOT_INO, b"f").is_ok());
    assert_eq!(open_read(&b, f.ino), b"old");
    wait_until("B's cache to be trusted", || b.cache_trusted());
    assert!(b.pause_feed(true, DEADLINE), "B's feed reader parked");
    let timeouts = a.ack_timeouts();
    write_close(&a, f.ino, b"new");
    assert_eq!(a.ack_timeouts(), timeouts + 1, "A's close gave up on B");
    assert!(!b.cache_trusted(), "B's feed is stale");
    let before = b.status().scripts;
    assert_eq!(open_read(&b, f.ino), b"new", "B read what A closed");
    assert!(b.status().scripts > before, "B's open asked the cluster");
    assert!(b.pause_feed(false, DEADLINE));
    wait_until("B's cache to be trusted again", || b.cache_trusted());
}

/// `Admin::clean` (memfs volume clean): refused while a mount is live or
/// another clean holds the volume, and mounts are refused (EBUSY) while it
/// runs; it frees exactly the blocks no map names (here two, written as a
/// mount killed between its blocks and its commit leaves them, with ids
/// reserved as a mount reserves them), and the files read as before.
fn clean_frees_only_what_no_map_names(c: &LocalCluster) {
    let name = new_volume(c, "clean");
    let admin = Admin::with_timeout(&c.urls(), T).unwrap();
    let keys = Keys::new(&name).unwrap();
    let v = mount(c, &name);
    let (f, _) = v.create_umask(R, ROOT_INO, b"f", 0o644, true, 0).unwrap();
    v.release(f.ino);
    let content: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    write_close(&v, f.ino, &content);
    assert!(
        matches!(
            admin.clean(&name),
            Err(memfs_cluster::Error::InUse { sessions: 1, .. })
        ),
        "a clean ran beside a live mount"
    );
    let client = redis::cluster::ClusterClient::new(c.urls()).unwrap();
    let mut con = client.get_connection().unwrap();
    let last: u64 = redis::cmd("HINCRBY")
        .arg(keys.next())
        .arg("block")
        .arg(2)
        .query(&mut con)
        .unwrap();
    let garbage = [keys.block(last - 1), keys.block(last)];
    for k in &garbage {
        redis::cmd("SET")
            .arg(k)
            .arg(&[7u8; 1000][..])
            .exec(&mut con)
            .unwrap();
    }
    v.close().unwrap();
    redis::cmd("SET")
        .arg(keys.cleaning())
        .arg("another")
        .arg("PX")
        .arg(60_000)
        .exec(&mut con)
        .unwrap();
    assert!(
        matches!(admin.clean(&name), Err(memfs_cluster::Error::Cleaning(_))),
        "two cleans at once"
    );
    let refused = Volume::open(&c.urls(), &name, &opts(Duration::from_secs(2)));
    assert_eq!(
        refused
            .map(|_| ())
            .map_err(|e| memfs_cluster::errno::errno_of(&e)),
        Err(Errno::EBUSY),
        "a mount registered while a clean ran"
    );
    redis::cmd("DEL")
        .arg(keys.cleaning())
        .exec(&mut con)
        .unwrap();
    let done = admin.clean(&name).unwrap();
    assert_eq!(done.freed, 2, "{done:?}");
    assert_eq!(done.freed_bytes, 2000, "{done:?}");
    assert_eq!(done.maps, 1, "{done:?}");
    assert_eq!(done.blocks, done.named + 2, "{done:?}");
    assert!(done.named >= 4, "200 kB in 64 KiB blocks: {done:?}");
    for k in garbage.iter().chain([&keys.cleaning()]) {
        let n: u64 = redis::cmd("EXISTS").arg(k).query(&mut con).unwrap();
        assert_eq!(n, 0, "{k} is left");
    }
    let v = mount(c, &name);
    v.open_file(f.ino, libc::O_RDONLY).unwrap();
    let mut buf = vec![0; content.len() + 1];
    let n = v.read_atime(f.ino, 0, &mut buf, AtimeMode::Never).unwrap();
    v.release(f.ino);
    assert_eq!(&buf[..n], &content[..], "a named block was freed");
    v.close().unwrap();
    let again = admin.clean(&name).unwrap();
    assert_eq!((again.freed, again.blocks), (0, done.named), "{again:?}");
}

// ---- diagnostics --------------------------------------------------------------------

/// `INFO commandstats` of one node: command → (calls, usec).
fn command_stats(con: &mut redis::Connection) -> Vec<(String, u64, u64)> {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con).unwrap();
    let field = |l: &str, k: &str| -> u64 {
        l.split(',')
            .find_map(|f| f.strip_prefix(k))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| l.split_once(':'))
        .map(|(c, rest)| (c.to_string(), field(rest, "calls="), field(rest, "usec=")))
        .collect()
}

/// Where the time of a create (with its close) on a `Volume` goes, beside
/// one `EVALSHA` of a trivial script on the metadata master through the
/// same crate, and what the master itself spent per command.
fn diag_metadata_path(c: &LocalCluster) {
    const N: u64 = 3000;
    let name = new_volume(c, "diag-meta");
    let v = mount(c, &name);
    let keys = Keys::new(&name).unwrap();
    let client = redis::cluster::ClusterClientBuilder::new(c.urls())
        .tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true))
        .build()
        .unwrap();
    let mut con = client.get_connection().unwrap();
    let trivial = redis::Script::new("return 1");
    let per_op = |what: &str, f: &mut dyn FnMut(u64)| {
        let mut meta = meta_node(c, &name);
        redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .exec(&mut meta)
            .unwrap();
        let t = Instant::now();
        for i in 0..N {
            f(i);
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / N as f64;
        let stats = command_stats(&mut meta);
        let on_master: Vec<String> = stats
            .iter()
            .filter(|s| s.1 >= N / 100)
            .map(|s| {
                format!(
                    "{} {:.2}/op {:.1} us/call",
                    s.0,
                    s.1 as f64 / N as f64,
                    s.2 as f64 / s.1 as f64
                )
            })
            .collect();
        println!("{what}: {us:.1} us/op; master: {}", on_master.join(", "));
    };
    per_op("EVALSHA return 1", &mut |_| {
        let _: i64 = trivial.key(keys.meta()).invoke(&mut con).unwrap();
    });
    let one_write = redis::Script::new("redis.call('HSET', KEYS[1], 'x', ARGV[1]) return 1");
    per_op("EVALSHA one HSET", &mut |i| {
        let _: i64 = one_write.key(keys.meta()).arg(i).invoke(&mut con).unwrap();
    });
    let ten_writes = redis::Script::new(
        "for j = 1, 10 do redis.call('HSET', KEYS[1], 'x' .. j, ARGV[1]) end return 1",
    );
    per_op("EVALSHA ten HSETs", &mut |i| {
        let _: i64 = ten_writes.key(keys.meta()).arg(i).invoke(&mut con).unwrap();
    });
    let d = v.mkdir_umask(R, ROOT_INO, b"d", 0o755, 0o022).unwrap().ino;
    let create = |n: String| {
        let (a, _) = v
            .create_umask(R, d, n.as_bytes(), 0o644, true, 0o022)
            .unwrap();
        v.release(a.ino);
    };
    // Alternating rounds: the machine's noise moves whole runs.
    for round in 0..3 {
        per_op("create+release", &mut |i| create(format!("f{round}.{i}")));
        assert!(v.pause_feed(true, T), "the feed reader parks");
        per_op("create+release, feed paused", &mut |i| {
            create(format!("g{round}.{i}"))
        });
        assert!(v.pause_feed(false, T));
    }
    per_op("unlink", &mut |i| {
        v.unlink(d, format!("f0.{i}").as_bytes()).unwrap()
    });
    per_op("mkdir", &mut |i| {
        v.mkdir_umask(R, d, format!("m{i}").as_bytes(), 0o755, 0o022)
            .unwrap();
    });
    per_op("rename", &mut |i| {
        let (a, b) = (format!("g0.{i}"), format!("h{i}"));
        v.rename(d, a.as_bytes(), d, b.as_bytes(), RenameFlags::default())
            .unwrap();
    });
    per_op("EVALSHA return 1, again", &mut |_| {
        let _: i64 = trivial.key(keys.meta()).invoke(&mut con).unwrap();
    });
    v.close().unwrap();
}
