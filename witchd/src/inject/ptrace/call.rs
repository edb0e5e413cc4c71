//! An injected call's steps: the frame that restores the thread written
//! below its stack, the call started, waited for (or taken back when it is
//! stuck) and its result read.

use super::{
    signals, Arg, Call, CallState, Called, ResumeFrom, Return, Stopped, Stuck, Tracee, CALL_LIMIT, FP_XSTATE_MAGIC1, FP_XSTATE_MAGIC2,
    GROUP_STOP, MASK_WHILE_WAITING, SIGFRAME, SIGMASK_AT, STUCK_CHECK, STUCK_PATIENCE, SYSCALL_STOP, SYS_RT_SIGRETURN, UC_FP_XSTATE,
    UC_SIGCONTEXT_SS, UC_STRICT_RESTORE_SS,
};
use anyhow::{bail, Result};
use std::time::{Duration, Instant};

impl Tracee {
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
        self.phase.set(CallState::Own);
        Ok(())
    }

    /// Set the thread up to call `f(args...)`; it runs once resumed.
    pub(super) fn start(&self, f: u64, args: &[Arg], ret: Return) -> Result<Call> {
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
                let regs = self.resumed(ResumeFrom::Frame);
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
        self.phase.set(if restorer.is_some() { CallState::Restoring } else { CallState::Faulting });
        Ok(Call { restorer, out, init, rax_at })
    }

    /// Run a call that [`Tracee::start`] set up until it returns.
    fn finish(&self, call: &Call, stuck: Option<&dyn Fn(i32) -> bool>) -> Result<Called> {
        let Call { restorer, out, init, rax_at } = *call;
        let read_word = |at: u64| {
            let mut v = [0u8; 8];
            super::super::target::read_memory(self.tid, at, &mut v).then_some(v)
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
                        self.phase.set(CallState::AtSigreturn);
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
                    self.phase.set(CallState::Own);
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
