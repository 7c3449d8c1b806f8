//! `corelocal serve kv --tls-cert` through the real binary with TLS clients nobody here wrote:
//! `openssl s_client` (TLS 1.3 and 1.2, the certificate checked against the test CA) speaking
//! memcached's text protocol, and pymemcache with an `ssl.SSLContext` (hostname and chain
//! checked); a plain port beside the TLS one. Hostile clients on the TLS port (garbage instead
//! of a ClientHello, a ClientHello cut off by a close, a silent client, memcached text sent in
//! the clear) are closed, and a TLS connection already open goes on unharmed. Also: a long
//! pipeline, `watch` streaming, the idle timeout's close_notify, client certificates and
//! `corelocal memcached -Z`. The certificates
//! are the TLS tests' own (crates/corelocal-apps/tests/tls); the client-certificate test makes
//! its own CA and client certificate with openssl. A missing client skips with a printed
//! reason, except under `CI=true` (.ci/run installs openssl and pymemcache).

mod common;

use common::{cert_path, need, python_has, require, run_ok, Served, TempDir};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `serve kv` with a plain --listen port and a --tls-listen one (ECDSA certificate); the
/// handshake must complete within 2 s. Returns the server and its TLS address.
fn serve() -> (Served, SocketAddr) {
    let (cert, key) = (cert_path("ecdsa.pem"), cert_path("ecdsa.key"));
    let args = [
        "--tls-listen",
        "127.0.0.1:0",
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--tls-handshake-timeout",
        "2s",
    ];
    let served = Served::start("kv", &args);
    let line = served
        .log
        .lines()
        .find(|l| l.contains("listening on"))
        .unwrap();
    let tls: SocketAddr = line
        .split("listening on ")
        .nth(1)
        .and_then(|rest| rest.split(" |").next())
        .and_then(|addrs| addrs.split(", ").nth(1))
        .unwrap_or_else(|| panic!("no TLS address in {line:?}"))
        .parse()
        .unwrap();
    assert!(served.log.contains("tls: rustls"), "{}", served.log);
    (served, tls)
}

/// `openssl s_client` on `tls`, its stdin piped: it prints what the server sends.
fn s_client(tls: SocketAddr, version: &str) -> Child {
    s_client_with(tls, &[version])
}

/// As [`s_client`], with more s_client arguments.
fn s_client_with(tls: SocketAddr, args: &[&str]) -> Child {
    let connect = tls.to_string();
    let ca = cert_path("ca.pem");
    Command::new("timeout")
        .args(["-k", "2", "15", "openssl", "s_client", "-connect", &connect])
        .args(["-CAfile", &ca, "-servername", "localhost", "-ign_eof"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn openssl")
}

/// Sends `requests` (ending with `quit`, so the server closes) and returns all s_client said.
fn finish(mut child: Child, requests: &[u8]) -> String {
    child.stdin.as_mut().unwrap().write_all(requests).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_ne!(
        out.status.code(),
        Some(124),
        "openssl s_client ran past 15 s"
    );
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

/// Plain memcached text on the plain port: the reply up to `END\r\n` (5 s at most).
fn plain_get(addr: SocketAddr, key: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(format!("get {key}\r\n").as_bytes()).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(b"END\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[test]
fn openssl_s_client_sets_and_gets_over_tls_13_and_12_with_a_plain_port_beside() {
    if !need(&["openssl"]) {
        return;
    }
    let (served, tls) = serve();
    for (version, key) in [("-tls1_3", "k13"), ("-tls1_2", "k12")] {
        let requests = format!("set {key} 7 0 5\r\nhello\r\nget {key}\r\nquit\r\n");
        let out = finish(s_client(tls, version), requests.as_bytes());
        assert!(
            out.contains("Verify return code: 0 (ok)"),
            "{version}: {out}"
        );
        assert!(out.contains("STORED\r\n"), "{version}: {out}");
        let value = format!("VALUE {key} 7 5\r\nhello\r\nEND\r\n");
        assert!(out.contains(&value), "{version}: {out}");
        // What went in over TLS is the same cache the plain port reads.
        assert_eq!(plain_get(served.addr, key), value);
    }
    let (code, _) = served.terminate();
    assert_eq!(code, 0);
}

/// pymemcache over TLS: the server's certificate checked against the test CA and for
/// 127.0.0.1 (its IP SAN); values larger than a TLS record, multiget, counters, stats.
const PYMEMCACHE_TLS: &str = r#"
import ssl, sys
from pymemcache.client.base import Client
ctx = ssl.create_default_context(cafile=sys.argv[3])
c = Client((sys.argv[1], int(sys.argv[2])), connect_timeout=3, timeout=5, tls_context=ctx,
           default_noreply=False)
assert c.set("a", b"1") is True
assert c.get("a") == b"1"
big = bytes(range(256)) * 1000
assert c.set("big", big) is True
assert c.get("big") == big
assert c.get_many(["a", "big", "nope"]) == {"a": b"1", "big": big}
assert c.incr("a", 41) == 42
assert c.delete("a") is True
assert c.get("a") is None
assert b"curr_items" in c.stats()
settings = c.stats("settings")
assert settings[b"ssl_enabled"] == b"yes", settings
c.quit()
print("ok")
"#;

#[test]
fn pymemcache_over_tls_checks_the_certificate_and_speaks_the_protocol() {
    if !require("python3 module pymemcache", python_has("pymemcache")) {
        return;
    }
    let (served, tls) = serve();
    let ca = cert_path("ca.pem");
    let host = tls.ip().to_string();
    let port = tls.port().to_string();
    let out = run_ok(30, "python3", &["-c", PYMEMCACHE_TLS, &host, &port, &ca]);
    assert_eq!(out.trim(), "ok");
    let (code, _) = served.terminate();
    assert_eq!(code, 0);
}

/// Writes `bytes` to the TLS port (then closes its write side when `half_close`) and reads
/// until the server closes: what came back, or a panic when the server keeps it open 5 s.
fn hostile(tls: SocketAddr, bytes: &[u8], half_close: bool) -> Vec<u8> {
    let mut s = TcpStream::connect(tls).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(bytes).unwrap();
    if half_close {
        s.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            // A reset is a close too.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("{bytes:?}: still open after 5 s ({e}); got {got:?}"),
        }
    }
}

/// A TLS alert record (content type 21), or nothing: what a refused client may get.
fn alert_or_nothing(got: &[u8]) -> bool {
    got.is_empty() || (got[0] == 21 && got.len() <= 64)
}

#[test]
fn hostile_clients_on_the_tls_port_are_closed_and_others_go_on() {
    if !need(&["openssl"]) {
        return;
    }
    let (served, tls) = serve();
    // A TLS connection made before the hostile ones, used after them.
    let mut before = s_client(tls, "-tls1_3");
    let stdin = before.stdin.as_mut().unwrap();
    stdin.write_all(b"set before 0 0 2\r\nok\r\n").unwrap();
    stdin.flush().unwrap();

    let garbage: Vec<u8> = (0..600u32).map(|i| (i * 7 + 3) as u8).collect();
    let got = hostile(tls, &garbage, false);
    assert!(alert_or_nothing(&got), "garbage: {got:?}");
    // memcached's text protocol in the clear: no memcached reply, an alert at most.
    let got = hostile(tls, b"set x 0 0 1\r\nx\r\nget x\r\n", false);
    assert!(alert_or_nothing(&got), "plain text: {got:?}");
    assert!(!String::from_utf8_lossy(&got).contains("STORED"));
    // A ClientHello's record header promising 512 bytes, 40 of them sent, then a close.
    let mut cut = vec![22, 3, 1, 2, 0, 1, 0, 1, 252, 3, 3];
    cut.resize(45, 0x42);
    assert!(alert_or_nothing(&hostile(tls, &cut, true)));
    // The same without the close: the handshake timeout (2 s) closes it.
    let started = Instant::now();
    assert!(alert_or_nothing(&hostile(tls, &cut, false)));
    assert!(started.elapsed() < Duration::from_secs(5));

    let out = finish(before, b"get before\r\nquit\r\n");
    assert!(out.contains("STORED\r\n"), "{out}");
    assert!(out.contains("VALUE before 0 2\r\nok\r\nEND\r\n"), "{out}");
    let after = finish(s_client(tls, "-tls1_2"), b"get before\r\nquit\r\n");
    assert!(
        after.contains("VALUE before 0 2\r\nok\r\nEND\r\n"),
        "{after}"
    );
    assert!(plain_get(served.addr, "before").contains("VALUE before"));
    let (code, _) = served.terminate();
    assert_eq!(code, 0);
}

/// `corelocal memcached -Z -o ssl_chain_cert=,ssl_key=` with a `notls:` listener: TLS on one
/// port, plain on the other, one cache; `-Z` without a chain refuses as memcached does.
#[test]
fn memcached_command_line_z_serves_tls_beside_a_notls_listener() {
    if !need(&["openssl"]) {
        return;
    }
    let refused = Command::new(common::BIN)
        .args(["memcached", "-Z", "-U", "0"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(64));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("certificate chain: (null)"), "{said}");

    let plain = free_port();
    let secure = free_port();
    let listen = format!("notls:127.0.0.1:{plain},127.0.0.1:{secure}");
    let served = memcached_z(&listen, "");
    let tls: SocketAddr = format!("127.0.0.1:{secure}").parse().unwrap();
    let out = finish(
        s_client(tls, "-tls1_3"),
        b"set z 0 0 3\r\nabc\r\nstats settings\r\nstats\r\nquit\r\n",
    );
    assert!(out.contains("STORED\r\n"), "{out}");
    assert!(out.contains("STAT ssl_enabled yes\r\n"), "{out}");
    assert!(out.contains("STAT ssl_session_cache no\r\n"), "{out}");
    assert!(out.contains("STAT ssl_kernel_tls no\r\n"), "{out}");
    // As memcached: new sessions are counted only with ssl_session_cache.
    assert!(out.contains("STAT ssl_handshake_errors 0\r\n"), "{out}");
    assert!(!out.contains("ssl_new_sessions"), "{out}");
    let plain: SocketAddr = format!("127.0.0.1:{plain}").parse().unwrap();
    assert!(plain_get(plain, "z").contains("VALUE z 0 3\r\nabc\r\n"));
    let (code, _) = served.terminate();
    assert_eq!(code, 0);
}

/// memcached's `ssl_new_sessions` with `-o ssl_session_cache`: a full handshake counts, a
/// resumed one (openssl s_client -sess_in, TLS 1.2 as memcached's own test) does not.
#[test]
fn memcached_ssl_session_cache_counts_new_sessions_not_resumptions() {
    if !need(&["openssl"]) {
        return;
    }
    let secure = free_port();
    let listen = format!("127.0.0.1:{secure}");
    let served = memcached_z(&listen, ",ssl_session_cache");
    let tls: SocketAddr = listen.parse().unwrap();
    let session =
        std::env::temp_dir().join(format!("corelocal-sess-{}-{secure}", std::process::id()));
    let session = session.to_str().unwrap();
    let first = finish(
        s_client_with(tls, &["-tls1_2", "-sess_out", session]),
        b"stats\r\nquit\r\n",
    );
    assert!(first.contains("STAT ssl_new_sessions 1\r\n"), "{first}");
    let second = finish(
        s_client_with(tls, &["-tls1_2", "-sess_in", session]),
        b"stats\r\nstats settings\r\nquit\r\n",
    );
    let _ = std::fs::remove_file(session);
    assert!(second.contains("Reused, TLSv1.2"), "{second}");
    assert!(second.contains("STAT ssl_new_sessions 1\r\n"), "{second}");
    assert!(
        second.contains("STAT ssl_session_cache yes\r\n"),
        "{second}"
    );
    let (code, _) = served.terminate();
    assert_eq!(code, 0);
}

/// memcached's `ssl_ciphers` (an OpenSSL cipher list) chooses the TLS 1.2 suites: the one it
/// names is negotiated, a client offering only another is refused, TLS 1.3 is not affected.
#[test]
fn memcached_ssl_ciphers_chooses_the_tls12_suites() {
    if !need(&["openssl"]) {
        return;
    }
    let secure = free_port();
    let listen = format!("127.0.0.1:{secure}");
    let served = memcached_z(
        &listen,
        ",ssl_ciphers=ECDHE-ECDSA-CHACHA20-POLY1305:!AESGCM",
    );
    let tls: SocketAddr = listen.parse().unwrap();
    let chosen = finish(s_client(tls, "-tls1_2"), b"stats settings\r\nquit\r\n");
    assert!(
        chosen.contains("Cipher is ECDHE-ECDSA-CHACHA20-POLY1305"),
        "{chosen}"
    );
    assert!(
        chosen.contains("STAT ssl_ciphers ECDHE-ECDSA-CHACHA20-POLY1305:!AESGCM\r\n"),
        "{chosen}"
    );
    let other = finish(
        s_client_with(
            tls,
            &["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"],
        ),
        b"version\r\nquit\r\n",
    );
    assert!(!other.contains("VERSION"), "{other}");
    assert!(other.contains("handshake failure"), "{other}");
    let tls13 = finish(s_client(tls, "-tls1_3"), b"version\r\nquit\r\n");
    assert!(tls13.contains("VERSION "), "{tls13}");
    let (code, _) = served.terminate();
    assert_eq!(code, 0);
}

/// `corelocal memcached -Z -l LISTEN -o ssl_chain_cert=…,ssl_key=…` (the ECDSA chain) with
/// `more` appended to the `-o` list (`,ssl_session_cache`, or nothing); no UDP.
fn memcached_z(listen: &str, more: &str) -> Served {
    let files = format!(
        "ssl_chain_cert={},ssl_key={}{more}",
        cert_path("ecdsa.pem"),
        cert_path("ecdsa.key")
    );
    let mut cmd = Command::new(common::BIN);
    cmd.args(["memcached", "-U", "0", "-Z", "-l", listen, "-o", &files]);
    cmd.stdout(Stdio::null());
    Served::spawn(cmd, false)
}

/// A port free now (bound and released), for command lines that need a fixed one.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A CA and a client certificate it signed (EC P-256, two days), made with openssl in `dir`:
/// the CA's PEM, then the client's certificate and key.
fn client_certs(dir: &Path) -> (String, String, String) {
    let at = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let (ca, ca_key) = (at("client-ca.pem"), at("client-ca.key"));
    let (cert, key, csr, ext) = (
        at("client.pem"),
        at("client.key"),
        at("client.csr"),
        at("ext"),
    );
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let mut args = vec![
        "req", "-x509", "-keyout", &ca_key, "-out", &ca, "-days", "2",
    ];
    args.extend(ec);
    args.extend(["-subj", "/CN=corelocal test client CA"]);
    args.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
    args.extend(["-addext", "keyUsage=critical,keyCertSign"]);
    run_ok(20, "openssl", &args);
    let mut args = vec!["req", "-keyout", &key, "-out", &csr, "-subj", "/CN=client"];
    args.extend(ec);
    run_ok(20, "openssl", &args);
    std::fs::write(&ext, "extendedKeyUsage=clientAuth\n").unwrap();
    let args = [
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &ca,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-out",
        &cert,
        "-days",
        "2",
        "-extfile",
        &ext,
    ];
    run_ok(20, "openssl", &args);
    (ca, cert, key)
}

/// `--tls-client-ca`: a client with a certificate the CA signed is served; one without, or
/// with a certificate another CA signed, gets no memcached answer.
#[test]
fn client_certificates_are_required_and_checked() {
    if !need(&["openssl"]) {
        return;
    }
    let t = TempDir::new("kv-tls-client");
    let (client_ca, cert, key) = client_certs(&t.0);
    let (server_cert, server_key) = (cert_path("ecdsa.pem"), cert_path("ecdsa.key"));
    let args = [
        "--tls-cert",
        &server_cert,
        "--tls-key",
        &server_key,
        "--tls-client-ca",
        &client_ca,
    ];
    let served = Served::start("kv", &args);
    let tls = served.addr;
    let request = b"set c 0 0 1\r\nc\r\nquit\r\n";
    for version in ["-tls1_3", "-tls1_2"] {
        let with = finish(
            s_client_with(tls, &[version, "-cert", &cert, "-key", &key]),
            request,
        );
        assert!(
            with.contains("STORED\r\n"),
            "{version} with a certificate: {with}"
        );
        let without = finish(s_client(tls, version), request);
        assert!(!without.contains("STORED"), "{version} without: {without}");
        // The server's own certificate, signed by another CA than the client CA.
        let other = finish(
            s_client_with(tls, &[version, "-cert", &server_cert, "-key", &server_key]),
            request,
        );
        assert!(!other.contains("STORED"), "{version} other CA: {other}");
    }
    let (code, _) = served.terminate();
    assert_eq!(code, 0);
}

/// A long pipeline over TLS (Python's ssl module): 30,000 noreply sets in one write, far more
/// than the decrypted-input bound and kv's requests per turn (it yields every 20), then
/// `version` and a multiget; all answered, nothing closed (memcached's t/lru-crawler.t sends
/// 70,000 so).
const PIPELINE: &str = r#"
import socket, ssl, sys
ctx = ssl.create_default_context(cafile=sys.argv[3])
raw = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20)
s = ctx.wrap_socket(raw, server_hostname=sys.argv[1])
s.sendall(b"".join(b"set p%d 0 0 1 noreply\r\nz\r\n" % i for i in range(30000)) +
          b"version\r\nget p0 p29999\r\n")
got = b""
while not got.endswith(b"END\r\n"):
    chunk = s.recv(65536)
    assert chunk, got
    got += chunk
assert got.startswith(b"VERSION "), got[:100]
assert got.endswith(b"VALUE p0 0 1\r\nz\r\nVALUE p29999 0 1\r\nz\r\nEND\r\n"), got
print("ok")
"#;

#[test]
fn a_long_pipeline_over_tls_is_answered_whole() {
    if !need(&["python3"]) {
        return;
    }
    let (served, tls) = serve();
    let ca = cert_path("ca.pem");
    let (host, port) = (tls.ip().to_string(), tls.port().to_string());
    let out = run_ok(60, "python3", &["-c", PIPELINE, &host, &port, &ca]);
    assert_eq!(out.trim(), "ok");
    let (code, _) = served.terminate();
    assert_eq!(code, 0);
}

/// The idle timeout closes a TLS connection with close_notify, as memcached does (Python's ssl
/// with ragged EOFs not suppressed: a bare close would raise), and counts it in idle_kicks.
const IDLE: &str = r#"
import socket, ssl, sys, time
ctx = ssl.create_default_context(cafile=sys.argv[3])
def connect():
    raw = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
    return ctx.wrap_socket(raw, server_hostname=sys.argv[1], suppress_ragged_eofs=False)
s = connect()
s.sendall(b"version\r\n")
assert s.recv(100).startswith(b"VERSION ")
time.sleep(3)
assert s.recv(100) == b"", "close_notify, then the end"
s = connect()
s.sendall(b"stats\r\n")
got = b""
while not got.endswith(b"END\r\n"):
    got += s.recv(65536)
assert b"STAT idle_kicks 1\r\n" in got, got
print("ok")
"#;

#[test]
fn the_idle_timeout_closes_with_close_notify() {
    if !need(&["python3"]) {
        return;
    }
    let (cert, key) = (cert_path("ecdsa.pem"), cert_path("ecdsa.key"));
    let args = [
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--idle-timeout",
        "1s",
    ];
    let served = Served::start("kv", &args);
    let ca = cert_path("ca.pem");
    let (host, port) = (served.addr.ip().to_string(), served.addr.port().to_string());
    let out = run_ok(30, "python3", &["-c", IDLE, &host, &port, &ca]);
    assert_eq!(out.trim(), "ok");
    let (code, _) = served.terminate();
    assert_eq!(code, 0);
}

/// `watch` over TLS: its `OK` and log lines (output no request asked for, the runtime's
/// notify path) come encrypted to an openssl s_client watcher while a plain client sets.
#[test]
fn watch_streams_over_tls() {
    if !need(&["openssl"]) {
        return;
    }
    let (served, tls) = serve();
    let mut watcher = s_client(tls, "-tls1_3");
    let stdin = watcher.stdin.as_mut().unwrap();
    stdin.write_all(b"watch mutations\r\n").unwrap();
    stdin.flush().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let mut plain = TcpStream::connect(served.addr).unwrap();
    plain.write_all(b"set watched 0 0 2\r\nhi\r\n").unwrap();
    let mut stored = [0u8; 8];
    plain.read_exact(&mut stored).unwrap();
    assert_eq!(&stored, b"STORED\r\n");
    std::thread::sleep(Duration::from_millis(1000));
    // A watcher reads no more commands: the server's stop ends s_client.
    let (code, _) = served.terminate();
    assert_eq!(code, 0);
    let out = watcher.wait_with_output().unwrap();
    assert_ne!(out.status.code(), Some(124), "s_client outlived the server");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("OK\r\n"), "{said}");
    assert!(
        said.contains("type=item_store key=watched status=stored cmd=set"),
        "{said}"
    );
}
