//! Liveness across pid namespaces (issue 15, part 4): a holder in its own pid
//! namespace, as in any container, must keep its lock against waiters on the
//! host, and the reverse; a killed holder, and a dead holder nobody has
//! reaped (a zombie), must not block waiters, and waiters must sleep.
//!
//! Creating pid namespaces needs root and `unshare` (util-linux): without
//! them the namespace tests print why and pass without checking anything.

mod common;

use std::time::{Duration, Instant};

use common::*;
use memfs_lock::{Algorithm, Deadline, Error, SharedFsMutex};

/// Entry point of child processes; a no-op in a normal test run.
#[test]
fn child_entry() {
    if let Ok(role) = std::env::var(ROLE) {
        let code = child_main(&role);
        std::process::exit(code);
    }
}

/// The command prefix that runs a child in a new pid namespace with its own
/// /proc, or None (with the reason printed) when this machine cannot.
fn unshare_prefix() -> Option<&'static [&'static str]> {
    const PREFIX: &[&str] = &["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"];
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: pid namespace tests need root");
        return None;
    }
    let ok = std::process::Command::new(PREFIX[0])
        .args(&PREFIX[1..])
        .arg("true")
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("SKIPPED: `unshare --pid --fork --mount-proc` is unavailable here");
        return None;
    }
    Some(PREFIX)
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

/// Locks `ents` in this process with a deadline; returns the result, the
/// wall time and the CPU time the waiting thread used.
fn timed_lock(
    m: &SharedFsMutex,
    ents: &[memfs_lock::Entity],
    d: Duration,
) -> (Result<(), Error>, Duration, Duration) {
    let (c0, t0) = (thread_cpu(), Instant::now());
    let r = m.lock(ents, Deadline::After(d)).map(|_| ());
    (r, t0.elapsed(), thread_cpu() - c0)
}

/// A holder in a new pid namespace keeps X against host waiters (try_lock
/// and a bounded timed lock, in this process and in another host process),
/// and X comes free promptly once the holder is SIGKILLed.
fn holder_in_namespace(alg: Algorithm) {
    let Some(ns) = unshare_prefix() else { return };
    for dir in test_dirs() {
        let path = lock_path(alg, dir.path());
        let mut holder = Proc::spawn_via(ns, "hold", alg, &path, "x1,x2", &[]);
        holder.wait_ready();
        let m = SharedFsMutex::open(alg, &path).unwrap();
        for _ in 0..3 {
            assert!(
                matches!(m.try_lock(&[x(1)]), Err(Error::WouldBlock)),
                "{alg}: host try_lock took X from a live holder in another pid namespace ({})",
                dir.path().display()
            );
        }
        let (r, _, _) = timed_lock(&m, &[x(2)], Duration::from_millis(300));
        assert!(
            matches!(r, Err(Error::TimedOut)),
            "{alg}: host lock took X from a live holder in another pid namespace: {r:?}"
        );
        assert_eq!(
            Proc::spawn("try", alg, &path, "x1", &[]).finish(),
            2,
            "{alg}: another host process took X from the namespaced holder"
        );
        holder.sigkill();
        let (r, took, _) = timed_lock(&m, &[x(1), x(2)], Duration::from_secs(20));
        assert!(
            r.is_ok(),
            "{alg}: lock after the namespaced holder died: {r:?}"
        );
        assert!(
            took < Duration::from_secs(5),
            "{alg}: took {took:?} after death"
        );
    }
}

/// The reverse: a holder on the host, waiters in new pid namespaces.
fn waiter_in_namespace(alg: Algorithm) {
    let Some(ns) = unshare_prefix() else { return };
    for dir in test_dirs() {
        let path = lock_path(alg, dir.path());
        let mut holder = Proc::spawn("hold", alg, &path, "x1", &[]);
        holder.wait_ready();
        assert_eq!(
            Proc::spawn_via(ns, "try", alg, &path, "x1", &[]).finish(),
            2,
            "{alg}: namespaced try_lock took X from a live host holder ({})",
            dir.path().display()
        );
        let wait = [("MEMFS_LOCK_WAIT_MS", "300".to_string())];
        assert_eq!(
            Proc::spawn_via(ns, "lock", alg, &path, "x1", &wait).finish(),
            4,
            "{alg}: namespaced timed lock took X from a live host holder"
        );
        // A waiter already waiting when the holder dies gets X.
        let wait = [("MEMFS_LOCK_WAIT_MS", "20000".to_string())];
        let mut waiter = Proc::spawn_via(ns, "lock", alg, &path, "x1", &wait);
        holder.sigkill();
        assert_eq!(
            waiter.finish(),
            0,
            "{alg}: namespaced waiter did not get X after the host holder died"
        );
    }
}

/// A holder killed but not reaped (a zombie): waiters get its entities
/// without waiting for the reap, and sleep meanwhile.
fn zombie_holder(alg: Algorithm) {
    for dir in test_dirs() {
        let path = lock_path(alg, dir.path());
        let mut holder = Proc::spawn("hold", alg, &path, "x1,x2", &[]);
        holder.wait_ready();
        let m = SharedFsMutex::open(alg, &path).unwrap();
        // While it lives: the wait times out, asleep.
        let (r, took, cpu) = timed_lock(&m, &[x(1)], Duration::from_millis(300));
        assert!(matches!(r, Err(Error::TimedOut)), "{alg}: {r:?}");
        assert!(
            cpu < took / 5 + Duration::from_millis(20),
            "{alg}: waiter used {cpu:?} of CPU in {took:?} while the holder lived"
        );
        holder.kill_leave_zombie();
        let (r, took, cpu) = timed_lock(&m, &[x(1), x(2)], Duration::from_secs(20));
        assert!(
            r.is_ok(),
            "{alg}: lock while the dead holder is an unreaped zombie: {r:?} ({})",
            dir.path().display()
        );
        assert!(
            took < Duration::from_secs(5),
            "{alg}: waited {took:?} for a zombie holder"
        );
        assert!(
            cpu < took / 5 + Duration::from_millis(20),
            "{alg}: waiter used {cpu:?} of CPU in {took:?} behind a zombie"
        );
        // It died by the signal (it never released anything itself).
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(holder.child.wait().unwrap().signal(), Some(libc::SIGKILL));
    }
}

macro_rules! per_algorithm {
    ($($name:ident: $alg:expr;)*) => {$(
        mod $name {
            use super::*;
            #[test] fn holder_in_pid_namespace() { super::holder_in_namespace($alg) }
            #[test] fn waiter_in_pid_namespace() { super::waiter_in_namespace($alg) }
            #[test] fn zombie_holder() { super::zombie_holder($alg) }
        }
    )*};
}

per_algorithm! {
    lock_files: Algorithm::LockFiles;
    byte_ranges: Algorithm::ByteRanges;
    atomic_append: Algorithm::AtomicAppend;
    memory_map: Algorithm::MemoryMap;
}
