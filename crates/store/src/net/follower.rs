//! A follower: keeps a local replica of a served store up to date.
//!
//! The replica's journal numbers its commits exactly like the writer's (one
//! commit per block or rollback, from 1, no gaps), so the replica's own
//! recovered state `(last commit, current block)` is its position in the
//! writer's event stream: no separate progress file can disagree with it
//! after a crash. Each event says which event number it is and which block
//! it follows; the follower refuses one that skips a number or does not
//! continue from its own block.

use super::client::{Client, ClientConfig, ClientError, Event};
use super::protocol::{self as p, ErrorCode, Role};
use crate::{Durability, Store, StoreError, StoreOptions};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

pub struct FollowerConfig {
    pub client: ClientConfig,
    pub dir: PathBuf,
    /// Durability of the replica's own journal.
    pub durability: Durability,
    pub threads: usize,
    /// Longest pause between reconnection attempts.
    pub max_backoff: Duration,
    /// Called with (event, block) each time the replica has caught up with
    /// the writer (seen on a heartbeat), once per position.
    pub on_caught_up: Option<Box<dyn Fn(u64, u64) + Send>>,
}

#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error("replica store in {dir}: {source}")]
    Store {
        dir: PathBuf,
        #[source]
        source: StoreError,
    },
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("the stream skips events: expected event {expected}, got {got}; refusing to apply it")]
    Skipped { expected: u64, got: u64 },
    #[error("the stream does not continue this replica's history: {0}")]
    Diverged(String),
}

/// Where the replica is, for observers (tests, metrics).
#[derive(Default)]
pub struct Progress {
    pub seq: AtomicU64,
    pub block: AtomicU64,
    /// The writer's last event number, from the latest event or heartbeat.
    pub writer_seq: AtomicU64,
    pub connected: AtomicBool,
}

fn fatal(e: &ClientError) -> bool {
    matches!(
        e.code(),
        Some(
            ErrorCode::AuthFailed
                | ErrorCode::Forbidden
                | ErrorCode::BadVersion
                | ErrorCode::KeyWidth
                | ErrorCode::HistoryDiverged
                | ErrorCode::HistoryUnavailable
        )
    ) || matches!(e, ClientError::Tls(_) | ClientError::Protocol(_))
}

/// Follows until `stop` is set (returns `Ok`) or the stream cannot be
/// followed (returns the reason). Connection failures are retried with
/// backoff; the replica resumes from its last applied event.
pub fn follow(
    cfg: FollowerConfig,
    stop: &AtomicBool,
    progress: &Progress,
) -> Result<(), FollowError> {
    let mut ccfg = cfg.client.clone();
    ccfg.role = Role::Follow;
    let serr = |source| FollowError::Store {
        dir: cfg.dir.clone(),
        source,
    };
    let mut store: Option<Store> = None;
    let mut backoff = Duration::from_millis(50);
    let result = loop {
        if stop.load(Relaxed) {
            break Ok(());
        }
        let client = match Client::connect(ccfg.clone()) {
            Ok(c) => c,
            Err(e) if !fatal(&e) => {
                tracing::warn!(error = %e, "follower: cannot reach the writer; retrying");
                pause(stop, &mut backoff, cfg.max_backoff);
                continue;
            }
            Err(e) => break Err(e.into()),
        };
        let w = *client.welcome();
        if store.is_none() {
            let opts = StoreOptions {
                key_width: w.key_width as usize,
                shards: w.shards as usize,
                rollback_window: w.rollback_window,
                durability: cfg.durability,
                threads: cfg.threads,
                ..Default::default()
            };
            match Store::open_or_create(&cfg.dir, opts) {
                Ok(s) => store = Some(s),
                Err(e) => break Err(serr(e)),
            }
        }
        let st = store.as_ref().expect("opened");
        let (seq, block) = (st.last_commit(), st.current_block());
        progress.seq.store(seq, Relaxed);
        progress.block.store(block, Relaxed);
        tracing::info!(seq, block, writer_seq = w.last_seq, "follower: subscribing");
        let sub = client.subscribe(seq, block);
        let r = sub.map_err(FollowError::from).and_then(|mut sub| {
            progress.connected.store(true, Relaxed);
            let r = apply_stream(
                st,
                &mut sub,
                stop,
                progress,
                &mut backoff,
                &cfg.on_caught_up,
            );
            progress.connected.store(false, Relaxed);
            r
        });
        match r {
            Ok(()) => break Ok(()),
            Err(FollowError::Client(e)) if !fatal(&e) => {
                tracing::warn!(error = %e, "follower: connection lost; resuming");
                pause(stop, &mut backoff, cfg.max_backoff);
            }
            Err(e) => break Err(e),
        }
    };
    if let Err(e) = &result {
        tracing::error!(error = %e, "follower stopped");
    }
    if let Some(s) = store {
        s.close().map_err(serr)?;
    }
    result
}

fn pause(stop: &AtomicBool, backoff: &mut Duration, max: Duration) {
    let until = std::time::Instant::now() + *backoff;
    while std::time::Instant::now() < until && !stop.load(Relaxed) {
        std::thread::sleep(Duration::from_millis(10));
    }
    *backoff = (*backoff * 2).min(max);
}

fn apply_stream(
    st: &Store,
    sub: &mut super::client::Subscription,
    stop: &AtomicBool,
    progress: &Progress,
    backoff: &mut Duration,
    on_caught_up: &Option<Box<dyn Fn(u64, u64) + Send>>,
) -> Result<(), FollowError> {
    let kw = st.key_width();
    let mut reported = None;
    let diverged = |e: StoreError| FollowError::Diverged(e.to_string());
    loop {
        if stop.load(Relaxed) {
            return Ok(());
        }
        let ev = sub.next_event()?;
        *backoff = Duration::from_millis(50);
        let (seq, prev) = match ev {
            Event::Heartbeat { last_seq, .. } => {
                progress.writer_seq.store(last_seq, Relaxed);
                let here = (st.last_commit(), st.current_block());
                if last_seq == here.0 && reported != Some(here) {
                    reported = Some(here);
                    if let Some(f) = on_caught_up {
                        f(here.0, here.1);
                    }
                }
                continue;
            }
            Event::Block { seq, prev, .. } | Event::Rollback { seq, prev, .. } => (seq, prev),
        };
        let last = st.last_commit();
        if seq != last + 1 {
            return Err(FollowError::Skipped {
                expected: last + 1,
                got: seq,
            });
        }
        let current = st.current_block();
        if prev != current {
            return Err(FollowError::Diverged(format!(
                "event {seq} follows block {prev}, the replica is at block {current}"
            )));
        }
        match ev {
            Event::Block { block, entries, .. } => {
                let ops: Vec<(&[u8], &[u8])> = p::entries(entries, kw).collect();
                st.set(block, &ops).map_err(diverged)?;
            }
            Event::Rollback { target, result, .. } => {
                st.rollback(target).map_err(diverged)?;
                if st.current_block() != result {
                    return Err(FollowError::Diverged(format!(
                        "rollback to {target} reached block {} here, {result} on the writer",
                        st.current_block()
                    )));
                }
            }
            Event::Heartbeat { .. } => unreachable!("handled above"),
        }
        if st.last_commit() != seq {
            return Err(FollowError::Diverged(format!(
                "the replica's journal numbers event {seq} as commit {}: was this directory written by something other than this follower?",
                st.last_commit()
            )));
        }
        progress.seq.store(seq, Relaxed);
        progress.block.store(st.current_block(), Relaxed);
        progress.writer_seq.fetch_max(seq, Relaxed);
    }
}
