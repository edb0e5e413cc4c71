//! The program's own dispositions for the signals the agent takes over
//! (SIGTRAP, the sampler's signal, the control signal), kept so that the
//! program sees its own choice through the interposed `sigaction`, and so
//! that signals that are not the agent's reach the handler it chose.
//!
//! `sigaction` writes them on any thread; signal handlers read them. A
//! lock would deadlock a handler that interrupted a writer on its own
//! thread, so each disposition is a small ring of copies under sequence
//! numbers: a writer fills a copy nobody reads and then publishes it; a
//! reader takes the latest published copy and retries only if a writer
//! reused it meanwhile (which takes several `sigaction` calls during one
//! read). Nothing here blocks.

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};

/// Signal numbers 1..=64.
pub const NSIG: usize = 65;
const WORDS: usize = std::mem::size_of::<libc::sigaction>().div_ceil(8);
const COPIES: u64 = 4;

/// One copy of a signal's `sigaction`, under its sequence number.
struct SavedAction {
    /// 2n while copy number n is complete, odd while it is being written.
    seq: AtomicU64,
    words: [AtomicU64; WORDS],
}

/// One signal's disposition as the program set it.
pub struct Disposition {
    /// The number of the latest complete copy.
    latest: AtomicU64,
    /// The number the next writer takes.
    next: AtomicU64,
    copies: [SavedAction; COPIES as usize],
}

impl Disposition {
    const fn new() -> Disposition {
        Disposition {
            latest: AtomicU64::new(0),
            next: AtomicU64::new(0),
            copies: [const { SavedAction { seq: AtomicU64::new(0), words: [const { AtomicU64::new(0) }; WORDS] } }; COPIES as usize],
        }
    }

    /// Record `sa`. Async-signal-safe, never blocks.
    pub fn store(&self, sa: &libc::sigaction) {
        let n = self.next.fetch_add(1, Ordering::AcqRel) + 1;
        let c = &self.copies[(n % COPIES) as usize];
        c.seq.store(2 * n + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        let mut words = [0u64; WORDS];
        // SAFETY: `words` is at least as large as a sigaction, which is plain data.
        unsafe { std::ptr::copy_nonoverlapping(sa as *const libc::sigaction as *const u8, words.as_mut_ptr() as *mut u8, size_of_sa()) };
        for (w, v) in c.words.iter().zip(words) {
            w.store(v, Ordering::Relaxed);
        }
        c.seq.store(2 * n, Ordering::Release);
        self.latest.fetch_max(n, Ordering::AcqRel);
    }

    /// The latest recorded disposition (all zero, i.e. SIG_DFL, if none).
    /// Async-signal-safe, never blocks.
    pub fn load(&self) -> libc::sigaction {
        loop {
            let n = self.latest.load(Ordering::Acquire);
            let c = &self.copies[(n % COPIES) as usize];
            let s1 = c.seq.load(Ordering::Acquire);
            if s1 != 2 * n {
                std::hint::spin_loop();
                continue; // reused by a later writer: take the newer latest
            }
            let mut words = [0u64; WORDS];
            for (v, w) in words.iter_mut().zip(&c.words) {
                *v = w.load(Ordering::Relaxed);
            }
            fence(Ordering::Acquire);
            if c.seq.load(Ordering::Relaxed) == s1 {
                // SAFETY: all-zero and any copied-in bit pattern of a sigaction are valid sigactions.
                let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
                // SAFETY: as in `store`, the other way.
                unsafe {
                    std::ptr::copy_nonoverlapping(words.as_ptr() as *const u8, &mut sa as *mut libc::sigaction as *mut u8, size_of_sa())
                };
                return sa;
            }
        }
    }
}

fn size_of_sa() -> usize {
    std::mem::size_of::<libc::sigaction>()
}

/// Every signal's recorded disposition, and which of them the agent has
/// taken over.
pub struct Dispositions {
    actions: [Disposition; NSIG],
    /// Bits (signal n: bit n - 1) the agent added to the `sa_mask` of the
    /// program's handler for each signal, which the program must not see.
    added_mask: [AtomicU64; NSIG],
    /// The agent's handler is installed for it; the program's choice is in `actions`.
    owned: [AtomicBool; NSIG],
    /// A fatal signal whose default action the agent replaced by a handler
    /// that writes the profile first (preloaded); the program sees SIG_DFL.
    fatal_hook: [AtomicBool; NSIG],
    /// A fault signal whose handler the program chose runs behind the
    /// agent's guard (which first puts a thread that faulted in the code
    /// cache back at the native instruction); the program's choice is in
    /// `actions` and is what it sees.
    guarded: [AtomicBool; NSIG],
}

pub static PROGRAM: Dispositions = Dispositions {
    actions: [const { Disposition::new() }; NSIG],
    added_mask: [const { AtomicU64::new(0) }; NSIG],
    owned: [const { AtomicBool::new(false) }; NSIG],
    fatal_hook: [const { AtomicBool::new(false) }; NSIG],
    guarded: [const { AtomicBool::new(false) }; NSIG],
};

fn index(sig: i32) -> Option<usize> {
    (1..NSIG as i32).contains(&sig).then_some(sig as usize)
}

impl Dispositions {
    pub fn action(&self, sig: i32) -> libc::sigaction {
        match index(sig) {
            Some(i) => self.actions[i].load(),
            // SAFETY: all-zero is SIG_DFL.
            None => unsafe { std::mem::zeroed() },
        }
    }
    pub fn set_action(&self, sig: i32, sa: &libc::sigaction) {
        if let Some(i) = index(sig) {
            self.actions[i].store(sa);
        }
    }
    pub fn owned(&self, sig: i32) -> bool {
        index(sig).is_some_and(|i| self.owned[i].load(Ordering::Acquire))
    }
    pub fn set_owned(&self, sig: i32, yes: bool) {
        if let Some(i) = index(sig) {
            self.owned[i].store(yes, Ordering::Release);
        }
    }
    /// The signals (bit n - 1 for signal n) added to the mask of the
    /// program's handler for `sig`.
    pub fn added_mask(&self, sig: i32) -> u64 {
        index(sig).map_or(0, |i| self.added_mask[i].load(Ordering::Acquire))
    }
    pub fn set_added_mask(&self, sig: i32, bits: u64) {
        if let Some(i) = index(sig) {
            self.added_mask[i].store(bits, Ordering::Release);
        }
    }
    pub fn fatal_hook(&self, sig: i32) -> bool {
        index(sig).is_some_and(|i| self.fatal_hook[i].load(Ordering::Acquire))
    }
    pub fn set_fatal_hook(&self, sig: i32, yes: bool) {
        if let Some(i) = index(sig) {
            self.fatal_hook[i].store(yes, Ordering::Release);
        }
    }
    pub fn guarded(&self, sig: i32) -> bool {
        index(sig).is_some_and(|i| self.guarded[i].load(Ordering::Acquire))
    }
    pub fn set_guarded(&self, sig: i32, yes: bool) {
        if let Some(i) = index(sig) {
            self.guarded[i].store(yes, Ordering::Release);
        }
    }
}
