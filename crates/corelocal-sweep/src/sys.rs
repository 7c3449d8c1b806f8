//! The system calls `sweep` needs beyond std: joining a network namespace from one thread,
//! a private sysfs for that thread, the thread id, and a stop flag set by SIGINT/SIGTERM.
//! Every `unsafe` block of the crate is here.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set by SIGINT / SIGTERM once [`install_stop_handler`] ran.
static STOP: AtomicBool = AtomicBool::new(false);

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Moves the calling thread (only) into the network namespace bound at `/run/netns/NAME`.
pub fn enter_netns(name: &str) -> io::Result<()> {
    let file = File::open(Path::new("/run/netns").join(name))?;
    // SAFETY: the fd is open for the whole call; setns changes only this thread's namespace.
    check(unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) })
}

/// Gives the calling thread its own mount namespace (a slave of the host's, so nothing
/// propagates back) and mounts a fresh sysfs on `/sys` in it, which then shows the devices of
/// the thread's network namespace. The mounts vanish when the thread exits.
pub fn private_sysfs() -> io::Result<()> {
    // SAFETY: CLONE_NEWNS implies CLONE_FS; both unshare only this thread's fs/mount state.
    check(unsafe { libc::unshare(libc::CLONE_NEWNS) })?;
    let root = c"/";
    let sys = c"/sys";
    let sysfs = c"sysfs";
    // SAFETY: NUL-terminated literals; a NULL source/type/data is allowed for a propagation
    // change, which affects only this thread's new mount namespace.
    check(unsafe {
        libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_SLAVE,
            std::ptr::null(),
        )
    })?;
    // SAFETY: as above; the new sysfs is mounted only in this thread's mount namespace.
    check(unsafe {
        libc::mount(
            sysfs.as_ptr(),
            sys.as_ptr(),
            sysfs.as_ptr(),
            0,
            std::ptr::null(),
        )
    })
}

/// The calling thread's id (for `/proc/self/task/TID/schedstat`).
pub fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() as u32 }
}

extern "C" fn on_stop_signal(_sig: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Makes SIGINT and SIGTERM set the stop flag instead of killing the process, so the guards
/// that delete network namespaces and restore IRQ affinity still run.
pub fn install_stop_handler() -> io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: sigaction is plain old data; zeroed is a valid empty mask and no flags.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = on_stop_signal as *const () as libc::sighandler_t;
        // SAFETY: `act` is initialised and the handler only stores to an atomic
        // (async-signal-safe); the old action is not needed.
        check(unsafe { libc::sigaction(sig, &act, std::ptr::null_mut()) })?;
    }
    Ok(())
}

/// Whether a stop was requested (signal, or [`request_stop`]).
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Requests a stop, as a signal would.
pub fn request_stop() {
    STOP.store(true, Ordering::SeqCst);
}
