//! The block store (`memfs store`, sync durability) with its directory on
//! faultfs: blocks refused under faults with the journal's typed error, the
//! store stays at the previous block, and after a restart (every command is
//! a new process that recovers the store) every acknowledged block is there.

#![forbid(unsafe_code)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use common::{FaultFs, Rng, memfs_bin, seed};

fn store(dir: &Path, args: &[&str]) -> Output {
    let (sub, rest) = args.split_first().unwrap();
    Command::new(memfs_bin())
        .args(["store", sub, "-d"])
        .arg(dir)
        .args(rest)
        .output()
        .expect("run memfs store")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn current_block(dir: &Path) -> u64 {
    let o = store(dir, &["info"]);
    assert!(o.status.success(), "store info failed: {}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    out.lines()
        .find_map(|l| l.strip_prefix("block:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no block in store info:\n{out}"))
}

/// `alts`: values a key may also have (from blocks refused with EIO, whose
/// durability is unknown).
fn check_values(
    dir: &Path,
    model: &BTreeMap<String, String>,
    alts: &BTreeMap<String, Vec<String>>,
    what: &str,
) {
    let keys: Vec<&str> = model.keys().map(String::as_str).collect();
    let mut args = vec!["get", "--text"];
    args.extend(&keys);
    let o = store(dir, &args);
    assert!(o.status.success(), "{what}: store get failed: {}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    for (k, v) in model {
        let ok = std::iter::once(v)
            .chain(alts.get(k).into_iter().flatten())
            .any(|v| out.lines().any(|l| l == format!("{k}\t{v}")));
        assert!(ok, "{what}: key {k} should be {v:?}:\n{out}");
    }
}

/// A block of 1..8 operations on 8-byte keys, each value ~2 KiB (so the
/// journal needs fresh space every few blocks).
fn block(rng: &mut Rng, n: u64) -> Vec<(String, String)> {
    (0..1 + rng.below(8))
        .map(|_| {
            let k = format!("key{:05}", rng.below(64));
            let v = format!("b{n}-{}", "v".repeat(2000 + rng.below(100) as usize));
            (k, v)
        })
        .collect()
}

/// `unknown`: whether a refused block's durability is unknown (EIO: it may
/// be there after the restart, whole) or known (ENOSPC: it is not).
fn run(test: &str, fault: &str, want_err: &str, unknown: bool) {
    let seed = seed(test);
    let mut rng = Rng::new(seed);
    let ffs = FaultFs::start();
    let dir = ffs.mnt().join("store");
    let o = store(&dir, &["create", "--durability", "sync"]);
    assert!(o.status.success(), "store create: {}", text(&o));
    let mut model = BTreeMap::new();
    let mut block_id = current_block(&dir);
    let fault_at = 2 + rng.below(10);
    let mut refused = 0;
    let mut alts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for n in 1..=60u64 {
        if n == fault_at {
            ffs.ctl(fault);
        }
        let ops = block(&mut rng, n);
        let mut args = vec!["set".to_string(), "--text".to_string()];
        args.extend(ops.iter().map(|(k, v)| format!("{k}={v}")));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = store(&dir, &args);
        if o.status.success() {
            assert!(refused == 0 || n > fault_at, "block {n} acknowledged");
            block_id += 1;
            for (k, v) in ops {
                model.insert(k, v);
            }
            continue;
        }
        let msg = text(&o);
        assert!(n >= fault_at, "block {n} refused without a fault: {msg}");
        assert!(
            msg.to_lowercase().contains(want_err),
            "block {n} (seed {seed}) refused without the typed error {want_err:?}: {msg}"
        );
        assert!(!msg.contains("panicked"), "memfs store panicked: {msg}");
        refused += 1;
        for (k, v) in ops {
            alts.entry(k).or_default().push(v);
        }
        if refused == 3 {
            break;
        }
    }
    assert_eq!(
        refused, 3,
        "seed {seed}: the store refused {refused} blocks under {fault}"
    );
    ffs.ctl("clear");
    // Restart (a new process recovers the store): it stays at the last
    // acknowledged block, with every acknowledged value.
    let now = current_block(&dir);
    if unknown {
        assert!(
            (block_id..=block_id + refused).contains(&now),
            "seed {seed}: store at block {now}, acknowledged {block_id}, {refused} refused"
        );
        // Blocks beyond the acknowledged ones count from here on.
        block_id = now;
    } else {
        assert_eq!(
            now, block_id,
            "seed {seed}: the store moved past the refused blocks"
        );
        alts.clear();
    }
    check_values(&dir, &model, &alts, "after the faults");
    // And takes blocks again.
    let o = store(&dir, &["set", "--text", "key99999=after"]);
    assert!(
        o.status.success(),
        "a block after the faults were cleared: {}",
        text(&o)
    );
    assert_eq!(current_block(&dir), block_id + 1);
    model.insert("key99999".into(), "after".into());
    check_values(&dir, &model, &alts, "after a new block");
    eprintln!("{test}: seed {seed}: {block_id} blocks acknowledged, {refused} refused");
    ffs.stop();
}

#[test]
fn store_disk_full_refuses_blocks_with_no_space() {
    run("store_full", "full", "no space", false);
}

#[test]
fn store_eio_refuses_blocks_and_keeps_acknowledged() {
    run("store_eio", "fail fsync EIO", "input/output error", true);
}

/// A power cut under the store: every `memfs store set` that returned was
/// synced (sync durability), so after `crash` drops every byte faultfs has
/// not seen fsynced, the store reopens at the last acknowledged block with
/// every value, and takes blocks again.
#[test]
fn store_power_cut_keeps_every_acknowledged_block() {
    let seed = seed("store_power_cut");
    let mut rng = Rng::new(seed);
    let ffs = FaultFs::start();
    let dir = ffs.mnt().join("store");
    let o = store(&dir, &["create", "--durability", "sync"]);
    assert!(o.status.success(), "store create: {}", text(&o));
    let first = current_block(&dir);
    let blocks = 10 + rng.below(20);
    let mut model = BTreeMap::new();
    for n in 1..=blocks {
        let ops = block(&mut rng, n);
        let mut args = vec!["set".to_string(), "--text".to_string()];
        args.extend(ops.iter().map(|(k, v)| format!("{k}={v}")));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = store(&dir, &args);
        assert!(o.status.success(), "block {n} (seed {seed}): {}", text(&o));
        model.extend(ops);
    }
    ffs.ctl("crash");
    eprintln!(
        "store_power_cut: {}",
        ffs.status().trim().replace('\n', "; ")
    );
    assert_eq!(
        current_block(&dir),
        first + blocks,
        "seed {seed}: the store after a power cut"
    );
    check_values(&dir, &model, &BTreeMap::new(), "after a power cut");
    let o = store(&dir, &["set", "--text", "key99999=after"]);
    assert!(
        o.status.success(),
        "a block after the power cut: {}",
        text(&o)
    );
    ffs.stop();
}
