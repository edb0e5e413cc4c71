//! The calling thread: its id, its clocks, signals to a thread of this
//! process. Raw system calls only (and the vDSO's clocks while the
//! time-stamp counter may be read), so all of it is async-signal-safe.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// Send `sig` to thread `tid` of this process.
pub fn tgkill(tid: i32, sig: i32) -> bool {
    // SAFETY: plain system call; a wrong tid fails with ESRCH.
    unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, sig) == 0 }
}

/// Set the calling thread's signal mask to `set`, with the system call
/// itself (a preloaded agent's `sigprocmask` would leave its own signals
/// out).
pub fn set_signal_mask(set: &libc::sigset_t) {
    set_kernel_mask(set as *const libc::sigset_t as *const u64);
}

/// The calling thread's signal mask (a kernel set), asked with the
/// `syscall` instruction itself (see [`set_kernel_mask`]). Async-signal-safe.
pub fn blocked_now() -> u64 {
    let mut set = 0u64;
    // SAFETY: the kernel writes 8 bytes into `set`, a local, and reads no set (null);
    // it clobbers rcx and r11 and touches no stack.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") libc::SYS_rt_sigprocmask => _,
            in("rdi") libc::SIG_BLOCK as u64,
            in("rsi") 0u64,
            in("rdx") &mut set as *mut u64,
            in("r10") 8u64,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    set
}

/// `rt_sigprocmask(SIG_SETMASK, mask, NULL, 8)` with the `syscall`
/// instruction itself: in a preloaded process the `syscall` function the
/// agent's own calls bind to is the agent's, which leaves witch's signals
/// out of the masks the program sets (these masks are witch's, for the
/// program's handlers). Async-signal-safe.
pub fn set_kernel_mask(mask: *const u64) {
    // SAFETY: the kernel reads 8 bytes at `mask` (the caller's valid set)
    // and writes nothing; it clobbers rcx and r11 and touches no stack.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") libc::SYS_rt_sigprocmask => _,
            in("rdi") libc::SIG_SETMASK as u64,
            in("rsi") mask,
            in("rdx") 0u64,
            in("r10") 8u64,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
}

/// Is `tid` a thread of this process? (A signal 0 to it: a system call.)
pub fn is_own_thread(tid: i32) -> bool {
    tid > 0 && tgkill(tid, 0)
}

/// A pidfd for process `pid` (close-on-exec): it names that process, not
/// whatever reuses the number, and polls readable once it has exited. The
/// errno if none.
pub fn pidfd_open(pid: i32) -> Result<i32, i32> {
    // SAFETY: plain system call; the result is a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    if fd < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::ESRCH));
    }
    Ok(fd)
}

/// Has the process of pidfd `fd` exited? (Without waiting.)
pub fn pidfd_exited(fd: i32) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, 0) > 0 && p.revents & libc::POLLIN != 0 }
}

/// `prctl` options for the time-stamp counter (linux/prctl.h; the libc
/// crate has none for Linux).
pub const PR_GET_TSC: i32 = 25;
pub const PR_SET_TSC: i32 = 26;
/// The counter read faults with SIGSEGV (`PR_SET_TSC`'s argument).
pub const PR_TSC_SIGSEGV: libc::c_ulong = 2;
/// Syscall user dispatch (linux/prctl.h): the thread's system calls from
/// outside one range of code raise SIGSYS whenever a byte of the
/// program's says so (emulators, Wine among them, catch a guest's calls
/// so); `PR_SYS_DISPATCH_ON` turns it on.
pub const PR_SET_SYSCALL_USER_DISPATCH: i32 = 59;
pub const PR_SYS_DISPATCH_ON: libc::c_ulong = 1;

/// Set once a thread of this process may have made the time-stamp counter
/// fault (`prctl(PR_SET_TSC, PR_TSC_SIGSEGV)`, as replay tools and some
/// sandboxes do): from then on no clock here reads it, neither with
/// `rdtsc` nor through the vDSO's `clock_gettime`, which reads it too.
/// Natively such a program runs as long as it reads no clock itself; a
/// read of ours in its handlers would kill it.
static COUNTER_OFF: AtomicBool = AtomicBool::new(false);

/// Cycles of the time-stamp counter a ns (an `f64`'s bits): what
/// [`cycles`] counts in once the counter is off. 1.0 until the agent
/// measures the counter's rate ([`set_cycle_rate`]).
static CYCLES_PER_NS: AtomicU64 = AtomicU64::new(0x3FF0_0000_0000_0000);

/// A thread may be about to turn the counter off: no clock reads it again.
pub fn counter_off() {
    COUNTER_OFF.store(true, Ordering::Relaxed);
}

/// Note whether the calling thread can read the counter (an agent
/// attached to a process that turned it off, a thread set up).
pub fn note_counter() {
    let mut state: libc::c_int = 0;
    // SAFETY: PR_GET_TSC writes one int through the pointer.
    let r = unsafe { libc::syscall(libc::SYS_prctl, PR_GET_TSC, &mut state as *mut libc::c_int, 0, 0, 0) };
    if r == 0 && state as libc::c_ulong == PR_TSC_SIGSEGV {
        counter_off();
    }
}

/// The counter's rate as measured (ns a cycle), for [`cycles`] without it.
pub fn set_cycle_rate(ns_per_cycle: f64) {
    if ns_per_cycle.is_finite() && ns_per_cycle > 0.0 {
        CYCLES_PER_NS.store((1.0 / ns_per_cycle).to_bits(), Ordering::Relaxed);
    }
}

/// Clock `id` in ns: through the vDSO, or with the system call itself
/// once the counter is off.
fn clock_ns(id: libc::clockid_t) -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    if COUNTER_OFF.load(Ordering::Relaxed) {
        // SAFETY: `t` is a valid timespec to write.
        unsafe { libc::syscall(libc::SYS_clock_gettime, id, &mut t as *mut libc::timespec) };
    } else {
        // SAFETY: `t` is a valid timespec to write.
        unsafe { libc::clock_gettime(id, &mut t) };
    }
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// This thread's CPU time in ns.
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// Monotonic time in ns.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// Wall-clock time in ns since the epoch.
pub fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

/// The time-stamp counter: a cheap clock for short spans on one thread
/// (no system call), in cycles; the agent measures its rate against
/// the monotonic clock at start-up (`Costs::ns_per_cycle`). Once the
/// counter is off, the monotonic clock in cycles at that rate.
pub fn cycles() -> u64 {
    if COUNTER_OFF.load(Ordering::Relaxed) {
        return (monotonic_ns() as f64 * f64::from_bits(CYCLES_PER_NS.load(Ordering::Relaxed))) as u64;
    }
    // SAFETY: rdtsc has no preconditions on x86-64 (and the counter is on).
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// A deadline on the monotonic clock. `std::time::Instant` reads the
/// time-stamp counter through the vDSO, which faults once a program turned
/// the counter off (see [`counter_off`]); this reads [`monotonic_ns`].
#[derive(Clone, Copy, Debug)]
pub struct Deadline(u64);

impl Deadline {
    /// `d` from now.
    pub fn after(d: std::time::Duration) -> Deadline {
        Deadline(monotonic_ns().saturating_add(d.as_nanos().min(u64::MAX as u128) as u64))
    }

    /// The time left (zero once passed).
    pub fn left(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.0.saturating_sub(monotonic_ns()))
    }

    pub fn passed(&self) -> bool {
        monotonic_ns() >= self.0
    }
}

/// The calling process's id (a system call: async-signal-safe, and right
/// in a fork child).
pub fn getpid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}
