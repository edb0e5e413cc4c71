//! A thread's crossings between its own code and the cache: a window
//! begins (at a tick, or the next whole-run window at once), it ends, the
//! thread leaves the cache for good or at a fault; and the registers the
//! program would see at a point inside a copy.

use super::thread::ThreadState;
use super::window::{counted, gregs, Phase, Plan, WindowSettings, TRAP_FLAG};
use super::Engine;
use crate::modules::ProcessMap;
use crate::sys::siginfo;
use crate::x86::decode::Regs;
use crate::x86::translate::{Exit, Point, Variant};

/// Counted accesses per instruction assumed before a thread's first window.
const START_PER_INSTRUCTION: f64 = 0.3;

/// The signals a thread may take while in the cache: the synchronous ones
/// (which cannot wait) and SIGTRAP. A kernel mask.
fn window_mask() -> u64 {
    let open = [libc::SIGTRAP, libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGSYS];
    open.iter().fold(u64::MAX, |m, &sig| m & !siginfo::mask_bit(sig))
}

impl ThreadState {
    /// A tick begins a window at the interrupted instruction (`regs`),
    /// standing for `weight` periods of program time. False if the cache
    /// cannot take it (no mapping, code it cannot translate): the caller
    /// steps a burst instead.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(crate) unsafe fn begin_window(
        &mut self,
        engine: &Engine,
        map: &ProcessMap,
        regs: &Regs,
        plan: Plan,
        uc: *mut libc::ucontext_t,
    ) -> bool {
        let Plan { weight, settings, picks } = plan;
        if !self.window.cache.ready(map) {
            return false;
        }
        let kind = counted(engine);
        let Ok(entry) = self.window.cache.get(map, engine.own_code, kind, regs.rip, Variant::Fast) else { return false };
        // Begun otherwise (a tick), the window needs no breakpoint to come
        // back (only once it surely begins: a tick in code the cache does
        // not run must leave the breakpoint set).
        self.window.resume.disarm();
        let spent = self.record.counters.engine_ns;
        let w = &mut self.window;
        // Learn what a unit cost: the engine's time since the last window
        // began (its picks' traps included) over its units.
        if let Some((at, units)) = w.last_start {
            let per = spent.saturating_sub(at) as f64 / units.max(1) as f64;
            w.unit_ns = if w.unit_ns == 0.0 { per } else { w.unit_ns + (per - w.unit_ns) / 8.0 };
        }
        if let Some(n) = settings.count {
            // Every access alike, for the whole run: a pick stands for n.
            w.picks_left = u64::MAX;
            w.p = 1.0 / n.max(1) as f64;
            w.time_weight = 1.0;
        } else {
            let per = if w.per_instruction > 0.0 { w.per_instruction } else { START_PER_INSTRUCTION };
            let expected = settings.instructions as f64 * per.max(1e-3);
            w.picks_left = 2 * picks.max(1) as u64 + 2;
            w.p = (picks.max(1) as f64 / expected).clamp(1e-9, 1.0);
            w.time_weight = weight;
        }
        w.settings = settings;
        w.given = settings.instructions as u64;
        w.accesses = 0;
        w.stepped = 0;
        w.last_start = Some((spent, 1 + picks as u64));
        let d = w.draw();
        w.drawn = d;
        let data = w.cache.data();
        data.countdown = d;
        data.instr_left = settings.instructions as i64;
        if w.rec.is_some() {
            data.fs_base = self.place.fs_base;
            data.gs_base = self.place.gs_base;
            w.records_in();
        }
        // SAFETY: forwarded from the caller.
        unsafe {
            w.saved_mask = siginfo::frame_mask(uc);
            siginfo::set_frame_mask(uc, window_mask());
            gregs(uc)[libc::REG_RIP as usize] = entry as i64;
        }
        w.phase = Phase::Cache;
        w.busy.store(true, std::sync::atomic::Ordering::Release);
        w.stats.windows += 1;
        self.record.counters.bursts += 1;
        true
    }

    /// Whole-run counting: a tick found the thread outside the cache (it
    /// left at a system call or code the cache does not run, or a bridge
    /// was lost to a handler that jumped away): the next window begins.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(crate) unsafe fn count_tick(
        &mut self,
        engine: &Engine,
        map: &ProcessMap,
        regs: &Regs,
        settings: WindowSettings,
        uc: *mut libc::ucontext_t,
    ) -> bool {
        if self.window.phase == Phase::Bridge {
            // The trap flag is not set here (the caller's check): the
            // bridge's step was lost (a handler left by siglongjmp).
            self.window.phase = Phase::Native;
            self.window.busy.store(false, std::sync::atomic::Ordering::Release);
        }
        if self.window.active() {
            return false;
        }
        if self.window.resume.is_armed() {
            // The thread is in code the cache does not run (a system call,
            // an interposer and the C library function it calls on to),
            // and the breakpoint takes it back where that returns: a
            // window begun here (in `malloc`, called by the agent's
            // `malloc`) would end at the return into the agent, with no
            // way back but the next tick.
            return true;
        }
        let plan = Plan { weight: 1.0, settings, picks: 0 };
        // SAFETY: forwarded from the caller.
        unsafe { self.begin_window(engine, map, regs, plan, uc) }
    }

    /// The cache does not run `native` (the agent's own code, code outside
    /// the modules): the window ends there. Recording resumes at the
    /// return address on top of the stack, where a call into such code (a
    /// function the agent interposes) comes back.
    pub(super) fn leave_for(&mut self, engine: &Engine, map: &ProcessMap, uc: *mut libc::ucontext_t, native: u64) {
        let whole_run = self.window.whole_run();
        self.end_window(uc, native, true);
        if !whole_run {
            return;
        }
        // SAFETY: `uc` is the kernel's context (every caller's contract).
        let sp = unsafe { gregs(uc)[libc::REG_RSP as usize] as u64 };
        let mut ret = [0u8; 8];
        if crate::sys::mem::read_own(sp, &mut ret) {
            let ret = u64::from_le_bytes(ret);
            if self.translatable(engine, map, ret) {
                // What runs natively until then is not recorded but its
                // return, which reads the return address: credited to the
                // code it returns from, and its frame ends at once for the
                // shadow call stack.
                let load = crate::x86::decode::Access { addr: sp, len: 8, read: true, ..Default::default() };
                let r = crate::x86::record::Record {
                    addr: sp,
                    pc: native,
                    info: crate::x86::record::info(&load) | crate::x86::record::RET,
                    extra: ret,
                };
                if let Some(rec) = &mut self.window.rec {
                    rec.push(&[r]);
                }
                return self.resume_after(engine, ret);
            }
        }
        self.note_gap_at(native);
    }

    pub(super) fn translatable(&self, engine: &Engine, map: &ProcessMap, pc: u64) -> bool {
        map.module(pc).is_some() && !(pc >= engine.own_code.0 && pc < engine.own_code.1)
    }

    /// The window is over: the thread goes on natively at `native` with
    /// its own signal mask. `cut`: before its instructions ran out.
    pub(crate) fn end_window(&mut self, uc: *mut libc::ucontext_t, native: u64, cut: bool) {
        let w = &mut self.window;
        // SAFETY: `uc` is the kernel's context (every caller's contract).
        unsafe {
            gregs(uc)[libc::REG_RIP as usize] = native as i64;
            siginfo::set_frame_mask(uc, w.saved_mask);
        }
        w.phase = Phase::Native;
        w.busy.store(false, std::sync::atomic::Ordering::Release);
        let left = w.cache.data().instr_left.clamp(0, w.given as i64) as u64;
        let ran = w.given - left + w.stepped;
        let s = &mut w.stats;
        s.cut += cut as u64;
        s.instructions += ran;
        s.accesses += w.accesses;
        s.shortest = if s.shortest == 0 { ran } else { s.shortest.min(ran) };
        s.longest = s.longest.max(ran);
        if ran > 0 {
            // Quick to follow: the next window's picks rest on it.
            let obs = w.accesses as f64 / ran as f64;
            w.per_instruction = if w.per_instruction == 0.0 { obs } else { w.per_instruction + (obs - w.per_instruction) / 2.0 };
        }
    }

    /// Leave the cache wherever the thread is in it, for good (the session
    /// ends, or the window's state cannot go on): the context goes to the
    /// native instruction it stands for, with the program's signal mask.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub unsafe fn leave_cache(&mut self, uc: *mut libc::ucontext_t) {
        if self.window.phase == Phase::Bridge {
            // Natively already, with the program's mask: only the step goes.
            // SAFETY: forwarded from the caller.
            unsafe { (*uc).uc_mcontext.gregs[libc::REG_EFL as usize] &= !TRAP_FLAG };
            self.window.phase = Phase::Native;
            self.window.busy.store(false, std::sync::atomic::Ordering::Release);
            return;
        }
        if !self.window.active() {
            return;
        }
        // SAFETY: forwarded from the caller.
        let g = unsafe { gregs(uc) };
        let rip = g[libc::REG_RIP as usize] as u64;
        let native = match self.window.cache.exit_at(rip) {
            Some(
                Exit::Link { native, .. }
                | Exit::Native { native }
                | Exit::End { native }
                | Exit::Slow { native, .. }
                | Exit::Pick { native }
                | Exit::BigRep { native },
            ) => native,
            Some(Exit::Lookup) => self.window.cache.data().target,
            Some(Exit::RepDone) => {
                let data = self.window.cache.data();
                g[libc::REG_RCX as usize] = (g[libc::REG_RCX as usize] as u64).wrapping_add(data.rep_rest) as i64;
                data.rep_native
            }
            // Stepping a pick: the context is native already.
            None => rip,
        };
        self.burst.reset();
        // SAFETY: the trap flag of a pick's step is ours.
        unsafe { (*uc).uc_mcontext.gregs[libc::REG_EFL as usize] &= !0x100 };
        self.end_window(uc, native, true);
    }

    /// A fault (SIGSEGV, SIGBUS, SIGFPE, SIGILL) raised by a copy: put the
    /// context at the native instruction that faulted, with the program's
    /// registers and signal mask, and end the window, before the program's
    /// handler sees it. False if the context is not in this thread's cache.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub unsafe fn leave_cache_at_fault(&mut self, engine: &Engine, uc: *mut libc::ucontext_t) -> bool {
        // SAFETY: forwarded from the caller.
        let g = unsafe { gregs(uc) };
        let rip = g[libc::REG_RIP as usize] as u64;
        if !self.window.active() || !self.window.cache.is_code(rip) {
            return false;
        }
        let Some(map) = crate::modules::current() else { return false };
        let Some(p) = self.window.cache.point(map, engine.own_code, counted(engine), rip, false) else {
            return false;
        };
        if let Some((reg, slot)) = p.spilled {
            // SAFETY: the slot is in this thread's data page.
            g[greg_of(reg)] = unsafe { *(slot as *const i64) };
        }
        self.end_window(uc, p.pc, true);
        true
    }

    /// The registers the program would have at a watchpoint trap inside a
    /// copy (`regs`, as the context has them), and the point: the native
    /// instruction that made the access.
    pub(crate) fn native_view(&mut self, engine: &Engine, map: &ProcessMap, regs: &Regs) -> Option<(Point, Regs)> {
        if !self.window.cache.is_code(regs.rip) {
            return None;
        }
        let p = self.window.cache.point(map, engine.own_code, counted(engine), regs.rip, true)?;
        let mut view = *regs;
        if let Some((reg, slot)) = p.spilled {
            // SAFETY: the slot is in this thread's data page.
            view.gpr[reg as usize] = unsafe { *(slot as *const u64) };
        }
        view.rip = if p.before {
            p.pc
        } else if p.target_slot {
            self.window.cache.data().target
        } else {
            p.next
        };
        Some((p, view))
    }
}

/// The ucontext index of general-purpose register `reg` (hardware number).
fn greg_of(reg: u8) -> usize {
    const ORDER: [i32; 16] = [
        libc::REG_RAX,
        libc::REG_RCX,
        libc::REG_RDX,
        libc::REG_RBX,
        libc::REG_RSP,
        libc::REG_RBP,
        libc::REG_RSI,
        libc::REG_RDI,
        libc::REG_R8,
        libc::REG_R9,
        libc::REG_R10,
        libc::REG_R11,
        libc::REG_R12,
        libc::REG_R13,
        libc::REG_R14,
        libc::REG_R15,
    ];
    ORDER[reg as usize & 15] as usize
}
