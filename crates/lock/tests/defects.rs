//! One test per defect of the reference implementation (see
//! shared/reference/locking.md), each of which would fail on that defect.
//! Defects 1-3 and 7 are also exercised across processes in processes.rs.

mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::*;
use memfs_lock::{Algorithm, Deadline, Error, Options, SharedFsMutex};

fn each(mut f: impl FnMut(Algorithm, &std::path::Path)) {
    for dir in test_dirs() {
        for alg in Algorithm::ALL {
            f(alg, &lock_path(alg, dir.path()));
        }
    }
}

/// Defect 1: a memory_map user that opens the lock after another must join
/// its index, not make a new one (both then held the same entity).
#[test]
fn defect1_memory_map_late_joiner_joins_the_index() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let path = dir.path().join("lock");
    let a = SharedFsMutex::open(Algorithm::MemoryMap, &path).unwrap();
    let g = a.lock(&[x(9)], Deadline::Never).unwrap();
    for _ in 0..3 {
        let b = SharedFsMutex::open(Algorithm::MemoryMap, &path).unwrap();
        assert!(!b.is_fallback());
        assert!(
            matches!(b.try_lock(&[x(9)]), Err(Error::WouldBlock)),
            "late joiner took a held entity"
        );
    }
    drop(g);
    let b = SharedFsMutex::open(Algorithm::MemoryMap, &path).unwrap();
    let g = b.try_lock(&[x(9)]).unwrap();
    assert!(
        matches!(a.try_lock(&[s(9)]), Err(Error::WouldBlock)),
        "first user ignores the late joiner's lock"
    );
    drop(g);
}

/// Defect 2: try_lock on a contended entity returns at once (every algorithm,
/// holder in the same process on another instance).
#[test]
fn defect2_try_lock_never_blocks() {
    each(|alg, path| {
        let holder = SharedFsMutex::open(alg, path).unwrap();
        let _g = holder.lock(&[x(3)], Deadline::Never).unwrap();
        let p = path.to_path_buf();
        let r = within(Duration::from_secs(10), move || {
            let m = SharedFsMutex::open(alg, &p).unwrap();
            m.try_lock(&[s(1), x(3)]).map(|_| ())
        });
        assert!(matches!(r, Err(Error::WouldBlock)), "{alg}: {r:?}");
    });
}

/// Defect 3: a finite deadline is honoured: TimedOut, not success after the
/// holder lets go (the holder here never lets go while we wait).
#[test]
fn defect3_finite_deadline_times_out() {
    each(|alg, path| {
        let holder = SharedFsMutex::open(alg, path).unwrap();
        let g = holder.lock(&[x(4)], Deadline::Never).unwrap();
        let p = path.to_path_buf();
        let (r, took) = within(Duration::from_secs(10), move || {
            let m = SharedFsMutex::open(alg, &p).unwrap();
            let t = Instant::now();
            let r = m
                .lock(&[x(4)], Deadline::After(Duration::from_millis(200)))
                .map(|_| ());
            (r, t.elapsed())
        });
        drop(g);
        assert!(matches!(r, Err(Error::TimedOut)), "{alg}: {r:?}");
        assert!(
            took >= Duration::from_millis(195) && took < Duration::from_millis(700),
            "{alg}: {took:?}"
        );
    });
}

/// Defect 4: two threads of one process race to take the same entity shared
/// through one instance; when one of them lets go, the other must still hold
/// it, so an independent exclusive lock must not get in.
#[test]
fn defect4_thread_shared_release_keeps_other_threads_lock() {
    let rounds = 300;
    each(|alg, path| {
        if alg == Algorithm::LockFiles {
            return; // shared is exclusive there: the two threads cannot both hold it
        }
        let m = Arc::new(SharedFsMutex::open(alg, path).unwrap());
        let other = SharedFsMutex::open(alg, path).unwrap();
        for round in 0..rounds {
            let both = Arc::new(Barrier::new(2));
            let released = Arc::new(Barrier::new(2));
            let checked = Arc::new(Barrier::new(2));
            let t = {
                let (m, both, released, checked) =
                    (m.clone(), both.clone(), released.clone(), checked.clone());
                std::thread::spawn(move || {
                    let g = m.lock(&[s(11)], Deadline::Never).unwrap();
                    both.wait();
                    released.wait(); // main thread has dropped its guard
                    checked.wait();
                    drop(g);
                })
            };
            let g = m.lock(&[s(11)], Deadline::Never).unwrap();
            both.wait();
            drop(g);
            released.wait();
            let r = other.try_lock(&[x(11)]);
            assert!(
                matches!(r, Err(Error::WouldBlock)),
                "{alg}: round {round}: exclusive got in while a thread held shared"
            );
            checked.wait();
            t.join().unwrap();
        }
    });
}

/// Defect 5: a thread waiting with a deadline for another thread of its own
/// process is woken when that thread releases (it slept the whole deadline);
/// and opening a lock whose file does not exist yet works.
#[test]
fn defect5_thread_waiter_wakes_on_release_and_open_creates() {
    each(|alg, path| {
        assert!(!path.exists());
        let m = Arc::new(SharedFsMutex::open(alg, path).unwrap());
        let g = m.lock(&[x(12)], Deadline::Never).unwrap();
        let started = Arc::new(Barrier::new(2));
        let t = {
            let (m, started) = (m.clone(), started.clone());
            std::thread::spawn(move || {
                started.wait();
                let t0 = Instant::now();
                let r = m
                    .lock(&[x(12)], Deadline::After(Duration::from_secs(20)))
                    .map(|_| ());
                (r, t0.elapsed())
            })
        };
        started.wait();
        // Give the waiter time to go to sleep; the outcome does not depend on it.
        std::thread::sleep(Duration::from_millis(50));
        drop(g);
        let (r, took) = t.join().unwrap();
        assert!(r.is_ok(), "{alg}: {r:?}");
        assert!(
            took < Duration::from_secs(5),
            "{alg}: waiter slept {took:?} after release"
        );
    });
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid clock id and out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Defect 6: a waiter does not burn a core while the lock is held, and a
/// timed lock under contention is TimedOut, not "unsupported".
#[test]
fn defect6_waiters_sleep_and_timed_lock_is_supported() {
    each(|alg, path| {
        let holder = SharedFsMutex::open(alg, path).unwrap();
        let g = holder.lock(&[x(13), s(14)], Deadline::Never).unwrap();
        let p = path.to_path_buf();
        let (r, cpu) = within(Duration::from_secs(10), move || {
            let m = SharedFsMutex::open(alg, &p).unwrap();
            let c0 = thread_cpu();
            let r = m
                .lock(&[x(14), x(13)], Deadline::After(Duration::from_millis(600)))
                .map(|_| ());
            (r, thread_cpu() - c0)
        });
        drop(g);
        assert!(matches!(r, Err(Error::TimedOut)), "{alg}: {r:?}");
        assert!(
            cpu < Duration::from_millis(200),
            "{alg}: waiter used {cpu:?} of CPU in a 600 ms wait"
        );
    });
}

/// Defect 7: lock_files must not leave everyone blocked behind a crashed
/// holder (its files are broken once the owner is known dead), and retrying
/// after contention must not keep the old order (opposite orders finish; see
/// processes.rs). Here: a file left by a process that no longer exists.
#[test]
fn defect7_lock_files_breaks_dead_owner() {
    for dir in test_dirs() {
        let path = lock_path(Algorithm::LockFiles, dir.path());
        // Forge the record of a dead process: a child that has exited.
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = c.id();
        c.wait().unwrap();
        let m = SharedFsMutex::open(Algorithm::LockFiles, &path).unwrap();
        let g = m.lock(&[x(15)], Deadline::Never).unwrap();
        let file = path.join(format!("{:016x}", 15));
        let mine = std::fs::read_to_string(&file).unwrap();
        std::mem::forget(g); // leave the file behind, as a crash would
        drop(m); // and let go of the owner lock, as a crash would
        let forged = mine.replacen(
            &format!("pid {}\n", std::process::id()),
            &format!("pid {dead_pid}\n"),
            1,
        );
        assert_ne!(forged, mine);
        std::fs::write(&file, forged).unwrap();
        let m2 = SharedFsMutex::open(Algorithm::LockFiles, &path).unwrap();
        let _g = m2
            .try_lock(&[x(15)])
            .expect("try_lock breaks a dead owner's file");
        // The file is ours now.
        assert_eq!(std::fs::read_to_string(&file).unwrap(), mine);
    }
}

/// Defect 8 is the absence of these tests. In addition: many entities, many
/// threads, every algorithm, checked by a counter only touched under the lock.
#[test]
fn defect8_many_threads_many_entities() {
    each(|alg, path| {
        let m = Arc::new(SharedFsMutex::open(alg, path).unwrap());
        let counter = Arc::new(parking_lot::Mutex::new((false, 0u64)));
        let n = if alg == Algorithm::LockFiles {
            100
        } else {
            500
        };
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let (m, counter) = (m.clone(), counter.clone());
                std::thread::spawn(move || {
                    for i in 0..n {
                        let mut ents = vec![x(20), x(21 + t % 2), s(30), x(40 + i % 5)];
                        if (t + i) % 2 == 1 {
                            ents.reverse();
                        }
                        let g = m
                            .lock(&ents, Deadline::After(Duration::from_secs(60)))
                            .unwrap();
                        {
                            let mut c = counter.try_lock().expect("two threads inside at once");
                            assert!(!c.0);
                            c.0 = true;
                            c.1 += 1;
                            c.0 = false;
                        }
                        drop(g);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(counter.lock().1, 4 * n);
    });
}

/// memory_map: a user that cannot open the index makes everyone fall back to
/// byte_ranges, after the index users have left; locks still exclude each
/// other; once everybody has left, the next user makes a fresh index.
#[test]
fn memory_map_falls_back_when_index_unreachable() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let path = dir.path().join("lock");
    let a = SharedFsMutex::open(Algorithm::MemoryMap, &path).unwrap();
    assert!(!a.is_fallback());
    let p = path.clone();
    let remote = std::thread::spawn(move || {
        let opts = Options {
            simulate_unreachable_index: true,
            ..Options::default()
        };
        SharedFsMutex::open_with(Algorithm::MemoryMap, &p, &opts).unwrap()
    });
    // The remote user waits for the index user to leave.
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !remote.is_finished(),
        "remote user did not wait for index users"
    );
    drop(a);
    let remote = remote.join().unwrap();
    assert!(remote.is_fallback());
    let local = SharedFsMutex::open(Algorithm::MemoryMap, &path).unwrap();
    assert!(
        local.is_fallback(),
        "a later local user must use the fallback too"
    );
    let g = remote.lock(&[x(5)], Deadline::Never).unwrap();
    assert!(matches!(local.try_lock(&[s(5)]), Err(Error::WouldBlock)));
    drop(g);
    let g = local.try_lock(&[x(5)]).unwrap();
    drop(g);
    drop(local);
    drop(remote);
    let fresh = SharedFsMutex::open(Algorithm::MemoryMap, &path).unwrap();
    assert!(!fresh.is_fallback());
}

/// The spin option (busy-wait instead of sleeping) honours deadlines and
/// acquires once the holder lets go, for every algorithm.
#[test]
fn spin_option_times_out_and_acquires() {
    each(|alg, path| {
        let holder = SharedFsMutex::open(alg, path).unwrap();
        let g = holder.lock(&[x(16)], Deadline::Never).unwrap();
        let m = Arc::new(SharedFsMutex::open(alg, path).unwrap());
        let t = Instant::now();
        let r = m.lock_with(&[x(16)], Deadline::After(Duration::from_millis(100)), true);
        let took = t.elapsed();
        assert!(
            matches!(r, Err(Error::TimedOut)),
            "{alg}: {:?}",
            r.map(|_| ())
        );
        assert!(
            took >= Duration::from_millis(95) && took < Duration::from_millis(600),
            "{alg}: {took:?}"
        );
        let started = Arc::new(Barrier::new(2));
        let waiter = {
            let (m, started) = (m.clone(), started.clone());
            std::thread::spawn(move || {
                started.wait();
                m.lock_with(
                    &[x(16), s(17)],
                    Deadline::After(Duration::from_secs(20)),
                    true,
                )
                .map(|_| ())
            })
        };
        started.wait();
        drop(g);
        let r = waiter.join().unwrap();
        assert!(r.is_ok(), "{alg}: {r:?}");
    });
}
