//! Mounted memfs volumes on a real local Redis Cluster (3 masters, 3
//! replicas): `memfs mount --cluster URL --volume NAME`, real FUSE mounts of
//! the release `memfs`, one or two at a time, in separate processes.
//!
//! One cluster serves every case (starting one takes seconds), so this file
//! is its own harness (`harness = false`, as crates/cluster/tests/cluster.rs):
//! `main` starts the cluster, runs each case under `catch_unwind`, and drops
//! the cluster whatever happened; every mount is a `common::Mount`, unmounted
//! and reaped by its Drop on a panic too. A watchdog ends a case that hangs:
//! it detaches every mount this process made, kills their servers and the
//! cluster's nodes, and exits failing. `cargo test --release -p memfs-cli
//! --test volume_mount -- NAME` runs the cases whose name contains NAME.
//!
//! The same binary is its own lock helper (`LOCK_HELPER` in the
//! environment): POSIX record locks belong to a process, so each mount's
//! lock is taken by a process of its own.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use common::Mount;
use memfs_cluster::local::{LocalCluster, Options};
use memfs_cluster::{Admin, CreateOptions};

/// Bound on administration calls of the test itself.
const T: Duration = Duration::from_secs(10);
/// The mounts' `--cluster-timeout`: every call to the cluster fails with
/// EIO after this (docs/cluster.md, "Failure modes").
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(5);
/// What docs/cluster.md promises for another mount's names and attributes:
/// the feed's round trip + 1 s (the kernel's entry timeout on a volume).
/// The deadline allows the feed a second of its own on a loaded VM.
const VISIBLE_WITHIN: Duration = Duration::from_secs(3);
/// The session lease of the mounts that are killed (`--lease-secs`).
const SHORT_LEASE: Duration = Duration::from_secs(2);
/// A case that runs longer than this has hung.
const CASE_LIMIT: Duration = Duration::from_secs(600);

type Case = (&'static str, fn(&mut LocalCluster));

const CASES: &[Case] = &[
    (
        "bad_volume_options_are_refused",
        bad_volume_options_are_refused,
    ),
    (
        "status_shows_cluster_volume_session_cache",
        status_shows_the_volume,
    ),
    (
        "closed_on_one_is_read_whole_on_the_other",
        closed_is_read_whole,
    ),
    (
        "pages_stay_cached_across_opens_until_another_mount_writes",
        pages_stay_cached,
    ),
    ("a_rename_is_seen_on_the_other_mount", a_rename_is_seen),
    (
        "a_lost_feed_drops_every_name_the_kernel_holds",
        a_lost_feed_drops_every_name,
    ),
    (
        "o_excl_creates_have_one_winner",
        o_excl_creates_have_one_winner,
    ),
    (
        "a_mount_in_another_network_namespace_shares_the_tree",
        a_mount_in_another_network_namespace,
    ),
    (
        "flock_and_fcntl_hold_across_mounts",
        locks_hold_across_mounts,
    ),
    (
        "a_killed_mounts_lock_outlives_it_by_its_lease",
        killed_mounts_lock,
    ),
    ("fio_verify_on_a_volume", fio_verify),
    ("pjdfstest_on_a_volume", pjdfstest_on_a_volume),
    (
        "fsynced_files_survive_the_metadata_masters_death",
        master_killed,
    ),
    ("redis_stopped_fails_with_eio_then_recovers", redis_stopped),
];

fn main() {
    if let Ok(spec) = std::env::var("LOCK_HELPER") {
        lock_helper(&spec);
        return;
    }
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let wanted = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));
    if !common::fuse_available() || !nix::unistd::geteuid().is_root() {
        // The mounts need FUSE, pjdfstest and the lease cases need root
        // (other users, detaching dead mounts); CI runs as root.
        println!("skipped: these cases need root and /dev/fuse");
        return;
    }
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
            eprintln!("redis-server and redis-cli are needed: run scripts/setup");
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
    drop(cluster);
    println!("all in {:.1?}", started.elapsed());
    println!("{passed} passed, {failed} failed");
    std::process::exit(i32::from(failed > 0));
}

/// Every mount this process made, for the watchdog: (server pid, path).
static MOUNTS: Mutex<Vec<(u32, PathBuf)>> = Mutex::new(Vec::new());

/// A thread that, when the case named in the cell has run over `limit`,
/// detaches every mount of this process and kills its server, kills the
/// cluster's nodes, and exits: a hung case must leave nothing behind, and
/// no Drop runs while the case holds them.
fn watchdog(limit: Duration) -> Arc<Mutex<Option<(&'static str, Instant)>>> {
    let cell: Arc<Mutex<Option<(&'static str, Instant)>>> = Arc::default();
    let seen = cell.clone();
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(200));
            let Some((name, since)) = *seen.lock().unwrap() else {
                continue;
            };
            if since.elapsed() > limit {
                eprintln!(
                    "test {name} hung for {limit:?}: detaching its mounts, stopping the cluster"
                );
                for (pid, path) in MOUNTS.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                    let _ = nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH);
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(*pid as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                for pid in redis_children() {
                    let dir = std::fs::read_link(format!("/proc/{pid}/cwd"));
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    if let Ok(d) = dir {
                        let _ = std::fs::remove_dir_all(d);
                    }
                }
                println!("test {name} ... FAILED (hung)");
                println!("0 passed, 1 failed");
                std::process::exit(1);
            }
        }
    });
    cell
}

/// The redis-server processes this process started, from /proc.
fn redis_children() -> Vec<u32> {
    let mut pids = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return pids;
    };
    for t in tasks.flatten() {
        let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        for pid in children
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
        {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmd).contains("redis-server") {
                pids.push(pid);
            }
        }
    }
    pids
}

/// The cluster as `--cluster` takes it: the first node with its scheme,
/// the others bare, as the README writes it.
fn spec(c: &LocalCluster) -> String {
    let urls = c.urls();
    let mut s = urls[0].clone();
    for u in &urls[1..] {
        s.push(',');
        s.push_str(u.trim_start_matches("redis://"));
    }
    s
}

/// A new volume named `name`, its root owned by root.
fn volume(c: &LocalCluster, name: &str) {
    let admin = Admin::with_timeout(&c.urls(), T).expect("connect to the cluster");
    admin
        .create(
            name,
            &CreateOptions {
                uid: 0,
                gid: 0,
                ..CreateOptions::default()
            },
        )
        .unwrap_or_else(|e| panic!("create volume {name}: {e}"));
}

/// A mount of volume `name`, with `extra` flags; registered for the watchdog.
fn mount(c: &LocalCluster, name: &str, extra: &[&str]) -> Mount {
    mount_from(None, c, name, extra)
}

/// [`mount`], its server in the network namespace `netns` if given.
fn mount_from(netns: Option<&NetNs>, c: &LocalCluster, name: &str, extra: &[&str]) -> Mount {
    let spec = spec(c);
    let timeout = CLUSTER_TIMEOUT.as_secs().to_string();
    let mut args = vec![
        "--cluster",
        &spec,
        "--volume",
        name,
        "--allow-other",
        "--cluster-timeout",
        &timeout,
    ];
    args.extend_from_slice(extra);
    let m = match netns {
        None => Mount::with_args(&args),
        Some(ns) => Mount::in_net_namespace(&ns.path(), &args),
    };
    MOUNTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((m.pid(), m.path()));
    m
}

/// Polls `done` until it holds, failing with `what` after `limit`;
/// returns how long it took.
fn poll_within(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !done() {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    t.elapsed()
}

/// Bytes that name the file they belong to, so that a mix-up shows.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn memfs_out(args: &[&str]) -> std::process::Output {
    common::memfs(args)
}

fn bad_volume_options_are_refused(c: &mut LocalCluster) {
    let d = tempfile::tempdir().unwrap();
    let mp = d.path().to_str().unwrap();
    let spec = spec(c);
    let cases: &[(&[&str], &str)] = &[
        (
            &["--cluster", &spec, "--volume", "v", "--data-dir", "/tmp/x"],
            "--data-dir does not apply to a volume mount",
        ),
        (
            &["-o", &format!("cluster={spec},volume=v,size=1G")],
            "size= does not apply to a volume mount",
        ),
        (
            &["--cluster", &spec, "--volume", "v", "--locks", "kernel"],
            "--locks kernel does not apply",
        ),
        (&["--cache-size", "1G"], "need --cluster and --volume"),
        (
            &["--cluster", "http://x:1", "--volume", "v"],
            "is not redis://",
        ),
        (
            &["--cluster", &spec, "--volume", "no-such-volume"],
            "no-such-volume",
        ),
    ];
    for (args, want) in cases {
        let mut all = vec!["mount", mp];
        all.extend_from_slice(args);
        let err = common::failed(memfs_out(&all));
        assert!(err.contains(want), "memfs {all:?}: {err}");
    }
    assert!(!common::is_mount_point(d.path()));
}

fn status_shows_the_volume(c: &mut LocalCluster) {
    volume(c, "status");
    let m = mount(c, "status", &["--cache-size", "64M"]);
    std::fs::write(m.p("f"), b"x").unwrap();
    let out = common::ok(memfs_out(&["status", m.path().to_str().unwrap()]));
    for want in [
        "cluster:",
        "volume:     status",
        "session:",
        "lease:",
        "cache:",
    ] {
        assert!(out.contains(want), "no {want:?} in memfs status:\n{out}");
    }
    assert!(out.contains("64M"), "the cache limit is not shown:\n{out}");
    let src = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        src.contains("memfs-volume:status"),
        "the mount's source does not name the volume"
    );
    m.unmount();
    // The unmount closed the volume: its session is gone.
    let admin = Admin::with_timeout(&c.urls(), T).unwrap();
    let s = admin.status("status").unwrap();
    assert_eq!(s.live_sessions, 0, "the unmounted mount's session is live");
}

fn closed_is_read_whole(c: &mut LocalCluster) {
    volume(c, "c2o");
    let a = mount(c, "c2o", &[]);
    let b = mount(c, "c2o", &[]);
    for (i, len) in [0usize, 1, 4095, 4096, 65536 + 17, 3 << 20]
        .into_iter()
        .enumerate()
    {
        let data = pattern(i as u64, len);
        let name = format!("f{i}");
        // Read on B before A writes: B's kernel has the old (absent) file.
        assert!(std::fs::metadata(b.p(&name)).is_err());
        std::fs::write(a.p(&name), &data).unwrap();
        // A new name reaches B within the bound (B looked it up and found
        // nothing a moment ago); its data is whole as soon as it is seen.
        poll_within(&format!("{name} on B"), VISIBLE_WITHIN, || {
            b.p(&name).exists()
        });
        let got = std::fs::read(b.p(&name)).unwrap_or_else(|e| panic!("read {name} on B: {e}"));
        assert!(
            got == data,
            "{name}: B read {} bytes, A wrote {len}",
            got.len()
        );
        // Overwritten and closed on A again: B's next open reads the new bytes.
        let data2 = pattern(100 + i as u64, len);
        std::fs::write(a.p(&name), &data2).unwrap();
        let got = std::fs::read(b.p(&name)).unwrap();
        assert!(got == data2, "{name}: B read stale data after A's rewrite");
    }
    a.unmount();
    b.unmount();
}

/// Pages of `path` in this kernel's page cache, and pages of the file:
/// an open (this one's), then `mincore` of a mapping of it.
fn resident(path: &Path) -> (usize, usize) {
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    let pages = len.div_ceil(4096);
    let mut v = vec![0u8; pages];
    // SAFETY: a read-only mapping of `len` bytes of an open file, unmapped
    // before it returns; `v` has one byte per page, as mincore writes.
    let r = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "mmap {}", path.display());
        let r = libc::mincore(p, len, v.as_mut_ptr());
        libc::munmap(p, len);
        r
    };
    assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
    (v.iter().filter(|&&b| b & 1 != 0).count(), pages)
}

/// An open keeps the pages read on this mount while no other mount wrote
/// the file (FOPEN_KEEP_CACHE from `Tree::open`), and drops them once one
/// did, so the next read is the new bytes.
fn pages_stay_cached(c: &mut LocalCluster) {
    volume(c, "pages");
    let a = mount(c, "pages", &[]);
    let b = mount(c, "pages", &[]);
    let data = pattern(7, 256 << 10);
    std::fs::write(a.p("f"), &data).unwrap();
    poll_within("f on B", VISIBLE_WITHIN, || b.p("f").exists());
    // Until A's feed entries have reached B (their invalidations drop B's
    // pages and records), an open may find nothing to compare with; once
    // they have, the open after a read keeps what the read brought in.
    let kept_after_a_read = |want: &[u8]| {
        poll_within("B's pages kept across an open", VISIBLE_WITHIN, || {
            assert!(
                std::fs::read(b.p("f")).unwrap() == want,
                "B read stale data"
            );
            let (kept, pages) = resident(&b.p("f"));
            kept == pages
        })
    };
    kept_after_a_read(&data);
    let data2 = pattern(8, 256 << 10);
    std::fs::write(a.p("f"), &data2).unwrap();
    let (kept, _) = resident(&b.p("f"));
    assert_eq!(kept, 0, "an open after A's rewrite kept stale pages");
    kept_after_a_read(&data2);
    a.unmount();
    b.unmount();
}

fn a_rename_is_seen(c: &mut LocalCluster) {
    volume(c, "rename");
    let a = mount(c, "rename", &[]);
    let b = mount(c, "rename", &[]);
    std::fs::create_dir(a.p("d1")).unwrap();
    std::fs::create_dir(a.p("d2")).unwrap();
    std::fs::write(a.p("d1/x"), b"moved").unwrap();
    // B caches the names as they are.
    poll_within("d1/x on B", VISIBLE_WITHIN, || b.p("d1/x").exists());
    assert!(!b.p("d2/y").exists());
    std::fs::rename(a.p("d1/x"), a.p("d2/y")).unwrap();
    let took = poll_within("the rename on B", VISIBLE_WITHIN, || {
        b.p("d2/y").exists() && !b.p("d1/x").exists()
    });
    eprintln!("  a rename reached the other mount in {took:?}");
    assert_eq!(std::fs::read(b.p("d2/y")).unwrap(), b"moved");
    // An attribute change too.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(a.p("d2/y"), std::fs::Permissions::from_mode(0o600)).unwrap();
    poll_within("the chmod on B", VISIBLE_WITHIN, || {
        std::fs::metadata(b.p("d2/y")).is_ok_and(|m| m.permissions().mode() & 0o777 == 0o600)
    });
    a.unmount();
    b.unmount();
}

/// `redis-cli` on node `url` (`redis://H:P`), following redirections;
/// its output.
fn redis_cli(url: &str, args: &[&str]) -> String {
    let (host, port) = url
        .trim_start_matches("redis://")
        .rsplit_once(':')
        .expect("a node url is redis://HOST:PORT");
    let out = std::process::Command::new("redis-cli")
        .args(["-c", "-h", host, "-p", port])
        .args(args)
        .output()
        .expect("run redis-cli (scripts/setup installs redis-tools)");
    assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A volume mount's kernel keeps names and attributes as long as a local
/// mount's. What makes that safe when the feed is lost: every name the
/// kernel holds is looked up again. The name is removed in the cluster
/// behind the scripts' back (no feed entry, so no mount hears of it), then
/// every connection is cut: only the lost feed's Change::All can make the
/// kernel ask again, which it would not for a day otherwise.
fn a_lost_feed_drops_every_name(c: &mut LocalCluster) {
    volume(c, "lostfeed");
    let a = mount(c, "lostfeed", &[]);
    let b = mount(c, "lostfeed", &[]);
    std::fs::write(a.p("x"), b"x").unwrap();
    std::fs::create_dir(a.p("d")).unwrap();
    std::fs::write(a.p("d/y"), b"y").unwrap();
    poll_within("x and d/y on B", VISIBLE_WITHIN, || {
        b.p("x").exists() && b.p("d/y").exists()
    });
    let urls = c.urls();
    // The root's entries, `{V}:d:1` (docs/cluster.md, "Keys").
    assert_eq!(redis_cli(&urls[0], &["HDEL", "{lostfeed}:d:1", "x"]), "1");
    // Both kernels still hold the name (nothing told them otherwise).
    assert!(b.p("x").exists(), "B's kernel keeps x until told");
    assert!(a.p("x").exists(), "A's kernel keeps x until told");
    for u in &urls {
        redis_cli(u, &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    }
    // ENOENT, not just an error: a call may fail (EIO) while the mount's
    // connections come back.
    let gone = |p: PathBuf| matches!(std::fs::metadata(p), Err(e) if e.raw_os_error() == Some(libc::ENOENT));
    let took = poll_within(
        "x gone on both after the lost feed",
        VISIBLE_WITHIN * 3,
        || gone(a.p("x")) && gone(b.p("x")),
    );
    eprintln!("  a lost feed dropped the kernels' names in {took:?}");
    // What the cluster still has is found again by name.
    assert_eq!(std::fs::read(b.p("d/y")).unwrap(), b"y");
    assert_eq!(std::fs::read(a.p("d/y")).unwrap(), b"y");
    a.unmount();
    b.unmount();
}

/// A network namespace of this test's own, joined to this host's by a veth
/// pair: `host` is this side's address, `peer` the namespace's. Deleted on
/// drop (the pair goes with it), whether the case passed or panicked.
struct NetNs {
    name: String,
    host_if: String,
    host: std::net::Ipv4Addr,
    peer: std::net::Ipv4Addr,
}

fn ip(args: &[&str]) -> std::io::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

impl NetNs {
    fn new() -> NetNs {
        let pid = std::process::id();
        // Interface names have at most 15 bytes; 10.213.0.0/16 is no
        // network of this machine's (and if it were, the mount would fail
        // to reach the cluster, loudly).
        let n = pid % 100_000;
        let third = u8::try_from(pid % 250).expect("below 250");
        let ns = NetNs {
            name: format!("memfs-t{pid}"),
            host_if: format!("mfh{n}"),
            host: std::net::Ipv4Addr::new(10, 213, third, 1),
            peer: std::net::Ipv4Addr::new(10, 213, third, 2),
        };
        let peer_if = format!("mfn{n}");
        let (host_net, peer_net) = (format!("{}/24", ns.host), format!("{}/24", ns.peer));
        ip(&["netns", "add", &ns.name]).expect("ip netns add (needs root and iproute2)");
        // From here on a panic drops `ns`, which deletes what was made.
        for step in [
            &[
                "link",
                "add",
                &ns.host_if,
                "type",
                "veth",
                "peer",
                "name",
                &peer_if,
                "netns",
                &ns.name,
            ][..],
            &["addr", "add", &host_net, "dev", &ns.host_if],
            &["link", "set", &ns.host_if, "up"],
            &["-n", &ns.name, "addr", "add", &peer_net, "dev", &peer_if],
            &["-n", &ns.name, "link", "set", &peer_if, "up"],
            &["-n", &ns.name, "link", "set", "lo", "up"],
        ] {
            ip(step).unwrap_or_else(|e| panic!("{e}"));
        }
        ns
    }

    fn path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.name)
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Deleting the namespace deletes its end of the pair, and so the pair.
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("cleaning up: {e}");
        }
        let _ = ip(&["link", "del", &self.host_if]);
    }
}

/// The second machine, as near as one host comes: a mount whose
/// server runs in a network namespace of its own and reaches the cluster
/// over a veth pair (the cluster listening on this side's address). Both
/// mounts serve one tree.
fn a_mount_in_another_network_namespace(_: &mut LocalCluster) {
    let ns = NetNs::new();
    let c = LocalCluster::start(Options {
        replicas: 0,
        host: ns.host,
        ..Options::default()
    })
    .unwrap_or_else(|e| panic!("a local Redis Cluster on {}: {e}", ns.host));
    volume(&c, "netns");
    let a = mount(&c, "netns", &[]);
    let b = mount_from(Some(&ns), &c, "netns", &[]);
    let net = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
    assert_ne!(
        net("self"),
        net(&b.pid().to_string()),
        "B's server runs in the other network namespace"
    );
    // B's connections reach the cluster from the namespace's address.
    let clients: String = c
        .urls()
        .iter()
        .map(|u| redis_cli(u, &["CLIENT", "LIST"]))
        .collect();
    assert!(
        clients.contains(&format!("addr={}:", ns.peer)),
        "no client from {} in: {clients}",
        ns.peer
    );
    let data = pattern(7, 300_000);
    std::fs::write(a.p("from_a"), &data).unwrap();
    poll_within("from_a on B", VISIBLE_WITHIN, || b.p("from_a").exists());
    assert_eq!(
        std::fs::read(b.p("from_a")).unwrap(),
        data,
        "A's file, read on B"
    );
    std::fs::write(b.p("from_b"), b"over the veth").unwrap();
    poll_within("from_b on A", VISIBLE_WITHIN, || a.p("from_b").exists());
    assert_eq!(std::fs::read(a.p("from_b")).unwrap(), b"over the veth");
    std::fs::rename(b.p("from_b"), b.p("renamed")).unwrap();
    poll_within("B's rename on A", VISIBLE_WITHIN, || {
        a.p("renamed").exists() && !a.p("from_b").exists()
    });
    a.unmount();
    b.unmount();
    drop(c);
}

fn o_excl_creates_have_one_winner(c: &mut LocalCluster) {
    volume(c, "excl");
    let a = mount(c, "excl", &[]);
    let b = mount(c, "excl", &[]);
    for i in 0..20 {
        let name = format!("n{i}");
        let barrier = Arc::new(Barrier::new(2));
        let racers: Vec<_> = [a.p(&name), b.p(&name)]
            .into_iter()
            .map(|p| {
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(p)
                        .map(drop)
                        .map_err(|e| e.raw_os_error())
                })
            })
            .collect();
        let results: Vec<_> = racers.into_iter().map(|t| t.join().unwrap()).collect();
        let wins = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(wins, 1, "{name}: {results:?}");
        assert!(
            results.contains(&Err(Some(libc::EEXIST))),
            "{name}: the loser did not get EEXIST: {results:?}"
        );
    }
    a.unmount();
    b.unmount();
}

/// A process that takes a lock on `path` (`kind` flock or fcntl, `how` nb
/// or wait) and holds it until its stdin closes.
struct Locker {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Locker {
    fn start(kind: &str, path: &Path, how: &str) -> Locker {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env("LOCK_HELPER", format!("{kind} {how} {}", path.display()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the lock helper");
        let out = BufReader::new(child.stdout.take().unwrap());
        Locker { child, out }
    }

    /// The helper's answer: `locked`, `busy` or `error ERRNO`.
    fn answer(&mut self) -> String {
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        line.trim().to_string()
    }

    /// Lets go: closes the helper's stdin, reaps it.
    fn release(mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Locker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The lock helper's side (`LOCK_HELPER="flock|fcntl nb|wait PATH"`).
fn lock_helper(spec: &str) {
    let mut parts = spec.splitn(3, ' ');
    let (kind, how, path) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("lock helper: open {path}: {e}"));
    let wait = how == "wait";
    let r = if kind == "flock" {
        let op = libc::LOCK_EX | if wait { 0 } else { libc::LOCK_NB };
        // SAFETY: flock(2) on a descriptor `f` owns, open for the call.
        unsafe { libc::flock(f.as_raw_fd(), op) }
    } else {
        let l = common::range_lock(libc::F_WRLCK, 0, 100);
        let cmd = if wait { libc::F_SETLKW } else { libc::F_SETLK };
        // SAFETY: F_SETLK(W) reads the flock struct `l`, alive for the call.
        unsafe { libc::fcntl(f.as_raw_fd(), cmd, &l) }
    };
    let mut out = std::io::stdout();
    if r == 0 {
        writeln!(out, "locked").unwrap();
    } else {
        let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        if e == libc::EWOULDBLOCK || e == libc::EAGAIN || e == libc::EACCES {
            writeln!(out, "busy").unwrap();
        } else {
            writeln!(out, "error {e}").unwrap();
        }
    }
    out.flush().unwrap();
    // Holds the lock until the test lets go (or kills us).
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(f);
}

fn locks_hold_across_mounts(c: &mut LocalCluster) {
    volume(c, "locks");
    let a = mount(c, "locks", &[]);
    let b = mount(c, "locks", &[]);
    std::fs::write(a.p("f"), b"lock me").unwrap();
    poll_within("f on B", VISIBLE_WITHIN, || b.p("f").exists());
    for kind in ["flock", "fcntl"] {
        let mut holder = Locker::start(kind, &a.p("f"), "nb");
        assert_eq!(holder.answer(), "locked", "{kind} on A");
        let mut other = Locker::start(kind, &b.p("f"), "nb");
        assert_eq!(other.answer(), "busy", "{kind} on B while A holds it");
        other.release();
        // A blocked waiter on B is granted the lock once A lets go.
        let mut waiter = Locker::start(kind, &b.p("f"), "wait");
        holder.release();
        assert_eq!(waiter.answer(), "locked", "{kind} waiter on B");
        let mut again = Locker::start(kind, &a.p("f"), "nb");
        assert_eq!(again.answer(), "busy", "{kind} on A while B holds it");
        again.release();
        waiter.release();
    }
    a.unmount();
    b.unmount();
}

fn killed_mounts_lock(c: &mut LocalCluster) {
    volume(c, "lease");
    let lease = SHORT_LEASE.as_secs().to_string();
    let mut a = mount(c, "lease", &["--lease-secs", &lease]);
    let b = mount(c, "lease", &["--lease-secs", &lease]);
    std::fs::write(a.p("f"), b"held").unwrap();
    poll_within("f on B", VISIBLE_WITHIN, || b.p("f").exists());
    for kind in ["fcntl", "flock"] {
        let name = format!("{kind}.lock");
        std::fs::write(a.p(&name), b"").unwrap();
        poll_within("the lock file on B", VISIBLE_WITHIN, || b.p(&name).exists());
    }
    let mut holders = Vec::new();
    for kind in ["fcntl", "flock"] {
        let mut h = Locker::start(kind, &a.p(&format!("{kind}.lock")), "nb");
        assert_eq!(h.answer(), "locked", "{kind} on A");
        holders.push(h);
    }
    // The server dies holding them; its clients' closes then never reach it.
    a.kill_server();
    let killed = Instant::now();
    for h in holders {
        h.kill();
    }
    a.detach();
    for kind in ["fcntl", "flock"] {
        let path = b.p(&format!("{kind}.lock"));
        // The lease, its reaper's round, and the feed to the waiter.
        let limit = SHORT_LEASE * 4 + CLUSTER_TIMEOUT;
        let mut waiter = Locker::start(kind, &path, "wait");
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            let _ = tx.send(waiter.answer());
            waiter
        });
        let got = rx
            .recv_timeout(limit)
            .unwrap_or_else(|_| panic!("{kind}: B did not get the dead mount's lock in {limit:?}"));
        assert_eq!(got, "locked", "{kind} on B");
        eprintln!("  {kind}: released {:?} after the kill", killed.elapsed());
        t.join().unwrap().release();
    }
    b.unmount();
}

fn fio_verify(c: &mut LocalCluster) {
    assert!(
        common::have("fio"),
        "fio is not installed: run scripts/setup"
    );
    volume(c, "fio");
    let m = mount(c, "fio", &[]);
    for bs in ["4k", "1m"] {
        for direct in [0, 1] {
            let name = format!("v-{bs}-{direct}");
            let out = Command::new("fio")
                .current_dir(m.path())
                .arg("--verify_state_save=0")
                .arg(format!("--name={name}"))
                .arg(format!("--filename={}", m.p(&name).display()))
                .args([
                    "--rw=randrw",
                    "--size=32M",
                    "--ioengine=libaio",
                    "--iodepth=16",
                ])
                .arg(format!("--bs={bs}"))
                .arg(format!("--direct={direct}"))
                .args([
                    "--verify=md5",
                    "--do_verify=1",
                    "--verify_fatal=1",
                    "--fallocate=none",
                ])
                .output()
                .expect("run fio");
            let text = format!(
                "{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(out.status.success(), "fio {name} failed:\n{text}");
            assert!(!text.contains("verify: bad"), "fio {name}:\n{text}");
            assert!(
                text.contains("READ:") && text.contains("WRITE:"),
                "fio {name} did no I/O:\n{text}"
            );
            std::fs::remove_file(m.p(&name)).unwrap();
        }
    }
    m.unmount();
}

/// pjdfstest cases a volume fails, each with why. Empty: it passes all
/// that it runs (as the local engine does).
const KNOWN_PJDFSTEST_FAILURES: &[(&str, &str)] = &[];

fn pjdfstest_on_a_volume(c: &mut LocalCluster) {
    volume(c, "pjdfstest");
    let m = mount(c, "pjdfstest", &[]);
    let got = common::pjdfstest::run_suite(&m.path(), None);
    m.unmount();
    eprintln!(
        "  pjdfstest on a volume: {} passed, {} failed, {} skipped; failures {:?}",
        got.passed, got.failed, got.skipped, got.failures
    );
    let unknown: Vec<&String> = got
        .failures
        .iter()
        .filter(|f| !KNOWN_PJDFSTEST_FAILURES.iter().any(|(k, _)| k == f))
        .collect();
    assert!(
        unknown.is_empty(),
        "pjdfstest failures on a volume {unknown:?}\n{}",
        got.output
    );
    assert!(got.passed > 300, "{}", got.output);
}

/// What a writer thread acknowledged: the files whose fsync returned 0
/// (also counted in `n` as they come).
fn write_loop(
    dir: PathBuf,
    stop: Arc<std::sync::atomic::AtomicBool>,
    n: Arc<std::sync::atomic::AtomicUsize>,
) -> (Vec<u64>, Vec<String>) {
    let (mut acked, mut errors) = (Vec::new(), Vec::new());
    let mut i = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        let path = dir.join(format!("w{i}"));
        let data = pattern(1000 + i, 40_000 + (i as usize % 7) * 10_000);
        let r = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .and_then(|mut f| {
                f.write_all(&data)?;
                f.sync_all()
            });
        match r {
            Ok(()) => {
                acked.push(i);
                n.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            }
            Err(e) => errors.push(format!("w{i}: {e}")),
        }
        i += 1;
    }
    (acked, errors)
}

fn master_killed(c: &mut LocalCluster) {
    volume(c, "failover");
    let m = mount(c, "failover", &[]);
    let meta = memfs_cluster::keys::Keys::new("failover").unwrap().meta();
    let master = c.master_of(meta.as_bytes()).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let acks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let acked_now = || acks.load(std::sync::atomic::Ordering::Acquire);
    let writer = {
        let (dir, stop, n) = (m.path(), stop.clone(), acks.clone());
        std::thread::spawn(move || write_loop(dir, stop, n))
    };
    // Some fsynced files before the kill, then the kill, then until the
    // mount carries on (a new master has the slot and fsyncs succeed).
    poll_within("fsyncs before the kill", Duration::from_secs(20), || {
        acked_now() >= 5
    });
    c.kill(master).unwrap();
    let killed = Instant::now();
    let before = acked_now();
    poll_within("a new metadata master", Duration::from_secs(30), || {
        c.master_of(meta.as_bytes()).is_ok_and(|n| n != master)
    });
    // The target: the mount carries on within 10 s (plus our timeout).
    let limit = Duration::from_secs(10) + CLUSTER_TIMEOUT * 2;
    poll_within("fsyncs acknowledged after the failover", limit, || {
        acked_now() >= before + 5
    });
    eprintln!(
        "  the mount carried on {:?} after the kill",
        killed.elapsed()
    );
    stop.store(true, std::sync::atomic::Ordering::Release);
    let (acked, errors) = writer.join().unwrap();
    eprintln!(
        "  {} files fsynced, {} calls failed during the failover: {:?}",
        acked.len(),
        errors.len(),
        errors.iter().take(3).collect::<Vec<_>>()
    );
    // Every acknowledged file, read back through a fresh mount (nothing
    // cached): whole and exact.
    m.unmount();
    let fresh = mount(c, "failover", &[]);
    for i in &acked {
        let want = pattern(1000 + i, 40_000 + (*i as usize % 7) * 10_000);
        let got = std::fs::read(fresh.p(&format!("w{i}")))
            .unwrap_or_else(|e| panic!("fsynced file w{i} after the failover: {e}"));
        assert!(got == want, "fsynced file w{i} differs after the failover");
    }
    fresh.unmount();
    // The old master comes back as a replica, for the cases after this one.
    c.restart(master).unwrap();
    c.wait_healthy(Duration::from_secs(60)).unwrap();
}

fn redis_stopped(c: &mut LocalCluster) {
    volume(c, "outage");
    let m = mount(c, "outage", &[]);
    std::fs::write(m.p("before"), b"1").unwrap();
    let nodes: Vec<usize> = (0..c.len()).collect();
    for &i in &nodes {
        c.stop(i).unwrap();
    }
    // A call that needs the cluster fails (EIO) within the timeout, never hangs.
    let t = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    let p = m.p("during");
    let call = std::thread::spawn(move || {
        let _ = tx.send(std::fs::write(p, b"2").map_err(|e| e.raw_os_error()));
    });
    let limit = CLUSTER_TIMEOUT * 3;
    let r = rx
        .recv_timeout(limit)
        .unwrap_or_else(|_| panic!("a create with Redis stopped did not return in {limit:?}"));
    call.join().unwrap();
    eprintln!(
        "  with Redis stopped a create returned {r:?} after {:?}",
        t.elapsed()
    );
    assert_eq!(r, Err(Some(libc::EIO)), "a create with Redis stopped");
    for &i in &nodes {
        c.restart(i).unwrap();
    }
    c.wait_healthy(Duration::from_secs(60)).unwrap();
    // The same mount works again.
    poll_within("the mount to work again", CLUSTER_TIMEOUT * 4, || {
        std::fs::write(m.p("after"), b"3").is_ok()
    });
    assert_eq!(std::fs::read(m.p("before")).unwrap(), b"1");
    assert_eq!(std::fs::read(m.p("after")).unwrap(), b"3");
    m.unmount();
}
