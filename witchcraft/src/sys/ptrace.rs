//! A traced thread's debug registers, written through ptrace (the
//! single-stepping exact mode, which runs a restartable sequence's critical
//! section natively to one of its exits).

use nix::sys::ptrace;
use nix::unistd::Pid;

/// The debug registers that hold addresses.
pub const ADDRESS_REGISTERS: usize = 4;
/// The control register (enable bits, kinds, lengths).
const DR7: usize = 7;

/// Where debug register `i` is in the thread's `struct user`.
fn offset(i: usize) -> ptrace::AddressType {
    (std::mem::offset_of!(libc::user, u_debugreg) + 8 * i) as ptrace::AddressType
}

/// The stopped, traced thread `pid` stops (SIGTRAP, `TRAP_HWBKPT`) when
/// it is about to run any instruction of `at` (at most
/// [`ADDRESS_REGISTERS`]): execution breakpoints, local to the thread.
/// False if the kernel refused one (the thread keeps none).
pub fn break_at(pid: Pid, at: &[u64]) -> bool {
    if at.is_empty() || at.len() > ADDRESS_REGISTERS {
        return false;
    }
    for (i, &a) in at.iter().enumerate() {
        if ptrace::write_user(pid, offset(i), a as libc::c_long).is_err() {
            return false;
        }
    }
    // A local-enable bit per register; kind 00 (execution) and length 00.
    let dr7: u64 = (0..at.len()).map(|i| 1u64 << (2 * i)).sum();
    ptrace::write_user(pid, offset(DR7), dr7 as libc::c_long).is_ok() || {
        clear(pid);
        false
    }
}

/// Take the thread's breakpoints away.
pub fn clear(pid: Pid) {
    let _ = ptrace::write_user(pid, offset(DR7), 0);
}
