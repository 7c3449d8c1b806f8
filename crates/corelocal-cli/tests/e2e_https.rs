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
