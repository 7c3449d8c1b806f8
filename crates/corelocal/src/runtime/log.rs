//! One line to standard error in one `write(2)`.
//!
//! `eprintln!` writes each piece of its format separately (std's stderr is unbuffered), so
//! when an old and a new server share a log during a takeover, one process's line can be cut
//! by the other's. Servers' lines go through [`log_line!`](crate::log_line) instead: the line
//! is formatted first and written whole.

use std::fmt;
use std::io::Write;

/// Formats `args` plus a newline and writes the line to standard error with one call.
/// A regular file or a pipe takes a line of a few hundred bytes in one call. Errors are
/// ignored where `eprintln!` would panic: a closed log must not stop a server.
pub fn write_line(args: fmt::Arguments<'_>) {
    let mut line = String::with_capacity(128);
    let _ = fmt::write(&mut line, args);
    line.push('\n');
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// `eprintln!` that writes the whole line in one `write(2)` (see [`runtime::log`](self)).
#[macro_export]
macro_rules! log_line {
    ($($arg:tt)*) => {
        $crate::runtime::log::write_line(format_args!($($arg)*))
    };
}
