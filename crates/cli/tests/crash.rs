//! Real-process crash tests of a durable memfs: a `memfs mount --data-dir`
//! server is SIGKILLed while writers run through the kernel; after a remount
//! everything acknowledged must be there (`sync`), or what survives must be a
//! prefix of the commits (`async`, `relaxed`). Also snapshot/rollback round
//! trips, a `memfs rollback` SIGKILLed part-way, and bad input through the
//! binary.
//!
//! `MEMFS_CRASH_ROUNDS` (default 20) sets the rounds of the crash tests
//! (`scripts/crash-soak` runs many more); `MEMFS_CRASH_SEED` replays an
//! operation sequence (the kill moments stay up to the scheduler). Each
//! server's standard error goes to `$CARGO_TARGET_TMPDIR/<test>.log`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CString, OsStr, OsString};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Mount, disk_dir, is_mount_point, memfs, memfs_bin};

// ---------------------------------------------------------------- helpers

/// The journal's splitmix64, seeded the way these tests always were.
use memfs_durable::journal::SplitMix64 as Rng;

fn seeded(seed: u64) -> Rng {
    Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
}

fn mix(parts: &[u64]) -> u64 {
    let mut r = seeded(0x006d_656d_6673);
    for p in parts {
        r.0 ^= p.wrapping_mul(0xD6E8_FEB8_6659_FD93);
        r.next_u64();
    }
    r.next_u64()
}

/// Deterministic bytes for a seed (what a file must contain).
fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut r = seeded(seed);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&r.next_u64().to_le_bytes());
    }
    v.truncate(len);
    v
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn rounds() -> usize {
    std::env::var("MEMFS_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}

fn base_seed() -> u64 {
    std::env::var("MEMFS_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            mix(&[t.as_nanos() as u64, u64::from(std::process::id())])
        })
}

fn umask() -> u32 {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .map(|v| u32::from_str_radix(v.trim(), 8).unwrap())
        .unwrap_or(0o022)
}

/// Where the servers of one test write their standard error.
struct ServerLog {
    file: File,
}

impl ServerLog {
    fn new(name: &str) -> ServerLog {
        let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.log"));
        let file = File::create(&path).expect("server log");
        eprintln!("server output: {}", path.display());
        ServerLog { file }
    }

    fn note(&mut self, line: &str) {
        let _ = writeln!(self.file, "-- {line}");
    }

    fn mount(&self, args: &[OsString]) -> Mount {
        let args: Vec<&str> = args.iter().map(|a| a.to_str().unwrap()).collect();
        Mount::spawn(&args, Stdio::from(self.file.try_clone().unwrap()))
    }
}

fn data_dir_args(d: &Path, extra: &[&str]) -> Vec<OsString> {
    let mut v: Vec<OsString> = vec!["--data-dir".into(), d.into()];
    v.extend(extra.iter().map(OsString::from));
    v
}

fn text(o: &Output) -> String {
    format!(
        "exit {}\nstdout:\n{}stderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `memfs fsck` on a data directory nobody holds must say it is clean.
fn assert_fsck_clean(dir: &Path, what: &str) {
    let o = memfs([OsStr::new("fsck"), "--data-dir".as_ref(), dir.as_os_str()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.lines().last() == Some("clean"),
        "{what}: memfs fsck does not say clean:\n{}",
        text(&o)
    );
}

/// A mount point for a mount that is expected to fail; detached in Drop if
/// it mounted anyway (a background server exits once its mount is gone).
struct SpareMountPoint(tempfile::TempDir);

impl SpareMountPoint {
    fn new() -> SpareMountPoint {
        SpareMountPoint(
            tempfile::Builder::new()
                .prefix("memfs-spare-")
                .tempdir()
                .unwrap(),
        )
    }
    fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for SpareMountPoint {
    fn drop(&mut self) {
        if is_mount_point(self.0.path()) {
            let _ = nix::mount::umount2(self.0.path(), nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

// ------------------------------------------------------- the tree model

#[derive(Clone, PartialEq, Eq)]
enum Node {
    Dir { mode: u32, x: Xattrs },
    File { mode: u32, data: Vec<u8>, x: Xattrs },
    Symlink { target: String },
}

type Xattrs = BTreeMap<String, Vec<u8>>;

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Node::Dir { mode, x } => write!(f, "dir {mode:o} xattrs {x:?}"),
            Node::File { mode, data, x } => write!(
                f,
                "file {mode:o} {} bytes fnv {:016x} xattrs {:?}",
                data.len(),
                fnv(data),
                x.iter()
                    .map(|(k, v)| (k, v.len(), fnv(v)))
                    .collect::<Vec<_>>()
            ),
            Node::Symlink { target } => write!(f, "symlink -> {target}"),
        }
    }
}

/// Relative path ("a/b/c") to node; a directory's contents follow it.
type Tree = BTreeMap<String, Node>;

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

fn is_under(path: &str, dir: &str) -> bool {
    path.len() > dir.len() && path.starts_with(dir) && path.as_bytes()[dir.len()] == b'/'
}

/// One mutating system call (or an fsync) of a writer.
#[derive(Clone)]
enum Op {
    Create {
        path: String,
        mode: u32,
    },
    Append {
        path: String,
        data: Vec<u8>,
    },
    Overwrite {
        path: String,
        offset: u64,
        data: Vec<u8>,
    },
    Truncate {
        path: String,
        len: u64,
    },
    Chmod {
        path: String,
        mode: u32,
    },
    Rename {
        from: String,
        to: String,
    },
    Unlink {
        path: String,
    },
    Mkdir {
        path: String,
        mode: u32,
    },
    Rmdir {
        path: String,
    },
    Symlink {
        path: String,
        target: String,
    },
    Fsync {
        path: String,
    },
    SetXattr {
        path: String,
        name: String,
        value: Vec<u8>,
    },
    RemoveXattr {
        path: String,
        name: String,
    },
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Create { path, mode } => write!(f, "create {path} {mode:o}"),
            Op::Append { path, data } => write!(f, "append {} bytes to {path}", data.len()),
            Op::Overwrite { path, offset, data } => {
                write!(f, "pwrite {} bytes at {offset} of {path}", data.len())
            }
            Op::Truncate { path, len } => write!(f, "truncate {path} to {len}"),
            Op::Chmod { path, mode } => write!(f, "chmod {mode:o} {path}"),
            Op::Rename { from, to } => write!(f, "rename {from} -> {to}"),
            Op::Unlink { path } => write!(f, "unlink {path}"),
            Op::Mkdir { path, mode } => write!(f, "mkdir {path} {mode:o}"),
            Op::Rmdir { path } => write!(f, "rmdir {path}"),
            Op::Symlink { path, target } => write!(f, "symlink {path} -> {target}"),
            Op::Fsync { path } => write!(f, "fsync {path}"),
            Op::SetXattr { path, name, value } => {
                write!(f, "setxattr {name} ({} bytes) on {path}", value.len())
            }
            Op::RemoveXattr { path, name } => write!(f, "removexattr {name} on {path}"),
        }
    }
}

fn file_data<'a>(t: &'a mut Tree, path: &str) -> &'a mut Vec<u8> {
    match t.get_mut(path) {
        Some(Node::File { data, .. }) => data,
        other => panic!("model: {path} is not a file: {other:?}"),
    }
}

fn apply(t: &mut Tree, op: &Op) {
    match op {
        Op::Create { path, mode } => {
            t.insert(
                path.clone(),
                Node::File {
                    mode: *mode,
                    data: Vec::new(),
                    x: Xattrs::new(),
                },
            );
        }
        Op::Append { path, data } => file_data(t, path).extend_from_slice(data),
        Op::Overwrite { path, offset, data } => {
            let d = file_data(t, path);
            let end = *offset as usize + data.len();
            if d.len() < end {
                d.resize(end, 0);
            }
            d[*offset as usize..end].copy_from_slice(data);
        }
        Op::Truncate { path, len } => file_data(t, path).resize(*len as usize, 0),
        Op::Chmod { path, mode } => match t.get_mut(path) {
            Some(Node::File { mode: m, .. } | Node::Dir { mode: m, .. }) => *m = *mode,
            other => panic!("model: chmod of {other:?}"),
        },
        Op::Rename { from, to } => {
            let moved: Vec<String> = t
                .keys()
                .filter(|k| *k == from || is_under(k, from))
                .cloned()
                .collect();
            for k in moved {
                let node = t.remove(&k).unwrap();
                t.insert(format!("{to}{}", &k[from.len()..]), node);
            }
        }
        Op::Unlink { path } | Op::Rmdir { path } => {
            t.remove(path);
        }
        Op::Mkdir { path, mode } => {
            t.insert(
                path.clone(),
                Node::Dir {
                    mode: *mode,
                    x: Xattrs::new(),
                },
            );
        }
        Op::Symlink { path, target } => {
            t.insert(
                path.clone(),
                Node::Symlink {
                    target: target.clone(),
                },
            );
        }
        Op::Fsync { .. } => {}
        Op::SetXattr { path, name, value } => match t.get_mut(path) {
            Some(Node::File { x, .. } | Node::Dir { x, .. }) => {
                x.insert(name.clone(), value.clone());
            }
            other => panic!("model: setxattr on {other:?}"),
        },
        Op::RemoveXattr { path, name } => match t.get_mut(path) {
            Some(Node::File { x, .. } | Node::Dir { x, .. }) => {
                x.remove(name);
            }
            other => panic!("model: removexattr on {other:?}"),
        },
    }
}

/// Reads a directory tree through the mount (every byte of every file).
fn walk(root: &Path) -> io::Result<Tree> {
    fn rec(abs: &Path, rel: &str, out: &mut Tree) -> io::Result<()> {
        for e in fs::read_dir(abs)? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            let path = e.path();
            let rel = join(rel, &name);
            let m = fs::symlink_metadata(&path)?;
            let mode = m.mode() & 0o7777;
            let ft = m.file_type();
            if ft.is_dir() {
                let x = xattrs(&path);
                out.insert(rel.clone(), Node::Dir { mode, x });
                rec(&path, &rel, out)?;
            } else if ft.is_file() {
                let data = fs::read(&path)?;
                if data.len() as u64 != m.len() {
                    return Err(io::Error::other(format!(
                        "{rel}: size {} but {} bytes read",
                        m.len(),
                        data.len()
                    )));
                }
                let x = xattrs(&path);
                out.insert(rel, Node::File { mode, data, x });
            } else if ft.is_symlink() {
                let target = fs::read_link(&path)?.to_string_lossy().into_owned();
                out.insert(rel, Node::Symlink { target });
            } else {
                return Err(io::Error::other(format!("{rel}: unexpected {ft:?}")));
            }
        }
        Ok(())
    }
    let mut out = Tree::new();
    rec(root, "", &mut out)?;
    Ok(out)
}

fn describe_diff(model: &Tree, actual: &Tree) -> String {
    let keys: BTreeSet<&String> = model.keys().chain(actual.keys()).collect();
    let mut lines = Vec::new();
    for k in keys {
        match (model.get(k), actual.get(k)) {
            (Some(a), Some(b)) if a == b => {}
            (a, b) => lines.push(format!("  {k}: expected {a:?}, found {b:?}")),
        }
    }
    let n = lines.len();
    lines.truncate(12);
    if n > 12 {
        lines.push(format!("  ... {} more", n - 12));
    }
    lines.join("\n")
}

/// The state after a crash must be the acknowledged one (`model`), or that
/// state with the one operation in flight applied; for an append in flight,
/// any prefix of its data (the kernel may split a write). Returns the state
/// found, which the next round builds on.
fn settle(model: &Tree, pending: Option<&Op>, actual: &Tree) -> Result<Tree, String> {
    if actual == model {
        return Ok(model.clone());
    }
    if let Some(op) = pending {
        let mut after = model.clone();
        match op {
            Op::Append { path, data } => {
                if let (
                    Some(Node::File {
                        mode,
                        data: before,
                        x,
                    }),
                    Some(Node::File {
                        mode: m2,
                        data: found,
                        x: x2,
                    }),
                ) = (model.get(path), actual.get(path))
                    && mode == m2
                    && x == x2
                    && found.len() >= before.len()
                    && found.starts_with(before)
                    && data.starts_with(&found[before.len()..])
                {
                    after.insert(path.clone(), actual[path].clone());
                }
            }
            op => apply(&mut after, op),
        }
        if after == *actual {
            return Ok(after);
        }
        return Err(format!(
            "neither the acknowledged state nor it plus the operation in flight ({op:?}):\n\
             against the acknowledged state:\n{}\nagainst it plus the operation in flight:\n{}",
            describe_diff(model, actual),
            describe_diff(&after, actual)
        ));
    }
    Err(format!(
        "not the acknowledged state (no operation was in flight):\n{}",
        describe_diff(model, actual)
    ))
}

// --------------------------------------------------------- the sync writer

struct Writer {
    root: PathBuf,
    tree: Tree,
    rng: Rng,
    round: usize,
    counter: u64,
    umask: u32,
    killed: Arc<AtomicBool>,
    pending: Option<Op>,
    acked: u64,
}

enum Stop {
    Crashed,
    Failed(String),
}

impl Writer {
    fn abs(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// Paths whose mode and xattrs can be changed (a symlink's cannot).
    fn non_symlinks(&self) -> Vec<String> {
        self.tree
            .iter()
            .filter(|(_, n)| !matches!(n, Node::Symlink { .. }))
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn fresh(&mut self, prefix: &str) -> String {
        self.counter += 1;
        format!("{prefix}{}-{}", self.round, self.counter)
    }

    /// Records the outcome of one system call: acknowledged (the model
    /// changes), in flight at the crash, or a failure of memfs.
    fn ack(&mut self, op: Op, r: io::Result<()>) -> Result<(), Stop> {
        match r {
            Ok(()) => {
                apply(&mut self.tree, &op);
                self.acked += 1;
                Ok(())
            }
            Err(_) if self.killed.load(Ordering::SeqCst) => {
                self.pending = Some(op);
                Err(Stop::Crashed)
            }
            Err(e) => Err(Stop::Failed(format!(
                "{op:?} failed while the server was running: {e}"
            ))),
        }
    }

    fn files(&self) -> Vec<String> {
        self.tree
            .iter()
            .filter(|(_, n)| matches!(n, Node::File { .. }))
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn dirs(&self) -> Vec<String> {
        std::iter::once(String::new())
            .chain(
                self.tree
                    .iter()
                    .filter(|(_, n)| matches!(n, Node::Dir { .. }))
                    .map(|(k, _)| k.clone()),
            )
            .collect()
    }

    fn run(&mut self) -> Result<(), Stop> {
        let mut after_kill = 0;
        loop {
            self.step()?;
            if self.killed.load(Ordering::SeqCst) {
                after_kill += 1;
                if after_kill > AFTER_KILL_LIMIT {
                    return Err(Stop::Failed(format!(
                        "{AFTER_KILL_LIMIT} steps still succeeded after the server was killed"
                    )));
                }
            }
        }
    }

    fn write_all(&mut self, f: &File, path: &str, data: &[u8]) -> Result<(), Stop> {
        let mut rest = data;
        while !rest.is_empty() {
            match (&*f).write(rest) {
                Ok(0) => return Err(Stop::Failed(format!("write to {path} returned 0"))),
                Ok(n) => {
                    let op = Op::Append {
                        path: path.into(),
                        data: rest[..n].to_vec(),
                    };
                    self.ack(op, Ok(()))?;
                    rest = &rest[n..];
                }
                Err(e) => {
                    let op = Op::Append {
                        path: path.into(),
                        data: rest.to_vec(),
                    };
                    self.ack(op, Err(e))?;
                }
            }
        }
        Ok(())
    }

    fn step(&mut self) -> Result<(), Stop> {
        let files = self.files();
        let dirs = self.dirs();
        let mut roll = self.rng.below(100);
        if files.len() > 150 && roll < 30 && self.rng.chance(60) {
            roll = 50; // keep the population bounded: unlink instead of create
        }
        match roll {
            0..=29 => {
                let dir = self.rng.pick(&dirs).clone();
                let path = join(&dir, &self.fresh("f"));
                let mode = *self.rng.pick(&[0o644, 0o600, 0o640, 0o664]) & !self.umask;
                let len = match self.rng.below(10) {
                    0..=3 => self.rng.below(512),
                    4..=7 => self.rng.below(16 << 10),
                    _ => self.rng.below(100 << 10),
                } as usize;
                let data = content(mix(&[self.rng.next_u64(), len as u64]), len);
                let r = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(mode)
                    .open(self.abs(&path));
                let f = match r {
                    Ok(f) => {
                        self.ack(
                            Op::Create {
                                path: path.clone(),
                                mode,
                            },
                            Ok(()),
                        )?;
                        f
                    }
                    Err(e) => return self.ack(Op::Create { path, mode }, Err(e)),
                };
                let mut written = 0;
                while written < len {
                    let chunk = (1 + self.rng.below(64 << 10) as usize).min(len - written);
                    self.write_all(&f, &path, &data[written..written + chunk])?;
                    written += chunk;
                }
                if self.rng.chance(25) {
                    let r = f.sync_all();
                    self.ack(Op::Fsync { path }, r)?;
                }
            }
            30..=37 if !files.is_empty() => {
                let path = self.rng.pick(&files).clone();
                let Some(Node::File { data, .. }) = self.tree.get(&path) else {
                    unreachable!()
                };
                // Within one page: one FUSE write, all or nothing.
                let offset = self.rng.below(data.len() as u64 + 1);
                let room = 4096 - offset % 4096;
                let n = 1 + self.rng.below(room);
                let data = content(self.rng.next_u64(), n as usize);
                let r = OpenOptions::new()
                    .write(true)
                    .open(self.abs(&path))
                    .and_then(|f| f.write_at(&data, offset));
                match r {
                    Ok(w) => {
                        let data = data[..w].to_vec();
                        self.ack(Op::Overwrite { path, offset, data }, Ok(()))?;
                    }
                    Err(e) => self.ack(Op::Overwrite { path, offset, data }, Err(e))?,
                }
            }
            38..=47 if !files.is_empty() => {
                let from = self.rng.pick(&files).clone();
                let to = if files.len() > 1 && self.rng.chance(40) {
                    self.rng.pick(&files).clone()
                } else {
                    let dir = self.rng.pick(&dirs).clone();
                    join(&dir, &self.fresh("r"))
                };
                if to != from {
                    let r = fs::rename(self.abs(&from), self.abs(&to));
                    self.ack(Op::Rename { from, to }, r)?;
                }
            }
            48..=59 if !files.is_empty() => {
                let path = self.rng.pick(&files).clone();
                let r = fs::remove_file(self.abs(&path));
                self.ack(Op::Unlink { path }, r)?;
            }
            60..=65 => {
                let dir = self.rng.pick(&dirs).clone();
                if dir.matches('/').count() < 3 {
                    let path = join(&dir, &self.fresh("d"));
                    let mode = *self.rng.pick(&[0o755, 0o700, 0o750]) & !self.umask;
                    let r = fs::DirBuilder::new().mode(mode).create(self.abs(&path));
                    self.ack(Op::Mkdir { path, mode }, r)?;
                }
            }
            66..=67 => {
                let empty: Vec<String> = dirs
                    .iter()
                    .filter(|d| !d.is_empty() && !self.tree.keys().any(|k| is_under(k, d)))
                    .cloned()
                    .collect();
                if !empty.is_empty() {
                    let path = self.rng.pick(&empty).clone();
                    let r = fs::remove_dir(self.abs(&path));
                    self.ack(Op::Rmdir { path }, r)?;
                }
            }
            68..=75 if !files.is_empty() => {
                let path = self.rng.pick(&files).clone();
                let Some(Node::File { data, .. }) = self.tree.get(&path) else {
                    unreachable!()
                };
                let len = self.rng.below(data.len() as u64 + 8192);
                let r =
                    nix::unistd::truncate(&self.abs(&path), len as i64).map_err(io::Error::from);
                self.ack(Op::Truncate { path, len }, r)?;
            }
            76..=83 => {
                let targets = self.non_symlinks();
                if !targets.is_empty() {
                    let path = self.rng.pick(&targets).clone();
                    let mode = if matches!(self.tree[&path], Node::Dir { .. }) {
                        *self.rng.pick(&[0o755, 0o700, 0o750, 0o1777])
                    } else {
                        *self.rng.pick(&[0o600, 0o644, 0o755, 0o640, 0o444, 0o4755])
                    };
                    let r = fs::set_permissions(self.abs(&path), fs::Permissions::from_mode(mode));
                    self.ack(Op::Chmod { path, mode }, r)?;
                }
            }
            84..=88 => {
                let dir = self.rng.pick(&dirs).clone();
                let path = join(&dir, &self.fresh("l"));
                let target = if !files.is_empty() && self.rng.chance(50) {
                    format!("/{}", self.rng.pick(&files))
                } else {
                    format!("nowhere/{}", self.rng.next_u64() % 1000)
                };
                let r = std::os::unix::fs::symlink(&target, self.abs(&path));
                self.ack(Op::Symlink { path, target }, r)?;
            }
            89..=93 if dirs.len() > 1 => {
                let from = self.rng.pick(&dirs[1..]).clone();
                let parents: Vec<String> = dirs
                    .iter()
                    .filter(|d| **d != from && !is_under(d, &from) && d.matches('/').count() < 3)
                    .cloned()
                    .collect();
                if !parents.is_empty() {
                    let parent = self.rng.pick(&parents).clone();
                    let to = join(&parent, &self.fresh("m"));
                    let r = fs::rename(self.abs(&from), self.abs(&to));
                    self.ack(Op::Rename { from, to }, r)?;
                }
            }
            94..=97 => {
                let targets = self.non_symlinks();
                if !targets.is_empty() {
                    let path = self.rng.pick(&targets).clone();
                    let (Node::File { x, .. } | Node::Dir { x, .. }) = &self.tree[&path] else {
                        unreachable!()
                    };
                    let names: Vec<String> = x.keys().cloned().collect();
                    if !names.is_empty() && self.rng.chance(35) {
                        let name = self.rng.pick(&names).clone();
                        let r = try_remove_xattr(&self.abs(&path), &name);
                        self.ack(Op::RemoveXattr { path, name }, r)?;
                    } else {
                        let name = format!("user.{}", self.rng.pick(&["a", "b", "c", "long.name"]));
                        let len = self.rng.below(300) as usize;
                        let value = content(self.rng.next_u64(), len);
                        let r = try_set_xattr(&self.abs(&path), &name, &value);
                        self.ack(Op::SetXattr { path, name, value }, r)?;
                    }
                }
            }
            98..=99 => {
                let path = self.rng.pick(&dirs).clone();
                let r = File::open(self.abs(&path)).and_then(|f| f.sync_all());
                self.ack(Op::Fsync { path }, r)?;
            }
            _ => {}
        }
        Ok(())
    }
}

const WRITERS: usize = 3;

/// A writer that keeps succeeding this long after the kill is not writing to
/// the dead mount any more: stop it rather than fill the disk underneath.
const AFTER_KILL_LIMIT: u64 = 10_000;

/// Short, so that most rounds write checkpoints and some die in the middle
/// of one (a checkpoint starts this long after the mount, or after the last).
const CHECKPOINT_INTERVAL: &str = "300ms";

#[test]
fn sync_mode_keeps_every_acknowledged_operation_across_sigkill() {
    let rounds = rounds();
    let seed = base_seed();
    eprintln!("sync crash test: {rounds} rounds, MEMFS_CRASH_SEED={seed}");
    let umask = umask();
    let data = disk_dir("memfs-crash-sync-");
    let dir = data.path();
    let mut log = ServerLog::new("crash-sync");
    let args = data_dir_args(
        dir,
        &[
            "--durability",
            "sync",
            "--checkpoint-interval",
            CHECKPOINT_INTERVAL,
            "--retention",
            "commits=2000",
        ],
    );
    let mut rng = seeded(seed);
    let mut m = log.mount(&args);
    for t in 0..WRITERS {
        fs::create_dir(m.p(&format!("w{t}"))).unwrap();
    }
    let mut models: Vec<Tree> = vec![Tree::new(); WRITERS];
    let (mut total_ops, mut in_flight) = (0u64, 0usize);
    for round in 0..rounds {
        let killed = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..WRITERS)
            .map(|t| {
                let mut w = Writer {
                    root: m.p(&format!("w{t}")),
                    tree: std::mem::take(&mut models[t]),
                    rng: seeded(mix(&[seed, round as u64, t as u64])),
                    round,
                    counter: 0,
                    umask,
                    killed: killed.clone(),
                    pending: None,
                    acked: 0,
                };
                std::thread::spawn(move || {
                    let stop = w.run();
                    (w, stop)
                })
            })
            .collect();
        // A random kill moment; the verdict below does not depend on it.
        let delay = Duration::from_millis(rng.below(1200));
        std::thread::sleep(delay);
        log.note(&format!("round {round}: SIGKILL after {delay:?}"));
        killed.store(true, Ordering::SeqCst);
        // The dead mount stays attached until the writers have stopped: after
        // a detach their paths would lead into the directory underneath.
        m.kill_server();
        let mut results = Vec::new();
        for (t, h) in writers.into_iter().enumerate() {
            let (w, stop) = h.join().expect("writer thread panicked");
            if let Err(Stop::Failed(e)) = stop {
                panic!("round {round} (MEMFS_CRASH_SEED={seed}) writer {t}: {e}");
            }
            results.push(w);
        }
        m.detach();
        assert_fsck_clean(dir, &format!("round {round} (MEMFS_CRASH_SEED={seed})"));
        m = log.mount(&args);
        let root = walk(&m.path()).unwrap_or_else(|e| {
            panic!("round {round} (MEMFS_CRASH_SEED={seed}): walking the remounted tree: {e}")
        });
        let top: Vec<&String> = root.keys().filter(|k| !k.contains('/')).collect();
        let want: Vec<String> = (0..WRITERS).map(|t| format!("w{t}")).collect();
        assert_eq!(
            top,
            want.iter().collect::<Vec<_>>(),
            "round {round}: top level"
        );
        for (t, w) in results.into_iter().enumerate() {
            let prefix = format!("w{t}/");
            let actual: Tree = root
                .iter()
                .filter_map(|(k, v)| Some((k.strip_prefix(&prefix)?.to_string(), v.clone())))
                .collect();
            models[t] = settle(&w.tree, w.pending.as_ref(), &actual).unwrap_or_else(|e| {
                panic!(
                    "round {round} (MEMFS_CRASH_SEED={seed}, killed after {delay:?}) writer {t} \
                     after {} acknowledged operations: {e}",
                    w.acked
                )
            });
            total_ops += w.acked;
            in_flight += usize::from(w.pending.is_some());
        }
    }
    eprintln!(
        "sync crash test: {total_ops} acknowledged operations, {in_flight} in flight at the kills"
    );
    assert!(total_ops > 0, "the writers never got an operation through");
    // A clean unmount (final checkpoint) keeps the same state.
    m.unmount();
    assert_fsck_clean(dir, "after the clean unmount");
    let m = log.mount(&args);
    let root = walk(&m.path()).unwrap();
    for (t, model) in models.iter().enumerate() {
        let prefix = format!("w{t}/");
        let actual: Tree = root
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix(&prefix)?.to_string(), v.clone())))
            .collect();
        assert!(
            actual == *model,
            "after a clean unmount and remount, writer {t}:\n{}",
            describe_diff(model, &actual)
        );
    }
    m.unmount();
}

// -------------------------------------------------------- the async writer

fn seq_content(round: usize, i: u64) -> Vec<u8> {
    let len = 1 + mix(&[round as u64, i, 7]) % 6000;
    content(mix(&[round as u64, i]), len as usize)
}

struct SeqResult {
    /// Files created, written and closed without an error.
    done: u64,
    /// The last file after whose fsync (of the file or of its directory)
    /// everything up to it must be durable.
    synced: Option<u64>,
}

fn seq_writer(
    dir: PathBuf,
    seed: u64,
    round: usize,
    killed: Arc<AtomicBool>,
) -> Result<SeqResult, String> {
    let mut rng = seeded(mix(&[seed, round as u64, 99]));
    let mut res = SeqResult {
        done: 0,
        synced: None,
    };
    let fail = |what: String, e: io::Error, killed: &AtomicBool| {
        if killed.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(format!("{what} failed while the server was running: {e}"))
        }
    };
    if let Err(e) = fs::create_dir(&dir) {
        fail(format!("mkdir {}", dir.display()), e, &killed)?;
        return Ok(res);
    }
    let mut after_kill = 0;
    for i in 0.. {
        let path = dir.join(i.to_string());
        let r = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .and_then(|mut f| {
                f.write_all(&seq_content(round, i))?;
                match rng.below(60) {
                    0 => f.sync_all().map(|()| Some(i)),
                    1 => File::open(&dir)
                        .and_then(|d| d.sync_all())
                        .map(|()| Some(i)),
                    _ => Ok(None),
                }
            });
        match r {
            Ok(s) => {
                res.done = i + 1;
                if s.is_some() {
                    res.synced = s;
                }
                if killed.load(Ordering::SeqCst) {
                    after_kill += 1;
                    if after_kill > AFTER_KILL_LIMIT {
                        return Err(format!(
                            "{AFTER_KILL_LIMIT} files still written after the server was killed"
                        ));
                    }
                }
            }
            Err(e) => {
                fail(format!("file {}", path.display()), e, &killed)?;
                return Ok(res);
            }
        }
    }
    unreachable!()
}

/// Checks that `seq{round}` holds files 0..k for some k, complete except the
/// last (a prefix of its content), and that the last fsynced one is there.
fn check_prefix(dir: &Path, round: usize, synced: Option<u64>) -> Result<u64, String> {
    if !dir.exists() {
        return match synced {
            None => Ok(0),
            Some(s) => Err(format!(
                "{} is missing but file {s} was fsynced",
                dir.display()
            )),
        };
    }
    let mut names = Vec::new();
    for e in fs::read_dir(dir).map_err(|e| e.to_string())? {
        let name = e.map_err(|e| e.to_string())?.file_name();
        let name = name.to_string_lossy().into_owned();
        names.push(
            name.parse::<u64>()
                .map_err(|_| format!("unexpected entry {name:?}"))?,
        );
    }
    names.sort_unstable();
    let k = names.len() as u64;
    if let Some((pos, n)) = names.iter().enumerate().find(|(p, n)| **n != *p as u64) {
        return Err(format!(
            "not a prefix: {k} files but file {pos} is missing (found {n} in its place)"
        ));
    }
    for i in 0..k {
        let got = fs::read(dir.join(i.to_string())).map_err(|e| format!("file {i}: {e}"))?;
        let want = seq_content(round, i);
        let complete = i + 1 < k || synced == Some(i);
        if complete && got != want {
            return Err(format!(
                "file {i} of {k}: {} bytes, not its content ({} bytes){}",
                got.len(),
                want.len(),
                if synced == Some(i) {
                    " although it was fsynced"
                } else {
                    " although later files exist"
                }
            ));
        }
        if !want.starts_with(&got) {
            return Err(format!(
                "file {i} (the last of {k}): {} bytes that are not a prefix of its content",
                got.len()
            ));
        }
    }
    if let Some(s) = synced
        && s >= k
    {
        return Err(format!(
            "file {s} was fsynced but only files 0..{k} survived"
        ));
    }
    Ok(k)
}

#[test]
fn async_mode_keeps_a_prefix_of_the_commits_across_sigkill() {
    prefix_rounds("async", "crash-async", rounds());
}

/// The same with fsyncs every N commits: still a prefix, and fsync still waits.
#[test]
fn relaxed_mode_keeps_a_prefix_of_the_commits_across_sigkill() {
    prefix_rounds("relaxed=50", "crash-relaxed", (rounds() / 2).max(4));
}

fn prefix_rounds(mode: &str, name: &str, rounds: usize) {
    let seed = base_seed();
    eprintln!("{mode} crash test: {rounds} rounds, MEMFS_CRASH_SEED={seed}");
    let data = disk_dir(&format!("memfs-{name}-"));
    let dir = data.path();
    let mut log = ServerLog::new(name);
    let args = data_dir_args(
        dir,
        &[
            "--durability",
            mode,
            "--checkpoint-interval",
            CHECKPOINT_INTERVAL,
        ],
    );
    let mut rng = seeded(seed);
    let mut m = log.mount(&args);
    // The directories of earlier rounds as verified after their crash, by round.
    let mut kept: BTreeMap<usize, Tree> = BTreeMap::new();
    let (mut survived, mut done_total) = (0u64, 0u64);
    for round in 0..rounds {
        // Only the newest earlier directory stays; the removal of the others
        // is fsynced, so the crash below must not bring them back.
        while kept.len() > 1 {
            let (old, _) = kept.pop_first().unwrap();
            fs::remove_dir_all(m.p(&format!("seq{old}"))).unwrap();
        }
        File::open(m.path()).unwrap().sync_all().unwrap();
        let killed = Arc::new(AtomicBool::new(false));
        let writer = {
            let dir = m.p(&format!("seq{round}"));
            let killed = killed.clone();
            std::thread::spawn(move || seq_writer(dir, seed, round, killed))
        };
        let delay = Duration::from_millis(rng.below(800));
        std::thread::sleep(delay);
        log.note(&format!("round {round}: SIGKILL after {delay:?}"));
        killed.store(true, Ordering::SeqCst);
        // Detached only once the writer has stopped (see the sync test).
        m.kill_server();
        let res = writer
            .join()
            .expect("writer thread panicked")
            .unwrap_or_else(|e| panic!("round {round} (MEMFS_CRASH_SEED={seed}): {e}"));
        m.detach();
        assert_fsck_clean(dir, &format!("round {round}"));
        m = log.mount(&args);
        let ctx = format!(
            "round {round} (killed after {delay:?}; {} files written, last fsynced {:?})",
            res.done, res.synced
        );
        let name = format!("seq{round}");
        let k =
            check_prefix(&m.p(&name), round, res.synced).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let mut top: Vec<String> = fs::read_dir(m.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        top.sort();
        let mut want: Vec<String> = kept.keys().map(|r| format!("seq{r}")).collect();
        if m.p(&name).exists() {
            want.push(name.clone());
        }
        want.sort();
        assert_eq!(top, want, "{ctx}: top level");
        for (r, tree) in &kept {
            let now = walk(&m.p(&format!("seq{r}"))).unwrap();
            assert!(
                now == *tree,
                "{ctx}: seq{r}, verified after an earlier crash, changed:\n{}",
                describe_diff(tree, &now)
            );
        }
        if m.p(&name).exists() {
            kept.insert(round, walk(&m.p(&name)).unwrap());
        }
        survived += k;
        done_total += res.done;
    }
    eprintln!("{mode} crash test: {done_total} files written, {survived} survived the kills");
    assert!(done_total > 0, "the writer never got a file through");
    m.unmount();
    assert_fsck_clean(dir, "after the clean unmount");
}

// ------------------------------------------------- snapshot and rollback

/// What a walk compares: everything but atime (and inode numbers, which are
/// compared through the hard link groups).
#[derive(Debug, PartialEq, Eq)]
struct Attrs {
    /// st_mode: type and permission bits.
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    nlink: u64,
    rdev: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    /// fnv of a regular file's content, or a symlink's target.
    what: String,
    /// Where a regular file has data (SEEK_DATA/SEEK_HOLE), if supported.
    data: Option<Vec<(u64, u64)>>,
    xattrs: BTreeMap<String, Vec<u8>>,
}

#[derive(Debug, PartialEq, Eq)]
struct Capture {
    entries: BTreeMap<String, Attrs>,
    /// Paths that share an inode (groups of two or more).
    links: BTreeSet<Vec<String>>,
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn try_set_xattr(p: &Path, name: &str, value: &[u8]) -> io::Result<()> {
    let n = CString::new(name).unwrap();
    // SAFETY: both strings are NUL-terminated CStrings (`cpath`'s temporary
    // lives until the call returns) and the value pointer and length come
    // from one live slice; the kernel only reads them.
    let r = unsafe {
        libc::lsetxattr(
            cpath(p).as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn try_remove_xattr(p: &Path, name: &str) -> io::Result<()> {
    let n = CString::new(name).unwrap();
    // SAFETY: both are NUL-terminated CStrings alive for the call (`cpath`'s
    // temporary until it returns); the kernel only reads them.
    let r = unsafe { libc::lremovexattr(cpath(p).as_ptr(), n.as_ptr()) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn set_xattr(p: &Path, name: &str, value: &[u8]) {
    let n = CString::new(name).unwrap();
    // SAFETY: as in `try_set_xattr`: NUL-terminated names alive for the
    // call, the value's pointer and length from one live slice.
    let r = unsafe {
        libc::lsetxattr(
            cpath(p).as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "setxattr {name} on {}: {}",
        p.display(),
        io::Error::last_os_error()
    );
}

fn remove_xattr(p: &Path, name: &str) {
    let n = CString::new(name).unwrap();
    // SAFETY: as in `try_remove_xattr`.
    let r = unsafe { libc::lremovexattr(cpath(p).as_ptr(), n.as_ptr()) };
    assert_eq!(
        r,
        0,
        "removexattr {name} on {}: {}",
        p.display(),
        io::Error::last_os_error()
    );
}

fn xattrs(p: &Path) -> BTreeMap<String, Vec<u8>> {
    let c = cpath(p);
    let mut out = BTreeMap::new();
    // SAFETY: `c` is a NUL-terminated path alive for the call; a null
    // buffer of size 0 only asks for the size, nothing is written.
    let n = unsafe { libc::llistxattr(c.as_ptr(), std::ptr::null_mut(), 0) };
    assert!(
        n >= 0,
        "listxattr {}: {}",
        p.display(),
        io::Error::last_os_error()
    );
    let mut names = vec![0u8; n as usize];
    // SAFETY: the kernel writes at most `names.len()` bytes into `names`,
    // which is that long and ours for the call.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    assert!(n >= 0, "listxattr {}", p.display());
    for name in names[..n as usize]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
    {
        let cn = CString::new(name).unwrap();
        // SAFETY: NUL-terminated path and name alive for the call; a null
        // buffer of size 0 only asks for the size.
        let len = unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), std::ptr::null_mut(), 0) };
        assert!(len >= 0, "getxattr {}", p.display());
        let mut v = vec![0u8; len as usize];
        // SAFETY: the kernel writes at most `v.len()` bytes into `v`, which
        // is that long and ours for the call.
        let len =
            unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        assert!(len >= 0, "getxattr {}", p.display());
        v.truncate(len as usize);
        out.insert(String::from_utf8_lossy(name).into_owned(), v);
    }
    out
}

fn data_segments(p: &Path, size: u64) -> Option<Vec<(u64, u64)>> {
    let f = File::open(p).unwrap();
    let fd = f.as_raw_fd();
    let mut v = Vec::new();
    let mut off = 0i64;
    while (off as u64) < size {
        // SAFETY: `fd` belongs to `f`, open for the whole loop; lseek
        // touches no memory of ours.
        let d = unsafe { libc::lseek(fd, off, libc::SEEK_DATA) };
        if d < 0 {
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::ENXIO) => break,
                _ => return None,
            }
        }
        // SAFETY: as above.
        let h = unsafe { libc::lseek(fd, d, libc::SEEK_HOLE) };
        if h < 0 {
            return None;
        }
        v.push((d as u64, h as u64));
        off = h;
    }
    Some(v)
}

fn capture(root: &Path) -> Capture {
    fn rec(abs: &Path, rel: &str, c: &mut Capture, inodes: &mut BTreeMap<u64, Vec<String>>) {
        let mut names: Vec<_> = fs::read_dir(abs)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for name in names {
            let path = abs.join(&name);
            let rel = join(rel, &name.to_string_lossy());
            let m = fs::symlink_metadata(&path).unwrap();
            let ft = m.file_type();
            let (what, data) = if ft.is_file() {
                let bytes = fs::read(&path).unwrap();
                assert_eq!(bytes.len() as u64, m.len(), "{rel}: size and content");
                (
                    format!("fnv {:016x}", fnv(&bytes)),
                    data_segments(&path, m.len()),
                )
            } else if ft.is_symlink() {
                (
                    format!("-> {}", fs::read_link(&path).unwrap().display()),
                    None,
                )
            } else {
                (String::new(), None)
            };
            if !ft.is_dir() {
                inodes.entry(m.ino()).or_default().push(rel.clone());
            }
            c.entries.insert(
                rel.clone(),
                Attrs {
                    mode: m.mode(),
                    uid: m.uid(),
                    gid: m.gid(),
                    size: if ft.is_dir() { 0 } else { m.len() },
                    nlink: m.nlink(),
                    rdev: m.rdev(),
                    mtime: (m.mtime(), m.mtime_nsec()),
                    ctime: (m.ctime(), m.ctime_nsec()),
                    what,
                    data,
                    xattrs: xattrs(&path),
                },
            );
            if ft.is_dir() {
                rec(&path, &rel, c, inodes);
            }
        }
    }
    let mut c = Capture {
        entries: BTreeMap::new(),
        links: BTreeSet::new(),
    };
    let mut inodes = BTreeMap::new();
    rec(root, "", &mut c, &mut inodes);
    c.links = inodes.into_values().filter(|v| v.len() > 1).collect();
    c
}

fn capture_diff(a: &Capture, b: &Capture) -> String {
    let mut lines = Vec::new();
    let keys: BTreeSet<&String> = a.entries.keys().chain(b.entries.keys()).collect();
    for k in keys {
        match (a.entries.get(k), b.entries.get(k)) {
            (Some(x), Some(y)) if x == y => {}
            (x, y) => lines.push(format!("  {k}:\n    expected {x:?}\n    found    {y:?}")),
        }
    }
    if a.links != b.links {
        lines.push(format!(
            "  hard link groups: expected {:?}, found {:?}",
            a.links, b.links
        ));
    }
    lines.join("\n")
}

fn set_mtime(p: &Path, sec: i64, nsec: i64) {
    use nix::sys::stat::{UtimensatFlags, utimensat};
    use nix::sys::time::TimeSpec;
    let t = TimeSpec::new(sec, nsec);
    utimensat(
        nix::fcntl::AT_FDCWD,
        p,
        &t,
        &t,
        UtimensatFlags::NoFollowSymlink,
    )
    .unwrap();
}

/// Every node type: directories (one sticky, one empty), empty, small, large,
/// setuid and chowned files, a sparse file and an all-hole file, relative,
/// dangling and absolute symlinks, hard link groups, a fifo, a socket, a
/// character and a block device; xattrs (binary, empty) and explicit times.
fn build_every_node_type(p: &Path) {
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};
    use std::os::unix::fs::{chown, symlink};
    for d in ["a", "a/b", "a/b/c", "empty"] {
        fs::create_dir(p.join(d)).unwrap();
    }
    fs::set_permissions(p.join("empty"), fs::Permissions::from_mode(0o1777)).unwrap();
    fs::set_permissions(p.join("a/b/c"), fs::Permissions::from_mode(0o750)).unwrap();
    fs::write(p.join("a/f1"), content(1, 10_000)).unwrap();
    fs::write(p.join("a/b/empty-file"), b"").unwrap();
    fs::write(p.join("top.txt"), b"hello\n").unwrap();
    fs::write(p.join("a/b/c/big"), content(2, 300_000)).unwrap();
    fs::write(p.join("suid"), b"#!/bin/sh\n").unwrap();
    fs::set_permissions(p.join("suid"), fs::Permissions::from_mode(0o4755)).unwrap();
    fs::write(p.join("owned"), b"x").unwrap();
    chown(p.join("owned"), Some(1000), Some(1000)).unwrap();
    let f = File::create(p.join("sparse")).unwrap();
    f.write_all_at(b"head", 0).unwrap();
    f.write_all_at(b"tail", (8 << 20) + 100).unwrap();
    drop(f);
    File::create(p.join("all-hole"))
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    symlink("a/f1", p.join("l-rel")).unwrap();
    symlink("nowhere/x", p.join("a/l-dangling")).unwrap();
    symlink("/etc/passwd", p.join("l-abs")).unwrap();
    fs::hard_link(p.join("a/f1"), p.join("a/b/f1-link")).unwrap();
    fs::hard_link(p.join("a/f1"), p.join("h3")).unwrap();
    fs::hard_link(p.join("sparse"), p.join("a/sparse-link")).unwrap();
    nix::unistd::mkfifo(&p.join("fifo"), Mode::from_bits_truncate(0o640)).unwrap();
    mknod(
        &p.join("sock"),
        SFlag::S_IFSOCK,
        Mode::from_bits_truncate(0o600),
        0,
    )
    .unwrap();
    mknod(
        &p.join("null"),
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o666),
        makedev(1, 3),
    )
    .unwrap();
    mknod(
        &p.join("a/blk"),
        SFlag::S_IFBLK,
        Mode::from_bits_truncate(0o660),
        makedev(7, 0),
    )
    .unwrap();
    set_xattr(&p.join("a/f1"), "user.k1", b"v1");
    set_xattr(&p.join("a/f1"), "user.bin", &[0, 1, 2, 255, 0]);
    set_xattr(&p.join("a/f1"), "user.empty", b"");
    set_xattr(&p.join("a"), "user.dir", b"d");
    set_xattr(&p.join("sparse"), "user.big", &content(3, 2000));
    set_mtime(&p.join("top.txt"), 1_000_000_000, 123_456_789);
    set_mtime(&p.join("l-rel"), 1_100_000_000, 5);
    set_mtime(&p.join("a/b"), 1_200_000_000, 0);
}

/// Changes every kind of thing the tree above has.
fn change_everything(p: &Path) {
    use std::os::unix::fs::{chown, symlink};
    fs::write(p.join("a/f1"), content(9, 5000)).unwrap();
    remove_xattr(&p.join("a/f1"), "user.k1");
    set_xattr(&p.join("a/f1"), "user.bin", b"changed");
    set_xattr(&p.join("a"), "user.new", b"n");
    fs::remove_file(p.join("h3")).unwrap();
    fs::rename(p.join("a/b"), p.join("a/b2")).unwrap();
    fs::remove_file(p.join("top.txt")).unwrap();
    fs::write(p.join("new-file"), b"new").unwrap();
    fs::set_permissions(p.join("empty"), fs::Permissions::from_mode(0o755)).unwrap();
    OpenOptions::new()
        .write(true)
        .open(p.join("sparse"))
        .unwrap()
        .set_len(10)
        .unwrap();
    File::options()
        .write(true)
        .open(p.join("all-hole"))
        .unwrap()
        .write_all_at(b"data", 4096)
        .unwrap();
    fs::remove_file(p.join("l-rel")).unwrap();
    symlink("elsewhere", p.join("l-rel")).unwrap();
    fs::remove_file(p.join("fifo")).unwrap();
    fs::write(p.join("fifo"), b"now a regular file").unwrap();
    fs::create_dir_all(p.join("n/m")).unwrap();
    fs::write(p.join("n/m/x"), content(4, 7000)).unwrap();
    fs::remove_dir_all(p.join("a/b2/c")).unwrap();
    chown(p.join("owned"), Some(0), Some(0)).unwrap();
    fs::remove_file(p.join("null")).unwrap();
    fs::remove_file(p.join("sock")).unwrap();
    set_mtime(&p.join("suid"), 1_300_000_000, 1);
}

#[test]
fn snapshot_and_rollback_restore_every_node_type() {
    let data = disk_dir("memfs-crash-snap-");
    let d = data.path();
    let log = ServerLog::new("crash-snapshot");
    let args = data_dir_args(d, &["--durability", "sync"]);
    let m = log.mount(&args);
    build_every_node_type(&m.path());
    let before = capture(&m.path());
    eprintln!(
        "sparse file: size {}, data at {:?}",
        before.entries["sparse"].size, before.entries["sparse"].data
    );
    let o = memfs([
        OsStr::new("snapshot"),
        "create".as_ref(),
        "before".as_ref(),
        "--data-dir".as_ref(),
        d.as_os_str(),
    ]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "snapshot create:\n{}", text(&o));
    let commit: u64 = out
        .trim()
        .strip_prefix("snapshot before created at commit ")
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("snapshot create said {out:?}"));
    let o = memfs([
        OsStr::new("snapshot"),
        "list".as_ref(),
        "--data-dir".as_ref(),
        d.as_os_str(),
    ]);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("before"),
        "snapshot list while mounted:\n{}",
        text(&o)
    );
    change_everything(&m.path());
    let changed = capture(&m.path());
    assert_ne!(before, changed, "the changes changed nothing");
    m.unmount();
    let o = memfs([
        OsStr::new("rollback"),
        "--data-dir".as_ref(),
        d.as_os_str(),
        "--to".as_ref(),
        "before".as_ref(),
        "--yes".as_ref(),
    ]);
    assert!(
        o.status.success()
            && String::from_utf8_lossy(&o.stdout)
                .contains(&format!("rolled back to commit {commit}")),
        "rollback:\n{}",
        text(&o)
    );
    assert_fsck_clean(d, "after the rollback");
    let m = log.mount(&args);
    let after = capture(&m.path());
    assert!(
        before == after,
        "after rollback to the snapshot, the tree differs from the one captured then:\n{}",
        capture_diff(&before, &after)
    );
    // The restored tree is a live one: change it, and it persists.
    fs::write(m.p("after-rollback"), b"ok").unwrap();
    m.unmount();
    let m = log.mount(&args);
    assert_eq!(fs::read(m.p("after-rollback")).unwrap(), b"ok");
    fs::remove_file(m.p("after-rollback")).unwrap();
    let again = capture(&m.path());
    assert_eq!(
        before.links, again.links,
        "hard link groups after a remount"
    );
    // Again, by commit id this time, after a crash instead of an unmount:
    // the snapshot is still there and the same state comes back.
    let mut m = m;
    change_everything(&m.path());
    m.kill();
    let o = memfs([
        OsStr::new("rollback"),
        "--data-dir".as_ref(),
        d.as_os_str(),
        "--to".as_ref(),
        commit.to_string().as_ref(),
        "--yes".as_ref(),
    ]);
    assert!(
        o.status.success(),
        "rollback to commit {commit} after a crash:\n{}",
        text(&o)
    );
    let m = log.mount(&args);
    let after = capture(&m.path());
    assert!(
        before == after,
        "after a crash and a rollback to commit {commit}:\n{}",
        capture_diff(&before, &after)
    );
    let o = memfs([
        OsStr::new("snapshot"),
        "list".as_ref(),
        "--data-dir".as_ref(),
        d.as_os_str(),
    ]);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("before"),
        "snapshot list after the rollbacks:\n{}",
        text(&o)
    );
    m.unmount();
    assert_fsck_clean(d, "at the end");
}

/// Kills a child process and reaps it in every path.
struct ChildGuard(Option<std::process::Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn rollback_killed_at_a_random_moment_is_all_or_nothing() {
    let seed = base_seed();
    let rounds = (rounds() / 2).max(4);
    eprintln!("rollback kill test: {rounds} rounds, MEMFS_CRASH_SEED={seed}");
    let mut rng = seeded(seed);
    let data = disk_dir("memfs-crash-rbkill-");
    let d = data.path();
    let mut log = ServerLog::new("crash-rollback-kill");
    let args = data_dir_args(d, &["--durability", "sync", "--checkpoint-interval", "0"]);
    let m = log.mount(&args);
    build_every_node_type(&m.path());
    for i in 0..300 {
        fs::write(m.p(&format!("bulk-{i}")), seq_content(1, i)).unwrap();
    }
    let target = capture(&m.path());
    let o = memfs([
        OsStr::new("snapshot"),
        "create".as_ref(),
        "t".as_ref(),
        "--data-dir".as_ref(),
        d.as_os_str(),
    ]);
    assert!(o.status.success(), "snapshot create:\n{}", text(&o));
    let mut m = Some(m);
    let (mut completed, mut interrupted, mut untouched) = (0, 0, 0);
    for round in 0..rounds {
        let mm = m.take().unwrap();
        // Move away from the snapshot: changes, then a crash or an unmount
        // (a checkpoint after the snapshot, which the rollback must drop).
        change_everything(&mm.path());
        for i in 0..300 {
            fs::write(mm.p(&format!("bulk-{i}")), seq_content(2 + round, i)).unwrap();
        }
        let moved = capture(&mm.path());
        if rng.chance(50) {
            let mut mm = mm;
            mm.kill();
        } else {
            mm.unmount();
        }
        let delay = Duration::from_micros(rng.below(40_000));
        let mut child = ChildGuard(Some(
            Command::new(memfs_bin())
                .args(["rollback", "--to", "t", "--yes", "--data-dir"])
                .arg(d)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        ));
        std::thread::sleep(delay);
        let mut c = child.0.take().unwrap();
        let _ = c.kill();
        let status = c.wait().unwrap();
        log.note(&format!(
            "round {round}: rollback killed after {delay:?}: {status}"
        ));
        let mm = log.mount(&args);
        let now = capture(&mm.path());
        let ctx = format!(
            "round {round} (MEMFS_CRASH_SEED={seed}, rollback killed after {delay:?}, {status})"
        );
        if status.success() {
            completed += 1;
            assert!(
                now == target,
                "{ctx}: the rollback finished but the tree is not the snapshot's:\n{}",
                capture_diff(&target, &now)
            );
        } else if now == target {
            interrupted += 1;
        } else {
            untouched += 1;
            assert!(
                now == moved,
                "{ctx}: neither the snapshot's tree nor the one before the rollback:\n\
                 against the snapshot:\n{}\nagainst the state before:\n{}",
                capture_diff(&target, &now),
                capture_diff(&moved, &now)
            );
        }
        let o = memfs([
            OsStr::new("snapshot"),
            "list".as_ref(),
            "--data-dir".as_ref(),
            d.as_os_str(),
        ]);
        assert!(
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.starts_with("t ")),
            "{ctx}: the snapshot is gone:\n{}",
            text(&o)
        );
        if now == target {
            m = Some(mm);
        } else {
            // Finish the rollback, so the next round starts from the snapshot.
            mm.unmount();
            let o = memfs([
                OsStr::new("rollback"),
                "--to".as_ref(),
                "t".as_ref(),
                "--yes".as_ref(),
                "--data-dir".as_ref(),
                d.as_os_str(),
            ]);
            assert!(o.status.success(), "{ctx}: rollback:\n{}", text(&o));
            let mm = log.mount(&args);
            let now = capture(&mm.path());
            assert!(
                now == target,
                "{ctx}: after a complete rollback:\n{}",
                capture_diff(&target, &now)
            );
            m = Some(mm);
        }
    }
    eprintln!(
        "rollback kill test: {completed} completed, {interrupted} killed but done at the next mount, {untouched} killed before"
    );
    m.take().unwrap().unmount();
    assert_fsck_clean(d, "at the end");
}

// ------------------------------------------------------------ bad input

fn run(args: &[&OsStr]) -> Output {
    memfs(args.iter().copied())
}

/// The frames of a journal segment: (offset, payload length).
fn frames(seg: &[u8]) -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    let mut pos = 32; // the segment header
    while pos + 20 <= seg.len() && &seg[pos..pos + 4] == b"CMT1" {
        let len = u32::from_le_bytes(seg[pos + 4..pos + 8].try_into().unwrap()) as usize;
        if pos + 20 + len > seg.len() {
            break;
        }
        v.push((pos, len));
        pos += 20 + len;
    }
    v
}

#[test]
fn bad_input_is_refused_with_clear_messages() {
    let data = disk_dir("memfs-crash-bad-");
    let d = data.path();
    let dd = d.as_os_str();
    let log = ServerLog::new("crash-bad-input");
    let args = data_dir_args(d, &["--durability", "sync"]);
    let m = log.mount(&args);
    fs::write(m.p("keep"), b"kept").unwrap();

    // A second mount of a mounted data directory.
    let spare = SpareMountPoint::new();
    let o = run(&[
        "mount".as_ref(),
        spare.path().as_os_str(),
        "--data-dir".as_ref(),
        dd,
    ]);
    assert!(
        !o.status.success()
            && String::from_utf8_lossy(&o.stderr).contains("in use by another process"),
        "a second mount of a mounted data directory:\n{}",
        text(&o)
    );
    assert!(!is_mount_point(spare.path()), "the second mount mounted");

    // Rollback and fsck while mounted.
    let o = run(&[
        "rollback".as_ref(),
        "--data-dir".as_ref(),
        dd,
        "--to".as_ref(),
        "1".as_ref(),
        "--yes".as_ref(),
    ]);
    assert!(
        !o.status.success()
            && String::from_utf8_lossy(&o.stderr).contains("in use by a running memfs"),
        "rollback while mounted:\n{}",
        text(&o)
    );
    let o = run(&["fsck".as_ref(), "--data-dir".as_ref(), dd]);
    assert!(
        !o.status.success()
            && String::from_utf8_lossy(&o.stderr).contains("in use by a running memfs"),
        "fsck while mounted:\n{}",
        text(&o)
    );
    assert_eq!(fs::read(m.p("keep")).unwrap(), b"kept");
    let o = run(&[
        "snapshot".as_ref(),
        "create".as_ref(),
        "s1".as_ref(),
        "--data-dir".as_ref(),
        dd,
    ]);
    assert!(o.status.success(), "snapshot create:\n{}", text(&o));
    m.unmount();

    // Rollback to targets that do not exist.
    let o = run(&[
        "rollback".as_ref(),
        "--data-dir".as_ref(),
        dd,
        "--to".as_ref(),
        "nosuch".as_ref(),
        "--yes".as_ref(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && err.contains("nosuch")
            && err.contains("neither a commit id nor a snapshot name"),
        "rollback to a snapshot that does not exist:\n{}",
        text(&o)
    );
    let o = run(&[
        "rollback".as_ref(),
        "--data-dir".as_ref(),
        dd,
        "--to".as_ref(),
        "999999999".as_ref(),
        "--yes".as_ref(),
    ]);
    assert!(
        !o.status.success()
            && String::from_utf8_lossy(&o.stderr).contains("commit 999999999 does not exist"),
        "rollback to a commit that does not exist:\n{}",
        text(&o)
    );
    let missing = d.join("no-such-dir");
    let o = run(&[
        "rollback".as_ref(),
        "--data-dir".as_ref(),
        missing.as_os_str(),
        "--to".as_ref(),
        "1".as_ref(),
        "--yes".as_ref(),
    ]);
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("does not exist"),
        "rollback of a missing data directory:\n{}",
        text(&o)
    );
    // Nothing of that changed the data directory.
    let m = log.mount(&args);
    assert_eq!(fs::read(m.p("keep")).unwrap(), b"kept");
    m.unmount();
    assert_fsck_clean(d, "after the refused commands");
}

#[test]
fn fsck_reports_a_flipped_journal_byte_and_repair_makes_it_mountable() {
    let data = disk_dir("memfs-crash-flip-");
    let d = data.path();
    let dd = d.as_os_str();
    let log = ServerLog::new("crash-flip");
    // No checkpoints: the journal holds every commit.
    let args = data_dir_args(d, &["--durability", "sync", "--checkpoint-interval", "0"]);
    let mut m = log.mount(&args);
    let seq = m.p("seq0");
    fs::create_dir(&seq).unwrap();
    const FILES: u64 = 200;
    for i in 0..FILES {
        fs::write(seq.join(i.to_string()), seq_content(0, i)).unwrap();
    }
    // A crash, so that no final checkpoint replaces the journal.
    m.kill();
    assert_fsck_clean(d, "before the damage");
    let mut segs: Vec<PathBuf> = fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with("journal-") && n.ends_with(".log")
        })
        .collect();
    segs.sort();
    let seg = segs.last().expect("a journal segment").clone();
    let mut bytes = fs::read(&seg).unwrap();
    let fr = frames(&bytes);
    assert!(
        fr.len() > 100,
        "only {} commits in {}",
        fr.len(),
        seg.display()
    );
    let (off, len) = fr[fr.len() / 2];
    bytes[off + 20 + len / 2] ^= 0x40;
    fs::write(&seg, &bytes).unwrap();

    let o = run(&["fsck".as_ref(), "--data-dir".as_ref(), dd]);
    let out = String::from_utf8_lossy(&o.stdout);
    let name = seg.file_name().unwrap().to_string_lossy();
    assert!(
        !o.status.success()
            && out.contains("DAMAGED")
            && out.contains(&*name)
            && out.contains(&format!("offset {off}")),
        "fsck of a journal with a flipped byte in the frame at offset {off} of {name}:\n{}",
        text(&o)
    );
    // A mount refuses too, naming the file.
    let spare = SpareMountPoint::new();
    let o = run(&[
        &["mount".as_ref(), spare.path().as_os_str()],
        &args.iter().map(|a| a.as_os_str()).collect::<Vec<_>>()[..],
    ]
    .concat());
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains(&*name),
        "mounting a damaged journal:\n{}",
        text(&o)
    );
    assert!(!is_mount_point(spare.path()));

    let o = run(&[
        "fsck".as_ref(),
        "--data-dir".as_ref(),
        dd,
        "--repair".as_ref(),
        "--yes".as_ref(),
    ]);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("repaired"),
        "fsck --repair --yes:\n{}",
        text(&o)
    );
    assert_fsck_clean(d, "after the repair");
    let m = log.mount(&args);
    // What is left is a prefix of what was written, cut before the damage.
    let k = check_prefix(&m.p("seq0"), 0, None).unwrap_or_else(|e| panic!("after the repair: {e}"));
    assert!(k > 0 && k < FILES, "{k} of {FILES} files after the repair");
    m.unmount();
}
