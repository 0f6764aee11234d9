//! `memfs volume create|list|status|delete|clean`: memfs volumes on a Redis
//! Cluster (docs/cluster.md). The administration itself is
//! `memfs_cluster::Admin`; this module only reads the command line and
//! prints what it did.

use anyhow::Context;
use memfs_cluster::admin::{Admin, CreateOptions};

/// Volumes: one memfs tree kept in a Redis Cluster (create, list, status, delete, clean).
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

/// Where the cluster is: every subcommand takes it.
#[derive(clap::Args)]
struct Cluster {
    /// The cluster: redis://HOST:PORT[,HOST:PORT...] (any of its nodes; more
    /// than one lets the command run while one is down).
    #[arg(long, value_name = "URL")]
    cluster: String,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Create a volume, with an empty root directory owned by the caller.
    Create {
        /// The volume's name: letters, digits, '.', '_' and '-', at most 64.
        name: String,
        #[command(flatten)]
        cluster: Cluster,
        /// Bytes per data block: a power of two from 4K to 4M.
        #[arg(long, default_value = "64K")]
        block_size: String,
    },
    /// List the cluster's volumes, one name a line.
    List {
        #[command(flatten)]
        cluster: Cluster,
    },
    /// A volume's format, counters, live sessions and metadata master.
    Status {
        name: String,
        #[command(flatten)]
        cluster: Cluster,
    },
    /// Delete a volume, its metadata and every data block.
    Delete {
        name: String,
        #[command(flatten)]
        cluster: Cluster,
        /// Delete even while mounts hold live sessions on it.
        #[arg(long)]
        force: bool,
    },
    /// Free the data blocks no file names (what mounts killed mid-write
    /// leave). Needs the volume unmounted everywhere; mounts wait (EBUSY)
    /// until it ends.
    Clean {
        name: String,
        #[command(flatten)]
        cluster: Cluster,
    },
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::Create {
            name,
            cluster,
            block_size,
        } => create(&name, &cluster, &block_size),
        Command::List { cluster } => {
            for name in admin(&cluster)?.list()? {
                println!("{name}");
            }
            Ok(())
        }
        Command::Status { name, cluster } => status(&name, &cluster),
        Command::Delete {
            name,
            cluster,
            force,
        } => {
            let gone = admin(&cluster)?.delete(&name, force)?;
            println!(
                "deleted volume {name}: {} metadata keys, {} data blocks",
                gone.metadata_keys, gone.block_keys
            );
            Ok(())
        }
        Command::Clean { name, cluster } => {
            let c = admin(&cluster)?.clean(&name)?;
            println!(
                "cleaned volume {name}: {} of {} data blocks freed ({}); {} files name {} blocks",
                c.freed,
                c.blocks,
                crate::human::bytes(c.freed_bytes),
                c.maps,
                c.named
            );
            Ok(())
        }
    }
}

fn admin(cluster: &Cluster) -> anyhow::Result<Admin> {
    let seeds = memfs_cluster::topology::seeds(&cluster.cluster)?;
    Admin::connect(&seeds).with_context(|| format!("cluster {}", cluster.cluster))
}

fn create(name: &str, cluster: &Cluster, block_size: &str) -> anyhow::Result<()> {
    let bs = memfs_durable::parse_bytes(block_size)
        .map_err(|e| anyhow::anyhow!("invalid --block-size {block_size:?}: {e}"))?;
    let block_size = u32::try_from(bs)
        .map_err(|_| anyhow::anyhow!("invalid --block-size {block_size:?}: at most 4M"))?;
    let options = CreateOptions {
        block_size,
        uid: nix::unistd::geteuid().as_raw(),
        gid: nix::unistd::getegid().as_raw(),
        ..CreateOptions::default()
    };
    admin(cluster)?.create(name, &options)?;
    println!(
        "created volume {name} ({} blocks)",
        crate::human::bytes(block_size.into())
    );
    Ok(())
}

fn status(name: &str, cluster: &Cluster) -> anyhow::Result<()> {
    let s = admin(cluster)?.status(name)?;
    let created = crate::shell::format_time(
        memfs_fs::Timespec {
            sec: s.created.div_euclid(1_000_000_000),
            nsec: s.created.rem_euclid(1_000_000_000) as u32,
        },
        false,
    );
    println!("volume:          {}", s.name);
    println!("format:          {}", s.format);
    println!(
        "block size:      {}",
        crate::human::bytes(s.block_size.into())
    );
    println!("created:         {created}");
    println!("inodes:          {}", s.counters.inodes);
    println!(
        "data:            {}",
        crate::human::bytes(s.counters.used_bytes)
    );
    println!("live sessions:   {}", s.live_sessions);
    println!(
        "metadata:        slot {} on master {} ({} used)",
        s.metadata_slot,
        s.metadata_master,
        crate::human::bytes(s.metadata_master_used_memory)
    );
    Ok(())
}
