//! `perf_event_open` for the events the engine opens itself: data
//! breakpoints (watchpoints) and the software clocks, through a validating
//! attribute builder ([`Attr`]), and the few ioctls and fcntls around them.
//! How their signals are told apart is in [`super::siginfo`].

use perf_event_open_sys as sys;
use sys::bindings::perf_event_attr;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BpType {
    /// Trap on write.
    W,
    /// Trap on read or write (x86 has no read-only data breakpoint).
    RW,
    /// Trap before executing the instruction at the address.
    X,
}

/// A `perf_event_attr` built by named steps, so call sites say what they
/// ask for (`Attr::breakpoint(a, 8, BpType::W)?.disabled().sigtrap(tag)`)
/// rather than passing rows of booleans. Breakpoints are validated here the
/// way the kernel will (length 1, 2, 4 or 8, naturally aligned), so a bad
/// request fails before the system call.
#[derive(Clone, Copy)]
pub struct Attr(perf_event_attr);

/// What the kernel would refuse in a breakpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttrError {
    /// Not 1, 2, 4 or 8 bytes.
    Length(u64),
    /// Not aligned to its length.
    Alignment { addr: u64, len: u64 },
}

impl std::fmt::Display for AttrError {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            AttrError::Length(l) => write!(f, "a breakpoint watches 1, 2, 4 or 8 bytes, not {l}"),
            AttrError::Alignment { addr, len } => write!(f, "a {len}-byte breakpoint must be {len}-byte aligned ({addr:#x} is not)"),
        }
    }
}

/// The software clocks perf can sample on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SoftwareClock {
    /// The thread's CPU time (`task-clock`).
    Task,
    /// The CPU's clock while the thread runs (`cpu-clock`).
    Cpu,
}

impl Attr {
    fn base(type_: u32) -> Attr {
        // SAFETY: perf_event_attr is plain data; all-zero is its documented default.
        let mut a: perf_event_attr = unsafe { std::mem::zeroed() };
        a.type_ = type_;
        a.size = std::mem::size_of::<perf_event_attr>() as u32;
        a.set_exclude_kernel(1);
        a.set_exclude_hv(1);
        Attr(a)
    }

    /// A data breakpoint on `[addr, addr+len)`, enabled, user mode only,
    /// firing on every access; with [`BpType::X`], an instruction
    /// breakpoint at `addr` (any alignment; `len` is the kernel's, a long).
    pub fn breakpoint(addr: u64, len: u64, ty: BpType) -> Result<Attr, AttrError> {
        let (addr, len) = if ty == BpType::X { (addr, 8) } else { (addr, len) };
        if ty != BpType::X && !matches!(len, 1 | 2 | 4 | 8) {
            return Err(AttrError::Length(len));
        }
        if ty != BpType::X && !addr.is_multiple_of(len) {
            return Err(AttrError::Alignment { addr, len });
        }
        let mut a = Self::base(sys::bindings::PERF_TYPE_BREAKPOINT);
        a.0.bp_type = match ty {
            BpType::W => sys::bindings::HW_BREAKPOINT_W,
            BpType::RW => sys::bindings::HW_BREAKPOINT_RW,
            BpType::X => sys::bindings::HW_BREAKPOINT_X,
        };
        a.0.__bindgen_anon_3.bp_addr = addr;
        a.0.__bindgen_anon_4.bp_len = len;
        a.0.__bindgen_anon_1.sample_period = 1;
        a.0.__bindgen_anon_2.wakeup_events = 1;
        Ok(a)
    }

    /// A software clock sampling every `period_ns` (at least 1 µs), disabled.
    pub fn software_clock(clock: SoftwareClock, period_ns: u64) -> Attr {
        let mut a = Self::base(sys::bindings::PERF_TYPE_SOFTWARE);
        a.0.config = match clock {
            SoftwareClock::Task => sys::bindings::PERF_COUNT_SW_TASK_CLOCK,
            SoftwareClock::Cpu => sys::bindings::PERF_COUNT_SW_CPU_CLOCK,
        } as u64;
        a.0.__bindgen_anon_1.sample_period = period_ns.max(1000);
        a.0.__bindgen_anon_2.wakeup_events = 1;
        a.0.set_disabled(1);
        a
    }

    /// An attribute made elsewhere (the PMU sampler's).
    pub fn from_raw(a: perf_event_attr) -> Attr {
        Attr(a)
    }

    /// Created disabled (a parked watchpoint still holds its debug register).
    pub fn disabled(mut self) -> Attr {
        self.0.set_disabled(1);
        self
    }

    /// Deliver SIGTRAP with `tag` as `si_perf_data` to the thread that
    /// caused the event (Linux 5.13+; implies `remove_on_exec`).
    pub fn sigtrap(mut self, tag: u64) -> Attr {
        self.0.set_sigtrap(1);
        self.0.set_remove_on_exec(1);
        self.0.sig_data = tag;
        self
    }

    pub fn raw(&self) -> &perf_event_attr {
        &self.0
    }

    /// Open on thread `tid` of this process (0: the calling thread). A
    /// thread of our own process passes the kernel's ptrace check, `sigtrap`
    /// included, so an attached agent can open the events of threads it did
    /// not start. Returns the fd or the errno. Async-signal-safe.
    pub fn open(&self, tid: i32) -> Result<i32, i32> {
        let mut a = self.0;
        // SAFETY: `a` is a valid attribute of the size it declares.
        let fd = unsafe { open_raw(&mut a, tid, sys::bindings::PERF_FLAG_FD_CLOEXEC as u64) };
        if fd < 0 {
            return Err(-fd as i32);
        }
        // Out of the program's descriptor range, and remembered as ours ([`super::fd`]).
        let fd = super::fd::place(fd as i32)?;
        super::fd::own_perf(fd);
        Ok(fd)
    }

    /// Re-target open event `fd` to this attribute with one ioctl
    /// (`PERF_EVENT_IOC_MODIFY_ATTRIBUTES`, Linux 4.17+, breakpoints only;
    /// it enables the event unless this attribute is disabled).
    /// Async-signal-safe.
    pub fn modify(&self, fd: i32) -> bool {
        let mut a = self.0;
        // SAFETY: the ioctl reads a valid attribute; a bad fd fails with EBADF.
        unsafe { sys::ioctls::MODIFY_ATTRIBUTES(fd, &mut a) == 0 }
    }
}

/// Route overflow notifications of `fd` to `sig` on thread `tid` (pre-sigtrap kernels).
pub fn route_signal_to_thread(fd: i32, sig: i32, tid: i32) -> bool {
    // SAFETY: fcntl on a descriptor (a bad one fails with EBADF); the only
    // pointer, for F_SETOWN_EX, is to a local laid out as the kernel's
    // `struct f_owner_ex { int type; pid_t pid; }`. fcntl is
    // async-signal-safe, so a handler may route a new thread's events.
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
    // SAFETY: plain ioctl; a bad fd fails with EBADF.
    unsafe { sys::ioctls::ENABLE(fd, 0) == 0 }
}
pub fn disable(fd: i32) -> bool {
    // SAFETY: plain ioctl; a bad fd fails with EBADF.
    unsafe { sys::ioctls::DISABLE(fd, 0) == 0 }
}
/// Close an event opened by [`Attr::open`], unless the program closed it
/// and reused the number ([`super::fd::close_perf`]).
pub fn close(fd: i32) {
    super::fd::close_perf(fd);
}

/// Does the attribute at `addr` (a program's `perf_event_open` argument,
/// unchecked) ask for a hardware breakpoint? Read with the kernel's copy
/// (`process_vm_readv`): a bad pointer is the program's call's to fail.
pub fn asks_for_breakpoint(addr: u64) -> bool {
    let mut ty = [0u8; 4];
    super::mem::read_own(addr, &mut ty) && u32::from_le_bytes(ty) == sys::bindings::PERF_TYPE_BREAKPOINT
}

/// `perf_event_open(attr, tid, -1, -1, flags)` with the `syscall`
/// instruction itself: not through the C library's `syscall`, which a
/// preloaded agent interposes to see the program's own calls (a program
/// that opens hardware breakpoints of its own needs the debug registers:
/// `agent/src/interpose.rs`). The fd, or -errno.
///
/// # Safety
/// `attr` must be a valid attribute of the size it declares.
unsafe fn open_raw(attr: *mut perf_event_attr, tid: i32, flags: u64) -> i64 {
    let r: i64;
    // SAFETY: the caller's attribute; the kernel clobbers rcx and r11 and
    // touches no stack.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") libc::SYS_perf_event_open => r,
            in("rdi") attr, in("rsi") tid as i64, in("rdx") -1i64, in("r10") -1i64, in("r8") flags,
            lateout("rcx") _, lateout("r11") _,
            options(nostack),
        );
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breakpoint_opens_and_modifies() {
        let x = Box::new([0u64; 4]);
        let a0 = &x[0] as *const u64 as u64;
        let fd = Attr::breakpoint(a0, 8, BpType::W).unwrap().disabled().sigtrap(crate::sys::siginfo::TAG | 1).open(0).expect("breakpoint");
        let m = Attr::breakpoint(a0 + 8, 4, BpType::RW).unwrap().disabled().sigtrap(crate::sys::siginfo::TAG | 1);
        assert!(m.modify(fd), "modify attributes");
        close(fd);
    }

    #[test]
    fn breakpoints_are_validated_as_the_kernel_would() {
        assert_eq!(Attr::breakpoint(0x1000, 3, BpType::W).err(), Some(AttrError::Length(3)));
        assert_eq!(Attr::breakpoint(0x1004, 8, BpType::W).err(), Some(AttrError::Alignment { addr: 0x1004, len: 8 }));
        let a = Attr::breakpoint(0x1004, 4, BpType::RW).unwrap();
        assert_eq!((a.raw().disabled(), a.raw().sigtrap()), (0, 0));
        let a = a.disabled().sigtrap(7);
        assert_eq!((a.raw().disabled(), a.raw().sigtrap(), a.raw().remove_on_exec(), a.raw().sig_data), (1, 1, 1, 7));
        let c = Attr::software_clock(SoftwareClock::Task, 10);
        // SAFETY: sample_period and sample_freq share a u64; either reads it.
        assert_eq!((c.raw().disabled(), unsafe { c.raw().__bindgen_anon_1.sample_period }), (1, 1000));
    }
}
