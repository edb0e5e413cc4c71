//! The agent's allocator: the C library's `malloc`, except while a crash
//! handler writes the profile.
//!
//! A fatal signal may arrive while the program is inside `malloc`, holding
//! its lock (glibc aborts from inside `free` on heap corruption, for one).
//! Writing the profile allocates; through `malloc` it would wait on that
//! lock forever. So [`enter_crash_mode`] switches every allocation of the
//! agent's code to a region mapped for the purpose (`mmap` is a plain
//! system call) and makes frees of `malloc`'s blocks no-ops: the process is
//! about to die, nothing needs to be given back.

//!
//! It also checks the rule that signal handlers never allocate: with
//! `WITCH_CHECK_HANDLER_ALLOC=1` (tests), every allocation made while a
//! thread runs the engine's handler code ([`in_handler`]) is counted, and the
//! profile says how many there were.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

pub struct AgentAlloc;

#[global_allocator]
static ALLOC: AgentAlloc = AgentAlloc;

/// Size of the crash-mode region (mapped only when needed, and lazily
/// backed: only what the profile needs becomes memory).
const ARENA: usize = 1 << 30;

static CRASH: AtomicBool = AtomicBool::new(false);
static BASE: AtomicUsize = AtomicUsize::new(0);
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// From now on, allocate from the crash region and never call `free`.
/// Async-signal-safe. False if the region could not be mapped (then
/// allocations still go to `malloc`).
pub fn enter_crash_mode() -> bool {
    if BASE.load(Ordering::Acquire) == 0 {
        // A fresh anonymous mapping in witch's own region, owned by this
        // module for the rest of the process.
        let p = witchcraft::sys::mem::map_own(ARENA, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_NORESERVE);
        if p == libc::MAP_FAILED {
            return false;
        }
        if BASE.compare_exchange(0, p as usize, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            NEXT.store(p as usize, Ordering::Release);
        } else {
            // SAFETY: our own mapping, lost the race to publish it.
            unsafe { witchcraft::sys::mem::unmap_own(p, ARENA) };
        }
    }
    CRASH.store(true, Ordering::Release);
    true
}

pub fn in_crash_mode() -> bool {
    CRASH.load(Ordering::Acquire)
}

/// Count allocations made inside handlers (see the module comment).
static CHECK: AtomicBool = AtomicBool::new(false);
static IN_HANDLERS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread runs handler code now (preloaded agents only: an
    /// attached agent never touches its TLS in a handler).
    static HANDLING: Cell<bool> = const { Cell::new(false) };
}

/// Start counting allocations made inside handlers.
pub fn check_handlers() {
    CHECK.store(true, Ordering::Release);
}

/// Run handler code `f`, counting any allocation it makes (when checking).
pub fn in_handler<R>(f: impl FnOnce() -> R) -> R {
    if !CHECK.load(Ordering::Relaxed) {
        return f();
    }
    let outer = HANDLING.with(|h| h.replace(true));
    let r = f();
    HANDLING.with(|h| h.set(outer));
    r
}

/// Allocations counted inside handlers so far.
pub fn allocations_in_handlers() -> u64 {
    IN_HANDLERS.load(Ordering::Relaxed)
}

/// In a fork child: the allocations counted so far were its parent's.
pub fn after_fork() {
    IN_HANDLERS.store(0, Ordering::Relaxed);
}

fn count_if_handling() {
    if CHECK.load(Ordering::Relaxed) && HANDLING.with(|h| h.get()) {
        IN_HANDLERS.fetch_add(1, Ordering::Relaxed);
    }
}

fn in_arena(p: *mut u8) -> bool {
    let base = BASE.load(Ordering::Acquire);
    base != 0 && (p as usize) >= base && (p as usize) < base + ARENA
}

fn bump(layout: Layout) -> *mut u8 {
    let base = BASE.load(Ordering::Acquire);
    let align = layout.align().max(16);
    let mut cur = NEXT.load(Ordering::Acquire);
    loop {
        let start = (cur + align - 1) & !(align - 1);
        let end = start + layout.size().max(1);
        if end > base + ARENA {
            return std::ptr::null_mut();
        }
        match NEXT.compare_exchange_weak(cur, end, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return start as *mut u8,
            Err(now) => cur = now,
        }
    }
}

/// Blocks this large are mappings of the agent's own, in witch's region
/// ([`witchcraft::sys::mem::map_own`]), not `malloc`'s: for blocks this
/// size `malloc` maps memory where the kernel likes, which may be a hole
/// the program made in its own mappings and unmaps later with the rest
/// (an attached agent's tables were lost so).
const OWN_MAPPING: usize = 64 << 10;

fn own_bytes(size: usize) -> usize {
    size.next_multiple_of(4096)
}

/// A block of at least [`OWN_MAPPING`] bytes in witch's region, or null
/// (then `malloc`'s). Page-aligned, so good for any alignment up to 4096.
fn map_block(layout: Layout) -> *mut u8 {
    if layout.size() < OWN_MAPPING || layout.align() > 4096 {
        return std::ptr::null_mut();
    }
    let n = own_bytes(layout.size());
    let p = witchcraft::sys::mem::map_own(n, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_NORESERVE);
    if p == libc::MAP_FAILED {
        return std::ptr::null_mut();
    }
    if !in_own_region(p as *mut u8) {
        // The kernel put it elsewhere: a free could not tell it from
        // `malloc`'s. Given back; `malloc` makes the block.
        // SAFETY: the mapping just made, unused.
        unsafe { witchcraft::sys::mem::unmap_own(p, n) };
        return std::ptr::null_mut();
    }
    p as *mut u8
}

fn in_own_region(p: *mut u8) -> bool {
    let (lo, hi) = witchcraft::sys::mem::own_region();
    (p as u64) >= lo && (p as u64) < hi
}

// SAFETY: every path returns memory of at least `layout.size()` bytes
// aligned to `layout.align()`, or null; blocks are freed only by the
// allocator that made them (malloc's by `free`, the arena's never).
unsafe impl GlobalAlloc for AgentAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_if_handling();
        if CRASH.load(Ordering::Acquire) {
            return bump(layout);
        }
        let own = map_block(layout);
        if !own.is_null() {
            return own;
        }
        if layout.align() <= 16 {
            // SAFETY: plain malloc.
            unsafe { libc::malloc(layout.size().max(1)) as *mut u8 }
        } else {
            let mut p = std::ptr::null_mut();
            // SAFETY: the alignment is a power of two and a multiple of the pointer size.
            let r = unsafe { libc::posix_memalign(&mut p, layout.align(), layout.size().max(1)) };
            if r == 0 {
                p as *mut u8
            } else {
                std::ptr::null_mut()
            }
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        if in_arena(p) || CRASH.load(Ordering::Acquire) {
            return;
        }
        if in_own_region(p) {
            // SAFETY: a block `map_block` mapped, of this layout's size.
            unsafe { witchcraft::sys::mem::unmap_own(p as *mut libc::c_void, own_bytes(layout.size())) };
            return;
        }
        // SAFETY: `p` came from malloc or posix_memalign above.
        unsafe { libc::free(p as *mut libc::c_void) }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_if_handling();
        if in_arena(p) || CRASH.load(Ordering::Acquire) || in_own_region(p) || new_size >= OWN_MAPPING {
            // (A block of witch's region, or one that becomes as large:
            // made anew, copied, and the old one freed by its allocator.)
            // SAFETY: the new layout has the old alignment and a valid size.
            let new = unsafe { self.alloc(Layout::from_size_align_unchecked(new_size, layout.align())) };
            if !new.is_null() {
                // SAFETY: both blocks are at least min(old, new) bytes and
                // distinct; the old one is freed by the allocator that made
                // it (a no-op for the arena's and in crash mode).
                unsafe {
                    std::ptr::copy_nonoverlapping(p, new, layout.size().min(new_size));
                    self.dealloc(p, layout);
                }
            }
            return new;
        }
        if layout.align() <= 16 {
            // SAFETY: `p` came from malloc.
            unsafe { libc::realloc(p as *mut libc::c_void, new_size.max(1)) as *mut u8 }
        } else {
            // SAFETY: as in `alloc`, then the old block is copied and freed by its allocator.
            unsafe {
                let new = self.alloc(Layout::from_size_align_unchecked(new_size, layout.align()));
                if !new.is_null() {
                    std::ptr::copy_nonoverlapping(p, new, layout.size().min(new_size));
                    self.dealloc(p, layout);
                }
                new
            }
        }
    }
}
