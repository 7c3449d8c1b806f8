//! Sans-IO protocol logic for corelocal servers: bytes in, bytes out, `now` passed in; no
//! sockets, no threads, no clocks.
//!
//! - [`rpc`]: MegaPipe's fixed-size request/response microbenchmark protocol.
//! - [`http`]: HTTP/1.1 request parsing and response building.
//! - [`memcache`]: the memcached text protocol.
//! - [`sockperf`]: sockperf's TCP ping-pong messages (client requests, framing, server rules).

pub mod http;
pub mod memcache;
pub mod rpc;
pub mod sockperf;
