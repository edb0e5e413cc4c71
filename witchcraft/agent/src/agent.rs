//! The preload agent: `LD_PRELOAD=libwitchcraft.so` puts the engine inside
//! an unmodified program.
//!
//! It configures itself from the environment at load time, sets up every
//! thread (interposing `pthread_create`), starts afresh in a `fork` child,
//! writes its profile before `exec` (events carry `remove_on_exec`, so none
//! leak into the new image, while `LD_PRELOAD` carries over), and writes one
//! profile per process at exit, or when a fatal signal with default action
//! arrives.
//!
//! The exec family is wrapped here, and `execl*` (variadic) in
//! `exec_variadic.c`. `system` and `posix_spawn` exec in a new process,
//! which loads the agent itself. Code loaded by `dlopen` is unwound and
//! decoded from the next module refresh on (a new thread, or exit).

use crate::signal;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use witchcraft::config::Config;
use witchcraft::engine::{Engine, SamplerKind, ThreadState};
use witchcraft::modules;
use witchcraft::profile::{self, Profile};
use witchcraft::sys::{procfs, task};

/// The running engine: set once by a preloaded agent, or per session by an
/// attached one (see `attach.rs`), which frees it after detaching.
static ENGINE: AtomicPtr<Engine> = AtomicPtr::new(std::ptr::null_mut());
/// Set while the process's profile is being written: handlers do nothing.
pub static STOPPING: AtomicBool = AtomicBool::new(false);
pub(crate) static FINISHED: AtomicBool = AtomicBool::new(false);
/// The pid the engine state belongs to; differs in a vfork/posix_spawn child
/// that shares our memory, which must then leave the state alone.
pub(crate) static OWNER_PID: AtomicU32 = AtomicU32::new(0);
pub(crate) static START_NS: AtomicU64 = AtomicU64::new(0);
pub(crate) static NOTES: Mutex<Vec<String>> = Mutex::new(Vec::new());

pub(crate) const MAX_THREADS: usize = 8192;
pub(crate) static THREADS: [AtomicPtr<ThreadState>; MAX_THREADS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_THREADS];
pub(crate) static NTHREADS: AtomicUsize = AtomicUsize::new(0);
pub(crate) static THREADS_FAILED: AtomicU64 = AtomicU64::new(0);
/// Set while an attached agent (no preload, no TLS) runs a session.
pub static ATTACHED: AtomicBool = AtomicBool::new(false);
static mut KEY: libc::pthread_key_t = 0;

thread_local! {
    static STATE: Cell<*mut ThreadState> = const { Cell::new(std::ptr::null_mut()) };
}

/// This thread's engine state (async-signal-safe: a plain TLS read, or,
/// in an attached agent, a scan of the thread table: the TLS block of a
/// `dlopen`ed library is allocated lazily, with malloc, on first touch).
pub fn current_thread() -> *mut ThreadState {
    if ATTACHED.load(Ordering::Acquire) {
        return crate::attach::lookup(task::gettid());
    }
    STATE.with(|s| s.get())
}

pub fn engine() -> Option<&'static Engine> {
    let p = ENGINE.load(Ordering::Acquire);
    if p.is_null() {
        None
    } else {
        Some(unsafe { &*p })
    }
}

/// Publish the engine; false if one is already running.
pub(crate) fn set_engine(e: Engine) -> bool {
    let b = Box::into_raw(Box::new(e));
    if ENGINE.compare_exchange(std::ptr::null_mut(), b, Ordering::AcqRel, Ordering::Acquire).is_err() {
        drop(unsafe { Box::from_raw(b) });
        return false;
    }
    true
}

/// Withdraw the engine (attached agent, after detach). Frees it only when
/// no handler can still be reading it.
pub(crate) fn clear_engine(free: bool) {
    let p = ENGINE.swap(std::ptr::null_mut(), Ordering::AcqRel);
    if free && !p.is_null() {
        drop(unsafe { Box::from_raw(p) });
    }
}

pub(crate) fn note(s: String) {
    if let Ok(mut n) = NOTES.lock() {
        if !n.contains(&s) {
            n.push(s);
        }
    }
}

pub(crate) fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

extern "C" fn init() {
    let cfg = match Config::from_env() {
        Ok(Some(c)) => c,
        Ok(None) => return,
        Err(e) => {
            eprintln!("witch: agent: {e}; not profiling");
            return;
        }
    };
    let engine = make_engine(cfg, signal::install);
    if !set_engine(engine) {
        return;
    }
    OWNER_PID.store(std::process::id(), Ordering::Relaxed);
    START_NS.store(now_ns(), Ordering::Relaxed);
    unsafe {
        libc::pthread_key_create(std::ptr::addr_of_mut!(KEY), Some(thread_end));
        libc::pthread_atfork(None, None, Some(after_fork_child));
        libc::atexit(at_exit);
    }
    start_thread();
}

/// Choose the sampler, probe the kernel, install the handlers (`install`)
/// and calibrate: everything before the first thread starts.
pub(crate) fn make_engine(cfg: Config, install: fn(bool)) -> Engine {
    let own = own_code_range();
    modules::set_own_address(own.0);
    modules::refresh();
    let mut notes = Vec::new();
    let (sampler, period) = SamplerKind::choose(&cfg, &mut notes);
    notes.into_iter().for_each(note);
    let sigtrap = !cfg.no_sigtrap && witchcraft::probe::sigtrap_supported();
    if !sigtrap {
        note("sigtrap unavailable (Linux < 5.13?): traps use F_SETSIG with a real-time signal".into());
    }
    let modify = !cfg.no_modify && witchcraft::probe::modify_attributes_supported();
    if !modify {
        note("PERF_EVENT_IOC_MODIFY_ATTRIBUTES unavailable: watchpoints re-armed by close+reopen".into());
    }
    let craft = witchcraft::craft::for_kind(cfg.craft, cfg.fp_precision);
    install(sigtrap);
    let costs = signal::calibrate(sigtrap);
    let (trap_cost_ns, signal_cost_ns) = (costs.trap_ns, costs.signal_ns);
    note(format!(
        "measured round trips: watchpoint trap {:.1} µs, signal {:.1} µs, single step {:.1} µs",
        costs.trap_ns as f64 / 1e3,
        costs.signal_ns as f64 / 1e3,
        costs.step_ns as f64 / 1e3
    ));
    // Bursts are opt-in (WITCH_BURST=N) until they are measured to be the better default.
    let burst = match (&sampler, cfg.burst_steps) {
        (SamplerKind::Pmu(_), _) | (_, Some(0)) | (_, None) => None,
        (_, steps) => Some(witchcraft::engine::BurstSettings {
            steps: steps.unwrap_or(witchcraft::config::DEFAULT_BURST_STEPS),
            weight_per_burst: cfg.burst_weight_per_burst,
            picks: cfg.burst_picks.unwrap_or(witchcraft::config::DEFAULT_BURST_PICKS),
        }),
    };
    Engine {
        config: cfg,
        craft,
        sampler,
        period,
        sigtrap,
        modify,
        own_code: own,
        trap_cost_ns,
        signal_cost_ns,
        step_cost_ns: costs.step_ns,
        ns_per_cycle: costs.ns_per_cycle,
        burst,
    }
}

/// The agent's executable mapping, from /proc/self/maps.
pub(crate) fn own_code_range() -> (u64, u64) {
    procfs::own_mapping_containing(init as *const () as u64).map_or((0, 0), |m| (m.start, m.end))
}

/// Set up the calling thread. Not for signal handlers.
pub fn start_thread() {
    let Some(engine) = engine() else { return };
    if !current_thread().is_null() {
        return;
    }
    // Code mapped since the last refresh (dlopen) was seen by a handler.
    // dlopen itself is not interposed: glibc resolves $ORIGIN and RUNPATH
    // from its caller's address, so a wrapper would change what loads.
    if modules::STALE.swap(false, Ordering::AcqRel) {
        modules::refresh();
    }
    let mut ts = ThreadState::new(engine);
    let ptr: *mut ThreadState = &mut *ts;
    STATE.with(|s| s.set(ptr));
    let slot = NTHREADS.fetch_add(1, Ordering::AcqRel);
    if slot >= MAX_THREADS {
        STATE.with(|s| s.set(std::ptr::null_mut()));
        THREADS_FAILED.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let ptr = Box::into_raw(ts);
    THREADS[slot].store(ptr, Ordering::Release);
    unsafe { libc::pthread_setspecific(KEY, ptr as *const libc::c_void) };
    if let Err(e) = unsafe { (*ptr).start(engine) } {
        unsafe { (*ptr).stop() };
        THREADS_FAILED.fetch_add(1, Ordering::Relaxed);
        note(e);
    }
}

extern "C" fn thread_end(p: *mut libc::c_void) {
    let ts = p as *mut ThreadState;
    if !ts.is_null() {
        unsafe { (*ts).stop() };
        // Keep the data for the profile; just stop using the alternate stack.
        let ss = libc::stack_t { ss_sp: std::ptr::null_mut(), ss_flags: libc::SS_DISABLE, ss_size: 0 };
        unsafe { libc::sigaltstack(&ss, std::ptr::null_mut()) };
    }
}

pub(crate) fn threads() -> impl Iterator<Item = *mut ThreadState> {
    let n = NTHREADS.load(Ordering::Acquire).min(MAX_THREADS);
    (0..n).map(|i| THREADS[i].load(Ordering::Acquire)).filter(|p| !p.is_null())
}

extern "C" fn after_fork_child() {
    let Some(engine) = engine() else { return };
    // Only the forking thread exists here. Drop the others' (parent's) events.
    let me = current_thread();
    for ts in threads() {
        if ts != me {
            unsafe { (*ts).reset_after_fork() };
        }
    }
    let n = NTHREADS.load(Ordering::Acquire).min(MAX_THREADS);
    for t in THREADS.iter().take(n) {
        t.store(std::ptr::null_mut(), Ordering::Release);
    }
    NTHREADS.store(0, Ordering::Release);
    THREADS_FAILED.store(0, Ordering::Relaxed);
    OWNER_PID.store(std::process::id(), Ordering::Relaxed);
    START_NS.store(now_ns(), Ordering::Relaxed);
    STOPPING.store(false, Ordering::Release);
    FINISHED.store(false, Ordering::Release);
    if !me.is_null() {
        unsafe {
            (*me).reset_after_fork();
            THREADS[0].store(me, Ordering::Release);
            NTHREADS.store(1, Ordering::Release);
            if let Err(e) = (*me).start(engine) {
                (*me).stop();
                note(e);
            }
        }
    }
}

pub(crate) extern "C" fn at_exit() {
    finish("exit");
}

fn owner() -> bool {
    OWNER_PID.load(Ordering::Relaxed) == std::process::id()
}

/// Stop every thread's events and write this process's profile, once.
pub fn finish(ended_by: &str) {
    if engine().is_none() || !owner() || FINISHED.swap(true, Ordering::AcqRel) {
        return;
    }
    STOPPING.store(true, Ordering::Release);
    for ts in threads() {
        unsafe {
            (*ts).active.store(false, Ordering::Release);
            (*ts).pause_sampler();
        }
    }
    // Let handlers already running on other threads finish (bounded wait).
    for _ in 0..1000 {
        if threads().all(|ts| unsafe { !(*ts).in_handler.load(Ordering::Acquire) }) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
    if let Err(e) = write_profile(ended_by) {
        eprintln!("witch: cannot write profile: {e}");
    }
}

/// Undo `finish` when an exec failed and the image goes on.
fn resume() {
    STOPPING.store(false, Ordering::Release);
    FINISHED.store(false, Ordering::Release);
    let Some(engine) = engine() else { return };
    for ts in threads() {
        unsafe {
            if (*ts).has_sampler() {
                (*ts).active.store(true, Ordering::Release);
                (*ts).resume_sampler(engine);
            }
        }
    }
}

pub(crate) fn write_profile(ended_by: &str) -> std::io::Result<()> {
    let engine = engine().ok_or_else(|| std::io::Error::other("no engine"))?;
    if modules::STALE.swap(false, Ordering::AcqRel) {
        modules::refresh(); // code was seen outside the known modules
    }
    let map = modules::current();
    let mut counters = profile::Counters::default();
    let mut threads_out = Vec::new();
    for ts in threads() {
        let t = unsafe { (*ts).to_profile() };
        counters.add(&t.counters);
        if t.counters.interrupts > 0 || t.nodes.len() > 1 {
            threads_out.push(t);
        }
    }
    counters.threads_failed = THREADS_FAILED.load(Ordering::Relaxed);
    let cmdline = std::fs::read("/proc/self/cmdline").unwrap_or_default();
    let args: Vec<String> = cmdline.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    let program = std::fs::read_link("/proc/self/exe")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| args.first().cloned().unwrap_or_default());
    let start = START_NS.load(Ordering::Relaxed);
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    unsafe { libc::uname(&mut uts) };
    let kernel = unsafe { std::ffi::CStr::from_ptr(uts.release.as_ptr()) }.to_string_lossy().into_owned();
    let used_regs = threads().map(|t| unsafe { (*t).debug_registers_held() }).max().unwrap_or(0);
    let p = Profile {
        schema: profile::SCHEMA,
        witch_version: env!("CARGO_PKG_VERSION").to_string(),
        craft: engine.config.craft,
        program,
        args,
        pid: std::process::id(),
        ppid: unsafe { libc::getppid() } as u32,
        start_unix_ns: start,
        duration_ns: now_ns().saturating_sub(start),
        sampler: engine.sampler.to_profile(engine.period, engine.burst.map_or(0, |b| b.steps)),
        replacement: engine.config.replacement.name().into(),
        debug_registers: if used_regs > 0 { used_regs as u32 } else { engine.config.debug_registers as u32 },
        fp_precision: engine.config.fp_precision,
        kernel,
        ended_by: ended_by.into(),
        notes: NOTES.lock().map(|n| n.clone()).unwrap_or_default(),
        counters,
        modules: map.map(|m| m.to_profile()).unwrap_or_default(),
        threads: threads_out,
    };
    std::fs::create_dir_all(&engine.config.out_dir)?;
    p.save(&engine.config.out_dir.join(format!("{}-{}.json", p.pid, start)))
}

// ---- interposed libc entry points -------------------------------------

type StartFn = extern "C" fn(*mut libc::c_void) -> *mut libc::c_void;
type PthreadCreate = unsafe extern "C" fn(*mut libc::pthread_t, *const libc::pthread_attr_t, StartFn, *mut libc::c_void) -> libc::c_int;

struct Tramp {
    start: StartFn,
    arg: *mut libc::c_void,
}

extern "C" fn trampoline(p: *mut libc::c_void) -> *mut libc::c_void {
    let t = unsafe { Box::from_raw(p as *mut Tramp) };
    start_thread();
    (t.start)(t.arg)
}

pub(crate) fn next_symbol(name: &std::ffi::CStr) -> *mut libc::c_void {
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) }
}

/// Threads created by the program get their own engine state first.
#[no_mangle]
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    start: StartFn,
    arg: *mut libc::c_void,
) -> libc::c_int {
    static REAL: AtomicPtr<libc::c_void> = AtomicPtr::new(std::ptr::null_mut());
    let mut f = REAL.load(Ordering::Relaxed);
    if f.is_null() {
        f = next_symbol(c"pthread_create");
        REAL.store(f, Ordering::Relaxed);
    }
    let real: PthreadCreate = std::mem::transmute(f);
    if engine().is_none() {
        return real(thread, attr, start, arg);
    }
    let t = Box::into_raw(Box::new(Tramp { start, arg }));
    let r = real(thread, attr, trampoline, t as *mut libc::c_void);
    if r != 0 {
        drop(Box::from_raw(t));
    }
    r
}

/// Before the image is replaced, write what it gathered. If exec fails the
/// process goes on and so does profiling.
unsafe fn around_exec(call: impl FnOnce() -> libc::c_int) -> libc::c_int {
    let ours = engine().is_some() && owner();
    if ours {
        finish("exec");
    }
    let r = call();
    let e = *libc::__errno_location();
    if ours {
        resume();
    }
    *libc::__errno_location() = e;
    r
}

type Execve = unsafe extern "C" fn(*const libc::c_char, *const *const libc::c_char, *const *const libc::c_char) -> libc::c_int;
type Execv = unsafe extern "C" fn(*const libc::c_char, *const *const libc::c_char) -> libc::c_int;

#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> libc::c_int {
    let real: Execve = std::mem::transmute(next_symbol(c"execve"));
    around_exec(|| real(path, argv, envp))
}

#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> libc::c_int {
    let real: Execve = std::mem::transmute(next_symbol(c"execvpe"));
    around_exec(|| real(file, argv, envp))
}

#[no_mangle]
pub unsafe extern "C" fn execv(path: *const libc::c_char, argv: *const *const libc::c_char) -> libc::c_int {
    let real: Execv = std::mem::transmute(next_symbol(c"execv"));
    around_exec(|| real(path, argv))
}

#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const libc::c_char, argv: *const *const libc::c_char) -> libc::c_int {
    let real: Execv = std::mem::transmute(next_symbol(c"execvp"));
    around_exec(|| real(file, argv))
}
