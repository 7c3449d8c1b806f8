//! `reuseport_cpu_pick`: an SK_REUSEPORT program that picks, for each SYN, the listener of the
//! worker pinned to the CPU processing it — for reuseport groups of *another* process
//! (`corelocal steer`). Unlike [`super::ReuseportSelect`] it has no flow-group overrides and
//! no stop state, and it counts what it did in a per-CPU array, so `steer status` can show
//! SYNs steered vs fallen back to the kernel's hash.
//!
//! Maps (names are how another `corelocal` process finds them again, see [`CpuPick::open`]):
//! - `cl_pick_cpu`: ARRAY u32 → u32 indexed by CPU: `slot + 1`, 0 = no worker there (hash);
//! - `cl_pick_socks`: REUSEPORT_SOCKARRAY u32 → u64: slot = one listener of the group;
//! - `cl_pick_count`: PERCPU_ARRAY u32 → u64, [`COUNTERS`] entries (see [`PickCounts`]).
//!
//! The program lives as long as a reuseport group holds it (or a descriptor is open): once
//! attached, the loading process may exit. A sockarray entry does not keep a socket alive: a
//! closing listener removes itself, and SYNs for its CPU fall back to the hash (counted).

use super::insn::{self, Cond, EbpfInsn, Size, R0, R1, R10, R2, R3, R4, R6, R7};
use super::programs::{
    HELPER_GET_SMP_PROCESSOR_ID, HELPER_MAP_LOOKUP_ELEM, HELPER_SK_SELECT_REUSEPORT, SK_PASS,
};
use crate::sys::bpf::{
    self, BpfError, Map, MapType, ProgType, Program, ATTACH_SK_REUSEPORT_SELECT,
};
use std::os::fd::RawFd;

/// The program's name (what `bpftool prog` shows and [`CpuPick::find`] looks for).
pub const PROG_NAME: &str = "cl_cpu_pick";
/// Name of the CPU → slot map.
pub const CPU_MAP_NAME: &str = "cl_pick_cpu";
/// Name of the sockarray.
pub const SOCKS_MAP_NAME: &str = "cl_pick_socks";
/// Name of the per-CPU counter map.
pub const COUNT_MAP_NAME: &str = "cl_pick_count";
/// Counter key: SYNs steered to the listener of the worker on their CPU.
pub const COUNT_STEERED: u32 = 0;
/// Counter key: SYNs on a CPU with no worker mapped (kernel hash).
pub const COUNT_NO_WORKER: u32 = 1;
/// Counter key: SYNs whose worker's listener is gone from the sockarray (kernel hash).
pub const COUNT_LISTENER_GONE: u32 = 2;
/// Number of counters.
pub const COUNTERS: u32 = 3;
/// Upper bound on listeners (slots) per group.
pub const SLOTS_MAX: u32 = 4096;
/// Upper bound on CPU ids covered.
pub const CPU_SLOTS_MAX: u32 = 8192;
/// Most BPF programs scanned when looking for attached instances.
pub const PROGS_SCANNED_MAX: usize = 65_536;

/// Map descriptors the program reads.
#[derive(Debug, Clone, Copy)]
pub struct PickMaps {
    /// `cl_pick_cpu`.
    pub cpu_slot_fd: i32,
    /// `cl_pick_socks`.
    pub sockarray_fd: i32,
    /// `cl_pick_count`.
    pub counts_fd: i32,
}

/// The program:
///
/// ```text
/// slot = cpu_slot[smp_processor_id()]             // slot + 1, 0 = none
/// if !slot                                        { key = NO_WORKER }
/// else if sk_select_reuseport(md, socks, slot-1)  { key = LISTENER_GONE }   // -ENOENT …
/// else                                            { key = STEERED }
/// counts[key] += 1                                // this CPU's copy: no atomics needed
/// return SK_PASS                                  // without a selection: the kernel's hash
/// ```
pub fn reuseport_cpu_pick(maps: PickMaps) -> Vec<EbpfInsn> {
    let [cpu0, cpu1] = insn::ld_map_fd(R1, maps.cpu_slot_fd);
    let [sa0, sa1] = insn::ld_map_fd(R2, maps.sockarray_fd);
    let [cn0, cn1] = insn::ld_map_fd(R1, maps.counts_fd);
    vec![
        /* 0 */ insn::mov64_reg(R6, R1),
        /* 1 */ insn::mov64_imm(R7, COUNT_NO_WORKER as i32),
        /* 2 */ insn::call(HELPER_GET_SMP_PROCESSOR_ID),
        /* 3 */ insn::stx_mem(Size::W, R10, R0, -4),
        /* 4 */ cpu0,
        /* 5 */ cpu1,
        /* 6 */ insn::mov64_reg(R2, R10),
        /* 7 */ insn::add64_imm(R2, -4),
        /* 8 */ insn::call(HELPER_MAP_LOOKUP_ELEM),
        /* 9 */ insn::jmp_imm(Cond::Eq, R0, 0, 14), // -> 24 (count)
        /* 10 */ insn::ldx_mem(Size::W, R2, R0, 0),
        /* 11 */ insn::jmp_imm(Cond::Eq, R2, 0, 12), // -> 24 (count)
        /* 12 */ insn::add64_imm(R2, -1),
        /* 13 */ insn::stx_mem(Size::W, R10, R2, -8),
        /* 14 */ insn::mov64_reg(R1, R6),
        /* 15 */ sa0,
        /* 16 */ sa1,
        /* 17 */ insn::mov64_reg(R3, R10),
        /* 18 */ insn::add64_imm(R3, -8),
        /* 19 */ insn::mov64_imm(R4, 0),
        /* 20 */ insn::call(HELPER_SK_SELECT_REUSEPORT),
        /* 21 */ insn::mov64_imm(R7, COUNT_LISTENER_GONE as i32),
        /* 22 */ insn::jmp_imm(Cond::Ne, R0, 0, 1), // -> 24 (count)
        /* 23 */ insn::mov64_imm(R7, COUNT_STEERED as i32),
        /* 24 */ insn::stx_mem(Size::W, R10, R7, -12),
        /* 25 */ cn0,
        /* 26 */ cn1,
        /* 27 */ insn::mov64_reg(R2, R10),
        /* 28 */ insn::add64_imm(R2, -12),
        /* 29 */ insn::call(HELPER_MAP_LOOKUP_ELEM),
        /* 30 */ insn::jmp_imm(Cond::Eq, R0, 0, 3), // -> 34 (pass)
        /* 31 */ insn::ldx_mem(Size::DW, R1, R0, 0),
        /* 32 */ insn::add64_imm(R1, 1),
        /* 33 */ insn::stx_mem(Size::DW, R0, R1, 0),
        /* 34 */ insn::mov64_imm(R0, SK_PASS),
        /* 35 */ insn::exit(),
    ]
}

/// One CPU's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PickCounts {
    /// SYNs steered to the listener of the worker on this CPU.
    pub steered: u64,
    /// SYNs on this CPU while no worker was mapped to it (kernel hash).
    pub no_worker: u64,
    /// SYNs whose mapped listener had left the sockarray (closed; kernel hash).
    pub listener_gone: u64,
}

impl PickCounts {
    /// SYNs that fell back to the kernel's hash.
    pub fn fallback(&self) -> u64 {
        self.no_worker + self.listener_gone
    }
}

/// The loaded program with its three maps.
#[derive(Debug)]
pub struct CpuPick {
    cpu_slot: Map,
    sockarray: Map,
    counts: Map,
    program: Program,
    prog_id: u32,
}

impl CpuPick {
    /// Creates the maps and loads the program (needs CAP_BPF). `slots`: listeners in the
    /// group; `cpu_slots`: CPU ids covered (`0..cpu_slots`).
    pub fn load(slots: u32, cpu_slots: u32) -> Result<CpuPick, BpfError> {
        let slots = slots.clamp(1, SLOTS_MAX);
        let cpu_slots = cpu_slots.clamp(1, CPU_SLOTS_MAX);
        let cpu_slot = Map::create(MapType::Array, 4, 4, cpu_slots, CPU_MAP_NAME)?;
        let sockarray = Map::create(MapType::ReuseportSockArray, 4, 8, slots, SOCKS_MAP_NAME)?;
        let counts = Map::create(MapType::PercpuArray, 4, 8, COUNTERS, COUNT_MAP_NAME)?;
        let insns = reuseport_cpu_pick(PickMaps {
            cpu_slot_fd: cpu_slot.raw_fd(),
            sockarray_fd: sockarray.raw_fd(),
            counts_fd: counts.raw_fd(),
        });
        let program = Program::load(
            ProgType::SkReuseport,
            ATTACH_SK_REUSEPORT_SELECT,
            &insns,
            PROG_NAME,
        )?;
        let prog_id = program.info()?.id;
        Ok(CpuPick {
            cpu_slot,
            sockarray,
            counts,
            program,
            prog_id,
        })
    }

    /// Ids of every loaded `cl_cpu_pick` program (attached to some group, or still held by
    /// the process that loaded it). Needs CAP_SYS_ADMIN.
    pub fn find() -> Result<Vec<u32>, BpfError> {
        let mut found = Vec::new();
        for id in bpf::prog_ids(PROGS_SCANNED_MAX)? {
            // A program can be unloaded between listing and opening: skip it.
            let Ok(prog) = Program::from_id(id) else {
                continue;
            };
            let Ok(info) = prog.info() else { continue };
            if info.prog_type == ProgType::SkReuseport as u32 && info.name == PROG_NAME {
                found.push(id);
            }
        }
        Ok(found)
    }

    /// Opens a loaded `cl_cpu_pick` program and its maps by program id (from [`Self::find`]).
    pub fn open(prog_id: u32) -> Result<CpuPick, BpfError> {
        let program = Program::from_id(prog_id)?;
        let info = program.info()?;
        let (mut cpu_slot, mut sockarray, mut counts) = (None, None, None);
        for map_id in info.map_ids {
            let (map, minfo) = Map::from_id(map_id)?;
            match minfo.name.as_str() {
                CPU_MAP_NAME => cpu_slot = Some(map),
                SOCKS_MAP_NAME => sockarray = Some(map),
                COUNT_MAP_NAME => counts = Some(map),
                _ => {}
            }
        }
        match (cpu_slot, sockarray, counts) {
            (Some(cpu_slot), Some(sockarray), Some(counts)) => Ok(CpuPick {
                cpu_slot,
                sockarray,
                counts,
                program,
                prog_id,
            }),
            _ => Err(BpfError {
                op: "open cl_cpu_pick",
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("program {prog_id} lacks one of its three maps"),
                ),
                log: String::new(),
            }),
        }
    }

    /// The program's descriptor, for `SO_ATTACH_REUSEPORT_EBPF`.
    pub fn program_fd(&self) -> RawFd {
        self.program.raw_fd()
    }

    /// The program's kernel id.
    pub fn prog_id(&self) -> u32 {
        self.prog_id
    }

    /// Number of listener slots.
    pub fn slots(&self) -> u32 {
        self.sockarray.max_entries()
    }

    /// Number of CPU ids covered.
    pub fn cpu_slots(&self) -> u32 {
        self.cpu_slot.max_entries()
    }

    /// Puts a listening socket (any descriptor of it, e.g. a `pidfd_getfd` duplicate) into
    /// `slot`. The map holds the socket without keeping it open.
    pub fn set_listener(&self, slot: u32, listener_fd: RawFd) -> Result<(), BpfError> {
        self.sockarray.update(
            &slot.to_ne_bytes(),
            &(listener_fd as u64).to_ne_bytes(),
            bpf::BPF_ANY,
        )
    }

    /// Empties `slot` (no error when already empty).
    pub fn clear_listener(&self, slot: u32) -> Result<(), BpfError> {
        match self.sockarray.delete(&slot.to_ne_bytes()) {
            Err(e) if e.source.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            other => other,
        }
    }

    /// The cookie of the socket in `slot`, if any.
    pub fn listener_cookie(&self, slot: u32) -> Result<Option<u64>, BpfError> {
        Ok(self.sockarray.lookup(&slot.to_ne_bytes())?.map(|v| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&v[..8]);
            u64::from_ne_bytes(b)
        }))
    }

    /// Routes SYNs processed on `cpu` to the listener in `slot` (or to the hash with `None`).
    pub fn map_cpu(&self, cpu: u32, slot: Option<u32>) -> Result<(), BpfError> {
        self.cpu_slot.update_u32(cpu, slot.map_or(0, |s| s + 1))
    }

    /// The slot SYNs on `cpu` go to, if any.
    pub fn cpu_slot(&self, cpu: u32) -> Result<Option<u32>, BpfError> {
        Ok(self
            .cpu_slot
            .lookup_u32(cpu)?
            .and_then(|v| v.checked_sub(1)))
    }

    /// Per-CPU counters, one entry per possible CPU.
    pub fn counts(&self, possible_cpus: usize) -> Result<Vec<PickCounts>, BpfError> {
        let read = |key: u32| -> Result<Vec<u64>, BpfError> {
            Ok(self
                .counts
                .lookup_percpu(&key.to_ne_bytes(), possible_cpus)?
                .unwrap_or_default()
                .iter()
                .map(|v| {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&v[..8]);
                    u64::from_ne_bytes(b)
                })
                .collect())
        };
        let steered = read(COUNT_STEERED)?;
        let no_worker = read(COUNT_NO_WORKER)?;
        let gone = read(COUNT_LISTENER_GONE)?;
        Ok((0..possible_cpus)
            .map(|c| PickCounts {
                steered: steered.get(c).copied().unwrap_or(0),
                no_worker: no_worker.get(c).copied().unwrap_or(0),
                listener_gone: gone.get(c).copied().unwrap_or(0),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::{pidfd, socket};
    use std::os::fd::AsRawFd;

    #[test]
    fn jumps_land_where_the_comments_say() {
        let p = reuseport_cpu_pick(PickMaps {
            cpu_slot_fd: 3,
            sockarray_fd: 4,
            counts_fd: 5,
        });
        assert_eq!(p.len(), 36);
        let target = |i: usize| (i as i64 + 1 + p[i].off as i64) as usize;
        assert_eq!(target(9), 24);
        assert_eq!(target(11), 24);
        assert_eq!(target(22), 24);
        assert_eq!(target(30), 34);
        assert_eq!(p[20].imm, HELPER_SK_SELECT_REUSEPORT);
        assert_eq!(p[34].imm, SK_PASS);
    }

    #[test]
    fn loads_is_found_again_and_its_maps_work() {
        if !crate::testing::root_or_skip("cpu_pick_loads_is_found_again") {
            return;
        }
        let pick = CpuPick::load(2, 64).unwrap();
        assert!(CpuPick::find().unwrap().contains(&pick.prog_id()));
        let again = CpuPick::open(pick.prog_id()).unwrap();
        assert_eq!(again.slots(), 2);
        assert_eq!(again.cpu_slots(), 64);
        pick.map_cpu(1, Some(1)).unwrap();
        assert_eq!(again.cpu_slot(1).unwrap(), Some(1));
        assert_eq!(again.cpu_slot(0).unwrap(), None);
        let l = socket::listen(
            "127.0.0.1:0".parse().unwrap(),
            socket::ListenOptions {
                reuseport: true,
                incoming_cpu: None,
                backlog: 8,
            },
        )
        .unwrap();
        pick.set_listener(1, l.as_raw_fd()).unwrap();
        assert_eq!(
            again.listener_cookie(1).unwrap(),
            Some(pidfd::socket_cookie(l.as_raw_fd()).unwrap())
        );
        let counts = again.counts(4).unwrap();
        assert_eq!(counts.len(), 4);
        assert!(counts.iter().all(|c| *c == PickCounts::default()));
        drop(l);
        assert_eq!(
            again.listener_cookie(1).unwrap(),
            None,
            "closed → slot empties"
        );
    }
}
