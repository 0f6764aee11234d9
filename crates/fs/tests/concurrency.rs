//! Concurrency tests of the engine: readdir's exactly-once rule under churn,
//! deadlock freedom of crossing renames, unlinked-but-open files, and exact
//! inode accounting over many create/forget/unlink cycles.
//!
//! Nothing here waits on time to pass: workers run a fixed number of
//! iterations, and the only clock is the deadlock watchdog, which turns a
//! hang into a failure instead of a stuck CI job.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::thread;
use std::time::Duration;

use memfs_fs::*;

const C: Ctx = Ctx::ROOT;

fn fs() -> Arc<Fs> {
    Arc::new(Fs::new(Config {
        capacity: 1 << 30,
        max_inodes: 1 << 20,
    }))
}

/// Runs `workers` on their own threads and joins them, failing (not hanging)
/// if they have not all finished within `limit`: a lock-order bug shows up as
/// a test failure naming the stuck workers.
fn run_with_watchdog(limit: Duration, workers: Vec<(String, Box<dyn FnOnce() + Send>)>) {
    let (tx, rx) = mpsc::channel::<(String, thread::Result<()>)>();
    let mut pending: BTreeSet<String> = BTreeSet::new();
    for (name, w) in workers {
        pending.insert(name.clone());
        let tx = tx.clone();
        thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(w));
                let _ = tx.send((name, r));
            })
            .expect("spawn worker");
    }
    drop(tx);
    let deadline = std::time::Instant::now() + limit;
    while !pending.is_empty() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok((name, r)) => {
                pending.remove(&name);
                if let Err(p) = r {
                    std::panic::resume_unwind(p);
                }
            }
            Err(_) => panic!("workers still running after {limit:?} (deadlock?): {pending:?}"),
        }
    }
}

/// Lists `dir` `chunk` entries per call, resuming each call from the offset
/// of the last entry returned, as `getdents` over FUSE does.
fn list_chunked(fs: &Fs, dir: u64, chunk: usize) -> Vec<Vec<u8>> {
    try_list_chunked(fs, dir, chunk).expect("readdir")
}

/// [`list_chunked`] of a directory that may be removed (and freed) meanwhile.
fn try_list_chunked(fs: &Fs, dir: u64, chunk: usize) -> Result<Vec<Vec<u8>>> {
    let mut names = Vec::new();
    let mut off = 0;
    loop {
        let mut got = 0;
        fs.readdir(dir, off, |e| {
            if got == chunk {
                return false;
            }
            names.push(e.name.to_vec());
            off = e.offset;
            got += 1;
            true
        })?;
        if got < chunk {
            return Ok(names);
        }
    }
}

/// Like [`list_chunked`] through `readdirplus`, which takes a kernel
/// reference per entry; every reference is forgotten again, as the kernel would.
fn list_chunked_plus(fs: &Fs, dir: u64, chunk: usize) -> Vec<Vec<u8>> {
    let mut names = Vec::new();
    let mut refs = Vec::new();
    let mut off = 0;
    loop {
        let mut got = 0;
        fs.readdirplus(dir, off, |e, attr| {
            if got == chunk {
                return false;
            }
            assert_eq!(e.ino, attr.ino);
            names.push(e.name.to_vec());
            if e.name != b"." && e.name != b".." {
                refs.push(e.ino);
            }
            off = e.offset;
            got += 1;
            true
        })
        .expect("readdirplus");
        if got < chunk {
            break;
        }
    }
    for ino in refs {
        fs.forget(ino, 1);
    }
    names
}

#[test]
fn readdir_returns_stable_entries_exactly_once_under_churn() {
    const STABLE: usize = 150;
    const WRITERS: usize = 3;
    const ROUNDS: usize = 1500;
    const MIN_LISTINGS: usize = 40;

    let fs = fs();
    let dir = fs.mkdir(C, ROOT_INO, b"shared", 0o755).unwrap().ino;
    // Stable names interleaved with churned ones, so that stable entries sit
    // between slots that are freed and reused during the listings.
    let mut stable = BTreeSet::new();
    for i in 0..STABLE {
        let n = format!("stable-{i}").into_bytes();
        let (a, _) = fs.create(C, dir, &n, 0o644, true).unwrap();
        fs.release(a.ino);
        fs.forget(a.ino, 1);
        stable.insert(n);
        let (a, _) = fs
            .create(C, dir, format!("seed-{i}").as_bytes(), 0o644, true)
            .unwrap();
        fs.release(a.ino);
        fs.forget(a.ino, 1);
    }
    let base_inodes = fs.inode_count();
    let stable = Arc::new(stable);
    let writers_done = Arc::new(AtomicU64::new(0));
    let listings = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(WRITERS + 4));
    let other = fs.mkdir(C, ROOT_INO, b"other", 0o755).unwrap().ino;
    fs.forget(other, 1);

    let mut workers: Vec<(String, Box<dyn FnOnce() + Send>)> = Vec::new();
    {
        // Entries arriving from and leaving for another directory (the
        // cross-directory rename path), exchanged with a resident, and removed.
        let (fs, done, start) = (fs.clone(), writers_done.clone(), start.clone());
        workers.push((
            "mover".into(),
            Box::new(move || {
                start.wait();
                let ex = RenameFlags {
                    noreplace: false,
                    exchange: true,
                };
                for i in 0..ROUNDS {
                    let n = format!("m-{i}").into_bytes();
                    let x = format!("x-{i}").into_bytes();
                    let (attr, _) = fs.create(C, other, &n, 0o644, true).unwrap();
                    fs.release(attr.ino);
                    fs.forget(attr.ino, 1);
                    let d = fs.mkdir(C, other, &x, 0o755).unwrap();
                    fs.forget(d.ino, 1);
                    fs.rename(other, &n, dir, &n, RenameFlags::default())
                        .unwrap();
                    // The file goes back out and the directory comes in, in one step.
                    fs.rename(dir, &n, other, &x, ex).unwrap();
                    fs.rename(dir, &n, other, &n, RenameFlags::default())
                        .unwrap();
                    fs.rmdir(other, &n).unwrap();
                    fs.unlink(other, &x).unwrap();
                }
                done.fetch_add(1, Ordering::Release);
            }),
        ));
    }
    for w in 0..WRITERS {
        let (fs, done, start) = (fs.clone(), writers_done.clone(), start.clone());
        workers.push((
            format!("writer-{w}"),
            Box::new(move || {
                start.wait();
                for i in 0..ROUNDS {
                    let a = format!("w{w}-{i}").into_bytes();
                    let b = format!("w{w}-{i}-renamed").into_bytes();
                    let (attr, _) = fs.create(C, dir, &a, 0o644, true).unwrap();
                    fs.release(attr.ino);
                    fs.forget(attr.ino, 1);
                    fs.rename(dir, &a, dir, &b, RenameFlags::default()).unwrap();
                    // Free the seeds early on so their slots get reused.
                    if i < STABLE / WRITERS {
                        let seed = format!("seed-{}", i * WRITERS + w);
                        fs.unlink(dir, seed.as_bytes()).unwrap();
                    }
                    // Keep a few behind (slot reuse), drop the rest.
                    if i % 3 != 0 {
                        fs.unlink(dir, &b).unwrap();
                    }
                    if i % 50 == 0 {
                        let d = format!("d{w}-{i}").into_bytes();
                        fs.mkdir(C, dir, &d, 0o755)
                            .map(|a| fs.forget(a.ino, 1))
                            .unwrap();
                        fs.rmdir(dir, &d).unwrap();
                    }
                }
                done.fetch_add(1, Ordering::Release);
            }),
        ));
    }
    for r in 0..3 {
        let (fs, stable, done, listings, start) = (
            fs.clone(),
            stable.clone(),
            writers_done.clone(),
            listings.clone(),
            start.clone(),
        );
        workers.push((
            format!("reader-{r}"),
            Box::new(move || {
                start.wait();
                let mut n = 0usize;
                // At least MIN_LISTINGS each, and keep listing while writers run.
                while n < MIN_LISTINGS || done.load(Ordering::Acquire) < WRITERS as u64 + 1 {
                    let chunk = 1 + (n * 7 + r) % 13;
                    let names = if r == 2 {
                        list_chunked_plus(&fs, dir, chunk)
                    } else {
                        list_chunked(&fs, dir, chunk)
                    };
                    assert_eq!(&names[0], b".");
                    assert_eq!(&names[1], b"..");
                    let mut counts: HashMap<&[u8], usize> = HashMap::new();
                    for name in &names[2..] {
                        *counts.entry(name).or_default() += 1;
                    }
                    for s in stable.iter() {
                        assert_eq!(
                            counts.get(&s[..]).copied().unwrap_or(0),
                            1,
                            "stable entry {} in listing {n} (chunk {chunk})",
                            String::from_utf8_lossy(s)
                        );
                    }
                    // Names are never reused, so nothing may show up twice.
                    for (name, c) in &counts {
                        assert_eq!(*c, 1, "{} listed {c} times", String::from_utf8_lossy(name));
                    }
                    n += 1;
                    listings.fetch_add(1, Ordering::Relaxed);
                }
            }),
        ));
    }
    run_with_watchdog(Duration::from_secs(120), workers);
    assert!(listings.load(Ordering::Relaxed) >= 3 * MIN_LISTINGS as u64);

    // Exactly the survivors remain, and the inode table agrees.
    let final_names: BTreeSet<Vec<u8>> =
        list_chunked(&fs, dir, 1000)[2..].iter().cloned().collect();
    let mut expect: BTreeSet<Vec<u8>> = (*stable).clone();
    for w in 0..WRITERS {
        for i in (0..ROUNDS).step_by(3) {
            expect.insert(format!("w{w}-{i}-renamed").into_bytes());
        }
    }
    // Seeds the writers did not get to (none with the constants above).
    let first_kept_seed = (STABLE / WRITERS) * WRITERS;
    expect.extend(
        (0..STABLE)
            .filter(|&i| i >= first_kept_seed)
            .map(|i| format!("seed-{i}").into_bytes()),
    );
    assert_eq!(final_names, expect);
    let kept = expect.len() - STABLE;
    assert_eq!(
        fs.inode_count(),
        base_inodes + 1 - STABLE + kept,
        "(+1: other)"
    );
}

#[test]
fn crossing_renames_do_not_deadlock() {
    const ITERS: usize = 4000;
    let fs = fs();
    let mk = |p: u64, n: &str| {
        let a = fs.mkdir(C, p, n.as_bytes(), 0o755).unwrap();
        fs.forget(a.ino, 1);
        a.ino
    };
    let a = mk(ROOT_INO, "a");
    let b = mk(ROOT_INO, "b");
    let a_sub = mk(a, "sub");
    let b_sub = mk(b, "sub");
    let dirs = [a, b, a_sub, b_sub];
    // Files and directories that wander between the four directories.
    for (i, &d) in dirs.iter().enumerate() {
        for k in 0..4 {
            let n = format!("f{i}-{k}");
            let (attr, _) = fs.create(C, d, n.as_bytes(), 0o644, true).unwrap();
            fs.release(attr.ino);
            fs.forget(attr.ino, 1);
            mk(d, &format!("d{i}-{k}"));
        }
    }
    let before = fs.inode_count();

    let mut workers: Vec<(String, Box<dyn FnOnce() + Send>)> = Vec::new();
    let moved = Arc::new(AtomicU64::new(0));
    let exchanged = Arc::new(AtomicU64::new(0));
    for t in 0..4usize {
        let (fs, moved, exchanged) = (fs.clone(), moved.clone(), exchanged.clone());
        workers.push((
            format!("renamer-{t}"),
            Box::new(move || {
                // Each thread moves in the opposite direction of its neighbour
                // and mixes plain, no-replace and exchange renames of files and
                // directories, including moves between an ancestor and its
                // subdirectory (the case lock ordering by inode number alone gets wrong).
                let mut x = t as u64 * 7919 + 1;
                for i in 0..ITERS {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let (from, to) = if t % 2 == 0 {
                        (dirs[(x % 4) as usize], dirs[((x >> 8) % 4) as usize])
                    } else {
                        (dirs[((x >> 8) % 4) as usize], dirs[(x % 4) as usize])
                    };
                    let kind = if (x >> 16).is_multiple_of(2) {
                        'f'
                    } else {
                        'd'
                    };
                    let name = format!("{kind}{}-{}", (x >> 20) % 4, (x >> 24) % 4);
                    let other = format!("{kind}{}-{}", (x >> 32) % 4, (x >> 36) % 4);
                    // Names stay unique across the tree: a plain or no-replace
                    // move keeps the name, an exchange swaps two names' places.
                    let (newname, flags) = match (x >> 28) % 4 {
                        0 => (
                            &name,
                            RenameFlags {
                                noreplace: true,
                                exchange: false,
                            },
                        ),
                        1 => (
                            &other,
                            RenameFlags {
                                noreplace: false,
                                exchange: true,
                            },
                        ),
                        _ => (&name, RenameFlags::default()),
                    };
                    let r = fs.rename(from, name.as_bytes(), to, newname.as_bytes(), flags);
                    match r {
                        Ok(()) if flags.exchange && name != *newname => {
                            exchanged.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(()) if from != to => {
                            moved.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(()) | Err(Errno::ENOENT) | Err(Errno::EEXIST) => {}
                        Err(e) => panic!("rename {name} ({i}): {e:?}"),
                    }
                    // Readers of the same directories in between.
                    if i % 16 == 0 {
                        let _ = fs.lookup_noref(to, name.as_bytes());
                        let _ = list_chunked(&fs, from, 5);
                    }
                }
            }),
        ));
    }
    // Directory moves between the top-level directories, in both directions,
    // racing the file movers above (EINVAL when a move would create a cycle).
    for t in 0..2usize {
        let fs = fs.clone();
        workers.push((
            format!("dir-mover-{t}"),
            Box::new(move || {
                for i in 0..ITERS / 4 {
                    let (from, to) = if (i + t) % 2 == 0 { (a, b) } else { (b, a) };
                    match fs.rename(from, b"sub", to, b"moved-sub", RenameFlags::default()) {
                        Ok(()) => {
                            fs.rename(to, b"moved-sub", from, b"sub", RenameFlags::default())
                                .unwrap();
                        }
                        Err(Errno::ENOENT) | Err(Errno::EEXIST) => {}
                        Err(e) => panic!("dir move: {e:?}"),
                    }
                }
            }),
        ));
    }
    run_with_watchdog(Duration::from_secs(180), workers);
    // The mix really moved things around (thousands of each are typical).
    assert!(
        moved.load(Ordering::Relaxed) > 0,
        "no cross-directory move succeeded"
    );
    assert!(
        exchanged.load(Ordering::Relaxed) > 0,
        "no exchange succeeded"
    );

    // Nothing lost or duplicated: every name exists exactly once in the four
    // directories, and every directory's link count matches its subdirectories.
    let mut seen = BTreeSet::new();
    for &d in &dirs {
        let mut subdirs = 0;
        for name in &list_chunked(&fs, d, 1000)[2..] {
            if name == b"sub" {
                subdirs += 1;
                continue;
            }
            let attr = fs.lookup_noref(d, name).unwrap();
            if attr.kind == FileType::Directory {
                subdirs += 1;
            }
            assert!(seen.insert(name.clone()), "duplicate {name:?}");
        }
        assert_eq!(fs.getattr(d).unwrap().nlink, 2 + subdirs, "nlink of {d}");
    }
    assert_eq!(seen.len(), 4 * 4 * 2);
    assert_eq!(fs.inode_count(), before);
    assert_eq!(fs.lookup_noref(a, b"sub").unwrap().ino, a_sub);
    assert_eq!(fs.lookup_noref(b, b"sub").unwrap().ino, b_sub);
}

#[test]
fn unlinked_open_files_stay_readable_until_released_and_forgotten() {
    const READERS: usize = 4;
    let fs = fs();
    let data: Vec<u8> = (0..3 * PAGE_SIZE + 123).map(|i| (i % 251) as u8).collect();
    let (attr, _) = fs.create(C, ROOT_INO, b"doomed", 0o644, true).unwrap();
    let ino = attr.ino;
    fs.write(C, ino, 0, &data, false).unwrap();
    let free_before_data = fs.statfs().bfree + 4;
    let inodes_with = fs.inode_count();
    // Each reader holds its own handle; the creator's handle and reference go
    // away right after the unlink.
    for _ in 0..READERS {
        fs.open(ino, libc::O_RDONLY).unwrap();
    }
    let unlinked = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(READERS + 1));
    let mut workers: Vec<(String, Box<dyn FnOnce() + Send>)> = Vec::new();
    for r in 0..READERS {
        let (fs, data, unlinked, start) =
            (fs.clone(), data.clone(), unlinked.clone(), start.clone());
        workers.push((
            format!("reader-{r}"),
            Box::new(move || {
                start.wait();
                let mut reads_after_unlink = 0;
                let mut i = 0;
                // Read until the unlink has been seen, then a fixed number more.
                while reads_after_unlink < 200 {
                    let after = unlinked.load(Ordering::Acquire);
                    let off = (i * 97) % data.len();
                    let got = fs.read_vec(ino, off as u64, 4096).unwrap();
                    assert_eq!(got, &data[off..(off + 4096).min(data.len())]);
                    if after {
                        reads_after_unlink += 1;
                        assert_eq!(fs.getattr(ino).unwrap().nlink, 0);
                    }
                    i += 1;
                }
                fs.release(ino);
            }),
        ));
    }
    {
        let (fs, unlinked, start) = (fs.clone(), unlinked.clone(), start.clone());
        workers.push((
            "unlinker".into(),
            Box::new(move || {
                start.wait();
                fs.unlink(ROOT_INO, b"doomed").unwrap();
                unlinked.store(true, Ordering::Release);
                fs.release(ino);
            }),
        ));
    }
    run_with_watchdog(Duration::from_secs(60), workers);
    assert_eq!(fs.lookup_noref(ROOT_INO, b"doomed"), Err(Errno::ENOENT));
    // Every handle is closed, but the kernel still holds its reference from create.
    assert_eq!(fs.inode_count(), inodes_with);
    assert_eq!(fs.read_vec(ino, 0, 10).unwrap(), &data[..10]);
    fs.forget(ino, 1);
    assert_eq!(fs.inode_count(), inodes_with - 1);
    assert_eq!(fs.getattr(ino), Err(Errno::ENOENT));
    assert_eq!(
        fs.statfs().bfree,
        free_before_data,
        "pages of the freed file"
    );
}

#[test]
fn unlinked_open_file_is_writable_and_freed_on_last_release() {
    let fs = fs();
    let start = fs.inode_count();
    let (attr, _) = fs.create(C, ROOT_INO, b"f", 0o644, true).unwrap();
    fs.forget(attr.ino, 1); // the kernel's reference goes first this time
    fs.unlink(ROOT_INO, b"f").unwrap();
    fs.write(C, attr.ino, 10_000, b"still here", false).unwrap();
    assert_eq!(fs.read_vec(attr.ino, 10_000, 100).unwrap(), b"still here");
    assert_eq!(fs.getattr(attr.ino).unwrap().size, 10_010);
    assert_eq!(fs.inode_count(), start + 1);
    fs.release(attr.ino);
    assert_eq!(fs.inode_count(), start);
    assert_eq!(fs.statfs().bfree, fs.statfs().blocks);
    assert_eq!(fs.read_vec(attr.ino, 0, 1), Err(Errno::ENOENT));
}

/// The engine's side of "after a million create/unlink cycles the inode table
/// is back to its starting size": every path that takes a kernel reference
/// (create, lookup, readdirplus, link) is paired with a forget, in varying
/// orders relative to unlink and release.
#[test]
fn inode_table_returns_to_start_after_100k_cycles() {
    const CYCLES: usize = 100_000;
    const THREADS: usize = 4;
    let fs = fs();
    let dirs: Vec<u64> = (0..THREADS)
        .map(|t| {
            let a = fs
                .mkdir(C, ROOT_INO, format!("t{t}").as_bytes(), 0o755)
                .unwrap();
            fs.forget(a.ino, 1);
            a.ino
        })
        .collect();
    let start_inodes = fs.inode_count();
    let start_stat = fs.statfs();
    let mut workers: Vec<(String, Box<dyn FnOnce() + Send>)> = Vec::new();
    for (t, &dir) in dirs.iter().enumerate() {
        let fs = fs.clone();
        workers.push((
            format!("cycler-{t}"),
            Box::new(move || {
                for i in 0..CYCLES / THREADS {
                    let name = format!("f{}", i % 7);
                    let name = name.as_bytes();
                    let (attr, created) = fs.create(C, dir, name, 0o644, true).unwrap();
                    assert!(created);
                    let ino = attr.ino;
                    if i % 3 == 0 {
                        fs.write(C, ino, (i % 5) as u64 * 5000, b"x", false)
                            .unwrap();
                    }
                    match i % 5 {
                        0 => {
                            // Extra references through lookup, forgotten in one batch.
                            fs.lookup(dir, name).unwrap();
                            fs.lookup(dir, name).unwrap();
                            fs.unlink(dir, name).unwrap();
                            fs.release(ino);
                            fs.forget(ino, 3);
                        }
                        1 => {
                            // A second name, then renamed over the first's place.
                            fs.link(ino, dir, b"other").unwrap();
                            fs.forget(ino, 1);
                            fs.release(ino);
                            fs.forget(ino, 1);
                            fs.unlink(dir, name).unwrap();
                            fs.rename(dir, b"other", dir, name, RenameFlags::default())
                                .unwrap();
                            fs.unlink(dir, name).unwrap();
                        }
                        2 => {
                            // readdirplus references.
                            fs.release(ino);
                            let mut taken = 0;
                            fs.readdirplus(dir, 0, |e, _| {
                                if e.ino == ino {
                                    taken += 1;
                                }
                                true
                            })
                            .unwrap();
                            assert_eq!(taken, 1);
                            fs.unlink(dir, name).unwrap();
                            fs.forget(ino, 2);
                        }
                        3 => {
                            // Forget before unlink, release last.
                            fs.forget(ino, 1);
                            fs.unlink(dir, name).unwrap();
                            fs.release(ino);
                        }
                        _ => {
                            // Replaced by another file through rename.
                            let (b, _) = fs.create(C, dir, b"repl", 0o644, true).unwrap();
                            fs.release(b.ino);
                            fs.forget(b.ino, 1);
                            fs.release(ino);
                            fs.rename(dir, b"repl", dir, name, RenameFlags::default())
                                .unwrap();
                            fs.forget(ino, 1);
                            fs.unlink(dir, name).unwrap();
                        }
                    }
                }
            }),
        ));
    }
    run_with_watchdog(Duration::from_secs(170), workers);
    assert_eq!(fs.inode_count(), start_inodes, "inode table size");
    assert_eq!(fs.statfs(), start_stat, "statfs after the cycles");
    for &d in &dirs {
        assert_eq!(
            list_chunked(&fs, d, 100).len(),
            2,
            "directory left non-empty"
        );
    }
}

/// Operations that look upwards from a directory (`lookup(dir, "..")`, and
/// `readdirplus`, which returns the attributes of `..`) race operations that
/// lock a parent and then its child directory (renaming the child within its
/// parent, moving files between parent and child, removing the child's
/// siblings). The lock order is ancestor first; anything that holds a child
/// while waiting for its parent would deadlock here.
#[test]
fn upward_lookups_race_parent_then_child_lockers() {
    const ITERS: usize = 20_000;
    let fs = fs();
    let p = fs.mkdir(C, ROOT_INO, b"p", 0o755).unwrap();
    fs.forget(p.ino, 1);
    let x = fs.mkdir(C, p.ino, b"x", 0o755).unwrap();
    fs.forget(x.ino, 1);
    let (f, _) = fs.create(C, x.ino, b"f", 0o644, true).unwrap();
    fs.release(f.ino);
    fs.forget(f.ino, 1);
    let (p, x) = (p.ino, x.ino);
    let mut workers: Vec<(String, Box<dyn FnOnce() + Send>)> = Vec::new();
    for t in 0..2 {
        let fs = fs.clone();
        workers.push((
            format!("upward-{t}"),
            Box::new(move || {
                for i in 0..ITERS {
                    if (i + t) % 2 == 0 {
                        assert_eq!(fs.lookup_noref(x, b"..").unwrap().ino, p);
                    } else {
                        let mut refs = Vec::new();
                        fs.readdirplus(x, 0, |e, _| {
                            if e.name != b"." && e.name != b".." {
                                refs.push(e.ino);
                            }
                            true
                        })
                        .unwrap();
                        for r in refs {
                            fs.forget(r, 1);
                        }
                    }
                }
            }),
        ));
    }
    {
        let fs = fs.clone();
        workers.push((
            "parent-then-child".into(),
            Box::new(move || {
                for i in 0..ITERS {
                    match i % 3 {
                        // Same-directory rename of the child: locks p, then x.
                        0 => {
                            fs.rename(p, b"x", p, b"y", RenameFlags::default()).unwrap();
                            fs.rename(p, b"y", p, b"x", RenameFlags::default()).unwrap();
                        }
                        // Between parent and child: locks p, then x.
                        1 => {
                            fs.rename(x, b"f", p, b"f", RenameFlags::default()).unwrap();
                            fs.rename(p, b"f", x, b"f", RenameFlags::default()).unwrap();
                        }
                        // rmdir of a sibling: locks p, then the sibling.
                        _ => {
                            let s = fs.mkdir(C, p, b"s", 0o755).unwrap();
                            fs.forget(s.ino, 1);
                            fs.rmdir(p, b"s").unwrap();
                        }
                    }
                }
            }),
        ));
    }
    run_with_watchdog(Duration::from_secs(60), workers);
}

/// `rename(/x/y/z, /x)` with `x` a non-empty directory: the target is an
/// ancestor of the source's directory. Linux answers ENOTEMPTY; the engine
/// must decide so without locking `x` while it holds `y` (x's descendant),
/// which would deadlock against anyone walking down from `x`.
#[test]
fn rename_onto_an_ancestor_fails_without_deadlock() {
    const ITERS: usize = 20_000;
    let fs = fs();
    let x = fs.mkdir(C, ROOT_INO, b"x", 0o755).unwrap().ino;
    let y = fs.mkdir(C, x, b"y", 0o755).unwrap().ino;
    let z = fs.mkdir(C, y, b"z", 0o755).unwrap().ino;
    for i in [x, y, z] {
        fs.forget(i, 1);
    }
    let mut workers: Vec<(String, Box<dyn FnOnce() + Send>)> = Vec::new();
    {
        let fs = fs.clone();
        workers.push((
            "renamer".into(),
            Box::new(move || {
                for _ in 0..ITERS {
                    let r = fs.rename(y, b"z", ROOT_INO, b"x", RenameFlags::default());
                    assert_eq!(r, Err(Errno::ENOTEMPTY));
                }
            }),
        ));
    }
    for t in 0..2 {
        let fs = fs.clone();
        workers.push((
            format!("walker-{t}"),
            Box::new(move || {
                for _ in 0..ITERS {
                    assert_eq!(fs.lookup_noref(x, b"y").unwrap().ino, y);
                    assert_eq!(fs.lookup_noref(y, b"z").unwrap().ino, z);
                    let _ = list_chunked(&fs, x, 4);
                }
            }),
        ));
    }
    run_with_watchdog(Duration::from_secs(60), workers);
    assert_eq!(fs.lookup_noref(y, b"z").unwrap().ino, z);
}

/// Renaming over an existing name is atomic for lookups: someone looking the
/// target name up always finds either the old or the new node, never nothing.
#[test]
fn rename_over_is_atomic_for_concurrent_lookups() {
    const ROUNDS: usize = 200_000;
    let fs = fs();
    let a = fs.mkdir(C, ROOT_INO, b"a", 0o755).unwrap().ino;
    let b = fs.mkdir(C, ROOT_INO, b"b", 0o755).unwrap().ino;
    fs.forget(a, 1);
    fs.forget(b, 1);
    let mkfile = |fs: &Fs, dir: u64, name: &[u8]| {
        let (attr, _) = fs.create(C, dir, name, 0o644, true).unwrap();
        fs.release(attr.ino);
        fs.forget(attr.ino, 1);
    };
    mkfile(&fs, a, b"target");
    let done = Arc::new(AtomicBool::new(false));
    let mut workers: Vec<(String, Box<dyn FnOnce() + Send>)> = Vec::new();
    {
        let (fs, done) = (fs.clone(), done.clone());
        workers.push((
            "replacer".into(),
            Box::new(move || {
                for i in 0..ROUNDS {
                    // Alternate same-directory and cross-directory replacement.
                    let from = if i % 2 == 0 { a } else { b };
                    mkfile(&fs, from, b"tmp");
                    fs.rename(from, b"tmp", a, b"target", RenameFlags::default())
                        .unwrap();
                    if i % 3 == 0 {
                        // An exchange keeps the name present too.
                        mkfile(&fs, b, b"swap");
                        fs.rename(
                            b,
                            b"swap",
                            a,
                            b"target",
                            RenameFlags {
                                noreplace: false,
                                exchange: true,
                            },
                        )
                        .unwrap();
                        fs.unlink(b, b"swap").unwrap();
                    }
                }
                done.store(true, Ordering::Release);
            }),
        ));
    }
    for t in 0..2 {
        let (fs, done) = (fs.clone(), done.clone());
        workers.push((
            format!("looker-{t}"),
            Box::new(move || {
                let mut n = 0u64;
                while n < 1000 || !done.load(Ordering::Acquire) {
                    let attr = fs
                        .lookup(a, b"target")
                        .expect("target vanished during a rename");
                    assert_eq!(attr.kind, FileType::RegularFile);
                    assert_eq!(attr.nlink, 1, "half-done rename visible");
                    fs.forget(attr.ino, 1);
                    n += 1;
                }
            }),
        ));
    }
    run_with_watchdog(Duration::from_secs(120), workers);
    // Only the final target and the two directories (and the root) remain.
    assert_eq!(fs.inode_count(), 4);
}

/// Many threads doing random operations of every kind on a tiny tree, for a
/// fixed number of steps: no panic, no deadlock (watchdog), and afterwards a
/// consistent tree whose link counts and inode table match what is reachable.
#[test]
fn random_operation_mix_stays_consistent() {
    const THREADS: usize = 4;
    const STEPS: usize = 100_000;
    let fs = fs();
    let names: [&[u8]; 4] = [b"a", b"b", b"c", b"d"];
    let mut workers: Vec<(String, Box<dyn FnOnce() + Send>)> = Vec::new();
    for t in 0..THREADS {
        let fs = fs.clone();
        workers.push((
            format!("mixer-{t}"),
            Box::new(move || {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (t as u64 + 1);
                let mut rnd = move |n: u64| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % n
                };
                let mut open: Vec<u64> = Vec::new();
                for _ in 0..STEPS {
                    // A random directory: walk down up to two levels.
                    let pick_dir = |rnd: &mut dyn FnMut(u64) -> u64| {
                        let mut d = ROOT_INO;
                        for _ in 0..rnd(3) {
                            match fs.lookup_noref(d, names[rnd(4) as usize]) {
                                Ok(a) if a.kind == FileType::Directory => d = a.ino,
                                _ => break,
                            }
                        }
                        d
                    };
                    let d1 = pick_dir(&mut rnd);
                    let d2 = pick_dir(&mut rnd);
                    let n1 = names[rnd(4) as usize];
                    let n2 = names[rnd(4) as usize];
                    match rnd(14) {
                        0 | 1 => {
                            if let Ok((a, _)) = fs.create(C, d1, n1, 0o644, false) {
                                fs.forget(a.ino, 1);
                                open.push(a.ino);
                            }
                        }
                        2 | 3 => {
                            if let Ok(a) = fs.mkdir(C, d1, n1, 0o755) {
                                fs.forget(a.ino, 1);
                            }
                        }
                        4 => {
                            let _ = fs.unlink(d1, n1);
                        }
                        5 => {
                            let _ = fs.rmdir(d1, n1);
                        }
                        6 | 7 => {
                            let flags = match rnd(3) {
                                0 => RenameFlags::default(),
                                1 => RenameFlags {
                                    noreplace: true,
                                    exchange: false,
                                },
                                _ => RenameFlags {
                                    noreplace: false,
                                    exchange: true,
                                },
                            };
                            let _ = fs.rename(d1, n1, d2, n2, flags);
                        }
                        8 => {
                            if let Ok(a) = fs.lookup(d1, n1) {
                                if let Ok(l) = fs.link(a.ino, d2, n2) {
                                    fs.forget(l.ino, 1);
                                }
                                fs.forget(a.ino, 1);
                            }
                        }
                        9 => {
                            if let Ok(a) = fs.lookup(d1, b"..") {
                                fs.forget(a.ino, 1);
                            }
                        }
                        10 => {
                            let mut refs = Vec::new();
                            let _ = fs.readdirplus(d1, 0, |e, _| {
                                if e.name != b"." && e.name != b".." {
                                    refs.push(e.ino);
                                }
                                true
                            });
                            for r in refs {
                                fs.forget(r, 1);
                            }
                        }
                        11 => {
                            // d1 may have been removed since it was picked.
                            let _ = try_list_chunked(&fs, d1, 2);
                        }
                        12 => {
                            if let Some(&ino) = open.last() {
                                let _ = fs.write(C, ino, rnd(3 * 4096), b"data", false);
                                let _ = fs.setxattr(ino, b"user.x", b"1", XattrMode::Any);
                            }
                        }
                        _ => {
                            if !open.is_empty() {
                                let ino = open.swap_remove(rnd(open.len() as u64) as usize);
                                let _ = fs.read_vec(ino, 0, 100);
                                fs.release(ino);
                            }
                        }
                    }
                }
                for ino in open {
                    fs.release(ino);
                }
            }),
        ));
    }
    run_with_watchdog(Duration::from_secs(170), workers);

    // Walk the tree: link counts from structure, and nothing else alive.
    let mut names_of: HashMap<u64, u32> = HashMap::new();
    let mut stack = vec![ROOT_INO];
    let mut dirs = 0;
    let mut seen_dirs = std::collections::HashSet::new();
    while let Some(d) = stack.pop() {
        assert!(seen_dirs.insert(d), "directory {d} reachable twice");
        dirs += 1;
        let mut subdirs = 0;
        for name in &list_chunked(&fs, d, 1000)[2..] {
            let a = fs.lookup_noref(d, name).unwrap();
            if a.kind == FileType::Directory {
                subdirs += 1;
                assert_eq!(fs.lookup_noref(a.ino, b"..").unwrap().ino, d, "..");
                stack.push(a.ino);
            } else {
                *names_of.entry(a.ino).or_default() += 1;
            }
        }
        assert_eq!(
            fs.getattr(d).unwrap().nlink,
            2 + subdirs,
            "nlink of dir {d}"
        );
    }
    for (&ino, &n) in &names_of {
        assert_eq!(fs.getattr(ino).unwrap().nlink, n, "nlink of {ino}");
    }
    assert_eq!(
        fs.inode_count(),
        dirs + names_of.len(),
        "leaked or lost inodes"
    );
}

/// Readers never see half-updated metadata: while a writer appends whole
/// pages and truncates, every `getattr` has blocks that match its size
/// exactly, and every read sees a prefix of the pattern the writer keeps.
#[test]
fn attributes_are_never_half_updated() {
    const ROUNDS: usize = 3000;
    let fs = fs();
    let (attr, _) = fs.create(C, ROOT_INO, b"f", 0o644, true).unwrap();
    let ino = attr.ino;
    let done = Arc::new(AtomicBool::new(false));
    let page = |i: u64| vec![(i % 251) as u8 + 1; PAGE_SIZE];
    let mut workers: Vec<(String, Box<dyn FnOnce() + Send>)> = Vec::new();
    {
        let (fs, done) = (fs.clone(), done.clone());
        workers.push((
            "writer".into(),
            Box::new(move || {
                for i in 0..ROUNDS as u64 {
                    let size = fs.getattr(ino).unwrap().size;
                    fs.write(C, ino, 0, &page(size / PAGE_SIZE as u64), true)
                        .unwrap();
                    if i % 16 == 15 {
                        // Back to a page boundary, freeing the pages beyond it.
                        let keep = (i % 5) * PAGE_SIZE as u64;
                        let s = SetAttr {
                            size: Some(keep),
                            ..Default::default()
                        };
                        fs.setattr(C, ino, &s).unwrap();
                    }
                }
                done.store(true, Ordering::Release);
            }),
        ));
    }
    for t in 0..2 {
        let (fs, done) = (fs.clone(), done.clone());
        workers.push((
            format!("reader-{t}"),
            Box::new(move || {
                let mut n = 0;
                while n < 1000 || !done.load(Ordering::Acquire) {
                    let a = fs.getattr(ino).unwrap();
                    assert_eq!(a.blocks * 512, a.size, "size and blocks out of step");
                    let data = fs.read_vec(ino, 0, 64 * PAGE_SIZE).unwrap();
                    assert_eq!(data.len() % PAGE_SIZE, 0, "read a partial page");
                    for (i, chunk) in data.chunks(PAGE_SIZE).enumerate() {
                        assert!(chunk == page(i as u64), "page {i} torn or stale");
                    }
                    n += 1;
                }
            }),
        ));
    }
    run_with_watchdog(Duration::from_secs(120), workers);
    fs.release(ino);
    fs.forget(ino, 1);
}

/// An exchange of a file with a directory that holds a hard link to that
/// same file, racing listings of the directory. `readdirplus` holds the
/// directory while it reads each entry's attributes, so the rename must lock
/// the directory before the file whatever their inode numbers (it once
/// locked by inode number alone and deadlocked here).
#[test]
fn exchange_of_a_file_with_a_directory_holding_its_link_does_not_deadlock() {
    const ROUNDS: usize = 200_000;
    let fs = fs();
    // The file gets the lower inode number, the order that used to deadlock;
    // the second pair has it the other way round.
    let (f1, _) = fs.create(C, ROOT_INO, b"f1", 0o644, true).unwrap();
    fs.release(f1.ino);
    let d1 = fs.mkdir(C, ROOT_INO, b"d1", 0o755).unwrap();
    let d2 = fs.mkdir(C, ROOT_INO, b"d2", 0o755).unwrap();
    let (f2, _) = fs.create(C, ROOT_INO, b"f2", 0o644, true).unwrap();
    fs.release(f2.ino);
    assert!(f1.ino < d1.ino && d2.ino < f2.ino);
    fs.link(f1.ino, d1.ino, b"link").unwrap();
    fs.link(f2.ino, d2.ino, b"link").unwrap();
    let mut workers: Vec<(String, Box<dyn FnOnce() + Send>)> = Vec::new();
    for (t, (file, dir)) in [("f1", "d1"), ("f2", "d2")].into_iter().enumerate() {
        let fs2 = fs.clone();
        workers.push((
            format!("exchanger-{t}"),
            Box::new(move || {
                let flags = RenameFlags {
                    noreplace: false,
                    exchange: true,
                };
                for _ in 0..ROUNDS {
                    fs2.rename(ROOT_INO, file.as_bytes(), ROOT_INO, dir.as_bytes(), flags)
                        .unwrap();
                }
            }),
        ));
        for r in 0..2 {
            let fs2 = fs.clone();
            workers.push((
                format!("lister-{t}-{r}"),
                Box::new(move || {
                    for _ in 0..ROUNDS / 4 {
                        // Whichever name the directory has now; the other is the file.
                        for name in [file, dir] {
                            let Ok(a) = fs2.lookup_noref(ROOT_INO, name.as_bytes()) else {
                                continue;
                            };
                            // ENOTDIR when the name moved to the file meanwhile.
                            let _ = fs2.readdirplus(a.ino, 0, |_, _| true);
                        }
                    }
                }),
            ));
        }
    }
    run_with_watchdog(Duration::from_secs(120), workers);
    // An even number of exchanges: every name is back where it started.
    assert_eq!(fs.lookup_noref(ROOT_INO, b"f1").unwrap().ino, f1.ino);
    assert_eq!(fs.lookup_noref(ROOT_INO, b"d2").unwrap().ino, d2.ino);
}

/// Replay of a record that names a known inode number with another kind
/// installs a fresh node in its place. It once looked the number up and
/// installed while the table's read guard was still alive (a `match` on the
/// lookup), which deadlocked on the shard's write lock.
#[test]
fn replay_of_a_known_number_with_another_kind_replaces_the_node() {
    let fs = fs();
    let f = fs.create(C, ROOT_INO, b"f", 0o644, true).unwrap().0;
    let mut attr = f;
    attr.kind = FileType::Directory;
    attr.perm = 0o755;
    attr.size = 0;
    let fs2 = fs.clone();
    run_with_watchdog(
        Duration::from_secs(60),
        vec![(
            "replay".into(),
            Box::new(move || fs2.apply(&Mutation::SetAttr { attr })),
        )],
    );
    assert_eq!(fs.getattr(f.ino).unwrap().kind, FileType::Directory);
}
