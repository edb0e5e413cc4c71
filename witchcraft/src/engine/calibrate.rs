//! What one single step costs this thread: its SIGTRAP round trip (debug
//! exception, signal delivery, sigreturn; in a VM the hypervisor's part
//! too) and the handler that sets the trap flag again. The software
//! sampler's bursts pay it per instruction, so the agent measures it at
//! start-up (with its other round trips, which go through its own
//! handlers) and `witch doctor` measures it to say what a burst buys
//! (`probe::single_step_ns`); both run [`measure_steps`].
//!
//! The handler of the signal that starts a measurement calls
//! [`start_stepping`]; the handler of each single-step trap (SIGTRAP,
//! `TRAP_TRACE`) calls [`on_step`]. Both are async-signal-safe.

use crate::sys::task::thread_cpu_ns;
use std::sync::atomic::{AtomicU64, Ordering};

/// The trap flag in EFLAGS: set, the CPU traps after the next instruction.
pub const TRAP_FLAG: i64 = 0x100;

/// Steps left in the running measurement (0: none running).
static STEPS_LEFT: AtomicU64 = AtomicU64::new(0);

/// How many rounds of the busy loop a measurement waits for its steps: a
/// step takes a few loop instructions, so only a trap flag that never
/// takes effect (stepping does not work here) reaches it, after about 1 ms.
const SPIN_LIMIT: u64 = 1_000_000;

/// Is a step measurement running (are single-step traps its own)?
pub fn stepping() -> bool {
    STEPS_LEFT.load(Ordering::Relaxed) > 0
}

/// In the handler of the signal that starts a measurement, with `efl` the
/// interrupted context's EFLAGS: step from where it resumes.
pub fn start_stepping(efl: &mut i64) {
    if stepping() {
        *efl |= TRAP_FLAG;
    }
}

/// In the handler of a single-step trap, with `efl` the interrupted
/// context's EFLAGS: one instruction ran; step the next, or stop after the
/// last (and whenever no measurement runs).
pub fn on_step(efl: &mut i64) {
    let left = STEPS_LEFT.load(Ordering::Relaxed);
    if left > 1 {
        STEPS_LEFT.store(left - 1, Ordering::Relaxed);
        *efl |= TRAP_FLAG;
    } else {
        STEPS_LEFT.store(0, Ordering::Relaxed);
        *efl &= !TRAP_FLAG;
    }
}

/// Single-step `steps` instructions of a busy loop on this thread: `kick`
/// sends this thread the signal whose handler calls [`start_stepping`].
/// Returns the thread CPU time (ns) from before `kick` until the last step,
/// the kick's round trip included, and the steps taken (fewer than `steps`
/// only where stepping stalls or does not work).
pub fn measure_steps(steps: u64, kick: impl FnOnce()) -> (u64, u64) {
    STEPS_LEFT.store(steps, Ordering::Relaxed);
    let t0 = thread_cpu_ns();
    kick();
    let mut spin = 0u64;
    while stepping() && spin < SPIN_LIMIT {
        spin = std::hint::black_box(spin + 1);
    }
    let t1 = thread_cpu_ns();
    let stepped = steps - STEPS_LEFT.swap(0, Ordering::Relaxed);
    (t1.saturating_sub(t0), stepped)
}
