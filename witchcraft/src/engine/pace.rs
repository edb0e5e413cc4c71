//! A window's time: how long its copies took to run, and the weight that
//! corrects its picks for it.
//!
//! A window begins at a tick, a time-uniform point of the program's CPU
//! time, and runs the next W instructions. So an access is in some window
//! with a probability proportional to T_a, the native time of the W
//! instructions before it: an access after slow instructions (a
//! memory-bound `memset`, a chain of divisions) is picked more often than
//! one after as many fast ones, and a pick's weight t_b / p (see
//! [`super::window`]) estimates Σ T_a · bytes_a, not Σ bytes_a. Dividing
//! each pick's weight by T_a makes it count accesses again
//! (Horvitz-Thompson: each access weighed by the inverse of its chance to
//! be seen).
//!
//! T_a is not measured natively (nothing counts instructions outside
//! windows), but the copies run the same instructions and access the same
//! memory, so their running time stands in for it: where a pick lands k
//! instructions into the window, the window's copies took τ_k to get there
//! (thread CPU time, less the kernel's round trips and the engine's own
//! calls within the window), and the W - k instructions before the window
//! are taken at the thread's recent pace ρ (ns an instruction over its
//! recent windows): T̂_a = τ_k + (W - k) · ρ. The pick's weight is
//! multiplied by W · ρ / T̂_a, which is 1 where the window runs at the
//! thread's usual pace, so the estimates keep their unit and scale
//! (byte·ns of program time, see DESIGN.md, "Time weights") and only
//! their relative weights change. The correction is clamped to
//! [1/8, 8]: one window's time is noisy (a cold copy, an interrupt), and
//! a pick must not take over a run.
//!
//! *Off by default* (`WITCH_WINDOW_TIME=1` turns it on). The copies' time
//! is a poor stand-in for the native time: a window's copies take about
//! as long whatever its length (code that is cold again after
//! milliseconds of native running), and the counting that copies add
//! costs the most where the native code runs fastest, so it evens out
//! the differences it should show. Measured, it moved the 80%-dead known
//! answer from about 89% to about 86%, and left the real programs'
//! biases where they were (ACCURACY.md, "Windows weighed by their time").
//!
//! Owned by [`super::window::Window`]; nothing here allocates.

/// How far one pick's weight may move.
const MOST: f64 = 8.0;

/// Windows shorter than this do not teach the pace (their time is mostly
/// the way in and out).
const SHORTEST_TAUGHT: u64 = 256;

/// One thread's record of its windows' running time.
#[derive(Clone, Copy, Debug, Default)]
pub struct Pace {
    /// The copies' running time of the window under way, in the stretches
    /// closed by a handler (ns, the kernel's round trip taken out).
    run_ns: f64,
    /// The engine's calls through the link stub (links and picks) up to the
    /// window's beginning, in ns: those within the window are taken out of
    /// its running time.
    engaged_at: u64,
    /// Recent ns an instruction of the windows' copies (0: no window yet).
    ns_per_instruction: f64,
}

impl Pace {
    /// A window begins; the engine's calls through the link stub so far
    /// took `engaged` ns.
    pub fn begin(&mut self, engaged: u64) {
        self.run_ns = 0.0;
        self.engaged_at = engaged;
    }

    /// A handler closed a stretch of `ns` of the window's running (the
    /// kernel's round trip already taken out).
    pub fn ran(&mut self, ns: f64) {
        self.run_ns += ns.max(0.0);
    }

    /// The window's running time so far: the closed stretches, the open one
    /// (`open` ns, 0 in a handler) less the engine's calls within it
    /// (`engaged` ns in all).
    fn so_far(&self, open: f64, engaged: u64) -> f64 {
        (self.run_ns + open.max(0.0) - engaged.saturating_sub(self.engaged_at) as f64).max(0.0)
    }

    /// What a pick `k` instructions into a window of `given` weighs, as a
    /// factor of its uncorrected weight (see the module's comment).
    pub fn factor(&self, k: u64, given: u64, open: f64, engaged: u64) -> f64 {
        let rho = self.ns_per_instruction;
        if rho <= 0.0 || given == 0 {
            return 1.0;
        }
        let t = self.so_far(open, engaged) + given.saturating_sub(k) as f64 * rho;
        if t <= 0.0 {
            return 1.0;
        }
        (given as f64 * rho / t).clamp(1.0 / MOST, MOST)
    }

    /// The window ended after `ran` instructions: its pace teaches the
    /// thread's.
    pub fn end(&mut self, ran: u64, engaged: u64) {
        if ran < SHORTEST_TAUGHT {
            return;
        }
        let per = self.so_far(0.0, engaged) / ran as f64;
        if per <= 0.0 {
            return;
        }
        self.ns_per_instruction =
            if self.ns_per_instruction == 0.0 { per } else { self.ns_per_instruction + (per - self.ns_per_instruction) / 8.0 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paced(per: f64) -> Pace {
        let mut p = Pace::default();
        p.begin(0);
        p.ran(per * 1000.0);
        p.end(1000, 0);
        p
    }

    #[test]
    fn no_pace_yet_leaves_the_weight_alone() {
        let p = Pace::default();
        assert_eq!(p.factor(500, 1000, 123.0, 0), 1.0);
    }

    #[test]
    fn a_window_at_the_usual_pace_weighs_one() {
        let mut p = paced(2.0);
        p.begin(0);
        p.ran(600.0);
        // 300 instructions in 600 ns: the usual 2 ns each.
        assert!((p.factor(300, 1000, 0.0, 0) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_slow_window_weighs_less_and_a_fast_one_more() {
        let mut p = paced(2.0);
        p.begin(0);
        // 500 instructions at 10 ns (a memory-bound clear): T = 5000 + 500·2.
        p.ran(5000.0);
        assert!((p.factor(500, 1000, 0.0, 0) - 2000.0 / 6000.0).abs() < 1e-9);
        p.begin(0);
        // 1000 instructions at 1 ns: T = 1000.
        assert!((p.factor(1000, 1000, 1000.0, 0) - 2.0).abs() < 1e-9);
    }

    #[test]
    fn the_engine_s_calls_are_not_the_window_s_time() {
        let mut p = paced(2.0);
        p.begin(7_000);
        // 600 ns of copies and 4,000 of translating at links.
        p.ran(4600.0);
        assert!((p.factor(300, 1000, 0.0, 11_000) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn one_odd_window_moves_a_pick_at_most_eightfold() {
        let mut p = paced(2.0);
        p.begin(0);
        assert_eq!(p.factor(1000, 1000, 1e9, 0), 1.0 / MOST);
        assert_eq!(p.factor(1000, 1000, 1.0, 0), MOST);
    }

    #[test]
    fn the_pace_follows_the_windows() {
        let mut p = paced(2.0);
        for _ in 0..64 {
            p.begin(0);
            p.ran(4000.0);
            p.end(1000, 0);
        }
        assert!((p.ns_per_instruction - 4.0).abs() < 0.01);
        // Short windows teach nothing.
        p.begin(0);
        p.ran(1e6);
        p.end(10, 0);
        assert!((p.ns_per_instruction - 4.0).abs() < 0.01);
    }
}
