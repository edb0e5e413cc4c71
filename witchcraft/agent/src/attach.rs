//! Attached mode: `witch CRAFT --pid` (or witchd) has a running process
//! `dlopen` this library and call [`witch_session_start`] (protocol:
//! `witchcraft::session`). So:
//!
//! - the settings come over the session's socket;
//! - a control thread sets up the threads that exist, and those created
//!   later, by polling `/proc/self/task`: it opens each thread's events
//!   itself (the kernel allows it within a process) and starts its sampler;
//!   it is set up at its first sample (one blocked in a system call, when
//!   it next runs). No thread's alternate signal stack is changed;
//! - the session ends when the controller says so or goes away (its end of
//!   the socket closes), when the process exits, or by the agent's own
//!   choice when a debugger holds the process (the profile's `ended_by`
//!   says "traced", a note why; the controller sees `Detached`). It closes
//!   every watchpoint and sampler, sends the profile, gives the program
//!   back its signal handlers and frees what the session allocated, once
//!   no thread is in witch's code (a process stopped during the session
//!   may hold a thread in a handler or a burst window until it is
//!   continued: see [`Release`]). The library stays loaded for the next.

use crate::attach_state::SESSION;
use crate::channel::{AgentEnd, Received};
use crate::handler_stack;
use crate::handlers;
use crate::state::{now_ns, Mode, Sink, AGENT};
use crate::threads::{self, Life, Quiesced};
use std::collections::HashSet;
use std::time::Duration;
use witchcraft::config::Config;
use witchcraft::engine::ThreadState;
use witchcraft::modules;
use witchcraft::profile::EndedBy;
use witchcraft::session::{AttachCode, Message, AGENT_THREAD, SETTINGS_WAIT};
use witchcraft::sys::perf::{self, Attr, BpType};
use witchcraft::sys::siginfo::sampler_signal;
use witchcraft::sys::{fd, procfs, task};

/// How often the control thread looks whether a controller that has not
/// sent the settings yet is still alive.
const CONTROLLER_CHECK: Duration = Duration::from_millis(20);
/// How often the control thread looks for new threads.
const POLL: Duration = Duration::from_millis(50);
/// How many polls in a row a tracer must hold the process before the
/// session leaves the debug registers to it: another witch making its
/// brief injected call (refused, since this session runs) holds it for
/// milliseconds, a debugger for as long as it debugs.
const TRACED_POLLS: u32 = 5;

/// Called in the target (by the controller, through ptrace), with the
/// controller's pid in `out[0]` (-1: unknown). Checks a session can run,
/// starts the control thread, stores in `out[0]` the
/// controller's end of the session's socket and in `out[1]` an
/// [`AttachCode`] (through memory: the call returns into the C library's
/// signal return, which overwrites `rax`; `witchcraft::session`).
///
/// # Safety
/// `out` must point to two writable `int`s.
#[no_mangle]
pub unsafe extern "C" fn witch_session_start(out: *mut libc::c_int) {
    // The program's floating-point control, and no time-stamp counter read
    // where it is off, from the first (`sys::fpu`, `task::counter_off`).
    let _fp = witchcraft::sys::fpu::Default::enter();
    task::note_counter();
    // SAFETY: the caller's pointer to two ints, checked non-null above.
    let controller = if out.is_null() { return } else { unsafe { *out } };
    let code = attach_code(controller);
    // SAFETY: the caller's pointer to two ints, checked non-null above.
    unsafe {
        if code == AttachCode::Ok {
            *out = SESSION.controller_end();
        }
        *out.add(1) = code as i32;
    }
}

fn attach_code(controller: i32) -> AttachCode {
    if AGENT.mode() == Mode::Preloaded {
        return AttachCode::Preloaded;
    }
    if !SESSION.begin() {
        return AttachCode::Busy;
    }
    let code = start(controller);
    if code != AttachCode::Ok {
        SESSION.end();
    }
    code
}

fn start(controller: i32) -> AttachCode {
    // A debugger (or another tool) holding every debug register is worth
    // saying right away, on this thread.
    let probe = 0u64;
    let a = Attr::breakpoint(&probe as *const u64 as u64, 8, BpType::W).expect("an aligned u64").disabled();
    if let Err(libc::ENOSPC) = a.open(0).map(perf::close) {
        return AttachCode::NoDebugRegisters;
    }
    if fd::reserved().is_none() {
        fd::reserve_top();
    }
    crate::alloc::keep_across_fork();
    // Before the control thread calibrates: a child the program forks
    // meanwhile runs no calibration.
    crate::calibrate::keep_out_of_fork_children();
    keep_sessions_out_of_fork_children();
    // Before the program runs on: its `munmap` keeps off the agent.
    crate::imports::hook_munmap();
    // The controller, watched until its settings come. Opened now, while
    // it traces this thread: a controller already gone was killed during
    // this very call, and nothing starts (else a session would wait for its
    // settings, refusing every attach meanwhile). One that cannot be
    // watched (no descriptor to spare) leaves the settings' own wait.
    let watch = match (controller > 0).then(|| Controller::watch(controller)) {
        Some(Err(libc::ESRCH)) => return AttachCode::ControllerGone,
        Some(Ok(c)) => Some(c),
        Some(Err(_)) | None => None,
    };
    let Some((chan, theirs)) = AgentEnd::pair() else {
        watch.into_iter().for_each(Controller::close);
        return AttachCode::NoChannel;
    };
    SESSION.set_controller_end(theirs);
    // The control thread takes none of the program's signals: one sent to
    // the process would otherwise be delivered there whenever the program's
    // own threads are busy, and run the program's handler on a thread it
    // never made, late. Only the agent's own (its calibration traps and
    // signals itself) get through. A thread starts with its creator's mask,
    // so that mask is set around the spawn, on this (the program's) thread.
    // SAFETY: sigset_t is plain data; sigfillset fills it.
    let (mut theirs_blocked, mut mine): (libc::sigset_t, libc::sigset_t) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    // SAFETY: valid sigset pointers; this thread's mask is put back below.
    unsafe {
        libc::sigfillset(&mut theirs_blocked);
        for sig in [libc::SIGTRAP, sampler_signal()] {
            libc::sigdelset(&mut theirs_blocked, sig);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &theirs_blocked, &mut mine);
    }
    let spawned = spawn_on_own_stack(Box::new(move || control(chan, theirs, watch)));
    // SAFETY: the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &mine, std::ptr::null_mut()) };
    match spawned {
        Ok(()) => AttachCode::Ok,
        Err(()) => {
            fd::close(theirs);
            watch.into_iter().for_each(Controller::close);
            AttachCode::NoThread
        }
    }
}

/// A fork child of a process attached to runs no session (the control
/// thread is not there, nor any other of the parent's threads): its copies
/// of the session's perf events are closed (kept, they held the events,
/// and the parent's debug registers, as long as the child lived: the
/// parent could not be attached again meanwhile), the program's handlers
/// are given back, and it is left as a session's end leaves a process, so
/// it can be attached to itself (it inherited the parent's running
/// session, and every attach to it was refused as if one ran there).
/// Async-signal-safe.
extern "C" fn leave_session_in_fork_child() {
    fd::close_all_perf();
    if AGENT.mode() != Mode::Preloaded {
        // No signal of witch's can come here (the parent's timers and
        // events are not the child's, nor its pending signals), and the
        // child's one thread is in `fork`, not in witch's code: the
        // program's handlers go back even if the parent's session was
        // still starting, or ending with its threads inside witch's code.
        handlers::restore_attached();
    }
    AGENT.forget_session_in_fork_child();
    SESSION.forget_in_fork_child();
}

/// Register [`leave_session_in_fork_child`], once per process (a program
/// may be attached to many times; the agent stays loaded).
fn keep_sessions_out_of_fork_children() {
    static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !DONE.swap(true, std::sync::atomic::Ordering::AcqRel) {
        // The C library's `sigaction`, which the handler calls, resolved
        // now (a lookup in the handler would take the loader's lock in the
        // child of a fork made before the session installed its handlers).
        crate::symbols::real_sigaction();
        // SAFETY: registers a child handler that only closes descriptors
        // the agent recorded as its own, gives back two signal dispositions
        // and stores to atomics: async-signal-safe, as a child handler of
        // a `fork` in a signal handler must be.
        unsafe { libc::pthread_atfork(None, None, Some(leave_session_in_fork_child)) };
    }
}

/// The control thread's stack, with a guard page below it.
const CONTROL_STACK: usize = 2 << 20;
const GUARD: usize = 4096;

/// Run `f` on a new detached thread named [`AGENT_THREAD`] whose stack is
/// a mapping in witch's own region ([`witchcraft::sys::mem::map_own`]),
/// not one the thread library places: placed by the kernel, it could land
/// in a hole the program made in its own mappings, and a program that
/// unmaps such a range whole (correct natively, where nothing else maps
/// memory meanwhile) took the control thread's stack with it. The stack
/// is not given back when the thread ends (a thread cannot unmap the stack
/// it runs on): 2 MiB of address space per attach session, untouched pages
/// costing nothing. A panic in `f` ends the thread, as a spawned one's.
fn spawn_on_own_stack(f: Box<dyn FnOnce() + Send>) -> Result<(), ()> {
    extern "C" fn run(arg: *mut libc::c_void) -> *mut libc::c_void {
        // Its creator's floating-point control may trap (see `sys::fpu`).
        witchcraft::sys::fpu::Default::for_good();
        // SAFETY: the box `spawn_on_own_stack` leaked for this thread alone.
        let f = unsafe { Box::from_raw(arg as *mut Box<dyn FnOnce() + Send>) };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        std::ptr::null_mut()
    }
    let base =
        witchcraft::sys::mem::map_own(GUARD + CONTROL_STACK, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_NORESERVE | libc::MAP_STACK);
    if base == libc::MAP_FAILED {
        return Err(());
    }
    // SAFETY: the mapping just made, its first page the guard; the
    // attribute is initialized before use and destroyed after; the box is
    // taken back if no thread took it.
    unsafe {
        witchcraft::sys::mem::protect_own(base as *mut u8, GUARD, libc::PROT_NONE);
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setstack(&mut attr, (base as *mut u8).add(GUARD) as *mut libc::c_void, CONTROL_STACK);
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        let arg = Box::into_raw(Box::new(f)) as *mut libc::c_void;
        let mut t: libc::pthread_t = 0;
        let r = libc::pthread_create(&mut t, &attr, run, arg);
        libc::pthread_attr_destroy(&mut attr);
        if r != 0 {
            drop(Box::from_raw(arg as *mut Box<dyn FnOnce() + Send>));
            witchcraft::sys::mem::unmap_own(base, GUARD + CONTROL_STACK);
            return Err(());
        }
        let name = std::ffi::CString::new(AGENT_THREAD).unwrap_or_default();
        libc::pthread_setname_np(t, name.as_ptr());
    }
    Ok(())
}

/// How a session ended, on the agent's side.
enum SessionEnd {
    /// Detached: profiling undone, the profile sent; the handlers and
    /// memory are given back by the [`Release`].
    Detached(Release),
    /// The process is exiting: its profile went out at exit.
    Exiting,
}

/// The controller's process, as a pidfd of ours.
#[derive(Clone, Copy)]
struct Controller {
    fd: i32,
    /// What `fd` refers to: a program that closes every descriptor (and
    /// reuses the number) leaves the controller unwatched, and its file alone.
    id: (u64, u64),
}

impl Controller {
    /// The controller's process, or why not (an errno: `ESRCH`, it has
    /// exited and been reaped).
    fn watch(pid: i32) -> Result<Controller, i32> {
        let fd = fd::place(task::pidfd_open(pid)?)?;
        match fd::identity(fd) {
            Some(id) => Ok(Controller { fd, id }),
            None => {
                fd::close(fd);
                Err(libc::EBADF)
            }
        }
    }

    /// Known to have exited.
    fn exited(self) -> bool {
        fd::still(self.fd, self.id) && task::pidfd_exited(self.fd)
    }

    fn close(self) {
        if fd::still(self.fd, self.id) {
            fd::close(self.fd);
        }
    }
}

/// The settings, if the controller sends them in time and lives: until
/// they come, this process holds the controller's end too, so the stream
/// would not end if the controller died (killed between its call and its
/// settings); its pidfd (`watch`) says so instead.
fn settings(chan: &mut AgentEnd, watch: Option<Controller>) -> Option<String> {
    let until = task::Deadline::after(SETTINGS_WAIT);
    loop {
        let left = until.left();
        match chan.recv(if watch.is_some() { left.min(CONTROLLER_CHECK) } else { left }) {
            Received::Message(Message::Settings(s)) => return Some(s),
            Received::Nothing if !left.is_zero() && !watch.is_some_and(|c| c.exited()) => {}
            _ => return None,
        }
    }
}

fn control(mut chan: AgentEnd, theirs: i32, watch: Option<Controller>) {
    SESSION.set_control_thread();
    let settings = settings(&mut chan, watch);
    watch.into_iter().for_each(Controller::close);
    // The controller has its copy (or gave up): ours must go, so that its
    // going away reads as the end of the stream.
    fd::close(theirs);
    SESSION.set_controller_end(-1);
    let mut owed = None;
    if let Some(text) = settings {
        let end = session(&mut chan, &text);
        // No new heap blocks are recorded between sessions (frees still
        // take theirs out).
        witchcraft::heap::stop();
        let _one = SESSION.sending();
        match end {
            Ok(SessionEnd::Detached(release)) => {
                chan.send(&Message::Detached);
                owed = Some(release);
            }
            Ok(SessionEnd::Exiting) => {}
            Err((e, release)) => {
                chan.send(&Message::Error(e));
                chan.send(&Message::Detached);
                owed = release;
            }
        }
    }
    drop(chan);
    // The controller has the profile: what is left waits for no one.
    owed.into_iter().for_each(Release::wait_and_free);
    SESSION.end();
    // The thread's own exit follows (a thread entering a sandbox waits for it).
}

fn session(chan: &mut AgentEnd, text: &str) -> Result<SessionEnd, (String, Option<Release>)> {
    let cfg = Config::from_lines(text).map_err(|e| (e, None))?.ok_or(("no WITCH_CRAFT in the settings".to_string(), None))?;
    if let Some(leave) = SESSION.leaving() {
        return Err((leave.note(None), None));
    }
    AGENT.clear_notes();
    AGENT.note("attached to the running process (ptrace + dlopen)");
    if std::env::var_os("GLIBC_TUNABLES").is_none_or(|t| !t.to_string_lossy().contains("rep_stosb_threshold")) {
        // A running process's memset/memcpy can't be steered off `rep
        // stosb/movsb`, which run far slower while a watchpoint is armed.
        AGENT.note("attached: large memset/memcpy may run slower while watchpoints are armed (fast strings off)");
    }
    // Loads and unloads are only seen after the fact (nothing is
    // interposed): handlers read no module's memory in place.
    modules::set_checked_reads(true);
    let (engine, notes) = crate::setup::make_engine(cfg, handlers::install_attached, false);
    notes.into_iter().for_each(|n| AGENT.note(n));
    if AGENT.begin(engine, Mode::Attached, Sink::Session(chan.fd())).is_err() {
        handlers::restore_attached();
        return Err(("another session is running".into(), None));
    }
    // Before any thread is set up: the program's calls that put it in a
    // sandbox go through the agent (`imports.rs`).
    crate::imports::hook();
    // At exit, the session's profile goes out as a preloaded agent's is written.
    SESSION.at_exit(at_exit);
    let me = task::gettid();
    let mut known = HashSet::new();
    let mut why = None;
    let set_up = set_up_new(me, &mut known, &mut why);
    if set_up == 0 {
        let release = teardown(None);
        return Err((why.unwrap_or_else(|| "no thread of the process could be set up".into()), Some(release)));
    }
    if !chan.controller_gone() {
        let _one = SESSION.sending();
        chan.send(&Message::Ready { threads: set_up as u32 });
    }
    let mut traced_polls = 0;
    // How the profile says the session ended: "detach" when the controller
    // ended it, or why the agent ended it by itself (the controller sees
    // `Detached` come unasked, and stops waiting).
    let mut ended_by = (EndedBy::Detach, None);
    loop {
        match chan.recv(POLL) {
            Received::Message(Message::Detach) | Received::Closed => break,
            Received::Message(_) | Received::Nothing => {}
        }
        if AGENT.finished() {
            AGENT.wait_delivered(Duration::from_secs(60));
            return Ok(SessionEnd::Exiting); // at_exit delivered the profile
        }
        if let Some(leave) = SESSION.leaving() {
            AGENT.note(leave.note(Some((now_ns().saturating_sub(AGENT.start_ns())) as f64 / 1e9)));
            ended_by = leave.ended_by();
            break;
        }
        // Modules loaded since: their calls into a sandbox or an exec go through the agent too.
        crate::imports::hook();
        let tracer = traced_by_other();
        traced_polls = if tracer.is_some() { traced_polls + 1 } else { 0 };
        if let (Some(tracer), true) = (tracer, traced_polls >= TRACED_POLLS) {
            AGENT.note(format!(
                "a debugger (pid {tracer}) attached during the session: it ended there, leaving the debug registers and signals to it"
            ));
            ended_by = (EndedBy::Traced, None);
            break;
        }
        set_up_new(me, &mut known, &mut why);
        // Burst windows only while the program has no fault handler the
        // agent could not guard (see `handlers::faults_without_handlers`).
        if let Some(engine) = AGENT.engine() {
            engine.allow_windows(handlers::faults_without_handlers());
        }
        // Code mapped or unmapped since (dlopen, dlclose: the attached
        // agent interposes nothing, so it looks every POLL).
        crate::loading::keep_map_current(false);
    }
    Ok(SessionEnd::Detached(teardown(Some(ended_by))))
}

extern "C" fn at_exit() {
    if AGENT.mode() == Mode::Attached {
        AGENT.finish(EndedBy::Exit);
    }
}

/// The pid tracing this process, if any. Called by the control thread,
/// which may allocate.
fn traced_by_other() -> Option<i32> {
    procfs::ProcStatus::read(procfs::Of::ThisProcess).ok()?.tracer()
}

/// Open events for threads not seen before and start their samplers;
/// close the events of threads that ended. Returns the threads set up.
fn set_up_new(me: i32, known: &mut HashSet<i32>, why: &mut Option<String>) -> usize {
    let Some(engine) = AGENT.engine() else { return 0 };
    let live: HashSet<i32> = procfs::tasks(None).into_iter().collect();
    for s in AGENT.threads.slots() {
        if matches!(s.phase(), Life::New | Life::Adopted) && !live.contains(&s.tid()) {
            // SAFETY: the thread is gone, and only this (control) thread
            // uses its state until the session's end.
            if let Some(ts) = unsafe { s.gone_state() } {
                ts.stop();
            }
            s.set_phase(Life::Gone);
        }
    }
    let fresh: Vec<i32> = live.iter().copied().filter(|&t| t != me && known.insert(t)).collect();
    if fresh.is_empty() {
        return 0;
    }
    crate::mappings::snapshot_mappings();
    let mut n = 0;
    for tid in fresh {
        // Attached as preloaded: witch's share of a limited address space.
        if !crate::thread_life::room_for_a_thread() {
            continue;
        }
        let Some(alt) = handler_stack::map_stack() else {
            AGENT.threads.not_set_up();
            continue;
        };
        let mut ts = ThreadState::new(engine);
        if let Err(e) = ts.open_events(engine, tid) {
            ts.stop();
            handler_stack::unmap_stack(alt);
            // A thread that ended meanwhile is not a failure.
            if std::path::Path::new(&format!("/proc/self/task/{tid}")).exists() {
                AGENT.threads.not_set_up();
                AGENT.note(e.clone());
                *why = Some(e);
            }
            continue;
        }
        let Some((slot, ts)) = AGENT.threads.add(tid, ts, alt, false, handler_stack::Prior::NONE, Life::New) else {
            handler_stack::unmap_stack(alt);
            continue;
        };
        ts.go(engine);
        // Its first sample sets it up: soon (see `dispositions::held_from_the_start`).
        let blocked = procfs::ProcStatus::read(procfs::Of::OwnTask(tid)).ok().and_then(|s| s.blocked).unwrap_or(0);
        if !crate::dispositions::held_from_the_start(slot, ts, blocked) {
            ts.resume_sampler_soon(engine);
        }
        n += 1;
    }
    n
}

/// End the session's profiling (see the module comment): every thread's
/// sampling stops, each thread out of witch's code has its events closed,
/// and, with `deliver`, the profile goes out, ended by that (its
/// `ended_by`). What the session holds besides (the signal handlers, each
/// thread's state and handler stack, the engine) the returned [`Release`]
/// gives back once no thread can need it.
fn teardown(deliver: Option<(EndedBy, Option<&str>)>) -> Release {
    let quiesced = AGENT.quiesce(|_| false);
    let mut release = Release { closed: HashSet::new(), quiesced };
    release.close_settled();
    let me = task::gettid();
    let inside = AGENT.threads.slots().iter().filter(|s| s.tid() != me && !settled(s)).count();
    if inside > 0 {
        AGENT.note(format!(
            "{inside} thread(s) were still inside witch's code (a handler or a burst window) as the session ended, as in a process stopped there (SIGSTOP, job control, a debugger): witch's handlers and their state stay until they leave it"
        ));
    }
    if let Some((ended_by, exec_call)) = deliver.filter(|_| AGENT.claim_finish()) {
        if let Err(e) = AGENT.deliver(&AGENT.profile(&mut release.quiesced, ended_by, exec_call)) {
            AGENT.note(format!("cannot send the profile: {e}"));
        }
    }
    release
}

/// What an ended session still holds: the program's signal handlers are
/// witch's, and each thread's engine state and handler stack and the
/// engine are allocated. A thread may still be in witch's code when the
/// session ends, and then needs all of it: in a handler, or in a burst
/// window, which it leaves through witch's SIGTRAP handler and its state
/// (at the window's next exit), or with a signal of witch's pending. That
/// is what a process stopped during the session (SIGSTOP, job control, a
/// debugger's stop) leaves: its threads stay wherever the stop found them
/// while its profile is sent, and they move on only when it is continued.
/// (Freed at once, as the session's end once did, a thread stopped in a
/// window found no state at its window's exit once continued, and the
/// program died of SIGTRAP.)
#[must_use]
struct Release {
    /// The threads whose events are closed.
    closed: HashSet<i32>,
    /// Profiling stopped (the session's states are read and closed).
    quiesced: Quiesced,
}

impl Release {
    /// Close the events of each thread out of witch's code (or gone).
    fn close_settled(&mut self) {
        let me = task::gettid();
        for s in AGENT.threads.slots() {
            if s.tid() == me || self.closed.contains(&s.tid()) || !settled(s) {
                continue;
            }
            // Out of witch's handlers and windows, and quiesced: one of its
            // handlers that starts finds the session stopping and leaves it.
            if let Some(ts) = s.state_quiesced(&mut self.quiesced) {
                ts.close_watchpoints();
                ts.stop();
            }
            self.closed.insert(s.tid());
        }
    }

    /// Wait until no thread is in witch's code and no signal of witch's is
    /// pending (closing each thread's events as it leaves), then give the
    /// program back its handlers and free the session's memory. Called by
    /// the control thread once the controller has the profile: a thread
    /// stopped in witch's code keeps the control thread waiting, asleep,
    /// until the process is continued.
    fn wait_and_free(mut self) {
        let me = task::gettid();
        loop {
            self.close_settled();
            // A signal sent just before the samplers closed is pending a
            // moment after.
            std::thread::sleep(Duration::from_millis(5));
            // Every thread's events closed (each once it was out of
            // witch's code), and none of witch's signals left.
            let open = AGENT.threads.slots().iter().any(|s| s.tid() != me && s.has_state() && !self.closed.contains(&s.tid()));
            if !open && pending_signals().is_empty() {
                break;
            }
        }
        handlers::restore_attached();
        AGENT.threads.clear();
        std::thread::sleep(Duration::from_millis(5));
        // SAFETY: every thread has left witch's handlers and windows, no
        // signal of witch's is pending and none can come (every event is
        // closed), and the program's handlers are back.
        unsafe {
            AGENT.end();
            modules::reclaim();
        }
    }
}

/// Is this slot's thread out of witch's code (no handler of witch's on
/// it, not in a burst window), or gone?
fn settled(s: &threads::ThreadSlot) -> bool {
    let busy = s.engine_busy() || s.in_use();
    !busy || !std::path::Path::new(&format!("/proc/self/task/{}", s.tid())).exists()
}

/// Which of the agent's signals are pending in any thread of the process.
fn pending_signals() -> Vec<i32> {
    let ours = [libc::SIGTRAP, sampler_signal()];
    let mut mask = 0u64;
    for tid in procfs::tasks(None) {
        let Ok(s) = procfs::ProcStatus::read(procfs::Of::OwnTask(tid)) else { continue };
        mask |= s.pending.unwrap_or(0) | s.shared_pending.unwrap_or(0);
    }
    ours.into_iter().filter(|&s| mask & (1u64 << (s - 1)) != 0).collect()
}
