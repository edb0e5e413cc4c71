//! Reading one native block: its instructions decoded and classified by
//! how each is copied, with (for recording copies) the accesses each makes.

use super::{Class, Counted, Host, Insn, MemRef, Translator, MAX_INSNS, MAX_REFS};
use crate::x86::decode::{Access, Float, Regs};
use crate::x86::record::RecordKind;
use iced_x86::{
    Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoOptions, MemorySize, Mnemonic, OpAccess, OpKind, Register,
};

/// Bytes of a recording block's instructions, their records' code
/// included (at most; see [`super::recording::code_bytes`]): the rest of
/// [`super::MAX_BLOCK_BYTES`] is for the prologue, the slow variant's
/// checks and the exits.
const RECORDING_BUDGET: usize = 5000;
/// Bytes an instruction's copy may add to its own length (a RIP-relative
/// operand through a register, a branch's exits).
const COPY_SLACK: usize = 48;

impl Translator {
    /// Decode the block's instructions; returns how many (0: none readable).
    pub(super) fn decode_block(&mut self, host: &mut dyn Host, native: u64, counted: Counted) -> usize {
        self.decode_upto(host, native, counted, MAX_INSNS)
    }

    /// [`Translator::decode_block`], at most `most` instructions (a picked
    /// instruction's copy needs one).
    pub(super) fn decode_upto(&mut self, host: &mut dyn Host, native: u64, counted: Counted, most: usize) -> usize {
        let mut pc = native;
        let mut n = 0;
        let mut spent = 0;
        while n < most.min(MAX_INSNS) {
            if !host.translatable(pc) {
                if n == 0 {
                    return 0;
                }
                break;
            }
            let mut bytes = [0u8; 16];
            let got = host.code(pc, &mut bytes[..15]);
            if got == 0 {
                break;
            }
            let mut dec = Decoder::with_ip(64, &bytes[..got], pc, DecoderOptions::NONE);
            let mut instr = Instruction::default();
            dec.decode_out(&mut instr);
            if instr.is_invalid() {
                // Undecodable (or cut short by an unreadable page): native.
                self.insns[n] = Insn { ip: pc, class: Class::Native, ..Default::default() };
                n += 1;
                break;
            }
            let disp_off = if instr.is_ip_rel_memory_operand() { dec.get_constant_offsets(&instr).displacement_offset() as u8 } else { 0 };
            let mut insn = Insn { ip: pc, len: instr.len() as u32, instr, bytes, disp_off, ..Default::default() };
            insn.class = classify(&instr);
            if insn.class != Class::Native {
                // Count the accesses of the craft's kind (addresses do not
                // matter here), and refuse what the decoder cannot place.
                let d = self.analyzer.analyze(&instr, &Regs::default(), false);
                let state = saves_state(&instr);
                if d.steppable {
                    insn.counted = d.accesses().iter().filter(|a| counted.counts(a)).count() as u32;
                    insn.accesses = d.n > 0;
                    if d.partial && (insn.counted > 0 || d.n == 0) && !state {
                        insn.class = Class::Native;
                    }
                    if insn.instr.is_string_instruction() && d.n == 0 {
                        insn.class = Class::Native;
                    }
                    if let (Counted::Records(kind), false) = (counted, insn.class == Class::Native || state) {
                        match self.refs(&instr) {
                            Some((refs, n)) => {
                                insn.refs = refs;
                                insn.nrefs = n as u8;
                                insn.counted = super::recording::words(kind, &insn);
                            }
                            None => insn.class = Class::Native,
                        }
                    }
                } else {
                    insn.class = Class::Native;
                }
            }
            if insn.class == Class::Rep && n > 0 {
                // A rep string is a block of its own: end this one before it.
                break;
            }
            if let Counted::Records(kind @ (RecordKind::StoreValues | RecordKind::LoadValues)) = counted {
                // A value craft's recording code is long (wide stores the
                // longest): the block ends before it would outgrow a copy's
                // room, and goes on in the next. (The dead craft's, a few
                // dozen bytes an access, always fits.)
                let cost = super::recording::code_bytes(kind, &insn) + insn.len as usize + COPY_SLACK;
                if n > 0 && spent + cost > RECORDING_BUDGET {
                    break;
                }
                spent += cost;
            }
            self.insns[n] = insn;
            n += 1;
            if insn.class != Class::Plain {
                break;
            }
            pc += insn.len as u64;
        }
        n
    }

    /// The memory accesses of `instr` as a recording copy computes their
    /// addresses (implicit ones included: the decoder lists `push`, `call`,
    /// `ret` and string operands), or None if one cannot be computed with a
    /// `lea` (a vector index, an unknown size, an 8- or 16-bit register).
    fn refs(&mut self, instr: &Instruction) -> Option<([MemRef; MAX_REFS], usize)> {
        let mut refs = [MemRef::default(); MAX_REFS];
        let mut n = 0;
        let info = self.factory.info_options(instr, InstructionInfoOptions::NO_REGISTER_USAGE);
        for m in info.used_memory() {
            let (read, write) = match m.access() {
                OpAccess::Read | OpAccess::CondRead => (true, false),
                OpAccess::Write | OpAccess::CondWrite => (false, true),
                OpAccess::ReadWrite | OpAccess::ReadCondWrite => (true, true),
                _ => continue,
            };
            let size = match m.memory_size().size() {
                0 if instr.is_string_instruction() => instr.memory_size().size(),
                s => s,
            } as u32;
            let reg_ok = |r: Register| r == Register::None || r.is_gpr64() || r.is_gpr32();
            if n == MAX_REFS || size == 0 || m.vsib_size() != 0 || !reg_ok(m.base()) || !reg_ok(m.index()) {
                return None;
            }
            let segment = match m.segment() {
                Register::FS | Register::GS => m.segment(),
                _ => Register::None,
            };
            let el = m.memory_size().element_size() as u32;
            let float = match m.memory_size().element_type() {
                MemorySize::Float32 => Float::F32,
                MemorySize::Float64 => Float::F64,
                _ => Float::No,
            };
            let elem = if el > 0 && el < size { el as u8 } else { 0 };
            refs[n] = MemRef {
                base: m.base(),
                index: m.index(),
                scale: m.scale(),
                disp: m.displacement(),
                segment,
                access: Access { addr: 0, len: size, read, write, float, elem },
            };
            n += 1;
        }
        Some((refs, n))
    }
}

/// How an instruction is copied.
/// An `xsave` or `xrstor` of any kind: its area's size depends on the
/// processor's state components, so the decoder gives it none, and the
/// single-stepping exact mode judges no access of it. Copied as it is and
/// counted as no access, as that mode counts it, so that what runs around
/// it (the dynamic loader's lazy binding saves and restores the vector
/// state so) is recorded; leaving the cache there left a function's first
/// call through its binding, and the function, unrecorded.
fn saves_state(i: &Instruction) -> bool {
    use Mnemonic::*;
    matches!(
        i.mnemonic(),
        Xsave | Xsave64 | Xsavec | Xsavec64 | Xsaveopt | Xsaveopt64 | Xsaves | Xsaves64 | Xrstor | Xrstor64 | Xrstors | Xrstors64
    )
}

pub(super) fn classify(i: &Instruction) -> Class {
    use Mnemonic::*;
    if matches!(i.mnemonic(), Popf | Popfd | Popfq | Syscall | Sysenter | Sysexit | Sysret) {
        return Class::Native;
    }
    if i.is_string_instruction() && (i.has_rep_prefix() || i.has_repne_prefix()) {
        // Repeated by rcx: only those whose end does not depend on the
        // data, and with a 64-bit count.
        let conditional = matches!(i.mnemonic(), Cmpsb | Cmpsw | Cmpsd | Cmpsq | Scasb | Scasw | Scasd | Scasq);
        let addr32 = (0..i.op_count()).any(|k| {
            matches!(
                i.op_kind(k),
                OpKind::MemorySegSI
                    | OpKind::MemorySegESI
                    | OpKind::MemorySegDI
                    | OpKind::MemorySegEDI
                    | OpKind::MemoryESDI
                    | OpKind::MemoryESEDI
            )
        });
        if conditional || addr32 || i.has_repne_prefix() {
            return Class::Native;
        }
        return Class::Rep;
    }
    match i.flow_control() {
        FlowControl::Next => {
            if matches!(i.mnemonic(), Xbegin | Xend | Xabort | Hlt | Ud0 | Ud1 | Ud2 | Int | Int1 | Int3 | Into) {
                return Class::Native;
            }
            if i.op_count() > 0 && i.op0_kind() == OpKind::Register && i.op0_register() == Register::SS {
                return Class::Native;
            }
            Class::Plain
        }
        FlowControl::ConditionalBranch if i.is_jcc_short_or_near() => Class::Jcc,
        FlowControl::ConditionalBranch if i.is_jcx_short() || i.is_loop() || i.is_loopcc() => Class::JcxLoop,
        FlowControl::UnconditionalBranch if i.is_jmp_short_or_near() => Class::Jmp,
        FlowControl::Call if i.is_call_near() => Class::Call,
        FlowControl::IndirectCall if i.is_call_near_indirect() && indirect_ok(i) => Class::CallIndirect,
        FlowControl::IndirectBranch if i.is_jmp_near_indirect() && indirect_ok(i) => Class::JmpIndirect,
        FlowControl::Return if matches!(i.mnemonic(), Ret) => Class::Ret,
        _ => Class::Native,
    }
}

/// An indirect near branch we can load the target of: a 64-bit register
/// or a 64-bit memory operand.
fn indirect_ok(i: &Instruction) -> bool {
    match i.op0_kind() {
        OpKind::Register => gpr64(i.op0_register()),
        OpKind::Memory => {
            i.memory_size().size() == 8 && (i.memory_base() == Register::None || gpr64(i.memory_base()) || i.is_ip_rel_memory_operand())
        }
        _ => false,
    }
}

fn gpr64(r: Register) -> bool {
    r.is_gpr64()
}
