//! Journal payloads of the store (opaque bytes to the journal).
//!
//! ```text
//! block:    [1u8][block u64] entry*
//! rollback: [2u8][target u64][resulting current block u64] entry*
//! entry:    [key: key_width bytes][len u16][value: len bytes]
//! ```
//! Every entry is an absolute assignment `key := value` (length 0: delete), so
//! replaying a commit twice, or over a state that already contains part of it,
//! gives the same result. A rollback commit lists the writes the rollback
//! performed. The rollback window (memory and snapshots only) uses the same
//! entry layout with the *old* values, applied backwards.

pub const KIND_BLOCK: u8 = 1;
pub const KIND_ROLLBACK: u8 = 2;

pub fn block_header(block: u64) -> [u8; 9] {
    let mut h = [0u8; 9];
    h[0] = KIND_BLOCK;
    h[1..9].copy_from_slice(&block.to_le_bytes());
    h
}

pub fn rollback_header(target: u64, current: u64) -> [u8; 17] {
    let mut p = [0u8; 17];
    p[0] = KIND_ROLLBACK;
    p[1..9].copy_from_slice(&target.to_le_bytes());
    p[9..17].copy_from_slice(&current.to_le_bytes());
    p
}

/// One decoded entry (borrowing the buffer).
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
}

/// Decodes every entry of `buf`; an error describes the malformed spot.
pub fn entries(buf: &[u8], kw: usize) -> impl Iterator<Item = Result<Entry<'_>, String>> {
    entry_positions(buf, kw).map(|(_, e)| e)
}

/// Like [`entries`], with each entry's offset in `buf`.
pub fn entry_positions(
    buf: &[u8],
    kw: usize,
) -> impl Iterator<Item = (usize, Result<Entry<'_>, String>)> {
    let mut pos = 0usize;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || pos >= buf.len() {
            return None;
        }
        let at = pos;
        match decode_at(buf, pos, kw) {
            Ok((e, next)) => {
                pos = next;
                Some((at, Ok(e)))
            }
            Err(msg) => {
                failed = true;
                Some((at, Err(msg)))
            }
        }
    })
}

pub fn decode_at(buf: &[u8], pos: usize, kw: usize) -> Result<(Entry<'_>, usize), String> {
    let bad = || format!("malformed entry at payload offset {pos}");
    let key = buf.get(pos..pos + kw).ok_or_else(bad)?;
    let p = pos + kw;
    let len = u16::from_le_bytes(buf.get(p..p + 2).ok_or_else(bad)?.try_into().unwrap()) as usize;
    let value = buf.get(p + 2..p + 2 + len).ok_or_else(bad)?;
    Ok((Entry { key, value }, p + 2 + len))
}

pub enum Decoded<'a> {
    Block {
        block: u64,
        body: &'a [u8],
    },
    Rollback {
        target: u64,
        current: u64,
        body: &'a [u8],
    },
}

pub fn decode(payload: &[u8]) -> Result<Decoded<'_>, String> {
    let u64_at = |o: usize| -> Result<u64, String> {
        payload
            .get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
            .ok_or_else(|| "payload too short".to_string())
    };
    match payload.first() {
        Some(&KIND_BLOCK) => Ok(Decoded::Block {
            block: u64_at(1)?,
            body: &payload[9..],
        }),
        Some(&KIND_ROLLBACK) if payload.len() >= 17 => Ok(Decoded::Rollback {
            target: u64_at(1)?,
            current: u64_at(9)?,
            body: &payload[17..],
        }),
        Some(k) => Err(format!("unknown payload kind {k}")),
        None => Err("empty payload".into()),
    }
}
