//! The program's own `syscall(2)` calls: preloaded, the agent's `syscall`
//! is the one the program calls; attached, the program's import of it
//! leads here (`imports.rs`). Before the call goes in, the agent does what
//! the call needs ([`before_syscall`]: a sandbox or a program's own
//! breakpoints end profiling first, and so on; `prctl`'s interposer, in
//! `interpose.rs`, shares the sandboxes'); and a
//! `rt_sigaction` made this way goes through the agent's `sigaction`, as
//! the C library's would ([`crate::dispositions::kernel_sigaction`]): the
//! kernel's call would have put the program's handler in place of the
//! agent's, whose next trap in the code cache killed the program; a
//! `rt_sigprocmask` leaves the agent's signals out, as its `sigprocmask`
//! does.

use crate::attach_state::{Leave, SESSION};
use crate::leave;
use crate::state::{preloaded, Mode, AGENT};
use crate::symbols::keeping_errno;
use std::sync::atomic::{AtomicPtr, Ordering};
use witchcraft::sys::task;

/// The `syscall` the program's own calls bind to (attached).
pub(crate) static REAL_SYSCALL: AtomicPtr<libc::c_void> = AtomicPtr::new(std::ptr::null_mut());

/// `seccomp` operations and `prctl` modes that install a filter or strict
/// mode (`SECCOMP_SET_MODE_STRICT`, `SECCOMP_SET_MODE_FILTER`;
/// `SECCOMP_MODE_STRICT`, `SECCOMP_MODE_FILTER`).
const SECCOMP_SET_MODES: [libc::c_long; 2] = [0, 1];
/// The sandboxes a program can put itself in, as the profile names them.
const SECCOMP_SYSCALL: &str = "a seccomp sandbox (seccomp)";
pub(crate) const SECCOMP_PRCTL: &str = "a seccomp sandbox (prctl PR_SET_SECCOMP)";
/// Syscall user dispatch is a filter of another kind: the thread's system
/// calls raise SIGSYS while a byte of the program's says so, and a
/// handler of witch's that made one then was killed by it.
pub(crate) const DISPATCH: &str = "a sandbox of its system calls (syscall user dispatch: prctl PR_SET_SYSCALL_USER_DISPATCH)";
pub(crate) const PR_SECCOMP_MODES: [libc::c_ulong; 2] = [1, 2];

/// The program is about to enter a seccomp sandbox: a preloaded agent
/// stops profiling, an attached session ends (`imports.rs` routes the
/// program's calls here).
pub(crate) fn entering_sandbox(how: &'static str) {
    if preloaded() && AGENT.owner_is_me() {
        keeping_errno(|| leave::leave_to_sandbox(how));
    } else if AGENT.mode() == Mode::Attached && keeping_errno(|| SESSION.leave(Leave::Sandbox(how))) {
        // For good: the agent's handlers make no system call from here on.
        AGENT.set_sandboxed();
    }
}

/// `perf_event_open(attr, pid, ...)` of the program's own (witch's own
/// opens make the system call themselves: `sys::perf`) asks for a
/// hardware breakpoint on a thread of this process (`pid` 0, or one of
/// its threads) or on a whole CPU (-1): one the debug registers witch
/// holds would fail with ENOSPC.
fn breakpoint_here(attr: libc::c_long, pid: libc::c_long) -> bool {
    witchcraft::sys::perf::asks_for_breakpoint(attr as u64)
        && (pid <= 0 || i64::from(task::getpid()) == pid || task::is_own_thread(pid as i32))
}

/// The program opens hardware breakpoints of its own: they need the debug
/// registers, so profiling leaves them to it, as to a debugger (a session
/// attached ends; a preloaded agent stops, its profile written).
fn using_breakpoints() {
    if preloaded() && AGENT.owner_is_me() {
        keeping_errno(leave::leave_to_breakpoints);
    } else if AGENT.mode() == Mode::Attached {
        keeping_errno(|| SESSION.leave(Leave::Breakpoints));
    }
}

/// What the agent does before a `syscall(nr, a1, ...)` of the program's
/// (preloaded or attached): `SYS_seccomp` installing a filter or strict
/// mode puts the process in a sandbox.
fn before_syscall(nr: libc::c_long, a1: libc::c_long, a2: libc::c_long) {
    if nr == libc::SYS_seccomp && SECCOMP_SET_MODES.contains(&a1) {
        entering_sandbox(SECCOMP_SYSCALL);
    }
    if nr == libc::SYS_prctl && a1 == libc::PR_SET_SECCOMP as libc::c_long && PR_SECCOMP_MODES.contains(&(a2 as libc::c_ulong)) {
        // As the C library's `prctl` does (`interpose::own_prctl`).
        entering_sandbox(SECCOMP_PRCTL);
    }
    if nr == libc::SYS_perf_event_open && breakpoint_here(a1, a2) {
        using_breakpoints();
    }
    if nr == libc::SYS_prctl && a1 == task::PR_SET_SYSCALL_USER_DISPATCH as libc::c_long && a2 as libc::c_ulong == task::PR_SYS_DISPATCH_ON
    {
        entering_sandbox(DISPATCH);
    }
    if nr == libc::SYS_mprotect || nr == libc::SYS_pkey_mprotect {
        // (Before the call: a patch is written after making code
        // writable, and the call making it executable again comes after.)
        witchcraft::modules::protection_changed(a1 as u64, a2 as u64);
    }
    if nr == libc::SYS_prctl && a1 == task::PR_SET_TSC as libc::c_long {
        // Maybe turning the time-stamp counter off (see `own_prctl`).
        task::counter_off();
    }
}

/// What the agent does with a `syscall` of the program's before (or
/// instead of) the call: Some(result) if it answered it itself.
fn agent_first(nr: libc::c_long, a1: libc::c_long, a2: libc::c_long, a3: libc::c_long, a4: libc::c_long) -> Option<libc::c_long> {
    before_syscall(nr, a1, a2);
    as_sigaction(nr, a1, a2, a3, a4)
}

/// A `rt_sigaction` through `syscall`, answered by the agent's
/// `sigaction` (None: another call).
fn as_sigaction(nr: libc::c_long, a1: libc::c_long, a2: libc::c_long, a3: libc::c_long, a4: libc::c_long) -> Option<libc::c_long> {
    // (The kernel's signal set is 8 bytes; another size is the kernel's to refuse.)
    (nr == libc::SYS_rt_sigaction && a4 == 8).then(|| {
        // SAFETY: the program's pointers, as the kernel would read and write them.
        unsafe { crate::dispositions::kernel_sigaction(a1 as libc::c_int, a2 as *const _, a3 as *mut _) as libc::c_long }
    })
}

/// A `rt_sigprocmask` through `syscall` (the kernel's 8-byte set) is
/// passed on as the C library's `sigprocmask` is
/// ([`crate::dispositions::as_program_asks`]): the set the call should
/// pass, the program's own `set` or its copy in `copy` without the agent's
/// signals, and those the old set the program is told must hold. (Before,
/// a thread that blocked every signal this way was never sampled.) None
/// for another call.
fn as_sigprocmask(
    nr: libc::c_long,
    how: libc::c_long,
    set: libc::c_long,
    size: libc::c_long,
    copy: &mut u64,
) -> Option<(libc::c_long, u64)> {
    if nr != libc::SYS_rt_sigprocmask || size != 8 {
        return None;
    }
    let mut bytes = [0u8; 8];
    // (A set the agent cannot read is the kernel's to refuse: EFAULT.)
    if set != 0 && !witchcraft::sys::mem::read_own(set as u64, &mut bytes) {
        return None;
    }
    let asked = (set != 0).then(|| u64::from_ne_bytes(bytes));
    let (leave_out, before) = crate::dispositions::as_program_asks(how as libc::c_int, asked);
    match asked {
        Some(bits) if bits & leave_out != 0 => {
            *copy = bits & !leave_out;
            Some((copy as *mut u64 as libc::c_long, before))
        }
        _ => Some((set, before)),
    }
}

/// What [`as_sigprocmask`] said the old set must hold goes in it, after
/// the call (`r`: its result, `old`: the program's pointer).
fn old_mask_as_program_set(r: libc::c_long, old: libc::c_long, before: u64) {
    if r == 0 && old != 0 && before != 0 {
        let mut bytes = [0u8; 8];
        if witchcraft::sys::mem::read_own(old as u64, &mut bytes) {
            // SAFETY: the program's old set, 8 bytes the kernel just wrote.
            unsafe { *(old as *mut u64) = u64::from_ne_bytes(bytes) | before };
        }
    }
}

/// `syscall(SYS_seccomp, ...)` (libseccomp's way in) puts the process in a
/// sandbox: the agent leaves first (see the module comment). The call
/// itself is made here as the C library's `syscall` makes it (the number
/// and six arguments into the kernel's registers; a result in -4095..-1 is
/// -errno), not through it: the agent's own handlers call `syscall`, and
/// looking the C library's up (`dlsym`) is not allowed there.
///
/// # Safety
/// As the C library's `syscall`, which reads a number and six arguments
/// whatever the caller passed (unused ones are whatever is in their
/// registers or stack slot, as here).
#[no_mangle]
pub unsafe extern "C" fn syscall(
    nr: libc::c_long,
    a1: libc::c_long,
    a2: libc::c_long,
    a3: libc::c_long,
    a4: libc::c_long,
    a5: libc::c_long,
    a6: libc::c_long,
) -> libc::c_long {
    passed_on(nr, [a1, a2, a3, a4], |a2| {
        let r: libc::c_long;
        // SAFETY: the caller's system call, as it asked for it; the kernel
        // clobbers rcx and r11 and touches no stack.
        unsafe {
            std::arch::asm!(
                "syscall",
                inlateout("rax") nr => r,
                in("rdi") a1, in("rsi") a2, in("rdx") a3, in("r10") a4, in("r8") a5, in("r9") a6,
                lateout("rcx") _, lateout("r11") _,
                options(nostack),
            );
        }
        if (-4095..0).contains(&r) {
            // SAFETY: this thread's errno.
            unsafe { *libc::__errno_location() = -r as libc::c_int };
            return -1;
        }
        r
    })
}

/// A `syscall(nr, a1, ...)` of the program's as the agent passes it on,
/// preloaded or attached: what the agent does first ([`agent_first`],
/// which may answer it), then `call` with the second argument to make it
/// with (a mask without the agent's signals: [`as_sigprocmask`]), and the
/// old mask as the program set it.
fn passed_on(nr: libc::c_long, [a1, a2, a3, a4]: [libc::c_long; 4], call: impl FnOnce(libc::c_long) -> libc::c_long) -> libc::c_long {
    if let Some(r) = agent_first(nr, a1, a2, a3, a4) {
        return r;
    }
    let mut copy = 0u64;
    let masked = as_sigprocmask(nr, a1, a2, a4, &mut copy);
    let r = call(masked.map_or(a2, |m| m.0));
    if let Some((_, before)) = masked {
        old_mask_as_program_set(r, a3, before);
    }
    r
}

type SyscallFn =
    unsafe extern "C" fn(libc::c_long, libc::c_long, libc::c_long, libc::c_long, libc::c_long, libc::c_long, libc::c_long) -> libc::c_long;

/// The program's `syscall`, through its import tables, in an attached
/// process (`imports.rs`): a sandbox about to go in ends the session first;
/// then the call goes on to the definition the program's own calls bind to
/// ([`resolve_for_attached`]).
///
/// # Safety
/// As [`syscall`]; only installed once `resolve_for_attached` found it.
pub(crate) unsafe extern "C" fn attached_syscall(
    nr: libc::c_long,
    a1: libc::c_long,
    a2: libc::c_long,
    a3: libc::c_long,
    a4: libc::c_long,
    a5: libc::c_long,
    a6: libc::c_long,
) -> libc::c_long {
    // SAFETY: the program's own `syscall`, with the arguments it was given
    // (a mask without the agent's signals).
    passed_on(nr, [a1, a2, a3, a4], |a2| unsafe {
        std::mem::transmute::<*mut libc::c_void, SyscallFn>(REAL_SYSCALL.load(Ordering::Acquire))(nr, a1, a2, a3, a4, a5, a6)
    })
}
