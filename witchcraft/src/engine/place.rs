//! Where a thread lives: its stacks and segment bases, which the handlers
//! need to read its registers and to unwind it.

/// Where the thread lives: its stacks and segment bases.
#[derive(Clone, Copy, Debug, Default)]
pub struct Place {
    pub stack: (u64, u64),
    /// The alternate signal stack the handlers run on (the agent owns it;
    /// the engine only keeps samples off it).
    pub alt_stack: (u64, u64),
    pub fs_base: u64,
    pub gs_base: u64,
}

impl Place {
    /// The calling thread's place, given its stack and alternate stack:
    /// its segment bases are read now. Only system calls, so a signal
    /// handler may call it.
    pub fn here(stack: (u64, u64), alt_stack: (u64, u64)) -> Place {
        const ARCH_GET_FS: i32 = 0x1003;
        const ARCH_GET_GS: i32 = 0x1004;
        Place { stack, alt_stack, fs_base: arch_prctl_get(ARCH_GET_FS), gs_base: arch_prctl_get(ARCH_GET_GS) }
    }
}

/// The calling thread's stack, from the thread library (not for signal
/// handlers: it may allocate).
pub fn thread_stack() -> (u64, u64) {
    // SAFETY: pthread_getattr_np fills `attr`, which is destroyed after use.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return (0, 0);
        }
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        (addr as u64, addr as u64 + size as u64)
    }
}

fn arch_prctl_get(code: i32) -> u64 {
    let mut v: u64 = 0;
    // SAFETY: ARCH_GET_FS/GS write one u64.
    unsafe { libc::syscall(libc::SYS_arch_prctl, code, &mut v as *mut u64) };
    v
}
