//! The `corelocal` command.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod check;
mod duration;
mod files;
mod generate;
mod memcached;
mod metrics;
mod serve;
mod sim;
mod size;

/// corelocal: process every TCP connection on one core.
#[derive(Debug, Parser)]
#[command(name = "corelocal", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// One value per process, parsed once: the size difference between variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Run a server: one pinned worker per CPU, per-core listeners.
    Serve(serve::Command),
    /// Load generator: rpc, crr, http, kv workloads.
    Bench(corelocal_bench::Command),
    /// Inspect and plan IRQ / RPS / XPS / RFS / RSS layouts.
    Tune(corelocal_tune::Command),
    /// Flow x application affinity matrix for bulk TCP (seed 003); `sweep forward`:
    /// forwarded packets/s under RPS / XPS / NAPI layouts (seed 002).
    Sweep(corelocal_sweep::SweepCommand),
    /// Live per-core view: CPU, interfaces, listen drops, corelocal workers.
    Top(corelocal_top::Command),
    /// The paper's static file set: `files gen --out DIR`.
    Files(files::Command),
    /// Many-core simulation of the Affinity-Accept balancer.
    Sim(sim::Command),
    /// CPU-local accept for process-per-core servers we did not write (nginx reuseport).
    Steer(corelocal_steer::Command),
    /// memcached 1.6's command line, served by `serve kv` (`corelocal memcached -h`); also
    /// the binary's command when run as `memcached` or `memcached-debug`.
    Memcached(memcached::Command),
    /// Man pages and shell completions from these definitions (for packaging).
    #[command(hide = true)]
    Generate(generate::Command),
}

fn main() -> ExitCode {
    // memcached's command line is read as memcached reads it, not by clap.
    if let Some(code) = memcached::dispatch() {
        return code;
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(cmd) => serve::run(cmd),
        Command::Bench(cmd) => corelocal_bench::run(cmd),
        Command::Tune(cmd) => corelocal_tune::run(cmd),
        Command::Sweep(cmd) => corelocal_sweep::run_sweep(cmd),
        Command::Top(cmd) => corelocal_top::run(cmd),
        Command::Files(cmd) => files::run(cmd),
        Command::Sim(cmd) => sim::run(cmd),
        Command::Steer(cmd) => corelocal_steer::run(cmd),
        Command::Memcached(cmd) => memcached::run(cmd.args, false),
        Command::Generate(cmd) => generate::run(cmd),
    }
}
