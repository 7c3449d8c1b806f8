//! `corelocal generate man DIR` and `corelocal generate completions DIR` (hidden): man pages
//! and bash/zsh/fish completions from the clap definitions, so that what the package ships
//! cannot drift from what the binary takes.

use clap::{Args, CommandFactory, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `corelocal generate` arguments.
#[derive(Debug, Args)]
pub struct Command {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, Subcommand)]
enum What {
    /// corelocal.1 and one page per subcommand (corelocal-serve-kv.1, ...) into DIR.
    Man {
        /// Directory to write into (created if missing).
        dir: PathBuf,
    },
    /// corelocal.bash, _corelocal (zsh) and corelocal.fish into DIR.
    Completions {
        /// Directory to write into (created if missing).
        dir: PathBuf,
    },
}

/// Runs `corelocal generate`.
pub fn run(cmd: Command) -> ExitCode {
    let (dir, written) = match &cmd.what {
        What::Man { dir } => (dir, man(dir)),
        What::Completions { dir } => (dir, completions(dir)),
    };
    match written {
        Ok(count) => {
            eprintln!("corelocal generate: {count} files in {}", dir.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("corelocal generate: {}: {e}", dir.display());
            ExitCode::FAILURE
        }
    }
}

fn man(dir: &Path) -> std::io::Result<usize> {
    std::fs::create_dir_all(dir)?;
    // memcached's options are read by memcached's reader, not clap: the page lists them as
    // `corelocal memcached -h` does, line for line (a line that starts with a space is not
    // filled into the one before it by roff).
    let usage: String = crate::memcached::usage()
        .lines()
        .map(|line| format!(" {line}\n"))
        .collect();
    let cmd = crate::Cli::command().mut_subcommand("memcached", |c| c.after_long_help(usage));
    clap_mangen::generate_to(cmd, dir)?;
    count_files(dir)
}

fn completions(dir: &Path) -> std::io::Result<usize> {
    use clap_complete::Shell;
    std::fs::create_dir_all(dir)?;
    let mut cmd = crate::Cli::command();
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        clap_complete::generate_to(shell, &mut cmd, "corelocal", dir)?;
    }
    count_files(dir)
}

fn count_files(dir: &Path) -> std::io::Result<usize> {
    Ok(std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter(|e| e.path().is_file())
        .count())
}
