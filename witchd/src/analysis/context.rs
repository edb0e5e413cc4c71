//! Interned frames and calling contexts, shared by every profile one command reads.
//!
//! A profile holds one context tree per thread; symbolized, many nodes (of
//! many threads and processes) become the same source-level context.
//! Contexts form a trie from the outermost frame in: a context is the id of
//! its innermost trie node, so two contexts are equal exactly when their ids
//! are, and each tree node costs one lookup, whatever its depth.
//!
//! Two tries: one over frames as symbolized (which instruction of a line,
//! shown in reports), and one over their identity across builds and address
//! layouts ([`Frame::key`]: function and source line), by which pairs merge
//! and profiles compare. Each context knows its key context.

use crate::symbolize::Frame;
use std::collections::HashMap;

pub type FrameId = u32;
/// A context: its innermost frame and everything outside it. 0 is the empty context.
pub type CtxId = u32;
/// A context by frame identity ([`Frame::key`]); 0 is the empty context.
pub type KeyCtx = u32;

pub const EMPTY: CtxId = 0;

/// A trie of (innermost item, context around it).
struct Trie {
    nodes: Vec<(u32, u32)>,
    ids: HashMap<(u32, u32), u32>,
}

impl Trie {
    fn new() -> Trie {
        Trie { nodes: vec![(u32::MAX, EMPTY)], ids: HashMap::new() }
    }

    /// Returns the id and whether it is new.
    fn push(&mut self, outer: u32, item: u32) -> (u32, bool) {
        if let Some(&id) = self.ids.get(&(item, outer)) {
            return (id, false);
        }
        let id = self.nodes.len() as u32;
        self.nodes.push((item, outer));
        self.ids.insert((item, outer), id);
        (id, true)
    }
}

pub struct Interner {
    frames: Vec<Frame>,
    frame_ids: HashMap<Frame, FrameId>,
    /// Each frame's key, as an id.
    frame_key: Vec<u32>,
    /// Each frame's identity as a site of the summary, as an id: its key
    /// where it has a source line, else its function and module.
    site_key: Vec<u32>,
    key_ids: HashMap<String, u32>,
    ctx: Trie,
    key_ctx: Trie,
    /// Each context's key context.
    ctx_key: Vec<KeyCtx>,
}

impl Default for Interner {
    fn default() -> Self {
        Self::new()
    }
}

impl Interner {
    pub fn new() -> Interner {
        Interner {
            frames: Vec::new(),
            frame_ids: HashMap::new(),
            frame_key: Vec::new(),
            site_key: Vec::new(),
            key_ids: HashMap::new(),
            ctx: Trie::new(),
            key_ctx: Trie::new(),
            ctx_key: vec![EMPTY],
        }
    }

    pub fn frame(&mut self, f: Frame) -> FrameId {
        if let Some(&id) = self.frame_ids.get(&f) {
            return id;
        }
        let n = self.key_ids.len() as u32;
        let key = *self.key_ids.entry(f.key()).or_insert(n);
        let site = match f.line {
            Some(_) => key,
            None => {
                let n = self.key_ids.len() as u32;
                *self.key_ids.entry(format!("{}\0{}", f.function, crate::symbolize::module_name(&f.module))).or_insert(n)
            }
        };
        let id = self.frames.len() as FrameId;
        self.frames.push(f.clone());
        self.frame_ids.insert(f, id);
        self.frame_key.push(key);
        self.site_key.push(site);
        id
    }

    pub fn get(&self, id: FrameId) -> &Frame {
        &self.frames[id as usize]
    }

    /// A frame's identity across builds ([`Frame::key`]), as an id.
    pub fn frame_key(&self, id: FrameId) -> u32 {
        self.frame_key[id as usize]
    }

    /// A frame's identity as a site of the summary: its source line where
    /// it has one, else its function in its module (every instruction of a
    /// function without line info is one site).
    pub fn site_key(&self, id: FrameId) -> u32 {
        self.site_key[id as usize]
    }

    /// The context with `frame` innermost, called from `outer`.
    pub fn push(&mut self, outer: CtxId, frame: FrameId) -> CtxId {
        let (id, new) = self.ctx.push(outer, frame);
        if new {
            let k = self.key_ctx.push(self.ctx_key[outer as usize], self.frame_key[frame as usize]).0;
            self.ctx_key.push(k);
        }
        id
    }

    /// The context by frame identity: equal for contexts that differ only in
    /// which instructions of the same lines they went through.
    pub fn key(&self, ctx: CtxId) -> KeyCtx {
        self.ctx_key[ctx as usize]
    }

    /// The innermost frame and the context around it; None for the empty context.
    pub fn split(&self, ctx: CtxId) -> Option<(FrameId, CtxId)> {
        (ctx != EMPTY).then(|| self.ctx.nodes[ctx as usize])
    }

    /// Frame ids of a context, innermost first.
    pub fn frame_ids(&self, mut ctx: CtxId) -> impl Iterator<Item = FrameId> + '_ {
        std::iter::from_fn(move || {
            let (f, outer) = self.split(ctx)?;
            ctx = outer;
            Some(f)
        })
    }

    /// Frames of a context, innermost first.
    pub fn frames(&self, ctx: CtxId) -> impl Iterator<Item = &Frame> + '_ {
        self.frame_ids(ctx).map(|f| self.get(f))
    }

    pub fn depth(&self, ctx: CtxId) -> usize {
        self.frame_ids(ctx).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(name: &str, line: u32) -> Frame {
        Frame { function: name.into(), file: Some("a.c".into()), line: Some(line), module: "/a".into(), offset: 0, inlined: false }
    }

    #[test]
    fn contexts_are_equal_exactly_when_their_frames_are() {
        let mut i = Interner::new();
        let (main, init, fill) = (i.frame(f("main", 1)), i.frame(f("init", 2)), i.frame(f("fill", 3)));
        let m = i.push(EMPTY, main);
        let a = i.push(m, init);
        let m2 = i.push(EMPTY, main);
        assert_eq!(m, m2);
        let b = i.push(m2, init);
        let c = i.push(m, fill);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let names: Vec<&str> = i.frames(a).map(|x| x.function.as_str()).collect();
        assert_eq!(names, ["init", "main"]);
        assert_eq!(i.depth(c), 2);
        assert_eq!(i.depth(EMPTY), 0);
        assert_ne!(i.key(a), i.key(c));

        // Another instruction of the same line: another frame, the same key.
        let mut other = f("init", 2);
        other.offset = 99;
        let init2 = i.frame(other);
        assert_ne!(init2, init);
        let d = i.push(m, init2);
        assert_ne!(d, a);
        assert_eq!(i.key(d), i.key(a));
        assert_eq!(i.get(i.frame_ids(d).next().unwrap()).offset, 99);
    }
}
