//! Which debug register a new sample gets (Witch §4.4.1).
//!
//! Reservoir sampling keeps every sample since a register was last free
//! equally likely to be monitored: a free slot is always used; otherwise the
//! k-th sample since a slot was last free replaces a uniformly chosen slot
//! with probability N/k. A trap that frees a slot resets k. The naive
//! policies are kept as options to show why they fail (Listing 4.2).

/// The doc comments are the command line's help (the `clap` feature).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Policy {
    /// Reservoir sampling: every sample has an equal chance to be watched
    Reservoir,
    /// Replace the oldest armed watchpoint
    Oldest,
    /// Replace the newest armed watchpoint
    Newest,
    /// Only use free slots; drop samples while all are armed
    #[serde(alias = "empty")]
    #[cfg_attr(feature = "clap", value(alias = "empty"))]
    EmptyOnly,
}

impl Policy {
    pub fn parse(s: &str) -> Option<Policy> {
        match s {
            "reservoir" => Some(Policy::Reservoir),
            "oldest" => Some(Policy::Oldest),
            "newest" => Some(Policy::Newest),
            "empty-only" | "empty" => Some(Policy::EmptyOnly),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Policy::Reservoir => "reservoir",
            Policy::Oldest => "oldest",
            Policy::Newest => "newest",
            Policy::EmptyOnly => "empty-only",
        }
    }
}

/// What the policy needs to know about one slot.
#[derive(Clone, Copy, Debug, Default)]
pub struct SlotView {
    pub armed: bool,
    /// Sequence number of the sample that armed it.
    pub armed_seq: u64,
}

/// Per-thread replacement state: O(1), a count of samples since a slot was free.
#[derive(Clone, Debug)]
pub struct Reservoir {
    pub policy: Policy,
    /// k: samples seen since a slot was last free (including the current one).
    pub k: u64,
}

impl Reservoir {
    pub fn new(policy: Policy) -> Self {
        Reservoir { policy, k: 0 }
    }

    /// A trap freed a slot: the next sample is monitored with probability 1.
    pub fn slot_freed(&mut self) {
        self.k = 0;
    }

    /// Decide for a new sample. `uniform(n)` returns a uniform integer in 0..n.
    /// Returns the slot to (re)arm, or None to drop the sample.
    pub fn choose(&mut self, slots: &[SlotView], mut uniform: impl FnMut(u64) -> u64) -> Option<usize> {
        let n = slots.len();
        if n == 0 {
            return None;
        }
        self.k += 1;
        if let Some(i) = slots.iter().position(|s| !s.armed) {
            return Some(i);
        }
        match self.policy {
            Policy::EmptyOnly => None,
            Policy::Oldest => slots.iter().enumerate().min_by_key(|(_, s)| s.armed_seq).map(|(i, _)| i),
            Policy::Newest => slots.iter().enumerate().max_by_key(|(_, s)| s.armed_seq).map(|(i, _)| i),
            Policy::Reservoir => {
                // Install with probability N/k, then pick a victim uniformly.
                if uniform(self.k) < n as u64 {
                    Some(uniform(n as u64) as usize)
                } else {
                    None
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::SmallRng, RngExt, SeedableRng};

    /// Simulate `total` samples with no traps and report how often each
    /// sample index is still monitored at the end.
    fn survival(policy: Policy, n: usize, total: usize, runs: usize) -> Vec<f64> {
        let mut rng = SmallRng::seed_from_u64(7);
        let mut hits = vec![0u64; total];
        for _ in 0..runs {
            let mut r = Reservoir::new(policy);
            let mut slots = vec![SlotView::default(); n];
            let mut who = vec![usize::MAX; n];
            for s in 0..total {
                if let Some(i) = r.choose(&slots, |m| rng.random_range(0..m)) {
                    slots[i] = SlotView { armed: true, armed_seq: s as u64 };
                    who[i] = s;
                }
            }
            for &w in &who {
                if w != usize::MAX {
                    hits[w] += 1;
                }
            }
        }
        hits.iter().map(|&h| h as f64 / runs as f64).collect()
    }

    #[test]
    fn reservoir_is_uniform_over_all_samples() {
        // With N=4 and k=40 samples, each should survive with probability 4/40.
        let p = survival(Policy::Reservoir, 4, 40, 40_000);
        for (i, &x) in p.iter().enumerate() {
            assert!((x - 0.1).abs() < 0.015, "sample {i} survives with {x}, expected 0.1");
        }
        // One register: 1/k each.
        let p = survival(Policy::Reservoir, 1, 10, 40_000);
        for &x in &p {
            assert!((x - 0.1).abs() < 0.015, "{p:?}");
        }
    }

    #[test]
    fn naive_policies_are_biased() {
        let p = survival(Policy::Oldest, 4, 40, 100);
        assert_eq!(&p[36..], &[1.0, 1.0, 1.0, 1.0]);
        assert!(p[..36].iter().all(|&x| x == 0.0));
        let p = survival(Policy::EmptyOnly, 4, 40, 100);
        assert_eq!(&p[..4], &[1.0, 1.0, 1.0, 1.0]);
        let p = survival(Policy::Newest, 2, 10, 100);
        assert_eq!((p[0], p[9]), (1.0, 1.0));
    }

    #[test]
    fn free_slot_always_used_and_trap_resets_count() {
        let mut r = Reservoir::new(Policy::Reservoir);
        let mut slots = vec![SlotView { armed: true, armed_seq: 0 }; 4];
        for _ in 0..1000 {
            r.choose(&slots, |_| u64::MAX); // never wins the N/k draw
        }
        assert!(r.k >= 1000);
        slots[2].armed = false;
        r.slot_freed();
        assert_eq!(r.choose(&slots, |_| u64::MAX), Some(2));
        assert_eq!(r.k, 1);
    }
}
