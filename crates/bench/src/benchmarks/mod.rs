//! One module per benchmark. Each has clap `Args`, a `run` for its own
//! command and (but `durability`) a `report` that `bench all` calls. They use
//! `crate::common`; the only uses between benchmarks point one way:
//! `durability` and `memory` reuse `metadata` and `fio`; `snapshot` reuses `fio`;
//! `cluster` reuses `metadata` and `fio`.

pub mod block;
pub mod cluster;
pub mod durability;
pub mod fio;
pub mod lock;
pub mod lock_engine;
pub mod memory;
pub mod metadata;
pub mod snapshot;
pub mod store_server;
pub mod workload;
