//! The `corelocal` command.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod sim;

/// corelocal: process every TCP connection on one core.
#[derive(Debug, Parser)]
#[command(name = "corelocal", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Load generator: rpc, crr, http, kv workloads.
    Bench(corelocal_bench::Command),
    /// Inspect and plan IRQ / RPS / XPS / RFS / RSS layouts.
    Tune(corelocal_tune::Command),
    /// Many-core simulation of the Affinity-Accept balancer.
    Sim(sim::Command),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Bench(cmd) => corelocal_bench::run(cmd),
        Command::Tune(cmd) => corelocal_tune::run(cmd),
        Command::Sim(cmd) => sim::run(cmd),
    }
}
