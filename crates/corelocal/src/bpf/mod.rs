//! BPF for steering: an instruction encoder ([`insn`]), the programs ([`programs`]) and
//! [`ReuseportSelect`], the loaded SK_REUSEPORT program with its maps; [`xdp`]: packet-level
//! flow-group steering (XDP + CPUMAP, [`xdp::XdpSteering`]).
//!
//! The `bpf(2)` calls themselves live in [`crate::sys::bpf`].

pub mod cpu_pick;
pub mod insn;
pub mod programs;
pub mod xdp;

pub use crate::sys::bpf::{BpfError, Map, MapType, ProgType, Program};

use crate::sys::bpf::ATTACH_SK_REUSEPORT_SELECT_OR_MIGRATE;
use std::os::fd::RawFd;

/// Default number of flow groups (Affinity-Accept uses 4096 FDir groups).
pub const FLOW_GROUPS_DEFAULT: u32 = 4096;
/// Upper bound on CPU ids the `cpu_to_worker` map covers.
pub const CPU_SLOTS_MAX: u32 = 4096;

/// The eBPF SK_REUSEPORT steering program and its four maps:
/// `group_override` (flow group → worker), `cpu_to_worker` (CPU → worker), the
/// REUSEPORT_SOCKARRAY (worker → listener) and `state` (stopping: refuse new SYNs).
/// Loaded as SELECT_OR_MIGRATE, so a closing listener's queue moves to a live sibling
/// (see [`programs::reuseport_select`]).
#[derive(Debug)]
pub struct ReuseportSelect {
    group_override: Map,
    cpu_to_worker: Map,
    sockarray: Map,
    state: Map,
    program: Program,
    flow_groups: u32,
}

impl ReuseportSelect {
    /// Creates the maps and loads the program (needs CAP_BPF). `cpu_slots` bounds the CPU ids
    /// that can be mapped; `flow_groups` must be a power of two.
    pub fn load(workers: u32, cpu_slots: u32, flow_groups: u32) -> Result<Self, BpfError> {
        assert!(workers > 0, "at least one worker");
        assert!(flow_groups.is_power_of_two(), "flow groups: power of two");
        let cpu_slots = cpu_slots.clamp(1, CPU_SLOTS_MAX);
        let group_override = Map::create(MapType::Array, 4, 4, flow_groups, "cl_group_ovr")?;
        let cpu_to_worker = Map::create(MapType::Array, 4, 4, cpu_slots, "cl_cpu_worker")?;
        let sockarray = Map::create(MapType::ReuseportSockArray, 4, 8, workers, "cl_listeners")?;
        let state = Map::create(MapType::Array, 4, 4, 1, "cl_state")?;
        let insns = programs::reuseport_select(
            programs::SelectMaps {
                group_override_fd: group_override.raw_fd(),
                cpu_to_worker_fd: cpu_to_worker.raw_fd(),
                sockarray_fd: sockarray.raw_fd(),
                state_fd: state.raw_fd(),
            },
            flow_groups,
        );
        let program = Program::load(
            ProgType::SkReuseport,
            ATTACH_SK_REUSEPORT_SELECT_OR_MIGRATE,
            &insns,
            "cl_select",
        )?;
        Ok(ReuseportSelect {
            group_override,
            cpu_to_worker,
            sockarray,
            state,
            program,
            flow_groups,
        })
    }

    /// The program's descriptor, for `SO_ATTACH_REUSEPORT_EBPF`.
    pub fn program_fd(&self) -> RawFd {
        self.program.raw_fd()
    }

    /// Number of flow groups (`hash & (flow_groups - 1)`).
    pub fn flow_groups(&self) -> u32 {
        self.flow_groups
    }

    /// Puts `worker`'s listening socket into its sockarray slot.
    pub fn set_listener(&self, worker: u32, listener_fd: RawFd) -> Result<(), BpfError> {
        self.sockarray.update(
            &worker.to_ne_bytes(),
            &(listener_fd as u64).to_ne_bytes(),
            crate::sys::bpf::BPF_ANY,
        )
    }

    /// Empties `worker`'s sockarray slot (SYNs steered to it fall back to the kernel's hash).
    /// A socket sits in at most one sockarray (EBUSY otherwise), so a successor process can
    /// put a handed-over listener into its own map only after this.
    pub fn clear_listener(&self, worker: u32) -> Result<(), BpfError> {
        match self.sockarray.delete(&worker.to_ne_bytes()) {
            Err(e) if e.source.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            other => other,
        }
    }

    /// While `stopping`, new SYNs steered by this program are refused (`SK_DROP`); queued
    /// children of closing listeners still migrate.
    pub fn set_stopping(&self, stopping: bool) -> Result<(), BpfError> {
        self.state.update_u32(0, stopping as u32)
    }

    /// Routes SYNs processed on `cpu` to its `workers` (the first, and how many consecutive
    /// ones: spread over them by flow hash), or with `None` to the kernel's hash.
    pub fn map_cpu(&self, cpu: u32, workers: Option<(u32, u32)>) -> Result<(), BpfError> {
        let value = workers.map_or(0, |(first, count)| {
            programs::cpu_workers_value(first, count)
        });
        self.cpu_to_worker.update_u32(cpu, value)
    }

    /// Moves flow group `group` to `worker`, or back to CPU steering with `None`.
    pub fn set_group_override(&self, group: u32, worker: Option<u32>) -> Result<(), BpfError> {
        assert!(group < self.flow_groups, "flow group out of range");
        self.group_override
            .update_u32(group, worker.map_or(0, |w| w + 1))
    }

    /// The worker flow group `group` is overridden to, if any.
    pub fn group_override(&self, group: u32) -> Result<Option<u32>, BpfError> {
        Ok(self
            .group_override
            .lookup_u32(group)?
            .and_then(|v| v.checked_sub(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_program_passes_the_verifier_and_maps_work() {
        if !crate::testing::root_or_skip("select_program_passes_the_verifier") {
            return;
        }
        let sel = ReuseportSelect::load(2, 64, FLOW_GROUPS_DEFAULT).unwrap();
        assert!(sel.program_fd() >= 0);
        assert_eq!(sel.group_override(7).unwrap(), None);
        sel.set_group_override(7, Some(1)).unwrap();
        assert_eq!(sel.group_override(7).unwrap(), Some(1));
        sel.set_group_override(7, None).unwrap();
        assert_eq!(sel.group_override(7).unwrap(), None);
        sel.map_cpu(3, Some((0, 1))).unwrap();
        sel.map_cpu(4, Some((0, 2))).unwrap();
    }

    #[test]
    fn a_rejected_program_returns_the_verifier_log() {
        if !crate::testing::root_or_skip("a_rejected_program_returns_the_verifier_log") {
            return;
        }
        // Reads r2 before anything wrote it: the verifier must refuse and say why.
        let bad = [insn::mov64_reg(insn::R0, insn::R2), insn::exit()];
        let err = Program::load(ProgType::SkReuseport, 0, &bad, "bad").unwrap_err();
        assert_eq!(err.source.raw_os_error(), Some(libc::EACCES));
        assert!(err.log.contains("R2 !read_ok"), "log: {}", err.log);
    }
}
