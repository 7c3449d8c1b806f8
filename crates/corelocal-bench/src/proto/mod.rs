//! Protocol clients, sans-IO: request builders and incremental response parsers.
//!
//! A parser is fed whatever bytes arrived (any split) and answers [`Progress::NeedMore`] or
//! [`Progress::Done`] with how many bytes the response used; bytes past that belong to the
//! next (pipelined) response. Every parser is bounded: headers and lines have a size limit and
//! a violation is a [`ProtoError`], never unbounded memory.
//!
//! Layout: this file holds what every client shares ([`RespInfo`], [`Progress`],
//! [`ProtoError`], [`MAX_HEADER`]) and the [`Parser`] enum over them; `rpc`, `sockperf`, `http`
//! and `kv` (memcached) each hold one protocol's request builders and response parser.

mod http;
mod kv;
mod rpc;
mod sockperf;
#[cfg(test)]
mod tests;

pub use http::{http_get, HttpParser};
pub use kv::{kv_get, kv_line_get, kv_line_set, kv_mg, kv_ms, kv_set, KvExpect, KvParser};
pub use rpc::{rpc_request, RpcParser};
pub use sockperf::SockperfParser;

use std::fmt;

/// Longest HTTP header block or memcached line accepted.
pub const MAX_HEADER: usize = 64 * 1024;

/// What a completed response said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RespInfo {
    /// HTTP status (0 for other protocols).
    pub status: u16,
    /// memcached get: `Some(true)` on a hit, `Some(false)` on a miss; `None` otherwise.
    pub hit: Option<bool>,
    /// The server announced it will close the connection (`Connection: close`).
    pub server_closes: bool,
    /// Body / value bytes.
    pub body: usize,
}

/// Result of feeding bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// All bytes were consumed and the response is not complete yet.
    NeedMore,
    /// The response is complete after `consumed` bytes of the input.
    Done {
        /// Bytes of the input that belong to this response.
        consumed: usize,
        /// What the response said.
        info: RespInfo,
    },
}

/// A malformed or oversized response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtoError(pub String);

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProtoError {}

fn err<T>(msg: impl Into<String>) -> Result<T, ProtoError> {
    Err(ProtoError(msg.into()))
}

/// One response parser of any supported protocol.
#[derive(Debug, Clone)]
pub enum Parser {
    /// Fixed-size RPC response.
    Rpc(RpcParser),
    /// HTTP/1.x response.
    Http(HttpParser),
    /// memcached text protocol response.
    Kv(KvParser),
    /// sockperf pong.
    Sockperf(SockperfParser),
}

impl Parser {
    /// Feeds bytes.
    pub fn feed(&mut self, data: &[u8]) -> Result<Progress, ProtoError> {
        match self {
            Parser::Rpc(p) => Ok(p.feed(data)),
            Parser::Http(p) => p.feed(data),
            Parser::Kv(p) => p.feed(data),
            Parser::Sockperf(p) => p.feed(data),
        }
    }

    /// The peer closed the connection: completes a close-delimited response, else an error.
    pub fn eof(&mut self) -> Result<RespInfo, ProtoError> {
        match self {
            Parser::Http(p) => p.eof(),
            _ => err("connection closed before the response was complete"),
        }
    }
}
