//! Access-log lines in the combined log format.

use std::io::Write;
use std::net::SocketAddr;

use corelocal_proto::http::{date, Request};

/// Longest field copied into a log line (targets and user agents can be 8 KiB).
const FIELD_BYTES_MAX: usize = 512;

/// Appends `b` with quotes, backslashes and non-printable bytes escaped as `\xHH`, truncated.
fn escaped(out: &mut Vec<u8>, b: &[u8]) {
    for &c in b.iter().take(FIELD_BYTES_MAX) {
        if c.is_ascii_graphic() && c != b'"' && c != b'\\' || c == b' ' {
            out.push(c);
        } else {
            let _ = write!(out, "\\x{c:02x}");
        }
    }
}

/// `peer - - [time] "METHOD target VERSION" status bytes "referer" "user-agent"\n`.
pub(super) fn write_line(
    out: &mut Vec<u8>,
    peer: Option<SocketAddr>,
    unix: u64,
    req: Option<&Request<'_>>,
    status: u16,
    bytes: u64,
) {
    match peer {
        Some(p) => {
            let _ = write!(out, "{}", p.ip());
        }
        None => out.push(b'-'),
    }
    out.extend_from_slice(b" - - [");
    out.extend_from_slice(&date::format_clf(unix));
    out.extend_from_slice(b"] \"");
    if let Some(r) = req {
        escaped(out, r.method_bytes);
        out.push(b' ');
        escaped(out, r.target);
        out.push(b' ');
        out.extend_from_slice(r.version.as_str().as_bytes());
    }
    let _ = write!(out, "\" {status} {bytes} \"");
    escaped(out, req.and_then(|r| r.referer).unwrap_or(b"-"));
    out.extend_from_slice(b"\" \"");
    escaped(out, req.and_then(|r| r.user_agent).unwrap_or(b"-"));
    out.extend_from_slice(b"\"\n");
}
