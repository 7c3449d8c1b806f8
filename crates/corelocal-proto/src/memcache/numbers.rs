//! Numbers exactly as memcached's `safe_strtoull`, `safe_strtoul` and `safe_strtol` read them
//! on LP64 Linux: C `strto*` (leading whitespace, optional sign, decimal digits), then the next
//! byte must be whitespace or the end, and results are truncated to the target width the way
//! memcached's casts do (flags to 32 bits, lengths and times to `int32_t`).

/// C `isspace` in the "C" locale.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// A C `strto*` scan: (negative, magnitude, end index), or `None` when nothing was converted
/// or the magnitude overflows 64 bits (ERANGE).
fn scan(s: &[u8]) -> Option<(bool, u64, usize)> {
    let mut i = s.iter().take_while(|&&b| is_space(b)).count();
    let neg = match s.get(i) {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let start = i;
    let mut v: u64 = 0;
    let mut overflow = false;
    while let Some(d) = s.get(i).filter(|b| b.is_ascii_digit()) {
        match v
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(d - b'0')))
        {
            Some(n) => v = n,
            None => overflow = true,
        }
        i += 1;
    }
    if i == start || overflow {
        return None;
    }
    Some((neg, v, i))
}

/// The byte after the number must be whitespace or the end of the token.
fn ends_well(s: &[u8], end: usize) -> bool {
    !matches!(s.get(end), Some(&b) if !is_space(b))
}

/// Unsigned 64-bit, as `safe_strtoull`: a '-' is refused only when the result would be negative
/// as a signed number (so `-0` is 0).
pub fn safe_strtoull(s: &[u8]) -> Option<u64> {
    let (neg, mag, end) = scan(s)?;
    if !ends_well(s, end) {
        return None;
    }
    let v = if neg { mag.wrapping_neg() } else { mag };
    if (v as i64) < 0 && neg {
        return None;
    }
    Some(v)
}

/// As [`safe_strtoull`] but truncated to 32 bits (`safe_strtoul` into `uint32_t` flags).
pub fn safe_strtoul(s: &[u8]) -> Option<u32> {
    safe_strtoull(s).map(|v| v as u32)
}

/// Signed, as `safe_strtol` into `int32_t`: parsed as a 64-bit `long` (out of range = error),
/// then truncated to 32 bits.
pub fn safe_strtol(s: &[u8]) -> Option<i32> {
    let (neg, mag, end) = scan(s)?;
    if !ends_well(s, end) {
        return None;
    }
    let v: i64 = if neg {
        if mag > 1 << 63 {
            return None;
        }
        (mag as i64).wrapping_neg()
    } else {
        i64::try_from(mag).ok()?
    };
    Some(v as i32)
}

/// `safe_strtoull` on a value's data as `incr` sees it: the data is followed by `\r\n`, so the
/// number may be followed by anything starting with whitespace.
pub(super) fn strtoull_prefix(data: &[u8]) -> Option<u64> {
    let (neg, mag, end) = scan(data)?;
    if end < data.len() && !is_space(data[end]) {
        return None;
    }
    let v = if neg { mag.wrapping_neg() } else { mag };
    if (v as i64) < 0 && neg {
        return None;
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_memcached() {
        assert_eq!(safe_strtoull(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(safe_strtoull(b"18446744073709551616"), None);
        assert_eq!(safe_strtoull(b"+5"), Some(5));
        assert_eq!(safe_strtoull(b"01"), Some(1));
        assert_eq!(safe_strtoull(b"0x1"), None);
        assert_eq!(safe_strtoull(b"5x"), None);
        assert_eq!(safe_strtoull(b"-1"), None);
        assert_eq!(safe_strtoull(b"-0"), Some(0));
        assert_eq!(safe_strtoull(b""), None);
        assert_eq!(safe_strtoull(b"-"), None);
        assert_eq!(safe_strtoul(b"4294967296"), Some(0), "flags truncate");
        assert_eq!(safe_strtoul(b"18446744073709551615"), Some(u32::MAX));
        assert_eq!(safe_strtoul(b"-1"), None);
        assert_eq!(safe_strtol(b"-1"), Some(-1));
        assert_eq!(safe_strtol(b"4294967297"), Some(1), "lengths truncate");
        assert_eq!(safe_strtol(b"2147483648"), Some(i32::MIN));
        assert_eq!(safe_strtol(b"9223372036854775808"), None);
        assert_eq!(safe_strtol(b"-9223372036854775808"), Some(0));
        assert_eq!(safe_strtol(b"abc"), None);
    }

    #[test]
    fn values_for_incr() {
        assert_eq!(strtoull_prefix(b"12"), Some(12));
        assert_eq!(strtoull_prefix(b" 1"), Some(1));
        assert_eq!(strtoull_prefix(b"1 2"), Some(1));
        assert_eq!(strtoull_prefix(b"12\n"), Some(12));
        assert_eq!(strtoull_prefix(b"99 "), Some(99));
        assert_eq!(strtoull_prefix(b"12abc"), None);
        assert_eq!(strtoull_prefix(b" "), None);
        assert_eq!(strtoull_prefix(b"-1"), None);
        assert_eq!(strtoull_prefix(b"-0"), Some(0));
        assert_eq!(strtoull_prefix(b"123456789012345678901234"), None);
    }
}
