//! The HTTP/1.1 client: `GET` request builder and incremental response parser (Content-Length,
//! chunked, close-delimited).

use super::{err, Progress, ProtoError, RespInfo, MAX_HEADER};

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
