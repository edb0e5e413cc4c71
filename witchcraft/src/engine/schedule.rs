//! When a window picks: every counted access with a probability fixed
//! before it runs, drawn as geometric countdowns (see [`super::window`]).
//!
//! A window plans its picks from its thread's recent accesses per
//! instruction, so that it expects m of them. Where its accesses come far
//! faster than that (a window that begins in a `memset` after a slow loop),
//! it would take many more picks than it can pay for. So after 2m + 2
//! picks the rest of the window picks at a quarter of the probability, and
//! after m + 1 more at a quarter of that, and so on: the cost stays
//! bounded, and each access is still picked with a probability that was
//! fixed before it ran, the one its pick's weight divides by
//! ([`Schedule::weight`]). The estimate stays unbiased (a sequential
//! design: Horvitz and Thompson's estimator with inclusion probabilities
//! that depend only on what came before). A window that stopped picking
//! there instead gave its later accesses no chance at all, and the
//! estimate lost them.
//!
//! Whole-run counting picks every access with probability 1/N and never
//! thins.

/// A window's pick probability and how many picks it may take at it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Schedule {
    p: f64,
    left: u64,
    planned: u64,
}

impl Schedule {
    /// A window at a tick, planned for `picks` picks among the
    /// `expected` counted accesses its instructions should make.
    pub fn planned(picks: u32, expected: f64) -> Schedule {
        let planned = picks.max(1) as u64;
        let p = (planned as f64 / expected.max(1e-9)).clamp(1e-9, 1.0);
        Schedule { p, left: 2 * planned + 2, planned }
    }

    /// Whole-run counting: every access with probability 1/`n`.
    pub fn every(n: u64) -> Schedule {
        Schedule { p: 1.0 / n.max(1) as f64, left: u64::MAX, planned: 0 }
    }

    /// What a pick stands for: 1/p accesses.
    pub fn weight(&self) -> f64 {
        1.0 / self.p
    }

    /// A pick was taken: true if the rest of the window now picks at a
    /// quarter of the probability.
    pub fn picked(&mut self) -> bool {
        self.left = self.left.saturating_sub(1);
        if self.left > 0 {
            return false;
        }
        self.p /= 4.0;
        self.left = self.planned + 1;
        true
    }

    /// The countdown to the next pick, from `u` in (0, 1]: 1 +
    /// ⌊ln u / ln(1 − p)⌋, geometric, so every access until then is picked
    /// with probability p, independently.
    pub fn countdown(&self, u: f64) -> i64 {
        if self.p >= 1.0 {
            return 1;
        }
        let d = 1.0 + (u.ln() / (1.0 - self.p).ln()).floor();
        d.clamp(1.0, i64::MAX as f64 / 2.0) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::SmallRng, RngExt, SeedableRng};

    /// Run a window of `n` accesses, valued 1 from `from` on (0 before),
    /// through a schedule; the weighted sum of the picks' values and the
    /// number of picks.
    fn window(mut s: Schedule, n: i64, from: i64, rng: &mut SmallRng) -> (f64, u64) {
        let (mut at, mut sum, mut picks) = (0i64, 0.0, 0);
        loop {
            at += s.countdown(1.0 - rng.random::<f64>());
            if at > n {
                return (sum, picks);
            }
            if at > from {
                sum += s.weight();
            }
            picks += 1;
            s.picked();
        }
    }

    /// A window whose accesses came twenty times faster than planned (4
    /// picks planned among 1,000 expected accesses; 20,000 came): the
    /// weighted picks still estimate the accesses of its second half, and
    /// the picks stay few. Stopping after the planned picks' cap, as
    /// windows once did, estimated none of them: the cap came in the
    /// first half.
    #[test]
    fn a_window_faster_than_planned_still_estimates_its_accesses() {
        let mut rng = SmallRng::seed_from_u64(7);
        let (n, from, runs) = (20_000, 10_000, 20_000);
        let (mut sum, mut picks) = (0.0, 0);
        for _ in 0..runs {
            let (s, k) = window(Schedule::planned(4, 1_000.0), n, from, &mut rng);
            sum += s;
            picks += k;
        }
        let mean = sum / runs as f64;
        let truth = (n - from) as f64;
        assert!((mean - truth).abs() < 0.03 * truth, "estimated {mean:.0} accesses of {truth:.0}");
        let per = picks as f64 / runs as f64;
        assert!(per < 25.0, "{per:.1} picks a window");
    }

    /// As planned, a window takes about its planned picks, and the
    /// estimate holds.
    #[test]
    fn a_window_as_planned_takes_its_picks() {
        let mut rng = SmallRng::seed_from_u64(8);
        let (n, runs) = (1_000, 20_000);
        let (mut sum, mut picks) = (0.0, 0);
        for _ in 0..runs {
            let (s, k) = window(Schedule::planned(4, 1_000.0), n, 0, &mut rng);
            sum += s;
            picks += k;
        }
        let mean = sum / runs as f64;
        assert!((mean - n as f64).abs() < 0.02 * n as f64, "estimated {mean:.0} of {n}");
        let per = picks as f64 / runs as f64;
        assert!((3.8..4.2).contains(&per), "{per:.2} picks a window");
    }

    #[test]
    fn whole_run_counting_never_thins() {
        let mut s = Schedule::every(1000);
        for _ in 0..100_000 {
            assert!(!s.picked());
        }
        assert_eq!(s.weight(), 1000.0);
    }
}
