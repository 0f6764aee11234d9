//! File contents on a volume (docs/cluster.md, "A write, from write(2) to a
//! replica"): each mount's dirty buffers, reads that merge them over the
//! cluster's blocks, and the one fenced script that commits a file's new
//! blocks into its block map.
//!
//! - A file's data is blocks of `block_size` bytes. Its *block map*
//!   `{V}:c:<ino hex>` names, per block index, an immutable block and how
//!   many of its bytes count ([`Entry`]); an absent index is a hole.
//! - A write fills whole blocks in this mount's dirty buffer (a partial
//!   block starts as a copy of the committed one). A flush writes every
//!   dirty block as a **new** block (new ids, so no reader ever sees a
//!   half-written block), then one script swaps the map entries, sets the
//!   size and times and appends a `write` feed entry, then the replaced
//!   blocks are deleted. A failure before the script (OOM: ENOSPC) leaves
//!   the file as it was, and the new blocks are deleted again.
//! - Locking is per file (the file's state mutex, held across that file's
//!   cluster calls so that its flushes are ordered); nothing global is held
//!   across a cluster call.
//! - The mount's dirty bytes are bounded ([`DIRTY_LIMIT`]): a write that
//!   would pass the bound first flushes the file with the most dirty bytes,
//!   or, while another thread is flushing that one, goes on up to twice
//!   the bound (so that one flush does not stop every writer).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use memfs_fs::{Errno, FallocateMode};
use parking_lot::Mutex;
use redis::Script;

use crate::blocks::{Block, Blocks, Entry, map_field, map_key, retry};
use crate::error::{Error, Result};
use crate::feed::FeedKey;
use crate::handle::{Handle, now_ns};
use crate::keys::Keys;
use crate::record::{self, Record};
use crate::slot::key_slot;

/// Dirty bytes a mount holds at most before a write flushes the largest
/// dirty file.
pub const DIRTY_LIMIT: u64 = 64 << 20;
/// Times a read refetches a stale block map before it gives up (EIO).
const STALE_RETRIES: usize = 3;
/// Replaced blocks a mount queues at most before it unlinks them by
/// themselves; below that they go out in the pipeline of the next flush's
/// blocks (one round trip less per flush).
const FREE_BATCH: usize = 1024;
/// A file's commits since its last sync whose feed entries the sync
/// checks at most: the last ones. A commit lost in a failover is one of
/// those its master ran in the moment before it died, so only a file
/// committed this often again after a failover, with no sync between,
/// would slip by.
const UNSYNCED_COMMITS: usize = 1024;
/// Bytes a copy_range moves per read and write.
const COPY_CHUNK: u64 = 1 << 20;
/// The largest file (as the engine's `MAX_FILE_SIZE`).
const MAX_SIZE: u64 = i64::MAX as u64;
/// What a read hands out for holes and for bytes past a block's length,
/// a slice at a time, instead of zero-filling a buffer.
static ZEROS: [u8; 65536] = [0; 65536];
/// Slices a read hands its caller at most: the adapter gathers them into
/// one `writev` of the reply, which takes at most `UIO_MAXIOV` (1024). A
/// read that would need more is copied into one buffer first.
const MAX_SLICES: usize = 512;

/// Commits a file's data change (see the module doc), atomically.
/// KEYS: {V}:meta, the block map, the record's group.
/// ARGV 4..: op (feed name), ino (decimal), record field, size rule
/// (`max`, `set`, `keep`), size (8 bytes LE), drop from (block index,
/// decimal, or empty), drop to (inclusive, or empty: to the end), cut field
/// (hex, or empty), cut length, then pairs of field and 12-byte value.
/// Returns the new record, then every map value it replaced or dropped,
/// then (last, an array: a caller that reads only strings stops before it)
/// the feed entry's id and the ids of the other live sessions, whose acks
/// of that entry the writer's close waits for ([`Data::await_acks`]).
const COMMIT: &str = r"
fence()
local map, grp, field = KEYS[2], KEYS[3], ARGV[6]
local r = redis.call('HGET', grp, field)
if not r then fail('ENOENT') end
if kind(r) == KIND_DIR then fail('EISDIR') end
if kind(r) ~= KIND_FILE then fail('EINVAL') end
local out = {false}
if ARGV[9] ~= '' then
  local lo = tonumber(ARGV[9])
  local hi = nil
  if ARGV[10] ~= '' then hi = tonumber(ARGV[10]) end
  if hi and hi - lo < 256 then
    for i = lo, hi do
      local f = hex(i)
      local v = redis.call('HGET', map, f)
      if v then
        out[#out + 1] = v
        redis.call('HDEL', map, f)
      end
    end
  else
    local all = redis.call('HGETALL', map)
    for j = 1, #all, 2 do
      local i = tonumber(all[j], 16)
      if i >= lo and (not hi or i <= hi) then
        out[#out + 1] = all[j + 1]
        redis.call('HDEL', map, all[j])
      end
    end
  end
end
if ARGV[11] ~= '' then
  local v = redis.call('HGET', map, ARGV[11])
  local cut = tonumber(ARGV[12])
  if v and get_u32(v, 8) > cut then
    redis.call('HSET', map, ARGV[11], string.sub(v, 1, 8) .. struct.pack('<I4', cut))
  end
end
for i = 13, #ARGV, 2 do
  local prev = redis.call('HGET', map, ARGV[i])
  if prev and prev ~= ARGV[i + 1] then out[#out + 1] = prev end
  redis.call('HSET', map, ARGV[i], ARGV[i + 1])
end
local cur, new = string.sub(r, OFF_SIZE + 1, OFF_SIZE + 8), ARGV[8]
local grow = get_u32(cur, 4) < get_u32(new, 4)
  or (get_u32(cur, 4) == get_u32(new, 4) and get_u32(cur, 0) < get_u32(new, 0))
if ARGV[7] == 'set' or (ARGV[7] == 'max' and grow) then
  r = set_bytes(r, OFF_SIZE, new)
end
r = set_bytes(set_bytes(r, OFF_MTIME, NOW), OFF_CTIME, NOW)
redis.call('HSET', grp, field, r)
local fid = feed('op', ARGV[4], 'ino', ARGV[5])
out[1] = r
local acks = others_live()
table.insert(acks, 1, fid)
out[#out + 1] = acks
return out
";

/// Where sessions ARGV 4.. stand in reading the feed: per sid its ack
/// (`{V}:acks`, the last entry id its feed reader applied; '' for none yet),
/// or `gone` when its lease ran out by the server's clock or it ended (it
/// no longer counts: a session that lost its lease serves no open from its
/// cache, volume.rs `Inner::fresh`). Read-only.
const ACKS: &str = r"
local now = now_ms()
local out = {}
for i = 4, #ARGV do
  local d = redis.call('ZSCORE', P .. 'sessions', ARGV[i])
  if not d or tonumber(d) < now then
    out[#out + 1] = 'gone'
  else
    out[#out + 1] = redis.call('HGET', P .. 'acks', ARGV[i]) or ''
  end
end
return out
";

/// The bound on a close's wait for the others' acks: past it the close
/// returns anyway, and the readers' rule (an open is served from the cache
/// only within [`crate::feed::FRESH`] of a caught-up read, less than this)
/// keeps close-to-open.
pub const ACK_WAIT: Duration = Duration::from_secs(2);
/// The first pause between two polls of the acks (a reader on the same
/// host acks within tens of µs), doubled up to [`ACK_POLL_MAX`].
const ACK_POLL_MIN: Duration = Duration::from_micros(50);
const ACK_POLL_MAX: Duration = Duration::from_millis(5);

/// The record of a node (read-only; no fencing needed).
const RECORD: &str = r"
local r = redis.call('HGET', KEYS[2], ARGV[4])
if not r then fail('ENOENT') end
return r
";

/// What a commit does to the size.
#[derive(Clone, Copy)]
enum SizeRule {
    /// size = max(size, n): a write.
    Max(u64),
    /// size = n: a truncate.
    Set(u64),
    /// Only the times change.
    Keep,
}

/// Map entries a commit drops, and a boundary block whose length it cuts.
#[derive(Clone, Copy, Default)]
struct Cut {
    /// Block indices `[lo, hi]` (`hi` None: to the end).
    drop: Option<(u64, Option<u64>)>,
    /// Block index and the length it keeps at most.
    cut: Option<(u64, u32)>,
}

/// One file's state on this mount.
#[derive(Default)]
struct FileState {
    /// The committed block map as last read or written; None: read it.
    map: Option<BTreeMap<u64, Entry>>,
    /// Dirty blocks: index → the block's bytes (its length is the block's).
    dirty: BTreeMap<u64, Block>,
    /// The size with the dirty data, while there is some.
    size: u64,
    /// When the dirty data was last written (ns).
    mtime: i64,
    /// A key in each slot that took a block or a script of this file since
    /// its last acknowledged sync, by slot.
    unsynced: BTreeMap<u16, String>,
    /// The blocks committed since the last acknowledged sync, `(index,
    /// id)`: the sync checks that those the map still names exist after
    /// its `WAIT`, by index, so it costs what it checks, not the map's size.
    /// One per index (the last id written there: an older one is no longer
    /// named), so it is bounded by the file's blocks however often they are
    /// rewritten between syncs.
    unsynced_ids: BTreeMap<u64, u64>,
    /// The feed ids of this mount's commits of the file since its last
    /// sync, oldest first, at most [`UNSYNCED_COMMITS`]: the sync checks
    /// that the metadata master still holds each ([`Data::commits_lost`]).
    unsynced_commits: VecDeque<(u64, u64)>,
    /// `Data::losses` + 1 when an open last checked the file
    /// ([`Data::pages_current`]); 0: never.
    checked: u64,
    /// The acks this mount's commits of the file wait for: the next close
    /// or fsync pays them ([`Data::await_acks`]).
    owed: Option<Owed>,
    /// A wait for acks of this file ran out once: later ones stay quiet.
    warned: bool,
}

/// A commit's feed entry and the other sessions that were live when it ran
/// (docs/cluster.md, "Many mounts, one truth").
#[derive(Clone, Debug, PartialEq, Eq)]
struct Owed {
    /// The entry's stream id, `(ms, seq)`.
    id: (u64, u64),
    sids: Vec<u64>,
}

/// A commit script's feed entry: its id, by which a sync tells that the
/// commit outlived a failover, and the acks the writer owes for it.
struct Entered {
    id: (u64, u64),
    owed: Option<Owed>,
}

impl Owed {
    /// The commit script's last item: the entry's id, then the sids (none
    /// when no other session was live: nothing to wait for).
    fn parse(a: &[redis::Value]) -> Result<Entered> {
        let Some((id, sids)) = a.split_first() else {
            return Err(Error::Protocol("commit script: no feed id".into()));
        };
        let id = String::from_utf8_lossy(&crate::namespace::bytes(Some(id))?).into_owned();
        let sids = sids
            .iter()
            .map(|v| crate::namespace::int(Some(v)))
            .collect::<Result<Vec<u64>>>()?;
        let id = crate::feed::id_of(&id);
        Ok(Entered {
            id,
            owed: (!sids.is_empty()).then_some(Owed { id, sids }),
        })
    }

    /// What two commits owe together: the later entry, acked by every
    /// session either named (an ack of the later id covers the earlier).
    fn merge(mut self, o: Owed) -> Owed {
        self.id = self.id.max(o.id);
        for s in o.sids {
            if !self.sids.contains(&s) {
                self.sids.push(s);
            }
        }
        self
    }
}

struct File {
    /// Held across a commit's cluster calls (lock order: this, then
    /// `st`), so that the commits of one file are ordered; `st` is held
    /// across them only by truncate and fallocate.
    order: Mutex<()>,
    st: Mutex<FileState>,
    /// The bytes in `st.dirty`, readable without its lock.
    dirty_bytes: AtomicU64,
}

/// File contents for one mount.
pub struct Data {
    h: Arc<Handle>,
    blocks: Blocks,
    files: Mutex<HashMap<u64, Arc<File>>>,
    dirty_total: AtomicU64,
    /// [`DIRTY_LIMIT`] unless a test set another.
    dirty_limit: AtomicU64,
    /// Times this mount lost track of the others' changes
    /// ([`Data::invalidate_all`]): what it checked before may be stale.
    losses: AtomicU64,
    /// Blocks replaced by this mount's commits, not unlinked yet.
    to_free: Mutex<Vec<u64>>,
    commit: Script,
    record: Script,
    acks: Script,
    /// Waits for acks that ran out ([`ACK_WAIT`]).
    ack_timeouts: AtomicU64,
}

fn errno(e: Errno) -> Error {
    Error::Errno(e)
}

impl Data {
    pub fn new(h: Arc<Handle>, cache_bytes: u64) -> Data {
        Data {
            blocks: Blocks::new(h.clone(), cache_bytes),
            h,
            files: Mutex::new(HashMap::new()),
            dirty_total: AtomicU64::new(0),
            dirty_limit: AtomicU64::new(DIRTY_LIMIT),
            losses: AtomicU64::new(0),
            to_free: Mutex::new(Vec::new()),
            commit: Script::new(&crate::lua::script(COMMIT)),
            record: Script::new(&crate::lua::read_script(RECORD)),
            acks: Script::new(&crate::lua::read_script(ACKS)),
            ack_timeouts: AtomicU64::new(0),
        }
    }

    fn bs(&self) -> u64 {
        u64::from(self.h.block_size)
    }

    fn file(&self, ino: u64) -> Arc<File> {
        self.files
            .lock()
            .entry(ino)
            .or_insert_with(|| {
                Arc::new(File {
                    order: Mutex::new(()),
                    st: Mutex::new(FileState::default()),
                    dirty_bytes: AtomicU64::new(0),
                })
            })
            .clone()
    }

    fn existing(&self, ino: u64) -> Option<Arc<File>> {
        self.files.lock().get(&ino).cloned()
    }

    /// Keeps the mount's and the file's dirty counts equal to `st.dirty`.
    fn account(&self, f: &File, st: &FileState) {
        let now: u64 = st.dirty.values().map(|b| b.len() as u64).sum();
        let was = f.dirty_bytes.swap(now, Ordering::AcqRel);
        if now >= was {
            self.dirty_total.fetch_add(now - was, Ordering::AcqRel);
        } else {
            self.dirty_total.fetch_sub(was - now, Ordering::AcqRel);
        }
    }

    /// The cluster's block map of `ino`.
    fn fetch_map(&self, ino: u64) -> Result<BTreeMap<u64, Entry>> {
        let key = map_key(&self.h, ino);
        let raw: Vec<(Vec<u8>, Vec<u8>)> =
            retry(&self.h, |c| redis::cmd("HGETALL").arg(&key).query(c))?;
        let mut map = BTreeMap::new();
        for (f, v) in raw {
            let idx = std::str::from_utf8(&f)
                .ok()
                .and_then(|s| u64::from_str_radix(s, 16).ok())
                .ok_or_else(|| Error::Protocol(format!("block map field {f:?} of {key}")))?;
            map.insert(idx, Entry::decode(&v)?);
        }
        Ok(map)
    }

    /// `st`'s block map, read from the cluster if it is not cached.
    fn map<'a>(&self, ino: u64, st: &'a mut FileState) -> Result<&'a BTreeMap<u64, Entry>> {
        if st.map.is_none() {
            st.map = Some(self.fetch_map(ino)?);
        }
        Ok(st.map.get_or_insert_with(BTreeMap::new))
    }

    /// The committed bytes of blocks `idxs` that the map names (None for a
    /// hole), each clipped to its entry's length. A block the cluster no
    /// longer has means the map is stale: it is read again, a few times.
    fn committed(
        &self,
        ino: u64,
        st: &mut FileState,
        idxs: &[u64],
    ) -> Result<Vec<Option<(Block, usize)>>> {
        for _ in 0..STALE_RETRIES {
            let map = self.map(ino, st)?;
            let entries: Vec<Option<Entry>> = idxs.iter().map(|i| map.get(i).copied()).collect();
            let ids: Vec<u64> = entries.iter().flatten().map(|e| e.id).collect();
            let got = self.blocks.get_many(&ids)?;
            if got.iter().all(Option::is_some) {
                let mut got = got.into_iter().flatten();
                return Ok(entries
                    .iter()
                    .map(|e| {
                        let e = (*e)?;
                        let b = got.next()?;
                        let len = (e.len as usize).min(b.len());
                        Some((b, len))
                    })
                    .collect());
            }
            tracing::debug!(ino, "a block of the map is gone: reading the map again");
            st.map = None;
        }
        tracing::warn!(ino, "block map names blocks the cluster does not have");
        Err(errno(Errno::EIO))
    }

    /// Buffers a write (read-modify-write of partial blocks fetches the old
    /// block). `size` is the file's size as the caller knows it; returns the
    /// new local size. Flushes by itself when the mount's dirty bytes pass
    /// a bound.
    pub fn write(&self, ino: u64, off: u64, data: &[u8], size: u64) -> Result<u64> {
        self.write_parts(ino, off, &[data], size)
    }

    /// [`Data::write`] of the bytes of `parts`, one after the other (the
    /// kernel's pages of a write): each byte is copied once, into its
    /// dirty block, and a whole block is never zero-filled first.
    pub fn write_parts(&self, ino: u64, off: u64, parts: &[&[u8]], size: u64) -> Result<u64> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let end = off
            .checked_add(len as u64)
            .filter(|&e| e <= MAX_SIZE)
            .ok_or(errno(Errno::EFBIG))?;
        let limit = self.dirty_limit.load(Ordering::Relaxed);
        // A few rounds at most: other writers may be filling it again.
        for _ in 0..4 {
            let total = self.dirty_total.load(Ordering::Acquire);
            if total == 0 || total + len as u64 <= limit {
                break;
            }
            // While another thread flushes the largest file, writes go on
            // up to twice the bound rather than wait for it.
            let wait = total + len as u64 > 2 * limit;
            if !self.flush_largest(wait)? {
                break;
            }
        }
        let f = self.file(ino);
        let mut st = f.st.lock();
        if st.dirty.is_empty() {
            st.size = size;
        } else {
            st.size = st.size.max(size);
        }
        if len == 0 {
            return Ok(st.size);
        }
        let bs = self.bs();
        let (first, last) = (off / bs, (end - 1) / bs);
        self.load_partial(ino, &mut st, off, end)?;
        let mut src = Parts::new(parts);
        for idx in first..=last {
            let bstart = idx * bs;
            let a = (off.max(bstart) - bstart) as usize;
            let b = (end.min(bstart + bs) - bstart) as usize;
            match st.dirty.get_mut(&idx) {
                Some(blk) => {
                    let blk = Arc::make_mut(blk);
                    if blk.len() < b {
                        blk.resize(b, 0);
                    }
                    src.copy_to(&mut blk[a..b]);
                }
                None => {
                    // load_partial put every block the write covers only in
                    // part: this one it covers whole.
                    debug_assert!(a == 0 && b as u64 == bs, "a partial block not loaded");
                    let mut blk = Vec::with_capacity(b);
                    blk.resize(a, 0);
                    src.extend(&mut blk, b - a);
                    st.dirty.insert(idx, Arc::new(blk));
                }
            }
        }
        debug_assert!(src.done(), "every byte of the write placed");
        st.size = st.size.max(end);
        st.mtime = now_ns();
        self.account(&f, &st);
        Ok(st.size)
    }

    /// Puts in the dirty buffer the committed contents of the blocks that
    /// `[off, end)` covers only in part, so that the write keeps the rest.
    fn load_partial(&self, ino: u64, st: &mut FileState, off: u64, end: u64) -> Result<()> {
        let bs = self.bs();
        let (first, last) = (off / bs, (end - 1) / bs);
        let mut need = Vec::new();
        for idx in [first, last] {
            let whole = off <= idx * bs && end >= (idx + 1) * bs;
            if !whole && !st.dirty.contains_key(&idx) && !need.contains(&idx) {
                need.push(idx);
            }
        }
        if need.is_empty() {
            return Ok(());
        }
        let got = self.committed(ino, st, &need)?;
        for (idx, b) in need.into_iter().zip(got) {
            // Bytes past the size read as zeros: keep none of them.
            let keep = st.size.saturating_sub(idx * bs).min(bs) as usize;
            let v = b.map_or_else(Vec::new, |(b, len)| b[..len.min(keep)].to_vec());
            st.dirty.insert(idx, Arc::new(v));
        }
        Ok(())
    }

    /// The bytes of `[off, off+len)` clipped to `size` (dirty data of this
    /// mount first, then cached blocks, then the cluster), holes and bytes
    /// past a block's length read as zeros. `f` gets them as slices of the
    /// blocks themselves (and of a static run of zeros): nothing is copied
    /// or zero-filled on the way, unless a read would need more than
    /// [`MAX_SLICES`] of them.
    pub fn read_with<R>(
        &self,
        ino: u64,
        off: u64,
        len: usize,
        size: u64,
        f: impl FnOnce(&[&[u8]]) -> R,
    ) -> Result<R> {
        let end = off.saturating_add(len as u64).min(size);
        if off >= end {
            return Ok(f(&[]));
        }
        let got = self.gather(ino, off, end)?;
        let bs = self.bs();
        let mut slices: Vec<&[u8]> = Vec::with_capacity(got.len() + 1);
        for (idx, b, valid) in &got {
            let bstart = idx * bs;
            let (a, z) = (off.max(bstart), end.min(bstart + bs));
            let data_end = z.min(bstart + *valid as u64);
            if a < data_end {
                slices.push(&b[(a - bstart) as usize..(data_end - bstart) as usize]);
            }
            push_zeros(&mut slices, z - a.max(data_end));
        }
        debug_assert_eq!(
            slices.iter().map(|s| s.len() as u64).sum::<u64>(),
            end - off,
            "a read hands out exactly the bytes asked for"
        );
        if slices.len() > MAX_SLICES {
            return Ok(f(&[&slices.concat()]));
        }
        Ok(f(&slices))
    }

    /// `[off, end)` of `ino` in one buffer (copy_range).
    fn read_range(&self, ino: u64, off: u64, end: u64) -> Result<Vec<u8>> {
        let len = usize::try_from(end - off).map_err(|_| errno(Errno::EINVAL))?;
        self.read_with(ino, off, len, end, |parts| parts.concat())
    }

    /// The blocks of `[off, end)` of `ino`, each with the bytes of it that
    /// count; an index that is absent is a hole. The file's lock is held
    /// only to look at its map and take its dirty blocks (shared, not
    /// copied): the blocks are fetched without it, so reads of one file
    /// run in parallel and do not wait for its flush. A block gone
    /// meanwhile (freed by a flush) makes it look again.
    fn gather(&self, ino: u64, off: u64, end: u64) -> Result<Vec<(u64, Block, usize)>> {
        let bs = self.bs();
        let (first, last) = (off / bs, (end - 1) / bs);
        let file = self.file(ino);
        for _ in 0..STALE_RETRIES {
            let (entries, dirty) = {
                let mut st = file.st.lock();
                if (first..=last).any(|i| !st.dirty.contains_key(&i)) {
                    self.map(ino, &mut st)?;
                }
                let st = &*st;
                let entries: Vec<(u64, Entry)> = st.map.as_ref().map_or_else(Vec::new, |m| {
                    m.range(first..=last)
                        .filter(|(i, _)| !st.dirty.contains_key(i))
                        .map(|(&i, &e)| (i, e))
                        .collect()
                });
                let dirty: Vec<(u64, Block)> = st
                    .dirty
                    .range(first..=last)
                    .map(|(&i, b)| (i, b.clone()))
                    .collect();
                (entries, dirty)
            };
            let ids: Vec<u64> = entries.iter().map(|(_, e)| e.id).collect();
            let got = self.blocks.get_many(&ids)?;
            if got.iter().any(Option::is_none) {
                tracing::debug!(ino, "a block of the map is gone: reading the map again");
                file.st.lock().map = None;
                continue;
            }
            let mut out: Vec<(u64, Block, usize)> = entries
                .iter()
                .zip(got.into_iter().flatten())
                .map(|((idx, e), b)| {
                    let valid = (e.len as usize).min(b.len());
                    (*idx, b, valid)
                })
                .collect();
            out.extend(dirty.into_iter().map(|(idx, b)| {
                let valid = b.len();
                (idx, b, valid)
            }));
            out.sort_unstable_by_key(|(idx, _, _)| *idx);
            return Ok(with_holes(out, first, last));
        }
        tracing::warn!(ino, "block map names blocks the cluster does not have");
        Err(errno(Errno::EIO))
    }

    /// Size and mtime (ns) of what this mount has buffered for `ino` and
    /// not yet committed, if anything.
    pub fn dirty(&self, ino: u64) -> Option<(u64, i64)> {
        let f = self.existing(ino)?;
        let st = f.st.lock();
        (!st.dirty.is_empty()).then_some((st.size, st.mtime))
    }

    /// Commits `ino`'s dirty blocks (module doc). Returns the committed
    /// record, None if nothing was dirty.
    pub fn flush(&self, ino: u64) -> Result<Option<Record>> {
        let Some(f) = self.existing(ino) else {
            return Ok(None);
        };
        let _order = f.order.lock();
        self.flush_ordered(ino, &f)
    }

    /// [`Data::flush`] with `f.order` held. The file's state is locked only
    /// to take its dirty blocks (shared, not copied) and, after the script,
    /// to put the new map entries in: reads and writes of the file go on
    /// while its blocks travel. A block written again meanwhile stays dirty.
    fn flush_ordered(&self, ino: u64, f: &File) -> Result<Option<Record>> {
        let (taken, size) = {
            let st = f.st.lock();
            if st.dirty.is_empty() {
                return Ok(None);
            }
            (taken(&st), st.size)
        };
        // Read before the blocks go out: see `commit_script`.
        let sid = self.h.sid();
        let new = self.put_new(&taken)?;
        let rule = SizeRule::Max(size);
        let (rec, old, entered) =
            self.commit_script(ino, sid, "write", rule, Cut::default(), &new)?;
        let freed = self.after_commit(f, &mut f.st.lock(), &new, &old, Cut::default(), entered);
        self.free_later(freed);
        Ok(Some(rec))
    }

    /// Flushes the file with the most dirty bytes (the mount's bound).
    /// Unless `wait`, only if no other thread is flushing it already:
    /// returns whether it flushed.
    fn flush_largest(&self, wait: bool) -> Result<bool> {
        let largest = self
            .files
            .lock()
            .iter()
            .max_by_key(|(_, f)| f.dirty_bytes.load(Ordering::Acquire))
            .map(|(&ino, f)| (ino, f.clone()));
        let Some((ino, f)) = largest else {
            return Ok(false);
        };
        let _order = if wait {
            f.order.lock()
        } else {
            match f.order.try_lock() {
                Some(g) => g,
                None => return Ok(false),
            }
        };
        self.flush_ordered(ino, &f)?;
        Ok(true)
    }

    /// Writes `st`'s dirty blocks as new blocks, then runs the commit
    /// script with `op`, `rule` and `cut`, then frees what it replaced;
    /// `st` held throughout (and `f.order`, by the caller).
    fn commit(
        &self,
        ino: u64,
        f: &File,
        st: &mut FileState,
        op: &str,
        rule: SizeRule,
        cut: Cut,
    ) -> Result<Record> {
        let sid = self.h.sid();
        let new = self.put_new(&taken(st))?;
        let (rec, old, entered) = self.commit_script(ino, sid, op, rule, cut, &new)?;
        let freed = self.after_commit(f, st, &new, &old, cut, entered);
        debug_assert!(
            st.dirty.is_empty(),
            "a commit under the lock takes every dirty block"
        );
        self.free_later(freed);
        Ok(rec)
    }

    /// Writes dirty blocks as new blocks (new ids): their index, map entry
    /// and bytes.
    fn put_new(&self, taken: &[(u64, Block)]) -> Result<Vec<(u64, Entry, Block)>> {
        if taken.is_empty() {
            return Ok(Vec::new());
        }
        let first = self.blocks.reserve(taken.len() as u64)?;
        let new: Vec<(u64, Entry, Block)> = taken
            .iter()
            .enumerate()
            .map(|(i, (idx, b))| {
                let e = Entry {
                    id: first + i as u64,
                    len: b.len() as u32,
                };
                (*idx, e, b.clone())
            })
            .collect();
        let puts: Vec<(u64, Block)> = new.iter().map(|(_, e, b)| (e.id, b.clone())).collect();
        let free = std::mem::take(&mut *self.to_free.lock());
        self.blocks.put_many(&puts, &free)?;
        Ok(new)
    }

    /// Queues blocks a commit replaced, for the next flush's pipeline;
    /// unlinks the queue now once it is long.
    fn free_later(&self, ids: Vec<u64>) {
        self.blocks.uncache(&ids);
        let batch = {
            let mut q = self.to_free.lock();
            q.extend(ids);
            if q.len() < FREE_BATCH {
                return;
            }
            std::mem::take(&mut *q)
        };
        self.blocks.delete(&batch);
    }

    /// Unlinks every block queued by [`Data::free_later`] (the mount's
    /// close).
    pub fn free_pending(&self) {
        let q = std::mem::take(&mut *self.to_free.lock());
        self.blocks.delete(&q);
    }

    /// The commit script over the blocks `new` wrote; on a failure that
    /// left the map as it was, the new blocks are deleted again. Fenced on
    /// `sid`, the session that was this mount's when the blocks were
    /// written, not the one it may have registered since: so a block is
    /// only ever named by a commit of the session it was written under,
    /// and once that session is dead a block no map names never will be
    /// (what `Admin::clean` frees).
    fn commit_script(
        &self,
        ino: u64,
        sid: u64,
        op: &str,
        rule: SizeRule,
        cut: Cut,
        new: &[(u64, Entry, Block)],
    ) -> Result<(Record, Vec<Entry>, Entered)> {
        let pairs: Vec<(u64, Entry)> = new.iter().map(|&(i, e, _)| (i, e)).collect();
        self.run_commit(ino, sid, op, rule, cut, &pairs)
            .inspect_err(|e| {
                // The script refuses before it writes, and a lost reply is
                // a transport error: then the map may name the new blocks.
                if !matches!(e, Error::Redis(r) if crate::blocks::transient(r) || r.is_timeout()) {
                    self.blocks.delete(&puts_ids(new));
                }
            })
    }

    /// What a commit of `new` did, on this mount's state of the file: the
    /// cached map, the dirty blocks it wrote (a block written again since
    /// it was taken stays dirty), the keys to sync. Returns the ids of the
    /// blocks it replaced, to free.
    fn after_commit(
        &self,
        f: &File,
        st: &mut FileState,
        new: &[(u64, Entry, Block)],
        old: &[Entry],
        cut: Cut,
        entered: Entered,
    ) -> Vec<u64> {
        if st.unsynced_commits.len() == UNSYNCED_COMMITS {
            st.unsynced_commits.pop_front();
        }
        st.unsynced_commits.push_back(entered.id);
        if let Some(o) = entered.owed {
            st.owed = Some(match st.owed.take() {
                Some(prev) => prev.merge(o),
                None => o,
            });
        }
        // Ids are reserved in one range: a retried script reports our own
        // new blocks as replaced.
        let ours = |id: u64| {
            new.first()
                .is_some_and(|n| (n.1.id..n.1.id + new.len() as u64).contains(&id))
        };
        let freed: Vec<u64> = old.iter().map(|e| e.id).filter(|&id| !ours(id)).collect();
        let pairs: Vec<(u64, Entry)> = new.iter().map(|&(i, e, _)| (i, e)).collect();
        self.apply_locally(st, &pairs, cut);
        for (idx, _, b) in new {
            if st.dirty.get(idx).is_some_and(|d| Arc::ptr_eq(d, b)) {
                st.dirty.remove(idx);
            }
        }
        self.account(f, st);
        let mut touched = vec![self.h.keys.meta()];
        touched.extend(pairs.iter().map(|&(_, e)| self.h.keys.block(e.id)));
        for k in touched {
            st.unsynced.entry(key_slot(k.as_bytes())).or_insert(k);
        }
        st.unsynced_ids
            .extend(pairs.iter().map(|&(i, e)| (i, e.id)));
        freed
    }

    fn run_commit(
        &self,
        ino: u64,
        sid: u64,
        op: &str,
        rule: SizeRule,
        cut: Cut,
        pairs: &[(u64, Entry)],
    ) -> Result<(Record, Vec<Entry>, Entered)> {
        let (rule, size) = match rule {
            SizeRule::Max(n) => ("max", n),
            SizeRule::Set(n) => ("set", n),
            SizeRule::Keep => ("keep", 0),
        };
        let (lo, hi) = match cut.drop {
            Some((lo, hi)) => (
                lo.to_string(),
                hi.map(|h| h.to_string()).unwrap_or_default(),
            ),
            None => (String::new(), String::new()),
        };
        let (cut_field, cut_len) = match cut.cut {
            Some((idx, len)) => (map_field(idx), len.to_string()),
            None => (String::new(), "0".to_string()),
        };
        let reply: Vec<redis::Value> = retry(&self.h, |c| {
            let mut inv = self.h.invocation_as(&self.commit, sid);
            inv.key(map_key(&self.h, ino))
                .key(self.h.keys.records(ino))
                .arg(op)
                .arg(ino)
                .arg(&Keys::record_field(ino)[..])
                .arg(rule)
                .arg(&size.to_le_bytes()[..])
                .arg(&lo)
                .arg(&hi)
                .arg(&cut_field)
                .arg(&cut_len);
            for (idx, e) in pairs {
                inv.arg(map_field(*idx)).arg(&e.encode()[..]);
            }
            inv.invoke(c)
        })?;
        let mut it = reply.into_iter();
        let rec = it
            .next()
            .ok_or_else(|| Error::Protocol("commit script returned nothing".into()))?;
        let rec = crate::namespace::bytes(Some(&rec))?;
        let mut old = Vec::new();
        let mut entered = None;
        for v in it {
            match v {
                redis::Value::Array(a) => entered = Some(Owed::parse(&a)?),
                v => old.push(Entry::decode(&crate::namespace::bytes(Some(&v))?)?),
            }
        }
        let entered =
            entered.ok_or_else(|| Error::Protocol("commit script: no feed entry".into()))?;
        Ok((record::decode(&rec)?, old, entered))
    }

    /// What the commit script did, on the cached map.
    fn apply_locally(&self, st: &mut FileState, pairs: &[(u64, Entry)], cut: Cut) {
        let Some(map) = st.map.as_mut() else {
            return;
        };
        if let Some((lo, hi)) = cut.drop {
            map.retain(|&i, _| i < lo || hi.is_some_and(|h| i > h));
        }
        if let Some((idx, len)) = cut.cut
            && let Some(e) = map.get_mut(&idx)
        {
            e.len = e.len.min(len);
        }
        for &(i, e) in pairs {
            map.insert(i, e);
        }
    }

    /// The writer pays (docs/cluster.md, "Many mounts, one truth"): waits
    /// until every session that was live when this mount's last commits of
    /// `ino` ran has acked their feed entry (its feed reader applied it and
    /// said so in `{V}:acks`), or is no longer live, or [`ACK_WAIT`] has
    /// passed (then a warning, once per file, and success: the readers'
    /// own rule covers the rest). The close and fsync of a file call it,
    /// after their flush. Nothing owed (no other session was live): no
    /// call at all. Each poll is one read-only script on the metadata
    /// master, bounded by the volume's timeout; polls stop after
    /// [`ACK_WAIT`]. Returns whether every ack came (false: ran out).
    pub fn await_acks(&self, ino: u64) -> bool {
        let Some(f) = self.existing(ino) else {
            return true;
        };
        let Some(owed) = f.st.lock().owed.clone() else {
            return true;
        };
        let started = Instant::now();
        let mut pause = ACK_POLL_MIN;
        let mut waiting = owed.sids.clone();
        let done = loop {
            self.h.count_data();
            let got: Result<Vec<Vec<u8>>> = self.h.pool.with(|c| {
                let mut inv = self.h.invocation(&self.acks);
                for s in &waiting {
                    inv.arg(*s);
                }
                inv.invoke(c)
            });
            match got {
                Ok(states) => {
                    let mut left = Vec::new();
                    for (sid, st) in waiting.iter().zip(states) {
                        let st = String::from_utf8_lossy(&st);
                        let acked =
                            st == "gone" || (!st.is_empty() && crate::feed::id_of(&st) >= owed.id);
                        if !acked {
                            left.push(*sid);
                        }
                    }
                    waiting = left;
                }
                Err(e) => tracing::debug!(ino, error = %e, "polling the acks failed"),
            }
            if waiting.is_empty() {
                break true;
            }
            if started.elapsed() + pause > ACK_WAIT {
                break false;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(ACK_POLL_MAX);
        };
        let mut st = f.st.lock();
        // A commit since may owe more: only what was paid goes.
        if st.owed.as_ref() == Some(&owed) {
            st.owed = None;
        }
        if !done {
            self.ack_timeouts.fetch_add(1, Ordering::Relaxed);
            if !std::mem::replace(&mut st.warned, true) {
                tracing::warn!(
                    ino,
                    sessions = ?waiting,
                    "close: other mounts did not ack the change within {ACK_WAIT:?}; going on"
                );
            }
        }
        done
    }

    /// Waits for acks that ran out so far ([`Data::await_acks`]).
    pub fn ack_timeouts(&self) -> u64 {
        self.ack_timeouts.load(Ordering::Relaxed)
    }

    /// flush, then `WAIT 1` on every master that took a block or the
    /// script of this file since its last sync: an acknowledged fsync is on
    /// a replica.
    pub fn sync(&self, ino: u64) -> Result<Option<Record>> {
        let f = self.file(ino);
        let _order = f.order.lock();
        let rec = self.flush_ordered(ino, &f)?;
        // Only commits add keys, and they wait for `order`.
        let keys: Vec<String> = f.st.lock().unsynced.values().cloned().collect();
        self.blocks.wait_replicas(&keys)?;
        self.check_replicated(ino, &f)?;
        self.check_committed(ino, &f)?;
        let mut st = f.st.lock();
        st.unsynced.clear();
        st.unsynced_ids.clear();
        st.unsynced_commits.clear();
        Ok(rec)
    }

    /// After the `WAIT`s of a sync: every block committed since the last
    /// sync that the file's map still names is in the cluster, or the
    /// sync fails with EIO (and stays unsynced: the next one fails too),
    /// since a master lost it in a failover (`Blocks::lost`).
    fn check_replicated(&self, ino: u64, f: &File) -> Result<()> {
        let ids: Vec<(u64, u64)> =
            f.st.lock()
                .unsynced_ids
                .iter()
                .map(|(&i, &id)| (i, id))
                .collect();
        if ids.is_empty() {
            return Ok(());
        }
        let lost = self.blocks.lost(ino, &ids)?;
        if let Some(&id) = lost.first() {
            tracing::error!(
                ino,
                block = id,
                lost = lost.len(),
                "fsync: blocks acknowledged before a failover are gone from the cluster"
            );
            return Err(errno(Errno::EIO));
        }
        Ok(())
    }

    /// After the `WAIT`s of a sync: every commit of the file by this mount
    /// since the last sync is still in the cluster, or the sync fails with
    /// EIO, once: a metadata master that died between a commit and its
    /// replication took the commit with it, and its promoted replica holds
    /// the file as before (the commit's blocks are unreferenced, not
    /// lost). Unlike a lost block, which leaves the map naming nothing and
    /// so fails every sync until it is written again, the file is whole,
    /// only older: the error is told once, as Linux tells a writeback error
    /// once, and this mount's cached map is dropped for the cluster's.
    fn check_committed(&self, ino: u64, f: &File) -> Result<()> {
        let ids: Vec<(u64, u64)> = f.st.lock().unsynced_commits.iter().copied().collect();
        let lost = self.commits_lost(&ids)?;
        debug_assert!(lost <= ids.len(), "lost commits are among those checked");
        if lost == 0 {
            return Ok(());
        }
        tracing::error!(
            ino,
            lost,
            "fsync: commits acknowledged before a failover are gone from the cluster"
        );
        let mut st = f.st.lock();
        st.unsynced_commits.clear();
        st.map = None;
        Err(errno(Errno::EIO))
    }

    /// How many of the feed entries `ids` the metadata master no longer
    /// holds. A commit's map change and its feed entry are one script's
    /// effects, replicated together, so a missing entry is a lost commit,
    /// unless the stream was trimmed past it (`MAXLEN ~`: its first entry
    /// is then later than the id).
    fn commits_lost(&self, ids: &[(u64, u64)]) -> Result<usize> {
        // Entries asked per pipeline: a sync after many commits sends a few
        // small pipelines, not one reply of up to [`UNSYNCED_COMMITS`].
        const PER_PIPELINE: usize = 256;
        let key = self.h.keys.feed_key();
        let mut lost = 0;
        for chunk in ids.chunks(PER_PIPELINE) {
            let got: Vec<Vec<(String, redis::Value)>> = retry(&self.h, |c| {
                let mut p = redis::cluster::cluster_pipe();
                p.cmd("XRANGE")
                    .arg(&key)
                    .arg("-")
                    .arg("+")
                    .arg("COUNT")
                    .arg(1);
                for &(ms, seq) in chunk {
                    let id = format!("{ms}-{seq}");
                    p.cmd("XRANGE")
                        .arg(&key)
                        .arg(&id)
                        .arg(&id)
                        .arg("COUNT")
                        .arg(1);
                }
                p.query(c)
            })?;
            let bad = || Error::Protocol(format!("fsync check of {key}: {} replies", got.len()));
            let (first, each) = got.split_first().ok_or_else(bad)?;
            if each.len() != chunk.len() {
                return Err(bad());
            }
            let first = first.first().map(|(id, _)| crate::feed::id_of(id));
            lost += chunk
                .iter()
                .zip(each)
                .filter(|(id, found)| found.is_empty() && first.is_none_or(|f| f <= **id))
                .count();
        }
        Ok(lost)
    }

    /// Fenced script: drops map entries past `size`, cuts the boundary
    /// block's length, sets size, mtime, ctime; drops the dirty tail.
    /// Returns the new record.
    pub fn truncate(&self, ino: u64, size: u64) -> Result<Record> {
        if size > MAX_SIZE {
            return Err(errno(Errno::EFBIG));
        }
        let bs = self.bs();
        let f = self.file(ino);
        let _order = f.order.lock();
        let mut st = f.st.lock();
        // Dirty blocks wholly past the end go; the boundary one is cut.
        let keep_from = size.div_ceil(bs);
        st.dirty.retain(|&i, _| i < keep_from);
        let tail = (size % bs) as usize;
        if tail != 0
            && let Some(b) = st.dirty.get_mut(&(size / bs))
        {
            Arc::make_mut(b).truncate(tail);
        }
        st.size = size;
        let cut = Cut {
            drop: Some((keep_from, None)),
            cut: (tail != 0).then_some((size / bs, tail as u32)),
        };
        self.commit(ino, &f, &mut st, "truncate", SizeRule::Set(size), cut)
    }

    /// The feed says another mount changed `ino`'s data: drop its cached
    /// block map (blocks stay: immutable).
    pub fn invalidate(&self, ino: u64) {
        if let Some(f) = self.existing(ino) {
            let mut st = f.st.lock();
            st.map = None;
        }
    }

    pub fn invalidate_all(&self) {
        self.losses.fetch_add(1, Ordering::AcqRel);
        let all: Vec<Arc<File>> = self.files.lock().values().cloned().collect();
        for f in all {
            let mut st = f.st.lock();
            st.map = None;
        }
    }

    /// An open of `ino` found its record `unchanged` since this mount last
    /// knew it: whether the pages of it that the kernel may hold from this
    /// mount are still the file's. They are if, besides, an earlier open
    /// here checked the file since this mount last lost track of the
    /// others' changes (the feed, whose every entry invalidates the
    /// kernel's pages of what it names, covered the time between).
    pub fn pages_current(&self, ino: u64, unchanged: bool) -> bool {
        let f = self.file(ino);
        let mut st = f.st.lock();
        let now = self.losses.load(Ordering::Acquire) + 1;
        let current = unchanged && st.checked == now;
        st.checked = now;
        current
    }

    /// The node is gone: drop all state for it (its dirty data included).
    pub fn forget(&self, ino: u64) {
        let Some(f) = self.files.lock().remove(&ino) else {
            return;
        };
        let mut st = f.st.lock();
        st.dirty.clear();
        self.account(&f, &st);
    }

    /// Deletes the blocks named by raw block map values (each 12 bytes: id
    /// u64 LE, len u32 LE), grouped per master. A value that does not
    /// decode is logged and skipped.
    pub fn free_blocks(&self, map_values: &[Vec<u8>]) {
        let ids: Vec<u64> = map_values
            .iter()
            .filter_map(|v| match Entry::decode(v) {
                Ok(e) => Some(e.id),
                Err(e) => {
                    tracing::warn!(error = %e, "not freeing a bad block map value");
                    None
                }
            })
            .collect();
        self.blocks.delete(&ids);
    }

    /// `SEEK_DATA` and `SEEK_HOLE` over the block map and the dirty blocks
    /// (a block is data as a whole, as a page is in the engine); `SEEK_SET`
    /// and `SEEK_END` as the engine answers them.
    pub fn lseek(&self, ino: u64, off: u64, whence: i32, size: u64) -> Result<u64> {
        match whence {
            nix::libc::SEEK_SET => return Ok(off),
            nix::libc::SEEK_END => return Ok(size),
            nix::libc::SEEK_DATA | nix::libc::SEEK_HOLE => {}
            _ => return Err(errno(Errno::EINVAL)),
        }
        if off >= size {
            return Err(errno(Errno::ENXIO));
        }
        let bs = self.bs();
        let f = self.file(ino);
        let mut st = f.st.lock();
        self.map(ino, &mut st)?;
        let st = &*st;
        let is_data = |i: u64| {
            st.dirty.contains_key(&i) || st.map.as_ref().is_some_and(|m| m.contains_key(&i))
        };
        let idx = off / bs;
        if whence == nix::libc::SEEK_DATA {
            let next_map = st
                .map
                .as_ref()
                .and_then(|m| m.range(idx..).next().map(|e| *e.0));
            let next_dirty = st.dirty.range(idx..).next().map(|e| *e.0);
            let next = match (next_map, next_dirty) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => a.or(b).ok_or(errno(Errno::ENXIO))?,
            };
            let pos = (next * bs).max(off);
            return if pos < size {
                Ok(pos)
            } else {
                Err(errno(Errno::ENXIO))
            };
        }
        let mut i = idx;
        while is_data(i) && i * bs < size {
            i += 1;
        }
        Ok((i * bs).max(off).min(size))
    }

    /// `fallocate`: allocation (a hole reads as zeros already: only the
    /// size and times change), punch hole and zero range (map entries wholly
    /// inside go, the boundary blocks get zeros), all in one commit.
    pub fn fallocate(
        &self,
        ino: u64,
        off: u64,
        len: u64,
        mode: FallocateMode,
        size: u64,
    ) -> Result<Record> {
        if len == 0 {
            return Err(errno(Errno::EINVAL));
        }
        let end = off
            .checked_add(len)
            .filter(|&e| e <= MAX_SIZE)
            .ok_or(errno(Errno::EFBIG))?;
        if mode.punch_hole && (!mode.keep_size || mode.zero_range) {
            return Err(errno(Errno::EOPNOTSUPP));
        }
        let f = self.file(ino);
        let _order = f.order.lock();
        let mut st = f.st.lock();
        if st.dirty.is_empty() {
            st.size = size;
        } else {
            st.size = st.size.max(size);
        }
        let mut cut = Cut::default();
        if mode.punch_hole || mode.zero_range {
            // Only what is inside the file has bytes to clear.
            let zend = end.min(st.size);
            if off < zend {
                cut.drop = self.zero(ino, &mut st, off, zend)?;
            }
        }
        let rule = if mode.keep_size || mode.punch_hole {
            SizeRule::Keep
        } else {
            SizeRule::Max(end.max(st.size))
        };
        if let SizeRule::Max(n) = rule {
            st.size = n;
        }
        self.commit(ino, &f, &mut st, "write", rule, cut)
    }

    /// Zeros `[off, end)` in the dirty buffer: whole blocks inside leave it
    /// (and the range of them is returned, for the commit to drop from the
    /// map), the boundary blocks are read and get zeros.
    fn zero(
        &self,
        ino: u64,
        st: &mut FileState,
        off: u64,
        end: u64,
    ) -> Result<Option<(u64, Option<u64>)>> {
        let bs = self.bs();
        let (lo, hi) = (off.div_ceil(bs), end / bs);
        let whole = (lo < hi).then(|| (lo, Some(hi - 1)));
        if let Some((lo, Some(hi))) = whole {
            st.dirty.retain(|&i, _| i < lo || i > hi);
        }
        self.load_partial(ino, st, off, end)?;
        for idx in [off / bs, (end - 1) / bs] {
            if whole.is_some_and(|(l, h)| idx >= l && h.is_some_and(|h| idx <= h)) {
                continue;
            }
            let Some(b) = st.dirty.get_mut(&idx) else {
                continue;
            };
            let bstart = idx * bs;
            let a = (off.max(bstart) - bstart) as usize;
            let z = ((end.min(bstart + bs) - bstart) as usize).min(b.len());
            if a < z {
                Arc::make_mut(b)[a..z].fill(0);
            }
        }
        Ok(whole)
    }

    /// Copies `len` bytes (clipped to the source's size) through this
    /// mount's buffers, then commits the destination. Returns the bytes
    /// copied and the destination's record.
    #[allow(clippy::too_many_arguments)]
    pub fn copy_range(
        &self,
        ino_in: u64,
        off_in: u64,
        ino_out: u64,
        off_out: u64,
        len: u64,
        size_in: u64,
        size_out: u64,
    ) -> Result<(u64, Record)> {
        let size_in = self.dirty(ino_in).map_or(size_in, |(s, _)| s.max(size_in));
        let len = len.min(size_in.saturating_sub(off_in));
        if ino_in == ino_out
            && off_in < off_out.saturating_add(len)
            && off_out < off_in.saturating_add(len)
        {
            return Err(errno(Errno::EINVAL));
        }
        off_out
            .checked_add(len)
            .filter(|&e| e <= MAX_SIZE)
            .ok_or(errno(Errno::EFBIG))?;
        let mut done = 0;
        let mut size = size_out;
        while done < len {
            let n = (len - done).min(COPY_CHUNK);
            let buf = self.read_range(ino_in, off_in + done, off_in + done + n)?;
            size = self.write(ino_out, off_out + done, &buf, size)?;
            done += n;
        }
        let rec = match self.flush(ino_out)? {
            Some(r) => r,
            None => self.record(ino_out)?,
        };
        Ok((done, rec))
    }

    /// `ino`'s record as the cluster has it.
    pub fn record(&self, ino: u64) -> Result<Record> {
        let raw: Vec<u8> = retry(&self.h, |c| {
            self.h
                .invocation(&self.record)
                .key(self.h.keys.records(ino))
                .arg(&Keys::record_field(ino)[..])
                .invoke(c)
        })?;
        record::decode(&raw)
    }

    pub fn cached_bytes(&self) -> u64 {
        self.blocks.cached_bytes()
    }

    /// Dirty bytes this mount holds, over every file.
    pub fn dirty_bytes(&self) -> u64 {
        self.dirty_total.load(Ordering::Acquire)
    }

    /// Sets the mount's dirty bound (default [`DIRTY_LIMIT`]).
    pub fn set_dirty_limit(&self, bytes: u64) {
        self.dirty_limit.store(bytes, Ordering::Relaxed);
    }

    /// Block reads served by the cache, and from the cluster.
    pub fn hits(&self) -> (u64, u64) {
        self.blocks.hits()
    }
}

/// `blocks` (sorted by index, within `[first, last]`) with every index
/// between that has none as an empty block: a hole.
fn with_holes(blocks: Vec<(u64, Block, usize)>, first: u64, last: u64) -> Vec<(u64, Block, usize)> {
    if blocks.len() as u64 == last - first + 1 {
        return blocks;
    }
    let empty: Block = Arc::new(Vec::new());
    let mut out = Vec::with_capacity((last - first + 1) as usize);
    let mut it = blocks.into_iter().peekable();
    for idx in first..=last {
        match it.next_if(|b| b.0 == idx) {
            Some(b) => out.push(b),
            None => out.push((idx, empty.clone(), 0)),
        }
    }
    out
}

/// Appends `n` zero bytes to `slices`, as slices of [`ZEROS`].
fn push_zeros(slices: &mut Vec<&[u8]>, mut n: u64) {
    while n > 0 {
        let k = n.min(ZEROS.len() as u64);
        slices.push(&ZEROS[..k as usize]);
        n -= k;
    }
}

/// A cursor over the bytes of a write given as parts.
struct Parts<'a> {
    parts: &'a [&'a [u8]],
    /// The part being read, and the offset in it.
    at: (usize, usize),
}

impl<'a> Parts<'a> {
    fn new(parts: &'a [&'a [u8]]) -> Parts<'a> {
        Parts { parts, at: (0, 0) }
    }

    /// The next bytes, at most `n`, within one part.
    fn take(&mut self, n: usize) -> &'a [u8] {
        while let Some(p) = self.parts.get(self.at.0) {
            if self.at.1 < p.len() {
                let k = n.min(p.len() - self.at.1);
                let s = &p[self.at.1..self.at.1 + k];
                self.at.1 += k;
                return s;
            }
            self.at = (self.at.0 + 1, 0);
        }
        &[]
    }

    /// Fills `dst` with the next bytes.
    fn copy_to(&mut self, dst: &mut [u8]) {
        let mut done = 0;
        while done < dst.len() {
            let s = self.take(dst.len() - done);
            assert!(!s.is_empty(), "a write's parts ran out");
            dst[done..done + s.len()].copy_from_slice(s);
            done += s.len();
        }
    }

    /// Appends the next `n` bytes to `dst`.
    fn extend(&mut self, dst: &mut Vec<u8>, n: usize) {
        let mut done = 0;
        while done < n {
            let s = self.take(n - done);
            assert!(!s.is_empty(), "a write's parts ran out");
            dst.extend_from_slice(s);
            done += s.len();
        }
    }

    /// Whether every byte was taken.
    fn done(&self) -> bool {
        let rest = self.parts.get(self.at.0..).unwrap_or_default();
        rest.iter().enumerate().all(|(i, p)| {
            let from = if i == 0 { self.at.1 } else { 0 };
            p.len() <= from
        })
    }
}

/// The dirty blocks of `st`, shared, for a commit.
fn taken(st: &FileState) -> Vec<(u64, Block)> {
    st.dirty.iter().map(|(&i, b)| (i, b.clone())).collect()
}

fn puts_ids(new: &[(u64, Entry, Block)]) -> Vec<u64> {
    new.iter().map(|(_, e, _)| e.id).collect()
}
