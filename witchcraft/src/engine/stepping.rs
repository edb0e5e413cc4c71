//! What single-stepping a burst rests on: the trap flag in the interrupted
//! context, the ticks at which a burst may not begin ([`refusal`]), whose
//! time an instruction leaves behind ([`foreign_time`]), and which access
//! of a stepped instruction an armed debug register would see
//! ([`trapping`], [`Intercept`]).
//!
//! A burst never steps an instruction that could let the trap flag leak or
//! be seen (`pushf`, `popf`), enter the kernel (`syscall`, `int`), or change
//! how traps are delivered; it ends just before one. It never starts when the
//! program blocks SIGTRAP, or already single-steps itself.

use crate::craft::Verdict;
use crate::sys::perf::BpType;
use crate::x86::decode::{Access, Decoded};

/// The trap flag in EFLAGS.
const TF: i64 = 0x100;

/// Whose time a tick landed after, when not the program's.
pub(super) enum Foreign {
    Hypervisor,
    Kernel,
}

/// Why a tick did not begin a burst.
pub(super) enum Refusal {
    /// SIGTRAP is blocked where the program resumes: a step would kill it.
    Blocked,
    /// The program single-steps itself.
    Stepping,
}

/// # Safety
/// `uc` must be the context the kernel passed to the signal handler.
pub(super) unsafe fn refusal(uc: *const libc::ucontext_t) -> Option<Refusal> {
    // SAFETY: forwarded from the caller; sigismember only reads the set.
    unsafe {
        if libc::sigismember(&(*uc).uc_sigmask, libc::SIGTRAP) == 1 {
            return Some(Refusal::Blocked);
        }
        if (*uc).uc_mcontext.gregs[libc::REG_EFL as usize] & TF != 0 {
            return Some(Refusal::Stepping);
        }
    }
    None
}

/// Whose time an instruction starting with `code` leaves behind it, when
/// not the program's: `cpuid` exits to the hypervisor in a virtual
/// machine; `syscall`, `sysenter` and `int 0x80` enter the kernel.
pub(super) fn foreign_time(code: &[u8]) -> Option<Foreign> {
    match code {
        [0x0f, 0xa2, ..] => Some(Foreign::Hypervisor),
        [0x0f, 0x05, ..] | [0x0f, 0x34, ..] | [0xcd, 0x80, ..] => Some(Foreign::Kernel),
        _ => None,
    }
}

/// # Safety
/// `uc` must be the context the kernel passed to the signal handler.
pub(super) unsafe fn set_trap_flag(uc: *mut libc::ucontext_t, on: bool) {
    // SAFETY: forwarded from the caller.
    let efl = unsafe { &mut (*uc).uc_mcontext.gregs[libc::REG_EFL as usize] };
    if on {
        *efl |= TF;
    } else {
        *efl &= !TF;
    }
}

/// Does access `a` make a debug register of type `ty` on [addr, addr+len) fire?
pub(super) fn fires(ty: BpType, a: &Access, addr: u64, len: u64) -> bool {
    a.overlap(addr, len) > 0 && (ty == BpType::RW || a.write)
}

/// The access of `d` that a debug register on [addr, addr+len) would see
/// first: a load before a store in the same instruction (`add [m], r`).
pub(super) fn trapping(d: &Decoded, ty: BpType, addr: u64, len: u64) -> Option<Access> {
    let mut best: Option<Access> = None;
    for a in d.accesses().iter().filter(|a| fires(ty, a, addr, len)) {
        match best {
            Some(b) if b.read => {}
            _ => best = Some(*a),
        }
    }
    best
}

/// An access to bytes an armed debug register watches, made by the
/// instruction about to run; the register was disabled before it ran.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Intercept {
    pub(super) access: Access,
    pub(super) trap_ctx: u32,
    /// Judged before the instruction ran (no value needed after it).
    pub(super) verdict: Option<Verdict>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foreign_time_is_read_from_the_two_bytes_of_the_instruction() {
        assert!(matches!(foreign_time(&[0x0f, 0xa2, 0x48]), Some(Foreign::Hypervisor)));
        for code in [[0x0f, 0x05], [0x0f, 0x34], [0xcd, 0x80]] {
            assert!(matches!(foreign_time(&code), Some(Foreign::Kernel)), "{code:x?}");
        }
        // `int 3`, `ud2`, a lone byte, and `cpuid`'s bytes the other way round.
        for code in [&[0xcd, 0x03][..], &[0x0f, 0x0b], &[0x0f], &[0xa2, 0x0f]] {
            assert!(foreign_time(code).is_none(), "{code:x?}");
        }
    }
}
