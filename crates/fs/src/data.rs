//! Sparse file contents.
//!
//! A file is a table of *chunks* keyed by chunk index, each chunk the slots
//! of 64 consecutive 4 KiB pages (256 KiB of data). Holes are absent pages
//! (and absent chunks), so a 1 TiB sparse file costs one empty table. A
//! page is exactly one 4096-byte allocation: a reference count in front of
//! it (`Arc`) pushed each page into the allocator's next size class and
//! cost 35 % more memory than the data (measured with `memfs bench memory`,
//! see docs/bench-issue2.md).
//!
//! Chunks are what a snapshot shares (`snapshot.rs`). Preserving a file
//! copies its chunk table, one `Arc` increment per chunk (O(pages / 64),
//! no page touched), and a rollback restores a file the same way. The
//! first write to a chunk that another holder shares gives the file a
//! chunk of its own: O(64) slot copies plus the copy of the page written
//! (see [`own_chunk`]). Before this, the table was one map of pages, and
//! sharing a file rebuilt it: O(pages) on the first write after a snapshot
//! (9 ms for 64 MiB through a mount, docs/snapshots.md).
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
//!
//! Locking: a chunk's slots sit behind a `RwLock`. Holders of `&mut
//! FileData` (the live file under its node's write lock) reach a chunk
//! only they hold without it (`Arc::get_mut`). Everything that reads
//! through `&FileData` takes the chunk's read lock, because a chunk may be
//! shared with a snapshot's copy, read with no node lock, while its live
//! holder (unsharing it) or a clone copying the file ([`FileData::import`])
//! turns the chunk's owned pages into shared ones ([`Chunk::share_copy`],
//! under the write lock; the pages do not move). Chunk locks are leaves:
//! nothing else is locked while one is held for writing.

use crate::types::PAGE_SIZE;
use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::sync::Arc;

pub(crate) type Page = [u8; PAGE_SIZE];

const PAGE: u64 = PAGE_SIZE as u64;

/// Pages per chunk, as a shift: 64 slots of 16 bytes are 1 KiB of table
/// per 256 KiB of data (0.4 %), and unsharing a chunk copies 64 slots.
const CHUNK_SHIFT: u32 = 6;
const CHUNK_PAGES: u64 = 1 << CHUNK_SHIFT;

/// What a hole reads as, for [`FileData::with_slices`].
static ZERO_PAGE: Page = [0; PAGE_SIZE];

/// Largest inline file body. Half a page: an inline buffer costs its length
/// plus a 24-byte header, so up to here it saves at least 2 KiB against a
/// page, while past it the saving shrinks and every append that crosses it
/// pays a copy into a page (the figures per size are in docs/engine.md).
pub const INLINE_MAX: usize = PAGE_SIZE / 2;

/// Chunk index and slot of page `idx`.
fn split(idx: u64) -> (u64, usize) {
    (idx >> CHUNK_SHIFT, (idx & (CHUNK_PAGES - 1)) as usize)
}

/// One page of a file: its own, or shared copy-on-write with snapshots
/// (`snapshot.rs`). Shared pages are the exception (only the first write
/// to a chunk a snapshot shares makes them), so an owned page stays one
/// bare 4096-byte allocation.
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

type SharedPage = Arc<Arc<Box<Page>>>;

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

/// A chunk's slots. A file of one or two pages keeps them in the chunk's
/// own allocation: a small file then costs the same number of allocations
/// as with one map of pages (each one more memory to touch when it goes).
pub(crate) enum Slots {
    /// Slots 0 and 1; the others are empty.
    Few([Option<Slot>; 2]),
    /// All 64 (1 KiB, an allocator size class of its own).
    All(Box<[Option<Slot>; CHUNK_PAGES as usize]>),
}

impl Default for Slots {
    fn default() -> Slots {
        Slots::Few([None, None])
    }
}

impl std::ops::Deref for Slots {
    type Target = [Option<Slot>];
    fn deref(&self) -> &[Option<Slot>] {
        match self {
            Slots::Few(a) => a,
            Slots::All(b) => &b[..],
        }
    }
}

impl std::ops::DerefMut for Slots {
    fn deref_mut(&mut self) -> &mut [Option<Slot>] {
        match self {
            Slots::Few(a) => a,
            Slots::All(b) => &mut b[..],
        }
    }
}

impl Slots {
    /// Makes room for slot `need - 1`.
    fn grow(&mut self, need: usize) {
        if need > 2
            && let Slots::Few(few) = self
        {
            // Built on the heap: 1 KiB never goes through the stack.
            let all: Vec<Option<Slot>> = (0..CHUNK_PAGES).map(|_| None).collect();
            let mut all: Box<[Option<Slot>; CHUNK_PAGES as usize]> =
                all.into_boxed_slice().try_into().ok().expect("64 slots");
            all[0] = few[0].take();
            all[1] = few[1].take();
            *self = Slots::All(all);
        }
    }

    /// The same shape, each slot mapped by `f`.
    fn map(&self, mut f: impl FnMut(&Option<Slot>) -> Option<Slot>) -> Slots {
        match self {
            Slots::Few(a) => Slots::Few([f(&a[0]), f(&a[1])]),
            Slots::All(b) => {
                let all: Vec<Option<Slot>> = b.iter().map(f).collect();
                Slots::All(all.into_boxed_slice().try_into().ok().expect("64 slots"))
            }
        }
    }
}

/// 64 consecutive pages of a file, shared whole between a file and the
/// snapshots' copies of it until one of them writes.
pub(crate) struct Chunk {
    slots: RwLock<Slots>,
}

impl Chunk {
    fn new(slots: Slots) -> Arc<Chunk> {
        Arc::new(Chunk {
            slots: RwLock::new(slots),
        })
    }

    /// Read access through a shared reference. Recursive: a reader may hold
    /// one chunk while it reads it again (a [`FileData::with_slices`]
    /// callback), and a fair read would queue behind a waiting unshare.
    fn read(&self) -> parking_lot::RwLockReadGuard<'_, Slots> {
        self.slots.read_recursive()
    }

    /// Turns the chunk's owned pages into shared ones (the page stays where
    /// it is: its `Box` moves into an `Arc`, no data is copied) and returns
    /// a copy of the slots made by `wrap`: a new holder of each page. Under
    /// the write lock: other holders of the chunk may be reading it.
    fn share_copy(&self, wrap: impl Fn(&SharedPage) -> Slot) -> Slots {
        let mut slots = self.slots.write();
        for s in slots.iter_mut() {
            if matches!(s, Some(Slot::Own(_))) {
                let Some(Slot::Own(p)) = s.take() else {
                    unreachable!("owned above")
                };
                *s = Some(Slot::Shared(Arc::new(Arc::new(p))));
            }
        }
        slots.map(|s| {
            s.as_ref().map(|s| match s {
                Slot::Shared(a) => wrap(a),
                Slot::Own(_) => unreachable!("shared above"),
            })
        })
    }
}

/// Pages present in `slots[a..b]` (clipped at the length).
fn present(slots: &[Option<Slot>], a: usize, b: usize) -> u64 {
    slots
        .get(a..b.min(slots.len()))
        .map_or(0, |s| s.iter().filter(|s| s.is_some()).count() as u64)
}

/// The chunk's slots, to write: a chunk that another holder shares (a
/// snapshot's copy of the file) is first replaced by the file's own, whose
/// slots share every page with the old one (O(64), no page copied; a write
/// then copies the one page it lands on, see [`own_page`]).
fn own_chunk(c: &mut Arc<Chunk>) -> &mut Slots {
    // No `Weak` to a chunk ever exists, so a count of 1 is ownership and
    // the common case pays one atomic operation (`get_mut` below), not two.
    // A count that drops to 1 meanwhile only costs a needless copy.
    if Arc::strong_count(c) > 1 {
        let copy = c.share_copy(|a| Slot::Shared(a.clone()));
        // The old chunk goes without `release`: every page it held is held
        // by the copy too, so it gives back nothing.
        *c = Chunk::new(copy);
    }
    Arc::get_mut(c).expect("own chunk").slots.get_mut()
}

/// Lets a chunk go; returns the pages that gives back to the file system.
/// Nothing while another holder shares the chunk: the last one gives back
/// its pages (`Arc::into_inner` picks exactly one of concurrent droppers).
fn release_chunk(c: Arc<Chunk>) -> u64 {
    Arc::into_inner(c).map_or(0, |c| {
        let mut slots = c.slots.into_inner();
        slots
            .iter_mut()
            .filter_map(|s| s.take()?.release().then_some(()))
            .count() as u64
    })
}

/// Makes the page in `slot` the file's own to write: a shared page that
/// nobody else holds any more is written in place, else it is copied.
/// With `whole` (the caller overwrites the entire page) the returned page
/// already holds those bytes, and a shared page is replaced by a page made
/// from them, not copied first and then overwritten.
/// Returns the page and the pages this adds to the file system's usage (1
/// for a copy of a page that a snapshot keeps).
fn own_page<'a>(
    slot: &'a mut Slot,
    whole: Option<&[u8]>,
    spare: &mut Spare,
) -> (&'a mut Page, u64) {
    let mut added = 0;
    let mut fresh = false;
    if let Slot::Shared(a) = slot {
        let unique = Arc::get_mut(a).and_then(Arc::get_mut).is_some();
        if !unique {
            fresh = true;
            let copy = spare.page_from(whole.unwrap_or(&a[..]));
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
    if let Some(w) = whole
        && !fresh
    {
        page.copy_from_slice(w);
    }
    (page, added)
}

/// A file's pages: chunks by chunk index. Never holds an empty chunk.
#[derive(Clone, Default)]
pub(crate) struct Table {
    /// Pages present, over all chunks: `st_blocks` reads it on every stat.
    pages: u64,
    /// Chunk 0, apart from the map: a file of 256 KiB or less then costs no
    /// map node.
    first: Option<Arc<Chunk>>,
    /// Chunks 1 and up.
    rest: BTreeMap<u64, Arc<Chunk>>,
}

impl Table {
    fn get(&self, ci: u64) -> Option<&Arc<Chunk>> {
        match ci {
            0 => self.first.as_ref(),
            _ => self.rest.get(&ci),
        }
    }

    fn get_mut(&mut self, ci: u64) -> Option<&mut Arc<Chunk>> {
        match ci {
            0 => self.first.as_mut(),
            _ => self.rest.get_mut(&ci),
        }
    }

    fn remove(&mut self, ci: u64) -> Option<Arc<Chunk>> {
        match ci {
            0 => self.first.take(),
            _ => self.rest.remove(&ci),
        }
    }

    /// Chunks `from..=to` that exist, in order.
    fn range(&self, from: u64, to: u64) -> impl Iterator<Item = (u64, &Arc<Chunk>)> {
        let first = self.first.as_ref().filter(|_| from == 0).map(|c| (0, c));
        let lo = from.max(1);
        let rest = (lo <= to).then(|| self.rest.range(lo..=to).map(|(&k, c)| (k, c)));
        first.into_iter().chain(rest.into_iter().flatten())
    }

    #[cfg(test)]
    fn chunk_count(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }

    /// Takes chunks `from..` out.
    fn split_off(&mut self, from: u64) -> Vec<Arc<Chunk>> {
        let mut out = Vec::new();
        if from == 0 {
            out.extend(self.first.take());
        }
        out.extend(self.rest.split_off(&from.max(1)).into_values());
        out
    }

    fn into_chunks(self) -> impl Iterator<Item = Arc<Chunk>> {
        self.first.into_iter().chain(self.rest.into_values())
    }

    /// Chunk `ci`'s slots to write, created if absent, covering slot
    /// `need - 1`.
    fn slots_mut(&mut self, ci: u64, need: usize) -> &mut Slots {
        let c = match ci {
            0 => self
                .first
                .get_or_insert_with(|| Chunk::new(Slots::default())),
            _ => self
                .rest
                .entry(ci)
                .or_insert_with(|| Chunk::new(Slots::default())),
        };
        let slots = own_chunk(c);
        slots.grow(need);
        slots
    }

    /// Drops the pages in `[first, end)`; returns the pages that gives back
    /// to the file system. Whole chunks go without being looked into when
    /// another holder shares them.
    fn drop_range(&mut self, first: u64, end: u64) -> u64 {
        if first >= end {
            return 0;
        }
        let (c0, _) = split(first);
        let (c1, _) = split(end - 1);
        let keys: Vec<u64> = self.range(c0, c1).map(|(k, _)| k).collect();
        let mut freed = 0;
        for ci in keys {
            let lo = ci << CHUNK_SHIFT;
            let a = (first.max(lo) - lo) as usize;
            let b = (end.min(lo + CHUNK_PAGES) - lo) as usize;
            let (n, all) = {
                let slots = self.get(ci).expect("key listed").read();
                (present(&slots, a, b), present(&slots, 0, slots.len()))
            };
            if n == 0 {
                continue;
            }
            self.pages -= n;
            if all == n {
                let c = self.remove(ci).expect("key listed");
                freed += release_chunk(c);
                continue;
            }
            let slots = own_chunk(self.get_mut(ci).expect("key listed"));
            let b = b.min(slots.len());
            for s in &mut slots[a..b] {
                if let Some(slot) = s.take()
                    && slot.release()
                {
                    freed += 1;
                }
            }
        }
        freed
    }

    /// Pages present in `[first, last]`.
    fn present_in(&self, first: u64, last: u64) -> u64 {
        let mut n = 0;
        self.each_chunk(first, last, |_, c, a, b| n += present(&c.read(), a, b));
        n
    }

    /// Calls `f(ci, chunk, a, b)` for each chunk holding pages of
    /// `[first, last]`, with the slots `[a, b)` that range covers in it.
    fn each_chunk<'a>(
        &'a self,
        first: u64,
        last: u64,
        mut f: impl FnMut(u64, &'a Arc<Chunk>, usize, usize),
    ) {
        let (c0, _) = split(first);
        let (c1, _) = split(last);
        for (ci, c) in self.range(c0, c1) {
            let lo = ci << CHUNK_SHIFT;
            let a = (first.max(lo) - lo) as usize;
            let b = (last.min(lo + CHUNK_PAGES - 1) - lo) as usize + 1;
            f(ci, c, a, b);
        }
    }

    /// Present page indices, in order (O(pages)).
    fn indices(&self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.pages as usize);
        for (ci, c) in self.range(0, u64::MAX) {
            for (s, slot) in c.read().iter().enumerate() {
                if slot.is_some() {
                    out.push((ci << CHUNK_SHIFT) + s as u64);
                }
            }
        }
        out
    }
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
    /// `Clone` shares the chunks (copy-on-write), it copies no page.
    Pages(Box<Table>),
}

fn zero_page() -> Box<Page> {
    // Zeroed straight from the allocator (calloc), never through the stack.
    Box::<Page>::try_from(vec![0u8; PAGE_SIZE].into_boxed_slice()).expect("one page")
}

fn page_from(chunk: &[u8]) -> Box<Page> {
    Box::<Page>::try_from(Box::<[u8]>::from(chunk)).expect("chunk is one page")
}

/// Zeroed pages made before a write takes its file's lock, for the pages
/// the write adds (copies of pages a snapshot shares, pages of a hole).
///
/// Why: the first touch of memory new to the process is a page fault that
/// zeroes it, and on a VM whose host takes back free guest memory a fault
/// on such memory costs 2.5-8 us per 4 KiB here (docs/snapshots.md, "The
/// random writes after a snapshot"). Taken under the file's lock, that stalled
/// every other writer of the file: during fio 4 KiB randwrite after a
/// snapshot the other worker slept on the lock and a quarter of the CPU
/// time went idle. Made here, the fault runs beside the other writers.
///
/// Invariant: every page held is zeroed and has been touched (faulted in).
#[derive(Default)]
pub(crate) struct Spare(Vec<Box<Page>>);

impl Spare {
    /// Most pages made ahead of one write: a bound on the memory a write
    /// holds beyond its reservation. Larger writes allocate under the lock
    /// as before (they reach the engine as pages it adopts, mostly).
    pub(crate) const MAX: u64 = 64;

    /// Makes `n` more pages (at most [`Spare::MAX`] held).
    pub(crate) fn fill(&mut self, n: u64) {
        let n = n.min(Self::MAX.saturating_sub(self.0.len() as u64));
        for _ in 0..n {
            let mut p = zero_page();
            // calloc leaves memory fresh from the kernel untouched (it is
            // zero already), which would move the fault back under the
            // lock: touch both ends (a 4 KiB block may straddle two pages).
            // `black_box`, because the compiler knows the bytes are zero.
            p[0] = std::hint::black_box(0);
            p[PAGE_SIZE - 1] = std::hint::black_box(0);
            self.0.push(p);
        }
    }

    pub(crate) fn len(&self) -> u64 {
        self.0.len() as u64
    }

    fn zero_page(&mut self) -> Box<Page> {
        self.0.pop().unwrap_or_else(zero_page)
    }

    fn page_from(&mut self, chunk: &[u8]) -> Box<Page> {
        match self.0.pop() {
            Some(mut p) => {
                p.copy_from_slice(chunk);
                p
            }
            None => page_from(chunk),
        }
    }
}

/// Length of `data` without its trailing zeros.
fn trimmed_len(data: &[u8]) -> usize {
    data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1)
}

/// Pushes `[from, to)` of `page` onto a gather list.
fn push_part<'a>(out: &mut Vec<&'a [u8]>, page: &'a [u8], from: usize, to: usize) {
    if from < to {
        out.push(&page[from..to]);
    }
}

impl FileData {
    /// Whether the file is held in pages (not empty, not inline).
    pub(crate) fn is_paged(&self) -> bool {
        matches!(self, FileData::Pages(_))
    }

    fn table(&self) -> Option<&Table> {
        match self {
            FileData::Pages(t) => Some(t),
            _ => None,
        }
    }

    /// Turns an inline or empty file into pages (the inline bytes become page 0).
    fn table_mut(&mut self) -> &mut Table {
        if !matches!(self, FileData::Pages(_)) {
            let mut t = Table::default();
            if let FileData::Inline(v) = self {
                let mut p = zero_page();
                p[..v.len()].copy_from_slice(v);
                t.slots_mut(0, 1)[0] = Some(Slot::Own(p));
                t.pages = 1;
            }
            *self = FileData::Pages(Box::new(t));
        }
        match self {
            FileData::Pages(t) => t,
            _ => unreachable!("just made pages"),
        }
    }

    /// Gives the table back once the last page is gone.
    fn shrink(&mut self) {
        if let FileData::Pages(t) = self
            && t.pages == 0
        {
            *self = FileData::Empty;
        }
    }

    /// Checks (debug builds) what a file of `size` bytes promises: no byte
    /// at or beyond `size` other than zeros (a later growth, which allocates
    /// nothing, would show them: docs/engine.md), and, with `count`, the
    /// table's page count equal to the pages present, in no empty chunk.
    /// Looks only at the pages from the one holding `size` on (the tail,
    /// plus what a keep-size fallocate put there), and with `count` at every
    /// chunk: so for the points where the size changes, not for each read.
    #[cfg(debug_assertions)]
    pub(crate) fn check(&self, size: u64, count: bool) {
        let t = match self {
            FileData::Empty => return,
            FileData::Inline(v) => {
                let from = (size as usize).min(v.len());
                debug_assert!(
                    v[from..].iter().all(|&b| b == 0),
                    "inline bytes at or beyond the size {size} are not zeros"
                );
                return;
            }
            FileData::Pages(t) => t,
        };
        let first = size / PAGE;
        for (ci, c) in t.range(first >> CHUNK_SHIFT, u64::MAX) {
            for (si, slot) in c.read().iter().enumerate() {
                let Some(slot) = slot else { continue };
                let pstart = ((ci << CHUNK_SHIFT) + si as u64) * PAGE;
                let from = size.saturating_sub(pstart).min(PAGE) as usize;
                debug_assert!(
                    slot.page()[from..].iter().all(|&b| b == 0),
                    "page at {pstart} holds bytes beyond the size {size} other than zeros"
                );
            }
        }
        if count {
            let mut present_n = 0;
            for (ci, c) in t.range(0, u64::MAX) {
                let n = present(&c.read(), 0, CHUNK_PAGES as usize);
                debug_assert!(n > 0, "empty chunk {ci} kept in a page table");
                present_n += n;
            }
            debug_assert_eq!(t.pages, present_n, "page count of a page table");
            debug_assert!(t.pages > 0, "an empty page table instead of Empty");
        }
    }

    /// Whether the file is stored inline (for tests and figures).
    pub fn is_inline(&self) -> bool {
        matches!(self, FileData::Inline(_))
    }

    /// Number of pages allocated. O(1).
    pub fn page_count(&self) -> u64 {
        match self {
            FileData::Empty => 0,
            FileData::Inline(_) => 1,
            FileData::Pages(t) => t.pages,
        }
    }

    /// Pages in `[first, last]` that are not allocated yet.
    pub fn missing_pages(&self, first: u64, last: u64) -> u64 {
        let present = match self {
            FileData::Empty => 0,
            FileData::Inline(_) => u64::from(first == 0),
            FileData::Pages(t) => t.present_in(first, last),
        };
        (last - first + 1) - present
    }

    /// What a write to `[first, last]` must reserve: the pages missing
    /// there plus those shared, each of which a write may copy (every page
    /// of a chunk another holder shares, and shared pages of the file's own
    /// chunks).
    pub fn pages_to_reserve(&self, first: u64, last: u64) -> u64 {
        let Some(t) = self.table() else {
            return self.missing_pages(first, last);
        };
        let mut present_n = 0;
        let mut shared = 0;
        t.each_chunk(first, last, |_, c, a, b| {
            let slots = c.read();
            let b = b.min(slots.len());
            let whole = Arc::strong_count(c) > 1;
            for s in slots[a.min(b)..b].iter().flatten() {
                present_n += 1;
                if whole || matches!(s, Slot::Shared(_)) {
                    shared += 1;
                }
            }
        });
        (last - first + 1) - present_n + shared
    }

    /// Copies `buf.len()` bytes starting at `off` into `buf`; holes read as zeros.
    /// The caller clamps the range to the file size.
    pub fn read(&self, off: u64, buf: &mut [u8]) {
        if buf.is_empty() {
            return;
        }
        let t = match self {
            FileData::Empty => {
                buf.fill(0);
                return;
            }
            FileData::Inline(v) => {
                let have = (v.len() as u64).saturating_sub(off).min(buf.len() as u64) as usize;
                if have > 0 {
                    buf[..have].copy_from_slice(&v[off as usize..off as usize + have]);
                }
                buf[have..].fill(0);
                return;
            }
            FileData::Pages(t) => t,
        };
        let end = off + buf.len() as u64;
        let (first, last) = (off / PAGE, (end - 1) / PAGE);
        // Walk present pages in order, zero-filling the gaps between them.
        let mut filled = off;
        t.each_chunk(first, last, |ci, c, a, b| {
            let slots = c.read();
            for s in a..b.min(slots.len()) {
                let Some(slot) = &slots[s] else { continue };
                let pstart = ((ci << CHUNK_SHIFT) + s as u64) * PAGE;
                if pstart > filled {
                    buf[(filled - off) as usize..(pstart - off) as usize].fill(0);
                    filled = pstart;
                }
                let from = filled - pstart;
                let to = (end - pstart).min(PAGE);
                let n = (to - from) as usize;
                let dst = (filled - off) as usize;
                buf[dst..dst + n].copy_from_slice(&slot.page()[from as usize..to as usize]);
                filled += n as u64;
            }
        });
        if filled < end {
            buf[(filled - off) as usize..].fill(0);
        }
    }

    /// Calls `f` with slices that cover `[off, off + len)` in order: parts
    /// of the file's pages, and of a static zero page for holes. The
    /// chunks' read locks are held meanwhile (the caller holds whatever
    /// keeps the file itself from changing). The caller clamps the range to
    /// the file size.
    pub fn with_slices<R>(&self, off: u64, len: usize, f: impl FnOnce(&[&[u8]]) -> R) -> R {
        if len == 0 {
            return f(&[]);
        }
        let end = off + len as u64;
        let first = off / PAGE;
        let last = (end - 1) / PAGE;
        let pages = (last - first + 1) as usize;
        // The part of page `idx` inside the range.
        let part = |idx: u64| {
            let pstart = idx * PAGE;
            let from = (off.max(pstart) - pstart) as usize;
            let to = (end.min(pstart + PAGE) - pstart) as usize;
            (from, to)
        };
        match self {
            FileData::Pages(t) => {
                let guards: Vec<(u64, parking_lot::RwLockReadGuard<'_, Slots>)> = t
                    .range(split(first).0, split(last).0)
                    .map(|(ci, c)| (ci, c.read()))
                    .collect();
                let mut out: Vec<&[u8]> = Vec::with_capacity(pages);
                let mut g = guards.iter().peekable();
                for idx in first..=last {
                    let (ci, si) = split(idx);
                    while g.next_if(|(k, _)| *k < ci).is_some() {}
                    let page: &[u8] = match g.peek().copied() {
                        Some((k, slots)) if *k == ci => match slots.get(si) {
                            Some(Some(slot)) => slot.page(),
                            _ => &ZERO_PAGE,
                        },
                        _ => &ZERO_PAGE,
                    };
                    let (from, to) = part(idx);
                    push_part(&mut out, page, from, to);
                }
                f(&out)
            }
            FileData::Inline(v) => {
                let mut out: Vec<&[u8]> = Vec::with_capacity(pages);
                for idx in first..=last {
                    let (from, to) = part(idx);
                    if idx == 0 {
                        let have = v.len().clamp(from, to);
                        push_part(&mut out, v, from, have);
                        push_part(&mut out, &ZERO_PAGE, have, to);
                    } else {
                        push_part(&mut out, &ZERO_PAGE, from, to);
                    }
                }
                f(&out)
            }
            FileData::Empty => {
                let mut out: Vec<&[u8]> = Vec::with_capacity(pages);
                for idx in first..=last {
                    let (from, to) = part(idx);
                    push_part(&mut out, &ZERO_PAGE, from, to);
                }
                f(&out)
            }
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
        self.write_spare(off, data, &mut Spare::default())
    }

    /// [`FileData::write`], taking the pages it adds from `spare` first.
    pub(crate) fn write_spare(&mut self, off: u64, data: &[u8], spare: &mut Spare) -> u64 {
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
        let t = self.table_mut();
        while !rest.is_empty() {
            // One chunk at a time: unshared (if need be) and grown once.
            let (ci, _) = split(pos / PAGE);
            let chunk_end = (ci + 1) << CHUNK_SHIFT;
            let span = ((chunk_end * PAGE - pos) as usize).min(rest.len());
            let (here, tail) = rest.split_at(span);
            let (_, last_si) = split((pos + span as u64 - 1) / PAGE);
            let slots = t.slots_mut(ci, last_si + 1);
            let mut new_pages = 0;
            for_each_page(pos, here, |si, in_page, bytes| {
                match &mut slots[si] {
                    Some(slot) => {
                        let whole = (bytes.len() == PAGE_SIZE).then_some(bytes);
                        let (page, added) = own_page(slot, whole, spare);
                        if whole.is_none() {
                            page[in_page..in_page + bytes.len()].copy_from_slice(bytes);
                        }
                        allocated += added;
                    }
                    s @ None => {
                        let page = if bytes.len() == PAGE_SIZE {
                            // A whole page: no need to zero it first.
                            spare.page_from(bytes)
                        } else {
                            let mut page = spare.zero_page();
                            page[in_page..in_page + bytes.len()].copy_from_slice(bytes);
                            page
                        };
                        *s = Some(Slot::Own(page));
                        allocated += 1;
                        new_pages += 1;
                    }
                }
            });
            t.pages += new_pages;
            pos += span as u64;
            rest = tail;
        }
        allocated
    }

    /// Writes the first `len` bytes held by `pages` (page `i` holds bytes
    /// `[i * PAGE_SIZE, (i + 1) * PAGE_SIZE)`, the caller has checked that
    /// each is present) at `off`. At a page-aligned offset every whole page
    /// is taken into the file as it is, with no copy: the caller read the
    /// bytes into these allocations for that (the FUSE adapter, which would
    /// otherwise copy each WRITE out of its request buffer). A page of the
    /// file's own that this replaces takes its place in `pages`, for the
    /// caller to reuse; one that snapshots share is left to them. Other
    /// writes copy, as [`FileData::write`]. Returns the pages allocated,
    /// as `write` does.
    pub fn write_pages(&mut self, off: u64, len: usize, pages: &mut [Option<Box<Page>>]) -> u64 {
        let whole = len / PAGE_SIZE;
        let small = !matches!(self, FileData::Pages(_)) && off + len as u64 <= PAGE;
        if !off.is_multiple_of(PAGE) || whole == 0 || small {
            // Unaligned (or kept inline): copied page by page.
            let mut allocated = 0;
            let mut pos = off;
            for (i, p) in pages.iter().enumerate().take(len.div_ceil(PAGE_SIZE)) {
                let p = p.as_deref().expect("the caller checked every page");
                let n = (len - i * PAGE_SIZE).min(PAGE_SIZE);
                allocated += self.write(pos, &p[..n]);
                pos += n as u64;
            }
            return allocated;
        }
        let mut allocated = 0;
        let first = off / PAGE;
        let t = self.table_mut();
        let mut i = 0;
        while i < whole {
            // One chunk at a time: unshared (if need be) and grown once.
            let (ci, si) = split(first + i as u64);
            let n = (CHUNK_PAGES as usize - si).min(whole - i);
            let slots = t.slots_mut(ci, si + n);
            let mut new_pages = 0;
            for (slot, p) in slots[si..si + n].iter_mut().zip(&mut pages[i..i + n]) {
                let page = p.take().expect("the caller checked every page");
                match slot.replace(Slot::Own(page)) {
                    None => {
                        allocated += 1;
                        new_pages += 1;
                    }
                    // The page this one replaces goes back to the caller to
                    // read the next write into: an overwrite then costs no
                    // allocation, no free (often on another thread) and no
                    // page fault on memory the allocator gave back.
                    Some(Slot::Own(old)) => *p = Some(old),
                    // A page a snapshot keeps stays counted: this one is added.
                    Some(old) => {
                        if !old.release() {
                            allocated += 1;
                        }
                    }
                }
            }
            t.pages += new_pages;
            i += n;
        }
        let tail = len - whole * PAGE_SIZE;
        if tail > 0 {
            let p = pages[whole]
                .as_deref()
                .expect("the caller checked every page");
            allocated += self.write(off + (whole * PAGE_SIZE) as u64, &p[..tail]);
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
        if first_whole < end_whole
            && let FileData::Pages(t) = self
        {
            freed += t.drop_range(first_whole, end_whole) as i64;
            self.shrink();
        }
        // Partial pages at either edge.
        let head_page = off / PAGE;
        if !off.is_multiple_of(PAGE) || end < (head_page + 1) * PAGE {
            freed -= self.zero_in_page(head_page, off, end) as i64;
        }
        let tail_page = end / PAGE;
        if !end.is_multiple_of(PAGE) && tail_page != head_page {
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
        let FileData::Pages(t) = self else { return 0 };
        let (ci, si) = split(idx);
        let Some(c) = t.get_mut(ci) else {
            return 0;
        };
        {
            let slots = c.read();
            match slots.get(si) {
                Some(Some(slot)) if slot.page()[a..b].iter().any(|&x| x != 0) => {}
                // Absent, or nothing to change: no copy of a shared page.
                _ => return 0,
            }
        }
        let slot = own_chunk(c)[si].as_mut().expect("present above");
        let (page, added) = own_page(slot, None, &mut Spare::default());
        page[a..b].fill(0);
        added
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
                let t = self.table_mut();
                let mut allocated = 0;
                let (c0, _) = split(first);
                let (c1, _) = split(last);
                for ci in c0..=c1 {
                    let lo = ci << CHUNK_SHIFT;
                    let a = (first.max(lo) - lo) as usize;
                    let b = (last.min(lo + CHUNK_PAGES - 1) - lo) as usize + 1;
                    // A chunk already full there is left alone (not unshared).
                    if let Some(c) = t.get(ci)
                        && present(&c.read(), a, b) == (b - a) as u64
                    {
                        continue;
                    }
                    let slots = t.slots_mut(ci, b);
                    let mut n = 0;
                    for s in &mut slots[a..b] {
                        if s.is_none() {
                            *s = Some(Slot::Own(zero_page()));
                            n += 1;
                        }
                    }
                    t.pages += n;
                    allocated += n;
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
            FileData::Pages(t) => {
                let keep = size.div_ceil(PAGE);
                let mut freed = 0i64;
                // Whole chunks past the end in one split (a truncate to 0 of
                // a big file is O(chunks)), then the boundary chunk's tail.
                let (kc, ks) = split(keep);
                let first_whole = if ks == 0 { kc } else { kc + 1 };
                for c in t.split_off(first_whole) {
                    t.pages -= present(&c.read(), 0, CHUNK_PAGES as usize);
                    freed += release_chunk(c) as i64;
                }
                if ks != 0 {
                    freed += t.drop_range(keep, first_whole << CHUNK_SHIFT) as i64;
                }
                if !size.is_multiple_of(PAGE) {
                    let idx = size / PAGE;
                    freed -= self.zero_in_page(idx, size, (idx + 1) * PAGE) as i64;
                }
                self.shrink();
                // Cut down to a small file: back to inline, giving the page back.
                if let FileData::Pages(t) = self
                    && size <= INLINE_MAX as u64
                    && t.pages == 1
                    && let Some(c) = t.get(0)
                {
                    let bytes = match c.read().first() {
                        Some(Some(p)) => Some(p.page()[..size as usize].to_vec()),
                        _ => None,
                    };
                    if let Some(bytes) = bytes {
                        let FileData::Pages(mut t) =
                            std::mem::replace(self, FileData::Inline(Box::new(bytes)))
                        else {
                            unreachable!("pages above")
                        };
                        // The inline buffer counts as page 0 from now on.
                        let c = t.remove(0).expect("chunk 0 above");
                        if release_chunk(c) == 0 {
                            freed -= 1;
                        }
                    }
                }
                freed
            }
        }
    }

    /// A copy of the file that shares its pages: what a snapshot keeps.
    /// O(chunks): the chunk table is copied, no page is touched (a chunk is
    /// unshared by the first write to it, [`own_chunk`]). An inline file is
    /// copied (at most [`INLINE_MAX`] bytes). Returns the copy and the pages
    /// it adds to the file system's usage (1 for an inline copy).
    pub fn share(&mut self) -> (FileData, u64) {
        self.clone_shared()
    }

    /// [`FileData::share`] through a shared reference (a rollback restoring
    /// a snapshot's copy).
    pub fn clone_shared(&self) -> (FileData, u64) {
        let added = match self {
            FileData::Inline(_) => 1,
            _ => 0,
        };
        (self.clone(), added)
    }

    /// A copy for another file system (a clone): it shares the pages' memory
    /// but counts them as its own. Returns the copy; it holds
    /// [`FileData::page_count`] pages of the other file system. O(pages):
    /// the copy's chunks are its own, each page under an outer `Arc` of the
    /// clone's.
    pub fn import(&self) -> FileData {
        match self {
            FileData::Pages(t) => {
                let import = |c: &Arc<Chunk>| {
                    Chunk::new(c.share_copy(|a| Slot::Shared(Arc::new((**a).clone()))))
                };
                FileData::Pages(Box::new(Table {
                    pages: t.pages,
                    first: t.first.as_ref().map(import),
                    rest: t.rest.iter().map(|(&ci, c)| (ci, import(c))).collect(),
                }))
            }
            other => other.clone(),
        }
    }

    /// Lets the contents go; returns the pages that gives back to the file
    /// system (pages a snapshot still holds stay counted).
    pub fn release(self) -> u64 {
        match self {
            FileData::Empty => 0,
            FileData::Inline(_) => 1,
            FileData::Pages(t) => t.into_chunks().map(release_chunk).sum(),
        }
    }

    /// The pages whose contents may differ between `self` and `other`, as
    /// runs `(first page, pages)` in order, adjacent pages merged; `None`
    /// past `max_runs` runs (the caller then treats the whole file as
    /// changed). A chunk or a page both hold through the same `Arc` is the
    /// same (what a rollback restores shares the snapshot's chunks, and a
    /// chunk or page the live file has not written since still shares
    /// them); anything else (a page only one side has, pages of different
    /// chunks not shared, inline bytes) counts as changed, which may
    /// overstate, never miss. O(chunks + pages of chunks not shared).
    pub fn changed_runs(&self, other: &FileData, max_runs: usize) -> Option<Vec<(u64, u64)>> {
        let mut runs = Runs {
            runs: Vec::new(),
            max: max_runs,
        };
        if let (FileData::Inline(_), _) | (_, FileData::Inline(_)) = (self, other) {
            // At most page 0 and whatever pages the other side has.
            let mut pages: Vec<u64> = [self, other]
                .iter()
                .filter_map(|d| d.table())
                .flat_map(Table::indices)
                .collect();
            pages.push(0);
            pages.sort_unstable();
            pages.dedup();
            for idx in pages {
                if !runs.push(idx) {
                    return None;
                }
            }
            return Some(runs.runs);
        }
        fn chunks(d: &FileData) -> impl Iterator<Item = (u64, &Arc<Chunk>)> {
            d.table().into_iter().flat_map(|t| t.range(0, u64::MAX))
        }
        let (mut a, mut b) = (chunks(self).peekable(), chunks(other).peekable());
        loop {
            let (ci, x, y) = match (a.peek(), b.peek()) {
                (None, None) => break,
                (Some(&(i, x)), Some(&(j, _))) if i < j => {
                    a.next();
                    (i, Some(x), None)
                }
                (Some(&(i, x)), None) => {
                    a.next();
                    (i, Some(x), None)
                }
                (Some(&(i, _)), Some(&(j, y))) if j < i => {
                    b.next();
                    (j, None, Some(y))
                }
                (None, Some(&(j, y))) => {
                    b.next();
                    (j, None, Some(y))
                }
                (Some(&(i, x)), Some(&(_, y))) => {
                    a.next();
                    b.next();
                    if Arc::ptr_eq(x, y) {
                        continue;
                    }
                    (i, Some(x), Some(y))
                }
            };
            if !changed_slots(ci, x, y, &mut runs) {
                return None;
            }
        }
        Some(runs.runs)
    }

    /// Pages held by this copy alone (for a snapshot's size estimate): none
    /// of a chunk another holder shares.
    pub fn unique_pages(&self) -> u64 {
        match self {
            FileData::Empty => 0,
            FileData::Inline(_) => 1,
            FileData::Pages(t) => t
                .range(0, u64::MAX)
                .filter(|(_, c)| Arc::strong_count(c) == 1)
                .map(|(_, c)| {
                    c.read()
                        .iter()
                        .flatten()
                        .filter(|s| match s {
                            Slot::Own(_) => true,
                            Slot::Shared(a) => Arc::strong_count(a) == 1,
                        })
                        .count() as u64
                })
                .sum(),
        }
    }

    /// Calls `f` for up to `max` allocated pages from index `start` on, in
    /// order; returns the index to continue from, or `None` at the end. Lets
    /// a checkpoint copy a big file in slices, dropping the lock in between.
    /// An inline file shows as its page 0.
    pub fn pages_from(&self, start: u64, max: usize, mut f: impl FnMut(u64, &Page)) -> Option<u64> {
        match self {
            FileData::Empty => None,
            FileData::Inline(v) => {
                if start == 0 && max > 0 {
                    let mut page = [0u8; PAGE_SIZE];
                    page[..v.len()].copy_from_slice(v);
                    f(0, &page);
                }
                None
            }
            FileData::Pages(t) => {
                let (c0, s0) = split(start);
                let mut left = max;
                for (ci, c) in t.range(c0, u64::MAX) {
                    let slots = c.read();
                    let from = if ci == c0 { s0 } else { 0 };
                    for (s, slot) in slots.iter().enumerate().skip(from) {
                        if let Some(slot) = slot {
                            let idx = (ci << CHUNK_SHIFT) + s as u64;
                            if left == 0 {
                                return Some(idx);
                            }
                            f(idx, slot.page());
                            left -= 1;
                        }
                    }
                }
                None
            }
        }
    }

    /// The first offset at or after `off` that is in data (`SEEK_DATA`), given the file size.
    pub fn seek_data(&self, off: u64, size: u64) -> Option<u64> {
        if off >= size {
            return None;
        }
        let idx = off / PAGE;
        let k = match self {
            FileData::Empty => return None,
            FileData::Inline(_) => (idx == 0).then_some(0)?,
            FileData::Pages(t) => {
                let (c0, s0) = split(idx);
                t.range(c0, u64::MAX).find_map(|(ci, c)| {
                    let from = if ci == c0 { s0 } else { 0 };
                    let s = c.read().iter().skip(from).position(Option::is_some)?;
                    Some((ci << CHUNK_SHIFT) + (from + s) as u64)
                })?
            }
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
        match self {
            FileData::Empty => {}
            FileData::Inline(_) => {
                if idx == 0 {
                    idx = 1;
                }
            }
            FileData::Pages(t) => loop {
                let (ci, si) = split(idx);
                let Some(c) = t.get(ci) else { break };
                let slots = c.read();
                let run = slots.iter().skip(si).take_while(|s| s.is_some()).count();
                idx += run as u64;
                if si + run < CHUNK_PAGES as usize {
                    break;
                }
            },
        }
        Some((idx * PAGE).max(off).min(size))
    }
}

/// Calls `f(slot, offset in page, bytes)` for each page `data` (written at
/// `pos`, within one chunk) touches.
fn for_each_page(mut pos: u64, mut data: &[u8], mut f: impl FnMut(usize, usize, &[u8])) {
    while !data.is_empty() {
        let (_, si) = split(pos / PAGE);
        let in_page = (pos % PAGE) as usize;
        let n = (PAGE_SIZE - in_page).min(data.len());
        let (here, rest) = data.split_at(n);
        f(si, in_page, here);
        pos += n as u64;
        data = rest;
    }
}

/// Page runs `(first page, pages)` in order, adjacent pages merged, at most
/// `max` of them ([`FileData::changed_runs`]).
struct Runs {
    runs: Vec<(u64, u64)>,
    max: usize,
}

impl Runs {
    /// Adds page `idx` (after those added so far); false past `max` runs.
    fn push(&mut self, idx: u64) -> bool {
        match self.runs.last_mut() {
            Some((first, n)) if *first + *n == idx => *n += 1,
            _ => {
                if self.runs.len() == self.max {
                    return false;
                }
                self.runs.push((idx, 1));
            }
        }
        true
    }
}

/// Adds to `runs` the pages of chunk `ci` that may differ between its two
/// versions `x` and `y` (`None`: that side has no such chunk); false past
/// the bound on runs.
fn changed_slots(ci: u64, x: Option<&Arc<Chunk>>, y: Option<&Arc<Chunk>>, runs: &mut Runs) -> bool {
    let same = |x: &Option<Slot>, y: &Option<Slot>| match (x, y) {
        (None, None) => true,
        (Some(Slot::Shared(x)), Some(Slot::Shared(y))) => Arc::ptr_eq(x, y),
        _ => false,
    };
    let gx = x.map(|c| c.read());
    let gy = y.map(|c| c.read());
    let none: &[Option<Slot>] = &[];
    let sx: &[Option<Slot>] = gx.as_deref().map_or(none, |s| &s[..]);
    let sy: &[Option<Slot>] = gy.as_deref().map_or(none, |s| &s[..]);
    for s in 0..sx.len().max(sy.len()) {
        let (p, q) = (sx.get(s).unwrap_or(&None), sy.get(s).unwrap_or(&None));
        if !same(p, q) && !runs.push((ci << CHUNK_SHIFT) + s as u64) {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(debug_assertions)]
    #[test]
    fn the_check_passes_zeros_beyond_the_size_and_counts() {
        let mut d = FileData::default();
        d.write(3 * PAGE + 10, b"x");
        d.allocate(9 * PAGE, PAGE);
        d.check(3 * PAGE + 11, true);
        d.truncate(3 * PAGE + 10);
        d.check(3 * PAGE + 10, true);
        let mut small = FileData::default();
        small.write(0, b"abc");
        small.check(3, true);
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "beyond the size")]
    fn the_check_finds_a_byte_beyond_the_size() {
        let mut d = FileData::default();
        d.write(3 * PAGE + 10, b"x");
        d.check(3 * PAGE + 10, false);
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "beyond the size")]
    fn the_check_finds_an_inline_byte_beyond_the_size() {
        let mut d = FileData::default();
        d.write(0, b"abc");
        d.check(2, false);
    }

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

    fn chunk_of(d: &FileData, ci: u64) -> Arc<Chunk> {
        match d {
            FileData::Pages(t) => t.get(ci).expect("chunk").clone(),
            _ => panic!("not pages"),
        }
    }

    fn page_ptr(d: &FileData, idx: u64) -> *const u8 {
        let (ci, si) = split(idx);
        let c = chunk_of(d, ci);
        let slots = c.read();
        slots[si].as_ref().expect("present").page().as_ptr()
    }

    #[test]
    fn first_write_to_a_shared_chunk_copies_one_page_and_shares_the_rest() {
        let mut live = FileData::default();
        let n = 3 * CHUNK_PAGES;
        live.write(0, &vec![3u8; n as usize * PAGE_SIZE]);
        let (snap, added) = live.share();
        assert_eq!(added, 0);
        for ci in 0..3 {
            assert!(Arc::ptr_eq(&chunk_of(&live, ci), &chunk_of(&snap, ci)));
        }
        let before: Vec<_> = (0..n).map(|i| page_ptr(&snap, i)).collect();
        let w = CHUNK_PAGES + 6;
        assert_eq!(live.write(w * PAGE + 1, b"new"), 1, "one page copied");
        assert!(Arc::ptr_eq(&chunk_of(&live, 0), &chunk_of(&snap, 0)));
        assert!(Arc::ptr_eq(&chunk_of(&live, 2), &chunk_of(&snap, 2)));
        assert!(!Arc::ptr_eq(&chunk_of(&live, 1), &chunk_of(&snap, 1)));
        for i in 0..n {
            assert_eq!(page_ptr(&snap, i), before[i as usize]);
            assert_eq!(page_ptr(&live, i) == before[i as usize], i != w, "page {i}");
        }
        assert_eq!(
            &contents(&snap, (w as usize + 1) * PAGE_SIZE)[w as usize * PAGE_SIZE..][..4],
            &[3u8; 4]
        );
        assert_eq!(
            &contents(&live, (w as usize + 1) * PAGE_SIZE)[w as usize * PAGE_SIZE..][..4],
            b"\x03new"
        );
        assert_eq!(live.changed_runs(&snap, 8), Some(vec![(w, 1)]));
        assert_eq!(snap.unique_pages(), 1);
        assert_eq!(live.page_count(), n);
        // Each side gives back what only it holds, the last one the rest.
        assert_eq!(live.release(), 1);
        assert_eq!(snap.release(), n);
    }

    #[test]
    fn a_whole_page_written_over_a_shared_page_replaces_it() {
        let mut live = FileData::default();
        live.write(0, &vec![3u8; 2 * PAGE_SIZE]);
        let (snap, _) = live.share();
        let old = page_ptr(&snap, 1);
        // Shared with the snapshot: a new page made from the written bytes.
        assert_eq!(live.write(PAGE, &[7u8; PAGE_SIZE]), 1);
        assert_eq!(page_ptr(&snap, 1), old);
        assert_eq!(
            contents(&snap, 2 * PAGE_SIZE)[PAGE_SIZE..],
            [3u8; PAGE_SIZE]
        );
        assert_eq!(
            contents(&live, 2 * PAGE_SIZE)[PAGE_SIZE..],
            [7u8; PAGE_SIZE]
        );
        // The snapshot gone, page 0 is still a shared slot held only here:
        // written in place, nothing added.
        assert_eq!(snap.release(), 1);
        let p0 = page_ptr(&live, 0);
        assert_eq!(live.write(0, &[9u8; PAGE_SIZE]), 0);
        assert_eq!(page_ptr(&live, 0), p0);
        assert_eq!(contents(&live, PAGE_SIZE), [9u8; PAGE_SIZE]);
    }

    #[test]
    fn a_write_takes_its_new_pages_from_the_spare() {
        let mut live = FileData::default();
        live.write(0, &vec![3u8; 2 * PAGE_SIZE]);
        let (snap, _) = live.share();
        let mut spare = Spare::default();
        spare.fill(3);
        assert_eq!(spare.len(), 3);
        assert!(spare.0.iter().all(|p| p.iter().all(|&b| b == 0)));
        let made: Vec<*const u8> = spare.0.iter().map(|p| p.as_ptr()).collect();
        // A partial write over a shared page (a copy), a whole page over a
        // shared page, and a partial write into a hole: three pages added,
        // each one of the spare's, in the order they are taken.
        assert_eq!(live.write_spare(10, b"abc", &mut spare), 1);
        assert_eq!(live.write_spare(PAGE, &[7u8; PAGE_SIZE], &mut spare), 1);
        assert_eq!(live.write_spare(5 * PAGE + 1, b"z", &mut spare), 1);
        assert_eq!(spare.len(), 0);
        assert_eq!(page_ptr(&live, 0), made[2]);
        assert_eq!(page_ptr(&live, 1), made[1]);
        assert_eq!(page_ptr(&live, 5), made[0]);
        let mut want = vec![3u8; 2 * PAGE_SIZE];
        want[10..13].copy_from_slice(b"abc");
        want[PAGE_SIZE..].fill(7);
        want.resize(6 * PAGE_SIZE, 0);
        want[5 * PAGE_SIZE + 1] = b'z';
        assert_eq!(contents(&live, 6 * PAGE_SIZE), want);
        // The snapshot keeps what it had.
        assert_eq!(contents(&snap, 2 * PAGE_SIZE), vec![3u8; 2 * PAGE_SIZE]);
        // An empty spare allocates as before; it never holds more than MAX.
        assert_eq!(live.write_spare(7 * PAGE, b"w", &mut spare), 1);
        spare.fill(Spare::MAX + 5);
        assert_eq!(spare.len(), Spare::MAX);
    }

    #[test]
    fn slots_grow_with_the_pages() {
        let slots = |d: &FileData, ci| chunk_of(d, ci).read().len();
        let mut d = FileData::default();
        d.write(0, &[1u8; PAGE_SIZE]);
        assert_eq!(slots(&d, 0), 2, "in the chunk itself");
        d.write(PAGE, b"x");
        assert_eq!(slots(&d, 0), 2);
        d.write(2 * PAGE, b"x");
        assert_eq!(slots(&d, 0), 64);
        d.write((CHUNK_PAGES + 63) * PAGE, b"y");
        assert_eq!(slots(&d, 1), 64);
        assert_eq!(d.page_count(), 4);
        // Punching a chunk's only page drops the chunk.
        assert_eq!(d.punch((CHUNK_PAGES + 63) * PAGE, PAGE), 1);
        assert!(matches!(&d, FileData::Pages(t) if t.chunk_count() == 1));
        assert_eq!(d.seek_data(PAGE * 3, PAGE * 200), None);
    }

    #[test]
    fn pages_from_crosses_chunks() {
        let mut d = FileData::default();
        for idx in [1, 63, 64, 130, 1000] {
            d.write(idx * PAGE, b"p");
        }
        let mut seen = Vec::new();
        assert_eq!(d.pages_from(0, 2, |i, _| seen.push(i)), Some(64));
        assert_eq!(d.pages_from(64, 2, |i, _| seen.push(i)), Some(1000));
        assert_eq!(d.pages_from(1000, 5, |i, _| seen.push(i)), None);
        assert_eq!(seen, vec![1, 63, 64, 130, 1000]);
        assert_eq!(d.pages_from(2, 0, |_, _| panic!("none asked")), Some(63));
        assert_eq!(d.missing_pages(0, 127), 125);
        let (s, _) = d.share();
        assert_eq!(d.pages_to_reserve(60, 70), 11 - 2 + 2);
        assert_eq!(d.pages_to_reserve(0, 2000), 2001);
        drop(s);
        assert_eq!(d.pages_to_reserve(0, 2000), 2001 - 5);
        assert_eq!(d.pages_to_reserve(60, 70), 11 - 2);
    }
}
