//! How the shell shows names, modes, times and `ls` lines.
//!
//! A module of its own because the live tree's commands and the snapshot
//! browser print the same lines, and neither should import the other for it.

use memfs_fs::{Attr, FileType, Timespec};

use super::quote;

pub fn name_str(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

pub fn mode_string(a: &Attr) -> String {
    let mut s = String::with_capacity(10);
    s.push(a.kind.letter());
    let p = a.perm as u32;
    let bits = [
        (0o400, 'r'),
        (0o200, 'w'),
        (0o100, 'x'),
        (0o040, 'r'),
        (0o020, 'w'),
        (0o010, 'x'),
        (0o004, 'r'),
        (0o002, 'w'),
        (0o001, 'x'),
    ];
    for (i, (bit, c)) in bits.iter().enumerate() {
        let set = p & bit != 0;
        let ch = match i {
            2 if p & 0o4000 != 0 => {
                if set {
                    's'
                } else {
                    'S'
                }
            }
            5 if p & 0o2000 != 0 => {
                if set {
                    's'
                } else {
                    'S'
                }
            }
            8 if p & 0o1000 != 0 => {
                if set {
                    't'
                } else {
                    'T'
                }
            }
            _ if set => *c,
            _ => '-',
        };
        s.push(ch);
    }
    s
}

/// `YYYY-MM-DD HH:MM:SS` in UTC (the shell has no time zone database).
pub fn format_time(t: Timespec, nanos: bool) -> String {
    let days = t.sec.div_euclid(86_400);
    let secs = t.sec.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    let (hh, mm, ss) = (secs / 3600, secs / 60 % 60, secs % 60);
    if nanos {
        format!(
            "{y:04}-{m:02}-{d:02} {hh:02}:{mm:02}:{ss:02}.{:09} UTC",
            t.nsec
        )
    } else {
        format!("{y:04}-{m:02}-{d:02} {hh:02}:{mm:02}")
    }
}

/// One `ls` line; `target` gives a symbolic link's target (live tree or snapshot).
pub fn ls_line_with(
    name: &[u8],
    a: &Attr,
    long: bool,
    target: impl FnOnce(u64) -> Option<Vec<u8>>,
) -> String {
    let shown = quote(&name_str(name));
    if !long {
        return shown;
    }
    let mut line = format!(
        "{} {:>3} {:>5} {:>5} {:>9} {} {}",
        mode_string(a),
        a.nlink,
        a.uid,
        a.gid,
        a.size,
        format_time(a.mtime, false),
        shown
    );
    if a.kind == FileType::Symlink
        && let Some(t) = target(a.ino)
    {
        line.push_str(" -> ");
        line.push_str(&name_str(&t));
    }
    line
}

#[cfg(test)]
mod tests {
    use memfs_fs::{Ctx, Fs, ROOT_INO};

    use super::*;

    #[test]
    fn times_format_in_utc() {
        let t = Timespec { sec: 0, nsec: 5 };
        assert_eq!(format_time(t, true), "1970-01-01 00:00:00.000000005 UTC");
        let t = Timespec {
            sec: 951_782_400,
            nsec: 0,
        }; // 2000-02-29
        assert_eq!(format_time(t, false), "2000-02-29 00:00");
        let t = Timespec { sec: -1, nsec: 0 };
        assert_eq!(format_time(t, false), "1969-12-31 23:59");
    }

    #[test]
    fn modes() {
        let fs = Fs::new(memfs_fs::Config {
            capacity: 1 << 20,
            max_inodes: 100,
        });
        let a = fs
            .create_path(Ctx::ROOT, ROOT_INO, "/f", 0o4755, true)
            .unwrap();
        assert_eq!(mode_string(&a), "-rwsr-xr-x");
    }
}
