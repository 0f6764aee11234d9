//! Shared parts of the `memfs bench` commands: mounts to measure on (a memfs
//! child process, a fresh tmpfs), the figure/report format written as JSON,
//! the result table, and process memory figures from /proc.
//!
//! The benchmarks of the later `memfs bench all` suite reuse these, so the
//! JSON shape here is the contract: one flat record per figure with its unit,
//! its baseline measured in the same run, the ratio, the target and whether it
//! was met.

use crate::system::{is_root, lazy_unmount};
use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use crate::system::is_mounted;

/// How long a fresh memfs mount may take to appear before we give up loudly.
const MOUNT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long an unmounted server may take to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(5);

static INTERRUPTED: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// Turns SIGINT/SIGTERM into a flag the benchmark loops poll, so that an
/// interrupted run still drops its guards (unmounts, kills its children)
/// instead of leaving mounts behind.
pub fn install_interrupt_handler() {
    INTERRUPTED.get_or_init(|| {
        let flag = Arc::new(AtomicBool::new(false));
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            let _ = signal_hook::flag::register(sig, Arc::clone(&flag));
        }
        flag
    });
}

pub fn interrupted() -> bool {
    INTERRUPTED.get().is_some_and(|f| f.load(Ordering::Relaxed))
}

pub fn check_interrupted() -> anyhow::Result<()> {
    if interrupted() {
        bail!("interrupted");
    }
    Ok(())
}

/// Polls `cond` every few milliseconds until it holds or `timeout` passes.
pub fn poll_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Splits `--memfs-args "..."` into arguments (whitespace separated; quotes
/// are not needed for any mount option).
pub fn split_args(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

/// A memfs served by a child process (`memfs mount DIR --foreground`) on a
/// fresh temporary directory. Dropping it unmounts, then waits for the child
/// (killing it if it does not leave on its own), on every path.
pub struct MemfsMount {
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
    child: Option<Child>,
    log: std::fs::File,
}

impl MemfsMount {
    /// Mounts with the memfs binary that is running now.
    pub fn new(extra_args: &[String]) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("cannot find the memfs executable")?;
        Self::with_exe(&exe, extra_args)
    }

    pub fn with_exe(exe: &Path, extra_args: &[String]) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("memfs-bench-")
            .tempdir()
            .context("cannot create a temporary mount point")?;
        let path = dir
            .path()
            .canonicalize()
            .context("cannot resolve the temporary mount point")?;
        let log = tempfile::tempfile().context("cannot create a log file for the server")?;
        let mut cmd = Command::new(exe);
        cmd.arg("mount")
            .arg(&path)
            .arg("--foreground")
            .args(extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.try_clone().context("cannot share the server log")?);
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", exe.display()))?;
        let mut mount = MemfsMount {
            dir: Some(dir),
            path,
            child: Some(child),
            log,
        };
        mount.wait_ready()?;
        Ok(mount)
    }

    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let mut exited = None;
        let path = self.path.clone();
        let child = self.child.as_mut().expect("child present until drop");
        let ready = poll_until(MOUNT_TIMEOUT, || {
            if let Ok(Some(status)) = child.try_wait() {
                exited = Some(status);
                return true;
            }
            is_mounted(&path) || interrupted()
        });
        check_interrupted()?;
        if let Some(status) = exited {
            bail!(
                "the memfs server exited before mounting ({status}): {}",
                self.server_log()
            );
        }
        if !ready {
            bail!(
                "memfs did not appear at {} within {:?}: {}",
                self.path.display(),
                MOUNT_TIMEOUT,
                self.server_log()
            );
        }
        Ok(())
    }

    /// What the server wrote on its standard error (for error messages).
    pub fn server_log(&self) -> String {
        let mut f = &self.log;
        let mut s = String::new();
        let _ = f.rewind();
        let _ = f.read_to_string(&mut s);
        let s = s.trim();
        if s.is_empty() {
            "(no output)".into()
        } else {
            s.to_string()
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The server's memory right now.
    pub fn memory(&self) -> anyhow::Result<ProcMemory> {
        ProcMemory::of(self.pid())
    }
}

impl Drop for MemfsMount {
    fn drop(&mut self) {
        if is_mounted(&self.path) {
            lazy_unmount(&self.path);
        }
        if let Some(mut child) = self.child.take() {
            // Unmounting ends the session and the server exits by itself.
            let gone = poll_until(EXIT_GRACE, || matches!(child.try_wait(), Ok(Some(_))));
            if !gone {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
        if let Some(dir) = self.dir.take() {
            // Only an empty directory is left once unmounted; never recurse
            // into what could still be a mount.
            let _ = std::fs::remove_dir(dir.path());
            std::mem::forget(dir);
        }
    }
}

/// The tmpfs baseline: as root a fresh tmpfs mounted on a temporary directory
/// (so that nothing else on the machine shares it), otherwise a directory in
/// /dev/shm. Dropping it unmounts and removes what it created.
pub struct TmpfsDir {
    path: PathBuf,
    mounted: bool,
    dir: Option<tempfile::TempDir>,
}

impl TmpfsDir {
    /// `size` bounds the fresh tmpfs (bytes); /dev/shm has its own.
    pub fn new(size: u64) -> anyhow::Result<Self> {
        if is_root() {
            let dir = tempfile::Builder::new()
                .prefix("memfs-bench-tmpfs-")
                .tempdir()
                .context("cannot create a temporary mount point")?;
            let path = dir.path().canonicalize()?;
            let opts = format!("size={size},mode=0755");
            match nix::mount::mount(
                Some("memfs-bench"),
                &path,
                Some("tmpfs"),
                nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
                Some(opts.as_str()),
            ) {
                Ok(()) => {
                    return Ok(TmpfsDir {
                        path,
                        mounted: true,
                        dir: Some(dir),
                    });
                }
                Err(e) => tracing::warn!("cannot mount a tmpfs ({e}); using /dev/shm"),
            }
        }
        let dir = tempfile::Builder::new()
            .prefix("memfs-bench-")
            .tempdir_in("/dev/shm")
            .context("cannot mount a tmpfs (not root) nor create a directory in /dev/shm")?;
        Ok(TmpfsDir {
            path: dir.path().canonicalize()?,
            mounted: false,
            dir: Some(dir),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// "tmpfs" or "/dev/shm", for reports.
    pub fn describe(&self) -> &'static str {
        if self.mounted {
            "tmpfs (fresh mount)"
        } else {
            "tmpfs (/dev/shm)"
        }
    }
}

impl Drop for TmpfsDir {
    fn drop(&mut self) {
        if self.mounted {
            let _ = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH);
            if let Some(dir) = self.dir.take() {
                let _ = std::fs::remove_dir(dir.path());
                std::mem::forget(dir);
            }
        }
        // Unmounted case: TempDir removes its tree when dropped.
    }
}

/// A directory on the disk file system (for `--baseline disk`), removed on drop.
pub struct DiskDir {
    dir: tempfile::TempDir,
}

impl DiskDir {
    pub fn new() -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("memfs-bench-")
            .tempdir_in("/var/tmp")
            .context("cannot create a directory in /var/tmp")?;
        Ok(DiskDir { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Resident memory of a process, from /proc/PID/status (bytes).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ProcMemory {
    /// Resident now.
    pub rss: u64,
    /// Highest resident size since the process started.
    pub hwm: u64,
}

impl ProcMemory {
    pub fn of(pid: u32) -> anyhow::Result<Self> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("cannot read /proc/{pid}/status"))?;
        Self::parse(&status).with_context(|| format!("no VmRSS/VmHWM in /proc/{pid}/status"))
    }

    fn parse(status: &str) -> Option<Self> {
        let field = |name: &str| -> Option<u64> {
            let line = status.lines().find(|l| l.starts_with(name))?;
            let kib: u64 = line[name.len()..]
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()?;
            Some(kib * 1024)
        };
        Some(ProcMemory {
            rss: field("VmRSS:")?,
            hwm: field("VmHWM:")?,
        })
    }
}

/// Which way is better for a figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    Higher,
    Lower,
}

/// One measured figure: the unit of every benchmark report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Figure {
    /// Stable identifier, e.g. `metadata.t1.create` (used to compare runs).
    pub figure: String,
    pub unit: String,
    /// memfs's value (or the value on `--path`).
    pub value: f64,
    /// Standard deviation over iterations, when there were several.
    pub stddev: Option<f64>,
    /// The baseline's value measured in the same run.
    pub baseline: Option<f64>,
    pub baseline_stddev: Option<f64>,
    /// What the baseline was (`tmpfs`, `idle server`, ...).
    pub baseline_name: Option<String>,
    /// value / baseline.
    pub ratio: Option<f64>,
    pub target: Option<f64>,
    pub better: Better,
    /// Whether `value` reaches `target` (absent without a target).
    pub met: Option<bool>,
}

impl Figure {
    pub fn new(figure: impl Into<String>, unit: impl Into<String>, value: f64) -> Self {
        Figure {
            figure: figure.into(),
            unit: unit.into(),
            value,
            stddev: None,
            baseline: None,
            baseline_stddev: None,
            baseline_name: None,
            ratio: None,
            target: None,
            better: Better::Higher,
            met: None,
        }
    }

    pub fn stddev(mut self, sd: Option<f64>) -> Self {
        self.stddev = sd;
        self
    }

    pub fn lower_is_better(mut self) -> Self {
        self.better = Better::Lower;
        self.met = self.target.map(|t| self.meets(t));
        self
    }

    pub fn baseline(mut self, name: impl Into<String>, value: f64, sd: Option<f64>) -> Self {
        self.baseline = Some(value);
        self.baseline_stddev = sd;
        self.baseline_name = Some(name.into());
        self.ratio = (value != 0.0).then(|| self.value / value);
        self
    }

    pub fn target(mut self, target: Option<f64>) -> Self {
        self.target = target;
        self.met = target.map(|t| self.meets(t));
        self
    }

    fn meets(&self, target: f64) -> bool {
        match self.better {
            Better::Higher => self.value >= target,
            Better::Lower => self.value <= target,
        }
    }
}

/// The machine a run happened on (reports must say it: the numbers mean
/// nothing without it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    pub cpu_model: String,
    pub cpus: usize,
    pub memory_bytes: u64,
    pub kernel: String,
    pub hostname: String,
    /// 1-minute load average when the run started: other work on a shared
    /// machine makes figures noisy.
    pub load_average: Option<f64>,
}

impl Machine {
    pub fn describe() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map_or_else(|| "unknown".into(), |(_, v)| v.trim().to_string());
        let proc_line = |path: &str| {
            std::fs::read_to_string(path)
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into())
        };
        let kernel = proc_line("/proc/sys/kernel/osrelease");
        let hostname = proc_line("/proc/sys/kernel/hostname");
        let load_average = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok());
        Machine {
            cpu_model,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_bytes: memfs_fs::physical_memory(),
            kernel,
            hostname,
            load_average,
        }
    }
}

/// A benchmark's whole result, as written to its JSON file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub benchmark: String,
    /// The command line that produced it.
    pub command: String,
    /// Seconds since the Unix epoch when the run started.
    pub started_unix: u64,
    pub duration_secs: f64,
    pub machine: Machine,
    /// Benchmark-specific settings (objects, threads, sizes, mount options...).
    pub config: serde_json::Value,
    /// What `value` was measured on (`memfs`, or a `--path`).
    pub subject: String,
    pub figures: Vec<Figure>,
}

impl Report {
    pub fn new(benchmark: &str, config: serde_json::Value) -> Self {
        let command: Vec<String> = std::env::args_os()
            .map(|a: OsString| a.to_string_lossy().into_owned())
            .collect();
        Report {
            benchmark: benchmark.into(),
            command: command.join(" "),
            started_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            duration_secs: 0.0,
            machine: Machine::describe(),
            config,
            subject: "memfs".into(),
            figures: Vec::new(),
        }
    }

    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))
    }

    /// The figures as an aligned text table.
    pub fn table(&self) -> String {
        self.table_with(fmt_num)
    }

    /// The table with numbers formatted by `num`. When the rows compare
    /// against different baselines, each row names its own.
    pub fn table_with(&self, num: fn(f64) -> String) -> String {
        let mut names = self
            .figures
            .iter()
            .filter_map(|f| f.baseline_name.as_deref());
        let first = names.next();
        let per_row = names.any(|n| Some(n) != first);
        let baseline = if per_row {
            "baseline"
        } else {
            first.unwrap_or("baseline")
        };
        let mut header = vec!["figure", "unit", self.subject.as_str(), "±", baseline, "±"];
        if per_row {
            header.push("baseline is");
        }
        header.extend(["ratio", "target", "met"]);
        let rows: Vec<Vec<String>> = self
            .figures
            .iter()
            .map(|f| table_row(f, per_row, num))
            .collect();
        let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
        for row in &rows {
            for (w, c) in widths.iter_mut().zip(row) {
                *w = (*w).max(c.chars().count());
            }
        }
        // Text columns (names, units, the per-row baseline) align left.
        let left = |i: usize| i <= 1 || (per_row && i == 6);
        let mut out = String::new();
        let line = |out: &mut String, cells: &[String]| {
            for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
                let sep = if i == 0 { "" } else { "  " };
                if left(i) {
                    let _ = write!(out, "{sep}{c:<w$}");
                } else {
                    let _ = write!(out, "{sep}{c:>w$}");
                }
            }
            out.push('\n');
        };
        line(
            &mut out,
            &header.iter().map(|h| h.to_string()).collect::<Vec<_>>(),
        );
        let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
        line(&mut out, &rule);
        for row in &rows {
            line(&mut out, row);
        }
        out
    }
}

/// A figure's cells in [`Report::table_with`], with its baseline's name if
/// `per_row`.
fn table_row(f: &Figure, per_row: bool, num: fn(f64) -> String) -> Vec<String> {
    let mut row = vec![
        f.figure.clone(),
        f.unit.clone(),
        num(f.value),
        f.stddev.map_or_else(String::new, num),
        f.baseline.map_or_else(|| "-".into(), num),
        f.baseline_stddev.map_or_else(String::new, num),
    ];
    if per_row {
        row.push(f.baseline_name.clone().unwrap_or_else(|| "-".into()));
    }
    row.extend([
        f.ratio.map_or_else(|| "-".into(), |r| format!("{r:.2}x")),
        f.target.map_or_else(
            || "-".into(),
            |t| {
                let op = if f.better == Better::Higher {
                    ">="
                } else {
                    "<="
                };
                format!("{op} {}", num(t))
            },
        ),
        match f.met {
            Some(true) => "yes".into(),
            Some(false) => "NO".into(),
            None => "-".into(),
        },
    ]);
    row
}

/// UTC calendar date and time of a Unix time: (year, month, day, hour,
/// minute, second), by Howard Hinnant's days-to-civil algorithm.
pub fn civil_utc(t: i64) -> (i64, i64, i64, i64, i64, i64) {
    let days = t.div_euclid(86_400);
    let secs = t.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d, secs / 3600, secs / 60 % 60, secs % 60)
}

/// Numbers as people read them: thousands separated, a decimal only when small.
pub fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    if v.abs() >= 100.0 {
        let n = v.round() as i64;
        let digits = n.unsigned_abs().to_string();
        let mut out = String::new();
        for (i, ch) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(ch);
        }
        if n < 0 { format!("-{out}") } else { out }
    } else {
        format!("{v:.1}")
    }
}

/// Mean and sample standard deviation (None for a single value).
pub fn mean_sd(values: &[f64]) -> (f64, Option<f64>) {
    if values.is_empty() {
        return (0.0, None);
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    if values.len() < 2 {
        return (mean, None);
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, Some(var.sqrt()))
}

pub const MIB: f64 = 1024.0 * 1024.0;

static BARS: OnceLock<indicatif::MultiProgress> = OnceLock::new();

/// Makes every later [`progress`] bar draw below `multi`'s bars (`memfs bench
/// all` keeps its overall bar on screen while each benchmark shows its own).
pub fn share_progress(multi: indicatif::MultiProgress) {
    let _ = BARS.set(multi);
}

/// A progress bar on standard error (hidden when it is not a terminal).
pub fn progress(len: u64, template: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    match BARS.get() {
        Some(multi) => multi.add(bar),
        None => bar,
    }
}

/// A child process that is killed and reaped if it is still running when
/// dropped (errors, interrupts, panics): SIGTERM, then SIGKILL after a grace
/// period. Spawned in a process group of its own (see [`ChildGuard::group`]),
/// it does not get the terminal's Ctrl-C directly (we stop it ourselves) and
/// its whole group is killed if it does not leave in time.
pub struct ChildGuard(pub Option<Child>);

impl ChildGuard {
    /// Prepares `cmd` to lead a process group of its own.
    pub fn group(cmd: &mut Command) -> &mut Command {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0)
    }

    /// Waits for the child, polling so that an interrupt is noticed and
    /// `tick` runs about every 100 ms.
    pub fn wait(&mut self, mut tick: impl FnMut()) -> anyhow::Result<std::process::ExitStatus> {
        let child = self.0.as_mut().context("child already reaped")?;
        loop {
            if let Some(status) = child.try_wait()? {
                self.0 = None;
                return Ok(status);
            }
            check_interrupted()?;
            tick();
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            // Ask first: fio forks its jobs into sessions of their own and
            // only stops them itself, on SIGTERM.
            let pid = nix::unistd::Pid::from_raw(c.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let gone = poll_until(EXIT_GRACE, || matches!(c.try_wait(), Ok(Some(_))));
            if !gone {
                if nix::unistd::getpgid(Some(pid)) == Ok(pid) {
                    // It leads its own group (and is not reaped yet, so the
                    // id cannot have been reused): take the group with it.
                    let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
                }
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

/// Registers a TrueType font for plot text: plotters is built with `ab_glyph`
/// (pure Rust, no fontconfig), which draws nothing until a font is registered.
/// Idempotent; an error names the package to install.
pub fn register_plot_font() -> anyhow::Result<()> {
    static FONT: OnceLock<Option<&'static [u8]>> = OnceLock::new();
    const CANDIDATES: &[&str] = &[
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
        "/usr/share/fonts/liberation/LiberationSans-Regular.ttf",
        "/usr/share/fonts/noto/NotoSans-Regular.ttf",
    ];
    let font = FONT.get_or_init(|| {
        CANDIDATES
            .iter()
            .find_map(|p| std::fs::read(p).ok())
            .map(|b| &*Box::leak(b.into_boxed_slice()))
    });
    let Some(font) = font else {
        bail!("no TrueType font found for plots (install fonts-dejavu-core)");
    };
    plotters::style::register_font("sans-serif", plotters::style::FontStyle::Normal, font)
        .map_err(|_| anyhow::anyhow!("the plot font could not be loaded"))
}

/// A place to measure on, kept alive for the whole run.
pub enum Target {
    Memfs(MemfsMount),
    Tmpfs(TmpfsDir),
    Disk(DiskDir),
    Path(PathBuf),
}

impl Target {
    pub fn path(&self) -> &Path {
        match self {
            Target::Memfs(m) => m.path(),
            Target::Tmpfs(t) => t.path(),
            Target::Disk(d) => d.path(),
            Target::Path(p) => p,
        }
    }

    pub fn name(&self) -> String {
        match self {
            Target::Memfs(_) => "memfs".into(),
            Target::Tmpfs(t) => t.describe().into(),
            Target::Disk(_) => "disk (/var/tmp)".into(),
            Target::Path(p) => p.display().to_string(),
        }
    }
}

/// A durability mode for a benchmark's memfs mount, with the fresh data
/// directory (on the disk, in /var/tmp) it is mounted with. Keep it alive
/// longer than the mount: declared before it, it is dropped after it.
pub struct DurableSubject {
    pub data: DiskDir,
    pub mode: String,
    sync: bool,
}

impl DurableSubject {
    /// `None` for `None`; a clear error for a mode `memfs mount` would refuse.
    pub fn new(mode: Option<&str>) -> anyhow::Result<Option<Self>> {
        let Some(mode) = mode else {
            return Ok(None);
        };
        let parsed = memfs_durable::parse_durability(mode).map_err(|e| {
            anyhow::anyhow!("invalid --durability {mode:?}: {e} (use none, sync, async, relaxed=N)")
        })?;
        Ok(Some(DurableSubject {
            data: DiskDir::new().context("cannot create a data directory")?,
            mode: mode.to_string(),
            sync: matches!(parsed, memfs_durable::Durability::Sync),
        }))
    }

    /// `memfs mount` options: this data directory and mode, no periodic
    /// checkpoints (they would land at random in the measurements).
    pub fn mount_args(&self) -> Vec<String> {
        durable_args(self.data.path(), &self.mode)
    }

    /// Whether the mode asks for every operation to be on stable storage
    /// (so the disk baseline fsyncs too).
    pub fn is_sync(&self) -> bool {
        self.sync
    }

    /// Figure-name part, e.g. `durable-sync`, `durable-relaxed-8`.
    pub fn label(&self) -> String {
        format!("durable-{}", self.mode.replace('=', "-"))
    }
}

pub fn durable_args(data: &Path, mode: &str) -> Vec<String> {
    vec![
        "--data-dir".into(),
        data.display().to_string(),
        "--durability".into(),
        mode.into(),
        "--checkpoint-interval".into(),
        "0s".into(),
    ]
}

/// Formats ops/s compactly: 1.23M, 45.6k, 789.
pub fn human(ops: f64) -> String {
    if ops >= 1e6 {
        format!("{:.2}M", ops / 1e6)
    } else if ops >= 1e3 {
        format!("{:.1}k", ops / 1e3)
    } else {
        format!("{ops:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_status() {
        let s = "Name:\tmemfs\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n";
        let m = ProcMemory::parse(s).unwrap();
        assert_eq!(m.rss, 1024 * 1024);
        assert_eq!(m.hwm, 2048 * 1024);
        assert!(ProcMemory::parse("Name: x\n").is_none());
    }

    #[test]
    fn own_memory_is_readable() {
        let m = ProcMemory::of(std::process::id()).unwrap();
        assert!(m.rss > 0 && m.hwm >= m.rss);
    }

    #[test]
    fn mean_and_sd() {
        let (m, sd) = mean_sd(&[1.0, 2.0, 3.0]);
        assert!((m - 2.0).abs() < 1e-12);
        assert!((sd.unwrap() - 1.0).abs() < 1e-12);
        assert_eq!(mean_sd(&[5.0]), (5.0, None));
    }

    #[test]
    fn figure_ratio_and_target() {
        let f = Figure::new("x", "ops/s", 50.0)
            .baseline("tmpfs", 100.0, None)
            .target(Some(60.0));
        assert_eq!(f.ratio, Some(0.5));
        assert_eq!(f.met, Some(false));
        let g = Figure::new("rss", "MiB", 200.0)
            .target(Some(300.0))
            .lower_is_better();
        assert_eq!(g.met, Some(true));
        assert!(
            Figure::new("z", "u", 1.0)
                .baseline("b", 0.0, None)
                .ratio
                .is_none()
        );
    }

    #[test]
    fn numbers_and_table() {
        assert_eq!(fmt_num(1234567.4), "1,234,567");
        assert_eq!(fmt_num(-1234.0), "-1,234");
        assert_eq!(fmt_num(12.345), "12.3");
        let mut r = Report::new("t", serde_json::json!({}));
        r.figures
            .push(Figure::new("a.b", "MiB/s", 1000.0).target(Some(10.0)));
        let t = r.table();
        assert!(
            t.contains("a.b") && t.contains("1,000") && t.contains(">= 10.0") && t.contains("yes")
        );
        assert_eq!(t.lines().count(), 3);
    }
}
