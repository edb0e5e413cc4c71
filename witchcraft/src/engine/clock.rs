//! Whose time is it: the program's own CPU time between our handlers, and
//! what our handlers cost.
//!
//! A thread's CPU time runs while the program runs, while our handlers run,
//! and while the kernel delivers our traps and signals. Software samples
//! must be weighted by the program's time alone (otherwise code where traps
//! are dense, and so the engine's time, is over-sampled: Listing 4.3's four
//! pairs came out 36/36/14/14% instead of 25% each), and the engine's own
//! cost is reported. Both come from one timeline per thread:
//!
//! ```text
//!   ...program... | handler | ...program... | handler | ...
//!                 ^entry    ^exit           ^entry
//! ```
//!
//! The CPU time from one handler's exit to the next one's entry is the
//! program's, less the kernel's cost of that return and entry: the
//! calibrated signal round trip before a sample, and before a trap a round
//! trip each thread re-measures on its self-traps (the sample handler
//! returns to the one instruction that then traps, so the time between is
//! exactly a return and a trap's way in).
//!
//! Single steps don't read the clock (a thread CPU clock read is a system
//! call, a large part of a step): each is accounted at a learned round trip
//! plus its handler's cycles. The round trip is learned from whole bursts:
//! the handler that ends a burst reads the clock once, and the CPU time
//! since the handler before its first step, less the step handlers' own,
//! is what its steps' round trips cost. The burst's account is corrected
//! to that, so a start-up calibration taken in a slow moment (one can read
//! twice a step's cost) skews neither the program's time nor the budget
//! for long.

use crate::x86::decode::Regs;

/// One thread's timeline. All times are thread CPU time in ns.
#[derive(Clone, Debug)]
pub struct Clock {
    /// The program context the last handler returned to.
    resumed: Regs,
    /// Program time since the last software sample that counted.
    program_ns: f64,
    /// When our last handler returned (0: none yet).
    exit_ns: u64,
    /// From that return to this handler's entry.
    interval_ns: u64,
    /// What one return-and-trap costs outside our handlers, learned from
    /// this thread's self-traps; starts at the start-up calibration.
    trap_gap_ns: f64,
    /// CPU time of single steps since our last handler that read the clock:
    /// the engine's, not the program's (steps don't read the clock: a
    /// thread CPU clock read is a system call, a large part of a step).
    stepped_ns: u64,
    /// What one single step's round trip costs outside our handlers,
    /// learned from whole bursts; starts at the start-up calibration.
    step_gap_ns: f64,
    /// The steps of the burst under way.
    window: StepWindow,
    /// The last handler returned into the code cache: the time until the
    /// next handler is the engine's (a window's copies), not the program's.
    in_cache: bool,
}

/// The steps of one burst, timed as a whole.
#[derive(Clone, Copy, Debug, Default)]
struct StepWindow {
    /// When the handler before the first step returned (CPU time).
    start_ns: u64,
    steps: u64,
    /// The step handlers' own time.
    handlers_ns: u64,
    /// What the steps were accounted at.
    accounted_ns: u64,
    /// Opened by the burst's first step and still whole: no other handler
    /// ran in between (a tick whose period ran out inside the burst), so
    /// the window's time is the steps' alone. A step outside any burst's
    /// window (none open) times nothing.
    timed: bool,
}

/// How far one burst may move the learned step round trip: its measured
/// round trip is clamped to half to twice the estimate (a burst the
/// program's own signal handler interrupted, or a page fault in stepped
/// code, counts as a slow burst, not as ten).
const STEP_CLAMP: (f64, f64) = (0.5, 2.0);

impl Clock {
    /// `trap_cost_ns` and `step_cost_ns`: the start-up calibration's round
    /// trips of a watchpoint trap and of a single step.
    pub fn new(trap_cost_ns: u64, step_cost_ns: u64) -> Clock {
        Clock {
            resumed: Regs::default(),
            program_ns: 0.0,
            exit_ns: 0,
            interval_ns: 0,
            trap_gap_ns: trap_cost_ns as f64,
            stepped_ns: 0,
            step_gap_ns: step_cost_ns as f64,
            window: StepWindow::default(),
            in_cache: false,
        }
    }

    /// Forget the timeline (a fork child starts afresh).
    pub fn reset(&mut self) {
        self.program_ns = 0.0;
        self.exit_ns = 0;
        self.interval_ns = 0;
        self.stepped_ns = 0;
        self.window = StepWindow::default();
        self.in_cache = false;
    }

    /// Before a handler that reads the clock (at `entry_ns`) begins:
    /// returns the correction (ns, never positive) to what the single steps
    /// since the last such handler were accounted at: together they cannot
    /// have cost more than the thread's CPU time in between (a step's
    /// handler is timed by the cycle counter, which also runs while the
    /// thread waits for a CPU).
    pub fn settle_steps(&mut self, entry_ns: u64) -> i64 {
        let since = if self.exit_ns == 0 { 0 } else { entry_ns.saturating_sub(self.exit_ns) };
        if self.exit_ns == 0 || self.stepped_ns <= since {
            return 0;
        }
        let fix = since as i64 - self.stepped_ns as i64;
        self.stepped_ns = since;
        fix
    }

    /// A handler begins at `entry_ns`. Returns the time the thread spent
    /// in the code cache since the last handler (a window's copies run in
    /// the engine's time, though they do the program's work: a window's
    /// few thousand instructions take microseconds natively, and the
    /// weight of the next window counts only time outside windows).
    pub fn enter(&mut self, entry_ns: u64) -> u64 {
        let since = if self.exit_ns == 0 { 0 } else { entry_ns.saturating_sub(self.exit_ns) };
        self.interval_ns = since.saturating_sub(std::mem::take(&mut self.stepped_ns));
        self.window.timed = false;
        if self.in_cache {
            return std::mem::take(&mut self.interval_ns);
        }
        0
    }

    /// The CPU time from the last handler's return to `now_ns`, single
    /// steps left out (0 before the first handler).
    pub fn since_exit(&self, now_ns: u64) -> u64 {
        if self.exit_ns == 0 {
            return 0;
        }
        now_ns.saturating_sub(self.exit_ns).saturating_sub(self.stepped_ns)
    }

    /// Whether the handler returns into the code cache.
    pub fn set_in_cache(&mut self, on: bool) {
        self.in_cache = on;
    }

    /// A software sample found the program exactly where the last handler
    /// left it: its period ran out inside our own signal handling (signals
    /// are blocked in each other's handlers, and SIGTRAP, the lower number,
    /// is delivered first). Such a sample is dropped, or the code right
    /// after a trap would collect the engine's time.
    pub fn is_overdue(&self, regs: &Regs) -> bool {
        regs.rip == self.resumed.rip && regs.gpr == self.resumed.gpr
    }

    /// The handler will return to `regs`.
    pub fn resume_at(&mut self, regs: &Regs) {
        self.resumed = *regs;
    }

    /// A software sample: close the program-time interval and return this
    /// sample's weight, the program's own time since the previous sample in
    /// periods (1 for the first).
    pub fn sample_weight(&mut self, signal_cost_ns: u64, period_ns: u64) -> f64 {
        self.program_ns += self.interval_ns.saturating_sub(signal_cost_ns) as f64;
        let w = if self.exit_ns != 0 && period_ns > 0 { self.program_ns / period_ns as f64 } else { 1.0 };
        self.program_ns = 0.0;
        w
    }

    /// A watchpoint trap. The time before it is the program's, unless the
    /// trap is the sampled instruction's own access (`self_trap`): then it
    /// is exactly one return plus one trap's way in, which teaches the trap
    /// cost. The start-up calibration alone is not enough: it varies from
    /// run to run, more on a busy machine, and dense trapping code's weight
    /// follows it. Steps are clamped, so a preempted gap moves
    /// it little.
    pub fn trap(&mut self, self_trap: bool) {
        if !self_trap {
            self.program_ns += (self.interval_ns as f64 - self.trap_gap_ns).max(0.0);
        } else if self.exit_ns != 0 {
            let est = self.trap_gap_ns.max(1000.0);
            let gap = (self.interval_ns as f64).clamp(0.5 * est, 2.0 * est);
            self.trap_gap_ns += (gap - self.trap_gap_ns) / 8.0;
        }
    }

    /// The handler ends at `exit_ns`; returns what it cost the thread: the
    /// time in the handler plus the round trip outside it.
    pub fn leave(&mut self, trap: bool, signal_cost_ns: u64, entry_ns: u64, exit_ns: u64) -> u64 {
        let handler = exit_ns.saturating_sub(entry_ns);
        let round_trip = if trap { self.trap_gap_ns as u64 } else { signal_cost_ns };
        self.exit_ns = exit_ns;
        round_trip + handler
    }

    /// A single step whose handler took `handler_ns` (`first`: the first
    /// of its burst). The program ran one instruction, so all of the step
    /// is the engine's time, and the next handler that reads the clock
    /// leaves it out of the program's. Returns what the step is accounted
    /// at: the learned round trip plus the handler.
    pub fn step(&mut self, first: bool, handler_ns: u64) -> u64 {
        if first {
            self.window = StepWindow { start_ns: self.exit_ns, timed: self.exit_ns != 0, ..Default::default() };
        }
        let cost = self.step_gap_ns as u64 + handler_ns;
        let w = &mut self.window;
        w.steps += 1;
        w.handlers_ns += handler_ns;
        w.accounted_ns += cost;
        self.stepped_ns += cost;
        cost
    }

    /// The burst's last step ended at `now_ns` (its handler read the clock
    /// after the step's work): learn the step round trip from the whole
    /// burst, and correct what its steps were accounted at. Returns the
    /// correction (ns, negative when they cost less), which the engine's
    /// time takes too; 0 if the burst could not be timed.
    ///
    /// The steps' handlers are timed by the cycle counter, which runs on
    /// while the thread waits for a CPU: a thread preempted inside one (64
    /// busy threads on 2 CPUs wait tens of ms) had that handler counted at
    /// the wait. The thread's CPU clock bounds it: the burst cost at most
    /// the CPU time it took, and a burst whose handlers seem longer than
    /// that teaches nothing about the round trip.
    pub fn burst_ended(&mut self, now_ns: u64) -> i64 {
        let w = std::mem::take(&mut self.window);
        if !w.timed || w.steps == 0 || now_ns <= w.start_ns {
            return 0;
        }
        let cpu = now_ns - w.start_ns;
        let cost = if w.handlers_ns < cpu {
            let outside = (cpu - w.handlers_ns) as f64 / w.steps as f64;
            let est = self.step_gap_ns.max(1000.0);
            let gap = outside.clamp(STEP_CLAMP.0 * est, STEP_CLAMP.1 * est);
            self.step_gap_ns += (gap - self.step_gap_ns) / 4.0;
            ((gap * w.steps as f64) as u64 + w.handlers_ns).min(cpu)
        } else {
            cpu
        };
        let correction = cost as i64 - w.accounted_ns as i64;
        self.stepped_ns = self.stepped_ns.saturating_add_signed(correction);
        correction
    }

    /// The current estimate of a single step's round trip outside our handlers.
    pub fn step_gap_ns(&self) -> f64 {
        self.step_gap_ns
    }

    /// The current estimate of a trap's round trip outside our handlers.
    pub fn trap_gap_ns(&self) -> f64 {
        self.trap_gap_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIGNAL: u64 = 5_000;
    const PERIOD: u64 = 1_000_000;

    /// A sample handler from `entry` to `exit`; returns its weight and cost.
    fn sample(c: &mut Clock, entry: u64, exit: u64) -> (f64, u64) {
        c.enter(entry);
        let w = c.sample_weight(SIGNAL, PERIOD);
        (w, c.leave(false, SIGNAL, entry, exit))
    }

    #[test]
    fn first_sample_weighs_one_then_program_time_in_periods() {
        let mut c = Clock::new(15_000, 12_000);
        assert_eq!(sample(&mut c, 1_000_000, 1_010_000), (1.0, SIGNAL + 10_000));
        // 2 ms later, of which the signal's way in is the engine's.
        let (w, _) = sample(&mut c, 3_010_000, 3_020_000);
        assert!((w - (2_000_000 - SIGNAL) as f64 / PERIOD as f64).abs() < 1e-9, "{w}");
    }

    #[test]
    fn trap_time_between_samples_counts_less_the_trap_cost() {
        let mut c = Clock::new(15_000, 12_000);
        sample(&mut c, 1_000_000, 1_010_000);
        // The program runs 100 µs, then a trap (handler 5 µs).
        c.enter(1_010_000 + 100_000 + 15_000);
        c.trap(false);
        c.leave(true, SIGNAL, 1_125_000, 1_130_000);
        // Then 900 µs more before the next sample.
        let (w, _) = sample(&mut c, 1_130_000 + 900_000 + SIGNAL, 2_100_000);
        assert!((w - 1.0).abs() < 1e-9, "program time 100 + 900 µs = one period, got {w}");
    }

    #[test]
    fn self_traps_teach_the_trap_cost_in_clamped_steps() {
        let mut c = Clock::new(20_000, 12_000);
        sample(&mut c, 1_000_000, 1_010_000);
        for i in 0..200u64 {
            let entry = 1_010_000 + i * 100_000;
            c.enter(entry + 12_000); // a self-trap 12 µs after the return
            c.trap(true);
            c.leave(true, SIGNAL, entry + 12_000, entry + 100_000);
        }
        assert!((c.trap_gap_ns() - 12_000.0).abs() < 100.0, "{}", c.trap_gap_ns());
        // One preempted gap (10 ms) moves it by at most (2x - x)/8.
        let before = c.trap_gap_ns();
        c.enter(c.exit_ns + 10_000_000);
        c.trap(true);
        assert!(c.trap_gap_ns() <= before * 1.125 + 1.0);
    }

    #[test]
    fn steps_are_the_engines_time_not_the_programs() {
        let mut c = Clock::new(15_000, 9_000);
        sample(&mut c, 1_000_000, 1_010_000);
        // 100 single steps of 11 µs each: a 9 µs round trip, a 2 µs handler.
        let mut t = 1_010_000;
        for i in 0..100 {
            assert_eq!(c.step(i == 0, 2_000), 11_000);
            t += 11_000;
        }
        // Then one period of program time.
        let (w, _) = sample(&mut c, t + 1_000_000 + SIGNAL, t + 1_000_000 + SIGNAL + 10_000);
        assert!((w - 1.0).abs() < 1e-9, "{w}");
    }

    /// A burst of `steps` steps, each a `gap` round trip and a 2 µs
    /// handler, after a tick at `at`; the last handler reads the clock.
    /// Returns the correction and when the burst ended.
    fn burst(c: &mut Clock, at: u64, steps: u64, gap: u64) -> (i64, u64) {
        let (_, _) = sample(c, at, at + 10_000);
        let mut t = at + 10_000;
        for i in 0..steps {
            c.step(i == 0, 2_000);
            t += gap + 2_000;
        }
        (c.burst_ended(t), t)
    }

    /// The calibration said 30 µs a step, twice what the steps cost: the
    /// first burst's account is corrected by as much as the clamp allows,
    /// the program's time after it is right, and within a few bursts the
    /// steps are accounted at what they cost.
    #[test]
    fn bursts_teach_the_step_cost_and_correct_their_account() {
        let mut c = Clock::new(15_000, 30_000);
        let (fix, end) = burst(&mut c, 1_000_000, 24, 15_000);
        // 24 steps of 15 µs accounted at 30 µs: 360 µs too much.
        assert_eq!(fix, -360_000);
        // One period of program time after the burst weighs one period.
        let (w, _) = sample(&mut c, end + 1_000_000 + SIGNAL, end + 1_000_000 + SIGNAL + 10_000);
        assert!((w - 1.0).abs() < 1e-6, "{w}");
        let mut at = end + 2_000_000;
        for _ in 0..16 {
            let (_, end) = burst(&mut c, at, 24, 15_000);
            at = end + 5_000_000;
        }
        assert!((c.step_gap_ns() - 15_000.0).abs() < 200.0, "{}", c.step_gap_ns());
        // The clamp: a burst the program's own handler made 20 times as
        // long moves the estimate to at most twice what it was, weighted.
        let before = c.step_gap_ns();
        let (fix, _) = burst(&mut c, at, 24, 300_000);
        assert!(c.step_gap_ns() <= before * 1.25 + 1.0, "{}", c.step_gap_ns());
        assert!(fix as f64 <= 24.0 * before + 30.0, "{fix}");
    }

    /// A tick whose period ran out inside the burst read the clock in
    /// between: the burst's time is not its steps' alone, so it teaches
    /// nothing and corrects nothing.
    #[test]
    fn a_burst_another_handler_broke_is_not_timed() {
        let mut c = Clock::new(15_000, 30_000);
        sample(&mut c, 1_000_000, 1_010_000);
        c.step(true, 2_000);
        sample(&mut c, 1_100_000, 1_110_000);
        c.step(false, 2_000);
        assert_eq!(c.burst_ended(1_200_000), 0);
        assert_eq!(c.step_gap_ns(), 30_000.0);
        // A step with no burst's first step before it times nothing.
        c.step(false, 2_000);
        assert_eq!(c.burst_ended(1_300_000), 0);
        assert_eq!(c.step_gap_ns(), 30_000.0);
        // The next burst opens a window of its own.
        let (fix, _) = burst(&mut c, 2_000_000, 10, 15_000);
        assert_eq!(fix, -150_000);
    }

    /// The cost line claimed 3.49 s of witch's CPU for a 64-thread run
    /// that used 0.68 s in all: a step's handler is timed by the cycle
    /// counter, which went on while the thread waited for a CPU. Whatever
    /// the handlers seem to take, steps cost no more than the thread's CPU
    /// time, whether their burst ends timed or a tick breaks into it.
    #[test]
    fn steps_preempted_in_their_handlers_cost_no_more_than_the_cpu_time() {
        let mut c = Clock::new(15_000, 12_000);
        sample(&mut c, 1_000_000, 1_010_000);
        // A whole burst: 24 steps of 15 µs of CPU, each handler seen as 30 ms.
        let mut accounted = 0i64;
        for i in 0..24 {
            accounted += c.step(i == 0, 30_000_000) as i64;
        }
        let end = 1_010_000 + 24 * 15_000;
        accounted += c.burst_ended(end);
        assert!(accounted <= 24 * 15_000, "a 360 µs burst accounted at {accounted} ns");
        assert_eq!(c.step_gap_ns(), 12_000.0, "a preempted burst teaches nothing");
        // A burst a tick broke into: the tick reads the clock, which bounds it.
        let mut c = Clock::new(15_000, 12_000);
        sample(&mut c, 1_000_000, 1_010_000);
        let mut accounted = 0i64;
        for i in 0..5 {
            accounted += c.step(i == 0, 30_000_000) as i64;
        }
        accounted += c.settle_steps(1_010_000 + 5 * 15_000);
        assert!(accounted <= 5 * 15_000, "75 µs of steps accounted at {accounted} ns");
    }

    #[test]
    fn overdue_means_resumed_exactly_where_we_left() {
        let mut c = Clock::new(15_000, 12_000);
        let mut r = Regs { rip: 0x401000, ..Default::default() };
        c.resume_at(&r);
        assert!(c.is_overdue(&r));
        r.gpr[0] = 1;
        assert!(!c.is_overdue(&r));
    }
}
