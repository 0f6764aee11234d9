//! The atime policy of a running mount's reads. A FUSE kernel marks every
//! inode S_NOATIME and is not told about `mount -o remount,...`, so the
//! policy is the server's and changes live only when the mount helper tells
//! it (through the control socket, `memfs mount -o remount,...`).

use memfs_fs::AtimeMode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

/// The policy a mount was given (`relatime`, `strictatime`, `noatime`) and
/// whether the mount is read-only (a read-only mount records no access:
/// generic/003), in one atomic byte so that a read takes it with one load.
/// Clones share it: the adapter reads it, the control socket changes it.
#[derive(Clone, Debug)]
pub struct AtimePolicy(Arc<AtomicU8>);

const READ_ONLY: u8 = 4;

fn code(m: AtimeMode) -> u8 {
    match m {
        AtimeMode::Relative => 0,
        AtimeMode::Strict => 1,
        AtimeMode::Never => 2,
    }
}

fn mode(c: u8) -> AtimeMode {
    match c & 3 {
        1 => AtimeMode::Strict,
        2 => AtimeMode::Never,
        _ => AtimeMode::Relative,
    }
}

impl AtimePolicy {
    pub fn new(base: AtimeMode) -> AtimePolicy {
        AtimePolicy(Arc::new(AtomicU8::new(code(base))))
    }

    /// What reads do now: the policy, or never on a read-only mount.
    pub fn effective(&self) -> AtimeMode {
        let c = self.0.load(Relaxed);
        if c & READ_ONLY != 0 {
            AtimeMode::Never
        } else {
            mode(c)
        }
    }

    /// The policy given, read-only or not.
    pub fn base(&self) -> AtimeMode {
        mode(self.0.load(Relaxed))
    }

    pub fn read_only(&self) -> bool {
        self.0.load(Relaxed) & READ_ONLY != 0
    }

    /// Applies mount options in order, as mount(2) would: `noatime`,
    /// `relatime`, `strictatime` set the policy, `atime` turns `noatime`
    /// back into `relatime` (the kernel's default), `ro`/`rw` set
    /// read-only; other options change nothing. Returns the effective
    /// policy.
    pub fn apply<'a>(&self, opts: impl IntoIterator<Item = &'a str>) -> AtimeMode {
        let mut c = self.0.load(Relaxed);
        for o in opts {
            let ro = c & READ_ONLY;
            c = match o {
                "noatime" => code(AtimeMode::Never) | ro,
                "relatime" => code(AtimeMode::Relative) | ro,
                "strictatime" => code(AtimeMode::Strict) | ro,
                "atime" if mode(c) == AtimeMode::Never => code(AtimeMode::Relative) | ro,
                "ro" => c | READ_ONLY,
                "rw" => c & !READ_ONLY,
                _ => c,
            };
        }
        self.0.store(c, Relaxed);
        self.effective()
    }
}

impl Default for AtimePolicy {
    fn default() -> Self {
        AtimePolicy::new(AtimeMode::Relative)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_apply_in_order_and_read_only_wins_until_rw() {
        let p = AtimePolicy::default();
        assert_eq!(p.effective(), AtimeMode::Relative);
        assert_eq!(p.apply(["nosuid", "noatime"]), AtimeMode::Never);
        assert_eq!(p.apply(["atime"]), AtimeMode::Relative);
        assert_eq!(p.apply(["strictatime", "atime"]), AtimeMode::Strict);
        assert_eq!(p.apply(["ro"]), AtimeMode::Never);
        assert!(p.read_only());
        assert_eq!(p.base(), AtimeMode::Strict);
        // A policy given while read-only takes effect at `rw`.
        assert_eq!(p.apply(["relatime"]), AtimeMode::Never);
        assert_eq!(p.apply(["rw"]), AtimeMode::Relative);
        assert_eq!(p.apply(["ro", "rw", "noatime"]), AtimeMode::Never);
        assert!(!p.read_only());
        let shared = p.clone();
        shared.apply(["strictatime"]);
        assert_eq!(p.effective(), AtimeMode::Strict, "clones share the policy");
    }
}
