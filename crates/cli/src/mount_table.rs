//! What the kernel's mount table says about a mount point.
//!
//! Its own module because the mount commands and the control socket's
//! clients both look a mount up there, and neither should import the other
//! for it.

use std::path::{Path, PathBuf};

use memfs_fuse::mounts::unescape_mount_path;

/// The source field of `mp`'s mount (a durable memfs puts its data directory there).
pub fn source(mp: &Path) -> Option<String> {
    let canon = mp.canonicalize().ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let point = PathBuf::from(unescape_mount_path(f.get(4)?));
        if point != canon {
            return None;
        }
        // Optional fields end at "-"; then type, source.
        let dash = f.iter().position(|x| *x == "-")?;
        f.get(dash + 2).map(|s| unescape_mount_path(s))
    })
}
