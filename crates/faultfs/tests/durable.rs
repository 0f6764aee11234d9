//! Durable memfs (`--durability sync`) with its data directory on faultfs:
//! seeded random operations through real system calls, faults at seeded
//! points, SIGKILL and restart with the faults cleared, then the tree must
//! be exactly what was acknowledged (issue 15 part 3).

mod common;

use std::collections::BTreeMap;
use std::io::{ErrorKind, Write};
use std::path::Path;

use common::{FaultFs, Memfs, Rng, seed};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    File(Vec<u8>),
    Dir,
}

type Tree = BTreeMap<String, Node>;

fn read_tree(root: &Path) -> Tree {
    let mut t = Tree::new();
    for e in std::fs::read_dir(root).expect("readdir on the memfs mount") {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        let node = if e.file_type().unwrap().is_dir() {
            Node::Dir
        } else {
            Node::File(std::fs::read(e.path()).expect("read a file on the memfs mount"))
        };
        t.insert(name, node);
    }
    t
}

fn describe(t: &Tree) -> String {
    t.iter()
        .map(|(k, v)| match v {
            Node::Dir => format!("{k}/"),
            Node::File(d) => format!("{k}:{}", d.len()),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn content(rng: &mut Rng) -> Vec<u8> {
    // Up to 96 KiB: one write(2) is one FUSE request, so it is atomic.
    let len = 1 + rng.below(96 << 10) as usize;
    let b = rng.next() as u8;
    (0..len).map(|i| b.wrapping_add((i / 7) as u8)).collect()
}

/// The first error of an operation: the model just before the failing call
/// and the model had it succeeded.
struct Failed {
    err: std::io::Error,
    before: Tree,
    would: Tree,
}

/// One mutation as a sequence of system calls, each applied to `model` as
/// soon as it is acknowledged.
fn step(root: &Path, model: &mut Tree, rng: &mut Rng, n: u64) -> Result<(), Failed> {
    let files: Vec<String> = model
        .iter()
        .filter(|(_, v)| matches!(v, Node::File(_)))
        .map(|(k, _)| k.clone())
        .collect();
    let pick = |rng: &mut Rng| files[rng.below(files.len() as u64) as usize].clone();
    let choice = if files.is_empty() { 0 } else { rng.below(10) };
    let before = model.clone();
    let fail = |err: std::io::Error, before: &Tree, change: &dyn Fn(&mut Tree)| {
        let mut would = before.clone();
        change(&mut would);
        Err(Failed {
            err,
            before: before.clone(),
            would,
        })
    };
    match choice {
        // Create a new file and write it.
        0..=3 => {
            let name = format!("f{n}");
            let data = content(rng);
            let mut f = match std::fs::File::create_new(root.join(&name)) {
                Ok(f) => f,
                Err(e) => {
                    return fail(e, &before, &|t| {
                        t.insert(name.clone(), Node::File(Vec::new()));
                    });
                }
            };
            model.insert(name.clone(), Node::File(Vec::new()));
            let at = model.clone();
            match f.write(&data) {
                Ok(k) => {
                    model.insert(name, Node::File(data[..k].to_vec()));
                }
                Err(e) => {
                    return fail(e, &at, &|t| {
                        t.insert(name.clone(), Node::File(data.clone()));
                    });
                }
            }
        }
        // Overwrite an existing file: O_TRUNC, then one write.
        4..=5 => {
            let name = pick(rng);
            let data = content(rng);
            let mut f = match std::fs::File::options()
                .write(true)
                .truncate(true)
                .open(root.join(&name))
            {
                Ok(f) => f,
                Err(e) => {
                    return fail(e, &before, &|t| {
                        t.insert(name.clone(), Node::File(Vec::new()));
                    });
                }
            };
            model.insert(name.clone(), Node::File(Vec::new()));
            let at = model.clone();
            match f.write(&data) {
                Ok(k) => {
                    model.insert(name, Node::File(data[..k].to_vec()));
                }
                Err(e) => {
                    return fail(e, &at, &|t| {
                        t.insert(name.clone(), Node::File(data.clone()));
                    });
                }
            }
        }
        6 => {
            let name = pick(rng);
            if let Err(e) = std::fs::remove_file(root.join(&name)) {
                return fail(e, &before, &|t| {
                    t.remove(&name);
                });
            }
            model.remove(&name);
        }
        7 => {
            let from = pick(rng);
            let to = format!("r{n}");
            if let Err(e) = std::fs::rename(root.join(&from), root.join(&to)) {
                return fail(e, &before, &|t| {
                    let v = t.remove(&from).unwrap();
                    t.insert(to.clone(), v);
                });
            }
            let v = model.remove(&from).unwrap();
            model.insert(to, v);
        }
        _ => {
            let name = format!("d{n}");
            if let Err(e) = std::fs::create_dir(root.join(&name)) {
                return fail(e, &before, &|t| {
                    t.insert(name.clone(), Node::Dir);
                });
            }
            model.insert(name, Node::Dir);
        }
    }
    Ok(())
}

fn assert_tree(root: &Path, want: &Tree, what: &str) {
    let got = read_tree(root);
    assert!(
        got == *want,
        "{what}: the tree differs from the acknowledged model\n got: {}\nwant: {}",
        describe(&got),
        describe(want)
    );
}

/// A full disk: every refused operation fails with ENOSPC and changes
/// nothing in memory; writes work again once the disk has room, without a
/// remount; after SIGKILL and restart, exactly the acknowledged tree.
#[test]
fn disk_full_is_enospc_and_memory_equals_durable() {
    let seed = seed("disk_full");
    let mut rng = Rng::new(seed);
    let ffs = FaultFs::start();
    let work = ffs.dir.path().canonicalize().unwrap();
    let data = ffs.mnt().join("data");
    let mp = work.join("m");
    let log = work.join("memfs.log");
    let mut m = Memfs::start(&mp, &data, &log);
    let mut model = Tree::new();
    let (mut acked, mut refused) = (0, 0);
    let full_at = 5 + rng.below(30);
    let mut n = 0;
    // Before the fault, then under a full disk until 5 refusals (bounded),
    // then with room again.
    let mut phase_full = false;
    let mut after_clear = 0;
    while n < 400 {
        n += 1;
        if !phase_full && refused == 0 && n == full_at {
            ffs.ctl("full");
            phase_full = true;
        }
        match step(&mp, &mut model, &mut rng, n) {
            Ok(()) => {
                acked += 1;
                if !phase_full && refused > 0 {
                    after_clear += 1;
                }
            }
            Err(Failed { err: e, before, .. }) => {
                assert_eq!(
                    e.raw_os_error(),
                    Some(libc::ENOSPC),
                    "op {n} (seed {seed}): a full disk must give ENOSPC, got {e}"
                );
                assert!(phase_full, "op {n}: {e} without a fault");
                model = before;
                refused += 1;
                // Memory must not run ahead of the journal.
                assert_tree(&mp, &model, &format!("after ENOSPC at op {n}"));
                if refused == 5 {
                    ffs.ctl("clear");
                    phase_full = false;
                }
            }
        }
        if refused >= 5 && after_clear >= 10 {
            break;
        }
    }
    assert_eq!(
        refused, 5,
        "seed {seed}: {n} ops, the full disk refused {refused}"
    );
    assert!(
        after_clear >= 10,
        "seed {seed}: only {after_clear} ops after space came back"
    );
    assert_tree(&mp, &model, "before the crash");
    m.kill();
    m.assert_no_panic();
    let m = Memfs::start(&mp, &data, &log);
    assert_tree(
        &mp,
        &model,
        &format!("after SIGKILL and restart (seed {seed})"),
    );
    m.assert_no_panic();
    eprintln!(
        "disk_full: seed {seed}: {acked} operations acknowledged, {refused} refused with ENOSPC"
    );
    drop(m);
    ffs.stop();
}

fn eio_run(test: &str, fault: &str) {
    let seed = seed(test);
    let mut rng = Rng::new(seed);
    let ffs = FaultFs::start();
    let work = ffs.dir.path().canonicalize().unwrap();
    let data = ffs.mnt().join("data");
    let mp = work.join("m");
    let log = work.join("memfs.log");
    let mut m = Memfs::start(&mp, &data, &log);
    let mut model = Tree::new();
    let fault_at = 3 + rng.below(40);
    let mut uncertain: Option<Tree> = None;
    let mut n = 0;
    while n < 200 {
        n += 1;
        if n == fault_at {
            ffs.ctl(fault);
        }
        let mut after = model.clone();
        match step(&mp, &mut after, &mut rng, n) {
            Ok(()) => {
                assert!(uncertain.is_none());
                model = after;
            }
            Err(Failed {
                err: e,
                before,
                would,
            }) => {
                assert!(n >= fault_at, "op {n}: {e} before the fault");
                assert_eq!(
                    e.raw_os_error(),
                    Some(libc::EIO),
                    "op {n} (seed {seed}): an I/O error must give EIO, got {e}"
                );
                // The calls before the failing one were acknowledged; the
                // failing call's durability is unknown: either state is right.
                model = before;
                uncertain = Some(would);
                break;
            }
        }
    }
    assert!(
        uncertain.is_some(),
        "seed {seed}: no EIO within {n} ops ({fault})"
    );
    // Read-only now: every mutation is EROFS, reads are served.
    for (i, r) in [
        std::fs::create_dir(mp.join("after-eio-dir")),
        std::fs::write(mp.join("after-eio-file"), b"x"),
    ]
    .into_iter()
    .enumerate()
    {
        let e = r.expect_err("a mutation after an I/O error must fail");
        assert_eq!(
            e.raw_os_error(),
            Some(libc::EROFS),
            "mutation {i} after EIO (seed {seed}): {e}"
        );
        assert_ne!(e.kind(), ErrorKind::NotFound);
    }
    let shown = read_tree(&mp);
    let alt = uncertain.unwrap();
    assert!(
        shown == model || shown == alt,
        "read-only mount (seed {seed}) shows {}\nacknowledged: {}",
        describe(&shown),
        describe(&model)
    );
    ffs.ctl("clear");
    m.kill();
    m.assert_no_panic();
    let m = Memfs::start(&mp, &data, &log);
    let got = read_tree(&mp);
    assert!(
        got == model || got == alt,
        "after SIGKILL and restart (seed {seed}, {fault}):\n got: {}\nwant: {}\n  or: {}",
        describe(&got),
        describe(&model),
        describe(&alt)
    );
    // Writable again after the restart.
    std::fs::write(mp.join("after-restart"), b"ok").expect("write after restart");
    m.assert_no_panic();
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(
        log_text.contains("read-only"),
        "the server did not log why it turned read-only:\n{log_text}"
    );
    eprintln!(
        "{test}: seed {seed}: EIO at op {n}, {} entries acknowledged",
        model.len()
    );
    drop(m);
    ffs.stop();
}

/// EIO on the journal's fsync: the op gets EIO, the mount turns read-only,
/// and after SIGKILL + restart everything acknowledged is there.
#[test]
fn fsync_eio_turns_read_only_and_keeps_acknowledged() {
    eio_run("fsync_eio", "fail fsync EIO");
}

/// The same with EIO on write.
#[test]
fn write_eio_turns_read_only_and_keeps_acknowledged() {
    eio_run("write_eio", "fail write EIO");
}

/// A power cut under a `sync` mount: SIGKILL the server, then drop every
/// byte faultfs has not seen fsynced (`crash`); the restart must still
/// show exactly the acknowledged tree, since sync mode acknowledges only
/// after the journal's fsync.
#[test]
fn power_cut_keeps_everything_acknowledged_in_sync_mode() {
    let seed = seed("power_cut");
    let mut rng = Rng::new(seed);
    let ffs = FaultFs::start();
    let work = ffs.dir.path().canonicalize().unwrap();
    let data = ffs.mnt().join("data");
    let mp = work.join("m");
    let log = work.join("memfs.log");
    let mut m = Memfs::start(&mp, &data, &log);
    let mut model = Tree::new();
    for n in 1..=40 {
        if let Err(f) = step(&mp, &mut model, &mut rng, n) {
            panic!("op {n} (seed {seed}) failed without a fault: {}", f.err);
        }
    }
    m.kill();
    ffs.ctl("crash");
    eprintln!("power_cut: {}", ffs.status().trim().replace('\n', "; "));
    let m = Memfs::start(&mp, &data, &log);
    assert_tree(&mp, &model, &format!("after a power cut (seed {seed})"));
    m.assert_no_panic();
    drop(m);
    ffs.stop();
}
