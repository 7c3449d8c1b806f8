//! What the kernel has attached to each TCP listener's reuseport group, read by a BPF
//! iterator over the TCP sockets of our network namespace (`iter/tcp`): for every listener,
//! its socket cookie, its group's `reuseport_id`, and whether the group has a program, with
//! its type and id. This sees what nothing else shows — a classic BPF program
//! (`SO_ATTACH_REUSEPORT_CBPF`: type UNSPEC, no id) and an eBPF one whose maps we cannot
//! read.
//!
//! The program walks kernel structures by BTF (`sock.sk_reuseport_cb → sock_reuseport.prog
//! → bpf_prog.aux → bpf_prog_aux.id`), so its offsets come from `/sys/kernel/btf/vmlinux`
//! ([`Btf`]); loading a tracing program needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN).
//! When anything is missing (no BTF, no privilege, an older kernel) the caller goes on
//! without it.

use corelocal::bpf::insn::{self, Cond, EbpfInsn, Size, R0, R1, R10, R2, R3, R6, R7, R8, R9};
use corelocal::sys::bpf::{Link, ProgType, Program, ATTACH_TRACE_ITER};
use std::collections::BTreeMap;
use std::io::Read;

/// Most records read from one iteration (one per listening socket of the namespace).
pub const RECORDS_MAX: usize = 1 << 20;

/// One listening TCP socket and its group's program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerProg {
    /// Socket cookie (0 when nobody asked for it yet).
    pub cookie: u64,
    /// The reuseport group's id (0: not in a group).
    pub reuseport_id: u32,
    /// Whether the group has a program attached.
    pub has_prog: bool,
    /// `BPF_PROG_TYPE_*` of the group's program (0, UNSPEC, for a classic BPF one).
    pub prog_type: u32,
    /// Its id (0 for a classic BPF program, which has none).
    pub prog_id: u32,
}

const BTF_KIND_STRUCT: u32 = 4;
const BTF_KIND_UNION: u32 = 5;
const BTF_KIND_FUNC: u32 = 12;

/// A struct or union member: (name, type id, bit offset).
type Member = (String, u32, u32);

/// A parsed BTF blob: type records and their string names, enough to find a function by name
/// and a member's byte offset inside a struct (through anonymous members).
pub struct Btf {
    /// Per type id (index; id 0 is void): (kind, name, members).
    types: Vec<(u32, String, Vec<Member>)>,
}

impl Btf {
    /// Parses a raw BTF blob (`/sys/kernel/btf/vmlinux`).
    pub fn parse(data: &[u8]) -> Result<Btf, String> {
        let u16_at = |o: usize| data.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
        let u32_at = |o: usize| {
            data.get(o..o + 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        if u16_at(0) != Some(0xeb9f) {
            return Err("not a little-endian BTF blob".into());
        }
        let field = |o: usize| u32_at(o).ok_or("truncated BTF header").map(|v| v as usize);
        let hdr_len = field(4)?;
        let (type_off, type_len) = (field(8)?, field(12)?);
        let (str_off, str_len) = (field(16)?, field(20)?);
        let strings = data
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or("BTF string section out of range")?;
        let name = |off: u32| -> String {
            let s = strings.get(off as usize..).unwrap_or(&[]);
            let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
            String::from_utf8_lossy(&s[..end]).into_owned()
        };
        let mut types = vec![(0, String::new(), Vec::new())];
        let mut o = hdr_len + type_off;
        let end = o + type_len;
        while o + 12 <= end {
            let name_off = u32_at(o).ok_or("truncated type")?;
            let info = u32_at(o + 4).ok_or("truncated type")?;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let kflag = info >> 31 == 1;
            o += 12;
            let mut members = Vec::new();
            let extra = match kind {
                1 | 14 | 17 => 4, // INT, VAR, DECL_TAG
                3 => 12,          // ARRAY
                BTF_KIND_STRUCT | BTF_KIND_UNION => {
                    for m in 0..vlen {
                        let mo = o + 12 * m;
                        let mname = u32_at(mo).ok_or("truncated member")?;
                        let mtype = u32_at(mo + 4).ok_or("truncated member")?;
                        let moff = u32_at(mo + 8).ok_or("truncated member")?;
                        let bits = if kflag { moff & 0xff_ffff } else { moff };
                        members.push((name(mname), mtype, bits));
                    }
                    12 * vlen
                }
                6 | 13 => 8 * vlen,   // ENUM, FUNC_PROTO
                15 | 19 => 12 * vlen, // DATASEC, ENUM64
                _ => 0, // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG
            };
            o += extra;
            types.push((kind, name(name_off), members));
        }
        Ok(Btf { types })
    }

    /// The id of the first type of `kind` named `name`.
    fn find(&self, kind: u32, name: &str) -> Option<u32> {
        self.types
            .iter()
            .position(|(k, n, _)| *k == kind && n == name)
            .map(|i| i as u32)
    }

    /// The id of function `name` (an iterator's attach point).
    pub fn func(&self, name: &str) -> Option<u32> {
        self.find(BTF_KIND_FUNC, name)
    }

    /// Byte offset of member `member` of struct `name`, looking through anonymous struct and
    /// union members.
    pub fn offset(&self, name: &str, member: &str) -> Option<u32> {
        let id = self.find(BTF_KIND_STRUCT, name)?;
        self.offset_in(id, member, 0).map(|bits| bits / 8)
    }

    fn offset_in(&self, id: u32, member: &str, depth: u32) -> Option<u32> {
        let (_, _, members) = self.types.get(id as usize)?;
        if depth > 8 {
            return None;
        }
        for (n, _, bits) in members {
            if n == member {
                return Some(*bits);
            }
        }
        // Anonymous members are structs or unions referred to directly.
        for (n, t, bits) in members {
            if n.is_empty() {
                if let Some(inner) = self.offset_in(*t, member, depth + 1) {
                    return Some(bits + inner);
                }
            }
        }
        None
    }
}

/// The offsets the iterator program needs.
#[derive(Debug, Clone, Copy)]
struct Offsets {
    attach_btf_id: u32,
    skc_state: i16,
    skc_cookie: i16,
    sk_reuseport_cb: i16,
    reuseport_id: i16,
    reuse_prog: i16,
    prog_type: i16,
    prog_aux: i16,
    aux_id: i16,
}

fn offsets(btf: &Btf) -> Result<Offsets, String> {
    let off = |s: &str, m: &str| -> Result<i16, String> {
        btf.offset(s, m)
            .and_then(|o| i16::try_from(o).ok())
            .ok_or_else(|| format!("BTF: no {s}.{m}"))
    };
    // tcp_sock → inet_connection_sock → inet_sock → sock: each the first member.
    let sock_in_tcp = off("tcp_sock", "inet_conn")?
        + off("inet_connection_sock", "icsk_inet")?
        + off("inet_sock", "sk")?;
    Ok(Offsets {
        attach_btf_id: btf.func("bpf_iter_tcp").ok_or("BTF: no bpf_iter_tcp")?,
        skc_state: off("sock_common", "skc_state")?,
        skc_cookie: off("sock_common", "skc_cookie")?,
        sk_reuseport_cb: sock_in_tcp + off("sock", "sk_reuseport_cb")?,
        reuseport_id: off("sock_reuseport", "reuseport_id")?,
        reuse_prog: off("sock_reuseport", "prog")?,
        prog_type: off("bpf_prog", "type")?,
        prog_aux: off("bpf_prog", "aux")?,
        aux_id: off("bpf_prog_aux", "id")?,
    })
}

/// `BPF_FUNC_seq_write`.
const HELPER_SEQ_WRITE: i32 = 127;
/// `BPF_FUNC_skc_to_tcp_sock`.
const HELPER_SKC_TO_TCP_SOCK: i32 = 137;
/// `TCP_LISTEN`.
const TCP_LISTEN: i32 = 10;
/// Bytes per record: cookie (8), reuseport_id, prog_type, prog_id, has_prog (4 each).
const RECORD: usize = 24;

/// The iterator program: for each listening TCP socket, one [`RECORD`].
fn program(o: &Offsets) -> Vec<EbpfInsn> {
    use insn::{call, exit, jmp_imm, ldx_mem, mov64_imm, mov64_reg, st_mem, stx_mem};
    // Stack record at r10-24: cookie @-24, reuseport_id @-16, prog_type @-12, prog_id @-8,
    // has_prog @-4. Labels are counted by hand: each `jmp` offset is to `out` (the final two).
    let mut p = vec![
        /* 0 */ mov64_reg(R6, R1),
        /* 1 */ ldx_mem(Size::DW, R7, R6, 8), // ctx->sk_common
        /* 2 */ jmp_imm(Cond::Eq, R7, 0, 0), // → out (patched)
        /* 3 */ ldx_mem(Size::B, R1, R7, o.skc_state),
        /* 4 */ jmp_imm(Cond::Ne, R1, TCP_LISTEN, 0), // → out
        /* 5 */ mov64_reg(R1, R7),
        /* 6 */ call(HELPER_SKC_TO_TCP_SOCK),
        /* 7 */ jmp_imm(Cond::Eq, R0, 0, 0), // → out
        /* 8 */ mov64_reg(R8, R0),
        /* 9 */ ldx_mem(Size::DW, R1, R7, o.skc_cookie),
        /* 10 */ stx_mem(Size::DW, R10, R1, -24),
        /* 11 */ st_mem(Size::DW, R10, -16, 0),
        /* 12 */ st_mem(Size::DW, R10, -8, 0),
        /* 13 */ ldx_mem(Size::DW, R9, R8, o.sk_reuseport_cb),
        /* 14 */ jmp_imm(Cond::Eq, R9, 0, 0), // → write
        /* 15 */ ldx_mem(Size::W, R1, R9, o.reuseport_id),
        /* 16 */ stx_mem(Size::W, R10, R1, -16),
        /* 17 */ ldx_mem(Size::DW, R9, R9, o.reuse_prog),
        /* 18 */ jmp_imm(Cond::Eq, R9, 0, 0), // → write
        // A program is attached (a classic one has type 0 and id 0: this flag tells).
        /* 19 */
        st_mem(Size::W, R10, -4, 1),
        /* 20 */ ldx_mem(Size::W, R1, R9, o.prog_type),
        /* 21 */ stx_mem(Size::W, R10, R1, -12),
        /* 22 */ ldx_mem(Size::DW, R9, R9, o.prog_aux),
        /* 23 */ jmp_imm(Cond::Eq, R9, 0, 0), // → write
        /* 24 */ ldx_mem(Size::W, R1, R9, o.aux_id),
        /* 25 */ stx_mem(Size::W, R10, R1, -8),
        // write:
        /* 26 */ ldx_mem(Size::DW, R1, R6, 0), // ctx->meta
        /* 27 */ ldx_mem(Size::DW, R1, R1, 0), // meta->seq
        /* 28 */ mov64_reg(R2, R10),
        /* 29 */ insn::add64_imm(R2, -(RECORD as i32)),
        /* 30 */ mov64_imm(R3, RECORD as i32),
        /* 31 */ call(HELPER_SEQ_WRITE),
        // out:
        /* 32 */ mov64_imm(R0, 0),
        /* 33 */ exit(),
    ];
    let (write, out) = (26i16, 32i16);
    for (at, to) in [
        (2, out),
        (4, out),
        (7, out),
        (14, write),
        (18, write),
        (23, write),
    ] {
        p[at as usize].off = to - at - 1;
    }
    p
}

/// Loads the iterator, runs it once and parses its records.
pub fn listener_progs() -> Result<Vec<ListenerProg>, String> {
    let data = std::fs::read("/sys/kernel/btf/vmlinux").map_err(|e| format!("kernel BTF: {e}"))?;
    let o = offsets(&Btf::parse(&data)?)?;
    let insns = program(&o);
    let prog = Program::load_btf(
        ProgType::Tracing,
        ATTACH_TRACE_ITER,
        o.attach_btf_id,
        &insns,
        "cl_rp_iter",
    )
    .map_err(|e| {
        let tail: Vec<&str> = e.log.lines().rev().take(3).collect();
        format!(
            "loading the reuseport iterator: {} ({})",
            e.source,
            tail.join(" / ")
        )
    })?;
    // No iter_info for iter/tcp.
    let link = Link::create(&prog, 0, ATTACH_TRACE_ITER, 0)
        .map_err(|e| format!("iter link: {}", e.source))?;
    let iter = link
        .iter_create()
        .map_err(|e| format!("iter create: {}", e.source))?;
    let mut file = std::fs::File::from(iter);
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = file
            .read(&mut chunk)
            .map_err(|e| format!("iter read: {e}"))?;
        if n == 0 || buf.len() >= RECORDS_MAX * RECORD {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(parse_records(&buf))
}

/// Parses the iterator's output.
pub fn parse_records(buf: &[u8]) -> Vec<ListenerProg> {
    buf.chunks_exact(RECORD)
        .map(|r| {
            let u32_at = |o: usize| u32::from_ne_bytes(r[o..o + 4].try_into().expect("4 bytes"));
            ListenerProg {
                cookie: u64::from_ne_bytes(r[0..8].try_into().expect("8 bytes")),
                reuseport_id: u32_at(8),
                prog_type: u32_at(12),
                prog_id: u32_at(16),
                has_prog: u32_at(20) != 0,
            }
        })
        .collect()
}

/// [`listener_progs`] by cookie.
pub fn by_cookie() -> Result<BTreeMap<u64, ListenerProg>, String> {
    Ok(listener_progs()?
        .into_iter()
        .map(|l| (l.cookie, l))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_btf_has_what_the_iterator_needs() {
        let Ok(data) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            eprintln!("skipping: no /sys/kernel/btf/vmlinux");
            return;
        };
        let btf = Btf::parse(&data).unwrap();
        let o = offsets(&btf).unwrap();
        assert!(o.attach_btf_id > 0);
        assert_eq!(btf.offset("sock", "__sk_common"), Some(0));
        assert!(o.sk_reuseport_cb > 0 && o.reuse_prog > 0 && o.prog_aux > 0);
        assert_eq!(program(&o).len(), 34);
    }

    #[test]
    fn records() {
        let mut buf = Vec::new();
        buf.extend_from_slice(&77u64.to_ne_bytes());
        for v in [5u32, 21, 9, 1] {
            buf.extend_from_slice(&v.to_ne_bytes());
        }
        buf.extend_from_slice(&[1, 2, 3]); // a torn tail is ignored
        assert_eq!(
            parse_records(&buf),
            vec![ListenerProg {
                cookie: 77,
                reuseport_id: 5,
                prog_type: 21,
                prog_id: 9,
                has_prog: true,
            }]
        );
    }
}
