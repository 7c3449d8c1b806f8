//! A fully resolved run ([`RunSpec`], its [`ScriptKind`]) and what a run produces before it
//! is reported ([`ThreadResult`], [`Snapshots`]): the types [`crate::runner`] fills and
//! [`crate::report`] reads. A leaf below both (it imports neither), so the runner and the
//! reports do not import each other's types.

use crate::engine::Unit;
use crate::options::Common;
use crate::stats::Stats;
use crate::workload::{
    CloseBy, FixedScript, HttpSession, KvDialect, KvScript, Reply, Script, SockperfScript,
};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;

/// What each session runs.
#[derive(Debug, Clone)]
pub enum ScriptKind {
    /// Fixed-size request/response, `txns` per connection (crr --proto rpc: 1).
    Rpc {
        /// Request bytes.
        msg: usize,
        /// Response bytes.
        resp: usize,
        /// Transactions per connection (0: never close).
        txns: u64,
        /// Who closes.
        close: CloseBy,
    },
    /// sockperf ping-pong messages of `msg` bytes, `txns` per connection (crr: 1).
    Sockperf {
        /// Message bytes, header included.
        msg: usize,
        /// Messages per connection (0: never close).
        txns: u64,
        /// Who closes.
        close: CloseBy,
    },
    /// One `GET path` with `Connection: close` per connection.
    CrrHttp {
        /// Path.
        path: String,
        /// Who closes.
        close: CloseBy,
    },
    /// httperf-style sessions.
    Http {
        /// Paths.
        urls: Vec<String>,
        /// Burst sizes.
        bursts: Vec<u32>,
        /// Think time (ns).
        think: u64,
        /// Keep-alive.
        keep_alive: bool,
        /// Pipeline bursts.
        pipeline: bool,
    },
    /// memcached mix.
    Kv {
        /// Key space.
        keys: u64,
        /// Fraction of gets.
        get_ratio: f64,
        /// Set value size.
        value_size: usize,
        /// Key prefix.
        prefix: String,
        /// Transactions per connection.
        txns: u64,
        /// The request language.
        dialect: KvDialect,
    },
}

/// A fully resolved run.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// Workload name.
    pub workload: &'static str,
    /// Common options.
    pub common: Common,
    /// Server address.
    pub target: SocketAddrV4,
    /// HOST:PORT as given (HTTP Host header).
    pub host: String,
    /// Session script.
    pub kind: ScriptKind,
    /// SO_LINGER 0.
    pub linger0: bool,
    /// Source addresses.
    pub src: Vec<Ipv4Addr>,
    /// Total connection slots.
    pub conns: usize,
    /// Unit of work.
    pub unit: Unit,
    /// The command's arguments, echoed into the report.
    pub config: serde_json::Value,
}

impl RunSpec {
    /// Resolves the target and defaults.
    pub fn new(
        workload: &'static str,
        common: Common,
        kind: ScriptKind,
        linger0: bool,
        config: serde_json::Value,
    ) -> Result<RunSpec, String> {
        let (target, host, _) = crate::options::resolve(&common.target)?;
        let unit = match kind {
            ScriptKind::Rpc { txns, .. }
            | ScriptKind::Kv { txns, .. }
            | ScriptKind::Sockperf { txns, .. }
                if txns != 1 =>
            {
                Unit::Txn
            }
            ScriptKind::Rpc { .. } | ScriptKind::Kv { .. } | ScriptKind::Sockperf { .. }
                if workload != "crr" =>
            {
                Unit::Txn
            }
            _ => Unit::Session,
        };
        let default_conns = match (workload, common.rate.is_some()) {
            ("rpc", _) => 256,
            ("http", false) => 200,
            (_, true) if unit == Unit::Session => 1000,
            _ => 64,
        };
        let conns = common.conns.unwrap_or(default_conns).max(common.cpus.len());
        let src = common.src.addrs(&target);
        Ok(RunSpec {
            workload,
            target,
            host,
            kind,
            linger0,
            src,
            conns,
            unit,
            config,
            common,
        })
    }

    pub(crate) fn script(&self) -> Box<dyn Fn() -> Box<dyn Script> + Send> {
        match &self.kind {
            ScriptKind::Rpc {
                msg,
                resp,
                txns,
                close,
            } => {
                let req: Arc<[u8]> = crate::proto::rpc_request(*msg).into();
                let (resp, txns, close) = (*resp, *txns, *close);
                Box::new(move || {
                    Box::new(FixedScript::new(
                        req.clone(),
                        Reply::Fixed(resp),
                        txns,
                        close,
                    ))
                })
            }
            ScriptKind::Sockperf { msg, txns, close } => {
                let (msg, txns, close) = (*msg, *txns, *close);
                Box::new(move || Box::new(SockperfScript::new(msg, txns, close)))
            }
            ScriptKind::CrrHttp { path, close } => {
                let req: Arc<[u8]> = crate::proto::http_get(&self.host, path, false).into();
                let close = *close;
                Box::new(move || Box::new(FixedScript::new(req.clone(), Reply::Http, 1, close)))
            }
            ScriptKind::Http {
                urls,
                bursts,
                think,
                keep_alive,
                pipeline,
            } => {
                let host: Arc<str> = self.host.as_str().into();
                let urls: Arc<[String]> = urls.clone().into();
                let bursts: Arc<[u32]> = bursts.clone().into();
                let (think, ka, pl) = (*think, *keep_alive, *pipeline);
                Box::new(move || {
                    Box::new(HttpSession::new(
                        host.clone(),
                        urls.clone(),
                        bursts.clone(),
                        think,
                        ka,
                        pl,
                    ))
                })
            }
            ScriptKind::Kv {
                keys,
                get_ratio,
                value_size,
                prefix,
                txns,
                dialect,
            } => {
                let prefix: Arc<str> = prefix.as_str().into();
                let (k, g, v, t, d) = (*keys, *get_ratio, *value_size, *txns, *dialect);
                Box::new(move || {
                    Box::new(KvScript::new(k, g, v, prefix.clone(), t).with_dialect(d))
                })
            }
        }
    }
}

/// One client thread's result.
#[derive(Debug)]
pub struct ThreadResult {
    /// CPU it was pinned to.
    pub cpu: usize,
    /// Engine used.
    pub engine: &'static str,
    /// Connection slots.
    pub conns: usize,
    /// Measurements.
    pub stats: Stats,
    /// A note (fallbacks).
    pub note: Option<String>,
}

/// Readings at a window edge.
#[derive(Debug, Clone, Default)]
pub struct Snapshots {
    /// The server process.
    pub server: Option<crate::procstat::Snapshot>,
    /// The server's own counters.
    pub counters: Option<Result<crate::serverstats::ServerSnapshot, String>>,
}

impl Snapshots {
    pub(crate) fn take(c: &Common, quiet: bool) -> Snapshots {
        Snapshots {
            server: c.server_pid.map(|p| crate::procstat::snapshot(Some(p))),
            counters: if quiet {
                None
            } else {
                c.server_stats
                    .as_ref()
                    .map(|s| crate::serverstats::fetch(s))
            },
        }
    }
}
