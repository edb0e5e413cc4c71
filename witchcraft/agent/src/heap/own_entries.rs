//! The agent's allocation entries as the exact mode's recording windows
//! see them: the definition each calls on to ([`calls_on`]).

use super::{ALIGNED_ALLOC, BOOT_NEXT, CALLOC, FREE, MALLOC, MEMALIGN, POSIX_MEMALIGN, REAL, REALLOC};
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use witchcraft::x86::translate::{NativeCall, NativeCalls, RetArg};

extern "C" {
    fn witch_own_malloc(n: usize) -> *mut c_void;
    fn witch_own_calloc(n: usize, m: usize) -> *mut c_void;
    fn witch_own_realloc(p: *mut c_void, n: usize) -> *mut c_void;
    fn witch_own_free(p: *mut c_void);
    fn witch_own_aligned_alloc(a: usize, n: usize) -> *mut c_void;
    fn witch_own_memalign(a: usize, n: usize) -> *mut c_void;
    fn witch_own_posix_memalign(out: *mut *mut c_void, a: usize, n: usize) -> i32;
    fn witch_attached_malloc(n: usize) -> *mut c_void;
    fn witch_attached_calloc(n: usize, m: usize) -> *mut c_void;
    fn witch_attached_realloc(p: *mut c_void, n: usize) -> *mut c_void;
    fn witch_attached_free(p: *mut c_void);
    fn witch_attached_posix_memalign(out: *mut *mut c_void, a: usize, n: usize) -> i32;
}

/// The allocation entries (preloaded and attached) a window (not a
/// recording one) calls natively and goes on after, each with the function
/// a native call runs for it: `free` itself, or the agent's allocation
/// function that the entry calls with its own return address, given the
/// program's ([`witchcraft::x86::translate::NativeCall`]), so a tracked
/// block is named by the program's call as natively. `aligned_alloc` and
/// `memalign` (whose function takes another first argument) leave the
/// window as before.
pub(crate) fn native_calls() -> NativeCalls {
    use RetArg::*;
    let e = |pc: *const (), function: *const (), ret| NativeCall { pc: pc as u64, function: function as u64, ret };
    let (malloc, calloc) = (super::witch_heap_malloc as *const (), super::witch_heap_calloc as *const ());
    let (realloc, posix_memalign) = (super::witch_heap_realloc as *const (), super::witch_heap_posix_memalign as *const ());
    NativeCalls::of(&[
        e(witch_own_malloc as *const (), malloc, Rsi),
        e(witch_own_calloc as *const (), calloc, Rdx),
        e(witch_own_realloc as *const (), realloc, Rdx),
        e(witch_own_free as *const (), witch_own_free as *const (), None),
        e(witch_own_posix_memalign as *const (), posix_memalign, Rcx),
        e(witch_attached_malloc as *const (), malloc, Rsi),
        e(witch_attached_calloc as *const (), calloc, Rdx),
        e(witch_attached_realloc as *const (), realloc, Rdx),
        e(witch_attached_free as *const (), witch_attached_free as *const (), None),
        e(witch_attached_posix_memalign as *const (), posix_memalign, Rcx),
    ])
}

/// The definition the agent's allocation entry at `pc` calls on to, for
/// the exact mode's recording windows to run instead
/// ([`witchcraft::engine::Engine::calls_on`]): the same call without the
/// agent's books of heap blocks, which the exact mode does not use (it
/// names no heap objects). `free` and `realloc` only while no block of
/// the static region exists nor can (every next definition known: the
/// region serves only calls made before), since the agent's own entries
/// must take those blocks. Async-signal-safe: atomics only.
pub(crate) fn calls_on(pc: u64) -> Option<u64> {
    let entries: [(u64, usize); 7] = [
        (witch_own_malloc as *const () as u64, MALLOC),
        (witch_own_calloc as *const () as u64, CALLOC),
        (witch_own_realloc as *const () as u64, REALLOC),
        (witch_own_free as *const () as u64, FREE),
        (witch_own_aligned_alloc as *const () as u64, ALIGNED_ALLOC),
        (witch_own_memalign as *const () as u64, MEMALIGN),
        (witch_own_posix_memalign as *const () as u64, POSIX_MEMALIGN),
    ];
    let &(_, i) = entries.iter().find(|e| e.0 == pc)?;
    if matches!(i, FREE | REALLOC) && (BOOT_NEXT.load(Ordering::Acquire) != 0 || REAL.iter().any(|r| r.load(Ordering::Acquire).is_null())) {
        return None;
    }
    let f = REAL[i].load(Ordering::Acquire);
    (!f.is_null()).then_some(f as u64)
}
