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

use std::io;

/// Runs `f` on a new thread that has a private descriptor table holding
/// only standard input, output and error, and returns its result. `f`
/// must open whatever it needs itself (a path, not a descriptor of ours).
pub fn call<T: Send>(f: impl FnOnce() -> T + Send) -> io::Result<T> {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("memfs-own-mount".into())
            .spawn_scoped(s, move || {
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
                if r != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(f())
            })?
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
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
        let (inside, opened) = call(|| {
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
    fn a_panic_in_the_call_reaches_the_caller() {
        let r = std::panic::catch_unwind(|| call(|| panic!("inside")));
        assert!(r.is_err());
    }
}
