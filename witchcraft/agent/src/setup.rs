//! Making the engine: choose the sampler, probe the kernel, install the
//! handlers and calibrate, before the first thread is set up.

use crate::calibrate;
use witchcraft::config::{
    Config, COUNT_EVENTS, COUNT_WINDOW_INSTRUCTIONS, DEFAULT_BURST_PICKS, DEFAULT_BURST_PICK_BYTES, DEFAULT_BURST_STEPS,
    DEFAULT_COUNT_PERIOD, DEFAULT_OVERHEAD_PERCENT, DEFAULT_SOFTWARE_PERIOD_NS, DEFAULT_WINDOW_INSTRUCTIONS, DEFAULT_WINDOW_PICKS,
    MIN_COUNT_PERIOD,
};
use witchcraft::engine::budget::{HeadStart, HEAD_START_NS};
use witchcraft::engine::{BurstSettings, Engine, SamplerKind, WindowSettings};
use witchcraft::modules;
use witchcraft::sys::procfs;
use witchcraft::sys::watchpoint::KernelCaps;

/// The engine for `cfg`, with `install` putting the handlers in place;
/// `guarded`: the program's fault handlers run behind the agent's guard
/// (preloaded), so burst windows may run whatever handlers it has. With
/// the notes for the profile, in the order they were made.
pub fn make_engine(cfg: Config, install: fn(), guarded: bool) -> (Engine, Vec<String>) {
    let own = own_code_range();
    modules::set_own_address(own.0);
    crate::heap::start(cfg.heap_threshold, own);
    modules::refresh();
    let mut notes = Vec::new();
    let (sampler, period) = SamplerKind::choose(&cfg, &mut notes);
    let sigtrap = !cfg.no_sigtrap && witchcraft::probe::sigtrap_supported();
    if !sigtrap {
        notes.push("sigtrap unavailable (Linux < 5.13?): traps use F_SETSIG with a real-time signal".into());
    }
    let modify = !cfg.no_modify && witchcraft::probe::modify_attributes_supported();
    if !modify {
        notes.push("PERF_EVENT_IOC_MODIFY_ATTRIBUTES unavailable: watchpoints re-armed by close+reopen".into());
    }
    let in_place = modify && KernelCaps::read().modify_in_place;
    if in_place {
        notes.push("kernel re-arms enabled watchpoints in place (witch's kernel patch): freed watchpoints park enabled".into());
    }
    let craft = witchcraft::craft::for_kind(cfg.craft, cfg.fp_precision);
    if cfg.no_links {
        witchcraft::engine::link::clear_hook();
    } else {
        crate::handlers::enable_links();
    }
    install();
    let costs = calibrate::calibrate(sigtrap);
    notes.push(format!(
        "measured round trips: watchpoint trap {:.1} µs, signal {:.1} µs, single step {:.1} µs",
        costs.trap_ns as f64 / 1e3,
        costs.signal_ns as f64 / 1e3,
        costs.step_ns as f64 / 1e3
    ));
    // A software sampler samples accesses by count with single-step bursts
    // sized to the overhead budget (WITCH_BURST=0: the time-proportional
    // look-around instead). A PMU counts accesses itself.
    // The software access counters: the whole run in the code cache.
    // The exact mode records every access: windows for the whole run,
    // which never pick.
    let recording = cfg.record_fd.map(|_| u64::MAX >> 1);
    let count = recording.or_else(|| {
        cfg.event.as_deref().filter(|e| COUNT_EVENTS.contains(e)).map(|_| {
            let n = cfg.period.unwrap_or(DEFAULT_COUNT_PERIOD);
            if n < MIN_COUNT_PERIOD {
                notes.push(format!("a period of {n} accesses would slow the program many times over: raised to {MIN_COUNT_PERIOD}"));
            }
            n.max(MIN_COUNT_PERIOD)
        })
    });
    let burst = match (&sampler, cfg.burst_steps) {
        (SamplerKind::Pmu(_), _) => None,
        (_, Some(0)) if count.is_none() => None,
        (_, steps) => Some(BurstSettings {
            steps: steps.unwrap_or(DEFAULT_BURST_STEPS),
            weight: cfg.burst_weight.unwrap_or_default(),
            picks: cfg.burst_picks.unwrap_or(DEFAULT_BURST_PICKS),
            by_bytes: cfg.burst_pick_bytes.unwrap_or(DEFAULT_BURST_PICK_BYTES),
            budget: cfg.overhead_percent.unwrap_or(DEFAULT_OVERHEAD_PERCENT) / 100.0,
            // At the default period every burst takes all its steps and the
            // budget chooses the ticks. A period the user chose asks for a
            // burst at every tick: the budget then chooses their length (at
            // least 4 steps, past the budget if it must), as does
            // WITCH_BURST_MIN=0.
            min_steps: match (cfg.burst_min_steps, cfg.period) {
                (None, None) => Some(steps.unwrap_or(DEFAULT_BURST_STEPS)),
                (None, Some(_)) | (Some(0), _) => None,
                (Some(n), _) => Some(n),
            },
            after_syscall: cfg.burst_after_syscall,
            window: match (count, cfg.window.unwrap_or(DEFAULT_WINDOW_INSTRUCTIONS)) {
                (Some(n), _) => {
                    Some(WindowSettings { instructions: COUNT_WINDOW_INSTRUCTIONS, picks: DEFAULT_WINDOW_PICKS, count: Some(n) })
                }
                (None, 0) => None,
                (None, n) => Some(WindowSettings { instructions: n, picks: cfg.window_picks.unwrap_or(DEFAULT_WINDOW_PICKS), count: None }),
            },
        }),
    };
    let engine = Engine {
        config: cfg,
        craft,
        sampler,
        period,
        sigtrap,
        modify,
        in_place,
        own_code: own,
        trap_cost_ns: costs.trap_ns,
        signal_cost_ns: costs.signal_ns,
        step_cost_ns: costs.step_ns,
        ns_per_cycle: costs.ns_per_cycle,
        burst,
        head_start: HeadStart::new(HEAD_START_NS),
        windows_allowed: std::sync::atomic::AtomicBool::new(guarded || crate::handlers::faults_without_handlers()),
    };
    (engine, notes)
}

/// An engine that will not run: for the profile of a process that is not
/// profiled (it says why). Nothing is probed or installed.
pub fn bare_engine(cfg: Config) -> Engine {
    let craft = witchcraft::craft::for_kind(cfg.craft, cfg.fp_precision);
    let period = cfg.period.unwrap_or(DEFAULT_SOFTWARE_PERIOD_NS);
    Engine {
        config: cfg,
        craft,
        sampler: SamplerKind::CpuTimer(witchcraft::sys::cputimer::CpuTime::All),
        period,
        sigtrap: false,
        modify: false,
        in_place: false,
        own_code: (0, 0),
        trap_cost_ns: 0,
        signal_cost_ns: 0,
        step_cost_ns: 0,
        ns_per_cycle: 0.0,
        burst: None,
        head_start: HeadStart::new(0),
        windows_allowed: std::sync::atomic::AtomicBool::new(false),
    }
}

/// The agent's executable mapping.
fn own_code_range() -> (u64, u64) {
    procfs::own_mapping_containing(own_code_range as *const () as u64).map_or((0, 0), |m| (m.start, m.end))
}
