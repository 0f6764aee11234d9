//! Sparse file contents.
//!
//! A file is a map from page index to a 4 KiB page. Holes are absent pages, so a
//! 1 TiB sparse file costs one empty map. A page is exactly one 4096-byte
//! allocation: a reference count in front of it (`Arc`) pushed each page into
//! the allocator's next size class and cost 35 % more memory than the data
//! (measured with `memfs bench memory`, see docs/bench-issue2.md).
//!
//! Invariant: no page holds bytes at or beyond the file size other than zeros.
//! Truncation zeroes the tail of the last page, so growing a file again can never
//! expose old contents.

use crate::types::PAGE_SIZE;
use std::collections::BTreeMap;

pub(crate) type Page = [u8; PAGE_SIZE];

const PAGE: u64 = PAGE_SIZE as u64;

type PageMap = BTreeMap<u64, Box<Page>>;

/// Empty files (most files of metadata-heavy workloads) hold no map at all:
/// one pointer here instead of a 24-byte map keeps every inode in a smaller
/// allocation size class.
#[derive(Clone, Default)]
pub(crate) struct FileData {
    pages: Option<Box<PageMap>>,
}

static EMPTY: PageMap = BTreeMap::new();

fn zero_page() -> Box<Page> {
    // Zeroed straight from the allocator (calloc), never through the stack.
    Box::<Page>::try_from(vec![0u8; PAGE_SIZE].into_boxed_slice()).expect("one page")
}

fn page_from(chunk: &[u8]) -> Box<Page> {
    Box::<Page>::try_from(Box::<[u8]>::from(chunk)).expect("chunk is one page")
}

impl FileData {
    fn map(&self) -> &PageMap {
        self.pages.as_deref().unwrap_or(&EMPTY)
    }

    fn map_mut(&mut self) -> &mut PageMap {
        self.pages.get_or_insert_with(Default::default)
    }

    /// Gives the map back once the last page is gone.
    fn shrink(&mut self) {
        if self.pages.as_ref().is_some_and(|m| m.is_empty()) {
            self.pages = None;
        }
    }

    /// Number of pages allocated.
    pub fn page_count(&self) -> u64 {
        self.map().len() as u64
    }

    /// Pages in `[first, last]` that are not allocated yet.
    pub fn missing_pages(&self, first: u64, last: u64) -> u64 {
        let present = self.map().range(first..=last).count() as u64;
        (last - first + 1) - present
    }

    /// Copies `buf.len()` bytes starting at `off` into `buf`; holes read as zeros.
    /// The caller clamps the range to the file size.
    pub fn read(&self, off: u64, buf: &mut [u8]) {
        if buf.is_empty() {
            return;
        }
        let end = off + buf.len() as u64;
        let first = off / PAGE;
        let last = (end - 1) / PAGE;
        // Walk present pages in order, zero-filling the gaps between them.
        let mut filled = off;
        for (&idx, page) in self.map().range(first..=last) {
            let pstart = idx * PAGE;
            if pstart > filled {
                buf[(filled - off) as usize..(pstart - off) as usize].fill(0);
                filled = pstart;
            }
            let from = filled - pstart;
            let to = (end - pstart).min(PAGE);
            let n = (to - from) as usize;
            let dst = (filled - off) as usize;
            buf[dst..dst + n].copy_from_slice(&page[from as usize..to as usize]);
            filled += n as u64;
        }
        if filled < end {
            buf[(filled - off) as usize..].fill(0);
        }
    }

    /// Writes `data` at `off`, allocating pages as needed. Returns the number of
    /// pages allocated (the caller has reserved capacity for them).
    pub fn write(&mut self, off: u64, data: &[u8]) -> u64 {
        let mut allocated = 0;
        let mut pos = off;
        let mut rest = data;
        let pages = self.map_mut();
        while !rest.is_empty() {
            let idx = pos / PAGE;
            let in_page = (pos % PAGE) as usize;
            let n = (PAGE_SIZE - in_page).min(rest.len());
            let (chunk, tail) = rest.split_at(n);
            match pages.get_mut(&idx) {
                Some(page) => page[in_page..in_page + n].copy_from_slice(chunk),
                None => {
                    let page = if n == PAGE_SIZE {
                        // A whole page: no need to zero it first.
                        page_from(chunk)
                    } else {
                        let mut p = zero_page();
                        p[in_page..in_page + n].copy_from_slice(chunk);
                        p
                    };
                    pages.insert(idx, page);
                    allocated += 1;
                }
            }
            pos += n as u64;
            rest = tail;
        }
        allocated
    }

    /// Zeroes `[off, off + len)` without allocating: absent pages already read
    /// as zeros, whole present pages are dropped. Returns pages freed.
    pub fn punch(&mut self, off: u64, len: u64) -> u64 {
        if len == 0 {
            return 0;
        }
        let end = off.saturating_add(len);
        let first_whole = off.div_ceil(PAGE);
        let end_whole = end / PAGE; // exclusive
        let mut freed = 0;
        if first_whole < end_whole {
            let doomed: Vec<u64> = self
                .map()
                .range(first_whole..end_whole)
                .map(|(&k, _)| k)
                .collect();
            freed = doomed.len() as u64;
            if let Some(pages) = self.pages.as_mut() {
                for k in doomed {
                    pages.remove(&k);
                }
            }
            self.shrink();
        }
        // Partial pages at either edge.
        let head_page = off / PAGE;
        if off % PAGE != 0 || end < (head_page + 1) * PAGE {
            self.zero_in_page(head_page, off, end);
        }
        let tail_page = end / PAGE;
        if end % PAGE != 0 && tail_page != head_page {
            self.zero_in_page(tail_page, end - end % PAGE, end);
        }
        freed
    }

    fn zero_in_page(&mut self, idx: u64, from: u64, to: u64) {
        if let Some(page) = self.pages.as_mut().and_then(|p| p.get_mut(&idx)) {
            let pstart = idx * PAGE;
            let a = (from.max(pstart) - pstart) as usize;
            let b = (to.min(pstart + PAGE) - pstart) as usize;
            if a < b {
                page[a..b].fill(0);
            }
        }
    }

    /// Allocates zeroed pages over `[off, off + len)` where none exist. Returns
    /// pages allocated (capacity reserved by the caller).
    pub fn allocate(&mut self, off: u64, len: u64) -> u64 {
        if len == 0 {
            return 0;
        }
        let first = off / PAGE;
        let last = (off + len - 1) / PAGE;
        let mut allocated = 0;
        let pages = self.map_mut();
        for idx in first..=last {
            if let std::collections::btree_map::Entry::Vacant(e) = pages.entry(idx) {
                e.insert(zero_page());
                allocated += 1;
            }
        }
        self.shrink();
        allocated
    }

    /// Drops everything at or beyond `size` and zeroes the tail of the last page.
    /// Returns pages freed.
    pub fn truncate(&mut self, size: u64) -> u64 {
        let keep = size.div_ceil(PAGE);
        let Some(pages) = self.pages.as_mut() else {
            return 0;
        };
        let doomed = pages.split_off(&keep);
        if size % PAGE != 0 {
            let idx = size / PAGE;
            self.zero_in_page(idx, size, (idx + 1) * PAGE);
        }
        self.shrink();
        doomed.len() as u64
    }

    /// Calls `f` for up to `max` allocated pages from index `start` on, in
    /// order; returns the index to continue from, or `None` at the end. Lets
    /// a checkpoint copy a big file in slices, dropping the lock in between.
    pub fn pages_from(&self, start: u64, max: usize, mut f: impl FnMut(u64, &Page)) -> Option<u64> {
        let mut it = self.map().range(start..);
        for _ in 0..max {
            let (&k, p) = it.next()?;
            f(k, p);
        }
        it.next().map(|(&k, _)| k)
    }

    /// The first offset at or after `off` that is in data (`SEEK_DATA`), given the file size.
    pub fn seek_data(&self, off: u64, size: u64) -> Option<u64> {
        if off >= size {
            return None;
        }
        let idx = off / PAGE;
        let (&k, _) = self.map().range(idx..).next()?;
        let pos = (k * PAGE).max(off);
        (pos < size).then_some(pos)
    }

    /// The first offset at or after `off` that is in a hole (`SEEK_HOLE`); the end
    /// of the file counts as a hole.
    pub fn seek_hole(&self, off: u64, size: u64) -> Option<u64> {
        if off >= size {
            return None;
        }
        let mut idx = off / PAGE;
        for (&k, _) in self.map().range(idx..) {
            if k != idx {
                break;
            }
            idx += 1;
        }
        Some((idx * PAGE).max(off).min(size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holes_read_as_zero_and_writes_allocate_pages() {
        let mut d = FileData::default();
        assert_eq!(d.write(10_000, b"abc"), 1);
        let mut buf = vec![0xffu8; 10_010];
        d.read(0, &mut buf);
        assert!(buf[..10_000].iter().all(|&b| b == 0));
        assert_eq!(&buf[10_000..10_003], b"abc");
        assert!(buf[10_003..].iter().all(|&b| b == 0));
        assert_eq!(d.page_count(), 1);
    }

    #[test]
    fn write_across_pages_and_whole_pages() {
        let mut d = FileData::default();
        let data: Vec<u8> = (0..3 * PAGE_SIZE + 7).map(|i| (i % 251) as u8).collect();
        assert_eq!(d.write(PAGE - 3, &data), 5);
        let mut back = vec![0; data.len()];
        d.read(PAGE - 3, &mut back);
        assert_eq!(back, data);
    }

    #[test]
    fn truncate_zeroes_tail_so_growth_shows_zeros() {
        let mut d = FileData::default();
        d.write(0, &[7u8; 5000]);
        assert_eq!(d.truncate(100), 1);
        let mut buf = vec![1u8; 5000];
        d.read(0, &mut buf);
        assert!(buf[..100].iter().all(|&b| b == 7));
        assert!(buf[100..].iter().all(|&b| b == 0));
    }

    #[test]
    fn punch_frees_whole_pages_and_zeroes_edges() {
        let mut d = FileData::default();
        d.write(0, &[9u8; 4 * PAGE_SIZE]);
        assert_eq!(d.punch(100, 2 * PAGE), 1);
        let mut buf = vec![1u8; 4 * PAGE_SIZE];
        d.read(0, &mut buf);
        assert!(buf[..100].iter().all(|&b| b == 9));
        assert!(buf[100..100 + 2 * PAGE_SIZE].iter().all(|&b| b == 0));
        assert!(buf[100 + 2 * PAGE_SIZE..].iter().all(|&b| b == 9));
    }

    #[test]
    fn seek_data_and_hole() {
        let mut d = FileData::default();
        let size = 10 * PAGE;
        d.write(3 * PAGE + 5, b"x");
        d.write(4 * PAGE, b"y");
        assert_eq!(d.seek_data(0, size), Some(3 * PAGE));
        assert_eq!(d.seek_hole(0, size), Some(0));
        assert_eq!(d.seek_hole(3 * PAGE + 1, size), Some(5 * PAGE));
        assert_eq!(d.seek_data(5 * PAGE, size), None);
        assert_eq!(d.seek_hole(9 * PAGE, size), Some(9 * PAGE));
        assert_eq!(d.seek_data(size, size), None);
    }

    #[test]
    fn clone_is_independent() {
        let mut d = FileData::default();
        d.write(0, b"hello");
        let snap = d.clone();
        d.write(0, b"HE");
        let mut a = [0u8; 5];
        let mut b = [0u8; 5];
        d.read(0, &mut a);
        snap.read(0, &mut b);
        assert_eq!(&a, b"HEllo");
        assert_eq!(&b, b"hello");
    }
}
