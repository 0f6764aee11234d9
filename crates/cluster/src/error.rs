//! The crate's one error type.

use std::path::PathBuf;

/// What can go wrong in this crate. Every variant says what to do about it
/// where there is something to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A command to the cluster failed (connection, timeout, a server error).
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// `volume create` of a name that is taken.
    #[error("volume {0:?} exists")]
    Exists(String),
    /// No volume of that name.
    #[error("no volume {0:?}")]
    NotFound(String),
    /// A volume name outside `[A-Za-z0-9._-]{{1,64}}`.
    #[error("bad volume name {name:?}: {why}")]
    BadName { name: String, why: &'static str },
    /// An option out of its range.
    #[error("bad option: {0}")]
    BadOption(String),
    /// A master whose `maxmemory-policy` may evict a volume's keys.
    #[error(
        "master {node} has maxmemory-policy {policy:?}: a volume needs noeviction \
         (CONFIG SET maxmemory-policy noeviction, and in its redis.conf)"
    )]
    Policy { node: String, policy: String },
    /// Live sessions (mounts) hold the volume.
    #[error("volume {name:?} has {sessions} live session(s): unmount it first, or force")]
    Busy { name: String, sessions: u64 },
    /// A clean needs the volume unmounted everywhere.
    #[error(
        "volume {name:?} has {sessions} live session(s): unmount it everywhere, \
         then clean it"
    )]
    InUse { name: String, sessions: u64 },
    /// A `memfs volume clean` holds the volume: no mount and no other clean
    /// meanwhile (or this clean lost its mark: it ran out).
    #[error(
        "volume {0:?} is being cleaned (memfs volume clean): try again once it ends \
         (its mark, {{V}}:cleaning, runs out by itself 5 minutes after a clean stops)"
    )]
    Cleaning(String),
    /// A program this crate runs is missing.
    #[error("{0} not installed: run scripts/setup")]
    NotInstalled(&'static str),
    /// A local cluster's process or file could not be handled.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A local cluster did not come up (the node's log is named).
    #[error("local cluster: {what} (log: {log})", log = log.display())]
    Start { what: String, log: PathBuf },
    /// The cluster answered something this crate cannot read.
    #[error("unexpected reply: {0}")]
    Protocol(String),
    /// A POSIX error decided on this side (a name too long, a bad offset).
    #[error("{0}")]
    Errno(memfs_fs::Errno),
    /// A node record that does not decode.
    #[error("bad node record: {0}")]
    BadRecord(String),
}

/// The crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An [`Error::Io`] naming what was being done.
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}
