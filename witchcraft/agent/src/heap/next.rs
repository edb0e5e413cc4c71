//! The allocation entries' direct way (heap_entry.c): a call the agent
//! keeps no books of (a block smaller than the heap threshold, the
//! `realloc` or `free` of a block it does not track) goes on to the C
//! library's definition as a sibling call, so no frame of the agent's
//! stands between the program and its allocator. A code-cache window that
//! begins inside the allocator (where a program that allocates often
//! spends much of its time) then goes on into the program when it returns,
//! instead of ending at a return into the agent; and the call costs one
//! level less. Each function returns the definition to call, or null for
//! the entry's full way (heap.rs), which keeps the books, resolves the
//! definitions on first use and serves the static region. Async-signal-safe.

use super::{forget, in_boot, wanted, CALLOC, FREE, MALLOC, REAL, REALLOC};
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use witchcraft::heap;

fn next(i: usize) -> *mut c_void {
    REAL[i].load(Ordering::Acquire)
}

/// `malloc`'s definition, unless the block would be tracked.
#[no_mangle]
pub extern "C" fn witch_heap_malloc_next(n: usize) -> *mut c_void {
    if wanted(n) {
        return std::ptr::null_mut();
    }
    next(MALLOC)
}

/// `calloc`'s definition, unless the block would be tracked (or its size
/// overflows: the full way answers that).
#[no_mangle]
pub extern "C" fn witch_heap_calloc_next(n: usize, m: usize) -> *mut c_void {
    match n.checked_mul(m) {
        Some(b) if !wanted(b) => next(CALLOC),
        _ => std::ptr::null_mut(),
    }
}

/// `realloc`'s definition, unless the new block would be tracked or the
/// old one is (the full way forgets it, and puts it back if the call
/// fails) or is the static region's.
#[no_mangle]
pub extern "C" fn witch_heap_realloc_next(p: *mut c_void, n: usize) -> *mut c_void {
    let tracked = !p.is_null() && heap::find(p as u64).is_some();
    if wanted(n) || in_boot(p) || tracked {
        return std::ptr::null_mut();
    }
    next(REALLOC)
}

/// `free`'s definition, the block forgotten if it was tracked; null for
/// the static region's blocks (never freed) or before the definition is
/// known.
#[no_mangle]
pub extern "C" fn witch_heap_free_next(p: *mut c_void) -> *mut c_void {
    if in_boot(p) {
        return std::ptr::null_mut();
    }
    let f = next(FREE);
    if !f.is_null() && !p.is_null() {
        forget(p);
    }
    f
}
