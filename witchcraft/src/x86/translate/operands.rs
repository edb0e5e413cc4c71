//! What rewriting needs to know of an instruction's registers and flags:
//! register numbers, spare registers, condition codes, the flags it surely
//! writes.

use super::ARITH;
use iced_x86::{ConditionCode, Instruction, Mnemonic, OpKind, Register};

/// Hardware number of a 64-bit general-purpose register.
pub(super) fn gpr_number(r: Register) -> u8 {
    (r.full_register() as u32 - Register::RAX as u32) as u8
}

/// Does the instruction surely set every arithmetic flag (so their earlier
/// values are dead)? Shifts and rotates by a count register leave the
/// flags alone when the count is 0, so they never kill.
pub(super) fn kills_flags(i: &Instruction) -> bool {
    use Mnemonic::*;
    if matches!(i.mnemonic(), Shl | Shr | Sar | Sal | Rol | Ror | Rcl | Rcr | Shld | Shrd) {
        return false;
    }
    let w = i.rflags_written() | i.rflags_cleared() | i.rflags_set() | i.rflags_undefined();
    w & ARITH == ARITH
}

pub(super) fn condition_code(c: ConditionCode) -> u8 {
    use ConditionCode::*;
    match c {
        o => 0x0,
        no => 0x1,
        b => 0x2,
        ae => 0x3,
        e => 0x4,
        ne => 0x5,
        be => 0x6,
        a => 0x7,
        s => 0x8,
        ns => 0x9,
        p => 0xA,
        np => 0xB,
        l => 0xC,
        ge => 0xD,
        le => 0xE,
        g => 0xF,
        None => 0x0,
    }
}

/// A register among r8-r15 that the instruction does not name (implicit
/// operands are always among rax-rdi, rsp and rbp).
pub(super) fn spare_register(i: &Instruction) -> Register {
    let mut used = 0u16;
    for k in 0..i.op_count() {
        if i.op_kind(k) == OpKind::Register {
            let r = i.op_register(k).full_register();
            if r.is_gpr64() {
                used |= 1 << gpr_number(r);
            }
        }
    }
    for r in [i.memory_base(), i.memory_index()] {
        if r.full_register().is_gpr64() {
            used |= 1 << gpr_number(r.full_register());
        }
    }
    [Register::R11, Register::R10, Register::R9, Register::R8, Register::R15, Register::R14, Register::R13, Register::R12]
        .into_iter()
        .find(|r| used & (1 << gpr_number(*r)) == 0)
        .unwrap_or(Register::R11)
}

/// Two registers among r8-r15 that the instruction does not name.
pub(super) fn spare_pair(i: &Instruction) -> (Register, Register) {
    let a = spare_register(i);
    let mut used = 1u16 << gpr_number(a);
    for k in 0..i.op_count() {
        if i.op_kind(k) == OpKind::Register && i.op_register(k).full_register().is_gpr64() {
            used |= 1 << gpr_number(i.op_register(k).full_register());
        }
    }
    for r in [i.memory_base(), i.memory_index()] {
        if r.full_register().is_gpr64() {
            used |= 1 << gpr_number(r.full_register());
        }
    }
    let b = [Register::R11, Register::R10, Register::R9, Register::R8, Register::R15, Register::R14, Register::R13, Register::R12]
        .into_iter()
        .find(|r| used & (1 << gpr_number(*r)) == 0)
        .unwrap_or(Register::R10);
    (a, b)
}

/// Three registers among r8-r15 that the instruction does not name.
pub(super) fn spare_triple(i: &Instruction) -> [Register; 3] {
    let mut used = 0u16;
    for k in 0..i.op_count() {
        if i.op_kind(k) == OpKind::Register && i.op_register(k).full_register().is_gpr64() {
            used |= 1 << gpr_number(i.op_register(k).full_register());
        }
    }
    for r in [i.memory_base(), i.memory_index()] {
        if r.full_register().is_gpr64() {
            used |= 1 << gpr_number(r.full_register());
        }
    }
    let mut out = [Register::R11, Register::R10, Register::R9];
    let mut n = 0;
    for r in [Register::R11, Register::R10, Register::R9, Register::R8, Register::R15, Register::R14, Register::R13, Register::R12] {
        if n < 3 && used & (1 << gpr_number(r)) == 0 {
            out[n] = r;
            n += 1;
        }
    }
    out
}
