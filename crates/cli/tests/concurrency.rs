//! Concurrent namespace changes through the kernel: the exactly-once readdir
//! rule for entries that exist for the whole listing, and no deadlock.

mod common;

use std::collections::HashMap;
use std::fs;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::Mount;

#[test]
fn listing_while_others_create_rename_and_unlink() {
    let m = Mount::new();
    let dir = m.p("shared");
    fs::create_dir(&dir).unwrap();
    let stable: Vec<String> = (0..300).map(|i| format!("stable-{i}")).collect();
    for n in &stable {
        fs::write(dir.join(n), b"s").unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for t in 0..3 {
        let dir = dir.clone();
        let stop = stop.clone();
        writers.push(std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let a = dir.join(format!("w{t}-{}", i % 50));
                let b = dir.join(format!("r{t}-{}", i % 50));
                let _ = fs::write(&a, b"x");
                let _ = fs::rename(&a, &b);
                if i.is_multiple_of(3) {
                    let _ = fs::remove_file(&b);
                }
                i += 1;
            }
            i
        }));
    }
    for _round in 0..40 {
        let mut seen: HashMap<String, usize> = HashMap::new();
        for e in fs::read_dir(&dir).unwrap() {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            *seen.entry(name).or_default() += 1;
        }
        for n in &stable {
            assert_eq!(seen.get(n), Some(&1), "{n} must be listed exactly once");
        }
        assert!(seen.values().all(|&c| c == 1), "an entry was listed twice");
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        assert!(w.join().unwrap() > 0);
    }
    m.unmount();
}

#[test]
fn crossing_directory_renames_do_not_deadlock() {
    let m = Mount::new();
    for d in ["a", "b", "a/x", "b/y"] {
        fs::create_dir(m.p(d)).unwrap();
    }
    let mut threads = Vec::new();
    for t in 0..4 {
        let (from, to) = if t % 2 == 0 { ("a", "b") } else { ("b", "a") };
        let (src, dst) = (m.p(from), m.p(to));
        threads.push(std::thread::spawn(move || {
            for i in 0..500 {
                let name = format!("f{t}-{}", i % 10);
                let _ = fs::write(src.join(&name), b"");
                let _ = fs::rename(src.join(&name), dst.join(&name));
                // Directories moving both ways between a and b.
                let _ = fs::rename(src.join("x"), dst.join("x"));
                let _ = fs::rename(dst.join("y"), src.join("y"));
            }
        }));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    for t in threads {
        while !t.is_finished() {
            assert!(std::time::Instant::now() < deadline, "renames deadlocked");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        t.join().unwrap();
    }
    // Both directories still exist exactly once somewhere.
    let x = [m.p("a/x"), m.p("b/x")]
        .iter()
        .filter(|p| p.is_dir())
        .count();
    let y = [m.p("a/y"), m.p("b/y")]
        .iter()
        .filter(|p| p.is_dir())
        .count();
    assert_eq!((x, y), (1, 1));
    m.unmount();
}
