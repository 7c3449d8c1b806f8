//! CPUs: [`CpuSet`] (cpulists and hex masks), the host [`Topology`], and thread pinning.

mod cpuset;
pub mod topology;

pub use cpuset::{CpuSet, ParseCpuSetError, CPU_ID_MAX};
pub use topology::{CpuInfo, Topology, TopologyError};

use std::fmt;

/// The CPUs the calling thread may run on (`sched_getaffinity`).
pub fn current_affinity() -> std::io::Result<CpuSet> {
    crate::sys::affinity::get_current()
}

/// Pins the calling thread to `cpus` (`sched_setaffinity`).
pub fn pin_current_thread(cpus: &CpuSet) -> std::io::Result<()> {
    crate::sys::affinity::set_current(cpus)
}

/// Sets the affinity of thread `tid` to `cpus` (`sched_setaffinity` on another thread).
pub fn pin_thread(tid: i32, cpus: &CpuSet) -> std::io::Result<()> {
    crate::sys::affinity::set_thread(tid, cpus)
}

/// The CPU the calling thread runs on right now (`sched_getcpu`).
pub fn current_cpu() -> usize {
    crate::sys::affinity::current_cpu()
}

/// The online CPUs (`/sys/devices/system/cpu/online`).
pub fn online() -> std::io::Result<CpuSet> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online")?;
    CpuSet::parse_list(&text)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))
}

/// Requested CPUs a thread cannot be pinned to, and the ones it can: see [`unavailable`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnavailableCpus {
    /// Requested CPUs that are not online (absent from this host, or offline).
    pub offline: CpuSet,
    /// Requested online CPUs the kernel refuses to pin this process to (outside its cgroup
    /// cpuset).
    pub refused: CpuSet,
    /// The online CPUs.
    pub online: CpuSet,
    /// The CPUs a thread of this process can be pinned to.
    pub usable: CpuSet,
}

impl UnavailableCpus {
    /// Compares `requested` with the `online` and `usable` CPUs: `None` when every requested
    /// CPU is in both.
    pub fn find(requested: &CpuSet, online: &CpuSet, usable: &CpuSet) -> Option<UnavailableCpus> {
        let offline = requested.difference(online);
        let refused = requested.intersection(online).difference(usable);
        if offline.is_empty() && refused.is_empty() {
            return None;
        }
        Some(UnavailableCpus {
            offline,
            refused,
            online: online.clone(),
            usable: usable.intersection(online),
        })
    }
}

fn cpus_noun(set: &CpuSet) -> String {
    let (noun, verb) = if set.len() == 1 {
        ("CPU", "is")
    } else {
        ("CPUs", "are")
    };
    format!("{noun} {set} {verb}")
}

impl fmt::Display for UnavailableCpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        if !self.offline.is_empty() {
            let online = &self.online;
            write!(
                f,
                "{} not online on this host (online: {online})",
                cpus_noun(&self.offline)
            )?;
            sep = "; ";
        }
        if !self.refused.is_empty() {
            write!(
                f,
                "{sep}{} not allowed for this process (its cgroup cpuset excludes them)",
                cpus_noun(&self.refused),
            )?;
        }
        if self.usable.is_empty() {
            f.write_str("; no CPU can be used")
        } else {
            write!(f, "; CPUs this process can use: {}", self.usable)
        }
    }
}

impl std::error::Error for UnavailableCpus {}

/// Which of `requested` a thread of this process cannot be pinned to: those not online
/// ([`online`]) and those the kernel refuses (outside the cgroup cpuset; found by pinning a
/// short-lived thread to each, since the affinity mask the process started with, e.g. from
/// `taskset`, is not a limit). `None` when all can be used. If the online list cannot be
/// read, only the refusals count.
pub fn unavailable(requested: &CpuSet) -> Option<UnavailableCpus> {
    let allowed = current_affinity().unwrap_or_default();
    let online = online().unwrap_or_else(|_| requested.union(&allowed));
    let doubtful = requested.difference(&allowed.intersection(&online));
    if doubtful.is_empty() {
        return None;
    }
    // Only on the way to an error (or a request beyond the current mask): probe every online
    // CPU, so the message can list the usable ones.
    let usable = probe_pinnable(&online).unwrap_or(allowed);
    UnavailableCpus::find(requested, &online, &usable)
}

/// The CPUs of `cpus` a new thread of this process can be pinned to (tried one by one on a
/// short-lived thread, so no running thread's affinity changes).
fn probe_pinnable(cpus: &CpuSet) -> Option<CpuSet> {
    let cpus = cpus.clone();
    std::thread::Builder::new()
        .name("corelocal-cpu-probe".into())
        .spawn(move || {
            cpus.iter()
                .filter(|&c| pin_current_thread(&CpuSet::single(c)).is_ok())
                .collect::<CpuSet>()
        })
        .ok()?
        .join()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(list: &str) -> CpuSet {
        CpuSet::parse_list(list).unwrap()
    }

    #[test]
    fn unavailable_names_missing_and_refused_cpus_and_the_usable_ones() {
        assert_eq!(
            UnavailableCpus::find(&set("0-1"), &set("0-1"), &set("0-1")),
            None
        );
        let u = UnavailableCpus::find(&set("0-7"), &set("0-1"), &set("0-1")).unwrap();
        assert_eq!(
            (u.offline.clone(), u.refused.clone()),
            (set("2-7"), set(""))
        );
        assert_eq!(
            u.to_string(),
            "CPUs 2-7 are not online on this host (online: 0-1); CPUs this process can use: 0-1"
        );
        let u = UnavailableCpus::find(&set("1,3,9"), &set("0-7"), &set("0-2")).unwrap();
        assert_eq!(
            u.to_string(),
            "CPU 9 is not online on this host (online: 0-7); CPU 3 is not allowed for this \
             process (its cgroup cpuset excludes them); CPUs this process can use: 0-2"
        );
        let u = UnavailableCpus::find(&set("4"), &set("0-7"), &CpuSet::new()).unwrap();
        assert!(u.to_string().ends_with("no CPU can be used"), "{u}");
    }

    #[test]
    fn every_cpu_this_thread_may_use_is_available_and_a_missing_one_is_named() {
        let allowed = current_affinity().unwrap();
        assert_eq!(unavailable(&allowed), None);
        let u = unavailable(&CpuSet::single(CPU_ID_MAX)).expect("CPU 8191 is not online here");
        assert_eq!(u.offline, CpuSet::single(CPU_ID_MAX), "{u}");
        assert!(allowed.difference(&u.usable).is_empty(), "{u}");
    }
}
