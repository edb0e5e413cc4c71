//! A copy left through one of its exits: what each leads to (a link to
//! the next copy, a pick stepped natively and the way back into the
//! cache, a `rep` run in parts, the window's end, the bridge between
//! whole-run windows).

use super::link::Saved;
use super::process::Engine;
use super::thread::ThreadState;
use super::window::{counted, gregs, Phase, Plan};
use crate::modules::ProcessMap;
use crate::sys::task;
use crate::x86::decode::Regs;
use crate::x86::translate::{self, Exit, Variant};

impl ThreadState {
    /// A copy left through one of its exits (an `int3` in the cache).
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(crate) unsafe fn on_cache_exit(&mut self, engine: &Engine, map: &ProcessMap, uc: *mut libc::ucontext_t) {
        // SAFETY: forwarded from the caller.
        let g = unsafe { gregs(uc) };
        let rip = g[libc::REG_RIP as usize] as u64;
        if self.window.phase() == Phase::Bridge {
            // SAFETY: forwarded from the caller.
            return unsafe { self.end_bridge(engine, map, uc) };
        }
        let Some(exit) = self.window.cache.exit_at(rip) else { return };
        self.window.cache.stats.exits += 1;
        self.window.cache.stats.lookups += matches!(exit, Exit::Lookup) as u64;
        if let Exit::Stepped { native } = exit {
            // A picked instruction ran alone from the cache, and the link
            // stub could not go on (the window ends, or no copy could be
            // made there): what is left of the pick's step, then on.
            g[libc::REG_RIP as usize] = self.window.cache.stepped_to(native) as i64;
            if self.burst.is_active() {
                // SAFETY: forwarded from the caller.
                unsafe { self.on_step(engine, map, uc) };
            }
            if !self.burst.is_active() && self.window.phase() == Phase::Step {
                // SAFETY: forwarded from the caller.
                unsafe { self.resume_window(engine, map, uc) };
            }
            return;
        }
        if self.window.phase() != Phase::Cache && self.window.phase() != Phase::RepPart {
            // An exit from a window this thread already left (never
            // expected): go on natively where it points.
            // SAFETY: forwarded from the caller.
            unsafe { self.leave_cache(uc) };
            return;
        }
        let kind = counted(engine);
        let own = engine.own_code;
        self.window.take_counted();
        self.window.records_out();
        let go = |ts: &mut ThreadState, native: u64, variant: Variant| -> Option<u64> {
            let flushes = ts.window.cache.stats.flushes;
            let c = ts.window.cache.get(map, own, kind, native, variant).ok()?;
            // A flush drops every copy, the one that exited too.
            Some(if ts.window.cache.stats.flushes != flushes { c | 1 << 63 } else { c })
        };
        match exit {
            Exit::Link { native, patch } | Exit::Slow { native, patch } => {
                let variant = if matches!(exit, Exit::Slow { .. }) { Variant::Slow } else { Variant::Fast };
                let to = self.goes_to(engine, native);
                if !self.translatable(engine, map, to) {
                    return self.leave_for(engine, map, uc, native);
                }
                match go(self, to, variant) {
                    Some(c) => {
                        let c = if c >> 63 != 0 {
                            c & !(1 << 63)
                        } else {
                            self.window.cache.patch(patch, c);
                            c
                        };
                        g[libc::REG_RIP as usize] = c as i64;
                    }
                    None => self.window.end(uc, native, true),
                }
            }
            Exit::Native { native } if self.window.whole_run() => {
                // SAFETY: forwarded from the caller.
                unsafe { self.record_native(engine, map, native, uc) };
            }
            Exit::Native { native } => {
                if !self.run_critical_section(engine, map, uc, native) {
                    self.window.end(uc, native, true);
                }
            }
            // SAFETY: forwarded from the caller.
            Exit::End { native } => unsafe { self.window_done(engine, map, uc, native) },
            Exit::Lookup => {
                let native = self.window.cache.data().target;
                let to = self.goes_to(engine, native);
                if !self.translatable(engine, map, to) {
                    return self.leave_for(engine, map, uc, native);
                }
                match go(self, to, Variant::Fast) {
                    Some(c) => {
                        let c = c & !(1 << 63);
                        self.window.cache.dispatch_to(native, c);
                        g[libc::REG_RIP as usize] = c as i64;
                    }
                    None => self.window.end(uc, native, true),
                }
            }
            Exit::Pick { native } if self.window.recording() => {
                // The buffer is full: send it, and go on where the copy stopped.
                self.window.send_full_buffer();
                match go(self, native, Variant::Fast) {
                    Some(c) => g[libc::REG_RIP as usize] = (c & !(1 << 63)) as i64,
                    None => self.window.end(uc, native, true),
                }
            }
            Exit::BigRep { native } if self.window.recording() => {
                // SAFETY: forwarded from the caller.
                unsafe { self.record_rep(map, own, native, uc) };
            }
            Exit::Pick { native } => {
                let r = self.window.cache.data().countdown.max(1);
                g[libc::REG_RIP as usize] = native as i64;
                // SAFETY: forwarded from the caller.
                let regs = unsafe { self.ledger.regs(uc) };
                let rep = self.ledger.decode(map, native, &regs, false).is_some_and(|d| d.rep);
                if rep && r > 1 {
                    // Run the elements before the picked one in the cache,
                    // then step the picked one.
                    let before = (r as u64 - 1).min(g[libc::REG_RCX as usize] as u64);
                    self.window.count_accesses(before);
                    // SAFETY: forwarded from the caller.
                    return unsafe { self.rep_part(map, own, native, before, true, uc) };
                }
                // SAFETY: forwarded from the caller.
                unsafe { self.pick(engine, map, &regs, if rep { 1 } else { r as u32 }, uc) };
            }
            Exit::BigRep { native } => {
                // A long `rep`: its next part, up to the pick if the pick is in it.
                let rcx = g[libc::REG_RCX as usize] as u64;
                let part = rcx.min(translate::MAX_REP_ELEMENTS as u64);
                let k = self.window.counted_per_element().max(0) as u64;
                let data = self.window.cache.data();
                data.instr_left -= 1 + (part >> translate::REP_PER_INSTRUCTION_SHIFT) as i64;
                if data.instr_left <= 0 {
                    return self.window.end(uc, native, false);
                }
                let r = data.countdown.max(1) as u64;
                if k > 0 && r <= part * k {
                    let before = (r - 1) / k;
                    self.window.count_accesses(before * k);
                    // SAFETY: forwarded from the caller.
                    return unsafe { self.rep_part(map, own, native, before, true, uc) };
                }
                self.window.count_rep_part(part * k);
                // SAFETY: forwarded from the caller.
                unsafe { self.rep_part(map, own, native, part, false, uc) };
            }
            // (Taken above.)
            Exit::Stepped { .. } => {}
            Exit::RepDone => {
                let data = self.window.cache.data();
                let (native, rest, pick, len) = (data.rep_native, data.rep_rest, data.rep_pick != 0, data.rep_len);
                g[libc::REG_RCX as usize] = (g[libc::REG_RCX as usize] as u64).wrapping_add(rest) as i64;
                g[libc::REG_RIP as usize] = native as i64;
                if !pick {
                    // A part of a long `rep` ran: on with the rest, or after it.
                    let at = if rest == 0 { native + len } else { native };
                    self.window.rep_part_done();
                    match go(self, at, Variant::Fast) {
                        Some(c) => g[libc::REG_RIP as usize] = (c & !(1 << 63)) as i64,
                        None => self.window.end(uc, at, true),
                    }
                    return;
                }
                // SAFETY: forwarded from the caller.
                let regs = unsafe { self.ledger.regs(uc) };
                // SAFETY: forwarded from the caller.
                unsafe { self.pick(engine, map, &regs, 1, uc) };
            }
        }
    }

    /// Where a copy's branch to `native` goes: there, or, in a recording
    /// window, on to the definition an agent entry calls on to
    /// ([`Engine::calls_on`]; the dispatch table and links still key the
    /// copy by `native`).
    fn goes_to(&self, engine: &Engine, native: u64) -> u64 {
        if self.window.recording() {
            engine.calls_on(native).unwrap_or(native)
        } else {
            native
        }
    }

    /// A copy reached an exit that asks for a copy, through the link stub
    /// (see [`super::link`]), the exit's `int3` address in the jump slot:
    /// make the copy (a link, a slow variant, a dispatch miss) and aim the
    /// jump slot, the branch that exited and the dispatch table at it, as
    /// the exit's trap would have. Anything else is left to the trap: the
    /// slot is not changed (code the cache does not run, a full cache,
    /// which the trap empties, a window that is not running copies).
    /// Called on the cache's link stack, with the window's signal mask,
    /// from the agent's hook; async-signal-safe.
    /// Its time is counted apart (`link_ns`): part of the window's time
    /// in the cache that is the engine's, not the copies' running.
    ///
    /// A window's pick comes this way too, with the program's registers
    /// (`saved`): see [`ThreadState::pick_in_cache`].
    pub fn link_in_cache(&mut self, engine: &Engine, map: &ProcessMap, saved: &Saved) {
        let c0 = task::cycles();
        let pick = self.link(engine, map, saved);
        let ns = (task::cycles().wrapping_sub(c0) as f64 * engine.ns_per_cycle) as u64;
        let stats = &mut self.window.cache.stats;
        if pick {
            stats.pick_ns += ns;
        } else {
            stats.link_ns += ns;
        }
    }

    /// [`ThreadState::link_in_cache`], untimed; true for a pick's way.
    fn link(&mut self, engine: &Engine, map: &ProcessMap, saved: &Saved) -> bool {
        if !self.window.cache.has_mapping() {
            return false;
        }
        let int3 = self.window.cache.data().jump;
        let Some(exit) = self.window.cache.exit_at(int3.wrapping_add(1)) else { return false };
        match exit {
            Exit::Pick { native } => {
                self.pick_in_cache(engine, map, saved, native);
                return true;
            }
            Exit::Stepped { native } => {
                self.stepped_in_cache(engine, map, native);
                return true;
            }
            _ if self.window.phase() != Phase::Cache => return false,
            _ => {}
        }
        let (native, variant, patch) = match exit {
            Exit::Link { native, patch } => (native, Variant::Fast, Some(patch)),
            Exit::Slow { native, patch } => (native, Variant::Slow, Some(patch)),
            Exit::Lookup => (self.window.cache.data().target, Variant::Fast, None),
            _ => return false,
        };
        let to = self.goes_to(engine, native);
        if !self.translatable(engine, map, to) {
            return false;
        }
        let Ok(c) = self.window.cache.get_kept(map, engine.own_code, counted(engine), to, variant) else { return false };
        match patch {
            Some(at) => self.window.cache.patch(at, c),
            None => self.window.cache.dispatch_to(native, c),
        }
        let cache = &mut self.window.cache;
        cache.stats.links += 1;
        cache.data().jump = c;
        false
    }

    /// Picks without a trap. A pick taken at its exit's trap and stepped
    /// natively costs two round trips through the kernel (the exit's
    /// `int3`, then the step's debug exception: about 40 µs here, most of
    /// a window's cost). From the link stub, with the program's registers
    /// at hand (`saved`; its stack pointer in the data page), the engine
    /// takes the pick as the exit's trap would ([`ThreadState::begin_pick_in_cache`]:
    /// decode, context, values, the debug registers the instruction would
    /// make fire held off), then aims the jump slot at a copy of the picked
    /// instruction alone, whose exit ([`Exit::Stepped`]) comes back through
    /// the stub once it ran ([`ThreadState::stepped_in_cache`]). Nothing
    /// changes for the program: the instruction runs once, from a copy, as
    /// the window's others do. An instruction such a copy does not run (a
    /// `rep` string, a return that pops arguments) and a recording window's
    /// full buffer are left to the trap, and so is every pick with
    /// `WITCH_CACHE_PICKS=0`.
    fn pick_in_cache(&mut self, engine: &Engine, map: &ProcessMap, saved: &Saved, native: u64) {
        if self.window.phase() != Phase::Cache || self.window.recording() || engine.config.no_cache_picks || engine.is_own_code(native) {
            return;
        }
        let rsp = self.window.cache.data().save_rsp;
        let regs = self.ledger.regs_at(saved.gpr(rsp), native, saved.flags);
        if !self.ledger.decode(map, native, &regs, false).is_some_and(|d| d.steppable && !d.partial && !d.rep) {
            return;
        }
        let Some(copy) = self.window.cache.step_copy(map, engine.own_code, counted(engine), native) else { return };
        self.window.take_counted();
        let nth = self.window.cache.data().countdown.max(1) as u32;
        let weight = self.window.step_pick(self.open_cache_ns());
        if self.window.whole_run() {
            // As at the trap ([`ThreadState::pick`]).
            self.ledger.next_cluster();
        }
        // If it cannot be taken after all (never expected: it decoded),
        // the exit's trap finds the window no longer in the cache and ends it.
        if self.begin_pick_in_cache(engine, map, &regs, nth, weight) {
            let cache = &mut self.window.cache;
            cache.stats.picks += 1;
            cache.data().jump = copy;
        }
    }

    /// The window's copies' running time since the last handler, for a pick
    /// taken through the link stub (half a round trip out: the handler's
    /// return); 0 where windows are not timed (no clock read).
    fn open_cache_ns(&self) -> f64 {
        if !self.window.settings().timed {
            return 0.0;
        }
        self.clock.since_exit(task::thread_cpu_ns()) as f64 - self.clock.trap_gap_ns() / 2.0
    }

    /// The picked instruction ran from its copy alone, the program is at
    /// `native`: the pick becomes a sample as after a step's trap
    /// ([`ThreadState::end_pick_in_cache`]), and the thread goes on at
    /// `native`'s copy. Where the window ends there, or no copy can be
    /// made without emptying the cache, the rest is left to the exit's
    /// trap (see [`ThreadState::on_cache_exit`]).
    fn stepped_in_cache(&mut self, engine: &Engine, map: &ProcessMap, native: u64) {
        if self.window.phase() != Phase::Step || !self.burst.is_active() {
            return;
        }
        let native = self.window.cache.stepped_to(native);
        self.end_pick_in_cache(engine);
        if !self.translatable(engine, map, native) || self.window.cache.data().instr_left <= 0 {
            return;
        }
        let Ok(c) = self.window.cache.get_kept(map, engine.own_code, counted(engine), native, Variant::Fast) else { return };
        self.window.pick_stepped();
        self.window.next_countdown();
        self.window.back_in_cache();
        self.window.cache.data().jump = c;
    }

    /// Step the picked instruction at `regs.rip` natively: its `nth`
    /// counted access is the pick.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    unsafe fn pick(&mut self, engine: &Engine, map: &ProcessMap, regs: &Regs, nth: u32, uc: *mut libc::ucontext_t) {
        let weight = self.window.step_pick(0.0);
        if self.window.whole_run() {
            // Whole-run counting: picks are drawn by count, each a sample
            // as a PMU's overflow is, so each begins a cluster of the
            // interval's variance (at ticks, which are few here, a whole
            // run's picks would be one cluster and the interval nearly 0-100%).
            self.ledger.next_cluster();
        }
        // SAFETY: forwarded from the caller.
        if !unsafe { self.begin_pick_step(engine, map, regs, nth, weight, uc) } {
            self.window.end(uc, regs.rip, true);
        }
    }

    /// The picked instruction has run (the burst machinery judged and
    /// armed what it needed): back into the cache, with a new countdown.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(crate) unsafe fn resume_window(&mut self, engine: &Engine, map: &ProcessMap, uc: *mut libc::ucontext_t) {
        // SAFETY: forwarded from the caller.
        let g = unsafe { gregs(uc) };
        let rip = g[libc::REG_RIP as usize] as u64;
        self.window.pick_stepped();
        if !self.translatable(engine, map, rip) {
            return self.window.end(uc, rip, true);
        }
        if self.window.cache.data().instr_left <= 0 {
            // SAFETY: forwarded from the caller.
            return unsafe { self.window_done(engine, map, uc, rip) };
        }
        self.window.next_countdown();
        match self.window.cache.get(map, engine.own_code, counted(engine), rip, Variant::Fast) {
            Ok(c) => {
                g[libc::REG_RIP as usize] = c as i64;
                self.window.back_in_cache();
            }
            Err(_) => self.window.end(uc, rip, true),
        }
    }

    /// A window ran all its instructions, the thread is at `native`. At
    /// ticks: the window is over. Whole-run counting: the next window
    /// begins here at once, unless signals are waiting for the program
    /// (they wait while it runs in the cache): then the thread crosses a
    /// [`Phase::Bridge`] to let them in, or, where it cannot step the next
    /// instruction, goes on natively until the next tick.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    unsafe fn window_done(&mut self, engine: &Engine, map: &ProcessMap, uc: *mut libc::ucontext_t, native: u64) {
        let settings = self.window.settings();
        if settings.count.is_none() {
            return self.window.end(uc, native, false);
        }
        let waiting = self.window.signals_waiting();
        self.window.end(uc, native, false);
        // SAFETY: forwarded from the caller.
        let regs = unsafe { self.ledger.regs(uc) };
        if !waiting {
            let plan = Plan { weight: 1.0, settings, picks: 0 };
            // SAFETY: forwarded from the caller.
            unsafe { self.begin_window(engine, map, &regs, plan, uc) };
            return;
        }
        let steppable = self.ledger.decode(map, native, &regs, false).is_some_and(|d| d.steppable && !d.rep);
        if steppable {
            // SAFETY: forwarded from the caller.
            unsafe { self.window.begin_bridge(uc) };
        }
    }

    /// The step of a [`Phase::Bridge`] trapped: the waiting signals were
    /// delivered, one instruction ran natively; the next window begins.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    unsafe fn end_bridge(&mut self, engine: &Engine, map: &ProcessMap, uc: *mut libc::ucontext_t) {
        // SAFETY: forwarded from the caller.
        unsafe { self.window.end_bridge(uc) };
        let settings = self.window.settings();
        // SAFETY: forwarded from the caller.
        let regs = unsafe { self.ledger.regs(uc) };
        if self.translatable(engine, map, regs.rip) {
            let plan = Plan { weight: 1.0, settings, picks: 0 };
            // SAFETY: forwarded from the caller.
            unsafe { self.begin_window(engine, map, &regs, plan, uc) };
        }
    }
}
