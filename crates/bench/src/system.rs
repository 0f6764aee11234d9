//! The few facts about the running system the benchmarks need (who we are,
//! what is mounted, how to detach a mount: `memfs_fuse::mounts`, shared with
//! the command), and the control socket of a durable mount. The command keeps
//! its own control client in `crates/cli/src/control.rs`, beside the server.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};

/// The socket a mounted durable memfs answers on (see `crates/cli/src/control.rs`).
const CONTROL_SOCKET: &str = "control.sock";

pub use memfs_fuse::mounts::{is_mounted, is_root, lazy_unmount};

/// Sends one request to the memfs serving `data_dir` (`checkpoint`, `sync`, ...).
pub fn control_request(data_dir: &Path, req: &str) -> anyhow::Result<Vec<String>> {
    let path = data_dir.join(CONTROL_SOCKET);
    let conn = UnixStream::connect(&path).with_context(|| {
        format!(
            "the data directory {} is in use, but its control socket {} does not answer",
            data_dir.display(),
            path.display()
        )
    })?;
    conn.set_read_timeout(Some(Duration::from_secs(600)))?;
    (&conn).write_all(format!("{req}\n").as_bytes())?;
    conn.shutdown(std::net::Shutdown::Write)?;
    let mut lines = BufReader::new(&conn).lines();
    let first = lines
        .next()
        .context("the running memfs closed the control connection without a reply")??;
    if let Some(msg) = first.strip_prefix("error ") {
        bail!("{msg}");
    }
    if first != "ok" {
        bail!("unexpected reply from the running memfs: {first:?}");
    }
    Ok(lines.collect::<Result<_, _>>()?)
}
