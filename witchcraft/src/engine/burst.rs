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

use super::pick::{Candidate, MAX_PICKS};
use super::process::Engine;
use super::settings::WindowSettings;
use super::stepping::{foreign_time, judge_now, judged_after, refusal, set_trap_flag, trapping, Foreign, Intercept, Refusal, TickInBurst};
use super::thread::ThreadState;
use super::watch::{snapshot, MAX_SLOTS};
use super::window::Plan;
use crate::craft::{Verdict, Watched};
use crate::modules::ProcessMap;
use crate::x86::decode::Regs;

impl ThreadState {
    /// A tick of the software sampler in burst mode: begin a burst at the
    /// interrupted instruction.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(crate) unsafe fn begin_burst(&mut self, engine: &Engine, map: &ProcessMap, regs: &Regs, weight: f64, uc: *mut libc::ucontext_t) {
        match self.burst.tick() {
            TickInBurst::Idle => {}
            // Still stepping: this tick's period ran out inside the burst.
            TickInBurst::Stepping => {
                self.ledger.counters.overdue += 1;
                return;
            }
            // No step since the last tick: the trap flag was lost.
            TickInBurst::Lost => self.ledger.counters.bursts_lost += 1,
        }
        // SAFETY: forwarded from the caller.
        if let Some(why) = unsafe { refusal(uc) } {
            match why {
                Refusal::Blocked => self.ledger.counters.bursts_blocked += 1,
                Refusal::Stepping => self.ledger.counters.bursts_blocked += 1,
            }
            return;
        }
        let settings = engine.burst.unwrap_or_default();
        if let Some(ws @ WindowSettings { count: Some(_), .. }) = settings.window {
            // Whole-run counting: a tick only starts windows again (see
            // `super::window`); what it weighs does not matter.
            let windows = self.window.usable() && engine.windows_allowed();
            // SAFETY: forwarded from the caller.
            if !windows || !unsafe { self.count_tick(engine, map, regs, ws, uc) } {
                self.ledger.counters.ticks_skipped += 1;
            }
            return;
        }
        let (program_ns, spent) = (weight * engine.period as f64, self.ledger.counters.engine_ns);
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
                self.ledger.counters.ticks_after_exits += 1;
                self.earn_without_burst(engine, weight);
                return;
            }
            // Likewise the kernel's: a thread CPU clock runs during system
            // calls, and a period that ends in one fires on its return, so
            // the code after `brk` or `read` would be stepped as often as
            // the kernel takes time there.
            Some(Foreign::Kernel) if !settings.after_syscall => {
                self.ledger.counters.ticks_after_syscalls += 1;
                self.earn_without_burst(engine, weight);
                return;
            }
            _ => {}
        }
        let windows = self.window.usable() && engine.windows_allowed();
        if let (Some(ws), true) = (settings.window, windows) {
            let unit = self.window.unit_ns(engine);
            let (units, starved) = self.budget.window(program_ns, spent, unit, ws.max_units(), &engine.head_start);
            if units == 0 {
                self.burst.carry(weight);
                self.ledger.counters.ticks_skipped += 1;
                return;
            }
            if starved {
                self.ledger.counters.bursts_over_budget += 1;
            }
            let combined = weight + self.burst.take_carried();
            let plan = Plan { weight: combined, settings: ws, picks: units - 1 };
            // SAFETY: forwarded from the caller.
            if unsafe { self.begin_window(engine, map, regs, plan, uc) } {
                return;
            }
            // The cache cannot take this one: a single-step burst instead,
            // with the time carried so far.
            self.burst.carry(combined - weight);
        }
        let (limit, starved) = self.budget.steps(program_ns, spent, settings.steps, &engine.head_start);
        if limit == 0 {
            // Saving up for a longer burst: this tick's time goes to it.
            self.burst.carry(weight);
            self.ledger.counters.ticks_skipped += 1;
            return;
        }
        if starved {
            self.ledger.counters.bursts_over_budget += 1;
        }
        let weight = weight + self.burst.take_carried();
        self.burst.begin(limit, weight);
        self.ledger.counters.bursts += 1;
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
        let go = self.begin_pick_in_cache(engine, map, regs, nth, weight);
        // SAFETY: forwarded from the caller.
        unsafe { set_trap_flag(uc, go) };
        go
    }

    /// A window's pick at `regs.rip` taken without a trap, from the cache's
    /// link stub (its `nth` counted access, standing for `weight`): as
    /// [`ThreadState::begin_pick_step`], but the instruction then runs from
    /// a copy of it alone, and [`ThreadState::end_pick_in_cache`] follows.
    /// False (nothing held) if the instruction cannot be stepped.
    pub(crate) fn begin_pick_in_cache(&mut self, engine: &Engine, map: &ProcessMap, regs: &Regs, nth: u32, weight: f64) -> bool {
        self.burst.begin_pick(nth, weight);
        let go = self.visit(engine, map, regs);
        if !go {
            self.burst.abandon_pick();
        }
        go
    }

    /// The instruction of [`ThreadState::begin_pick_in_cache`] ran: as at
    /// its step's trap ([`ThreadState::on_step`]), take what needed it to
    /// have run, and the pick becomes a sample (judged, or watched from now
    /// on by a debug register).
    pub(crate) fn end_pick_in_cache(&mut self, engine: &Engine) {
        self.after_step(engine);
        self.burst.step_taken();
        self.end_burst(engine);
    }

    /// A tick that begins no burst whatever the account holds: the
    /// program's time since the previous tick (`weight` periods) still
    /// earns the budget its share ([`super::budget::Budget::earn`]).
    pub(crate) fn earn_without_burst(&mut self, engine: &Engine, weight: f64) {
        if let Some(settings) = engine.burst {
            let spent = self.ledger.counters.engine_ns;
            match settings.window {
                Some(ws) if self.window.usable() => {
                    let unit = self.window.unit_ns(engine);
                    self.budget.earn_window(weight * engine.period as f64, spent, unit, ws.max_units());
                }
                _ => self.budget.earn(weight * engine.period as f64, spent, settings.steps),
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
        match self.ledger.previous_instruction(map, regs.rip) {
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
        let regs = unsafe { self.ledger.regs(uc) };
        self.ledger.counters.steps += 1;
        self.after_step(engine);
        let more = self.burst.step_taken();
        // SAFETY: forwarded from the caller (the trap flag is ours here).
        let blocked = matches!(unsafe { refusal(uc) }, Some(Refusal::Blocked));
        let go = !blocked && more && self.visit(engine, map, &regs);
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
        if engine.is_own_code(pc) {
            return false;
        }
        let Some(d) = self.ledger.decode(map, pc, regs, false) else { return false };
        if !d.steppable || d.partial {
            return false;
        }
        let ty = engine.craft.watch();
        // Armed debug registers this instruction would make fire.
        for i in 0..self.ledger.watch().open_slots() {
            let Some(s) = self.ledger.armed(i) else { continue };
            let Some(a) = trapping(&d, ty, s.addr, s.len) else { continue };
            self.ledger.hold_off(i);
            let trap_ctx = self.ledger.context(map, regs, pc);
            let verdict = (!judged_after(engine, &a)).then(|| judge_now(engine, &s.watched, &a));
            self.burst.intercept(i, Intercept { access: a, trap_ctx, verdict });
        }
        // The picked accesses' next accesses.
        for k in 0..MAX_PICKS {
            let Some(c) = self.burst.pick(k) else { continue };
            if c.verdict.is_some() || c.dropped || c.trap_after.is_some() {
                continue;
            }
            let Some(a) = trapping(&d, ty, c.waddr, c.wlen) else { continue };
            let trap_ctx = self.ledger.context(map, regs, pc);
            if judged_after(engine, &a) {
                self.burst.judge_after_step(k, a, trap_ctx);
            } else {
                let v = judge_now(engine, &c.watched, &a);
                self.burst.settle(k, v, trap_ctx);
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
            let Some(taken) = self.burst.count(u64::from(a.len.max(1)), nth, settings.by_bytes, m) else { continue };
            let ctx = self.ledger.context(map, regs, pc);
            let piece = engine.craft.piece(&a, self.burst.random());
            let mut watched = Watched::with_piece(a, piece);
            let snapshot_after = engine.craft.needs_value() && a.write;
            if engine.craft.needs_value() && !snapshot_after {
                // A load's value is what it reads: the bytes now.
                snapshot(&mut watched);
            }
            self.burst.hold(taken, ctx, watched, snapshot_after);
        }
        true
    }

    /// After the visited instruction ran: take the values that needed it,
    /// judge what waited for them, and re-enable debug registers whose
    /// access the craft ignored.
    fn after_step(&mut self, engine: &Engine) {
        self.burst.after_step(engine);
        for i in 0..MAX_SLOTS {
            let Some(x) = self.burst.take_intercept(i) else { continue };
            let s = self.ledger.watch().slot(i);
            let verdict = x.verdict.unwrap_or_else(|| judge_now(engine, &s.watched, &x.access));
            if verdict == Verdict::Ignore {
                if self.ledger.ignore(i) {
                    self.ledger.hold_on(i);
                }
                continue;
            }
            self.ledger.credit(engine, i, x.trap_ctx, verdict);
        }
    }

    /// The burst is over: the picked access becomes the sample, judged
    /// already or watched from now on by a debug register.
    fn end_burst(&mut self, engine: &Engine) {
        self.stop_burst();
        let settings = engine.burst.unwrap_or_default();
        for (c, weight) in self.burst.weigh(&settings).into_iter().flatten() {
            self.settle_pick(engine, c, weight);
        }
    }

    /// A pick becomes a sample of weight `weight`: judged already, or
    /// watched from now on by a debug register.
    fn settle_pick(&mut self, engine: &Engine, c: Candidate, weight: f64) {
        self.ledger.count_sample(c.ctx, weight);
        if c.dropped {
            return;
        }
        if let Some((v, trap_ctx)) = c.verdict {
            self.ledger.attribute(engine, c.ctx, trap_ctx, v, true, c.waddr);
            return;
        }
        let Some(i) = self.ledger.claim() else { return };
        self.ledger.arm(i, c.waddr, c.wlen, c.ctx, c.watched, None);
    }
}
