//! Command-line arguments of `corelocal bench` and their parsing.

use crate::runner::{self, RunSpec, ScriptKind};
use crate::workload::CloseBy;
use corelocal::cpu::CpuSet;
use serde::Serialize;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;

/// `corelocal bench` arguments.
#[derive(Debug, clap::Args)]
pub struct Command {
    /// The workload.
    #[command(subcommand)]
    pub workload: Workload,
}

/// A parser of `bench …` arguments on their own (for re-executed runs and tests).
#[derive(Debug, clap::Parser)]
#[command(name = "bench")]
pub struct Standalone {
    #[command(flatten)]
    cmd: Command,
}

impl Standalone {
    /// Parses `["bench", workload, args…]`.
    pub fn try_parse_args(args: &[String]) -> Result<Command, String> {
        use clap::Parser;
        Standalone::try_parse_from(args)
            .map(|s| s.cmd)
            .map_err(|e| e.to_string())
    }
}

/// Workloads.
#[derive(Debug, clap::Subcommand)]
pub enum Workload {
    /// MegaPipe RPC: fixed-size request/response, N transactions per connection; or sockperf
    /// ping-pong (`--proto sockperf`, e.g. against `sockperf server --tcp`).
    #[command(after_help = "Examples:
  corelocal bench rpc --target 127.0.0.1:7000 --msg-size 64 --txns-per-conn 10 --conns 256 --cpus 0 --duration 10s
  corelocal bench rpc --target 127.0.0.1:7000 --txns-per-conn 0 --conns 64 --requests 100000 --json results/rpc.json
  corelocal bench rpc --target 127.0.0.1:7000 --conns 64 --rate 50000 --arrivals exp --server-pid $(pgrep -n corelocal)
  corelocal bench rpc --proto sockperf --target 127.0.0.1:11111 --msg-size 64 --txns-per-conn 0   # sockperf server --tcp")]
    Rpc(RpcArgs),
    /// Connection rate: one request/response per connection (DNS-over-TCP, OCSP, whois shape).
    #[command(after_help = "Examples:
  corelocal bench crr --target 127.0.0.1:8080 --proto http --path /hello --cpus 0 --conns 64 --duration 10s
  corelocal bench crr --target 127.0.0.1:7000 --proto rpc --msg-size 64 --close server --linger0
  corelocal bench crr --target 127.0.0.1:8080 --proto http --server-pid $(pgrep -n nginx) --json results/crr.json
  corelocal bench crr --target 127.0.0.1:11111 --proto sockperf --msg-size 64")]
    Crr(CrrArgs),
    /// httperf-style HTTP sessions: bursts with think time over a URL list.
    #[command(after_help = "Examples:
  corelocal bench http --target http://127.0.0.1:8080/ --bursts 1,2,3 --think 100ms --conns 200
  corelocal bench http --target 127.0.0.1:8080 --urls paper --rate 2000 --arrivals exp --close
  corelocal bench http --target http://127.0.0.1:8080/hello --bursts 100 --think 0 --conns 64   # keep-alive RR")]
    Http(HttpArgs),
    /// memcached text protocol: get/set mix over a key space.
    #[command(after_help = "Examples:
  corelocal bench kv --target 127.0.0.1:11211 --keys 10000 --get-ratio 0.9 --value-size 100 --conns 64
  corelocal bench kv --target 127.0.0.1:11211 --txns-per-conn 1 --conns 64 --duration 5s   # get on a fresh connection")]
    Kv(KvArgs),
    /// Side-by-side A B A B rounds against several servers, each round in a fresh netns.
    #[command(after_help = "Examples:
  corelocal bench compare --peer floor --peer nginx --peer corelocal --workload crr --rounds 3
  corelocal bench compare --server 'mine=./my_server {port} {cpu}' --peer nginx --workload http-ka
Needs root (unshare -n). Writes results/bench-compare-<date>-<workload>.{json,md}.")]
    Compare(crate::compare::CompareArgs),
    /// (internal) One compare run inside its network namespace.
    #[command(name = "__round", hide = true)]
    Round(crate::compare::RoundArgs),
}

/// A duration: `100ms`, `10s`, `2m`, `1.5s`, `250us`; a bare number is seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Dur(pub u64);

impl Dur {
    /// Nanoseconds.
    pub fn ns(self) -> u64 {
        self.0
    }
    /// Seconds.
    pub fn secs(self) -> f64 {
        self.0 as f64 / 1e9
    }
}

impl FromStr for Dur {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let v: f64 = num
            .parse()
            .map_err(|_| format!("bad duration {s:?} (e.g. 100ms, 10s, 2m)"))?;
        let mul = match unit {
            "" | "s" => 1e9,
            "ms" => 1e6,
            "us" | "µs" => 1e3,
            "ns" => 1.0,
            "m" | "min" => 60e9,
            "h" => 3600e9,
            _ => {
                return Err(format!(
                    "bad duration unit {unit:?} in {s:?} (ns, us, ms, s, m, h)"
                ))
            }
        };
        if !v.is_finite() || v < 0.0 || v * mul > 1e18 {
            return Err(format!("duration out of range: {s:?}"));
        }
        Ok(Dur((v * mul) as u64))
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        if n == 0 {
            f.write_str("0s")
        } else if n % 1_000_000_000 == 0 {
            write!(f, "{}s", n / 1_000_000_000)
        } else if n % 1_000_000 == 0 {
            write!(f, "{}ms", n / 1_000_000)
        } else if n % 1000 == 0 {
            write!(f, "{}us", n / 1000)
        } else {
            write!(f, "{n}ns")
        }
    }
}

impl Serialize for Dur {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

/// Source addresses: `auto`, `none`, a CIDR (`127.0.0.0/8`) or a range (`127.0.0.2-127.0.0.201`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SrcSpec {
    /// On loopback: none until ephemeral ports run out, then 127.0.0.2–127.0.0.201; else none.
    Auto,
    /// Let the kernel choose.
    None,
    /// An inclusive range.
    Range(Ipv4Addr, Ipv4Addr),
}

/// Most source addresses used (each gives ~28k ports).
pub const MAX_SRC: u32 = 4096;

impl SrcSpec {
    /// The addresses for a target.
    pub fn addrs(&self, target: &SocketAddrV4) -> Vec<Ipv4Addr> {
        let (a, b) = match self {
            SrcSpec::None => return Vec::new(),
            SrcSpec::Auto if target.ip().is_loopback() => {
                (Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::new(127, 0, 0, 201))
            }
            SrcSpec::Auto => return Vec::new(),
            SrcSpec::Range(a, b) => (*a, *b),
        };
        let (a, b) = (u32::from(a), u32::from(b));
        let last = b.min(a.saturating_add(MAX_SRC - 1));
        (a..=last)
            .filter(|x| x & 0xff != 0 && x & 0xff != 0xff)
            .map(Ipv4Addr::from)
            .collect()
    }
}

impl FromStr for SrcSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => return Ok(SrcSpec::Auto),
            "none" => return Ok(SrcSpec::None),
            _ => {}
        }
        let bad = || format!("bad --src {s:?}: auto, none, 127.0.0.0/8 or 127.0.0.2-127.0.0.201");
        if let Some((ip, bits)) = s.split_once('/') {
            let ip: Ipv4Addr = ip.parse().map_err(|_| bad())?;
            let bits: u32 = bits.parse().map_err(|_| bad())?;
            if !(8..=32).contains(&bits) {
                return Err(bad());
            }
            let mask = if bits == 32 {
                u32::MAX
            } else {
                !(u32::MAX >> bits)
            };
            let net = u32::from(ip) & mask;
            let first = if bits >= 31 { net } else { net + 1 };
            let last = if bits >= 31 {
                net | !mask
            } else {
                (net | !mask) - 1
            };
            return Ok(SrcSpec::Range(first.into(), last.into()));
        }
        if let Some((a, b)) = s.split_once('-') {
            let a: Ipv4Addr = a.parse().map_err(|_| bad())?;
            let b: Ipv4Addr = b.parse().map_err(|_| bad())?;
            if u32::from(a) > u32::from(b) {
                return Err(bad());
            }
            return Ok(SrcSpec::Range(a, b));
        }
        let a: Ipv4Addr = s.parse().map_err(|_| bad())?;
        Ok(SrcSpec::Range(a, a))
    }
}

impl fmt::Display for SrcSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SrcSpec::Auto => f.write_str("auto"),
            SrcSpec::None => f.write_str("none"),
            SrcSpec::Range(a, b) => write!(f, "{a}-{b}"),
        }
    }
}

impl Serialize for SrcSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

/// Client engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// io_uring with direct descriptors when available, else plain io_uring, else epoll.
    Auto,
    /// io_uring (direct descriptors when the kernel has them; fails if io_uring is unavailable).
    Uring,
    /// io_uring with ordinary file descriptors (socket/bind as syscalls).
    UringFd,
    /// epoll.
    Epoll,
}

/// Open-loop arrival process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ArrivalKind {
    /// Evenly spaced.
    Det,
    /// Poisson (exponential gaps).
    Exp,
}

/// Progress display.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ProgressKind {
    /// On a terminal only.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

/// Options every workload takes.
#[derive(Debug, Clone, clap::Args, Serialize)]
pub struct Common {
    /// Server: HOST:PORT (or http://HOST:PORT/PATH for http).
    #[arg(long, short = 't')]
    pub target: String,
    /// Client CPUs: one pinned thread per CPU (cpulist, e.g. 0 or 0-1,3).
    #[arg(long, default_value = "0")]
    pub cpus: CpuSet,
    /// Run length after warm-up (default 10s; with --requests it is only a time limit, default 300s).
    #[arg(long, short = 'd')]
    pub duration: Option<Dur>,
    /// Stop after this many units (rpc/kv: transactions; crr: connections; http: sessions).
    #[arg(long, short = 'n')]
    pub requests: Option<u64>,
    /// Warm-up excluded from results (default 1s, 0 with --requests).
    #[arg(long)]
    pub warmup: Option<Dur>,
    /// Concurrent connections in total (closed loop: each runs back to back).
    #[arg(long, short = 'c')]
    pub conns: Option<usize>,
    /// Open loop: units per second in total (crr: connections/s, http: sessions/s, rpc/kv: txns/s).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Open-loop arrivals.
    #[arg(long, value_enum, default_value = "det")]
    pub arrivals: ArrivalKind,
    /// Client engine.
    #[arg(long, value_enum, default_value = "auto")]
    pub engine: EngineKind,
    /// Source addresses (each gives ~28k ports): auto, none, 127.0.0.0/8, A-B. `auto` on
    /// loopback: the kernel's choice until ephemeral ports run out, then 127.0.0.2–201 (the
    /// connect that found no port is retried from one; binding costs two operations per
    /// connection, so it is done only when needed).
    #[arg(long, default_value = "auto")]
    pub src: SrcSpec,
    /// A session with no progress for this long fails (timeout error).
    #[arg(long, default_value = "5s")]
    pub timeout: Dur,
    /// Server process to charge CPU to (utime+stime and per-thread schedstat over the window).
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// corelocal server stats: a FILE (last JSON line) or http:// URL.
    #[arg(long)]
    pub server_stats: Option<String>,
    /// Search the saturating open-loop rate first, then run at it.
    #[arg(long)]
    pub rate_search: bool,
    /// Rate search: first rate (units/s).
    #[arg(long, default_value = "1000")]
    pub search_start: f64,
    /// Rate search: length of each probe.
    #[arg(long, default_value = "2s")]
    pub search_duration: Dur,
    /// Rate search: most probes.
    #[arg(long, default_value = "12")]
    pub search_probes: usize,
    /// Rate search: a probe fails when corrected p99 exceeds this.
    #[arg(long)]
    pub search_p99: Option<Dur>,
    /// Write the JSON report here (markdown and SVG plots go next to it).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the markdown summary here (default: next to --json, and always to stdout).
    #[arg(long)]
    pub md: Option<PathBuf>,
    /// SVG plot prefix (PREFIX-throughput.svg, PREFIX-latency.svg with the CDF,
    /// PREFIX-latency-percentiles.svg; default: next to --json).
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Progress bar.
    #[arg(long, value_enum, default_value = "auto")]
    pub progress: ProgressKind,
    /// Receive buffer per connection (bytes).
    #[arg(long, default_value = "16384")]
    pub recv_buf: usize,
    /// Random seed.
    #[arg(long, default_value = "1")]
    pub seed: u64,
    /// Exit non-zero when errors exceed this fraction of units.
    #[arg(long, default_value = "0.01")]
    pub max_error_rate: f64,
    /// Disable TCP_NODELAY.
    #[arg(long)]
    pub no_nodelay: bool,
}

/// Protocol of an rpc connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum RpcProto {
    /// MegaPipe's fixed-size request/response (corelocal serve rpc).
    Rpc,
    /// sockperf ping-pong over TCP (`sockperf server --tcp`, corelocal serve sockperf):
    /// --msg-size is the whole message (14..=65507 bytes), answered by a pong of the same size.
    Sockperf,
}

/// `rpc` arguments.
#[derive(Debug, Clone, clap::Args, Serialize)]
pub struct RpcArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: Common,
    /// Protocol.
    #[arg(long, value_enum, default_value = "rpc")]
    pub proto: RpcProto,
    /// Request size (bytes).
    #[arg(long, default_value = "64")]
    pub msg_size: usize,
    /// Response size (default: --msg-size).
    #[arg(long)]
    pub resp_size: Option<usize>,
    /// Transactions per connection, then reconnect (0: never).
    #[arg(long, default_value = "10")]
    pub txns_per_conn: u64,
    /// Close with RST (SO_LINGER 0), as MegaPipe did.
    #[arg(long)]
    pub linger0: bool,
}

/// Protocol of a crr connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum CrrProto {
    /// Fixed-size request/response (corelocal serve rpc --one-shot).
    Rpc,
    /// `GET PATH` with `Connection: close` (nginx, floor_server).
    Http,
    /// One sockperf ping-pong message of --msg-size bytes (sockperf server --tcp).
    Sockperf,
}

/// `crr` arguments.
#[derive(Debug, Clone, clap::Args, Serialize)]
pub struct CrrArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: Common,
    /// Protocol.
    #[arg(long, value_enum, default_value = "http")]
    pub proto: CrrProto,
    /// HTTP path.
    #[arg(long, default_value = "/hello")]
    pub path: String,
    /// RPC request size.
    #[arg(long, default_value = "64")]
    pub msg_size: usize,
    /// RPC response size (default: --msg-size).
    #[arg(long)]
    pub resp_size: Option<usize>,
    /// Who closes: the client right after the response, or the server (await its FIN).
    #[arg(long, value_enum, default_value = "client")]
    pub close: CloseBy,
    /// SO_LINGER 0: the client's close sends RST (no TIME_WAIT).
    #[arg(long)]
    pub linger0: bool,
}

/// `http` arguments.
#[derive(Debug, Clone, clap::Args, Serialize)]
pub struct HttpArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: Common,
    /// URL list: a file with one path (or http URL) per line, or `paper` for the 30,000-file
    /// set of Affinity-Accept §6.2 (corelocal_proto::http::fileset; `corelocal serve http`
    /// serves it built in). Default: the target URL's path.
    #[arg(long)]
    pub urls: Option<PathBuf>,
    /// Requests per burst (1,2,3 = the paper's 6 files per connection).
    #[arg(long, default_value = "1,2,3", value_delimiter = ',')]
    pub bursts: Vec<u32>,
    /// Think time between bursts.
    #[arg(long, default_value = "100ms")]
    pub think: Dur,
    /// A new connection per request (`Connection: close`) instead of keep-alive.
    #[arg(long)]
    pub close: bool,
    /// Send each burst's requests back to back without waiting (HTTP pipelining).
    #[arg(long)]
    pub pipeline: bool,
}

/// `kv` arguments.
#[derive(Debug, Clone, clap::Args, Serialize)]
pub struct KvArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: Common,
    /// Keys in the key space.
    #[arg(long, default_value = "10000")]
    pub keys: u64,
    /// Fraction of gets (the rest are sets).
    #[arg(long, default_value = "0.9")]
    pub get_ratio: f64,
    /// Value size of sets (bytes).
    #[arg(long, default_value = "100")]
    pub value_size: usize,
    /// Key prefix.
    #[arg(long, default_value = "clb:")]
    pub key_prefix: String,
    /// Transactions per connection, then reconnect (0: never).
    #[arg(long, default_value = "0")]
    pub txns_per_conn: u64,
}

/// Resolves HOST:PORT (or http://HOST:PORT/…) to an IPv4 address.
pub fn resolve(target: &str) -> Result<(SocketAddrV4, String, String), String> {
    let (hostport, path) = if target.starts_with("http://") {
        crate::serverstats::split_url(target)?
    } else if target.contains("://") {
        return Err(format!(
            "unsupported target {target:?}: HOST:PORT or http://HOST:PORT/PATH"
        ));
    } else {
        (target.to_string(), "/".to_string())
    };
    let addr = hostport
        .to_socket_addrs()
        .map_err(|e| format!("bad --target {target:?}: {e}"))?
        .find_map(|a| match a {
            std::net::SocketAddr::V4(v4) => Some(v4),
            _ => None,
        })
        .ok_or_else(|| format!("--target {target:?} has no IPv4 address"))?;
    Ok((addr, hostport, path))
}

fn validate(c: &Common) -> Result<(), String> {
    if c.cpus.is_empty() {
        return Err("--cpus is empty".into());
    }
    if let Some(r) = c.rate {
        if !(r.is_finite() && r > 0.0) {
            return Err(format!("--rate must be positive, got {r}"));
        }
    }
    if c.conns == Some(0) {
        return Err("--conns must be at least 1".into());
    }
    if c.duration.map(Dur::ns) == Some(0) {
        return Err("--duration must be positive".into());
    }
    if c.requests == Some(0) {
        return Err("--requests must be positive".into());
    }
    if c.recv_buf < 64 || c.recv_buf > 16 << 20 {
        return Err("--recv-buf must be in 64..16M".into());
    }
    Ok(())
}

/// Runs a parsed command.
pub fn execute(cmd: Command) -> Result<ExitCode, String> {
    match cmd.workload {
        Workload::Compare(a) => crate::compare::run(a),
        Workload::Round(a) => crate::compare::round(a),
        w => runner::main(to_spec(w)?),
    }
}

/// Validates a workload's arguments and resolves them into a [`RunSpec`].
pub fn to_spec(w: Workload) -> Result<RunSpec, String> {
    let spec = match w {
        Workload::Compare(_) | Workload::Round(_) => return Err("not a load workload".into()),
        Workload::Rpc(a) => {
            validate(&a.common)?;
            if a.msg_size == 0 {
                return Err("--msg-size must be at least 1".into());
            }
            let kind = match a.proto {
                RpcProto::Rpc => ScriptKind::Rpc {
                    msg: a.msg_size,
                    resp: a.resp_size.unwrap_or(a.msg_size),
                    txns: a.txns_per_conn,
                    close: CloseBy::Client,
                },
                RpcProto::Sockperf => ScriptKind::Sockperf {
                    msg: sockperf_size(a.msg_size, a.resp_size)?,
                    txns: a.txns_per_conn,
                    close: CloseBy::Client,
                },
            };
            RunSpec::new(
                "rpc",
                a.common.clone(),
                kind,
                a.linger0,
                serde_json::to_value(&a).map_err(|e| e.to_string())?,
            )?
        }
        Workload::Crr(a) => {
            validate(&a.common)?;
            let kind = match a.proto {
                CrrProto::Rpc => ScriptKind::Rpc {
                    msg: a.msg_size.max(1),
                    resp: a.resp_size.unwrap_or(a.msg_size),
                    txns: 1,
                    close: a.close,
                },
                CrrProto::Http => ScriptKind::CrrHttp {
                    path: a.path.clone(),
                    close: a.close,
                },
                CrrProto::Sockperf if a.close == CloseBy::Server => {
                    return Err(
                        "--proto sockperf: sockperf servers never close (use --close client)"
                            .into(),
                    )
                }
                CrrProto::Sockperf => ScriptKind::Sockperf {
                    msg: sockperf_size(a.msg_size, a.resp_size)?,
                    txns: 1,
                    close: CloseBy::Client,
                },
            };
            RunSpec::new(
                "crr",
                a.common.clone(),
                kind,
                a.linger0,
                serde_json::to_value(&a).map_err(|e| e.to_string())?,
            )?
        }
        Workload::Http(a) => {
            validate(&a.common)?;
            if a.bursts.is_empty() || a.bursts.contains(&0) {
                return Err("--bursts needs positive sizes, e.g. 1,2,3".into());
            }
            let (_, _, path) = resolve(&a.common.target)?;
            let urls = match &a.urls {
                Some(f) if f.as_os_str() == "paper" => (0
                    ..corelocal_proto::http::fileset::FILE_COUNT)
                    .map(corelocal_proto::http::fileset::path)
                    .collect(),
                Some(f) => load_urls(f)?,
                None => vec![path],
            };
            RunSpec::new(
                "http",
                a.common.clone(),
                ScriptKind::Http {
                    urls,
                    bursts: a.bursts.clone(),
                    think: a.think.ns(),
                    keep_alive: !a.close,
                    pipeline: a.pipeline,
                },
                false,
                serde_json::to_value(&a).map_err(|e| e.to_string())?,
            )?
        }
        Workload::Kv(a) => {
            validate(&a.common)?;
            if !(0.0..=1.0).contains(&a.get_ratio) {
                return Err("--get-ratio must be within 0..1".into());
            }
            if a.key_prefix.contains(char::is_whitespace) || a.key_prefix.len() > 200 {
                return Err("--key-prefix must be short and without spaces".into());
            }
            RunSpec::new(
                "kv",
                a.common.clone(),
                ScriptKind::Kv {
                    keys: a.keys,
                    get_ratio: a.get_ratio,
                    value_size: a.value_size,
                    prefix: a.key_prefix.clone(),
                    txns: a.txns_per_conn,
                },
                false,
                serde_json::to_value(&a).map_err(|e| e.to_string())?,
            )?
        }
    };
    Ok(spec)
}

/// Checks a sockperf message size: 14..=65,507 bytes, and the pong is the same size.
fn sockperf_size(msg: usize, resp: Option<usize>) -> Result<usize, String> {
    use corelocal_proto::sockperf::{HEADER_LEN, MAX_MESSAGE_LEN};
    if !(HEADER_LEN..=MAX_MESSAGE_LEN).contains(&msg) {
        return Err(format!(
            "--proto sockperf: --msg-size must be within {HEADER_LEN}..={MAX_MESSAGE_LEN} (the whole message, header included), got {msg}"
        ));
    }
    if resp.is_some_and(|r| r != msg) {
        return Err(
            "--proto sockperf: the pong is as long as the message; drop --resp-size".into(),
        );
    }
    Ok(msg)
}

/// Reads a URL list: one path or http URL per line; `#` comments and blanks skipped.
pub fn load_urls(path: &std::path::Path) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let urls = parse_urls(&text)?;
    if urls.is_empty() {
        return Err(format!("{}: no URLs", path.display()));
    }
    Ok(urls)
}

/// Parses a URL list (see [`load_urls`]).
pub fn parse_urls(text: &str) -> Result<Vec<String>, String> {
    let mut v = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let p = if l.starts_with("http://") {
            crate::serverstats::split_url(l)?.1
        } else {
            l.to_string()
        };
        if !p.starts_with('/') || p.contains(char::is_whitespace) {
            return Err(format!("URL list line {}: {l:?} is not a path", n + 1));
        }
        v.push(p);
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, clap::Parser)]
    struct T {
        #[command(flatten)]
        c: Command,
    }

    #[test]
    fn durations() {
        assert_eq!("100ms".parse::<Dur>().unwrap().ns(), 100_000_000);
        assert_eq!("1.5s".parse::<Dur>().unwrap().ns(), 1_500_000_000);
        assert_eq!("2".parse::<Dur>().unwrap().ns(), 2_000_000_000);
        assert_eq!("2m".parse::<Dur>().unwrap().ns(), 120_000_000_000);
        assert_eq!("250us".parse::<Dur>().unwrap().ns(), 250_000);
        assert!("10 parsecs".parse::<Dur>().is_err());
        assert!("-1s".parse::<Dur>().is_err());
        assert!("".parse::<Dur>().is_err());
        assert_eq!(Dur(100_000_000).to_string(), "100ms");
        assert_eq!(Dur(3_000_000_000).to_string(), "3s");
    }

    #[test]
    fn source_specs() {
        let t: SocketAddrV4 = "127.0.0.1:80".parse().unwrap();
        assert_eq!(SrcSpec::Auto.addrs(&t).len(), 200);
        assert!(SrcSpec::Auto
            .addrs(&"10.1.1.1:80".parse().unwrap())
            .is_empty());
        let s: SrcSpec = "127.0.0.0/8".parse().unwrap();
        let a = s.addrs(&t);
        assert_eq!(a.len(), 4064); // 4096 addresses from 127.0.0.1, less each /24's .0 and .255
        assert_eq!(a[0], Ipv4Addr::new(127, 0, 0, 1));
        assert!(a.iter().all(|x| x.octets()[3] != 0 && x.octets()[3] != 255));
        let r: SrcSpec = "127.0.0.2-127.0.0.4".parse().unwrap();
        assert_eq!(r.addrs(&t).len(), 3);
        assert_eq!("127.0.0.9".parse::<SrcSpec>().unwrap().addrs(&t).len(), 1);
        assert!("127.0.0.9-127.0.0.1".parse::<SrcSpec>().is_err());
        assert!("1.2.3.4/40".parse::<SrcSpec>().is_err());
        assert!("nonsense".parse::<SrcSpec>().is_err());
    }

    #[test]
    fn targets_and_url_lists() {
        let (a, hp, p) = resolve("http://127.0.0.1:8080/x/y").unwrap();
        assert_eq!(
            (a.port(), hp.as_str(), p.as_str()),
            (8080, "127.0.0.1:8080", "/x/y")
        );
        assert_eq!(resolve("127.0.0.1:7000").unwrap().0.port(), 7000);
        assert!(resolve("https://127.0.0.1/").is_err());
        assert!(resolve("127.0.0.1").is_err());
        assert_eq!(
            parse_urls("# c\n/a\n\nhttp://h:1/b\n").unwrap(),
            vec!["/a", "/b"]
        );
        assert!(parse_urls("a b\n").is_err());
    }

    #[test]
    fn invalid_flags_are_clear_errors() {
        let e =
            T::try_parse_from(["t", "rpc", "--target", "127.0.0.1:1", "--cpus", "x"]).unwrap_err();
        assert!(e.to_string().contains("--cpus"), "{e}");
        let e = T::try_parse_from(["t", "crr", "--target", "127.0.0.1:1", "--duration", "ten"])
            .unwrap_err();
        assert!(e.to_string().contains("bad duration"), "{e}");
        let t =
            T::try_parse_from(["t", "kv", "--target", "127.0.0.1:1", "--get-ratio", "2"]).unwrap();
        assert!(execute(t.c).unwrap_err().contains("--get-ratio"));
        let t =
            T::try_parse_from(["t", "http", "--target", "127.0.0.1:1", "--bursts", "1,0"]).unwrap();
        assert!(execute(t.c).unwrap_err().contains("--bursts"));
        let t = T::try_parse_from(["t", "rpc", "--target", "127.0.0.1:1", "--rate=-5"]).unwrap();
        assert!(execute(t.c).unwrap_err().contains("--rate"));
        for (args, want) in [
            (
                &["rpc", "--proto", "sockperf", "--msg-size", "13"][..],
                "14..=65507",
            ),
            (
                &["rpc", "--proto", "sockperf", "--msg-size", "65508"][..],
                "14..=65507",
            ),
            (
                &["rpc", "--proto", "sockperf", "--resp-size", "100"][..],
                "--resp-size",
            ),
            (
                &["crr", "--proto", "sockperf", "--close", "server"][..],
                "never close",
            ),
        ] {
            let mut v = vec!["t"];
            v.extend_from_slice(args);
            v.extend_from_slice(&["--target", "127.0.0.1:1"]);
            let e = execute(T::try_parse_from(v).unwrap().c).unwrap_err();
            assert!(e.contains(want), "{args:?}: {e}");
        }
        let t = T::try_parse_from([
            "t",
            "http",
            "--target",
            "http://127.0.0.1:8/",
            "--bursts",
            "1,2,3",
            "--think",
            "100ms",
        ])
        .unwrap();
        match t.c.workload {
            Workload::Http(h) => assert_eq!((h.bursts, h.think.ns()), (vec![1, 2, 3], 100_000_000)),
            _ => unreachable!(),
        }
    }
}
