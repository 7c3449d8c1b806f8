//! Termination signals handled synchronously: block SIGINT/SIGTERM in every thread (workers
//! inherit the mask), then wait for them with `sigtimedwait` in one place. Also a handler that
//! only sets a flag ([`flag_on`]), for the tools that clean up before they exit, `kill`, and a
//! SIGTERM to one thread of this process ([`terminate_thread`], for tests).
//!
//! `kill` and `gettid` are `rustix`'s; the mask, `sigtimedwait` and `sigaction` are
//! hand-written (`rustix` has them only in its unstable runtime module, as unsafe functions),
//! and so is `tgkill` (not in `rustix`).

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
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
    // siginfo_t is plain old data, so all-zero is valid; `set`, `info` and `ts` are initialised
    // and live for the call; si_pid is read only when sigtimedwait returned a signal, for which
    // it filled `info` (sent by kill(2)/pidfd_send_signal, or 0).
    // SAFETY: valid, live arguments; `info` read only as filled (above).
    let (sig, sender) = unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let sig = libc::sigtimedwait(&set, &mut info, &ts);
        (sig, if sig > 0 { info.si_pid() } else { 0 })
    };
    if sig <= 0 {
        return None;
    }
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
    let pid = rustix::process::Pid::from_raw(pid).expect("pid > 1");
    rustix::process::kill_process(pid, rustix::process::Signal::TERM)?;
    Ok(())
}

/// The calling thread's id (`gettid`), for [`terminate_thread`].
pub fn current_thread_id() -> i32 {
    rustix::thread::gettid().as_raw_nonzero().get()
}

/// Sends SIGTERM to thread `tid` of this process alone (`tgkill`): taken by that thread's
/// [`wait_termination`] when it blocks the signal, never by another thread. For tests that
/// stop a server waiting for a signal (`Server::run_until_signal`) in a process whose other
/// threads do not block it.
pub fn terminate_thread(tid: i32) -> io::Result<()> {
    if tid <= 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("no thread {tid}"),
        ));
    }
    let pid = std::process::id() as libc::c_long;
    // SAFETY: tgkill takes three integers and touches no memory of ours; the thread group
    // check keeps it inside this process.
    let rc = unsafe { libc::syscall(libc::SYS_tgkill, pid, tid as libc::c_long, libc::SIGTERM) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sends SIGKILL to process `pid` (a child that ignored [`terminate`]). Refuses pids ≤ 1.
pub fn kill(pid: i32) -> io::Result<()> {
    if pid <= 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("refusing to signal pid {pid}"),
        ));
    }
    let pid = rustix::process::Pid::from_raw(pid).expect("pid > 1");
    rustix::process::kill_process(pid, rustix::process::Signal::KILL)?;
    Ok(())
}

/// Signal numbers [`flag_on`] takes: 1 to 64 (`SIGRTMAX`).
const SIGNALS_MAX: usize = 64;

/// One flag per signal number, set by [`raise_flag`].
static RAISED: [AtomicBool; SIGNALS_MAX + 1] = [const { AtomicBool::new(false) }; SIGNALS_MAX + 1];

/// The handler [`flag_on`] installs: only an atomic store (async-signal-safe).
extern "C" fn raise_flag(sig: libc::c_int) {
    if let Some(flag) = usize::try_from(sig).ok().and_then(|s| RAISED.get(s)) {
        flag.store(true, Ordering::SeqCst);
    }
}

/// Makes each of `signals` set a flag ([`raised`]) instead of its default action, so a tool
/// that must clean up first (delete network namespaces, restore IRQ affinity or the terminal)
/// sees a SIGINT/SIGTERM as a stop request. The handler is installed with an empty mask and no
/// flags: no `SA_RESTART` (unlike signal-hook), so a blocking call it interrupts (`poll`)
/// returns `EINTR` and the loop checks the flag.
pub fn flag_on(signals: &[i32]) -> io::Result<()> {
    for &sig in signals {
        if !(1..=SIGNALS_MAX as i32).contains(&sig) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no signal {sig}"),
            ));
        }
        // sigaction is plain old data, so all-zero is an empty mask and no flags; `act` is
        // initialised before the call, and the handler only stores to an atomic
        // (async-signal-safe); the old action is not needed.
        // SAFETY: an initialised action whose handler is async-signal-safe (above).
        let rc = unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = raise_flag as *const () as libc::sighandler_t;
            libc::sigaction(sig, &act, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Whether one of `signals` arrived since [`flag_on`] installed its handler.
pub fn raised(signals: &[i32]) -> bool {
    signals.iter().any(|&sig| {
        usize::try_from(sig)
            .ok()
            .and_then(|s| RAISED.get(s))
            .is_some_and(|flag| flag.load(Ordering::SeqCst))
    })
}

/// Whether `signal` arrived since the last look (or since [`flag_on`]): the flag is cleared,
/// so each arrival is seen once (a reload at every SIGHUP).
pub fn take_raised(signal: i32) -> bool {
    usize::try_from(signal)
        .ok()
        .and_then(|s| RAISED.get(s))
        .is_some_and(|flag| flag.swap(false, Ordering::SeqCst))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_flag_is_seen_once() {
        flag_on(&[libc::SIGWINCH]).unwrap();
        assert!(!take_raised(libc::SIGWINCH));
        let me = rustix::process::getpid();
        rustix::process::kill_process(me, rustix::process::Signal::WINCH).unwrap();
        // Another thread of the test process may take it: wait for the flag (bounded).
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut seen = false;
        while !seen && std::time::Instant::now() < deadline {
            seen = take_raised(libc::SIGWINCH);
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(seen);
        assert!(!take_raised(libc::SIGWINCH));
    }

    #[test]
    fn a_flagged_signal_sets_its_flag_and_no_other() {
        flag_on(&[libc::SIGUSR2]).unwrap();
        assert!(!raised(&[libc::SIGUSR2]));
        let me = rustix::process::getpid();
        rustix::process::kill_process(me, rustix::process::Signal::USR2).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !raised(&[libc::SIGUSR2]) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(raised(&[libc::SIGUSR1, libc::SIGUSR2]));
        assert!(!raised(&[libc::SIGUSR1]));
        assert!(!raised(&[0, -1, 1000]));
    }

    #[test]
    fn only_signal_numbers_are_taken() {
        for sig in [0, -1, 65] {
            assert_eq!(
                flag_on(&[sig]).unwrap_err().kind(),
                io::ErrorKind::InvalidInput
            );
        }
        assert!(terminate(1).is_err() && terminate(0).is_err());
    }
}
