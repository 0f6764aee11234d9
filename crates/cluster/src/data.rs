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
//!   would pass the bound first flushes the file with the most dirty bytes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use memfs_fs::{Errno, FallocateMode};
use parking_lot::Mutex;
use redis::Script;

use crate::blocks::{Blocks, Entry, map_field, map_key, retry};
use crate::error::{Error, Result};
use crate::handle::{Handle, now_ns};
use crate::keys::Keys;
use crate::record::{self, Record};
use crate::slot::key_slot;

/// Dirty bytes a mount holds at most before a write flushes the largest
/// dirty file.
pub const DIRTY_LIMIT: u64 = 64 << 20;
/// Times a read refetches a stale block map before it gives up (EIO).
const STALE_RETRIES: usize = 3;
/// Bytes a copy_range moves per read and write.
const COPY_CHUNK: u64 = 1 << 20;
/// The largest file (as the engine's `MAX_FILE_SIZE`).
const MAX_SIZE: u64 = i64::MAX as u64;

/// Commits a file's data change (see the module doc), atomically.
/// KEYS: {V}:meta, the block map, the record's group.
/// ARGV 4..: op (feed name), ino (decimal), record field, size rule
/// (`max`, `set`, `keep`), size (8 bytes LE), drop from (block index,
/// decimal, or empty), drop to (inclusive, or empty: to the end), cut field
/// (hex, or empty), cut length, then pairs of field and 12-byte value.
/// Returns the new record, then every map value it replaced or dropped.
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
feed('op', ARGV[4], 'ino', ARGV[5])
out[1] = r
return out
";

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
    dirty: BTreeMap<u64, Vec<u8>>,
    /// The size with the dirty data, while there is some.
    size: u64,
    /// When the dirty data was last written (ns).
    mtime: i64,
    /// A key in each slot that took a block or a script of this file since
    /// its last acknowledged sync, by slot.
    unsynced: BTreeMap<u16, String>,
}

struct File {
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
    commit: Script,
    record: Script,
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
            commit: Script::new(&crate::lua::script(COMMIT)),
            record: Script::new(&crate::lua::read_script(RECORD)),
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
    ) -> Result<Vec<Option<Arc<[u8]>>>> {
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
                        Some(if len == b.len() { b } else { b[..len].into() })
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
        let end = off
            .checked_add(data.len() as u64)
            .filter(|&e| e <= MAX_SIZE)
            .ok_or(errno(Errno::EFBIG))?;
        let limit = self.dirty_limit.load(Ordering::Relaxed);
        // A few rounds at most: other writers may be filling it again.
        for _ in 0..4 {
            let total = self.dirty_total.load(Ordering::Acquire);
            if total == 0 || total + data.len() as u64 <= limit {
                break;
            }
            self.flush_largest()?;
        }
        let f = self.file(ino);
        let mut st = f.st.lock();
        if st.dirty.is_empty() {
            st.size = size;
        } else {
            st.size = st.size.max(size);
        }
        if data.is_empty() {
            return Ok(st.size);
        }
        let bs = self.bs();
        let (first, last) = (off / bs, (end - 1) / bs);
        self.load_partial(ino, &mut st, off, end)?;
        for idx in first..=last {
            let bstart = idx * bs;
            let a = off.max(bstart) - bstart;
            let b = end.min(bstart + bs) - bstart;
            let src = &data[(bstart + a - off) as usize..(bstart + b - off) as usize];
            let blk = st.dirty.entry(idx).or_default();
            if blk.len() < b as usize {
                blk.resize(b as usize, 0);
            }
            blk[a as usize..b as usize].copy_from_slice(src);
        }
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
            let mut v = b.map(|b| b.to_vec()).unwrap_or_default();
            v.truncate(keep);
            st.dirty.insert(idx, v);
        }
        Ok(())
    }

    /// The bytes of `[off, off+len)` clipped to `size` (dirty data of this
    /// mount first, then cached blocks, then the cluster), holes and bytes
    /// past a block's length read as zeros.
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
        let buf = self.read_range(ino, off, end)?;
        Ok(f(&[&buf[..]]))
    }

    /// `[off, end)` of `ino`. The file's lock is held only to look at its
    /// map and copy its dirty blocks: the blocks are fetched without it, so
    /// reads of one file run in parallel and do not wait for its flush. A
    /// block gone meanwhile (freed by a flush) makes it look again.
    fn read_range(&self, ino: u64, off: u64, end: u64) -> Result<Vec<u8>> {
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
                let dirty: Vec<(u64, Vec<u8>)> = st
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
            let mut buf = vec![0u8; (end - off) as usize];
            let mut put = |idx: u64, b: &[u8]| {
                let bstart = idx * bs;
                let a = off.max(bstart);
                let z = end.min(bstart + b.len() as u64);
                if a < z {
                    buf[(a - off) as usize..(z - off) as usize]
                        .copy_from_slice(&b[(a - bstart) as usize..(z - bstart) as usize]);
                }
            };
            for ((idx, e), b) in entries.iter().zip(got.iter().flatten()) {
                put(*idx, &b[..(e.len as usize).min(b.len())]);
            }
            for (idx, b) in &dirty {
                put(*idx, b);
            }
            return Ok(buf);
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
        let mut st = f.st.lock();
        if st.dirty.is_empty() {
            return Ok(None);
        }
        let size = st.size;
        let r = self.commit(
            ino,
            &f,
            &mut st,
            "write",
            SizeRule::Max(size),
            Cut::default(),
        )?;
        Ok(Some(r))
    }

    /// Flushes the file with the most dirty bytes (the mount's bound).
    fn flush_largest(&self) -> Result<()> {
        let largest = self
            .files
            .lock()
            .iter()
            .max_by_key(|(_, f)| f.dirty_bytes.load(Ordering::Acquire))
            .map(|(&ino, _)| ino);
        if let Some(ino) = largest {
            self.flush(ino)?;
        }
        Ok(())
    }

    /// Writes `st`'s dirty blocks as new blocks, then runs the commit
    /// script with `op`, `rule` and `cut`, then frees what it replaced.
    fn commit(
        &self,
        ino: u64,
        f: &File,
        st: &mut FileState,
        op: &str,
        rule: SizeRule,
        cut: Cut,
    ) -> Result<Record> {
        let n = st.dirty.len() as u64;
        let mut new: Vec<(u64, Entry, Arc<[u8]>)> = Vec::with_capacity(st.dirty.len());
        if n > 0 {
            let first = self.blocks.reserve(n)?;
            for (i, (&idx, b)) in st.dirty.iter().enumerate() {
                let e = Entry {
                    id: first + i as u64,
                    len: b.len() as u32,
                };
                new.push((idx, e, b.as_slice().into()));
            }
            let puts: Vec<(u64, Arc<[u8]>)> =
                new.iter().map(|(_, e, b)| (e.id, b.clone())).collect();
            self.blocks.put_many(&puts)?;
        }
        let pairs: Vec<(u64, Entry)> = new.iter().map(|&(i, e, _)| (i, e)).collect();
        let (rec, old) = match self.run_commit(ino, op, rule, cut, &pairs) {
            Ok(r) => r,
            Err(e) => {
                // The script refuses before it writes, and a lost reply is
                // a transport error: then the map may name the new blocks.
                if !matches!(&e, Error::Redis(r) if crate::blocks::transient(r) || r.is_timeout()) {
                    self.blocks.delete(&puts_ids(&new));
                }
                return Err(e);
            }
        };
        let ours: Vec<u64> = puts_ids(&new);
        // A retried script reports our own new blocks as replaced.
        let freed: Vec<u64> = old
            .iter()
            .map(|e| e.id)
            .filter(|id| !ours.contains(id))
            .collect();
        self.apply_locally(st, &pairs, cut);
        st.dirty.clear();
        self.account(f, st);
        let mut touched = vec![self.h.keys.meta()];
        touched.extend(pairs.iter().map(|&(_, e)| self.h.keys.block(e.id)));
        for k in touched {
            st.unsynced.entry(key_slot(k.as_bytes())).or_insert(k);
        }
        self.blocks.delete(&freed);
        Ok(rec)
    }

    fn run_commit(
        &self,
        ino: u64,
        op: &str,
        rule: SizeRule,
        cut: Cut,
        pairs: &[(u64, Entry)],
    ) -> Result<(Record, Vec<Entry>)> {
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
        let reply: Vec<Vec<u8>> = retry(&self.h, |c| {
            let mut inv = self.h.invocation(&self.commit);
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
        let old = it.map(|v| Entry::decode(&v)).collect::<Result<Vec<_>>>()?;
        Ok((record::decode(&rec)?, old))
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

    /// flush, then `WAIT 1` on every master that took a block or the
    /// script of this file since its last sync: an acknowledged fsync is on
    /// a replica.
    pub fn sync(&self, ino: u64) -> Result<Option<Record>> {
        let f = self.file(ino);
        let mut st = f.st.lock();
        let rec = if st.dirty.is_empty() {
            None
        } else {
            let size = st.size;
            Some(self.commit(
                ino,
                &f,
                &mut st,
                "write",
                SizeRule::Max(size),
                Cut::default(),
            )?)
        };
        let keys: Vec<String> = st.unsynced.values().cloned().collect();
        self.blocks.wait_replicas(&keys)?;
        st.unsynced.clear();
        Ok(rec)
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
        let mut st = f.st.lock();
        // Dirty blocks wholly past the end go; the boundary one is cut.
        let keep_from = size.div_ceil(bs);
        st.dirty.retain(|&i, _| i < keep_from);
        let tail = (size % bs) as usize;
        if tail != 0
            && let Some(b) = st.dirty.get_mut(&(size / bs))
        {
            b.truncate(tail);
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
        let all: Vec<Arc<File>> = self.files.lock().values().cloned().collect();
        for f in all {
            let mut st = f.st.lock();
            st.map = None;
        }
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
                b[a..z].fill(0);
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

fn puts_ids(new: &[(u64, Entry, Arc<[u8]>)]) -> Vec<u64> {
    new.iter().map(|(_, e, _)| e.id).collect()
}
