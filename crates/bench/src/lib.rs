//! memfs benchmark harness: the library behind `memfs bench ...`.
//!
//! Every benchmark measures its baseline (tmpfs, the disk, flock(2), LMDB,
//! targets) in the same run and reports each figure with its baseline, ratio,
//! repetitions and noise; `bench all` runs them all into one results folder
//! that `report` turns into markdown and `compare` checks against another.
//!
//! Modules, each depending only on those listed before it:
//! - [`system`]: mounts, root, the control socket of a durable mount;
//! - [`common`]: the shared types and helpers (subjects to measure on:
//!   memfs mounts, tmpfs, disk dirs; `Figure`, `Report`, JSON, noise);
//! - [`results`]: a `bench all` results folder (`results.json`);
//! - [`benchmarks`]: one module per benchmark;
//! - [`plot`], [`report`] (report and compare), [`all`] (the runner).
//!
//! Promises: the JSON formats are stable (see `docs/bench.md`); every mount
//! or child a benchmark starts is cleaned up, also when interrupted. Depends
//! on the libraries it measures (`memfs-fs`, `memfs-durable`, `memfs-store`,
//! `memfs-lock`) and never on the `memfs` binary crate: benchmarks that need
//! a mount or worker processes re-run the current executable (the `memfs`
//! binary calling this library) with its own subcommands.

pub mod all;
pub mod benchmarks;
pub mod common;
pub mod plot;
pub mod report;
pub mod results;
pub mod system;
