//! `corelocal-top`: the same view as `corelocal top`, as its own binary (the tmux test drives
//! it without building the whole CLI).

use clap::Parser;
use std::process::ExitCode;

/// A live per-core view: CPU, interfaces, listen drops and corelocal workers.
#[derive(Parser)]
#[command(name = "corelocal-top")]
struct Cli {
    #[command(flatten)]
    cmd: corelocal_top::Command,
}

fn main() -> ExitCode {
    corelocal_top::run(Cli::parse().cmd)
}
