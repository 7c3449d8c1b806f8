//! The bulk transfer of one cell: N receiver threads (each in the receiver namespace, pinned
//! to the application CPU, one listener per flow) and N sender threads (in the sender
//! namespace, pinned to the sender CPU when there is one, big writes). Every blocking call
//! has a timeout and every loop a deadline.

use crate::sys;
use corelocal::cpu::{pin_current_thread, CpuSet};
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Socket read/write timeout: how often loops look at the stop flag.
const IO_TIMEOUT: Duration = Duration::from_millis(100);
/// How long receivers wait for their connection.
pub const ACCEPT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a sender tries to connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Slack after the measured window before threads are abandoned as stuck.
const JOIN_GRACE: Duration = Duration::from_secs(5);

/// Where one side of the transfer runs.
#[derive(Debug, Clone)]
pub struct Side {
    /// Network namespace to join (`None`: stay in the caller's).
    pub netns: Option<String>,
    /// CPU to pin to (`None`: the scheduler decides).
    pub cpu: Option<usize>,
}

/// The receiving half: listeners on `ip:port..port+flows`.
#[derive(Debug, Clone)]
pub struct RecvSpec {
    /// Namespace and CPU.
    pub side: Side,
    /// Address to listen on.
    pub ip: Ipv4Addr,
    /// First port (flow i uses port + i).
    pub port: u16,
    /// Flows.
    pub flows: usize,
    /// Bytes per read.
    pub read_size: usize,
    /// Give up when no connection arrives within this long.
    pub accept_timeout: Duration,
}

/// The sending half.
#[derive(Debug, Clone)]
pub struct SendSpec {
    /// Namespace and CPU.
    pub side: Side,
    /// The receiver's address and first port.
    pub dst: SocketAddrV4,
    /// Flows.
    pub flows: usize,
    /// Bytes per write.
    pub write_size: usize,
}

/// Running receivers.
pub struct Receivers {
    /// Bytes received so far, per flow.
    pub bytes: Vec<Arc<AtomicU64>>,
    /// Thread ids (for schedstat).
    pub tids: Vec<u32>,
    handles: Vec<JoinHandle<Result<(), String>>>,
}

/// Running senders.
pub struct Senders {
    /// Thread ids.
    pub tids: Vec<u32>,
    handles: Vec<JoinHandle<Result<(), String>>>,
}

fn enter(side: &Side) -> Result<(), String> {
    if let Some(ns) = &side.netns {
        sys::enter_netns(ns).map_err(|e| format!("entering netns {ns}: {e}"))?;
    }
    if let Some(cpu) = side.cpu {
        pin_current_thread(&CpuSet::single(cpu))
            .map_err(|e| format!("pinning to CPU {cpu}: {e}"))?;
    }
    Ok(())
}

fn accept_until(
    l: &TcpListener,
    deadline: Instant,
    stop: &AtomicBool,
) -> Result<TcpStream, String> {
    l.set_nonblocking(true).map_err(|e| e.to_string())?;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).map_err(|e| e.to_string())?;
                return Ok(s);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => return Err(format!("accept: {e}")),
        }
        if Instant::now() > deadline || stop.load(Ordering::Relaxed) || sys::stop_requested() {
            return Err("no connection arrived in time".into());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn receive(
    mut s: TcpStream,
    read_size: usize,
    bytes: &AtomicU64,
    stop: &AtomicBool,
    hard_end: Instant,
) -> Result<(), String> {
    s.set_read_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; read_size];
    while !stop.load(Ordering::Relaxed) && Instant::now() < hard_end {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                bytes.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(format!("recv: {e}")),
        }
    }
    Ok(())
}

/// Starts the receivers; returns once every listener is bound (so senders may connect).
pub fn start_receivers(
    spec: &RecvSpec,
    stop: &Arc<AtomicBool>,
    hard_end: Instant,
) -> Result<Receivers, String> {
    let (tx, rx) = mpsc::channel::<Result<u32, String>>();
    let mut bytes = Vec::new();
    let mut handles = Vec::new();
    for i in 0..spec.flows {
        let (spec, stop, tx) = (spec.clone(), Arc::clone(stop), tx.clone());
        let counter = Arc::new(AtomicU64::new(0));
        bytes.push(Arc::clone(&counter));
        let h = std::thread::Builder::new()
            .name(format!("sweep-recv{i}"))
            .spawn(move || {
                let setup = || -> Result<TcpListener, String> {
                    enter(&spec.side)?;
                    let addr = SocketAddr::from((spec.ip, spec.port + i as u16));
                    TcpListener::bind(addr).map_err(|e| format!("bind {addr}: {e}"))
                };
                let l = match setup() {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = tx.send(Err(e.clone()));
                        return Err(e);
                    }
                };
                let _ = tx.send(Ok(sys::gettid()));
                let s = accept_until(&l, Instant::now() + spec.accept_timeout, &stop)?;
                drop(l);
                receive(s, spec.read_size, &counter, &stop, hard_end)
            })
            .map_err(|e| format!("spawning a receiver: {e}"))?;
        handles.push(h);
    }
    let mut r = Receivers {
        bytes,
        tids: Vec::new(),
        handles,
    };
    for _ in 0..spec.flows {
        match rx.recv_timeout(ACCEPT_TIMEOUT) {
            Ok(Ok(tid)) => r.tids.push(tid),
            Ok(Err(e)) => {
                stop.store(true, Ordering::Relaxed);
                let _ = r.join(hard_end);
                return Err(e);
            }
            Err(_) => {
                stop.store(true, Ordering::Relaxed);
                return Err("a receiver did not start in time".into());
            }
        }
    }
    Ok(r)
}

fn send_loop(
    mut s: TcpStream,
    write_size: usize,
    stop: &AtomicBool,
    hard_end: Instant,
) -> Result<(), String> {
    s.set_write_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let buf = vec![0x5au8; write_size];
    while !stop.load(Ordering::Relaxed) && Instant::now() < hard_end && !sys::stop_requested() {
        match s.write(&buf) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(e) if matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset) => {
                break
            }
            Err(e) => return Err(format!("send: {e}")),
        }
    }
    let _ = s.shutdown(std::net::Shutdown::Both);
    Ok(())
}

/// Starts the senders; returns once every flow is connected.
pub fn start_senders(
    spec: &SendSpec,
    stop: &Arc<AtomicBool>,
    hard_end: Instant,
) -> Result<Senders, String> {
    let (tx, rx) = mpsc::channel::<Result<u32, String>>();
    let mut handles = Vec::new();
    for i in 0..spec.flows {
        let (spec, stop, tx) = (spec.clone(), Arc::clone(stop), tx.clone());
        let h = std::thread::Builder::new()
            .name(format!("sweep-send{i}"))
            .spawn(move || {
                let setup = || -> Result<TcpStream, String> {
                    enter(&spec.side)?;
                    let dst = SocketAddrV4::new(*spec.dst.ip(), spec.dst.port() + i as u16);
                    TcpStream::connect_timeout(&dst.into(), CONNECT_TIMEOUT)
                        .map_err(|e| format!("connect {dst}: {e}"))
                };
                let s = match setup() {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = tx.send(Err(e.clone()));
                        return Err(e);
                    }
                };
                let _ = tx.send(Ok(sys::gettid()));
                send_loop(s, spec.write_size, &stop, hard_end)
            })
            .map_err(|e| format!("spawning a sender: {e}"))?;
        handles.push(h);
    }
    let mut s = Senders {
        tids: Vec::new(),
        handles,
    };
    for _ in 0..spec.flows {
        match rx.recv_timeout(CONNECT_TIMEOUT + Duration::from_secs(1)) {
            Ok(Ok(tid)) => s.tids.push(tid),
            Ok(Err(e)) => {
                stop.store(true, Ordering::Relaxed);
                let _ = s.join(hard_end);
                return Err(e);
            }
            Err(_) => {
                stop.store(true, Ordering::Relaxed);
                return Err("a sender did not connect in time".into());
            }
        }
    }
    Ok(s)
}

fn join_all(
    handles: &mut Vec<JoinHandle<Result<(), String>>>,
    hard_end: Instant,
) -> Result<(), String> {
    let limit = hard_end + JOIN_GRACE;
    let mut first_err = None;
    for h in handles.drain(..) {
        while !h.is_finished() && Instant::now() < limit {
            std::thread::sleep(Duration::from_millis(5));
        }
        if !h.is_finished() {
            first_err
                .get_or_insert_with(|| "a transfer thread is stuck (left running)".to_string());
            continue;
        }
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert_with(|| "a transfer thread panicked".to_string());
            }
        }
    }
    first_err.map_or(Ok(()), Err)
}

impl Receivers {
    /// Total bytes received so far.
    pub fn total(&self) -> u64 {
        self.bytes.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    /// Waits for the threads (bounded); the first error, if any.
    pub fn join(&mut self, hard_end: Instant) -> Result<(), String> {
        join_all(&mut self.handles, hard_end)
    }

    /// Whether every receiver is still receiving (none saw its flow end).
    pub fn all_running(&self) -> bool {
        self.handles.iter().all(|h| !h.is_finished())
    }
}

impl Senders {
    /// Waits for the threads (bounded); the first error, if any.
    pub fn join(&mut self, hard_end: Instant) -> Result<(), String> {
        join_all(&mut self.handles, hard_end)
    }
}
