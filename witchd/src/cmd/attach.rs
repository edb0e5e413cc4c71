//! `witch CRAFT --pid PID`: attach to a running process, profile it for
//! `--duration` or until Ctrl-C, detach, and report. The process goes on unchanged.

use super::output::{self, Output};
use crate::cli::RunArgs;
use anyhow::{bail, Result};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use witchcraft::profile::Craft;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn interrupted(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

pub fn run(craft: Craft, a: &RunArgs, pid: i32) -> Result<i32> {
    let opts = crate::inject::Options {
        craft,
        period: a.period().0,
        period_is_time: a.period().1,
        event: a.event.clone(),
        debug_registers: a.debug_registers,
        replacement: a.replacement,
        fp_precision: a.fp_precision,
        overhead_percent: a.overhead,
    };
    let out = Output::check(a.output.as_deref())?;
    out.probe()?;
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        unsafe { libc::signal(sig, interrupted as *const () as libc::sighandler_t) };
    }
    let session = crate::inject::attach(pid, &opts)?;
    let pid = session.pid;
    let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|s| s.trim().to_string()).unwrap_or_else(|_| "process".into());
    if !a.quiet {
        match a.duration {
            Some(d) => crate::say!("witch: attached to pid {pid} ({name}); profiling for {d:.1?}"),
            None => crate::say!("witch: attached to pid {pid} ({name}); profiling until Ctrl-C"),
        }
    }
    let start = std::time::Instant::now();
    while !INTERRUPTED.load(Ordering::Relaxed) && a.duration.is_none_or(|d| start.elapsed() < d) && session.target_alive() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let ended = session.detach(std::time::Duration::from_secs(30))?;
    if ended.target_exited && !a.quiet {
        crate::say!("witch: pid {pid} exited during the session");
    }
    let Some(profile) = ended.profile else {
        bail!("pid {pid} left no profile (it was killed, or exec'd a new program, during the session)");
    };
    let out = out.path(craft, Path::new(&name), pid as u32);
    output::save(&profile, &out)?;
    if !a.quiet {
        // The target's output isn't ours here, so the report goes to stdout.
        crate::print(&super::report::render(&profile, a.top, a.pairs, a.format)?)?;
        crate::say!("witch: detached; profile written to {}", out.display());
    }
    Ok(0)
}
