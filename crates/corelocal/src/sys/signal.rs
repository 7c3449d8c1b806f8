//! Termination signals handled synchronously: block SIGINT/SIGTERM in every thread (workers
//! inherit the mask), then wait for them with `sigtimedwait` in one place.

use std::io;
use std::time::Duration;

fn termination_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain old data; sigemptyset/sigaddset initialise it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}

/// Blocks SIGINT and SIGTERM in the calling thread and the threads it starts afterwards.
pub fn block_termination_signals() -> io::Result<()> {
    let set = termination_set();
    // SAFETY: `set` is initialised; the old mask is not needed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Waits up to `timeout` for SIGINT or SIGTERM; returns the signal number if one arrived.
/// The signals must be blocked first ([`block_termination_signals`]).
pub fn wait_termination(timeout: Duration) -> Option<i32> {
    wait_termination_from(timeout).map(|t| t.signal)
}

/// A termination signal and who sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Termination {
    /// SIGINT or SIGTERM.
    pub signal: i32,
    /// The sending process (`si_pid`; 0 from the kernel, e.g. a terminal's SIGINT).
    pub sender: i32,
}

/// Like [`wait_termination`], with the sender (a `--takeover PID` successor offers to take
/// the connections: it is the one that sent the SIGTERM).
pub fn wait_termination_from(timeout: Duration) -> Option<Termination> {
    let set = termination_set();
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: siginfo_t is plain old data; all-zero is valid.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set`, `info` and `ts` are initialised and live for the call.
    let sig = unsafe { libc::sigtimedwait(&set, &mut info, &ts) };
    if sig <= 0 {
        return None;
    }
    // SAFETY: sigtimedwait filled `info` for a signal sent by kill(2)/pidfd_send_signal.
    let sender = unsafe { info.si_pid() };
    Some(Termination {
        signal: sig,
        sender,
    })
}

/// Sends SIGTERM to process `pid` (a graceful stop request, e.g. to the server a takeover
/// replaces). Refuses pids ≤ 1 (the whole process group, init).
pub fn terminate(pid: i32) -> io::Result<()> {
    if pid <= 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("refusing to signal pid {pid}"),
        ));
    }
    // SAFETY: kill(2) with a positive pid only sends a signal; no memory is involved.
    if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
