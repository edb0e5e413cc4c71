//! The report's account of how a run was observed: which burst engine ran,
//! how long its windows were and what an instruction cost in it, and the
//! profile's notes (what the agent and the sampler had to say), as the text
//! report and the JSON's `notes` give them.

use crate::analysis;
use witchcraft::profile::{Counters, Profile, SamplerKind};

/// The burst engine that ran, how long its bursts were, and what an
/// instruction cost in it.
pub(super) fn burst_engine(p: &Profile, c: &Counters) -> Vec<String> {
    let budget = match p.sampler.overhead_percent {
        Some(b) if b > 0.0 => format!("{b}% overhead budget"),
        Some(_) => "no overhead budget".into(),
        None => "no budget recorded".into(),
    };
    let ticks = if c.ticks_skipped > 0 {
        format!(", begun at {} of {} ticks (the budget's choice)", c.bursts, c.bursts + c.ticks_skipped)
    } else {
        String::new()
    };
    let mut out = Vec::new();
    if p.sampler.window_instructions > 0 && c.windows > 0 {
        // Windows run from the code cache: how long they were, and what an
        // instruction run there cost all told (the program's own work in
        // the cache, the exits to witch, the translation of blocks).
        let n = c.windows as f64;
        let stepped = c.bursts.saturating_sub(c.windows);
        let fallback = if stepped > 0 { format!(", {stepped} bursts single-stepped where the cache could not run") } else { String::new() };
        let timed = if p.sampler.window_timed { ", picks weighed by the windows' time (WITCH_WINDOW_TIME=1)" } else { "" };
        out.push(format!(
            "  bursts    code cache: {} windows of at most {} instructions, {budget}{ticks}{fallback}{timed}",
            c.windows, p.sampler.window_instructions
        ));
        out.push(format!(
            "            a window: {:.0} instructions (mean; {}–{}), {:.1} {}s, {:.1} picked; {} cut short{}",
            c.window_instructions as f64 / n,
            c.window_shortest,
            c.window_longest,
            c.window_accesses as f64 / n,
            analysis::words(p.craft).access,
            c.window_picks as f64 / n,
            c.windows_cut,
            if c.windows_thinned > 0 {
                format!("; pick rate cut {} times (accesses far faster than planned)", c.windows_thinned)
            } else {
                String::new()
            }
        ));
        if c.window_instructions > 0 && c.cache_ns + c.exit_ns > 0 {
            let each = |ns: u64| ns as f64 / c.window_instructions as f64;
            // (Links and picks taken without a trap are timed within the
            // cache's time; older profiles have neither.)
            let link = c.link_ns.min(c.cache_ns);
            let pick = c.pick_ns.min(c.cache_ns - link);
            out.push(format!(
                "            an instruction in a window cost {:.1} ns of CPU all told: {:.1} ns running copies (the program's own work included), {:.1} ns translating at links, {:.1} ns at picks taken without a trap, {:.1} ns at exits that trapped; {} blocks translated, {} flushes",
                each(c.cache_ns + c.exit_ns),
                each(c.cache_ns - link - pick),
                each(link),
                each(pick),
                each(c.exit_ns),
                c.cache_blocks,
                c.cache_flushes
            ));
            if c.cache_picks > 0 {
                let rest = if c.cache_picks < c.window_picks {
                    "; the rest stepped at their exit's trap (a `rep` string, a return that pops arguments)"
                } else {
                    ""
                };
                out.push(format!(
                    "            {} of {} picks taken without a trap, {:.1} µs each{rest}",
                    c.cache_picks,
                    c.window_picks,
                    pick as f64 / c.cache_picks as f64 / 1e3
                ));
            }
        }
    } else {
        let mean =
            if c.bursts > 0 { format!(", {:.1} instructions per burst (mean)", c.steps as f64 / c.bursts as f64) } else { String::new() };
        let each = if c.steps > 0 {
            format!("; an instruction cost {:.1} µs of CPU (a single step's round trip)", c.step_ns as f64 / c.steps as f64 / 1e3)
        } else {
            String::new()
        };
        let why = if p.sampler.window_instructions > 0 { "the code cache ran no window" } else { "the code cache is off" };
        out.push(format!(
            "  bursts    single-step ({why}): {} bursts of at most {} instructions, {} picked per burst, {budget}{mean}{ticks}{each}",
            c.bursts,
            p.sampler.burst_steps,
            p.sampler.burst_picks.max(1)
        ));
    }
    out
}

/// The code cache of an exact run (`--exact=cache`): what it translated
/// and how often the program left it, and the stretches it ran natively
/// unrecorded (each an uncounted gap in an exact count). None for a
/// profile without them (single steps; builds before they were kept).
pub(super) fn exact_cache(c: &Counters) -> Option<String> {
    (c.cache_blocks > 0).then(|| {
        format!(
            "  cache     {} blocks translated, {} links made, {} exits to witch ({} dispatch misses), {} flushes; {} returns to the cache after native code, {} stretches run natively unrecorded",
            c.cache_blocks, c.cache_links, c.cache_exits, c.cache_lookups, c.cache_flushes, c.window_resumes, c.window_gaps
        )
    })
}

/// What the reader should know before trusting the figures.
pub fn notes(p: &Profile, c: &Counters) -> Vec<String> {
    let mut v = p.notes.clone();
    let access = analysis::words(p.craft).access;
    // The software sampler takes a timer interrupt's nearby access (a few
    // instructions of straight-line code), so code whose time goes elsewhere
    // (a store-free inner loop) yields interrupts but no samples.
    let missed = c.interrupts.saturating_sub(c.samples + c.skipped_self + c.overdue);
    let bursts = p.sampler.burst_steps > 0;
    let software = p.sampler.kind == SamplerKind::Software && !bursts;
    // So few interrupts say the threads ran few periods, not where the time went.
    const FEW: u64 = 5;
    if bursts && c.samples == 0 && c.bursts >= FEW {
        v.push(format!(
            "no samples: the single-step bursts that {} timer interrupts began ({} instructions stepped) met no {access}: \
             the time went to code without {access}s; try a smaller -p",
            c.bursts, c.steps
        ));
    } else if c.samples == 0 && missed >= FEW && software {
        v.push(format!(
            "no samples: none of {} timer interrupts landed within a few instructions of a {access}; \
             the time went to other code; try a smaller -p, or a host with a PMU (it samples {access}s by count)",
            c.interrupts
        ));
    } else if c.samples == 0 && c.interrupts == 0 && c.threads_failed > 0 {
        // The set-up failure's own note says why.
    } else if c.samples == 0 && p.ended_by.agent_left() {
        // Profiling stopped early; its own note says why.
    } else if c.samples == 0 {
        // One short run, or many short threads: either way few periods ran.
        v.push(format!(
            "no samples were taken: the threads ran {} sampling period{} ({} {}) of their own CPU time in all \
             (a short run, or short threads); try a smaller -p",
            c.interrupts,
            if c.interrupts == 1 { "" } else { "s" },
            p.sampler.period,
            p.sampler.unit.name()
        ));
    } else if software && missed * 2 > c.interrupts {
        v.push(format!(
            "{missed} of {} timer interrupts landed away from any {access} and were not samples: \
             {access}s in code that takes little time per {access} are under-represented (see docs/ACCURACY.md)",
            c.interrupts
        ));
    }
    if bursts && c.bursts_over_budget * 2 > c.bursts {
        v.push(format!(
            "{} of {} bursts were held to the minimum of 4 steps: the period is too short for the {}% overhead budget \
             (or traps were dense), so witch cost more than the budget",
            c.bursts_over_budget,
            c.bursts,
            p.sampler.overhead_percent.unwrap_or(0.0)
        ));
    }
    if bursts && c.bursts_blocked + c.bursts_lost > 0 {
        v.push(format!(
            "{} timer ticks began no burst ({} where the program blocked SIGTRAP or stepped itself, {} bursts it cut short)",
            c.bursts_blocked + c.bursts_lost,
            c.bursts_blocked,
            c.bursts_lost
        ));
    }
    // Windows at ticks of which more than a quarter ended early: each leaves the code after
    // the point where it ended (a system call, a call into witch's own
    // interposers other than the allocator's, code the cache does not
    // run) to the windows that begin after that point, so that
    // code weighs less in the estimate. (Whole-run counting comes back
    // there: its figures are bytes, and it is not meant here.)
    let given = p.sampler.window_instructions;
    if p.value_unit() == witchcraft::profile::ValueUnit::ByteNs && c.windows >= 5 && c.windows_cut * 4 > c.windows && given > 0 {
        v.push(format!(
            "{} of {} code-cache windows ended before their {given} instructions ran ({:.0} on average), at system calls, \
             calls into witch's own interposers (sigaction, thread creation and the like, not the allocator's), returns \
             into them (a window that began inside the allocator under a heap object's allocation) or code the cache does \
             not run: the code right after those points is looked at less often than the rest, and its share of the \
             figures is low (see docs/ACCURACY.md, \"Longer windows\")",
            c.windows_cut,
            c.windows,
            c.window_instructions as f64 / c.windows as f64
        ));
    }
    if c.cache_refused > 0 {
        let why = if c.cache_refused_wx == c.cache_refused {
            "the process may not have memory both writable and executable (prctl PR_SET_MDWE, as systemd's \
             MemoryDenyWriteExecute=yes sets, and its children inherit)"
        } else {
            "an address-space limit (ulimit -v), or a system that forbids writable code"
        };
        let so = if p.sampler.kind == witchcraft::profile::SamplerKind::Exact {
            "nothing they ran was recorded, and the counts leave them out"
        } else {
            "their bursts single-stepped instead, short and costly, and the figures are less accurate (docs/ACCURACY.md)"
        };
        v.push(format!("the kernel refused the code cache's memory in {} thread(s): {why}; {so}", c.cache_refused));
    }
    if c.critical_sections > 0 && c.cache_blocks > 0 {
        let what = if p.sampler.kind == witchcraft::profile::SamplerKind::Exact {
            "ran natively, unrecorded"
        } else {
            "ran natively, where no window samples them"
        };
        v.push(format!(
            "{} times a thread reached a restartable sequence's critical section (rseq) in the code cache, which must not \
             run it (the kernel restarts a section only at its own addresses): the section's accesses {what}",
            c.critical_sections
        ));
    }
    if c.signals_held > 0 {
        v.push(format!(
            "{} time(s) a thread blocked the signal witch samples with ({}) to take it itself (one of the program's own came \
             while it blocked it, or it blocked it when witch attached): witch left it to the program, pending as the kernel \
             keeps it, and did not sample that thread until it unblocked it",
            c.signals_held,
            witchcraft::sys::siginfo::sampler_signal_name()
        ));
    }
    if c.traps == 0 && c.samples > 0 {
        v.push("no watchpoint fired: nothing to attribute".into());
    }
    if c.tree_overflow > 0 || c.pair_overflow > 0 {
        v.push(format!("tables overflowed ({} contexts, {} pairs lost): figures are partial", c.tree_overflow, c.pair_overflow));
    }
    if c.threads_failed > 0 {
        // `threads` counts every thread the agent tried to set up.
        let all = c.threads.max(c.threads_failed);
        v.push(format!("profiled {} of {all} threads: the notes say why not the others", all - c.threads_failed));
    }
    v
}
