//! Agent configuration, read from the environment the `witch` command sets.
//!
//! The agent is inert unless `WITCH_CRAFT` is set, so an inherited
//! `LD_PRELOAD` in an unrelated program costs nothing.

use crate::profile::Craft;
use crate::replacement::Policy;
use std::path::PathBuf;

/// Default software period: 5 ms of thread CPU time (≈200 samples/s/thread,
/// hpcrun's usual rate). In this VM a timer sample costs ≈30–40 µs and a
/// trap ≈15 µs (`cargo bench -p witch-benches`), so sample + self-trap +
/// trap stay under 2% of the period.
pub const DEFAULT_SOFTWARE_PERIOD_NS: u64 = 5_000_000;
/// Default instructions per single-step burst of the software sampler.
pub const DEFAULT_BURST_STEPS: u32 = 32;
/// Default accesses picked per burst.
pub const DEFAULT_BURST_PICKS: u32 = 1;
/// Default PMU period: a prime, as PMU sampling recommends (Witch §4.7).
pub const DEFAULT_PMU_PERIOD: u64 = 5_000_003;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SamplerChoice {
    Auto,
    Software,
    Pmu,
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
    /// Experimental: one weight per burst instead of its access count.
    pub burst_weight_per_burst: bool,
    /// Accesses picked per burst; None: the default.
    pub burst_picks: Option<u32>,
}

impl Config {
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
        let Some(craft) = get("WITCH_CRAFT") else { return Ok(None) };
        let craft = Craft::parse(&craft).ok_or(format!("unknown craft {craft:?}"))?;
        let num = |k: &str| -> Result<Option<u64>, String> {
            get(k).map(|v| v.parse::<u64>().map_err(|_| format!("{k}: not a number: {v:?}"))).transpose()
        };
        let sampler = match get("WITCH_SAMPLER").as_deref() {
            None | Some("auto") => SamplerChoice::Auto,
            Some("software") => SamplerChoice::Software,
            Some("pmu") => SamplerChoice::Pmu,
            Some(s) => return Err(format!("unknown sampler {s:?}")),
        };
        let replacement = match get("WITCH_REPLACEMENT") {
            None => Policy::Reservoir,
            Some(r) => Policy::parse(&r).ok_or(format!("unknown replacement policy {r:?}"))?,
        };
        let fp_precision = match get("WITCH_FP_PRECISION") {
            None => 0.01,
            Some(v) => v.parse::<f64>().ok().filter(|p| p.is_finite() && *p >= 0.0).ok_or(format!("bad precision {v:?}"))?,
        };
        Ok(Some(Config {
            craft,
            period: num("WITCH_PERIOD")?.filter(|&p| p > 0),
            sampler,
            event: get("WITCH_EVENT"),
            debug_registers: num("WITCH_DEBUG_REGISTERS")?.unwrap_or(4).clamp(1, 4) as usize,
            replacement,
            fp_precision,
            out_dir: get("WITCH_OUT_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(".")),
            no_sigtrap: get("WITCH_NO_SIGTRAP").is_some(),
            no_modify: get("WITCH_NO_MODIFY").is_some(),
            seed: num("WITCH_SEED")?,
            burst_steps: num("WITCH_BURST")?.map(|n| n.min(1 << 20) as u32),
            burst_weight_per_burst: get("WITCH_BURST_WEIGHT").as_deref() == Some("one"),
            burst_picks: num("WITCH_BURST_PICKS")?.map(|n| n.clamp(1, 4) as u32),
        }))
    }
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
    }
}
