//! A recording copy's records: before each instruction, the address,
//! native PC and kind of each access it makes, into the record buffer.

use super::emit::Emitter;
use super::operands::{gpr_number, spare_pair};
use super::{Class, Insn, Translator};
use crate::x86::record;
use iced_x86::{Code, Instruction, MemoryOperand, Mnemonic, Register};

impl Translator {
    /// A recording copy's records for instruction `x`, before it runs:
    /// each access's address (a `lea` of its operand, into a spare
    /// register), its native PC, its info word and, for `call` and `ret`,
    /// the return address and the return target. Registers and flags are
    /// as the program left them afterwards (`lea` and `mov` leave the flags).
    pub(super) fn emit_records(&mut self, e: &mut Emitter, x: &Insn) {
        if x.nrefs == 0 {
            return;
        }
        let (ra, rb) = spare_pair(&x.instr);
        let (na, nb) = (gpr_number(ra), gpr_number(rb));
        let s = e.slots;
        e.mov_slot_reg(s.save_rec_a, na);
        e.mov_slot_reg(s.save_rec_b, nb);
        let mn = x.instr.mnemonic();
        let call = matches!(x.class, Class::Call | Class::CallIndirect);
        let ret = x.class == Class::Ret && mn == Mnemonic::Ret;
        for k in 0..x.nrefs as usize {
            let m = x.refs[k];
            // The address, into ra.
            if m.base == Register::None && m.index == Register::None {
                e.mov_reg_imm64(na, m.disp);
            } else {
                let scale = if m.index == Register::None { 1 } else { m.scale };
                let displ_size = if m.disp == 0 { 0 } else { 1 };
                let op = MemoryOperand::new(m.base, m.index, scale, m.disp as i64, displ_size, false, Register::None);
                match Instruction::with2(Code::Lea_r64_m, ra, op) {
                    Ok(lea) if e.encode(&mut self.encoder, &lea) => {}
                    _ => {
                        e.full = true;
                        return;
                    }
                }
            }
            if m.segment != Register::None {
                let slot = if m.segment == Register::FS { s.fs_base } else { s.gs_base };
                e.mov_reg_slot(nb, slot);
                self.enc(e, Instruction::with2(Code::Lea_r64_m, ra, MemoryOperand::with_base_index(ra, rb)));
            }
            e.mov_reg_slot(nb, s.rec_ptr);
            self.enc(e, Instruction::with2(Code::Mov_rm64_r64, MemoryOperand::with_base(rb), ra));
            e.mov_reg_imm64(na, x.ip);
            self.enc(e, Instruction::with2(Code::Mov_rm64_r64, MemoryOperand::with_base_displ(rb, 8), ra));
            let mut info = record::info(&m.access);
            if k + 1 < x.nrefs as usize {
                info |= record::MORE;
            }
            let stack = m.base == Register::RSP;
            if call && stack && m.access.write {
                info |= record::CALL;
                e.mov_reg_imm64(na, x.ip + x.len as u64);
                self.enc(e, Instruction::with2(Code::Mov_rm64_r64, MemoryOperand::with_base_displ(rb, 24), ra));
            } else if ret && stack && m.access.read {
                info |= record::RET;
                self.enc(e, Instruction::with2(Code::Mov_r64_rm64, ra, MemoryOperand::with_base(Register::RSP)));
                self.enc(e, Instruction::with2(Code::Mov_rm64_r64, MemoryOperand::with_base_displ(rb, 24), ra));
            }
            e.mov_reg_imm64(na, info);
            self.enc(e, Instruction::with2(Code::Mov_rm64_r64, MemoryOperand::with_base_displ(rb, 16), ra));
            self.enc(e, Instruction::with2(Code::Lea_r64_m, rb, MemoryOperand::with_base_displ(rb, record::RECORD_BYTES as i64)));
            e.mov_slot_reg(s.rec_ptr, nb);
        }
        e.mov_reg_slot(nb, s.save_rec_b);
        e.mov_reg_slot(na, s.save_rec_a);
    }

    /// Encode an instruction made here (never expected to fail; a failure
    /// makes the block unusable, as a full cache does).
    fn enc(&mut self, e: &mut Emitter, ins: Result<Instruction, iced_x86::IcedError>) {
        match ins {
            Ok(i) if e.encode(&mut self.encoder, &i) => {}
            _ => e.full = true,
        }
    }
}
