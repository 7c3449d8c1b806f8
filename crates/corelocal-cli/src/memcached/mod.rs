//! `corelocal memcached [memcached 1.6 options]`: memcached 1.6.18's whole command line,
//! read natively and served by `corelocal serve kv`, so that corelocal replaces memcached
//! where memcached is started (an init script, a unit, memcached's own test suite).
//!
//! Every memcached option is mapped onto `serve kv` where it means something there, accepted
//! with no effect where that is harmless (said once on stderr), or refused with memcached's
//! exit status and a message naming it. The binary run under the name `memcached` or
//! `memcached-debug` (a link) is this command; as `memcached-debug` it is memcached's debug
//! build, whose `debugtime` command the test suite uses to move the clock.
//!
//! Layout: `getopt` splits the line as memcached's getopt_long does, `parse` applies each
//! option and gives the `serve kv` arguments, `extended` reads `-o`, `tls` reads
//! `-Z` and `-o ssl_*`, `conf` reads `--config-file` (Debian's memcached.conf), `help` is
//! `-h`, `-V` and `-i`.

mod conf;
mod extended;
mod getopt;
mod help;
mod parse;
mod tls;

pub use help::usage;
pub use parse::{parse, Env};

use std::ffi::OsString;
use std::process::ExitCode;

/// EX_USAGE (sysexits.h): memcached's exit for a command line it will not run.
pub const EX_USAGE: u8 = 64;
/// EX_NOINPUT (sysexits.h): a config file that cannot be read.
pub const EX_NOINPUT: u8 = 66;
/// EX_OSERR (sysexits.h): memcached's exit when it cannot listen where told.
pub const EX_OSERR: u8 = 71;

/// `corelocal memcached`: for the help, man page and completions only; the arguments are
/// read by [`run`], as memcached reads them (`-h` is memcached's help).
#[derive(Debug, clap::Args)]
#[command(disable_help_flag = true)]
pub struct Command {
    /// memcached 1.6.18's options (`corelocal memcached -h` lists them and what each does
    /// here); `--config-file FILE` reads a memcached.conf as Debian's memcached unit does;
    /// after `--`, `corelocal serve kv` options (--backend, --cpus, --metrics, ...).
    #[arg(
        value_name = "MEMCACHED_OPTIONS",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub args: Vec<OsString>,
}

/// What a memcached command line comes to.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Serve with these `serve kv` arguments.
    Serve(Plan),
    /// Print this on standard output and exit 0 (-h, -V, -i).
    Print(String),
    /// memcached's refusal.
    Refuse(Refusal),
}

/// A command line to serve.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    /// `corelocal serve kv` arguments.
    pub args: Vec<String>,
    /// One line per option that has no effect here, saying why.
    pub notes: Vec<String>,
}

/// A command line memcached (or this command) will not run: the message and exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The exit status (memcached's: 1 for most bad values, 64 EX_USAGE for the rest).
    pub code: u8,
    /// What is wrong, naming the option.
    pub message: String,
}

impl Refusal {
    fn new(code: u8, message: String) -> Refusal {
        Refusal { code, message }
    }
}

/// The memcached command when the binary runs under memcached's name (`memcached`, or
/// `memcached-debug`, memcached's debug build) or as `corelocal memcached`; `None`: another
/// command.
pub fn dispatch() -> Option<ExitCode> {
    let mut argv = std::env::args_os();
    let program = argv.next()?;
    let name = std::path::Path::new(&program).file_name()?.to_owned();
    if name == "memcached" || name == "memcached-debug" {
        return Some(run(argv.collect(), name == "memcached-debug"));
    }
    // Read here rather than by clap: `--` and every option belong to memcached's reader.
    let first = argv.next()?;
    (first == "memcached").then(|| run(argv.collect(), false))
}

/// Runs a memcached command line (without the program name).
pub fn run(args: Vec<OsString>, debug_build: bool) -> ExitCode {
    let args = match utf8(args) {
        Ok(a) => a,
        Err(r) => return refuse(&r),
    };
    let (args, said) = match conf::expand(&args, conf::read_file) {
        Ok(expanded) => expanded,
        Err(r) => return refuse(&r),
    };
    let env = Env {
        debug_build,
        port_file: std::env::var("MEMCACHED_PORT_FILENAME").ok(),
    };
    match parse(&args, &env) {
        Outcome::Print(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Outcome::Refuse(r) => refuse(&r),
        Outcome::Serve(plan) => serve(plan, &said),
    }
}

fn utf8(args: Vec<OsString>) -> Result<Vec<String>, Refusal> {
    args.into_iter()
        .map(|a| {
            a.into_string().map_err(|a| {
                Refusal::new(
                    EX_USAGE,
                    format!("{a:?}: not UTF-8 (memcached options are text)"),
                )
            })
        })
        .collect()
}

fn refuse(r: &Refusal) -> ExitCode {
    for line in r.message.lines() {
        corelocal::log_line!("corelocal memcached: {line}");
    }
    ExitCode::from(r.code)
}

/// Says what has no effect, then runs `corelocal serve kv` with the plan's arguments.
fn serve(plan: Plan, said: &[String]) -> ExitCode {
    for line in said.iter().chain(&plan.notes) {
        corelocal::log_line!("corelocal memcached: {line}");
    }
    let argv = ["corelocal", "serve", "kv"]
        .into_iter()
        .map(String::from)
        .chain(plan.args);
    let cmd = match <crate::Cli as clap::Parser>::try_parse_from(argv) {
        Ok(crate::Cli {
            command: crate::Command::Serve(cmd),
        }) => cmd,
        Ok(_) => return ExitCode::from(EX_USAGE),
        // `-- --help`: serve kv's help.
        Err(e) if !e.use_stderr() => {
            print!("{}", e.render());
            return ExitCode::SUCCESS;
        }
        // Most likely an option after `--` (memcached's were checked here already).
        Err(e) => {
            return refuse(&Refusal::new(
                EX_USAGE,
                format!("corelocal serve kv: {}", e.render()),
            ))
        }
    };
    // memcached writes nothing on standard output: the server's stop summary goes to stderr
    // with its other messages (a test harness reads stdout; a unit's journal gets both).
    if let Err(e) =
        corelocal::sys::process::redirect(corelocal::sys::process::Stdio::Out, std::io::stderr())
    {
        corelocal::log_line!("corelocal memcached: standard output to stderr: {e}");
    }
    crate::serve::run(cmd)
}

#[cfg(test)]
mod tests;
