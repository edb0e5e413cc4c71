//! Calls from a window into functions the cache does not run but that
//! return: the agent's allocation entries (`malloc`, `free` and the like,
//! which interpose the C library's to name heap objects).
//!
//! A window used to end at such a call, as at a system call, and the
//! code after it was looked at only by windows that began after it: in a
//! program that allocates every few hundred instructions, every window
//! ended after a few hundred, and the code right after the calls weighed
//! less in the estimate (whole-run counting came back at a breakpoint,
//! two traps a call). Instead, the entry's "copy" is a native call: the
//! cache calls the entry natively and the window goes on at the return
//! address when it returns. The entry's own instructions are not counted:
//! the agent's (never the program's to any sampler) and those of the C
//! library's allocator it goes on to (which a window that begins in the
//! allocator does count, and the exact mode's recording windows, which
//! run the allocator in the cache instead: `Engine::calls_on`).
//!
//! The native call, entered where the program's `call` (or its PLT's
//! `jmp`) would reach the entry, the program's return address `R` on top
//! of the stack:
//!
//! ```text
//!   mov reg, [rsp]            R as the function's argument `ret` (an
//!                             allocation's: the agent names the block
//!                             by the program's return address)
//!   lea rsp, [rsp-8]          R stays where it is; the stack keeps its alignment
//!   mov [away_sp], rsp        the function runs natively ("away") from here ...
//!   call [function]           ... its return address the cache's, just below
//!   mov qword [away_sp], 0    back
//!   lea rsp, [rsp+8]
//!   pop qword [target]        the entry's `ret`, as a copy's: R looked up
//!   jmp dispatch
//! ```
//!
//! The function is the entry itself (`free`), or the agent's allocation
//! function the entry calls with its own return address, here given `R`
//! in the register after the entry's arguments (a scratch register at a
//! call, which the entry does not read). While the thread is away, a
//! window that must end (a fault in the function) puts the address of
//! [`witch_native_call_return`] in the function's return slot, which
//! returns natively to `R` ([`away_return_slot`]).

use super::emit::Emitter;
use super::{DataAddrs, Error};

/// Which register a native call's function takes the program's return
/// address in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RetArg {
    /// It takes none (`free`).
    #[default]
    None,
    Rsi,
    Rdx,
    Rcx,
}

impl RetArg {
    /// `mov reg, [rsp]`, if any.
    fn load(self) -> &'static [u8] {
        match self {
            RetArg::None => &[],
            RetArg::Rsi => &[0x48, 0x8B, 0x34, 0x24],
            RetArg::Rdx => &[0x48, 0x8B, 0x14, 0x24],
            RetArg::Rcx => &[0x48, 0x8B, 0x0C, 0x24],
        }
    }
}

/// One entry the cache calls natively: the entry (where the program's
/// branches go), the function the native call calls, and where that
/// function takes the return address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NativeCall {
    pub pc: u64,
    pub function: u64,
    pub ret: RetArg,
}

/// The entries a cache calls natively (at most [`NativeCalls::MAX`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NativeCalls {
    calls: [NativeCall; NativeCalls::MAX],
    n: usize,
}

impl NativeCalls {
    pub const MAX: usize = 16;

    /// The list of `calls` (those past [`NativeCalls::MAX`], and entries
    /// at address 0, left out).
    pub fn of(calls: &[NativeCall]) -> NativeCalls {
        let mut s = NativeCalls::default();
        for c in calls.iter().filter(|c| c.pc != 0 && c.function != 0).take(Self::MAX) {
            s.calls[s.n] = *c;
            s.n += 1;
        }
        s
    }

    pub fn find(&self, pc: u64) -> Option<NativeCall> {
        self.calls[..self.n].iter().find(|c| c.pc == pc).copied()
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
}

/// The offsets, from a native call's start, of the ends of its two
/// loads of the program's return address: the `mov` that passes it to
/// the function (none without one) and the `pop qword [target]` that is
/// the entry's `ret`. A watchpoint on the return address traps after
/// either; the program's next access to that word is the entry's `ret`.
pub fn return_loads(ret: RetArg) -> (Option<usize>, usize) {
    let arg = ret.load().len();
    // mov reg, [rsp]; lea rsp; mov [away_sp], rsp; call [function];
    // mov qword [away_sp], 0; lea rsp; pop [target]
    ((arg > 0).then_some(arg), arg + 8 + 7 + 6 + 11 + 8 + 6)
}

/// The native call for `call` at `at` (see the module docs); its length.
pub fn emit_native_call(slots: &DataAddrs, call: &NativeCall, at: u64, dispatch: u64, out: &mut [u8]) -> Result<usize, Error> {
    let mut e = Emitter { buf: out, base: at, pos: 0, full: false, slots: *slots };
    let s = *slots;
    e.bytes(call.ret.load());
    e.lea_rsp(-8);
    e.mov_slot_reg(s.away_sp, 4); // mov [away_sp], rsp
    e.bytes(&[0xFF, 0x15]); // call [rip+function]
    let function = e.pos;
    e.bytes(&[0; 4]);
    // back:
    e.bytes(&[0x48, 0xC7, 0x05]); // mov qword [away_sp], 0
    let d = e.rel_to(s.away_sp, 8);
    e.bytes(&d.to_le_bytes());
    e.bytes(&[0; 4]);
    e.lea_rsp(8);
    e.modrm_slot(&[0x8F], 0, s.target); // pop qword [target]
    debug_assert!(e.full || e.pos == return_loads(call.ret).1);
    e.jmp_abs(dispatch);
    e.literal(function, call.function);
    if e.full {
        return Err(Error::Full);
    }
    Ok(e.pos)
}

/// Where the entry's return slot is while a thread is away, `away_sp`
/// being the data page's value (not 0): the entry returns through it into
/// the cache, the program's return address `R` one word above `away_sp`.
pub fn away_return_slot(away_sp: u64) -> u64 {
    away_sp - 8
}

std::arch::global_asm!(
    ".pushsection .text.witch_native_call_return,\"ax\",@progbits",
    ".globl witch_native_call_return",
    ".hidden witch_native_call_return",
    ".type witch_native_call_return,@function",
    // Unwind information, so that an unwinder in the program's handler of
    // a fault in the entry (a backtrace, a debugger) goes on through here
    // to R: the frame's canonical frame address is 16 above the stack
    // pointer (the word below R, then R), and 8 after the `lea`. An
    // unwinder looks a return address up less one: the `nop` before the
    // entry point is inside this frame description.
    ".cfi_startproc",
    ".cfi_def_cfa_offset 16",
    "nop",
    "witch_native_call_return:",
    // The entry returned here instead of into the cache: past the word
    // below R, and on to R natively.
    "lea rsp, [rsp+8]",
    ".cfi_def_cfa_offset 8",
    "ret",
    ".cfi_endproc",
    ".size witch_native_call_return, .-witch_native_call_return",
    ".popsection",
);

extern "C" {
    /// See [`away_return_slot`]: native code that returns to `R` from the
    /// entry's return slot.
    pub fn witch_native_call_return();
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions, Mnemonic, Register};

    #[test]
    fn the_native_calls_loads_of_the_return_address_are_where_planned() {
        let slots = DataAddrs::at(0x7f00_0000_0000);
        let at = 0x7f00_0000_2000;
        for ret in [RetArg::None, RetArg::Rsi, RetArg::Rdx, RetArg::Rcx] {
            let mut out = [0u8; 256];
            let call = NativeCall { pc: 0x5555_0000_1000, function: 0x5555_0000_2000, ret };
            let n = emit_native_call(&slots, &call, at, 0x7f00_0000_1800, &mut out).unwrap();
            let insns: Vec<_> = Decoder::with_ip(64, &out[..n], at, DecoderOptions::NONE).iter().collect();
            let pop = insns.iter().find(|i| i.mnemonic() == Mnemonic::Pop).unwrap();
            let (arg, ret_end) = return_loads(ret);
            assert_eq!((pop.next_ip() - at) as usize, ret_end, "{ret:?}");
            let first = insns[0];
            match arg {
                Some(end) => {
                    assert_eq!((first.mnemonic(), first.memory_base(), first.next_ip() - at), (Mnemonic::Mov, Register::RSP, end as u64));
                    let reg = [Register::RSI, Register::RDX, Register::RCX][ret as usize - 1];
                    assert_eq!(first.op0_register(), reg, "{ret:?}");
                }
                None => assert_eq!(first.mnemonic(), Mnemonic::Lea, "{ret:?}"),
            }
            let call_insn = insns.iter().find(|i| i.mnemonic() == Mnemonic::Call).unwrap();
            let lit = call_insn.ip_rel_memory_address() - at;
            assert_eq!(u64::from_le_bytes(out[lit as usize..lit as usize + 8].try_into().unwrap()), call.function);
        }
    }
}
