//! The single-step exact mode: the program run under ptrace, one stop per
//! instruction, each instruction's accesses judged as it retires.

use super::judge::{Observed, ThreadShadow, WIDE};
use super::output::{exact_sampler, thread_profiles};
use crate::modules::critical::{self, Section};
use crate::profile::{self, Craft, Profile};
use crate::sys::mem;
use crate::x86::decode::{Access, Analyzer, Regs};
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::Path;

/// One instruction about to run: its accesses and the bytes before it ran.
struct Pending {
    ctx: u32,
    accesses: [Access; crate::x86::decode::MAX_ACCESSES],
    n: usize,
    before: [[u8; WIDE]; crate::x86::decode::MAX_ACCESSES],
    is_call: bool,
    is_ret: bool,
    next_ip: u64,
}

fn regs_of(pid: Pid) -> Option<Regs> {
    let r = ptrace::getregs(pid).ok()?;
    // fs_base/gs_base are in user_regs_struct.
    Some(Regs {
        gpr: [r.rax, r.rcx, r.rdx, r.rbx, r.rsp, r.rbp, r.rsi, r.rdi, r.r8, r.r9, r.r10, r.r11, r.r12, r.r13, r.r14, r.r15],
        rip: r.rip,
        fs_base: r.fs_base,
        gs_base: r.gs_base,
        df: r.eflags & (1 << 10) != 0,
    })
}

/// The outcome of an exact run.
pub struct ExactRun {
    pub profile: Profile,
    /// The program's exit code, or `None` if a signal ended it.
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub instructions: u64,
}

pub struct Exact {
    craft: Craft,
    precision: f64,
    an: Analyzer,
    threads: HashMap<i32, ThreadShadow>,
    pending: HashMap<i32, Pending>,
    instructions: u64,
    /// `instructions`, for a progress line read by another thread.
    stepped: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// What the program starts with that witch's runtime changed.
    inherited: crate::sys::inherited::Inherited,
    /// Restartable sequences' critical sections, and the code mappings
    /// they were read from (read again when a thread runs code outside
    /// them), with the pages outside every mapping already looked at.
    critical: Vec<Section>,
    code: Vec<(u64, u64)>,
    looked_at: HashSet<u64>,
    /// Threads running a critical section natively, to one of its exits.
    in_section: HashSet<i32>,
    /// Critical sections run natively, and of those, the ones whose
    /// exits were not all known (left at the end or the abort address).
    sections_run: u64,
    sections_unsure: u64,
}

impl Exact {
    pub fn new(craft: Craft, precision: f64) -> Self {
        Exact {
            craft,
            precision,
            an: Analyzer::new(),
            threads: HashMap::new(),
            pending: HashMap::new(),
            instructions: 0,
            stepped: Default::default(),
            inherited: Default::default(),
            critical: Vec::new(),
            code: Vec::new(),
            looked_at: HashSet::new(),
            in_section: HashSet::new(),
            sections_run: 0,
            sections_unsure: 0,
        }
    }

    /// The program starts with `inherited` put back, as witch was
    /// started (closed standard descriptors, SIGPIPE ignored).
    pub fn with_inherited(mut self, inherited: crate::sys::inherited::Inherited) -> Self {
        self.inherited = inherited;
        self
    }

    /// The count of instructions single-stepped so far, as the run goes on.
    pub fn stepped(&self) -> std::sync::Arc<std::sync::atomic::AtomicU64> {
        self.stepped.clone()
    }

    /// The thread goes on from its stop: one step, or, at a restartable
    /// sequence's critical section, the whole section natively.
    fn go(&mut self, pid: Pid) {
        if self.run_section(pid) {
            return;
        }
        self.prepare(pid);
        let _ = ptrace::step(pid, None);
    }

    /// The critical section that holds `pc`, if any: the process's
    /// sections are read again when `pc` is in code not seen before.
    fn section_at(&mut self, pid: Pid, pc: u64) -> Option<Section> {
        if !self.code.iter().any(|&(a, b)| (a..b).contains(&pc)) && self.looked_at.insert(pc >> 12) {
            let maps = std::fs::read_to_string(format!("/proc/{}/maps", pid)).unwrap_or_default();
            let code = crate::sys::procfs::parse_maps(&maps).into_iter().filter(|m| m.exec && m.is_file());
            self.code = code.map(|m| (m.start, m.end)).collect();
            self.critical = critical::in_process(&maps);
        }
        critical::reaching(&self.critical, pc, |at, out| mem::read(pid.as_raw(), at, out))
    }

    /// A thread stopped in a restartable sequence's critical section runs
    /// it natively, unjudged, to one of its exits (hardware breakpoints on
    /// each): a step's stop would abort the section, as any signal or
    /// preemption does, and the thread would never get through it. False
    /// if the thread is not in a section (or no breakpoint could be set).
    fn run_section(&mut self, pid: Pid) -> bool {
        let Some(rip) = regs_of(pid).map(|r| r.rip) else { return false };
        let Some(s) = self.section_at(pid, rip) else { return false };
        let mut code = vec![0u8; (s.past - s.first) as usize];
        let exits = mem::read(pid.as_raw(), s.first, &mut code).then(|| critical::exits(&s, &code)).flatten();
        let unsure = exits.is_none();
        let (at, n) = exits.unwrap_or(([s.past, s.abort, 0, 0], 2));
        if !crate::sys::ptrace::break_at(pid, &at[..n]) {
            return false;
        }
        self.sections_run += 1;
        self.sections_unsure += unsure as u64;
        self.pending.remove(&pid.as_raw());
        self.in_section.insert(pid.as_raw());
        let _ = ptrace::cont(pid, None);
        true
    }

    /// Before a thread steps: decode the instruction at its PC.
    fn prepare(&mut self, pid: Pid) {
        let tid = pid.as_raw();
        let Some(regs) = regs_of(pid) else { return };
        let mut code = [0u8; 16];
        let mut n = 16;
        while n > 0 && !mem::read(pid.as_raw(), regs.rip, &mut code[..n]) {
            n -= 4;
        }
        let Some(d) = self.an.decode(&code[..n], regs.rip, &regs, false) else {
            self.pending.remove(&tid);
            return;
        };
        let mn = {
            let mut dec = iced_x86::Decoder::with_ip(64, &code[..n], regs.rip, iced_x86::DecoderOptions::NONE);
            dec.decode().mnemonic()
        };
        let ctx = self.threads.entry(tid).or_default().context(regs.rip);
        let mut p = Pending {
            ctx,
            accesses: d.accesses,
            n: d.n,
            before: [[0; WIDE]; crate::x86::decode::MAX_ACCESSES],
            is_call: mn == iced_x86::Mnemonic::Call,
            is_ret: mn == iced_x86::Mnemonic::Ret,
            next_ip: d.next_ip(),
        };
        for i in 0..p.n {
            let a = p.accesses[i];
            let len = (a.len as usize).min(WIDE);
            mem::read(pid.as_raw(), a.addr, &mut p.before[i][..len]);
        }
        self.pending.insert(tid, p);
    }

    /// After a thread stepped: judge the accesses its instruction made.
    fn retire(&mut self, pid: Pid) {
        let tid = pid.as_raw();
        let Some(p) = self.pending.remove(&tid) else { return };
        self.instructions += 1;
        self.stepped.store(self.instructions, std::sync::atomic::Ordering::Relaxed);
        let mut seen = [Observed::new(Access::default()); crate::x86::decode::MAX_ACCESSES];
        for (o, (a, before)) in seen.iter_mut().zip(p.accesses.iter().zip(&p.before)).take(p.n) {
            *o = Observed { access: *a, before: *before, after: [0; WIDE] };
            if a.write && self.craft == Craft::SilentStore {
                let len = (a.len as usize).min(WIDE);
                mem::read(tid, a.addr, &mut o.after[..len]);
            }
        }
        let t = self.threads.entry(tid).or_default();
        t.judge(self.craft, self.precision, p.ctx, &seen[..p.n]);
        // Shadow call stack.
        if p.is_call {
            t.call(p.next_ip);
        } else if p.is_ret {
            if let Some(r) = regs_of(pid).map(|r| r.rip) {
                t.ret(r);
            }
        }
    }

    /// Run `program` to completion, single-stepping every thread.
    pub fn run(mut self, program: &Path, args: &[OsString], arg0: &OsString, env: &[(String, String)]) -> std::io::Result<ExactRun> {
        let mut cmd = std::process::Command::new(program);
        cmd.args(args).arg0(arg0);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let inherited = self.inherited;
        // SAFETY: the closure runs in the forked child before exec, where
        // only async-signal-safe work is allowed: `Inherited::restore`
        // (`close` and `signal` calls), and PTRACE_TRACEME, one system
        // call, whose error becomes an io::Error from its errno without
        // allocating.
        unsafe {
            cmd.pre_exec(move || {
                inherited.restore();
                ptrace::traceme().map_err(std::io::Error::from)
            });
        }
        let start = std::time::SystemTime::now();
        let child = cmd.spawn()?;
        let main = Pid::from_raw(child.id() as i32);
        // First stop: SIGTRAP after exec.
        waitpid(main, None).map_err(std::io::Error::from)?;
        let opts = ptrace::Options::PTRACE_O_TRACECLONE | ptrace::Options::PTRACE_O_TRACEEXIT | ptrace::Options::PTRACE_O_EXITKILL;
        ptrace::setoptions(main, opts).map_err(std::io::Error::from)?;
        let mut maps = String::new();
        self.prepare(main);
        ptrace::step(main, None).map_err(std::io::Error::from)?;
        // (The first instruction, the loader's, is in no critical section.)
        let (mut code, mut signal) = (None, None);
        loop {
            let st = match waitpid(None, Some(WaitPidFlag::__WALL)) {
                Ok(s) => s,
                Err(nix::errno::Errno::ECHILD) => break,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            };
            match st {
                WaitStatus::Exited(pid, c) if pid == main => {
                    code = Some(c);
                    break;
                }
                WaitStatus::Signaled(pid, s, _) if pid == main => {
                    signal = Some(s as i32);
                    break;
                }
                WaitStatus::PtraceEvent(pid, _, ev) => {
                    if ev == libc::PTRACE_EVENT_EXIT && pid == main {
                        maps = std::fs::read_to_string(format!("/proc/{}/maps", pid)).unwrap_or_default();
                    }
                    if ev == libc::PTRACE_EVENT_CLONE {
                        // The new thread starts stopped; it is stepped when it reports.
                    }
                    let _ = ptrace::step(pid, None);
                }
                WaitStatus::Stopped(pid, sig) => {
                    // A step reports TRAP_TRACE, or TRAP_BRKPT after a
                    // stepped syscall; the program's own int3 is SI_KERNEL
                    // and raise() is SI_TKILL, and those are delivered.
                    let si_code = if sig == Signal::SIGTRAP { ptrace::getsiginfo(pid).map_or(0, |i| i.si_code) } else { 0 };
                    let from_step = si_code == 2 || si_code == 1;
                    if self.in_section.remove(&pid.as_raw()) {
                        // Out of a critical section (TRAP_HWBKPT), or a
                        // signal of the program's in it (which the kernel
                        // aborts it for): stepping again.
                        crate::sys::ptrace::clear(pid);
                        if si_code == libc::TRAP_HWBKPT {
                            self.go(pid);
                            continue;
                        }
                    }
                    if from_step {
                        self.retire(pid);
                        self.go(pid);
                    } else if sig == Signal::SIGSTOP && !self.threads.contains_key(&pid.as_raw()) {
                        // A new thread's first stop.
                        self.go(pid);
                    } else {
                        // The program's own signal: deliver it. The pending
                        // instruction did not run; decode again afterwards.
                        self.pending.remove(&pid.as_raw());
                        let _ = ptrace::step(pid, Some(sig));
                    }
                }
                _ => {}
            }
        }
        let duration = start.elapsed().unwrap_or_default();
        let profile = self.profile(program, args, main.as_raw() as u32, duration, &maps, code, signal);
        Ok(ExactRun { profile, code, signal, instructions: self.instructions })
    }

    fn notes(&self) -> Vec<String> {
        let mut notes = vec![format!("exact reference: {} instructions single-stepped", self.instructions)];
        if self.sections_run > 0 {
            let unsure = match self.sections_unsure {
                0 => String::new(),
                n => format!(" ({n} of them to their end or abort address only: the thread ran unjudged until it came out there)"),
            };
            notes.push(format!(
                "{} runs of restartable sequences' critical sections (rseq) ran natively, their accesses not judged: a step would abort them{unsure}",
                self.sections_run
            ));
        }
        notes
    }

    #[allow(clippy::too_many_arguments)]
    fn profile(
        &self,
        program: &Path,
        args: &[OsString],
        pid: u32,
        d: std::time::Duration,
        maps: &str,
        code: Option<i32>,
        signal: Option<i32>,
    ) -> Profile {
        let (threads, mut counters) = thread_profiles(self.threads.iter().map(|(&tid, t)| (tid, t)));
        counters.interrupts = self.instructions;
        // SAFETY: utsname is arrays of c_char; all zeroes is valid.
        let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
        // SAFETY: uname fills the local struct.
        unsafe { libc::uname(&mut uts) };
        // SAFETY: `release` is NUL-terminated: the kernel writes a terminated
        // string, and if uname failed the zeroed array is empty.
        let kernel = unsafe { std::ffi::CStr::from_ptr(uts.release.as_ptr()) }.to_string_lossy().into_owned();
        let mut all_args = vec![program.to_string_lossy().into_owned()];
        all_args.extend(args.iter().map(|a| a.to_string_lossy().into_owned()));
        Profile {
            schema: profile::SCHEMA,
            witch_version: env!("CARGO_PKG_VERSION").into(),
            craft: self.craft,
            program: std::fs::canonicalize(program).unwrap_or(program.to_path_buf()).to_string_lossy().into_owned(),
            args: all_args,
            pid,
            ppid: std::process::id(),
            // When the program started: now, less the run's duration.
            start_unix_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |now| now.saturating_sub(d).as_nanos() as u64),
            duration_ns: d.as_nanos() as u64,
            sampler: exact_sampler("single-step"),
            replacement: "none".into(),
            debug_registers: 0,
            fp_precision: self.precision,
            kernel,
            ended_by: match (code, signal) {
                (None, Some(s)) => profile::EndedBy::Signal(s),
                _ => profile::EndedBy::Exit,
            },
            exec_call: None,
            round_trips: None,
            notes: self.notes(),
            counters,
            modules: crate::modules::profile_modules(maps),
            threads,
            processes: Vec::new(),
        }
    }
}
