//! Packet-level flow-group steering: an XDP program that computes a TCP connection's flow
//! group and redirects the packet through a CPUMAP to the CPU the group table names
//! (kernel-primitives.md §3.7), so the group's receive (softirq) work — and, with
//! `SO_INCOMING_CPU` / CPU-steered listeners, its accept queue — moves with one map update.
//!
//! ```text
//! eth → IPv4 (any IHL, not a fragment) or IPv6 (next header TCP) → TCP
//! if ports[dport] == 0: XDP_PASS                  // only the server's ports are steered
//! h = fold(saddr) ^ fold(daddr) ^ *(u32 *)tcp     // ports word as on the wire
//! h *= 0x9e3779b1; h ^= h >> 16; group = h & (G-1) // 32-bit arithmetic
//! cpu = groups[group]                              // u32::MAX: not steered
//! if cpu == smp_processor_id(): XDP_PASS          // already on its CPU: no CPUMAP hop
//! return bpf_redirect_map(cpumap, cpu, XDP_PASS)   // unknown CPU → XDP_PASS
//! ```
//!
//! [`flow_group`] computes the same function in user space. Everything that is not TCP to a
//! steered port (ARP, UDP, the server's own replies, VLAN-tagged frames, IPv6 with extension
//! headers, IPv4 fragments) passes untouched.

use super::insn::{self, Cond, EbpfInsn, Size, R0, R1, R10, R2, R3, R4, R5, R7, R8};
use super::programs::{HELPER_GET_SMP_PROCESSOR_ID, HELPER_MAP_LOOKUP_ELEM};
use crate::cpu::CpuSet;
use crate::sys::bpf::{
    BpfError, Link, Map, MapType, ProgType, Program, ATTACH_XDP, XDP_FLAGS_DRV_MODE,
    XDP_FLAGS_SKB_MODE,
};
use std::fmt;
use std::io;
use std::net::IpAddr;

/// `bpf_redirect_map`.
pub const HELPER_REDIRECT_MAP: i32 = 51;
/// `XDP_PASS`.
pub const XDP_PASS: i32 = 2;
/// `XDP_REDIRECT`.
pub const XDP_REDIRECT: i32 = 4;
/// The multiplier of the flow-group mix (2^32 / φ, Knuth's multiplicative hash).
pub const MIX: u32 = 0x9e37_79b1;
/// Most flow groups a table may have.
pub const FLOW_GROUPS_MAX: u32 = 1 << 20;
/// Most CPU ids the CPUMAP covers.
pub const CPUS_MAX: usize = 4096;
/// Default per-CPU CPUMAP queue (packets in flight to one CPU's kthread).
pub const QUEUE_SIZE_DEFAULT: u32 = 2048;
/// Largest per-CPU CPUMAP queue accepted.
pub const QUEUE_SIZE_MAX: u32 = 16 * 1024;
/// Group-table value meaning "not steered" (the CPUMAP lookup fails → `XDP_PASS`).
pub const NO_CPU: u32 = u32::MAX;

const ETH_HLEN: i16 = 14;
const IPV4_MIN: i16 = 20;
const IPV6_HLEN: i16 = 40;
const IPPROTO_TCP: i32 = 6;

// ---------------------------------------------------------------------------------------
// The flow-group function (pure).

fn fold(ip: IpAddr) -> u32 {
    match ip {
        IpAddr::V4(a) => u32::from_ne_bytes(a.octets()),
        IpAddr::V6(a) => a
            .octets()
            .chunks_exact(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .fold(0, |h, w| h ^ w),
    }
}

/// The flow group the XDP program computes for a TCP packet from `src_ip:src_port` to
/// `dst_ip:dst_port` (both addresses of one family), with `flow_groups` groups (a power of
/// two). For a server, `src` is the client: `flow_group(peer.ip(), local.ip(), peer.port(),
/// local.port(), G)`. Matches the program on this host (words are loaded in host order).
pub fn flow_group(
    src_ip: IpAddr,
    dst_ip: IpAddr,
    src_port: u16,
    dst_port: u16,
    flow_groups: u32,
) -> u32 {
    assert!(flow_groups.is_power_of_two(), "flow groups: a power of two");
    let [s0, s1] = src_port.to_be_bytes();
    let [d0, d1] = dst_port.to_be_bytes();
    let mut h = fold(src_ip) ^ fold(dst_ip) ^ u32::from_ne_bytes([s0, s1, d0, d1]);
    h = h.wrapping_mul(MIX);
    h ^= h >> 16;
    h & (flow_groups - 1)
}

// ---------------------------------------------------------------------------------------
// A tiny assembler with forward labels (offsets are patched in `finish`).

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Label(usize);

#[derive(Default)]
struct Asm {
    insns: Vec<EbpfInsn>,
    labels: Vec<Option<usize>>,
    fixups: Vec<(usize, Label)>,
}

impl Asm {
    fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }

    fn bind(&mut self, l: Label) {
        assert!(self.labels[l.0].is_none(), "label bound twice");
        self.labels[l.0] = Some(self.insns.len());
    }

    fn emit(&mut self, i: EbpfInsn) {
        self.insns.push(i);
    }

    fn emit2(&mut self, pair: [EbpfInsn; 2]) {
        self.insns.extend(pair);
    }

    /// A jump instruction (its offset is ignored) to `to`.
    fn jump(&mut self, i: EbpfInsn, to: Label) {
        self.fixups.push((self.insns.len(), to));
        self.insns.push(i);
    }

    fn finish(mut self) -> (Vec<EbpfInsn>, Vec<usize>) {
        let labels: Vec<usize> = self
            .labels
            .iter()
            .map(|l| l.expect("label never bound"))
            .collect();
        for (at, l) in self.fixups {
            let off = labels[l.0] as i64 - at as i64 - 1;
            assert!(off >= 0, "backward jump");
            self.insns[at].off = i16::try_from(off).expect("jump too far");
        }
        (self.insns, labels)
    }
}

// ---------------------------------------------------------------------------------------
// The program.

/// Map descriptors the XDP program reads.
#[derive(Debug, Clone, Copy)]
pub struct XdpMaps {
    /// ARRAY u32 → u32, 65536 entries: non-zero for the TCP destination ports to steer.
    pub ports_fd: i32,
    /// ARRAY u32 → u32, `flow_groups` entries: flow group → CPU ([`NO_CPU`]: not steered).
    pub groups_fd: i32,
    /// CPUMAP: CPU → that CPU's queue and kthread.
    pub cpumap_fd: i32,
}

/// Where the program's blocks start (for layout tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XdpLayout {
    /// IPv4 parsing.
    pub ipv4: usize,
    /// IPv6 parsing.
    pub ipv6: usize,
    /// The common TCP part: r4 = TCP header (4 bytes checked), r7 = folded addresses.
    pub tcp: usize,
    /// `return XDP_PASS`.
    pub pass: usize,
}

/// The XDP flow-group steering program (see the module documentation).
pub fn xdp_steer(maps: XdpMaps, flow_groups: u32) -> (Vec<EbpfInsn>, XdpLayout) {
    assert!(
        flow_groups.is_power_of_two() && flow_groups <= FLOW_GROUPS_MAX,
        "flow groups: a power of two ≤ {FLOW_GROUPS_MAX}"
    );
    let mut a = Asm::default();
    let [ipv4, ipv6, tcp, pass] = [a.label(), a.label(), a.label(), a.label()];
    ethernet(&mut a, [ipv4, ipv6, pass]);
    a.bind(ipv4);
    ipv4_header(&mut a, tcp, pass);
    a.bind(ipv6);
    ipv6_header(&mut a, pass);
    a.bind(tcp);
    steer(&mut a, maps, flow_groups, pass);
    a.bind(pass);
    a.emit(insn::mov64_imm(R0, XDP_PASS));
    a.emit(insn::exit());
    let (insns, at) = a.finish();
    let layout = XdpLayout {
        ipv4: at[ipv4.0],
        ipv6: at[ipv6.0],
        tcp: at[tcp.0],
        pass: at[pass.0],
    };
    (insns, layout)
}

/// `r2 = data`, `r3 = data_end`; dispatch on the EtherType.
fn ethernet(a: &mut Asm, [ipv4, ipv6, pass]: [Label; 3]) {
    a.emit(insn::ldx_mem(Size::W, R2, R1, 0)); // xdp_md->data
    a.emit(insn::ldx_mem(Size::W, R3, R1, 4)); // xdp_md->data_end
    a.emit(insn::mov64_reg(R4, R2));
    a.emit(insn::add64_imm(R4, ETH_HLEN as i32));
    a.jump(insn::jmp_reg(Cond::Gt, R4, R3, 0), pass);
    a.emit(insn::ldx_mem(Size::H, R5, R2, 12)); // h_proto
    a.emit(insn::be(R5, 16));
    a.jump(insn::jmp_imm(Cond::Eq, R5, 0x0800, 0), ipv4);
    a.jump(insn::jmp_imm(Cond::Eq, R5, 0x86dd, 0), ipv6);
    a.jump(insn::ja(0), pass);
}

/// IPv4: TCP, not a fragment, IHL ≥ 5; r7 = saddr ^ daddr, r4 = TCP header with 4 bytes.
fn ipv4_header(a: &mut Asm, tcp: Label, pass: Label) {
    let ip = ETH_HLEN;
    a.emit(insn::mov64_reg(R4, R2));
    a.emit(insn::add64_imm(R4, (ip + IPV4_MIN) as i32));
    a.jump(insn::jmp_reg(Cond::Gt, R4, R3, 0), pass);
    a.emit(insn::ldx_mem(Size::B, R5, R2, ip + 9)); // protocol
    a.jump(insn::jmp_imm(Cond::Ne, R5, IPPROTO_TCP, 0), pass);
    a.emit(insn::ldx_mem(Size::H, R5, R2, ip + 6)); // flags | fragment offset
    a.emit(insn::be(R5, 16));
    a.emit(insn::and64_imm(R5, 0x3fff)); // MF or an offset: a fragment
    a.jump(insn::jmp_imm(Cond::Ne, R5, 0, 0), pass);
    a.emit(insn::ldx_mem(Size::W, R7, R2, ip + 12)); // saddr
    a.emit(insn::ldx_mem(Size::W, R8, R2, ip + 16)); // daddr
    a.emit(insn::xor64_reg(R7, R8));
    a.emit(insn::ldx_mem(Size::B, R5, R2, ip)); // version | IHL
    a.emit(insn::and64_imm(R5, 0x0f));
    a.emit(insn::lsh64_imm(R5, 2)); // header bytes, 0..=60
    a.jump(insn::jmp_imm(Cond::Lt, R5, IPV4_MIN as i32, 0), pass);
    a.emit(insn::mov64_reg(R4, R2));
    a.emit(insn::add64_reg(R4, R5));
    a.emit(insn::add64_imm(R4, ip as i32));
    a.emit(insn::mov64_reg(R5, R4));
    a.emit(insn::add64_imm(R5, 4));
    a.jump(insn::jmp_reg(Cond::Gt, R5, R3, 0), pass);
    a.jump(insn::ja(0), tcp);
}

/// IPv6 with next header TCP (no extension headers); r7 = the folded addresses, r4 = TCP
/// header with 4 bytes. Falls through to the TCP part.
fn ipv6_header(a: &mut Asm, pass: Label) {
    let ip = ETH_HLEN;
    a.emit(insn::mov64_reg(R4, R2));
    a.emit(insn::add64_imm(R4, (ip + IPV6_HLEN + 4) as i32));
    a.jump(insn::jmp_reg(Cond::Gt, R4, R3, 0), pass);
    a.emit(insn::ldx_mem(Size::B, R5, R2, ip + 6)); // next header
    a.jump(insn::jmp_imm(Cond::Ne, R5, IPPROTO_TCP, 0), pass);
    a.emit(insn::ldx_mem(Size::W, R7, R2, ip + 8)); // saddr[0]
    for word in 1..8 {
        a.emit(insn::ldx_mem(Size::W, R8, R2, ip + 8 + 4 * word));
        a.emit(insn::xor64_reg(R7, R8));
    }
    a.emit(insn::mov64_reg(R4, R2));
    a.emit(insn::add64_imm(R4, (ip + IPV6_HLEN) as i32));
}

/// Port filter, group hash, group → CPU, redirect.
fn steer(a: &mut Asm, maps: XdpMaps, flow_groups: u32, pass: Label) {
    a.emit(insn::ldx_mem(Size::W, R8, R4, 0)); // source and destination ports
    a.emit(insn::xor64_reg(R7, R8));
    a.emit(insn::ldx_mem(Size::H, R5, R4, 2)); // dest port
    a.emit(insn::be(R5, 16));
    a.emit(insn::stx_mem(Size::W, R10, R5, -4));
    lookup(a, maps.ports_fd, -4, pass);
    a.emit(insn::ldx_mem(Size::W, R5, R0, 0));
    a.jump(insn::jmp_imm(Cond::Eq, R5, 0, 0), pass);
    a.emit(insn::mul32_imm(R7, MIX as i32));
    a.emit(insn::mov32_reg(R5, R7));
    a.emit(insn::rsh32_imm(R5, 16));
    a.emit(insn::xor32_reg(R7, R5));
    a.emit(insn::and32_imm(R7, (flow_groups - 1) as i32));
    a.emit(insn::stx_mem(Size::W, R10, R7, -8));
    lookup(a, maps.groups_fd, -8, pass);
    a.emit(insn::ldx_mem(Size::W, R8, R0, 0)); // cpu
    a.emit(insn::call(HELPER_GET_SMP_PROCESSOR_ID));
    a.jump(insn::jmp_reg(Cond::Eq, R0, R8, 0), pass); // already there: no CPUMAP hop
    a.emit(insn::mov64_reg(R2, R8));
    a.emit2(insn::ld_map_fd(R1, maps.cpumap_fd));
    a.emit(insn::mov64_imm(R3, XDP_PASS)); // flags: the action when the CPU has no entry
    a.emit(insn::call(HELPER_REDIRECT_MAP));
    a.emit(insn::exit());
}

/// `r0 = map_lookup_elem(map, r10 + key_off)`; null → `pass`.
fn lookup(a: &mut Asm, map_fd: i32, key_off: i32, pass: Label) {
    a.emit2(insn::ld_map_fd(R1, map_fd));
    a.emit(insn::mov64_reg(R2, R10));
    a.emit(insn::add64_imm(R2, key_off));
    a.emit(insn::call(HELPER_MAP_LOOKUP_ELEM));
    a.jump(insn::jmp_imm(Cond::Eq, R0, 0, 0), pass);
}

// ---------------------------------------------------------------------------------------
// The loaded program with its maps.

/// How the program is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpMode {
    /// Generic (skb) XDP: works on any interface (lo, veth, virtio), after skb allocation.
    Generic,
    /// Native (driver) XDP: before skb allocation; the driver must support it.
    Native,
}

impl XdpMode {
    fn flags(self) -> u32 {
        match self {
            XdpMode::Generic => XDP_FLAGS_SKB_MODE,
            XdpMode::Native => XDP_FLAGS_DRV_MODE,
        }
    }
}

/// An interface, by name or index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Iface {
    /// By name, e.g. `lo`.
    Name(String),
    /// By index.
    Index(u32),
}

impl From<&str> for Iface {
    fn from(name: &str) -> Self {
        Iface::Name(name.to_string())
    }
}

impl From<u32> for Iface {
    fn from(index: u32) -> Self {
        Iface::Index(index)
    }
}

impl fmt::Display for Iface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Iface::Name(n) => f.write_str(n),
            Iface::Index(i) => write!(f, "ifindex {i}"),
        }
    }
}

/// What to steer and where.
#[derive(Debug, Clone)]
pub struct XdpConfig {
    /// The interface the program attaches to.
    pub iface: Iface,
    /// CPUs packets may be redirected to (the CPUMAP's entries); groups start spread over
    /// them round-robin in ascending order: group g → the (g mod n)-th CPU, like
    /// [`FlowGroupTable::new`](crate::balance::FlowGroupTable::new) with workers in CPU order.
    pub cpus: CpuSet,
    /// Number of flow groups (a power of two ≤ [`FLOW_GROUPS_MAX`]).
    pub flow_groups: u32,
    /// TCP destination ports to steer (the server's); all other traffic passes.
    pub ports: Vec<u16>,
    /// Attach mode.
    pub mode: XdpMode,
    /// Per-CPU CPUMAP queue size (≤ [`QUEUE_SIZE_MAX`]).
    pub queue_size: u32,
}

impl XdpConfig {
    /// Generic mode, default queue size.
    pub fn new(iface: impl Into<Iface>, cpus: &CpuSet, flow_groups: u32, ports: &[u16]) -> Self {
        XdpConfig {
            iface: iface.into(),
            cpus: cpus.clone(),
            flow_groups,
            ports: ports.to_vec(),
            mode: XdpMode::Generic,
            queue_size: QUEUE_SIZE_DEFAULT,
        }
    }
}

/// Why XDP steering could not be set up or changed.
#[derive(Debug)]
pub enum XdpError {
    /// The interface does not exist (in this network namespace).
    Interface {
        /// The interface asked for.
        iface: String,
        /// The lookup error.
        source: io::Error,
    },
    /// A `bpf(2)` call failed (map create, program load with the verifier log, attach).
    Bpf(BpfError),
    /// A bad argument (out-of-range group, CPU not in the CPUMAP, bad configuration).
    Invalid(String),
}

impl fmt::Display for XdpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            XdpError::Interface { iface, source } => write!(f, "interface {iface}: {source}"),
            XdpError::Bpf(e) => write!(f, "XDP steering: {e}"),
            XdpError::Invalid(why) => write!(f, "XDP steering: {why}"),
        }
    }
}

impl std::error::Error for XdpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            XdpError::Interface { source, .. } => Some(source),
            XdpError::Bpf(e) => Some(e),
            XdpError::Invalid(_) => None,
        }
    }
}

impl From<BpfError> for XdpError {
    fn from(e: BpfError) -> Self {
        XdpError::Bpf(e)
    }
}

impl XdpError {
    /// Whether the kernel refused for lack of privilege.
    pub fn is_permission(&self) -> bool {
        matches!(self, XdpError::Bpf(e) if e.is_permission())
    }
}

fn invalid(why: impl Into<String>) -> XdpError {
    XdpError::Invalid(why.into())
}

/// The XDP steering program, its maps and (once attached) its link. Dropping it detaches the
/// program (the link goes first, then the program and maps are closed).
#[derive(Debug)]
pub struct XdpSteering {
    link: Option<Link>,
    program: Program,
    groups: Map,
    cpumap: Map,
    ports: Map,
    cpus: CpuSet,
    flow_groups: u32,
    ifindex: Option<u32>,
}

fn validate(config: &XdpConfig) -> Result<(), XdpError> {
    if !config.flow_groups.is_power_of_two() || config.flow_groups > FLOW_GROUPS_MAX {
        return Err(invalid(format!(
            "flow groups {} is not a power of two ≤ {FLOW_GROUPS_MAX}",
            config.flow_groups
        )));
    }
    match config.cpus.max() {
        None => return Err(invalid("no CPUs to steer to")),
        Some(max) if max >= CPUS_MAX => return Err(invalid(format!("CPU {max} ≥ {CPUS_MAX}"))),
        Some(_) => {}
    }
    if config.queue_size == 0 || config.queue_size > QUEUE_SIZE_MAX {
        return Err(invalid(format!(
            "CPUMAP queue size {} not in 1..={QUEUE_SIZE_MAX}",
            config.queue_size
        )));
    }
    Ok(())
}

fn resolve(iface: &Iface) -> Result<u32, XdpError> {
    match iface {
        Iface::Index(i) => Ok(*i),
        Iface::Name(n) => crate::sys::ethtool::ifindex(n).map_err(|source| XdpError::Interface {
            iface: n.clone(),
            source,
        }),
    }
}

impl XdpSteering {
    /// Creates the maps, fills them (CPUMAP entries, ports, groups spread round-robin) and
    /// loads the program — without attaching it. Needs CAP_BPF + CAP_SYS_ADMIN (CPUMAP).
    pub fn load(config: &XdpConfig) -> Result<XdpSteering, XdpError> {
        validate(config)?;
        let cpu_slots = config.cpus.max().map_or(1, |m| m + 1) as u32;
        let ports = Map::create(MapType::Array, 4, 4, 1 << 16, "cl_xdp_ports")?;
        let groups = Map::create(MapType::Array, 4, 4, config.flow_groups, "cl_xdp_groups")?;
        let cpumap = Map::create(MapType::CpuMap, 4, 4, cpu_slots, "cl_xdp_cpumap")?;
        for cpu in config.cpus.iter() {
            cpumap.update_u32(cpu as u32, config.queue_size)?;
        }
        for &port in &config.ports {
            ports.update_u32(u32::from(port), 1)?;
        }
        let spread: Vec<usize> = config.cpus.iter().collect();
        for g in 0..config.flow_groups {
            groups.update_u32(g, spread[g as usize % spread.len()] as u32)?;
        }
        let maps = XdpMaps {
            ports_fd: ports.raw_fd(),
            groups_fd: groups.raw_fd(),
            cpumap_fd: cpumap.raw_fd(),
        };
        let (insns, _) = xdp_steer(maps, config.flow_groups);
        let program = Program::load(ProgType::Xdp, 0, &insns, "cl_xdp_steer")?;
        Ok(XdpSteering {
            link: None,
            program,
            groups,
            cpumap,
            ports,
            cpus: config.cpus.clone(),
            flow_groups: config.flow_groups,
            ifindex: None,
        })
    }

    /// [`load`](Self::load), then attach to `config.iface` in `config.mode` with a BPF link.
    /// Fails with EBUSY when the interface already has an XDP program.
    pub fn attach(config: &XdpConfig) -> Result<XdpSteering, XdpError> {
        let ifindex = resolve(&config.iface)?;
        let mut steering = XdpSteering::load(config)?;
        steering.link = Some(Link::create(
            &steering.program,
            ifindex,
            ATTACH_XDP,
            config.mode.flags(),
        )?);
        steering.ifindex = Some(ifindex);
        Ok(steering)
    }

    /// Detaches now (dropping does the same).
    pub fn detach(&mut self) {
        self.link = None;
        self.ifindex = None;
    }

    /// The interface index attached to, if attached.
    pub fn ifindex(&self) -> Option<u32> {
        self.ifindex
    }

    /// Number of flow groups.
    pub fn groups(&self) -> u32 {
        self.flow_groups
    }

    /// The CPUs in the CPUMAP.
    pub fn cpus(&self) -> &CpuSet {
        &self.cpus
    }

    /// The program's descriptor.
    pub fn program_fd(&self) -> std::os::fd::RawFd {
        self.program.raw_fd()
    }

    fn check_group(&self, group: u32) -> Result<(), XdpError> {
        if group >= self.flow_groups {
            return Err(invalid(format!(
                "flow group {group} ≥ {} groups",
                self.flow_groups
            )));
        }
        Ok(())
    }

    /// Sends flow group `group`'s packets to `cpu` (which must be one of [`cpus`](Self::cpus)).
    /// Takes effect for the next packet; one map update.
    pub fn set_group_cpu(&self, group: u32, cpu: usize) -> Result<(), XdpError> {
        self.set_group(group, Some(cpu))
    }

    /// Like [`set_group_cpu`](Self::set_group_cpu); `None` stops steering the group (its
    /// packets are processed where they arrive).
    pub fn set_group(&self, group: u32, cpu: Option<usize>) -> Result<(), XdpError> {
        self.check_group(group)?;
        let value = match cpu {
            Some(c) if self.cpus.contains(c) => c as u32,
            Some(c) => return Err(invalid(format!("CPU {c} is not in the CPUMAP"))),
            None => NO_CPU,
        };
        self.groups.update_u32(group, value)?;
        Ok(())
    }

    /// The CPU flow group `group` is steered to (`None`: not steered).
    pub fn group_cpu(&self, group: u32) -> Result<Option<usize>, XdpError> {
        self.check_group(group)?;
        let v = self.groups.lookup_u32(group)?;
        Ok(v.filter(|&c| c != NO_CPU).map(|c| c as usize))
    }

    /// Every group to `cpu` (or none), e.g. before a test or when a worker takes everything.
    pub fn set_all(&self, cpu: Option<usize>) -> Result<(), XdpError> {
        (0..self.flow_groups).try_for_each(|g| self.set_group(g, cpu))
    }

    /// Starts or stops steering TCP destination port `port`.
    pub fn set_port(&self, port: u16, steer: bool) -> Result<(), XdpError> {
        self.ports.update_u32(u32::from(port), u32::from(steer))?;
        Ok(())
    }

    /// The CPUMAP queue size of `cpu` (`None` when `cpu` has no entry).
    pub fn queue_size(&self, cpu: usize) -> Result<Option<u32>, XdpError> {
        if cpu >= self.cpumap.max_entries() as usize {
            return Ok(None);
        }
        Ok(self.cpumap.lookup_u32(cpu as u32)?)
    }
}

#[cfg(test)]
mod tests;
