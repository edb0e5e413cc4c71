//! The calling thread: its id, its CPU clock, signals to a thread of this
//! process. Raw system calls only, so all of it is async-signal-safe.

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
    // SAFETY: plain system call with a valid set; the kernel's sigset is 8 bytes.
    unsafe {
        libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_SETMASK, set as *const libc::sigset_t, std::ptr::null_mut::<libc::sigset_t>(), 8)
    };
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

/// This thread's CPU time in ns.
pub fn thread_cpu_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Monotonic time in ns.
pub fn monotonic_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The time-stamp counter: a cheap clock for short spans on one thread
/// (no system call), in cycles; the agent measures its rate against
/// the monotonic clock at start-up (`Costs::ns_per_cycle`).
pub fn cycles() -> u64 {
    // SAFETY: rdtsc has no preconditions on x86-64.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// The calling process's id (a system call: async-signal-safe, and right
/// in a fork child).
pub fn getpid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}
