//! The engine's process-wide part: what every thread's paths read, set up
//! once when profiling starts and immutable after (but for the head start,
//! an atomic the threads' budgets draw from).

use super::budget::HeadStart;
use super::sampler::SamplerKind;
use super::settings::BurstSettings;
use crate::config::Config;
use crate::craft::Craft;

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
    /// freed watchpoints park enabled (see [`super::watch::Watchpoints::free`]).
    pub in_place: bool,
    /// The agent's own code range: samples there are skipped.
    pub own_code: (u64, u64),
    /// Measured CPU cost (ns) of one watchpoint trap round trip and of one
    /// sampler signal, outside our handler code (kernel, and hypervisor in a
    /// VM). See [`super::clock`].
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
    pub head_start: HeadStart,
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

    /// Is `pc` in the agent's own code?
    pub fn is_own_code(&self, pc: u64) -> bool {
        pc >= self.own_code.0 && pc < self.own_code.1
    }

    /// Windows may run now (see [`Engine::windows_allowed`]).
    pub fn windows_allowed(&self) -> bool {
        self.windows_allowed.load(std::sync::atomic::Ordering::Relaxed)
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
