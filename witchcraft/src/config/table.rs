//! The one table of the settings: for each, its name, how a value is
//! read and checked, and how it is written back. [`super::Config`]'s
//! encodings (the environment, `KEY=VALUE` lines, pairs) all go through it.

use super::{keys, parse_bytes, parse_percent, parse_picks, pick_by_bytes, BurstWeight, Config, SamplerChoice};
use crate::replacement::Policy;
use std::path::PathBuf;

/// One setting besides the craft: its name, how a value is read into a
/// [`Config`] (checked; an error says what was wrong) and how the
/// `Config`'s value is written (None: the default, not written). Every
/// encoding of the settings goes through [`SETTINGS`].
pub(super) struct Setting {
    pub(super) key: &'static str,
    /// A testing or experimental knob, which a controller passes on from
    /// its own environment ([`Config::with_knobs_from_env`]).
    pub(super) knob: bool,
    read: fn(&mut Config, &str) -> Result<(), String>,
    pub(super) write: fn(&Config) -> Option<String>,
}

impl Setting {
    pub(super) fn read_into(&self, c: &mut Config, v: &str) -> Result<(), String> {
        (self.read)(c, v).map_err(|e| format!("{}: {e}: {v:?}", self.key))
    }
}

fn number(v: &str) -> Result<u64, String> {
    v.trim().parse::<u64>().map_err(|_| "not a number".to_string())
}

/// An instruction count: at most `max`.
fn count(v: &str, max: u64) -> Result<u32, String> {
    Ok(number(v)?.min(max) as u32)
}

/// A switch that is on by default: true if `v` turns it off ("0"), false
/// for "1" (`WITCH_LINKS`, `WITCH_CACHE_PICKS`).
fn switched_off(v: &str) -> Result<bool, String> {
    match v {
        "0" => Ok(true),
        "1" => Ok(false),
        _ => Err("not 0 or 1".into()),
    }
}

/// A flag that is on with any value (`WITCH_NO_SIGTRAP=1`).
fn flag(on: bool) -> Option<String> {
    on.then(|| "1".to_string())
}

/// Every setting but the craft, in the order they are written.
pub(super) const SETTINGS: &[Setting] = &[
    Setting {
        key: keys::SAMPLER,
        knob: false,
        read: |c, v| {
            c.sampler = SamplerChoice::parse(v).ok_or("unknown sampler")?;
            Ok(())
        },
        write: |c| Some(c.sampler.name().to_string()),
    },
    Setting {
        key: keys::DEBUG_REGISTERS,
        knob: false,
        read: |c, v| {
            c.debug_registers = number(v)?.clamp(1, 4) as usize;
            Ok(())
        },
        write: |c| Some(c.debug_registers.to_string()),
    },
    Setting {
        key: keys::REPLACEMENT,
        knob: false,
        read: |c, v| {
            c.replacement = Policy::parse(v).ok_or("unknown replacement policy")?;
            Ok(())
        },
        write: |c| Some(c.replacement.name().to_string()),
    },
    Setting {
        key: keys::FP_PRECISION,
        knob: false,
        read: |c, v| {
            c.fp_precision = v.parse::<f64>().ok().filter(|p| p.is_finite() && *p >= 0.0).ok_or("bad precision")?;
            Ok(())
        },
        write: |c| Some(c.fp_precision.to_string()),
    },
    Setting {
        key: keys::OUT_DIR,
        knob: false,
        read: |c, v| {
            c.out_dir = PathBuf::from(v);
            Ok(())
        },
        write: |c| Some(c.out_dir.to_string_lossy().into_owned()),
    },
    Setting {
        key: keys::PERIOD,
        knob: false,
        read: |c, v| {
            c.period = Some(number(v)?).filter(|&p| p > 0);
            Ok(())
        },
        write: |c| c.period.map(|p| p.to_string()),
    },
    Setting {
        key: keys::EVENT,
        knob: false,
        read: |c, v| {
            c.event = Some(v.to_string());
            Ok(())
        },
        write: |c| c.event.clone(),
    },
    Setting {
        key: keys::NO_SIGTRAP,
        knob: true,
        read: |c, _| {
            c.no_sigtrap = true;
            Ok(())
        },
        write: |c| flag(c.no_sigtrap),
    },
    Setting {
        key: keys::NO_MODIFY,
        knob: true,
        read: |c, _| {
            c.no_modify = true;
            Ok(())
        },
        write: |c| flag(c.no_modify),
    },
    Setting {
        key: keys::SEED,
        knob: true,
        read: |c, v| {
            c.seed = Some(number(v)?);
            Ok(())
        },
        write: |c| c.seed.map(|s| s.to_string()),
    },
    Setting {
        key: keys::BURST,
        knob: true,
        read: |c, v| {
            c.burst_steps = Some(count(v, 1 << 20)?);
            Ok(())
        },
        write: |c| c.burst_steps.map(|n| n.to_string()),
    },
    Setting {
        key: keys::BURST_WEIGHT,
        knob: true,
        read: |c, v| {
            c.burst_weight = Some(BurstWeight::parse(v).ok_or("not \"accesses\", \"step\" or \"one\"")?);
            Ok(())
        },
        write: |c| c.burst_weight.map(|w| w.name().to_string()),
    },
    Setting {
        key: keys::BURST_PICKS,
        knob: true,
        read: |c, v| {
            c.burst_picks = Some(number(v)?.clamp(1, u32::MAX as u64) as u32);
            Ok(())
        },
        write: |c| c.burst_picks.map(|n| n.to_string()),
    },
    Setting {
        key: keys::BURST_PICK,
        knob: true,
        read: |c, v| {
            c.burst_pick_bytes = Some(pick_by_bytes(v).ok_or("not \"byte\" or \"access\"")?);
            Ok(())
        },
        write: |c| c.burst_pick_bytes.map(|b| if b { "byte" } else { "access" }.to_string()),
    },
    Setting {
        key: keys::BURST_MIN,
        knob: true,
        read: |c, v| {
            c.burst_min_steps = Some(count(v, 1 << 20)?);
            Ok(())
        },
        write: |c| c.burst_min_steps.map(|n| n.to_string()),
    },
    Setting {
        key: keys::BURST_SYSCALL,
        knob: true,
        read: |c, v| {
            c.burst_after_syscall = (v == "keep").then_some(true).ok_or("not \"keep\"")?;
            Ok(())
        },
        write: |c| c.burst_after_syscall.then(|| "keep".to_string()),
    },
    Setting {
        key: keys::WINDOW,
        knob: true,
        read: |c, v| {
            c.window = Some(count(v, 1 << 30)?);
            Ok(())
        },
        write: |c| c.window.map(|n| n.to_string()),
    },
    Setting {
        key: keys::WINDOW_PICKS,
        knob: true,
        read: |c, v| {
            c.window_picks = Some(parse_picks(v).ok_or("not a number of picks from 0.01 to 64")?);
            Ok(())
        },
        write: |c| c.window_picks.map(|m| m.to_string()),
    },
    Setting {
        key: keys::LINKS,
        knob: true,
        read: |c, v| {
            c.no_links = switched_off(v)?;
            Ok(())
        },
        write: |c| c.no_links.then(|| "0".to_string()),
    },
    Setting {
        key: keys::CACHE_PICKS,
        knob: true,
        read: |c, v| {
            c.no_cache_picks = switched_off(v)?;
            Ok(())
        },
        write: |c| c.no_cache_picks.then(|| "0".to_string()),
    },
    Setting {
        key: keys::WINDOW_TIME,
        knob: true,
        read: |c, v| {
            c.timed_windows = !switched_off(v)?;
            Ok(())
        },
        write: |c| c.timed_windows.then(|| "1".to_string()),
    },
    Setting {
        key: keys::OVERHEAD,
        knob: true,
        read: |c, v| {
            c.overhead_percent = Some(parse_percent(v).ok_or("not a percentage from 0 to 100")?);
            Ok(())
        },
        write: |c| c.overhead_percent.map(|p| p.to_string()),
    },
    Setting {
        key: keys::ONLY_PID,
        knob: false,
        read: |c, v| {
            c.only_pid = Some(u32::try_from(number(v)?).map_err(|_| "not a process id")?);
            Ok(())
        },
        write: |c| c.only_pid.map(|p| p.to_string()),
    },
    Setting {
        key: keys::EXE,
        knob: false,
        read: |c, v| {
            c.exe_names = v.split(':').filter(|n| !n.is_empty()).map(str::to_string).collect();
            Ok(())
        },
        write: |c| (!c.exe_names.is_empty()).then(|| c.exe_names.join(":")),
    },
    Setting {
        key: keys::RECORD_FD,
        knob: false,
        read: |c, v| {
            c.record_fd = Some(i32::try_from(number(v)?).map_err(|_| "not a file descriptor")?);
            Ok(())
        },
        write: |c| c.record_fd.map(|fd| fd.to_string()),
    },
    Setting {
        key: keys::ROUND_TRIPS,
        knob: false,
        read: |c, v| {
            c.round_trips = Some(PathBuf::from(v));
            Ok(())
        },
        write: |c| c.round_trips.as_ref().map(|p| p.to_string_lossy().into_owned()),
    },
    Setting {
        key: keys::HEAP_THRESHOLD,
        knob: false,
        read: |c, v| {
            c.heap_threshold = Some(parse_bytes(v).ok_or("not a size in bytes or \"off\"")?);
            Ok(())
        },
        write: |c| c.heap_threshold.map(|n| n.to_string()),
    },
];
