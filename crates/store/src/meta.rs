//! The `STORE` file: the layout and options recorded at creation.
//!
//! Text, one `key=value` per line, ending with a `crc32c=` line over the lines
//! before it; written atomically (temp file + rename).

use crate::{StoreError, StoreOptions};
use memfs_journal::Durability;
use std::path::Path;

pub const META_FILE: &str = "STORE";
const HEADER: &str = "memfs-store 1";

pub fn encode(o: &StoreOptions) -> String {
    let body = format!(
        "{HEADER}\nkey_width={}\nshards={}\ncapacity_per_shard={}\nthreads={}\ndurability={}\nsnapshot_interval={}\nrollback_window={}\nsegment_size={}\n",
        o.key_width,
        o.shards,
        o.capacity_per_shard,
        o.threads,
        o.durability,
        o.snapshot_interval,
        o.rollback_window,
        o.segment_size
    );
    let crc = crc32(body.as_bytes());
    format!("{body}crc32c={crc:08x}\n")
}

fn crc32(b: &[u8]) -> u32 {
    // The journal crate owns the checksum dependency; a tiny bitwise CRC32C
    // suffices for a 200-byte file read once per open.
    let mut crc = !0u32;
    for &byte in b {
        crc ^= byte as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

pub fn decode(text: &str, path: &Path) -> Result<StoreOptions, StoreError> {
    let bad = |why: String| StoreError::Layout(format!("{}: {why}", path.display()));
    let Some(idx) = text.rfind("crc32c=") else {
        return Err(bad("missing checksum line".into()));
    };
    let (body, tail) = text.split_at(idx);
    let want = u32::from_str_radix(tail.trim_start_matches("crc32c=").trim(), 16)
        .map_err(|_| bad("bad checksum line".into()))?;
    if crc32(body.as_bytes()) != want {
        return Err(bad("checksum mismatch".into()));
    }
    let mut lines = body.lines();
    if lines.next() != Some(HEADER) {
        return Err(bad(
            "not a memfs store layout file (or unsupported version)".into(),
        ));
    }
    let mut o = StoreOptions::default();
    for line in lines {
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| bad(format!("bad line {line:?}")))?;
        let num = || {
            v.parse::<u64>()
                .map_err(|_| bad(format!("bad number in {line:?}")))
        };
        match k {
            "key_width" => o.key_width = num()? as usize,
            "shards" => o.shards = num()? as usize,
            "capacity_per_shard" => o.capacity_per_shard = num()? as usize,
            "threads" => o.threads = num()? as usize,
            "durability" => {
                o.durability = v.parse::<Durability>().map_err(bad)?;
            }
            "snapshot_interval" => o.snapshot_interval = num()?,
            "rollback_window" => o.rollback_window = num()?,
            "segment_size" => o.segment_size = num()?,
            _ => return Err(bad(format!("unknown setting {k:?}"))),
        }
    }
    o.validate()?;
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let o = StoreOptions {
            key_width: 20,
            shards: 7,
            ..Default::default()
        };
        let p = Path::new("STORE");
        let text = encode(&o);
        let back = decode(&text, p).unwrap();
        assert_eq!(back.key_width, 20);
        assert_eq!(back.shards, 7);
        assert_eq!(back.durability, o.durability);
        let damaged = text.replace("shards=7", "shards=8");
        assert!(
            decode(&damaged, p)
                .unwrap_err()
                .to_string()
                .contains("checksum")
        );
        // Known CRC32C check value.
        assert_eq!(crc32(b"123456789"), 0xE306_9283);
    }
}
