//! The client side of a mounted durable memfs's control socket,
//! `<data-dir>/control.sock`: while a data directory is mounted its lock is
//! held, so commands (snapshot, diff, rollback, status) and benchmarks ask
//! the running server instead. The server is the command's (it swaps the
//! tree a FUSE mount serves); the protocol is here so that every client
//! speaks it the same way: one request line per connection, then a reply of
//! lines, first `ok` or `error MESSAGE`, then the payload.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The socket's name inside the data directory.
pub const SOCKET: &str = "control.sock";

/// How long a client waits for a reply: a checkpoint or a rollback of a
/// large tree takes minutes, and nothing else can be done meanwhile.
const REPLY_TIMEOUT: Duration = Duration::from_secs(600);

pub fn socket_path(data_dir: &Path) -> PathBuf {
    data_dir.join(SOCKET)
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(
        "the data directory {} is in use, but its control socket {} does not answer: {source}",
        dir.display(),
        socket.display()
    )]
    Unreachable {
        dir: PathBuf,
        socket: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("talking to the running memfs: {0}")]
    Io(#[from] io::Error),
    #[error("the running memfs closed the control connection without a reply")]
    NoReply,
    /// The server's `error MESSAGE`.
    #[error("{0}")]
    Refused(String),
    #[error("unexpected reply from the running memfs: {0:?}")]
    Unexpected(String),
}

/// Sends one request to the memfs serving `data_dir`; returns the payload
/// lines of an `ok` reply.
pub fn request(data_dir: &Path, req: &str) -> Result<Vec<String>, ControlError> {
    let socket = socket_path(data_dir);
    let conn = UnixStream::connect(&socket).map_err(|source| ControlError::Unreachable {
        dir: data_dir.to_path_buf(),
        socket: socket.clone(),
        source,
    })?;
    conn.set_read_timeout(Some(REPLY_TIMEOUT))?;
    (&conn).write_all(format!("{req}\n").as_bytes())?;
    conn.shutdown(std::net::Shutdown::Write)?;
    let mut lines = BufReader::new(&conn).lines();
    let first = lines.next().ok_or(ControlError::NoReply)??;
    if let Some(msg) = first.strip_prefix("error ") {
        return Err(ControlError::Refused(msg.to_string()));
    }
    if first != "ok" {
        return Err(ControlError::Unexpected(first));
    }
    Ok(lines.collect::<Result<_, _>>()?)
}
