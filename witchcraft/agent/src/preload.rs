//! The preloaded agent: `LD_PRELOAD=libwitch_agent.so` puts the engine
//! inside an unmodified program.
//!
//! It configures itself from the environment at load time, sets up every
//! thread (`pthread_create` is interposed), starts afresh in a `fork`
//! child, writes its profile before `exec` (events carry `remove_on_exec`,
//! so none leak into the new image, while `LD_PRELOAD` carries over), and
//! writes one profile per process: at exit, at `_exit`, or when a fatal
//! signal with default action arrives.
//!
//! The profile's file is created when profiling starts, above the
//! program's descriptor range (`witchcraft::sys::fd`): writing it at the
//! end needs no new descriptor and no right the program may have dropped
//! since (a lowered RLIMIT_NOFILE, setuid to another user).

use crate::handlers;
use crate::state::{now_ns, Mode, Sink, AGENT};
use crate::threads::{self, Phase, Prior};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicU32, Ordering};
use witchcraft::config::Config;
use witchcraft::engine::{thread::thread_stack, Place, ThreadState};
use witchcraft::profile::EndedBy;
use witchcraft::sys::fd;
use witchcraft::sys::procfs::{Of, Status};

/// The key whose destructor runs at each thread's exit.
static KEY: AtomicU32 = AtomicU32::new(u32::MAX);

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

extern "C" fn init() {
    let mut cfg = match Config::from_env() {
        Ok(Some(c)) => c,
        Ok(None) => return,
        Err(e) => {
            crate::state::say(&format!("witch: agent: {e}; not profiling\n"));
            return;
        }
    };
    if sandboxed() {
        // Exec'd (or started) inside a seccomp sandbox, which the new
        // image inherits: any system call the agent makes that the filter
        // does not expect may kill the process, writing a profile too.
        return;
    }
    // `--no-children`: the first process to load the agent is the one;
    // its exec'd images and its children read its pid from here on.
    if cfg.only_pid == Some(0) {
        let me = std::process::id();
        cfg.only_pid = Some(me);
        std::env::set_var(witchcraft::config::keys::ONLY_PID, me.to_string());
    }
    // Not a process this run follows (--no-children, --exe): stay inert.
    let exe = std::fs::read_link("/proc/self/exe").ok();
    let exe_name = exe.as_deref().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned());
    if !cfg.follows(std::process::id(), exe_name.as_deref()) {
        return;
    }
    fd::reserve_top();
    if std::env::var_os("WITCH_CHECK_HANDLER_ALLOC").is_some() {
        crate::alloc::check_handlers();
    }
    if let Some(why) = traced_by_debugger() {
        // Exec'd by a debugger's tracee: leave the debug registers and
        // signals to the debugger, and say so in a profile of its own.
        write_untraced_profile(cfg, &why);
        return;
    }
    let out_dir = cfg.out_dir.clone();
    let engine = crate::setup::make_engine(cfg, handlers::install_preloaded, true);
    let sink = create_output(&out_dir);
    if AGENT.begin(engine, Mode::Preloaded, sink).is_err() {
        return;
    }
    // SAFETY: registers callbacks with the C library; `KEY` is written once here.
    unsafe {
        let mut key: libc::pthread_key_t = 0;
        libc::pthread_key_create(&mut key, Some(thread_end));
        KEY.store(key, Ordering::Release);
        libc::pthread_atfork(None, None, Some(after_fork_child));
        libc::atexit(at_exit);
    }
    start_thread();
}

/// A file for this process's profile, `OUT_DIR/PID-START.json`, out of the
/// program's descriptor range.
/// Disk space taken for a process's profile when it starts (profiles of
/// small programs take a few KiB, of large ones some hundreds).
const PROFILE_RESERVE: i64 = 256 << 10;

fn create_output(dir: &std::path::Path) -> Sink {
    let _ = std::fs::create_dir_all(dir);
    let path = dir.join(format!("{}-{}.json", std::process::id(), now_ns()));
    let f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).custom_flags(libc::O_CLOEXEC).open(&path);
    match f.map(std::os::fd::IntoRawFd::into_raw_fd) {
        Ok(raw) => match fd::place(raw) {
            Ok(fd) => {
                // Room for the profile, taken now: a disk that the program
                // (or anyone) fills meanwhile must not cost the whole run.
                // The file keeps size 0 until it is written; failure
                // (a file system without fallocate, no room now) changes nothing.
                // SAFETY: our own fresh file; KEEP_SIZE allocates blocks past its end.
                unsafe { libc::fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, 0, PROFILE_RESERVE) };
                AGENT.set_sink_path(path);
                Sink::File(fd)
            }
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                crate::state::say(&format!(
                    "witch: agent: no descriptor for the profile ({}); not profiling\n",
                    std::io::Error::from_raw_os_error(e)
                ));
                Sink::None
            }
        },
        Err(e) => {
            crate::state::say(&format!("witch: agent: cannot create {}: {e}\n", path.display()));
            Sink::None
        }
    }
}

/// Does this process run under a seccomp filter (or in strict mode)? Read
/// with `openat`, `read` and `close` as the dynamic loader made them to
/// load the agent, so a filter that let it load lets this through.
fn sandboxed() -> bool {
    Status::read(Of::ThisThread).is_ok_and(|s| s.sandboxed())
}

/// Is this process traced (by a debugger)? Why, if so. Called at load (the
/// constructor) and in a fork child (the `pthread_atfork` handler, which
/// allocates already), never in a signal handler: the read allocates
/// nothing, the reason is formatted only when there is one.
fn traced_by_debugger() -> Option<String> {
    let tracer = Status::read(Of::ThisProcess).ok()?.tracer()?;
    Some(format!("it is traced by pid {tracer} (a debugger)"))
}

fn untraced_note(why: &str) -> String {
    format!("not profiled: {why}; its debug registers and signals are left to the debugger")
}

/// The profile of a process left to its debugger from the start: no
/// samples, and the reason.
fn write_untraced_profile(cfg: Config, why: &str) {
    let out_dir = cfg.out_dir.clone();
    let engine = crate::setup::bare_engine(cfg);
    let sink = create_output(&out_dir);
    if AGENT.begin(engine, Mode::Preloaded, sink).is_ok() {
        AGENT.note(untraced_note(why));
        AGENT.finish(EndedBy::Exit);
        // SAFETY: no handler was installed nor thread set up: nothing reads the engine.
        unsafe { AGENT.end() };
    }
}

/// The process asked to be traced: stop profiling it, give the debug
/// registers back, and write what it gathered so far.
pub fn leave_to_debugger(why: &str) {
    AGENT.note(untraced_note(why));
    AGENT.finish(EndedBy::Traced);
    for ts in AGENT.threads.states() {
        // SAFETY: quiesced by `finish`: no handler uses the events any more.
        unsafe { (*ts).stop() };
    }
}

/// The process is about to install a seccomp filter (`how`): once it is in,
/// any system call the agent makes that the filter does not expect may
/// kill the process (a sandbox's filter allows what the program needs,
/// not what a profiler needs). So profiling of this process ends here, for
/// good, before the filter goes in: what it gathered is written, every
/// event closed and the fatal signals' default actions given back. Its
/// forks inherit the filter and stay unprofiled, as do the images it execs
/// (see `init`). If the call fails, profiling stays off.
pub fn leave_to_sandbox(how: &'static str) {
    if !AGENT.set_sandboxed() {
        return;
    }
    let after = (now_ns().saturating_sub(AGENT.start_ns())) as f64 / 1e9;
    AGENT.note(format!(
        "profiling stopped {after:.3} s in: the program put itself in a seccomp sandbox ({how}), whose filter may kill it for a system call the agent makes; what came after, and any process it starts, is not profiled"
    ));
    AGENT.finish(EndedBy::Sandbox);
    for ts in AGENT.threads.states() {
        // SAFETY: quiesced by `finish`: no handler uses the events any more.
        unsafe { (*ts).stop() };
    }
    handlers::give_back_fatal_hooks();
}

/// Set up the calling thread (the first one, or a fork child's). Not for
/// signal handlers.
pub fn start_thread() {
    if AGENT.current().is_some() {
        return;
    }
    if let Some(slot) = prepare_thread() {
        // The first thread's stack, from the thread library (which may
        // allocate: this thread has the main heap anyway).
        adopt_thread(slot, thread_stack());
    }
}

/// Prepare a thread's profiling before it exists, on the thread that
/// creates it: its engine state, its handler stack and its slot in the
/// table (`adopt_thread` finishes on the new thread). All the allocating
/// is done here, so that a new thread whose program code never calls
/// `malloc` does not make the C library give it a heap of its own: 64 MiB
/// of address space each, up to eight per CPU (a 64-thread program went
/// from 527 MB to 1.79 GB of address space). None if this thread is not to
/// be profiled: the process profiles no more threads, or witch's address
/// space for threads ([`address_space_cap`]) or the system's is used up;
/// the profile counts it and says why, and the thread runs on.
pub fn prepare_thread() -> Option<&'static threads::Slot> {
    let engine = AGENT.engine()?;
    // A process whose profile is written (one that does not follow, say)
    // or that is sandboxed sets up no more threads.
    if AGENT.stopping() || AGENT.finished() {
        return None;
    }
    // Code mapped since the last refresh (a `dlopen` that went straight
    // to the C library, or the C library's own loads) was seen by a handler.
    crate::interpose::keep_map_current(false);
    if !room_for_a_thread() {
        return None;
    }
    let Some(alt) = threads::map_stack() else {
        AGENT.threads.not_set_up();
        AGENT.note("a thread was not profiled: no address space for its handler stack");
        return None;
    };
    let Some(state) = ThreadState::try_new(engine) else {
        threads::unmap_stack(alt);
        AGENT.threads.not_set_up();
        AGENT.note("a thread was not profiled: no address space for its tables");
        return None;
    };
    let Some(slot) = AGENT.threads.add(0, state, alt, true, Prior::NONE, Phase::Adopted) else {
        threads::unmap_stack(alt);
        return None;
    };
    Some(slot)
}

/// A prepared thread that never started (its creation failed): its slot
/// is free again.
pub fn unprepare_thread(slot: &threads::Slot) {
    slot.set_lent(false);
    slot.set_phase(Phase::Gone);
}

/// Is there room in witch's address space for threads
/// ([`address_space_cap`]) for one more: its handler stack, its tables
/// and its code cache? If not, it is counted as not set up, with a note.
pub fn room_for_a_thread() -> bool {
    let per_thread = (threads::HANDLER_STACK + ThreadState::reserved_bytes_each()) as u64;
    if (AGENT.threads.with_state() as u64 + 1) * per_thread <= address_space_cap() {
        return true;
    }
    AGENT.threads.not_set_up();
    AGENT.note(format!(
        "threads past {} were not profiled: witch takes at most {} MiB of address space for threads, a quarter of the program's limit (RLIMIT_AS)",
        address_space_cap() / per_thread,
        address_space_cap() >> 20
    ));
    false
}

/// Witch's address space for the threads' handler stacks, tables and code caches: a
/// quarter of the program's `RLIMIT_AS` when it has one (`ulimit -v`),
/// so that the program keeps the rest; without a limit, what the thread
/// table holds ([`threads::MAX_THREADS`]).
pub fn address_space_cap() -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: fills the plain struct.
    let limited = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } == 0 && lim.rlim_cur != libc::RLIM_INFINITY;
    if limited {
        lim.rlim_cur / 4
    } else {
        u64::MAX
    }
}

/// Set up the calling thread with `slot`, prepared for it: its handler
/// stack installed as its alternate signal stack, its events opened and
/// started. `stack`: the thread's stack. Allocates nothing (see
/// [`prepare_thread`]). Not for signal handlers.
pub fn adopt_thread(slot: &threads::Slot, stack: (u64, u64)) {
    let Some(engine) = AGENT.engine() else { return };
    slot.claim(witchcraft::sys::task::gettid());
    if AGENT.stopping() || AGENT.finished() {
        // The profile was written meanwhile: nothing to start.
        unprepare_thread(slot);
        return;
    }
    AGENT.set_current(Some(slot));
    // SAFETY: the state was prepared for this thread and only it uses it.
    let ts = unsafe { &mut *slot.state() };
    if let Err(e) = ts.start(engine, Place::here(stack, slot.alt_stack())) {
        // Not profiled: the slot, its stack and its tables go to the next
        // thread that needs them.
        ts.stop();
        AGENT.set_current(None);
        unprepare_thread(slot);
        AGENT.threads.failed.fetch_add(1, Ordering::Relaxed);
        AGENT.note(e);
        return;
    }
    // Its signals may come already: until the handler stack is installed
    // too, the kernel's frame goes on the thread's stack, the work on the
    // handler stack all the same.
    let ss = slot.alt_stack_t();
    // SAFETY: stack_t is plain data.
    let mut prev: libc::stack_t = unsafe { std::mem::zeroed() };
    // SAFETY: installs the stack the table owns for this thread (outside any handler).
    unsafe { libc::sigaltstack(&ss, &mut prev) };
    slot.set_prior(Prior::from_stack(&prev));
    // SAFETY: the key made in `init`; the value is the slot, read back in `thread_end`.
    unsafe { libc::pthread_setspecific(KEY.load(Ordering::Acquire), slot as *const threads::Slot as *const libc::c_void) };
}

/// The calling thread's stack, for a thread the C library started: its
/// thread descriptor sits at the top of the stack block (with or without a
/// stack the program gave it), so the stack runs from `size` bytes below
/// up to it. Read without `pthread_getattr_np`, which allocates.
pub fn created_thread_stack(size: usize) -> (u64, u64) {
    // SAFETY: pthread_self has no preconditions.
    let top = unsafe { libc::pthread_self() } as u64;
    (top.saturating_sub(size as u64), top)
}

/// A thread ends: stop its events, keep its data for the profile, and put
/// back the alternate stack it had.
extern "C" fn thread_end(p: *mut libc::c_void) {
    // SAFETY: the value set by `start_thread`: a slot of the static table.
    let Some(slot) = (unsafe { (p as *const threads::Slot).as_ref() }) else { return };
    // SAFETY: this thread's own state.
    if let Some(ts) = unsafe { slot.state().as_mut() } {
        ts.stop();
    }
    // The thread's stack before witch's, unless the program installed one
    // of its own since: its choice stands.
    // SAFETY: stack_t is plain data; queries this thread's alternate stack.
    let mut now: libc::stack_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::sigaltstack(std::ptr::null(), &mut now) };
    if Prior::from_stack(&now).sp == slot.alt_stack().0 {
        let prev = slot.prior().to_stack();
        // SAFETY: outside any handler (a key destructor), so not on the stack being replaced.
        unsafe { libc::sigaltstack(&prev, std::ptr::null_mut()) };
    }
    slot.set_lent(false);
    // Forgotten by this thread's handlers first: once `Gone`, a new thread
    // may take the slot over.
    AGENT.set_current(None);
    slot.set_phase(Phase::Gone);
}

extern "C" fn after_fork_child() {
    let Some(engine) = AGENT.engine() else { return };
    // Only the forking thread exists here; it keeps its slot's state.
    let me = AGENT.current();
    for ts in AGENT.threads.states() {
        // SAFETY: the parent's states, in our copy of its memory; no other thread exists here.
        unsafe { (*ts).reset_after_fork() };
    }
    // The parent's profile file is the parent's.
    if let Sink::File(fd) = AGENT.sink() {
        fd::close(fd);
    }
    if AGENT.sandboxed() {
        // The filter came with the fork: no profile, no events.
        AGENT.after_fork(Sink::None);
        AGENT.claim_finish();
        return;
    }
    let out_dir = engine.config.out_dir.clone();
    let (mine, alt, prior) = match me {
        Some(s) => (s.state(), s.alt_stack().0, s.prior()),
        None => (std::ptr::null_mut(), 0, Prior::NONE),
    };
    if !engine.config.follows(std::process::id(), None) {
        // A child this run does not follow (--no-children): it runs on
        // unprofiled (its events were dropped above) and writes no profile.
        AGENT.after_fork(Sink::None);
        AGENT.claim_finish();
        return;
    }
    AGENT.after_fork(create_output(&out_dir));
    if mine.is_null() {
        return;
    }
    // SAFETY: our copy of the forking thread's state, taken back into a Box for the table.
    let ts = unsafe { Box::from_raw(mine) };
    if let Some(slot) = AGENT.threads.add(witchcraft::sys::task::gettid(), ts, alt, alt != 0, prior, Phase::Adopted) {
        AGENT.set_current(Some(slot));
        // SAFETY: this thread's state, just added.
        let ts = unsafe { &mut *slot.state() };
        let place = ts.place;
        if let Err(e) = ts.start(engine, place) {
            ts.stop();
            AGENT.note(e);
        }
        if let Some(why) = traced_by_debugger() {
            leave_to_debugger(&why);
        }
    }
}

extern "C" fn at_exit() {
    AGENT.finish(EndedBy::Exit);
}
