//! Single-thread cost of an uncontended lock + unlock of one exclusive
//! entity, per algorithm, on /dev/shm: a quick way to compare two builds
//! (the full benchmark is `memfs bench lock`). Ignored by default:
//! `cargo test --release -p memfs-lock --test cost -- --ignored --nocapture`
//! (MEMFS_LOCK_COST_SECONDS sets the time per algorithm, default 1).

mod common;

use std::time::{Duration, Instant};

use common::*;
use memfs_lock::{Algorithm, Deadline, SharedFsMutex};

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid clock id and out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[test]
#[ignore]
fn uncontended_cost() {
    let secs: f64 = std::env::var("MEMFS_LOCK_COST_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    for alg in Algorithm::ALL {
        let m = SharedFsMutex::open(alg, lock_path(alg, dir.path())).unwrap();
        let (t0, c0) = (Instant::now(), thread_cpu());
        let mut ops = 0u64;
        while t0.elapsed().as_secs_f64() < secs {
            for _ in 0..256 {
                drop(m.lock(&[x(1)], Deadline::Never).unwrap());
            }
            ops += 256;
        }
        let (wall, cpu) = (
            t0.elapsed().as_secs_f64(),
            (thread_cpu() - c0).as_secs_f64(),
        );
        assert!(ops > 0);
        println!(
            "COST {alg:<14} {:>12.0} ops/s {:>12.0} ops/CPU-s {:>8.1} ns/op (CPU)",
            ops as f64 / wall,
            ops as f64 / cpu,
            cpu * 1e9 / ops as f64
        );
    }
}
