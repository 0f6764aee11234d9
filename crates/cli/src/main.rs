//! The `memfs` command: mount, shell, store, bench.
//!
//! Each subsystem keeps its command code in a module of its own; this file only
//! parses the command line and dispatches, so that adding a command touches one
//! line here.

use clap::{Parser, Subcommand};

mod bench_block;
mod bench_lock;
mod store_cmd;

#[derive(Parser)]
#[command(name = "memfs", version, about = "An in-memory POSIX file system for Linux")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Operate on a block store (create, info, get, set, rollback, snapshot, verify).
    Store(store_cmd::Args),
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
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result: anyhow::Result<()> = match cli.command {
        Command::Store(args) => store_cmd::run(args),
        Command::Bench(BenchCommand::Block(args)) => bench_block::run(args),
        Command::Bench(BenchCommand::Lock(args)) => bench_lock::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("memfs: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
