//! The profile file: what one profiled process leaves behind.
//!
//! JSON via serde, versioned by [`SCHEMA`]. A profile holds raw addresses plus
//! the module map, so symbolization can happen later on any machine that has
//! the binaries (matched by build-id first, then path).
//!
//! Units: `waste`/`use` are estimated by proportional attribution (Witch
//! §4.4.2): each trap adds (µ−η)·P·M where P is the sampler period in the
//! sampler's unit (`Sampler::unit`). What that makes them is recorded as
//! data, in `Sampler::weight_unit` ([`Profile::value_unit`]): bytes when
//! samples are count-proportional, byte·ns for the time-proportional
//! software sampler. Fractions (Equation 4.1) are unit-free and comparable.
//!
//! One file holds one run: the top level is its first process, and
//! `processes` holds every other process of the run (fork children, exec'd
//! images), each a whole profile of its own (modules, threads, counters).

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::Path;

/// Bump when a reader of the old format would misread the new one.
/// 2: `processes` (a run's other processes).
pub const SCHEMA: u32 = 2;

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum Craft {
    Dead,
    SilentStore,
    SilentLoad,
}

impl Craft {
    pub fn name(self) -> &'static str {
        match self {
            Craft::Dead => "dead",
            Craft::SilentStore => "silent-store",
            Craft::SilentLoad => "silent-load",
        }
    }
    pub fn parse(s: &str) -> Option<Craft> {
        match s {
            "dead" => Some(Craft::Dead),
            "silent-store" | "silent" => Some(Craft::SilentStore),
            "silent-load" | "load" => Some(Craft::SilentLoad),
            _ => None,
        }
    }
    /// The word joining the two contexts of a pair (Witch §4.6.5).
    pub fn relation(self) -> &'static str {
        match self {
            Craft::Dead => "KILLED_BY",
            Craft::SilentStore | Craft::SilentLoad => "SAME_VALUE_AS",
        }
    }
}

/// Which kind of sampler chose the watched accesses.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "kebab-case")]
pub enum SamplerKind {
    /// A PMU's precise memory events: samples by count of accesses.
    Pmu,
    /// A timer on the thread's CPU time (with or without single-step bursts).
    #[default]
    Software,
    /// The exact reference mode: every access is judged.
    Exact,
}

impl SamplerKind {
    /// Every access is judged (the exact mode): the profile's figures are
    /// counts, with no sampling error, not estimates.
    pub fn is_exhaustive(self) -> bool {
        self == SamplerKind::Exact
    }

    pub fn name(self) -> &'static str {
        match self {
            SamplerKind::Pmu => "pmu",
            SamplerKind::Software => "software",
            SamplerKind::Exact => "exact",
        }
    }
}

/// The unit of a sampler's period.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "kebab-case")]
pub enum PeriodUnit {
    /// Nanoseconds of thread CPU time.
    #[default]
    Ns,
    Stores,
    Loads,
    /// Micro-ops (AMD IBS).
    Ops,
    Accesses,
}

impl PeriodUnit {
    pub fn name(self) -> &'static str {
        match self {
            PeriodUnit::Ns => "ns",
            PeriodUnit::Stores => "stores",
            PeriodUnit::Loads => "loads",
            PeriodUnit::Ops => "ops",
            PeriodUnit::Accesses => "accesses",
        }
    }
}

/// What the `waste`/`use` figures of a profile measure.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueUnit {
    /// Bytes (estimated by count-proportional sampling, or counted exactly).
    #[serde(rename = "bytes")]
    Bytes,
    /// Bytes times nanoseconds of CPU time: time-proportional weights, whose
    /// ratios are meaningful but whose absolute values are not bytes.
    #[serde(rename = "byte·ns", alias = "byte-ns")]
    ByteNs,
}

impl ValueUnit {
    /// The unit as people read it: "bytes" or "byte·ns".
    pub fn label(self) -> &'static str {
        match self {
            ValueUnit::Bytes => "bytes",
            ValueUnit::ByteNs => "byte·ns",
        }
    }
}

/// An absent or empty `weight_unit` (profiles written before it existed) reads as None.
fn weight_unit<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<ValueUnit>, D::Error> {
    match Option::<String>::deserialize(d)?.as_deref() {
        None | Some("") => Ok(None),
        Some(s) => ValueUnit::deserialize(serde::de::value::StrDeserializer::<D::Error>::new(s)).map(Some),
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct Sampler {
    pub kind: SamplerKind,
    /// Event name, e.g. "task-clock" or "cpu/mem-stores/".
    pub event: String,
    pub period: u64,
    /// Unit of `period`.
    pub unit: PeriodUnit,
    /// Unit of the pairs' waste and use totals: bytes where samples are
    /// count-proportional (PMU, single-step bursts, exact), byte·ns for the
    /// time-proportional software sampler. None in profiles written before
    /// this field: then byte·ns if `unit` is ns, else bytes.
    #[serde(default, deserialize_with = "weight_unit", skip_serializing_if = "Option::is_none")]
    pub weight_unit: Option<ValueUnit>,
    /// Most instructions per single-step burst (0: no bursts).
    #[serde(default)]
    pub burst_steps: u32,
    /// Accesses picked per burst.
    #[serde(default)]
    pub burst_picks: u32,
    /// Instructions per burst window run from the code cache (0: bursts
    /// are single-stepped, or none).
    #[serde(default, skip_serializing_if = "is_zero32")]
    pub window_instructions: u32,
    /// Picks a window expects.
    #[serde(default, skip_serializing_if = "is_zero_f")]
    pub window_picks: f64,
    /// The bursts' overhead budget, percent of the program's CPU time (0:
    /// no limit; None: no bursts, or a profile from before budgets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead_percent: Option<f64>,
}

impl Sampler {
    /// The unit of waste and use totals (see `weight_unit`).
    pub fn totals_unit(&self) -> ValueUnit {
        self.weight_unit.unwrap_or(match self.unit {
            PeriodUnit::Ns => ValueUnit::ByteNs,
            _ => ValueUnit::Bytes,
        })
    }
}

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
    /// Credits that went to their pair but found no room in the thread's
    /// table of data objects (`Thread::objects`): their object is unknown.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub object_overflow: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_zero32(v: &u32) -> bool {
    *v == 0
}

fn is_zero_f(v: &f64) -> bool {
    *v == 0.0
}

impl Counters {
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
        self.exit_ns += o.exit_ns;
        self.windows += o.windows;
        self.window_instructions += o.window_instructions;
        self.window_accesses += o.window_accesses;
        self.window_picks += o.window_picks;
        self.windows_cut += o.windows_cut;
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
        self.window_bridges += o.window_bridges;
        self.window_resumes += o.window_resumes;
        self.window_gaps += o.window_gaps;
        self.object_overflow += o.object_overflow;
    }
}

/// One mapped executable segment of a module.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Module {
    pub path: String,
    /// GNU build-id, lowercase hex.
    pub build_id: Option<String>,
    /// Mapped address range [start, end).
    pub start: u64,
    pub end: u64,
    /// Load bias: file virtual address = runtime address - bias.
    pub bias: u64,
}

/// A calling-context tree node. Node 0 is the root (pc 0).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Node {
    /// Parent index; the root's parent is itself (0).
    pub parent: u32,
    /// Lookup address: the instruction's own address for the leaf, the return
    /// address minus one for callers (so it symbolizes to the call's line).
    pub pc: u64,
    /// µ(C): samples taken in this exact context.
    #[serde(default)]
    pub samples: u64,
}

/// ⟨C_watch, C_trap⟩ with its attributed bytes.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct Pair {
    pub watch: u32,
    pub trap: u32,
    /// Waste bytes from exact comparison (dead: all waste is exact).
    pub waste: f64,
    /// Waste bytes from floating-point comparison within the precision.
    pub approx_waste: f64,
    pub r#use: f64,
    /// Sums of squares of each trap's credit to `waste`, `approx_waste` and
    /// `use` (same unit squared), for intervals on ratios; 0 in profiles
    /// written before they existed.
    #[serde(default)]
    pub waste_sq: f64,
    #[serde(default)]
    pub approx_waste_sq: f64,
    #[serde(default)]
    pub use_sq: f64,
    /// Traps that fed this pair.
    pub traps: u64,
    /// The same credits summed per cluster (see [`Clustered`]); all 0 in
    /// profiles written before clusters existed, and in exact runs.
    #[serde(default, skip_serializing_if = "Clustered::is_empty")]
    pub cluster: Clustered,
}

/// Sums over clusters: the traps a thread credited between two of its
/// sampler interrupts. A burst's picks are judged together, mostly before
/// the next tick, and resemble each other (the same loop, the same weight),
/// so they are not independent draws; an interval treating each trap as one
/// understates the spread (measured: run-to-run sd 1.3x the reported
/// standard error at the median case, up to 2x). Summing credits per
/// cluster first and squaring the cluster's sums gives the variance with
/// clusters as the independent units (batch means).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Default)]
pub struct Clustered {
    /// Clusters with any credit.
    pub clusters: u64,
    /// Σ over clusters of (the cluster's waste, exact plus approximate)².
    pub waste_sq: f64,
    /// Σ over clusters of (the cluster's use)².
    pub use_sq: f64,
    /// Σ over clusters of its waste times its use.
    pub waste_use: f64,
}

impl Clustered {
    pub fn is_empty(&self) -> bool {
        self.clusters == 0
    }

    pub fn add(&mut self, o: &Clustered) {
        self.clusters += o.clusters;
        self.waste_sq += o.waste_sq;
        self.use_sq += o.use_sq;
        self.waste_use += o.waste_use;
    }

    fn finite(&self) -> bool {
        [self.waste_sq, self.use_sq, self.waste_use].into_iter().all(|v| v.is_finite() && v >= 0.0)
    }
}

/// The data object a judged access touched, as the engine saw it (see
/// `witchcraft::objects`); a report resolves `Address` offline.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum DataRef {
    /// An address outside the thread's stack and every tracked heap block:
    /// a static object if a module's data segment holds it, else unknown.
    Address { addr: u64 },
    /// The thread's own stack.
    Stack,
    /// A heap block the agent tracked: its start and size, and the calling
    /// context of its allocation (lookup addresses, innermost first), which
    /// names the object.
    Heap { addr: u64, size: u64, site: Vec<u64> },
}

/// A pair's credits to one data object: ⟨C_watch, C_trap, object⟩.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ObjectPair {
    #[serde(flatten)]
    pub pair: Pair,
    pub object: DataRef,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct Thread {
    pub tid: u32,
    pub nodes: Vec<Node>,
    pub pairs: Vec<Pair>,
    pub counters: Counters,
    /// The thread's credits over all its pairs, summed per cluster: the
    /// whole run's interval comes from these.
    #[serde(default, skip_serializing_if = "Clustered::is_empty")]
    pub clusters: Clustered,
    /// The same credits as `pairs`, split by the data object each judged
    /// access touched; empty in profiles from before objects were kept
    /// (and in exact runs). Credits the table had no room for are in
    /// `pairs` only (`counters.object_overflow`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub objects: Vec<ObjectPair>,
}

/// How profiling of a process ended. In a profile it is one word (and a
/// number for a signal), as it always was; readers match on the enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EndedBy {
    /// The process exited.
    Exit,
    /// The process was killed by this signal.
    Signal(i32),
    /// The process replaced its program; what the old image gathered is
    /// this profile.
    Exec,
    /// An attached session ended as the controller asked (or its
    /// controller went away).
    Detach,
    /// A debugger took the process during an attached session, and the
    /// agent left the debug registers and signals to it.
    Traced,
    /// The program installed a seccomp filter, and the agent left first.
    Sandbox,
}

impl EndedBy {
    /// Whether the process runs on after this end (the agent left it, or
    /// an exec gave it a new program): a detach, a debugger, a sandbox or
    /// an exec; an exit or a fatal signal ends it.
    pub fn process_runs_on(self) -> bool {
        !matches!(self, EndedBy::Exit | EndedBy::Signal(_))
    }

    /// Whether the agent ended an attached session by itself rather than
    /// as the controller asked.
    pub fn agent_left(self) -> bool {
        matches!(self, EndedBy::Traced | EndedBy::Sandbox)
    }
}

impl std::fmt::Display for EndedBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EndedBy::Exit => f.write_str("exit"),
            EndedBy::Signal(n) => write!(f, "signal {n}"),
            EndedBy::Exec => f.write_str("exec"),
            EndedBy::Detach => f.write_str("detach"),
            EndedBy::Traced => f.write_str("traced"),
            EndedBy::Sandbox => f.write_str("sandbox"),
        }
    }
}

impl std::str::FromStr for EndedBy {
    type Err = String;
    fn from_str(s: &str) -> Result<EndedBy, String> {
        Ok(match s {
            "exit" => EndedBy::Exit,
            "exec" => EndedBy::Exec,
            "detach" => EndedBy::Detach,
            "traced" => EndedBy::Traced,
            "sandbox" => EndedBy::Sandbox,
            _ => match s.strip_prefix("signal ").map(str::parse::<i32>) {
                Some(Ok(n)) if (1..=64).contains(&n) => EndedBy::Signal(n),
                _ => return Err(format!("unknown end of profiling {s:?}")),
            },
        })
    }
}

impl Serialize for EndedBy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for EndedBy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<EndedBy, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The kernel round trips an agent measured at its start, in nanoseconds.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Default)]
pub struct RoundTrips {
    /// A watchpoint trap: debug exception, signal delivery, `sigreturn`.
    pub trap_ns: u64,
    /// A signal to the thread itself and back.
    pub signal_ns: u64,
    /// One single step (trap flag) and back.
    pub step_ns: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Profile {
    pub schema: u32,
    pub witch_version: String,
    pub craft: Craft,
    pub program: String,
    pub args: Vec<String>,
    pub pid: u32,
    pub ppid: u32,
    /// Unix time (ns) when profiling of this process began.
    pub start_unix_ns: u64,
    pub duration_ns: u64,
    pub sampler: Sampler,
    pub replacement: String,
    pub debug_registers: u32,
    /// Relative precision for floating-point equality (0 = exact only).
    pub fp_precision: f64,
    pub kernel: String,
    /// How profiling ended (written as "exit", "signal N", "exec",
    /// "detach", "traced" or "sandbox").
    pub ended_by: EndedBy,
    /// The exec function whose call ended profiling (`ended_by` exec), when
    /// the agent saw the call itself: "execve", "execlp", "fexecve", ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_call: Option<String>,
    /// The kernel round trips the agent measured at its start (what its
    /// overhead accounting charges a trap, a signal and a single step);
    /// None in exact runs and in profiles written before this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round_trips: Option<RoundTrips>,
    /// Human-readable notes, e.g. fallbacks taken.
    pub notes: Vec<String>,
    pub counters: Counters,
    pub modules: Vec<Module>,
    pub threads: Vec<Thread>,
    /// The run's other processes (fork children, exec'd images), in start
    /// order, each a whole profile with an empty `processes` of its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<Profile>,
}

/// The largest profile file [`Profile::load`] reads (a process's profile
/// is at most 256 MiB; a run's file merges its processes').
pub const MAX_FILE_BYTES: u64 = 1 << 30;

/// Why [`read_capped`] stopped.
#[derive(Debug)]
pub enum Capped {
    Io(std::io::Error),
    /// `check` refused the first bytes.
    Refused(String),
    /// More than the limit.
    TooLarge,
}

/// Everything `r` gives, up to `max` bytes; `check` sees the first bytes
/// (up to 4 KiB, or all of a shorter input) before the rest is read, so
/// an endless stream of the wrong kind fails at once.
pub fn read_capped(r: impl std::io::Read, max: u64, check: impl Fn(&[u8]) -> Result<(), String>) -> Result<Vec<u8>, Capped> {
    use std::io::Read;
    let mut r = r.take(max + 1);
    let mut data = vec![0u8; 4096];
    let mut got = 0;
    while got < data.len() {
        match r.read(&mut data[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Capped::Io(e)),
        }
    }
    data.truncate(got);
    check(&data).map_err(Capped::Refused)?;
    r.read_to_end(&mut data).map_err(Capped::Io)?;
    if data.len() as u64 > max {
        return Err(Capped::TooLarge);
    }
    Ok(data)
}

/// A reader that fails (`InvalidData`) at the first byte JSON text never
/// holds: a control character other than tab, newline and carriage
/// return (serde escapes them in strings). Random bytes fail within the
/// first few dozen, so a file of garbage that happens to begin with `{` is
/// refused at once, not read to the size limit.
struct TextOnly<R> {
    inner: R,
    offset: u64,
}

impl<R: std::io::Read> std::io::Read for TextOnly<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(i) = buf[..n].iter().position(|&c| c < 0x20 && !matches!(c, b'\t' | b'\n' | b'\r')) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("byte 0x{:02x} at offset {}: binary data, not JSON text", buf[i], self.offset + i as u64),
            ));
        }
        self.offset += n as u64;
        Ok(n)
    }
}

#[derive(Debug)]
pub enum LoadError {
    Io(std::io::Error),
    Empty,
    Corrupt(String),
    /// Not a profile at all (binary data, an endless stream, too large).
    NotProfile(String),
    Newer(u32),
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Io(e) => write!(f, "cannot read profile: {e}"),
            LoadError::Empty => write!(f, "profile is empty"),
            LoadError::Corrupt(e) => write!(f, "profile is corrupt or truncated: {e}"),
            LoadError::NotProfile(e) => write!(f, "not a witch profile: {e}"),
            LoadError::Newer(v) => write!(f, "profile schema {v} is newer than this witch understands ({SCHEMA}); upgrade witch"),
        }
    }
}
impl std::error::Error for LoadError {}

impl Profile {
    pub fn from_bytes(b: &[u8]) -> Result<Profile, LoadError> {
        if b.iter().all(|c| c.is_ascii_whitespace()) {
            return Err(LoadError::Empty);
        }
        // Read the schema first so a newer file says so instead of "corrupt".
        #[derive(Deserialize)]
        struct Head {
            schema: u32,
        }
        let head: Head = serde_json::from_slice(b).map_err(|e| LoadError::Corrupt(e.to_string()))?;
        if head.schema > SCHEMA {
            return Err(LoadError::Newer(head.schema));
        }
        let p: Profile = serde_json::from_slice(b).map_err(|e| LoadError::Corrupt(e.to_string()))?;
        if p.processes.iter().any(|c| !c.processes.is_empty()) {
            return Err(LoadError::Corrupt("a process section holds processes of its own".into()));
        }
        for t in p.all().flat_map(|q| &q.threads) {
            let n = t.nodes.len() as u32;
            let pairs = || t.pairs.iter().chain(t.objects.iter().map(|o| &o.pair));
            if t.nodes.iter().any(|x| x.parent >= n) || pairs().any(|x| x.watch >= n || x.trap >= n) {
                return Err(LoadError::Corrupt(format!("thread {}: node index out of range", t.tid)));
            }
            // Amounts are sums of credits: never negative, never NaN or infinite.
            let bad = |v: f64| !(v.is_finite() && v >= 0.0);
            if let Some(x) = pairs().find(|x| {
                [x.waste, x.approx_waste, x.r#use, x.waste_sq, x.approx_waste_sq, x.use_sq].into_iter().any(bad) || !x.cluster.finite()
            }) {
                return Err(LoadError::Corrupt(format!("thread {}: a pair with waste {} and use {}", t.tid, x.waste, x.r#use)));
            }
            if !t.clusters.finite() {
                return Err(LoadError::Corrupt(format!("thread {}: cluster sums not finite and non-negative", t.tid)));
            }
        }
        Ok(p)
    }

    /// Read and check a profile. Any path may be given (a pipe from
    /// `<(...)` too), so the read is bounded: a file that does not start
    /// like JSON (`/dev/zero`, a binary) is refused at its first bytes, and
    /// one larger than [`MAX_FILE_BYTES`] at that size.
    pub fn load(path: &Path) -> Result<Profile, LoadError> {
        Self::read_from(std::fs::File::open(path).map_err(LoadError::Io)?)
    }

    /// [`Profile::load`] from a file already open (the caller chose how to
    /// open it: without blocking on a FIFO, say).
    pub fn read_from(f: impl std::io::Read) -> Result<Profile, LoadError> {
        let b =
            read_capped(TextOnly { inner: f, offset: 0 }, MAX_FILE_BYTES, |head| match head.iter().find(|c| !c.is_ascii_whitespace()) {
                Some(b'{') | None => Ok(()),
                Some(c) => Err(format!("it starts with byte 0x{c:02x}, not a JSON object")),
            })
            .map_err(|e| match e {
                Capped::Io(e) if e.kind() == std::io::ErrorKind::InvalidData => LoadError::NotProfile(e.to_string()),
                Capped::Io(e) => LoadError::Io(e),
                Capped::Refused(why) => LoadError::NotProfile(why),
                Capped::TooLarge => LoadError::NotProfile(format!("larger than {} MiB", MAX_FILE_BYTES >> 20)),
            })?;
        Self::from_bytes(&b)
    }

    /// Write atomically: a temporary file in the same directory, then rename.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        {
            let mut f = std::fs::File::create(&tmp)?;
            let data = serde_json::to_vec(self).map_err(std::io::Error::other)?;
            f.write_all(&data)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)
    }

    /// The unit of `waste`/`use` (see `Sampler::weight_unit`).
    pub fn value_unit(&self) -> ValueUnit {
        self.sampler.totals_unit()
    }

    /// Every process of the run: this one, then `processes`.
    pub fn all(&self) -> impl Iterator<Item = &Profile> {
        std::iter::once(self).chain(&self.processes)
    }

    /// Totals of this process alone, per Equation 4.1: (waste incl.
    /// approximate, approximate part, use).
    pub fn totals(&self) -> (f64, f64, f64) {
        let (mut w, mut a, mut u) = (0.0, 0.0, 0.0);
        for t in &self.threads {
            for p in &t.pairs {
                w += p.waste + p.approx_waste;
                a += p.approx_waste;
                u += p.r#use;
            }
        }
        (w, a, u)
    }

    /// Equation 4.1: waste / (waste + use); 0 when nothing was observed.
    pub fn waste_fraction(&self) -> f64 {
        let (w, _, u) = self.totals();
        if w + u > 0.0 {
            w / (w + u)
        } else {
            0.0
        }
    }

    /// The path from a node to the root, innermost first (root excluded).
    pub fn context(thread: &Thread, mut node: u32) -> Vec<u64> {
        let mut out = Vec::new();
        let mut guard = 0;
        while node != 0 && guard < 4096 {
            let n = &thread.nodes[node as usize];
            out.push(n.pc);
            node = n.parent;
            guard += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Profile {
        Profile {
            schema: SCHEMA,
            witch_version: "test".into(),
            craft: Craft::Dead,
            program: "/bin/true".into(),
            args: vec![],
            pid: 1,
            ppid: 0,
            start_unix_ns: 0,
            duration_ns: 1,
            sampler: Sampler {
                kind: SamplerKind::Software,
                event: "task-clock".into(),
                period: 1000,
                unit: PeriodUnit::Ns,
                ..Default::default()
            },
            replacement: "reservoir".into(),
            debug_registers: 4,
            fp_precision: 0.01,
            kernel: "6".into(),
            ended_by: EndedBy::Exit,
            exec_call: None,
            round_trips: None,
            notes: vec![],
            counters: Counters::default(),
            modules: vec![],
            threads: vec![Thread {
                tid: 1,
                nodes: vec![
                    Node { parent: 0, pc: 0, samples: 0 },
                    Node { parent: 0, pc: 10, samples: 3 },
                    Node { parent: 1, pc: 20, samples: 1 },
                ],
                pairs: vec![Pair { watch: 2, trap: 1, waste: 30.0, approx_waste: 10.0, r#use: 60.0, traps: 3, ..Default::default() }],
                counters: Counters::default(),
                clusters: Clustered { clusters: 2, waste_sq: 1600.0, use_sq: 3600.0, waste_use: 0.0 },
                objects: vec![ObjectPair {
                    pair: Pair { watch: 2, trap: 1, waste: 30.0, traps: 1, ..Default::default() },
                    object: DataRef::Address { addr: 0x4000 },
                }],
            }],
            processes: vec![],
        }
    }

    #[test]
    fn ended_by_is_one_word_as_before() {
        let all = [EndedBy::Exit, EndedBy::Signal(6), EndedBy::Exec, EndedBy::Detach, EndedBy::Traced, EndedBy::Sandbox];
        for e in all {
            let json = serde_json::to_string(&e).unwrap();
            assert_eq!(serde_json::from_str::<EndedBy>(&json).unwrap(), e, "{json}");
        }
        assert_eq!(serde_json::to_string(&EndedBy::Signal(9)).unwrap(), r#""signal 9""#);
        for bad in [r#""crashed""#, r#""signal""#, r#""signal 0""#, r#""signal -3""#, "7"] {
            assert!(serde_json::from_str::<EndedBy>(bad).is_err(), "{bad}");
        }
        assert!(EndedBy::Exec.process_runs_on() && !EndedBy::Signal(9).process_runs_on());
        assert!(EndedBy::Sandbox.agent_left() && !EndedBy::Detach.agent_left());
    }

    #[test]
    fn roundtrip_and_fraction() {
        let p = sample();
        let dir = std::env::temp_dir().join(format!("witch-prof-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("p.json");
        p.save(&f).unwrap();
        let q = Profile::load(&f).unwrap();
        assert_eq!(p, q);
        assert!((q.waste_fraction() - 0.4).abs() < 1e-12);
        assert_eq!(Profile::context(&q.threads[0], 2), vec![20, 10]);
    }

    #[test]
    fn bad_inputs_are_errors() {
        assert!(matches!(Profile::from_bytes(b""), Err(LoadError::Empty)));
        // Endless or binary input fails at its first bytes, bounded.
        let zeros = std::io::Read::take(std::io::repeat(0), 1 << 40);
        assert!(matches!(read_capped(zeros, 1 << 30, |h| if h[0] == 0 { Err("NUL".into()) } else { Ok(()) }), Err(Capped::Refused(_))));
        let braces = std::io::Read::take(std::io::repeat(b'{'), 1 << 40);
        assert!(matches!(read_capped(braces, 1 << 20, |_| Ok(())), Err(Capped::TooLarge)));
        assert_eq!(read_capped(&b" {}"[..], 3, |_| Ok(())).unwrap(), b" {}");
        match Profile::load(Path::new("/dev/zero")) {
            Err(LoadError::NotProfile(why)) => assert!(why.contains("0x00"), "{why}"),
            other => panic!("/dev/zero: {other:?}"),
        }
        // Garbage that begins like a JSON object (random bytes do, one time
        // in about fifty: `{` or whitespace first) is refused at its first
        // control byte, not read to the limit.
        let dir = std::env::temp_dir().join(format!("witch-profile-text-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let looks_like = dir.join("brace.json");
        let mut junk = b"{ \"schema\": 2, ".to_vec();
        junk.extend((0..1u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
        std::fs::write(&looks_like, &junk).unwrap();
        match Profile::load(&looks_like) {
            Err(LoadError::NotProfile(why)) => assert!(why.contains("binary data") && why.contains("offset"), "{why}"),
            other => panic!("{}: {other:?}", looks_like.display()),
        }
        // Tabs, newlines and carriage returns are text.
        let crlf = dir.join("crlf.json");
        std::fs::write(&crlf, serde_json::to_string_pretty(&sample()).unwrap().replace('\n', "\r\n\t")).unwrap();
        assert_eq!(Profile::load(&crlf).unwrap(), sample());
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(Profile::from_bytes(b"{\"schema\":1,"), Err(LoadError::Corrupt(_))));
        let mut v = serde_json::to_value(sample()).unwrap();
        v["schema"] = 99.into();
        assert!(matches!(Profile::from_bytes(v.to_string().as_bytes()), Err(LoadError::Newer(99))));
        let mut p = sample();
        p.threads[0].pairs[0].trap = 7;
        let s = serde_json::to_vec(&p).unwrap();
        assert!(matches!(Profile::from_bytes(&s), Err(LoadError::Corrupt(_))));
        // An object entry is checked like a pair.
        let mut p = sample();
        p.threads[0].objects[0].pair.trap = 7;
        assert!(matches!(Profile::from_bytes(&serde_json::to_vec(&p).unwrap()), Err(LoadError::Corrupt(_))));
        let mut p = sample();
        p.threads[0].objects[0].pair.waste = f64::NAN;
        assert!(matches!(Profile::from_bytes(&serde_json::to_vec(&p).unwrap()), Err(LoadError::Corrupt(_))));
        let mut v = serde_json::to_value(sample()).unwrap();
        v["threads"][0]["objects"][0]["object"] = serde_json::json!({"kind": "moon"});
        assert!(matches!(Profile::from_bytes(v.to_string().as_bytes()), Err(LoadError::Corrupt(_))));
        let mut p = sample();
        p.threads[0].pairs[0].waste = -5.0;
        assert!(matches!(Profile::from_bytes(&serde_json::to_vec(&p).unwrap()), Err(LoadError::Corrupt(_))));
        let mut p = sample();
        p.threads[0].pairs[0].cluster.use_sq = -1.0;
        p.threads[0].pairs[0].cluster.clusters = 1;
        assert!(matches!(Profile::from_bytes(&serde_json::to_vec(&p).unwrap()), Err(LoadError::Corrupt(_))));
        let mut p = sample();
        p.threads[0].clusters.waste_use = -1.0;
        assert!(matches!(Profile::from_bytes(&serde_json::to_vec(&p).unwrap()), Err(LoadError::Corrupt(_))));
        // A broken child section is as corrupt as a broken top level.
        let mut p = sample();
        let mut child = sample();
        child.threads[0].pairs[0].watch = 9;
        p.processes.push(child);
        assert!(matches!(Profile::from_bytes(&serde_json::to_vec(&p).unwrap()), Err(LoadError::Corrupt(_))));
        let mut p = sample();
        let mut child = sample();
        child.processes.push(sample());
        p.processes.push(child);
        assert!(matches!(Profile::from_bytes(&serde_json::to_vec(&p).unwrap()), Err(LoadError::Corrupt(_))));
    }

    #[test]
    fn units_are_typed_and_read_from_older_files() {
        let mut v = serde_json::to_value(sample()).unwrap();
        assert_eq!(v["sampler"]["kind"], "software");
        assert_eq!(v["sampler"]["unit"], "ns");
        assert!(v["sampler"].get("weight_unit").is_none() && v.get("processes").is_none());
        let p = Profile::from_bytes(v.to_string().as_bytes()).unwrap();
        assert_eq!(p.value_unit(), ValueUnit::ByteNs);
        v["sampler"]["unit"] = "stores".into();
        assert_eq!(Profile::from_bytes(v.to_string().as_bytes()).unwrap().value_unit(), ValueUnit::Bytes);
        // As the engine writes it, and as profiles of an interim format did ("").
        for (w, want) in [("byte·ns", ValueUnit::ByteNs), ("bytes", ValueUnit::Bytes), ("", ValueUnit::Bytes)] {
            v["sampler"]["weight_unit"] = w.into();
            assert_eq!(Profile::from_bytes(v.to_string().as_bytes()).unwrap().value_unit(), want, "{w:?}");
        }
        let mut p = sample();
        p.sampler.weight_unit = Some(ValueUnit::ByteNs);
        assert_eq!(serde_json::to_value(&p).unwrap()["sampler"]["weight_unit"], "byte·ns");
        // Profiles from before data objects load without them; the entries
        // are written flat, the object beside the pair's fields.
        assert_eq!(v["threads"][0]["objects"][0]["object"], serde_json::json!({"kind": "address", "addr": 0x4000}));
        assert_eq!(v["threads"][0]["objects"][0]["watch"], 2);
        v["threads"][0].as_object_mut().unwrap().remove("objects");
        assert!(Profile::from_bytes(v.to_string().as_bytes()).unwrap().threads[0].objects.is_empty());
        v["sampler"]["kind"] = "sundial".into();
        assert!(matches!(Profile::from_bytes(v.to_string().as_bytes()), Err(LoadError::Corrupt(_))));
    }
}
