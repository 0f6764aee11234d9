//! The fault plan: which operations fail, with which errno, and when.
//!
//! Commands (one per line, written to `MOUNT/.faultfs-ctl` or given with
//! `--fault` at mount time):
//!
//! - `fail OP ERRNO [after N] [once]`: after N more successful calls of OP
//!   (default 0), every call of OP fails with ERRNO; with `once`, only that
//!   one call fails.
//! - `random OP ERRNO PERMILLE SEED`: each call of OP fails with probability
//!   PERMILLE/1000, drawn from a generator seeded with SEED (reproducible).
//! - `full`: the disk is full: fallocate, create and mkdir fail with ENOSPC,
//!   and so does a write that reaches beyond the file's allocated blocks
//!   (a write into preallocated space still succeeds, as on a real disk).
//! - `clear`: forget every rule (and `full`).
//! - `crash`: drop unsynced data (see `Crash` in main.rs).
//!
//! OP: write | fsync | rename | create | fallocate | truncate | unlink | any.
//! ERRNO: ENOSPC | EIO | EROFS | EDQUOT.

use thiserror::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Write,
    Fsync,
    Rename,
    Create,
    Fallocate,
    Truncate,
    Unlink,
}

impl Op {
    pub const ALL: [Op; 7] = [
        Op::Write,
        Op::Fsync,
        Op::Rename,
        Op::Create,
        Op::Fallocate,
        Op::Truncate,
        Op::Unlink,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Fsync => "fsync",
            Op::Rename => "rename",
            Op::Create => "create",
            Op::Fallocate => "fallocate",
            Op::Truncate => "truncate",
            Op::Unlink => "unlink",
        }
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("empty command")]
    Empty,
    #[error("unknown command {0:?} (fail, random, full, clear, crash)")]
    UnknownCommand(String),
    #[error(
        "unknown operation {0:?} (write, fsync, rename, create, fallocate, truncate, unlink, any)"
    )]
    UnknownOp(String),
    #[error("unknown errno {0:?} (ENOSPC, EIO, EROFS, EDQUOT)")]
    UnknownErrno(String),
    #[error("bad number {0:?}")]
    BadNumber(String),
    #[error("unexpected word {0:?}")]
    Unexpected(String),
    #[error("missing argument: {0}")]
    Missing(&'static str),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum When {
    /// Fails every call once `skip` more calls have succeeded.
    After { skip: u64, once: bool },
    /// Fails each call with probability permille/1000.
    Random { permille: u32, rng: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// None: any operation.
    pub op: Option<Op>,
    pub errno: i32,
    pub when: When,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Add(Rule),
    Full,
    Clear,
    Crash,
}

fn parse_op(w: &str) -> Result<Option<Op>, ParseError> {
    if w == "any" {
        return Ok(None);
    }
    Op::ALL
        .into_iter()
        .find(|o| o.name() == w)
        .map(Some)
        .ok_or_else(|| ParseError::UnknownOp(w.to_string()))
}

fn parse_errno(w: &str) -> Result<i32, ParseError> {
    Ok(match w.to_ascii_uppercase().as_str() {
        "ENOSPC" => libc::ENOSPC,
        "EIO" => libc::EIO,
        "EROFS" => libc::EROFS,
        "EDQUOT" => libc::EDQUOT,
        _ => return Err(ParseError::UnknownErrno(w.to_string())),
    })
}

fn num<T: std::str::FromStr>(w: Option<&str>, what: &'static str) -> Result<T, ParseError> {
    let w = w.ok_or(ParseError::Missing(what))?;
    w.parse().map_err(|_| ParseError::BadNumber(w.to_string()))
}

pub fn parse(line: &str) -> Result<Command, ParseError> {
    let mut w = line.split_whitespace();
    let cmd = w.next().ok_or(ParseError::Empty)?;
    let c = match cmd {
        "fail" => {
            let op = parse_op(w.next().ok_or(ParseError::Missing("operation"))?)?;
            let errno = parse_errno(w.next().ok_or(ParseError::Missing("errno"))?)?;
            let (mut skip, mut once) = (0, false);
            while let Some(x) = w.next() {
                match x {
                    "after" => skip = num(w.next(), "count after `after`")?,
                    "once" => once = true,
                    _ => return Err(ParseError::Unexpected(x.to_string())),
                }
            }
            Command::Add(Rule {
                op,
                errno,
                when: When::After { skip, once },
            })
        }
        "random" => {
            let op = parse_op(w.next().ok_or(ParseError::Missing("operation"))?)?;
            let errno = parse_errno(w.next().ok_or(ParseError::Missing("errno"))?)?;
            let permille: u32 = num(w.next(), "permille")?;
            let seed: u64 = num(w.next(), "seed")?;
            if permille > 1000 {
                return Err(ParseError::BadNumber(permille.to_string()));
            }
            Command::Add(Rule {
                op,
                errno,
                // xorshift must not start at 0.
                when: When::Random {
                    permille,
                    rng: seed ^ 0x9E37_79B9_7F4A_7C15,
                },
            })
        }
        "full" => Command::Full,
        "clear" => Command::Clear,
        "crash" => Command::Crash,
        other => return Err(ParseError::UnknownCommand(other.to_string())),
    };
    if let Some(x) = w.next() {
        return Err(ParseError::Unexpected(x.to_string()));
    }
    Ok(c)
}

/// Every active rule plus counters; one instance behind a mutex.
#[derive(Debug, Default)]
pub struct Plan {
    rules: Vec<Rule>,
    pub full: bool,
    pub calls: [u64; 7],
    pub failed: [u64; 7],
    /// Bytes the `crash` commands cut off, in total.
    pub crash_cut: u64,
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

impl Plan {
    pub fn add(&mut self, r: Rule) {
        self.rules.push(r);
    }

    pub fn clear(&mut self) {
        self.rules.clear();
        self.full = false;
    }

    /// Decides the fate of one call of `op`: `Some(errno)` to fail it.
    /// Every rule sees every call, so "after N" counts calls of its op.
    pub fn check(&mut self, op: Op) -> Option<i32> {
        let i = op as usize;
        self.calls[i] += 1;
        let mut fail = None;
        self.rules.retain_mut(|r| {
            if r.op.is_some_and(|o| o != op) {
                return true;
            }
            match &mut r.when {
                When::After { skip, once } => {
                    if *skip > 0 {
                        *skip -= 1;
                        return true;
                    }
                    if fail.is_none() {
                        fail = Some(r.errno);
                    }
                    !*once
                }
                When::Random { permille, rng } => {
                    if xorshift(rng) % 1000 < u64::from(*permille) && fail.is_none() {
                        fail = Some(r.errno);
                    }
                    true
                }
            }
        });
        if fail.is_some() {
            self.failed[i] += 1;
        }
        fail
    }

    pub fn status(&self) -> String {
        let mut s = String::new();
        for o in Op::ALL {
            s.push_str(&format!(
                "{} calls={} failed={}\n",
                o.name(),
                self.calls[o as usize],
                self.failed[o as usize]
            ));
        }
        s.push_str(&format!(
            "rules={} full={} crash_cut={}\n",
            self.rules.len(),
            self.full,
            self.crash_cut
        ));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        assert_eq!(
            parse("fail write ENOSPC after 3 once"),
            Ok(Command::Add(Rule {
                op: Some(Op::Write),
                errno: libc::ENOSPC,
                when: When::After {
                    skip: 3,
                    once: true
                }
            }))
        );
        assert_eq!(parse("clear"), Ok(Command::Clear));
        assert!(matches!(
            parse("fail wrte EIO"),
            Err(ParseError::UnknownOp(_))
        ));
        assert!(matches!(
            parse("fail write EFOO"),
            Err(ParseError::UnknownErrno(_))
        ));
        assert!(matches!(
            parse("fail write EIO after x"),
            Err(ParseError::BadNumber(_))
        ));
        assert!(matches!(
            parse("random any EIO 2000 1"),
            Err(ParseError::BadNumber(_))
        ));
        assert!(matches!(parse("crash now"), Err(ParseError::Unexpected(_))));
        assert_eq!(parse(""), Err(ParseError::Empty));
    }

    #[test]
    fn after_n_then_every_call_or_once() {
        let mut p = Plan::default();
        let Command::Add(r) = parse("fail fsync EIO after 2").unwrap() else {
            panic!()
        };
        p.add(r);
        assert_eq!(p.check(Op::Write), None);
        assert_eq!(p.check(Op::Fsync), None);
        assert_eq!(p.check(Op::Fsync), None);
        assert_eq!(p.check(Op::Fsync), Some(libc::EIO));
        assert_eq!(p.check(Op::Fsync), Some(libc::EIO));
        p.clear();
        let Command::Add(r) = parse("fail any EROFS once").unwrap() else {
            panic!()
        };
        p.add(r);
        assert_eq!(p.check(Op::Rename), Some(libc::EROFS));
        assert_eq!(p.check(Op::Rename), None);
        assert_eq!(p.failed[Op::Fsync as usize], 2);
    }

    #[test]
    fn random_is_reproducible_per_seed() {
        let run = |seed: u64| {
            let mut p = Plan::default();
            let Command::Add(r) = parse(&format!("random write EIO 300 {seed}")).unwrap() else {
                panic!()
            };
            p.add(r);
            (0..200)
                .map(|_| p.check(Op::Write).is_some())
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        let n = run(7).iter().filter(|f| **f).count();
        assert!((20..120).contains(&n), "{n} of 200 failed at 30 %");
    }
}
