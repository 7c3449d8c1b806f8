//! What careless and hostile clients receive from `serve http` and `serve kv`, on both
//! backends: every answer arrives, whatever the client still sends after it (oversize lines,
//! bodies the server will not read, requests pipelined after a close, bytes after an error),
//! and the connection then ends with a FIN, never a reset that destroys the answer.
//!
//! The mechanism under test is the lingering close (`Closing::Lingering` in the runtime): the
//! answer goes out, the sending side is shut down, what the client still sends is read and
//! discarded, then the connection closes. Without it the kernel resets a connection closed with
//! unread input and drops the answer from the client's receive queue: these tests then see
//! `ECONNRESET` and no bytes. The fast path (the close fused with the last answer when the
//! request was read to its end) is checked through the workers' `lingered` counter.

mod common;

use common::{garbage, need, run, Served, TempDir};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const BACKENDS: [&str; 2] = ["uring", "epoll"];
/// Clients per case: the reset was deterministic before the fix, so a few tries suffice.
const TRIES: usize = 20;

/// How a client's connection ended after the answer.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// A FIN: `read` returned 0.
    Eof,
    /// A reset (or another error) after `bytes` arrived.
    Reset(String),
    /// Still open when the client gave up waiting.
    Open,
}

/// Everything the client received and how the connection ended.
#[derive(Debug)]
struct Reply {
    bytes: Vec<u8>,
    end: End,
}

impl Reply {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    fn status_line(&self) -> String {
        self.text().lines().next().unwrap_or("").to_string()
    }
}

fn read_all(s: &mut TcpStream, limit: Duration) -> Reply {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut bytes = Vec::new();
    let mut buf = [0u8; 16384];
    let end = loop {
        match s.read(&mut buf) {
            Ok(0) => break End::Eof,
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                break End::Open
            }
            Err(e) => break End::Reset(e.to_string()),
        }
    };
    Reply { bytes, end }
}

/// Sends `first`, then `more` (ignoring write errors: the server may have shut its side),
/// optionally shuts the write side, and reads everything.
fn exchange(addr: SocketAddr, first: &[u8], more: &[u8], shut: bool) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(first).unwrap();
    if !more.is_empty() {
        let _ = s.write_all(more);
    }
    if shut {
        s.shutdown(Shutdown::Write).unwrap();
    }
    read_all(&mut s, Duration::from_secs(10))
}

fn http_server(backend: &str, extra: &[&str]) -> Served {
    let mut args = vec!["--backend", backend, "--linger-timeout", "1s"];
    args.extend_from_slice(extra);
    Served::start("http", &args)
}

fn post(len: usize, close: bool) -> Vec<u8> {
    let mut req = format!("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n").into_bytes();
    if close {
        req.extend_from_slice(b"Connection: close\r\n");
    }
    req.extend_from_slice(b"\r\n");
    req.extend(std::iter::repeat_n(b'x', len));
    req
}

/// Each case answers with `status` every time and ends with a FIN.
fn assert_answered(addr: SocketAddr, case: &str, status: &str, send: impl Fn(SocketAddr) -> Reply) {
    for i in 0..TRIES {
        let reply = send(addr);
        assert!(
            reply.status_line().contains(status),
            "{case} #{i}: got {:?} ({:?})",
            reply.status_line(),
            reply.end
        );
        assert_eq!(reply.end, End::Eof, "{case} #{i}: {}", reply.status_line());
    }
}

fn http_matrix(backend: &str) {
    let s = http_server(backend, &[]);
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(20_000));
    assert_answered(s.addr, "20 KB URI", "414", |a| {
        exchange(a, long_uri.as_bytes(), b"", false)
    });
    assert_answered(s.addr, "100 KB POST", "413", |a| {
        exchange(a, &post(100_000, false), b"", false)
    });
    assert_answered(s.addr, "60 KB POST, Connection: close", "405", |a| {
        exchange(a, &post(60_000, true), b"", false)
    });
    // The head alone first: the 405 goes out before the body arrives, which then comes.
    assert_answered(s.addr, "body after the answer", "405", |a| {
        let req = post(60_000, true);
        let head_end = req.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let mut c = TcpStream::connect(a).unwrap();
        c.write_all(&req[..head_end]).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let _ = c.write_all(&req[head_end..]);
        read_all(&mut c, Duration::from_secs(10))
    });
    assert_answered(s.addr, "request, then half-close", "200", |a| {
        exchange(a, b"GET /index.html HTTP/1.1\r\nHost: x\r\n\r\n", b"", true)
    });
    let pipelined = b"GET /index.html HTTP/1.1\r\nHost: x\r\n\r\n".repeat(50);
    assert_answered(s.addr, "pipelined after Connection: close", "200", |a| {
        let mut c = TcpStream::connect(a).unwrap();
        c.write_all(b"GET /index.html HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let _ = c.write_all(&pipelined);
        read_all(&mut c, Duration::from_secs(10))
    });
    assert_answered(s.addr, "binary garbage", "HTTP/1.1 4", |a| {
        exchange(a, &garbage(200_000), b"", false)
    });
    assert_eq!(s.terminate().0, 0);
}

#[test]
fn http_every_hostile_client_gets_its_answer_uring() {
    http_matrix(BACKENDS[0]);
}

#[test]
fn http_every_hostile_client_gets_its_answer_epoll() {
    http_matrix(BACKENDS[1]);
}

/// A client that keeps sending after its error answer gets the answer and the end of the
/// stream (the server shut its sending side) while the server still reads: its writes keep
/// succeeding. Once it stays silent for `--linger-timeout` (1 s here) the server closes, and
/// so it does after `--linger-time` (2 s) of a client that never stops: lingering is bounded.
/// (After the server's close the client's next writes draw a reset and fail.)
#[test]
fn lingering_is_bounded_by_silence_and_by_time() {
    for backend in BACKENDS {
        let s = http_server(backend, &["--linger-time", "2s"]);
        // Sends for 300 ms, then stays silent.
        let mut c = TcpStream::connect(s.addr).unwrap();
        c.write_all(&garbage(1000)).unwrap();
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(300) {
            c.write_all(&[b'z'; 1000]).unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
        let reply = read_all(&mut c, Duration::from_secs(10));
        assert!(
            reply.status_line().starts_with("HTTP/1.1 4"),
            "{backend}: {reply:?}"
        );
        assert_eq!(reply.end, End::Eof, "{backend}");
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            writes_fail_within(&mut c, Duration::ZERO).is_none(),
            "{backend}: not lingering"
        );
        std::thread::sleep(Duration::from_millis(1300));
        assert!(
            writes_fail_within(&mut c, Duration::from_millis(500)).is_some(),
            "{backend}: still open after 1.5 s of silence with --linger-timeout 1s"
        );
        // Never stops sending: closed after --linger-time.
        let mut c = TcpStream::connect(s.addr).unwrap();
        c.write_all(&garbage(1000)).unwrap();
        let started = Instant::now();
        let failed = writes_fail_within(&mut c, Duration::from_secs(6));
        let after = failed.map(|_| started.elapsed());
        assert!(
            after.is_some_and(|t| t >= Duration::from_millis(1900)),
            "{backend}: closed after {after:?} (--linger-time 2s)"
        );
        assert_eq!(s.terminate().0, 0);
    }
}

/// Writes a little every 5 ms (at least twice) until a write fails or `limit` passes; returns
/// the error.
fn writes_fail_within(c: &mut TcpStream, limit: Duration) -> Option<std::io::Error> {
    let started = Instant::now();
    for round in 0.. {
        if let Err(e) = c.write_all(&[b'z'; 100]) {
            return Some(e);
        }
        if round >= 2 && started.elapsed() >= limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    unreachable!()
}

/// `curl --data-binary @FILE` against the static server prints the status every time (curl
/// sends the head, gets the early answer, stops sending and closes).
#[test]
fn curl_uploads_always_print_the_status() {
    if !need(&["curl"]) {
        return;
    }
    let dir = TempDir::new("upload");
    for backend in BACKENDS {
        let s = http_server(backend, &[]);
        let url = format!("http://{}/", s.addr);
        for (size, name) in [(100_000, "100k"), (1_000_000, "1m")] {
            let file = dir.0.join(name);
            std::fs::write(&file, garbage(size)).unwrap();
            let data = format!("@{}", file.display());
            for i in 0..TRIES {
                let out = run(
                    15,
                    "curl",
                    &[
                        "-s",
                        "-o",
                        "/dev/null",
                        "-w",
                        "%{http_code}",
                        "--data-binary",
                        &data,
                        &url,
                    ],
                );
                let code = String::from_utf8_lossy(&out.stdout).into_owned();
                assert!(
                    out.status.success() && code == "413",
                    "{backend} {name} #{i}: curl {} printed {code:?}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        // Expect: 100-continue: the refusal comes at once, so curl never waits out its 1 s
        // for a `100` before sending (its verbose log says "Done waiting" when it does).
        let file = dir.0.join("100k");
        let data = format!("@{}", file.display());
        let out = run(
            15,
            "curl",
            &[
                "-sv",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "-H",
                "Expect: 100-continue",
            ]
            .into_iter()
            .chain(["--data-binary", &data, &url])
            .collect::<Vec<_>>(),
        );
        let log = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "413",
            "{backend}: {log}"
        );
        assert!(
            !log.contains("Done waiting"),
            "{backend}: curl waited for a 100: {log}"
        );
        assert!(
            !log.contains("HTTP/1.1 100"),
            "{backend}: a 100 before a refusal: {log}"
        );
        assert_eq!(s.terminate().0, 0);
    }
}

/// One-shot requests read to their end keep the fast path (the close fused with the answer:
/// no lingering), and the closes that must linger do.
#[test]
fn one_shot_requests_close_with_the_answer_and_hostile_ones_linger() {
    let dir = TempDir::new("linger-stats");
    for backend in BACKENDS {
        let stats = dir.0.join(format!("{backend}.jsonl"));
        let s = http_server(
            backend,
            &[
                "--stats-interval",
                "100ms",
                "--json",
                "--stats-file",
                stats.to_str().unwrap(),
            ],
        );
        for _ in 0..200 {
            let r = exchange(
                s.addr,
                b"GET /index.html HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                b"",
                false,
            );
            assert!(
                r.status_line().contains("200") && r.end == End::Eof,
                "{r:?}"
            );
        }
        let fast = lingered_after(&stats, 200);
        assert_eq!(fast, 0, "{backend}: one-shot requests lingered");
        for _ in 0..5 {
            exchange(s.addr, &post(100_000, false), b"", false);
        }
        assert!(
            lingered_after(&stats, 205) >= 5,
            "{backend}: unread bodies did not linger"
        );
        assert_eq!(s.terminate().0, 0);
    }
}

/// The workers' summed `lingered` counter, once the stats file shows `requests` requests.
fn lingered_after(stats: &std::path::Path, requests: u64) -> u64 {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let snap = common::last_stats(stats);
        let total = |field: &str| -> u64 {
            snap["workers"]
                .as_array()
                .map_or(0, |w| w.iter().filter_map(|x| x[field].as_u64()).sum())
        };
        if total("requests") >= requests || Instant::now() > end {
            return total("lingered");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn kv_matrix(backend: &str) {
    let s = Served::start("kv", &["--backend", backend, "--linger-timeout", "1s"]);
    let check = |case: &str, first: &[u8], more: &[u8], want: &str| {
        for i in 0..TRIES {
            let r = exchange(s.addr, first, more, false);
            assert!(r.text().contains(want), "{case} #{i}: {r:?}");
            assert_eq!(r.end, End::Eof, "{case} #{i}: {}", r.text());
        }
    };
    // A 2 MiB line: past the input limit, answered, then closed.
    let mut huge = b"get ".to_vec();
    huge.extend(std::iter::repeat_n(b'k', 2 << 20));
    huge.extend_from_slice(b"\r\n");
    check("oversize line", &huge, b"get more\r\n", "SERVER_ERROR");
    let mut quit = b"set a 0 0 1\r\nx\r\nquit\r\n".to_vec();
    quit.extend(std::iter::repeat_n(b'q', 100_000));
    check("bytes after quit", &quit, b"", "STORED");
    // Garbage lines are answered ERROR one by one, as memcached does, and the connection
    // stays (nothing to linger for): no reset.
    let r = exchange(s.addr, &garbage(300_000), &garbage(300_000), false);
    assert!(r.text().starts_with("ERROR\r\n"), "{r:?}");
    assert!(!matches!(r.end, End::Reset(_)), "{r:?}");
    // Half-close after a request: the answer, then the FIN.
    for _ in 0..TRIES {
        let r = exchange(s.addr, b"get nothing\r\n", b"", true);
        assert_eq!((r.text().as_str(), &r.end), ("END\r\n", &End::Eof));
    }
    assert_eq!(s.terminate().0, 0);
}

#[test]
fn kv_every_hostile_client_gets_its_answer_uring() {
    kv_matrix(BACKENDS[0]);
}

#[test]
fn kv_every_hostile_client_gets_its_answer_epoll() {
    kv_matrix(BACKENDS[1]);
}
