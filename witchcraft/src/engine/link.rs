//! Links without a trap: the engine's entry from the cache's link stub.
//!
//! Reaching code not yet in the cache used to be an exit, an `int3` trap
//! (a debug exception, a SIGTRAP, a `sigreturn`: 9-13 µs here), before the
//! translation itself (about 4 µs a block). Dynamic binary translators
//! switch to their translator with a few instructions instead. So do
//! witch's copies: an exit that asks for a copy (a direct branch to a block
//! not yet translated, a pick inside a block that needs its slow variant, a
//! dispatch-table miss) first goes to the cache's link stub
//! ([`crate::x86::translate::emit_link`]), which switches to the cache's own
//! stack and calls [`witch_cache_link`] here. It saves every
//! general-purpose register ([`Saved`]: the hook reads the program's
//! registers there, a pick's operands and stack among them), the flags,
//! and the processor's whole extended state (x87, SSE, AVX, AVX-512: the C
//! library's `memcpy` may use any of them, and `vzeroupper` would clear
//! the program's), calls the hook the agent registered (which finds the
//! thread's state and makes the copy, see `ThreadState::link_in_cache`),
//! restores them all and returns to the stub, which jumps to the copy, or,
//! when the hook could not make it, to the exit's `int3` as before.
//!
//! A window's pick goes the same way ([`super::cache_exit`], "picks without
//! a trap"): the hook takes the pick as a single step would, and aims the
//! jump slot at a copy of the picked instruction alone, whose exit comes
//! back here after it ran.
//!
//! The thread runs with the window's signal mask meanwhile (every signal
//! blocked but the synchronous ones and SIGTRAP), so no handler of the
//! program runs inside it; a SIGTRAP raised meanwhile can only be witch's
//! own access (a watchpoint on the code the translator reads), and the agent
//! drops it. The time spent here is the engine's, as all of a window's is.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// The agent's hook: makes the copy an exit asks for, or leaves the jump
/// slot as it is. Called with signals blocked as in a window, on the
/// cache's link stack, with the program's registers as the stub saved them.
pub type Hook = extern "C" fn(*const Saved);

/// The program's general-purpose registers and flags as
/// [`witch_cache_link`] pushed them (lowest address first). Its stack
/// pointer is not here: the link stub keeps it in the data page
/// (`save_rsp`), and the hook runs on the cache's own stack.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Saved {
    _pad: u64,
    pub r15: u64,
    pub r14: u64,
    pub r13: u64,
    pub r12: u64,
    pub rbp: u64,
    pub rbx: u64,
    pub r11: u64,
    pub r10: u64,
    pub r9: u64,
    pub r8: u64,
    pub rdi: u64,
    pub rsi: u64,
    pub rdx: u64,
    pub rcx: u64,
    pub rax: u64,
    pub flags: u64,
}

impl Saved {
    /// The registers in hardware order (rax, rcx, rdx, rbx, rsp, rbp, rsi,
    /// rdi, r8..r15), with `rsp` the program's stack pointer.
    pub fn gpr(&self, rsp: u64) -> [u64; 16] {
        [
            self.rax, self.rcx, self.rdx, self.rbx, rsp, self.rbp, self.rsi, self.rdi, self.r8, self.r9, self.r10, self.r11, self.r12,
            self.r13, self.r14, self.r15,
        ]
    }
}

static HOOK: AtomicUsize = AtomicUsize::new(0);
/// Bytes of the XSAVE area for the features the system enabled, and the
/// features to save (XCR0 without AMX's tile state, which Linux lends a
/// process only on request and never to witch's entry).
static XSAVE_SIZE: AtomicU64 = AtomicU64::new(0);
static XSAVE_MASK: AtomicU64 = AtomicU64::new(0);

/// The most extended state the link stack holds (it has 64 KiB).
const XSAVE_MOST: u32 = 16 * 1024;

/// Register the agent's hook. False (and links keep trapping) if the
/// processor has no XSAVE enabled by the system, or a state larger than
/// the link stack holds.
pub fn set_hook(hook: Hook) -> bool {
    let Some((size, mask)) = xsave_layout() else { return false };
    XSAVE_SIZE.store(size as u64, Ordering::Relaxed);
    XSAVE_MASK.store(mask, Ordering::Relaxed);
    HOOK.store(hook as usize, Ordering::Release);
    true
}

/// Forget the hook (caches made from now on trap at every exit).
pub fn clear_hook() {
    HOOK.store(0, Ordering::Release);
}

/// The entry the link stub calls, if there is a hook (0: none).
pub fn entry() -> u64 {
    if HOOK.load(Ordering::Acquire) == 0 {
        return 0;
    }
    witch_cache_link as *const () as u64
}

/// The XSAVE area's size and the features to save, if the system enabled
/// XSAVE (CPUID leaf 1, ECX bit 27, OSXSAVE).
fn xsave_layout() -> Option<(u32, u64)> {
    let leaf1 = std::arch::x86_64::__cpuid(1);
    if leaf1.ecx & (1 << 27) == 0 {
        return None;
    }
    let (lo, hi): (u32, u32);
    // SAFETY: XGETBV with ECX = 0 reads XCR0, allowed in user mode when
    // OSXSAVE is set (checked above).
    unsafe { std::arch::asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags)) };
    let xcr0 = (hi as u64) << 32 | lo as u64;
    // Leaf 0xD exists when XSAVE does.
    let size = std::arch::x86_64::__cpuid_count(0xD, 0).ebx;
    let mask = xcr0 & !(0b11 << 17);
    (size > 0 && size <= XSAVE_MOST).then_some((size, mask))
}

/// Calls the hook (from [`witch_cache_link`], with the program's state
/// saved at `saved`).
extern "C" fn call_hook(saved: *const Saved) {
    let h = HOOK.load(Ordering::Acquire);
    if h != 0 {
        // The program's floating-point control (XSAVE kept it) must not
        // trap the engine's arithmetic.
        let _fp = crate::sys::fpu::Default::enter();
        // SAFETY: only `set_hook` stores a non-zero value, a `Hook`.
        let f = unsafe { std::mem::transmute::<usize, Hook>(h) };
        f(saved);
    }
}

extern "C" {
    /// The entry the link stub calls (see the module comment); not to be
    /// called from Rust.
    fn witch_cache_link();
}

// On entry the stack pointer is the link stack's top (16-byte aligned)
// less the return address. The flags, the sixteen registers but rsp and
// a pad word (17 pushes, `Saved`) leave it 16-byte aligned; the XSAVE
// area below is 64-byte aligned, its header (bytes 512..576) zeroed as
// XRSTOR requires of the standard form. No instruction between the
// pushes and the pops changes a register the hook does not restore.
std::arch::global_asm!(
    ".text",
    ".p2align 4",
    ".globl witch_cache_link",
    ".hidden witch_cache_link",
    ".type witch_cache_link,@function",
    "witch_cache_link:",
    "pushfq",
    "push rax",
    "push rcx",
    "push rdx",
    "push rsi",
    "push rdi",
    "push r8",
    "push r9",
    "push r10",
    "push r11",
    "push rbx",
    "push rbp",
    "push r12",
    "push r13",
    "push r14",
    "push r15",
    "push rax",
    "cld",
    "mov rbx, rsp",
    "sub rsp, qword ptr [rip + {size}]",
    "and rsp, -64",
    "xor eax, eax",
    "mov qword ptr [rsp + 512], rax",
    "mov qword ptr [rsp + 520], rax",
    "mov qword ptr [rsp + 528], rax",
    "mov qword ptr [rsp + 536], rax",
    "mov qword ptr [rsp + 544], rax",
    "mov qword ptr [rsp + 552], rax",
    "mov qword ptr [rsp + 560], rax",
    "mov qword ptr [rsp + 568], rax",
    "mov eax, dword ptr [rip + {mask}]",
    "mov edx, dword ptr [rip + {mask} + 4]",
    "xsave64 [rsp]",
    "mov rdi, rbx",
    "call {hook}",
    "mov eax, dword ptr [rip + {mask}]",
    "mov edx, dword ptr [rip + {mask} + 4]",
    "xrstor64 [rsp]",
    "mov rsp, rbx",
    "lea rsp, [rsp + 8]",
    "pop r15",
    "pop r14",
    "pop r13",
    "pop r12",
    "pop rbp",
    "pop rbx",
    "pop r11",
    "pop r10",
    "pop r9",
    "pop r8",
    "pop rdi",
    "pop rsi",
    "pop rdx",
    "pop rcx",
    "pop rax",
    "popfq",
    "ret",
    ".size witch_cache_link, . - witch_cache_link",
    size = sym XSAVE_SIZE,
    mask = sym XSAVE_MASK,
    hook = sym call_hook,
);

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine saves its extended state with XSAVE, in a size the
    /// link stack holds, and the mask has at least x87 and SSE.
    #[test]
    fn the_extended_state_fits_the_link_stack() {
        let (size, mask) = xsave_layout().expect("XSAVE enabled");
        assert!((576..=XSAVE_MOST).contains(&size), "{size}");
        assert_eq!(mask & 0b11, 0b11, "{mask:#x}");
    }
}
