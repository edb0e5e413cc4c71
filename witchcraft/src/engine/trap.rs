//! The trap path (a signal handler): the next access to watched bytes. The
//! craft judges it, and the verdict is attributed to ⟨C_watch, C_trap⟩ in
//! proportion to the samples of C_watch it stands for (Witch §4.4.2).

use super::thread::ThreadState;
use super::Engine;
use crate::craft::{Verdict, SNAPSHOT};
use crate::modules;
use crate::objects::Object;
use crate::sys::perf::BpType;
use crate::sys::{mem, siginfo};
use crate::unwind;
use crate::x86::decode::{Access, Regs};
use crate::x86::precise_pc;

/// Ignored traps a watchpoint may take before it is given up. LoadCraft
/// ignores stores; a location stored to often and loaded rarely would
/// otherwise trap (a kernel round trip each; docs/OVERHEAD.md) on every
/// store until its next load.
pub(crate) const MAX_IGNORED: u32 = 32;

impl ThreadState {
    /// A watchpoint trap on slot `i`.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(crate) unsafe fn on_trap(&mut self, engine: &Engine, i: usize, uc: *mut libc::ucontext_t, perf_flags: u32) {
        if i >= self.watch.n || !self.watch.slots[i].armed {
            return;
        }
        let Some(map) = modules::current() else { return };
        // SAFETY: forwarded from the caller.
        let mut regs = unsafe { Regs::from_ucontext(uc, self.place.fs_base, self.place.gs_base) };
        self.clock.resume_at(&regs);
        // Inside a copy in the code cache: the native instruction and the
        // registers the program would have there.
        let in_cache = self.window.cache.is_code(regs.rip);
        let cached = if in_cache { self.native_view(engine, map, &regs) } else { None };
        match cached {
            Some((_, view)) => regs = view,
            None if in_cache => {
                self.record.counters.imprecise += 1;
                self.free(i);
                return;
            }
            None => {}
        }
        let s = self.watch.slots[i];
        let self_trap = s.self_trap.is_some_and(|own| own.is(regs.rip));
        self.clock.trap(self_trap);
        if perf_flags & siginfo::TRAP_PERF_FLAG_ASYNC != 0 {
            // Delivered late (SIGTRAP was blocked): the context isn't the access.
            self.record.counters.ignored_traps += 1;
            self.free(i);
            return;
        }
        if s.self_trap.is_some() {
            self.watch.slots[i].self_trap = None;
            if self_trap {
                // The sampled instruction's own access, not the next one.
                self.record.counters.self_traps += 1;
                if engine.craft.needs_value() && engine.craft.watch() == BpType::W {
                    // The store has now run: remember what it left (SilentCraft).
                    let w = &mut self.watch.slots[i].watched;
                    let n = (w.access.len as usize).min(SNAPSHOT);
                    w.value_len = if mem::read_own(w.access.addr, &mut w.value[..n]) { n } else { 0 };
                }
                return;
            }
        }
        let found = match cached {
            Some((p, view)) => {
                let mut buf = [0u8; 16];
                super::sample::code_bytes(map, p.pc, &mut buf)
                    .and_then(|b| self.scratch.analyzer.decode(b, p.pc, &view, !p.before))
                    .and_then(|d| precise_pc::overlapping(&d, s.addr, s.len))
                    .map(|access| precise_pc::TrapAccess { pc: p.pc, access, precise: true })
            }
            None => precise_pc::recover(map, &mut self.scratch.pc, &mut self.scratch.analyzer, &regs, s.addr, s.len, self.place.stack),
        };
        let (pc, access) = match found {
            Some(t) => {
                if !t.precise {
                    self.record.counters.imprecise += 1;
                }
                (t.pc, t.access)
            }
            None => {
                self.record.counters.imprecise += 1;
                if engine.craft.watch() != BpType::W {
                    // A read-or-write trap we can't place: neither waste nor use.
                    self.free(i);
                    return;
                }
                // A write-only watchpoint only traps on stores.
                let a = Access { addr: s.addr, len: s.len as u32, read: false, write: true, float: s.watched.access.float, elem: 0 };
                (regs.rip, a)
            }
        };
        let mut now = [0u8; SNAPSHOT];
        if engine.craft.needs_value() {
            let n = s.watched.value_len;
            if n > 0 && !mem::read_own(s.watched.access.addr, &mut now[..n]) {
                self.free(i);
                return;
            }
        }
        let verdict = engine.craft.judge(&s.watched, &access, &now);
        if verdict == Verdict::Ignore {
            self.ignore(i);
            return;
        }
        let n = unwind::walk(map, &mut self.scratch.unwind, &regs, pc, self.place.stack, &mut self.scratch.frames);
        let trap_ctx = self.record.tree.insert(&self.scratch.frames[..n]);
        self.attribute(engine, s.ctx, trap_ctx, verdict, false, s.addr);
        self.free(i);
    }

    /// The craft ignored a trap on slot `i` (LoadCraft: a store): keep
    /// watching, up to [`MAX_IGNORED`] times in a row. False if given up.
    pub(crate) fn ignore(&mut self, i: usize) -> bool {
        self.record.counters.ignored_traps += 1;
        self.watch.slots[i].ignored += 1;
        if self.watch.slots[i].ignored >= MAX_IGNORED {
            self.record.counters.abandoned += 1;
            self.free(i);
            return false;
        }
        true
    }

    /// Attribute a trap's verdict to ⟨C_watch, C_trap⟩. Proportional
    /// attribution (Witch §4.4.2): this trap stands for the samples of
    /// C_watch not yet accounted for, shared among the watchpoints
    /// currently armed from C_watch.
    ///
    /// `unarmed`: the verdict's own sample holds no debug register (a
    /// burst judged it in software), so it shares with the armed ones as
    /// one more. Left out, a pick judged within its burst took the weight
    /// of every armed sample of its context as well, so the fate that
    /// comes sooner (a store overwritten by the next instruction rather
    /// than read a few later) was over-counted: 78% dead where each
    /// access's count says 75% (`tests/programs/vector_index.c`).
    ///
    /// `addr`: the watched address; the credit goes to its data object too
    /// ([`crate::objects`]).
    pub(crate) fn attribute(&mut self, engine: &Engine, watch_ctx: u32, trap_ctx: u32, verdict: Verdict, unarmed: bool, addr: u64) {
        let rec = &mut self.record;
        rec.counters.traps += 1;
        let delta = rec.tree.node(watch_ctx).claim(unarmed);
        let scale = delta * engine.unit_scale();
        if let Some(p) = rec.pairs.get(watch_ctx, trap_ctx) {
            let (waste, used) = p.credit(verdict, scale);
            p.cluster.add(rec.cluster, waste, used);
            rec.clusters.add(rec.cluster, waste, used);
            let object = Object::of(addr, self.place.stack);
            rec.objects.credit(watch_ctx, trap_ctx, &object, verdict, scale, rec.cluster);
        }
    }

    /// Free slot `i` for the next sample.
    pub(crate) fn free(&mut self, i: usize) {
        let node = self.record.tree.node(self.watch.slots[i].ctx);
        node.armed = node.armed.saturating_sub(1);
        self.watch.free(i);
    }
}
