//! System calls a server makes on its own mount (statvfs, a read-only
//! remount, syncfs), made so that a SIGKILL can never leave the process
//! behind.
//!
//! Such a call waits in the kernel for a FUSE request that one of our own
//! workers must answer. If the process is killed after a worker has read
//! that request, nobody ever answers it, and the kernel waits for a sent
//! request without giving up on a fatal signal (`request_wait_answer`). The
//! calling thread then never exits, and it shares the descriptor table that
//! holds `/dev/fuse` open: the connection is never aborted, the process
//! stays a zombie for good, and so does its mount (session 21 met exactly
//! this in CI: the read-only watch thread stuck in `statvfs`).
//!
//! So these calls run on a thread of their own whose descriptor table is
//! private and holds none of the process's descriptors. When the process is
//! killed, the other threads exit, the last `/dev/fuse` descriptor closes,
//! the kernel aborts the connection, and the waiting call returns ENOTCONN.

//!
//! Such a call can also wait for good while the server lives: when a
//! worker never answers (wedged), the kernel never gives up. So the caller
//! waits at most a bound ([`LIMIT`]) and then gets `TimedOut` and a log
//! line; the call's thread is left behind (it ends when the kernel
//! answers, or with the process: it holds no descriptor of ours).

use std::io;
use std::time::Duration;

/// How long a caller waits for a call on its own mount: the syncfs before a
/// snapshot or rollback and the read-only remount write back the kernel's
/// dirty pages through our workers, at most the dirty limit (`dirty_ratio`,
/// a few GiB) at tens of MB/s on a loaded machine: a minute or two. 300 s
/// is well past that and under the 600 s a control client waits for its
/// reply, so that the client gets this error, not its own timeout.
pub const LIMIT: Duration = Duration::from_secs(300);

/// Runs `f` on a new thread that has a private descriptor table holding
/// only standard input, output and error, and returns its result, or
/// `TimedOut` if it has not returned within `limit` (logged, naming
/// `what`). `f` must open whatever it needs itself (a path, not a
/// descriptor of ours).
pub fn call<T: Send + 'static>(
    what: &str,
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> io::Result<T> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("memfs-own-mount".into())
        .spawn(move || {
            // SAFETY: CLOSE_RANGE_UNSHARE first gives this thread a
            // private copy of the descriptor table, so the close only
            // touches that copy: every descriptor the rest of the
            // process owns stays open there. This thread is new and
            // owns no descriptor above 2 itself, so nothing in it
            // refers to what is closed.
            let r = unsafe {
                libc::close_range(
                    3,
                    libc::c_uint::MAX,
                    libc::CLOSE_RANGE_UNSHARE as libc::c_int,
                )
            };
            let out = if r != 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)))
            };
            // The caller may have given up: then nobody wants the result.
            let _ = tx.send(out);
        })?;
    match rx.recv_timeout(limit) {
        Ok(Ok(Ok(v))) => Ok(v),
        Ok(Ok(Err(panic))) => std::panic::resume_unwind(panic),
        Ok(Err(e)) => Err(e),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            tracing::error!(
                "{what} on our own mount has not returned within {limit:?} \
                 (a FUSE request to this server is not answered); giving up on it"
            );
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{what} did not return within {limit:?}"),
            ))
        }
        // The thread ended without sending: it cannot (the send is its
        // last step), but an error is the answer if it did.
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(io::Error::other(format!(
            "{what}: its thread ended without a result"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn is_open(fd: i32) -> bool {
        // SAFETY: F_GETFD only reads the descriptor's flags.
        unsafe { libc::fcntl(fd, libc::F_GETFD) != -1 }
    }

    #[test]
    fn the_call_sees_none_of_our_descriptors_and_we_keep_them() {
        let f = tempfile::tempfile().unwrap();
        let fd = f.as_raw_fd();
        assert!(fd > 2);
        let (inside, opened) = call("a test call", LIMIT, move || {
            // What the call opens is its own and works.
            let own = std::fs::File::open("/proc/self/status").map(|_| ());
            (is_open(fd), own)
        })
        .unwrap();
        assert!(!inside, "descriptor {fd} is visible inside the call");
        opened.unwrap();
        assert!(
            is_open(fd),
            "the call closed descriptor {fd} for the process"
        );
        // And the caller's file still works.
        use std::io::Write;
        (&f).write_all(b"still open").unwrap();
    }

    #[test]
    fn a_call_that_never_returns_is_a_timeout_error() {
        // The call waits for a message that comes only after the verdict.
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let r = call("a stuck test call", Duration::from_millis(50), move || {
            let _ = wait.recv();
        });
        let e = r.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(e.to_string().contains("a stuck test call"), "{e}");
        // Lets the call's thread end.
        drop(release);
    }

    #[test]
    fn a_panic_in_the_call_reaches_the_caller() {
        let r = std::panic::catch_unwind(|| call("a test call", LIMIT, || panic!("inside")));
        assert!(r.is_err());
    }
}
