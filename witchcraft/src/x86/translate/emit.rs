//! Code emission: machine code written into a copy's buffer, the cache's
//! slots addressed RIP-relatively, and exit stubs.

use super::{Ctx, DataAddrs, Error, Exit, REP_PER_INSTRUCTION_SHIFT};
use iced_x86::{Encoder, Instruction};

/// Bytes of an exit stub: `int3` and a 17-byte record.
pub const EXIT_STUB_LEN: u64 = 18;

/// The bytes a link exit has before its `int3` ([`Emitter::link_prefix`]).
pub const LINK_PREFIX_LEN: u64 = 25;

/// Writes a copy into its buffer, addressing as if at `base`.
pub(super) struct Emitter<'a> {
    pub(super) buf: &'a mut [u8],
    pub(super) base: u64,
    pub(super) pos: usize,
    pub(super) full: bool,
    pub(super) slots: DataAddrs,
}

impl Emitter<'_> {
    pub(super) fn here(&self) -> u64 {
        self.base + self.pos as u64
    }

    pub(super) fn bytes(&mut self, b: &[u8]) {
        if self.pos + b.len() > self.buf.len() {
            self.full = true;
            return;
        }
        self.buf[self.pos..self.pos + b.len()].copy_from_slice(b);
        self.pos += b.len();
    }

    /// A rel32 to `target` from the end of an instruction whose remaining
    /// bytes after this displacement are `tail` (the displacement itself
    /// included).
    pub(super) fn rel_to(&self, target: u64, tail: u64) -> i32 {
        target.wrapping_sub(self.here() + tail) as i64 as i32
    }

    /// `op modrm(mod=00, reg, rm=101) disp32` addressing `slot`.
    pub(super) fn modrm_slot(&mut self, op: &[u8], reg: u8, slot: u64) {
        self.bytes(op);
        self.bytes(&[(reg & 7) << 3 | 0x05]);
        let d = self.rel_to(slot, 4);
        self.bytes(&d.to_le_bytes());
    }

    /// mov [rip+slot], r64
    pub(super) fn mov_slot_reg(&mut self, slot: u64, reg: u8) {
        let rex = 0x48 | if reg >= 8 { 0x04 } else { 0 };
        self.modrm_slot(&[rex, 0x89], reg, slot);
    }

    /// mov r64, [rip+slot]
    pub(super) fn mov_reg_slot(&mut self, reg: u8, slot: u64) {
        let rex = 0x48 | if reg >= 8 { 0x04 } else { 0 };
        self.modrm_slot(&[rex, 0x8B], reg, slot);
    }

    /// mov r64, imm64
    pub(super) fn mov_reg_imm64(&mut self, reg: u8, v: u64) {
        let rex = 0x48 | if reg >= 8 { 0x01 } else { 0 };
        self.bytes(&[rex, 0xB8 + (reg & 7)]);
        self.bytes(&v.to_le_bytes());
    }

    /// sub qword [rip+slot], imm32
    pub(super) fn sub_slot_imm(&mut self, slot: u64, v: i32) {
        self.bytes(&[0x48, 0x81, 0x2D]);
        let d = self.rel_to(slot, 8);
        self.bytes(&d.to_le_bytes());
        self.bytes(&v.to_le_bytes());
    }

    /// add qword [rip+slot], imm32
    pub(super) fn add_slot_imm(&mut self, slot: u64, v: i32) {
        self.bytes(&[0x48, 0x81, 0x05]);
        let d = self.rel_to(slot, 8);
        self.bytes(&d.to_le_bytes());
        self.bytes(&v.to_le_bytes());
    }

    /// Save the arithmetic flags in ah/al (rax spilled): `lahf; seto al`.
    pub(super) fn save_flags(&mut self) {
        self.mov_slot_reg(self.slots.save_rax, 0);
        self.bytes(&[0x9F, 0x0F, 0x90, 0xC0]);
    }

    /// Put them back (`add al, 0x7f` sets OF from al; `sahf` the rest) and rax.
    pub(super) fn restore_flags(&mut self) {
        self.bytes(&[0x04, 0x7F, 0x9E]);
        self.mov_reg_slot(0, self.slots.save_rax);
    }

    /// Charge (or with `on` false, give back) a `rep` string instruction's
    /// share of the window's instructions: 1 + rcx >> REP_PER_INSTRUCTION_SHIFT,
    /// rcx kept. Charging sets the flags as `sub` does (rax holds the
    /// program's, saved).
    pub(super) fn charge_rep(&mut self, on: bool) {
        self.mov_slot_reg(self.slots.save_rcx, 1);
        self.bytes(&[0x48, 0xC1, 0xE9, REP_PER_INSTRUCTION_SHIFT as u8]); // shr rcx, n
        self.bytes(&[0x48, 0xFF, 0xC1]); // inc rcx
                                         // sub/add [rip+instr_left], rcx
        self.bytes(&[0x48, if on { 0x29 } else { 0x01 }, 0x0D]);
        let d = self.rel_to(self.slots.instr_left, 4);
        self.bytes(&d.to_le_bytes());
        self.mov_reg_slot(1, self.slots.save_rcx);
    }

    /// jcc rel32 with an unbound target; returns the rel32's offset.
    pub(super) fn jcc_fwd(&mut self, cc: u8) -> usize {
        self.jcc_rel32(cc)
    }

    pub(super) fn jcc_rel32(&mut self, cc: u8) -> usize {
        self.bytes(&[0x0F, 0x80 | cc]);
        let at = self.pos;
        self.bytes(&[0; 4]);
        at
    }

    pub(super) fn jmp_rel32(&mut self) -> usize {
        self.bytes(&[0xE9]);
        let at = self.pos;
        self.bytes(&[0; 4]);
        at
    }

    /// Aim the rel32 at offset `at` here.
    pub(super) fn bind(&mut self, at: usize) {
        let here = self.here();
        self.aim(at, here);
    }

    pub(super) fn aim(&mut self, at: usize, target: u64) {
        self.aim_abs(at, target)
    }

    pub(super) fn aim_abs(&mut self, at: usize, target: u64) {
        if at + 4 > self.buf.len() || self.full {
            return;
        }
        let rel = target.wrapping_sub(self.base + at as u64 + 4) as i64 as i32;
        self.buf[at..at + 4].copy_from_slice(&rel.to_le_bytes());
    }

    /// jmp to an absolute address within ±2 GiB (a stub of the cache).
    pub(super) fn jmp_abs(&mut self, target: u64) {
        let at = self.jmp_rel32();
        self.aim_abs(at, target);
    }

    /// lea rsp, [rsp+v]
    pub(super) fn lea_rsp(&mut self, v: i32) {
        self.bytes(&[0x48, 0x8D, 0xA4, 0x24]);
        self.bytes(&v.to_le_bytes());
    }

    /// `push qword [rip+lit]`, the literal to be placed later; returns the
    /// displacement's offset.
    pub(super) fn push_literal_slot(&mut self) -> usize {
        self.bytes(&[0xFF, 0x35]);
        let at = self.pos;
        self.bytes(&[0; 4]);
        at
    }

    /// Place the 8-byte literal `v` here and aim the displacement at `at`
    /// at it.
    pub(super) fn literal(&mut self, at: usize, v: u64) {
        let here = self.here();
        self.aim_abs(at, here);
        self.bytes(&v.to_le_bytes());
    }

    /// An exit stub: `int3` and the exit's record after it, which the
    /// handler reads at the address the trap reports ([`Exit::read`]).
    ///
    /// An exit that asks for a copy ([`Exit::Link`], [`Exit::Slow`]), or
    /// a window's pick ([`Exit::Pick`], [`Exit::Stepped`]), first tries the
    /// link stub (see [`super::emit_link`]), when the cache has one: the
    /// `int3`'s address goes to the jump slot, where the stub returns to
    /// when the engine cannot make the copy or take the pick without a trap.
    /// Returns the stub's start, where branches to the exit go.
    pub(super) fn exit(&mut self, ctx: &mut Ctx, kind: Exit) -> Result<u64, Error> {
        let start = self.here();
        // A pick, and the end of a picked instruction's copy, go to the
        // engine's entry too (picks without a trap, `engine::cache_exit`);
        // a recording copy's "pick" is a full buffer, left to the trap.
        let pick = matches!(kind, Exit::Pick { .. } | Exit::Stepped { .. }) && ctx.record.is_none();
        if ctx.link != 0 && (matches!(kind, Exit::Link { .. } | Exit::Slow { .. }) || pick) {
            self.link_prefix(ctx.link);
        }
        let rec = kind.encode();
        self.bytes(&[0xCC]);
        self.bytes(&rec);
        Ok(start)
    }

    /// Before an exit's `int3`: its address into the jump slot (two
    /// 32-bit stores), then a jump to the link stub at `link`. No flag or
    /// register changes.
    pub(super) fn link_prefix(&mut self, link: u64) {
        let int3 = self.here() + LINK_PREFIX_LEN;
        for (half, v) in [(0u64, int3 as u32), (4, (int3 >> 32) as u32)] {
            // mov dword [rip+jump+half], imm32
            self.bytes(&[0xC7, 0x05]);
            let d = self.rel_to(self.slots.jump + half, 8);
            self.bytes(&d.to_le_bytes());
            self.bytes(&v.to_le_bytes());
        }
        self.jmp_abs(link);
    }

    /// Encode `ins` here with iced's encoder (its buffer reused).
    pub(super) fn encode(&mut self, enc: &mut Encoder, ins: &Instruction) -> bool {
        let here = self.here();
        match enc.encode(ins, here) {
            Ok(_) => {
                let mut buf = enc.take_buffer();
                self.bytes(&buf);
                buf.clear();
                enc.set_buffer(buf);
                true
            }
            Err(_) => {
                let mut buf = enc.take_buffer();
                buf.clear();
                enc.set_buffer(buf);
                false
            }
        }
    }
}
