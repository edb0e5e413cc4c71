//! Memory accesses of one instruction, decoded with iced-x86.
//!
//! Explicit operands and implicit ones (push/pop/call/ret, string
//! instructions, enter/leave) both count, as the PMU's load/store events and
//! the exhaustive tools count them. Everything here runs inside signal
//! handlers: no allocation (the info factory's vectors are preallocated once
//! per thread).

use iced_x86::{
    Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, InstructionInfoOptions, MemorySize, OpAccess, Register,
};

/// Register file as the decoder needs it, taken from a signal context.
#[derive(Clone, Copy, Debug, Default)]
pub struct Regs {
    /// rax, rcx, rdx, rbx, rsp, rbp, rsi, rdi, r8..r15 (hardware order).
    pub gpr: [u64; 16],
    pub rip: u64,
    pub fs_base: u64,
    pub gs_base: u64,
    /// Direction flag (string instructions walk down when set).
    pub df: bool,
}

impl Regs {
    /// # Safety
    /// `uc` must point to a valid `ucontext_t` (as given to a signal handler).
    pub unsafe fn from_ucontext(uc: *const libc::ucontext_t, fs_base: u64, gs_base: u64) -> Regs {
        let g = &(*uc).uc_mcontext.gregs;
        let r = |i: i32| g[i as usize] as u64;
        Regs {
            gpr: [
                r(libc::REG_RAX),
                r(libc::REG_RCX),
                r(libc::REG_RDX),
                r(libc::REG_RBX),
                r(libc::REG_RSP),
                r(libc::REG_RBP),
                r(libc::REG_RSI),
                r(libc::REG_RDI),
                r(libc::REG_R8),
                r(libc::REG_R9),
                r(libc::REG_R10),
                r(libc::REG_R11),
                r(libc::REG_R12),
                r(libc::REG_R13),
                r(libc::REG_R14),
                r(libc::REG_R15),
            ],
            rip: r(libc::REG_RIP),
            fs_base,
            gs_base,
            df: r(libc::REG_EFL) & (1 << 10) != 0,
        }
    }
    pub fn sp(&self) -> u64 {
        self.gpr[4]
    }
    pub fn bp(&self) -> u64 {
        self.gpr[5]
    }

    fn value(&self, reg: Register) -> Option<u64> {
        use Register::*;
        let idx = match gpr_index(reg) {
            Some(i) => i,
            Option::None => match reg.full_register() {
                RIP => return Some(self.rip),
                ES | CS | SS | DS => return Some(0),
                FS => return Some(self.fs_base),
                GS => return Some(self.gs_base),
                _ => return Option::None, // vector index (VSIB) or unknown
            },
        };
        let v = self.gpr[idx];
        Some(match reg.size() {
            8 => v,
            4 => v & 0xffff_ffff,
            2 => v & 0xffff,
            _ => v & 0xff,
        })
    }
}

/// Float element width of a memory operand, for approximate comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Float {
    #[default]
    No,
    F32,
    F64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Access {
    pub addr: u64,
    /// Bytes touched (per element for string instructions).
    pub len: u32,
    pub read: bool,
    pub write: bool,
    pub float: Float,
    /// Bytes per value element: less than `len` for a vector of values
    /// (the memory operand's element type); 0 when the access is one value.
    pub elem: u8,
}

impl Access {
    /// Bytes per value: the element of a vector access, else the whole access.
    pub fn element_len(&self) -> u32 {
        match self.elem as u32 {
            0 => self.len,
            e => e.min(self.len),
        }
    }

    pub fn overlap(&self, addr: u64, len: u64) -> u64 {
        let lo = self.addr.max(addr);
        let hi = (self.addr + self.len as u64).min(addr + len);
        hi.saturating_sub(lo)
    }
}

pub const MAX_ACCESSES: usize = 4;

/// One decoded instruction and its memory accesses.
#[derive(Clone, Copy, Debug, Default)]
pub struct Decoded {
    pub ip: u64,
    pub len: u32,
    pub accesses: [Access; MAX_ACCESSES],
    pub n: usize,
    /// Control transfer: the next PC is not ip+len.
    pub branch: bool,
    /// rep-prefixed string instruction: traps may land with rip still on it.
    pub rep: bool,
    /// The direction flag was set (string instructions walk down).
    pub df: bool,
    /// Safe to single-step with the trap flag from user space: not a system
    /// call or interrupt, not an instruction that reads or writes the flags
    /// register whole (`pushf` would store the trap flag into the program's
    /// memory, `popf` could set or clear it), not a transaction, not a far
    /// transfer or a stack-segment load.
    pub steppable: bool,
    /// Some access address could not be computed (VSIB) or is ambiguous.
    pub partial: bool,
    /// Registers (full width, hardware numbers 0..16) the addresses depend on, as a bit set.
    pub addr_regs: u16,
    /// Registers the instruction writes (explicit destination, rsp for stack ops), as a bit set.
    pub writes: u16,
    /// The instruction only adds a constant to one 64-bit register
    /// (`add r, imm`, `sub r, imm`, `inc r`, `dec r`, `lea r, [r+imm]`):
    /// (register number, delta). Such steps can be undone or replayed when
    /// computing a neighbouring instruction's address.
    pub step: Option<(usize, i64)>,
}

impl Decoded {
    pub fn accesses(&self) -> &[Access] {
        &self.accesses[..self.n]
    }
    pub fn next_ip(&self) -> u64 {
        self.ip + self.len as u64
    }
}

/// Hardware number of a general-purpose register (any width), if it is
/// one: its index in [`Regs::gpr`].
fn gpr_index(r: Register) -> Option<usize> {
    use Register::*;
    Some(match r.full_register() {
        RAX => 0,
        RCX => 1,
        RDX => 2,
        RBX => 3,
        RSP => 4,
        RBP => 5,
        RSI => 6,
        RDI => 7,
        R8 => 8,
        R9 => 9,
        R10 => 10,
        R11 => 11,
        R12 => 12,
        R13 => 13,
        R14 => 14,
        R15 => 15,
        _ => return Option::None,
    })
}

/// A general-purpose register's bit in a mask of them (0: not one).
fn gpr_bit(r: Register) -> u16 {
    let Some(i) = gpr_index(r) else { return 0 };
    1 << i
}

fn float_of(ms: MemorySize) -> Float {
    match ms.element_type() {
        MemorySize::Float32 => Float::F32,
        MemorySize::Float64 => Float::F64,
        _ => Float::No,
    }
}

/// Per-thread decoder state, created outside signal handlers.
pub struct Analyzer {
    factory: InstructionInfoFactory,
    instr: Instruction,
}

impl Default for Analyzer {
    fn default() -> Self {
        Self::new()
    }
}

impl Analyzer {
    pub fn new() -> Self {
        let mut a = Analyzer { factory: InstructionInfoFactory::new(), instr: Instruction::default() };
        // Touch the info vectors once so later calls reuse their capacity.
        let _ = a.decode(&[0x90], 0, &Regs::default(), false);
        a
    }

    /// Decode the instruction in `bytes` (located at `ip`) and compute the
    /// addresses it accesses given `regs`. With `after` set, `regs` are the
    /// registers *after* the instruction ran (a watchpoint trap), and known
    /// implicit register updates are undone before computing addresses.
    pub fn decode(&mut self, bytes: &[u8], ip: u64, regs: &Regs, after: bool) -> Option<Decoded> {
        let mut dec = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE);
        if !dec.can_decode() {
            return None;
        }
        dec.decode_out(&mut self.instr);
        if self.instr.is_invalid() {
            return None;
        }
        let instr = self.instr;
        let mut d = self.analyze(&instr, regs, after);
        // A `rep` string instruction whose count is zero runs no
        // iteration: it accesses nothing (single steps see it end at once;
        // the code cache's copies count it by its elements). Only before
        // it runs: after it, the count is zero whenever it ended. (Not in
        // `analyze`, which the translator calls without registers.)
        if d.rep && !after && rep_count(&instr, regs) == Some(0) {
            d.n = 0;
        }
        Some(d)
    }

    /// [`Analyzer::decode`] of an instruction already decoded (valid).
    pub fn analyze(&mut self, instr: &Instruction, regs: &Regs, after: bool) -> Decoded {
        let ip = instr.ip();
        let mut d = Decoded {
            ip,
            len: instr.len() as u32,
            branch: !matches!(instr.flow_control(), FlowControl::Next),
            rep: (instr.has_rep_prefix() || instr.has_repne_prefix()) && instr.is_string_instruction(),
            df: regs.df,
            steppable: steppable(instr),
            ..Default::default()
        };
        let info = self.factory.info_options(instr, InstructionInfoOptions::NO_REGISTER_USAGE);
        let mut regs = *regs;
        if after {
            undo_implicit_updates(instr, &mut regs);
        }
        if instr.op_count() > 0
            && instr.op0_kind() == iced_x86::OpKind::Register
            && matches!(info.op0_access(), OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite)
        {
            d.writes |= gpr_bit(instr.op0_register());
        }
        if instr.stack_pointer_increment() != 0 {
            d.writes |= 1 << 4;
        }
        d.step = constant_step(instr);
        if instr.is_string_instruction() {
            d.writes |= (1 << 6) | (1 << 7);
        }
        // Instructions that write registers other than op0 (xchg, mul, div, cmpxchg, ...).
        {
            use iced_x86::Mnemonic::*;
            match instr.mnemonic() {
                Xchg | Xadd | Cmpxchg => d.writes |= gpr_bit(instr.op1_register()) | 1,
                Mul | Imul | Div | Idiv | Cqo | Cdq | Rdtsc | Rdtscp | Cpuid | Syscall => d.writes |= 0b1111,
                _ => {}
            }
        }
        for m in info.used_memory() {
            if d.n == MAX_ACCESSES {
                d.partial = true;
                break;
            }
            let (read, write) = match m.access() {
                OpAccess::Read | OpAccess::CondRead => (true, false),
                OpAccess::Write | OpAccess::CondWrite => (false, true),
                OpAccess::ReadWrite | OpAccess::ReadCondWrite => (true, true),
                _ => continue, // NoMemAccess (lea, prefetch, nop [mem])
            };
            // rep string ops report an unknown total size; watch per element.
            let size = match m.memory_size().size() {
                0 if d.rep => instr.memory_size().size(),
                s => s,
            } as u32;
            if size == 0 {
                d.partial = true;
                continue;
            }
            let Some(addr) = m.virtual_address(0, |r, _, _| regs.value(r)) else {
                d.partial = true;
                continue;
            };
            d.addr_regs |= gpr_bit(m.base()) | gpr_bit(m.index());
            let el = m.memory_size().element_size() as u32;
            let elem = if el > 0 && el < size { el as u8 } else { 0 };
            d.accesses[d.n] = Access { addr, len: size, read, write, float: float_of(m.memory_size()), elem };
            d.n += 1;
        }
        d
    }
}

fn steppable(i: &Instruction) -> bool {
    use iced_x86::Mnemonic::*;
    if matches!(i.flow_control(), FlowControl::Interrupt | FlowControl::Exception | FlowControl::XbeginXabortXend) {
        return false;
    }
    if i.is_call_far() || i.is_jmp_far() || i.is_call_far_indirect() || i.is_jmp_far_indirect() {
        return false;
    }
    if i.op_count() > 0 && i.op0_kind() == iced_x86::OpKind::Register && i.op0_register() == Register::SS {
        return false; // mov ss / pop ss: the next instruction runs in its shadow
    }
    !matches!(
        i.mnemonic(),
        Syscall
            | Sysenter
            | Sysexit
            | Sysret
            | Iret
            | Iretd
            | Iretq
            | Retf
            | Pushf
            | Pushfd
            | Pushfq
            | Popf
            | Popfd
            | Popfq
            | Hlt
            | Cli
            | Sti
            | Int
            | Int1
            | Int3
            | Into
            | Ud0
            | Ud1
            | Ud2
            | Xbegin
            | Xend
            | Xabort
            | Xtest
    )
}

fn constant_step(i: &Instruction) -> Option<(usize, i64)> {
    use iced_x86::Mnemonic::*;
    use iced_x86::OpKind;
    if i.op_count() == 0 || i.op0_kind() != OpKind::Register || i.op0_register().size() != 8 {
        return None;
    }
    let r = i.op0_register();
    let idx = gpr_index(r)?;
    let imm = || match i.op1_kind() {
        OpKind::Immediate8to64 | OpKind::Immediate32to64 | OpKind::Immediate8 | OpKind::Immediate32 => Some(i.immediate(1) as i64),
        _ => None,
    };
    match i.mnemonic() {
        Add => Some((idx, imm()?)),
        Sub => Some((idx, imm()?.wrapping_neg())),
        Inc => Some((idx, 1)),
        Dec => Some((idx, -1)),
        Lea if i.memory_base() == r && i.memory_index() == Register::None => Some((idx, i.memory_displacement64() as i64)),
        _ => None,
    }
}

/// Registers seen at a trap are post-execution. Undo the updates whose effect
/// on addressing is known, so the computed address is the one accessed.
fn undo_implicit_updates(instr: &Instruction, regs: &mut Regs) {
    use iced_x86::Mnemonic::*;
    let m = instr.mnemonic();
    let sp = regs.gpr[4];
    match m {
        // These decremented rsp before storing.
        Push | Pushfq | Call => regs.gpr[4] = sp.wrapping_add(instr.stack_pointer_increment().unsigned_abs() as u64),
        // These incremented rsp after loading.
        Pop | Popfq | Ret | Leave => {
            if m == Leave {
                // leave: rsp = rbp; pop rbp. Old rbp is unknowable; use rsp-8 for the pop.
                regs.gpr[4] = sp.wrapping_sub(8);
                regs.gpr[5] = regs.gpr[4];
            } else {
                regs.gpr[4] = sp.wrapping_sub(instr.stack_pointer_increment().unsigned_abs() as u64)
            }
        }
        // String instructions (not SSE movsd/cmpsd, which share mnemonics).
        _ if instr.is_string_instruction() => {
            let sz = instr.memory_size().size() as u64;
            let step = if regs.df { sz.wrapping_neg() } else { sz };
            // Each iteration advanced rsi/rdi by one element after accessing.
            let uses_si = !matches!(m, Stosb | Stosw | Stosd | Stosq | Scasb | Scasw | Scasd | Scasq);
            let uses_di = !matches!(m, Lodsb | Lodsw | Lodsd | Lodsq);
            if uses_si {
                regs.gpr[6] = regs.gpr[6].wrapping_sub(step);
            }
            if uses_di {
                regs.gpr[7] = regs.gpr[7].wrapping_sub(step);
            }
        }
        _ => {}
    }
}

/// The count register of a `rep` string instruction: `rcx`, or `ecx`
/// under a 32-bit address size.
fn rep_count(instr: &Instruction, regs: &Regs) -> Option<u64> {
    use iced_x86::OpKind::*;
    let addr32 = (0..instr.op_count()).any(|i| matches!(instr.op_kind(i), MemorySegESI | MemorySegEDI | MemoryESEDI));
    regs.value(if addr32 { iced_x86::Register::ECX } else { iced_x86::Register::RCX })
}

/// Does the instruction write one of its own address registers (so a
/// post-execution address cannot be checked)?
pub fn clobbers_address(bytes: &[u8], ip: u64) -> bool {
    let mut dec = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE);
    let i = dec.decode();
    if i.op_count() == 0 || i.op0_kind() != iced_x86::OpKind::Register {
        return false;
    }
    let dst = i.op0_register().full_register();
    dst == i.memory_base().full_register() || dst == i.memory_index().full_register()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regs() -> Regs {
        let mut r = Regs::default();
        r.gpr[0] = 0x1000; // rax
        r.gpr[4] = 0x7000; // rsp
        r.gpr[6] = 0x2000; // rsi
        r.gpr[7] = 0x3000; // rdi
        r.gpr[12] = 3; // r12
        r.fs_base = 0x9_0000;
        r
    }

    #[test]
    fn explicit_store_and_load() {
        let mut a = Analyzer::new();
        // mov dword [rax+r12*8+0x10], esi
        let d = a.decode(&[0x42, 0x89, 0x74, 0xe0, 0x10], 0x400000, &regs(), false).unwrap();
        assert_eq!(d.accesses(), &[Access { addr: 0x1000 + 24 + 0x10, len: 4, read: false, write: true, float: Float::No, elem: 0 }]);
        // movsd xmm0, qword [rax]
        let d = a.decode(&[0xf2, 0x0f, 0x10, 0x00], 0, &regs(), false).unwrap();
        assert_eq!(d.accesses()[0].float, Float::F64);
        assert!(d.accesses()[0].read && !d.accesses()[0].write);
        // add [rax], 1: read and write
        let d = a.decode(&[0x83, 0x00, 0x01], 0, &regs(), false).unwrap();
        assert!(d.accesses()[0].read && d.accesses()[0].write);
        // lea rax, [rax+8]: no access
        let d = a.decode(&[0x48, 0x8d, 0x40, 0x08], 0, &regs(), false).unwrap();
        assert_eq!(d.n, 0);
    }

    #[test]
    fn implicit_stack_and_string_accesses() {
        let mut a = Analyzer::new();
        // push rax: store at rsp-8 before; after it, rsp already moved.
        let d = a.decode(&[0x50], 0, &regs(), false).unwrap();
        assert_eq!((d.accesses()[0].addr, d.accesses()[0].write), (0x7000 - 8, true));
        let mut after = regs();
        after.gpr[4] = 0x7000 - 8;
        let d = a.decode(&[0x50], 0, &after, true).unwrap();
        assert_eq!(d.accesses()[0].addr, 0x7000 - 8);
        // ret: load at rsp
        let d = a.decode(&[0xc3], 0, &regs(), false).unwrap();
        assert_eq!((d.accesses()[0].addr, d.accesses()[0].read, d.branch), (0x7000, true, true));
        // call rel32: stores the return address at rsp-8
        let d = a.decode(&[0xe8, 0, 0, 0, 0], 0, &regs(), false).unwrap();
        assert!(d.accesses().iter().any(|x| x.addr == 0x7000 - 8 && x.write));
        // SSE movsd is not the string movsd: no implicit register updates.
        let mut after = regs();
        after.gpr[7] = 0x3000;
        let d = a.decode(&[0xf2, 0x0f, 0x11, 0x04, 0xd7], 0, &after, true).unwrap(); // movsd [rdi+rdx*8], xmm0
        assert_eq!(d.accesses()[0].addr, 0x3000);
        // rep movsq: read [rsi], write [rdi]; after one element both advanced by 8
        let mut counted = regs();
        counted.gpr[1] = 4; // rcx
        let d = a.decode(&[0xf3, 0x48, 0xa5], 0, &counted, false).unwrap();
        assert!(d.rep);
        assert!(d.accesses().iter().any(|x| x.addr == 0x2000 && x.read));
        assert!(d.accesses().iter().any(|x| x.addr == 0x3000 && x.write && x.len == 8));
        let mut after = regs();
        after.gpr[6] += 8;
        after.gpr[7] += 8;
        let d = a.decode(&[0xf3, 0x48, 0xa5], 0, &after, true).unwrap();
        assert!(d.accesses().iter().any(|x| x.addr == 0x3000 && x.write));
        // With a zero count it runs no iteration: no access (rcx, or ecx
        // under a 32-bit address size); after its last one, the count is
        // zero and the access was made.
        let d = a.decode(&[0xf3, 0x48, 0xa5], 0, &regs(), false).unwrap();
        assert!(d.rep && d.accesses().is_empty(), "{:?}", d.accesses());
        let mut high = regs();
        high.gpr[1] = 1 << 32;
        assert!(a.decode(&[0x67, 0xf3, 0x48, 0xa5], 0, &high, false).unwrap().accesses().is_empty());
        assert_eq!(a.decode(&[0xf3, 0x48, 0xa5], 0, &high, false).unwrap().accesses().len(), 2);
        assert_eq!(a.decode(&[0xf3, 0x48, 0xab], 0, &counted, false).unwrap().accesses().len(), 1); // rep stosq
        assert!(a.decode(&[0xf3, 0x48, 0xab], 0, &regs(), false).unwrap().accesses().is_empty());
        assert_eq!(a.decode(&[0xf3, 0x48, 0xa5], 0, &after, true).unwrap().accesses().len(), 2);
    }

    #[test]
    fn fs_segment_and_rip_relative() {
        let mut a = Analyzer::new();
        // mov rax, fs:[0x28]
        let d = a.decode(&[0x64, 0x48, 0x8b, 0x04, 0x25, 0x28, 0, 0, 0], 0, &regs(), false).unwrap();
        assert_eq!(d.accesses()[0].addr, 0x9_0028);
        // mov eax, [rip+0x10] at 0x400000 (len 6)
        let d = a.decode(&[0x8b, 0x05, 0x10, 0, 0, 0], 0x400000, &regs(), false).unwrap();
        assert_eq!(d.accesses()[0].addr, 0x400016);
        assert!(clobbers_address(&[0x48, 0x8b, 0x00], 0)); // mov rax,[rax]
        let mut ok = |bytes: &[u8]| a.decode(bytes, 0, &regs(), false).unwrap().steppable;
        assert!(ok(&[0x48, 0x89, 0x07])); // mov [rdi], rax
        assert!(ok(&[0xf3, 0x48, 0xab])); // rep stosq
        assert!(ok(&[0xc3]) && ok(&[0xe8, 0, 0, 0, 0])); // ret, call
        assert!(!ok(&[0x0f, 0x05])); // syscall
        assert!(!ok(&[0x9c]) && !ok(&[0x9d])); // pushfq, popfq
        assert!(!ok(&[0xcd, 0x80]) && !ok(&[0xcc])); // int 0x80, int3
        assert!(!ok(&[0x8e, 0xd0])); // mov ss, eax
        assert!(!clobbers_address(&[0x48, 0x8b, 0x01], 0)); // mov rax,[rcx]
    }
}
