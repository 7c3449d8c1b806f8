//! `corelocal files gen`: write the paper's static file set (Affinity-Accept §6.2) to disk, so
//! nginx, lighttpd and `corelocal serve http --root` serve byte-identical files.

use clap::{Args, Subcommand};
use corelocal_proto::http::fileset;
use std::path::{Path, PathBuf};
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
        Action::Gen { out } => match check_out(&out).and_then(|()| {
            corelocal_apps::http::write_default_site(&out)
                .map_err(|e| format!("cannot write the files there: {e}"))
        }) {
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
                eprintln!("corelocal files gen: --out {}: {e}", out.display());
                ExitCode::FAILURE
            }
        },
    }
}

/// `--out` is a directory, or can be made one: the deepest part of it that exists is a
/// directory.
fn check_out(out: &Path) -> Result<(), String> {
    let mut part = Some(out);
    while let Some(p) = part {
        let p = if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        };
        match std::fs::metadata(p) {
            Ok(m) if m.is_dir() => return Ok(()),
            Ok(_) if p == out => {
                return Err(
                    "is a file, not a directory; give a directory to write the files \
                            into (created if missing)"
                        .into(),
                )
            }
            Ok(_) => {
                return Err(format!(
                    "{} is a file, not a directory; give a directory to write the files into \
                     (created if missing)",
                    p.display()
                ))
            }
            Err(_) => part = p.parent(),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_out;
    use std::path::Path;

    #[test]
    fn out_must_be_or_become_a_directory() {
        assert_eq!(check_out(&std::env::temp_dir().join("not/yet")), Ok(()));
        let scratch = corelocal::testing::ScratchDir::new("files-out");
        let file = scratch.join("f");
        std::fs::write(&file, "x").unwrap();
        assert!(check_out(&file)
            .unwrap_err()
            .starts_with("is a file, not a directory"));
        let e = check_out(&file.join("site")).unwrap_err();
        assert!(
            e.starts_with(&format!("{} is a file", file.display())),
            "{e}"
        );
        assert_eq!(check_out(Path::new(".")), Ok(()));
    }
}
