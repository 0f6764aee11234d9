//! Wall-clock time as the data directory's files record it.

use std::time::{SystemTime, UNIX_EPOCH};

pub(crate) fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
