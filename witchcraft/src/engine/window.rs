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
//! ([`ThreadState::leave_cache_at_fault`]).

use super::cache::CodeCache;
use super::thread::ThreadState;
use super::Engine;
use crate::modules::ProcessMap;
use crate::sys::siginfo;
use crate::x86::decode::Regs;
use crate::x86::translate::{self, Counted, Exit, Point, Variant};
use rand::{rngs::SmallRng, RngExt, SeedableRng};

/// EFLAGS.TF.
const TRAP_FLAG: i64 = 0x100;

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

/// Counted accesses per instruction assumed before a thread's first window.
const START_PER_INSTRUCTION: f64 = 0.3;

/// One thread's window state.
pub struct Window {
    pub cache: CodeCache,
    pub phase: Phase,
    /// `phase` is not Native, for other threads to read (the session's
    /// end waits for windows to end before it frees their caches).
    pub busy: std::sync::atomic::AtomicBool,
    /// Pick probability per counted access in the window under way.
    p: f64,
    /// The program-time weight of the tick that began it.
    time_weight: f64,
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
    /// Picks the window under way may still take: past its plan by far
    /// (its accesses per instruction misjudged), it picks no more.
    picks_left: u64,
    rng: SmallRng,
    /// The engine's time spent when the last window began, and its picks
    /// (None: no window yet).
    last_start: Option<(u64, u64)>,
    /// What a budget unit costs (a window's own part, or one pick with its
    /// later trap), learned from windows: 0 before the first.
    unit_ns: f64,
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
    fn records_in(&mut self) {
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
    fn records_out(&mut self) {
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
    fn draw(&mut self) -> i64 {
        if self.p >= 1.0 {
            return 1;
        }
        let u: f64 = 1.0 - self.rng.random::<f64>(); // (0, 1]
        let d = 1.0 + (u.ln() / (1.0 - self.p).ln()).floor();
        d.clamp(1.0, i64::MAX as f64 / 2.0) as i64
    }

    /// Accesses counted since the countdown was last set.
    fn take_counted(&mut self) {
        let left = self.cache.data().countdown;
        self.accesses += (self.drawn - left).max(0) as u64;
        self.drawn = left;
    }
}

/// The signals a thread may take while in the cache: the synchronous ones
/// (which cannot wait) and SIGTRAP. A kernel mask.
fn window_mask() -> u64 {
    let open = [libc::SIGTRAP, libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGSYS];
    open.iter().fold(u64::MAX, |m, &sig| m & !siginfo::mask_bit(sig))
}

fn counted(engine: &Engine) -> Counted {
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
unsafe fn gregs(uc: *mut libc::ucontext_t) -> &'static mut [i64; 23] {
    // SAFETY: forwarded from the caller; the handler's frame outlives every use.
    unsafe { &mut (*uc).uc_mcontext.gregs }
}

impl ThreadState {
    /// A tick begins a window at the interrupted instruction (`regs`),
    /// standing for `weight` periods of program time. False if the cache
    /// cannot take it (no mapping, code it cannot translate): the caller
    /// steps a burst instead.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(crate) unsafe fn begin_window(
        &mut self,
        engine: &Engine,
        map: &ProcessMap,
        regs: &Regs,
        plan: Plan,
        uc: *mut libc::ucontext_t,
    ) -> bool {
        let Plan { weight, settings, picks } = plan;
        if !self.window.cache.ready(map) {
            return false;
        }
        let kind = counted(engine);
        let Ok(entry) = self.window.cache.get(map, engine.own_code, kind, regs.rip, Variant::Fast) else { return false };
        // Begun otherwise (a tick), the window needs no breakpoint to come
        // back (only once it surely begins: a tick in code the cache does
        // not run must leave the breakpoint set).
        self.window.resume.disarm();
        let spent = self.record.counters.engine_ns;
        let w = &mut self.window;
        // Learn what a unit cost: the engine's time since the last window
        // began (its picks' traps included) over its units.
        if let Some((at, units)) = w.last_start {
            let per = spent.saturating_sub(at) as f64 / units.max(1) as f64;
            w.unit_ns = if w.unit_ns == 0.0 { per } else { w.unit_ns + (per - w.unit_ns) / 8.0 };
        }
        if let Some(n) = settings.count {
            // Every access alike, for the whole run: a pick stands for n.
            w.picks_left = u64::MAX;
            w.p = 1.0 / n.max(1) as f64;
            w.time_weight = 1.0;
        } else {
            let per = if w.per_instruction > 0.0 { w.per_instruction } else { START_PER_INSTRUCTION };
            let expected = settings.instructions as f64 * per.max(1e-3);
            w.picks_left = 2 * picks.max(1) as u64 + 2;
            w.p = (picks.max(1) as f64 / expected).clamp(1e-9, 1.0);
            w.time_weight = weight;
        }
        w.settings = settings;
        w.given = settings.instructions as u64;
        w.accesses = 0;
        w.stepped = 0;
        w.last_start = Some((spent, 1 + picks as u64));
        let d = w.draw();
        w.drawn = d;
        let data = w.cache.data();
        data.countdown = d;
        data.instr_left = settings.instructions as i64;
        if w.rec.is_some() {
            data.fs_base = self.place.fs_base;
            data.gs_base = self.place.gs_base;
            w.records_in();
        }
        // SAFETY: forwarded from the caller.
        unsafe {
            w.saved_mask = siginfo::frame_mask(uc);
            siginfo::set_frame_mask(uc, window_mask());
            gregs(uc)[libc::REG_RIP as usize] = entry as i64;
        }
        w.phase = Phase::Cache;
        w.busy.store(true, std::sync::atomic::Ordering::Release);
        w.stats.windows += 1;
        self.record.counters.bursts += 1;
        true
    }

    /// A copy left through one of its exits (an `int3` in the cache).
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(crate) unsafe fn on_cache_exit(&mut self, engine: &Engine, map: &ProcessMap, uc: *mut libc::ucontext_t) {
        // SAFETY: forwarded from the caller.
        let g = unsafe { gregs(uc) };
        let rip = g[libc::REG_RIP as usize] as u64;
        if self.window.phase == Phase::Bridge {
            // SAFETY: forwarded from the caller.
            return unsafe { self.end_bridge(engine, map, uc) };
        }
        let Some(exit) = self.window.cache.exit_at(rip) else { return };
        self.window.cache.stats.exits += 1;
        self.window.cache.stats.lookups += matches!(exit, Exit::Lookup) as u64;
        if self.window.phase != Phase::Cache && self.window.phase != Phase::RepPart {
            // An exit from a window this thread already left (never
            // expected): go on natively where it points.
            // SAFETY: forwarded from the caller.
            unsafe { self.leave_cache(uc) };
            return;
        }
        let kind = counted(engine);
        let own = engine.own_code;
        self.window.take_counted();
        self.window.records_out();
        let go = |ts: &mut ThreadState, native: u64, variant: Variant| -> Option<u64> {
            let flushes = ts.window.cache.stats.flushes;
            let c = ts.window.cache.get(map, own, kind, native, variant).ok()?;
            // A flush drops every copy, the one that exited too.
            Some(if ts.window.cache.stats.flushes != flushes { c | 1 << 63 } else { c })
        };
        match exit {
            Exit::Link { native, patch } | Exit::Slow { native, patch } => {
                let variant = if matches!(exit, Exit::Slow { .. }) { Variant::Slow } else { Variant::Fast };
                if !self.translatable(engine, map, native) {
                    return self.leave_for(engine, map, uc, native);
                }
                match go(self, native, variant) {
                    Some(c) => {
                        let c = if c >> 63 != 0 {
                            c & !(1 << 63)
                        } else {
                            self.window.cache.patch(patch, c);
                            c
                        };
                        g[libc::REG_RIP as usize] = c as i64;
                    }
                    None => self.end_window(uc, native, true),
                }
            }
            Exit::Native { native } if self.window.whole_run() => {
                // SAFETY: forwarded from the caller.
                unsafe { self.record_native(engine, map, native, uc) };
            }
            Exit::Native { native } => self.end_window(uc, native, true),
            // SAFETY: forwarded from the caller.
            Exit::End { native } => unsafe { self.window_done(engine, map, uc, native) },
            Exit::Lookup => {
                let native = self.window.cache.data().target;
                if !self.translatable(engine, map, native) {
                    return self.leave_for(engine, map, uc, native);
                }
                match go(self, native, Variant::Fast) {
                    Some(c) => {
                        let c = c & !(1 << 63);
                        self.window.cache.dispatch_to(native, c);
                        g[libc::REG_RIP as usize] = c as i64;
                    }
                    None => self.end_window(uc, native, true),
                }
            }
            Exit::Pick { native } if self.window.rec.is_some() => {
                // The buffer is full: send it, and go on where the copy stopped.
                if let Some(r) = &mut self.window.rec {
                    r.send();
                }
                self.window.records_in();
                match go(self, native, Variant::Fast) {
                    Some(c) => g[libc::REG_RIP as usize] = (c & !(1 << 63)) as i64,
                    None => self.end_window(uc, native, true),
                }
            }
            Exit::BigRep { native } if self.window.rec.is_some() => {
                // SAFETY: forwarded from the caller.
                unsafe { self.record_rep(map, own, native, uc) };
            }
            Exit::Pick { native } => {
                let r = self.window.cache.data().countdown.max(1);
                g[libc::REG_RIP as usize] = native as i64;
                // SAFETY: forwarded from the caller.
                let regs = unsafe { Regs::from_ucontext(uc, self.place.fs_base, self.place.gs_base) };
                let mut buf = [0u8; 16];
                let rep = super::sample::code_bytes(map, native, &mut buf)
                    .and_then(|b| self.scratch.analyzer.decode(b, native, &regs, false))
                    .is_some_and(|d| d.rep);
                if rep && r > 1 {
                    // Run the elements before the picked one in the cache,
                    // then step the picked one.
                    let before = (r as u64 - 1).min(g[libc::REG_RCX as usize] as u64);
                    self.window.accesses += before;
                    // SAFETY: forwarded from the caller.
                    return unsafe { self.rep_part(map, own, native, before, true, uc) };
                }
                // SAFETY: forwarded from the caller.
                unsafe { self.pick(engine, map, &regs, if rep { 1 } else { r as u32 }, uc) };
            }
            Exit::BigRep { native } => {
                // A long `rep`: its next part, up to the pick if the pick is in it.
                let rcx = g[libc::REG_RCX as usize] as u64;
                let part = rcx.min(translate::MAX_REP_ELEMENTS as u64);
                let k = self.window.counted_per_element.max(0) as u64;
                let data = self.window.cache.data();
                data.instr_left -= 1 + (part >> translate::REP_PER_INSTRUCTION_SHIFT) as i64;
                if data.instr_left <= 0 {
                    return self.end_window(uc, native, false);
                }
                let r = data.countdown.max(1) as u64;
                if k > 0 && r <= part * k {
                    let before = (r - 1) / k;
                    self.window.accesses += before * k;
                    // SAFETY: forwarded from the caller.
                    return unsafe { self.rep_part(map, own, native, before, true, uc) };
                }
                data.countdown -= (part * k) as i64;
                self.window.drawn -= (part * k) as i64;
                self.window.accesses += part * k;
                // SAFETY: forwarded from the caller.
                unsafe { self.rep_part(map, own, native, part, false, uc) };
            }
            Exit::RepDone => {
                let data = self.window.cache.data();
                let (native, rest, pick, len) = (data.rep_native, data.rep_rest, data.rep_pick != 0, data.rep_len);
                g[libc::REG_RCX as usize] = (g[libc::REG_RCX as usize] as u64).wrapping_add(rest) as i64;
                g[libc::REG_RIP as usize] = native as i64;
                if !pick {
                    // A part of a long `rep` ran: on with the rest, or after it.
                    let at = if rest == 0 { native + len } else { native };
                    self.window.phase = Phase::Cache;
                    match go(self, at, Variant::Fast) {
                        Some(c) => g[libc::REG_RIP as usize] = (c & !(1 << 63)) as i64,
                        None => self.end_window(uc, at, true),
                    }
                    return;
                }
                // SAFETY: forwarded from the caller.
                let regs = unsafe { Regs::from_ucontext(uc, self.place.fs_base, self.place.gs_base) };
                // SAFETY: forwarded from the caller.
                unsafe { self.pick(engine, map, &regs, 1, uc) };
            }
        }
    }

    /// Run `elements` elements of the `rep` instruction at `native` (the
    /// context's PC) in the cache, then pick the next one (`pick`) or go on.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(super) unsafe fn rep_part(
        &mut self,
        map: &ProcessMap,
        own: (u64, u64),
        native: u64,
        elements: u64,
        pick: bool,
        uc: *mut libc::ucontext_t,
    ) {
        // SAFETY: forwarded from the caller.
        let g = unsafe { gregs(uc) };
        let rcx = g[libc::REG_RCX as usize] as u64;
        let Some(part) = self.window.cache.rep_part(map, own, native) else { return self.end_window(uc, native, true) };
        let data = self.window.cache.data();
        data.rep_native = native;
        data.rep_rest = rcx - elements.min(rcx);
        data.rep_pick = pick as u64;
        g[libc::REG_RCX as usize] = elements.min(rcx) as i64;
        g[libc::REG_RIP as usize] = part as i64;
        self.window.phase = Phase::RepPart;
    }

    /// Step the picked instruction at `regs.rip` natively: its `nth`
    /// counted access is the pick.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    unsafe fn pick(&mut self, engine: &Engine, map: &ProcessMap, regs: &Regs, nth: u32, uc: *mut libc::ucontext_t) {
        let w = &mut self.window;
        let weight = w.time_weight / w.p;
        w.phase = Phase::Step;
        w.stats.picks += 1;
        // SAFETY: forwarded from the caller.
        if !unsafe { self.begin_pick_step(engine, map, regs, nth, weight, uc) } {
            self.end_window(uc, regs.rip, true);
        }
    }

    /// The picked instruction has run (the burst machinery judged and
    /// armed what it needed): back into the cache, with a new countdown.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(crate) unsafe fn resume_window(&mut self, engine: &Engine, map: &ProcessMap, uc: *mut libc::ucontext_t) {
        // SAFETY: forwarded from the caller.
        let g = unsafe { gregs(uc) };
        let rip = g[libc::REG_RIP as usize] as u64;
        self.window.stepped += 1;
        self.window.accesses += 1;
        if !self.translatable(engine, map, rip) {
            return self.end_window(uc, rip, true);
        }
        if self.window.cache.data().instr_left <= 0 {
            // SAFETY: forwarded from the caller.
            return unsafe { self.window_done(engine, map, uc, rip) };
        }
        self.window.picks_left = self.window.picks_left.saturating_sub(1);
        let d = if self.window.picks_left == 0 { i64::MAX / 4 } else { self.window.draw() };
        self.window.drawn = d;
        self.window.cache.data().countdown = d;
        match self.window.cache.get(map, engine.own_code, counted(engine), rip, Variant::Fast) {
            Ok(c) => {
                g[libc::REG_RIP as usize] = c as i64;
                self.window.phase = Phase::Cache;
            }
            Err(_) => self.end_window(uc, rip, true),
        }
    }

    /// A window ran all its instructions, the thread is at `native`. At
    /// ticks: the window is over. Whole-run counting: the next window
    /// begins here at once, unless signals are waiting for the program
    /// (they wait while it runs in the cache): then the thread crosses a
    /// [`Phase::Bridge`] to let them in, or, where it cannot step the next
    /// instruction, goes on natively until the next tick.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    unsafe fn window_done(&mut self, engine: &Engine, map: &ProcessMap, uc: *mut libc::ucontext_t, native: u64) {
        let settings = self.window.settings;
        if settings.count.is_none() {
            return self.end_window(uc, native, false);
        }
        let waiting = siginfo::pending() & !self.window.saved_mask & !siginfo::mask_bit(siginfo::sampler_signal()) != 0;
        self.end_window(uc, native, false);
        // SAFETY: forwarded from the caller.
        let regs = unsafe { Regs::from_ucontext(uc, self.place.fs_base, self.place.gs_base) };
        if !waiting {
            let plan = Plan { weight: 1.0, settings, picks: 0 };
            // SAFETY: forwarded from the caller.
            unsafe { self.begin_window(engine, map, &regs, plan, uc) };
            return;
        }
        let mut buf = [0u8; 16];
        let steppable = super::sample::code_bytes(map, native, &mut buf)
            .and_then(|b| self.scratch.analyzer.decode(b, native, &regs, false))
            .is_some_and(|d| d.steppable && !d.rep);
        if steppable {
            // SAFETY: forwarded from the caller.
            unsafe { (*uc).uc_mcontext.gregs[libc::REG_EFL as usize] |= TRAP_FLAG };
            self.window.phase = Phase::Bridge;
            self.window.busy.store(true, std::sync::atomic::Ordering::Release);
            self.window.stats.bridges += 1;
        }
    }

    /// The step of a [`Phase::Bridge`] trapped: the waiting signals were
    /// delivered, one instruction ran natively; the next window begins.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    unsafe fn end_bridge(&mut self, engine: &Engine, map: &ProcessMap, uc: *mut libc::ucontext_t) {
        // SAFETY: forwarded from the caller.
        unsafe { (*uc).uc_mcontext.gregs[libc::REG_EFL as usize] &= !TRAP_FLAG };
        self.window.phase = Phase::Native;
        self.window.busy.store(false, std::sync::atomic::Ordering::Release);
        let settings = self.window.settings;
        // SAFETY: forwarded from the caller.
        let regs = unsafe { Regs::from_ucontext(uc, self.place.fs_base, self.place.gs_base) };
        if self.translatable(engine, map, regs.rip) {
            let plan = Plan { weight: 1.0, settings, picks: 0 };
            // SAFETY: forwarded from the caller.
            unsafe { self.begin_window(engine, map, &regs, plan, uc) };
        }
    }

    /// Whole-run counting: a tick found the thread outside the cache (it
    /// left at a system call or code the cache does not run, or a bridge
    /// was lost to a handler that jumped away): the next window begins.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(crate) unsafe fn count_tick(
        &mut self,
        engine: &Engine,
        map: &ProcessMap,
        regs: &Regs,
        settings: WindowSettings,
        uc: *mut libc::ucontext_t,
    ) -> bool {
        if self.window.phase == Phase::Bridge {
            // The trap flag is not set here (the caller's check): the
            // bridge's step was lost (a handler left by siglongjmp).
            self.window.phase = Phase::Native;
            self.window.busy.store(false, std::sync::atomic::Ordering::Release);
        }
        if self.window.active() {
            return false;
        }
        if self.window.resume.is_armed() {
            // The thread is in code the cache does not run (a system call,
            // an interposer and the C library function it calls on to),
            // and the breakpoint takes it back where that returns: a
            // window begun here (in `malloc`, called by the agent's
            // `malloc`) would end at the return into the agent, with no
            // way back but the next tick.
            return true;
        }
        let plan = Plan { weight: 1.0, settings, picks: 0 };
        // SAFETY: forwarded from the caller.
        unsafe { self.begin_window(engine, map, regs, plan, uc) }
    }

    /// The cache does not run `native` (the agent's own code, code outside
    /// the modules): the window ends there. Recording resumes at the
    /// return address on top of the stack, where a call into such code (a
    /// function the agent interposes) comes back.
    fn leave_for(&mut self, engine: &Engine, map: &ProcessMap, uc: *mut libc::ucontext_t, native: u64) {
        let whole_run = self.window.whole_run();
        self.end_window(uc, native, true);
        if !whole_run {
            return;
        }
        // SAFETY: `uc` is the kernel's context (every caller's contract).
        let sp = unsafe { gregs(uc)[libc::REG_RSP as usize] as u64 };
        let mut ret = [0u8; 8];
        if crate::sys::mem::read_own(sp, &mut ret) {
            let ret = u64::from_le_bytes(ret);
            if self.translatable(engine, map, ret) {
                // What runs natively until then is not recorded but its
                // return, which reads the return address: credited to the
                // code it returns from, and its frame ends at once for the
                // shadow call stack.
                let load = crate::x86::decode::Access { addr: sp, len: 8, read: true, ..Default::default() };
                let r = crate::x86::record::Record {
                    addr: sp,
                    pc: native,
                    info: crate::x86::record::info(&load) | crate::x86::record::RET,
                    extra: ret,
                };
                if let Some(rec) = &mut self.window.rec {
                    rec.push(&[r]);
                }
                return self.resume_after(engine, ret);
            }
        }
        self.note_gap_at(native);
    }

    fn translatable(&self, engine: &Engine, map: &ProcessMap, pc: u64) -> bool {
        map.module(pc).is_some() && !(pc >= engine.own_code.0 && pc < engine.own_code.1)
    }

    /// The window is over: the thread goes on natively at `native` with
    /// its own signal mask. `cut`: before its instructions ran out.
    pub(crate) fn end_window(&mut self, uc: *mut libc::ucontext_t, native: u64, cut: bool) {
        let w = &mut self.window;
        // SAFETY: `uc` is the kernel's context (every caller's contract).
        unsafe {
            gregs(uc)[libc::REG_RIP as usize] = native as i64;
            siginfo::set_frame_mask(uc, w.saved_mask);
        }
        w.phase = Phase::Native;
        w.busy.store(false, std::sync::atomic::Ordering::Release);
        let left = w.cache.data().instr_left.clamp(0, w.given as i64) as u64;
        let ran = w.given - left + w.stepped;
        let s = &mut w.stats;
        s.cut += cut as u64;
        s.instructions += ran;
        s.accesses += w.accesses;
        s.shortest = if s.shortest == 0 { ran } else { s.shortest.min(ran) };
        s.longest = s.longest.max(ran);
        if ran > 0 {
            // Quick to follow: the next window's picks rest on it.
            let obs = w.accesses as f64 / ran as f64;
            w.per_instruction = if w.per_instruction == 0.0 { obs } else { w.per_instruction + (obs - w.per_instruction) / 2.0 };
        }
    }

    /// Leave the cache wherever the thread is in it, for good (the session
    /// ends, or the window's state cannot go on): the context goes to the
    /// native instruction it stands for, with the program's signal mask.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub unsafe fn leave_cache(&mut self, uc: *mut libc::ucontext_t) {
        if self.window.phase == Phase::Bridge {
            // Natively already, with the program's mask: only the step goes.
            // SAFETY: forwarded from the caller.
            unsafe { (*uc).uc_mcontext.gregs[libc::REG_EFL as usize] &= !TRAP_FLAG };
            self.window.phase = Phase::Native;
            self.window.busy.store(false, std::sync::atomic::Ordering::Release);
            return;
        }
        if !self.window.active() {
            return;
        }
        // SAFETY: forwarded from the caller.
        let g = unsafe { gregs(uc) };
        let rip = g[libc::REG_RIP as usize] as u64;
        let native = match self.window.cache.exit_at(rip) {
            Some(
                Exit::Link { native, .. }
                | Exit::Native { native }
                | Exit::End { native }
                | Exit::Slow { native, .. }
                | Exit::Pick { native }
                | Exit::BigRep { native },
            ) => native,
            Some(Exit::Lookup) => self.window.cache.data().target,
            Some(Exit::RepDone) => {
                let data = self.window.cache.data();
                g[libc::REG_RCX as usize] = (g[libc::REG_RCX as usize] as u64).wrapping_add(data.rep_rest) as i64;
                data.rep_native
            }
            // Stepping a pick: the context is native already.
            None => rip,
        };
        self.burst.reset();
        // SAFETY: the trap flag of a pick's step is ours.
        unsafe { (*uc).uc_mcontext.gregs[libc::REG_EFL as usize] &= !0x100 };
        self.end_window(uc, native, true);
    }

    /// A fault (SIGSEGV, SIGBUS, SIGFPE, SIGILL) raised by a copy: put the
    /// context at the native instruction that faulted, with the program's
    /// registers and signal mask, and end the window, before the program's
    /// handler sees it. False if the context is not in this thread's cache.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub unsafe fn leave_cache_at_fault(&mut self, engine: &Engine, uc: *mut libc::ucontext_t) -> bool {
        // SAFETY: forwarded from the caller.
        let g = unsafe { gregs(uc) };
        let rip = g[libc::REG_RIP as usize] as u64;
        if !self.window.active() || !self.window.cache.is_code(rip) {
            return false;
        }
        let Some(map) = crate::modules::current() else { return false };
        let Some(p) = self.window.cache.point(map, engine.own_code, counted(engine), rip, false) else {
            return false;
        };
        if let Some((reg, slot)) = p.spilled {
            // SAFETY: the slot is in this thread's data page.
            g[greg_of(reg)] = unsafe { *(slot as *const i64) };
        }
        self.end_window(uc, p.pc, true);
        true
    }

    /// The registers the program would have at a watchpoint trap inside a
    /// copy (`regs`, as the context has them), and the point: the native
    /// instruction that made the access.
    pub(crate) fn native_view(&mut self, engine: &Engine, map: &ProcessMap, regs: &Regs) -> Option<(Point, Regs)> {
        if !self.window.cache.is_code(regs.rip) {
            return None;
        }
        let p = self.window.cache.point(map, engine.own_code, counted(engine), regs.rip, true)?;
        let mut view = *regs;
        if let Some((reg, slot)) = p.spilled {
            // SAFETY: the slot is in this thread's data page.
            view.gpr[reg as usize] = unsafe { *(slot as *const u64) };
        }
        view.rip = if p.before {
            p.pc
        } else if p.target_slot {
            self.window.cache.data().target
        } else {
            p.next
        };
        Some((p, view))
    }
}

/// The ucontext index of general-purpose register `reg` (hardware number).
fn greg_of(reg: u8) -> usize {
    const ORDER: [i32; 16] = [
        libc::REG_RAX,
        libc::REG_RCX,
        libc::REG_RDX,
        libc::REG_RBX,
        libc::REG_RSP,
        libc::REG_RBP,
        libc::REG_RSI,
        libc::REG_RDI,
        libc::REG_R8,
        libc::REG_R9,
        libc::REG_R10,
        libc::REG_R11,
        libc::REG_R12,
        libc::REG_R13,
        libc::REG_R14,
        libc::REG_R15,
    ];
    ORDER[reg as usize & 15] as usize
}
