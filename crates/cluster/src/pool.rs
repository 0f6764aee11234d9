//! Connections to the cluster for the threads of one mount.
//!
//! The `redis` crate's synchronous `ClusterConnection` needs `&mut` for
//! every command, and a FUSE mount serves requests from several threads at
//! once. So a mount keeps a pool: a thread takes an idle connection (or
//! opens one), runs its commands, and puts it back. The pool grows to the
//! number of threads that ever ran at once and no further; a connection
//! that failed is dropped, not put back, so the next caller opens a fresh
//! one (which reads the slot map anew after a failover).

use std::time::Duration;

use parking_lot::Mutex;
use redis::cluster::{ClusterClient, ClusterClientBuilder, ClusterConnection};

use crate::error::{Error, Result};

/// Idle connections kept at most: beyond it a returned connection is closed.
const MAX_IDLE: usize = 64;

/// A pool of cluster connections with one timeout on every command.
pub struct Pool {
    client: ClusterClient,
    idle: Mutex<Vec<ClusterConnection>>,
    seeds: Vec<String>,
    timeout: Duration,
}

impl Pool {
    /// A pool for the cluster reached through `urls`, each command
    /// (connecting included) bounded by `timeout`. Connects once, so that a
    /// wrong URL is an error here and not at the first request.
    pub fn connect(urls: &[String], timeout: Duration) -> Result<Pool> {
        if urls.is_empty() {
            return Err(Error::BadOption("no cluster URL given".into()));
        }
        // TCP_NODELAY, as redis-server sets on its side: with Nagle on, the
        // tail of a large command waited for the ACK of the segments before
        // it (a 1 MiB SET took 1.7x as long: tests/data.rs diag_data_path).
        let client = ClusterClientBuilder::new(urls.to_vec())
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true))
            .build()?;
        let first = client.get_connection()?;
        Ok(Pool {
            client,
            idle: Mutex::new(vec![first]),
            seeds: urls.to_vec(),
            timeout,
        })
    }

    /// Runs `f` on a connection of the pool. A connection whose command
    /// failed for want of the server (I/O, timeout, dropped) is closed; one
    /// that got an answer, even an error reply, goes back to the pool.
    pub fn with<R>(
        &self,
        f: impl FnOnce(&mut ClusterConnection) -> redis::RedisResult<R>,
    ) -> Result<R> {
        let taken = self.idle.lock().pop();
        let mut con = match taken {
            Some(c) => c,
            None => self.client.get_connection()?,
        };
        let out = f(&mut con);
        let broken = matches!(&out, Err(e) if e.is_io_error() || e.is_timeout()
            || e.is_connection_dropped() || e.is_connection_refusal());
        if !broken {
            let mut idle = self.idle.lock();
            if idle.len() < MAX_IDLE {
                idle.push(con);
            }
        }
        Ok(out?)
    }

    /// The URLs the pool was made with.
    pub fn seeds(&self) -> &[String] {
        &self.seeds
    }

    /// The bound on one command.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}
