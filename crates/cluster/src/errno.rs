//! How a failure in the cluster reaches the kernel: one errno per cause.
//!
//! A script refuses an operation with an error reply that is the errno's
//! name (`redis.error_reply('ENOENT')`), so the rules and their errors stay
//! side by side in the script. Everything else maps by cause:
//!
//! | cause | errno |
//! |---|---|
//! | an error reply `E<NAME>` from a script | that errno |
//! | `ESTALE` from a script (the session's lease ran out: fenced) | ESTALE |
//! | `OOM` (the master is over `maxmemory`; nothing ran) | ENOSPC |
//! | a mount while `memfs volume clean` runs (`Error::Cleaning`) | EBUSY |
//! | a timeout, a lost connection, a cluster that is down | EIO |
//! | anything else (a reply this code cannot read) | EIO, logged |

use memfs_fs::Errno;

use crate::error::Error;

/// The errno for `e`.
pub fn errno_of(e: &Error) -> Errno {
    match e {
        Error::Redis(r) => redis_errno(r),
        Error::Errno(n) => *n,
        Error::Cleaning(_) => Errno::EBUSY,
        other => {
            tracing::warn!(error = %other, "cluster call failed");
            Errno::EIO
        }
    }
}

fn redis_errno(r: &redis::RedisError) -> Errno {
    if let Some(code) = r.code() {
        if code == "OOM" {
            return Errno::ENOSPC;
        }
        if let Some(n) = by_name(code) {
            return n;
        }
    }
    if !(r.is_io_error() || r.is_timeout() || r.is_connection_dropped()) {
        tracing::warn!(error = %r, "unexpected reply from the cluster");
    }
    Errno::EIO
}

/// The errnos a script may name.
fn by_name(name: &str) -> Option<Errno> {
    const NAMED: [Errno; 25] = [
        Errno::EPERM,
        Errno::ENOENT,
        Errno::EIO,
        Errno::EBADF,
        Errno::EAGAIN,
        Errno::EACCES,
        Errno::EEXIST,
        Errno::EXDEV,
        Errno::ENOTDIR,
        Errno::EISDIR,
        Errno::EINVAL,
        Errno::EFBIG,
        Errno::ENOSPC,
        Errno::EMLINK,
        Errno::ERANGE,
        Errno::EDEADLK,
        Errno::ENAMETOOLONG,
        Errno::ENOLCK,
        Errno::ENOTEMPTY,
        Errno::ELOOP,
        Errno::ENODATA,
        Errno::EBUSY,
        Errno::E2BIG,
        Errno::ESTALE,
        Errno::EOPNOTSUPP,
    ];
    NAMED.iter().copied().find(|e| e.name() == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_their_errno() {
        assert_eq!(by_name("ENOENT"), Some(Errno::ENOENT));
        assert_eq!(by_name("ESTALE"), Some(Errno::ESTALE));
        assert_eq!(by_name("ENOTEMPTY"), Some(Errno::ENOTEMPTY));
        assert_eq!(by_name("NOSCRIPT"), None);
        assert_eq!(errno_of(&Error::Errno(Errno::EEXIST)), Errno::EEXIST);
        assert_eq!(errno_of(&Error::Protocol("x".into())), Errno::EIO);
    }
}
