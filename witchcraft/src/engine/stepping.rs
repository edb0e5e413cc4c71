//! What single-stepping a burst rests on: the trap flag in the interrupted
//! context, the ticks at which a burst may not begin ([`refusal`]), whose
//! time an instruction leaves behind ([`foreign_time`]), which access of a
//! stepped instruction an armed debug register would see ([`trapping`],
//! [`Intercept`]), and one thread's burst under way ([`Burst`]: its steps,
//! the accesses it counted and picked, and what became of each). The burst
//! path that drives it is [`super::burst`].
//!
//! A burst never steps an instruction that could let the trap flag leak or
//! be seen (`pushf`, `popf`), enter the kernel (`syscall`, `int`), or change
//! how traps are delivered; it ends just before one. It never starts when the
//! program blocks SIGTRAP, or already single-steps itself.

use super::ledger;
use super::pick::{reservoirs_taking, Candidate, MAX_PICKS};
use super::process::Engine;
use super::settings::{BurstSettings, BurstWeight};
use super::watch::{snapshot, MAX_SLOTS};
use crate::craft::{Verdict, Watched};
use crate::sys::perf::BpType;
use crate::x86::decode::{Access, Decoded};
use rand::{rngs::SmallRng, RngExt, SeedableRng};

/// The trap flag in EFLAGS (EFLAGS.TF).
pub(super) const TRAP_FLAG: i64 = 0x100;

/// Whose time a tick landed after, when not the program's.
pub(super) enum Foreign {
    Hypervisor,
    Kernel,
}

/// Why a tick did not begin a burst.
pub(super) enum Refusal {
    /// SIGTRAP is blocked where the program resumes: a step would kill it.
    Blocked,
    /// The program single-steps itself.
    Stepping,
}

/// # Safety
/// `uc` must be the context the kernel passed to the signal handler.
pub(super) unsafe fn refusal(uc: *const libc::ucontext_t) -> Option<Refusal> {
    // SAFETY: forwarded from the caller; sigismember only reads the set.
    unsafe {
        if libc::sigismember(&(*uc).uc_sigmask, libc::SIGTRAP) == 1 {
            return Some(Refusal::Blocked);
        }
        if (*uc).uc_mcontext.gregs[libc::REG_EFL as usize] & TRAP_FLAG != 0 {
            return Some(Refusal::Stepping);
        }
    }
    None
}

/// Whose time an instruction starting with `code` leaves behind it, when
/// not the program's: `cpuid` exits to the hypervisor in a virtual
/// machine; `syscall`, `sysenter` and `int 0x80` enter the kernel.
pub(super) fn foreign_time(code: &[u8]) -> Option<Foreign> {
    match code {
        [0x0f, 0xa2, ..] => Some(Foreign::Hypervisor),
        [0x0f, 0x05, ..] | [0x0f, 0x34, ..] | [0xcd, 0x80, ..] => Some(Foreign::Kernel),
        _ => None,
    }
}

/// # Safety
/// `uc` must be the context the kernel passed to the signal handler.
pub(super) unsafe fn set_trap_flag(uc: *mut libc::ucontext_t, on: bool) {
    // SAFETY: forwarded from the caller.
    let efl = unsafe { &mut (*uc).uc_mcontext.gregs[libc::REG_EFL as usize] };
    if on {
        *efl |= TRAP_FLAG;
    } else {
        *efl &= !TRAP_FLAG;
    }
}

/// Does access `a` make a debug register of type `ty` on [addr, addr+len) fire?
pub(super) fn fires(ty: BpType, a: &Access, addr: u64, len: u64) -> bool {
    a.overlap(addr, len) > 0 && (ty == BpType::RW || a.write)
}

/// The access of `d` that a debug register on [addr, addr+len) would see
/// first: a load before a store in the same instruction (`add [m], r`).
pub(super) fn trapping(d: &Decoded, ty: BpType, addr: u64, len: u64) -> Option<Access> {
    let mut best: Option<Access> = None;
    for a in d.accesses().iter().filter(|a| fires(ty, a, addr, len)) {
        match best {
            Some(b) if b.read => {}
            _ => best = Some(*a),
        }
    }
    best
}

/// An access to bytes an armed debug register watches, made by the
/// instruction about to run; the register was disabled before it ran.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Intercept {
    pub(super) access: Access,
    pub(super) trap_ctx: u32,
    /// Judged before the instruction ran (no value needed after it).
    pub(super) verdict: Option<Verdict>,
}

/// A verdict that needs the bytes after the instruction ran: a store's,
/// for crafts that compare values.
pub(super) fn judged_after(engine: &Engine, a: &Access) -> bool {
    engine.craft.needs_value() && !a.read
}

/// The craft's verdict on `trap` touching the bytes of `w`, within a
/// burst: with the bytes as they are now, or, where they cannot be read,
/// a use (the burst cannot tell, and keeps its pick as not wasted).
pub(super) fn judge_now(engine: &Engine, w: &Watched, trap: &Access) -> Verdict {
    ledger::judge(engine, w, trap).unwrap_or(Verdict::Use { bytes: crate::craft::credited(w, trap) })
}

/// What a tick found of the burst before it.
pub(super) enum TickInBurst {
    /// No burst under way.
    Idle,
    /// Still stepping: this tick's period ran out inside the burst.
    Stepping,
    /// No step since the last tick: the trap flag was lost (e.g. to a
    /// `siglongjmp` out of the program's own handler, or is in a frame
    /// the program's own handler returns to); the burst is forgotten, and
    /// the flag it may have left behind remembered
    /// ([`Burst::take_left_trap_flag`]).
    Lost,
}

/// An access of the craft's kind that a reservoir takes (see
/// [`Burst::count`]).
pub(super) struct Taken {
    /// Which reservoirs take it.
    slots: [bool; MAX_PICKS],
    /// Which of the burst's accesses it is (1 for the first).
    id: u64,
    /// Its bytes.
    len: u64,
}

/// One thread's burst state.
pub struct Burst {
    active: bool,
    /// Steps taken.
    steps: u32,
    /// Steps taken when the last tick arrived (a tick that finds no step
    /// since the previous one means the trap flag was lost).
    steps_at_tick: u32,
    /// Accesses of the craft's kind executed so far: K.
    seen: u64,
    /// Their bytes: B.
    bytes: u64,
    /// The program-time weight of the tick that began the burst.
    time_weight: f64,
    /// Program time of ticks skipped since the last burst, in periods.
    carried: f64,
    /// Steps this burst may take.
    limit: u32,
    picks: [Option<Candidate>; MAX_PICKS],
    intercepts: [Option<Intercept>; MAX_SLOTS],
    rng: SmallRng,
    /// A window's pick: the picked access is the nth of the craft's kind
    /// that the stepped instruction makes, and it stands for this weight
    /// (see `super::window`); None: the burst's reservoir picks.
    forced: Option<(u32, f64)>,
    /// A burst was given up as lost with its trap flag perhaps still in a
    /// frame the program's own handler returns to: the next step trap no
    /// burst claims is that flag's.
    left_trap_flag: bool,
}

impl Burst {
    pub fn new(seed: u64) -> Burst {
        Burst {
            active: false,
            steps: 0,
            steps_at_tick: 0,
            seen: 0,
            bytes: 0,
            time_weight: 0.0,
            carried: 0.0,
            limit: 0,
            picks: [None; MAX_PICKS],
            intercepts: [None; MAX_SLOTS],
            rng: SmallRng::seed_from_u64(seed ^ 0xb0b5_7ea1),
            forced: None,
            left_trap_flag: false,
        }
    }

    /// Is a burst under way (the thread single-steps)?
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// Is the step about to be handled the first of the burst under way?
    pub fn first_step(&self) -> bool {
        self.active && self.steps == 0
    }

    /// A step trap no burst claims: was it the flag of a burst given up as
    /// lost? (Once: the flag left behind traps once.)
    pub fn take_left_trap_flag(&mut self) -> bool {
        std::mem::take(&mut self.left_trap_flag)
    }

    /// Forget the burst under way, and the time of skipped ticks (a fork
    /// child's belongs to its parent).
    pub fn reset(&mut self) {
        self.active = false;
        self.forced = None;
        self.carried = 0.0;
        self.picks = [None; MAX_PICKS];
        self.intercepts = [None; MAX_SLOTS];
    }

    /// A tick arrived: what it finds of the burst before it.
    pub(super) fn tick(&mut self) -> TickInBurst {
        if !self.active {
            return TickInBurst::Idle;
        }
        if self.steps != self.steps_at_tick {
            self.steps_at_tick = self.steps;
            return TickInBurst::Stepping;
        }
        self.reset();
        self.left_trap_flag = true;
        TickInBurst::Lost
    }

    /// A tick that begins no burst: its program time (`weight` periods)
    /// goes to the next one.
    pub(super) fn carry(&mut self, weight: f64) {
        self.carried += weight;
    }

    /// The program time carried from skipped ticks, taken.
    pub(super) fn take_carried(&mut self) -> f64 {
        std::mem::take(&mut self.carried)
    }

    /// Begin a burst of at most `limit` steps, its tick standing for
    /// `weight` periods of program time.
    pub(super) fn begin(&mut self, limit: u32, weight: f64) {
        self.active = true;
        self.limit = limit;
        self.steps = 0;
        self.steps_at_tick = 0;
        self.seen = 0;
        self.bytes = 0;
        self.time_weight = weight;
        self.forced = None;
        self.picks = [None; MAX_PICKS];
        self.intercepts = [None; MAX_SLOTS];
    }

    /// Begin a burst of one step whose pick is the `nth` access of the
    /// craft's kind of the instruction, standing for `weight` (a window's
    /// pick).
    pub(super) fn begin_pick(&mut self, nth: u32, weight: f64) {
        self.begin(1, weight);
        self.forced = Some((nth, weight));
    }

    /// The instruction of [`Burst::begin_pick`] cannot be stepped.
    pub(super) fn abandon_pick(&mut self) {
        self.active = false;
        self.forced = None;
    }

    /// A step was taken: may the burst take another?
    pub(super) fn step_taken(&mut self) -> bool {
        self.steps += 1;
        self.steps < self.limit
    }

    /// The instruction about to run would make armed slot `i` fire.
    pub(super) fn intercept(&mut self, i: usize, x: Intercept) {
        self.intercepts[i] = Some(x);
    }

    pub(super) fn take_intercept(&mut self, i: usize) -> Option<Intercept> {
        self.intercepts[i].take()
    }

    /// Pick `k`, if the burst holds one there.
    pub(super) fn pick(&self, k: usize) -> Option<Candidate> {
        self.picks[k]
    }

    /// Pick `k`'s next access is `a`, in context `trap_ctx`, to be judged
    /// after its instruction ran.
    pub(super) fn judge_after_step(&mut self, k: usize, a: Access, trap_ctx: u32) {
        if let Some(c) = self.picks[k].as_mut() {
            c.trap_after = Some((a, trap_ctx));
        }
    }

    /// Pick `k`'s next access, in context `trap_ctx`, was judged `v`.
    pub(super) fn settle(&mut self, k: usize, v: Verdict, trap_ctx: u32) {
        let Some(c) = self.picks[k].as_mut() else { return };
        if v == Verdict::Ignore {
            c.ignored += 1;
            c.dropped = c.ignored >= ledger::MAX_IGNORED;
        } else {
            c.verdict = Some((v, trap_ctx));
        }
    }

    /// The stepped instruction ran: take the values of the picks that
    /// needed it (a store's), and judge the next accesses that waited for
    /// it.
    pub(super) fn after_step(&mut self, engine: &Engine) {
        for k in 0..MAX_PICKS {
            let Some(c) = self.picks[k].as_mut() else { continue };
            if c.snapshot_after {
                c.snapshot_after = false;
                snapshot(&mut c.watched);
            }
            if let Some((a, trap_ctx)) = c.trap_after.take() {
                let w = c.watched;
                let v = judge_now(engine, &w, &a);
                self.settle(k, v, trap_ctx);
            }
        }
    }

    /// Count an access of the craft's kind, of `len` bytes, the `nth` of
    /// its instruction: whether the reservoirs take it (a reservoir of
    /// `m` over the accesses seen, each access alike, or `m` reservoirs of
    /// one, each holding an access with probability its bytes over the
    /// bytes seen: `by_bytes`), or, for a window's pick, whether it is the
    /// one named.
    pub(super) fn count(&mut self, len: u64, nth: u32, by_bytes: bool, m: u64) -> Option<Taken> {
        self.seen += 1;
        self.bytes += len;
        let slots = match self.forced {
            // A window's pick: exactly the access its countdown named.
            Some((n, _)) => {
                let mut s = [false; MAX_PICKS];
                s[0] = nth == n;
                s
            }
            None => reservoirs_taking(&mut self.rng, by_bytes, m, self.seen, self.bytes, len),
        };
        slots.contains(&true).then_some(Taken { slots, id: self.seen, len })
    }

    /// A uniform random number (which element of a wide access to watch).
    pub(super) fn random(&mut self) -> u64 {
        self.rng.random::<u64>()
    }

    /// Hold the access `taken` in its reservoirs: its context `ctx`, its
    /// watched piece and value `watched`, whose value is to be read after
    /// its instruction ran (`snapshot_after`).
    pub(super) fn hold(&mut self, taken: Taken, ctx: u32, watched: Watched, snapshot_after: bool) {
        let (waddr, wlen) = watched.piece;
        let c = Candidate { id: taken.id, len: taken.len, ctx, waddr, wlen, watched, snapshot_after, ..Default::default() };
        for (k, _) in taken.slots.iter().enumerate().filter(|(_, &on)| on) {
            self.picks[k] = Some(c);
        }
    }

    /// The burst is over: it steps no more. Returns the debug registers
    /// its last instruction would have made fire (that instruction did not
    /// run: they go back to watching).
    pub(super) fn stop(&mut self) -> [Option<Intercept>; MAX_SLOTS] {
        self.active = false;
        std::mem::replace(&mut self.intercepts, [None; MAX_SLOTS])
    }

    /// The burst's picks, each once, with the weight each becomes a sample
    /// of (the burst is over: see [`Burst::stop`]). Each pick stands for
    /// K/m of the K accesses stepped (m picks), or, picked by bytes, for
    /// B/m of their B bytes: its weight in accesses is then B/(m len), so
    /// that its verdict's bytes (len) make B/m. Reservoirs that hold the
    /// same access make one sample of their summed weight (one debug
    /// register, one verdict).
    pub(super) fn weigh(&mut self, settings: &BurstSettings) -> [Option<(Candidate, f64)>; MAX_PICKS] {
        let mut out = [None; MAX_PICKS];
        // A window's pick is this burst's alone, held or not (its access
        // may have been witch's own memory).
        let forced = self.forced.take();
        let m = self.picks.iter().flatten().count();
        if m == 0 {
            return out;
        }
        let (seen, bytes) = (self.seen as f64, self.bytes as f64);
        // Per step: the burst's accesses per instruction, in units of the
        // longest burst's.
        let time_weight = match settings.weight {
            BurstWeight::PerStep => self.time_weight * settings.steps.max(1) as f64 / self.steps.max(1) as f64,
            _ => self.time_weight,
        };
        let weight_of = |c: &Candidate| {
            if let Some((_, w)) = forced {
                w
            } else if settings.weight == BurstWeight::PerBurst {
                time_weight / m as f64
            } else if settings.by_bytes {
                bytes / (m as f64 * c.len.max(1) as f64) * time_weight
            } else {
                seen / m as f64 * time_weight
            }
        };
        let picks = std::mem::replace(&mut self.picks, [None; MAX_PICKS]);
        for k in 0..MAX_PICKS {
            let Some(c) = picks[k] else { continue };
            if picks[..k].iter().flatten().any(|p| p.id == c.id) {
                continue;
            }
            let weight: f64 = picks[k..].iter().flatten().filter(|p| p.id == c.id).map(weight_of).sum();
            out[k] = Some((c, weight));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A window's pick names one access of its instruction; when that one
    /// is not held (witch's own memory), the next burst must not inherit
    /// the name, nor its weight: a reservoir of one takes its first access.
    #[test]
    fn a_window_pick_held_by_nothing_leaves_nothing_to_the_next_burst() {
        let mut b = Burst::new(1);
        b.begin_pick(2, 7.0);
        assert!(b.count(8, 1, false, 1).is_none(), "the pick names the second access");
        b.stop();
        b.begin(24, 1.0);
        assert!(b.count(8, 1, false, 1).is_some(), "a burst's reservoir of one takes its first access");
    }

    #[test]
    fn foreign_time_is_read_from_the_two_bytes_of_the_instruction() {
        assert!(matches!(foreign_time(&[0x0f, 0xa2, 0x48]), Some(Foreign::Hypervisor)));
        for code in [[0x0f, 0x05], [0x0f, 0x34], [0xcd, 0x80]] {
            assert!(matches!(foreign_time(&code), Some(Foreign::Kernel)), "{code:x?}");
        }
        // `int 3`, `ud2`, a lone byte, and `cpuid`'s bytes the other way round.
        for code in [&[0xcd, 0x03][..], &[0x0f, 0x0b], &[0x0f], &[0xa2, 0x0f]] {
            assert!(foreign_time(code).is_none(), "{code:x?}");
        }
    }
}
