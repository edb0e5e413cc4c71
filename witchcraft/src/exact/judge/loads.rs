//! The redundant loads' judge (LoadSpy's): the shadow of the last load of
//! each byte, and the paths that judge a load against it a word, a value
//! or a byte at a time.

use super::*;

/// What the redundant loads' shadow remembers about a page of memory:
/// for each byte, the context node of the last load of it (0: none yet)
/// and the byte that load read (the silent stores' shadow is the context
/// of the last store, a word a byte; the dead craft's a pending bit and a
/// context a byte, [`super::dead::DeadPage`]). The contexts are kept a word (8 aligned bytes) at a time
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

impl ShadowPage for LoadPage {
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

impl ThreadShadow {
    pub(super) fn silent_load(&mut self, precision: f64, ctx: u32, a: &Access, before: &[u8]) {
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
            } else if len < 8 && lo / 8 == (lo + len - 1) / 8 && element_size(a) == len {
                // One value within a word (a byte, a character, an int).
                self.loaded_in_word(precision, ctx, a, before, page, lo, len);
            } else if a.float == Float::F32 && (lo | len).is_multiple_of(8) && self.loaded_alike(precision, ctx, before, page, lo, len) {
                // Whole words of single floats that one load read last
                // (a vector loop over an array it read before): judged.
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

    /// A load of one value of `len` bytes (1 to 7) at `lo` in `page`, within
    /// one word (see [`ThreadShadow::loaded`]): judged against the word's
    /// context when one load read all its bytes last, and the word kept
    /// whole when that load was of the same context (a loop reading a
    /// buffer byte by byte leaves it so).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn loaded_in_word(&mut self, precision: f64, ctx: u32, a: &Access, before: &[u8], page: &mut LoadPage, lo: usize, len: usize) {
        let w = lo / 8;
        let word = page.word[w];
        let values = &mut page.value[lo..lo + len];
        if word != SPLIT {
            if word != 0 {
                let v = judge_value(a, 0, len, values, before, precision);
                self.add(word, ctx, v);
            }
            if word != ctx {
                page.ctx[8 * w..8 * w + 8].fill(word);
                page.ctx[lo..lo + len].fill(ctx);
                page.word[w] = SPLIT;
            }
            values.copy_from_slice(&before[..len]);
        } else {
            // Its bytes' contexts one by one, as any value's.
            self.loaded_bytes(precision, ctx, a, 0, len, before, &mut page.ctx[lo..lo + len], values);
            if page.ctx[8 * w..8 * w + 8].iter().all(|&c| c == ctx) {
                page.word[w] = ctx;
            }
        }
    }

    /// A load of single floats over whole words `[lo, lo+len)` of `page`,
    /// if one load read all their bytes last (false, and nothing done,
    /// otherwise): each float judged as [`judge_value`] judges it, and
    /// that load's pair credited once per verdict, with as many credits as
    /// floats (the same figures as a credit per float: sums of whole
    /// numbers).
    fn loaded_alike(&mut self, precision: f64, ctx: u32, before: &[u8], page: &mut LoadPage, lo: usize, len: usize) -> bool {
        let words = &mut page.word[lo / 8..(lo + len) / 8];
        let prev = words[0];
        if prev == SPLIT || words.iter().any(|&w| w != prev) {
            return false;
        }
        words.fill(ctx);
        let values = &mut page.value[lo..lo + len];
        if prev != 0 {
            self.credit_tally(prev, ctx, 4, tally(values, &before[..len], 4, precision > 0.0, precision));
        }
        values.copy_from_slice(&before[..len]);
        true
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
        self.credit_tally(prev, ctx, size, Tally { unchanged: same, near: 0, changed });
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
