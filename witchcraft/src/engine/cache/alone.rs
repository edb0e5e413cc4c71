//! One instruction's copy alone, outside the copies of blocks: a part of
//! a long `rep` string, or a window's picked instruction (a pick taken
//! without a trap, see `engine::cache_exit`). Each has its own small area
//! among the stubs, written again for each use, and the way back from an
//! address inside it to the program's instruction.

use super::CodeCache;
use crate::modules::ProcessMap;
use crate::x86::translate::{self, Counted, Point, Spilled, EXIT_STUB_LEN};

impl CodeCache {
    /// A copy of the `rep` instruction at `native` alone, followed by the
    /// [`translate::Exit::RepDone`] exit.
    pub fn rep_part(&mut self, map: &ProcessMap, own: (u64, u64), native: u64) -> Option<u64> {
        let slots = self.slots();
        let at = self.addr(self.layout.rep_at());
        let mut host = self.host(map, own);
        // SAFETY: the partial-rep area, REP_AT..STEP_AT of the mapping.
        let out = unsafe { std::slice::from_raw_parts_mut(self.w(self.layout.rep_at()), self.layout.step_at() - self.layout.rep_at()) };
        let len = self.translator.translate_rep_part(&mut host, &slots, native, at, out).ok()?;
        self.data().rep_len = len as u64 - EXIT_STUB_LEN;
        Some(at)
    }

    /// A copy of the instruction at `native` alone, followed by the
    /// [`translate::Exit::Stepped`] exit (a pick taken without a trap), if
    /// the instruction is one a copy runs as it is and then goes on
    /// ([`translate::Translator::translate_step`]), and the cache has a link
    /// stub for the exit to come back through.
    pub fn step_copy(&mut self, map: &ProcessMap, own: (u64, u64), counted: Counted, native: u64) -> Option<u64> {
        if self.base.is_null() || self.link == 0 {
            return None;
        }
        let at = self.addr(self.layout.step_at());
        let env = self.env(counted);
        let mut host = self.host(map, own);
        // SAFETY: the picked instruction's area, STEP_AT..SCRATCH_AT of the mapping.
        let out =
            unsafe { std::slice::from_raw_parts_mut(self.w(self.layout.step_at()), self.layout.scratch_at() - self.layout.step_at()) };
        self.translator.translate_step(&mut host, &env, native, at, false, out).ok()?;
        self.step_native = native;
        Some(at)
    }

    /// Where a picked instruction's copy went on ([`translate::Exit::Stepped`]
    /// `native`): there, or for 0, where the target slot says (after a
    /// return or an indirect call).
    pub fn stepped_to(&mut self, native: u64) -> u64 {
        if native == 0 {
            self.data().target
        } else {
            native
        }
    }

    /// Where `addr` stands in the program if it lies in one of these areas
    /// (see [`CodeCache::point`]): Some(the point, if any), or None if it is
    /// not in them.
    pub(super) fn point_alone(
        &mut self,
        map: &ProcessMap,
        own: (u64, u64),
        counted: Counted,
        addr: u64,
        after: bool,
    ) -> Option<Option<Point>> {
        let step = self.addr(self.layout.step_at());
        if addr >= step && addr < self.addr(self.layout.scratch_at()) {
            // The picked instruction's copy, translated again for its points.
            let env = self.env(counted);
            let mut host = self.host(map, own);
            // SAFETY: the scratch area, MAX_BLOCK_BYTES long, inside the mapping.
            let out = unsafe { std::slice::from_raw_parts_mut(self.w(self.layout.scratch_at()), translate::MAX_BLOCK_BYTES) };
            let made = self.translator.translate_step(&mut host, &env, self.step_native, step, true, out).is_ok();
            return Some(if made { self.translator.point_at(addr, after) } else { None });
        }
        let rep = self.addr(self.layout.rep_at());
        if addr < rep || addr >= step {
            return None;
        }
        // The partial `rep` (its copy alone, then an exit).
        let d = self.data();
        let (pc, len) = (d.rep_native, d.rep_len);
        if addr > rep + len {
            return Some(None);
        }
        let next = if addr == rep { pc } else { pc + len };
        Some(Some(Point {
            pc,
            len: len as u32,
            before: !after,
            spilled: Spilled::NONE,
            next,
            target_slot: false,
            rep: true,
            recorded: 0,
            native_return: false,
        }))
    }
}
