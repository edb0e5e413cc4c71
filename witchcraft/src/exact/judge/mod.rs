//! The exact judge: every access of a thread, judged in shadow memory with
//! the crafts' exact semantics, and credited to the pair of calling contexts
//! it closes. Both exact modes feed it: the single-stepping one
//! ([`super::Exact`]) an instruction at a time, the code-cache one from
//! buffers of recorded accesses. It owns the per-thread shadow state; how
//! the accesses were observed is the caller's business.
//!
//! - dead: byte-level, as DeadSpy: a stored byte whose next access (by the
//!   same thread) is a store is dead, one whose next access is a load is used;
//! - silent-store: instruction-level, as RedSpy: a store that leaves the bytes
//!   the previous store to them left (floats within the precision) is silent;
//! - silent-load: as LoadSpy: a load that reads what the previous load of the
//!   same bytes read is redundant, whatever stores came between (its shadow
//!   and paths in `loads.rs`).

use super::shadow::{Pages, Shadow, ShadowPage, PAGE};
use crate::context::{Tree, ROOT};
use crate::craft::{compare, Verdict, Watched};
use crate::pair::Pairs;
use crate::profile::{self, Craft};
use crate::x86::decode::{Access, Float};
use dead::DeadPage;
use loads::LoadPage;

mod dead;
mod loads;
#[cfg(test)]
mod tests;

/// Widest access (AVX-512): its bytes before and after are kept whole.
pub const WIDE: usize = 64;

/// The values comparisons are made in: a float access's floats (compared
/// within the precision), and otherwise each value the instruction moves (a
/// scalar whole, a vector's elements). A value is silent (or redundant) only
/// if all of its bytes are; each of its bytes is then credited, waste or use,
/// to the pair of that byte's own previous access and this one, as DeadSpy
/// credits dead bytes. A sampling craft estimates the same through its
/// monitored element (Witch §4.6.4).
fn element_size(a: &Access) -> usize {
    match a.float {
        Float::F32 => 4,
        Float::F64 => 8,
        Float::No => a.element_len().clamp(1, 8) as usize,
    }
}

/// Whether `a` and `b` (equally long, at most [`WIDE`]) hold the same
/// bytes: a value's 1, 2, 4 or 8 bytes in one compare.
#[inline(always)]
fn same(a: &[u8], b: &[u8]) -> bool {
    fn word<const N: usize>(x: &[u8]) -> [u8; N] {
        x[..N].try_into().unwrap_or([0; N])
    }
    match a.len() {
        8 if b.len() == 8 => u64::from_ne_bytes(word(a)) == u64::from_ne_bytes(word(b)),
        4 if b.len() == 4 => u32::from_ne_bytes(word(a)) == u32::from_ne_bytes(word(b)),
        2 if b.len() == 2 => u16::from_ne_bytes(word(a)) == u16::from_ne_bytes(word(b)),
        1 if b.len() == 1 => a[0] == b[0],
        // (A loop: too short for `memcmp`.)
        _ => a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y),
    }
}

/// The values of `el` bytes in `then` against `now` (equally long): how
/// many are unchanged, how many changed within the relative `precision`
/// (only where `float`, single or double floats of `el` bytes), and how
/// many changed: the verdicts [`judge_element`] gives them, counted.
#[inline]
fn tally(then: &[u8], now: &[u8], el: usize, float: bool, precision: f64) -> Tally {
    let mut t = Tally::default();
    for (x, y) in then.chunks_exact(el).zip(now.chunks_exact(el)) {
        if same(x, y) {
            t.unchanged += 1;
        } else if float && crate::craft::float_within(x, y, el, precision) {
            t.near += 1;
        } else {
            t.changed += 1;
        }
    }
    t
}

/// Values of one size counted by verdict (see [`tally`]).
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    unchanged: u64,
    near: u64,
    changed: u64,
}

/// Judge element `[off, off+el)` of access `a`: `then` held the bytes it is
/// compared with, `now` the bytes now (both indexed from `a.addr`).
fn judge_element(a: &Access, off: usize, el: usize, then: &[u8], now: &[u8], precision: f64) -> Verdict {
    if a.float == Float::No || then[off..off + el].iter().zip(&now[off..off + el]).all(|(x, y)| x == y) {
        // Compared exactly (all `compare` would do).
        return judge_bytes(off, el, then, now);
    }
    let size = if a.float == Float::F32 { 4 } else { 8 };
    if el == size {
        // One whole float whose bytes changed: what `compare` decides of
        // it (RedSpy/LoadSpy's |new − old| ≤ p·|old|), without making a
        // watched access for it (most of the float crafts' judging).
        if precision <= 0.0 {
            return Verdict::Use { bytes: el as u64 };
        }
        return if crate::craft::float_within(&then[off..], &now[off..], size, precision) {
            Verdict::Waste { bytes: el as u64, approx: true }
        } else {
            Verdict::Use { bytes: el as u64 }
        };
    }
    judge_element_watched(a, off, el, then, now, precision)
}

/// [`judge_element`] of a changed float element through a watched access
/// and [`compare`], as a trap judges one (a piece narrower than a float).
fn judge_element_watched(a: &Access, off: usize, el: usize, then: &[u8], now: &[u8], precision: f64) -> Verdict {
    let e = Access { addr: a.addr + off as u64, len: el as u32, ..*a };
    let mut w = Watched::with_piece(e, (e.addr, el as u64));
    w.value_len = el;
    w.value[..el].copy_from_slice(&then[off..off + el]);
    compare(&w, &e, &now[off..off + el], precision)
}

/// Bytes `[off, off+n)` compared exactly: waste if all are unchanged.
fn judge_bytes(off: usize, n: usize, then: &[u8], now: &[u8]) -> Verdict {
    // (A byte loop: values are at most 8 bytes, too short for `memcmp`.)
    if then[off..off + n].iter().zip(&now[off..off + n]).all(|(a, b)| a == b) {
        Verdict::Waste { bytes: n as u64, approx: false }
    } else {
        Verdict::Use { bytes: n as u64 }
    }
}

/// The same verdict for `n` bytes.
fn with_bytes(v: Verdict, n: usize) -> Verdict {
    match v {
        Verdict::Waste { approx, .. } => Verdict::Waste { bytes: n as u64, approx },
        Verdict::Use { .. } => Verdict::Use { bytes: n as u64 },
        Verdict::Ignore => Verdict::Ignore,
    }
}

/// An access's shadow entries (1 to 64, in one page): the first, all of
/// them or-ed, and whether all are alike. Whole arrays for the usual
/// widths, so the compiler makes a few vector instructions of it.
#[inline(always)]
fn survey(e: &[u32]) -> (u32, u32, bool) {
    #[inline(always)]
    fn of<const N: usize>(e: &[u32; N]) -> (u32, u32, bool) {
        let first = e[0];
        (first, e.iter().fold(0, |m, s| m | s), e.iter().all(|&s| s == first))
    }
    match e.len() {
        64 => of::<64>(e.try_into().unwrap_or(&[0; 64])),
        32 => of::<32>(e.try_into().unwrap_or(&[0; 32])),
        16 => of::<16>(e.try_into().unwrap_or(&[0; 16])),
        8 => of::<8>(e.try_into().unwrap_or(&[0; 8])),
        4 => of::<4>(e.try_into().unwrap_or(&[0; 4])),
        2 => of::<2>(e.try_into().unwrap_or(&[0; 2])),
        1 => (e[0], e[0], true),
        _ => {
            let first = e[0];
            (first, e.iter().fold(0, |m, s| m | s), e.iter().all(|&s| s == first))
        }
    }
}

/// Is the access judged in one step: at most [`WIDE`] bytes, in one page
/// of shadow.
#[inline(always)]
fn one_step(addr: u64, len: u64) -> bool {
    len <= WIDE as u64 && addr % PAGE + len <= PAGE
}

/// Runs of equal contexts: (start, length, context).
fn runs(ctxs: &[u32]) -> impl Iterator<Item = (usize, usize, u32)> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        let start = i;
        let c = *ctxs.get(i)?;
        while i < ctxs.len() && ctxs[i] == c {
            i += 1;
        }
        Some((start, i - start, c))
    })
}

/// One access of an instruction, with the bytes the value crafts compare:
/// `before`, the bytes at its address before the instruction ran (what a
/// load read, what a store overwrote), and `after`, those it left (stores).
/// The dead craft needs neither.
#[derive(Clone, Copy)]
pub struct Observed {
    pub access: Access,
    pub before: [u8; WIDE],
    pub after: [u8; WIDE],
}

impl Observed {
    pub fn new(access: Access) -> Observed {
        Observed { access, before: [0; WIDE], after: [0; WIDE] }
    }
}

/// Per-thread state: shadow memory, shadow call stack, tree and pairs.
pub struct ThreadShadow {
    /// Silent stores: the context of each byte's last store (0: none yet).
    stores: Shadow<u32>,
    /// Redundant loads: each byte's last load.
    loads: Pages<LoadPage>,
    /// The dead craft's: whether a store left each byte pending, and its
    /// context.
    dead: Pages<DeadPage>,
    /// Tree node of the current frame (the chain of call sites).
    frame: u32,
    /// Return addresses of the shadow stack, innermost last.
    returns: Vec<u64>,
    pub(crate) tree: Tree,
    pub(crate) pairs: Pairs,
    pub(crate) counters: profile::Counters,
    /// Recent lookups of the tree ((frame, pc) → node) and of the pairs
    /// ((watch, trap) → entry), direct-mapped: a hashed lookup in tables of
    /// millions of entries missed the processor's caches twice a record.
    /// Both grow with the tree and the pair table (see [`Memo`]).
    recent_contexts: Memo<(u32, u32, u64)>,
    recent_pairs: Memo<(u32, u32, u32)>,
    /// Per trap context (a node, so an index), the pair it last credited:
    /// (watch, entry), watch `u32::MAX` for none. An instruction mostly
    /// closes the same pair again (a loop's load re-reads what the same
    /// load read the iteration before), and this finds it without hashing.
    last_pair: Vec<(u32, u32)>,
}

/// A direct-mapped memo of `2^bits` entries, `empty` where none is: it
/// starts small (a judged thread costs witch little; a program may have
/// hundreds) and grows, emptied, to at most 65,536 entries once the table
/// it caches holds twice its entries (a database engine's 164,000
/// contexts missed a memo of 4,096 most of the time).
struct Memo<T: Copy> {
    entries: Box<[T]>,
    bits: u32,
    empty: T,
}

impl<T: Copy> Memo<T> {
    const FIRST_BITS: u32 = 12;
    const MAX_BITS: u32 = 16;

    fn new(empty: T) -> Memo<T> {
        Memo { entries: vec![empty; 1 << Self::FIRST_BITS].into_boxed_slice(), bits: Self::FIRST_BITS, empty }
    }

    /// The slot for two keys.
    #[inline]
    fn slot(&self, a: u32, b: u64) -> usize {
        ((b ^ (a as u64).wrapping_mul(0x9E37_79B9)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - self.bits)) as usize
    }

    /// Grow (emptied) if the table it caches holds `cached` entries, over
    /// twice its own.
    fn fit(&mut self, cached: usize) {
        if self.bits < Self::MAX_BITS && cached > 2 << self.bits {
            self.bits = (self.bits + 2).min(Self::MAX_BITS);
            self.entries = vec![self.empty; 1 << self.bits].into_boxed_slice();
        }
    }
}

impl<T: Copy> std::ops::Index<usize> for Memo<T> {
    type Output = T;
    #[inline]
    fn index(&self, i: usize) -> &T {
        &self.entries[i]
    }
}

impl<T: Copy> std::ops::IndexMut<usize> for Memo<T> {
    #[inline]
    fn index_mut(&mut self, i: usize) -> &mut T {
        &mut self.entries[i]
    }
}

impl Default for ThreadShadow {
    fn default() -> Self {
        Self::new()
    }
}

impl ThreadShadow {
    pub fn new() -> Self {
        ThreadShadow {
            stores: Shadow::default(),
            loads: Pages::default(),
            dead: Pages::default(),
            frame: ROOT,
            returns: Vec::new(),
            tree: Tree::with_capacity(1 << 20),
            pairs: Pairs::with_capacity(1 << 16),
            counters: Default::default(),
            recent_contexts: Memo::new((u32::MAX, 0, 0)),
            recent_pairs: Memo::new((u32::MAX, 0, 0)),
            last_pair: Vec::new(),
        }
    }

    /// One count per run of bytes the same context stored.
    fn count_runs(&mut self, ctx: u32, runs: &mut (u32, u64), prev: u32, waste: bool) {
        if runs.0 != prev {
            self.flush_run(ctx, *runs, waste);
            *runs = (prev, 0);
        }
        runs.1 += 1;
    }

    fn flush_run(&mut self, ctx: u32, (prev, n): (u32, u64), waste: bool) {
        if n == 0 {
            return;
        }
        let Some(i) = self.pair(prev, ctx) else { return };
        self.pairs.at(i).count_bytes(if waste { Verdict::Waste { bytes: n, approx: false } } else { Verdict::Use { bytes: n } });
    }

    fn add(&mut self, watch: u32, trap: u32, v: Verdict) {
        let Some(i) = self.pair(watch, trap) else { return };
        self.pairs.at(i).credit(v, 1.0);
    }

    /// The entry of pair ⟨watch, trap⟩, made if new; None when the table
    /// is full. Through the trap's last pair, then the memo, then the table.
    #[inline]
    fn pair(&mut self, watch: u32, trap: u32) -> Option<usize> {
        if let Some(&(w, i)) = self.last_pair.get(trap as usize) {
            if w == watch {
                return Some(i as usize);
            }
        }
        self.pair_slow(watch, trap)
    }

    #[inline(never)]
    fn pair_slow(&mut self, watch: u32, trap: u32) -> Option<usize> {
        let slot = self.recent_pairs.slot(watch, trap as u64);
        let (w, t, i) = self.recent_pairs[slot];
        let i = if (w, t) == (watch, trap) {
            i as usize
        } else {
            // A reference must not lose pairs (large programs have millions).
            self.pairs.grow_when_full();
            let i = self.pairs.find(watch, trap)?;
            self.recent_pairs.fit(self.pairs.in_use());
            let slot = self.recent_pairs.slot(watch, trap as u64);
            self.recent_pairs[slot] = (watch, trap, i as u32);
            i
        };
        let t = trap as usize;
        if t >= self.last_pair.len() {
            self.last_pair.resize((t + 1).next_power_of_two().max(1024), (u32::MAX, 0));
        }
        self.last_pair[t] = (watch, i as u32);
        Some(i)
    }

    /// The calling context of the instruction at `pc`: the current frame's
    /// chain of call sites, then `pc`.
    #[inline]
    pub fn context(&mut self, pc: u64) -> u32 {
        let slot = self.recent_contexts.slot(self.frame, pc);
        let (frame, node, at) = self.recent_contexts[slot];
        if (frame, at) == (self.frame, pc) {
            return node;
        }
        self.context_from_tree(pc)
    }

    /// A context not in the memo: from the tree, made if new.
    #[inline(never)]
    fn context_from_tree(&mut self, pc: u64) -> u32 {
        self.tree.grow_when_full();
        let node = self.tree.child(self.frame, pc);
        if node != self.frame {
            // (A full tree answers with the frame itself: not remembered.)
            self.recent_contexts.fit(self.tree.nodes().len());
            let slot = self.recent_contexts.slot(self.frame, pc);
            self.recent_contexts[slot] = (self.frame, node, pc);
        }
        node
    }

    /// A `call` ran: its return address is `next`, so its call site (the
    /// frame's node) is `next - 1`.
    pub fn call(&mut self, next: u64) {
        self.returns.push(next);
        // The frame's child for the call site, as an access there would
        // find it: through the memo (a program that calls a lot, SQLite's
        // engine, spent a quarter of the judge in the tree's lookups).
        self.frame = self.context(next - 1);
    }

    /// A `ret` ran to `target`: pop to the frame that returns there
    /// (longjmp-like exits pop several).
    pub fn ret(&mut self, target: u64) {
        while let Some(top) = self.returns.pop() {
            self.frame = self.tree.nodes()[self.frame as usize].parent;
            if top == target {
                break;
            }
        }
    }

    /// Judge the accesses of one instruction whose context is `ctx`, in the
    /// order they happen: loads first (in a read-modify-write the read
    /// comes first), then stores.
    pub fn judge(&mut self, craft: Craft, precision: f64, ctx: u32, accesses: &[Observed]) {
        for pass in [true, false] {
            for o in accesses {
                let a = o.access;
                if (pass && !a.read) || (!pass && !a.write) {
                    continue;
                }
                match (craft, pass) {
                    (Craft::Dead, true) => self.dead_load(ctx, a.addr, a.len as u64),
                    (Craft::Dead, false) => self.dead_store(ctx, a.addr, a.len as u64),
                    (Craft::SilentStore, false) => self.silent_store(precision, ctx, &a, &o.before, &o.after),
                    (Craft::SilentLoad, true) => self.silent_load(precision, ctx, &a, &o.before),
                    _ => {}
                }
            }
        }
    }

    /// A value craft: one access of its kind, with the bytes before it and
    /// (a store) after it, each at least `min(len, WIDE)` long; accesses
    /// of the other kind are not judged.
    pub fn judge_value(&mut self, craft: Craft, precision: f64, ctx: u32, a: &Access, before: &[u8], after: &[u8]) {
        match craft {
            Craft::SilentStore if a.write => self.silent_store(precision, ctx, a, before, after),
            Craft::SilentLoad if a.read => self.silent_load(precision, ctx, a, before),
            _ => {}
        }
    }

    fn silent_store(&mut self, precision: f64, ctx: u32, a: &Access, before: &[u8], after: &[u8]) {
        // Each value: silent if the store left it as it was. Its bytes are
        // credited to their previous stores, each run of bytes one store
        // left judged by itself: the question is whether this store changed
        // what that store wrote.
        let len = (a.len as usize).min(WIDE);
        let el = element_size(a);
        if a.addr % PAGE + len as u64 <= PAGE {
            // Within a page (nearly all stores): its entries at once.
            let part = self.stores.part(a.addr, a.addr + len as u64);
            // SAFETY: the live shadow's entries of this store, used before
            // any other part; crediting pairs does not touch the shadow.
            let entries = unsafe { Shadow::entries(part) };
            if len > el && len.is_multiple_of(el) {
                // A vector of values whose bytes one store left (a loop
                // storing an array over itself): its values judged one by
                // one, credited to that one pair at once.
                let (prev, _, alike) = survey(entries);
                if alike {
                    entries.fill(ctx);
                    if prev != 0 {
                        self.stored_alike(precision, prev, ctx, a, el, &before[..len], &after[..len]);
                    }
                    self.counters.samples += 1;
                    return;
                }
            }
            for off in (0..len).step_by(el) {
                let el = el.min(len - off);
                self.stored(precision, ctx, a, off, &mut entries[off..off + el], before, after);
            }
            self.counters.samples += 1;
            return;
        }
        for off in (0..len).step_by(el) {
            let el = el.min(len - off);
            let mut prevs = [0u32; 8];
            let (mut b, start) = (0, a.addr + off as u64);
            while b < el {
                let part = self.stores.part(start + b as u64, start + el as u64);
                // SAFETY: one part at a time, of the live shadow.
                for s in unsafe { Shadow::entries(part) } {
                    prevs[b] = std::mem::replace(s, ctx);
                    b += 1;
                }
            }
            self.credit_stored(precision, ctx, a, off, &prevs[..el], before, after);
        }
        self.counters.samples += 1;
    }

    /// Store `a` of values of `el` bytes (`before` and `after` its whole
    /// bytes), all of whose bytes `prev` stored last: each value judged as
    /// [`judge_element`] judges it, and the pair credited once per verdict
    /// with as many credits as values (the same figures as a credit per
    /// value: sums of whole numbers).
    #[allow(clippy::too_many_arguments)]
    fn stored_alike(&mut self, precision: f64, prev: u32, ctx: u32, a: &Access, el: usize, before: &[u8], after: &[u8]) {
        let float = match a.float {
            Float::F32 if el == 4 && precision > 0.0 => true,
            Float::F64 if el == 8 && precision > 0.0 => true,
            _ => false,
        };
        self.credit_tally(prev, ctx, el, tally(before, after, el, float, precision));
    }

    /// Pair ⟨prev, ctx⟩ credited with `t`'s values of `el` bytes, a credit
    /// per value, given at once per verdict (sums of whole numbers: the
    /// same figures), in the order a credit per value makes them: exact
    /// waste, approximate waste, use.
    fn credit_tally(&mut self, prev: u32, ctx: u32, el: usize, t: Tally) {
        let n = t.unchanged + t.near + t.changed;
        if n == 0 {
            return;
        }
        let Some(i) = self.pair(prev, ctx) else {
            // (As many misses as credits.)
            self.pairs.overflow += n - 1;
            return;
        };
        let p = self.pairs.at(i);
        let bytes = el as u64;
        for (k, v) in [
            (t.unchanged, Verdict::Waste { bytes, approx: false }),
            (t.near, Verdict::Waste { bytes, approx: true }),
            (t.changed, Verdict::Use { bytes }),
        ] {
            if k > 0 {
                p.credit_many(v, k);
            }
        }
    }

    /// Element `[off, off+el)` of store `a`, its bytes' entries `prevs`
    /// (the contexts of their last stores, made this store's here).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn stored(&mut self, precision: f64, ctx: u32, a: &Access, off: usize, prevs: &mut [u32], before: &[u8], after: &[u8]) {
        let el = prevs.len();
        let prev = prevs[0];
        if prevs.iter().all(|&c| c == prev) {
            // One previous store for the whole value (the usual case).
            prevs.fill(ctx);
            if prev != 0 {
                let v = judge_element(a, off, el, before, after, precision);
                self.add(prev, ctx, with_bytes(v, el));
            }
        } else {
            let mut p = [0u32; 8];
            p[..el].copy_from_slice(prevs);
            prevs.fill(ctx);
            self.credit_stored(precision, ctx, a, off, &p[..el], before, after);
        }
    }

    /// Element `[off, off+el)` of store `a` whose bytes' last stores were
    /// `prevs`: each run of bytes one store left judged by itself.
    #[allow(clippy::too_many_arguments)]
    fn credit_stored(&mut self, precision: f64, ctx: u32, a: &Access, off: usize, prevs: &[u32], before: &[u8], after: &[u8]) {
        let el = prevs.len();
        for (start, n, prev) in runs(prevs) {
            if prev == 0 {
                continue;
            }
            let v = if n == el { judge_element(a, off, el, before, after, precision) } else { judge_bytes(off + start, n, before, after) };
            self.add(prev, ctx, with_bytes(v, n));
        }
    }
}
