//! The instruction breakpoint that takes a thread back into the code cache
//! after native code: the whole-run windows (the exact mode's recording,
//! the access counters `-e sw-stores`/`-e sw-loads`) leave the cache before
//! a system call or a call into code it does not run (the agent's own
//! interposers: `malloc` with heap objects on), and come back at the
//! instruction after the system call or at the call's return address when
//! the thread gets there, instead of at the next tick. One debug register,
//! taken before the watchpoints' (which get the others).

use crate::sys::perf::BpType;
use crate::sys::siginfo::{TAG, TAG_RESUME};
use crate::sys::watchpoint::{Arming, Breakpoint};

/// A thread's resume breakpoint (closed: there is none, and the thread
/// comes back at the next tick).
pub struct Resume {
    bp: Breakpoint,
    how: Option<Arming>,
    armed: bool,
    /// The instruction the breakpoint is enabled at, armed or not: it
    /// stays enabled where it fired and the thread went into the cache,
    /// or where it was given up, so arming it at the same instruction
    /// again (the same call's return, as a loop that calls `malloc`
    /// makes) takes no system call. Harmless: the program reaches a
    /// program instruction natively only in a gap between whole-run
    /// windows, and there a window is just what is wanted; where none can
    /// begin, it stands down ([`Resume::stand_down`]).
    at: Option<u64>,
    /// Armed for code the cache does not run: ticks wait for it (see
    /// [`Resume::holds_ticks`]).
    holds: bool,
}

impl Default for Resume {
    fn default() -> Self {
        Resume { bp: Breakpoint::CLOSED, how: None, armed: false, at: None, holds: false }
    }
}

impl Resume {
    /// Open it for thread `tid` (`open_tid` 0: the calling thread),
    /// disabled. Outside signal handlers. Without `sigtrap` (Linux < 5.13)
    /// there is none.
    pub fn open(&mut self, sigtrap: bool, modify: bool, tid: i32, open_tid: i32) {
        if !sigtrap {
            return;
        }
        let how = Arming { ty: BpType::X, sigtrap: true, modify, in_place: false, tid, parking: Self::parking() };
        if let Ok(bp) = Breakpoint::open_parked(&how, TAG | TAG_RESUME, open_tid) {
            self.bp = bp;
            self.how = Some(how);
            self.at = None;
        }
    }

    /// Where the disabled breakpoint points: this function's code (the
    /// agent's, which the program never runs).
    fn parking() -> u64 {
        Self::parking as *const () as u64
    }

    /// Set, waiting for the thread to get to its instruction.
    pub fn is_armed(&self) -> bool {
        self.armed
    }

    /// Set for code the cache does not run (a system call, an
    /// interposer): a tick meanwhile must not begin a window there, so
    /// the thread comes back only here.
    pub fn holds_ticks(&self) -> bool {
        self.armed && self.holds
    }

    /// Fire when the thread is about to run `pc`, after code the cache
    /// does not run (ticks wait for it). Async-signal-safe. False if there
    /// is no breakpoint.
    pub fn arm(&mut self, pc: u64) -> bool {
        self.arm_for(pc, true)
    }

    /// Fire when the thread is about to run `pc` again, where a handler of
    /// the program's fault returns to; a tick before that (the handler
    /// left by `siglongjmp`, or runs long) begins a window as usual.
    /// Async-signal-safe.
    pub fn arm_after_fault(&mut self, pc: u64) -> bool {
        self.arm_for(pc, false)
    }

    fn arm_for(&mut self, pc: u64, holds: bool) -> bool {
        let Some(how) = self.how else { return false };
        if self.at != Some(pc) {
            let ok = self.bp.retarget(&how, TAG | TAG_RESUME, pc, 8);
            self.at = ok.then_some(pc);
        }
        self.armed = self.at.is_some();
        self.holds = holds;
        self.armed
    }

    /// It fired, or is no longer wanted (a window began otherwise): the
    /// thread no longer waits for it. The breakpoint stays enabled where
    /// it is (see [`Resume::at`](Resume)). Async-signal-safe.
    pub fn disarm(&mut self) {
        self.armed = false;
    }

    /// It fired where the thread goes on natively: disabled, so that it
    /// does not fire there again at once. Async-signal-safe.
    pub fn stand_down(&mut self) {
        self.armed = false;
        if self.at.take().is_some() {
            self.bp.disable();
        }
    }

    pub fn close(&mut self) {
        self.bp.close();
        self.how = None;
        self.armed = false;
        self.at = None;
    }
}
