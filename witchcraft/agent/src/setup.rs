//! Making the engine: choose the sampler, probe the kernel, install the
//! handlers and calibrate, before the first thread is set up.

use crate::calibrate;
use witchcraft::config::Config;
use witchcraft::engine::process::Found;
use witchcraft::engine::{Engine, SampleSource};
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
    let (sampler, period) = SampleSource::choose(&cfg, &mut notes);
    let sigtrap = !cfg.no_sigtrap && witchcraft::sys::watchpoint::sigtrap_supported();
    if !sigtrap {
        notes.push("sigtrap unavailable (Linux < 5.13?): traps use F_SETSIG with a real-time signal".into());
    }
    let modify = !cfg.no_modify && witchcraft::sys::watchpoint::modify_attributes_supported();
    if !modify {
        notes.push("PERF_EVENT_IOC_MODIFY_ATTRIBUTES unavailable: watchpoints re-armed by close+reopen".into());
    }
    let in_place = modify && KernelCaps::read().modify_in_place;
    if in_place {
        notes.push("kernel re-arms enabled watchpoints in place (witch's kernel patch): freed watchpoints park enabled".into());
    }
    if cfg.no_links {
        witchcraft::engine::link::clear_hook();
    } else {
        crate::handlers::enable_links();
    }
    install();
    let (costs, by) = calibrate::round_trips(cfg.round_trips.as_deref(), sigtrap);
    notes.push(format!(
        "measured round trips: watchpoint trap {:.1} µs, signal {:.1} µs, single step {:.1} µs{}",
        costs.trap_ns as f64 / 1e3,
        costs.signal_ns as f64 / 1e3,
        costs.step_ns as f64 / 1e3,
        by.map_or(String::new(), |pid| format!(" (by process {pid} of this run)"))
    ));
    let windows_allowed = guarded || crate::handlers::faults_without_handlers();
    let calls_on = Some(crate::heap::calls_on as witchcraft::engine::process::CallsOn);
    let native_calls = crate::heap::native_calls();
    let found = Found { sampler, period, sigtrap, modify, in_place, own_code: own, calls_on, native_calls, costs, windows_allowed };
    let engine = Engine::new(cfg, found, &mut notes);
    (engine, notes)
}

/// The agent's executable mapping.
fn own_code_range() -> (u64, u64) {
    procfs::own_mapping_containing(own_code_range as *const () as u64).map_or((0, 0), |m| (m.start, m.end))
}
