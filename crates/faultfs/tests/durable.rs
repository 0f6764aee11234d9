//! Durable memfs (`--durability sync`) with its data directory on faultfs:
//! seeded random operations through real system calls, faults at seeded
//! points, SIGKILL and restart with the faults cleared, then the tree must
//! be exactly what was acknowledged (issue 15 part 3).

#![forbid(unsafe_code)]

mod common;

use std::io::ErrorKind;

use common::ops::{Failed, Tree, assert_tree, describe, read_tree, step};
use common::{Memfs, Rng, Stack, seed};

/// A full disk: every refused operation fails with ENOSPC and changes
/// nothing in memory; writes work again once the disk has room, without a
/// remount; after SIGKILL and restart, exactly the acknowledged tree.
#[test]
fn disk_full_is_enospc_and_memory_equals_durable() {
    let seed = seed("disk_full");
    let mut rng = Rng::new(seed);
    let (Stack { ffs, data, mp, log }, mut m) = Stack::start("sync");
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

/// Runs the memfs binary; its standard output (it must succeed).
fn memfs(args: &[&str]) -> String {
    let out = std::process::Command::new(common::memfs_bin())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "memfs {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn eio_run(test: &str, fault: &str, clean_stop: bool) {
    let seed = seed(test);
    let mut rng = Rng::new(seed);
    let (Stack { ffs, data, mp, log }, mut m) = Stack::start("sync");
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
    // Reported by `memfs status` while mounted.
    let st = memfs(&["status", mp.to_str().unwrap()]);
    assert!(st.contains("state: READ-ONLY"), "memfs status:\n{st}");
    ffs.ctl("clear");
    if clean_stop {
        // A clean stop writes the READ-ONLY marker (the disk works again),
        // which fsck and an offline status report.
        m.stop();
        m.assert_no_panic();
        let out = memfs(&["fsck", "--data-dir", data.to_str().unwrap()]);
        assert!(out.contains("turned READ-ONLY"), "memfs fsck:\n{out}");
        let out = memfs(&["status", "--data-dir", data.to_str().unwrap()]);
        assert!(out.contains("turned READ-ONLY"), "memfs status:\n{out}");
    } else {
        m.kill();
        m.assert_no_panic();
    }
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
    eio_run("fsync_eio", "fail fsync EIO", true);
}

/// The same with EIO on write.
#[test]
fn write_eio_turns_read_only_and_keeps_acknowledged() {
    eio_run("write_eio", "fail write EIO", false);
}

/// A power cut under a `sync` mount: SIGKILL the server, then drop every
/// byte faultfs has not seen fsynced (`crash`); the restart must still
/// show exactly the acknowledged tree, since sync mode acknowledges only
/// after the journal's fsync.
#[test]
fn power_cut_keeps_everything_acknowledged_in_sync_mode() {
    let seed = seed("power_cut");
    let mut rng = Rng::new(seed);
    let (Stack { ffs, data, mp, log }, mut m) = Stack::start("sync");
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

/// Sends one request to the control socket of the memfs serving `data`;
/// returns the whole reply (`ok` then lines, or `error MESSAGE`).
fn control(data: &std::path::Path, req: &str) -> String {
    use std::io::{Read, Write};
    let mut c = std::os::unix::net::UnixStream::connect(data.join("control.sock"))
        .expect("connect to the control socket");
    c.write_all(format!("{req}\n").as_bytes()).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut reply = String::new();
    c.read_to_string(&mut reply).unwrap();
    reply
}

/// EIO on a checkpoint's fsync turns the mount read-only, as EIO on the
/// journal does (after a failed fsync the kernel may have dropped dirty
/// pages anywhere in the directory). The journal is idle and synced (sync
/// mode), so the checkpoint's fsyncs are the only ones that fail; every
/// acknowledged operation is there after SIGKILL and restart.
#[test]
fn checkpoint_fsync_eio_turns_read_only_and_keeps_acknowledged() {
    let seed = seed("checkpoint_eio");
    let mut rng = Rng::new(seed);
    let (Stack { ffs, data, mp, log }, mut m) = Stack::start("sync");
    let mut model = Tree::new();
    for n in 1..=20 {
        if let Err(f) = step(&mp, &mut model, &mut rng, n) {
            panic!("op {n} (seed {seed}) failed without a fault: {}", f.err);
        }
    }
    assert!(control(&data, "status").contains("read_only=no"));
    ffs.ctl("fail fsync EIO");
    let reply = control(&data, "checkpoint");
    assert!(
        reply.starts_with("error "),
        "a checkpoint whose fsync fails must fail, got {reply:?}"
    );
    let status = control(&data, "status");
    assert!(
        status.contains("read_only=yes") && status.contains("checkpoint"),
        "status after a checkpoint EIO: {status:?}"
    );
    let e = std::fs::create_dir(mp.join("after-eio")).expect_err("read-only");
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "mkdir: {e}");
    assert_tree(&mp, &model, &format!("read-only (seed {seed})"));
    m.kill();
    ffs.ctl("clear");
    let m = Memfs::start(&mp, &data, &log);
    assert_tree(&mp, &model, &format!("after restart (seed {seed})"));
    std::fs::create_dir(mp.join("writable-again")).expect("writable after restart");
    m.assert_no_panic();
    drop(m);
    ffs.stop();
}
