//! Judging recorded accesses: the code-cache exact mode's side of the
//! judge. Recording copies (and the engine, for what runs outside the
//! cache) write access records ([`crate::x86::record`]) per thread, in the
//! order the thread made them; this turns each thread's stream back into
//! instructions (the records of one instruction are grouped by their
//! [`MORE`] flags), judges them with the same [`ThreadShadow`] the
//! single-stepping mode uses, and follows calls and returns for the shadow
//! call stack. A `rep` string record stands for its elements, judged one
//! by one as single steps see them (a `movs` reads an element, then writes
//! one).
//!
//! The dead craft's records carry addresses only. The value crafts'
//! records carry the bytes they compare (what a load read, what a store
//! overwrote and left); a `rep` string's carry its ranges' bytes before it
//! ran, and its elements are replayed in order over them, so each element
//! sees the bytes the elements before it left (an overlapping copy reads
//! what it wrote), as single steps see them.

use super::judge::{ThreadShadow, WIDE};
use crate::profile::Craft;
use crate::x86::decode::{Access, MAX_ACCESSES};
use crate::x86::record::{parse_valued, Record, Valued, CALL, DOWN, LEN_MASK, MAX_RECORDS, MORE, NONE, READ, REP, RET, WRITE};
use std::collections::HashMap;

/// One instruction's records, gathered until its last.
#[derive(Default)]
struct Group {
    records: [Record; MAX_ACCESSES],
    n: usize,
}

/// A value craft's instruction whose records are not all in: its context,
/// its records (for its calls and returns, followed once its last is in),
/// and for a `rep` string, its ranges' bytes before it ran and what it
/// stores from a register (its elements are judged once all are in).
struct ValuedGroup {
    ctx: u32,
    records: [Record; MAX_RECORDS],
    range: [Vec<u8>; MAX_RECORDS],
    after: [[u8; WIDE]; MAX_RECORDS],
    n: usize,
}

impl Default for ValuedGroup {
    fn default() -> Self {
        ValuedGroup { ctx: 0, records: [Record::default(); MAX_RECORDS], range: Default::default(), after: [[0; WIDE]; MAX_RECORDS], n: 0 }
    }
}

impl ValuedGroup {
    /// Keep a `rep` string record with its values.
    fn put_string(&mut self, v: &Valued) {
        let k = self.n;
        self.records[k] = v.record;
        self.range[k].clear();
        self.range[k].extend_from_slice(v.before);
        let a = v.after.len().min(WIDE);
        self.after[k][..a].copy_from_slice(&v.after[..a]);
        self.n += 1;
    }

    /// The instruction is all in (or cut short): judge a `rep` string's
    /// elements, follow calls and returns; the instructions it stands for.
    fn finish(&mut self, craft: Craft, precision: f64, t: &mut ThreadShadow) -> u64 {
        let recs = &self.records[..self.n];
        let done = match recs.first() {
            None => 0,
            Some(first) if first.is(REP) => super::string::replay(craft, precision, t, self.ctx, recs, &self.range, &self.after),
            Some(_) => {
                transfers(t, recs);
                1
            }
        };
        self.n = 0;
        done
    }
}

/// Per thread: its shadow, and an instruction whose records are not all in.
#[derive(Default)]
struct Stream {
    shadow: ThreadShadow,
    group: Group,
    valued: ValuedGroup,
}

pub struct Replay {
    craft: Craft,
    precision: f64,
    threads: HashMap<i32, Stream>,
    /// Instructions judged (a `rep` string's elements each count).
    pub instructions: u64,
    /// Records judged.
    pub records: u64,
}

impl Replay {
    /// A replay for `craft`, floating-point values equal within `precision`.
    pub fn new(craft: Craft, precision: f64) -> Replay {
        Replay { craft, precision, threads: HashMap::new(), instructions: 0, records: 0 }
    }

    /// Judge thread `tid`'s next records (the dead craft's, without
    /// values), in the order it made them.
    pub fn feed(&mut self, tid: i32, records: impl IntoIterator<Item = Record>) {
        let s = self.threads.entry(tid).or_default();
        for r in records {
            let g = &mut s.group;
            if g.n == 0 && r.info & (REP | NONE | MORE | CALL | RET) == 0 {
                // Most instructions: one plain access, judged as
                // `instruction` would judge it, without gathering it.
                s.shadow.dead_access(r.pc, r.addr, r.info & LEN_MASK, r.info & READ != 0, r.info & WRITE != 0);
                self.instructions += 1;
                continue;
            }
            if g.n == MAX_ACCESSES || (g.n > 0 && g.records[0].pc != r.pc) {
                // A group cut short (never expected): judge what came.
                self.instructions += instruction(&mut s.shadow, &g.records[..g.n]);
                g.n = 0;
            }
            g.records[g.n] = r;
            g.n += 1;
            if !r.is(MORE) {
                self.instructions += instruction(&mut s.shadow, &g.records[..g.n]);
                g.n = 0;
            }
        }
    }

    /// Judge thread `tid`'s next records with their values (a value
    /// craft's stream, `body` of a datagram). A value craft records one
    /// kind of access, so the order of an instruction's records does not
    /// matter: each access is judged as it comes, straight from the
    /// datagram, and the instruction's call or return follows its last
    /// record. A `rep` string's records are gathered, its elements judged
    /// in order once all are in. False if a record was cut short or
    /// lacked its bytes (the rest is left out).
    pub fn feed_valued(&mut self, tid: i32, body: &[u8]) -> bool {
        let (craft, precision) = (self.craft, self.precision);
        let s = self.threads.entry(tid).or_default();
        for v in parse_valued(body) {
            let Some(v) = v else { return false };
            self.records += 1;
            let (r, g) = (v.record, &mut s.valued);
            if g.n == 0 && r.info & (REP | NONE | MORE | CALL | RET) == 0 {
                // Most instructions: one access, no call or return; judged
                // as the group below would judge it, without gathering it.
                let a = r.access();
                let need = crate::x86::record::value_len(a.len as usize);
                if v.before.len() < need || (craft == Craft::SilentStore && a.write && v.after.len() < need) {
                    return false;
                }
                let ctx = s.shadow.context(r.pc);
                s.shadow.judge_value(craft, precision, ctx, &a, v.before, v.after);
                self.instructions += 1;
                continue;
            }
            if g.n == MAX_RECORDS || (g.n > 0 && g.records[0].pc != r.pc) {
                // An instruction cut short (never expected): finish it.
                self.instructions += g.finish(craft, precision, &mut s.shadow);
            }
            if g.n == 0 {
                g.ctx = s.shadow.context(r.pc);
            }
            if r.is(REP) {
                g.put_string(&v);
            } else {
                if !r.is(NONE) {
                    let a = r.access();
                    let need = crate::x86::record::value_len(a.len as usize);
                    if v.before.len() < need || (craft == Craft::SilentStore && a.write && v.after.len() < need) {
                        return false;
                    }
                    s.shadow.judge_value(craft, precision, g.ctx, &a, v.before, v.after);
                }
                g.records[g.n] = r;
                g.n += 1;
            }
            if !r.is(MORE) {
                self.instructions += g.finish(craft, precision, &mut s.shadow);
            }
        }
        true
    }

    /// The threads' shadows, once every record is in.
    pub fn into_threads(self) -> impl Iterator<Item = (i32, ThreadShadow)> {
        self.threads.into_iter().map(|(tid, s)| (tid, s.shadow))
    }
}

/// Follow the calls and returns among an instruction's records.
fn transfers(t: &mut ThreadShadow, recs: &[Record]) {
    for r in recs {
        if r.is(CALL) {
            t.call(r.extra);
        } else if r.is(RET) {
            t.ret(r.extra);
        }
    }
}

/// Judge one instruction's records (the dead craft's); returns the
/// instructions it stands for.
fn instruction(t: &mut ThreadShadow, recs: &[Record]) -> u64 {
    let Some(first) = recs.first() else { return 0 };
    if recs.len() == 1 && first.info & (REP | CALL | RET | NONE) == 0 {
        // Most instructions: one plain access (a read-modify-write reads first).
        t.dead_access(first.pc, first.addr, first.info & LEN_MASK, first.info & READ != 0, first.info & WRITE != 0);
        return 1;
    }
    let ctx = t.context(first.pc);
    if first.is(REP) {
        let count = first.extra;
        if dead_string(t, ctx, recs, count) {
            return count.max(1);
        }
        // Element by element, every record's element i together.
        for i in 0..count {
            let element = recs.iter().filter(|r| !r.is(NONE)).map(|r| {
                let mut a = r.access();
                let step = i * a.len as u64;
                a.addr = if r.is(DOWN) { r.addr.wrapping_sub(step) } else { r.addr.wrapping_add(step) };
                a
            });
            judge(t, ctx, element);
        }
        return count.max(1);
    }
    judge(t, ctx, recs.iter().filter(|r| !r.is(NONE)).map(|r| r.access()));
    transfers(t, recs);
    1
}

/// Judge one instruction's (or one string element's) accesses: addresses
/// are all the dead craft needs. Loads first (a read-modify-write reads
/// before it writes).
fn judge(t: &mut ThreadShadow, ctx: u32, accesses: impl Iterator<Item = Access> + Clone) {
    for a in accesses.clone().filter(|a| a.read) {
        t.dead_load(ctx, a.addr, a.len as u64);
    }
    for a in accesses.filter(|a| a.write) {
        t.dead_store(ctx, a.addr, a.len as u64);
    }
}

/// A `rep` string instruction's elements judged a range at a time, when no
/// range it writes overlaps another it reads or writes (a `rep stos`, a
/// `rep movs` between distinct buffers): then the order of its elements
/// cannot change a dead verdict. False (nothing judged) otherwise, for the
/// element-by-element path (an overlapping `memmove`-like copy).
fn dead_string(t: &mut ThreadShadow, ctx: u32, recs: &[Record], count: u64) -> bool {
    let mut ranges = [(0u64, 0u64, false); MAX_ACCESSES];
    let mut n = 0;
    for r in recs.iter().filter(|r| !r.is(NONE)).take(MAX_ACCESSES) {
        let a = r.access();
        let Some(bytes) = count.checked_mul(a.len as u64) else { return false };
        let span = bytes.saturating_sub(a.len as u64);
        let lo = if r.is(DOWN) { r.addr.checked_sub(span) } else { Some(r.addr) };
        let Some(lo) = lo.filter(|lo| lo.checked_add(bytes).is_some()) else { return false };
        if a.read && a.write {
            return false;
        }
        ranges[n] = (lo, bytes, a.write);
        n += 1;
    }
    let ranges = &ranges[..n];
    for (i, x) in ranges.iter().enumerate() {
        for y in &ranges[i + 1..] {
            if (x.2 || y.2) && x.0 < y.0 + y.1 && y.0 < x.0 + x.1 {
                return false;
            }
        }
    }
    let mut reads = [(0u64, 0u64); MAX_ACCESSES];
    let mut writes = [(0u64, 0u64); MAX_ACCESSES];
    let (mut nr, mut nw) = (0, 0);
    for &(lo, bytes, write) in ranges {
        if write {
            writes[nw] = (lo, bytes);
            nw += 1;
        } else {
            reads[nr] = (lo, bytes);
            nr += 1;
        }
    }
    t.dead_string(ctx, &reads[..nr], &writes[..nw], count);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::x86::record::info;

    fn rec(pc: u64, addr: u64, len: u32, read: bool, write: bool) -> Record {
        Record { addr, pc, info: info(&Access { addr, len, read, write, ..Default::default() }), extra: 0 }
    }

    /// (watch pc, trap pc) → (waste, use), over every thread.
    fn pairs(r: Replay) -> Vec<((u64, u64), (f64, f64))> {
        let mut v = Vec::new();
        for (_, t) in r.into_threads() {
            let pc = |n: u32| t.tree.nodes()[n as usize].pc;
            v.extend(t.pairs.iter().map(|p| ((pc(p.watch), pc(p.trap)), (p.waste, p.used))));
        }
        v.sort_by_key(|a| a.0);
        v
    }

    #[test]
    fn records_are_judged_as_the_steps_would_be() {
        let mut r = Replay::new(Craft::Dead, 0.0);
        // Two threads interleaved: each judged by itself.
        r.feed(1, [rec(0x10, 0x1000, 8, false, true)]);
        r.feed(2, [rec(0x10, 0x1000, 8, false, true)]);
        r.feed(1, [rec(0x20, 0x1000, 8, false, true)]);
        r.feed(2, [rec(0x30, 0x1000, 4, true, false)]);
        assert_eq!(pairs(r), vec![((0x10, 0x20), (8.0, 0.0)), ((0x10, 0x30), (0.0, 4.0))]);
    }

    #[test]
    fn a_rep_string_is_judged_element_by_element() {
        let mut r = Replay::new(Craft::Dead, 0.0);
        // rep movsq of 3 elements from 0x2000 to 0x2008 (overlapping:
        // each element read was written by the element before).
        let mut src = rec(0x40, 0x2000, 8, true, false);
        let mut dst = rec(0x40, 0x2008, 8, false, true);
        src.info |= REP | MORE;
        dst.info |= REP;
        src.extra = 3;
        dst.extra = 3;
        r.feed(1, [rec(0x30, 0x2000, 8, false, true), src, dst]);
        assert_eq!(r.instructions, 4);
        // 0x2000 stored by 0x30 and read by the first element; 0x2008 and
        // 0x2010 stored by the rep and read by its next element.
        assert_eq!(pairs(r), vec![((0x30, 0x40), (0.0, 8.0)), ((0x40, 0x40), (0.0, 16.0))]);
    }

    /// (watch pc, trap pc) → waste, use, traps, sum of squares of waste.
    type FiguresByPair = Vec<((u64, u64), [u64; 4])>;

    /// Every pair's figures, traps included, and the stores counted.
    fn figures(r: Replay) -> (FiguresByPair, u64) {
        let mut v = Vec::new();
        let mut stores = 0;
        for (_, t) in r.into_threads() {
            let pc = |n: u32| t.tree.nodes()[n as usize].pc;
            v.extend(t.pairs.iter().map(|p| ((pc(p.watch), pc(p.trap)), [p.waste as u64, p.used as u64, p.traps, p.waste_sq as u64])));
            stores += t.counters.samples;
        }
        v.sort();
        (v, stores)
    }

    #[test]
    fn a_string_between_distinct_buffers_is_judged_as_its_elements_would_be() {
        // Stores before it: 0x30 fills both buffers (partly: the last
        // element's bytes are fresh), 0x50 reads part of what it leaves.
        let setup = || vec![rec(0x30, 0x2000, 32, false, true), rec(0x31, 0x3000 - 40, 24, false, true)];
        let after = || vec![rec(0x50, 0x3000 - 16, 8, true, false), rec(0x60, 0x3000 - 40, 40, false, true)];
        for down in [false, true] {
            // rep movsq of 5 elements from 0x2000.. to 0x3000-40..: the
            // source and destination apart.
            let (src0, dst0) = if down { (0x2000 + 32, 0x3000 - 8) } else { (0x2000, 0x3000 - 40) };
            let mut src = rec(0x40, src0, 8, true, false);
            let mut dst = rec(0x40, dst0, 8, false, true);
            src.info |= REP | MORE;
            dst.info |= REP;
            if down {
                src.info |= DOWN;
                dst.info |= DOWN;
            }
            src.extra = 5;
            dst.extra = 5;
            let mut whole = Replay::new(Craft::Dead, 0.0);
            whole.feed(1, setup().into_iter().chain([src, dst]).chain(after()));
            // The same elements, one instruction each.
            let mut each = Replay::new(Craft::Dead, 0.0);
            let mut recs = setup();
            for i in 0..5u64 {
                let step = |a: u64| if down { a - 8 * i } else { a + 8 * i };
                let mut s = rec(0x40, step(src0), 8, true, false);
                s.info |= MORE;
                recs.extend([s, rec(0x40, step(dst0), 8, false, true)]);
            }
            each.feed(1, recs.into_iter().chain(after()));
            assert_eq!(whole.instructions, each.instructions, "down {down}");
            let (w, e) = (figures(whole), figures(each));
            assert!(w.0.iter().any(|p| p.1[0] > 0) && w.0.iter().any(|p| p.1[1] > 0), "both verdicts: {w:?}");
            assert_eq!(w, e, "down {down}");
        }
    }

    #[test]
    fn calls_and_returns_give_contexts() {
        let mut r = Replay::new(Craft::Dead, 0.0);
        let mut call = rec(0x10, 0x7ff8, 8, false, true);
        call.info |= CALL;
        call.extra = 0x15;
        let mut ret = rec(0x100, 0x7ff8, 8, true, false);
        ret.info |= RET;
        ret.extra = 0x15;
        r.feed(1, [call, rec(0x90, 0x3000, 8, false, true), ret, rec(0x18, 0x3000, 8, false, true)]);
        let (_, t) = r.into_threads().next().unwrap();
        let p = t.pairs.iter().find(|p| p.waste > 0.0).unwrap();
        let n = t.tree.nodes();
        // The killed store ran in the callee: its node's parent is the call site.
        assert_eq!(n[p.watch as usize].pc, 0x90);
        assert_eq!(n[n[p.watch as usize].parent as usize].pc, 0x14);
        // The killer ran after the return, in the caller's frame (the root).
        assert_eq!(n[p.trap as usize].parent, crate::context::ROOT);
    }

    /// A value record's bytes: the record, then its values padded to words.
    fn valued(r: Record, before: &[u8], after: &[u8]) -> Vec<u8> {
        let mut b: Vec<u8> = r.to_words().iter().flat_map(|w| w.to_le_bytes()).collect();
        for v in [before, after] {
            b.extend_from_slice(v);
            b.resize(b.len().div_ceil(8) * 8, 0);
        }
        b
    }

    /// An overlapping forward `rep movsb` (a shift by one, each element
    /// loading the byte the one before it stored) and a `rep stosw`,
    /// recorded whole with their ranges' bytes before, are judged as their
    /// elements would be, one instruction each with the bytes each saw.
    #[test]
    fn a_string_with_values_is_replayed_element_by_element() {
        use crate::x86::record::{AFTER, BEFORE};
        let mem = [7u8, 7, 3, 7, 9, 9, 9, 9, 1, 2, 3, 4];
        let base = 0x5000u64;
        // Earlier stores and loads of every byte, so each element has a pair.
        let setup = |craft: Craft| {
            let mut v = Vec::new();
            for (i, b) in mem.iter().enumerate() {
                let a = base + i as u64;
                let write = craft == Craft::SilentStore;
                let mut r = rec(0x30, a, 1, !write, write);
                r.info |= BEFORE | if write { AFTER } else { 0 };
                let one = [*b];
                v.extend(valued(r, &one, if write { &one[..] } else { &[] }));
            }
            v
        };
        for craft in [Craft::SilentStore, Craft::SilentLoad] {
            let kind = crate::x86::record::RecordKind::of(craft);
            // rep movsb, 6 elements, from base to base + 1; then rep stosw,
            // 2 elements of 0x0909 at base + 8.
            let mut whole = setup(craft);
            let mut src = rec(0x40, base, 1, true, false);
            let mut dst = rec(0x40, base + 1, 1, false, true);
            src.info |= REP | MORE | BEFORE;
            dst.info |= REP | if kind == crate::x86::record::RecordKind::StoreValues { BEFORE } else { 0 };
            src.extra = 6;
            dst.extra = 6;
            whole.extend(valued(src, &mem[..6], &[]));
            whole.extend(valued(dst, if dst.is(BEFORE) { &mem[1..7] } else { &[] }, &[]));
            if craft == Craft::SilentStore {
                let mut stos = rec(0x50, base + 8, 2, false, true);
                stos.info |= REP | BEFORE | AFTER;
                stos.extra = 2;
                whole.extend(valued(stos, &mem[8..12], &[9, 9]));
            }
            // The same, element by element, on a copy of memory.
            let mut each = setup(craft);
            let mut m = mem;
            for i in 0..6 {
                let v = m[i];
                let mut s = rec(0x40, base + i as u64, 1, true, false);
                s.info |= MORE | BEFORE;
                let mut d = rec(0x40, base + 1 + i as u64, 1, false, true);
                d.info |= BEFORE | AFTER;
                if craft == Craft::SilentLoad {
                    d = Record { addr: 0, pc: 0x40, info: crate::x86::record::NONE, extra: 0 };
                }
                each.extend(valued(s, &[v], &[]));
                each.extend(if d.is(NONE) { valued(d, &[], &[]) } else { valued(d, &[m[i + 1]], &[v]) });
                m[i + 1] = v;
            }
            if craft == Craft::SilentStore {
                for i in 0..2 {
                    let mut d = rec(0x50, base + 8 + 2 * i, 2, false, true);
                    d.info |= BEFORE | AFTER;
                    let at = 8 + 2 * i as usize;
                    each.extend(valued(d, &m[at..at + 2], &[9, 9]));
                }
            }
            let (mut a, mut b) = (Replay::new(craft, 0.0), Replay::new(craft, 0.0));
            assert!(a.feed_valued(1, &whole) && b.feed_valued(1, &each));
            let figures = |r: Replay| {
                let mut v = Vec::new();
                for (_, t) in r.into_threads() {
                    let pc = |n: u32| t.tree.nodes()[n as usize].pc;
                    v.extend(t.pairs.iter().map(|p| ((pc(p.watch), pc(p.trap)), (p.waste, p.used, p.traps))));
                }
                v.sort_by_key(|x| x.0);
                v
            };
            let (fa, fb) = (figures(a), figures(b));
            assert!(fa.iter().any(|p| p.1 .0 > 0.0) && fa.iter().any(|p| p.1 .1 > 0.0), "{craft:?}: both verdicts: {fa:?}");
            assert_eq!(fa, fb, "{craft:?}: whole (left) and element by element (right)");
        }
    }

    #[test]
    fn a_record_cut_short_is_malformed() {
        let mut r = rec(0x10, 0x1000, 8, true, false);
        r.info |= crate::x86::record::BEFORE;
        let b = valued(r, &[1; 8], &[]);
        let mut replay = Replay::new(Craft::SilentLoad, 0.0);
        assert!(replay.feed_valued(1, &b));
        assert!(!replay.feed_valued(1, &b[..b.len() - 8]));
        assert_eq!(replay.records, 1);
    }
}
