//! Thread affinity: `sched_setaffinity` and `sched_getaffinity` on `rustix`; `sched_getcpu`
//! through libc, which reads the CPU from rseq or the vDSO where `rustix` makes the
//! `getcpu` syscall.

use crate::cpu::CpuSet;
use std::io;

/// Largest CPU id that fits the fixed-size set passed to the kernel (1024 CPUs).
const CPU_SETSIZE: usize = rustix::thread::CpuSet::MAX_CPU;

/// Pins the calling thread to `cpus`.
pub fn set_current(cpus: &CpuSet) -> io::Result<()> {
    rustix::thread::sched_setaffinity(None, &to_kernel(cpus)?)?;
    Ok(())
}

/// Sets the affinity of thread `tid` (of any process we may act on) to `cpus`: what the kernel
/// does to a thread pinned to a CPU that goes offline, for tests of a worker's re-pinning.
pub fn set_thread(tid: i32, cpus: &CpuSet) -> io::Result<()> {
    let pid = rustix::process::Pid::from_raw(tid)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "thread id must be > 0"))?;
    rustix::thread::sched_setaffinity(Some(pid), &to_kernel(cpus)?)?;
    Ok(())
}

fn to_kernel(cpus: &CpuSet) -> io::Result<rustix::thread::CpuSet> {
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
    let mut set = rustix::thread::CpuSet::new();
    for cpu in cpus.iter() {
        set.set(cpu);
    }
    Ok(set)
}

/// The CPUs the calling thread may run on.
pub fn get_current() -> io::Result<CpuSet> {
    let set = rustix::thread::sched_getaffinity(None)?;
    Ok((0..CPU_SETSIZE).filter(|&c| set.is_set(c)).collect())
}

/// Whether the calling thread may run on `cpu` only: the kernel's mask read and tested in
/// place (a worker asks once a second; building a [`CpuSet`] from the 8,192-bit mask costs
/// ~10,000 instructions).
pub fn current_is_only(cpu: usize) -> io::Result<bool> {
    let set = rustix::thread::sched_getaffinity(None)?;
    Ok(cpu < CPU_SETSIZE && set.is_set(cpu) && set.count() == 1)
}

/// The CPU the calling thread runs on now.
pub fn current_cpu() -> usize {
    // SAFETY: sched_getcpu takes no arguments and only returns a value.
    let cpu = unsafe { libc::sched_getcpu() };
    cpu.max(0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `current_is_only` says yes for a thread pinned to one CPU, and no once it may run
    /// on another one too.
    #[test]
    fn current_is_only_tells_a_pinned_thread_from_a_widened_one() {
        let allowed = get_current().unwrap();
        let first = allowed.iter().next().unwrap();
        std::thread::spawn(move || {
            set_current(&CpuSet::single(first)).unwrap();
            assert!(current_is_only(first).unwrap());
            assert!(!current_is_only(first + 1).unwrap());
            if allowed.len() > 1 {
                set_current(&allowed).unwrap();
                assert!(!current_is_only(first).unwrap(), "widened to {allowed}");
            }
        })
        .join()
        .unwrap();
    }
}
