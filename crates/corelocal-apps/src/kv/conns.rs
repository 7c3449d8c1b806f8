//! `stats conns`: the service's own registry of live connections, as memcached 1.6.18 lists
//! them: the listening sockets first (`conn_listening`), then each connection with its
//! address, the address it was accepted on, its state and the seconds since its last command.
//!
//! memcached numbers the entries by file descriptor; the runtime owns the sockets, so ours
//! are the service's own numbers: the listeners 1…n, then the UDP sockets (memcached lists
//! each as a connection in `conn_read`, marked `UDP`), then connections from 17 (or past the
//! listeners and UDP sockets, when there are more than 16) in the order they came (never
//! reused while the process lives, so the newest connection is listed last).
//! Each worker registers its connections in its own shard (a lock taken at connect and at
//! close, by that worker only, and by `stats conns`); a connection updates its entry's state
//! and command time with relaxed stores on its own entry.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

/// Listener numbers kept below connection numbers: connections are numbered from this (or
/// the number of configured addresses, if more) plus one.
const LISTENERS_NUMBERED: usize = 16;

/// Shards (one per worker; a worker index beyond wraps onto a shared shard).
const SHARDS_MAX: usize = 256;

/// Connections listed by one `stats conns` at most (about 200 bytes each: 13 MB); the rest
/// are left out, oldest first listed.
pub(super) const LISTED_MAX: usize = 65_536;

/// A connection's state, with memcached's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum ConnState {
    /// Accepted, no command yet (`conn_new_cmd`).
    New = 0,
    /// Between commands, waiting for input (`conn_read`).
    Read = 1,
    /// Running a command (`conn_parse_cmd`: the connection asking for `stats conns`).
    ParseCmd = 2,
    /// Reading a storage command's data (`conn_nread`).
    Nread = 3,
    /// Discarding the data of a refused value (`conn_swallow`).
    Swallow = 4,
}

impl ConnState {
    fn name(self) -> &'static str {
        match self {
            ConnState::New => "conn_new_cmd",
            ConnState::Read => "conn_read",
            ConnState::ParseCmd => "conn_parse_cmd",
            ConnState::Nread => "conn_nread",
            ConnState::Swallow => "conn_swallow",
        }
    }

    fn from_u8(v: u8) -> ConnState {
        match v {
            1 => ConnState::Read,
            2 => ConnState::ParseCmd,
            3 => ConnState::Nread,
            4 => ConnState::Swallow,
            _ => ConnState::New,
        }
    }
}

/// One live connection.
#[derive(Debug)]
struct Entry {
    id: u64,
    /// The client's address; a UDP socket's own.
    peer: Option<SocketAddr>,
    /// A UDP socket (listed as memcached lists its UDP connections).
    udp: bool,
    state: AtomicU8,
    /// Unix seconds (the service's clock) of the last command line.
    last_cmd: AtomicU64,
}

#[derive(Default)]
struct Shard {
    slots: Vec<Option<Arc<Entry>>>,
    free: Vec<usize>,
    /// Entries of closed connections, reused by the next ones: no allocation per connection
    /// (one is reused only when nothing else holds it, see [`reused_or_new`]).
    spare: Vec<Arc<Entry>>,
}

/// Spare entries kept per shard at most (about 64 bytes each).
const SPARE_MAX: usize = 1024;

/// `spare` refilled for a new connection if nothing else holds it (its connection's
/// `Registration` is gone and no `stats conns` is copying the list), else a new entry.
fn reused_or_new(
    spare: Option<Arc<Entry>>,
    id: u64,
    peer: Option<SocketAddr>,
    udp: bool,
    state: ConnState,
    now: u64,
) -> Arc<Entry> {
    if let Some(mut entry) = spare {
        if let Some(e) = Arc::get_mut(&mut entry) {
            e.id = id;
            e.peer = peer;
            e.udp = udp;
            *e.state.get_mut() = state as u8;
            *e.last_cmd.get_mut() = now;
            return entry;
        }
    }
    Arc::new(Entry {
        id,
        peer,
        udp,
        state: AtomicU8::new(state as u8),
        last_cmd: AtomicU64::new(now),
    })
}

/// Every live connection, by worker.
pub(super) struct Registry {
    shards: Box<[Mutex<Shard>]>,
    /// The listening addresses: as configured, then as bound ([`Registry::set_listen`]).
    listen: Mutex<Vec<SocketAddr>>,
    next_id: AtomicU64,
    /// The next UDP socket's number (after the listeners').
    next_udp_id: AtomicU64,
    started_unix: u64,
}

/// A connection's place in the [`Registry`]; removed by [`Registry::remove`].
#[derive(Debug)]
pub(super) struct Registration {
    entry: Arc<Entry>,
    shard: usize,
    slot: usize,
}

impl Registration {
    /// The connection's number in `stats conns` (memcached's `cfd`).
    pub(super) fn id(&self) -> u64 {
        self.entry.id
    }

    /// The client's address.
    pub(super) fn peer(&self) -> Option<SocketAddr> {
        self.entry.peer
    }

    /// Records the state the connection is in (and, when it ran commands, their time).
    pub(super) fn set(&self, state: ConnState, command_at: Option<u64>) {
        self.entry.state.store(state as u8, Ordering::Relaxed);
        if let Some(unix) = command_at {
            self.entry.last_cmd.store(unix, Ordering::Relaxed);
        }
    }
}

fn addr_text(proto: &str, addr: &SocketAddr) -> String {
    match addr {
        SocketAddr::V4(_) => format!("{proto}:{addr}"),
        // memcached: tcp6:[::1]:11211.
        SocketAddr::V6(_) => format!("{proto}6:{addr}"),
    }
}

impl Registry {
    /// A registry for `workers` workers of a server listening on `listen` and with
    /// `udp_sockets` UDP sockets, started at `started_unix`.
    pub(super) fn new(
        workers: usize,
        listen: Vec<SocketAddr>,
        udp_sockets: usize,
        started_unix: u64,
    ) -> Registry {
        let n = workers.clamp(1, SHARDS_MAX);
        let below = (listen.len() + udp_sockets).max(LISTENERS_NUMBERED);
        Registry {
            shards: (0..n).map(|_| Mutex::new(Shard::default())).collect(),
            next_id: AtomicU64::new(below as u64 + 1),
            next_udp_id: AtomicU64::new(listen.len() as u64 + 1),
            listen: Mutex::new(listen),
            started_unix,
        }
    }

    /// The addresses the server actually listens on (a configured port 0 becomes the one
    /// the kernel chose).
    pub(super) fn set_listen(&self, addrs: &[SocketAddr]) {
        let mut listen = self.listen.lock().unwrap_or_else(|e| e.into_inner());
        let numbered = listen.len().max(LISTENERS_NUMBERED);
        listen.clear();
        // One entry per address (per-CPU listeners share theirs), numbered below connections.
        for a in addrs {
            if !listen.contains(a) && listen.len() < numbered {
                listen.push(*a);
            }
        }
    }

    /// Registers a new connection of `worker` from `peer`, at unix second `now`.
    pub(super) fn add(&self, worker: usize, peer: Option<SocketAddr>, now: u64) -> Registration {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.insert(worker, id, peer, false, ConnState::New, now)
    }

    /// Registers a UDP socket bound to `local`, served by `worker`, at unix second `now`
    /// (numbered after the listeners, in the order registered).
    pub(super) fn add_udp(&self, worker: usize, local: SocketAddr, now: u64) -> Registration {
        let id = self.next_udp_id.fetch_add(1, Ordering::Relaxed);
        self.insert(worker, id, Some(local), true, ConnState::Read, now)
    }

    fn insert(
        &self,
        worker: usize,
        id: u64,
        peer: Option<SocketAddr>,
        udp: bool,
        state: ConnState,
        now: u64,
    ) -> Registration {
        let shard = worker % self.shards.len();
        let mut s = self.shards[shard].lock().unwrap_or_else(|e| e.into_inner());
        let entry = reused_or_new(s.spare.pop(), id, peer, udp, state, now);
        let slot = match s.free.pop() {
            Some(slot) => {
                s.slots[slot] = Some(entry.clone());
                slot
            }
            None => {
                s.slots.push(Some(entry.clone()));
                s.slots.len() - 1
            }
        };
        Registration { entry, shard, slot }
    }

    /// Removes a closed connection.
    pub(super) fn remove(&self, r: &Registration) {
        let mut s = self.shards[r.shard]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let held = s.slots.get(r.slot).and_then(Option::as_ref);
        if held.is_some_and(|e| Arc::ptr_eq(e, &r.entry)) {
            if let Some(entry) = s.slots[r.slot].take() {
                if s.spare.len() < SPARE_MAX {
                    s.spare.push(entry);
                }
            }
            s.free.push(r.slot);
        }
    }

    /// Live connections.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = s.lock().unwrap_or_else(|e| e.into_inner());
                s.slots.len() - s.free.len()
            })
            .sum()
    }

    /// memcached's `stats conns` lines (without the END) at unix second `now`.
    pub(super) fn write(&self, out: &mut Vec<u8>, now: u64) {
        let listen = self
            .listen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for (i, addr) in listen.iter().enumerate() {
            let id = i + 1;
            let _ = write!(
                out,
                "STAT {id}:addr {}\r\nSTAT {id}:state conn_listening\r\n\
                 STAT {id}:secs_since_last_cmd {}\r\n",
                addr_text("tcp", addr),
                now.saturating_sub(self.started_unix)
            );
        }
        let mut live: Vec<Arc<Entry>> = Vec::new();
        for shard in self.shards.iter() {
            let s = shard.lock().unwrap_or_else(|e| e.into_inner());
            live.extend(s.slots.iter().flatten().cloned());
        }
        live.sort_unstable_by_key(|e| e.id);
        // The accepting address is known when there is one listener.
        let listen = match listen.as_slice() {
            [one] => Some(addr_text("tcp", one)),
            _ => None,
        };
        for e in live.iter().rev().take(LISTED_MAX).rev() {
            let id = e.id;
            if e.udp {
                // memcached's lines for a UDP connection: its socket's address, no listener.
                let _ = write!(out, "STAT {id}:UDP UDP\r\n");
                if let Some(local) = &e.peer {
                    let _ = write!(out, "STAT {id}:addr {}\r\n", addr_text("udp", local));
                }
            } else if let Some(peer) = &e.peer {
                let _ = write!(out, "STAT {id}:addr {}\r\n", addr_text("tcp", peer));
            }
            if let (Some(listen), false) = (&listen, e.udp) {
                let _ = write!(out, "STAT {id}:listen_addr {listen}\r\n");
            }
            let state = ConnState::from_u8(e.state.load(Ordering::Relaxed));
            let since = now.saturating_sub(e.last_cmd.load(Ordering::Relaxed));
            let _ = write!(
                out,
                "STAT {id}:state {}\r\nSTAT {id}:secs_since_last_cmd {since}\r\n",
                state.name()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(r: &Registry, now: u64) -> String {
        let mut out = Vec::new();
        r.write(&mut out, now);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn lists_listeners_then_connections_in_arrival_order() {
        let listen: SocketAddr = "127.0.0.1:11211".parse().unwrap();
        let r = Registry::new(2, vec![listen], 0, 100);
        let a = r.add(1, Some("127.0.0.1:5000".parse().unwrap()), 101);
        let b = r.add(0, Some("[::1]:6000".parse().unwrap()), 102);
        a.set(ConnState::Nread, Some(103));
        b.set(ConnState::ParseCmd, None);
        assert_eq!(
            text(&r, 105),
            "STAT 1:addr tcp:127.0.0.1:11211\r\nSTAT 1:state conn_listening\r\n\
             STAT 1:secs_since_last_cmd 5\r\n\
             STAT 17:addr tcp:127.0.0.1:5000\r\nSTAT 17:listen_addr tcp:127.0.0.1:11211\r\n\
             STAT 17:state conn_nread\r\nSTAT 17:secs_since_last_cmd 2\r\n\
             STAT 18:addr tcp6:[::1]:6000\r\nSTAT 18:listen_addr tcp:127.0.0.1:11211\r\n\
             STAT 18:state conn_parse_cmd\r\nSTAT 18:secs_since_last_cmd 3\r\n"
        );
        assert_eq!(r.len(), 2);
        r.remove(&a);
        r.remove(&a);
        assert_eq!(r.len(), 1);
        assert!(!text(&r, 105).contains("STAT 17:"));
        // A freed slot is reused, the number is not.
        let c = r.add(1, None, 106);
        assert_eq!(c.id(), 19);
        let t = text(&r, 106);
        assert!(t.ends_with("STAT 19:state conn_new_cmd\r\nSTAT 19:secs_since_last_cmd 0\r\n"));
        assert!(!t.contains("STAT 19:addr"), "{t}");
        r.remove(&b);
        r.remove(&c);
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn a_closed_connections_entry_is_reused_only_once_nothing_holds_it() {
        let r = Registry::new(1, Vec::new(), 0, 100);
        let a = r.add(0, Some("127.0.0.1:5000".parse().unwrap()), 101);
        let first = Arc::as_ptr(&a.entry);
        r.remove(&a);
        // Still held by `a`: the next connection gets a new entry, and its own fields.
        let b = r.add(0, None, 102);
        assert_ne!(Arc::as_ptr(&b.entry), first);
        drop(a);
        r.remove(&b);
        drop(b);
        // Nothing holds the spare now: reused, every field the new connection's.
        let c = r.add(0, Some("[::1]:6000".parse().unwrap()), 103);
        assert_eq!(
            (c.id(), c.peer()),
            (19, Some("[::1]:6000".parse().unwrap()))
        );
        assert_eq!(c.entry.last_cmd.load(Ordering::Relaxed), 103);
        assert_eq!(c.entry.state.load(Ordering::Relaxed), ConnState::New as u8);
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn udp_sockets_are_listed_after_the_listeners_as_memcached_lists_them() {
        let listen: SocketAddr = "0.0.0.0:11211".parse().unwrap();
        let udp: SocketAddr = "0.0.0.0:11222".parse().unwrap();
        let r = Registry::new(2, vec![listen], 2, 100);
        let client = r.add(0, Some("127.0.0.1:5000".parse().unwrap()), 100);
        let u0 = r.add_udp(0, udp, 100);
        let u1 = r.add_udp(1, udp, 100);
        assert_eq!(
            text(&r, 101),
            "STAT 1:addr tcp:0.0.0.0:11211\r\nSTAT 1:state conn_listening\r\n\
             STAT 1:secs_since_last_cmd 1\r\n\
             STAT 2:UDP UDP\r\nSTAT 2:addr udp:0.0.0.0:11222\r\nSTAT 2:state conn_read\r\n\
             STAT 2:secs_since_last_cmd 1\r\n\
             STAT 3:UDP UDP\r\nSTAT 3:addr udp:0.0.0.0:11222\r\nSTAT 3:state conn_read\r\n\
             STAT 3:secs_since_last_cmd 1\r\n\
             STAT 17:addr tcp:127.0.0.1:5000\r\nSTAT 17:listen_addr tcp:0.0.0.0:11211\r\n\
             STAT 17:state conn_new_cmd\r\nSTAT 17:secs_since_last_cmd 1\r\n"
        );
        // Many UDP sockets push the connections' numbers up.
        let many = Registry::new(1, vec![listen], 20, 0);
        assert_eq!(many.add(0, None, 0).id(), 22);
        for r_ in [&client, &u0, &u1] {
            r.remove(r_);
        }
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn several_listeners_leave_listen_addr_out() {
        let r = Registry::new(
            1,
            vec![
                "127.0.0.1:1".parse().unwrap(),
                "127.0.0.1:2".parse().unwrap(),
            ],
            0,
            0,
        );
        let a = r.add(0, Some("127.0.0.1:3".parse().unwrap()), 0);
        let t = text(&r, 0);
        assert!(t.contains("STAT 2:state conn_listening\r\n"), "{t}");
        assert!(t.contains("STAT 17:addr tcp:127.0.0.1:3\r\n"), "{t}");
        assert!(!t.contains("listen_addr"), "{t}");
        r.remove(&a);
    }

    #[test]
    fn bound_addresses_replace_the_configured_ones_once_each() {
        let r = Registry::new(1, vec!["127.0.0.1:0".parse().unwrap()], 0, 0);
        let bound: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        // Per-CPU listeners report the same address once each.
        r.set_listen(&[bound, bound]);
        let a = r.add(0, None, 0);
        let t = text(&r, 0);
        assert!(
            t.starts_with(
                "STAT 1:addr tcp:127.0.0.1:40000\r\nSTAT 1:state conn_listening\r\n\
                 STAT 1:secs_since_last_cmd 0\r\nSTAT 17:listen_addr tcp:127.0.0.1:40000\r\n"
            ),
            "{t}"
        );
        // Never more listeners than numbers below the connections'.
        let many: Vec<SocketAddr> = (1..=40)
            .map(|p| SocketAddr::from(([127, 0, 0, 1], p)))
            .collect();
        r.set_listen(&many);
        let t = text(&r, 0);
        assert!(t.contains("STAT 16:state conn_listening\r\n"), "{t}");
        assert!(!t.contains("STAT 17:state conn_listening"), "{t}");
        r.remove(&a);
    }
}
