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

use crate::handler_stack::Prior;
use crate::handlers;
use crate::leave;
use crate::state::{now_ns, Mode, Sink, AGENT};
use crate::thread_life;
use crate::threads::Life;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::Ordering;
use witchcraft::config::Config;
use witchcraft::profile::EndedBy;
use witchcraft::sys::fd;
use witchcraft::sys::procfs::{Of, ProcStatus};

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

extern "C" fn init() {
    // The agent's start (its calibration's arithmetic) must leave the
    // program's floating-point control and flags as they were.
    let _fp = witchcraft::sys::fpu::Default::enter();
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
    if run_is_over(&cfg) {
        // Started after the run ended (a background child that outlived
        // the program): nothing would read its profile.
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
    // Before the calibration (in `make_engine`): a thread that an earlier
    // library's constructor started may fork meanwhile.
    crate::calibrate::keep_out_of_fork_children();
    let (out_dir, launched) = (cfg.out_dir.clone(), launched(&cfg));
    let (engine, notes) = crate::setup::make_engine(cfg, handlers::install_preloaded, true);
    notes.into_iter().for_each(|n| AGENT.note(n));
    let sink = create_output(&out_dir, launched);
    if AGENT.begin(engine, Mode::Preloaded, sink).is_err() {
        return;
    }
    // First, so that a fork child's heap lock is released before the
    // agent's own child handler (below) runs.
    crate::alloc::keep_across_fork();
    // SAFETY: registers callbacks with the C library; `KEY` is written once here.
    unsafe {
        let mut key: libc::pthread_key_t = 0;
        libc::pthread_key_create(&mut key, Some(thread_life::thread_end));
        thread_life::KEY.store(key, Ordering::Release);
        libc::pthread_atfork(None, None, Some(witch_after_fork_child));
        libc::atexit(at_exit);
    }
    crate::heap::resolve_next();
    thread_life::start_thread();
    // Whole-run windows (the exact mode, the access counters) run the
    // program from its entry point on.
    // SAFETY: getauxval has no preconditions.
    thread_life::whole_run_from(unsafe { libc::getauxval(libc::AT_ENTRY) });
}

/// A file for this process's profile, `OUT_DIR/PID-START.json`, out of the
/// program's descriptor range.
/// Disk space taken for a process's profile when it starts (profiles of
/// small programs take a few KiB, of large ones some hundreds).
const PROFILE_RESERVE: i64 = 256 << 10;

/// Has the run this process belongs to ended? The launcher made its
/// directory of parts (`round_trips` names a file in it) and moves it away
/// when the run ends; a process of the run that starts after that (a
/// background child that outlived the program) stays inert, and writes
/// nothing: making the directory again would leave it behind.
fn run_is_over(cfg: &Config) -> bool {
    launched(cfg) && !cfg.out_dir.is_dir()
}

/// Is this process part of a launcher's run (whose directory of parts the
/// launcher made, and which the agent must not make again)?
fn launched(cfg: &Config) -> bool {
    cfg.round_trips.is_some()
}

/// A file for this process's profile in the directory of parts `dir`
/// (made if missing, unless a launcher made it, `launched`: then its run
/// has ended, and the process writes nothing, silently).
fn create_output(dir: &std::path::Path, launched: bool) -> Sink {
    if !launched {
        let _ = std::fs::create_dir_all(dir);
    }
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
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && launched => Sink::None,
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
    ProcStatus::read(Of::ThisThread).is_ok_and(|s| s.sandboxed())
}

/// Is this process traced (by a debugger)? Why, if so. Called at load (the
/// constructor) and in a fork child (the `pthread_atfork` handler, which
/// allocates already), never in a signal handler: the read allocates
/// nothing, the reason is formatted only when there is one.
fn traced_by_debugger() -> Option<String> {
    let tracer = ProcStatus::read(Of::ThisProcess).ok()?.tracer()?;
    Some(format!("it is traced by pid {tracer} (a debugger)"))
}

/// The profile of a process left to its debugger from the start: no
/// samples, and the reason.
fn write_untraced_profile(cfg: Config, why: &str) {
    let sink = create_output(&cfg.out_dir, launched(&cfg));
    let engine = witchcraft::engine::Engine::bare(cfg);
    if AGENT.begin(engine, Mode::Preloaded, sink).is_ok() {
        AGENT.note(leave::untraced_note(why));
        AGENT.finish(EndedBy::Exit);
        // SAFETY: no handler was installed nor thread set up: nothing reads the engine.
        unsafe { AGENT.end() };
    }
}

// The fork child's handler: `after_fork_child` with the address it returns
// to in the C library's `fork` (the top of the stack at entry), where the
// child's whole-run window begins.
std::arch::global_asm!(
    ".text",
    ".p2align 4",
    ".globl witch_after_fork_child",
    ".hidden witch_after_fork_child",
    ".type witch_after_fork_child,@function",
    "witch_after_fork_child:",
    "mov rdi, [rsp]",
    "jmp {child}",
    ".size witch_after_fork_child, . - witch_after_fork_child",
    child = sym after_fork_child,
);

extern "C" {
    fn witch_after_fork_child();
}

/// In a fork child: its profile, its threads (the forking one) and its
/// engine state start afresh; `back` is where the C library's `fork` goes
/// on after this handler, where a whole-run window (the exact mode's
/// recording, the access counters) begins, as it began at the program's
/// entry point (the first tick would come 5 ms of CPU time later).
extern "C" fn after_fork_child(back: u64) {
    let Some(engine) = AGENT.engine() else { return };
    // Only the forking thread exists here; it keeps its slot's state, and
    // the program's view of its mask.
    let me = AGENT.current();
    let view = me.map_or((0, 0), |s| (s.mask.blocks(), s.mask.held()));
    let start = engine.restart_after_fork();
    // SAFETY: a fork child: no other thread exists here, and this handler is
    // not a signal's.
    unsafe { AGENT.threads.reset_after_fork(engine.image()) };
    // The parent's profile file is the parent's.
    if let Sink::File(fd) = AGENT.sink() {
        fd::close(fd);
    }
    if AGENT.sandboxed() {
        // The filter came with the fork: no profile, no events.
        AGENT.after_fork(Sink::None, start, None);
        AGENT.claim_finish();
        return;
    }
    let (alt, prior) = match me {
        Some(s) => (s.alt_stack().0, s.prior()),
        None => (0, Prior::NONE),
    };
    if !engine.config().follows(std::process::id(), None) || run_is_over(engine.config()) {
        // A child this run does not follow (--no-children), or forked after
        // the run ended: it runs on unprofiled (its events were dropped
        // above) and writes no profile.
        AGENT.after_fork(Sink::None, start, None);
        AGENT.claim_finish();
        return;
    }
    // Our copy of the forking thread's state, taken back for the table.
    let Some(ts) = AGENT.after_fork(create_output(&engine.config().out_dir, launched(engine.config())), start, me) else { return };
    if let Some((slot, ts)) = AGENT.threads.add(witchcraft::sys::task::gettid(), ts, alt, alt != 0, prior, Life::Adopted) {
        AGENT.set_current(Some(slot));
        slot.mask.set(view.0, view.1);
        let place = ts.place();
        if let Err(e) = ts.start(engine, place) {
            ts.stop();
            AGENT.note(e);
        }
        crate::dispositions::held_from_the_start(slot, ts, witchcraft::sys::task::blocked_now());
        if let Some(why) = traced_by_debugger() {
            leave::leave_to_debugger(&why);
        }
        thread_life::whole_run_from(back);
    }
}

extern "C" fn at_exit() {
    AGENT.finish(EndedBy::Exit);
}
