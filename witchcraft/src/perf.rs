//! Thin wrappers over `perf_event_open` for the two event kinds the engine
//! opens itself: data breakpoints (watchpoints) and the software sampler.
//!
//! Signals: watchpoints use `sigtrap` (Linux ≥ 5.13), which delivers
//! SIGTRAP synchronously to the thread that caused the event, with
//! `si_perf_data` = our `sig_data`. The sampler, and watchpoints on older
//! kernels, use the fcntl(F_SETSIG) route: a real-time signal owned by the
//! thread (F_OWNER_TID), identified by `si_fd`.

use perf_event_open_sys as sys;
use sys::bindings::perf_event_attr;

/// `si_code` of a SIGTRAP raised by a perf event with `sigtrap` set.
pub const TRAP_PERF: i32 = 6;
/// `si_perf_flags` bit: the signal was sent while SIGTRAP was blocked, so its
/// context is not the one of the access.
pub const TRAP_PERF_FLAG_ASYNC: u32 = 1;
/// Real-time signal for the sampler, and for traps when sigtrap is unavailable.
pub fn fallback_signal() -> i32 {
    libc::SIGRTMIN() + 7
}

/// Tag in the top half of `sig_data` so we can tell our traps from anyone else's.
pub const SIG_MAGIC: u64 = 0x5749_5443_0000_0000; // "WITC"
pub const SIG_MAGIC_MASK: u64 = 0xffff_ffff_0000_0000;
/// `sig_data` low bits naming the sampler (watchpoint slots use 0..N).
pub const SIG_SAMPLER: u64 = 0xff;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BpType {
    /// Trap on write.
    W,
    /// Trap on read or write (x86 has no read-only data breakpoint).
    RW,
}

fn base_attr(type_: u32) -> perf_event_attr {
    let mut a: perf_event_attr = unsafe { std::mem::zeroed() };
    a.type_ = type_;
    a.size = std::mem::size_of::<perf_event_attr>() as u32;
    a.set_exclude_kernel(1);
    a.set_exclude_hv(1);
    a
}

/// Attribute of a breakpoint at `addr`/`len`; disabled ones park the slot.
pub fn breakpoint_attr(addr: u64, len: u64, ty: BpType, disabled: bool, sigtrap: bool, sig_data: u64) -> perf_event_attr {
    let mut a = base_attr(sys::bindings::PERF_TYPE_BREAKPOINT);
    a.bp_type = match ty {
        BpType::W => sys::bindings::HW_BREAKPOINT_W,
        BpType::RW => sys::bindings::HW_BREAKPOINT_RW,
    };
    a.__bindgen_anon_3.bp_addr = addr;
    a.__bindgen_anon_4.bp_len = len;
    a.__bindgen_anon_1.sample_period = 1;
    a.__bindgen_anon_2.wakeup_events = 1;
    a.set_disabled(disabled as u64);
    if sigtrap {
        a.set_sigtrap(1);
        a.set_remove_on_exec(1);
        a.sig_data = sig_data;
    }
    a
}

/// Attribute of the per-thread `task-clock` sampler (period in ns).
pub fn task_clock_attr(period_ns: u64, sigtrap: bool, sig_data: u64) -> perf_event_attr {
    let mut a = base_attr(sys::bindings::PERF_TYPE_SOFTWARE);
    a.config = sys::bindings::PERF_COUNT_SW_TASK_CLOCK as u64;
    a.__bindgen_anon_1.sample_period = period_ns.max(1000);
    a.__bindgen_anon_2.wakeup_events = 1;
    a.set_disabled(1);
    if sigtrap {
        a.set_sigtrap(1);
        a.set_remove_on_exec(1);
        a.sig_data = sig_data;
    }
    a
}

/// Open an event on the calling thread. Returns the fd or -errno.
pub fn open_on_self(attr: &mut perf_event_attr) -> Result<i32, i32> {
    open_on(attr, 0)
}

/// Open an event on thread `tid` (0: the calling thread). A thread of our
/// own process passes the kernel's ptrace check, `sigtrap` included, so an
/// attached agent can open the events of threads it did not start.
pub fn open_on(attr: &mut perf_event_attr, tid: i32) -> Result<i32, i32> {
    let fd = unsafe { sys::perf_event_open(attr, tid, -1, -1, sys::bindings::PERF_FLAG_FD_CLOEXEC as libc::c_ulong) };
    if fd < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL))
    } else {
        Ok(fd)
    }
}

/// Route overflow notifications of `fd` to `sig` on thread `tid` (pre-sigtrap kernels).
pub fn route_signal_to_thread(fd: i32, sig: i32, tid: i32) -> bool {
    unsafe {
        #[repr(C)]
        struct FOwnerEx {
            type_: libc::c_int,
            pid: libc::pid_t,
        }
        const F_OWNER_TID: libc::c_int = 0;
        const F_SETOWN_EX: libc::c_int = 15;
        const F_SETSIG: libc::c_int = 10;
        let own = FOwnerEx { type_: F_OWNER_TID, pid: tid };
        let fl = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, fl | libc::O_ASYNC) == 0
            && libc::fcntl(fd, F_SETSIG, sig) == 0
            && libc::fcntl(fd, F_SETOWN_EX, &own as *const FOwnerEx) == 0
    }
}

/// Async-signal-safe ioctls.
pub fn enable(fd: i32) -> bool {
    unsafe { sys::ioctls::ENABLE(fd, 0) == 0 }
}
pub fn disable(fd: i32) -> bool {
    unsafe { sys::ioctls::DISABLE(fd, 0) == 0 }
}
/// Re-target an open breakpoint (Linux ≥ 4.19; the Witch authors' patch).
/// A modify with `disabled = 0` also enables it.
pub fn modify(fd: i32, attr: &mut perf_event_attr) -> bool {
    unsafe { sys::ioctls::MODIFY_ATTRIBUTES(fd, attr) == 0 }
}
pub fn close(fd: i32) {
    if fd >= 0 {
        unsafe { libc::close(fd) };
    }
}

/// Kernel-side copy of program memory; never faults and never trips our own
/// user-mode watchpoints (kernel accesses are excluded by `exclude_kernel`).
pub fn read_memory(addr: u64, out: &mut [u8]) -> bool {
    let local = libc::iovec { iov_base: out.as_mut_ptr() as *mut libc::c_void, iov_len: out.len() };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: out.len() };
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    n == out.len() as isize
}

pub fn gettid() -> i32 {
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breakpoint_opens_and_modifies() {
        let x = Box::new([0u64; 4]);
        let a0 = &x[0] as *const u64 as u64;
        let mut attr = breakpoint_attr(a0, 8, BpType::W, true, true, SIG_MAGIC | 1);
        let fd = open_on_self(&mut attr).expect("breakpoint");
        let mut m = breakpoint_attr(a0 + 8, 4, BpType::RW, true, true, SIG_MAGIC | 1);
        assert!(modify(fd, &mut m), "modify attributes");
        close(fd);
    }

    #[test]
    fn read_memory_does_not_fault() {
        let v = 0x1122334455667788u64;
        let mut b = [0u8; 8];
        assert!(read_memory(&v as *const u64 as u64, &mut b));
        assert_eq!(u64::from_ne_bytes(b), v);
        assert!(!read_memory(8, &mut b));
    }
}
