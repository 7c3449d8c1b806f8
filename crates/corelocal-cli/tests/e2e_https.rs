//! `corelocal serve http --tls-cert` through the real binary with TLS clients nobody here
//! wrote: curl (TLS 1.3 and 1.2, certificate checked against the test CA, SNI) and `openssl
//! s_client` (ALPN, ECDSA and RSA certificates, resumption by ticket and by session ID), with
//! a plain port beside the TLS one. A missing client skips with a printed reason, except
//! under `CI=true` (.ci/run installs curl and openssl).

mod common;

use common::{cert_path, need, run, Served, TempDir};
use std::net::SocketAddr;

const BODY: &str = "hello over https";

/// The server on one CPU (one worker: session IDs resume on it), plain and TLS ports.
fn serve(t: &TempDir) -> (Served, SocketAddr) {
    std::fs::write(t.0.join("a.txt"), BODY).unwrap();
    let root = t.0.to_str().unwrap().to_string();
    let cpu = common::load::cpus();
    let cpu = cpu.split([',', '-']).next().unwrap().to_string();
    let (ec, ec_key) = (cert_path("ecdsa.pem"), cert_path("ecdsa.key"));
    let (rsa, rsa_key) = (cert_path("rsa.pem"), cert_path("rsa.key"));
    let (other, other_key) = (cert_path("other.pem"), cert_path("other.key"));
    let args = [
        "--root",
        &root,
        "--cpus",
        &cpu,
        "--tls-listen",
        "127.0.0.1:0",
        "--tls-cert",
        &ec,
        "--tls-key",
        &ec_key,
        "--tls-cert",
        &rsa,
        "--tls-key",
        &rsa_key,
        "--tls-cert",
        &other,
        "--tls-key",
        &other_key,
    ];
    let served = Served::start("http", &args);
    let line = served
        .log
        .lines()
        .find(|l| l.contains("listening on"))
        .unwrap();
    let tls: SocketAddr = line
        .split("listening on ")
        .nth(1)
        .unwrap()
        .split(" |")
        .next()
        .unwrap()
        .split(", ")
        .nth(1)
        .unwrap_or_else(|| panic!("no TLS address in {line:?}"))
        .parse()
        .unwrap();
    assert!(served.log.contains("tls: rustls"), "{}", served.log);
    (served, tls)
}

fn text(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

/// `curl` over HTTPS for `name` (resolved to the server): the body, or what curl said.
fn curl(tls: SocketAddr, name: &str, extra: &[&str]) -> String {
    let url = format!("https://{name}:{}/a.txt", tls.port());
    let resolve = format!("{name}:{}:127.0.0.1", tls.port());
    let ca = cert_path("ca.pem");
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
    text(&run(10, "curl", &args))
}

#[test]
fn curl_over_tls_13_and_12_with_sni_and_a_plain_port_beside() {
    if !need(&["curl"]) {
        return;
    }
    let t = TempDir::new("https");
    let (served, tls) = serve(&t);
    assert_eq!(curl(tls, "localhost", &[]), BODY);
    assert_eq!(
        curl(tls, "localhost", &["--tlsv1.2", "--tls-max", "1.2"]),
        BODY
    );
    assert_eq!(curl(tls, "localhost", &["--tlsv1.3"]), BODY);
    // SNI: the CA-checked certificate must name other.test.
    assert_eq!(curl(tls, "other.test", &[]), BODY);
    let plain = format!("http://{}/a.txt", served.addr);
    assert_eq!(
        text(&run(10, "curl", &["-sS", "--max-time", "5", &plain])),
        BODY
    );
    // Plain HTTP to the TLS port is refused, and the server goes on.
    let wrong = format!("http://{tls}/a.txt");
    let out = run(10, "curl", &["-sS", "--max-time", "5", &wrong]);
    assert!(!out.status.success(), "{}", text(&out));
    assert_eq!(curl(tls, "localhost", &[]), BODY);
    let (code, _) = served.terminate();
    assert_eq!(code, 0);
}

/// `openssl s_client ARGS` against `tls`: it sends a request that asks the server to close
/// after answering and reads until that close (so TLS 1.3 tickets, sent after the handshake,
/// arrive); what it printed.
fn s_client(tls: SocketAddr, args: &[&str]) -> String {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let connect = tls.to_string();
    let ca = cert_path("ca.pem");
    let mut child = Command::new("timeout")
        .args([
            "-k", "2", "10", "openssl", "s_client", "-connect", &connect, "-CAfile", &ca,
        ])
        .args(["-servername", "localhost", "-ign_eof"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn openssl");
    let request = b"GET /a.txt HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    child.stdin.take().unwrap().write_all(request).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_ne!(
        out.status.code(),
        Some(124),
        "openssl s_client {args:?} ran past 10 s"
    );
    let printed = text(&out);
    assert!(printed.contains(BODY), "{args:?}: no answer in {printed}");
    printed
}

#[test]
fn openssl_alpn_key_types_and_resumption() {
    if !need(&["openssl"]) {
        return;
    }
    let t = TempDir::new("https-openssl");
    let (served, tls) = serve(&t);
    let out = s_client(tls, &["-alpn", "http/1.1", "-tls1_3"]);
    assert!(out.contains("ALPN protocol: http/1.1"), "{out}");
    assert!(out.contains("Verify return code: 0 (ok)"), "{out}");
    // A client that signs only RSA gets the RSA certificate for the same name.
    for version in ["-tls1_2", "-tls1_3"] {
        let out = s_client(tls, &[version, "-sigalgs", "RSA-PSS+SHA256:RSA+SHA256"]);
        assert!(
            out.contains("Verify return code: 0 (ok)"),
            "{version}: {out}"
        );
        assert!(out.contains("Peer signature type: RSA"), "{version}: {out}");
    }
    // Resumption: TLS 1.2 by session ID (tickets refused by the client) and by ticket,
    // TLS 1.3 by ticket.
    for (what, args) in [
        ("1.2 session id", &["-tls1_2", "-no_ticket"][..]),
        ("1.2 ticket", &["-tls1_2"][..]),
        ("1.3 ticket", &["-tls1_3"][..]),
    ] {
        let sess = t.0.join(format!("{}.sess", what.replace(' ', "-")));
        let sess = sess.to_str().unwrap();
        let first = s_client(tls, &[args, &["-sess_out", sess]].concat());
        assert!(first.contains("New, TLSv1"), "{what}: {first}");
        let again = s_client(tls, &[args, &["-sess_in", sess]].concat());
        assert!(again.contains("Reused, TLSv1"), "{what}: {again}");
    }
    let (code, _) = served.terminate();
    assert_eq!(code, 0);
}

#[test]
fn sighup_reloads_the_certificate_files() {
    if !need(&["openssl"]) {
        return;
    }
    let t = TempDir::new("https-sighup");
    std::fs::write(t.0.join("a.txt"), BODY).unwrap();
    let (chain, key) = (t.0.join("chain.pem"), t.0.join("key.pem"));
    let install = |name: &str| {
        std::fs::copy(cert_path(&format!("{name}.pem")), &chain).unwrap();
        std::fs::copy(cert_path(&format!("{name}.key")), &key).unwrap();
    };
    install("ecdsa");
    let root = t.0.to_str().unwrap().to_string();
    let (c, k) = (chain.to_str().unwrap(), key.to_str().unwrap());
    let args = ["--root", &root, "--tls-cert", c, "--tls-key", k];
    let mut served = Served::start("http", &args);
    let tls = served.addr;
    assert!(s_client(tls, &[]).contains("Peer signature type: ECDSA"));
    install("rsa");
    // SAFETY: a signal to our own child, not yet reaped.
    unsafe { libc::kill(served.pid() as i32, libc::SIGHUP) };
    served.wait_line("certificates reloaded", std::time::Duration::from_secs(10));
    let out = s_client(tls, &[]);
    assert!(out.contains("Peer signature type: RSA"), "{out}");
    let (code, _) = served.terminate();
    assert_eq!(code, 0);
}

/// A keep-alive request over TLS 1.3 in Python (OpenSSL): answers one GET per line on stdin,
/// printing each body; the certificate is checked against the test CA.
const KEEP_ALIVE_CLIENT: &str = r#"
import socket, ssl, sys
ctx = ssl.create_default_context(cafile=sys.argv[2])
s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=20),
                    server_hostname="localhost")
def get():
    s.sendall(b"GET /a.txt HTTP/1.1\r\nHost: localhost\r\n\r\n")
    buf = b""
    while b"\r\n\r\n" not in buf:
        got = s.recv(4096)
        if not got:
            sys.exit("EOF before the answer")
        buf += got
    head, body = buf.split(b"\r\n\r\n", 1)
    n = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0].split(b":")[1])
    while len(body) < n:
        body += s.recv(4096)
    return body.decode()
for line in sys.stdin:
    print(get(), s.version(), flush=True)
"#;

/// With both directions of its records in the kernel (kTLS TX and RX: the start line says
/// so), a TLS connection moves at an upgrade as a plain one does: a keep-alive client's second
/// request, after the old server handed over and exited, is answered by the new one on the
/// same TLS session. Where the kernel has no `tls` module (this VM) it says so and skips: the
/// many-core lab runs it on Debian's kernel (bench/lab, check `ktls-tests`, which sets
/// `CORELOCAL_EXPECT_KTLS` so that it cannot skip there).
#[test]
fn a_tls_connection_with_its_records_in_the_kernel_moves_at_an_upgrade() {
    if !need(&["python3"]) {
        return;
    }
    let t = TempDir::new("https-move");
    std::fs::write(t.0.join("a.txt"), BODY).unwrap();
    let root = t.0.to_str().unwrap().to_string();
    let (cert, key) = (cert_path("ecdsa.pem"), cert_path("ecdsa.key"));
    let sock = |n: u32| {
        t.0.join(format!("up-{n}.sock"))
            .to_str()
            .unwrap()
            .to_string()
    };
    let server = |listen: &str, extra: &[&str]| {
        let mut cmd = std::process::Command::new(common::BIN);
        cmd.args(["serve", "http", "--listen", listen, "--root", &root])
            .args(["--stats-interval", "0", "--drain-timeout", "5s"])
            .args(["--tls-cert", &cert, "--tls-key", &key])
            .args(extra)
            .stdout(std::process::Stdio::null());
        Served::spawn(cmd, false)
    };
    let old = server("127.0.0.1:0", &["--upgrade-socket", &sock(0)]);
    if !old.log.contains("kTLS RX") {
        // The lab runs this on a kernel with the module and says so: no skipping there.
        let expected = std::env::var_os("CORELOCAL_EXPECT_KTLS").is_some();
        assert!(
            !expected,
            "CORELOCAL_EXPECT_KTLS set, no kTLS RX: {}",
            old.log
        );
        eprintln!("skipping: no kTLS RX on this kernel ({})", old.log.trim());
        old.terminate();
        return;
    }
    let addr = old.hostport();
    let mut client = std::process::Command::new("python3")
        .args(["-c", KEEP_ALIVE_CLIENT, &old.addr.port().to_string()])
        .arg(cert_path("ca.pem"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut to_client = client.stdin.take().unwrap();
    let mut from_client = std::io::BufReader::new(client.stdout.take().unwrap());
    let mut ask = || {
        use std::io::{BufRead, Write};
        to_client.write_all(b"get\n").unwrap();
        let mut line = String::new();
        from_client.read_line(&mut line).unwrap();
        line
    };
    assert_eq!(ask(), format!("{BODY} TLSv1.3\n"));
    let new = server(
        &addr,
        &["--takeover", &sock(0), "--upgrade-socket", &sock(1)],
    );
    let (code, rest) = old.wait_exit(std::time::Duration::from_secs(20));
    assert_eq!(code, 0, "{rest}");
    assert!(rest.contains("moved to pid"), "{rest}");
    // The old server is gone: only the new one can answer, on the same TLS session.
    assert_eq!(
        ask(),
        format!("{BODY} TLSv1.3\n"),
        "the moved connection: {rest}"
    );
    drop(to_client); // The client's loop ends.
    let (code, _) = new.terminate();
    assert_eq!(code, 0);
    assert!(client.wait().unwrap().success());
}
