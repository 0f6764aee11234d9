//! The namespace scripts of a mounted volume (docs/cluster.md,
//! "Operations"): one Lua script per operation, run on the metadata master,
//! so that every operation is atomic and appends its feed entry in the same
//! step. Every mutating script calls `fence()` first and raises its errno
//! before its first write (Redis does not roll a script back).
//!
//! Layout kept here beyond the shared one (crate::lua, docs/cluster.md):
//! a directory's entries hash `{V}:d:<ino>` also holds `..` → its parent
//! (`ino u64, type u8`, like any entry): `..` is never a real name (EEXIST
//! on create), so it cannot collide, and it gives `..` lookups, readdir's
//! `..` and the rename loop check (a directory moved under itself) their
//! parent in the same slot. A directory is empty when its hash has only
//! `..` (the root, made by `Admin::create`, has none: it is never removed).
//!
//! A node whose last link goes is freed in the same script (record,
//! entries, xattrs, locks and block map deleted; the block map's values
//! returned so that the caller frees the blocks), unless it is a regular
//! file that the caller holds open or that another live session might:
//! then it goes to `{V}:orphans` (→ the server's ms of the unlink), the
//! caller's hold is `o:<ino hex>` in its session hash, and an `orphan` feed
//! entry tells the other mounts to register theirs. The reaper
//! (crate::session) frees an orphan nobody holds once it is older than one
//! lease.

use std::time::{Duration, Instant};

use redis::{Script, Value};

use crate::error::{Error, Result};
use crate::handle::Handle;
use crate::lua;
use crate::record::{self, Record};

/// Helpers of the namespace scripts, after crate::lua's prelude.
pub const NS_PRELUDE: &str = r#"
local LINK_MAX = 4294967294
local DIRENT = 20

local function ent_key(ino) return P .. 'd:' .. hex(ino) end
local function ent_pack(ino, k) return struct.pack('<I8', ino) .. string.char(k) end
local function ent_ino(e) return (struct.unpack('<I8', e, 1)) end
local function ent_kind(e) return string.byte(e, 9) end

local function get_mode(r) return (struct.unpack('<I2', r, OFF_MODE + 1)) end
local function set_mode(r, m)
  return string.sub(r, 1, OFF_MODE) .. struct.pack('<I2', m) .. string.sub(r, OFF_MODE + 3)
end
local function nlink(r) return get_u32(r, OFF_NLINK) end
local function add_links(r, n)
  local v = nlink(r) + n
  if v < 0 then v = 0 end
  return set_u32(r, OFF_NLINK, v)
end
local function touch_mc(r)
  r = set_bytes(r, OFF_MTIME, NOW)
  return set_bytes(r, OFF_CTIME, NOW)
end
local function touch_c(r) return set_bytes(r, OFF_CTIME, NOW) end
-- A directory's size is 20 bytes per entry, `.` and `..` included, as the
-- engine's: record `r`'s size plus `n`, clamped at 0.
local function size_plus(r, n)
  local v = get_u64(r, OFF_SIZE) + n
  if v < 0 then v = 0 end
  return v
end
local function add_size(r, n) return set_u64(r, OFF_SIZE, size_plus(r, n)) end
-- A directory whose entries changed: size by `n`, mtime and ctime now; one
-- concatenation (mtime and ctime are adjacent), where add_size(touch_mc(r))
-- made three records on the way.
local function entry_changed(r, n)
  return string.sub(r, 1, OFF_SIZE) .. struct.pack('<I8', size_plus(r, n)) ..
    string.sub(r, OFF_SIZE + 9, OFF_MTIME) .. NOW .. NOW .. string.sub(r, OFF_CTIME + 9)
end

-- The directory record of `ino`, checked as the engine checks a parent.
local function dir_rec(ino)
  local r = rec_get(ino)
  if not r then fail('ENOENT') end
  if kind(r) ~= KIND_DIR then fail('ENOTDIR') end
  return r
end

-- Whether a session other than the caller's holds a live lease.
local function another_live()
  return redis.call('ZCOUNT', P .. 'sessions', now_ms(), '+inf') > 1
end

-- Deletes node `ino` whole (`orphan`: it is in `{V}:orphans`); returns its
-- block map's values.
local function free_node(ino, orphan)
  local h = hex(ino)
  local vals = redis.call('HVALS', P .. 'c:' .. h)
  redis.call('DEL', P .. 'c:' .. h, P .. 'd:' .. h, P .. 'x:' .. h, P .. 'l:' .. h)
  rec_del(ino)
  if orphan then redis.call('ZREM', P .. 'orphans', ino) end
  redis.call('HINCRBY', P .. 'next', 'inodes', '-1')
  return vals
end

-- Takes a link from node `ino` (record `r`): a directory loses all (it was
-- empty). With its last link gone the node is freed, or orphaned when it is
-- a file that the caller holds (`held` is its ino) or another session may.
-- Returns the new record (false when freed) and the freed block map values.
local function unlink_node(ino, r, held)
  local n = 0
  if kind(r) ~= KIND_DIR then n = nlink(r) - 1 end
  if n < 0 then n = 0 end
  r = touch_c(set_u32(r, OFF_NLINK, n))
  if n > 0 then
    rec_put(ino, r)
    return r, {}
  end
  if kind(r) == KIND_FILE and (held == ino or another_live()) then
    rec_put(ino, r)
    redis.call('ZADD', P .. 'orphans', now_ms(), ino)
    if held == ino then
      redis.call('HSET', P .. 's:' .. SID, 'o:' .. hex(ino), 1)
    end
    feed('op', 'orphan', 'ino', ino)
    return r, {}
  end
  return false, free_node(ino, false)
end

local function kill_priv(p)
  p = bit.band(p, 63487)            -- ~S_ISUID (0o4000)
  if bit.band(p, 8) ~= 0 then       -- S_IXGRP
    p = bit.band(p, 64511)          -- ~S_ISGID (0o2000)
  end
  return p
end
"#;

fn ns_script(body: &str) -> Script {
    Script::new(&lua::script_with(NS_PRELUDE, body))
}

fn ns_read_script(body: &str) -> Script {
    Script::new(&lua::read_script_with(NS_PRELUDE, body))
}

/// lookup: ARGV parent, name → `{0}` (no such name) or `{ino, record}`.
const LOOKUP: &str = r#"
local parent = tonumber(ARGV[4])
dir_rec(parent)
local e = redis.call('HGET', ent_key(parent), ARGV[5])
if not e then return {0} end
local ino = ent_ino(e)
local r = rec_get(ino)
if not r then return {0} end
return {ino, r}
"#;

/// getattr of many: ARGV inos → their records (nil when gone).
const RECORDS: &str = r#"
local out = {}
for i = 4, #ARGV do
  out[#out + 1] = rec_get(tonumber(ARGV[i])) or false
end
return out
"#;

/// create, mknod, mkdir, symlink: ARGV parent, name, record, ctx uid, ctx
/// gid, open_existing, op → `{created 1|0, ino, record, parent record}`.
const MAKE: &str = r#"
local parent, name, r = tonumber(ARGV[4]), ARGV[5], ARGV[6]
local cuid, cgid = tonumber(ARGV[7]), tonumber(ARGV[8])
fence()
local pr = dir_rec(parent)
if nlink(pr) == 0 then fail('ENOENT') end
local ek = ent_key(parent)
local old = redis.call('HGET', ek, name)
if old then
  if ARGV[9] == '1' then
    local oino = ent_ino(old)
    local orec = rec_get(oino)
    if not orec then fail('ENOENT') end
    if kind(orec) == KIND_DIR then fail('EISDIR') end
    return {0, oino, orec, pr}
  end
  fail('EEXIST')
end
local k = kind(r)
if k == KIND_DIR and nlink(pr) >= LINK_MAX then fail('EMLINK') end
-- The group and setgid a node takes from its directory (the engine's inherit_from_parent).
local mode, gid = get_mode(r), cgid
if bit.band(get_mode(pr), 1024) ~= 0 then
  gid = get_u32(pr, OFF_GID)
  if k == KIND_DIR then mode = bit.bor(mode, 1024) end
end
if k ~= KIND_DIR and cuid ~= 0 and gid ~= cgid then mode = bit.band(mode, 64511) end
if mode ~= get_mode(r) then r = set_mode(r, mode) end
if gid ~= get_u32(r, OFF_GID) then r = set_u32(r, OFF_GID, gid) end
local ino = redis.call('HINCRBY', P .. 'next', 'ino', '1')
redis.call('HINCRBY', P .. 'next', 'inodes', '1')
redis.call('HSETNX', ek, name, ent_pack(ino, k))
if k == KIND_DIR then
  redis.call('HSET', ent_key(ino), '..', ent_pack(parent, KIND_DIR))
  pr = add_links(pr, 1)
end
rec_put(ino, r)
pr = entry_changed(pr, DIRENT)
rec_put(parent, pr)
feed('op', ARGV[10], 'ino', ino, 'parent', ARGV[4], 'name', name)
return {1, ino, r, pr}
"#;

/// link: ARGV ino, newparent, newname → `{record, parent record}`.
const LINK: &str = r#"
local ino, parent, name = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
fence()
local r = rec_get(ino)
if not r then fail('ENOENT') end
if kind(r) == KIND_DIR then fail('EPERM') end
local pr = dir_rec(parent)
if nlink(pr) == 0 then fail('ENOENT') end
local ek = ent_key(parent)
if redis.call('HEXISTS', ek, name) == 1 then fail('EEXIST') end
if nlink(r) == 0 then fail('ENOENT') end
if nlink(r) >= LINK_MAX then fail('EMLINK') end
r = touch_c(add_links(r, 1))
rec_put(ino, r)
redis.call('HSET', ek, name, ent_pack(ino, kind(r)))
pr = entry_changed(pr, DIRENT)
rec_put(parent, pr)
feed('op', 'link', 'ino', ARGV[4], 'parent', ARGV[5], 'name', name)
return {r, pr}
"#;

/// unlink, rmdir: ARGV parent, name, want_dir, held → `{parent record,
/// ino, node record or nil, freed block map values}`.
const REMOVE: &str = r#"
local parent, name, want_dir = tonumber(ARGV[4]), ARGV[5], ARGV[6] == '1'
local held = tonumber(ARGV[7])
fence()
local pr = dir_rec(parent)
local ek = ent_key(parent)
local e = redis.call('HGET', ek, name)
if not e then fail('ENOENT') end
local ino, k = ent_ino(e), ent_kind(e)
if want_dir and k ~= KIND_DIR then fail('ENOTDIR') end
if not want_dir and k == KIND_DIR then fail('EISDIR') end
local r = rec_get(ino)
if want_dir and redis.call('HLEN', ent_key(ino)) > 1 then fail('ENOTEMPTY') end
redis.call('HDEL', ek, name)
if k == KIND_DIR then pr = add_links(pr, -1) end
pr = entry_changed(pr, -DIRENT)
rec_put(parent, pr)
local nr, freed = false, {}
if r then nr, freed = unlink_node(ino, r, held) end
local op = 'unlink'
if want_dir then op = 'rmdir' end
feed('op', op, 'ino', ino, 'parent', ARGV[4], 'name', name)
return {pr, ino, nr, freed}
"#;

/// rename: ARGV parent, name, newparent, newname, noreplace, exchange, held
/// → `{{ino, record or nil, ...}, freed block map values, the moved node's
/// ino, the replaced (or exchanged) node's ino or 0}`; `{{}, {}}` when the
/// two names are one node's (nothing to do).
const RENAME: &str = r#"
local parent, name = tonumber(ARGV[4]), ARGV[5]
local newparent, newname = tonumber(ARGV[6]), ARGV[7]
local noreplace, exchange = ARGV[8] == '1', ARGV[9] == '1'
local held = tonumber(ARGV[10])
local cross = parent ~= newparent
fence()
local R = {}
local function load(ino)
  if R[ino] == nil then R[ino] = rec_get(ino) or false end
  return R[ino]
end
local sr = load(parent)
if not sr then fail('ENOENT') end
if not cross and kind(sr) ~= KIND_DIR then fail('ENOTDIR') end
local dr = load(newparent)
if not dr then fail('ENOENT') end
if kind(sr) ~= KIND_DIR or kind(dr) ~= KIND_DIR then fail('ENOTDIR') end
-- The ancestors of a directory, itself included, by the `..` entries.
local function chain(ino)
  local c = {[ino] = true}
  for _ = 1, 100000 do
    if ino == 1 then break end
    local up = redis.call('HGET', ent_key(ino), '..')
    if not up then break end
    ino = ent_ino(up)
    c[ino] = true
  end
  return c
end
local sek, dek = ent_key(parent), ent_key(newparent)
local se = redis.call('HGET', sek, name)
if not se then fail('ENOENT') end
local sino, skind = ent_ino(se), ent_kind(se)
local te = redis.call('HGET', dek, newname)
local tino, tkind = nil, nil
if te then tino, tkind = ent_ino(te), ent_kind(te) end
local sdir, tdir = skind == KIND_DIR, tkind == KIND_DIR
local schain = nil
if cross then
  schain = chain(parent)
  if sdir and chain(newparent)[sino] then fail('EINVAL') end
  if exchange and te and tdir and schain[tino] then fail('EINVAL') end
end
if nlink(dr) == 0 then fail('ENOENT') end
if not te and exchange then fail('ENOENT') end
if te then
  if noreplace then fail('EEXIST') end
  if tino == sino then return {{}, {}} end
end
if not exchange and te then
  if sdir and not tdir then fail('ENOTDIR') end
  if not sdir and tdir then fail('EISDIR') end
  local anc
  if cross then anc = schain[tino] else anc = tino == parent end
  if tdir and anc then fail('ENOTEMPTY') end
end
if not exchange and not te and sdir and cross and nlink(dr) >= LINK_MAX then fail('EMLINK') end
if not exchange and te and tdir and redis.call('HLEN', ent_key(tino)) > 1 then fail('ENOTEMPTY') end
local ms = load(sino)
if not ms then fail('ENOENT') end
-- Checked: now change.
local freed = {}
local function links(ino, n) R[ino] = add_links(load(ino), n) end
if exchange then
  redis.call('HSET', sek, name, ent_pack(tino, tkind))
  redis.call('HSET', dek, newname, ent_pack(sino, skind))
  if cross then
    if sdir then redis.call('HSET', ent_key(sino), '..', ent_pack(newparent, KIND_DIR)) end
    if tdir then redis.call('HSET', ent_key(tino), '..', ent_pack(parent, KIND_DIR)) end
    if sdir and not tdir then links(parent, -1); links(newparent, 1) end
    if tdir and not sdir then links(parent, 1); links(newparent, -1) end
  end
  R[tino] = touch_c(load(tino))
else
  if te then
    if tdir then links(newparent, -1) end
    local vr = load(tino)
    if vr then
      local nr
      nr, freed = unlink_node(tino, vr, held)
      R[tino] = nr
    end
  end
  redis.call('HDEL', sek, name)
  redis.call('HSET', dek, newname, ent_pack(sino, skind))
  if not te then R[parent] = add_size(load(parent), -DIRENT); R[newparent] = add_size(load(newparent), DIRENT) end
  if sdir then
    redis.call('HSET', ent_key(sino), '..', ent_pack(newparent, KIND_DIR))
    if cross then links(parent, -1); links(newparent, 1) end
  end
end
R[sino] = touch_c(load(sino))
R[parent] = touch_mc(load(parent))
R[newparent] = touch_mc(load(newparent))
local out = {}
for ino, r in pairs(R) do
  if r and (ino ~= tino or exchange or R[tino]) then rec_put(ino, r) end
  out[#out + 1] = ino
  out[#out + 1] = r
end
local victim = tino or 0
feed('op', 'rename', 'ino', sino, 'parent', ARGV[4], 'name', name,
  'parent2', ARGV[6], 'name2', newname, 'ino2', victim)
return {out, freed, sino, victim}
"#;

/// setattr of mode, owner, times: ARGV ino, then `Meta`'s fields (see
/// [`MetaSet`]) → the new record.
const SETATTR: &str = r#"
local ino = tonumber(ARGV[4])
local has_mode, mode = ARGV[5] == '1', tonumber(ARGV[6])
local has_uid, uid = ARGV[7] == '1', tonumber(ARGV[8])
local has_gid, gid = ARGV[9] == '1', tonumber(ARGV[10])
local atime, mtime, ctime = ARGV[11], ARGV[12], ARGV[13]
local cuid, cgid = tonumber(ARGV[14]), tonumber(ARGV[15])
local ig_gid, ig = tonumber(ARGV[16]), ARGV[17] == '1'
local truncated, nothing = ARGV[18] == '1', ARGV[19] == '1'
fence()
local r = rec_get(ino)
if not r then fail('ENOENT') end
local function in_group(g) return g == ig_gid and ig end
-- The engine's kill_priv_of: an unprivileged caller also loses setgid
-- outside the file's group.
local function kill_priv_of(p, g)
  if cuid == 0 then return p end
  p = kill_priv(p)
  if bit.band(p, 1024) ~= 0 and cgid ~= g and not in_group(g) then p = bit.band(p, 64511) end
  return p
end
local perm = get_mode(r)
if truncated then perm = kill_priv_of(perm, get_u32(r, OFF_GID)) end
if has_mode then
  perm = bit.band(mode, 4095)
  r = touch_c(r)
end
if has_uid or has_gid then
  local old_gid = get_u32(r, OFF_GID)
  if has_uid then r = set_u32(r, OFF_UID, uid) end
  if has_gid then r = set_u32(r, OFF_GID, gid) end
  if kind(r) ~= KIND_DIR then perm = kill_priv_of(kill_priv(perm), old_gid) end
  r = touch_c(r)
end
r = set_mode(r, perm)
if atime ~= '' then
  if atime == 'now' then atime = NOW end
  r = touch_c(set_bytes(r, OFF_ATIME, atime))
end
if mtime ~= '' then
  if mtime == 'now' then mtime = NOW end
  r = touch_c(set_bytes(r, OFF_MTIME, mtime))
end
if ctime ~= '' then r = set_bytes(r, OFF_CTIME, ctime) end
if nothing then r = touch_c(r) end
rec_put(ino, r)
feed('op', 'setattr', 'ino', ARGV[4])
return r
"#;

/// setxattr: ARGV ino, name, value, mode (0 any, 1 create, 2 replace).
const SETXATTR: &str = r#"
local ino, name, value, mode = tonumber(ARGV[4]), ARGV[5], ARGV[6], ARGV[7]
fence()
local r = rec_get(ino)
if not r then fail('ENOENT') end
local k = kind(r)
if string.sub(name, 1, 5) == 'user.' and k ~= KIND_FILE and k ~= KIND_DIR then fail('EPERM') end
if #value > 65536 then fail('E2BIG') end
local xk = P .. 'x:' .. hex(ino)
local exists = redis.call('HEXISTS', xk, name) == 1
if exists and mode == '1' then fail('EEXIST') end
if not exists and mode == '2' then fail('ENODATA') end
if not exists then
  local len = #name + 1
  for _, n in ipairs(redis.call('HKEYS', xk)) do len = len + #n + 1 end
  if len > 65536 then fail('ENOSPC') end
end
redis.call('HSET', xk, name, value)
r = touch_c(r)
rec_put(ino, r)
feed('op', 'xattr', 'ino', ARGV[4])
return r
"#;

/// removexattr: ARGV ino, name.
const REMOVEXATTR: &str = r#"
local ino, name = tonumber(ARGV[4]), ARGV[5]
fence()
local r = rec_get(ino)
if not r then fail('ENOENT') end
if redis.call('HDEL', P .. 'x:' .. hex(ino), name) == 0 then fail('ENODATA') end
r = touch_c(r)
rec_put(ino, r)
feed('op', 'xattr', 'ino', ARGV[4])
return r
"#;

/// getxattr: ARGV ino, name → the value.
const GETXATTR: &str = r#"
local ino = tonumber(ARGV[4])
if not rec_get(ino) then fail('ENOENT') end
local v = redis.call('HGET', P .. 'x:' .. hex(ino), ARGV[5])
if not v then fail('ENODATA') end
return v
"#;

/// listxattr: ARGV ino → the names.
const LISTXATTR: &str = r#"
local ino = tonumber(ARGV[4])
if not rec_get(ino) then fail('ENOENT') end
return redis.call('HKEYS', P .. 'x:' .. hex(ino))
"#;

/// readdir: ARGV ino → `{record, name, entry, name, entry, ...}`.
const LIST: &str = r#"
local ino = tonumber(ARGV[4])
local r = dir_rec(ino)
local out = {r}
for _, v in ipairs(redis.call('HGETALL', ent_key(ino))) do out[#out + 1] = v end
return out
"#;

/// The hold of an orphan this session has open: ARGV ino, 1 to hold, 0 to
/// release. Releasing the last hold of an orphan frees it when no other
/// session is live or it is older than `grace` ms (ARGV 6); otherwise the
/// reaper does, later. → the freed block map values.
const HOLD: &str = r#"
local ino, hold, grace = tonumber(ARGV[4]), ARGV[5] == '1', tonumber(ARGV[6])
fence()
local since = redis.call('ZSCORE', P .. 'orphans', ino)
local field = 'o:' .. hex(ino)
if hold then
  if since then redis.call('HSET', P .. 's:' .. SID, field, 1) end
  return {}
end
redis.call('HDEL', P .. 's:' .. SID, field)
if not since then return {} end
local old = tonumber(since) + grace < now_ms()
if another_live() and not old then return {} end
for _, s in ipairs(redis.call('ZRANGE', P .. 'sessions', 0, -1)) do
  if redis.call('HEXISTS', P .. 's:' .. s, field) == 1 then return {} end
end
local freed = free_node(ino, true)
feed('op', 'reap', 'ino', ino)
return freed
"#;

/// The compiled scripts (each `Script` knows its SHA1).
pub struct Scripts {
    lookup: Script,
    records: Script,
    make: Script,
    link: Script,
    remove: Script,
    rename: Script,
    setattr: Script,
    setxattr: Script,
    removexattr: Script,
    getxattr: Script,
    listxattr: Script,
    list: Script,
    hold: Script,
}

impl Default for Scripts {
    fn default() -> Scripts {
        Scripts::new()
    }
}

/// A directory entry as stored: name, ino, type code.
pub type RawEntry = (Vec<u8>, u64, u8);

/// What a MAKE script made or found.
pub struct Made {
    pub created: bool,
    pub ino: u64,
    pub rec: Record,
    pub parent: Record,
}

/// What a REMOVE script changed.
pub struct Removed {
    pub parent: Record,
    pub ino: u64,
    /// The node's record after, `None` when it was freed.
    pub rec: Option<Record>,
    pub freed: Vec<Vec<u8>>,
}

/// What a RENAME script changed: every record it touched (`None`: freed).
#[derive(Default)]
pub struct Renamed {
    pub recs: Vec<(u64, Option<Record>)>,
    pub freed: Vec<Vec<u8>>,
    /// The node that moved (0 when nothing changed: the two names were one
    /// node's).
    pub src: u64,
    /// The node the new name had (replaced, or exchanged), 0 for none.
    pub victim: u64,
}

/// The parts of a setattr the metadata script applies (times as 8 bytes
/// LE of ns, `now`, or empty for unchanged).
#[derive(Default)]
pub struct MetaSet {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime: Vec<u8>,
    pub mtime: Vec<u8>,
    pub ctime: Vec<u8>,
    pub ctx_uid: u32,
    pub ctx_gid: u32,
    /// A gid and whether the caller is in it (asked of the group the
    /// caller's cached record named).
    pub in_group: (u32, bool),
    pub truncated: bool,
    pub nothing: bool,
}

impl Scripts {
    pub fn new() -> Scripts {
        Scripts {
            lookup: ns_read_script(LOOKUP),
            records: ns_read_script(RECORDS),
            make: ns_script(MAKE),
            link: ns_script(LINK),
            remove: ns_script(REMOVE),
            rename: ns_script(RENAME),
            setattr: ns_script(SETATTR),
            setxattr: ns_script(SETXATTR),
            removexattr: ns_script(REMOVEXATTR),
            getxattr: ns_read_script(GETXATTR),
            listxattr: ns_read_script(LISTXATTR),
            list: ns_read_script(LIST),
            hold: ns_script(HOLD),
        }
    }

    /// `(ino, record)` of `name` in `parent`, `None` if there is none.
    pub fn lookup(&self, h: &Handle, parent: u64, name: &[u8]) -> Result<Option<(u64, Record)>> {
        let v: Value = call(h, &self.lookup, |i| {
            i.arg(parent).arg(name);
        })?;
        let a = array(v)?;
        let ino = int(a.first())?;
        if ino == 0 {
            return Ok(None);
        }
        Ok(Some((ino, rec(a.get(1))?)))
    }

    /// The records of `inos`, `None` for those that are gone.
    pub fn records(&self, h: &Handle, inos: &[u64]) -> Result<Vec<Option<Record>>> {
        let v: Value = call(h, &self.records, |i| {
            for ino in inos {
                i.arg(*ino);
            }
        })?;
        array(v)?.iter().map(|v| opt_rec(Some(v))).collect()
    }

    /// Makes `name` in `parent` with record `r` (its group and setgid
    /// adjusted by the script), or with `open_existing` finds the node
    /// already there.
    #[allow(clippy::too_many_arguments)]
    pub fn make(
        &self,
        h: &Handle,
        parent: u64,
        name: &[u8],
        r: &Record,
        ctx: (u32, u32),
        open_existing: bool,
        op: &str,
    ) -> Result<Made> {
        let v: Value = call(h, &self.make, |i| {
            i.arg(parent)
                .arg(name)
                .arg(record::to_vec(r))
                .arg(ctx.0)
                .arg(ctx.1)
                .arg(if open_existing { "1" } else { "0" })
                .arg(op);
        })?;
        let a = array(v)?;
        Ok(Made {
            created: int(a.first())? == 1,
            ino: int(a.get(1))?,
            rec: rec(a.get(2))?,
            parent: rec(a.get(3))?,
        })
    }

    /// A new link `parent/name` to `ino`: `(record, parent record)`.
    pub fn link(&self, h: &Handle, ino: u64, parent: u64, name: &[u8]) -> Result<(Record, Record)> {
        let v: Value = call(h, &self.link, |i| {
            i.arg(ino).arg(parent).arg(name);
        })?;
        let a = array(v)?;
        Ok((rec(a.first())?, rec(a.get(1))?))
    }

    /// unlink (`want_dir` false) or rmdir; `held` is an ino this mount has
    /// open (0 for none) that becomes an orphan rather than freed.
    pub fn remove(
        &self,
        h: &Handle,
        parent: u64,
        name: &[u8],
        want_dir: bool,
        held: u64,
    ) -> Result<Removed> {
        let v: Value = call(h, &self.remove, |i| {
            i.arg(parent)
                .arg(name)
                .arg(if want_dir { "1" } else { "0" })
                .arg(held);
        })?;
        let a = array(v)?;
        Ok(Removed {
            parent: rec(a.first())?,
            ino: int(a.get(1))?,
            rec: opt_rec(a.get(2))?,
            freed: bytes_list(a.get(3))?,
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub fn rename(
        &self,
        h: &Handle,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        noreplace: bool,
        exchange: bool,
        held: u64,
    ) -> Result<Renamed> {
        let flag = |b: bool| if b { "1" } else { "0" };
        let v: Value = call(h, &self.rename, |i| {
            i.arg(parent)
                .arg(name)
                .arg(newparent)
                .arg(newname)
                .arg(flag(noreplace))
                .arg(flag(exchange))
                .arg(held);
        })?;
        let a = array(v)?;
        let pairs = match a.first() {
            Some(v) => array(v.clone())?,
            None => Vec::new(),
        };
        let num = |i: usize| a.get(i).map_or(Ok(0), |v| int(Some(v)));
        let mut out = Renamed {
            freed: bytes_list(a.get(1))?,
            src: num(2)?,
            victim: num(3)?,
            ..Renamed::default()
        };
        for p in pairs.chunks(2) {
            out.recs.push((int(p.first())?, opt_rec(p.get(1))?));
        }
        Ok(out)
    }

    pub fn setattr(&self, h: &Handle, ino: u64, s: &MetaSet) -> Result<Record> {
        let flag = |b: bool| if b { "1" } else { "0" };
        let v: Value = call(h, &self.setattr, |i| {
            i.arg(ino)
                .arg(flag(s.mode.is_some()))
                .arg(s.mode.unwrap_or(0))
                .arg(flag(s.uid.is_some()))
                .arg(s.uid.unwrap_or(0))
                .arg(flag(s.gid.is_some()))
                .arg(s.gid.unwrap_or(0))
                .arg(s.atime.as_slice())
                .arg(s.mtime.as_slice())
                .arg(s.ctime.as_slice())
                .arg(s.ctx_uid)
                .arg(s.ctx_gid)
                .arg(s.in_group.0)
                .arg(flag(s.in_group.1))
                .arg(flag(s.truncated))
                .arg(flag(s.nothing));
        })?;
        rec(Some(&v))
    }

    pub fn setxattr(
        &self,
        h: &Handle,
        ino: u64,
        name: &[u8],
        value: &[u8],
        mode: u8,
    ) -> Result<Record> {
        let v: Value = call(h, &self.setxattr, |i| {
            i.arg(ino).arg(name).arg(value).arg(mode);
        })?;
        rec(Some(&v))
    }

    pub fn removexattr(&self, h: &Handle, ino: u64, name: &[u8]) -> Result<Record> {
        let v: Value = call(h, &self.removexattr, |i| {
            i.arg(ino).arg(name);
        })?;
        rec(Some(&v))
    }

    pub fn getxattr(&self, h: &Handle, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        call(h, &self.getxattr, |i| {
            i.arg(ino).arg(name);
        })
    }

    pub fn listxattr(&self, h: &Handle, ino: u64) -> Result<Vec<Vec<u8>>> {
        call(h, &self.listxattr, |i| {
            i.arg(ino);
        })
    }

    /// Directory `ino`'s record and entries `(name, ino, type code)`, `..`
    /// included.
    pub fn list(&self, h: &Handle, ino: u64) -> Result<(Record, Vec<RawEntry>)> {
        let v: Value = call(h, &self.list, |i| {
            i.arg(ino);
        })?;
        let a = array(v)?;
        let r = rec(a.first())?;
        let mut out = Vec::with_capacity(a.len() / 2);
        for p in a.get(1..).unwrap_or_default().chunks(2) {
            let name = bytes(p.first())?;
            let e = bytes(p.get(1))?;
            out.push((name, entry_ino(&e)?, e[8]));
        }
        Ok((r, out))
    }

    /// Holds (`hold`) or releases this session's open of orphan `ino`;
    /// returns the freed block map values.
    pub fn hold(&self, h: &Handle, ino: u64, hold: bool, grace_ms: u64) -> Result<Vec<Vec<u8>>> {
        let v: Value = call(h, &self.hold, |i| {
            i.arg(ino).arg(if hold { "1" } else { "0" }).arg(grace_ms);
        })?;
        bytes_list(Some(&v))
    }
}

/// [`run`], counted as one of the namespace's scripts ([`Handle::calls`]).
fn call<T: redis::FromRedisValue>(
    h: &Handle,
    s: &Script,
    args: impl FnOnce(&mut redis::ScriptInvocation<'_>),
) -> Result<T> {
    h.count_script();
    run(h, s, args)
}

/// Invokes `s` with the common arguments and those `args` adds (not
/// counted: the session's scripts use it directly).
pub fn run<T: redis::FromRedisValue>(
    h: &Handle,
    s: &Script,
    args: impl FnOnce(&mut redis::ScriptInvocation<'_>),
) -> Result<T> {
    let mut inv = h.invocation(s);
    args(&mut inv);
    // A script is not run twice blindly (a create run again after a reply
    // was lost would answer EEXIST): only a call that surely never ran is
    // tried again, as during a failover, until the pool's timeout.
    let deadline = Instant::now() + h.pool.timeout();
    let mut pause = Duration::from_millis(50);
    loop {
        match h.pool.with(|c| inv.invoke(c)) {
            Err(Error::Redis(e)) if never_ran(&e) && Instant::now() + pause < deadline => {
                tracing::debug!(error = %e, "script refused before it ran, trying again");
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            other => return other,
        }
    }
}

/// Whether a call failed before the server ran it: no connection was made,
/// or the node refused it for the state of the cluster.
fn never_ran(e: &redis::RedisError) -> bool {
    e.is_connection_refusal()
        || matches!(
            e.code(),
            Some("CLUSTERDOWN" | "TRYAGAIN" | "MASTERDOWN" | "LOADING")
        )
}

fn bad(what: &str, v: Option<&Value>) -> Error {
    Error::Protocol(format!("{what}: {v:?}"))
}

pub fn array(v: Value) -> Result<Vec<Value>> {
    match v {
        Value::Array(a) | Value::Set(a) => Ok(a),
        Value::Nil => Ok(Vec::new()),
        other => Err(bad("not an array", Some(&other))),
    }
}

pub fn int(v: Option<&Value>) -> Result<u64> {
    match v {
        Some(Value::Int(n)) if *n >= 0 => Ok(*n as u64),
        Some(Value::BulkString(b)) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("not a number", v)),
        _ => Err(bad("not a number", v)),
    }
}

pub fn bytes(v: Option<&Value>) -> Result<Vec<u8>> {
    match v {
        Some(Value::BulkString(b)) => Ok(b.clone()),
        Some(Value::SimpleString(s)) => Ok(s.clone().into_bytes()),
        _ => Err(bad("not bytes", v)),
    }
}

fn bytes_list(v: Option<&Value>) -> Result<Vec<Vec<u8>>> {
    match v {
        None | Some(Value::Nil) => Ok(Vec::new()),
        Some(v) => array(v.clone())?.iter().map(|b| bytes(Some(b))).collect(),
    }
}

fn rec(v: Option<&Value>) -> Result<Record> {
    record::decode(&bytes(v)?)
}

fn opt_rec(v: Option<&Value>) -> Result<Option<Record>> {
    match v {
        None | Some(Value::Nil) | Some(Value::Boolean(false)) => Ok(None),
        Some(Value::Int(0)) => Ok(None),
        v => rec(v).map(Some),
    }
}

fn entry_ino(e: &[u8]) -> Result<u64> {
    match e.get(..9) {
        Some(b) => {
            let mut a = [0; 8];
            a.copy_from_slice(&b[..8]);
            Ok(u64::from_le_bytes(a))
        }
        None => Err(Error::Protocol(format!("entry of {} bytes", e.len()))),
    }
}
