//! `Range: bytes=` (one range; RFC 9110 §14) and entity-tag matching (§8.8.3, §13.1.2).

/// What a `Range` field asks of a representation of a given length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeAnswer {
    /// Serve the whole representation (no usable range: syntax error, other unit, several
    /// ranges — the server may ignore a Range field it does not support, §14.2).
    Full,
    /// Serve bytes `start..end` (end exclusive) with 206.
    Part {
        /// First byte.
        start: u64,
        /// One past the last byte.
        end: u64,
    },
    /// No byte of the representation is in the range: 416 with `Content-Range: bytes */len`.
    Unsatisfiable,
}

fn digits(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 19 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(s.iter().fold(0, |n, &d| n * 10 + u64::from(d - b'0')))
}

fn trim(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// Evaluates a `Range` field value against a representation of `len` bytes.
pub fn parse_range(value: &[u8], len: u64) -> RangeAnswer {
    let value = trim(value);
    let Some(spec) = value
        .get(..6)
        .filter(|u| u.eq_ignore_ascii_case(b"bytes="))
        .map(|_| trim(&value[6..]))
    else {
        return RangeAnswer::Full;
    };
    if spec.contains(&b',') {
        return RangeAnswer::Full;
    }
    let Some(dash) = spec.iter().position(|&b| b == b'-') else {
        return RangeAnswer::Full;
    };
    let (first, last) = (&spec[..dash], &spec[dash + 1..]);
    if first.is_empty() {
        // Suffix range: the last n bytes.
        return match digits(last) {
            None => RangeAnswer::Full,
            Some(n) if n == 0 || len == 0 => RangeAnswer::Unsatisfiable,
            Some(n) => RangeAnswer::Part {
                start: len - n.min(len),
                end: len,
            },
        };
    }
    let Some(start) = digits(first) else {
        return RangeAnswer::Full;
    };
    let last = match (last.is_empty(), digits(last)) {
        (true, _) => None,
        (false, Some(l)) if l >= start => Some(l),
        (false, _) => return RangeAnswer::Full,
    };
    if start >= len {
        return RangeAnswer::Unsatisfiable;
    }
    let end = last.map_or(len, |l| l.saturating_add(1).min(len));
    RangeAnswer::Part { start, end }
}

/// Iterates the entity-tags of an `If-None-Match` / `If-Match` list as (weak, opaque-tag with
/// quotes). Stops at the first malformed element.
fn etags(mut list: &[u8]) -> impl Iterator<Item = (bool, &[u8])> {
    std::iter::from_fn(move || {
        list = trim_list_sep(list);
        let (weak, rest) = match list.strip_prefix(b"W/") {
            Some(rest) => (true, rest),
            None => (false, list),
        };
        if rest.first() != Some(&b'"') {
            return None;
        }
        let close = rest[1..].iter().position(|&b| b == b'"')? + 2;
        list = &rest[close..];
        Some((weak, &rest[..close]))
    })
}

fn trim_list_sep(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t' | b',', rest @ ..] = v {
        v = rest;
    }
    v
}

/// `If-None-Match` evaluation (weak comparison): true when the field matches `etag` (which
/// includes its quotes) or is `*`, i.e. when the server should answer 304.
pub fn if_none_match(field: &[u8], etag: &[u8]) -> bool {
    let etag = etag.strip_prefix(b"W/").unwrap_or(etag);
    trim(field) == b"*" || etags(field).any(|(_, tag)| tag == etag)
}

/// `If-Range` evaluation: the range applies only if the field is the strong `etag` or exactly
/// the `Last-Modified` date (`last_modified`, an IMF-fixdate).
pub fn if_range(field: &[u8], etag: &[u8], last_modified: &[u8]) -> bool {
    let field = trim(field);
    if field.first() == Some(&b'"') {
        return !etag.starts_with(b"W/") && field == etag;
    }
    field == last_modified
}

#[cfg(test)]
mod tests {
    use super::RangeAnswer::*;
    use super::*;

    #[test]
    fn single_ranges() {
        assert_eq!(parse_range(b"bytes=0-9", 100), Part { start: 0, end: 10 });
        assert_eq!(
            parse_range(b"bytes=90-", 100),
            Part {
                start: 90,
                end: 100
            }
        );
        assert_eq!(
            parse_range(b"bytes=90-1000", 100),
            Part {
                start: 90,
                end: 100
            }
        );
        assert_eq!(
            parse_range(b"bytes=-10", 100),
            Part {
                start: 90,
                end: 100
            }
        );
        assert_eq!(
            parse_range(b"bytes=-1000", 100),
            Part { start: 0, end: 100 }
        );
        assert_eq!(parse_range(b"Bytes = 5-5", 100), Full); // space before '=' is not allowed
        assert_eq!(parse_range(b"BYTES=5-5", 100), Part { start: 5, end: 6 });
    }

    #[test]
    fn unsatisfiable_ranges() {
        assert_eq!(parse_range(b"bytes=100-", 100), Unsatisfiable);
        assert_eq!(parse_range(b"bytes=100-200", 100), Unsatisfiable);
        assert_eq!(parse_range(b"bytes=-0", 100), Unsatisfiable);
        assert_eq!(parse_range(b"bytes=0-", 0), Unsatisfiable);
        assert_eq!(parse_range(b"bytes=-5", 0), Unsatisfiable);
    }

    #[test]
    fn ignored_ranges() {
        for v in [
            &b"bytes=0-1,5-6"[..],
            b"items=0-1",
            b"bytes=",
            b"bytes=-",
            b"bytes=5-1",
            b"bytes=a-b",
            b"bytes=1-x",
            b"bytes=99999999999999999999-",
        ] {
            assert_eq!(parse_range(v, 100), Full, "{}", String::from_utf8_lossy(v));
        }
    }

    #[test]
    fn etag_matching() {
        let tag = b"\"5f-1a\"";
        assert!(if_none_match(b"\"5f-1a\"", tag));
        assert!(if_none_match(b"W/\"5f-1a\"", tag));
        assert!(if_none_match(b"\"x\", \"5f-1a\"", tag));
        assert!(if_none_match(b"*", tag));
        assert!(!if_none_match(b"\"5f-1b\"", tag));
        assert!(!if_none_match(b"5f-1a", tag));
        assert!(!if_none_match(b"\"a,b\"", b"\"a\""));
        assert!(if_range(
            b"\"5f-1a\"",
            tag,
            b"Thu, 01 Jan 1970 00:00:00 GMT"
        ));
        assert!(!if_range(b"W/\"5f-1a\"", tag, b"x"));
        assert!(if_range(
            b"Thu, 01 Jan 1970 00:00:00 GMT",
            tag,
            b"Thu, 01 Jan 1970 00:00:00 GMT"
        ));
    }
}
