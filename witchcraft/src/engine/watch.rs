//! A thread's watchpoints: what each debug register watches for the craft,
//! and which one a new sample gets (Witch §4.4.1, [`crate::replacement`]).

use super::process::Engine;
use crate::craft::{Watched, SNAPSHOT};
use crate::replacement::{Reservoir, SlotView};
use crate::sys::watchpoint::{Arming, Breakpoint};
use crate::sys::{mem, perf, siginfo};
use rand::{rngs::SmallRng, RngExt, SeedableRng};

/// x86 has four debug registers.
pub const MAX_SLOTS: usize = 4;

/// The sampled instruction has not run yet (a software sample that looked
/// forward), so its own access traps first: these identify that self-trap.
#[derive(Clone, Copy, Debug, Default)]
pub struct SelfTrap {
    /// The sampled instruction.
    pub pc: u64,
    /// The instruction after it (where a trap after it lands).
    pub next: u64,
    /// A branch or `rep` instruction: it may land anywhere, or on itself.
    pub anywhere: bool,
}

impl SelfTrap {
    /// Is a trap with context PC `rip` the sampled instruction's own?
    pub fn is(&self, rip: u64) -> bool {
        rip == self.next || self.anywhere || rip == self.pc
    }
}

/// One debug register and what the craft watches with it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Slot {
    pub bp: Breakpoint,
    pub armed: bool,
    /// The breakpoint is enabled: armed, or parked enabled (in-place kernels).
    pub live: bool,
    /// Sequence number of the sample that armed it.
    pub armed_seq: u64,
    /// C_watch
    pub ctx: u32,
    /// The watched, naturally aligned piece (≤ 8 bytes) of the sampled access.
    pub addr: u64,
    pub len: u64,
    pub watched: Watched,
    /// Set until the sampled instruction's own access has trapped.
    pub self_trap: Option<SelfTrap>,
    /// Traps the craft ignored since arming (LoadCraft: stores).
    pub ignored: u32,
}

pub struct Watchpoints {
    slots: [Slot; MAX_SLOTS],
    /// Slots with a debug register.
    n: usize,
    arming: Option<Arming>,
    /// Never accessed: a disarmed breakpoint parks here.
    parking: Box<u64>,
    reservoir: Reservoir,
    /// Samples offered so far.
    seq: u64,
    rng: SmallRng,
}

impl Watchpoints {
    pub fn new(engine: &Engine, seed: u64) -> Watchpoints {
        Watchpoints {
            slots: [Slot::default(); MAX_SLOTS],
            n: 0,
            arming: None,
            parking: Box::new(0),
            reservoir: Reservoir::new(engine.config.replacement),
            seq: 0,
            rng: SmallRng::seed_from_u64(seed),
        }
    }

    pub fn parking_addr(&self) -> u64 {
        &*self.parking as *const u64 as u64
    }

    /// Take up to the configured number of debug registers for thread `tid`
    /// (`open_tid` 0 when it is the calling thread), leaving `spare` of them
    /// for other uses while that leaves at least one. At least one, or why
    /// not.
    pub fn open(&mut self, engine: &Engine, tid: i32, open_tid: i32, spare: usize) -> Result<(), String> {
        let how = Arming {
            ty: engine.craft.watch(),
            sigtrap: engine.sigtrap,
            modify: engine.modify,
            in_place: engine.in_place,
            tid,
            parking: self.parking_addr(),
        };
        self.arming = Some(how);
        let want = engine.config.debug_registers.min(MAX_SLOTS);
        let want = want.saturating_sub(spare).max(1);
        self.n = 0;
        for i in 0..want {
            match Breakpoint::open_parked(&how, siginfo::slot_tag(i), open_tid) {
                Ok(bp) => {
                    self.slots[i] = Slot { bp, ..Default::default() };
                    self.n += 1;
                }
                Err(e) if i == 0 => return Err(why_no_watchpoint(e)),
                Err(_) => break,
            }
        }
        Ok(())
    }

    /// Give the debug registers back.
    pub fn close(&mut self) {
        for s in &mut self.slots[..self.n] {
            s.bp.close();
            s.armed = false;
            s.live = false;
        }
        self.n = 0;
    }

    /// Slots with a debug register: the slots are `0..open_slots()`.
    pub fn open_slots(&self) -> usize {
        self.n
    }

    /// Slot `i`, if it has a debug register and watches a sample.
    pub fn armed(&self, i: usize) -> Option<Slot> {
        self.slots[..self.n].get(i).filter(|s| s.armed).copied()
    }

    /// Slot `i` as it is (armed or not).
    pub fn slot(&self, i: usize) -> Slot {
        self.slots[i]
    }

    /// The sampled instruction's own access has trapped (or another did
    /// first): traps on slot `i` are the next access's from now on.
    pub fn self_trap_passed(&mut self, i: usize) {
        self.slots[i].self_trap = None;
    }

    /// The store slot `i` watches has run: remember the value it left.
    pub fn snapshot_after_store(&mut self, i: usize) {
        snapshot(&mut self.slots[i].watched);
    }

    /// The craft ignored a trap on slot `i`: how many in a row now.
    pub fn note_ignored(&mut self, i: usize) -> u32 {
        self.slots[i].ignored += 1;
        self.slots[i].ignored
    }

    /// Hold slot `i`'s breakpoint off while a single step runs the access
    /// it would trap on (the burst judges that access itself); it stays
    /// armed.
    pub fn hold_off(&self, i: usize) {
        self.slots[i].bp.disable();
    }

    /// Let slot `i`'s breakpoint fire again after [`Self::hold_off`].
    pub fn hold_on(&self, i: usize) {
        perf::enable(self.slots[i].bp.fd());
    }

    /// Debug registers held.
    pub fn held(&self) -> usize {
        self.slots[..self.n].iter().filter(|s| s.bp.is_open()).count()
    }

    /// The slot whose event has this fd (F_SETSIG route).
    pub fn slot_of_fd(&self, fd: i32) -> Option<usize> {
        self.slots[..self.n].iter().position(|s| s.bp.fd() == fd)
    }

    /// A uniform random number (which element of a wide access to watch).
    pub fn random(&mut self) -> u64 {
        self.rng.random::<u64>()
    }

    /// Which slot the next sample gets, by the replacement policy; None: the
    /// sample goes unmonitored.
    pub fn choose(&mut self) -> Option<usize> {
        self.seq += 1;
        let mut views = [SlotView::default(); MAX_SLOTS];
        for (v, s) in views.iter_mut().zip(&self.slots[..self.n]) {
            *v = SlotView { armed: s.armed, armed_seq: s.armed_seq };
        }
        let rng = &mut self.rng;
        self.reservoir.choose(&views[..self.n], |m| rng.random_range(0..m))
    }

    /// Will arming slot `i` re-target its enabled breakpoint in place (the
    /// kernel patch's fast path)?
    pub fn arms_in_place(&self, i: usize) -> bool {
        self.arming.is_some_and(|how| how.in_place) && self.slots[i].live
    }

    /// Point slot `i` at `[addr, addr+len)` for `watched`, armed from
    /// context `ctx`. False (slot left parked) if the kernel refused.
    pub fn arm(&mut self, i: usize, addr: u64, len: u64, ctx: u32, watched: Watched, self_trap: Option<SelfTrap>) -> bool {
        let Some(how) = self.arming else { return false };
        let mut bp = self.slots[i].bp;
        let ok = bp.retarget(&how, siginfo::slot_tag(i), addr, len);
        self.slots[i] = if ok {
            Slot { bp, armed: true, live: true, armed_seq: self.seq, ctx, addr, len, watched, self_trap, ignored: 0 }
        } else {
            Slot { bp, ..Default::default() }
        };
        ok
    }

    /// Stop watching with slot `i`; it is free for the next sample. On a
    /// kernel that re-targets in place it parks enabled, so that its next
    /// arming is in place too (two fast ioctls instead of a disable and an
    /// enable through the perf core).
    pub fn free(&mut self, i: usize) {
        let s = &mut self.slots[i];
        match self.arming {
            Some(how) if how.in_place && s.live => s.live = s.bp.park_enabled(&how, siginfo::slot_tag(i)),
            _ => {
                s.bp.disable();
                s.live = false;
            }
        }
        s.armed = false;
        self.reservoir.slot_freed();
    }

    /// Forget what was armed (a fork child), keeping nothing open.
    pub fn reset(&mut self) {
        self.close();
        self.slots = [Slot::default(); MAX_SLOTS];
        self.reservoir.k = 0;
    }
}

/// Read the value of the watched access `w` as its bytes are now (value
/// crafts: a load's value is what it reads, a store's what it left); none
/// if they cannot be read. Async-signal-safe.
pub fn snapshot(w: &mut Watched) {
    let n = (w.access.len as usize).min(SNAPSHOT);
    w.value_len = if mem::read_own(w.access.addr, &mut w.value[..n]) { n } else { 0 };
}

/// Why a thread got no watchpoint at all, from the errno.
fn why_no_watchpoint(e: i32) -> String {
    match e {
        libc::ENOSPC => "no free debug registers: a debugger or another tool may be using them".into(),
        libc::ESRCH => "the thread ended before it could be set up".into(),
        libc::EMFILE | libc::ENFILE => match crate::sys::fd::reserved_grown() {
            // One descriptor a debug register and thread (and one for a perf
            // sampler), in the numbers witch keeps below the program's limit.
            Some((floor, top)) => format!(
                "no file descriptor left for more threads' watchpoints: witch keeps its {} in numbers {floor} to {} \
                 (the top of the program's RLIMIT_NOFILE, at most {}), one per debug register and thread; \
                 a higher `ulimit -n` profiles more threads",
                top - floor,
                top - 1,
                crate::sys::fd::TOP_GROWN
            ),
            None => "no file descriptor left for the thread's watchpoints (the program's RLIMIT_NOFILE is reached)".into(),
        },
        _ => format!("cannot open a watchpoint: {}", std::io::Error::from_raw_os_error(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_traps_are_recognised_by_pc() {
        let s = SelfTrap { pc: 0x10, next: 0x14, anywhere: false };
        assert!(s.is(0x14) && s.is(0x10) && !s.is(0x18));
        assert!(SelfTrap { anywhere: true, ..s }.is(0x999));
    }
}
