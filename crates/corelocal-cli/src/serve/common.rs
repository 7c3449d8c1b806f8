//! The options every server shares ([`CommonArgs`]) and their parsers, `--takeover`'s
//! among them.

use crate::check::parse_socket_addr;
use crate::duration::parse_duration;
use crate::size::parse_bytes;
use clap::Args;
use corelocal::cpu::CpuSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Options every server shares.
#[derive(Debug, Args)]
pub struct CommonArgs {
    /// Address to listen on (repeat for several, e.g. IPv4 and IPv6); default per server:
    /// rpc 127.0.0.1:7000, http 127.0.0.1:8080, kv 127.0.0.1:11211, sockperf 127.0.0.1:11111.
    #[arg(long = "listen", value_parser = parse_socket_addr)]
    pub(super) listen: Vec<SocketAddr>,
    /// CPUs to run one worker each on (cpulist like 0-3,8); default: all CPUs allowed.
    #[arg(long, value_parser = parse_cpus)]
    pub(super) cpus: Option<CpuSet>,
    /// Workers per CPU (each has its own listener and, with io_uring, its own file table).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub(super) workers_per_cpu: u16,
    /// stock: one shared listener; fine: one per worker, kernel hash; local: the SYN's CPU picks.
    #[arg(long, default_value = "local", value_parser = ["local", "fine", "stock"])]
    pub(super) mode: String,
    /// Force the local-mode steering method (default: best available).
    #[arg(long, value_parser = ["ebpf", "incoming-cpu", "cbpf"])]
    pub(super) steering: Option<String>,
    /// The Affinity-Accept balancer (busy tracking, stealing, flow-group migration):
    /// auto = on in local mode with two or more workers, off otherwise.
    #[arg(long, default_value = "auto", value_parser = ["auto", "on", "off"])]
    pub(super) balance: String,
    /// Balancer: local:remote accept share for non-busy workers (paper: 5:1).
    #[arg(long, default_value = "5:1", value_parser = parse_share)]
    pub(super) balance_share: (u32, u32),
    /// Balancer: busy above this % of the accept-queue cap; not busy when its EWMA < low %.
    #[arg(long, default_value = "75:10", value_parser = parse_watermarks)]
    pub(super) busy_watermarks: (u32, u32),
    /// Balancer: connections a worker takes from its own accept queue per loop turn; the rest
    /// wait there, where busy detection sees them and idle workers steal them.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub(super) accept_batch: u64,
    /// Balancer: how often a non-busy worker moves one flow group to itself.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub(super) migrate_interval: Duration,
    /// Packet-level flow-group steering: attach XDP + CPUMAP (generic mode) to this interface
    /// so the balancer moves a flow group's packets, not only its new connections.
    #[arg(long, value_name = "IF")]
    pub(super) xdp_iface: Option<String>,
    /// I/O backend.
    #[arg(long, default_value = "auto", value_parser = ["auto", "epoll", "uring"])]
    pub(super) backend: String,
    /// Total listen() backlog per address, split evenly across the workers' listeners.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
    pub(super) backlog: u32,
    /// TCP_DEFER_ACCEPT on the listeners, in seconds (0: off). A connection is accepted with its
    /// first request bytes, so accept and first read happen in one turn (every protocol here
    /// has the client speak first); one that stays silent is accepted after about this long
    /// (the kernel sends the SYN-ACK again and takes its ACK).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=3600))]
    pub(super) defer_accept: u32,
    /// With --defer-accept: each worker stops deferring on its own listeners while it is mostly
    /// idle (the request would otherwise wait for the worker's wake-up: latency at light load)
    /// and defers again while it batches (fewer wake-ups: CPU under load). `off`: always defer.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub(super) defer_accept_adaptive: String,
    /// Open connections per worker; at the limit a worker stops accepting and further
    /// connections wait in the kernel's accept queue (up to --backlog) until one closes.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub(super) conns_per_worker: u64,
    /// Pending output per connection (e.g. 1MiB) at which reading it pauses until half of it
    /// is sent: what a slow reader can make the server hold, plus about one response.
    #[arg(long, default_value = "1MiB", value_parser = parse_bytes)]
    pub(super) output_limit: u64,
    /// Unconsumed input per connection (default 64KiB; kv: 1MiB, its longest multiget line
    /// plus one byte): a request that does not fit is closed as too large (kv answers
    /// `SERVER_ERROR out of memory reading request` first, as memcached).
    #[arg(long, value_parser = parse_bytes)]
    pub(super) input_limit: Option<u64>,
    /// Close connections idle this long (e.g. 60s, 500ms) [default: 60s; kv: never, as
    /// memcached without -o idle_timeout].
    // No clap default: kv tells a given value from none (its `stats settings` reports 0 for
    // none, as memcached), however the command line was built (`corelocal memcached`).
    #[arg(long, value_parser = parse_duration)]
    pub(super) idle_timeout: Option<Duration>,
    /// Lingering close (nginx's lingering_time): when a connection closes while its client may
    /// still be sending (an error answered before the request was read to its end, an unread
    /// body, requests pipelined after `Connection: close`), the answer goes out, the sending
    /// side is shut down, and what the client still sends is read and discarded for at most
    /// this long before the close; a plain close would reset the connection and destroy the
    /// answer. 0 turns lingering off.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub(super) linger_time: Duration,
    /// Lingering close (nginx's lingering_timeout): close a lingering connection whose client
    /// stayed silent this long.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub(super) linger_timeout: Duration,
    /// Lingering close: close once this many bytes were read and discarded.
    #[arg(long, default_value = "16MiB", value_parser = parse_bytes)]
    pub(super) linger_bytes: u64,
    /// On SIGINT/SIGTERM, let requests in progress finish for up to this long.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub(super) drain_timeout: Duration,
    /// Print per-worker stats this often (0 = never).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub(super) stats_interval: Duration,
    /// Print stats as JSON lines instead of text.
    #[arg(long)]
    pub(super) json: bool,
    /// Also append each stats snapshot as a JSON line to this file.
    #[arg(long)]
    pub(super) stats_file: Option<PathBuf>,
    /// Serve per-worker counters at http://ADDR/metrics (Prometheus) and /metrics.json.
    #[arg(long, value_name = "ADDR", value_parser = parse_socket_addr)]
    pub(super) metrics: Option<SocketAddr>,
    /// Binary upgrade from a running server, two forms. PID (a number): bind new listeners
    /// into its reuseport group (same addresses, `--mode local` with eBPF steering), take its
    /// new SYNs, then SIGTERM it so it drains its queues and exits; anything left in its queues
    /// migrates here. SOCKET (anything else: a path; write ./123 for a file named 123): receive
    /// its listening sockets over its --upgrade-socket (any mode; same --listen, --cpus,
    /// --workers-per-cpu and --mode, else refused and the old server keeps serving), serve
    /// from them, then it stops accepting and exits; nothing is refused, nothing migrates.
    #[arg(long, value_name = "PID|SOCKET", value_parser = parse_takeover)]
    pub(super) takeover: Option<Takeover>,
    /// Listen on this unix socket (created mode 0600, removed at exit) for a successor
    /// started with `--takeover PATH`: hand it the listening sockets (SCM_RIGHTS), then stop
    /// accepting, serve what was accepted and exit 0. A live socket at PATH is an error; a
    /// stale one is replaced.
    #[arg(long, value_name = "PATH")]
    pub(super) upgrade_socket: Option<PathBuf>,
    /// Socket takeover: each step of the exchange with the other process waits at most this
    /// long (a dead or stopped old server cannot hang the new one).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(super) takeover_timeout: Duration,
    /// Once serving (listeners bound, workers started), write the process id and a newline
    /// here (written aside to PATH.tmp-PID, then renamed into place); removed at exit if it
    /// still holds this process's id (a `--takeover` successor writes its own). Not writable:
    /// the server does not start.
    #[arg(long, value_name = "PATH")]
    pub(super) pid_file: Option<PathBuf>,
    /// Run in the background (memcached -d): the command forks before anything starts, the
    /// server runs in a new session with its working directory `/` (relative paths given
    /// are made absolute first) and standard input and output on /dev/null, and the command
    /// exits 0 once the server serves, or non-zero with the server's error (given up after
    /// 60s). The server's messages go to /dev/null once it serves, unless --log-file.
    #[arg(long)]
    pub(super) daemon: bool,
    /// With --daemon: once the server serves, append its messages (stderr) and stats lines
    /// (stdout) to this file instead of discarding them; `-`: to the command's standard error
    /// (a systemd unit's journal with `Type=forking`).
    #[arg(long, value_name = "PATH", requires = "daemon")]
    pub(super) log_file: Option<PathBuf>,
}

/// Where `--takeover` takes the listeners from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Takeover {
    /// Join the running server's reuseport group, then SIGTERM it.
    Pid(i32),
    /// Receive its sockets over its upgrade socket.
    Socket(PathBuf),
}

pub(super) fn parse_takeover(text: &str) -> Result<Takeover, String> {
    if text.is_empty() {
        return Err("expected a process id or a unix socket path".into());
    }
    let digits = text.strip_prefix('-').unwrap_or(text);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(Takeover::Socket(PathBuf::from(text)));
    }
    match text.parse::<i32>() {
        Ok(pid) if pid > 1 => Ok(Takeover::Pid(pid)),
        Ok(pid) => Err(format!(
            "{pid} is not a server's process id (must be > 1; write ./{text} for a socket file)"
        )),
        Err(_) => Err(format!("{text}: process id out of range")),
    }
}

/// Two numbers `A:B`.
fn parse_pair(text: &str, form: &str) -> Result<(u32, u32), String> {
    let (a, b) = text
        .split_once(':')
        .ok_or_else(|| format!("expected {form}, two numbers with a colon"))?;
    let num = |t: &str| {
        t.trim()
            .parse::<u32>()
            .map_err(|_| format!("{:?} is not a whole number (expected {form})", t.trim()))
    };
    Ok((num(a)?, num(b)?))
}

/// `--balance-share LOCAL:REMOTE`: each 1 to 1000 (the balancer's limits).
pub(super) fn parse_share(text: &str) -> Result<(u32, u32), String> {
    let (local, remote) = parse_pair(text, "LOCAL:REMOTE, e.g. 5:1")?;
    if !(1..=1000).contains(&local) || !(1..=1000).contains(&remote) {
        return Err(format!(
            "each share must be 1 to 1000, got {local}:{remote} (LOCAL:REMOTE: a non-busy worker \
             takes LOCAL connections from its own queue for every REMOTE it steals, e.g. 5:1)"
        ));
    }
    Ok((local, remote))
}

/// `--busy-watermarks HIGH:LOW`: percentages, HIGH 1 to 100, LOW at most HIGH.
pub(super) fn parse_watermarks(text: &str) -> Result<(u32, u32), String> {
    let (high, low) = parse_pair(text, "HIGH:LOW percentages, e.g. 75:10")?;
    if !(1..=100).contains(&high) {
        return Err(format!(
            "HIGH {high} is not a percentage of the queue cap from 1 to 100 (e.g. 75:10)"
        ));
    }
    if low > high {
        let swapped = if low <= 100 {
            format!("did you mean {low}:{high}?")
        } else {
            format!("e.g. {high}:{}", high / 2)
        };
        return Err(format!(
            "LOW {low} is above HIGH {high}: a worker is busy above HIGH % and not busy again \
             below LOW %, so LOW must be at most HIGH ({swapped})"
        ));
    }
    Ok((high, low))
}

pub(super) fn parse_cpus(text: &str) -> Result<CpuSet, String> {
    let hint = "a cpulist like 0-3,8 or a mask like 0xf";
    let set: CpuSet = text.parse().map_err(|e| format!("{e} ({hint})"))?;
    if set.is_empty() {
        return Err(format!("empty CPU set ({hint})"));
    }
    Ok(set)
}
