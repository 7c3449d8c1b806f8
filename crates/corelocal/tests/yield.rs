//! A handler that yields (`Step::yielded`, memcached's requests per event) has the rest of
//! its buffered input handled at the worker's next turns, with no new input, before the
//! peer's end; on both backends.

use corelocal::cpu::{current_affinity, CpuSet};
use corelocal::listen::Mode;
use corelocal::runtime::{
    BackendKind, ConnInfo, Handler, Output, Server, ServerConfig, Service, Step,
};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Answers one line per call, yielding when more input is left.
#[derive(Default)]
struct OneLine {
    calls: Arc<AtomicU64>,
}
struct OneLineConn {
    calls: Arc<AtomicU64>,
}

impl Handler for OneLineConn {
    fn on_input(&mut self, input: &[u8], out: &mut Output, _now: std::time::Instant) -> Step {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let Some(end) = input.iter().position(|&b| b == b'\n') else {
            return Step::read(0, 0);
        };
        out.write(b"PONG\n");
        if end + 1 < input.len() {
            Step::yielded(end + 1, 1)
        } else {
            Step::read(end + 1, 1)
        }
    }
}

impl Service for OneLine {
    type Conn = OneLineConn;
    fn name(&self) -> &'static str {
        "one-line"
    }
    fn connect(&self, _info: &ConnInfo) -> OneLineConn {
        OneLineConn {
            calls: self.calls.clone(),
        }
    }
}

fn pipelined_input_after_a_yield_is_answered_before_the_end(backend: BackendKind) {
    let cpu = current_affinity().unwrap().iter().next().unwrap();
    let mut config = ServerConfig::new(
        vec!["127.0.0.1:0".parse().unwrap()],
        &CpuSet::single(cpu),
        Mode::Local,
    );
    config.backend = backend;
    let service = Arc::new(OneLine::default());
    let server = Server::start(config, service.clone()).unwrap();
    for lines in [50, 100_000] {
        // 100,000 lines (500 kB) arrive faster than one line a turn runs them: receiving pauses
        // while they pile up, rather than the connection closing as stuck.
        let mut s = TcpStream::connect(server.local_addrs()[0]).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut w = s.try_clone().unwrap();
        let writer = std::thread::spawn(move || {
            w.write_all(&b"PING\n".repeat(lines)).unwrap();
            w.shutdown(Shutdown::Write).unwrap();
        });
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        writer.join().unwrap();
        assert_eq!(got.len(), 5 * lines);
        assert!(got == b"PONG\n".repeat(lines));
    }
    assert!(service.calls.load(Ordering::Relaxed) >= 100_050);
    server.stop();
    server.join().unwrap();
}

#[test]
fn epoll() {
    pipelined_input_after_a_yield_is_answered_before_the_end(BackendKind::Epoll);
}

#[test]
fn uring() {
    pipelined_input_after_a_yield_is_answered_before_the_end(BackendKind::Uring);
}
