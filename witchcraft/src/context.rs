//! Calling contexts: a per-thread tree in preallocated memory.
//!
//! Each node carries µ(C), the samples taken in that context, and η(C), the
//! part of µ already accounted for by traps (Witch §4.4.2). Insertion never
//! allocates: nodes live in a Vec reserved up front, and children are found
//! through an open-addressing index keyed by (parent, pc).

pub const ROOT: u32 = 0;

#[derive(Clone, Copy, Debug, Default)]
pub struct Node {
    pub parent: u32,
    pub pc: u64,
    /// Samples taken in this context.
    pub samples: u64,
    /// µ(C): the samples, each weighted by the share of its period that the
    /// program (not the engine) ran; 1 per sample with a PMU sampler.
    pub mu: f64,
    /// η(C)
    pub eta: f64,
    /// Watchpoints currently armed from this context.
    pub armed: u32,
}

impl Node {
    /// A trap's share of this context's samples not yet accounted for
    /// (Witch §4.4.2): (µ − η) over the watchpoints armed from it, counting
    /// the trapping sample among them. `unarmed`: that sample holds no
    /// debug register (a burst judged it in software), so it is one more
    /// sharer than `armed` says. Accounts for the share (η grows by it).
    pub fn claim(&mut self, unarmed: bool) -> f64 {
        let sharers = (self.armed + u32::from(unarmed)).max(1) as f64;
        let delta = ((self.mu - self.eta) / sharers).max(0.0);
        self.eta += delta;
        delta
    }
}

pub struct Tree {
    pub nodes: Vec<Node>,
    index: Vec<u32>,
    cap: usize,
    pub overflow: u64,
}

pub(crate) fn hash(parent: u32, pc: u64) -> u64 {
    (pc ^ ((parent as u64) << 40) ^ (parent as u64)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// An open-addressing index for `cap` entries, given their hashes in order
/// (entry 0 is the empty marker, so the first hash is entry 1's).
pub(crate) fn reindex(cap: usize, hashes: impl Iterator<Item = u64>) -> Vec<u32> {
    let mut index = vec![0u32; (cap * 2).next_power_of_two()];
    let mask = index.len() - 1;
    for (i, h) in hashes.enumerate() {
        let mut h = (h as usize) & mask;
        while index[h] != 0 {
            h = (h + 1) & mask;
        }
        index[h] = i as u32 + 1;
    }
    index
}

impl Tree {
    /// `cap` nodes at most; the index is twice that (zeroed pages stay untouched until used).
    pub fn with_capacity(cap: usize) -> Tree {
        let mut nodes = Vec::with_capacity(cap);
        nodes.push(Node::default());
        Tree { nodes, index: vec![0u32; (cap * 2).next_power_of_two()], cap, overflow: 0 }
    }

    pub fn clear(&mut self) {
        self.nodes.truncate(1);
        self.nodes[0] = Node::default();
        self.index.iter_mut().for_each(|x| *x = 0);
        self.overflow = 0;
    }

    /// Doubles the capacity when full. It allocates, so only for code outside
    /// signal handlers (the exact mode), where nothing may be lost.
    pub fn grow_when_full(&mut self) {
        if self.nodes.len() < self.cap {
            return;
        }
        self.cap *= 2;
        self.index = reindex(self.cap, self.nodes.iter().skip(1).map(|n| hash(n.parent, n.pc)));
    }

    /// Child of `parent` for `pc`, created if needed. Returns `parent` when full.
    pub fn child(&mut self, parent: u32, pc: u64) -> u32 {
        let mask = self.index.len() - 1;
        let mut h = (hash(parent, pc) as usize) & mask;
        loop {
            let i = self.index[h];
            if i == 0 {
                if self.nodes.len() >= self.cap {
                    self.overflow += 1;
                    return parent;
                }
                let n = self.nodes.len() as u32;
                self.nodes.push(Node { parent, pc, ..Default::default() });
                self.index[h] = n;
                return n;
            }
            let node = &self.nodes[i as usize];
            if node.parent == parent && node.pc == pc {
                return i;
            }
            h = (h + 1) & mask;
        }
    }

    /// Insert a path given innermost frame first; returns the leaf node.
    pub fn insert(&mut self, frames_innermost_first: &[u64]) -> u32 {
        let mut n = ROOT;
        for &pc in frames_innermost_first.iter().rev() {
            n = self.child(n, pc);
        }
        n
    }

    pub fn node(&mut self, i: u32) -> &mut Node {
        &mut self.nodes[i as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::Node;

    /// Two samples of one context, one weight each: one watched by a debug
    /// register, its next access still to come; one judged within its
    /// burst. Each verdict stands for one sample. (When the judged one took
    /// all of µ − η, the sooner fate got both weights and the other none.)
    #[test]
    fn a_verdict_judged_in_software_shares_with_the_armed_watchpoints() {
        let mut n = Node { mu: 2.0, armed: 1, ..Default::default() };
        assert_eq!(n.claim(true), 1.0);
        // The armed sample's trap, its register still counted.
        assert_eq!(n.claim(false), 1.0);
        assert_eq!(n.eta, 2.0);
        // Nothing left, however many claim.
        assert_eq!(n.claim(true), 0.0);
        // A lone trap with no register armed takes all that is left.
        let mut lone = Node { mu: 3.0, eta: 1.0, ..Default::default() };
        assert_eq!(lone.claim(false), 2.0);
        let mut in_burst = Node { mu: 3.0, eta: 1.0, ..Default::default() };
        assert_eq!(in_burst.claim(true), 2.0);
    }

    use super::*;
    use crate::pair::Pairs;

    #[test]
    fn paths_share_prefixes_and_never_grow_past_capacity() {
        let mut t = Tree::with_capacity(8);
        let a = t.insert(&[3, 2, 1]);
        let b = t.insert(&[4, 2, 1]);
        assert_ne!(a, b);
        assert_eq!(t.nodes[a as usize].parent, t.nodes[b as usize].parent);
        assert_eq!(t.insert(&[3, 2, 1]), a);
        assert_eq!(t.nodes.len(), 5);
        let cap_before = t.nodes.capacity();
        for i in 0..100 {
            t.insert(&[100 + i, 1]);
        }
        assert_eq!(t.nodes.len(), 8);
        assert_eq!(t.nodes.capacity(), cap_before);
        assert!(t.overflow > 0);
    }

    #[test]
    fn grown_tables_keep_every_entry() {
        let mut p = Pairs::with_capacity(2);
        let mut t = Tree::with_capacity(2);
        for i in 0..1000u32 {
            p.grow_when_full();
            p.get(i, i + 1).unwrap().waste += i as f64;
            t.grow_when_full();
            t.child(0, i as u64);
        }
        assert_eq!(p.overflow, 0);
        assert_eq!(t.overflow, 0);
        assert_eq!(p.iter().count(), 1000);
        // Lookups after rehashing find the same entries.
        for i in 0..1000u32 {
            assert_eq!(p.get(i, i + 1).unwrap().waste, i as f64);
            let n = t.child(0, i as u64);
            assert_eq!(t.nodes[n as usize].pc, i as u64);
        }
        assert_eq!(t.nodes.len(), 1001);
    }
}
