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
//!   same bytes read is redundant, whatever stores came between.

use super::shadow::{Page, Pages, Shadow, PAGE};
use crate::context::{Tree, ROOT};
use crate::craft::{compare, Verdict, Watched};
use crate::pair::Pairs;
use crate::profile::{self, Craft};
use crate::x86::decode::{Access, Float};

/// The dead craft's mark of a byte whose store no access has followed.
const PENDING: u32 = 1 << 31;

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

/// Judge element `[off, off+el)` of access `a`: `then` held the bytes it is
/// compared with, `now` the bytes now (both indexed from `a.addr`).
fn judge_element(a: &Access, off: usize, el: usize, then: &[u8], now: &[u8], precision: f64) -> Verdict {
    if a.float == Float::No || then[off..off + el].iter().zip(&now[off..off + el]).all(|(x, y)| x == y) {
        // Compared exactly (all `compare` would do).
        return judge_bytes(off, el, then, now);
    }
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

/// What the redundant loads' shadow remembers about a page of memory:
/// for each byte, the context node of the last load of it (0: none yet)
/// and the byte that load read (the silent stores' shadow is the context
/// of the last store, a word a byte; the dead craft's a word with
/// [`PENDING`]). The contexts are kept a word (8 aligned bytes) at a time
/// while one load read all of a word's bytes last, as an aligned 8-byte
/// load leaves them, and byte by byte ([`SPLIT`]) otherwise; the values
/// apart. An aligned 8-byte load then reads one context and one word of
/// values: the judge of a program that loads all over a large table is
/// bound by walking the shadow, as the dead craft's was.
#[repr(C)]
pub(crate) struct LoadPage {
    /// Per word: the context that loaded all its bytes last, or [`SPLIT`].
    word: [u32; WORDS],
    /// Per byte: its context, for the bytes of [`SPLIT`] words only.
    ctx: [u32; PAGE as usize],
    value: [u8; PAGE as usize],
}

/// Words of a page.
const WORDS: usize = PAGE as usize / 8;

/// A word whose bytes' contexts are in [`LoadPage::ctx`] (no context
/// node is this large).
const SPLIT: u32 = u32::MAX;

impl Page for LoadPage {
    fn fresh() -> Box<Self> {
        let page = Box::<LoadPage>::new_zeroed();
        // SAFETY: a page of integers, all zero: every word unsplit, with
        // no load yet.
        unsafe { page.assume_init() }
    }
}

impl LoadPage {
    /// Give the words over bytes `[lo, lo+len)` their contexts byte by byte.
    #[inline]
    fn split(&mut self, lo: usize, len: usize) {
        for w in lo / 8..(lo + len).div_ceil(8) {
            let c = self.word[w];
            if c != SPLIT {
                self.ctx[8 * w..8 * w + 8].fill(c);
                self.word[w] = SPLIT;
            }
        }
    }

    /// Bytes `[lo, lo+len)` were all just loaded by `ctx`: the words they
    /// cover whole are that context's again.
    #[inline]
    fn unite(&mut self, lo: usize, len: usize, ctx: u32) {
        for w in lo.div_ceil(8)..(lo + len) / 8 {
            self.word[w] = ctx;
        }
    }
}

/// Whether `a` and `b` (equally long, at most [`WIDE`]) hold the same
/// bytes: a value's 1, 2, 4 or 8 bytes in one compare.
#[inline]
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

/// Element `[off, off+el)` of access `a`, judged as [`judge_element`]
/// judges it, without building a watched access for a float whose bytes
/// changed (a stencil's loads are mostly those).
#[inline]
fn judge_value(a: &Access, off: usize, el: usize, then: &[u8], now: &[u8], precision: f64) -> Verdict {
    let (x, y) = (&then[off..off + el], &now[off..off + el]);
    if same(x, y) {
        return Verdict::Waste { bytes: el as u64, approx: false };
    }
    let within = |a: f64, b: f64| (a - b).abs() <= precision * a.abs() || a == b;
    match a.float {
        Float::No => Verdict::Use { bytes: el as u64 },
        _ if precision <= 0.0 => Verdict::Use { bytes: el as u64 },
        Float::F64 if el == 8 => {
            let f = |v: &[u8]| f64::from_le_bytes(v.try_into().unwrap_or([0; 8]));
            if within(f(x), f(y)) {
                Verdict::Waste { bytes: 8, approx: true }
            } else {
                Verdict::Use { bytes: 8 }
            }
        }
        Float::F32 if el == 4 => {
            let f = |v: &[u8]| f32::from_le_bytes(v.try_into().unwrap_or([0; 4])) as f64;
            if within(f(x), f(y)) {
                Verdict::Waste { bytes: 4, approx: true }
            } else {
                Verdict::Use { bytes: 4 }
            }
        }
        _ => with_bytes(judge_element(a, off, el, then, now, precision), el),
    }
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
    /// The dead craft's: the context of the byte's last store, with
    /// [`PENDING`] while no access has followed it.
    dead: Shadow<u32>,
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
    recent_contexts: Box<[(u32, u32, u64); MEMO]>,
    recent_pairs: Box<[(u32, u32, u32); MEMO]>,
    /// Per trap context (a node, so an index), the pair it last credited:
    /// (watch, entry), watch `u32::MAX` for none. An instruction mostly
    /// closes the same pair again (a loop's load re-reads what the same
    /// load read the iteration before), and this finds it without hashing.
    last_pair: Vec<(u32, u32)>,
}

const MEMO: usize = 4096;

/// A memo slot for two keys.
fn memo_slot(a: u32, b: u64) -> usize {
    ((b ^ (a as u64).wrapping_mul(0x9E37_79B9)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 52) as usize % MEMO
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
            dead: Shadow::default(),
            frame: ROOT,
            returns: Vec::new(),
            tree: Tree::with_capacity(1 << 20),
            pairs: Pairs::with_capacity(1 << 16),
            counters: Default::default(),
            recent_contexts: Box::new([(u32::MAX, 0, 0); MEMO]),
            recent_pairs: Box::new([(u32::MAX, 0, 0); MEMO]),
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
        let slot = memo_slot(watch, trap as u64);
        let (w, t, i) = self.recent_pairs[slot];
        let i = if (w, t) == (watch, trap) {
            i as usize
        } else {
            // A reference must not lose pairs (large programs have millions).
            self.pairs.grow_when_full();
            let i = self.pairs.find(watch, trap)?;
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
        let slot = memo_slot(self.frame, pc);
        let (frame, node, at) = self.recent_contexts[slot];
        if (frame, at) == (self.frame, pc) {
            return node;
        }
        self.context_from_tree(slot, pc)
    }

    /// A context not in the memo: from the tree, made if new.
    #[inline(never)]
    fn context_from_tree(&mut self, slot: usize, pc: u64) -> u32 {
        self.tree.grow_when_full();
        let node = self.tree.child(self.frame, pc);
        if node != self.frame {
            // (A full tree answers with the frame itself: not remembered.)
            self.recent_contexts[slot] = (self.frame, node, pc);
        }
        node
    }

    /// A `call` ran: its return address is `next`, so its call site (the
    /// frame's node) is `next - 1`.
    pub fn call(&mut self, next: u64) {
        self.returns.push(next);
        self.tree.grow_when_full();
        self.frame = self.tree.child(self.frame, next - 1);
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

    /// Dead craft: `len` bytes at `addr` read. Each byte a store left
    /// pending is used, credited to that store's pair; a run of bytes one
    /// context stored is credited at once (as that many one-byte credits).
    pub fn dead_load(&mut self, ctx: u32, addr: u64, len: u64) {
        let mut run = (0, 0);
        let end = addr.saturating_add(len);
        let mut a = addr;
        while a < end {
            let part = self.dead.part(a, end);
            // SAFETY: one part at a time, of the live shadow; crediting
            // pairs (`count_runs`) does not touch the shadow.
            for s in unsafe { Shadow::entries(part) } {
                if *s & PENDING != 0 {
                    *s &= !PENDING;
                    self.count_runs(ctx, &mut run, *s, false);
                }
            }
            a += part.1 as u64;
        }
        self.flush_run(ctx, run, false);
    }

    /// Dead craft: `len` bytes at `addr` written, by one store.
    pub fn dead_store(&mut self, ctx: u32, addr: u64, len: u64) {
        self.dead_stores(ctx, addr, len, 1);
    }

    /// `len` bytes at `addr` written by `elements` stores (a `rep` string's).
    fn dead_stores(&mut self, ctx: u32, addr: u64, len: u64, elements: u64) {
        debug_assert!(ctx & PENDING == 0, "context ids fit in 31 bits");
        let mut run = (0, 0);
        let end = addr.saturating_add(len);
        let mut a = addr;
        while a < end {
            let part = self.dead.part(a, end);
            // SAFETY: as in `dead_load`.
            for s in unsafe { Shadow::entries(part) } {
                if *s & PENDING != 0 {
                    self.count_runs(ctx, &mut run, *s & !PENDING, true);
                }
                *s = ctx | PENDING;
            }
            a += part.1 as u64;
        }
        self.flush_run(ctx, run, true);
        self.counters.samples += elements;
    }

    /// Dead craft: a `rep` string instruction's `elements` elements over
    /// the ranges `reads` and `writes` (lowest address, bytes), none of
    /// which overlaps another: its element order cannot change a verdict,
    /// so every read is judged, then every write, a range at a time.
    pub fn dead_string(&mut self, ctx: u32, reads: &[(u64, u64)], writes: &[(u64, u64)], elements: u64) {
        for &(addr, len) in reads {
            self.dead_load(ctx, addr, len);
        }
        for &(addr, len) in writes {
            self.dead_stores(ctx, addr, len, elements);
        }
    }

    fn silent_store(&mut self, precision: f64, ctx: u32, a: &Access, before: &[u8], after: &[u8]) {
        // Each value: silent if the store left it as it was. Its bytes are
        // credited to their previous stores, each run of bytes one store
        // left judged by itself: the question is whether this store changed
        // what that store wrote.
        let len = (a.len as usize).min(WIDE);
        let el = element_size(a);
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
            for (start, n, prev) in runs(&prevs[..el]) {
                if prev == 0 {
                    continue;
                }
                let v =
                    if n == el { judge_element(a, off, el, before, after, precision) } else { judge_bytes(off + start, n, before, after) };
                self.add(prev, ctx, with_bytes(v, n));
            }
        }
        self.counters.samples += 1;
    }

    fn silent_load(&mut self, precision: f64, ctx: u32, a: &Access, before: &[u8]) {
        // Each value: redundant if it reads what the previous load of it
        // read, whatever stores came between; its bytes credited to their
        // previous loads, as above.
        let len = (a.len as usize).min(WIDE);
        let lo = (a.addr % PAGE) as usize;
        if lo + len <= PAGE as usize {
            // Within a page (nearly all loads): judged in its shadow.
            let page = self.loads.page(a.addr / PAGE);
            // SAFETY: a page of the live shadow, which the map keeps where
            // it is; crediting pairs does not touch the shadow, and nothing
            // else points into it while the page is in use.
            let page = unsafe { &mut *page };
            if lo.is_multiple_of(8) && len.is_multiple_of(8) && element_size(a) == 8 {
                // Aligned words (8-byte values): a context each.
                self.loaded_words(precision, ctx, a, before, page, lo);
            } else if a.float == Float::No
                && (element_size(a) < len)
                && (lo | len).is_multiple_of(element_size(a))
                && 8 % element_size(a) == 0
            {
                // Integers of 1, 2 or 4 bytes (a string function's vector):
                // a word at a time.
                self.loaded_small(ctx, element_size(a), before, page, lo, len);
            } else {
                page.split(lo, len);
                self.loaded(precision, ctx, a, before, &mut page.ctx[lo..lo + len], &mut page.value[lo..lo + len]);
                page.unite(lo, len, ctx);
            }
        } else {
            // Across two pages: judged on a copy of their entries.
            let (mut ctxs, mut values) = ([0u32; WIDE], [0u8; WIDE]);
            self.load_entries(a.addr, len, |i, c, v| {
                ctxs[i] = *c;
                values[i] = *v;
            });
            self.loaded(precision, ctx, a, before, &mut ctxs[..len], &mut values[..len]);
            self.load_entries(a.addr, len, |i, c, v| {
                *c = ctxs[i];
                *v = values[i];
            });
        }
        self.counters.samples += 1;
    }

    /// A load of aligned 8-byte values at `lo` in `page` (see
    /// [`ThreadShadow::loaded`]): a word's context is one compare.
    #[inline]
    fn loaded_words(&mut self, precision: f64, ctx: u32, a: &Access, before: &[u8], page: &mut LoadPage, lo: usize) {
        let len = (a.len as usize).min(WIDE);
        let values = &mut page.value[lo..lo + len];
        for off in (0..len).step_by(8) {
            let w = (lo + off) / 8;
            let prev = page.word[w];
            if prev != SPLIT {
                if prev != 0 {
                    let v = judge_value(a, off, 8, values, before, precision);
                    self.add(prev, ctx, v);
                }
            } else {
                let prevs = &page.ctx[8 * w..8 * w + 8];
                let first = prevs[0];
                if prevs.iter().all(|&c| c == first) {
                    if first != 0 {
                        let v = judge_value(a, off, 8, values, before, precision);
                        self.add(first, ctx, v);
                    }
                } else {
                    self.credit_runs(ctx, prevs, off, values, before);
                }
            }
            page.word[w] = ctx;
            values[off..off + 8].copy_from_slice(&before[off..off + 8]);
        }
    }

    /// Visit the loads' shadow entries of `[addr, addr+len)` in order
    /// (their words split: a context a byte).
    fn load_entries(&mut self, addr: u64, len: usize, mut f: impl FnMut(usize, &mut u32, &mut u8)) {
        let mut i = 0;
        while i < len {
            let at = addr + i as u64;
            let lo = (at % PAGE) as usize;
            let n = (PAGE as usize - lo).min(len - i);
            // SAFETY: as in `silent_load`.
            let page = unsafe { &mut *self.loads.page(at / PAGE) };
            page.split(lo, n);
            for k in 0..n {
                f(i + k, &mut page.ctx[lo + k], &mut page.value[lo + k]);
            }
            i += n;
        }
    }

    /// A load of `before` (its bytes) whose bytes' last loads are `ctxs`
    /// and `values`: each value judged and credited, and the entries made
    /// this load's.
    #[inline]
    fn loaded(&mut self, precision: f64, ctx: u32, a: &Access, before: &[u8], ctxs: &mut [u32], values: &mut [u8]) {
        let len = ctxs.len();
        let size = element_size(a);
        if a.float == Float::No && size < len {
            // A vector of integers (a string function's bytes).
            self.loaded_elements(ctx, size, before, ctxs, values);
            return;
        }
        let mut off = 0;
        while off < len {
            let el = size.min(len - off);
            // (Values of 8 and 4 bytes, the usual ones, with their width
            // known to the compiler: words to compare and copy.)
            match el {
                8 => self.loaded_value::<8>(precision, ctx, a, off, before, ctxs, values),
                4 => self.loaded_value::<4>(precision, ctx, a, off, before, ctxs, values),
                _ => self.loaded_bytes(precision, ctx, a, off, el, before, ctxs, values),
            }
            off += el;
        }
    }

    /// A load of several integer values of `size` bytes (see
    /// [`ThreadShadow::loaded`]). Their credits are all of `size` bytes,
    /// each counted exactly: a run of values that one load read last is
    /// credited to its pair at once, as many credits as it has values
    /// (sums of whole numbers: the same figures in any order), before any
    /// other credit, so pairs are made in the order they were.
    fn loaded_elements(&mut self, ctx: u32, size: usize, before: &[u8], ctxs: &mut [u32], values: &mut [u8]) {
        let len = ctxs.len();
        // (previous load, values the same, values changed)
        let mut run = (0u32, 0u64, 0u64);
        let mut off = 0;
        while off < len {
            let el = size.min(len - off);
            let prevs = &ctxs[off..off + el];
            let prev = prevs[0];
            let (then, now) = (&values[off..off + el], &before[off..off + el]);
            if el == size && prevs.iter().all(|&c| c == prev) {
                if prev != 0 {
                    if prev != run.0 {
                        self.credit_values(ctx, run, size);
                        run = (prev, 0, 0);
                    }
                    if same(then, now) {
                        run.1 += 1;
                    } else {
                        run.2 += 1;
                    }
                }
            } else {
                self.credit_values(ctx, run, size);
                run = (0, 0, 0);
                if prevs.iter().all(|&c| c == prev) {
                    // A last value cut short.
                    if prev != 0 {
                        self.add(prev, ctx, judge_bytes(0, el, then, now));
                    }
                } else {
                    self.credit_runs(ctx, prevs, off, values, before);
                }
            }
            off += el;
        }
        self.credit_values(ctx, run, size);
        ctxs.fill(ctx);
        values.copy_from_slice(&before[..len]);
    }

    /// A load of `len` bytes at `lo` in `page` of integer values of `size`
    /// bytes, a divisor of 8 that `lo` and `len` are multiples of (so no
    /// value straddles a word), credited as [`ThreadShadow::loaded_elements`]
    /// credits them: a word whose bytes one load read last needs neither
    /// splitting nor a context a value.
    fn loaded_small(&mut self, ctx: u32, size: usize, before: &[u8], page: &mut LoadPage, lo: usize, len: usize) {
        let mut run = (0u32, 0u64, 0u64);
        let end = lo + len;
        let mut b0 = lo;
        while b0 < end {
            let w = b0 / 8;
            let b1 = end.min(8 * w + 8);
            let whole = b0 == 8 * w && b1 == 8 * w + 8;
            let (then, now) = (&page.value[b0..b1], &before[b0 - lo..b1 - lo]);
            let prev = page.word[w];
            if prev != SPLIT {
                if prev != 0 {
                    if prev != run.0 {
                        self.credit_values(ctx, run, size);
                        run = (prev, 0, 0);
                    }
                    for (x, y) in then.chunks_exact(size).zip(now.chunks_exact(size)) {
                        if same(x, y) {
                            run.1 += 1;
                        } else {
                            run.2 += 1;
                        }
                    }
                }
                if !whole {
                    page.ctx[8 * w..8 * w + 8].fill(prev);
                }
            } else {
                for e in (b0..b1).step_by(size) {
                    let prevs = &page.ctx[e..e + size];
                    let p = prevs[0];
                    if prevs.iter().all(|&c| c == p) {
                        if p != 0 {
                            if p != run.0 {
                                self.credit_values(ctx, run, size);
                                run = (p, 0, 0);
                            }
                            if same(&page.value[e..e + size], &before[e - lo..e - lo + size]) {
                                run.1 += 1;
                            } else {
                                run.2 += 1;
                            }
                        }
                    } else {
                        self.credit_values(ctx, run, size);
                        run = (0, 0, 0);
                        self.credit_runs(ctx, prevs, e - lo, &page.value[lo..end], before);
                    }
                }
            }
            if whole {
                page.word[w] = ctx;
            } else {
                page.ctx[b0..b1].fill(ctx);
                page.word[w] = SPLIT;
            }
            page.value[b0..b1].copy_from_slice(&before[b0 - lo..b1 - lo]);
            b0 = b1;
        }
        self.credit_values(ctx, run, size);
    }

    /// Credit a run of values of `size` bytes one load read last (see
    /// [`ThreadShadow::loaded_elements`]).
    fn credit_values(&mut self, ctx: u32, (prev, same, changed): (u32, u64, u64), size: usize) {
        if same + changed == 0 {
            return;
        }
        let Some(i) = self.pair(prev, ctx) else {
            // (As many misses as credits.)
            self.pairs.overflow += same + changed - 1;
            return;
        };
        let p = self.pairs.at(i);
        if same > 0 {
            p.credit_many(Verdict::Waste { bytes: size as u64, approx: false }, same);
        }
        if changed > 0 {
            p.credit_many(Verdict::Use { bytes: size as u64 }, changed);
        }
    }

    /// Value `[off, off+N)` of a load (see [`ThreadShadow::loaded`]).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn loaded_value<const N: usize>(
        &mut self,
        precision: f64,
        ctx: u32,
        a: &Access,
        off: usize,
        before: &[u8],
        ctxs: &mut [u32],
        values: &mut [u8],
    ) {
        let Ok(prevs) = <&mut [u32; N]>::try_from(&mut ctxs[off..off + N]) else { return };
        let prev = prevs[0];
        if *prevs == [prev; N] {
            // One previous load for the whole value (the usual case).
            if prev != 0 {
                let v = judge_value(a, off, N, values, before, precision);
                self.add(prev, ctx, v);
            }
        } else {
            self.credit_runs(ctx, &prevs[..], off, values, before);
        }
        *prevs = [ctx; N];
        values[off..off + N].copy_from_slice(&before[off..off + N]);
    }

    /// Value `[off, off+el)` of a load of any width (see [`ThreadShadow::loaded`]).
    #[allow(clippy::too_many_arguments)]
    fn loaded_bytes(
        &mut self,
        precision: f64,
        ctx: u32,
        a: &Access,
        off: usize,
        el: usize,
        before: &[u8],
        ctxs: &mut [u32],
        values: &mut [u8],
    ) {
        let prevs = &ctxs[off..off + el];
        let prev = prevs[0];
        if prevs.iter().all(|&c| c == prev) {
            if prev != 0 {
                let v = judge_value(a, off, el, values, before, precision);
                self.add(prev, ctx, v);
            }
        } else {
            let mut p = [0u32; 8];
            p[..el].copy_from_slice(prevs);
            self.credit_runs(ctx, &p[..el], off, values, before);
        }
        ctxs[off..off + el].fill(ctx);
        values[off..off + el].copy_from_slice(&before[off..off + el]);
    }

    /// A value whose bytes several loads read last (`prevs`, from `off`):
    /// each run of bytes one load read judged by itself.
    #[cold]
    fn credit_runs(&mut self, ctx: u32, prevs: &[u32], off: usize, values: &[u8], before: &[u8]) {
        for (start, n, prev) in runs(prevs) {
            if prev != 0 {
                let v = judge_bytes(off + start, n, values, before);
                self.add(prev, ctx, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(addr: u64, len: u32) -> Access {
        Access { addr, len, write: true, ..Default::default() }
    }
    fn load(addr: u64, len: u32) -> Access {
        Access { addr, len, read: true, ..Default::default() }
    }
    /// (watch pc, trap pc) → (waste, use) of a thread's pairs.
    fn pairs(t: &ThreadShadow) -> Vec<((u64, u64), (f64, f64))> {
        let pc = |n: u32| t.tree.nodes()[n as usize].pc;
        let mut v: Vec<_> = t.pairs.iter().map(|p| ((pc(p.watch), pc(p.trap)), (p.waste, p.used))).collect();
        v.sort_by_key(|a| a.0);
        v
    }

    #[test]
    fn dead_bytes_are_judged_by_their_next_access() {
        let mut t = ThreadShadow::new();
        let (s1, s2, l) = (t.context(0x10), t.context(0x20), t.context(0x30));
        t.judge(Craft::Dead, 0.0, s1, &[Observed::new(store(0x1000, 8))]);
        // Half overwritten (dead), half read (used).
        t.judge(Craft::Dead, 0.0, s2, &[Observed::new(store(0x1000, 4))]);
        t.judge(Craft::Dead, 0.0, l, &[Observed::new(load(0x1004, 4))]);
        assert_eq!(pairs(&t), vec![((0x10, 0x20), (4.0, 0.0)), ((0x10, 0x30), (0.0, 4.0))]);
        // A read-modify-write reads before it writes: its own bytes are used.
        let rmw = t.context(0x40);
        t.judge(Craft::Dead, 0.0, rmw, &[Observed::new(Access { addr: 0x1000, len: 4, read: true, write: true, ..Default::default() })]);
        assert!(pairs(&t).contains(&((0x20, 0x40), (0.0, 4.0))), "{:?}", pairs(&t));
    }

    #[test]
    fn silent_stores_and_loads_compare_values() {
        let mut t = ThreadShadow::new();
        let (a, b) = (t.context(0x10), t.context(0x20));
        let mut o = Observed::new(store(0x1000, 4));
        o.after[..4].copy_from_slice(&7u32.to_le_bytes());
        t.judge(Craft::SilentStore, 0.0, a, &[o]);
        o.before = o.after;
        t.judge(Craft::SilentStore, 0.0, b, &[o]);
        o.after[..4].copy_from_slice(&8u32.to_le_bytes());
        t.judge(Craft::SilentStore, 0.0, b, &[o]);
        assert_eq!(pairs(&t), vec![((0x10, 0x20), (4.0, 0.0)), ((0x20, 0x20), (0.0, 4.0))]);

        let mut t = ThreadShadow::new();
        let (a, b) = (t.context(0x10), t.context(0x20));
        let mut o = Observed::new(load(0x1000, 8));
        o.before[..8].copy_from_slice(&1.5f64.to_le_bytes());
        t.judge(Craft::SilentLoad, 0.0, a, &[o]);
        t.judge(Craft::SilentLoad, 0.0, b, &[o]);
        assert_eq!(pairs(&t), vec![((0x10, 0x20), (8.0, 0.0))]);
    }

    /// The redundant loads judged the straightforward way, byte by byte
    /// (as the judge did before its shadow split contexts from values):
    /// each byte's last load in a map, each value's bytes gathered, split
    /// into runs of one previous load, each run judged and credited.
    #[derive(Default)]
    struct ByteWise {
        last: std::collections::HashMap<u64, (u32, u8)>,
        pairs: std::collections::BTreeMap<(u32, u32), crate::pair::PairEntry>,
    }

    impl ByteWise {
        fn load(&mut self, precision: f64, ctx: u32, a: &Access, before: &[u8]) {
            let len = (a.len as usize).min(WIDE);
            let el = element_size(a);
            let mut last = [0u8; WIDE];
            for off in (0..len).step_by(el) {
                let el = el.min(len - off);
                let mut prevs = [0u32; 8];
                for b in 0..el {
                    let at = a.addr + (off + b) as u64;
                    let (c, v) = self.last.insert(at, (ctx, before[off + b])).unwrap_or((0, 0));
                    prevs[b] = c;
                    last[off + b] = v;
                }
                for (start, n, prev) in runs(&prevs[..el]) {
                    if prev == 0 {
                        continue;
                    }
                    let v = if n == el {
                        judge_element(a, off, el, &last, before, precision)
                    } else {
                        judge_bytes(off + start, n, &last, before)
                    };
                    self.pairs.entry((prev, ctx)).or_default().credit(with_bytes(v, n), 1.0);
                }
            }
        }
    }

    /// (watch, trap) → waste, approximate waste, use, their squares, traps.
    fn all_figures<'a>(p: impl Iterator<Item = (&'a u32, &'a u32, &'a crate::pair::PairEntry)>) -> Vec<((u32, u32), [f64; 7])> {
        let mut v: Vec<_> = p
            .map(|(w, t, e)| ((*w, *t), [e.waste, e.approx_waste, e.used, e.waste_sq, e.approx_waste_sq, e.used_sq, e.traps as f64]))
            .collect();
        v.sort_by_key(|x| x.0);
        v
    }

    /// Random loads (overlapping, of every width, across a page boundary,
    /// integer and float, from a few contexts, of a few values) judged by
    /// the judge and byte by byte agree pair by pair, figure by figure.
    #[test]
    fn redundant_loads_are_judged_as_byte_by_byte() {
        use rand::{rngs::SmallRng, RngExt, SeedableRng};
        for (seed, precision) in [(1u64, 0.0), (2, 0.01), (3, 0.01), (4, 0.5)] {
            let mut rng = SmallRng::seed_from_u64(seed);
            let mut t = ThreadShadow::new();
            let mut reference = ByteWise::default();
            let ctxs: Vec<u32> = (0..7).map(|i| t.context(0x100 + i)).collect();
            let floats = [1.0f64, 1.001, 1.5, -2.0, 0.0];
            for _ in 0..20000 {
                let len = [1u32, 2, 3, 4, 4, 8, 8, 8, 12, 16, 32, 64][rng.random_range(0..12)];
                let float = match rng.random_range(0..3) {
                    0 => Float::No,
                    1 => Float::F32,
                    _ => Float::F64,
                };
                let elem = [0u8, 1, 2, 4, 8][rng.random_range(0..5)];
                // Near a page boundary, so some loads straddle it; half
                // of them aligned, as most of a program's are.
                let mut addr = 3 * PAGE - 48 + rng.random_range(0..96u64);
                if rng.random_range(0..2) == 0 {
                    addr &= !7;
                }
                let a = Access { addr, len, read: true, float, elem, ..Default::default() };
                let mut before = [0u8; WIDE];
                match float {
                    Float::No => before.iter_mut().for_each(|b| *b = rng.random_range(0..2)),
                    Float::F32 => {
                        for c in before.chunks_mut(4) {
                            c.copy_from_slice(&(floats[rng.random_range(0..5)] as f32).to_le_bytes());
                        }
                    }
                    Float::F64 => {
                        for c in before.chunks_mut(8) {
                            c.copy_from_slice(&floats[rng.random_range(0..5)].to_le_bytes());
                        }
                    }
                }
                let ctx = ctxs[rng.random_range(0..ctxs.len())];
                t.judge(Craft::SilentLoad, precision, ctx, &[Observed { access: a, before, after: [0; WIDE] }]);
                reference.load(precision, ctx, &a, &before);
            }
            let got = all_figures(t.pairs.iter().map(|p| (&p.watch, &p.trap, p)));
            let want = all_figures(reference.pairs.iter().map(|((w, t), e)| (w, t, e)));
            let sum = |k: usize| got.iter().map(|p| p.1[k]).sum::<f64>();
            assert!(sum(0) > 0.0 && sum(2) > 0.0, "seed {seed}: both verdicts");
            if precision > 0.0 {
                assert!(sum(1) > 0.0, "seed {seed}: approximate waste");
            }
            assert_eq!(got, want, "seed {seed}: the judge (left) and byte by byte (right)");
        }
    }

    #[test]
    fn the_shadow_stack_follows_calls_and_returns() {
        let mut t = ThreadShadow::new();
        let outer = t.context(0x10);
        t.call(0x15);
        let inner = t.context(0x100);
        let site = t.tree.nodes()[inner as usize].parent;
        assert_eq!(t.tree.nodes()[site as usize].pc, 0x14, "the call site is the frame");
        t.call(0x105);
        // A longjmp-like return past both frames.
        t.ret(0x15);
        assert_eq!(t.context(0x10), outer);
    }
}
