//! Directory contents.
//!
//! Entries live in a slot store (chunks of slots, see [`Slots`]); a hash
//! table maps names to slot indexes. Lookup, insert and remove are O(1) on
//! average. An entry never moves while it exists, so the readdir offset of an
//! entry is its slot index (plus 3, after `.` and `..`): an entry present for
//! a whole listing is returned exactly once however the directory changes
//! meanwhile, and a listing resumed from any offset it returned continues
//! where it left off. Freed slots are reused by later
//! inserts (an entry created during a listing may or may not be seen, as POSIX
//! allows).

use std::hash::BuildHasher;
use std::sync::LazyLock;

use hashbrown::HashTable;

use crate::types::FileType;

static HASHER: LazyLock<hashbrown::DefaultHashBuilder> = LazyLock::new(Default::default);

fn hash(name: &[u8]) -> u64 {
    HASHER.hash_one(name)
}

/// Names up to this long live in the slot itself. Most names are short, so
/// most entries cost one 32-byte slot and no allocation of their own: the
/// name used to be a separate `Box<[u8]>` (16 bytes in the slot plus an
/// allocation), which cost memory per file and an allocation per create and a
/// free per unlink.
const INLINE_NAME: usize = 21;

/// A name with the entry's type tucked into the same 24 bytes.
#[derive(Clone)]
enum Name {
    Inline {
        kind: FileType,
        len: u8,
        bytes: [u8; INLINE_NAME],
    },
    Heap {
        kind: FileType,
        name: Box<[u8]>,
    },
}

#[derive(Clone)]
struct Slot {
    ino: u64,
    /// Empty for a free slot (names are never empty).
    name: Name,
}

impl Slot {
    const FREE: Slot = Slot {
        ino: 0,
        name: Name::Inline {
            kind: FileType::RegularFile,
            len: 0,
            bytes: [0; INLINE_NAME],
        },
    };

    fn new(name: &[u8], ino: u64, kind: FileType) -> Slot {
        let name = if name.len() <= INLINE_NAME {
            let mut bytes = [0; INLINE_NAME];
            bytes[..name.len()].copy_from_slice(name);
            Name::Inline {
                kind,
                len: name.len() as u8,
                bytes,
            }
        } else {
            Name::Heap {
                kind,
                name: name.into(),
            }
        };
        Slot { ino, name }
    }

    fn name(&self) -> &[u8] {
        match &self.name {
            Name::Inline { len, bytes, .. } => &bytes[..*len as usize],
            Name::Heap { name, .. } => name,
        }
    }

    fn kind(&self) -> FileType {
        match self.name {
            Name::Inline { kind, .. } | Name::Heap { kind, .. } => kind,
        }
    }

    fn set_kind(&mut self, k: FileType) {
        match &mut self.name {
            Name::Inline { kind, .. } | Name::Heap { kind, .. } => *kind = k,
        }
    }

    fn is_free(&self) -> bool {
        matches!(self.name, Name::Inline { len: 0, .. })
    }

    fn entry(&self) -> Entry<'_> {
        Entry {
            name: self.name(),
            ino: self.ino,
            kind: self.kind(),
        }
    }
}

/// One directory entry as readdir sees it.
pub(crate) struct Entry<'a> {
    pub name: &'a [u8],
    pub ino: u64,
    pub kind: FileType,
}

/// Slots per chunk: 1024 slots of 32 bytes, one 32 KiB allocation (a size
/// class of its own in mimalloc, so no rounding up).
const CHUNK_SHIFT: u32 = 10;
const CHUNK: usize = 1 << CHUNK_SHIFT;

/// The slots of a directory, by index, in chunks of [`CHUNK`] slots: every
/// chunk but the last is full. The first chunk grows by doubling, so a small
/// directory costs what a plain vector would; a big one adds whole chunks and
/// never copies or frees its slots while it grows.
///
/// One vector doubling to the end left up to half of it unused (100
/// directories of 10,000 entries: 16,384 slots each, 39 % unused), and the
/// allocator keeps each freed old vector resident for a while (its purge
/// delay is a second); growing by a quarter left less unused but freed more
/// (docs/engine.md). Chunks leave less than one chunk unused and free
/// nothing. The price is one more indexed load per slot access (the chunk
/// table, a few words, stays in cache).
#[derive(Clone, Default)]
struct Slots {
    chunks: Vec<Vec<Slot>>,
}

impl Slots {
    fn len(&self) -> usize {
        self.chunks
            .last()
            .map_or(0, |last| (self.chunks.len() - 1) * CHUNK + last.len())
    }

    fn get(&self, i: usize) -> &Slot {
        &self.chunks[i >> CHUNK_SHIFT][i & (CHUNK - 1)]
    }

    fn get_mut(&mut self, i: usize) -> &mut Slot {
        &mut self.chunks[i >> CHUNK_SHIFT][i & (CHUNK - 1)]
    }

    /// Appends a slot; returns its index.
    fn push(&mut self, slot: Slot) -> usize {
        let i = self.len();
        match self.chunks.last_mut() {
            Some(last) if last.len() < CHUNK => {
                if last.len() == last.capacity() {
                    // Doubling, but never past a chunk (a cloned chunk's
                    // capacity is its length, from which `Vec` would
                    // overshoot).
                    let want = (last.capacity() * 2).clamp(4, CHUNK);
                    last.reserve_exact(want - last.len());
                }
                last.push(slot);
            }
            _ => {
                let mut chunk = Vec::with_capacity(if self.chunks.is_empty() { 4 } else { CHUNK });
                chunk.push(slot);
                self.chunks.push(chunk);
            }
        }
        i
    }

    /// Drops the free slots at the end. An emptied last chunk is kept while
    /// the chunk before it stays full, so that one entry created and removed
    /// again and again at a chunk's edge does not allocate every time.
    fn trim(&mut self) {
        while let Some(last) = self.chunks.last_mut() {
            if last.last().is_some_and(Slot::is_free) {
                last.pop();
            } else if last.is_empty()
                && self.chunks.len() > 1
                && self.chunks[self.chunks.len() - 2]
                    .last()
                    .is_some_and(Slot::is_free)
            {
                self.chunks.pop();
            } else {
                break;
            }
        }
    }

    /// The slots from index `start` on, with their indexes.
    fn iter_from(&self, start: usize) -> impl Iterator<Item = (usize, &Slot)> {
        let first = start >> CHUNK_SHIFT;
        self.chunks
            .iter()
            .enumerate()
            .skip(first)
            .flat_map(move |(c, chunk)| {
                let skip = if c == first { start & (CHUNK - 1) } else { 0 };
                chunk
                    .iter()
                    .enumerate()
                    .skip(skip)
                    .map(move |(j, s)| ((c << CHUNK_SHIFT) + j, s))
            })
    }
}

#[derive(Clone, Default)]
pub(crate) struct Dir {
    slots: Slots,
    index: HashTable<u32>,
    free: Vec<u32>,
    /// Inode number of `..`.
    pub parent: u64,
    /// Entries naming directories: only to check the directory's link count
    /// (2 + subdirectories), which debug builds alone do; release builds
    /// would pay the field in every directory for nothing.
    #[cfg(debug_assertions)]
    subdirs: u32,
}

/// First readdir offset that refers to a slot: 1 and 2 follow `.` and `..`.
pub(crate) const FIRST_SLOT_OFFSET: u64 = 2;

impl Dir {
    pub fn new(parent: u64) -> Dir {
        Dir {
            parent,
            ..Default::default()
        }
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Entries naming directories (debug builds only: see `subdirs`).
    #[cfg(debug_assertions)]
    pub fn subdirs(&self) -> u32 {
        self.subdirs
    }

    #[cfg(debug_assertions)]
    fn count_kind(&mut self, kind: FileType, add: bool) {
        if kind == FileType::Directory {
            if add {
                self.subdirs += 1;
            } else {
                debug_assert!(self.subdirs > 0, "a directory entry removed twice");
                self.subdirs -= 1;
            }
        }
    }

    fn find(&self, name: &[u8]) -> Option<u32> {
        let slots = &self.slots;
        self.index
            .find(hash(name), |&i| slots.get(i as usize).name() == name)
            .copied()
    }

    pub fn get(&self, name: &[u8]) -> Option<(u64, FileType)> {
        self.find(name).map(|i| {
            let s = self.slots.get(i as usize);
            (s.ino, s.kind())
        })
    }

    /// Inserts a new entry; the caller has checked that `name` is absent.
    pub fn insert(&mut self, name: &[u8], ino: u64, kind: FileType) {
        debug_assert!(!name.is_empty() && self.find(name).is_none());
        let slot = Slot::new(name, ino, kind);
        let idx = loop {
            match self.free.pop() {
                // Stale free-list entries (past a trimmed tail, or reused) are skipped.
                Some(i)
                    if (i as usize) < self.slots.len() && self.slots.get(i as usize).is_free() =>
                {
                    *self.slots.get_mut(i as usize) = slot;
                    break i;
                }
                Some(_) => continue,
                None => break self.slots.push(slot) as u32,
            }
        };
        let slots = &self.slots;
        self.index
            .insert_unique(hash(name), idx, |&i| hash(slots.get(i as usize).name()));
        #[cfg(debug_assertions)]
        self.count_kind(kind, true);
    }

    /// Removes an entry, returning its inode and type.
    pub fn remove(&mut self, name: &[u8]) -> Option<(u64, FileType)> {
        let slots = &self.slots;
        let entry = self
            .index
            .find_entry(hash(name), |&i| slots.get(i as usize).name() == name)
            .ok()?;
        let (idx, _) = entry.remove();
        let slot = std::mem::replace(self.slots.get_mut(idx as usize), Slot::FREE);
        #[cfg(debug_assertions)]
        self.count_kind(slot.kind(), false);
        if self.index.is_empty() {
            // Nothing left to keep stable: give the memory back.
            self.slots = Slots::default();
            self.free = Vec::new();
            self.index = HashTable::new();
        } else if idx as usize == self.slots.len() - 1 {
            self.slots.trim();
        } else {
            self.free.push(idx);
        }
        Some((slot.ino, slot.kind()))
    }

    /// Points an existing entry at another inode (rename over, exchange).
    pub fn replace(&mut self, name: &[u8], ino: u64, kind: FileType) {
        if let Some(i) = self.find(name) {
            let s = self.slots.get_mut(i as usize);
            #[cfg(debug_assertions)]
            let old = s.kind();
            s.ino = ino;
            s.set_kind(kind);
            #[cfg(debug_assertions)]
            {
                self.count_kind(old, false);
                self.count_kind(kind, true);
            }
        }
    }

    /// Sets `name` to `ino` whether or not it exists (replay of a journal
    /// onto a fuzzy checkpoint, where an entry may already be there).
    pub fn upsert(&mut self, name: &[u8], ino: u64, kind: FileType) {
        if self.find(name).is_some() {
            self.replace(name, ino, kind);
        } else {
            self.insert(name, ino, kind);
        }
    }

    /// Entries from readdir offset `offset` (>= FIRST_SLOT_OFFSET) on, each with
    /// the offset that resumes after it; stops when `f` returns false.
    pub fn list_from(&self, offset: u64, mut f: impl FnMut(&Entry<'_>, u64) -> bool) {
        let start = (offset - FIRST_SLOT_OFFSET) as usize;
        for (i, s) in self.slots.iter_from(start) {
            if s.is_free() {
                continue;
            }
            if !f(&s.entry(), i as u64 + FIRST_SLOT_OFFSET + 1) {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(d: &Dir, from: u64) -> Vec<(String, u64)> {
        let mut v = Vec::new();
        d.list_from(from, |s, off| {
            v.push((String::from_utf8(s.name.to_vec()).unwrap(), off));
            true
        });
        v
    }

    #[cfg(debug_assertions)]
    #[test]
    fn subdirectories_are_counted_through_every_change() {
        let mut d = Dir::new(1);
        d.insert(b"a", 2, FileType::Directory);
        d.insert(b"f", 3, FileType::RegularFile);
        d.upsert(b"b", 4, FileType::Directory);
        assert_eq!(d.subdirs(), 2);
        d.replace(b"a", 3, FileType::RegularFile);
        d.replace(b"f", 5, FileType::Directory);
        assert_eq!(d.subdirs(), 2);
        d.remove(b"b");
        d.remove(b"nothing");
        assert_eq!(d.subdirs(), 1);
        d.remove(b"f");
        d.remove(b"a");
        assert_eq!((d.subdirs(), d.is_empty()), (0, true));
    }

    #[test]
    fn insert_lookup_remove() {
        let mut d = Dir::new(1);
        d.insert(b"a", 10, FileType::RegularFile);
        d.insert(b"b", 11, FileType::Directory);
        assert_eq!(d.get(b"a"), Some((10, FileType::RegularFile)));
        assert_eq!(d.get(b"c"), None);
        assert_eq!(d.remove(b"a"), Some((10, FileType::RegularFile)));
        assert_eq!(d.get(b"a"), None);
        assert_eq!(d.len(), 1);
    }

    #[test]
    fn offsets_survive_removal_and_reuse() {
        let mut d = Dir::new(1);
        for i in 0..10 {
            d.insert(format!("f{i}").as_bytes(), i, FileType::RegularFile);
        }
        let all = names(&d, FIRST_SLOT_OFFSET);
        assert_eq!(all.len(), 10);
        // Resume after the 5th entry, with churn before and after the cursor.
        let resume = all[4].1;
        d.remove(b"f1");
        d.remove(b"f7");
        d.insert(b"new", 99, FileType::RegularFile); // reuses a freed slot
        let rest: Vec<String> = names(&d, resume).into_iter().map(|x| x.0).collect();
        for n in ["f5", "f6", "f8", "f9"] {
            assert_eq!(
                rest.iter().filter(|x| *x == n).count(),
                1,
                "{n} in {rest:?}"
            );
        }
        assert!(!rest.contains(&"f7".to_string()));
        assert!(!rest.contains(&"f2".to_string()));
    }

    #[test]
    fn slots_stay_small_and_long_names_work() {
        assert!(std::mem::size_of::<Slot>() <= 32);
        let mut d = Dir::new(1);
        let long = [b'n'; 255];
        let edge = [b'e'; INLINE_NAME];
        let over = [b'o'; INLINE_NAME + 1];
        d.insert(&long, 5, FileType::Symlink);
        d.insert(&edge, 6, FileType::Directory);
        d.insert(&over, 7, FileType::NamedPipe);
        assert_eq!(d.get(&long), Some((5, FileType::Symlink)));
        assert_eq!(d.get(&edge), Some((6, FileType::Directory)));
        assert_eq!(d.get(&over), Some((7, FileType::NamedPipe)));
        d.replace(&long, 8, FileType::RegularFile);
        assert_eq!(d.get(&long), Some((8, FileType::RegularFile)));
        let listed: Vec<_> = names(&d, FIRST_SLOT_OFFSET)
            .into_iter()
            .map(|x| x.0.len())
            .collect();
        assert_eq!(listed, vec![255, INLINE_NAME, INLINE_NAME + 1]);
        assert_eq!(d.remove(&edge), Some((6, FileType::Directory)));
        assert_eq!(d.get(&edge), None);
    }

    fn capacity(d: &Dir) -> usize {
        d.slots.chunks.iter().map(Vec::capacity).sum()
    }

    #[test]
    fn chunks_keep_slack_below_one_chunk_and_offsets_across_them() {
        let n = 10_000;
        let mut d = Dir::new(1);
        for i in 0..n {
            d.insert(
                format!("f{i}").as_bytes(),
                i as u64 + 10,
                FileType::RegularFile,
            );
        }
        // A doubling vector would hold 16,384 slots here.
        assert!(capacity(&d) < n + CHUNK, "capacity {}", capacity(&d));
        assert!(d.slots.chunks.iter().all(|c| c.capacity() <= CHUNK));
        for i in 0..n {
            let name = format!("f{i}");
            assert_eq!(
                d.get(name.as_bytes()),
                Some((i as u64 + 10, FileType::RegularFile))
            );
        }
        // Listing resumed at every offset around a chunk's edges gives each
        // remaining entry once, in slot order.
        let all = names(&d, FIRST_SLOT_OFFSET);
        assert_eq!(all.len(), n);
        for k in [CHUNK - 2, CHUNK - 1, CHUNK, 2 * CHUNK - 1, n - 1] {
            let rest = names(&d, all[k].1);
            assert_eq!(rest.len(), n - k - 1, "resumed after entry {k}");
            assert_eq!(rest.first().map(|x| &x.0), all.get(k + 1).map(|x| &x.0));
        }
        assert!(names(&d, all[n - 1].1 + 5).is_empty());
    }

    #[test]
    fn trimming_crosses_chunks_and_keeps_one_spare() {
        let mut d = Dir::new(1);
        for i in 0..=CHUNK {
            d.insert(format!("f{i}").as_bytes(), i as u64, FileType::RegularFile);
        }
        assert_eq!(d.slots.chunks.len(), 2);
        // The one entry of the second chunk goes: the chunk stays for the
        // next insert (no allocation at the edge), and gets it.
        d.remove(format!("f{CHUNK}").as_bytes());
        assert_eq!((d.slots.len(), d.slots.chunks.len()), (CHUNK, 2));
        d.insert(b"again", 7, FileType::Directory);
        assert_eq!(d.slots.chunks.len(), 2);
        assert_eq!(d.get(b"again"), Some((7, FileType::Directory)));
        // Emptying the tail down into the first chunk drops the spare.
        d.remove(b"again");
        for i in (CHUNK - 10..CHUNK).rev() {
            d.remove(format!("f{i}").as_bytes());
        }
        assert_eq!((d.slots.len(), d.slots.chunks.len()), (CHUNK - 10, 1));
        assert_eq!(d.len(), CHUNK - 10);
        assert_eq!(names(&d, FIRST_SLOT_OFFSET).len(), CHUNK - 10);
    }

    #[test]
    fn a_clone_grows_within_chunks() {
        let mut d = Dir::new(1);
        for i in 0..1500 {
            d.insert(format!("f{i}").as_bytes(), i, FileType::RegularFile);
        }
        let mut c = d.clone();
        for i in 1500..3000 {
            c.insert(format!("f{i}").as_bytes(), i, FileType::RegularFile);
        }
        assert!(c.slots.chunks.iter().all(|x| x.capacity() <= CHUNK));
        assert_eq!(c.len(), 3000);
        assert_eq!(d.len(), 1500);
        assert_eq!(c.get(b"f2999"), Some((2999, FileType::RegularFile)));
        assert_eq!(c.get(b"f0"), Some((0, FileType::RegularFile)));
        assert_eq!(d.get(b"f1500"), None);
    }

    #[test]
    fn emptied_directory_releases_slots() {
        let mut d = Dir::new(1);
        for i in 0..100 {
            d.insert(format!("f{i}").as_bytes(), i, FileType::RegularFile);
        }
        for i in 0..100 {
            d.remove(format!("f{i}").as_bytes());
        }
        assert!(d.is_empty());
        assert_eq!(d.slots.chunks.capacity(), 0);
    }
}
