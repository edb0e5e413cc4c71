//! The thread table: every thread the agent profiles, its engine state,
//! its handler stack, and (attached) where it is in its session.
//!
//! The table owns each thread's handler stack: it maps it, and unmaps it
//! only once no handler can be on it. A preloaded thread installs it as
//! its alternate signal stack at its start; an attached session never
//! changes a thread's alternate stack (`handlers.rs`), so none is left
//! installed when the session ends. A handler announces itself on its
//! slot ([`ThreadSlot::enter`]) before it reads the slot's state or stack, and
//! [`ThreadTable::clear`] takes both out of the table, then waits until no
//! handler is announced, before it frees them.
//!
//! Signal handlers find their thread here without locks or allocation:
//! slots are appended, or taken over from a thread that ended, and are
//! read through atomics.
//!
//! A program that starts and ends threads all the time must not make the
//! table grow with every thread it ever ran: a new thread takes over the
//! slot of one that ended (its data moves to the retired threads' profiles,
//! its engine state is freed and its stack unmapped), so memory follows the
//! threads alive at once. Only [`ThreadTable::add`] does that, under the
//! table's lock, and never once [`ThreadTable::quiesce`] has run: the readers
//! of every state (quiesce, the profile) run after it.
//!
//! A thread's engine state is reached only through this file: an entry
//! point for each kind of access (own handler, own thread, adder, after
//! [`Quiesced`], gone thread, atomics, fork child), each with its argument.

use crate::handler_stack::{unmap_stack, Prior, HANDLER_STACK};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use witchcraft::engine::ThreadState;
use witchcraft::profile;

pub const MAX_THREADS: usize = 8192;
/// Where a thread is in an attached session. A preloaded thread is
/// `Adopted` from its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Life {
    /// Its events are open; it takes its alternate stack at its next sample.
    New = 0,
    /// It was set up at a sample, and samples.
    Adopted = 1,
    /// It ended; its events are closed, its data kept.
    Gone = 2,
}

/// One thread's slot of the table.
pub struct ThreadSlot {
    state: AtomicPtr<ThreadState>,
    tid: AtomicI32,
    phase: AtomicU8,
    /// The handler stack for the thread (0: none).
    alt: AtomicU64,
    /// That stack is installed as the thread's alternate signal stack (a
    /// preloaded thread, from its start until it ends).
    lent: AtomicBool,
    /// Handlers of the thread between [`ThreadSlot::enter`] and leaving (a
    /// fault inside witch's work nests).
    users: AtomicU32,
    prior_sp: AtomicU64,
    prior_size: AtomicU64,
    prior_flags: AtomicI32,
    /// Odd while the thread runs the engine's handler code (which reads
    /// the module map); counts up at each entry and exit.
    epoch: AtomicU64,
    /// The thread is in the engine's link path, called from its code cache
    /// (`handlers::on_cache_link`), holding its state.
    linking: AtomicBool,
    /// What a preloaded thread prepared by its creator runs, and its
    /// stack's size (`thread_life::prepare_thread`), for it to take at its start.
    start: AtomicUsize,
    arg: AtomicUsize,
    stack_size: AtomicUsize,
    /// The program's own view of its thread's mask for witch's signals.
    pub mask: crate::program_mask::MaskView,
}

impl ThreadSlot {
    const fn new() -> ThreadSlot {
        ThreadSlot {
            state: AtomicPtr::new(std::ptr::null_mut()),
            tid: AtomicI32::new(0),
            phase: AtomicU8::new(Life::New as u8),
            alt: AtomicU64::new(0),
            lent: AtomicBool::new(false),
            users: AtomicU32::new(0),
            prior_sp: AtomicU64::new(0),
            prior_size: AtomicU64::new(0),
            prior_flags: AtomicI32::new(libc::SS_DISABLE),
            epoch: AtomicU64::new(0),
            linking: AtomicBool::new(false),
            start: AtomicUsize::new(0),
            arg: AtomicUsize::new(0),
            stack_size: AtomicUsize::new(0),
            mask: crate::program_mask::MaskView::new(),
        }
    }

    /// The slot is now thread `tid`'s (one prepared for it by its creator).
    pub fn claim(&self, tid: i32) {
        self.tid.store(tid, Ordering::Release);
    }

    /// Leave a thread's start routine, argument and stack size here for it.
    pub fn set_start(&self, start: usize, arg: usize, stack_size: usize) {
        self.start.store(start, Ordering::Release);
        self.arg.store(arg, Ordering::Release);
        self.stack_size.store(stack_size, Ordering::Release);
    }

    /// What [`ThreadSlot::set_start`] left.
    pub fn start(&self) -> (usize, usize, usize) {
        (self.start.load(Ordering::Acquire), self.arg.load(Ordering::Acquire), self.stack_size.load(Ordering::Acquire))
    }

    /// A handler of this slot's thread is about to use its state and
    /// handler stack: None if the slot has no stack (any more). Until the
    /// guard is dropped, [`ThreadTable::clear`] frees neither.
    /// Async-signal-safe.
    pub fn enter(&self) -> Option<Entered<'_>> {
        // SeqCst, with `clear`'s: either it sees this announcement, or this
        // sees the stack (and state) taken out.
        self.users.fetch_add(1, Ordering::SeqCst);
        let alt = self.alt.load(Ordering::SeqCst);
        if alt == 0 || self.state.load(Ordering::SeqCst).is_null() {
            self.users.fetch_sub(1, Ordering::Release);
            return None;
        }
        Some(Entered { slot: self, stack: (alt, alt + HANDLER_STACK as u64) })
    }

    /// Is a handler of this slot's thread between [`ThreadSlot::enter`] and
    /// leaving? Other threads ask. Async-signal-safe.
    pub fn in_use(&self) -> bool {
        self.users.load(Ordering::SeqCst) != 0
    }

    /// Run the engine's handler code `f` (on this slot's thread), announced
    /// to [`ThreadTable::grace`]. Async-signal-safe.
    pub fn engine_handler<R>(&self, f: impl FnOnce() -> R) -> R {
        // SeqCst: the announcement is visible before `f` loads the module
        // map (see `witchcraft::modules::current`).
        self.epoch.fetch_add(1, Ordering::SeqCst);
        let r = f();
        self.epoch.fetch_add(1, Ordering::SeqCst);
        r
    }

    /// Mark the thread as in the engine's link path (or out of it again).
    pub fn set_linking(&self, on: bool) {
        self.linking.store(on, Ordering::Release);
    }

    /// Is the thread in the engine's link path (a signal handler of witch's
    /// that finds this nested inside it must not touch the state)?
    pub fn linking(&self) -> bool {
        self.linking.load(Ordering::Acquire)
    }

    /// The state (null: none), read only by this file's entry points.
    fn state_ptr(&self) -> *mut ThreadState {
        self.state.load(Ordering::Acquire)
    }
    pub fn has_state(&self) -> bool {
        !self.state_ptr().is_null()
    }

    /// For its atomics (and its sampler's pause) only: its thread may be changing the rest.
    fn state_atomics(&self) -> Option<&ThreadState> {
        // SAFETY: made by `add`, freed only by `add` taking an ended thread's slot over (never
        // once frozen) or by `clear` (after its last reader). Only atomics are read through it.
        unsafe { self.state_ptr().as_ref() }
    }

    /// Pause or resume the sampler of the slot's thread (`f`): only its kernel object changes.
    pub fn with_sampler<R: Default>(&self, f: impl FnOnce(&ThreadState) -> R) -> R {
        self.state_atomics().map(f).unwrap_or_default()
    }

    /// Is the slot's thread in the engine's handler or a burst window? Any thread may ask.
    pub fn engine_busy(&self) -> bool {
        self.state_atomics().is_some_and(|t| t.in_handler() || t.window_busy())
    }

    /// # Safety
    /// `self` is the calling thread's slot, not `Gone` nor cleared while the
    /// reference lives, and no handler of its holds it (its handlers may
    /// nest in, as anywhere, and take it through [`Entered::state`]).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn own_state(&self) -> Option<&mut ThreadState> {
        // SAFETY: the caller's promise: only this thread and its handlers use it.
        unsafe { self.state_ptr().as_mut() }
    }

    /// # Safety
    /// The slot's thread ended (no handler of it can run), no other thread
    /// uses the state, and it stays in the table meanwhile.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn gone_state(&self) -> Option<&mut ThreadState> {
        // SAFETY: the caller's promise: no thread or handler uses it.
        unsafe { self.state_ptr().as_mut() }
    }

    /// The state, once profiling stopped.
    pub fn state_quiesced<'a>(&'a self, _quiesced: &'a mut Quiesced) -> Option<&'a mut ThreadState> {
        // SAFETY: quiesced (see `Quiesced`); the table keeps the state until
        // `clear`, after the last reader. One at a time: it borrows the proof.
        unsafe { self.state_ptr().as_mut() }
    }
    pub fn tid(&self) -> i32 {
        self.tid.load(Ordering::Acquire)
    }
    pub fn phase(&self) -> Life {
        [Life::New, Life::Adopted, Life::Gone][(self.phase.load(Ordering::Acquire) as usize).min(2)]
    }
    pub fn set_phase(&self, p: Life) {
        self.phase.store(p as u8, Ordering::Release);
    }
    pub fn set_lent(&self, yes: bool) {
        self.lent.store(yes, Ordering::Release);
    }
    /// The lent alternate stack's range ((0, 0): none).
    pub fn alt_stack(&self) -> (u64, u64) {
        let a = self.alt.load(Ordering::Acquire);
        if a == 0 {
            (0, 0)
        } else {
            (a, a + HANDLER_STACK as u64)
        }
    }
    pub fn prior(&self) -> Prior {
        Prior {
            sp: self.prior_sp.load(Ordering::Acquire),
            size: self.prior_size.load(Ordering::Acquire),
            flags: self.prior_flags.load(Ordering::Acquire),
        }
    }
    pub fn set_prior(&self, p: Prior) {
        self.prior_sp.store(p.sp, Ordering::Release);
        self.prior_size.store(p.size, Ordering::Release);
        self.prior_flags.store(p.flags, Ordering::Release);
    }
    /// Our stack, as `sigaltstack` takes it.
    pub fn alt_stack_t(&self) -> libc::stack_t {
        let (lo, hi) = self.alt_stack();
        libc::stack_t { ss_sp: lo as *mut libc::c_void, ss_flags: 0, ss_size: (hi - lo) as usize }
    }
}

/// A handler announced on its slot ([`ThreadSlot::enter`]), with the slot's
/// handler stack.
pub struct Entered<'a> {
    slot: &'a ThreadSlot,
    pub stack: (u64, u64),
}

impl<'a> Entered<'a> {
    pub fn slot(&self) -> &'a ThreadSlot {
        self.slot
    }

    /// The thread's state, for its own handler (or link path) that entered
    /// ([`ThreadSlot::enter`], which only a slot's own thread calls); None if the
    /// table let go of it meanwhile. Async-signal-safe.
    pub fn state(&mut self) -> Option<&mut ThreadState> {
        // SAFETY: the thread's own, which only it uses (a handler nested in
        // the link path finds `linking` set and leaves it alone); `clear`
        // keeps it while the guard lives. One at a time: it borrows the guard.
        unsafe { self.slot.state_ptr().as_mut() }
    }
}

/// Proof that profiling stopped ([`ThreadTable::quiesce`]): the threads'
/// handlers leave their states alone, those that were running returned,
/// and no slot is taken over. Not `Clone`: lent to one reader at a time.
pub struct Quiesced(());

/// A slot [`ThreadTable::add`] filled, and its new state.
pub type Added<'a> = (&'a ThreadSlot, &'a mut ThreadState);

impl Quiesced {
    /// # Safety
    /// A quiesce ran and nothing undid it (`Agent::resume`, `begin`, a fork child's start), or no state is in the table.
    pub unsafe fn earlier() -> Quiesced {
        Quiesced(())
    }
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        self.slot.users.fetch_sub(1, Ordering::Release);
    }
}

pub struct ThreadTable {
    slots: [ThreadSlot; MAX_THREADS],
    len: AtomicUsize,
    /// Threads that could not be set up (table full, events refused).
    pub failed: AtomicU64,
    /// Threads set up since the table was emptied, ended ones and those
    /// that could not be set up (`failed`) included.
    pub added: AtomicU64,
    /// Held while a slot is taken over or `retired` is touched: a spin
    /// lock, which a fork child can let go of (the holder may not exist
    /// there). Never taken in a handler, but the crash handler's profile
    /// waits for it a bounded time.
    lock: AtomicBool,
    /// No slot is taken over ([`ThreadTable::freeze`]).
    frozen: AtomicBool,
    /// The profiles of ended threads whose slots were taken over.
    retired: UnsafeCell<Vec<profile::Thread>>,
}

// SAFETY: `retired` is only touched with `lock` held.
unsafe impl Sync for ThreadTable {}

/// The table's lock, held (see `ThreadTable::lock`).
struct Held<'a>(&'a AtomicBool);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl ThreadTable {
    pub const fn new() -> ThreadTable {
        ThreadTable {
            slots: [const { ThreadSlot::new() }; MAX_THREADS],
            len: AtomicUsize::new(0),
            failed: AtomicU64::new(0),
            added: AtomicU64::new(0),
            lock: AtomicBool::new(false),
            frozen: AtomicBool::new(false),
            retired: UnsafeCell::new(Vec::new()),
        }
    }

    /// Take the table's lock; None if it stayed held for about a second
    /// (a crash inside `add`: the caller goes on without it).
    fn lock(&self) -> Option<Held<'_>> {
        for i in 0..200_000u32 {
            if self.lock.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return Some(Held(&self.lock));
            }
            if i > 100 {
                std::thread::sleep(std::time::Duration::from_micros(5));
            }
        }
        None
    }

    /// The table's part of `Agent::quiesce`, once the process is stopping:
    /// every state stops handling its signals (its sampler pauses unless
    /// `keep_sampling`), then wait (briefly) for other threads to leave the
    /// engine's handlers and windows. Undone by [`ThreadTable::thaw`].
    pub fn quiesce(&self, keep_sampling: impl Fn(&ThreadSlot) -> bool) -> Quiesced {
        // No new thread takes over an ended one's slot (and frees its state)
        // while the states are read, here and in the profile.
        let held = self.lock();
        self.frozen.store(true, Ordering::Release);
        drop(held);
        for s in self.slots() {
            let Some(ts) = s.state_atomics() else { continue };
            // Only the flag and the sampler's kernel object are touched,
            // both safe to race with the thread's own handler.
            ts.halt();
            if !keep_sampling(s) {
                ts.pause_sampler();
            }
        }
        let me = witchcraft::sys::task::gettid();
        for _ in 0..1000 {
            // A thread in its handlers, or running a burst window from its
            // code cache (which ends at its next exit, through a handler).
            let busy = self.slots().iter().any(|s| s.tid() != me && s.engine_busy());
            if !busy {
                break;
            }
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        Quiesced(())
    }

    pub fn thaw(&self) {
        self.frozen.store(false, Ordering::Release);
    }

    /// A thread could not be set up before it had a slot: counted as
    /// seen ([`ThreadTable::added`]) and failed.
    pub fn not_set_up(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        self.added.fetch_add(1, Ordering::Relaxed);
    }

    /// The profiles of the ended threads whose slots were taken over.
    pub fn retired(&self) -> Vec<profile::Thread> {
        match self.lock() {
            // SAFETY: `retired` is only touched with the lock held.
            Some(_held) => unsafe { (*self.retired.get()).clone() },
            None => Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire).min(MAX_THREADS)
    }

    /// The slots in use. Async-signal-safe.
    pub fn slots(&self) -> &[ThreadSlot] {
        &self.slots[..self.len()]
    }

    /// Threads with an engine state in the table (ended ones whose slot no
    /// thread took over yet included).
    pub fn with_state(&self) -> usize {
        self.slots().iter().filter(|s| s.has_state()).count()
    }

    /// Every engine state in the table, once profiling stopped.
    pub fn states_quiesced<'a>(&'a self, _quiesced: &'a mut Quiesced) -> impl Iterator<Item = &'a mut ThreadState> + 'a {
        // SAFETY: as in `ThreadSlot::state_quiesced`; each slot has its own state.
        self.slots().iter().filter_map(|s| unsafe { s.state_ptr().as_mut() })
    }

    /// In a fork child, forget what the parent's threads gathered.
    ///
    /// # Safety
    /// Only in a fork child (the caller is its only thread), outside handlers.
    pub unsafe fn reset_after_fork(&self, image: u32) {
        // SAFETY: the caller's promise: the parent's states, in this copy of
        // its memory, which no other thread nor handler uses.
        self.slots().iter().filter_map(|s| unsafe { s.state_ptr().as_mut() }).for_each(|ts| ts.reset_after_fork(image));
    }

    /// The slot of thread `tid`, if it has one. Async-signal-safe.
    pub fn find(&self, tid: i32) -> Option<&ThreadSlot> {
        self.slots().iter().find(|s| s.tid() == tid && s.has_state() && s.phase() != Life::Gone)
    }

    /// Add thread `tid` with its state, its alternate stack (0: none yet),
    /// whether that stack is installed on it already (`lent`), and its
    /// previous one; gives back its slot and its state, for the caller to
    /// set up before the thread's sampler runs. None if the table is full.
    #[allow(clippy::mut_from_ref)]
    pub fn add(&self, tid: i32, state: Box<ThreadState>, alt: u64, lent: bool, prior: Prior, phase: Life) -> Option<Added<'_>> {
        let held = self.lock();
        if held.is_some() && !self.frozen.load(Ordering::Acquire) {
            if let Some(s) = self.slots().iter().find(|s| s.phase() == Life::Gone) {
                // Its thread ended: its handlers are done with the state
                // (the thread's events are closed and its slot forgotten),
                // and no thread is on its stack.
                let old = s.state.swap(std::ptr::null_mut(), Ordering::AcqRel);
                if !old.is_null() {
                    // SAFETY: made by `add` with Box::into_raw, and taken out of the table above.
                    let old = unsafe { Box::from_raw(old) };
                    let t = old.to_profile();
                    if t.counters.interrupts > 0 || t.nodes.len() > 1 {
                        // SAFETY: the lock is held.
                        unsafe { (*self.retired.get()).push(t) };
                    }
                }
                let old_alt = s.alt.swap(0, Ordering::AcqRel);
                if old_alt != 0 && old_alt != alt {
                    unmap_stack(old_alt);
                }
                return Some((s, self.init(s, tid, state, alt, lent, prior, phase)));
            }
        }
        drop(held);
        let i = self.len.fetch_add(1, Ordering::AcqRel);
        if i >= MAX_THREADS {
            self.len.store(MAX_THREADS, Ordering::Release);
            self.not_set_up();
            return None;
        }
        let s = &self.slots[i];
        Some((s, self.init(s, tid, state, alt, lent, prior, phase)))
    }

    /// Fill slot `s`, and give back its new state.
    #[allow(clippy::too_many_arguments, clippy::mut_from_ref)]
    fn init(&self, s: &ThreadSlot, tid: i32, state: Box<ThreadState>, alt: u64, lent: bool, prior: Prior, phase: Life) -> &mut ThreadState {
        s.tid.store(tid, Ordering::Release);
        s.alt.store(alt, Ordering::Release);
        s.set_lent(lent);
        s.set_prior(prior);
        s.epoch.store(0, Ordering::SeqCst);
        s.mask.forget();
        s.set_phase(phase);
        let p = Box::into_raw(state);
        s.state.store(p, Ordering::Release);
        self.added.fetch_add(1, Ordering::Relaxed);
        // SAFETY: just made from a Box; its thread's handlers use it once its
        // sampler runs, which the caller (or the thread, prepared) starts.
        unsafe { &mut *p }
    }

    /// Wait until every handler that other threads were running when this
    /// was called has returned (handlers that start later see whatever was
    /// published before the call). Not for handlers. Returns the notes
    /// for the profile (a thread that stayed in a handler too long).
    #[must_use]
    pub fn grace(&self) -> Vec<String> {
        let mut notes = Vec::new();
        let me = witchcraft::sys::task::gettid();
        for s in self.slots() {
            if s.tid() == me {
                continue;
            }
            let e = s.epoch.load(Ordering::SeqCst);
            if e % 2 == 0 {
                continue;
            }
            // Handlers are short (tens of µs); a thread descheduled in one
            // may take a scheduler period or two.
            let give_up = witchcraft::sys::task::Deadline::after(std::time::Duration::from_secs(10));
            let mut spins = 0u32;
            while s.epoch.load(Ordering::SeqCst) == e {
                if spins < 200 {
                    std::hint::spin_loop();
                    spins += 1;
                } else if give_up.passed() {
                    notes.push(format!("thread {} stayed in a signal handler for over 10 s", s.tid()));
                    break;
                } else {
                    std::thread::sleep(std::time::Duration::from_micros(20));
                }
            }
        }
        notes
    }

    /// Empty the table: free every engine state and unmap every handler
    /// stack, once no handler is on them (a thread still in a handler a
    /// second later keeps its state and stack: they are leaked). Not for
    /// handlers.
    pub fn clear(&self) {
        let taken: Vec<(&ThreadSlot, *mut ThreadState, u64)> = self
            .slots()
            .iter()
            .map(|s| (s, s.state.swap(std::ptr::null_mut(), Ordering::SeqCst), s.alt.swap(0, Ordering::SeqCst)))
            .collect();
        let until = witchcraft::sys::task::Deadline::after(std::time::Duration::from_secs(1));
        for (s, p, alt) in taken {
            while s.users.load(Ordering::SeqCst) != 0 && !until.passed() {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
            if s.users.load(Ordering::SeqCst) != 0 {
                continue;
            }
            // SAFETY: `p` is null or made by `add` with Box::into_raw; only
            // the window's atomic flag is read.
            let in_window = unsafe { p.as_ref() }.is_some_and(|t| t.window_busy());
            if !p.is_null() && !in_window {
                // SAFETY: made by `add` with Box::into_raw, taken out of the
                // table above, and no handler has it.
                drop(unsafe { Box::from_raw(p) });
            }
            // A thread still in a burst window (stopped there, say) runs in
            // its state's code cache: that state is leaked, not freed. The
            // window runs on the program's stack, not the handler stack.
            if alt != 0 {
                unmap_stack(alt);
            }
        }
        self.len.store(0, Ordering::Release);
        self.failed.store(0, Ordering::Relaxed);
        self.added.store(0, Ordering::Relaxed);
        if let Some(_held) = self.lock() {
            // SAFETY: the lock is held.
            unsafe { (*self.retired.get()).clear() };
        }
        self.thaw();
    }

    /// Forget every slot without freeing anything (a fork child: the
    /// parent's other threads don't exist here, and one of them may have
    /// held the lock), but give back the state of `keep` (the calling
    /// thread's slot), to add again.
    pub fn forget(&self, keep: Option<&ThreadSlot>) -> Option<Box<ThreadState>> {
        let kept = keep.map(|s| s.state.swap(std::ptr::null_mut(), Ordering::AcqRel)).filter(|p| !p.is_null());
        for s in self.slots() {
            s.state.store(std::ptr::null_mut(), Ordering::Release);
        }
        self.len.store(0, Ordering::Release);
        self.failed.store(0, Ordering::Relaxed);
        self.added.store(0, Ordering::Relaxed);
        self.lock.store(false, Ordering::Release);
        // SAFETY: only this thread exists here; the parent's retired threads are the parent's.
        unsafe { std::mem::forget(std::mem::take(&mut *self.retired.get())) };
        self.thaw();
        // SAFETY: made by `add` with Box::into_raw and taken out of the
        // table above: this is its one owner.
        kept.map(|p| unsafe { Box::from_raw(p) })
    }
}
