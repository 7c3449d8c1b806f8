//! `corelocal sweep`.

use std::process::ExitCode;

/// `corelocal sweep` arguments.
#[derive(Debug, clap::Args)]
pub struct Command {}

/// Runs `corelocal sweep`.
pub fn run(cmd: Command) -> ExitCode {
    let _ = cmd;
    eprintln!("corelocal sweep: not built yet");
    ExitCode::from(2)
}
