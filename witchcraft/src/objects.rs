//! Data objects: which piece of data each judged access touched, so that a
//! report can say *which* table or buffer holds the waste, not only which
//! code (the data-centric view of "LoadSpy: Pinpointing Redundant Memory
//! Loads").
//!
//! A trap's verdict is credited to its pair ⟨C_watch, C_trap⟩ (`pair.rs`)
//! and, beside it, to ⟨C_watch, C_trap, object⟩ in this table. The object
//! of the watched address is found in the signal handler without allocating
//! and without locks:
//! - the thread's own **stack** range → [`AddrKind::Stack`];
//! - a block the agent tracks in the [`crate::heap`] table (allocations at
//!   or above its size threshold) → [`AddrKind::Heap`], keyed by the calling
//!   context of its allocation, so every block allocated there is one object;
//! - anything else → [`AddrKind::Address`]: the address is kept and resolved at
//!   report time, offline, to the symbol of the module whose `.data`,
//!   `.bss` or `.rodata` holds it (a static object), else "unknown". These
//!   entries are keyed by the address's 64-byte line, so a big array makes
//!   one entry per line a pair touched; each keeps the first address seen,
//!   which is what is resolved (objects smaller than a line that one pair
//!   touches in the same line go to the first one's name).
//!
//! The table is kept like the pair table: preallocated, entries in reserved
//! memory that becomes memory only when written; past its capacity, credits
//! still go to their pair, and are counted in `counters.object_overflow`.

use crate::context::{max_slots, reindex, FIRST_SLOTS};
use crate::craft::Verdict;
use crate::pair::PairEntry;
use crate::profile;
use crate::sys::mem::{Reserved, Zeroable};

/// Frames of an allocation's calling context that name a heap object.
pub const SITE_FRAMES: usize = 6;

/// What kind of data an address is, as the handler can tell.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum AddrKind {
    /// Resolved offline (a static object, or unknown).
    #[default]
    Address = 0,
    Stack = 1,
    Heap = 2,
}

/// An object as the handler found it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FoundObject {
    pub kind: AddrKind,
    /// What tells two objects apart: the line of an address, the hash of an
    /// allocation's context, 0 for the stack.
    pub key: u64,
    /// The address (Address), or the block's start (Heap).
    pub addr: u64,
    /// The block's size (Heap).
    pub size: u64,
    /// The allocation's calling context, innermost first, 0-padded (Heap):
    /// lookup addresses like a context tree's (return addresses minus one).
    pub site: [u64; SITE_FRAMES],
}

impl FoundObject {
    /// The object holding `addr` for a thread whose stack is `stack`.
    pub fn of(addr: u64, stack: (u64, u64)) -> FoundObject {
        if addr >= stack.0 && addr < stack.1 {
            return FoundObject { kind: AddrKind::Stack, ..Default::default() };
        }
        if let Some(b) = crate::heap::find(addr) {
            return FoundObject::heap(&b);
        }
        FoundObject { kind: AddrKind::Address, key: addr >> 6, addr, ..Default::default() }
    }

    /// The object of a tracked heap block: every block allocated from one
    /// calling context is one object.
    pub fn heap(b: &crate::heap::HeapBlock) -> FoundObject {
        FoundObject { kind: AddrKind::Heap, key: b.hash, addr: b.start, size: b.size, site: b.site }
    }

    fn hash(&self, watch: u32, trap: u32) -> u64 {
        let k = self.key.rotate_left(17) ^ ((self.kind as u64) << 61);
        crate::context::hash(watch, (trap as u64) ^ k)
    }

    fn to_profile(self) -> profile::DataRef {
        match self.kind {
            AddrKind::Address => profile::DataRef::Address { addr: self.addr },
            AddrKind::Stack => profile::DataRef::Stack,
            AddrKind::Heap => {
                let n = self.site.iter().position(|&pc| pc == 0).unwrap_or(SITE_FRAMES);
                profile::DataRef::Heap { addr: self.addr, size: self.size, site: self.site[..n].to_vec() }
            }
        }
    }
}

/// One ⟨C_watch, C_trap, object⟩ and its credits.
#[derive(Clone, Copy, Debug, Default)]
pub struct ObjectEntry {
    pub credits: PairEntry,
    pub object: FoundObject,
}

// SAFETY: numbers only (the kind's 0 is Address); all zero is the empty entry.
unsafe impl Zeroable for ObjectEntry {}

/// The most entries a thread's table holds (about 200 bytes each).
pub const OBJECT_ENTRIES: usize = 1 << 13;

/// ⟨C_watch, C_trap, object⟩ → credits, preallocated like the pair table.
pub struct ObjectTable {
    entries: Reserved<ObjectEntry>,
    len: usize,
    index: Reserved<u32>,
    slots: usize,
    cap: usize,
    pub overflow: u64,
}

impl ObjectTable {
    /// `cap` entries at most, or None if their memory cannot be reserved.
    pub fn try_with_capacity(cap: usize) -> Option<ObjectTable> {
        let cap = cap.max(1);
        let entries = Reserved::new(cap + 1)?;
        let index = Reserved::new(max_slots(cap + 1))?;
        Some(ObjectTable { entries, len: 1, index, slots: FIRST_SLOTS, cap, overflow: 0 })
    }

    /// A table that holds nothing (every credit counted as overflow).
    pub fn none() -> ObjectTable {
        ObjectTable { entries: Reserved::empty(), len: 1, index: Reserved::empty(), slots: 0, cap: 0, overflow: 0 }
    }

    /// What [`ObjectTable::try_with_capacity`] reserves for `cap`, in bytes.
    pub fn reserved_bytes_for(cap: usize) -> usize {
        (cap + 1) * std::mem::size_of::<ObjectEntry>() + max_slots(cap + 1) * std::mem::size_of::<u32>()
    }

    pub fn reserved_bytes(&self) -> usize {
        self.entries.bytes() + self.index.bytes()
    }

    pub fn clear(&mut self) {
        if self.cap == 0 {
            return;
        }
        self.entries.clear(self.len);
        self.index.clear(self.slots);
        self.len = 1;
        self.slots = FIRST_SLOTS;
        self.overflow = 0;
    }

    /// Credit one verdict (as the pair got it) to its object too.
    pub fn credit(&mut self, watch: u32, trap: u32, object: &FoundObject, verdict: Verdict, scale: f64, cluster: u64) {
        if let Some(e) = self.get(watch, trap, object) {
            let (waste, used) = e.credits.credit(verdict, scale);
            e.credits.cluster.add(cluster, waste, used);
        }
    }

    fn get(&mut self, watch: u32, trap: u32, object: &FoundObject) -> Option<&mut ObjectEntry> {
        if self.cap == 0 {
            self.overflow += 1;
            return None;
        }
        if 2 * (self.len + 1) > self.slots && 2 * self.slots <= self.index.len() {
            self.slots *= 2;
            let entries = &self.entries[1..self.len];
            reindex(&mut self.index, self.slots, entries.iter().map(|e| e.object.hash(e.credits.watch, e.credits.trap)));
        }
        let mask = self.slots - 1;
        let mut h = (object.hash(watch, trap) as usize) & mask;
        loop {
            let i = self.index[h] as usize;
            if i == 0 {
                if self.len > self.cap || 2 * (self.len + 1) > self.slots {
                    self.overflow += 1;
                    return None;
                }
                let n = self.len;
                self.index[h] = n as u32;
                self.entries[n] = ObjectEntry { credits: PairEntry { watch, trap, ..Default::default() }, object: *object };
                self.len += 1;
                return Some(&mut self.entries[n]);
            }
            let e = &self.entries[i];
            if e.credits.watch == watch && e.credits.trap == trap && e.object.kind == object.kind && e.object.key == object.key {
                return Some(&mut self.entries[i]);
            }
            h = (h + 1) & mask;
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &ObjectEntry> {
        self.entries.get(1..self.len).unwrap_or(&[]).iter()
    }

    /// The table in the profile's form.
    pub fn to_profile(&self) -> Vec<profile::ObjectPair> {
        self.iter().map(|e| profile::ObjectPair { pair: crate::pair::to_profile(&e.credits), object: e.object.to_profile() }).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credits_split_by_object() {
        let mut t = ObjectTable::try_with_capacity(4).unwrap();
        let stack = FoundObject::of(0x1008, (0x1000, 0x2000));
        assert_eq!(stack.kind, AddrKind::Stack);
        let a = FoundObject::of(0x5000_0010, (0x1000, 0x2000));
        let a2 = FoundObject::of(0x5000_0030, (0x1000, 0x2000)); // same line
        let b = FoundObject::of(0x5000_0040, (0x1000, 0x2000)); // next line
        let waste = Verdict::Waste { bytes: 8, approx: false };
        t.credit(1, 2, &a, waste, 1.0, 0);
        t.credit(1, 2, &a2, waste, 1.0, 0);
        t.credit(1, 2, &b, Verdict::Use { bytes: 4 }, 1.0, 0);
        t.credit(1, 2, &stack, waste, 2.0, 0);
        t.credit(3, 2, &stack, waste, 2.0, 0);
        assert!(t.iter().count() == 4 && t.overflow == 0);
        t.credit(4, 2, &stack, waste, 2.0, 0);
        assert_eq!(t.overflow, 1);
        let p = t.to_profile();
        assert_eq!(p[0].object, profile::DataRef::Address { addr: 0x5000_0010 });
        assert_eq!((p[0].pair.waste, p[0].pair.traps), (16.0, 2));
        assert_eq!((p[1].pair.r#use, p[2].pair.waste), (4.0, 16.0));
        assert_eq!(p[2].object, profile::DataRef::Stack);
        let mut none = ObjectTable::none();
        none.credit(1, 2, &a, waste, 1.0, 0);
        assert_eq!((none.iter().count(), none.overflow), (0, 1));
        t.clear();
        assert_eq!(t.iter().count(), 0);
    }
}
