//! The `witch` command line, declared with clap's derive API.
//!
//! Parsing only: each subcommand's work lives in its own module.

use crate::render::Format;
use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;
use witchcraft::replacement::Policy;

/// How `--exact` observes every access.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExactMode {
    /// From the code cache: recording copies of the program's code
    Cache,
    /// Single steps under ptrace
    Step,
}

const TOP_AFTER_HELP: &str = "\
Examples:
  witch dead ./app                      find dead stores in ./app, print the top pairs
  witch silent-load -p 5000003 ./app    redundant loads, one sample every 5000003 loads
  witch silent-store -o app.witch ./app --its-own-flag
  witch report app.witch --flamegraph app.svg
  witch diff before.witch after.witch
  witch gate --max-waste 20% app.witch  CI: exit 1 if more than 20% of stores are dead
  witch doctor                          what this machine offers (PMU, debug registers, ...)

A run writes its profile (a versioned JSON file) and prints a report; `witch report`
renders a saved profile again, on any machine that has the binaries or their debug info.";

#[derive(Parser, Debug)]
#[command(
    name = "witch",
    version,
    about = "Find wasted memory operations: dead stores, silent stores and redundant loads",
    long_about = "Find wasted memory operations: dead stores, silent stores and redundant loads.\n\n\
        witch samples a program's memory accesses and watches the sampled addresses with \
        hardware debug registers, so it runs unmodified, optimized binaries at low overhead \
        (Wen et al., \"Watching for Software Inefficiencies with Witch\", ASPLOS'18).",
    after_help = TOP_AFTER_HELP,
    arg_required_else_help = true,
    propagate_version = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a program and find dead stores: stores overwritten before any load reads them
    #[command(
        after_help = "\
Examples:
  witch dead ./app
  witch dead -p 20000 --top 5 -- ./app --input big.txt
  witch dead -q -o app.witch ./app                   (profile only, no report)
  witch dead --json ./app > report.json
  witch dead -e list                                 (sampling events this machine offers)

Each pair reads \"dead store at C1, killed by C2\": the store in context C1 was overwritten by
the store in C2 before anything read it.",
        override_usage = "witch dead [OPTIONS] [--] <PROGRAM> [ARGS]..."
    )]
    Dead(RunArgs),

    /// Run a program and find silent stores: stores that write the value already there
    #[command(
        visible_alias = "silent",
        after_help = "\
Examples:
  witch silent-store ./app
  witch silent --fp-precision 0 ./app       (floating point must match exactly)

Each pair reads \"store at C1, rewritten with the same value by C2\". Floating-point values
equal within --fp-precision count as approximate waste, reported apart from exact waste.",
        override_usage = "witch silent-store [OPTIONS] [--] <PROGRAM> [ARGS]..."
    )]
    SilentStore(RunArgs),

    /// Run a program and find redundant loads: loads of a value that has not changed
    #[command(
        visible_alias = "load",
        after_help = "\
Examples:
  witch silent-load ./app
  witch silent-load -p 5000003 ./app

Each pair reads \"load at C1, reloaded unchanged by C2\"; stores in between are ignored.",
        override_usage = "witch silent-load [OPTIONS] [--] <PROGRAM> [ARGS]..."
    )]
    SilentLoad(RunArgs),

    /// Render a saved profile: text, JSON, pprof, folded stacks or a flame graph
    #[command(after_help = "\
Examples:
  witch report app.witch
  witch report app.witch --json | jq .waste_fraction
  witch report app.witch --pprof app.pb.gz && go tool pprof -http : app.pb.gz
  witch report app.witch --folded > app.folded
  witch report app.witch --flamegraph app.svg

PROFILE may also be the directory of parts an interrupted run left (witch-parts-PID/);
--save FILE writes it as one profile.

Flame graphs and folded stacks show the wasted accesses by their calling context (--view
waste, the default; the SVG is drawn from them down to their callers, so the heaviest waste is
on its first screen), what wasted them (--view killers), or both (--view pairs: watched
context, KILLED_BY or SAME_VALUE_AS, trapping context, as in pprof).

pprof stacks are the synthetic context of each pair. With --pprof-leaf trap
(the default) a stack runs from the watched context through KILLED_BY or SAME_VALUE_AS (USED_BY
for the bytes that were used) to the trapping context, so `go tool pprof -top` ranks the
killers; with --pprof-leaf watch it runs from the trapping context through KILLS, SAME_VALUE_AS
or USES to the watched one, so `-top` ranks the dead (or silent, redundant) accesses themselves.
Sample types waste and use are in the profile's unit: bytes, or byte·ns for time-weighted
estimates (which pprof then shows as plain numbers).

JSON (schema 2; stable fields): schema, craft, program, args, pid, sampler {event, period,
kind, unit}, unit (of every waste and use figure: bytes or byte·ns), samples, traps, waste,
approx_waste, use, waste_fraction (0..1), waste_fraction_ci [lo, hi] (95%), duration_ns,
threads, pair_count, counters, notes;
lines: the program's own source lines by waste, each {function, file, line, module, via,
pids, waste, approx_waste, use, share, share_ci, fraction, fraction_ci, traps, few_traps,
partners: [{function, file, line, module, via, waste, use}]};
pairs by waste, each {pid, waste, approx_waste, use, share, share_ci, fraction, fraction_ci,
traps, few_traps, watch: {frames}, trap: {frames}}, frames innermost first as {function,
file, line, module, offset, inlined} (file and line null when unknown);
processes: each {pid, ppid, program, args, ended_by, duration_ns, threads, samples, traps,
waste, use, share, waste_fraction, waste_fraction_ci, notes}.
JSON keeps every line and pair unless --top is given; totals always cover everything.

Debug info is found as gdb finds it: by build-id (ROOT/.build-id/xx/rest.debug) under
$WITCH_DEBUG_DIRS (colon-separated) and /usr/lib/debug, then by the binary's .gnu_debuglink
(beside it, in .debug/ beside it, under ROOT/<its directory>), then in the binary itself;
where none has DWARF and $DEBUGINFOD_URLS is set (space-separated), from those debuginfod
servers by build-id, into elfutils' cache ($DEBUGINFOD_CACHE_PATH, else
~/.cache/debuginfod_client; misses kept 10 minutes), each server given $DEBUGINFOD_TIMEOUT
seconds (90) and at most $DEBUGINFOD_MAXSIZE bytes; a note says what came from it or failed.
Without any, frames read `module+0xoffset`.")]
    Report(ReportArgs),

    /// Compare two profiles of the same program, pair by pair (matched by source location)
    #[command(after_help = "\
Examples:
  witch diff before.witch after.witch
  witch diff --json before.witch after.witch

Pairs are matched by their symbolized source locations, not raw addresses, so profiles of
different builds or address layouts compare.")]
    Diff(DiffArgs),

    /// CI gate: fail when the waste fraction is too high or grew too much
    #[command(after_help = "\
Examples:
  witch gate --max-waste 20% app.witch
  witch gate --baseline main.witch --max-increase 2pp app.witch
  witch gate --max-waste 20% --junit witch.xml app.witch

Bounds: --max-waste takes percent (\"20%\" or \"20\" both mean 20 percent; a bare number below 1,
such as \"0.2\", is refused as ambiguous: write 20% or 0.2%); --max-increase takes percentage
points of waste fraction (\"2pp\" or \"2\"). At least one bound is required.
Exit status: 0 pass, 1 fail, 2 usage or input error.")]
    Gate(GateArgs),

    /// Check what this machine offers: PMU events, debug registers, kernel features, limits
    #[command(after_help = "\
Examples:
  witch doctor
  witch doctor --json

Each line ends in ok, degraded or missing, with what to do about it.")]
    Doctor(DoctorArgs),

    /// Talk to the witchd daemon: status, list, fetch, profile
    Daemon(crate::cmd::daemon::DaemonArgs),

    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) for witch or witchd
    #[command(after_help = "\
Examples:
  witch completions bash > ~/.local/share/bash-completion/completions/witch
  witch completions zsh witchd > ~/.zfunc/_witchd")]
    Completions(crate::cmd::generate::CompletionsArgs),

    /// Write the manual pages of witch, its subcommands and witchd into a directory
    #[command(after_help = "\
Examples:
  witch man /tmp/man && man /tmp/man/witch-dead.1")]
    Man(crate::cmd::generate::ManArgs),
}

/// Options shared by the three crafts' run commands (consumed by `cmd/run.rs`).
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Sampling event name, or "list" to show what this machine offers and why
    #[arg(short = 'e', long, value_name = "EVENT")]
    pub event: Option<String>,

    /// Sampling period: a count in the event's units (stores, loads, or ns of thread CPU time),
    /// or a duration of thread CPU time ("1ms", "250us"), which asks for a time-based sampler;
    /// software periods below 100us are raised to 100us (shorter ones overflowed the signal queue),
    /// PMU periods below 100003 events to 100003 (shorter ones let the engine sample its own accesses)
    /// [default: engine's]
    #[arg(short = 'p', long, value_name = "PERIOD", value_parser = parse_period)]
    pub period: Option<Period>,

    /// Sampling frequency: samples per second of each thread's CPU time (a time-based sampler)
    #[arg(short = 'F', long, value_name = "HZ", value_parser = parse_frequency, conflicts_with = "period")]
    pub frequency: Option<Period>,

    /// Overhead budget of a software sampler's single-step bursts: the engine's share of the
    /// program's CPU time, in percent (0 = no limit) [default: 3]
    #[arg(long, value_name = "PCT", value_parser = parse_overhead)]
    pub overhead: Option<f64>,

    /// Heap blocks (malloc, calloc, realloc, aligned allocations, anonymous mmap) of at least
    /// this many bytes are tracked as data objects, named by their allocation site ("64k", "1M";
    /// 0 or "off": none) [default: 64k]
    #[arg(long, value_name = "BYTES", value_parser = parse_heap_threshold)]
    pub heap_threshold: Option<u64>,

    /// Debug registers to use for watchpoints (1-4) [default: all free]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4))]
    pub debug_registers: Option<u32>,

    /// Which armed watchpoint a new sample replaces when all are busy
    #[arg(long, value_enum, default_value_t = Policy::Reservoir, value_name = "POLICY")]
    pub replacement: Policy,

    /// Relative precision within which floating-point values count as equal (0 = exact)
    #[arg(long, value_name = "REL", default_value_t = 0.01, value_parser = parse_precision)]
    pub fp_precision: f64,

    /// Lines in the report's summary (0 = all) [default: 10 in text; JSON keeps all]
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,

    /// Pairs the text report shows in full, the heaviest of each summary line (0 = every pair)
    #[arg(long, value_name = "N", default_value_t = crate::render::text::PAIRS_SHOWN)]
    pub pairs: usize,

    /// Also show the data objects with the most waste (static arrays, heap blocks by allocation
    /// site, the stack), and each shown pair's object
    #[arg(long)]
    pub objects: bool,

    /// Print the report as JSON, alone on stdout (the program's own stdout then goes to stderr),
    /// instead of text on stderr
    #[arg(long)]
    pub json: bool,

    /// The old spelling of --json (`--format json`), kept working
    #[arg(long, value_enum, hide = true)]
    pub format: Option<Format>,

    /// Where to write the profile [default: a name made of craft, program and pid]
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Also write the report, as JSON, to FILE (the program's output is left alone)
    #[arg(long, value_name = "FILE")]
    pub json_out: Option<PathBuf>,

    /// Profile only the program's first process (and what it execs), not the processes it starts
    #[arg(long, conflicts_with = "pid")]
    pub no_children: bool,

    /// Profile only processes running this executable (its file name; repeatable)
    #[arg(long, value_name = "NAME", conflicts_with = "pid")]
    pub exe: Vec<String>,

    /// Don't print the report (the profile is still written)
    #[arg(short = 'q', long)]
    pub quiet: bool,

    /// Reference mode: judge every access exactly. `cache` (the default)
    /// runs the program from witch's code cache, recording every access
    /// (tens to a couple of hundred times slower); `step` single-steps it
    /// under ptrace (thousands of times slower; the cross-check)
    #[arg(long, value_name = "HOW", num_args = 0..=1, default_missing_value = "cache", require_equals = true, conflicts_with = "pid")]
    pub exact: Option<ExactMode>,

    /// Attach to this running process instead of starting a program
    #[arg(long, value_name = "PID", conflicts_with = "command")]
    pub pid: Option<i32>,

    /// With --pid: how long to profile before detaching ("30s", "2m", "500ms") [default: until Ctrl-C]
    #[arg(long, value_name = "TIME", requires = "pid", value_parser = parse_duration)]
    pub duration: Option<std::time::Duration>,

    /// The program to run and its arguments
    // Not `required` in clap so that `-e list` needs no program; main.rs checks it.
    // Everything after the program is its own (trailing_var_arg); before it, an
    // unknown option is an error, not a program's name (a program whose name
    // starts with '-' comes after `--`).
    #[arg(value_name = "PROGRAM", trailing_var_arg = true, num_args = 1..)]
    pub command: Vec<OsString>,
}

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// The profile file written by a run (or the directory of parts an interrupted run left)
    #[arg(value_name = "PROFILE")]
    pub file: PathBuf,

    /// Also write the profile, as one file, to FILE (gathers a directory of parts)
    #[arg(long, value_name = "FILE")]
    pub save: Option<PathBuf>,

    /// Print the report as one JSON object instead of text
    #[arg(long)]
    pub json: bool,

    /// `--format json`, the runs' old spelling of --json, kept working
    #[arg(long, value_enum, hide = true)]
    pub format: Option<Format>,

    /// Also write a gzipped pprof profile (sample types waste and use, in the profile's unit)
    #[arg(long, value_name = "OUT.pb.gz")]
    pub pprof: Option<PathBuf>,

    /// Which side of a pair is the leaf of its pprof stack: trap (the killer) or watch (the dead access)
    #[arg(long, value_enum, default_value_t = crate::render::pprof::Leaf::Trap, value_name = "SIDE")]
    pub pprof_leaf: crate::render::pprof::Leaf,

    /// Print folded stacks (root first, value = estimated waste bytes) instead of the report
    #[arg(long, conflicts_with = "json")]
    pub folded: bool,

    /// Also write a flame graph of waste as SVG
    #[arg(long, value_name = "OUT.svg")]
    pub flamegraph: Option<PathBuf>,

    /// Which stacks --folded and --flamegraph show: the wasted accesses, their killers (or repeaters), or both as pairs
    #[arg(long, value_enum, default_value_t = crate::render::flame::View::Waste, value_name = "VIEW")]
    pub view: crate::render::flame::View,

    /// Lines in the summary (0 = all) [default: 10 in text; JSON keeps all]
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,

    /// Pairs the text report shows in full, the heaviest of each summary line (0 = every pair)
    #[arg(long, value_name = "N", default_value_t = crate::render::text::PAIRS_SHOWN)]
    pub pairs: usize,

    /// Also show the data objects with the most waste (static arrays, heap blocks by allocation
    /// site, the stack), and each shown pair's object
    #[arg(long)]
    pub objects: bool,
}

#[derive(Args, Debug)]
pub struct DiffArgs {
    /// The reference profile
    #[arg(value_name = "BASE")]
    pub base: PathBuf,
    /// The profile to compare with it
    #[arg(value_name = "NEW")]
    pub new: PathBuf,
    /// Print one JSON object instead of text
    #[arg(long)]
    pub json: bool,
    /// `--format json`, the runs' old spelling of --json, kept working
    #[arg(long, value_enum, hide = true)]
    pub format: Option<Format>,
    /// Number of changed pairs to show (0 = all)
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("bound").required(true).multiple(true).args(["max_waste", "max_increase", "max_object_waste"])))]
pub struct GateArgs {
    /// The profile to check
    #[arg(value_name = "PROFILE")]
    pub profile: PathBuf,

    /// Fail when the waste fraction is above this many percent ("20%" or "20"; "0.2" is refused
    /// as ambiguous)
    #[arg(long, value_name = "PERCENT", value_parser = parse_percent)]
    pub max_waste: Option<f64>,

    /// Profile to compare with (needs --max-increase)
    #[arg(long, value_name = "BASE", requires = "max_increase")]
    pub baseline: Option<PathBuf>,

    /// Fail when the waste fraction grew by more than this many percentage points over
    /// --baseline ("2pp" or "2")
    #[arg(long, value_name = "POINTS", value_parser = parse_points, requires = "baseline")]
    pub max_increase: Option<f64>,

    /// Fail when the stored (or loaded) bytes of a data object are more than PERCENT wasted:
    /// NAME is a static object's symbol (`table`), a heap object's allocation site
    /// (`app.c:38`), `stack`, or an object's name or key as the report prints it (repeatable)
    #[arg(long, value_name = "NAME=PERCENT", value_parser = parse_object_bound)]
    pub max_object_waste: Vec<(String, f64)>,

    /// Write a JUnit XML report (one test case per bound) for CI systems
    #[arg(long, value_name = "OUT.xml")]
    pub junit: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Print the checks as JSON
    #[arg(long)]
    pub json: bool,
    /// `--format json`, the runs' old spelling of --json, kept working
    #[arg(long, value_enum, hide = true)]
    pub format: Option<Format>,
}

/// `--json` is the one spelling of JSON output in every command; `--format
/// json` (the runs' first spelling) still works, hidden. `--json` wins.
fn format_of(json: bool, format: Option<Format>) -> Format {
    if json {
        Format::Json
    } else {
        format.unwrap_or(Format::Text)
    }
}

impl ReportArgs {
    pub fn format(&self) -> Format {
        format_of(self.json, self.format)
    }
}

impl DiffArgs {
    pub fn format(&self) -> Format {
        format_of(self.json, self.format)
    }
}

impl DoctorArgs {
    pub fn format(&self) -> Format {
        format_of(self.json, self.format)
    }
}

fn parse_precision(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a number"))?;
    if !(0.0..1.0).contains(&v) {
        return Err("must be at least 0 and below 1 (0.01 means 1%)".into());
    }
    Ok(v)
}

/// Percent of waste: "20%" and "20" both mean 20 percent. A bare number
/// between 0 and 1 ("0.2") is refused: the JSON's fractions run from 0 to 1,
/// so it may mean 20% as well as 0.2%, and either reading taken silently
/// would make a gate 100 times too strict or too lax. The hint gives both.
pub fn parse_percent(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let sign = t.ends_with('%');
    let t = t.strip_suffix('%').unwrap_or(t).trim();
    let v: f64 = t.parse().map_err(|_| format!("`{s}` is not a percentage (e.g. 20%)"))?;
    if !(0.0..=100.0).contains(&v) {
        return Err(format!("`{s}` is not between 0% and 100%"));
    }
    if !sign && v > 0.0 && v < 1.0 {
        return Err(format!("`{s}` is ambiguous: write {}% for a waste fraction of {t}, or {t}% for {t} percent", (v * 1e8).round() / 1e6));
    }
    Ok(v)
}

/// `--max-object-waste NAME=PERCENT`.
pub fn parse_object_bound(s: &str) -> Result<(String, f64), String> {
    let (name, pct) = s.rsplit_once('=').ok_or_else(|| format!("`{s}`: give NAME=PERCENT, such as table=20%"))?;
    if name.trim().is_empty() {
        return Err(format!("`{s}`: the object's name is empty"));
    }
    Ok((name.trim().to_string(), parse_percent(pct)?))
}

/// Percentage points: "2pp" or "2". "2%" is refused: it could mean a relative increase.
pub fn parse_points(s: &str) -> Result<f64, String> {
    let t = s.trim();
    if t.ends_with('%') {
        return Err(format!("`{s}`: give the increase in percentage points of waste, e.g. 2pp, not a relative percent"));
    }
    let t = t.strip_suffix("pp").unwrap_or(t).trim();
    let v: f64 = t.parse().map_err(|_| format!("`{s}` is not a number of percentage points (e.g. 2pp)"))?;
    if !(0.0..=100.0).contains(&v) {
        return Err(format!("`{s}` is not between 0 and 100 points"));
    }
    Ok(v)
}

/// `--overhead`: a percentage from 0 to 100 ("3", "3%", "0.5").
pub fn parse_overhead(s: &str) -> Result<f64, String> {
    witchcraft::config::parse_percent(s).ok_or_else(|| format!("{s:?}: give a percentage from 0 to 100, such as 3 or 0.5%"))
}

/// `--heap-threshold`: a size in bytes ("4096", "64k", "1M"), or "off".
pub fn parse_heap_threshold(s: &str) -> Result<u64, String> {
    witchcraft::config::parse_bytes(s).ok_or_else(|| format!("{s:?}: give a size in bytes, such as 4096, 64k or 1M, or off"))
}

/// A sampling period as given: a count in the event's units, or a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    Count(u64),
    Time(std::time::Duration),
}

impl RunArgs {
    /// The report's format: `--json` (or the old `--format json`), else text.
    pub fn format(&self) -> Format {
        format_of(self.json, self.format)
    }

    /// The period (`-p` or `-F`) as the engine takes it (a count; ns for time)
    /// and whether it was given as a time.
    pub fn period(&self) -> (Option<u64>, bool) {
        match self.period.or(self.frequency) {
            None => (None, false),
            Some(Period::Count(n)) => (Some(n), false),
            Some(Period::Time(d)) => (Some(d.as_nanos().clamp(1, u64::MAX as u128) as u64), true),
        }
    }
}

/// `-p`: a positive count ("5000003"), or a duration ("1ms", "250us", "0.5ms").
pub fn parse_period(s: &str) -> Result<Period, String> {
    let t = s.trim();
    if t.bytes().all(|b| b.is_ascii_digit()) {
        return match t.parse::<u64>() {
            Ok(n) if n > 0 => Ok(Period::Count(n)),
            _ => Err(format!("{s:?}: the period must be at least 1")),
        };
    }
    match humantime::parse_duration(t) {
        Ok(d) if !d.is_zero() => Ok(Period::Time(d)),
        _ => Err(format!("{s:?} is neither a count nor a duration (try 5000003, 1ms, 250us)")),
    }
}

/// `-F`: samples per second of CPU time, as the period it makes.
pub fn parse_frequency(s: &str) -> Result<Period, String> {
    let hz: f64 = s.trim().trim_end_matches("Hz").trim().parse().map_err(|_| format!("{s:?} is not a frequency (try 200)"))?;
    if !(hz.is_finite() && hz > 0.0 && hz <= 1e9) {
        return Err(format!("{s:?}: give a frequency above 0 and at most 1e9 per second"));
    }
    Ok(Period::Time(std::time::Duration::from_secs_f64(1.0 / hz)))
}

/// A duration, for the command line and witchd's configuration alike:
/// humantime's forms ("30s", "1m30s", "1h 30m", "500ms", "0.5s", "7d"), or a
/// plain number of seconds ("30", "1.5"). Zero is refused.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let d = humantime::parse_duration(t)
        .ok()
        .or_else(|| t.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0 && *v < 1e12).map(std::time::Duration::from_secs_f64));
    match d {
        Some(d) if !d.is_zero() => Ok(d),
        _ => Err(format!("{s:?} is not a duration (try \"30s\", \"1m30s\", \"500ms\", \"7d\")")),
    }
}

#[cfg(test)]
mod tests;
