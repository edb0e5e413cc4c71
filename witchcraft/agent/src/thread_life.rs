//! A preloaded thread's profiling, from its creation to its end: prepared
//! on the thread that creates it ([`prepare_thread`], called by the
//! `pthread_create` interposer), adopted on itself ([`adopt_thread`]),
//! ended by its key's destructor ([`thread_end`]).

use crate::handler_stack::{self, Prior};
use crate::state::AGENT;
use crate::threads::{self, Life};
use std::sync::atomic::{AtomicU32, Ordering};
use witchcraft::engine::{place::thread_stack, Place, ThreadState};

/// The key whose destructor runs at each thread's exit.
pub static KEY: AtomicU32 = AtomicU32::new(u32::MAX);

/// Whole-run windows (the exact mode's recording, the access counters):
/// the calling thread's first window begins when it runs `pc` (the
/// program's entry point, a thread's start routine), not at its first
/// tick, which comes after 5 ms of its CPU time (a short program's first
/// tens of millions of accesses).
pub fn whole_run_from(pc: u64) {
    let Some(engine) = AGENT.engine() else { return };
    if !engine.sampling().2.is_some_and(|b| b.counts_accesses()) || pc == 0 {
        return;
    }
    let Some(slot) = AGENT.current() else { return };
    // SAFETY: this thread's slot, outside its handlers (which leave the
    // breakpoint alone until it fires).
    if let Some(ts) = unsafe { slot.own_state() } {
        ts.resume_after(engine, pc);
    }
}

/// Set up the calling thread (the first one, or a fork child's). Not for
/// signal handlers.
pub fn start_thread() {
    if AGENT.current().is_some() {
        return;
    }
    if let Some(slot) = prepare_thread() {
        // The first thread's stack, from the thread library (which may
        // allocate: this thread has the main heap anyway).
        adopt_thread(slot, thread_stack());
    }
}

/// Prepare a thread's profiling before it exists, on the thread that
/// creates it: its engine state, its handler stack and its slot in the
/// table (`adopt_thread` finishes on the new thread). All the allocating
/// is done here, so that a new thread whose program code never calls
/// `malloc` does not make the C library give it a heap of its own: 64 MiB
/// of address space each, up to eight per CPU (a 64-thread program went
/// from 527 MB to 1.79 GB of address space). None if this thread is not to
/// be profiled: the process profiles no more threads, or witch's address
/// space for threads ([`address_space_cap`]) or the system's is used up;
/// the profile counts it and says why, and the thread runs on.
pub fn prepare_thread() -> Option<&'static threads::ThreadSlot> {
    let engine = AGENT.engine()?;
    // In the program's context: its floating-point control must not trap
    // the engine's (see `sys::fpu`).
    let _fp = witchcraft::sys::fpu::Default::enter();
    // A process whose profile is written (one that does not follow, say)
    // or that is sandboxed sets up no more threads.
    if AGENT.stopping() || AGENT.finished() {
        return None;
    }
    // Code mapped since the last refresh (a `dlopen` that went straight
    // to the C library, or the C library's own loads) was seen by a handler.
    crate::loading::keep_map_current(false);
    if !room_for_a_thread() {
        return None;
    }
    let Some(alt) = handler_stack::map_stack() else {
        AGENT.threads.not_set_up();
        AGENT.note("a thread was not profiled: no address space for its handler stack");
        return None;
    };
    let Some(state) = ThreadState::try_new(engine) else {
        handler_stack::unmap_stack(alt);
        AGENT.threads.not_set_up();
        AGENT.note("a thread was not profiled: no address space for its tables");
        return None;
    };
    let Some((slot, _)) = AGENT.threads.add(0, state, alt, true, Prior::NONE, Life::Adopted) else {
        handler_stack::unmap_stack(alt);
        return None;
    };
    // The new thread starts with its creator's mask.
    if let Some(creator) = AGENT.current() {
        slot.mask.inherit(&creator.mask);
    }
    Some(slot)
}

/// A prepared thread that never started (its creation failed): its slot
/// is free again.
pub fn unprepare_thread(slot: &threads::ThreadSlot) {
    slot.set_lent(false);
    slot.set_phase(Life::Gone);
}

/// Is there room in witch's address space for threads
/// ([`address_space_cap`]) for one more: its handler stack, its tables
/// and its code cache? If not, it is counted as not set up, with a note.
pub fn room_for_a_thread() -> bool {
    let recording = AGENT.engine().is_some_and(|e| e.config().record_fd.is_some());
    let per_thread = (handler_stack::HANDLER_STACK + ThreadState::reserved_bytes_each(recording)) as u64;
    if (AGENT.threads.with_state() as u64 + 1) * per_thread <= address_space_cap() {
        return true;
    }
    AGENT.threads.not_set_up();
    AGENT.note(format!(
        "threads past {} were not profiled: witch takes at most {} MiB of address space for threads, a quarter of the program's limit (RLIMIT_AS)",
        address_space_cap() / per_thread,
        address_space_cap() >> 20
    ));
    false
}

/// Witch's address space for the threads' handler stacks, tables and code caches: a
/// quarter of the program's `RLIMIT_AS` when it has one (`ulimit -v`),
/// so that the program keeps the rest; without a limit, what the thread
/// table holds ([`threads::MAX_THREADS`]).
pub fn address_space_cap() -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: fills the plain struct.
    let limited = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } == 0 && lim.rlim_cur != libc::RLIM_INFINITY;
    if limited {
        lim.rlim_cur / 4
    } else {
        u64::MAX
    }
}

/// Set up the calling thread with `slot`, prepared for it: its handler
/// stack installed as its alternate signal stack, its events opened and
/// started. `stack`: the thread's stack. Allocates nothing (see
/// [`prepare_thread`]). Not for signal handlers.
pub fn adopt_thread(slot: &threads::ThreadSlot, stack: (u64, u64)) {
    let Some(engine) = AGENT.engine() else { return };
    let _fp = witchcraft::sys::fpu::Default::enter();
    slot.claim(witchcraft::sys::task::gettid());
    if AGENT.stopping() || AGENT.finished() {
        // The profile was written meanwhile: nothing to start.
        unprepare_thread(slot);
        return;
    }
    AGENT.set_current(Some(slot));
    // SAFETY: this thread's slot (prepared for it), outside its handlers.
    let Some(ts) = (unsafe { slot.own_state() }) else { return };
    if let Err(e) = ts.start(engine, Place::here(stack, slot.alt_stack())) {
        // Not profiled: the slot, its stack and its tables go to the next
        // thread that needs them.
        ts.stop();
        AGENT.set_current(None);
        unprepare_thread(slot);
        AGENT.threads.failed.fetch_add(1, Ordering::Relaxed);
        AGENT.note(e);
        return;
    }
    // Its creator held the sampler's signal for the program (and so does
    // its mask), or its image started with it blocked.
    crate::dispositions::held_from_the_start(slot, ts, witchcraft::sys::task::blocked_now());
    // Its signals may come already: until the handler stack is installed
    // too, the kernel's frame goes on the thread's stack, the work on the
    // handler stack all the same.
    let ss = slot.alt_stack_t();
    // SAFETY: stack_t is plain data.
    let mut prev: libc::stack_t = unsafe { std::mem::zeroed() };
    // SAFETY: installs the stack the table owns for this thread (outside any handler).
    unsafe { libc::sigaltstack(&ss, &mut prev) };
    slot.set_prior(Prior::from_stack(&prev));
    // SAFETY: the key made in `init`; the value is the slot, read back in `thread_end`.
    unsafe { libc::pthread_setspecific(KEY.load(Ordering::Acquire), slot as *const threads::ThreadSlot as *const libc::c_void) };
}

/// The calling thread's stack, for a thread the C library started: its
/// thread descriptor sits at the top of the stack block (with or without a
/// stack the program gave it), so the stack runs from `size` bytes below
/// up to it. Read without `pthread_getattr_np`, which allocates.
pub fn created_thread_stack(size: usize) -> (u64, u64) {
    // SAFETY: pthread_self has no preconditions.
    let top = unsafe { libc::pthread_self() } as u64;
    (top.saturating_sub(size as u64), top)
}

/// A thread ends: stop its events, keep its data for the profile, and put
/// back the alternate stack it had.
pub extern "C" fn thread_end(p: *mut libc::c_void) {
    // SAFETY: the value set by `start_thread`: a slot of the static table.
    let Some(slot) = (unsafe { (p as *const threads::ThreadSlot).as_ref() }) else { return };
    // SAFETY: this thread's slot (not `Gone` until below), in its key's
    // destructor, outside its handlers.
    if let Some(ts) = unsafe { slot.own_state() } {
        ts.stop();
    }
    // The thread's stack before witch's, unless the program installed one
    // of its own since: its choice stands.
    // SAFETY: stack_t is plain data; queries this thread's alternate stack.
    let mut now: libc::stack_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::sigaltstack(std::ptr::null(), &mut now) };
    if Prior::from_stack(&now).sp == slot.alt_stack().0 {
        let prev = slot.prior().to_stack();
        // SAFETY: outside any handler (a key destructor), so not on the stack being replaced.
        unsafe { libc::sigaltstack(&prev, std::ptr::null_mut()) };
    }
    slot.set_lent(false);
    // Forgotten by this thread's handlers first: once `Gone`, a new thread
    // may take the slot over.
    AGENT.set_current(None);
    slot.set_phase(Life::Gone);
}
