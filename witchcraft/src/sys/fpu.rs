//! The floating-point control the agent's own code runs with.
//!
//! A program may unmask floating-point exceptions (`feenableexcept`,
//! Fortran's `-ffpe-trap`) or change the rounding mode: its `MXCSR` then
//! turns an inexact or overflowing operation into SIGFPE. The agent's
//! signal handlers get the default control from the kernel, but its code
//! that runs in the program's own context (the exit hook that writes the
//! profile, the code cache's link stub, a thread's set-up, the control
//! thread, which starts with its creator's) does not: one division there
//! killed such a program. [`Default::enter`] switches to the default for
//! the agent's work and gives the program its own back, its sticky
//! exception flags included (so `fetestexcept` sees only the program's).

/// `MXCSR` at reset: every exception masked, round to nearest, no
/// flush-to-zero.
const DEFAULT_MXCSR: u32 = 0x1F80;

/// The program's `MXCSR`, restored when dropped; the default meanwhile.
#[must_use]
pub struct Default(u32);

impl Default {
    /// Switch to the default control until the guard is dropped.
    #[inline]
    pub fn enter() -> Default {
        let mut old = 0u32;
        // SAFETY: stmxcsr writes 4 bytes to `old`; ldmxcsr loads a valid
        // control value (reserved bits clear).
        unsafe {
            std::arch::asm!("stmxcsr [{}]", in(reg) &mut old, options(nostack, preserves_flags));
            std::arch::asm!("ldmxcsr [{}]", in(reg) &DEFAULT_MXCSR, options(nostack, preserves_flags, readonly));
        }
        Default(old)
    }

    /// The default for the rest of this thread (a thread of witch's own).
    pub fn for_good() {
        std::mem::forget(Default::enter());
    }
}

impl Drop for Default {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: the value stmxcsr read, valid for ldmxcsr.
        unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &self.0, options(nostack, preserves_flags, readonly)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mxcsr() -> u32 {
        let mut v = 0u32;
        // SAFETY: stmxcsr writes 4 bytes.
        unsafe { std::arch::asm!("stmxcsr [{}]", in(reg) &mut v, options(nostack, preserves_flags)) };
        v
    }

    fn set(v: u32) {
        // SAFETY: a valid control value.
        unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &v, options(nostack, preserves_flags, readonly)) };
    }

    #[test]
    fn the_agent_s_work_runs_masked_and_the_program_s_control_comes_back() {
        let before = mxcsr();
        // Every exception unmasked (as feenableexcept(FE_ALL_EXCEPT)), round down.
        let program = (before & !0x1F80 & !0x3F) | 0x2000;
        set(program);
        {
            let _g = Default::enter();
            assert_eq!(mxcsr() & !0x3F, DEFAULT_MXCSR);
            // Inexact and divide-by-zero: would trap under the program's control.
            let third = std::hint::black_box(1.0f64) / std::hint::black_box(3.0);
            let inf = std::hint::black_box(1.0f64) / std::hint::black_box(0.0);
            assert!(third > 0.3 && inf.is_infinite());
        }
        assert_eq!(mxcsr(), program, "the program's control and flags come back as they were");
        set(before);
    }
}
