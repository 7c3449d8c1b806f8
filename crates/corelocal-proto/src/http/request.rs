//! Incremental HTTP/1.1 request-head parser.
//!
//! The parser borrows from the input: a complete head yields a [`Request`] whose fields point
//! into the caller's buffer, so parsing allocates nothing. A [`Parser`] remembers how far it
//! has scanned for the end of the head, so a client that dribbles bytes costs O(n) in total,
//! not O(n²).

use super::response::Status;

/// Limits on one request. Exceeding one is an [`Error`] and the connection is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest request line (method, target, version; without the line end). → 414.
    pub request_line_bytes_max: usize,
    /// Largest header section (after the request line, up to and including the empty line).
    /// → 431.
    pub header_bytes_max: usize,
    /// Most header fields. → 431.
    pub header_count_max: usize,
    /// Largest request body (`Content-Length`) the server reads and discards. → 413.
    pub body_bytes_max: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            request_line_bytes_max: 8 * 1024,
            header_bytes_max: 16 * 1024,
            header_count_max: 100,
            body_bytes_max: 64 * 1024,
        }
    }
}

/// Request method. Only GET and HEAD are served; anything else is answered 405.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `GET`.
    Get,
    /// `HEAD`.
    Head,
    /// Any other well-formed method token.
    Other,
}

/// Protocol version of a request (major version 1 only; others are [`Error::Version`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    /// `HTTP/1.0`: close by default.
    Http10,
    /// `HTTP/1.1` (and any later 1.x minor): keep-alive by default.
    Http11,
}

impl Version {
    /// The version as written in a request line.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::Http10 => "HTTP/1.0",
            Version::Http11 => "HTTP/1.1",
        }
    }
}

/// Why a request head was rejected; each maps to a status code and closes the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// Malformed request (the reason is for logs and tests). → 400.
    Bad(&'static str),
    /// Request line longer than the limit. → 414.
    LineTooLong,
    /// Header section or header count over the limit. → 431.
    HeadersTooLarge,
    /// Declared body larger than the limit. → 413.
    BodyTooLarge,
    /// HTTP major version other than 1. → 505.
    Version,
    /// `Transfer-Encoding` (bodies are only framed by Content-Length here). → 501.
    TransferEncoding,
}

impl Error {
    /// The status code to answer with.
    pub fn status(self) -> Status {
        match self {
            Error::Bad(_) => Status::BadRequest,
            Error::LineTooLong => Status::UriTooLong,
            Error::HeadersTooLarge => Status::HeadersTooLarge,
            Error::BodyTooLarge => Status::PayloadTooLarge,
            Error::Version => Status::VersionNotSupported,
            Error::TransferEncoding => Status::NotImplemented,
        }
    }
}

/// A parsed request head; every slice points into the parsed buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    /// The method.
    pub method: Method,
    /// The method token as sent (for logs).
    pub method_bytes: &'a [u8],
    /// The request target as sent (origin-form, absolute-form, `*`, ...).
    pub target: &'a [u8],
    /// The protocol version.
    pub version: Version,
    /// Whether the connection stays open after the response.
    pub keep_alive: bool,
    /// Whether the client asked for keep-alive explicitly (HTTP/1.0 `Connection: keep-alive`,
    /// which must be echoed back).
    pub keep_alive_explicit: bool,
    /// `Content-Length` (0 when absent): body bytes that follow the head.
    pub content_length: u64,
    /// `Host`.
    pub host: Option<&'a [u8]>,
    /// `If-None-Match`.
    pub if_none_match: Option<&'a [u8]>,
    /// `If-Modified-Since`.
    pub if_modified_since: Option<&'a [u8]>,
    /// `If-Range`.
    pub if_range: Option<&'a [u8]>,
    /// `Range`.
    pub range: Option<&'a [u8]>,
    /// `User-Agent` (for the access log).
    pub user_agent: Option<&'a [u8]>,
    /// `Referer` (for the access log).
    pub referer: Option<&'a [u8]>,
    /// Number of header fields.
    pub header_count: usize,
    /// The raw header section (field lines), for [`Request::headers`].
    header_block: &'a [u8],
}

impl<'a> Request<'a> {
    /// Every header field as (name, value with surrounding whitespace removed), in order.
    pub fn headers(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> {
        lines(self.header_block)
            .take_while(|l| !l.is_empty())
            .filter_map(split_field)
    }
}

/// The outcome of parsing the front of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parse<'a> {
    /// A complete head; `head_len` bytes of the buffer hold it (leading empty lines included).
    /// `request.content_length` body bytes follow.
    Complete {
        /// The request.
        request: Request<'a>,
        /// Bytes of the buffer used by the head.
        head_len: usize,
    },
    /// The head is not complete yet: call again with more bytes (same buffer start).
    Partial,
}

/// Incremental parser state for one request head: how far the buffer has been scanned.
///
/// Call [`Parser::parse`] with the whole unconsumed buffer each time more bytes arrive; after
/// a complete head (or to abandon one), call [`Parser::reset`].
#[derive(Debug, Default, Clone)]
pub struct Parser {
    /// Bytes of the buffer known to hold no head end (scan resumes here).
    scanned: usize,
    /// End of the request line (just past its `\n`), once seen.
    line_end: Option<usize>,
}

impl Parser {
    /// A parser at the start of a request.
    pub fn new() -> Parser {
        Parser::default()
    }

    /// Forgets the scan state (the next call starts a new request).
    pub fn reset(&mut self) {
        *self = Parser::default();
    }

    /// Parses the request head at the front of `buf` (which must start where the previous call's
    /// buffer started, with more bytes appended).
    pub fn parse<'a>(&mut self, buf: &'a [u8], limits: &Limits) -> Result<Parse<'a>, Error> {
        // Empty lines before a request line are ignored (RFC 9112 §2.2), but bounded.
        let lead = buf
            .iter()
            .take_while(|&&b| b == b'\r' || b == b'\n')
            .count();
        if lead > limits.request_line_bytes_max {
            return Err(Error::Bad("too many empty lines"));
        }
        if lead == buf.len() {
            return Ok(Parse::Partial);
        }
        let line_end = match self.line_end {
            Some(e) => e,
            None => match find_byte(&buf[lead..], b'\n') {
                Some(i) => {
                    let e = lead + i + 1;
                    self.line_end = Some(e);
                    self.scanned = e - 1;
                    e
                }
                None if buf.len() - lead > limits.request_line_bytes_max => {
                    return Err(Error::LineTooLong);
                }
                None => return Ok(Parse::Partial),
            },
        };
        if trim_cr(&buf[lead..line_end - 1]).len() > limits.request_line_bytes_max {
            return Err(Error::LineTooLong);
        }
        let end = match self.find_head_end(buf) {
            Some(end) => end,
            None if buf.len() - line_end > limits.header_bytes_max => {
                return Err(Error::HeadersTooLarge)
            }
            None => return Ok(Parse::Partial),
        };
        if end - line_end > limits.header_bytes_max {
            return Err(Error::HeadersTooLarge);
        }
        let request = parse_head(&buf[lead..line_end], &buf[line_end..end], limits)?;
        Ok(Parse::Complete {
            request,
            head_len: end,
        })
    }

    /// Finds the end of the head: a `\n` followed by an empty line (`\n` or `\r\n`), scanning
    /// from where the last call stopped. Returns the index just past it.
    fn find_head_end(&mut self, buf: &[u8]) -> Option<usize> {
        let mut i = self.scanned;
        while let Some(off) = find_byte(&buf[i..], b'\n') {
            let nl = i + off;
            match (buf.get(nl + 1), buf.get(nl + 2)) {
                (Some(b'\n'), _) => return Some(nl + 2),
                (Some(b'\r'), Some(b'\n')) => return Some(nl + 3),
                // Not enough bytes to decide: rescan from this `\n` next time.
                (None, _) | (Some(b'\r'), None) => {
                    self.scanned = nl;
                    return None;
                }
                _ => i = nl + 1,
            }
        }
        self.scanned = buf.len();
        None
    }
}

/// Parses one complete head held in a buffer (convenience around [`Parser`]).
pub fn parse<'a>(buf: &'a [u8], limits: &Limits) -> Result<Parse<'a>, Error> {
    Parser::new().parse(buf, limits)
}

/// The first `b` in `hay` (memchr's SIMD search: a request head is scanned for line ends
/// twice, once to find the head's end and once to split its lines).
#[inline]
fn find_byte(hay: &[u8], b: u8) -> Option<usize> {
    memchr::memchr(b, hay)
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// The lines of a block, each without its `\n` and optional `\r` (a last line without `\n`
/// included; nothing after a final `\n`).
fn lines(block: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = block;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let (line, next) = match find_byte(rest, b'\n') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, &rest[rest.len()..]),
        };
        rest = next;
        Some(trim_cr(line))
    })
}

/// `tchar` of RFC 9110 §5.6.2, by byte value.
const TCHAR: [bool; 256] = {
    let mut table = [false; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        table[i] = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        i += 1;
    }
    table
};

/// `tchar` of RFC 9110 §5.6.2.
#[inline]
fn is_tchar(b: u8) -> bool {
    TCHAR[usize::from(b)]
}

fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// Splits a field line into (name, trimmed value); `None` if malformed.
fn split_field(line: &[u8]) -> Option<(&[u8], &[u8])> {
    let colon = find_byte(line, b':')?;
    let name = &line[..colon];
    if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
        return None;
    }
    let value = trim_ows(&line[colon + 1..]);
    // Field values may hold visible ASCII, SP, HTAB and obs-text; never NUL, CR, LF or controls.
    let bad = |b: u8| (b < 0x20 && b != b'\t') || b == 0x7f;
    if value.iter().any(|&b| bad(b)) {
        return None;
    }
    Some((name, value))
}

/// Method kind, method token, target, version.
type RequestLine<'a> = (Method, &'a [u8], &'a [u8], Version);

fn parse_request_line(line: &[u8]) -> Result<RequestLine<'_>, Error> {
    let line = trim_cr(line.strip_suffix(b"\n").unwrap_or(line));
    let mut parts = line.split(|&b| b == b' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Error::Bad(
            "request line is not METHOD SP TARGET SP VERSION",
        ));
    };
    if method.is_empty() || !method.iter().all(|&b| is_tchar(b)) {
        return Err(Error::Bad("bad method"));
    }
    if target.is_empty() || target.iter().any(|&b| b <= b' ' || b == 0x7f) {
        return Err(Error::Bad("bad request target"));
    }
    let version = parse_version(version)?;
    let kind = match method {
        b"GET" => Method::Get,
        b"HEAD" => Method::Head,
        _ => Method::Other,
    };
    Ok((kind, method, target, version))
}

fn parse_version(v: &[u8]) -> Result<Version, Error> {
    match v {
        [b'H', b'T', b'T', b'P', b'/', major, b'.', minor]
            if major.is_ascii_digit() && minor.is_ascii_digit() =>
        {
            match (major, minor) {
                (b'1', b'0') => Ok(Version::Http10),
                (b'1', _) => Ok(Version::Http11),
                _ => Err(Error::Version),
            }
        }
        _ => Err(Error::Bad("bad HTTP version")),
    }
}

/// Sets `slot` to `value`, rejecting a second, different occurrence.
fn set_once<'a>(
    slot: &mut Option<&'a [u8]>,
    value: &'a [u8],
    what: &'static str,
) -> Result<(), Error> {
    match slot {
        Some(old) if *old != value => Err(Error::Bad(what)),
        _ => {
            *slot = Some(value);
            Ok(())
        }
    }
}

fn parse_content_length(v: &[u8]) -> Result<u64, Error> {
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return Err(Error::Bad("bad Content-Length"));
    }
    Ok(v.iter().fold(0u64, |n, &d| n * 10 + u64::from(d - b'0')))
}

/// Connection options seen in `Connection` fields.
#[derive(Default)]
struct ConnectionOpts {
    close: bool,
    keep_alive: bool,
}

fn parse_connection(v: &[u8], opts: &mut ConnectionOpts) {
    for token in v.split(|&b| b == b',').map(trim_ows) {
        if token.eq_ignore_ascii_case(b"close") {
            opts.close = true;
        } else if token.eq_ignore_ascii_case(b"keep-alive") {
            opts.keep_alive = true;
        }
    }
}

fn parse_head<'a>(line: &'a [u8], block: &'a [u8], limits: &Limits) -> Result<Request<'a>, Error> {
    let (method, method_bytes, target, version) = parse_request_line(line)?;
    let mut req = Request {
        method,
        method_bytes,
        target,
        version,
        keep_alive: false,
        keep_alive_explicit: false,
        content_length: 0,
        host: None,
        if_none_match: None,
        if_modified_since: None,
        if_range: None,
        range: None,
        user_agent: None,
        referer: None,
        header_count: 0,
        header_block: block,
    };
    let mut conn = ConnectionOpts::default();
    let mut content_length: Option<&[u8]> = None;
    for field in lines(block).take_while(|l| !l.is_empty()) {
        if let [b' ' | b'\t', ..] = field {
            return Err(Error::Bad("obsolete line folding"));
        }
        req.header_count += 1;
        if req.header_count > limits.header_count_max {
            return Err(Error::HeadersTooLarge);
        }
        let (name, value) = split_field(field).ok_or(Error::Bad("malformed header field"))?;
        apply_field(&mut req, &mut conn, &mut content_length, name, value)?;
    }
    if let Some(v) = content_length {
        req.content_length = parse_content_length(v)?;
        if req.content_length > limits.body_bytes_max {
            return Err(Error::BodyTooLarge);
        }
    }
    if version == Version::Http11 && req.host.is_none() {
        return Err(Error::Bad("HTTP/1.1 request without Host"));
    }
    req.keep_alive = match version {
        Version::Http11 => !conn.close,
        Version::Http10 => conn.keep_alive && !conn.close,
    };
    req.keep_alive_explicit = version == Version::Http10 && req.keep_alive;
    Ok(req)
}

fn apply_field<'a>(
    req: &mut Request<'a>,
    conn: &mut ConnectionOpts,
    content_length: &mut Option<&'a [u8]>,
    name: &[u8],
    value: &'a [u8],
) -> Result<(), Error> {
    let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
    if is("host") {
        if req.host.is_some() {
            return Err(Error::Bad("more than one Host"));
        }
        req.host = Some(value);
    } else if is("connection") {
        parse_connection(value, conn);
    } else if is("content-length") {
        set_once(content_length, value, "conflicting Content-Length")?;
    } else if is("transfer-encoding") {
        return Err(Error::TransferEncoding);
    } else if is("if-none-match") {
        req.if_none_match = Some(value);
    } else if is("if-modified-since") {
        req.if_modified_since = Some(value);
    } else if is("if-range") {
        req.if_range = Some(value);
    } else if is("range") {
        set_once(&mut req.range, value, "more than one Range")?;
    } else if is("user-agent") {
        req.user_agent = Some(value);
    } else if is("referer") {
        req.referer = Some(value);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
