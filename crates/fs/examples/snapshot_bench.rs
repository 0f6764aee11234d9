//! Figures for docs/snapshots.md (issue 12): snapshot of a big tree, memory
//! of an unchanged snapshot, first writes after one, rollback and clone.
//!
//!     flock /tmp/memfs-bench.lock cargo run --release -p memfs-fs \
//!         --example snapshot_bench -- [FILES] [DATA_MIB] [WRITE_ROUNDS] [BIG_MIB]
//!
//! BIG_MIB (default 1024) is the size of one big file, written last: the
//! first write to it after a snapshot (which preserves the whole file) and
//! a rollback restoring it are the O(page table) costs of issue 12.
//!
//! `engine_micro` is the no-snapshot comparison with the engine before
//! snapshots.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use memfs_fs::*;

const C: Ctx = Ctx::ROOT;

// The `memfs` binary's allocator, so that the figures are the engine's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let mut args = std::env::args().skip(1);
    let files: u64 = args
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let data_mib: u64 = args.next().and_then(|v| v.parse().ok()).unwrap_or(1024);
    let rounds: usize = args.next().and_then(|v| v.parse().ok()).unwrap_or(5);
    let big_mib: u64 = args.next().and_then(|v| v.parse().ok()).unwrap_or(1024);
    let fs = Arc::new(Fs::new(Config {
        capacity: 64 << 30,
        max_inodes: 1 << 26,
    }));
    // The tree: FILES empty files in directories of 1000, plus DATA_MIB MiB
    // in 1 MiB files.
    let t = Instant::now();
    let dirs = files.div_ceil(1000);
    let mut inos = Vec::with_capacity(files as usize);
    for d in 0..dirs {
        let dir = fs
            .mkdir(C, ROOT_INO, format!("d{d}").as_bytes(), 0o755)
            .unwrap();
        for i in 0..1000.min(files - d * 1000) {
            let (a, _) = fs
                .create(C, dir.ino, format!("f{i}").as_bytes(), 0o644, true)
                .unwrap();
            fs.release(a.ino);
            fs.forget(a.ino, 1);
            inos.push(a.ino);
        }
    }
    let data = fs.mkdir(C, ROOT_INO, b"data", 0o755).unwrap();
    let chunk = vec![0x5au8; 1 << 20];
    let mut big = Vec::new();
    for i in 0..data_mib {
        let (a, _) = fs
            .create(C, data.ino, format!("b{i}").as_bytes(), 0o644, true)
            .unwrap();
        fs.write(C, a.ino, 0, &chunk, false).unwrap();
        fs.release(a.ino);
        fs.forget(a.ino, 1);
        big.push(a.ino);
    }
    println!(
        "tree: {files} files, {data_mib} MiB data, built in {:.0} ms, rss {} MiB",
        ms(t.elapsed()),
        rss_kib() / 1024
    );

    // A writer running through the snapshots: its slowest write is the stall.
    let (w, _) = fs.create(C, ROOT_INO, b"writer", 0o644, true).unwrap();
    fs.release(w.ino);
    fs.forget(w.ino, 1);
    let stop = Arc::new(AtomicBool::new(false));
    let worst = Arc::new(AtomicU64::new(0));
    let writer = {
        let (fs, stop, worst) = (fs.clone(), stop.clone(), worst.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            let mut i = 0usize;
            while !stop.load(Ordering::Acquire) {
                let t = Instant::now();
                fs.write(C, w.ino, 4096 * (i as u64 % 256), b"w", false)
                    .unwrap();
                worst.fetch_max(t.elapsed().as_nanos() as u64, Ordering::AcqRel);
                i += 1;
                n += 1;
            }
            n
        })
    };
    // Let the writer start first.
    while worst.load(Ordering::Acquire) == 0 {
        std::thread::yield_now();
    }
    worst.store(0, Ordering::Release);
    let rss0 = rss_kib();
    let mut create = Vec::new();
    for k in 0..10 {
        let t = Instant::now();
        fs.snapshot_create(format!("s{k}").as_bytes()).unwrap();
        create.push(ms(t.elapsed()));
    }
    stop.store(true, Ordering::Release);
    let writes = writer.join().unwrap();
    create.sort_by(f64::total_cmp);
    println!(
        "snapshot_create x10: median {:.3} ms, max {:.3} ms; concurrent writer: {writes} writes, slowest {:.3} ms",
        create[5],
        create[9],
        worst.load(Ordering::Acquire) as f64 / 1e6
    );
    for k in 0..10 {
        fs.snapshot_delete(format!("s{k}").as_bytes()).unwrap();
    }
    // Memory of snapshots with nothing changed after them.
    let before = rss_kib();
    for k in 0..100 {
        fs.snapshot_create(format!("u{k}").as_bytes()).unwrap();
    }
    let after = rss_kib();
    let info = fs.snapshot_by_name(b"u0").unwrap();
    println!(
        "100 unchanged snapshots: rss +{} KiB (rss before the first {} MiB); snapshot_list says {} nodes, {} bytes each",
        after.saturating_sub(before),
        rss0 / 1024,
        info.nodes,
        info.bytes
    );
    for k in 0..100 {
        fs.snapshot_delete(format!("u{k}").as_bytes()).unwrap();
    }

    // First writes after a snapshot: 4 KiB to each page of the data, with
    // and without a snapshot.
    let pages = data_mib * 256;
    let page = vec![1u8; 4096];
    let pass = |fs: &Fs| {
        let t = Instant::now();
        for &ino in &big {
            for p in 0..256u64 {
                fs.write(C, ino, p * 4096, &page[..], false).unwrap();
            }
        }
        t.elapsed()
    };
    // Five rounds of: a pass with no snapshot, then a snapshot and a pass
    // (each write the first to its page since the snapshot), the snapshot
    // deleted. The first round pays page faults of fresh memory; later ones
    // reuse what the deleted snapshots gave back. Best rounds quoted: the
    // machine is shared.
    let (mut plain, mut cow, mut cold) = (Duration::MAX, Duration::MAX, Duration::ZERO);
    for r in 0..rounds.max(1) {
        plain = plain.min(pass(&fs));
        fs.snapshot_create(b"w").unwrap();
        let c = pass(&fs);
        if r == 0 {
            cold = c;
        }
        cow = cow.min(c);
        fs.snapshot_delete(b"w").unwrap();
    }
    let per = |d: Duration| d.as_nanos() as f64 / pages.max(1) as f64;
    println!(
        "4 KiB writes over {pages} pages, best of {rounds}: {:.0} ns/page without a snapshot, {:.0} ns/page first after one ({:.2}x the rate); first round (fresh memory) {:.0} ns/page",
        per(plain),
        per(cow),
        plain.as_secs_f64() / cow.as_secs_f64(),
        per(cold)
    );

    // Rollback after changing 1 % of the files (a write each).
    fs.snapshot_create(b"base").unwrap();
    let changed = (files / 100).max(1);
    for &ino in inos
        .iter()
        .step_by((files / changed) as usize)
        .take(changed as usize)
    {
        fs.write(C, ino, 0, b"changed", false).unwrap();
    }
    let t = Instant::now();
    let out = fs.rollback_to_snapshot(b"base").unwrap();
    println!(
        "rollback after writing {changed} of {files} files: {:.1} ms ({} nodes changed)",
        ms(t.elapsed()),
        out.changed.len()
    );
    // Lazy clone: O(1); then the first use (a lookup and a read of 1 MiB),
    // the first full walk (copies every node: the cost moved there) and
    // a second one.
    let mut times = Vec::new();
    for _ in 0..4 {
        let t = Instant::now();
        drop(fs.clone_snapshot(b"base", fs.config()).unwrap());
        times.push(format!("{:.3}", ms(t.elapsed())));
    }
    println!(
        "clone_snapshot and drop, unused, 4 times: {} ms",
        times.join(", ")
    );
    let t = Instant::now();
    let clone = fs.clone_snapshot(b"base", fs.config()).unwrap();
    let took = t.elapsed();
    let t = Instant::now();
    let mut buf = vec![0u8; 1 << 20];
    let path = if data_mib > 0 { "/data/b0" } else { "/d0/f0" };
    let f = clone.resolve(ROOT_INO, path, false).unwrap();
    let first = clone.read(f, 0, &mut buf).unwrap();
    let use_ms = ms(t.elapsed());
    println!(
        "clone_snapshot of the whole tree: {:.3} ms; first lookup + read ({first} bytes): {use_ms:.3} ms",
        ms(took)
    );
    let t = Instant::now();
    let n = clone.inode_count();
    println!(
        "first full walk of the clone (copies {n} nodes): {:.0} ms",
        ms(t.elapsed())
    );
    let t = Instant::now();
    clone.inode_count();
    println!("second full walk: {:.0} ms", ms(t.elapsed()));
    let t = Instant::now();
    drop(clone);
    println!("dropping the clone: {:.0} ms", ms(t.elapsed()));
    // Deleting a snapshot a lazy clone still reads makes the clone whole.
    fs.snapshot_create(b"c").unwrap();
    // A writer in the clone meanwhile: its slowest write is the clone's
    // stall while the deletion makes it whole.
    let clone = Arc::new(fs.clone_snapshot(b"c", fs.config()).unwrap());
    let (w, _) = clone.create(C, ROOT_INO, b"w", 0o644, true).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (clone, stop) = (clone.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut worst = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                clone.write(C, w.ino, 0, b"w", false).unwrap();
                worst = worst.max(t.elapsed());
            }
            worst
        })
    };
    let t = Instant::now();
    fs.snapshot_delete(b"c").unwrap();
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let worst = writer.join().unwrap();
    println!(
        "snapshot_delete with a lazy clone reading it (copies {} nodes): {:.0} ms, slowest write in the clone meanwhile {:.0} ms",
        clone.inode_count(),
        ms(took),
        ms(worst)
    );
    drop(clone);
    let t = Instant::now();
    fs.snapshot_delete(b"base").unwrap();
    println!("snapshot_delete: {:.1} ms", ms(t.elapsed()));
    if big_mib > 0 {
        big_file(&fs, big_mib, rounds);
    }
}

/// One file of `mib` MiB: the first 4 KiB write to it after a snapshot
/// (it preserves the whole file: the write stall), a second write to
/// another page, and a rollback restoring the file after one page changed.
fn big_file(fs: &Fs, mib: u64, rounds: usize) {
    let (a, _) = fs.create(C, ROOT_INO, b"big", 0o644, true).unwrap();
    fs.release(a.ino);
    fs.forget(a.ino, 1);
    let chunk = vec![0x6bu8; 1 << 20];
    for m in 0..mib {
        fs.write(C, a.ino, m << 20, &chunk, false).unwrap();
    }
    let page = vec![2u8; 4096];
    let pages = mib * 256;
    let (mut first, mut second) = (Vec::new(), Vec::new());
    for r in 0..rounds.max(1) as u64 {
        fs.snapshot_create(b"big").unwrap();
        let t = Instant::now();
        fs.write(C, a.ino, (r * 7919 % pages) * 4096, &page, false)
            .unwrap();
        first.push(ms(t.elapsed()));
        let t = Instant::now();
        fs.write(
            C,
            a.ino,
            ((r * 7919 + pages / 2) % pages) * 4096,
            &page,
            false,
        )
        .unwrap();
        second.push(ms(t.elapsed()));
        fs.snapshot_delete(b"big").unwrap();
    }
    first.sort_by(f64::total_cmp);
    second.sort_by(f64::total_cmp);
    println!(
        "big file of {mib} MiB, {} rounds: first 4 KiB write after a snapshot median {:.3} ms (min {:.3}, max {:.3}); a second write to another page median {:.3} ms",
        first.len(),
        first[first.len() / 2],
        first[0],
        first[first.len() - 1],
        second[second.len() / 2]
    );
    fs.snapshot_create(b"bigbase").unwrap();
    fs.write(C, a.ino, 4096, &page, false).unwrap();
    let t = Instant::now();
    let out = fs.rollback_to_snapshot(b"bigbase").unwrap();
    let took = t.elapsed();
    let t = Instant::now();
    fs.snapshot_delete(b"bigbase").unwrap();
    println!(
        "rollback restoring the big file after one page changed: {:.3} ms ({} nodes); snapshot_delete after it {:.3} ms",
        ms(took),
        out.changed.len(),
        ms(t.elapsed())
    );
}
