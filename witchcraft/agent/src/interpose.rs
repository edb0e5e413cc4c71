//! The C library functions a preloaded agent interposes (an attached one is
//! loaded with `RTLD_LOCAL` and interposes nothing):
//!
//! - `pthread_create`: every new thread is set up before it runs;
//! - the exec family, `fexecve` too (`execl*` in `exec_variadic.c`): the
//!   profile is written before the image is replaced, and profiling goes on
//!   if exec fails;
//! - `_exit`, `_Exit`: the profile is written (exit's atexit handlers,
//!   which write it otherwise, are skipped);
//! - `sigaction`, `signal`: the signals the agent owns keep its handler,
//!   while the program's choice is remembered and reported back;
//! - `sigprocmask`, `pthread_sigmask`: the program may block anything but
//!   the agent's samples and traps;
//! - `ptrace`: a process that asks to be traced (`PTRACE_TRACEME`) leaves
//!   its debug registers and signals to its debugger;
//! - `dlopen`, `dlmopen`, `dlclose`, `dlsym`: the module map follows what
//!   is loaded and unloaded (see [`dlclose`], [`route_open`], [`route_sym`]);
//! - `prctl` and `syscall`, for `PR_SET_SECCOMP` and `SYS_seccomp`: a
//!   process that puts itself in a seccomp sandbox is left before the
//!   filter goes in (`preload::leave_to_sandbox`; an attached agent gets
//!   these two, and the `exec` calls and `fexecve`, through the program's
//!   import tables, `imports.rs`, and ends its session, `attach::leave`).

use crate::program::PROGRAM;
use crate::state::{Mode, AGENT};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use witchcraft::modules;
use witchcraft::profile::EndedBy;
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

/// A new thread's start: it takes its slot, prepared by its creator, and
/// runs the program's start routine. Nothing here allocates (see
/// `preload::prepare_thread`).
extern "C" fn trampoline(p: *mut libc::c_void) -> *mut libc::c_void {
    // SAFETY: `pthread_create` below passes a slot of the static table.
    let slot = unsafe { &*(p as *const crate::threads::Slot) };
    let (start, arg, stack) = slot.start();
    crate::preload::adopt_thread(slot, crate::preload::created_thread_stack(stack));
    // SAFETY: the program's start routine, left in the slot by `pthread_create`.
    let start = unsafe { std::mem::transmute::<usize, StartFn>(start) };
    // Not a tail call: this frame stays below the program's start routine,
    // where reports cut the thread's start-up frames.
    let r = start(arg as *mut libc::c_void);
    std::hint::black_box(&r);
    r
}

extern "C" {
    /// The C library's default thread attributes (glibc 2.18).
    fn pthread_getattr_default_np(attr: *mut libc::pthread_attr_t) -> libc::c_int;
}

/// The size of the stack a thread created with `attr` gets.
fn stack_size(attr: *const libc::pthread_attr_t) -> usize {
    let mut size: libc::size_t = 0;
    // SAFETY: the caller's attributes, or the process's defaults, read
    // into a copy destroyed after use.
    unsafe {
        if attr.is_null() {
            let mut d: libc::pthread_attr_t = std::mem::zeroed();
            if pthread_getattr_default_np(&mut d) == 0 {
                libc::pthread_attr_getstacksize(&d, &mut size);
                libc::pthread_attr_destroy(&mut d);
            }
        } else {
            libc::pthread_attr_getstacksize(attr, &mut size);
        }
    }
    if size == 0 {
        8 << 20
    } else {
        size
    }
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
    let slot = if preloaded() { crate::preload::prepare_thread() } else { None };
    let Some(slot) = slot else {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { real(thread, attr, start, arg) };
    };
    slot.set_start(start as usize, arg as usize, stack_size(attr));
    // SAFETY: as above, the thread starting in the trampoline with its slot.
    let r = unsafe { real(thread, attr, trampoline, slot as *const crate::threads::Slot as *mut libc::c_void) };
    if r != 0 {
        crate::preload::unprepare_thread(slot);
    }
    r
}

/// Before the image is replaced, write what it gathered. If exec fails the
/// process goes on and so does profiling.
fn around_exec(name: &str, call: impl FnOnce() -> libc::c_int) -> libc::c_int {
    let ours = preloaded() && AGENT.owner_is_me();
    if ours {
        AGENT.finish_with(EndedBy::Exec, Some(name));
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
type Fexecve = unsafe extern "C" fn(libc::c_int, *const *const libc::c_char, *const *const libc::c_char) -> libc::c_int;

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
            around_exec(stringify!($name), || unsafe { real($($arg),*) })
        }
    };
}

exec_wrapper!(execve, Execve, path: *const libc::c_char, argv: *const *const libc::c_char, envp: *const *const libc::c_char);
exec_wrapper!(execvpe, Execve, file: *const libc::c_char, argv: *const *const libc::c_char, envp: *const *const libc::c_char);
exec_wrapper!(execv, Execv, path: *const libc::c_char, argv: *const *const libc::c_char);
exec_wrapper!(execvp, Execv, file: *const libc::c_char, argv: *const *const libc::c_char);
// The C library's fexecve makes an `execveat` system call (or, without it,
// calls its internal execve on `/proc/self/fd/N`): no call a preload sees,
// so fexecve itself is taken.
exec_wrapper!(fexecve, Fexecve, fd: libc::c_int, argv: *const *const libc::c_char, envp: *const *const libc::c_char);

/// The `execve`, `execvpe`, `execv`, `execvp` and `fexecve` the program's
/// own calls bind to (attached; [`resolve_for_attached`]).
static REAL_EXEC: [AtomicPtr<libc::c_void>; 5] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 5];

macro_rules! attached_exec {
    ($name:ident, $index:expr, $sym:literal, $ty:ty, $($arg:ident : $t:ty),*) => {
        #[doc = concat!("The program's `", $sym, "` through its import tables, attached (`imports.rs`): the")]
        /// session ends first and sends its profile ([`crate::attach::leave`]),
        /// then the call goes on to the definition the program's own calls
        /// bind to.
        ///
        /// # Safety
        /// As the C library's function of the same name; only installed once
        /// `resolve_for_attached` found it.
        pub(crate) unsafe extern "C" fn $name($($arg: $t),*) -> libc::c_int {
            keeping_errno(|| crate::attach::leave(crate::attach::Leave::Exec($sym)));
            // SAFETY: the program's own function of this name, with this signature.
            let real = unsafe { std::mem::transmute::<*mut libc::c_void, $ty>(REAL_EXEC[$index].load(Ordering::Acquire)) };
            // SAFETY: the caller's arguments, passed on.
            unsafe { real($($arg),*) }
        }
    };
}

attached_exec!(attached_execve, 0, "execve", Execve, path: *const libc::c_char, argv: *const *const libc::c_char, envp: *const *const libc::c_char);
attached_exec!(attached_execvpe, 1, "execvpe", Execve, file: *const libc::c_char, argv: *const *const libc::c_char, envp: *const *const libc::c_char);
attached_exec!(attached_execv, 2, "execv", Execv, path: *const libc::c_char, argv: *const *const libc::c_char);
attached_exec!(attached_execvp, 3, "execvp", Execv, file: *const libc::c_char, argv: *const *const libc::c_char);
attached_exec!(attached_fexecve, 4, "fexecve", Fexecve, fd: libc::c_int, argv: *const *const libc::c_char, envp: *const *const libc::c_char);

// The attached twins of the variadic `execl`, `execlp` and `execle`
// (`exec_variadic.c`, hidden: these addresses are the agent's own). Each
// builds its argv on the stack, as the C library does, and goes on to
// `witch_attached_exec_argv`.
extern "C" {
    fn witch_attached_execl(path: *const libc::c_char, arg: *const libc::c_char, ...) -> libc::c_int;
    fn witch_attached_execlp(file: *const libc::c_char, arg: *const libc::c_char, ...) -> libc::c_int;
    fn witch_attached_execle(path: *const libc::c_char, arg: *const libc::c_char, ...) -> libc::c_int;
}

/// What the attached twins of `execl`, `execlp` and `execle` (`which` 0, 1,
/// 2, as `exec_variadic.c` numbers them) do with the argv they built: the
/// session ends first and sends its profile ([`crate::attach::leave`]),
/// then the exec goes on as the C library's `execl` (`execve` with
/// `environ`), `execlp` (`execvp`: the path search) or `execle` (`execve`
/// with the caller's `envp`) does it, through the `execve` or `execvp` the
/// program's own calls bind to. Not exported: `exec_variadic.c` declares
/// it hidden, which the linked symbol then is.
///
/// # Safety
/// As `execve` (`execvp` for `which` 1, which ignores `envp`); only called
/// by the twins, which are only installed once `resolve_for_attached`
/// found what this calls.
#[no_mangle]
unsafe extern "C" fn witch_attached_exec_argv(
    which: libc::c_int,
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> libc::c_int {
    let name = match which {
        0 => "execl",
        1 => "execlp",
        _ => "execle",
    };
    keeping_errno(|| crate::attach::leave(crate::attach::Leave::Exec(name)));
    if which == 1 {
        // SAFETY: the program's own execvp, with this signature.
        let real = unsafe { std::mem::transmute::<*mut libc::c_void, Execv>(REAL_EXEC[3].load(Ordering::Acquire)) };
        // SAFETY: the caller's file and the argv built from its arguments.
        unsafe { real(path, argv) }
    } else {
        // SAFETY: the program's own execve, with this signature.
        let real = unsafe { std::mem::transmute::<*mut libc::c_void, Execve>(REAL_EXEC[0].load(Ordering::Acquire)) };
        // SAFETY: the caller's path and environment, and the argv built from its arguments.
        unsafe { real(path, argv, envp) }
    }
}

type ExitFn = unsafe extern "C" fn(libc::c_int) -> !;

fn exit_now(name: &std::ffi::CStr, cache: &AtomicPtr<libc::c_void>, status: libc::c_int) -> ! {
    // A vfork child (posix_spawn's, on failure) shares our memory: `finish`
    // leaves the state alone unless this process owns it.
    if preloaded() {
        AGENT.finish(EndedBy::Exit);
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

/// `seccomp` operations and `prctl` modes that install a filter or strict
/// mode (`SECCOMP_SET_MODE_STRICT`, `SECCOMP_SET_MODE_FILTER`;
/// `SECCOMP_MODE_STRICT`, `SECCOMP_MODE_FILTER`).
const SECCOMP_SET_MODES: [libc::c_long; 2] = [0, 1];
const PR_SECCOMP_MODES: [libc::c_ulong; 2] = [1, 2];

/// The program is about to enter a seccomp sandbox: a preloaded agent
/// stops profiling, an attached session ends (`imports.rs` routes the
/// program's calls here).
fn entering_sandbox(how: &'static str) {
    if preloaded() && AGENT.owner_is_me() {
        keeping_errno(|| crate::preload::leave_to_sandbox(how));
    } else if AGENT.mode() == Mode::Attached {
        keeping_errno(|| crate::attach::leave(crate::attach::Leave::Sandbox(how)));
    }
}

/// The `prctl` the agent's calls on to: the next definition (preloaded), or
/// the one the program's own calls bind to (attached).
static REAL_PRCTL: AtomicPtr<libc::c_void> = AtomicPtr::new(std::ptr::null_mut());
/// The `syscall` the program's own calls bind to (attached).
static REAL_SYSCALL: AtomicPtr<libc::c_void> = AtomicPtr::new(std::ptr::null_mut());

/// An import an attached agent takes: its name, the agent's definition
/// for it, and where the definition the program's own calls bind to is
/// kept for it to call on (none for `execl`, `execlp` and `execle`, which
/// call on to `execve` or `execvp`).
pub(crate) type AttachedImport = (&'static std::ffi::CStr, *const libc::c_void, Option<&'static AtomicPtr<libc::c_void>>);

/// The imports an attached agent takes (`imports.rs`).
pub(crate) fn attached_imports() -> [AttachedImport; 10] {
    [
        (c"prctl", own_prctl as *const libc::c_void, Some(&REAL_PRCTL)),
        (c"syscall", attached_syscall as *const libc::c_void, Some(&REAL_SYSCALL)),
        (c"execve", attached_execve as *const libc::c_void, Some(&REAL_EXEC[0])),
        (c"execvpe", attached_execvpe as *const libc::c_void, Some(&REAL_EXEC[1])),
        (c"execv", attached_execv as *const libc::c_void, Some(&REAL_EXEC[2])),
        (c"execvp", attached_execvp as *const libc::c_void, Some(&REAL_EXEC[3])),
        (c"fexecve", attached_fexecve as *const libc::c_void, Some(&REAL_EXEC[4])),
        (c"execl", witch_attached_execl as *const libc::c_void, None),
        (c"execlp", witch_attached_execlp as *const libc::c_void, None),
        (c"execle", witch_attached_execle as *const libc::c_void, None),
    ]
}

/// Look up the definitions the program's own calls to the attached
/// agent's imports bind to (its global scope: an interposer it preloads,
/// else the C library), for the agent's to call on: loaded by `dlopen`,
/// outside that scope, the agent has no "next" definition to ask for. True
/// when all are known. Not for handlers.
pub(crate) fn resolve_for_attached() -> bool {
    let imports = attached_imports();
    let ours = |f: *mut libc::c_void| imports.iter().any(|&(_, own, _)| std::ptr::eq(own, f as *const libc::c_void));
    let mut all = true;
    for (name, _, cache) in imports {
        let Some(cache) = cache.filter(|c| c.load(Ordering::Acquire).is_null()) else { continue };
        // SAFETY: dlsym with a NUL-terminated name.
        let mut f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        if f.is_null() || ours(f) {
            // SAFETY: RTLD_NOLOAD finds the C library the process runs on
            // (a reference, given back below); dlsym with a NUL-terminated name.
            unsafe {
                let libc_handle = libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
                f = if libc_handle.is_null() { std::ptr::null_mut() } else { libc::dlsym(libc_handle, name.as_ptr()) };
                if !libc_handle.is_null() {
                    libc::dlclose(libc_handle);
                }
            }
        }
        cache.store(f, Ordering::Release);
        all &= !f.is_null();
    }
    all
}

/// What the agent does before a `syscall(nr, a1, ...)` of the program's
/// (preloaded or attached): `SYS_seccomp` installing a filter or strict
/// mode puts the process in a sandbox.
fn before_syscall(nr: libc::c_long, a1: libc::c_long) {
    if nr == libc::SYS_seccomp && SECCOMP_SET_MODES.contains(&a1) {
        entering_sandbox("seccomp");
    }
}

type PrctlFn = unsafe extern "C" fn(libc::c_int, libc::c_ulong, libc::c_ulong, libc::c_ulong, libc::c_ulong) -> libc::c_int;

/// `prctl(PR_SET_SECCOMP, ...)` puts the process in a sandbox: the agent
/// leaves first (see the module comment).
///
/// # Safety
/// As the C library's `prctl` (called with its five arguments, as glibc's
/// variadic definition reads them).
#[no_mangle]
pub unsafe extern "C" fn prctl(
    option: libc::c_int,
    a2: libc::c_ulong,
    a3: libc::c_ulong,
    a4: libc::c_ulong,
    a5: libc::c_ulong,
) -> libc::c_int {
    // SAFETY: as this function's.
    unsafe { own_prctl(option, a2, a3, a4, a5) }
}

/// The agent's `prctl` by an address of its own: taking the address of
/// the exported one (`prctl as *const _`) gets whichever definition the
/// loader binds the name to, the C library's when the agent is attached
/// (`imports.rs` writes this one into import tables).
///
/// # Safety
/// As [`prctl`].
pub(crate) unsafe extern "C" fn own_prctl(
    option: libc::c_int,
    a2: libc::c_ulong,
    a3: libc::c_ulong,
    a4: libc::c_ulong,
    a5: libc::c_ulong,
) -> libc::c_int {
    if option == libc::PR_SET_SECCOMP && PR_SECCOMP_MODES.contains(&a2) {
        entering_sandbox("prctl PR_SET_SECCOMP");
    }
    // SAFETY: the C library's prctl reads these five arguments.
    unsafe { std::mem::transmute::<*mut libc::c_void, PrctlFn>(next(c"prctl", &REAL_PRCTL))(option, a2, a3, a4, a5) }
}

/// `syscall(SYS_seccomp, ...)` (libseccomp's way in) puts the process in a
/// sandbox: the agent leaves first (see the module comment). The call
/// itself is made here as the C library's `syscall` makes it (the number
/// and six arguments into the kernel's registers; a result in -4095..-1 is
/// -errno), not through it: the agent's own handlers call `syscall`, and
/// looking the C library's up (`dlsym`) is not allowed there.
///
/// # Safety
/// As the C library's `syscall`, which reads a number and six arguments
/// whatever the caller passed (unused ones are whatever is in their
/// registers or stack slot, as here).
#[no_mangle]
pub unsafe extern "C" fn syscall(
    nr: libc::c_long,
    a1: libc::c_long,
    a2: libc::c_long,
    a3: libc::c_long,
    a4: libc::c_long,
    a5: libc::c_long,
    a6: libc::c_long,
) -> libc::c_long {
    before_syscall(nr, a1);
    let r: libc::c_long;
    // SAFETY: the caller's system call, as it asked for it; the kernel
    // clobbers rcx and r11 and touches no stack.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") nr => r,
            in("rdi") a1, in("rsi") a2, in("rdx") a3, in("r10") a4, in("r8") a5, in("r9") a6,
            lateout("rcx") _, lateout("r11") _,
            options(nostack),
        );
    }
    if (-4095..0).contains(&r) {
        // SAFETY: this thread's errno.
        unsafe { *libc::__errno_location() = -r as libc::c_int };
        return -1;
    }
    r
}

type SyscallFn =
    unsafe extern "C" fn(libc::c_long, libc::c_long, libc::c_long, libc::c_long, libc::c_long, libc::c_long, libc::c_long) -> libc::c_long;

/// The program's `syscall`, through its import tables, in an attached
/// process (`imports.rs`): a sandbox about to go in ends the session first;
/// then the call goes on to the definition the program's own calls bind to
/// ([`resolve_for_attached`]).
///
/// # Safety
/// As [`syscall`]; only installed once `resolve_for_attached` found it.
pub(crate) unsafe extern "C" fn attached_syscall(
    nr: libc::c_long,
    a1: libc::c_long,
    a2: libc::c_long,
    a3: libc::c_long,
    a4: libc::c_long,
    a5: libc::c_long,
    a6: libc::c_long,
) -> libc::c_long {
    before_syscall(nr, a1);
    // SAFETY: the program's own `syscall`, with the arguments it was given.
    unsafe { std::mem::transmute::<*mut libc::c_void, SyscallFn>(REAL_SYSCALL.load(Ordering::Acquire))(nr, a1, a2, a3, a4, a5, a6) }
}

type SigactionFn = unsafe extern "C" fn(libc::c_int, *const libc::sigaction, *mut libc::sigaction) -> libc::c_int;

/// `sigaction` as the program sees it: the signals the agent owns keep its
/// handler while the program's choice is remembered and reported back
/// (with `SA_RESTORER`, as the C library's own call leaves it). A handler
/// that runs on an alternate stack (`SA_ONSTACK`) gets witch's signals
/// added to its mask, unseen by the program.
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
            let mut sa = unsafe { *act };
            // As the kernel would keep it from the C library's call: with
            // the C library's signal return (`SA_RESTORER`), which ours,
            // installed through the same C library, has.
            // SAFETY: sigaction is plain data; queries our disposition.
            let mut ours: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            if unsafe { real(sig, std::ptr::null(), &mut ours) } == 0 && ours.sa_flags & SA_RESTORER != 0 {
                sa.sa_flags |= SA_RESTORER;
                sa.sa_restorer = ours.sa_restorer;
            }
            PROGRAM.set_action(sig, &sa);
        }
        return 0;
    }
    if crate::handlers::FAULTS.contains(&sig) && crate::state::AGENT.mode() == crate::state::Mode::Preloaded {
        // A fault handler of the program's runs behind the agent's guard,
        // which the program never sees.
        let guarded = PROGRAM.guarded(sig);
        let hooked = PROGRAM.fatal_hook(sig);
        if !old.is_null() {
            // SAFETY: the caller's pointer to a sigaction to fill.
            unsafe {
                if guarded {
                    *old = PROGRAM.action(sig);
                } else if real(sig, std::ptr::null(), old) == 0 && hooked {
                    (*old).sa_sigaction = libc::SIG_DFL;
                    (*old).sa_flags = 0;
                }
            }
        }
        if act.is_null() {
            return 0;
        }
        PROGRAM.set_fatal_hook(sig, false);
        // SAFETY: the caller's pointer to a sigaction to read.
        return crate::handlers::guard(sig, unsafe { &*act });
    }
    // A handler on the program's own alternate stack: witch's signals wait
    // until it returns. That stack is sized for the program's signals one
    // at a time (each handler blocks its own); a sample or trap taken
    // inside the handler would put a second kernel frame (3 to 12 KB) on it.
    // SAFETY: the caller's pointer, null or a sigaction to read.
    let onstack = unsafe { act.as_ref() }
        .filter(|a| a.sa_flags & libc::SA_ONSTACK != 0 && a.sa_sigaction != libc::SIG_DFL && a.sa_sigaction != libc::SIG_IGN);
    let mut added = 0u64;
    let mut copy = onstack.copied();
    let act = match copy.as_mut() {
        Some(copy) => {
            for s in [libc::SIGTRAP, sampler_signal()] {
                // SAFETY: valid set and signal numbers.
                if unsafe { libc::sigismember(&copy.sa_mask, s) } == 0 {
                    // SAFETY: as above.
                    unsafe { libc::sigaddset(&mut copy.sa_mask, s) };
                    added |= 1 << (s - 1);
                }
            }
            copy as *const libc::sigaction
        }
        None => act,
    };
    let before = PROGRAM.added_mask(sig);
    let hooked = PROGRAM.fatal_hook(sig);
    // SAFETY: the caller's arguments (the action perhaps with witch's signals added), passed on.
    let r = unsafe { real(sig, act, old) };
    if r != 0 {
        return r;
    }
    if !old.is_null() {
        // SAFETY: the caller's sigaction, filled by the call.
        let old = unsafe { &mut *old };
        if hooked {
            // Our fatal-signal hook is invisible: the program sees SIG_DFL.
            // SAFETY: all zero is SIG_DFL with no flags and an empty mask.
            *old = unsafe { std::mem::zeroed() };
        } else {
            // What the program set, without what the agent added to it.
            for s in [libc::SIGTRAP, sampler_signal()] {
                if before & (1 << (s - 1)) != 0 {
                    // SAFETY: a valid set and signal number.
                    unsafe { libc::sigdelset(&mut old.sa_mask, s) };
                }
            }
        }
    }
    if !act.is_null() {
        PROGRAM.set_added_mask(sig, added);
        if hooked {
            PROGRAM.set_fatal_hook(sig, false);
        }
    }
    0
}

/// The flag the C library's `sigaction` adds for its signal return.
const SA_RESTORER: libc::c_int = 0x0400_0000;

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

// Dynamic loading. The module map (witchcraft::modules) is read in place
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
    modules::reclaim_retired(|| AGENT.threads.grace());
}

/// `f` with the caller's errno kept.
fn keeping_errno<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: this thread's errno.
    let e = unsafe { *libc::__errno_location() };
    let r = f();
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = e };
    r
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
        AGENT.threads.grace();
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
