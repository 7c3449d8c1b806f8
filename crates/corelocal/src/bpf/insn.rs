//! Instruction encoders for classic BPF (`struct sock_filter`) and extended BPF
//! (`struct bpf_insn`), with just the opcodes corelocal's programs use.

/// One classic BPF instruction (`struct sock_filter`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CbpfInsn {
    /// Opcode.
    pub code: u16,
    /// Jump offset if true.
    pub jt: u8,
    /// Jump offset if false.
    pub jf: u8,
    /// Constant operand.
    pub k: u32,
}

/// Classic BPF opcodes and ancillary offsets.
pub mod cbpf {
    use super::CbpfInsn;

    /// `BPF_LD | BPF_W | BPF_ABS`.
    pub const LD_W_ABS: u16 = 0x20;
    /// `BPF_RET | BPF_A`.
    pub const RET_A: u16 = 0x16;
    /// `BPF_RET | BPF_K`.
    pub const RET_K: u16 = 0x06;
    /// `BPF_JMP | BPF_JEQ | BPF_K`.
    pub const JEQ_K: u16 = 0x15;
    /// `SKF_AD_OFF`: base of the ancillary-data loads.
    pub const SKF_AD_OFF: u32 = 0xffff_f000;
    /// `SKF_AD_CPU`: the CPU running the program.
    pub const SKF_AD_CPU: u32 = 36;

    /// `A = packet[offset]` (32-bit load; for seccomp, `struct seccomp_data` at `offset`).
    pub fn ld_abs(offset: u32) -> CbpfInsn {
        CbpfInsn {
            code: LD_W_ABS,
            jt: 0,
            jf: 0,
            k: offset,
        }
    }

    /// `A = ancillary[offset]`.
    pub fn ld_ancillary(offset: u32) -> CbpfInsn {
        CbpfInsn {
            code: LD_W_ABS,
            jt: 0,
            jf: 0,
            k: SKF_AD_OFF.wrapping_add(offset),
        }
    }

    /// `return A`.
    pub fn ret_a() -> CbpfInsn {
        CbpfInsn {
            code: RET_A,
            jt: 0,
            jf: 0,
            k: 0,
        }
    }

    /// `return k`.
    pub fn ret_k(k: u32) -> CbpfInsn {
        CbpfInsn {
            code: RET_K,
            jt: 0,
            jf: 0,
            k,
        }
    }

    /// `if A == k goto +jt else goto +jf`.
    pub fn jeq(k: u32, jt: u8, jf: u8) -> CbpfInsn {
        CbpfInsn {
            code: JEQ_K,
            jt,
            jf,
            k,
        }
    }
}

/// One extended BPF instruction (`struct bpf_insn`, 8 bytes little-endian).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EbpfInsn {
    /// Opcode.
    pub code: u8,
    /// `dst_reg` in the low nibble, `src_reg` in the high nibble.
    pub regs: u8,
    /// Signed offset.
    pub off: i16,
    /// Signed immediate.
    pub imm: i32,
}

/// An eBPF register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reg(pub u8);

/// Return value / helper result.
pub const R0: Reg = Reg(0);
/// First argument; the program context on entry.
pub const R1: Reg = Reg(1);
/// Second argument.
pub const R2: Reg = Reg(2);
/// Third argument.
pub const R3: Reg = Reg(3);
/// Fourth argument.
pub const R4: Reg = Reg(4);
/// Fifth argument.
pub const R5: Reg = Reg(5);
/// Callee-saved.
pub const R6: Reg = Reg(6);
/// Callee-saved.
pub const R7: Reg = Reg(7);
/// Callee-saved.
pub const R8: Reg = Reg(8);
/// Callee-saved.
pub const R9: Reg = Reg(9);
/// Read-only frame pointer.
pub const R10: Reg = Reg(10);

/// Memory access width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// 1 byte.
    B,
    /// 2 bytes.
    H,
    /// 4 bytes.
    W,
    /// 8 bytes.
    DW,
}

impl Size {
    fn bits(self) -> u8 {
        match self {
            Size::W => 0x00,
            Size::H => 0x08,
            Size::B => 0x10,
            Size::DW => 0x18,
        }
    }
}

/// Jump conditions used by the programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cond {
    /// `==`.
    Eq,
    /// `!=`.
    Ne,
    /// unsigned `>=`.
    Ge,
    /// unsigned `>`.
    Gt,
    /// unsigned `<`.
    Lt,
}

impl Cond {
    fn bits(self) -> u8 {
        match self {
            Cond::Eq => 0x10,
            Cond::Gt => 0x20,
            Cond::Ge => 0x30,
            Cond::Ne => 0x50,
            Cond::Lt => 0xa0,
        }
    }
}

const CLASS_LD: u8 = 0x00;
const CLASS_LDX: u8 = 0x01;
const CLASS_ST: u8 = 0x02;
const CLASS_STX: u8 = 0x03;
const CLASS_ALU: u8 = 0x04;
const CLASS_JMP: u8 = 0x05;
const CLASS_ALU64: u8 = 0x07;
const MODE_IMM: u8 = 0x00;
const MODE_MEM: u8 = 0x60;
const SRC_K: u8 = 0x00;
const SRC_X: u8 = 0x08;
const ALU_ADD: u8 = 0x00;
const ALU_MUL: u8 = 0x20;
const ALU_MOD: u8 = 0x90;
const ALU_AND: u8 = 0x50;
const ALU_LSH: u8 = 0x60;
const ALU_RSH: u8 = 0x70;
const ALU_XOR: u8 = 0xa0;
const ALU_MOV: u8 = 0xb0;
const ALU_END: u8 = 0xd0;
/// `BPF_TO_BE`: with `BPF_END`, convert between host and big-endian (network) order.
const END_TO_BE: u8 = 0x08;
const JMP_JA: u8 = 0x00;
const JMP_CALL: u8 = 0x80;
const JMP_EXIT: u8 = 0x90;
/// `src_reg` value marking a 64-bit immediate load as a map file descriptor.
pub const PSEUDO_MAP_FD: u8 = 1;

fn insn(code: u8, dst: Reg, src: Reg, off: i16, imm: i32) -> EbpfInsn {
    debug_assert!(dst.0 <= 10 && src.0 <= 10, "no such register");
    EbpfInsn {
        code,
        regs: (src.0 << 4) | dst.0,
        off,
        imm,
    }
}

/// `dst = src` (64-bit).
pub fn mov64_reg(dst: Reg, src: Reg) -> EbpfInsn {
    insn(CLASS_ALU64 | ALU_MOV | SRC_X, dst, src, 0, 0)
}

/// `dst = imm` (64-bit, sign-extended).
pub fn mov64_imm(dst: Reg, imm: i32) -> EbpfInsn {
    insn(CLASS_ALU64 | ALU_MOV | SRC_K, dst, Reg(0), 0, imm)
}

/// `dst += imm` (64-bit).
pub fn add64_imm(dst: Reg, imm: i32) -> EbpfInsn {
    insn(CLASS_ALU64 | ALU_ADD | SRC_K, dst, Reg(0), 0, imm)
}

/// `dst &= imm` (64-bit).
pub fn and64_imm(dst: Reg, imm: i32) -> EbpfInsn {
    insn(CLASS_ALU64 | ALU_AND | SRC_K, dst, Reg(0), 0, imm)
}

/// `dst += src` (64-bit).
pub fn add64_reg(dst: Reg, src: Reg) -> EbpfInsn {
    insn(CLASS_ALU64 | ALU_ADD | SRC_X, dst, src, 0, 0)
}

/// `dst ^= src` (64-bit).
pub fn xor64_reg(dst: Reg, src: Reg) -> EbpfInsn {
    insn(CLASS_ALU64 | ALU_XOR | SRC_X, dst, src, 0, 0)
}

/// `dst <<= imm` (64-bit).
pub fn lsh64_imm(dst: Reg, imm: i32) -> EbpfInsn {
    insn(CLASS_ALU64 | ALU_LSH | SRC_K, dst, Reg(0), 0, imm)
}

/// `w_dst = w_src` (32-bit; the upper half of `dst` is zeroed).
pub fn mov32_reg(dst: Reg, src: Reg) -> EbpfInsn {
    insn(CLASS_ALU | ALU_MOV | SRC_X, dst, src, 0, 0)
}

/// `w_dst *= imm` (32-bit, wrapping; the upper half of `dst` is zeroed).
pub fn mul32_imm(dst: Reg, imm: i32) -> EbpfInsn {
    insn(CLASS_ALU | ALU_MUL | SRC_K, dst, Reg(0), 0, imm)
}

/// `w_dst >>= imm` (32-bit logical shift).
pub fn rsh32_imm(dst: Reg, imm: i32) -> EbpfInsn {
    insn(CLASS_ALU | ALU_RSH | SRC_K, dst, Reg(0), 0, imm)
}

/// `w_dst %= w_src` (32-bit, unsigned; the verifier makes a zero divisor leave `dst` as is).
pub fn mod32_reg(dst: Reg, src: Reg) -> EbpfInsn {
    insn(CLASS_ALU | ALU_MOD | SRC_X, dst, src, 0, 0)
}

/// `w_dst ^= w_src` (32-bit).
pub fn xor32_reg(dst: Reg, src: Reg) -> EbpfInsn {
    insn(CLASS_ALU | ALU_XOR | SRC_X, dst, src, 0, 0)
}

/// `w_dst &= imm` (32-bit).
pub fn and32_imm(dst: Reg, imm: i32) -> EbpfInsn {
    insn(CLASS_ALU | ALU_AND | SRC_K, dst, Reg(0), 0, imm)
}

/// `dst = htobe16(dst)` (`bits` = 16, 32 or 64): network-order field to host value (the
/// conversion is its own inverse).
pub fn be(dst: Reg, bits: i32) -> EbpfInsn {
    debug_assert!(matches!(bits, 16 | 32 | 64), "endianness width");
    insn(CLASS_ALU | ALU_END | END_TO_BE, dst, Reg(0), 0, bits)
}

/// `dst = *(size *)(src + off)`.
pub fn ldx_mem(size: Size, dst: Reg, src: Reg, off: i16) -> EbpfInsn {
    insn(CLASS_LDX | MODE_MEM | size.bits(), dst, src, off, 0)
}

/// `*(size *)(dst + off) = src`.
pub fn stx_mem(size: Size, dst: Reg, src: Reg, off: i16) -> EbpfInsn {
    insn(CLASS_STX | MODE_MEM | size.bits(), dst, src, off, 0)
}

/// `*(size *)(dst + off) = imm`.
pub fn st_mem(size: Size, dst: Reg, off: i16, imm: i32) -> EbpfInsn {
    insn(CLASS_ST | MODE_MEM | size.bits(), dst, Reg(0), off, imm)
}

/// `dst = map[fd]`: the two-instruction 64-bit immediate load of a map file descriptor.
pub fn ld_map_fd(dst: Reg, map_fd: i32) -> [EbpfInsn; 2] {
    [
        insn(
            CLASS_LD | MODE_IMM | Size::DW.bits(),
            dst,
            Reg(PSEUDO_MAP_FD),
            0,
            map_fd,
        ),
        insn(0, Reg(0), Reg(0), 0, 0),
    ]
}

/// `if dst <cond> imm goto +off`.
pub fn jmp_imm(cond: Cond, dst: Reg, imm: i32, off: i16) -> EbpfInsn {
    insn(CLASS_JMP | cond.bits() | SRC_K, dst, Reg(0), off, imm)
}

/// `if dst <cond> src goto +off`.
pub fn jmp_reg(cond: Cond, dst: Reg, src: Reg, off: i16) -> EbpfInsn {
    insn(CLASS_JMP | cond.bits() | SRC_X, dst, src, off, 0)
}

/// `goto +off`.
pub fn ja(off: i16) -> EbpfInsn {
    insn(CLASS_JMP | JMP_JA, Reg(0), Reg(0), off, 0)
}

/// `call helper`.
pub fn call(helper: i32) -> EbpfInsn {
    insn(CLASS_JMP | JMP_CALL, Reg(0), Reg(0), 0, helper)
}

/// `exit`.
pub fn exit() -> EbpfInsn {
    insn(CLASS_JMP | JMP_EXIT, Reg(0), Reg(0), 0, 0)
}

impl EbpfInsn {
    /// The 8-byte wire form.
    pub fn to_bytes(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0] = self.code;
        b[1] = self.regs;
        b[2..4].copy_from_slice(&self.off.to_le_bytes());
        b[4..8].copy_from_slice(&self.imm.to_le_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(i: EbpfInsn) -> String {
        i.to_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Byte-for-byte against the verified program in kernel-primitives.md §1.5.
    #[test]
    fn encodes_like_the_reference_program() {
        assert_eq!(hex(mov64_reg(R6, R1)), "bf 16 00 00 00 00 00 00");
        assert_eq!(hex(ldx_mem(Size::W, R2, R6, 32)), "61 62 20 00 00 00 00 00");
        assert_eq!(hex(and64_imm(R2, 15)), "57 02 00 00 0f 00 00 00");
        assert_eq!(
            hex(stx_mem(Size::W, R10, R2, -4)),
            "63 2a fc ff 00 00 00 00"
        );
        assert_eq!(hex(ld_map_fd(R1, 7)[0]), "18 11 00 00 07 00 00 00");
        assert_eq!(hex(ld_map_fd(R2, 7)[0]), "18 12 00 00 07 00 00 00");
        assert_eq!(hex(add64_imm(R2, -4)), "07 02 00 00 fc ff ff ff");
        assert_eq!(hex(call(1)), "85 00 00 00 01 00 00 00");
        assert_eq!(hex(jmp_imm(Cond::Eq, R0, 0, 9)), "15 00 09 00 00 00 00 00");
        assert_eq!(
            hex(ldx_mem(Size::DW, R2, R6, 48)),
            "79 62 30 00 00 00 00 00"
        );
        assert_eq!(hex(st_mem(Size::W, R10, -4, 1)), "62 0a fc ff 01 00 00 00");
        assert_eq!(hex(mov64_imm(R0, 1)), "b7 00 00 00 01 00 00 00");
        assert_eq!(hex(call(82)), "85 00 00 00 52 00 00 00");
        assert_eq!(hex(exit()), "95 00 00 00 00 00 00 00");
    }

    /// The opcodes the XDP program adds, against the encodings of the kernel's
    /// Documentation/bpf/standardization/instruction-set.rst (as LLVM emits them).
    #[test]
    fn encodes_the_xdp_opcodes() {
        assert_eq!(hex(be(R5, 16)), "dc 05 00 00 10 00 00 00");
        assert_eq!(hex(xor64_reg(R7, R8)), "af 87 00 00 00 00 00 00");
        assert_eq!(hex(add64_reg(R4, R5)), "0f 54 00 00 00 00 00 00");
        assert_eq!(hex(lsh64_imm(R5, 2)), "67 05 00 00 02 00 00 00");
        assert_eq!(hex(mov32_reg(R5, R7)), "bc 75 00 00 00 00 00 00");
        assert_eq!(
            hex(mul32_imm(R7, 0x9e37_79b1_u32 as i32)),
            "24 07 00 00 b1 79 37 9e"
        );
        assert_eq!(hex(rsh32_imm(R5, 16)), "74 05 00 00 10 00 00 00");
        assert_eq!(hex(xor32_reg(R7, R5)), "ac 57 00 00 00 00 00 00");
        assert_eq!(hex(and32_imm(R7, 15)), "54 07 00 00 0f 00 00 00");
        assert_eq!(hex(jmp_reg(Cond::Gt, R4, R3, 5)), "2d 34 05 00 00 00 00 00");
        assert_eq!(hex(jmp_imm(Cond::Lt, R5, 20, 1)), "a5 05 01 00 14 00 00 00");
        assert_eq!(hex(ldx_mem(Size::H, R5, R2, 12)), "69 25 0c 00 00 00 00 00");
        assert_eq!(hex(ldx_mem(Size::B, R5, R2, 23)), "71 25 17 00 00 00 00 00");
        assert_eq!(hex(ja(3)), "05 00 03 00 00 00 00 00");
    }

    #[test]
    fn encodes_the_cbpf_cpu_program() {
        let ld = cbpf::ld_ancillary(cbpf::SKF_AD_CPU);
        assert_eq!((ld.code, ld.k), (0x20, 0xffff_f024));
        assert_eq!(cbpf::ret_a().code, 0x16);
    }
}
