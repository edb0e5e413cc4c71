//! Rewriting a block into its copy: the prologue that counts the window
//! down, each instruction as it runs from the cache (branches linked,
//! RIP-relative operands re-aimed, calls and returns kept native), the slow
//! variant's checks, and `rep` strings.

use super::block::classify;
use super::emit::Emitter;
use super::operands::{condition_code, gpr_number, kills_flags, spare_register};
use super::{
    Block, Class, Counted, Ctx, DataAddrs, Error, Exit, Host, Insn, Point, Spilled, Translator, Variant, ARITH, MAX_INSNS, MAX_REP_ELEMENTS,
};
use crate::x86::record::RecordKind;
use iced_x86::{Decoder, DecoderOptions, OpKind, Register};

impl Translator {
    pub(super) fn emit_block(&mut self, e: &mut Emitter, ctx: &mut Ctx, n: usize, variant: Variant) -> Result<Block, Error> {
        // Flags live before each instruction: conservatively live after the
        // block; an instruction kills the flags it writes for sure.
        let mut live = [true; MAX_INSNS + 1];
        let mut l = true;
        for i in (0..n).rev() {
            let ins = &self.insns[i].instr;
            let read = ins.rflags_read() & ARITH != 0;
            let kills = kills_flags(ins);
            l = read || (l && !kills);
            live[i] = l;
        }
        // The last instruction may be one that cannot be copied: the block
        // covers the ones before it and then leaves to native code.
        let copied = if self.insns[n - 1].class == Class::Native { n - 1 } else { n };
        let insns = copied as u32;
        let counted: u32 = self.insns[..copied].iter().map(|x| x.counted).sum();
        let block_start = self.insns[0].ip;
        if copied == 0 {
            e.exit(ctx, Exit::Native { native: block_start })?;
            return Ok(Block { insns: 0, counted: 0, ..Default::default() });
        }
        match variant {
            Variant::Fast => {
                // Prologue: instructions, then the countdown.
                let saved = live[0];
                if saved {
                    e.save_flags();
                }
                e.sub_slot_imm(e.slots.instr_left, insns as i32);
                let end = e.jcc_fwd(0xE); // jle
                let slow = if counted > 0 {
                    e.sub_slot_imm(e.slots.countdown, counted as i32);
                    Some(e.jcc_fwd(0xE))
                } else {
                    None
                };
                if saved {
                    e.restore_flags();
                }
                self.emit_body(e, ctx, copied, n)?;
                // Out of line: the window is over.
                e.bind(end);
                e.add_slot_imm(e.slots.instr_left, insns as i32);
                if saved {
                    e.restore_flags();
                }
                e.exit(ctx, Exit::End { native: block_start })?;
                if let Some(slow) = slow {
                    // The pick is inside: undo, and go to the slow variant.
                    e.bind(slow);
                    e.add_slot_imm(e.slots.countdown, counted as i32);
                    e.add_slot_imm(e.slots.instr_left, insns as i32);
                    if saved {
                        e.restore_flags();
                    }
                    let patch = e.jmp_rel32();
                    let stub = e.exit(ctx, Exit::Slow { native: block_start, patch: e.base + patch as u64 })?;
                    e.aim(patch, stub);
                }
            }
            Variant::Slow => {
                // Checks before each counting instruction; the window's
                // instructions were checked by the fast variant.
                if live[0] {
                    e.save_flags();
                }
                e.sub_slot_imm(e.slots.instr_left, insns as i32);
                if live[0] {
                    e.restore_flags();
                }
                // Per counting instruction: where its check jumps, and
                // whether it saved the flags.
                let mut picks: [Option<(usize, bool)>; MAX_INSNS] = [None; MAX_INSNS];
                for (i, pick) in picks.iter_mut().enumerate().take(copied) {
                    let c = self.insns[i].counted;
                    if c > 0 {
                        let saved = live[i];
                        if saved {
                            e.save_flags();
                        }
                        e.sub_slot_imm(e.slots.countdown, c as i32);
                        let j = e.jcc_fwd(0xE);
                        if saved {
                            e.restore_flags();
                        }
                        *pick = Some((j, saved));
                    }
                    self.emit_insn(e, ctx, i, copied, n)?;
                }
                if copied < n {
                    e.exit(ctx, Exit::Native { native: self.insns[copied].ip })?;
                }
                for (i, pick) in picks.iter().enumerate().take(copied) {
                    let Some((j, saved)) = *pick else { continue };
                    e.bind(j);
                    e.add_slot_imm(e.slots.countdown, self.insns[i].counted as i32);
                    e.add_slot_imm(e.slots.instr_left, (copied - i) as i32);
                    if saved {
                        e.restore_flags();
                    }
                    e.exit(ctx, Exit::Pick { native: self.insns[i].ip })?;
                }
            }
        }
        Ok(Block { insns, counted, ..Default::default() })
    }

    /// The body of the fast variant: every instruction, then the exit to
    /// native code if the block stopped before one that cannot be copied.
    fn emit_body(&mut self, e: &mut Emitter, ctx: &mut Ctx, copied: usize, n: usize) -> Result<(), Error> {
        for i in 0..copied {
            self.emit_insn(e, ctx, i, copied, n)?;
        }
        if copied < n {
            e.exit(ctx, Exit::Native { native: self.insns[copied].ip })?;
        }
        Ok(())
    }

    /// Copy instruction `i` of `copied`; the last one of a block that ran
    /// out of room (or reached [`MAX_INSNS`]) falls through to the next.
    fn emit_insn(&mut self, e: &mut Emitter, ctx: &mut Ctx, i: usize, copied: usize, n: usize) -> Result<(), Error> {
        let x = self.insns[i];
        let next = x.ip + x.len as u64;
        let last = i + 1 == copied;
        self.recorded = 0;
        if let Some(kind) = ctx.record {
            self.emit_records(e, ctx, &x, kind);
            self.recorded = super::recording::bytes(kind, &x);
        }
        match x.class {
            Class::Plain => {
                self.copy_plain(e, ctx, &x);
                if ctx.record == Some(RecordKind::StoreValues) {
                    self.emit_after_values(e, ctx, &x);
                }
                if last && copied == n {
                    // The block ended on its length, not a transfer: go on.
                    self.link(e, ctx, next)?;
                }
            }
            Class::Jcc => {
                let cc = condition_code(x.instr.condition_code());
                let taken = e.jcc_rel32(cc);
                let fall = e.jmp_rel32();
                self.link_patch(e, ctx, taken, x.instr.near_branch_target())?;
                self.link_patch(e, ctx, fall, next)?;
            }
            Class::JcxLoop => {
                // The original with rel8 = 2 (over the short jump), then
                // `jmp short` over the taken branch's jump.
                let len = x.len as usize;
                let mut b = x.bytes;
                b[len - 1] = 2;
                e.bytes(&b[..len]);
                e.bytes(&[0xEB, 0x05]);
                let taken = e.jmp_rel32();
                let fall = e.jmp_rel32();
                self.link_patch(e, ctx, taken, x.instr.near_branch_target())?;
                self.link_patch(e, ctx, fall, next)?;
            }
            Class::Jmp => self.link(e, ctx, x.instr.near_branch_target())?,
            Class::Call => {
                let start = e.here();
                let lit = e.push_literal_slot();
                let end = e.here();
                let target = x.instr.near_branch_target();
                self.point(ctx, start, end, Point::after(&x, target));
                self.link(e, ctx, target)?;
                e.literal(lit, next);
            }
            Class::CallIndirect | Class::JmpIndirect => {
                self.load_target(e, ctx, &x);
                if x.class == Class::CallIndirect {
                    let start = e.here();
                    let lit = e.push_literal_slot();
                    let end = e.here();
                    self.point(ctx, start, end, Point::after_to_target(&x));
                    e.jmp_abs(ctx.dispatch);
                    e.literal(lit, next);
                } else {
                    e.jmp_abs(ctx.dispatch);
                }
            }
            Class::Ret => {
                let imm = if x.instr.op_count() > 0 && x.instr.op0_kind() == OpKind::Immediate16 { x.instr.immediate16() } else { 0 };
                let start = e.here();
                if imm == 0 {
                    // pop qword [rip+target]
                    e.modrm_slot(&[0x8F], 0, e.slots.target);
                    let end = e.here();
                    self.point(ctx, start, end, Point::after_to_target(&x));
                } else {
                    // The load at rsp, then rsp past the return address and
                    // the arguments.
                    e.mov_slot_reg(e.slots.save_rax, 0);
                    let s = e.here();
                    e.bytes(&[0x48, 0x8B, 0x04, 0x24]); // mov rax, [rsp]
                    let t = e.here();
                    self.point(ctx, s, t, Point::before_with(&x, 0, e.slots.save_rax, true));
                    e.mov_slot_reg(e.slots.target, 0);
                    e.mov_reg_slot(0, e.slots.save_rax);
                    e.lea_rsp(8 + imm as i32);
                }
                e.jmp_abs(ctx.dispatch);
            }
            Class::Rep | Class::Native => unreachable!("not in a block's body"),
        }
        Ok(())
    }

    /// Copy a plain instruction, re-aiming a RIP-relative operand.
    fn copy_plain(&mut self, e: &mut Emitter, ctx: &mut Ctx, x: &Insn) {
        let len = x.len as usize;
        let next = x.ip + x.len as u64;
        let point = |spilled| Point { spilled, ..Point::after(x, next) };
        if x.disp_off == 0 {
            let start = e.here();
            e.bytes(&x.bytes[..len]);
            let end = e.here();
            self.point(ctx, start, end, point(Spilled::NONE));
            return;
        }
        let target = x.instr.ip_rel_memory_address();
        let start = e.here();
        let disp = target.wrapping_sub(start + len as u64) as i64;
        if i32::try_from(disp).is_ok() {
            let mut b = x.bytes;
            let off = x.disp_off as usize;
            b[off..off + 4].copy_from_slice(&(disp as i32).to_le_bytes());
            e.bytes(&b[..len]);
            let end = e.here();
            self.point(ctx, start, end, point(Spilled::NONE));
            return;
        }
        // Out of reach: through a spare register.
        let scratch = spare_register(&x.instr);
        let mut ins = x.instr;
        ins.set_memory_base(scratch);
        ins.set_memory_index(Register::None);
        ins.set_memory_displacement64(0);
        ins.set_memory_displ_size(0);
        let reg = gpr_number(scratch);
        e.mov_slot_reg(e.slots.save_scratch, reg);
        e.mov_reg_imm64(reg, target);
        let s = e.here();
        if !e.encode(&mut self.encoder, &ins) {
            // Not encodable (never expected): leave to native code here.
            e.full = true;
            return;
        }
        let t = e.here();
        self.point(ctx, s, t, point(Spilled::one(reg, e.slots.save_scratch)));
        e.mov_reg_slot(reg, e.slots.save_scratch);
    }

    /// Put the native target of an indirect `call`/`jmp` into the target
    /// slot, leaving every register as it was.
    fn load_target(&mut self, e: &mut Emitter, ctx: &mut Ctx, x: &Insn) {
        let ins = &x.instr;
        if ins.op0_kind() == OpKind::Register {
            e.mov_slot_reg(e.slots.target, gpr_number(ins.op0_register()));
            return;
        }
        e.mov_slot_reg(e.slots.save_rax, 0);
        let s = e.here();
        if ins.is_ip_rel_memory_operand() {
            let a = ins.ip_rel_memory_address();
            let disp = a.wrapping_sub(s + 7) as i64;
            if i32::try_from(disp).is_ok() {
                // mov rax, [rip+disp]
                e.bytes(&[0x48, 0x8B, 0x05]);
                e.bytes(&(disp as i32).to_le_bytes());
            } else {
                e.mov_reg_imm64(0, a);
                e.bytes(&[0x48, 0x8B, 0x00]); // mov rax, [rax]
            }
        } else {
            // The same operand, as `mov rax, r/m64`: the FF /2 or /4
            // opcode becomes 8B /0 with REX.W.
            let len = x.len as usize;
            let b = &x.bytes[..len];
            let op = b.iter().position(|&c| c == 0xFF).unwrap_or(0);
            let (prefixes, rex) = if op > 0 && b[op - 1] & 0xF0 == 0x40 { (&b[..op - 1], b[op - 1]) } else { (&b[..op], 0x40) };
            // Keep the prefixes that change the address (segment,
            // address size); the others (notrack, bnd) mean nothing to a load.
            for &p in prefixes {
                if matches!(p, 0x64 | 0x65 | 0x67) {
                    e.bytes(&[p]);
                }
            }
            e.bytes(&[(rex | 0x48) & !0x04, 0x8B, b[op + 1] & 0xC7]);
            e.bytes(&b[op + 2..]);
        }
        let t = e.here();
        self.point(ctx, s, t, Point::before_with(x, 0, e.slots.save_rax, false));
        e.mov_slot_reg(e.slots.target, 0);
        e.mov_reg_slot(0, e.slots.save_rax);
    }

    /// A `rep` string instruction's block: counted by its element count.
    pub(super) fn emit_rep(&mut self, e: &mut Emitter, ctx: &mut Ctx) -> Result<Block, Error> {
        let x = self.insns[0];
        let next = x.ip + x.len as u64;
        e.save_flags();
        // cmp rcx, MAX_REP_ELEMENTS; ja long: the engine runs it in parts.
        // A recording copy leaves for the engine whenever there are
        // elements to run: the engine records the string whole.
        let most = if ctx.record.is_some() { 0 } else { MAX_REP_ELEMENTS as i32 };
        e.bytes(&[0x48, 0x81, 0xF9]);
        e.bytes(&most.to_le_bytes());
        let long = e.jcc_fwd(0x7);
        // The window's instructions: one, and one per REP_PER_INSTRUCTION elements.
        e.charge_rep(true);
        let end = e.jcc_fwd(0xE);
        let pick = if x.counted > 0 {
            for _ in 0..x.counted {
                e.bytes(&[0x48, 0x29, 0x0D]); // sub [rip+countdown], rcx
                let d = e.rel_to(e.slots.countdown, 4);
                e.bytes(&d.to_le_bytes());
            }
            Some(e.jcc_fwd(0xE))
        } else {
            None
        };
        e.restore_flags();
        let s = e.here();
        e.bytes(&x.bytes[..x.len as usize]);
        let t = e.here();
        self.point(ctx, s, t, Point { rep: true, ..Point::after(&x, next) });
        self.link(e, ctx, next)?;
        e.bind(end);
        e.charge_rep(false);
        e.restore_flags();
        e.exit(ctx, Exit::End { native: x.ip })?;
        e.bind(long);
        e.restore_flags();
        e.exit(ctx, Exit::BigRep { native: x.ip })?;
        if let Some(pick) = pick {
            e.bind(pick);
            for _ in 0..x.counted {
                e.bytes(&[0x48, 0x01, 0x0D]); // add [rip+countdown], rcx
                let d = e.rel_to(e.slots.countdown, 4);
                e.bytes(&d.to_le_bytes());
            }
            e.charge_rep(false);
            e.restore_flags();
            e.exit(ctx, Exit::Pick { native: x.ip })?;
        }
        Ok(Block { insns: 1, counted: 0, rep: true, len: 0 })
    }

    /// The `rep` instruction at `native`, copied alone and followed by
    /// the [`Exit::RepDone`] exit (for running part of its elements).
    pub fn translate_rep_part(
        &mut self,
        host: &mut dyn Host,
        slots: &DataAddrs,
        native: u64,
        at: u64,
        out: &mut [u8],
    ) -> Result<usize, Error> {
        let mut bytes = [0u8; 16];
        let got = host.code(native, &mut bytes[..15]);
        let mut dec = Decoder::with_ip(64, &bytes[..got], native, DecoderOptions::NONE);
        let instr = dec.decode();
        if instr.is_invalid() || classify(&instr) != Class::Rep {
            return Err(Error::Unreadable);
        }
        let mut e = Emitter { buf: out, base: at, pos: 0, full: false, slots: *slots };
        let mut ctx = Ctx { host, points: false, dispatch: 0, link: 0, record: None };
        e.bytes(&bytes[..instr.len()]);
        e.exit(&mut ctx, Exit::RepDone)?;
        if e.full {
            return Err(Error::Full);
        }
        Ok(e.pos)
    }

    /// A copy, at `at`, of the instruction at `native` alone, followed by
    /// the [`Exit::Stepped`] exit to the instruction after it: a window's
    /// pick runs there instead of being single-stepped natively
    /// (`engine::cache_exit`, "picks without a trap"). An instruction a
    /// copy runs as it is (re-aimed RIP-relative operands aside), a call
    /// (the program's return address pushed) or a return; a jump, a
    /// return that pops arguments, a `rep` string, or one the cache does
    /// not run, is refused (`Unreadable`).
    /// With `points`, the copy's points are remembered
    /// ([`Translator::point_at`]); it counts nothing.
    pub fn translate_step(
        &mut self,
        host: &mut dyn Host,
        env: &super::Env,
        native: u64,
        at: u64,
        points: bool,
        out: &mut [u8],
    ) -> Result<usize, Error> {
        self.npoints = 0;
        self.recorded = 0;
        if env.counted != Counted::Stores && env.counted != Counted::Loads {
            return Err(Error::Unreadable);
        }
        if self.decode_upto(host, native, env.counted, 1) == 0 {
            return Err(Error::Unreadable);
        }
        let x = self.insns[0];
        let next = x.ip + x.len as u64;
        let mut e = Emitter { buf: out, base: at, pos: 0, full: false, slots: env.slots };
        let mut ctx = Ctx { host, points, dispatch: env.dispatch, link: env.link, record: None };
        // As a block's copy has each (`emit_insn`), but ending at the
        // exit: to the next instruction, the call's target, or, for 0,
        // where the target slot says (a return's, an indirect call's).
        match x.class {
            Class::Plain => {
                self.copy_plain(&mut e, &mut ctx, &x);
                e.exit(&mut ctx, Exit::Stepped { native: next })?;
            }
            Class::Call | Class::CallIndirect => {
                let indirect = x.class == Class::CallIndirect;
                if indirect {
                    self.load_target(&mut e, &mut ctx, &x);
                }
                let start = e.here();
                let lit = e.push_literal_slot();
                let end = e.here();
                let target = if indirect { 0 } else { x.instr.near_branch_target() };
                let p = if indirect { Point::after_to_target(&x) } else { Point::after(&x, target) };
                self.point(&mut ctx, start, end, p);
                e.exit(&mut ctx, Exit::Stepped { native: target })?;
                e.literal(lit, next);
            }
            Class::Ret if x.instr.op_count() == 0 => {
                // pop qword [rip+target]
                let start = e.here();
                e.modrm_slot(&[0x8F], 0, e.slots.target);
                let end = e.here();
                self.point(&mut ctx, start, end, Point::after_to_target(&x));
                e.exit(&mut ctx, Exit::Stepped { native: 0 })?;
            }
            _ => return Err(Error::Unreadable),
        }
        if e.full {
            return Err(Error::Full);
        }
        Ok(e.pos)
    }

    /// Remember where an emitted instruction stands in the program (only
    /// when asked for points).
    pub(super) fn point(&mut self, ctx: &mut Ctx, start: u64, end: u64, p: Point) {
        if ctx.points && self.npoints < self.points.len() {
            self.points[self.npoints] = (start, end, Point { recorded: self.recorded, ..p });
            self.npoints += 1;
        }
    }

    /// Go on at `target`: a jump to its copy, or to an exit that links it.
    fn link(&mut self, e: &mut Emitter, ctx: &mut Ctx, target: u64) -> Result<(), Error> {
        let patch = e.jmp_rel32();
        self.link_patch(e, ctx, patch, target)
    }

    /// Aim the rel32 at `patch` at `target`'s copy if it exists, else at a
    /// new exit (emitted here) that asks for it. The exit is emitted in
    /// both cases, so a block's layout does not depend on what else the
    /// cache holds.
    fn link_patch(&mut self, e: &mut Emitter, ctx: &mut Ctx, patch: usize, target: u64) -> Result<(), Error> {
        let patch_addr = e.base + patch as u64;
        let kind =
            if ctx.host.translatable(target) { Exit::Link { native: target, patch: patch_addr } } else { Exit::Native { native: target } };
        let stub = e.exit(ctx, kind)?;
        match ctx.host.resolve(target).filter(|_| matches!(kind, Exit::Link { .. }) && !ctx.points) {
            Some(copy) => e.aim_abs(patch, copy),
            None => e.aim(patch, stub),
        }
        Ok(())
    }
}
