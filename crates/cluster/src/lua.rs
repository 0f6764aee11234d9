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

-- The server's clock, read once a run (a script runs in microseconds, and
-- TIME with its reply cost as much as two HSETs here).
local NOW_MS = nil
local function now_ms()
  if not NOW_MS then
    local t = redis.call('TIME')
    NOW_MS = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return NOW_MS
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
-- Arguments to redis.call are best strings: a Lua number is formatted with
-- sprintf on every call (about 1 µs here, as much as an HSET itself).
local function feed(...)
  return redis.call('XADD', P .. 'feed', 'MAXLEN', '~', '100000', '*', 'sid', SID, ...)
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
/// nothing changed), the helpers of the prelude that `body` uses, then
/// `body`.
pub fn script(body: &str) -> String {
    compose("#!lua", &[], body)
}

/// [`script`] with a second set of helpers (`helpers`, after the prelude,
/// in the same form: top-level `local` definitions) to take from.
pub fn script_with(helpers: &str, body: &str) -> String {
    compose("#!lua", &[helpers], body)
}

/// A read-only script's text (`flags=no-writes`: it runs on a full master,
/// and never needs fencing).
pub fn read_script(body: &str) -> String {
    compose("#!lua flags=no-writes", &[], body)
}

/// [`read_script`] with a second set of helpers, as [`script_with`].
pub fn read_script_with(helpers: &str, body: &str) -> String {
    compose("#!lua flags=no-writes", &[helpers], body)
}

/// One top-level definition of a prelude: the names it defines and its
/// text (up to the next top-level `local`).
struct Item<'a> {
    names: Vec<&'a str>,
    text: String,
}

/// The shebang, the helpers `body` needs (by name, transitively, in the
/// order they are written: a Lua local is seen only by what follows it),
/// and `body`. Every helper is a closure the script creates on each run:
/// the whole prelude cost a create's script as much as its ten calls'
/// formatting (docs/cluster.md, "Measured", 2026-12-03, evening).
fn compose(shebang: &str, extra: &[&str], body: &str) -> String {
    let items: Vec<Item> = std::iter::once(PRELUDE)
        .chain(extra.iter().copied())
        .flat_map(items)
        .collect();
    let mut needed = vec![false; items.len()];
    let mut todo: Vec<&str> = words(body).collect();
    // Each item enters at most once, so the loop ends after at most every
    // word of every item.
    while let Some(w) = todo.pop() {
        for (i, it) in items.iter().enumerate() {
            if !needed[i] && it.names.contains(&w) {
                needed[i] = true;
                todo.extend(words(&it.text).filter(|x| !it.names.contains(x)));
            }
        }
    }
    let mut out = format!("{shebang}\n");
    for (it, _) in items.iter().zip(&needed).filter(|(_, n)| **n) {
        out.push_str(&it.text);
    }
    out.push('\n');
    out.push_str(body);
    out
}

/// The top-level definitions of `prelude`: each begins at a line that
/// starts with `local` and runs to the next; comment lines before one go
/// with the one before (they are only comments).
fn items(prelude: &str) -> Vec<Item<'_>> {
    let mut out: Vec<Item> = Vec::new();
    for line in prelude.lines() {
        if let Some(rest) = line.strip_prefix("local ") {
            let names = match rest.strip_prefix("function ") {
                Some(f) => vec![f.split('(').next().unwrap_or("").trim()],
                None => rest
                    .split('=')
                    .next()
                    .unwrap_or("")
                    .split(',')
                    .map(str::trim)
                    .collect(),
            };
            out.push(Item {
                names,
                text: String::new(),
            });
        }
        if let Some(it) = out.last_mut() {
            it.text.push_str(line);
            it.text.push('\n');
        }
    }
    out
}

/// The identifiers of Lua text, comments left out (strings are not: a word
/// in a string may pull in a helper that is not needed, never leave out
/// one that is).
fn words(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(|l| l.split("--").next().unwrap_or(""))
        .flat_map(|l| l.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
        .filter(|w| w.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_gets_the_helpers_it_uses_and_theirs() {
        let s = script("fence()\nreturn rec_get(1)");
        for name in [
            "fail", "now_ms", "fence", "rec_key", "rec_get", "hex", "local P", "local V",
        ] {
            assert!(s.contains(name), "{name} missing from {s}");
        }
        for name in ["rec_del", "set_u64", "others_live", "OFF_MODE"] {
            assert!(!s.contains(name), "{name} in {s}");
        }
        assert!(s.starts_with("#!lua\n") && s.ends_with("return rec_get(1)"));
        // Definitions keep their order: a local is seen only after it.
        let at = |n: &str| s.find(n).unwrap();
        assert!(at("local function fail") < at("local function fence"));
        assert!(at("local function now_ms") < at("local function fence"));
        assert!(at("local V") < at("local P"));
    }

    #[test]
    fn every_prelude_item_defines_a_name() {
        let it = items(PRELUDE);
        assert!(it.len() > 10);
        for i in &it {
            assert!(i.names.iter().all(|n| !n.is_empty()), "{}", i.text);
        }
        // The whole prelude comes back when a body names everything.
        let all: Vec<&str> = it.iter().flat_map(|i| i.names.clone()).collect();
        let s = read_script(&all.join(" "));
        assert!(s.starts_with("#!lua flags=no-writes\n"));
        assert_eq!(
            s.matches("local function").count(),
            PRELUDE.matches("local function").count()
        );
    }
}
