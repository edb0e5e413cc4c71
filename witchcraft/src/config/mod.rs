//! Agent configuration, and its one encoding as `WITCH_*` settings: the
//! environment `witch` gives a preloaded agent, and the lines it sends an
//! attached one ([`Config::to_pairs`] builds them, [`Config::from_lookup`]
//! reads them).
//!
//! The agent is inert unless `WITCH_CRAFT` is set, so an inherited
//! `LD_PRELOAD` in an unrelated program costs nothing.

use crate::profile::Craft;
use crate::replacement::Policy;
use std::path::PathBuf;
use table::SETTINGS;

mod table;

/// Default software period: 5 ms of thread CPU time (≈200 samples/s/thread,
/// hpcrun's usual rate). A timer sample and a trap cost tens of µs at
/// most (`cargo bench -p witch-benches`; docs/OVERHEAD.md), so sample +
/// self-trap + trap stay a small share of the period.
pub const DEFAULT_SOFTWARE_PERIOD_NS: u64 = 5_000_000;
/// Instructions a single-step burst of the software sampler takes by
/// default. Every burst takes this many (unless the code ends it early), and
/// the overhead budget decides which ticks begin one (in a VM, one tick in
/// a few at the default period and budget). Short bursts at every tick
/// start where the time goes and see little else, and 16 and 32 steps did
/// worse than 24 on the real programs (docs/ACCURACY.md, "A burst at
/// every tick").
pub const DEFAULT_BURST_STEPS: u32 = 24;
/// Default accesses picked per burst. A burst of 24 steps judges many of
/// its picks itself (their next access comes within it), so more picks than
/// debug registers still pay (docs/ACCURACY.md compares them).
pub const DEFAULT_BURST_PICKS: u32 = 8;
/// Whether a burst picks its accesses in proportion to their bytes by
/// default (otherwise each access alike; docs/ACCURACY.md compares them).
pub const DEFAULT_BURST_PICK_BYTES: bool = false;
/// Instructions a burst window runs from the code cache by default (see
/// `engine::window`). A window's instructions cost nanoseconds each in the
/// cache, so the budget pays mostly for its picks: a long window costs
/// little more than a short one and sees more of the code around where it
/// starts (docs/ACCURACY.md measures the lengths).
pub const DEFAULT_WINDOW_INSTRUCTIONS: u32 = 8192;
/// Picks a window expects by default: each costs an exit, a single step and
/// usually a trap later, tens of µs in a VM.
pub const DEFAULT_WINDOW_PICKS: f64 = 8.0;
/// Default overhead budget of the software sampler's bursts: the engine's
/// own share of the program's CPU time, in percent.
pub const DEFAULT_OVERHEAD_PERCENT: f64 = 3.0;

/// The software access counters (`-e sw-stores`, `-e sw-loads`): the whole
/// run goes through the code cache, which picks every Nth access of the
/// craft's kind on average (see `engine::window`), N the period.
pub const COUNT_EVENTS: [&str; 2] = ["sw-stores", "sw-loads"];

/// The counters' default period, in accesses: the PMU's.
pub const DEFAULT_COUNT_PERIOD: u64 = DEFAULT_PMU_PERIOD;

/// The counters' shortest period: each pick costs a few signal round trips,
/// about what 100,003 accesses take natively, so at that period the
/// program runs a few times slower; shorter would be worse.
pub const MIN_COUNT_PERIOD: u64 = MIN_PMU_PERIOD;

/// Instructions a whole-run window runs before the engine looks at the
/// program's pending signals (which wait while it runs in the cache):
/// short enough that a signal waits little.
pub const COUNT_WINDOW_INSTRUCTIONS: u32 = 1 << 20;
/// Shortest software sampling period (ns of thread CPU time). A perf
/// software clock signals each period with a queued real-time signal; when
/// periods end faster than the handler and the signal's round trip take
/// (several µs, tens with traps and unwinding), the queue grows until
/// the kernel falls back to SIGIO, which kills the program (measured: every
/// period up to 10 µs did; 50 µs held). 100 µs leaves a margin of ten.
pub const MIN_SOFTWARE_PERIOD_NS: u64 = 100_000;
/// Default PMU period: a prime, as PMU sampling recommends (Witch §4.7).
pub const DEFAULT_PMU_PERIOD: u64 = 5_000_003;
/// Shortest PMU sampling period (events: stores, loads, or IBS ops). A PMU
/// event counts user-mode accesses, the engine's own included: its handler
/// decodes, unwinds and re-arms (hundreds to thousands of accesses a
/// sample; decoding a cold 7.6 KB function, tens of thousands), and a
/// period near that would sample the engine itself, each signal queueing
/// the next until the signal queue overflows as at `-p 10us`. 100,003 is
/// the shortest period the Witch paper studied (100K, "Watching for
/// Software Inefficiencies with Witch", Figure 4.5), kept prime like the
/// default. A core retires at most about one store (two to three loads)
/// a cycle, so at 4 GHz samples stay at least 25 µs (10 µs) apart: at or
/// under perf's default kernel limit, `perf_event_max_sample_rate` =
/// 100,000 samples/s. A safety floor, not a cheap period: a sample with its
/// trap costs tens of µs (docs/OVERHEAD.md), so near the floor the
/// engine can take most of a store-bound program's time.
pub const MIN_PMU_PERIOD: u64 = 100_003;
/// Default relative precision at which two floating-point values are equal.
pub const DEFAULT_FP_PRECISION: f64 = 0.01;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SamplerChoice {
    Auto,
    Software,
    Pmu,
}

impl SamplerChoice {
    pub fn name(self) -> &'static str {
        match self {
            SamplerChoice::Auto => "auto",
            SamplerChoice::Software => "software",
            SamplerChoice::Pmu => "pmu",
        }
    }

    pub fn parse(s: &str) -> Option<SamplerChoice> {
        [SamplerChoice::Auto, SamplerChoice::Software, SamplerChoice::Pmu].into_iter().find(|c| c.name() == s)
    }
}

/// What a burst's pick stands for: the program time of its tick, in
/// periods, times a count of the burst's accesses (`WITCH_BURST_WEIGHT`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BurstWeight {
    /// K, the accesses the burst stepped through (over the picks). Right
    /// when every burst steps as many instructions.
    #[default]
    Accesses,
    /// K/L, accesses per instruction stepped (times the most steps a burst
    /// takes, to keep the scale of [`BurstWeight::Accesses`]): right when
    /// the budget or the code (a `syscall` ends a burst) makes bursts
    /// differ in length, since a burst twice as long does not stand for
    /// twice the program's time.
    PerStep,
    /// Experimental: 1 (each burst alike).
    PerBurst,
}

impl BurstWeight {
    pub fn parse(v: &str) -> Option<BurstWeight> {
        match v {
            "accesses" | "access" => Some(BurstWeight::Accesses),
            "step" | "per-step" => Some(BurstWeight::PerStep),
            "one" => Some(BurstWeight::PerBurst),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            BurstWeight::Accesses => "accesses",
            BurstWeight::PerStep => "step",
            BurstWeight::PerBurst => "one",
        }
    }
}

/// The names of the settings.
pub mod keys {
    pub const CRAFT: &str = "WITCH_CRAFT";
    pub const PERIOD: &str = "WITCH_PERIOD";
    pub const SAMPLER: &str = "WITCH_SAMPLER";
    pub const EVENT: &str = "WITCH_EVENT";
    pub const DEBUG_REGISTERS: &str = "WITCH_DEBUG_REGISTERS";
    pub const REPLACEMENT: &str = "WITCH_REPLACEMENT";
    pub const FP_PRECISION: &str = "WITCH_FP_PRECISION";
    pub const OUT_DIR: &str = "WITCH_OUT_DIR";
    pub const NO_SIGTRAP: &str = "WITCH_NO_SIGTRAP";
    pub const NO_MODIFY: &str = "WITCH_NO_MODIFY";
    pub const SEED: &str = "WITCH_SEED";
    pub const BURST: &str = "WITCH_BURST";
    pub const BURST_WEIGHT: &str = "WITCH_BURST_WEIGHT";
    pub const BURST_PICKS: &str = "WITCH_BURST_PICKS";
    pub const BURST_PICK: &str = "WITCH_BURST_PICK";
    pub const BURST_MIN: &str = "WITCH_BURST_MIN";
    pub const BURST_SYSCALL: &str = "WITCH_BURST_SYSCALL";
    pub const WINDOW: &str = "WITCH_WINDOW";
    pub const WINDOW_PICKS: &str = "WITCH_WINDOW_PICKS";
    pub const LINKS: &str = "WITCH_LINKS";
    pub const CACHE_PICKS: &str = "WITCH_CACHE_PICKS";
    pub const WINDOW_TIME: &str = "WITCH_WINDOW_TIME";
    pub const OVERHEAD: &str = "WITCH_OVERHEAD";
    pub const ONLY_PID: &str = "WITCH_ONLY_PID";
    pub const EXE: &str = "WITCH_EXE";
    pub const RECORD_FD: &str = "WITCH_RECORD_FD";
    pub const HEAP_THRESHOLD: &str = "WITCH_HEAP_THRESHOLD";
    pub const ROUND_TRIPS: &str = "WITCH_ROUND_TRIPS";
}

#[derive(Clone, Debug)]
pub struct Config {
    pub craft: Craft,
    /// None = the chosen sampler's default.
    pub period: Option<u64>,
    pub sampler: SamplerChoice,
    /// Software event ("task-clock" or "cpu-clock") or PMU event spec.
    pub event: Option<String>,
    pub debug_registers: usize,
    pub replacement: Policy,
    pub fp_precision: f64,
    pub out_dir: PathBuf,
    /// Force the pre-5.13 F_SETSIG signal route (for testing).
    pub no_sigtrap: bool,
    /// Force close+reopen instead of PERF_EVENT_IOC_MODIFY_ATTRIBUTES (for testing).
    pub no_modify: bool,
    pub seed: Option<u64>,
    /// Instructions per single-step burst of the software sampler (0: no
    /// bursts, the time-proportional look-around); None: the default.
    pub burst_steps: Option<u32>,
    /// What a burst's sample stands for (`WITCH_BURST_WEIGHT`: "one",
    /// "accesses" or "step"); None: the default.
    pub burst_weight: Option<BurstWeight>,
    /// Accesses picked per burst; None: the default.
    pub burst_picks: Option<u32>,
    /// How a burst picks among its accesses: true, in proportion to their
    /// bytes; false, each access alike; None: the default.
    pub burst_pick_bytes: Option<bool>,
    /// Fewest steps a burst takes; a tick the budget cannot pay that many
    /// for begins none. None: the default (every burst takes all its
    /// steps); Some(0): every tick begins a burst of what the budget pays.
    pub burst_min_steps: Option<u32>,
    /// Experimental: begin bursts also at ticks that land right after a
    /// system call (whose period ran out in the kernel).
    pub burst_after_syscall: bool,
    /// Instructions per window of the code-cache burst engine (0: single-step
    /// bursts, the fallback); None: the default.
    pub window: Option<u32>,
    /// Picks a window expects; None: the default.
    pub window_picks: Option<f64>,
    /// Every exit of the code cache traps, even one that only asks for a
    /// copy (`WITCH_LINKS=0`; by default such exits go through the link
    /// stub, without a trap).
    pub no_links: bool,
    /// Every pick of a window leaves the cache at a trap and is stepped
    /// natively (`WITCH_CACHE_PICKS=0`; by default a pick goes through the
    /// link stub and its instruction runs from a copy, without a trap).
    pub no_cache_picks: bool,
    /// Each pick of a window is weighed by the inverse of the time the
    /// window's copies took around it (`WITCH_WINDOW_TIME=1`; see
    /// `engine::pace`). Off by default: measured, it moved a known answer
    /// but not the real programs' biases (ACCURACY.md).
    pub timed_windows: bool,
    /// Overhead budget of bursts, percent of program CPU time (0: no
    /// limit); None: the default.
    pub overhead_percent: Option<f64>,
    /// Profile only this process (its exec'd images too), not its children;
    /// Some(0): the first process that loads the agent, which then writes
    /// its own pid here for its images and children to read.
    pub only_pid: Option<u32>,
    /// Profile only processes running one of these executables (file names); empty: all.
    pub exe_names: Vec<String>,
    /// The exact mode from the code cache (`witch CRAFT --exact`): the
    /// whole program runs from the cache in recording copies, and every
    /// access record goes, a buffer at a time, to this descriptor (a
    /// datagram socket witch reads; see `exact::stream`).
    pub record_fd: Option<i32>,
    /// Heap blocks of at least this many bytes are tracked as data objects
    /// (0: none); None: [`crate::heap::DEFAULT_THRESHOLD`].
    pub heap_threshold: Option<u64>,
    /// Where the processes of one run share the kernel's round trips that
    /// the first of them measured (a file in the run's own directory of
    /// parts); None: each process measures its own.
    pub round_trips: Option<PathBuf>,
}

impl Config {
    /// The defaults for `craft` (what an empty environment besides
    /// `WITCH_CRAFT` means).
    pub fn new(craft: Craft) -> Config {
        Config {
            craft,
            period: None,
            sampler: SamplerChoice::Auto,
            event: None,
            debug_registers: 4,
            replacement: Policy::Reservoir,
            fp_precision: DEFAULT_FP_PRECISION,
            out_dir: PathBuf::from("."),
            no_sigtrap: false,
            no_modify: false,
            seed: None,
            burst_steps: None,
            burst_weight: None,
            burst_picks: None,
            burst_pick_bytes: None,
            burst_min_steps: None,
            burst_after_syscall: false,
            window: None,
            window_picks: None,
            no_links: false,
            no_cache_picks: false,
            timed_windows: false,
            overhead_percent: None,
            only_pid: None,
            exe_names: Vec::new(),
            record_fd: None,
            round_trips: None,
            heap_threshold: None,
        }
    }

    /// Is the process `pid`, running the executable named `exe` (its file
    /// name; None: not known, so not filtered on), one to profile?
    pub fn follows(&self, pid: u32, exe: Option<&str>) -> bool {
        self.only_pid.is_none_or(|p| p == pid) && (self.exe_names.is_empty() || exe.is_none_or(|e| self.exe_names.iter().any(|n| n == e)))
    }

    /// The testing and experimental knobs (`WITCH_NO_SIGTRAP`,
    /// `WITCH_NO_MODIFY`, `WITCH_SEED`, `WITCH_BURST*`, `WITCH_WINDOW*`,
    /// `WITCH_LINKS`, `WITCH_CACHE_PICKS`, `WITCH_OVERHEAD`) from this process's environment, as
    /// a controller passes them on to the agent it starts; checked as the
    /// agent checks them.
    pub fn with_knobs_from_env(mut self) -> Result<Config, String> {
        for s in SETTINGS.iter().filter(|s| s.knob) {
            if let Some(v) = std::env::var(s.key).ok().filter(|v| !v.is_empty()) {
                s.read_into(&mut self, &v)?;
            }
        }
        Ok(self)
    }

    /// The settings as `WITCH_*` pairs, the ones [`Config::from_lookup`]
    /// reads back to an equal `Config`.
    pub fn to_pairs(&self) -> Vec<(&'static str, String)> {
        let mut v = vec![(keys::CRAFT, self.craft.name().to_string())];
        v.extend(SETTINGS.iter().filter_map(|s| Some((s.key, (s.write)(self)?))));
        v
    }

    /// [`Config::to_pairs`] as `KEY=VALUE` lines (for an attached agent).
    pub fn to_lines(&self) -> String {
        self.to_pairs().into_iter().map(|(k, v)| format!("{k}={v}\n")).collect()
    }

    pub fn from_env() -> Result<Option<Config>, String> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// The same settings from `KEY=VALUE` lines (how `witch --pid` hands
    /// them to an agent loaded into a running process, whose environment
    /// is fixed).
    pub fn from_lines(text: &str) -> Result<Option<Config>, String> {
        let map: std::collections::HashMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
        Self::from_lookup(|k| map.get(k).map(|v| v.to_string()))
    }

    /// The settings `lookup` finds (an empty value is no value), each
    /// checked; None without `WITCH_CRAFT` (the agent stays inert).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<Config>, String> {
        let get = |k: &str| lookup(k).filter(|v| !v.is_empty());
        let Some(craft) = get(keys::CRAFT) else { return Ok(None) };
        let craft = Craft::parse(&craft).ok_or(format!("{}: unknown craft {craft:?}", keys::CRAFT))?;
        let mut c = Config::new(craft);
        for s in SETTINGS {
            if let Some(v) = get(s.key) {
                s.read_into(&mut c, &v)?;
            }
        }
        Ok(Some(c))
    }
}

/// `WITCH_BURST_PICK`: "byte" (in proportion to bytes) or "access".
fn pick_by_bytes(v: &str) -> Option<bool> {
    match v {
        "byte" | "bytes" => Some(true),
        "access" | "accesses" => Some(false),
        _ => None,
    }
}

/// A size in bytes ("4096", "4k", "1M", "1GiB"), or "off" (0).
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim().to_ascii_lowercase();
    if s == "off" {
        return Some(0);
    }
    let s = s.trim_end_matches("ib").trim_end_matches('b');
    let (num, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => (&s[..i], s[i..].trim()),
        None => (s, ""),
    };
    let shift = match unit {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        _ => return None,
    };
    num.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// Picks per window: a finite number from 0.01 to 64.
fn parse_picks(s: &str) -> Option<f64> {
    s.trim().parse::<f64>().ok().filter(|p| p.is_finite() && (0.01..=64.0).contains(p))
}

/// An overhead budget in percent ("3", "3%", "0.5"): finite, 0 to 100.
pub fn parse_percent(s: &str) -> Option<f64> {
    s.trim().trim_end_matches('%').trim().parse::<f64>().ok().filter(|p| p.is_finite() && (0.0..=100.0).contains(p))
}

#[cfg(test)]
mod tests;
