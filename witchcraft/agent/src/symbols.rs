//! The definitions the agent's own functions call on to: the next
//! definition of a C library function after the agent's (whose own
//! interposes it, preloaded), looked up once, and a call made as the
//! program's, with its `errno` kept.

use std::sync::atomic::{AtomicPtr, Ordering};

/// The next definition of `name` after ours.
pub fn next_symbol(name: &std::ffi::CStr) -> *mut libc::c_void {
    // SAFETY: dlsym with a NUL-terminated name.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) }
}

/// The next `name`, looked up once.
pub fn next(name: &std::ffi::CStr, cache: &AtomicPtr<libc::c_void>) -> *mut libc::c_void {
    let mut f = cache.load(Ordering::Relaxed);
    if f.is_null() {
        f = next_symbol(name);
        cache.store(f, Ordering::Relaxed);
    }
    f
}

/// `f` with the caller's errno kept.
pub fn keeping_errno<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: this thread's errno.
    let e = unsafe { *libc::__errno_location() };
    let r = f();
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = e };
    r
}

pub type SigactionFn = unsafe extern "C" fn(libc::c_int, *const libc::sigaction, *mut libc::sigaction) -> libc::c_int;

/// The C library's `sigaction` (ours interposes it, preloaded).
pub fn real_sigaction() -> SigactionFn {
    static REAL: AtomicPtr<libc::c_void> = AtomicPtr::new(std::ptr::null_mut());
    let mut f = REAL.load(Ordering::Relaxed);
    if f.is_null() {
        f = next_symbol(c"sigaction");
        REAL.store(f, Ordering::Relaxed);
    }
    // SAFETY: the next `sigaction` in link order has this signature.
    unsafe { std::mem::transmute::<*mut libc::c_void, SigactionFn>(f) }
}
