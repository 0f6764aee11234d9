//! `memfs send --cluster URL --volume V` and `memfs receive --cluster URL
//! --volume V`: a volume's whole tree as a full `memfs send` stream, and
//! such a stream into a new or empty volume (docs/cluster.md, "Send and
//! receive"). Glue only: the volume's side is `memfs_cluster::transfer`
//! (Volume ⇄ `memfs_fs::Fs`), the stream's is `memfs_durable::send`
//! (`Fs` ⇄ stream).

use std::io::{Read, Write};

use anyhow::{Context, bail};
use memfs_cluster::admin::{Admin, CreateOptions};
use memfs_cluster::{Volume, VolumeOptions, transfer};
use memfs_durable::send::{self as stream, ReceiveReport, SendReport};

/// Where a volume is, from the command line.
pub struct At<'a> {
    /// `--cluster` as given.
    pub cluster: &'a str,
    pub volume: &'a str,
}

impl At<'_> {
    fn seeds(&self) -> anyhow::Result<Vec<String>> {
        memfs_cluster::topology::seeds(self.cluster).map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// Opens the volume (a session of its own); `None` if there is none of
    /// that name.
    fn open(&self, seeds: &[String], what: &str) -> anyhow::Result<Option<std::sync::Arc<Volume>>> {
        let opts = VolumeOptions {
            mountpoint: format!("memfs {what}"),
            ..VolumeOptions::default()
        };
        match Volume::open(seeds, self.volume, &opts) {
            Ok(v) => Ok(Some(v)),
            Err(memfs_cluster::Error::NotFound(_)) => Ok(None),
            Err(e) => Err(e).with_context(|| format!("volume {} of {}", self.volume, self.cluster)),
        }
    }
}

/// Reads the whole volume into memory and writes it to `out` as snapshot
/// `name` (default: the volume's name).
pub fn send(at: &At<'_>, name: Option<&str>, out: &mut dyn Write) -> anyhow::Result<SendReport> {
    let seeds = at.seeds()?;
    let Some(vol) = at.open(&seeds, "send")? else {
        bail!("no volume {:?} on {}", at.volume, at.cluster);
    };
    let fs = transfer::volume_to_fs(&vol);
    let closed = vol.close();
    let fs = fs.with_context(|| format!("reading volume {}", at.volume))?;
    closed.context("closing the volume")?;
    let name = name.unwrap_or(at.volume);
    let source = format!("volume {} of {}", at.volume, at.cluster);
    stream::send_tree(&fs, name, &source, out).with_context(|| {
        format!(
            "sending volume {} as snapshot {name:?} (memfs send NAME --cluster ... names it)",
            at.volume
        )
    })
}

/// Reads a whole full stream from `inp`, checks it, and only then writes it
/// into the volume: created if it does not exist, else it must be empty.
/// A volume this created is deleted again if writing it fails.
pub fn receive(at: &At<'_>, inp: &mut dyn Read) -> anyhow::Result<ReceiveReport> {
    let seeds = at.seeds()?;
    // Refused before the stream is read, as a non-empty data directory is.
    let existed = match at.open(&seeds, "receive")? {
        Some(vol) => {
            let empty = transfer::check_empty(&vol);
            vol.close().context("closing the volume")?;
            empty.with_context(|| format!("volume {}", at.volume))?;
            true
        }
        None => false,
    };
    let (fs, report) = stream::receive_tree(inp)?;
    transfer::check_supported(&fs).with_context(|| format!("volume {}", at.volume))?;
    let admin = Admin::connect(&seeds).with_context(|| format!("cluster {}", at.cluster))?;
    if !existed {
        let options = CreateOptions {
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
            ..CreateOptions::default()
        };
        admin
            .create(at.volume, &options)
            .with_context(|| format!("creating volume {}", at.volume))?;
    }
    let written = write(at, &seeds, &fs);
    if written.is_err()
        && !existed
        && let Err(e) = admin.delete(at.volume, false)
    {
        eprintln!(
            "memfs receive: the half-written volume {} is left: {e}",
            at.volume
        );
    }
    let w = written?;
    eprintln!(
        "wrote {} nodes, {} further links, {} MiB of data into volume {}",
        w.nodes,
        w.links,
        w.bytes >> 20,
        at.volume
    );
    Ok(report)
}

fn write(at: &At<'_>, seeds: &[String], fs: &memfs_fs::Fs) -> anyhow::Result<transfer::Written> {
    let Some(vol) = at.open(seeds, "receive")? else {
        bail!("volume {} was deleted while receiving", at.volume);
    };
    let w = transfer::fs_to_volume(fs, &vol);
    let closed = vol.close();
    let w = w.with_context(|| format!("writing volume {}", at.volume))?;
    closed.context("closing the volume")?;
    Ok(w)
}
