//! The `memfs` command: mount, shell, store, bench.
//!
//! Each subsystem keeps its command code in a module of its own; this file only
//! parses the command line and dispatches, so that adding a command touches one
//! line here.
//!
//! Depends on every library crate: `memfs-fuse` and `memfs-durable` to mount,
//! `memfs-store`, and `memfs-bench` for `memfs bench ...`. No library depends
//! on it; see docs/architecture.md.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use clap::{CommandFactory, Parser, Subcommand};
use memfs_bench::benchmarks::{
    block as bench_block, cluster as bench_cluster, durability as bench_durability,
    fio as bench_fio, lock as bench_lock, memory as bench_memory, metadata as bench_metadata,
    snapshot as bench_snapshot, store_server as bench_store_server, workload as bench_workload,
};
use memfs_bench::{all as bench_all, report as bench_report};

mod clone_cmd;
mod control;
mod durable_cmd;
mod human;
mod mount;
mod mount_table;
mod own_mount;
mod remount_options;
mod serving;
mod shell;
mod store_cmd;
mod volume_cmd;
mod volume_mount;
mod volume_send;

#[derive(Parser)]
#[command(
    name = "memfs",
    version,
    about = "An in-memory POSIX file system for Linux"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mount a memfs (returns once it is usable; serves in the background).
    Mount(Box<mount::MountArgs>),
    /// Unmount a memfs.
    #[command(alias = "unmount")]
    Umount(mount::UmountArgs),
    /// An interactive or scripted shell over an in-process memfs (no mount needed).
    Shell(shell::Args),
    /// Operate on a block store (create, info, get, set, rollback, snapshot, verify, serve, follow).
    Store(store_cmd::Args),
    /// Named snapshots of a data directory (create, list, delete).
    Snapshot(durable_cmd::SnapshotArgs),
    /// Mount a writable copy-on-write clone of a snapshot (of a mount or a data directory).
    ///
    /// Returns once the clone is usable, like memfs mount; memfs umount M2 removes it. The
    /// clone and its origin never see each other's later changes.
    ///
    /// With --mount M, or --data-dir D of a data directory a running memfs serves, that server
    /// mounts a lazy copy-on-write clone in its own process (at once: nodes are copied as they
    /// are first used); unmounting the origin unmounts its clones too.
    ///
    /// With --data-dir D of a data directory nobody serves, a new server process rebuilds the
    /// snapshot's tree from D (checkpoint and journal: it takes as long as reading the tree) and
    /// serves it in memory until memfs umount M2. D is only read, and only held while the tree
    /// is rebuilt: it can be mounted while the clone runs, and the clone's changes never reach it.
    Clone(clone_cmd::CloneArgs),
    /// Created, deleted, modified and renamed paths between two snapshots or commits, or the live tree (-).
    Diff(durable_cmd::DiffArgs),
    /// Recent commits of a data directory.
    Log(durable_cmd::LogArgs),
    /// Bring a data directory back to an earlier commit or snapshot.
    Rollback(durable_cmd::RollbackArgs),
    /// Write a snapshot of an unmounted data directory (or the changes since BASE), or a whole
    /// volume (--cluster URL --volume V), as a stream on stdout (or -o FILE).
    Send(durable_cmd::SendArgs),
    /// Rebuild a stream from memfs send in an unmounted data directory, or a full stream in a new
    /// or empty volume (--cluster URL --volume V); read from stdin.
    Receive(durable_cmd::ReceiveArgs),
    /// Check a data directory (journal, checkpoint, tree); --repair cuts damage.
    Fsck(durable_cmd::FsckArgs),
    /// State of a durable mount (mode, commits, read-only and why, data directory), or of a
    /// volume mount (cluster, volume, session, lease, cache).
    Status(durable_cmd::StatusArgs),
    /// Volumes on a Redis Cluster: one tree for many mounts (create, list, status, delete).
    Volume(volume_cmd::Args),
    /// Run a benchmark against its baseline.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Block store workload against LMDB.
    Block(bench_block::Args),
    /// Cross-process lock algorithms.
    Lock(bench_lock::Args),
    /// fio random read/write on a memfs mount against tmpfs.
    Fio(bench_fio::Args),
    /// Create/open/stat/unlink rates on a memfs mount against tmpfs.
    Metadata(bench_metadata::Args),
    /// Server memory after 1M empty files and after 1 GiB of data.
    Memory(bench_memory::Args),
    /// Copy-on-write snapshots on a live mount: create, stall, memory, COW writes, reads, clone, rollback.
    Snapshot(bench_snapshot::Args),
    /// Durability targets: journaled metadata and fio, checkpoint latency, recovery speed.
    Durability(bench_durability::Args),
    /// Shell workload: create, write, read, delete phases against thread counts.
    Workload(bench_workload::Args),
    /// The store server against Redis: pipelined gets, multi_get latency, TLS cost, follower lag.
    StoreServer(bench_store_server::Args),
    /// A volume on a local Redis Cluster against a local mount and redis-benchmark's floor.
    Cluster(bench_cluster::Args),
    /// Every benchmark against its baseline into one results folder, with plots.
    All(bench_all::Args),
    /// Write the markdown report of a `bench all` results folder.
    Report(bench_report::ReportArgs),
    /// Compare two results folders; exits non-zero if a figure regressed beyond the noise.
    Compare(bench_report::CompareArgs),
}

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("MEMFS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,fuser=error"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// mount(8) (through mount.fuse3) runs `memfs SOURCE MOUNTPOINT -o OPTIONS`
/// for `-t fuse.memfs` and fstab entries: treat that as `memfs mount`, with
/// SOURCE as the device column of /proc/mounts (like tmpfs) and no output on
/// success. Without a source (`memfs MOUNTPOINT -o OPTIONS`) it is a mount too.
///
/// Only that shape is taken for it: SOURCE no command, MOUNTPOINT an existing
/// directory (mount(8) checks that before it runs a helper), and nothing after
/// but `-o` options. Anything else is left to clap, so that a mistyped command
/// (`memfs snapshots list`, `memfs volumes --help`) gets its error and its
/// suggestion rather than being mounted.
fn mount_helper_args(mut args: Vec<OsString>) -> Vec<OsString> {
    let is_option = |a: &OsStr| a.as_bytes().starts_with(b"-");
    let is_command = |a: &OsStr| {
        let s = a.to_string_lossy();
        Cli::command().find_subcommand(&*s).is_some() || s == "help"
    };
    let word = |a: &OsStr| !is_option(a) && !is_command(a);
    let is_dir = |a: &OsStr| !is_option(a) && Path::new(a).is_dir();
    let source = match args.get(1..).unwrap_or_default() {
        [source, mp, rest @ ..] if word(source) && is_dir(mp) && only_o_options(rest) => {
            Some(source.clone())
        }
        [mp, rest @ ..] if !rest.is_empty() && word(mp) && is_dir(mp) && only_o_options(rest) => {
            None
        }
        _ => return args,
    };
    let mut flag = OsString::from("--helper-source=");
    if let Some(source) = source {
        args.remove(1);
        flag.push(source);
    }
    args.insert(1, "mount".into());
    args.insert(2, flag);
    args
}

/// Whether `rest` is only `-o OPTIONS` (or `-oOPTIONS`), any number of times.
fn only_o_options(mut rest: &[OsString]) -> bool {
    loop {
        rest = match rest {
            [] => return true,
            [o, _value, tail @ ..] if o == "-o" => tail,
            [o, tail @ ..] if o.as_bytes().starts_with(b"-o") && o.len() > 2 => tail,
            _ => return false,
        }
    }
}

fn main() -> std::process::ExitCode {
    init_tracing();
    let cli = Cli::parse_from(mount_helper_args(std::env::args_os().collect()));
    let result: anyhow::Result<()> = match cli.command {
        Command::Mount(args) => mount::run_mount(*args),
        Command::Umount(args) => mount::run_umount(args),
        Command::Shell(args) => shell::run(args),
        Command::Store(args) => store_cmd::run(args),
        Command::Snapshot(args) => durable_cmd::run_snapshot(args),
        Command::Clone(args) => clone_cmd::run_clone(args),
        Command::Diff(args) => durable_cmd::run_diff(args),
        Command::Log(args) => durable_cmd::run_log(args),
        Command::Rollback(args) => durable_cmd::run_rollback(args),
        Command::Send(args) => durable_cmd::run_send(args),
        Command::Receive(args) => durable_cmd::run_receive(args),
        Command::Fsck(args) => durable_cmd::run_fsck(args),
        Command::Status(args) => durable_cmd::run_status(args),
        Command::Volume(args) => volume_cmd::run(args),
        Command::Bench(BenchCommand::Block(args)) => bench_block::run(args),
        Command::Bench(BenchCommand::StoreServer(args)) => bench_store_server::run(args),
        Command::Bench(BenchCommand::Lock(args)) => bench_lock::run(args),
        Command::Bench(BenchCommand::Fio(args)) => bench_fio::run(args),
        Command::Bench(BenchCommand::Metadata(args)) => bench_metadata::run(args),
        Command::Bench(BenchCommand::Memory(args)) => bench_memory::run(args),
        Command::Bench(BenchCommand::Snapshot(args)) => bench_snapshot::run(args),
        Command::Bench(BenchCommand::Durability(args)) => bench_durability::run(args),
        Command::Bench(BenchCommand::Workload(args)) => bench_workload::run(args),
        Command::Bench(BenchCommand::Cluster(args)) => bench_cluster::run(args),
        Command::Bench(BenchCommand::All(args)) => bench_all::run(args),
        Command::Bench(BenchCommand::Report(args)) => bench_report::run_report(args),
        Command::Bench(BenchCommand::Compare(args)) => bench_report::run_compare(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("memfs: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::mount_helper_args;

    fn helper(args: &[&str]) -> Vec<String> {
        mount_helper_args(args.iter().map(Into::into).collect())
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect()
    }

    #[test]
    fn mount_helper_source_becomes_the_fsname() {
        let dir = tempfile::tempdir().unwrap();
        let mp = dir.path().to_str().unwrap();
        // mount(8)'s source travels as --helper-source, which makes the
        // mount quiet and names it in the device column.
        assert_eq!(
            helper(&["memfs", "scratch", mp, "-o", "size=1G"]),
            [
                "memfs",
                "mount",
                "--helper-source=scratch",
                mp,
                "-o",
                "size=1G"
            ]
        );
        assert_eq!(
            helper(&["memfs", "scratch", mp, "-osize=1G", "-o", "ro"]),
            [
                "memfs",
                "mount",
                "--helper-source=scratch",
                mp,
                "-osize=1G",
                "-o",
                "ro"
            ]
        );
        assert_eq!(
            helper(&["memfs", "scratch", mp]),
            ["memfs", "mount", "--helper-source=scratch", mp]
        );
        // No source: `memfs MOUNTPOINT -o OPTIONS` is a helper mount too.
        assert_eq!(
            helper(&["memfs", mp, "-o", "size=1G"]),
            ["memfs", "mount", "--helper-source=", mp, "-o", "size=1G"]
        );
        // Commands are left alone.
        assert_eq!(helper(&["memfs", "mount", mp]), ["memfs", "mount", mp]);
    }

    /// What is not mount(8)'s shape goes to clap as it is, to be answered
    /// as an unknown command.
    #[test]
    fn typos_are_not_mounts() {
        let dir = tempfile::tempdir().unwrap();
        let mp = dir.path().to_str().unwrap();
        let missing = dir.path().join("missing");
        let missing = missing.to_str().unwrap();
        for args in [
            &["memfs", "snapshots", "list"][..],
            &["memfs", "volume", "--help"],
            &["memfs", "volume", mp, "--help"],
            &["memfs", "scratch", missing, "-o", "size=1G"],
            &["memfs", "scratch", mp, "extra"],
            &["memfs", "scratch", mp, "-o"],
            &["memfs", "scratch", mp, "-o", "size=1G", "--foreground"],
            &["memfs", "snapshot", mp, "-o", "size=1G"],
            &["memfs", "--verbose", mp, "-o", "size=1G"],
            &["memfs", mp],
        ] {
            assert_eq!(helper(args), args, "{args:?}");
        }
    }
}
