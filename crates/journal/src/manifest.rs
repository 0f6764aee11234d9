//! Two alternating checksummed manifest slots naming the current checkpoint.
//!
//! A new manifest is written into the slot that does *not* hold the newest valid
//! one, then fdatasynced. A crash during the write can only damage that slot;
//! the other still holds the previous valid manifest, so readers always find a
//! consistent one (the newest slot whose checksum verifies).

use crate::storage::{self, OpenMode};
use crate::{Error, Result, io_err};
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

pub const MANIFEST_FILE: &str = "MANIFEST";
pub const MANIFEST_MAGIC: [u8; 8] = *b"MEMFSMAN";
pub const MANIFEST_VERSION: u32 = 1;
/// Each slot occupies one 512-byte sector so a torn write touches one slot.
pub const SLOT_LEN: usize = 512;
const FIXED_LEN: usize = 8 + 4 + 4 + 8 + 1 + 8 + 8 + 4;
/// Room for the client's own bytes in a slot.
pub const MAX_USER_LEN: usize = SLOT_LEN - FIXED_LEN - 4;

/// Which checkpoint is current and what it needs from the journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointRef {
    /// The checkpoint holds every commit up to and including this one; replay
    /// starts after it.
    pub commit: u64,
    /// The checkpoint may also hold effects of commits up to this one (it was
    /// copied while writers ran); the journal must reach it for the recovered
    /// state to be consistent.
    pub required_end: u64,
}

/// The decoded content of a manifest slot.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Manifest {
    /// Increases by one per publication; the newer valid slot wins.
    pub seq: u64,
    pub checkpoint: Option<CheckpointRef>,
    /// Opaque to the journal (at most [`MAX_USER_LEN`] bytes).
    pub user: Vec<u8>,
}

impl Manifest {
    fn encode(&self) -> Result<[u8; SLOT_LEN]> {
        if self.user.len() > MAX_USER_LEN {
            return Err(Error::Invalid(format!(
                "manifest user data is {} bytes, at most {MAX_USER_LEN}",
                self.user.len()
            )));
        }
        let mut s = [0u8; SLOT_LEN];
        s[0..8].copy_from_slice(&MANIFEST_MAGIC);
        s[8..12].copy_from_slice(&MANIFEST_VERSION.to_le_bytes());
        s[12..16].copy_from_slice(&(self.user.len() as u32).to_le_bytes());
        s[16..24].copy_from_slice(&self.seq.to_le_bytes());
        let (has, c, r) = match self.checkpoint {
            Some(sr) => (1u8, sr.commit, sr.required_end),
            None => (0, 0, 0),
        };
        s[24] = has;
        s[25..33].copy_from_slice(&c.to_le_bytes());
        s[33..41].copy_from_slice(&r.to_le_bytes());
        // 41..45 reserved
        s[FIXED_LEN..FIXED_LEN + self.user.len()].copy_from_slice(&self.user);
        let crc = crc32c::crc32c(&s[..SLOT_LEN - 4]);
        s[SLOT_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
        Ok(s)
    }

    fn decode(s: &[u8]) -> Result<Manifest, String> {
        if s.len() < SLOT_LEN {
            return Err("slot truncated".into());
        }
        if s[0..8] != MANIFEST_MAGIC {
            return Err("bad magic".into());
        }
        let crc = u32::from_le_bytes(s[SLOT_LEN - 4..SLOT_LEN].try_into().unwrap());
        if crc != crc32c::crc32c(&s[..SLOT_LEN - 4]) {
            return Err("checksum mismatch".into());
        }
        let version = u32::from_le_bytes(s[8..12].try_into().unwrap());
        if version != MANIFEST_VERSION {
            return Err(format!("unsupported version {version}"));
        }
        let ulen = u32::from_le_bytes(s[12..16].try_into().unwrap()) as usize;
        if ulen > MAX_USER_LEN {
            return Err("user length out of range".into());
        }
        let u64_at = |o: usize| u64::from_le_bytes(s[o..o + 8].try_into().unwrap());
        let checkpoint = match s[24] {
            0 => None,
            1 => Some(CheckpointRef {
                commit: u64_at(25),
                required_end: u64_at(33),
            }),
            _ => return Err("bad checkpoint flag".into()),
        };
        Ok(Manifest {
            seq: u64_at(16),
            checkpoint,
            user: s[FIXED_LEN..FIXED_LEN + ulen].to_vec(),
        })
    }

    /// Reads the newest valid slot. `Ok(None)` when there is no manifest file;
    /// an error when the file exists but no slot is valid (never silently
    /// ignores a damaged manifest).
    pub fn load(dir: &Path) -> Result<Option<Manifest>> {
        let path = dir.join(MANIFEST_FILE);
        let buf = match storage::for_path(&path).read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(&path)(e)),
        };
        let mut best: Option<Manifest> = None;
        let mut reasons = Vec::new();
        for slot in 0..2 {
            let start = slot * SLOT_LEN;
            let Some(bytes) = buf.get(start..start + SLOT_LEN) else {
                reasons.push(format!("slot {slot}: missing"));
                continue;
            };
            match Manifest::decode(bytes) {
                Ok(m) => {
                    if best.as_ref().is_none_or(|b| m.seq > b.seq) {
                        best = Some(m);
                    }
                }
                Err(r) => reasons.push(format!("slot {slot}: {r}")),
            }
        }
        match best {
            Some(m) => Ok(Some(m)),
            None => Err(Error::Corrupt {
                file: path,
                offset: 0,
                reason: format!("no valid manifest slot ({})", reasons.join("; ")),
            }),
        }
    }

    /// Publishes `self` with the next sequence number into the older slot.
    /// Returns the sequence number written.
    pub fn publish(&mut self, dir: &Path) -> Result<u64> {
        let current = match Manifest::load(dir) {
            Ok(m) => m.map_or(0, |m| m.seq),
            // A file with two bad slots: start over rather than refuse forever;
            // the slot we write makes it valid again.
            Err(Error::Corrupt { .. }) => 0,
            Err(e) => return Err(e),
        };
        self.seq = current + 1;
        let bytes = self.encode()?;
        let path = dir.join(MANIFEST_FILE);
        let st = storage::for_path(&path);
        let slot = self.seq % 2;
        if !st.exists(&path).map_err(io_err(&path))? {
            // The first publication creates the whole file atomically (temp
            // file, fsync, rename, directory fsync): a crash leaves either no
            // MANIFEST or a valid one, never an empty or short file that
            // `load` would have to call corrupt.
            let mut file = vec![0u8; 2 * SLOT_LEN];
            file[slot as usize * SLOT_LEN..][..SLOT_LEN].copy_from_slice(&bytes);
            crate::dir::write_file_atomic(dir, MANIFEST_FILE, &file)?;
            return Ok(self.seq);
        }
        let mut f = st.open(&path, OpenMode::Write).map_err(io_err(&path))?;
        if f.len().map_err(io_err(&path))? < (2 * SLOT_LEN) as u64 {
            f.set_len((2 * SLOT_LEN) as u64).map_err(io_err(&path))?;
        }
        f.seek(SeekFrom::Start(slot * SLOT_LEN as u64))
            .map_err(io_err(&path))?;
        f.write_all(&bytes).map_err(io_err(&path))?;
        f.sync_data().map_err(io_err(&path))?;
        Ok(self.seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alternating_slots_survive_one_damaged_slot() {
        let t = tempfile::tempdir().unwrap();
        assert_eq!(Manifest::load(t.path()).unwrap(), None);
        let mut m = Manifest {
            seq: 0,
            checkpoint: Some(CheckpointRef {
                commit: 10,
                required_end: 12,
            }),
            user: b"abc".to_vec(),
        };
        assert_eq!(m.publish(t.path()).unwrap(), 1);
        m.checkpoint = Some(CheckpointRef {
            commit: 20,
            required_end: 25,
        });
        assert_eq!(m.publish(t.path()).unwrap(), 2);
        let got = Manifest::load(t.path()).unwrap().unwrap();
        assert_eq!(got.checkpoint.unwrap().commit, 20);
        // Damage the newest slot (seq 2 lives in slot 0): the older one wins.
        let path = t.path().join(MANIFEST_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[30] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let got = Manifest::load(t.path()).unwrap().unwrap();
        assert_eq!(got.seq, 1);
        assert_eq!(got.checkpoint.unwrap().commit, 10);
        // Both damaged: a clear error naming the file.
        bytes[SLOT_LEN + 30] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let err = Manifest::load(t.path()).unwrap_err();
        assert!(err.to_string().contains("no valid manifest slot"), "{err}");
    }
}
