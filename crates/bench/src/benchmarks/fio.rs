//! `memfs bench fio`: the fio random read/write job of
//! shared/reference/workloads.md section 3, run by the real `fio` binary on a
//! memfs mount and on tmpfs in the same run. The exact jobs are also written
//! down as job files in bench/fio/.

use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};

use crate::common::Target;
use crate::common::{
    ChildGuard, DiskDir, Figure, MIB, MemfsMount, Report, TmpfsDir, check_interrupted,
    install_interrupt_handler, progress, split_args,
};

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Baseline {
    /// A fresh tmpfs (as root) or /dev/shm.
    Tmpfs,
    /// No baseline: measure memfs alone.
    None,
}

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Size of the test file (fio -size).
    #[arg(long, default_value = "1G")]
    pub size: String,
    /// Seconds each job runs (fio -runtime, time based).
    #[arg(long, default_value_t = 30)]
    pub runtime: u64,
    /// Block sizes to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "4k,1m")]
    pub bs: Vec<String>,
    /// O_DIRECT I/O (fio -direct=1), buffered (`--direct=false`) or both
    /// (`--direct true,false`, the default: all four figures in one run).
    #[arg(long, value_delimiter = ',', default_value = "true,false",
          action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub direct: Vec<bool>,
    /// Verify what was written (fio -verify=md5 --do_verify=1 --verify_fatal=1).
    #[arg(long)]
    pub verify: bool,
    /// Where to write the JSON results.
    #[arg(long, default_value = "bench-fio.json")]
    pub json: PathBuf,
    /// What to compare memfs against, measured in the same run.
    #[arg(long, value_enum, default_value_t = Baseline::Tmpfs)]
    pub baseline: Baseline,
    /// Extra `memfs mount` options for the mount under test, e.g. "--threads 2".
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub memfs_args: String,
    /// The fio binary.
    #[arg(long, default_value = "fio")]
    pub fio: PathBuf,
    /// Mount memfs with a fresh data directory on the disk in this mode (none, sync,
    /// async[=N], relaxed=N); the baseline becomes the disk file system, and with
    /// `sync` both run fio with -fsync=1.
    #[arg(long, value_name = "MODE")]
    pub durability: Option<String>,
}

/// One fio job.
#[derive(Debug, Clone)]
pub struct FioJob {
    /// Block size as given (e.g. `4k`), and in bytes.
    pub bs: String,
    pub bs_bytes: u64,
    pub size_bytes: u64,
    pub runtime_secs: u64,
    pub direct: bool,
    pub verify: bool,
    /// fio -fsync=1 (an fsync after every write).
    pub fsync: bool,
    /// fio's `-rw`: `randrw` unless a benchmark asks for one way only
    /// (`randread`, `randwrite`; see [`FioJob::ways`]).
    pub rw: &'static str,
    /// Extra figure-name part, e.g. `durable-sync`.
    pub tag: Option<String>,
}

impl FioJob {
    pub fn new(
        bs: &str,
        size_bytes: u64,
        runtime_secs: u64,
        direct: bool,
        verify: bool,
    ) -> anyhow::Result<Self> {
        let bs = bs.trim().to_ascii_lowercase();
        let bs_bytes = parse_bytes(&bs).with_context(|| format!("invalid block size {bs:?}"))?;
        if bs_bytes == 0 || bs_bytes % 512 != 0 {
            bail!("invalid block size {bs:?}: must be a multiple of 512 bytes");
        }
        if size_bytes < bs_bytes {
            bail!("--size ({size_bytes} bytes) is smaller than the block size {bs}");
        }
        if runtime_secs == 0 {
            bail!("--runtime must be at least 1 second");
        }
        Ok(FioJob {
            bs,
            bs_bytes,
            size_bytes,
            runtime_secs,
            direct,
            verify,
            fsync: false,
            rw: "randrw",
            tag: None,
        })
    }

    /// fio's command line for a test file in `dir` (see bench/fio/*.fio).
    pub fn args(&self, dir: &Path) -> Vec<String> {
        let mut a: Vec<String> = vec![
            format!("-direct={}", u8::from(self.direct)),
            "-iodepth=32".into(),
            format!("-rw={}", self.rw),
            "-ioengine=libaio".into(),
            format!("-bs={}", self.bs_bytes),
            format!("-size={}", self.size_bytes),
            "-numjobs=1".into(),
            format!("-runtime={}", self.runtime_secs),
            "-time_based".into(),
            "-group_reporting".into(),
            format!("-filename={}", dir.join("testfile").display()),
            "-fallocate=none".into(),
            "-name=RandRW".into(),
            "--output-format=json".into(),
        ];
        if self.verify {
            a.extend([
                "-verify=md5".into(),
                "--do_verify=1".into(),
                "--verify_fatal=1".into(),
            ]);
        }
        if self.fsync {
            a.push("-fsync=1".into());
        }
        a
    }

    /// The ways the job moves data, of `read` and `write`.
    pub fn ways(&self) -> &'static [&'static str] {
        match self.rw {
            "randread" | "read" => &["read"],
            "randwrite" | "write" => &["write"],
            _ => &["read", "write"],
        }
    }

    /// Figure-name prefix, e.g. `fio.4k.direct`.
    pub fn prefix(&self) -> String {
        let mut p = format!(
            "fio.{}.{}",
            self.bs,
            if self.direct { "direct" } else { "buffered" }
        );
        if self.verify {
            p.push_str(".verify");
        }
        if let Some(t) = &self.tag {
            p.push('.');
            p.push_str(t);
        }
        p
    }

    /// Issue 16's targets for unverified runs, as ratios to the baseline
    /// measured in the same run (each way): absolute rates mean nothing on
    /// a shared machine whose tmpfs itself varies threefold.
    pub fn target_ratio(&self) -> Option<f64> {
        match (self.bs_bytes, self.direct, self.verify) {
            (4096, true, false) => Some(0.8),
            (4096, false, false) => Some(0.5),
            (1_048_576, true, false) => Some(0.95),
            (1_048_576, false, false) => Some(0.9),
            _ => None,
        }
    }
}

pub fn parse_bytes(s: &str) -> anyhow::Result<u64> {
    memfs_durable::parse_bytes(s).map_err(|e| anyhow::anyhow!("{e} (use e.g. 4k, 1m, 1G)"))
}

/// Bandwidth and IOPS of one run (bytes per second).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FioResult {
    pub read_bw: f64,
    pub write_bw: f64,
    pub read_iops: f64,
    pub write_iops: f64,
}

/// Reads fio's `--output-format=json` output (which fio may precede with
/// warning lines).
pub fn parse_fio_json(out: &str) -> anyhow::Result<FioResult> {
    let start = out
        .find('{')
        .context("fio printed no JSON (is it fio 3.x?)")?;
    let v: serde_json::Value =
        serde_json::from_str(&out[start..]).context("fio's JSON output does not parse")?;
    let job = v
        .get("jobs")
        .and_then(|j| j.get(0))
        .context("fio's JSON has no jobs")?;
    if let Some(err) = job
        .get("error")
        .and_then(|e| e.as_i64())
        .filter(|&e| e != 0)
    {
        bail!(
            "fio reported error {err} ({})",
            nix::errno::Errno::from_raw(err as i32).desc()
        );
    }
    let num = |dir: &str, key: &str| -> anyhow::Result<f64> {
        job.get(dir)
            .and_then(|d| d.get(key))
            .and_then(|x| x.as_f64())
            .with_context(|| format!("fio's JSON has no jobs[0].{dir}.{key}"))
    };
    Ok(FioResult {
        read_bw: num("read", "bw_bytes")?,
        write_bw: num("write", "bw_bytes")?,
        read_iops: num("read", "iops")?,
        write_iops: num("write", "iops")?,
    })
}

/// Removes the test file and fio's verify state files from `dir`.
fn remove_fio_files(dir: &Path) {
    let _ = std::fs::remove_file(dir.join("testfile"));
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("local-") && name.ends_with("-verify.state") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Runs one job on `dir` and removes its files afterwards. `tick` runs
/// while fio does (for progress).
pub fn run_fio(
    fio: &Path,
    job: &FioJob,
    dir: &Path,
    tick: impl FnMut(),
) -> anyhow::Result<FioResult> {
    check_interrupted()?;
    // Files rather than pipes: nothing to drain while we wait and poll.
    let mut out = tempfile::tempfile().context("cannot create a file for fio's output")?;
    let mut err = tempfile::tempfile().context("cannot create a file for fio's errors")?;
    let mut cmd = Command::new(fio);
    let mut guard = ChildGuard(Some(
        ChildGuard::group(&mut cmd)
            .args(job.args(dir))
            // With verification fio saves a state file in its working
            // directory: keep it in the directory under test.
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(err.try_clone()?)
            .spawn()
            .with_context(|| format!("cannot run {} (install fio)", fio.display()))?,
    ));
    let status = guard.wait(tick);
    drop(guard);
    remove_fio_files(dir);
    let status = status?;
    let mut stdout = String::new();
    let mut stderr = String::new();
    out.rewind()?;
    out.read_to_string(&mut stdout)?;
    err.rewind()?;
    err.read_to_string(&mut stderr)?;
    if !status.success() {
        let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "fio {} failed ({status}): {}",
            job.prefix(),
            if tail.is_empty() {
                stdout.chars().take(2000).collect::<String>()
            } else {
                tail.join("\n")
            }
        );
    }
    parse_fio_json(&stdout).with_context(|| format!("fio {}", job.prefix()))
}

/// Runs every job on every target, alternating targets job by job.
/// `result[target][job]`.
pub fn measure(
    fio: &Path,
    targets: &[&Target],
    jobs: &[FioJob],
) -> anyhow::Result<Vec<Vec<FioResult>>> {
    let mut all = vec![Vec::with_capacity(jobs.len()); targets.len()];
    // Time based runs: the bar counts seconds (fio's layout comes on top).
    let total: u64 = jobs.iter().map(|j| j.runtime_secs).sum::<u64>() * targets.len() as u64;
    let bar = progress(
        total,
        "{msg:32} [{elapsed_precise}] {wide_bar} {pos}/{len} s (about {eta} left)",
    );
    let mut done = 0;
    for job in jobs {
        for (ti, t) in targets.iter().enumerate() {
            bar.set_message(format!("{} on {}", job.prefix(), t.name()));
            let started = Instant::now();
            let tick = || {
                bar.set_position(done + started.elapsed().as_secs().min(job.runtime_secs));
            };
            let r = run_fio(fio, job, t.path(), tick)
                .with_context(|| format!("on {} ({})", t.name(), t.path().display()))?;
            done += job.runtime_secs;
            bar.set_position(done);
            all[ti].push(r);
        }
    }
    bar.finish_and_clear();
    Ok(all)
}

/// Read and write bandwidth figures (MiB/s) for each job.
pub fn figures(
    jobs: &[FioJob],
    subject: &[FioResult],
    baseline: Option<(&str, &[FioResult])>,
) -> Vec<Figure> {
    let mut out = Vec::new();
    for (j, job) in jobs.iter().enumerate() {
        for (way, get) in [
            ("read", (|r: &FioResult| r.read_bw) as fn(&FioResult) -> f64),
            ("write", |r: &FioResult| r.write_bw),
        ] {
            if !job.ways().contains(&way) {
                continue;
            }
            let mut f = Figure::new(
                format!("{}.{way}", job.prefix()),
                "MiB/s",
                get(&subject[j]) / MIB,
            );
            let mut target = None;
            if let Some((name, base)) = baseline {
                let b = get(&base[j]) / MIB;
                f = f.baseline(name, b, None);
                // The targets are against tmpfs, not a disk baseline.
                if name.starts_with("tmpfs") {
                    target = job.target_ratio().map(|r| r * b);
                }
            }
            out.push(f.target(target));
        }
    }
    out
}

pub fn fio_available(fio: &Path) -> bool {
    Command::new(fio)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let report = report(&args)?;
    print!("{}", report.table());
    report.write_json(&args.json)?;
    eprintln!("fio: results written to {}", args.json.display());
    Ok(())
}

/// Measures as `memfs bench fio` does and returns the report (nothing
/// printed but progress, nothing written): `memfs bench all` calls this.
pub fn report(args: &Args) -> anyhow::Result<Report> {
    install_interrupt_handler();
    let size =
        parse_bytes(&args.size).with_context(|| format!("invalid --size {:?}", args.size))?;
    if args.bs.is_empty() {
        bail!("--bs needs at least one block size");
    }
    // Declared before the mount: its data directory outlives it.
    let durable = crate::common::DurableSubject::new(args.durability.as_deref())?;
    if args.direct.is_empty() {
        bail!("--direct needs true, false or both");
    }
    let jobs = jobs(args, size, durable.as_ref())?;
    if !fio_available(&args.fio) {
        bail!(
            "{} not found or not working: install fio (apt-get install fio)",
            args.fio.display()
        );
    }
    let started = Instant::now();
    // Machine and load are recorded as they were when the run began.
    let mut report = Report::new("fio", serde_json::Value::Null);
    let mut memfs_args = split_args(&args.memfs_args);
    memfs_args.extend(durable.iter().flat_map(|d| d.mount_args()));
    let subject = Target::Memfs(MemfsMount::new(&memfs_args)?);
    let baseline = match args.baseline {
        Baseline::Tmpfs if durable.is_some() => Some(Target::Disk(DiskDir::new()?)),
        // Room for the file plus fio's own slack.
        Baseline::Tmpfs => Some(Target::Tmpfs(TmpfsDir::new(size + size / 4 + (64 << 20))?)),
        Baseline::None => None,
    };
    let mut list = vec![&subject];
    list.extend(baseline.as_ref());
    let results = measure(&args.fio, &list, &jobs)?;

    let config = serde_json::json!({
        "size_bytes": size,
        "runtime_secs": args.runtime,
        "bs": jobs.iter().map(|j| j.bs.clone()).collect::<Vec<_>>(),
        "direct": args.direct,
        "verify": args.verify,
        "iodepth": 32,
        "ioengine": "libaio",
        "rw": "randrw",
        "baseline": baseline.as_ref().map(Target::name),
        "memfs_args": memfs_args,
        "durability": args.durability,
        "fio_args": jobs.iter().map(|j| j.args(Path::new("MNT")).join(" ")).collect::<Vec<_>>(),
    });
    report.config = config;
    let base_name = baseline.as_ref().map(Target::name);
    report.figures = figures(
        &jobs,
        &results[0],
        base_name.as_deref().map(|n| (n, results[1].as_slice())),
    );
    if let Target::Memfs(m) = &subject {
        let mem = m.memory()?;
        report
            .figures
            .push(Figure::new("fio.server_vmhwm", "MiB", mem.hwm as f64 / MIB).lower_is_better());
    }
    report.duration_secs = started.elapsed().as_secs_f64();
    Ok(report)
}

/// One job a block size and direct setting, in that order.
fn jobs(
    args: &Args,
    size: u64,
    durable: Option<&crate::common::DurableSubject>,
) -> anyhow::Result<Vec<FioJob>> {
    args.bs
        .iter()
        .flat_map(|bs| args.direct.iter().map(move |&direct| (bs, direct)))
        .map(|(bs, direct)| {
            let mut job = FioJob::new(bs, size, args.runtime, direct, args.verify)?;
            job.fsync = durable.is_some_and(|d| d.is_sync());
            job.tag = durable.map(|d| d.label());
            Ok(job)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_the_reference_command_line() {
        let job = FioJob::new("4K", 1 << 30, 30, true, true).unwrap();
        let a = job.args(Path::new("/mnt/x")).join(" ");
        for want in [
            "-direct=1",
            "-iodepth=32",
            "-rw=randrw",
            "-ioengine=libaio",
            "-bs=4096",
            "-size=1073741824",
            "-numjobs=1",
            "-runtime=30",
            "-time_based",
            "-filename=/mnt/x/testfile",
            "-fallocate=none",
            "-name=RandRW",
            "-verify=md5 --do_verify=1 --verify_fatal=1",
        ] {
            assert!(a.contains(want), "{want} missing from {a}");
        }
        assert_eq!(job.prefix(), "fio.4k.direct.verify");
        assert_eq!(job.target_ratio(), None);
        assert_eq!(
            FioJob::new("1m", 1 << 30, 30, true, false)
                .unwrap()
                .target_ratio(),
            Some(0.95)
        );
        assert_eq!(
            FioJob::new("4k", 1 << 30, 30, false, false)
                .unwrap()
                .target_ratio(),
            Some(0.5)
        );
        assert!(FioJob::new("100", 1 << 20, 1, true, false).is_err());
        assert!(FioJob::new("4m", 1 << 20, 1, true, false).is_err());
        assert!(FioJob::new("x", 1 << 20, 1, true, false).is_err());
        assert!(FioJob::new("4k", 1 << 20, 0, true, false).is_err());
    }

    #[test]
    fn parses_fio_json() {
        let out = "fio: some warning\n{\"jobs\":[{\"error\":0,\
            \"read\":{\"bw_bytes\":1048576,\"iops\":256.5},\
            \"write\":{\"bw_bytes\":2097152,\"iops\":512}}]}";
        let r = parse_fio_json(out).unwrap();
        assert_eq!(r.read_bw, 1048576.0);
        assert_eq!(r.write_iops, 512.0);
        let f = figures(
            &[FioJob::new("4k", 1 << 20, 1, true, false).unwrap()],
            &[r],
            Some(("tmpfs", &[r])),
        );
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].figure, "fio.4k.direct.read");
        assert_eq!(f[0].value, 1.0);
        assert_eq!(f[1].ratio, Some(1.0));
        // 1.0x of tmpfs meets 4 KiB direct's 0.8x.
        assert_eq!(f[1].target, Some(1.6));
        assert_eq!(f[1].met, Some(true));

        assert!(parse_fio_json("no json").is_err());
        assert!(parse_fio_json("{\"jobs\":[]}").is_err());
        let failed = "{\"jobs\":[{\"error\":5,\"read\":{},\"write\":{}}]}";
        assert!(format!("{:#}", parse_fio_json(failed).unwrap_err()).contains("error 5"));
    }
}
