//! Pair merging: every raw pair (any thread) whose two contexts symbolize to
//! the same source-level contexts folds into one, since threads keep separate
//! context trees.

use super::context::{CtxId, FrameId, Interner, KeyCtx, EMPTY};
use super::interval::Sums;
use super::{counters, objects, Process};
use crate::symbolize::{Modules, Symbolizer};
use std::collections::HashMap;
use witchcraft::profile::{Profile, Thread};

/// A pair at source level.
#[derive(Debug, Clone, PartialEq)]
pub struct SymPair {
    /// The contexts as the first raw pair merged here went through them.
    pub watch: CtxId,
    pub trap: CtxId,
    /// Its identity: the two contexts by frame identity.
    pub key: (KeyCtx, KeyCtx),
    /// Waste (exact plus approximate), use, their squares and the traps.
    pub sums: Sums,
    pub approx_waste: f64,
    /// Its credits by data object: (index in the process's `objects`, sums).
    pub objects: Vec<(usize, Sums)>,
}

impl SymPair {
    /// The object that holds most of its waste (else most of its use).
    pub fn object(&self) -> Option<usize> {
        let key = |s: &Sums| (s.waste, s.r#use);
        self.objects.iter().max_by(|a, b| key(&a.1).partial_cmp(&key(&b.1)).unwrap_or(std::cmp::Ordering::Equal)).map(|o| o.0)
    }
}

impl SymPair {
    pub fn waste(&self) -> f64 {
        self.sums.waste
    }
    pub fn used(&self) -> f64 {
        self.sums.r#use
    }
    pub fn traps(&self) -> u64 {
        self.sums.traps
    }
}

/// Deepest context followed from a node to the root; deeper is cut (a
/// corrupt parent chain ends here too).
const MAX_DEPTH: usize = 4096;
const UNKNOWN: CtxId = CtxId::MAX;
const VISITING: CtxId = CtxId::MAX - 1;

/// Context ids of a thread's tree nodes, each computed once from its parent's.
fn contexts(
    t: &Thread,
    frames_of: &mut impl FnMut(u64, &mut Symbolizer, &mut Interner) -> Box<[FrameId]>,
    sym: &mut Symbolizer,
    names: &mut Interner,
) -> Vec<CtxId> {
    let mut ctx = vec![UNKNOWN; t.nodes.len()];
    if !ctx.is_empty() {
        ctx[0] = EMPTY;
    }
    let mut path = Vec::new();
    for start in 0..t.nodes.len() {
        // Walk up to a node already known, then come back down.
        let mut n = start;
        while ctx[n] == UNKNOWN && path.len() < MAX_DEPTH {
            ctx[n] = VISITING;
            path.push(n);
            n = t.nodes[n].parent as usize;
        }
        let mut outer = match ctx[n] {
            VISITING | UNKNOWN => EMPTY, // a cycle, or too deep: start from the root
            c => c,
        };
        while let Some(m) = path.pop() {
            let frames = frames_of(t.nodes[m].pc, sym, names);
            for &f in frames.iter().rev() {
                outer = names.push(outer, f);
            }
            ctx[m] = outer;
        }
    }
    ctx
}

/// Symbolizes and merges one process's pairs.
pub fn analyse<'p>(p: &'p Profile, sym: &mut Symbolizer, names: &mut Interner) -> Process<'p> {
    let modules = Modules::new(&p.modules);
    let mut addrs: HashMap<u64, Box<[FrameId]>> = HashMap::new();
    let mut frames_of = |pc: u64, sym: &mut Symbolizer, names: &mut Interner| -> Box<[FrameId]> {
        addrs.entry(pc).or_insert_with(|| sym.frames(&modules, pc).into_iter().map(|f| names.frame(f)).collect()).clone()
    };
    let mut resolver = objects::Resolver::new(p);
    let mut objects: Vec<objects::Object> = Vec::new();
    let mut object_index: HashMap<String, usize> = HashMap::new();
    let mut raw_objects = Vec::with_capacity(p.threads.len());
    let mut index: HashMap<(KeyCtx, KeyCtx), usize> = HashMap::new();
    let exhaustive = p.sampler.kind.is_exhaustive();
    let mut total = Sums::default().counted(exhaustive);
    let mut out: Vec<SymPair> = Vec::new();
    for t in &p.threads {
        // The thread's own per-cluster sums over all its pairs (adding up
        // the pairs' sums would leave out what they share in a cluster).
        total.run.add(&t.clusters);
        let ctx = contexts(t, &mut frames_of, sym, names);
        for raw in &t.pairs {
            let (watch, trap) = (ctx[raw.watch as usize], ctx[raw.trap as usize]);
            let key = (names.key(watch), names.key(trap));
            let sums = Sums::of_pair(raw).counted(exhaustive);
            total.add(&sums);
            match index.get(&key) {
                Some(&i) => {
                    let o = &mut out[i];
                    o.sums.add(&sums);
                    o.approx_waste += raw.approx_waste;
                }
                None => {
                    index.insert(key, out.len());
                    out.push(SymPair { watch, trap, key, sums, approx_waste: raw.approx_waste, objects: Vec::new() });
                }
            }
        }
        let mut raw_of_thread = Vec::with_capacity(t.objects.len());
        for raw in &t.objects {
            let (watch, trap) = (ctx[raw.pair.watch as usize], ctx[raw.pair.trap as usize]);
            let Some(&i) = index.get(&(names.key(watch), names.key(trap))) else {
                raw_of_thread.push(None);
                continue;
            };
            let sums = Sums::of_pair(&raw.pair).counted(exhaustive);
            let resolved = resolver.resolve(&raw.object, sym, names, &mut frames_of);
            let o = objects::add(&mut objects, &mut object_index, resolved, &sums);
            raw_of_thread.push(Some(o));
            let credits = &mut out[i].objects;
            match credits.iter_mut().find(|c| c.0 == o) {
                Some(c) => c.1.add(&sums),
                None => credits.push((o, sums)),
            }
        }
        raw_objects.push(raw_of_thread);
    }
    out.sort_by(|a, b| b.waste().total_cmp(&a.waste()).then(b.used().total_cmp(&a.used())));
    Process { profile: p, pairs: out, total, counters: counters(p), addrs, objects, raw_objects }
}

#[cfg(test)]
mod tests {
    use super::*;
    use witchcraft::profile::Node;

    #[test]
    fn a_cycle_in_a_corrupt_tree_ends_instead_of_looping() {
        let n = |parent, pc| Node { parent, pc, samples: 0 };
        let t = Thread { tid: 1, nodes: vec![n(0, 0), n(2, 10), n(1, 20), n(1, 30)], ..Default::default() };
        let mut names = Interner::new();
        let mut frames_of = |pc: u64, _: &mut Symbolizer, names: &mut Interner| -> Box<[FrameId]> {
            let f = crate::symbolize::Frame {
                function: format!("f{pc}"),
                file: None,
                line: None,
                module: "m".into(),
                offset: pc,
                inlined: false,
            };
            Box::new([names.frame(f)])
        };
        let ctx = contexts(&t, &mut frames_of, &mut Symbolizer::new(), &mut names);
        assert_eq!(ctx[0], EMPTY);
        // 3 → 1 → 2 → 1 ...: each node gets a finite context.
        assert!(ctx.iter().all(|&c| c != UNKNOWN && c != VISITING));
        assert_eq!(names.depth(ctx[3]), names.depth(ctx[1]) + 1);
    }
}
