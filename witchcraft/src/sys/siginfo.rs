//! What our signals carry, and telling them from everyone else's.
//!
//! - Watchpoints use perf's `sigtrap` (Linux 5.13+): SIGTRAP with
//!   `si_code == TRAP_PERF`, delivered synchronously to the thread that
//!   caused the event, with our tag in `si_perf_data`.
//! - The sampler signals with a real-time signal ([`sampler_signal`]),
//!   never SIGTRAP: standard signals don't queue, so a sample and a trap
//!   arriving together would lose one. A CPU-time timer sends it with our
//!   tag in `si_value` (`si_code == SI_TIMER`); a perf sampler (and
//!   watchpoints before 5.13) through `F_SETSIG`, naming the event in `si_fd`.
//! - Single steps (the trap flag) arrive as SIGTRAP with `TRAP_TRACE`.

/// `si_code` of a single-step trap.
pub const TRAP_TRACE: i32 = 2;
/// `si_code` of a SIGTRAP raised by a perf event with `sigtrap` set.
pub const TRAP_PERF: i32 = 6;
/// `si_code` of a POSIX timer's signal.
pub const SI_TIMER: i32 = -2;
/// `si_perf_flags` bit: the signal was sent while SIGTRAP was blocked, so
/// its context is not the one of the access.
pub const TRAP_PERF_FLAG_ASYNC: u32 = 1;

/// The signal queue's limit (`RLIMIT_SIGPENDING`, `ulimit -i`): how many
/// queued signals the user may have pending at once, all of its processes
/// together; None if unlimited.
pub fn queue_limit() -> Option<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: fills the plain struct.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_SIGPENDING, &mut lim) } == 0;
    (ok && lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

/// The real-time signal of the sampler (and of traps before `sigtrap`).
pub fn sampler_signal() -> i32 {
    libc::SIGRTMIN() + 7
}

/// The sampler's signal as a program names it.
pub fn sampler_signal_name() -> String {
    format!("SIGRTMIN+{}", sampler_signal() - libc::SIGRTMIN())
}

/// Our tag, in the top half of `si_perf_data` / `si_value` ("WITC").
pub const TAG: u64 = 0x5749_5443_0000_0000;
pub const TAG_MASK: u64 = 0xffff_ffff_0000_0000;
/// Tag low bits naming the sampler (watchpoint slots use 0..N).
pub const TAG_SAMPLER: u64 = 0xff;
/// The exact mode's instruction breakpoint, where recording resumes.
pub const TAG_RESUME: u64 = 0xfe;

/// The tag of watchpoint slot `i`.
pub fn slot_tag(i: usize) -> u64 {
    TAG | i as u64
}

/// Where a signal came from, as far as its `siginfo` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A perf event with `sigtrap`: its `sig_data` and `si_perf_flags`.
    Perf { data: u64, flags: u32 },
    /// A POSIX timer: its `si_value`.
    Timer { value: u64 },
    /// An `F_SETSIG` notification from the event with this fd.
    Fd(i32),
    /// A single-step trap.
    Step,
    /// A breakpoint instruction (`int3`) was executed.
    Breakpoint,
    /// Anything else: sent by a process, a fault, the program's own.
    Other,
}

// x86-64 siginfo layout: si_code at 8; the union at 16. Perf traps keep
// si_perf_data at 24 and si_perf_flags at 36 (si_addr at 16); timers keep
// si_value at 24 (si_tid, si_overrun before it); SIGPOLL keeps si_fd at 24
// (si_band at 16).
const UNION_24: usize = 24;
const PERF_FLAGS: usize = 36;
const POLL_IN: i32 = 1;
const POLL_HUP: i32 = 6;

/// Read where signal `sig` came from.
///
/// # Safety
/// `info` must point to the `siginfo_t` the kernel passed to the handler.
pub unsafe fn origin(sig: i32, info: *const libc::siginfo_t) -> Origin {
    let raw = info as *const u8;
    // SAFETY: the caller passes the kernel's siginfo_t, a whole 128 bytes;
    // the handler's own copy on its stack, so nothing else writes it. The
    // reads below take fixed offsets inside it, unaligned: no allocation or
    // locks, so async-signal-safe.
    let code = unsafe { (*info).si_code };
    // SAFETY: `o` is UNION_24 (8 bytes at 24..32 of 128), see above.
    let u64_at = |o: usize| unsafe { std::ptr::read_unaligned(raw.add(o) as *const u64) };
    if sig == libc::SIGTRAP {
        return match code {
            TRAP_PERF => {
                // SAFETY: 4 bytes at 36..40 of the 128-byte siginfo, see above.
                Origin::Perf { data: u64_at(UNION_24), flags: unsafe { std::ptr::read_unaligned(raw.add(PERF_FLAGS) as *const u32) } }
            }
            TRAP_TRACE => Origin::Step,
            // The kernel reports `int3` as SI_KERNEL.
            libc::SI_KERNEL => Origin::Breakpoint,
            _ => Origin::Other,
        };
    }
    match code {
        SI_TIMER => Origin::Timer { value: u64_at(UNION_24) },
        // SAFETY: 4 bytes at 24..28 of the 128-byte siginfo, see above.
        POLL_IN..=POLL_HUP => Origin::Fd(unsafe { std::ptr::read_unaligned(raw.add(UNION_24) as *const i32) }),
        _ => Origin::Other,
    }
}

/// The signal mask a signal frame's context holds, as the kernel keeps it:
/// 64 bits (signal n is bit n - 1). The C library's `sigset_t` is 1024
/// bits, but in a frame only the first word is the mask: the kernel's
/// siginfo follows it, so a whole `sigset_t` must never be written there.
///
/// # Safety
/// `uc` must be the context the kernel passed to a signal handler.
pub unsafe fn frame_mask(uc: *const libc::ucontext_t) -> u64 {
    // SAFETY: the first 8 bytes of uc_sigmask are the kernel's mask.
    unsafe { std::ptr::read_unaligned(std::ptr::addr_of!((*uc).uc_sigmask) as *const u64) }
}

/// Set the mask the thread gets back when the handler returns (see
/// [`frame_mask`]): only the kernel's 64 bits are written.
///
/// # Safety
/// `uc` must be the context the kernel passed to a signal handler.
pub unsafe fn set_frame_mask(uc: *mut libc::ucontext_t, mask: u64) {
    // SAFETY: as in `frame_mask`.
    unsafe { std::ptr::write_unaligned(std::ptr::addr_of_mut!((*uc).uc_sigmask) as *mut u64, mask) };
}

/// Signal `sig`'s bit in a kernel mask.
pub fn mask_bit(sig: i32) -> u64 {
    if (1..=64).contains(&sig) {
        1 << (sig - 1)
    } else {
        0
    }
}

/// Set the calling thread's signal mask to the kernel mask `mask`.
pub fn set_thread_mask(mask: u64) {
    crate::sys::task::set_kernel_mask(&mask);
}

/// The signals pending for the calling thread or its process, as a
/// kernel mask (0 if the call fails). Async-signal-safe: one system call.
pub fn pending() -> u64 {
    let mut set = 0u64;
    // SAFETY: rt_sigpending writes 8 bytes into `set`.
    let r = unsafe { libc::syscall(libc::SYS_rt_sigpending, &mut set as *mut u64, 8usize) };
    if r == 0 {
        set
    } else {
        0
    }
}

/// Take one pending instance of `sig` (blocked, or in its own handler)
/// off the calling thread's queue into `info`, without waiting. False if
/// none is pending. Async-signal-safe: one system call.
pub fn take_pending(sig: i32, info: &mut libc::siginfo_t) -> bool {
    let set = mask_bit(sig);
    let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: the kernel reads 8 bytes of set and the timeout, and writes a siginfo.
    let r = unsafe { libc::syscall(libc::SYS_rt_sigtimedwait, &set as *const u64, info as *mut libc::siginfo_t, &zero, 8usize) };
    r == sig as libc::c_long
}

/// Queue `sig` with `info` (as the kernel gave it: its sender, code and
/// value kept) to the calling thread again. Async-signal-safe: one system
/// call.
pub fn queue_to_self(sig: i32, info: &libc::siginfo_t) -> bool {
    // SAFETY: getpid and gettid have no preconditions; the kernel reads the siginfo.
    unsafe {
        libc::syscall(libc::SYS_rt_tgsigqueueinfo, libc::getpid(), libc::syscall(libc::SYS_gettid), sig, info as *const libc::siginfo_t)
            == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(code: i32, at24: u64, at36: u32) -> libc::siginfo_t {
        // SAFETY: siginfo_t is plain data.
        let mut i: libc::siginfo_t = unsafe { std::mem::zeroed() };
        i.si_code = code;
        let raw = &mut i as *mut libc::siginfo_t as *mut u8;
        // SAFETY: inside the 128-byte siginfo.
        unsafe {
            std::ptr::write_unaligned(raw.add(24) as *mut u64, at24);
            std::ptr::write_unaligned(raw.add(36) as *mut u32, at36);
        }
        i
    }

    #[test]
    fn origins_are_told_apart() {
        // SAFETY: `i` is a whole siginfo_t, as `origin` requires.
        let o = |sig, i: libc::siginfo_t| unsafe { origin(sig, &i) };
        assert_eq!(o(libc::SIGTRAP, info(TRAP_PERF, TAG | 3, 1)), Origin::Perf { data: TAG | 3, flags: 1 });
        assert_eq!(o(libc::SIGTRAP, info(TRAP_TRACE, 0, 0)), Origin::Step);
        assert_eq!(o(libc::SIGTRAP, info(libc::SI_TKILL, 0, 0)), Origin::Other);
        assert_eq!(o(sampler_signal(), info(SI_TIMER, TAG | TAG_SAMPLER, 0)), Origin::Timer { value: TAG | TAG_SAMPLER });
        assert_eq!(o(sampler_signal(), info(POLL_IN, 42, 0)), Origin::Fd(42));
        assert_eq!(o(sampler_signal(), info(libc::SI_QUEUE, 42, 0)), Origin::Other);
    }

    #[test]
    fn real_siginfo_offsets_match() {
        // si_value of a timer signal and si_fd of SIGPOLL, as libc lays them out.
        let i = info(SI_TIMER, 0x1234, 0);
        // SAFETY: reading the union member libc exposes.
        assert_eq!(unsafe { i.si_value().sival_ptr } as u64, 0x1234);
    }
}
