//! The Lua every volume script starts with (docs/cluster.md, "Operations").
//!
//! `KEYS[1]` is always `{V}:meta`, so the cluster routes the script to the
//! metadata master; further keys the script declares follow it. A script's
//! arguments begin with the same three: `ARGV[1]` the volume's
//! name (to build the keys of nodes the script finds itself, all in the
//! slot `{V}`), `ARGV[2]` the caller's session id (decimal), `ARGV[3]` the
//! caller's clock in ns since the epoch as 8 little-endian bytes (spliced
//! into records as they are: Lua 5.1 numbers are doubles, exact only to
//! 2^53, and ns times are above that). The operation's own arguments
//! follow from `ARGV[4]`.
//!
//! The rules every script keeps:
//! - **checks before writes**: Redis does not roll a script back when it
//!   fails half-way, so a script raises its errno (`fail('ENOENT')`) before
//!   its first write, never after;
//! - **fencing**: a mutating script calls `fence()` first: a session whose
//!   lease ran out by the server's clock gets ESTALE and changes nothing;
//! - **one feed entry per change**, appended by `feed(...)` in the same
//!   script, so the feed's order is the order of the changes.

/// The helpers; see the module doc for the argument convention.
pub const PRELUDE: &str = r#"
local V = ARGV[1]
local SID = ARGV[2]
local NOW = ARGV[3]
local P = '{' .. V .. '}:'

local function fail(name)
  error({err = name})
end

local function hex(n)
  return string.format('%x', n)
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function fence()
  local d = redis.call('ZSCORE', P .. 'sessions', SID)
  if not d or tonumber(d) < now_ms() then
    fail('ESTALE')
  end
end

local function rec_key(ino)
  return P .. 'i:' .. hex(math.floor(ino / 64))
end

local function rec_get(ino)
  local r = redis.call('HGET', rec_key(ino), string.char(ino % 64))
  if not r then
    return nil
  end
  return r
end

local function rec_put(ino, r)
  redis.call('HSET', rec_key(ino), string.char(ino % 64), r)
end

local function rec_del(ino)
  redis.call('HDEL', rec_key(ino), string.char(ino % 64))
end

-- Field access by byte offset (docs/cluster.md, the record's table).
local function kind(r)
  return string.byte(r, 1)
end

local function get_u32(r, off)
  return (struct.unpack('<I4', r, off + 1))
end

local function set_u32(r, off, v)
  return string.sub(r, 1, off) .. struct.pack('<I4', v) .. string.sub(r, off + 5)
end

local function get_u64(r, off)
  return (struct.unpack('<I8', r, off + 1))
end

local function set_u64(r, off, v)
  return string.sub(r, 1, off) .. struct.pack('<I8', v) .. string.sub(r, off + 9)
end

local function set_bytes(r, off, b)
  return string.sub(r, 1, off) .. b .. string.sub(r, off + #b + 1)
end

local OFF_MODE, OFF_NLINK, OFF_UID, OFF_GID, OFF_SIZE = 2, 4, 8, 12, 16
local OFF_ATIME, OFF_MTIME, OFF_CTIME, OFF_BTIME = 24, 32, 40, 48
local OFF_RDEV, OFF_FLAGS = 56, 60
local KIND_FILE, KIND_DIR, KIND_SYMLINK = 1, 2, 3

-- Returns the entry's id (a writer waits for the others' acks of it).
local function feed(...)
  return redis.call('XADD', P .. 'feed', 'MAXLEN', '~', 100000, '*', 'sid', SID, ...)
end

-- The other sessions whose lease is running by the server's clock: the
-- mounts whose acks a writer's close waits for (docs/cluster.md, "Many
-- mounts, one truth").
local function others_live()
  local out = {}
  local live = redis.call('ZRANGEBYSCORE', P .. 'sessions', '(' .. now_ms(), '+inf')
  for _, s in ipairs(live) do
    if s ~= SID then out[#out + 1] = s end
  end
  return out
end
"#;

/// A script's full text: the `#!lua` shebang (no flags: a master over
/// `maxmemory` refuses it before it runs, so a full cluster is ENOSPC with
/// nothing changed), the prelude, then `body`.
pub fn script(body: &str) -> String {
    format!("#!lua\n{PRELUDE}\n{body}")
}

/// A read-only script's text (`flags=no-writes`: it runs on a full master,
/// and never needs fencing).
pub fn read_script(body: &str) -> String {
    format!("#!lua flags=no-writes\n{PRELUDE}\n{body}")
}
