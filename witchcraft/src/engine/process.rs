//! The engine's process-wide part: what every thread's paths read, set up
//! once when profiling starts and immutable after but for three atomics
//! (see [`Engine`]).

use super::budget::{HeadStart, HEAD_START_NS};
use super::sampler::SampleSource;
use super::settings::BurstSettings;
use crate::config::{Config, DEFAULT_SOFTWARE_PERIOD_NS};
use crate::craft::CraftRules;
use crate::x86::translate::NativeCalls;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Process-wide, immutable after start-up but for three atomics: the head
/// start the threads' budgets draw from, whether windows may run, and the
/// start a fork child restarts.
pub struct Engine {
    pub(crate) config: Config,
    pub(crate) craft: &'static dyn CraftRules,
    pub(crate) sampler: SampleSource,
    pub(crate) period: u64,
    pub(crate) sigtrap: bool,
    pub(crate) modify: bool,
    /// The kernel re-targets an enabled breakpoint in place (kernel patch):
    /// freed watchpoints park enabled (see [`super::watch::Watchpoints::free`]).
    pub(crate) in_place: bool,
    /// The agent's own code range: samples there are skipped.
    pub(crate) own_code: (u64, u64),
    /// The definition one of the agent's entries calls on to, where a
    /// recording window may go instead (see [`Engine::calls_on`]).
    pub(crate) calls_on: Option<CallsOn>,
    /// The agent's entries a window (not a recording one) calls natively
    /// and goes on after (its allocation functions; see [`crate::x86::translate::NativeCall`]).
    pub(crate) native_calls: NativeCalls,
    /// Measured CPU cost (ns) of one watchpoint trap round trip and of one
    /// sampler signal, outside our handler code (kernel, and hypervisor in a
    /// VM). See [`super::clock`].
    pub(crate) trap_cost_ns: u64,
    pub(crate) signal_cost_ns: u64,
    /// Measured CPU cost (ns) of one single step outside our handler code.
    pub(crate) step_cost_ns: u64,
    /// The cycle counter's period, to time handlers without system calls.
    pub(crate) ns_per_cycle: f64,
    /// Software samples are single-step bursts (count-proportional); None:
    /// the interrupted instruction's neighbourhood (time-proportional).
    pub(crate) burst: Option<BurstSettings>,
    /// What the bursts may spend beyond the budget at the start.
    pub(crate) head_start: HeadStart,
    /// Bursts may run as windows from the code cache now: a fault a copy
    /// raises reaches the program's handler at the native instruction (a
    /// preloaded agent guards the program's fault handlers; an attached one
    /// cannot, and allows windows only while the program has none).
    pub(crate) windows_allowed: std::sync::atomic::AtomicBool,
    /// When the engine was made, or its process forked from the one that
    /// made it (ns since the Unix epoch): the start of the process's
    /// profile, and its records' image number (see `exact::stream`).
    pub(crate) started_unix_ns: AtomicU64,
}

/// The agent's map from an entry of its own to the definition it calls
/// on to ([`Engine::calls_on`]); must be async-signal-safe.
pub type CallsOn = fn(u64) -> Option<u64>;

/// What the agent found before the engine is made: the sampler it chose,
/// what the kernel supports, where its own code lies, what a round trip
/// costs, and whether windows may run from the start.
pub struct Found {
    pub sampler: SampleSource,
    pub period: u64,
    pub sigtrap: bool,
    pub modify: bool,
    pub in_place: bool,
    pub own_code: (u64, u64),
    /// See [`Engine::calls_on`].
    pub calls_on: Option<CallsOn>,
    /// See [`Engine::native_calls`](Engine).
    pub native_calls: NativeCalls,
    pub costs: Costs,
    pub windows_allowed: bool,
}

impl Engine {
    /// The engine for `cfg` on what the agent `found`, with a note for the
    /// profile for each setting changed on the way.
    pub fn new(cfg: Config, found: Found, notes: &mut Vec<String>) -> Engine {
        let burst = BurstSettings::from_config(&cfg, matches!(found.sampler, SampleSource::Pmu(_)), notes);
        // What cycles count in once a thread turns the time-stamp counter off.
        crate::sys::task::set_cycle_rate(found.costs.ns_per_cycle);
        Engine {
            craft: crate::craft::for_kind(cfg.craft, cfg.fp_precision),
            config: cfg,
            sampler: found.sampler,
            period: found.period,
            sigtrap: found.sigtrap,
            modify: found.modify,
            in_place: found.in_place,
            own_code: found.own_code,
            calls_on: found.calls_on,
            native_calls: found.native_calls,
            trap_cost_ns: found.costs.trap_ns,
            signal_cost_ns: found.costs.signal_ns,
            step_cost_ns: found.costs.step_ns,
            ns_per_cycle: found.costs.ns_per_cycle,
            burst,
            head_start: HeadStart::new(HEAD_START_NS),
            windows_allowed: AtomicBool::new(found.windows_allowed),
            started_unix_ns: AtomicU64::new(unix_ns()),
        }
    }

    /// An engine that will not run: for the profile of a process that is
    /// not profiled (it says why). Nothing was probed or measured.
    pub fn bare(cfg: Config) -> Engine {
        Engine {
            craft: crate::craft::for_kind(cfg.craft, cfg.fp_precision),
            sampler: SampleSource::CpuTimer(crate::sys::cputimer::CpuTime::All),
            period: cfg.period.unwrap_or(DEFAULT_SOFTWARE_PERIOD_NS),
            config: cfg,
            sigtrap: false,
            modify: false,
            in_place: false,
            own_code: (0, 0),
            calls_on: None,
            native_calls: NativeCalls::default(),
            trap_cost_ns: 0,
            signal_cost_ns: 0,
            step_cost_ns: 0,
            ns_per_cycle: 0.0,
            burst: None,
            head_start: HeadStart::new(0),
            windows_allowed: AtomicBool::new(false),
            started_unix_ns: AtomicU64::new(unix_ns()),
        }
    }

    /// When the engine was made, or its process forked (ns since the Unix
    /// epoch).
    pub fn started_unix_ns(&self) -> u64 {
        self.started_unix_ns.load(Ordering::Relaxed)
    }

    /// In a fork child: its profile starts now. Gives the new start.
    pub fn restart_after_fork(&self) -> u64 {
        let now = unix_ns();
        self.started_unix_ns.store(now, Ordering::Relaxed);
        now
    }

    /// The number the process's access records carry: the low 32 bits of
    /// [`Engine::started_unix_ns`].
    pub fn image(&self) -> u32 {
        self.started_unix_ns() as u32
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The sampler, its period (in its unit) and the bursts' settings.
    pub fn sampling(&self) -> (&SampleSource, u64, Option<BurstSettings>) {
        (&self.sampler, self.period, self.burst)
    }

    /// The round trips measured at start-up (zero: not measured).
    pub fn costs(&self) -> Costs {
        Costs { trap_ns: self.trap_cost_ns, signal_ns: self.signal_cost_ns, step_ns: self.step_cost_ns, ns_per_cycle: self.ns_per_cycle }
    }

    /// Let windows run, or not (an attached agent allows them while the
    /// program has no fault handlers).
    pub fn allow_windows(&self, allowed: bool) {
        self.windows_allowed.store(allowed, Ordering::Relaxed);
    }

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
            (SampleSource::Pmu(_), _) => self.period as f64,
            (_, Some(b)) if b.counts_accesses() => 1.0,
            _ => self.period as f64,
        }
    }

    /// Is `pc` in the agent's own code?
    pub fn is_own_code(&self, pc: u64) -> bool {
        pc >= self.own_code.0 && pc < self.own_code.1
    }

    /// If `pc` is one of the agent's entries that only keep books and call
    /// on to the program's own definition (its allocation functions: the
    /// C library's `malloc` after the agent's), that definition. A
    /// recording window goes there instead of leaving the cache for the
    /// agent's code: the definition's accesses are the program's and are
    /// recorded, as `--exact=step` (no agent) steps them, and no trap
    /// takes the thread back at the return. Async-signal-safe.
    pub fn calls_on(&self, pc: u64) -> Option<u64> {
        self.calls_on.and_then(|f| f(pc)).filter(|&d| !self.is_own_code(d))
    }

    /// Windows may run now (see [`Engine::windows_allowed`]).
    pub fn windows_allowed(&self) -> bool {
        self.windows_allowed.load(Ordering::Relaxed)
    }
}

fn unix_ns() -> u64 {
    crate::sys::task::realtime_ns()
}

/// Round trips measured at start-up (ns of CPU time outside our handlers).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Costs {
    pub trap_ns: u64,
    pub signal_ns: u64,
    pub step_ns: u64,
    pub ns_per_cycle: f64,
}

/// What a line of shared round trips starts with (its format's version).
const COSTS_LINE: &str = "witch round trips v1";

impl Costs {
    /// One line for the other processes of a run to read (see
    /// `Config::round_trips`), naming the process `pid` that measured them.
    pub fn to_line(&self, pid: u32) -> String {
        format!("{COSTS_LINE} {} {} {} {} {pid}\n", self.trap_ns, self.signal_ns, self.step_ns, self.ns_per_cycle)
    }

    /// A line made by [`Costs::to_line`], and the process that measured
    /// it; None for anything else (a torn or foreign file, figures no
    /// machine gives: a round trip over 10 ms, a clock under 10 MHz).
    pub fn from_line(line: &str) -> Option<(Costs, u32)> {
        let rest = line.strip_suffix('\n')?.strip_prefix(COSTS_LINE)?.strip_prefix(' ')?;
        let f: Vec<&str> = rest.split(' ').collect();
        let [trap, signal, step, per_cycle, pid] = f[..] else { return None };
        let ns = |s: &str| s.parse::<u64>().ok().filter(|&n| n <= 10_000_000);
        let costs = Costs { trap_ns: ns(trap)?, signal_ns: ns(signal)?, step_ns: ns(step)?, ns_per_cycle: per_cycle.parse().ok()? };
        let pid = pid.parse::<u32>().ok().filter(|&p| p > 0)?;
        (costs.ns_per_cycle > 0.0 && costs.ns_per_cycle < 100.0).then_some((costs, pid))
    }
}

#[cfg(test)]
mod tests {
    use super::Costs;

    #[test]
    fn round_trips_are_shared_as_one_line_read_back_exactly() {
        let c = Costs { trap_ns: 13_300, signal_ns: 3_100, step_ns: 12_100, ns_per_cycle: 1.0 / 2.994_123 };
        let line = c.to_line(4242);
        assert_eq!(Costs::from_line(&line), Some((c, 4242)));
        // No single steps here (0) is a figure too.
        let none = Costs { step_ns: 0, ..c };
        assert_eq!(Costs::from_line(&none.to_line(7)), Some((none, 7)));
        let bad = [
            String::new(),
            line.trim_end().to_string(),       // torn: no end of line
            line.replace("v1", "v2"),          // another format
            line.replace("13300", "-13300"),   // not a count
            line.replace("13300", "99999999"), // a round trip of 100 ms
            line.replace(" 4242", " 0"),       // no process
            line.replace(" 4242", " 4242 9"),  // a field too many
            c.to_line(1).replace(&c.ns_per_cycle.to_string(), "NaN"),
            c.to_line(1).replace(&c.ns_per_cycle.to_string(), "0"),
            "\0".repeat(64),
        ];
        for b in bad {
            assert_eq!(Costs::from_line(&b), None, "{b:?}");
        }
    }
}
