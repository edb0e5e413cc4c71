//! POSIX CPU-time timers (`timer_create` on a thread's CPU clock), the
//! default software sampler.
//!
//! Why not perf's `task-clock`: its hrtimer adds a timer interrupt of its
//! own at every period, which in a VM costs a timer exit and a re-arm on top
//! of the signal. A CPU-time timer is checked at the scheduler tick that runs
//! anyway, and costs several times less CPU a sample (`benches/sampler_cost.c`;
//! the numbers in docs/OVERHEAD.md). The price is
//! resolution: the timer fires at tick boundaries (4 ms at HZ=250), so it
//! only serves periods of a tick or more; shorter periods use `task-clock`.
//!
//! Raw system calls only: the attached agent sets timers up inside a signal
//! handler.

/// `si_code` of a POSIX timer's signal.
pub const SI_TIMER: i32 = -2;

/// Shortest period the CPU timer serves; below it the `task-clock` event
/// samples instead. A tick at HZ=250; at HZ=100 a 5 ms timer fires every
/// other 10 ms tick with an overrun, which the program-time weights absorb.
pub const MIN_PERIOD_NS: u64 = 4_000_000;

/// Which of a thread's CPU times a timer counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuTime {
    /// User and system time (`CPUCLOCK_SCHED`, the scheduler's exact sum).
    All,
    /// User time only (`CPUCLOCK_VIRT`): the kernel's work for the thread
    /// (page faults, system calls, our own traps and signals) does not
    /// advance it.
    User,
}

/// The kernel's clock id for thread `tid`'s CPU time
/// (`MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED or CPUCLOCK_VIRT)`).
fn thread_clock(tid: i32, which: CpuTime) -> libc::clockid_t {
    const CPUCLOCK_PERTHREAD_MASK: i32 = 4;
    const CPUCLOCK_VIRT: i32 = 1;
    const CPUCLOCK_SCHED: i32 = 2;
    let kind = match which {
        CpuTime::All => CPUCLOCK_SCHED,
        CpuTime::User => CPUCLOCK_VIRT,
    };
    (!tid << 3) | CPUCLOCK_PERTHREAD_MASK | kind
}

/// A stopped timer on thread `tid`'s CPU time that, once started, sends
/// `sig` to that thread with `tag` as `si_value`. Returns the timer id or
/// an errno.
pub fn create(tid: i32, which: CpuTime, sig: i32, tag: u64) -> Result<i32, i32> {
    // SAFETY: sigevent is plain integers and a union of them and pointers;
    // all zeroes is a valid value.
    let mut ev: libc::sigevent = unsafe { std::mem::zeroed() };
    ev.sigev_value = libc::sigval { sival_ptr: tag as *mut libc::c_void };
    ev.sigev_signo = sig;
    ev.sigev_notify = libc::SIGEV_THREAD_ID;
    ev.sigev_notify_thread_id = tid;
    let mut id: libc::c_int = -1;
    // SAFETY: both pointers are to locals that outlive the call: the kernel
    // reads a sigevent (libc's layout is the kernel's, sigev_notify_thread_id
    // at 16 of 64 bytes) and writes a kernel timer_t, which is an int. A raw
    // system call, no libc state: async-signal-safe.
    let r = unsafe {
        libc::syscall(libc::SYS_timer_create, thread_clock(tid, which), &mut ev as *mut libc::sigevent, &mut id as *mut libc::c_int)
    };
    if r != 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL))
    } else {
        Ok(id)
    }
}

/// Fire every `period_ns` of the thread's CPU time; 0 stops it.
pub fn set(id: i32, period_ns: u64) -> bool {
    set_first(id, period_ns, period_ns)
}

/// Fire after `first_ns` of the thread's CPU time, then every `period_ns`.
pub fn set_first(id: i32, first_ns: u64, period_ns: u64) -> bool {
    let spec = |ns: u64| libc::timespec { tv_sec: (ns / 1_000_000_000) as libc::time_t, tv_nsec: (ns % 1_000_000_000) as libc::c_long };
    let it = libc::itimerspec { it_interval: spec(period_ns), it_value: spec(first_ns) };
    id >= 0
        // SAFETY: the kernel reads `it`, a local; no old value is asked for
        // (null). A bad id fails with EINVAL. Async-signal-safe (raw syscall).
        && unsafe {
            libc::syscall(libc::SYS_timer_settime, id, 0, &it as *const libc::itimerspec, std::ptr::null_mut::<libc::itimerspec>())
        } == 0
}

/// Stop the timer; the thread CPU time it had left until it would have
/// fired (0 if it was stopped, or on failure).
pub fn stop_left(id: i32) -> u64 {
    // SAFETY: itimerspec is plain integers.
    let (zero, mut old): (libc::itimerspec, libc::itimerspec) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    // SAFETY: the kernel reads `zero` and writes `old`, two locals. Async-signal-safe (raw syscall).
    let r = unsafe { libc::syscall(libc::SYS_timer_settime, id, 0, &zero as *const libc::itimerspec, &mut old as *mut libc::itimerspec) };
    if id < 0 || r != 0 {
        return 0;
    }
    old.it_value.tv_sec as u64 * 1_000_000_000 + old.it_value.tv_nsec as u64
}

pub fn delete(id: i32) {
    if id >= 0 {
        // SAFETY: no pointers; a bad id fails with EINVAL.
        unsafe { libc::syscall(libc::SYS_timer_delete, id) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A stopped timer says what it had left, which a later start can take.
    #[test]
    fn a_stopped_timer_says_what_it_had_left() {
        // A signal nothing sends: the timer never fires in this test.
        let id = create(crate::sys::task::gettid(), CpuTime::All, libc::SIGRTMIN() + 4, 0).expect("timer_create");
        assert!(set(id, 10_000_000_000));
        let t0 = crate::sys::task::thread_cpu_ns();
        let mut x = 0u64;
        while crate::sys::task::thread_cpu_ns() < t0 + 20_000_000 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
        }
        let left = stop_left(id);
        assert!((9_000_000_000..10_000_000_000).contains(&left), "{left} ns left");
        assert_eq!(stop_left(id), 0, "a stopped timer has nothing left");
        delete(id);
    }

    static TAGGED: AtomicU64 = AtomicU64::new(0);
    /// Expirations the tagged signals stand for: each one, and the
    /// periods that ran out while it waited (`si_overrun`).
    static EXPIRED: AtomicU64 = AtomicU64::new(0);

    extern "C" fn on(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
        // SAFETY: installed with SA_SIGINFO, so `info` is the siginfo_t the
        // kernel passed; any si_code leaves si_value readable as bytes.
        let code = unsafe { (*info).si_code };
        // SAFETY: as above.
        let tag = unsafe { (*info).si_value().sival_ptr } as u64;
        if code == SI_TIMER && tag == 0xabc {
            // SAFETY: a timer's siginfo: si_tid at 16, si_overrun at 20.
            let overrun = unsafe { *((info as *const u8).add(20) as *const i32) };
            TAGGED.fetch_add(1, Ordering::Relaxed);
            EXPIRED.fetch_add(1 + overrun.max(0) as u64, Ordering::Relaxed);
        }
    }

    #[test]
    fn fires_on_this_threads_cpu_time_with_its_tag() {
        let sig = libc::SIGRTMIN() + 3;
        // SAFETY: a zeroed sigaction is valid (empty mask, no flags); the
        // handler only reads its siginfo and bumps an atomic. No other test
        // in this binary uses SIGRTMIN+3.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
        let id = create(crate::sys::task::gettid(), CpuTime::All, sig, 0xabc).expect("timer_create");
        assert!(set(id, 1_000_000));
        // Sleeping uses no CPU time: nothing fires.
        std::thread::sleep(std::time::Duration::from_millis(30));
        assert_eq!(TAGGED.load(Ordering::Relaxed), 0);
        // CPU time: the timer fires (at tick granularity). Periods that run
        // out while a signal waits are its overrun, not signals of their
        // own, and on a loaded machine the kernel may see them late (a
        // loaded CI run got 4 signals in 60 ms, a loaded VM none before the
        // loop ended): spin until 30 periods have expired, for at most
        // 600 ms of CPU time.
        let t0 = crate::sys::task::thread_cpu_ns();
        let mut x = 0u64;
        let mut spent = 0;
        while spent < 600_000_000 && EXPIRED.load(Ordering::Relaxed) < 30 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
            spent = crate::sys::task::thread_cpu_ns() - t0;
        }
        assert!(set(id, 0));
        delete(id);
        let (n, e) = (TAGGED.load(Ordering::Relaxed), EXPIRED.load(Ordering::Relaxed));
        assert!(n >= 1 && e >= 30, "{n} timer signals for {e} expirations in {} ms of CPU time at a 1 ms period", spent / 1_000_000);
    }
}
