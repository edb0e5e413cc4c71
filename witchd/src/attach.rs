//! `witch CRAFT --pid PID`: profile a process that is already running.
//!
//! One thread of the target is stopped briefly with ptrace and made to call
//! `dlopen(agent)` (skipped when an earlier attach loaded it) and then
//! `witch_attach(settings)`, after which it resumes where it was. The
//! agent's control thread does the rest inside the target (see the agent's
//! `attach.rs`): it sets up every thread, and on `detach` (a file in the
//! session directory) disarms everything, restores the signal handlers and
//! writes the profile into that directory.
//!
//! The injected calls run on a thread stopped at an arbitrary point; if it
//! held a lock that `dlopen` or `malloc` needs, the call would deadlock. So
//! we wait for a moment when the thread is in its own code or blocked in a
//! system call, not inside the C library or the dynamic loader.

use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use witchcraft::profile::{Craft, Profile};

/// What to profile with; the same knobs as a run.
#[derive(Clone, Debug)]
pub struct Options {
    pub craft: Craft,
    pub period: Option<u64>,
    /// `cpu-timer`, `task-clock`, `cpu-clock` or a PMU event spec; None = automatic.
    pub event: Option<String>,
    pub debug_registers: Option<u32>,
    /// `reservoir`, `oldest`, `newest` or `empty-only`.
    pub replacement: String,
    pub fp_precision: f64,
}

/// An agent session running inside a target process.
pub struct Session {
    pub pid: i32,
    pub dir: PathBuf,
}

/// How a session ended.
pub struct Ended {
    /// None when the target died before it could write one (e.g. SIGKILL).
    pub profile: Option<Profile>,
    /// The target exited during the session (its profile, if any, is its last).
    pub target_exited: bool,
}

/// Return codes of the agent's `witch_attach` (agent/src/attach.rs).
fn attach_error(code: u64) -> String {
    match code as i32 {
        1 => "a witch session is already running in it (another witch or witchd attached); try again later".into(),
        2 => "the agent rejected its settings (a witch bug)".into(),
        3 => "it already runs under a preloaded witch agent (started by `witch CRAFT ./prog`)".into(),
        4 => "the agent could not start its control thread in it".into(),
        5 => "all of its debug registers are in use (is a debugger or another tool watching it?)".into(),
        c => format!("the agent failed with code {c}"),
    }
}

struct Mapping {
    start: u64,
    offset: u64,
    path: String,
}

fn maps(pid: i32) -> Result<Vec<Mapping>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| permission(pid, e))?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let range = f.next()?;
            let _perms = f.next()?;
            let offset = u64::from_str_radix(f.next()?, 16).ok()?;
            let _dev = f.next()?;
            let _inode = f.next()?;
            let path = f.collect::<Vec<_>>().join(" ");
            let start = u64::from_str_radix(range.split_once('-')?.0, 16).ok()?;
            Some(Mapping { start, offset, path })
        })
        .collect())
}

fn permission(pid: i32, e: std::io::Error) -> anyhow::Error {
    match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ESRCH) => anyhow!("no process with pid {pid}"),
        Some(libc::EACCES) | Some(libc::EPERM) => not_permitted(pid),
        _ => anyhow!("cannot inspect pid {pid}: {e}"),
    }
}

fn not_permitted(pid: i32) -> anyhow::Error {
    let owner = std::fs::metadata(format!("/proc/{pid}")).map(|m| std::os::unix::fs::MetadataExt::uid(&m)).ok();
    let yama = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok().and_then(|s| s.trim().parse::<u32>().ok());
    let mut why = match owner {
        Some(u) if u != unsafe { libc::geteuid() } => format!("pid {pid} belongs to uid {u}"),
        _ => format!("ptrace of pid {pid} is refused"),
    };
    if let Some(s) = yama.filter(|&s| s > 0) {
        why.push_str(&format!(" (kernel.yama.ptrace_scope = {s}{})", if s == 1 { ": only descendants may be traced" } else { "" }));
    }
    anyhow!("not permitted to attach to pid {pid}: {why}; run witch as the process's user with ptrace allowed, or as root (CAP_SYS_PTRACE)")
}

/// The loaded object whose file is `path`, and its load bias.
fn base_of(maps: &[Mapping], pred: impl Fn(&str) -> bool) -> Option<(u64, String)> {
    maps.iter().find(|m| m.offset == 0 && pred(&m.path)).map(|m| (m.start, m.path.clone()))
}

/// Address of dynamic symbol `name` in the object mapped at `base` from `path`.
fn symbol(pid: i32, base: u64, path: &str, name: &str) -> Result<Option<u64>> {
    use object::{Object, ObjectSegment, ObjectSymbol};
    // Through /proc/PID/root so a process in another mount namespace works.
    let inside = format!("/proc/{pid}/root{path}");
    let data = std::fs::read(&inside).or_else(|_| std::fs::read(path)).with_context(|| format!("cannot read {path}"))?;
    let file = object::File::parse(&*data).map_err(|e| anyhow!("{path}: {e}"))?;
    // Shared objects are linked at 0 (their first segment's vaddr is the bias base).
    let first = file.segments().map(|s| s.address()).min().unwrap_or(0) & !0xfff;
    Ok(file.dynamic_symbols().find(|s| s.name() == Ok(name) && s.is_definition()).map(|s| base + s.address() - first))
}

fn elf_class(pid: i32) -> Result<u8> {
    use std::io::Read;
    let mut f = std::fs::File::open(format!("/proc/{pid}/exe")).map_err(|e| permission(pid, e))?;
    let mut h = [0u8; 20];
    f.read_exact(&mut h).map_err(|e| anyhow!("cannot read the executable of pid {pid}: {e}"))?;
    if &h[..4] != b"\x7fELF" {
        bail!("pid {pid} does not run an ELF program");
    }
    if h[4] != 2 || u16::from_le_bytes([h[18], h[19]]) != 62 {
        bail!("pid {pid} is a 32-bit or non-x86-64 process; witch profiles x86-64 processes only");
    }
    Ok(h[4])
}

fn tgid_of(pid: i32) -> Result<(i32, u32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| permission(pid, e))?;
    let field = |k: &str| status.lines().find_map(|l| l.strip_prefix(k)).map(|v| v.split_whitespace().next().unwrap_or("").to_string());
    let tgid = field("Tgid:").and_then(|v| v.parse().ok()).unwrap_or(pid);
    let uid = field("Uid:").and_then(|v| v.parse().ok()).unwrap_or(0);
    if field("State:").is_some_and(|s| s == "Z") {
        bail!("pid {pid} has exited (zombie)");
    }
    Ok((tgid, uid))
}

/// Settings for the agent, as `KEY=VALUE` lines (see witchcraft::config).
fn settings(opts: &Options, dir: &Path) -> Result<String> {
    let (sampler, event) = crate::run::sampler_env(opts.craft, opts.event.as_deref())?;
    let mut s = format!(
        "WITCH_CRAFT={}\nWITCH_SAMPLER={sampler}\nWITCH_REPLACEMENT={}\nWITCH_FP_PRECISION={}\nWITCH_SESSION_DIR={}\nWITCH_CONTROLLER={}\n",
        opts.craft.name(),
        opts.replacement,
        opts.fp_precision,
        dir.display(),
        std::process::id()
    );
    let free = witchcraft::probe::debug_registers().clamp(1, 4) as u32;
    s.push_str(&format!("WITCH_DEBUG_REGISTERS={}\n", opts.debug_registers.unwrap_or(free)));
    if let Some(e) = event {
        s.push_str(&format!("WITCH_EVENT={e}\n"));
    }
    if let Some(p) = opts.period {
        s.push_str(&format!("WITCH_PERIOD={p}\n"));
    }
    for k in ["WITCH_SEED", "WITCH_NO_SIGTRAP", "WITCH_NO_MODIFY"] {
        if let Ok(v) = std::env::var(k) {
            s.push_str(&format!("{k}={v}\n"));
        }
    }
    Ok(s)
}

pub fn attach(pid: i32, opts: &Options) -> Result<Session> {
    if pid <= 0 {
        bail!("no process with pid {pid}");
    }
    let (tgid, uid) = tgid_of(pid)?;
    if tgid == std::process::id() as i32 {
        bail!("witch cannot attach to itself");
    }
    let pid = tgid;
    elf_class(pid)?;
    let agent = crate::run::find_agent()?;
    let m = maps(pid)?;
    let is_libc = |p: &str| {
        let f = p.rsplit('/').next().unwrap_or("");
        f.starts_with("libc.so") || f.starts_with("libc-2.") || f.starts_with("libdl.so") || f.starts_with("libdl-")
    };
    let loaded = base_of(&m, |p| p.ends_with("/libwitch_agent.so"));
    let mut dlopen = None;
    let mut dlerror = None;
    if loaded.is_none() {
        for (base, path) in m.iter().filter(|x| x.offset == 0 && is_libc(&x.path)).map(|x| (x.start, x.path.clone())) {
            if dlopen.is_none() {
                dlopen = symbol(pid, base, &path, "dlopen")?.or(symbol(pid, base, &path, "__libc_dlopen_mode")?);
                dlerror = symbol(pid, base, &path, "dlerror")?;
            }
        }
        if dlopen.is_none() {
            if !m.iter().any(|x| x.path.contains("/ld-linux") || x.path.contains("/ld-")) {
                bail!("pid {pid} is statically linked, so the agent can't be loaded into it; restart it under `witch {} PROGRAM`, or use --exact", opts.craft.name());
            }
            bail!("pid {pid} has no dlopen (no C library loaded?); restart it under `witch {} PROGRAM`", opts.craft.name());
        }
    }

    let dir = std::env::temp_dir().join(format!("witch-attach-{pid}-{:x}", rand_suffix()));
    std::fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let cdir = cstring(&dir)?;
    unsafe {
        libc::chmod(cdir.as_ptr(), 0o700);
        if libc::geteuid() == 0 && uid != 0 {
            libc::chown(cdir.as_ptr(), uid, u32::MAX);
        }
    }
    let result = (|| -> Result<()> {
        let text = settings(opts, &dir)?;
        let tracee = Tracee::stop_safely(pid)?;
        let r = (|| -> Result<()> {
            let agent_base = match loaded {
                Some((b, path)) => (b, path),
                None => {
                    let path = agent.to_string_lossy().into_owned();
                    let handle = tracee
                        .call(dlopen.unwrap_or(0), &[Arg::Str(path.clone()), Arg::Int((libc::RTLD_NOW | libc::RTLD_LOCAL) as u64)])?;
                    if handle == 0 {
                        let why = match dlerror {
                            Some(f) => tracee.call(f, &[]).and_then(|p| tracee.read_cstr(p)).unwrap_or_default(),
                            None => String::new(),
                        };
                        bail!("pid {pid} could not load the agent {path}: {why}");
                    }
                    base_of(&maps(pid)?, |p| p == path || p.ends_with("/libwitch_agent.so"))
                        .ok_or_else(|| anyhow!("the agent was loaded into pid {pid} but is not in its memory map"))?
                }
            };
            let f = symbol(pid, agent_base.0, &agent_base.1, "witch_attach")?
                .ok_or_else(|| anyhow!("{} has no witch_attach (an older agent is loaded in pid {pid}?)", agent_base.1))?;
            let mut code = tracee.call(f, &[Arg::Str(text.clone())])?;
            // The kernel may free a closed breakpoint's debug register a
            // little after close() returns (seen: ENOSPC in 6 of 20 attaches
            // right after the test that plays a debugger closed its events),
            // so look again for a while before refusing.
            for _ in 0..10 {
                if code != 5 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(30));
                code = tracee.call(f, &[Arg::Str(text.clone())])?;
            }
            if code != 0 {
                bail!("cannot profile pid {pid}: {}", attach_error(code));
            }
            Ok(())
        })();
        tracee.resume();
        r?;
        // The control thread reports "ready" once every thread is set up.
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(e) = std::fs::read_to_string(dir.join("error")) {
                bail!("cannot profile pid {pid}: {}", e.trim());
            }
            if dir.join("ready").exists() {
                return Ok(());
            }
            if !alive(pid) {
                bail!("pid {pid} exited while witch was attaching");
            }
            if Instant::now() > until {
                bail!("the agent in pid {pid} did not report ready within 20 s");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    })();
    match result {
        Ok(()) => Ok(Session { pid, dir }),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            Err(e)
        }
    }
}

fn alive(pid: i32) -> bool {
    let gone = unsafe { libc::kill(pid, 0) } != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    // A zombie is gone for our purposes.
    !gone
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with('Z')))
}

impl Session {
    pub fn target_alive(&self) -> bool {
        alive(self.pid)
    }

    /// Ask the agent to stop and wait (at most `timeout`) for its profile.
    pub fn detach(self, timeout: Duration) -> Result<Ended> {
        let _ = std::fs::write(self.dir.join("detach"), b"");
        let until = Instant::now() + timeout;
        let mut target_exited = false;
        loop {
            if self.dir.join("detached").exists() || self.dir.join("error").exists() {
                break;
            }
            if !alive(self.pid) {
                target_exited = true;
                break;
            }
            if Instant::now() > until {
                let _ = std::fs::remove_dir_all(&self.dir);
                bail!("the agent in pid {} did not detach within {:.0?}", self.pid, timeout);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut found: Vec<(PathBuf, Profile)> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .filter_map(|p| Profile::load(&p).ok().map(|pr| (p, pr)))
            .collect();
        found.sort_by_key(|(_, p)| p.start_unix_ns);
        let _ = std::fs::remove_dir_all(&self.dir);
        Ok(Ended { profile: found.pop().map(|(_, p)| p), target_exited })
    }
}

fn cstring(p: &Path) -> Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(|_| anyhow!("bad path {}", p.display()))
}

fn rand_suffix() -> u64 {
    use rand::RngExt;
    rand::rng().random()
}

// ---- ptrace ---------------------------------------------------------------

enum Arg {
    Int(u64),
    /// Copied onto the thread's stack, passed as a pointer.
    Str(String),
}

/// One thread of the target, stopped under ptrace.
struct Tracee {
    tid: i32,
    saved: libc::user_regs_struct,
}

/// Blocking calls a thread may be stopped in without holding a C library lock.
const BLOCKING_SYSCALLS: [i64; 20] = [0, 7, 23, 34, 35, 43, 45, 47, 61, 128, 130, 202, 230, 232, 247, 270, 271, 281, 288, 441];

impl Tracee {
    /// Seize a thread of `pid` at a safe moment (see the module comment).
    fn stop_safely(pid: i32) -> Result<Tracee> {
        let m = maps(pid)?;
        let risky: Vec<(u64, u64)> = {
            // Executable ranges of the C library, the loader and the agent.
            let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
            text.lines()
                .filter(|l| {
                    let name = l.rsplit('/').next().unwrap_or("");
                    l.split_whitespace().nth(1).is_some_and(|p| p.contains('x'))
                        && (name.starts_with("libc")
                            || name.starts_with("ld-")
                            || name.starts_with("libpthread")
                            || name.starts_with("libdl")
                            || name.starts_with("libwitch_agent"))
                })
                .filter_map(|l| {
                    let (a, b) = l.split_whitespace().next()?.split_once('-')?;
                    Some((u64::from_str_radix(a, 16).ok()?, u64::from_str_radix(b, 16).ok()?))
                })
                .collect()
        };
        drop(m);
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut last_err = None;
        loop {
            let mut tids: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
                .map_err(|e| permission(pid, e))?
                .flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
                .collect();
            tids.sort_by_key(|&t| (t != pid, t));
            let any_ok = Instant::now() > deadline;
            for tid in tids {
                match Tracee::seize(tid) {
                    Ok(t) => {
                        let in_syscall = t.saved.orig_rax as i64;
                        let rip = t.saved.rip;
                        let safe = if in_syscall >= 0 {
                            BLOCKING_SYSCALLS.contains(&in_syscall)
                        } else {
                            !risky.iter().any(|&(a, b)| a <= rip && rip < b)
                        };
                        if safe || any_ok {
                            return Ok(t);
                        }
                        t.resume();
                    }
                    Err(e) => {
                        if e.downcast_ref::<Refused>().is_some() {
                            return Err(not_permitted(pid));
                        }
                        last_err = Some(e);
                    }
                }
            }
            if !alive(pid) {
                bail!("no process with pid {pid}");
            }
            if any_ok {
                return Err(last_err.unwrap_or_else(|| anyhow!("could not stop any thread of pid {pid}")));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn seize(tid: i32) -> Result<Tracee> {
        unsafe {
            if libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) != 0 {
                let e = std::io::Error::last_os_error();
                if matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES)) {
                    return Err(Refused.into());
                }
                bail!("cannot trace thread {tid}: {e}");
            }
            if libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0) != 0 {
                let e = std::io::Error::last_os_error();
                libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0);
                bail!("cannot stop thread {tid}: {e}");
            }
        }
        let t = Tracee { tid, saved: unsafe { std::mem::zeroed() } };
        t.wait_stop(Duration::from_secs(5))?;
        let mut t = t;
        t.saved = t.regs()?;
        Ok(t)
    }

    /// Wait for the next stop; returns the signal of a signal-delivery stop (0 otherwise).
    fn wait_stop(&self, timeout: Duration) -> Result<i32> {
        let until = Instant::now() + timeout;
        loop {
            let mut status = 0;
            let r = unsafe { libc::waitpid(self.tid, &mut status, libc::__WALL | libc::WNOHANG) };
            if r == self.tid {
                if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                    bail!("thread {} exited", self.tid);
                }
                if libc::WIFSTOPPED(status) {
                    let sig = libc::WSTOPSIG(status);
                    let event = (status >> 16) & 0xff;
                    // PTRACE_EVENT_STOP (interrupt or group stop) reports as SIGTRAP/stop signals.
                    if event == libc::PTRACE_EVENT_STOP {
                        return Ok(0);
                    }
                    return Ok(sig);
                }
            } else if r < 0 {
                bail!("waiting for thread {}: {}", self.tid, std::io::Error::last_os_error());
            }
            if Instant::now() > until {
                bail!("thread {} did not stop", self.tid);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn regs(&self) -> Result<libc::user_regs_struct> {
        let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        if unsafe { libc::ptrace(libc::PTRACE_GETREGS, self.tid, 0, &mut r as *mut _) } != 0 {
            bail!("cannot read registers of thread {}: {}", self.tid, std::io::Error::last_os_error());
        }
        Ok(r)
    }

    fn set_regs(&self, r: &libc::user_regs_struct) -> Result<()> {
        if unsafe { libc::ptrace(libc::PTRACE_SETREGS, self.tid, 0, r as *const _) } != 0 {
            bail!("cannot set registers of thread {}: {}", self.tid, std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<()> {
        let local = libc::iovec { iov_base: data.as_ptr() as *mut _, iov_len: data.len() };
        let remote = libc::iovec { iov_base: addr as *mut _, iov_len: data.len() };
        let n = unsafe { libc::process_vm_writev(self.tid, &local, 1, &remote, 1, 0) };
        if n != data.len() as isize {
            bail!("cannot write the target's memory: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn read_cstr(&self, addr: u64) -> Result<String> {
        if addr == 0 {
            return Ok(String::new());
        }
        let mut buf = vec![0u8; 512];
        let local = libc::iovec { iov_base: buf.as_mut_ptr() as *mut _, iov_len: buf.len() };
        let remote = libc::iovec { iov_base: addr as *mut _, iov_len: buf.len() };
        let n = unsafe { libc::process_vm_readv(self.tid, &local, 1, &remote, 1, 0) };
        if n <= 0 {
            return Ok(String::new());
        }
        buf.truncate(n as usize);
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
    }

    /// Call `f(args...)` on the stopped thread and return its `rax`. The
    /// call returns to address 0; the fault stops it, and the thread's
    /// registers (a system call to restart included) are put back.
    fn call(&self, f: u64, args: &[Arg]) -> Result<u64> {
        let mut r = self.saved;
        // Below the red zone, 16-byte aligned; strings first, then the return address.
        let mut sp = (self.saved.rsp - 1024) & !0xf;
        let mut ints = Vec::new();
        for a in args {
            match a {
                Arg::Int(v) => ints.push(*v),
                Arg::Str(s) => {
                    let mut b = s.as_bytes().to_vec();
                    b.push(0);
                    sp = (sp - b.len() as u64) & !0xf;
                    self.write(sp, &b)?;
                    ints.push(sp);
                }
            }
        }
        sp -= 8;
        self.write(sp, &0u64.to_le_bytes())?;
        r.rsp = sp;
        r.rip = f;
        r.rax = 0;
        r.orig_rax = u64::MAX; // not in a system call: no restart
        let regs = [&mut r.rdi, &mut r.rsi, &mut r.rdx, &mut r.rcx, &mut r.r8, &mut r.r9];
        for (slot, v) in regs.into_iter().zip(ints) {
            *slot = v;
        }
        self.set_regs(&r)?;
        let mut sig = 0;
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            if unsafe { libc::ptrace(libc::PTRACE_CONT, self.tid, 0, sig) } != 0 {
                bail!("cannot resume thread {}: {}", self.tid, std::io::Error::last_os_error());
            }
            let s = self.wait_stop(until.saturating_duration_since(Instant::now()))?;
            if s == libc::SIGSEGV {
                let now = self.regs()?;
                if now.rip == 0 {
                    self.set_regs(&self.saved)?;
                    return Ok(now.rax);
                }
            }
            // Another signal for the program, or a stop: pass it on.
            sig = if s == libc::SIGSTOP || s == 0 { 0 } else { s };
        }
    }

    /// Let the thread go on from where it was stopped.
    fn resume(&self) {
        unsafe { libc::ptrace(libc::PTRACE_DETACH, self.tid, 0, 0) };
    }
}

#[derive(Debug)]
struct Refused;
impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ptrace refused")
    }
}
impl std::error::Error for Refused {}
