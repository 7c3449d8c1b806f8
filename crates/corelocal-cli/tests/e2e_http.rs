//! `corelocal serve http` through the real binary with real clients: curl, wrk, httperf,
//! Python's http.client, and the `--metrics` endpoint. A missing client skips its test with a
//! printed reason, except under `CI=true`, where it fails (.ci/run installs them).

mod common;

use common::{garbage, need, python_has, require, run, run_ok, Served, TempDir};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const BODY: &str = "hello corelocal world";

/// A root with `a.txt`, a file outside it (`../secret.txt`) and a symlink escaping to it.
fn site() -> TempDir {
    let t = TempDir::new("http");
    let www = t.0.join("www");
    std::fs::create_dir_all(www.join("sub")).unwrap();
    std::fs::write(www.join("a.txt"), BODY).unwrap();
    std::fs::write(www.join("sub/b.html"), "<p>b</p>").unwrap();
    std::fs::write(t.0.join("secret.txt"), "TOPSECRET").unwrap();
    std::os::unix::fs::symlink(t.0.join("secret.txt"), www.join("link.txt")).unwrap();
    t
}

fn serve_site(t: &TempDir, extra: &[&str]) -> Served {
    let root = t.0.join("www");
    let mut args = vec!["--root", root.to_str().unwrap()];
    args.extend_from_slice(extra);
    Served::start("http", &args)
}

/// `curl -s -i ARGS URL` → (status, headers in lower case, body).
fn curl(extra: &[&str], url: &str) -> (u16, String, String) {
    let mut args = vec!["-s", "-i", "--max-time", "5"];
    args.extend_from_slice(extra);
    args.push(url);
    let out = run_ok(10, "curl", &args);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    (status, head.to_ascii_lowercase(), body.to_string())
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

#[test]
fn curl_get_head_range_and_conditional_requests() {
    if !need(&["curl"]) {
        return;
    }
    let t = site();
    let s = serve_site(&t, &[]);
    let url = format!("http://{}/a.txt", s.hostport());

    let (code, head, body) = curl(&[], &url);
    assert_eq!((code, body.as_str()), (200, BODY));
    assert_eq!(header(&head, "content-length"), Some("21"));
    assert!(header(&head, "content-type")
        .unwrap()
        .starts_with("text/plain"));
    let etag = header(&head, "etag").expect("ETag").to_string();
    let last_modified = header(&head, "last-modified").expect("Last-Modified");
    // curl lowercased it; HTTP dates are case-insensitive in practice, but send the original.
    let (_, head_raw, _) = curl(&["-I"], &url);
    assert!(head_raw.contains("content-length: 21"), "{head_raw}");

    // HEAD: same headers, no body.
    let out = run_ok(10, "curl", &["-s", "-I", "--max-time", "5", &url]);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.ends_with("\r\n\r\n"), "HEAD has a body: {out:?}");

    // Range: 206 with Content-Range, and 416 past the end.
    let (code, head, body) = curl(&["-r", "2-5"], &url);
    assert_eq!((code, body.as_str()), (206, "llo "));
    assert_eq!(header(&head, "content-range"), Some("bytes 2-5/21"));
    let (code, _, _) = curl(&["-r", "100-"], &url);
    assert_eq!(code, 416);

    // Conditional: If-None-Match and If-Modified-Since → 304 without a body.
    let inm = format!("If-None-Match: {etag}");
    let (code, _, body) = curl(&["-H", &inm], &url);
    assert_eq!((code, body.as_str()), (304, ""));
    let out = run_ok(10, "curl", &["-s", "-I", "--max-time", "5", &url]);
    let lm = out
        .lines()
        .find_map(|l| l.strip_prefix("Last-Modified: "))
        .unwrap_or(last_modified)
        .trim()
        .to_string();
    let ims = format!("If-Modified-Since: {lm}");
    let (code, _, body) = curl(&["-H", &ims], &url);
    assert_eq!((code, body.as_str()), (304, ""));
    // A different ETag → full body.
    let (code, _, body) = curl(&["-H", "If-None-Match: \"other\""], &url);
    assert_eq!((code, body.as_str()), (200, BODY));
    // Content-Type by extension, and 404.
    let (code, head, _) = curl(&[], &format!("http://{}/sub/b.html", s.hostport()));
    assert_eq!(code, 200);
    assert!(header(&head, "content-type")
        .unwrap()
        .starts_with("text/html"));
    let (code, _, _) = curl(&[], &format!("http://{}/nope.txt", s.hostport()));
    assert_eq!(code, 404);
    assert_eq!(s.terminate().0, 0);
}

#[test]
fn curl_traversal_attempts_never_leave_the_root() {
    if !need(&["curl"]) {
        return;
    }
    let t = site();
    let s = serve_site(&t, &[]);
    for path in [
        "/../secret.txt",
        "/../../../../etc/passwd",
        "/%2e%2e/secret.txt",
        "/%2E%2E/secret.txt",
        "/%2e%2e%2fsecret.txt",
        "/..%2fsecret.txt",
        "/sub/../../secret.txt",
        "/sub/%2e%2e/%2e%2e/secret.txt",
        "/./../secret.txt",
        "/a.txt%00.html",
        "/link.txt",
        "//etc/passwd",
        "/%252e%252e/secret.txt",
    ] {
        let url = format!("http://{}{path}", s.hostport());
        let (code, _, body) = curl(&["--path-as-is"], &url);
        assert!(
            matches!(code, 400 | 403 | 404),
            "{path}: status {code}, body {body:?}"
        );
        assert!(
            !body.contains("TOPSECRET") && !body.contains("root:"),
            "{path}: {body}"
        );
    }
    // And it still serves.
    let (code, _, body) = curl(&[], &format!("http://{}/a.txt", s.hostport()));
    assert_eq!((code, body.as_str()), (200, BODY));
    assert_eq!(s.terminate().0, 0);
}

/// Runs wrk for one second; returns (requests, output). Fails on non-2xx or socket errors.
fn wrk(url: &str, extra: &[&str]) -> (u64, String) {
    let mut args = vec!["-t", "1", "-c", "8", "-d", "1s", "--timeout", "2s"];
    args.extend_from_slice(extra);
    args.push(url);
    let out = run_ok(15, "wrk", &args);
    assert!(!out.contains("Non-2xx"), "non-2xx responses: {out}");
    assert!(!out.contains("Socket errors"), "socket errors: {out}");
    let requests = out
        .lines()
        .find_map(|l| l.trim().split_once(" requests in "))
        .and_then(|(n, _)| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no request count: {out}"));
    (requests, out)
}

#[test]
fn wrk_keep_alive_and_connection_close_all_2xx() {
    if !need(&["wrk"]) {
        return;
    }
    let s = Served::start("http", &[]);
    let url = format!("http://{}/files/00/00002.txt", s.hostport());
    let (ka, out) = wrk(&url, &[]);
    assert!(ka > 100, "keep-alive: only {ka} requests\n{out}");
    let (close, out) = wrk(&url, &["-H", "Connection: close"]);
    assert!(
        close > 20,
        "Connection: close: only {close} requests\n{out}"
    );
    assert_eq!(s.terminate().0, 0);
}

/// Parses httperf's "Reply status: 1xx=0 2xx=N …" and "Errors: total N".
fn httperf_replies(out: &str) -> (u64, u64, u64) {
    let field = |line_prefix: &str, key: &str| -> u64 {
        out.lines()
            .find(|l| l.starts_with(line_prefix))
            .and_then(|l| l.split(key).nth(1))
            .and_then(|r| {
                r.split_whitespace()
                    .next()
                    .and_then(|n| n.trim_start_matches('=').parse().ok())
            })
            .unwrap_or_else(|| panic!("no {line_prefix} {key} in {out}"))
    };
    let ok = field("Reply status:", "2xx");
    let not_ok: u64 = ["1xx", "3xx", "4xx", "5xx"]
        .iter()
        .map(|k| field("Reply status:", k))
        .sum();
    (ok, not_ok, field("Errors: total", "total"))
}

#[test]
fn httperf_sessions_are_all_answered() {
    if !need(&["httperf"]) {
        return;
    }
    let s = Served::start("http", &[]);
    let port = s.addr.port().to_string();
    // 20 sessions of 5 keep-alive calls each, 2 per burst (pipelined), 100 sessions/s.
    let out = run_ok(
        20,
        "httperf",
        &[
            "--server",
            "127.0.0.1",
            "--port",
            &port,
            "--uri",
            "/files/00/00001.txt",
            "--wsess=20,5,0",
            "--burst-length=2",
            "--rate=100",
            "--timeout=3",
        ],
    );
    assert_eq!(httperf_replies(&out), (100, 0, 0), "{out}");

    // The paper's shape: sessions over several files, a pipelined burst then think time.
    let t = TempDir::new("httperf");
    let log = t.0.join("sessions.log");
    let mut text = String::new();
    for sess in 0..10 {
        for (k, i) in (0..4)
            .map(|k| (k, sess * 97 + k * 1013))
            .collect::<Vec<_>>()
        {
            let indent = if k == 0 { "" } else { "  " };
            text += &format!("{indent}/files/{:02}/{:05}.txt\n", i / 1000, i);
        }
        text += "/index.html\n\n";
    }
    std::fs::write(&log, text).unwrap();
    let wsesslog = format!("--wsesslog=10,0.01,{}", log.display());
    let out = run_ok(
        20,
        "httperf",
        &[
            "--server",
            "127.0.0.1",
            "--port",
            &port,
            &wsesslog,
            "--rate=100",
            "--timeout=3",
        ],
    );
    assert_eq!(httperf_replies(&out), (50, 0, 0), "{out}");
    assert_eq!(s.terminate().0, 0);
}

const PIPELINE_PY: &str = r#"
import http.client, io, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
sock = socket.create_connection((host, port), timeout=5)
sock.sendall(
    b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n"
    b"HEAD /a.txt HTTP/1.1\r\nHost: x\r\n\r\n"
    b"GET /sub/b.html HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
class Keep(io.BufferedReader):
    def close(self):  # one reader shared by the three responses
        pass
class Sock:
    def __init__(self, f): self.f = f
    def makefile(self, *a, **k): return self.f
shared = Sock(Keep(socket.SocketIO(sock, "rb")))
got = []
for method in ("GET", "HEAD", "GET"):
    r = http.client.HTTPResponse(shared, method=method)
    r.begin()
    got.append((r.status, r.read().decode(), r.getheader("Content-Length")))
assert got[0] == (200, "hello corelocal world", "21"), got
assert got[1] == (200, "", "21"), got
assert got[2] == (200, "<p>b</p>", "8"), got
assert sock.recv(1) == b"", "not closed after Connection: close"
print("ok", got)
"#;

#[test]
fn python_http_client_three_pipelined_requests_on_one_socket() {
    if !require("python3", python_has("http.client")) {
        return;
    }
    let t = site();
    let s = serve_site(&t, &[]);
    let port = s.addr.port().to_string();
    let out = run_ok(10, "python3", &["-c", PIPELINE_PY, "127.0.0.1", &port]);
    assert!(out.starts_with("ok"), "{out}");
    assert_eq!(s.terminate().0, 0);
}

#[test]
fn metrics_endpoint_has_per_worker_lines_json_and_stops_with_the_server() {
    let s = Served::start("http", &["--metrics", "127.0.0.1:0"]);
    let m = s.metrics.expect("metrics address");
    for _ in 0..5 {
        assert!(common::http_get(s.addr, "/64.txt").starts_with("HTTP/1.1 200"));
    }
    let text = common::http_get(m, "/metrics");
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.contains("Content-Type: text/plain; version=0.0.4"));
    let workers: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("corelocal_workers "))
        .and_then(|n| n.parse().ok())
        .expect("corelocal_workers");
    assert!(workers >= 1);
    for name in [
        "corelocal_accepted_total",
        "corelocal_accepted_local_total",
        "corelocal_stolen_total",
        "corelocal_requests_total",
        "corelocal_open_connections",
        "corelocal_accept_queue_length",
        "corelocal_busy",
    ] {
        let lines = text
            .lines()
            .filter(|l| l.starts_with(&format!("{name}{{worker=\"")))
            .count();
        assert_eq!(lines, workers, "{name}: {text}");
        assert!(text.contains(&format!("# TYPE {name} ")), "{name}");
    }
    let requests: u64 = text
        .lines()
        .filter(|l| l.starts_with("corelocal_requests_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(requests, 5, "{text}");
    assert!(text.contains("corelocal_info{app=\"http\""));

    let json = common::http_get(m, "/metrics.json");
    let body = json.split_once("\r\n\r\n").unwrap().1;
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["total"]["requests"], 5);
    assert_eq!(v["workers"].as_array().unwrap().len(), workers);
    assert!(common::http_get(m, "/").starts_with("HTTP/1.1 404"));

    // A slow or oversized request is cut off, and the endpoint keeps answering.
    let mut big = TcpStream::connect(m).unwrap();
    big.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = big.write_all(&vec![b'a'; 20_000]);
    let mut reply = Vec::new();
    let _ = big.read_to_end(&mut reply);
    assert!(
        reply.is_empty() || reply.starts_with(b"HTTP/1.1 431"),
        "{:?}",
        String::from_utf8_lossy(&reply)
    );
    assert!(common::http_get(m, "/metrics").starts_with("HTTP/1.1 200"));

    if need(&["curl"]) {
        let out = run_ok(
            10,
            "curl",
            &["-s", "--max-time", "5", &format!("http://{m}/metrics")],
        );
        assert!(
            out.contains("corelocal_requests_total{worker=\"0\""),
            "{out}"
        );
    }

    assert_eq!(s.terminate().0, 0);
    assert!(
        TcpStream::connect_timeout(&m, Duration::from_secs(1)).is_err(),
        "metrics endpoint still up after the server stopped"
    );
}

#[test]
fn bench_server_stats_reads_the_metrics_json_endpoint() {
    let s = Served::start("http", &["--metrics", "127.0.0.1:0"]);
    let m = s.metrics.unwrap();
    let out = run(
        30,
        common::BIN,
        &[
            "bench",
            "crr",
            "--proto",
            "http",
            "--target",
            &s.hostport(),
            "--path",
            "/64.txt",
            "-n",
            "200",
            "-c",
            "4",
            "--server-stats",
            &format!("http://{m}/metrics.json"),
        ],
    );
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("server locality"), "{text}");
    assert!(!text.contains("server stats | error"), "{text}");
    assert_eq!(s.terminate().0, 0);
}

#[test]
fn metrics_flag_errors_are_clear() {
    let out = std::process::Command::new(common::BIN)
        .args(["serve", "http", "--metrics", "nowhere"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--metrics"));
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().to_string();
    let out = std::process::Command::new(common::BIN)
        .args([
            "serve",
            "http",
            "--listen",
            "127.0.0.1:0",
            "--metrics",
            &port,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("--metrics {port}")) && err.contains("in use"),
        "{err}"
    );
}

/// Reads until EOF, a reset or `limit`; returns what arrived (a reset after a reply is fine).
fn read_reply(s: &mut TcpStream, limit: Duration) -> Vec<u8> {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

fn assert_still_serving(addr: std::net::SocketAddr) {
    let r = common::http_get(addr, "/a.txt");
    assert!(r.starts_with("HTTP/1.1 200") && r.ends_with(BODY), "{r}");
}

#[test]
fn half_closed_clients_are_answered_or_closed_and_others_still_served() {
    let t = site();
    let s = serve_site(&t, &[]);
    // Half a request, then the write side shut: no reply owed; a 400 or a plain close.
    let mut half = TcpStream::connect(s.addr).unwrap();
    half.write_all(b"GET /a.txt HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    half.shutdown(std::net::Shutdown::Write).unwrap();
    let started = std::time::Instant::now();
    let reply = read_reply(&mut half, Duration::from_secs(5));
    assert!(
        reply.is_empty() || reply.starts_with(b"HTTP/1.1 400"),
        "{:?}",
        String::from_utf8_lossy(&reply)
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "half-closed client held open"
    );
    assert_still_serving(s.addr);
    // A whole request, then the write side shut: still answered.
    let mut whole = TcpStream::connect(s.addr).unwrap();
    whole
        .write_all(b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    whole.shutdown(std::net::Shutdown::Write).unwrap();
    let reply =
        String::from_utf8_lossy(&read_reply(&mut whole, Duration::from_secs(5))).into_owned();
    assert!(
        reply.starts_with("HTTP/1.1 200") && reply.ends_with(BODY),
        "{reply}"
    );
    assert_still_serving(s.addr);
    assert_eq!(s.terminate().0, 0);
}

/// The workers' accepted connections, from the metrics endpoint (not counting its own).
fn accepted_total(metrics: std::net::SocketAddr) -> u64 {
    common::http_get(metrics, "/metrics")
        .lines()
        .filter(|l| l.starts_with("corelocal_accepted_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// TCP_DEFER_ACCEPT (`--defer-accept`, 1 s by default) held on (`--defer-accept-adaptive
/// off`): a connection is accepted with its first request; one that connects and speaks later
/// (a preconnect, a pool's spare) is still answered; a silent one is accepted once the period
/// passes. With it off, at once; and by default an idle worker does not defer (it defers
/// while it batches), so a silent connection is accepted at once there too.
#[test]
fn deferred_accept_answers_late_speakers_and_takes_silent_ones_after_the_period() {
    let s = Served::start(
        "http",
        &["--metrics", "127.0.0.1:0", "--defer-accept-adaptive", "off"],
    );
    let m = s.metrics.expect("metrics address");
    let request = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n";
    let mut early = TcpStream::connect(s.addr).unwrap();
    let mut late = TcpStream::connect(s.addr).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        accepted_total(m),
        0,
        "connections without data were accepted"
    );
    early.write_all(request).unwrap();
    let reply = read_reply(&mut early, Duration::from_secs(2));
    assert!(
        reply.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&reply)
    );
    // The silent one: the SYN-ACK is sent again after 1 s, its ACK completes the accept.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while accepted_total(m) < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        accepted_total(m),
        2,
        "the silent connection was never accepted"
    );
    late.write_all(request).unwrap();
    let reply = read_reply(&mut late, Duration::from_secs(2));
    assert!(
        reply.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&reply)
    );
    assert_eq!(s.terminate().0, 0);

    let s = Served::start("http", &["--metrics", "127.0.0.1:0", "--defer-accept", "0"]);
    let m = s.metrics.expect("metrics address");
    let _silent = TcpStream::connect(s.addr).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_millis(900);
    while accepted_total(m) < 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(accepted_total(m), 1, "--defer-accept 0 still deferred");
    assert_eq!(s.terminate().0, 0);

    let s = Served::start("http", &["--metrics", "127.0.0.1:0"]);
    let m = s.metrics.expect("metrics address");
    let _silent = TcpStream::connect(s.addr).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_millis(900);
    while accepted_total(m) < 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(accepted_total(m), 1, "an idle worker deferred");
    assert_eq!(s.terminate().0, 0);
}

/// A stop while a client has connected but not yet sent (its connection held by
/// TCP_DEFER_ACCEPT, in no accept queue): the stop's accept phase lasts the period, so the
/// request it sends 300 ms into the stop is still answered — the 100 ms quiesce of a server
/// without the deferral would have closed the listener and reset it.
#[test]
fn a_stop_still_answers_a_client_that_connected_before_it_and_speaks_during_it() {
    let s = Served::start("http", &["--drain-timeout", "5s"]);
    let mut c = TcpStream::connect(s.addr).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let stopper = std::thread::spawn(move || s.terminate());
    std::thread::sleep(Duration::from_millis(300));
    c.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    let reply = read_reply(&mut c, Duration::from_secs(3));
    assert!(
        reply.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&reply)
    );
    assert_eq!(stopper.join().unwrap().0, 0);
}

#[test]
fn slowloris_and_silent_clients_are_cut_off_while_others_are_served() {
    let t = site();
    let s = serve_site(&t, &["--idle-timeout", "500ms", "--header-timeout", "1s"]);
    // Trickles a header byte every 100 ms: never idle for 500 ms, so only the header deadline
    // (1 s after the first byte) stops it.
    let mut slow = TcpStream::connect(s.addr).unwrap();
    slow.write_all(b"GET /a.txt HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .unwrap();
    let mut w = slow.try_clone().unwrap();
    let trickle = std::thread::spawn(move || {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < Duration::from_secs(6) {
            if w.write_all(b"a").is_err() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    });
    let silent = TcpStream::connect(s.addr).unwrap();
    let started = std::time::Instant::now();
    // Others are served while the slow clients hold their connections.
    for _ in 0..3 {
        assert_still_serving(s.addr);
        std::thread::sleep(Duration::from_millis(100));
    }
    let reply = read_reply(&mut slow, Duration::from_secs(5));
    let took = started.elapsed();
    assert!(
        reply.is_empty() || reply.starts_with(b"HTTP/1.1 408"),
        "{:?}",
        String::from_utf8_lossy(&reply)
    );
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(4),
        "slowloris cut off after {took:?} (header deadline 1s)"
    );
    let mut silent = silent;
    let reply = read_reply(&mut silent, Duration::from_secs(5));
    assert!(reply.is_empty(), "{:?}", String::from_utf8_lossy(&reply));
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "silent client held open"
    );
    assert!(
        trickle.join().unwrap(),
        "the trickling writer was never refused"
    );
    assert_still_serving(s.addr);
    assert_eq!(s.terminate().0, 0);
}

#[test]
fn binary_garbage_and_a_100kb_header_get_4xx_or_close_and_the_server_keeps_serving() {
    let t = site();
    let s = serve_site(&t, &[]);
    for junk in [garbage(4096), {
        let mut g = garbage(300);
        g.extend_from_slice(b"\r\n\r\n");
        g
    }] {
        let mut c = TcpStream::connect(s.addr).unwrap();
        let _ = c.write_all(&junk);
        let _ = c.shutdown(std::net::Shutdown::Write);
        let reply = read_reply(&mut c, Duration::from_secs(5));
        assert!(
            reply.is_empty() || reply.starts_with(b"HTTP/1.1 400"),
            "{:?}",
            String::from_utf8_lossy(&reply)
        );
        assert_still_serving(s.addr);
    }
    let mut big = b"GET /a.txt HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    big.resize(big.len() + 100_000, b'a');
    big.extend_from_slice(b"\r\n\r\n");
    let mut c = TcpStream::connect(s.addr).unwrap();
    let _ = c.write_all(&big);
    let reply = read_reply(&mut c, Duration::from_secs(5));
    assert!(
        reply.is_empty()
            || reply.starts_with(b"HTTP/1.1 431")
            || reply.starts_with(b"HTTP/1.1 400"),
        "{:?}",
        String::from_utf8_lossy(&reply)
    );
    assert_still_serving(s.addr);
    assert_eq!(s.terminate().0, 0);
}
