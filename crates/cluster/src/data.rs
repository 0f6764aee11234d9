//! STAND-IN UNTIL vol-data MERGES: the integrator takes A2's file.
//!
//! File contents are A2's (crates/cluster data.rs and blocks.rs on branch
//! vol-data: dirty buffers, a block cache, WAIT on fsync). This stand-in
//! keeps the contract's signatures with the simplest correct behaviour, so
//! that `Volume` compiles and its tests run: no buffering and no cache;
//! each write is a whole-block read-modify-write of every block it
//! touches, each block written new and then swapped in by one fenced
//! commit script; reads go to the cluster every time.

use std::sync::Arc;

use memfs_fs::{Errno, FallocateMode};
use redis::{Script, Value};

use crate::error::{Error, Result};
use crate::handle::Handle;
use crate::lua;
use crate::record::{self, Record};

/// Swaps block `ARGV[5]` (hex) of ino `ARGV[4]` to value `ARGV[6]`, sets
/// size to at least `ARGV[7]`, mtime and ctime → `{old value, record}`.
const COMMIT: &str = r#"
local ino = tonumber(ARGV[4])
fence()
local r = rec_get(ino)
if not r then fail('ENOENT') end
local ck = P .. 'c:' .. hex(ino)
local old = redis.call('HGET', ck, ARGV[5]) or false
redis.call('HSET', ck, ARGV[5], ARGV[6])
local size = tonumber(ARGV[7])
if size > get_u64(r, OFF_SIZE) then r = set_u64(r, OFF_SIZE, size) end
r = set_bytes(set_bytes(r, OFF_MTIME, NOW), OFF_CTIME, NOW)
rec_put(ino, r)
feed('op', 'write', 'ino', ino)
return {old, r}
"#;

/// Truncates ino `ARGV[4]` to `ARGV[5]` bytes (block size `ARGV[6]`) →
/// `{record, freed values}`.
const TRUNCATE: &str = r#"
local ino, size, bs = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
fence()
local r = rec_get(ino)
if not r then fail('ENOENT') end
local ck = P .. 'c:' .. hex(ino)
local all = redis.call('HGETALL', ck)
local freed = {}
for i = 1, #all, 2 do
  local start = tonumber(all[i], 16) * bs
  local v = all[i + 1]
  local len = struct.unpack('<I4', v, 9)
  if start >= size then
    redis.call('HDEL', ck, all[i])
    freed[#freed + 1] = v
  elseif start + len > size then
    redis.call('HSET', ck, all[i], string.sub(v, 1, 8) .. struct.pack('<I4', size - start))
  end
end
r = set_u64(r, OFF_SIZE, size)
r = set_bytes(set_bytes(r, OFF_MTIME, NOW), OFF_CTIME, NOW)
rec_put(ino, r)
feed('op', 'truncate', 'ino', ino)
return {r, freed}
"#;

/// File data of one mount (stand-in: no buffering, no cache).
pub struct Data {
    h: Arc<Handle>,
    commit: Script,
    truncate: Script,
}

fn map_key(h: &Handle, ino: u64) -> String {
    format!("{{{}}}:c:{ino:x}", h.keys.name())
}

fn parse_value(v: &[u8]) -> Option<(u64, u32)> {
    let id = u64::from_le_bytes(v.get(..8)?.try_into().ok()?);
    let len = u32::from_le_bytes(v.get(8..12)?.try_into().ok()?);
    Some((id, len))
}

fn bytes_of(v: Option<&Value>) -> Result<Option<Vec<u8>>> {
    match v {
        None | Some(Value::Nil) => Ok(None),
        Some(Value::BulkString(b)) => Ok(Some(b.clone())),
        other => Err(Error::Protocol(format!("not bytes: {other:?}"))),
    }
}

impl Data {
    pub fn new(h: Arc<Handle>, _cache_bytes: u64) -> Data {
        Data {
            h,
            commit: Script::new(&lua::script(COMMIT)),
            truncate: Script::new(&lua::script(TRUNCATE)),
        }
    }

    fn bs(&self) -> u64 {
        u64::from(self.h.block_size)
    }

    /// Block `idx` of `ino` as stored (its length's bytes), if any.
    fn block(&self, ino: u64, idx: u64) -> Result<Option<Vec<u8>>> {
        let v: Option<Vec<u8>> = self.h.pool.with(|c| {
            redis::cmd("HGET")
                .arg(map_key(&self.h, ino))
                .arg(format!("{idx:x}"))
                .query(c)
        })?;
        let Some((id, len)) = v.as_deref().and_then(parse_value) else {
            return Ok(None);
        };
        let mut b: Vec<u8> = self
            .h
            .pool
            .with(|c| redis::cmd("GET").arg(self.h.keys.block(id)).query(c))?;
        b.resize(len as usize, 0);
        Ok(Some(b))
    }

    pub fn write(&self, ino: u64, off: u64, data: &[u8], size: u64) -> Result<u64> {
        let bs = self.bs();
        let end = off + data.len() as u64;
        let mut pos = off;
        while pos < end {
            let idx = pos / bs;
            let in_block = (pos % bs) as usize;
            let n = ((bs - pos % bs).min(end - pos)) as usize;
            let mut b = self.block(ino, idx)?.unwrap_or_default();
            if b.len() < in_block + n {
                b.resize(in_block + n, 0);
            }
            let src = (pos - off) as usize;
            b[in_block..in_block + n].copy_from_slice(&data[src..src + n]);
            let id: u64 = self.h.pool.with(|c| {
                redis::cmd("HINCRBY")
                    .arg(self.h.keys.next())
                    .arg("block")
                    .arg(1)
                    .query(c)
            })?;
            self.h
                .pool
                .with(|c| redis::cmd("SET").arg(self.h.keys.block(id)).arg(&b).exec(c))?;
            let mut value = id.to_le_bytes().to_vec();
            value.extend_from_slice(&(b.len() as u32).to_le_bytes());
            let mut inv = self.h.invocation(&self.commit);
            inv.arg(ino)
                .arg(format!("{idx:x}"))
                .arg(value)
                .arg(pos + n as u64);
            let v: Value = self.h.pool.with(|c| inv.invoke(c))?;
            if let Value::Array(a) = &v
                && let Some(old) = bytes_of(a.first())?
            {
                self.free_blocks(&[old]);
            }
            pos += n as u64;
        }
        Ok(size.max(end))
    }

    pub fn read_with<R>(
        &self,
        ino: u64,
        off: u64,
        len: usize,
        size: u64,
        f: impl FnOnce(&[&[u8]]) -> R,
    ) -> Result<R> {
        let end = size.min(off.saturating_add(len as u64));
        let mut out = Vec::with_capacity(end.saturating_sub(off) as usize);
        let bs = self.bs();
        let mut pos = off;
        while pos < end {
            let idx = pos / bs;
            let in_block = (pos % bs) as usize;
            let n = ((bs - pos % bs).min(end - pos)) as usize;
            let b = self.block(ino, idx)?.unwrap_or_default();
            for i in in_block..in_block + n {
                out.push(b.get(i).copied().unwrap_or(0));
            }
            pos += n as u64;
        }
        Ok(f(&[&out]))
    }

    pub fn dirty(&self, _ino: u64) -> Option<(u64, i64)> {
        None
    }

    pub fn flush(&self, _ino: u64) -> Result<Option<Record>> {
        Ok(None)
    }

    pub fn sync(&self, _ino: u64) -> Result<Option<Record>> {
        Ok(None)
    }

    pub fn truncate(&self, ino: u64, size: u64) -> Result<Record> {
        let mut inv = self.h.invocation(&self.truncate);
        inv.arg(ino).arg(size).arg(self.bs());
        let v: Value = self.h.pool.with(|c| inv.invoke(c))?;
        let Value::Array(a) = v else {
            return Err(Error::Protocol("truncate reply".into()));
        };
        let r = record::decode(&bytes_of(a.first())?.unwrap_or_default())?;
        if let Some(Value::Array(freed)) = a.get(1) {
            let vals: Vec<Vec<u8>> = freed
                .iter()
                .filter_map(|v| bytes_of(Some(v)).ok().flatten())
                .collect();
            self.free_blocks(&vals);
        }
        Ok(r)
    }

    pub fn invalidate(&self, _ino: u64) {}

    pub fn invalidate_all(&self) {}

    pub fn forget(&self, _ino: u64) {}

    pub fn free_blocks(&self, map_values: &[Vec<u8>]) {
        for v in map_values {
            if let Some((id, _)) = parse_value(v) {
                let r = self
                    .h
                    .pool
                    .with(|c| redis::cmd("DEL").arg(self.h.keys.block(id)).exec(c));
                if let Err(e) = r {
                    tracing::warn!(error = %e, id, "a freed block stays (the cleaner takes it)");
                }
            }
        }
    }

    pub fn lseek(&self, _ino: u64, off: u64, whence: i32, size: u64) -> Result<u64> {
        match whence {
            libc::SEEK_DATA | libc::SEEK_HOLE if off >= size => Err(Error::Errno(Errno::ENXIO)),
            libc::SEEK_DATA => Ok(off),
            libc::SEEK_HOLE => Ok(size),
            _ => Err(Error::Errno(Errno::EINVAL)),
        }
    }

    pub fn fallocate(
        &self,
        ino: u64,
        off: u64,
        len: u64,
        mode: FallocateMode,
        size: u64,
    ) -> Result<Record> {
        let end = off.saturating_add(len);
        let zero_end = if mode.punch_hole || mode.keep_size {
            end.min(size)
        } else {
            end
        };
        if (mode.punch_hole || mode.zero_range) && zero_end > off {
            let zeros = vec![0; (zero_end - off) as usize];
            self.write(ino, off, &zeros, size)?;
        }
        let new = if mode.keep_size { size } else { size.max(end) };
        self.truncate(ino, new)
    }

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
        let buf = self.read_with(ino_in, off_in, len as usize, size_in, |s| s.concat())?;
        let n = buf.len() as u64;
        let size = self.write(ino_out, off_out, &buf, size_out)?;
        Ok((n, self.truncate(ino_out, size)?))
    }

    pub fn cached_bytes(&self) -> u64 {
        0
    }

    pub fn hits(&self) -> (u64, u64) {
        (0, 0)
    }
}
