//! The `https` example (tokio-rustls on the per-core runtimes) as a process, checked with TLS
//! clients nobody here wrote: `curl --cacert` gets the body over TLS 1.3 and 1.2 with ALPN
//! http/1.1; `openssl s_client -sess_out` then `-sess_in` from the *other* CPU resumes
//! ("Reused") — the ticket made on one worker opens on another; a client that sends garbage
//! instead of a ClientHello is closed at once and one that stalls mid-handshake is closed at
//! the handshake timeout, while curl is served meanwhile; a missing PEM file, one with no
//! certificate or key in it and a key of another certificate are refused with a message
//! naming the file; the `--runtime multithread` baseline serves the same app.
//!
//! The example is built with the cargo running this test (`cargo build --example https`, a
//! no-op after `cargo test`, which builds the examples) and run with a certificate made by
//! `openssl req`. A missing curl/openssl/taskset skips with a printed reason, except under
//! `CI=true`.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

/// The example's handshake timeout in these tests.
const HANDSHAKE_TIMEOUT_S: u64 = 2;

/// Whether `tool` can be run; false (skip) with a printed reason, a failure under `CI=true`.
fn need(tools: &[&str]) -> bool {
    for tool in tools {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{tool} is missing, and CI=true forbids skipping"
            );
            eprintln!("SKIP: {tool} is not installed");
            return false;
        }
    }
    true
}

/// The example's binary, built once per test process by the cargo that runs this test (same
/// profile).
fn example() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(build_example).clone()
}

fn build_example() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-p", "corelocal-tokio", "--example", "https"])
        .args(["--message-format", "json-render-diagnostics"]);
    // What cargo set for this test, not for a build: build scripts (ring's) rerun when these
    // change, which would rebuild them here and again in the next `cargo test`.
    for (name, _) in std::env::vars_os() {
        let n = name.to_string_lossy();
        let per_package = [
            "CARGO_PKG_",
            "CARGO_MANIFEST_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
        ];
        if per_package.iter().any(|p| n.starts_with(p))
            || ["CARGO_PRIMARY_PACKAGE", "CARGO_TARGET_TMPDIR", "OUT_DIR"].contains(&&*n)
        {
            cmd.env_remove(&name);
        }
    }
    let me = std::env::current_exe().unwrap();
    if me.components().any(|c| c.as_os_str() == "release") {
        cmd.arg("--release");
    }
    let out = cmd.stderr(Stdio::inherit()).output().unwrap();
    assert!(out.status.success(), "building the https example failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["target"]["name"] == "https" && v["target"]["kind"][0] == "example")
        .find_map(|v| v["executable"].as_str().map(PathBuf::from))
        .expect("cargo named no executable for the https example")
}

/// A fresh directory under the target's tmp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir =
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn path(&self, name: &str) -> String {
        self.0.join(name).to_str().unwrap().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// Runs `program ARGS` under `timeout`; its output. Fails when it ran past `limit_s`.
fn run(limit_s: u32, program: &str, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new("timeout")
        .args(["-k", "2", &limit_s.to_string(), program])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn timeout");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_ne!(
        out.status.code(),
        Some(124),
        "{program} {args:?} ran past {limit_s} s"
    );
    out
}

/// An ECDSA P-256 certificate for localhost/127.0.0.1 (`cert.pem`, `key.pem`) and a key of
/// another (`other.key`), made by openssl.
fn make_certs(t: &TempDir) {
    let (cert, key, other) = (t.path("cert.pem"), t.path("key.pem"), t.path("other.key"));
    #[rustfmt::skip]
    let req = [
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-days", "2", "-subj", "/CN=localhost",
        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
        "-keyout", &key, "-out", &cert,
    ];
    let out = run(20, "openssl", &req, b"");
    assert!(out.status.success(), "openssl req: {}", text(&out));
    let gen = [
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-out",
        &other,
    ];
    let out = run(20, "openssl", &gen, b"");
    assert!(out.status.success(), "openssl genpkey: {}", text(&out));
}

/// The example running: its address and everything it printed so far.
struct Served {
    child: Child,
    addr: SocketAddr,
    lines: mpsc::Receiver<String>,
}

impl Served {
    /// Starts the example on every CPU this test may use; waits for its "listening on" line.
    fn start(t: &TempDir) -> Served {
        Served::start_with(t, &[])
    }

    /// [`Served::start`] with more flags.
    fn start_with(t: &TempDir, extra: &[&str]) -> Served {
        let cpus = common::cpus();
        let cpus = cpus
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let timeout = HANDSHAKE_TIMEOUT_S.to_string();
        let mut child = Command::new(example())
            .args(["--listen", "127.0.0.1:0", "--cpus", &cpus])
            .args(["--cert", &t.path("cert.pem"), "--key", &t.path("key.pem")])
            .args(["--handshake-timeout", &timeout])
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                eprintln!("[https] {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let line = lines
            .recv_timeout(Duration::from_secs(30))
            .expect("the example printed nothing in 30 s");
        let addr = line
            .split("listening on [")
            .nth(1)
            .and_then(|s| s.split(']').next())
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .parse()
            .unwrap();
        Served { child, addr, lines }
    }

    /// SIGTERM; the exit status must be success. The final report (JSON).
    fn stop(mut self) -> serde_json::Value {
        // SAFETY: a signal to our own child, not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the example exited with {status}");
        let report = self
            .lines
            .iter()
            .find(|l| l.starts_with('{'))
            .expect("no report at exit");
        serde_json::from_str(&report).unwrap()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `curl --cacert` for `path` on the server's port as `localhost`: the body, or curl's error.
fn curl(t: &TempDir, addr: SocketAddr, path: &str, extra: &[&str]) -> String {
    let url = format!("https://localhost:{}{path}", addr.port());
    let resolve = format!("localhost:{}:127.0.0.1", addr.port());
    let ca = t.path("cert.pem");
    let mut args = vec![
        "-sS",
        "--max-time",
        "5",
        "--cacert",
        &ca,
        "--resolve",
        &resolve,
    ];
    args.extend_from_slice(extra);
    args.push(&url);
    text(&run(10, "curl", &args, b""))
}

#[test]
fn curl_gets_the_body_over_tls_13_and_12() {
    if !need(&["openssl", "curl"]) {
        return;
    }
    let t = TempDir::new("https-curl");
    make_certs(&t);
    let served = Served::start(&t);
    assert_eq!(curl(&t, served.addr, "/hello", &[]), "hello\n");
    assert_eq!(curl(&t, served.addr, "/hello", &["--tlsv1.3"]), "hello\n");
    let v12 = ["--tlsv1.2", "--tls-max", "1.2"];
    assert_eq!(curl(&t, served.addr, "/hello", &v12), "hello\n");
    let verbose = curl(&t, served.addr, "/", &["-v", "--http1.1"]);
    assert!(
        verbose.contains("ALPN: server accepted http/1.1"),
        "{verbose}"
    );
    assert!(verbose.contains("Hello from corelocal-tokio"), "{verbose}");
    // Without the CA curl refuses the certificate: the check is real.
    let url = format!("https://127.0.0.1:{}/hello", served.addr.port());
    let out = run(10, "curl", &["-sS", "--max-time", "5", &url], b"");
    assert!(!out.status.success(), "{}", text(&out));
    let report = served.stop();
    assert!(report["stats"]["total"]["requests"].as_u64().unwrap() >= 4);
}

#[test]
fn the_multithread_baseline_serves_the_same_app() {
    if !need(&["openssl", "curl"]) {
        return;
    }
    let t = TempDir::new("https-mt");
    make_certs(&t);
    let served = Served::start_with(&t, &["--runtime", "multithread", "--threads", "2"]);
    assert_eq!(curl(&t, served.addr, "/hello", &[]), "hello\n");
    let v12 = ["--tlsv1.2", "--tls-max", "1.2"];
    assert_eq!(curl(&t, served.addr, "/hello", &v12), "hello\n");
    drop(served); // no report: the baseline has no per-worker counters
}

/// `openssl s_client ARGS` pinned to `cpu` (so the kernel steers it to that CPU's worker),
/// asking `GET /cpu` with `Connection: close`: what it printed and the CPU that answered.
fn s_client(t: &TempDir, addr: SocketAddr, cpu: usize, args: &[&str]) -> (String, usize) {
    let (cpu_s, connect, ca) = (cpu.to_string(), addr.to_string(), t.path("cert.pem"));
    #[rustfmt::skip]
    let mut all = vec![
        "-c", &cpu_s, "openssl", "s_client", "-connect", &connect, "-CAfile", &ca,
        "-servername", "localhost", "-alpn", "http/1.1", "-ign_eof",
    ];
    all.extend_from_slice(args);
    let request = b"GET /cpu HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let printed = text(&run(10, "taskset", &all, request));
    assert!(printed.contains("Verify return code: 0 (ok)"), "{printed}");
    assert!(printed.contains("ALPN protocol: http/1.1"), "{printed}");
    // The body (`N\n`) is the last line that is a number.
    let served_on = printed
        .lines()
        .filter_map(|l| l.trim().parse::<usize>().ok())
        .next_back()
        .unwrap_or_else(|| panic!("{args:?}: no answer in {printed}"));
    (printed, served_on)
}

/// A new session from CPU `a`'s client saved, then resumed from CPU `b`'s; every resumption
/// must be "Reused". The CPUs that served the two connections.
fn new_then_resumed(
    t: &TempDir,
    addr: SocketAddr,
    (a, b): (usize, usize),
    args: &[&str],
) -> (usize, usize) {
    let sess = t.path("s.sess");
    let (first, on_a) = s_client(t, addr, a, &[args, &["-sess_out", &sess]].concat());
    assert!(first.contains("New, TLSv1"), "{args:?}: {first}");
    let (again, on_b) = s_client(t, addr, b, &[args, &["-sess_in", &sess]].concat());
    assert!(
        again.contains("Reused, TLSv1"),
        "{args:?}: served on {on_a} then {on_b}: {again}"
    );
    (on_a, on_b)
}

/// Tries of a resumption pair until the wanted placement is seen: the kernel steers a client
/// pinned to CPU c to c's worker, but on a loaded machine the balancer may send it to
/// another while c's worker is starved.
const TRIES: usize = 10;

#[test]
fn openssl_resumes_a_session_on_another_cores_worker() {
    if !need(&["openssl", "taskset"]) {
        return;
    }
    let cpus = common::cpus();
    let (a, b) = (cpus[0], *cpus.last().unwrap());
    let t = TempDir::new("https-resume");
    make_certs(&t);
    let served = Served::start(&t);
    // By ticket, TLS 1.3 and 1.2: made on one worker, opened on another — a returning client
    // that the kernel steers to another core still resumes (one CPU: on the same worker).
    for version in ["-tls1_3", "-tls1_2"] {
        let crossed = (0..TRIES)
            .map(|_| new_then_resumed(&t, served.addr, (a, b), &[version]))
            .any(|(on_a, on_b)| on_a != on_b || a == b);
        assert!(
            crossed,
            "{version}: never served on two workers in {TRIES} tries"
        );
    }
    // By TLS 1.2 session ID (tickets refused): the cache is per worker, so only the same
    // worker resumes it.
    let sess = t.path("id.sess");
    let (save, load) = (
        ["-tls1_2", "-no_ticket", "-sess_out", &sess],
        ["-tls1_2", "-no_ticket", "-sess_in", &sess],
    );
    let same = (0..TRIES).any(|_| {
        let (first, on) = s_client(&t, served.addr, a, &save);
        assert!(first.contains("New, TLSv1.2"), "{first}");
        let (again, on_again) = s_client(&t, served.addr, a, &load);
        // Another worker does not know the ID: a full handshake, which is allowed.
        on == on_again && {
            assert!(again.contains("Reused, TLSv1.2"), "{again}");
            true
        }
    });
    assert!(
        same,
        "session ID: never served twice on one worker in {TRIES} tries"
    );
    served.stop();
}

/// Reads until the server closes (an end of file or a reset); how long that took, or why
/// the read stopped otherwise (still open at `limit`: a timeout).
fn closed_within(mut s: TcpStream, limit: Duration) -> Result<Duration, std::io::Error> {
    let start = Instant::now();
    s.set_read_timeout(Some(limit.max(Duration::from_millis(1))))?;
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(start.elapsed()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(start.elapsed()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[test]
fn garbage_and_stalled_handshakes_are_closed_while_others_are_served() {
    if !need(&["openssl", "curl"]) {
        return;
    }
    let t = TempDir::new("https-hostile");
    make_certs(&t);
    let served = Served::start(&t);
    let timeout = Duration::from_secs(HANDSHAKE_TIMEOUT_S);
    // Garbage: plain HTTP on the TLS port. rustls answers with an alert and the close.
    let mut garbage = TcpStream::connect(served.addr).unwrap();
    garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let closed = closed_within(garbage, timeout * 3).expect("garbage: not closed");
    assert!(closed < timeout, "garbage: closed only after {closed:?}");
    // Stalled: the first bytes of a handshake record (a ClientHello of 512 bytes announced),
    // then silence; one per worker CPU.
    let addr = served.addr;
    let stalled: Vec<TcpStream> = common::cpus()
        .into_iter()
        .map(|cpu| {
            common::on_cpu(cpu, move || {
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00])
                    .unwrap();
                s
            })
        })
        .collect();
    let start = Instant::now();
    // Meanwhile, a well-behaved client is served at once, several times.
    for _ in 0..3 {
        assert_eq!(curl(&t, served.addr, "/hello", &[]), "hello\n");
    }
    assert!(
        start.elapsed() < timeout,
        "curl was held up behind the stall"
    );
    for s in stalled {
        let left = (timeout * 3).saturating_sub(start.elapsed());
        let closed = closed_within(s, left).map(|_| start.elapsed());
        let closed = closed.expect("a stalled handshake: not closed within 3× the timeout");
        assert!(closed >= timeout - Duration::from_millis(100), "{closed:?}");
    }
    let report = served.stop();
    let errors = &report["stats"]["total"]["errors"];
    assert!(errors["bad_request"].as_u64().unwrap() >= 1, "{errors}");
    assert_eq!(
        errors["idle_timeout"].as_u64().unwrap(),
        common::cpus().len() as u64,
        "{errors}"
    );
}

#[test]
fn missing_empty_or_mismatched_pem_files_are_refused_by_name() {
    if !need(&["openssl"]) {
        return;
    }
    let t = TempDir::new("https-bad-pem");
    make_certs(&t);
    let (cert, key, other) = (t.path("cert.pem"), t.path("key.pem"), t.path("other.key"));
    let missing = t.path("missing.pem");
    let exe = example();
    let refused = |args: &[&str], expected: &str| {
        let out = Command::new(&exe)
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("CORELOCAL_TLS_CERT")
            .env_remove("CORELOCAL_TLS_KEY")
            .output()
            .unwrap();
        let said = text(&out);
        assert!(!out.status.success(), "{args:?} was accepted: {said}");
        assert!(
            said.contains(expected),
            "{args:?}: {said:?} lacks {expected:?}"
        );
    };
    refused(&[], "--cert and --key");
    refused(
        &["--cert", &missing, "--key", &key],
        &format!("--cert {missing}: No such file"),
    );
    refused(
        &["--cert", &cert, "--key", &missing],
        &format!("--key {missing}: No such file"),
    );
    refused(&["--cert", &key, "--key", &key], "no CERTIFICATE");
    refused(&["--cert", &cert, "--key", &cert], "no private key");
    refused(
        &["--cert", &cert, "--key", &other],
        "the private key does not belong to the certificate",
    );
}
