//! Opt-in timestamps of the stages each event passes through, from the
//! writer's SET to the follower's applied block, for finding where a
//! follower's lag comes from (`memfs bench store-server --lag-only
//! --stages`). Off by default: a disabled mark is one relaxed load. When
//! on, every mark takes a global mutex and pushes 24 bytes, so it is for
//! measurements in one process (writer, server and follower together), not
//! for production.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Instant;

/// A point in an event's path. Writer-side stages come from the server and
/// from `Store::set_encoded`; follower-side ones from the follower and from
/// `Store::set_prepared`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// Server: the whole SET frame is in the connection's buffer.
    SetReceived,
    /// Server: the write mutex is held.
    WriterLocked,
    /// Writer's store: the tables are updated (undo recorded). After
    /// `Published`: the block is committed, and followers sent it, once the
    /// journal has it. In `sync` and `relaxed` modes a large block's journal
    /// write (and so its publication) runs while the tables are updated, so
    /// this may come before those two.
    WriterTables,
    /// Writer's store: the journal commit returned (per its durability).
    WriterJournal,
    /// Server: the event is in the history and subscribers are woken.
    Published,
    /// Server: a subscriber's thread took the frame from the history.
    SubscriberTook,
    /// Server: that thread's write of the frame returned.
    SubscriberWritten,
    /// Follower: the receiving thread has the whole frame.
    FollowerReceived,
    /// Follower: the receiving thread indexed and hashed it.
    FollowerPrepared,
    /// Follower: the applier took it from the queue.
    FollowerDequeued,
    /// Follower: the replica's write lock is held (readers are off).
    FollowerLocked,
    /// Follower's store: the tables are updated (after `FollowerJournal`,
    /// as on the writer).
    FollowerTables,
    /// Follower's store: the journal commit returned.
    FollowerJournal,
    /// Follower: the event is applied and its progress published.
    FollowerApplied,
    /// Writer's client (the benchmark): the SET is about to be sent.
    ClientSend,
    /// Writer's client: the SET's reply arrived (`set` returned).
    ClientDone,
}

/// The stages of the path in order (the client's two at their places).
pub const PATH: [Stage; 16] = [
    Stage::ClientSend,
    Stage::SetReceived,
    Stage::WriterLocked,
    Stage::WriterJournal,
    Stage::Published,
    Stage::WriterTables,
    Stage::ClientDone,
    Stage::SubscriberTook,
    Stage::SubscriberWritten,
    Stage::FollowerReceived,
    Stage::FollowerPrepared,
    Stage::FollowerDequeued,
    Stage::FollowerLocked,
    Stage::FollowerJournal,
    Stage::FollowerTables,
    Stage::FollowerApplied,
];

static ON: AtomicBool = AtomicBool::new(false);
static LOG: Mutex<Vec<(u64, Stage, Instant)>> = Mutex::new(Vec::new());

/// Starts recording (and forgets what was recorded).
pub fn enable() {
    LOG.lock().clear();
    ON.store(true, Relaxed);
}

/// How many marks are recorded so far (recording goes on).
pub fn recorded() -> usize {
    LOG.lock().len()
}

/// Stops recording and returns the marks: (event number, stage, when).
pub fn take() -> Vec<(u64, Stage, Instant)> {
    ON.store(false, Relaxed);
    std::mem::take(&mut *LOG.lock())
}

#[inline]
pub fn enabled() -> bool {
    ON.load(Relaxed)
}

/// Records that event `seq` reached `stage` now.
#[inline]
pub fn mark(seq: u64, stage: Stage) {
    if enabled() {
        mark_at(seq, stage, Instant::now());
    }
}

/// Records that event `seq` reached `stage` at `at` (for a stage whose
/// event number is known only later).
pub fn mark_at(seq: u64, stage: Stage, at: Instant) {
    if enabled() {
        LOG.lock().push((seq, stage, at));
    }
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

fn summary(mut v: Vec<f64>) -> String {
    let n = v.len();
    let mean = v.iter().sum::<f64>() / n.max(1) as f64;
    format!(
        "mean {mean:6.2}  p50 {:6.2}  p90 {:6.2}  max {:6.2} ms  (n={n})",
        quantile(&mut v, 0.5),
        quantile(&mut v, 0.9),
        quantile(&mut v, 1.0)
    )
}

/// A text report of recorded marks: the time between consecutive stages of
/// each event, the writer's period, the follower's latency, and for each
/// lag sample (taken at `ClientDone`, as the benchmark does) how far the
/// previous event had got when the lag was 2 or more.
pub fn report(marks: &[(u64, Stage, Instant)]) -> String {
    let mut by: ByEvent = BTreeMap::new();
    for &(seq, st, at) in marks {
        let e = by.entry(seq).or_default();
        // The first mark of a stage wins (a resent event marks it again).
        e[path_index(st)].get_or_insert(at);
    }
    let mut out = String::new();
    stage_timings(&mut out, &by);
    path_timings(&mut out, &by);
    lags(&mut out, &by);
    out
}

/// Each event's marks, by its position in [`PATH`].
type ByEvent = BTreeMap<u64, [Option<Instant>; PATH.len()]>;

fn path_index(s: Stage) -> usize {
    PATH.iter().position(|&p| p == s).expect("in PATH")
}

fn millis(a: Instant, b: Instant) -> f64 {
    b.saturating_duration_since(a).as_secs_f64() * 1e3
}

/// The time from each stage of [`PATH`] to the next one an event reached.
fn stage_timings(out: &mut String, by: &ByEvent) {
    let _ = writeln!(out, "stage timings per event (from the previous stage):");
    for w in 1..PATH.len() {
        let v: Vec<f64> = by
            .values()
            .filter_map(|e| {
                let b = e[w]?;
                let a = e[..w].iter().rev().flatten().next()?;
                Some(millis(*a, b))
            })
            .collect();
        if !v.is_empty() {
            let _ = writeln!(out, "  {:>18?}: {}", PATH[w], summary(v));
        }
    }
}

/// The writer's period and path, the follower's latency and busy time.
fn path_timings(out: &mut String, by: &ByEvent) {
    let get = |seq: u64, s: Stage| by.get(&seq).and_then(|e| e[path_index(s)]);
    let pairs = |a: Stage, b: Stage| -> Vec<f64> {
        by.keys()
            .filter_map(|&q| Some(millis(get(q, a)?, get(q, b)?)))
            .collect()
    };
    let period: Vec<f64> = by
        .keys()
        .filter_map(|&q| {
            Some(millis(
                get(q.checked_sub(1)?, Stage::ClientDone)?,
                get(q, Stage::ClientDone)?,
            ))
        })
        .collect();
    let _ = writeln!(
        out,
        "writer period (ClientDone to ClientDone): {}",
        summary(period)
    );
    let _ = writeln!(
        out,
        "writer path (ClientSend to ClientDone):   {}",
        summary(pairs(Stage::ClientSend, Stage::ClientDone))
    );
    let _ = writeln!(
        out,
        "follower latency (Published to FollowerApplied): {}",
        summary(pairs(Stage::Published, Stage::FollowerApplied))
    );
    let _ = writeln!(
        out,
        "follower busy (FollowerDequeued to FollowerApplied): {}",
        summary(pairs(Stage::FollowerDequeued, Stage::FollowerApplied))
    );
}

/// Lag at each ClientDone from the marks themselves, and where the
/// previous event was when the lag was 2 or more; lag at each Published.
fn lags(out: &mut String, by: &ByEvent) {
    let applied: Vec<(Instant, u64)> = {
        let mut v: Vec<_> = by
            .iter()
            .filter_map(|(&q, e)| Some((e[path_index(Stage::FollowerApplied)]?, q)))
            .collect();
        v.sort();
        v
    };
    // Event `q`'s lag at `t`: `q` minus the last event applied by then.
    let lag_at = |q: u64, t: Instant| {
        let n = applied.partition_point(|&(at, _)| at <= t);
        q.saturating_sub(applied[..n].iter().map(|&(_, s)| s).max().unwrap_or(0))
    };
    let mut hist: BTreeMap<u64, usize> = BTreeMap::new();
    let mut behind: BTreeMap<String, usize> = BTreeMap::new();
    for (&q, e) in by {
        let Some(t) = e[path_index(Stage::ClientDone)] else {
            continue;
        };
        let lag = lag_at(q, t);
        *hist.entry(lag).or_default() += 1;
        if lag >= 2 {
            let prev = by.get(&(q - 1));
            let reached = prev
                .and_then(|p| {
                    (0..PATH.len())
                        .rev()
                        .find(|&i| p[i].is_some_and(|at| at <= t))
                })
                .map_or("nothing".to_string(), |i| format!("{:?}", PATH[i]));
            *behind.entry(reached).or_default() += 1;
        }
    }
    let _ = writeln!(out, "lag at ClientDone (from the marks): {hist:?}");
    // The writer's count steps up at its publication, before the client has
    // the reply: the lag just after `Published` is the sawtooth's true peak
    // (the sample at `ClientDone` gives the follower that gap more).
    let mut at_pub: BTreeMap<u64, usize> = BTreeMap::new();
    for (&q, e) in by {
        let Some(t) = e[path_index(Stage::Published)] else {
            continue;
        };
        *at_pub.entry(lag_at(q, t)).or_default() += 1;
    }
    let _ = writeln!(out, "lag at Published (from the marks): {at_pub:?}");
    let _ = writeln!(
        out,
        "when lag >= 2, the last stage the previous event had reached: {behind:?}"
    );
}
