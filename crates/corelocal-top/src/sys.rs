//! Terminal control for the live view: raw input mode (termios) restored on drop, on panic
//! and on SIGTERM/SIGHUP (which only set a flag), waiting for a key with a timeout, and the
//! window size. The calls go through `rustix`; what it does not cover safely is
//! `corelocal::sys`'s (the signal handler that only sets a flag, without `SA_RESTART`; leaving
//! this thread's mount namespace), so the crate has no `unsafe` block.

use rustix::termios::{LocalModes, OptionalActions, SpecialCodeIndex, Termios};
use std::io;
use std::os::fd::AsFd;
use std::sync::Mutex;
use std::time::Duration;

/// The terminal settings to restore (also used by the panic hook).
static SAVED: Mutex<Option<Termios>> = Mutex::new(None);

/// Leaves the alternate screen and shows the cursor.
pub const LEAVE_SCREEN: &str = "\x1b[?25h\x1b[?1049l";
/// Enters the alternate screen and hides the cursor.
pub const ENTER_SCREEN: &str = "\x1b[?1049h\x1b[?25l";

/// Whether `fd` (stdin, stdout, …) is a terminal.
pub fn is_tty(fd: impl AsFd) -> bool {
    rustix::termios::isatty(fd)
}

/// Rows and columns of the terminal on stdout.
pub fn window_size() -> Option<(u16, u16)> {
    let ws = rustix::termios::tcgetwinsize(io::stdout()).ok()?;
    (ws.ws_row > 0).then_some((ws.ws_row, ws.ws_col))
}

fn restore_saved() {
    let saved = SAVED.lock().map(|mut g| g.take()).unwrap_or(None);
    if let Some(t) = saved {
        let _ = rustix::termios::tcsetattr(io::stdin(), OptionalActions::Now, &t);
        use std::io::Write;
        let mut out = io::stdout();
        let _ = out.write_all(LEAVE_SCREEN.as_bytes());
        let _ = out.flush();
    }
}

/// Raw input (no echo, no line buffering, no signal keys: Ctrl-C arrives as byte 3) while
/// alive; the previous settings come back on drop, and on panic (a hook restores them before
/// the message is printed).
pub struct RawMode(());

impl RawMode {
    /// Switches stdin to raw mode and enters the alternate screen.
    pub fn enter() -> io::Result<RawMode> {
        let t = rustix::termios::tcgetattr(io::stdin())?;
        *SAVED.lock().map_err(|_| io::Error::other("poisoned"))? = Some(t.clone());
        let mut raw = t;
        raw.local_modes
            .remove(LocalModes::ICANON | LocalModes::ECHO | LocalModes::ISIG);
        raw.special_codes[SpecialCodeIndex::VMIN] = 0;
        raw.special_codes[SpecialCodeIndex::VTIME] = 0;
        if let Err(e) = rustix::termios::tcsetattr(io::stdin(), OptionalActions::Now, &raw) {
            restore_saved();
            return Err(e.into());
        }
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore_saved();
            previous(info);
        }));
        use std::io::Write;
        let mut out = io::stdout();
        out.write_all(ENTER_SCREEN.as_bytes())?;
        out.flush()?;
        Ok(RawMode(()))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        restore_saved();
    }
}

/// Waits up to `timeout` for input on stdin; returns the bytes read (empty on timeout or
/// signal). At most 64 bytes.
pub fn read_key(timeout: Duration) -> io::Result<Vec<u8>> {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let stdin = io::stdin();
    let ms = timeout.as_millis().min(60_000) as i64;
    let ts = Timespec {
        tv_sec: ms / 1000,
        tv_nsec: (ms % 1000) * 1_000_000,
    };
    let mut pfd = [PollFd::new(&stdin, PollFlags::IN)];
    let n = match rustix::event::poll(&mut pfd, Some(&ts)) {
        Ok(n) => n,
        Err(rustix::io::Errno::INTR) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let revents = pfd[0].revents();
    if n == 0 || !revents.intersects(PollFlags::IN | PollFlags::HUP) {
        return Ok(Vec::new());
    }
    let mut buf = [0u8; 64];
    let r = rustix::io::read(&stdin, &mut buf)?;
    if r == 0 && revents.contains(PollFlags::HUP) {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "stdin closed"));
    }
    Ok(buf[..r].to_vec())
}

/// SIGTERM, SIGHUP and SIGINT: a stop request.
const STOP_SIGNALS: [i32; 3] = [libc::SIGTERM, libc::SIGHUP, libc::SIGINT];

/// SIGTERM and SIGHUP set a flag (checked by the loop) instead of killing the process with
/// the terminal still raw. The handler has no `SA_RESTART`, so `poll` returns `EINTR`.
pub fn install_stop_handler() -> io::Result<()> {
    corelocal::sys::signal::flag_on(&STOP_SIGNALS)
}

/// Whether SIGTERM/SIGHUP/SIGINT arrived.
pub fn stop_requested() -> bool {
    corelocal::sys::signal::raised(&STOP_SIGNALS)
}

/// Moves the calling thread (only) into the network namespace bound at `/run/netns/NAME`,
/// gives it a private mount namespace (a slave of the host's: nothing propagates back) and
/// mounts a fresh sysfs on `/sys` there, so `/sys/class/net` and `/proc/thread-self/net` show
/// that namespace. Meant for a short-lived thread: its exit drops every reference, so the
/// namespace can go away when its owner deletes it.
pub fn enter_netns_with_sysfs(name: &str) -> io::Result<()> {
    use rustix::mount::{MountFlags, MountPropagationFlags};
    use rustix::thread::LinkNameSpaceType;
    let file = std::fs::File::open(std::path::Path::new("/run/netns").join(name))?;
    rustix::thread::move_into_link_name_space(file.as_fd(), Some(LinkNameSpaceType::Network))?;
    corelocal::sys::process::unshare_mount_namespace()?;
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::REC | MountPropagationFlags::DOWNSTREAM,
    )?;
    rustix::mount::mount("sysfs", "/sys", "sysfs", MountFlags::empty(), None)?;
    Ok(())
}
