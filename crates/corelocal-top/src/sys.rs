//! Terminal control for the live view: raw input mode (termios) restored on drop, on panic
//! and on SIGTERM/SIGHUP (which only set a flag), waiting for a key with a timeout, and the
//! window size. Every `unsafe` block of the crate is here.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// The terminal settings to restore (also used by the panic hook).
static SAVED: Mutex<Option<libc::termios>> = Mutex::new(None);
/// Set by SIGTERM / SIGHUP.
static STOP: AtomicBool = AtomicBool::new(false);

/// Leaves the alternate screen and shows the cursor.
pub const LEAVE_SCREEN: &str = "\x1b[?25h\x1b[?1049l";
/// Enters the alternate screen and hides the cursor.
pub const ENTER_SCREEN: &str = "\x1b[?1049h\x1b[?25l";

/// Whether `fd` is a terminal.
pub fn is_tty(fd: i32) -> bool {
    // SAFETY: isatty only inspects the descriptor number.
    unsafe { libc::isatty(fd) == 1 }
}

/// Rows and columns of the terminal on stdout.
pub fn window_size() -> Option<(u16, u16)> {
    // SAFETY: winsize is plain old data; zeroed is valid.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes one winsize into the valid pointer.
    let rc = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_row > 0).then_some((ws.ws_row, ws.ws_col))
}

fn restore_saved() {
    let saved = SAVED.lock().map(|mut g| g.take()).unwrap_or(None);
    if let Some(t) = saved {
        // SAFETY: `t` is the termios read from stdin by RawMode::enter.
        unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &t) };
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
        // SAFETY: termios is plain old data; tcgetattr fills it.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointer to a termios; stdin is a descriptor.
        if unsafe { libc::tcgetattr(libc::STDIN_FILENO, &mut t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        *SAVED.lock().map_err(|_| io::Error::other("poisoned"))? = Some(t);
        let mut raw = t;
        raw.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ISIG);
        raw.c_cc[libc::VMIN] = 0;
        raw.c_cc[libc::VTIME] = 0;
        // SAFETY: `raw` is a valid termios derived from the current one.
        if unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &raw) } != 0 {
            let e = io::Error::last_os_error();
            restore_saved();
            return Err(e);
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
    let mut pfd = libc::pollfd {
        fd: libc::STDIN_FILENO,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(60_000) as libc::c_int;
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(Vec::new())
        } else {
            Err(e)
        };
    }
    if n == 0 || pfd.revents & (libc::POLLIN | libc::POLLHUP) == 0 {
        return Ok(Vec::new());
    }
    let mut buf = [0u8; 64];
    // SAFETY: reads at most buf.len() bytes into the valid buffer.
    let r = unsafe { libc::read(libc::STDIN_FILENO, buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    if r == 0 && pfd.revents & libc::POLLHUP != 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "stdin closed"));
    }
    Ok(buf[..r as usize].to_vec())
}

extern "C" fn on_stop(_sig: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// SIGTERM and SIGHUP set a flag (checked by the loop) instead of killing the process with
/// the terminal still raw.
pub fn install_stop_handler() -> io::Result<()> {
    for sig in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT] {
        // SAFETY: sigaction is plain old data; zeroed is an empty mask and no flags (so poll
        // returns EINTR).
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = on_stop as *const () as libc::sighandler_t;
        // SAFETY: `act` is initialised; the handler only stores to an atomic.
        if unsafe { libc::sigaction(sig, &act, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Whether SIGTERM/SIGHUP/SIGINT arrived.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Moves the calling thread (only) into the network namespace bound at `/run/netns/NAME`,
/// gives it a private mount namespace (a slave of the host's: nothing propagates back) and
/// mounts a fresh sysfs on `/sys` there, so `/sys/class/net` and `/proc/thread-self/net` show
/// that namespace. Meant for a short-lived thread: its exit drops every reference, so the
/// namespace can go away when its owner deletes it.
pub fn enter_netns_with_sysfs(name: &str) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(std::path::Path::new("/run/netns").join(name))?;
    // SAFETY: the fd is open for the whole call; setns changes only this thread's namespace.
    check(unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) })?;
    // SAFETY: CLONE_NEWNS implies CLONE_FS; both unshare only this thread's fs/mount state.
    check(unsafe { libc::unshare(libc::CLONE_NEWNS) })?;
    // SAFETY: NUL-terminated literals; a NULL source/type/data is allowed for a propagation
    // change, which affects only this thread's new mount namespace.
    check(unsafe {
        libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_SLAVE,
            std::ptr::null(),
        )
    })?;
    // SAFETY: as above; the new sysfs is mounted only in this thread's mount namespace.
    check(unsafe {
        libc::mount(
            c"sysfs".as_ptr(),
            c"/sys".as_ptr(),
            c"sysfs".as_ptr(),
            0,
            std::ptr::null(),
        )
    })
}
