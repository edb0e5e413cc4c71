//! The C library functions a preloaded agent interposes (an attached one is
//! loaded with `RTLD_LOCAL` and interposes nothing):
//!
//! - `pthread_create`: every new thread is set up before it runs
//!   ([`crate::thread_life`]);
//! - the exec family, `fexecve` too (`execl*` in `exec_variadic.c`): the
//!   profile is written before the image is replaced, and profiling goes on
//!   if exec fails; an image the agent cannot enter is noted
//!   (`crate::exec_image`), as is one `posix_spawn` and `posix_spawnp` start;
//! - `_exit`, `_Exit`: the profile is written (exit's atexit handlers,
//!   which write it otherwise, are skipped);
//! - `ptrace`: a process that asks to be traced (`PTRACE_TRACEME`) leaves
//!   its debug registers and signals to its debugger;
//! - `prctl` and `syscall` (the latter in [`crate::program_syscall`]), for
//!   `PR_SET_SECCOMP` and `SYS_seccomp` and the like: a
//!   process that puts itself in a seccomp sandbox is left before the
//!   filter goes in (`leave::leave_to_sandbox`; an attached agent gets
//!   these two, and the `exec` calls and `fexecve`, through the program's
//!   import tables, `imports.rs`, and ends its session, `Session::leave`).
//!
//! The others have modules of their own: `sigaction`, `signal`,
//! `sigprocmask` and `pthread_sigmask` ([`crate::dispositions`]); `dlopen`,
//! `dlmopen`, `dlclose` and `dlsym` ([`crate::loading`]).

use crate::attach_state::{Leave, SESSION};
use crate::exec_image::{self, Target};
use crate::leave;
use crate::program_syscall::{entering_sandbox, DISPATCH, PR_SECCOMP_MODES, SECCOMP_PRCTL};
use crate::state::{preloaded, AGENT};
use crate::symbols::{keeping_errno, next};
use crate::thread_life;
use std::sync::atomic::{AtomicPtr, Ordering};
use witchcraft::profile::EndedBy;
use witchcraft::sys::task;

type StartFn = extern "C" fn(*mut libc::c_void) -> *mut libc::c_void;
type PthreadCreate = unsafe extern "C" fn(*mut libc::pthread_t, *const libc::pthread_attr_t, StartFn, *mut libc::c_void) -> libc::c_int;

/// A new thread's start: it takes its slot, prepared by its creator, and
/// runs the program's start routine. Nothing here allocates (see
/// `thread_life::prepare_thread`).
extern "C" fn trampoline(p: *mut libc::c_void) -> *mut libc::c_void {
    // SAFETY: `pthread_create` below passes a slot of the static table.
    let slot = unsafe { &*(p as *const crate::threads::ThreadSlot) };
    let (start, arg, stack) = slot.start();
    thread_life::adopt_thread(slot, thread_life::created_thread_stack(stack));
    thread_life::whole_run_from(start as u64);
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
    let slot = if preloaded() { thread_life::prepare_thread() } else { None };
    let Some(slot) = slot else {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { real(thread, attr, start, arg) };
    };
    slot.set_start(start as usize, arg as usize, stack_size(attr));
    // SAFETY: as above, the thread starting in the trampoline with its slot.
    let r = unsafe { real(thread, attr, trampoline, slot as *const crate::threads::ThreadSlot as *mut libc::c_void) };
    if r != 0 {
        thread_life::unprepare_thread(slot);
    }
    r
}

/// Before the image is replaced, write what it gathered, with a note if
/// the new image (`target`, with environment `envp`; null: this
/// process's) will run without the agent. If exec fails the process goes
/// on and so does profiling (without that note). A `vfork` child (its
/// parent's agent, not its own: no fork handler ran) leaves the note in its
/// parent's profile, whose memory it shares (a shell runs a command so).
///
/// # Safety
/// `target` and `envp` are the exec call's own arguments.
unsafe fn around_exec(name: &str, target: Target, envp: *const *const libc::c_char, call: impl FnOnce() -> libc::c_int) -> libc::c_int {
    let profiled = preloaded();
    let ours = profiled && AGENT.owner_is_me();
    // SAFETY: forwarded from the caller.
    let unprofiled = if profiled { keeping_errno(|| unsafe { exec_image::unprofiled(target, envp, std::process::id()) }) } else { None };
    if let Some(n) = &unprofiled {
        AGENT.note(n.clone());
    }
    let quiesced = ours.then(|| AGENT.finish_with(EndedBy::Exec, Some(name)));
    let r = call();
    // SAFETY: this thread's errno.
    let e = unsafe { *libc::__errno_location() };
    if let Some(n) = &unprofiled {
        AGENT.forget_note(n);
    }
    if let Some(quiesced) = quiesced {
        AGENT.resume(quiesced);
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = e };
    r
}

type Execve = unsafe extern "C" fn(*const libc::c_char, *const *const libc::c_char, *const *const libc::c_char) -> libc::c_int;
type Execv = unsafe extern "C" fn(*const libc::c_char, *const *const libc::c_char) -> libc::c_int;
type Fexecve = unsafe extern "C" fn(libc::c_int, *const *const libc::c_char, *const *const libc::c_char) -> libc::c_int;

macro_rules! exec_wrapper {
    ($name:ident, $ty:ty, $target:expr, $envp:expr, $($arg:ident : $t:ty),*) => {
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
            unsafe { around_exec(stringify!($name), $target, $envp, || real($($arg),*)) }
        }
    };
}

exec_wrapper!(execve, Execve, Target::Path(path), envp, path: *const libc::c_char, argv: *const *const libc::c_char, envp: *const *const libc::c_char);
exec_wrapper!(execvpe, Execve, Target::Search(file), envp, file: *const libc::c_char, argv: *const *const libc::c_char, envp: *const *const libc::c_char);
exec_wrapper!(execv, Execv, Target::Path(path), std::ptr::null(), path: *const libc::c_char, argv: *const *const libc::c_char);
exec_wrapper!(execvp, Execv, Target::Search(file), std::ptr::null(), file: *const libc::c_char, argv: *const *const libc::c_char);
// The C library's fexecve makes an `execveat` system call (or, without it,
// calls its internal execve on `/proc/self/fd/N`): no call a preload sees,
// so fexecve itself is taken.
exec_wrapper!(fexecve, Fexecve, Target::Fd(fd), envp, fd: libc::c_int, argv: *const *const libc::c_char, envp: *const *const libc::c_char);

type PosixSpawn = unsafe extern "C" fn(
    *mut libc::pid_t,
    *const libc::c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    *const *mut libc::c_char,
    *const *mut libc::c_char,
) -> libc::c_int;

macro_rules! spawn_wrapper {
    ($name:ident, $target:ident) => {
        /// After the C library's function of the same name started a
        /// program (its child execs it without a call a preload sees): a
        /// note if that program runs without the agent (see
        /// [`around_exec`]).
        ///
        /// # Safety
        /// As the C library's function of the same name.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            pid: *mut libc::pid_t,
            file: *const libc::c_char,
            actions: *const libc::posix_spawn_file_actions_t,
            attr: *const libc::posix_spawnattr_t,
            argv: *const *mut libc::c_char,
            envp: *const *mut libc::c_char,
        ) -> libc::c_int {
            static REAL: AtomicPtr<libc::c_void> = AtomicPtr::new(std::ptr::null_mut());
            let name = std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()).expect("NUL-terminated");
            // SAFETY: the C library's function has this signature.
            let real = unsafe { std::mem::transmute::<*mut libc::c_void, PosixSpawn>(next(name, &REAL)) };
            let mut child: libc::pid_t = 0;
            let out = if pid.is_null() { &mut child as *mut libc::pid_t } else { pid };
            // SAFETY: the caller's arguments, passed on (the child's pid to ours if it gave none).
            let r = unsafe { real(out, file, actions, attr, argv, envp) };
            if r == 0 && preloaded() {
                // SAFETY: the call's own path and environment; `out` was written.
                let note = keeping_errno(|| unsafe { exec_image::unprofiled(Target::$target(file), envp.cast(), *out as u32) });
                if let Some(n) = note {
                    AGENT.note(n);
                }
            }
            r
        }
    };
}

spawn_wrapper!(posix_spawn, Path);
spawn_wrapper!(posix_spawnp, Search);

/// The `execve`, `execvpe`, `execv`, `execvp` and `fexecve` the program's
/// own calls bind to (attached; [`resolve_for_attached`]).
static REAL_EXEC: [AtomicPtr<libc::c_void>; 5] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 5];

macro_rules! attached_exec {
    ($name:ident, $index:expr, $sym:literal, $ty:ty, $($arg:ident : $t:ty),*) => {
        #[doc = concat!("The program's `", $sym, "` through its import tables, attached (`imports.rs`): the")]
        /// session ends first and sends its profile ([`Session::leave`](crate::attach_state::Session::leave)),
        /// then the call goes on to the definition the program's own calls
        /// bind to.
        ///
        /// # Safety
        /// As the C library's function of the same name; only installed once
        /// `resolve_for_attached` found it.
        pub(crate) unsafe extern "C" fn $name($($arg: $t),*) -> libc::c_int {
            keeping_errno(|| SESSION.leave(Leave::Exec($sym)));
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
/// session ends first and sends its profile ([`Session::leave`](crate::attach_state::Session::leave)),
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
    keeping_errno(|| SESSION.leave(Leave::Exec(name)));
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
        leave::leave_to_debugger("it asked to be traced (PTRACE_TRACEME)");
    }
    // SAFETY: the C library's ptrace reads these four arguments.
    unsafe { std::mem::transmute::<*mut libc::c_void, PtraceFn>(next(c"ptrace", &REAL))(req, pid, addr, data) }
}

/// The `prctl` the agent's calls on to: the next definition (preloaded), or
/// the one the program's own calls bind to (attached).
static REAL_PRCTL: AtomicPtr<libc::c_void> = AtomicPtr::new(std::ptr::null_mut());

/// An import an attached agent takes: its name, the agent's definition
/// for it, and where the definition the program's own calls bind to is
/// kept for it to call on (none for `execl`, `execlp` and `execle`, which
/// call on to `execve` or `execvp`).
pub(crate) type AttachedImport = (&'static std::ffi::CStr, *const libc::c_void, Option<&'static AtomicPtr<libc::c_void>>);

/// The imports an attached agent takes (`imports.rs`).
pub(crate) fn attached_imports() -> [AttachedImport; 15] {
    [
        (
            c"pthread_sigmask",
            crate::dispositions::own_pthread_sigmask as *const libc::c_void,
            Some(&crate::dispositions::REAL_PTHREAD_SIGMASK),
        ),
        (c"sigprocmask", crate::dispositions::own_sigprocmask as *const libc::c_void, Some(&crate::dispositions::REAL_SIGPROCMASK)),
        (c"mprotect", crate::code_patch::own_mprotect as *const libc::c_void, Some(&crate::code_patch::REAL_MPROTECT)),
        (c"prctl", own_prctl as *const libc::c_void, Some(&REAL_PRCTL)),
        (c"syscall", crate::program_syscall::attached_syscall as *const libc::c_void, Some(&crate::program_syscall::REAL_SYSCALL)),
        (c"sigaction", crate::dispositions::own_sigaction as *const libc::c_void, None),
        (c"signal", crate::dispositions::own_signal as *const libc::c_void, None),
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
        // (Not dlsym(RTLD_DEFAULT) alone: in a program linked without PIE
        // that takes `execve`'s address, it is the program's PLT entry,
        // which would call the agent's again.)
        let mut f = crate::symbols::global_definition(name);
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
        entering_sandbox(SECCOMP_PRCTL);
    }
    if option == task::PR_SET_SYSCALL_USER_DISPATCH && a2 == task::PR_SYS_DISPATCH_ON {
        entering_sandbox(DISPATCH);
    }
    if option == task::PR_SET_TSC && a2 == task::PR_TSC_SIGSEGV {
        // The thread is turning the time-stamp counter off (replay tools
        // and some sandboxes do): the agent's clocks stop reading it first,
        // or its next read in a handler of witch's would kill the program.
        task::counter_off();
    }
    // SAFETY: the C library's prctl reads these five arguments.
    unsafe { std::mem::transmute::<*mut libc::c_void, PrctlFn>(next(c"prctl", &REAL_PRCTL))(option, a2, a3, a4, a5) }
}
