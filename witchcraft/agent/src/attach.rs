//! Attached mode: `witch CRAFT --pid` (or witchd) has a running process
//! `dlopen` this library and call [`witch_session_start`]; the protocol is
//! `witchcraft::session`. Nothing is interposed then, so:
//!
//! - the settings come over the session's socket;
//! - a control thread sets up the threads that exist, and those created
//!   later, by polling `/proc/self/task`: it opens each thread's events
//!   itself (the kernel allows it within a process) and starts its sampler.
//!   A thread is set up at its first sample, so a thread blocked in a
//!   system call is never interrupted: it is set up when it next runs. No
//!   thread's alternate signal stack is changed (`handlers.rs`);
//! - the session ends when the controller says so or goes away (its end of
//!   the socket closes), when the process exits, or by the agent's own
//!   choice when a debugger holds the process (then the profile's
//!   `ended_by` says "traced", a note says why, and the controller sees
//!   `Detached` come unasked). The agent then closes
//!   every watchpoint and sampler, sends the profile, gives the program
//!   back its signal handlers and frees what the session allocated, each
//!   thread's handler stack once no handler is on it. The library stays
//!   loaded, so attaching again reuses it.

use crate::channel::{Channel, Received};
use crate::handlers;
use crate::state::{now_ns, Mode, Sink, AGENT};
use crate::threads::{self, Phase};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use witchcraft::config::Config;
use witchcraft::engine::ThreadState;
use witchcraft::modules;
use witchcraft::profile::EndedBy;
use witchcraft::session::{AttachCode, Message, AGENT_THREAD, SETTINGS_WAIT};
use witchcraft::sys::perf::{self, Attr, BpType};
use witchcraft::sys::siginfo::sampler_signal;
use witchcraft::sys::{fd, procfs, task};

/// A session runs (from `witch_session_start` to the control thread's end).
static SESSION: AtomicBool = AtomicBool::new(false);
/// The process the session runs in (a fork child inherits `SESSION` set,
/// but not the control thread).
static SESSION_PID: AtomicI32 = AtomicI32::new(0);
/// The control thread's tid while it runs (0: none).
static CONTROL_TID: AtomicI32 = AtomicI32::new(0);
/// A thread of the program is about to do what ends the session now (see
/// [`leave`]).
static LEAVING: Mutex<Option<Leave>> = Mutex::new(None);

/// What a thread of the program is about to do that ends the session.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Leave {
    /// Enter a seccomp sandbox, this way: its filter may kill the process
    /// for a system call the agent makes.
    Sandbox(&'static str),
    /// Replace its program (an exec): the agent, and what it gathered, go
    /// with the old image.
    Exec(&'static str),
}

impl Leave {
    /// The profile's `ended_by`, and the exec call that ended it.
    fn ended_by(self) -> (EndedBy, Option<&'static str>) {
        match self {
            Leave::Sandbox(_) => (EndedBy::Sandbox, None),
            Leave::Exec(call) => (EndedBy::Exec, Some(call)),
        }
    }

    /// The profile's note, `after` seconds into the session (None: before
    /// it began, so there is no profile).
    fn note(self, after: Option<f64>) -> String {
        let ended = match after {
            Some(s) => format!("the session ended {s:.3} s in"),
            None => "the session did not start".to_string(),
        };
        match (self, after) {
            (Leave::Sandbox(how), _) => format!(
                "{ended}: the program put itself in a seccomp sandbox ({how}), whose filter may kill it for a system call the agent makes; the process runs on"
            ),
            (Leave::Exec(how), Some(_)) => {
                format!("{ended}, as the process called {how} to replace its program: this profile is of the program before")
            }
            (Leave::Exec(how), None) => format!("{ended}: the process called {how} to replace its program"),
        }
    }
}
/// Sends on the session socket come from the control thread and, at exit,
/// from the exiting thread: one message at a time.
static SENDING: Mutex<()> = Mutex::new(());

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
/// How long a thread that ends the session ([`leave`]) waits for it to end
/// (the control thread's poll, the threads' leave, the profile sent).
const LEAVE_CALL_WAIT: Duration = Duration::from_secs(3);

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
    if out.is_null() {
        return;
    }
    // SAFETY: the caller's pointer to two ints, checked non-null.
    let controller = unsafe { *out };
    let code = attach_code(controller);
    // SAFETY: the caller's pointer to two ints, checked non-null above.
    unsafe {
        if code == AttachCode::Ok {
            *out = CONTROLLER_END.load(Ordering::Acquire);
        }
        *out.add(1) = code as i32;
    }
}

fn attach_code(controller: i32) -> AttachCode {
    if AGENT.mode() == Mode::Preloaded {
        return AttachCode::Preloaded;
    }
    if SESSION.swap(true, Ordering::AcqRel) {
        return AttachCode::Busy;
    }
    SESSION_PID.store(std::process::id() as i32, Ordering::Release);
    // An exec that failed after it ended an earlier session ends no other.
    *LEAVING.lock().unwrap_or_else(|e| e.into_inner()) = None;
    let code = start(controller);
    if code != AttachCode::Ok {
        SESSION.store(false, Ordering::Release);
    }
    code
}

static CONTROLLER_END: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

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
    let Some((chan, theirs)) = Channel::pair() else {
        watch.into_iter().for_each(Controller::close);
        return AttachCode::NoChannel;
    };
    CONTROLLER_END.store(theirs, Ordering::Release);
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
    let spawned = std::thread::Builder::new().name(AGENT_THREAD.into()).spawn(move || control(chan, theirs, watch));
    // SAFETY: the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &mine, std::ptr::null_mut()) };
    match spawned {
        Ok(_) => AttachCode::Ok,
        Err(_) => {
            fd::close(theirs);
            watch.into_iter().for_each(Controller::close);
            AttachCode::NoThread
        }
    }
}

/// Send `m` on the session socket `fd` (any thread but a handler; the
/// caller checked `fd` still is the socket).
fn send(fd: i32, m: &Message) -> bool {
    let _one = SENDING.lock();
    let bytes = m.encode();
    let mut done = 0;
    while done < bytes.len() {
        // SAFETY: the slice is valid for its length; MSG_NOSIGNAL: no SIGPIPE for the program.
        let n = unsafe { libc::send(fd, bytes[done..].as_ptr() as *const libc::c_void, bytes.len() - done, libc::MSG_NOSIGNAL) };
        if n > 0 {
            done += n as usize;
        } else if !(n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)) {
            return false;
        }
    }
    true
}

/// Deliver the session's profile (the process exits, or the session ends).
pub fn send_profile(fd: i32, bytes: Vec<u8>) -> std::io::Result<()> {
    if send(fd, &Message::Profile(bytes)) {
        Ok(())
    } else {
        Err(std::io::Error::other("the controller is gone"))
    }
}

/// How a session ended.
enum End {
    /// Detached: everything undone.
    Detached,
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
fn settings(chan: &mut Channel, watch: Option<Controller>) -> Option<String> {
    let until = Instant::now() + SETTINGS_WAIT;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match chan.recv(if watch.is_some() { left.min(CONTROLLER_CHECK) } else { left }) {
            Received::Message(Message::Settings(s)) => return Some(s),
            Received::Nothing if !left.is_zero() && !watch.is_some_and(|c| c.exited()) => {}
            _ => return None,
        }
    }
}

fn control(mut chan: Channel, theirs: i32, watch: Option<Controller>) {
    CONTROL_TID.store(task::gettid(), Ordering::Release);
    let settings = settings(&mut chan, watch);
    watch.into_iter().for_each(Controller::close);
    // The controller has its copy (or gave up): ours must go, so that its
    // going away reads as the end of the stream.
    fd::close(theirs);
    CONTROLLER_END.store(-1, Ordering::Release);
    if let Some(text) = settings {
        let end = session(&mut chan, &text);
        // No new heap blocks are recorded between sessions (frees still
        // take theirs out).
        witchcraft::heap::stop();
        let _one = SENDING.lock();
        match end {
            Ok(End::Detached) => {
                chan.send(&Message::Detached);
            }
            Ok(End::Exiting) => {}
            Err(e) => {
                chan.send(&Message::Error(e));
                chan.send(&Message::Detached);
            }
        }
    }
    drop(chan);
    SESSION.store(false, Ordering::Release);
    // The thread's own exit follows (a thread entering a sandbox waits for it).
}

fn session(chan: &mut Channel, text: &str) -> Result<End, String> {
    let cfg = Config::from_lines(text)?.ok_or("no WITCH_CRAFT in the settings")?;
    if let Some(leave) = leaving() {
        return Err(leave.note(None));
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
    let engine = crate::setup::make_engine(cfg, handlers::install_attached, false);
    if AGENT.begin(engine, Mode::Attached, Sink::Session(chan.fd())).is_err() {
        handlers::restore_attached(&[]);
        return Err("another session is running".into());
    }
    // Before any thread is set up: the program's calls that put it in a
    // sandbox go through the agent (`imports.rs`).
    crate::imports::hook();
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    // At exit, the session's profile goes out as a preloaded agent's is written.
    // SAFETY: registers a plain extern "C" function.
    AT_EXIT.call_once(|| unsafe {
        libc::atexit(at_exit);
    });
    let me = task::gettid();
    let mut known = HashSet::new();
    let mut why = None;
    let set_up = set_up_new(me, &mut known, &mut why);
    if set_up == 0 {
        teardown(None);
        return Err(why.unwrap_or_else(|| "no thread of the process could be set up".into()));
    }
    if !chan.controller_gone() {
        let _one = SENDING.lock();
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
            return Ok(End::Exiting); // at_exit delivered the profile
        }
        if let Some(leave) = leaving() {
            AGENT.note(leave.note(Some((now_ns().saturating_sub(AGENT.start_ns())) as f64 / 1e9)));
            ended_by = leave.ended_by();
            break;
        }
        // Modules loaded since: their calls into a sandbox or an exec go
        // through the agent too.
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
            engine.windows_allowed.store(handlers::faults_without_handlers(), Ordering::Relaxed);
        }
        // Code mapped or unmapped since (dlopen, dlclose: the attached
        // agent interposes nothing, so it looks every POLL).
        crate::interpose::keep_map_current(false);
    }
    teardown(Some(ended_by));
    Ok(End::Detached)
}

/// What a thread of the program is about to do that ends the session.
fn leaving() -> Option<Leave> {
    *LEAVING.lock().unwrap_or_else(|e| e.into_inner())
}

/// The calling thread of the program is about to do what ends the session
/// (`why`): end it here, as a detach the agent chose (`ended_by` "sandbox"
/// or "exec", a note, the profile sent, handlers given back), and return
/// once the control thread has exited: a seccomp filter (which may go on
/// every thread: `SECCOMP_FILTER_FLAG_TSYNC`) finds no thread of the
/// agent's making a system call, and an exec finds the profile sent. This
/// thread spins meanwhile. Entering a sandbox, the agent's handlers make no system call afterwards
/// (`Agent::sandboxed`). Nothing happens without a session in this process
/// (a fork child inherits the flag, not the session; a vfork child has a
/// pid of its own). Not for handlers. The session is over even if the call
/// then fails.
pub fn leave(why: Leave) {
    if !SESSION.load(Ordering::Acquire) || SESSION_PID.load(Ordering::Acquire) != std::process::id() as i32 {
        return;
    }
    let control = CONTROL_TID.load(Ordering::Acquire);
    if control == task::gettid() {
        return;
    }
    *LEAVING.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
    let until = Instant::now() + LEAVE_CALL_WAIT;
    let mut spins = 0u32;
    while Instant::now() < until {
        std::hint::spin_loop();
        spins = spins.wrapping_add(1);
        // Whether the control thread is still there: a system call, now and then.
        if spins.is_multiple_of(4096) && !(SESSION.load(Ordering::Acquire) || control != 0 && task::tgkill(control, 0)) {
            break;
        }
    }
    if let Leave::Sandbox(_) = why {
        AGENT.set_sandboxed();
    }
}

extern "C" fn at_exit() {
    if AGENT.mode() == Mode::Attached {
        AGENT.finish(EndedBy::Exit);
    }
}

/// The pid tracing this process, if any. Called by the control thread,
/// which may allocate.
fn traced_by_other() -> Option<i32> {
    procfs::Status::read(procfs::Of::ThisProcess).ok()?.tracer()
}

/// Open events for threads not seen before and start their samplers;
/// close the events of threads that ended. Returns the threads set up.
fn set_up_new(me: i32, known: &mut HashSet<i32>, why: &mut Option<String>) -> usize {
    let Some(engine) = AGENT.engine() else { return 0 };
    let live: HashSet<i32> = procfs::tasks(None).into_iter().collect();
    for s in AGENT.threads.slots() {
        if matches!(s.phase(), Phase::New | Phase::Adopted) && !live.contains(&s.tid()) {
            // SAFETY: the thread is gone: nothing else uses its state.
            if let Some(ts) = unsafe { s.state().as_mut() } {
                ts.stop();
            }
            s.set_phase(Phase::Gone);
        }
    }
    let fresh: Vec<i32> = live.iter().copied().filter(|&t| t != me && known.insert(t)).collect();
    if fresh.is_empty() {
        return 0;
    }
    threads::snapshot_mappings();
    let mut n = 0;
    for tid in fresh {
        // Attached as preloaded: witch's share of a limited address space.
        if !crate::preload::room_for_a_thread() {
            continue;
        }
        let Some(alt) = threads::map_stack() else {
            AGENT.threads.not_set_up();
            continue;
        };
        let mut ts = ThreadState::new(engine);
        if let Err(e) = ts.open_events(engine, tid) {
            ts.stop();
            threads::unmap_stack(alt);
            // A thread that ended meanwhile is not a failure.
            if std::path::Path::new(&format!("/proc/self/task/{tid}")).exists() {
                AGENT.threads.not_set_up();
                AGENT.note(e.clone());
                *why = Some(e);
            }
            continue;
        }
        let Some(slot) = AGENT.threads.add(tid, ts, alt, false, threads::Prior::NONE, Phase::New) else {
            threads::unmap_stack(alt);
            continue;
        };
        // SAFETY: just added; the thread's handlers only read it once its sampler runs.
        let ts = unsafe { &mut *slot.state() };
        ts.go(engine);
        // Its first sample only sets it up: let that come soon.
        ts.sampler.resume_soon(engine.period);
        n += 1;
    }
    n
}

/// Undo the session (see the module comment); `deliver`: send its profile,
/// ended by that (its `ended_by`).
fn teardown(deliver: Option<(EndedBy, Option<&str>)>) {
    AGENT.quiesce(|_| false);
    for s in AGENT.threads.slots() {
        // SAFETY: handlers are quiesced: they no longer touch the watchpoints
        // or the sampler.
        if let Some(ts) = unsafe { s.state().as_mut() } {
            ts.watch.close();
            ts.stop();
        }
    }
    if let Some((ended_by, exec_call)) = deliver.filter(|_| AGENT.claim_finish()) {
        if let Err(e) = AGENT.deliver(&AGENT.profile(ended_by, exec_call)) {
            AGENT.note(format!("cannot send the profile: {e}"));
        }
    }
    // A signal of ours still pending would reach the program's disposition
    // (the default kills): keep our handler for it, passing on anything else.
    std::thread::sleep(Duration::from_millis(5));
    let mut keep = pending_signals();
    // A thread still in a burst window (stopped there) leaves it through
    // our SIGTRAP handler: keep it.
    // SAFETY: only the window's atomic flag is read; states live until `clear`.
    if AGENT.threads.slots().iter().any(|s| unsafe { s.state().as_ref() }.is_some_and(|t| t.window.busy.load(Ordering::Acquire))) {
        keep.push(libc::SIGTRAP);
    }
    handlers::restore_attached(&keep);
    AGENT.threads.clear();
    if keep.is_empty() {
        std::thread::sleep(Duration::from_millis(5));
        // SAFETY: every thread has left its handlers (quiesced, samplers
        // closed, no signal of ours pending, handlers restored).
        unsafe {
            AGENT.end();
            modules::reclaim();
        }
    }
}

/// Which of the agent's signals are pending in any thread of the process.
fn pending_signals() -> Vec<i32> {
    let ours = [libc::SIGTRAP, sampler_signal()];
    let mut mask = 0u64;
    for tid in procfs::tasks(None) {
        let Ok(s) = procfs::Status::read(procfs::Of::OwnTask(tid)) else { continue };
        mask |= s.pending.unwrap_or(0) | s.shared_pending.unwrap_or(0);
    }
    ours.into_iter().filter(|&s| mask & (1u64 << (s - 1)) != 0).collect()
}

#[cfg(test)]
mod tests {
    use super::Leave;

    /// A leave that comes before the session began says so, instead of
    /// "ended 0.000 s in" (and promises no profile).
    #[test]
    fn a_leave_before_the_session_says_it_did_not_start() {
        let before = Leave::Exec("execve").note(None);
        assert_eq!(before, "the session did not start: the process called execve to replace its program");
        let during = Leave::Exec("execl").note(Some(0.712));
        assert!(during.starts_with("the session ended 0.712 s in, as the process called execl"), "{during}");
        assert!(Leave::Sandbox("prctl").note(None).starts_with("the session did not start: the program put itself in a seccomp sandbox"));
    }
}
