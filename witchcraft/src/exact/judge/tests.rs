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
                let v =
                    if n == el { judge_element(a, off, el, &last, before, precision) } else { judge_bytes(off + start, n, &last, before) };
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

/// Random stores (overlapping, of every width, across a page boundary,
/// integer and float, from a few contexts, some leaving their bytes as
/// they were) judged by the judge and byte by byte (each byte's last
/// store in a map; each value's bytes split into runs of one previous
/// store, each run judged and credited) agree pair by pair, figure by
/// figure.
#[test]
fn silent_stores_are_judged_as_byte_by_byte() {
    use rand::{rngs::SmallRng, RngExt, SeedableRng};
    for (seed, precision) in [(1u64, 0.0), (2, 0.01), (3, 0.5)] {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut t = ThreadShadow::new();
        let mut last: std::collections::HashMap<u64, u32> = Default::default();
        let mut want: std::collections::BTreeMap<(u32, u32), crate::pair::PairEntry> = Default::default();
        let ctxs: Vec<u32> = (0..6).map(|i| t.context(0x100 + i)).collect();
        let floats = [1.0f64, 1.001, 1.5, -2.0];
        for _ in 0..20000 {
            let len = [1u32, 2, 3, 4, 4, 8, 8, 8, 12, 16, 32, 64][rng.random_range(0..12)];
            let float = [Float::No, Float::F32, Float::F64][rng.random_range(0..3)];
            let elem = [0u8, 1, 2, 4, 8][rng.random_range(0..5)];
            let mut addr = 3 * PAGE - 48 + rng.random_range(0..96u64);
            if rng.random_range(0..2) == 0 {
                addr &= !7;
            }
            let a = Access { addr, len, write: true, float, elem, ..Default::default() };
            let value = |rng: &mut SmallRng, v: &mut [u8; WIDE]| match float {
                Float::No => v.iter_mut().for_each(|b| *b = rng.random_range(0..2)),
                Float::F32 => v.chunks_mut(4).for_each(|c| c.copy_from_slice(&(floats[rng.random_range(0..4)] as f32).to_le_bytes())),
                Float::F64 => v.chunks_mut(8).for_each(|c| c.copy_from_slice(&floats[rng.random_range(0..4)].to_le_bytes())),
            };
            let (mut before, mut after) = ([0u8; WIDE], [0u8; WIDE]);
            value(&mut rng, &mut before);
            value(&mut rng, &mut after);
            let ctx = ctxs[rng.random_range(0..ctxs.len())];
            t.judge(Craft::SilentStore, precision, ctx, &[Observed { access: a, before, after }]);
            let n = (len as usize).min(WIDE);
            let el = element_size(&a);
            for off in (0..n).step_by(el) {
                let el = el.min(n - off);
                let prevs: Vec<u32> = (0..el).map(|b| last.insert(addr + (off + b) as u64, ctx).unwrap_or(0)).collect();
                for (start, k, prev) in runs(&prevs) {
                    if prev != 0 {
                        let v = if k == el {
                            judge_element(&a, off, el, &before, &after, precision)
                        } else {
                            judge_bytes(off + start, k, &before, &after)
                        };
                        want.entry((prev, ctx)).or_default().credit(with_bytes(v, k), 1.0);
                    }
                }
            }
        }
        let got = all_figures(t.pairs.iter().map(|p| (&p.watch, &p.trap, p)));
        let want = all_figures(want.iter().map(|((w, t), e)| (w, t, e)));
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

/// Random loads, stores and read-modify-writes (overlapping, of every
/// width, across a page boundary, from a few contexts) judged by the
/// dead craft's judge and byte by byte (DeadSpy's definition: each byte's
/// last store, pending until an access follows it) agree pair by pair,
/// figure by figure.
#[test]
fn dead_bytes_are_judged_as_byte_by_byte() {
    use rand::{rngs::SmallRng, RngExt, SeedableRng};
    for seed in 1..=4u64 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut t = ThreadShadow::new();
        let mut last: std::collections::HashMap<u64, (u32, bool)> = Default::default();
        let mut want: std::collections::BTreeMap<(u32, u32), crate::pair::PairEntry> = Default::default();
        let ctxs: Vec<u32> = (0..5).map(|i| t.context(0x100 + i)).collect();
        for _ in 0..20000 {
            let len = [1u32, 2, 3, 4, 4, 8, 8, 8, 12, 16, 32, 64][rng.random_range(0..12)];
            let mut addr = 3 * PAGE - 40 + rng.random_range(0..80u64);
            if rng.random_range(0..2) == 0 {
                addr &= !7;
            }
            let (read, write) = [(true, false), (false, true), (false, true), (true, true)][rng.random_range(0..4)];
            let ctx = ctxs[rng.random_range(0..ctxs.len())];
            let a = Access { addr, len, read, write, ..Default::default() };
            t.judge(Craft::Dead, 0.0, ctx, &[Observed::new(a)]);
            for at in addr..addr + len as u64 {
                let e = last.entry(at).or_insert((0, false));
                if read && e.1 {
                    want.entry((e.0, ctx)).or_default().credit(Verdict::Use { bytes: 1 }, 1.0);
                    e.1 = false;
                }
                if write {
                    if e.1 {
                        want.entry((e.0, ctx)).or_default().credit(Verdict::Waste { bytes: 1, approx: false }, 1.0);
                    }
                    *e = (ctx, true);
                }
            }
        }
        let got = all_figures(t.pairs.iter().map(|p| (&p.watch, &p.trap, p)));
        let want = all_figures(want.iter().map(|((w, t), e)| (w, t, e)));
        let sum = |k: usize| got.iter().map(|p| p.1[k]).sum::<f64>();
        assert!(sum(0) > 0.0 && sum(2) > 0.0, "seed {seed}: both verdicts");
        assert_eq!(got, want, "seed {seed}: the judge (left) and byte by byte (right)");
    }
}

/// A float element judged directly says what a watched access and
/// `compare` say of it: random pairs of floats (equal, within and beyond
/// the precision, of either sign, zero, infinite and NaN), both widths,
/// four precisions.
#[test]
fn a_float_is_judged_as_compare_judges_it() {
    use rand::{rngs::SmallRng, RngExt, SeedableRng};
    let mut rng = SmallRng::seed_from_u64(7);
    let specials = [0.0f64, -0.0, 1.0, -1.0, 1e-300, f64::INFINITY, f64::NAN, 3.5];
    let mut seen = [0usize; 3];
    for _ in 0..20000 {
        let x = if rng.random_range(0..4) == 0 { specials[rng.random_range(0..specials.len())] } else { rng.random_range(-4.0..4.0) };
        let y = match rng.random_range(0..4) {
            0 => x,
            1 => x * (1.0 + rng.random_range(-0.02..0.02)),
            2 => specials[rng.random_range(0..specials.len())],
            _ => rng.random_range(-4.0..4.0),
        };
        let precision = [0.0, 0.001, 0.01, 0.5][rng.random_range(0..4)];
        for float in [Float::F32, Float::F64] {
            let (mut then, mut now) = ([0u8; WIDE], [0u8; WIDE]);
            let el = if float == Float::F32 { 4 } else { 8 };
            if el == 4 {
                then[8..12].copy_from_slice(&(x as f32).to_le_bytes());
                now[8..12].copy_from_slice(&(y as f32).to_le_bytes());
            } else {
                then[8..16].copy_from_slice(&x.to_le_bytes());
                now[8..16].copy_from_slice(&y.to_le_bytes());
            }
            let a = Access { addr: 0x1000, len: 16, write: true, float, ..Default::default() };
            let got = judge_element(&a, 8, el, &then, &now, precision);
            let want = if then[8..8 + el] == now[8..8 + el] {
                judge_bytes(8, el, &then, &now)
            } else {
                judge_element_watched(&a, 8, el, &then, &now, precision)
            };
            assert_eq!(got, want, "{x} then, {y} now, {float:?}, precision {precision}");
            seen[match got {
                Verdict::Waste { approx: false, .. } => 0,
                Verdict::Waste { approx: true, .. } => 1,
                _ => 2,
            }] += 1;
        }
    }
    assert!(seen.iter().all(|&n| n > 100), "every verdict: {seen:?}");
}
