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

use crate::context::{Tree, ROOT};
use crate::craft::{compare, Verdict, Watched};
use crate::pair::Pairs;
use crate::profile::{self, Craft};
use crate::x86::decode::{Access, Float};
use std::collections::HashMap;

const PAGE: u64 = 4096;
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
fn judge_element(a: &Access, off: usize, el: usize, then: &[u8; WIDE], now: &[u8; WIDE], precision: f64) -> Verdict {
    let e = Access { addr: a.addr + off as u64, len: el as u32, ..*a };
    let mut w = Watched::with_piece(e, (e.addr, el as u64));
    w.value_len = el;
    w.value[..el].copy_from_slice(&then[off..off + el]);
    compare(&w, &e, &now[off..off + el], precision)
}

/// Bytes `[off, off+n)` compared exactly: waste if all are unchanged.
fn judge_bytes(off: usize, n: usize, then: &[u8; WIDE], now: &[u8; WIDE]) -> Verdict {
    if then[off..off + n] == now[off..off + n] {
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

/// What the shadow memory remembers about one byte.
#[derive(Clone, Copy, Default)]
struct Byte {
    /// Context node of the last store to it (0: none yet).
    store_ctx: u32,
    /// That store has not been followed by any access yet (dead craft).
    pending: bool,
    /// Context node of the last load of it (0: none yet).
    load_ctx: u32,
    /// The byte that load read.
    loaded: u8,
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
/// Page numbers hash by one multiplication (SipHash took 40% of judging).
#[derive(Default, Clone, Copy)]
struct PageHasher(u64);

impl std::hash::Hasher for PageHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (n ^ self.0).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(26);
    }
}

type Page = [Byte; PAGE as usize];

/// Pages the shadow keeps at hand: a direct-mapped table of recent page
/// numbers, so a loop over a few arrays and its stack finds each page
/// without hashing (one most-recent page was not enough: a store to an
/// array and a push to the stack alternated between two).
const RECENT: usize = 64;

pub struct ThreadShadow {
    pages: HashMap<u64, Box<Page>, std::hash::BuildHasherDefault<PageHasher>>,
    /// Recently used pages: (page number, where its bytes are; boxed, so
    /// they do not move when the map grows). `u64::MAX`: empty.
    recent: [(u64, *mut Page); RECENT],
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
    recent_contexts: Box<[(u32, u64, u32); MEMO]>,
    recent_pairs: Box<[(u32, u32, u32); MEMO]>,
}

const MEMO: usize = 4096;

/// A memo slot for two keys.
fn memo_slot(a: u32, b: u64) -> usize {
    ((b ^ (a as u64).wrapping_mul(0x9E37_79B9)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 52) as usize % MEMO
}

// SAFETY: the raw pointers in `recent` point into pages the shadow's own
// map owns; they move with the shadow and are never shared.
unsafe impl Send for ThreadShadow {}

impl Default for ThreadShadow {
    fn default() -> Self {
        Self::new()
    }
}

impl ThreadShadow {
    pub fn new() -> Self {
        ThreadShadow {
            pages: HashMap::default(),
            recent: [(u64::MAX, std::ptr::null_mut()); RECENT],
            frame: ROOT,
            returns: Vec::new(),
            tree: Tree::with_capacity(1 << 20),
            pairs: Pairs::with_capacity(1 << 16),
            counters: Default::default(),
            recent_contexts: Box::new([(u32::MAX, 0, 0); MEMO]),
            recent_pairs: Box::new([(u32::MAX, 0, 0); MEMO]),
        }
    }

    /// The shadow bytes of page number `n`.
    #[inline]
    fn page(&mut self, n: u64) -> *mut Page {
        let slot = self.recent[n as usize % RECENT];
        if slot.0 == n {
            return slot.1;
        }
        self.page_from_map(n)
    }

    /// A page not among the recent ones: from the map, made on first use.
    /// Kept out of line: a page built in place takes a 48 KiB stack frame,
    /// whose probing cost every lookup while it was inlined.
    #[cold]
    #[inline(never)]
    fn page_from_map(&mut self, n: u64) -> *mut Page {
        let page = self.pages.entry(n).or_insert_with(|| {
            let zeroed: Box<[Byte]> = vec![Byte::default(); PAGE as usize].into_boxed_slice();
            zeroed.try_into().unwrap_or_else(|_| unreachable!("a page's length"))
        });
        let p = &mut **page as *mut Page;
        self.recent[n as usize % RECENT] = (n, p);
        p
    }

    fn byte(&mut self, a: u64) -> &mut Byte {
        let page = self.page(a / PAGE);
        // SAFETY: `page` points into a boxed page the map owns; pages are
        // never removed, and the box keeps its address when the map grows.
        unsafe { &mut (*page)[(a % PAGE) as usize] }
    }

    /// The shadow bytes of `[addr, addr+len)`, a page's part at a time, each
    /// part given to `f` (with the shadow, to credit pairs).
    fn each_part(&mut self, addr: u64, len: u64, mut f: impl FnMut(&mut Self, &mut [Byte])) {
        let end = addr.saturating_add(len);
        let mut a = addr;
        while a < end {
            let (lo, hi) = ((a % PAGE) as usize, (PAGE as usize).min((a % PAGE + (end - a)) as usize));
            let page = self.page(a / PAGE);
            // SAFETY: `page` points into a boxed page the map owns (as in
            // `byte`); `f` credits pairs and never touches the pages, so
            // these bytes are borrowed once.
            let part = unsafe { &mut (&mut *page)[lo..hi] };
            f(self, part);
            a += (hi - lo) as u64;
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
        let slot = memo_slot(prev, ctx as u64);
        let (w, t, i) = self.recent_pairs[slot];
        let i = if (w, t) == (prev, ctx) {
            i as usize
        } else {
            self.pairs.grow_when_full();
            let Some(i) = self.pairs.find(prev, ctx) else { return };
            self.recent_pairs[slot] = (prev, ctx, i as u32);
            i
        };
        self.pairs.at(i).count_bytes(if waste { Verdict::Waste { bytes: n, approx: false } } else { Verdict::Use { bytes: n } });
    }

    fn add(&mut self, watch: u32, trap: u32, v: Verdict) {
        // A reference must not lose pairs (large programs have millions).
        self.pairs.grow_when_full();
        if let Some(p) = self.pairs.get(watch, trap) {
            p.credit(v, 1.0);
        }
    }

    /// The calling context of the instruction at `pc`: the current frame's
    /// chain of call sites, then `pc`.
    pub fn context(&mut self, pc: u64) -> u32 {
        let slot = memo_slot(self.frame, pc);
        let (frame, at, node) = self.recent_contexts[slot];
        if (frame, at) == (self.frame, pc) {
            return node;
        }
        self.tree.grow_when_full();
        let node = self.tree.child(self.frame, pc);
        if node != self.frame {
            // (A full tree answers with the frame itself: not remembered.)
            self.recent_contexts[slot] = (self.frame, pc, node);
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
                    (Craft::SilentStore, false) => self.silent_store(precision, ctx, o),
                    (Craft::SilentLoad, true) => self.silent_load(precision, ctx, o),
                    _ => {}
                }
            }
        }
    }

    /// Dead craft: `len` bytes at `addr` read. Each byte a store left
    /// pending is used, credited to that store's pair; a run of bytes one
    /// context stored is credited at once (as that many one-byte credits).
    pub fn dead_load(&mut self, ctx: u32, addr: u64, len: u64) {
        let mut run = (0, 0);
        self.each_part(addr, len, |t, bytes| {
            for s in bytes {
                if s.pending {
                    s.pending = false;
                    t.count_runs(ctx, &mut run, s.store_ctx, false);
                }
            }
        });
        self.flush_run(ctx, run, false);
    }

    /// Dead craft: `len` bytes at `addr` written, by one store (a `rep`
    /// string's elements are `elements` stores).
    pub fn dead_store(&mut self, ctx: u32, addr: u64, len: u64) {
        self.dead_stores(ctx, addr, len, 1);
    }

    fn dead_stores(&mut self, ctx: u32, addr: u64, len: u64, elements: u64) {
        let mut run = (0, 0);
        self.each_part(addr, len, |t, bytes| {
            for s in bytes {
                if s.pending {
                    t.count_runs(ctx, &mut run, s.store_ctx, true);
                }
                s.pending = true;
                s.store_ctx = ctx;
            }
        });
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

    fn silent_store(&mut self, precision: f64, ctx: u32, o: &Observed) {
        // Each value: silent if the store left it as it was. Its bytes are
        // credited to their previous stores, each run of bytes one store
        // left judged by itself: the question is whether this store changed
        // what that store wrote.
        let a = o.access;
        let len = (a.len as usize).min(WIDE);
        let el = element_size(&a);
        for off in (0..len).step_by(el) {
            let el = el.min(len - off);
            let mut prevs = [0u32; 8];
            for (b, prev) in prevs.iter_mut().enumerate().take(el) {
                *prev = std::mem::replace(&mut self.byte(a.addr + (off + b) as u64).store_ctx, ctx);
            }
            for (start, n, prev) in runs(&prevs[..el]) {
                if prev == 0 {
                    continue;
                }
                let v = if n == el {
                    judge_element(&a, off, el, &o.before, &o.after, precision)
                } else {
                    judge_bytes(off + start, n, &o.before, &o.after)
                };
                self.add(prev, ctx, with_bytes(v, n));
            }
        }
        self.counters.samples += 1;
    }

    fn silent_load(&mut self, precision: f64, ctx: u32, o: &Observed) {
        // Each value: redundant if it reads what the previous load of it
        // read, whatever stores came between; its bytes credited to their
        // previous loads, as above.
        let a = o.access;
        let len = (a.len as usize).min(WIDE);
        let el = element_size(&a);
        for off in (0..len).step_by(el) {
            let el = el.min(len - off);
            let mut last = [0u8; WIDE];
            let mut prevs = [0u32; 8];
            for (b, prev) in prevs.iter_mut().enumerate().take(el) {
                let s = self.byte(a.addr + (off + b) as u64);
                last[off + b] = s.loaded;
                *prev = s.load_ctx;
                s.loaded = o.before[off + b];
                s.load_ctx = ctx;
            }
            for (start, n, prev) in runs(&prevs[..el]) {
                if prev == 0 {
                    continue;
                }
                let v = if n == el {
                    judge_element(&a, off, el, &last, &o.before, precision)
                } else {
                    judge_bytes(off + start, n, &last, &o.before)
                };
                self.add(prev, ctx, with_bytes(v, n));
            }
        }
        self.counters.samples += 1;
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
