//! `corelocal serve`: run a server on the per-core runtime.

use crate::duration::parse_duration;
use crate::size::parse_bytes;
use clap::{Args, Subcommand};
use corelocal::cpu::{current_affinity, CpuSet};
use corelocal::listen::transfer::{self, Successor, UpgradeListener};
use corelocal::listen::{ActiveSteering, Mode, Steering};
use corelocal::runtime::{BackendKind, Server, ServerConfig, Service, Snapshot, UpgradeServer};
use corelocal::sys::signal;
use corelocal_apps::http::{AccessLog, HttpConfig, HttpService};
use corelocal_apps::kv::{KvConfig, KvService};
use corelocal_apps::rpc::{RpcConfig, RpcService};
use corelocal_apps::sockperf::{SockperfConfig, SockperfService};
use corelocal_proto::memcache;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// --input-limit of every server but kv (see `KV_INPUT_LIMIT_DEFAULT`).
const INPUT_LIMIT_DEFAULT: u64 = 64 << 10;

/// How often the main thread looks whether a successor took the sockets over.
const HANDOVER_POLL: Duration = Duration::from_millis(50);

/// `corelocal serve` arguments.
#[derive(Debug, Args)]
pub struct Command {
    #[command(subcommand)]
    app: App,
}

#[derive(Debug, Subcommand)]
enum App {
    /// MegaPipe's RPC microbenchmark server: fixed-size request → fixed-size response.
    ///
    /// Examples:
    ///   corelocal serve rpc
    ///   corelocal serve rpc --listen 127.0.0.1:7000 --cpus 1 --mode local --one-shot
    ///   corelocal serve rpc --req-size 64 --resp-size 1024 --stats-interval 1s --json
    #[command(verbatim_doc_comment)]
    Rpc(RpcArgs),
    /// Static HTTP/1.1 file server (GET/HEAD, keep-alive, pipelining, 304, Range).
    ///
    /// Without --root it serves a built-in site: the Affinity-Accept paper's file set
    /// (30,000 files, 30 B..5,670 B, generated in memory) with an index page.
    ///
    /// Examples:
    ///   corelocal serve http
    ///   corelocal serve http --listen 0.0.0.0:8080 --root /var/www --cpus 0-3
    ///   curl -s http://127.0.0.1:8080/files/00/00000.txt
    #[command(verbatim_doc_comment)]
    Http(HttpArgs),
    /// memcached text-protocol server (get/gets/set/add/replace/append/prepend/cas/delete/
    /// incr/decr/touch/flush_all/stats), with LRU eviction under a memory cap.
    ///
    /// Examples:
    ///   corelocal serve kv
    ///   corelocal serve kv --listen 127.0.0.1:11211 --memory-mb 256 --item-max 1048576
    #[command(verbatim_doc_comment)]
    Kv(KvArgs),
    /// The `sockperf server --tcp` protocol: answers ping-pong messages (client flag and
    /// pong request set) with the same bytes, the client flag cleared.
    ///
    /// Examples:
    ///   corelocal serve sockperf
    ///   sockperf ping-pong --tcp -i 127.0.0.1 -p 11111 -m 64 -t 5
    #[command(verbatim_doc_comment)]
    Sockperf(SockperfArgs),
}

#[derive(Debug, Args)]
struct SockperfArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Largest message accepted, header included (sockperf server -m); longer closes.
    #[arg(long, default_value_t = 65_507, value_parser = clap::value_parser!(u32).range(14..=65_507))]
    msg_size_max: u32,
}

#[derive(Debug, Args)]
struct HttpArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Directory to serve (default: the built-in paper file set).
    #[arg(long)]
    root: Option<PathBuf>,
    /// In-memory cache of small files, in MiB.
    #[arg(long, default_value_t = 64)]
    cache_mb: u64,
    /// Access log: off, stderr, or a file path.
    #[arg(long, default_value = "off")]
    access_log: String,
    /// A request head must be complete this long after its first byte, else 408 and close
    /// (slowloris); the idle timeout alone would not catch a client that trickles bytes.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    header_timeout: Duration,
}

#[derive(Debug, Args)]
struct KvArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Memory for items, in MiB (memcached -m).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    memory_mb: u64,
    /// Largest item in bytes (memcached -I).
    #[arg(long, default_value_t = 1_048_576, value_parser = clap::value_parser!(u64).range(1024..=1_073_741_824))]
    item_max: u64,
    /// Refuse flush_all (memcached -F): `CLIENT_ERROR flush_all not allowed`.
    #[arg(long)]
    disable_flush_all: bool,
    /// Keep no CAS uniques (memcached -C): gets reports 0 and cas of a present item stores.
    #[arg(long)]
    disable_cas: bool,
}

/// kv's default --input-limit: the longest multiget key list (a get line is the only request
/// kept whole in the input; storage data streams into the item) is one byte less, and above
/// memcached's own test's 128 KiB.
const KV_INPUT_LIMIT_DEFAULT: u64 = memcache::GET_LINE_BYTES_MAX_DEFAULT as u64 + 1;

/// Options every server shares.
#[derive(Debug, Args)]
pub struct CommonArgs {
    /// Address to listen on (repeat for several, e.g. IPv4 and IPv6); default per server:
    /// rpc 127.0.0.1:7000, http 127.0.0.1:8080, kv 127.0.0.1:11211, sockperf 127.0.0.1:11111.
    #[arg(long = "listen")]
    listen: Vec<SocketAddr>,
    /// CPUs to run one worker each on (cpulist like 0-3,8); default: all CPUs allowed.
    #[arg(long, value_parser = parse_cpus)]
    cpus: Option<CpuSet>,
    /// Workers per CPU (each has its own listener and, with io_uring, its own file table).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    workers_per_cpu: u16,
    /// stock: one shared listener; fine: one per worker, kernel hash; local: the SYN's CPU picks.
    #[arg(long, default_value = "local", value_parser = ["local", "fine", "stock"])]
    mode: String,
    /// Force the local-mode steering method (default: best available).
    #[arg(long, value_parser = ["ebpf", "incoming-cpu", "cbpf"])]
    steering: Option<String>,
    /// The Affinity-Accept balancer (busy tracking, stealing, flow-group migration):
    /// auto = on in local mode with two or more workers, off otherwise.
    #[arg(long, default_value = "auto", value_parser = ["auto", "on", "off"])]
    balance: String,
    /// Balancer: local:remote accept share for non-busy workers (paper: 5:1).
    #[arg(long, default_value = "5:1", value_parser = parse_share)]
    balance_share: (u32, u32),
    /// Balancer: busy above this % of the accept-queue cap; not busy when its EWMA < low %.
    #[arg(long, default_value = "75:10", value_parser = parse_share)]
    busy_watermarks: (u32, u32),
    /// Balancer: connections a worker takes from its own accept queue per loop turn; the rest
    /// wait there, where busy detection sees them and idle workers steal them.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    accept_batch: u64,
    /// Balancer: how often a non-busy worker moves one flow group to itself.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    migrate_interval: Duration,
    /// Packet-level flow-group steering: attach XDP + CPUMAP (generic mode) to this interface
    /// so the balancer moves a flow group's packets, not only its new connections.
    #[arg(long, value_name = "IF")]
    xdp_iface: Option<String>,
    /// I/O backend.
    #[arg(long, default_value = "auto", value_parser = ["auto", "epoll", "uring"])]
    backend: String,
    /// Total listen() backlog per address, split evenly across the workers' listeners.
    #[arg(long, default_value_t = 4096)]
    backlog: u32,
    /// TCP_DEFER_ACCEPT on the listeners, in seconds (0: off). A connection is accepted with its
    /// first request bytes, so accept and first read happen in one turn (every protocol here
    /// has the client speak first); one that stays silent is accepted after about this long
    /// (the kernel sends the SYN-ACK again and takes its ACK).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=3600))]
    defer_accept: u32,
    /// Open connections per worker; at the limit a worker stops accepting and further
    /// connections wait in the kernel's accept queue (up to --backlog) until one closes.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    conns_per_worker: u64,
    /// Pending output per connection (e.g. 1MiB) at which reading it pauses until half of it
    /// is sent: what a slow reader can make the server hold, plus about one response.
    #[arg(long, default_value = "1MiB", value_parser = parse_bytes)]
    output_limit: u64,
    /// Unconsumed input per connection (default 64KiB; kv: 1MiB, its longest multiget line
    /// plus one byte): a request that does not fit is closed as too large (kv answers
    /// `SERVER_ERROR out of memory reading request` first, as memcached).
    #[arg(long, value_parser = parse_bytes)]
    input_limit: Option<u64>,
    /// Close connections idle this long (e.g. 60s, 500ms).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    idle_timeout: Duration,
    /// On SIGINT/SIGTERM, let requests in progress finish for up to this long.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    drain_timeout: Duration,
    /// Print per-worker stats this often (0 = never).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    stats_interval: Duration,
    /// Print stats as JSON lines instead of text.
    #[arg(long)]
    json: bool,
    /// Also append each stats snapshot as a JSON line to this file.
    #[arg(long)]
    stats_file: Option<PathBuf>,
    /// Serve per-worker counters at http://ADDR/metrics (Prometheus) and /metrics.json.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// Binary upgrade from a running server, two forms. PID (a number): bind new listeners
    /// into its reuseport group (same addresses, `--mode local` with eBPF steering), take its
    /// new SYNs, then SIGTERM it so it drains its queues and exits; anything left in its queues
    /// migrates here. SOCKET (anything else: a path; write ./123 for a file named 123): receive
    /// its listening sockets over its --upgrade-socket (any mode; same --listen, --cpus,
    /// --workers-per-cpu and --mode, else refused and the old server keeps serving), serve
    /// from them, then it stops accepting and exits; nothing is refused, nothing migrates.
    #[arg(long, value_name = "PID|SOCKET", value_parser = parse_takeover)]
    takeover: Option<Takeover>,
    /// Listen on this unix socket (created mode 0600, removed at exit) for a successor
    /// started with `--takeover PATH`: hand it the listening sockets (SCM_RIGHTS), then stop
    /// accepting, serve what was accepted and exit 0. A live socket at PATH is an error; a
    /// stale one is replaced.
    #[arg(long, value_name = "PATH")]
    upgrade_socket: Option<PathBuf>,
    /// Socket takeover: each step of the exchange with the other process waits at most this
    /// long (a dead or stopped old server cannot hang the new one).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    takeover_timeout: Duration,
}

/// Where `--takeover` takes the listeners from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Takeover {
    /// Join the running server's reuseport group, then SIGTERM it.
    Pid(i32),
    /// Receive its sockets over its upgrade socket.
    Socket(PathBuf),
}

fn parse_takeover(text: &str) -> Result<Takeover, String> {
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

#[derive(Debug, Args)]
struct RpcArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Request size in bytes.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    req_size: u32,
    /// Response size in bytes.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=16_777_216))]
    resp_size: u32,
    /// Close after one response (connection-rate services).
    #[arg(long)]
    one_shot: bool,
}

fn parse_share(text: &str) -> Result<(u32, u32), String> {
    let (a, b) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?}: expected A:B"))?;
    let num = |t: &str| {
        t.trim()
            .parse::<u32>()
            .map_err(|_| format!("{text:?}: expected A:B numbers"))
    };
    Ok((num(a)?, num(b)?))
}

fn parse_cpus(text: &str) -> Result<CpuSet, String> {
    let set: CpuSet = text.parse().map_err(|e| format!("{e}"))?;
    if set.is_empty() {
        return Err("empty CPU set".into());
    }
    Ok(set)
}

/// Runs `corelocal serve`.
pub fn run(cmd: Command) -> ExitCode {
    match cmd.app {
        App::Http(mut args) => {
            default_listen(&mut args.common, "127.0.0.1:8080");
            let access_log = match args.access_log.as_str() {
                "off" => AccessLog::Off,
                "stderr" => AccessLog::Stderr,
                path => AccessLog::File(PathBuf::from(path)),
            };
            let config = HttpConfig {
                root: args.root,
                cache_bytes_max: args.cache_mb.saturating_mul(1 << 20),
                access_log,
                header_timeout_ms: u64::try_from(args.header_timeout.as_millis())
                    .unwrap_or(u64::MAX)
                    .max(1),
                ..HttpConfig::default()
            };
            match HttpService::new(config) {
                Ok(service) => serve(&args.common, Arc::new(service)),
                Err(e) => fail(&format!("http: {e}")),
            }
        }
        App::Kv(mut args) => {
            default_listen(&mut args.common, "127.0.0.1:11211");
            let input_limit = *args
                .common
                .input_limit
                .get_or_insert(KV_INPUT_LIMIT_DEFAULT);
            // One byte under the runtime's limit, so that kv sees an over-long multiget (and
            // answers it) before the runtime closes the connection silently.
            let get_line_bytes_max =
                usize::try_from(input_limit.saturating_sub(1).max(1)).unwrap_or(usize::MAX);
            let config = KvConfig {
                memory_bytes_max: args.memory_mb << 20,
                item_bytes_max: args.item_max,
                limits: memcache::Limits {
                    get_line_bytes_max,
                    ..memcache::Limits::default()
                },
                flush_enabled: !args.disable_flush_all,
                cas_enabled: !args.disable_cas,
                ..KvConfig::default()
            };
            match KvService::new(config) {
                Ok(service) => serve(&args.common, Arc::new(service)),
                Err(e) => fail(&format!("kv: {e}")),
            }
        }
        App::Rpc(mut args) => {
            default_listen(&mut args.common, "127.0.0.1:7000");
            let config = RpcConfig {
                request_bytes: args.req_size as usize,
                response_bytes: args.resp_size as usize,
                one_shot: args.one_shot,
            };
            match RpcService::new(config) {
                Ok(service) => serve(&args.common, Arc::new(service)),
                Err(e) => fail(&e),
            }
        }
        App::Sockperf(mut args) => {
            default_listen(&mut args.common, "127.0.0.1:11111");
            let config = SockperfConfig {
                max_message_bytes: args.msg_size_max as usize,
            };
            match SockperfService::new(config) {
                Ok(service) => serve(&args.common, Arc::new(service)),
                Err(e) => fail(&format!("sockperf: {e}")),
            }
        }
    }
}

fn default_listen(common: &mut CommonArgs, addr: &str) {
    if common.listen.is_empty() {
        common.listen.push(addr.parse().expect("static address"));
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("corelocal serve: {message}");
    ExitCode::FAILURE
}

fn server_config(common: &CommonArgs) -> Result<ServerConfig, String> {
    let cpus = match &common.cpus {
        Some(c) => c.clone(),
        None => current_affinity().map_err(|e| format!("reading CPU affinity: {e}"))?,
    };
    let mode: Mode = common.mode.parse()?;
    let mut config = ServerConfig::new(common.listen.clone(), &cpus, mode)
        .workers_per_cpu(common.workers_per_cpu as usize);
    config.listen.steering = common
        .steering
        .as_deref()
        .map(str::parse::<Steering>)
        .transpose()?;
    config.listen.backlog_total = common.backlog.max(1);
    config.listen.defer_accept_s = (common.defer_accept > 0).then_some(common.defer_accept);
    config.backend = common.backend.parse::<BackendKind>()?;
    config.limits.idle_timeout = common.idle_timeout.max(Duration::from_millis(1));
    config.limits.drain_timeout = common.drain_timeout;
    config.limits.conns_per_worker_max = common.conns_per_worker as usize;
    config.limits.accept_batch_max = common.accept_batch as usize;
    config.limits.output_bytes_max = usize::try_from(common.output_limit).unwrap_or(usize::MAX);
    let input_limit = common.input_limit.unwrap_or(INPUT_LIMIT_DEFAULT);
    config.limits.input_bytes_max = usize::try_from(input_limit).unwrap_or(usize::MAX);
    if let Some(iface) = &common.xdp_iface {
        match corelocal::steer::RssSteering::detect(iface) {
            Err(unsupported) => {
                eprintln!("corelocal serve: {unsupported}; steering flow groups with XDP + CPUMAP")
            }
            Ok(_) => eprintln!(
                "corelocal serve: {iface} has an RSS indirection table, but moving its buckets \
                 also needs queue → CPU IRQ affinity (corelocal tune); steering flow groups \
                 with XDP + CPUMAP"
            ),
        }
        config.xdp_iface = Some(iface.clone());
    }
    let balance_on = match common.balance.as_str() {
        "on" => true,
        "off" => false,
        // One worker has nobody to balance with: pacing its accepts would only cost.
        _ => mode == Mode::Local && config.listen.worker_cpus.len() > 1,
    };
    if balance_on {
        let mut b = corelocal::balance::BalanceConfig::new(config.listen.worker_cpus.len());
        (b.share_local, b.share_remote) = common.balance_share;
        (b.busy_high_pct, b.busy_low_pct) = common.busy_watermarks;
        b.migrate_interval_ns = common.migrate_interval.as_nanos().max(1) as u64;
        b.flow_groups = config.listen.flow_groups;
        b.validate().map_err(|e| e.to_string())?;
        config.balance = Some(b);
    }
    Ok(config)
}

/// Starts `service`, prints stats until SIGINT/SIGTERM (or until a successor took the
/// listening sockets over the upgrade socket), then stops gracefully.
pub fn serve<S: Service>(common: &CommonArgs, service: Arc<S>) -> ExitCode {
    let name = service.name();
    let config = match server_config(common) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    if let Err(e) = signal::block_termination_signals() {
        return fail(&format!("blocking signals: {e}"));
    }
    // Opened before the workers start: once they accept, descriptors may run out (EMFILE).
    let mut stats_file = match open_stats_file(common) {
        Ok(f) => f,
        Err(e) => return fail(&e),
    };
    let early_upgrade = match bind_upgrade_early(common) {
        Ok(l) => l,
        Err(e) => return fail(&e),
    };
    let (server, successor) = match start_server(common, &config, service) {
        Ok(started) => started,
        Err(e) => return fail(&e),
    };
    print_listening(name, &config, &server);
    let metrics = crate::metrics::start_for(common.metrics, &server, name, &config);
    let taken = metrics.and_then(|m| take_over(common, &server, successor).map(|()| m));
    let _metrics = match taken {
        Ok(m) => m,
        Err(e) => return abandon(server, &e),
    };
    let upgrade = start_upgrade_socket(common, &server, early_upgrade);
    let stop = wait_for_stop(common, &server, upgrade.as_ref(), stats_file.as_mut());
    let handed_over = upgrade.is_some_and(|u| u.shutdown());
    match (handed_over, stop) {
        (true, _) => eprintln!(
            "corelocal serve {name}: listening sockets handed over, draining (up to {:?})",
            common.drain_timeout
        ),
        (false, Some(signal)) => eprintln!(
            "corelocal serve {name}: signal {signal}, draining (up to {:?})",
            common.drain_timeout
        ),
        (false, None) => {}
    }
    server.stop();
    finish(name, server, stats_file.as_mut())
}

fn print_listening(name: &str, config: &ServerConfig, server: &Server) {
    let addrs: Vec<String> = server.local_addrs().iter().map(|a| a.to_string()).collect();
    eprintln!(
        "corelocal serve {name}: listening on {} | workers on CPUs {} | mode {} | steering {} | backend {} | balancer {}",
        addrs.join(", "),
        config.listen.worker_cpus.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(","),
        config.listen.mode,
        server.steering(),
        server.backend(),
        if config.balance.is_some() { "on" } else { "off" },
    );
}

/// Samples the namespace's listen-path counters and prints stats every `--stats-interval`
/// (sampling every second when printing is off) until SIGINT/SIGTERM (returned) or a handover over
/// the upgrade socket (`None`); the handover flag is looked at every [`HANDOVER_POLL`].
fn wait_for_stop(
    common: &CommonArgs,
    server: &Server,
    upgrade: Option<&UpgradeServer>,
    mut stats_file: Option<&mut std::fs::File>,
) -> Option<i32> {
    let started = Instant::now();
    let mut last = server.stats();
    let printing = !common.stats_interval.is_zero();
    let tick = if printing {
        common.stats_interval
    } else {
        NET_SAMPLE_DEFAULT
    };
    let mut next_tick = started + tick;
    loop {
        let now = Instant::now();
        let wait = next_tick.saturating_duration_since(now).min(HANDOVER_POLL);
        if let Some(sig) = signal::wait_termination(wait) {
            return Some(sig);
        }
        if upgrade.is_some_and(|u| u.handed_over()) {
            return None;
        }
        if Instant::now() < next_tick {
            continue;
        }
        next_tick = (next_tick + tick).max(Instant::now());
        server.sample_net();
        if !printing {
            continue;
        }
        let now = server.stats();
        if let Some(f) = stats_file.as_mut() {
            let _ = writeln!(f, "{}", now.to_json());
        }
        print_stats(&now, &last, started.elapsed(), tick, common.json);
        last = now;
    }
}

/// Waits for the workers and prints the stop summary.
fn finish(name: &str, server: Server, stats_file: Option<&mut std::fs::File>) -> ExitCode {
    let (result, report) = server.join_report();
    if let Some(f) = stats_file {
        let _ = writeln!(f, "{}", report.stats.to_json());
    }
    if report.handed_over {
        eprintln!(
            "corelocal serve {name}: stopped | handed over | accepted while draining {} | lost at close 0 (the successor holds the sockets and their queues){}",
            report.stats.total.drain_accepted,
            overload_summary(&report.stats),
        );
    } else {
        eprintln!(
            "corelocal serve {name}: stopped | accepted while draining {} | new SYNs refused {} | migration {} | lost at close {}{}",
            report.stats.total.drain_accepted, report.refused_new_syns, report.migration, report.lost_at_close,
            overload_summary(&report.stats),
        );
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e.to_string()),
    }
}

/// How often the listen-path counters are sampled when stats printing is off.
const NET_SAMPLE_DEFAULT: Duration = Duration::from_secs(1);

/// The overload counters for the stop line: SYN cookies and listen drops of the namespace,
/// pauses at the connection limit and for output back-pressure.
fn overload_summary(s: &Snapshot) -> String {
    format!(
        " | syncookies sent {} recv {} | listen overflows {} drops {} | conn-limit pauses {} | backpressure pauses {}",
        s.net.syncookies_sent,
        s.net.syncookies_recv,
        s.net.listen_overflows,
        s.net.listen_drops,
        s.total.conn_limit_pauses,
        s.total.backpressure_pauses,
    )
}

/// Gives up after the server started ([`Server::abandon`]: after a socket takeover without
/// disturbing the sockets the old server still serves from).
fn abandon(server: Server, message: &str) -> ExitCode {
    server.abandon();
    fail(message)
}

/// Binds and starts the server, or with `--takeover SOCKET` receives the running server's
/// sockets and starts on them; then the old server is waiting for this one's answer.
fn start_server<S: Service>(
    common: &CommonArgs,
    config: &ServerConfig,
    service: Arc<S>,
) -> Result<(Server, Option<Successor>), String> {
    let Some(Takeover::Socket(path)) = &common.takeover else {
        return Server::start(config.clone(), service)
            .map(|s| (s, None))
            .map_err(|e| e.to_string());
    };
    let context = |e: &dyn std::fmt::Display| format!("--takeover {}: {e}", path.display());
    let incoming = transfer::request(path, common.takeover_timeout).map_err(|e| context(&e))?;
    let (pid, sockets) = (incoming.peer().pid, incoming.layout().socket_count());
    let (group, successor) = incoming
        .adopt(config.listen.clone())
        .map_err(|e| context(&e))?;
    match Server::start_with_listeners(config.clone(), service, group) {
        Ok(server) => {
            eprintln!("corelocal serve: received {sockets} listening sockets from pid {pid}");
            Ok((server, Some(successor)))
        }
        Err(e) => {
            successor.abort(&e.to_string());
            Err(context(&e))
        }
    }
}

/// The server runs: finish the takeover. PID: this server's listeners joined the old group and
/// its eBPF program steers the group's SYNs now; SIGTERM the old server so it drains and
/// exits. SOCKET: tell the old server this one serves; it stops accepting and exits.
fn take_over(
    common: &CommonArgs,
    server: &Server,
    successor: Option<Successor>,
) -> Result<(), String> {
    if let Some(successor) = successor {
        // Serving already: a missing "done" is worth a warning, not a stop.
        if let Err(e) = successor.ready() {
            eprintln!("corelocal serve: --takeover: the old server did not confirm: {e}");
        }
        eprintln!(
            "corelocal serve: took over the listening sockets (the old server drains and exits)"
        );
        return Ok(());
    }
    let Some(Takeover::Pid(pid)) = common.takeover else {
        return Ok(());
    };
    if server.steering() != ActiveSteering::Local(Steering::Ebpf) {
        return Err(format!(
            "--takeover PID needs --mode local with eBPF steering (this server has {}): only a \
             program attached by the new process moves the group's SYNs to it (--takeover \
             SOCKET works in every mode)",
            server.steering()
        ));
    }
    signal::terminate(pid).map_err(|e| format!("--takeover: signalling pid {pid}: {e}"))?;
    eprintln!("corelocal serve: took over from pid {pid} (SIGTERM sent; it drains and exits)");
    Ok(())
}

/// `--upgrade-socket` is bound before the server starts (a live socket there fails early),
/// except when it is the path this process takes over from: the old server gives that path
/// up only at the end of the handover.
fn bind_upgrade_early(common: &CommonArgs) -> Result<Option<UpgradeListener>, String> {
    let Some(path) = &common.upgrade_socket else {
        return Ok(None);
    };
    if common.takeover == Some(Takeover::Socket(path.clone())) {
        return Ok(None);
    }
    UpgradeListener::bind(path)
        .map(Some)
        .map_err(|e| format!("--upgrade-socket: {e}"))
}

/// Starts waiting for a successor. Binding late (after taking over from the same path) can
/// only fail if something else grabbed the path meanwhile: this server keeps serving, without
/// an upgrade socket, rather than drop what it took over.
fn start_upgrade_socket(
    common: &CommonArgs,
    server: &Server,
    early: Option<UpgradeListener>,
) -> Option<UpgradeServer> {
    let path = common.upgrade_socket.as_ref()?;
    let listener = match early.map_or_else(|| UpgradeListener::bind(path), Ok) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("corelocal serve: --upgrade-socket: {e}; serving without it");
            return None;
        }
    };
    match UpgradeServer::start(listener, server.release_handle(), common.takeover_timeout) {
        Ok(u) => {
            eprintln!("corelocal serve: upgrade socket {}", path.display());
            Some(u)
        }
        Err(e) => {
            eprintln!("corelocal serve: --upgrade-socket: {e}; serving without it");
            None
        }
    }
}

fn open_stats_file(common: &CommonArgs) -> Result<Option<std::fs::File>, String> {
    let Some(path) = &common.stats_file else {
        return Ok(None);
    };
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map(Some)
        .map_err(|e| format!("opening {}: {e}", path.display()))
}

fn print_stats(now: &Snapshot, last: &Snapshot, elapsed: Duration, tick: Duration, json: bool) {
    if json {
        println!("{}", now.to_json());
        return;
    }
    let secs = tick.as_secs_f64();
    let mut line = format!("t={:>5.1}s", elapsed.as_secs_f64());
    for (w, l) in now.workers.iter().zip(&last.workers) {
        let accepted = w.accepted - l.accepted;
        let local = w.accepted_local - l.accepted_local;
        let local_pct = if accepted == 0 {
            100.0
        } else {
            100.0 * local as f64 / accepted as f64
        };
        line += &format!(
            " | w{} cpu{} conn/s {:.0} local {:.1}% stolen {} q {}{} req/s {:.0} open {} err {}",
            w.worker,
            w.cpu,
            accepted as f64 / secs,
            local_pct,
            w.stolen - l.stolen,
            w.queue_len,
            if w.busy { " BUSY" } else { "" },
            (w.requests - l.requests) as f64 / secs,
            w.open,
            w.errors.total() - l.errors.total(),
        );
    }
    if !now.net.is_zero() {
        let (n, l) = (&now.net, &last.net);
        line += &format!(
            " | net syncookies +{} listen drops +{}",
            n.syncookies_sent - l.syncookies_sent.min(n.syncookies_sent),
            n.listen_drops - l.listen_drops.min(n.listen_drops),
        );
    }
    println!("{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takeover_takes_a_pid_or_a_path() {
        assert_eq!(parse_takeover("4242"), Ok(Takeover::Pid(4242)));
        for path in ["./4242", "/run/corelocal.sock", "up.sock", "-x"] {
            assert_eq!(parse_takeover(path), Ok(Takeover::Socket(path.into())));
        }
        for (bad, why) in [
            ("1", "not a server's process id"),
            ("0", "not a server's process id"),
            ("-5", "not a server's process id"),
            ("99999999999", "out of range"),
            ("", "expected a process id or a unix socket path"),
        ] {
            let e = parse_takeover(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }
}
