//! Mounted `O_TMPFILE` (issue 14): an unnamed file that `linkat` names
//! through /proc/self/fd or AT_EMPTY_PATH, never when opened with O_EXCL;
//! freed on close when unnamed; on a durable mount, the linked one survives
//! a crash with its data and an unlinked one leaves nothing behind.

mod common;

use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};

use common::{Mount, memfs_bin, poll_until};

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// `open(dir, O_TMPFILE | O_RDWR | extra, mode)`.
fn tmpfile(dir: &Path, extra: libc::c_int, mode: libc::mode_t) -> std::io::Result<File> {
    let c = cstr(dir);
    // SAFETY: c is a valid NUL-terminated path; the mode argument is read
    // because O_TMPFILE is given.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_TMPFILE | libc::O_RDWR | extra, mode) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// `linkat` of an open file by its /proc/self/fd link, following it.
fn link_proc(f: &File, to: &Path) -> std::io::Result<()> {
    let from = CString::new(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap();
    let to = cstr(to);
    // SAFETY: both paths are valid NUL-terminated strings.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `linkat(fd, "", ..., AT_EMPTY_PATH)` (needs CAP_DAC_READ_SEARCH).
fn link_empty_path(f: &File, to: &Path) -> std::io::Result<()> {
    let to = cstr(to);
    // SAFETY: "" and `to` are valid NUL-terminated strings; fd is open.
    let r = unsafe {
        libc::linkat(
            f.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Inodes in use, as statvfs counts them.
fn inodes_used(dir: &Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(dir).unwrap();
    s.files() - s.files_free()
}

fn payload(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 % 253) as u8).collect()
}

fn contents(p: &Path) -> Vec<u8> {
    let mut v = Vec::new();
    File::open(p).unwrap().read_to_end(&mut v).unwrap();
    v
}

#[test]
fn tmpfile_is_unnamed_until_linkat_and_keeps_its_data() {
    let m = Mount::new();
    let d = m.p("d");
    std::fs::create_dir(&d).unwrap();
    let mut f = tmpfile(&d, 0, 0o600).expect("O_TMPFILE on memfs");
    let data = payload(200_000);
    f.write_all(&data).unwrap();
    let st = f.metadata().unwrap();
    assert_eq!(st.nlink(), 0);
    assert_eq!(st.len(), 200_000);
    assert_eq!(st.mode() & 0o7777, 0o600);
    assert!(st.is_file());
    assert!(
        names(&d).is_empty(),
        "ls shows {:?} before linkat",
        names(&d)
    );
    link_proc(&f, &d.join("named")).unwrap();
    assert_eq!(names(&d), ["named"]);
    assert_eq!(f.metadata().unwrap().nlink(), 1);
    let by_name = std::fs::metadata(d.join("named")).unwrap();
    assert_eq!(by_name.ino(), st.ino());
    drop(f);
    assert!(contents(&d.join("named")) == data, "data read back differs");
    // A second name through AT_EMPTY_PATH where the caller may use it.
    if nix::unistd::geteuid().is_root() {
        let g = tmpfile(&d, 0, 0o644).unwrap();
        (&g).write_all(b"second").unwrap();
        link_empty_path(&g, &d.join("second")).unwrap();
        drop(g);
        assert_eq!(contents(&d.join("second")), b"second");
    }
}

#[test]
fn a_tmpfile_opened_with_o_excl_cannot_be_linked() {
    let m = Mount::new();
    let f = tmpfile(&m.path(), libc::O_EXCL, 0o600).unwrap();
    (&f).write_all(b"x").unwrap();
    let e = link_proc(&f, &m.p("nope")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    if nix::unistd::geteuid().is_root() {
        let e = link_empty_path(&f, &m.p("nope")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    }
    assert!(names(&m.path()).is_empty());
}

#[test]
fn closing_an_unnamed_tmpfile_frees_its_inode_and_space() {
    let m = Mount::new();
    let before = inodes_used(&m.path());
    let blocks = |p: &Path| nix::sys::statvfs::statvfs(p).unwrap().blocks_free();
    let free0 = blocks(&m.path());
    let f = tmpfile(&m.path(), 0, 0o600).unwrap();
    (&f).write_all(&payload(1 << 20)).unwrap();
    f.sync_all().unwrap();
    assert_eq!(inodes_used(&m.path()), before + 1);
    assert!(blocks(&m.path()) < free0, "the data takes no space");
    drop(f);
    // RELEASE and FORGET reach the server after close returns.
    poll_until("the tmpfile to be freed", || {
        inodes_used(&m.path()) == before && blocks(&m.path()) == free0
    });
}

#[test]
fn a_durable_mount_keeps_the_linked_tmpfile_and_drops_the_other_after_a_crash() {
    let data = tempfile::Builder::new()
        .prefix("memfs-tmpfile-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let dd = data.path().to_str().unwrap();
    let args = ["--data-dir", dd, "--durability", "sync"];
    let want = payload(300_000);
    let mut m = Mount::with_args(&args);
    let base = inodes_used(&m.path());
    let f = tmpfile(&m.path(), 0, 0o640).unwrap();
    (&f).write_all(&want).unwrap();
    link_proc(&f, &m.p("kept")).unwrap();
    (&f).write_all(b"tail").unwrap();
    let orphan = tmpfile(&m.path(), 0, 0o600).unwrap();
    (&orphan).write_all(&payload(100_000)).unwrap();
    let excl = tmpfile(&m.path(), libc::O_EXCL, 0o600).unwrap();
    (&excl).write_all(&payload(50_000)).unwrap();
    assert_eq!(inodes_used(&m.path()), base + 3);
    // Crash with both unnamed files still open.
    m.kill_server();
    drop((f, orphan, excl));
    m.detach();
    let m = Mount::with_args(&args);
    assert_eq!(names(&m.path()), ["kept"]);
    let mut full = want.clone();
    full.extend_from_slice(b"tail");
    assert!(contents(&m.p("kept")) == full, "kept lost data");
    assert_eq!(
        std::fs::metadata(m.p("kept")).unwrap().mode() & 0o7777,
        0o640
    );
    assert_eq!(inodes_used(&m.path()), base + 1, "an orphan came back");
    m.unmount();
    let o = Command::new(memfs_bin())
        .args(["fsck", "--data-dir", dd])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.lines().last() == Some("clean"),
        "fsck: {out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
