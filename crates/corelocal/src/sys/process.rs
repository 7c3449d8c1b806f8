//! Process-level facts and switches: effective uid, resource limits, the seccomp filter, a
//! thread's own mount namespace, and what a daemon needs: a fork while single-threaded, a new
//! session, standard descriptors replaced, a pipe to report through and its child's exit.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

/// Whether the effective uid is 0.
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// The soft and hard RLIMIT_NOFILE (`u64::MAX`: unlimited).
pub fn nofile_limit() -> io::Result<(u64, u64)> {
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    Ok((
        lim.current.unwrap_or(u64::MAX),
        lim.maximum.unwrap_or(u64::MAX),
    ))
}

/// Raises RLIMIT_NOFILE's soft limit to the hard limit; returns the new soft limit
/// (`RLIM_INFINITY` when unlimited).
pub fn raise_nofile() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut rl = getrlimit(Resource::Nofile);
    rl.current = rl.maximum;
    let _ = setrlimit(Resource::Nofile, rl);
    // None is RLIM_INFINITY.
    rl.current.unwrap_or(libc::RLIM_INFINITY)
}

/// Clock ticks per second of /proc CPU times (`_SC_CLK_TCK`; 100 when unknown).
pub fn clock_ticks_per_second() -> u64 {
    match rustix::param::clock_ticks_per_second() {
        0 => 100,
        t => t,
    }
}

/// CPU time the calling thread has used (ns): CLOCK_THREAD_CPUTIME_ID.
pub fn thread_cpu_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Makes syscall `nr` fail with `errno` in the calling thread and the processes it starts
/// (seccomp filter; sets no_new_privs). Used to reproduce a container that refuses io_uring.
pub fn deny_syscall(nr: u32, errno: u32) -> io::Result<()> {
    let prog = crate::bpf::programs::seccomp_deny(nr, errno);
    let fprog = libc::sock_fprog {
        len: prog.len() as libc::c_ushort,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    rustix::thread::set_no_new_privs(true)?;
    // SAFETY: `fprog` points to `prog`, which outlives the call; the kernel copies the filter.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &fprog as *const libc::sock_fprog,
            0,
            0,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Syscall number of `io_uring_setup`.
pub const SYS_IO_URING_SETUP: u32 = libc::SYS_io_uring_setup as u32;

/// Gives the calling thread (only) its own mount namespace, a copy of the one it was in
/// (`unshare(CLONE_NEWNS)`, which implies `CLONE_FS`): mounts made afterwards (a fresh sysfs
/// on `/sys` after joining a network namespace) are its own and vanish when it exits.
pub fn unshare_mount_namespace() -> io::Result<()> {
    // Only NEWNS (which implies FS) is unshared, never FILES, so no thread can see a
    // descriptor table other than the one its descriptors came from.
    // SAFETY: the conditions above hold.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS) }?;
    Ok(())
}

/// The number of threads of this process (`Threads:` in `/proc/self/status`).
pub fn thread_count() -> io::Result<usize> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| io::Error::other("/proc/self/status has no Threads: line"))
}

/// Which side of a [`fork_single_threaded`] the caller is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forked {
    /// The process that forked; `child` is the new process's id.
    Parent {
        /// The new process.
        child: u32,
    },
    /// The new process: a copy of the caller, its only thread returning here.
    Child,
}

/// `fork(2)`, refused unless this process has exactly one thread.
///
/// A fork copies only the calling thread: the others' locks (the allocator's, stdio's, a
/// `Mutex` anywhere) stay held in the child by threads that do not exist there, and Rust
/// cannot promise the child anything until it execs. With one thread there is no other holder
/// and the child is an ordinary copy, safe to go on in. So a daemon forks first thing, before
/// it starts any thread; this checks that it did (`/proc/self/status`; only the caller can
/// start a thread between the check and the fork, and it is busy here).
pub fn fork_single_threaded() -> io::Result<Forked> {
    let threads = thread_count()?;
    if threads != 1 {
        return Err(io::Error::other(format!(
            "cannot fork: the process has {threads} threads, and a fork is only safe while \
             it has one"
        )));
    }
    // With one thread no lock can be held by a thread missing in the child, whose memory is a
    // consistent copy of the caller's; libc's fork (not a raw syscall) runs the atfork
    // handlers and resets its cached thread id.
    // SAFETY: the process has exactly one thread (checked above).
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        child => Ok(Forked::Parent {
            child: child as u32,
        }),
    }
}

/// `setsid(2)`: the process leads a new session and process group, with no controlling
/// terminal (a daemon's child, after its fork: a group leader cannot).
pub fn new_session() -> io::Result<()> {
    rustix::process::setsid()?;
    Ok(())
}

/// A pipe, both ends close-on-exec: `(read, write)`.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?)
}

/// Which standard descriptor [`redirect`] replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stdio {
    /// Descriptor 0.
    In,
    /// Descriptor 1.
    Out,
    /// Descriptor 2.
    Err,
}

/// Makes standard descriptor `which` a copy of `fd` (`dup2`; not close-on-exec).
pub fn redirect(which: Stdio, fd: impl AsFd) -> io::Result<()> {
    match which {
        Stdio::In => rustix::stdio::dup2_stdin(fd)?,
        Stdio::Out => rustix::stdio::dup2_stdout(fd)?,
        Stdio::Err => rustix::stdio::dup2_stderr(fd)?,
    }
    Ok(())
}

/// Waits up to `timeout` for `fd` to be readable (or at its end, or in error); `false` when
/// the time ran out. An interrupted wait counts as readable: the caller's read tells.
pub fn wait_readable(fd: impl AsFd, timeout: Duration) -> io::Result<bool> {
    let fd = fd.as_fd();
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    let wait = rustix::event::Timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as _,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    match rustix::event::poll(&mut fds, Some(&wait)) {
        Ok(ready) => Ok(ready > 0),
        Err(rustix::io::Errno::INTR) => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// The exit of child process `pid`, reaped (`waitpid`); with `block` false, `None` while it
/// runs.
pub fn wait_child(pid: u32, block: bool) -> io::Result<Option<std::process::ExitStatus>> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
    let options = if block {
        rustix::process::WaitOptions::empty()
    } else {
        rustix::process::WaitOptions::NOHANG
    };
    loop {
        match rustix::process::waitpid(Some(pid), options) {
            Ok(status) => {
                return Ok(status.map(|(_, s)| std::process::ExitStatus::from_raw(s.as_raw())))
            }
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_second_thread_forbids_the_fork() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || rx.recv());
        let threads = super::thread_count().unwrap();
        assert!(threads >= 2, "{threads}");
        let e = super::fork_single_threaded().unwrap_err();
        assert!(e.to_string().contains("only safe while it has one"), "{e}");
        drop(tx);
        let _ = other.join();
    }
}
