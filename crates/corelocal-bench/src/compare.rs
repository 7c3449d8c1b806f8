//! `corelocal bench compare` (being written).

use std::process::ExitCode;

/// `compare` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {}

/// Runs the comparison.
pub fn run(_a: CompareArgs) -> Result<ExitCode, String> {
    Err("not yet".into())
}
