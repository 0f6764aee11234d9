//! A flat open-addressing hash table with fixed-width inline keys.
//!
//! Why not `HashMap<Vec<u8>, Vec<u8>>`: that costs two heap allocations and
//! ~80 bytes of overhead per entry. Here a slot is `[value len u16][8 payload
//! bytes][key]` in one contiguous array: values up to 8 bytes live inline, longer
//! ones in a side heap referenced by index. For 8-byte keys and values a slot
//! is 18 bytes; with the load factor kept between 3/8 and 3/4 the overhead is
//! 8 to 32 bytes per entry.
//!
//! Linear probing with backward-shift deletion: no tombstones, so a workload
//! that deletes as much as it inserts (the block workload) never degrades and
//! never needs a cleanup rehash. A length of 0 marks an empty slot (the empty
//! value means "delete", so it is never stored).

const INLINE: usize = 8;

/// Allocates a zeroed slot array and asks the kernel to back it with 2 MiB
/// pages. Probes land on random slots: with 4 KiB pages almost every probe of
/// a large table also misses the TLB, and the page walk misses the cache too.
fn alloc_slots(bytes: usize) -> Vec<u8> {
    let v = vec![0u8; bytes];
    advise_huge_pages(&v);
    v
}

fn huge_pages_wanted() -> bool {
    static WANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WANTED.get_or_init(|| std::env::var("MEMFS_STORE_HUGE_PAGES").map_or(true, |v| v != "0"))
}

fn advise_huge_pages(v: &[u8]) {
    const HUGE: usize = 2 << 20;
    if v.len() < 4 * HUGE || !huge_pages_wanted() {
        return;
    }
    let start = v.as_ptr() as usize;
    let aligned = (start + HUGE - 1) & !(HUGE - 1);
    let end = (start + v.len()) & !(HUGE - 1);
    if end <= aligned {
        return;
    }
    let Some(ptr) = std::ptr::NonNull::new(aligned as *mut std::ffi::c_void) else {
        return;
    };
    // SAFETY: the range lies inside `v`, a live allocation we own; the advice
    // only changes how the kernel backs those pages (huge pages where it can),
    // never their contents or validity. A failure (e.g. THP disabled) is
    // harmless and ignored.
    unsafe {
        let _ = nix::sys::mman::madvise(
            ptr,
            end - aligned,
            nix::sys::mman::MmapAdvise::MADV_HUGEPAGE,
        );
    }
}
const META: usize = 2 + INLINE;

#[derive(Clone)]
pub(crate) struct Table {
    kw: usize,
    slot: usize,
    data: Vec<u8>,
    mask: usize,
    len: usize,
    heap: Vec<Box<[u8]>>,
    free: Vec<u32>,
}

/// Hashes a key. FxHash-style word mixing with a murmur finaliser: keys are
/// often sequential counters, so the finaliser matters for linear probing.
#[inline]
pub fn hash_key(k: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = k.len() as u64;
    let mut chunks = k.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes(c.try_into().unwrap());
        h = (h.rotate_left(5) ^ w).wrapping_mul(K);
    }
    let rem = chunks.remainder();
    if !rem.is_empty() {
        let mut b = [0u8; 8];
        b[..rem.len()].copy_from_slice(rem);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(b)).wrapping_mul(K);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

impl Table {
    pub fn new(kw: usize, capacity: usize) -> Table {
        let cap = (capacity.max(8) * 4 / 3 + 1).next_power_of_two();
        let slot = META + kw;
        Table {
            kw,
            slot,
            data: alloc_slots(cap * slot),
            mask: cap - 1,
            len: 0,
            heap: Vec::new(),
            free: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes held by this table (slots and out-of-line values).
    pub fn memory_bytes(&self) -> usize {
        self.data.capacity()
            + self.heap.capacity() * std::mem::size_of::<Box<[u8]>>()
            + self.heap.iter().map(|b| b.len()).sum::<usize>()
            + self.free.capacity() * 4
    }

    #[inline]
    fn slot_len(&self, i: usize) -> usize {
        let o = i * self.slot;
        u16::from_le_bytes([self.data[o], self.data[o + 1]]) as usize
    }

    #[inline]
    fn slot_key(&self, i: usize) -> &[u8] {
        let o = i * self.slot + META;
        &self.data[o..o + self.kw]
    }

    #[inline]
    fn find(&self, key: &[u8], h: u64) -> Result<usize, usize> {
        // Compare the first 8 key bytes as one word before the rest: almost
        // every mismatch is decided there without a call to memcmp.
        let k8 = u64::from_le_bytes(key[..8].try_into().unwrap());
        let mut i = h as usize & self.mask;
        loop {
            let o = i * self.slot;
            let s = &self.data[o..o + self.slot];
            if s[0] == 0 && s[1] == 0 {
                return Err(i);
            }
            let sk = &s[META..];
            if u64::from_le_bytes(sk[..8].try_into().unwrap()) == k8
                && (self.kw == 8 || sk[8..] == key[8..])
            {
                return Ok(i);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Hints the CPU to fetch the home slot of `h`: applying a batch, the
    /// caller prefetches a few operations ahead so cache misses overlap.
    #[inline]
    pub fn prefetch(&self, h: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            let p = self
                .data
                .as_ptr()
                .wrapping_add((h as usize & self.mask) * self.slot);
            // SAFETY: a prefetch is only a cache hint: it has no architectural
            // effect and cannot fault whatever the address (here it is inside
            // `self.data` anyway). SSE is part of the x86_64 baseline.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = h;
    }

    fn value_at(&self, i: usize) -> &[u8] {
        let len = self.slot_len(i);
        let o = i * self.slot + 2;
        if len <= INLINE {
            &self.data[o..o + len]
        } else {
            let idx = u32::from_le_bytes(self.data[o..o + 4].try_into().unwrap());
            &self.heap[idx as usize]
        }
    }

    #[inline]
    pub fn get(&self, key: &[u8], h: u64) -> Option<&[u8]> {
        self.find(key, h).ok().map(|i| self.value_at(i))
    }

    fn push_heap(&mut self, v: &[u8]) -> u32 {
        let b: Box<[u8]> = v.into();
        match self.free.pop() {
            Some(i) => {
                self.heap[i as usize] = b;
                i
            }
            None => {
                self.heap.push(b);
                (self.heap.len() - 1) as u32
            }
        }
    }

    /// Releases the value stored in slot `i`, appending `[len u16][bytes]` to
    /// `old` when given.
    fn take_value(&mut self, i: usize, old: Option<&mut Vec<u8>>) {
        let len = self.slot_len(i);
        let o = i * self.slot + 2;
        if len <= INLINE {
            if let Some(old) = old {
                old.extend_from_slice(&(len as u16).to_le_bytes());
                old.extend_from_slice(&self.data[o..o + len]);
            }
        } else {
            let idx = u32::from_le_bytes(self.data[o..o + 4].try_into().unwrap());
            let b = std::mem::take(&mut self.heap[idx as usize]);
            if let Some(old) = old {
                old.extend_from_slice(&(len as u16).to_le_bytes());
                old.extend_from_slice(&b);
            }
            self.free.push(idx);
        }
    }

    fn store_value(&mut self, i: usize, v: &[u8]) {
        debug_assert!(!v.is_empty() && v.len() <= u16::MAX as usize);
        let o = i * self.slot;
        self.data[o..o + 2].copy_from_slice(&(v.len() as u16).to_le_bytes());
        if v.len() <= INLINE {
            self.data[o + 2..o + 2 + v.len()].copy_from_slice(v);
        } else {
            let idx = self.push_heap(v);
            self.data[o + 2..o + 6].copy_from_slice(&idx.to_le_bytes());
        }
    }

    /// Sets `key` to `v` (non-empty). Appends the old value as `[len][bytes]`
    /// (len 0 when absent) to `old` when given.
    pub fn set(&mut self, key: &[u8], h: u64, v: &[u8], old: Option<&mut Vec<u8>>) {
        match self.find(key, h) {
            Ok(i) => {
                self.take_value(i, old);
                self.store_value(i, v);
            }
            Err(mut i) => {
                if let Some(old) = old {
                    old.extend_from_slice(&0u16.to_le_bytes());
                }
                if (self.len + 1) * 4 > (self.mask + 1) * 3 {
                    self.grow();
                    i = self.find(key, h).unwrap_err();
                }
                let o = i * self.slot + META;
                self.data[o..o + self.kw].copy_from_slice(key);
                self.store_value(i, v);
                self.len += 1;
            }
        }
    }

    /// Removes `key`. Appends the old value as `[len][bytes]` (len 0 when
    /// absent) to `old` when given.
    pub fn remove(&mut self, key: &[u8], h: u64, old: Option<&mut Vec<u8>>) {
        let Ok(mut i) = self.find(key, h) else {
            if let Some(old) = old {
                old.extend_from_slice(&0u16.to_le_bytes());
            }
            return;
        };
        self.take_value(i, old);
        self.len -= 1;
        // Backward shift: pull later members of the probe run into the hole
        // unless that would move them before their home slot.
        let mut j = i;
        loop {
            j = (j + 1) & self.mask;
            if self.slot_len(j) == 0 {
                break;
            }
            let home = hash_key(self.slot_key(j)) as usize & self.mask;
            if (j.wrapping_sub(home) & self.mask) >= (j.wrapping_sub(i) & self.mask) {
                let (s, n) = (self.slot, self.slot);
                self.data.copy_within(j * s..j * s + n, i * s);
                i = j;
            }
        }
        let o = i * self.slot;
        self.data[o..o + 2].copy_from_slice(&[0, 0]);
    }

    fn grow(&mut self) {
        let new_cap = (self.mask + 1) * 2;
        let old = std::mem::replace(&mut self.data, alloc_slots(new_cap * self.slot));
        self.mask = new_cap - 1;
        for s in old.chunks_exact(self.slot) {
            if s[0] == 0 && s[1] == 0 {
                continue;
            }
            let key = &s[META..];
            let mut i = hash_key(key) as usize & self.mask;
            while self.slot_len(i) != 0 {
                i = (i + 1) & self.mask;
            }
            self.data[i * self.slot..(i + 1) * self.slot].copy_from_slice(s);
        }
    }

    /// Visits every live entry.
    pub fn for_each(&self, mut f: impl FnMut(&[u8], &[u8])) {
        for i in 0..=self.mask {
            if self.slot_len(i) != 0 {
                f(self.slot_key(i), self.value_at(i));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn matches_a_hashmap_under_random_churn() {
        use rand::{Rng, SeedableRng, rngs::StdRng};
        let mut rng = StdRng::seed_from_u64(1);
        let mut t = Table::new(8, 4);
        let mut m: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        for step in 0..200_000u32 {
            let k = (rng.random_range(0..3000u64)).to_be_bytes().to_vec();
            let h = hash_key(&k);
            let mut old = Vec::new();
            if rng.random_bool(0.55) {
                let len = if rng.random_bool(0.8) {
                    8
                } else {
                    rng.random_range(1..40)
                };
                let v: Vec<u8> = (0..len).map(|i| (step as usize + i) as u8 | 1).collect();
                t.set(&k, h, &v, Some(&mut old));
                let prev = m.insert(k.clone(), v);
                check_old(&old, prev.as_deref());
            } else {
                t.remove(&k, h, Some(&mut old));
                let prev = m.remove(&k);
                check_old(&old, prev.as_deref());
            }
            assert_eq!(t.len(), m.len());
        }
        for (k, v) in &m {
            assert_eq!(t.get(k, hash_key(k)), Some(&v[..]));
        }
        let mut n = 0;
        t.for_each(|k, v| {
            assert_eq!(m.get(k).map(|x| &x[..]), Some(v));
            n += 1;
        });
        assert_eq!(n, m.len());
    }

    fn check_old(old: &[u8], prev: Option<&[u8]>) {
        let len = u16::from_le_bytes([old[0], old[1]]) as usize;
        match prev {
            Some(p) => assert_eq!(&old[2..2 + len], p),
            None => assert_eq!(len, 0),
        }
    }

    #[test]
    fn overhead_per_small_entry_is_under_40_bytes() {
        let mut t = Table::new(8, 16);
        for n in [1000u64, 5000, 20_000, 100_000, 300_000] {
            while (t.len() as u64) < n {
                let k = (t.len() as u64).to_be_bytes();
                t.set(&k, hash_key(&k), &k, None);
            }
            let per = t.memory_bytes() as f64 / t.len() as f64 - 16.0;
            assert!(per <= 40.0, "{per:.1} bytes of overhead per entry at {n}");
        }
    }
}
