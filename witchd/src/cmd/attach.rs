//! `witch CRAFT --pid PID`: attach to a running process, profile it for
//! `--duration` or until Ctrl-C, detach, and report. The process goes on unchanged.
//!
//! A process that replaces its program (exec) during the session takes the
//! agent and what it gathered with the old image: witch sees that within a
//! poll, says so in one line and exits with [`exit::TARGET_EXEC`]; the
//! process runs on as its new program. Unless the agent saw the exec coming
//! (the process called one of the exec functions it takes): it ended the
//! session first and sent its profile (`ended_by: "exec"`), which witch
//! writes, naming the call in one line, and exits 0, whether its poll then
//! sees the agent's end or the new image first.
//!
//! The agent may end the session by itself (a debugger attached to the
//! process): it undoes everything, sends its profile and says so. witch
//! sees that within a poll, writes that profile at once, says why in one
//! line and exits 0, as after a full session.

use super::output::{self, Output};
use crate::cli::RunArgs;
use crate::exit;
use crate::inject::{self, End, Exec, Why};
use anyhow::{bail, Result};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use witchcraft::profile::{Craft, EndedBy};

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
        heap_threshold: a.heap_threshold,
    };
    let out = Output::check(a.output.as_deref())?;
    out.probe()?;
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: `interrupted` only stores to an atomic: async-signal-safe.
        unsafe { libc::signal(sig, interrupted as *const () as libc::sighandler_t) };
    }
    let session = inject::attach(pid, &opts).map_err(|e| match e.downcast::<Exec>() {
        Ok(x) => exit::ExitError { code: exit::TARGET_EXEC, msg: x.0 }.into(),
        Err(e) => e,
    })?;
    let pid = session.pid;
    let comm = || std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|s| s.trim().to_string()).ok();
    let name = comm().unwrap_or_else(|| "process".into());
    if !a.quiet {
        match a.duration {
            Some(d) => crate::say!("witch: attached to pid {pid} ({name}); profiling for {d:.1?}"),
            None => crate::say!("witch: attached to pid {pid} ({name}); profiling until Ctrl-C"),
        }
    }
    let start = std::time::Instant::now();
    let mut poll = inject::Poll::default();
    let why = loop {
        if INTERRUPTED.load(Ordering::Relaxed) || a.duration.is_some_and(|d| start.elapsed() >= d) {
            break None;
        }
        if let Some(why) = poll.why(&session) {
            break Some(why);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let agent_ended = why == Some(Why::AgentEnded);
    let took = start.elapsed();
    // How it ended, by the rule witchd follows too (inject::end).
    let now = || comm().filter(|c| *c != name).map_or(String::new(), |c| format!(", now {c}"));
    let (profile, target_exited, exec) = match inject::end(Box::new(session), why, std::time::Duration::from_secs(30)) {
        End::Profiled { profile, target_exited, exec } => (*profile, target_exited, exec),
        End::Replaced => {
            return Err(exit::ExitError {
                code: exit::TARGET_EXEC,
                msg: format!(
                    "pid {pid} ({name}) replaced its program (exec{}) {:.1} s into the session: the agent, and the profile it was gathering, went with the old program; the process runs on",
                    now(),
                    took.as_secs_f64()
                ),
            }
            .into());
        }
        End::Exited => bail!("pid {pid} ({name}) exited during the session before its agent could send the profile (was it killed?)"),
        End::Failed(e) => return Err(e),
    };
    if target_exited && !a.quiet {
        crate::say!("witch: pid {pid} exited during the session");
    }
    // A session the agent ended at an exec it saw coming: as a rule the
    // process has its new image by witch's next poll, which then finds that
    // rather than the agent's end. The line is the same either way, from
    // the profile.
    let exec_seen = profile.ended_by == EndedBy::Exec;
    if exec && !exec_seen && !a.quiet {
        crate::say!(
            "witch: pid {pid} ({name}) replaced its program (exec{}) after its agent had sent the profile: that profile is kept",
            now()
        );
    }
    let out = out.path(craft, Path::new(&name), pid as u32);
    output::save(&profile, &out)?;
    let of = a.duration.map_or(String::new(), |d| format!(" of the {:.1} s asked", d.as_secs_f64()));
    if exec_seen && !target_exited {
        let did = profile
            .exec_call
            .as_deref()
            .map_or_else(|| "replaced its program (exec)".into(), |f| format!("called {f} to replace its program"));
        crate::say!(
            "witch: pid {pid} ({name}) {did} after {:.1} s{of}: its agent ended the session first and sent its profile, which is written; the process runs on",
            profile.duration_ns as f64 / 1e9
        );
    } else if agent_ended && !target_exited {
        crate::say!(
            "witch: the agent in pid {pid} ({name}) ended the session by itself after {:.1} s{of}: {}; its profile is written, and the process runs on",
            took.as_secs_f64(),
            early_end_reason(&profile)
        );
    }
    if !a.quiet {
        // The target's output isn't ours here, so the report goes to stdout.
        crate::print(&super::report::render(&profile, a.top, a.pairs, a.objects, a.format(), Some(out.as_path()))?)?;
        crate::say!("witch: detached; profile written to {}", out.display());
    }
    Ok(0)
}

/// Why the agent ended a session by itself, as its profile says: the note
/// that says so, else its `ended_by`. (An agent of an earlier witch, still
/// loaded in the process, says "detach" for a debugger too.) Not for an
/// exec, which has a line of its own (from the profile's `exec_call`).
fn early_end_reason(p: &witchcraft::profile::Profile) -> String {
    let said = |what: &str| p.notes.iter().rev().find(|n| n.contains(what)).cloned();
    match p.ended_by {
        EndedBy::Traced => {
            said("a debugger (").or_else(|| said("hardware breakpoint")).unwrap_or_else(|| "a debugger attached to the process".into())
        }
        EndedBy::Sandbox => said("put itself in").unwrap_or_else(|| "the process put itself in a seccomp sandbox".into()),
        EndedBy::Detach => said("a debugger (").unwrap_or_else(|| "its profile gives no reason".into()),
        other => format!("its profile says it ended by {other}"),
    }
}
