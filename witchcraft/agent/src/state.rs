//! The agent's process-wide state, with one owner: [`AGENT`].
//!
//! It holds the running engine and how it runs (preloaded, or attached for
//! a session), whether profiling is stopping, the notes for the profile,
//! where the profile goes, and the thread table. Every flag is reset in
//! one place, [`Agent::begin`] (and [`Agent::after_fork`] for a fork
//! child, which keeps of the notes only the engine's set-up's), and the
//! stop-and-wait that ends profiling is [`Agent::quiesce`].

use crate::alloc;
use crate::attach_state::SESSION;
use crate::threads::{Quiesced, ThreadSlot, ThreadTable};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;
use witchcraft::engine::{Engine, ThreadState};
use witchcraft::modules;
use witchcraft::profile::{self, EndedBy, Profile};
use witchcraft::sys::{fd, task};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    Off = 0,
    /// Loaded with `LD_PRELOAD` at the program's start.
    Preloaded = 1,
    /// Loaded into a running process for a session (`witch_session_start`).
    Attached = 2,
}

/// Where this process's profile goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sink {
    None,
    /// A file created when profiling began (preloaded): writing it needs
    /// no new descriptor and no right the program may have given up since.
    File(i32),
    /// The session's socket (attached).
    Session(i32),
}

pub struct Agent {
    engine: AtomicPtr<Engine>,
    mode: AtomicU8,
    /// Profiling is ending: handlers do nothing (but leave, attached).
    stopping: AtomicBool,
    /// The profile's one delivery was claimed ([`Agent::claim_finish`]).
    finished: AtomicBool,
    /// ...and has gone out (or failed): what it was sent through may close.
    delivered: AtomicBool,
    /// The process put itself in a seccomp sandbox: the agent makes no
    /// system call it can help from then on, in it and in its forks.
    sandboxed: AtomicBool,
    /// The process the state belongs to: a vfork child shares our memory
    /// and must leave it alone.
    owner: AtomicU32,
    start_ns: AtomicU64,
    sink: AtomicI32,
    sink_is_session: AtomicBool,
    /// Device and inode of the sink when it was set: the program may close
    /// the number and reuse it, and then it is not ours to write.
    sink_dev: AtomicU64,
    sink_ino: AtomicU64,
    sink_path: Mutex<std::path::PathBuf>,
    notes: Mutex<Vec<String>>,
    /// How many of `notes` the engine's set-up made (those before
    /// [`Agent::begin`]): a fork child keeps them, and not the rest,
    /// which tell of its parent's run.
    setup_notes: AtomicUsize,
    /// The program and its arguments, read when profiling began (reading
    /// them at the end may need rights or descriptors it no longer has).
    identity: Mutex<(String, Vec<String>)>,
    pub threads: ThreadTable,
}

pub static AGENT: Agent = Agent::new();

/// Is this a preloaded agent, profiling (or done with it)?
pub fn preloaded() -> bool {
    AGENT.mode() == Mode::Preloaded && AGENT.engine().is_some()
}

thread_local! {
    /// A preloaded thread's slot (never touched attached: a dlopen'ed
    /// library's TLS is allocated lazily, with malloc).
    static MINE: Cell<*const ThreadSlot> = const { Cell::new(std::ptr::null()) };
}

pub fn now_ns() -> u64 {
    witchcraft::sys::task::realtime_ns()
}

impl Agent {
    const fn new() -> Agent {
        Agent {
            engine: AtomicPtr::new(std::ptr::null_mut()),
            mode: AtomicU8::new(Mode::Off as u8),
            stopping: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            delivered: AtomicBool::new(false),
            sandboxed: AtomicBool::new(false),
            owner: AtomicU32::new(0),
            start_ns: AtomicU64::new(0),
            sink: AtomicI32::new(-1),
            sink_is_session: AtomicBool::new(false),
            sink_dev: AtomicU64::new(0),
            sink_ino: AtomicU64::new(0),
            sink_path: Mutex::new(std::path::PathBuf::new()),
            notes: Mutex::new(Vec::new()),
            setup_notes: AtomicUsize::new(0),
            identity: Mutex::new((String::new(), Vec::new())),
            threads: ThreadTable::new(),
        }
    }

    pub fn engine(&self) -> Option<&'static Engine> {
        let p = self.engine.load(Ordering::Acquire);
        // SAFETY: published by `begin` from a Box and freed only by `end`,
        // after every handler that could read it has finished.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    pub fn mode(&self) -> Mode {
        match self.mode.load(Ordering::Acquire) {
            1 => Mode::Preloaded,
            2 => Mode::Attached,
            _ => Mode::Off,
        }
    }

    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire) || self.sandboxed()
    }

    pub fn sandboxed(&self) -> bool {
        self.sandboxed.load(Ordering::Acquire)
    }

    /// The process is entering a seccomp sandbox: for good (its forks
    /// inherit the filter, and so this flag). True the first time.
    pub fn set_sandboxed(&self) -> bool {
        !self.sandboxed.swap(true, Ordering::AcqRel)
    }

    pub fn finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    /// Is this process the one the state belongs to?
    pub fn owner_is_me(&self) -> bool {
        self.owner.load(Ordering::Relaxed) == std::process::id()
    }

    /// Start profiling with `engine`: every flag and the thread table start
    /// afresh here. Gives the engine back if one is running already.
    pub fn begin(&self, engine: Engine, mode: Mode, sink: Sink) -> Result<(), Box<Engine>> {
        let b = Box::new(engine);
        if !self.engine.load(Ordering::Acquire).is_null() {
            return Err(b);
        }
        // The profile starts when the engine was made: its records carry
        // that time as their image number (see `witchcraft::exact::stream`).
        let start = b.started_unix_ns();
        self.threads.clear();
        self.stopping.store(false, Ordering::Release);
        self.finished.store(false, Ordering::Release);
        self.delivered.store(false, Ordering::Release);
        self.owner.store(std::process::id(), Ordering::Relaxed);
        self.start_ns.store(start, Ordering::Relaxed);
        self.set_sink(sink);
        self.setup_notes.store(self.notes.lock().map_or(0, |n| n.len()), Ordering::Relaxed);
        self.mode.store(mode as u8, Ordering::Release);
        if let Ok(mut id) = self.identity.lock() {
            *id = identity();
        }
        // Never two at once: a preloaded agent begins once, at load, and
        // attached sessions are serialized by `attach.rs`.
        self.engine.store(Box::into_raw(b), Ordering::Release);
        Ok(())
    }

    /// Withdraw the engine (attached, after a session) and free it.
    ///
    /// # Safety
    /// No handler may be reading the engine, nor start to before the next
    /// [`Agent::begin`].
    pub unsafe fn end(&self) {
        self.mode.store(Mode::Off as u8, Ordering::Release);
        let p = self.engine.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if !p.is_null() {
            // SAFETY: made by `begin` with Box::into_raw; no reader is left (the caller's promise).
            drop(unsafe { Box::from_raw(p) });
        }
        self.set_sink(Sink::None);
    }

    /// In the fork child of a process in an attach session (its
    /// `pthread_atfork` handler; async-signal-safe): the parent's session
    /// does not go on here (its control thread is not in the child), so
    /// the child is left as a session's end leaves a process, ready for
    /// one of its own: the engine withdrawn and the child's copy of the
    /// session's socket closed. The engine is the parent's copy, left
    /// allocated (freeing it here would run the allocator in a fork
    /// handler; its pages are shared with the parent's until written).
    pub fn forget_session_in_fork_child(&self) {
        if self.mode() != Mode::Attached {
            return;
        }
        self.mode.store(Mode::Off as u8, Ordering::Release);
        self.engine.store(std::ptr::null_mut(), Ordering::Release);
        let sink = self.sink.load(Ordering::Acquire);
        if self.sink_is_session.load(Ordering::Acquire) && sink >= 0 {
            fd::close(sink);
        }
        self.set_sink(Sink::None);
    }

    /// In a fork child: the state is now this process's, with only the
    /// forking thread; the parent's other threads don't exist here.
    /// Gives back `keep`'s state (the forking thread's slot), to add again.
    pub fn after_fork(&self, sink: Sink, start_ns: u64, keep: Option<&ThreadSlot>) -> Option<Box<ThreadState>> {
        let kept = self.threads.forget(keep);
        self.stopping.store(false, Ordering::Release);
        self.finished.store(false, Ordering::Release);
        self.delivered.store(false, Ordering::Release);
        self.owner.store(std::process::id(), Ordering::Relaxed);
        self.start_ns.store(start_ns, Ordering::Relaxed);
        self.set_sink(sink);
        // (try_lock: a thread of the parent's that held them is not here to let go.)
        if let Ok(mut n) = self.notes.try_lock() {
            n.truncate(self.setup_notes.load(Ordering::Relaxed));
        }
        alloc::after_fork();
        MINE.with(|m| m.set(std::ptr::null()));
        kept
    }

    pub fn start_ns(&self) -> u64 {
        self.start_ns.load(Ordering::Relaxed)
    }

    pub fn sink(&self) -> Sink {
        match self.sink.load(Ordering::Acquire) {
            -1 => Sink::None,
            fd if self.sink_is_session.load(Ordering::Acquire) => Sink::Session(fd),
            fd => Sink::File(fd),
        }
    }

    pub fn set_sink(&self, sink: Sink) {
        let (fd, session) = match sink {
            Sink::None => (-1, false),
            Sink::File(fd) => (fd, false),
            Sink::Session(fd) => (fd, true),
        };
        let (dev, ino) = fd::identity(fd).unwrap_or((0, 0));
        self.sink_dev.store(dev, Ordering::Release);
        self.sink_ino.store(ino, Ordering::Release);
        self.sink_is_session.store(session, Ordering::Release);
        self.sink.store(fd, Ordering::Release);
    }

    /// Is the sink's descriptor still the file or socket it was set to?
    pub fn sink_is_ours(&self, fd: i32) -> bool {
        fd::still(fd, (self.sink_dev.load(Ordering::Acquire), self.sink_ino.load(Ordering::Acquire)))
    }

    /// Add a line to the profile's notes (once). In a crash handler, only
    /// if no one holds the notes.
    pub fn note(&self, s: impl Into<String>) {
        let s = s.into();
        let guard = if alloc::in_crash_mode() { self.notes.try_lock().ok() } else { self.notes.lock().ok() };
        if let Some(mut n) = guard {
            if !n.contains(&s) {
                n.push(s);
            }
        }
    }

    /// Take back note `s` (one made for an exec that then failed).
    pub fn forget_note(&self, s: &str) {
        if let Ok(mut n) = self.notes.lock() {
            n.retain(|x| x != s);
        }
    }

    pub fn clear_notes(&self) {
        if let Ok(mut n) = self.notes.lock() {
            n.clear();
        }
    }

    fn notes(&self) -> Vec<String> {
        let guard = if alloc::in_crash_mode() { self.notes.try_lock().ok() } else { self.notes.lock().ok() };
        guard.map(|n| n.clone()).unwrap_or_default()
    }

    /// This thread's slot, if it has one. Async-signal-safe: a TLS read
    /// when preloaded, a scan of the table when attached.
    pub fn current(&self) -> Option<&ThreadSlot> {
        if self.mode() != Mode::Preloaded {
            return self.threads.find(task::gettid());
        }
        // SAFETY: set by `set_current` to a slot of the static table.
        MINE.with(|m| unsafe { m.get().as_ref() })
    }

    /// Remember the calling (preloaded) thread's slot.
    pub fn set_current(&self, slot: Option<&ThreadSlot>) {
        MINE.with(|m| m.set(slot.map_or(std::ptr::null(), |s| s as *const ThreadSlot)));
    }

    /// Wait for the handlers running on other threads to return
    /// ([`ThreadTable::grace`]), noting any thread that stays in one.
    pub fn grace(&self) {
        for n in self.threads.grace() {
            self.note(n);
        }
    }

    /// Stop every thread's sampling and wait (briefly) for handlers that
    /// are running to finish: the one stop-and-wait of the agent, whose
    /// proof reads the threads' states.
    /// `keep_sampling` says which slots keep their sampler (an attached
    /// thread gives its alternate stack back at its next sample).
    pub fn quiesce(&self, keep_sampling: impl Fn(&ThreadSlot) -> bool) -> Quiesced {
        self.stopping.store(true, Ordering::Release);
        self.threads.quiesce(keep_sampling)
    }

    /// Undo [`Agent::quiesce`] (an exec that failed: the image goes on),
    /// unless the process is sandboxed.
    pub fn resume(&self, mut quiesced: Quiesced) {
        if self.sandboxed() {
            return;
        }
        self.stopping.store(false, Ordering::Release);
        self.finished.store(false, Ordering::Release);
        self.delivered.store(false, Ordering::Release);
        self.threads.thaw();
        let Some(engine) = self.engine() else { return };
        for ts in self.threads.states_quiesced(&mut quiesced) {
            if ts.has_sampler() {
                ts.go(engine);
            }
        }
        // A thread that holds the sampler's signal for the program stays
        // unsampled (`program_mask`): a tick would wait in its mask for the
        // program to take (after a failed exec, its `sigwaitinfo` took them).
        let held = witchcraft::sys::siginfo::mask_bit(witchcraft::sys::siginfo::sampler_signal());
        for s in self.threads.slots().iter().filter(|s| s.mask.held() & held != 0) {
            s.with_sampler(|ts| ts.pause_sampler());
        }
    }

    /// Claim the one delivery of this process's profile; false if it was
    /// delivered, or this is not the process profiling.
    pub fn claim_finish(&self) -> bool {
        self.engine().is_some() && self.owner_is_me() && !self.finished.swap(true, Ordering::AcqRel)
    }

    /// Stop sampling and deliver this process's profile, once; the proof
    /// that profiling stopped, here or by the finish that came first.
    pub fn finish(&self, ended_by: EndedBy) -> Quiesced {
        self.finish_with(ended_by, None)
    }

    /// [`finish`](Self::finish), for an end the agent saw a call make
    /// (`exec_call`: the exec function the program called).
    pub fn finish_with(&self, ended_by: EndedBy, exec_call: Option<&str>) -> Quiesced {
        // Called in the program's context too (its exit): the program's
        // floating-point control must not trap the profile's arithmetic.
        let _fp = witchcraft::sys::fpu::Default::enter();
        if !self.claim_finish() {
            // SAFETY: without an engine the table is empty; a finished
            // profile was claimed by a finish that quiesced (or in a fork
            // child, whose table was forgotten). A vfork child (not the
            // owner) shares its parent's table, which nothing quiesced: its
            // callers (`leave.rs`) touch those states as they always did.
            return unsafe { Quiesced::earlier() };
        }
        let mut quiesced = self.quiesce(|_| false);
        if self.engine().is_some_and(|e| e.config().record_fd.is_some()) {
            // The exact mode: every thread's last records, before the
            // profile (witch judges them all before it reads it).
            let (mut words, mut gaps, mut resumes, mut first) = (0, 0, 0, 0);
            for ts in self.threads.states_quiesced(&mut quiesced) {
                if let Some(r) = ts.send_records() {
                    words += r.words;
                    (gaps, resumes) = (gaps + r.gaps, resumes + r.resumes);
                    if first == 0 {
                        first = r.first_gap;
                    }
                }
            }
            let mib = (words * 8) as f64 / (1u64 << 20) as f64;
            self.note(format!(
                "exact from the code cache: {mib:.1} MiB of access records sent; {gaps} times the thread ran natively unrecorded until the next tick (the first at {first:#x}), {resumes} resumptions after native code"
            ));
        }
        if let Err(e) = self.deliver(&self.profile(&mut quiesced, ended_by, exec_call)) {
            say(&format!("witch: agent: cannot write the profile: {e}\n"));
        }
        self.delivered.store(true, Ordering::Release);
        quiesced
    }

    /// Wait (at most `limit`) until a claimed delivery has gone out: an
    /// attached session's control thread, which holds the socket the
    /// profile goes through, must not close it under the thread that
    /// sends it at the program's exit (before, it closed it as soon as the
    /// delivery was claimed, and now and then the controller got no
    /// profile: "exited during the session before its agent could send").
    pub fn wait_delivered(&self, limit: std::time::Duration) {
        let began = std::time::Instant::now();
        while !self.delivered.load(Ordering::Acquire) && began.elapsed() < limit {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// The profile of what the threads gathered so far.
    pub fn profile(&self, quiesced: &mut Quiesced, ended_by: EndedBy, exec_call: Option<&str>) -> Profile {
        let engine = self.engine().expect("profiling");
        // Code mapped since the last refresh was seen by a handler (not in
        // a crash handler: reading the maps takes a lock the crash may hold).
        if !alloc::in_crash_mode() && modules::STALE.swap(false, Ordering::AcqRel) {
            modules::refresh();
        }
        let mut counters = profile::Counters::default();
        let mut threads = Vec::new();
        for ts in self.threads.states_quiesced(quiesced) {
            let t = ts.to_profile();
            counters.add(&t.counters);
            if t.counters.interrupts > 0 || t.nodes.len() > 1 {
                threads.push(t);
            }
        }
        // Threads that ended and whose slots new ones took over.
        for t in self.threads.retired() {
            counters.add(&t.counters);
            threads.push(t);
        }
        counters.threads_failed = self.threads.failed.load(Ordering::Relaxed);
        counters.threads = self.threads.added.load(Ordering::Relaxed);
        let allocs = alloc::allocations_in_handlers();
        if allocs > 0 {
            self.note(format!("{allocs} allocations inside signal handlers (the handlers must never allocate: a witch bug)"));
        }
        let guard = if alloc::in_crash_mode() { self.identity.try_lock().ok() } else { self.identity.lock().ok() };
        let (program, args) = guard.map(|g| g.clone()).unwrap_or_default();
        let start = self.start_ns();
        let used = self.threads.states_quiesced(quiesced).map(|t| t.debug_registers_held()).max().unwrap_or(0);
        let (cfg, costs, (sampler, period, burst)) = (engine.config(), engine.costs(), engine.sampling());
        Profile {
            schema: profile::SCHEMA,
            witch_version: env!("CARGO_PKG_VERSION").to_string(),
            craft: cfg.craft,
            program,
            args,
            pid: std::process::id(),
            // SAFETY: getppid has no preconditions.
            ppid: unsafe { libc::getppid() } as u32,
            start_unix_ns: start,
            duration_ns: now_ns().saturating_sub(start),
            sampler: sampler.to_profile(period, burst),
            replacement: cfg.replacement.name().into(),
            debug_registers: if used > 0 { used as u32 } else { cfg.debug_registers as u32 },
            fp_precision: cfg.fp_precision,
            kernel: kernel_release(),
            ended_by,
            exec_call: exec_call.map(Into::into),
            // None where nothing was measured (a process not profiled).
            round_trips: (costs.trap_ns > 0).then_some(profile::RoundTrips {
                trap_ns: costs.trap_ns,
                signal_ns: costs.signal_ns,
                step_ns: costs.step_ns,
            }),
            notes: self.notes(),
            counters,
            modules: modules::current_profile(!alloc::in_crash_mode()),
            threads,
            processes: Vec::new(),
        }
    }

    /// Send or write `p` where this process's profile goes.
    pub fn deliver(&self, p: &Profile) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(p).map_err(std::io::Error::other)?;
        match self.sink() {
            Sink::None => Err(std::io::Error::other("nowhere to write it")),
            Sink::File(fd) if !self.sink_is_ours(fd) => self.write_reopened(&bytes),
            Sink::Session(fd) if !self.sink_is_ours(fd) => {
                Err(std::io::Error::other("the program closed the session's socket (and may have reused the number)"))
            }
            Sink::File(fd) => write_file(fd, &bytes),
            Sink::Session(fd) => SESSION.send_profile(fd, bytes),
        }
    }
}

impl Agent {
    /// The program closed the profile's descriptor (daemons close them all):
    /// open the file again by its name, if it still is the same file.
    fn write_reopened(&self, bytes: &[u8]) -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let guard = if alloc::in_crash_mode() { self.sink_path.try_lock().ok() } else { self.sink_path.lock().ok() };
        let path = guard.map(|p| p.clone()).unwrap_or_default();
        let f = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(&path)?;
        let raw = std::os::fd::AsRawFd::as_raw_fd(&f);
        if !fd::still(raw, (self.sink_dev.load(Ordering::Acquire), self.sink_ino.load(Ordering::Acquire))) {
            return Err(std::io::Error::other(format!("{} is no longer the profile's file", path.display())));
        }
        write_file(raw, bytes)
    }

    /// Where the profile's file is (preloaded), for [`Agent::write_reopened`].
    pub fn set_sink_path(&self, path: std::path::PathBuf) {
        if let Ok(mut p) = self.sink_path.lock() {
            *p = path;
        }
    }
}

/// Replace the contents of file `fd` with `bytes` (no new descriptor).
/// Written over the space reserved when the file was made, then cut to
/// length (truncating first would give the reserve back).
fn write_file(fd: i32, bytes: &[u8]) -> std::io::Result<()> {
    // SAFETY: `fd` is the agent's profile file; the writes stay inside `bytes`.
    unsafe {
        let mut done = 0;
        while done < bytes.len() {
            let n = libc::pwrite(fd, bytes[done..].as_ptr() as *const libc::c_void, bytes.len() - done, done as i64);
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Err(e);
            }
            done += n as usize;
        }
        if libc::ftruncate(fd, bytes.len() as i64) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn kernel_release() -> String {
    // SAFETY: uname fills the plain struct; release is NUL-terminated.
    unsafe {
        let mut uts: libc::utsname = std::mem::zeroed();
        libc::uname(&mut uts);
        std::ffi::CStr::from_ptr(uts.release.as_ptr()).to_string_lossy().into_owned()
    }
}

/// One line to stderr without std's lock (usable in a crash handler),
/// preloaded only: there stderr is the terminal witch's run shares with the
/// program. An attached agent's stderr is the program's
/// own (a log file, a socket), never the agent's to write: what went wrong
/// goes in the profile's notes, or nowhere.
pub fn say(s: &str) {
    if AGENT.mode() == Mode::Attached {
        return;
    }
    // SAFETY: writes from a valid buffer.
    unsafe { libc::write(2, s.as_ptr() as *const libc::c_void, s.len()) };
}

/// This process's program and arguments.
fn identity() -> (String, Vec<String>) {
    let cmdline = std::fs::read("/proc/self/cmdline").unwrap_or_default();
    let args: Vec<String> = cmdline.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    let program = std::fs::read_link("/proc/self/exe")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| args.first().cloned().unwrap_or_default());
    (program, args)
}
