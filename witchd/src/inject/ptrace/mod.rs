//! One thread of the target, stopped with ptrace, made to call functions,
//! and let go exactly where it was.
//!
//! The thread is stopped with `PTRACE_SEIZE` + `PTRACE_INTERRUPT`, which
//! does not deliver a signal. If it was blocked in a system call, the call
//! was interrupted, and must go on as if nothing happened when the thread
//! is let go. The kernel restarts it by itself when the saved registers are
//! put back (`-ERESTART*`: the call is re-issued, a sleep with what was
//! left of it). Some calls return a plain `-EINTR` to any stop instead
//! (`epoll_wait`, `sigtimedwait`, `semop`, and socket calls on a socket
//! with a timeout, `SO_RCVTIMEO`/`SO_SNDTIMEO`): those are re-issued here,
//! as a debugger's "restart" does, unless a signal of the program's arrived
//! meanwhile (which would have interrupted them anyway). A call with a
//! timeout of its own then waits it again in full: late, never early.
//!
//! An injected call must leave the thread as it was even if the controller
//! dies during it (`kill -9` of `witch --pid`): the kernel then detaches,
//! and the thread runs on from wherever its registers point. So the call
//! returns into the C library's own signal return (`__restore_rt`), with a
//! signal frame written below it on the stack that holds the thread's
//! registers, vector state and signal mask as they were: the call ends in
//! `rt_sigreturn`, which puts all of them back by itself (an interrupted
//! system call re-issued, as above; one that would have continued its
//! remaining wait with `restart_syscall` then waits in full). While the
//! controller lives, it stops the thread at that `rt_sigreturn` (a
//! system-call stop) and puts the registers back itself, which continues
//! such a wait exactly. Results come back through memory, since the signal
//! return overwrites `rax`: through an argument the call writes, or, for
//! `dlerror`'s pointer, through a `mov %rax,(%rbx); pop %rbx; ret` found in
//! the C library that the call returns through before the signal return.
//! Only a C library without such code (or without a signal return) leaves
//! calls to return the older way, to address 0: a fault the controller
//! catches, and one a controller killed meanwhile leaves to the thread.
//!
//! The injected calls run on a thread stopped at an arbitrary point; if it
//! held a lock that `dlopen` or `malloc` needs, the call would deadlock. So
//! [`Tracee::stop_safely`] waits for a moment when the thread is in its own
//! code or blocked in a system call, not inside the C library or the loader.

mod access;
mod call;
#[cfg(test)]
mod tests;

use super::target::{not_permitted, SigReturn, Target};
use anyhow::{anyhow, bail, Result};
use std::cell::Cell;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use witchcraft::sys::procfs::{Of, ProcStatus};

/// Blocking calls a thread may be stopped in without holding a C library lock.
/// (read, poll, select, pause, nanosleep, accept, recvfrom, recvmsg,
/// semop, msgsnd, msgrcv, wait4, rt_sigtimedwait, rt_sigsuspend, io_getevents,
/// futex, semtimedop, clock_nanosleep, epoll_wait, waitid, pselect6, ppoll,
/// epoll_pwait, accept4, recvmmsg, epoll_pwait2: waits in the kernel.)
const BLOCKING_SYSCALLS: [i64; 26] =
    [0, 7, 23, 34, 35, 43, 45, 47, 65, 69, 70, 61, 128, 130, 208, 202, 220, 230, 232, 247, 270, 271, 281, 288, 299, 441];
/// Calls that return `-EINTR` (not `-ERESTART*`) when their thread is
/// stopped, and that did nothing when they do: epoll_wait, epoll_pwait,
/// epoll_pwait2, rt_sigtimedwait, semop, semtimedop, io_getevents; and, on
/// a socket with a timeout, read, write, readv, writev, sendto, recvfrom,
/// sendmsg, recvmsg, accept, accept4, recvmmsg, sendmmsg. Not `connect`
/// (interrupted, it goes on without the caller: a second call fails) nor
/// `close` (the descriptor is gone even when it says EINTR).
const EINTR_ON_STOP: [i64; 19] = [232, 281, 441, 128, 65, 220, 208, 0, 1, 19, 20, 44, 45, 46, 47, 43, 288, 299, 307];
/// Calls that replace the thread's signal mask while they wait: ppoll,
/// pselect6, epoll_pwait, epoll_pwait2, rt_sigsuspend, rt_sigtimedwait,
/// io_pgetevents.
const MASK_WHILE_WAITING: [i64; 7] = [271, 270, 281, 441, 130, 128, 333];
/// Stack a stopped thread must have free below its stack pointer for the
/// injected calls: the red zone, the signal frame that restores the thread
/// (with its XSAVE area: about 3 KiB with AVX-512, 11 KiB with AMX), and
/// what `dlopen` and the agent's start use. A first attach used 8.7 KiB in
/// all here, and a thread left 8 KiB was killed (SIGSEGV on its guard
/// page; `tests/tests/attach.rs`); this leaves room for a larger XSAVE area
/// and a deeper load.
const STACK_NEEDED: u64 = 32 << 10;
/// Longest an injected call may run.
const CALL_LIMIT: Duration = Duration::from_secs(30);
/// How long a call may wait on what cannot come before it is taken back
/// ([`Tracee::call_unless_stuck`]), and how often that is looked at.
pub const STUCK_PATIENCE: Duration = Duration::from_millis(500);
const STUCK_CHECK: Duration = Duration::from_millis(20);
/// `NT_X86_XSTATE`: the XSAVE area as a ptrace register set.
const NT_X86_XSTATE: libc::c_uint = 0x202;
/// Room for any XSAVE area (AVX-512 with AMX is about 11 KiB).
const XSTATE_MAX: usize = 16 << 10;
/// `FP_XSTATE_MAGIC1`/`2`: an XSAVE area in a signal frame.
const FP_XSTATE_MAGIC1: u32 = 0x4650_5853;
const FP_XSTATE_MAGIC2: u32 = 0x4650_5845;
/// `uc_flags`: the frame has XSAVE state, `ss` is valid and restored as is.
const UC_FP_XSTATE: u64 = 1;
const UC_SIGCONTEXT_SS: u64 = 2;
const UC_STRICT_RESTORE_SS: u64 = 4;
/// `struct rt_sigframe` without the state after it: the return address,
/// `struct ucontext` (304 bytes) and `struct siginfo` (128).
const SIGFRAME: usize = 8 + 304 + 128;
/// Where `uc_sigmask` is in a signal frame (after the return address,
/// `uc_flags`, `uc_link`, `uc_stack` and the 256-byte `sigcontext`).
const SIGMASK_AT: u64 = 8 + 8 + 8 + 24 + 256;
/// System call numbers: `rt_sigreturn`, `restart_syscall`.
const SYS_RT_SIGRETURN: u64 = 15;
const SYS_RESTART_SYSCALL: u64 = 219;
/// `-ERESTARTSYS`, `-ERESTARTNOINTR`, `-ERESTARTNOHAND`: re-issue the call.
const RESTART: [i64; 3] = [-512, -513, -514];
/// `-ERESTART_RESTARTBLOCK`: continue it with `restart_syscall`.
const RESTART_BLOCK: i64 = -516;
/// A system-call stop's signal with `PTRACE_O_TRACESYSGOOD`.
const SYSCALL_STOP: i32 = libc::SIGTRAP | 0x80;
/// What [`Tracee::wait_stop`] returns for a group-stop: the process was
/// stopped (SIGSTOP, job control) while the thread was traced.
const GROUP_STOP: i32 = -1;

/// An argument of an injected call.
pub enum Arg {
    Int(u64),
    /// Copied onto the thread's stack, passed as a pointer.
    Str(String),
    /// Two `int`s on the thread's stack with these values, passed as a
    /// pointer; their values after the call are returned with the result.
    Out([i32; 2]),
}

/// Where an injected call returns.
#[derive(Clone, Copy)]
pub enum Return {
    /// Into the C library's signal return, through a frame that puts the
    /// thread back as it was (see the module comment); `rax` is lost.
    Restore(SigReturn),
    /// As [`Return::Restore`], through a `mov %rax,(%rbx); pop %rbx; ret`
    /// at this address first, with `rbx` pointing at a word on the
    /// thread's stack: `rax` is kept there.
    RestoreKeeping(SigReturn, u64),
    /// To address 0, whose fault the controller catches: `rax` is kept,
    /// but a controller that dies during the call leaves the thread to
    /// that fault.
    Fault,
}

/// A call set up on a stopped thread.
#[derive(Clone, Copy)]
struct Call {
    /// The signal return it ends in, and the stack pointer just past the
    /// frame's return address (None: it returns to address 0).
    restorer: Option<(SigReturn, u64)>,
    /// Where the [`Arg::Out`] ints are, and their values before the call.
    out: Option<u64>,
    init: [i32; 2],
    /// Where `rax` is kept ([`Return::RestoreKeeping`]).
    rax_at: Option<u64>,
}

/// What a call gave back.
pub struct Called {
    /// `rax` (not with [`Return::Restore`]).
    pub rax: Option<u64>,
    /// The [`Arg::Out`] ints after the call (as passed if none).
    pub out: [i32; 2],
}

/// How the thread's registers are put back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ResumeFrom {
    /// From a ptrace stop outside any system call: the kernel then restarts
    /// an interrupted call itself.
    Own,
    /// From a signal frame: the kernel restarts nothing after
    /// `rt_sigreturn`, so a call it would restart is re-issued, and one
    /// that would continue a wait with `restart_syscall` waits in full.
    Frame,
    /// From the frame's `rt_sigreturn` stop, which is not made: as the
    /// kernel restarts a call (`restart_syscall` continuing a wait).
    Stop,
}

/// Where the thread is, as far as its injected calls go.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum CallState {
    /// Stopped with its own registers, or with ones that a resume replaces.
    Own,
    /// Running (or stopped inside) a call that returns into a restoring
    /// signal frame: let go, it puts itself back.
    Restoring,
    /// Running a [`Return::Fault`] call.
    Faulting,
    /// Stopped at the restoring frame's `rt_sigreturn` (system-call entry).
    AtSigreturn,
}

/// One thread of the target, stopped under ptrace.
pub struct Tracee {
    tid: i32,
    /// Its registers when it was stopped.
    saved: libc::user_regs_struct,
    /// Its floating-point and vector registers (the XSAVE area): the
    /// injected calls may use them, and the code it was stopped in may
    /// hold live values there.
    xstate: Vec<u8>,
    /// Stopped now (so registers can be read and set).
    stopped: Cell<bool>,
    /// A signal of the program's was delivered during an injected call.
    delivered: Cell<bool>,
    /// A signal was pending when it was stopped.
    pending: bool,
    /// Its blocked signals. Read when it is stopped, and again once it has
    /// left that stop: a thread stopped in `ppoll`, `pselect6`,
    /// `epoll_pwait`, `rt_sigsuspend` or `rt_sigtimedwait` shows the call's
    /// temporary mask until then, and its own only after.
    sigmask: Cell<u64>,
    /// The mask was read again after the thread left its stop.
    sigmask_settled: Cell<bool>,
    phase: Cell<CallState>,
}

impl Tracee {
    /// Seize a thread of `target` at a safe moment (see the module comment).
    pub fn stop_safely(target: &Target) -> Result<Tracee> {
        let pid = target.pid;
        let risky = target.risky_ranges();
        let private_wait = target.private_lock_wait();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut last_err = None;
        // The most stack a stopped thread had free, when none had enough.
        let mut cramped: Option<u64> = None;
        // Threads stopped on a stack not known to be a C stack.
        let mut unknown_stacks = 0;
        // Threads stopped and let go while blocked in a system call, and
        // where (call, arguments, stack pointer, code): not stopped again
        // while still there (each stop interrupts the call, and some are
        // re-issued with their full timeout). A running thread is tried
        // again each round.
        let mut refused: HashMap<i32, String> = HashMap::new();
        let mut past_deadline = false;
        loop {
            let any_ok = Instant::now() > deadline;
            if any_ok && !past_deadline {
                // Any moment will do now: only what was refused for its stack stays refused.
                past_deadline = true;
                refused.retain(|_, w| w.starts_with("stack "));
            }
            // Where each thread is, read without stopping it; threads whose
            // stop the kernel undoes exactly first, and the main thread first
            // among equals.
            let mut tids: Vec<(i32, String)> =
                witchcraft::sys::procfs::tasks(Some(pid)).into_iter().map(|t| (t, whereabouts(pid, t))).collect();
            if tids.is_empty() {
                bail!("no process with pid {pid}");
            }
            tids.retain(|(t, w)| (any_ok || worth_stopping(w)) && refused.get(t).is_none_or(|r| r.trim_start_matches("stack ") != w));
            tids.sort_by_key(|(t, w)| (reissued_in_full(w), *t != pid, *t));
            // Read once a thread is found (threads made since the target was
            // inspected have stacks its maps do not show).
            let mut maps = None;
            for (tid, was) in tids {
                match Tracee::seize(tid) {
                    Ok(t) => {
                        let in_syscall = t.saved.orig_rax as i64;
                        let rip = t.saved.rip;
                        // Waiting for one of the C library's own locks, it may
                        // hold another that the load needs: never then, not
                        // even past the deadline (it waits only briefly).
                        let in_private_wait = in_syscall == libc::SYS_futex && private_wait.is_some_and(|(a, b)| a <= rip && rip < b);
                        let safe = if in_syscall >= 0 {
                            BLOCKING_SYSCALLS.contains(&in_syscall)
                        } else {
                            !risky.iter().any(|&(a, b)| a <= rip && rip < b)
                        };
                        if (safe || any_ok) && !in_private_wait {
                            // Only on a C stack, and never on one too small
                            // for the calls: they would write past its end (a
                            // guard page: the program dies of SIGSEGV; else,
                            // whatever lies below, such as another
                            // goroutine's stack in a Go program).
                            let maps = maps.get_or_insert_with(|| witchcraft::sys::procfs::read_maps(Some(pid)).unwrap_or_default());
                            match super::target::c_stack_room(maps, t.saved.rsp, t.saved.fs_base) {
                                Some(room) if room >= STACK_NEEDED => return Ok(t),
                                Some(room) => cramped = Some(cramped.map_or(room, |c| c.max(room))),
                                None => unknown_stacks += 1,
                            }
                            if blocked_in(&was).is_some() {
                                refused.insert(tid, format!("stack {was}"));
                            }
                        } else if blocked_in(&was).is_some() {
                            refused.insert(tid, was);
                        }
                        t.resume();
                    }
                    Err(e) => {
                        if e.downcast_ref::<Refused>().is_some() {
                            return Err(not_permitted(pid));
                        }
                        if e.downcast_ref::<Stopped>().is_some() {
                            return Err(e.context(format!("cannot profile pid {pid}")));
                        }
                        last_err = Some(e);
                    }
                }
            }
            if !super::target::alive(pid) {
                bail!("no process with pid {pid}");
            }
            if any_ok {
                if let Some(room) = cramped {
                    bail!(
                        "no thread of pid {pid} has the {} KiB of stack the agent's load needs (the most free: {} KiB); the process was left as it was",
                        STACK_NEEDED >> 10,
                        room >> 10
                    );
                }
                if unknown_stacks > 0 {
                    bail!(
                        "no thread of pid {pid} was found on a stack the C library made for it: its threads ran on stacks of their own (a language runtime's, such as Go's goroutines, or coroutines'), below which the agent's load would write over other data; the process was left as it was"
                    );
                }
                return Err(last_err.unwrap_or_else(|| anyhow!("could not stop any thread of pid {pid}")));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn seize(tid: i32) -> Result<Tracee> {
        // SAFETY: ptrace requests on a thread id; failures are reported.
        unsafe {
            if libc::ptrace(libc::PTRACE_SEIZE, tid, 0, libc::PTRACE_O_TRACESYSGOOD) != 0 {
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
        let mut t = Tracee {
            tid,
            // SAFETY: user_regs_struct is plain data.
            saved: unsafe { std::mem::zeroed() },
            xstate: Vec::new(),
            stopped: Cell::new(false),
            delivered: Cell::new(false),
            pending: false,
            sigmask: Cell::new(0),
            sigmask_settled: Cell::new(false),
            phase: Cell::new(CallState::Own),
        };
        // The interrupt's stop may come after a signal-delivery stop: the
        // thread was about to take one of the program's signals. Resuming it
        // with no signal would discard that signal, so it is delivered (the
        // program's handler runs) and the interrupt's stop follows.
        let mut stops = 0;
        loop {
            match t.wait_stop(Duration::from_secs(5)) {
                Err(e) => {
                    // SAFETY: as above.
                    unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0) };
                    return Err(e);
                }
                Ok(0) => break,
                Ok(GROUP_STOP) => {
                    // Stopped meanwhile (or already): it stays stopped, untouched.
                    // SAFETY: as above.
                    unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0) };
                    return Err(Stopped.into());
                }
                Ok(sig) if stops < 64 => {
                    stops += 1;
                    // SAFETY: resumes our stopped tracee, delivering its own signal.
                    if unsafe { libc::ptrace(libc::PTRACE_CONT, tid, 0, sig) } != 0 {
                        // SAFETY: as above.
                        unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, sig) };
                        bail!("cannot resume thread {tid}: {}", std::io::Error::last_os_error());
                    }
                    t.stopped.set(false);
                }
                Ok(sig) => {
                    // SAFETY: as above; the signal goes with the detach.
                    unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, sig) };
                    bail!("thread {tid} keeps taking signals; not stopped");
                }
            }
        }
        t.saved = t.regs()?;
        t.xstate = t.get_xstate()?;
        let (pending, mask) = signals(tid);
        t.pending = pending;
        t.sigmask.set(mask);
        Ok(t)
    }

    /// Wait for the next stop: the signal of a signal-delivery stop,
    /// [`GROUP_STOP`] for a group-stop, 0 for any other stop.
    fn wait_stop(&self, timeout: Duration) -> Result<i32> {
        self.try_wait_stop(timeout)?.ok_or_else(|| anyhow!("thread {} did not stop", self.tid))
    }

    /// As [`Tracee::wait_stop`], with None when `timeout` passed first.
    fn try_wait_stop(&self, timeout: Duration) -> Result<Option<i32>> {
        let until = Instant::now() + timeout;
        loop {
            let mut status = 0;
            // SAFETY: waits for our tracee; `status` is a valid int.
            let r = unsafe { libc::waitpid(self.tid, &mut status, libc::__WALL | libc::WNOHANG) };
            if r == self.tid {
                if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                    bail!("thread {} exited", self.tid);
                }
                if libc::WIFSTOPPED(status) {
                    self.stopped.set(true);
                    // PTRACE_EVENT_STOP: an interrupt's stop (SIGTRAP), or a
                    // group-stop (a stop signal's).
                    if (status >> 16) & 0xff == libc::PTRACE_EVENT_STOP {
                        let stop_signal = [libc::SIGSTOP, libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU].contains(&libc::WSTOPSIG(status));
                        return Ok(Some(if stop_signal { GROUP_STOP } else { 0 }));
                    }
                    return Ok(Some(libc::WSTOPSIG(status)));
                }
            } else if r < 0 {
                bail!("waiting for thread {}: {}", self.tid, std::io::Error::last_os_error());
            }
            if Instant::now() > until {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// The registers the thread goes on with: its own, with a system call
    /// that returned `-EINTR` to the stop re-issued (see the module
    /// comment), and as `how` says.
    fn resumed(&self, how: ResumeFrom) -> libc::user_regs_struct {
        let mut r = self.saved;
        let (nr, rv) = (r.orig_rax as i64, r.rax as i64);
        let restart = nr >= 0 && (RESTART.contains(&rv) || rv == RESTART_BLOCK);
        if self.eintr_again() || (how != ResumeFrom::Own && restart) {
            r.rax = if how == ResumeFrom::Stop && rv == RESTART_BLOCK { SYS_RESTART_SYSCALL } else { r.orig_rax };
            r.rip -= 2;
        }
        r
    }

    /// The thread's system call returned `-EINTR` to the stop, did nothing,
    /// and no signal of the program's came meanwhile: re-issue it.
    fn eintr_again(&self) -> bool {
        let (nr, rv) = (self.saved.orig_rax as i64, self.saved.rax as i64);
        nr >= 0 && rv == -(libc::EINTR as i64) && EINTR_ON_STOP.contains(&nr) && !self.pending && !self.delivered.get() && {
            let mut insn = [0u8; 2];
            super::target::read_memory(self.tid, self.saved.rip.wrapping_sub(2), &mut insn) && insn == [0x0f, 0x05]
        }
    }

    /// Let the thread go on from where it was stopped (see the module
    /// comment). A thread in a call that restores itself is just let go; at
    /// that call's `rt_sigreturn`, its registers are put back here instead
    /// (the system call it was in made now, `restart_syscall` for one that
    /// continues a wait); otherwise they are put back as they were.
    pub fn resume(&self) {
        let mut sig = 0;
        if !self.stopped.get() {
            // SAFETY: stop our tracee to put its registers back.
            unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, self.tid, 0, 0) };
            match self.wait_stop(Duration::from_secs(5)) {
                // A group-stop stays after the detach by itself.
                Ok(s) => sig = if s == SYSCALL_STOP || s == GROUP_STOP { 0 } else { s },
                Err(_) => {
                    // SAFETY: detach whatever its state; nothing better is possible.
                    unsafe { libc::ptrace(libc::PTRACE_DETACH, self.tid, 0, 0) };
                    return;
                }
            }
        }
        match self.phase.get() {
            CallState::Restoring => {}
            CallState::AtSigreturn => {
                // At the entry of the frame's `rt_sigreturn`, which is not
                // made (-1); the thread's own call goes on from user mode,
                // as the kernel restarts one.
                let mut r = self.resumed(ResumeFrom::Stop);
                r.orig_rax = u64::MAX;
                let _ = self.set_regs(&r);
                let _ = self.set_xstate();
            }
            CallState::Own | CallState::Faulting => {
                let _ = self.set_regs(&self.resumed(ResumeFrom::Own));
                let _ = self.set_xstate();
                if sig == libc::SIGSEGV && self.phase.get() == CallState::Faulting {
                    sig = 0; // the call's own return to address 0
                }
            }
        }
        // SAFETY: detaches our stopped tracee, passing on a signal of the
        // program's it stopped with (0: none).
        unsafe { libc::ptrace(libc::PTRACE_DETACH, self.tid, 0, sig) };
    }
}

/// Where thread `tid` of `pid` is, from `/proc/PID/task/TID/syscall`, read
/// without stopping it: "running", "-1 SP PC" (in its own code, not
/// running), or "NR ARGS... SP PC" (blocked in system call NR).
fn whereabouts(pid: i32, tid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).map(|s| s.trim().to_string()).unwrap_or_default()
}

/// The system call a thread is blocked in, from its [`whereabouts`].
fn blocked_in(whereabouts: &str) -> Option<i64> {
    whereabouts.split_whitespace().next()?.parse().ok().filter(|&nr| nr >= 0)
}

/// Is a thread there worth stopping? Not one blocked in a call that may
/// hold a lock the injected calls need (or that is not known to hold
/// none): stopping it would only interrupt its call.
fn worth_stopping(whereabouts: &str) -> bool {
    blocked_in(whereabouts).is_none_or(|nr| BLOCKING_SYSCALLS.contains(&nr))
}

/// Would a stop there re-issue the thread's call, with its timeout in
/// full (see the module comment)? Such a thread is stopped only when no
/// other will do.
fn reissued_in_full(whereabouts: &str) -> bool {
    blocked_in(whereabouts)
        .is_some_and(|nr| EINTR_ON_STOP.contains(&nr) && ![0, 1, 19, 20, 43, 44, 45, 46, 47, 288, 299, 307].contains(&nr))
}

/// Does thread `tid` have a signal pending that it does not block, and
/// which signals does it block?
fn signals(tid: i32) -> (bool, u64) {
    let Ok(s) = ProcStatus::read(Of::Process(tid)) else { return (false, 0) };
    let blocked = s.blocked.unwrap_or(0);
    ((s.pending.unwrap_or(0) | s.shared_pending.unwrap_or(0)) & !blocked != 0, blocked)
}

/// The process was stopped (SIGSTOP, job control) while witch attached.
#[derive(Debug)]
pub struct Stopped;

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "it was stopped (SIGSTOP or job control) while witch attached; it stays stopped: continue it (kill -CONT) and attach again",
        )
    }
}

impl std::error::Error for Stopped {}

/// An injected call was taken back: it waited on what could not come
/// ([`Tracee::call_unless_stuck`]).
#[derive(Debug)]
pub struct Stuck;

impl std::fmt::Display for Stuck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the injected call waited on what could not come, and was taken back")
    }
}

impl std::error::Error for Stuck {}

/// ptrace was refused (permissions).
#[derive(Debug)]
struct Refused;

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ptrace refused")
    }
}

impl std::error::Error for Refused {}
