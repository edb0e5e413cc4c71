//! The C library functions a preloaded agent interposes (an attached one is
//! loaded with `RTLD_LOCAL` and interposes nothing):
//!
//! - `pthread_create`: every new thread is set up before it runs;
//! - the exec family (`execl*` in `exec_variadic.c`): the profile is written
//!   before the image is replaced, and profiling goes on if exec fails;
//! - `_exit`, `_Exit`: the profile is written (exit's atexit handlers,
//!   which write it otherwise, are skipped);
//! - `sigaction`, `signal`: the signals the agent owns keep its handler,
//!   while the program's choice is remembered and reported back;
//! - `sigprocmask`, `pthread_sigmask`: the program may block anything but
//!   the agent's samples and traps;
//! - `ptrace`: a process that asks to be traced (`PTRACE_TRACEME`) leaves
//!   its debug registers and signals to its debugger.
//!
//! `dlopen` is not interposed: glibc resolves `$ORIGIN` and RUNPATH from its
//! caller's address, so a wrapper would change what loads.

use crate::program::PROGRAM;
use crate::state::{Mode, AGENT};
use std::sync::atomic::{AtomicPtr, Ordering};
use witchcraft::sys::siginfo::sampler_signal;

/// The next definition of `name` after ours.
pub fn next_symbol(name: &std::ffi::CStr) -> *mut libc::c_void {
    // SAFETY: dlsym with a NUL-terminated name.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) }
}

/// The next `name`, looked up once.
fn next(name: &std::ffi::CStr, cache: &AtomicPtr<libc::c_void>) -> *mut libc::c_void {
    let mut f = cache.load(Ordering::Relaxed);
    if f.is_null() {
        f = next_symbol(name);
        cache.store(f, Ordering::Relaxed);
    }
    f
}

fn preloaded() -> bool {
    AGENT.mode() == Mode::Preloaded && AGENT.engine().is_some()
}

type StartFn = extern "C" fn(*mut libc::c_void) -> *mut libc::c_void;
type PthreadCreate = unsafe extern "C" fn(*mut libc::pthread_t, *const libc::pthread_attr_t, StartFn, *mut libc::c_void) -> libc::c_int;

struct Tramp {
    start: StartFn,
    arg: *mut libc::c_void,
}

extern "C" fn trampoline(p: *mut libc::c_void) -> *mut libc::c_void {
    // SAFETY: made by `pthread_create` below with Box::into_raw, taken once here.
    let t = unsafe { Box::from_raw(p as *mut Tramp) };
    crate::preload::start_thread();
    (t.start)(t.arg)
}

/// Threads created by the program get their own engine state first.
///
/// # Safety
/// As the C library's `pthread_create`.
#[no_mangle]
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    start: StartFn,
    arg: *mut libc::c_void,
) -> libc::c_int {
    static REAL: AtomicPtr<libc::c_void> = AtomicPtr::new(std::ptr::null_mut());
    // SAFETY: the C library's pthread_create has this signature.
    let real = unsafe { std::mem::transmute::<*mut libc::c_void, PthreadCreate>(next(c"pthread_create", &REAL)) };
    if !preloaded() {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { real(thread, attr, start, arg) };
    }
    let t = Box::into_raw(Box::new(Tramp { start, arg }));
    // SAFETY: as above; the trampoline takes ownership of `t` if the thread starts.
    let r = unsafe { real(thread, attr, trampoline, t as *mut libc::c_void) };
    if r != 0 {
        // SAFETY: the thread did not start, so `t` is still ours.
        drop(unsafe { Box::from_raw(t) });
    }
    r
}

/// Before the image is replaced, write what it gathered. If exec fails the
/// process goes on and so does profiling.
fn around_exec(call: impl FnOnce() -> libc::c_int) -> libc::c_int {
    let ours = preloaded() && AGENT.owner_is_me();
    if ours {
        AGENT.finish("exec");
    }
    let r = call();
    // SAFETY: this thread's errno.
    let e = unsafe { *libc::__errno_location() };
    if ours {
        AGENT.resume();
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = e };
    r
}

type Execve = unsafe extern "C" fn(*const libc::c_char, *const *const libc::c_char, *const *const libc::c_char) -> libc::c_int;
type Execv = unsafe extern "C" fn(*const libc::c_char, *const *const libc::c_char) -> libc::c_int;

macro_rules! exec_wrapper {
    ($name:ident, $ty:ty, $($arg:ident : $t:ty),*) => {
        /// # Safety
        /// As the C library's function of the same name.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $t),*) -> libc::c_int {
            static REAL: AtomicPtr<libc::c_void> = AtomicPtr::new(std::ptr::null_mut());
            let name = concat!(stringify!($name), "\0");
            let name = std::ffi::CStr::from_bytes_with_nul(name.as_bytes()).expect("NUL-terminated");
            // SAFETY: the C library's function has this signature.
            let real = unsafe { std::mem::transmute::<*mut libc::c_void, $ty>(next(name, &REAL)) };
            // SAFETY: the caller's arguments, passed on.
            around_exec(|| unsafe { real($($arg),*) })
        }
    };
}

exec_wrapper!(execve, Execve, path: *const libc::c_char, argv: *const *const libc::c_char, envp: *const *const libc::c_char);
exec_wrapper!(execvpe, Execve, file: *const libc::c_char, argv: *const *const libc::c_char, envp: *const *const libc::c_char);
exec_wrapper!(execv, Execv, path: *const libc::c_char, argv: *const *const libc::c_char);
exec_wrapper!(execvp, Execv, file: *const libc::c_char, argv: *const *const libc::c_char);

type ExitFn = unsafe extern "C" fn(libc::c_int) -> !;

fn exit_now(name: &std::ffi::CStr, cache: &AtomicPtr<libc::c_void>, status: libc::c_int) -> ! {
    // A vfork child (posix_spawn's, on failure) shares our memory: `finish`
    // leaves the state alone unless this process owns it.
    if preloaded() {
        AGENT.finish("exit");
    }
    // SAFETY: the C library's exit function has this signature and does not return.
    unsafe { std::mem::transmute::<*mut libc::c_void, ExitFn>(next(name, cache))(status) }
}

/// `_exit` skips the atexit handler that writes the profile: write it here.
///
/// # Safety
/// As the C library's `_exit`.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: libc::c_int) -> ! {
    static REAL: AtomicPtr<libc::c_void> = AtomicPtr::new(std::ptr::null_mut());
    exit_now(c"_exit", &REAL, status)
}

/// As `_exit`.
///
/// # Safety
/// As the C library's `_Exit`.
#[no_mangle]
pub unsafe extern "C" fn _Exit(status: libc::c_int) -> ! {
    static REAL: AtomicPtr<libc::c_void> = AtomicPtr::new(std::ptr::null_mut());
    exit_now(c"_Exit", &REAL, status)
}

type PtraceFn = unsafe extern "C" fn(libc::c_int, libc::pid_t, *mut libc::c_void, *mut libc::c_void) -> libc::c_long;

/// A process that asks to be traced is about to be debugged: its debugger
/// needs the debug registers, and must not see the agent's signals as
/// stops. Profiling of this process ends here (the profile says why).
///
/// # Safety
/// As the C library's `ptrace` (called with its four arguments, as glibc's
/// variadic definition reads them).
#[no_mangle]
pub unsafe extern "C" fn ptrace(req: libc::c_int, pid: libc::pid_t, addr: *mut libc::c_void, data: *mut libc::c_void) -> libc::c_long {
    static REAL: AtomicPtr<libc::c_void> = AtomicPtr::new(std::ptr::null_mut());
    if req == libc::PTRACE_TRACEME as libc::c_int && preloaded() && AGENT.owner_is_me() {
        crate::preload::leave_to_debugger("it asked to be traced (PTRACE_TRACEME)");
    }
    // SAFETY: the C library's ptrace reads these four arguments.
    unsafe { std::mem::transmute::<*mut libc::c_void, PtraceFn>(next(c"ptrace", &REAL))(req, pid, addr, data) }
}

type SigactionFn = unsafe extern "C" fn(libc::c_int, *const libc::sigaction, *mut libc::sigaction) -> libc::c_int;

/// `sigaction` as the program sees it: the signals the agent owns keep its
/// handler while the program's choice is remembered and reported back.
///
/// # Safety
/// As the C library's `sigaction`.
#[no_mangle]
pub unsafe extern "C" fn sigaction(sig: libc::c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> libc::c_int {
    let real: SigactionFn = crate::handlers::real_sigaction();
    if PROGRAM.owned(sig) {
        if !old.is_null() {
            // SAFETY: the caller's pointer to a sigaction to fill.
            unsafe { *old = PROGRAM.action(sig) };
        }
        if !act.is_null() {
            // SAFETY: the caller's pointer to a sigaction to read.
            PROGRAM.set_action(sig, unsafe { &*act });
        }
        return 0;
    }
    if PROGRAM.fatal_hook(sig) {
        // Our fatal-signal hook is invisible: the program sees SIG_DFL.
        // SAFETY: the caller's arguments, passed on.
        let r = unsafe { real(sig, act, old) };
        if r == 0 && !old.is_null() {
            // SAFETY: filled by the call above.
            unsafe {
                (*old).sa_sigaction = libc::SIG_DFL;
                (*old).sa_flags = 0;
            }
        }
        if r == 0 && !act.is_null() {
            PROGRAM.set_fatal_hook(sig, false);
        }
        return r;
    }
    // SAFETY: the caller's arguments, passed on.
    unsafe { real(sig, act, old) }
}

/// # Safety
/// As the C library's `signal`.
#[no_mangle]
pub unsafe extern "C" fn signal(sig: libc::c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: sigaction is plain data.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = handler;
    sa.sa_flags = libc::SA_RESTART;
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to plain structs.
    if unsafe { sigaction(sig, &sa, &mut old) } != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}

type MaskFn = unsafe extern "C" fn(libc::c_int, *const libc::sigset_t, *mut libc::sigset_t) -> libc::c_int;

/// `set` without the signals the agent owns, if it names any (else `set`
/// itself). The program may block anything but the samples and traps: a
/// thread that blocks every signal (a common way to leave them all to one
/// thread) would otherwise never be sampled, and its traps would arrive
/// late. Its masks are otherwise kept, and glibc's own masking is untouched.
///
/// # Safety
/// `set` is null or a valid sigset.
unsafe fn without_ours(how: libc::c_int, set: *const libc::sigset_t, copy: &mut libc::sigset_t) -> *const libc::sigset_t {
    if set.is_null() || how == libc::SIG_UNBLOCK {
        return set;
    }
    let ours = [libc::SIGTRAP, sampler_signal()];
    // SAFETY: `set` is a valid sigset (the caller's promise).
    let named = |sig: i32| unsafe { libc::sigismember(set, sig) } == 1;
    if !ours.iter().any(|&sig| PROGRAM.owned(sig) && named(sig)) {
        return set;
    }
    // SAFETY: as above.
    *copy = unsafe { *set };
    for sig in ours.into_iter().filter(|&sig| PROGRAM.owned(sig)) {
        // SAFETY: `copy` is a valid sigset.
        unsafe { libc::sigdelset(copy, sig) };
    }
    copy
}

/// # Safety
/// As the C library's `pthread_sigmask`.
#[no_mangle]
pub unsafe extern "C" fn pthread_sigmask(how: libc::c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> libc::c_int {
    static REAL: AtomicPtr<libc::c_void> = AtomicPtr::new(std::ptr::null_mut());
    // SAFETY: sigset_t is plain data.
    let mut copy: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: the C library's function has this signature; the arguments are the caller's.
    unsafe {
        std::mem::transmute::<*mut libc::c_void, MaskFn>(next(c"pthread_sigmask", &REAL))(how, without_ours(how, set, &mut copy), old)
    }
}

/// # Safety
/// As the C library's `sigprocmask`.
#[no_mangle]
pub unsafe extern "C" fn sigprocmask(how: libc::c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> libc::c_int {
    static REAL: AtomicPtr<libc::c_void> = AtomicPtr::new(std::ptr::null_mut());
    // SAFETY: sigset_t is plain data.
    let mut copy: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as in `pthread_sigmask`.
    unsafe { std::mem::transmute::<*mut libc::c_void, MaskFn>(next(c"sigprocmask", &REAL))(how, without_ours(how, set, &mut copy), old) }
}
