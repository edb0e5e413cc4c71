//! `witch doctor`: what this machine offers, one line per check, with what to do.

use crate::cli::DoctorArgs;
use std::os::unix::fs::DirBuilderExt;
use std::process::{Command, Stdio};
use witchcraft::config::Config;
use witchcraft::probe::{checks, Check, CheckStatus, CHECK_STEP};
use witchcraft::profile::{Counters, Craft};

/// The doctor's line about the code cache's cost.
pub const CHECK_CACHE: &str = "code cache";

/// Iterations of the shell loop the code cache is measured on: well under
/// a second of CPU time natively (ticks every 5 ms: tens of windows).
const LOOP_ITERATIONS: u32 = 300_000;

/// What the code cache costs here, measured the way a profiled run
/// measures it: a shell loop (the system shell's interpreter: branchy code
/// with calls, returns, indirect jumps and stores) run under the agent with
/// `witch dead`'s defaults, and its profile's window counters.
fn cache_check() -> Check {
    let (status, detail, advice) = match measure_cache() {
        Ok(c) if c.windows > 0 && c.window_instructions > 0 => {
            let n = c.windows as f64;
            let step = witchcraft::probe::single_step_ns()
                .map(|ns| format!("; a single step costs {:.1} µs", ns as f64 / 1e3))
                .unwrap_or_default();
            (
                CheckStatus::Ok,
                format!(
                    "a window of {:.0} instructions took {:.1} µs of CPU time in the cache ({:.1} ns an instruction running copies, the program's own work and the kernel's entries and exits included; {:.1} µs of it translating at links{step}), and {:.1} µs at its {:.1} exits that trapped (each {:.1} µs: {:.1} picks, its end, what the link stub left; {} blocks translated in all, {:.1} a window linked without a trap, {:.1} dispatch-table misses trapped); measured on {} windows of a shell loop under the agent, so first translations weigh more than in a longer run",
                    c.window_instructions as f64 / n,
                    c.cache_ns as f64 / n / 1e3,
                    c.cache_ns.saturating_sub(c.link_ns) as f64 / c.window_instructions as f64,
                    c.link_ns.min(c.cache_ns) as f64 / n / 1e3,
                    c.exit_ns as f64 / n / 1e3,
                    c.cache_exits as f64 / n,
                    c.exit_ns as f64 / c.cache_exits.max(1) as f64 / 1e3,
                    c.window_picks as f64 / n,
                    c.cache_blocks,
                    c.cache_links as f64 / n,
                    c.cache_lookups as f64 / n,
                    c.windows,
                ),
                None,
            )
        }
        Ok(_) if std::env::var_os(witchcraft::config::keys::WINDOW).is_some_and(|v| v == "0") => (
            CheckStatus::Degraded,
            "off: WITCH_WINDOW=0 is set, so bursts single-step every instruction".to_string(),
            Some("unset WITCH_WINDOW for windows in the code cache"),
        ),
        Ok(_) => (
            CheckStatus::Degraded,
            "a shell loop under the agent ran no window in the code cache: bursts single-step every instruction".to_string(),
            Some("bursts are shorter for the same budget; `witch dead` on your program says why in its report"),
        ),
        Err(e) => (CheckStatus::Degraded, format!("not measured: {e}"), None),
    };
    Check { name: CHECK_CACHE.to_string(), status, detail, advice: advice.map(str::to_string) }
}

/// Runs the shell loop under the agent and sums its threads' counters.
fn measure_cache() -> anyhow::Result<Counters> {
    let agent = crate::agent::find_agent()?;
    // A directory of our own for the profile (exclusively; mode 0700).
    let dir = std::env::temp_dir().join(format!("witch-doctor-{}", std::process::id()));
    std::fs::DirBuilder::new().mode(0o700).create(&dir).map_err(|e| anyhow::anyhow!("cannot make {}: {e}", dir.display()))?;
    let mut settings = Config::new(Craft::Dead);
    settings.out_dir = dir.clone();
    let status = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("i=0; while [ $i -lt {LOOP_ITERATIONS} ]; do i=$((i+1)); done"))
        .env("LD_PRELOAD", &agent)
        .envs(settings.to_pairs())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let parts = super::output::read_parts(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let status = status.map_err(|e| anyhow::anyhow!("cannot run /bin/sh: {e}"))?;
    if !status.success() {
        anyhow::bail!("the shell loop under the agent ended with {status}");
    }
    let mut c = Counters::default();
    for p in parts.iter().flat_map(|p| std::iter::once(p).chain(&p.processes)) {
        for t in &p.threads {
            c.add(&t.counters);
        }
    }
    if c.interrupts == 0 {
        anyhow::bail!("the agent took no samples in the shell loop");
    }
    Ok(c)
}

fn word(s: &CheckStatus) -> &'static str {
    match s {
        CheckStatus::Ok => "ok",
        CheckStatus::Degraded => "degraded",
        CheckStatus::Missing => "missing",
    }
}

/// `name .... status  detail (advice)`, names dot-padded to one column.
pub fn render(cs: &[Check]) -> String {
    let width = cs.iter().map(|c| c.name.chars().count()).max().unwrap_or(0) + 4;
    let mut o = String::new();
    for c in cs {
        let dots = ".".repeat(width - c.name.chars().count());
        o += &format!("{} {dots} {:<8}  {}", c.name, word(&c.status), c.detail);
        if let Some(a) = c.advice.as_deref().filter(|a| !a.is_empty()) {
            o += &format!(" ({a})");
        }
        o.push('\n');
    }
    o
}

pub fn run(a: &DoctorArgs) -> anyhow::Result<i32> {
    let mut cs = checks();
    // The code cache's line right after the software sampler's.
    let at = cs.iter().position(|c| c.name == CHECK_STEP).map_or(cs.len(), |i| i + 1);
    cs.insert(at, cache_check());
    let out = if a.format() == crate::render::Format::Json {
        #[derive(serde::Serialize)]
        struct J<'a> {
            name: &'a str,
            status: &'static str,
            detail: &'a str,
            advice: Option<&'a str>,
        }
        let v: Vec<J> =
            cs.iter().map(|c| J { name: &c.name, status: word(&c.status), detail: &c.detail, advice: c.advice.as_deref() }).collect();
        serde_json::to_string_pretty(&v)? + "\n"
    } else {
        render(&cs)
    };
    crate::print(&out)?;
    Ok(0)
}
