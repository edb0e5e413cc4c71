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
//! The injected calls run on a thread stopped at an arbitrary point; if it
//! held a lock that `dlopen` or `malloc` needs, the call would deadlock. So
//! [`Tracee::stop_safely`] waits for a moment when the thread is in its own
//! code or blocked in a system call, not inside the C library or the loader.

use super::target::{not_permitted, Target};
use anyhow::{anyhow, bail, Result};
use std::cell::Cell;
use std::time::{Duration, Instant};

/// Blocking calls a thread may be stopped in without holding a C library lock.
const BLOCKING_SYSCALLS: [i64; 20] = [0, 7, 23, 34, 35, 43, 45, 47, 61, 128, 130, 202, 230, 232, 247, 270, 271, 281, 288, 441];
/// Calls that return `-EINTR` (not `-ERESTART*`) when their thread is
/// stopped, and that did nothing when they do: epoll_wait, epoll_pwait,
/// epoll_pwait2, rt_sigtimedwait, semop, semtimedop, io_getevents; and, on
/// a socket with a timeout, read, write, readv, writev, sendto, recvfrom,
/// sendmsg, recvmsg, accept, accept4, recvmmsg, sendmmsg. Not `connect`
/// (interrupted, it goes on without the caller: a second call fails) nor
/// `close` (the descriptor is gone even when it says EINTR).
const EINTR_ON_STOP: [i64; 19] = [232, 281, 441, 128, 65, 220, 208, 0, 1, 19, 20, 44, 45, 46, 47, 43, 288, 299, 307];
/// Longest an injected call may run.
const CALL_LIMIT: Duration = Duration::from_secs(30);
/// `NT_X86_XSTATE`: the XSAVE area as a ptrace register set.
const NT_X86_XSTATE: libc::c_uint = 0x202;
/// Room for any XSAVE area (AVX-512 with AMX is about 11 KiB).
const XSTATE_MAX: usize = 16 << 10;

/// An argument of an injected call.
pub enum Arg {
    Int(u64),
    /// Copied onto the thread's stack, passed as a pointer.
    Str(String),
    /// A zeroed `int` on the thread's stack, passed as a pointer; its value
    /// after the call is returned with the result.
    OutInt,
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
}

impl Tracee {
    /// Seize a thread of `target` at a safe moment (see the module comment).
    pub fn stop_safely(target: &Target) -> Result<Tracee> {
        let pid = target.pid;
        let risky = target.risky_ranges();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut last_err = None;
        loop {
            let mut tids = witchcraft::sys::procfs::tasks(Some(pid));
            if tids.is_empty() {
                bail!("no process with pid {pid}");
            }
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
            if !super::target::alive(pid) {
                bail!("no process with pid {pid}");
            }
            if any_ok {
                return Err(last_err.unwrap_or_else(|| anyhow!("could not stop any thread of pid {pid}")));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn seize(tid: i32) -> Result<Tracee> {
        // SAFETY: ptrace requests on a thread id; failures are reported.
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
        let mut t = Tracee {
            tid,
            // SAFETY: user_regs_struct is plain data.
            saved: unsafe { std::mem::zeroed() },
            xstate: Vec::new(),
            stopped: Cell::new(false),
            delivered: Cell::new(false),
            pending: false,
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
        t.pending = signal_pending(tid);
        Ok(t)
    }

    /// Wait for the next stop; the signal of a signal-delivery stop (0 otherwise).
    fn wait_stop(&self, timeout: Duration) -> Result<i32> {
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
                    // PTRACE_EVENT_STOP (interrupt or group stop) reports as SIGTRAP/stop signals.
                    if (status >> 16) & 0xff == libc::PTRACE_EVENT_STOP {
                        return Ok(0);
                    }
                    return Ok(libc::WSTOPSIG(status));
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

    /// Call `f(args...)` on the stopped thread; returns its `rax` and the
    /// value of an [`Arg::OutInt`] (0 if none). The call returns to address
    /// 0; the fault stops it and is discarded, and the registers are put back.
    pub fn call(&self, f: u64, args: &[Arg]) -> Result<(u64, i32)> {
        let mut r = self.saved;
        // Below the red zone, 16-byte aligned; data first, then the return address.
        let mut sp = (self.saved.rsp - 1024) & !0xf;
        let mut ints = Vec::new();
        let mut out = None;
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
                Arg::OutInt => vec![0u8; 8],
            };
            sp = (sp - bytes.len() as u64) & !0xf;
            self.write(sp, &bytes)?;
            if matches!(a, Arg::OutInt) {
                out = Some(sp);
            }
            ints.push(sp);
        }
        sp -= 8;
        self.write(sp, &0u64.to_le_bytes())?;
        r.rsp = sp;
        r.rip = f;
        r.rax = 0;
        r.orig_rax = u64::MAX; // not in a system call: nothing to restart now
        let regs = [&mut r.rdi, &mut r.rsi, &mut r.rdx, &mut r.rcx, &mut r.r8, &mut r.r9];
        for (slot, v) in regs.into_iter().zip(ints) {
            *slot = v;
        }
        self.set_regs(&r)?;
        let mut sig = 0;
        let until = Instant::now() + CALL_LIMIT;
        loop {
            // SAFETY: resumes our stopped tracee, delivering `sig` (0: none).
            if unsafe { libc::ptrace(libc::PTRACE_CONT, self.tid, 0, sig) } != 0 {
                bail!("cannot resume thread {}: {}", self.tid, std::io::Error::last_os_error());
            }
            self.stopped.set(false);
            let s = self.wait_stop(until.saturating_duration_since(Instant::now()))?;
            if s == libc::SIGSEGV {
                let now = self.regs()?;
                if now.rip == 0 {
                    let mut v = [0u8; 4];
                    if let Some(at) = out {
                        super::target::read_memory(self.tid, at, &mut v);
                    }
                    self.set_regs(&self.saved)?;
                    return Ok((now.rax, i32::from_le_bytes(v)));
                }
            }
            // Another signal for the program, or a stop: pass it on.
            sig = if s == libc::SIGSTOP || s == 0 { 0 } else { s };
            if sig != 0 {
                self.delivered.set(true);
            }
        }
    }

    /// Let the thread go on from where it was stopped: its registers put
    /// back (an interrupted call restarted, see the module comment), then
    /// detached. If it is running injected code (a call that timed out), it
    /// is stopped first.
    pub fn resume(&self) {
        if !self.stopped.get() {
            // SAFETY: stop our tracee to put its registers back.
            unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, self.tid, 0, 0) };
            if self.wait_stop(Duration::from_secs(5)).is_err() {
                // SAFETY: detach whatever its state; nothing better is possible.
                unsafe { libc::ptrace(libc::PTRACE_DETACH, self.tid, 0, 0) };
                return;
            }
        }
        let mut r = self.saved;
        let nr = r.orig_rax as i64;
        if r.rax as i64 == -(libc::EINTR as i64) && EINTR_ON_STOP.contains(&nr) && !self.pending && !self.delivered.get() {
            let mut insn = [0u8; 2];
            if super::target::read_memory(self.tid, r.rip.wrapping_sub(2), &mut insn) && insn == [0x0f, 0x05] {
                r.rax = r.orig_rax;
                r.rip -= 2;
            }
        }
        let _ = self.set_regs(&r);
        let _ = self.set_xstate();
        // SAFETY: detaches our stopped tracee; no signal is injected.
        unsafe { libc::ptrace(libc::PTRACE_DETACH, self.tid, 0, 0) };
    }
}

/// Does thread `tid` have a signal pending that it does not block?
fn signal_pending(tid: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{tid}/status")) else { return false };
    let field = |k: &str| status.lines().find_map(|l| l.strip_prefix(k)).and_then(|v| u64::from_str_radix(v.trim(), 16).ok()).unwrap_or(0);
    (field("SigPnd:") | field("ShdPnd:")) & !field("SigBlk:") != 0
}

/// ptrace was refused (permissions).
#[derive(Debug)]
struct Refused;

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ptrace refused")
    }
}

impl std::error::Error for Refused {}
