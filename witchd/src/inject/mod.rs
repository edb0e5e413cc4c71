//! `witch CRAFT --pid PID` and witchd's sessions: profile a process that is
//! already running.
//!
//! One thread of the target is stopped briefly with ptrace ([`ptrace`]) and
//! made to call `dlopen(agent)` (skipped when an earlier attach loaded it)
//! and then the agent's entry point, after which it goes on where it was.
//! The agent answers over a socket pair it creates, whose other end the
//! controller takes with `pidfd_getfd` ([`channel`]); the protocol is
//! `witchcraft::session`. Nothing goes through the file system, so a root
//! controller never touches a path the target's owner controls
//! (docs/SECURITY.md), and closing the socket, by detaching, giving up or
//! dying, always ends the session in the target.
//!
//! A process that replaces its program (exec) takes the agent, its state
//! and what it gathered with the old image, and the socket closes; the pid
//! and start time stay. A session's [`poll`] and [`replaced`] tell that
//! from an exit, for `witch --pid` and witchd alike.

pub mod channel;
pub mod end;
pub mod loader;
pub mod poll;
pub mod ptrace;
pub mod stopped;
pub mod target;

use anyhow::{anyhow, bail, Result};
use channel::{ControllerEnd, Incoming};
use ptrace::{Arg, Return, Tracee};
use std::time::{Duration, Instant};
use target::{file_name, is_c_library, Target};
use witchcraft::config::Config;
use witchcraft::profile::{Craft, Profile};
use witchcraft::session::{AttachCode, Message, ATTACH_SYMBOL, NO_ANSWER};
use witchcraft::sys::procfs::{self, Image, Of, ProcStatus};

pub use end::{end, Attached, End};
pub use poll::{Poll, SessionFacts, Why};
pub use target::alive;

/// What to profile with; the same knobs as a run.
#[derive(Clone, Debug)]
pub struct Options {
    pub craft: Craft,
    pub period: Option<u64>,
    /// `period` was given as a time (`-p 1ms`, `-F 200`): a time-based sampler.
    pub period_is_time: bool,
    /// `cpu-timer`, `task-clock`, `cpu-clock` or a PMU event spec; None = automatic.
    pub event: Option<String>,
    pub debug_registers: Option<u32>,
    pub replacement: witchcraft::replacement::Policy,
    pub fp_precision: f64,
    /// The bursts' overhead budget in percent; None: the default.
    pub overhead_percent: Option<f64>,
    /// Heap blocks of at least this many bytes are data objects (0: none); None: the default.
    pub heap_threshold: Option<u64>,
}

impl Options {
    /// The agent's settings.
    pub fn config(&self) -> Result<Config> {
        let (sampler, event) = crate::agent::sampler_env(self.craft, self.event.as_deref(), self.period_is_time)?;
        let mut c = Config::new(self.craft).with_knobs_from_env().map_err(|e| anyhow!(e))?;
        c.sampler = sampler;
        c.event = event;
        c.period = self.period;
        c.replacement = self.replacement;
        c.fp_precision = self.fp_precision;
        c.overhead_percent = self.overhead_percent.or(c.overhead_percent);
        c.heap_threshold = self.heap_threshold;
        let free = witchcraft::sys::watchpoint::debug_registers().clamp(1, 4) as u32;
        c.debug_registers = self.debug_registers.unwrap_or(free).clamp(1, 4) as usize;
        Ok(c)
    }
}

/// The controller's hold on an attach session: the agent running inside
/// a target process, and its socket (the agent's own state of the session
/// is the agent's `attach_state::Session`). Dropping it (without
/// [`Attachment::detach`]) ends the session too: the agent sees its socket close.
pub struct Attachment {
    pub pid: i32,
    chan: ControllerEnd,
    /// The process's image as the attach found it: the one the agent is in.
    image: Option<Image>,
    /// The process's start time as the attach found it (its identity, with the pid).
    start: Option<u64>,
}

/// The agent's file name, as a process maps it.
pub const AGENT_FILE: &str = "libwitch_agent.so";

/// Has the agent gone from process `pid` with the program it was loaded
/// into? The agent stays loaded after a session (a later attach reuses
/// it): only a new image lacks it. The process must map a program (an
/// exiting one has let its memory go, and maps nothing).
pub fn agent_gone(pid: i32) -> bool {
    procfs::read_maps(Some(pid)).is_ok_and(|maps| !maps.is_empty() && !maps.iter().any(|m| m.file_name() == Some(AGENT_FILE)))
}

/// An error: the process replaced its program (exec) while witch was
/// attaching to it, so nothing was profiled. It runs on.
#[derive(Debug)]
pub struct Exec(pub String);

impl std::fmt::Display for Exec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Exec {}

fn exec_while_attaching(pid: i32) -> anyhow::Error {
    Exec(format!("pid {pid} replaced its program (exec) while witch was attaching; nothing was profiled, and it runs on")).into()
}

/// How a session ended.
pub struct Ended {
    /// None when the target died before it could send one (e.g. SIGKILL).
    pub profile: Option<Profile>,
    /// The target exited during the session (its profile, if any, is its last).
    pub target_exited: bool,
}

/// How long the agent may take to set the process up.
const READY_WAIT: Duration = Duration::from_secs(20);

pub fn attach(pid: i32, opts: &Options) -> Result<Attachment> {
    // Read before the maps are: the image they describe, unless it changes.
    let image = laid_out(pid);
    let attached = attach_in(pid, image, opts);
    match attached {
        // (Not `replaced`: a refused attach never loaded the agent. An exec
        // that killed the thread witch held may still be laying out its
        // image: wait for it.)
        Err(e)
            if e.downcast_ref::<Exec>().is_none()
                && alive(pid)
                && image.is_some_and(|b| laid_out(pid).is_some_and(|now| b.replaced_by(now))) =>
        {
            Err(exec_while_attaching(pid))
        }
        r => r,
    }
}

/// How long an attach waits for a process in the middle of an exec to
/// have laid out its new image.
const LAYOUT_WAIT: Duration = Duration::from_secs(1);

/// The image of process `pid` once laid out (see [`Image::laid_out`]): a
/// process in the middle of an exec is waited for, up to [`LAYOUT_WAIT`];
/// one that is exiting reads as it does. An attach compares the image
/// once the thread it holds is stopped with this one. (One read in the
/// middle of an exec, zeros, was taken for an image unknown, so that a
/// later exec went unseen and the injected calls went to addresses that
/// named nothing in the new image: the process was killed, SIGSEGV. One
/// read half laid out made witch take the attach for refused by an exec.)
fn laid_out(pid: i32) -> Option<Image> {
    let until = Instant::now() + LAYOUT_WAIT;
    loop {
        let image = Image::of(pid);
        if image.is_none_or(Image::laid_out) || Instant::now() > until || !alive(pid) {
            return image;
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// How long an attach waits for a process the loader is still starting to
/// have its C library mapped.
const STARTING_WAIT: Duration = Duration::from_secs(2);

/// `dlopen` (or the C library's own `__libc_dlopen_mode`), `dlerror` and
/// `getpid` in the C library `target` maps, where found.
fn c_library_calls(target: &Target) -> Result<(Option<u64>, Option<u64>, Option<u64>)> {
    let (mut dlopen, mut dlerror, mut getpid) = (None, None, None);
    for m in target.maps.iter().filter(|m| m.offset == 0 && m.is_file() && is_c_library(file_name(&m.path))) {
        if let [open, open_mode, error, pid_of] = target.symbols(m, &["dlopen", "__libc_dlopen_mode", "dlerror", "getpid"])?[..] {
            if dlopen.is_none() {
                (dlopen, dlerror) = (open.or(open_mode), error);
            }
            getpid = getpid.or(pid_of);
        }
    }
    Ok((dlopen, dlerror, getpid))
}

fn attach_in(pid: i32, image: Option<Image>, opts: &Options) -> Result<Attachment> {
    let mut target = Target::inspect(pid)?;
    let pid = target.pid;
    target.check_x86_64()?;
    target.check_free()?;
    let config = opts.config()?;
    let agent = crate::agent::find_agent()?;
    let agent_path = agent.to_string_lossy().into_owned();
    let is_agent = |f: &str| f == AGENT_FILE;
    let loaded = target.object(is_agent).cloned();
    let has_loader = |t: &Target| t.maps.iter().any(|x| x.path.contains("/ld-linux") || x.path.contains("/ld-"));
    // A process the loader is still starting (just run, or just exec'd) has
    // no C library mapped yet: wait for it a little.
    let starting_until = Instant::now() + STARTING_WAIT;
    let (dlopen, dlerror, getpid) = loop {
        let found = c_library_calls(&target)?;
        if found.0.is_some() || loaded.is_some() || !has_loader(&target) || Instant::now() > starting_until {
            break found;
        }
        std::thread::sleep(Duration::from_millis(10));
        if !alive(pid) {
            bail!("no process with pid {pid}");
        }
        target.refresh_maps()?;
    };
    if loaded.is_none() && dlopen.is_none() {
        if !has_loader(&target) {
            bail!(
                "pid {pid} is statically linked, so the agent can't be loaded into it; restart it under `witch {} PROGRAM`, or use --exact",
                opts.craft.name()
            );
        }
        bail!("pid {pid} has no dlopen (no C library loaded?); restart it under `witch {} PROGRAM`", opts.craft.name());
    }
    // Names the process for good: a pid reused meanwhile is refused below.
    let pidfd = channel::pidfd_open(pid)?;

    // Injected calls return through the C library's signal return, so that
    // a controller killed meanwhile leaves the thread as it was (ptrace.rs).
    let code = target.return_code();
    let ret = code.sigreturn.map_or(Return::Fault, Return::Restore);
    // dlerror's result is a pointer, nowhere but in `rax`.
    let keeping = match (code.sigreturn, code.store_rax) {
        (Some(sr), Some(store)) => Return::RestoreKeeping(sr, store),
        _ => Return::Fault,
    };
    // An agent loaded already: its entry point, read from its file before
    // any thread is stopped (a large file takes a while to read).
    let entry_before = loaded.as_ref().map(|m| target.symbol(m, ATTACH_SYMBOL));
    // The agent is loaded only while nobody holds the loader's lock (loader.rs).
    let lock = if loaded.is_none() { target.loader_lock() } else { None };
    let (waiting_since, loader_until) = (Instant::now(), Instant::now() + loader::LOADER_WAIT);
    let tracee = loop {
        if let Some(holder) = lock.and_then(|l| loader::wait_until_free(pid, l, loader_until)) {
            return Err(loader::busy(pid, holder, waiting_since.elapsed()));
        }
        let t = Tracee::stop_safely(&target)?;
        match lock.and_then(|l| l.holder(pid)) {
            None => break t,
            Some(holder) => {
                t.resume();
                if Instant::now() >= loader_until {
                    return Err(loader::busy(pid, holder, waiting_since.elapsed()));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    };
    // An exec since the maps were read would leave their addresses naming
    // nothing (or anything) in the new image: call none of them. One after
    // this stop kills the stopped thread, and with it the injection. The
    // image must be the very one read before the maps: one in the middle
    // of an exec (some fields or none) is no longer it either.
    if Image::of(pid) != image {
        tracee.resume();
        if !alive(pid) {
            bail!("pid {pid} exited while witch was attaching");
        }
        return Err(exec_while_attaching(pid));
    }
    let injected = (|| -> Result<i32> {
        if let (Some(f), Return::Restore(_), true) = (getpid, ret, tracee.in_mask_call()) {
            tracee.call(f, &[], ret)?;
        }
        let agent_obj = match loaded {
            Some(m) => m,
            None => {
                let args = [Arg::Str(agent_path.clone()), Arg::Int((libc::RTLD_NOW | libc::RTLD_LOCAL) as u64)];
                let called = match lock {
                    Some(lock) => {
                        let before = loader::Snapshot::take(&target, tracee.thread_pointer());
                        let stuck = |tid| loader::stuck(pid, tid, lock);
                        match tracee.call_unless_stuck(dlopen.unwrap_or(0), &args, ret, &stuck) {
                            Err(e) if e.is::<ptrace::Stuck>() => {
                                let holder = lock.holder(pid).unwrap_or(0);
                                before.put_back(pid, tracee.below_stack_pointer())?;
                                return Err(loader::taken_back(pid, holder));
                            }
                            r => r?,
                        }
                    }
                    None => tracee.call(dlopen.unwrap_or(0), &args, ret)?,
                };
                target.refresh_maps()?;
                match target.object(is_agent).cloned() {
                    Some(m) if called.rax != Some(0) => m,
                    _ => {
                        let why = match dlerror {
                            Some(f) => tracee.call(f, &[], keeping).map(|c| tracee.read_cstr(c.rax.unwrap_or(0))).unwrap_or_default(),
                            None => String::new(),
                        };
                        bail!("pid {pid} could not load the agent {agent_path}: {why}");
                    }
                }
            }
        };
        let entry = match entry_before {
            Some(Ok(entry)) => entry,
            _ => target.symbol(&agent_obj, ATTACH_SYMBOL)?,
        };
        let entry = entry.ok_or_else(|| {
            anyhow!("{} has no {ATTACH_SYMBOL} (an agent of an older witch is loaded in pid {pid}; restart it to attach)", agent_obj.path)
        })?;
        // Our pid, for the agent to watch until our settings come (as it
        // would name another process in another pid namespace, -1 there).
        let me = if same_pid_namespace(pid) { std::process::id() as i32 } else { -1 };
        let start = || tracee.call(entry, &[Arg::Out([me, NO_ANSWER])], ret).map(|c| c.out);
        let mut out = start()?;
        // A debugger's breakpoint may be released a little after it is
        // closed (another process may still hold the event for a moment),
        // so look again for a while before refusing.
        for _ in 0..10 {
            if AttachCode::from_raw(out[1]) != Some(AttachCode::NoDebugRegisters) {
                break;
            }
            std::thread::sleep(Duration::from_millis(30));
            out = start()?;
        }
        match AttachCode::from_raw(out[1]) {
            Some(AttachCode::Ok) => Ok(out[0]),
            Some(code) => bail!("cannot profile pid {pid}: {}", code.message()),
            None if out[1] == NO_ANSWER => bail!("cannot profile pid {pid}: the agent did not answer"),
            None => bail!("cannot profile pid {pid}: the agent failed with code {}", out[1]),
        }
    })();
    let injected = injected.map_err(|e| if e.is::<ptrace::Stopped>() { e.context(format!("cannot profile pid {pid}")) } else { e });
    // Taking the socket needs the process alive, not stopped: before or after resuming is alike.
    let taken = injected.and_then(|fd| ControllerEnd::take(&pidfd, pid, fd));
    tracee.resume();
    let chan = taken?;

    // From here, any failure drops `chan`: the agent sees its socket close and undoes everything.
    if !chan.send(&Message::Settings(config.to_lines())) {
        bail!("the agent in pid {pid} did not take its settings");
    }
    let until = Instant::now() + READY_WAIT;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match chan.recv(left.min(STOP_CHECK)) {
            Some(Incoming::Message(Message::Ready { .. })) => {
                return Ok(Attachment { pid, chan, image, start: procfs::Stat::read(pid).map(|s| s.start_time) })
            }
            Some(Incoming::Message(Message::Error(e))) => bail!("cannot profile pid {pid}: {}", e.trim()),
            Some(Incoming::Message(_)) => {}
            Some(Incoming::Closed(why)) => {
                if !alive(pid) {
                    bail!("pid {pid} exited while witch was attaching");
                }
                bail!("the agent in pid {pid} ended the session while setting up{}", why.map(|w| format!(" ({w})")).unwrap_or_default());
            }
            None if stopped(pid) => bail!(
                "pid {pid} was stopped (SIGSTOP or job control) before the agent was ready; it stays stopped, and the agent leaves by itself once it is continued"
            ),
            None if left.is_zero() => bail!("the agent in pid {pid} did not report ready within {READY_WAIT:?}"),
            None => {}
        }
    }
}

impl Attached for Attachment {
    fn pid(&self) -> i32 {
        self.pid
    }
    fn image(&self) -> Option<Image> {
        self.image
    }
    fn start_time(&self) -> Option<u64> {
        self.start
    }
    fn detach(self: Box<Self>, timeout: Duration) -> Result<Ended> {
        Attachment::detach(*self, timeout)
    }
}

impl Attachment {
    /// Ask the agent to stop and wait (at most `timeout`) for its profile.
    pub fn detach(self, timeout: Duration) -> Result<Ended> {
        let _ = self.chan.send(&Message::Detach);
        let until = Instant::now() + timeout;
        let mut profile = None;
        let mut closed = false;
        let mut error = None;
        // A stopped process: its agent's thread, lent a run of its own (see `stopped`).
        let mut lent: Option<stopped::Lent> = None;
        loop {
            if let Some(l) = &mut lent {
                l.tend();
            }
            let left = until.saturating_duration_since(Instant::now());
            match self.chan.recv(left.min(STOP_CHECK)) {
                Some(Incoming::Message(Message::Profile(p))) => profile = Some(p),
                Some(Incoming::Message(Message::Detached)) => break,
                Some(Incoming::Message(Message::Error(e))) => error = Some(e),
                Some(Incoming::Message(_)) => {}
                Some(Incoming::Closed(_)) => {
                    closed = true;
                    break;
                }
                None if !alive(self.pid) => {
                    closed = true;
                    break;
                }
                None if lent.is_none() && stopped(self.pid) => match stopped::Lent::take(self.pid) {
                    Ok(l) => lent = Some(l),
                    Err(e) => bail!(
                        "pid {} is stopped (SIGSTOP or job control), so its agent cannot send the profile ({e:#}); once the process is continued, the agent leaves by itself",
                        self.pid
                    ),
                },
                None if left.is_zero() => bail!("the agent in pid {} did not detach within {:.0?}", self.pid, timeout),
                None => {}
            }
        }
        if !closed {
            // The agent closes its end, then its control thread ends: wait
            // (briefly) for both, so that no thread of witch's is left in
            // the target when this returns.
            let until = Instant::now() + AGENT_EXIT_WAIT;
            while let Some(Incoming::Message(_)) = self.chan.recv(until.saturating_duration_since(Instant::now())) {}
            while agent_thread_in(self.pid) && Instant::now() < until {
                if let Some(l) = &mut lent {
                    l.tend();
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        // Let the lent thread go (back into the stop, if it is still there).
        drop(lent);
        let target_exited = closed && !alive(self.pid);
        if let (None, Some(e)) = (&profile, error) {
            bail!("the agent in pid {} failed: {}", self.pid, e.trim());
        }
        let profile = match profile {
            Some(bytes) => Some(Profile::from_bytes(&bytes).map_err(|e| anyhow!("the profile from pid {}: {e}", self.pid))?),
            None => None,
        };
        Ok(Ended { profile, target_exited })
    }
}

/// What a [`Poll`] asks of a real session.
impl SessionFacts for Attachment {
    fn target_alive(&self) -> bool {
        alive(self.pid)
    }

    /// One read of /proc/PID/stat.
    fn exec_seen(&self) -> bool {
        Image::changed(self.pid, self.image)
    }

    /// It said `Detached` unasked: it has undone everything and sent its
    /// profile, which says why (`ended_by`, a note); the process runs on.
    /// What it reads stays for [`Attachment::detach`]. (A process that exits
    /// sends its profile and no `Detached`.)
    fn agent_ended(&self) -> bool {
        self.chan.came(|e| matches!(e, Incoming::Message(Message::Detached)))
    }

    /// It does when the process exits or replaces its program, or when the
    /// agent ends the session (a debugger attached, a seccomp sandbox).
    /// What it reads stays for [`Attachment::detach`].
    fn agent_closed(&self) -> bool {
        self.chan.closed()
    }

    /// See [`agent_gone`].
    fn agent_gone(&self) -> bool {
        agent_gone(self.pid)
    }
}

/// How often the waits for the agent look whether the process was stopped.
const STOP_CHECK: Duration = Duration::from_millis(100);

/// Is process `pid` stopped (SIGSTOP, job control)?
fn stopped(pid: i32) -> bool {
    ProcStatus::read(Of::Process(pid)).is_ok_and(|s| s.stopped())
}

/// How long a detach waits for the agent's control thread to end after it
/// said it detached.
const AGENT_EXIT_WAIT: Duration = Duration::from_secs(1);

/// Has process `pid` a thread named as the agent's control thread?
fn agent_thread_in(pid: i32) -> bool {
    procfs::tasks(Some(pid)).into_iter().any(|t| {
        std::fs::read_to_string(format!("/proc/{pid}/task/{t}/comm")).is_ok_and(|c| c.trim_end() == witchcraft::session::AGENT_THREAD)
    })
}

/// Is process `pid` in this process's pid namespace?
fn same_pid_namespace(pid: i32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let ns = |p: &str| std::fs::metadata(format!("/proc/{p}/ns/pid")).ok().map(|m| (m.dev(), m.ino()));
    ns("self").is_some_and(|me| ns(&pid.to_string()) == Some(me))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shell that execs itself `n` times back to back, then sleeps.
    fn exec_chain(n: u32) -> std::process::Child {
        let script = r#"if [ "$1" -gt 0 ]; then exec /bin/sh -c "$0" "$0" $(($1 - 1)); fi; exec sleep 5"#;
        std::process::Command::new("/bin/sh").args(["-c", script, script, &n.to_string()]).spawn().expect("a shell runs")
    }

    /// An attach's image, read while the process execs again and again, is
    /// always a laid-out one, never one in the middle of an exec. (Read
    /// once, as the attach read it before: 306 to 341 of 2000 reads were
    /// zeros or half laid out here, 3 runs of 3.)
    #[test]
    fn an_image_read_during_an_exec_is_the_laid_out_one() {
        let mut chain = exec_chain(3000);
        let pid = chain.id() as i32;
        let mut reads = 0;
        let mut halfway = Vec::new();
        while reads < 2000 && chain.try_wait().unwrap().is_none() {
            if let Some(image) = laid_out(pid).filter(|i| !i.laid_out()) {
                halfway.push(image);
            }
            reads += 1;
            std::thread::sleep(Duration::from_micros(200));
        }
        let _ = chain.kill();
        let _ = chain.wait();
        assert!(reads > 500, "the shell ended after {reads} reads");
        assert!(
            halfway.is_empty(),
            "{} of {reads} reads were in the middle of an exec: {:?}",
            halfway.len(),
            &halfway[..halfway.len().min(3)]
        );
    }
}
