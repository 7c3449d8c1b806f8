//! Each load workload's arguments: `rpc`, `crr`, `http` and `kv`.

use super::{Common, Dur};
use crate::workload::CloseBy;
use serde::Serialize;
use std::path::PathBuf;

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
    /// Speak the meta protocol: `mg <key> v` for gets, `ms <key> <len>` for sets.
    #[arg(long, conflicts_with = "line")]
    pub meta: bool,
    /// Speak the line protocol of corelocal's `kv` example (`GET key`, `SET key value`, one
    /// answer line each) instead of memcached's.
    #[arg(long)]
    pub line: bool,
}
