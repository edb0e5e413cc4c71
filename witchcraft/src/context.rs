//! Calling contexts: a per-thread tree in preallocated memory.
//!
//! Each node carries µ(C), the samples taken in that context, and η(C), the
//! part of µ already accounted for by traps (Witch §4.4.2). Insertion never
//! allocates: nodes live in memory reserved up front (`sys::mem::Reserved`,
//! which becomes memory only as it is written), and children are found
//! through an open-addressing index keyed by (parent, pc). The index is
//! reserved at its largest too, but only the part the tree needs is used
//! (at least twice its nodes, doubled and rebuilt in place as it grows):
//! hashed entries spread over the whole index would touch every page of it
//! (half a MiB a thread) however few contexts a thread has.

use crate::sys::mem::{Reserved, Zeroable};

pub const ROOT: u32 = 0;

/// Index entries a table starts with (4 KiB).
pub(crate) const FIRST_SLOTS: usize = 1024;

/// A node of a thread's live context tree, as its handlers keep it (the
/// profile's [`crate::profile::Node`] is what it becomes when written).
#[derive(Clone, Copy, Debug, Default)]
pub struct LiveNode {
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

impl LiveNode {
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

// SAFETY: numbers only; all zero is the empty node.
unsafe impl Zeroable for LiveNode {}

pub struct Tree {
    nodes: Reserved<LiveNode>,
    /// Nodes in use (the root included).
    len: usize,
    index: Reserved<u32>,
    /// Entries of `index` in use: a power of two, at least twice `len`.
    slots: usize,
    cap: usize,
    pub overflow: u64,
}

/// The hash of a tree node (parent, pc), or of a pair (watch, trap). The
/// tables take its low bits, so the product's high bits are folded into
/// them: the low bits of a product depend only on the low bits of what was
/// multiplied, and pairs of small node numbers with the same low bits of
/// `watch ^ trap` all began their probes at one slot (the exact judge's
/// value crafts spent 60% of their time in those chains).
pub(crate) fn hash(parent: u32, pc: u64) -> u64 {
    let h = (pc ^ ((parent as u64) << 40) ^ (parent as u64)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^ (h >> 32)
}

/// The index entries a table of `cap` entries may use.
pub(crate) fn max_slots(cap: usize) -> usize {
    (cap * 2).next_power_of_two().max(FIRST_SLOTS)
}

/// Rebuild an open-addressing index in its first `slots` entries (a power
/// of two), given the entries' hashes in order (entry 0 is the empty
/// marker, so the first hash is entry 1's). In place: no allocation.
pub(crate) fn reindex(index: &mut [u32], slots: usize, hashes: impl Iterator<Item = u64>) {
    let index = &mut index[..slots];
    index.fill(0);
    let mask = slots - 1;
    for (i, h) in hashes.enumerate() {
        let mut h = (h as usize) & mask;
        while index[h] != 0 {
            h = (h + 1) & mask;
        }
        index[h] = i as u32 + 1;
    }
}

impl Tree {
    /// `cap` nodes at most, or None if their memory cannot be reserved.
    pub fn try_with_capacity(cap: usize) -> Option<Tree> {
        let cap = cap.max(1);
        // Node 0, all zero, is the root.
        let nodes = Reserved::new(cap)?;
        let index = Reserved::new(max_slots(cap))?;
        Some(Tree { nodes, len: 1, index, slots: FIRST_SLOTS, cap, overflow: 0 })
    }

    /// `cap` nodes at most (not for the agent: it panics without memory).
    pub fn with_capacity(cap: usize) -> Tree {
        Self::try_with_capacity(cap).expect("address space for the context tree")
    }

    /// The nodes, the root first.
    pub fn nodes(&self) -> &[LiveNode] {
        &self.nodes[..self.len]
    }

    /// The reserved address space, in bytes.
    pub fn reserved_bytes(&self) -> usize {
        self.nodes.bytes() + self.index.bytes()
    }

    pub fn clear(&mut self) {
        self.nodes.clear(self.len);
        self.index.clear(self.slots);
        self.len = self.nodes.len().min(1);
        self.slots = FIRST_SLOTS;
        self.overflow = 0;
    }

    /// Doubles the capacity when full. It allocates, so only for code outside
    /// signal handlers (the exact mode), where nothing may be lost.
    pub fn grow_when_full(&mut self) {
        if self.len < self.cap {
            return;
        }
        let cap = self.cap * 2;
        if self.nodes.grow(cap) && self.index.grow(max_slots(cap)) {
            self.cap = cap;
        }
    }

    /// Child of `parent` for `pc`, created if needed. Returns `parent` when full.
    pub fn child(&mut self, parent: u32, pc: u64) -> u32 {
        if 2 * (self.len + 1) > self.slots && 2 * self.slots <= self.index.len() {
            self.slots *= 2;
            let nodes = &self.nodes[1..self.len];
            reindex(&mut self.index, self.slots, nodes.iter().map(|n| hash(n.parent, n.pc)));
        }
        let mask = self.slots - 1;
        let mut h = (hash(parent, pc) as usize) & mask;
        loop {
            let i = self.index[h];
            if i == 0 {
                if self.len >= self.cap || 2 * (self.len + 1) > self.slots {
                    self.overflow += 1;
                    return parent;
                }
                let n = self.len as u32;
                self.nodes[self.len] = LiveNode { parent, pc, ..Default::default() };
                self.len += 1;
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

    pub fn node(&mut self, i: u32) -> &mut LiveNode {
        &mut self.nodes[i as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::LiveNode;

    /// Two samples of one context, one weight each: one watched by a debug
    /// register, its next access still to come; one judged within its
    /// burst. Each verdict stands for one sample. (When the judged one took
    /// all of µ − η, the sooner fate got both weights and the other none.)
    #[test]
    fn a_verdict_judged_in_software_shares_with_the_armed_watchpoints() {
        let mut n = LiveNode { mu: 2.0, armed: 1, ..Default::default() };
        assert_eq!(n.claim(true), 1.0);
        // The armed sample's trap, its register still counted.
        assert_eq!(n.claim(false), 1.0);
        assert_eq!(n.eta, 2.0);
        // Nothing left, however many claim.
        assert_eq!(n.claim(true), 0.0);
        // A lone trap with no register armed takes all that is left.
        let mut lone = LiveNode { mu: 3.0, eta: 1.0, ..Default::default() };
        assert_eq!(lone.claim(false), 2.0);
        let mut in_burst = LiveNode { mu: 3.0, eta: 1.0, ..Default::default() };
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
        assert_eq!(t.nodes()[a as usize].parent, t.nodes()[b as usize].parent);
        assert_eq!(t.insert(&[3, 2, 1]), a);
        assert_eq!(t.nodes().len(), 5);
        let reserved = t.reserved_bytes();
        for i in 0..100 {
            t.insert(&[100 + i, 1]);
        }
        assert_eq!(t.nodes().len(), 8);
        assert_eq!(t.reserved_bytes(), reserved);
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
            assert_eq!(t.nodes()[n as usize].pc, i as u64);
        }
        assert_eq!(t.nodes().len(), 1001);
    }

    /// A thread's tables used to take half a MiB of memory as soon as it
    /// had a few contexts: their hashes spread over the whole index. The
    /// index now grows with the tree, and what is reserved but not used
    /// costs nothing.
    #[test]
    fn memory_follows_what_the_tables_hold() {
        let resident = || {
            let s = std::fs::read_to_string("/proc/self/statm").unwrap();
            s.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 4096
        };
        let before = resident();
        let mut kept = Vec::new();
        for _ in 0..16 {
            let mut t = Tree::with_capacity(1 << 16);
            let mut p = Pairs::with_capacity(1 << 13);
            for i in 0..100u64 {
                let leaf = t.insert(&[0x1000 + i, 0x2000 + i % 7, 0x3000]);
                p.get(leaf, leaf).unwrap().waste += 1.0;
            }
            kept.push((t, p));
        }
        let per_thread = resident().saturating_sub(before) / 16;
        assert!(per_thread < 64 << 10, "{per_thread} bytes of memory for 200 contexts and 100 pairs");
        // What they hold is all there, and found again.
        for (t, p) in &mut kept {
            assert_eq!(t.nodes().len(), 1 + 1 + 7 + 100);
            assert_eq!(p.iter().count(), 100);
            let n = t.nodes().len();
            let again = t.insert(&[0x1000 + 5, 0x2000 + 5, 0x3000]);
            assert_eq!((t.nodes().len(), t.nodes()[again as usize].pc), (n, 0x1000 + 5));
        }
    }
}
