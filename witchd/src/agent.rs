//! The agent library and what it is told: where `witch` finds it, which
//! sampler `-e` asks it for, and the C library tunables a profiled program
//! runs with. Shared by running a program and attaching to one.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use witchcraft::config::SamplerChoice;
use witchcraft::profile::Craft;
use witchcraft::sys::pmu;

/// The agent library, built beside the `witch` binary.
pub const AGENT: &str = "libwitch_agent.so";

/// `$WITCH_AGENT`, else beside `witch` (a build tree), else in `../lib/witch/`
/// (an installed prefix: `PREFIX/bin/witch` and `PREFIX/lib/witch/`, as
/// `install.sh` lays it out), else in `../lib/`.
pub fn find_agent() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("WITCH_AGENT") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!("WITCH_AGENT={} does not exist", p.display());
    }
    let exe = std::env::current_exe().context("cannot locate the witch binary")?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    for cand in [dir.join(AGENT), dir.join("../lib/witch").join(AGENT), dir.join("../lib").join(AGENT)] {
        if cand.is_file() {
            return Ok(cand.canonicalize().unwrap_or(cand));
        }
    }
    let prefix = dir.parent().unwrap_or(Path::new("/"));
    bail!(
        "cannot find the agent library {AGENT}: looked in {}/ (beside witch) and {}/ (an installed prefix keeps `witch` in PREFIX/bin/ and the agent in PREFIX/lib/witch/: run `./install.sh --prefix PREFIX` from the source tree, or `cargo build --release --workspace` to build it beside witch, or set WITCH_AGENT to its path)",
        dir.display(),
        prefix.join("lib/witch").display()
    )
}

/// What `-e` chose: the sampler and its event. A period given as a time
/// (`-p 1ms`, `-F 200`) asks for a time-based sampler: the software one when
/// no event is named, and an error with a PMU event, which counts accesses.
pub fn sampler_env(craft: Craft, event: Option<&str>, timed: bool) -> Result<(SamplerChoice, Option<String>)> {
    let kind = if craft == Craft::SilentLoad { pmu::AccessKind::Load } else { pmu::AccessKind::Store };
    match event {
        None if timed => Ok((SamplerChoice::Software, None)),
        None => Ok((SamplerChoice::Auto, None)),
        Some(e @ ("task-clock" | "cpu-clock" | "cpu-timer" | "user-timer")) => Ok((SamplerChoice::Software, Some(e.to_string()))),
        Some(e) if witchcraft::config::COUNT_EVENTS.contains(&e) => {
            let wanted = if kind == pmu::AccessKind::Load { "sw-loads" } else { "sw-stores" };
            if e != wanted {
                bail!("`witch {}` samples {}s: use -e {wanted}", craft.name(), kind_name(kind));
            }
            if timed {
                bail!("-e {e} counts {}s: give -p a count of them, not a time", kind_name(kind));
            }
            Ok((SamplerChoice::Software, Some(e.to_string())))
        }
        Some(spec) if timed => {
            bail!("event {spec:?} counts {}s: give -p a count of them, not a time (or -e cpu-timer for a time)", kind_name(kind))
        }
        Some(spec) => {
            let ev = pmu::parse_event(Path::new(pmu::SYSFS_PMU_ROOT), spec, kind)
                .map_err(|e| anyhow::anyhow!("unknown or unusable event {spec:?}: {e} (see `witch {} -e list`)", craft.name()))?;
            let mut s = pmu::PmuSampler::open(&ev, 1_000_003)
                .map_err(|e| anyhow::anyhow!("event {spec:?} cannot be opened here: {e} (see `witch {} -e list`)", craft.name()))?;
            s.close();
            Ok((SamplerChoice::Pmu, Some(spec.to_string())))
        }
    }
}

fn kind_name(k: pmu::AccessKind) -> &'static str {
    if k == pmu::AccessKind::Load {
        "load"
    } else {
        "store"
    }
}

/// GLIBC_TUNABLES for a profiled program. Any armed data breakpoint turns
/// off x86 fast-string operation, so `rep stosb`/`rep movsb` run many times
/// slower while a watchpoint is armed (docs/DESIGN.md, "Fast strings").
/// Ask glibc's memset/memcpy to use their vector loops
/// instead; opt out with WITCH_KEEP_REP_STRINGS=1. `--exact` runs the
/// program with them too, so both modes judge the same instructions.
pub fn tunables() -> Option<String> {
    if std::env::var_os("WITCH_KEEP_REP_STRINGS").is_some() {
        return None;
    }
    const T: &str = "glibc.cpu.x86_rep_stosb_threshold=0x7fffffffffffffff:glibc.cpu.x86_rep_movsb_threshold=0x7fffffffffffffff";
    Some(match std::env::var("GLIBC_TUNABLES") {
        Ok(old) if !old.is_empty() => format!("{old}:{T}"),
        _ => T.to_string(),
    })
}
