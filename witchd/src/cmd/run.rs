//! `witch dead|silent-store|silent-load PROGRAM`: run a program under the
//! preload agent, pass its stdio, signals and exit status through, then
//! gather the profiles its processes left into one and report it.

use super::launch;
use super::output::{self, Output};
use crate::cli::{ExactMode, RunArgs};
use crate::exit;
use crate::render::Format;
use anyhow::{anyhow, bail, Result};
use std::ffi::OsString;
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use witchcraft::config::Config;
use witchcraft::profile::Craft;
use witchcraft::sys::pmu;
use witchcraft::sys::procfs::{Of, ProcStatus};

/// PATH lookup the way a shell does it, with clear errors.
fn resolve(program: &OsString) -> Result<PathBuf> {
    let p = PathBuf::from(program);
    let candidates: Vec<PathBuf> = if p.components().count() > 1 || p.is_absolute() {
        vec![p.clone()]
    } else {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut v: Vec<PathBuf> = std::env::split_paths(&path).map(|d| d.join(&p)).collect();
        v.push(p.clone());
        v
    };
    for c in &candidates {
        if let Ok(m) = std::fs::metadata(c) {
            if m.is_file() && m.permissions().mode() & 0o111 != 0 {
                return Ok(c.clone());
            }
            if m.is_dir() {
                // A shell passes over a directory in PATH; named as the program, it is the error.
                if candidates.len() == 1 {
                    return Err(exit::cannot_run(format!("{} is a directory, not a program", c.display())));
                }
                continue;
            }
            if m.is_file() && c == candidates.last().unwrap_or(c) || candidates.len() == 1 {
                return Err(exit::cannot_run(format!("{} is not executable", c.display())));
            }
        }
    }
    if candidates.len() == 1 {
        return Err(exit::not_found(format!("{}: no such program", p.display())));
    }
    Err(exit::not_found(format!("{}: program not found in PATH", p.display())))
}

/// A preload needs a dynamically linked program; say so for static ones.
fn check_dynamic(prog: &Path) -> Result<()> {
    use witchcraft::loadable::Image;
    // The headers are at the start: reading a large program whole (with
    // its debug info) costs a visible share of a short run.
    let image = match Image::of_file(prog) {
        Ok(Image::Truncated) => std::fs::read(prog).map(|whole| Image::of_head(&whole)),
        other => other,
    };
    match image.map_err(|e| exit::cannot_run(format!("cannot read {}: {e}", prog.display())))? {
        // A script: its interpreter is what runs, and is usually dynamic.
        Image::Dynamic | Image::Script => Ok(()),
        Image::Static => Err(exit::cannot_run(format!(
            "{} is statically linked, so the agent can't be preloaded into it; profile it with --exact=step, or link it dynamically",
            prog.display()
        ))),
        Image::OtherMachine => Err(exit::cannot_run(format!("{} is not an x86-64 program", prog.display()))),
        Image::NotElf64 => {
            Err(exit::cannot_run(format!("{} is not a 64-bit x86-64 program; witch profiles x86-64 programs only", prog.display())))
        }
        Image::NotElf | Image::Truncated => Err(exit::cannot_run(format!("{} is not an ELF program", prog.display()))),
    }
}

fn list_events(craft: Craft) {
    println!("Sampling events for `witch {}` on this machine:", craft.name());
    println!("  cpu-timer    software  ok     POSIX timer on thread CPU time, at scheduler ticks; the instruction at each sample is decoded (period in ns)");
    println!("  user-timer   software  ok     like cpu-timer, on the thread's user-mode CPU time only (ticks never land in system calls)");
    println!("  task-clock   software  ok     perf's thread CPU time: any period, but an extra timer interrupt per sample");
    println!("  cpu-clock    software  ok     like task-clock, from the CPU clock");
    let counter = if craft == Craft::SilentLoad { "sw-loads " } else { "sw-stores" };
    println!(
        "  {counter}    software  ok     every Nth {} on average, counted in the code cache for the whole run: no time bias, no skid; the program runs 1.5 to 25 times slower (a trap at each system call and allocation) (period in {}; default {})",
        if craft == Craft::SilentLoad { "load" } else { "store" },
        if craft == Craft::SilentLoad { "loads" } else { "stores" },
        witchcraft::config::DEFAULT_COUNT_PERIOD
    );
    for (name, r) in witchcraft::probe::pmu_events() {
        match r {
            Ok(e) => println!(
                "  {:<12} pmu       ok     {} (period in {})",
                e.name,
                name,
                if e.kind == pmu::AccessKind::Load { "loads" } else { "stores" }
            ),
            Err(why) => println!("  {name:<12} pmu       missing  {why}"),
        }
    }
    println!("Without -e, witch uses the PMU event where it works; otherwise cpu-timer for periods of 4 ms or more, task-clock below.");
}

/// `witch CRAFT ...`: list events, attach (--pid), run exactly (--exact), or run under the agent.
pub fn run(craft: Craft, a: &RunArgs) -> Result<i32> {
    if a.event.as_deref() == Some("list") {
        list_events(craft);
        return Ok(0);
    }
    if let Some(pid) = a.pid {
        return super::attach::run(craft, a, pid);
    }
    if a.duration.is_some() {
        bail!("--duration needs --pid: a program run under witch is profiled until it ends");
    }
    let Some(program) = a.command.first() else {
        bail!("no program given; for example: witch {} ./app", craft.name());
    };
    check_descriptors()?;
    let prog = resolve(program)?;
    let out = Output::check(a.output.as_deref())?;
    if let Some(j) = &a.json_out {
        Output::check(Some(j))?.probe()?;
    }
    // A set-user-ID program run as someone else: the loader would ignore the
    // agent, and under --exact's ptrace the kernel would run it without the
    // bit, so neither profiles the program as it runs. Said before it runs.
    if let Some(why) = secure_execution(&prog) {
        return Err(exit::cannot_run(why));
    }
    let mut recording = None;
    match a.exact {
        Some(ExactMode::Step) => return super::exact::run(craft, a, &prog, program, &out),
        Some(ExactMode::Cache) if check_dynamic(&prog).is_err() => {
            crate::say!("witch: {} is statically linked, so the agent can't be preloaded into it; running --exact=step", prog.display());
            return super::exact::run(craft, a, &prog, program, &out);
        }
        Some(ExactMode::Cache) => {}
        None => {}
    }
    check_dynamic(&prog)?;
    if let Some(mode @ 1..) = ProcStatus::read(Of::ThisThread).ok().and_then(|s| s.seccomp) {
        return Err(exit::cannot_run(format!(
            "witch itself runs under a seccomp filter (Seccomp: {mode}, a container's or a sandbox's), which the program would inherit; a filter may kill the program for a system call the agent makes, so the agent does not profile under one: run witch outside the sandbox (Docker: --security-opt seccomp=unconfined)"
        )));
    }
    let (period, timed) = a.period();
    let (sampler, event) = if a.exact.is_some() {
        // Recording runs from the code cache as whole-run counting does.
        (witchcraft::config::SamplerChoice::Software, Some("sw-stores".to_string()))
    } else {
        crate::agent::sampler_env(craft, a.event.as_deref(), timed)?
    };
    let free = witchcraft::sys::watchpoint::debug_registers();
    if free == 0 {
        bail!("no free debug registers on this thread (is a debugger attached?); witch needs at least one");
    }
    let agent = crate::agent::find_agent()?;

    let mut cmd = Command::new(&prog);
    cmd.args(&a.command[1..]);
    cmd.arg0(program);
    let preload = match std::env::var_os("LD_PRELOAD") {
        Some(old) if !old.is_empty() => {
            let mut s = agent.clone().into_os_string();
            s.push(" ");
            s.push(old);
            s
        }
        _ => agent.clone().into_os_string(),
    };
    if let Some(t) = crate::agent::tunables() {
        cmd.env("GLIBC_TUNABLES", t);
    }
    // The agent's settings, in their one encoding (witchcraft::config),
    // with the testing knobs (WITCH_SEED, ...) from witch's environment,
    // checked here so a bad one stops witch before the program starts.
    let mut settings = Config::new(craft).with_knobs_from_env().map_err(|e| anyhow!(e))?;
    settings.sampler = sampler;
    settings.event = event;
    settings.period = period;
    settings.replacement = a.replacement;
    settings.fp_precision = a.fp_precision;
    settings.overhead_percent = a.overhead.or(settings.overhead_percent);
    settings.heap_threshold = a.heap_threshold;
    settings.debug_registers = a.debug_registers.unwrap_or(free.min(4) as u32) as usize;
    if a.no_children {
        settings.only_pid = Some(0); // the first process the agent loads into
    }
    settings.exe_names = a.exe.clone();
    if a.exact.is_some() {
        let r = super::exact::Recording::start(craft, a.fp_precision)?;
        settings.record_fd = Some(r.program_fd());
        // The program's breakpoint for resuming after native code; no
        // watchpoints.
        settings.debug_registers = 1;
        if !a.quiet {
            crate::say!("witch: exact mode from the code cache; expect the program to run tens to a couple of hundred times slower");
        }
        recording = Some(r);
    }
    let mut inherited = launch::inherited();
    if a.format() == Format::Json && !a.quiet {
        // The JSON report has stdout to itself; the program's stdout goes to stderr.
        match std::io::stderr().as_fd().try_clone_to_owned() {
            Ok(fd) => {
                cmd.stdout(fd);
                inherited.closed_std_fds &= !(1 << 1);
            }
            Err(e) => bail!("cannot give the program stderr as its stdout: {e}"),
        }
    }
    // The run's directory of parts, made once nothing before the program's
    // start can fail but the start itself (which removes it): a bad knob
    // or `WITCH_JUDGES` left an empty one behind in the working directory.
    let parts = out.parts()?;
    settings.out_dir = parts.dir.clone();
    settings.round_trips = Some(parts.dir.join(ROUND_TRIPS));
    cmd.env("LD_PRELOAD", preload).envs(settings.to_pairs());
    launch::start_as_found(&mut cmd, inherited);

    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            parts.remove();
            return Err(exit::cannot_run(format!("cannot run {}: {e}", prog.display())));
        }
    };
    let pid = child.id();
    if let Some(r) = &mut recording {
        r.spawned();
    }
    launch::forward_signals(pid);
    let progress = (!a.quiet && a.format() == Format::Text).then(|| launch::Progress::start(&parts.dir)).flatten();
    let ended = launch::wait(pid)?;
    drop(progress);
    let parts = parts.close();

    let path = out.path(craft, &prog, pid);
    let mut merged = output::merge(parts.collect(), Some(pid));
    if let Some(r) = recording {
        let judged = r.finish();
        if let Some(run) = &mut merged {
            judged.apply(run);
        }
    }
    match merged {
        None => {
            let why = why_no_profile(&prog, &ended, &parts.dir);
            parts.remove();
            crate::say!("witch: the program left no profile: {why}");
        }
        Some(run) => match out.save(&run, &path) {
            Ok(()) => {
                parts.remove();
                report(&run, a, Some(&path))?;
            }
            Err(e) => {
                crate::say!(
                    "witch: {e:#}; the profiles are kept in {}/ (`witch report {}` reads them)",
                    parts.dir.display(),
                    parts.dir.display()
                );
                if !a.quiet {
                    report(&run, a, None).ok();
                }
            }
        },
    }
    Ok(launch::pass_through(ended.code, ended.signal))
}

/// The file in the run's directory of parts where its first process leaves
/// the kernel's round trips it measured, for the others (the parts read
/// are `*.json`; the directory goes when the run ends).
const ROUND_TRIPS: &str = ".round-trips";

/// Descriptors witch and the agent need besides the program's three
/// standard ones: witch holds the output's directory and opens the program
/// and a file in that directory before the run (so with a limit of 5 it
/// could not start); the agent takes its own above the program's.
const DESCRIPTORS_NEEDED: u64 = 6;

/// Refuses a descriptor limit too low for witch to run the program, with
/// that reason (it read as "Too many open files" from wherever it struck).
fn check_descriptors() -> Result<()> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the struct given.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    if r.rlim_cur < DESCRIPTORS_NEEDED {
        bail!(
            "the descriptor limit is {} (ulimit -n), too low for witch and its agent, which need {DESCRIPTORS_NEEDED}; raise it",
            r.rlim_cur
        );
    }
    Ok(())
}

/// Does the dynamic loader ignore LD_PRELOAD for `prog` when witch runs
/// it (secure-execution mode: set-user-ID or set-group-ID to someone else,
/// or file capabilities)? The reason, if so.
fn secure_execution(prog: &Path) -> Option<String> {
    let what = witchcraft::loadable::secure_execution(prog)?;
    Some(format!(
        "{} is {what}, so the dynamic loader would ignore witch's agent in it (secure-execution mode ignores LD_PRELOAD), and --exact's tracing would run it without its privileges; run witch as the user it runs as, or profile a copy without the bit",
        prog.display()
    ))
}

/// Why a run left no profile, as far as witch can tell: the loader ignored
/// the agent, a signal ended the program before the agent could write, the
/// program ended without exit handlers, or the agent never started.
fn why_no_profile(prog: &Path, ended: &launch::ProgramExit, parts: &Path) -> String {
    if let Some(why) = secure_execution(prog) {
        return why;
    }
    // Each agent makes its file when its process starts and fills it at the end.
    let started = std::fs::read_dir(parts).into_iter().flatten().flatten().any(|e| e.path().extension().is_some_and(|x| x == "json"));
    let name = |sig: i32| nix::sys::signal::Signal::try_from(sig).map_or_else(|_| format!("signal {sig}"), |s| s.as_str().to_string());
    match (ended.signal, started) {
        (Some(libc::SIGKILL), _) => "it was killed by SIGKILL".into(),
        (Some(sig), true) => format!(
            "it was killed by {} before its agent could write the profile (the agent writes it first at an exit and at SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGABRT, SIGSEGV, SIGBUS and SIGFPE, not at other signals that end a process)",
            name(sig)
        ),
        (Some(sig), false) => format!("it was killed by {}, and its agent had not started", name(sig)),
        (None, _) if crate::inject::target::is_go_program(prog) => format!(
            "{} is a Go program, and Go ends a process with its own exit system call, never through the C library's exit, where the agent writes the profile (attach to it while it runs with --pid: that session's profile comes at detach)",
            prog.display()
        ),
        (None, true) => {
            "its agent started but never wrote the profile: the program ended by a raw exit system call, which runs no exit handlers".into()
        }
        (None, false) => "its agent never started in it (the agent's own message, if any, is above; or the program cleared LD_PRELOAD and executed itself again)".into(),
    }
}

/// The report of a finished run: text on stderr, JSON alone on stdout or in
/// --json-out; `saved`: where the profile was written (None: it was not).
fn report(run: &witchcraft::profile::Profile, a: &RunArgs, saved: Option<&Path>) -> Result<()> {
    if let Some(j) = &a.json_out {
        let json = super::report::render(run, a.top, a.pairs, a.objects, Format::Json, saved)?;
        crate::write::bytes(j, json.as_bytes())?;
    }
    if a.quiet {
        return Ok(());
    }
    match a.format() {
        Format::Text => {
            crate::say_raw!("{}", super::report::render(run, a.top, a.pairs, a.objects, Format::Text, None)?);
            if let Some(path) = saved {
                let n = run.processes.len() + 1;
                let what = if n > 1 { format!("profile of {n} processes") } else { "profile".into() };
                crate::say!("witch: {what} written to {}", path.display());
            }
        }
        Format::Json => crate::print(&super::report::render(run, a.top, a.pairs, a.objects, Format::Json, saved)?)?,
    }
    Ok(())
}
