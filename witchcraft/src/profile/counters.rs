//! The engine's counters in a profile: what it did and what it cost,
//! summed over threads.

use serde::{Deserialize, Serialize};

/// Engine counters, summed over threads.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct Counters {
    /// Sampler interrupts delivered.
    pub interrupts: u64,
    /// Interrupts that yielded an access of the craft's kind (µ increments).
    pub samples: u64,
    /// Samples that were given a watchpoint.
    pub armed: u64,
    /// Samples not monitored (reservoir said no, or no slot could be armed).
    pub dropped: u64,
    /// Samples skipped because they touched the engine's own memory or code.
    pub skipped_self: u64,
    /// Software samples whose period ran out inside the engine's own signal
    /// handling (the program had not run an instruction since): dropped, so
    /// the engine's time is not credited to the code after a trap.
    #[serde(default)]
    pub overdue: u64,
    /// Watchpoint traps classified by the craft.
    pub traps: u64,
    /// Traps caused by the sampled instruction itself (software sampler).
    pub self_traps: u64,
    /// Traps ignored by the craft (e.g. stores under LoadCraft).
    pub ignored_traps: u64,
    /// Watchpoints given up after too many ignored traps in a row.
    #[serde(default)]
    pub abandoned: u64,
    /// Traps whose precise PC could not be recovered or verified.
    pub imprecise: u64,
    /// Failures to arm a watchpoint (ioctl/open errors).
    pub arm_failures: u64,
    /// Watchpoints re-armed by the kernel in place, without the perf core's
    /// disable/enable cycle: the kernel patch's fast path (`kernel-patch/`).
    /// 0 on kernels without it.
    #[serde(default)]
    pub rearms_in_place: u64,
    /// Longest run of consecutive samples that were not monitored.
    pub longest_blind_spot: u64,
    /// Calling-context nodes that did not fit the preallocated tree.
    pub tree_overflow: u64,
    /// Pairs that did not fit the preallocated pair table.
    pub pair_overflow: u64,
    /// Threads that could not be set up (e.g. no free debug registers).
    pub threads_failed: u64,
    /// Threads profiled (set up), whether or not they took a sample: a
    /// profile lists only those with something to show. 0 in profiles from
    /// before it was counted.
    #[serde(default)]
    pub threads: u64,
    /// CPU time (ns) witch cost the program's threads: its handlers, plus
    /// the kernel's part of each trap and signal as calibrated at start-up.
    #[serde(default)]
    pub engine_ns: u64,
    /// The part of `engine_ns` spent at the sampler's ticks (the software
    /// sampler's timer signals, PMU overflow signals), whether or not they
    /// began a burst or armed a watchpoint.
    #[serde(default)]
    pub tick_ns: u64,
    /// The part spent single-stepping bursts (each step's calibrated round
    /// trip and its handler).
    #[serde(default)]
    pub step_ns: u64,
    /// The part spent at watchpoint traps.
    #[serde(default)]
    pub trap_ns: u64,
    /// Single-step bursts begun (count-proportional software sampler).
    #[serde(default)]
    pub bursts: u64,
    /// Instructions single-stepped in them.
    #[serde(default)]
    pub steps: u64,
    /// Ticks that began no burst: SIGTRAP blocked where the program was,
    /// or the program single-stepping itself.
    #[serde(default)]
    pub bursts_blocked: u64,
    /// Bursts the overhead budget paid for fewer steps than the minimum
    /// (the period is too short for the budget, or traps were dense); they
    /// took the minimum.
    #[serde(default)]
    pub bursts_over_budget: u64,
    /// Bursts whose trap flag the program took away (a `siglongjmp` out of
    /// its own signal handler), found at the next tick.
    #[serde(default)]
    pub bursts_lost: u64,
    /// Ticks that landed right after an instruction that exits to the
    /// hypervisor (`cpuid` in a virtual machine): no burst, the time there
    /// was not the program's.
    #[serde(default)]
    pub ticks_after_exits: u64,
    /// Ticks that landed right after a system call returned: the period
    /// ran out in the kernel, so the time there was not the program's own
    /// instructions'; no burst.
    #[serde(default)]
    pub ticks_after_syscalls: u64,
    /// Ticks that began no burst because the overhead budget could not yet
    /// pay for the shortest burst; their time went to the next burst.
    #[serde(default)]
    pub ticks_skipped: u64,
    /// The part of `engine_ns` spent running copies in the code cache
    /// (burst windows), the program's own instructions included.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_ns: u64,
    /// The part of `cache_ns` spent in the engine through the cache's link
    /// stub (translating blocks the copies branched to, without a trap):
    /// `cache_ns - link_ns` is the copies' own running time.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub link_ns: u64,
    /// Picks taken through the link stub without a trap (of
    /// `window_picks`), and the part of `cache_ns` the engine spent on them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_picks: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pick_ns: u64,
    /// The part spent at the cache's exits (a window's picks, its end,
    /// translating blocks).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub exit_ns: u64,
    /// Burst windows run from the code cache (they count in `bursts` too).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub windows: u64,
    /// Instructions they ran, and the accesses of the craft's kind among them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub window_instructions: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub window_accesses: u64,
    /// Picks the windows stepped.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub window_picks: u64,
    /// Windows that ended before their instructions ran out (a system call,
    /// code the cache does not run).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub windows_cut: u64,
    /// Times a window's pick probability was cut to a quarter, its
    /// accesses having come far faster than planned.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub windows_thinned: u64,
    /// The shortest and longest window (instructions).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub window_shortest: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub window_longest: u64,
    /// Blocks translated into the code cache, and times it was emptied.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_blocks: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_flushes: u64,
    /// Times a thread left its copies for the engine (a trap at one of the
    /// cache's exits: a link not yet made, a return or indirect jump whose
    /// target was not in the dispatch table, a pick, a window's end, a
    /// long `rep`), and of those, the dispatch table's misses.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_exits: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_lookups: u64,
    /// Copies made and linked where a copy asked for them, without a trap
    /// (the link stub: a link, a slow variant or a dispatch-table miss).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_links: u64,
    /// Whole-run counting (`-e sw-stores`, `-e sw-loads`): steps between
    /// two windows that let the program's waiting signals in.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub window_bridges: u64,
    /// Whole-run windows: times a thread came back into the cache at a
    /// breakpoint after native code (a system call, a call into code the
    /// cache does not run) instead of at the next tick.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub window_resumes: u64,
    /// Whole-run windows: times a thread went on natively until the next
    /// tick (no breakpoint could take it back), each a stretch uncounted.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub window_gaps: u64,
    /// Restartable sequences' critical sections that a window reached and
    /// left to run natively (the code cache must not run them): at ticks,
    /// windows ended there, their accesses unsampled; whole-run, sections
    /// run unrecorded.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub critical_sections: u64,
    /// Threads whose code cache the kernel would not map (they single-step
    /// their bursts), and of those, the ones refused memory both writable
    /// and executable (EACCES: `prctl(PR_SET_MDWE)`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_refused: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_refused_wx: u64,
    /// Credits that went to their pair but found no room in the thread's
    /// table of data objects (`Thread::objects`): their object is unknown.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub object_overflow: u64,
    /// Times the sampler's signal was held for the program (the agent's
    /// `program_mask`): one of the program's own came while it blocked it,
    /// and was left pending for it, as the kernel would have; or, attached,
    /// a thread blocked it. The thread's sampler paused until it unblocked it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub signals_held: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl Counters {
    /// Take the code cache's figures from `o`: an exact profile's counters
    /// are the judge's, and these are the recording agent's (its windows,
    /// translations, flushes, exits, resumptions and gaps).
    pub fn keep_code_cache(&mut self, o: &Counters) {
        self.cache_ns = o.cache_ns;
        self.link_ns = o.link_ns;
        self.cache_picks = o.cache_picks;
        self.pick_ns = o.pick_ns;
        self.exit_ns = o.exit_ns;
        self.windows = o.windows;
        self.window_instructions = o.window_instructions;
        self.window_accesses = o.window_accesses;
        self.windows_cut = o.windows_cut;
        self.windows_thinned = o.windows_thinned;
        self.window_shortest = o.window_shortest;
        self.window_longest = o.window_longest;
        self.cache_blocks = o.cache_blocks;
        self.cache_flushes = o.cache_flushes;
        self.cache_exits = o.cache_exits;
        self.cache_lookups = o.cache_lookups;
        self.cache_links = o.cache_links;
        self.window_bridges = o.window_bridges;
        self.window_resumes = o.window_resumes;
        self.window_gaps = o.window_gaps;
        self.critical_sections = o.critical_sections;
        (self.cache_refused, self.cache_refused_wx) = (o.cache_refused, o.cache_refused_wx);
    }

    pub fn add(&mut self, o: &Counters) {
        self.interrupts += o.interrupts;
        self.samples += o.samples;
        self.armed += o.armed;
        self.dropped += o.dropped;
        self.skipped_self += o.skipped_self;
        self.overdue += o.overdue;
        self.traps += o.traps;
        self.self_traps += o.self_traps;
        self.ignored_traps += o.ignored_traps;
        self.abandoned += o.abandoned;
        self.imprecise += o.imprecise;
        self.arm_failures += o.arm_failures;
        self.rearms_in_place += o.rearms_in_place;
        self.longest_blind_spot = self.longest_blind_spot.max(o.longest_blind_spot);
        self.tree_overflow += o.tree_overflow;
        self.pair_overflow += o.pair_overflow;
        self.threads_failed += o.threads_failed;
        self.threads += o.threads;
        self.bursts += o.bursts;
        self.steps += o.steps;
        self.bursts_blocked += o.bursts_blocked;
        self.bursts_over_budget += o.bursts_over_budget;
        self.bursts_lost += o.bursts_lost;
        self.ticks_after_exits += o.ticks_after_exits;
        self.ticks_after_syscalls += o.ticks_after_syscalls;
        self.ticks_skipped += o.ticks_skipped;
        self.engine_ns += o.engine_ns;
        self.tick_ns += o.tick_ns;
        self.step_ns += o.step_ns;
        self.trap_ns += o.trap_ns;
        self.cache_ns += o.cache_ns;
        self.link_ns += o.link_ns;
        self.cache_picks += o.cache_picks;
        self.pick_ns += o.pick_ns;
        self.exit_ns += o.exit_ns;
        self.windows += o.windows;
        self.window_instructions += o.window_instructions;
        self.window_accesses += o.window_accesses;
        self.window_picks += o.window_picks;
        self.windows_cut += o.windows_cut;
        self.windows_thinned += o.windows_thinned;
        self.window_shortest = match (self.window_shortest, o.window_shortest) {
            (0, b) => b,
            (a, 0) => a,
            (a, b) => a.min(b),
        };
        self.window_longest = self.window_longest.max(o.window_longest);
        self.cache_blocks += o.cache_blocks;
        self.cache_flushes += o.cache_flushes;
        self.cache_exits += o.cache_exits;
        self.cache_lookups += o.cache_lookups;
        self.cache_links += o.cache_links;
        self.window_bridges += o.window_bridges;
        self.window_resumes += o.window_resumes;
        self.window_gaps += o.window_gaps;
        self.critical_sections += o.critical_sections;
        self.cache_refused += o.cache_refused;
        self.cache_refused_wx += o.cache_refused_wx;
        self.object_overflow += o.object_overflow;
        self.signals_held += o.signals_held;
    }
}
