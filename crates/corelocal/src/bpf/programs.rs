//! The steering programs, as instruction lists (pure: map descriptors are parameters).

use super::insn::{self, cbpf, CbpfInsn, Cond, EbpfInsn, Size, R0, R1, R10, R2, R3, R4, R6};

/// `bpf_map_lookup_elem`.
pub const HELPER_MAP_LOOKUP_ELEM: i32 = 1;
/// `bpf_get_smp_processor_id`.
pub const HELPER_GET_SMP_PROCESSOR_ID: i32 = 8;
/// `bpf_sk_select_reuseport`.
pub const HELPER_SK_SELECT_REUSEPORT: i32 = 82;
/// `SK_PASS`.
pub const SK_PASS: i32 = 1;
/// `SK_DROP`.
pub const SK_DROP: i32 = 0;
/// Offset of `migrating_sk` in `struct sk_reuseport_md` (an 8-byte pointer; non-zero when
/// the program runs for a child of a closing listener, SELECT_OR_MIGRATE).
pub const MD_MIGRATING_SK_OFFSET: i16 = 48;
/// Offset of `hash` in `struct sk_reuseport_md` (4-byte loads only).
pub const MD_HASH_OFFSET: i16 = 32;

/// A `cpu_to_worker` value: bits 0..16 hold the CPU's first worker + 1 (0 = no worker),
/// bits 16..32 its number of workers − 1; the CPU's workers are consecutive.
pub const CPU_WORKERS_SHIFT: u32 = 16;
/// Mask of the first-worker part of a `cpu_to_worker` value.
pub const CPU_FIRST_MASK: u32 = 0xffff;
/// Which hash bits spread a CPU's SYNs over its workers: the high half, independent of the
/// flow group (the low bits) for up to 65,536 groups.
pub const CPU_SPREAD_HASH_SHIFT: i32 = 16;

/// The `cpu_to_worker` value for a CPU served by `count` consecutive workers from `first`.
pub fn cpu_workers_value(first: u32, count: u32) -> u32 {
    assert!(first < CPU_FIRST_MASK, "worker index out of range");
    assert!(
        (1..=1 << 16).contains(&count),
        "workers per CPU out of range"
    );
    (first + 1) | ((count - 1) << CPU_WORKERS_SHIFT)
}

/// Map descriptors the SK_REUSEPORT select program reads.
#[derive(Debug, Clone, Copy)]
pub struct SelectMaps {
    /// ARRAY u32 → u32, `flow_groups` entries: `worker + 1` to override a flow group, 0 = none.
    pub group_override_fd: i32,
    /// ARRAY u32 → u32 indexed by CPU: the CPU's workers ([`cpu_workers_value`]), 0 = no
    /// local worker (kernel hash).
    pub cpu_to_worker_fd: i32,
    /// REUSEPORT_SOCKARRAY u32 → u64: slot `worker` = that worker's listener.
    pub sockarray_fd: i32,
    /// ARRAY u32 → u32, one entry: non-zero = the server is stopping, refuse new SYNs.
    pub state_fd: i32,
}

/// Instructions the stop check puts before the select program.
pub const STOP_CHECK_LEN: usize = 14;

/// The SK_REUSEPORT select program:
///
/// ```text
/// slot = override[md->hash & (G-1)]
/// if !slot:
///     (first, count) = cpu_to_worker[smp_processor_id()]   // the CPU's workers
///     slot = first + (md->hash >> 16) % count              // spread over them by flow
/// if slot: bpf_sk_select_reuseport(md, sockarray, slot - 1, 0)
/// return SK_PASS      // no selection (or an empty slot) falls back to the kernel's hash
/// ```
///
/// Values are stored as `worker + 1` so that the zero-filled ARRAY maps mean "no entry".
///
/// Loaded as `BPF_SK_REUSEPORT_SELECT_OR_MIGRATE`, it also runs for each queued child of a
/// closing listener (`md->migrating_sk != 0`): the closed listener's sockarray slot is
/// already empty, so the selection fails or picks a live sibling, and the kernel's fallback
/// is its hash over the *live* listeners — the child moves instead of being reset. Before
/// all that, a stop check: while `state[0] != 0` a new SYN (not a migration) gets `SK_DROP`,
/// so a stopping server's queues only shrink.
pub fn reuseport_select(maps: SelectMaps, flow_groups: u32) -> Vec<EbpfInsn> {
    let mut program = stop_check(maps.state_fd);
    program.extend(select_body(maps, flow_groups));
    program
}

/// `r6 = ctx; if !migrating_sk && state[0] { return SK_DROP }`; falls through to the body.
fn stop_check(state_fd: i32) -> Vec<EbpfInsn> {
    let [st0, st1] = insn::ld_map_fd(R1, state_fd);
    let body = STOP_CHECK_LEN as i16;
    vec![
        /* 0 */ insn::mov64_reg(R6, R1),
        /* 1 */ insn::ldx_mem(Size::DW, R2, R6, MD_MIGRATING_SK_OFFSET),
        /* 2 */ insn::jmp_imm(Cond::Ne, R2, 0, body - 3), // -> body
        /* 3 */ insn::st_mem(Size::W, R10, -4, 0),
        /* 4 */ st0,
        /* 5 */ st1,
        /* 6 */ insn::mov64_reg(R2, R10),
        /* 7 */ insn::add64_imm(R2, -4),
        /* 8 */ insn::call(HELPER_MAP_LOOKUP_ELEM),
        /* 9 */ insn::jmp_imm(Cond::Eq, R0, 0, body - 10), // -> body
        /* 10 */ insn::ldx_mem(Size::W, R2, R0, 0),
        /* 11 */ insn::jmp_imm(Cond::Eq, R2, 0, body - 12), // -> body
        /* 12 */ insn::mov64_imm(R0, SK_DROP),
        /* 13 */ insn::exit(),
    ]
}

/// The select program proper (expects the context in r6). Numbered as in the unprefixed
/// program, whose instruction 0 (`r6 = r1`) the stop check already did.
fn select_body(maps: SelectMaps, flow_groups: u32) -> Vec<EbpfInsn> {
    assert!(
        flow_groups.is_power_of_two() && flow_groups <= 1 << 30,
        "flow groups must be a power of two"
    );
    let [ov0, ov1] = insn::ld_map_fd(R1, maps.group_override_fd);
    let [cpu0, cpu1] = insn::ld_map_fd(R1, maps.cpu_to_worker_fd);
    let [sa0, sa1] = insn::ld_map_fd(R2, maps.sockarray_fd);
    vec![
        /* 1 */ insn::ldx_mem(Size::W, R2, R6, MD_HASH_OFFSET),
        /* 2 */ insn::and64_imm(R2, (flow_groups - 1) as i32),
        /* 3 */ insn::stx_mem(Size::W, R10, R2, -4),
        /* 4 */ ov0,
        /* 5 */ ov1,
        /* 6 */ insn::mov64_reg(R2, R10),
        /* 7 */ insn::add64_imm(R2, -4),
        /* 8 */ insn::call(HELPER_MAP_LOOKUP_ELEM),
        /* 9 */ insn::jmp_imm(Cond::Eq, R0, 0, 2), // -> 12 (by CPU)
        /* 10 */ insn::ldx_mem(Size::W, R2, R0, 0),
        /* 11 */ insn::jmp_imm(Cond::Ne, R2, 0, 19), // -> 31 (select)
        /* 12 */ insn::call(HELPER_GET_SMP_PROCESSOR_ID),
        /* 13 */ insn::stx_mem(Size::W, R10, R0, -4),
        /* 14 */ cpu0,
        /* 15 */ cpu1,
        /* 16 */ insn::mov64_reg(R2, R10),
        /* 17 */ insn::add64_imm(R2, -4),
        /* 18 */ insn::call(HELPER_MAP_LOOKUP_ELEM),
        /* 19 */ insn::jmp_imm(Cond::Eq, R0, 0, 20), // -> 40 (pass)
        /* 20 */ insn::ldx_mem(Size::W, R2, R0, 0),
        /* 21 */ insn::jmp_imm(Cond::Eq, R2, 0, 18), // -> 40 (pass)
        /* 22 */ insn::mov64_reg(R3, R2),
        /* 23 */ insn::rsh32_imm(R3, CPU_WORKERS_SHIFT as i32), // count - 1
        /* 24 */ insn::and32_imm(R2, CPU_FIRST_MASK as i32), // first worker + 1
        /* 25 */ insn::jmp_imm(Cond::Eq, R3, 0, 5), // -> 31 (one worker: select)
        /* 26 */ insn::add64_imm(R3, 1),
        /* 27 */ insn::ldx_mem(Size::W, R4, R6, MD_HASH_OFFSET),
        /* 28 */ insn::rsh32_imm(R4, CPU_SPREAD_HASH_SHIFT),
        /* 29 */ insn::mod32_reg(R4, R3),
        /* 30 */ insn::add64_reg(R2, R4),
        /* 31 */ insn::add64_imm(R2, -1),
        /* 32 */ insn::stx_mem(Size::W, R10, R2, -8),
        /* 33 */ insn::mov64_reg(R1, R6),
        /* 34 */ sa0,
        /* 35 */ sa1,
        /* 36 */ insn::mov64_reg(R3, R10),
        /* 37 */ insn::add64_imm(R3, -8),
        /* 38 */ insn::mov64_imm(R4, 0),
        /* 39 */ insn::call(HELPER_SK_SELECT_REUSEPORT),
        /* 40 */ insn::mov64_imm(R0, SK_PASS),
        /* 41 */ insn::exit(),
    ]
}

/// The classic "steer by CPU" program: `return index_of[cpu]`, where `cpu_to_index` maps each
/// CPU that has a worker to that worker's listener position in the kernel's `socks[]` array.
/// CPUs not listed return an out-of-range index, which makes the kernel fall back to its hash.
///
/// With the identity mapping this is the two-instruction program of the kernel selftest
/// `reuseport_bpf_cpu.c` (`A = cpu; return A`).
pub fn cbpf_cpu_select(cpu_to_index: &[(u32, u32)]) -> Vec<CbpfInsn> {
    let identity = cpu_to_index.iter().all(|&(cpu, idx)| cpu == idx);
    if identity {
        return vec![cbpf::ld_ancillary(cbpf::SKF_AD_CPU), cbpf::ret_a()];
    }
    // A jump table: `if A == cpu return index`, one comparison per worker (≤ 255 so the
    // 8-bit jump offsets suffice), then "no match" = u32::MAX → hash fallback.
    assert!(
        cpu_to_index.len() <= 120,
        "cBPF jump table is limited to 120 workers"
    );
    let mut prog = vec![cbpf::ld_ancillary(cbpf::SKF_AD_CPU)];
    for &(cpu, idx) in cpu_to_index {
        prog.push(cbpf::jeq(cpu, 0, 1));
        prog.push(cbpf::ret_k(idx));
    }
    prog.push(cbpf::ret_k(u32::MAX));
    prog
}

/// `SECCOMP_RET_ERRNO`.
pub const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
/// `SECCOMP_RET_ALLOW`.
pub const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;

/// A seccomp filter making syscall `nr` fail with `errno` and allowing everything else — how a
/// container runtime refuses io_uring; tests use it to force the epoll fallback.
pub fn seccomp_deny(nr: u32, errno: u32) -> Vec<CbpfInsn> {
    vec![
        cbpf::ld_abs(0), // seccomp_data.nr
        cbpf::jeq(nr, 0, 1),
        cbpf::ret_k(SECCOMP_RET_ERRNO | (errno & 0xffff)),
        cbpf::ret_k(SECCOMP_RET_ALLOW),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_program_jumps_land_where_the_comments_say() {
        let maps = SelectMaps {
            group_override_fd: 3,
            cpu_to_worker_fd: 4,
            sockarray_fd: 5,
            state_fd: 6,
        };
        let p = reuseport_select(maps, 4096);
        let k = STOP_CHECK_LEN - 1; // body instruction i sits at i + k
        assert_eq!(p.len(), 42 + k);
        let target = |i: usize| (i as i64 + 1 + p[i].off as i64) as usize;
        // The stop check: migrations and running servers go to the body; stopping → SK_DROP.
        assert_eq!(p[1].off, MD_MIGRATING_SK_OFFSET);
        assert_eq!(target(2), STOP_CHECK_LEN);
        assert_eq!(target(9), STOP_CHECK_LEN);
        assert_eq!(target(11), STOP_CHECK_LEN);
        assert_eq!(p[12].imm, SK_DROP);
        assert_eq!(target(9 + k), 12 + k);
        assert_eq!(target(11 + k), 31 + k); // override: select
        assert_eq!(target(19 + k), 40 + k); // pass: r0 = SK_PASS
        assert_eq!(target(21 + k), 40 + k);
        assert_eq!(target(25 + k), 31 + k); // one worker on the CPU: select
        assert_eq!(p[40 + k].imm, SK_PASS);
        assert_eq!(p[2 + k].imm, 4095);
        assert_eq!(p[39 + k].imm, HELPER_SK_SELECT_REUSEPORT);
    }

    #[test]
    fn cbpf_identity_is_the_selftest_program() {
        let p = cbpf_cpu_select(&[(0, 0), (1, 1)]);
        assert_eq!(p.len(), 2);
        let p = cbpf_cpu_select(&[(0, 1), (1, 0)]);
        assert_eq!(p.len(), 6);
        assert_eq!(p[2].k, 1);
        assert_eq!(p.last().unwrap().k, u32::MAX);
    }
}
