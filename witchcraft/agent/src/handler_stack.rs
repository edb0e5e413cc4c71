//! Where witch's handler code runs: on each thread's handler stack, which
//! the thread table maps for it ([`map_stack`], [`HANDLER_STACK`] bytes,
//! a guard page below), never on a stack the program sized.
//!
//! The kernel puts a signal's frame where the handler's flags say: the
//! handlers are `SA_ONSTACK`, so on the thread's alternate stack when one
//! is installed. That is witch's own stack while the thread keeps it, but a
//! program may install one of its own after witch did (gdb gives each of its
//! threads a 13.5 KB one; a program may use `MINSIGSTKSZ`), and the engine's
//! handler code needs about 13 KB, more than such a stack holds past the
//! kernel's frame. So each handler enters through a small frame on whatever
//! stack the kernel chose, and [`run`] moves the engine's work to the
//! thread's handler stack when it is not on it already: a few instructions
//! of assembly switch the stack pointer, call the work and switch back. What
//! is left on the program's stack is the kernel's frame and the entry's
//! (a few hundred bytes, `tests/tests/harm.rs` measures it).
//!
//! A signal whose handler is not witch's work is passed to the program's
//! handler from the entry, on the stack the kernel chose for it, as the
//! program expects.

/// Each thread's handler stack: all of witch's handler code runs on it
/// ([`run`]), and it is the thread's alternate signal stack
/// while the thread keeps it installed. The one place its size is set.
///
/// The engine's handlers take about 13 KB of it, the kernel's signal frame
/// up to the CPU's `AT_MINSIGSTKSZ` more (12 KB with AMX state), and a
/// program's own `SA_ONSTACK` handlers, delivered on it while it is
/// installed, what they take; code that runs in the handlers later must fit
/// too. Mapped with `MAP_NORESERVE`: only the pages a thread touches
/// become memory (four to six for the engine's work), so the reserve costs
/// address space, not memory. A guard page below it turns an overflow into
/// a fault rather than a write into whatever is mapped there.
pub const HANDLER_STACK: usize = 256 * 1024;

/// A stack range, lowest and one past the highest address.
pub type Range = (u64, u64);

/// The x86-64 System V red zone: the 128 bytes below an interrupted stack
/// pointer that the interrupted function may still be using.
const RED_ZONE: u64 = 128;

/// Run `f` on the handler stack `stack` (of the calling thread), unless
/// the caller is on it already. `uc` is the context the kernel passed the
/// handler: if the interrupted code was itself on that stack (a fault
/// inside witch's own work), `f` runs below it.
///
/// Async-signal-safe.
pub fn run<F: FnOnce() -> bool>(stack: Range, uc: *const libc::ucontext_t, f: F) -> bool {
    let (lo, hi) = stack;
    let sp = stack_pointer();
    if lo <= sp && sp < hi {
        return f();
    }
    // SAFETY: `uc` is the kernel's context for this signal; only read.
    let interrupted = unsafe { (*uc).uc_mcontext.gregs[libc::REG_RSP as usize] as u64 };
    let top = if lo < interrupted && interrupted <= hi { interrupted.saturating_sub(RED_ZONE) } else { hi } & !15;
    let mut work = Some(f);
    // SAFETY: `top` is 16-byte aligned and inside the thread's own handler
    // stack, mapped for as long as the thread can run handlers, with
    // nothing of its own above `top` in use; `work` outlives the call.
    let r = unsafe { witch_agent_on_stack(&mut work as *mut Option<F> as *mut libc::c_void, call::<F>, top) };
    r != 0
}

/// Calls the closure behind `p` (an `Option<F>`, taken once).
extern "C" fn call<F: FnOnce() -> bool>(p: *mut libc::c_void) -> u64 {
    // SAFETY: `run` passes a pointer to its `Option<F>`, alive across the call.
    let work = unsafe { &mut *(p as *mut Option<F>) };
    work.take().is_some_and(|f| f()) as u64
}

/// The current stack pointer.
#[inline(always)]
fn stack_pointer() -> u64 {
    let sp: u64;
    // SAFETY: reads a register.
    unsafe { std::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags)) };
    sp
}

extern "C" {
    /// `f(arg)` with the stack pointer at `top` (16-byte aligned), then
    /// back on the caller's stack; returns what `f` returned.
    fn witch_agent_on_stack(arg: *mut libc::c_void, f: extern "C" fn(*mut libc::c_void) -> u64, top: u64) -> u64;
}

// The frame pointer keeps the caller's stack pointer across the call, and
// the CFI says so, so a debugger's backtrace from inside `f` reaches the
// program's frames.
std::arch::global_asm!(
    ".text",
    ".p2align 4",
    ".globl witch_agent_on_stack",
    ".hidden witch_agent_on_stack",
    ".type witch_agent_on_stack,@function",
    "witch_agent_on_stack:",
    ".cfi_startproc",
    "endbr64",
    "push rbp",
    ".cfi_def_cfa_offset 16",
    ".cfi_offset rbp, -16",
    "mov rbp, rsp",
    ".cfi_def_cfa_register rbp",
    "mov rsp, rdx",
    "call rsi",
    "mov rsp, rbp",
    ".cfi_def_cfa_register rsp",
    "pop rbp",
    ".cfi_def_cfa_offset 8",
    "ret",
    ".cfi_endproc",
    ".size witch_agent_on_stack, .-witch_agent_on_stack",
);

/// A thread's alternate stack before ours, as `sigaltstack` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prior {
    pub sp: u64,
    pub size: u64,
    pub flags: i32,
}

impl Prior {
    pub const NONE: Prior = Prior { sp: 0, size: 0, flags: libc::SS_DISABLE };

    pub fn from_stack(s: &libc::stack_t) -> Prior {
        // A never-set stack reads back as size 0 with flags 0: that is "none".
        if s.ss_size == 0 || s.ss_flags & libc::SS_DISABLE != 0 {
            return Prior::NONE;
        }
        Prior { sp: s.ss_sp as u64, size: s.ss_size as u64, flags: s.ss_flags & !libc::SS_ONSTACK }
    }

    pub fn to_stack(self) -> libc::stack_t {
        libc::stack_t { ss_sp: self.sp as *mut libc::c_void, ss_flags: self.flags, ss_size: self.size as usize }
    }
}

/// The guard page below each handler stack.
const GUARD: usize = 4096;

/// A fresh handler stack (its lowest usable address, a guard page below
/// it), or None.
pub fn map_stack() -> Option<u64> {
    // A fresh anonymous mapping in witch's own region, owned by the table
    // from here on.
    let p = witchcraft::sys::mem::map_own(GUARD + HANDLER_STACK, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_NORESERVE | libc::MAP_STACK);
    if p == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: the first page of the mapping just made, unused. (The system
    // call itself: the agent's `mprotect` looks the C library's up on first
    // use, which a handler may not.)
    if !unsafe { witchcraft::sys::mem::protect_own(p as *mut u8, GUARD, libc::PROT_NONE) } {
        // SAFETY: the mapping just made, unused.
        unsafe { witchcraft::sys::mem::unmap_own(p, GUARD + HANDLER_STACK) };
        return None;
    }
    Some(p as u64 + GUARD as u64)
}

/// Unmap a stack from [`map_stack`] that no thread can be on.
pub fn unmap_stack(lo: u64) {
    // SAFETY: a mapping made by `map_stack`, its guard page included; the callers know no thread uses it.
    unsafe { witchcraft::sys::mem::unmap_own((lo - GUARD as u64) as *mut libc::c_void, GUARD + HANDLER_STACK) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The work runs on the given stack and its result comes back; a
    /// caller already on that stack runs it in place.
    #[test]
    fn work_runs_on_the_given_stack() {
        let mut mem = vec![0u8; 64 << 10];
        let lo = mem.as_mut_ptr() as u64;
        let hi = lo + mem.len() as u64;
        // SAFETY: all zero is a valid ucontext (an interrupted rsp of 0: not on the stack).
        let uc: libc::ucontext_t = unsafe { std::mem::zeroed() };
        let mut seen = 0;
        assert!(run((lo, hi), &uc, || {
            seen = stack_pointer();
            // Nested: already on it, so in place.
            run((lo, hi), &uc, || stack_pointer() <= seen)
        }));
        assert!(lo < seen && seen < hi, "ran at {seen:#x}, not in {lo:#x}..{hi:#x}");
        assert!(!run((lo, hi), &uc, || false));
    }

    /// Interrupted code on the handler stack keeps what it uses: the work
    /// runs below its stack pointer and red zone.
    #[test]
    fn work_runs_below_interrupted_code_on_the_same_stack() {
        let mut mem = vec![0u8; 64 << 10];
        let lo = mem.as_mut_ptr() as u64;
        let hi = lo + mem.len() as u64;
        // SAFETY: as above.
        let mut uc: libc::ucontext_t = unsafe { std::mem::zeroed() };
        let interrupted = hi - 4000;
        uc.uc_mcontext.gregs[libc::REG_RSP as usize] = interrupted as i64;
        let mut seen = 0;
        run((lo, hi), &uc, || {
            seen = stack_pointer();
            true
        });
        assert!(lo < seen && seen < interrupted - RED_ZONE, "ran at {seen:#x}, above {:#x}", interrupted - RED_ZONE);
    }
}
