//! Sparse file contents.
//!
//! A file is a map from page index to a 4 KiB page. Holes are absent pages, so a
//! 1 TiB sparse file costs one empty map. A page is exactly one 4096-byte
//! allocation: a reference count in front of it (`Arc`) pushed each page into
//! the allocator's next size class and cost 35 % more memory than the data
//! (measured with `memfs bench memory`, see docs/bench-issue2.md).
//!
//! Small files are stored inline: a file whose only bytes lie in the first
//! [`INLINE_MAX`] bytes keeps them in one buffer of their own length instead
//! of a page (10,000 files of 64 B took 48 MiB as pages, see docs/engine.md).
//! Inline is only a representation: to every caller an inline file *is* a
//! file whose page 0 is allocated and reads as the buffer followed by zeros.
//! Page counts, capacity, `st_blocks`, `SEEK_DATA`/`SEEK_HOLE` and checkpoint
//! images see exactly what they would see for page 0, so nothing above this
//! module changes and no on-disk format does either.
//!
//! Invariant: no page holds bytes at or beyond the file size other than zeros.
//! Truncation zeroes the tail of the last page, so growing a file again can never
//! expose old contents. An inline buffer likewise never holds bytes at or
//! beyond the file size (truncation shortens it).

use crate::types::PAGE_SIZE;
use std::collections::BTreeMap;
use std::sync::Arc;

pub(crate) type Page = [u8; PAGE_SIZE];

const PAGE: u64 = PAGE_SIZE as u64;

/// Largest inline file body. Half a page: an inline buffer costs its length
/// plus a 24-byte header, so up to here it saves at least 2 KiB against a
/// page, while past it the saving shrinks and every append that crosses it
/// pays a copy into a page (the figures per size are in docs/engine.md).
pub const INLINE_MAX: usize = PAGE_SIZE / 2;

type PageMap = BTreeMap<u64, Slot>;

/// One page of a file: its own, or shared copy-on-write with snapshots
/// (`snapshot.rs`). Shared pages are the exception (only a snapshot makes
/// them), so an owned page stays one bare 4096-byte allocation.
pub(crate) enum Slot {
    Own(Box<Page>),
    /// The outer `Arc` counts holders in this file system (the live file and
    /// snapshots): the last one to let go gives the page back to this file
    /// system's usage. The inner one counts holders across file systems (a
    /// clone shares the page too, under an outer `Arc` of its own): the last
    /// one frees the memory. Two counts need two `Arc`s; the page itself
    /// stays a separate 4096-byte `Box` (an `Arc<Page>` would be 4112 bytes,
    /// the allocator's next size class).
    #[allow(clippy::redundant_allocation)]
    Shared(Arc<Arc<Box<Page>>>),
}

impl Clone for Slot {
    /// A deep copy of an owned page, another holder of a shared one.
    fn clone(&self) -> Slot {
        match self {
            Slot::Own(p) => Slot::Own(p.clone()),
            Slot::Shared(a) => Slot::Shared(a.clone()),
        }
    }
}

impl Slot {
    fn page(&self) -> &Page {
        match self {
            Slot::Own(p) => p,
            Slot::Shared(a) => a,
        }
    }

    /// Lets the page go; true when that gives a page back to this file system.
    fn release(self) -> bool {
        match self {
            Slot::Own(_) => true,
            Slot::Shared(a) => Arc::into_inner(a).is_some(),
        }
    }
}

/// Makes page `idx` (present) the file's own to write: a shared page that
/// nobody else holds any more is written in place, else it is copied.
/// Returns the page and the pages this adds to the file system's usage (1
/// for a copy of a page that a snapshot keeps).
fn own_page(pages: &mut PageMap, idx: u64) -> (&mut Page, u64) {
    let slot = pages.get_mut(&idx).expect("page present");
    let mut added = 0;
    if let Slot::Shared(a) = slot {
        let unique = Arc::get_mut(a).and_then(Arc::get_mut).is_some();
        if !unique {
            let copy = page_from(&a[..]);
            // Another holder may have let go meanwhile: then this was the
            // last holder here and the copy replaces it in the count.
            if !std::mem::replace(slot, Slot::Own(copy)).release() {
                added = 1;
            }
        }
    }
    let page = match slot {
        Slot::Own(p) => &mut **p,
        Slot::Shared(a) => &mut **Arc::get_mut(a)
            .and_then(Arc::get_mut)
            .expect("unique above"),
    };
    (page, added)
}

/// Empty files (most files of metadata-heavy workloads) hold nothing: the
/// enum is two words, so `Body` stays two words and every inode keeps its
/// allocation size class.
#[derive(Clone, Default)]
pub(crate) enum FileData {
    #[default]
    Empty,
    /// Page 0 only, holding these bytes followed by zeros. Boxed so that the
    /// variant is one pointer; the `Vec` keeps its capacity, so overwriting
    /// an inline file in place allocates nothing.
    // A bare `Vec` would make the enum, and so every inode, a word bigger.
    #[allow(clippy::box_collection)]
    Inline(Box<Vec<u8>>),
    /// Never empty: the last page going away makes the file `Empty`.
    Pages(Box<PageMap>),
}

static EMPTY: PageMap = BTreeMap::new();

fn zero_page() -> Box<Page> {
    // Zeroed straight from the allocator (calloc), never through the stack.
    Box::<Page>::try_from(vec![0u8; PAGE_SIZE].into_boxed_slice()).expect("one page")
}

fn page_from(chunk: &[u8]) -> Box<Page> {
    Box::<Page>::try_from(Box::<[u8]>::from(chunk)).expect("chunk is one page")
}

/// Length of `data` without its trailing zeros.
fn trimmed_len(data: &[u8]) -> usize {
    data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1)
}

impl FileData {
    fn map(&self) -> &PageMap {
        match self {
            FileData::Pages(m) => m,
            _ => &EMPTY,
        }
    }

    /// Turns an inline or empty file into pages (the inline bytes become page 0).
    fn map_mut(&mut self) -> &mut PageMap {
        if !matches!(self, FileData::Pages(_)) {
            let mut map = PageMap::new();
            if let FileData::Inline(v) = self {
                let mut p = zero_page();
                p[..v.len()].copy_from_slice(v);
                map.insert(0, Slot::Own(p));
            }
            *self = FileData::Pages(Box::new(map));
        }
        match self {
            FileData::Pages(m) => m,
            _ => unreachable!("just made pages"),
        }
    }

    /// Gives the map back once the last page is gone.
    fn shrink(&mut self) {
        if let FileData::Pages(m) = self
            && m.is_empty()
        {
            *self = FileData::Empty;
        }
    }

    /// Whether the file is stored inline (for tests and figures).
    pub fn is_inline(&self) -> bool {
        matches!(self, FileData::Inline(_))
    }

    /// Number of pages allocated.
    pub fn page_count(&self) -> u64 {
        match self {
            FileData::Empty => 0,
            FileData::Inline(_) => 1,
            FileData::Pages(m) => m.len() as u64,
        }
    }

    /// Pages in `[first, last]` that are not allocated yet.
    pub fn missing_pages(&self, first: u64, last: u64) -> u64 {
        let present = match self {
            FileData::Empty => 0,
            FileData::Inline(_) => u64::from(first == 0),
            FileData::Pages(m) => m.range(first..=last).count() as u64,
        };
        (last - first + 1) - present
    }

    /// Copies `buf.len()` bytes starting at `off` into `buf`; holes read as zeros.
    /// The caller clamps the range to the file size.
    pub fn read(&self, off: u64, buf: &mut [u8]) {
        if buf.is_empty() {
            return;
        }
        if let FileData::Inline(v) = self {
            let have = (v.len() as u64).saturating_sub(off).min(buf.len() as u64) as usize;
            if have > 0 {
                buf[..have].copy_from_slice(&v[off as usize..off as usize + have]);
            }
            buf[have..].fill(0);
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
            buf[dst..dst + n].copy_from_slice(&page.page()[from as usize..to as usize]);
            filled += n as u64;
        }
        if filled < end {
            buf[(filled - off) as usize..].fill(0);
        }
    }

    /// Writes into an empty or inline file without leaving the inline form,
    /// if the result fits; returns pages allocated, or `None` to fall back to
    /// pages. Trailing zeros past [`INLINE_MAX`] within page 0 change nothing
    /// past the buffer, so a whole page 0 written back from a checkpoint image
    /// for a small file stays inline.
    fn write_inline(&mut self, off: u64, data: &[u8]) -> Option<u64> {
        let end = off.checked_add(data.len() as u64)?;
        if end > PAGE {
            return None;
        }
        let (off, end) = (off as usize, end as usize);
        let have = match self {
            FileData::Empty => 0,
            FileData::Inline(v) => v.len(),
            FileData::Pages(_) => return None,
        };
        let significant_end = if end <= INLINE_MAX {
            end
        } else {
            match trimmed_len(data) {
                0 => 0,
                k => off + k,
            }
        };
        let new_len = have.max(significant_end);
        if new_len > INLINE_MAX {
            return None;
        }
        // Zeros written over old bytes must land; zeros past the buffer need not.
        let n = new_len.saturating_sub(off).min(data.len());
        let allocated = match self {
            FileData::Empty => {
                // Exact size: most small files are written once, whole.
                *self = FileData::Inline(Box::new(Vec::with_capacity(new_len)));
                1
            }
            _ => 0,
        };
        let FileData::Inline(v) = self else {
            unreachable!("inline above")
        };
        if new_len > v.len() {
            if new_len > v.capacity() {
                // Geometric growth keeps appends amortised; capped so that the
                // buffer never outgrows the page it saves.
                let want = new_len.max(v.capacity() * 2).min(INLINE_MAX);
                v.reserve_exact(want - v.len());
            }
            v.resize(new_len, 0);
        }
        if n > 0 {
            v[off..off + n].copy_from_slice(&data[..n]);
        }
        Some(allocated)
    }

    /// Writes `data` at `off`, allocating pages as needed. Returns the number of
    /// pages allocated (the caller has reserved capacity for them).
    pub fn write(&mut self, off: u64, data: &[u8]) -> u64 {
        if data.is_empty() {
            return 0;
        }
        if !matches!(self, FileData::Pages(_))
            && let Some(allocated) = self.write_inline(off, data)
        {
            return allocated;
        }
        // Page 0 already counted if the file was inline.
        let mut allocated = 0;
        let mut pos = off;
        let mut rest = data;
        let pages = self.map_mut();
        while !rest.is_empty() {
            let idx = pos / PAGE;
            let in_page = (pos % PAGE) as usize;
            let n = (PAGE_SIZE - in_page).min(rest.len());
            let (chunk, tail) = rest.split_at(n);
            match pages.contains_key(&idx) {
                true => {
                    let (page, added) = own_page(pages, idx);
                    page[in_page..in_page + n].copy_from_slice(chunk);
                    allocated += added;
                }
                false => {
                    let page = if n == PAGE_SIZE {
                        // A whole page: no need to zero it first.
                        page_from(chunk)
                    } else {
                        let mut p = zero_page();
                        p[in_page..in_page + n].copy_from_slice(chunk);
                        p
                    };
                    pages.insert(idx, Slot::Own(page));
                    allocated += 1;
                }
            }
            pos += n as u64;
            rest = tail;
        }
        allocated
    }

    /// Zeroes `[off, off + len)`: absent pages already read as zeros, whole
    /// present pages are dropped. Returns the pages this gives back to the
    /// file system, less one for each partial page it had to copy because a
    /// snapshot shares it (so it may be negative).
    pub fn punch(&mut self, off: u64, len: u64) -> i64 {
        if len == 0 {
            return 0;
        }
        let end = off.saturating_add(len);
        let first_whole = off.div_ceil(PAGE);
        let end_whole = end / PAGE; // exclusive
        if let FileData::Inline(v) = self {
            if first_whole == 0 && end_whole >= 1 {
                *self = FileData::Empty;
                return 1;
            }
            let a = (off as usize).min(v.len());
            let b = end.min(v.len() as u64) as usize;
            if a < b {
                v[a..b].fill(0);
            }
            return 0;
        }
        let mut freed = 0i64;
        if first_whole < end_whole {
            let doomed: Vec<u64> = self
                .map()
                .range(first_whole..end_whole)
                .map(|(&k, _)| k)
                .collect();
            if let FileData::Pages(pages) = self {
                for k in doomed {
                    if pages.remove(&k).is_some_and(Slot::release) {
                        freed += 1;
                    }
                }
            }
            self.shrink();
        }
        // Partial pages at either edge.
        let head_page = off / PAGE;
        if off % PAGE != 0 || end < (head_page + 1) * PAGE {
            freed -= self.zero_in_page(head_page, off, end) as i64;
        }
        let tail_page = end / PAGE;
        if end % PAGE != 0 && tail_page != head_page {
            freed -= self.zero_in_page(tail_page, end - end % PAGE, end) as i64;
        }
        freed
    }

    /// Zeroes part of a page if present; returns pages added (a shared page copied).
    fn zero_in_page(&mut self, idx: u64, from: u64, to: u64) -> u64 {
        let pstart = idx * PAGE;
        let a = (from.max(pstart) - pstart) as usize;
        let b = (to.min(pstart + PAGE) - pstart) as usize;
        if a >= b {
            return 0;
        }
        if let FileData::Pages(pages) = self
            && let Some(slot) = pages.get(&idx)
        {
            if slot.page()[a..b].iter().all(|&x| x == 0) {
                // Nothing to change: no copy of a shared page.
                return 0;
            }
            let (page, added) = own_page(pages, idx);
            page[a..b].fill(0);
            return added;
        }
        0
    }

    /// Allocates zeroed pages over `[off, off + len)` where none exist. Returns
    /// pages allocated (capacity reserved by the caller).
    pub fn allocate(&mut self, off: u64, len: u64) -> u64 {
        if len == 0 {
            return 0;
        }
        let first = off / PAGE;
        let last = (off + len - 1) / PAGE;
        match self {
            // Page 0 alone: an empty inline buffer is an allocated zero page.
            FileData::Empty if last == 0 => {
                *self = FileData::Inline(Box::default());
                1
            }
            FileData::Inline(_) if last == 0 => 0,
            _ => {
                let mut allocated = 0;
                let pages = self.map_mut();
                for idx in first..=last {
                    if let std::collections::btree_map::Entry::Vacant(e) = pages.entry(idx) {
                        e.insert(Slot::Own(zero_page()));
                        allocated += 1;
                    }
                }
                allocated
            }
        }
    }

    /// Drops everything at or beyond `size` and zeroes the tail of the last page.
    /// Returns pages given back (see [`FileData::punch`]; may be negative).
    pub fn truncate(&mut self, size: u64) -> i64 {
        match self {
            FileData::Empty => 0,
            FileData::Inline(_) if size == 0 => {
                *self = FileData::Empty;
                1
            }
            FileData::Inline(v) => {
                if (v.len() as u64) > size {
                    v.truncate(size as usize);
                }
                0
            }
            FileData::Pages(pages) => {
                let keep = size.div_ceil(PAGE);
                let doomed = pages.split_off(&keep);
                let mut freed = doomed
                    .into_values()
                    .filter_map(|s| s.release().then_some(()))
                    .count() as i64;
                if size % PAGE != 0 {
                    let idx = size / PAGE;
                    freed -= self.zero_in_page(idx, size, (idx + 1) * PAGE) as i64;
                }
                self.shrink();
                // Cut down to a small file: back to inline, giving the page back.
                if let FileData::Pages(pages) = self
                    && size <= INLINE_MAX as u64
                    && pages.len() == 1
                    && let Some(p) = pages.get(&0)
                {
                    let bytes = p.page()[..size as usize].to_vec();
                    let FileData::Pages(mut pages) =
                        std::mem::replace(self, FileData::Inline(Box::new(bytes)))
                    else {
                        unreachable!("pages above")
                    };
                    // The inline buffer counts as page 0 from now on.
                    if !pages.remove(&0).is_some_and(Slot::release) {
                        freed -= 1;
                    }
                }
                freed
            }
        }
    }

    /// Makes every page shared (no data is copied) and returns a copy of
    /// the file that shares them: what a snapshot keeps. An inline file is
    /// copied (at most [`INLINE_MAX`] bytes). Returns the copy and the pages
    /// it adds to the file system's usage (1 for an inline copy).
    pub fn share(&mut self) -> (FileData, u64) {
        self.make_shared();
        self.clone_shared()
    }

    /// Turns owned pages into shared ones, without copying any data.
    pub fn make_shared(&mut self) {
        if let FileData::Pages(pages) = self
            && pages.values().any(|s| matches!(s, Slot::Own(_)))
        {
            // Rebuilt from the sorted pairs in one pass (no page is copied).
            let old = std::mem::take(&mut **pages);
            **pages = old
                .into_iter()
                .map(|(k, s)| match s {
                    Slot::Own(p) => (k, Slot::Shared(Arc::new(Arc::new(p)))),
                    shared => (k, shared),
                })
                .collect();
        }
    }

    /// Another holder of a file whose pages are shared: owned pages (there
    /// should be none) and inline bytes are copied. Returns the copy and the
    /// pages it adds to the file system's usage.
    pub fn clone_shared(&self) -> (FileData, u64) {
        let added = match self {
            FileData::Empty => 0,
            FileData::Inline(_) => 1,
            FileData::Pages(m) => m.values().filter(|s| matches!(s, Slot::Own(_))).count() as u64,
        };
        (self.clone(), added)
    }

    /// A copy for another file system (a clone): it shares the pages' memory
    /// but counts them as its own. Returns the copy; it holds
    /// [`FileData::page_count`] pages of the other file system.
    pub fn import(&self) -> FileData {
        match self {
            FileData::Pages(m) => FileData::Pages(Box::new(
                m.iter()
                    .map(|(&k, s)| {
                        let s = match s {
                            Slot::Own(p) => Slot::Own(p.clone()),
                            Slot::Shared(a) => Slot::Shared(Arc::new((**a).clone())),
                        };
                        (k, s)
                    })
                    .collect(),
            )),
            other => other.clone(),
        }
    }

    /// Lets the contents go; returns the pages that gives back to the file
    /// system (shared pages a snapshot still holds stay counted).
    pub fn release(self) -> u64 {
        match self {
            FileData::Empty => 0,
            FileData::Inline(_) => 1,
            FileData::Pages(m) => m
                .into_values()
                .filter_map(|s| s.release().then_some(()))
                .count() as u64,
        }
    }

    /// The pages whose contents may differ between `self` and `other`, as
    /// runs `(first page, pages)` in order, adjacent pages merged; `None`
    /// past `max_runs` runs (the caller then treats the whole file as
    /// changed). A page both hold through the same shared slot is the same
    /// page (what a rollback restores shares the snapshot's pages, and a
    /// page the live file has not written since still shares them);
    /// anything else (an own page, a page only one side has, inline bytes)
    /// counts as changed, which may overstate, never miss. O(pages).
    pub fn changed_runs(&self, other: &FileData, max_runs: usize) -> Option<Vec<(u64, u64)>> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut push = |idx: u64| -> bool {
            match runs.last_mut() {
                Some((first, n)) if *first + *n == idx => *n += 1,
                _ => {
                    if runs.len() == max_runs {
                        return false;
                    }
                    runs.push((idx, 1));
                }
            }
            true
        };
        let same = |a: &Slot, b: &Slot| matches!((a, b), (Slot::Shared(x), Slot::Shared(y)) if Arc::ptr_eq(x, y));
        if let (FileData::Inline(_), _) | (_, FileData::Inline(_)) = (self, other) {
            // At most page 0 and whatever pages the other side has.
            let (a, b) = (self.map(), other.map());
            let mut pages: Vec<u64> = a.keys().chain(b.keys()).copied().collect();
            pages.push(0);
            pages.sort_unstable();
            pages.dedup();
            for idx in pages {
                if !push(idx) {
                    return None;
                }
            }
            return Some(runs);
        }
        let (mut a, mut b) = (self.map().iter().peekable(), other.map().iter().peekable());
        loop {
            let idx = match (a.peek(), b.peek()) {
                (None, None) => break,
                (Some(&(&i, _)), None) => {
                    a.next();
                    i
                }
                (None, Some(&(&j, _))) => {
                    b.next();
                    j
                }
                (Some(&(&i, x)), Some(&(&j, y))) => {
                    if i < j {
                        a.next();
                        i
                    } else if j < i {
                        b.next();
                        j
                    } else {
                        let unchanged = same(x, y);
                        a.next();
                        b.next();
                        if unchanged {
                            continue;
                        }
                        i
                    }
                }
            };
            if !push(idx) {
                return None;
            }
        }
        Some(runs)
    }

    /// Pages in `[first, last]` that are shared, each of which a write may copy.
    pub fn shared_pages(&self, first: u64, last: u64) -> u64 {
        match self {
            FileData::Pages(m) => m
                .range(first..=last)
                .filter(|(_, s)| matches!(s, Slot::Shared(_)))
                .count() as u64,
            _ => 0,
        }
    }

    /// Pages held by this copy alone (for a snapshot's size estimate).
    pub fn unique_pages(&self) -> u64 {
        match self {
            FileData::Empty => 0,
            FileData::Inline(_) => 1,
            FileData::Pages(m) => m
                .values()
                .filter(|s| match s {
                    Slot::Own(_) => true,
                    Slot::Shared(a) => Arc::strong_count(a) == 1,
                })
                .count() as u64,
        }
    }

    /// Calls `f` for up to `max` allocated pages from index `start` on, in
    /// order; returns the index to continue from, or `None` at the end. Lets
    /// a checkpoint copy a big file in slices, dropping the lock in between.
    /// An inline file shows as its page 0.
    pub fn pages_from(&self, start: u64, max: usize, mut f: impl FnMut(u64, &Page)) -> Option<u64> {
        if let FileData::Inline(v) = self {
            if start == 0 && max > 0 {
                let mut page = [0u8; PAGE_SIZE];
                page[..v.len()].copy_from_slice(v);
                f(0, &page);
            }
            return None;
        }
        let mut it = self.map().range(start..);
        for _ in 0..max {
            let (&k, p) = it.next()?;
            f(k, p.page());
        }
        it.next().map(|(&k, _)| k)
    }

    /// The first offset at or after `off` that is in data (`SEEK_DATA`), given the file size.
    pub fn seek_data(&self, off: u64, size: u64) -> Option<u64> {
        if off >= size {
            return None;
        }
        let idx = off / PAGE;
        let k = match self {
            FileData::Inline(_) => (idx == 0).then_some(0)?,
            _ => *self.map().range(idx..).next()?.0,
        };
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
        if self.is_inline() {
            if idx == 0 {
                idx = 1;
            }
        } else {
            for (&k, _) in self.map().range(idx..) {
                if k != idx {
                    break;
                }
                idx += 1;
            }
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

    fn contents(d: &FileData, len: usize) -> Vec<u8> {
        let mut buf = vec![0xa5u8; len];
        d.read(0, &mut buf);
        buf
    }

    #[test]
    fn small_file_is_inline_and_counts_as_page_zero() {
        let mut d = FileData::default();
        assert_eq!(d.missing_pages(0, 0), 1);
        assert_eq!(d.write(0, b"hello"), 1);
        assert!(d.is_inline());
        assert_eq!(d.page_count(), 1);
        assert_eq!(d.missing_pages(0, 2), 2);
        assert_eq!(&contents(&d, 8), b"hello\0\0\0");
        assert_eq!(d.seek_data(0, 5), Some(0));
        assert_eq!(d.seek_hole(0, 5), Some(5));
        assert_eq!(d.seek_hole(0, 2 * PAGE), Some(PAGE));
        assert_eq!(d.seek_data(PAGE, 2 * PAGE), None);
        let mut seen = Vec::new();
        assert_eq!(
            d.pages_from(0, 8, |i, p| seen.push((i, p[..6].to_vec()))),
            None
        );
        assert_eq!(seen, vec![(0, b"hello\0".to_vec())]);
    }

    #[test]
    fn overwrite_in_place_keeps_the_buffer() {
        let mut d = FileData::default();
        d.write(0, &[1u8; 64]);
        let FileData::Inline(v) = &d else {
            panic!("inline")
        };
        let before = v.as_ptr();
        assert_eq!(d.write(0, &[2u8; 64]), 0);
        let FileData::Inline(v) = &d else {
            panic!("inline")
        };
        assert_eq!(v.as_ptr(), before, "same-size overwrite reallocated");
        assert_eq!(contents(&d, 64), vec![2u8; 64]);
    }

    #[test]
    fn crossing_the_limit_moves_to_pages_and_back() {
        let mut d = FileData::default();
        let a: Vec<u8> = (0..INLINE_MAX).map(|i| (i % 251 + 1) as u8).collect();
        assert_eq!(d.write(0, &a), 1);
        assert!(d.is_inline());
        // One byte past the limit: page 0 becomes a real page, not a new one.
        assert_eq!(d.write(INLINE_MAX as u64, b"z"), 0);
        assert!(!d.is_inline());
        assert_eq!(d.page_count(), 1);
        let back = contents(&d, INLINE_MAX + 2);
        assert_eq!(&back[..INLINE_MAX], &a[..]);
        assert_eq!(&back[INLINE_MAX..], b"z\0");
        // Across a page boundary, then truncated back below the limit.
        assert_eq!(d.write(PAGE - 1, b"xy"), 1);
        assert_eq!(d.truncate(100), 1);
        assert!(d.is_inline());
        assert_eq!(d.page_count(), 1);
        assert_eq!(contents(&d, 101)[..100], a[..100]);
        assert_eq!(contents(&d, 101)[100], 0);
        // Truncated below, grown again: zeros, not the old bytes.
        assert_eq!(d.truncate(10), 0);
        let grown = contents(&d, 200);
        assert_eq!(&grown[..10], &a[..10]);
        assert!(grown[10..].iter().all(|&b| b == 0));
        assert_eq!(d.truncate(0), 1);
        assert_eq!(d.page_count(), 0);
        assert!(matches!(d, FileData::Empty));
    }

    #[test]
    fn a_whole_zero_padded_page_zero_stays_inline() {
        // What a checkpoint image writes back for a small file.
        let mut page = vec![0u8; PAGE_SIZE];
        page[..3].copy_from_slice(b"abc");
        let mut d = FileData::default();
        assert_eq!(d.write(0, &page), 1);
        assert!(d.is_inline());
        assert_eq!(&contents(&d, 4), b"abc\0");
        // Zeros over existing bytes still land.
        assert_eq!(d.write(1, &page[3..]), 0);
        assert_eq!(&contents(&d, 4), b"a\0\0\0");
        // A non-zero byte past the limit does not fit.
        page[INLINE_MAX] = 1;
        assert_eq!(d.write(0, &page), 0);
        assert!(!d.is_inline());
        assert_eq!(contents(&d, PAGE_SIZE), page);
    }

    #[test]
    fn changed_runs_are_the_pages_written_since_sharing() {
        let mut live = FileData::default();
        live.write(0, &[1u8; 10 * PAGE_SIZE]);
        let (snap, _) = live.share();
        assert_eq!(live.changed_runs(&snap, 8), Some(vec![]));
        live.write(2 * PAGE + 5, b"x");
        live.write(3 * PAGE, b"y");
        live.write(7 * PAGE, b"z");
        live.write(12 * PAGE, b"new page past the old end");
        assert_eq!(
            live.changed_runs(&snap, 8),
            Some(vec![(2, 2), (7, 1), (12, 1)])
        );
        assert_eq!(snap.changed_runs(&live, 8), live.changed_runs(&snap, 8));
        assert_eq!(live.changed_runs(&snap, 2), None);
        // A page only one side has: dropped by a punch.
        let (mut c, _) = snap.clone_shared();
        c.punch(4 * PAGE, PAGE);
        assert_eq!(c.changed_runs(&snap, 8), Some(vec![(4, 1)]));
        // Inline and empty files: page 0 and whatever the other side has.
        let mut small = FileData::default();
        small.write(0, b"abc");
        assert_eq!(small.changed_runs(&FileData::Empty, 8), Some(vec![(0, 1)]));
        assert_eq!(small.changed_runs(&snap, 8), Some(vec![(0, 10)]));
        assert_eq!(
            FileData::Empty.changed_runs(&FileData::Empty, 8),
            Some(vec![])
        );
    }

    #[test]
    fn punch_and_allocate_on_inline() {
        let mut d = FileData::default();
        d.write(0, &[7u8; 100]);
        assert_eq!(d.punch(10, 20), 0);
        let c = contents(&d, 100);
        assert!(c[10..30].iter().all(|&b| b == 0));
        assert!(c[..10].iter().chain(&c[30..]).all(|&b| b == 7));
        assert_eq!(d.allocate(0, 10), 0);
        assert!(d.is_inline());
        assert_eq!(d.allocate(0, PAGE + 1), 1);
        assert!(!d.is_inline());
        assert_eq!(d.page_count(), 2);
        assert_eq!(contents(&d, 100)[..10], [7u8; 10]);
        let mut e = FileData::default();
        assert_eq!(e.allocate(5, 5), 1);
        assert!(e.is_inline());
        assert_eq!(e.punch(0, PAGE), 1);
        assert_eq!(e.page_count(), 0);
        // Reads past the inline bytes and past page 0 are zeros.
        let mut f = FileData::default();
        f.write(3, b"q");
        let mut buf = [9u8; 4];
        f.read(2, &mut buf);
        assert_eq!(&buf, b"\0q\0\0");
        f.read(PAGE + 7, &mut buf);
        assert_eq!(buf, [0; 4]);
    }
}
