//! The run options the command line, the runner, the reports and `compare` share: flag value
//! types ([`Dur`], [`SrcSpec`]), the options every workload takes ([`Common`] and its enums),
//! and target resolution. A leaf: it imports nothing above it (only [`crate::serverstats`]'s
//! URL splitting), so [`crate::cli`], [`crate::runner`], [`crate::report`] and
//! [`crate::compare`] all depend on it and not on each other through it.

mod common;
mod targets;
mod values;

pub use common::{ArrivalKind, Common, EngineKind, ProgressKind};
pub use targets::{load_urls, parse_urls, resolve};
pub use values::{Dur, SrcSpec, MAX_SRC};
