//! Snapshots of a live mount (issue 12): `.snapshots` browsing, EROFS on
//! every change under it, the snapdir options, snapshots appearing and
//! disappearing at once, online rollback of an in-memory mount while
//! readers run, open descriptors across a rollback, clones, and a durable
//! mount's snapshots browsable after a restart, a crash and a rollback. Real
//! mounts through the memfs binary; each test takes seconds.

mod common;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::{Mount, failed, memfs, ok, tree_dump as dump, xattr_get, xattr_set};

fn snap(m: &Mount, args: &[&str]) -> String {
    let mp = m.path();
    let mut a: Vec<&str> = vec!["snapshot"];
    a.extend_from_slice(args);
    a.push("--mount");
    a.push(mp.to_str().unwrap());
    ok(memfs(&a))
}

/// `memfs rollback --mount M --to TARGET --yes`, which must succeed; its output.
fn rollback(m: &Mount, to: &str) -> String {
    let mp = m.path();
    ok(memfs([
        "rollback",
        "--mount",
        mp.to_str().unwrap(),
        "--to",
        to,
        "--yes",
    ]))
}

fn errno<T>(r: std::io::Result<T>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

fn build_tree(root: &Path) {
    fs::create_dir_all(root.join("a/b/c")).unwrap();
    fs::write(root.join("a/one"), b"one\n").unwrap();
    fs::write(root.join("a/b/two"), vec![7u8; 300_000]).unwrap();
    fs::write(root.join("a/b/c/three"), b"three").unwrap();
    std::os::unix::fs::symlink("../one", root.join("a/b/link")).unwrap();
    fs::hard_link(root.join("a/one"), root.join("a/b/c/one-again")).unwrap();
    xattr_set(&root.join("a/one"), "user.color", b"blue");
}

fn run(cmd: &str, args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(cmd).args(args).output().expect("run")
}

#[test]
fn browse_a_snapshot_with_ls_cat_cp_find_diff() {
    let m = Mount::new();
    build_tree(&m.p("tree"));
    let copy = tempfile::tempdir().unwrap();
    assert!(
        run(
            "cp",
            &[
                "-a".as_ref(),
                m.p("tree").as_os_str(),
                copy.path().as_os_str()
            ]
        )
        .status
        .success()
    );
    let out = snap(&m, &["create", "s1"]);
    assert!(out.contains("s1"), "{out}");
    // Change everything in the live tree afterwards.
    fs::write(m.p("tree/a/one"), b"changed").unwrap();
    fs::remove_file(m.p("tree/a/b/two")).unwrap();
    fs::rename(m.p("tree/a/b/c"), m.p("tree/moved")).unwrap();
    fs::write(m.p("tree/new"), b"new").unwrap();

    let s = m.p(".snapshots/s1/tree");
    let d = run(
        "diff",
        &[
            "-r".as_ref(),
            copy.path().join("tree").as_os_str(),
            s.as_os_str(),
        ],
    );
    assert!(
        d.status.success(),
        "diff -r: {}",
        String::from_utf8_lossy(&d.stdout)
    );
    assert_eq!(fs::read(s.join("a/one")).unwrap(), b"one\n");
    assert_eq!(fs::read(s.join("a/b/two")).unwrap(), vec![7u8; 300_000]);
    assert_eq!(
        fs::read_link(s.join("a/b/link")).unwrap(),
        Path::new("../one")
    );
    assert_eq!(xattr_get(&s.join("a/one"), "user.color").unwrap(), b"blue");
    // Hard links stay one file inside the snapshot, distinct from the live one.
    let (x, y) = (
        fs::metadata(s.join("a/one")).unwrap(),
        fs::metadata(s.join("a/b/c/one-again")).unwrap(),
    );
    assert_eq!((x.ino(), x.nlink()), (y.ino(), 2));
    assert_ne!(x.ino(), fs::metadata(m.p("tree/a/one")).unwrap().ino());
    let f = run("find", &[s.as_os_str()]);
    assert_eq!(String::from_utf8_lossy(&f.stdout).lines().count(), 9);
    let out = tempfile::tempdir().unwrap();
    assert!(
        run(
            "cp",
            &["-a".as_ref(), s.as_os_str(), out.path().as_os_str()]
        )
        .status
        .success()
    );
    assert!(
        run(
            "diff",
            &[
                "-r".as_ref(),
                copy.path().join("tree").as_os_str(),
                out.path().join("tree").as_os_str()
            ]
        )
        .status
        .success()
    );
    // Hidden by default, there by name; listed inside.
    let root: Vec<_> = fs::read_dir(m.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(!root.iter().any(|n| n == ".snapshots"), "{root:?}");
    let names: Vec<_> = fs::read_dir(m.p(".snapshots"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["s1"]);
    let list = snap(&m, &["list"]);
    assert!(list.starts_with("s1 "), "{list}");
    m.unmount();
}

#[test]
fn every_change_under_snapshots_is_erofs() {
    let m = Mount::new();
    build_tree(&m.p("t"));
    snap(&m, &["create", "s"]);
    let s = m.p(".snapshots/s/t");
    let erofs = libc::EROFS;
    assert_eq!(errno(fs::write(s.join("new"), b"x")), erofs);
    assert_eq!(errno(fs::create_dir(s.join("d"))), erofs);
    assert_eq!(errno(fs::remove_file(s.join("a/one"))), erofs);
    assert_eq!(errno(fs::remove_dir(s.join("a/b/c"))), erofs);
    assert_eq!(errno(fs::rename(s.join("a/one"), s.join("a/uno"))), erofs);
    assert_eq!(errno(fs::rename(m.p("t/a/one"), s.join("a/uno"))), erofs);
    assert_eq!(errno(fs::rename(s.join("a/one"), m.p("t/uno"))), erofs);
    assert_eq!(errno(std::os::unix::fs::symlink("x", s.join("l"))), erofs);
    assert_eq!(errno(fs::hard_link(m.p("t/a/one"), s.join("h"))), erofs);
    assert_eq!(
        errno(fs::hard_link(s.join("a/one"), m.p("t/h"))),
        libc::EXDEV
    );
    assert_eq!(
        errno(fs::set_permissions(
            s.join("a/one"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600)
        )),
        erofs
    );
    assert_eq!(
        errno(
            fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(s.join("a/one"))
        ),
        erofs
    );
    let tmp = errno(
        fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .mode(0o600)
            .open(s.join("a")),
    );
    // EOPNOTSUPP: a kernel without FUSE O_TMPFILE refuses before asking memfs.
    assert!(tmp == erofs || tmp == libc::EOPNOTSUPP, "O_TMPFILE: {tmp}");
    assert_eq!(
        errno(nix::unistd::truncate(&s.join("a/one"), 0).map_err(std::io::Error::from)),
        erofs
    );
    assert_eq!(
        errno(
            nix::unistd::mkfifo(
                &s.join("fifo"),
                nix::sys::stat::Mode::from_bits_truncate(0o600)
            )
            .map_err(std::io::Error::from)
        ),
        erofs
    );
    let c = std::ffi::CString::new(s.join("a/one").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: valid NUL-terminated strings; a 1-byte value.
    let r = unsafe { libc::setxattr(c.as_ptr(), c"user.x".as_ptr(), b"1".as_ptr().cast(), 1, 0) };
    assert_eq!(
        (r, std::io::Error::last_os_error().raw_os_error()),
        (-1, Some(erofs))
    );
    // SAFETY: as above.
    let r = unsafe { libc::removexattr(c.as_ptr(), c"user.color".as_ptr()) };
    assert_eq!(
        (r, std::io::Error::last_os_error().raw_os_error()),
        (-1, Some(erofs))
    );
    // A write through a descriptor opened for writing (the kernel may open
    // it without asking memfs): refused at the first write if not at open.
    match fs::OpenOptions::new().write(true).open(s.join("a/one")) {
        Err(e) => assert_eq!(e.raw_os_error(), Some(erofs)),
        Ok(mut f) => assert_eq!(errno(f.write_all(b"x").and_then(|()| f.sync_all())), erofs),
    }
    // .snapshots itself, and the name in the root.
    assert_eq!(errno(fs::create_dir(m.p(".snapshots/x"))), erofs);
    assert_eq!(errno(fs::remove_dir(m.p(".snapshots/s"))), erofs);
    assert_eq!(errno(fs::rename(m.p(".snapshots"), m.p("x"))), erofs);
    assert_eq!(errno(fs::write(m.p(".snapshots/f"), b"")), erofs);
    fs::create_dir(m.p("t/empty")).unwrap();
    assert_eq!(
        errno(fs::rename(m.p("t/empty"), m.p(".snapshots"))),
        libc::EEXIST
    );
    assert_eq!(errno(fs::create_dir(m.p(".snapshots"))), libc::EEXIST);
    // Nothing changed.
    assert_eq!(fs::read(s.join("a/one")).unwrap(), b"one\n");
    assert!(!s.join("new").exists());
    m.unmount();
}

#[test]
fn snapdir_visible_and_renamed() {
    let m = Mount::with_args(&["-o", "snapdir=visible,snapdir_name=.zfs"]);
    fs::write(m.p("f"), b"1").unwrap();
    snap(&m, &["create", "first"]);
    let root: Vec<_> = fs::read_dir(m.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(root.iter().any(|n| n == ".zfs"), "{root:?}");
    assert_eq!(fs::read(m.p(".zfs/first/f")).unwrap(), b"1");
    // .snapshots is an ordinary name here.
    fs::create_dir(m.p(".snapshots")).unwrap();
    // Listed once even when the listing takes several requests.
    for i in 0..300 {
        fs::write(m.p(&format!("n{i:03}")), b"").unwrap();
    }
    let n = fs::read_dir(m.path())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name() == ".zfs")
        .count();
    assert_eq!(n, 1);
    let bad = failed(memfs([
        "mount",
        "/nonexistent-x",
        "-o",
        "snapdir=sometimes",
    ]));
    assert!(bad.contains("snapdir"), "{bad}");
    m.unmount();
}

#[test]
fn snapshots_appear_and_disappear_at_once() {
    let m = Mount::new();
    fs::write(m.p("f"), b"gen1").unwrap();
    assert_eq!(errno(fs::metadata(m.p(".snapshots/s"))), libc::ENOENT);
    assert_eq!(fs::read_dir(m.p(".snapshots")).unwrap().count(), 0);
    snap(&m, &["create", "s"]);
    assert_eq!(fs::read(m.p(".snapshots/s/f")).unwrap(), b"gen1");
    assert_eq!(fs::read_dir(m.p(".snapshots")).unwrap().count(), 1);
    let mut held = fs::File::open(m.p(".snapshots/s/f")).unwrap();
    let e = failed(memfs([
        "snapshot",
        "create",
        "s",
        "--mount",
        m.path().to_str().unwrap(),
    ]));
    assert!(e.contains("exists"), "{e}");
    snap(&m, &["delete", "s"]);
    assert_eq!(errno(fs::metadata(m.p(".snapshots/s"))), libc::ENOENT);
    assert_eq!(fs::read_dir(m.p(".snapshots")).unwrap().count(), 0);
    // A descriptor of the deleted snapshot never shows another snapshot's
    // data, even one of the same name: its own (cached pages) or ESTALE.
    fs::write(m.p("f"), b"gen2").unwrap();
    snap(&m, &["create", "s"]);
    assert_eq!(fs::read(m.p(".snapshots/s/f")).unwrap(), b"gen2");
    let mut buf = Vec::new();
    held.seek(SeekFrom::Start(0)).unwrap();
    match held.read_to_end(&mut buf) {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ESTALE)),
        Ok(_) => assert_eq!(buf, b"gen1"),
    }
    drop(held);
    m.unmount();
}

// One page per file: a read(2) of one page is one request, so it sees one
// state; a read spanning pages can meet the switch between two requests
// (docs/snapshots.md, "Online rollback").
const FILES: usize = 64;
const LEN: usize = 4096;

fn write_generation(m: &Mount, g: u8) {
    for i in 0..FILES {
        fs::write(m.p(&format!("g/{i}")), vec![g; LEN]).unwrap();
    }
}

#[test]
fn online_rollback_is_atomic_for_readers() {
    let m = Mount::new();
    fs::create_dir(m.p("g")).unwrap();
    write_generation(&m, b'A');
    snap(&m, &["create", "a"]);
    write_generation(&m, b'B');
    fs::write(m.p("g/extra"), b"B only").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let after = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (stop, after, reads, dir) = (stop.clone(), after.clone(), reads.clone(), m.p("g"));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    for i in 0..FILES {
                        // Read after the command returned: only the target may show.
                        let must_be_a = after.load(Ordering::Acquire);
                        let data = fs::read(dir.join(i.to_string())).unwrap();
                        assert_eq!(data.len(), LEN);
                        let g = data[0];
                        assert!(data.iter().all(|&b| b == g), "a mixed read of file {i}");
                        assert!(g == b'A' || g == b'B');
                        assert!(
                            !must_be_a || g == b'A',
                            "file {i} shows B after the rollback returned"
                        );
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    common::poll_until("readers to run", || {
        reads.load(Ordering::Relaxed) > 3 * FILES
    });
    let out = rollback(&m, "a");
    assert!(out.contains("rolled"), "{out}");
    after.store(true, Ordering::Release);
    let seen = reads.load(Ordering::Relaxed);
    common::poll_until("reads after the rollback", || {
        reads.load(Ordering::Relaxed) > seen + 3 * FILES
    });
    stop.store(true, Ordering::Release);
    for r in readers {
        r.join().expect("a reader saw a mixed state");
    }
    assert_eq!(errno(fs::metadata(m.p("g/extra"))), libc::ENOENT);
    let names = fs::read_dir(m.p("g")).unwrap().count();
    assert_eq!(names, FILES);
    // Refused without --yes when not asked on a terminal; unknown names refused.
    let e = failed(memfs([
        "rollback",
        "--mount",
        m.path().to_str().unwrap(),
        "--to",
        "a",
    ]));
    assert!(e.contains("--yes"), "{e}");
    let e = failed(memfs([
        "rollback",
        "--mount",
        m.path().to_str().unwrap(),
        "--to",
        "nope",
        "--yes",
    ]));
    assert!(e.contains("nope"), "{e}");
    m.unmount();
}

#[test]
fn a_rollback_drops_changed_pages_from_the_kernels_cache() {
    // The rollback invalidates only the changed page runs of a file whose
    // size stayed, the whole file otherwise: every page must read as the
    // snapshot has it although the kernel cached the newer contents.
    let m = Mount::new();
    let page = 4096;
    let original: Vec<u8> = (0..64 * page).map(|i| (i / page) as u8 + 1).collect();
    fs::write(m.p("big"), &original).unwrap();
    fs::write(m.p("grown"), b"short").unwrap();
    assert_eq!(fs::read(m.p("big")).unwrap(), original);
    snap(&m, &["create", "s"]);
    {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new().write(true).open(m.p("big")).unwrap();
        f.write_all_at(&vec![0xee; page], 5 * page as u64).unwrap();
        f.write_all_at(&vec![0xdd; 3 * page], 40 * page as u64)
            .unwrap();
        f.write_all_at(b"torn", (63 * page + 10) as u64).unwrap();
    }
    fs::write(m.p("grown"), vec![b'g'; 3 * page]).unwrap();
    // Cached now, with the new contents.
    let changed = fs::read(m.p("big")).unwrap();
    assert_eq!(&changed[5 * page..6 * page], &vec![0xee; page][..]);
    assert_eq!(fs::read(m.p("grown")).unwrap().len(), 3 * page);
    let out = rollback(&m, "s");
    assert!(out.contains("kernel invalidation"), "{out}");
    let back = fs::read(m.p("big")).unwrap();
    assert_eq!(back.len(), original.len());
    for (i, (a, b)) in back.chunks(page).zip(original.chunks(page)).enumerate() {
        assert!(
            a == b,
            "page {i} of big is not the snapshot's after the rollback"
        );
    }
    assert_eq!(fs::read(m.p("grown")).unwrap(), b"short");
    m.unmount();
}

#[test]
fn open_descriptors_across_a_rollback() {
    let m = Mount::new();
    fs::write(m.p("kept"), b"old").unwrap();
    snap(&m, &["create", "s"]);
    fs::write(m.p("kept"), b"new!").unwrap();
    fs::write(m.p("born"), b"born after").unwrap();
    let mut kept = fs::File::open(m.p("kept")).unwrap();
    let mut born = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("born"))
        .unwrap();
    let mut s = String::new();
    kept.read_to_string(&mut s).unwrap();
    assert_eq!(s, "new!");
    rollback(&m, "s");
    // A file in both states: the descriptor reads the target's content.
    kept.seek(SeekFrom::Start(0)).unwrap();
    s.clear();
    kept.read_to_string(&mut s).unwrap();
    assert_eq!(s, "old");
    // A file the target lacks: it lives on unlinked, as after rm.
    assert_eq!(born.metadata().unwrap().nlink(), 0);
    s.clear();
    born.read_to_string(&mut s).unwrap();
    assert_eq!(s, "born after");
    born.write_all(b"!").unwrap();
    assert!(!m.p("born").exists());
    drop((kept, born));
    m.unmount();
}

#[test]
fn clones_are_isolated_and_go_with_their_origin() {
    let m = Mount::new();
    build_tree(&m.p("t"));
    snap(&m, &["create", "base"]);
    let c1 = tempfile::tempdir().unwrap();
    let c2 = tempfile::tempdir().unwrap();
    let mp = m.path();
    for c in [&c1, &c2] {
        let out = ok(memfs([
            "clone",
            "base",
            c.path().to_str().unwrap(),
            "--mount",
            mp.to_str().unwrap(),
        ]));
        assert!(out.contains("mounted"), "{out}");
        assert!(common::is_mount_point(c.path()));
    }
    let c1p = c1.path();
    assert_eq!(fs::read(c1p.join("t/a/one")).unwrap(), b"one\n");
    fs::write(c1p.join("t/a/one"), b"clone").unwrap();
    fs::write(m.p("t/a/one"), b"origin").unwrap();
    fs::write(c1p.join("only-in-clone"), b"").unwrap();
    assert_eq!(fs::read(c1p.join("t/a/one")).unwrap(), b"clone");
    assert_eq!(fs::read(m.p("t/a/one")).unwrap(), b"origin");
    assert_eq!(fs::read(c2.path().join("t/a/one")).unwrap(), b"one\n");
    assert!(!m.p("only-in-clone").exists());
    // A clone takes snapshots of its own.
    ok(memfs([
        "snapshot",
        "create",
        "c",
        "--mount",
        c1p.to_str().unwrap(),
    ]));
    assert_eq!(
        fs::read(c1p.join(".snapshots/c/t/a/one")).unwrap(),
        b"clone"
    );
    assert_eq!(errno(fs::metadata(m.p(".snapshots/c"))), libc::ENOENT);
    // Deleting the origin's snapshot leaves the clones alone.
    snap(&m, &["delete", "base"]);
    assert_eq!(fs::read(c2.path().join("t/a/b/c/three")).unwrap(), b"three");
    ok(memfs(["umount", c1p.to_str().unwrap()]));
    assert!(!common::is_mount_point(c1p));
    // The origin's unmount unmounts the remaining clone.
    let c2p = c2.path().to_path_buf();
    m.unmount();
    assert!(!common::is_mount_point(&c2p));
}

#[test]
fn snapshot_commands_refuse_bad_input() {
    let m = Mount::new();
    let mp = m.path();
    let mps = mp.to_str().unwrap();
    let e = failed(memfs(["snapshot", "create", "a/b", "--mount", mps]));
    assert!(!e.is_empty());
    let e = failed(memfs(["snapshot", "delete", "none", "--mount", mps]));
    assert!(e.contains("none"), "{e}");
    let e = failed(memfs(["clone", "none", "/tmp", "--mount", mps]));
    assert!(e.contains("none") || e.contains("already"), "{e}");
    let plain = tempfile::tempdir().unwrap();
    let e = failed(memfs([
        "snapshot",
        "list",
        "--mount",
        plain.path().to_str().unwrap(),
    ]));
    assert!(e.contains("not mounted"), "{e}");
    m.unmount();
}

#[test]
fn a_durable_mount_shows_its_new_snapshots_in_snapshots() {
    let dir = common::disk_dir("memfs-snapfuse-");
    let m = Mount::with_args(&[
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--durability",
        "none",
    ]);
    fs::write(m.p("f"), b"v1").unwrap();
    snap(&m, &["create", "d1"]);
    fs::write(m.p("f"), b"v2").unwrap();
    assert_eq!(fs::read(m.p(".snapshots/d1/f")).unwrap(), b"v1");
    let list = snap(&m, &["list"]);
    assert!(list.contains("d1"), "{list}");
    snap(&m, &["delete", "d1"]);
    assert_eq!(errno(fs::metadata(m.p(".snapshots/d1"))), libc::ENOENT);
    m.unmount();
}

#[test]
fn diff_of_an_in_memory_mount_lists_what_changed() {
    let m = Mount::new();
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("d/kept"), b"1").unwrap();
    fs::write(m.p("d/changed"), b"1").unwrap();
    fs::write(m.p("d/gone"), b"1").unwrap();
    fs::write(m.p("d/moved"), b"1").unwrap();
    snap(&m, &["create", "s1"]);
    fs::write(m.p("d/changed"), b"22").unwrap();
    fs::remove_file(m.p("d/gone")).unwrap();
    fs::write(m.p("d/new"), b"3").unwrap();
    fs::rename(m.p("d/moved"), m.p("moved-out")).unwrap();
    snap(&m, &["create", "s2"]);
    let mp = m.path();
    let mp = mp.to_str().unwrap();
    let live = ok(memfs(["diff", "s1", "--mount", mp]));
    let between = ok(memfs(["diff", "s1", "s2", "--mount", mp]));
    assert_eq!(live, between, "nothing changed after s2");
    let lines: Vec<&str> = live.lines().collect();
    for want in [
        "M /d/changed",
        "- /d/gone",
        "+ /d/new",
        "R /d/moved -> /moved-out",
    ] {
        assert!(lines.contains(&want), "{want:?} missing from:\n{live}");
    }
    assert!(!live.contains("kept"), "{live}");
    assert_eq!(ok(memfs(["diff", "s2", "-", "--mount", mp])), "");
    let e = failed(memfs(["diff", "nope", "--mount", mp]));
    assert!(e.contains("nope"), "{e}");
}

#[test]
fn a_passthrough_mount_refuses_snapshots() {
    // Even where the kernel lacks passthrough and the mount fell back to the
    // fuse path: the option says writes may bypass the engine.
    let m = Mount::with_args(&["--data-path", "passthrough"]);
    fs::write(m.p("f"), b"x").unwrap();
    let mp = m.path();
    let e = failed(memfs([
        "snapshot",
        "create",
        "s",
        "--mount",
        mp.to_str().unwrap(),
    ]));
    assert!(e.contains("passthrough"), "{e}");
    assert!(!m.p(".snapshots/s").exists());
}

/// With `--locks engine`, closing a file in `.snapshots` sends FLUSH like
/// any close. An ENOSYS answer there once made the kernel stop sending
/// FLUSH on the whole mount, and then closing a descriptor no longer
/// dropped its process's record locks on live files.
#[test]
fn closing_a_snapshot_file_keeps_flush_for_live_locks() {
    use nix::fcntl::{FcntlArg, fcntl};
    let m = Mount::with_args(&["--locks", "engine"]);
    fs::write(m.p("f"), b"0123456789").unwrap();
    snap(&m, &["create", "s1"]);
    assert_eq!(fs::read(m.p(".snapshots/s1/f")).unwrap(), b"0123456789");
    let lk = |typ: i32| common::range_lock(typ, 0, 5);
    let rw = || common::open_rw(&m.p("f"));
    let (classic, other) = (rw(), rw());
    fcntl(&classic, FcntlArg::F_SETLK(&lk(libc::F_WRLCK))).unwrap();
    // An open file description is an owner of its own: it sees the
    // process's classic lock as a conflict.
    assert_eq!(
        fcntl(&other, FcntlArg::F_OFD_SETLK(&lk(libc::F_RDLCK))),
        Err(nix::errno::Errno::EAGAIN)
    );
    // Closing any descriptor of the file drops the process's classic locks,
    // at once (FLUSH is answered before close returns).
    drop(fs::File::open(m.p("f")).unwrap());
    fcntl(&other, FcntlArg::F_OFD_SETLK(&lk(libc::F_RDLCK))).unwrap();
    drop((classic, other));
    m.unmount();
}

/// `--writeback-cache`: written data waits in the kernel as dirty pages,
/// and the kernel keeps its own size of a cached file. A snapshot holds
/// every write that returned before it (the server has the kernel write
/// back first); an online rollback is refused, with nothing changed: the
/// kernel would go on showing the later size (it once did, with the
/// rolled-back bytes under it and zeros past them).
#[test]
fn writeback_cached_writes_are_in_a_snapshot_and_online_rollback_is_refused() {
    let m = Mount::with_args(&["--writeback-cache"]);
    let before = vec![b'a'; 100_000];
    let mut f = fs::File::create(m.p("f")).unwrap();
    f.write_all(&before).unwrap();
    snap(&m, &["create", "s1"]);
    assert!(fs::read(m.p(".snapshots/s1/f")).unwrap() == before);
    f.write_all(&[b'b'; 1000]).unwrap();
    let mp = m.path();
    let e = failed(memfs([
        "rollback",
        "--mount",
        mp.to_str().unwrap(),
        "--to",
        "s1",
        "--yes",
    ]));
    assert!(e.contains("--writeback-cache"), "{e}");
    drop(f);
    let mut want = before.clone();
    want.extend_from_slice(&[b'b'; 1000]);
    assert!(
        fs::read(m.p("f")).unwrap() == want,
        "a refused rollback changed the file"
    );
    assert!(fs::read(m.p(".snapshots/s1/f")).unwrap() == before);
    m.unmount();
}

/// Stores through a shared writable mapping stay dirty pages in the kernel
/// until writeback, on any mount. A snapshot holds the stores made before
/// it, and a rollback never receives the ones made before it afterwards
/// (the kernel writes dirty pages back when the rollback invalidates them).
#[test]
fn mapped_stores_are_in_a_snapshot_and_never_after_a_rollback() {
    const LEN: usize = 8192;
    let m = Mount::new();
    fs::write(m.p("f"), vec![b'a'; LEN]).unwrap();
    let f = common::open_rw(&m.p("f"));
    // SAFETY: a fresh shared mapping of LEN bytes of an open file of LEN
    // bytes; it is only touched through `map` below and unmapped before `f`
    // is dropped.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    let map = map.cast::<u8>();
    // SAFETY: offset 0 is inside the mapping.
    unsafe { map.write_volatile(b'M') };
    snap(&m, &["create", "s1"]);
    let mut want = vec![b'a'; LEN];
    want[0] = b'M';
    assert!(
        fs::read(m.p(".snapshots/s1/f")).unwrap() == want,
        "a store before the snapshot is missing"
    );
    // SAFETY: offset 4096 is inside the mapping.
    unsafe { map.add(4096).write_volatile(b'N') };
    rollback(&m, "s1");
    // SAFETY: the mapping made above, of LEN bytes, unmapped once.
    assert_eq!(unsafe { libc::munmap(map.cast(), LEN) }, 0);
    drop(f);
    assert!(
        fs::read(m.p("f")).unwrap() == want,
        "a store from before the rollback landed after it"
    );
    m.unmount();
}

/// `F_OFD_SETLKW` on a thread of its own; the thread's id comes back
/// first, then the outcome.
fn blocking_lock(f: fs::File, start: i64) -> (i32, std::thread::JoinHandle<nix::Result<()>>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        tx.send(nix::unistd::gettid().as_raw()).unwrap();
        let lk = common::range_lock(libc::F_WRLCK, start, 1);
        let r = nix::fcntl::fcntl(&f, nix::fcntl::FcntlArg::F_OFD_SETLKW(&lk)).map(drop);
        drop(f);
        r
    });
    (rx.recv().unwrap(), t)
}

/// A durable mount's online rollback serves a new tree built from the
/// journal. Record locks kept by the engine (`--locks engine`) belong to
/// processes, not to commits: they stay on the files the target has, their
/// waiters are granted when the holder unlocks, and a waiter on a file the
/// target lacks is answered ESTALE (it once got EIO, and held locks were
/// lost: another process could take them).
#[test]
fn engine_locks_survive_a_durable_online_rollback() {
    use nix::fcntl::{FcntlArg, fcntl};
    let dir = common::disk_dir("memfs-snaplock-");
    let m = Mount::with_args(&[
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--locks",
        "engine",
    ]);
    fs::write(m.p("kept"), b"0123456789").unwrap();
    snap(&m, &["create", "s1"]);
    fs::write(m.p("later"), b"0123456789").unwrap();
    let rw = |name: &str| common::open_rw(&m.p(name));
    let lk = common::range_lock;
    let holder = rw("kept");
    fcntl(&holder, FcntlArg::F_OFD_SETLK(&lk(libc::F_WRLCK, 0, 5))).unwrap();
    let later_holder = rw("later");
    fcntl(
        &later_holder,
        FcntlArg::F_OFD_SETLK(&lk(libc::F_WRLCK, 0, 5)),
    )
    .unwrap();
    let (kept_tid, kept_waiter) = blocking_lock(rw("kept"), 2);
    let (later_tid, later_waiter) = blocking_lock(rw("later"), 2);
    common::await_in_fcntl(kept_tid);
    common::await_in_fcntl(later_tid);

    rollback(&m, "s1");
    assert!(!m.p("later").exists());
    // The holder's lock is still held...
    let probe = rw("kept");
    assert_eq!(
        fcntl(&probe, FcntlArg::F_OFD_SETLK(&lk(libc::F_RDLCK, 0, 1))),
        Err(nix::errno::Errno::EAGAIN),
        "a lock held across the rollback must still conflict"
    );
    // ...the waiter on the file the target lacks is answered...
    assert_eq!(later_waiter.join().unwrap(), Err(nix::errno::Errno::ESTALE));
    // ...and the waiter on the kept file is granted once the holder unlocks.
    fcntl(&holder, FcntlArg::F_OFD_SETLK(&lk(libc::F_UNLCK, 0, 5))).unwrap();
    assert_eq!(kept_waiter.join().unwrap(), Ok(()));
    fcntl(&probe, FcntlArg::F_OFD_SETLK(&lk(libc::F_RDLCK, 0, 1))).unwrap();
    drop((holder, later_holder, probe));
    m.unmount();
}

fn snapdir_names(m: &Mount) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(m.p(".snapshots"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// The snapshot's tree exactly as it was taken, read-only.
fn check_durable_view(m: &Mount, name: &str, want: &[String]) {
    let root = m.p(&format!(".snapshots/{name}"));
    assert_eq!(dump(&root), want, "{name} after a restart");
    let erofs = libc::EROFS;
    assert_eq!(errno(fs::write(root.join("new"), b"x")), erofs);
    assert_eq!(errno(fs::create_dir(root.join("nd"))), erofs);
    assert_eq!(errno(fs::remove_file(root.join("d/a"))), erofs);
    assert_eq!(
        errno(fs::set_permissions(
            root.join("d/a"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600)
        )),
        erofs
    );
    match fs::OpenOptions::new().write(true).open(root.join("d/a")) {
        Err(e) => assert_eq!(e.raw_os_error(), Some(erofs)),
        Ok(mut f) => assert_eq!(errno(f.write_all(b"x").and_then(|()| f.sync_all())), erofs),
    }
    assert_eq!(dump(&root), want, "{name} changed by refused writes");
}

/// Issue 12: a durable mount's snapshots are browsable in `.snapshots`
/// after an unmount and mount, after a SIGKILL of the server, and after an
/// online rollback (which drops the later ones); deleting one removes it.
#[test]
fn durable_snapshots_are_browsable_after_a_restart_a_crash_and_a_rollback() {
    let dir = common::disk_dir("memfs-snapdur-");
    let args = ["--data-dir", dir.path().to_str().unwrap()];
    let m = Mount::with_args(&args);
    fs::create_dir_all(m.p("d/e")).unwrap();
    fs::write(m.p("d/a"), b"one").unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(m.p("d/e/big"), &big).unwrap();
    fs::write(m.p("gone"), b"removed after s1").unwrap();
    std::os::unix::fs::symlink("d/a", m.p("link")).unwrap();
    fs::hard_link(m.p("d/a"), m.p("d/e/a-again")).unwrap();
    xattr_set(&m.p("d/a"), "user.color", b"blue");
    let t1 = dump(&m.path());
    snap(&m, &["create", "s1"]);
    fs::write(m.p("d/a"), b"two, longer").unwrap();
    fs::remove_file(m.p("gone")).unwrap();
    fs::rename(m.p("d/e/big"), m.p("big-moved")).unwrap();
    let mut f = fs::OpenOptions::new()
        .write(true)
        .open(m.p("big-moved"))
        .unwrap();
    f.seek(SeekFrom::Start(8192)).unwrap();
    f.write_all(b"changed page").unwrap();
    drop(f);
    fs::create_dir(m.p("new-dir")).unwrap();
    fs::write(m.p("new-dir/n"), b"new in s2").unwrap();
    xattr_set(&m.p("d/a"), "user.color", b"green");
    let t2 = dump(&m.path());
    assert_ne!(t1, t2);
    snap(&m, &["create", "s2"]);
    fs::write(m.p("d/a"), b"three").unwrap();
    fs::remove_dir_all(m.p("new-dir")).unwrap();
    fs::write(m.p("after"), b"after s2").unwrap();
    let t3 = dump(&m.path());
    // Before any restart (engine snapshots).
    assert_eq!(dump(&m.p(".snapshots/s1")), t1);
    assert_eq!(dump(&m.p(".snapshots/s2")), t2);
    m.unmount();

    // (1) Unmount and mount: rebuilt from the data directory when browsed.
    let m = Mount::with_args(&args);
    // The listing (readdirplus) builds nothing and its stand-in attributes
    // of the roots do not stick: the views' roots are exact below.
    assert_eq!(snapdir_names(&m), ["s1", "s2"]);
    assert_eq!(dump(&m.path()), t3);
    check_durable_view(&m, "s1", &t1);
    check_durable_view(&m, "s2", &t2);
    let out = run("ls", &["-la".as_ref(), m.p(".snapshots").as_os_str()]);
    assert!(out.status.success(), "{out:?}");
    // Live writes do not reach the views.
    fs::write(m.p("d/a"), b"four").unwrap();
    assert_eq!(fs::read(m.p(".snapshots/s1/d/a")).unwrap(), b"one");
    let t4 = dump(&m.path());
    // A clone of a snapshot from before the restart: its tree as the view
    // shows it, writable, and apart from the view and the live tree.
    let c = tempfile::tempdir().unwrap();
    let out = ok(memfs([
        "clone",
        "s1",
        c.path().to_str().unwrap(),
        "--mount",
        m.path().to_str().unwrap(),
    ]));
    assert!(out.contains("mounted"), "{out}");
    assert_eq!(dump(c.path()), t1);
    fs::write(c.path().join("d/a"), b"clone").unwrap();
    assert_eq!(fs::read(m.p(".snapshots/s1/d/a")).unwrap(), b"one");
    assert_eq!(fs::read(m.p("d/a")).unwrap(), b"four");
    ok(memfs(["umount", c.path().to_str().unwrap()]));
    assert!(!common::is_mount_point(c.path()));

    // (2) SIGKILL the server and mount again: the same.
    let mut m = m;
    m.kill();
    let m = Mount::with_args(&args);
    let out = run("ls", &["-la".as_ref(), m.p(".snapshots").as_os_str()]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(snapdir_names(&m), ["s1", "s2"]);
    assert_eq!(dump(&m.path()), t4);
    check_durable_view(&m, "s2", &t2);
    check_durable_view(&m, "s1", &t1);

    // (4) Delete s1: gone from `.snapshots`, also for what looked it up.
    let held = m.p(".snapshots/s1/d");
    assert!(held.is_dir());
    snap(&m, &["delete", "s1"]);
    assert_eq!(snapdir_names(&m), ["s2"]);
    assert_eq!(errno(fs::metadata(m.p(".snapshots/s1"))), libc::ENOENT);
    assert!(matches!(
        errno(fs::metadata(&held)),
        libc::ENOENT | libc::ESTALE
    ));
    check_durable_view(&m, "s2", &t2);

    // A new snapshot, then an online rollback to s2: s3 goes with its view,
    // s2 is still browsable (its engine snapshot went with the old tree).
    fs::write(m.p("d/a"), b"five").unwrap();
    snap(&m, &["create", "s3"]);
    let t5 = dump(&m.path());
    assert_eq!(dump(&m.p(".snapshots/s3")), t5);
    let out = rollback(&m, "s2");
    assert!(out.contains("rolled back"), "{out}");
    assert_eq!(snapdir_names(&m), ["s2"]);
    assert_eq!(errno(fs::metadata(m.p(".snapshots/s3"))), libc::ENOENT);
    check_durable_view(&m, "s2", &t2);
    assert_eq!(dump(&m.path()), t2);
    m.unmount();
}

/// A durable snapshot of the very commit a mount recovers to is that tree:
/// after an unmount, and after an online rollback to it, it gets an engine
/// snapshot at once (shared with the live tree, like one taken live)
/// instead of a rebuild from the data directory when browsed; an older one
/// is still rebuilt. Both views stay exact while the live tree changes.
#[test]
fn a_snapshot_of_the_recovered_commit_is_shared_not_rebuilt() {
    let dir = common::disk_dir("memfs-snaplast-");
    let args = ["--data-dir", dir.path().to_str().unwrap()];
    let m = Mount::with_args(&args);
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("d/a"), b"old").unwrap();
    let t_older = dump(&m.path());
    snap(&m, &["create", "older"]);
    fs::write(m.p("d/a"), b"last").unwrap();
    fs::write(m.p("big"), vec![5u8; 300_000]).unwrap();
    let t_last = dump(&m.path());
    snap(&m, &["create", "last"]);
    m.unmount();

    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("memfs.log");
    let m = Mount::spawn_logged(&args, &log, &[("MEMFS_LOG", "info")]);
    // Live changes (new pages over shared ones included) reach no view.
    fs::write(m.p("d/a"), b"newer").unwrap();
    let mut f = fs::OpenOptions::new().write(true).open(m.p("big")).unwrap();
    f.seek(SeekFrom::Start(4096)).unwrap();
    f.write_all(b"changed").unwrap();
    drop(f);
    check_durable_view(&m, "last", &t_last);
    check_durable_view(&m, "older", &t_older);
    let text = fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("snapshot last is the recovered tree"),
        "no engine snapshot of `last`:\n{text}"
    );
    assert!(
        !text.contains("snapshot last (commit"),
        "`last` was rebuilt:\n{text}"
    );
    assert!(
        text.contains("snapshot older (commit") && text.contains("rebuilt for browsing"),
        "`older` was not rebuilt:\n{text}"
    );

    // An online rollback to `last`: the new tree is `last` again, and its
    // view is shared with it at once.
    let out = rollback(&m, "last");
    assert!(out.contains("rolled back"), "{out}");
    assert_eq!(dump(&m.path()), t_last);
    fs::write(m.p("d/a"), b"after the rollback").unwrap();
    check_durable_view(&m, "last", &t_last);
    let text = fs::read_to_string(&log).unwrap();
    assert_eq!(
        text.matches("snapshot last is the recovered tree").count(),
        2,
        "{text}"
    );
    assert!(!text.contains("snapshot last (commit"), "{text}");
    m.unmount();
}
