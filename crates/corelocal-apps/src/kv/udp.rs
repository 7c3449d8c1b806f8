//! memcached's UDP protocol (`serve kv --udp-port`), as memcached 1.6.18 speaks it.
//!
//! A request is one datagram: an 8-byte frame header — request id, sequence number, number of
//! datagrams in the request, reserved; each a big-endian `u16` — then text-protocol commands.
//! Only single-datagram requests are served (a header saying more than one is dropped, as
//! memcached drops them); the other fields are not checked. The commands run through the same
//! engine a TCP connection uses ([`KvConn`], fed the datagram's bytes), so the answers are
//! byte-identical. As memcached, each command's reply is its own message: split into
//! datagrams of at most [`DATAGRAM_BYTES_MAX`] bytes, header included, each carrying the
//! request's id, its sequence number 0…n−1 and n; `quit` is answered by a header alone with
//! n = 0. A line left incomplete at the end of the datagram is dropped; a storage command
//! whose data did not all come in it is answered `CLIENT_ERROR bad data chunk` (memcached
//! keeps the command waiting for the next datagram from anyone on its thread, and answers it
//! under that datagram's id). Replies to one request stop at [`UdpLimits::response_bytes_max`]:
//! the command that would pass it is answered `SERVER_ERROR out of memory writing get
//! response` and the rest of the datagram is dropped (a short request cannot make the server
//! send without bound to a forged source address).
//!
//! [`UdpSockets::bind`] opens one socket per worker CPU and address, all on one port with
//! `SO_REUSEPORT` (the kernel spreads clients over them by address hash, so a thread never
//! shares a socket's queue and wakeups), and [`serve`] runs a thread per socket, pinned to
//! its CPU: it receives a datagram, runs it, and sends the reply's datagrams with
//! `sendmmsg` in batches of at most [`SEND_BATCH`]. memcached instead shares one socket
//! among its worker threads.

use std::io;
use std::io::IoSlice;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use corelocal::runtime::{CloseReason, Handler, Next, Output};
use rustix::net::{
    AddressFamily, MMsgHdr, SendAncillaryBuffer, SendFlags, Shutdown, SocketAddrAny, SocketFlags,
    SocketType,
};

use super::conn::KvConn;
use super::KvService;

/// The frame header's length.
pub const HEADER_BYTES: usize = 8;
/// The largest datagram sent, header included (memcached's `UDP_MAX_PAYLOAD_SIZE`).
pub const DATAGRAM_BYTES_MAX: usize = 1400;
/// The reply bytes one datagram carries at most.
pub const PAYLOAD_BYTES_MAX: usize = DATAGRAM_BYTES_MAX - HEADER_BYTES;
/// The receive buffer: the largest UDP payload (65,507 bytes over IPv4, 65,527 over IPv6)
/// fits, so no request is cut short.
pub const RECEIVE_BYTES: usize = 65_536;
/// Datagrams handed to one `sendmmsg`.
pub const SEND_BATCH: usize = 64;
/// The most a reply to one request may be: its datagrams must be numbered in 16 bits.
pub const RESPONSE_BYTES_LIMIT: usize = PAYLOAD_BYTES_MAX * u16::MAX as usize;
/// How long a socket's thread waits for a datagram before it looks whether it should stop: a
/// backstop (and one wakeup a second when idle), since a stop wakes it at once
/// ([`UdpServer::stop`]).
const STOP_POLL: Duration = Duration::from_secs(1);

/// memcached's reply when a reply would be over [`UdpLimits::response_bytes_max`].
const TOO_LARGE: &[u8] = b"SERVER_ERROR out of memory writing get response\r\n";

/// A frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// Chosen by the client, echoed in each datagram of the reply.
    pub request_id: u16,
    /// This datagram's place in its message, from 0.
    pub seq: u16,
    /// Datagrams in the message.
    pub total: u16,
    /// Reserved: 0 in replies.
    pub reserved: u16,
}

impl Frame {
    /// The header at the start of `datagram` and what follows it; `None` when it is shorter
    /// than a header.
    pub fn parse(datagram: &[u8]) -> Option<(Frame, &[u8])> {
        let (head, body) = datagram.split_first_chunk::<HEADER_BYTES>()?;
        let field = |i: usize| u16::from_be_bytes([head[i], head[i + 1]]);
        let frame = Frame {
            request_id: field(0),
            seq: field(2),
            total: field(4),
            reserved: field(6),
        };
        Some((frame, body))
    }

    /// The header's bytes.
    pub fn to_bytes(self) -> [u8; HEADER_BYTES] {
        let mut b = [0; HEADER_BYTES];
        for (i, v) in [self.request_id, self.seq, self.total, self.reserved]
            .into_iter()
            .enumerate()
        {
            b[2 * i..2 * i + 2].copy_from_slice(&v.to_be_bytes());
        }
        b
    }
}

/// The request id and commands of a datagram memcached serves: one with a header that says
/// the request is this one datagram; `None` for anything else (dropped).
pub fn request(datagram: &[u8]) -> Option<(u16, &[u8])> {
    let (frame, body) = Frame::parse(datagram)?;
    (frame.total == 1).then_some((frame.request_id, body))
}

/// The datagrams of a reply to request `request_id`: each a header and a slice of `reply`
/// of at most [`PAYLOAD_BYTES_MAX`] bytes. An empty reply is a header alone, numbered 0 of 0
/// (memcached's answer to `quit`). `reply` must be at most [`RESPONSE_BYTES_LIMIT`] bytes.
pub fn datagrams(
    request_id: u16,
    reply: &[u8],
) -> impl ExactSizeIterator<Item = ([u8; HEADER_BYTES], &[u8])> {
    assert!(
        reply.len() <= RESPONSE_BYTES_LIMIT,
        "a reply over 65535 datagrams"
    );
    let total = reply.len().div_ceil(PAYLOAD_BYTES_MAX);
    let parts: Box<dyn ExactSizeIterator<Item = &[u8]>> = if reply.is_empty() {
        Box::new(std::iter::once(reply))
    } else {
        Box::new(reply.chunks(PAYLOAD_BYTES_MAX))
    };
    parts.enumerate().map(move |(seq, part)| {
        let frame = Frame {
            request_id,
            seq: seq as u16,
            total: total as u16,
            reserved: 0,
        };
        (frame.to_bytes(), part)
    })
}

/// Bounds of UDP serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpLimits {
    /// Reply bytes to one request at most (at most [`RESPONSE_BYTES_LIMIT`]).
    pub response_bytes_max: usize,
}

impl Default for UdpLimits {
    /// 2 MiB: a get of the largest item at memcached's default `-I 1m`, twice over.
    fn default() -> UdpLimits {
        UdpLimits {
            response_bytes_max: 2 << 20,
        }
    }
}

impl UdpLimits {
    /// Limits that let a get of one item of `item_bytes_max` through (never under the
    /// default, never over [`RESPONSE_BYTES_LIMIT`]).
    pub fn for_items(item_bytes_max: u64) -> UdpLimits {
        let item = usize::try_from(item_bytes_max).unwrap_or(usize::MAX);
        UdpLimits {
            response_bytes_max: item
                .saturating_add(64 << 10)
                .max(UdpLimits::default().response_bytes_max)
                .min(RESPONSE_BYTES_LIMIT),
        }
    }
}

/// The kv engine of one UDP socket: runs a request's commands, one reply per command.
pub struct UdpEngine {
    conn: KvConn,
    out: Output,
    limits: UdpLimits,
}

impl std::fmt::Debug for UdpEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpEngine")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl UdpEngine {
    /// The engine of the socket bound to `local`, served by thread `worker` (its byte counts
    /// go with that worker's): listed in `stats conns` and counted in `curr_connections`
    /// while it lives, as memcached lists and counts its UDP connections.
    pub fn new(
        service: &KvService,
        worker: usize,
        local: SocketAddr,
        limits: UdpLimits,
    ) -> UdpEngine {
        let inner = &service.inner;
        let at = inner.now(Instant::now()).unix;
        let registration = inner.conns.add_udp(worker, local, at);
        UdpEngine {
            conn: KvConn::udp(inner.clone(), worker, registration),
            out: Output::new(),
            limits: UdpLimits {
                response_bytes_max: limits.response_bytes_max.min(RESPONSE_BYTES_LIMIT),
            },
        }
    }

    /// Runs the commands of one request (`body`: the datagram after its header) at `now`;
    /// `reply` gets each command's reply in turn (an empty one: `quit`, a header alone).
    /// Commands with nothing to say (`noreply`) give none.
    pub fn request(&mut self, body: &[u8], now: Instant, mut reply: impl FnMut(&[u8])) {
        let mut rest = body;
        let mut sent = 0;
        while !rest.is_empty() {
            let step = self.conn.on_input(rest, &mut self.out, now);
            rest = &rest[step.consumed.min(rest.len())..];
            if !self.emit(&mut sent, &mut reply) {
                break;
            }
            match step.next {
                // What is left is an incomplete line: dropped with the datagram.
                Next::Read if step.consumed == 0 => break,
                Next::Read => {}
                // `quit` (or an accepted `shutdown`): memcached's empty message.
                Next::Close(CloseReason::Done) => {
                    reply(&[]);
                    break;
                }
                // A cross-protocol line or one over the limits: the rest is dropped.
                Next::Close(_) => break,
            }
        }
        self.conn.end_of_request(&mut self.out);
        self.emit(&mut sent, &mut reply);
    }

    /// Hands the output to `reply` and clears it; false (and memcached's error instead) when
    /// it would take the request's replies past the limit.
    fn emit(&mut self, sent: &mut usize, reply: &mut impl FnMut(&[u8])) -> bool {
        let bytes = self.out.bytes_mut();
        if bytes.is_empty() {
            return true;
        }
        let within = sent.saturating_add(bytes.len()) <= self.limits.response_bytes_max;
        if within {
            *sent += bytes.len();
            reply(bytes);
        } else {
            *sent = usize::MAX;
            reply(TOO_LARGE);
        }
        bytes.clear();
        within
    }
}

/// Bound UDP sockets, not yet served.
#[derive(Debug)]
pub struct UdpSockets {
    /// Each socket with the CPU its thread runs on.
    sockets: Vec<(usize, UdpSocket)>,
    port: u16,
}

impl UdpSockets {
    /// Binds one socket per CPU of `cpus` on each address of `ips`, all on `port` (0: one
    /// the kernel picks for the first, then the same for all), with `SO_REUSEPORT` (an IPv6
    /// address binds IPv6 only, so that `::` and `0.0.0.0` can be given together).
    ///
    /// `SO_REUSEPORT` would let these sockets join another process's on the same port (same
    /// user, `SO_REUSEPORT` too: another server started by mistake) and share its datagrams,
    /// so a port already bound in this network namespace (`/proc/net/udp`, `udp6`) is
    /// refused as `EADDRINUSE`, unless `shared` (a successor taking over from the server
    /// that holds it).
    pub fn bind(ips: &[IpAddr], port: u16, cpus: &[usize], shared: bool) -> io::Result<UdpSockets> {
        if ips.is_empty() || cpus.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "UDP needs an address and a CPU",
            ));
        }
        if port != 0 && !shared {
            for ip in ips {
                if port_in_use(*ip, port) {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!(
                            "UDP port {port} on {ip} is in use by another socket \
                             (`ss -ulnp 'sport = :{port}'` shows who has it)"
                        ),
                    ));
                }
            }
        }
        let mut sockets = Vec::with_capacity(ips.len() * cpus.len());
        let mut port = port;
        for ip in ips {
            for &cpu in cpus {
                let addr = SocketAddr::new(*ip, port);
                let socket = bind_reuseport(addr)
                    .map_err(|e| io::Error::new(e.kind(), format!("binding UDP {addr}: {e}")))?;
                if port == 0 {
                    port = socket.local_addr()?.port();
                }
                sockets.push((cpu, socket));
            }
        }
        Ok(UdpSockets { sockets, port })
    }

    /// The port every socket is bound to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Each socket's address, in the order [`serve`] registers them (`Report::udp`).
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.sockets
            .iter()
            .filter_map(|(_, s)| s.local_addr().ok())
            .collect()
    }

    /// The distinct bound addresses.
    pub fn bound(&self) -> Vec<SocketAddr> {
        let mut out: Vec<SocketAddr> = Vec::new();
        for a in self.addrs() {
            if !out.contains(&a) {
                out.push(a);
            }
        }
        out
    }
}

/// Whether a UDP socket of this network namespace is bound to `port` on `ip`, or on the
/// wildcard address when `ip` is a specific one, or on any address when `ip` is the wildcard.
fn port_in_use(ip: IpAddr, port: u16) -> bool {
    let table = if ip.is_ipv6() {
        "/proc/net/udp6"
    } else {
        "/proc/net/udp"
    };
    let Ok(text) = std::fs::read_to_string(table) else {
        return false;
    };
    bound_udp(&text).iter().any(|a| {
        a.port() == port && (a.ip() == ip || a.ip().is_unspecified() || ip.is_unspecified())
    })
}

/// The local addresses in a `/proc/net/udp` or `udp6` table (addresses as the kernel prints
/// them: each 32-bit word in host order, in hex; the port in hex).
fn bound_udp(table: &str) -> Vec<SocketAddr> {
    let word = |hex: &str| u32::from_str_radix(hex, 16).ok().map(u32::from_be);
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let local = line.split_whitespace().nth(1)?;
            let (addr, port) = local.split_once(':')?;
            let port = u16::from_str_radix(port, 16).ok()?;
            let ip: IpAddr = match addr.len() {
                8 => std::net::Ipv4Addr::from(word(addr)?.to_be_bytes()).into(),
                32 => {
                    let mut bytes = [0u8; 16];
                    for i in 0..4 {
                        bytes[4 * i..4 * i + 4]
                            .copy_from_slice(&word(&addr[8 * i..8 * i + 8])?.to_be_bytes());
                    }
                    std::net::Ipv6Addr::from(bytes).into()
                }
                _ => return None,
            };
            Some(SocketAddr::new(ip, port))
        })
        .collect()
}

#[cfg(test)]
pub(super) fn bound_udp_for_tests(table: &str) -> Vec<SocketAddr> {
    bound_udp(table)
}

fn bind_reuseport(addr: SocketAddr) -> io::Result<UdpSocket> {
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::INET,
        SocketAddr::V6(_) => AddressFamily::INET6,
    };
    let fd = rustix::net::socket_with(family, SocketType::DGRAM, SocketFlags::CLOEXEC, None)?;
    rustix::net::sockopt::set_socket_reuseport(&fd, true)?;
    if addr.is_ipv6() {
        rustix::net::sockopt::set_ipv6_v6only(&fd, true)?;
    }
    rustix::net::bind(&fd, &addr)?;
    Ok(UdpSocket::from(fd))
}

/// What the UDP threads did, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdpTotals {
    /// Requests served.
    pub requests: u64,
    /// Datagrams dropped: shorter than a header, or part of a multi-datagram request.
    pub dropped: u64,
    /// Datagrams sent.
    pub sent: u64,
    /// Datagrams the kernel refused to send (e.g. an unreachable client).
    pub send_errors: u64,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    dropped: AtomicU64,
    sent: AtomicU64,
    send_errors: AtomicU64,
}

/// Serving UDP sockets; [`UdpServer::stop`] (or dropping it) stops the threads.
#[derive(Debug)]
pub struct UdpServer {
    stop: Arc<AtomicBool>,
    sockets: Vec<Arc<UdpSocket>>,
    threads: Vec<JoinHandle<()>>,
    counters: Arc<CountersCell>,
}

/// The counters, shared with the threads (a newtype for `Debug`).
struct CountersCell(Counters);

impl std::fmt::Debug for CountersCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Counters")
    }
}

/// Serves `sockets` with `service`'s engine, a thread per socket pinned to its CPU.
pub fn serve(service: &KvService, sockets: UdpSockets, limits: UdpLimits) -> io::Result<UdpServer> {
    let stop = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(CountersCell(Counters::default()));
    let mut server = UdpServer {
        stop: stop.clone(),
        sockets: Vec::new(),
        threads: Vec::new(),
        counters: counters.clone(),
    };
    for (i, (cpu, socket)) in sockets.sockets.into_iter().enumerate() {
        socket.set_read_timeout(Some(STOP_POLL))?;
        let local = socket.local_addr()?;
        let socket = Arc::new(socket);
        let engine = UdpEngine::new(service, i, local, limits);
        let (stop, counters, sock) = (stop.clone(), counters.clone(), socket.clone());
        let thread = std::thread::Builder::new()
            .name(format!("kv-udp-{cpu}"))
            .spawn(move || {
                // Best effort: an unpinned thread still serves.
                let _ = corelocal::cpu::pin_current_thread(&corelocal::cpu::CpuSet::single(cpu));
                run(&sock, engine, &stop, &counters.0);
            })?;
        server.sockets.push(socket);
        server.threads.push(thread);
    }
    Ok(server)
}

impl UdpServer {
    /// Stops receiving, lets each thread finish the request in hand, closes the sockets and
    /// returns what was done. Datagrams still queued in the sockets are dropped (as the
    /// kernel drops them when any UDP socket closes).
    pub fn stop(mut self) -> UdpTotals {
        self.stop_threads();
        self.totals()
    }

    /// What was done so far.
    pub fn totals(&self) -> UdpTotals {
        let c = &self.counters.0;
        UdpTotals {
            requests: c.requests.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            sent: c.sent.load(Ordering::Relaxed),
            send_errors: c.send_errors.load(Ordering::Relaxed),
        }
    }

    fn stop_threads(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for s in &self.sockets {
            // Wakes a thread blocked in recvfrom at once (Linux wakes readers of a UDP
            // socket shut down, unconnected as it is; it says ENOTCONN all the same).
            let _ = rustix::net::shutdown(&**s, Shutdown::Read);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.sockets.clear();
    }
}

impl Drop for UdpServer {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

/// One socket's thread: receive, run, reply, until told to stop.
fn run(socket: &UdpSocket, mut engine: UdpEngine, stop: &AtomicBool, counters: &Counters) {
    let mut buf = vec![0u8; RECEIVE_BYTES];
    let mut sender = Sender::default();
    while !stop.load(Ordering::Relaxed) {
        let (n, peer) = match socket.recv_from(&mut buf) {
            Ok(got) => got,
            Err(e) => {
                if !matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) {
                    // E.g. a queued ICMP error: nothing to do but go on (not a busy loop:
                    // the error is consumed).
                    std::thread::sleep(Duration::from_millis(1));
                }
                continue;
            }
        };
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let Some((id, body)) = request(&buf[..n]) else {
            counters.dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        counters.requests.fetch_add(1, Ordering::Relaxed);
        let to = SocketAddrAny::from(peer);
        engine.request(body, Instant::now(), |reply| {
            let (sent, failed) = sender.send(socket, (peer, &to), id, reply);
            counters.sent.fetch_add(sent, Ordering::Relaxed);
            counters.send_errors.fetch_add(failed, Ordering::Relaxed);
        });
    }
}

/// Sends replies: one datagram with `sendto` from a reused buffer, more with `sendmmsg`,
/// [`SEND_BATCH`] datagrams at a time (header and payload as two slices, no copy).
#[derive(Default)]
struct Sender {
    one: Vec<u8>,
    headers: Vec<[u8; HEADER_BYTES]>,
}

impl Sender {
    /// Sends `reply`'s datagrams to `to` (as std and as rustix address it); returns (sent,
    /// failed).
    fn send(
        &mut self,
        socket: &UdpSocket,
        (peer, to): (SocketAddr, &SocketAddrAny),
        id: u16,
        reply: &[u8],
    ) -> (u64, u64) {
        if reply.len() <= PAYLOAD_BYTES_MAX {
            self.one.clear();
            for (header, payload) in datagrams(id, reply) {
                self.one.extend_from_slice(&header);
                self.one.extend_from_slice(payload);
            }
            return match socket.send_to(&self.one, peer) {
                Ok(_) => (1, 0),
                Err(_) => (0, 1),
            };
        }
        let parts: Vec<&[u8]> = datagrams(id, reply)
            .map(|(h, p)| {
                self.headers.push(h);
                p
            })
            .collect();
        let (mut sent, mut failed) = (0, 0);
        let mut at = 0;
        while at < parts.len() {
            let end = (at + SEND_BATCH).min(parts.len());
            let iovs: Vec<[IoSlice<'_>; 2]> = (at..end)
                .map(|i| [IoSlice::new(&self.headers[i]), IoSlice::new(parts[i])])
                .collect();
            let mut controls: Vec<SendAncillaryBuffer<'_, '_, '_>> =
                (at..end).map(|_| SendAncillaryBuffer::default()).collect();
            let mut msgs: Vec<MMsgHdr<'_>> = iovs
                .iter()
                .zip(controls.iter_mut())
                .map(|(iov, control)| MMsgHdr::new_with_addr(to, iov, control))
                .collect();
            match rustix::net::sendmmsg(socket, &mut msgs, SendFlags::empty()) {
                Ok(0) => {
                    failed += (end - at) as u64;
                    break;
                }
                Ok(n) => {
                    sent += n as u64;
                    at += n;
                }
                Err(rustix::io::Errno::INTR) => {}
                // The first datagram failed (the rest were not tried): count it and go on
                // with the next, as a client may still take the others.
                Err(_) => {
                    failed += 1;
                    at += 1;
                }
            }
        }
        self.headers.clear();
        (sent, failed)
    }
}
