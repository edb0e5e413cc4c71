//! The program's own view of a thread's signal mask, for the signals the
//! agent owns. The agent keeps its signals out of the masks the program
//! sets ([`crate::dispositions`]), so that a thread that blocks every
//! signal is still sampled; what the program asked for is kept here, per
//! thread, so that the agent can act as the kernel would have:
//! - the old mask the program is told holds them again;
//! - a signal of the program's own (one it queues to itself, say) that
//!   the agent's handler takes while the program's view blocks it is
//!   *held*: put back, pending, and blocked in the kernel's mask for real,
//!   for the program's `sigwaitinfo` or `signalfd` to take, or for its
//!   handler once it unblocks it (before, the agent passed it to the
//!   program's disposition, and the default action of a real-time signal
//!   ended the process). While the sampler's signal is held, the thread's
//!   sampler is paused, so that none of witch's ticks waits in the
//!   program's way.
//!
//! Kernel sets here: bit `n - 1` for signal `n`.

use std::sync::atomic::{AtomicU64, Ordering};
use witchcraft::sys::task;

/// One thread's view (in its slot of the thread table). Written by the
/// thread itself (its mask calls, its handlers), read by the threads it
/// creates before they start.
#[derive(Debug)]
pub struct MaskView {
    /// The agent's signals the program blocks on this thread.
    blocks: AtomicU64,
    /// Of those, the ones blocked in the kernel's mask (held for the program).
    held: AtomicU64,
    /// When (the thread's CPU time, ns) its sampler's next tick was due
    /// when it paused (0: none).
    left: AtomicU64,
}

/// What a mask call of the program's changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    /// The view before the call (what the old mask the program is told
    /// must hold of the agent's signals).
    pub before: u64,
    /// The agent's signals to leave out of the set the kernel is given.
    pub leave_out: u64,
    /// Held signals the program no longer blocks: the kernel unblocks them.
    pub released: u64,
}

impl Default for MaskView {
    fn default() -> Self {
        MaskView::new()
    }
}

impl MaskView {
    pub const fn new() -> MaskView {
        MaskView { blocks: AtomicU64::new(0), held: AtomicU64::new(0), left: AtomicU64::new(0) }
    }

    /// A new thread takes the slot over: nothing blocked.
    pub fn forget(&self) {
        self.blocks.store(0, Ordering::Release);
        self.held.store(0, Ordering::Release);
        self.left.store(0, Ordering::Release);
    }

    /// A new thread starts with its creator's mask (the kernel copies it).
    pub fn inherit(&self, creator: &MaskView) {
        self.set(creator.blocks(), creator.held());
    }

    /// The view a thread had (a fork child's, kept across its slot's reset).
    pub fn set(&self, blocks: u64, held: u64) {
        self.blocks.store(blocks, Ordering::Release);
        self.held.store(held, Ordering::Release);
    }

    /// The agent's signals the program blocks on this thread.
    pub fn blocks(&self) -> u64 {
        self.blocks.load(Ordering::Acquire)
    }

    /// The ones blocked in the kernel's mask, for the program.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Acquire)
    }

    /// The program changes its mask (`how`: `SIG_BLOCK`, `SIG_UNBLOCK`,
    /// `SIG_SETMASK`), naming `asked` of the agent's signals `ours`. None
    /// for another `how` (the kernel refuses it; nothing changes).
    pub fn program_sets(&self, how: i32, asked: u64, ours: u64) -> Option<Change> {
        let before = self.blocks();
        let after = match how {
            libc::SIG_BLOCK => before | asked,
            libc::SIG_UNBLOCK => before & !asked,
            libc::SIG_SETMASK => asked,
            _ => return None,
        } & ours;
        self.blocks.store(after, Ordering::Release);
        let held = self.held();
        self.held.store(held & after, Ordering::Release);
        Some(Change { before, leave_out: ours & !(held & after), released: held & !after })
    }

    /// Signal `sig`'s bits are now held in the kernel's mask for the program.
    pub fn hold(&self, bits: u64) {
        self.held.fetch_or(bits, Ordering::AcqRel);
    }

    /// The sampler paused with `left` ns of the thread's CPU time to its
    /// next tick (0: it was stopped): the tick is kept as due at that CPU
    /// time; one parked earlier and not taken stays. Async-signal-safe.
    pub fn park_sampler(&self, left: u64) {
        if left > 0 {
            let due = task::thread_cpu_ns().saturating_add(left);
            let _ = self.left.compare_exchange(0, due, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// How long (ns of the thread's CPU time) until the tick
    /// [`MaskView::park_sampler`] kept is due, at least 1; 0 if none was
    /// kept. Held time counts towards it, as it would have: a timer paused
    /// and started again with what it had left, time and again, fell
    /// behind and never fired.
    pub fn take_sampler_left(&self) -> u64 {
        match self.left.swap(0, Ordering::AcqRel) {
            0 => 0,
            due => due.saturating_sub(task::thread_cpu_ns()).max(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OURS: u64 = 1 << 4 | 1 << 40;
    const SAMPLER: u64 = 1 << 40;

    #[test]
    fn the_view_follows_the_programs_calls() {
        let v = MaskView::new();
        // Blocks everything: the view holds both, the kernel gets neither.
        assert_eq!(v.program_sets(libc::SIG_BLOCK, OURS, OURS), Some(Change { before: 0, leave_out: OURS, released: 0 }));
        assert_eq!(v.blocks(), OURS);
        // Unblocks one; the old mask must still show both.
        assert_eq!(v.program_sets(libc::SIG_UNBLOCK, 1 << 4, OURS).map(|c| c.before), Some(OURS));
        assert_eq!(v.blocks(), SAMPLER);
        // An unknown `how` changes nothing.
        assert_eq!(v.program_sets(7, 0, OURS), None);
        assert_eq!(v.blocks(), SAMPLER);
        // Sets a mask without them.
        v.program_sets(libc::SIG_SETMASK, 0, OURS);
        assert_eq!(v.blocks(), 0);
    }

    #[test]
    fn a_held_signal_stays_blocked_until_the_program_unblocks_it() {
        let v = MaskView::new();
        v.program_sets(libc::SIG_SETMASK, SAMPLER, OURS);
        v.hold(SAMPLER);
        // Blocking more, or setting a mask that blocks it still, keeps it
        // in the kernel's mask; the other signal stays out.
        assert_eq!(v.program_sets(libc::SIG_BLOCK, 1 << 4, OURS).map(|c| (c.leave_out, c.released)), Some((1 << 4, 0)));
        assert_eq!(v.program_sets(libc::SIG_SETMASK, SAMPLER, OURS).map(|c| (c.leave_out, c.released)), Some((1 << 4, 0)));
        assert_eq!(v.held(), SAMPLER);
        // A mask without it releases it.
        assert_eq!(v.program_sets(libc::SIG_SETMASK, 0, OURS).map(|c| (c.leave_out, c.released)), Some((OURS, SAMPLER)));
        assert_eq!(v.held(), 0);
        // A new thread inherits its creator's view.
        v.program_sets(libc::SIG_BLOCK, SAMPLER, OURS);
        v.hold(SAMPLER);
        let child = MaskView::new();
        child.inherit(&v);
        assert_eq!((child.blocks(), child.held()), (SAMPLER, SAMPLER));
        child.forget();
        assert_eq!((child.blocks(), child.held()), (0, 0));
    }

    #[test]
    fn a_paused_samplers_next_tick_is_kept_as_due() {
        let v = MaskView::new();
        v.park_sampler(0);
        assert_eq!(v.take_sampler_left(), 0, "a stopped sampler keeps no tick");
        v.park_sampler(5_000_000_000);
        // A second pause before the sampler went on keeps the first tick.
        v.park_sampler(1);
        let left = v.take_sampler_left();
        assert!((4_000_000_000..=5_000_000_000).contains(&left), "{left} ns left");
        assert_eq!(v.take_sampler_left(), 0, "taken once");
        // One long past due comes at once.
        v.park_sampler(1);
        let t0 = task::thread_cpu_ns();
        while task::thread_cpu_ns() < t0 + 1_000_000 {}
        assert_eq!(v.take_sampler_left(), 1);
    }
}
