//! Thin, checked wrappers over the Linux calls the algorithms need: open file
//! description locks (with a timed blocking wait), futexes, and the identity of
//! a process (pid, start time, boot) used to recognise dead owners.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::OnceLock;
use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

/// Kind of byte-range lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LockKind {
    Shared,
    Exclusive,
    Unlock,
}

fn flock(kind: LockKind, start: u64, len: u64) -> libc::flock {
    // SAFETY: flock is plain old data; all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = match kind {
        LockKind::Shared => libc::F_RDLCK,
        LockKind::Exclusive => libc::F_WRLCK,
        LockKind::Unlock => libc::F_UNLCK,
    } as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start as libc::off_t;
    fl.l_len = len as libc::off_t;
    fl.l_pid = 0; // required to be 0 for OFD locks
    fl
}

/// Non-blocking OFD lock change. `Ok(false)` means another description holds
/// a conflicting lock.
pub(crate) fn ofd_setlk(
    fd: BorrowedFd<'_>,
    kind: LockKind,
    start: u64,
    len: u64,
) -> io::Result<bool> {
    let fl = flock(kind, start, len);
    loop {
        // SAFETY: fd is a valid open descriptor; fl is a valid flock.
        let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
        if r == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EACCES) => return Ok(false),
            Some(libc::EINTR) => continue,
            _ => return Err(e),
        }
    }
}

/// Blocking OFD lock with no deadline.
pub(crate) fn ofd_setlkw(
    fd: BorrowedFd<'_>,
    kind: LockKind,
    start: u64,
    len: u64,
) -> io::Result<()> {
    let fl = flock(kind, start, len);
    loop {
        // SAFETY: fd is a valid open descriptor; fl is a valid flock.
        let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLKW, &fl) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// True when some other open file description holds a lock on the range that
/// conflicts with an exclusive lock.
pub(crate) fn ofd_is_locked(fd: BorrowedFd<'_>, start: u64, len: u64) -> io::Result<bool> {
    let mut fl = flock(LockKind::Exclusive, start, len);
    // SAFETY: fd is valid; fl is a valid, writable flock.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

/// The real-time signal used to interrupt a timed F_OFD_SETLKW. Chosen near
/// the top of the range, which applications rarely use.
pub(crate) fn wake_signal() -> libc::c_int {
    libc::SIGRTMAX() - 3
}

extern "C" fn noop_handler(_: libc::c_int) {}

/// Installs (once) a no-op handler without SA_RESTART for the wake signal, so
/// that a blocked fcntl returns EINTR when the signal arrives.
fn install_wake_handler() -> io::Result<()> {
    static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();
    let r = INSTALLED.get_or_init(|| {
        let sig = wake_signal();
        // SAFETY: zeroed sigaction is valid; we query the current action.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: querying with a null new action is allowed.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
            return Err(io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL));
        }
        if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN {
            // Someone else owns the signal: do not steal it.
            return Err(libc::EBUSY);
        }
        // SAFETY: as above.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = noop_handler as *const () as usize;
        sa.sa_flags = 0; // deliberately no SA_RESTART
        // SAFETY: sa_mask is a valid sigset_t to initialise.
        unsafe { libc::sigemptyset(&mut sa.sa_mask) };
        // SAFETY: valid signal number and action.
        if unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL));
        }
        Ok(())
    });
    r.map_err(io::Error::from_raw_os_error)
}

/// A per-thread POSIX timer that sends the wake signal to the calling thread
/// at the deadline and then every millisecond, until dropped. The repeat
/// closes the race where the first signal lands just before the thread
/// enters the blocking call.
struct ThreadTimer {
    id: libc::timer_t,
    old_mask: libc::sigset_t,
}

impl ThreadTimer {
    fn arm(after: Duration) -> io::Result<Self> {
        install_wake_handler()?;
        let sig = wake_signal();
        // SAFETY: sigevent is plain data; zeroed is valid before filling.
        let mut sev: libc::sigevent = unsafe { std::mem::zeroed() };
        sev.sigev_notify = libc::SIGEV_THREAD_ID;
        sev.sigev_signo = sig;
        // SAFETY: gettid has no preconditions.
        sev.sigev_notify_thread_id = unsafe { libc::gettid() };
        let mut id: libc::timer_t = std::ptr::null_mut();
        // SAFETY: valid clock, event and out pointer.
        if unsafe { libc::timer_create(libc::CLOCK_MONOTONIC, &mut sev, &mut id) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // Make sure the signal can reach this thread while it waits.
        // SAFETY: sigset_t is plain data, for which all zeroes is a valid
        // (if unspecified) value; sigemptyset below makes it a proper set.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above; pthread_sigmask overwrites it.
        let mut old_mask: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` and `old_mask` are live locals, `sig` a signal number
        // the timer was just created with; changing this thread's own mask
        // touches no memory of others.
        unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, &mut old_mask);
        }
        let timer = ThreadTimer { id, old_mask };
        let after = after.max(Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 1_000_000,
            },
            it_value: libc::timespec {
                tv_sec: after.as_secs() as libc::time_t,
                tv_nsec: after.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: id is a live timer; spec is valid.
        if unsafe { libc::timer_settime(timer.id, 0, &spec, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(timer)
    }
}

impl Drop for ThreadTimer {
    fn drop(&mut self) {
        // SAFETY: id is a live timer owned by us; old_mask was filled by
        // pthread_sigmask above.
        unsafe {
            libc::timer_delete(self.id);
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.old_mask, std::ptr::null_mut());
        }
    }
}

/// Blocking OFD lock that gives up at `deadline`. Sleeps in the kernel (no
/// polling); a per-thread timer signal interrupts the wait at the deadline.
/// Returns `Ok(false)` on timeout.
pub(crate) fn ofd_setlkw_until(
    fd: BorrowedFd<'_>,
    kind: LockKind,
    start: u64,
    len: u64,
    deadline: Instant,
) -> io::Result<bool> {
    if ofd_setlk(fd, kind, start, len)? {
        return Ok(true);
    }
    let now = Instant::now();
    if now >= deadline {
        return Ok(false);
    }
    let _timer = ThreadTimer::arm(deadline - now)?;
    let fl = flock(kind, start, len);
    loop {
        // SAFETY: fd is valid; fl is a valid flock.
        let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLKW, &fl) };
        if r == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
    }
}

/// Sleeps while `*word == expected`, at most `timeout`. Shared (not private)
/// futex: the word lives in memory mapped by several processes.
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts;
    let tsp = match timeout {
        Some(t) => {
            ts = libc::timespec {
                tv_sec: t.as_secs() as libc::time_t,
                tv_nsec: t.subsec_nanos() as libc::c_long,
            };
            &ts as *const libc::timespec
        }
        None => std::ptr::null(),
    };
    // SAFETY: word is a valid, aligned u32 that outlives the call; the kernel
    // only reads it. Errors (EAGAIN, ETIMEDOUT, EINTR) all mean "re-check".
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            tsp,
            0usize,
            0u32,
        );
    }
}

/// Wakes every waiter sleeping on `word`.
pub(crate) fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: word is a valid aligned u32; FUTEX_WAKE does not dereference
    // anything else.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            0usize,
            0usize,
            0u32,
        );
    }
}

/// Who a process is, in a form that survives pid reuse: pid, its start time
/// in clock ticks since boot, and a hash of the boot id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ProcessId {
    pub pid: u32,
    pub start: u64,
    pub boot: u64,
}

pub(crate) fn boot_id_hash() -> u64 {
    static BOOT: OnceLock<u64> = OnceLock::new();
    *BOOT.get_or_init(|| {
        let s = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let h = crate::hash_bytes(s.trim().as_bytes());
        // 0 means "unknown" in records; avoid it.
        h.max(1)
    })
}

/// State letter (field 3) and start time (field 22) of /proc/PID/stat, or
/// None if the process is gone (or was reaped).
pub(crate) fn process_stat(pid: u32) -> Option<(char, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: parse after the
    // last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    // Fields after ')' start at field 3 (state); starttime is field 22.
    let state = f.next()?.chars().next()?;
    Some((state, f.nth(18)?.parse().ok()?))
}

/// Start time (field 22 of /proc/PID/stat), or None if the process is gone.
pub(crate) fn process_start_time(pid: u32) -> Option<u64> {
    process_stat(pid).map(|(_, t)| t)
}

/// Inode of our pid namespace (`readlink /proc/self/ns/pid` = `pid:[N]`), or
/// 0 when it cannot be read. A pid only means something inside its namespace.
pub(crate) fn pid_ns() -> u64 {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .and_then(|l| {
            let s = l.to_string_lossy().into_owned();
            s.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
        })
        .unwrap_or(0)
}

/// True when the /proc we see belongs to our own pid namespace (a process
/// moved with `unshare --pid` but without `--mount-proc` sees its parent's):
/// only then do pids recorded in our namespace name entries of this /proc.
pub(crate) fn proc_is_ours() -> bool {
    std::fs::read_link("/proc/self")
        .ok()
        .and_then(|l| l.to_string_lossy().parse::<u32>().ok())
        == Some(std::process::id())
}

pub(crate) fn current_process() -> ProcessId {
    // Cached per pid so that a fork child does not inherit its parent's identity.
    static ME: OnceLock<parking_lot::Mutex<Option<ProcessId>>> = OnceLock::new();
    let pid = std::process::id();
    let cell = ME.get_or_init(|| parking_lot::Mutex::new(None));
    let mut g = cell.lock();
    if let Some(p) = *g
        && p.pid == pid
    {
        return p;
    }
    let p = ProcessId {
        pid,
        start: process_start_time(pid).unwrap_or(0),
        boot: boot_id_hash(),
    };
    *g = Some(p);
    p
}

/// Liveness of a recorded owner, as far as this machine can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Liveness {
    Alive,
    Dead,
    /// Recorded on another boot of another machine: cannot be checked here.
    Unknown,
}

/// Liveness judged from the pid alone (records of older versions, which
/// hold no OS lock): only valid for owners in our own pid namespace, which
/// those records cannot tell. A zombie (exited, not yet reaped) is dead.
pub(crate) fn liveness(owner: ProcessId) -> Liveness {
    if owner.boot != boot_id_hash() {
        return Liveness::Unknown;
    }
    match process_stat(owner.pid) {
        None => Liveness::Dead,
        Some((_, t)) if owner.start != 0 && t != owner.start => Liveness::Dead,
        Some(('Z', _)) | Some(('X', _)) => Liveness::Dead,
        Some(_) => Liveness::Alive,
    }
}
