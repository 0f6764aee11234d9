//! Volume names and the names of a volume's keys (docs/cluster.md, "Keys").
//! Numbers in keys are lowercase hex.

use crate::error::{Error, Result};

/// The set of every volume's name. It has no hash tag of a volume, so it
/// lives in a slot of its own: registering a volume is a step after the
/// volume's own keys are written (see `admin::Admin::create`).
pub const REGISTRY: &str = "memfs:volumes";

/// The longest volume name.
pub const MAX_NAME: usize = 64;

/// Checks `name` against `[A-Za-z0-9._-]{1,64}`.
pub fn check_name(name: &str) -> Result<()> {
    let why = if name.is_empty() {
        "empty"
    } else if name.len() > MAX_NAME {
        "over 64 bytes"
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        "only A-Z a-z 0-9 . _ - may be used"
    } else {
        return Ok(());
    };
    Err(Error::BadName {
        name: name.to_string(),
        why,
    })
}

/// The keys of volume `name` (checked by [`Keys::new`]).
#[derive(Clone, Debug)]
pub struct Keys {
    name: String,
}

impl Keys {
    /// The keys of a volume with a valid name.
    pub fn new(name: &str) -> Result<Keys> {
        check_name(name)?;
        Ok(Keys {
            name: name.to_string(),
        })
    }

    /// The volume's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `{V}:meta`: format, block size, creation time, root, features.
    pub fn meta(&self) -> String {
        format!("{{{}}}:meta", self.name)
    }

    /// `{V}:next`: the counters.
    pub fn next(&self) -> String {
        format!("{{{}}}:next", self.name)
    }

    /// `{V}:sessions`: session id → lease deadline (server ms).
    pub fn sessions(&self) -> String {
        format!("{{{}}}:sessions", self.name)
    }

    /// `{V}:i:<ino >> 6>`: the group of 64 records that holds `ino`'s.
    pub fn records(&self, ino: u64) -> String {
        format!("{{{}}}:i:{:x}", self.name, ino >> 6)
    }

    /// The field of `ino`'s record in [`Keys::records`]: one byte.
    pub fn record_field(ino: u64) -> [u8; 1] {
        [(ino & 63) as u8]
    }

    /// `{V}:d:<ino>`: a directory's entries.
    pub fn entries(&self, ino: u64) -> String {
        format!("{{{}}}:d:{ino:x}", self.name)
    }

    /// `b:{V.<id>}`: a data block, in a slot of its own.
    pub fn block(&self, id: u64) -> String {
        format!("b:{{{}.{id:x}}}", self.name)
    }

    /// `{V}:cleaning`: held by `Admin::clean` while it runs (a token, with
    /// a time to live); no session registers while it exists.
    pub fn cleaning(&self) -> String {
        format!("{{{}}}:cleaning", self.name)
    }

    /// A `SCAN MATCH` pattern for the metadata keys: every one is in the
    /// metadata slot. No glob character can be in a name, so it is exact.
    pub fn meta_pattern(&self) -> String {
        format!("{{{}}}:*", self.name)
    }

    /// A `SCAN MATCH` pattern that finds every block key of the volume, and
    /// also those of a volume named `V.<more>` (`b:{a.*` matches `b:{a.b.1}`):
    /// keep only the keys for which [`Keys::is_block`] holds.
    pub fn block_pattern(&self) -> String {
        format!("b:{{{}.*", self.name)
    }

    /// Whether `key` is one of this volume's block keys, exactly.
    pub fn is_block(&self, key: &[u8]) -> bool {
        self.block_id(key).is_some()
    }

    /// The id of this volume's block `key` ([`Keys::block`]'s inverse);
    /// None for any other key.
    pub fn block_id(&self, key: &[u8]) -> Option<u64> {
        let rest = key
            .strip_prefix(b"b:{")?
            .strip_prefix(self.name.as_bytes())?
            .strip_prefix(b".")?
            .strip_suffix(b"}")?;
        if rest.is_empty() || rest.len() > 16 {
            return None;
        }
        let hex = std::str::from_utf8(rest).ok()?;
        if !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return None;
        }
        u64::from_str_radix(hex, 16).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slot::key_slot;

    #[test]
    fn names() {
        for good in ["a", "vol-1", "A.b_c", &"x".repeat(64)] {
            check_name(good).unwrap();
        }
        for bad in [
            "",
            &"x".repeat(65),
            "a b",
            "a{b",
            "a}b",
            "a*",
            "é",
            "a/b",
            "a:b",
        ] {
            assert!(
                matches!(check_name(bad), Err(Error::BadName { .. })),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn layout() {
        let k = Keys::new("v").unwrap();
        assert_eq!(k.meta(), "{v}:meta");
        assert_eq!(k.records(1), "{v}:i:0");
        assert_eq!(Keys::record_field(1), [1]);
        assert_eq!(k.records(64 * 0xab + 5), "{v}:i:ab");
        assert_eq!(Keys::record_field(64 * 0xab + 5), [5]);
        assert_eq!(k.entries(255), "{v}:d:ff");
        assert_eq!(k.block(255), "b:{v.ff}");
        let slot = key_slot(k.meta().as_bytes());
        for key in [k.next(), k.sessions(), k.records(1 << 40), k.entries(9)] {
            assert_eq!(key_slot(key.as_bytes()), slot, "{key}");
        }
    }

    #[test]
    fn block_keys_exactly() {
        let k = Keys::new("a").unwrap();
        assert!(k.is_block(k.block(0x1f).as_bytes()));
        assert!(!k.is_block(b"b:{a.b.1}"));
        assert!(!k.is_block(b"b:{a.}"));
        assert!(!k.is_block(b"b:{a.1}x"));
        assert!(!k.is_block(b"b:{ab.1}"));
        assert!(!k.is_block(b"{a}:meta"));
        assert_eq!(k.block_id(k.block(0x1f).as_bytes()), Some(0x1f));
        assert_eq!(k.block_id(k.block(u64::MAX).as_bytes()), Some(u64::MAX));
        assert_eq!(k.block_id(b"b:{a.10000000000000000}"), None);
        assert_eq!(k.block_id(b"b:{a.1F}"), None);
    }
}
