//! `reuseport_cpu_pick`: an SK_REUSEPORT program that picks, for each SYN, the listener of the
//! worker pinned to the CPU processing it — for reuseport groups of *another* process
//! (`corelocal steer`). Unlike [`super::ReuseportSelect`] it has no flow-group overrides and
//! no stop state, and it counts what it did in a per-CPU array, so `steer status` can show
//! SYNs steered vs fallen back to the kernel's hash.
//!
//! Maps (names are how another `corelocal` process finds them again, see [`CpuPick::open`]):
//! - `cl_pick_cpu`: ARRAY u32 → u32 indexed by CPU: how many listeners its row holds (0 =
//!   none: the kernel's hash; with several, the SYN's 4-tuple hash picks), ORed with
//!   [`REDIRECT_FLAG`] while the row holds other CPUs' workers (the CPU's own are busy);
//! - `cl_pick_list`: ARRAY u32 → u32, row `cpu` (16 entries from `cpu * 16`): `slot + 1`;
//! - `cl_pick_socks`: REUSEPORT_SOCKARRAY u32 → u64: slot = one listener of the group;
//! - `cl_pick_count`: PERCPU_ARRAY u32 → u64, [`COUNTERS`] entries (see [`PickCounts`]).
//!
//! The program lives as long as a reuseport group holds it (or a descriptor is open): once
//! attached, the loading process may exit. A sockarray entry does not keep a socket alive: a
//! closing listener removes itself, and SYNs for its CPU fall back to the hash (counted).

use super::insn::{self, Cond, EbpfInsn, Size, R0, R1, R10, R2, R3, R4, R6, R7, R8, R9};
use super::programs::{
    HELPER_GET_SMP_PROCESSOR_ID, HELPER_MAP_LOOKUP_ELEM, HELPER_SK_SELECT_REUSEPORT, SK_PASS,
};
use crate::sys::bpf::{
    self, BpfError, Map, MapType, ProgType, Program, ATTACH_SK_REUSEPORT_SELECT,
};
use std::os::fd::RawFd;

/// The program's name (what `bpftool prog` shows and [`CpuPick::find`] looks for).
pub const PROG_NAME: &str = "cl_cpu_pick";
/// Name of the CPU → listener count map.
pub const CPU_MAP_NAME: &str = "cl_pick_cpu";
/// Name of the CPU → listener slots map.
pub const LIST_MAP_NAME: &str = "cl_pick_list";
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
/// Counter key: SYNs sent to another CPU's worker because their own CPU's were busy.
pub const COUNT_REDIRECTED: u32 = 3;
/// Number of counters.
pub const COUNTERS: u32 = 4;
/// Bit of a `cl_pick_cpu` value that marks its row as redirected (other CPUs' workers).
pub const REDIRECT_FLAG: u32 = 1 << REDIRECT_SHIFT;
const REDIRECT_SHIFT: i32 = 31;
/// Bits of a `cl_pick_cpu` value that hold the row's length.
pub const COUNT_MASK: u32 = 0xffff;
/// Upper bound on listeners (slots) per group.
pub const SLOTS_MAX: u32 = 4096;
/// Upper bound on CPU ids covered.
pub const CPU_SLOTS_MAX: u32 = 8192;
/// Most BPF programs scanned when looking for attached instances.
pub const PROGS_SCANNED_MAX: usize = 65_536;

/// Most listeners one CPU's SYNs are spread over (workers pinned to the same CPU).
pub const WORKERS_PER_CPU_MAX: u32 = 16;
/// log2 of [`WORKERS_PER_CPU_MAX`]: row `cpu` of `cl_pick_list` starts at `cpu << 4`.
const ROW_SHIFT: i32 = 4;

/// Map descriptors the program reads.
#[derive(Debug, Clone, Copy)]
pub struct PickMaps {
    /// `cl_pick_cpu`: CPU → number of listeners of workers pinned there.
    pub cpu_count_fd: i32,
    /// `cl_pick_list`: `cpu * 16 + i` → `slot + 1`.
    pub cpu_list_fd: i32,
    /// `cl_pick_socks`.
    pub sockarray_fd: i32,
    /// `cl_pick_count`.
    pub counts_fd: i32,
}

/// `dst *= src` (64-bit).
fn mul64_reg(dst: insn::Reg, src: insn::Reg) -> EbpfInsn {
    EbpfInsn {
        code: 0x07 | 0x20 | 0x08,
        regs: (src.0 << 4) | dst.0,
        off: 0,
        imm: 0,
    }
}

/// `dst >>= imm` (64-bit, logical).
fn rsh64_imm(dst: insn::Reg, imm: i32) -> EbpfInsn {
    EbpfInsn {
        code: 0x07 | 0x70,
        regs: dst.0,
        off: 0,
        imm,
    }
}

/// The program:
///
/// ```text
/// cpu = smp_processor_id()
/// v = cpu_count[cpu]                              // listeners for cpu, | REDIRECT_FLAG
/// n = v & COUNT_MASK; done = v & REDIRECT_FLAG ? REDIRECTED : STEERED
/// if !n                                           { key = NO_WORKER }
/// else {
///     i = n == 1 ? 0 : (md->hash * n) >> 32       // several listeners: by hash
///     slot = cpu_list[cpu * 16 + i] - 1
///     key = sk_select_reuseport(md, socks, slot) ? LISTENER_GONE : done
/// }
/// counts[key] += 1                                // this CPU's copy: no atomics needed
/// return SK_PASS                                  // without a selection: the kernel's hash
/// ```
///
/// A row marked with [`REDIRECT_FLAG`] holds other CPUs' workers: its CPU's own are all busy
/// (`steer`'s balancer, see [`corelocal::balance::redirect`](crate::balance::redirect)).
pub fn reuseport_cpu_pick(maps: PickMaps) -> Vec<EbpfInsn> {
    let [cn0, cn1] = insn::ld_map_fd(R1, maps.cpu_count_fd);
    let [li0, li1] = insn::ld_map_fd(R1, maps.cpu_list_fd);
    let [sa0, sa1] = insn::ld_map_fd(R2, maps.sockarray_fd);
    let [ct0, ct1] = insn::ld_map_fd(R1, maps.counts_fd);
    vec![
        /* 0 */ insn::mov64_reg(R6, R1),
        /* 1 */ insn::mov64_imm(R7, COUNT_NO_WORKER as i32),
        /* 2 */ insn::call(HELPER_GET_SMP_PROCESSOR_ID),
        /* 3 */ insn::mov64_reg(R8, R0),
        /* 4 */ insn::stx_mem(Size::W, R10, R0, -4),
        /* 5 */ cn0,
        /* 6 */ cn1,
        /* 7 */ insn::mov64_reg(R2, R10),
        /* 8 */ insn::add64_imm(R2, -4),
        /* 9 */ insn::call(HELPER_MAP_LOOKUP_ELEM),
        /* 10 */ insn::jmp_imm(Cond::Eq, R0, 0, 36), // -> 47 (count)
        /* 11 */ insn::ldx_mem(Size::W, R2, R0, 0),
        /* 12 */ insn::mov64_imm(R9, COUNT_STEERED as i32),
        /* 13 */ insn::mov64_reg(R3, R2),
        /* 14 */ rsh64_imm(R3, REDIRECT_SHIFT),
        /* 15 */ insn::jmp_imm(Cond::Eq, R3, 0, 1), // -> 17 (own workers)
        /* 16 */ insn::mov64_imm(R9, COUNT_REDIRECTED as i32),
        /* 17 */ insn::and64_imm(R2, COUNT_MASK as i32),
        /* 18 */ insn::jmp_imm(Cond::Eq, R2, 0, 28), // -> 47 (count)
        /* 19 */ insn::mov64_imm(R3, 0),
        /* 20 */ insn::jmp_imm(Cond::Eq, R2, 1, 3), // -> 24 (one listener)
        /* 21 */ insn::ldx_mem(Size::W, R3, R6, super::programs::MD_HASH_OFFSET),
        /* 22 */ mul64_reg(R3, R2),
        /* 23 */ rsh64_imm(R3, 32),
        /* 24 */ insn::lsh64_imm(R8, ROW_SHIFT),
        /* 25 */ insn::add64_reg(R8, R3),
        /* 26 */ insn::stx_mem(Size::W, R10, R8, -8),
        /* 27 */ li0,
        /* 28 */ li1,
        /* 29 */ insn::mov64_reg(R2, R10),
        /* 30 */ insn::add64_imm(R2, -8),
        /* 31 */ insn::call(HELPER_MAP_LOOKUP_ELEM),
        /* 32 */ insn::jmp_imm(Cond::Eq, R0, 0, 14), // -> 47 (count)
        /* 33 */ insn::ldx_mem(Size::W, R2, R0, 0),
        /* 34 */ insn::jmp_imm(Cond::Eq, R2, 0, 12), // -> 47 (count)
        /* 35 */ insn::add64_imm(R2, -1),
        /* 36 */ insn::stx_mem(Size::W, R10, R2, -12),
        /* 37 */ insn::mov64_reg(R1, R6),
        /* 38 */ sa0,
        /* 39 */ sa1,
        /* 40 */ insn::mov64_reg(R3, R10),
        /* 41 */ insn::add64_imm(R3, -12),
        /* 42 */ insn::mov64_imm(R4, 0),
        /* 43 */ insn::call(HELPER_SK_SELECT_REUSEPORT),
        /* 44 */ insn::mov64_imm(R7, COUNT_LISTENER_GONE as i32),
        /* 45 */ insn::jmp_imm(Cond::Ne, R0, 0, 1), // -> 47 (count)
        /* 46 */ insn::mov64_reg(R7, R9),
        /* 47 */ insn::stx_mem(Size::W, R10, R7, -16),
        /* 48 */ ct0,
        /* 49 */ ct1,
        /* 50 */ insn::mov64_reg(R2, R10),
        /* 51 */ insn::add64_imm(R2, -16),
        /* 52 */ insn::call(HELPER_MAP_LOOKUP_ELEM),
        /* 53 */ insn::jmp_imm(Cond::Eq, R0, 0, 3), // -> 57 (pass)
        /* 54 */ insn::ldx_mem(Size::DW, R1, R0, 0),
        /* 55 */ insn::add64_imm(R1, 1),
        /* 56 */ insn::stx_mem(Size::DW, R0, R1, 0),
        /* 57 */ insn::mov64_imm(R0, SK_PASS),
        /* 58 */ insn::exit(),
    ]
}

/// One CPU's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PickCounts {
    /// SYNs steered to the listener of the worker on this CPU.
    pub steered: u64,
    /// SYNs sent to another CPU's worker while this CPU's were busy.
    pub redirected: u64,
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
    cpu_count: Map,
    cpu_list: Map,
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
        let cpu_count = Map::create(MapType::Array, 4, 4, cpu_slots, CPU_MAP_NAME)?;
        let cpu_list = Map::create(
            MapType::Array,
            4,
            4,
            cpu_slots * WORKERS_PER_CPU_MAX,
            LIST_MAP_NAME,
        )?;
        let sockarray = Map::create(MapType::ReuseportSockArray, 4, 8, slots, SOCKS_MAP_NAME)?;
        let counts = Map::create(MapType::PercpuArray, 4, 8, COUNTERS, COUNT_MAP_NAME)?;
        let insns = reuseport_cpu_pick(PickMaps {
            cpu_count_fd: cpu_count.raw_fd(),
            cpu_list_fd: cpu_list.raw_fd(),
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
            cpu_count,
            cpu_list,
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
        let (mut cpu_count, mut cpu_list, mut sockarray, mut counts) = (None, None, None, None);
        for map_id in info.map_ids {
            let (map, minfo) = Map::from_id(map_id)?;
            match minfo.name.as_str() {
                CPU_MAP_NAME => cpu_count = Some(map),
                LIST_MAP_NAME => cpu_list = Some(map),
                SOCKS_MAP_NAME => sockarray = Some(map),
                COUNT_MAP_NAME => counts = Some(map),
                _ => {}
            }
        }
        match (cpu_count, cpu_list, sockarray, counts) {
            (Some(cpu_count), Some(cpu_list), Some(sockarray), Some(counts)) => Ok(CpuPick {
                cpu_count,
                cpu_list,
                sockarray,
                counts,
                program,
                prog_id,
            }),
            _ => Err(BpfError {
                op: "open cl_cpu_pick",
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("program {prog_id} lacks one of its four maps"),
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
        self.cpu_count.max_entries()
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

    /// Routes SYNs processed on `cpu` to the listeners in `slots` (spread by the 4-tuple
    /// hash when there are several; at most [`WORKERS_PER_CPU_MAX`]), or to the kernel's hash
    /// when `slots` is empty. The row is written before the count grows and after it shrinks,
    /// so the program never reads an entry that is not there yet.
    pub fn map_cpu(&self, cpu: u32, slots: &[u32]) -> Result<(), BpfError> {
        self.route_cpu(cpu, slots, false)
    }

    /// [`Self::map_cpu`], marking the row as `redirected` (other CPUs' workers, counted as
    /// [`PickCounts::redirected`]) or not.
    pub fn route_cpu(&self, cpu: u32, slots: &[u32], redirected: bool) -> Result<(), BpfError> {
        let slots = &slots[..slots.len().min(WORKERS_PER_CPU_MAX as usize)];
        let old = self.cpu_count.lookup_u32(cpu)?.unwrap_or(0) & COUNT_MASK;
        let flag = if redirected && !slots.is_empty() {
            REDIRECT_FLAG
        } else {
            0
        };
        if (slots.len() as u32) < old {
            self.cpu_count.update_u32(cpu, slots.len() as u32 | flag)?;
        }
        for (i, &slot) in slots.iter().enumerate() {
            self.cpu_list
                .update_u32(cpu * WORKERS_PER_CPU_MAX + i as u32, slot + 1)?;
        }
        self.cpu_count.update_u32(cpu, slots.len() as u32 | flag)
    }

    /// Whether `cpu`'s row is marked redirected.
    pub fn cpu_redirected(&self, cpu: u32) -> Result<bool, BpfError> {
        Ok(self.cpu_count.lookup_u32(cpu)?.unwrap_or(0) & REDIRECT_FLAG != 0)
    }

    /// The slots SYNs on `cpu` go to (empty: the kernel's hash).
    pub fn cpu_slots_of(&self, cpu: u32) -> Result<Vec<u32>, BpfError> {
        let n = self
            .cpu_count
            .lookup_u32(cpu)?
            .map_or(0, |v| v & COUNT_MASK)
            .min(WORKERS_PER_CPU_MAX);
        let mut out = Vec::new();
        for i in 0..n {
            if let Some(v) = self.cpu_list.lookup_u32(cpu * WORKERS_PER_CPU_MAX + i)? {
                if let Some(slot) = v.checked_sub(1) {
                    out.push(slot);
                }
            }
        }
        Ok(out)
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
        // A program loaded by an older build has no such counter.
        let redirected = read(COUNT_REDIRECTED).unwrap_or_default();
        Ok((0..possible_cpus)
            .map(|c| PickCounts {
                steered: steered.get(c).copied().unwrap_or(0),
                redirected: redirected.get(c).copied().unwrap_or(0),
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
            cpu_count_fd: 3,
            cpu_list_fd: 4,
            sockarray_fd: 5,
            counts_fd: 6,
        });
        assert_eq!(p.len(), 59);
        let target = |i: usize| (i as i64 + 1 + p[i].off as i64) as usize;
        for jump in [10, 18, 32, 34, 45] {
            assert_eq!(target(jump), 47, "insn {jump}");
        }
        assert_eq!(target(15), 17);
        assert_eq!(target(20), 24);
        assert_eq!(target(53), 57);
        assert_eq!(p[43].imm, HELPER_SK_SELECT_REUSEPORT);
        assert_eq!(p[57].imm, SK_PASS);
        assert_eq!(p[16].imm, COUNT_REDIRECTED as i32);
        assert_eq!(1 << ROW_SHIFT, WORKERS_PER_CPU_MAX);
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
        pick.map_cpu(1, &[1]).unwrap();
        assert_eq!(again.cpu_slots_of(1).unwrap(), vec![1]);
        assert_eq!(again.cpu_slots_of(0).unwrap(), Vec::<u32>::new());
        pick.map_cpu(0, &[0, 1]).unwrap();
        assert_eq!(again.cpu_slots_of(0).unwrap(), vec![0, 1]);
        pick.map_cpu(0, &[]).unwrap();
        assert_eq!(again.cpu_slots_of(0).unwrap(), Vec::<u32>::new());
        pick.route_cpu(0, &[1], true).unwrap();
        assert_eq!(again.cpu_slots_of(0).unwrap(), vec![1]);
        assert!(again.cpu_redirected(0).unwrap());
        pick.route_cpu(0, &[0], false).unwrap();
        assert!(!again.cpu_redirected(0).unwrap());
        assert_eq!(again.cpu_slots_of(0).unwrap(), vec![0]);
        let l = socket::listen(
            "127.0.0.1:0".parse().unwrap(),
            socket::ListenOptions {
                reuseport: true,
                incoming_cpu: None,
                backlog: 8,
                defer_accept_s: None,
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
