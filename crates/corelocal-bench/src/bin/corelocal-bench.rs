//! `corelocal-bench`: the load generator alone (same as `corelocal bench`), buildable without
//! the rest of the workspace's binaries.

use clap::Parser;
use std::process::ExitCode;

/// corelocal's load generator (also `corelocal bench`).
#[derive(Debug, Parser)]
#[command(name = "corelocal-bench", version, about)]
struct Cli {
    #[command(flatten)]
    cmd: corelocal_bench::Command,
}

fn main() -> ExitCode {
    corelocal_bench::run(Cli::parse().cmd)
}
