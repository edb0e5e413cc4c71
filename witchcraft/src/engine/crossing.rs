//! A thread's crossings between its own code and the cache: a window
//! begins (at a tick, or the next whole-run window at once), a `rep`
//! instruction runs in parts, the window ends, the thread goes on natively
//! until a breakpoint takes it back, or leaves the cache for good or at a
//! fault; and the registers the program would see at a point inside a
//! copy. The paths above ([`super::recording`], [`super::cache_exit`],
//! [`super::burst`], [`super::trap`]) cross through here; the window's
//! state changes only through [`super::window::Window`]'s methods.

use super::process::Engine;
use super::settings::WindowSettings;
use super::stepping::set_trap_flag;
use super::thread::ThreadState;
use super::window::{counted, gregs, Phase, Plan};
use crate::modules::ProcessMap;
use crate::x86::decode::Regs;
use crate::x86::translate::{Exit, NativeCalls, Point, Variant};

impl ThreadState {
    /// A handler begins at `entry_ns` (thread CPU time): the time the
    /// thread spent in the code cache since the last one is the engine's.
    pub(super) fn enter_clock(&mut self, entry_ns: u64) {
        let cached = self.clock.enter(entry_ns);
        if cached > 0 {
            let counters = &mut self.ledger.counters;
            counters.engine_ns += cached;
            counters.cache_ns += cached;
            // The copies' running, less the kernel's way out and back in.
            self.window.ran_in_cache(cached as f64 - self.clock.trap_gap_ns());
        }
    }

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
        if !self.window.cache.ready(map) {
            return false;
        }
        // Windows call the agent's allocation entries natively and go on
        // after them, but for the exact mode's recording windows, which
        // run the C library's allocator in the cache (its accesses are the
        // program's: see `Engine::calls_on`).
        let calls = if self.window.recording() { NativeCalls::default() } else { engine.native_calls };
        self.window.cache.set_native_calls(calls);
        self.window.cache.data().away_sp = 0;
        let kind = counted(engine);
        let Ok(entry) = self.window.cache.get(map, engine.own_code, kind, regs.rip, Variant::Fast) else { return false };
        // Begun otherwise (a tick), the window needs no breakpoint to come
        // back (only once it surely begins: a tick in code the cache does
        // not run must leave the breakpoint set).
        self.window.resume.disarm();
        let spent = self.ledger.counters.engine_ns;
        // SAFETY: forwarded from the caller.
        unsafe { self.window.begin(plan, spent, self.ledger.place(), entry, uc) };
        self.ledger.counters.bursts += 1;
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
        if self.window.phase() == Phase::Bridge {
            // The trap flag is not set here (the caller's check): the
            // bridge's step was lost (a handler left by siglongjmp).
            self.window.bridge_lost();
        }
        if self.window.active() {
            return false;
        }
        if self.window.resume.holds_ticks() {
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
        if self.run_critical_section(engine, map, uc, native) {
            return;
        }
        let whole_run = self.window.whole_run();
        self.window.end(uc, native, true);
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
                use crate::x86::record::{self, RecordKind};
                if let Some(kind) = self.window.record_kind() {
                    let load = crate::x86::decode::Access { addr: sp, len: 8, read: true, ..Default::default() };
                    let r = match kind {
                        RecordKind::StoreValues => record::Record { addr: 0, pc: native, info: record::NONE | record::RET, extra: ret },
                        k => record::Record { addr: sp, pc: native, info: record::info(&load) | k.value_flags() | record::RET, extra: ret },
                    };
                    self.window.push_records(&[r], 0);
                }
                return self.resume_after(engine, ret);
            }
        }
        self.window.note_gap(native);
    }

    /// `native` is in a restartable sequence's critical section, or on the
    /// straight way into one, which the cache does not run
    /// ([`ProcessMap::critical_section`]): the window ends there. Whole-run
    /// windows: it runs natively, unrecorded, and recording resumes past
    /// its end, where a committed section comes out.
    /// Not stepped: each step's trap would abort the section (the kernel
    /// restarts a section at any signal), and the thread would never get
    /// through. A section that leaves by its abort address or a branch of
    /// its own runs natively until it comes out past its end again, or
    /// until the next tick. False if `native` is in no section.
    pub(super) fn run_critical_section(&mut self, engine: &Engine, map: &ProcessMap, uc: *mut libc::ucontext_t, native: u64) -> bool {
        let Some(section) = map.critical_section(native) else { return false };
        self.window.note_critical_section();
        let whole_run = self.window.whole_run();
        self.window.end(uc, native, true);
        if whole_run {
            self.resume_after(engine, section.past);
        }
        true
    }

    /// Whole-run windows: go on natively, and back into the cache at `pc`
    /// when the thread gets there (an instruction breakpoint). Where that
    /// cannot be, the next tick takes the thread back: a gap.
    pub fn resume_after(&mut self, engine: &Engine, pc: u64) {
        let ok = crate::modules::current().is_some_and(|m| m.module(pc).is_some()) && !engine.is_own_code(pc) && self.window.resume.arm(pc);
        if !ok {
            self.window.note_gap(pc);
        }
    }

    /// Run `elements` elements of the `rep` instruction at `native` (the
    /// context's PC) in the cache, then pick the next one (`pick`) or go on.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(super) unsafe fn rep_part(
        &mut self,
        map: &ProcessMap,
        own: (u64, u64),
        native: u64,
        elements: u64,
        pick: bool,
        uc: *mut libc::ucontext_t,
    ) {
        // SAFETY: forwarded from the caller.
        let g = unsafe { gregs(uc) };
        let rcx = g[libc::REG_RCX as usize] as u64;
        let Some(part) = self.window.cache.rep_part(map, own, native) else { return self.window.end(uc, native, true) };
        let data = self.window.cache.data();
        data.rep_native = native;
        data.rep_rest = rcx - elements.min(rcx);
        data.rep_pick = pick as u64;
        g[libc::REG_RCX as usize] = elements.min(rcx) as i64;
        g[libc::REG_RIP as usize] = part as i64;
        self.window.run_rep_part();
    }

    /// Does a handler return into the window's time at `rip`: its copies,
    /// or an entry it calls natively (whose time is the window's: the
    /// window goes on when it returns)?
    pub(super) fn returns_into_window(&mut self, rip: u64) -> bool {
        self.window.cache.is_code(rip) || (self.window.active() && self.window.cache.away_sp().is_some())
    }

    /// May the window go on at `pc` (code the cache runs, or an entry it
    /// calls natively)?
    pub(super) fn translatable(&self, engine: &Engine, map: &ProcessMap, pc: u64) -> bool {
        self.window.cache.runs(map, engine.own_code, pc)
    }

    /// The window ends while the thread is away in a native call's entry
    /// (its context is there): the entry returns natively to the program,
    /// not into the cache (see [`super::window::Window::end`]). False if
    /// the thread is not away.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    unsafe fn come_back_natively(&mut self, uc: *mut libc::ucontext_t) -> bool {
        // SAFETY: forwarded from the caller.
        let rip = unsafe { gregs(uc)[libc::REG_RIP as usize] as u64 };
        if self.window.cache.away_sp().is_none() || self.window.cache.is_code(rip) {
            // Not away, or in the native call itself, before the call or
            // after the return (not expected here: no exit nor access of
            // the program's is there).
            return false;
        }
        self.window.end(uc, rip, true);
        true
    }

    /// Leave the cache wherever the thread is in it, for good (the session
    /// ends, or the window's state cannot go on): the context goes to the
    /// native instruction it stands for, with the program's signal mask.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub unsafe fn leave_cache(&mut self, uc: *mut libc::ucontext_t) {
        if self.window.phase() == Phase::Bridge {
            // Natively already, with the program's mask: only the step goes.
            // SAFETY: forwarded from the caller.
            unsafe { self.window.end_bridge(uc) };
            return;
        }
        if !self.window.active() {
            return;
        }
        // SAFETY: forwarded from the caller.
        if unsafe { self.come_back_natively(uc) } {
            self.burst.reset();
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
            Some(Exit::Stepped { native }) => self.window.cache.stepped_to(native),
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
        // SAFETY: the trap flag of a pick's step is ours; `uc` is forwarded
        // from the caller.
        unsafe { set_trap_flag(uc, false) };
        self.window.end(uc, native, true);
    }

    /// Stop a burst the engine will not finish (the session ends, or the
    /// process is sandboxed): clear the trap flag, and if the thread runs
    /// in its code cache, put it back at the native code with its own
    /// signal mask; the burst is forgotten. No system call.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub unsafe fn drop_burst(&mut self, uc: *mut libc::ucontext_t) {
        // SAFETY: forwarded from the caller; only the context's trap flag,
        // and for a window its PC and signal mask, change.
        unsafe {
            set_trap_flag(uc, false);
            self.leave_cache(uc);
        }
        self.burst.reset();
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
        let left = unsafe { self.leave_at_fault(engine, uc) };
        if left {
            // Outside the engine's own handlers, whose clock would count
            // all the time from here to the next one (the program's
            // handler, and its native running after it: up to a tick)
            // as the window's: the window's time ends here.
            let now = crate::sys::task::thread_cpu_ns();
            self.enter_clock(now);
            self.clock.set_in_cache(false);
            self.clock.leave(false, 0, now, now);
        }
        left
    }

    /// [`ThreadState::leave_cache_at_fault`] but for the clock.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    unsafe fn leave_at_fault(&mut self, engine: &Engine, uc: *mut libc::ucontext_t) -> bool {
        // SAFETY: forwarded from the caller.
        let g = unsafe { gregs(uc) };
        let rip = g[libc::REG_RIP as usize] as u64;
        if !self.window.active() {
            return false;
        }
        // A fault in a native call's entry (the agent's or the C library's
        // allocator): the program's handler sees the native stack.
        // SAFETY: forwarded from the caller.
        if unsafe { self.come_back_natively(uc) } {
            return true;
        }
        if !self.window.cache.is_code(rip) {
            return false;
        }
        let Some(map) = crate::modules::current() else { return false };
        let Some(p) = self.window.cache.point(map, engine.own_code, counted(engine), rip, false) else {
            return false;
        };
        for (reg, slot) in p.spilled.iter() {
            // SAFETY: the slot is in this thread's data page.
            g[greg_of(reg)] = unsafe { *(slot as *const i64) };
        }
        // The faulting instruction did not run: its records go; those
        // before it are kept.
        self.window.take_back_records(p.recorded as u64);
        if self.burst.is_active() {
            // A pick taken without a trap, whose copy faulted: it was not
            // an access, so it is no sample; registers it held off watch again.
            self.stop_burst();
            self.burst.abandon_pick();
        }
        let whole_run = self.window.whole_run();
        self.window.end(uc, p.pc, true);
        if whole_run {
            // Back into the cache where the program's handler returns to
            // (the instruction again), or at the next tick if that comes
            // first (a handler that leaves by `siglongjmp` never returns
            // there). The processor saved the flags of a fault with the
            // resume flag set, which would let the instruction pass the
            // breakpoint once.
            g[libc::REG_EFL as usize] &= !RESUME_FLAG;
            let ok = self.translatable(engine, map, p.pc) && self.window.resume.arm_after_fault(p.pc);
            if !ok {
                self.window.note_gap(p.pc);
            }
        }
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
        for (reg, slot) in p.spilled.iter() {
            // SAFETY: the slot is in this thread's data page.
            view.gpr[reg as usize] = unsafe { *(slot as *const u64) };
        }
        if p.native_return && p.before {
            // A native call read the program's return address before its
            // function ran: the program as after the entry's `ret`.
            let mut ret = [0u8; 8];
            if !crate::sys::mem::read_own(regs.sp(), &mut ret) {
                return None;
            }
            view.gpr[4] += 8;
            view.rip = u64::from_le_bytes(ret);
            return Some((p, view));
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

/// EFLAGS.RF: the next instruction passes an instruction breakpoint.
const RESUME_FLAG: i64 = 1 << 16;

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
