//! `memfs volume clean` (docs/cluster.md, "Administration"): frees the
//! blocks of a volume that no block map names.
//!
//! Such blocks are what a crash leaves: a mount killed between writing a
//! flush's blocks and its commit script, or before it unlinked the blocks
//! its commits replaced (they wait for the next flush's pipeline). Nothing
//! else frees them, and a cluster that fills up with them is ENOSPC.
//!
//! Why freeing them is safe, step by step:
//! - a block is only ever named by a commit fenced on the session it was
//!   written under (crate::data, `Data::commit_script`), and a dead session
//!   never comes back (fenced renewals, session ids never reused);
//! - the clean starts only when no session is live, and in the same script
//!   takes `{V}:cleaning`, which refuses every registration while it lasts
//!   (crate::session, `REGISTER`);
//! - so every session that wrote a block the scan finds was dead before the
//!   clean began, and a block no map names when it is read will never be
//!   named: unlinking it loses nothing.
//!
//! The mark has a time to live ([`HOLD`]), so that a clean that dies does
//! not keep mounts out for good; it is renewed (and checked to be still
//! this clean's) before every batch of unlinks, and a clean that lost it
//! stops with an error before unlinking anything more.

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::cluster::ClusterConnection;
use redis::{Connection, Script};

use crate::admin::{Admin, scan_each};
use crate::blocks::{Entry, map_prefix};
use crate::error::{Error, Result};
use crate::keys::Keys;
use crate::slot::key_slot;

/// How long the mark keeps mounts out if the clean stops renewing it. Far
/// above the time between two renewals: one round trip of a batch, each
/// bounded by the cluster timeout.
const HOLD: Duration = Duration::from_secs(300);
/// Unlinks per pipeline.
const BATCH: usize = 1000;

/// KEYS: `{V}:meta`, `{V}:sessions`, `{V}:cleaning`; ARGV: token, hold ms.
/// → -2: no volume; -1: another clean holds it; 0: taken; n > 0: n live
/// sessions (not taken). One script, so that no mount registers between
/// the count and the mark.
const BEGIN: &str = r"#!lua
if redis.call('EXISTS', KEYS[1]) == 0 then return -2 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.call('ZCOUNT', KEYS[2], now, '+inf')
if live > 0 then return live end
if redis.call('SET', KEYS[3], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
return -1
";

/// KEYS: `{V}:cleaning`; ARGV: token, hold ms → 1 if still this clean's
/// (renewed), 0 if not.
const HOLD_ON: &str = r"#!lua
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
";

/// KEYS: `{V}:cleaning`; ARGV: token. Drops the mark if it is this clean's.
const END: &str = r"#!lua
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
";

/// What a clean found and freed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cleaned {
    /// Block maps read (one per file with data).
    pub maps: u64,
    /// Blocks those maps name.
    pub named: u64,
    /// Block keys of the volume the masters held.
    pub blocks: u64,
    /// Of those, the ones no map named: unlinked.
    pub freed: u64,
    /// Their bytes.
    pub freed_bytes: u64,
}

impl Admin {
    /// Frees every block of volume `name` that no block map names (module
    /// doc). Refused while a session is live (mounted anywhere) or another
    /// clean runs; mounts are refused (EBUSY) while it runs.
    pub fn clean(&self, name: &str) -> Result<Cleaned> {
        let keys = Keys::new(name)?;
        let token = token();
        let hold_ms = HOLD.as_millis().to_string();
        let mut con = self.cluster()?;
        let begun: i64 = Script::new(BEGIN)
            .key(keys.meta())
            .key(keys.sessions())
            .key(keys.cleaning())
            .arg(&token)
            .arg(&hold_ms)
            .invoke(&mut con)?;
        match begun {
            -2 => return Err(Error::NotFound(name.to_string())),
            -1 => return Err(Error::Cleaning(name.to_string())),
            0 => {}
            n => {
                return Err(Error::InUse {
                    name: name.to_string(),
                    sessions: n.unsigned_abs(),
                });
            }
        }
        let out = self.clean_held(&keys, &token, &hold_ms, &mut con);
        // Whatever happened: mounts may come again (a lost mark is no
        // longer ours, and END leaves it).
        let end = Script::new(END)
            .key(keys.cleaning())
            .arg(&token)
            .invoke::<i64>(&mut con);
        if let Err(e) = &end {
            tracing::warn!(volume = name, error = %e, "clean: could not drop the mark; it runs out by itself");
        }
        let out = out?;
        debug_assert!(out.freed <= out.blocks, "freed only what was found");
        tracing::info!(volume = name, ?out, "volume cleaned");
        Ok(out)
    }

    /// The clean, with the mark taken.
    fn clean_held(
        &self,
        keys: &Keys,
        token: &str,
        hold_ms: &str,
        cluster: &mut ClusterConnection,
    ) -> Result<Cleaned> {
        let topology = self.topology()?;
        let meta = topology
            .master_of_slot(key_slot(keys.meta().as_bytes()))
            .ok_or_else(|| Error::Protocol("no master serves the metadata slot".into()))?;
        let mut out = Cleaned::default();
        let named = named_blocks(&mut self.node(&meta.addr)?, keys, &mut out)?;
        let hold = Script::new(HOLD_ON);
        for m in &topology.masters {
            let mut node = self.node(&m.addr)?;
            scan_each(&mut node, &keys.block_pattern(), |node, found| {
                let ours: Vec<(Vec<u8>, u64)> = found
                    .into_iter()
                    .filter_map(|k| keys.block_id(&k).map(|id| (k, id)))
                    .collect();
                out.blocks += ours.len() as u64;
                let free: Vec<&Vec<u8>> = ours
                    .iter()
                    .filter(|(_, id)| !named.contains(id))
                    .map(|(k, _)| k)
                    .collect();
                if free.is_empty() {
                    return Ok(());
                }
                let held: i64 = hold
                    .key(keys.cleaning())
                    .arg(token)
                    .arg(hold_ms)
                    .invoke(&mut *cluster)?;
                if held != 1 {
                    return Err(Error::Cleaning(keys.name().to_string()));
                }
                out.freed_bytes += unlink(node, &free)?;
                out.freed += free.len() as u64;
                Ok(())
            })?;
        }
        Ok(out)
    }
}

/// Every block id the volume's maps name (all on the metadata master).
fn named_blocks(node: &mut Connection, keys: &Keys, out: &mut Cleaned) -> Result<HashSet<u64>> {
    let mut named = HashSet::new();
    scan_each(node, &format!("{}*", map_prefix(keys)), |node, maps| {
        let mut pipe = redis::pipe();
        for m in &maps {
            pipe.cmd("HGETALL").arg(m);
        }
        let all: Vec<Vec<(Vec<u8>, Vec<u8>)>> = pipe.query(node)?;
        for (map, fields) in all.iter().enumerate() {
            for (_, v) in fields {
                let e = Entry::decode(v).map_err(|e| {
                    Error::Protocol(format!(
                        "block map {}: {e}: not cleaned",
                        String::from_utf8_lossy(&maps[map])
                    ))
                })?;
                named.insert(e.id);
            }
        }
        out.maps += maps.len() as u64;
        Ok(())
    })?;
    out.named = named.len() as u64;
    Ok(named)
}

/// Unlinks `keys` on `node`; returns their bytes.
fn unlink(node: &mut Connection, keys: &[&Vec<u8>]) -> Result<u64> {
    let mut bytes = 0;
    for chunk in keys.chunks(BATCH) {
        let mut pipe = redis::pipe();
        for k in chunk {
            pipe.cmd("STRLEN").arg(k);
            pipe.cmd("UNLINK").arg(k).ignore();
        }
        let lens: Vec<u64> = pipe.query(node)?;
        bytes += lens.iter().sum::<u64>();
    }
    Ok(bytes)
}

/// This clean's mark: unique among cleans that could overlap.
fn token() -> String {
    let ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{}-{ns}", std::process::id())
}
