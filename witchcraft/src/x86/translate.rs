//! Translating a program's basic blocks into a code cache.
//!
//! A burst window runs the program's own code from copies of its basic
//! blocks, with its own registers and stack, so that every instruction of
//! a window of thousands costs nanoseconds rather than a single step's
//! round trip. A copy behaves as the original, but it also counts the
//! accesses of the craft's kind it makes, and stops exactly before the one
//! the sampler picked. This module turns one block of native code into its
//! copy; `engine::cache` owns the memory the copies live in and runs them.
//!
//! What a block's copy does:
//!
//! - A **prologue** subtracts the block's instructions from the window's
//!   instruction count and its counted accesses (implicit ones included:
//!   `push`, `call`, `ret`, string instructions) from the countdown to the
//!   next pick. If the window is over, it leaves (an exit) at the block's
//!   start; if the pick lies inside the block, it undoes the subtraction and
//!   goes to the block's **slow variant**, which checks the countdown before
//!   each counting instruction and leaves exactly before the picked one.
//!   The arithmetic flags are saved around this (`lahf` and `seto`, rax
//!   spilled to a slot), unless the block writes them before reading them.
//! - Instructions are copied byte for byte, except: a RIP-relative operand
//!   is re-aimed at the same address (its displacement adjusted, or, out of
//!   reach, the operand rewritten through a spare register holding the
//!   absolute address); direct branches go to the target's copy or, until
//!   it exists, to an exit that asks for it (and is then patched: "block
//!   linking"); a `call` pushes the program's own return address, so the
//!   stack is exactly the native one; `ret` and indirect branches look
//!   their native target up in a table (the dispatch stub).
//! - A `rep` string instruction is a block of its own, counted by its
//!   element count (rcx) at run time.
//! - Whatever cannot run from a copy (system calls, `int`, `popf`, far
//!   transfers, transactions, anything the decoder does not know, a `rep`
//!   whose end depends on the data) ends the block with an exit to native
//!   code before it.
//!
//! An **exit** is an `int3` followed by a record of why: the engine's
//! SIGTRAP handler reads it at the address the trap reports, with every
//! register as the program left it (spills undone, flags back).
//!
//! The translation of a block is a pure function of its native bytes, its
//! native and cache addresses and its variant, so the engine can translate
//! it again, into scratch space, to map an address inside a copy back to
//! the native instruction and the registers the program would see there
//! ([`Point`]). Nothing here allocates: output goes into memory the cache
//! reserved, and the decoder's and encoder's buffers are reused.

use super::decode::{Access, Analyzer, Float, Regs};
use super::record;
use iced_x86::{
    Code, ConditionCode, Decoder, DecoderOptions, Encoder, FlowControl, Instruction, InstructionInfoFactory, InstructionInfoOptions,
    MemoryOperand, MemorySize, Mnemonic, OpAccess, OpKind, Register,
};

/// Most instructions in one block (a longer straight run is continued in
/// the next block).
pub const MAX_INSNS: usize = 32;
/// Most bytes one block's copy takes (its slow variant included in the
/// worst case): the cache keeps this much free before translating.
pub const MAX_BLOCK_BYTES: usize = 8192;
/// Most elements a `rep` string instruction runs at once in a window: a
/// longer one leaves for the engine, which runs it in parts of this many
/// ([`Exit::BigRep`]), so that the signals a window holds back are never
/// held for long.
pub const MAX_REP_ELEMENTS: u32 = 1 << 16;
/// Elements of a `rep` string instruction that count as one instruction of
/// a window (a window's length bounds its time; an element takes less than
/// an instruction).
pub const REP_PER_INSTRUCTION_SHIFT: u32 = 6;

/// The cache's data slots (absolute addresses, within ±2 GiB of every
/// copy, so copies address them RIP-relatively without a register).
#[derive(Clone, Copy, Debug, Default)]
pub struct Slots {
    /// Counted accesses until the pick: the pick is the countdown-th.
    pub countdown: u64,
    /// Instructions left in the window.
    pub instr_left: u64,
    pub save_rax: u64,
    pub save_rcx: u64,
    pub save_scratch: u64,
    pub save_flags: u64,
    /// The native target of an indirect branch, for the dispatch stub.
    pub target: u64,
    /// Where the dispatch stub jumps (a copy's address).
    pub jump: u64,
    /// The address of the dispatch table (a slot holding a pointer).
    pub table: u64,
    /// Recording copies ([`Counted::Records`]): the slot holding where the
    /// next access record goes, two spill slots, and the thread's FS and GS
    /// bases (for operands with a segment override).
    pub rec_ptr: u64,
    pub save_rec_a: u64,
    pub save_rec_b: u64,
    pub fs_base: u64,
    pub gs_base: u64,
}

/// Which accesses the copies count (the craft's kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counted {
    Stores,
    Loads,
    /// Recording copies (the exact mode): before every memory access,
    /// loads and stores, implicit ones included, a copy writes an access
    /// record ([`super::record`]) where the record slot points, and the
    /// countdown counts records, so that it stops exactly before the
    /// instruction whose records would not fit (an [`Exit::Pick`]). A `rep`
    /// string instruction with elements to run always leaves for the
    /// engine ([`Exit::BigRep`]), which records it whole.
    Records,
}

impl Counted {
    pub fn counts(self, a: &Access) -> bool {
        match self {
            Counted::Stores => a.write,
            Counted::Loads => a.read,
            Counted::Records => a.read || a.write,
        }
    }
}

/// Why a copy left for the engine's handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Go on at the copy of `native` (translate it first); `patch` is the
    /// address of the rel32 that jumped here, to be aimed at the copy.
    Link { native: u64, patch: u64 },
    /// Leave the window: the program goes on natively at `native`.
    Native { native: u64 },
    /// The window's instructions ran out at the block starting at `native`.
    End { native: u64 },
    /// The pick is inside the block at `native`: translate its slow
    /// variant and aim the rel32 at `patch` at it.
    Slow { native: u64, patch: u64 },
    /// The pick is an access of the instruction at `native` (the
    /// countdown-th counted access from here); registers are as before it.
    Pick { native: u64 },
    /// An indirect branch whose target (in the target slot) is not in the
    /// dispatch table.
    Lookup,
    /// A `rep` string instruction run for part of its elements.
    RepDone,
    /// A `rep` string instruction with more than [`MAX_REP_ELEMENTS`]
    /// elements at `native`, registers as before it.
    BigRep { native: u64 },
}

impl Exit {
    /// The record after an exit's `int3`: a kind byte, two addresses.
    fn encode(self) -> [u8; 17] {
        let (k, a, b) = match self {
            Exit::Link { native, patch } => (1, native, patch),
            Exit::Native { native } => (2, native, 0),
            Exit::End { native } => (3, native, 0),
            Exit::Slow { native, patch } => (4, native, patch),
            Exit::Pick { native } => (5, native, 0),
            Exit::Lookup => (6, 0, 0),
            Exit::RepDone => (7, 0, 0),
            Exit::BigRep { native } => (8, native, 0),
        };
        let mut r = [0u8; 17];
        r[0] = k;
        r[1..9].copy_from_slice(&a.to_le_bytes());
        r[9..17].copy_from_slice(&b.to_le_bytes());
        r
    }

    /// The exit whose record is `r` (the bytes after its `int3`).
    pub fn read(r: &[u8; 17]) -> Option<Exit> {
        let a = u64::from_le_bytes(r[1..9].try_into().ok()?);
        let b = u64::from_le_bytes(r[9..17].try_into().ok()?);
        Some(match r[0] {
            1 => Exit::Link { native: a, patch: b },
            2 => Exit::Native { native: a },
            3 => Exit::End { native: a },
            4 => Exit::Slow { native: a, patch: b },
            5 => Exit::Pick { native: a },
            6 => Exit::Lookup,
            7 => Exit::RepDone,
            8 => Exit::BigRep { native: a },
            _ => return None,
        })
    }
}

/// The block's variant: fast (counts per block) or slow (per instruction).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    Fast,
    Slow,
}

/// Where copies go and what they count: fixed for a thread's cache.
#[derive(Clone, Copy, Debug)]
pub struct Env {
    pub slots: Slots,
    pub counted: Counted,
    /// The dispatch stub's address.
    pub dispatch: u64,
}

/// One block to translate.
#[derive(Clone, Copy, Debug)]
pub struct Request {
    pub native: u64,
    pub variant: Variant,
    /// Where the copy will run.
    pub at: u64,
    /// Remember the points (a translation again, for mapping back).
    pub points: bool,
}

/// What translation needs from the cache.
pub trait Host {
    /// Copy up to `out.len()` bytes of native code at `pc`; how many.
    fn code(&mut self, pc: u64, out: &mut [u8]) -> usize;
    /// May code at `pc` run from the cache (a module's code, not the agent's)?
    fn translatable(&self, pc: u64) -> bool;
    /// Where the copy of `native` (fast variant) is, if it exists.
    fn resolve(&self, native: u64) -> Option<u64>;
}

/// Where an address inside a copy stands in the program: the native
/// instruction, and how to see the program's registers there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Point {
    /// The native instruction.
    pub pc: u64,
    pub len: u32,
    /// The registers are those *before* the instruction (else after it).
    pub before: bool,
    /// A general-purpose register (hardware number) whose program value
    /// is in a slot at this point, and the slot.
    pub spilled: Option<(u8, u64)>,
    /// The native PC the program would be at, after the instruction: its
    /// next instruction, a branch target, or (when `target_slot`) the value
    /// in the target slot.
    pub next: u64,
    pub target_slot: bool,
    /// A `rep` string instruction: a trap may land on its start (with
    /// elements left) as well as after it.
    pub rep: bool,
}

/// A translated block.
#[derive(Clone, Copy, Debug, Default)]
pub struct Block {
    /// Native instructions it covers.
    pub insns: u32,
    /// Bytes of its copy.
    pub len: u32,
    /// Counted accesses (not counting `rep` elements).
    pub counted: u32,
    /// A `rep` string block.
    pub rep: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// No room left in the cache (code or exits): flush and retry.
    Full,
    /// The first instruction cannot be read.
    Unreadable,
}

/// How one native instruction is copied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
enum Class {
    /// Byte for byte (RIP-relative operands re-aimed).
    #[default]
    Plain,
    Jcc,
    /// jrcxz, jecxz, loop, loope, loopne (rel8 only).
    JcxLoop,
    Jmp,
    Call,
    CallIndirect,
    JmpIndirect,
    Ret,
    /// An unconditional `rep` string instruction (its own block).
    Rep,
    /// Cannot run from the cache: the block ends before it.
    Native,
}

/// One memory access of an instruction, as its operand computes it (for
/// recording copies).
#[derive(Clone, Copy, Debug, Default)]
struct MemRef {
    base: Register,
    index: Register,
    scale: u32,
    /// The displacement, or with neither base nor index, the address.
    disp: u64,
    /// FS or GS (their bases are added), else None.
    segment: Register,
    /// The access (its address left 0).
    access: Access,
}

/// Most accesses one instruction records.
const MAX_REFS: usize = 4;

#[derive(Clone, Copy, Debug, Default)]
struct Insn {
    ip: u64,
    len: u32,
    instr: Instruction,
    class: Class,
    /// Counted accesses (per element for `rep`).
    counted: u32,
    /// Has memory accesses of the program's.
    accesses: bool,
    bytes: [u8; 16],
    /// Offset of a RIP-relative displacement within the bytes (0: none).
    disp_off: u8,
    /// Recording copies: the accesses it records.
    refs: [MemRef; MAX_REFS],
    nrefs: u8,
}

/// Arithmetic flags (OF SF ZF AF CF PF) in iced's RflagsBits.
const ARITH: u32 = 0x01 | 0x02 | 0x04 | 0x08 | 0x10 | 0x20;

/// Per-thread translator state, made outside signal handlers.
pub struct Translator {
    insns: [Insn; MAX_INSNS],
    analyzer: Analyzer,
    factory: InstructionInfoFactory,
    encoder: Encoder,
    /// Filled by a translation when asked: the points of the copy.
    points: [(u64, u64, Point); 4 * MAX_INSNS],
    npoints: usize,
}

impl Default for Translator {
    fn default() -> Self {
        Self::new()
    }
}

impl Translator {
    pub fn new() -> Translator {
        let mut encoder = Encoder::new(64);
        // Reserved now, so encoding in a handler reuses it.
        encoder.set_buffer(Vec::with_capacity(64));
        Translator {
            insns: [Insn::default(); MAX_INSNS],
            analyzer: Analyzer::new(),
            factory: {
                let mut f = InstructionInfoFactory::new();
                // Touched once so later calls reuse the vectors' capacity.
                let _ = f.info_options(&Instruction::default(), InstructionInfoOptions::NO_REGISTER_USAGE);
                f
            },
            encoder,
            points: [(0, 0, Point::default()); 4 * MAX_INSNS],
            npoints: 0,
        }
    }

    /// The point of the copy whose instruction covers `addr` (a copy's
    /// address), from the last translation made with points on: the
    /// emitted instruction that contains `addr`, or ends at it (a trap
    /// reports the address after the access).
    pub fn point_at(&self, addr: u64, after: bool) -> Option<Point> {
        let pts = &self.points[..self.npoints];
        if after {
            // The access that just completed ends at `addr`; a `rep` trap
            // may also land on its start (elements remain).
            pts.iter()
                .find(|(_, e, _)| *e == addr)
                .map(|x| x.2)
                .or_else(|| pts.iter().find(|(s, _, p)| *s == addr && p.rep).map(|&(_, _, p)| Point { next: p.pc, ..p }))
        } else {
            pts.iter().find(|(s, e, _)| *s <= addr && addr < *e).map(|x| x.2)
        }
    }

    /// Translate the block `req` asks for into `out`, which is at `req.at`
    /// in the address space (the copy runs there). With `req.points`,
    /// remember where each emitted instruction stands (see
    /// [`Translator::point_at`]): a translation again of a block already in
    /// the cache, into scratch space.
    pub fn translate(&mut self, host: &mut dyn Host, env: &Env, req: Request, out: &mut [u8]) -> Result<Block, Error> {
        self.npoints = 0;
        let n = self.decode_block(host, req.native, env.counted);
        if n == 0 {
            return Err(Error::Unreadable);
        }
        let mut e = Emitter { buf: out, base: req.at, pos: 0, full: false, slots: env.slots };
        let mut ctx = Ctx { host, points: req.points, dispatch: env.dispatch, record: env.counted == Counted::Records };
        let block = if self.insns[0].class == Class::Rep {
            self.emit_rep(&mut e, &mut ctx)
        } else {
            self.emit_block(&mut e, &mut ctx, n, req.variant)
        };
        if e.full {
            return Err(Error::Full);
        }
        block.map(|mut b| {
            b.len = e.pos as u32;
            b
        })
    }

    /// Decode the block's instructions; returns how many (0: none readable).
    fn decode_block(&mut self, host: &mut dyn Host, native: u64, counted: Counted) -> usize {
        let mut pc = native;
        let mut n = 0;
        while n < MAX_INSNS {
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
                match self.analyzer.decode(&bytes[..insn.len as usize], pc, &Regs::default(), false) {
                    Some(d) if d.steppable => {
                        insn.counted = d.accesses().iter().filter(|a| counted.counts(a)).count() as u32;
                        insn.accesses = d.n > 0;
                        if d.partial && (insn.counted > 0 || d.n == 0) {
                            insn.class = Class::Native;
                        }
                        if insn.instr.is_string_instruction() && d.n == 0 {
                            insn.class = Class::Native;
                        }
                        if counted == Counted::Records && insn.class != Class::Native {
                            match self.refs(&instr) {
                                Some((refs, n)) => {
                                    insn.refs = refs;
                                    insn.nrefs = n as u8;
                                    insn.counted = n as u32;
                                }
                                None => insn.class = Class::Native,
                            }
                        }
                    }
                    _ => insn.class = Class::Native,
                }
            }
            if insn.class == Class::Rep && n > 0 {
                // A rep string is a block of its own: end this one before it.
                break;
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

    /// A recording copy's records for instruction `x`, before it runs:
    /// each access's address (a `lea` of its operand, into a spare
    /// register), its native PC, its info word and, for `call` and `ret`,
    /// the return address and the return target. Registers and flags are
    /// as the program left them afterwards (`lea` and `mov` leave the flags).
    fn emit_records(&mut self, e: &mut Emitter, x: &Insn) {
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

    fn emit_block(&mut self, e: &mut Emitter, ctx: &mut Ctx, n: usize, variant: Variant) -> Result<Block, Error> {
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
                    e.exit(ctx, Exit::Slow { native: block_start, patch: e.base + patch as u64 })?;
                    let stub = e.here() - EXIT_STUB_LEN;
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
        if ctx.record {
            self.emit_records(e, &x);
        }
        match x.class {
            Class::Plain => {
                self.copy_plain(e, ctx, &x);
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
                self.point(
                    ctx,
                    start,
                    end,
                    Point { pc: x.ip, len: x.len, before: false, spilled: None, next: target, target_slot: false, rep: false },
                );
                self.link(e, ctx, target)?;
                e.literal(lit, next);
            }
            Class::CallIndirect | Class::JmpIndirect => {
                self.load_target(e, ctx, &x);
                if x.class == Class::CallIndirect {
                    let start = e.here();
                    let lit = e.push_literal_slot();
                    let end = e.here();
                    self.point(
                        ctx,
                        start,
                        end,
                        Point { pc: x.ip, len: x.len, before: false, spilled: None, next: 0, target_slot: true, rep: false },
                    );
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
                    self.point(
                        ctx,
                        start,
                        end,
                        Point { pc: x.ip, len: x.len, before: false, spilled: None, next: 0, target_slot: true, rep: false },
                    );
                } else {
                    // The load at rsp, then rsp past the return address and
                    // the arguments.
                    e.mov_slot_reg(e.slots.save_rax, 0);
                    let s = e.here();
                    e.bytes(&[0x48, 0x8B, 0x04, 0x24]); // mov rax, [rsp]
                    let t = e.here();
                    self.point(
                        ctx,
                        s,
                        t,
                        Point {
                            pc: x.ip,
                            len: x.len,
                            before: true,
                            spilled: Some((0, e.slots.save_rax)),
                            next: 0,
                            target_slot: true,
                            rep: false,
                        },
                    );
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
        let point = |spilled| Point { pc: x.ip, len: x.len, before: false, spilled, next, target_slot: false, rep: false };
        if x.disp_off == 0 {
            let start = e.here();
            e.bytes(&x.bytes[..len]);
            let end = e.here();
            self.point(ctx, start, end, point(None));
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
            self.point(ctx, start, end, point(None));
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
        self.point(ctx, s, t, point(Some((reg, e.slots.save_scratch))));
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
        self.point(
            ctx,
            s,
            t,
            Point { pc: x.ip, len: x.len, before: true, spilled: Some((0, e.slots.save_rax)), next: 0, target_slot: false, rep: false },
        );
        e.mov_slot_reg(e.slots.target, 0);
        e.mov_reg_slot(0, e.slots.save_rax);
    }

    /// A `rep` string instruction's block: counted by its element count.
    fn emit_rep(&mut self, e: &mut Emitter, ctx: &mut Ctx) -> Result<Block, Error> {
        let x = self.insns[0];
        let next = x.ip + x.len as u64;
        e.save_flags();
        // cmp rcx, MAX_REP_ELEMENTS; ja long: the engine runs it in parts.
        // A recording copy leaves for the engine whenever there are
        // elements to run: the engine records the string whole.
        let most = if ctx.record { 0 } else { MAX_REP_ELEMENTS as i32 };
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
        self.point(ctx, s, t, Point { pc: x.ip, len: x.len, before: false, spilled: None, next, target_slot: false, rep: true });
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
    pub fn translate_rep_part(&mut self, host: &mut dyn Host, slots: &Slots, native: u64, at: u64, out: &mut [u8]) -> Result<usize, Error> {
        let mut bytes = [0u8; 16];
        let got = host.code(native, &mut bytes[..15]);
        let mut dec = Decoder::with_ip(64, &bytes[..got], native, DecoderOptions::NONE);
        let instr = dec.decode();
        if instr.is_invalid() || classify(&instr) != Class::Rep {
            return Err(Error::Unreadable);
        }
        let mut e = Emitter { buf: out, base: at, pos: 0, full: false, slots: *slots };
        let mut ctx = Ctx { host, points: false, dispatch: 0, record: false };
        e.bytes(&bytes[..instr.len()]);
        e.exit(&mut ctx, Exit::RepDone)?;
        if e.full {
            return Err(Error::Full);
        }
        Ok(e.pos)
    }

    /// Remember where an emitted instruction stands in the program (only
    /// when asked for points).
    fn point(&mut self, ctx: &mut Ctx, start: u64, end: u64, p: Point) {
        if ctx.points && self.npoints < self.points.len() {
            self.points[self.npoints] = (start, end, p);
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
        e.exit(ctx, kind)?;
        let stub = e.here() - EXIT_STUB_LEN;
        match ctx.host.resolve(target).filter(|_| matches!(kind, Exit::Link { .. }) && !ctx.points) {
            Some(copy) => e.aim_abs(patch, copy),
            None => e.aim(patch, stub),
        }
        Ok(())
    }
}

struct Ctx<'a> {
    host: &'a mut dyn Host,
    points: bool,
    dispatch: u64,
    /// Recording copies ([`Counted::Records`]).
    record: bool,
}

/// The dispatch stub, at `at`: the native target of an indirect branch
/// is in the target slot; look it up in the dispatch table (a pointer to
/// it in the table slot; `entries` of 16 bytes, native address and copy,
/// a power of two) and jump to the copy, every register and flag as the
/// program left them; on a miss, leave by an [`Exit::Lookup`] exit.
pub fn emit_dispatch(slots: &Slots, entries: u32, at: u64, out: &mut [u8]) -> Result<usize, Error> {
    let mut e = Emitter { buf: out, base: at, pos: 0, full: false, slots: *slots };
    let s = *slots;
    e.mov_slot_reg(s.save_rax, 0);
    e.bytes(&[0x9F, 0x0F, 0x90, 0xC0]); // lahf; seto al
    e.mov_slot_reg(s.save_flags, 0);
    e.mov_slot_reg(s.save_rcx, 1);
    e.mov_reg_slot(0, s.target);
    e.bytes(&[0x48, 0x89, 0xC1]); // mov rcx, rax
    e.bytes(&[0x48, 0xC1, 0xE9, 0x0B]); // shr rcx, 11
    e.bytes(&[0x48, 0x31, 0xC1]); // xor rcx, rax
    e.bytes(&[0x81, 0xE1]); // and ecx, entries-1
    e.bytes(&(entries - 1).to_le_bytes());
    e.bytes(&[0x48, 0xC1, 0xE1, 0x04]); // shl rcx, 4
    e.modrm_slot(&[0x48, 0x03], 1, s.table); // add rcx, [table]
    e.bytes(&[0x48, 0x3B, 0x01]); // cmp rax, [rcx]
    let miss = e.jcc_rel32(0x5); // jne
    e.bytes(&[0x48, 0x8B, 0x41, 0x08]); // mov rax, [rcx+8]
    e.mov_slot_reg(s.jump, 0);
    e.mov_reg_slot(0, s.save_flags);
    e.bytes(&[0x04, 0x7F, 0x9E]); // add al, 0x7f; sahf
    e.mov_reg_slot(0, s.save_rax);
    e.mov_reg_slot(1, s.save_rcx);
    e.modrm_slot(&[0xFF], 4, s.jump); // jmp [jump]
    e.bind(miss);
    e.mov_reg_slot(0, s.save_flags);
    e.bytes(&[0x04, 0x7F, 0x9E]);
    e.mov_reg_slot(0, s.save_rax);
    e.mov_reg_slot(1, s.save_rcx);
    let rec = Exit::Lookup.encode();
    e.bytes(&[0xCC]);
    e.bytes(&rec);
    if e.full {
        return Err(Error::Full);
    }
    Ok(e.pos)
}

/// Where a native address lands in the dispatch table of `entries`.
pub fn dispatch_index(native: u64, entries: u32) -> usize {
    ((native ^ (native >> 11)) as u32 & (entries - 1)) as usize
}

/// How an instruction is copied.
fn classify(i: &Instruction) -> Class {
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

/// Hardware number of a 64-bit general-purpose register.
fn gpr_number(r: Register) -> u8 {
    (r.full_register() as u32 - Register::RAX as u32) as u8
}

/// Does the instruction surely set every arithmetic flag (so their earlier
/// values are dead)? Shifts and rotates by a count register leave the
/// flags alone when the count is 0, so they never kill.
fn kills_flags(i: &Instruction) -> bool {
    use Mnemonic::*;
    if matches!(i.mnemonic(), Shl | Shr | Sar | Sal | Rol | Ror | Rcl | Rcr | Shld | Shrd) {
        return false;
    }
    let w = i.rflags_written() | i.rflags_cleared() | i.rflags_set() | i.rflags_undefined();
    w & ARITH == ARITH
}

fn condition_code(c: ConditionCode) -> u8 {
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
fn spare_register(i: &Instruction) -> Register {
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
fn spare_pair(i: &Instruction) -> (Register, Register) {
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

/// Bytes of an exit stub: `int3` and a 17-byte record.
pub const EXIT_STUB_LEN: u64 = 18;

/// Writes a copy into its buffer, addressing as if at `base`.
struct Emitter<'a> {
    buf: &'a mut [u8],
    base: u64,
    pos: usize,
    full: bool,
    slots: Slots,
}

impl Emitter<'_> {
    fn here(&self) -> u64 {
        self.base + self.pos as u64
    }

    fn bytes(&mut self, b: &[u8]) {
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
    fn rel_to(&self, target: u64, tail: u64) -> i32 {
        target.wrapping_sub(self.here() + tail) as i64 as i32
    }

    /// `op modrm(mod=00, reg, rm=101) disp32` addressing `slot`.
    fn modrm_slot(&mut self, op: &[u8], reg: u8, slot: u64) {
        self.bytes(op);
        self.bytes(&[(reg & 7) << 3 | 0x05]);
        let d = self.rel_to(slot, 4);
        self.bytes(&d.to_le_bytes());
    }

    /// mov [rip+slot], r64
    fn mov_slot_reg(&mut self, slot: u64, reg: u8) {
        let rex = 0x48 | if reg >= 8 { 0x04 } else { 0 };
        self.modrm_slot(&[rex, 0x89], reg, slot);
    }

    /// mov r64, [rip+slot]
    fn mov_reg_slot(&mut self, reg: u8, slot: u64) {
        let rex = 0x48 | if reg >= 8 { 0x04 } else { 0 };
        self.modrm_slot(&[rex, 0x8B], reg, slot);
    }

    /// mov r64, imm64
    fn mov_reg_imm64(&mut self, reg: u8, v: u64) {
        let rex = 0x48 | if reg >= 8 { 0x01 } else { 0 };
        self.bytes(&[rex, 0xB8 + (reg & 7)]);
        self.bytes(&v.to_le_bytes());
    }

    /// sub qword [rip+slot], imm32
    fn sub_slot_imm(&mut self, slot: u64, v: i32) {
        self.bytes(&[0x48, 0x81, 0x2D]);
        let d = self.rel_to(slot, 8);
        self.bytes(&d.to_le_bytes());
        self.bytes(&v.to_le_bytes());
    }

    /// add qword [rip+slot], imm32
    fn add_slot_imm(&mut self, slot: u64, v: i32) {
        self.bytes(&[0x48, 0x81, 0x05]);
        let d = self.rel_to(slot, 8);
        self.bytes(&d.to_le_bytes());
        self.bytes(&v.to_le_bytes());
    }

    /// Save the arithmetic flags in ah/al (rax spilled): `lahf; seto al`.
    fn save_flags(&mut self) {
        self.mov_slot_reg(self.slots.save_rax, 0);
        self.bytes(&[0x9F, 0x0F, 0x90, 0xC0]);
    }

    /// Put them back (`add al, 0x7f` sets OF from al; `sahf` the rest) and rax.
    fn restore_flags(&mut self) {
        self.bytes(&[0x04, 0x7F, 0x9E]);
        self.mov_reg_slot(0, self.slots.save_rax);
    }

    /// Charge (or with `on` false, give back) a `rep` string instruction's
    /// share of the window's instructions: 1 + rcx >> REP_PER_INSTRUCTION_SHIFT,
    /// rcx kept. Charging sets the flags as `sub` does (rax holds the
    /// program's, saved).
    fn charge_rep(&mut self, on: bool) {
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
    fn jcc_fwd(&mut self, cc: u8) -> usize {
        self.jcc_rel32(cc)
    }

    fn jcc_rel32(&mut self, cc: u8) -> usize {
        self.bytes(&[0x0F, 0x80 | cc]);
        let at = self.pos;
        self.bytes(&[0; 4]);
        at
    }

    fn jmp_rel32(&mut self) -> usize {
        self.bytes(&[0xE9]);
        let at = self.pos;
        self.bytes(&[0; 4]);
        at
    }

    /// Aim the rel32 at offset `at` here.
    fn bind(&mut self, at: usize) {
        let here = self.here();
        self.aim(at, here);
    }

    fn aim(&mut self, at: usize, target: u64) {
        self.aim_abs(at, target)
    }

    fn aim_abs(&mut self, at: usize, target: u64) {
        if at + 4 > self.buf.len() || self.full {
            return;
        }
        let rel = target.wrapping_sub(self.base + at as u64 + 4) as i64 as i32;
        self.buf[at..at + 4].copy_from_slice(&rel.to_le_bytes());
    }

    /// jmp to an absolute address within ±2 GiB (a stub of the cache).
    fn jmp_abs(&mut self, target: u64) {
        let at = self.jmp_rel32();
        self.aim_abs(at, target);
    }

    /// lea rsp, [rsp+v]
    fn lea_rsp(&mut self, v: i32) {
        self.bytes(&[0x48, 0x8D, 0xA4, 0x24]);
        self.bytes(&v.to_le_bytes());
    }

    /// `push qword [rip+lit]`, the literal to be placed later; returns the
    /// displacement's offset.
    fn push_literal_slot(&mut self) -> usize {
        self.bytes(&[0xFF, 0x35]);
        let at = self.pos;
        self.bytes(&[0; 4]);
        at
    }

    /// Place the 8-byte literal `v` here and aim the displacement at `at`
    /// at it.
    fn literal(&mut self, at: usize, v: u64) {
        let here = self.here();
        self.aim_abs(at, here);
        self.bytes(&v.to_le_bytes());
    }

    /// An exit stub: `int3` and the exit's record after it, which the
    /// handler reads at the address the trap reports ([`Exit::read`]).
    fn exit(&mut self, _ctx: &mut Ctx, kind: Exit) -> Result<(), Error> {
        let rec = kind.encode();
        self.bytes(&[0xCC]);
        self.bytes(&rec);
        Ok(())
    }

    /// Encode `ins` here with iced's encoder (its buffer reused).
    fn encode(&mut self, enc: &mut Encoder, ins: &Instruction) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions};

    /// Native code at `base`, everything else at fixed fake addresses.
    struct Code {
        base: u64,
        bytes: Vec<u8>,
    }

    impl Host for Code {
        fn code(&mut self, pc: u64, out: &mut [u8]) -> usize {
            let Some(off) = pc.checked_sub(self.base).map(|o| o as usize).filter(|&o| o < self.bytes.len()) else { return 0 };
            let n = out.len().min(self.bytes.len() - off);
            out[..n].copy_from_slice(&self.bytes[off..off + n]);
            n
        }
        fn translatable(&self, pc: u64) -> bool {
            pc >= self.base && pc < self.base + 0x10000
        }
        fn resolve(&self, _: u64) -> Option<u64> {
            None
        }
    }

    const NATIVE: u64 = 0x5555_0000_1000;
    const CACHE: u64 = 0x7f00_0000_0000;

    fn slots() -> Slots {
        let d = CACHE - 0x1000;
        Slots {
            countdown: d,
            instr_left: d + 8,
            save_rax: d + 16,
            save_rcx: d + 24,
            save_scratch: d + 32,
            save_flags: d + 40,
            target: d + 48,
            jump: d + 56,
            table: d + 64,
            rec_ptr: d + 72,
            save_rec_a: d + 80,
            save_rec_b: d + 88,
            fs_base: d + 96,
            gs_base: d + 104,
        }
    }

    fn env(dispatch: u64) -> Env {
        Env { slots: slots(), counted: Counted::Stores, dispatch }
    }

    fn translate(code: &[u8], variant: Variant, points: bool) -> (Translator, Block, Vec<u8>) {
        let mut t = Translator::new();
        let mut host = Code { base: NATIVE, bytes: code.to_vec() };
        let mut out = vec![0u8; MAX_BLOCK_BYTES];
        let b = t.translate(&mut host, &env(CACHE - 0x800), Request { native: NATIVE, variant, at: CACHE, points }, &mut out).unwrap();
        out.truncate(b.len as usize);
        (t, b, out)
    }

    /// The instructions of a copy, as (address, instruction), up to the
    /// first `int3` (the records after exits are data).
    fn listing(out: &[u8]) -> Vec<(u64, Instruction)> {
        let mut d = Decoder::with_ip(64, out, CACHE, DecoderOptions::NONE);
        let mut v = Vec::new();
        while d.can_decode() {
            let i = d.decode();
            if i.mnemonic() == Mnemonic::Int3 || i.is_invalid() {
                break;
            }
            v.push((i.ip(), i));
        }
        v
    }

    /// The exits of a copy: every `int3` and its record.
    fn exits(out: &[u8]) -> Vec<(u64, Exit)> {
        let mut v = Vec::new();
        let mut i = 0;
        while i + 18 <= out.len() {
            if out[i] == 0xCC {
                if let Some(e) = Exit::read(out[i + 1..i + 18].try_into().unwrap()) {
                    v.push((CACHE + i as u64 + 1, e));
                    i += 18;
                    continue;
                }
            }
            i += 1;
        }
        v
    }

    #[test]
    fn exit_records_read_back() {
        for e in [
            Exit::Link { native: 1, patch: 2 },
            Exit::Native { native: 3 },
            Exit::End { native: 4 },
            Exit::Slow { native: 5, patch: 6 },
            Exit::Pick { native: 7 },
            Exit::Lookup,
            Exit::RepDone,
            Exit::BigRep { native: 8 },
        ] {
            assert_eq!(Exit::read(&e.encode()), Some(e));
        }
        assert_eq!(Exit::read(&[0; 17]), None);
    }

    #[test]
    fn a_store_loop_counts_its_stores_and_links_both_ways() {
        // mov [rdi], eax; add rdi, 4; dec ecx; jne -10 (back to the start)
        let code = [0x89, 0x07, 0x48, 0x83, 0xC7, 0x04, 0xFF, 0xC9, 0x75, 0xF6];
        let (_, b, out) = translate(&code, Variant::Fast, false);
        assert_eq!((b.insns, b.counted), (4, 1));
        let ex = exits(&out);
        assert!(ex.iter().any(|(_, e)| *e == Exit::End { native: NATIVE }));
        assert!(ex.iter().any(|(_, e)| matches!(e, Exit::Slow { native: NATIVE, .. })));
        assert!(ex.iter().any(|(_, e)| matches!(e, Exit::Link { native: NATIVE, .. })), "the back edge");
        assert!(ex.iter().any(|(_, e)| matches!(e, Exit::Link { native, .. } if *native == NATIVE + 10)), "the fall-through");
        // Every Link exit's patch points at a rel32 aimed at that exit.
        for (at, e) in ex {
            if let Exit::Link { patch, .. } | Exit::Slow { patch, .. } = e {
                let off = (patch - CACHE) as usize;
                let rel = i32::from_le_bytes(out[off..off + 4].try_into().unwrap()) as i64;
                assert_eq!((patch as i64 + 4 + rel) as u64, at - 1, "{e:?}");
            }
        }
        // `add` writes every arithmetic flag before anything reads one: the
        // prologue need not save them.
        let l = listing(&out);
        assert!(!l.iter().any(|(_, i)| i.mnemonic() == Mnemonic::Lahf), "{l:?}");
        // `dec` leaves CF alone: a block starting there must save them.
        let (_, _, out) = translate(&code[6..], Variant::Fast, false);
        assert_eq!(listing(&out)[1].1.mnemonic(), Mnemonic::Lahf);
    }

    #[test]
    fn flags_written_before_read_need_no_saving() {
        // cmp eax, 1; mov [rdi], eax; je +0
        let code = [0x83, 0xF8, 0x01, 0x89, 0x07, 0x74, 0x00];
        let (_, _, out) = translate(&code, Variant::Fast, false);
        let l = listing(&out);
        assert!(!l.iter().take(4).any(|(_, i)| i.mnemonic() == Mnemonic::Lahf), "{l:?}");
        assert_eq!(l[0].1.mnemonic(), Mnemonic::Sub);
    }

    #[test]
    fn a_rip_relative_operand_out_of_reach_goes_through_a_spare_register() {
        // mov dword [rip+0x100], 7 (10 bytes); ret
        let code = [0xC7, 0x05, 0x00, 0x01, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0xC3];
        let target = NATIVE + 10 + 0x100;
        let (_, _, out) = translate(&code, Variant::Fast, false);
        let l = listing(&out);
        let k = l.iter().position(|(_, i)| i.mnemonic() == Mnemonic::Mov && i.op1_kind() == OpKind::Immediate64).expect("mov r, imm64");
        let (_, load) = l[k];
        assert_eq!(load.immediate64(), target);
        let scratch = load.op0_register();
        let (_, store) = l[k + 1];
        assert_eq!((store.memory_base(), store.memory_displacement64(), store.immediate32()), (scratch, 0, 7));
        // Saved before, restored after.
        assert_eq!(l[k - 1].1.op1_register(), scratch);
        assert_eq!(l[k + 2].1.op0_register(), scratch);
    }

    #[test]
    fn a_rip_relative_operand_within_reach_keeps_its_form() {
        // lea rax, [rip-0x20]; jmp +0
        let code = [0x48, 0x8D, 0x05, 0xE0, 0xFF, 0xFF, 0xFF, 0xEB, 0x00];
        let mut t = Translator::new();
        let mut host = Code { base: NATIVE, bytes: code.to_vec() };
        let mut out = vec![0u8; MAX_BLOCK_BYTES];
        let near = NATIVE + 0x4000_0000;
        let b = t
            .translate(&mut host, &env(near), Request { native: NATIVE, variant: Variant::Fast, at: near, points: false }, &mut out)
            .unwrap();
        let mut d = Decoder::with_ip(64, &out[..b.len as usize], near, DecoderOptions::NONE);
        let lea = std::iter::from_fn(|| d.can_decode().then(|| d.decode())).find(|i| i.mnemonic() == Mnemonic::Lea).unwrap();
        assert_eq!(lea.ip_rel_memory_address(), NATIVE + 7 - 0x20);
    }

    #[test]
    fn a_call_pushes_the_native_return_address() {
        // call +0x100
        let code = [0xE8, 0x00, 0x01, 0x00, 0x00];
        let (_, b, out) = translate(&code, Variant::Fast, false);
        assert_eq!(b.counted, 1, "the push is a store");
        let l = listing(&out);
        let push = l.iter().find(|(_, i)| i.mnemonic() == Mnemonic::Push).unwrap().1;
        let lit = push.ip_rel_memory_address();
        let off = (lit - CACHE) as usize;
        assert_eq!(u64::from_le_bytes(out[off..off + 8].try_into().unwrap()), NATIVE + 5);
        assert!(exits(&out).iter().any(|(_, e)| matches!(e, Exit::Link { native, .. } if *native == NATIVE + 5 + 0x100)));
    }

    #[test]
    fn what_cannot_run_from_the_cache_ends_the_block_before_it() {
        // mov [rdi], eax; syscall
        let (_, b, out) = translate(&[0x89, 0x07, 0x0F, 0x05], Variant::Fast, false);
        assert_eq!(b.insns, 1);
        assert!(exits(&out).iter().any(|(_, e)| *e == Exit::Native { native: NATIVE + 2 }));
        // popf first: nothing copied.
        let (_, b, out) = translate(&[0x9D, 0xC3], Variant::Fast, false);
        assert_eq!(b.insns, 0);
        assert_eq!(exits(&out), vec![(CACHE + 1, Exit::Native { native: NATIVE })]);
    }

    #[test]
    fn a_rep_string_is_a_block_of_its_own_counted_by_rcx() {
        // mov [rdi], eax; rep stosb
        let (_, b, _) = translate(&[0x89, 0x07, 0xF3, 0xAA], Variant::Fast, false);
        assert_eq!(b.insns, 1, "ends before the rep");
        let mut t = Translator::new();
        let mut host = Code { base: NATIVE, bytes: vec![0xF3, 0xAA, 0xC3] };
        let mut out = vec![0u8; MAX_BLOCK_BYTES];
        let b = t
            .translate(&mut host, &env(CACHE), Request { native: NATIVE, variant: Variant::Fast, at: CACHE, points: false }, &mut out)
            .unwrap();
        assert!(b.rep);
        let l = listing(&out[..b.len as usize]);
        assert!(l.iter().any(|(_, i)| i.mnemonic() == Mnemonic::Sub && i.op1_register() == Register::RCX), "{l:?}");
        // repe cmpsb ends when the data says: native.
        let (_, b, _) = translate(&[0xF3, 0xA6], Variant::Fast, false);
        assert_eq!(b.insns, 0);
    }

    #[test]
    fn the_slow_variant_leaves_exactly_before_each_counting_instruction() {
        // mov [rdi], eax; mov eax, [rsi]; mov [rdi+8], eax; ret
        let code = [0x89, 0x07, 0x8B, 0x06, 0x89, 0x47, 0x08, 0xC3];
        let (_, b, out) = translate(&code, Variant::Slow, false);
        assert_eq!(b.counted, 2, "two stores (ret loads)");
        let picks: Vec<u64> =
            exits(&out).iter().filter_map(|(_, e)| if let Exit::Pick { native } = e { Some(*native) } else { None }).collect();
        assert_eq!(picks, vec![NATIVE, NATIVE + 4]);
    }

    /// A recording copy, run: every access it makes (explicit, implicit,
    /// segment-relative, RIP-relative) is recorded before it happens, with
    /// its address, PC and kind, and the program's registers come out as
    /// natively.
    #[test]
    fn a_recording_copy_records_every_access_and_keeps_the_registers() {
        const MAP: usize = 1 << 16;
        // SAFETY: a new private anonymous mapping, checked for failure.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                MAP,
                libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let base = base as u64;
        let (data, table, stub, copy, native, buf) = (base, base + 0x1000, base + 0x2000, base + 0x3000, base + 0x6000, base + 0x8000);
        let code: [u8; 26] = [
            0x89, 0x07, // mov [rdi], eax
            0x53, // push rbx
            0x5B, // pop rbx
            0x48, 0x8B, 0x44, 0xCE, 0x10, // mov rax, [rsi+rcx*8+16]
            0x64, 0x48, 0x8B, 0x14, 0x25, 0x10, 0x00, 0x00, 0x00, // mov rdx, fs:[0x10]
            0x4C, 0x8B, 0x05, 0x00, 0x01, 0x00, 0x00, // mov r8, [rip+0x100]
            0xC3, // ret
        ];
        // SAFETY: all of these lie inside the mapping made above.
        let mem = unsafe { std::slice::from_raw_parts_mut(base as *mut u8, MAP) };
        let off = |a: u64| (a - base) as usize;
        mem[off(native)..off(native) + code.len()].copy_from_slice(&code);
        let slots = Slots {
            countdown: data,
            instr_left: data + 8,
            save_rax: data + 16,
            save_rcx: data + 24,
            save_scratch: data + 32,
            save_flags: data + 40,
            target: data + 48,
            jump: data + 56,
            table: data + 64,
            rec_ptr: data + 72,
            save_rec_a: data + 80,
            save_rec_b: data + 88,
            fs_base: data + 96,
            gs_base: data + 104,
        };
        let put = |mem: &mut [u8], a: u64, v: u64| mem[off(a)..off(a) + 8].copy_from_slice(&v.to_le_bytes());
        let get = |mem: &[u8], a: u64| u64::from_le_bytes(mem[off(a)..off(a) + 8].try_into().unwrap());
        let fs_base: u64;
        // SAFETY: glibc's thread control block starts with its own address.
        unsafe { std::arch::asm!("mov {}, fs:[0]", out(reg) fs_base) };
        put(mem, slots.countdown, 1000);
        put(mem, slots.instr_left, 1000);
        put(mem, slots.table, table);
        put(mem, slots.rec_ptr, buf);
        put(mem, slots.fs_base, fs_base);
        // One dispatch entry: the `ret` goes back to the caller's address.
        let n = emit_dispatch(&slots, 1, stub, &mut mem[off(stub)..off(stub) + 512]).unwrap();
        assert!(n < 512);
        let mut t = Translator::new();
        let mut host = Code { base: native, bytes: code.to_vec() };
        let env = Env { slots, counted: Counted::Records, dispatch: stub };
        let req = Request { native, variant: Variant::Fast, at: copy, points: false };
        let b = t.translate(&mut host, &env, req, &mut mem[off(copy)..off(copy) + MAX_BLOCK_BYTES]).unwrap();
        assert_eq!((b.insns, b.counted), (7, 7), "seven accesses in seven instructions");
        let src = [10u64, 11, 12, 13, 14];
        let mut dst = [0u32; 2];
        let (rax, r10, r11): (u64, u64, u64);
        // SAFETY: the copy runs the code above: it writes dst[0], reads
        // src[3], the TCB and its own mapping, pushes and pops rbx, and
        // returns here through the dispatch stub (one entry, made the
        // return address); every register it changes is an output.
        unsafe {
            std::arch::asm!(
                "lea rax, [rip + 2f]",
                "mov [{tab}], rax",
                "mov [{tab} + 8], rax",
                "mov eax, 7",
                "call {copy}",
                "2:",
                tab = in(reg) table,
                copy = in(reg) copy,
                in("rdi") dst.as_mut_ptr(),
                in("rsi") src.as_ptr(),
                in("rcx") 1u64,
                out("rax") rax,
                inout("r10") 0x1010u64 => r10,
                inout("r11") 0x1111u64 => r11,
                clobber_abi("C"),
            );
        }
        assert_eq!((dst[0], rax, r10, r11), (7, 13, 0x1010, 0x1111), "the program's results and registers");
        let end = get(mem, slots.rec_ptr);
        let recs: Vec<record::Record> = record::Record::parse(&mem[off(buf)..off(end)]).collect();
        assert_eq!(recs.len(), 7, "{recs:x?}");
        let kinds: Vec<(u64, u32, bool, bool)> =
            recs.iter().map(|r| (r.pc - native, r.access().len, r.access().read, r.access().write)).collect();
        assert_eq!(
            kinds,
            vec![
                (0, 4, false, true),
                (2, 8, false, true),
                (3, 8, true, false),
                (4, 8, true, false),
                (9, 8, true, false),
                (18, 8, true, false),
                (25, 8, true, false)
            ]
        );
        assert_eq!(recs[0].addr, dst.as_ptr() as u64);
        assert_eq!(recs[1].addr, recs[2].addr, "push and pop: the same stack slot");
        assert_eq!(recs[3].addr, &src[3] as *const u64 as u64);
        assert_eq!(recs[4].addr, fs_base + 0x10);
        assert_eq!(recs[5].addr, native + 25 + 0x100);
        assert!(recs[6].is(record::RET) && !recs[6].is(record::MORE));
        assert_eq!(recs[6].extra, get(mem, table), "a ret's record carries its target");
        assert_eq!(recs[6].addr, recs[1].addr + 8, "the return address is above where rbx was pushed");
        // SAFETY: the mapping made above, no longer used.
        unsafe { libc::munmap(base as *mut libc::c_void, MAP) };
    }

    #[test]
    fn points_map_a_copy_back_to_the_native_instruction() {
        // mov [rdi], eax; mov dword [rip+0x100], 7; call [rax]
        let code = [0x89, 0x07, 0xC7, 0x05, 0x00, 0x01, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0xFF, 0x10];
        let (t, _, out) = translate(&code, Variant::Fast, true);
        let l = listing(&out);
        // The store to [rdi]: its copy ends where a trap would report.
        let st = l.iter().find(|(_, i)| i.mnemonic() == Mnemonic::Mov && i.memory_base() == Register::RDI).unwrap();
        let p = t.point_at(st.0 + st.1.len() as u64, true).unwrap();
        assert_eq!((p.pc, p.before, p.next, p.spilled), (NATIVE, false, NATIVE + 2, None));
        // The rewritten RIP-relative store: its spare register is in a slot.
        let rw = l
            .iter()
            .find(|(_, i)| i.mnemonic() == Mnemonic::Mov && i.op1_kind() == OpKind::Immediate32 && i.memory_displacement64() == 0)
            .unwrap();
        let p = t.point_at(rw.0 + rw.1.len() as u64, true).unwrap();
        assert_eq!(p.pc, NATIVE + 2);
        assert_eq!(p.spilled.map(|s| s.1), Some(slots().save_scratch));
        // The indirect call's load of its target: before the call, rax spilled.
        let ld = l
            .iter()
            .find(|(_, i)| i.mnemonic() == Mnemonic::Mov && i.memory_base() == Register::RAX && i.op0_register() == Register::RAX)
            .unwrap();
        let p = t.point_at(ld.0 + ld.1.len() as u64, true).unwrap();
        assert_eq!((p.pc, p.before, p.spilled), (NATIVE + 12, true, Some((0, slots().save_rax))));
        // A fault anywhere inside the copied store maps to it.
        assert_eq!(t.point_at(st.0, false).map(|p| p.pc), Some(NATIVE));
    }
}
