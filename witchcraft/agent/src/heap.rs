//! Heap blocks as data objects: the allocation functions (`malloc`,
//! `calloc`, `realloc`, `reallocarray`, `free`, `aligned_alloc`, `memalign`,
//! `posix_memalign`, and `mmap`/`munmap`/`mremap` of anonymous memory) keep the
//! engine's table of blocks ([`witchcraft::heap`]) for the handlers to name
//! the object of a watched address.
//!
//! The entries are C (`heap_entry.c`: they pass their return address, the
//! call site that names the allocation); they call the `witch_heap_*`
//! functions here, which call on to the definitions the program's calls
//! would reach without the agent ([`REAL`]) and record the result:
//!
//! - only blocks of at least the threshold (`--heap-threshold`; cheap test
//!   first, so small allocations cost one compare) and only those the
//!   program asked for (not the agent's own, whose call sites are the
//!   agent's code);
//! - `free`, `realloc`, `munmap` and `mremap` forget the block *before*
//!   it is given back (afterwards another thread may be handed the same
//!   address and record it); a call that fails puts the old block back.
//!   `munmap` forgets the bytes it unmaps, whatever blocks they are in:
//!   a block partly unmapped keeps the rest under its site
//!   ([`heap::Table::trim`]). `mremap` tracks the mapping at its new
//!   place, at its new size, under the site of the block that held its
//!   old address;
//! - nothing here allocates, locks or touches thread-local storage: the
//!   table is atomics over reserved memory, so concurrent threads, a
//!   `fork` at any moment, and signal handlers reading meanwhile are safe.
//!   The blocks returned are the allocator's own, so `malloc_usable_size`
//!   and the rest of the allocator's interface see no difference;
//! - the next definitions are looked up (`dlsym`) at the first call; an
//!   allocation made while that lookup runs (the C library's `dlsym` may
//!   allocate) is served from a small static region ([`BOOT`]), whose blocks
//!   `free` ignores;
//! - a program that defines `malloc` in its executable binds to its own: the
//!   entries here are then not reached for those functions, and the agent
//!   changes nothing.
//!
//! Attached (`witch --pid`), the program's import-table entries for these
//! functions are pointed at the hidden twins of the entries (`imports.rs`),
//! which call on to what the program's calls bound to. Blocks allocated
//! before the session are not known (their data is "unknown"); their
//! `free` goes through unchanged.

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use witchcraft::heap::{self, HeapBlock};
use witchcraft::objects::SITE_FRAMES;

const MALLOC: usize = 0;
const CALLOC: usize = 1;
const REALLOC: usize = 2;
const FREE: usize = 3;
const ALIGNED_ALLOC: usize = 4;
const MEMALIGN: usize = 5;
const POSIX_MEMALIGN: usize = 6;
const MMAP: usize = 7;
const MUNMAP: usize = 8;
const MREMAP: usize = 9;

const NAMES: [&CStr; 10] =
    [c"malloc", c"calloc", c"realloc", c"free", c"aligned_alloc", c"memalign", c"posix_memalign", c"mmap", c"munmap", c"mremap"];

/// The definitions the entries call on to.
static REAL: [AtomicPtr<c_void>; 10] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 10];
/// Some thread is looking them up.
static RESOLVING: AtomicBool = AtomicBool::new(false);

/// The agent's own code (its allocations are not the program's).
static OWN: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// The agent's loaded image (its code, data and bss) and those loaded with
/// it ([`crate::symbols::own_images`]): start and end of each.
static IMAGES: [[AtomicU64; 2]; crate::symbols::OWN_IMAGES] =
    [const { [AtomicU64::new(0), AtomicU64::new(0)] }; crate::symbols::OWN_IMAGES];

/// Allocations made while the next definitions are looked up.
const BOOT_BYTES: usize = 64 << 10;
#[repr(C, align(64))]
struct Boot(std::cell::UnsafeCell<[u8; BOOT_BYTES]>);
// SAFETY: disjoint pieces are handed out by an atomic bump pointer.
unsafe impl Sync for Boot {}
static BOOT: Boot = Boot(std::cell::UnsafeCell::new([0; BOOT_BYTES]));
static BOOT_NEXT: AtomicUsize = AtomicUsize::new(0);

fn boot_range() -> (usize, usize) {
    let base = BOOT.0.get() as usize;
    (base, base + BOOT_BYTES)
}

fn in_boot(p: *mut c_void) -> bool {
    let (lo, hi) = boot_range();
    (p as usize) >= lo && (p as usize) < hi
}

/// `n` zero bytes aligned to `align` from the static region, with the size
/// in the 16 bytes before them (for `realloc`), or null when it is used up.
fn boot_alloc(n: usize, align: usize) -> *mut c_void {
    let align = align.max(16);
    let (lo, hi) = boot_range();
    let mut cur = BOOT_NEXT.load(Ordering::Relaxed);
    loop {
        let start = (lo + cur + 16).next_multiple_of(align);
        let Some(end) = start.checked_add(n).filter(|&e| e <= hi) else { return std::ptr::null_mut() };
        match BOOT_NEXT.compare_exchange_weak(cur, end - lo, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => {
                // SAFETY: 16 bytes before `start`, inside the region, ours now.
                unsafe { *((start - 16) as *mut usize) = n };
                return start as *mut c_void;
            }
            Err(now) => cur = now,
        }
    }
}

/// Look the next definitions up (preloaded: the ones after the agent).
/// Returns with them set, unless another thread is at it (or this one,
/// from inside `dlsym`): then the caller makes do without. The preloaded
/// agent calls it at its start, so that a recording window's first call
/// of each goes on to its definition in the cache (`calls_on`) rather
/// than through the entry's own first-call lookup, natively.
pub(crate) fn resolve_next() {
    if RESOLVING.swap(true, Ordering::AcqRel) {
        return;
    }
    for (name, real) in NAMES.iter().zip(&REAL) {
        if real.load(Ordering::Acquire).is_null() {
            // SAFETY: dlsym with a NUL-terminated name.
            let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
            real.store(f, Ordering::Release);
        }
    }
    RESOLVING.store(false, Ordering::Release);
}

fn real(i: usize) -> *mut c_void {
    let f = REAL[i].load(Ordering::Acquire);
    if !f.is_null() {
        return f;
    }
    resolve_next();
    REAL[i].load(Ordering::Acquire)
}

/// Attached: what the program's own calls bind to (its global scope),
/// for the hidden entries to call on to. True when all were found. Not for
/// handlers.
pub(crate) fn resolve_for_attached() -> bool {
    let mut all = true;
    for (name, real) in NAMES.iter().zip(&REAL) {
        if real.load(Ordering::Acquire).is_null() {
            real.store(crate::symbols::global_definition(name), Ordering::Release);
        }
        all &= !real.load(Ordering::Acquire).is_null();
    }
    all
}

extern "C" {
    fn witch_attached_malloc(n: usize) -> *mut c_void;
    fn witch_attached_calloc(n: usize, m: usize) -> *mut c_void;
    fn witch_attached_realloc(p: *mut c_void, n: usize) -> *mut c_void;
    fn witch_attached_reallocarray(p: *mut c_void, n: usize, m: usize) -> *mut c_void;
    fn witch_attached_free(p: *mut c_void);
    fn witch_attached_aligned_alloc(a: usize, n: usize) -> *mut c_void;
    fn witch_attached_memalign(a: usize, n: usize) -> *mut c_void;
    fn witch_attached_posix_memalign(out: *mut *mut c_void, a: usize, n: usize) -> libc::c_int;
    fn witch_attached_mmap(a: *mut c_void, n: usize, p: libc::c_int, f: libc::c_int, fd: libc::c_int, o: libc::off_t) -> *mut c_void;
    fn witch_attached_mmap64(a: *mut c_void, n: usize, p: libc::c_int, f: libc::c_int, fd: libc::c_int, o: libc::off_t) -> *mut c_void;
    fn witch_attached_munmap(a: *mut c_void, n: usize) -> libc::c_int;
    fn witch_attached_mremap(a: *mut c_void, n: usize, m: usize, f: libc::c_int, ...) -> *mut c_void;
}

/// The imports an attached agent takes for heap tracking (names and the
/// hidden entries), once [`resolve_for_attached`] found where they go.
/// Taken whatever the threshold (a later session may track), for good, as
/// the others.
pub(crate) fn attached_imports() -> Vec<(&'static CStr, *const c_void)> {
    if !resolve_for_attached() {
        return Vec::new();
    }
    vec![
        (c"malloc", witch_attached_malloc as *const c_void),
        (c"calloc", witch_attached_calloc as *const c_void),
        (c"realloc", witch_attached_realloc as *const c_void),
        (c"reallocarray", witch_attached_reallocarray as *const c_void),
        (c"free", witch_attached_free as *const c_void),
        (c"aligned_alloc", witch_attached_aligned_alloc as *const c_void),
        (c"memalign", witch_attached_memalign as *const c_void),
        (c"posix_memalign", witch_attached_posix_memalign as *const c_void),
        (c"mmap", witch_attached_mmap as *const c_void),
        (c"mmap64", witch_attached_mmap64 as *const c_void),
        (c"munmap", witch_attached_munmap as *const c_void),
        (c"mremap", witch_attached_mremap as *const c_void),
    ]
}

/// From now on a program's `munmap` (through the agent's entry) leaves
/// the agent's image and those loaded with it alone
/// ([`unmap_around_own`]). Not for handlers.
pub(crate) fn protect_own() {
    for (i, (lo, hi)) in crate::symbols::own_images().into_iter().enumerate() {
        IMAGES[i][0].store(lo, Ordering::Relaxed);
        IMAGES[i][1].store(hi, Ordering::Relaxed);
    }
}

/// Start tracking blocks of at least `threshold` bytes (None: the
/// default; 0: none), the agent's code being `own`. Not for handlers.
pub(crate) fn start(threshold: Option<u64>, own: (u64, u64)) {
    OWN[0].store(own.0, Ordering::Relaxed);
    OWN[1].store(own.1, Ordering::Relaxed);
    protect_own();
    let threshold = threshold.unwrap_or(heap::DEFAULT_THRESHOLD);
    if !heap::start(threshold) {
        crate::state::AGENT.note("heap blocks not tracked: the table's memory could not be reserved");
    }
}

/// Record a new block of the program's (a mapping: `mapped`), allocated
/// from `ret`.
fn track(p: *mut c_void, n: usize, ret: *mut c_void, mapped: bool) {
    let ret = ret as u64;
    if p.is_null() || (ret >= OWN[0].load(Ordering::Relaxed) && ret < OWN[1].load(Ordering::Relaxed)) {
        return;
    }
    let Some(table) = heap::table() else { return };
    let mut site = [0u64; SITE_FRAMES];
    // A lookup address, like a context tree's: the call, not the return.
    site[0] = ret.saturating_sub(1);
    let b = HeapBlock::new(p as u64, n as u64, site);
    if mapped {
        table.insert_mapping(&b);
    } else {
        table.insert(&b);
    }
}

fn wanted(n: usize) -> bool {
    n as u64 >= heap::threshold()
}

fn forget(p: *mut c_void) -> Option<HeapBlock> {
    heap::table()?.remove(p as u64)
}

type MallocFn = unsafe extern "C" fn(usize) -> *mut c_void;
type CallocFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type ReallocFn = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void);
type MemalignFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type PosixMemalignFn = unsafe extern "C" fn(*mut *mut c_void, usize, usize) -> libc::c_int;
type MmapFn = unsafe extern "C" fn(*mut c_void, usize, libc::c_int, libc::c_int, libc::c_int, libc::off_t) -> *mut c_void;
type MunmapFn = unsafe extern "C" fn(*mut c_void, usize) -> libc::c_int;
type MremapFn = unsafe extern "C" fn(*mut c_void, usize, usize, libc::c_int, ...) -> *mut c_void;

/// `malloc` from `ret`.
///
/// # Safety
/// As the C library's `malloc`.
#[no_mangle]
pub unsafe extern "C" fn witch_heap_malloc(n: usize, ret: *mut c_void) -> *mut c_void {
    let f = real(MALLOC);
    if f.is_null() {
        return boot_alloc(n, 16);
    }
    // SAFETY: the next `malloc`, with its signature and the caller's argument.
    let p = unsafe { std::mem::transmute::<*mut c_void, MallocFn>(f)(n) };
    if wanted(n) {
        track(p, n, ret, false);
    }
    p
}

/// `calloc` from `ret`.
///
/// # Safety
/// As the C library's `calloc`.
#[no_mangle]
pub unsafe extern "C" fn witch_heap_calloc(n: usize, m: usize, ret: *mut c_void) -> *mut c_void {
    let f = real(CALLOC);
    if f.is_null() {
        // The static region is zero and never reused.
        return n.checked_mul(m).map_or(std::ptr::null_mut(), |b| boot_alloc(b, 16));
    }
    // SAFETY: the next `calloc`, with its signature and the caller's arguments.
    let p = unsafe { std::mem::transmute::<*mut c_void, CallocFn>(f)(n, m) };
    if let Some(b) = n.checked_mul(m).filter(|&b| wanted(b)) {
        track(p, b, ret, false);
    }
    p
}

/// `realloc` from `ret`: the old block is forgotten before it may be given
/// back, and put back if the call fails.
///
/// # Safety
/// As the C library's `realloc`.
#[no_mangle]
pub unsafe extern "C" fn witch_heap_realloc(p: *mut c_void, n: usize, ret: *mut c_void) -> *mut c_void {
    if in_boot(p) {
        // SAFETY: a block of the static region, its size in the 16 bytes before it.
        let old = unsafe { *((p as usize - 16) as *const usize) };
        // SAFETY: a fresh block as `malloc` makes one.
        let q = unsafe { witch_heap_malloc(n, ret) };
        if !q.is_null() {
            // SAFETY: both blocks hold at least min(old, n) bytes and are distinct.
            unsafe { std::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, old.min(n)) };
        }
        return q;
    }
    let f = real(REALLOC);
    if f.is_null() {
        return std::ptr::null_mut();
    }
    let old = forget(p);
    // SAFETY: the next `realloc`, with its signature and the caller's arguments.
    let q = unsafe { std::mem::transmute::<*mut c_void, ReallocFn>(f)(p, n) };
    if q.is_null() {
        // Failed, the old block kept (or `realloc(p, 0)` freed it).
        if let (Some(b), true) = (old, n != 0) {
            if let Some(t) = heap::table() {
                t.insert(&b);
            }
        }
    } else if wanted(n) {
        track(q, n, ret, false);
    }
    q
}

/// `reallocarray` from `ret`: `realloc` of `n * m` bytes, ENOMEM on
/// overflow (the C library's own calls its internal `realloc`, which would
/// leave a tracked block behind).
///
/// # Safety
/// As the C library's `reallocarray`.
#[no_mangle]
pub unsafe extern "C" fn witch_heap_reallocarray(p: *mut c_void, n: usize, m: usize, ret: *mut c_void) -> *mut c_void {
    match n.checked_mul(m) {
        // SAFETY: as `realloc`, with the caller's block.
        Some(b) => unsafe { witch_heap_realloc(p, b, ret) },
        None => {
            // SAFETY: this thread's errno.
            unsafe { *libc::__errno_location() = libc::ENOMEM };
            std::ptr::null_mut()
        }
    }
}

/// `free`: the block is forgotten first.
///
/// # Safety
/// As the C library's `free`.
#[no_mangle]
pub unsafe extern "C" fn witch_heap_free(p: *mut c_void) {
    if p.is_null() || in_boot(p) {
        return;
    }
    let f = real(FREE);
    if f.is_null() {
        return;
    }
    forget(p);
    // SAFETY: the next `free`, with its signature and the caller's argument.
    unsafe { std::mem::transmute::<*mut c_void, FreeFn>(f)(p) }
}

/// `aligned_alloc` (`which` 0) or `memalign` (1) from `ret`.
///
/// # Safety
/// As the C library's function.
#[no_mangle]
pub unsafe extern "C" fn witch_heap_memalign(which: libc::c_int, align: usize, n: usize, ret: *mut c_void) -> *mut c_void {
    let f = real(if which == 0 { ALIGNED_ALLOC } else { MEMALIGN });
    if f.is_null() {
        return if align.is_power_of_two() && align <= 4096 { boot_alloc(n, align) } else { std::ptr::null_mut() };
    }
    // SAFETY: the next function, with its signature and the caller's arguments.
    let p = unsafe { std::mem::transmute::<*mut c_void, MemalignFn>(f)(align, n) };
    if wanted(n) {
        track(p, n, ret, false);
    }
    p
}

/// `posix_memalign` from `ret`.
///
/// # Safety
/// As the C library's `posix_memalign`.
#[no_mangle]
pub unsafe extern "C" fn witch_heap_posix_memalign(out: *mut *mut c_void, align: usize, n: usize, ret: *mut c_void) -> libc::c_int {
    let f = real(POSIX_MEMALIGN);
    if f.is_null() {
        if !(align.is_power_of_two() && align <= 4096) || out.is_null() {
            return libc::EINVAL;
        }
        let p = boot_alloc(n, align);
        if p.is_null() {
            return libc::ENOMEM;
        }
        // SAFETY: the caller's pointer to where the block goes.
        unsafe { *out = p };
        return 0;
    }
    // SAFETY: the next `posix_memalign`, with its signature and the caller's arguments.
    let r = unsafe { std::mem::transmute::<*mut c_void, PosixMemalignFn>(f)(out, align, n) };
    if r == 0 && wanted(n) {
        // SAFETY: set by a successful call.
        track(unsafe { *out }, n, ret, false);
    }
    r
}

/// The pages of `len` bytes from `addr` (the kernel's rounding), or None
/// if the kernel would refuse them (`addr` not page-aligned, `len` 0 or
/// reaching past the address space): then the call unmaps nothing.
fn pages(addr: *mut c_void, len: usize) -> Option<(u64, u64)> {
    // x86-64's page: the engine runs nowhere else.
    const PAGE: u64 = 4096;
    let lo = addr as u64;
    if !lo.is_multiple_of(PAGE) || len == 0 {
        return None;
    }
    let hi = lo.checked_add((len as u64).checked_next_multiple_of(PAGE)?)?;
    Some((lo, hi))
}

/// Blocks a failed call can put back ([`heap::Table::untrim`]): a range
/// that covers more tracked blocks than these, in a call that then fails
/// (the kernel's limit on mappings, say), leaves the rest unknown.
const UNDO: usize = 8;

/// `mmap` from `ret`: anonymous private or shared memory is a block./// `mmap` from `ret`: anonymous private or shared memory is a block.
///
/// # Safety
/// As the C library's `mmap`.
#[no_mangle]
pub unsafe extern "C" fn witch_heap_mmap(
    addr: *mut c_void,
    len: usize,
    prot: libc::c_int,
    flags: libc::c_int,
    fd: libc::c_int,
    off: libc::off_t,
    ret: *mut c_void,
) -> *mut c_void {
    let f = real(MMAP);
    if f.is_null() {
        // SAFETY: the system call the C library's `mmap` makes, with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void };
    }
    // SAFETY: the next `mmap`, with its signature and the caller's arguments.
    let p = unsafe { std::mem::transmute::<*mut c_void, MmapFn>(f)(addr, len, prot, flags, fd, off) };
    if p != libc::MAP_FAILED && flags & libc::MAP_FIXED != 0 {
        // A mapping put over tracked ones replaces what it covers (nobody
        // else could be handed these addresses meanwhile: they stayed mapped).
        if let (Some(t), Some((lo, hi))) = (heap::table(), pages(p, len)) {
            t.trim(lo, hi, &mut []);
        }
    }
    if p != libc::MAP_FAILED && flags & libc::MAP_ANONYMOUS != 0 && wanted(len) {
        track(p, len, ret, true);
    }
    p
}

/// `munmap`: the bytes it unmaps are forgotten first, of whatever
/// blocks hold them (a block partly unmapped keeps the rest); put back if
/// the call fails.
///
/// # Safety
/// As the C library's `munmap`.
#[no_mangle]
pub unsafe extern "C" fn witch_heap_munmap(addr: *mut c_void, len: usize) -> libc::c_int {
    let f = real(MUNMAP);
    if f.is_null() {
        // SAFETY: the system call the C library's `munmap` makes.
        return unsafe { libc::syscall(libc::SYS_munmap, addr, len) as libc::c_int };
    }
    let table = heap::table();
    let range = pages(addr, len);
    let mut removed = [HeapBlock::default(); UNDO];
    let n = match (table, range) {
        (Some(t), Some((lo, hi))) => t.trim(lo, hi, &mut removed),
        _ => 0,
    };
    // SAFETY: the next `munmap`, with its signature.
    let unmap = |a: u64, n: u64| unsafe { std::mem::transmute::<*mut c_void, MunmapFn>(f)(a as *mut c_void, n as usize) };
    let r = match range {
        Some((lo, hi)) => unmap_around_own(lo, hi, unmap).unwrap_or_else(|| unmap(addr as u64, len as u64)),
        None => unmap(addr as u64, len as u64),
    };
    if let (true, Some(t), Some((lo, hi))) = (r != 0 && n > 0, table, range) {
        t.untrim(lo, hi, &removed[..n.min(UNDO)]);
    }
    r
}

/// A program's `munmap` of `[lo, hi)` that reaches witch's own memory (the
/// agent's image and those loaded with it, witch's region): natively there was nothing there, a hole
/// the program may have made itself and unmaps now with the rest (correct
/// when no other thread maps memory meanwhile, as natively none does); the
/// loader put an attached agent there, or witch a table. Only the parts
/// outside witch's memory are unmapped, as natively the whole call
/// unmapped those and nothing else. None when the range does not reach
/// witch's memory; else the result (0, or the first failing part's).
fn unmap_around_own(lo: u64, hi: u64, unmap: impl FnMut(u64, u64) -> libc::c_int) -> Option<libc::c_int> {
    let mut own = [(0u64, 0u64); crate::symbols::OWN_IMAGES + 1];
    for (o, i) in own.iter_mut().zip(&IMAGES) {
        *o = (i[0].load(Ordering::Relaxed), i[1].load(Ordering::Relaxed));
    }
    own[crate::symbols::OWN_IMAGES] = witchcraft::sys::mem::own_region();
    unmap_around(lo, hi, &mut own, unmap)
}

/// [`unmap_around_own`] with witch's spans given (sorted here).
fn unmap_around(lo: u64, hi: u64, own: &mut [(u64, u64)], mut unmap: impl FnMut(u64, u64) -> libc::c_int) -> Option<libc::c_int> {
    if !own.iter().any(|&(a, b)| a < b && a < hi && lo < b) {
        return None;
    }
    own.sort_unstable();
    let mut at = lo;
    for &mut (a, b) in own {
        if a >= b || b <= at || a >= hi {
            continue;
        }
        if a > at {
            let r = unmap(at, a - at);
            if r != 0 {
                return Some(r);
            }
        }
        at = at.max(b);
    }
    if at < hi {
        return Some(unmap(at, hi - at));
    }
    Some(0)
}

/// `mremap`: the old range is forgotten first (put back if the call
/// fails), and the mapping at its new place is tracked at its new size,
/// under the site of the block that held `old` (none: not tracked). With
/// `MREMAP_DONTUNMAP` the old range stays mapped, and tracked. `new_addr`
/// is the caller's only with `MREMAP_FIXED` (null otherwise).
///
/// # Safety
/// As the C library's `mremap`.
#[no_mangle]
pub unsafe extern "C" fn witch_heap_mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: libc::c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let f = real(MREMAP);
    if f.is_null() {
        // SAFETY: the system call the C library's `mremap` makes, with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new_addr) as *mut c_void };
    }
    // SAFETY: the next `mremap`, with its signature and the caller's arguments.
    let call = || unsafe { std::mem::transmute::<*mut c_void, MremapFn>(f)(old, old_len, new_len, flags, new_addr) };
    let Some(t) = heap::table() else { return call() };
    let site = t.find(old as u64);
    // `old_len` 0 makes a second mapping of a shared one: nothing goes.
    let gone = if flags & libc::MREMAP_DONTUNMAP != 0 { None } else { pages(old, old_len) };
    let mut removed = [HeapBlock::default(); UNDO];
    let n = gone.map_or(0, |(lo, hi)| t.trim(lo, hi, &mut removed));
    let p = call();
    if p == libc::MAP_FAILED {
        if let Some((lo, hi)) = gone.filter(|_| n > 0) {
            t.untrim(lo, hi, &removed[..n.min(UNDO)]);
        }
        return p;
    }
    // Whatever was tracked where the mapping now is, is gone (with
    // `MREMAP_FIXED`, the kernel unmapped it); these addresses stayed the
    // program's, so nobody else recorded them meanwhile.
    if let Some((lo, hi)) = pages(p, new_len) {
        t.trim(lo, hi, &mut []);
    }
    if let Some(b) = site.filter(|_| heap::threshold() != u64::MAX) {
        t.insert_mapping(&HeapBlock { start: p as u64, size: new_len as u64, ..b });
    }
    p
}

mod next;
mod own_entries;
pub(crate) use own_entries::{calls_on, native_calls};

#[cfg(test)]
mod tests;
