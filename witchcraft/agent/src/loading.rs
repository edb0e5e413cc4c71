//! The program's loads and unloads (`dlopen`, `dlmopen`, `dlclose`,
//! `dlsym`), interposed (preloaded), and the module map kept current with
//! them ([`keep_map_current`], which the attached agent's control thread
//! also calls at each poll).

use crate::state::{preloaded, AGENT};
use crate::symbols::{keeping_errno, next};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use witchcraft::modules;

// The module map (witchcraft::modules) is read in place
// by the handlers: it must describe what is mapped, and never a module
// after it is unloaded.

/// Is this process being profiled by this (preloaded) agent right now?
fn tracking() -> bool {
    preloaded() && AGENT.owner_is_me() && !AGENT.stopping() && !AGENT.finished()
}

/// The dynamic linker's counts of objects loaded and unloaded so far.
pub(crate) fn link_counts() -> (u64, u64) {
    extern "C" fn first(info: *mut libc::dl_phdr_info, size: usize, out: *mut libc::c_void) -> libc::c_int {
        let end = std::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) + std::mem::size_of::<u64>();
        if size >= end {
            // SAFETY: the C library passes a valid entry of `size` bytes,
            // and `out` is the pair below.
            unsafe { *(out as *mut (u64, u64)) = ((*info).dlpi_adds, (*info).dlpi_subs) };
        }
        1 // the counts are the same in every entry
    }
    let mut counts = (0u64, 0u64);
    // SAFETY: a callback that only reads the entry it is given.
    unsafe { libc::dl_iterate_phdr(Some(first), &mut counts as *mut (u64, u64) as *mut libc::c_void) };
    counts
}

/// The counts when the map was last rebuilt here.
static SEEN: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Rebuild the map if something was loaded or unloaded since it was built
/// here, or a handler met code outside it; then free the maps no handler
/// can still be reading. Not for handlers.
pub fn keep_map_current(force: bool) {
    // Reading the maps may look a symbol up (the standard library's weak
    // symbols, through `dlsym`), which comes back here.
    if BUSY.with(|b| b.replace(true)) {
        return;
    }
    rebuild_if_changed(force);
    BUSY.with(|b| b.set(false));
}

thread_local! {
    /// This thread is keeping the map (a `dlsym` or `dlclose` from a
    /// signal handler of the program that interrupted it must not start
    /// again: the map's locks are held).
    static BUSY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn rebuild_if_changed(force: bool) {
    let (adds, subs) = link_counts();
    let changed = adds != SEEN[0].load(Ordering::Relaxed) || subs != SEEN[1].load(Ordering::Relaxed);
    if force || changed || modules::STALE.swap(false, Ordering::AcqRel) {
        SEEN[0].store(adds, Ordering::Relaxed);
        SEEN[1].store(subs, Ordering::Relaxed);
        modules::refresh();
    }
    modules::reclaim_retired(|| AGENT.grace());
}

type DlopenFn = unsafe extern "C-unwind" fn(*const libc::c_char, libc::c_int) -> *mut libc::c_void;
type DlmopenFn = unsafe extern "C-unwind" fn(libc::c_long, *const libc::c_char, libc::c_int) -> *mut libc::c_void;
type DlcloseFn = unsafe extern "C-unwind" fn(*mut libc::c_void) -> libc::c_int;

static REAL_DLOPEN: AtomicPtr<libc::c_void> = AtomicPtr::new(std::ptr::null_mut());
static REAL_DLMOPEN: AtomicPtr<libc::c_void> = AtomicPtr::new(std::ptr::null_mut());

// `dlopen` and `dlmopen` go through these stubs: they ask `route_open`
// (with the arguments and the caller's return address) where to go, and
// jump there with the caller's arguments, stack and return address
// untouched. The C library finds the object that called `dlopen` from that
// return address: `$ORIGIN`, and the RPATH and RUNPATH that a bare file
// name is searched along, are that object's, and so is the namespace the
// library loads into. Going straight to the C library keeps all of that;
// going through a wrapper that calls it would make the agent the caller.
std::arch::global_asm!(
    // The arguments' registers saved around the call that chooses where to
    // go (16-byte aligned at the call; 40 bytes, so the caller's return
    // address is then at [rsp + 40]), then put back, and on to it.
    ".macro witch_save_args",
    "push rdi",
    "push rsi",
    "push rdx",
    "push rcx",
    "sub rsp, 8",
    ".endm",
    ".macro witch_restore_args_and_go",
    "add rsp, 8",
    "pop rcx",
    "pop rdx",
    "pop rsi",
    "pop rdi",
    "jmp rax",
    ".endm",
    ".globl dlopen",
    ".type dlopen,@function",
    "dlopen:",
    "endbr64",
    "witch_save_args",
    "mov rdx, rdi",       // the file name
    "xor edi, edi",       // 0: dlopen
    "mov rcx, [rsp + 40]", // the caller's return address
    "call {route}",
    "witch_restore_args_and_go",
    ".size dlopen, .-dlopen",
    ".globl dlmopen",
    ".type dlmopen,@function",
    "dlmopen:",
    "endbr64",
    "witch_save_args",
    "mov rdx, rsi",       // the file name
    "mov edi, 1",         // 1: dlmopen
    "mov rcx, [rsp + 40]", // the caller's return address
    "call {route}",
    "witch_restore_args_and_go",
    ".size dlmopen, .-dlmopen",
    ".globl dlsym",
    ".type dlsym,@function",
    "dlsym:",
    "endbr64",
    "witch_save_args",
    "call {route_sym}",
    "witch_restore_args_and_go",
    ".size dlsym, .-dlsym",
    route = sym route_open,
    route_sym = sym route_sym,
);

/// The C library's `dlsym` (looked up by version: looking it up by name
/// would come back here).
fn real_dlsym() -> *const libc::c_void {
    static REAL: AtomicPtr<libc::c_void> = AtomicPtr::new(std::ptr::null_mut());
    let mut f = REAL.load(Ordering::Relaxed);
    if f.is_null() {
        for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
            // SAFETY: dlvsym with NUL-terminated names.
            f = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
            if !f.is_null() {
                break;
            }
        }
        REAL.store(f, Ordering::Relaxed);
    }
    f
}

/// `dlsym` goes straight to the C library (its caller decides what
/// `RTLD_NEXT` and `RTLD_DEFAULT` find), after bringing the map up to date:
/// a program looks up what it loaded before it runs it, so a library that
/// `dlopen` could not be followed into (see [`route_open`]) is in the map
/// before its code runs.
extern "C" fn route_sym() -> *const libc::c_void {
    // Two loads when nothing is pending: programs may call dlsym often.
    if (UNFOLLOWED.load(Ordering::Relaxed) || modules::STALE.load(Ordering::Relaxed)) && tracking() {
        UNFOLLOWED.store(false, Ordering::Relaxed);
        keeping_errno(|| keep_map_current(false));
    }
    real_dlsym()
}

/// A `dlopen` went straight to the C library: what it loaded is not in the
/// map yet.
static UNFOLLOWED: AtomicBool = AtomicBool::new(false);

/// Where `dlopen` (`which` 0) or `dlmopen` (1) of `file`, called from
/// `caller`, goes: to [`open_and_refresh`] (or its `dlmopen` twin) when
/// the C library would load the same thing for the agent as for the
/// caller, so the map can be rebuilt once it returns; otherwise straight
/// to the C library, and what it loads enters the map at the next rebuild
/// (the next `dlopen`, `dlclose` or thread start, or when the profile is
/// written).
extern "C" fn route_open(which: usize, _: usize, file: *const libc::c_char, caller: *const libc::c_void) -> *const libc::c_void {
    let real = if which == 0 { next(c"dlopen", &REAL_DLOPEN) } else { next(c"dlmopen", &REAL_DLMOPEN) };
    if !tracking() {
        return real;
    }
    keeping_errno(|| {
        keep_map_current(false);
        // SAFETY: `file` is the caller's argument: null or a C string.
        if unsafe { same_for_any_caller(file, caller, which == 0) } {
            if which == 0 {
                open_and_refresh as *const libc::c_void
            } else {
                mopen_and_refresh as *const libc::c_void
            }
        } else {
            UNFOLLOWED.store(true, Ordering::Relaxed);
            real
        }
    })
}

unsafe extern "C-unwind" fn open_and_refresh(file: *const libc::c_char, mode: libc::c_int) -> *mut libc::c_void {
    // SAFETY: the C library's dlopen has this signature; the arguments are the caller's.
    let h = unsafe { std::mem::transmute::<*mut libc::c_void, DlopenFn>(next(c"dlopen", &REAL_DLOPEN))(file, mode) };
    if !h.is_null() && tracking() {
        keeping_errno(|| keep_map_current(false));
    }
    h
}

unsafe extern "C-unwind" fn mopen_and_refresh(lmid: libc::c_long, file: *const libc::c_char, mode: libc::c_int) -> *mut libc::c_void {
    // SAFETY: the C library's dlmopen has this signature; the arguments are the caller's.
    let h = unsafe { std::mem::transmute::<*mut libc::c_void, DlmopenFn>(next(c"dlmopen", &REAL_DLMOPEN))(lmid, file, mode) };
    if !h.is_null() && tracking() {
        keeping_errno(|| keep_map_current(false));
    }
    h
}

const DT_NULL: i64 = 0;
const DT_RPATH: i64 = 15;
const DT_RUNPATH: i64 = 29;
const DT_FLAGS_1: i64 = 0x6fff_fffb;
const DF_1_NODEFLIB: u64 = 0x800;
const RTLD_DL_LINKMAP: libc::c_int = 2;

#[repr(C)]
struct Elf64Dyn {
    tag: i64,
    val: u64,
}

/// What a loaded object's dynamic section says about library search.
#[derive(Default, Clone, Copy)]
struct SearchTags {
    rpath: bool,
    runpath: bool,
    nodeflib: bool,
}

struct Objects {
    caller: u64,
    /// The caller's object's tags (the main program's if no object holds
    /// the caller's address, as the C library then assumes).
    caller_tags: Option<SearchTags>,
    main_tags: SearchTags,
    /// An object other than the main program has a DT_RPATH.
    other_rpath: bool,
    first: bool,
}

/// Read the tags of every loaded object.
fn scan_objects(caller: u64) -> Objects {
    extern "C" fn each(info: *mut libc::dl_phdr_info, _: usize, data: *mut libc::c_void) -> libc::c_int {
        // SAFETY: the C library's entry, and our `Objects`.
        let (info, o) = unsafe { (&*info, &mut *(data as *mut Objects)) };
        let mut tags = SearchTags::default();
        let mut holds_caller = false;
        for i in 0..info.dlpi_phnum as usize {
            // SAFETY: `dlpi_phnum` program headers at `dlpi_phdr`.
            let ph = unsafe { &*info.dlpi_phdr.add(i) };
            let start = info.dlpi_addr.wrapping_add(ph.p_vaddr);
            if ph.p_type == libc::PT_LOAD && o.caller >= start && o.caller < start.wrapping_add(ph.p_memsz) {
                holds_caller = true;
            }
            if ph.p_type == libc::PT_DYNAMIC {
                let mut d = start as *const Elf64Dyn;
                // SAFETY: the object's dynamic section, mapped while it is
                // loaded (and the C library holds it loaded during the
                // iteration), ends with DT_NULL.
                unsafe {
                    while (*d).tag != DT_NULL {
                        match (*d).tag {
                            DT_RPATH => tags.rpath = true,
                            DT_RUNPATH => tags.runpath = true,
                            DT_FLAGS_1 => tags.nodeflib = (*d).val & DF_1_NODEFLIB != 0,
                            _ => {}
                        }
                        d = d.add(1);
                    }
                }
            }
        }
        if o.first {
            o.main_tags = tags;
        } else if tags.rpath {
            o.other_rpath = true;
        }
        if holds_caller && o.caller_tags.is_none() {
            o.caller_tags = Some(tags);
        }
        o.first = false;
        0
    }
    let mut o = Objects { caller, caller_tags: None, main_tags: SearchTags::default(), other_rpath: false, first: true };
    // SAFETY: a callback that reads the entries it is given.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut o as *mut Objects as *mut libc::c_void) };
    o
}

/// Would the C library load the same object for `file` whether the agent
/// or `caller` asks (`in_callers_namespace`: `dlopen`, which loads into its
/// caller's namespace)?
///
/// # Safety
/// `file` is null or a C string.
unsafe fn same_for_any_caller(file: *const libc::c_char, caller: *const libc::c_void, in_callers_namespace: bool) -> bool {
    if in_callers_namespace {
        // SAFETY: Dl_info is plain data (pointers may be null).
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        let mut map: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: plain out-parameters; the link map is a handle `dlinfo` takes.
        let ns = unsafe {
            if libc::dladdr1(caller, &mut info, &mut map, RTLD_DL_LINKMAP) != 0 && !map.is_null() {
                let mut lmid: libc::c_long = libc::LM_ID_BASE;
                libc::dlinfo(map, libc::RTLD_DI_LMID, &mut lmid as *mut libc::c_long as *mut libc::c_void);
                lmid
            } else {
                libc::LM_ID_BASE
            }
        };
        if ns != libc::LM_ID_BASE {
            return false; // the agent is in the base namespace
        }
    }
    if file.is_null() {
        return true; // the main program
    }
    // SAFETY: the caller's promise.
    let name = unsafe { std::ffi::CStr::from_ptr(file) }.to_bytes();
    if name.contains(&b'$') {
        return false; // `$ORIGIN` and the like are the caller's
    }
    if name.contains(&b'/') {
        return true; // a path: no search
    }
    // A bare name is searched for along the RPATH of the caller and of the
    // objects that loaded it (unless the caller has a RUNPATH), then the
    // main program's RPATH, LD_LIBRARY_PATH, the caller's RUNPATH, the cache
    // and the default directories (unless the caller says NODEFLIB). The
    // agent has none of these tags and was loaded by the main program: the
    // search is the same when the caller has no RUNPATH or NODEFLIB and no
    // object but the main program has an RPATH.
    let o = scan_objects(caller as u64);
    let tags = o.caller_tags.unwrap_or(o.main_tags);
    !tags.runpath && !tags.nodeflib && !o.other_rpath
}

/// Unload as the C library does, and keep the module map from describing
/// what it unmaps: the map loses its transient modules first (those loaded
/// after the agent started, which this call may unload), every handler
/// that may still read the previous map is waited for, and once the call
/// returns the map is rebuilt. `dlclose` does not depend on its caller.
///
/// # Safety
/// As the C library's `dlclose`.
#[no_mangle]
pub unsafe extern "C-unwind" fn dlclose(handle: *mut libc::c_void) -> libc::c_int {
    static REAL: AtomicPtr<libc::c_void> = AtomicPtr::new(std::ptr::null_mut());
    // SAFETY: the C library's dlclose has this signature.
    let real = unsafe { std::mem::transmute::<*mut libc::c_void, DlcloseFn>(next(c"dlclose", &REAL)) };
    if !tracking() || BUSY.with(|b| b.get()) {
        // SAFETY: the caller's argument, passed on.
        return unsafe { real(handle) };
    }
    keeping_errno(|| {
        BUSY.with(|b| b.set(true));
        modules::begin_unload();
        AGENT.grace();
    });
    // SAFETY: as above.
    let r = unsafe { real(handle) };
    keeping_errno(|| {
        modules::end_unload();
        BUSY.with(|b| b.set(false));
        keep_map_current(true);
    });
    r
}
