//! An echo server on corelocal: every byte a client sends comes back, from the core that
//! accepted its connection.
//!
//! ```sh
//! cargo run -p corelocal --example echo                  # listens on 127.0.0.1:7007
//! cargo run -p corelocal --example echo -- 0.0.0.0:7007  # or where you say
//! printf 'hello\n' | nc -q1 127.0.0.1 7007
//! ```
//!
//! Ctrl-C (SIGINT) or SIGTERM stops it gracefully. `tests/examples.rs` serves this file's
//! [`Echo`] on both backends and checks what a client receives.

use corelocal::cpu::current_affinity;
use corelocal::runtime::{ConnInfo, Handler, Output, Server, ServerConfig, Service, Step};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

/// Where the server listens when no address is given.
pub const LISTEN_DEFAULT: &str = "127.0.0.1:7007";

/// The service: one for the whole server, making one [`EchoConn`] per connection.
pub struct Echo;

/// One connection's state: none, echo needs nothing.
pub struct EchoConn;

impl Service for Echo {
    type Conn = EchoConn;

    fn name(&self) -> &'static str {
        "echo"
    }

    fn connect(&self, _info: &ConnInfo) -> EchoConn {
        EchoConn
    }
}

impl Handler for EchoConn {
    fn on_input(&mut self, input: &[u8], out: &mut Output, _now: Instant) -> Step {
        // No more than the output has room for: the rest stays buffered and reading pauses
        // until the client reads its echo, so a client that never reads cannot make the
        // server hold more than the output limit.
        let room = usize::try_from(out.room()).unwrap_or(usize::MAX);
        let n = input.len().min(room);
        out.write(&input[..n]);
        Step::read(n, u32::from(n > 0))
    }
}

/// `corelocal serve`'s defaults on every CPU this process may use.
pub fn config(addr: SocketAddr) -> io::Result<ServerConfig> {
    Ok(ServerConfig::recommended(vec![addr], &current_affinity()?))
}

fn main() -> io::Result<()> {
    let addr = listen_addr()?;
    let report = Server::run_until_signal(config(addr)?, Arc::new(Echo), |server| {
        corelocal::log_line!(
            "echo: listening on {:?} with {} workers (backend {}); Ctrl-C stops",
            server.local_addrs(),
            server.stats().workers.len(),
            server.backend()
        );
    })?;
    corelocal::log_line!(
        "echo: stopped | connections {}",
        report.stats.total.accepted
    );
    Ok(())
}

/// The first argument, else [`LISTEN_DEFAULT`].
fn listen_addr() -> io::Result<SocketAddr> {
    let arg = std::env::args()
        .nth(1)
        .unwrap_or_else(|| LISTEN_DEFAULT.to_string());
    arg.parse().map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("listen address {arg:?}: {e} (expected e.g. {LISTEN_DEFAULT})"),
        )
    })
}
