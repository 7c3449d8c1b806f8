//! `corelocal tune` as a standalone binary, for trying the tuner without the whole CLI:
//! `cargo run -p corelocal-tune --example tune -- show`.

use clap::Parser;
use std::process::ExitCode;

/// corelocal-tune: inspect, plan, diff, apply, verify and revert NIC steering.
#[derive(Debug, Parser)]
#[command(name = "corelocal-tune")]
struct Cli {
    #[command(flatten)]
    cmd: corelocal_tune::Command,
}

fn main() -> ExitCode {
    corelocal_tune::run(Cli::parse().cmd)
}
