//! The Witch engine for one thread: samples arm watchpoints, traps are
//! judged by the craft, and the result is attributed to ⟨C_watch, C_trap⟩.
//!
//! Everything reachable from [`ThreadState::on_sample`] and
//! [`ThreadState::on_trap`] runs in a signal handler: no allocation, no
//! locks, no stdio. All memory is reserved in [`ThreadState::new`].

use crate::access::{Access, Analyzer, Regs};
use crate::config::Config;
use crate::context::{Pairs, Tree};
use crate::cputimer;
use crate::craft::{Craft, Verdict, Watched, SNAPSHOT};
use crate::modules::{self, ProcessMap};
use crate::perf::{self, BpType};
use crate::pmu;
use crate::profile::{self, Counters};
use crate::replacement::{Reservoir, SlotView};
use crate::trap::{self, PrecisePcCache};
use crate::unwind::{self, MAX_FRAMES};
pub use crate::watchpoint::{watch_range, Slot};
use rand::{rngs::SmallRng, RngExt, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};

pub const MAX_SLOTS: usize = 4;
const TREE_NODES: usize = 1 << 16;
const PAIRS: usize = 1 << 13;
pub const ALT_STACK: usize = 256 * 1024;
/// How many instructions back from the interrupted PC to look for the
/// access the time belongs to (measured skid here: 1 for stores, 2 for
/// loads whose consumer stalls).
const SKID: usize = 3;
/// Ignored traps a watchpoint may take before it is given up. LoadCraft
/// ignores stores; a location stored to often and loaded rarely would
/// otherwise trap (~15 µs each here) on every store until its next load.
const MAX_IGNORED: u32 = 32;

/// Which sampler drives this process.
pub enum SamplerKind {
    /// Software `task-clock`/`cpu-clock`: decode the interrupted instruction.
    Software { config: u64 },
    /// A POSIX CPU-time timer per thread ([`crate::cputimer`]): the same
    /// decoding, at a fraction of the kernel's cost, for periods of a tick
    /// or more.
    CpuTimer,
    /// PMU precise memory event with the data address.
    Pmu(pmu::PmuEvent),
}

/// Process-wide, immutable after start-up.
pub struct Engine {
    pub config: Config,
    pub craft: &'static dyn Craft,
    pub sampler: SamplerKind,
    pub period: u64,
    pub sigtrap: bool,
    pub modify: bool,
    /// The agent's own code range: samples there are skipped.
    pub own_code: (u64, u64),
    /// Measured CPU cost (ns) of one watchpoint trap round trip and of one
    /// sampler signal, outside our handler code (kernel, and hypervisor in a
    /// VM). See [`ThreadState::account`].
    pub trap_cost_ns: u64,
    pub signal_cost_ns: u64,
}

/// This thread's CPU time in ns (a syscall; async-signal-safe).
pub fn thread_cpu_ns() -> u64 {
    let mut t: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

pub struct ThreadState {
    pub tid: i32,
    /// Cleared when the thread ends or the process stops profiling.
    pub active: AtomicBool,
    pub in_handler: AtomicBool,
    pub sampler_fd: i32,
    /// The CPU-time timer when the sampler is one (-1: none).
    pub sampler_timer: i32,
    pub pmu: Option<pmu::PmuSampler>,
    pub slots: [Slot; MAX_SLOTS],
    pub nslots: usize,
    pub reservoir: Reservoir,
    pub seq: u64,
    pub rng: SmallRng,
    pub tree: Tree,
    pub pairs: Pairs,
    pub counters: Counters,
    blind: u64,
    analyzer: Analyzer,
    unwind_cache: Box<unwind::Cache>,
    pc_cache: PrecisePcCache,
    frames: Box<[u64; MAX_FRAMES]>,
    pub stack: (u64, u64),
    pub alt_stack: (u64, u64),
    /// The thread's alternate stack before ours (restored on detach).
    pub prev_alt_stack: libc::stack_t,
    pub fs_base: u64,
    pub gs_base: u64,
    /// The program context the last handler returned to (rip + registers).
    resumed: Regs,
    /// The program's own CPU time (ns) since the last software sample that
    /// counted (see `enter`).
    program_ns: f64,
    /// Thread CPU time when our last handler returned (0: none yet).
    exit_ns: u64,
    /// CPU time between that return and this handler's entry.
    interval_ns: u64,
    /// What one return-and-trap costs outside our handlers, measured on this
    /// thread's self-traps (see `on_trap`); starts at the calibration.
    trap_gap_ns: f64,
    /// Weight of the sample being handled.
    weight: f64,
    /// Never accessed: a disarmed slot's breakpoint parks here.
    parking: Box<u64>,
}

fn thread_stack() -> (u64, u64) {
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return (0, 0);
        }
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        (addr as u64, addr as u64 + size as u64)
    }
}

fn arch_prctl_get(code: i32) -> u64 {
    let mut v: u64 = 0;
    unsafe { libc::syscall(libc::SYS_arch_prctl, code, &mut v as *mut u64) };
    v
}

impl ThreadState {
    pub fn new(engine: &Engine) -> Box<ThreadState> {
        let seed = engine.config.seed.unwrap_or_else(|| {
            let mut t: libc::timespec = unsafe { std::mem::zeroed() };
            unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
            (t.tv_nsec as u64) ^ ((t.tv_sec as u64) << 32)
        }) ^ (perf::gettid() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        Box::new(ThreadState {
            tid: perf::gettid(),
            active: AtomicBool::new(false),
            in_handler: AtomicBool::new(false),
            sampler_fd: -1,
            sampler_timer: -1,
            pmu: None,
            slots: [Slot { fd: -1, ..Default::default() }; MAX_SLOTS],
            nslots: 0,
            reservoir: Reservoir::new(engine.config.replacement),
            seq: 0,
            rng: SmallRng::seed_from_u64(seed),
            tree: Tree::with_capacity(TREE_NODES),
            pairs: Pairs::with_capacity(PAIRS),
            counters: Counters::default(),
            blind: 0,
            analyzer: Analyzer::new(),
            unwind_cache: unwind::new_cache(),
            pc_cache: PrecisePcCache::default(),
            frames: Box::new([0; MAX_FRAMES]),
            stack: (0, 0),
            alt_stack: (0, 0),
            prev_alt_stack: libc::stack_t { ss_sp: std::ptr::null_mut(), ss_flags: libc::SS_DISABLE, ss_size: 0 },
            fs_base: 0,
            gs_base: 0,
            resumed: Regs::default(),
            program_ns: 0.0,
            exit_ns: 0,
            interval_ns: 0,
            trap_gap_ns: engine.trap_cost_ns as f64,
            weight: 1.0,
            parking: Box::new(0),
        })
    }

    fn parking_addr(&self) -> u64 {
        &*self.parking as *const u64 as u64
    }

    /// Set up this thread: alternate signal stack, debug registers, sampler.
    /// Runs on the thread itself, outside any signal handler.
    pub fn start(&mut self, engine: &Engine) -> Result<(), String> {
        self.map_alt_stack()?;
        self.adopt_here(thread_stack());
        self.open_events(engine, 0)?;
        self.go(engine);
        Ok(())
    }

    /// Reserve the alternate signal stack; [`ThreadState::adopt_here`] installs it.
    pub fn map_alt_stack(&mut self) -> Result<(), String> {
        // Handlers run here so their frames never land on a watched stack address (Witch Fig. 4.3).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ALT_STACK,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err("cannot map an alternate signal stack".into());
        }
        self.alt_stack = (p as u64, p as u64 + ALT_STACK as u64);
        Ok(())
    }

    /// The per-thread part of set-up, on the thread itself: its id, stack
    /// bounds, segment bases and alternate signal stack (the previous one is
    /// kept for [`ThreadState::leave_here`]). Only system calls, so an
    /// attached agent can run it in a signal handler.
    pub fn adopt_here(&mut self, stack: (u64, u64)) {
        self.tid = perf::gettid();
        self.stack = stack;
        const ARCH_GET_FS: i32 = 0x1003;
        const ARCH_GET_GS: i32 = 0x1004;
        self.fs_base = arch_prctl_get(ARCH_GET_FS);
        self.gs_base = arch_prctl_get(ARCH_GET_GS);
        let ss = libc::stack_t {
            ss_sp: self.alt_stack.0 as *mut libc::c_void,
            ss_flags: 0,
            ss_size: (self.alt_stack.1 - self.alt_stack.0) as usize,
        };
        unsafe { libc::sigaltstack(&ss, &mut self.prev_alt_stack) };
    }

    /// Undo [`ThreadState::adopt_here`] on the thread (attached agent's detach).
    pub fn leave_here(&mut self) {
        let mut prev = self.prev_alt_stack;
        if prev.ss_sp.is_null() {
            prev.ss_flags = libc::SS_DISABLE;
        }
        unsafe { libc::sigaltstack(&prev, std::ptr::null_mut()) };
    }

    /// Unmap the alternate stack once no thread can be running on it.
    pub fn release_alt_stack(&mut self) {
        if self.alt_stack.0 != 0 {
            unsafe { libc::munmap(self.alt_stack.0 as *mut libc::c_void, (self.alt_stack.1 - self.alt_stack.0) as usize) };
            self.alt_stack = (0, 0);
        }
    }

    /// Open the debug-register slots and the sampler (disabled) for thread
    /// `tid` of this process (0: the calling thread), with the sampler's
    /// signal routed to that thread.
    pub fn open_events(&mut self, engine: &Engine, tid: i32) -> Result<(), String> {
        let target = if tid == 0 { perf::gettid() } else { tid };
        self.tid = target;
        let ty = engine.craft.watch();
        let want = engine.config.debug_registers.min(MAX_SLOTS);
        let park = self.parking_addr();
        self.nslots = 0;
        for i in 0..want {
            let mut a = perf::breakpoint_attr(park, 8, ty, true, engine.sigtrap, perf::SIG_MAGIC | i as u64);
            match perf::open_on(&mut a, tid) {
                Ok(fd) => {
                    if !engine.sigtrap {
                        perf::route_signal_to_thread(fd, perf::fallback_signal(), target);
                    }
                    self.slots[i] = Slot { fd, ..Default::default() };
                    self.nslots += 1;
                }
                Err(e) if i == 0 => {
                    return Err(format!(
                        "no free debug registers ({}): a debugger or another tool may be using them",
                        std::io::Error::from_raw_os_error(e)
                    ))
                }
                Err(_) => break,
            }
        }
        // The sampler always signals with a real-time signal, never
        // SIGTRAP: standard signals don't queue, so a sample and a trap
        // arriving together would lose one of them.
        let fd = match &engine.sampler {
            SamplerKind::CpuTimer => {
                let id = cputimer::create(target, perf::fallback_signal(), perf::SIG_MAGIC | perf::SIG_SAMPLER).map_err(|e| {
                    let why = std::io::Error::from_raw_os_error(e);
                    if e == libc::EAGAIN {
                        // Each POSIX timer reserves a queued signal.
                        format!("cannot create the CPU-time sampler: {why} (the signal queue limit, `ulimit -i`, is reached; raise it)")
                    } else {
                        format!("cannot create the CPU-time sampler: {why}")
                    }
                })?;
                self.sampler_timer = id;
                return Ok(());
            }
            SamplerKind::Software { config } => {
                let mut a = perf::task_clock_attr(engine.period, false, 0);
                a.config = *config;
                perf::open_on(&mut a, tid)
                    .map_err(|e| format!("cannot open the software sampler: {}", std::io::Error::from_raw_os_error(e)))?
            }
            SamplerKind::Pmu(ev) => {
                let s = pmu::PmuSampler::open_on(ev, engine.period, false, 0, tid)?;
                let fd = s.fd();
                self.pmu = Some(s);
                fd
            }
        };
        self.sampler_fd = fd;
        if !perf::route_signal_to_thread(fd, perf::fallback_signal(), target) {
            return Err("cannot route sampler signals to the thread (fcntl F_SETSIG)".into());
        }
        Ok(())
    }

    /// Start sampling (async-signal-safe).
    pub fn go(&mut self, engine: &Engine) {
        self.active.store(true, Ordering::Release);
        self.resume_sampler(engine);
    }

    /// Whether this thread has a sampler to pause or resume.
    pub fn has_sampler(&self) -> bool {
        self.sampler_fd >= 0 || self.sampler_timer >= 0
    }

    /// Stop the sampler's interrupts, keeping its kernel object.
    pub fn pause_sampler(&mut self) {
        if self.sampler_timer >= 0 {
            cputimer::set(self.sampler_timer, 0);
        }
        if self.sampler_fd >= 0 {
            perf::disable(self.sampler_fd);
        }
    }

    pub fn resume_sampler(&mut self, engine: &Engine) {
        if self.sampler_timer >= 0 {
            cputimer::set(self.sampler_timer, engine.period);
        }
        if self.sampler_fd >= 0 {
            perf::enable(self.sampler_fd);
        }
    }

    /// Stop sampling and release the kernel resources (thread exit, exec, detach).
    pub fn stop(&mut self) {
        self.active.store(false, Ordering::Release);
        self.pause_sampler();
        self.close_events();
    }

    fn close_events(&mut self) {
        for s in &mut self.slots[..self.nslots] {
            perf::close(s.fd);
            s.fd = -1;
            s.armed = false;
        }
        match self.pmu.as_mut() {
            Some(p) => p.close(),
            None => perf::close(self.sampler_fd),
        }
        cputimer::delete(self.sampler_timer);
        self.pmu = None;
        self.sampler_fd = -1;
        self.sampler_timer = -1;
        self.nslots = 0;
    }

    /// Forget what the parent gathered (fork child) and drop its kernel
    /// resources without touching the parent's events.
    pub fn reset_after_fork(&mut self) {
        // POSIX timers are not inherited: the parent's id means nothing here.
        self.sampler_timer = -1;
        self.close_events();
        self.slots = [Slot { fd: -1, ..Default::default() }; MAX_SLOTS];
        self.tree.clear();
        self.pairs.clear();
        self.counters = Counters::default();
        self.reservoir.k = 0;
        self.blind = 0;
        self.program_ns = 0.0;
        self.exit_ns = 0;
        self.active.store(false, Ordering::Release);
    }

    fn is_engine_memory(&self, addr: u64) -> bool {
        let inside = |r: (u64, u64)| addr >= r.0 && addr < r.1;
        let me = self as *const Self as u64;
        inside(self.alt_stack) || inside((me, me + std::mem::size_of::<Self>() as u64)) || addr == self.parking_addr()
    }

    /// A sampler interrupt (signal handler).
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub unsafe fn on_sample(&mut self, engine: &Engine, uc: *mut libc::ucontext_t) {
        self.counters.interrupts += 1;
        let Some(map) = modules::current() else { return };
        let regs = Regs::from_ucontext(uc, self.fs_base, self.gs_base);
        // task-clock also runs while the kernel delivers our signals. A
        // period that ends there fires where the program resumes, so the
        // code right after a trap would collect the engine's time (measured:
        // Listing 4.3's densely trapping *p/*q at 36% instead of 25%). Such a
        // sample finds the program exactly where the last handler left it
        // (signals are blocked in each other's handlers, and SIGTRAP, the
        // lower number, is delivered first).
        if self.pmu.is_none() && regs.rip == self.resumed.rip && regs.gpr == self.resumed.gpr {
            self.counters.overdue += 1;
            return;
        }
        self.resumed = regs;
        // A software period counts the engine's time too; weigh this sample
        // by the program's own time since the last one, in periods, so code
        // where traps are dense (and so the engine's time) is not
        // over-sampled. Measured on Listing 4.3 at -p 100000: 35%/35%/15%/15%
        // unweighted, 25% each expected.
        self.weight = 1.0;
        if self.pmu.is_none() {
            self.program_ns += self.interval_ns.saturating_sub(engine.signal_cost_ns) as f64;
            if self.exit_ns != 0 {
                self.weight = self.program_ns / engine.period as f64;
            }
            self.program_ns = 0.0;
        }
        if let Some(p) = self.pmu.as_mut() {
            // Precise IP and data address come from the PMU record.
            let mut recs = [pmu::PmuRecord::default(); 8];
            let mut n = 0;
            p.drain(|r| {
                if n < recs.len() {
                    recs[n] = r;
                    n += 1;
                }
            });
            for r in &recs[..n] {
                self.pmu_sample(engine, map, &regs, r);
            }
            return;
        }
        let pc = regs.rip;
        if pc >= engine.own_code.0 && pc < engine.own_code.1 {
            self.counters.skipped_self += 1;
            return;
        }
        // Skid: a timer interrupt is taken at a retirement boundary, and the
        // instruction the time belongs to has usually just retired (a stalled
        // store shows up as the PC after it; a load as the PC after its first
        // consumer). So look back through straight-line code, up to SKID
        // instructions, for an access of the craft's kind that has already
        // run: its address comes from the registers now (implicit updates
        // undone), provided no instruction since wrote them. At a branch
        // target the predecessor may not be what ran, so then use the
        // instruction at the PC, which has not run yet: its own access will
        // trap first and is skipped as a self-trap.
        let mut buf = [0u8; 16];
        // Registers the instructions walked over changed: `written` beyond
        // repair, `steps` by a known constant (pointer increments), which
        // is undone (backward) or replayed (forward) before computing an
        // address from them.
        let mut end = pc;
        let mut written: u16 = 0;
        let mut steps = [0i64; 16];
        for _ in 0..SKID {
            let (prev, target) = trap::previous_instruction(map, &mut self.pc_cache, end);
            let Some(prev) = prev else { break };
            if target {
                break;
            }
            let Some(bytes) = trap::code_at(map, prev, &mut buf) else { break };
            let clobbers = crate::access::clobbers_address(bytes, prev);
            let mut at = regs;
            for (g, s) in at.gpr.iter_mut().zip(steps) {
                *g = g.wrapping_sub(s as u64);
            }
            let Some(d) = self.analyzer.decode(bytes, prev, &at, true) else { break };
            if d.branch || d.rep {
                break;
            }
            if let Some(a) = d.accesses().iter().copied().find(|a| engine.craft.samples(a)) {
                if !clobbers && d.addr_regs & written == 0 && !d.partial {
                    if self.is_engine_memory(a.addr) {
                        self.counters.skipped_self += 1;
                        return;
                    }
                    return self.sample(engine, map, &at, prev, a, None);
                }
                break;
            }
            match d.step {
                Some((r, delta)) if d.writes & !(1 << r) == 0 => steps[r] = steps[r].wrapping_add(delta),
                _ => written |= d.writes,
            }
            end = prev;
        }
        // Forward: the first access of the craft's kind within SKID
        // instructions of straight-line code from the PC (a stalled load
        // often shows up one or two instructions before the store that uses
        // it), provided the instructions before it leave its address
        // registers alone or step them by constants. It has not run yet: its
        // own access will trap first and is skipped as a self-trap.
        let mut ip = pc;
        let mut written: u16 = 0;
        let mut at = regs;
        for _ in 0..=SKID {
            let Some(bytes) = code_bytes(map, ip, &mut buf) else { return };
            let Some(d) = self.analyzer.decode(bytes, ip, &at, false) else { return };
            if let Some(a) = d.accesses().iter().copied().find(|a| engine.craft.samples(a)) {
                if d.addr_regs & written != 0 || d.partial {
                    return;
                }
                if self.is_engine_memory(a.addr) {
                    self.counters.skipped_self += 1;
                    return;
                }
                let skip = Some((ip, d.next_ip(), d.branch || d.rep));
                return self.sample(engine, map, &at, ip, a, skip);
            }
            if d.branch {
                return;
            }
            match d.step {
                Some((r, delta)) if d.writes & !(1 << r) == 0 => at.gpr[r] = at.gpr[r].wrapping_add(delta as u64),
                _ => written |= d.writes,
            }
            ip = d.next_ip();
        }
    }

    fn pmu_sample(&mut self, engine: &Engine, map: &ProcessMap, regs: &Regs, r: &pmu::PmuRecord) {
        if r.addr == 0 || (r.ip >= engine.own_code.0 && r.ip < engine.own_code.1) || self.is_engine_memory(r.addr) {
            self.counters.skipped_self += 1;
            return;
        }
        // Length and float kind come from decoding the sampled instruction.
        let mut buf = [0u8; 16];
        let mut a =
            Access { addr: r.addr, len: if r.len > 0 { r.len as u32 } else { 8 }, read: true, write: true, float: Default::default() };
        if let Some(bytes) = code_bytes(map, r.ip, &mut buf) {
            if let Some(d) = self.analyzer.decode(bytes, r.ip, regs, false) {
                if let Some(x) = d.accesses().iter().find(|x| engine.craft.samples(x)) {
                    a.len = x.len;
                    a.float = x.float;
                    a.read = x.read;
                    a.write = x.write;
                }
            }
        }
        if !engine.craft.samples(&a) {
            return;
        }
        // The access already happened: no self-trap to skip.
        self.sample(engine, map, regs, r.ip, a, None);
    }

    fn sample(&mut self, engine: &Engine, map: &ProcessMap, regs: &Regs, pc: u64, a: Access, skip: Option<(u64, u64, bool)>) {
        self.counters.samples += 1;
        let n = unwind::walk(map, &mut self.unwind_cache, regs, pc, self.stack, &mut self.frames);
        let ctx = self.tree.insert(&self.frames[..n]);
        let node = self.tree.node(ctx);
        node.samples += 1;
        node.mu += self.weight; // µ(C)
        self.seq += 1;
        let mut views = [SlotView::default(); MAX_SLOTS];
        for (v, s) in views.iter_mut().zip(&self.slots[..self.nslots]) {
            *v = SlotView { armed: s.armed, armed_seq: s.armed_seq };
        }
        let rng = &mut self.rng;
        let Some(i) = self.reservoir.choose(&views[..self.nslots], |m| rng.random_range(0..m)) else {
            self.counters.dropped += 1;
            self.blind += 1;
            self.counters.longest_blind_spot = self.counters.longest_blind_spot.max(self.blind);
            return;
        };
        if self.slots[i].armed {
            let old = self.slots[i].ctx;
            let node = self.tree.node(old);
            node.armed = node.armed.saturating_sub(1);
        }
        let (waddr, wlen) = watch_range(a.addr, a.len);
        let mut watched = Watched { access: a, ..Default::default() };
        if engine.craft.needs_value() {
            let n = (a.len as usize).min(SNAPSHOT);
            if perf::read_memory(a.addr, &mut watched.value[..n]) {
                watched.value_len = n;
            }
        }
        if !self.arm(engine, i, waddr, wlen) {
            self.counters.arm_failures += 1;
            self.slots[i].armed = false;
            return;
        }
        let (skip_first, skip_pc, skip_next, skip_branch) = match skip {
            Some((pc, next, branch)) => (true, pc, next, branch),
            None => (false, 0, 0, false),
        };
        let fd = self.slots[i].fd;
        self.slots[i] = Slot {
            fd,
            armed: true,
            armed_seq: self.seq,
            ctx,
            addr: waddr,
            len: wlen,
            watched,
            skip_first,
            skip_pc,
            skip_next,
            skip_branch,
            ignored: 0,
        };
        self.tree.node(ctx).armed += 1;
        self.counters.armed += 1;
        self.blind = 0;
    }

    fn arm(&mut self, engine: &Engine, i: usize, addr: u64, len: u64) -> bool {
        let park = self.parking_addr();
        let (tid, data) = (self.tid, perf::SIG_MAGIC | i as u64);
        self.slots[i].retarget(engine.craft.watch(), addr, len, engine.sigtrap, engine.modify, tid, data, park)
    }

    fn disarm(&mut self, i: usize) {
        self.slots[i].disarm();
    }

    /// A watchpoint trap on slot `i` (signal handler).
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub unsafe fn on_trap(&mut self, engine: &Engine, i: usize, uc: *mut libc::ucontext_t, perf_flags: u32) {
        if i >= self.nslots || !self.slots[i].armed {
            return;
        }
        let Some(map) = modules::current() else { return };
        let regs = Regs::from_ucontext(uc, self.fs_base, self.gs_base);
        self.resumed = regs;
        let s = self.slots[i];
        let self_trap = s.skip_first && (regs.rip == s.skip_next || s.skip_branch || regs.rip == s.skip_pc);
        if !self_trap {
            self.program_ns += (self.interval_ns as f64 - self.trap_gap_ns).max(0.0);
        }
        if perf_flags & perf::TRAP_PERF_FLAG_ASYNC != 0 {
            // Delivered late (SIGTRAP was blocked): the context isn't the access.
            self.counters.ignored_traps += 1;
            self.free(i);
            return;
        }
        if s.skip_first {
            self.slots[i].skip_first = false;
            if self_trap {
                // The sampled instruction's own access, not the next one.
                self.counters.self_traps += 1;
                // The sample handler returned to this one instruction, so
                // the time between is a return plus a trap's way in: no
                // program time. The start-up calibration alone is not enough
                // for that cost: it varies 17-27 µs between runs in this VM,
                // more in a busy one, and dense trapping code's weight
                // follows it. Clamped steps: a preempted gap moves it little.
                if self.exit_ns != 0 {
                    let est = self.trap_gap_ns.max(1000.0);
                    let gap = (self.interval_ns as f64).clamp(0.5 * est, 2.0 * est);
                    self.trap_gap_ns += (gap - self.trap_gap_ns) / 8.0;
                }
                if engine.craft.needs_value() && engine.craft.watch() == BpType::W {
                    // The store has now run: remember what it left (SilentCraft).
                    let w = &mut self.slots[i].watched;
                    let n = (w.access.len as usize).min(SNAPSHOT);
                    w.value_len = if perf::read_memory(w.access.addr, &mut w.value[..n]) { n } else { 0 };
                }
                return;
            }
        }
        let found = trap::recover(map, &mut self.pc_cache, &mut self.analyzer, &regs, s.addr, s.len, self.stack);
        let (pc, access) = match found {
            Some(t) => {
                if !t.precise {
                    self.counters.imprecise += 1;
                }
                (t.pc, t.access)
            }
            None => {
                self.counters.imprecise += 1;
                if engine.craft.watch() != BpType::W {
                    // A read-or-write trap we can't place: neither waste nor use.
                    self.free(i);
                    return;
                }
                // A write-only watchpoint only traps on stores.
                let a = Access { addr: s.addr, len: s.len as u32, read: false, write: true, float: s.watched.access.float };
                (regs.rip, a)
            }
        };
        let mut now = [0u8; SNAPSHOT];
        if engine.craft.needs_value() {
            let n = s.watched.value_len;
            if n > 0 && !perf::read_memory(s.watched.access.addr, &mut now[..n]) {
                self.free(i);
                return;
            }
        }
        let verdict = engine.craft.judge(&s.watched, &access, &now);
        if verdict == Verdict::Ignore {
            self.counters.ignored_traps += 1;
            self.slots[i].ignored += 1;
            if self.slots[i].ignored >= MAX_IGNORED {
                self.counters.abandoned += 1;
                self.free(i);
            }
            return;
        }
        self.counters.traps += 1;
        let n = unwind::walk(map, &mut self.unwind_cache, &regs, pc, self.stack, &mut self.frames);
        let trap_ctx = self.tree.insert(&self.frames[..n]);
        // Proportional attribution (Witch §4.4.2): this trap stands for the
        // samples of C_watch not yet accounted for, shared among the
        // watchpoints currently armed from C_watch.
        let node = self.tree.node(s.ctx);
        let sharers = node.armed.max(1) as f64;
        let delta = ((node.mu - node.eta) / sharers).max(0.0);
        node.eta += delta;
        let scale = delta * engine.period as f64;
        if let Some(p) = self.pairs.get(s.ctx, trap_ctx) {
            p.traps += 1;
            match verdict {
                Verdict::Waste { bytes, approx: false } => p.waste += scale * bytes as f64,
                Verdict::Waste { bytes, approx: true } => p.approx_waste += scale * bytes as f64,
                Verdict::Use { bytes } => p.used += scale * bytes as f64,
                Verdict::Ignore => {}
            }
        }
        self.free(i);
    }

    /// A handled signal begins (thread CPU time `entry_ns`): the CPU time
    /// since our last handler returned is the program's, less the kernel's
    /// cost of the return and of this entry. Counting the program's time
    /// this way, rather than the engine's, needs no knowledge of how late
    /// the timer fired.
    pub fn enter(&mut self, entry_ns: u64) {
        self.interval_ns = if self.exit_ns == 0 { 0 } else { entry_ns.saturating_sub(self.exit_ns) };
    }

    /// A handled signal ends: charge it to the engine's reported cost (the
    /// time in our handler plus the round trip outside it).
    pub fn account(&mut self, engine: &Engine, trap: bool, entry_ns: u64, exit_ns: u64) {
        let handler = exit_ns.saturating_sub(entry_ns);
        let round_trip = if trap { self.trap_gap_ns as u64 } else { engine.signal_cost_ns };
        self.counters.engine_ns += round_trip + handler;
        self.exit_ns = exit_ns;
    }

    fn free(&mut self, i: usize) {
        let ctx = self.slots[i].ctx;
        let node = self.tree.node(ctx);
        node.armed = node.armed.saturating_sub(1);
        self.disarm(i);
        self.reservoir.slot_freed();
    }

    /// This thread's part of the profile.
    pub fn to_profile(&self) -> profile::Thread {
        crate::context::thread_profile(self.tid as u32, &self.tree, &self.pairs, self.counters.clone())
    }
}

/// Instruction bytes at `pc`: directly inside a known module, otherwise via
/// a fault-proof kernel copy (JIT code, vDSO).
fn code_bytes<'a>(map: &ProcessMap, pc: u64, buf: &'a mut [u8; 16]) -> Option<&'a [u8]> {
    if let Some(m) = map.module(pc) {
        let n = ((m.end - pc) as usize).min(16);
        unsafe { std::ptr::copy_nonoverlapping(pc as *const u8, buf.as_mut_ptr(), n) };
        return Some(&buf[..n]);
    }
    modules::STALE.store(true, std::sync::atomic::Ordering::Relaxed);
    for n in [16usize, 8, 4] {
        if perf::read_memory(pc, &mut buf[..n]) {
            return Some(&buf[..n]);
        }
    }
    None
}
