//! How long a burst may be: the overhead budget.
//!
//! A single step costs a signal round trip (docs/OVERHEAD.md), so a
//! burst's length decides the engine's cost. The user names a budget, a share of the program's CPU
//! time (3% by default); each thread keeps an account of it, a token
//! bucket measured in ns: every tick credits the budget's share of the
//! program time since the previous tick, and debits everything the engine
//! actually spent since then (the ticks, the steps, and the traps of the
//! watchpoints the last bursts armed, as the engine's clock counts them),
//! so the budget is the engine's whole share of CPU time. A burst takes as
//! many steps as the credit pays for, at most the configured maximum and at
//! least [`MIN_STEPS`]: every tick begins a burst, so every tick is a
//! sample as the user's period asks, and no tick's program time is lost. A
//! period too short for the budget (`-p 100us` at 3%) therefore costs more
//! than the budget; the profile counts such starved bursts and says so.
//!
//! Sizing from measured spending rather than from the start-up calibration
//! alone keeps the budget when the calibration is off (a busy machine),
//! when traps are dense, or when unwinding is costly. The account saves up
//! at most two full bursts, so an idle stretch does not buy a run of long
//! bursts later, and carries at most a few bursts of debt.
//!
//! Alternatively (`WITCH_BURST_MIN`), bursts have a floor of their own: a
//! tick the account cannot pay that many steps for begins no burst, and its
//! program time goes to the next burst. Fewer, longer bursts see more of
//! the code around where they start (a 4-step burst in a 20-instruction
//! loop sees the instructions after wherever the time goes, not the loop).

/// The fewest steps worth a burst.
pub const MIN_STEPS: u32 = 4;

/// What a process's threads may borrow from the budget while they start:
/// 5 ms of CPU time in all, drawn by whichever tick's burst the account
/// cannot pay in full, until it is gone. A run of 100 ms gets about 20
/// ticks at the default period, and at 3% would pay for a burst at only a
/// few of them: with the head start the early ticks begin bursts, so a
/// short run gets samples enough to say something. Each thread repays what
/// it drew with half of what it earns afterwards, so over a run of more
/// than about 0.35 s of CPU time the engine's share is still the budget;
/// a shorter run pays at most the 5 ms. (A longer loan left half-second
/// runs over the budget: docs/OVERHEAD.md, "Alternatives".) Only for
/// bursts of one length at ticks the budget chooses (the default): with a
/// burst at every tick (`-p`) a short run has its samples anyway, and a
/// loan would only lengthen its first bursts, which their weight
/// (accesses times time) would then count too heavily (a plugin loaded and
/// run first took up to 28% of the waste of a test where it does a tenth
/// of the work).
pub const HEAD_START_NS: i64 = 5_000_000;

/// The process-wide head start ([`HEAD_START_NS`]), shared by its threads'
/// accounts: an atomic, drawn from in signal handlers.
#[derive(Debug)]
pub struct HeadStart(AtomicI64);

impl HeadStart {
    pub fn new(ns: i64) -> HeadStart {
        HeadStart(AtomicI64::new(ns))
    }

    /// Take up to `want_ns`; returns what was granted (0 once it is gone).
    pub fn draw(&self, want_ns: f64) -> f64 {
        if want_ns < 1.0 || self.0.load(Ordering::Relaxed) <= 0 {
            return 0.0;
        }
        let want = want_ns.ceil() as i64;
        // Two threads may both draw the last of it: the loser gets what
        // was left, and the allowance ends below zero, unused.
        self.0.fetch_sub(want, Ordering::Relaxed).clamp(0, want) as f64
    }
}

use std::sync::atomic::{AtomicI64, Ordering};

/// One thread's account.
#[derive(Clone, Debug)]
pub struct Budget {
    /// Share of program time the engine may use; 0: no limit.
    fraction: f64,
    /// Credit, in ns of CPU time (negative: debt).
    credit_ns: f64,
    /// The engine's total spending when last settled.
    spent_mark_ns: u64,
    /// What one step costs, learned from this thread's steps.
    step_ns: f64,
    /// Skip ticks the account cannot pay this many steps for (None: every
    /// tick a burst of at least [`MIN_STEPS`]).
    floor: Option<u32>,
    /// What this thread drew from the head start and has not repaid (ns).
    loan_ns: f64,
}

impl Budget {
    /// `step_ns`: the calibrated cost of one step; `floor`: the fewest
    /// steps of a burst, skipping ticks until the account pays for them
    /// (None: no skipping).
    pub fn new(fraction: f64, step_ns: u64, floor: Option<u32>) -> Budget {
        Budget { fraction: fraction.max(0.0), credit_ns: 0.0, spent_mark_ns: 0, step_ns: (step_ns as f64).max(100.0), floor, loan_ns: 0.0 }
    }

    /// A tick: the program ran `program_ns` since the previous one, and the
    /// engine has spent `engine_ns` in all so far; what the account cannot
    /// pay for a full burst it draws from `head` while that lasts. Returns
    /// the steps the next burst may take, from [`MIN_STEPS`] to `max` (or
    /// `max` if smaller), and whether the budget paid for fewer than that;
    /// with a floor, 0 (no burst) while the account cannot pay for it.
    pub fn steps(&mut self, program_ns: f64, engine_ns: u64, max: u32, head: &HeadStart) -> (u32, bool) {
        self.settle(program_ns, engine_ns, 2.0 * max as f64 * self.step_ns);
        if self.fraction == 0.0 {
            return (max, false);
        }
        let mut n = (self.credit_ns / self.step_ns).floor().max(0.0);
        if n < max as f64 && self.floor.is_some() {
            // Enough for a full burst, debts included (and a ns more, so
            // rounding does not leave it a step short).
            let lent = head.draw((max as f64 * self.step_ns - self.credit_ns).ceil() + 1.0);
            self.loan_ns += lent;
            self.credit_ns += lent;
            n = (self.credit_ns / self.step_ns).floor().max(0.0);
        }
        if let Some(floor) = self.floor {
            if n < floor.min(max) as f64 {
                return (0, false);
            }
        }
        let starved = n < MIN_STEPS as f64;
        ((n as u32).max(MIN_STEPS).min(max), starved)
    }

    /// A tick that begins no burst whatever the account holds (its time
    /// was the hypervisor's or the kernel's, not the program's
    /// instructions'): the program still ran `program_ns` since the
    /// previous tick, which earns the budget its share as at any tick, so
    /// the engine's share stays the budget of all the program's CPU time.
    /// `max`: the longest burst, which sets how much credit the account
    /// may save.
    ///
    /// Only with a floor (bursts of one length at ticks the account
    /// chooses), where more credit buys more bursts. Without one (a burst
    /// at every tick, as long as the account pays) it would buy longer
    /// bursts right after system calls and exits, and a burst's weight
    /// (its accesses times its time) is fair only between bursts of one
    /// length.
    pub fn earn(&mut self, program_ns: f64, engine_ns: u64, max: u32) {
        if self.floor.is_some() {
            self.settle(program_ns, engine_ns, 2.0 * max as f64 * self.step_ns);
        }
    }

    /// A tick that may begin a burst window from the code cache: how many
    /// `unit_ns` the account pays for, at most `max` (a window costs one
    /// unit, an exit and its share of the tick, plus one per pick: its exit,
    /// single step, unwinding and later trap). With a floor (the default
    /// period), a tick the account cannot pay two units for (a window with
    /// one pick) begins none, drawing on the head start first; without one
    /// (a period the user chose) every tick gets two, past the budget if it
    /// must (the second value says so). The account saves up at most `max`
    /// units. With no budget, `max`.
    pub fn window(&mut self, program_ns: f64, engine_ns: u64, unit_ns: f64, max: u32, head: &HeadStart) -> (u32, bool) {
        let unit = unit_ns.max(1.0);
        self.settle(program_ns, engine_ns, max as f64 * unit);
        if self.fraction == 0.0 {
            return (max, false);
        }
        let mut n = (self.credit_ns / unit).floor().max(0.0);
        if n < max as f64 && self.floor.is_some() {
            let lent = head.draw((max as f64 * unit - self.credit_ns).ceil() + 1.0);
            self.loan_ns += lent;
            self.credit_ns += lent;
            n = (self.credit_ns / unit).floor().max(0.0);
        }
        match n as u32 {
            n if n >= 2 => (n.min(max), false),
            _ if self.floor.is_some() => (0, false),
            _ => (2, true),
        }
    }

    /// [`Budget::earn`] for windows: `unit_ns` and `max` as in [`Budget::window`].
    pub fn earn_window(&mut self, program_ns: f64, engine_ns: u64, unit_ns: f64, max: u32) {
        if self.floor.is_some() {
            self.settle(program_ns, engine_ns, max as f64 * unit_ns.max(1.0));
        }
    }

    /// Credit the budget's share of `program_ns`, debit what the engine
    /// spent since the last settling (`engine_ns` in all so far); the
    /// account saves up at most `cap` ns.
    fn settle(&mut self, program_ns: f64, engine_ns: u64, cap: f64) {
        let spent = engine_ns.saturating_sub(self.spent_mark_ns) as f64;
        self.spent_mark_ns = engine_ns;
        if self.fraction == 0.0 {
            return;
        }
        let earned = self.fraction * program_ns.max(0.0);
        let repaid = self.loan_ns.min(earned / 2.0);
        self.loan_ns -= repaid;
        self.credit_ns = (self.credit_ns + earned - repaid - spent).clamp(-2.0 * cap, cap);
    }

    /// A step cost `cost_ns` (its round trip and handler).
    pub fn note_step(&mut self, cost_ns: u64) {
        // Clamped, so one preempted step moves the estimate little.
        let c = (cost_ns as f64).clamp(0.5 * self.step_ns, 2.0 * self.step_ns);
        self.step_ns += (c - self.step_ns) / 16.0;
    }

    /// The current estimate of one step's cost.
    pub fn step_ns(&self) -> f64 {
        self.step_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STEP: u64 = 12_000;
    static NO_HEAD: HeadStart = HeadStart(AtomicI64::new(0));
    const PERIOD: f64 = 5_000_000.0;

    #[test]
    fn a_budget_pays_for_its_share_of_program_time() {
        // 3% of 5 ms is 150 µs: 12 steps of 12 µs.
        let mut b = Budget::new(0.03, STEP, None);
        assert_eq!(b.steps(PERIOD, 0, 64, &NO_HEAD), (12, false));
        // The engine spent about that: the next tick pays for as much.
        let (n, starved) = b.steps(PERIOD, 144_000, 64, &NO_HEAD);
        assert!((12..=13).contains(&n) && !starved, "{n}");
    }

    #[test]
    fn spending_over_the_budget_shrinks_bursts_to_the_minimum_until_repaid() {
        let mut b = Budget::new(0.03, STEP, None);
        assert_eq!(b.steps(PERIOD, 0, 64, &NO_HEAD), (12, false));
        // Traps cost 600 µs: four periods' worth of budget.
        let mut spent = 600_000;
        let mut starved = 0;
        loop {
            let (n, s) = b.steps(PERIOD, spent, 64, &NO_HEAD);
            if !s {
                break;
            }
            assert_eq!(n, MIN_STEPS);
            starved += 1;
            spent += n as u64 * STEP;
        }
        assert!((3..=6).contains(&starved), "{starved}");
    }

    #[test]
    fn over_a_long_run_the_engine_spends_the_budget() {
        // Each burst costs its steps plus 40 µs of traps.
        let mut b = Budget::new(0.03, STEP, None);
        let (mut engine, mut program) = (0u64, 0.0);
        for _ in 0..10_000 {
            let (n, _) = b.steps(PERIOD, engine, 64, &NO_HEAD);
            program += PERIOD;
            engine += n as u64 * STEP + 40_000;
        }
        let share = engine as f64 / program;
        assert!((0.027..=0.031).contains(&share), "{share}");
    }

    #[test]
    fn a_period_too_short_for_the_budget_keeps_the_minimum() {
        // 3% of 100 µs is 3 µs: not even one step.
        let mut b = Budget::new(0.03, STEP, None);
        let mut engine = 0;
        for _ in 0..100 {
            let (n, starved) = b.steps(100_000.0, engine, 64, &NO_HEAD);
            assert_eq!((n, starved), (MIN_STEPS, true));
            engine += n as u64 * STEP;
        }
    }

    #[test]
    fn idle_time_saves_up_two_bursts_at_most() {
        let mut b = Budget::new(0.03, STEP, None);
        let mut engine = 0;
        let mut total = 0;
        for program in [1e12, 0.0, 0.0, 0.0, 0.0, 0.0] {
            let (n, _) = b.steps(program, engine, 16, &NO_HEAD);
            engine += n as u64 * STEP;
            total += n;
        }
        // Two full bursts, then the minimum, on debt.
        assert_eq!(total, 32 + 4 * MIN_STEPS);
    }

    #[test]
    fn no_limit_and_the_minimum() {
        let mut b = Budget::new(0.0, STEP, None);
        assert_eq!(b.steps(0.0, 1 << 40, 32, &NO_HEAD), (32, false));
        // 1% of 5 ms pays for 4 steps of 12 µs; less is starved.
        let mut b = Budget::new(0.01, STEP, None);
        assert_eq!(b.steps(PERIOD, 0, 64, &NO_HEAD), (4, false));
        let mut b = Budget::new(0.009, STEP, None);
        assert_eq!(b.steps(PERIOD, 0, 64, &NO_HEAD), (4, true));
        // A maximum under the minimum is kept.
        let mut b = Budget::new(0.03, STEP, None);
        assert_eq!(b.steps(PERIOD, 0, 2, &NO_HEAD), (2, false));
    }

    #[test]
    fn with_a_floor_ticks_save_up_for_a_long_burst() {
        // 3% of 5 ms pays 12.5 steps a tick: a 32-step burst every third
        // tick or so, and the engine still spends the budget.
        let mut b = Budget::new(0.03, STEP, Some(32));
        let (mut engine, mut program, mut bursts, mut skipped) = (0u64, 0.0, 0, 0);
        for _ in 0..3_000 {
            let (n, starved) = b.steps(PERIOD, engine, 64, &NO_HEAD);
            assert!(!starved);
            program += PERIOD;
            if n == 0 {
                skipped += 1;
                continue;
            }
            assert!((32..=64).contains(&n), "{n}");
            bursts += 1;
            engine += n as u64 * STEP;
        }
        let share = engine as f64 / program;
        assert!((0.027..=0.031).contains(&share), "{share}");
        assert!(skipped > bursts, "{skipped} skipped, {bursts} bursts");
        // Dense traps put the account in debt: no burst until repaid.
        let mut b = Budget::new(0.03, STEP, Some(32));
        assert_eq!(b.steps(PERIOD, 2_000_000, 64, &NO_HEAD), (0, false));
    }

    #[test]
    fn ticks_that_begin_no_burst_still_earn_the_budget() {
        // A third of the ticks land after a `cpuid` exit and begin no
        // burst; their program time still counts, so the engine's share of
        // all of it is the budget, not two thirds of it.
        let mut b = Budget::new(0.03, STEP, Some(24));
        let (mut engine, mut program) = (0u64, 0.0);
        for i in 0..3_000 {
            program += PERIOD;
            if i % 3 == 0 {
                b.earn(PERIOD, engine, 24);
                continue;
            }
            let (n, _) = b.steps(PERIOD, engine, 24, &NO_HEAD);
            engine += n as u64 * STEP;
        }
        let share = engine as f64 / program;
        assert!((0.027..=0.031).contains(&share), "{share}");
        // Without a floor (a burst at every tick) it earns nothing: the
        // next tick's burst is as long as without the earlier tick.
        let mut b = Budget::new(0.03, STEP, None);
        let mut c = b.clone();
        b.earn(PERIOD, 0, 24);
        assert_eq!(b.steps(PERIOD, 0, 24, &NO_HEAD), c.steps(PERIOD, 0, 24, &NO_HEAD));
    }

    #[test]
    fn a_head_start_pays_for_full_bursts_until_it_is_gone() {
        // The budget pays 12.5 steps a tick; 5 ms pays the other 51.5 of
        // a 64-step burst (618 µs at 12 µs a step), less what the account
        // repays meanwhile: the first 7 or so ticks each begin a burst.
        let head = HeadStart::new(HEAD_START_NS);
        let mut b = Budget::new(0.03, STEP, Some(64));
        let mut engine = 0u64;
        let mut first = Vec::new();
        for _ in 0..40 {
            let (n, _) = b.steps(PERIOD, engine, 64, &head);
            assert!(n == 0 || n == 64, "{n}");
            first.push(n);
            engine += n as u64 * STEP;
        }
        let leading = first.iter().take_while(|&&n| n == 64).count();
        assert!((6..=9).contains(&leading), "{first:?}");
        assert!(engine <= (0.03 * 40.0 * PERIOD) as u64 + HEAD_START_NS as u64 + 64 * STEP, "{engine}");
        // Then it is repaid with half of what the account earns, so bursts
        // come rarer than the budget alone would pay for, until the
        // engine's share over the run is the budget.
        let mut program = 40.0 * PERIOD;
        for _ in 0..3_000 {
            let (n, _) = b.steps(PERIOD, engine, 64, &head);
            program += PERIOD;
            engine += n as u64 * STEP;
        }
        let share = engine as f64 / program;
        assert!((0.028..=0.0305).contains(&share), "{share}");
        // Without a floor (a burst at every tick, `-p`) there is no head
        // start: it would lengthen the first bursts only, and a burst's
        // weight is fair only between bursts of one length.
        let head = HeadStart::new(HEAD_START_NS);
        let mut b = Budget::new(0.03, STEP, None);
        let mut engine = 0u64;
        for _ in 0..10 {
            let (n, _) = b.steps(PERIOD, engine, 64, &head);
            assert!((12..=13).contains(&n), "{n}");
            engine += n as u64 * STEP;
        }
        assert_eq!(head.draw(HEAD_START_NS as f64), HEAD_START_NS as f64);
        // Threads share it.
        let head = HeadStart::new(1_000_000);
        assert_eq!(head.draw(600_000.0), 600_000.0);
        assert_eq!(head.draw(600_000.0), 400_000.0);
        assert_eq!(head.draw(600_000.0), 0.0);
    }

    #[test]
    fn the_step_cost_is_learned() {
        let mut b = Budget::new(0.03, STEP, None);
        for _ in 0..200 {
            b.note_step(20_000);
        }
        assert!((b.step_ns() - 20_000.0).abs() < 500.0, "{}", b.step_ns());
        assert_eq!(b.steps(PERIOD, 0, 64, &NO_HEAD), (7, false));
    }
}
