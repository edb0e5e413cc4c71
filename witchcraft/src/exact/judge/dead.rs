//! The dead craft's judge (DeadSpy's): a stored byte whose next access (by
//! the same thread) is a store is dead, one whose next access is a load is
//! used. Its shadow ([`DeadPage`]) keeps, for each byte, whether a store
//! left it and no access has followed yet (its *pending* bit) and the
//! context of that store.
//!
//! The pending bits are a bitmap apart from the contexts: most loads read
//! bytes no store left pending (a program reads far more than it writes,
//! and reads what it wrote once), and judging them reads one word of the
//! bitmap instead of four bytes of context per byte read. A program that
//! scans a large input was bound by walking a context a byte for it.

use super::*;

/// The dead craft's shadow of a page of memory.
#[repr(C)]
pub(crate) struct DeadPage {
    /// A bit per byte (bit `i % 64` of word `i / 64` for byte `i`): a
    /// store left it and no access has followed.
    pending: [u64; PAGE as usize / 64],
    /// Per byte: the context of its last store (what a pending byte is
    /// credited to; stale otherwise).
    ctx: [u32; PAGE as usize],
}

impl ShadowPage for DeadPage {
    fn fresh() -> Box<Self> {
        let page = Box::<DeadPage>::new_zeroed();
        // SAFETY: integers, all zero: nothing pending.
        unsafe { page.assume_init() }
    }
}

/// The low `len` bits (1 to 64).
#[inline(always)]
fn mask(len: usize) -> u64 {
    if len >= 64 {
        u64::MAX
    } else {
        (1 << len) - 1
    }
}

/// What the bytes of one access (in one page) hold.
enum Marks {
    /// Nothing pending.
    None,
    /// All pending, from the store of this context.
    AllFrom(u32),
    /// Some pending, or pending from several stores: byte by byte.
    Mixed,
}

impl DeadPage {
    /// The marks of bytes `[lo, lo+n)` (1 to 64, in the page).
    #[inline(always)]
    fn marks(&self, lo: usize, n: usize) -> Marks {
        let bits = self.bits(lo, n);
        if bits == 0 {
            return Marks::None;
        }
        if bits == mask(n) {
            let (first, _, alike) = survey(&self.ctx[lo..lo + n]);
            if alike {
                return Marks::AllFrom(first);
            }
        }
        Marks::Mixed
    }

    /// The pending bits of bytes `[lo, lo+len)` (1 to 64 bytes, in the
    /// page), bit `i` for byte `lo + i`.
    #[inline(always)]
    fn bits(&self, lo: usize, len: usize) -> u64 {
        let (w, s) = (lo / 64, lo % 64);
        let mut b = self.pending[w] >> s;
        if s != 0 && s + len > 64 {
            b |= self.pending[w + 1] << (64 - s);
        }
        b & mask(len)
    }

    /// Set (`on`) or clear the pending bits of bytes `[lo, lo+len)` (as
    /// [`DeadPage::bits`]).
    #[inline(always)]
    fn mark(&mut self, lo: usize, len: usize, on: bool) {
        let (w, s, m) = (lo / 64, lo % 64, mask(len));
        let put = |word: &mut u64, bits: u64| *word = if on { *word | bits } else { *word & !bits };
        put(&mut self.pending[w], m << s);
        if s != 0 && s + len > 64 {
            put(&mut self.pending[w + 1], m >> (64 - s));
        }
    }
}

impl ThreadShadow {
    /// The dead craft's shadow page of `addr`.
    ///
    /// # Safety
    /// As [`Pages::page`]: the page stays where it is for the judge's
    /// life; the caller holds one page at a time and does not keep it past
    /// the access (crediting pairs does not touch the shadow).
    #[inline(always)]
    unsafe fn dead_page<'a>(&mut self, addr: u64) -> &'a mut DeadPage {
        // SAFETY: as the caller promises.
        unsafe { &mut *self.dead.page(addr / PAGE) }
    }

    /// Count the bytes of `bits` (bit `i`: byte `lo + i` of `page`),
    /// pending until this access by `ctx`, to their stores' pairs, in
    /// order: waste for a store, use for a load.
    #[inline(always)]
    fn count_pending(&mut self, ctx: u32, run: &mut (u32, u64), page: &DeadPage, lo: usize, mut bits: u64, waste: bool) {
        while bits != 0 {
            let i = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            self.count_runs(ctx, run, page.ctx[lo + i], waste);
        }
    }

    /// Dead craft: one plain access (a load, a store, or a read-modify-write,
    /// which reads first) of `len` bytes at `addr` by the instruction at
    /// `pc`. A load of bytes no store left pending (most loads) changes
    /// nothing and credits nothing: its context is not even looked up.
    #[inline]
    pub fn dead_access(&mut self, pc: u64, addr: u64, len: u64, read: bool, write: bool) {
        if read && !write && one_step(addr, len) {
            // SAFETY: the page is not used after this line.
            let page = unsafe { self.dead_page(addr) };
            if page.bits((addr % PAGE) as usize, len as usize) == 0 {
                return;
            }
        }
        let ctx = self.context(pc);
        if read {
            self.dead_load(ctx, addr, len);
        }
        if write {
            self.dead_store(ctx, addr, len);
        }
    }

    /// Dead craft: `len` bytes at `addr` read. Each byte a store left
    /// pending is used, credited to that store's pair; a run of bytes one
    /// context stored is credited at once (as that many one-byte credits).
    #[inline]
    pub fn dead_load(&mut self, ctx: u32, addr: u64, len: u64) {
        if one_step(addr, len) {
            // Most loads: a scalar or a vector in one page, whose bytes
            // are all read already or all pending from one store.
            // SAFETY: the page is not used after the credit.
            let page = unsafe { self.dead_page(addr) };
            let (lo, n) = ((addr % PAGE) as usize, len as usize);
            match page.marks(lo, n) {
                Marks::None => return,
                Marks::AllFrom(store) => {
                    page.mark(lo, n, false);
                    self.flush_run(ctx, (store, len), false);
                    return;
                }
                Marks::Mixed => {}
            }
        }
        self.dead_load_bytes(ctx, addr, len);
    }

    /// `dead_load` byte by byte (its pending bits a word at a time).
    #[inline(never)]
    fn dead_load_bytes(&mut self, ctx: u32, addr: u64, len: u64) {
        let mut run = (0, 0);
        let end = addr.saturating_add(len);
        let mut a = addr;
        while a < end {
            let (lo, n) = ((a % PAGE) as usize, (64 - a % 64).min(end - a) as usize);
            // SAFETY: one page at a time; crediting pairs (`count_runs`)
            // does not touch the shadow.
            let page = unsafe { self.dead_page(a) };
            let bits = page.bits(lo, n);
            if bits != 0 {
                page.mark(lo, n, false);
                self.count_pending(ctx, &mut run, page, lo, bits, false);
            }
            a += n as u64;
        }
        self.flush_run(ctx, run, false);
    }

    /// Dead craft: `len` bytes at `addr` written, by one store.
    #[inline]
    pub fn dead_store(&mut self, ctx: u32, addr: u64, len: u64) {
        if one_step(addr, len) {
            // Most stores: a scalar or a vector in one page, over bytes
            // none of which is pending, or all pending from one store.
            // SAFETY: the page is not used after the credit.
            let page = unsafe { self.dead_page(addr) };
            let (lo, n) = ((addr % PAGE) as usize, len as usize);
            match page.marks(lo, n) {
                Marks::None => {
                    page.mark(lo, n, true);
                    page.ctx[lo..lo + n].fill(ctx);
                    self.counters.samples += 1;
                    return;
                }
                Marks::AllFrom(store) => {
                    page.ctx[lo..lo + n].fill(ctx);
                    self.flush_run(ctx, (store, len), true);
                    self.counters.samples += 1;
                    return;
                }
                Marks::Mixed => {}
            }
        }
        self.dead_stores(ctx, addr, len, 1);
    }

    /// `len` bytes at `addr` written by `elements` stores (a `rep` string's).
    #[inline(never)]
    pub(super) fn dead_stores(&mut self, ctx: u32, addr: u64, len: u64, elements: u64) {
        let mut run = (0, 0);
        let end = addr.saturating_add(len);
        let mut a = addr;
        while a < end {
            let (lo, n) = ((a % PAGE) as usize, (64 - a % 64).min(end - a) as usize);
            // SAFETY: as in `dead_load_bytes`.
            let page = unsafe { self.dead_page(a) };
            let bits = page.bits(lo, n);
            self.count_pending(ctx, &mut run, page, lo, bits, true);
            page.mark(lo, n, true);
            page.ctx[lo..lo + n].fill(ctx);
            a += n as u64;
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bitmap's bits at every offset and length within a page, against
    /// a byte array of the same marks.
    #[test]
    fn pending_bits_are_read_and_marked_at_every_offset() {
        let mut page = DeadPage::fresh();
        let mut truth = vec![false; PAGE as usize];
        let mut seed = 0x1234_5678_u64;
        for step in 0..20_000 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let len = 1 + (seed >> 33) as usize % 64;
            let lo = (seed >> 7) as usize % (PAGE as usize - len + 1);
            let want: u64 = (0..len).filter(|&i| truth[lo + i]).map(|i| 1u64 << i).sum::<u64>();
            assert_eq!(page.bits(lo, len), want, "step {step}: {len} bytes at {lo}");
            let on = seed & 1 == 0;
            page.mark(lo, len, on);
            truth[lo..lo + len].fill(on);
        }
        assert_eq!(page.bits(PAGE as usize - 64, 64), (0..64).filter(|&i| truth[PAGE as usize - 64 + i]).map(|i| 1u64 << i).sum::<u64>());
    }
}
