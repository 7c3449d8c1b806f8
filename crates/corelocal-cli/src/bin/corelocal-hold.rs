//! `corelocal-hold`: opens N connections to an RPC server, checks each is served with one
//! request, then holds them idle — for showing how many concurrent connections one server
//! process keeps (direct descriptors are limited per ring, not by RLIMIT_NOFILE).
//!
//! Usage: `corelocal-hold ADDR COUNT [REQ_BYTES|mn] [HOLD_SECONDS]` (`mn`: a memcached
//! meta no-op, for `serve kv`). Prints `connected N`,
//! `verified N`, then holds until HOLD_SECONDS pass (default 600) or stdin closes; each line
//! read from stdin meanwhile checks every held connection again with one more request and
//! prints `verified N` (or the first failure, then exits 1): connections that outlive a
//! server's binary upgrade.
//! Source addresses cycle over 127.0.0.2–127.0.0.201 so ports never run out.

use std::io::{self, BufRead, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Source addresses used in turn.
const SOURCES: u32 = 200;
/// Hard cap on connections per process (the fd limit is 20,000 here).
const COUNT_MAX: usize = 19_000;

fn run(dst: SocketAddrV4, count: usize, request: &[u8], hold: Duration) -> io::Result<()> {
    let mut conns = Vec::with_capacity(count);
    for i in 0..count {
        let src = Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 0, 0, 2)) + (i as u32 % SOURCES));
        conns.push(corelocal::sys::socket::connect_from(src, dst)?);
    }
    println!("connected {}", conns.len());
    for c in &mut conns {
        c.set_read_timeout(Some(Duration::from_secs(30)))?;
    }
    verify(&mut conns, request)?;
    let deadline = Instant::now() + hold;
    let (line_tx, line_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for _ in io::stdin().lock().lines() {
            if line_tx.send(()).is_err() {
                break;
            }
        }
    });
    // A line: check again; stdin closed or the time is up: done.
    while line_rx
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .is_ok()
    {
        verify(&mut conns, request)?;
    }
    Ok(())
}

/// One request on every connection, then every answer (a line); prints `verified N`.
fn verify(conns: &mut [TcpStream], request: &[u8]) -> io::Result<()> {
    for c in conns.iter_mut() {
        c.write_all(request)?;
    }
    let mut verified = 0;
    for (i, c) in conns.iter_mut().enumerate() {
        let mut byte = [0u8; 1];
        loop {
            c.read_exact(&mut byte)
                .map_err(|e| io::Error::new(e.kind(), format!("connection {i}: {e}")))?;
            if byte[0] == b'\n' {
                break;
            }
        }
        verified += 1;
    }
    println!("verified {verified}");
    io::stdout().flush()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: corelocal-hold ADDR COUNT [REQ_BYTES|mn] [HOLD_SECONDS]";
    let parsed = (|| {
        let addr: SocketAddr = args.get(1)?.parse().ok()?;
        let SocketAddr::V4(addr) = addr else {
            return None;
        };
        let count: usize = args.get(2)?.parse().ok()?;
        let req: Vec<u8> = match args.get(3).map(String::as_str) {
            None => vec![b'h'; 64],
            Some("mn") => b"mn\r\n".to_vec(),
            Some(n) => vec![b'h'; n.parse::<usize>().ok().filter(|&n| n > 0)?],
        };
        let hold: u64 = args.get(4).map_or(Some(600), |a| a.parse().ok())?;
        (count <= COUNT_MAX).then_some((addr, count, req, Duration::from_secs(hold)))
    })();
    let Some((addr, count, req, hold)) = parsed else {
        eprintln!("{usage} (COUNT ≤ {COUNT_MAX}, IPv4 ADDR)");
        return ExitCode::from(2);
    };
    match run(addr, count, &req, hold) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("corelocal-hold: {e}");
            ExitCode::FAILURE
        }
    }
}
