//! A recording copy's records: before each instruction, the address,
//! native PC and kind of each access it makes, into the record buffer;
//! for the value crafts ([`RecordKind`]) only the accesses of their kind, with
//! the bytes before the instruction and (stores) after it.

use super::emit::Emitter;
use super::operands::{gpr_number, spare_pair, spare_triple};
use super::{Class, Ctx, Insn, Point, Spilled, Translator};
use crate::x86::record::{self, RecordKind};
use iced_x86::{Code, Instruction, MemoryOperand, Mnemonic, Register};

/// One record a copied instruction writes: the access it describes (an
/// index into the instruction's [`super::MemRef`]s; None: a call's or a
/// return's [`record::NONE`] record), its info word, its bytes in the
/// buffer and the bytes of each of its values.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Planned {
    mref: Option<u8>,
    info: u64,
    bytes: usize,
    value: usize,
    /// A short record's second word (None: a long record).
    short: Option<u64>,
}

impl Planned {
    /// Bytes of the record before its values.
    fn header(&self) -> usize {
        if self.short.is_some() {
            record::SHORT_BYTES
        } else {
            record::RECORD_BYTES
        }
    }
}

/// The records `kind` makes of instruction `x`, in order (see
/// [`record::of_instruction_for`], which the engine uses for what it runs
/// itself: the two agree).
pub(super) fn plan(kind: RecordKind, x: &Insn) -> ([Planned; record::MAX_RECORDS], usize) {
    let mut out = [Planned::default(); record::MAX_RECORDS];
    let mut n = 0;
    let call = matches!(x.class, Class::Call | Class::CallIndirect);
    let ret = x.class == Class::Ret && x.instr.mnemonic() == Mnemonic::Ret;
    let (mut called, mut returned) = (false, false);
    for k in 0..x.nrefs as usize {
        let m = x.refs[k];
        if !kind.records(&m.access) {
            continue;
        }
        let mut info = record::info(&m.access) | kind.value_flags();
        let stack = m.base == Register::RSP;
        if call && stack && m.access.write {
            info |= record::CALL;
            called = true;
        } else if ret && stack && m.access.read {
            info |= record::RET;
            returned = true;
        }
        let value = if kind == RecordKind::Addresses { 0 } else { record::value_len(m.access.len as usize) };
        let values = (kind.words(m.access.len) - record::RECORD_WORDS) * 8;
        out[n] = Planned { mref: Some(k as u8), info, bytes: values, value, short: None };
        n += 1;
    }
    if kind != RecordKind::Addresses && (call && !called || ret && !returned) {
        let info = record::NONE | if call { record::CALL } else { record::RET };
        out[n] = Planned { mref: None, info, bytes: 0, value: 0, short: None };
        n += 1;
    }
    for p in &mut out[..n.saturating_sub(1)] {
        p.info |= record::MORE;
    }
    for p in &mut out[..n] {
        p.short = record::short_word(x.ip, p.info);
        p.bytes += p.header();
    }
    (out, n)
}

/// The words of the records `kind` makes of `x` (what the copies count).
pub(super) fn words(kind: RecordKind, x: &Insn) -> u32 {
    bytes(kind, x) / 8
}

/// The bytes of the records `kind` makes of `x`.
pub(super) fn bytes(kind: RecordKind, x: &Insn) -> u32 {
    let (p, n) = plan(kind, x);
    p[..n].iter().map(|p| p.bytes).sum::<usize>() as u32
}

/// At most the bytes of the code that records `x` for a value craft's
/// `kind` (before it, and after it for silent stores), for the block's
/// budget. Generous per
/// instruction: a spill or reload of a slot is 7 bytes, `mov r64, imm64`
/// 10, an access through a register with a 32-bit displacement 8.
pub(super) fn code_bytes(kind: RecordKind, x: &Insn) -> usize {
    let (plan, n) = plan(kind, x);
    if n == 0 {
        return 0;
    }
    let per_value = |p: &Planned| pieces(p.value).count() * 16;
    let before: usize = plan[..n].iter().map(|p| 80 + per_value(p)).sum();
    let after: usize = if kind == RecordKind::StoreValues { plan[..n].iter().map(|p| 8 + per_value(p)).sum() } else { 0 };
    2 * 42 + 14 + before + if after > 0 { 2 * 42 + 7 + after } else { 0 }
}

/// The pieces a value of `n` bytes is copied in: (offset, size), whole
/// words first (no piece reads past the access: its next page may not be
/// mapped).
fn pieces(n: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut off = 0;
    std::iter::from_fn(move || {
        let size = [8, 4, 2, 1].into_iter().find(|&s| n - off >= s)?;
        off += size;
        Some((off - size, size))
    })
}

/// A register among r8-r15 as 32, 16 and 8 bits.
fn narrow(r: Register, size: usize) -> Register {
    use Register::*;
    let k = (gpr_number(r) as usize).saturating_sub(8) & 7;
    match size {
        4 => [R8D, R9D, R10D, R11D, R12D, R13D, R14D, R15D][k],
        2 => [R8W, R9W, R10W, R11W, R12W, R13W, R14W, R15W][k],
        1 => [R8L, R9L, R10L, R11L, R12L, R13L, R14L, R15L][k],
        _ => r,
    }
}

impl Translator {
    /// A recording copy's records for instruction `x`, before it runs.
    pub(super) fn emit_records(&mut self, e: &mut Emitter, ctx: &mut Ctx, x: &Insn, kind: RecordKind) {
        if kind == RecordKind::Addresses {
            self.emit_addresses(e, x);
        } else {
            self.emit_values(e, ctx, x, kind);
        }
    }

    /// The dead craft's records: each access's address (a `lea` of its
    /// operand, into a spare register), and its pc and info word, packed
    /// into one word where a short record says them (most accesses), else
    /// its native PC, its info word and, for `call` and `ret`, the return
    /// address and the return target. The record pointer moves once, past
    /// all of the instruction's records. Registers and flags are as the
    /// program left them afterwards (`lea` and `mov` leave the flags).
    fn emit_addresses(&mut self, e: &mut Emitter, x: &Insn) {
        let (plan, n) = plan(RecordKind::Addresses, x);
        if n == 0 {
            return;
        }
        let (ra, rb) = spare_pair(&x.instr);
        let (na, nb) = (gpr_number(ra), gpr_number(rb));
        let s = e.slots;
        e.mov_slot_reg(s.save_rec_a, na);
        e.mov_slot_reg(s.save_rec_b, nb);
        e.mov_reg_slot(nb, s.rec_ptr);
        let word = |d: i64| MemoryOperand::with_base_displ(rb, d);
        let mut off = 0i64;
        for p in &plan[..n] {
            let Some(k) = p.mref else { continue };
            // The address, into ra (rb is clobbered for a segment base:
            // the record pointer is read again).
            self.address(e, x, k as usize, ra, rb);
            if x.refs[k as usize].segment != Register::None {
                e.mov_reg_slot(nb, s.rec_ptr);
            }
            self.enc(e, Instruction::with2(Code::Mov_rm64_r64, word(off), ra));
            if let Some(w) = p.short {
                e.mov_reg_imm64(na, w);
                self.enc(e, Instruction::with2(Code::Mov_rm64_r64, word(off + 8), ra));
            } else {
                e.mov_reg_imm64(na, x.ip);
                self.enc(e, Instruction::with2(Code::Mov_rm64_r64, word(off + 8), ra));
                if p.info & record::CALL != 0 {
                    e.mov_reg_imm64(na, x.ip + x.len as u64);
                    self.enc(e, Instruction::with2(Code::Mov_rm64_r64, word(off + 24), ra));
                } else if p.info & record::RET != 0 {
                    self.enc(e, Instruction::with2(Code::Mov_r64_rm64, ra, MemoryOperand::with_base(Register::RSP)));
                    self.enc(e, Instruction::with2(Code::Mov_rm64_r64, word(off + 24), ra));
                }
                e.mov_reg_imm64(na, p.info);
                self.enc(e, Instruction::with2(Code::Mov_rm64_r64, word(off + 16), ra));
            }
            off += p.bytes as i64;
        }
        self.enc(e, Instruction::with2(Code::Lea_r64_m, rb, word(off)));
        e.mov_slot_reg(s.rec_ptr, nb);
        e.mov_reg_slot(nb, s.save_rec_b);
        e.mov_reg_slot(na, s.save_rec_a);
    }

    /// The address of access `k` of `x`, into `ra` (`tmp` is clobbered
    /// for a segment base).
    fn address(&mut self, e: &mut Emitter, x: &Insn, k: usize, ra: Register, tmp: Register) {
        let m = x.refs[k];
        if m.base == Register::None && m.index == Register::None {
            e.mov_reg_imm64(gpr_number(ra), m.disp);
        } else {
            let scale = if m.index == Register::None { 1 } else { m.scale };
            let displ_size = if m.disp == 0 { 0 } else { 1 };
            let op = MemoryOperand::new(m.base, m.index, scale, m.disp as i64, displ_size, false, Register::None);
            self.enc(e, Instruction::with2(Code::Lea_r64_m, ra, op));
        }
        if m.segment != Register::None {
            let slot = if m.segment == Register::FS { e.slots.fs_base } else { e.slots.gs_base };
            e.mov_reg_slot(gpr_number(tmp), slot);
            self.enc(e, Instruction::with2(Code::Lea_r64_m, ra, MemoryOperand::with_base_index(ra, tmp)));
        }
    }

    /// The value crafts' records (before the instruction runs): for each
    /// recorded access its address, PC and info word, then the bytes at
    /// its address now (what a load reads, what a store overwrites); a
    /// `call`'s record carries the return address it stores as its bytes
    /// after. Three spare registers, in their slots while this runs (a
    /// fault reading the bytes is the instruction's own, reported before
    /// it with the program's registers).
    fn emit_values(&mut self, e: &mut Emitter, ctx: &mut Ctx, x: &Insn, kind: RecordKind) {
        let (plan, n) = plan(kind, x);
        if n == 0 {
            return;
        }
        let [ra, rb, rc] = spare_triple(&x.instr);
        let s = e.slots;
        self.save_spares(e, [ra, rb, rc]);
        let start = e.here();
        e.mov_reg_slot(gpr_number(rb), s.rec_ptr);
        let mut off = 0i64;
        let word = |rb: Register, d: i64| MemoryOperand::with_base_displ(rb, d);
        for p in &plan[..n] {
            if let Some(k) = p.mref {
                self.address(e, x, k as usize, ra, rc);
                self.enc(e, Instruction::with2(Code::Mov_rm64_r64, word(rb, off), ra));
            }
            if let Some(w) = p.short {
                e.mov_reg_imm64(gpr_number(rc), w);
                self.enc(e, Instruction::with2(Code::Mov_rm64_r64, word(rb, off + 8), rc));
            } else {
                e.mov_reg_imm64(gpr_number(rc), x.ip);
                self.enc(e, Instruction::with2(Code::Mov_rm64_r64, word(rb, off + 8), rc));
                e.mov_reg_imm64(gpr_number(rc), p.info);
                self.enc(e, Instruction::with2(Code::Mov_rm64_r64, word(rb, off + 16), rc));
            }
            let values = off + p.header() as i64;
            let padded = p.value.div_ceil(8) as i64 * 8;
            if p.info & record::CALL != 0 {
                e.mov_reg_imm64(gpr_number(rc), x.ip + x.len as u64);
                self.enc(e, Instruction::with2(Code::Mov_rm64_r64, word(rb, off + 24), rc));
                if p.info & record::AFTER != 0 {
                    // The return address the call stores.
                    self.enc(e, Instruction::with2(Code::Mov_rm64_r64, word(rb, values + padded), rc));
                }
            } else if p.info & record::RET != 0 {
                self.enc(e, Instruction::with2(Code::Mov_r64_rm64, rc, MemoryOperand::with_base(Register::RSP)));
                self.enc(e, Instruction::with2(Code::Mov_rm64_r64, word(rb, off + 24), rc));
            }
            if p.info & record::BEFORE != 0 {
                self.copy_value(e, ra, 0, rb, values, p.value, rc);
            }
            off += p.bytes as i64;
        }
        self.enc(e, Instruction::with2(Code::Lea_r64_m, rb, word(rb, off)));
        e.mov_slot_reg(s.rec_ptr, gpr_number(rb));
        let end = e.here();
        let spilled = Spilled::three([ra, rb, rc].map(gpr_number), [s.save_rec_a, s.save_rec_b, s.save_rec_c]);
        self.point(ctx, start, end, Point { pc: x.ip, len: x.len, before: true, next: x.ip, spilled, ..Default::default() });
        self.restore_spares(e, [ra, rb, rc]);
    }

    /// Silent stores, after a copied instruction ran: the bytes each of
    /// its store records' addresses holds now, into the record (those
    /// `emit_values` wrote just before it, which end at the record slot).
    pub(super) fn emit_after_values(&mut self, e: &mut Emitter, ctx: &mut Ctx, x: &Insn) {
        let (plan, n) = plan(RecordKind::StoreValues, x);
        let total: usize = plan[..n].iter().map(|p| p.bytes).sum();
        if !plan[..n].iter().any(|p| p.info & record::AFTER != 0 && p.info & record::CALL == 0) {
            return;
        }
        let [ra, rb, rc] = spare_triple(&x.instr);
        let s = e.slots;
        self.save_spares(e, [ra, rb, rc]);
        let start = e.here();
        e.mov_reg_slot(gpr_number(rb), s.rec_ptr);
        let mut off = -(total as i64);
        for p in &plan[..n] {
            if p.info & record::AFTER != 0 && p.info & record::CALL == 0 {
                self.enc(e, Instruction::with2(Code::Mov_r64_rm64, ra, MemoryOperand::with_base_displ(rb, off)));
                let after = off + p.header() as i64 + p.value.div_ceil(8) as i64 * 8;
                self.copy_value(e, ra, 0, rb, after, p.value, rc);
            }
            off += p.bytes as i64;
        }
        let end = e.here();
        let spilled = Spilled::three([ra, rb, rc].map(gpr_number), [s.save_rec_a, s.save_rec_b, s.save_rec_c]);
        // The instruction ran: a fault here (its bytes unmapped meanwhile
        // by another thread) is before the next one, its records kept.
        let next = x.ip + x.len as u64;
        let recorded = std::mem::replace(&mut self.recorded, 0);
        self.point(ctx, start, end, Point { pc: next, before: true, next, spilled, ..Default::default() });
        self.recorded = recorded;
        self.restore_spares(e, [ra, rb, rc]);
    }

    fn save_spares(&mut self, e: &mut Emitter, r: [Register; 3]) {
        let s = e.slots;
        for (reg, slot) in r.into_iter().zip([s.save_rec_a, s.save_rec_b, s.save_rec_c]) {
            e.mov_slot_reg(slot, gpr_number(reg));
        }
    }

    fn restore_spares(&mut self, e: &mut Emitter, r: [Register; 3]) {
        let s = e.slots;
        for (reg, slot) in r.into_iter().zip([s.save_rec_a, s.save_rec_b, s.save_rec_c]) {
            e.mov_reg_slot(gpr_number(reg), slot);
        }
    }

    /// Copy `n` bytes from `[from + fd]` to `[to + td]` through `tmp`, in
    /// pieces that read no byte outside them.
    #[allow(clippy::too_many_arguments)]
    fn copy_value(&mut self, e: &mut Emitter, from: Register, fd: i64, to: Register, td: i64, n: usize, tmp: Register) {
        for (o, size) in pieces(n) {
            let src = MemoryOperand::with_base_displ(from, fd + o as i64);
            let dst = MemoryOperand::with_base_displ(to, td + o as i64);
            let (load, store) = match size {
                8 => (Instruction::with2(Code::Mov_r64_rm64, tmp, src), Instruction::with2(Code::Mov_rm64_r64, dst, tmp)),
                4 => (
                    Instruction::with2(Code::Mov_r32_rm32, narrow(tmp, 4), src),
                    Instruction::with2(Code::Mov_rm32_r32, dst, narrow(tmp, 4)),
                ),
                2 => (
                    Instruction::with2(Code::Movzx_r32_rm16, narrow(tmp, 4), src),
                    Instruction::with2(Code::Mov_rm16_r16, dst, narrow(tmp, 2)),
                ),
                _ => (
                    Instruction::with2(Code::Movzx_r32_rm8, narrow(tmp, 4), src),
                    Instruction::with2(Code::Mov_rm8_r8, dst, narrow(tmp, 1)),
                ),
            };
            self.enc(e, load);
            self.enc(e, store);
        }
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

#[cfg(test)]
mod tests {
    use super::pieces;

    #[test]
    fn a_value_is_copied_in_pieces_that_stay_inside_it() {
        assert_eq!(pieces(8).collect::<Vec<_>>(), vec![(0, 8)]);
        assert_eq!(pieces(10).collect::<Vec<_>>(), vec![(0, 8), (8, 2)]);
        assert_eq!(pieces(7).collect::<Vec<_>>(), vec![(0, 4), (4, 2), (6, 1)]);
        assert_eq!(pieces(64).count(), 8);
        assert_eq!(pieces(0).count(), 0);
    }
}
