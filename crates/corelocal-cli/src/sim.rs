//! `corelocal sim`: the many-core balancer simulation.

use std::process::ExitCode;

/// `corelocal sim` arguments.
#[derive(Debug, clap::Args)]
pub struct Command {}

/// Runs `corelocal sim`.
pub fn run(cmd: Command) -> ExitCode {
    let _ = cmd;
    eprintln!("corelocal sim: not built yet");
    ExitCode::from(2)
}
