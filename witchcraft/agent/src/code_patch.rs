//! A program that patches its own code. Hot-patching and function-hooking
//! libraries make a module's code writable with `mprotect`, write new
//! instructions over it, and make it executable again; the module map does
//! not change. The code cache's copies of the old instructions would go on
//! running in windows: a test program's patched function returned its old
//! value in a window, and the program's sum came out wrong, every run. So
//! the agent's `mprotect` (and `syscall(SYS_mprotect)`, see `interpose.rs`)
//! tells every thread's cache that module code may have changed
//! ([`witchcraft::modules::protection_changed`]): each empties itself
//! before its next window. Code written without a change of protection
//! (a module whose text is writable already, writes through
//! `/proc/self/mem`) is not seen.

use crate::symbols::next;
use std::ffi::c_void;
use std::sync::atomic::AtomicPtr;

/// The `mprotect` the agent's calls on to: the next definition (preloaded),
/// or the one the program's own calls bind to (attached).
pub(crate) static REAL_MPROTECT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

type MprotectFn = unsafe extern "C" fn(*mut c_void, usize, libc::c_int) -> libc::c_int;

/// `mprotect`: made, then, if it touched a module's code, the copies made
/// of it are stale.
///
/// # Safety
/// As the C library's `mprotect`.
#[no_mangle]
pub unsafe extern "C" fn mprotect(addr: *mut c_void, len: usize, prot: libc::c_int) -> libc::c_int {
    // SAFETY: as this function's.
    unsafe { own_mprotect(addr, len, prot) }
}

/// The agent's `mprotect` by an address of its own (the exported one's
/// address is the C library's when the agent is attached: see
/// `interpose::own_prctl`).
///
/// # Safety
/// As [`mprotect`].
pub(crate) unsafe extern "C" fn own_mprotect(addr: *mut c_void, len: usize, prot: libc::c_int) -> libc::c_int {
    // SAFETY: the C library's mprotect, with its own arguments.
    let r = unsafe { std::mem::transmute::<*mut c_void, MprotectFn>(next(c"mprotect", &REAL_MPROTECT))(addr, len, prot) };
    crate::symbols::keeping_errno(|| witchcraft::modules::protection_changed(addr as u64, len as u64));
    r
}
