//! The per-core runtime: workers, the sans-IO handler API, stats and backends.

pub mod handler;

pub use handler::{
    CloseReason, ConnInfo, FileRegion, Handler, Next, Output, OutputFront, Service, Step,
};
