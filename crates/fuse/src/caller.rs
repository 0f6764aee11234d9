//! The credentials of the process behind a request, read from
//! `/proc/PID/status` where the request itself does not carry them: its
//! supplementary groups (FUSE never sends them), and its fsuid/fsgid once
//! FUSE_ALLOW_IDMAP is negotiated (the kernel then sends uid = gid = -1 on
//! every request that creates no node).
//!
//! A process that is gone, or whose status cannot be read, has no groups and
//! no ids: callers keep the unset id (-1), which owns nothing and is not
//! root, the safe answer for every check the engine makes with it.

/// The id the kernel sends when it does not say who the caller is
/// (`FUSE_INVALID_UIDGID`, uapi fuse.h).
pub(crate) const UNSET: u32 = u32::MAX;

/// The text of `/proc/PID/status`, read once per request that needs it.
pub(crate) struct Status(String);

impl Status {
    pub(crate) fn read(pid: u32) -> Option<Status> {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .map(Status)
    }

    fn line(&self, key: &str) -> Option<&str> {
        self.0.lines().find_map(|l| l.strip_prefix(key))
    }

    /// The filesystem uid and gid: the 4th value of the `Uid:` and `Gid:`
    /// lines (real, effective, saved, filesystem), the ids the kernel
    /// checks file access with (and sends in a FUSE request header).
    pub(crate) fn fs_ids(&self) -> Option<(u32, u32)> {
        let fourth = |key| self.line(key)?.split_whitespace().nth(3)?.parse().ok();
        Some((fourth("Uid:")?, fourth("Gid:")?))
    }

    /// Whether `gid` is among the supplementary groups (as libfuse's
    /// fuse_req_getgroups).
    pub(crate) fn in_group(&self, gid: u32) -> bool {
        self.line("Groups:")
            .is_some_and(|g| g.split_whitespace().any(|x| x.parse() == Ok(gid)))
    }
}

/// Whether the process `pid` has `gid` among its supplementary groups. A
/// process that is gone or invisible counts as not in the group: the safe
/// answer for privilege drops.
pub(crate) fn in_group(pid: u32, gid: u32) -> bool {
    Status::read(pid).is_some_and(|s| s.in_group(gid))
}

/// The caller's fsuid and fsgid: `uid`/`gid` from the request header, or,
/// where the kernel left them unset (-1), from `/proc/PID/status`.
pub(crate) fn fs_ids(pid: u32, uid: u32, gid: u32) -> (u32, u32) {
    if uid != UNSET && gid != UNSET {
        return (uid, gid);
    }
    match Status::read(pid).and_then(|s| s.fs_ids()) {
        Some((u, g)) => (
            if uid == UNSET { u } else { uid },
            if gid == UNSET { g } else { gid },
        ),
        None => (uid, gid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tcat\nUmask:\t0022\nState:\tR (running)\n\
        Uid:\t1000\t1001\t1002\t1003\nGid:\t2000\t2001\t2002\t2003\n\
        FDSize:\t64\nGroups:\t4 24 27 \nNgid:\t0\n";

    #[test]
    fn fs_ids_are_the_fourth_values() {
        let s = Status(STATUS.into());
        assert_eq!(s.fs_ids(), Some((1003, 2003)));
        assert!(s.in_group(24));
        assert!(!s.in_group(2));
        assert!(!s.in_group(2003), "the fsgid is not a supplementary group");
    }

    #[test]
    fn malformed_status_has_no_ids() {
        assert_eq!(Status("Uid:\t1\t2\n".into()).fs_ids(), None);
        assert_eq!(
            Status("Uid:\t1\t2\t3\tx\nGid:\t0\t0\t0\t0\n".into()).fs_ids(),
            None
        );
        assert_eq!(Status(String::new()).fs_ids(), None);
        assert!(!Status("Groups:\n".into()).in_group(0));
    }

    #[test]
    fn this_process() {
        // SAFETY: no preconditions; these cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let pid = std::process::id();
        // Without setfsuid the fsuid is the effective uid.
        assert_eq!(fs_ids(pid, UNSET, UNSET), (uid, gid));
        // Ids the request carries are kept.
        assert_eq!(fs_ids(pid, 7, 8), (7, 8));
        assert_eq!(fs_ids(pid, 7, UNSET), (7, gid));
        // A process that does not exist: nothing is made up.
        assert_eq!(fs_ids(u32::MAX - 1, UNSET, UNSET), (UNSET, UNSET));
        assert!(!in_group(u32::MAX - 1, 0));
    }
}
