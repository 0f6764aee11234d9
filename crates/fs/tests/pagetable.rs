//! The chunked page table of regular files (`src/data.rs`): chunk
//! boundaries, what the first write after a snapshot copies, rollback of a
//! big file, the zero-copy read API (`Fs::read_with`) and writes from pages
//! (`Fs::write_pages_as`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use memfs_fs::*;

const C: Ctx = Ctx::ROOT;
const P: u64 = PAGE_SIZE as u64;
/// Pages per chunk of the page table (a fact of the representation the
/// tests aim their boundaries at; the assertions hold for any size).
const CHUNK: u64 = 64;

fn fs() -> Fs {
    Fs::new(Config {
        capacity: 1 << 30,
        max_inodes: 1 << 16,
    })
}

fn used(fs: &Fs) -> u64 {
    let s = fs.statfs();
    s.blocks - s.bfree
}

fn file(fs: &Fs, name: &str) -> u64 {
    let (a, _) = fs
        .create(C, ROOT_INO, name.as_bytes(), 0o644, true)
        .unwrap();
    a.ino
}

/// Page `i`'s bytes in generation `g`: distinct per page and generation.
fn page(i: u64, g: u8) -> Vec<u8> {
    (0..PAGE_SIZE)
        .map(|b| (i as u8).wrapping_mul(31) ^ (b as u8) ^ g)
        .collect()
}

fn write_pages(fs: &Fs, ino: u64, pages: impl IntoIterator<Item = u64>, g: u8) {
    for i in pages {
        fs.write(C, ino, i * P, &page(i, g), false).unwrap();
    }
}

fn all(fs: &Fs, ino: u64) -> Vec<u8> {
    fs.read_vec(ino, 0, usize::MAX).unwrap()
}

fn snap_all(fs: &Fs, snap: u64, ino: u64) -> Vec<u8> {
    let size = fs.snap_getattr(snap, ino).unwrap().size as usize;
    let mut buf = vec![0xeeu8; size];
    let n = fs.snap_read(snap, ino, 0, &mut buf).unwrap();
    assert_eq!(n, size);
    buf
}

fn truncate(fs: &Fs, ino: u64, size: u64) {
    fs.setattr(
        C,
        ino,
        &SetAttr {
            size: Some(size),
            ..SetAttr::default()
        },
    )
    .unwrap();
}

fn seek(fs: &Fs, ino: u64, off: u64, whence: i32) -> Option<u64> {
    match fs.lseek(ino, off, whence) {
        Ok(o) => Some(o),
        Err(Errno::ENXIO) => None,
        Err(e) => panic!("lseek: {e:?}"),
    }
}

#[test]
fn first_write_after_a_snapshot_copies_only_the_page_written() {
    let fs = fs();
    let ino = file(&fs, "big");
    let pages = 5 * CHUNK + 7;
    write_pages(&fs, ino, 0..pages, 1);
    let before = all(&fs, ino);
    let base = used(&fs);
    assert_eq!(base, pages);
    let snap = fs.snapshot_create(b"s").unwrap().id;
    assert_eq!(used(&fs), base, "a snapshot copies nothing");

    // One page in the middle of a chunk, then one byte of another page of
    // the same chunk, then a page of another chunk: one page copy each,
    // every other page still shared with the snapshot.
    fs.write(C, ino, (CHUNK + 5) * P, &page(CHUNK + 5, 2), false)
        .unwrap();
    assert_eq!(used(&fs), base + 1);
    fs.write(C, ino, (CHUNK + 6) * P + 100, b"x", false)
        .unwrap();
    assert_eq!(used(&fs), base + 2);
    fs.write(C, ino, 3 * CHUNK * P, &page(3 * CHUNK, 2), false)
        .unwrap();
    assert_eq!(used(&fs), base + 3);
    // A second write to a page already copied copies nothing more.
    fs.write(C, ino, (CHUNK + 5) * P, b"again", false).unwrap();
    assert_eq!(used(&fs), base + 3);

    assert_eq!(
        snap_all(&fs, snap, ino),
        before,
        "the snapshot kept its pages"
    );
    let live = all(&fs, ino);
    for i in 0..pages {
        let r = (i * P) as usize..((i + 1) * P) as usize;
        let changed = [CHUNK + 5, CHUNK + 6, 3 * CHUNK].contains(&i);
        assert_eq!(live[r.clone()] != before[r], changed, "page {i}");
    }
    // The snapshot's own size estimate: only the three old pages are its alone.
    let info = fs.snapshot_by_name(b"s").unwrap();
    assert!(info.bytes >= 3 * P && info.bytes < 4 * P, "{}", info.bytes);

    // Deleting the snapshot gives back the three old pages.
    fs.snapshot_delete(b"s").unwrap();
    assert_eq!(used(&fs), base);
    assert_eq!(all(&fs, ino), live);

    // And the next snapshot's first write copies one page again.
    fs.snapshot_create(b"t").unwrap();
    fs.write(C, ino, (CHUNK + 5) * P, b"third", false).unwrap();
    assert_eq!(used(&fs), base + 1);
    fs.snapshot_delete(b"t").unwrap();
    assert_eq!(used(&fs), base);
}

#[test]
fn unlinking_a_file_a_snapshot_shares_frees_nothing_until_it_goes() {
    let fs = fs();
    let ino = file(&fs, "f");
    write_pages(&fs, ino, 0..3 * CHUNK, 1);
    fs.release(ino);
    fs.forget(ino, 1);
    let before = used(&fs);
    let snap = fs.snapshot_create(b"s").unwrap().id;
    // Rewrite half a chunk, then unlink: the snapshot keeps the old pages.
    write_pages(&fs, ino, 0..CHUNK / 2, 2);
    assert_eq!(used(&fs), before + CHUNK / 2);
    fs.unlink(ROOT_INO, b"f").unwrap();
    assert_eq!(used(&fs), before);
    let want: Vec<u8> = (0..3 * CHUNK).flat_map(|i| page(i, 1)).collect();
    assert_eq!(snap_all(&fs, snap, ino), want);
    fs.snapshot_delete(b"s").unwrap();
    assert_eq!(used(&fs), 0);
}

#[test]
fn rollback_restores_a_big_sparse_file() {
    let fs = fs();
    let ino = file(&fs, "big");
    write_pages(&fs, ino, 0..10 * CHUNK + 3, 1);
    write_pages(&fs, ino, [40 * CHUNK + 1], 1);
    let want = all(&fs, ino);
    let want_attr = fs.getattr(ino).unwrap();
    let live_pages = used(&fs);
    fs.snapshot_create(b"s").unwrap();

    // Rewrites across chunk boundaries, a hole punched over three chunks,
    // a truncation into a chunk, and growth far past the old end.
    fs.write(
        C,
        ino,
        (CHUNK - 1) * P + 10,
        &vec![9u8; 2 * P as usize],
        false,
    )
    .unwrap();
    fs.fallocate(
        ino,
        2 * CHUNK * P - 5,
        3 * CHUNK * P,
        FallocateMode {
            keep_size: true,
            punch_hole: true,
            zero_range: false,
        },
    )
    .unwrap();
    truncate(&fs, ino, 7 * CHUNK * P + 123);
    write_pages(&fs, ino, [60 * CHUNK], 3);
    assert_ne!(all(&fs, ino), want);

    let out = fs.rollback_to_snapshot(b"s").unwrap();
    assert!(out.changed.contains(&ino));
    let attr = fs.getattr(ino).unwrap();
    assert_eq!((attr.size, attr.blocks), (want_attr.size, want_attr.blocks));
    assert_eq!(all(&fs, ino), want);
    assert_eq!(
        seek(&fs, ino, 10 * CHUNK * P, libc::SEEK_HOLE),
        Some((10 * CHUNK + 3) * P)
    );
    assert_eq!(
        seek(&fs, ino, (10 * CHUNK + 3) * P, libc::SEEK_DATA),
        Some((40 * CHUNK + 1) * P)
    );
    // Writing after the rollback copies again and leaves the snapshot be.
    fs.write(C, ino, 5 * P, b"after", false).unwrap();
    let snap = fs.snapshot_by_name(b"s").unwrap().id;
    assert_eq!(snap_all(&fs, snap, ino), want);
    fs.snapshot_delete(b"s").unwrap();
    assert_eq!(used(&fs), live_pages, "usage is the live file's again");
}

/// The same operations on a file with and without a snapshot sharing it
/// must give the same contents, sizes, block counts and seeks; and the
/// snapshot must keep the state it was taken in.
#[test]
fn chunk_boundaries_with_and_without_a_snapshot() {
    for shared in [false, true] {
        let fs = fs();
        let ino = file(&fs, "f");
        let mut model: Vec<u8> = Vec::new();
        let put = |model: &mut Vec<u8>, off: u64, data: &[u8]| {
            let end = off as usize + data.len();
            if model.len() < end {
                model.resize(end, 0);
            }
            model[off as usize..end].copy_from_slice(data);
        };
        let check = |fs: &Fs, model: &Vec<u8>, what: &str| {
            assert_eq!(all(fs, ino), *model, "{what} (shared: {shared})");
            shared.then(|| {
                let name = format!("s{}", fs.snapshot_list().len());
                (
                    fs.snapshot_create(name.as_bytes()).unwrap().id,
                    model.clone(),
                )
            })
        };
        let mut snaps = Vec::new();
        // Straddling the first chunk boundary and the second.
        let a = vec![1u8; 3 * P as usize];
        fs.write(C, ino, (CHUNK - 1) * P - 7, &a, false).unwrap();
        put(&mut model, (CHUNK - 1) * P - 7, &a);
        snaps.extend(check(&fs, &model, "write over a boundary"));
        fs.write(C, ino, (2 * CHUNK - 1) * P + 1, &a[..P as usize], false)
            .unwrap();
        put(&mut model, (2 * CHUNK - 1) * P + 1, &a[..P as usize]);
        snaps.extend(check(&fs, &model, "second boundary"));
        // A chunk with nothing in it, then pages past it.
        let b = vec![2u8; 5];
        fs.write(C, ino, 4 * CHUNK * P + 3, &b, false).unwrap();
        put(&mut model, 4 * CHUNK * P + 3, &b);
        snaps.extend(check(&fs, &model, "past an empty chunk"));
        let size = model.len() as u64;
        assert_eq!(seek(&fs, ino, 0, libc::SEEK_DATA), Some((CHUNK - 2) * P));
        assert_eq!(
            seek(&fs, ino, (CHUNK - 2) * P, libc::SEEK_HOLE),
            Some((CHUNK + 2) * P)
        );
        assert_eq!(
            seek(&fs, ino, (CHUNK + 2) * P, libc::SEEK_DATA),
            Some((2 * CHUNK - 1) * P)
        );
        assert_eq!(
            seek(&fs, ino, (2 * CHUNK - 1) * P, libc::SEEK_HOLE),
            Some((2 * CHUNK + 1) * P)
        );
        assert_eq!(
            seek(&fs, ino, (2 * CHUNK + 1) * P, libc::SEEK_DATA),
            Some(4 * CHUNK * P)
        );
        assert_eq!(seek(&fs, ino, 4 * CHUNK * P, libc::SEEK_HOLE), Some(size));
        assert_eq!(fs.getattr(ino).unwrap().blocks, 7 * 8);
        // Allocation over three chunks keeps the data and fills the rest.
        fs.fallocate(
            ino,
            (CHUNK - 3) * P,
            (CHUNK + 10) * P,
            FallocateMode::ALLOCATE,
        )
        .unwrap();
        let end = (2 * CHUNK + 7) * P;
        if model.len() < end as usize {
            model.resize(end as usize, 0);
        }
        snaps.extend(check(&fs, &model, "allocate"));
        assert_eq!(fs.getattr(ino).unwrap().blocks, (CHUNK + 10 + 1) * 8);
        assert_eq!(
            seek(&fs, ino, (CHUNK - 3) * P, libc::SEEK_HOLE),
            Some((2 * CHUNK + 7) * P)
        );
        // A hole punched over a boundary, edges partial.
        let (po, pl) = ((CHUNK - 2) * P + 100, 3 * P);
        fs.fallocate(
            ino,
            po,
            pl,
            FallocateMode {
                keep_size: true,
                punch_hole: true,
                zero_range: false,
            },
        )
        .unwrap();
        model[po as usize..(po + pl) as usize].fill(0);
        snaps.extend(check(&fs, &model, "punch"));
        assert_eq!(fs.getattr(ino).unwrap().blocks, (CHUNK + 10 + 1 - 2) * 8);
        // Zeroing a whole chunk and then some.
        fs.fallocate(
            ino,
            CHUNK * P,
            CHUNK * P + 1,
            FallocateMode {
                keep_size: true,
                punch_hole: false,
                zero_range: true,
            },
        )
        .unwrap();
        model[(CHUNK * P) as usize..(2 * CHUNK * P + 1) as usize].fill(0);
        snaps.extend(check(&fs, &model, "zero range"));
        // Truncations exactly at a boundary, one page past it, into a page.
        for cut in [2 * CHUNK * P, CHUNK * P + P, CHUNK * P, CHUNK * P - 1, 10] {
            truncate(&fs, ino, cut);
            model.truncate(cut as usize);
            snaps.extend(check(&fs, &model, &format!("truncate to {cut}")));
        }
        // Growing again shows zeros, not the old bytes.
        fs.write(C, ino, 3 * CHUNK * P, b"z", false).unwrap();
        put(&mut model, 3 * CHUNK * P, b"z");
        snaps.extend(check(&fs, &model, "grown"));
        truncate(&fs, ino, 0);
        model.clear();
        snaps.extend(check(&fs, &model, "empty"));
        assert_eq!(fs.getattr(ino).unwrap().blocks, 0);

        for (id, want) in &snaps {
            assert_eq!(&snap_all(&fs, *id, ino), want, "snapshot {id}");
        }
        let names: Vec<Vec<u8>> = fs.snapshot_list().into_iter().map(|s| s.name).collect();
        for n in names {
            fs.snapshot_delete(&n).unwrap();
        }
        assert_eq!(used(&fs), 0, "every page given back (shared: {shared})");
    }
}

/// What `read_with` hands `f`, joined, checked against `read_vec`, and the
/// slices' shape: none empty, none across a page boundary.
fn gather(fs: &Fs, ino: u64, off: u64, len: usize) -> Vec<u8> {
    fs.read_with(ino, off, len, AtimeMode::Never, |parts| {
        let mut pos = off;
        for p in parts {
            assert!(!p.is_empty(), "empty slice");
            assert!(
                pos / P == (pos + p.len() as u64 - 1) / P,
                "slice across a page at {pos}"
            );
            pos += p.len() as u64;
        }
        parts.concat()
    })
    .unwrap()
}

#[test]
fn read_with_covers_holes_eof_and_page_boundaries() {
    let fs = fs();
    let ino = file(&fs, "sparse");
    write_pages(&fs, ino, [0, 2, CHUNK, 3 * CHUNK + 1], 1);
    truncate(&fs, ino, (3 * CHUNK + 1) * P + 1000);
    let whole = all(&fs, ino);
    let size = whole.len() as u64;
    for (off, len) in [
        (0, size as usize),
        (100, 3 * P as usize - 200),
        (P - 1, 2),
        (P, P as usize),
        ((CHUNK - 1) * P + 5, 2 * P as usize),
        (5 * P, 10 * P as usize),
        (size - 10, 100),
        (size - 1, 1),
        (0, 0),
    ] {
        let want = &whole[off as usize..(off as usize + len).min(whole.len())];
        assert_eq!(gather(&fs, ino, off, len), want, "off {off} len {len}");
    }
    // At and past the end: `f` gets nothing.
    assert_eq!(gather(&fs, ino, size, 10), Vec::<u8>::new());
    assert_eq!(gather(&fs, ino, size + 5 * P, 10), Vec::<u8>::new());
    // Holes share one page of zeros.
    let holes = fs
        .read_with(ino, 5 * P, 3 * P as usize, AtimeMode::Never, |parts| {
            parts.iter().map(|p| p.as_ptr()).collect::<Vec<_>>()
        })
        .unwrap();
    assert_eq!(holes.len(), 3);
    assert!(holes.iter().all(|&p| p == holes[0]));

    // An inline small file, an empty one grown by truncate, errors.
    let small = file(&fs, "small");
    fs.write(C, small, 3, b"abc", false).unwrap();
    truncate(&fs, small, P + 10);
    let mut want = vec![0u8; (P + 10) as usize];
    want[3..6].copy_from_slice(b"abc");
    assert_eq!(gather(&fs, small, 0, 1 << 20), want);
    assert_eq!(gather(&fs, small, 4, 3), b"bc\0");
    let empty = file(&fs, "empty");
    truncate(&fs, empty, 3 * P);
    assert_eq!(
        gather(&fs, empty, 1, 3 * P as usize),
        vec![0u8; 3 * P as usize - 1]
    );
    let dir = fs.mkdir(C, ROOT_INO, b"d", 0o755).unwrap();
    assert_eq!(
        fs.read_with(dir.ino, 0, 10, AtimeMode::Never, |_| ()),
        Err(Errno::EISDIR)
    );
    assert_eq!(
        fs.read_with(9_999_999, 0, 10, AtimeMode::Never, |_| ()),
        Err(Errno::ENOENT)
    );

    // A snapshot's view, after the live file changed.
    let snap = fs.snapshot_create(b"s").unwrap().id;
    write_pages(&fs, ino, 0..4, 2);
    let got = fs
        .snap_read_with(snap, ino, 0, size as usize, |parts| parts.concat())
        .unwrap();
    assert_eq!(got, whole);
}

#[test]
fn read_with_moves_atime_like_read() {
    let fs = fs();
    let ino = file(&fs, "f");
    fs.write(C, ino, 0, b"hello", false).unwrap();
    let t0 = fs.getattr(ino).unwrap().atime;
    fs.read_with(ino, 10, 5, AtimeMode::Strict, |p| assert!(p.is_empty()))
        .unwrap();
    assert_eq!(fs.getattr(ino).unwrap().atime, t0, "no access past the end");
    fs.read_with(ino, 0, 5, AtimeMode::Never, |p| {
        assert_eq!(p.concat(), b"hello")
    })
    .unwrap();
    assert_eq!(fs.getattr(ino).unwrap().atime, t0, "noatime");
    // Strict: every read that reaches data moves it (the clock may not
    // have moved since the write: poll it forward, no sleep).
    while Timespec::now() <= t0 {
        std::hint::spin_loop();
    }
    fs.read_with(ino, 1, 2, AtimeMode::Strict, |p| {
        assert_eq!(p.concat(), b"el")
    })
    .unwrap();
    assert!(fs.getattr(ino).unwrap().atime > t0);
}

/// Readers through `read_with` never see half of a write: each write
/// replaces the whole file with one generation's bytes, across chunks.
#[test]
fn read_with_sees_whole_writes_only() {
    let fs = Arc::new(fs());
    let ino = file(&fs, "f");
    let len = (CHUNK + 3) * P;
    fs.write(C, ino, 0, &vec![0u8; len as usize], false)
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let writer = {
        let (fs, stop, written) = (fs.clone(), stop.clone(), written.clone());
        std::thread::spawn(move || {
            let mut g = 0u8;
            while !stop.load(Ordering::Acquire) {
                g = g.wrapping_add(1);
                fs.write(C, ino, 0, &vec![g; len as usize], false).unwrap();
                // A snapshot now and then: later writes unshare chunks.
                if g.is_multiple_of(16) {
                    let name = format!("s{g}");
                    fs.snapshot_create(name.as_bytes()).unwrap();
                    if g.is_multiple_of(64) {
                        for s in fs.snapshot_list() {
                            fs.snapshot_delete(&s.name).unwrap();
                        }
                    }
                }
                written.fetch_add(1, Ordering::AcqRel);
            }
        })
    };
    let mut reads = 0u64;
    // Until the writer has got well ahead (polled, not slept) and enough reads ran.
    while reads < 500 || written.load(Ordering::Acquire) < 50 {
        fs.read_with(ino, 0, len as usize, AtimeMode::Never, |parts| {
            let g = parts[0][0];
            for p in parts {
                assert!(p.iter().all(|&b| b == g), "a torn read");
            }
            assert_eq!(parts.iter().map(|p| p.len() as u64).sum::<u64>(), len);
        })
        .unwrap();
        reads += 1;
    }
    stop.store(true, Ordering::Release);
    writer.join().unwrap();
    assert!(written.load(Ordering::Acquire) >= 50);
}

// Writes whose data arrives in page allocations (`Fs::write_pages_as`, the
// FUSE adapter's WRITE path): whole aligned pages are taken as they are,
// everything else is copied, and contents, sizes, usage and snapshots come
// out exactly as with `Fs::write_as` of the same bytes.

const PS: usize = PAGE_SIZE;

/// `data` cut into page allocations, as the adapter receives it.
fn paged(data: &[u8]) -> Vec<Option<Box<[u8; PAGE_SIZE]>>> {
    data.chunks(PS)
        .map(|c| {
            let mut p = Box::new([0u8; PAGE_SIZE]);
            p[..c.len()].copy_from_slice(c);
            Some(p)
        })
        .collect()
}

fn bytes(n: usize, g: u8) -> Vec<u8> {
    (0..n).map(|i| (i % 253) as u8 ^ g).collect()
}

/// The same writes through both calls, into two file systems: every
/// observable result must match, and whole aligned pages must be taken.
#[test]
fn paged_writes_match_copied_writes() {
    let (a, b) = (fs(), fs());
    let (fa, fb) = (file(&a, "f"), file(&b, "f"));
    // (offset, length): aligned whole pages with a tail, unaligned, a small
    // first write (kept inline), a write over pages that exist, one past a hole.
    let writes: &[(u64, usize)] = &[
        (0, 100),
        (0, 2 * PS + 300),
        (PS as u64 + 7, 3 * PS),
        (64 * PS as u64 - 2 * PS as u64, 5 * PS),
        (200 * PS as u64, PS),
        (0, 4 * PS),
    ];
    for (g, &(off, len)) in writes.iter().enumerate() {
        let data = bytes(len, g as u8);
        let mut pages = paged(&data);
        let before: Vec<*const u8> = pages.iter().map(|p| p.as_ref().unwrap().as_ptr()).collect();
        let n = a
            .write_pages_as(C, &|_| true, false, fa, off, len, &mut pages, false)
            .unwrap();
        assert_eq!(n, len);
        b.write(C, fb, off, &data, false).unwrap();
        // Taken: gone, or swapped for the page it replaced.
        let taken = pages
            .iter()
            .zip(&before)
            .filter(|(p, was)| p.as_ref().is_none_or(|p| p.as_ptr() != **was))
            .count();
        let small = off == 0 && len <= PS && g == 0;
        let want = if off % PS as u64 == 0 && !small {
            len / PS
        } else {
            0
        };
        assert_eq!(taken, want, "pages taken by write {g} ({off}, {len})");
        assert_eq!(
            a.read_vec(fa, 0, usize::MAX).unwrap(),
            b.read_vec(fb, 0, usize::MAX).unwrap(),
            "contents after write {g}"
        );
        let (x, y) = (a.getattr(fa).unwrap(), b.getattr(fb).unwrap());
        assert_eq!((x.size, x.blocks), (y.size, y.blocks), "after write {g}");
        assert_eq!(used(&a), used(&b), "usage after write {g}");
    }
}

/// An overwrite hands back the pages it replaced, holding the old bytes.
#[test]
fn an_overwrite_hands_back_the_pages_it_replaced() {
    let fs = fs();
    let ino = file(&fs, "f");
    let old = bytes(3 * PS, 5);
    fs.write_pages_as(C, &|_| true, false, ino, 0, 3 * PS, &mut paged(&old), false)
        .unwrap();
    let new = bytes(2 * PS, 6);
    let mut pages = paged(&new);
    fs.write_pages_as(
        C,
        &|_| true,
        false,
        ino,
        PS as u64,
        2 * PS,
        &mut pages,
        false,
    )
    .unwrap();
    let back: Vec<u8> = pages
        .iter()
        .flat_map(|p| p.as_ref().unwrap().to_vec())
        .collect();
    assert_eq!(back, old[PS..], "the replaced pages, as they were");
    let mut want = old.clone();
    want[PS..].copy_from_slice(&new);
    assert_eq!(fs.read_vec(ino, 0, usize::MAX).unwrap(), want);
}

/// A page a snapshot shares is replaced, not written into: the snapshot
/// keeps its bytes, the page stays counted until the snapshot goes.
#[test]
fn a_paged_write_leaves_a_snapshot_its_pages() {
    let fs = fs();
    let ino = file(&fs, "f");
    let old = bytes(8 * PS, 1);
    fs.write(C, ino, 0, &old, false).unwrap();
    let before = used(&fs);
    let snap = fs.snapshot_create(b"s").unwrap().id;
    let new = bytes(4 * PS, 2);
    let mut pages = paged(&new);
    fs.write_pages_as(
        C,
        &|_| true,
        false,
        ino,
        2 * PS as u64,
        4 * PS,
        &mut pages,
        false,
    )
    .unwrap();
    assert!(pages.iter().all(Option::is_none));
    let mut want = old.clone();
    want[2 * PS..6 * PS].copy_from_slice(&new);
    assert_eq!(fs.read_vec(ino, 0, usize::MAX).unwrap(), want);
    let mut kept = vec![0u8; old.len()];
    assert_eq!(fs.snap_read(snap, ino, 0, &mut kept).unwrap(), old.len());
    assert_eq!(kept, old, "the snapshot keeps its bytes");
    assert_eq!(used(&fs), before + 4, "four pages more while it is kept");
    fs.snapshot_delete(b"s").unwrap();
    assert_eq!(used(&fs), before);
}

#[test]
fn a_missing_page_is_refused_and_changes_nothing() {
    let fs = fs();
    let ino = file(&fs, "f");
    let mut pages = paged(&bytes(2 * PS, 3));
    pages[1] = None;
    let e = fs
        .write_pages_as(C, &|_| true, false, ino, 0, 2 * PS, &mut pages, false)
        .unwrap_err();
    assert_eq!(e, Errno::EINVAL);
    assert!(pages[0].is_some(), "nothing taken");
    assert_eq!(fs.getattr(ino).unwrap().size, 0);
    let e = fs
        .write_pages_as(
            C,
            &|_| true,
            false,
            ino,
            0,
            3 * PS,
            &mut paged(&[1; 10]),
            false,
        )
        .unwrap_err();
    assert_eq!(e, Errno::EINVAL, "fewer pages than the length needs");
}

/// With capacity for fewer pages than the write needs: ENOSPC, nothing
/// taken, nothing written.
#[test]
fn a_paged_write_past_the_capacity_fails_whole() {
    let fs = Fs::new(Config {
        capacity: 4 * PS as u64,
        max_inodes: 64,
    });
    let ino = file(&fs, "f");
    let mut pages = paged(&bytes(8 * PS, 4));
    let e = fs
        .write_pages_as(C, &|_| true, false, ino, 0, 8 * PS, &mut pages, false)
        .unwrap_err();
    assert_eq!(e, Errno::ENOSPC);
    assert!(pages.iter().all(Option::is_some));
    assert_eq!(fs.getattr(ino).unwrap().size, 0);
    assert_eq!(used(&fs), 0);
}

/// Keeps the writes a file system records: (offset, bytes, size after).
#[derive(Default)]
struct KeepWrites(std::sync::Mutex<Vec<(u64, Vec<u8>, u64)>>);

impl Recorder for KeepWrites {
    fn record(&self, m: &Mutation<'_>) -> std::result::Result<u64, Errno> {
        let mut v = self.0.lock().unwrap();
        if let Mutation::Write { attr, offset, data } = *m {
            v.push((offset, data.to_vec(), attr.size));
        }
        Ok(v.len() as u64 + 1)
    }
}

/// With a recorder, a write from pages records exactly its bytes (read
/// back from the file's pages after it took them) and the size it left.
#[test]
fn a_paged_write_records_its_bytes() {
    let keep = Arc::new(KeepWrites::default());
    let mut fs = fs();
    fs.set_recorder(Some(keep.clone()));
    let ino = file(&fs, "f");
    let mut want = Vec::new();
    for (off, len) in [(0u64, 2 * PS + 5), (PS as u64, PS), (3, PS)] {
        let data = bytes(len, off as u8);
        let mut pages = paged(&data);
        fs.write_pages_as(C, &|_| true, false, ino, off, len, &mut pages, false)
            .unwrap();
        want.push((off, data, fs.getattr(ino).unwrap().size));
    }
    assert_eq!(*keep.0.lock().unwrap(), want);
}
