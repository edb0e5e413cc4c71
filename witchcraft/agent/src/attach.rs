//! Attached mode: `witch CRAFT --pid PID` has the running process `dlopen`
//! this library and call [`witch_attach`]. Nothing is interposed then, and
//! the process's environment is fixed, so:
//!
//! - the settings come as `KEY=VALUE` lines (the same keys as the
//!   environment of a preloaded agent) plus `WITCH_SESSION_DIR`, where the
//!   profile and the session's status files go;
//! - a control thread sets up the threads that exist, and those created
//!   later, by polling `/proc/self/task`. It opens each thread's events
//!   itself (the kernel allows it within a process), then sends the thread
//!   the control signal, whose handler installs the alternate stack and
//!   starts the sampler on the thread: sigaltstack is per thread;
//! - the session ends when `detach` appears in the session directory, the
//!   controlling `witch`/`witchd` process is gone, or the process exits.
//!   Detaching disables and closes every event, has every thread restore
//!   its previous alternate stack, writes the profile, gives the program
//!   back its signal handlers and frees what the session allocated. The
//!   library stays loaded, so attaching again reuses it.
//!
//! Status files in the session directory: `ready` (set up), `error` (one
//! line, why the session could not start), `detached` (all undone).

use crate::agent::{self, MAX_THREADS, NTHREADS, THREADS, THREADS_FAILED};
use crate::signal;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use witchcraft::config::Config;
use witchcraft::engine::ThreadState;
use witchcraft::modules;
use witchcraft::sys::perf::{self, Attr, BpType};
use witchcraft::sys::{procfs, task};

/// Return values of [`witch_attach`] (the `witch` side maps them to messages).
pub const OK: i32 = 0;
pub const BUSY_SESSION: i32 = 1;
pub const BAD_ARGUMENT: i32 = 2;
pub const PRELOADED: i32 = 3;
pub const NO_THREAD: i32 = 4;
pub const NO_DEBUG_REGISTERS: i32 = 5;

/// Per thread slot: events opened, waiting for the thread to adopt them.
const NEW: u8 = 0;
/// The thread installed its alternate stack and samples.
const ADOPTED: u8 = 1;
/// The thread restored its alternate stack (detach).
const LEFT: u8 = 2;
/// The thread exited; its events are closed, its data kept.
const GONE: u8 = 3;

static PHASE: [AtomicU8; MAX_THREADS] = [const { AtomicU8::new(NEW) }; MAX_THREADS];
/// Set before each control signal we send, so that the program's own use
/// of the same signal number still reaches the program's handler.
static REQUEST: [AtomicBool; MAX_THREADS] = [const { AtomicBool::new(false) }; MAX_THREADS];
/// Control signals sent to threads that hadn't taken them when the session
/// ended; each is swallowed when it finally arrives.
static STRAY: AtomicUsize = AtomicUsize::new(0);
static SESSION: AtomicBool = AtomicBool::new(false);
static LEAVING: AtomicBool = AtomicBool::new(false);

/// The process's mappings, for a thread to find its stack from its stack
/// pointer inside the control signal's handler (no allocation there).
const MAX_MAPS: usize = 8192;
static MAPS: [AtomicU64; 2 * MAX_MAPS] = [const { AtomicU64::new(0) }; 2 * MAX_MAPS];
static NMAPS: AtomicUsize = AtomicUsize::new(0);

/// Called in the target (by `witch`, through ptrace) with the settings as
/// `KEY=VALUE` lines. Starts the control thread and returns at once.
///
/// # Safety
/// `settings` must be a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn witch_attach(settings: *const libc::c_char) -> libc::c_int {
    if settings.is_null() {
        return BAD_ARGUMENT;
    }
    if agent::engine().is_some() && !agent::ATTACHED.load(Ordering::Acquire) {
        return PRELOADED;
    }
    if SESSION.swap(true, Ordering::AcqRel) {
        return BUSY_SESSION;
    }
    // A debugger (or another tool) holding every debug register is worth
    // saying right away, on this thread.
    let probe = 0u64;
    let a = Attr::breakpoint(&probe as *const u64 as u64, 8, BpType::W).expect("an aligned u64").disabled();
    if let Err(libc::ENOSPC) = a.open(0).map(perf::close) {
        SESSION.store(false, Ordering::Release);
        return NO_DEBUG_REGISTERS;
    }
    let text = std::ffi::CStr::from_ptr(settings).to_string_lossy().into_owned();
    match std::thread::Builder::new().name("witch-agent".into()).spawn(move || control(text)) {
        Ok(_) => OK,
        Err(_) => {
            SESSION.store(false, Ordering::Release);
            NO_THREAD
        }
    }
}

fn status(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    if std::fs::write(&tmp, text).is_ok() {
        let _ = std::fs::rename(&tmp, dir.join(name));
    }
}

fn control(text: String) {
    let value = |k: &str| text.lines().find_map(|l| l.strip_prefix(k).and_then(|r| r.strip_prefix('='))).map(str::to_string);
    let Some(dir) = value("WITCH_SESSION_DIR").map(PathBuf::from) else {
        SESSION.store(false, Ordering::Release);
        return;
    };
    match session(&text, &dir, value("WITCH_CONTROLLER").and_then(|v| v.parse().ok())) {
        Ok(()) => status(&dir, "detached", "ok\n"),
        Err(e) => status(&dir, "error", &format!("{e}\n")),
    }
    SESSION.store(false, Ordering::Release);
}

fn session(text: &str, dir: &Path, controller: Option<i32>) -> Result<(), String> {
    let mut cfg = Config::from_lines(text)?.ok_or("no WITCH_CRAFT in the settings")?;
    cfg.out_dir = dir.to_path_buf();
    if let Ok(mut n) = agent::NOTES.lock() {
        n.clear();
    }
    agent::note("attached to the running process (ptrace + dlopen)".into());
    if std::env::var_os("GLIBC_TUNABLES").is_none_or(|t| !t.to_string_lossy().contains("rep_stosb_threshold")) {
        // A running process's memset/memcpy can't be steered off `rep
        // stosb/movsb`, which run far slower while a watchpoint is armed.
        agent::note("attached: large memset/memcpy may run slower while watchpoints are armed (fast strings off)".into());
    }
    let engine = agent::make_engine(cfg, signal::install_attached);
    NTHREADS.store(0, Ordering::Release);
    THREADS_FAILED.store(0, Ordering::Relaxed);
    agent::OWNER_PID.store(std::process::id(), Ordering::Relaxed);
    agent::START_NS.store(agent::now_ns(), Ordering::Relaxed);
    agent::STOPPING.store(false, Ordering::Release);
    agent::FINISHED.store(false, Ordering::Release);
    agent::ATTACHED.store(true, Ordering::Release);
    if !agent::set_engine(engine) {
        agent::ATTACHED.store(false, Ordering::Release);
        signal::restore_attached(false);
        return Err("another session is running".into());
    }
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    // At exit, the session's profile is written like a preloaded agent's.
    AT_EXIT.call_once(|| unsafe {
        libc::atexit(agent::at_exit);
    });
    let me = task::gettid();
    let mut known = HashSet::new();
    let adopted = adopt_new(me, &mut known);
    if adopted == 0 {
        let why = agent::NOTES.lock().ok().and_then(|n| n.iter().rev().find(|s| s.contains("debug registers")).cloned());
        teardown("failed");
        return Err(why.unwrap_or_else(|| "no thread of the process could be set up".into()));
    }
    status(dir, "ready", &format!("threads {adopted}\n"));
    let detach = dir.join("detach");
    loop {
        std::thread::sleep(Duration::from_millis(50));
        if agent::FINISHED.load(Ordering::Acquire) {
            return Ok(()); // the process is exiting; at_exit wrote the profile
        }
        if detach.exists() {
            break;
        }
        if let Some(pid) = controller {
            if unsafe { libc::kill(pid, 0) } != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
                agent::note("the controlling witch process went away: detached".into());
                break;
            }
        }
        adopt_new(me, &mut known);
        if modules::STALE.swap(false, Ordering::AcqRel) {
            modules::refresh(); // code mapped since (dlopen)
        }
    }
    teardown("detach");
    Ok(())
}

fn tgkill(tid: i32, sig: i32) -> bool {
    unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, sig) == 0 }
}

fn slots() -> usize {
    NTHREADS.load(Ordering::Acquire).min(MAX_THREADS)
}

/// Open events for threads not seen before and have them adopt them;
/// close the events of threads that ended. Returns the threads adopted.
fn adopt_new(me: i32, known: &mut HashSet<i32>) -> usize {
    let Some(engine) = agent::engine() else { return 0 };
    let live = procfs::tasks(None);
    let live_set: HashSet<i32> = live.iter().copied().collect();
    for i in 0..slots() {
        let ts = THREADS[i].load(Ordering::Acquire);
        let p = PHASE[i].load(Ordering::Acquire);
        if !ts.is_null() && (p == NEW || p == ADOPTED) && !live_set.contains(&unsafe { (*ts).tid }) {
            unsafe {
                (*ts).stop();
                (*ts).release_alt_stack();
            }
            PHASE[i].store(GONE, Ordering::Release);
        }
    }
    let mut fresh = Vec::new();
    for tid in live {
        if tid == me || !known.insert(tid) {
            continue;
        }
        let mut ts = ThreadState::new(engine);
        let r = ts.map_alt_stack().and_then(|_| ts.open_events(engine, tid));
        if let Err(e) = r {
            ts.stop();
            ts.release_alt_stack();
            THREADS_FAILED.fetch_add(1, Ordering::Relaxed);
            agent::note(e);
            continue;
        }
        let slot = NTHREADS.load(Ordering::Acquire);
        if slot >= MAX_THREADS {
            ts.stop();
            ts.release_alt_stack();
            THREADS_FAILED.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        PHASE[slot].store(NEW, Ordering::Release);
        THREADS[slot].store(Box::into_raw(ts), Ordering::Release);
        NTHREADS.store(slot + 1, Ordering::Release);
        fresh.push(slot);
    }
    if fresh.is_empty() {
        return 0;
    }
    read_maps();
    for &i in &fresh {
        let ts = THREADS[i].load(Ordering::Acquire);
        REQUEST[i].store(true, Ordering::Release);
        if !tgkill(unsafe { (*ts).tid }, signal::control_signal()) {
            unsafe {
                (*ts).stop();
                (*ts).release_alt_stack();
            }
            PHASE[i].store(GONE, Ordering::Release);
        }
    }
    // A thread blocking the signal adopts when it unblocks it; don't wait long.
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until && fresh.iter().any(|&i| PHASE[i].load(Ordering::Acquire) == NEW) {
        std::thread::sleep(Duration::from_millis(1));
    }
    fresh.iter().filter(|&&i| PHASE[i].load(Ordering::Acquire) == ADOPTED).count()
}

fn read_maps() {
    let maps = procfs::read_maps(None).unwrap_or_default();
    for (n, m) in maps.iter().take(MAX_MAPS).enumerate() {
        MAPS[2 * n].store(m.start, Ordering::Relaxed);
        MAPS[2 * n + 1].store(m.end, Ordering::Relaxed);
    }
    NMAPS.store(maps.len().min(MAX_MAPS), Ordering::Release);
}

fn stack_of(sp: u64) -> (u64, u64) {
    let n = NMAPS.load(Ordering::Acquire);
    (0..n)
        .map(|i| (MAPS[2 * i].load(Ordering::Relaxed), MAPS[2 * i + 1].load(Ordering::Relaxed)))
        .find(|&(a, b)| a <= sp && sp < b)
        .unwrap_or((0, 0))
}

/// This thread's state during a session (async-signal-safe).
pub fn lookup(tid: i32) -> *mut ThreadState {
    for i in 0..slots() {
        let ts = THREADS[i].load(Ordering::Acquire);
        if !ts.is_null() && PHASE[i].load(Ordering::Acquire) == ADOPTED && unsafe { (*ts).tid } == tid {
            return ts;
        }
    }
    std::ptr::null_mut()
}

/// The control signal's handler, on the thread itself: adopt the events
/// the control thread opened, or, when detaching, leave. False if the
/// signal wasn't a request of ours (the program's handler gets it).
pub fn on_control(uc: *mut libc::ucontext_t) -> bool {
    let tid = task::gettid();
    for i in 0..slots() {
        let ts = THREADS[i].load(Ordering::Acquire);
        if ts.is_null() || unsafe { (*ts).tid } != tid || !REQUEST[i].swap(false, Ordering::AcqRel) {
            continue;
        }
        let t = unsafe { &mut *ts };
        match PHASE[i].load(Ordering::Acquire) {
            NEW if !LEAVING.load(Ordering::Acquire) && !agent::STOPPING.load(Ordering::Acquire) => {
                let sp = unsafe { (*uc).uc_mcontext.gregs[libc::REG_RSP as usize] } as u64;
                t.adopt_here(stack_of(sp));
                PHASE[i].store(ADOPTED, Ordering::Release);
                if let Some(engine) = agent::engine() {
                    t.go(engine);
                }
            }
            ADOPTED if LEAVING.load(Ordering::Acquire) => {
                t.leave_here();
                PHASE[i].store(LEFT, Ordering::Release);
            }
            _ => {}
        }
        return true;
    }
    // A late one from an ended session.
    STRAY.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok()
}

/// Undo the session (see the module comment) and write its profile.
fn teardown(ended_by: &str) {
    agent::STOPPING.store(true, Ordering::Release);
    for ts in agent::threads() {
        unsafe {
            (*ts).active.store(false, Ordering::Release);
            (*ts).pause_sampler();
        }
    }
    for _ in 0..1000 {
        if agent::threads().all(|ts| unsafe { !(*ts).in_handler.load(Ordering::Acquire) }) {
            break;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    for ts in agent::threads() {
        unsafe { (*ts).stop() };
    }
    // Signals are taken lowest number first, so a thread runs this one
    // after any SIGTRAP or sample still pending from the closed events.
    LEAVING.store(true, Ordering::Release);
    let adopted: Vec<usize> = (0..slots()).filter(|&i| PHASE[i].load(Ordering::Acquire) == ADOPTED).collect();
    for &i in &adopted {
        let ts = THREADS[i].load(Ordering::Acquire);
        REQUEST[i].store(true, Ordering::Release);
        if !tgkill(unsafe { (*ts).tid }, signal::control_signal()) {
            PHASE[i].store(GONE, Ordering::Release); // exited meanwhile
        }
    }
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until && adopted.iter().any(|&i| PHASE[i].load(Ordering::Acquire) == ADOPTED) {
        std::thread::sleep(Duration::from_millis(1));
    }
    // Threads that haven't answered (the signal blocked) may still take
    // the control signal later: its handler stays, as a no-op.
    let stuck = (0..slots()).filter(|&i| matches!(PHASE[i].load(Ordering::Acquire), NEW | ADOPTED)).count();
    STRAY.fetch_add(stuck, Ordering::AcqRel);
    if stuck > 0 {
        agent::note(format!("{stuck} thread(s) did not take the control signal (blocked?); its handler stays installed as a no-op"));
    }
    if ended_by != "failed" {
        if let Err(e) = agent::write_profile(ended_by) {
            agent::note(format!("cannot write profile: {e}"));
        }
    }
    signal::restore_attached(stuck > 0);
    for i in 0..slots() {
        REQUEST[i].store(false, Ordering::Release);
        let ts = THREADS[i].swap(std::ptr::null_mut(), Ordering::AcqRel);
        if !ts.is_null() && matches!(PHASE[i].load(Ordering::Acquire), LEFT | GONE) {
            let mut b = unsafe { Box::from_raw(ts) };
            b.release_alt_stack();
        }
        // else: leaked, a thread may still run on its alternate stack
    }
    NTHREADS.store(0, Ordering::Release);
    agent::ATTACHED.store(false, Ordering::Release);
    agent::clear_engine(stuck == 0);
    if stuck == 0 {
        unsafe { modules::reclaim() };
    }
    LEAVING.store(false, Ordering::Release);
    agent::STOPPING.store(false, Ordering::Release);
    agent::FINISHED.store(false, Ordering::Release);
}
