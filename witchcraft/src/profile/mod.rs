//! The profile file: what one profiled process leaves behind.
//!
//! JSON via serde, versioned by [`SCHEMA`]. A profile holds raw addresses plus
//! the module map, so symbolization can happen later on any machine that has
//! the binaries (matched by build-id first, then path).
//!
//! Units: `waste`/`use` are estimated by proportional attribution (Witch
//! §4.4.2): each trap adds (µ−η)·P·M where P is the sampler period in the
//! sampler's unit (`SamplerSettings::unit`). What that makes them is recorded as
//! data, in `SamplerSettings::weight_unit` ([`Profile::value_unit`]): bytes when
//! samples are count-proportional, byte·ns for the time-proportional
//! software sampler. Fractions (Equation 4.1) are unit-free and comparable.
//!
//! One file holds one run: the top level is its first process, and
//! `processes` holds every other process of the run (fork children, exec'd
//! images), each a whole profile of its own (modules, threads, counters).

mod counters;
mod load;
#[cfg(test)]
mod tests;

pub use counters::Counters;
pub use load::{read_capped, Capped, LoadError, MAX_FILE_BYTES};

use serde::{Deserialize, Serialize};

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

/// The sampler a profile was taken with, as the profile records it (what
/// takes the samples is `engine::sampler`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct SamplerSettings {
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
    /// Each pick of a window was weighed by the inverse of the time its
    /// copies took around it (`WITCH_WINDOW_TIME=1`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub window_timed: bool,
    /// The bursts' overhead budget, percent of the program's CPU time (0:
    /// no limit; None: no bursts, or a profile from before budgets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead_percent: Option<f64>,
}

impl SamplerSettings {
    /// The unit of waste and use totals (see `weight_unit`).
    pub fn totals_unit(&self) -> ValueUnit {
        self.weight_unit.unwrap_or(match self.unit {
            PeriodUnit::Ns => ValueUnit::ByteNs,
            _ => ValueUnit::Bytes,
        })
    }
}

fn is_zero32(v: &u32) -> bool {
    *v == 0
}

fn is_zero_f(v: &f64) -> bool {
    *v == 0.0
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
    /// A debugger took the process (or the program opened hardware
    /// breakpoints of its own), and the agent left the debug registers and
    /// signals to it.
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
    pub sampler: SamplerSettings,
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

impl Profile {
    /// The unit of `waste`/`use` (see `SamplerSettings::weight_unit`).
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
