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

mod block;
mod data;
mod dispatch;
mod emit;
mod native_call;
mod operands;
mod recording;
mod rewrite;
#[cfg(test)]
mod tests;

pub use data::{Data, DataAddrs};
pub use dispatch::{dispatch_index, emit_dispatch, emit_link};
pub use emit::{EXIT_STUB_LEN, LINK_PREFIX_LEN};
pub use native_call::{away_return_slot, emit_native_call, return_loads, witch_native_call_return, NativeCall, NativeCalls, RetArg};

use super::decode::{Access, Analyzer};
use super::record::RecordKind;
use emit::Emitter;
use iced_x86::{Encoder, Instruction, InstructionInfoFactory, InstructionInfoOptions, Register};

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

/// Which accesses the copies count (the craft's kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counted {
    Stores,
    Loads,
    /// Recording copies (the exact mode): before every memory access the
    /// kind records (the dead craft: loads and stores; a value craft:
    /// those of its kind, with their bytes), implicit ones included, a
    /// copy writes an access record ([`super::record`]) where the record
    /// slot points, and the countdown counts the records' words, so that
    /// it stops exactly before the instruction whose records would not
    /// fit (an [`Exit::Pick`]). A `rep` string instruction with elements
    /// to run always leaves for the engine ([`Exit::BigRep`]), which
    /// records it whole.
    Records(RecordKind),
}

impl Counted {
    pub fn counts(self, a: &Access) -> bool {
        match self {
            Counted::Stores => a.write,
            Counted::Loads => a.read,
            Counted::Records(k) => k.records(a),
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
    /// A picked instruction ran alone from the cache ([`Translator::translate_step`]):
    /// the program goes on at `native` (0: where the target slot says, after
    /// a return or an indirect call), registers as after it.
    Stepped { native: u64 },
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
            Exit::Stepped { native } => (9, native, 0),
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
            9 => Exit::Stepped { native: a },
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
    pub slots: DataAddrs,
    pub counted: Counted,
    /// The dispatch stub's address.
    pub dispatch: u64,
    /// The link stub's address ([`emit_link`]); 0: exits that ask for a
    /// copy always trap.
    pub link: u64,
}

/// One block to translate.
#[derive(Clone, Copy, Debug)]
pub struct TranslateRequest {
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
    /// General-purpose registers whose program values are in slots at
    /// this point.
    pub spilled: Spilled,
    /// The native PC the program would be at, after the instruction: its
    /// next instruction, a branch target, or (when `target_slot`) the value
    /// in the target slot.
    pub next: u64,
    pub target_slot: bool,
    /// A `rep` string instruction: a trap may land on its start (with
    /// elements left) as well as after it.
    pub rep: bool,
    /// Recording copies: bytes of access records the copy wrote for the
    /// instruction before this point. A fault here is the instruction's
    /// own: it did not run, and its records are taken back.
    pub recorded: u32,
    /// A load of the program's return address in a native call
    /// ([`native_call::return_loads`]), made by code that is not the
    /// program's: its next access to that word is the entry's `ret`.
    /// `before`: the return address is at the stack pointer (the function
    /// has not run); else just below it, and the program is where the
    /// target slot says.
    pub native_return: bool,
}

impl Point {
    /// After `x` ran (the registers are those after it), the program at
    /// `next`.
    fn after(x: &Insn, next: u64) -> Point {
        Point { pc: x.ip, len: x.len, next, ..Default::default() }
    }

    /// After `x` ran, the program where the target slot says (an indirect
    /// call's pushed return address, a `ret`'s popped one).
    fn after_to_target(x: &Insn) -> Point {
        Point { pc: x.ip, len: x.len, target_slot: true, ..Default::default() }
    }

    /// Before `x` ran, with the program's value of the register `reg` in
    /// `slot` (the copy loads through it): a fault here is `x`'s own.
    fn before_with(x: &Insn, reg: u8, slot: u64, target_slot: bool) -> Point {
        Point { pc: x.ip, len: x.len, before: true, spilled: Spilled::one(reg, slot), target_slot, ..Default::default() }
    }
}

/// Registers (hardware numbers) whose program values are in slots at a
/// point of a copy, with their slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Spilled {
    regs: [(u8, u64); 3],
    n: u8,
}

impl Spilled {
    pub const NONE: Spilled = Spilled { regs: [(0, 0); 3], n: 0 };

    pub fn one(reg: u8, slot: u64) -> Spilled {
        Spilled { regs: [(reg, slot), (0, 0), (0, 0)], n: 1 }
    }

    pub fn three(regs: [u8; 3], slots: [u64; 3]) -> Spilled {
        Spilled { regs: [(regs[0], slots[0]), (regs[1], slots[1]), (regs[2], slots[2])], n: 3 }
    }

    /// Each register and its slot.
    pub fn iter(&self) -> impl Iterator<Item = (u8, u64)> + '_ {
        self.regs[..self.n as usize].iter().copied()
    }

    /// The first (or only) one.
    pub fn first(&self) -> Option<(u8, u64)> {
        self.iter().next()
    }
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
    /// Bytes of records the instruction being copied wrote (see
    /// [`Point::recorded`]).
    recorded: u32,
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
            recorded: 0,
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
    pub fn translate(&mut self, host: &mut dyn Host, env: &Env, req: TranslateRequest, out: &mut [u8]) -> Result<Block, Error> {
        self.npoints = 0;
        let n = self.decode_block(host, req.native, env.counted);
        if n == 0 {
            return Err(Error::Unreadable);
        }
        let mut e = Emitter { buf: out, base: req.at, pos: 0, full: false, slots: env.slots };
        let record = match env.counted {
            Counted::Records(k) => Some(k),
            _ => None,
        };
        let mut ctx = Ctx { host, points: req.points, dispatch: env.dispatch, link: env.link, record };
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
}

struct Ctx<'a> {
    host: &'a mut dyn Host,
    points: bool,
    dispatch: u64,
    /// The link stub (0: none).
    link: u64,
    /// Recording copies ([`Counted::Records`]): what they record.
    record: Option<RecordKind>,
}
