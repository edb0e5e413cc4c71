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
}

impl Clock {
    pub fn new(trap_cost_ns: u64) -> Clock {
        Clock { resumed: Regs::default(), program_ns: 0.0, exit_ns: 0, interval_ns: 0, trap_gap_ns: trap_cost_ns as f64, stepped_ns: 0 }
    }

    /// Forget the timeline (a fork child starts afresh).
    pub fn reset(&mut self) {
        self.program_ns = 0.0;
        self.exit_ns = 0;
        self.interval_ns = 0;
        self.stepped_ns = 0;
    }

    /// A handler begins at `entry_ns`.
    pub fn enter(&mut self, entry_ns: u64) {
        let since = if self.exit_ns == 0 { 0 } else { entry_ns.saturating_sub(self.exit_ns) };
        self.interval_ns = since.saturating_sub(std::mem::take(&mut self.stepped_ns));
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
    /// cost. The start-up calibration alone is not enough: it varies 17-27
    /// µs between runs in this VM, more in a busy one, and dense trapping
    /// code's weight follows it. Steps are clamped, so a preempted gap moves
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

    /// A single step that cost `cost_ns` (its round trip and handler): the
    /// program ran one instruction, so all of it is the engine's time, and
    /// the next handler that reads the clock leaves it out of the program's.
    pub fn step(&mut self, cost_ns: u64) {
        self.stepped_ns += cost_ns;
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
        let mut c = Clock::new(15_000);
        assert_eq!(sample(&mut c, 1_000_000, 1_010_000), (1.0, SIGNAL + 10_000));
        // 2 ms later, of which the signal's way in is the engine's.
        let (w, _) = sample(&mut c, 3_010_000, 3_020_000);
        assert!((w - (2_000_000 - SIGNAL) as f64 / PERIOD as f64).abs() < 1e-9, "{w}");
    }

    #[test]
    fn trap_time_between_samples_counts_less_the_trap_cost() {
        let mut c = Clock::new(15_000);
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
        let mut c = Clock::new(20_000);
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
        let mut c = Clock::new(15_000);
        sample(&mut c, 1_000_000, 1_010_000);
        // 100 single steps of 11 µs each.
        let mut t = 1_010_000;
        for _ in 0..100 {
            c.step(11_000);
            t += 11_000;
        }
        // Then one period of program time.
        let (w, _) = sample(&mut c, t + 1_000_000 + SIGNAL, t + 1_000_000 + SIGNAL + 10_000);
        assert!((w - 1.0).abs() < 1e-9, "{w}");
    }

    #[test]
    fn overdue_means_resumed_exactly_where_we_left() {
        let mut c = Clock::new(15_000);
        let mut r = Regs { rip: 0x401000, ..Default::default() };
        c.resume_at(&r);
        assert!(c.is_overdue(&r));
        r.gpr[0] = 1;
        assert!(!c.is_overdue(&r));
    }
}
