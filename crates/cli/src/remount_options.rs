//! What the options of `mount -o remount,...` change: the mount(2) flags the
//! kernel keeps, and the atime policy the server keeps.
//!
//! A module of its own because both sides of a remount read it: `memfs
//! mount` (the mount(8) helper, which makes the call) and the control
//! socket (the running server, which takes the atime policy).

/// The mount(2) flags that `-o remount,...` asks for. mount(8) passes the
/// whole option set (the current ones merged with the new), and the kernel
/// replaces the mount's flags with these; with no atime option it keeps the
/// current atime policy.
pub fn mount_flags<'a>(opts: impl Iterator<Item = &'a str>) -> nix::mount::MsFlags {
    use nix::mount::MsFlags;
    let mut flags = MsFlags::MS_REMOUNT;
    for o in opts {
        let (set, clear) = match o {
            "ro" => (MsFlags::MS_RDONLY, MsFlags::empty()),
            "rw" => (MsFlags::empty(), MsFlags::MS_RDONLY),
            "nosuid" => (MsFlags::MS_NOSUID, MsFlags::empty()),
            "suid" => (MsFlags::empty(), MsFlags::MS_NOSUID),
            "nodev" => (MsFlags::MS_NODEV, MsFlags::empty()),
            "dev" => (MsFlags::empty(), MsFlags::MS_NODEV),
            "noexec" => (MsFlags::MS_NOEXEC, MsFlags::empty()),
            "exec" => (MsFlags::empty(), MsFlags::MS_NOEXEC),
            "sync" => (MsFlags::MS_SYNCHRONOUS, MsFlags::empty()),
            "async" => (MsFlags::empty(), MsFlags::MS_SYNCHRONOUS),
            "dirsync" => (MsFlags::MS_DIRSYNC, MsFlags::empty()),
            "lazytime" => (MsFlags::MS_LAZYTIME, MsFlags::empty()),
            "nolazytime" => (MsFlags::empty(), MsFlags::MS_LAZYTIME),
            "nodiratime" => (MsFlags::MS_NODIRATIME, MsFlags::empty()),
            "diratime" => (MsFlags::empty(), MsFlags::MS_NODIRATIME),
            "noatime" => (
                MsFlags::MS_NOATIME,
                MsFlags::MS_RELATIME | MsFlags::MS_STRICTATIME,
            ),
            "relatime" => (
                MsFlags::MS_RELATIME,
                MsFlags::MS_NOATIME | MsFlags::MS_STRICTATIME,
            ),
            "strictatime" => (
                MsFlags::MS_STRICTATIME,
                MsFlags::MS_NOATIME | MsFlags::MS_RELATIME,
            ),
            "atime" => (MsFlags::empty(), MsFlags::MS_NOATIME),
            _ => (MsFlags::empty(), MsFlags::empty()),
        };
        flags = (flags - clear) | set;
    }
    flags
}

/// Mount options that the server's atime policy follows (mount.rs,
/// `remount_atime`, sends them to the server in their order).
pub const ATIME_POLICY: [&str; 6] = ["noatime", "relatime", "strictatime", "atime", "ro", "rw"];
