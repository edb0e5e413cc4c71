//! The sample path (a signal handler): find the access the sample stands
//! for, count it in its calling context (µ), and give it a watchpoint if
//! the replacement policy says so.

use super::process::Engine;
use super::thread::ThreadState;
use super::watch::SelfTrap;
use crate::modules::{self, ProcessMap};
use crate::sys::pmu;
use crate::x86::decode::{self, Access, Regs};
use crate::x86::precise_pc;

/// How many instructions back from the interrupted PC to look for the
/// access the time belongs to (a timer's skid is usually 1 instruction for
/// stores, 2 for loads whose consumer stalls: docs/DESIGN.md).
const SKID: usize = 3;

impl ThreadState {
    /// A sampler interrupt.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(crate) unsafe fn on_sample(&mut self, engine: &Engine, uc: *mut libc::ucontext_t) {
        self.ledger.note_interrupt();
        let Some(map) = modules::current() else { return };
        // SAFETY: forwarded from the caller.
        let regs = unsafe { self.ledger.regs(uc) };
        let pmu = self.sampler.is_pmu();
        // task-clock also runs while the kernel delivers our signals. A
        // period that ends there fires where the program resumes (measured:
        // Listing 4.3's densely trapping *p/*q at 36% instead of 25%).
        if !pmu && self.clock.is_overdue(&regs) {
            self.ledger.counters.overdue += 1;
            return;
        }
        self.clock.resume_at(&regs);
        // A software period counts the engine's time too; weigh this sample
        // by the program's own time since the last one, in periods, so code
        // where traps are dense (and so the engine's time) is not
        // over-sampled. Measured on Listing 4.3 at -p 100000: 35%/35%/15%/15%
        // unweighted, 25% each expected.
        let weight = if pmu { 1.0 } else { self.clock.sample_weight(engine.signal_cost_ns, engine.period) };
        if pmu {
            // Precise IP and data address come from the PMU record.
            let mut recs = [pmu::PmuRecord::default(); 8];
            let mut n = 0;
            self.sampler.drain_pmu(|r| {
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
        if engine.is_own_code(regs.rip) {
            self.ledger.counters.skipped_self += 1;
            // Nearly always right after the system call of one of the
            // agent's wrappers that the program called (`syscall`, a
            // futex wait through it): time the program spent, which earns
            // the budget as a tick after a system call does.
            self.earn_without_burst(engine, weight);
            return;
        }
        if engine.burst.is_some() {
            // SAFETY: forwarded from the caller.
            unsafe { self.begin_burst(engine, map, &regs, weight, uc) };
        } else {
            self.look_around(engine, map, &regs, weight);
        }
    }

    /// A software sample: the access of the craft's kind the interrupted
    /// time belongs to.
    ///
    /// Skid: a timer interrupt is taken at a retirement boundary, and the
    /// instruction the time belongs to has usually just retired (a stalled
    /// store shows up as the PC after it; a load as the PC after its first
    /// consumer). So look back through straight-line code, up to SKID
    /// instructions, for an access of the craft's kind that has already run:
    /// its address comes from the registers now (implicit updates undone),
    /// provided no instruction since wrote them. At a branch target the
    /// predecessor may not be what ran, so then use the instruction at the
    /// PC, which has not run yet: its own access will trap first and is
    /// skipped as a self-trap.
    fn look_around(&mut self, engine: &Engine, map: &ProcessMap, regs: &Regs, weight: f64) {
        let pc = regs.rip;
        let mut buf = [0u8; 16];
        // Registers the instructions walked over changed: `written` beyond
        // repair, `steps` by a known constant (pointer increments), which
        // is undone (backward) or replayed (forward) before computing an
        // address from them.
        let mut end = pc;
        let mut written: u16 = 0;
        let mut steps = [0i64; 16];
        for _ in 0..SKID {
            let (prev, target) = self.ledger.previous_instruction(map, end);
            let Some(prev) = prev else { break };
            if target {
                break;
            }
            let Some(bytes) = precise_pc::code_at(map, prev, &mut buf) else { break };
            let clobbers = decode::clobbers_address(bytes, prev);
            let mut at = *regs;
            for (g, s) in at.gpr.iter_mut().zip(steps) {
                *g = g.wrapping_sub(s as u64);
            }
            let Some(d) = self.ledger.decode_bytes(bytes, prev, &at, true) else { break };
            if d.branch || d.rep {
                break;
            }
            if let Some(a) = d.accesses().iter().copied().find(|a| engine.craft.samples(a)) {
                if !clobbers && d.addr_regs & written == 0 && !d.partial {
                    if self.is_engine_memory(a.addr) {
                        self.ledger.counters.skipped_self += 1;
                        return;
                    }
                    return self.sample(engine, map, &at, prev, a, None, weight);
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
        let mut at = *regs;
        for _ in 0..=SKID {
            let Some(d) = self.ledger.decode(map, ip, &at, false) else { return };
            if let Some(a) = d.accesses().iter().copied().find(|a| engine.craft.samples(a)) {
                if d.addr_regs & written != 0 || d.partial {
                    return;
                }
                if self.is_engine_memory(a.addr) {
                    self.ledger.counters.skipped_self += 1;
                    return;
                }
                let own = SelfTrap { pc: ip, next: d.next_ip(), anywhere: d.branch || d.rep };
                return self.sample(engine, map, &at, ip, a, Some(own), weight);
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
        if r.addr == 0 || engine.is_own_code(r.ip) || self.is_engine_memory(r.addr) {
            self.ledger.counters.skipped_self += 1;
            return;
        }
        // Length and float kind come from decoding the sampled instruction.
        let mut a = Access {
            addr: r.addr,
            len: if r.len > 0 { r.len as u32 } else { 8 },
            read: true,
            write: true,
            float: Default::default(),
            elem: 0,
        };
        if let Some(d) = self.ledger.decode(map, r.ip, regs, false) {
            if let Some(x) = d.accesses().iter().find(|x| engine.craft.samples(x)) {
                a.len = x.len;
                a.float = x.float;
                a.elem = x.elem;
                a.read = x.read;
                a.write = x.write;
            }
        }
        if !engine.craft.samples(&a) {
            return;
        }
        // The access already happened: no self-trap to skip.
        self.sample(engine, map, regs, r.ip, a, None, 1.0);
    }

    /// Count access `a` of the instruction at `pc` as a sample of weight
    /// `weight` in its calling context (µ), and watch it if a debug
    /// register is chosen for it.
    #[allow(clippy::too_many_arguments)]
    fn sample(&mut self, engine: &Engine, map: &ProcessMap, regs: &Regs, pc: u64, a: Access, own: Option<SelfTrap>, weight: f64) {
        let ctx = self.ledger.context(map, regs, pc);
        self.ledger.count_sample(ctx, weight);
        self.ledger.watch_sample(engine, a, ctx, own);
    }
}
