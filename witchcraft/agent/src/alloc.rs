//! The agent's allocator: a heap of its own (dlmalloc over witch's own
//! mappings, never the program's `malloc`: see [`OwnPages`]), except while
//! a crash handler writes the profile.
//!
//! A fatal signal may arrive while a thread is inside the heap, holding its
//! lock (or inside the C library's `malloc`, which the agent's own code
//! may reach through a C library function). Writing the profile allocates;
//! through the heap it could wait on that lock forever. So
//! [`enter_crash_mode`] switches every allocation of the agent's code to a
//! region mapped for the purpose (`mmap` is a plain system call) and makes
//! frees no-ops: the process is about to die, nothing needs to be given
//! back.
//!
//! It also checks the rule that signal handlers never allocate: with
//! `WITCH_CHECK_HANDLER_ALLOC=1` (tests), every allocation made while a
//! thread runs the engine's handler code ([`in_handler`]) is counted, and the
//! profile says how many there were.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::{Cell, UnsafeCell};
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

/// The agent's heap: dlmalloc over mappings of witch's own region
/// ([`witchcraft::sys::mem::map_own`]), never the C library's `malloc`.
///
/// The program's heap is the program's: a block of witch's in its arena
/// moves every block the program allocates after it (the first exact
/// profiles made with the agent loaded and without it disagreed on pairs
/// whose bytes were reused from one block to another), changes when its
/// arena grows, trims or fragments, and the program's own heap bugs would
/// meet witch's data. Mappings of witch's region also stay out of holes the
/// program made in its own mappings (an attached agent's tables were once
/// lost with a hole the program unmapped).
struct OwnPages;

// SAFETY: every region handed out is a fresh private mapping of `size`
// bytes (page-aligned, zeroed), given back only when dlmalloc frees it.
unsafe impl dlmalloc::Allocator for OwnPages {
    fn alloc(&self, size: usize) -> (*mut u8, usize, u32) {
        // In witch's region only: the agent's `munmap` entry spares that
        // region, not a mapping the kernel put elsewhere (in a hole the
        // program made, which it may unmap with the rest). Each try asks
        // further on.
        for _ in 0..4 {
            let p = witchcraft::sys::mem::map_own(size, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_NORESERVE);
            if p == libc::MAP_FAILED {
                break;
            }
            let (lo, hi) = witchcraft::sys::mem::own_region();
            if (p as u64) >= lo && (p as u64) < hi {
                return (p as *mut u8, size, 0);
            }
            // SAFETY: the mapping just made, unused.
            unsafe { witchcraft::sys::mem::unmap_own(p, size) };
        }
        (std::ptr::null_mut(), 0, 0)
    }

    fn remap(&self, _ptr: *mut u8, _old: usize, _new: usize, _can_move: bool) -> *mut u8 {
        // (Not offered: the region's addresses are handed out in order.)
        std::ptr::null_mut()
    }

    fn free_part(&self, ptr: *mut u8, old: usize, new: usize) -> bool {
        // SAFETY: the tail of a region this allocator mapped, which
        // dlmalloc no longer uses.
        unsafe { witchcraft::sys::mem::unmap_own(ptr.add(new) as *mut libc::c_void, old - new) };
        true
    }

    fn free(&self, ptr: *mut u8, size: usize) -> bool {
        // SAFETY: a whole region this allocator mapped, no longer used.
        unsafe { witchcraft::sys::mem::unmap_own(ptr as *mut libc::c_void, size) };
        true
    }

    fn can_release_part(&self, _flags: u32) -> bool {
        true
    }

    fn allocates_zeros(&self) -> bool {
        true
    }

    fn page_size(&self) -> usize {
        4096
    }
}

/// dlmalloc's state, behind [`LOCK`].
struct Heap(UnsafeCell<dlmalloc::Dlmalloc<OwnPages>>);

// SAFETY: the state is only reached under `LOCK` (see `with_heap`).
unsafe impl Sync for Heap {}

static HEAP: Heap = Heap(UnsafeCell::new(dlmalloc::Dlmalloc::new_with_allocator(OwnPages)));

/// Held while a thread is inside dlmalloc, and across `fork` by the
/// forking thread (so a child never inherits the heap half-changed).
/// A spin lock: nothing else of the C library's is needed to take it, and
/// it is never taken in a signal handler (handlers do not allocate; a crash
/// handler allocates from the crash region without it).
static LOCK: AtomicBool = AtomicBool::new(false);

fn lock() {
    let mut spins = 0u32;
    while LOCK.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            // SAFETY: no preconditions.
            unsafe { libc::sched_yield() };
        }
    }
}

fn unlock() {
    LOCK.store(false, Ordering::Release);
}

fn with_heap<R>(f: impl FnOnce(&mut dlmalloc::Dlmalloc<OwnPages>) -> R) -> R {
    lock();
    // SAFETY: `LOCK` is held: no other thread is inside the heap.
    let r = f(unsafe { &mut *HEAP.0.get() });
    unlock();
    r
}

extern "C" fn lock_for_fork() {
    lock();
}

extern "C" fn unlock_after_fork() {
    unlock();
}

/// Hold the heap's lock across `fork` (prepare in the parent, release in
/// both). Registered once per process, before the agent's other fork
/// handlers, so the child's release runs before anything of the agent's
/// allocates in the child.
pub fn keep_across_fork() {
    static DONE: AtomicBool = AtomicBool::new(false);
    if !DONE.swap(true, Ordering::AcqRel) {
        // SAFETY: registers three handlers that only take or release the lock.
        unsafe { libc::pthread_atfork(Some(lock_for_fork), Some(unlock_after_fork), Some(unlock_after_fork)) };
    }
}

// SAFETY: every path returns memory of at least `layout.size()` bytes
// aligned to `layout.align()`, or null; blocks are freed only by the
// allocator that made them (the heap's by dlmalloc, the crash region's
// never).
unsafe impl GlobalAlloc for AgentAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_if_handling();
        if CRASH.load(Ordering::Acquire) {
            return bump(layout);
        }
        // SAFETY: a valid layout, under the heap's lock.
        with_heap(|h| unsafe { h.malloc(layout.size(), layout.align()) })
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_if_handling();
        if CRASH.load(Ordering::Acquire) {
            // (The crash region is a fresh mapping: zeroed.)
            return bump(layout);
        }
        // SAFETY: as in `alloc`.
        with_heap(|h| unsafe { h.calloc(layout.size(), layout.align()) })
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        if in_arena(p) || CRASH.load(Ordering::Acquire) {
            return;
        }
        // SAFETY: `p` came from the heap with this layout.
        with_heap(|h| unsafe { h.free(p, layout.size(), layout.align()) })
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_if_handling();
        if in_arena(p) || CRASH.load(Ordering::Acquire) {
            // SAFETY: the new layout has the old alignment and a valid size.
            let new = unsafe { self.alloc(Layout::from_size_align_unchecked(new_size, layout.align())) };
            if !new.is_null() {
                // SAFETY: both blocks are at least min(old, new) bytes and
                // distinct; the old one is never freed (crash mode).
                unsafe { std::ptr::copy_nonoverlapping(p, new, layout.size().min(new_size)) };
            }
            return new;
        }
        // SAFETY: `p` came from the heap with this layout.
        with_heap(|h| unsafe { h.realloc(p, layout.size(), layout.align(), new_size) })
    }
}
