//! HTTPS end to end on both backends: `TlsService` around the static HTTP server, a rustls
//! client (TLS 1.3 and 1.2, ECDSA and RSA chains, ALPN), resumption by ticket and by session
//! ID, a plain port beside the TLS one, and hostile clients (garbage, an oversize
//! ClientHello, a dribbled or truncated handshake, a close mid-handshake) that each get an
//! alert or a close while a good client is still served.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use corelocal::cpu::{current_affinity, CpuSet};
use corelocal::listen::Mode;
use corelocal::runtime::{BackendKind, Server, ServerConfig};
use corelocal::testing::ScratchDir;
use corelocal_apps::http::{HttpConfig, HttpService};
use corelocal_apps::tls::{CertFiles, CertStore, TlsConfig, TlsService};
use rustls::client::Resumption;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, HandshakeKind, ProtocolVersion, RootCertStore};

/// A file larger than the HTTP server caches: sent as a file region, encrypted piece by piece.
const BIG_BYTES: usize = 3 << 20;

fn cert_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tls")
}

fn cert(name: &str) -> CertFiles {
    CertFiles {
        chain: cert_dir().join(format!("{name}.pem")),
        key: cert_dir().join(format!("{name}.key")),
    }
}

fn big_body() -> Vec<u8> {
    (0..BIG_BYTES).map(|i| (i * 7 % 251) as u8).collect()
}

struct Fixture {
    server: Server,
    certs: Arc<CertStore>,
    _root: ScratchDir,
}

impl Fixture {
    /// A plain port (listener 0) and a TLS port (listener 1), on `cpus`.
    fn start(backend: BackendKind, cpus: &CpuSet, tls: TlsConfig) -> Fixture {
        let root = ScratchDir::new("corelocal-tls-test");
        std::fs::write(root.join("hello.txt"), b"hello over tls\n").unwrap();
        std::fs::write(root.join("big.bin"), big_body()).unwrap();
        let http = HttpService::new(HttpConfig {
            root: Some(root.to_path_buf()),
            ..HttpConfig::default()
        })
        .unwrap();
        let tls = TlsConfig {
            listeners: vec![1],
            ..tls
        };
        let service = Arc::new(TlsService::new(Arc::new(http), tls).unwrap());
        let certs = service.certs();
        let addrs = vec!["127.0.0.1:0".parse().unwrap(); 2];
        let mut config = ServerConfig::new(addrs, cpus, Mode::Local);
        config.backend = backend;
        let server = Server::start(config, service).unwrap();
        Fixture {
            server,
            certs,
            _root: root,
        }
    }

    fn one_cpu(backend: BackendKind, tls: TlsConfig) -> Fixture {
        let cpu = current_affinity().unwrap().iter().next().unwrap();
        Fixture::start(backend, &CpuSet::single(cpu), tls)
    }

    fn plain(&self) -> SocketAddr {
        self.server.local_addrs()[0]
    }

    fn tls(&self) -> SocketAddr {
        self.server.local_addrs()[1]
    }

    /// Connections open now (hostile ones must be gone).
    fn open(&self) -> u64 {
        self.server.stats().total.open
    }

    fn stop(self) {
        self.server.stop();
        self.server.join().unwrap();
    }
}

fn tls_config(names: &[&str]) -> TlsConfig {
    TlsConfig {
        certs: names.iter().map(|n| cert(n)).collect(),
        ..TlsConfig::default()
    }
}

fn client_config(versions: &[&'static rustls::SupportedProtocolVersion]) -> ClientConfig {
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(cert_dir().join("ca.pem")).unwrap() {
        roots.add(ca.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

/// One HTTPS connection: GET each path (keep-alive), read each response whole.
struct Https {
    tls: rustls::StreamOwned<ClientConnection, TcpStream>,
}

impl Https {
    fn connect(addr: SocketAddr, config: &Arc<ClientConfig>, name: &str) -> Https {
        let tcp = TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let server_name = ServerName::try_from(name.to_string()).unwrap();
        let conn = ClientConnection::new(config.clone(), server_name).unwrap();
        Https {
            tls: rustls::StreamOwned::new(conn, tcp),
        }
    }

    /// The body of `path` (status 200 checked).
    fn get(&mut self, path: &str) -> Vec<u8> {
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        self.tls.write_all(req.as_bytes()).unwrap();
        read_response(&mut self.tls)
    }

    fn conn(&self) -> &ClientConnection {
        &self.tls.conn
    }
}

/// Reads one response with a Content-Length body; returns the body.
fn read_response(s: &mut impl Read) -> Vec<u8> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            s.read(&mut byte).unwrap(),
            1,
            "closed inside the head: {head:?}"
        );
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(str::to_string)
        })
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    body
}

fn tls13_and_tls12_with_ecdsa_and_rsa_chains(backend: BackendKind) {
    for key in ["ecdsa", "rsa"] {
        let f = Fixture::one_cpu(backend, tls_config(&[key]));
        for (version, want) in [
            (&rustls::version::TLS13, ProtocolVersion::TLSv1_3),
            (&rustls::version::TLS12, ProtocolVersion::TLSv1_2),
        ] {
            let config = Arc::new(client_config(&[version]));
            let mut c = Https::connect(f.tls(), &config, "localhost");
            assert_eq!(c.get("/hello.txt"), b"hello over tls\n", "{key} {want:?}");
            // Keep-alive, and a file sent as a region on the plain path.
            assert!(c.get("/big.bin") == big_body(), "{key} {want:?}: big file");
            assert_eq!(c.get("/hello.txt"), b"hello over tls\n");
            assert_eq!(c.conn().protocol_version(), Some(want));
            assert_eq!(c.conn().alpn_protocol(), Some(&b"http/1.1"[..]));
        }
        f.stop();
    }
}

/// Pipelined requests whose answers are far past the output limit (1 MiB): the decrypted
/// requests wait while the output drains, and each is answered in order.
fn pipelined_requests_past_the_output_limit(backend: BackendKind) {
    let f = Fixture::one_cpu(backend, tls_config(&["ecdsa"]));
    let config = Arc::new(client_config(rustls::ALL_VERSIONS));
    let mut c = Https::connect(f.tls(), &config, "localhost");
    const PATHS: [&str; 5] = [
        "/big.bin",
        "/hello.txt",
        "/big.bin",
        "/big.bin",
        "/hello.txt",
    ];
    let mut pipeline = Vec::new();
    for path in PATHS {
        pipeline.extend_from_slice(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes());
    }
    c.tls.write_all(&pipeline).unwrap();
    for path in PATHS {
        let body = read_response(&mut c.tls);
        match path {
            "/big.bin" => assert!(body == big_body(), "{path}"),
            _ => assert_eq!(body, b"hello over tls\n"),
        }
    }
    f.stop();
}

fn a_plain_port_beside_the_tls_one(backend: BackendKind) {
    let f = Fixture::one_cpu(backend, tls_config(&["ecdsa"]));
    let mut plain = TcpStream::connect(f.plain()).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    plain
        .write_all(b"GET /hello.txt HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut plain), b"hello over tls\n");
    let config = Arc::new(client_config(rustls::ALL_VERSIONS));
    let mut c = Https::connect(f.tls(), &config, "localhost");
    assert_eq!(c.get("/hello.txt"), b"hello over tls\n");
    f.stop();
}

fn sni_picks_the_certificate_by_name(backend: BackendKind) {
    let f = Fixture::one_cpu(backend, tls_config(&["ecdsa", "other"]));
    let config = Arc::new(client_config(rustls::ALL_VERSIONS));
    for name in ["localhost", "other.test"] {
        // The client checks the certificate is valid for the name it asked for.
        let mut c = Https::connect(f.tls(), &config, name);
        assert_eq!(c.get("/hello.txt"), b"hello over tls\n", "{name}");
    }
    f.stop();
}

/// The certificate chain's files replaced and reloaded: new handshakes get the new leaf,
/// a connection established before keeps working; a reload of broken files keeps the old.
fn reloaded_certificates_serve_new_handshakes(backend: BackendKind) {
    let dir = ScratchDir::new("corelocal-tls-reload");
    let files = CertFiles {
        chain: dir.join("chain.pem"),
        key: dir.join("key.pem"),
    };
    let install = |name: &str| {
        std::fs::copy(cert(name).chain, &files.chain).unwrap();
        std::fs::copy(cert(name).key, &files.key).unwrap();
    };
    install("ecdsa");
    let config = TlsConfig {
        certs: vec![files.clone()],
        ..TlsConfig::default()
    };
    let f = Fixture::one_cpu(backend, config);
    // A fresh client each time: a resumed session would show the first certificate again.
    let client = || Arc::new(client_config(rustls::ALL_VERSIONS));
    let leaf = |c: &Https| c.conn().peer_certificates().unwrap()[0].to_vec();
    let first_leaf = |name: &str| {
        CertificateDer::pem_file_iter(cert(name).chain)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .to_vec()
    };
    let mut before = Https::connect(f.tls(), &client(), "localhost");
    assert_eq!(before.get("/hello.txt"), b"hello over tls\n");
    assert_eq!(leaf(&before), first_leaf("ecdsa"));
    install("rsa");
    assert_eq!(f.certs.reload(), Ok(1));
    let mut after = Https::connect(f.tls(), &client(), "localhost");
    assert_eq!(after.get("/hello.txt"), b"hello over tls\n");
    assert_eq!(leaf(&after), first_leaf("rsa"));
    assert_eq!(before.get("/hello.txt"), b"hello over tls\n");
    // A key that does not match its chain: refused, the RSA pair stays in force.
    std::fs::copy(cert("other").key, &files.key).unwrap();
    assert!(f.certs.reload().is_err());
    let mut still = Https::connect(f.tls(), &client(), "localhost");
    assert_eq!(still.get("/hello.txt"), b"hello over tls\n");
    assert_eq!(leaf(&still), first_leaf("rsa"));
    f.stop();
}

/// Connects `n` times with one client config (its session store): how many resumed.
fn resumed_of(addr: SocketAddr, config: &Arc<ClientConfig>, n: usize) -> usize {
    (0..n)
        .filter(|_| {
            let mut c = Https::connect(addr, config, "localhost");
            assert_eq!(c.get("/hello.txt"), b"hello over tls\n");
            c.conn().handshake_kind() == Some(HandshakeKind::Resumed)
        })
        .count()
}

fn resumption_by_ticket_and_by_session_id(backend: BackendKind) {
    let f = Fixture::one_cpu(backend, tls_config(&["ecdsa"]));
    // TLS 1.3 tickets, TLS 1.2 tickets (RFC 5077), TLS 1.2 session IDs.
    let tls13 = client_config(&[&rustls::version::TLS13]);
    let tls12_tickets = client_config(&[&rustls::version::TLS12]);
    let mut tls12_ids = client_config(&[&rustls::version::TLS12]);
    tls12_ids.resumption = Resumption::in_memory_sessions(16)
        .tls12_resumption(rustls::client::Tls12Resumption::SessionIdOnly);
    for (what, config) in [
        ("1.3 ticket", tls13),
        ("1.2 ticket", tls12_tickets),
        ("1.2 id", tls12_ids),
    ] {
        let config = Arc::new(config);
        // The first is a full handshake; the rest resume.
        assert_eq!(resumed_of(f.tls(), &config, 4), 3, "{what}");
    }
    f.stop();
    // TLS 1.3 with tickets off on the server: stateful resumption from its session cache.
    let f = Fixture::one_cpu(
        backend,
        TlsConfig {
            tickets: false,
            ..tls_config(&["ecdsa"])
        },
    );
    let config = Arc::new(client_config(&[&rustls::version::TLS13]));
    assert_eq!(resumed_of(f.tls(), &config, 3), 2, "1.3 stateful");
    f.stop();
}

fn tickets_resume_on_any_worker(backend: BackendKind) {
    let cpus = current_affinity().unwrap();
    let cpu_list: Vec<usize> = cpus.iter().collect();
    if cpu_list.len() < 2 {
        eprintln!("skipped: needs 2 CPUs (tickets made on one worker, opened on another)");
        return;
    }
    let f = Fixture::start(backend, &cpus, tls_config(&["ecdsa"]));
    let config = Arc::new(client_config(&[&rustls::version::TLS13]));
    // The client hops between CPUs: in local mode each connection goes to the worker of the
    // CPU its SYN came from, so tickets made on one worker are offered to the other.
    let tls = f.tls();
    let resumed = (0..12)
        .filter(|i| {
            let (config, cpu) = (config.clone(), cpu_list[i % 2]);
            std::thread::spawn(move || {
                corelocal::cpu::pin_current_thread(&CpuSet::single(cpu)).unwrap();
                resumed_of(tls, &config, 1) == 1
            })
            .join()
            .unwrap()
        })
        .count();
    assert_eq!(resumed, 11, "every connection after the first resumes");
    let per_worker: Vec<u64> = f
        .server
        .stats()
        .workers
        .iter()
        .map(|w| w.accepted)
        .collect();
    // The two CPUs' workers took them (a machine with more CPUs has idle workers too).
    assert!(
        per_worker.iter().filter(|&&n| n > 0).count() >= 2,
        "accepted per worker: {per_worker:?}"
    );
    f.stop();
}

/// The first flight of a real client (its ClientHello), as bytes.
fn client_hello() -> Vec<u8> {
    let config = Arc::new(client_config(rustls::ALL_VERSIONS));
    let mut conn =
        ClientConnection::new(config, ServerName::try_from("localhost").unwrap()).unwrap();
    let mut hello = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut hello).unwrap();
    }
    hello
}

/// Reads until the server closes; what it sent (an alert, or nothing). A reset counts as
/// closed. Panics if the connection is still open after `patience`.
fn until_closed(s: &mut TcpStream, patience: Duration) -> Vec<u8> {
    s.set_read_timeout(Some(patience)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("still open after {patience:?} ({e}); got {got:?}"),
        }
    }
}

/// Whether `bytes` hold a TLS alert record (content type 21).
fn is_alert(bytes: &[u8]) -> bool {
    bytes.first() == Some(&21)
}

/// The server still serves a good client, and every hostile connection is gone.
fn still_serves(f: &Fixture) {
    let config = Arc::new(client_config(rustls::ALL_VERSIONS));
    let mut c = Https::connect(f.tls(), &config, "localhost");
    assert_eq!(c.get("/hello.txt"), b"hello over tls\n");
    drop(c);
    let start = Instant::now();
    while f.open() > 0 && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(f.open(), 0, "a hostile connection is still open");
}

fn hostile_clients_get_an_alert_or_a_close(backend: BackendKind) {
    let f = Fixture::one_cpu(
        backend,
        TlsConfig {
            handshake_timeout: Duration::from_millis(300),
            ..tls_config(&["ecdsa"])
        },
    );
    let patience = Duration::from_secs(20);
    let hello = client_hello();

    // Plain HTTP on the TLS port: not a TLS record.
    let mut s = TcpStream::connect(f.tls()).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let got = until_closed(&mut s, patience);
    assert!(got.is_empty() || is_alert(&got), "garbage: {got:?}");
    still_serves(&f);

    // An oversize ClientHello: a handshake message that says 60 KiB (rustls would wait for
    // all of it, up to 64 KiB), sent in full records: closed past `handshake_bytes_max`.
    let mut s = TcpStream::connect(f.tls()).unwrap();
    let mut big = vec![22, 3, 1, 0x40, 0x00, 1, 0x00, 0xf0, 0x00];
    big.resize(5 + 0x4000, 0x41);
    for _ in 0..2 {
        big.extend_from_slice(&[22, 3, 1, 0x40, 0x00]);
        big.resize(big.len() + 0x4000, 0x41);
    }
    let _ = s.write_all(&big);
    let _ = until_closed(&mut s, patience);
    still_serves(&f);

    // A ClientHello dribbled a byte at a time, past the handshake timeout.
    let mut s = TcpStream::connect(f.tls()).unwrap();
    s.set_nodelay(true).unwrap();
    let mut sent = 0;
    for b in &hello {
        if s.write_all(std::slice::from_ref(b)).is_err() {
            break;
        }
        sent += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = until_closed(&mut s, patience);
    assert!(sent < hello.len(), "the whole dribbled hello was taken");
    still_serves(&f);

    // A client that connects and says nothing, and one that stops halfway through its
    // ClientHello: closed after the handshake timeout (the idle timeout is a minute).
    for part in [&hello[..0], &hello[..hello.len() / 2]] {
        let mut s = TcpStream::connect(f.tls()).unwrap();
        s.write_all(part).unwrap();
        let _ = until_closed(&mut s, patience);
    }
    still_serves(&f);

    // A truncated ClientHello, then the client's end.
    let mut s = TcpStream::connect(f.tls()).unwrap();
    s.write_all(&hello[..hello.len() / 2]).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let _ = until_closed(&mut s, patience);
    still_serves(&f);

    // A whole ClientHello, then a close once the server answered (mid-handshake).
    let mut s = TcpStream::connect(f.tls()).unwrap();
    s.write_all(&hello).unwrap();
    s.set_read_timeout(Some(patience)).unwrap();
    let mut first = [0u8; 5];
    s.read_exact(&mut first).unwrap();
    assert_eq!(first[0], 22, "a ServerHello");
    drop(s);
    still_serves(&f);

    // A record with a bad version and a huge length after a good ClientHello.
    let mut s = TcpStream::connect(f.tls()).unwrap();
    s.write_all(&hello).unwrap();
    s.write_all(&[23, 9, 9, 0xff, 0xff, 1, 2, 3]).unwrap();
    let got = until_closed(&mut s, patience);
    assert!(!got.is_empty(), "the server's flight, then an alert");
    still_serves(&f);
    f.stop();
}

corelocal::on_every_backend!(
    tls13_and_tls12_with_ecdsa_and_rsa_chains,
    pipelined_requests_past_the_output_limit,
    reloaded_certificates_serve_new_handshakes,
    a_plain_port_beside_the_tls_one,
    sni_picks_the_certificate_by_name,
    resumption_by_ticket_and_by_session_id,
    tickets_resume_on_any_worker,
    hostile_clients_get_an_alert_or_a_close,
);
