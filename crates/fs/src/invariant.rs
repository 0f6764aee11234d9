//! Checks of the engine's internal invariants (docs/engine.md, "Invariants
//! checked in code"). They guard against the engine's own bugs, never
//! against bad input: a caller's or the journal's mistakes are errors.

use std::sync::atomic::{AtomicU64, Ordering};

/// Gives back `n` of what `counter` counts (pages or nodes in use).
///
/// Release builds check too (one comparison on a value the subtraction
/// returns anyway): more given back than was counted means something was
/// freed twice or never counted, and a wrapped counter would make every
/// later reservation fail with ENOSPC for good. Stopping here names the
/// site that lost count instead of a full file system much later.
#[track_caller]
pub(crate) fn uncount(counter: &AtomicU64, n: u64, what: &str) {
    let before = counter.fetch_sub(n, Ordering::AcqRel);
    assert!(
        before >= n,
        "{what} in use would go below zero: giving back {n} of {before}"
    );
}
