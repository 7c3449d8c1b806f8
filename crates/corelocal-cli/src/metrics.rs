//! `--metrics ADDR`: the servers' counters over HTTP, for Prometheus and for
//! `corelocal bench --server-stats URL`.
//!
//! `GET /metrics` answers the Prometheus text exposition format (version 0.0.4): one sample per
//! worker and counter, labelled `worker` and `cpu`; `GET /metrics.json` answers the same snapshot
//! as one JSON object ([`Snapshot::to_json`]). Anything else is 404 (unknown path), 405 (method
//! other than GET/HEAD) or 400 (not HTTP).
//!
//! The formatting and routing are pure functions (tested below). The listener is one plain thread
//! in the CLI process, not a worker, serving one connection at a time with a bounded request
//! (8 KiB) and a bounded time per connection (2 s); it answers `Connection: close`. It stops
//! when its [`Endpoint`] is dropped, which `serve` does when the server has stopped.

use corelocal::runtime::prometheus::{prometheus as prometheus_text, Families};
use corelocal::runtime::{Server, ServerConfig, Snapshot, StatsReader};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Largest request head accepted (request line + headers).
pub const REQUEST_MAX: usize = 8192;
/// Longest one connection may take to send its request and receive the answer.
pub const CONN_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the idle listener checks whether it should stop.
const POLL: Duration = Duration::from_millis(50);

/// Where a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `/metrics`: Prometheus text.
    Prometheus,
    /// `/metrics.json`: the snapshot as JSON.
    Json,
    /// Any other path.
    NotFound,
    /// A method other than GET or HEAD.
    MethodNotAllowed,
    /// Not an HTTP/1.x request line.
    BadRequest,
}

/// Routes a request head (bytes up to the blank line). Returns the route and whether the method
/// was HEAD (answer without a body).
pub fn route(head: &[u8]) -> (Route, bool) {
    let line_end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    let Ok(line) = std::str::from_utf8(&head[..line_end]) else {
        return (Route::BadRequest, false);
    };
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return (Route::BadRequest, false);
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() || !target.starts_with('/') {
        return (Route::BadRequest, false);
    }
    let head_only = method == "HEAD";
    if method != "GET" && !head_only {
        return (Route::MethodNotAllowed, false);
    }
    let path = target.split(['?', '#']).next().unwrap_or("");
    let r = match path {
        "/metrics" => Route::Prometheus,
        "/metrics.json" => Route::Json,
        _ => Route::NotFound,
    };
    (r, head_only)
}

/// Escapes a Prometheus label value (backslash, double quote, newline).
/// The runtime's Prometheus text (see `corelocal::runtime::prometheus`), every family.
pub fn prometheus(snap: &Snapshot, info: &[(&str, String)]) -> String {
    prometheus_text(snap, info, Families::Runtime)
}

/// The whole HTTP response for a request head; `snap` is called only when a body needs it.
pub fn respond(head: &[u8], snap: impl FnOnce() -> Snapshot, info: &[(&str, String)]) -> Vec<u8> {
    let (route, head_only) = route(head);
    let (status, ctype, body) = match route {
        Route::Prometheus => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            prometheus(&snap(), info),
        ),
        Route::Json => ("200 OK", "application/json", snap().to_json() + "\n"),
        Route::NotFound => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found: try /metrics or /metrics.json\n".to_string(),
        ),
        Route::MethodNotAllowed => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "method not allowed: GET or HEAD\n".to_string(),
        ),
        Route::BadRequest => (
            "400 Bad Request",
            "text/plain; charset=utf-8",
            "bad request\n".to_string(),
        ),
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n",
        body.len(),
        if route == Route::MethodNotAllowed { "Allow: GET, HEAD\r\n" } else { "" },
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
    out
}

/// Where the request head ends (just past the blank line), if it has.
fn head_end(buf: &[u8]) -> Option<usize> {
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4);
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|p| p + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The running metrics listener. Dropping it stops the thread and waits for it.
#[derive(Debug)]
pub struct Endpoint {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Endpoint {
    /// Binds `addr` and answers requests with snapshots from `stats` until dropped.
    pub fn start(
        addr: SocketAddr,
        stats: StatsReader,
        info: Vec<(&'static str, String)>,
    ) -> io::Result<Endpoint> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("corelocal-metrics".into())
            .spawn(move || {
                while !flag.load(Ordering::Acquire) {
                    match listener.accept() {
                        Ok((conn, _)) => {
                            let _ = serve_one(conn, &stats, &info);
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(POLL),
                        // EMFILE, ECONNABORTED, …: back off and go on.
                        Err(_) => std::thread::sleep(POLL),
                    }
                }
            })?;
        Ok(Endpoint {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The bound address (port resolved).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `serve`'s one call: starts the endpoint when `--metrics ADDR` was given and says where on
/// stderr. The endpoint runs until the returned value is dropped.
pub fn start_for(
    addr: Option<SocketAddr>,
    server: &Server,
    app: &str,
    config: &ServerConfig,
) -> Result<Option<Endpoint>, String> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let info = vec![
        ("app", app.to_string()),
        ("backend", server.backend().to_string()),
        ("mode", config.listen.mode.to_string()),
        ("steering", server.steering().to_string()),
    ];
    let endpoint = Endpoint::start(addr, server.stats_reader(), info)
        .map_err(|e| crate::check::bind_error("--metrics", addr, &e))?;
    eprintln!(
        "corelocal serve {app}: metrics on http://{}/metrics (and /metrics.json)",
        endpoint.local_addr()
    );
    Ok(Some(endpoint))
}

/// Reads one request head (bounded in size and time) and writes the answer.
fn serve_one(mut conn: TcpStream, stats: &StatsReader, info: &[(&str, String)]) -> io::Result<()> {
    conn.set_nonblocking(false)?;
    let deadline = Instant::now() + CONN_TIMEOUT;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let head = loop {
        if let Some(end) = head_end(&buf) {
            break &buf[..end];
        }
        if buf.len() >= REQUEST_MAX {
            let body = "request header too large\n";
            let resp = format!(
                "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            return conn.write_all(resp.as_bytes());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        conn.set_read_timeout(Some(left))?;
        let want = chunk.len().min(REQUEST_MAX - buf.len());
        match conn.read(&mut chunk[..want])? {
            0 if buf.is_empty() => return Ok(()),
            // Closed before the blank line: answer what we have (curl-less clients, `nc`).
            0 => break &buf[..],
            n => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let resp = respond(head, || stats.snapshot(), info);
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(100));
    conn.set_write_timeout(Some(left))?;
    conn.write_all(&resp)?;
    let _ = conn.shutdown(std::net::Shutdown::Write);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use corelocal::runtime::WorkerSnapshot;

    fn snap() -> Snapshot {
        let w0 = WorkerSnapshot {
            worker: 0,
            cpu: 2,
            accepted: 10,
            accepted_local: 9,
            stolen: 1,
            requests: 30,
            bytes_in: 100,
            bytes_out: 2000,
            open: 3,
            queue_len: 4,
            queue_cap: 128,
            busy: true,
            stolen_from: vec![0, 1],
            ..WorkerSnapshot::default()
        };
        let mut w1 = WorkerSnapshot {
            worker: 1,
            cpu: 5,
            accepted: 7,
            ..WorkerSnapshot::default()
        };
        w1.errors.too_large = 2;
        w1.errors.io = 1;
        w1.conn_limit_pauses = 6;
        let mut s = Snapshot::from_workers(vec![w0, w1]);
        s.net.syncookies_sent = 41;
        s
    }

    fn info() -> Vec<(&'static str, String)> {
        vec![("app", "http".into()), ("backend", "uring".into())]
    }

    #[test]
    fn routes() {
        assert_eq!(
            route(b"GET /metrics HTTP/1.1\r\n\r\n"),
            (Route::Prometheus, false)
        );
        assert_eq!(
            route(b"HEAD /metrics HTTP/1.0\r\n\r\n"),
            (Route::Prometheus, true)
        );
        assert_eq!(
            route(b"GET /metrics.json?x=1 HTTP/1.1\r\nHost: a\r\n\r\n"),
            (Route::Json, false)
        );
        assert_eq!(route(b"GET / HTTP/1.1\r\n\r\n").0, Route::NotFound);
        assert_eq!(route(b"GET /metricsX HTTP/1.1\r\n\r\n").0, Route::NotFound);
        assert_eq!(
            route(b"POST /metrics HTTP/1.1\r\n\r\n").0,
            Route::MethodNotAllowed
        );
        assert_eq!(route(b"GET /metrics\r\n\r\n").0, Route::BadRequest);
        assert_eq!(route(b"GET metrics HTTP/1.1\r\n\r\n").0, Route::BadRequest);
        assert_eq!(route(b"\xff\xfe garbage").0, Route::BadRequest);
        assert_eq!(route(b"").0, Route::BadRequest);
        assert_eq!(route(b"GET /metrics HTTP/2.0\r\n\r\n").0, Route::BadRequest);
    }

    #[test]
    fn prometheus_has_help_type_and_one_line_per_worker_and_counter() {
        let text = prometheus(&snap(), &info());
        assert!(text.contains("corelocal_info{app=\"http\",backend=\"uring\"} 1\n"));
        assert!(text.contains("corelocal_workers 2\n"));
        assert!(text.contains("# TYPE corelocal_accepted_total counter\n"));
        assert!(text.contains("# HELP corelocal_accepted_total "));
        assert!(text.contains("corelocal_accepted_total{worker=\"0\",cpu=\"2\"} 10\n"));
        assert!(text.contains("corelocal_accepted_total{worker=\"1\",cpu=\"5\"} 7\n"));
        assert!(text.contains("corelocal_accepted_local_total{worker=\"0\",cpu=\"2\"} 9\n"));
        assert!(text.contains("corelocal_stolen_total{worker=\"0\",cpu=\"2\"} 1\n"));
        assert!(
            text.contains("corelocal_stolen_from_total{worker=\"0\",cpu=\"2\",victim=\"1\"} 1\n")
        );
        assert!(text.contains("corelocal_requests_total{worker=\"0\",cpu=\"2\"} 30\n"));
        assert!(text.contains("corelocal_open_connections{worker=\"0\",cpu=\"2\"} 3\n"));
        assert!(text.contains("# TYPE corelocal_open_connections gauge\n"));
        assert!(text.contains("corelocal_accept_queue_length{worker=\"0\",cpu=\"2\"} 4\n"));
        assert!(text.contains("corelocal_busy{worker=\"0\",cpu=\"2\"} 1\n"));
        assert!(text.contains("corelocal_busy{worker=\"1\",cpu=\"5\"} 0\n"));
        assert!(text.contains("corelocal_sent_bytes_total{worker=\"0\",cpu=\"2\"} 2000\n"));
        assert!(
            text.contains("corelocal_errors_total{worker=\"1\",cpu=\"5\",kind=\"too_large\"} 2\n")
        );
        assert!(text.contains("corelocal_errors_total{worker=\"1\",cpu=\"5\",kind=\"io\"} 1\n"));
        assert!(text.contains("corelocal_conn_limit_pauses_total{worker=\"1\",cpu=\"5\"} 6\n"));
        assert!(text.contains("# TYPE corelocal_net_syncookies_sent_total counter\n"));
        assert!(text.contains("\ncorelocal_net_syncookies_sent_total 41\n"));
        assert!(text.contains("\ncorelocal_net_listen_overflows_total 0\n"));
        assert!(text
            .contains("corelocal_errors_total{worker=\"0\",cpu=\"2\",kind=\"bad_request\"} 0\n"));
    }

    /// Every line is a comment or `name{labels} value` with a numeric value; every metric
    /// has exactly one HELP and one TYPE, before its samples.
    #[test]
    fn prometheus_is_well_formed() {
        let text = prometheus(&snap(), &info());
        assert!(text.ends_with('\n'));
        let mut typed = std::collections::HashSet::new();
        let mut helped = std::collections::HashSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(kind == "counter" || kind == "gauge", "{line}");
                assert!(typed.insert(name.to_string()), "two TYPE lines: {line}");
                continue;
            }
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap();
                assert!(helped.insert(name.to_string()), "two HELP lines: {line}");
                continue;
            }
            let (series, value) = line.rsplit_once(' ').unwrap();
            value.parse::<f64>().unwrap();
            let name = series.split('{').next().unwrap();
            assert!(
                name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "{line}"
            );
            assert!(typed.contains(name), "sample before TYPE: {line}");
            assert!(helped.contains(name), "sample before HELP: {line}");
            if series.contains('{') {
                assert!(series.ends_with('}'), "{line}");
            }
        }
        assert_eq!(typed, helped);
    }

    #[test]
    fn label_values_are_escaped() {
        let text = prometheus(&Snapshot::default(), &[("app", "a\"b\\c\nd".into())]);
        assert!(
            text.contains("corelocal_info{app=\"a\\\"b\\\\c\\nd\"} 1\n"),
            "{text}"
        );
    }

    #[test]
    fn json_is_the_snapshot_and_bench_can_parse_it() {
        let resp = respond(b"GET /metrics.json HTTP/1.1\r\n\r\n", snap, &info());
        let text = String::from_utf8(resp).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(head.contains("Content-Type: application/json"));
        assert!(head.contains(&format!("Content-Length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["total"]["accepted"], 17);
        assert_eq!(v["net"]["syncookies_sent"], 41);
        assert_eq!(v["total"]["conn_limit_pauses"], 6);
        assert_eq!(v["workers"][1]["cpu"], 5);
        let parsed = corelocal_bench::serverstats::parse_last(body).unwrap();
        assert_eq!(parsed.total.accepted, 17);
        assert_eq!(parsed.total.errors, 3);
        assert_eq!(parsed.workers.len(), 2);
    }

    #[test]
    fn head_has_no_body_and_errors_have_status_codes() {
        let resp = respond(b"HEAD /metrics HTTP/1.1\r\n\r\n", snap, &info());
        let text = String::from_utf8(resp).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(text.ends_with("\r\n\r\n"));
        let not_called = || -> Snapshot { panic!("no snapshot for an error") };
        let r = respond(b"GET /nope HTTP/1.1\r\n\r\n", not_called, &[]);
        assert!(r.starts_with(b"HTTP/1.1 404 Not Found\r\n"));
        let r = respond(b"PUT /metrics HTTP/1.1\r\n\r\n", not_called, &[]);
        assert!(r.starts_with(b"HTTP/1.1 405 Method Not Allowed\r\n"));
        assert!(String::from_utf8_lossy(&r).contains("Allow: GET, HEAD\r\n"));
        let r = respond(b"\x00\x01\x02", not_called, &[]);
        assert!(r.starts_with(b"HTTP/1.1 400 Bad Request\r\n"));
    }

    #[test]
    fn head_end_finds_crlf_or_lf() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nrest"), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\n"), Some(16));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n"), None);
    }
}
