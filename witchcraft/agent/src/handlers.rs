//! The agent's signal handlers, and installing and removing them.
//!
//! - [`on_signal`] takes SIGTRAP and the sampler's signal: the engine's
//!   samples and watchpoint traps (see `witchcraft::engine::classify`), its
//!   work on the thread's handler stack ([`handler_stack`]). Anything else
//!   goes to the handler the program chose ([`crate::program`]), or its
//!   default.
//! - [`on_fatal`] (preloaded only) replaces the default action of fatal
//!   signals: write the profile, then die the way the program would have.
//!
//! Attached, a thread's alternate signal stack is never changed: only the
//! thread itself can change it, and a thread blocked in a system call when
//! the session ends could not be made to put its own back without cutting
//! its call short. The handler stack is used by switching to it
//! ([`handler_stack::run`]); the kernel's frame goes where the program's
//! own signals go. A thread is set up at its first sample ([`adopt`]).

use crate::alloc;
use crate::handler_stack;
use crate::handler_stack::Prior;
use crate::program::PROGRAM;
use crate::state::{Mode, AGENT};
use crate::symbols::real_sigaction;
use crate::threads::{Entered, Life, ThreadSlot};
use witchcraft::engine::{self, Place};
use witchcraft::profile::EndedBy;
use witchcraft::sys::siginfo::{self, sampler_signal};
use witchcraft::sys::task;

/// Fatal signals whose default action writes the profile first (preloaded).
pub const FATAL: [i32; 8] =
    [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT, libc::SIGABRT, libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE];

/// Faults a copy in the code cache may raise as the native instruction
/// would: the program's handlers for them run behind [`on_fault`].
pub const FAULTS: [i32; 4] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL];

fn action(h: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void), onstack: bool) -> libc::sigaction {
    // SAFETY: sigaction is plain data; all-zero is a valid start.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = h as usize;
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | if onstack { libc::SA_ONSTACK } else { 0 };
    // SAFETY: `sa.sa_mask` is a valid sigset to fill.
    unsafe {
        // Never nest: a sample must not interrupt a trap handler or vice
        // versa, and a thread must not change stacks while on one. Nor may
        // any other signal's handler run in the middle of witch's work
        // (whose handler could unblock witch's signals, and the next one
        // would find the handler stack in use): every signal waits the few
        // µs until the handler returns, but the faults, which cannot wait.
        // A signal passed on to the program's handler gets the mask that
        // handler asked for ([`chain`]).
        libc::sigfillset(&mut sa.sa_mask);
        for sig in SYNCHRONOUS {
            libc::sigdelset(&mut sa.sa_mask, sig);
        }
    }
    sa
}

/// Signals a fault raises, which no handler may hold back.
const SYNCHRONOUS: [i32; 4] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE];

/// Take `sig` with `sa`, remembering the program's disposition.
fn take(sig: i32, sa: &libc::sigaction) {
    // SAFETY: sigaction is plain data.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to plain structs.
    unsafe { real_sigaction()(sig, sa, &mut old) };
    PROGRAM.set_action(sig, &old);
    PROGRAM.set_owned(sig, true);
}

/// A preloaded agent's handlers: samples and traps, and the fatal-signal hooks.
pub fn install_preloaded() {
    let sa = action(on_signal, true);
    take(libc::SIGTRAP, &sa);
    take(sampler_signal(), &sa);
    guard_existing();
    for sig in FATAL {
        // SAFETY: sigaction is plain data.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: queries the current disposition.
        unsafe { real_sigaction()(sig, std::ptr::null(), &mut old) };
        if old.sa_sigaction == libc::SIG_DFL {
            let mut sa = action(on_fatal, true);
            sa.sa_flags |= libc::SA_RESETHAND;
            // SAFETY: installs our handler.
            unsafe { real_sigaction()(sig, &sa, std::ptr::null_mut()) };
            PROGRAM.set_fatal_hook(sig, true);
        }
    }
}

/// The program asks for `act` on fault signal `sig` (see [`FAULTS`]): a
/// handler of its own is installed behind [`on_fault`], with its own flags
/// and mask (so it runs on the stack it chose, as often as it chose);
/// anything else as asked. Returns what the C library's `sigaction` did.
pub fn guard(sig: i32, act: &libc::sigaction) -> i32 {
    let handler = act.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        PROGRAM.set_guarded(sig, false);
        // SAFETY: the program's own disposition, installed as asked.
        return unsafe { real_sigaction()(sig, act, std::ptr::null_mut()) };
    }
    PROGRAM.set_action(sig, act);
    let mut ours = *act;
    ours.sa_sigaction = on_fault as *const () as usize;
    ours.sa_flags |= libc::SA_SIGINFO;
    // SAFETY: installs our wrapper with the program's flags and mask.
    let r = unsafe { real_sigaction()(sig, &ours, std::ptr::null_mut()) };
    PROGRAM.set_guarded(sig, r == 0);
    r
}

/// Has the program no handler of its own for any fault signal (see
/// [`FAULTS`])? An attached agent interposes nothing, so it cannot guard
/// them: it runs burst windows only then (checked at each poll).
pub fn faults_without_handlers() -> bool {
    FAULTS.iter().all(|&sig| {
        // SAFETY: sigaction is plain data.
        let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: queries the current disposition.
        unsafe { real_sigaction()(sig, std::ptr::null(), &mut cur) };
        cur.sa_sigaction == libc::SIG_DFL || cur.sa_sigaction == libc::SIG_IGN
    })
}

/// Guard the fault handlers the program installed before the agent
/// started (preloaded).
pub fn guard_existing() {
    for sig in FAULTS {
        // SAFETY: sigaction is plain data.
        let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: queries the current disposition.
        unsafe { real_sigaction()(sig, std::ptr::null(), &mut cur) };
        let ours = cur.sa_sigaction == on_fault as *const () as usize || cur.sa_sigaction == on_fatal as *const () as usize;
        if !ours && cur.sa_sigaction != libc::SIG_DFL && cur.sa_sigaction != libc::SIG_IGN {
            guard(sig, &cur);
        }
    }
}

/// A fault whose handler the program chose (see [`guard`]). A thread that
/// faulted in a copy in its code cache is first put back at the native
/// instruction, with its own registers and signal mask (and the mask its
/// handler asked for now, so a `longjmp` out of the handler leaves the
/// mask as natively); then the program's handler runs as it would have.
pub extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let ucp = uc as *mut libc::ucontext_t;
    let slot = AGENT.current();
    if let (Some(engine), Some(slot), Some(mut entered)) = (AGENT.engine(), slot, slot.and_then(ThreadSlot::enter)) {
        let stack = entered.stack;
        if let Some(ts) = entered.state() {
            if ts.in_window() {
                // On the handler stack: the program's own fault handler may
                // run on a small alternate stack of its own.
                // SAFETY: `uc` is the kernel's context for this signal.
                let leave = || slot.engine_handler(|| unsafe { ts.leave_cache_at_fault(engine, ucp) });
                let left = handler_stack::run(stack, ucp, leave);
                if left {
                    let sa = PROGRAM.action(sig);
                    // SAFETY: `ucp` is the kernel's context; its mask is now the program's.
                    let mut mask = unsafe { siginfo::frame_mask(ucp) };
                    for s in 1..crate::program::NSIG as i32 {
                        // SAFETY: `sa_mask` is a valid sigset; sigismember only reads it.
                        if unsafe { libc::sigismember(&sa.sa_mask, s) } == 1 {
                            mask |= siginfo::mask_bit(s);
                        }
                    }
                    if sa.sa_flags & libc::SA_NODEFER == 0 {
                        mask |= siginfo::mask_bit(sig);
                    }
                    siginfo::set_thread_mask(mask);
                }
            }
        }
    }
    if PROGRAM.action(sig).sa_flags & libc::SA_RESETHAND != 0 {
        // The kernel reset the disposition on delivery: so does the program's view.
        PROGRAM.set_guarded(sig, false);
    }
    chain(sig, info, uc);
}

/// Give back the default action of the fatal signals a hook took (a
/// sandboxed process: the hook writes a profile and raises the signal
/// again, system calls its filter may not allow). A signal the program
/// has given a handler of its own since has no hook.
pub fn give_back_fatal_hooks() {
    for sig in FATAL {
        if !PROGRAM.fatal_hook(sig) {
            continue;
        }
        // SAFETY: sigaction is plain data; all zero with SIG_DFL is the default action.
        let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: queries the current disposition.
        unsafe { real_sigaction()(sig, std::ptr::null(), &mut cur) };
        if cur.sa_sigaction == on_fatal as *const () as usize {
            // SAFETY: as above.
            let mut dfl: libc::sigaction = unsafe { std::mem::zeroed() };
            dfl.sa_sigaction = libc::SIG_DFL;
            // SAFETY: installs the default action.
            unsafe { real_sigaction()(sig, &dfl, std::ptr::null_mut()) };
        }
        PROGRAM.set_fatal_hook(sig, false);
    }
}

/// An attached agent's handlers: samples and traps. No fatal-signal hooks:
/// the program's handlers installed before the session were read by no
/// `sigaction` of the agent's, so it would see them.
pub fn install_attached() {
    let sa = action(on_signal, true);
    take(libc::SIGTRAP, &sa);
    take(sampler_signal(), &sa);
}

/// Give the program back its handlers (attached, after a session), unless
/// it replaced ours meanwhile, in which case its choice stands. (The
/// session's end calls it once no signal of witch's is pending.)
pub fn restore_attached() {
    for sig in [libc::SIGTRAP, sampler_signal()] {
        // SAFETY: sigaction is plain data.
        let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: queries the current disposition.
        unsafe { real_sigaction()(sig, std::ptr::null(), &mut cur) };
        if cur.sa_sigaction == on_signal as *const () as usize {
            let program = PROGRAM.action(sig);
            // SAFETY: reinstalls the program's recorded disposition.
            unsafe { real_sigaction()(sig, &program, std::ptr::null_mut()) };
        }
        PROGRAM.set_owned(sig, false);
    }
}

/// Runs `f` with errno saved: a handler must not change the errno the
/// interrupted code sees.
fn keeping_errno(f: impl FnOnce()) {
    // SAFETY: __errno_location is this thread's errno.
    let errno = unsafe { *libc::__errno_location() };
    f();
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// The entry of SIGTRAP and the sampler's signal: a small frame on the
/// stack the kernel chose, which may be the program's own small alternate
/// stack; the engine's work runs on the thread's handler stack
/// ([`handler_stack`]), and a signal that is not witch's goes on to the
/// program's handler from here.
pub extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    keeping_errno(|| {
        let uc = uc as *mut libc::ucontext_t;
        let ours = if crate::calibrate::running() {
            // Start-up, on a thread with a stack of the usual size (the
            // first thread before the program runs, or the control thread).
            crate::calibrate::on_signal(sig, info, uc)
        } else {
            match AGENT.current().and_then(ThreadSlot::enter) {
                Some(mut entered) => handler_stack::run(entered.stack, uc, || {
                    dispatch(sig, info, uc, &mut entered) || held_for_program(sig, info, uc, &mut entered)
                }),
                // No handler stack, so no engine state: only whether it is ours.
                None => stateless(sig, info),
            }
        };
        if !ours && stray_step(sig, info, uc) {
            return;
        }
        if !ours {
            chain(sig, info, uc as *mut libc::c_void);
        }
    });
}

/// A single-step trap that no burst claims, which witch's trap flag left
/// behind: its trap flag is cleared and the program runs on. A burst the
/// engine gave up as lost (a tick found no step since the last, as when
/// the program's own handler ran for a whole period) may have left its
/// flag in the frame that handler returns to, and a thread cloned while a
/// burst stepped the `clone` starts with the flag set before it has any
/// state. The trap is witch's when the engine says it may have left one
/// (taken once), or when the program takes SIGTRAP by its default (or
/// ignores it): natively, no step trap could reach such a program unless
/// it set the flag itself, which would kill it. A program with a SIGTRAP
/// handler of its own gets every other step trap.
// Out of line, as `stateless`: `on_signal`'s own frame is on the program's
// stack, and `tests/tests/harm.rs` holds it to a few hundred bytes.
#[inline(never)]
fn stray_step(sig: i32, info: *mut libc::siginfo_t, uc: *mut libc::ucontext_t) -> bool {
    // SAFETY: `info` is the kernel's siginfo for this signal.
    if sig != libc::SIGTRAP || unsafe { siginfo::origin(sig, info) } != siginfo::Origin::Step {
        return false;
    }
    // SAFETY: this thread's slot; its handler that held the state (in
    // `dispatch`) has returned.
    let left = AGENT.current().and_then(|s| unsafe { s.own_state() }).is_some_and(|ts| ts.take_left_trap_flag());
    let program = PROGRAM.action(libc::SIGTRAP).sa_sigaction;
    if !left && program != libc::SIG_DFL && program != libc::SIG_IGN {
        return false;
    }
    // SAFETY: `uc` is the kernel's context for this signal; only its trap flag changes.
    unsafe { engine::clear_trap_flag(uc) };
    true
}

/// A signal of the program's own that the program's view of this
/// thread's mask blocks ([`crate::program_mask`]): held for the program as
/// the kernel would have held it, pending and blocked, for its
/// `sigwaitinfo` or `signalfd`, or for its handler once it unblocks it.
/// The thread's sampler pauses meanwhile, and a tick of witch's already
/// waiting is dropped, so that none reaches the program; the program's
/// own instances waiting behind this one are queued again after it, in
/// order (up to 16 of them). The sampler's signal only: a held SIGTRAP
/// would leave the code cache's exits to the default action. Preloaded
/// only. True if held. On the thread's handler stack (`entered`).
#[inline(never)]
fn held_for_program(sig: i32, info: *mut libc::siginfo_t, uc: *mut libc::ucontext_t, entered: &mut Entered) -> bool {
    let (bit, slot) = (siginfo::mask_bit(sig), entered.slot());
    // (Attached, the program's masks reach the kernel as they are: one of
    // its own signals that comes here was not blocked, whatever the view.)
    if sig != sampler_signal() || !PROGRAM.owned(sig) || info.is_null() || slot.mask.blocks() & bit == 0 || AGENT.mode() == Mode::Attached {
        return false;
    }
    slot.mask.park_sampler(slot.with_sampler(|ts| ts.pause_sampler_left()));
    // SAFETY: siginfo_t is plain data.
    let mut behind: [libc::siginfo_t; 16] = unsafe { std::mem::zeroed() };
    let mut n = 0;
    // SAFETY: as above.
    let mut si: libc::siginfo_t = unsafe { std::mem::zeroed() };
    while siginfo::take_pending(sig, &mut si) {
        if !stateless(sig, &mut si) && n < behind.len() {
            behind[n] = si;
            n += 1;
        }
    }
    // SAFETY: `info` is the kernel's siginfo for this signal.
    siginfo::queue_to_self(sig, unsafe { &*info });
    for si in &behind[..n] {
        siginfo::queue_to_self(sig, si);
    }
    // SAFETY: `uc` is the kernel's context for this signal: the mask the thread returns to blocks it.
    unsafe { libc::sigaddset(&mut (*uc).uc_sigmask, sig) };
    slot.mask.hold(bit);
    if let Some(ts) = entered.state() {
        ts.signal_held_for_program();
    }
    true
}

/// Is this signal witch's, for a thread without engine state (one that
/// ended, or was never set up, or whose session ended while the signal
/// was queued or this handler was stopped before it found its state)? Then
/// it is dropped, not passed on: its tag, or witch's descriptor range,
/// says it is ours, with or without an engine (which the session's end
/// may have let go meanwhile).
#[inline(never)]
fn stateless(sig: i32, info: *mut libc::siginfo_t) -> bool {
    // SAFETY: `info` is the kernel's siginfo for this signal.
    unsafe { engine::classify(sig, info, None) }.is_some()
}

/// Handle our samples and traps (on the thread's handler stack, its
/// slot's, `entered`); false if the signal isn't ours.
#[inline(never)]
fn dispatch(sig: i32, info: *mut libc::siginfo_t, uc: *mut libc::ucontext_t, entered: &mut Entered) -> bool {
    let Some(engine) = AGENT.engine() else { return false };
    let slot = entered.slot();
    if slot.linking() {
        // Inside the engine's link path, which holds the state: only its
        // own access can trap here (a watchpoint on the code the
        // translator reads), witch's, dropped.
        return stateless(sig, info);
    }
    let ts = entered.state();
    // SAFETY: `info` is the kernel's siginfo for this signal.
    let Some(event) = (unsafe { engine::classify(sig, info, ts.as_deref()) }) else { return false };
    let Some(ts) = ts else { return true };
    let ends_burst = matches!(event, engine::Event::Step | engine::Event::CacheExit);
    if AGENT.sandboxed() {
        // Under a seccomp filter now: nothing that makes a system call (a
        // signal of ours still pending when the session ended).
        if ends_burst {
            // SAFETY: `uc` is the kernel's context for this signal.
            unsafe { ts.drop_burst(uc) };
        }
        return true;
    }
    if ends_burst && (AGENT.stopping() || slot.phase() != Life::Adopted || !ts.is_active()) {
        // A burst the engine will not finish: stop stepping here (or the
        // thread would go on single-stepping into the program's SIGTRAP),
        // and leave the code cache for the native code it stands for.
        // SAFETY: `uc` is the kernel's context for this signal.
        unsafe { ts.drop_burst(uc) };
        return true;
    }
    if AGENT.mode() == Mode::Attached {
        match (slot.phase(), AGENT.stopping()) {
            (Life::New, false) if event == engine::Event::Sample => {
                adopt(slot, ts, uc);
                return true;
            }
            (Life::Adopted, false) => {}
            _ => return true,
        }
    }
    if AGENT.stopping() {
        return true;
    }
    if AGENT.mode() == Mode::Preloaded {
        // SAFETY: `uc` is the kernel's context for this signal.
        slot.engine_handler(|| alloc::in_handler(|| unsafe { ts.handle(engine, event, uc) }));
    } else {
        // SAFETY: as above.
        slot.engine_handler(|| unsafe { ts.handle(engine, event, uc) });
    }
    true
}

/// The engine's link path, called from a thread's code cache without a
/// trap (see `witchcraft::engine::link`): the window's signal mask holds,
/// the program's registers are saved, and the thread runs on its cache's
/// link stack. Makes the copy an exit asks for, or takes a window's pick
/// (`saved`: the program's registers), or leaves it to the exit's trap
/// (which also ends or drops the window when the session stops).
extern "C" fn on_cache_link(saved: *const witchcraft::engine::link::Saved) {
    // SAFETY: the engine's entry passes the registers it saved on the
    // link stack, alive for this call.
    let saved = unsafe { *saved };
    keeping_errno(|| {
        let Some(engine) = AGENT.engine() else { return };
        if AGENT.stopping() || AGENT.sandboxed() {
            return;
        }
        let Some(slot) = AGENT.current() else { return };
        if slot.phase() != Life::Adopted && AGENT.mode() == Mode::Attached {
            return;
        }
        let Some(mut entered) = slot.enter() else { return };
        // Outside any of witch's handlers (the thread runs its window's
        // copies, which called this); a handler nested in this call finds
        // `linking` set and leaves the state alone.
        let Some(ts) = entered.state() else { return };
        slot.set_linking(true);
        let link = || {
            if let Some(map) = witchcraft::modules::current() {
                ts.link_in_cache(engine, map, &saved);
            }
        };
        if AGENT.mode() == Mode::Preloaded {
            slot.engine_handler(|| alloc::in_handler(link));
        } else {
            slot.engine_handler(link);
        }
        slot.set_linking(false);
    });
}

/// Let the code caches link copies without a trap (see [`on_cache_link`]).
pub fn enable_links() {
    witchcraft::engine::link::set_hook(on_cache_link);
}

/// Set up an attached thread at its first sample (it runs, so it is not
/// blocked in a call): where its stack is, from the interrupted stack
/// pointer, and its segment bases. Its alternate signal stack stays the
/// program's (see the module comment). Async-signal-safe.
fn adopt(slot: &ThreadSlot, ts: &mut engine::ThreadState, uc: *mut libc::ucontext_t) {
    // SAFETY: `uc` is the kernel's context for this signal; only read.
    let (sp, own) = unsafe { ((*uc).uc_mcontext.gregs[libc::REG_RSP as usize] as u64, Prior::from_stack(&(*uc).uc_stack)) };
    // The interrupted code runs on the program's alternate stack (in a
    // handler of its own): the thread's stack is found at a later sample.
    if own != Prior::NONE && own.sp <= sp && sp < own.sp + own.size {
        return;
    }
    ts.adopt(Place::here(crate::mappings::stack_of(sp), slot.alt_stack()));
    slot.set_phase(Life::Adopted);
}

/// Give a signal that isn't ours to the program's handler, or its default.
pub fn chain(sig: i32, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let sa = PROGRAM.action(sig);
    match sa.sa_sigaction {
        libc::SIG_IGN => {}
        libc::SIG_DFL => {
            // Default action (SIGTRAP: core dump). Deliver it as it would have been.
            // SAFETY: sigaction is plain data.
            let mut d: libc::sigaction = unsafe { std::mem::zeroed() };
            d.sa_sigaction = libc::SIG_DFL;
            // SAFETY: installs the default action, then re-sends the signal to this thread.
            unsafe { real_sigaction()(sig, &d, std::ptr::null_mut()) };
            task::tgkill(task::gettid(), sig);
        }
        h if sa.sa_flags & libc::SA_SIGINFO != 0 => {
            program_mask(sig, &sa, uc);
            // SAFETY: the program installed `h` as a three-argument handler.
            let f = unsafe { std::mem::transmute::<usize, extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)>(h) };
            f(sig, info, uc);
        }
        h => {
            program_mask(sig, &sa, uc);
            // SAFETY: the program installed `h` as a one-argument handler.
            let f = unsafe { std::mem::transmute::<usize, extern "C" fn(libc::c_int)>(h) };
            f(sig);
        }
    }
}

/// The signal mask the kernel would have given the program's handler `sa`
/// for `sig`: the interrupted code's, its `sa_mask`, and `sig` itself
/// unless `SA_NODEFER`. (Returning from witch's handler restores the
/// interrupted code's mask.)
fn program_mask(sig: i32, sa: &libc::sigaction, uc: *mut libc::c_void) {
    let uc = uc as *const libc::ucontext_t;
    // SAFETY: sigset_t is plain data; `uc` is the kernel's context for this signal.
    let mut mask: libc::sigset_t = unsafe { (*uc).uc_sigmask };
    let defer = sa.sa_flags & libc::SA_NODEFER == 0;
    for s in 1..crate::program::NSIG as i32 {
        // SAFETY: valid sets and signal numbers.
        let add = unsafe { libc::sigismember(&sa.sa_mask, s) } == 1 || (defer && s == sig);
        if add {
            // SAFETY: as above.
            unsafe { libc::sigaddset(&mut mask, s) };
        }
    }
    task::set_signal_mask(&mask);
}

/// A fatal signal with default action: save what was gathered, then die
/// the way the program would have (SA_RESETHAND restored the default).
/// The crash may be inside `malloc` with its lock held, so the profile is
/// written from the crash allocator, with no lock the program may hold.
pub extern "C" fn on_fatal(sig: libc::c_int, _info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    PROGRAM.set_fatal_hook(sig, false);
    if AGENT.claim_finish() {
        // Writing the profile takes far more stack than a program's own
        // alternate stack may have: on the handler stack.
        match AGENT.current().map(ThreadSlot::alt_stack) {
            Some(stack) if stack.0 != 0 => {
                handler_stack::run(stack, uc as *const libc::ucontext_t, || {
                    write_crash_profile(sig);
                    true
                });
            }
            _ => write_crash_profile(sig),
        }
    }
    task::tgkill(task::gettid(), sig);
}

#[inline(never)]
fn write_crash_profile(sig: i32) {
    alloc::enter_crash_mode();
    let mut quiesced = AGENT.quiesce(|_| false);
    if let Err(e) = AGENT.deliver(&AGENT.profile(&mut quiesced, EndedBy::Signal(sig), None)) {
        crate::state::say(&format!("witch: agent: cannot write the profile: {e}\n"));
    }
}
