//! Process-level facts and switches: effective uid, resource limits, the seccomp filter, a
//! thread's own mount namespace.

use std::io;

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
