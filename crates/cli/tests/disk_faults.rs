//! Durable mounts (`--durability sync`) whose data directory sits on a real
//! file system that misbehaves under them (issue 15 part 2): a small tmpfs
//! that fills up, and an ext4 that the kernel turns read-only after an
//! error. Needs root (mount, loop devices); each step is bounded to
//! seconds, and every mount is detached in Drop guards (panics included).

mod common;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{Mount, have, memfs_bin, poll_until};

fn run(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A file system of ours on a temporary directory, lazily unmounted on
/// drop (a server still holding files there lets go when it dies).
struct Disk {
    dir: tempfile::TempDir,
    image: Option<PathBuf>,
}

impl Disk {
    fn tmpfs(size: &str) -> Option<Disk> {
        let dir = tempfile::tempdir().unwrap();
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path()))
        .then_some(Disk { dir, image: None })
    }

    /// ext4 on a loop device, `errors=remount-ro`: an error makes the kernel
    /// remount it read-only at once, whatever is open for writing (a plain
    /// `mount -o remount,ro` is refused with EBUSY while memfs holds its
    /// journal open, on tmpfs as on any file system).
    fn ext4(mib: u64) -> Option<Disk> {
        if !have("mkfs.ext4") || !have("e2fsck") {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let image = std::env::temp_dir().join(format!(
            "memfs-disk-faults-{}-{}.img",
            std::process::id(),
            dir.path().file_name().unwrap().to_string_lossy()
        ));
        let d = Disk {
            dir,
            image: Some(image.clone()),
        };
        File::create(&image).unwrap().set_len(mib << 20).unwrap();
        if !run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image)) {
            return None;
        }
        d.mount_ext4().then_some(d)
    }

    fn mount_ext4(&self) -> bool {
        run(Command::new("mount")
            .args(["-o", "loop,errors=remount-ro"])
            .arg(self.image.as_ref().unwrap())
            .arg(self.dir.path()))
    }

    fn path(&self) -> PathBuf {
        self.dir.path().canonicalize().unwrap()
    }

    /// What `ext4_error` does on a real failure: the kernel's emergency
    /// read-only remount (through the file system's sysfs test trigger).
    fn ext4_error(&self) {
        let src = Command::new("findmnt")
            .args(["-no", "SOURCE"])
            .arg(self.dir.path())
            .output()
            .unwrap();
        let src = String::from_utf8(src.stdout).unwrap();
        let dev = Path::new(src.trim()).file_name().unwrap().to_owned();
        std::fs::write(
            Path::new("/sys/fs/ext4").join(dev).join("trigger_fs_error"),
            "memfs disk_faults test\n",
        )
        .expect("trigger an ext4 error");
    }

    /// After the error: unmount, repair and mount it writable again.
    fn ext4_repair(&self) {
        assert!(run(Command::new("umount").arg(self.dir.path())));
        // Exit code 1: errors corrected, which is what we expect.
        let st = Command::new("e2fsck")
            .arg("-fy")
            .arg(self.image.as_ref().unwrap())
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(st.code().is_some_and(|c| c <= 1), "e2fsck: {st}");
        assert!(self.mount_ext4(), "mount the repaired ext4");
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .stderr(Stdio::null())
            .status();
        if let Some(i) = &self.image {
            let _ = std::fs::remove_file(i);
        }
    }
}

fn start(data: &Path, log: &Path) -> Mount {
    start_env(data, log, &[])
}

/// [`start`] with `env` added to the server's environment.
fn start_env(data: &Path, log: &Path, env: &[(&str, &str)]) -> Mount {
    Mount::spawn_logged(
        &["--data-dir", data.to_str().unwrap(), "--durability", "sync"],
        log,
        env,
    )
}

/// A 48 MiB ext4 that can be made to fail, a data directory on it and a
/// log file for the server beside it (kept while the directory lives);
/// None, saying why, where loop devices cannot be used.
fn failing_disk() -> Option<(Disk, PathBuf, tempfile::TempDir, PathBuf)> {
    let Some(disk) = Disk::ext4(48) else {
        eprintln!("SKIPPED: cannot make and mount an ext4 on a loop device (needs root)");
        return None;
    };
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("memfs.log");
    let data = disk.path().join("data");
    Some((disk, data, logs, log))
}

type Tree = BTreeMap<String, Vec<u8>>;

/// Names and contents of the regular files at the root of `m`.
fn listing(m: &Mount) -> Tree {
    std::fs::read_dir(m.path())
        .expect("readdir")
        .map(|e| {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            (name, std::fs::read(e.path()).expect("read a file"))
        })
        .collect()
}

fn describe(t: &Tree) -> String {
    let names: Vec<String> = t.iter().map(|(k, v)| format!("{k}:{}", v.len())).collect();
    format!("{} files: {}", t.len(), names.join(" "))
}

fn pattern(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 31 + j / 512) as u8).collect()
}

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

fn status(args: &[&str]) -> String {
    let out = Command::new(memfs_bin())
        .arg("status")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "memfs status {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn assert_no_panic(log: &Path) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert!(!text.contains("panicked"), "the server panicked:\n{text}");
}

/// A 24 MiB tmpfs under a sync mount fills up: every refusal is ENOSPC
/// (never EIO), what is listed is exactly what was acknowledged, a restart
/// after SIGKILL shows the same, and once a filler file on the tmpfs is
/// deleted writes work again without a remount.
#[test]
fn a_small_tmpfs_that_fills_up_gives_enospc_and_recovers_by_itself() {
    let Some(disk) = Disk::tmpfs("24m") else {
        eprintln!("SKIPPED: cannot mount a tmpfs (needs root)");
        return;
    };
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("memfs.log");
    let filler = disk.path().join("filler");
    std::fs::write(&filler, vec![9u8; 6 << 20]).unwrap();
    let data = disk.path().join("data");
    let mut m = start(&data, &log);
    let mut model = Tree::new();
    let (mut refused, mut last_ok) = (0, 0);
    // 64 KiB files: ~18 MiB of room fills within ~300 of them.
    for i in 0..2000 {
        let name = format!("f{i:04}");
        let body = pattern(i, 64 << 10);
        let r = File::create_new(m.p(&name)).and_then(|mut f| {
            model.insert(name.clone(), Vec::new());
            // One write(2): one FUSE request, all or nothing.
            let k = f.write(&body)?;
            model.insert(name.clone(), body[..k].to_vec());
            Ok(())
        });
        match r {
            Ok(()) => last_ok = i,
            Err(e) => {
                assert_eq!(errno(&e), libc::ENOSPC, "file {i}: a full disk gave {e}");
                refused += 1;
                if refused == 8 {
                    break;
                }
            }
        }
    }
    assert_eq!(refused, 8, "the disk never filled ({last_ok} files)");
    // Memory did not run ahead of the journal: the listing is the model.
    let shown = listing(&m);
    assert!(
        shown == model,
        "listing differs from what was acknowledged:\n got {}\nwant {}",
        describe(&shown),
        describe(&model)
    );
    assert!(status(&[m.path().to_str().unwrap()]).contains("state: read-write"));
    // Room again: the next write works on the same mount.
    std::fs::remove_file(&filler).unwrap();
    let body = pattern(7777, 64 << 10);
    std::fs::write(m.p("after-free"), &body).expect("a write after space was freed");
    model.insert("after-free".into(), body);
    m.kill();
    assert_no_panic(&log);
    let m = start(&data, &log);
    let got = listing(&m);
    assert!(
        got == model,
        "after SIGKILL and restart:\n got {}\nwant {}",
        describe(&got),
        describe(&model)
    );
    eprintln!(
        "tmpfs full: {} files acknowledged, {refused} refused with ENOSPC",
        model.len()
    );
    m.unmount();
    assert_no_panic(&log);
}

/// The data directory's file system turns read-only under a running sync
/// mount: the operation whose durability is unknown fails with EIO, every
/// later mutation with EROFS, reads, stat and readdir keep working, `memfs
/// status` and statvfs (ST_RDONLY: the server remounts its own mount
/// read-only) report it; after the disk is repaired and memfs restarted,
/// everything acknowledged is there.
#[test]
fn a_data_directory_turned_read_only_keeps_reads_and_everything_acknowledged() {
    let Some((disk, data, _logs, log)) = failing_disk() else {
        return;
    };
    let mut m = start(&data, &log);
    let mut model = Tree::new();
    for i in 0..20 {
        let body = pattern(i, 1000 + i * 3000);
        std::fs::write(m.p(&format!("f{i}")), &body).unwrap();
        model.insert(format!("f{i}"), body);
    }
    std::fs::create_dir(m.p("dir")).unwrap();
    std::fs::remove_dir(m.p("dir")).unwrap();
    disk.ext4_error();
    // The first change cannot be journaled: its durability is unknown.
    let e = File::create_new(m.p("unknown")).expect_err("a create on a failed disk");
    assert_eq!(errno(&e), libc::EIO, "first change after the failure: {e}");
    // Every later change: EROFS, before anything changes.
    for (what, r) in [
        ("mkdir", std::fs::create_dir(m.p("d2"))),
        ("write", std::fs::write(m.p("f0"), b"new")),
        ("unlink", std::fs::remove_file(m.p("f1"))),
        ("rename", std::fs::rename(m.p("f2"), m.p("g2"))),
    ] {
        let e = r.expect_err(what);
        assert_eq!(errno(&e), libc::EROFS, "{what} after the failure: {e}");
    }
    // Reads, stat and readdir are served.
    let mut alt = model.clone();
    alt.insert("unknown".into(), Vec::new());
    let shown = listing(&m);
    assert!(
        shown == model || shown == alt,
        "read-only mount shows {}",
        describe(&shown)
    );
    assert_eq!(
        std::fs::metadata(m.p("f19")).unwrap().len(),
        1000 + 19 * 3000
    );
    let st = status(&[m.path().to_str().unwrap()]);
    assert!(st.contains("state: READ-ONLY"), "memfs status said:\n{st}");
    assert!(st.contains("mode: sync"), "{st}");
    // The server remounts itself read-only once nothing is open for writing.
    let mp = m.path();
    poll_until("the mount to turn read-only", || {
        nix::sys::statvfs::statvfs(&mp)
            .unwrap()
            .flags()
            .contains(nix::sys::statvfs::FsFlags::ST_RDONLY)
    });
    let opts = Command::new("findmnt")
        .args(["-no", "OPTIONS"])
        .arg(&mp)
        .output()
        .unwrap();
    let opts = String::from_utf8(opts.stdout).unwrap();
    assert!(opts.starts_with("ro,"), "findmnt shows {opts}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("now read-only"), "no reason logged:\n{text}");
    // Repair the disk, restart: everything acknowledged is there, and the
    // mount is writable again.
    m.kill();
    assert_no_panic(&log);
    disk.ext4_repair();
    let fsck = Command::new(memfs_bin())
        .args(["fsck", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        fsck.status.success(),
        "fsck after the failure: {}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
    let m = start(&data, &log);
    let got = listing(&m);
    assert!(
        got == model || got == alt,
        "after repair and restart:\n got {}\nwant {}",
        describe(&got),
        describe(&model)
    );
    std::fs::write(m.p("after"), b"ok").expect("writable after the restart");
    m.unmount();
    assert_no_panic(&log);
}

/// A SIGKILL while the server's own read-only remount waits for a reply
/// that one of its workers read and never sent: the process still exits and
/// its connection goes. (The remount's calls on its own mount run on a
/// thread with a private descriptor table; a thread sharing the table
/// stayed in the kernel for good holding /dev/fuse open, and the killed
/// server with it.) The server runs with `MEMFS_TEST_STALL_STATFS`, so the
/// remount's statvfs is read by a worker and never answered.
#[test]
fn a_kill_during_the_read_only_remount_leaves_no_process_behind() {
    let Some((disk, data, _logs, log)) = failing_disk() else {
        return;
    };
    let mut m = start_env(&data, &log, &[(memfs_fuse::STALL_STATFS_ENV, "1")]);
    std::fs::write(m.p("f"), b"acknowledged").unwrap();
    disk.ext4_error();
    let e = File::create_new(m.p("unknown")).expect_err("a create on a failed disk");
    assert_eq!(errno(&e), libc::EIO, "first change after the failure: {e}");
    // The server turned read-only and remounts itself: its statvfs has
    // reached a worker, which holds it.
    poll_until("the remount's statfs to reach a worker", || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("this statfs is never answered"))
    });
    m.kill_server_within(std::time::Duration::from_secs(30));
    m.detach();
    assert_no_panic(&log);
    // Nothing acknowledged was lost.
    disk.ext4_repair();
    let m = start(&data, &log);
    assert_eq!(std::fs::read(m.p("f")).unwrap(), b"acknowledged");
    m.unmount();
}
