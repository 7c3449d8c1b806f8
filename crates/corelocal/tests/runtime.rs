//! Behaviour of the runtime over real sockets, with a tiny line protocol as the service:
//! `PING\n` → `PONG\n`, `BIG n\n` → n bytes, `QUIT\n` → close, `OPT ok|bad|last\n` → `A`,
//! socket options, `B\n`; `STOP\n` → `S`, a receive stop, `STOPPED <unread>\n`, an option,
//! `R\n`; `CTL ok|bad\n` → `A`, `ctl` with a control message, `B\n`; anything
//! else → `ERR\n` and close as a bad request.

use corelocal::cpu::{current_affinity, pin_current_thread, CpuSet};
use corelocal::listen::{GroupConfig, ListenerGroup, Mode, Steering};
use corelocal::runtime::{
    BackendKind, CloseReason, ConnInfo, ControlMessage, FileRegion, Handler, Limits, Output,
    Server, ServerConfig, Service, SocketOption, Step,
};
use corelocal::sys::scm;
use corelocal::testing::read_up_to;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// A line protocol; with `announce`, a stopping server answers the next PING with
/// "PONG BYE" and closes (like HTTP's `Connection: close`).
#[derive(Default)]
struct Lines {
    announce: bool,
}
struct LineConn {
    announce: bool,
    draining: bool,
}

/// A 1 MB file of a known pattern (`i % 251` at offset `i`), made once per test process. One
/// name for every run (not one per process, which filled /tmp): written beside it and renamed
/// into place, so concurrent test processes only ever see the whole file.
fn test_file() -> std::path::PathBuf {
    static MADE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    MADE.get_or_init(|| {
        let path = std::env::temp_dir().join("corelocal-rt-pattern-1mb.bin");
        let part = std::env::temp_dir().join(format!("corelocal-rt-{}.part", std::process::id()));
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&part, data).unwrap();
        std::fs::rename(&part, &path).unwrap();
        path
    })
    .clone()
}

impl Handler for LineConn {
    fn on_input(&mut self, input: &[u8], out: &mut Output, _now: Instant) -> Step {
        let Some(end) = input.iter().position(|&b| b == b'\n') else {
            return Step::read(0, 0);
        };
        let line = &input[..end];
        let consumed = end + 1;
        if line == b"PING" && self.draining {
            out.write(b"PONG BYE\n");
            Step::close(consumed, 1, CloseReason::Done)
        } else if line == b"PING" {
            out.write(b"PONG\n");
            Step::read(consumed, 1)
        } else if line == b"PANIC" {
            panic!("the test asked this handler to panic");
        } else if line == b"QUIT" {
            Step::close(consumed, 1, CloseReason::Done)
        } else if line == b"FILE" {
            out.write(b"<");
            out.push_file(FileRegion {
                file: Arc::new(std::fs::File::open(test_file()).unwrap()),
                offset: 1000,
                len: 600_000,
            });
            out.write(b">");
            Step::read(consumed, 1)
        } else if let Some(kind) = line.strip_prefix(b"CTL ") {
            // A control message TCP ignores (not SOL_SOCKET), or one it refuses (EINVAL).
            let (level, kind) = match kind {
                b"bad" => (libc::SOL_SOCKET, 9999),
                _ => (282, 1),
            };
            out.write(b"A");
            let data = vec![21];
            out.push_control_message(ControlMessage { level, kind, data }, b"ctl".to_vec());
            out.write(b"B\n");
            Step::read(consumed, 1)
        } else if let Some(kind) = line.strip_prefix(b"OPT ") {
            // Bytes, socket options set once they are sent, bytes after them.
            out.write(b"A");
            out.push_socket_options(vec![test_option(kind)]);
            out.write(b"B\n");
            match kind {
                b"last" => Step::close(consumed, 1, CloseReason::Done),
                _ => Step::read(consumed, 1),
            }
        } else if line == b"STOP" {
            // A receive stop: `on_recv_stopped` answers with what was left unread.
            out.write(b"S");
            out.stop_receiving();
            Step::read(consumed, 1)
        } else if let Some(n) = line.strip_prefix(b"BIG ") {
            let n: usize = std::str::from_utf8(n).unwrap().parse().unwrap();
            out.write(&vec![b'b'; n]);
            Step::read(consumed, 1)
        } else {
            out.write(b"ERR\n");
            Step::close(consumed, 0, CloseReason::BadRequest)
        }
    }

    fn on_drain(&mut self) -> bool {
        self.draining = self.announce;
        self.announce
    }

    fn on_recv_stopped(&mut self, input: &[u8], out: &mut Output, _now: Instant) {
        out.write(format!("STOPPED {}\n", String::from_utf8_lossy(input)).as_bytes());
        out.push_socket_options(vec![test_option(b"ok")]);
        out.write(b"R\n");
    }

    fn on_input_limit(&mut self, _input: &[u8], out: &mut Output, _now: Instant) {
        out.write(b"ERR too large\n");
    }

    fn on_idle_close(&mut self, out: &mut Output) {
        // Only the announcing flavour says goodbye: the plain one's idle close stays silent.
        if self.announce {
            out.write(b"IDLE BYE\n");
        }
    }
}

/// `bad`: a ULP no kernel has (ENOENT); else `TCP_NODELAY` on.
fn test_option(kind: &[u8]) -> SocketOption {
    if kind == b"bad" {
        SocketOption {
            level: libc::SOL_TCP,
            name: libc::TCP_ULP,
            value: b"nonexistent-ulp".to_vec(),
        }
    } else {
        SocketOption {
            level: libc::SOL_TCP,
            name: libc::TCP_NODELAY,
            value: 1i32.to_ne_bytes().to_vec(),
        }
    }
}

impl Service for Lines {
    type Conn = LineConn;
    fn name(&self) -> &'static str {
        "lines"
    }
    fn connect(&self, _info: &ConnInfo) -> LineConn {
        LineConn {
            announce: self.announce,
            draining: false,
        }
    }
}

fn cpus() -> CpuSet {
    current_affinity().unwrap()
}

fn start_with(backend: BackendKind, mode: Mode, limits: Limits) -> Server {
    let mut config = ServerConfig::new(vec!["127.0.0.1:0".parse().unwrap()], &cpus(), mode);
    config.limits = limits;
    config.backend = backend;
    let server = Server::start(config, Arc::new(Lines::default())).unwrap();
    let expected = match backend {
        BackendKind::Uring => "uring",
        _ => "epoll",
    };
    assert_eq!(server.backend(), expected);
    server
}

fn start(backend: BackendKind) -> Server {
    start_with(backend, Mode::Local, Limits::default())
}

fn addr(s: &Server) -> SocketAddr {
    s.local_addrs()[0]
}

fn connect(a: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(a).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

fn read_to_end(mut s: TcpStream) -> Vec<u8> {
    let mut v = Vec::new();
    let _ = s.read_to_end(&mut v);
    v
}

/// Polls until `cond` holds on the server's stats (bounded).
fn eventually(server: &Server, cond: impl Fn(&corelocal::runtime::Snapshot) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if cond(&server.stats()) {
            return;
        }
        thread::sleep(Duration::from_millis(10));
    }
    panic!("condition not reached: {:?}", server.stats());
}

fn stop(server: Server) {
    server.stop();
    server.join().unwrap();
}

fn serves_keep_alive_requests_on_many_connections(backend: BackendKind) {
    let server = start(backend);
    let a = addr(&server);
    let clients: Vec<_> = (0..8)
        .map(|_| {
            thread::spawn(move || {
                let mut s = connect(a);
                let mut r = BufReader::new(s.try_clone().unwrap());
                for _ in 0..100 {
                    s.write_all(b"PING\n").unwrap();
                    let mut line = String::new();
                    r.read_line(&mut line).unwrap();
                    assert_eq!(line, "PONG\n");
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    eventually(&server, |s| {
        s.total.requests == 800 && s.total.accepted == 8
    });
    assert_eq!(server.stats().total.errors.total(), 0);
    stop(server);
}

fn pipelined_requests_are_answered_in_order(backend: BackendKind) {
    let server = start(backend);
    let mut s = connect(addr(&server));
    s.write_all(b"PING\nPING\nBIG 3\nPING\nQUIT\n").unwrap();
    assert_eq!(read_to_end(s), b"PONG\nPONG\nbbbPONG\n");
    stop(server);
}

/// A handler that answers one request per `on_input` call (`LineConn`) gets every request of
/// one pipelined write answered, however many, without more input coming: what is left after
/// the worker's handler rounds for one go runs at its next turn, as a yield's does. (Before,
/// 300 pipelined requests got 256 answers and the rest waited for more input.)
fn every_pipelined_request_is_answered_without_more_input(backend: BackendKind) {
    let server = start(backend);
    let mut s = connect(addr(&server));
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    for count in [300, 5_000] {
        s.write_all(&b"PING\n".repeat(count)).unwrap();
        let got = read_up_to(&mut s, 5 * count);
        assert_eq!(
            got.len() / 5,
            count,
            "answers to {count} pipelined requests"
        );
        assert!(got == b"PONG\n".repeat(count), "answers differ");
    }
    s.write_all(b"QUIT\n").unwrap();
    assert_eq!(read_to_end(s), b"");
    eventually(&server, |st| st.total.requests == 5_301);
    stop(server);
}

fn garbage_closes_that_connection_counts_an_error_and_others_keep_working(backend: BackendKind) {
    let server = start(backend);
    let a = addr(&server);
    let mut good = connect(a);
    let mut bad = connect(a);
    bad.write_all(b"\x00\x01garbage\n").unwrap();
    assert_eq!(read_to_end(bad), b"ERR\n");
    good.write_all(b"PING\nQUIT\n").unwrap();
    assert_eq!(read_to_end(good), b"PONG\n");
    eventually(&server, |s| s.total.errors.bad_request == 1);
    stop(server);
}

fn oversized_input_closes_that_connection_with_too_large(backend: BackendKind) {
    let limits = Limits {
        input_bytes_max: 4096,
        ..Limits::default()
    };
    let server = start_with(backend, Mode::Local, limits);
    let a = addr(&server);
    let mut bad = connect(a);
    // No newline ever: the input buffer fills without progress.
    let _ = bad.write_all(&[b'a'; 20_000]);
    let _ = read_to_end(bad);
    eventually(&server, |s| s.total.errors.too_large == 1);
    let mut good = connect(a);
    good.write_all(b"PING\nQUIT\n").unwrap();
    assert_eq!(read_to_end(good), b"PONG\n");
    stop(server);
}

/// Input past the limit without progress: the handler's answer (`Handler::on_input_limit`)
/// reaches the client before the close, though the client is still sending.
fn input_past_the_limit_is_answered_before_the_close(backend: BackendKind) {
    let limits = Limits {
        input_bytes_max: 4096,
        ..Limits::default()
    };
    let server = start_with(backend, Mode::Local, limits);
    let mut bad = connect(addr(&server));
    let _ = bad.write_all(&[b'a'; 20_000]);
    assert_eq!(read_to_end(bad), b"ERR too large\n");
    eventually(&server, |s| s.total.errors.too_large == 1);
    stop(server);
}

fn idle_connections_time_out(backend: BackendKind) {
    let limits = Limits {
        idle_timeout: Duration::from_millis(200),
        ..Limits::default()
    };
    let server = start_with(backend, Mode::Local, limits);
    let s = connect(addr(&server));
    let started = Instant::now();
    assert_eq!(read_to_end(s), b"");
    assert!(started.elapsed() >= Duration::from_millis(150));
    eventually(&server, |s| {
        s.total.errors.idle_timeout == 1 && s.total.open == 0
    });
    stop(server);
}

/// `Handler::on_idle_close`: what the handler says at the idle timeout reaches the client,
/// then the connection closes; it still counts as an idle timeout.
fn the_idle_close_sends_the_handlers_last_word(backend: BackendKind) {
    let mut config = ServerConfig::new(vec!["127.0.0.1:0".parse().unwrap()], &cpus(), Mode::Local);
    config.backend = backend;
    config.limits.idle_timeout = Duration::from_millis(200);
    let server = Server::start(config, Arc::new(Lines { announce: true })).unwrap();
    let mut s = connect(addr(&server));
    s.write_all(b"PING\n").unwrap();
    assert_eq!(read_to_end(s), b"PONG\nIDLE BYE\n");
    eventually(&server, |s| {
        s.total.errors.idle_timeout == 1 && s.total.open == 0
    });
    stop(server);
}

fn large_responses_to_a_slow_reader_arrive_whole(backend: BackendKind) {
    let limits = Limits {
        output_bytes_max: 64 * 1024,
        ..Limits::default()
    };
    let server = start_with(backend, Mode::Local, limits);
    let mut s = connect(addr(&server));
    // 40 requests of 200 KB each, pipelined; read slowly.
    let requests: Vec<u8> = b"BIG 200000\n".repeat(40);
    s.write_all(&requests).unwrap();
    s.write_all(b"QUIT\n").unwrap();
    let mut total = 0usize;
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                assert!(buf[..n].iter().all(|&b| b == b'b'));
                total += n;
                if total < 100_000 {
                    thread::sleep(Duration::from_millis(1));
                }
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(total, 40 * 200_000);
    stop(server);
}

fn file_regions_are_sent_in_order_with_the_bytes_around_them(backend: BackendKind) {
    let server = start(backend);
    let mut s = connect(addr(&server));
    s.write_all(b"FILE\nPING\nFILE\nQUIT\n").unwrap();
    let got = read_to_end(s);
    let region: Vec<u8> = (1000..601_000u32).map(|i| (i % 251) as u8).collect();
    let mut want = Vec::new();
    for part in [&b"<"[..], &region, b">PONG\n<", &region, b">"] {
        want.extend_from_slice(part);
    }
    assert_eq!(got.len(), want.len());
    assert!(got == want, "file bytes differ");
    stop(server);
}

/// Socket options a handler pushes are set between the bytes before and after them: the
/// connection goes on when they are set (also as its last output, closing after), and
/// closes after the bytes before them when one fails, counted as an I/O error.
fn socket_options_are_set_between_two_parts_of_the_output(backend: BackendKind) {
    let server = start(backend);
    let mut s = connect(addr(&server));
    s.write_all(b"OPT ok\nPING\nOPT last\n").unwrap();
    assert_eq!(read_to_end(s), b"AB\nPONG\nAB\n");
    let errors_before = server.stats().total.errors.io;
    let mut s = connect(addr(&server));
    s.write_all(b"OPT bad\nPING\n").unwrap();
    assert_eq!(read_to_end(s), b"A", "nothing after the option that failed");
    eventually(&server, |st| st.total.errors.io > errors_before);
    let mut s = connect(addr(&server));
    s.write_all(b"PING\nQUIT\n").unwrap();
    assert_eq!(read_to_end(s), b"PONG\n", "the worker serves on");
    stop(server);
}

/// A handler's receive stop: it is told once reading stopped, with the input not consumed
/// then (a partial line), its socket options are set, and reading resumes after them —
/// nothing lost or reordered, several stops in a row on one connection.
fn a_receive_stop_tells_the_handler_and_reading_resumes(backend: BackendKind) {
    let server = start(backend);
    let mut s = connect(addr(&server));
    let mut reader = BufReader::new(s.try_clone().unwrap());
    for round in 0..3 {
        // One write, one segment on loopback: "PI" is read before the stop takes effect.
        s.write_all(b"STOP\nPI").unwrap();
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert_eq!(line, "SSTOPPED PI\n", "round {round}");
        line.clear();
        reader.read_line(&mut line).unwrap();
        assert_eq!(line, "R\n");
        s.write_all(b"NG\nPING\n").unwrap();
        for _ in 0..2 {
            line.clear();
            reader.read_line(&mut line).unwrap();
            assert_eq!(line, "PONG\n", "round {round}: reading resumed");
        }
    }
    s.write_all(b"STOP\nQUIT\n").unwrap();
    let mut rest = Vec::new();
    let _ = reader.read_to_end(&mut rest);
    assert_eq!(rest, b"S", "a connection closing is not told of its stop");
    let mut s = connect(addr(&server));
    s.write_all(b"PING\nQUIT\n").unwrap();
    assert_eq!(read_to_end(s), b"PONG\n", "the worker serves on");
    stop(server);
}

/// Bytes with a control message go between the bytes before and after them, through
/// `sendmsg` with the control message (a kind the kernel refuses closes the connection after
/// the bytes before it, counted as an I/O error).
fn control_messages_go_with_their_bytes_in_order(backend: BackendKind) {
    let server = start(backend);
    let mut s = connect(addr(&server));
    s.write_all(b"CTL ok\nPING\nCTL ok\nQUIT\n").unwrap();
    assert_eq!(read_to_end(s), b"ActlB\nPONG\nActlB\n");
    let errors_before = server.stats().total.errors.io;
    let mut s = connect(addr(&server));
    s.write_all(b"CTL bad\nPING\n").unwrap();
    assert_eq!(
        read_to_end(s),
        b"A",
        "nothing after the message the kernel refused"
    );
    eventually(&server, |st| st.total.errors.io > errors_before);
    stop(server);
}

/// One receive buffer for eight clients sending at once: io_uring receives run out of provided
/// buffers (ENOBUFS), wait, and are re-armed; every request is still answered.
fn starved_receives_recover(backend: BackendKind) {
    let limits = Limits {
        recv_bufs: 1,
        recv_buf_bytes: 64,
        ..Limits::default()
    };
    let server = start_with(backend, Mode::Local, limits);
    let a = addr(&server);
    let clients: Vec<_> = (0..8)
        .map(|_| {
            thread::spawn(move || {
                let mut s = connect(a);
                let mut r = BufReader::new(s.try_clone().unwrap());
                for _ in 0..50 {
                    s.write_all(&b"PING\n".repeat(20)).unwrap();
                    for _ in 0..20 {
                        let mut line = String::new();
                        r.read_line(&mut line).unwrap();
                        assert_eq!(line, "PONG\n");
                    }
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    eventually(&server, |s| s.total.requests == 8 * 50 * 20);
    let batching = server.stats().total.batching;
    if backend == BackendKind::Uring {
        assert!(batching.recv_starved > 0, "no ENOBUFS seen: {batching:?}");
        assert!(batching.rearms >= batching.recv_starved, "{batching:?}");
    }
    stop(server);
}

/// A protocol that announces the close gets the next request of an idle keep-alive
/// connection answered (with the announcement) instead of a close racing that request; a
/// connection that stays silent is closed after the grace, so the stop still ends promptly.
fn graceful_stop_answers_announced_keep_alive_requests(backend: BackendKind) {
    let mut config = ServerConfig::new(vec!["127.0.0.1:0".parse().unwrap()], &cpus(), Mode::Local);
    config.backend = backend;
    let server = Server::start(config, Arc::new(Lines { announce: true })).unwrap();
    let (mut active, silent) = (connect(addr(&server)), connect(addr(&server)));
    active.write_all(b"PING\n").unwrap();
    let mut pong = [0u8; 5];
    active.read_exact(&mut pong).unwrap();
    assert_eq!(&pong, b"PONG\n");
    eventually(&server, |st| st.total.open == 2);
    let t = Instant::now();
    server.stop();
    thread::sleep(Duration::from_millis(300)); // a think time, well within the grace
    active.write_all(b"PING\n").unwrap();
    assert_eq!(read_to_end(active), b"PONG BYE\n");
    server.join().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "stop waited past the keep-alive grace"
    );
    assert_eq!(read_to_end(silent), b"");
}

fn graceful_stop_closes_idle_connections_and_exits(backend: BackendKind) {
    let server = start(backend);
    let s = connect(addr(&server));
    eventually(&server, |st| st.total.open == 1);
    let t = Instant::now();
    stop(server);
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "stop waited for the idle connection"
    );
    assert_eq!(read_to_end(s), b"");
}

fn local_mode_workers_accept_their_own_cpus_connections(backend: BackendKind) {
    let all: Vec<usize> = cpus().iter().collect();
    if all.len() < 2 {
        eprintln!("skipping: needs 2 CPUs");
        return;
    }
    for steering in [Steering::IncomingCpu, Steering::Cbpf] {
        let mut config =
            ServerConfig::new(vec!["127.0.0.1:0".parse().unwrap()], &cpus(), Mode::Local);
        config.listen.steering = Some(steering);
        config.backend = backend;
        let server = Server::start(config, Arc::new(Lines::default())).unwrap();
        let a = addr(&server);
        for &cpu in &all[..2] {
            thread::spawn(move || {
                pin_current_thread(&CpuSet::single(cpu)).unwrap();
                for _ in 0..100 {
                    let mut s = connect(a);
                    s.write_all(b"QUIT\n").unwrap();
                    let _ = read_to_end(s);
                }
            })
            .join()
            .unwrap();
        }
        eventually(&server, |s| s.total.accepted == 200);
        let stats = server.stats();
        assert!(stats.locality() >= 0.99, "{steering}: {stats:?}");
        for w in &stats.workers[..2] {
            assert_eq!(w.accepted, 100, "{steering}: {stats:?}");
        }
        stop(server);
    }
}

fn stock_mode_serves_from_one_shared_socket(backend: BackendKind) {
    let server = start_with(backend, Mode::Stock, Limits::default());
    for _ in 0..50 {
        let mut s = connect(addr(&server));
        s.write_all(b"PING\nQUIT\n").unwrap();
        assert_eq!(read_to_end(s), b"PONG\n");
    }
    eventually(&server, |s| s.total.accepted == 50);
    stop(server);
}

/// What a successor process receives over SCM_RIGHTS: the same sockets, its own descriptors.
fn successor_of(server: &Server) -> ListenerGroup {
    let (layout, raws) = server.listeners().handover_sockets().unwrap();
    let (a, b) = scm::seqpacket_pair().unwrap();
    scm::send_with_fds(a.as_raw_fd(), b"sockets", &raws).unwrap();
    let (_, fds) = scm::recv_with_fds(b.as_raw_fd(), &mut [0u8; 16], raws.len()).unwrap();
    let config = GroupConfig::new(
        layout.addrs.clone(),
        layout.worker_cpus.clone(),
        layout.mode,
    );
    ListenerGroup::adopt(config, &layout, fds).unwrap()
}

/// Released (the listeners belong to a successor now), a server stops accepting at once —
/// every armed accept, the balancer's budgeted one-shot accepts included — and leaves new
/// connections in the shared queue for the successor; it serves what it accepted, then exits.
fn a_released_server_leaves_the_shared_queue_to_its_successor(backend: BackendKind) {
    let cpu = cpus().iter().next().unwrap();
    let mut config = ServerConfig::new(
        vec!["127.0.0.1:0".parse().unwrap()],
        &CpuSet::single(cpu),
        Mode::Fine,
    );
    config.backend = backend;
    config.balance = Some(corelocal::balance::BalanceConfig::new(1));
    config.limits.drain_timeout = Duration::from_secs(3);
    let server = Server::start(config, Arc::new(Lines::default())).unwrap();
    let successor = successor_of(&server);
    let a = addr(&server);
    // A request in progress keeps the old server draining while the test looks.
    let mut busy = connect(a);
    busy.write_all(b"PIN").unwrap();
    eventually(&server, |s| s.total.accepted == 1);
    server.release_handle().release();
    thread::sleep(Duration::from_millis(200));
    let queued: Vec<TcpStream> = (0..5).map(|_| connect(a)).collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while successor.queued_total() < 5 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    thread::sleep(Duration::from_millis(200));
    assert_eq!(
        successor.queued_total(),
        5,
        "the old server took from the queue"
    );
    assert_eq!(server.stats().total.accepted, 1);
    busy.write_all(b"G\n").unwrap();
    assert_eq!(read_to_end(busy), b"PONG\n", "what it accepted is served");
    let started = Instant::now();
    let (result, report) = server.join_report();
    result.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "exit waited for the drain deadline"
    );
    assert!(
        report.handed_over && report.lost_at_close == 0,
        "{report:?}"
    );
    // The successor finds all five waiting, none reset.
    let listener = successor.listeners(0)[0];
    for mut s in queued {
        let accepted = loop {
            match corelocal::listen::accept(listener) {
                Ok(c) => break c,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    thread::sleep(Duration::from_millis(5))
                }
                Err(e) => panic!("accept: {e}"),
            }
        };
        drop(accepted);
        assert_eq!(
            s.read(&mut [0u8; 1]).unwrap(),
            0,
            "closed cleanly, not reset"
        );
    }
}

/// A worker whose loop ends on its own (here its handler panics) is reported by
/// `Server::exited_worker` (the CLI then stops the server: its listener has nobody accepting),
/// and the join says so; a stopping server's workers are not reported.
fn a_worker_that_ends_on_its_own_is_reported(backend: BackendKind) {
    let server = start(backend);
    assert_eq!(server.exited_worker(), None);
    let mut c = connect(addr(&server));
    c.write_all(b"PANIC\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.exited_worker().is_none() {
        assert!(Instant::now() < deadline, "the worker's end was not seen");
        std::thread::sleep(Duration::from_millis(10));
    }
    server.stop();
    assert_eq!(server.exited_worker(), None, "stopping: nothing to report");
    let err = server.join().expect_err("a worker panicked");
    assert!(err.to_string().contains("panicked"), "{err}");
}

/// `Server::run_until_signal` does not serve on with a dead worker: a handler's panic stops
/// the server, and the call returns that worker's error instead of waiting for a signal that
/// may never come.
fn run_until_signal_returns_when_a_worker_ends_on_its_own(backend: BackendKind) {
    let mut config = ServerConfig::new(vec!["127.0.0.1:0".parse().unwrap()], &cpus(), Mode::Local);
    config.backend = backend;
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let client = std::thread::spawn(move || {
        let mut c = connect(addr_rx.recv().unwrap());
        c.write_all(b"PANIC\n").unwrap();
        read_to_end(c)
    });
    let result = Server::run_until_signal(config, Arc::new(Lines::default()), |server| {
        addr_tx.send(addr(server)).unwrap();
    });
    let err = result.expect_err("a worker panicked: the call must fail, not serve on");
    assert!(err.to_string().contains("panicked"), "{err}");
    assert_eq!(
        client.join().unwrap(),
        b"",
        "the panicking connection got no answer"
    );
}

// Every behaviour above, on each backend.
/// Two addresses, the balancer on, every connection to the second: its listener keeps
/// accepting (its allowance was once topped up only when the sum over both ran low, and the
/// idle first one's half kept it from ever running low: the second stopped after 8).
fn a_second_address_keeps_accepting_when_only_it_is_used(backend: BackendKind) {
    let addrs = vec!["127.0.0.1:0".parse().unwrap(); 2];
    let mut config = ServerConfig::recommended(addrs, &cpus());
    config.listen.defer_accept_s = None;
    config.backend = backend;
    let server = Server::start(config, Arc::new(Lines::default())).unwrap();
    let second = server.local_addrs()[1];
    for _ in 0..64 {
        let mut s = connect(second);
        s.write_all(b"PING\n").unwrap();
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).unwrap();
        assert_eq!(line, "PONG\n");
    }
    stop(server);
}

corelocal::on_every_backend!(
    a_second_address_keeps_accepting_when_only_it_is_used,
    starved_receives_recover,
    file_regions_are_sent_in_order_with_the_bytes_around_them,
    socket_options_are_set_between_two_parts_of_the_output,
    a_receive_stop_tells_the_handler_and_reading_resumes,
    control_messages_go_with_their_bytes_in_order,
    serves_keep_alive_requests_on_many_connections,
    pipelined_requests_are_answered_in_order,
    every_pipelined_request_is_answered_without_more_input,
    garbage_closes_that_connection_counts_an_error_and_others_keep_working,
    oversized_input_closes_that_connection_with_too_large,
    input_past_the_limit_is_answered_before_the_close,
    idle_connections_time_out,
    the_idle_close_sends_the_handlers_last_word,
    large_responses_to_a_slow_reader_arrive_whole,
    graceful_stop_closes_idle_connections_and_exits,
    graceful_stop_answers_announced_keep_alive_requests,
    local_mode_workers_accept_their_own_cpus_connections,
    stock_mode_serves_from_one_shared_socket,
    a_released_server_leaves_the_shared_queue_to_its_successor,
    a_worker_that_ends_on_its_own_is_reported,
    run_until_signal_returns_when_a_worker_ends_on_its_own
);

/// A worker CPU that is not online stops `Server::start` before any worker starts, with an
/// error naming that CPU and the usable ones; a zero limit is a `Limits` error, not a listen
/// error.
#[test]
fn unusable_cpus_and_zero_limits_are_typed_start_errors() {
    let mut asked = cpus();
    asked.insert(corelocal::cpu::CPU_ID_MAX);
    let config = ServerConfig::new(vec!["127.0.0.1:0".parse().unwrap()], &asked, Mode::Fine);
    match Server::start(config, Arc::new(Lines::default())) {
        Err(e @ corelocal::runtime::ServerError::Cpus(_)) => {
            let text = e.to_string();
            assert!(text.contains("CPU 8191 is not online"), "{text}");
            assert!(text.contains("CPUs this process can use: "), "{text}");
        }
        Err(e) => panic!("expected a CPU error, got {e}"),
        Ok(_) => panic!("started on CPU 8191"),
    }
    let mut config = ServerConfig::new(vec!["127.0.0.1:0".parse().unwrap()], &cpus(), Mode::Fine);
    config.limits.idle_timeout = Duration::ZERO;
    match Server::start(config, Arc::new(Lines::default())) {
        Err(corelocal::runtime::ServerError::Limits(e)) => assert_eq!(e.field, "idle_timeout"),
        Err(e) => panic!("expected a Limits error, got {e}"),
        Ok(_) => panic!("started with a zero idle timeout"),
    }
}
