//! Protocol clients, sans-IO: request builders and incremental response parsers.
//!
//! A parser is fed whatever bytes arrived (any split) and answers [`Progress::NeedMore`] or
//! [`Progress::Done`] with how many bytes the response used; bytes past that belong to the
//! next (pipelined) response. Every parser is bounded: headers and lines have a size limit and
//! a violation is a [`ProtoError`], never unbounded memory.

use corelocal_proto::sockperf;
use std::fmt;

/// Longest HTTP header block or memcached line accepted.
pub const MAX_HEADER: usize = 64 * 1024;

/// What a completed response said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RespInfo {
    /// HTTP status (0 for other protocols).
    pub status: u16,
    /// memcached get: `Some(true)` on a hit, `Some(false)` on a miss; `None` otherwise.
    pub hit: Option<bool>,
    /// The server announced it will close the connection (`Connection: close`).
    pub server_closes: bool,
    /// Body / value bytes.
    pub body: usize,
}

/// Result of feeding bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// All bytes were consumed and the response is not complete yet.
    NeedMore,
    /// The response is complete after `consumed` bytes of the input.
    Done {
        /// Bytes of the input that belong to this response.
        consumed: usize,
        /// What the response said.
        info: RespInfo,
    },
}

/// A malformed or oversized response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtoError(pub String);

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProtoError {}

fn err<T>(msg: impl Into<String>) -> Result<T, ProtoError> {
    Err(ProtoError(msg.into()))
}

/// One response parser of any supported protocol.
#[derive(Debug, Clone)]
pub enum Parser {
    /// Fixed-size RPC response.
    Rpc(RpcParser),
    /// HTTP/1.x response.
    Http(HttpParser),
    /// memcached text protocol response.
    Kv(KvParser),
    /// sockperf pong.
    Sockperf(SockperfParser),
}

impl Parser {
    /// Feeds bytes.
    pub fn feed(&mut self, data: &[u8]) -> Result<Progress, ProtoError> {
        match self {
            Parser::Rpc(p) => Ok(p.feed(data)),
            Parser::Http(p) => p.feed(data),
            Parser::Kv(p) => p.feed(data),
            Parser::Sockperf(p) => p.feed(data),
        }
    }

    /// The peer closed the connection: completes a close-delimited response, else an error.
    pub fn eof(&mut self) -> Result<RespInfo, ProtoError> {
        match self {
            Parser::Http(p) => p.eof(),
            _ => err("connection closed before the response was complete"),
        }
    }
}

// ---------------------------------------------------------------- RPC (MegaPipe microbenchmark)

/// Builds an RPC request: exactly `size` bytes (a repeating pattern ending in `\n`).
pub fn rpc_request(size: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..size).map(|i| b'a' + (i % 26) as u8).collect();
    if let Some(last) = v.last_mut() {
        *last = b'\n';
    }
    v
}

/// Parser for a fixed-size response.
#[derive(Debug, Clone)]
pub struct RpcParser {
    want: usize,
    got: usize,
}

impl RpcParser {
    /// Expects exactly `size` bytes.
    pub fn new(size: usize) -> Self {
        RpcParser { want: size, got: 0 }
    }

    /// Feeds bytes; never fails (the protocol has no framing).
    pub fn feed(&mut self, data: &[u8]) -> Progress {
        let take = (self.want - self.got).min(data.len());
        self.got += take;
        if self.got == self.want {
            Progress::Done {
                consumed: take,
                info: RespInfo {
                    body: self.want,
                    ..RespInfo::default()
                },
            }
        } else {
            Progress::NeedMore
        }
    }
}

// ---------------------------------------------------------------- sockperf

/// Parser of the pong answering one sockperf request (`corelocal_proto::sockperf`): the same
/// sequence number and length, the client flag cleared; anything else is an error.
#[derive(Debug, Clone)]
pub struct SockperfParser {
    decoder: sockperf::Decoder,
    seq: u64,
    len: usize,
}

impl SockperfParser {
    /// Expects the pong of request `seq` of `len` bytes (header included).
    pub fn new(seq: u64, len: usize) -> Self {
        SockperfParser {
            decoder: sockperf::Decoder::new(sockperf::MAX_MESSAGE_LEN),
            seq,
            len,
        }
    }

    /// Feeds bytes.
    pub fn feed(&mut self, data: &[u8]) -> Result<Progress, ProtoError> {
        let (header, consumed) = match self.decoder.feed(data) {
            Ok(sockperf::Decoded::NeedMore) => return Ok(Progress::NeedMore),
            Ok(sockperf::Decoded::Message { header, consumed }) => (header, consumed),
            Err(e) => return err(e.to_string()),
        };
        if header.seq != self.seq || header.len as usize != self.len || header.is_client() {
            return err(format!(
                "sockperf: expected the pong of seq {} ({} bytes), got seq {} flags {:#x} ({} bytes)",
                self.seq, self.len, header.seq, header.flags, header.len
            ));
        }
        Ok(Progress::Done {
            consumed,
            info: RespInfo {
                body: self.len,
                ..RespInfo::default()
            },
        })
    }
}

// ---------------------------------------------------------------- HTTP/1.1

/// Builds `GET path HTTP/1.1` with Host, and `Connection: close` unless `keep_alive`.
pub fn http_get(host: &str, path: &str, keep_alive: bool) -> Vec<u8> {
    let conn = if keep_alive {
        ""
    } else {
        "Connection: close\r\n"
    };
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: corelocal-bench\r\n{conn}\r\n")
        .into_bytes()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HttpState {
    Head,
    Length(usize),
    ChunkSize {
        value: usize,
        digits: usize,
        ext: bool,
    },
    ChunkSizeLf,
    ChunkData(usize),
    ChunkCr,
    ChunkLf,
    Trailer {
        line_len: usize,
        cr: bool,
    },
    UntilClose,
}

/// Incremental HTTP/1.x response parser (Content-Length, chunked, close-delimited).
#[derive(Debug, Clone)]
pub struct HttpParser {
    head: Vec<u8>,
    state: HttpState,
    info: RespInfo,
    head_request: bool,
    pending_chunk: usize,
}

impl Default for HttpParser {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpParser {
    /// A parser for the response to a GET.
    pub fn new() -> Self {
        HttpParser {
            head: Vec::new(),
            state: HttpState::Head,
            info: RespInfo::default(),
            head_request: false,
            pending_chunk: 0,
        }
    }

    /// The close-delimited body ended.
    pub fn eof(&mut self) -> Result<RespInfo, ProtoError> {
        match self.state {
            HttpState::UntilClose => Ok(self.info),
            _ => err("connection closed before the response was complete"),
        }
    }

    fn parse_head(&mut self) -> Result<(), ProtoError> {
        let text =
            std::str::from_utf8(&self.head).map_err(|_| ProtoError("non-UTF-8 header".into()))?;
        let mut lines = text.split("\r\n");
        let status_line = lines.next().unwrap_or("");
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or("");
        if !version.starts_with("HTTP/1.") {
            return err(format!("bad status line {status_line:?}"));
        }
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .filter(|s| (100..1000).contains(s))
            .ok_or_else(|| ProtoError(format!("bad status line {status_line:?}")))?;
        self.info.status = status;
        self.info.server_closes = version == "HTTP/1.0";
        let mut length: Option<usize> = None;
        let mut chunked = false;
        for line in lines {
            if line.is_empty() {
                continue;
            }
            let Some((name, value)) = line.split_once(':') else {
                return err(format!("bad header line {line:?}"));
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = Some(
                    value
                        .parse()
                        .map_err(|_| ProtoError(format!("bad Content-Length {value:?}")))?,
                );
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value.to_ascii_lowercase().contains("chunked");
            } else if name.eq_ignore_ascii_case("connection") {
                let v = value.to_ascii_lowercase();
                if v.contains("close") {
                    self.info.server_closes = true;
                } else if v.contains("keep-alive") {
                    self.info.server_closes = false;
                }
            }
        }
        let no_body =
            self.head_request || status == 204 || status == 304 || (100..200).contains(&status);
        self.state = if no_body {
            HttpState::Length(0)
        } else if chunked {
            HttpState::ChunkSize {
                value: 0,
                digits: 0,
                ext: false,
            }
        } else if let Some(n) = length {
            HttpState::Length(n)
        } else {
            self.info.server_closes = true;
            HttpState::UntilClose
        };
        Ok(())
    }

    /// Feeds bytes.
    pub fn feed(&mut self, data: &[u8]) -> Result<Progress, ProtoError> {
        let mut i = 0;
        loop {
            match self.state {
                HttpState::Head => {
                    // Append byte by byte up to the blank line, bounded.
                    let rest = &data[i..];
                    let start = self.head.len().saturating_sub(3);
                    self.head.extend_from_slice(rest);
                    match find(&self.head[start..], b"\r\n\r\n") {
                        Some(pos) => {
                            let end = start + pos + 4;
                            let extra = self.head.len() - end;
                            self.head.truncate(end);
                            i = data.len() - extra;
                            if end > MAX_HEADER {
                                return err("response header too large");
                            }
                            self.parse_head()?;
                        }
                        None => {
                            if self.head.len() > MAX_HEADER {
                                return err("response header too large");
                            }
                            return Ok(Progress::NeedMore);
                        }
                    }
                }
                HttpState::Length(n) => {
                    let take = n.min(data.len() - i);
                    i += take;
                    self.info.body += take;
                    if take == n {
                        return Ok(Progress::Done {
                            consumed: i,
                            info: self.info,
                        });
                    }
                    self.state = HttpState::Length(n - take);
                    return Ok(Progress::NeedMore);
                }
                HttpState::UntilClose => {
                    self.info.body += data.len() - i;
                    return Ok(Progress::NeedMore);
                }
                HttpState::ChunkSize { value, digits, ext } => {
                    let Some(&b) = data.get(i) else {
                        return Ok(Progress::NeedMore);
                    };
                    i += 1;
                    if b == b'\r' {
                        if digits == 0 {
                            return err("empty chunk size");
                        }
                        self.state = HttpState::ChunkSizeLf;
                        self.pending_chunk = value;
                    } else if ext {
                        // skip chunk extension
                    } else if b == b';' {
                        self.state = HttpState::ChunkSize {
                            value,
                            digits,
                            ext: true,
                        };
                    } else {
                        let d = (b as char)
                            .to_digit(16)
                            .ok_or_else(|| ProtoError("bad chunk size".into()))?;
                        if digits >= 8 {
                            return err("chunk size too large");
                        }
                        self.state = HttpState::ChunkSize {
                            value: value * 16 + d as usize,
                            digits: digits + 1,
                            ext,
                        };
                    }
                }
                HttpState::ChunkSizeLf => {
                    let Some(&b) = data.get(i) else {
                        return Ok(Progress::NeedMore);
                    };
                    i += 1;
                    if b != b'\n' {
                        return err("bad chunk size line");
                    }
                    let size = self.pending_chunk;
                    self.state = if size == 0 {
                        HttpState::Trailer {
                            line_len: 0,
                            cr: false,
                        }
                    } else {
                        HttpState::ChunkData(size)
                    };
                }
                HttpState::ChunkData(n) => {
                    let take = n.min(data.len() - i);
                    i += take;
                    self.info.body += take;
                    if take == n {
                        self.state = HttpState::ChunkCr;
                    } else {
                        self.state = HttpState::ChunkData(n - take);
                        return Ok(Progress::NeedMore);
                    }
                }
                HttpState::ChunkCr | HttpState::ChunkLf => {
                    let Some(&b) = data.get(i) else {
                        return Ok(Progress::NeedMore);
                    };
                    i += 1;
                    let want = if self.state == HttpState::ChunkCr {
                        b'\r'
                    } else {
                        b'\n'
                    };
                    if b != want {
                        return err("missing CRLF after chunk");
                    }
                    self.state = if self.state == HttpState::ChunkCr {
                        HttpState::ChunkLf
                    } else {
                        HttpState::ChunkSize {
                            value: 0,
                            digits: 0,
                            ext: false,
                        }
                    };
                }
                HttpState::Trailer { line_len, cr } => {
                    let Some(&b) = data.get(i) else {
                        return Ok(Progress::NeedMore);
                    };
                    i += 1;
                    match (b, cr) {
                        (b'\r', _) => self.state = HttpState::Trailer { line_len, cr: true },
                        (b'\n', true) if line_len == 0 => {
                            return Ok(Progress::Done {
                                consumed: i,
                                info: self.info,
                            });
                        }
                        (b'\n', true) => {
                            self.state = HttpState::Trailer {
                                line_len: 0,
                                cr: false,
                            }
                        }
                        _ => {
                            if line_len > MAX_HEADER {
                                return err("trailer too large");
                            }
                            self.state = HttpState::Trailer {
                                line_len: line_len + 1,
                                cr: false,
                            }
                        }
                    }
                }
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

// ---------------------------------------------------------------- memcached text protocol

/// Builds `get key\r\n`.
pub fn kv_get(key: &str) -> Vec<u8> {
    format!("get {key}\r\n").into_bytes()
}

/// Builds `set key 0 0 len\r\nvalue\r\n` with a deterministic value of `size` bytes.
pub fn kv_set(key: &str, size: usize) -> Vec<u8> {
    let mut v = format!("set {key} 0 0 {size}\r\n").into_bytes();
    v.extend((0..size).map(|i| b'a' + (i % 26) as u8));
    v.extend_from_slice(b"\r\n");
    v
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KvState {
    Line,
    Data(usize),
}

/// What a memcached request expects back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvExpect {
    /// `VALUE …` blocks then `END`.
    Get,
    /// One status line (`STORED`, `NOT_STORED`, …).
    Store,
}

/// Incremental memcached text-protocol response parser.
#[derive(Debug, Clone)]
pub struct KvParser {
    expect: KvExpect,
    line: Vec<u8>,
    state: KvState,
    info: RespInfo,
}

impl KvParser {
    /// A parser for the response to a get or a store command.
    pub fn new(expect: KvExpect) -> Self {
        KvParser {
            expect,
            line: Vec::new(),
            state: KvState::Line,
            info: RespInfo::default(),
        }
    }

    fn on_line(&mut self) -> Result<bool, ProtoError> {
        let line =
            std::str::from_utf8(&self.line).map_err(|_| ProtoError("non-UTF-8 reply".into()))?;
        let line = line.trim_end_matches('\r');
        if line.starts_with("SERVER_ERROR") || line.starts_with("CLIENT_ERROR") || line == "ERROR" {
            return err(format!("memcached: {line}"));
        }
        match self.expect {
            KvExpect::Store => {
                match line {
                    "STORED" | "NOT_STORED" | "EXISTS" | "NOT_FOUND" => {}
                    _ => return err(format!("unexpected store reply {line:?}")),
                }
                Ok(true)
            }
            KvExpect::Get => {
                if line == "END" {
                    if self.info.hit.is_none() {
                        self.info.hit = Some(false);
                    }
                    return Ok(true);
                }
                let mut f = line.split(' ');
                if f.next() != Some("VALUE") {
                    return err(format!("unexpected get reply {line:?}"));
                }
                let bytes: usize = f
                    .nth(2)
                    .and_then(|b| b.parse().ok())
                    .ok_or_else(|| ProtoError(format!("bad VALUE line {line:?}")))?;
                if bytes > 1 << 30 {
                    return err("value too large");
                }
                self.info.hit = Some(true);
                self.info.body += bytes;
                self.state = KvState::Data(bytes + 2);
                Ok(false)
            }
        }
    }

    /// Feeds bytes.
    pub fn feed(&mut self, data: &[u8]) -> Result<Progress, ProtoError> {
        let mut i = 0;
        while i < data.len() {
            match self.state {
                KvState::Data(n) => {
                    let take = n.min(data.len() - i);
                    i += take;
                    self.state = if take == n {
                        KvState::Line
                    } else {
                        KvState::Data(n - take)
                    };
                }
                KvState::Line => match data[i..].iter().position(|&b| b == b'\n') {
                    Some(pos) => {
                        self.line.extend_from_slice(&data[i..i + pos]);
                        i += pos + 1;
                        let done = self.on_line()?;
                        self.line.clear();
                        if done {
                            return Ok(Progress::Done {
                                consumed: i,
                                info: self.info,
                            });
                        }
                    }
                    None => {
                        self.line.extend_from_slice(&data[i..]);
                        if self.line.len() > MAX_HEADER {
                            return err("reply line too long");
                        }
                        return Ok(Progress::NeedMore);
                    }
                },
            }
        }
        Ok(Progress::NeedMore)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` split at every possible point pair and checks the same outcome.
    fn all_splits(make: impl Fn() -> Parser, input: &[u8]) -> (usize, RespInfo) {
        let mut whole = make();
        let (consumed, info) = match whole.feed(input).unwrap() {
            Progress::Done { consumed, info } => (consumed, info),
            Progress::NeedMore => panic!("incomplete"),
        };
        for a in 0..=input.len() {
            for b in a..=input.len() {
                let mut p = make();
                let mut off = 0;
                let mut got = None;
                for chunk in [&input[..a], &input[a..b], &input[b..]] {
                    if got.is_some() {
                        break;
                    }
                    match p.feed(chunk).unwrap() {
                        Progress::Done { consumed: c, info } => got = Some((off + c, info)),
                        Progress::NeedMore => off += chunk.len(),
                    }
                }
                assert_eq!(got, Some((consumed, info)), "split {a} {b}");
            }
        }
        (consumed, info)
    }

    #[test]
    fn rpc_fixed_size_and_pipelined_leftover() {
        assert_eq!(rpc_request(64).len(), 64);
        assert_eq!(*rpc_request(3).last().unwrap(), b'\n');
        let (c, info) = all_splits(|| Parser::Rpc(RpcParser::new(5)), b"hello");
        assert_eq!((c, info.body), (5, 5));
        let mut p = RpcParser::new(4);
        assert_eq!(
            p.feed(b"abcdef"),
            Progress::Done {
                consumed: 4,
                info: RespInfo {
                    body: 4,
                    ..Default::default()
                }
            }
        );
    }

    #[test]
    fn sockperf_pong_any_split_and_mismatches_are_errors() {
        let mut req = Vec::new();
        sockperf::encode_request(7, 64, true, &mut req);
        let mut pong = req.clone();
        pong[9] = 2; // the server clears the client flag
        pong.extend_from_slice(b"NEXT");
        let (c, info) = all_splits(|| Parser::Sockperf(SockperfParser::new(7, 64)), &pong);
        assert_eq!((c, info.body), (64, 64));
        let bad = |seq: u64, len: usize, reply: &[u8]| {
            SockperfParser::new(seq, len).feed(reply).unwrap_err().0
        };
        assert!(bad(8, 64, &pong).contains("seq 8"));
        assert!(bad(7, 65, &pong).contains("65 bytes"));
        assert!(
            bad(7, 64, &req).contains("flags 0x3"),
            "an unanswered echo of the request"
        );
        let mut huge = pong.clone();
        huge[10..14].copy_from_slice(&100_000u32.to_be_bytes());
        assert!(bad(7, 64, &huge).contains("exceeds"));
    }

    #[test]
    fn http_content_length_any_split() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nhello\nEXTRA";
        let (c, info) = all_splits(|| Parser::Http(HttpParser::new()), r);
        assert_eq!(c, r.len() - 5);
        assert_eq!(info.status, 200);
        assert_eq!(info.body, 6);
        assert!(info.server_closes);
    }

    #[test]
    fn http_chunked_any_split() {
        let r = b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n5;x=1\r\nhello\r\n1\r\n!\r\n0\r\nX-T: 1\r\n\r\n";
        let (c, info) = all_splits(|| Parser::Http(HttpParser::new()), r);
        assert_eq!(c, r.len());
        assert_eq!(info.status, 404);
        assert_eq!(info.body, 6);
        assert!(!info.server_closes);
    }

    #[test]
    fn http_close_delimited_and_no_body() {
        let mut p = HttpParser::new();
        assert_eq!(
            p.feed(b"HTTP/1.0 200 OK\r\n\r\nabc").unwrap(),
            Progress::NeedMore
        );
        let info = p.eof().unwrap();
        assert_eq!((info.status, info.body, info.server_closes), (200, 3, true));
        let mut p = HttpParser::new();
        assert!(matches!(
            p.feed(b"HTTP/1.1 204 No Content\r\n\r\n").unwrap(),
            Progress::Done { consumed: 27, .. }
        ));
        let mut p = HttpParser::new();
        p.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab")
            .unwrap();
        assert!(p.eof().is_err());
    }

    #[test]
    fn http_bad_input_is_an_error() {
        assert!(HttpParser::new().feed(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
        assert!(HttpParser::new().feed(b"HTTP/1.1 abc OK\r\n\r\n").is_err());
        assert!(HttpParser::new()
            .feed(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n")
            .is_err());
        assert!(HttpParser::new()
            .feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
            .is_err());
        let mut p = HttpParser::new();
        let big = vec![b'a'; MAX_HEADER + 10];
        let _ = p.feed(b"HTTP/1.1 200 OK\r\nX: ");
        assert!(p.feed(&big).is_err());
    }

    #[test]
    fn http_request_shape() {
        let r = String::from_utf8(http_get("h", "/x", false)).unwrap();
        assert!(r.starts_with("GET /x HTTP/1.1\r\nHost: h\r\n"));
        assert!(r.contains("Connection: close\r\n"));
        assert!(r.ends_with("\r\n\r\n"));
        assert!(!String::from_utf8(http_get("h", "/", true))
            .unwrap()
            .contains("close"));
    }

    #[test]
    fn kv_get_hit_miss_and_store() {
        let r = b"VALUE k1 0 5\r\nhe\r\nl\r\nEND\r\n";
        let (c, info) = all_splits(|| Parser::Kv(KvParser::new(KvExpect::Get)), r);
        assert_eq!((c, info.hit, info.body), (r.len(), Some(true), 5));
        let (_, info) = all_splits(|| Parser::Kv(KvParser::new(KvExpect::Get)), b"END\r\n");
        assert_eq!(info.hit, Some(false));
        let (c, _) = all_splits(
            || Parser::Kv(KvParser::new(KvExpect::Store)),
            b"STORED\r\nEND\r\n",
        );
        assert_eq!(c, 8);
        assert!(KvParser::new(KvExpect::Get)
            .feed(b"SERVER_ERROR out of memory\r\n")
            .is_err());
        assert!(KvParser::new(KvExpect::Store).feed(b"ERROR\r\n").is_err());
        assert_eq!(kv_set("k", 3), b"set k 0 0 3\r\nabc\r\n");
        assert_eq!(kv_get("k"), b"get k\r\n");
    }
}
