//! Signals: one handler for samples and traps, on each thread's sigaltstack.
//!
//! Samples and traps both arrive as SIGTRAP with `si_code == TRAP_PERF` and
//! our tag in `si_perf_data` (or, before Linux 5.13, as a real-time signal
//! naming the event fd). Anything else is the program's: it goes to the
//! handler the program installed, which we keep (and report back) by
//! interposing `sigaction` and `signal` for the signals we own. Fatal
//! signals with default action write the profile first, then kill as usual.

use crate::agent::{self, STOPPING};
use std::sync::atomic::{AtomicBool, Ordering};
use witchcraft::engine;
use witchcraft::sys::perf::{self, Attr, BpType};
use witchcraft::sys::siginfo::{self, sampler_signal};
use witchcraft::sys::task::{self, thread_cpu_ns};

/// The program's own disposition for the signals we own (SIGTRAP and the
/// fallback real-time signal), indexed by signal number.
static mut PROGRAM: [libc::sigaction; 65] = unsafe { std::mem::zeroed() };
static OWNED: [AtomicBool; 65] = [const { AtomicBool::new(false) }; 65];
/// Fatal signals whose default action we replaced (to write the profile).
static FATAL_OURS: [AtomicBool; 65] = [const { AtomicBool::new(false) }; 65];
const FATAL: [i32; 8] =
    [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT, libc::SIGABRT, libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE];

type SigactionFn = unsafe extern "C" fn(libc::c_int, *const libc::sigaction, *mut libc::sigaction) -> libc::c_int;

fn real_sigaction() -> SigactionFn {
    static REAL: std::sync::atomic::AtomicPtr<libc::c_void> = std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
    let mut f = REAL.load(Ordering::Relaxed);
    if f.is_null() {
        f = agent::next_symbol(c"sigaction");
        REAL.store(f, Ordering::Relaxed);
    }
    unsafe { std::mem::transmute(f) }
}

fn handler_action(h: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)) -> libc::sigaction {
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = h as usize;
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
    unsafe { libc::sigemptyset(&mut sa.sa_mask) };
    sa
}

/// The attached agent's control signal: "set yourself up" or "leave",
/// sent by its control thread with tgkill. Above the sampler's signal, so
/// a thread handles any pending sample (and SIGTRAP) before it.
pub fn control_signal() -> i32 {
    libc::SIGRTMIN() + 8
}

pub fn install(sigtrap: bool) {
    install_owned(sigtrap);
    for sig in FATAL {
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        unsafe { real_sigaction()(sig, std::ptr::null(), &mut old) };
        if old.sa_sigaction == libc::SIG_DFL {
            let mut sa = handler_action(on_fatal);
            sa.sa_flags |= libc::SA_RESETHAND;
            unsafe { real_sigaction()(sig, &sa, std::ptr::null_mut()) };
            FATAL_OURS[sig as usize].store(true, Ordering::Release);
        }
    }
}

/// Take SIGTRAP and the sampler's signal, remembering the program's handlers.
fn install_owned(sigtrap: bool) {
    let _ = sigtrap; // both signals are used either way: RT for the sampler
    let sigs = [libc::SIGTRAP, sampler_signal()];
    for &sig in &sigs {
        let mut sa = handler_action(on_signal);
        // Never nest: a sample must not interrupt a trap handler or vice
        // versa, and a thread must not leave its alternate stack while on it.
        unsafe {
            libc::sigaddset(&mut sa.sa_mask, libc::SIGTRAP);
            libc::sigaddset(&mut sa.sa_mask, sampler_signal());
            libc::sigaddset(&mut sa.sa_mask, control_signal());
        }
        unsafe {
            real_sigaction()(sig, &sa, std::ptr::addr_of_mut!(PROGRAM[sig as usize]));
        }
        OWNED[sig as usize].store(true, Ordering::Release);
    }
}

/// An attached agent's handlers: ours for SIGTRAP and the sampler, and the
/// control signal, which runs on the thread's own stack (it installs and
/// removes the alternate one). No fatal-signal hooks: the program's
/// `sigaction` calls are not interposed, so they could not stay invisible.
pub fn install_attached(sigtrap: bool) {
    install_owned(sigtrap);
    let sig = control_signal();
    let mut sa = handler_action(on_control);
    sa.sa_flags &= !libc::SA_ONSTACK;
    unsafe {
        libc::sigaddset(&mut sa.sa_mask, libc::SIGTRAP);
        libc::sigaddset(&mut sa.sa_mask, sampler_signal());
        real_sigaction()(sig, &sa, std::ptr::addr_of_mut!(PROGRAM[sig as usize]));
    }
    OWNED[sig as usize].store(true, Ordering::Release);
}

/// Give the program back its handlers (attached agent, after detach),
/// unless it replaced ours meanwhile, in which case its choice stands.
pub fn restore_attached(keep_control: bool) {
    for sig in [libc::SIGTRAP, sampler_signal(), control_signal()] {
        if keep_control && sig == control_signal() {
            continue;
        }
        let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
        unsafe { real_sigaction()(sig, std::ptr::null(), &mut cur) };
        let ours = cur.sa_sigaction == on_signal as *const () as usize || cur.sa_sigaction == on_control as *const () as usize;
        if ours {
            unsafe { real_sigaction()(sig, std::ptr::addr_of!(PROGRAM[sig as usize]), std::ptr::null_mut()) };
        }
        OWNED[sig as usize].store(false, Ordering::Release);
    }
}

extern "C" fn on_control(sig: libc::c_int, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let errno = unsafe { *libc::__errno_location() };
    // Ours only if sent by this process with tgkill.
    let from_us = unsafe { (*info).si_code == libc::SI_TKILL && (*info).si_pid() == libc::getpid() };
    if !(from_us && crate::attach::on_control(uc as *mut libc::ucontext_t)) {
        chain(sig, info, uc);
    }
    unsafe { *libc::__errno_location() = errno };
}

extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let errno = unsafe { *libc::__errno_location() };
    if !dispatch(sig, info, uc as *mut libc::ucontext_t) {
        chain(sig, info, uc);
    }
    unsafe { *libc::__errno_location() = errno };
}

/// Handle our own samples and traps; false if the signal isn't ours.
fn dispatch(sig: i32, info: *mut libc::siginfo_t, uc: *mut libc::ucontext_t) -> bool {
    if CALIBRATING.load(Ordering::Acquire) {
        return calibration_signal(sig, info, uc);
    }
    let Some(engine) = agent::engine() else { return false };
    let ts = agent::current_thread();
    // SAFETY: `ts` is null or this thread's state, which only this thread's
    // handlers touch while it is active.
    let Some(event) = (unsafe { engine::classify(sig, info, ts.as_ref()) }) else { return false };
    if ts.is_null() || STOPPING.load(Ordering::Acquire) {
        return true;
    }
    // SAFETY: as above; `uc` is the kernel's context for this signal.
    unsafe { (*ts).handle(engine, event, uc) };
    true
}

/// Give a signal that isn't ours to the program's handler, or its default.
fn chain(sig: i32, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let sa = unsafe { std::ptr::read(std::ptr::addr_of!(PROGRAM[sig as usize])) };
    match sa.sa_sigaction {
        libc::SIG_IGN => {}
        libc::SIG_DFL => unsafe {
            // Default action (SIGTRAP: core dump). Deliver it as it would have been.
            let mut d: libc::sigaction = std::mem::zeroed();
            d.sa_sigaction = libc::SIG_DFL;
            real_sigaction()(sig, &d, std::ptr::null_mut());
            libc::syscall(libc::SYS_tgkill, libc::getpid(), task::gettid(), sig);
        },
        h => unsafe {
            if sa.sa_flags & libc::SA_SIGINFO != 0 {
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = std::mem::transmute(h);
                f(sig, info, uc);
            } else {
                let f: extern "C" fn(libc::c_int) = std::mem::transmute(h);
                f(sig);
            }
        },
    }
}

/// A fatal signal with default action: save what was gathered, then die
/// the way the program would have (SA_RESETHAND restored the default).
extern "C" fn on_fatal(sig: libc::c_int, _info: *mut libc::siginfo_t, _uc: *mut libc::c_void) {
    FATAL_OURS[sig as usize].store(false, Ordering::Release);
    // Best effort: this allocates, which a signal may have interrupted.
    agent::finish(&format!("signal {sig}"));
    unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), task::gettid(), sig) };
}

/// `sigaction` as the program sees it: the signals we own keep our handler
/// while the program's choice is remembered and reported back.
#[no_mangle]
pub unsafe extern "C" fn sigaction(sig: libc::c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> libc::c_int {
    if (1..65).contains(&sig) {
        let i = sig as usize;
        if OWNED[i].load(Ordering::Acquire) {
            if !old.is_null() {
                *old = std::ptr::read(std::ptr::addr_of!(PROGRAM[i]));
            }
            if !act.is_null() {
                std::ptr::write(std::ptr::addr_of_mut!(PROGRAM[i]), *act);
            }
            return 0;
        }
        if FATAL_OURS[i].load(Ordering::Acquire) {
            // Our fatal-signal hook is invisible: the program sees SIG_DFL.
            let r = real_sigaction()(sig, act, old);
            if r == 0 && !old.is_null() {
                (*old).sa_sigaction = libc::SIG_DFL;
                (*old).sa_flags = 0;
            }
            if !act.is_null() && r == 0 {
                FATAL_OURS[i].store(false, Ordering::Release);
            }
            return r;
        }
    }
    real_sigaction()(sig, act, old)
}

#[no_mangle]
pub unsafe extern "C" fn signal(sig: libc::c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    let mut sa: libc::sigaction = std::mem::zeroed();
    sa.sa_sigaction = handler;
    sa.sa_flags = libc::SA_RESTART;
    let mut old: libc::sigaction = std::mem::zeroed();
    if sigaction(sig, &sa, &mut old) != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}

type MaskFn = unsafe extern "C" fn(libc::c_int, *const libc::sigset_t, *mut libc::sigset_t) -> libc::c_int;

/// `set` without the signals we own, if it names any (else `set` itself).
/// The program may block anything but our samples and traps: a thread that
/// blocks every signal (a common way to leave them all to one thread) would
/// otherwise never be sampled, and its traps would arrive late. Its masks
/// are otherwise kept, and glibc's own internal masking is untouched.
unsafe fn without_ours(how: libc::c_int, set: *const libc::sigset_t, copy: &mut libc::sigset_t) -> *const libc::sigset_t {
    if set.is_null() || how == libc::SIG_UNBLOCK {
        return set;
    }
    let ours = [libc::SIGTRAP, sampler_signal()];
    let owned = |sig: i32| OWNED[sig as usize].load(Ordering::Acquire);
    if !ours.iter().any(|&sig| owned(sig) && libc::sigismember(set, sig) == 1) {
        return set;
    }
    *copy = *set;
    for sig in ours.into_iter().filter(|&sig| owned(sig)) {
        libc::sigdelset(copy, sig);
    }
    copy
}

fn real_mask(name: &std::ffi::CStr, slot: &std::sync::atomic::AtomicPtr<libc::c_void>) -> MaskFn {
    let mut f = slot.load(Ordering::Relaxed);
    if f.is_null() {
        f = agent::next_symbol(name);
        slot.store(f, Ordering::Relaxed);
    }
    unsafe { std::mem::transmute(f) }
}

#[no_mangle]
pub unsafe extern "C" fn pthread_sigmask(how: libc::c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> libc::c_int {
    static REAL: std::sync::atomic::AtomicPtr<libc::c_void> = std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
    let mut copy: libc::sigset_t = std::mem::zeroed();
    real_mask(c"pthread_sigmask", &REAL)(how, without_ours(how, set, &mut copy), old)
}

#[no_mangle]
pub unsafe extern "C" fn sigprocmask(how: libc::c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> libc::c_int {
    static REAL: std::sync::atomic::AtomicPtr<libc::c_void> = std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
    let mut copy: libc::sigset_t = std::mem::zeroed();
    real_mask(c"sigprocmask", &REAL)(how, without_ours(how, set, &mut copy), old)
}

// ---- calibration ---------------------------------------------------------

static CALIBRATING: AtomicBool = AtomicBool::new(false);
static CALIBRATION_HITS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
const CALIBRATION_TAG: u64 = 0xfe;

/// Steps left in the step calibration (0: not stepping).
static CALIBRATION_STEPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn calibration_signal(sig: i32, info: *mut libc::siginfo_t, uc: *mut libc::ucontext_t) -> bool {
    const TF: i64 = 0x100;
    // SAFETY: the kernel's siginfo and context for this signal.
    let origin = unsafe { siginfo::origin(sig, info) };
    let efl = unsafe { &mut (*uc).uc_mcontext.gregs[libc::REG_EFL as usize] };
    let stepping = CALIBRATION_STEPS.load(Ordering::Relaxed) > 0;
    let ours = match origin {
        siginfo::Origin::Perf { data, .. } => data == siginfo::TAG | CALIBRATION_TAG,
        siginfo::Origin::Step if stepping => {
            // One instruction ran; step the next, or stop.
            if CALIBRATION_STEPS.fetch_sub(1, Ordering::Relaxed) > 1 {
                *efl |= TF;
            } else {
                *efl &= !TF;
            }
            true
        }
        _ if sig == sampler_signal() => {
            if stepping {
                *efl |= TF;
            }
            true
        }
        _ => false,
    };
    if ours {
        let t0 = thread_cpu_ns();
        std::hint::black_box(t0);
        let _ = thread_cpu_ns(); // the two clock reads a real handler makes
        CALIBRATION_HITS.fetch_add(1, Ordering::Relaxed);
    }
    ours
}

/// Measure, on this machine, the CPU cost of a watchpoint trap, of a
/// signal round trip, and of one single step, outside our handler code:
/// exception entry, signal delivery and sigreturn (in a VM, the
/// hypervisor's part too). Runs once, before sampling starts.
pub fn calibrate(sigtrap: bool) -> witchcraft::engine::Costs {
    // Few: the trap cost is re-measured while the program runs (engine `on_trap`).
    const N: u64 = 16;
    CALIBRATING.store(true, Ordering::Release);
    let cell = Box::new(std::cell::UnsafeCell::new(0u64));
    let addr = cell.get() as u64;
    let mut trap_ns = 0;
    let a = Attr::breakpoint(addr, 8, BpType::W).expect("an aligned u64");
    let a = if sigtrap { a.sigtrap(siginfo::TAG | CALIBRATION_TAG) } else { a };
    if let Ok(fd) = a.open(0) {
        if !sigtrap {
            perf::route_signal_to_thread(fd, sampler_signal(), task::gettid());
        }
        CALIBRATION_HITS.store(0, Ordering::Relaxed);
        let t0 = thread_cpu_ns();
        for i in 0..N {
            unsafe { std::ptr::write_volatile(cell.get(), i) };
        }
        let t1 = thread_cpu_ns();
        let hits = CALIBRATION_HITS.load(Ordering::Relaxed).max(1);
        trap_ns = (t1 - t0) / hits;
        perf::close(fd);
    }
    // A signal round trip without an exception: delivery and sigreturn.
    CALIBRATION_HITS.store(0, Ordering::Relaxed);
    let t0 = thread_cpu_ns();
    for _ in 0..N {
        unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), task::gettid(), sampler_signal()) };
    }
    let t1 = thread_cpu_ns();
    let signal_ns = (t1 - t0) / CALIBRATION_HITS.load(Ordering::Relaxed).max(1);
    // Single steps: the sampler's signal sets the trap flag, then each step
    // of a busy loop is one SIGTRAP with TRAP_TRACE.
    const STEPS: u64 = 64;
    CALIBRATION_HITS.store(0, Ordering::Relaxed);
    CALIBRATION_STEPS.store(STEPS, Ordering::Relaxed);
    let t0 = thread_cpu_ns();
    task::tgkill(task::gettid(), sampler_signal());
    let mut spin = 0u64;
    while CALIBRATION_STEPS.load(Ordering::Relaxed) > 0 && spin < 1_000_000 {
        spin = std::hint::black_box(spin + 1);
    }
    let t1 = thread_cpu_ns();
    let stepped = STEPS - CALIBRATION_STEPS.swap(0, Ordering::Relaxed);
    let step_ns = (t1 - t0).saturating_sub(signal_ns).checked_div(stepped).unwrap_or(0);
    CALIBRATING.store(false, Ordering::Release);
    drop(cell);
    witchcraft::engine::Costs { trap_ns, signal_ns, step_ns, ns_per_cycle: task::ns_per_cycle(500_000) }
}
