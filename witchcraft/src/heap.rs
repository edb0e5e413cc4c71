//! Heap blocks the program holds, by address range: the table the agent's
//! allocation functions (`malloc`, `free`, anonymous `mmap`, ...) keep and
//! the signal handler reads to name the data object of a watched address
//! ([`crate::objects`]).
//!
//! Lock-free and allocation-free. The table is a fixed array of entries in
//! reserved memory ([`Reserved`]), open-addressed. A block of `size` bytes
//! has a *level* `l`, the least with `2^l >= size`, so it starts in granule
//! `start >> l` and ends in that granule or the next one; its entry goes at
//! the first free slot of a short run ([`PROBES`]) from the slot that
//! `(l, start >> l)` hashes to. A lookup of an address `a` tries, for each
//! level in use (a bit mask), the runs of granules `a >> l` and
//! `(a >> l) - 1`: a few dozen slot reads at most, no matter how many blocks
//! are live. Removal (by start: `free` knows no size) tries the levels in use
//! the same way, after a small counting filter of starts said the address
//! may be tracked at all, so that the `free` of an untracked block costs one
//! read.
//!
//! Every entry has a sequence number (`tag`): 0 never used (ends a run), odd
//! while a writer owns it, even when stable. A writer takes an entry by
//! moving its tag from even to odd with a compare-and-swap (so two writers,
//! on any threads, never write one entry), writes the fields, and publishes
//! the next even number. A reader reads the tag, the fields, and the tag
//! again, and takes the entry only if both tags are the same even number: it
//! never sees half of one block and half of another (the seqlock of
//! "Scalable Read-mostly Synchronization Using Passive Reader-Writer Locks"
//! and of the Linux kernel). A reader never waits: an entry a writer owns
//! (perhaps the very thread the handler interrupted) is skipped. A removed
//! block leaves a tombstone (start 0) that the next insert in its run reuses;
//! tags only grow, so a reader can't mistake a reused entry for the one it
//! began reading.
//!
//! Bounded: [`CAPACITY`] entries; an insert that finds no free entry in its
//! run is counted ([`Table::overflow`]) and the block stays unknown.

use crate::objects::SITE_FRAMES;
use crate::sys::mem::Reserved;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

/// Entries in the process's table (80 bytes each: 1.25 MiB of address
/// space, of which only the pages written become memory).
pub const CAPACITY: usize = 1 << 14;
/// Slots an entry may sit from its home slot.
pub const PROBES: usize = 8;
/// Counters of the filter of starts (4 bytes each).
const FILTER: usize = 1 << 14;
/// The smallest level (16 bytes).
const MIN_LEVEL: u32 = 4;
/// Words of an entry: tag, start, size, hash, site.
const WORDS: usize = 4 + SITE_FRAMES;

/// A tracked block, as a reader found it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapBlock {
    pub start: u64,
    pub size: u64,
    /// The hash of the allocation's calling context (what names the object).
    pub hash: u64,
    /// The allocation's calling context, innermost first, lookup addresses
    /// (return addresses minus one), 0-padded.
    pub site: [u64; SITE_FRAMES],
}

impl HeapBlock {
    /// A block allocated from `site` (innermost first, 0-padded), its hash
    /// made from the site.
    pub fn new(start: u64, size: u64, site: [u64; SITE_FRAMES]) -> HeapBlock {
        HeapBlock { start, size, hash: site_hash(&site), site }
    }
}

/// The hash that keys a heap object: the allocation's calling context.
pub fn site_hash(site: &[u64; SITE_FRAMES]) -> u64 {
    let mut h = 0x9e37_79b9_7f4a_7c15u64;
    for &pc in site {
        h = (h ^ pc).wrapping_mul(0xff51_afd7_ed55_8ccd).rotate_left(29);
    }
    h | 1
}

fn level(size: u64) -> u32 {
    (64 - size.max(1).saturating_sub(1).leading_zeros()).max(MIN_LEVEL)
}

fn mix(x: u64) -> u64 {
    let x = (x ^ (x >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    let x = (x ^ (x >> 33)).wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

fn home(level: u32, granule: u64) -> usize {
    mix(granule.wrapping_mul(64) ^ level as u64) as usize
}

/// The address-range table (see the module comment).
pub struct Table {
    words: Reserved<u64>,
    filter: Reserved<u32>,
    cap: usize,
    /// Bit `l`: some block of level `l` was ever inserted.
    levels: AtomicU64,
    /// Bit `l`: some mapping ([`Table::insert_mapping`]) of level `l` was
    /// ever inserted: the levels [`Table::trim`] looks at.
    map_levels: AtomicU64,
    overflow: AtomicU64,
}

impl Table {
    /// A table of `cap` entries (a power of two), or None if its memory
    /// can't be reserved. Not for signal handlers.
    pub fn new(cap: usize) -> Option<Table> {
        let cap = cap.next_power_of_two().max(PROBES);
        let words = Reserved::new(cap * WORDS)?;
        let filter = Reserved::new(FILTER)?;
        Some(Table { words, filter, cap, levels: AtomicU64::new(0), map_levels: AtomicU64::new(0), overflow: AtomicU64::new(0) })
    }

    fn word(&self, slot: usize, w: usize) -> &AtomicU64 {
        // SAFETY: in bounds (slot < cap, w < WORDS); AtomicU64 has u64's
        // layout, and every access to the table's words is atomic.
        unsafe { AtomicU64::from_ptr(self.words.as_ptr().add(slot * WORDS + w) as *mut u64) }
    }

    fn counter(&self, start: u64) -> &AtomicU32 {
        let i = (mix(start >> 4) as usize) & (FILTER - 1);
        // SAFETY: in bounds; AtomicU32 has u32's layout; accessed atomically only.
        unsafe { AtomicU32::from_ptr(self.filter.as_ptr().add(i) as *mut u32) }
    }

    /// Blocks that found no free entry.
    pub fn overflow(&self) -> u64 {
        self.overflow.load(Ordering::Relaxed)
    }

    /// Blocks in the table now (a scan of every entry: not for handlers,
    /// nor for the allocation functions).
    pub fn live(&self) -> u64 {
        (0..self.cap).filter(|&s| self.read(s).is_some_and(|(t, b)| t != 0 && b.start != 0)).count() as u64
    }

    /// Take slot `s` if it is free (never used, or a tombstone): its tag,
    /// now odd, or None.
    fn claim_free(&self, s: usize) -> Option<u64> {
        let tag = self.word(s, 0);
        let t = tag.load(Ordering::Acquire);
        if t & 1 == 1 || (t != 0 && self.word(s, 1).load(Ordering::Relaxed) != 0) {
            return None;
        }
        tag.compare_exchange(t, t + 1, Ordering::AcqRel, Ordering::Relaxed).ok()?;
        // The fields' stores below must not be seen before the odd tag.
        fence(Ordering::Release);
        Some(t + 1)
    }

    /// Record `b`, a mapping of the program's (`mmap`, `mremap`): a block
    /// that [`Table::trim`] looks for.
    pub fn insert_mapping(&self, b: &HeapBlock) -> bool {
        let bit = 1 << level(b.size);
        if self.map_levels.load(Ordering::Relaxed) & bit == 0 {
            self.map_levels.fetch_or(bit, Ordering::Relaxed);
        }
        self.insert(b)
    }

    /// Record `b`. Any thread, never a handler that may have interrupted a
    /// writer of the same slot (handlers only read). False if no entry was
    /// free (counted).
    pub fn insert(&self, b: &HeapBlock) -> bool {
        let l = level(b.size);
        let h = home(l, b.start >> l);
        let mask = self.cap - 1;
        for i in 0..PROBES {
            let s = (h + i) & mask;
            let Some(odd) = self.claim_free(s) else { continue };
            // A read first: the bit is nearly always set already, and an
            // atomic update of a line every thread shares costs.
            if self.levels.load(Ordering::Relaxed) & (1 << l) == 0 {
                self.levels.fetch_or(1 << l, Ordering::Relaxed);
            }
            self.counter(b.start).fetch_add(1, Ordering::Relaxed);
            self.word(s, 2).store(b.size, Ordering::Relaxed);
            self.word(s, 3).store(b.hash, Ordering::Relaxed);
            for (k, &pc) in b.site.iter().enumerate() {
                self.word(s, 4 + k).store(pc, Ordering::Relaxed);
            }
            self.word(s, 1).store(b.start, Ordering::Relaxed);
            self.word(s, 0).store(odd + 1, Ordering::Release);
            return true;
        }
        self.overflow.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Read slot `s` consistently: its tag and block (start 0: a
    /// tombstone), or None if a writer owns it or wrote it meanwhile, or it
    /// was never used (`Some((0, _))`).
    fn read(&self, s: usize) -> Option<(u64, HeapBlock)> {
        self.read_with(s, || {})
    }

    /// [`Table::read`], running `between` after the first field is read
    /// (tests: a writer that comes in the middle of a read).
    #[inline(always)]
    fn read_with(&self, s: usize, between: impl FnOnce()) -> Option<(u64, HeapBlock)> {
        let t1 = self.word(s, 0).load(Ordering::Acquire);
        if t1 == 0 {
            return Some((0, HeapBlock::default()));
        }
        if t1 & 1 == 1 {
            return None;
        }
        let mut b = HeapBlock {
            start: self.word(s, 1).load(Ordering::Relaxed),
            size: {
                between();
                self.word(s, 2).load(Ordering::Relaxed)
            },
            hash: self.word(s, 3).load(Ordering::Relaxed),
            site: [0; SITE_FRAMES],
        };
        for (k, pc) in b.site.iter_mut().enumerate() {
            *pc = self.word(s, 4 + k).load(Ordering::Relaxed);
        }
        fence(Ordering::Acquire);
        (self.word(s, 0).load(Ordering::Relaxed) == t1).then_some((t1, b))
    }

    /// The block holding `addr`, if one is tracked. Async-signal-safe: a
    /// bounded number of plain reads, no waiting.
    pub fn find(&self, addr: u64) -> Option<HeapBlock> {
        let mut levels = self.levels.load(Ordering::Relaxed);
        let mask = self.cap - 1;
        while levels != 0 {
            let l = levels.trailing_zeros();
            levels &= levels - 1;
            let g = addr >> l;
            for granule in [g, g.wrapping_sub(1)] {
                let h = home(l, granule);
                for i in 0..PROBES {
                    match self.read((h + i) & mask) {
                        Some((0, _)) => break,
                        Some((_, b)) if b.start != 0 && addr.wrapping_sub(b.start) < b.size => return Some(b),
                        _ => {}
                    }
                }
            }
        }
        None
    }

    /// Forget the block starting at `start`, returning it, if it is
    /// tracked. Any thread, as [`Table::insert`]; one read when the filter
    /// says no block starts there.
    pub fn remove(&self, start: u64) -> Option<HeapBlock> {
        self.remove_where(start, |_| true)
    }

    /// Forget the block starting at `start` that satisfies `is`.
    fn remove_where(&self, start: u64, is: impl Fn(&HeapBlock) -> bool) -> Option<HeapBlock> {
        if start == 0 || self.counter(start).load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut levels = self.levels.load(Ordering::Relaxed);
        let mask = self.cap - 1;
        while levels != 0 {
            let l = levels.trailing_zeros();
            levels &= levels - 1;
            let h = home(l, start >> l);
            for i in 0..PROBES {
                let s = (h + i) & mask;
                // Owned by another writer: not this block (only its own
                // `free` removes it, and that is this call).
                let Some((t, b)) = self.read(s) else { continue };
                if t == 0 {
                    break;
                }
                if b.start != start || level(b.size) != l || !is(&b) {
                    continue;
                }
                if self.word(s, 0).compare_exchange(t, t + 1, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                    continue;
                }
                fence(Ordering::Release);
                self.clear(s, t + 2, start);
                return Some(b);
            }
        }
        None
    }

    /// Make slot `s`, owned (odd tag), a tombstone with tag `even`; its
    /// block started at `start`.
    fn clear(&self, s: usize, even: u64, start: u64) {
        self.word(s, 1).store(0, Ordering::Relaxed);
        self.word(s, 0).store(even, Ordering::Release);
        self.counter(start).fetch_sub(1, Ordering::Relaxed);
    }

    /// Forget the bytes `lo..hi` of every tracked mapping: what `munmap`
    /// gives back. A mapping wholly inside is removed; one that reaches out
    /// of the range keeps the part or parts outside it as mappings of their
    /// own, with its site (so the same object, each part its own start and
    /// size). Blocks of `malloc`'s are not looked for (a program does not
    /// unmap memory its allocator handed it), though one met on the way is
    /// trimmed the same. The parts are in the table before the block leaves it, and
    /// a reader skips the block's entry while it is rewritten: an address
    /// outside the range is never found in no block meanwhile, except for
    /// the moment between the entry's claim and the parts' insertion.
    ///
    /// The blocks taken out, as they were, go to `removed` as far as it
    /// holds them (for [`Table::untrim`]); returns how many there were. Any
    /// thread, as [`Table::insert`]. Cost: per level of mappings, the runs
    /// of the granules that a mapping of that level touching the range may
    /// start in (two when the range is smaller than the level's mappings;
    /// a run nearly always ends at its first entry); when there are more of
    /// these than half the table's entries, one pass over the table.
    pub fn trim(&self, lo: u64, hi: u64, removed: &mut [HeapBlock]) -> usize {
        let levels = self.map_levels.load(Ordering::Relaxed);
        if lo >= hi || levels == 0 {
            return 0;
        }
        let mut runs = 0u64;
        let mut bits = levels;
        while bits != 0 {
            let l = bits.trailing_zeros();
            bits &= bits - 1;
            runs = runs.saturating_add(((hi - 1) >> l) - (lo >> l) + 2);
        }
        let mut n = 0;
        let mut visit = |s: usize| -> bool {
            match self.read(s) {
                Some((0, _)) => false,
                Some((t, b)) => {
                    if b.start != 0 && b.start < hi && lo < b.start.saturating_add(b.size) && self.cut(s, t, &b, lo, hi) {
                        if let Some(slot) = removed.get_mut(n) {
                            *slot = b;
                        }
                        n += 1;
                    }
                    true
                }
                // Owned by a writer: a block being inserted (not yet
                // ours to see) or removed by its own `free`.
                None => true,
            }
        };
        if runs.saturating_mul(2) >= self.cap as u64 {
            for s in 0..self.cap {
                visit(s);
            }
            return n;
        }
        let mask = self.cap - 1;
        let mut bits = levels;
        while bits != 0 {
            let l = bits.trailing_zeros();
            bits &= bits - 1;
            let mut g = (lo >> l).saturating_sub(1);
            while g <= (hi - 1) >> l {
                let h = home(l, g);
                for i in 0..PROBES {
                    if !visit((h + i) & mask) {
                        break;
                    }
                }
                g += 1;
            }
        }
        n
    }

    /// Take the block `b`, read from slot `s` with tag `t`, out of the
    /// table, leaving its parts outside `lo..hi`. False if another writer
    /// got to it first.
    fn cut(&self, s: usize, t: u64, b: &HeapBlock, lo: u64, hi: u64) -> bool {
        if self.word(s, 0).compare_exchange(t, t + 1, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return false;
        }
        fence(Ordering::Release);
        let end = b.start.saturating_add(b.size);
        if b.start < lo {
            self.insert_mapping(&HeapBlock { start: b.start, size: lo - b.start, ..*b });
        }
        if end > hi {
            self.insert_mapping(&HeapBlock { start: hi, size: end - hi, ..*b });
        }
        self.clear(s, t + 2, b.start);
        true
    }

    /// Undo [`Table::trim`]`(lo, hi)` that took `removed` out (the call
    /// it was for failed): their parts outside the range go, they come
    /// back.
    pub fn untrim(&self, lo: u64, hi: u64, removed: &[HeapBlock]) {
        for b in removed {
            let end = b.start.saturating_add(b.size);
            if b.start < lo {
                self.remove_where(b.start, |p| p.size == lo - b.start && p.hash == b.hash);
            }
            if end > hi {
                self.remove_where(hi, |p| p.size == end - hi && p.hash == b.hash);
            }
            self.insert_mapping(b);
        }
    }
}

/// The process's table: made by [`start`], read by the handlers through
/// [`find`].
static TABLE: OnceLock<Table> = OnceLock::new();
/// Blocks of at least this many bytes are tracked (u64::MAX: none).
static THRESHOLD: AtomicU64 = AtomicU64::new(u64::MAX);

/// The default threshold, in bytes: blocks of a page or more (see the data
/// objects document for the measurement behind it).
pub const DEFAULT_THRESHOLD: u64 = 64 * 1024;

/// Track blocks of `threshold` bytes or more from now on (0: none). False
/// if the table's memory could not be had (then nothing is tracked). Not
/// for signal handlers.
pub fn start(threshold: u64) -> bool {
    if threshold == 0 {
        THRESHOLD.store(u64::MAX, Ordering::Release);
        return true;
    }
    if TABLE.get().is_none() {
        if let Some(t) = Table::new(CAPACITY) {
            let _ = TABLE.set(t);
        }
    }
    if TABLE.get().is_none() {
        return false;
    }
    THRESHOLD.store(threshold, Ordering::Release);
    true
}

/// Stop tracking new blocks (those tracked are still freed from the table).
pub fn stop() {
    THRESHOLD.store(u64::MAX, Ordering::Release);
}

/// The threshold now (u64::MAX: off).
pub fn threshold() -> u64 {
    THRESHOLD.load(Ordering::Relaxed)
}

/// The process's table, once [`start`] made it.
pub fn table() -> Option<&'static Table> {
    TABLE.get()
}

/// The tracked block holding `addr` (async-signal-safe).
pub fn find(addr: u64) -> Option<HeapBlock> {
    TABLE.get()?.find(addr)
}

#[cfg(test)]
mod tests;
