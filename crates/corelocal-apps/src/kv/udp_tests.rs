//! The UDP frame, the splitting of replies, the engine against the TCP one, and a served
//! socket.

use super::tests::service;
use super::udp::*;
use super::*;
use corelocal::runtime::{Handler, Output};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};

fn header(id: u16, seq: u16, total: u16, reserved: u16) -> Vec<u8> {
    Frame {
        request_id: id,
        seq,
        total,
        reserved,
    }
    .to_bytes()
    .to_vec()
}

#[test]
fn frame_header_is_four_big_endian_u16() {
    let f = Frame {
        request_id: 0x0102,
        seq: 0x0304,
        total: 0x0506,
        reserved: 0x0708,
    };
    assert_eq!(f.to_bytes(), [1, 2, 3, 4, 5, 6, 7, 8]);
    let mut d = f.to_bytes().to_vec();
    d.extend_from_slice(b"get k\r\n");
    assert_eq!(Frame::parse(&d), Some((f, &b"get k\r\n"[..])));
    assert_eq!(Frame::parse(&d[..7]), None);
    assert_eq!(Frame::parse(&d[..8]), Some((f, &b""[..])));
}

#[test]
fn only_single_datagram_requests_are_served() {
    let mut d = header(7, 0, 1, 0);
    d.extend_from_slice(b"version\r\n");
    assert_eq!(request(&d), Some((7, &b"version\r\n"[..])));
    // memcached looks at the count only: sequence and reserved are not checked.
    let mut d2 = header(8, 3, 1, 9);
    d2.extend_from_slice(b"x");
    assert_eq!(request(&d2), Some((8, &b"x"[..])));
    for total in [0, 2, 0x100] {
        assert_eq!(request(&header(7, 0, total, 0)), None, "total {total}");
    }
    assert_eq!(request(b"abc"), None);
}

#[test]
fn replies_split_into_datagrams_of_at_most_1400_bytes() {
    // memcached 1.6.18's split of `get k` for a 3000-byte value (3023 bytes): 1400, 1400, 247.
    let reply: Vec<u8> = (0..3023u32).map(|i| i as u8).collect();
    let parts: Vec<_> = datagrams(9, &reply).collect();
    assert_eq!(parts.len(), 3);
    let sizes: Vec<usize> = parts.iter().map(|(h, p)| h.len() + p.len()).collect();
    assert_eq!(sizes, [1400, 1400, 247]);
    let mut joined = Vec::new();
    for (seq, (h, p)) in parts.iter().enumerate() {
        let (f, _) = Frame::parse(h).unwrap();
        assert_eq!(
            f,
            Frame {
                request_id: 9,
                seq: seq as u16,
                total: 3,
                reserved: 0
            }
        );
        joined.extend_from_slice(p);
    }
    assert_eq!(joined, reply);
    // Exactly full datagrams, one byte more, the smallest.
    assert_eq!(datagrams(1, &vec![b'x'; PAYLOAD_BYTES_MAX]).len(), 1);
    assert_eq!(datagrams(1, &vec![b'x'; PAYLOAD_BYTES_MAX + 1]).len(), 2);
    assert_eq!(datagrams(1, b"END\r\n").len(), 1);
    // The empty reply (quit): a header alone, 0 of 0.
    let empty: Vec<_> = datagrams(5, b"").collect();
    assert_eq!(
        empty,
        vec![(header(5, 0, 0, 0).try_into().unwrap(), &b""[..])]
    );
    // The most that can be numbered.
    assert_eq!(
        datagrams(1, &vec![0; RESPONSE_BYTES_LIMIT]).len(),
        u16::MAX as usize
    );
}

#[test]
fn limits_cover_the_largest_item_within_what_can_be_numbered() {
    assert_eq!(UdpLimits::for_items(1 << 20), UdpLimits::default());
    assert_eq!(
        UdpLimits::for_items(16 << 20).response_bytes_max,
        (16 << 20) + (64 << 10)
    );
    assert_eq!(
        UdpLimits::for_items(1 << 30).response_bytes_max,
        RESPONSE_BYTES_LIMIT
    );
}

fn local() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, 11222))
}

/// Each reply the engine gives for `body`.
fn replies(engine: &mut UdpEngine, body: &[u8], now: Instant) -> Vec<Vec<u8>> {
    let mut all = Vec::new();
    engine.request(body, now, |r| all.push(r.to_vec()));
    all
}

fn strings(r: Vec<Vec<u8>>) -> Vec<String> {
    r.into_iter()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .collect()
}

#[test]
fn each_command_is_answered_in_its_own_message_as_memcached() {
    let (svc, base) = service(KvConfig::default());
    let mut e = UdpEngine::new(&svc, 0, local(), UdpLimits::default());
    // Recorded from memcached 1.6.18 over UDP: one message per reply, none for noreply.
    assert_eq!(
        strings(replies(
            &mut e,
            b"set a 0 0 1\r\nx\r\nget a\r\nget nope\r\n",
            base
        )),
        ["STORED\r\n", "VALUE a 0 1\r\nx\r\nEND\r\n", "END\r\n"]
    );
    assert_eq!(
        strings(replies(
            &mut e,
            b"set d 0 0 1 noreply\r\nx\r\nget d\r\n",
            base
        )),
        ["VALUE d 0 1\r\nx\r\nEND\r\n"]
    );
    assert_eq!(
        strings(replies(&mut e, b"mg d v\r\nmn\r\n", base)),
        ["VA 1\r\nx\r\n", "MN\r\n"]
    );
    assert_eq!(strings(replies(&mut e, b"bogus\r\n", base)), ["ERROR\r\n"]);
    assert_eq!(
        strings(replies(
            &mut e,
            &[b"get ".as_slice(), &[b'k'; 300], b"\r\n"].concat(),
            base
        )),
        ["CLIENT_ERROR bad command line format\r\n"]
    );
    // quit: what came before, then the empty message; the rest is not run.
    assert_eq!(
        strings(replies(&mut e, b"get d\r\nquit\r\nget d\r\n", base)),
        ["VALUE d 0 1\r\nx\r\nEND\r\n", ""]
    );
    // An incomplete line at the end is dropped, so is an empty request.
    assert_eq!(
        strings(replies(&mut e, b"get d\r\nget", base)),
        ["VALUE d 0 1\r\nx\r\nEND\r\n"]
    );
    assert!(replies(&mut e, b"get d", base).is_empty());
    assert!(replies(&mut e, b"", base).is_empty());
    // A web request is hung up on: nothing, and nothing after it runs.
    assert!(replies(&mut e, b"GET / HTTP/1.1\r\nget d\r\n", base).is_empty());
    assert_eq!(
        strings(replies(&mut e, b"get d\n", base)),
        ["VALUE d 0 1\r\nx\r\nEND\r\n"]
    );
}

#[test]
fn a_request_is_one_datagram_data_included() {
    let (svc, base) = service(KvConfig::default());
    let mut e = UdpEngine::new(&svc, 0, local(), UdpLimits::default());
    // Data cut short by the end of the datagram: refused now, under this request.
    assert_eq!(
        strings(replies(&mut e, b"set b 0 0 5\r\nab", base)),
        ["CLIENT_ERROR bad data chunk\r\n"]
    );
    assert!(replies(&mut e, b"set b 0 0 5 noreply\r\nab", base).is_empty());
    assert!(replies(&mut e, b"set b 0 0 5\r\n", base).len() == 1);
    // The next datagram starts with a command.
    assert_eq!(strings(replies(&mut e, b"get b\r\n", base)), ["END\r\n"]);
    // A value over the item limit: refused at once, its data not awaited.
    assert_eq!(
        strings(replies(&mut e, b"set c 0 0 2000000\r\nab", base)),
        ["SERVER_ERROR object too large for cache\r\n"]
    );
    assert_eq!(strings(replies(&mut e, b"version\r\n", base)).len(), 1);
    assert_eq!(
        strings(replies(&mut e, b"set d 0 0 5\r\nabcde\r\nversion", base)),
        ["STORED\r\n"]
    );
}

/// What a TCP connection answers to `input` in one go.
fn tcp_answer(svc: &KvService, input: &[u8], now: Instant) -> Vec<u8> {
    let mut c = svc.connect(&ConnInfo {
        listener: 0,
        worker: 0,
        peer: None,
        now,
        notify: None,
    });
    let mut out = Output::new();
    let step = c.on_input(input, &mut out, now);
    assert_eq!(step.consumed, input.len());
    out.bytes_mut().clone()
}

#[test]
fn answers_are_the_tcp_engine_s_byte_for_byte() {
    let (svc, base) = service(KvConfig::default());
    let mut e = UdpEngine::new(&svc, 0, local(), UdpLimits::default());
    let big = vec![b'v'; 5000];
    let set = [b"set big 5 0 5000\r\n".as_slice(), &big, b"\r\n"].concat();
    assert_eq!(replies(&mut e, &set, base), vec![b"STORED\r\n".to_vec()]);
    for cmd in [
        &b"get big\r\n"[..],
        b"gets big\r\n",
        b"incr n 1\r\n",
        b"stats settings\r\n",
        b"mg big s v f\r\n",
        b"touch big 0\r\n",
        b"delete nope\r\n",
    ] {
        let udp = replies(&mut e, cmd, base).concat();
        assert_eq!(
            udp,
            tcp_answer(&svc, cmd, base),
            "{}",
            String::from_utf8_lossy(cmd)
        );
    }
}

#[test]
fn replies_past_the_limit_are_refused_and_the_rest_dropped() {
    let (svc, base) = service(KvConfig::default());
    let limits = UdpLimits {
        response_bytes_max: 100,
    };
    let mut e = UdpEngine::new(&svc, 0, local(), limits);
    let value = vec![b'v'; 60];
    let set = [b"set k 0 0 60\r\n".as_slice(), &value, b"\r\n"].concat();
    replies(&mut e, &set, base);
    // 80 bytes fit, a second 80 do not: memcached's error, then nothing more runs.
    let r = strings(replies(
        &mut e,
        b"get k\r\nget k\r\nset z 0 0 1\r\nz\r\n",
        base,
    ));
    assert_eq!(r.len(), 2, "{r:?}");
    assert!(r[0].starts_with("VALUE k 0 60\r\n"));
    assert_eq!(r[1], "SERVER_ERROR out of memory writing get response\r\n");
    assert_eq!(strings(replies(&mut e, b"get z\r\n", base)), ["END\r\n"]);
}

#[test]
fn udp_sockets_are_listed_and_counted_as_memcached_does() {
    let udp = SocketAddr::from((Ipv4Addr::LOCALHOST, 11222));
    let (svc, base) = service(KvConfig {
        report: Report {
            threads: 2,
            listen: vec!["127.0.0.1:11211".parse().unwrap()],
            udp_port: 11222,
            udp: vec![udp, udp],
            ..Report::default()
        },
        ..KvConfig::default()
    });
    let e0 = UdpEngine::new(&svc, 0, udp, UdpLimits::default());
    let mut e1 = UdpEngine::new(&svc, 1, udp, UdpLimits::default());
    let conns = String::from_utf8(replies(&mut e1, b"stats conns\r\n", base).concat()).unwrap();
    assert!(
        conns.starts_with(
            "STAT 1:addr tcp:127.0.0.1:11211\r\nSTAT 1:state conn_listening\r\n\
             STAT 1:secs_since_last_cmd 0\r\n\
             STAT 2:UDP UDP\r\nSTAT 2:addr udp:127.0.0.1:11222\r\nSTAT 2:state conn_read\r\n"
        ),
        "{conns}"
    );
    assert!(
        conns.contains("STAT 3:UDP UDP\r\nSTAT 3:addr udp:127.0.0.1:11222\r\n"),
        "{conns}"
    );
    let stats =
        String::from_utf8(replies(&mut e1, b"stats\r\nstats settings\r\n", base).concat()).unwrap();
    assert!(stats.contains("STAT curr_connections 2\r\n"), "{stats}");
    assert!(stats.contains("STAT udpport 11222\r\n"), "{stats}");
    drop(e0);
    let stats = String::from_utf8(replies(&mut e1, b"stats\r\n", base).concat()).unwrap();
    assert!(stats.contains("STAT curr_connections 1\r\n"), "{stats}");
}

#[test]
fn served_sockets_answer_framed_requests_and_stop() {
    let (svc, _) = service(KvConfig::default());
    let sockets = UdpSockets::bind(&[Ipv4Addr::LOCALHOST.into()], 0, &[0, 0], false).unwrap();
    let port = sockets.port();
    assert_ne!(port, 0);
    assert_eq!(sockets.addrs().len(), 2);
    assert_eq!(
        sockets.bound(),
        [SocketAddr::from((Ipv4Addr::LOCALHOST, port))]
    );
    let server = serve(&svc, sockets, UdpLimits::default()).unwrap();
    let client = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    client.connect((Ipv4Addr::LOCALHOST, port)).unwrap();
    let value = vec![b'x'; 3000];
    let mut set = header(1, 0, 1, 0);
    set.extend_from_slice(&[b"set k 0 0 3000\r\n".as_slice(), &value, b"\r\n"].concat());
    client.send(&set).unwrap();
    let mut buf = [0u8; 2048];
    let n = client.recv(&mut buf).unwrap();
    assert_eq!(
        &buf[..n],
        [header(1, 0, 1, 0), b"STORED\r\n".to_vec()].concat()
    );
    // Dropped: a two-datagram request, a runt.
    let mut two = header(2, 0, 2, 0);
    two.extend_from_slice(b"version\r\n");
    client.send(&two).unwrap();
    client.send(b"abc").unwrap();
    let mut get = header(3, 0, 1, 0);
    get.extend_from_slice(b"get k\r\n");
    client.send(&get).unwrap();
    let mut got = Vec::new();
    for seq in 0..3u16 {
        let n = client.recv(&mut buf).unwrap();
        assert!(n <= DATAGRAM_BYTES_MAX);
        let (f, body) = Frame::parse(&buf[..n]).unwrap();
        assert_eq!((f.request_id, f.seq, f.total, f.reserved), (3, seq, 3, 0));
        got.extend_from_slice(body);
    }
    assert_eq!(
        got,
        [b"VALUE k 0 3000\r\n".as_slice(), &value, b"\r\nEND\r\n"].concat()
    );
    let started = Instant::now();
    let totals = server.stop();
    // Woken at once by the shutdown of the sockets, not by the 1 s poll.
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "the stop waited for the poll: {:?}",
        started.elapsed()
    );
    assert_eq!(totals.requests, 2);
    assert_eq!(totals.dropped, 2);
    assert_eq!(totals.sent, 4);
}

#[test]
fn a_port_another_socket_holds_is_refused_unless_shared() {
    let (svc, _) = service(KvConfig::default());
    let first = UdpSockets::bind(&[Ipv4Addr::LOCALHOST.into()], 0, &[0], false).unwrap();
    let port = first.port();
    let ips = [Ipv4Addr::LOCALHOST.into()];
    let e = UdpSockets::bind(&ips, port, &[0], false).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
    assert!(
        e.to_string()
            .contains(&format!("UDP port {port} on 127.0.0.1")),
        "{e}"
    );
    // The wildcard address overlaps it too.
    let any = [Ipv4Addr::UNSPECIFIED.into()];
    assert!(UdpSockets::bind(&any, port, &[0], false).is_err());
    // A successor taking over joins the port (SO_REUSEPORT on both).
    let second = UdpSockets::bind(&ips, port, &[0], true).unwrap();
    assert_eq!(second.port(), port);
    drop((first, second, svc));
}

#[test]
fn proc_net_udp_tables_are_read() {
    let v4 = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
              \x20 12: 0100007F:2BCB 00000000:0000 07 00000000:00000000 00:00000000 00000000  1000        0 4242 2 0000000000000000 0\n\
              \x20 13: 00000000:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4243 2 0000000000000000 0\n";
    assert_eq!(
        super::udp::bound_udp_for_tests(v4),
        [
            "127.0.0.1:11211".parse::<SocketAddr>().unwrap(),
            "0.0.0.0:53".parse().unwrap()
        ]
    );
    let v6 = "  sl  local_address                         remote_address                        st\n\
              \x20  1: 00000000000000000000000001000000:2BCB 00000000000000000000000000000000:0000 07\n";
    assert_eq!(
        super::udp::bound_udp_for_tests(v6),
        ["[::1]:11211".parse::<SocketAddr>().unwrap()]
    );
}
