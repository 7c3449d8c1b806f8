//! `corelocal bench`: the load generator.

use std::process::ExitCode;

/// `corelocal bench` arguments.
#[derive(Debug, clap::Args)]
pub struct Command {}

/// Runs `corelocal bench`.
pub fn run(cmd: Command) -> ExitCode {
    let _ = cmd;
    eprintln!("corelocal bench: not built yet");
    ExitCode::from(2)
}
