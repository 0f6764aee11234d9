//! Byte counts as people read them.
//!
//! One format for the whole command, du -h's and df -h's: the shell's
//! `du` and `df` columns, `memfs mount`'s report and the snapshot lists all
//! show sizes the same way.

/// `100B`, `1.5K`, `12M`: binary units, one decimal below ten.
pub fn bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "K", "M", "G", "T", "P"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes}B")
    } else if v < 10.0 {
        format!("{v:.1}{}", UNITS[i])
    } else {
        format!("{v:.0}{}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_units_one_decimal_below_ten() {
        assert_eq!(bytes(1536), "1.5K");
        assert_eq!(bytes(100), "100B");
        assert_eq!(bytes(12 << 20), "12M");
    }
}
