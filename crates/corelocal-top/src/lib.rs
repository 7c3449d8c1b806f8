//! `corelocal top`.

pub mod procfs;

use std::process::ExitCode;

/// `corelocal top` arguments.
#[derive(Debug, clap::Args)]
pub struct Command {}

/// Runs `corelocal top`.
pub fn run(cmd: Command) -> ExitCode {
    let _ = cmd;
    eprintln!("corelocal top: not built yet");
    ExitCode::from(2)
}
