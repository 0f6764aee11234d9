//! Errors are Linux errno values: the engine's callers (the FUSE adapter, the
//! shell) must be able to pass them on to the kernel or the user unchanged.

use std::fmt;

/// A Linux errno value.
#[derive(Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub struct Errno(pub i32);

pub type Result<T> = std::result::Result<T, Errno>;

macro_rules! errnos {
    ($($name:ident),* $(,)?) => {
        impl Errno {
            $(pub const $name: Errno = Errno(libc::$name);)*

            /// The symbolic name, e.g. `ENOENT`.
            pub fn name(self) -> &'static str {
                match self.0 {
                    $(libc::$name => stringify!($name),)*
                    _ => "E?",
                }
            }
        }
    };
}

errnos!(
    EPERM,
    ENOENT,
    EIO,
    EBADF,
    EAGAIN,
    ENOMEM,
    EACCES,
    EEXIST,
    EXDEV,
    ENODEV,
    ENOTDIR,
    EISDIR,
    EINVAL,
    EFBIG,
    ENOSPC,
    EMLINK,
    ERANGE,
    EDEADLK,
    ENAMETOOLONG,
    ENOLCK,
    ENOSYS,
    ENOTEMPTY,
    ELOOP,
    ENODATA,
    EBUSY,
    EOPNOTSUPP,
    E2BIG,
    EINTR,
    ENXIO,
    EOVERFLOW,
    ESTALE,
    EROFS,
    ETXTBSY,
);

impl Errno {
    /// The C library's description, e.g. "No such file or directory".
    pub fn description(self) -> String {
        std::io::Error::from_raw_os_error(self.0).to_string()
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name())
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.description();
        // io::Error appends " (os error N)"; keep the human part only.
        let d = d.split(" (os error").next().unwrap_or(&d);
        write!(f, "{d}")
    }
}

impl From<Errno> for std::io::Error {
    fn from(e: Errno) -> Self {
        std::io::Error::from_raw_os_error(e.0)
    }
}
