//! Writes whose data arrives in page allocations (`Fs::write_pages_as`,
//! the FUSE adapter's WRITE path): whole aligned pages are taken as they
//! are, everything else is copied, and contents, sizes, usage and
//! snapshots come out exactly as with `Fs::write_as` of the same bytes.

use memfs_fs::*;

const C: Ctx = Ctx::ROOT;
const P: usize = PAGE_SIZE;

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
    fs.create(C, ROOT_INO, name.as_bytes(), 0o644, true)
        .unwrap()
        .0
        .ino
}

/// `data` cut into page allocations, as the adapter receives it.
fn paged(data: &[u8]) -> Vec<Option<Box<[u8; PAGE_SIZE]>>> {
    data.chunks(P)
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
        (0, 2 * P + 300),
        (P as u64 + 7, 3 * P),
        (64 * P as u64 - 2 * P as u64, 5 * P),
        (200 * P as u64, P),
        (0, 4 * P),
    ];
    for (g, &(off, len)) in writes.iter().enumerate() {
        let data = bytes(len, g as u8);
        let mut pages = paged(&data);
        let before: Vec<*const u8> = pages.iter().map(|p| p.as_ref().unwrap().as_ptr()).collect();
        let n = a
            .write_pages_as(C, &|_| true, fa, off, len, &mut pages, false)
            .unwrap();
        assert_eq!(n, len);
        b.write(C, fb, off, &data, false).unwrap();
        // Taken: gone, or swapped for the page it replaced.
        let taken = pages
            .iter()
            .zip(&before)
            .filter(|(p, was)| p.as_ref().is_none_or(|p| p.as_ptr() != **was))
            .count();
        let small = off == 0 && len <= P && g == 0;
        let want = if off % P as u64 == 0 && !small {
            len / P
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
    let old = bytes(3 * P, 5);
    fs.write_pages_as(C, &|_| true, ino, 0, 3 * P, &mut paged(&old), false)
        .unwrap();
    let new = bytes(2 * P, 6);
    let mut pages = paged(&new);
    fs.write_pages_as(C, &|_| true, ino, P as u64, 2 * P, &mut pages, false)
        .unwrap();
    let back: Vec<u8> = pages
        .iter()
        .flat_map(|p| p.as_ref().unwrap().to_vec())
        .collect();
    assert_eq!(back, old[P..], "the replaced pages, as they were");
    let mut want = old.clone();
    want[P..].copy_from_slice(&new);
    assert_eq!(fs.read_vec(ino, 0, usize::MAX).unwrap(), want);
}

/// A page a snapshot shares is replaced, not written into: the snapshot
/// keeps its bytes, the page stays counted until the snapshot goes.
#[test]
fn a_paged_write_leaves_a_snapshot_its_pages() {
    let fs = fs();
    let ino = file(&fs, "f");
    let old = bytes(8 * P, 1);
    fs.write(C, ino, 0, &old, false).unwrap();
    let before = used(&fs);
    let snap = fs.snapshot_create(b"s").unwrap().id;
    let new = bytes(4 * P, 2);
    let mut pages = paged(&new);
    fs.write_pages_as(C, &|_| true, ino, 2 * P as u64, 4 * P, &mut pages, false)
        .unwrap();
    assert!(pages.iter().all(Option::is_none));
    let mut want = old.clone();
    want[2 * P..6 * P].copy_from_slice(&new);
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
    let mut pages = paged(&bytes(2 * P, 3));
    pages[1] = None;
    let e = fs
        .write_pages_as(C, &|_| true, ino, 0, 2 * P, &mut pages, false)
        .unwrap_err();
    assert_eq!(e, Errno::EINVAL);
    assert!(pages[0].is_some(), "nothing taken");
    assert_eq!(fs.getattr(ino).unwrap().size, 0);
    let e = fs
        .write_pages_as(C, &|_| true, ino, 0, 3 * P, &mut paged(&[1; 10]), false)
        .unwrap_err();
    assert_eq!(e, Errno::EINVAL, "fewer pages than the length needs");
}

/// With capacity for fewer pages than the write needs: ENOSPC, nothing
/// taken, nothing written.
#[test]
fn a_paged_write_past_the_capacity_fails_whole() {
    let fs = Fs::new(Config {
        capacity: 4 * P as u64,
        max_inodes: 64,
    });
    let ino = file(&fs, "f");
    let mut pages = paged(&bytes(8 * P, 4));
    let e = fs
        .write_pages_as(C, &|_| true, ino, 0, 8 * P, &mut pages, false)
        .unwrap_err();
    assert_eq!(e, Errno::ENOSPC);
    assert!(pages.iter().all(Option::is_some));
    assert_eq!(fs.getattr(ino).unwrap().size, 0);
    assert_eq!(used(&fs), 0);
}
