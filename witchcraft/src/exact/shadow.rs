//! Shadow memory: what the exact judge remembers about each byte of the
//! program's memory, a page of entries per page of memory, made on first
//! use and kept for the run (as DeadSpy's and RedSpy's shadows are).
//!
//! Each craft keeps only what it compares: the dead craft one word a byte
//! (the storing context and whether the store is still pending), the silent
//! stores the storing context, the redundant loads a page of their own
//! layout ([`Pages`] of the judge's `LoadPage`: contexts a word at a time
//! where they can be, values apart). A smaller entry is less memory for the
//! judge to walk: the dead craft's run over a 3-D stencil's arrays was
//! bound by it.

use std::collections::HashMap;

pub const PAGE: u64 = 4096;

/// Pages kept at hand: a direct-mapped table of recent page numbers, so a
/// loop over a few arrays and its stack finds each page without hashing.
/// Slots are picked by a multiplicative hash: a 3-D stencil's planes lie a
/// power of two of pages apart, and taken modulo the table they collided.
const RECENT: usize = 512;

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

fn slot(n: u64) -> usize {
    (n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 55) as usize % RECENT
}

/// What a page of shadow holds: made on first use, all zero (every
/// entry "nothing yet").
pub trait ShadowPage {
    fn fresh() -> Box<Self>;
}

/// One entry of type `T` per byte of a page of memory.
#[repr(transparent)]
pub struct Entries<T>([T; PAGE as usize]);

impl<T: Copy + Default> ShadowPage for Entries<T> {
    fn fresh() -> Box<Self> {
        Box::new(Entries([T::default(); PAGE as usize]))
    }
}

/// A page of shadow per page of memory, of any layout.
pub struct Pages<P: ShadowPage> {
    pages: HashMap<u64, Box<P>, std::hash::BuildHasherDefault<PageHasher>>,
    /// Recently used pages: (page number, the page; boxed, so it does not
    /// move when the map grows). `u64::MAX`: empty.
    recent: Box<[(u64, *mut P)]>,
}

// SAFETY: the raw pointers in `recent` point into pages the map owns;
// they move with it and are never shared.
unsafe impl<P: ShadowPage + Send> Send for Pages<P> {}

impl<P: ShadowPage> Default for Pages<P> {
    fn default() -> Self {
        Pages { pages: HashMap::default(), recent: vec![(u64::MAX, std::ptr::null_mut()); RECENT].into_boxed_slice() }
    }
}

impl<P: ShadowPage> Pages<P> {
    /// Page number `n`'s shadow. It stays where it is for the map's life
    /// (pages are never removed, and a box keeps its address when the map
    /// grows); the caller may use it while it uses the rest of the judge,
    /// but not with another pointer to the same page.
    #[inline]
    pub fn page(&mut self, n: u64) -> *mut P {
        let (at, p) = self.recent[slot(n)];
        if at == n {
            return p;
        }
        self.page_from_map(n)
    }

    /// A page not among the recent ones: from the map, made on first use.
    /// Out of line: it is rare, and its allocation need not weigh on the
    /// lookup's code.
    #[cold]
    #[inline(never)]
    fn page_from_map(&mut self, n: u64) -> *mut P {
        let page = self.pages.entry(n).or_insert_with(P::fresh);
        let p: *mut P = &mut **page;
        self.recent[slot(n)] = (n, p);
        p
    }
}

/// One entry of type `T` per byte of memory.
#[derive(Default)]
pub struct Shadow<T: Copy + Default>(Pages<Entries<T>>);

impl<T: Copy + Default> Shadow<T> {
    /// The first entry of page number `n`.
    #[inline]
    fn page(&mut self, n: u64) -> *mut T {
        // (`Entries` is its array: its first entry is the page's address.)
        self.0.page(n).cast()
    }

    /// The entry of the byte at `a` (the judge walks ranges with
    /// [`Shadow::part`]).
    #[cfg(test)]
    pub fn byte(&mut self, a: u64) -> &mut T {
        let page = self.page(a / PAGE);
        // SAFETY: `page` is the first of a boxed page's PAGE entries, which
        // the map owns; pages are never removed, and a box keeps its address
        // when the map grows. The borrow of `self` covers the entry's use.
        unsafe { &mut *page.add((a % PAGE) as usize) }
    }

    /// The entries of `[a, end)` that lie in `a`'s page: where they start,
    /// and how many. The caller walks a range a page at a time with it, and
    /// may use the entries while it uses the rest of the judge (see
    /// [`Shadow::entries`]).
    pub fn part(&mut self, a: u64, end: u64) -> (*mut T, usize) {
        let lo = a % PAGE;
        let n = (PAGE - lo).min(end - a) as usize;
        let page = self.page(a / PAGE);
        // SAFETY: `lo` < PAGE: within the page's entries.
        (unsafe { page.add(lo as usize) }, n)
    }

    /// The entries [`Shadow::part`] gave, as a slice.
    ///
    /// # Safety
    /// `part` must come from this shadow, which must be alive and not given
    /// another borrow of the same entries while the slice is in use (the
    /// judge holds one part at a time, and crediting pairs never touches the
    /// shadow).
    pub unsafe fn entries<'a>(part: (*mut T, usize)) -> &'a mut [T] {
        // SAFETY: as the caller promises; the entries lie in one boxed page.
        unsafe { std::slice::from_raw_parts_mut(part.0, part.1) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_walked_a_page_at_a_time_and_entries_persist() {
        let mut s: Shadow<u32> = Shadow::default();
        let (start, end) = (3 * PAGE - 5, 3 * PAGE + 7);
        let mut a = start;
        let mut parts = vec![];
        while a < end {
            let part = s.part(a, end);
            // SAFETY: from `s`, used before the next part.
            for (i, e) in unsafe { Shadow::entries(part) }.iter_mut().enumerate() {
                *e = (a + i as u64) as u32;
            }
            parts.push(part.1);
            a += part.1 as u64;
        }
        assert_eq!(parts, vec![5, 7]);
        // Many other pages in between (every recent slot taken over).
        for p in 0..4 * RECENT as u64 {
            *s.byte((100 + p) * PAGE) = 1;
        }
        for a in start..end {
            assert_eq!(*s.byte(a), a as u32);
        }
        assert_eq!(*s.byte(7 * PAGE), 0, "a fresh page is zero");
    }
}
