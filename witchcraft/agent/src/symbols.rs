//! The definitions the agent's own functions call on to: the next
//! definition of a C library function after the agent's (whose own
//! interposes it, preloaded), looked up once; attached, the definition the
//! program's own calls bind to ([`global_definition`]); the loaded
//! modules' names; and a call made as the program's, with its `errno`
//! kept.

use std::ffi::{c_void, CStr};
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

/// Where the program's own calls to `name` go: the global scope's
/// definition. `dlsym(RTLD_DEFAULT)` gives it, except in a program linked
/// without PIE that takes the function's address: there it gives the
/// program's *canonical PLT entry* (its symbol undefined, its value the
/// PLT stub, so that `&malloc` compares equal everywhere), which jumps
/// through the program's own import entry, the one the agent points at
/// itself: calling on to it called the agent again, without end (Debian's
/// `/usr/bin/python3` died of a stack overflow at its first attach). Then
/// the first definition among the modules loaded after the program, in
/// load order (the global scope's order: a preloaded allocator before the
/// C library). The attached agent is loaded RTLD_LOCAL and is skipped, so
/// this is never its own entry.
pub fn global_definition(name: &CStr) -> *mut c_void {
    // SAFETY: dlsym with a NUL-terminated name.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if f.is_null() || defines(f) {
        return f;
    }
    let own = own_name();
    for lib in libraries() {
        if lib.as_bytes().is_empty() || Some(&lib) == own.as_ref() {
            continue;
        }
        // SAFETY: a NUL-terminated name; RTLD_NOLOAD only finds a module
        // already loaded (and takes a reference, given back below).
        let handle = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        if handle.is_null() {
            continue;
        }
        // SAFETY: a handle dlopen just gave; a NUL-terminated name.
        let g = unsafe { libc::dlsym(handle, name.as_ptr()) };
        // SAFETY: the reference taken above.
        unsafe { libc::dlclose(handle) };
        if !g.is_null() && defines(g) {
            return g;
        }
    }
    std::ptr::null_mut()
}

/// `f` is the start of a symbol its module defines (not an undefined
/// symbol's canonical PLT entry).
fn defines(f: *mut c_void) -> bool {
    const RTLD_DL_SYMENT: libc::c_int = 1;
    const SHN_UNDEF: u16 = 0;
    // SAFETY: Dl_info is plain data, filled by dladdr1.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut sym: *mut c_void = std::ptr::null_mut();
    // SAFETY: any address; with RTLD_DL_SYMENT, `sym` receives a pointer
    // to the matching symbol's entry in the module's symbol table.
    let found = unsafe { libc::dladdr1(f, &mut info, &mut sym, RTLD_DL_SYMENT) } != 0;
    if !found || sym.is_null() || info.dli_saddr != f {
        return false;
    }
    // SAFETY: the loader's symbol table entry, mapped with its module.
    let sym = unsafe { &*(sym as *const libc::Elf64_Sym) };
    sym.st_shndx != SHN_UNDEF
}

/// Images this many at most in [`own_images`].
pub const OWN_IMAGES: usize = 8;

/// The spans of the agent's own loaded image and of every module loaded
/// after it so far (from the lowest loaded segment's first page to the
/// highest one's end): an attached agent's are its own dependencies (the
/// math library, the unwinder's), which the loader mapped with it, where
/// it liked. Empty spans are (0, 0).
pub fn own_images() -> [(u64, u64); OWN_IMAGES] {
    struct Walk {
        seen_agent: bool,
        spans: [(u64, u64); OWN_IMAGES],
        n: usize,
    }
    extern "C" fn each(info: *mut libc::dl_phdr_info, _size: usize, out: *mut c_void) -> libc::c_int {
        // SAFETY: the C library passes a valid entry, and `out` is the walk below.
        let (info, w) = unsafe { (&*info, &mut *(out as *mut Walk)) };
        let me = own_images as *const () as u64;
        let (mut lo, mut hi, mut mine) = (u64::MAX, 0u64, false);
        for i in 0..info.dlpi_phnum as usize {
            // SAFETY: the loader's program headers, `dlpi_phnum` of them.
            let ph = unsafe { &*info.dlpi_phdr.add(i) };
            if ph.p_type != libc::PT_LOAD {
                continue;
            }
            let start = info.dlpi_addr.wrapping_add(ph.p_vaddr);
            let end = start.wrapping_add(ph.p_memsz);
            mine |= (start..end).contains(&me);
            (lo, hi) = (lo.min(start & !4095), hi.max(end.next_multiple_of(4096)));
        }
        w.seen_agent |= mine;
        if w.seen_agent && lo < hi && w.n < OWN_IMAGES {
            w.spans[w.n] = (lo, hi);
            w.n += 1;
        }
        0
    }
    let mut w = Walk { seen_agent: false, spans: [(0, 0); OWN_IMAGES], n: 0 };
    // SAFETY: a callback that writes into `w`.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut w as *mut Walk as *mut c_void) };
    w.spans
}

/// The agent's own module name, as the loader has it.
pub fn own_name() -> Option<std::ffi::CString> {
    // SAFETY: Dl_info is plain data; dladdr fills it for an address of ours.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: any address; the result is checked.
    if unsafe { libc::dladdr(own_name as *const c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: the loader's NUL-terminated name of the module.
    Some(unsafe { CStr::from_ptr(info.dli_fname) }.to_owned())
}

/// The names of the loaded modules, as the loader has them.
pub fn libraries() -> Vec<std::ffi::CString> {
    extern "C" fn each(info: *mut libc::dl_phdr_info, _size: usize, out: *mut c_void) -> libc::c_int {
        // SAFETY: the C library passes a valid entry, and `out` is the vector below.
        let (info, out) = unsafe { (&*info, &mut *(out as *mut Vec<std::ffi::CString>)) };
        if !info.dlpi_name.is_null() {
            // SAFETY: the loader's NUL-terminated name of the module.
            out.push(unsafe { CStr::from_ptr(info.dlpi_name) }.to_owned());
        }
        0
    }
    let mut names: Vec<std::ffi::CString> = Vec::new();
    // SAFETY: a callback that copies each entry's name into `names`.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut names as *mut Vec<std::ffi::CString> as *mut c_void) };
    names
}
