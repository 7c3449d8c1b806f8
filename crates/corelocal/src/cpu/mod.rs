//! CPUs: [`CpuSet`] (cpulists and hex masks), the host [`Topology`], and thread pinning.

mod cpuset;
pub mod topology;

pub use cpuset::{CpuSet, ParseCpuSetError, CPU_ID_MAX};
pub use topology::{CpuInfo, Topology, TopologyError};

/// The CPUs the calling thread may run on (`sched_getaffinity`).
pub fn current_affinity() -> std::io::Result<CpuSet> {
    crate::sys::affinity::get_current()
}

/// Pins the calling thread to `cpus` (`sched_setaffinity`).
pub fn pin_current_thread(cpus: &CpuSet) -> std::io::Result<()> {
    crate::sys::affinity::set_current(cpus)
}

/// The CPU the calling thread runs on right now (`sched_getcpu`).
pub fn current_cpu() -> usize {
    crate::sys::affinity::current_cpu()
}
