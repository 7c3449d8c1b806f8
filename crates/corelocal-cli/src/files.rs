//! `corelocal files gen`: write the paper's static file set (Affinity-Accept §6.2) to disk, so
//! nginx, lighttpd and `corelocal serve http --root` serve byte-identical files.

use clap::{Args, Subcommand};
use corelocal_proto::http::fileset;
use std::path::PathBuf;
use std::process::ExitCode;

/// `corelocal files` arguments.
#[derive(Debug, Args)]
pub struct Command {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Write the 30,000 files (30 B..5,670 B, mean ≈ 700 B), `index.html`, `64.txt` and the
    /// URL list `files.txt` under DIR. Deterministic: the same bytes on every machine.
    ///
    /// Example:
    ///   corelocal files gen --out /tmp/site && nginx -c … (root /tmp/site)
    #[command(verbatim_doc_comment)]
    Gen {
        /// Directory to write (created if missing).
        #[arg(long)]
        out: PathBuf,
    },
}

/// Runs `corelocal files`.
pub fn run(cmd: Command) -> ExitCode {
    match cmd.action {
        Action::Gen { out } => match corelocal_apps::http::write_default_site(&out) {
            Ok(written) => {
                let bytes: usize = (0..fileset::FILE_COUNT).map(fileset::size).sum();
                println!(
                    "wrote {written} files to {} ({} data files, {bytes} bytes, mean {} B; URL list {})",
                    out.display(),
                    fileset::FILE_COUNT,
                    bytes / fileset::FILE_COUNT,
                    out.join(fileset::LIST_PATH.trim_start_matches('/')).display(),
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("corelocal files gen: {}: {e}", out.display());
                ExitCode::FAILURE
            }
        },
    }
}
