//! Command-line arguments of `corelocal bench` and their parsing.
//!
//! Layout: this file holds the [`Command`] and its [`Workload`] subcommands; `workloads` each
//! subcommand's arguments; `spec` validation and [`execute`]. The value types of flags
//! ([`Dur`], [`SrcSpec`]), the options every workload takes ([`Common`]) and target resolution
//! live in [`crate::options`] (re-exported here), which the runner and the reports share.

mod spec;
#[cfg(test)]
mod tests;
mod workloads;

pub use crate::options::{
    load_urls, parse_urls, resolve, ArrivalKind, Common, Dur, EngineKind, ProgressKind, SrcSpec,
    MAX_SRC,
};
pub use spec::{execute, to_spec};
pub use workloads::{CrrArgs, CrrProto, HttpArgs, KvArgs, RpcArgs, RpcProto};

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
Needs root (unshare -n). Writes results/compare/bench-compare-<date>-<workload>.{json,md}.")]
    Compare(crate::compare::CompareArgs),
    /// (internal) One compare run inside its network namespace.
    #[command(name = "__round", hide = true)]
    Round(crate::compare::RoundArgs),
}
