//! Byte layouts shared by the writer, the reader and the verifier.
//!
//! All integers are little-endian. See `docs/journal.md` for the normative
//! description.

/// First 8 bytes of every segment file.
pub const SEGMENT_MAGIC: [u8; 8] = *b"MEMFSJNL";
/// Segment format version; bump on any incompatible change.
pub const SEGMENT_VERSION: u32 = 1;
/// Size of the segment header.
pub const SEGMENT_HEADER_LEN: usize = 32;
/// First 4 bytes of every commit frame.
pub const FRAME_MAGIC: [u8; 4] = *b"CMT1";
/// Size of a commit frame header.
pub const FRAME_HEADER_LEN: usize = 20;
/// Upper bound on one commit's payload: bigger is certainly corruption.
pub const MAX_PAYLOAD: usize = 1 << 30;

pub fn segment_file_name(first: u64) -> String {
    format!("journal-{first:020}.log")
}

pub fn parse_segment_file_name(name: &str) -> Option<u64> {
    parse_numbered_name(name, "journal-", ".log")
}

/// The commit in `PREFIX<20 digits>SUFFIX`, the shape of every numbered
/// file of a data directory (segments, checkpoints); anything else is not
/// one of ours.
pub fn parse_numbered_name(name: &str, prefix: &str, suffix: &str) -> Option<u64> {
    let digits = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

pub fn encode_segment_header(first: u64) -> [u8; SEGMENT_HEADER_LEN] {
    let mut h = [0u8; SEGMENT_HEADER_LEN];
    h[0..8].copy_from_slice(&SEGMENT_MAGIC);
    h[8..12].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(SEGMENT_HEADER_LEN as u32).to_le_bytes());
    h[16..24].copy_from_slice(&first.to_le_bytes());
    let crc = crc32c::crc32c(&h[0..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    debug_assert_eq!(
        decode_segment_header(&h),
        Ok(first),
        "a segment header decodes to itself"
    );
    h
}

/// Decodes a segment header, returning its first commit id.
pub fn decode_segment_header(h: &[u8]) -> Result<u64, String> {
    if h.len() < SEGMENT_HEADER_LEN {
        return Err(format!("segment header truncated ({} bytes)", h.len()));
    }
    if h[0..8] != SEGMENT_MAGIC {
        return Err("bad segment magic".into());
    }
    let crc = u32::from_le_bytes(h[28..32].try_into().unwrap());
    if crc != crc32c::crc32c(&h[0..28]) {
        return Err("segment header checksum mismatch".into());
    }
    let version = u32::from_le_bytes(h[8..12].try_into().unwrap());
    if version != SEGMENT_VERSION {
        return Err(format!("unsupported segment version {version}"));
    }
    Ok(u64::from_le_bytes(h[16..24].try_into().unwrap()))
}

/// The checksum of a frame covers the payload, then the first 16 header bytes
/// (magic, length, commit id). Payload first so the caller can checksum the
/// payload before taking the journal lock and finish it once the id is known.
pub fn frame_crc(payload_crc: u32, header16: &[u8]) -> u32 {
    crc32c::crc32c_append(payload_crc, header16)
}

/// The header of frame `id` whose payload is `payload_len` bytes with
/// checksum `payload_crc` (of the payload alone, see [`frame_crc`]): the one
/// place the frame layout is written (the writer appends with it, the tests
/// decode it back with [`decode_frame`]).
pub fn encode_frame_header(
    id: u64,
    payload_len: usize,
    payload_crc: u32,
) -> [u8; FRAME_HEADER_LEN] {
    // The writer refuses larger payloads before it takes an id; a header
    // whose length field wrapped would be read back as a different frame.
    assert!(
        payload_len <= MAX_PAYLOAD,
        "frame payload of {payload_len} bytes"
    );
    assert!(id > 0, "commit ids start at 1");
    let mut h = [0u8; FRAME_HEADER_LEN];
    h[0..4].copy_from_slice(&FRAME_MAGIC);
    h[4..8].copy_from_slice(&(payload_len as u32).to_le_bytes());
    h[8..16].copy_from_slice(&id.to_le_bytes());
    let crc = frame_crc(payload_crc, &h[0..16]);
    h[16..20].copy_from_slice(&crc.to_le_bytes());
    // The header's own fields (the payload's checksum is the caller's: it
    // may have been computed in parts).
    debug_assert!(
        h[0..4] == FRAME_MAGIC
            && u32::from_le_bytes(h[4..8].try_into().unwrap()) as usize == payload_len
            && u64::from_le_bytes(h[8..16].try_into().unwrap()) == id,
        "a frame header decodes to itself"
    );
    h
}

/// Outcome of decoding the frame that starts at the front of `buf`.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A whole, checksummed frame.
    Ok {
        id: u64,
        payload: &'a [u8],
        len: usize,
    },
    /// The frame claims more bytes than remain: a torn write if at the tail.
    Truncated,
    /// The frame is complete but wrong (magic, length or checksum).
    Bad(String),
}

pub fn decode_frame(buf: &[u8]) -> Frame<'_> {
    if buf.len() < FRAME_HEADER_LEN {
        if buf[..].iter().all(|&b| b == 0) || buf.starts_with(&FRAME_MAGIC[..buf.len().min(4)]) {
            return Frame::Truncated;
        }
        return Frame::Bad("garbage shorter than a frame header".into());
    }
    if buf[0..4] != FRAME_MAGIC {
        return Frame::Bad("bad frame magic".into());
    }
    let len = u32::from_le_bytes(buf[4..8].try_into().unwrap()) as usize;
    if len > MAX_PAYLOAD {
        return Frame::Bad(format!("frame length {len} exceeds the maximum"));
    }
    let id = u64::from_le_bytes(buf[8..16].try_into().unwrap());
    let crc = u32::from_le_bytes(buf[16..20].try_into().unwrap());
    let total = FRAME_HEADER_LEN + len;
    if buf.len() < total {
        return Frame::Truncated;
    }
    let payload = &buf[FRAME_HEADER_LEN..total];
    if frame_crc(crc32c::crc32c(payload), &buf[0..16]) != crc {
        return Frame::Bad("frame checksum mismatch".into());
    }
    Frame::Ok {
        id,
        payload,
        len: total,
    }
}

/// Finds the next offset at or after `from` where a whole valid frame starts.
/// Used only on the damage path to tell a torn tail from corruption in the
/// middle: a valid frame after a bad one means data was lost mid-log.
pub fn find_valid_frame_after(buf: &[u8], from: usize) -> Option<usize> {
    let mut pos = from;
    while pos + FRAME_HEADER_LEN <= buf.len() {
        let rel = memchr_magic(&buf[pos..])?;
        let at = pos + rel;
        if let Frame::Ok { .. } = decode_frame(&buf[at..]) {
            return Some(at);
        }
        pos = at + 1;
    }
    None
}

/// Sector size of the crash model: unsynced writes reach the disk sector by
/// sector, in any order.
pub const SECTOR: usize = 512;

/// Whether the bad frame at `pos` looks cut short by a crash rather than
/// damaged after it was written. Segments are only ever appended to, so a
/// sector of an unsynced write that never reached the disk reads back as
/// zeros, even when later writes did land (a crash may persist unsynced writes
/// in any order). The frame is taken as torn when its share of some 512-byte
/// sector is all zeros. Its extent comes from its own header; a header that
/// is not whole stops at the header (a partly landed length field can only
/// shrink, so the extent never reaches into another write).
pub fn torn_by_crash(buf: &[u8], pos: usize) -> bool {
    let header_end = (pos + FRAME_HEADER_LEN).min(buf.len());
    let end = if header_end == pos + FRAME_HEADER_LEN && buf[pos..pos + 4] == FRAME_MAGIC {
        let len = u32::from_le_bytes(buf[pos + 4..pos + 8].try_into().unwrap()) as usize;
        header_end.saturating_add(len).min(buf.len())
    } else {
        header_end
    };
    let mut at = pos;
    while at < end {
        let sector_end = ((at / SECTOR + 1) * SECTOR).min(end);
        if buf[at..sector_end].iter().all(|&b| b == 0) {
            return true;
        }
        at = sector_end;
    }
    false
}

fn memchr_magic(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == FRAME_MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_round_trip_and_damage() {
        let payload = b"hello journal";
        let h = encode_frame_header(7, payload.len(), crc32c::crc32c(payload));
        let mut buf = h.to_vec();
        buf.extend_from_slice(payload);
        match decode_frame(&buf) {
            Frame::Ok {
                id,
                payload: p,
                len,
            } => {
                assert_eq!(id, 7);
                assert_eq!(p, payload);
                assert_eq!(len, buf.len());
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(decode_frame(&buf[..buf.len() - 1]), Frame::Truncated);
        for i in 0..buf.len() {
            let mut b = buf.clone();
            b[i] ^= 0x40;
            assert!(
                !matches!(decode_frame(&b), Frame::Ok { .. }),
                "flip at {i} undetected"
            );
        }
    }

    proptest::proptest! {
        /// encode -> decode is the identity on frames and segment headers.
        #[test]
        fn frames_and_segment_headers_round_trip(
            id in 1u64..,
            payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
            extra in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
        ) {
            let mut buf = encode_frame_header(id, payload.len(), crc32c::crc32c(&payload)).to_vec();
            buf.extend_from_slice(&payload);
            let len = buf.len();
            // What follows a frame is not part of it.
            buf.extend_from_slice(&extra);
            proptest::prop_assert_eq!(
                decode_frame(&buf),
                Frame::Ok { id, payload: &payload[..], len }
            );
            proptest::prop_assert_eq!(decode_segment_header(&encode_segment_header(id)), Ok(id));
            proptest::prop_assert_eq!(parse_segment_file_name(&segment_file_name(id)), Some(id));
        }

        /// Bad bytes are an error or a torn tail, never a panic.
        #[test]
        fn any_bytes_decode_or_fail_cleanly(
            b in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..100),
        ) {
            let _ = decode_frame(&b);
            let _ = decode_segment_header(&b);
            let _ = find_valid_frame_after(&b, 0);
            if !b.is_empty() {
                let _ = torn_by_crash(&b, b.len() / 2);
            }
        }
    }

    #[test]
    fn segment_header_round_trip() {
        let h = encode_segment_header(42);
        assert_eq!(decode_segment_header(&h), Ok(42));
        let mut bad = h;
        bad[17] ^= 1;
        assert!(decode_segment_header(&bad).is_err());
        assert_eq!(parse_segment_file_name(&segment_file_name(42)), Some(42));
        assert_eq!(parse_segment_file_name("journal-1.log"), None);
    }
}
