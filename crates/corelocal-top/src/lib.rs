//! `corelocal top`: a live per-core view refreshed every second — per CPU user/sys/irq/softirq/
//! idle, softnet work, NET_RX softirq runs and RPS IPIs received, per interface packets/s and
//! bits/s with its RX steering (like seed 002's ifstat2; of another network namespace with
//! `--netns`, e.g. `sweep forward`'s router), listen overflows/drops and softnet
//! drops/time_squeeze, and per corelocal worker accepted local/stolen, queue length and busy
//! (`--server-stats`).
//!
//! Layout: [`corelocal::procfs`] and [`server`] parse (pure); [`sample`] reads a root and
//! computes rates; [`render`] lays out 80 columns; [`sys`] holds the terminal calls and the
//! namespace join (no `unsafe`: what `rustix` lacks is `corelocal::sys`'s).

pub mod render;
pub mod sample;
pub mod server;
pub mod sys;

use crate::sample::{Sample, Source, View};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Shortest refresh interval.
pub const INTERVAL_MIN: Duration = Duration::from_millis(100);
/// Longest refresh interval.
pub const INTERVAL_MAX: Duration = Duration::from_secs(60);

const EXAMPLES: &str = "\
Examples:
  corelocal top                                   # live view; q quits
  corelocal top --server-stats /tmp/stats.jsonl   # + per-worker accepts, queue, busy
  corelocal top --once                            # one frame (two readings 1 s apart)
  corelocal top --json --once | jq .cpus          # one JSON object, for scripts
  corelocal top --json --count 10                 # ten JSON lines, one per second
  corelocal top --root tests/fixtures/vm-0 --once # read /proc and /sys from a fixture
  corelocal top --netns 'clfwd-*-r'               # the router of a running `sweep forward`

Exit codes: 0 done; 1 the terminal or a file failed; 2 bad flags.";

/// `corelocal top` arguments.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = EXAMPLES)]
pub struct Command {
    /// Seconds between refreshes (0.1 to 60).
    #[arg(long, default_value_t = 1.0, value_name = "SECS")]
    pub interval: f64,
    /// Print one view (two readings one interval apart) and exit.
    #[arg(long)]
    pub once: bool,
    /// Print JSON (one object per line) instead of the screen.
    #[arg(long)]
    pub json: bool,
    /// Stop after this many views.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// A corelocal server's stats file (`corelocal serve … --stats-file FILE --json`): the
    /// last line is read at each refresh.
    #[arg(long, value_name = "FILE")]
    pub server_stats: Option<PathBuf>,
    /// Root of the /proc and /sys trees read (a fixture directory in tests).
    #[arg(long, default_value = "/", value_name = "DIR")]
    pub root: PathBuf,
    /// Show the interfaces (rates, RX queues, RPS) and TCP counters of this network
    /// namespace under /run/netns instead of the host's; `*` matches any characters and the
    /// newest match is taken at each refresh (`--netns 'clfwd-*-r'` follows `sweep forward`'s
    /// router from cell to cell). CPU, softirq and softnet numbers are host-wide either way.
    #[arg(long, value_name = "NAME")]
    pub netns: Option<String>,
    /// Test hook: panic after the first frame (checks the terminal is restored on panic).
    #[arg(long, hide = true)]
    pub panic_after_frame: bool,
}

/// Runs `corelocal top`.
pub fn run(cmd: Command) -> ExitCode {
    let interval = match check(&cmd) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("corelocal top: {e}");
            return ExitCode::from(2);
        }
    };
    let src = Source {
        root: cmd.root.clone(),
        server_stats: cmd.server_stats.clone(),
        netns: cmd.netns.clone(),
    };
    let result = if cmd.once || cmd.json || !sys::is_tty(std::io::stdout()) {
        stream(&cmd, &src, interval)
    } else {
        live(&cmd, &src, interval)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("corelocal top: {e}");
            ExitCode::from(1)
        }
    }
}

fn check(cmd: &Command) -> Result<Duration, String> {
    let ok = cmd.interval.is_finite()
        && (INTERVAL_MIN.as_secs_f64()..=INTERVAL_MAX.as_secs_f64()).contains(&cmd.interval);
    if !ok {
        return Err(format!(
            "--interval {} out of range (0.1 to 60)",
            cmd.interval
        ));
    }
    if !cmd.root.join("proc").is_dir() {
        return Err(format!(
            "--root {}: no proc directory under it; give / for this host or a fixture directory \
             holding proc/ and sys/",
            cmd.root.display()
        ));
    }
    if cmd.count == Some(0) {
        return Err("--count 0: at least 1 view (leave --count out to run until q)".into());
    }
    if let Some(path) = &cmd.server_stats {
        if path.is_dir() {
            return Err(format!(
                "--server-stats {}: is a directory; give the file a server writes with \
                 --stats-file FILE --json",
                path.display()
            ));
        }
    }
    Ok(Duration::from_secs_f64(cmd.interval))
}

fn title() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let day = secs % 86_400;
    format!(
        "corelocal top  {}  {:02}:{:02}:{:02} UTC",
        host.trim(),
        day / 3600,
        day / 60 % 60,
        day % 60
    )
}

/// Sleeps until `deadline` (bounded by [`INTERVAL_MAX`]); false if a stop signal came.
fn sleep_until(deadline: Instant) -> bool {
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        if sys::stop_requested() {
            return false;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
    !sys::stop_requested()
}

/// Non-interactive: `--once`, `--json`, or stdout not a terminal.
fn stream(cmd: &Command, src: &Source, interval: Duration) -> Result<(), String> {
    sys::install_stop_handler().map_err(|e| e.to_string())?;
    let limit = if cmd.once {
        1
    } else {
        cmd.count.unwrap_or(u64::MAX)
    };
    let mut prev = Sample::read(src);
    let mut out = std::io::stdout().lock();
    for _ in 0..limit {
        if !sleep_until(prev.at + interval) {
            break;
        }
        let cur = Sample::read(src);
        let view = View::between(&prev, &cur);
        let text = if cmd.json {
            serde_json::to_string(&view).map_err(|e| e.to_string())? + "\n"
        } else {
            render::plain(&view, &title()) + "\n"
        };
        if out
            .write_all(text.as_bytes())
            .and_then(|_| out.flush())
            .is_err()
        {
            break; // reader went away (e.g. `| head`)
        }
        prev = cur;
    }
    Ok(())
}

/// What a key press asks for.
fn wants_quit(keys: &[u8]) -> bool {
    keys.iter().any(|&k| k == b'q' || k == b'Q' || k == 3)
}

/// Draws `lines` from the top-left corner: each line is cleared to its end, and the rest of
/// the screen below the frame is cleared — never the whole screen, so nothing flickers.
pub fn draw(lines: &[String], rows: usize) -> String {
    let mut s = String::from("\x1b[H");
    let shown = lines.len().min(rows.max(1));
    for (i, l) in lines.iter().take(shown).enumerate() {
        s.push_str(l);
        s.push_str("\x1b[K");
        if i + 1 < shown {
            s.push_str("\r\n");
        }
    }
    s.push_str("\x1b[J");
    s
}

/// The interactive view.
fn live(cmd: &Command, src: &Source, interval: Duration) -> Result<(), String> {
    sys::install_stop_handler().map_err(|e| e.to_string())?;
    let interactive = sys::is_tty(std::io::stdin());
    let _raw = if interactive {
        Some(sys::RawMode::enter().map_err(|e| format!("terminal: {e}"))?)
    } else {
        None
    };
    let mut out = std::io::stdout();
    let _ = write!(
        out,
        "\x1b[H{}\x1b[K\r\nreading counters…\x1b[K\x1b[J",
        title()
    );
    let _ = out.flush();
    let mut prev = Sample::read(src);
    let mut views = 0u64;
    while cmd.count.is_none_or(|c| views < c) {
        if !wait_or_quit(prev.at + interval, interactive)? {
            break;
        }
        let cur = Sample::read(src);
        let view = View::between(&prev, &cur);
        let rows = sys::window_size().map_or(24, |(r, _)| usize::from(r));
        let frame = render::frame(&view, &title(), interactive);
        out.write_all(draw(&frame, rows).as_bytes())
            .and_then(|_| out.flush())
            .map_err(|e| format!("writing to the terminal: {e}"))?;
        prev = cur;
        views += 1;
        assert!(!cmd.panic_after_frame, "test panic after the first frame");
    }
    Ok(())
}

/// Waits for the next refresh; false when `q`/Ctrl-C was pressed or a signal arrived.
fn wait_or_quit(deadline: Instant, interactive: bool) -> Result<bool, String> {
    loop {
        if sys::stop_requested() {
            return Ok(false);
        }
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            return Ok(true);
        };
        if !interactive {
            std::thread::sleep(left.min(Duration::from_millis(50)));
            continue;
        }
        match sys::read_key(left.min(Duration::from_millis(250))) {
            Ok(keys) if wants_quit(&keys) => return Ok(false),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(false),
            Err(e) => return Err(format!("reading keys: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draw_homes_and_clears_per_line_never_the_screen() {
        let lines = vec!["a".to_string(), "b".to_string(), "c".to_string()];
        let s = draw(&lines, 2);
        assert_eq!(s, "\x1b[Ha\x1b[K\r\nb\x1b[K\x1b[J");
        assert!(!s.contains("\x1b[2J"));
        assert!(wants_quit(b"xq") && wants_quit(&[3]) && !wants_quit(b"x"));
    }

    #[test]
    fn bad_flags_are_named_with_a_right_value() {
        let cmd = |args: &[&str]| {
            #[derive(clap::Parser)]
            struct T {
                #[command(flatten)]
                c: Command,
            }
            let mut v = vec!["top"];
            v.extend_from_slice(args);
            <T as clap::Parser>::try_parse_from(v).unwrap().c
        };
        assert!(check(&cmd(&[])).is_ok());
        for (args, want) in [
            (
                &["--interval", "0"][..],
                "--interval 0 out of range (0.1 to 60)",
            ),
            (&["--count", "0"][..], "--count 0: at least 1 view"),
            (
                &["--root", "/nonexistent-top-root"][..],
                "no proc directory under it; give /",
            ),
            (
                &["--server-stats", "/"][..],
                "--server-stats /: is a directory",
            ),
        ] {
            let e = check(&cmd(args)).unwrap_err();
            assert!(e.contains(want), "{args:?}: {e}");
        }
    }
}
