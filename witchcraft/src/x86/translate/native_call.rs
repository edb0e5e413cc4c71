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
//!   [size check]              an allocation the agent tracks as a data object
//!                             (its size at least the heap threshold in the
//!                             data page) leaves the window instead: the
//!                             agent names the block by its return address,
//!                             which must be the program's
//!   lea rsp, [rsp-8]          R stays where it is; the stack keeps its alignment
//!   mov [away_sp], rsp        the entry runs natively ("away") from here ...
//!   call [entry]              ... its return address the cache's, just below
//!   mov qword [away_sp], 0    back
//!   lea rsp, [rsp+8]
//!   pop qword [target]        the entry's `ret`, as a copy's: R looked up
//!   jmp dispatch
//! ```
//!
//! Flags and the scratch register r11 are the entry's to clobber at a
//! call (the ABI keeps neither), so the check may use them. While the
//! thread is away, a window that must end (a fault in the entry) puts the
//! address of [`witch_native_call_return`] in the entry's return slot,
//! which returns natively to `R` ([`away_return_slot`]).

use super::emit::Emitter;
use super::{DataAddrs, Error, Exit};

/// Which argument of an entry is the size of the block it allocates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SizeArg {
    /// It allocates nothing (`free`).
    #[default]
    None,
    Rdi,
    Rsi,
    Rdx,
    /// `calloc`: rdi × rsi.
    RdiTimesRsi,
}

/// One entry the cache calls natively.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NativeCall {
    pub pc: u64,
    pub size: SizeArg,
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
        for c in calls.iter().filter(|c| c.pc != 0).take(Self::MAX) {
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

/// The offset of `back` (the entry's return into the cache) from a native
/// call's start, for a call with this size check.
fn check_len(size: SizeArg) -> usize {
    match size {
        SizeArg::None => 0,
        // cmp reg, [rip+d]; jae rel32
        SizeArg::Rdi | SizeArg::Rsi | SizeArg::Rdx => 7 + 6,
        // mov r11, rdi; imul r11, rsi; jo rel32; cmp r11, [rip+d]; jae rel32
        SizeArg::RdiTimesRsi => 3 + 4 + 6 + 7 + 6,
    }
}

/// The offset, from a native call's start, of the end of its `pop
/// qword [target]` (the entry's `ret`, as a copy makes it): a watchpoint
/// on the program's return address traps there, with the program's
/// registers as after that `ret` and its PC in the target slot.
pub fn after_return(size: SizeArg) -> usize {
    // lea rsp; mov [away_sp], rsp; call [entry]; mov qword [away_sp], 0; lea rsp; pop [target]
    check_len(size) + 8 + 7 + 6 + 11 + 8 + 6
}

/// The native call for `call` at `at` (see the module docs); its length.
pub fn emit_native_call(slots: &DataAddrs, call: &NativeCall, at: u64, dispatch: u64, out: &mut [u8]) -> Result<usize, Error> {
    let mut e = Emitter { buf: out, base: at, pos: 0, full: false, slots: *slots };
    let s = *slots;
    let mut to_native = [usize::MAX; 2];
    match call.size {
        SizeArg::None => {}
        SizeArg::Rdi | SizeArg::Rsi | SizeArg::Rdx => {
            let reg = match call.size {
                SizeArg::Rdi => 7,
                SizeArg::Rsi => 6,
                _ => 2,
            };
            e.modrm_slot(&[0x48, 0x3B], reg, s.heap_threshold); // cmp reg, [heap_threshold]
            to_native[0] = e.jcc_rel32(0x3); // jae
        }
        SizeArg::RdiTimesRsi => {
            e.bytes(&[0x49, 0x89, 0xFB]); // mov r11, rdi
            e.bytes(&[0x4C, 0x0F, 0xAF, 0xDE]); // imul r11, rsi
            to_native[0] = e.jcc_rel32(0x0); // jo
            e.modrm_slot(&[0x4C, 0x3B], 3, s.heap_threshold); // cmp r11, [heap_threshold]
            to_native[1] = e.jcc_rel32(0x3); // jae
        }
    }
    debug_assert!(e.full || e.pos == check_len(call.size));
    e.lea_rsp(-8);
    e.mov_slot_reg(s.away_sp, 4); // mov [away_sp], rsp
    e.bytes(&[0xFF, 0x15]); // call [rip+entry]
    let entry = e.pos;
    e.bytes(&[0; 4]);
    // back:
    e.bytes(&[0x48, 0xC7, 0x05]); // mov qword [away_sp], 0
    let d = e.rel_to(s.away_sp, 8);
    e.bytes(&d.to_le_bytes());
    e.bytes(&[0; 4]);
    e.lea_rsp(8);
    e.modrm_slot(&[0x8F], 0, s.target); // pop qword [target]
    debug_assert!(e.full || e.pos == after_return(call.size));
    e.jmp_abs(dispatch);
    for at in to_native.into_iter().filter(|&a| a != usize::MAX) {
        e.bind(at);
    }
    if to_native[0] != usize::MAX {
        e.bytes(&[0xCC]);
        e.bytes(&Exit::Native { native: call.pc }.encode());
    }
    e.literal(entry, call.pc);
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

    #[test]
    fn the_native_calls_points_are_where_planned() {
        let slots = DataAddrs::at(0x7f00_0000_0000);
        for size in [SizeArg::None, SizeArg::Rdi, SizeArg::Rsi, SizeArg::Rdx, SizeArg::RdiTimesRsi] {
            let mut out = [0u8; 256];
            let call = NativeCall { pc: 0x5555_0000_1000, size };
            let n = emit_native_call(&slots, &call, 0x7f00_0000_2000, 0x7f00_0000_1800, &mut out).unwrap();
            let mut d = iced_x86::Decoder::with_ip(64, &out[..n], 0x7f00_0000_2000, iced_x86::DecoderOptions::NONE);
            let first_lea = d.iter().position(|i| i.mnemonic() == iced_x86::Mnemonic::Lea).unwrap();
            let mut d = iced_x86::Decoder::with_ip(64, &out[..n], 0x7f00_0000_2000, iced_x86::DecoderOptions::NONE);
            let lea_at = d.iter().nth(first_lea).unwrap().ip() - 0x7f00_0000_2000;
            assert_eq!(lea_at as usize, check_len(size), "{size:?}");
            let mut d = iced_x86::Decoder::with_ip(64, &out[..n], 0x7f00_0000_2000, iced_x86::DecoderOptions::NONE);
            let pop = d.iter().find(|i| i.mnemonic() == iced_x86::Mnemonic::Pop).unwrap();
            assert_eq!((pop.next_ip() - 0x7f00_0000_2000) as usize, after_return(size), "{size:?}");
        }
    }
}
