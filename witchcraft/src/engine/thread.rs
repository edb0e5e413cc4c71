//! One thread's engine state, and its life: set up, sample, stop.
//!
//! The state is a handful of parts, each with one job and its own fields:
//! the sampler that interrupts the thread, the clock that tells the
//! program's time from the engine's, the overhead budget, the burst and
//! the window under way, and the ledger ([`super::ledger`]): the
//! watchpoints, the record that becomes the profile and the scratch space
//! the handlers decode and unwind in. Everything is reserved in
//! [`ThreadState::try_new`]: the handlers never allocate. The paths that
//! run in the handlers ([`super::signal`] and the modules it calls) work on
//! these parts; the agent uses the methods here.

use super::budget::Budget;
use super::clock::Clock;
use super::ledger::{Ledger, Tables};
use super::place::Place;
use super::process::Engine;
use super::sampler::ThreadSampler;
use super::stepping::Burst;
use super::window::{Recorded, Window};
use crate::profile;
use crate::sys::task;
use std::sync::atomic::{AtomicBool, Ordering};

pub struct ThreadState {
    tid: i32,
    /// Cleared when the thread ends or the process stops profiling.
    active: AtomicBool,
    /// Set while the thread runs the engine's handler (written there only,
    /// [`super::signal`]; other threads read it).
    pub(super) in_handler: AtomicBool,
    pub(super) sampler: ThreadSampler,
    pub(super) clock: Clock,
    /// The overhead account the bursts and windows draw on.
    pub(super) budget: Budget,
    pub(super) burst: Burst,
    /// Bursts run as windows from the code cache.
    pub(super) window: Window,
    pub(super) ledger: Ledger,
}

impl ThreadState {
    /// A thread's state, its tables reserved at their largest, or None if
    /// the address space for them cannot be had (the thread is then not
    /// profiled; the program goes on). It may be made on another thread
    /// than the one it will profile (`open_events` and `start` say which).
    pub fn try_new(engine: &Engine) -> Option<Box<ThreadState>> {
        let tables = Tables::try_reserve()?;
        Some(Self::with_tables(engine, tables))
    }

    /// As [`ThreadState::try_new`], but without the address space for its
    /// tables it still makes a state, whose tables hold one context and one
    /// pair (the rest counted as overflow).
    pub fn new(engine: &Engine) -> Box<ThreadState> {
        Self::try_new(engine).unwrap_or_else(|| Self::with_tables(engine, Tables::minimal()))
    }

    /// Stop the burst under way: registers intercepted by an instruction
    /// that then did not run (the burst ended before it, or it faulted) go
    /// back to watching. Its picks are left to be weighed (`Burst::weigh`)
    /// or dropped. (Here, below the paths that end bursts: the burst's end
    /// and a window's end at a fault.)
    pub(super) fn stop_burst(&mut self) {
        for (i, x) in self.burst.stop().iter().enumerate() {
            if x.is_some() && self.ledger.armed(i).is_some() {
                self.ledger.hold_on(i);
            }
        }
    }

    /// The address space the state's tables reserve, in bytes.
    pub fn reserved_bytes(&self) -> usize {
        self.ledger.reserved_bytes()
    }

    /// What [`ThreadState::try_new`] reserves, and the code cache the
    /// thread maps at its first window (larger for the exact mode's
    /// `recording` threads), in bytes.
    pub fn reserved_bytes_each(recording: bool) -> usize {
        Ledger::reserved_bytes_each() + super::cache::CodeCache::mapping_bytes(recording)
    }

    fn with_tables(engine: &Engine, tables: Tables) -> Box<ThreadState> {
        // Each state its own stream of draws, also when one thread makes
        // them all (with a fixed seed too).
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = MADE.fetch_add(1, Ordering::Relaxed).wrapping_add(1).wrapping_mul(0xD1B5_4A32_D192_ED03);
        let seed = engine.config.seed.unwrap_or_else(task::monotonic_ns) ^ (task::gettid() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ n;
        let settings = engine.burst;
        Box::new(ThreadState {
            tid: task::gettid(),
            active: AtomicBool::new(false),
            in_handler: AtomicBool::new(false),
            sampler: ThreadSampler::None,
            clock: Clock::new(engine.trap_cost_ns, engine.step_cost_ns),
            budget: Budget::new(settings.map_or(0.0, |s| s.budget), engine.step_cost_ns, settings.and_then(|s| s.min_steps)),
            burst: Burst::new(seed),
            window: Window::new(
                seed,
                engine.config.record_fd.map(|fd| (fd, crate::x86::record::RecordKind::of(engine.config.craft), engine.image())),
            ),
            ledger: Ledger::new(engine, seed, tables),
        })
    }

    /// Where the thread lives.
    pub fn place(&self) -> Place {
        self.ledger.place()
    }

    /// Set up the calling thread, which lives at `place`: debug registers
    /// and sampler, started. Outside any signal handler.
    pub fn start(&mut self, engine: &Engine, place: Place) -> Result<(), String> {
        self.ledger.set_place(place);
        self.open_events(engine, 0)?;
        self.go(engine);
        Ok(())
    }

    /// The calling thread, whose events were opened for it from another
    /// thread, lives at `place` (an attached agent's thread, at its first
    /// sample). Async-signal-safe.
    pub fn adopt(&mut self, place: Place) {
        self.ledger.set_place(place);
        self.tid = task::gettid();
    }

    /// Open the debug-register slots and the sampler (stopped) for thread
    /// `tid` of this process (0: the calling thread), signalling that thread.
    pub fn open_events(&mut self, engine: &Engine, tid: i32) -> Result<(), String> {
        let target = if tid == 0 { task::gettid() } else { tid };
        self.tid = target;
        // Whole-run windows (recording, counting) come back into the cache
        // after native code at a breakpoint: it takes one debug register
        // of those the watchpoints would (they keep at least one).
        let whole_run = engine.burst.is_some_and(|b| b.counts_accesses());
        self.ledger.open_watchpoints(engine, target, tid, usize::from(whole_run))?;
        if whole_run {
            self.window.resume.open(engine.sigtrap, engine.modify, target, tid);
        }
        self.sampler = ThreadSampler::open(&engine.sampler, engine.period, target, tid)?;
        Ok(())
    }

    /// Start sampling (async-signal-safe).
    pub fn go(&mut self, engine: &Engine) {
        self.active.store(true, Ordering::Release);
        self.resume_sampler(engine);
    }

    /// Does the engine handle this thread's signals (see
    /// [`ThreadState::halt`])?
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// Stop handling the thread's signals (they are dropped from now on),
    /// leaving its sampler and watchpoints as they are; [`ThreadState::go`]
    /// starts again. Another thread may call it (the process stops
    /// profiling): only an atomic flag changes.
    pub fn halt(&self) {
        self.active.store(false, Ordering::Release);
    }

    /// Is the thread in the engine's handler now? Another thread may ask.
    pub fn in_handler(&self) -> bool {
        self.in_handler.load(Ordering::Acquire)
    }

    /// Is the thread inside a window (running copies from its code cache,
    /// stepping one of its picks, or crossing between two)? Its own handlers
    /// ask.
    pub fn in_window(&self) -> bool {
        self.window.active()
    }

    /// [`ThreadState::in_window`], for other threads to ask: the session's
    /// end waits for windows to end before it frees their caches.
    pub fn window_busy(&self) -> bool {
        self.window.busy()
    }

    /// A single-step trap that no burst claims: may it be the trap flag of
    /// a burst given up as lost, left in a frame the program's own handler
    /// returns to? Once: the flag left behind traps once.
    pub fn take_left_trap_flag(&mut self) -> bool {
        self.burst.take_left_trap_flag()
    }

    /// Whether this thread has a sampler to pause or resume.
    pub fn has_sampler(&self) -> bool {
        self.sampler.is_some()
    }

    /// Stop the sampler's interrupts, keeping its kernel object. Another
    /// thread may call it (the process stops profiling): only the kernel
    /// object changes.
    pub fn pause_sampler(&self) {
        self.sampler.pause();
    }

    pub fn resume_sampler(&mut self, engine: &Engine) {
        self.sampler.resume(engine.period);
    }

    /// Pause the sampler while the program holds its signal blocked (the
    /// agent's `program_mask`): what its timer had left until the next
    /// tick (ns), for [`ThreadState::resume_sampler_after`]. Only the
    /// kernel object changes. Async-signal-safe.
    pub fn pause_sampler_left(&self) -> u64 {
        self.sampler.pause_left()
    }

    /// Resume it, the first tick after `left` ns of the thread's CPU time.
    pub fn resume_sampler_after(&self, engine: &Engine, left: u64) {
        self.sampler.resume_after(left, engine.period);
    }

    /// As [`ThreadState::resume_sampler`], but a CPU-time timer fires the
    /// first time as soon as the thread has run at all (at its next tick):
    /// an attached agent sets a thread up at its first sample.
    pub fn resume_sampler_soon(&mut self, engine: &Engine) {
        self.sampler.resume_soon(engine.period);
    }

    /// One of the program's own instances of the sampler's signal was held
    /// for it (the agent's `program_mask`): counted for the report.
    pub fn signal_held_for_program(&mut self) {
        self.ledger.counters.signals_held += 1;
    }

    /// Give the debug registers back now (the rest goes at
    /// [`ThreadState::stop`]).
    pub fn close_watchpoints(&mut self) {
        self.ledger.close_watchpoints();
    }

    /// Stop sampling and release the kernel resources (thread exit, exec, detach).
    pub fn stop(&mut self) {
        self.active.store(false, Ordering::Release);
        // The exact mode: the thread's last records go before it does.
        self.window.records_send();
        self.window.resume.close();
        self.sampler.pause();
        self.ledger.close_watchpoints();
        self.sampler.close();
    }

    /// The exact mode: send the thread's last records (the process stops
    /// profiling) and say what it recorded; None if it does not record.
    /// Async-signal-safe.
    pub fn send_records(&mut self) -> Option<Recorded> {
        self.window.records_send();
        self.window.recorded()
    }

    /// Forget what the parent gathered (fork child) and drop its kernel
    /// resources without touching the parent's events.
    /// In a fork child: `image` is the child's records' image number
    /// ([`super::Engine::image`]).
    pub fn reset_after_fork(&mut self, image: u32) {
        self.sampler.close_after_fork();
        self.ledger.reset_after_fork();
        self.clock.reset();
        self.burst.reset();
        self.window.reset();
        self.window.record_as(image);
        self.window.resume.close();
        self.active.store(false, Ordering::Release);
    }

    /// Debug registers this thread holds.
    pub fn debug_registers_held(&self) -> usize {
        self.ledger.watch().held()
    }

    /// Is this address the engine's own (this state, the alternate stack,
    /// the parking word)? Samples there are skipped.
    pub(crate) fn is_engine_memory(&self, addr: u64) -> bool {
        let inside = |r: (u64, u64)| addr >= r.0 && addr < r.1;
        let me = self as *const Self as u64;
        inside(self.ledger.place().alt_stack)
            || inside((me, me + std::mem::size_of::<Self>() as u64))
            || addr == self.ledger.watch().parking_addr()
            || self.window.cache.contains(addr)
    }

    /// This thread's part of the profile.
    pub fn to_profile(&self) -> profile::Thread {
        let mut counters = self.ledger.counters.clone();
        self.window.count_into(&mut counters);
        self.ledger.to_profile(self.tid, counters)
    }
}
