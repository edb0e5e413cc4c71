//! The program's calls that choose its signal handlers and masks
//! (`sigaction`, `signal`, `sigprocmask`, `pthread_sigmask`), interposed
//! (preloaded): the signals the agent owns keep its handler while the
//! program's choice is remembered and reported back ([`crate::program`]),
//! and the program may block anything but the agent's samples and traps.

use crate::program::PROGRAM;
use crate::state::{Mode, AGENT};
use crate::symbols::{next, SigactionFn};
use crate::threads::ThreadSlot;
use std::sync::atomic::AtomicPtr;
use witchcraft::engine::ThreadState;
use witchcraft::sys::siginfo::{self, sampler_signal};

/// `sigaction` as the program sees it: the signals the agent owns keep its
/// handler while the program's choice is remembered and reported back
/// (with `SA_RESTORER`, as the C library's own call leaves it). A handler
/// that runs on an alternate stack (`SA_ONSTACK`) gets witch's signals
/// added to its mask, unseen by the program.
///
/// # Safety
/// As the C library's `sigaction`.
#[no_mangle]
pub unsafe extern "C" fn sigaction(sig: libc::c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> libc::c_int {
    // SAFETY: as this function's.
    unsafe { own_sigaction(sig, act, old) }
}

/// The agent's `sigaction` by an address of its own (the exported one's
/// address is the C library's when the agent is attached: see
/// `interpose::own_prctl`). Attached, the program's imports of `sigaction`
/// and `signal` lead here too (`imports.rs`): a handler the program
/// installs during a session for a signal the agent owns is remembered,
/// and the agent's stays (the program's handler for SIGTRAP took the code
/// cache's exits, and the program died of SIGSEGV).
///
/// # Safety
/// As [`sigaction`].
pub(crate) unsafe extern "C" fn own_sigaction(sig: libc::c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> libc::c_int {
    let real: SigactionFn = crate::symbols::real_sigaction();
    if PROGRAM.owned(sig) {
        if !old.is_null() {
            // SAFETY: the caller's pointer to a sigaction to fill.
            unsafe { *old = PROGRAM.action(sig) };
        }
        if !act.is_null() {
            // SAFETY: the caller's pointer to a sigaction to read.
            let mut sa = unsafe { *act };
            // As the kernel would keep it from the C library's call: with
            // the C library's signal return (`SA_RESTORER`), which ours,
            // installed through the same C library, has.
            // SAFETY: sigaction is plain data; queries our disposition.
            let mut ours: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            if unsafe { real(sig, std::ptr::null(), &mut ours) } == 0 && ours.sa_flags & SA_RESTORER != 0 {
                sa.sa_flags |= SA_RESTORER;
                sa.sa_restorer = ours.sa_restorer;
            }
            PROGRAM.set_action(sig, &sa);
        }
        return 0;
    }
    if crate::handlers::FAULTS.contains(&sig) && AGENT.mode() == Mode::Preloaded {
        // A fault handler of the program's runs behind the agent's guard,
        // which the program never sees.
        let guarded = PROGRAM.guarded(sig);
        let hooked = PROGRAM.fatal_hook(sig);
        if !old.is_null() {
            // SAFETY: the caller's pointer to a sigaction to fill.
            unsafe {
                if guarded {
                    *old = PROGRAM.action(sig);
                } else if real(sig, std::ptr::null(), old) == 0 && hooked {
                    (*old).sa_sigaction = libc::SIG_DFL;
                    (*old).sa_flags = 0;
                }
            }
        }
        if act.is_null() {
            return 0;
        }
        PROGRAM.set_fatal_hook(sig, false);
        // SAFETY: the caller's pointer to a sigaction to read.
        return crate::handlers::guard(sig, unsafe { &*act });
    }
    if crate::handlers::FAULTS.contains(&sig) && AGENT.mode() == Mode::Attached {
        // SAFETY: the caller's pointer, null or a sigaction to read.
        let handles = unsafe { act.as_ref() }.is_some_and(|a| a.sa_sigaction != libc::SIG_DFL && a.sa_sigaction != libc::SIG_IGN);
        if let (true, Some(engine)) = (handles, AGENT.engine()) {
            // An attached agent cannot guard the program's fault handlers,
            // so windows stop before one goes in, not at the next poll: a
            // fault in a copy handed the handler the copy's PC.
            engine.allow_windows(false);
        }
    }
    // A handler on the program's own alternate stack: witch's signals wait
    // until it returns. That stack is sized for the program's signals one
    // at a time (each handler blocks its own); a sample or trap taken
    // inside the handler would put a second kernel frame (3 to 12 KB) on it.
    // SAFETY: the caller's pointer, null or a sigaction to read.
    let onstack = unsafe { act.as_ref() }
        .filter(|a| a.sa_flags & libc::SA_ONSTACK != 0 && a.sa_sigaction != libc::SIG_DFL && a.sa_sigaction != libc::SIG_IGN);
    let mut added = 0u64;
    let mut copy = onstack.copied();
    let act = match copy.as_mut() {
        Some(copy) => {
            for s in [libc::SIGTRAP, sampler_signal()] {
                // SAFETY: valid set and signal numbers.
                if unsafe { libc::sigismember(&copy.sa_mask, s) } == 0 {
                    // SAFETY: as above.
                    unsafe { libc::sigaddset(&mut copy.sa_mask, s) };
                    added |= 1 << (s - 1);
                }
            }
            copy as *const libc::sigaction
        }
        None => act,
    };
    let before = PROGRAM.added_mask(sig);
    let hooked = PROGRAM.fatal_hook(sig);
    // SAFETY: the caller's arguments (the action perhaps with witch's signals added), passed on.
    let r = unsafe { real(sig, act, old) };
    if r != 0 {
        return r;
    }
    if !old.is_null() {
        // SAFETY: the caller's sigaction, filled by the call.
        let old = unsafe { &mut *old };
        if hooked {
            // Our fatal-signal hook is invisible: the program sees SIG_DFL.
            // SAFETY: all zero is SIG_DFL with no flags and an empty mask.
            *old = unsafe { std::mem::zeroed() };
        } else {
            // What the program set, without what the agent added to it.
            for s in [libc::SIGTRAP, sampler_signal()] {
                if before & (1 << (s - 1)) != 0 {
                    // SAFETY: a valid set and signal number.
                    unsafe { libc::sigdelset(&mut old.sa_mask, s) };
                }
            }
        }
    }
    if !act.is_null() {
        PROGRAM.set_added_mask(sig, added);
        if hooked {
            PROGRAM.set_fatal_hook(sig, false);
        }
    }
    0
}

/// The flag the C library's `sigaction` adds for its signal return.
const SA_RESTORER: libc::c_int = 0x0400_0000;

/// # Safety
/// As the C library's `signal`.
#[no_mangle]
pub unsafe extern "C" fn signal(sig: libc::c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: as this function's.
    unsafe { own_signal(sig, handler) }
}

/// The agent's `signal` by an address of its own (see [`own_sigaction`]).
///
/// # Safety
/// As [`signal`].
pub(crate) unsafe extern "C" fn own_signal(sig: libc::c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: sigaction is plain data.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = handler;
    sa.sa_flags = libc::SA_RESTART;
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to plain structs.
    if unsafe { own_sigaction(sig, &sa, &mut old) } != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}

/// The kernel's `struct sigaction` (what `rt_sigaction` reads and
/// writes): the handler, the flags, the signal return, and an 8-byte set.
#[repr(C)]
pub(crate) struct KernelSigaction {
    handler: libc::sighandler_t,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

/// `rt_sigaction(sig, act, old, 8)` as the program made it through
/// `syscall`, answered by [`own_sigaction`] as the C library's
/// `sigaction` would be (which puts its own signal return in place of the
/// program's, to the same effect): 0, or -1 with errno.
///
/// # Safety
/// `act` and `old` are null or point at a kernel `sigaction` to read or
/// fill, as the kernel requires.
pub(crate) unsafe fn kernel_sigaction(sig: libc::c_int, act: *const KernelSigaction, old: *mut KernelSigaction) -> libc::c_int {
    // SAFETY: sigaction is plain data; the first 8 bytes of a C library
    // signal set are the kernel's set (signal n: bit n - 1).
    let to_libc = |k: &KernelSigaction| unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = k.handler;
        sa.sa_flags = k.flags as libc::c_int;
        *(&mut sa.sa_mask as *mut libc::sigset_t as *mut u64) = k.mask;
        sa
    };
    // SAFETY: the caller's pointer, null or a kernel sigaction to read.
    let act = unsafe { act.as_ref() }.map(to_libc);
    // SAFETY: sigaction is plain data.
    let mut was: libc::sigaction = unsafe { std::mem::zeroed() };
    let act_ptr = act.as_ref().map_or(std::ptr::null(), |a| a as *const libc::sigaction);
    // SAFETY: valid pointers to plain structs.
    let r = unsafe { own_sigaction(sig, act_ptr, &mut was) };
    if r == 0 && !old.is_null() {
        // SAFETY: the caller's pointer to a kernel sigaction to fill; the
        // first 8 bytes of the set are the kernel's.
        unsafe {
            *old = KernelSigaction {
                handler: was.sa_sigaction,
                flags: was.sa_flags as libc::c_ulong,
                restorer: was.sa_restorer.map_or(0, |f| f as usize),
                mask: *(&was.sa_mask as *const libc::sigset_t as *const u64),
            }
        };
    }
    r
}

type MaskFn = unsafe extern "C" fn(libc::c_int, *const libc::sigset_t, *mut libc::sigset_t) -> libc::c_int;

/// The kernel's set (bit n - 1 for signal n) of the signals the agent
/// owns, which the program's masks leave out ([`as_program_asks`]).
pub(crate) fn owned_kernel_set() -> u64 {
    [libc::SIGTRAP, sampler_signal()].into_iter().filter(|&sig| PROGRAM.owned(sig)).fold(0, |set, sig| set | 1 << (sig - 1))
}

/// A mask call of the program's on the calling thread (`how`; `asked`:
/// the first 8 bytes of its set, the kernel's, if it gave one), as the
/// agent passes it on: the program may block anything but the samples and
/// traps (a thread that blocks every signal, a common way to leave them
/// all to one thread, would otherwise never be sampled, and its traps
/// would come late), unless the agent holds one for it
/// ([`crate::program_mask`]). Returns the agent's signals to leave out of
/// the set, and those the old mask the program is told must hold. A held
/// signal the program no longer blocks lets the thread's sampler go on.
pub(crate) fn as_program_asks(how: libc::c_int, asked: Option<u64>) -> (u64, u64) {
    let ours = owned_kernel_set();
    let Some(slot) = AGENT.current() else {
        // A thread the agent does not profile: preloaded, only leave them
        // out; attached, change nothing (see below).
        return (if AGENT.mode() == Mode::Attached { 0 } else { ours }, 0);
    };
    let attached = AGENT.mode() == Mode::Attached;
    let Some(asked) = asked else { return (0, if attached { 0 } else { slot.mask.blocks() }) };
    let Some(change) = slot.mask.program_sets(how, asked & ours, ours) else { return (0, 0) };
    let sampler = siginfo::mask_bit(sampler_signal());
    if attached {
        // Attached, the program's masks go to the kernel as they are, so
        // that none differs from what the program set once the session
        // ends: a signal of the agent's it blocks is held, and a thread
        // that blocks the sampler's is not sampled meanwhile.
        let newly = slot.mask.blocks() & !slot.mask.held();
        slot.mask.hold(newly);
        if newly & sampler != 0 {
            slot.mask.park_sampler(slot.with_sampler(|ts| ts.pause_sampler_left()));
            // SAFETY: this thread's slot, in its own call (not one of witch's handlers).
            if let Some(ts) = unsafe { slot.own_state() } {
                ts.signal_held_for_program();
            }
        }
    }
    if let (true, Some(engine)) = (change.released & sampler != 0, AGENT.engine()) {
        if !AGENT.stopping() {
            slot.with_sampler(|ts| ts.resume_sampler_after(engine, slot.mask.take_sampler_left()));
        }
    }
    if attached {
        return (0, 0);
    }
    (if how == libc::SIG_UNBLOCK { 0 } else { change.leave_out }, change.before)
}

/// A thread is set up (`slot`, its state `ts`, started; `blocked`: its
/// mask): by an attached session, or preloaded at its start. If its mask blocks the
/// sampler's signal already (the program blocked it before the attach, or
/// the thread's creator held it, or the image was exec'd with it blocked),
/// the program may take it itself, with `sigwaitinfo` or a `signalfd`, and
/// a tick of witch's would wait there for the program to take. Then it is
/// held for the program, the thread's sampler paused until the program
/// unblocks it through its mask calls, which the agent takes. True if so.
pub(crate) fn held_from_the_start(slot: &ThreadSlot, ts: &mut ThreadState, blocked: u64) -> bool {
    let bit = siginfo::mask_bit(sampler_signal());
    if blocked & bit == 0 {
        return false;
    }
    ts.pause_sampler();
    if slot.mask.held() & bit == 0 {
        slot.mask.program_sets(libc::SIG_BLOCK, bit, owned_kernel_set());
        slot.mask.hold(bit);
        ts.signal_held_for_program();
    }
    true
}

/// A mask call through the C library's `real` (`pthread_sigmask`,
/// `sigprocmask`), as the program made it, passed on as
/// [`as_program_asks`] says.
///
/// # Safety
/// As the C library's `pthread_sigmask`.
unsafe fn pass_mask(real: MaskFn, how: libc::c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> libc::c_int {
    // SAFETY: `set` is null or a valid sigset (the caller's promise), whose first 8 bytes are the kernel's.
    let asked = unsafe { set.cast::<u64>().as_ref() }.copied();
    let (leave_out, before) = as_program_asks(how, asked);
    let mut copy: libc::sigset_t;
    let set = match asked {
        Some(bits) if bits & leave_out != 0 => {
            // SAFETY: as above; the copy's first 8 bytes are its kernel set.
            unsafe {
                copy = *set;
                *(&mut copy as *mut libc::sigset_t).cast::<u64>() = bits & !leave_out;
            }
            &copy as *const libc::sigset_t
        }
        _ => set,
    };
    // SAFETY: the C library's function, with the caller's arguments (the set perhaps without witch's signals).
    let r = unsafe { real(how, set, old) };
    if r == 0 && before != 0 {
        // SAFETY: the caller's old set, filled by the call: what it blocked of witch's signals goes back in.
        if let Some(old) = unsafe { old.cast::<u64>().as_mut() } {
            *old |= before;
        }
    }
    r
}

/// The definitions the agent's mask calls go on to (attached: the ones the
/// program's own calls bind to, `interpose::resolve_for_attached`).
pub(crate) static REAL_PTHREAD_SIGMASK: AtomicPtr<libc::c_void> = AtomicPtr::new(std::ptr::null_mut());
pub(crate) static REAL_SIGPROCMASK: AtomicPtr<libc::c_void> = AtomicPtr::new(std::ptr::null_mut());

/// # Safety
/// As the C library's `pthread_sigmask`.
#[no_mangle]
pub unsafe extern "C" fn pthread_sigmask(how: libc::c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> libc::c_int {
    // SAFETY: as this function's.
    unsafe { own_pthread_sigmask(how, set, old) }
}

/// The agent's `pthread_sigmask` by an address of its own (see
/// [`own_sigaction`]): attached, the program's imports of it lead here.
///
/// # Safety
/// As the C library's `pthread_sigmask`.
pub(crate) unsafe extern "C" fn own_pthread_sigmask(how: libc::c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> libc::c_int {
    // SAFETY: the C library's function has this signature; the arguments are the caller's.
    unsafe { pass_mask(std::mem::transmute::<*mut libc::c_void, MaskFn>(next(c"pthread_sigmask", &REAL_PTHREAD_SIGMASK)), how, set, old) }
}

/// # Safety
/// As the C library's `sigprocmask`.
#[no_mangle]
pub unsafe extern "C" fn sigprocmask(how: libc::c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> libc::c_int {
    // SAFETY: as this function's.
    unsafe { own_sigprocmask(how, set, old) }
}

/// As [`own_pthread_sigmask`], for `sigprocmask`.
///
/// # Safety
/// As the C library's `sigprocmask`.
pub(crate) unsafe extern "C" fn own_sigprocmask(how: libc::c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> libc::c_int {
    // SAFETY: as in `own_pthread_sigmask`.
    unsafe { pass_mask(std::mem::transmute::<*mut libc::c_void, MaskFn>(next(c"sigprocmask", &REAL_SIGPROCMASK)), how, set, old) }
}
