//! Pairs ⟨C_watch, C_trap⟩: what each trap's verdict credits, per pair of
//! calling contexts, in a table preallocated like the context tree.

use crate::context::{hash, max_slots, reindex, FIRST_SLOTS};
use crate::craft::Verdict;
use crate::profile::Clustered;
use crate::sys::mem::{Reserved, Zeroable};

/// ⟨C_watch, C_trap⟩ → attributed bytes, preallocated like the tree.
#[derive(Clone, Copy, Debug, Default)]
pub struct PairEntry {
    pub watch: u32,
    pub trap: u32,
    pub waste: f64,
    pub approx_waste: f64,
    pub used: f64,
    /// Sums of the squares of each trap's credit to the three above, so a
    /// report can put an interval on any ratio of them (the linearized
    /// variance of a ratio estimator needs Σx² per side).
    pub waste_sq: f64,
    pub approx_waste_sq: f64,
    pub used_sq: f64,
    pub traps: u64,
    /// The credits summed per cluster (sampled runs only).
    pub cluster: ClusterSums,
}

impl PairEntry {
    /// An exhaustive count: the verdict's bytes, each as if judged by
    /// itself (as `bytes` credits of one byte with scale 1: sums, squares
    /// and credits all grow by the byte count), in one step.
    pub fn count_bytes(&mut self, verdict: Verdict) {
        let (sum, sq, bytes) = match verdict {
            Verdict::Waste { bytes, approx: false } => (&mut self.waste, &mut self.waste_sq, bytes),
            Verdict::Waste { bytes, approx: true } => (&mut self.approx_waste, &mut self.approx_waste_sq, bytes),
            Verdict::Use { bytes } => (&mut self.used, &mut self.used_sq, bytes),
            Verdict::Ignore => return,
        };
        self.traps += bytes;
        *sum += bytes as f64;
        *sq += bytes as f64;
    }

    /// `traps` traps' equal verdicts, each credited with its bytes (scale
    /// 1), in one step: the sums grow by whole numbers, so they come out as
    /// those credits one by one would leave them.
    pub fn credit_many(&mut self, verdict: Verdict, traps: u64) {
        let (sum, sq, bytes) = match verdict {
            Verdict::Waste { bytes, approx: false } => (&mut self.waste, &mut self.waste_sq, bytes),
            Verdict::Waste { bytes, approx: true } => (&mut self.approx_waste, &mut self.approx_waste_sq, bytes),
            Verdict::Use { bytes } => (&mut self.used, &mut self.used_sq, bytes),
            Verdict::Ignore => {
                self.traps += traps;
                return;
            }
        };
        self.traps += traps;
        *sum += (traps * bytes) as f64;
        *sq += (traps * bytes * bytes) as f64;
    }

    /// One trap's verdict, credited with `scale` times its bytes; returns
    /// the credit as (waste, use).
    pub fn credit(&mut self, verdict: Verdict, scale: f64) -> (f64, f64) {
        self.traps += 1;
        let (sum, sq, bytes) = match verdict {
            Verdict::Waste { bytes, approx: false } => (&mut self.waste, &mut self.waste_sq, bytes),
            Verdict::Waste { bytes, approx: true } => (&mut self.approx_waste, &mut self.approx_waste_sq, bytes),
            Verdict::Use { bytes } => (&mut self.used, &mut self.used_sq, bytes),
            Verdict::Ignore => return (0.0, 0.0),
        };
        let x = scale * bytes as f64;
        *sum += x;
        *sq += x * x;
        match verdict {
            Verdict::Use { .. } => (0.0, x),
            _ => (x, 0.0),
        }
    }
}

/// The running per-cluster sums of one set of credits (a pair's, or all of
/// a thread's): each credit is added to its cluster's waste and use, and
/// the squares and product of those are kept up to date as they grow, so
/// nothing needs closing when a cluster ends. A cluster is the traps a
/// thread credits between two sampler interrupts ([`Clustered`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct ClusterSums {
    /// The cluster `waste` and `used` belong to.
    id: u64,
    waste: f64,
    used: f64,
    pub sums: Clustered,
}

impl ClusterSums {
    /// Add a credit of `waste` and `used` (either may be 0) in `cluster`.
    pub fn add(&mut self, cluster: u64, waste: f64, used: f64) {
        if waste == 0.0 && used == 0.0 {
            return;
        }
        if self.id != cluster || self.sums.clusters == 0 {
            self.id = cluster;
            self.waste = 0.0;
            self.used = 0.0;
            self.sums.clusters += 1;
        }
        // (w + x)² − w² = x(2w + x); (w + x)(u + y) − wu = xu + yw + xy.
        let s = &mut self.sums;
        s.waste_sq += waste * (2.0 * self.waste + waste);
        s.use_sq += used * (2.0 * self.used + used);
        s.waste_use += waste * self.used + used * self.waste + waste * used;
        self.waste += waste;
        self.used += used;
    }
}

// SAFETY: numbers only; all zero is the empty entry.
unsafe impl Zeroable for PairEntry {}

/// The pair table, kept like the context tree (`context.rs`): entries in
/// reserved memory, an index that grows with them.
pub struct Pairs {
    entries: Reserved<PairEntry>,
    /// Entries in use, the empty marker (entry 0) included.
    len: usize,
    index: Reserved<u32>,
    /// Entries of `index` in use: a power of two, at least twice `len`.
    slots: usize,
    cap: usize,
    pub overflow: u64,
}

impl Pairs {
    /// `cap` pairs at most, or None if their memory cannot be reserved.
    pub fn try_with_capacity(cap: usize) -> Option<Pairs> {
        let cap = cap.max(1);
        let entries = Reserved::new(cap + 1)?; // entry 0 = empty marker
        let index = Reserved::new(max_slots(cap + 1))?;
        Some(Pairs { entries, len: 1, index, slots: FIRST_SLOTS, cap, overflow: 0 })
    }

    /// `cap` pairs at most (not for the agent: it panics without memory).
    pub fn with_capacity(cap: usize) -> Pairs {
        Self::try_with_capacity(cap).expect("address space for the pair table")
    }

    /// The reserved address space, in bytes.
    pub fn reserved_bytes(&self) -> usize {
        self.entries.bytes() + self.index.bytes()
    }

    pub fn clear(&mut self) {
        self.entries.clear(self.len);
        self.index.clear(self.slots);
        self.len = 1;
        self.slots = FIRST_SLOTS;
        self.overflow = 0;
    }

    /// Doubles the capacity when full; allocates, so outside signal handlers
    /// only (the exact mode).
    pub fn grow_when_full(&mut self) {
        if self.len <= self.cap {
            return;
        }
        let cap = self.cap * 2;
        if self.entries.grow(cap + 1) && self.index.grow(max_slots(cap + 1)) {
            self.cap = cap;
        }
    }

    pub fn get(&mut self, watch: u32, trap: u32) -> Option<&mut PairEntry> {
        let i = self.find(watch, trap)?;
        Some(&mut self.entries[i])
    }

    /// Entry `i`, as [`Pairs::find`] gave it (entries never move or go
    /// away until [`Pairs::clear`]).
    pub fn at(&mut self, i: usize) -> &mut PairEntry {
        &mut self.entries[i]
    }

    /// Where pair ⟨watch, trap⟩ is, created if needed; None when full.
    pub fn find(&mut self, watch: u32, trap: u32) -> Option<usize> {
        if 2 * (self.len + 1) > self.slots && 2 * self.slots <= self.index.len() {
            self.slots *= 2;
            let entries = &self.entries[1..self.len];
            reindex(&mut self.index, self.slots, entries.iter().map(|e| hash(e.watch, e.trap as u64)));
        }
        let mask = self.slots - 1;
        let mut h = (hash(watch, trap as u64) as usize) & mask;
        loop {
            let i = self.index[h] as usize;
            if i == 0 {
                if self.len > self.cap || 2 * (self.len + 1) > self.slots {
                    self.overflow += 1;
                    return None;
                }
                let n = self.len;
                self.index[h] = n as u32;
                self.entries[n] = PairEntry { watch, trap, ..Default::default() };
                self.len += 1;
                return Some(n);
            }
            if self.entries[i].watch == watch && self.entries[i].trap == trap {
                return Some(i);
            }
            h = (h + 1) & mask;
        }
    }

    /// Entries in use (the empty marker included).
    pub fn in_use(&self) -> usize {
        self.len
    }

    pub fn iter(&self) -> impl Iterator<Item = &PairEntry> {
        self.entries[1..self.len].iter()
    }
}

/// One entry in the profile's form.
pub fn to_profile(p: &PairEntry) -> crate::profile::Pair {
    crate::profile::Pair {
        watch: p.watch,
        trap: p.trap,
        waste: p.waste,
        approx_waste: p.approx_waste,
        r#use: p.used,
        waste_sq: p.waste_sq,
        approx_waste_sq: p.approx_waste_sq,
        use_sq: p.used_sq,
        traps: p.traps,
        cluster: p.cluster.sums,
    }
}

/// One thread's tree and pairs in the profile's form (its data objects,
/// where it keeps them, are added by the caller).
pub fn thread_profile(
    tid: u32,
    tree: &crate::context::Tree,
    pairs: &Pairs,
    clusters: Clustered,
    mut counters: crate::profile::Counters,
) -> crate::profile::Thread {
    use crate::profile;
    counters.tree_overflow = tree.overflow;
    counters.pair_overflow = pairs.overflow;
    profile::Thread {
        tid,
        nodes: tree.nodes().iter().map(|n| profile::Node { parent: n.parent, pc: n.pc, samples: n.samples }).collect(),
        pairs: pairs.iter().map(to_profile).collect(),
        counters,
        clusters,
        objects: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_accumulate() {
        let mut p = Pairs::with_capacity(2);
        p.get(1, 2).unwrap().waste += 3.0;
        p.get(1, 2).unwrap().waste += 4.0;
        p.get(2, 1).unwrap().used += 1.0;
        assert!(p.get(5, 5).is_none());
        let v: Vec<_> = p.iter().map(|e| (e.watch, e.trap, e.waste, e.used)).collect();
        assert_eq!(v, vec![(1, 2, 7.0, 0.0), (2, 1, 0.0, 1.0)]);
    }

    #[test]
    fn a_count_of_bytes_is_that_many_one_byte_credits() {
        let (mut one, mut each) = (PairEntry::default(), PairEntry::default());
        for v in [Verdict::Waste { bytes: 5, approx: false }, Verdict::Use { bytes: 3 }, Verdict::Waste { bytes: 2, approx: true }] {
            one.count_bytes(v);
            let single = match v {
                Verdict::Waste { approx, .. } => Verdict::Waste { bytes: 1, approx },
                _ => Verdict::Use { bytes: 1 },
            };
            let n = match v {
                Verdict::Waste { bytes, .. } | Verdict::Use { bytes } => bytes,
                Verdict::Ignore => 0,
            };
            for _ in 0..n {
                each.credit(single, 1.0);
            }
        }
        let f = |p: &PairEntry| (p.waste, p.waste_sq, p.approx_waste, p.approx_waste_sq, p.used, p.used_sq, p.traps);
        assert_eq!(f(&one), f(&each));
        assert_eq!(one.traps, 10);
    }

    #[test]
    fn many_credits_at_once_are_those_credits_one_by_one() {
        let verdicts = [
            Verdict::Waste { bytes: 8, approx: false },
            Verdict::Use { bytes: 2 },
            Verdict::Waste { bytes: 4, approx: true },
            Verdict::Ignore,
        ];
        let (mut many, mut each) = (PairEntry::default(), PairEntry::default());
        for (k, v) in verdicts.into_iter().enumerate() {
            let n = 3 + 5 * k as u64;
            many.credit_many(v, n);
            for _ in 0..n {
                each.credit(v, 1.0);
            }
        }
        let f = |p: &PairEntry| (p.waste, p.waste_sq, p.approx_waste, p.approx_waste_sq, p.used, p.used_sq, p.traps);
        assert_eq!(f(&many), f(&each));
        assert_eq!(many.waste_sq, 3.0 * 64.0);
    }

    #[test]
    fn credits_keep_sums_of_squares() {
        let mut p = PairEntry::default();
        p.credit(Verdict::Waste { bytes: 8, approx: false }, 2.0);
        p.credit(Verdict::Waste { bytes: 8, approx: false }, 1.0);
        p.credit(Verdict::Use { bytes: 4 }, 1.0);
        p.credit(Verdict::Ignore, 1.0);
        assert_eq!((p.waste, p.waste_sq, p.used, p.used_sq, p.traps), (24.0, 320.0, 4.0, 16.0, 4));
    }

    #[test]
    fn cluster_sums_square_each_clusters_total() {
        let mut c = ClusterSums::default();
        // Cluster 7: waste 2 + 3, use 4; cluster 8: use 1; cluster 9: waste 6.
        c.add(7, 2.0, 0.0);
        c.add(7, 0.0, 4.0);
        c.add(7, 3.0, 0.0);
        c.add(8, 0.0, 1.0);
        c.add(9, 6.0, 0.0);
        let s = c.sums;
        assert_eq!(s.clusters, 3);
        assert_eq!(s.waste_sq, 5.0 * 5.0 + 6.0 * 6.0);
        assert_eq!(s.use_sq, 4.0 * 4.0 + 1.0);
        assert_eq!(s.waste_use, 5.0 * 4.0);
        // A credit of nothing makes no cluster.
        c.add(10, 0.0, 0.0);
        assert_eq!(c.sums.clusters, 3);
    }
}
