//! Layout tests and an interpreter for the subset of eBPF the program uses: it runs the
//! program on crafted frames against mock maps, so `flow_group()` is checked against the
//! instructions themselves, without root.

use super::*;
use proptest::prelude::*;
use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};

const PORTS_FD: i32 = 3;
const GROUPS_FD: i32 = 4;
const CPUMAP_FD: i32 = 5;
const MAPS: XdpMaps = XdpMaps {
    ports_fd: PORTS_FD,
    groups_fd: GROUPS_FD,
    cpumap_fd: CPUMAP_FD,
};
const SERVER_PORT: u16 = 8080;

const PKT: u64 = 0x1_0000_0000;
const STACK_TOP: u64 = 0x2_0000_0200;
const STACK_BYTES: usize = 512;
const MAPVAL: u64 = 0x3_0000_0000;
const CTX: u64 = 0x4_0000_0000;

/// The mock world: maps by descriptor (u32 arrays; the CPUMAP lists CPUs with an entry).
struct Vm<'a> {
    pkt: &'a [u8],
    stack: [u8; STACK_BYTES],
    maps: HashMap<i32, Vec<u32>>,
    cpumap: Vec<u32>,
    redirect: Option<(i32, u64, u64)>,
    /// What `bpf_get_smp_processor_id` answers.
    this_cpu: u32,
}

impl Vm<'_> {
    fn read(&self, addr: u64, n: usize) -> u64 {
        let bytes: Vec<u8> = if (PKT..PKT + 0x1000).contains(&addr) {
            let at = (addr - PKT) as usize;
            assert!(at + n <= self.pkt.len(), "read past data_end at {at}+{n}");
            self.pkt[at..at + n].to_vec()
        } else if (STACK_TOP - STACK_BYTES as u64..STACK_TOP).contains(&addr) {
            let at = (addr - (STACK_TOP - STACK_BYTES as u64)) as usize;
            self.stack[at..at + n].to_vec()
        } else if (MAPVAL..CTX).contains(&addr) {
            let fd = ((addr - MAPVAL) >> 24) as i32;
            let key = ((addr - MAPVAL) & 0xff_ffff) / 4;
            self.maps[&fd][key as usize].to_ne_bytes()[..n].to_vec()
        } else if addr == CTX || addr == CTX + 4 {
            // xdp_md->data / data_end (the verifier rewrites these to pointer loads).
            let v = if addr == CTX {
                PKT
            } else {
                PKT + self.pkt.len() as u64
            };
            return v;
        } else {
            panic!("wild read at {addr:#x}");
        };
        let mut w = [0u8; 8];
        w[..n].copy_from_slice(&bytes);
        u64::from_ne_bytes(w)
    }

    fn write(&mut self, addr: u64, n: usize, v: u64) {
        let base = STACK_TOP - STACK_BYTES as u64;
        assert!(
            addr >= base && addr + n as u64 <= STACK_TOP,
            "write outside the stack"
        );
        let at = (addr - base) as usize;
        self.stack[at..at + n].copy_from_slice(&v.to_ne_bytes()[..n]);
    }

    fn call(&mut self, helper: i32, r: &mut [u64; 11]) {
        match helper {
            HELPER_MAP_LOOKUP_ELEM => {
                let fd = r[1] as i32;
                let key = self.read(r[2], 4) as u32;
                let len = self.maps[&fd].len() as u32;
                r[0] = if key < len {
                    MAPVAL + ((fd as u64) << 24) + 4 * key as u64
                } else {
                    0
                };
            }
            HELPER_REDIRECT_MAP => {
                self.redirect = Some((r[1] as i32, r[2], r[3]));
                let known = self.cpumap.contains(&(r[2] as u32));
                r[0] = if known { XDP_REDIRECT as u64 } else { r[3] & 3 };
            }
            HELPER_GET_SMP_PROCESSOR_ID => r[0] = u64::from(self.this_cpu),
            other => panic!("unexpected helper {other}"),
        }
        r[1..=5].fill(0xdead_beef);
    }
}

fn size_bytes(code: u8) -> usize {
    match code & 0x18 {
        0x00 => 4,
        0x08 => 2,
        0x10 => 1,
        _ => 8,
    }
}

fn alu(op: u8, a: u64, b: u64, imm: i32) -> u64 {
    match op {
        0x00 => a.wrapping_add(b),
        0x20 => a.wrapping_mul(b),
        0x50 => a & b,
        0x60 => a << b,
        0x70 => a >> b,
        0xa0 => a ^ b,
        0xb0 => b,
        0xd0 => match imm {
            16 => u64::from((a as u16).to_be()),
            32 => u64::from((a as u32).to_be()),
            _ => a.to_be(),
        },
        _ => panic!("unexpected ALU op {op:#x}"),
    }
}

fn taken(op: u8, a: u64, b: u64) -> bool {
    match op {
        0x00 => true,
        0x10 => a == b,
        0x20 => a > b,
        0x30 => a >= b,
        0x50 => a != b,
        0xa0 => a < b,
        _ => panic!("unexpected jump op {op:#x}"),
    }
}

/// Runs the program; returns (action, redirect call).
fn run(prog: &[EbpfInsn], vm: &mut Vm) -> (u64, Option<(i32, u64, u64)>) {
    let mut r = [0u64; 11];
    r[1] = CTX;
    r[10] = STACK_TOP;
    let mut pc = 0usize;
    for _ in 0..10_000 {
        let i = prog[pc];
        let (dst, src) = ((i.regs & 0xf) as usize, (i.regs >> 4) as usize);
        let operand = if i.code & 0x08 != 0 {
            r[src]
        } else {
            i.imm as i64 as u64
        };
        pc += 1;
        match i.code & 0x07 {
            0x07 => r[dst] = alu(i.code & 0xf0, r[dst], operand, i.imm),
            0x04 => {
                let b = if i.code & 0xf0 == 0xd0 {
                    0
                } else {
                    operand as u32 as u64
                };
                r[dst] = alu(i.code & 0xf0, r[dst] as u32 as u64, b, i.imm) as u32 as u64;
            }
            0x01 => r[dst] = vm.read(r[src].wrapping_add(i.off as i64 as u64), size_bytes(i.code)),
            0x03 => vm.write(
                r[dst].wrapping_add(i.off as i64 as u64),
                size_bytes(i.code),
                r[src],
            ),
            0x00 => {
                r[dst] = i.imm as u32 as u64;
                pc += 1;
            }
            0x05 => match i.code & 0xf0 {
                0x80 => vm.call(i.imm, &mut r),
                0x90 => return (r[0], vm.redirect),
                op => {
                    if taken(op, r[dst], operand) {
                        pc = (pc as i64 + i.off as i64) as usize;
                    }
                }
            },
            class => panic!("unexpected class {class}"),
        }
    }
    panic!("program did not exit");
}

/// A world with `G` groups, group g → CPU g % 2, CPUs 0 and 1 in the CPUMAP.
fn vm(pkt: &[u8], flow_groups: u32) -> Vm<'_> {
    let mut ports = vec![0u32; 1 << 16];
    ports[SERVER_PORT as usize] = 1;
    let groups = (0..flow_groups).map(|g| g % 2).collect();
    Vm {
        pkt,
        stack: [0; STACK_BYTES],
        maps: HashMap::from([(PORTS_FD, ports), (GROUPS_FD, groups), (CPUMAP_FD, vec![])]),
        cpumap: vec![0, 1],
        redirect: None,
        this_cpu: 7,
    }
}

fn ports(sport: u16, dport: u16) -> [u8; 20] {
    let mut tcp = [0u8; 20];
    tcp[..2].copy_from_slice(&sport.to_be_bytes());
    tcp[2..4].copy_from_slice(&dport.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp
}

fn frame(ethertype: u16) -> Vec<u8> {
    let mut f = vec![0u8; 12];
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

/// Ethernet + IPv4 (with `options` words of IP options) + TCP.
fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, options: u8) -> Vec<u8> {
    let mut f = frame(0x0800);
    let mut ip = vec![0u8; 20 + 4 * options as usize];
    ip[0] = 0x40 | (5 + options);
    ip[6] = 0x40; // DF
    ip[8] = 64;
    ip[9] = 6;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    f.extend(ip);
    f.extend(ports(sport, dport));
    f
}

fn ipv6(src: Ipv6Addr, dst: Ipv6Addr, sport: u16, dport: u16) -> Vec<u8> {
    let mut f = frame(0x86dd);
    let mut ip = vec![0u8; 40];
    ip[0] = 0x60;
    ip[6] = 6;
    ip[7] = 64;
    ip[8..24].copy_from_slice(&src.octets());
    ip[24..40].copy_from_slice(&dst.octets());
    f.extend(ip);
    f.extend(ports(sport, dport));
    f
}

fn expect_redirect(pkt: &[u8], g: u32, group: u32) {
    let (insns, _) = xdp_steer(MAPS, g);
    let mut w = vm(pkt, g);
    let (action, redirect) = run(&insns, &mut w);
    assert_eq!(action, XDP_REDIRECT as u64);
    assert_eq!(
        redirect,
        Some((CPUMAP_FD, u64::from(group % 2), XDP_PASS as u64))
    );
}

fn expect_pass(pkt: &[u8]) {
    let (insns, _) = xdp_steer(MAPS, 16);
    let mut w = vm(pkt, 16);
    let (action, redirect) = run(&insns, &mut w);
    assert_eq!((action, redirect), (XDP_PASS as u64, None));
}

#[test]
fn layout_jumps_land_inside_and_pass_is_last() {
    let (p, layout) = xdp_steer(MAPS, 4096);
    assert!(p.len() < 120, "{} instructions", p.len());
    assert_eq!(layout.pass, p.len() - 2);
    assert_eq!(p[layout.pass].imm, XDP_PASS);
    assert_eq!(p[layout.pass + 1], insn::exit());
    assert!(layout.ipv4 < layout.ipv6 && layout.ipv6 < layout.tcp);
    // The redirect tail: call bpf_redirect_map; exit.
    assert_eq!(p[layout.pass - 2].imm, HELPER_REDIRECT_MAP);
    assert_eq!(p[layout.pass - 1], insn::exit());
    let mut targets = Vec::new();
    for (i, x) in p.iter().enumerate() {
        let is_jump = x.code & 0x07 == 0x05 && !matches!(x.code & 0xf0, 0x80 | 0x90);
        if is_jump {
            let t = (i as i64 + 1 + x.off as i64) as usize;
            assert!(t > i && t < p.len(), "insn {i} jumps to {t}");
            targets.push(t);
        }
    }
    for want in [layout.ipv4, layout.ipv6, layout.tcp, layout.pass] {
        assert!(targets.contains(&want), "nothing jumps to {want}");
    }
    // The mask is G-1.
    assert!(p.iter().any(|x| x.code == 0x54 && x.imm == 4095));
}

#[test]
fn flow_group_is_stable_and_spreads() {
    let a = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let mut counts = [0u32; 16];
    for sport in 32768..(32768 + 1600) {
        counts[flow_group(a, a, sport, SERVER_PORT, 16) as usize] += 1;
    }
    // Sequential ephemeral ports (what a client gets) spread evenly: 100 each ± 40%.
    assert!(
        counts.iter().all(|&c| (60..=140).contains(&c)),
        "{counts:?}"
    );
    assert_eq!(
        flow_group(a, a, 40000, 80, 4096),
        flow_group(a, a, 40000, 80, 4096)
    );
    assert_eq!(flow_group(a, a, 40000, 80, 1), 0);
}

#[test]
fn program_computes_flow_group_for_ipv4_with_and_without_options() {
    let (c, s) = (Ipv4Addr::new(10, 1, 2, 3), Ipv4Addr::new(10, 9, 8, 7));
    for options in [0, 1, 10] {
        for sport in [1, 40000, 65535] {
            let g = flow_group(c.into(), s.into(), sport, SERVER_PORT, 64);
            expect_redirect(&ipv4(c, s, sport, SERVER_PORT, options), 64, g);
        }
    }
}

#[test]
fn other_traffic_passes() {
    let lo = Ipv4Addr::LOCALHOST;
    expect_pass(&ipv4(lo, lo, 40000, 9999, 0)); // not a steered port
    expect_pass(&ipv4(lo, lo, SERVER_PORT, 40000, 0)); // the server's reply
    let mut udp = ipv4(lo, lo, 40000, SERVER_PORT, 0);
    udp[14 + 9] = 17;
    expect_pass(&udp);
    let mut frag = ipv4(lo, lo, 40000, SERVER_PORT, 0);
    frag[14 + 6] = 0x20; // MF
    expect_pass(&frag);
    let mut bad_ihl = ipv4(lo, lo, 40000, SERVER_PORT, 0);
    bad_ihl[14] = 0x44;
    expect_pass(&bad_ihl);
    expect_pass(&frame(0x0806)); // ARP (and a runt frame)
    expect_pass(&[0u8; 10]);
    let full = ipv4(lo, lo, 40000, SERVER_PORT, 0);
    expect_pass(&full[..14 + 20 + 3]); // TCP ports cut short
    let mut ext = ipv6(Ipv6Addr::LOCALHOST, Ipv6Addr::LOCALHOST, 40000, SERVER_PORT);
    ext[14 + 6] = 0; // hop-by-hop extension header
    expect_pass(&ext);
}

#[test]
fn an_unsteered_group_passes() {
    let lo = Ipv4Addr::LOCALHOST;
    let pkt = ipv4(lo, lo, 40000, SERVER_PORT, 0);
    let (insns, _) = xdp_steer(MAPS, 16);
    let mut w = vm(&pkt, 16);
    let g = flow_group(lo.into(), lo.into(), 40000, SERVER_PORT, 16);
    w.maps.get_mut(&GROUPS_FD).unwrap()[g as usize] = NO_CPU;
    let (action, redirect) = run(&insns, &mut w);
    assert_eq!(action, XDP_PASS as u64);
    assert_eq!(redirect.map(|r| r.1), Some(u64::from(NO_CPU)));
}

#[test]
fn a_group_already_on_this_cpu_passes_without_a_hop() {
    let lo = Ipv4Addr::LOCALHOST;
    let pkt = ipv4(lo, lo, 40000, SERVER_PORT, 0);
    let g = flow_group(lo.into(), lo.into(), 40000, SERVER_PORT, 16);
    let (insns, _) = xdp_steer(MAPS, 16);
    let mut w = vm(&pkt, 16);
    w.this_cpu = g % 2;
    assert_eq!(run(&insns, &mut w), (XDP_PASS as u64, None));
    w.this_cpu = 1 - g % 2;
    assert_eq!(run(&insns, &mut w).0, XDP_REDIRECT as u64);
}

proptest! {
    #[test]
    fn program_and_flow_group_agree_ipv4(
        c in any::<u32>(), s in any::<u32>(), sport in any::<u16>(), bits in 0u32..=20,
    ) {
        let (c, s) = (Ipv4Addr::from(c), Ipv4Addr::from(s));
        let g = flow_group(c.into(), s.into(), sport, SERVER_PORT, 1 << bits);
        prop_assert!(g < 1 << bits);
        expect_redirect(&ipv4(c, s, sport, SERVER_PORT, 0), 1 << bits, g);
    }

    #[test]
    fn program_and_flow_group_agree_ipv6(
        c in any::<u128>(), s in any::<u128>(), sport in any::<u16>(), bits in 0u32..=12,
    ) {
        let (c, s) = (Ipv6Addr::from(c), Ipv6Addr::from(s));
        let g = flow_group(c.into(), s.into(), sport, SERVER_PORT, 1 << bits);
        expect_redirect(&ipv6(c, s, sport, SERVER_PORT), 1 << bits, g);
    }
}

#[test]
fn config_is_validated() {
    let cpus = CpuSet::first_n(2);
    let mut c = XdpConfig::new("lo", &cpus, 12, &[80]);
    assert!(matches!(validate(&c), Err(XdpError::Invalid(_))));
    c.flow_groups = 16;
    assert!(validate(&c).is_ok());
    c.queue_size = 0;
    assert!(validate(&c).is_err());
    c.queue_size = QUEUE_SIZE_DEFAULT;
    c.cpus = CpuSet::new();
    assert!(validate(&c).is_err());
    c.cpus = CpuSet::single(CPUS_MAX);
    assert!(validate(&c).is_err());
}
