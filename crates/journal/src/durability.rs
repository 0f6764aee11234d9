//! Durability modes: how much a crash may cost.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// When commits reach stable storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Written to the OS as buffers fill; fsynced only at close. A crash may
    /// lose everything since open.
    None,
    /// `commit` returns once the commit is on stable storage. Concurrent
    /// committers share one fsync (group commit).
    Sync,
    /// Each commit is written to the OS at once; fsync every `commits` commits
    /// or every `interval`, whichever comes first.
    Relaxed { commits: u32, interval: Duration },
    /// A background writer writes and fsyncs; `commit` returns at once unless
    /// `max_pending` commits (or `max_pending_bytes`) are waiting, then blocks.
    Async {
        max_pending: usize,
        max_pending_bytes: usize,
    },
    /// Background writer that fsyncs every `commits` commits or `interval`.
    AsyncRelaxed {
        max_pending: usize,
        max_pending_bytes: usize,
        commits: u32,
        interval: Duration,
    },
}

pub const DEFAULT_MAX_PENDING: usize = 64;
pub const DEFAULT_MAX_PENDING_BYTES: usize = 256 << 20;
pub const DEFAULT_RELAXED_COMMITS: u32 = 32;
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(100);

impl Durability {
    pub fn is_async(&self) -> bool {
        matches!(
            self,
            Durability::Async { .. } | Durability::AsyncRelaxed { .. }
        )
    }

    /// The fsync cadence of relaxed modes.
    pub(crate) fn relaxed(&self) -> Option<(u32, Duration)> {
        match *self {
            Durability::Relaxed { commits, interval }
            | Durability::AsyncRelaxed {
                commits, interval, ..
            } => Some((commits, interval)),
            _ => None,
        }
    }

    pub(crate) fn bounds(&self) -> Option<(usize, usize)> {
        match *self {
            Durability::Async {
                max_pending,
                max_pending_bytes,
            }
            | Durability::AsyncRelaxed {
                max_pending,
                max_pending_bytes,
                ..
            } => Some((max_pending, max_pending_bytes)),
            _ => None,
        }
    }

    /// The names accepted by [`FromStr`], for help texts.
    pub const SYNTAX: &'static str = "none | sync | relaxed[=N] | async[=N] | async-relaxed[=N]";
}

impl FromStr for Durability {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (name, arg) = match s.split_once('=') {
            Some((n, a)) => (n, Some(a)),
            None => (s, None),
        };
        let num = |default: usize| -> Result<usize, String> {
            match arg {
                None => Ok(default),
                Some(a) => match a.parse::<usize>() {
                    Ok(n) if n > 0 => Ok(n),
                    _ => Err(format!("durability {s:?}: {a:?} is not a positive integer")),
                },
            }
        };
        let no_arg = || -> Result<(), String> {
            match arg {
                None => Ok(()),
                Some(_) => Err(format!("durability {name:?} takes no argument")),
            }
        };
        Ok(match name {
            "none" => {
                no_arg()?;
                Durability::None
            }
            "sync" => {
                no_arg()?;
                Durability::Sync
            }
            "relaxed" => Durability::Relaxed {
                commits: u32::try_from(num(DEFAULT_RELAXED_COMMITS as usize)?)
                    .map_err(|_| format!("durability {s:?}: N too large"))?,
                interval: DEFAULT_INTERVAL,
            },
            "async" => Durability::Async {
                max_pending: num(DEFAULT_MAX_PENDING)?,
                max_pending_bytes: DEFAULT_MAX_PENDING_BYTES,
            },
            "async-relaxed" => Durability::AsyncRelaxed {
                max_pending: num(DEFAULT_MAX_PENDING)?,
                max_pending_bytes: DEFAULT_MAX_PENDING_BYTES,
                commits: DEFAULT_RELAXED_COMMITS,
                interval: DEFAULT_INTERVAL,
            },
            _ => {
                return Err(format!(
                    "unknown durability {s:?}; expected {}",
                    Durability::SYNTAX
                ));
            }
        })
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Durability::None => write!(f, "none"),
            Durability::Sync => write!(f, "sync"),
            Durability::Relaxed { commits, .. } => write!(f, "relaxed={commits}"),
            Durability::Async { max_pending, .. } => write!(f, "async={max_pending}"),
            Durability::AsyncRelaxed { max_pending, .. } => {
                write!(f, "async-relaxed={max_pending}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display() {
        for s in ["none", "sync", "relaxed=5", "async=8", "async-relaxed=3"] {
            let d: Durability = s.parse().unwrap();
            assert_eq!(d.to_string(), s);
        }
        assert_eq!(
            "async".parse::<Durability>().unwrap().to_string(),
            "async=64"
        );
        assert!("sync=3".parse::<Durability>().is_err());
        assert!("relaxed=0".parse::<Durability>().is_err());
        assert!(
            "fast"
                .parse::<Durability>()
                .unwrap_err()
                .contains("unknown durability")
        );
    }
}
