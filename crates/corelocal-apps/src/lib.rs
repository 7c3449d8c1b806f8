//! Ready servers on the corelocal runtime: each is a sans-IO protocol from `corelocal-proto`
//! plus a [`corelocal::runtime::Service`].
//!
//! - [`rpc`]: MegaPipe's RPC microbenchmark server (keep-alive or one-shot).
//! - [`http`]: static HTTP/1.1 file server.
//! - [`kv`]: memcached text-protocol server.
//! - [`sockperf`]: the `sockperf server --tcp` protocol (ping-pong echo).
//! - [`tls`]: TLS (rustls) around any of them, per worker.

pub mod http;
pub mod kv;
pub mod rpc;
pub mod sockperf;
pub mod tls;
