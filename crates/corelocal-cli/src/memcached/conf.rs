//! `--config-file FILE`: a memcached.conf read as Debian's memcached unit reads it
//! (/usr/share/memcached/scripts/systemd-memcached-wrapper): a `#` not after a backslash
//! starts a comment, lines are trimmed, empty ones skipped, lines starting `-d` or `-h`
//! skipped (systemd runs the server in the foreground), lines not starting with `-` are the
//! wrapper's own directives (`logfile FILE`) and ignored (systemd keeps the output), and the
//! others are options, split into words at white space as the wrapper's shell does.

use super::Refusal;
use std::path::Path;

/// The option corelocal adds to memcached's.
const FLAG: &str = "--config-file";

/// Longest memcached.conf read: far above any real one, and a mistaken path to a large file
/// cannot fill memory.
const CONF_BYTES_MAX: u64 = 1 << 20;

/// The options of one memcached.conf text, and the directives skipped.
pub fn options(text: &str) -> (Vec<String>, Vec<String>) {
    let mut words = Vec::new();
    let mut skipped = Vec::new();
    for line in text.lines() {
        let line = strip_comment(line);
        let line = line.trim();
        if line.is_empty() || line.starts_with("-d") || line.starts_with("-h") {
            continue;
        }
        if !line.starts_with('-') {
            skipped.push(line.to_string());
            continue;
        }
        words.extend(line.split_whitespace().map(str::to_string));
    }
    (words, skipped)
}

/// The line up to its first `#` that has no backslash before it; `\#` stands for `#`.
fn strip_comment(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'#') => {
                out.push('#');
                chars.next();
            }
            '#' => break,
            c => out.push(c),
        }
    }
    out
}

/// `args` with each `--config-file FILE` (or `--config-file=FILE`) before `--` replaced by
/// the file's options, in place (later options override earlier ones, as memcached's).
/// A missing file reads as empty, as Debian's wrapper has it (memcached's defaults); the
/// messages say what was read and skipped.
pub fn expand(
    args: &[String],
    read: impl Fn(&Path) -> std::io::Result<String>,
) -> Result<(Vec<String>, Vec<String>), Refusal> {
    let mut out = Vec::new();
    let mut said = Vec::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if arg == "--" {
            out.push(arg.clone());
            out.extend(rest.by_ref().cloned());
            break;
        }
        let path = if arg == FLAG {
            rest.next()
                .map(String::as_str)
                .ok_or_else(|| Refusal::new(super::EX_USAGE, format!("{FLAG} needs a file")))?
        } else if let Some(p) = arg.strip_prefix("--config-file=") {
            p
        } else {
            out.push(arg.clone());
            continue;
        };
        let text = match read(Path::new(path)) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                said.push(format!("{FLAG} {path}: not found: memcached's defaults"));
                String::new()
            }
            Err(e) => {
                return Err(Refusal::new(
                    super::EX_NOINPUT,
                    format!("{FLAG} {path}: {e}"),
                ))
            }
        };
        let (words, skipped) = options(&text);
        for directive in skipped {
            said.push(format!(
                "{FLAG} {path}: `{directive}` ignored (the output goes to stderr, as under \
                 Debian's memcached unit)"
            ));
        }
        out.extend(words);
    }
    Ok((out, said))
}

/// Reads a config file, at most [`CONF_BYTES_MAX`].
pub fn read_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(CONF_BYTES_MAX)
        .read_to_string(&mut text)?;
    Ok(text)
}
