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

use super::target::{not_permitted, SigReturn, Target};
use anyhow::{anyhow, bail, Result};
use std::cell::Cell;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use witchcraft::sys::procfs::{Of, Status};

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
enum Resume {
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
enum Phase {
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
    phase: Cell<Phase>,
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
            phase: Cell::new(Phase::Own),
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

    fn regs(&self) -> Result<libc::user_regs_struct> {
        // SAFETY: user_regs_struct is plain data.
        let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        // SAFETY: fills `r` from a stopped tracee.
        if unsafe { libc::ptrace(libc::PTRACE_GETREGS, self.tid, 0, &mut r as *mut _) } != 0 {
            bail!("cannot read registers of thread {}: {}", self.tid, std::io::Error::last_os_error());
        }
        Ok(r)
    }

    /// The XSAVE area (x87, SSE, AVX... state).
    fn get_xstate(&self) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; XSTATE_MAX];
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() };
        // SAFETY: the kernel writes at most `iov_len` bytes into `buf` and sets `iov_len`.
        if unsafe { libc::ptrace(libc::PTRACE_GETREGSET, self.tid, NT_X86_XSTATE, &mut iov as *mut libc::iovec) } != 0 {
            bail!("cannot read the vector registers of thread {}: {}", self.tid, std::io::Error::last_os_error());
        }
        buf.truncate(iov.iov_len);
        Ok(buf)
    }

    fn set_xstate(&self) -> Result<()> {
        let mut buf = self.xstate.clone();
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() };
        // SAFETY: the kernel reads `iov_len` bytes from `buf`.
        if unsafe { libc::ptrace(libc::PTRACE_SETREGSET, self.tid, NT_X86_XSTATE, &mut iov as *mut libc::iovec) } != 0 {
            bail!("cannot restore the vector registers of thread {}: {}", self.tid, std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn set_regs(&self, r: &libc::user_regs_struct) -> Result<()> {
        // SAFETY: reads `r` into a stopped tracee.
        if unsafe { libc::ptrace(libc::PTRACE_SETREGS, self.tid, 0, r as *const _) } != 0 {
            bail!("cannot set registers of thread {}: {}", self.tid, std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<()> {
        let local = libc::iovec { iov_base: data.as_ptr() as *mut _, iov_len: data.len() };
        let remote = libc::iovec { iov_base: addr as *mut _, iov_len: data.len() };
        // SAFETY: `local` describes `data`; the kernel checks the remote side.
        let n = unsafe { libc::process_vm_writev(self.tid, &local, 1, &remote, 1, 0) };
        if n != data.len() as isize {
            bail!("cannot write the target's memory: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// A NUL-terminated string of the target's (at most 512 bytes).
    pub fn read_cstr(&self, addr: u64) -> String {
        if addr == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; 512];
        if !super::target::read_memory(self.tid, addr, &mut buf) {
            return String::new();
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    }

    /// Was it stopped in a call that waits with a signal mask of its own?
    /// Its own mask is then known only once it has left the stop (see
    /// `sigmask`), so a first call that makes a system call at once (e.g.
    /// `getpid`) narrows the moment when a frame holds the wrong one to a
    /// few instructions.
    pub fn in_mask_call(&self) -> bool {
        MASK_WHILE_WAITING.contains(&(self.saved.orig_rax as i64))
    }

    /// Call `f(args...)` on the stopped thread, returning as `ret` says.
    pub fn call(&self, f: u64, args: &[Arg], ret: Return) -> Result<Called> {
        let call = self.start(f, args, ret)?;
        self.finish(&call, None)
    }

    /// As [`Tracee::call`], but the call is given up if `stuck` says, for
    /// [`STUCK_PATIENCE`] in a row, that it waits on something that cannot
    /// come (its argument: this thread's id). The thread is then stopped
    /// where it waits, with [`Stuck`] returned: [`Tracee::resume`] puts
    /// its registers back as they were before the call (as from its first
    /// stop: an interrupted system call of its own restarts), as if the
    /// call had never been made. Only for a call that, where `stuck` says
    /// so, holds nothing and has changed nothing that the caller does not
    /// put back.
    pub fn call_unless_stuck(&self, f: u64, args: &[Arg], ret: Return, stuck: &dyn Fn(i32) -> bool) -> Result<Called> {
        let call = self.start(f, args, ret)?;
        self.finish(&call, Some(stuck))
    }

    /// Where the call's data and frames may be: the stack below the
    /// thread's own stack pointer.
    pub fn below_stack_pointer(&self) -> std::ops::Range<u64> {
        self.saved.rsp.saturating_sub(1 << 20)..self.saved.rsp
    }

    /// The thread's pointer (`fs_base`): its control block, its static TLS below.
    pub fn thread_pointer(&self) -> u64 {
        self.saved.fs_base
    }

    /// Stop a running call's thread where it is and take the call back:
    /// [`Tracee::resume`] then puts the thread's own registers back.
    fn take_back(&self) -> Result<()> {
        // SAFETY: stops our tracee (it is running the call).
        unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, self.tid, 0, 0) };
        loop {
            match self.wait_stop(Duration::from_secs(5))? {
                // The call's system call ending (its exit stop comes before
                // the interrupt's), or the interrupt's stop.
                s if s == SYSCALL_STOP || s == 0 => break,
                GROUP_STOP => return Err(Stopped.into()),
                s => {
                    // A signal of the program's: delivered (its handler runs
                    // on the call's stack, as on any), then the interrupt's stop.
                    self.delivered.set(true);
                    // SAFETY: resumes our stopped tracee with that signal.
                    if unsafe { libc::ptrace(libc::PTRACE_CONT, self.tid, 0, s) } != 0 {
                        bail!("cannot resume thread {}: {}", self.tid, std::io::Error::last_os_error());
                    }
                    self.stopped.set(false);
                }
            }
        }
        self.phase.set(Phase::Own);
        Ok(())
    }

    /// Set the thread up to call `f(args...)`; it runs once resumed.
    fn start(&self, f: u64, args: &[Arg], ret: Return) -> Result<Call> {
        // Below the red zone; data first, then (restoring) the XSAVE area
        // and the signal frame, then the return address.
        let mut sp = (self.saved.rsp - 1024) & !0x3f;
        let mut ints = Vec::new();
        let mut out = None;
        let mut init = [0i32; 2];
        for a in args {
            let bytes = match a {
                Arg::Int(v) => {
                    ints.push(*v);
                    continue;
                }
                Arg::Str(s) => {
                    let mut b = s.as_bytes().to_vec();
                    b.push(0);
                    b
                }
                Arg::Out(v) => {
                    init = *v;
                    v.iter().flat_map(|i| i.to_le_bytes()).collect()
                }
            };
            sp = (sp - bytes.len() as u64) & !0xf;
            self.write(sp, &bytes)?;
            if matches!(a, Arg::Out(_)) {
                out = Some(sp);
            }
            ints.push(sp);
        }
        let rax_at = match ret {
            Return::RestoreKeeping(..) => {
                sp -= 16;
                self.write(sp, &0u64.to_le_bytes())?;
                Some(sp)
            }
            _ => None,
        };
        let restorer = match ret {
            Return::Restore(sr) | Return::RestoreKeeping(sr, _) => {
                let Some(x) = signal_xstate(&self.xstate) else {
                    bail!("the vector registers of thread {} are in a layout witch does not know", self.tid);
                };
                let fp = (sp - x.len() as u64) & !0x3f;
                self.write(fp, &x)?;
                // At `f`'s entry rsp + 8 is 16-byte aligned; its `ret` leaves
                // rsp just past the return address, where the kernel expects
                // the frame's `ucontext`.
                let frame = ((fp - SIGFRAME as u64) & !0xf) - 8;
                let regs = self.resumed(Resume::Frame);
                self.write(frame, &sigframe(sr.start, &regs, self.sigmask.get(), fp))?;
                sp = frame;
                if let Return::RestoreKeeping(_, store_rax) = ret {
                    // `f` returns to the store, whose `pop` takes a word and
                    // whose `ret` goes on to the frame's return address, as
                    // above; rsp + 8 stays aligned at `f`'s entry.
                    sp -= 16;
                    self.write(sp, &[store_rax.to_le_bytes(), [0; 8]].concat())?;
                }
                Some((sr, frame + 8))
            }
            Return::Fault => {
                sp -= 8;
                self.write(sp, &0u64.to_le_bytes())?;
                None
            }
        };
        let mut r = self.saved;
        r.rsp = sp;
        r.rip = f;
        r.rax = 0;
        r.orig_rax = u64::MAX; // no system call to restart (or, at a system-call stop, to make)
        if let Some(at) = rax_at {
            r.rbx = at; // callee-saved: still there for the store
        }
        let regs = [&mut r.rdi, &mut r.rsi, &mut r.rdx, &mut r.rcx, &mut r.r8, &mut r.r9];
        for (slot, v) in regs.into_iter().zip(ints) {
            *slot = v;
        }
        self.set_regs(&r)?;
        self.phase.set(if restorer.is_some() { Phase::Restoring } else { Phase::Faulting });
        Ok(Call { restorer, out, init, rax_at })
    }

    /// Run a call that [`Tracee::start`] set up until it returns.
    fn finish(&self, call: &Call, stuck: Option<&dyn Fn(i32) -> bool>) -> Result<Called> {
        let Call { restorer, out, init, rax_at } = *call;
        let read_word = |at: u64| {
            let mut v = [0u8; 8];
            super::target::read_memory(self.tid, at, &mut v).then_some(v)
        };
        let read_out = || match out.and_then(read_word) {
            Some(v) => {
                [i32::from_le_bytes(v[..4].try_into().unwrap_or_default()), i32::from_le_bytes(v[4..].try_into().unwrap_or_default())]
            }
            None => init,
        };
        let mut sig = 0;
        let until = Instant::now() + CALL_LIMIT;
        // Since when `stuck` has said so without a break.
        let mut stuck_since: Option<Instant> = None;
        loop {
            // SAFETY: resumes our stopped tracee to its next system call or
            // signal, delivering `sig` (0: none).
            if unsafe { libc::ptrace(libc::PTRACE_SYSCALL, self.tid, 0, sig) } != 0 {
                bail!("cannot resume thread {}: {}", self.tid, std::io::Error::last_os_error());
            }
            self.stopped.set(false);
            let s = loop {
                let left = until.saturating_duration_since(Instant::now());
                let Some(stuck) = stuck else { break self.wait_stop(left)? };
                if let Some(s) = self.try_wait_stop(left.min(STUCK_CHECK))? {
                    break s;
                }
                if left.is_zero() {
                    bail!("thread {} did not stop", self.tid);
                }
                if !stuck(self.tid) {
                    stuck_since = None;
                } else if stuck_since.get_or_insert_with(Instant::now).elapsed() >= STUCK_PATIENCE {
                    self.take_back()?;
                    return Err(Stuck.into());
                }
            };
            sig = 0;
            if s == SYSCALL_STOP {
                if let Some((sr, past_ret)) = restorer {
                    if !self.sigmask_settled.get() {
                        // Out of its stop now: the mask is its own (see `sigmask`).
                        self.sigmask_settled.set(true);
                        let (_, mask) = signals(self.tid);
                        if mask != self.sigmask.get() {
                            self.sigmask.set(mask);
                            self.write(past_ret - 8 + SIGMASK_AT, &mask.to_le_bytes())?;
                        }
                    }
                    let now = self.regs()?;
                    if now.orig_rax == SYS_RT_SIGRETURN && now.rip == sr.after && now.rsp == past_ret {
                        self.phase.set(Phase::AtSigreturn);
                        let rax = rax_at.map(|at| read_word(at).map_or(0, u64::from_le_bytes));
                        return Ok(Called { rax, out: read_out() });
                    }
                }
                continue;
            }
            if s == libc::SIGSEGV && restorer.is_none() {
                let now = self.regs()?;
                if now.rip == 0 {
                    let out = read_out();
                    self.set_regs(&self.saved)?;
                    self.phase.set(Phase::Own);
                    return Ok(Called { rax: Some(now.rax), out });
                }
            }
            if s == GROUP_STOP {
                if restorer.is_some() {
                    // The process was stopped (a stop signal passed on
                    // below): left stopped, the thread finishes the call
                    // and puts itself back once continued.
                    return Err(Stopped.into());
                }
                // A call returning to address 0 cannot be left: it goes
                // on, and the detach stops the thread again.
                continue;
            }
            // A signal for the program (a stop signal too): pass it on.
            if s != 0 {
                sig = s;
                self.delivered.set(true);
            }
        }
    }

    /// The registers the thread goes on with: its own, with a system call
    /// that returned `-EINTR` to the stop re-issued (see the module
    /// comment), and as `how` says.
    fn resumed(&self, how: Resume) -> libc::user_regs_struct {
        let mut r = self.saved;
        let (nr, rv) = (r.orig_rax as i64, r.rax as i64);
        let restart = nr >= 0 && (RESTART.contains(&rv) || rv == RESTART_BLOCK);
        if self.eintr_again() || (how != Resume::Own && restart) {
            r.rax = if how == Resume::Stop && rv == RESTART_BLOCK { SYS_RESTART_SYSCALL } else { r.orig_rax };
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
            Phase::Restoring => {}
            Phase::AtSigreturn => {
                // At the entry of the frame's `rt_sigreturn`, which is not
                // made (-1); the thread's own call goes on from user mode,
                // as the kernel restarts one.
                let mut r = self.resumed(Resume::Stop);
                r.orig_rax = u64::MAX;
                let _ = self.set_regs(&r);
                let _ = self.set_xstate();
            }
            Phase::Own | Phase::Faulting => {
                let _ = self.set_regs(&self.resumed(Resume::Own));
                let _ = self.set_xstate();
                if sig == libc::SIGSEGV && self.phase.get() == Phase::Faulting {
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

/// The XSAVE area as a signal frame holds it: ptrace gives the
/// standard-format area with the enabled features (XCR0) in bytes 464-471;
/// a frame has the kernel's software words there instead (`struct
/// _fpx_sw_bytes`: magic, sizes, features) and `FP_XSTATE_MAGIC2` right
/// after the area. The area ends with the last enabled feature in the
/// processor's standard layout (CPUID leaf 0xD), leaving out AMX tile data
/// (feature 18) unless the thread uses it, since a process that never
/// asked for AMX has no room for it and the kernel would refuse the whole
/// area (restoring only x87 and SSE state). None: not an XSAVE area.
fn signal_xstate(ptrace_area: &[u8]) -> Option<Vec<u8>> {
    const LEGACY_AND_HEADER: usize = 576;
    const AMX_TILE_DATA: u32 = 18;
    if ptrace_area.len() < LEGACY_AND_HEADER {
        return None;
    }
    let word = |at: usize| u64::from_le_bytes(ptrace_area[at..at + 8].try_into().unwrap_or_default());
    let (enabled, in_use) = (word(464), word(512));
    let mut features = enabled & !(1 << AMX_TILE_DATA) | (in_use & (1 << AMX_TILE_DATA));
    let mut size = LEGACY_AND_HEADER;
    for f in 2..63u32 {
        if features & (1 << f) == 0 {
            continue;
        }
        let leaf = std::arch::x86_64::__cpuid_count(0xd, f);
        let end = (leaf.ebx + leaf.eax) as usize;
        if leaf.ecx & 1 != 0 || end > ptrace_area.len() {
            features &= !(1 << f); // a supervisor feature, or one ptrace gave no room for
            continue;
        }
        size = size.max(end);
    }
    let mut x = ptrace_area[..size].to_vec();
    x[464..468].copy_from_slice(&FP_XSTATE_MAGIC1.to_le_bytes());
    x[468..472].copy_from_slice(&(size as u32 + 4).to_le_bytes()); // extended_size
    x[472..480].copy_from_slice(&features.to_le_bytes());
    x[480..484].copy_from_slice(&(size as u32).to_le_bytes()); // xstate_size
    x[484..512].fill(0);
    x.extend_from_slice(&FP_XSTATE_MAGIC2.to_le_bytes());
    Some(x)
}

/// A signal frame (`struct rt_sigframe`) whose `rt_sigreturn` resumes
/// `r` with signal mask `mask` and the XSAVE area at `fpstate`; its first
/// word is the return address `restorer`. The alternate signal stack is
/// left as it is (`uc_stack` holds flags the kernel refuses, which
/// `rt_sigreturn` ignores): another thread's can't be read.
fn sigframe(restorer: u64, r: &libc::user_regs_struct, mask: u64, fpstate: u64) -> Vec<u8> {
    let mut f = Vec::with_capacity(SIGFRAME);
    let mut put = |v: u64| f.extend_from_slice(&v.to_le_bytes());
    put(restorer);
    // struct ucontext
    put(UC_FP_XSTATE | UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS); // uc_flags
    put(0); // uc_link
    put(0); // uc_stack.ss_sp
    put(3); // uc_stack.ss_flags: neither 0, SS_ONSTACK nor SS_DISABLE
    put(0); // uc_stack.ss_size
            // struct sigcontext
    for v in [r.r8, r.r9, r.r10, r.r11, r.r12, r.r13, r.r14, r.r15, r.rdi, r.rsi, r.rbp, r.rbx, r.rdx, r.rax, r.rcx, r.rsp, r.rip, r.eflags]
    {
        put(v);
    }
    put((r.cs & 0xffff) | ((r.ss & 0xffff) << 48)); // cs, gs, fs, ss
    put(0); // err
    put(0); // trapno
    put(mask); // oldmask
    put(0); // cr2
    put(fpstate);
    for _ in 0..8 {
        put(0); // reserved
    }
    put(mask); // uc_sigmask
    f.resize(SIGFRAME, 0); // struct siginfo
    f
}

/// Does thread `tid` have a signal pending that it does not block, and
/// which signals does it block?
fn signals(tid: i32) -> (bool, u64) {
    let Ok(s) = Status::read(Of::Process(tid)) else { return (false, 0) };
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Child, Command};

    /// A shell waiting in `wait4` for a `sleep`, then exiting 7, with its
    /// C library's `getpid` and `usleep`.
    fn waiting_shell() -> (Child, Target, u64, u64) {
        let child = Command::new("/bin/sh").args(["-c", "sleep 0.5; exit 7"]).spawn().expect("a shell runs");
        std::thread::sleep(Duration::from_millis(150));
        let target = Target::inspect(child.id() as i32).expect("the shell can be inspected");
        let libc = target.object(super::super::target::is_c_library).expect("the shell maps the C library").clone();
        let [Some(getpid), Some(usleep)] = target.symbols(&libc, &["getpid", "usleep"]).unwrap()[..] else {
            panic!("the C library has getpid and usleep")
        };
        (child, target, getpid, usleep)
    }

    fn restoring(target: &Target) -> (Return, Return) {
        let code = target.return_code();
        let sr = code.sigreturn.expect("the C library has a signal return");
        let store = code.store_rax.expect("the C library has a mov %rax,(%rbx); pop %rbx; ret");
        (Return::Restore(sr), Return::RestoreKeeping(sr, store))
    }

    #[test]
    fn a_kept_result_comes_back_through_memory_and_the_thread_goes_on() {
        let (mut child, target, getpid, _) = waiting_shell();
        let (_, keeping) = restoring(&target);
        let t = Tracee::stop_safely(&target).unwrap();
        let called = t.call(getpid, &[], keeping).unwrap();
        assert_eq!(called.rax, Some(child.id() as u64));
        t.resume();
        assert_eq!(child.wait().unwrap().code(), Some(7), "the shell's wait went on");
    }

    /// What a controller killed during a call leaves: the kernel detaches,
    /// and the thread runs on from the call.
    #[test]
    fn a_call_whose_controller_is_gone_puts_the_thread_back_itself() {
        for keep in [false, true] {
            let (mut child, target, _, usleep) = waiting_shell();
            let (restore, keeping) = restoring(&target);
            let t = Tracee::stop_safely(&target).unwrap();
            t.start(usleep, &[Arg::Int(20_000)], if keep { keeping } else { restore }).unwrap();
            // SAFETY: detaches our stopped tracee, as the kernel does when its tracer dies.
            assert_eq!(unsafe { libc::ptrace(libc::PTRACE_DETACH, t.tid, 0, 0) }, 0);
            let status = child.wait().unwrap();
            assert_eq!((status.code(), status.signal()), (Some(7), None), "keeping rax: {keep}");
        }
    }
}
