//! How a data directory is opened: durability, checkpoint cadence,
//! retention, and the command-line grammar of each.

use std::time::Duration;

pub use memfs_journal::Durability;

/// How far back history reaches; the journal and checkpoints behind it are
/// deleted. Any limit that is set is honoured (the window is the largest
/// that all allow). Named snapshots are always kept reachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub commits: Option<u64>,
    pub age: Option<Duration>,
    pub bytes: Option<u64>,
}

impl Default for Retention {
    /// An hour of history.
    fn default() -> Self {
        Retention {
            commits: None,
            age: Some(Duration::from_secs(3600)),
            bytes: None,
        }
    }
}

fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("bad duration {s:?}: expected e.g. 90s, 10m, 1h, 7d"))?;
    let mult = match unit {
        "" | "s" => 1,
        "ms" => return Ok(Duration::from_millis(n)),
        "m" | "min" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return Err(format!("bad duration unit in {s:?}: use ms, s, m, h or d")),
    };
    Ok(Duration::from_secs(n.saturating_mul(mult)))
}

/// Parses `90s`, `10m`, `1h`, `7d`, `250ms`.
pub fn parse_duration_arg(s: &str) -> std::result::Result<Duration, String> {
    parse_duration(s)
}

/// The one size grammar of memfs, for every command line and option that
/// takes a size (mount `--size`, retention, the shell, the benchmarks):
/// `parse-size` with binary units, so `512M`, `4G`, `1GiB`, `4gb` and `100`
/// all read as a user of coreutils expects. Returns the grammar's own
/// message on bad input; callers say which argument it was.
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(s.trim())
        .map_err(|e| e.to_string())
}

fn parse_retention_bytes(s: &str) -> std::result::Result<u64, String> {
    parse_bytes(s).map_err(|e| format!("bad size {s:?}: {e} (expected e.g. 512M, 4G)"))
}

impl std::str::FromStr for Retention {
    type Err = String;

    /// `commits=N`, `age=DURATION`, `bytes=SIZE`, comma-separated; `all`
    /// keeps everything.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let mut r = Retention {
            commits: None,
            age: None,
            bytes: None,
        };
        if s == "all" {
            return Ok(r);
        }
        for part in s.split(',') {
            let (k, v) = part.split_once('=').ok_or_else(|| {
                format!("bad retention {part:?}: use commits=N, age=DURATION or bytes=SIZE")
            })?;
            match k.trim() {
                "commits" => {
                    r.commits = Some(
                        v.trim()
                            .parse()
                            .map_err(|_| format!("bad commit count {v:?}"))?,
                    )
                }
                "age" => r.age = Some(parse_duration(v)?),
                "bytes" => r.bytes = Some(parse_retention_bytes(v)?),
                _ => {
                    return Err(format!(
                        "unknown retention limit {k:?}: use commits, age or bytes"
                    ));
                }
            }
        }
        Ok(r)
    }
}

/// Parses a durability mode. Plain `async` queues up to 4096 commits (a
/// file system commits once per operation, far more often than a block
/// store); the journal's own syntax is accepted too.
pub fn parse_durability(s: &str) -> std::result::Result<Durability, String> {
    match s {
        "async" => Ok(Durability::Async {
            max_pending: 4096,
            max_pending_bytes: memfs_journal::durability::DEFAULT_MAX_PENDING_BYTES,
        }),
        "relaxed" => Err("relaxed needs a commit count: relaxed=N".into()),
        _ => s.parse(),
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    pub durability: Durability,
    /// Write a checkpoint this often when anything changed (`None`: only
    /// by journal volume and at close).
    pub checkpoint_interval: Option<Duration>,
    /// ... or once the journal has grown this much since the last one.
    pub checkpoint_bytes: u64,
    pub retention: Retention,
    pub segment_size: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            durability: Durability::Sync,
            checkpoint_interval: Some(Duration::from_secs(300)),
            checkpoint_bytes: 256 << 20,
            retention: Retention::default(),
            segment_size: 64 << 20,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_and_durations_parse_or_say_why_not() {
        let r: Retention = "commits=10,age=2h,bytes=1G".parse().unwrap();
        assert_eq!(r.commits, Some(10));
        assert_eq!(r.age, Some(Duration::from_secs(7200)));
        assert_eq!(r.bytes, Some(1 << 30));
        assert_eq!("all".parse::<Retention>().unwrap().age, None);
        assert!(
            "age=soon"
                .parse::<Retention>()
                .unwrap_err()
                .contains("bad duration")
        );
        assert!(
            "forever"
                .parse::<Retention>()
                .unwrap_err()
                .contains("commits=N")
        );
        assert!(
            parse_durability("relaxed")
                .unwrap_err()
                .contains("relaxed=N")
        );
    }

    #[test]
    fn sizes_keep_the_grammar_of_the_hand_written_parser() {
        for (s, want) in [
            ("100", 100),
            ("4K", 4 << 10),
            ("512M", 512 << 20),
            ("512m", 512 << 20),
            ("1G", 1 << 30),
            ("1GB", 1 << 30),
            ("1GiB", 1 << 30),
            ("1gib", 1 << 30),
            ("2T", 2 << 40),
            (" 8M ", 8 << 20),
        ] {
            assert_eq!(parse_bytes(s), Ok(want), "{s}");
        }
        for s in ["", "G", "1X", "-1M", "99999999999T"] {
            assert!(parse_bytes(s).is_err(), "{s}");
            // Retention says which size it refused.
            assert!(
                parse_retention_bytes(s).unwrap_err().contains("bad size"),
                "{s}"
            );
        }
    }
}
