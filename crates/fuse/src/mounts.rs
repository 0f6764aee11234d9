//! What the kernel has mounted, and how to detach a mount: shared by the
//! `memfs` command and the benchmarks, which mount and unmount memfs too.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Mount points currently mounted, from /proc/self/mountinfo (octal escapes decoded).
pub fn mount_points() -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mount_path(p)))
        .collect()
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
pub fn unescape_mount_path(p: &str) -> String {
    let b = p.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The device number ("MAJOR:MINOR", as `stat` shows it for files inside)
/// of the mount at `path`, from /proc/self/mountinfo: no request reaches
/// the file system (its server may be the caller, not serving yet). The
/// last entry wins: the one mounted on top.
pub fn mount_dev(path: &Path) -> Option<String> {
    let canon = path.canonicalize().ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let dev = f.nth(2)?;
            let point = f.nth(1)?;
            (Path::new(&unescape_mount_path(point)) == canon).then(|| dev.to_string())
        })
        .last()
}

/// Whether `path` is a mount point right now.
pub fn is_mounted(path: &Path) -> bool {
    let Ok(canon) = path.canonicalize() else {
        return false;
    };
    mount_points().contains(&canon)
}

/// Detaches a mount now (best effort: cleanup paths call this); the kernel
/// finishes when its last user leaves.
pub fn lazy_unmount(mp: &Path) {
    if is_root() {
        let _ = nix::mount::umount2(mp, nix::mount::MntFlags::MNT_DETACH);
    } else {
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg("-z")
            .arg(mp)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_paths_unescape() {
        assert_eq!(unescape_mount_path("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape_mount_path("/plain"), "/plain");
        assert!(is_mounted(Path::new("/")));
        let dev = mount_dev(Path::new("/")).unwrap();
        assert!(dev.split_once(':').is_some(), "{dev}");
    }
}
