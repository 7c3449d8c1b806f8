//! Request target → normalised path relative to the document root.
//!
//! The result never names anything above the root: percent-escapes are decoded *before* the
//! path is split into segments (so `%2e%2e` and `..%2f` are seen as `..`), `.` and empty
//! segments are dropped, and a `..` that would climb above the root is an error rather than
//! being clamped, so probes are visible in the logs. NUL (raw or `%00`) is refused because no
//! file name may contain it. Symlinks are the file server's business (it checks the real path
//! of what it opened).

use std::borrow::Cow;

/// Why a target cannot name a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathError {
    /// Not origin-form or absolute-form (e.g. `*` or authority-form).
    NotAPath,
    /// A `%` not followed by two hex digits.
    BadEscape,
    /// A NUL byte (raw or `%00`).
    Nul,
    /// `..` climbing above the root.
    Escape,
    /// Longer than the segment limit.
    TooManySegments,
}

/// Most path segments kept (deeper paths are refused; real file trees are far shallower).
pub const SEGMENTS_MAX: usize = 256;

/// A normalised path: segments joined by `/`, no leading slash (`""` is the root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NormPath<'a> {
    /// The relative path; borrowed from the target when it needed no rewriting.
    pub rel: Cow<'a, [u8]>,
    /// Whether the target named a directory (ended with `/`, or is the root).
    pub dir: bool,
}

/// Normalises a request target (origin-form `/a/b?q` or absolute-form `http://h/a/b`).
pub fn normalize_target(target: &[u8]) -> Result<NormPath<'_>, PathError> {
    let path = path_part(target)?;
    let path = match path.iter().position(|&b| b == b'?' || b == b'#') {
        Some(i) => &path[..i],
        None => path,
    };
    if is_clean(path) {
        let rel = &path[1..];
        return Ok(NormPath {
            rel: Cow::Borrowed(rel),
            dir: rel.is_empty() || rel.ends_with(b"/"),
        });
    }
    let decoded = percent_decode(path)?;
    let trailing_slash = decoded.ends_with(b"/") || ends_with_dot_segment(&decoded);
    let mut segments: Vec<&[u8]> = Vec::new();
    for seg in decoded.split(|&b| b == b'/') {
        match seg {
            b"" | b"." => {}
            b".." => {
                segments.pop().ok_or(PathError::Escape)?;
            }
            _ if segments.len() == SEGMENTS_MAX => return Err(PathError::TooManySegments),
            _ => segments.push(seg),
        }
    }
    let mut rel = segments.join(&b'/');
    let dir = segments.is_empty() || trailing_slash;
    if dir && !rel.is_empty() {
        rel.push(b'/');
    }
    Ok(NormPath {
        rel: Cow::Owned(rel),
        dir,
    })
}

/// The path of an origin-form or absolute-form target, starting with `/`.
fn path_part(target: &[u8]) -> Result<&[u8], PathError> {
    if target.first() == Some(&b'/') {
        return Ok(target);
    }
    let rest = strip_prefix_ci(target, b"http://")
        .or_else(|| strip_prefix_ci(target, b"https://"))
        .ok_or(PathError::NotAPath)?;
    match rest.iter().position(|&b| b == b'/' || b == b'?') {
        Some(i) if rest[i] == b'/' => Ok(&rest[i..]),
        _ => Ok(b"/"),
    }
}

fn strip_prefix_ci<'a>(s: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    (s.len() >= prefix.len() && s[..prefix.len()].eq_ignore_ascii_case(prefix))
        .then(|| &s[prefix.len()..])
}

/// Whether the path can be used as is: no escapes, no NUL, no empty, `.` or `..` segment
/// (except the empty one after a trailing slash).
fn is_clean(path: &[u8]) -> bool {
    if path.iter().any(|&b| b == b'%' || b == 0) {
        return false;
    }
    let body = &path[1..];
    if body.is_empty() {
        return true;
    }
    // One trailing slash is fine ("/dir/"), but what is left must be real segments: "//"
    // must not pass as "/" + "/".
    let body = body.strip_suffix(b"/").unwrap_or(body);
    !body.is_empty()
        && body
            .split(|&b| b == b'/')
            .all(|s| !matches!(s, b"" | b"." | b".."))
}

fn ends_with_dot_segment(p: &[u8]) -> bool {
    p.ends_with(b"/.") || p.ends_with(b"/..")
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Decodes `%XX` escapes; refuses bad escapes and NUL.
pub fn percent_decode(s: &[u8]) -> Result<Vec<u8>, PathError> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let b = match s[i] {
            b'%' => {
                let hi = s.get(i + 1).copied().and_then(hex);
                let lo = s.get(i + 2).copied().and_then(hex);
                let (Some(hi), Some(lo)) = (hi, lo) else {
                    return Err(PathError::BadEscape);
                };
                i += 3;
                hi << 4 | lo
            }
            b => {
                i += 1;
                b
            }
        };
        if b == 0 {
            return Err(PathError::Nul);
        }
        out.push(b);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(t: &str) -> Result<(String, bool), PathError> {
        normalize_target(t.as_bytes())
            .map(|p| (String::from_utf8(p.rel.into_owned()).unwrap(), p.dir))
    }

    #[test]
    fn clean_paths_are_borrowed() {
        let p = normalize_target(b"/a/b.html?x=1").unwrap();
        assert!(matches!(p.rel, Cow::Borrowed(b"a/b.html")));
        assert!(!p.dir);
        assert_eq!(rel("/"), Ok(("".into(), true)));
        assert_eq!(rel("/d/"), Ok(("d/".into(), true)));
    }

    #[test]
    fn dot_segments_and_slashes_are_normalised() {
        assert_eq!(rel("/a/./b//c"), Ok(("a/b/c".into(), false)));
        assert_eq!(rel("/a/b/../c"), Ok(("a/c".into(), false)));
        assert_eq!(rel("/a/b/.."), Ok(("a/".into(), true)));
        assert_eq!(rel("/a/%62"), Ok(("a/b".into(), false)));
        assert_eq!(rel("/a%20b"), Ok(("a b".into(), false)));
        assert_eq!(rel("/a/.."), Ok(("".into(), true)));
        // Found by the fuzzer: "//" once passed the fast path as rel "/".
        assert_eq!(rel("//?q#f"), Ok(("".into(), true)));
        assert_eq!(rel("//etc/passwd"), Ok(("etc/passwd".into(), false)));
        assert_eq!(rel("///"), Ok(("".into(), true)));
    }

    #[test]
    fn escapes_above_root_are_refused() {
        for t in [
            "/..",
            "/../etc/passwd",
            "/a/../../etc/passwd",
            "/%2e%2e/etc/passwd",
            "/%2E%2E%2Fetc%2Fpasswd",
            "/a/..%2f..%2fetc",
            "/./../x",
        ] {
            assert_eq!(rel(t), Err(PathError::Escape), "{t}");
        }
    }

    #[test]
    fn nul_and_bad_escapes_are_refused() {
        assert_eq!(rel("/a%00b"), Err(PathError::Nul));
        assert_eq!(normalize_target(b"/a\0b").unwrap_err(), PathError::Nul);
        assert_eq!(rel("/a%0"), Err(PathError::BadEscape));
        assert_eq!(rel("/a%zz"), Err(PathError::BadEscape));
    }

    #[test]
    fn absolute_form_and_non_paths() {
        assert_eq!(rel("http://example.com/a/b"), Ok(("a/b".into(), false)));
        assert_eq!(rel("HTTP://example.com"), Ok(("".into(), true)));
        assert_eq!(rel("http://h?q"), Ok(("".into(), true)));
        assert_eq!(rel("*"), Err(PathError::NotAPath));
        assert_eq!(rel("example.com:80"), Err(PathError::NotAPath));
    }

    #[test]
    fn depth_is_bounded() {
        let deep = "/a".repeat(SEGMENTS_MAX + 1) + "/%41";
        assert_eq!(rel(&deep), Err(PathError::TooManySegments));
    }
}
