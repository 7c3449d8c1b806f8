//! `corelocal tune`: inspect, plan, diff, apply, verify and revert NIC steering.

use std::process::ExitCode;

/// `corelocal tune` arguments.
#[derive(Debug, clap::Args)]
pub struct Command {}

/// Runs `corelocal tune`.
pub fn run(cmd: Command) -> ExitCode {
    let _ = cmd;
    eprintln!("corelocal tune: not built yet");
    ExitCode::from(2)
}
