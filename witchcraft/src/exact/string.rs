//! A `rep` string instruction with values (the value crafts): its
//! elements replayed in order over its ranges' bytes before it ran, so
//! each element sees the bytes the elements before it left (an overlapping
//! copy reads what it wrote), as single steps see them.

use super::judge::{Observed, ThreadShadow, WIDE};
use crate::profile::Craft;
use crate::x86::decode::Access;
use crate::x86::record::{Record, AFTER, DOWN, LEN_MASK, MAX_RECORDS, NONE, READ, WRITE};

/// The memory a `rep` string's elements see as they run: its ranges'
/// bytes before it ran (ranges that overlap, merged), changed by each
/// element's stores.
struct RepMemory {
    parts: Vec<(u64, Vec<u8>)>,
}

impl RepMemory {
    fn new() -> RepMemory {
        RepMemory { parts: Vec::new() }
    }

    /// Add a range (its bytes, or None: not known, only written).
    fn add(&mut self, lo: u64, len: usize, bytes: Option<&[u8]>) {
        let hi = lo.saturating_add(len as u64);
        let over: Vec<usize> =
            (0..self.parts.len()).filter(|&i| self.parts[i].0 < hi && lo < self.parts[i].0 + self.parts[i].1.len() as u64).collect();
        if over.is_empty() {
            if let Some(b) = bytes {
                self.parts.push((lo, b.to_vec()));
            }
            return;
        }
        // Merge the range and every part it overlaps into one.
        let start = over.iter().map(|&i| self.parts[i].0).min().unwrap_or(lo).min(lo);
        let end = over.iter().map(|&i| self.parts[i].0 + self.parts[i].1.len() as u64).max().unwrap_or(hi).max(hi);
        let mut merged = vec![0u8; (end - start) as usize];
        if let Some(b) = bytes {
            merged[(lo - start) as usize..][..b.len()].copy_from_slice(b);
        }
        for &i in &over {
            let (plo, pb) = (&self.parts[i].0, &self.parts[i].1);
            merged[(plo - start) as usize..][..pb.len()].copy_from_slice(pb);
        }
        for &i in over.iter().rev() {
            self.parts.swap_remove(i);
        }
        self.parts.push((start, merged));
    }

    fn at(&mut self, addr: u64, len: usize) -> Option<&mut [u8]> {
        self.parts.iter_mut().find(|(lo, b)| addr >= *lo && addr + len as u64 <= lo + b.len() as u64).map(|(lo, b)| {
            let off = (addr - *lo) as usize;
            &mut b[off..off + len]
        })
    }
}

/// A `rep` string instruction's elements, replayed in order over its
/// ranges' bytes and judged one by one as single steps judge them: each
/// element's loads read the image, its stores overwrite it with the bytes
/// the element loaded (`movs`) or the one it stores from a register
/// (`stos`, its record's after).
pub(super) fn replay(
    craft: Craft,
    precision: f64,
    t: &mut ThreadShadow,
    ctx: u32,
    recs: &[Record],
    range: &[Vec<u8>],
    after: &[[u8; WIDE]],
) -> u64 {
    let count = recs[0].extra;
    let addr = |r: &Record, i: u64| {
        let step = i.wrapping_mul(r.info & LEN_MASK);
        if r.is(DOWN) {
            r.addr.wrapping_sub(step)
        } else {
            r.addr.wrapping_add(step)
        }
    };
    let mut image = RepMemory::new();
    // Known ranges first, so a range only written merges with them.
    for pass in [true, false] {
        for (k, r) in recs.iter().enumerate() {
            let len = r.info & LEN_MASK;
            let bytes = count.saturating_mul(len);
            if r.is(NONE) || bytes == 0 || bytes > usize::MAX as u64 {
                continue;
            }
            let known = range[k].len() as u64 == bytes;
            if known != pass {
                continue;
            }
            let lo = if r.is(DOWN) { r.addr.wrapping_sub(bytes - len) } else { r.addr };
            image.add(lo, bytes as usize, known.then(|| &range[k][..]));
        }
    }
    let mut seen = [Observed::new(Access::default()); MAX_RECORDS];
    for i in 0..count {
        let mut n = 0;
        let mut loaded = [0u8; WIDE];
        // Loads first: a `movs` stores the element it loaded.
        let order = recs.iter().enumerate().filter(|(_, r)| r.is(READ)).chain(recs.iter().enumerate().filter(|(_, r)| !r.is(READ)));
        for (k, r) in order.filter(|(_, r)| !r.is(NONE)) {
            let mut a = r.access();
            a.addr = addr(r, i);
            let len = (a.len as usize).min(WIDE);
            let mut o = Observed::new(a);
            if let Some(b) = image.at(a.addr, len) {
                o.before[..len].copy_from_slice(b);
            }
            if r.is(READ) {
                loaded = o.before;
            }
            if r.is(WRITE) {
                o.after = if r.is(AFTER) { after[k] } else { loaded };
            }
            seen[n] = o;
            n += 1;
        }
        // The element's stores, into the image (after its loads: a
        // `movs` reads its element, then writes it).
        for o in &seen[..n] {
            if o.access.write {
                let len = (o.access.len as usize).min(WIDE);
                if let Some(b) = image.at(o.access.addr, len) {
                    b.copy_from_slice(&o.after[..len]);
                }
            }
        }
        t.judge(craft, precision, ctx, &seen[..n]);
    }
    count.max(1)
}
