//! Agent configuration, and its one encoding as `WITCH_*` settings: the
//! environment `witch` gives a preloaded agent, and the lines it sends an
//! attached one ([`Config::to_pairs`] builds them, [`Config::from_lookup`]
//! reads them).
//!
//! The agent is inert unless `WITCH_CRAFT` is set, so an inherited
//! `LD_PRELOAD` in an unrelated program costs nothing.

use crate::engine::settings::BurstWeight;
use crate::profile::Craft;
use crate::replacement::Policy;
use std::path::PathBuf;

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
    pub const OVERHEAD: &str = "WITCH_OVERHEAD";
    pub const ONLY_PID: &str = "WITCH_ONLY_PID";
    pub const EXE: &str = "WITCH_EXE";
    pub const RECORD_FD: &str = "WITCH_RECORD_FD";
    pub const HEAP_THRESHOLD: &str = "WITCH_HEAP_THRESHOLD";
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
            overhead_percent: None,
            only_pid: None,
            exe_names: Vec::new(),
            record_fd: None,
            heap_threshold: None,
        }
    }

    /// Is the process `pid`, running the executable named `exe` (its file
    /// name; None: not known, so not filtered on), one to profile?
    pub fn follows(&self, pid: u32, exe: Option<&str>) -> bool {
        self.only_pid.is_none_or(|p| p == pid) && (self.exe_names.is_empty() || exe.is_none_or(|e| self.exe_names.iter().any(|n| n == e)))
    }

    /// The testing and experimental knobs (`WITCH_NO_SIGTRAP`,
    /// `WITCH_NO_MODIFY`, `WITCH_SEED`, `WITCH_BURST*`) from this process's
    /// environment, as a controller passes them on to the agent it starts.
    pub fn with_knobs_from_env(mut self) -> Config {
        let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        self.no_sigtrap = get(keys::NO_SIGTRAP).is_some();
        self.no_modify = get(keys::NO_MODIFY).is_some();
        self.seed = get(keys::SEED).and_then(|v| v.parse().ok());
        self.burst_steps = get(keys::BURST).and_then(|v| v.parse::<u64>().ok()).map(|n| n.min(1 << 20) as u32);
        self.burst_weight = get(keys::BURST_WEIGHT).and_then(|v| BurstWeight::parse(&v));
        self.burst_picks =
            get(keys::BURST_PICKS).and_then(|v| v.parse::<u32>().ok()).map(|n| n.clamp(1, crate::engine::settings::MAX_PICKS as u32));
        self.burst_pick_bytes = get(keys::BURST_PICK).and_then(|v| pick_by_bytes(&v));
        self.burst_min_steps = get(keys::BURST_MIN).and_then(|v| v.parse::<u64>().ok()).map(|n| n.min(1 << 20) as u32);
        self.burst_after_syscall = get(keys::BURST_SYSCALL).as_deref() == Some("keep");
        if self.window.is_none() {
            self.window = get(keys::WINDOW).and_then(|v| v.parse::<u64>().ok()).map(|n| n.min(1 << 30) as u32);
        }
        self.window_picks = get(keys::WINDOW_PICKS).and_then(|v| parse_picks(&v));
        self.no_links = get(keys::LINKS).as_deref() == Some("0");
        if self.overhead_percent.is_none() {
            self.overhead_percent = get(keys::OVERHEAD).and_then(|v| parse_percent(&v));
        }
        self
    }

    /// The settings as `WITCH_*` pairs, the ones [`Config::from_lookup`]
    /// reads back to an equal `Config`.
    pub fn to_pairs(&self) -> Vec<(&'static str, String)> {
        let mut v = vec![
            (keys::CRAFT, self.craft.name().to_string()),
            (keys::SAMPLER, self.sampler.name().to_string()),
            (keys::DEBUG_REGISTERS, self.debug_registers.to_string()),
            (keys::REPLACEMENT, self.replacement.name().to_string()),
            (keys::FP_PRECISION, self.fp_precision.to_string()),
            (keys::OUT_DIR, self.out_dir.to_string_lossy().into_owned()),
        ];
        if let Some(p) = self.period {
            v.push((keys::PERIOD, p.to_string()));
        }
        if let Some(e) = &self.event {
            v.push((keys::EVENT, e.clone()));
        }
        if self.no_sigtrap {
            v.push((keys::NO_SIGTRAP, "1".into()));
        }
        if self.no_modify {
            v.push((keys::NO_MODIFY, "1".into()));
        }
        if let Some(s) = self.seed {
            v.push((keys::SEED, s.to_string()));
        }
        if let Some(n) = self.burst_steps {
            v.push((keys::BURST, n.to_string()));
        }
        if let Some(w) = self.burst_weight {
            v.push((keys::BURST_WEIGHT, w.name().into()));
        }
        if let Some(n) = self.burst_picks {
            v.push((keys::BURST_PICKS, n.to_string()));
        }
        if let Some(b) = self.burst_pick_bytes {
            v.push((keys::BURST_PICK, if b { "byte" } else { "access" }.into()));
        }
        if let Some(n) = self.burst_min_steps {
            v.push((keys::BURST_MIN, n.to_string()));
        }
        if self.burst_after_syscall {
            v.push((keys::BURST_SYSCALL, "keep".into()));
        }
        if let Some(n) = self.window {
            v.push((keys::WINDOW, n.to_string()));
        }
        if let Some(m) = self.window_picks {
            v.push((keys::WINDOW_PICKS, m.to_string()));
        }
        if self.no_links {
            v.push((keys::LINKS, "0".into()));
        }
        if let Some(p) = self.overhead_percent {
            v.push((keys::OVERHEAD, p.to_string()));
        }
        if let Some(p) = self.only_pid {
            v.push((keys::ONLY_PID, p.to_string()));
        }
        if !self.exe_names.is_empty() {
            v.push((keys::EXE, self.exe_names.join(":")));
        }
        if let Some(fd) = self.record_fd {
            v.push((keys::RECORD_FD, fd.to_string()));
        }
        if let Some(n) = self.heap_threshold {
            v.push((keys::HEAP_THRESHOLD, n.to_string()));
        }
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

    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<Config>, String> {
        let get = |k: &str| lookup(k).filter(|v| !v.is_empty());
        let Some(craft) = get(keys::CRAFT) else { return Ok(None) };
        let craft = Craft::parse(&craft).ok_or(format!("unknown craft {craft:?}"))?;
        let num = |k: &str| -> Result<Option<u64>, String> {
            get(k).map(|v| v.parse::<u64>().map_err(|_| format!("{k}: not a number: {v:?}"))).transpose()
        };
        let sampler = match get(keys::SAMPLER) {
            None => SamplerChoice::Auto,
            Some(s) => SamplerChoice::parse(&s).ok_or(format!("unknown sampler {s:?}"))?,
        };
        let replacement = match get(keys::REPLACEMENT) {
            None => Policy::Reservoir,
            Some(r) => Policy::parse(&r).ok_or(format!("unknown replacement policy {r:?}"))?,
        };
        let fp_precision = match get(keys::FP_PRECISION) {
            None => DEFAULT_FP_PRECISION,
            Some(v) => v.parse::<f64>().ok().filter(|p| p.is_finite() && *p >= 0.0).ok_or(format!("bad precision {v:?}"))?,
        };
        Ok(Some(Config {
            craft,
            period: num(keys::PERIOD)?.filter(|&p| p > 0),
            sampler,
            event: get(keys::EVENT),
            debug_registers: num(keys::DEBUG_REGISTERS)?.unwrap_or(4).clamp(1, 4) as usize,
            replacement,
            fp_precision,
            out_dir: get(keys::OUT_DIR).map(PathBuf::from).unwrap_or_else(|| PathBuf::from(".")),
            no_sigtrap: get(keys::NO_SIGTRAP).is_some(),
            no_modify: get(keys::NO_MODIFY).is_some(),
            seed: num(keys::SEED)?,
            burst_steps: num(keys::BURST)?.map(|n| n.min(1 << 20) as u32),
            burst_weight: get(keys::BURST_WEIGHT).and_then(|v| BurstWeight::parse(&v)),
            burst_picks: num(keys::BURST_PICKS)?.map(|n| n.clamp(1, crate::engine::settings::MAX_PICKS as u64) as u32),
            burst_pick_bytes: get(keys::BURST_PICK).and_then(|v| pick_by_bytes(&v)),
            burst_min_steps: num(keys::BURST_MIN)?.map(|n| n.min(1 << 20) as u32),
            burst_after_syscall: get(keys::BURST_SYSCALL).as_deref() == Some("keep"),
            window: num(keys::WINDOW)?.map(|n| n.min(1 << 30) as u32),
            window_picks: get(keys::WINDOW_PICKS)
                .map(|v| parse_picks(&v).ok_or(format!("{}: bad number of picks {v:?}", keys::WINDOW_PICKS)))
                .transpose()?,
            no_links: get(keys::LINKS).as_deref() == Some("0"),
            overhead_percent: get(keys::OVERHEAD)
                .map(|v| parse_percent(&v).ok_or(format!("{}: bad percentage {v:?}", keys::OVERHEAD)))
                .transpose()?,
            only_pid: num(keys::ONLY_PID)?.map(|p| p as u32),
            exe_names: get(keys::EXE).map(|v| v.split(':').filter(|n| !n.is_empty()).map(str::to_string).collect()).unwrap_or_default(),
            record_fd: num(keys::RECORD_FD)?.map(|fd| fd.min(i32::MAX as u64) as i32),
            heap_threshold: get(keys::HEAP_THRESHOLD)
                .map(|v| parse_bytes(&v).ok_or(format!("{}: not a size in bytes or \"off\": {v:?}", keys::HEAP_THRESHOLD)))
                .transpose()?,
        }))
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
mod tests {
    use super::*;

    #[test]
    fn settings_lines_read_like_the_environment() {
        let c = Config::from_lines(
            "WITCH_CRAFT=silent-load\nWITCH_PERIOD=1234\nWITCH_REPLACEMENT=oldest\nWITCH_DEBUG_REGISTERS=9\nWITCH_OUT_DIR=/x\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.craft, Craft::SilentLoad);
        assert_eq!(c.period, Some(1234));
        assert_eq!(c.replacement, Policy::Oldest);
        assert_eq!(c.debug_registers, 4);
        assert_eq!(c.out_dir, PathBuf::from("/x"));
        assert!(Config::from_lines("WITCH_PERIOD=5\n").unwrap().is_none());
        assert!(Config::from_lines("WITCH_CRAFT=dead\nWITCH_PERIOD=abc\n").is_err());
        assert!(Config::from_lines("WITCH_CRAFT=dead\nWITCH_HEAP_THRESHOLD=lots\n").is_err());
        let off = Config::from_lines("WITCH_CRAFT=dead\nWITCH_HEAP_THRESHOLD=off\n").unwrap().unwrap();
        assert_eq!(off.heap_threshold, Some(0));
    }

    #[test]
    fn sizes_in_bytes() {
        for (s, n) in [("4096", 4096), ("4k", 4096), ("4KiB", 4096), ("1M", 1 << 20), ("2g", 2 << 30), ("off", 0), ("0", 0)] {
            assert_eq!(parse_bytes(s), Some(n), "{s}");
        }
        for s in ["", "k", "-1", "4x", "1.5k", "99999999999999999999"] {
            assert_eq!(parse_bytes(s), None, "{s}");
        }
    }

    #[test]
    fn settings_are_read_back_as_they_were_built() {
        let mut c = Config::new(Craft::SilentStore);
        c.period = Some(777);
        c.sampler = SamplerChoice::Software;
        c.event = Some("task-clock".into());
        c.debug_registers = 2;
        c.replacement = Policy::Newest;
        c.fp_precision = 0.125;
        c.out_dir = PathBuf::from("/tmp/x y");
        c.no_modify = true;
        c.seed = Some(9);
        c.burst_steps = Some(16);
        c.burst_weight = Some(BurstWeight::PerBurst);
        c.burst_picks = Some(2);
        c.burst_pick_bytes = Some(false);
        c.burst_min_steps = Some(24);
        c.burst_after_syscall = true;
        c.window = Some(2048);
        c.window_picks = Some(1.5);
        c.only_pid = Some(4242);
        c.exe_names = vec!["app".into(), "helper".into()];
        c.heap_threshold = Some(65536);
        let back = Config::from_lines(&c.to_lines()).unwrap().unwrap();
        assert_eq!(format!("{back:?}"), format!("{c:?}"));
        let map: std::collections::HashMap<_, _> = c.to_pairs().into_iter().collect();
        let env = Config::from_lookup(|k| map.get(k).cloned()).unwrap().unwrap();
        assert_eq!(format!("{env:?}"), format!("{c:?}"));
        let plain = Config::new(Craft::Dead);
        assert_eq!(format!("{:?}", Config::from_lines(&plain.to_lines()).unwrap().unwrap()), format!("{plain:?}"));
    }

    #[test]
    fn which_processes_a_run_follows() {
        let mut c = Config::new(Craft::Dead);
        assert!(c.follows(1, Some("sh")) && c.follows(2, None));
        c.only_pid = Some(7);
        assert!(c.follows(7, Some("sh")) && !c.follows(8, Some("sh")));
        c.only_pid = None;
        c.exe_names = vec!["app".into()];
        assert!(c.follows(3, Some("app")) && !c.follows(3, Some("sh")) && c.follows(3, None));
    }
}
