//! `memfs store ...`: operate on a block store directory.
//!
//! Keys and values are given in hex (`0x` prefix optional) unless `--text`
//! is passed, in which case they are taken as UTF-8 bytes. Keys must have the
//! store's exact width.

use anyhow::{Context, Result, bail};
use memfs_store::{Durability, Store, StoreOptions};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Debug)]
struct DirArg {
    /// The store's data directory.
    #[arg(long, short = 'd')]
    dir: PathBuf,
}

#[derive(clap::Subcommand, Debug)]
enum Cmd {
    /// Create a new store.
    Create {
        #[command(flatten)]
        dir: DirArg,
        /// Fixed key width in bytes (8 to 64).
        #[arg(long, default_value_t = 8)]
        key_width: usize,
        #[arg(long, default_value_t = 16)]
        shards: usize,
        /// Initial capacity of each shard (entries).
        #[arg(long, default_value_t = 1024)]
        capacity: usize,
        /// Threads applying a block.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// none | sync | relaxed[=N] | async[=N] | async-relaxed[=N]
        #[arg(long, default_value = "sync")]
        durability: String,
        /// Snapshot every N blocks (0 = only on request).
        #[arg(long, default_value_t = 1000)]
        snapshot_interval: u64,
        /// How many recent blocks can be rolled back.
        #[arg(long, default_value_t = 100)]
        rollback_window: u64,
    },
    /// Recover the store and print its state, layout and metrics.
    Info {
        #[command(flatten)]
        dir: DirArg,
    },
    /// Print the values of keys.
    Get {
        #[command(flatten)]
        dir: DirArg,
        /// Keys and values as UTF-8 text instead of hex.
        #[arg(long)]
        text: bool,
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// Apply one block of KEY=VALUE operations (an empty VALUE deletes).
    Set {
        #[command(flatten)]
        dir: DirArg,
        /// Block id (default: current block + 1).
        #[arg(long)]
        block: Option<u64>,
        #[arg(long)]
        text: bool,
        #[arg(required = true)]
        ops: Vec<String>,
    },
    /// Restore the state after block TO (inside the rollback window).
    Rollback {
        #[command(flatten)]
        dir: DirArg,
        #[arg(long)]
        to: u64,
    },
    /// Write a snapshot now (and prune the journal behind it).
    Snapshot {
        #[command(flatten)]
        dir: DirArg,
    },
    /// Check every checksum and that journal and snapshot agree.
    Verify {
        #[command(flatten)]
        dir: DirArg,
        /// Truncate a damaged journal to its last intact commit.
        #[arg(long)]
        repair: bool,
    },
}

fn parse_bytes(s: &str, text: bool) -> Result<Vec<u8>> {
    if text {
        return Ok(s.as_bytes().to_vec());
    }
    let h = s.strip_prefix("0x").unwrap_or(s);
    if h.len() % 2 != 0 {
        bail!("{s:?} is not hex (odd length); use --text for text keys");
    }
    (0..h.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&h[i..i + 2], 16)
                .with_context(|| format!("{s:?} is not hex; use --text for text keys"))
        })
        .collect()
}

fn show(v: &[u8], text: bool) -> String {
    if text {
        String::from_utf8_lossy(v).into_owned()
    } else {
        v.iter().map(|b| format!("{b:02x}")).collect()
    }
}

pub fn run(args: Args) -> Result<()> {
    match args.cmd {
        Cmd::Create {
            dir,
            key_width,
            shards,
            capacity,
            threads,
            durability,
            snapshot_interval,
            rollback_window,
        } => {
            let durability: Durability =
                durability.parse().map_err(|e: String| anyhow::anyhow!(e))?;
            let s = Store::create(
                &dir.dir,
                StoreOptions {
                    key_width,
                    shards,
                    capacity_per_shard: capacity,
                    threads,
                    durability,
                    snapshot_interval,
                    rollback_window,
                    ..Default::default()
                },
            )?;
            s.close()?;
            println!(
                "created store in {} ({key_width}-byte keys, {shards} shards, durability {durability})",
                dir.dir.display()
            );
        }
        Cmd::Info { dir } => {
            let s = Store::open(&dir.dir)?;
            let r = s.open_report().clone();
            let o = s.options().clone();
            let m = s.metrics();
            println!("directory:        {}", dir.dir.display());
            println!("block:            {}", s.current_block());
            println!("oldest rollback:  {}", s.oldest_rollback_block());
            println!("journal commit:   {}", r.commit);
            println!("keys:             {}", m.entries);
            println!(
                "layout:           {}-byte keys, {} shards, durability {}, snapshot every {} blocks, rollback window {}",
                o.key_width, o.shards, o.durability, o.snapshot_interval, o.rollback_window
            );
            println!(
                "recovery:         snapshot {}, {} commits ({} bytes) replayed in {:.3}s{}",
                r.snapshot_commit
                    .map_or("none".into(), |c| format!("at commit {c}")),
                r.commits_replayed,
                r.bytes_replayed,
                r.elapsed.as_secs_f64(),
                r.truncated_tail
                    .as_ref()
                    .map_or(String::new(), |(f, o, b)| format!(
                        "; cut a torn tail of {b} bytes at {}:{o}",
                        f.display()
                    ))
            );
            println!("journal bytes:    {}", m.journal_bytes);
            println!("snapshot bytes:   {}", m.snapshot_bytes);
            println!("table memory:     {} bytes", m.table_bytes);
            println!(
                "window:           {} blocks, {} bytes",
                m.window_blocks, m.window_bytes
            );
            println!("health:           {}", m.health);
            s.close()?;
        }
        Cmd::Get { dir, text, keys } => {
            let s = Store::open(&dir.dir)?;
            for k in &keys {
                let key = parse_bytes(k, text)?;
                match s.get(&key)? {
                    Some(v) => println!("{k}\t{}", show(&v, text)),
                    None => println!("{k}\t(absent)"),
                }
            }
            s.close()?;
        }
        Cmd::Set {
            dir,
            block,
            text,
            ops,
        } => {
            let s = Store::open(&dir.dir)?;
            let mut kv = Vec::new();
            for op in &ops {
                let (k, v) = op
                    .split_once('=')
                    .with_context(|| format!("{op:?}: expected KEY=VALUE"))?;
                kv.push((parse_bytes(k, text)?, parse_bytes(v, text)?));
            }
            let block = block.unwrap_or(s.current_block() + 1);
            s.set(block, &kv)?;
            s.close()?;
            println!("block {block}: {} operations applied", kv.len());
        }
        Cmd::Rollback { dir, to } => {
            let s = Store::open(&dir.dir)?;
            let from = s.current_block();
            s.rollback(to)?;
            let now = s.current_block();
            s.close()?;
            println!("rolled back from block {from} to block {now}");
        }
        Cmd::Snapshot { dir } => {
            let s = Store::open(&dir.dir)?;
            let c = s.snapshot()?;
            let b = s.current_block();
            s.close()?;
            println!("snapshot written at commit {c} (block {b})");
        }
        Cmd::Verify { dir, repair } => {
            let r = memfs_store::verify(&dir.dir)?;
            let j = &r.journal;
            println!(
                "journal: {} segments, {} bytes, commits {}..={}{}",
                j.segments,
                j.bytes,
                j.first_commit.unwrap_or(0),
                j.last_commit,
                j.torn_tail.as_ref().map_or(String::new(), |d| format!(
                    "; torn tail at {}:{} (recovery discards it)",
                    d.file.display(),
                    d.offset
                ))
            );
            match r.snapshot {
                Some((c, n)) => println!("snapshot: commit {c}, {n} entries, checksums ok"),
                None => println!("snapshot: none"),
            }
            if let Some(b) = r.block {
                println!("replay: {} commits, reaches block {b}", r.commits_replayed);
            }
            for p in &r.problems {
                println!("PROBLEM: {p}");
            }
            if r.is_clean() {
                println!("ok");
            } else if repair {
                if let Some(d) = &j.corruption {
                    println!(
                        "repair will drop {} bytes from {} at offset {} on, and {} later segment files: every commit after {} is lost",
                        j.bytes_after_damage,
                        d.file.display(),
                        d.offset,
                        j.segments_after_damage,
                        j.last_commit
                    );
                }
                let rep = memfs_store::repair(&dir.dir)?;
                println!(
                    "repaired: journal now ends at commit {}; {} bytes dropped, {} files removed",
                    rep.last_commit,
                    rep.bytes_dropped,
                    rep.files_removed.len()
                );
            } else {
                bail!(
                    "{} problem(s) found (see above); `--repair` truncates the journal to its last intact commit",
                    r.problems.len()
                );
            }
        }
    }
    Ok(())
}
