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
//! fixed before the window, it does not bias the estimate. Where the
//! window's accesses come far faster than planned, p is cut as it goes
//! ([`super::schedule`]): each access's p is still fixed before it runs,
//! and its pick credits t_b / p with that p.
//!
//! *Signals.* In the cache every signal but the synchronous ones and
//! SIGTRAP is blocked in the thread's context, and delivered when the
//! window ends; a fault raised by a copy is mapped back to the native
//! instruction before the program's handler runs
//! ([`ThreadState::leave_cache_at_fault`](super::thread::ThreadState::leave_cache_at_fault)).
//!
//! [`Window`] is one thread's window state, written only here: the paths
//! that drive it ([`super::crossing`], [`super::cache_exit`],
//! [`super::recording`]) move it from phase to phase through its methods.

use super::cache::CodeCache;
use super::pace::Pace;
use super::place::Place;
use super::process::Engine;
use super::recorder::RecordBuffer;
use super::resume::Resume;
use super::schedule::Schedule;
use super::settings::WindowSettings;
use super::stepping::set_trap_flag;
use crate::sys::siginfo;
use crate::x86::record::{Record, RecordKind};
use crate::x86::translate::Counted;
use rand::{rngs::SmallRng, RngExt, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};

mod account;
pub use account::{Recorded, WindowStats};

/// Counted accesses per instruction assumed before a thread's first window.
const START_PER_INSTRUCTION: f64 = 0.3;

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
    pub(super) cache: CodeCache,
    phase: Phase,
    /// `phase` is not Native, for other threads to read (the session's
    /// end waits for windows to end before it frees their caches).
    busy: AtomicBool,
    /// When the window under way picks (its probability per counted access).
    schedule: Schedule,
    /// The program-time weight of the tick that began it.
    time_weight: f64,
    /// How long its copies took, which corrects its picks' weights.
    pace: Pace,
    /// The settings it began with.
    settings: WindowSettings,
    /// The countdown as last set.
    drawn: i64,
    /// Instructions the window was given.
    given: u64,
    /// Counted accesses and stepped instructions of the window so far.
    accesses: u64,
    stepped: u64,
    /// The program's signal mask (the kernel's 64 bits), given back at the
    /// window's end.
    saved_mask: u64,
    /// Recent counted accesses per instruction (0: no window yet).
    per_instruction: f64,
    /// Counted accesses a `rep` string element makes (the craft's kind).
    counted_per_element: i64,

    rng: SmallRng,
    /// The engine's time spent when the last window began, and its picks
    /// (None: no window yet).
    last_start: Option<(u64, u64)>,
    /// What a budget unit costs (a window's own part, or one pick with its
    /// later trap), learned from windows: 0 before the first.
    unit_ns: f64,
    stats: WindowStats,
    /// The exact mode's recording (None: windows count or pick).
    rec: Option<RecordBuffer>,
    /// Whole-run windows: back into the cache after native code.
    pub(super) resume: Resume,
}

/// The signals a thread may take while in the cache: the synchronous ones
/// (which cannot wait) and SIGTRAP. A kernel mask.
fn window_mask() -> u64 {
    let open = [libc::SIGTRAP, libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGSYS];
    open.iter().fold(u64::MAX, |m, &sig| m & !siginfo::mask_bit(sig))
}

impl Window {
    pub fn new(seed: u64, record: Option<(i32, RecordKind, u32)>) -> Window {
        Window {
            cache: CodeCache::new(record.is_some()),
            phase: Phase::Native,
            busy: AtomicBool::new(false),
            schedule: Schedule::every(1),
            time_weight: 0.0,
            pace: Pace::default(),
            settings: WindowSettings { instructions: 0, picks: 0.0, count: None, timed: false },
            drawn: 0,
            given: 0,
            accesses: 0,
            stepped: 0,
            saved_mask: 0,
            per_instruction: 0.0,
            counted_per_element: 1,
            rng: SmallRng::seed_from_u64(seed ^ 0x0c0d_eca5),
            last_start: None,
            unit_ns: 0.0,
            stats: WindowStats::default(),
            rec: record.map(|(fd, kind, image)| RecordBuffer::new(fd, kind, image)),
            resume: Resume::default(),
        }
    }

    /// The process image this thread's records come from, from now on (a
    /// fork child's).
    pub fn record_as(&mut self, image: u32) {
        if let Some(r) = self.rec.as_mut() {
            r.set_image(image);
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Inside a window (running copies, or stepping one of its picks)?
    pub fn active(&self) -> bool {
        self.phase != Phase::Native
    }

    /// [`Window::active`], for other threads to ask.
    pub fn busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }

    fn set_phase(&mut self, phase: Phase) {
        self.phase = phase;
        self.busy.store(phase != Phase::Native, Ordering::Release);
    }

    /// The settings the window under way (or the last) began with.
    pub fn settings(&self) -> WindowSettings {
        self.settings
    }

    /// The window under way runs for the whole run (recording or counting
    /// every access), so the thread comes back into the cache after native
    /// code at the resume breakpoint.
    pub fn whole_run(&self) -> bool {
        self.settings.count.is_some()
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

    /// Begin a window as `plan` says, the engine having spent `spent` ns
    /// so far, for a thread at `place`, whose context `uc` goes on at
    /// `entry` (the copy of its instruction) with only the signals the
    /// cache takes unblocked.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(super) unsafe fn begin(&mut self, plan: Plan, spent: u64, place: Place, entry: u64, uc: *mut libc::ucontext_t) {
        let Plan { weight, settings, picks } = plan;
        // Learn what a unit cost: the engine's time since the last window
        // began (its picks' traps included) over its units.
        if let Some((at, units)) = self.last_start {
            let per = spent.saturating_sub(at) as f64 / units.max(1) as f64;
            self.unit_ns = if self.unit_ns == 0.0 { per } else { self.unit_ns + (per - self.unit_ns) / 8.0 };
        }
        if let Some(n) = settings.count {
            // Every access alike, for the whole run: a pick stands for n.
            self.schedule = Schedule::every(n);
            self.time_weight = 1.0;
        } else {
            let per = if self.per_instruction > 0.0 { self.per_instruction } else { START_PER_INSTRUCTION };
            let expected = settings.instructions as f64 * per.max(1e-3);
            self.schedule = Schedule::planned(picks, expected);
            self.time_weight = weight;
        }
        self.settings = settings;
        self.pace.begin(self.engaged_ns());
        self.given = settings.instructions as u64;
        self.accesses = 0;
        self.stepped = 0;
        self.last_start = Some((spent, 1 + picks as u64));
        let d = self.draw();
        self.drawn = d;
        let data = self.cache.data();
        data.countdown = d;
        data.instr_left = settings.instructions as i64;
        if self.rec.is_some() {
            data.fs_base = place.fs_base;
            data.gs_base = place.gs_base;
            self.records_in();
        }
        // SAFETY: forwarded from the caller.
        unsafe {
            self.saved_mask = siginfo::frame_mask(uc);
            siginfo::set_frame_mask(uc, window_mask());
            gregs(uc)[libc::REG_RIP as usize] = entry as i64;
        }
        self.set_phase(Phase::Cache);
        self.stats.windows += 1;
    }

    /// The window is over: the thread goes on natively at `native` with
    /// its own signal mask. `cut`: before its instructions ran out.
    pub(super) fn end(&mut self, uc: *mut libc::ucontext_t, native: u64, cut: bool) {
        self.cache.end_away(native);
        // SAFETY: `uc` is the kernel's context (every caller's contract).
        unsafe {
            gregs(uc)[libc::REG_RIP as usize] = native as i64;
            siginfo::set_frame_mask(uc, self.saved_mask);
        }
        self.set_phase(Phase::Native);
        let ran = self.ran();
        let s = &mut self.stats;
        s.cut += cut as u64;
        s.instructions += ran;
        s.accesses += self.accesses;
        s.shortest = if s.shortest == 0 { ran } else { s.shortest.min(ran) };
        s.longest = s.longest.max(ran);
        if self.settings.timed {
            self.pace.end(ran, self.engaged_ns());
        }
        if ran > 0 {
            // Quick to follow: the next window's picks rest on it.
            let obs = self.accesses as f64 / ran as f64;
            self.per_instruction =
                if self.per_instruction == 0.0 { obs } else { self.per_instruction + (obs - self.per_instruction) / 2.0 };
        }
    }

    /// Whole-run counting: are signals waiting for the program (they wait
    /// while it runs in the cache), other than the sampler's?
    pub(super) fn signals_waiting(&self) -> bool {
        siginfo::pending() & !self.saved_mask & !siginfo::mask_bit(siginfo::sampler_signal()) != 0
    }

    /// Whole-run counting: the thread, natively at its next instruction
    /// after a window, crosses a [`Phase::Bridge`]: that instruction runs
    /// under a single step, with the program's own mask.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(super) unsafe fn begin_bridge(&mut self, uc: *mut libc::ucontext_t) {
        // SAFETY: forwarded from the caller.
        unsafe { set_trap_flag(uc, true) };
        self.set_phase(Phase::Bridge);
        self.stats.bridges += 1;
    }

    /// The bridge's step is over (it trapped, or the thread leaves the
    /// cache for good): the thread runs natively, its trap flag clear.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(super) unsafe fn end_bridge(&mut self, uc: *mut libc::ucontext_t) {
        // SAFETY: forwarded from the caller.
        unsafe { set_trap_flag(uc, false) };
        self.set_phase(Phase::Native);
    }

    /// The bridge's step was lost (a handler left by `siglongjmp`): the
    /// thread runs natively.
    pub(super) fn bridge_lost(&mut self) {
        self.set_phase(Phase::Native);
    }

    /// The copies ran part of a `rep` instruction; the window goes on in
    /// the cache.
    pub(super) fn rep_part_done(&mut self) {
        self.set_phase(Phase::Cache);
    }

    /// The context goes to a copy running part of a `rep` instruction.
    pub(super) fn run_rep_part(&mut self) {
        self.set_phase(Phase::RepPart);
    }

    /// The picked instruction is stepped natively: the weight its pick
    /// stands for. `open`: the copies' running time since the last
    /// handler (0 in a handler).
    pub(super) fn step_pick(&mut self, open: f64) -> f64 {
        let mut weight = self.time_weight * self.schedule.weight();
        if self.settings.timed {
            let ran = self.ran();
            weight *= self.pace.factor(ran, self.given, open, self.engaged_ns());
        }
        self.set_phase(Phase::Step);
        self.stats.picks += 1;
        weight
    }

    /// A handler closed `ns` of the window's copies running.
    pub(super) fn ran_in_cache(&mut self, ns: f64) {
        if self.active() && self.settings.timed {
            self.pace.ran(ns);
        }
    }

    /// Instructions the window has run so far (its copies' and its
    /// stepped picks').
    fn ran(&mut self) -> u64 {
        let left = self.cache.data().instr_left.clamp(0, self.given as i64) as u64;
        self.given - left + self.stepped
    }

    /// The engine's calls through the link stub so far (ns).
    fn engaged_ns(&self) -> u64 {
        self.cache.stats.link_ns + self.cache.stats.pick_ns
    }

    /// The picked instruction has run: one instruction stepped, one
    /// counted access.
    pub(super) fn pick_stepped(&mut self) {
        self.stepped += 1;
        self.accesses += 1;
    }

    /// The countdown to the next pick, set for the copies (a window whose
    /// accesses came far faster than planned picks the rest at a lower
    /// probability: [`Schedule::picked`]).
    pub(super) fn next_countdown(&mut self) {
        if self.schedule.picked() {
            self.stats.thinned += 1;
        }
        let d = self.draw();
        self.drawn = d;
        self.cache.data().countdown = d;
    }

    /// Back into the cache after a pick's step.
    pub(super) fn back_in_cache(&mut self) {
        self.set_phase(Phase::Cache);
    }

    /// `n` counted accesses ran outside the countdown (the elements of a
    /// `rep` before the pick).
    pub(super) fn count_accesses(&mut self, n: u64) {
        self.accesses += n;
    }

    /// A part of a long `rep` runs whole in the cache, making `n` counted
    /// accesses: the countdown goes past them.
    pub(super) fn count_rep_part(&mut self, n: u64) {
        self.cache.data().countdown -= n as i64;
        self.drawn -= n as i64;
        self.accesses += n;
    }

    /// Counted accesses a `rep` string element makes (the craft's kind).
    pub(super) fn counted_per_element(&self) -> i64 {
        self.counted_per_element
    }

    /// Whole-run windows: a return into the cache at the resume breakpoint.
    pub(super) fn note_resume(&mut self) {
        self.stats.resumes += 1;
    }

    /// Whole-run windows: the thread goes on natively at `pc` until the
    /// next tick.
    pub(super) fn note_gap(&mut self, pc: u64) {
        self.stats.gaps += 1;
        if self.stats.first_gap == 0 {
            self.stats.first_gap = pc;
        }
    }

    /// A window left for a restartable sequence's critical section, which
    /// runs natively (whole-run: unrecorded).
    pub(super) fn note_critical_section(&mut self) {
        self.stats.critical += 1;
    }

    /// The exact mode: does this thread record?
    pub(super) fn recording(&self) -> bool {
        self.rec.is_some()
    }

    /// The exact mode: what this thread records (None: it does not).
    pub(super) fn record_kind(&self) -> Option<RecordKind> {
        self.rec.as_ref().map(|r| r.kind)
    }

    /// Recording: add the records the engine made of an instruction it
    /// runs itself (`recs`, of this thread's [`RecordKind`]), with their values
    /// if the kind has any (`rax`: the program's, for a `rep stos`); the
    /// buffer is sent when full.
    pub(super) fn push_records(&mut self, recs: &[Record], rax: u64) {
        if let Some(r) = &mut self.rec {
            r.push_for(recs, rax);
        }
    }

    /// Recording: the copy of the instruction at the fault did not run:
    /// its records (the last `bytes` the copies wrote) go; those before
    /// it are kept.
    pub(super) fn take_back_records(&mut self, bytes: u64) {
        if self.rec.is_some() {
            self.cache.data().rec_ptr -= bytes;
            self.records_out();
        }
    }

    /// Recording: the copies stopped at a full buffer: send it, and set
    /// them to write from its start.
    pub(super) fn send_full_buffer(&mut self) {
        if let Some(r) = &mut self.rec {
            r.send();
        }
        self.records_in();
    }

    /// Recording: the copies' record slot and countdown, after the engine
    /// wrote records or sent the buffer, or as a window begins. The
    /// countdown stops a copy before an instruction whose records would
    /// not fit (it stops when the countdown, less the words of the
    /// instruction's records, is 0 or less).
    pub(super) fn records_in(&mut self) {
        if let Some(r) = &mut self.rec {
            // Back from native code: the bytes its stores left.
            r.complete();
            let (ptr, room) = (r.next_ptr(), r.room() as i64 + 1);
            let d = self.cache.data();
            d.rec_ptr = ptr;
            d.countdown = room;
            self.drawn = room;
        }
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

    /// Forget the window under way and the copies (a fork child).
    pub fn reset(&mut self) {
        self.stats = WindowStats::default();
        self.cache.stats = Default::default();
        self.last_start = None;
        self.set_phase(Phase::Native);
        self.cache.forget_after_fork();
        if let Some(r) = &mut self.rec {
            r.clear();
        }
        if self.rec.is_some() && self.cache.has_mapping() {
            self.records_in();
        }
    }

    /// The countdown to the next pick: geometric on 1, 2, ... with `p`.
    fn draw(&mut self) -> i64 {
        let u: f64 = 1.0 - self.rng.random::<f64>(); // (0, 1]
        self.schedule.countdown(u)
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
        Counted::Records(RecordKind::of(engine.config.craft))
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
