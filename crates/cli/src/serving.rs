//! What every serving process of `memfs mount` shares, whatever it serves
//! (a tree of its own or a volume: volume_mount.rs): the readiness report to
//! its starter, the signals that unmount, and the parsers of sizes and seconds.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use memfs_fuse::mounts::lazy_unmount;

pub(crate) fn parse_size(s: &str) -> anyhow::Result<u64> {
    let s = s.trim();
    if let Some(p) = s.strip_suffix('%') {
        let pct: f64 = p
            .parse()
            .ok()
            .filter(|v: &f64| *v > 0.0 && *v <= 100.0)
            .with_context(|| format!("invalid size {s:?}: a percentage must be in (0, 100]"))?;
        return Ok((memfs_fs::physical_memory() as f64 * pct / 100.0) as u64);
    }
    let v = memfs_durable::parse_bytes(s)
        .map_err(|e| anyhow::anyhow!("invalid size {s:?}: {e} (use e.g. 512M, 4G, 50%)"))?;
    if v < memfs_fs::PAGE_SIZE as u64 {
        bail!("invalid size {s:?}: must be at least one page (4K)");
    }
    Ok(v)
}

pub(crate) fn parse_secs(name: &str, s: &str) -> anyhow::Result<Duration> {
    let v: f64 = s
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v >= 0.0)
        .with_context(|| format!("invalid {name} {s:?}: expected seconds, e.g. 1 or 0.5"))?;
    Ok(Duration::from_secs_f64(v))
}

/// Tells the starting process (or, in the foreground, the user) that the
/// mount is usable.
pub(crate) fn report_ready(
    mountpoint: &Path,
    notify: bool,
    report: Option<&str>,
) -> anyhow::Result<()> {
    if notify {
        let mut out = std::io::stdout();
        match report {
            Some(r) => writeln!(out, "ready\t{r}"),
            None => writeln!(out, "ready"),
        }
        .context("cannot report readiness")?;
        out.flush().ok();
        // From now on nobody reads our output.
        if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
            let _ = nix::unistd::dup2_stdout(&null);
        }
    } else {
        eprintln!(
            "memfs: mounted at {} (foreground; Ctrl-C or memfs umount {} to stop)",
            mountpoint.display(),
            mountpoint.display()
        );
    }
    Ok(())
}

/// Unmounts a served mount point at SIGINT or SIGTERM (lazily when it is
/// busy: the kernel finishes when the last user leaves), which ends the
/// serving loop; [`UnmountOnSignal::stop`] once the loop has returned.
pub(crate) struct UnmountOnSignal {
    handle: signal_hook::iterator::Handle,
    thread: std::thread::JoinHandle<()>,
}

impl UnmountOnSignal {
    pub(crate) fn start(
        mut unmounter: memfs_fuse::Unmounter,
        mountpoint: &Path,
    ) -> anyhow::Result<UnmountOnSignal> {
        let mut signals = signal_hook::iterator::Signals::new([
            signal_hook::consts::SIGINT,
            signal_hook::consts::SIGTERM,
        ])
        .context("cannot install signal handlers")?;
        let handle = signals.handle();
        let mp = mountpoint.to_path_buf();
        let thread = std::thread::spawn(move || {
            if let Some(sig) = signals.forever().next() {
                tracing::info!("signal {sig}: unmounting {}", mp.display());
                if unmounter.unmount().is_err() {
                    lazy_unmount(&mp);
                }
            }
        });
        Ok(UnmountOnSignal { handle, thread })
    }

    pub(crate) fn stop(self) {
        self.handle.close();
        let _ = self.thread.join();
    }
}
