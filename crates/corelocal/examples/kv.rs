//! A key-value server with a line protocol on corelocal: each worker keeps its own store
//! (per-worker state: no thread-locals, no lock shared between cores), pipelined requests are
//! answered in order, and a line past the size limit gets an error line before the close.
//!
//! ```sh
//! cargo run -p corelocal --example kv                    # listens on 127.0.0.1:7070
//! cargo run -p corelocal --example kv -- 0.0.0.0:7070    # or where you say
//! printf 'SET a 1\nGET a\nQUIT\n' | nc 127.0.0.1 7070
//! ```
//!
//! One request per line (`\n` or `\r\n`), one answer line each:
//!
//! | request | answer |
//! |---|---|
//! | `SET key value` | `STORED` (`ERROR store full` past [`KEYS_PER_WORKER_MAX`] keys) |
//! | `GET key` | `VALUE value`, or `NOT_FOUND` |
//! | `DEL key` | `DELETED`, or `NOT_FOUND` |
//! | `QUIT` | none: the connection closes |
//! | anything else | `ERROR unknown command` (the connection stays) |
//! | a line over [`LINE_BYTES_MAX`] | `ERROR line too long`, then the connection closes |
//!
//! A key lives in the store of the worker that stored it and is found by that worker's
//! connections: a per-core cache, not a shared database. In `local` mode a connection goes to
//! the worker on the CPU that processed its SYN, so a client's connections from one CPU meet
//! the same store. Ctrl-C (SIGINT) or SIGTERM stops the server gracefully.
//! `tests/examples.rs` serves this file's [`Kv`] on both backends and checks the answers.

use corelocal::cpu::current_affinity;
use corelocal::runtime::{
    CloseReason, ConnInfo, Handler, Output, Server, ServerConfig, Service, Step,
};
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Where the server listens when no address is given.
pub const LISTEN_DEFAULT: &str = "127.0.0.1:7070";

/// The longest request line, without its `\n`.
pub const LINE_BYTES_MAX: usize = 1024;

/// Keys one worker's store holds at most.
pub const KEYS_PER_WORKER_MAX: usize = 100_000;

/// One worker's keys and values.
pub type Store = HashMap<Vec<u8>, Vec<u8>>;

/// The service. The one given to the server is a template: each worker makes its own
/// ([`Service::for_worker`]), with its own store.
#[derive(Default)]
pub struct Kv {
    /// This worker's store. Only this worker's thread locks it: the lock is never contended.
    store: Arc<Mutex<Store>>,
}

/// One connection: a handle to its worker's store.
pub struct KvConn {
    store: Arc<Mutex<Store>>,
}

impl Service for Kv {
    type Conn = KvConn;

    fn name(&self) -> &'static str {
        "kv"
    }

    fn for_worker(self: Arc<Self>, _worker: usize) -> Arc<Self> {
        Arc::new(Kv::default())
    }

    fn connect(&self, _info: &ConnInfo) -> KvConn {
        KvConn {
            store: Arc::clone(&self.store),
        }
    }
}

impl Handler for KvConn {
    /// Answers every complete line while the output has room (pipelined requests in one
    /// call); what is left, a partial line or requests past the room, waits in the runtime's
    /// buffer for the next call.
    fn on_input(&mut self, input: &[u8], out: &mut Output, _now: Instant) -> Step {
        // Only this worker's thread locks it: the lock costs two uncontended atomic operations.
        let mut store = self
            .store
            .lock()
            .expect("poisoned only by a panic, which ends this worker");
        let (mut consumed, mut requests) = (0, 0);
        while out.room() > 0 {
            let rest = &input[consumed..];
            let line_end = rest.iter().position(|&b| b == b'\n');
            if line_end.unwrap_or(rest.len()) > LINE_BYTES_MAX {
                // The runtime reads on while the answer goes out (a lingering close), so the
                // client gets it even if it is still sending the line.
                out.write(b"ERROR line too long\n");
                return Step::close(consumed, requests, CloseReason::TooLarge);
            }
            let Some(end) = line_end else {
                break; // A partial line: more input comes.
            };
            let line = rest[..end].strip_suffix(b"\r").unwrap_or(&rest[..end]);
            consumed += end + 1;
            requests += 1;
            if !answer(&mut store, line, out) {
                return Step::close(consumed, requests, CloseReason::Done);
            }
        }
        Step::read(consumed, requests)
    }
}

/// Answers one request line; false for `QUIT`.
fn answer(store: &mut Store, line: &[u8], out: &mut Output) -> bool {
    let mut words = line.splitn(3, |&b| b == b' ');
    match (words.next(), words.next(), words.next()) {
        (Some(b"GET"), Some(key), None) => match store.get(key) {
            Some(value) => {
                out.write(b"VALUE ");
                out.write(value);
                out.write(b"\n");
            }
            None => out.write(b"NOT_FOUND\n"),
        },
        (Some(b"SET"), Some(key), Some(value)) => {
            if store.len() >= KEYS_PER_WORKER_MAX && !store.contains_key(key) {
                out.write(b"ERROR store full\n");
            } else {
                store.insert(key.to_vec(), value.to_vec());
                out.write(b"STORED\n");
            }
        }
        (Some(b"DEL"), Some(key), None) => match store.remove(key) {
            Some(_) => out.write(b"DELETED\n"),
            None => out.write(b"NOT_FOUND\n"),
        },
        (Some(b"QUIT"), None, None) => return false,
        _ => out.write(b"ERROR unknown command\n"),
    }
    true
}

/// `corelocal serve`'s defaults on every CPU this process may use.
pub fn config(addr: SocketAddr) -> io::Result<ServerConfig> {
    Ok(ServerConfig::recommended(vec![addr], &current_affinity()?))
}

fn main() -> io::Result<()> {
    let addr = listen_addr()?;
    let report = Server::run_until_signal(config(addr)?, Arc::new(Kv::default()), |server| {
        corelocal::log_line!(
            "kv: listening on {:?} with {} workers (backend {}); Ctrl-C stops",
            server.local_addrs(),
            server.stats().workers.len(),
            server.backend()
        );
    })?;
    corelocal::log_line!(
        "kv: stopped | requests {} | connections {}",
        report.stats.total.requests,
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
