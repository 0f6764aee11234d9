//! The few facts about the running system the benchmarks need from the
//! `memfs` command's side (who we are, what is mounted, how to detach a
//! mount, the control socket of a durable mount). The command keeps its own
//! versions in `crates/cli/src/mount.rs` and `control.rs`; these are copies
//! so that this library does not depend on the binary crate.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

/// The socket a mounted durable memfs answers on (see `crates/cli/src/control.rs`).
const CONTROL_SOCKET: &str = "control.sock";

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Whether `path` is a mount point right now.
pub fn is_mounted(path: &Path) -> bool {
    let Ok(canon) = path.canonicalize() else {
        return false;
    };
    mount_points().contains(&canon)
}

fn mount_points() -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mount_path(p)))
        .collect()
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape_mount_path(p: &str) -> String {
    let b = p.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Detaches the mount at `mp` now (best effort: cleanup paths call this).
pub fn lazy_unmount(mp: &Path) {
    if is_root() {
        let _ = nix::mount::umount2(mp, nix::mount::MntFlags::MNT_DETACH);
    } else {
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg("-z")
            .arg(mp)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_paths_unescape() {
        assert_eq!(unescape_mount_path("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape_mount_path("/plain"), "/plain");
        assert!(is_mounted(Path::new("/")));
    }
}
