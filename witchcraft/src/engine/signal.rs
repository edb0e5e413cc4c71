//! One of our signals on a thread: which it is ([`classify`]), and its
//! handling ([`ThreadState::handle`]): the sample path ([`super::sample`]),
//! a burst's step ([`super::burst`]), the trap path ([`super::trap`]), a
//! copy's exit from the code cache ([`super::cache_exit`]) or the exact
//! mode's way back into it ([`super::recording`]), with the time
//! accounting ([`super::clock`]) around each. This is the top of the
//! engine's per-thread floors: the paths below it call down, never back.

use super::process::Engine;
use super::stepping::set_trap_flag;
use super::thread::ThreadState;
use super::window::Phase;
use crate::sys::siginfo::{self, Origin};
use crate::sys::task;
use std::sync::atomic::Ordering;

/// One of our signals, as the engine handles it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The sampler fired.
    Sample,
    /// The watchpoint in `slot` fired (`flags`: `si_perf_flags`).
    Trap { slot: usize, flags: u32 },
    /// A single step of this thread's burst.
    Step,
    /// A copy in this thread's code cache left through an exit (`int3`).
    CacheExit,
    /// The exact mode's instruction breakpoint: the thread got back to
    /// code to record (after a system call, at its start).
    Resume,
    /// Ours, from a sampler or watchpoint no longer armed on this thread
    /// (closed, or the session ended, while its signal was queued or its
    /// handler was interrupted, by a stop say): dropped. The program's
    /// default action for the signal would kill it.
    Stale,
}

/// Is signal `sig` one of ours, and which? `thread` is the receiving
/// thread's state, if it has one (signals routed with F_SETSIG name their
/// event by fd, which only the thread knows). Async-signal-safe.
///
/// # Safety
/// `info` must point to the `siginfo_t` the kernel passed to the handler.
pub unsafe fn classify(sig: i32, info: *const libc::siginfo_t, thread: Option<&ThreadState>) -> Option<Event> {
    // SAFETY: forwarded from the caller.
    match unsafe { siginfo::origin(sig, info) } {
        Origin::Perf { data, flags } if data & siginfo::TAG_MASK == siginfo::TAG => {
            let low = data & !siginfo::TAG_MASK;
            Some(match low {
                siginfo::TAG_SAMPLER => Event::Sample,
                siginfo::TAG_RESUME => Event::Resume,
                _ => Event::Trap { slot: low as usize, flags },
            })
        }
        // The tag says it is ours, with or without a state to take it.
        Origin::Timer { value } if sig == siginfo::sampler_signal() && value == siginfo::TAG | siginfo::TAG_SAMPLER => {
            Some(if thread.is_some() { Event::Sample } else { Event::Stale })
        }
        Origin::Fd(fd) if sig == siginfo::sampler_signal() => {
            let armed = thread.and_then(|t| {
                if t.sampler.fd() == Some(fd) {
                    Some(Event::Sample)
                } else {
                    t.ledger.watch().slot_of_fd(fd).map(|slot| Event::Trap { slot, flags: 0 })
                }
            });
            // An fd in witch's own descriptor range was one of witch's.
            armed.or_else(|| crate::sys::fd::is_reserved(fd).then_some(Event::Stale))
        }
        // A whole-run bridge's step is an exit from the cache's point of view.
        Origin::Step if thread.is_some_and(|t| t.window.phase() == Phase::Bridge) => Some(Event::CacheExit),
        Origin::Step => thread.filter(|t| t.burst.is_active()).map(|_| Event::Step),
        Origin::Breakpoint => thread.filter(|t| t.window.active()).map(|_| Event::CacheExit),
        _ => None,
    }
}

/// Clear the trap flag (EFLAGS.TF) in the interrupted context: a single
/// step trap that no burst claims, which witch's flag left behind
/// ([`ThreadState::take_left_trap_flag`]). Async-signal-safe.
///
/// # Safety
/// `uc` must be the context the kernel passed to the signal handler.
pub unsafe fn clear_trap_flag(uc: *mut libc::ucontext_t) {
    // SAFETY: forwarded from the caller.
    unsafe { set_trap_flag(uc, false) };
}

impl ThreadState {
    /// Handle one of our signals (see [`classify`]) on this thread: the
    /// sample or trap path, with the time accounting around it.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub unsafe fn handle(&mut self, engine: &Engine, event: Event, uc: *mut libc::ucontext_t) {
        if !self.is_active() || event == Event::Stale {
            return;
        }
        self.in_handler.store(true, Ordering::Release);
        if event == Event::Step {
            // No clock system call per step: the handler is timed with the
            // cycle counter and the round trip is the clock's estimate,
            // which the burst's last step corrects with one clock read.
            let c0 = task::cycles();
            let first = self.burst.first_step();
            if let Some(map) = crate::modules::current() {
                // SAFETY: forwarded from the caller.
                unsafe { self.on_step(engine, map, uc) };
                if !self.burst.is_active() && self.window.phase() == Phase::Step {
                    // A window's pick was stepped: back into the cache.
                    // SAFETY: forwarded from the caller.
                    unsafe { self.resume_window(engine, map, uc) };
                }
            } else if self.window.active() {
                // SAFETY: forwarded from the caller.
                unsafe { self.leave_cache(uc) };
            }
            // SAFETY: forwarded from the caller.
            let rip = unsafe { (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] as u64 };
            let into = self.returns_into_window(rip);
            self.clock.set_in_cache(into);
            // The burst's last step reads the clock once, to time the burst.
            let ended = !self.burst.is_active();
            let now = if ended { task::thread_cpu_ns() } else { 0 };
            let handler = (task::cycles().wrapping_sub(c0) as f64 * engine.ns_per_cycle) as u64;
            let cost = self.clock.step(first, handler);
            self.budget.note_step(cost);
            // The burst's whole account, corrected to what it measured.
            let fix = if ended { self.clock.burst_ended(now) } else { 0 };
            let cost = (cost as i64).saturating_add(fix);
            let counters = &mut self.ledger.counters;
            counters.engine_ns = counters.engine_ns.saturating_add_signed(cost);
            counters.step_ns = counters.step_ns.saturating_add_signed(cost);
            self.in_handler.store(false, Ordering::Release);
            return;
        }
        let entry = task::thread_cpu_ns();
        // The steps since the last clock read, bounded by the CPU time they took.
        let fix = self.clock.settle_steps(entry);
        let counters = &mut self.ledger.counters;
        counters.engine_ns = counters.engine_ns.saturating_add_signed(fix);
        counters.step_ns = counters.step_ns.saturating_add_signed(fix);
        self.enter_clock(entry);
        let cost = match event {
            Event::Sample => {
                // SAFETY: forwarded from the caller.
                unsafe { self.on_sample(engine, uc) };
                let cost = self.clock.leave(false, engine.signal_cost_ns, entry, task::thread_cpu_ns());
                self.ledger.counters.tick_ns += cost;
                cost
            }
            Event::Trap { slot, flags } => {
                // SAFETY: forwarded from the caller.
                unsafe { self.on_trap(engine, slot, uc, flags) };
                let cost = self.clock.leave(true, engine.signal_cost_ns, entry, task::thread_cpu_ns());
                self.ledger.counters.trap_ns += cost;
                cost
            }
            Event::CacheExit => {
                match crate::modules::current() {
                    // SAFETY: forwarded from the caller.
                    Some(map) => unsafe { self.on_cache_exit(engine, map, uc) },
                    // SAFETY: forwarded from the caller.
                    None => unsafe { self.leave_cache(uc) },
                }
                let cost = self.clock.leave(true, engine.signal_cost_ns, entry, task::thread_cpu_ns());
                self.ledger.counters.exit_ns += cost;
                cost
            }
            Event::Resume => {
                if let Some(map) = crate::modules::current() {
                    // SAFETY: forwarded from the caller.
                    unsafe { self.on_resume(engine, map, uc) };
                }
                let cost = self.clock.leave(true, engine.signal_cost_ns, entry, task::thread_cpu_ns());
                self.ledger.counters.exit_ns += cost;
                cost
            }
            Event::Step | Event::Stale => unreachable!("handled above"),
        };
        // SAFETY: forwarded from the caller.
        let rip = unsafe { (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] as u64 };
        let into = self.returns_into_window(rip);
        self.clock.set_in_cache(into);
        self.ledger.counters.engine_ns += cost;
        self.in_handler.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(code: i32, at24: u64) -> libc::siginfo_t {
        // SAFETY: siginfo_t is plain data.
        let mut i: libc::siginfo_t = unsafe { std::mem::zeroed() };
        i.si_code = code;
        // SAFETY: inside the 128-byte siginfo (si_value of a timer).
        unsafe { std::ptr::write_unaligned((&mut i as *mut libc::siginfo_t as *mut u8).add(24) as *mut u64, at24) };
        i
    }

    /// A tagged sampler signal that finds no state (the session ended while
    /// it was queued, or while the thread was stopped in the handler before
    /// it found its state) is still ours: passed on, the program's default
    /// action would kill it.
    #[test]
    fn a_tagged_signal_without_a_state_is_ours_and_dropped() {
        let timer = info(libc::SI_TIMER, siginfo::TAG | siginfo::TAG_SAMPLER);
        // SAFETY: a whole siginfo_t.
        assert_eq!(unsafe { classify(siginfo::sampler_signal(), &timer, None) }, Some(Event::Stale));
        // Another timer's signal on the same number is the program's.
        let theirs = info(libc::SI_TIMER, 7);
        // SAFETY: as above.
        assert_eq!(unsafe { classify(siginfo::sampler_signal(), &theirs, None) }, None);
        let perf = {
            let mut i = info(siginfo::TRAP_PERF, 0);
            // SAFETY: si_perf_data at 24.
            unsafe { std::ptr::write_unaligned((&mut i as *mut libc::siginfo_t as *mut u8).add(24) as *mut u64, siginfo::slot_tag(2)) };
            i
        };
        // SAFETY: as above.
        assert_eq!(unsafe { classify(libc::SIGTRAP, &perf, None) }, Some(Event::Trap { slot: 2, flags: 0 }));
    }
}
