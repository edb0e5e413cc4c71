//! The count-proportional software sampler: single-step bursts.
//!
//! Without a PMU nothing counts a program's memory accesses, and a timer
//! interrupt lands where time is spent: on the instruction after a stall,
//! not on a random access. So at each timer tick the thread is single-
//! stepped for a short burst (the trap flag, EFLAGS.TF, set in the
//! interrupted context; each step is a SIGTRAP with `TRAP_TRACE`). Every
//! instruction is decoded *before* it runs, so its accesses, implicit ones
//! included, and their addresses come exactly from the live registers.
//!
//! Among the K accesses of the craft's kind that the burst executes, one is
//! picked uniformly (a reservoir of one), so each of them is equally likely,
//! and the sample stands for all K: its weight is K (times the program's own
//! share of the tick's period, as for any software sample; see [`super::clock`]).
//! Summed over bursts, the weighted verdicts count the bytes of every access
//! the bursts stepped through, which is what Equation 4.1 asks for. What
//! remains time-proportional is where bursts start: at time-uniform points,
//! so a phase that runs fewer instructions per second is stepped more often
//! per instruction than a fast one (the accuracy document measures how much
//! that matters).
//!
//! The next access to the picked bytes is watched in software while the
//! burst lasts (every later instruction is decoded anyway) and by a debug
//! register after it. Likewise a stepped instruction that touches bytes an
//! earlier sample watches is handled here, with its precise PC, and its
//! debug register is disabled before it runs, so no hardware trap (whose
//! SIGTRAP would coalesce with the step's) is raised.
//! What a burst never steps, and when it never starts: `super::stepping`.

use super::budget::Budget;
use super::pick::{reservoirs_taking, Candidate};
pub use super::pick::{BurstWeight, MAX_PICKS};
use super::stepping::{foreign_time, refusal, set_trap_flag, trapping, Foreign, Intercept, Refusal};
use super::thread::ThreadState;
use super::watch::MAX_SLOTS;
use super::Engine;
use crate::craft::{Verdict, Watched, SNAPSHOT};
use crate::modules::ProcessMap;
use crate::sys::mem;
use crate::sys::perf;
use crate::unwind;
use crate::x86::decode::{Access, Regs};
use rand::{rngs::SmallRng, RngExt, SeedableRng};

/// How bursts are sized (process-wide).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BurstSettings {
    /// Instructions stepped per burst at most.
    pub steps: u32,
    /// Accesses picked per burst (a reservoir of this size, at most
    /// [`MAX_PICKS`]): more samples for the same steps.
    pub picks: u32,
    /// What each burst's pick stands for.
    pub weight: BurstWeight,
    /// Pick accesses in proportion to their bytes (each pick then stands
    /// for B/m of the burst's B bytes), instead of each access alike (each
    /// pick stands for K/m of its K accesses).
    pub by_bytes: bool,
    /// Share of the program's CPU time the engine may spend (0: no limit);
    /// each burst takes the steps it pays for, at most `steps` (see
    /// [`super::budget`]).
    pub budget: f64,
    /// Fewest steps of a burst: ticks the budget cannot pay that many for
    /// are skipped (None: every tick begins a burst).
    pub min_steps: Option<u32>,
    /// Begin bursts at ticks right after a system call too.
    pub after_syscall: bool,
    /// Run bursts as windows from the code cache (see [`super::window`]);
    /// None: single steps.
    pub window: Option<super::window::WindowSettings>,
}

impl BurstSettings {
    /// Windows for the whole run that count every access (`-e sw-stores`,
    /// `-e sw-loads`, and the exact mode's recording): a pick's weight is
    /// the accesses it stands for, not a share of a tick's time.
    pub fn counts_accesses(&self) -> bool {
        self.window.is_some_and(|w| w.count.is_some())
    }
}

/// One thread's burst state.
pub struct Burst {
    pub active: bool,
    /// Steps taken.
    steps: u32,
    /// Steps taken when the last tick arrived (none since: a burst lost).
    steps_at_tick: u32,
    /// Accesses of the craft's kind executed so far: K.
    seen: u64,
    /// Their bytes: B.
    bytes: u64,
    /// The program-time weight of the tick that began the burst.
    time_weight: f64,
    /// Program time of ticks skipped since the last burst, in periods.
    carried: f64,
    /// Steps this burst may take.
    limit: u32,
    /// The overhead account.
    pub budget: Budget,
    /// The instruction the last handler returned to.
    pending_pc: u64,
    picks: [Option<Candidate>; MAX_PICKS],
    intercepts: [Option<Intercept>; MAX_SLOTS],
    rng: SmallRng,
    /// A window's pick (`super::window`): the nth access of the craft's
    /// kind of the stepped instruction, and its weight; None: the reservoir.
    forced: Option<(u32, f64)>,
    /// A burst was given up with its trap flag perhaps left in a frame.
    left_trap_flag: bool,
}

impl Burst {
    pub fn new(seed: u64, engine: &Engine) -> Burst {
        Burst {
            active: false,
            steps: 0,
            steps_at_tick: 0,
            seen: 0,
            bytes: 0,
            time_weight: 0.0,
            carried: 0.0,
            limit: 0,
            budget: Budget::new(engine.burst.map_or(0.0, |s| s.budget), engine.step_cost_ns, engine.burst.and_then(|s| s.min_steps)),
            pending_pc: 0,
            picks: [None; MAX_PICKS],
            intercepts: [None; MAX_SLOTS],
            rng: SmallRng::seed_from_u64(seed ^ 0xb0b5_7ea1),
            forced: None,
            left_trap_flag: false,
        }
    }

    /// Is the step about to be handled the first of the burst under way?
    pub fn first_step(&self) -> bool {
        self.active && self.steps == 0
    }

    /// A step trap no burst claims: the flag of a burst given up? (Once.)
    pub fn take_left_trap_flag(&mut self) -> bool {
        std::mem::take(&mut self.left_trap_flag)
    }

    /// Forget the burst under way, and the time of skipped ticks (a fork
    /// child's belongs to its parent).
    pub fn reset(&mut self) {
        self.active = false;
        self.forced = None;
        self.carried = 0.0;
        self.picks = [None; MAX_PICKS];
        self.intercepts = [None; MAX_SLOTS];
    }
}

/// A verdict that needs the bytes after the instruction ran: a store's,
/// for crafts that compare values.
fn judged_after(engine: &Engine, a: &Access) -> bool {
    engine.craft.needs_value() && !a.read
}

impl ThreadState {
    /// A tick of the software sampler in burst mode: begin a burst at the
    /// interrupted instruction.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(crate) unsafe fn begin_burst(&mut self, engine: &Engine, map: &ProcessMap, regs: &Regs, weight: f64, uc: *mut libc::ucontext_t) {
        let b = &mut self.burst;
        if b.active {
            if b.steps != b.steps_at_tick {
                // Still stepping: this tick's period ran out inside the burst.
                b.steps_at_tick = b.steps;
                self.record.counters.overdue += 1;
                return;
            }
            // No step since the last tick: the trap flag was lost.
            self.record.counters.bursts_lost += 1;
            self.burst.reset();
            self.burst.left_trap_flag = true;
        }
        // SAFETY: forwarded from the caller.
        if let Some(why) = unsafe { refusal(uc) } {
            match why {
                Refusal::Blocked => self.record.counters.bursts_blocked += 1,
                Refusal::Stepping => self.record.counters.bursts_blocked += 1,
            }
            return;
        }
        let settings = engine.burst.unwrap_or_default();
        if let Some(ws @ super::window::WindowSettings { count: Some(_), .. }) = settings.window {
            // Whole-run counting: a tick only starts windows again (see
            // `super::window`); what it weighs does not matter.
            let windows = self.window.usable() && engine.windows_allowed.load(std::sync::atomic::Ordering::Relaxed);
            // SAFETY: forwarded from the caller.
            if !windows || !unsafe { self.count_tick(engine, map, regs, ws, uc) } {
                self.record.counters.ticks_skipped += 1;
            }
            return;
        }
        let (program_ns, spent) = (weight * engine.period as f64, self.record.counters.engine_ns);
        match self.after_foreign_time(map, regs) {
            // The time this tick landed in was the hypervisor's (a VM exit
            // on `cpuid`), not the program's: anchoring here would put the
            // accesses after every such instruction in the sample thousands
            // of times more often than they run.
            // The program's CPU time since the last tick still earns the
            // budget its share: a program that asks the CPU's features
            // often can spend much of its time in `cpuid` exits, and would
            // otherwise get fewer bursts than the budget pays for
            // (docs/ACCURACY.md, "The budget at ticks that begin no burst").
            Some(Foreign::Hypervisor) => {
                self.record.counters.ticks_after_exits += 1;
                self.earn_without_burst(engine, weight);
                return;
            }
            // Likewise the kernel's: a thread CPU clock runs during system
            // calls, and a period that ends in one fires on its return, so
            // the code after `brk` or `read` would be stepped as often as
            // the kernel takes time there.
            Some(Foreign::Kernel) if !settings.after_syscall => {
                self.record.counters.ticks_after_syscalls += 1;
                self.earn_without_burst(engine, weight);
                return;
            }
            _ => {}
        }
        let windows = self.window.usable() && engine.windows_allowed.load(std::sync::atomic::Ordering::Relaxed);
        if let (Some(ws), true) = (settings.window, windows) {
            let unit = self.window.unit_ns(engine);
            let (units, starved) = self.burst.budget.window(program_ns, spent, unit, ws.max_units(), &engine.head_start);
            if units == 0 {
                self.burst.carried += weight;
                self.record.counters.ticks_skipped += 1;
                return;
            }
            if starved {
                self.record.counters.bursts_over_budget += 1;
            }
            let combined = weight + std::mem::take(&mut self.burst.carried);
            let plan = super::window::Plan { weight: combined, settings: ws, picks: units - 1 };
            // SAFETY: forwarded from the caller.
            if unsafe { self.begin_window(engine, map, regs, plan, uc) } {
                return;
            }
            // The cache cannot take this one: a single-step burst instead,
            // with the time carried so far.
            self.burst.carried = combined - weight;
        }
        let b = &mut self.burst;
        let (limit, starved) = b.budget.steps(program_ns, spent, settings.steps, &engine.head_start);
        if limit == 0 {
            // Saving up for a longer burst: this tick's time goes to it.
            b.carried += weight;
            self.record.counters.ticks_skipped += 1;
            return;
        }
        if starved {
            self.record.counters.bursts_over_budget += 1;
        }
        let weight = weight + std::mem::take(&mut b.carried);
        b.active = true;
        b.limit = limit;
        b.steps = 0;
        b.steps_at_tick = 0;
        b.seen = 0;
        b.bytes = 0;
        b.time_weight = weight;
        b.picks = [None; MAX_PICKS];
        b.intercepts = [None; MAX_SLOTS];
        self.record.counters.bursts += 1;
        let go = self.visit(engine, map, regs);
        // SAFETY: forwarded from the caller.
        unsafe { set_trap_flag(uc, go) };
        if !go {
            self.end_burst(engine);
        }
    }

    /// A window's pick (see `super::window`): single-step the instruction
    /// at `regs.rip`, whose `nth` access of the craft's kind is the pick,
    /// standing for `weight`, with the burst machinery (a burst of one
    /// step). False if the instruction cannot be stepped.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(crate) unsafe fn begin_pick_step(
        &mut self,
        engine: &Engine,
        map: &ProcessMap,
        regs: &Regs,
        nth: u32,
        weight: f64,
        uc: *mut libc::ucontext_t,
    ) -> bool {
        let b = &mut self.burst;
        b.active = true;
        b.limit = 1;
        b.steps = 0;
        b.steps_at_tick = 0;
        b.seen = 0;
        b.bytes = 0;
        b.time_weight = weight;
        b.forced = Some((nth, weight));
        b.picks = [None; MAX_PICKS];
        b.intercepts = [None; MAX_SLOTS];
        let go = self.visit(engine, map, regs);
        // SAFETY: forwarded from the caller.
        unsafe { set_trap_flag(uc, go) };
        if !go {
            self.burst.active = false;
            self.burst.forced = None;
        }
        go
    }

    /// A tick that begins no burst whatever the account holds: the
    /// program's time since the previous tick (`weight` periods) still
    /// earns the budget its share ([`Budget::earn`]).
    pub(crate) fn earn_without_burst(&mut self, engine: &Engine, weight: f64) {
        if let Some(settings) = engine.burst {
            let spent = self.record.counters.engine_ns;
            match settings.window {
                Some(ws) if self.window.usable() => {
                    let unit = self.window.unit_ns(engine);
                    self.burst.budget.earn_window(weight * engine.period as f64, spent, unit, ws.max_units());
                }
                _ => self.burst.budget.earn(weight * engine.period as f64, spent, settings.steps),
            }
        }
    }

    /// Did the thread just run an instruction whose time is not the
    /// program's: one that exits to the hypervisor in a virtual machine
    /// (`cpuid`), or enters the kernel (`syscall`, `sysenter`, `int 0x80`)?
    fn after_foreign_time(&mut self, map: &ProcessMap, regs: &Regs) -> Option<Foreign> {
        // Each of these instructions is two bytes long, so it can only have
        // run just before if the two bytes before the PC spell it. Most
        // ticks stop here: finding the instruction that ends at the PC
        // decodes its whole function when that is not cached (dear where
        // an interpreter's loop is one large function: docs/OVERHEAD.md,
        // "What a tick costs"), which every tick would pay, bursts or not.
        let mut buf = [0u8; 16];
        let before = crate::x86::precise_pc::code_at(map, regs.rip.wrapping_sub(2), &mut buf)?;
        let foreign = foreign_time(before)?;
        // The same bytes may end a longer instruction, and at a branch
        // target the instruction that ran may have been the branch.
        match crate::x86::precise_pc::previous_instruction(map, &mut self.scratch.pc, regs.rip) {
            (Some(prev), false) if prev == regs.rip.wrapping_sub(2) => Some(foreign),
            _ => None,
        }
    }

    /// A single step of the burst: the instruction visited last has run.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(crate) unsafe fn on_step(&mut self, engine: &Engine, map: &ProcessMap, uc: *mut libc::ucontext_t) {
        // SAFETY: forwarded from the caller.
        let regs = unsafe { Regs::from_ucontext(uc, self.place.fs_base, self.place.gs_base) };
        self.record.counters.steps += 1;
        self.after_step(engine);
        self.burst.steps += 1;
        // SAFETY: forwarded from the caller (the trap flag is ours here).
        let blocked = matches!(unsafe { refusal(uc) }, Some(Refusal::Blocked));
        let go = !blocked && self.burst.steps < self.burst.limit && self.visit(engine, map, &regs);
        // SAFETY: forwarded from the caller.
        unsafe { set_trap_flag(uc, go) };
        if !go {
            self.end_burst(engine);
        }
    }

    /// Decode the instruction about to run at `regs.rip`, watch it for the
    /// picked and the armed bytes, and count its accesses of the craft's
    /// kind, picking one of them with probability 1/K. False: the burst
    /// ends before this instruction.
    fn visit(&mut self, engine: &Engine, map: &ProcessMap, regs: &Regs) -> bool {
        let pc = regs.rip;
        if pc >= engine.own_code.0 && pc < engine.own_code.1 {
            return false;
        }
        let mut buf = [0u8; 16];
        let Some(bytes) = super::sample::code_bytes(map, pc, &mut buf) else { return false };
        let Some(d) = self.scratch.analyzer.decode(bytes, pc, regs, false) else { return false };
        if !d.steppable || d.partial {
            return false;
        }
        self.burst.pending_pc = pc;
        let ty = engine.craft.watch();
        // Armed debug registers this instruction would make fire.
        for i in 0..self.watch.n {
            let s = self.watch.slots[i];
            if !s.armed {
                continue;
            }
            let Some(a) = trapping(&d, ty, s.addr, s.len) else { continue };
            s.bp.disable();
            let trap_ctx = self.context_at(map, regs, pc);
            let verdict = (!judged_after(engine, &a)).then(|| self.judge_now(engine, &s.watched, &a));
            self.burst.intercepts[i] = Some(Intercept { access: a, trap_ctx, verdict });
        }
        // The picked accesses' next accesses.
        for k in 0..MAX_PICKS {
            let Some(c) = self.burst.picks[k] else { continue };
            if c.verdict.is_some() || c.dropped || c.trap_after.is_some() {
                continue;
            }
            let Some(a) = trapping(&d, ty, c.waddr, c.wlen) else { continue };
            let trap_ctx = self.context_at(map, regs, pc);
            if judged_after(engine, &a) {
                self.burst.picks[k].as_mut().unwrap().trap_after = Some((a, trap_ctx));
            } else {
                let v = self.judge_now(engine, &c.watched, &a);
                self.settle(k, v, trap_ctx);
            }
        }
        // Count, and pick: a reservoir of `picks` over the accesses seen
        // (each access alike), or `picks` reservoirs of one, each holding an
        // access with probability its bytes over the bytes seen.
        let settings = engine.burst.unwrap_or_default();
        let m = settings.picks.clamp(1, MAX_PICKS as u32) as u64;
        let mut nth = 0;
        for a in d.accesses().iter().copied() {
            if !engine.craft.samples(&a) {
                continue;
            }
            nth += 1;
            if self.is_engine_memory(a.addr) {
                continue;
            }
            let b = &mut self.burst;
            let len = u64::from(a.len.max(1));
            b.seen += 1;
            b.bytes += len;
            let slots = match b.forced {
                // A window's pick: exactly the access its countdown named.
                Some((n, _)) => {
                    let mut s = [false; MAX_PICKS];
                    s[0] = nth == n;
                    s
                }
                None => reservoirs_taking(&mut b.rng, settings.by_bytes, m, b.seen, b.bytes, len),
            };
            if !slots.contains(&true) {
                continue;
            }
            let id = b.seen;
            let ctx = self.context_at(map, regs, pc);
            let pick = self.burst.rng.random::<u64>();
            let (waddr, wlen) = engine.craft.piece(&a, pick);
            let mut watched = Watched::with_piece(a, (waddr, wlen));
            let snapshot_after = engine.craft.needs_value() && a.write;
            if engine.craft.needs_value() && !snapshot_after {
                // A load's value is what it reads: the bytes now.
                let n = (a.len as usize).min(SNAPSHOT);
                if mem::read_own(a.addr, &mut watched.value[..n]) {
                    watched.value_len = n;
                }
            }
            let c = Candidate { id, len, ctx, waddr, wlen, watched, snapshot_after, ..Default::default() };
            for (k, _) in slots.iter().enumerate().filter(|(_, &on)| on) {
                self.burst.picks[k] = Some(c);
            }
        }
        true
    }

    /// After the visited instruction ran: take the values that needed it,
    /// judge what waited for them, and re-enable debug registers whose
    /// access the craft ignored.
    fn after_step(&mut self, engine: &Engine) {
        for k in 0..MAX_PICKS {
            let Some(c) = self.burst.picks[k].as_mut() else { continue };
            if c.snapshot_after {
                c.snapshot_after = false;
                let w = &mut c.watched;
                let n = (w.access.len as usize).min(SNAPSHOT);
                w.value_len = if mem::read_own(w.access.addr, &mut w.value[..n]) { n } else { 0 };
            }
            if let Some((a, trap_ctx)) = c.trap_after.take() {
                let w = c.watched;
                let v = self.judge_now(engine, &w, &a);
                self.settle(k, v, trap_ctx);
            }
        }
        for i in 0..MAX_SLOTS {
            let Some(x) = self.burst.intercepts[i].take() else { continue };
            let s = self.watch.slots[i];
            let verdict = x.verdict.unwrap_or_else(|| self.judge_now(engine, &s.watched, &x.access));
            if verdict == Verdict::Ignore {
                if self.ignore(i) {
                    perf::enable(s.bp.fd());
                }
                continue;
            }
            self.attribute(engine, s.ctx, x.trap_ctx, verdict, false, s.addr);
            self.free(i);
        }
    }

    /// The craft's verdict on `trap` touching the bytes of `w`, with the
    /// bytes as they are now.
    fn judge_now(&mut self, engine: &Engine, w: &Watched, trap: &Access) -> Verdict {
        let mut now = [0u8; SNAPSHOT];
        if engine.craft.needs_value() {
            let n = w.value_len;
            if n > 0 && !mem::read_own(w.access.addr, &mut now[..n]) {
                return Verdict::Use { bytes: crate::craft::credited(w, trap) };
            }
        }
        engine.craft.judge(w, trap, &now)
    }

    fn settle(&mut self, k: usize, v: Verdict, trap_ctx: u32) {
        let Some(c) = self.burst.picks[k].as_mut() else { return };
        if v == Verdict::Ignore {
            c.ignored += 1;
            c.dropped = c.ignored >= super::trap::MAX_IGNORED;
        } else {
            c.verdict = Some((v, trap_ctx));
        }
    }

    /// The calling context of the instruction at `pc` (about to run).
    fn context_at(&mut self, map: &ProcessMap, regs: &Regs, pc: u64) -> u32 {
        let n = unwind::walk(map, &mut self.scratch.unwind, regs, pc, self.place.stack, &mut self.scratch.frames);
        self.record.tree.insert(&self.scratch.frames[..n])
    }

    /// The burst is over: the picked access becomes the sample, judged
    /// already or watched from now on by a debug register.
    fn end_burst(&mut self, engine: &Engine) {
        let b = &mut self.burst;
        b.active = false;
        // Registers intercepted by an instruction that then did not run
        // (the burst ended before it) go back to watching.
        for i in 0..MAX_SLOTS {
            if b.intercepts[i].take().is_some() && self.watch.slots[i].armed {
                perf::enable(self.watch.slots[i].bp.fd());
            }
        }
        // Each pick stands for K/m of the K accesses stepped (m picks), or,
        // picked by bytes, for B/m of their B bytes: its weight in accesses
        // is then B/(m len), so that its verdict's bytes (len) make B/m.
        let m = b.picks.iter().flatten().count();
        if m == 0 {
            return;
        }
        let settings = engine.burst.unwrap_or_default();
        let (seen, bytes) = (b.seen as f64, b.bytes as f64);
        // Per step: the burst's accesses per instruction, in units of the
        // longest burst's.
        let time_weight = match settings.weight {
            BurstWeight::PerStep => b.time_weight * settings.steps.max(1) as f64 / b.steps.max(1) as f64,
            _ => b.time_weight,
        };
        let forced = b.forced.take();
        let weight_of = |c: &Candidate| {
            if let Some((_, w)) = forced {
                w
            } else if settings.weight == BurstWeight::PerBurst {
                time_weight / m as f64
            } else if settings.by_bytes {
                bytes / (m as f64 * c.len.max(1) as f64) * time_weight
            } else {
                seen / m as f64 * time_weight
            }
        };
        let picks = std::mem::replace(&mut b.picks, [None; MAX_PICKS]);
        // Reservoirs that hold the same access make one sample of their
        // summed weight (one debug register, one verdict).
        for k in 0..MAX_PICKS {
            let Some(c) = picks[k] else { continue };
            if picks[..k].iter().flatten().any(|p| p.id == c.id) {
                continue;
            }
            let weight: f64 = picks[k..].iter().flatten().filter(|p| p.id == c.id).map(weight_of).sum();
            self.settle_pick(engine, c, weight);
        }
    }

    /// A pick becomes a sample of weight `weight`: judged already, or
    /// watched from now on by a debug register.
    fn settle_pick(&mut self, engine: &Engine, c: Candidate, weight: f64) {
        let rec = &mut self.record;
        rec.counters.samples += 1;
        let node = rec.tree.node(c.ctx);
        node.samples += 1;
        node.mu += weight; // µ(C)
        if c.dropped {
            return;
        }
        if let Some((v, trap_ctx)) = c.verdict {
            self.attribute(engine, c.ctx, trap_ctx, v, true, c.waddr);
            return;
        }
        let Some(i) = self.claim_slot() else { return };
        self.arm_slot(i, c.waddr, c.wlen, c.ctx, c.watched, None);
    }
}
