//! `witch dead|silent-store|silent-load PROGRAM`: run a program under the
//! preload agent, pass its stdio, signals and exit status through, then
//! collect the profiles it left and print the report.

use crate::cli::RunArgs;
use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};
use witchcraft::config::{Config, SamplerChoice};
use witchcraft::profile::{Craft, Profile};
use witchcraft::sys::pmu;

/// The agent library, built beside the `witch` binary.
pub const AGENT: &str = "libwitch_agent.so";

static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        unsafe { libc::kill(pid, sig) };
    }
}

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
    bail!("cannot find {AGENT} next to {} (build it with `cargo build --workspace`, or set WITCH_AGENT)", exe.display())
}

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
            if m.is_file() && c == candidates.last().unwrap_or(c) || candidates.len() == 1 {
                bail!("{} is not executable", c.display());
            }
        }
    }
    if candidates.len() == 1 {
        bail!("{}: no such program", p.display())
    }
    bail!("{}: program not found in PATH", p.display())
}

const HEAD_BYTES: u64 = 64 << 10;

/// A preload needs a dynamically linked program; say so for static ones.
fn check_dynamic(prog: &Path) -> Result<()> {
    // The headers are at the start: reading a large program whole (SQLite
    // with debug info) cost 0.5% of a one-second run.
    let mut data = Vec::new();
    let read = std::fs::File::open(prog).and_then(|f| {
        use std::io::Read;
        f.take(HEAD_BYTES).read_to_end(&mut data)
    });
    if let Err(e) = read {
        bail!("cannot read {}: {e}", prog.display());
    }
    if data.len() as u64 == HEAD_BYTES
        && object::elf::FileHeader64::<object::Endianness>::parse(&*data).is_ok_and(|elf| {
            let e = elf.endian().unwrap_or(object::Endianness::Little);
            elf.e_phoff(e) + elf.e_phnum(e) as u64 * elf.e_phentsize(e) as u64 > HEAD_BYTES
        })
    {
        data = std::fs::read(prog).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", prog.display()))?;
    }
    if data.starts_with(b"#!") {
        return Ok(()); // a script: its interpreter is what runs, and is usually dynamic
    }
    use object::read::elf::{FileHeader, ProgramHeader};
    let Ok(elf) = object::elf::FileHeader64::<object::Endianness>::parse(&*data) else {
        if data.starts_with(b"\x7fELF") {
            bail!("{} is not a 64-bit x86-64 program; witch profiles x86-64 programs only", prog.display());
        }
        bail!("{} is not an ELF program", prog.display());
    };
    let endian = elf.endian().map_err(|e| anyhow::anyhow!("{e}"))?;
    if elf.e_machine(endian) != object::elf::EM_X86_64 {
        bail!("{} is not an x86-64 program", prog.display());
    }
    let phdrs = elf.program_headers(endian, &*data).map_err(|e| anyhow::anyhow!("{}: {e}", prog.display()))?;
    if !phdrs.iter().any(|p| p.p_type(endian) == object::elf::PT_INTERP) {
        bail!(
            "{} is statically linked, so the agent can't be preloaded into it; profile it with --exact, or link it dynamically",
            prog.display()
        );
    }
    Ok(())
}

/// What `-e` chose: the sampler and its event.
pub(crate) fn sampler_env(craft: Craft, event: Option<&str>) -> Result<(SamplerChoice, Option<String>)> {
    let kind = if craft == Craft::SilentLoad { pmu::AccessKind::Load } else { pmu::AccessKind::Store };
    match event {
        None => Ok((SamplerChoice::Auto, None)),
        Some(e @ ("task-clock" | "cpu-clock" | "cpu-timer")) => Ok((SamplerChoice::Software, Some(e.to_string()))),
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

fn list_events(craft: Craft) {
    println!("Sampling events for `witch {}` on this machine:", craft.name());
    println!("  cpu-timer    software  ok     POSIX timer on thread CPU time, at scheduler ticks; the instruction at each sample is decoded (period in ns)");
    println!("  task-clock   software  ok     perf's thread CPU time: any period, but an extra timer interrupt per sample");
    println!("  cpu-clock    software  ok     like task-clock, from the CPU clock");
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

/// Profiles the agent wrote, by pid and start time.
fn collect(dir: &Path) -> Vec<(PathBuf, Profile)> {
    let mut v: Vec<(PathBuf, Profile)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter_map(|p| Profile::load(&p).ok().map(|pr| (p, pr)))
        .collect();
    v.sort_by_key(|(_, p)| (p.start_unix_ns, p.pid));
    v
}

fn default_output(craft: Craft, prog: &Path, pid: u32) -> PathBuf {
    let name = prog.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "program".into());
    PathBuf::from(format!("witch-{}-{}-{}.json", craft.name(), name, pid))
}

pub fn run(craft: Craft, a: &RunArgs) -> Result<i32> {
    if a.event.as_deref() == Some("list") {
        list_events(craft);
        return Ok(0);
    }
    if let Some(pid) = a.pid {
        return run_attached(craft, a, pid);
    }
    let Some(program) = a.command.first() else {
        bail!("no program given; for example: witch {} ./app", craft.name());
    };
    let prog = resolve(program)?;
    if a.exact {
        return run_exact(craft, a, &prog, program);
    }
    check_dynamic(&prog)?;
    let (sampler, event) = sampler_env(craft, a.event.as_deref())?;
    let free = witchcraft::probe::debug_registers();
    if free == 0 {
        bail!("no free debug registers on this thread (is a debugger attached?); witch needs at least one");
    }
    let agent = find_agent()?;
    let out_dir = std::env::temp_dir().join(format!("witch-{}-{}", std::process::id(), rand_suffix()));
    std::fs::create_dir_all(&out_dir).with_context(|| format!("cannot create {}", out_dir.display()))?;

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
    if let Some(t) = tunables() {
        cmd.env("GLIBC_TUNABLES", t);
    }
    // The agent's settings, in their one encoding (witchcraft::config).
    // Testing knobs (WITCH_SEED, ...) reach it through the inherited environment.
    let mut settings = Config::new(craft);
    settings.sampler = sampler;
    settings.event = event;
    settings.period = a.period;
    settings.replacement =
        witchcraft::replacement::Policy::parse(a.replacement.name()).unwrap_or(witchcraft::replacement::Policy::Reservoir);
    settings.fp_precision = a.fp_precision;
    settings.debug_registers = a.debug_registers.unwrap_or(free.min(4) as u32) as usize;
    settings.out_dir = out_dir.clone();
    cmd.env("LD_PRELOAD", preload).envs(settings.to_pairs());

    // Ctrl-C and Ctrl-\ reach the program through the terminal's process
    // group; witch waits for it. Termination requests sent to witch alone
    // are passed on.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => bail!("cannot run {}: {e}", prog.display()),
    };
    CHILD.store(child.id() as i32, Ordering::Relaxed);
    for sig in [libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2] {
        unsafe { libc::signal(sig, forward as *const () as libc::sighandler_t) };
    }
    let status = child.wait().context("waiting for the program")?;
    let pid = child.id();

    let profiles = collect(&out_dir);
    let main_out = a.output.clone().unwrap_or_else(|| default_output(craft, &prog, pid));
    let stem = main_out.with_extension("");
    let main_idx = profiles.iter().rposition(|(_, p)| p.pid == pid);
    let mut others = Vec::new();
    let mut seen: std::collections::HashMap<u32, usize> = Default::default();
    for (i, (path, p)) in profiles.iter().enumerate() {
        let dest = if Some(i) == main_idx {
            main_out.clone()
        } else {
            let k = seen.entry(p.pid).or_insert(0);
            *k += 1;
            let d = if *k == 1 {
                PathBuf::from(format!("{}.{}.json", stem.display(), p.pid))
            } else {
                PathBuf::from(format!("{}.{}.{}.json", stem.display(), p.pid, *k))
            };
            others.push(d.clone());
            d
        };
        if std::fs::rename(path, &dest).is_err() {
            p.save(&dest).with_context(|| format!("cannot write {}", dest.display()))?;
        }
    }
    let _ = std::fs::remove_dir_all(&out_dir);

    if !a.quiet {
        match main_idx {
            Some(i) => {
                let p = &profiles[i].1;
                let report = crate::report::render_report(p, a.top, a.format)?;
                eprint!("{report}");
                eprintln!("witch: profile written to {}", main_out.display());
            }
            None if status.signal() == Some(libc::SIGKILL) => eprintln!("witch: the program left no profile: it was killed by SIGKILL"),
            None => eprintln!("witch: the program left no profile (did it clear LD_PRELOAD, or end with a raw exit system call?)"),
        }
        if !others.is_empty() {
            eprintln!(
                "witch: {} more profile(s) from child processes or exec'd images: {}",
                others.len(),
                others.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
            );
        }
    }

    Ok(pass_through(status.code(), status.signal()))
}

/// The program's exit code, or, if a signal ended it, die the same way so a
/// shell or CI sees what it would have without witch (128+N if we survive).
fn pass_through(code: Option<i32>, signal: Option<i32>) -> i32 {
    if let Some(c) = code {
        return c;
    }
    let sig = signal.unwrap_or(libc::SIGKILL);
    unsafe {
        // The program already dumped its own core if it was going to.
        let core: libc::rlimit = std::mem::zeroed();
        libc::setrlimit(libc::RLIMIT_CORE, &core);
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
    128 + sig
}

/// GLIBC_TUNABLES for a profiled program. Any armed data breakpoint turns
/// off x86 fast-string operation, so `rep stosb`/`rep movsb` run ~50x
/// slower while a watchpoint is armed (measured here: a 128 KiB memset,
/// 1.0 µs → 47 µs). Ask glibc's memset/memcpy to use their vector loops
/// instead; opt out with WITCH_KEEP_REP_STRINGS=1. `--exact` runs the
/// program with them too, so both modes judge the same instructions.
fn tunables() -> Option<String> {
    if std::env::var_os("WITCH_KEEP_REP_STRINGS").is_some() {
        return None;
    }
    const T: &str = "glibc.cpu.x86_rep_stosb_threshold=0x7fffffffffffffff:glibc.cpu.x86_rep_movsb_threshold=0x7fffffffffffffff";
    Some(match std::env::var("GLIBC_TUNABLES") {
        Ok(old) if !old.is_empty() => format!("{old}:{T}"),
        _ => T.to_string(),
    })
}

/// `--exact`: single-step the program under ptrace and judge every access.
fn run_exact(craft: Craft, a: &RunArgs, prog: &Path, program: &OsString) -> Result<i32> {
    if !a.quiet {
        eprintln!("witch: exact mode single-steps every instruction; expect it to run thousands of times slower");
    }
    let exact = witchcraft::exact::Exact::new(craft, a.fp_precision);
    let env: Vec<(String, String)> = tunables().map(|t| ("GLIBC_TUNABLES".to_string(), t)).into_iter().collect();
    let run = exact.run(prog, &a.command[1..], program, &env).map_err(|e| anyhow::anyhow!("cannot trace {}: {e}", prog.display()))?;
    let pid = run.profile.pid;
    let out = a.output.clone().unwrap_or_else(|| default_output(craft, prog, pid));
    run.profile.save(&out).with_context(|| format!("cannot write {}", out.display()))?;
    if !a.quiet {
        eprint!("{}", crate::report::render_report(&run.profile, a.top, a.format)?);
        eprintln!("witch: {} instructions single-stepped; profile written to {}", run.instructions, out.display());
    }
    Ok(pass_through(run.code, run.signal))
}

static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn interrupted(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// `--pid`: attach to a running process, profile it for `--duration` or
/// until Ctrl-C, detach, and report. The process goes on unchanged.
fn run_attached(craft: Craft, a: &RunArgs, pid: i32) -> Result<i32> {
    let opts = crate::inject::Options {
        craft,
        period: a.period,
        event: a.event.clone(),
        debug_registers: a.debug_registers,
        replacement: a.replacement.name().to_string(),
        fp_precision: a.fp_precision,
    };
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        unsafe { libc::signal(sig, interrupted as *const () as libc::sighandler_t) };
    }
    let session = crate::inject::attach(pid, &opts)?;
    let pid = session.pid;
    let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|s| s.trim().to_string()).unwrap_or_else(|_| "process".into());
    if !a.quiet {
        match a.duration {
            Some(d) => eprintln!("witch: attached to pid {pid} ({name}); profiling for {d:.1?}"),
            None => eprintln!("witch: attached to pid {pid} ({name}); profiling until Ctrl-C"),
        }
    }
    let start = std::time::Instant::now();
    while !INTERRUPTED.load(Ordering::Relaxed) && a.duration.is_none_or(|d| start.elapsed() < d) && session.target_alive() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let ended = session.detach(std::time::Duration::from_secs(30))?;
    if ended.target_exited && !a.quiet {
        eprintln!("witch: pid {pid} exited during the session");
    }
    let Some(profile) = ended.profile else {
        bail!("pid {pid} left no profile (it was killed, or exec'd a new program, during the session)");
    };
    let out = a.output.clone().unwrap_or_else(|| default_output(craft, Path::new(&name), pid as u32));
    profile.save(&out).with_context(|| format!("cannot write {}", out.display()))?;
    if !a.quiet {
        // The target's output isn't ours here, so the report goes to stdout.
        crate::print(&crate::report::render_report(&profile, a.top, a.format)?)?;
        eprintln!("witch: detached; profile written to {}", out.display());
    }
    Ok(0)
}

fn rand_suffix() -> u64 {
    use rand::RngExt;
    rand::rng().random()
}
