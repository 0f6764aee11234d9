//! An in-memory disk that can crash at any write or sync.
//!
//! [`SimStorage`] implements [`Storage`] with files and directories held in
//! memory and addressed by absolute path (the root `/` always exists; register
//! it for a prefix with [`crate::storage::register`] and create the data
//! directory through the journal). It models what a crash may leave on an
//! ext4-like file system, strictly:
//!
//! - per file, the *durable* content and the *pending* (unsynced) writes and
//!   length changes, in order; `sync_data`/`sync_all` make that file's pending
//!   changes durable;
//! - per directory, the durable entries and the pending entry changes
//!   (create, rename, remove; also creating a subdirectory), in order; only a
//!   sync of that directory makes them durable. A file whose creation was never
//!   made durable by a directory sync may vanish, and a rename may be undone.
//!
//! Crash injection: [`SimStorage::set_crash_after`] picks the n-th counted
//! operation from now (a write, length change, sync, create, rename or
//! remove), or [`SimStorage::crash_now`]. The crashing operation still reaches
//! the volatile state (a write may land, partly or not at all) and returns
//! `EIO`; every later operation, reads included, returns `EIO`, so the code
//! under test can no longer touch the disk. [`SimStorage::recover`] then builds
//! the disk as found after the reboot: each pending write kept, dropped or torn
//! sector by sector, and a prefix of each directory's pending changes kept.

use crate::storage::{DirLock, OpenMode, Storage, StorageFile};
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// Sector size used when tearing a write: each 512-byte sector (aligned on
/// file offsets) of a torn write lands or not independently.
pub const SECTOR: u64 = 512;

/// What happens to pending (unsynced) changes at recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoverMode {
    /// Every pending write and directory change reached the disk.
    KeepAll,
    /// None did: only what was synced survives.
    DropAll,
    /// Seeded: each pending write is kept, dropped or torn (each of its
    /// sectors kept with probability 1/2), each pending length change kept
    /// or not; in each directory a random prefix of the pending changes is
    /// kept, in order.
    Random,
}

#[derive(Debug, Clone)]
enum FileOp {
    Write { off: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Default)]
struct Inode {
    durable: Vec<u8>,
    current: Vec<u8>,
    pending: Vec<FileOp>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    File(u64),
    Dir,
}

#[derive(Debug, Clone)]
enum DirOp {
    Create(OsString, Entry),
    Remove(OsString),
    Rename(OsString, OsString),
}

#[derive(Debug, Default)]
struct Dir {
    durable: BTreeMap<OsString, Entry>,
    current: BTreeMap<OsString, Entry>,
    pending: Vec<DirOp>,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Write,
    Sync,
    Meta,
}

#[derive(Debug, Default)]
struct Sim {
    crashed: bool,
    crash_at: Option<u64>,
    ops: u64,
    writes: u64,
    syncs: u64,
    next_ino: u64,
    inodes: BTreeMap<u64, Inode>,
    dirs: BTreeMap<PathBuf, Dir>,
    locks: BTreeSet<PathBuf>,
    /// One-shot faults: the next operation of that kind fails with that
    /// errno and changes nothing; the disk goes on working.
    fail_write: Option<i32>,
    fail_sync: Option<i32>,
    fail_alloc: Option<i32>,
}

fn eio() -> io::Error {
    io::Error::from(nix::errno::Errno::EIO)
}

fn not_found(p: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file or directory (simulated)", p.display()),
    )
}

/// Absolute, without `.` and `..`.
fn normalize(p: &Path) -> io::Result<PathBuf> {
    if !p.is_absolute() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: the simulated storage needs absolute paths",
                p.display()
            ),
        ));
    }
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    Ok(out)
}

fn split(p: &Path) -> io::Result<(PathBuf, OsString)> {
    let p = normalize(p)?;
    match (p.parent(), p.file_name()) {
        (Some(d), Some(n)) => Ok((d.to_path_buf(), n.to_os_string())),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a file path", p.display()),
        )),
    }
}

fn write_at(buf: &mut Vec<u8>, off: u64, data: &[u8]) {
    let off = off as usize;
    let end = off + data.len();
    if buf.len() < end {
        buf.resize(end, 0);
    }
    buf[off..end].copy_from_slice(data);
}

/// splitmix64: small, seeded, reproducible; good enough to pick crash
/// outcomes here and operations in the crash tests that drive this module.
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform enough in `0..n`; 0 when `n` is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    pub fn coin(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
}

impl Sim {
    fn new() -> Sim {
        let mut s = Sim {
            next_ino: 1,
            ..Default::default()
        };
        s.dirs.insert(PathBuf::from("/"), Dir::default());
        s
    }

    fn check(&self) -> io::Result<()> {
        if self.crashed { Err(eio()) } else { Ok(()) }
    }

    /// Counts one mutating operation. `Ok(true)`: this is the crash point (the
    /// caller applies the change to the volatile state, then fails).
    fn begin(&mut self, kind: Kind) -> io::Result<bool> {
        self.check()?;
        let fault = match kind {
            Kind::Write => self.fail_write.take(),
            Kind::Sync => self.fail_sync.take(),
            Kind::Meta => None,
        };
        if let Some(errno) = fault {
            return Err(io::Error::from_raw_os_error(errno));
        }
        self.ops += 1;
        match kind {
            Kind::Write => self.writes += 1,
            Kind::Sync => self.syncs += 1,
            Kind::Meta => {}
        }
        if self.crash_at == Some(self.ops) {
            self.crashed = true;
            tracing::debug!(op = self.ops, "simulated crash");
            return Ok(true);
        }
        Ok(false)
    }

    fn end(crash: bool) -> io::Result<()> {
        if crash { Err(eio()) } else { Ok(()) }
    }

    fn dir(&self, d: &Path) -> io::Result<&Dir> {
        self.dirs.get(d).ok_or_else(|| not_found(d))
    }

    fn dir_mut(&mut self, d: &Path) -> io::Result<&mut Dir> {
        self.dirs.get_mut(d).ok_or_else(|| not_found(d))
    }

    fn lookup(&self, p: &Path) -> io::Result<Option<Entry>> {
        let p = normalize(p)?;
        if p == Path::new("/") {
            return Ok(Some(Entry::Dir));
        }
        let (d, n) = split(&p)?;
        match self.dirs.get(&d) {
            Some(dir) => Ok(dir.current.get(&n).copied()),
            None => Ok(None),
        }
    }

    fn file(&self, p: &Path) -> io::Result<u64> {
        match self.lookup(p)? {
            Some(Entry::File(ino)) => Ok(ino),
            Some(Entry::Dir) => Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("{}: is a directory", p.display()),
            )),
            None => Err(not_found(p)),
        }
    }

    fn create(&mut self, d: &Path, name: OsString, e: Entry) -> io::Result<()> {
        self.dir(d)?;
        let crash = self.begin(Kind::Meta)?;
        let dir = self.dir_mut(d)?;
        dir.current.insert(name.clone(), e);
        dir.pending.push(DirOp::Create(name, e));
        Sim::end(crash)
    }

    fn file_op(&mut self, ino: u64, op: FileOp) -> io::Result<()> {
        let crash = self.begin(Kind::Write)?;
        let node = self.inodes.get_mut(&ino).expect("open file has an inode");
        match &op {
            FileOp::Write { off, data } => write_at(&mut node.current, *off, data),
            FileOp::SetLen(n) => node.current.resize(*n as usize, 0),
        }
        node.pending.push(op);
        Sim::end(crash)
    }

    fn sync_file(&mut self, ino: u64) -> io::Result<()> {
        if self.begin(Kind::Sync)? {
            return Err(eio());
        }
        let node = self.inodes.get_mut(&ino).expect("open file has an inode");
        node.durable = node.current.clone();
        node.pending.clear();
        Ok(())
    }

    fn recover(&self, mode: RecoverMode, seed: u64) -> Sim {
        let mut rng = SplitMix64(seed ^ 0x6D65_6D66_735F_7369);
        let mut entries = self.crashed_entries(mode, &mut rng);
        // Only what is reachable from the root survives.
        let mut out = Sim::new();
        out.next_ino = self.next_ino;
        let mut todo = vec![PathBuf::from("/")];
        let mut files = BTreeSet::new();
        while let Some(p) = todo.pop() {
            let m = entries.remove(p.as_path()).unwrap_or_default();
            for (n, e) in &m {
                match e {
                    Entry::Dir => todo.push(p.join(n)),
                    Entry::File(ino) => {
                        files.insert(*ino);
                    }
                }
            }
            out.dirs.insert(
                p,
                Dir {
                    durable: m.clone(),
                    current: m,
                    pending: Vec::new(),
                },
            );
        }
        for ino in files {
            let c = crashed_contents(&self.inodes[&ino], mode, &mut rng);
            out.inodes.insert(
                ino,
                Inode {
                    durable: c.clone(),
                    current: c,
                    pending: Vec::new(),
                },
            );
        }
        out
    }

    /// Directory entries after the crash: the durable ones, then as many of
    /// each directory's pending operations as `mode` keeps.
    fn crashed_entries(
        &self,
        mode: RecoverMode,
        rng: &mut SplitMix64,
    ) -> BTreeMap<&Path, BTreeMap<OsString, Entry>> {
        let mut entries: BTreeMap<&Path, BTreeMap<OsString, Entry>> = BTreeMap::new();
        for (path, d) in &self.dirs {
            let keep = match mode {
                RecoverMode::KeepAll => d.pending.len(),
                RecoverMode::DropAll => 0,
                RecoverMode::Random => rng.below(d.pending.len() as u64 + 1) as usize,
            };
            let mut m = d.durable.clone();
            for op in &d.pending[..keep] {
                match op {
                    DirOp::Create(n, e) => {
                        m.insert(n.clone(), *e);
                    }
                    DirOp::Remove(n) => {
                        m.remove(n);
                    }
                    DirOp::Rename(from, to) => {
                        if let Some(e) = m.remove(from) {
                            m.insert(to.clone(), e);
                        }
                    }
                }
            }
            entries.insert(path, m);
        }
        entries
    }
}

/// A file's contents after the crash: its durable bytes, then its pending
/// operations as `mode` keeps them (with `Random`, a write may land whole,
/// not at all, or torn, sector by sector).
fn crashed_contents(node: &Inode, mode: RecoverMode, rng: &mut SplitMix64) -> Vec<u8> {
    let mut c = node.durable.clone();
    for op in &node.pending {
        match (op, mode) {
            (_, RecoverMode::DropAll) => {}
            (FileOp::SetLen(n), RecoverMode::KeepAll) => c.resize(*n as usize, 0),
            (FileOp::SetLen(n), RecoverMode::Random) => {
                if rng.coin() {
                    c.resize(*n as usize, 0)
                }
            }
            (FileOp::Write { off, data }, RecoverMode::KeepAll) => write_at(&mut c, *off, data),
            (FileOp::Write { off, data }, RecoverMode::Random) => match rng.below(3) {
                0 => write_at(&mut c, *off, data),
                1 => {}
                _ => {
                    let end = off + data.len() as u64;
                    let mut at = *off;
                    while at < end {
                        let sec_end = ((at / SECTOR + 1) * SECTOR).min(end);
                        if rng.coin() {
                            let piece = &data[(at - off) as usize..(sec_end - off) as usize];
                            write_at(&mut c, at, piece);
                        }
                        at = sec_end;
                    }
                }
            },
        }
    }
    c
}

/// The simulated disk. Cloning gives another handle to the same disk.
#[derive(Clone)]
pub struct SimStorage {
    st: Arc<Mutex<Sim>>,
    gate: Arc<SyncGate>,
}

/// Holds file syncs back while closed: a disk that is slow to flush, with
/// the test deciding when the flush ends.
#[derive(Default)]
struct SyncGate {
    /// (closed, syncs waiting)
    state: Mutex<(bool, usize)>,
    opened: Condvar,
}

impl SyncGate {
    fn pass(&self) {
        let mut g = self.state.lock();
        g.1 += 1;
        while g.0 {
            self.opened.wait(&mut g);
        }
        g.1 -= 1;
    }
}

impl std::fmt::Debug for SimStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.st.lock();
        f.debug_struct("SimStorage")
            .field("ops", &s.ops)
            .field("crashed", &s.crashed)
            .field("files", &s.inodes.len())
            .finish()
    }
}

impl Default for SimStorage {
    fn default() -> Self {
        SimStorage::new()
    }
}

impl SimStorage {
    /// An empty disk holding only the root directory `/`.
    pub fn new() -> SimStorage {
        SimStorage {
            st: Arc::new(Mutex::new(Sim::new())),
            gate: Arc::default(),
        }
    }

    /// Crashes at the `ops`-th counted operation from now (1: the next one);
    /// 0 crashes now.
    pub fn set_crash_after(&self, ops: u64) {
        let mut s = self.st.lock();
        if ops == 0 {
            s.crashed = true;
        } else {
            s.crash_at = Some(s.ops + ops);
        }
    }

    /// While held, file syncs (`sync_data`, `sync_all`) wait before they
    /// start; releasing lets every waiting sync go on.
    pub fn hold_file_syncs(&self, held: bool) {
        self.gate.state.lock().0 = held;
        if !held {
            self.gate.opened.notify_all();
        }
    }

    /// File syncs waiting at the gate right now.
    pub fn syncs_waiting(&self) -> usize {
        self.gate.state.lock().1
    }

    /// Makes the next file write fail with `errno` (e.g. `ENOSPC`, `EIO`),
    /// changing nothing; later operations work.
    pub fn fail_next_write(&self, errno: i32) {
        self.st.lock().fail_write = Some(errno);
    }

    /// Makes the next file or directory sync fail with `errno`.
    pub fn fail_next_sync(&self, errno: i32) {
        self.st.lock().fail_sync = Some(errno);
    }

    /// Makes the next space preallocation (`StorageFile::allocate`) fail
    /// with `errno`: a full disk, as the journal's reservations see it.
    pub fn fail_next_alloc(&self, errno: i32) {
        self.st.lock().fail_alloc = Some(errno);
    }

    /// Crashes now: every further operation fails with `EIO`.
    pub fn crash_now(&self) {
        self.st.lock().crashed = true;
    }

    pub fn is_crashed(&self) -> bool {
        self.st.lock().crashed
    }

    /// Counted operations so far (writes, length changes, syncs, creates,
    /// renames, removes).
    pub fn ops(&self) -> u64 {
        self.st.lock().ops
    }

    /// Writes and length changes so far.
    pub fn writes(&self) -> u64 {
        self.st.lock().writes
    }

    /// File and directory syncs so far.
    pub fn syncs(&self) -> u64 {
        self.st.lock().syncs
    }

    /// The disk as found after a crash now (or at the crash point, if one
    /// happened): a new, working disk with nothing pending, no locks held and
    /// counters at zero. This handle stays as it is (crashed, if it was).
    pub fn recover(&self, mode: RecoverMode, seed: u64) -> SimStorage {
        let out = self.st.lock().recover(mode, seed);
        SimStorage {
            st: Arc::new(Mutex::new(out)),
            gate: Arc::default(),
        }
    }
}

struct SimFile {
    st: Arc<Mutex<Sim>>,
    gate: Arc<SyncGate>,
    ino: u64,
    pos: u64,
    read: bool,
    write: bool,
}

impl std::fmt::Debug for SimFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimFile")
            .field("ino", &self.ino)
            .field("pos", &self.pos)
            .finish()
    }
}

fn bad_fd(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("file not opened for {what} (simulated)"),
    )
}

impl Read for SimFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.read {
            return Err(bad_fd("reading"));
        }
        let s = self.st.lock();
        s.check()?;
        let c = &s.inodes[&self.ino].current;
        let start = (self.pos as usize).min(c.len());
        let n = buf.len().min(c.len() - start);
        buf[..n].copy_from_slice(&c[start..start + n]);
        self.pos += n as u64;
        Ok(n)
    }
}

impl Write for SimFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if !self.write {
            return Err(bad_fd("writing"));
        }
        if buf.is_empty() {
            return self.st.lock().check();
        }
        let off = self.pos;
        self.st.lock().file_op(
            self.ino,
            FileOp::Write {
                off,
                data: buf.to_vec(),
            },
        )?;
        self.pos += buf.len() as u64;
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.st.lock().check()
    }
}

impl Seek for SimFile {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        let s = self.st.lock();
        s.check()?;
        let len = s.inodes[&self.ino].current.len() as i128;
        let new = match pos {
            SeekFrom::Start(o) => o as i128,
            SeekFrom::End(d) => len + d as i128,
            SeekFrom::Current(d) => self.pos as i128 + d as i128,
        };
        if new < 0 || new > u64::MAX as i128 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek to a negative or overflowing position",
            ));
        }
        self.pos = new as u64;
        Ok(self.pos)
    }
}

impl StorageFile for SimFile {
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        if !self.write {
            return Err(bad_fd("writing"));
        }
        self.st.lock().file_op(self.ino, FileOp::SetLen(len))
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.gate.pass();
        self.st.lock().sync_file(self.ino)
    }

    fn sync_all(&mut self) -> io::Result<()> {
        self.gate.pass();
        self.st.lock().sync_file(self.ino)
    }

    fn len(&self) -> io::Result<u64> {
        let s = self.st.lock();
        s.check()?;
        Ok(s.inodes[&self.ino].current.len() as u64)
    }

    fn allocate(&mut self, _len: u64) -> io::Result<()> {
        let mut s = self.st.lock();
        s.check()?;
        match s.fail_alloc.take() {
            Some(errno) => Err(io::Error::from_raw_os_error(errno)),
            None => Ok(()),
        }
    }
}

struct SimLock {
    st: Arc<Mutex<Sim>>,
    key: PathBuf,
}

impl std::fmt::Debug for SimLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimLock").field("file", &self.key).finish()
    }
}

impl DirLock for SimLock {}

impl Drop for SimLock {
    fn drop(&mut self) {
        self.st.lock().locks.remove(&self.key);
    }
}

impl SimStorage {
    fn handle(&self, ino: u64, read: bool, write: bool) -> Box<dyn StorageFile> {
        Box::new(SimFile {
            st: self.st.clone(),
            gate: self.gate.clone(),
            ino,
            pos: 0,
            read,
            write,
        })
    }
}

impl Storage for SimStorage {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        let mut s = self.st.lock();
        s.check()?;
        let existing = match s.lookup(path)? {
            Some(_) => Some(s.file(path)?),
            None => None,
        };
        match (mode, existing) {
            (OpenMode::Read, Some(ino)) => Ok(self.handle(ino, true, false)),
            (OpenMode::Write | OpenMode::CreateOrOpen, Some(ino)) => {
                Ok(self.handle(ino, true, true))
            }
            (OpenMode::CreateTruncate, Some(ino)) => {
                if !s.inodes[&ino].current.is_empty() {
                    s.file_op(ino, FileOp::SetLen(0))?;
                }
                Ok(self.handle(ino, false, true))
            }
            (OpenMode::Read | OpenMode::Write, None) => Err(not_found(path)),
            (OpenMode::CreateOrOpen | OpenMode::CreateTruncate, None) => {
                let (d, n) = split(path)?;
                let ino = s.next_ino;
                s.next_ino += 1;
                s.inodes.insert(ino, Inode::default());
                s.create(&d, n, Entry::File(ino))?;
                Ok(self.handle(ino, mode == OpenMode::CreateOrOpen, true))
            }
        }
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let s = self.st.lock();
        s.check()?;
        let ino = s.file(path)?;
        Ok(s.inodes[&ino].current.clone())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.st.lock();
        s.check()?;
        let (fd, fname) = split(from)?;
        let (td, tname) = split(to)?;
        if fd != td {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "rename {} -> {}: only renames within one directory are simulated",
                    from.display(),
                    to.display()
                ),
            ));
        }
        s.file(from)?;
        if let Some(Entry::Dir) = s.lookup(to)? {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("{}: is a directory", to.display()),
            ));
        }
        let crash = s.begin(Kind::Meta)?;
        let dir = s.dir_mut(&fd)?;
        let e = dir.current.remove(&fname).expect("checked above");
        dir.current.insert(tname.clone(), e);
        dir.pending.push(DirOp::Rename(fname, tname));
        Sim::end(crash)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut s = self.st.lock();
        s.check()?;
        s.file(path)?;
        let (d, n) = split(path)?;
        let crash = s.begin(Kind::Meta)?;
        let dir = s.dir_mut(&d)?;
        dir.current.remove(&n);
        dir.pending.push(DirOp::Remove(n));
        Sim::end(crash)
    }

    fn read_dir(&self, dir: &Path) -> io::Result<Vec<OsString>> {
        let s = self.st.lock();
        s.check()?;
        let d = normalize(dir)?;
        Ok(s.dir(&d)?.current.keys().cloned().collect())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut s = self.st.lock();
        s.check()?;
        let d = normalize(dir)?;
        s.dir(&d)?;
        if s.begin(Kind::Sync)? {
            return Err(eio());
        }
        let dir = s.dir_mut(&d)?;
        dir.durable = dir.current.clone();
        dir.pending.clear();
        Ok(())
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut s = self.st.lock();
        s.check()?;
        let d = normalize(dir)?;
        let mut at = PathBuf::from("/");
        for c in d.components().skip(1) {
            let name: &OsStr = c.as_os_str();
            let next = at.join(name);
            match s.lookup(&next)? {
                Some(Entry::Dir) => {}
                Some(Entry::File(_)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("{}: exists and is not a directory", next.display()),
                    ));
                }
                None => {
                    s.dirs.insert(next.clone(), Dir::default());
                    s.create(&at, name.to_os_string(), Entry::Dir)?;
                }
            }
            at = next;
        }
        Ok(())
    }

    fn is_dir(&self, path: &Path) -> bool {
        let s = self.st.lock();
        s.check().is_ok() && matches!(s.lookup(path), Ok(Some(Entry::Dir)))
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        let s = self.st.lock();
        s.check()?;
        Ok(s.lookup(path)?.is_some())
    }

    fn len(&self, path: &Path) -> io::Result<u64> {
        let s = self.st.lock();
        s.check()?;
        let ino = s.file(path)?;
        Ok(s.inodes[&ino].current.len() as u64)
    }

    fn lock(&self, lock_file: &Path) -> io::Result<Box<dyn DirLock>> {
        drop(self.open(lock_file, OpenMode::CreateOrOpen)?);
        let key = normalize(lock_file)?;
        let mut s = self.st.lock();
        s.check()?;
        if !s.locks.insert(key.clone()) {
            return Err(io::Error::from(io::ErrorKind::WouldBlock));
        }
        Ok(Box::new(SimLock {
            st: self.st.clone(),
            key,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> &Path {
        Path::new(s)
    }

    fn write(sim: &SimStorage, path: &str, data: &[u8], sync: bool) {
        let mut f = sim.open(p(path), OpenMode::CreateOrOpen).unwrap();
        f.seek(SeekFrom::End(0)).unwrap();
        f.write_all(data).unwrap();
        if sync {
            f.sync_data().unwrap();
        }
    }

    #[test]
    fn unsynced_creation_and_data_vanish_synced_survive() {
        let sim = SimStorage::new();
        sim.create_dir_all(p("/d")).unwrap();
        sim.sync_dir(p("/")).unwrap();
        write(&sim, "/d/a", b"durable", true);
        sim.sync_dir(p("/d")).unwrap();
        write(&sim, "/d/a", b"+pending", false);
        write(&sim, "/d/b", b"synced data, unsynced name", true);
        let keep = sim.recover(RecoverMode::KeepAll, 0);
        assert_eq!(keep.read(p("/d/a")).unwrap(), b"durable+pending");
        assert!(keep.exists(p("/d/b")).unwrap());
        let drop = sim.recover(RecoverMode::DropAll, 0);
        assert_eq!(drop.read(p("/d/a")).unwrap(), b"durable");
        assert!(!drop.exists(p("/d/b")).unwrap());
    }

    #[test]
    fn unsynced_rename_is_undone_and_unsynced_dir_loses_its_subtree() {
        let sim = SimStorage::new();
        sim.create_dir_all(p("/d/e")).unwrap();
        sim.sync_dir(p("/")).unwrap();
        write(&sim, "/d/x.tmp", b"new", true);
        sim.sync_dir(p("/d")).unwrap();
        sim.rename(p("/d/x.tmp"), p("/d/x")).unwrap();
        sim.create_dir_all(p("/d/g/h")).unwrap();
        sim.sync_dir(p("/d/g")).unwrap();
        write(&sim, "/d/g/h/f", b"synced", true);
        sim.sync_dir(p("/d/g/h")).unwrap();
        let drop = sim.recover(RecoverMode::DropAll, 0);
        assert!(drop.exists(p("/d/x.tmp")).unwrap());
        assert!(!drop.exists(p("/d/x")).unwrap());
        // "/d/g" was created but "/d" not synced since: its subtree is gone.
        assert!(drop.is_dir(p("/d/e")));
        assert!(!drop.is_dir(p("/d/g")));
        assert!(!drop.exists(p("/d/g/h/f")).unwrap());
        let keep = sim.recover(RecoverMode::KeepAll, 0);
        assert_eq!(keep.read(p("/d/x")).unwrap(), b"new");
        assert_eq!(keep.read(p("/d/g/h/f")).unwrap(), b"synced");
    }

    #[test]
    fn crash_point_fails_that_op_and_everything_after() {
        let sim = SimStorage::new();
        let mut f = sim.open(p("/f"), OpenMode::CreateTruncate).unwrap();
        assert_eq!(sim.ops(), 1);
        sim.set_crash_after(2);
        f.write_all(b"one").unwrap();
        let e = f.write_all(b"two").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(nix::errno::Errno::EIO as i32));
        assert!(sim.is_crashed());
        assert!(sim.read(p("/f")).is_err());
        assert!(f.sync_data().is_err());
        assert_eq!(sim.writes(), 2);
        // The crashing write reached the volatile state: it may land.
        let keep = sim.recover(RecoverMode::KeepAll, 0);
        assert_eq!(keep.read(p("/f")).unwrap(), b"onetwo");
        assert!(!keep.is_crashed());
        assert_eq!(keep.ops(), 0);
    }

    #[test]
    fn random_tears_writes_by_sector_and_is_seeded() {
        let sim = SimStorage::new();
        write(&sim, "/f", &[], true);
        sim.sync_dir(p("/")).unwrap();
        let data: Vec<u8> = (0..8 * SECTOR).map(|i| (i % 251) as u8 + 1).collect();
        write(&sim, "/f", &data, false);
        let mut outcomes = BTreeSet::new();
        for seed in 0..200 {
            let got = sim
                .recover(RecoverMode::Random, seed)
                .read(p("/f"))
                .unwrap();
            assert_eq!(
                got,
                sim.recover(RecoverMode::Random, seed)
                    .read(p("/f"))
                    .unwrap()
            );
            // Every sector is either the new data or (never written) zeros.
            for (i, sec) in got.chunks(SECTOR as usize).enumerate() {
                let want = &data[i * SECTOR as usize..][..sec.len()];
                assert!(
                    sec == want || sec.iter().all(|&b| b == 0),
                    "seed {seed} sector {i}"
                );
            }
            outcomes.insert(got);
        }
        assert!(
            outcomes.len() > 10,
            "only {} distinct outcomes",
            outcomes.len()
        );
        assert!(outcomes.contains(&Vec::new()) && outcomes.contains(&data));
    }

    #[test]
    fn lock_is_exclusive_until_dropped_and_bad_input_is_an_error() {
        let sim = SimStorage::new();
        let l = sim.lock(p("/LOCK")).unwrap();
        let e = sim.lock(p("/LOCK")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        drop(l);
        sim.lock(p("/LOCK")).unwrap();
        assert!(sim.open(p("relative"), OpenMode::Read).is_err());
        assert!(sim.open(p("/nope/x"), OpenMode::CreateOrOpen).is_err());
        assert!(sim.rename(p("/LOCK"), p("/other/LOCK")).is_err());
        assert_eq!(
            sim.read(p("/missing")).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }
}
