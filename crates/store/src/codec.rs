//! Journal payloads of the store (opaque bytes to the journal).
//!
//! ```text
//! block:    [1u8][block u64] entry*
//! rollback: [2u8][target u64][resulting current block u64]
//! entry:    [key: key_width bytes][new len u16][new value][old len u16][old value]
//! ```
//! A new length of 0 is a delete; an old length of 0 means the key was absent.
//! Each entry is both the redo (key := new) and the undo (key := old) of one
//! operation, so the same bytes serve replay and rollback.

pub const KIND_BLOCK: u8 = 1;
pub const KIND_ROLLBACK: u8 = 2;

pub fn block_header(block: u64) -> [u8; 9] {
    let mut h = [0u8; 9];
    h[0] = KIND_BLOCK;
    h[1..9].copy_from_slice(&block.to_le_bytes());
    h
}

pub fn rollback_payload(target: u64, current: u64) -> [u8; 17] {
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
    pub new: &'a [u8],
    pub old: &'a [u8],
}

/// Decodes every entry of `buf`; an error describes the malformed spot.
pub fn entries(buf: &[u8], kw: usize) -> impl Iterator<Item = Result<Entry<'_>, String>> {
    let mut pos = 0usize;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || pos >= buf.len() {
            return None;
        }
        let r = decode_at(buf, pos, kw);
        match r {
            Ok((e, next)) => {
                pos = next;
                Some(Ok(e))
            }
            Err(msg) => {
                failed = true;
                Some(Err(msg))
            }
        }
    })
}

pub fn decode_at(buf: &[u8], pos: usize, kw: usize) -> Result<(Entry<'_>, usize), String> {
    let bad = || format!("malformed entry at payload offset {pos}");
    let key = buf.get(pos..pos + kw).ok_or_else(bad)?;
    let mut p = pos + kw;
    let nl = u16::from_le_bytes(buf.get(p..p + 2).ok_or_else(bad)?.try_into().unwrap()) as usize;
    p += 2;
    let new = buf.get(p..p + nl).ok_or_else(bad)?;
    p += nl;
    let ol = u16::from_le_bytes(buf.get(p..p + 2).ok_or_else(bad)?.try_into().unwrap()) as usize;
    p += 2;
    let old = buf.get(p..p + ol).ok_or_else(bad)?;
    p += ol;
    Ok((Entry { key, new, old }, p))
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

pub enum Decoded<'a> {
    Block { block: u64, body: &'a [u8] },
    Rollback { target: u64, current: u64 },
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
        Some(&KIND_ROLLBACK) if payload.len() == 17 => Ok(Decoded::Rollback {
            target: u64_at(1)?,
            current: u64_at(9)?,
        }),
        Some(k) => Err(format!("unknown payload kind {k}")),
        None => Err("empty payload".into()),
    }
}
