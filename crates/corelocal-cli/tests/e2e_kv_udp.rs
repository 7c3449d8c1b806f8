//! `corelocal serve kv --udp-port` through the real binary on both backends: memcached's UDP
//! frame header on real datagrams, gets and sets against the same store TCP serves, a reply
//! over 1400 bytes split into numbered datagrams, multi-datagram requests dropped, the port
//! file, `stats conns`, `--no-tcp` and the refusal with `--auth-file`.

mod common;

use common::{Served, TempDir, BIN};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BACKENDS: [&str; 2] = ["auto", "epoll"];

fn header(id: u16, seq: u16, total: u16) -> Vec<u8> {
    [id, seq, total, 0]
        .iter()
        .flat_map(|v| v.to_be_bytes())
        .collect()
}

fn field(d: &[u8], i: usize) -> u16 {
    u16::from_be_bytes([d[2 * i], d[2 * i + 1]])
}

/// A UDP client of the server's port.
fn client(port: u16) -> UdpSocket {
    let c = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.connect((Ipv4Addr::LOCALHOST, port)).unwrap();
    c
}

/// Sends `body` as request `id` and collects the reply's datagrams (checking each header)
/// into the reply's bytes.
fn ask_udp(c: &UdpSocket, id: u16, body: &[u8]) -> (Vec<u8>, usize) {
    c.send(&[header(id, 0, 1), body.to_vec()].concat()).unwrap();
    let mut buf = vec![0u8; 65536];
    let mut parts: Vec<Option<Vec<u8>>> = Vec::new();
    loop {
        let n = c.recv(&mut buf).expect("a reply datagram");
        let d = &buf[..n];
        assert!((8..=1400).contains(&n), "datagram of {n} bytes");
        assert_eq!(field(d, 0), id, "the request's id");
        assert_eq!(field(d, 3), 0, "reserved");
        let (seq, total) = (field(d, 1) as usize, field(d, 2) as usize);
        if parts.is_empty() {
            parts = vec![None; total];
        }
        assert_eq!(parts.len(), total, "one total for the whole reply");
        assert!(
            parts[seq].replace(d[8..].to_vec()).is_none(),
            "seq {seq} twice"
        );
        if parts.iter().all(Option::is_some) {
            let count = parts.len();
            return (parts.into_iter().flatten().flatten().collect(), count);
        }
    }
}

fn ask_tcp(c: &mut TcpStream, cmd: &[u8], end: &[u8]) -> Vec<u8> {
    c.write_all(cmd).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    while !got.ends_with(end) {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0, "closed after {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    got
}

/// The ports in memcached's port-file format.
fn ports(path: &std::path::Path) -> Vec<(String, u16)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let (kind, port) = l.split_once(": ").expect(l);
            (kind.to_string(), port.parse().unwrap())
        })
        .collect()
}

fn wait_for_file(path: &std::path::Path) {
    let end = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(Instant::now() < end, "no {}", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `serve kv --backend BACKEND --udp-port any --port-file DIR/ports`, in a fresh `DIR`.
fn serve_udp(backend: &str, tag: &str) -> (TempDir, Served) {
    let dir = TempDir::new(tag);
    let port_file = dir.0.join("ports");
    let served = Served::start(
        "kv",
        &[
            "--backend",
            backend,
            "--udp-port",
            "any",
            "--port-file",
            port_file.to_str().unwrap(),
        ],
    );
    (dir, served)
}

#[test]
fn udp_gets_and_sets_with_frame_headers_on_both_backends() {
    for backend in BACKENDS {
        let (dir, s) = serve_udp(backend, "kv-udp");
        let port_file = dir.0.join("ports");
        let listed = ports(&port_file);
        assert_eq!(listed.len(), 2, "{listed:?}");
        assert_eq!(listed[0], ("TCP INET".into(), s.addr.port()));
        assert_eq!(listed[1].0, "UDP INET");
        let udp_port = listed[1].1;
        let u = client(udp_port);
        let mut t = TcpStream::connect(s.addr).unwrap();
        t.set_read_timeout(Some(Duration::from_secs(5))).unwrap();

        // A set over UDP is seen over TCP, and the other way round.
        let (r, _) = ask_udp(&u, 1, b"set viaudp 3 0 5\r\nhello\r\n");
        assert_eq!(r, b"STORED\r\n", "--backend {backend}");
        let over_tcp = ask_tcp(&mut t, b"get viaudp\r\n", b"END\r\n");
        assert_eq!(over_tcp, b"VALUE viaudp 3 5\r\nhello\r\nEND\r\n");
        let (r, n) = ask_udp(&u, 2, b"get viaudp\r\n");
        assert_eq!((r, n), (over_tcp, 1));

        // A reply over 1400 bytes: 5025 bytes in 4 datagrams, byte-identical to TCP's.
        let big: Vec<u8> = (0..5000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let set = [b"set big 0 0 5000\r\n".as_slice(), &big, b"\r\n"].concat();
        assert_eq!(ask_tcp(&mut t, &set, b"\r\n"), b"STORED\r\n");
        let over_tcp = ask_tcp(&mut t, b"get big\r\n", b"END\r\n");
        let (r, n) = ask_udp(&u, 3, b"get big\r\n");
        assert_eq!(n, 4, "--backend {backend}");
        assert_eq!(r, over_tcp, "--backend {backend}");
        // A big set in one datagram.
        let set = [b"set big2 0 0 5000\r\n".as_slice(), &big, b"\r\n"].concat();
        assert_eq!(ask_udp(&u, 4, &set).0, b"STORED\r\n");
        assert_eq!(
            ask_tcp(&mut t, b"get big2\r\n", b"END\r\n"),
            [b"VALUE big2 0 5000\r\n".as_slice(), &big, b"\r\nEND\r\n"].concat()
        );

        // A request in two datagrams is dropped (nothing comes back for id 5); the next one
        // is answered.
        let mut two = header(5, 0, 2);
        two.extend_from_slice(b"version\r\n");
        u.send(&two).unwrap();
        let (r, _) = ask_udp(&u, 6, b"incr nope 1\r\n");
        assert_eq!(r, b"NOT_FOUND\r\n");

        // quit: memcached's empty message, a header alone numbered 0 of 0.
        u.send(&[header(7, 0, 1), b"quit\r\n".to_vec()].concat())
            .unwrap();
        let mut buf = [0u8; 64];
        let n = u.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], header(7, 0, 0));

        let conns = String::from_utf8(ask_tcp(&mut t, b"stats conns\r\n", b"END\r\n")).unwrap();
        assert!(
            conns.contains(&format!(":addr udp:127.0.0.1:{udp_port}\r\n")),
            "{conns}"
        );
        assert!(conns.contains(":UDP UDP\r\n"), "{conns}");
        let settings =
            String::from_utf8(ask_tcp(&mut t, b"stats settings\r\n", b"END\r\n")).unwrap();
        assert!(
            settings.contains(&format!("STAT udpport {udp_port}\r\n")),
            "{settings}"
        );
        drop(t);
        let (code, rest) = s.terminate();
        assert_eq!(code, 0, "--backend {backend}: {rest}");
        assert!(
            rest.contains("UDP stopped | requests 6 | dropped 1"),
            "--backend {backend}: {rest}"
        );
        // The socket is closed: a request now goes unanswered (or is refused).
        u.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let _ = u.send(&[header(8, 0, 1), b"version\r\n".to_vec()].concat());
        assert!(u.recv(&mut buf).is_err(), "--backend {backend}");
    }
}

#[test]
fn no_tcp_serves_udp_alone_as_memcached_p_0() {
    let dir = TempDir::new("kv-udp-only");
    let port_file = dir.0.join("ports");
    let mut child = Command::new(BIN)
        .args(["serve", "kv", "--listen", "127.0.0.1:0", "--no-tcp"])
        .args(["--udp-port", "any", "--port-file"])
        .arg(&port_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_file(&port_file);
    let listed = ports(&port_file);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].0, "UDP INET");
    let u = client(listed[0].1);
    assert_eq!(ask_udp(&u, 9, b"set k 0 0 1\r\nx\r\n").0, b"STORED\r\n");
    assert_eq!(
        ask_udp(&u, 10, b"get k\r\n").0,
        b"VALUE k 0 1\r\nx\r\nEND\r\n"
    );
    let stats = String::from_utf8(ask_udp(&u, 11, b"stats settings\r\n").0).unwrap();
    assert!(stats.contains("STAT tcpport 0\r\n"), "{stats}");
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "{err}");
    assert!(err.contains("listening on udp 127.0.0.1:"), "{err}");
}

#[test]
fn udp_with_ascii_authentication_is_refused_as_memcached_refuses_it() {
    let dir = TempDir::new("kv-udp-auth");
    let auth = dir.0.join("auth");
    std::fs::write(&auth, "user:pass\n").unwrap();
    let out = Command::new(BIN)
        .args([
            "serve",
            "kv",
            "--listen",
            "127.0.0.1:0",
            "--udp-port",
            "any",
        ])
        .arg("--auth-file")
        .arg(&auth)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--udp-port with --auth-file"), "{err}");
    // A port that is taken is named.
    let taken = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let out = Command::new(BIN)
        .args([
            "serve",
            "kv",
            "--listen",
            "127.0.0.1:0",
            "--udp-port",
            &port,
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("--udp-port {port}")), "{err}");
    let _: SocketAddr = taken.local_addr().unwrap();
}

/// A takeover does not move UDP sockets: the successor (`--takeover PID`) binds its own on the
/// same port, the old server's close when it exits, and the successor answers from the store
/// it imported.
#[test]
fn a_takeover_successor_serves_the_udp_port_with_the_moved_store() {
    for backend in BACKENDS {
        let (dir, old) = serve_udp(backend, "kv-udp-takeover");
        let port_file = dir.0.join("ports");
        let udp_port = ports(&port_file)[1].1;
        let u = client(udp_port);
        assert_eq!(ask_udp(&u, 1, b"set k 0 0 3\r\nold\r\n").0, b"STORED\r\n");
        let (pid, port) = (old.pid().to_string(), udp_port.to_string());
        let new = Served::start_at(
            "kv",
            &old.addr.to_string(),
            &[
                "--backend",
                backend,
                "--udp-port",
                &port,
                "--takeover",
                &pid,
            ],
        );
        let (code, rest) = old.wait_exit(Duration::from_secs(20));
        assert_eq!(code, 0, "--backend {backend}: {rest}");
        assert!(rest.contains("UDP stopped | requests 1 |"), "{rest}");
        for id in 2..6 {
            assert_eq!(
                ask_udp(&u, id, b"get k\r\n").0,
                b"VALUE k 0 3\r\nold\r\nEND\r\n",
                "--backend {backend}"
            );
        }
        let (code, rest) = new.terminate();
        assert_eq!(code, 0, "--backend {backend}: {rest}");
        assert!(rest.contains("UDP stopped | requests 4 |"), "{rest}");
    }
}
