//! One HTTP connection: parse pipelined request heads, answer each in order.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corelocal::runtime::{CloseReason, ConnInfo, FileRegion, Handler, Output, Step};
use corelocal_proto::http::range::{self, RangeAnswer};
use corelocal_proto::http::response::{self, ConnHeader};
use corelocal_proto::http::{date, normalize_target, Method, Parse, Parser, Request, Status};

use super::site::{Body, Entry, Found};
use super::{http_date, Inner};

/// Access-log lines buffered per connection before they are written out.
const LOG_BUF_BYTES_MAX: usize = 16 * 1024;

/// Per-connection state.
pub struct HttpConn {
    inner: Arc<Inner>,
    peer: Option<SocketAddr>,
    parser: Parser,
    /// When the first byte of the current (incomplete) request head was seen.
    head_started: Option<Instant>,
    /// Body bytes of the last request still to discard.
    skip_body: u64,
    /// Requests answered on this connection.
    served: u64,
    /// Access-log lines not yet written.
    log: Vec<u8>,
    /// The server is stopping: the next response says `Connection: close`.
    draining: bool,
}

/// What one request produced, for the log and the keep-alive decision.
struct Answer {
    status: Status,
    body_bytes: u64,
}

impl HttpConn {
    pub(super) fn new(inner: Arc<Inner>, info: &ConnInfo) -> HttpConn {
        HttpConn {
            inner,
            peer: info.peer,
            parser: Parser::new(),
            head_started: None,
            skip_body: 0,
            served: 0,
            log: Vec::new(),
            draining: false,
        }
    }

    fn date(&self, now: Instant) -> [u8; date::IMF_FIXDATE_LEN] {
        http_date(self.inner.unix_secs(now))
    }

    /// Discards body bytes of the previous request; returns how many were consumed.
    fn skip(&mut self, input: &[u8]) -> usize {
        let n = (self.skip_body.min(input.len() as u64)) as usize;
        self.skip_body -= n as u64;
        n
    }

    /// Answers a parse error or header timeout, and closes.
    fn fail(&mut self, status: Status, out: &mut Output, now: Instant) -> CloseReason {
        let date = self.date(now);
        response::write_error(
            out.bytes_mut(),
            status,
            &date,
            ConnHeader::Close,
            b"",
            false,
        );
        self.log_line(now, None, status, 0);
        match status {
            Status::UriTooLong | Status::HeadersTooLarge | Status::PayloadTooLarge => {
                CloseReason::TooLarge
            }
            Status::RequestTimeout => CloseReason::TimedOut,
            _ => CloseReason::BadRequest,
        }
    }

    fn header_deadline_passed(&mut self, now: Instant) -> bool {
        let started = *self.head_started.get_or_insert(now);
        let limit = Duration::from_millis(self.inner.config.header_timeout_ms);
        now.saturating_duration_since(started) > limit
    }

    /// Answers one complete request; `Err` if the connection must close after it.
    fn serve(
        &mut self,
        req: &Request<'_>,
        out: &mut Output,
        now: Instant,
    ) -> Result<(), CloseReason> {
        self.served += 1;
        let keep = req.keep_alive
            && !self.draining
            && self.served < self.inner.config.requests_per_conn_max;
        let conn = ConnHeader::new(keep, req.keep_alive_explicit);
        let answer = self.answer(req, conn, out, now);
        self.log_line(now, Some(req), answer.status, answer.body_bytes);
        match (answer.status.closes(), keep) {
            (true, _) => Err(CloseReason::BadRequest),
            (false, false) => Err(CloseReason::Done),
            (false, true) => Ok(()),
        }
    }

    fn answer(
        &self,
        req: &Request<'_>,
        conn: ConnHeader,
        out: &mut Output,
        now: Instant,
    ) -> Answer {
        let date = self.date(now);
        let head_only = req.method == Method::Head;
        let error = |out: &mut Output, status: Status, extra: &[u8]| {
            response::write_error(out.bytes_mut(), status, &date, conn, extra, head_only);
            let body_bytes = if head_only {
                0
            } else {
                response::error_body(status).len()
            };
            Answer {
                status,
                body_bytes: body_bytes as u64,
            }
        };
        if req.method == Method::Other {
            return error(out, Status::MethodNotAllowed, b"");
        }
        let path = match normalize_target(req.target) {
            Ok(p) => p,
            Err(_) => return error(out, Status::BadRequest, b""),
        };
        match self.inner.site.lookup(&path, now) {
            Ok(Found::Entry(entry)) => self.send_entry(req, &entry, conn, &date, out),
            Ok(Found::Redirect(location)) => {
                let mut extra = b"Location: ".to_vec();
                extra.extend_from_slice(&location);
                extra.extend_from_slice(b"\r\n");
                error(out, Status::MovedPermanently, &extra)
            }
            Err(status) => error(out, status, b""),
        }
    }

    /// 304 / 206 / 416 / 200 for a file, by the request's conditional and range fields.
    fn send_entry(
        &self,
        req: &Request<'_>,
        entry: &Entry,
        conn: ConnHeader,
        date: &[u8],
        out: &mut Output,
    ) -> Answer {
        if not_modified(req, entry) {
            let buf = out.bytes_mut();
            response::write_status(buf, Status::NotModified, date);
            buf.extend_from_slice(b"Last-Modified: ");
            buf.extend_from_slice(&entry.last_modified);
            buf.extend_from_slice(b"\r\nETag: ");
            buf.extend_from_slice(&entry.etag);
            buf.extend_from_slice(b"\r\n");
            buf.extend_from_slice(match conn {
                ConnHeader::None => b"\r\n".as_slice(),
                ConnHeader::KeepAlive => b"Connection: keep-alive\r\n\r\n",
                ConnHeader::Close => b"Connection: close\r\n\r\n",
            });
            return Answer {
                status: Status::NotModified,
                body_bytes: 0,
            };
        }
        let (status, start, end) = match range_of(req, entry) {
            RangeAnswer::Full => (Status::Ok, 0, entry.len),
            RangeAnswer::Part { start, end } => (Status::PartialContent, start, end),
            RangeAnswer::Unsatisfiable => {
                let mut extra = Vec::new();
                response::write_unsatisfied_range(&mut extra, entry.len);
                let head_only = req.method == Method::Head;
                response::write_error(
                    out.bytes_mut(),
                    Status::RangeNotSatisfiable,
                    date,
                    conn,
                    &extra,
                    head_only,
                );
                return Answer {
                    status: Status::RangeNotSatisfiable,
                    body_bytes: 0,
                };
            }
        };
        let buf = out.bytes_mut();
        response::write_status(buf, status, date);
        buf.extend_from_slice(&entry.fields);
        if status == Status::PartialContent {
            response::write_content_range(buf, start, end, entry.len);
        }
        response::write_end(buf, end - start, conn);
        if req.method == Method::Head {
            return Answer {
                status,
                body_bytes: 0,
            };
        }
        match &entry.body {
            Body::Memory(bytes) => out.write(&bytes[start as usize..end as usize]),
            Body::File(file) => out.push_file(FileRegion {
                file: file.clone(),
                offset: start,
                len: end - start,
            }),
        }
        Answer {
            status,
            body_bytes: end - start,
        }
    }

    fn log_line(&mut self, now: Instant, req: Option<&Request<'_>>, status: Status, bytes: u64) {
        if self.inner.log.is_none() {
            return;
        }
        let unix = self.inner.unix_secs(now);
        super::log::write_line(&mut self.log, self.peer, unix, req, status.code(), bytes);
        if self.log.len() >= LOG_BUF_BYTES_MAX {
            self.flush_log();
        }
    }

    fn flush_log(&mut self) {
        if let Some(sink) = &self.inner.log {
            if !self.log.is_empty() {
                sink.write(&self.log);
                self.log.clear();
            }
        }
    }
}

/// If-None-Match wins over If-Modified-Since (RFC 9110 §13.2.2).
fn not_modified(req: &Request<'_>, entry: &Entry) -> bool {
    if let Some(inm) = req.if_none_match {
        return range::if_none_match(inm, &entry.etag);
    }
    req.if_modified_since
        .and_then(date::parse_http_date)
        .is_some_and(|since| entry.mtime <= since)
}

fn range_of(req: &Request<'_>, entry: &Entry) -> RangeAnswer {
    let Some(value) = req.range.filter(|_| req.method == Method::Get) else {
        return RangeAnswer::Full;
    };
    if let Some(cond) = req.if_range {
        if !range::if_range(cond, &entry.etag, &entry.last_modified) {
            return RangeAnswer::Full;
        }
    }
    range::parse_range(value, entry.len)
}

impl Handler for HttpConn {
    fn on_drain(&mut self) -> bool {
        self.draining = true;
        true
    }

    /// Between requests only: not while a body is being read and skipped. A head not
    /// complete yet stays unconsumed in the input, which moves with the connection.
    fn handoff(&self) -> Option<Vec<u8>> {
        (self.skip_body == 0).then(Vec::new)
    }

    /// The last request's body is not all here yet: the client is still sending it.
    fn expects_input(&self) -> bool {
        self.skip_body > 0
    }

    fn on_input(&mut self, input: &[u8], out: &mut Output, now: Instant) -> Step {
        let mut consumed = 0;
        let mut requests = 0;
        let step = loop {
            consumed += self.skip(&input[consumed..]);
            let rest = &input[consumed..];
            if self.skip_body > 0 || rest.is_empty() {
                break Step::read(consumed, requests);
            }
            // Back-pressure: leave further pipelined requests in the input until output drains.
            if out.total_len() >= self.inner.config.output_bytes_max || out.room() == 0 {
                break Step::read(consumed, requests);
            }
            match self.parser.parse(rest, &self.inner.config.limits) {
                Ok(Parse::Partial) => {
                    if self.header_deadline_passed(now) {
                        let why = self.fail(Status::RequestTimeout, out, now);
                        break Step::close(input.len(), requests, why);
                    }
                    break Step::read(consumed, requests);
                }
                Ok(Parse::Complete { request, head_len }) => {
                    self.parser.reset();
                    self.head_started = None;
                    consumed += head_len;
                    self.skip_body = request.content_length;
                    requests += 1;
                    if let Err(why) = self.serve(&request, out, now) {
                        // What follows the request (pipelined requests, the body's unread
                        // rest) stays unconsumed: the runtime then closes lingering.
                        consumed += self.skip(&input[consumed..]);
                        break Step::close(consumed, requests, why);
                    }
                }
                Err(e) => {
                    let why = self.fail(e.status(), out, now);
                    break Step::close(input.len(), requests, why);
                }
            }
        };
        self.flush_log();
        step
    }
}

impl Drop for HttpConn {
    fn drop(&mut self) {
        self.flush_log();
    }
}
