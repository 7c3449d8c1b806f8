//! Thread affinity: `sched_setaffinity`, `sched_getaffinity`, `sched_getcpu`.

use crate::cpu::CpuSet;
use std::io;

/// Largest CPU id that fits the fixed-size `cpu_set_t` libc passes (1024 CPUs).
const CPU_SETSIZE: usize = libc::CPU_SETSIZE as usize;

/// Pins the calling thread to `cpus`.
pub fn set_current(cpus: &CpuSet) -> io::Result<()> {
    if cpus.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "cannot pin to an empty CPU set",
        ));
    }
    if cpus.max().unwrap_or(0) >= CPU_SETSIZE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("CPU ids must be below {CPU_SETSIZE}"),
        ));
    }
    // SAFETY: cpu_set_t is plain old data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for cpu in cpus.iter() {
        // SAFETY: cpu < CPU_SETSIZE was checked above.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: pid 0 = calling thread; `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The CPUs the calling thread may run on.
pub fn get_current() -> io::Result<CpuSet> {
    // SAFETY: cpu_set_t is plain old data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 = calling thread; `set` is writable and of the size passed.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `set` was filled by the kernel; CPU_ISSET only reads it.
    Ok((0..CPU_SETSIZE)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// The CPU the calling thread runs on now.
pub fn current_cpu() -> usize {
    // SAFETY: sched_getcpu takes no arguments and only returns a value.
    let cpu = unsafe { libc::sched_getcpu() };
    cpu.max(0) as usize
}
