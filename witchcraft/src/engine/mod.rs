//! The Witch engine: samples arm watchpoints, traps are judged by the
//! craft, and the result is attributed to ⟨C_watch, C_trap⟩.
//!
//! [`Engine`] is the process-wide, immutable part; [`ThreadState`] is one
//! thread's. A signal handler asks [`classify`] whether a signal is ours and
//! hands it to [`ThreadState::handle`], which runs the sample path
//! ([`sample`]) or the trap path ([`trap`]) with the time accounting
//! ([`clock`]) around it. Everything reachable from there runs in a signal
//! handler: no allocation, no locks, no stdio.

pub mod budget;
pub mod burst;
pub mod cache;
mod cache_exit;
pub mod calibrate;
pub mod clock;
mod crossing;
mod pick;
pub mod recorder;
pub mod recording;
pub mod resume;
pub mod sample;
pub mod sampler;
mod stepping;
pub mod thread;
pub mod trap;
pub mod watch;
pub mod window;

pub use burst::BurstSettings;
pub use sampler::{Sampler, SamplerKind};
pub use thread::{Place, ThreadState};
pub use watch::MAX_SLOTS;

use crate::config::Config;
use crate::craft::Craft;
use crate::sys::siginfo::{self, Origin};

/// Process-wide, immutable after start-up (but for the head start, an
/// atomic the threads' budgets draw from).
pub struct Engine {
    pub config: Config,
    pub craft: &'static dyn Craft,
    pub sampler: SamplerKind,
    pub period: u64,
    pub sigtrap: bool,
    pub modify: bool,
    /// The kernel re-targets an enabled breakpoint in place (kernel patch):
    /// freed watchpoints park enabled (see [`watch::Watchpoints::free`]).
    pub in_place: bool,
    /// The agent's own code range: samples there are skipped.
    pub own_code: (u64, u64),
    /// Measured CPU cost (ns) of one watchpoint trap round trip and of one
    /// sampler signal, outside our handler code (kernel, and hypervisor in a
    /// VM). See [`clock`].
    pub trap_cost_ns: u64,
    pub signal_cost_ns: u64,
    /// Measured CPU cost (ns) of one single step outside our handler code.
    pub step_cost_ns: u64,
    /// The cycle counter's period, to time handlers without system calls.
    pub ns_per_cycle: f64,
    /// Software samples are single-step bursts (count-proportional); None:
    /// the interrupted instruction's neighbourhood (time-proportional).
    pub burst: Option<BurstSettings>,
    /// What the bursts may spend beyond the budget at the start.
    pub head_start: budget::HeadStart,
    /// Bursts may run as windows from the code cache now: a fault a copy
    /// raises reaches the program's handler at the native instruction (a
    /// preloaded agent guards the program's fault handlers; an attached one
    /// cannot, and allows windows only while the program has none).
    pub windows_allowed: std::sync::atomic::AtomicBool,
}

impl Engine {
    /// What one unit of sample weight stands for, in the unit the pair
    /// totals are kept in: a PMU sample stands for `period` accesses (so
    /// totals are bytes), as does a pick of the whole-run access counters
    /// (its weight counts the accesses it stands for: bytes). A software
    /// sample at a tick stands for `period` ns of the program's time, and
    /// a burst's or window's pick for the accesses of its burst or window
    /// times the periods its tick stands for: byte·ns either way. Those
    /// are not the program's bytes (a window of W instructions sees W of
    /// the instructions its period ran, and without a PMU nothing counts
    /// the others): only their ratios are meaningful.
    pub fn unit_scale(&self) -> f64 {
        match (&self.sampler, self.burst) {
            (SamplerKind::Pmu(_), _) => self.period as f64,
            (_, Some(b)) if b.counts_accesses() => 1.0,
            _ => self.period as f64,
        }
    }
}

/// Round trips measured at start-up (ns of CPU time outside our handlers).
#[derive(Clone, Copy, Debug, Default)]
pub struct Costs {
    pub trap_ns: u64,
    pub signal_ns: u64,
    pub step_ns: u64,
    pub ns_per_cycle: f64,
}

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
                    t.watch.slot_of_fd(fd).map(|slot| Event::Trap { slot, flags: 0 })
                }
            });
            // An fd in witch's own descriptor range was one of witch's.
            armed.or_else(|| crate::sys::fd::is_reserved(fd).then_some(Event::Stale))
        }
        // A whole-run bridge's step is an exit from the cache's point of view.
        Origin::Step if thread.is_some_and(|t| t.window.phase == window::Phase::Bridge) => Some(Event::CacheExit),
        Origin::Step => thread.filter(|t| t.burst.active).map(|_| Event::Step),
        Origin::Breakpoint => thread.filter(|t| t.window.active()).map(|_| Event::CacheExit),
        _ => None,
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
