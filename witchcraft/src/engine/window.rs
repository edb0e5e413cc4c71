//! Burst windows run from the code cache: the count-proportional software
//! sampler with windows of thousands of instructions.
//!
//! At a tick the interrupted thread is sent into the cache ([`super::cache`])
//! instead of being single-stepped: its context's PC becomes the copy of
//! the instruction it was about to run, and it goes on there, with its own
//! registers and stack, for a window of W instructions. The copies count
//! the accesses of the craft's kind they make, and a countdown stops the
//! thread exactly before the picked one (no skid): the handler then steps
//! that one instruction natively with the burst machinery ([`super::burst`]:
//! decode, value snapshot, debug register) and sends the thread back into
//! the cache after it. When the window's instructions run out, or before
//! anything the cache does not run (a system call), the thread goes on
//! natively.
//!
//! *The estimator.* Every counted access of a window is picked with the
//! same probability p, independently (the countdown to the next pick is
//! geometric: 1 + ⌊ln U / ln(1−p)⌋), so a pick stands for 1/p accesses of
//! its window. Times t_b, the program's own CPU time since the previous
//! window in periods (as for the single-step bursts), it credits
//! w = t_b / p. For any set S of accesses,
//! E[Σ_{picked a ∈ S} w · bytes_a] = Σ_b t_b · Σ_{a ∈ S ∩ window b} bytes_a:
//! the same estimate the bursts make, from windows a hundred times longer.
//! p is chosen before each window from the thread's recent accesses per
//! instruction, so that a window of W instructions expects m picks; being
//! fixed before the window, it does not bias the estimate.
//!
//! *Signals.* While a thread runs in the cache, every signal but the
//! synchronous ones (and SIGTRAP, through which the cache and the
//! watchpoints reach the engine) is blocked in its context, so the
//! program's handlers never see a copy's address: a signal sent during a
//! window is delivered when it ends, microseconds later. The program's
//! signal mask is kept in the window and given back at its end. A fault
//! raised by a copy (SIGSEGV, SIGFPE, ...) is mapped back to the native
//! instruction by the agent's wrapper before the program's handler runs
//! ([`ThreadState::leave_cache_at_fault`](super::thread::ThreadState::leave_cache_at_fault)).

use super::cache::CodeCache;
use super::Engine;
use crate::x86::translate::Counted;
use rand::{rngs::SmallRng, RngExt, SeedableRng};

/// EFLAGS.TF.
pub(super) const TRAP_FLAG: i64 = 0x100;

/// Where a thread is with respect to its window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Phase {
    /// Running natively.
    #[default]
    Native,
    /// Running copies in the cache.
    Cache,
    /// Single-stepping a pick natively (it goes back into the cache after).
    Step,
    /// Running part of a `rep` instruction's elements in the cache.
    RepPart,
    /// Whole-run counting, between two windows: the thread runs one
    /// instruction natively with the trap flag set and its own signal
    /// mask, so signals that waited during the window are delivered (their
    /// handlers run natively); the step's trap begins the next window.
    Bridge,
}

/// How windows are sized (process-wide).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowSettings {
    /// Instructions a window runs at most.
    pub instructions: u32,
    /// Most picks a window expects; the budget decides how many each gets.
    pub picks: f64,
    /// Whole-run counting (`-e sw-stores`, `-e sw-loads`): every access of
    /// the craft's kind is picked with probability 1/N, N this period, and
    /// windows follow one another for the whole run (see [`Phase::Bridge`]);
    /// None: windows at ticks, sized by the budget.
    pub count: Option<u64>,
}

impl WindowSettings {
    /// The most budget units a window takes: one of its own, one a pick.
    pub fn max_units(&self) -> u32 {
        self.picks.round().max(1.0) as u32 + 1
    }
}

/// What a tick asks of its window.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// The program time it stands for, in periods.
    pub weight: f64,
    pub settings: WindowSettings,
    /// Picks it expects (the budget's choice).
    pub picks: u32,
}

/// One thread's window state.
pub struct Window {
    pub cache: CodeCache,
    pub phase: Phase,
    /// `phase` is not Native, for other threads to read (the session's
    /// end waits for windows to end before it frees their caches).
    pub busy: std::sync::atomic::AtomicBool,
    /// Pick probability per counted access in the window under way.
    pub(super) p: f64,
    /// The program-time weight of the tick that began it.
    pub(super) time_weight: f64,
    /// The settings it began with.
    pub(super) settings: WindowSettings,
    /// The countdown as last set.
    pub(super) drawn: i64,
    /// Instructions the window was given.
    pub(super) given: u64,
    /// Counted accesses and stepped instructions of the window so far.
    pub(super) accesses: u64,
    pub(super) stepped: u64,
    /// The program's signal mask (the kernel's 64 bits), given back at the
    /// window's end.
    pub(super) saved_mask: u64,
    /// Recent counted accesses per instruction (0: no window yet).
    pub(super) per_instruction: f64,
    /// Counted accesses a `rep` string element makes (the craft's kind).
    pub(super) counted_per_element: i64,
    /// Picks the window under way may still take: past its plan by far
    /// (its accesses per instruction misjudged), it picks no more.
    pub(super) picks_left: u64,
    rng: SmallRng,
    /// The engine's time spent when the last window began, and its picks
    /// (None: no window yet).
    pub(super) last_start: Option<(u64, u64)>,
    /// What a budget unit costs (a window's own part, or one pick with its
    /// later trap), learned from windows: 0 before the first.
    pub(super) unit_ns: f64,
    pub stats: WindowStats,
    /// The exact mode's recording (None: windows count or pick).
    pub rec: Option<super::recorder::Recorder>,
    /// Whole-run windows: back into the cache after native code.
    pub resume: super::resume::Resume,
}

/// The profile's account of the windows.
#[derive(Clone, Copy, Debug, Default)]
pub struct WindowStats {
    pub windows: u64,
    pub instructions: u64,
    pub accesses: u64,
    pub picks: u64,
    /// Windows that ended before their instructions ran out (a system
    /// call, code the cache does not run).
    pub cut: u64,
    pub shortest: u64,
    pub longest: u64,
    /// Whole-run counting: crossings between windows to deliver signals.
    pub bridges: u64,
    /// Whole-run windows: returns into the cache at the resume breakpoint.
    pub resumes: u64,
    /// Whole-run windows: times the thread went on natively until the
    /// next tick (no breakpoint could take it back), and where first.
    pub gaps: u64,
    pub first_gap: u64,
}

impl Window {
    pub fn new(seed: u64, record_fd: Option<i32>) -> Window {
        Window {
            cache: CodeCache::new(),
            phase: Phase::Native,
            busy: std::sync::atomic::AtomicBool::new(false),
            p: 1.0,
            time_weight: 0.0,
            settings: WindowSettings { instructions: 0, picks: 0.0, count: None },
            drawn: 0,
            given: 0,
            accesses: 0,
            stepped: 0,
            saved_mask: 0,
            per_instruction: 0.0,
            counted_per_element: 1,
            picks_left: 0,
            rng: SmallRng::seed_from_u64(seed ^ 0x0c0d_eca5),
            last_start: None,
            unit_ns: 0.0,
            stats: WindowStats::default(),
            rec: record_fd.map(super::recorder::Recorder::new),
            resume: super::resume::Resume::default(),
        }
    }

    /// The window under way runs for the whole run (recording or counting
    /// every access), so the thread comes back into the cache after native
    /// code at the resume breakpoint.
    pub fn whole_run(&self) -> bool {
        self.settings.count.is_some()
    }

    /// Recording: the copies' record slot and countdown, after the engine
    /// wrote records or sent the buffer. The countdown stops a copy before
    /// an instruction whose records would not fit (it stops when the
    /// countdown, less the instruction's records, is 0 or less).
    pub(super) fn records_in(&mut self) {
        if let Some(r) = &self.rec {
            let (ptr, room) = (r.next_ptr(), r.room() as i64 + 1);
            let d = self.cache.data();
            d.rec_ptr = ptr;
            d.countdown = room;
            self.drawn = room;
        }
    }

    pub(super) fn records_in_pub(&mut self) {
        self.records_in();
    }

    /// Recording: take in the records the copies wrote.
    pub(super) fn records_out(&mut self) {
        if self.rec.is_some() && self.cache.has_mapping() {
            let ptr = self.cache.data().rec_ptr;
            if let Some(r) = &mut self.rec {
                r.wrote_to(ptr);
            }
        }
    }

    /// Recording: send what the buffer holds (the thread ends, or the
    /// process). Async-signal-safe.
    pub fn records_send(&mut self) {
        self.records_out();
        if let Some(r) = &mut self.rec {
            r.send();
        }
        if self.rec.is_some() && self.cache.has_mapping() {
            self.records_in();
        }
    }

    /// Can this thread run windows (its cache is mapped, or may be)?
    pub fn usable(&self) -> bool {
        self.cache.usable()
    }

    /// What a budget unit is expected to cost: learned from the windows so
    /// far (the engine's time from one window's start to the next, over
    /// its picks and one), or before the first, a pick's round trips.
    pub fn unit_ns(&self, engine: &Engine) -> f64 {
        if self.unit_ns > 0.0 {
            return self.unit_ns;
        }
        (engine.step_cost_ns + engine.trap_cost_ns + 2 * engine.signal_cost_ns) as f64
    }

    /// Inside a window (running copies, or stepping one of its picks)?
    pub fn active(&self) -> bool {
        self.phase != Phase::Native
    }

    /// Forget the window under way and the copies (a fork child).
    pub fn reset(&mut self) {
        self.stats = WindowStats::default();
        self.cache.stats = Default::default();
        self.last_start = None;
        self.phase = Phase::Native;
        self.busy.store(false, std::sync::atomic::Ordering::Release);
        self.cache.flush();
        if let Some(r) = &mut self.rec {
            r.clear();
        }
        if self.rec.is_some() && self.cache.has_mapping() {
            self.records_in();
        }
    }

    /// The countdown to the next pick: geometric on 1, 2, ... with `p`.
    pub(super) fn draw(&mut self) -> i64 {
        if self.p >= 1.0 {
            return 1;
        }
        let u: f64 = 1.0 - self.rng.random::<f64>(); // (0, 1]
        let d = 1.0 + (u.ln() / (1.0 - self.p).ln()).floor();
        d.clamp(1.0, i64::MAX as f64 / 2.0) as i64
    }

    /// Accesses counted since the countdown was last set.
    pub(super) fn take_counted(&mut self) {
        let left = self.cache.data().countdown;
        self.accesses += (self.drawn - left).max(0) as u64;
        self.drawn = left;
    }
}

pub(super) fn counted(engine: &Engine) -> Counted {
    if engine.config.record_fd.is_some() {
        Counted::Records
    } else if engine.craft.samples(&crate::x86::decode::Access { write: true, ..Default::default() }) {
        Counted::Stores
    } else {
        Counted::Loads
    }
}

/// # Safety
/// `uc` must be the context the kernel passed to the signal handler.
pub(super) unsafe fn gregs(uc: *mut libc::ucontext_t) -> &'static mut [i64; 23] {
    // SAFETY: forwarded from the caller; the handler's frame outlives every use.
    unsafe { &mut (*uc).uc_mcontext.gregs }
}
