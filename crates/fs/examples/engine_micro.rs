//! Create + 4 KiB write + unlink of small files, one thread, no snapshot:
//! the engine's hot paths that the snapshot gate and epoch check touch.
//! Uses only API older than snapshots, so the same file builds against the
//! engine before them for a comparison (docs/snapshots.md):
//!
//!     flock /tmp/memfs-bench.lock cargo run --release -p memfs-fs --example engine_micro

use std::time::Instant;

use memfs_fs::*;

const C: Ctx = Ctx::ROOT;

// The `memfs` binary's allocator, so that the figures are the engine's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let fs = Fs::new(Config {
        capacity: 8 << 30,
        max_inodes: 1 << 24,
    });
    let page = vec![7u8; 4096];
    let n = 200_000;
    let mut best = [f64::MAX; 3];
    for _ in 0..5 {
        let t = Instant::now();
        let mut inos = Vec::with_capacity(n);
        for i in 0..n {
            let (a, _) = fs
                .create(C, ROOT_INO, format!("m{i}").as_bytes(), 0o644, true)
                .unwrap();
            fs.release(a.ino);
            fs.forget(a.ino, 1);
            inos.push(a.ino);
        }
        let c = t.elapsed();
        let t = Instant::now();
        for &ino in &inos {
            fs.write(C, ino, 0, &page, false).unwrap();
        }
        let w = t.elapsed();
        let t = Instant::now();
        for i in 0..n {
            fs.unlink(ROOT_INO, format!("m{i}").as_bytes()).unwrap();
        }
        let u = t.elapsed();
        for (b, d) in best.iter_mut().zip([c, w, u]) {
            *b = b.min(d.as_nanos() as f64 / n as f64);
        }
    }
    println!(
        "engine, no snapshot, best of 5 x {n}: create {:.0} ns, write 4 KiB {:.0} ns, unlink {:.0} ns",
        best[0], best[1], best[2]
    );
}
