//! `memfs mount M --cluster URL --volume NAME`: a mount of a memfs volume
//! kept in a Redis Cluster (docs/cluster.md), served by the same adapter as
//! a tree of this process (memfs_fuse::Tree for memfs_cluster::Volume).
//!
//! This module resolves the volume's options (flags and `-o`), and serves
//! the mount: opens the volume (a session in the cluster), mounts it, answers
//! `memfs status M` on the control socket, and closes the volume (its dirty
//! files flushed, its session ended) when the mount ends, by unmount or
//! SIGTERM.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use memfs_cluster::{Volume, VolumeOptions, VolumeStatus};
use memfs_fuse::MountOptions;

/// The default bytes of blocks and metadata a mount caches.
const DEFAULT_CACHE_SIZE: u64 = 1 << 30;
/// The default session lease.
const DEFAULT_LEASE: Duration = Duration::from_secs(20);

/// The volume options as given (flags, then `-o`, a later one winning).
#[derive(Default)]
pub struct Requested {
    pub cluster: Option<String>,
    pub volume: Option<String>,
    pub cache_size: Option<String>,
    pub timeout: Option<String>,
    pub lease: Option<String>,
    /// `--locks kernel` was asked for: a volume's locks must hold across mounts.
    pub kernel_locks: bool,
}

impl Requested {
    /// One more `HOST:PORT` of `-o cluster=...` (split off at its comma).
    pub fn add_seed(&mut self, seed: &str) {
        if let Some(c) = &mut self.cluster {
            c.push(',');
            c.push_str(seed);
        }
    }
}

/// Whether an `-o` item is a cluster node rather than an option:
/// `redis://...` or `HOST:PORT` (no `=`: no option has that shape).
pub fn is_seed(opt: &str) -> bool {
    !opt.contains('=')
        && (opt.starts_with("redis://")
            || opt
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()))
}

/// A volume mount, resolved.
#[derive(Debug, Clone)]
pub struct VolumeSettings {
    /// The cluster's nodes, `redis://HOST:PORT` each.
    pub seeds: Vec<String>,
    /// The `--cluster` value as given, for messages.
    pub cluster: String,
    pub name: String,
    pub cache_size: u64,
    pub timeout: Duration,
    pub lease: Duration,
}

/// The volume `req` asks for, if any, with the FUSE options a volume
/// needs set in `fuse`; a clear error for options that do not combine.
/// `local_only` names the options given that only a tree of this process
/// has (a volume mount refuses them).
pub(crate) fn settings(
    v: &Requested,
    local_only: &[&str],
    fuse: &mut MountOptions,
) -> anyhow::Result<Option<VolumeSettings>> {
    let (cluster, name) = match (&v.cluster, &v.volume) {
        (Some(c), Some(n)) => (c.clone(), n.clone()),
        (None, None) => {
            if v.cache_size.is_some() || v.timeout.is_some() || v.lease.is_some() {
                bail!(
                    "--cache-size and --cluster-timeout need --cluster and --volume (a volume mount)"
                );
            }
            return Ok(None);
        }
        (Some(_), None) => bail!("--cluster needs --volume NAME (the volume to mount)"),
        (None, Some(_)) => bail!("--volume needs --cluster redis://HOST:PORT (where it lives)"),
    };
    refuse_local_only(local_only)?;
    if v.kernel_locks {
        bail!(
            "a volume's record locks are kept in the cluster (they must hold across mounts): \
             --locks kernel does not apply"
        );
    }
    let seeds = memfs_cluster::topology::seeds(&cluster).map_err(|e| anyhow::anyhow!("{e}"))?;
    let cache_size = match &v.cache_size {
        Some(s) => crate::serving::parse_size(s).context("--cache-size")?,
        None => DEFAULT_CACHE_SIZE,
    };
    let timeout = positive_secs("--cluster-timeout", v.timeout.as_deref())?
        .unwrap_or(memfs_cluster::admin::DEFAULT_TIMEOUT);
    let lease = positive_secs("--lease-secs", v.lease.as_deref())?.unwrap_or(DEFAULT_LEASE);
    fuse.locks = memfs_fuse::LockMode::Engine;
    // The entry and attribute timeouts stay the local mount's: other
    // mounts' changes reach the kernel as notifications from the volume's
    // feed, and a lost feed drops every name (memfs_fuse::Change::All).
    if fuse.fsname == "memfs" {
        // The device column of /proc/mounts names the volume.
        fuse.fsname = format!("{FSNAME_PREFIX}{name}");
    }
    Ok(Some(VolumeSettings {
        seeds,
        cluster,
        name,
        cache_size,
        timeout,
        lease,
    }))
}

/// A volume keeps its tree, its history and its size in the cluster: the
/// options of a tree of this process do not apply.
fn refuse_local_only(given: &[&str]) -> anyhow::Result<()> {
    if given.is_empty() {
        return Ok(());
    }
    let verb = if given.len() == 1 { "does" } else { "do" };
    bail!(
        "{} {verb} not apply to a volume mount: a volume keeps its tree in the cluster (durable \
         there, with a replica per master), its size is the cluster's memory, and it has no \
         snapshots yet",
        given.join(", ")
    )
}

fn positive_secs(name: &str, s: Option<&str>) -> anyhow::Result<Option<Duration>> {
    let Some(s) = s else { return Ok(None) };
    let d = crate::serving::parse_secs(name, s)?;
    if d.is_zero() {
        bail!("invalid {name} {s:?}: must be more than 0 seconds");
    }
    Ok(Some(d))
}

/// Serves the volume at `mountpoint` until it is unmounted (or SIGTERM),
/// then closes it: its dirty files flushed, its session ended.
pub(crate) fn serve(
    mountpoint: &Path,
    fuse: &MountOptions,
    v: &VolumeSettings,
    notify: bool,
) -> anyhow::Result<()> {
    let opts = VolumeOptions {
        cache_size: v.cache_size,
        timeout: v.timeout,
        lease: v.lease,
        mountpoint: mountpoint.to_string_lossy().into_owned(),
    };
    let vol = Volume::open(&v.seeds, &v.name, &opts)
        .map_err(|e| anyhow::anyhow!("cannot open volume {} of {}: {e}", v.name, v.cluster))?;
    let served = mount_and_serve(mountpoint, fuse, &vol, notify);
    // Whatever happened to the mount: the session ends here, not at its
    // lease's end (its locks and its holds of unlinked files go with it).
    let closed = vol
        .close()
        .map_err(|e| anyhow::anyhow!("closing volume {}: {e}", v.name));
    served.and(closed)
}

fn mount_and_serve(
    mountpoint: &Path,
    fuse: &MountOptions,
    vol: &Arc<Volume>,
    notify: bool,
) -> anyhow::Result<()> {
    let mut mounted = memfs_fuse::mount_tree(vol.clone(), mountpoint, fuse)
        .map_err(|e| anyhow::anyhow!("cannot mount memfs at {}: {e}", mountpoint.display()))?;
    let handler: crate::control::Handler = {
        let vol = vol.clone();
        Arc::new(move |line: &str| answer(&vol, line))
    };
    let control = crate::control::serve_with(mountpoint, None, handler)?;
    let signals = crate::serving::UnmountOnSignal::start(mounted.unmounter(), mountpoint)?;
    crate::serving::report_ready(mountpoint, notify, None)?;
    let result = mounted.run();
    signals.stop();
    control.stop();
    result.with_context(|| format!("serving {}", mountpoint.display()))
}

/// A control request to a volume mount.
fn answer(vol: &Volume, line: &str) -> anyhow::Result<Vec<String>> {
    match line.split_once(' ').map_or(line, |(c, _)| c) {
        "kind" => Ok(vec!["volume".into()]),
        STATUS_REQUEST => Ok(status_lines(&vol.status())),
        cmd => bail!(
            "{cmd:?} does not apply to a volume mount (it has no snapshots, history or \
             remount options yet): memfs status and memfs volume status show it"
        ),
    }
}

/// What `memfs status M` prints of a volume mount.
fn status_lines(s: &VolumeStatus) -> Vec<String> {
    let bytes = crate::human::bytes;
    let lookups = s.cache_hits + s.cache_misses;
    vec![
        format!("cluster:    {}", s.seeds.join(",")),
        format!("volume:     {}", s.volume),
        format!("session:    {}", s.session),
        format!(
            "lease:      {}",
            if s.lease_ok {
                "held"
            } else {
                "LOST (calls fail with ESTALE until the mount is made again)"
            }
        ),
        format!(
            "cache:      {} of {} ({} hits, {} misses of {lookups} lookups)",
            bytes(s.cache_bytes),
            bytes(s.cache_limit),
            s.cache_hits,
            s.cache_misses
        ),
        format!("block size: {}", bytes(s.block_size.into())),
        format!(
            "calls:      {} namespace scripts, {} data path calls (since the mount)",
            s.scripts, s.data_calls
        ),
    ]
}

/// The prefix of a volume mount's source in /proc/mounts (unless mount(8)
/// named it otherwise).
const FSNAME_PREFIX: &str = "memfs-volume:";

/// The control request a volume mount answers with its status lines.
const STATUS_REQUEST: &str = "volume-status";

/// Whether the memfs at `mp` serves a volume: its server says so.
pub fn is_volume_mount(mp: &Path) -> bool {
    memfs_fuse::mounts::is_mounted(mp)
        && crate::control::mount_request(mp, "kind")
            .is_ok_and(|k| k.first().map(String::as_str) == Some("volume"))
}

/// `memfs status M` of a volume mount: what its server tells.
pub fn print_status(mp: &Path) -> anyhow::Result<()> {
    let lines = crate::control::mount_request(mp, STATUS_REQUEST)
        .with_context(|| format!("cannot ask the server of {} for its status", mp.display()))?;
    println!("mount:      {}", mp.display());
    for l in lines {
        println!("{l}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::is_seed;

    #[test]
    fn cluster_lists_go_on_after_commas() {
        assert!(is_seed("127.0.0.1:7001"));
        assert!(is_seed("redis://h:7001"));
        assert!(is_seed("node-2:6379"));
        assert!(!is_seed("ro"));
        assert!(!is_seed("volume=v"));
        assert!(!is_seed("x-systemd.automount"));
        assert!(!is_seed("host:notaport"));
    }
}
