//! The trap path (a signal handler): the next access to watched bytes. The
//! craft judges it, and the verdict is attributed to ⟨C_watch, C_trap⟩ in
//! proportion to the samples of C_watch it stands for (Witch §4.4.2), in
//! the ledger ([`super::ledger`]).

use super::ledger;
use super::process::Engine;
use super::thread::ThreadState;
use crate::craft::Verdict;
use crate::modules;
use crate::sys::perf::BpType;
use crate::sys::siginfo;
use crate::x86::decode::Access;
use crate::x86::precise_pc;

impl ThreadState {
    /// A watchpoint trap on slot `i`.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(crate) unsafe fn on_trap(&mut self, engine: &Engine, i: usize, uc: *mut libc::ucontext_t, perf_flags: u32) {
        let Some(s) = self.ledger.armed(i) else { return };
        let Some(map) = modules::current() else { return };
        // SAFETY: forwarded from the caller.
        let mut regs = unsafe { self.ledger.regs(uc) };
        self.clock.resume_at(&regs);
        // Inside a copy in the code cache: the native instruction and the
        // registers the program would have there.
        let in_cache = self.window.cache.is_code(regs.rip);
        let cached = if in_cache { self.native_view(engine, map, &regs) } else { None };
        match cached {
            Some((_, view)) => regs = view,
            None if in_cache => {
                self.ledger.counters.imprecise += 1;
                self.ledger.free(i);
                return;
            }
            None => {}
        }
        let self_trap = s.self_trap.is_some_and(|own| own.is(regs.rip));
        self.clock.trap(self_trap);
        if perf_flags & siginfo::TRAP_PERF_FLAG_ASYNC != 0 {
            // Delivered late (SIGTRAP was blocked): the context isn't the access.
            self.ledger.counters.ignored_traps += 1;
            self.ledger.free(i);
            return;
        }
        if s.self_trap.is_some() {
            self.ledger.self_trap_passed(i);
            if self_trap {
                // The sampled instruction's own access, not the next one.
                self.ledger.counters.self_traps += 1;
                if engine.craft.needs_value() && engine.craft.watch() == BpType::W {
                    // The store has now run: remember what it left (SilentCraft).
                    self.ledger.snapshot_after_store(i);
                }
                return;
            }
        }
        let found = match cached {
            // A native call's load of the program's return address (see
            // `native_view`): the entry's `ret`, credited to the
            // instruction it returns to.
            Some((p, view)) if p.native_return => {
                let access = Access { addr: view.sp() - 8, len: 8, read: true, ..Default::default() };
                (access.overlap(s.addr, s.len) > 0).then_some(precise_pc::TrapAccess { pc: view.rip, access, precise: true })
            }
            Some((p, view)) => self
                .ledger
                .decode(map, p.pc, &view, !p.before)
                .and_then(|d| precise_pc::overlapping(&d, s.addr, s.len))
                .map(|access| precise_pc::TrapAccess { pc: p.pc, access, precise: true }),
            None => self.ledger.recover(map, &regs, s.addr, s.len),
        };
        let (pc, access) = match found {
            Some(t) => {
                if !t.precise {
                    self.ledger.counters.imprecise += 1;
                }
                (t.pc, t.access)
            }
            None => {
                self.ledger.counters.imprecise += 1;
                if engine.craft.watch() != BpType::W {
                    // A read-or-write trap we can't place: neither waste nor use.
                    self.ledger.free(i);
                    return;
                }
                // A write-only watchpoint only traps on stores.
                let a = Access { addr: s.addr, len: s.len as u32, read: false, write: true, float: s.watched.access.float, elem: 0 };
                (regs.rip, a)
            }
        };
        // The watched bytes cannot be read now (unmapped since): the
        // sample goes unjudged.
        let Some(verdict) = ledger::judge(engine, &s.watched, &access) else {
            self.ledger.free(i);
            return;
        };
        if verdict == Verdict::Ignore {
            self.ledger.ignore(i);
            return;
        }
        let trap_ctx = self.ledger.context(map, &regs, pc);
        self.ledger.credit(engine, i, trap_ctx, verdict);
    }
}
