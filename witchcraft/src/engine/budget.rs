//! How long a burst may be: the overhead budget.
//!
//! A single step costs a signal round trip (about 12 µs in the VM this was
//! built on, a few µs on bare metal), so a burst's length decides the
//! engine's cost. The user names a budget, a share of the program's CPU
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

/// The fewest steps worth a burst.
pub const MIN_STEPS: u32 = 4;

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
}

impl Budget {
    /// `step_ns`: the calibrated cost of one step.
    pub fn new(fraction: f64, step_ns: u64) -> Budget {
        Budget { fraction: fraction.max(0.0), credit_ns: 0.0, spent_mark_ns: 0, step_ns: (step_ns as f64).max(100.0) }
    }

    /// A tick: the program ran `program_ns` since the previous one, and the
    /// engine has spent `engine_ns` in all so far. Returns
    /// the steps the next burst may take, from [`MIN_STEPS`] to `max` (or
    /// `max` if smaller), and whether the budget paid for fewer than that.
    pub fn steps(&mut self, program_ns: f64, engine_ns: u64, max: u32) -> (u32, bool) {
        let spent = engine_ns.saturating_sub(self.spent_mark_ns) as f64;
        self.spent_mark_ns = engine_ns;
        if self.fraction == 0.0 {
            return (max, false);
        }
        let cap = 2.0 * max as f64 * self.step_ns;
        self.credit_ns = (self.credit_ns + self.fraction * program_ns.max(0.0) - spent).clamp(-2.0 * cap, cap);
        let n = (self.credit_ns / self.step_ns).floor().max(0.0);
        let starved = n < MIN_STEPS as f64;
        ((n as u32).max(MIN_STEPS).min(max), starved)
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
    const PERIOD: f64 = 5_000_000.0;

    #[test]
    fn a_budget_pays_for_its_share_of_program_time() {
        // 3% of 5 ms is 150 µs: 12 steps of 12 µs.
        let mut b = Budget::new(0.03, STEP);
        assert_eq!(b.steps(PERIOD, 0, 64), (12, false));
        // The engine spent about that: the next tick pays for as much.
        let (n, starved) = b.steps(PERIOD, 144_000, 64);
        assert!((12..=13).contains(&n) && !starved, "{n}");
    }

    #[test]
    fn spending_over_the_budget_shrinks_bursts_to_the_minimum_until_repaid() {
        let mut b = Budget::new(0.03, STEP);
        assert_eq!(b.steps(PERIOD, 0, 64), (12, false));
        // Traps cost 600 µs: four periods' worth of budget.
        let mut spent = 600_000;
        let mut starved = 0;
        loop {
            let (n, s) = b.steps(PERIOD, spent, 64);
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
        let mut b = Budget::new(0.03, STEP);
        let (mut engine, mut program) = (0u64, 0.0);
        for _ in 0..10_000 {
            let (n, _) = b.steps(PERIOD, engine, 64);
            program += PERIOD;
            engine += n as u64 * STEP + 40_000;
        }
        let share = engine as f64 / program;
        assert!((0.027..=0.031).contains(&share), "{share}");
    }

    #[test]
    fn a_period_too_short_for_the_budget_keeps_the_minimum() {
        // 3% of 100 µs is 3 µs: not even one step.
        let mut b = Budget::new(0.03, STEP);
        let mut engine = 0;
        for _ in 0..100 {
            let (n, starved) = b.steps(100_000.0, engine, 64);
            assert_eq!((n, starved), (MIN_STEPS, true));
            engine += n as u64 * STEP;
        }
    }

    #[test]
    fn idle_time_saves_up_two_bursts_at_most() {
        let mut b = Budget::new(0.03, STEP);
        let mut engine = 0;
        let mut total = 0;
        for program in [1e12, 0.0, 0.0, 0.0, 0.0, 0.0] {
            let (n, _) = b.steps(program, engine, 16);
            engine += n as u64 * STEP;
            total += n;
        }
        // Two full bursts, then the minimum, on debt.
        assert_eq!(total, 32 + 4 * MIN_STEPS);
    }

    #[test]
    fn no_limit_and_the_minimum() {
        let mut b = Budget::new(0.0, STEP);
        assert_eq!(b.steps(0.0, 1 << 40, 32), (32, false));
        // 1% of 5 ms pays for 4 steps of 12 µs; less is starved.
        let mut b = Budget::new(0.01, STEP);
        assert_eq!(b.steps(PERIOD, 0, 64), (4, false));
        let mut b = Budget::new(0.009, STEP);
        assert_eq!(b.steps(PERIOD, 0, 64), (4, true));
        // A maximum under the minimum is kept.
        let mut b = Budget::new(0.03, STEP);
        assert_eq!(b.steps(PERIOD, 0, 2), (2, false));
    }

    #[test]
    fn the_step_cost_is_learned() {
        let mut b = Budget::new(0.03, STEP);
        for _ in 0..200 {
            b.note_step(20_000);
        }
        assert!((b.step_ns() - 20_000.0).abs() < 500.0, "{}", b.step_ns());
        assert_eq!(b.steps(PERIOD, 0, 64), (7, false));
    }
}
