//! The traffic generator: one thread in the generator namespace, optionally pinned, sending
//! small UDP datagrams with `sendmmsg(2)` to `flows` destinations (a different address and
//! port each, so the flow hash that RPS and the veth's TX queue choice use spreads them),
//! as fast as it can or paced to a rate.

use crate::sys;
use corelocal::cpu::CpuSet;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Ethernet + IPv4 + UDP headers: a frame is this plus the payload (plus a 4-byte FCS on a
/// real wire, which a veth does not carry).
pub const HEADERS: usize = 14 + 20 + 8;
/// The smallest frame asked for (64 bytes on the wire with FCS: 18 bytes of payload).
pub const FRAME_MIN: usize = 64;
/// The largest frame.
pub const FRAME_MAX: usize = 1518;
/// The most datagrams per `sendmmsg`.
pub const BATCH_MAX: usize = 1024;
/// The most flows.
pub const FLOWS_MAX: usize = 65_536;
/// The longest one `sendmmsg` may block on a full send buffer before the stop flag is
/// checked again.
const SEND_TIMEOUT: Duration = Duration::from_millis(100);

/// What to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenSpec {
    /// Namespace to send from.
    pub netns: String,
    /// CPU to pin the sending thread to.
    pub cpu: Option<usize>,
    /// Source address (bound).
    pub src: Ipv4Addr,
    /// Distinct destinations (address, port).
    pub flows: usize,
    /// Frame size on the wire, FCS included (payload = frame − 46).
    pub frame: usize,
    /// Datagrams per `sendmmsg`.
    pub batch: usize,
    /// Datagrams per second; 0 = as fast as it goes.
    pub rate: u64,
    /// Nice value of the sending thread (0: unchanged).
    pub nice: i32,
}

/// The destination of flow `i`: 198.18.0.1 + i, port 1024 + i mod 64511.
pub fn flow_dst(i: usize) -> SocketAddrV4 {
    let base = u32::from(Ipv4Addr::new(198, 18, 0, 1));
    SocketAddrV4::new(
        Ipv4Addr::from(base + (i % FLOWS_MAX) as u32),
        1024 + (i % 64_511) as u16,
    )
}

/// A running generator.
#[derive(Debug)]
pub struct Generator {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    tid: Arc<AtomicU32>,
    handle: Option<JoinHandle<Result<(), String>>>,
}

impl Generator {
    /// Starts sending; returns once the socket is bound (or the thread failed). The thread
    /// stops on [`Generator::stop`], on SIGINT/SIGTERM, or at `hard_end`.
    pub fn start(spec: &GenSpec, hard_end: Instant) -> Result<Generator, String> {
        if !(FRAME_MIN..=FRAME_MAX).contains(&spec.frame) {
            return Err(format!(
                "frame size {} not in {FRAME_MIN}..={FRAME_MAX}",
                spec.frame
            ));
        }
        if spec.batch == 0 || spec.batch > BATCH_MAX || spec.flows == 0 || spec.flows > FLOWS_MAX {
            return Err("batch 1..=1024 and flows 1..=65536".into());
        }
        let g = Generator {
            stop: Arc::new(AtomicBool::new(false)),
            sent: Arc::new(AtomicU64::new(0)),
            errors: Arc::new(AtomicU64::new(0)),
            tid: Arc::new(AtomicU32::new(0)),
            handle: None,
        };
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let spec = spec.clone();
        let (stop, sent, errors, tid) = (
            g.stop.clone(),
            g.sent.clone(),
            g.errors.clone(),
            g.tid.clone(),
        );
        let handle = std::thread::Builder::new()
            .name("fwd-gen".into())
            .spawn(move || {
                let sock = match prepare(&spec) {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.clone()));
                        return Err(e);
                    }
                };
                tid.store(sys::gettid(), Ordering::Relaxed);
                let _ = ready_tx.send(Ok(()));
                send_loop(&spec, &sock, &stop, &sent, &errors, hard_end);
                Ok(())
            })
            .map_err(|e| format!("spawning the generator: {e}"))?;
        let mut g = g;
        g.handle = Some(handle);
        match ready_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => Ok(g),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("the generator did not start".into()),
        }
    }

    /// Datagrams the kernel took so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// `sendmmsg` calls that failed so far.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// The sending thread's id (for `/proc/self/task/TID/schedstat`).
    pub fn tid(&self) -> u32 {
        self.tid.load(Ordering::Relaxed)
    }

    /// Stops and joins the thread.
    pub fn stop(&mut self) -> Result<(), String> {
        self.stop.store(true, Ordering::Relaxed);
        match self.handle.take() {
            Some(h) => h.join().map_err(|_| "the generator panicked".to_string())?,
            None => Ok(()),
        }
    }
}

impl Drop for Generator {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

fn prepare(spec: &GenSpec) -> Result<UdpSocket, String> {
    sys::enter_netns(&spec.netns).map_err(|e| format!("entering {}: {e}", spec.netns))?;
    if let Some(c) = spec.cpu {
        corelocal::cpu::pin_current_thread(&CpuSet::single(c))
            .map_err(|e| format!("pinning the generator to CPU {c}: {e}"))?;
    }
    if spec.nice != 0 {
        sys::set_nice(0, spec.nice).map_err(|e| format!("nice {}: {e}", spec.nice))?;
    }
    let sock = UdpSocket::bind(SocketAddrV4::new(spec.src, 0))
        .map_err(|e| format!("binding {}: {e}", spec.src))?;
    // A full send buffer (datagrams still queued toward a slow router) blocks sendmmsg, as
    // it would a real sender; the timeout only bounds how long a stop can wait.
    sock.set_write_timeout(Some(SEND_TIMEOUT))
        .map_err(|e| format!("SO_SNDTIMEO: {e}"))?;
    Ok(sock)
}

fn send_loop(
    spec: &GenSpec,
    sock: &UdpSocket,
    stop: &AtomicBool,
    sent: &AtomicU64,
    errors: &AtomicU64,
    hard_end: Instant,
) {
    let payload = vec![0x5au8; spec.frame - 4 - HEADERS];
    // Destinations in order, with the first `batch` repeated so any window is one slice.
    let dsts: Vec<rustix::net::SocketAddrAny> = (0..spec.flows + spec.batch)
        .map(|i| flow_dst(i % spec.flows).into())
        .collect();
    let start = Instant::now();
    let mut total = 0u64;
    let mut at = 0usize;
    let mut turns = 0u32;
    loop {
        turns = turns.wrapping_add(1);
        if turns % 64 == 0
            && (stop.load(Ordering::Relaxed) || sys::stop_requested() || Instant::now() > hard_end)
        {
            return;
        }
        if spec.rate > 0 {
            let due = start + Duration::from_secs_f64(total as f64 / spec.rate as f64);
            let now = Instant::now();
            if due > now {
                if stop.load(Ordering::Relaxed) || sys::stop_requested() {
                    return;
                }
                std::thread::sleep((due - now).min(Duration::from_millis(2)));
                continue;
            }
        }
        match sys::sendmmsg_to(sock, &payload, &dsts[at..at + spec.batch]) {
            Ok(n) => {
                total += n as u64;
                sent.fetch_add(n as u64, Ordering::Relaxed);
                at = (at + n.max(1)) % spec.flows;
            }
            // Blocked for SEND_TIMEOUT: backpressure, not a loss; look at the stop flag.
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => turns = 63,
            Err(_) => {
                errors.fetch_add(1, Ordering::Relaxed);
                at = (at + 1) % spec.flows;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flows_differ_in_address_and_port() {
        assert_eq!(flow_dst(0).to_string(), "198.18.0.1:1024");
        assert_eq!(flow_dst(300).to_string(), "198.18.1.45:1324");
        let a: std::collections::HashSet<_> = (0..1000).map(flow_dst).collect();
        assert_eq!(a.len(), 1000);
        // What the generator hands sendmmsg: the same address and port (network byte order).
        let s: rustix::net::SocketAddrAny = flow_dst(1).into();
        assert_eq!(SocketAddrV4::try_from(s).unwrap(), flow_dst(1));
    }

    #[test]
    fn bad_specs_are_refused_before_any_thread() {
        let spec = GenSpec {
            netns: "none".into(),
            cpu: None,
            src: Ipv4Addr::LOCALHOST,
            flows: 1,
            frame: 10,
            batch: 1,
            rate: 0,
            nice: 0,
        };
        assert!(Generator::start(&spec, Instant::now()).is_err());
        let big = GenSpec {
            frame: 64,
            batch: 5000,
            ..spec
        };
        assert!(Generator::start(&big, Instant::now()).is_err());
    }
}
