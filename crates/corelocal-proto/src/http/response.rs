//! Status codes, response heads, small error bodies and content types.

use std::io::Write;

/// The status codes this server answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// 200.
    Ok,
    /// 206.
    PartialContent,
    /// 301 (directory without its trailing slash).
    MovedPermanently,
    /// 304.
    NotModified,
    /// 400.
    BadRequest,
    /// 403 (exists but may not be read).
    Forbidden,
    /// 404.
    NotFound,
    /// 405.
    MethodNotAllowed,
    /// 408 (request head not complete within the header deadline).
    RequestTimeout,
    /// 413.
    PayloadTooLarge,
    /// 414.
    UriTooLong,
    /// 416.
    RangeNotSatisfiable,
    /// 431.
    HeadersTooLarge,
    /// 500.
    InternalError,
    /// 501.
    NotImplemented,
    /// 505.
    VersionNotSupported,
}

impl Status {
    /// The numeric code.
    pub fn code(self) -> u16 {
        match self {
            Status::Ok => 200,
            Status::PartialContent => 206,
            Status::MovedPermanently => 301,
            Status::NotModified => 304,
            Status::BadRequest => 400,
            Status::Forbidden => 403,
            Status::NotFound => 404,
            Status::MethodNotAllowed => 405,
            Status::RequestTimeout => 408,
            Status::PayloadTooLarge => 413,
            Status::UriTooLong => 414,
            Status::RangeNotSatisfiable => 416,
            Status::HeadersTooLarge => 431,
            Status::InternalError => 500,
            Status::NotImplemented => 501,
            Status::VersionNotSupported => 505,
        }
    }

    /// The status line without the line end: `HTTP/1.1 404 Not Found`.
    pub fn line(self) -> &'static str {
        match self {
            Status::Ok => "HTTP/1.1 200 OK",
            Status::PartialContent => "HTTP/1.1 206 Partial Content",
            Status::MovedPermanently => "HTTP/1.1 301 Moved Permanently",
            Status::NotModified => "HTTP/1.1 304 Not Modified",
            Status::BadRequest => "HTTP/1.1 400 Bad Request",
            Status::Forbidden => "HTTP/1.1 403 Forbidden",
            Status::NotFound => "HTTP/1.1 404 Not Found",
            Status::MethodNotAllowed => "HTTP/1.1 405 Method Not Allowed",
            Status::RequestTimeout => "HTTP/1.1 408 Request Timeout",
            Status::PayloadTooLarge => "HTTP/1.1 413 Content Too Large",
            Status::UriTooLong => "HTTP/1.1 414 URI Too Long",
            Status::RangeNotSatisfiable => "HTTP/1.1 416 Range Not Satisfiable",
            Status::HeadersTooLarge => "HTTP/1.1 431 Request Header Fields Too Large",
            Status::InternalError => "HTTP/1.1 500 Internal Server Error",
            Status::NotImplemented => "HTTP/1.1 501 Not Implemented",
            Status::VersionNotSupported => "HTTP/1.1 505 HTTP Version Not Supported",
        }
    }

    /// Whether the connection must close after this status (the request stream can no longer
    /// be trusted to be framed correctly).
    pub fn closes(self) -> bool {
        matches!(
            self,
            Status::BadRequest
                | Status::RequestTimeout
                | Status::PayloadTooLarge
                | Status::UriTooLong
                | Status::HeadersTooLarge
                | Status::InternalError
                | Status::NotImplemented
                | Status::VersionNotSupported
        )
    }
}

/// The `Server` field value.
pub const SERVER: &str = "corelocal";

/// What the `Connection` field of a response says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnHeader {
    /// HTTP/1.1 keep-alive: no field.
    None,
    /// `Connection: keep-alive` (HTTP/1.0 client that asked for it).
    KeepAlive,
    /// `Connection: close`.
    Close,
}

impl ConnHeader {
    /// The field for a response that keeps (`keep`) or closes the connection of a request
    /// that asked for keep-alive explicitly (`explicit`, HTTP/1.0) or implicitly.
    pub fn new(keep: bool, explicit: bool) -> ConnHeader {
        match (keep, explicit) {
            (false, _) => ConnHeader::Close,
            (true, true) => ConnHeader::KeepAlive,
            (true, false) => ConnHeader::None,
        }
    }

    fn field(self) -> &'static [u8] {
        match self {
            ConnHeader::None => b"",
            ConnHeader::KeepAlive => b"Connection: keep-alive\r\n",
            ConnHeader::Close => b"Connection: close\r\n",
        }
    }
}

/// Writes the status line, `Server` and `Date` (an IMF-fixdate).
pub fn write_status(out: &mut Vec<u8>, status: Status, date: &[u8]) {
    out.extend_from_slice(status.line().as_bytes());
    out.extend_from_slice(b"\r\nServer: ");
    out.extend_from_slice(SERVER.as_bytes());
    out.extend_from_slice(b"\r\nDate: ");
    out.extend_from_slice(date);
    out.extend_from_slice(b"\r\n");
}

/// Writes `Content-Length`, the `Connection` field and the empty line that ends the head.
pub fn write_end(out: &mut Vec<u8>, content_length: u64, conn: ConnHeader) {
    out.extend_from_slice(b"Content-Length: ");
    write_u64(out, content_length);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(conn.field());
    out.extend_from_slice(b"\r\n");
}

/// Appends a decimal number without going through `fmt`.
pub fn write_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// Writes `Content-Range: bytes start-(end-1)/len` for a 206.
pub fn write_content_range(out: &mut Vec<u8>, start: u64, end: u64, len: u64) {
    let _ = write!(
        out,
        "Content-Range: bytes {}-{}/{}\r\n",
        start,
        end - 1,
        len
    );
}

/// Writes `Content-Range: bytes */len` for a 416.
pub fn write_unsatisfied_range(out: &mut Vec<u8>, len: u64) {
    let _ = write!(out, "Content-Range: bytes */{len}\r\n");
}

/// The small HTML body of an error response.
pub fn error_body(status: Status) -> String {
    let line = status.line();
    let what = &line["HTTP/1.1 ".len()..];
    format!("<html><head><title>{what}</title></head><body><h1>{what}</h1></body></html>\n")
}

/// Writes a complete error (or other body-less status) response. `extra` holds additional
/// header fields, each ending in CRLF; `head_only` omits the body (HEAD requests).
pub fn write_error(
    out: &mut Vec<u8>,
    status: Status,
    date: &[u8],
    conn: ConnHeader,
    extra: &[u8],
    head_only: bool,
) {
    let conn = if status.closes() {
        ConnHeader::Close
    } else {
        conn
    };
    let body = error_body(status);
    write_status(out, status, date);
    out.extend_from_slice(b"Content-Type: text/html\r\n");
    if status == Status::MethodNotAllowed {
        out.extend_from_slice(b"Allow: GET, HEAD\r\n");
    }
    out.extend_from_slice(extra);
    write_end(out, body.len() as u64, conn);
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
}

/// The content type for a file name, by extension (ASCII case-insensitive).
pub fn content_type(name: &[u8]) -> &'static str {
    let ext = match name.iter().rposition(|&b| b == b'.' || b == b'/') {
        Some(i) if name[i] == b'.' => &name[i + 1..],
        _ => b"",
    };
    let mut lower = [0u8; 8];
    if ext.len() > lower.len() {
        return "application/octet-stream";
    }
    for (l, &b) in lower.iter_mut().zip(ext) {
        *l = b.to_ascii_lowercase();
    }
    match &lower[..ext.len()] {
        b"html" | b"htm" => "text/html; charset=utf-8",
        b"txt" | b"text" => "text/plain; charset=utf-8",
        b"css" => "text/css; charset=utf-8",
        b"js" | b"mjs" => "text/javascript; charset=utf-8",
        b"json" => "application/json",
        b"xml" => "application/xml",
        b"csv" => "text/csv; charset=utf-8",
        b"md" => "text/markdown; charset=utf-8",
        b"svg" => "image/svg+xml",
        b"png" => "image/png",
        b"jpg" | b"jpeg" => "image/jpeg",
        b"gif" => "image/gif",
        b"webp" => "image/webp",
        b"avif" => "image/avif",
        b"ico" => "image/x-icon",
        b"pdf" => "application/pdf",
        b"wasm" => "application/wasm",
        b"woff" => "font/woff",
        b"woff2" => "font/woff2",
        b"ttf" => "font/ttf",
        b"mp3" => "audio/mpeg",
        b"mp4" => "video/mp4",
        b"webm" => "video/webm",
        b"zip" => "application/zip",
        b"gz" => "application/gzip",
        b"tar" => "application/x-tar",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DATE: &[u8] = b"Thu, 01 Jan 1970 00:00:00 GMT";

    #[test]
    fn error_response_is_complete_and_small() {
        let mut out = Vec::new();
        write_error(
            &mut out,
            Status::NotFound,
            DATE,
            ConnHeader::None,
            b"",
            false,
        );
        let s = String::from_utf8(out).unwrap();
        assert!(s.starts_with("HTTP/1.1 404 Not Found\r\nServer: corelocal\r\nDate: Thu"));
        let (head, body) = s.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("Content-Length: {}", body.len())));
        assert!(!head.contains("Connection"));
        assert!(body.len() < 128);
    }

    #[test]
    fn closing_statuses_say_close() {
        let mut out = Vec::new();
        write_error(
            &mut out,
            Status::BadRequest,
            DATE,
            ConnHeader::None,
            b"",
            true,
        );
        let s = String::from_utf8(out).unwrap();
        assert!(s.contains("Connection: close\r\n"));
        assert!(s.ends_with("\r\n\r\n"));
    }

    #[test]
    fn method_not_allowed_lists_allow() {
        let mut out = Vec::new();
        write_error(
            &mut out,
            Status::MethodNotAllowed,
            DATE,
            ConnHeader::None,
            b"",
            false,
        );
        assert!(String::from_utf8(out)
            .unwrap()
            .contains("Allow: GET, HEAD\r\n"));
    }

    #[test]
    fn content_types_by_extension() {
        assert_eq!(content_type(b"a/b/index.HTML"), "text/html; charset=utf-8");
        assert_eq!(content_type(b"x.png"), "image/png");
        assert_eq!(content_type(b"dir.d/noext"), "application/octet-stream");
        assert_eq!(content_type(b"x.verylongext"), "application/octet-stream");
        assert_eq!(content_type(b""), "application/octet-stream");
    }

    #[test]
    fn numbers() {
        for n in [0u64, 7, 10, 12345, u64::MAX] {
            let mut v = Vec::new();
            write_u64(&mut v, n);
            assert_eq!(v, n.to_string().as_bytes());
        }
    }
}
