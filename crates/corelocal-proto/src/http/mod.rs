//! HTTP/1.1: request parser and response builder (sans-IO).
//!
//! - [`request`]: incremental request-head parser with limits (request line, header section,
//!   header count, body) and error kinds that map to status codes.
//! - [`path`]: request-target → normalised relative path (percent-decoding, no `..` escape,
//!   no NUL).
//! - [`date`]: IMF-fixdate formatting and parsing of the three HTTP date formats.
//! - [`range`]: single `Range: bytes=` parsing, entity-tag matching.
//! - [`response`]: status codes, response heads, small error bodies, content types.
//! - [`fileset`]: the paper's 30,000-file static workload, generated deterministically.
//!
//! Nothing here does I/O or reads a clock: the server (corelocal-apps) passes time in.

pub mod date;
pub mod fileset;
pub mod path;
#[cfg(test)]
mod proptests;
pub mod range;
pub mod request;
pub mod response;

pub use path::{normalize_target, NormPath, PathError};
pub use request::{Error, Limits, Method, Parse, Parser, Request, Version};
pub use response::Status;
