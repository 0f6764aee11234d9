//! memfs-store: a rollbackable, sharded, in-memory key-value store of blocks
//! with a durable journal (`memfs-journal`).
//!
//! - State lives in RAM in `shards` flat hash tables ([`table`]); a block's
//!   operations are partitioned by shard and applied by up to `threads`
//!   threads, each holding one shard's write lock at a time, so a reader waits
//!   at most for one shard's share of a block.
//! - Each block becomes one journal commit of absolute writes (key := value).
//! - The last `rollback_window` blocks keep undo entries (key := old value) in
//!   memory; snapshots copy the tables shard by shard in the background and
//!   include the window, so the journal behind a snapshot can be deleted.
//!
//! See `docs/store.md` for the invariants and the recovery procedure.
//!
//! Depends on `memfs-journal` and small system crates only; its benchmark
//! (`memfs bench block`, against LMDB) lives in `memfs-bench`.

mod codec;
mod meta;
mod metrics;
pub mod net;
pub mod stages;
mod table;

pub use memfs_journal::{self as journal, Durability};
pub use table::hash_key;

use memfs_journal::checkpoint::{
    CheckpointReader, CheckpointWriter, checkpoint_file_name, list_checkpoints,
};
use memfs_journal::{CheckpointRef, DataDir, Journal, JournalOptions, Manifest};
use metrics::Metrics;
use parking_lot::{Mutex, RwLock};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use table::Table;

pub const MIN_KEY_WIDTH: usize = 8;
pub const MAX_KEY_WIDTH: usize = 64;
pub const MAX_VALUE_LEN: usize = u16::MAX as usize;
/// Below this many operations a block is applied on the calling thread: the
/// hand-off to workers costs more than it saves.
const PARALLEL_MIN_OPS: usize = 2048;
/// How many operations ahead a shard's home slot is prefetched: enough to
/// cover a memory latency with the work of the operations in between.
const PREFETCH_AHEAD: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Journal(#[from] memfs_journal::Error),
    #[error("key is {got} bytes but this store's keys are {expected} bytes")]
    KeyWidth { expected: usize, got: usize },
    #[error(
        "block {block} is not after the current block {current}; block ids must strictly increase"
    )]
    BlockNotIncreasing { block: u64, current: u64 },
    #[error(
        "cannot roll back to block {target}: the rollback window covers blocks {oldest} to {current}"
    )]
    RollbackOutsideWindow {
        target: u64,
        oldest: u64,
        current: u64,
    },
    #[error("value of {len} bytes is too large (at most {MAX_VALUE_LEN} bytes)")]
    ValueTooLarge { len: usize },
    #[error("store layout: {0}")]
    Layout(String),
    #[error("invalid options: {0}")]
    Invalid(String),
    /// A block in the encoded form that does not parse, or a
    /// [`PreparedBlock`] that does not fit the store.
    #[error("malformed block: {0}")]
    Malformed(String),
    #[error("corrupt store data: {0}")]
    Corrupt(String),
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the store failed earlier and refuses writes: {0}")]
    Failed(String),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Layout (fixed at creation) and runtime options.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Fixed key width in bytes (8..=64), recorded at creation.
    pub key_width: usize,
    /// Number of hash tables, recorded at creation.
    pub shards: usize,
    /// Initial capacity of each shard (entries).
    pub capacity_per_shard: usize,
    /// Threads applying a block (1 = the caller's thread only).
    pub threads: usize,
    pub durability: Durability,
    /// Write a snapshot every this many blocks (0 = only on request).
    pub snapshot_interval: u64,
    /// How many of the most recent blocks can be rolled back.
    pub rollback_window: u64,
    /// Journal segment size in bytes.
    pub segment_size: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            key_width: 8,
            shards: 16,
            capacity_per_shard: 1024,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            durability: Durability::Sync,
            snapshot_interval: 1000,
            rollback_window: 100,
            segment_size: 64 << 20,
        }
    }
}

impl StoreOptions {
    pub fn validate(&self) -> Result<()> {
        if !(MIN_KEY_WIDTH..=MAX_KEY_WIDTH).contains(&self.key_width) {
            return Err(StoreError::Invalid(format!(
                "key width {} is outside {MIN_KEY_WIDTH}..={MAX_KEY_WIDTH}",
                self.key_width
            )));
        }
        if self.shards == 0 || self.shards > 4096 {
            return Err(StoreError::Invalid(format!(
                "shard count {} is outside 1..=4096",
                self.shards
            )));
        }
        if self.threads == 0 || self.threads > 256 {
            return Err(StoreError::Invalid("threads must be 1..=256".into()));
        }
        if self.capacity_per_shard > 1 << 32 {
            return Err(StoreError::Invalid("capacity per shard too large".into()));
        }
        if self.segment_size < 4096 {
            return Err(StoreError::Invalid(
                "segment size must be at least 4096".into(),
            ));
        }
        Ok(())
    }
}

/// What opening the store found and did.
#[derive(Debug, Clone, Default)]
pub struct OpenReport {
    pub created: bool,
    /// The block the store is at after recovery.
    pub block: u64,
    /// The journal commit reached.
    pub commit: u64,
    /// The snapshot loaded, if any (its journal commit).
    pub snapshot_commit: Option<u64>,
    pub snapshot_entries: u64,
    pub commits_replayed: u64,
    pub bytes_replayed: u64,
    pub truncated_tail: Option<(PathBuf, u64, u64)>,
    pub elapsed: Duration,
}

/// A point-in-time view of the store's metrics.
#[derive(Debug, Clone, Default)]
pub struct MetricsSnapshot {
    pub block: u64,
    pub blocks: u64,
    pub ops: u64,
    pub rollbacks: u64,
    pub uptime_secs: f64,
    pub blocks_per_sec: f64,
    pub ops_per_sec: f64,
    pub latency_p50_us: u64,
    pub latency_p99_us: u64,
    pub latency_p999_us: u64,
    /// Blocks committed but not yet durable.
    pub pending_blocks: u64,
    pub pending_bytes: u64,
    pub durable_commit: u64,
    pub fsyncs: u64,
    pub journal_bytes: u64,
    pub snapshot_bytes: u64,
    pub snapshots_written: u64,
    pub last_snapshot_block: u64,
    pub entries: u64,
    pub table_bytes: u64,
    pub window_blocks: u64,
    pub window_bytes: u64,
    /// "ok" or the reason the store refuses writes.
    pub health: String,
}

/// Undo (and redo) entries of one block, one buffer per shard touched.
struct UndoBlock {
    block: u64,
    parts: Vec<Vec<u8>>,
}

impl UndoBlock {
    fn bytes(&self) -> usize {
        self.parts.iter().map(|p| p.len()).sum()
    }
}

struct Shared {
    kw: usize,
    shards: Vec<RwLock<Table>>,
    current: AtomicU64,
    metrics: Metrics,
    dir: PathBuf,
    failed: Mutex<Option<String>>,
    /// The rollback window. Held from applying a block (or rollback) until its
    /// journal commit is appended and the window updated, so a snapshot sees
    /// a consistent (last commit, window, block) triple.
    gate: Mutex<WindowState>,
}

struct WindowState {
    window: VecDeque<Arc<UndoBlock>>,
    /// The block whose state undoing the whole window restores.
    base: u64,
    bytes: usize,
}

impl Shared {
    #[inline]
    fn shard_of(&self, h: u64) -> usize {
        shard_of(h, self.shards.len())
    }

    fn check_failed(&self) -> Result<()> {
        match &*self.failed.lock() {
            Some(e) => Err(StoreError::Failed(e.clone())),
            None => Ok(()),
        }
    }

    fn fail(&self, e: &StoreError) {
        let mut f = self.failed.lock();
        if f.is_none() {
            tracing::error!(error = %e, "store: refusing further writes");
            *f = Some(e.to_string());
        }
    }
}

struct Writer {
    journal: Arc<Journal>,
    opts: StoreOptions,
    blocks_since_snapshot: u64,
    snapshot: Option<JoinHandle<Result<u64>>>,
    hashes: Vec<u64>,
    by_shard: Vec<Vec<u32>>,
    /// Undo buffers to reuse (see [`spare_limit`]).
    spare: Vec<Vec<u8>>,
    /// The journal form of a block given as pairs, reused.
    redo: Vec<u8>,
    /// Entry offsets of a block given in the encoded form ([`Store::set_encoded`]).
    offsets: Vec<u32>,
}

/// The block store. Share it between threads by reference or `Arc`; writes
/// are serialised internally, reads run concurrently.
pub struct Store {
    shared: Arc<Shared>,
    w: Mutex<Writer>,
    report: OpenReport,
    options: StoreOptions,
    // Declared last: the lock is released only after the journal is closed.
    _dir: DataDir,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.shared.dir)
            .field("block", &self.current_block())
            .finish()
    }
}

fn check_key(kw: usize, k: &[u8]) -> Result<()> {
    if k.len() != kw {
        return Err(StoreError::KeyWidth {
            expected: kw,
            got: k.len(),
        });
    }
    Ok(())
}

impl Store {
    /// Creates a store in `dir` (which must not hold one yet).
    pub fn create(dir: impl AsRef<Path>, opts: StoreOptions) -> Result<Store> {
        opts.validate()?;
        let dir = dir.as_ref();
        let dd = DataDir::open(dir, true)?;
        if memfs_journal::dir::exists(dir, meta::META_FILE)? {
            return Err(StoreError::Layout(format!(
                "{} already holds a store",
                dir.display()
            )));
        }
        memfs_journal::dir::write_file_atomic(
            dir,
            meta::META_FILE,
            meta::encode(&opts).as_bytes(),
        )?;
        Store::open_locked(dd, opts, true)
    }

    /// Opens an existing store with the options recorded at creation.
    pub fn open(dir: impl AsRef<Path>) -> Result<Store> {
        let dir = dir.as_ref();
        let dd = DataDir::open(dir, false)?;
        let opts = read_meta(dir)?;
        Store::open_locked(dd, opts, false)
    }

    /// Opens the store in `dir`, creating it if absent. An existing store must
    /// have the same key width and shard count; the runtime options
    /// (durability, threads, snapshot interval, window) are taken from `opts`
    /// and recorded.
    pub fn open_or_create(dir: impl AsRef<Path>, opts: StoreOptions) -> Result<Store> {
        opts.validate()?;
        let dir = dir.as_ref();
        let dd = DataDir::open(dir, true)?;
        let created = !memfs_journal::dir::exists(dir, meta::META_FILE)?;
        if !created {
            let rec = read_meta(dir)?;
            if rec.key_width != opts.key_width {
                return Err(StoreError::Layout(format!(
                    "{} was created with {}-byte keys, not {}",
                    dir.display(),
                    rec.key_width,
                    opts.key_width
                )));
            }
            if rec.shards != opts.shards {
                return Err(StoreError::Layout(format!(
                    "{} was created with {} shards, not {}",
                    dir.display(),
                    rec.shards,
                    opts.shards
                )));
            }
        }
        memfs_journal::dir::write_file_atomic(
            dir,
            meta::META_FILE,
            meta::encode(&opts).as_bytes(),
        )?;
        Store::open_locked(dd, opts, created)
    }

    fn open_locked(dd: DataDir, opts: StoreOptions, created: bool) -> Result<Store> {
        let t0 = Instant::now();
        let dir = dd.path().to_path_buf();
        let kw = opts.key_width;
        let mut tables: Vec<Table> = (0..opts.shards)
            .map(|_| Table::new(kw, opts.capacity_per_shard))
            .collect();
        let mut rec = Recovered::new(opts.rollback_window);
        let mut report = OpenReport {
            created,
            ..Default::default()
        };
        remove_snapshot_leftovers(&dir);
        let manifest = Manifest::load(&dir)?;
        let snap = manifest.as_ref().and_then(|m| m.checkpoint);
        let after = match snap {
            Some(s) => {
                let path = dir.join(checkpoint_file_name(s.commit));
                report.snapshot_entries = load_snapshot(&path, &opts, &mut tables, &mut rec)?;
                report.snapshot_commit = Some(s.commit);
                s.commit
            }
            None => 0,
        };
        let jopts = JournalOptions {
            durability: opts.durability,
            segment_size: opts.segment_size,
        };
        let (journal, jrep) = Journal::open(&dd, jopts, after, &mut |id, payload| {
            replay_commit(id, payload, kw, &mut tables, &mut rec)
        })?;
        if let Some(s) = snap
            && jrep.last_commit < s.required_end
        {
            return Err(StoreError::Corrupt(format!(
                "the snapshot at commit {} needs the journal up to commit {}, but it ends at commit {}",
                s.commit, s.required_end, jrep.last_commit
            )));
        }
        report.block = rec.current;
        report.commit = jrep.last_commit;
        report.commits_replayed = jrep.commits_replayed;
        report.bytes_replayed = jrep.bytes_replayed;
        report.truncated_tail = jrep.truncated_tail;
        report.elapsed = t0.elapsed();
        tracing::info!(
            block = report.block,
            commit = report.commit,
            replayed = report.commits_replayed,
            "store opened"
        );
        Ok(Store::assemble(dd, opts, tables, rec, journal, report))
    }

    /// The open store, from the tables and window recovered into `rec` and
    /// the journal opened on `dd`.
    fn assemble(
        dd: DataDir,
        opts: StoreOptions,
        tables: Vec<Table>,
        rec: Recovered,
        journal: Journal,
        report: OpenReport,
    ) -> Store {
        let kw = opts.key_width;
        let dir = dd.path().to_path_buf();
        let window_bytes = rec.window.iter().map(|u| u.bytes()).sum();
        let shared = Arc::new(Shared {
            kw,
            shards: tables.into_iter().map(RwLock::new).collect(),
            current: AtomicU64::new(rec.current),
            metrics: Metrics::new(),
            dir,
            failed: Mutex::new(None),
            gate: Mutex::new(WindowState {
                window: rec.window,
                base: rec.window_base,
                bytes: window_bytes,
            }),
        });
        let w = Writer {
            journal: Arc::new(journal),
            // Commits since the snapshot count towards the next one, so a
            // store reopened for every block still snapshots.
            blocks_since_snapshot: report.commits_replayed,
            snapshot: None,
            hashes: Vec::new(),
            by_shard: vec![Vec::new(); opts.shards],
            spare: Vec::new(),
            redo: Vec::new(),
            offsets: Vec::new(),
            opts: opts.clone(),
        };
        Store {
            shared,
            w: Mutex::new(w),
            report,
            options: opts,
            _dir: dd,
        }
    }

    pub fn options(&self) -> &StoreOptions {
        &self.options
    }

    pub fn open_report(&self) -> &OpenReport {
        &self.report
    }

    pub fn key_width(&self) -> usize {
        self.shared.kw
    }

    pub fn current_block(&self) -> u64 {
        self.shared.current.load(Ordering::Acquire)
    }

    /// The oldest block `rollback` can return to.
    pub fn oldest_rollback_block(&self) -> u64 {
        self.shared.gate.lock().base
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        check_key(self.shared.kw, key)?;
        let h = hash_key(key);
        let t = self.shared.shards[self.shared.shard_of(h)].read();
        Ok(t.get(key, h).map(|v| v.to_vec()))
    }

    /// Like [`Store::get`] without copying: `f` sees the value (or `None`)
    /// while the shard's read lock is held, so keep it short.
    pub fn get_with<R>(&self, key: &[u8], f: impl FnOnce(Option<&[u8]>) -> R) -> Result<R> {
        check_key(self.shared.kw, key)?;
        let h = hash_key(key);
        let t = self.shared.shards[self.shared.shard_of(h)].read();
        Ok(f(t.get(key, h)))
    }

    /// The id of the last journal commit (each block and each rollback that
    /// changed the block is one commit, numbered from 1 without gaps). The
    /// network server uses it as the sequence number of its event stream.
    pub fn last_commit(&self) -> u64 {
        self.w.lock().journal.last_commit()
    }

    pub fn multi_get<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<Option<Vec<u8>>>> {
        keys.iter().map(|k| self.get(k.as_ref())).collect()
    }

    /// Number of live keys.
    pub fn len(&self) -> u64 {
        self.shared
            .shards
            .iter()
            .map(|s| s.read().len() as u64)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Visits every entry (shard by shard; not atomic against writers).
    pub fn for_each(&self, mut f: impl FnMut(&[u8], &[u8])) {
        for s in &self.shared.shards {
            s.read().for_each(&mut f);
        }
    }

    /// Applies a block atomically: every (key, value) in order; an empty value
    /// deletes the key. Nothing changes if any argument is invalid.
    pub fn set<K, V>(&self, block: u64, ops: &[(K, V)]) -> Result<()>
    where
        K: AsRef<[u8]> + Sync,
        V: AsRef<[u8]> + Sync,
    {
        self.apply_block(block, ops).map(|_| ())
    }

    /// [`set`](Self::set) with the operations in their encoded form,
    /// `{ [key: key width][len u16 LE][value: len bytes] }*` (len 0 deletes):
    /// the body of the protocol's SET and EV_BLOCK frames after the count,
    /// and the store's own journal entry. Nothing is copied or allocated per
    /// operation: `entries` is indexed in place and written to the journal
    /// as is. A malformed buffer is refused before anything changes.
    pub fn set_encoded(&self, block: u64, entries: &[u8]) -> Result<()> {
        self.set_encoded_with(block, entries, &|_| {}).map(|_| ())
    }

    /// [`set_encoded`](Self::set_encoded) that calls `committed(id)` as soon
    /// as the block is in the journal as its durability mode promises (`id`
    /// is its commit, as [`last_commit`](Self::last_commit) will give), before
    /// or while the tables are updated; returns `id`. From that moment the
    /// block is committed: nothing after it can fail short of the store
    /// failing, and replay restores it. The network server publishes the
    /// block to its followers there, so that they apply it while the writer
    /// does instead of after (issue 13's follower lag). A block that is
    /// refused never calls `committed`. Readers of this store may still see
    /// the previous block while `committed` runs.
    pub fn set_encoded_with(
        &self,
        block: u64,
        entries: &[u8],
        committed: &(dyn Fn(u64) + Sync),
    ) -> Result<u64> {
        let t0 = Instant::now();
        let mut w = self.w.lock();
        let mut offsets = std::mem::take(&mut w.offsets);
        let r = index_entries(entries, self.shared.kw, &mut offsets).and_then(|()| {
            let ops = Encoded {
                bytes: entries,
                offsets: &offsets,
                kw: self.shared.kw,
            };
            let given = Given {
                encoded: Some(entries),
                bucketed: None,
            };
            self.apply_locked(&mut w, t0, block, &ops, given, committed)
        });
        w.offsets = offsets;
        r.map(|(id, _)| id)
    }

    /// [`set_encoded`](Self::set_encoded) with entries indexed and hashed
    /// beforehand by [`PreparedBlock::prepare`], e.g. on another thread
    /// while the previous block is applied (a follower's receiving thread).
    pub fn set_prepared(&self, block: u64, prepared: &PreparedBlock) -> Result<()> {
        let t0 = Instant::now();
        let Some(range) = prepared.entries.clone() else {
            return Err(StoreError::Malformed(
                "the block was not prepared (PreparedBlock::prepare)".into(),
            ));
        };
        if prepared.kw != self.shared.kw || prepared.shards != self.shared.shards.len() {
            return Err(StoreError::Malformed(format!(
                "the block was prepared for {}-byte keys and {} shards, the store has {}-byte keys and {} shards",
                prepared.kw,
                prepared.shards,
                self.shared.kw,
                self.shared.shards.len()
            )));
        }
        let entries = &prepared.bytes[range];
        let ops = Encoded {
            bytes: entries,
            offsets: &prepared.offsets,
            kw: self.shared.kw,
        };
        let mut w = self.w.lock();
        let given = Given {
            encoded: Some(entries),
            bucketed: Some((&prepared.hashes, &prepared.by_shard)),
        };
        self.apply_locked(&mut w, t0, block, &ops, given, &|_| {})
            .map(|_| ())
    }

    /// Deletes `key` in block `block`, returning its previous value.
    pub fn pop(&self, block: u64, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let ops: [(&[u8], &[u8]); 1] = [(key, b"")];
        let undo = self.apply_block(block, &ops)?;
        for p in &undo.parts {
            if let Some(Ok(e)) = codec::entries(p, self.shared.kw).next() {
                return Ok((!e.value.is_empty()).then(|| e.value.to_vec()));
            }
        }
        Ok(None)
    }

    /// Starts a block whose reads see its own staged writes.
    pub fn start_block(&self, block: u64) -> Result<BlockBuilder<'_>> {
        let current = self.current_block();
        if block <= current {
            return Err(StoreError::BlockNotIncreasing { block, current });
        }
        Ok(BlockBuilder {
            store: self,
            block,
            ops: Vec::new(),
            staged: std::collections::HashMap::new(),
        })
    }

    fn validate<K: AsRef<[u8]>, V: AsRef<[u8]>>(&self, ops: &[(K, V)]) -> Result<()> {
        for (k, v) in ops {
            check_key(self.shared.kw, k.as_ref())?;
            let len = v.as_ref().len();
            if len > MAX_VALUE_LEN {
                return Err(StoreError::ValueTooLarge { len });
            }
        }
        Ok(())
    }

    fn apply_block<K, V>(&self, block: u64, ops: &[(K, V)]) -> Result<Arc<UndoBlock>>
    where
        K: AsRef<[u8]> + Sync,
        V: AsRef<[u8]> + Sync,
    {
        let t0 = Instant::now();
        self.validate(ops)?;
        let mut w = self.w.lock();
        let given = Given {
            encoded: None,
            bucketed: None,
        };
        self.apply_locked(&mut w, t0, block, &Pairs(ops), given, &|_| {})
            .map(|(_, undo)| undo)
    }

    /// Applies a validated block with the writer lock held; `committed`
    /// gets its journal id as soon as the journal has it.
    fn apply_locked<O: Ops>(
        &self,
        w: &mut Writer,
        t0: Instant,
        block: u64,
        ops: &O,
        given: Given<'_>,
        committed: &(dyn Fn(u64) + Sync),
    ) -> Result<(u64, Arc<UndoBlock>)> {
        let Given { encoded, bucketed } = given;
        self.shared.check_failed()?;
        let current = self.current_block();
        if block <= current {
            return Err(StoreError::BlockNotIncreasing { block, current });
        }
        let gate = self.shared.gate.lock();
        // The journal entry is the operations themselves (key := value), so it
        // does not depend on applying them: encode it first, then write it
        // while the tables are updated. In `sync` mode the fsync overlaps the
        // in-memory work instead of following it.
        let mut redo = std::mem::take(&mut w.redo);
        redo.clear();
        if encoded.is_none() {
            encode_entries(&mut redo, ops, self.shared.kw);
        }
        let entries = encoded.unwrap_or(&redo);
        let header = codec::block_header(block);
        // Space first: a block that cannot be journaled is refused before
        // anything changes, and the store stays at the previous block.
        let reserved = match self.reserve_space(w, header.len() + entries.len()) {
            Ok(n) => n,
            Err(e) => {
                w.redo = redo;
                return Err(e);
            }
        };
        let (res, undo) =
            self.journal_and_apply(w, ops, bucketed, [&header, entries], reserved, committed);
        w.redo = redo;
        let id = match res {
            Ok(id) => id,
            Err(e) => {
                drop(gate);
                let e = StoreError::from(e);
                self.shared.fail(&e);
                return Err(e);
            }
        };
        let undo = self.make_current(w, gate, block, undo);
        self.shared.metrics.record_block(ops.len(), t0.elapsed());
        w.blocks_since_snapshot += 1;
        if w.opts.snapshot_interval > 0 && w.blocks_since_snapshot >= w.opts.snapshot_interval {
            self.maybe_start_snapshot(w);
        }
        Ok((id, undo))
    }

    /// Journals a block (`parts`, its header and entries, into `reserved`
    /// space) and updates the tables; `committed` gets its journal id as soon
    /// as the journal has it.
    fn journal_and_apply<O: Ops>(
        &self,
        w: &mut Writer,
        ops: &O,
        bucketed: Option<(&[u64], &[Vec<u32>])>,
        parts: [&[u8]; 2],
        reserved: u64,
        committed: &(dyn Fn(u64) + Sync),
    ) -> (memfs_journal::Result<u64>, Vec<Vec<u8>>) {
        let overlap = ops.len() >= PARALLEL_MIN_OPS
            && matches!(
                w.opts.durability,
                Durability::Sync | Durability::Relaxed { .. }
            );
        let journal = w.journal.clone();
        let (tables_stage, journal_stage) = block_stages(bucketed.is_some());
        // The journal entry does not depend on the tables, so the block is
        // committed once the journal has it: `committed` runs right then,
        // and the tables are updated after it (`async`, small blocks) or
        // while the journal writes (`sync`/`relaxed`, large blocks: there it
        // runs on the journal's thread). A journal failure fails the store
        // either way.
        let commit = || {
            let r = journal.commit_reserved(&parts, reserved);
            if let Ok(id) = &r {
                stages::mark(*id, journal_stage);
                committed(*id);
            }
            r
        };
        let (res, undo, tables_done) =
            commit_with_tables(&self.shared, w, ops, bucketed, overlap, commit);
        if let Ok(id) = &res
            && let Some(t) = tables_done
        {
            stages::mark_at(*id, tables_stage, t);
        }
        (res, undo)
    }

    /// Reserves journal space for a block entry of `len` bytes. Running out
    /// of space refuses the block only; any other failure fails the store.
    fn reserve_space(&self, w: &Writer, len: usize) -> Result<u64> {
        match w.journal.reserve(len as u64) {
            Ok(n) => Ok(n),
            Err(e) => {
                let e = StoreError::from(e);
                if !matches!(e, StoreError::Journal(memfs_journal::Error::NoSpace { .. })) {
                    self.shared.fail(&e);
                }
                Err(e)
            }
        }
    }

    /// Makes `block` the current one and keeps its undo in the rollback
    /// window, whose lock `gate` this releases.
    fn make_current(
        &self,
        w: &mut Writer,
        mut gate: parking_lot::MutexGuard<'_, WindowState>,
        block: u64,
        parts: Vec<Vec<u8>>,
    ) -> Arc<UndoBlock> {
        self.shared.current.store(block, Ordering::Release);
        let undo = Arc::new(UndoBlock { block, parts });
        let limit = w.opts.rollback_window;
        let keep = spare_limit(self.shared.shards.len());
        push_window(&mut gate, limit, undo.clone(), &mut w.spare, keep);
        drop(gate);
        undo
    }

    /// Restores exactly the state after block `target` (which must be inside
    /// the rollback window). Later block ids can then be used again.
    pub fn rollback(&self, target: u64) -> Result<()> {
        let w = self.w.lock();
        self.shared.check_failed()?;
        let mut gate = self.shared.gate.lock();
        let current = self.current_block();
        if target > current || target < gate.base {
            return Err(StoreError::RollbackOutsideWindow {
                target,
                oldest: gate.base,
                current,
            });
        }
        if target == current {
            return Ok(());
        }
        let kw = self.shared.kw;
        // The journal records the writes a rollback performs (key := old
        // value), so replay needs no undo information.
        let mut payload = Vec::new();
        let mut bad = None;
        while gate.window.back().is_some_and(|u| u.block > target) {
            let u = gate.window.pop_back().expect("checked");
            gate.bytes -= u.bytes();
            for p in &u.parts {
                if let Err(e) = undo_entries(p, kw, |key, old| {
                    let h = hash_key(key);
                    let mut t = self.shared.shards[self.shared.shard_of(h)].write();
                    restore(&mut t, key, h, old);
                    payload.extend_from_slice(key);
                    payload.extend_from_slice(&(old.len() as u16).to_le_bytes());
                    payload.extend_from_slice(old);
                }) {
                    bad = Some(e);
                }
            }
        }
        let new_current = gate.window.back().map_or(gate.base, |u| u.block);
        let header = codec::rollback_header(target, new_current);
        let res = match bad {
            Some(e) => Err(StoreError::Corrupt(e)),
            None => w
                .journal
                .commit_vectored(&[&header, &payload])
                .map_err(StoreError::from),
        };
        if let Err(e) = res {
            self.shared.fail(&e);
            return Err(e);
        }
        self.shared.current.store(new_current, Ordering::Release);
        drop(gate);
        self.shared
            .metrics
            .rollbacks
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Makes every committed block durable (whatever the mode).
    pub fn sync(&self) -> Result<()> {
        let j = self.w.lock().journal.clone();
        j.sync()?;
        Ok(())
    }

    /// Writes a snapshot now and waits for it; returns its journal commit.
    pub fn snapshot(&self) -> Result<u64> {
        let h = {
            let mut w = self.w.lock();
            if let Some(h) = w.snapshot.take() {
                drop(w);
                let _ = join_snapshot(h, &self.shared);
                w = self.w.lock();
            }
            self.shared.check_failed()?;
            self.spawn_snapshot(&mut w)?
        };
        join_snapshot(h, &self.shared)
    }

    fn maybe_start_snapshot(&self, w: &mut Writer) {
        if let Some(h) = &w.snapshot {
            if !h.is_finished() {
                return;
            }
            let h = w.snapshot.take().expect("checked");
            let _ = join_snapshot(h, &self.shared);
        }
        match self.spawn_snapshot(w) {
            Ok(h) => w.snapshot = Some(h),
            Err(e) => tracing::error!(error = %e, "store: could not start a snapshot"),
        }
    }

    fn spawn_snapshot(&self, w: &mut Writer) -> Result<JoinHandle<Result<u64>>> {
        w.blocks_since_snapshot = 0;
        let job = SnapshotJob {
            shared: self.shared.clone(),
            journal: w.journal.clone(),
            commit: w.journal.last_commit(),
            shards: w.opts.shards,
        };
        std::thread::Builder::new()
            .name("store-snapshot".into())
            .spawn(move || job.run())
            .map_err(io_err(&self.shared.dir))
    }

    pub fn metrics(&self) -> MetricsSnapshot {
        let m = &self.shared.metrics;
        let (js, jbytes) = {
            let w = self.w.lock();
            (w.journal.stats(), w.journal.disk_bytes())
        };
        let (window_blocks, window_bytes) = {
            let g = self.shared.gate.lock();
            (g.window.len() as u64, g.bytes as u64)
        };
        let up = m.started.elapsed().as_secs_f64().max(1e-9);
        let blocks = m.blocks.load(Ordering::Relaxed);
        let ops = m.ops.load(Ordering::Relaxed);
        let p = m.percentiles(&[0.5, 0.99, 0.999]);
        let (mut entries, mut table_bytes) = (0u64, 0u64);
        for s in &self.shared.shards {
            let t = s.read();
            entries += t.len() as u64;
            table_bytes += t.memory_bytes() as u64;
        }
        let snapshot_bytes = list_checkpoints(&self.shared.dir)
            .unwrap_or_default()
            .iter()
            .filter_map(|(_, p)| memfs_journal::dir::file_len(p).ok())
            .sum();
        MetricsSnapshot {
            block: self.current_block(),
            blocks,
            ops,
            rollbacks: m.rollbacks.load(Ordering::Relaxed),
            uptime_secs: up,
            blocks_per_sec: blocks as f64 / up,
            ops_per_sec: ops as f64 / up,
            latency_p50_us: p[0],
            latency_p99_us: p[1],
            latency_p999_us: p[2],
            pending_blocks: js.pending_commits,
            pending_bytes: js.pending_bytes,
            durable_commit: js.durable_commit,
            fsyncs: js.fsyncs,
            journal_bytes: jbytes,
            snapshot_bytes,
            snapshots_written: m.snapshots.load(Ordering::Relaxed),
            last_snapshot_block: m.last_snapshot_block.load(Ordering::Relaxed),
            entries,
            table_bytes,
            window_blocks,
            window_bytes,
            health: match (self.shared.failed.lock().clone(), js.failed) {
                (Some(e), _) | (None, Some(e)) => e,
                (None, None) => "ok".into(),
            },
        }
    }

    /// Waits for a running snapshot, flushes and fsyncs the journal.
    pub fn close(self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&self) -> Result<()> {
        let h = self.w.lock().snapshot.take();
        let snap = h.map(|h| join_snapshot(h, &self.shared));
        let j = self.w.lock().journal.clone();
        j.sync()?;
        if let Some(Err(e)) = snap {
            return Err(e);
        }
        Ok(())
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::error!(error = %e, "store: close failed");
        }
    }
}

fn read_meta(dir: &Path) -> Result<StoreOptions> {
    let p = dir.join(meta::META_FILE);
    let Some(bytes) = memfs_journal::dir::read_file(dir, meta::META_FILE)? else {
        return Err(StoreError::Layout(format!(
            "{} is not a memfs store (no {} file)",
            dir.display(),
            meta::META_FILE
        )));
    };
    let text = String::from_utf8(bytes)
        .map_err(|e| io_err(&p)(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
    meta::decode(&text, &p)
}

fn join_snapshot(h: JoinHandle<Result<u64>>, shared: &Shared) -> Result<u64> {
    match h.join() {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "store: snapshot failed");
            Err(e)
        }
        Err(_) => {
            let e = StoreError::Failed("the snapshot thread panicked".into());
            shared.fail(&e);
            Err(e)
        }
    }
}

/// Undo buffers kept for reuse: one block's worth (a buffer per shard)
/// and some, so that the buffers of the block leaving the window serve the
/// next block. Freed and allocated again instead, they cost more than the
/// block's table work: the allocator returns the freed pages to the kernel,
/// which zeroes them again (2 MiB at a time with huge pages) when they come
/// back (perf, docs/store.md).
/// A crash during a snapshot leaves its temporary file behind: removes it.
/// (Through the journal's storage layer, like every file access of the
/// store, so a simulated disk registered for `dir` sees all of them.)
fn remove_snapshot_leftovers(dir: &Path) {
    if let Ok(names) = memfs_journal::dir::list_names(dir) {
        for name in names {
            if name.starts_with("snapshot-") && name.ends_with(".snap.tmp") {
                let _ = memfs_journal::dir::remove_file(dir, &name);
            }
        }
    }
}

fn spare_limit(shards: usize) -> usize {
    64.max(2 * shards + 2)
}

fn push_window(
    g: &mut WindowState,
    limit: u64,
    undo: Arc<UndoBlock>,
    spare: &mut Vec<Vec<u8>>,
    keep: usize,
) {
    g.bytes += undo.bytes();
    g.window.push_back(undo);
    while g.window.len() as u64 > limit {
        let old = g.window.pop_front().expect("non-empty");
        g.base = old.block;
        g.bytes -= old.bytes();
        // Recycle the buffers when nobody else (a snapshot) holds them.
        if let Ok(old) = Arc::try_unwrap(old) {
            for mut p in old.parts {
                if spare.len() < keep {
                    p.clear();
                    spare.push(p);
                }
            }
        }
    }
}

/// A block in its encoded form (see [`Store::set_encoded`]), owning its
/// buffer, with its entries indexed, hashed and bucketed by shard ahead of
/// [`Store::set_prepared`]. Reuse one per pipeline slot: nothing is
/// allocated once its buffers have grown.
#[derive(Default)]
pub struct PreparedBlock {
    bytes: Vec<u8>,
    /// The entries within `bytes`, once prepared.
    entries: Option<std::ops::Range<usize>>,
    kw: usize,
    shards: usize,
    offsets: Vec<u32>,
    hashes: Vec<u64>,
    by_shard: Vec<Vec<u32>>,
}

impl PreparedBlock {
    /// The buffer, to fill; this undoes [`prepare`](Self::prepare).
    pub fn bytes_mut(&mut self) -> &mut Vec<u8> {
        self.entries = None;
        &mut self.bytes
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Indexes the entries found at `entries` in the buffer, for a store
    /// with `key_width`-byte keys and `shards` shards. A malformed range or
    /// buffer is an error and leaves the block unprepared.
    pub fn prepare(
        &mut self,
        entries: std::ops::Range<usize>,
        key_width: usize,
        shards: usize,
    ) -> Result<()> {
        self.entries = None;
        let Some(bytes) = self.bytes.get(entries.clone()) else {
            return Err(StoreError::Malformed(format!(
                "entries at {entries:?} are outside the {}-byte buffer",
                self.bytes.len()
            )));
        };
        if shards == 0 {
            return Err(StoreError::Malformed(
                "a store has at least one shard".into(),
            ));
        }
        index_entries(bytes, key_width, &mut self.offsets)?;
        let ops = Encoded {
            bytes,
            offsets: &self.offsets,
            kw: key_width,
        };
        bucket(&ops, shards, &mut self.hashes, &mut self.by_shard);
        (self.kw, self.shards) = (key_width, shards);
        self.entries = Some(entries);
        Ok(())
    }
}

/// A block's operations, read by index.
trait Ops: Sync {
    fn len(&self) -> usize;
    fn key(&self, i: usize) -> &[u8];
    /// The new value; empty deletes.
    fn value(&self, i: usize) -> &[u8];
}

/// Operations given as (key, value) pairs.
struct Pairs<'a, K, V>(&'a [(K, V)]);

impl<K: AsRef<[u8]> + Sync, V: AsRef<[u8]> + Sync> Ops for Pairs<'_, K, V> {
    fn len(&self) -> usize {
        self.0.len()
    }
    #[inline]
    fn key(&self, i: usize) -> &[u8] {
        self.0[i].0.as_ref()
    }
    #[inline]
    fn value(&self, i: usize) -> &[u8] {
        self.0[i].1.as_ref()
    }
}

/// Operations in their encoded form, indexed by [`index_entries`].
struct Encoded<'a> {
    bytes: &'a [u8],
    offsets: &'a [u32],
    kw: usize,
}

impl Ops for Encoded<'_> {
    fn len(&self) -> usize {
        self.offsets.len()
    }
    #[inline]
    fn key(&self, i: usize) -> &[u8] {
        let o = self.offsets[i] as usize;
        &self.bytes[o..o + self.kw]
    }
    #[inline]
    fn value(&self, i: usize) -> &[u8] {
        let o = self.offsets[i] as usize + self.kw;
        let len = u16::from_le_bytes([self.bytes[o], self.bytes[o + 1]]) as usize;
        &self.bytes[o + 2..o + 2 + len]
    }
}

/// Fills `offsets` with the start of each entry of `bytes`
/// (`{ [key: kw][len u16][value] }*`), checking that the entries tile it.
fn index_entries(bytes: &[u8], kw: usize, offsets: &mut Vec<u32>) -> Result<()> {
    offsets.clear();
    if bytes.len() > u32::MAX as usize {
        return Err(StoreError::Malformed(format!(
            "an encoded block of {} bytes is too large (at most 4 GiB)",
            bytes.len()
        )));
    }
    let mut o = 0usize;
    while o < bytes.len() {
        let Some(len) = bytes.get(o + kw..o + kw + 2) else {
            let at = offsets.len();
            offsets.clear();
            return Err(StoreError::Malformed(format!(
                "entry {at} at byte {o} is cut short (key width {kw})"
            )));
        };
        let len = u16::from_le_bytes([len[0], len[1]]) as usize;
        let end = o + kw + 2 + len;
        if end > bytes.len() {
            let at = offsets.len();
            offsets.clear();
            return Err(StoreError::Malformed(format!(
                "the value of entry {at} at byte {o} ({len} bytes) runs past the end ({} bytes)",
                bytes.len()
            )));
        }
        offsets.push(o as u32);
        o = end;
    }
    Ok(())
}

/// Applies `ops` to the shards. Returns, per touched shard, the undo entries
/// (`[key][len][old value]`, for the rollback window).
/// What a caller of `apply_locked` already has of a block besides its
/// operations: `encoded`, their journal form (else it is encoded there);
/// `bucketed`, their key hashes and the operations of each shard (else
/// they are computed there).
struct Given<'a> {
    encoded: Option<&'a [u8]>,
    bucketed: Option<(&'a [u64], &'a [Vec<u32>])>,
}

/// The stages a block marks (off unless a measurement turned them on), for
/// its tables and its journal write: a prepared block is a follower's, an
/// encoded one the server's.
fn block_stages(prepared: bool) -> (stages::Stage, stages::Stage) {
    if prepared {
        (
            stages::Stage::FollowerTables,
            stages::Stage::FollowerJournal,
        )
    } else {
        (stages::Stage::WriterTables, stages::Stage::WriterJournal)
    }
}

/// Appends `ops` to `redo` in the journal's entry form, `[key][len u16][value]`.
fn encode_entries<O: Ops>(redo: &mut Vec<u8>, ops: &O, kw: usize) {
    redo.reserve(ops.len() * (kw + 2 + 8));
    for i in 0..ops.len() {
        let (k, v) = (ops.key(i), ops.value(i));
        redo.extend_from_slice(k);
        redo.extend_from_slice(&(v.len() as u16).to_le_bytes());
        redo.extend_from_slice(v);
    }
}

/// Journals a block through `commit` and updates the tables, at once (the
/// journal on a thread of its own) with `overlap`, else one after the other.
/// Returns the journal's answer, the undo parts and, with stage marks on,
/// when the tables were done.
fn commit_with_tables<O: Ops>(
    shared: &Shared,
    w: &mut Writer,
    ops: &O,
    bucketed: Option<(&[u64], &[Vec<u32>])>,
    overlap: bool,
    commit: impl FnOnce() -> memfs_journal::Result<u64> + Send,
) -> (memfs_journal::Result<u64>, Vec<Vec<u8>>, Option<Instant>) {
    let mut tables_done = None;
    let (res, undo) = if overlap {
        std::thread::scope(|sc| {
            let h = sc.spawn(commit);
            let undo = match bucketed {
                Some((h, b)) => apply_bucketed(shared, w, ops, h, b),
                None => apply_ops(shared, w, ops),
            };
            if stages::enabled() {
                tables_done = Some(Instant::now());
            }
            let res = h.join().unwrap_or_else(|_| {
                Err(memfs_journal::Error::Failed(
                    "journal thread panicked".into(),
                ))
            });
            (res, undo)
        })
    } else {
        let res = commit();
        // Nothing to undo when the journal refused the block: the store
        // fails below and the tables stay at the previous block.
        let undo = match (&res, bucketed) {
            (Err(_), _) => Vec::new(),
            (Ok(_), Some((h, b))) => apply_bucketed(shared, w, ops, h, b),
            (Ok(_), None) => apply_ops(shared, w, ops),
        };
        if stages::enabled() {
            tables_done = Some(Instant::now());
        }
        (res, undo)
    };
    (res, undo, tables_done)
}

fn apply_ops<O: Ops>(shared: &Shared, w: &mut Writer, ops: &O) -> Vec<Vec<u8>> {
    let mut hashes = std::mem::take(&mut w.hashes);
    let mut by_shard = std::mem::take(&mut w.by_shard);
    bucket(ops, shared.shards.len(), &mut hashes, &mut by_shard);
    let undo = apply_bucketed(shared, w, ops, &hashes, &by_shard);
    w.hashes = hashes;
    w.by_shard = by_shard;
    undo
}

/// Hashes every key of `ops` and lists the operation indices of each shard
/// (in block order).
fn bucket<O: Ops>(ops: &O, shards: usize, hashes: &mut Vec<u64>, by_shard: &mut Vec<Vec<u32>>) {
    hashes.clear();
    by_shard.resize_with(shards, Vec::new);
    for b in by_shard.iter_mut() {
        b.clear();
    }
    for i in 0..ops.len() {
        let h = hash_key(ops.key(i));
        hashes.push(h);
        by_shard[shard_of(h, shards)].push(i as u32);
    }
}

#[inline]
fn shard_of(h: u64, shards: usize) -> usize {
    (((h >> 32) * shards as u64) >> 32) as usize
}

/// [`apply_ops`] with the keys already hashed and bucketed by [`bucket`].
fn apply_bucketed<O: Ops>(
    shared: &Shared,
    w: &mut Writer,
    ops: &O,
    hashes: &[u64],
    by_shard: &[Vec<u32>],
) -> Vec<Vec<u8>> {
    let n = shared.shards.len();
    let kw = shared.kw;
    let apply_shard = |s: usize, undo: &mut Vec<u8>| {
        let idx = &by_shard[s];
        undo.reserve(idx.len() * (kw + 2 + 8));
        let mut t = shared.shards[s].write();
        for (j, &i) in idx.iter().enumerate() {
            if let Some(&ahead) = idx.get(j + PREFETCH_AHEAD) {
                t.prefetch(hashes[ahead as usize]);
            }
            let (k, v) = (ops.key(i as usize), ops.value(i as usize));
            let h = hashes[i as usize];
            undo.extend_from_slice(k);
            if v.is_empty() {
                t.remove(k, h, Some(undo));
            } else {
                t.set(k, h, v, Some(undo));
            }
        }
    };
    let mut parts = undo_buffers(w, by_shard, n, kw);
    let threads = w.opts.threads.min(n);
    if threads <= 1 || ops.len() < PARALLEL_MIN_OPS {
        for (s, buf) in parts.iter_mut().enumerate() {
            if !by_shard[s].is_empty() {
                apply_shard(s, buf);
            }
        }
    } else {
        // Work-stealing over shards: threads pull the next shard index.
        let next = AtomicUsize::new(0);
        let slots: Vec<Mutex<Vec<u8>>> = parts.drain(..).map(Mutex::new).collect();
        let work = || {
            loop {
                let s = next.fetch_add(1, Ordering::Relaxed);
                if s >= n {
                    break;
                }
                if !by_shard[s].is_empty() {
                    apply_shard(s, &mut slots[s].lock());
                }
            }
        };
        std::thread::scope(|sc| {
            for _ in 1..threads {
                sc.spawn(work);
            }
            work();
        });
        parts = slots.into_iter().map(Mutex::into_inner).collect();
    }
    parts.retain(|p| !p.is_empty());
    parts
}

/// One undo buffer for each of the `n` shards, empty for a shard the block does not touch.
///
/// The undo buffers are sized here, on the calling (long-lived) thread:
/// allocated on a short-lived worker, they came from that thread's fresh
/// allocator pages, and the page faults (2 MiB pages zeroed) cost as much
/// as applying the block (measured with perf, docs/store.md).
fn undo_buffers(w: &mut Writer, by_shard: &[Vec<u32>], n: usize, kw: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|s| {
            if by_shard[s].is_empty() {
                Vec::new()
            } else {
                let need = by_shard[s].len() * (kw + 2 + 8);
                let mut b = w.spare.pop().unwrap_or_default();
                if b.capacity() < need {
                    // Replaced, not grown: growing copies the old
                    // allocation (realloc does not know it is empty). A
                    // buffer recycled from another shard's share of an
                    // older block is often a little short; the headroom
                    // makes the next reuse fit.
                    b = Vec::with_capacity(need + need / 4);
                }
                b
            }
        })
        .collect()
}

/// Visits the entries of a buffer backwards as (key, old value): undoing them
/// in this order restores the state before the buffer's operations, whatever
/// the shards of the keys.
fn undo_entries(part: &[u8], kw: usize, mut f: impl FnMut(&[u8], &[u8])) -> Result<(), String> {
    let es: Vec<codec::Entry<'_>> = codec::entries(part, kw).collect::<Result<_, _>>()?;
    for e in es.iter().rev() {
        f(e.key, e.value);
    }
    Ok(())
}

/// key := value, where the empty value means absent.
#[inline]
fn restore(t: &mut Table, key: &[u8], h: u64, v: &[u8]) {
    if v.is_empty() {
        t.remove(key, h, None);
    } else {
        t.set(key, h, v, None);
    }
}

/// Window state rebuilt during recovery.
struct Recovered {
    window: VecDeque<Arc<UndoBlock>>,
    window_base: u64,
    current: u64,
    window_limit: u64,
    /// Commits up to this one are already reflected in the snapshot's window
    /// and block (its required end): replay only re-applies their writes.
    settled_upto: u64,
    pos: Vec<usize>,
    hashes: Vec<u64>,
}

impl Recovered {
    fn new(window_limit: u64) -> Recovered {
        Recovered {
            window: VecDeque::new(),
            window_base: 0,
            current: 0,
            window_limit,
            settled_upto: 0,
            pos: Vec::new(),
            hashes: Vec::new(),
        }
    }
}

/// Applies the entries of `body` (key := value) in order; with `undo`, also
/// records each key's previous value there, as the live path does.
fn replay_writes(
    body: &[u8],
    kw: usize,
    tables: &mut [Table],
    rec: &mut Recovered,
    mut undo: Option<&mut Vec<u8>>,
) -> Result<(), String> {
    let n = tables.len() as u64;
    let shard_of = |h: u64| (((h >> 32) * n) >> 32) as usize;
    // Pass 1 finds entries and hashes; pass 2 applies them with the home slots
    // prefetched a few entries ahead, like the live path.
    rec.pos.clear();
    rec.hashes.clear();
    for (pos, e) in codec::entry_positions(body, kw) {
        let e = e?;
        rec.pos.push(pos);
        rec.hashes.push(hash_key(e.key));
    }
    for j in 0..rec.pos.len() {
        if let Some(&ha) = rec.hashes.get(j + PREFETCH_AHEAD) {
            tables[shard_of(ha)].prefetch(ha);
        }
        let (e, _) = codec::decode_at(body, rec.pos[j], kw)?;
        let h = rec.hashes[j];
        let t = &mut tables[shard_of(h)];
        match undo.as_deref_mut() {
            Some(u) => {
                u.extend_from_slice(e.key);
                if e.value.is_empty() {
                    t.remove(e.key, h, Some(u));
                } else {
                    t.set(e.key, h, e.value, Some(u));
                }
            }
            None => restore(t, e.key, h, e.value),
        }
    }
    Ok(())
}

fn replay_commit(
    id: u64,
    payload: &[u8],
    kw: usize,
    tables: &mut [Table],
    rec: &mut Recovered,
) -> Result<(), String> {
    let settled = id <= rec.settled_upto;
    match codec::decode(payload)? {
        codec::Decoded::Block { block, body } => {
            if settled {
                return replay_writes(body, kw, tables, rec, None);
            }
            if block <= rec.current {
                return Err(format!(
                    "block {block} does not follow block {}",
                    rec.current
                ));
            }
            let mut undo = Vec::with_capacity(body.len());
            replay_writes(body, kw, tables, rec, Some(&mut undo))?;
            // The window keeps the block as one buffer: undo order does not
            // depend on shards (see `undo_entries`).
            rec.window.push_back(Arc::new(UndoBlock {
                block,
                parts: vec![undo],
            }));
            while rec.window.len() as u64 > rec.window_limit {
                rec.window_base = rec.window.pop_front().expect("non-empty").block;
            }
            rec.current = block;
        }
        codec::Decoded::Rollback {
            target,
            current,
            body,
        } => {
            if settled {
                return replay_writes(body, kw, tables, rec, None);
            }
            if target < rec.window_base || target > rec.current {
                return Err(format!(
                    "rollback to block {target} outside the window {}..={} (was the rollback window reduced?)",
                    rec.window_base, rec.current
                ));
            }
            while rec.window.back().is_some_and(|u| u.block > target) {
                rec.window.pop_back();
            }
            let now = rec.window.back().map_or(rec.window_base, |u| u.block);
            if now != current {
                return Err(format!(
                    "rollback to block {target} reached block {now}, the journal says {current}"
                ));
            }
            replay_writes(body, kw, tables, rec, None)?;
            rec.current = now;
        }
    }
    Ok(())
}

struct SnapshotJob {
    shared: Arc<Shared>,
    journal: Arc<Journal>,
    commit: u64,
    shards: usize,
}

const SNAP_VERSION: u32 = 2;

impl SnapshotJob {
    fn run(self) -> Result<u64> {
        let dir = self.shared.dir.clone();
        let mut sw = CheckpointWriter::create(&dir, self.commit)?;
        let (block, required_end) = match self.write_body(&mut sw) {
            Ok(x) => x,
            Err(e) => {
                sw.abandon();
                return Err(e);
            }
        };
        // The copy may contain blocks applied after `commit`; the journal must
        // be durable through every one of them before the manifest points at
        // this snapshot (recovery replays up to there).
        self.journal.wait_durable(required_end)?;
        let path = sw.finish()?;
        let mut m = Manifest {
            checkpoint: Some(CheckpointRef {
                commit: self.commit,
                required_end,
            }),
            ..Default::default()
        };
        m.publish(&dir)?;
        let pruned = self.journal.prune(self.commit)?;
        for (c, _) in list_checkpoints(&dir)? {
            if c < self.commit {
                memfs_journal::dir::remove_file(&dir, &checkpoint_file_name(c))?;
            }
        }
        let bytes = memfs_journal::dir::file_len(&path).unwrap_or(0);
        let mt = &self.shared.metrics;
        mt.snapshots.fetch_add(1, Ordering::Relaxed);
        mt.last_snapshot_block.store(block, Ordering::Relaxed);
        mt.last_snapshot_bytes.store(bytes, Ordering::Relaxed);
        tracing::info!(
            commit = self.commit,
            block,
            bytes,
            pruned,
            "snapshot written"
        );
        Ok(self.commit)
    }

    /// Streams the tables, then (block, window, last commit) taken together
    /// under the gate once the copy is done. Returns (block, last commit).
    fn write_body(&self, sw: &mut CheckpointWriter) -> Result<(u64, u64)> {
        let dir = self.shared.dir.clone();
        let mut hdr = Vec::new();
        hdr.extend_from_slice(&SNAP_VERSION.to_le_bytes());
        hdr.extend_from_slice(&(self.shared.kw as u32).to_le_bytes());
        hdr.extend_from_slice(&(self.shards as u32).to_le_bytes());
        sw.write_all(&hdr).map_err(io_err(&dir))?;
        let mut buf = Vec::with_capacity(1 << 20);
        for s in &self.shared.shards {
            // Hold the shard only for a memcpy-speed clone; serialise outside.
            let copy = s.read().clone();
            buf.clear();
            buf.extend_from_slice(&(copy.len() as u64).to_le_bytes());
            let mut err = None;
            copy.for_each(|k, v| {
                buf.extend_from_slice(k);
                buf.extend_from_slice(&(v.len() as u16).to_le_bytes());
                buf.extend_from_slice(v);
                if buf.len() >= 1 << 20 && err.is_none() {
                    err = sw.write_all(&buf).err();
                    buf.clear();
                }
            });
            if let Some(x) = err {
                return Err(io_err(&dir)(x));
            }
            sw.write_all(&buf).map_err(io_err(&dir))?;
        }
        let (block, base, last, window) = {
            let g = self.shared.gate.lock();
            (
                self.shared.current.load(Ordering::Acquire),
                g.base,
                self.journal.last_commit(),
                g.window.iter().cloned().collect::<Vec<_>>(),
            )
        };
        buf.clear();
        buf.extend_from_slice(&block.to_le_bytes());
        buf.extend_from_slice(&base.to_le_bytes());
        buf.extend_from_slice(&last.to_le_bytes());
        buf.extend_from_slice(&(window.len() as u32).to_le_bytes());
        sw.write_all(&buf).map_err(io_err(&dir))?;
        for u in &window {
            buf.clear();
            buf.extend_from_slice(&u.block.to_le_bytes());
            buf.extend_from_slice(&(u.parts.len() as u32).to_le_bytes());
            sw.write_all(&buf).map_err(io_err(&dir))?;
            for p in &u.parts {
                sw.write_all(&(p.len() as u32).to_le_bytes())
                    .and_then(|_| sw.write_all(p))
                    .map_err(io_err(&dir))?;
            }
        }
        Ok((block, last))
    }
}

fn load_snapshot(
    path: &Path,
    opts: &StoreOptions,
    tables: &mut [Table],
    rec: &mut Recovered,
) -> Result<u64> {
    let mut r = CheckpointReader::open(path)?;
    let corrupt = |e: std::io::Error| StoreError::Corrupt(e.to_string());
    let bad = |what: String| StoreError::Corrupt(format!("snapshot {}: {what}", path.display()));
    let version = read_u32(&mut r).map_err(corrupt)?;
    if version != SNAP_VERSION {
        return Err(bad(format!("unsupported store snapshot version {version}")));
    }
    let kw = read_u32(&mut r).map_err(corrupt)? as usize;
    let shards = read_u32(&mut r).map_err(corrupt)? as usize;
    if kw != opts.key_width || shards != opts.shards {
        return Err(bad(format!(
            "written for {kw}-byte keys and {shards} shards, the store has {} and {}",
            opts.key_width, opts.shards
        )));
    }
    let mut total = 0u64;
    let mut key = vec![0u8; kw];
    let mut val = vec![0u8; MAX_VALUE_LEN];
    for t in tables.iter_mut() {
        let count = read_u64(&mut r).map_err(corrupt)?;
        for _ in 0..count {
            r.read_exact(&mut key).map_err(corrupt)?;
            let mut lb = [0u8; 2];
            r.read_exact(&mut lb).map_err(corrupt)?;
            let len = u16::from_le_bytes(lb) as usize;
            if len == 0 {
                return Err(bad("empty value in snapshot".into()));
            }
            r.read_exact(&mut val[..len]).map_err(corrupt)?;
            t.set(&key, hash_key(&key), &val[..len], None);
        }
        total += count;
    }
    load_window(&mut r, path, rec)?;
    r.finish().map_err(corrupt)?;
    Ok(total)
}

/// Reads the end of a snapshot: the current block and the rollback window,
/// cut to the store's window limit.
fn load_window(r: &mut CheckpointReader, path: &Path, rec: &mut Recovered) -> Result<()> {
    let corrupt = |e: std::io::Error| StoreError::Corrupt(e.to_string());
    let bad = |what: String| StoreError::Corrupt(format!("snapshot {}: {what}", path.display()));
    rec.current = read_u64(r).map_err(corrupt)?;
    rec.window_base = read_u64(r).map_err(corrupt)?;
    rec.settled_upto = read_u64(r).map_err(corrupt)?;
    let nwin = read_u32(r).map_err(corrupt)?;
    for _ in 0..nwin {
        let block = read_u64(r).map_err(corrupt)?;
        let nparts = read_u32(r).map_err(corrupt)?;
        let mut parts = Vec::new();
        for _ in 0..nparts {
            let len = read_u32(r).map_err(corrupt)? as usize;
            let mut p = Vec::new();
            r.take(len as u64).read_to_end(&mut p).map_err(corrupt)?;
            if p.len() != len {
                return Err(bad("window entry truncated".into()));
            }
            parts.push(p);
        }
        rec.window.push_back(Arc::new(UndoBlock { block, parts }));
    }
    while rec.window.len() as u64 > rec.window_limit {
        rec.window_base = rec.window.pop_front().expect("non-empty").block;
    }
    Ok(())
}

fn read_u32(r: &mut CheckpointReader) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64(r: &mut CheckpointReader) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// What [`verify`] found.
#[derive(Debug, Clone, Default)]
pub struct VerifyReport {
    pub options: Option<StoreOptions>,
    pub journal: memfs_journal::VerifyReport,
    /// The snapshot named by the manifest: its commit and entry count.
    pub snapshot: Option<(u64, u64)>,
    /// The block a recovery would reach, when replay succeeded.
    pub block: Option<u64>,
    pub commits_replayed: u64,
    /// Every problem found, each naming the file concerned.
    pub problems: Vec<String>,
}

impl VerifyReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks every checksum of the store in `dir` and that journal and snapshot
/// agree, by loading the snapshot and replaying the journal in memory. Changes
/// nothing on disk; needs the directory's lock (refused while a store is open).
pub fn verify(dir: impl AsRef<Path>) -> Result<VerifyReport> {
    let dir = dir.as_ref();
    let _dd = DataDir::open(dir, false)?;
    let mut r = VerifyReport::default();
    let opts = match read_meta(dir) {
        Ok(o) => o,
        Err(e) => {
            r.problems.push(e.to_string());
            return Ok(r);
        }
    };
    r.options = Some(opts.clone());
    r.journal = memfs_journal::recovery::verify(dir)?;
    if let Some(d) = &r.journal.corruption {
        r.problems.push(format!(
            "journal: {} at offset {}: {}",
            d.file.display(),
            d.offset,
            d.reason
        ));
    }
    let snap = match Manifest::load(dir) {
        Ok(m) => m.and_then(|m| m.checkpoint),
        Err(e) => {
            r.problems.push(e.to_string());
            return Ok(r);
        }
    };
    replay_snapshot_and_journal(dir, &opts, snap, &mut r);
    Ok(r)
}

/// The part of [`verify`] that loads the snapshot `snap` (if any) and replays
/// the journal after it, noting in `r` what it reaches and what is wrong.
fn replay_snapshot_and_journal(
    dir: &Path,
    opts: &StoreOptions,
    snap: Option<CheckpointRef>,
    r: &mut VerifyReport,
) {
    let mut tables: Vec<Table> = (0..opts.shards)
        .map(|_| Table::new(opts.key_width, 16))
        .collect();
    let mut rec = Recovered::new(opts.rollback_window);
    let after = match snap {
        Some(s) => {
            let path = dir.join(checkpoint_file_name(s.commit));
            match load_snapshot(&path, opts, &mut tables, &mut rec) {
                Ok(n) => r.snapshot = Some((s.commit, n)),
                Err(e) => {
                    r.problems.push(format!("snapshot {}: {e}", path.display()));
                    return;
                }
            }
            s.commit
        }
        None => 0,
    };
    let kw = opts.key_width;
    match memfs_journal::recovery::replay_readonly(dir, after, &mut |id, p| {
        replay_commit(id, p, kw, &mut tables, &mut rec)
    }) {
        Ok(rep) => {
            r.commits_replayed = rep.commits_replayed;
            if let Some(s) = snap
                && rep.last_commit < s.required_end
            {
                r.problems.push(format!(
                    "the snapshot at commit {} needs the journal up to commit {}, but it ends at commit {}",
                    s.commit, s.required_end, rep.last_commit
                ));
            } else {
                r.block = Some(rec.current);
            }
        }
        Err(e) => {
            let msg = e.to_string();
            if !r.problems.iter().any(|p| p.contains(&msg)) && r.journal.corruption.is_none() {
                r.problems.push(msg);
            }
        }
    }
}

/// Truncates a damaged journal to its last intact commit (see
/// [`memfs_journal::recovery::repair`]); print [`verify`]'s report first so the
/// user knows what is lost.
pub fn repair(dir: impl AsRef<Path>) -> Result<memfs_journal::RepairReport> {
    let dir = dir.as_ref();
    let _dd = DataDir::open(dir, false)?;
    Ok(memfs_journal::recovery::repair(dir)?)
}

/// Staged writes of one block; reads see them. Dropping it aborts.
pub struct BlockBuilder<'a> {
    store: &'a Store,
    block: u64,
    ops: Vec<(Vec<u8>, Vec<u8>)>,
    staged: std::collections::HashMap<Vec<u8>, Vec<u8>>,
}

impl BlockBuilder<'_> {
    pub fn block(&self) -> u64 {
        self.block
    }

    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        check_key(self.store.shared.kw, key)?;
        if value.len() > MAX_VALUE_LEN {
            return Err(StoreError::ValueTooLarge { len: value.len() });
        }
        self.ops.push((key.to_vec(), value.to_vec()));
        self.staged.insert(key.to_vec(), value.to_vec());
        Ok(())
    }

    pub fn delete(&mut self, key: &[u8]) -> Result<()> {
        self.put(key, b"")
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        match self.staged.get(key) {
            Some(v) if v.is_empty() => Ok(None),
            Some(v) => Ok(Some(v.clone())),
            None => self.store.get(key),
        }
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    pub fn commit(self) -> Result<()> {
        self.store.set(self.block, &self.ops)
    }

    pub fn abort(self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// The undo buffers of the block leaving the rollback window serve the
    /// next block: once the window is full, applying blocks allocates no
    /// new undo buffer, though each shard's share of a block varies. (Before,
    /// a recycled buffer a little too short for its new shard was grown by
    /// realloc and the freed one given back to the kernel: perf showed the
    /// kernel zeroing those pages again in a quarter of a follower's apply
    /// thread's samples, docs/store.md.)
    #[test]
    fn undo_buffers_are_reused_once_the_window_is_full() {
        let tmp = tempfile::tempdir().unwrap();
        let window = 6u64;
        let s = Store::create(
            tmp.path().join("s"),
            StoreOptions {
                shards: 4,
                threads: 1,
                durability: Durability::None,
                rollback_window: window,
                snapshot_interval: 0,
                ..Default::default()
            },
        )
        .unwrap();
        let buffers = |s: &Store| -> Vec<usize> {
            let g = s.shared.gate.lock();
            let last = g.window.back().expect("a block");
            last.parts.iter().map(|p| p.as_ptr() as usize).collect()
        };
        // Until block `window + 1` every block needs new buffers (nothing
        // has left the window yet); from then on, those of the block that
        // left.
        let mut allocated = HashSet::new();
        let mut next = 0u64;
        for b in 1..=window * 5 {
            // 600 inserts and 500 deletes (of keys inserted two blocks
            // before, or absent at first): the same size of block, but each
            // shard's share of it differs from block to block.
            let mut ops: Vec<([u8; 8], Vec<u8>)> = (next..next + 600)
                .map(|k| (k.to_le_bytes(), k.to_le_bytes().to_vec()))
                .collect();
            let old = match next.checked_sub(1200) {
                Some(o) => o,
                None => (1 << 40) + next,
            };
            ops.extend((old..old + 500).map(|k| (k.to_le_bytes(), Vec::new())));
            next += 600;
            s.set(b, &ops).unwrap();
            let bufs = buffers(&s);
            assert_eq!(bufs.len(), 4, "block {b} touches every shard");
            for p in bufs {
                if b <= window + 1 {
                    assert!(allocated.insert(p), "block {b} shares a buffer");
                } else {
                    assert!(
                        allocated.contains(&p),
                        "block {b} allocated a new undo buffer"
                    );
                }
            }
        }
        // The spare pool stays bounded.
        assert!(s.w.lock().spare.len() <= spare_limit(4));
    }
}
