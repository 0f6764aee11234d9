//! `memfs shell`: an interactive and scriptable shell over the engine itself,
//! with no mount and no kernel round trips. See `docs/shell.md`.
//!
//! The shell is a thin layer over `memfs_fs::Fs`'s public API: it keeps a
//! current directory (holding a kernel reference on it, so that removing it
//! leaves a valid, empty directory behind, as on Linux), parses POSIX-quoted
//! input and reports every failure as one line `command: what: path`.

mod commands;
mod format;
mod interactive;
mod parse;
mod snap;

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context as _;
use memfs_fs::{Config, Ctx, Errno, Fs, ROOT_INO};

/// The shell's UTC times, for other commands' output too.
pub(crate) use format::format_time;
pub use parse::{ParseError, parse, quote};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Open the durable memfs stored in this directory (created if missing);
    /// it must not be mounted at the same time.
    #[arg(long, value_name = "PATH")]
    pub data_dir: Option<PathBuf>,
    /// With --data-dir: none | sync | async[=N] | relaxed=N (default sync).
    #[arg(long, value_name = "MODE", requires = "data_dir")]
    pub durability: Option<String>,
    /// Run these commands (separated by `;` or newlines), then exit.
    #[arg(short = 'c', value_name = "COMMANDS", conflicts_with = "script")]
    pub command: Option<String>,
    /// In non-interactive mode, go on after a failed command (the exit status
    /// is still non-zero if any command failed).
    #[arg(long)]
    pub keep_going: bool,
    /// Capacity of the file system's data, e.g. 512M or 2G (default: half of RAM).
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    pub size: Option<u64>,
    /// Largest number of inodes (default: one per page of capacity).
    #[arg(long, value_name = "N")]
    pub inodes: Option<u64>,
    /// A script file to run instead of reading commands interactively.
    #[arg(value_name = "SCRIPT")]
    pub script: Option<PathBuf>,
}

fn parse_size_arg(s: &str) -> Result<u64, String> {
    memfs_durable::parse_bytes(s).map_err(|e| format!("invalid size {s:?}: {e}"))
}

/// What a durable memfs offers the shell (`log`, `snapshot`, `rollback`).
///
/// This is the seam for the persistence layer: once it lands, `open_data_dir`
/// returns the recovered engine together with an implementation of this trait,
/// and the three commands call it. Nothing else in the shell changes.
pub trait Durable: Send + Sync {
    fn log(&self, out: &mut dyn Write, limit: Option<usize>) -> anyhow::Result<()>;
    fn snapshot_create(&self, name: &str) -> anyhow::Result<()>;
    fn snapshot_list(&self, out: &mut dyn Write) -> anyhow::Result<()>;
    fn snapshot_delete(&self, name: &str) -> anyhow::Result<()>;
    /// Rolls the data directory back; returns the file system in its new state.
    fn rollback(&self, to: &str) -> anyhow::Result<Arc<Fs>>;
    /// Makes everything durable and writes a final checkpoint.
    fn close(&self) -> anyhow::Result<()>;
}

/// The shell's view of a [`DurableFs`]: it is closed and reopened around a
/// rollback, which needs the data directory to itself.
struct ShellDurable {
    dir: PathBuf,
    config: Config,
    opts: memfs_durable::Options,
    inner: std::sync::Mutex<Option<memfs_durable::DurableFs>>,
}

impl ShellDurable {
    fn with<T>(
        &self,
        f: impl FnOnce(&memfs_durable::DurableFs) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        match g.as_ref() {
            Some(d) => f(d),
            None => anyhow::bail!("the data directory is closed"),
        }
    }
}

impl Durable for ShellDurable {
    fn log(&self, out: &mut dyn Write, limit: Option<usize>) -> anyhow::Result<()> {
        self.with(|d| Ok(d.sync()?))?;
        for e in memfs_durable::log(&self.dir, limit.unwrap_or(20))? {
            let what = match (&e.name, e.data) {
                (Some(n), _) => format!(" {n:?}"),
                (None, d) if d > 0 => format!(" {d} bytes"),
                _ => String::new(),
            };
            writeln!(out, "{:>8} {:<11} inode {}{what}", e.commit, e.op, e.ino)?;
        }
        Ok(())
    }

    fn snapshot_create(&self, name: &str) -> anyhow::Result<()> {
        self.with(|d| Ok(d.snapshot_create(name).map(|_| ())?))
    }

    fn snapshot_list(&self, out: &mut dyn Write) -> anyhow::Result<()> {
        for s in self.with(|d| Ok(d.history()?.snapshots))? {
            writeln!(out, "{} commit {}", s.name, s.commit)?;
        }
        Ok(())
    }

    fn snapshot_delete(&self, name: &str) -> anyhow::Result<()> {
        self.with(|d| Ok(d.snapshot_delete(name).map(|_| ())?))
    }

    fn rollback(&self, to: &str) -> anyhow::Result<Arc<Fs>> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let d = g.take().context("the data directory is closed")?;
        d.close()?;
        let done = memfs_durable::resolve_target(&self.dir, to)
            .and_then(|c| memfs_durable::plan_rollback(&self.dir, c))
            .and_then(|plan| memfs_durable::rollback(&self.dir, &plan));
        // Reopened whether or not the rollback worked: the session goes on.
        let (d, _) = memfs_durable::DurableFs::open(&self.dir, self.config, self.opts.clone())?;
        let fs = d.fs().clone();
        *g = Some(d);
        done?;
        Ok(fs)
    }

    fn close(&self) -> anyhow::Result<()> {
        let d = self.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(d) = d {
            d.close()?;
        }
        Ok(())
    }
}

/// Opens (or creates) the durable memfs in `dir`.
fn open_data_dir(
    dir: &std::path::Path,
    config: Config,
    durability: Option<&str>,
) -> anyhow::Result<(Arc<Fs>, Box<dyn Durable>)> {
    let mut opts = memfs_durable::Options::default();
    if let Some(m) = durability {
        opts.durability = memfs_durable::parse_durability(m)
            .map_err(|e| anyhow::anyhow!("invalid durability {m:?}: {e}"))?;
    }
    let (d, report) = memfs_durable::DurableFs::open(dir, config, opts.clone())
        .with_context(|| format!("cannot open data directory {}", dir.display()))?;
    if !report.created {
        eprintln!("memfs shell: recovery: {report}");
    }
    let fs = d.fs().clone();
    Ok((
        fs,
        Box::new(ShellDurable {
            dir: dir.to_path_buf(),
            config,
            opts,
            inner: std::sync::Mutex::new(Some(d)),
        }),
    ))
}

/// A failed command's message, without the command name.
#[derive(Debug)]
pub struct CmdError(pub String);

impl std::fmt::Display for CmdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<std::io::Error> for CmdError {
    fn from(e: std::io::Error) -> Self {
        CmdError(format!("output error: {e}"))
    }
}

pub type CmdResult = Result<(), CmdError>;

pub fn err<T>(msg: impl Into<String>) -> Result<T, CmdError> {
    Err(CmdError(msg.into()))
}

/// The one-line description of an engine error about `path`.
pub fn fs_err(e: Errno, path: &str) -> CmdError {
    let what = match e {
        Errno::ENOENT => "no such file",
        Errno::EEXIST => "already exists",
        Errno::ENOTDIR => "not a directory",
        Errno::EISDIR => "is a directory",
        Errno::ENOTEMPTY => "directory not empty",
        Errno::EACCES | Errno::EPERM => "permission denied",
        Errno::ENOSPC => "no space left on the file system",
        Errno::ENAMETOOLONG => "name too long",
        Errno::ELOOP => "too many levels of symbolic links",
        Errno::ENODATA => "no such attribute",
        Errno::EINVAL => "invalid argument",
        Errno::EFBIG => "file too large",
        Errno::EMLINK => "too many links",
        Errno::EBUSY => "busy",
        _ => return CmdError(format!("{}: {}", e.to_string().to_lowercase(), path)),
    };
    CmdError(format!("{what}: {path}"))
}

/// One shell session over one file system.
pub struct Shell {
    pub(crate) fs: Arc<Fs>,
    pub(crate) ctx: Ctx,
    /// Current directory, shared with the tab completer.
    pub(crate) cwd: Arc<AtomicU64>,
    pub(crate) out: Box<dyn Write>,
    pub(crate) durable: Option<Box<dyn Durable>>,
    pub(crate) interactive: bool,
    /// Set by `exit`: the session ends with this status.
    pub(crate) exit: Option<i32>,
    /// The last path found for the current directory: checking it is a few
    /// lookups, finding it again scans every parent directory.
    cwd_cache: Option<(u64, String)>,
}

impl Shell {
    pub fn new(fs: Arc<Fs>, out: Box<dyn Write>) -> Shell {
        Shell {
            fs,
            ctx: Ctx::current(),
            cwd: Arc::new(AtomicU64::new(ROOT_INO)),
            out,
            durable: None,
            interactive: false,
            exit: None,
            cwd_cache: None,
        }
    }

    pub(crate) fn cwd(&self) -> u64 {
        self.cwd.load(Ordering::Acquire)
    }

    /// The absolute path of the current directory; `ENOENT` if it was removed.
    pub(crate) fn cwd_path(&mut self) -> Result<String, Errno> {
        let cwd = self.cwd();
        if let Some((ino, path)) = &self.cwd_cache {
            // Still valid if it still leads here (renames elsewhere do not matter).
            if *ino == cwd && self.fs.resolve(ROOT_INO, path, false) == Ok(cwd) {
                return Ok(path.clone());
            }
        }
        let path = commands::dir_path(&self.fs, cwd)?;
        self.cwd_cache = Some((cwd, path.clone()));
        Ok(path)
    }

    /// Runs one parsed command; prints its error (if any) as one line on
    /// standard error and returns whether it succeeded.
    pub fn run_command(&mut self, words: &[String]) -> bool {
        let result = commands::dispatch(self, words).and_then(|()| {
            // Durable as the data directory's mode promises before the next prompt.
            self.fs
                .settle()
                .map_err(|e| CmdError(format!("making the change durable failed: {e}")))
        });
        let _ = self.out.flush();
        match result {
            Ok(()) => true,
            Err(e) => {
                eprintln!("{}: {}", words[0], e);
                false
            }
        }
    }

    /// Runs every command in `text`. Returns false at the first failure unless
    /// `keep_going` (then false if any failed).
    pub fn run_text(&mut self, text: &str, keep_going: bool) -> bool {
        let commands = match parse(text) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("memfs shell: {e}");
                return false;
            }
        };
        let mut ok = true;
        for words in commands {
            if !self.run_command(&words) {
                ok = false;
                if !keep_going {
                    return false;
                }
            }
            if self.exit.is_some() {
                break;
            }
        }
        ok
    }

    /// Runs commands read from `input` line by line, as they arrive (a pipe
    /// from a program that waits for our output works). A quote left open
    /// continues on the next line.
    pub fn run_reader(&mut self, input: impl BufRead, keep_going: bool) -> anyhow::Result<bool> {
        let mut pending = String::new();
        let mut ok = true;
        for line in input.lines() {
            let line = line.context("reading commands")?;
            pending.push_str(&line);
            pending.push('\n');
            if let Err(ParseError::Incomplete(_)) = parse(&pending) {
                continue;
            }
            let text = std::mem::take(&mut pending);
            if !self.run_text(&text, keep_going) {
                ok = false;
                if !keep_going {
                    return Ok(false);
                }
            }
            if self.exit.is_some() {
                return Ok(ok);
            }
        }
        if !pending.is_empty() && !self.run_text(&pending, keep_going) {
            ok = false;
        }
        Ok(ok)
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let mut config = Config::default();
    if let Some(size) = args.size {
        config.capacity = size;
        config.max_inodes = (size / memfs_fs::PAGE_SIZE as u64).max(1024);
    }
    if let Some(n) = args.inodes {
        config.max_inodes = n;
    }
    let (fs, durable) = match &args.data_dir {
        Some(dir) => {
            let (fs, d) = open_data_dir(dir, config, args.durability.as_deref())?;
            (fs, Some(d))
        }
        None => (Arc::new(Fs::new(config)), None),
    };
    let out: Box<dyn Write> = Box::new(std::io::BufWriter::new(std::io::stdout()));
    let mut shell = Shell::new(fs, out);
    shell.durable = durable;
    let ok = if let Some(cmds) = &args.command {
        shell.run_text(cmds, args.keep_going)
    } else if let Some(script) = &args.script {
        let file = std::fs::File::open(script)
            .with_context(|| format!("cannot open script {}", script.display()))?;
        shell.run_reader(std::io::BufReader::new(file), args.keep_going)?
    } else if std::io::stdin().is_terminal() {
        shell.interactive = true;
        interactive::run(&mut shell)?;
        true
    } else {
        shell.run_reader(std::io::stdin().lock(), args.keep_going)?
    };
    let _ = shell.out.flush();
    if let Some(d) = &shell.durable {
        d.close().context("closing the data directory")?;
    }
    let code = match shell.exit {
        Some(code) => code,
        None if ok => 0,
        None => 1,
    };
    if code != 0 {
        // The failing command already said why on its own line.
        std::process::exit(code);
    }
    Ok(())
}
