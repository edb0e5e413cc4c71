//! The program as witch's child: signals passed on, its end waited for.
//!
//! witch waits for the program and passes on the signals meant for it:
//! SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 always; SIGINT and SIGQUIT when they
//! were sent to witch by another process (`kill -INT`, `timeout
//! --foreground`). Ctrl-C and Ctrl-\\ on a terminal reach the program through
//! its process group already, so those are not passed on a second time.
//! (A signal sent to the whole process group by another process, with
//! `kill -INT -PGID`, does reach the program twice.)
//!
//! A program may make witch its tracer (`PTRACE_TRACEME` traces the calling
//! thread by its parent). witch then stands as a tracer that changes
//! nothing: each stop is resumed with the signal that caused it, so the
//! program runs as it would under a parent that is no debugger. A stop is
//! never mistaken for the program's end.

use std::sync::atomic::{AtomicI32, AtomicU8, Ordering};
use witchcraft::sys::inherited::Inherited;

static CHILD: AtomicI32 = AtomicI32::new(0);

/// What witch was started with that its runtime changed before `main`
/// (see [`witchcraft::sys::inherited`]), packed: bits 0-2 the closed
/// standard descriptors, bit 3 SIGPIPE ignored.
static INHERITED: AtomicU8 = AtomicU8::new(0);

/// Note what witch was started with: for `witch`'s constructor
/// (`main.rs`), which runs before the Rust runtime changes it.
pub fn note_inherited() {
    let i = Inherited::now();
    INHERITED.store(i.closed_std_fds | u8::from(i.sigpipe_ignored) << 3, Ordering::Relaxed);
}

/// What witch was started with (nothing to put back if not noted).
pub fn inherited() -> Inherited {
    let v = INHERITED.load(Ordering::Relaxed);
    Inherited { closed_std_fds: v & 7, sigpipe_ignored: v & 8 != 0 }
}

/// Have `cmd`'s program start as it would have without witch: with `i`
/// put back (closed standard descriptors closed, SIGPIPE ignored).
pub fn start_as_found(cmd: &mut std::process::Command, i: Inherited) {
    if !i.changed() {
        return;
    }
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec, where only
    // async-signal-safe work is allowed: `Inherited::restore` is.
    unsafe {
        cmd.pre_exec(move || {
            i.restore();
            Ok(())
        });
    }
}

extern "C" fn forward(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let pid = CHILD.load(Ordering::Relaxed);
    if pid <= 0 {
        return;
    }
    if (sig == libc::SIGINT || sig == libc::SIGQUIT) && !info.is_null() {
        // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
        let (code, from) = unsafe { ((*info).si_code, (*info).si_pid()) };
        // From the terminal (the program's process group got it too), or from the program itself.
        if code == libc::SI_KERNEL || (code <= 0 && from == pid) {
            return;
        }
    }
    // SAFETY: kill is async-signal-safe.
    unsafe { libc::kill(pid, sig) };
}

/// Passes signals sent to witch on to `pid` from now on.
pub fn forward_signals(pid: u32) {
    CHILD.store(pid as i32, Ordering::Relaxed);
    for sig in [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2] {
        // SAFETY: installs a handler that only reads an atomic and calls kill.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = forward as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// How the program ended: its exit code, or the signal that killed it.
pub struct ProgramExit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

/// Waits for `pid` to end, resuming every ptrace stop it makes witch see.
pub fn wait(pid: u32) -> std::io::Result<ProgramExit> {
    let pid = pid as libc::pid_t;
    loop {
        let mut st = 0;
        // SAFETY: plain waitpid on our own child.
        let r = unsafe { libc::waitpid(pid, &mut st, 0) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if libc::WIFEXITED(st) {
            return Ok(ProgramExit { code: Some(libc::WEXITSTATUS(st)), signal: None });
        }
        if libc::WIFSIGNALED(st) {
            return Ok(ProgramExit { code: None, signal: Some(libc::WTERMSIG(st)) });
        }
        if libc::WIFSTOPPED(st) {
            resume(pid, libc::WSTOPSIG(st));
        }
    }
}

/// Resumes a tracee stop as if nobody were tracing: a signal stop gets its
/// signal delivered; a group stop, and the SIGTRAP the kernel sends a
/// PTRACE_TRACEME tracee after each exec, get none.
fn resume(pid: libc::pid_t, sig: libc::c_int) {
    // SAFETY: siginfo_t is plain data; PTRACE_GETSIGINFO fills it or fails.
    let mut si: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `si` is a valid siginfo_t for the kernel to fill; `pid` is our
    // stopped tracee.
    let signal_stop = unsafe { libc::ptrace(libc::PTRACE_GETSIGINFO, pid, 0, &mut si as *mut libc::siginfo_t) } == 0;
    // The kernel's post-exec SIGTRAP reads as sent by the tracee to itself.
    // SAFETY: si_pid is valid for SI_USER signals, the only ones it is read for.
    let exec_trap = sig == libc::SIGTRAP && si.si_code == libc::SI_USER && {
        // SAFETY: SI_USER: the kernel filled the sender's pid.
        let from = unsafe { si.si_pid() };
        from == 0 || from == pid
    };
    let deliver = if signal_stop && !exec_trap { sig } else { 0 };
    // SAFETY: resumes our own tracee.
    unsafe { libc::ptrace(libc::PTRACE_CONT, pid, 0, deliver as libc::c_long) };
}

/// The program's exit code, or, if a signal ended it, die the same way so a
/// shell or CI sees what it would have without witch (128+N if we survive).
pub fn pass_through(code: Option<i32>, signal: Option<i32>) -> i32 {
    if let Some(c) = code {
        return c;
    }
    let sig = signal.unwrap_or(libc::SIGKILL);
    // SAFETY: plain libc calls on witch itself.
    unsafe {
        // The program already dumped its own core if it was going to.
        let core: libc::rlimit = std::mem::zeroed();
        libc::setrlimit(libc::RLIMIT_CORE, &core);
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
    }
    128 + sig
}

/// A line on a terminal's stderr while a long run goes on: elapsed time and
/// the processes whose profiles are under way and done. Silent unless stderr
/// is a terminal; cleared when dropped.
pub struct Progress {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    /// Starts after two seconds, then updates every second. The agent in each
    /// process makes its profile file when the process starts and fills it
    /// when it ends, so the parts directory tells how many there are.
    pub fn start(parts: &std::path::Path) -> Option<Progress> {
        let dir = parts.to_path_buf();
        Self::every_second(2.0, move |secs| {
            let (mut all, mut done) = (0, 0);
            for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if e.path().extension().is_some_and(|x| x == "json") {
                    all += 1;
                    done += usize::from(e.metadata().is_ok_and(|m| m.len() > 0));
                }
            }
            let procs = if all > 1 { format!(", {all} processes ({done} done)") } else { String::new() };
            format!("witch: profiling, {secs:.0} s{procs}")
        })
    }

    /// The line `line(seconds)` on a terminal's stderr, from `after` seconds
    /// on, renewed every second; nothing when stderr is no terminal.
    pub fn every_second(after: f64, line: impl Fn(f64) -> String + Send + 'static) -> Option<Progress> {
        use std::io::{IsTerminal, Write};
        if !std::io::stderr().is_terminal() {
            return None;
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("witch-progress".into())
            .spawn(move || {
                let t0 = std::time::Instant::now();
                let mut shown = false;
                while !s.load(Ordering::Relaxed) {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                    let secs = t0.elapsed().as_secs_f64();
                    if secs < after || !((secs * 5.0) as u64).is_multiple_of(5) {
                        continue;
                    }
                    let _ = write!(std::io::stderr(), "\r\x1b[K{}", line(secs));
                    shown = true;
                }
                if shown {
                    let _ = write!(std::io::stderr(), "\r\x1b[K");
                }
            })
            .ok()?;
        Some(Progress { stop, thread: Some(thread) })
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
