//! Measure, on this machine, the CPU cost of a watchpoint trap, of a signal
//! round trip and of one single step outside the handlers' own code
//! (exception entry, signal delivery and sigreturn; in a VM, the
//! hypervisor's part too). The engine's time accounting subtracts them
//! (`witchcraft::engine::clock`). The single step is measured by
//! `witchcraft::engine::calibrate`, as `witch doctor` measures it.

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use witchcraft::engine::calibrate::{self as steps, measure_steps};
use witchcraft::engine::Costs;
use witchcraft::sys::perf::{self, Attr, BpType};
use witchcraft::sys::siginfo::{self, sampler_signal, Origin};
use witchcraft::sys::task::{self, thread_cpu_ns};

/// The thread running a calibration (0: none). Only its signals are the
/// calibration's: attached, the program's threads run on meanwhile, and a
/// sampler's signal of the program's own that one of them took then was
/// swallowed, with the trap flag set on its thread.
static RUNNING: AtomicI32 = AtomicI32::new(0);
static HITS: AtomicU64 = AtomicU64::new(0);
const TAG: u64 = 0xfe;

/// Is a calibration running on this thread (its signals are its own)?
pub fn running() -> bool {
    let tid = RUNNING.load(Ordering::Acquire);
    tid != 0 && tid == task::gettid()
}

/// A fork child runs no calibration: the one thread that runs it (the
/// control thread of an attach session, or a preloaded program's first
/// thread) is not the forking thread, and is not in the child. A child
/// forked during one must not inherit it as running (the handlers would
/// take the child's own SIGTRAP and sampler's signal for the calibration's,
/// for good). Async-signal-safe: a `fork` in a signal handler runs it too.
extern "C" fn none_in_fork_child() {
    RUNNING.store(0, Ordering::Release);
}

/// Register [`none_in_fork_child`] with the C library, once per process (a
/// program may be attached to many times; the agent stays loaded), before
/// the first calibration.
pub fn keep_out_of_fork_children() {
    static DONE: AtomicBool = AtomicBool::new(false);
    if !DONE.swap(true, Ordering::AcqRel) {
        // SAFETY: registers a child handler that only stores to an atomic.
        unsafe { libc::pthread_atfork(None, None, Some(none_in_fork_child)) };
    }
}

/// A signal during calibration: true if it was the calibration's.
pub fn on_signal(sig: i32, info: *mut libc::siginfo_t, uc: *mut libc::ucontext_t) -> bool {
    // SAFETY: `info` is the kernel's siginfo for this signal.
    let origin = unsafe { siginfo::origin(sig, info) };
    // SAFETY: `uc` is the kernel's context for this signal; only its flags are changed.
    let efl = unsafe { &mut (*uc).uc_mcontext.gregs[libc::REG_EFL as usize] };
    let ours = match origin {
        Origin::Perf { data, .. } => data == siginfo::TAG | TAG,
        Origin::Step if steps::stepping() => {
            steps::on_step(efl);
            true
        }
        _ if sig == sampler_signal() => {
            steps::start_stepping(efl);
            true
        }
        _ => false,
    };
    if ours {
        let t0 = thread_cpu_ns();
        std::hint::black_box(t0);
        let _ = thread_cpu_ns(); // the two clock reads a real handler makes
        HITS.fetch_add(1, Ordering::Relaxed);
    }
    ours
}

/// The round trips for this process: those the run's first process
/// measured, when `shared` (the run's file for them) has them, else
/// measured here and left in `shared` for the run's other processes (a
/// program that starts hundreds of processes, a build or a test suite,
/// paid about 3 ms of calibration in each of them). With the process that
/// measured them, when another did.
pub fn round_trips(shared: Option<&Path>, sigtrap: bool) -> (Costs, Option<u32>) {
    if let Some((costs, pid)) = shared.and_then(read_shared) {
        return (costs, Some(pid));
    }
    let costs = calibrate(sigtrap);
    if let Some(path) = shared {
        share(path, &costs);
    }
    (costs, None)
}

/// The round trips in the run's file, if it holds a whole line of them.
fn read_shared(path: &Path) -> Option<(Costs, u32)> {
    use std::io::Read;
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path).ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut line = String::new();
    f.take(256).read_to_string(&mut line).ok()?;
    Costs::from_line(&line)
}

/// Leave `costs` in the run's file, whole or not at all (written aside,
/// then renamed over it: a process starting meanwhile reads either
/// none or all of it).
fn share(path: &Path, costs: &Costs) {
    let pid = std::process::id();
    let aside = path.with_extension(format!("{pid}.tmp"));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_CLOEXEC)
        .open(&aside)
        .and_then(|mut f| std::io::Write::write_all(&mut f, costs.to_line(pid).as_bytes()));
    if written.is_err() || std::fs::rename(&aside, path).is_err() {
        let _ = std::fs::remove_file(&aside);
    }
}

/// The round trips, measured on the calling thread with the handlers
/// installed. Runs once per engine, before sampling starts. Each figure
/// is the least of a few short rounds (below); the trap's and the step's
/// are only first estimates, which the engine's clock and each burst
/// then measure again as the program runs, so their rounds are the
/// shortest (about 1 ms in all here, against 3.5 ms with rounds of 16
/// traps and 32 steps).
pub fn calibrate(sigtrap: bool) -> Costs {
    const TRAPS: u64 = 4;
    const SIGNALS: u64 = 16;
    const STEPS: u64 = 8;
    const ROUNDS: usize = 4;
    RUNNING.store(task::gettid(), Ordering::Release);
    // The time-stamp counter's rate, over the calibration itself.
    let (t0, c0) = (task::monotonic_ns(), task::cycles());
    let cell = Box::new(std::cell::UnsafeCell::new(0u64));
    let addr = cell.get() as u64;
    let a = Attr::breakpoint(addr, 8, BpType::W).expect("an aligned u64");
    let a = if sigtrap { a.sigtrap(siginfo::TAG | TAG) } else { a }.disabled();
    let trap_fd = a.open(0).ok();
    if let (Some(fd), false) = (trap_fd, sigtrap) {
        perf::route_signal_to_thread(fd, sampler_signal(), task::gettid());
    }
    // Each figure is the least of a few rounds, and the rounds of the three
    // kinds take turns, so a slowdown of the machine for a while (a round
    // once read 181.7 µs a trap where the others read about 20, and the
    // budget, charging each pick that much, bought a third of the windows
    // for the whole run; a step's twice its cost made the program's time
    // between samples vanish) only adds to what one costs. A round: some
    // watchpoint traps; signal round trips without an exception (delivery
    // and sigreturn); single steps (the sampler's signal sets the trap
    // flag, and each step of a busy loop is one SIGTRAP with TRAP_TRACE).
    let rounds: [(Option<u64>, u64, Option<u64>); ROUNDS] = std::array::from_fn(|r| {
        let trap = trap_fd.map(|fd| {
            perf::enable(fd);
            HITS.store(0, Ordering::Relaxed);
            let t0 = thread_cpu_ns();
            for i in 0..TRAPS {
                // SAFETY: `cell` is ours and alive; the write is what traps.
                unsafe { std::ptr::write_volatile(cell.get(), i + r as u64 * TRAPS) };
            }
            let ns = (thread_cpu_ns() - t0) / HITS.load(Ordering::Relaxed).max(1);
            // The signals and steps are measured without a watchpoint
            // enabled (with one, a signal's round trip took 0.3 µs more).
            perf::disable(fd);
            ns
        });
        HITS.store(0, Ordering::Relaxed);
        let t0 = thread_cpu_ns();
        for _ in 0..SIGNALS {
            task::tgkill(task::gettid(), sampler_signal());
        }
        let signal = (thread_cpu_ns() - t0) / HITS.load(Ordering::Relaxed).max(1);
        HITS.store(0, Ordering::Relaxed);
        let (ns, stepped) = measure_steps(STEPS, || {
            task::tgkill(task::gettid(), sampler_signal());
        });
        (trap, signal, ns.saturating_sub(signal).checked_div(stepped))
    });
    if let Some(fd) = trap_fd {
        perf::close(fd);
    }
    // 0: no watchpoint could be opened.
    let trap_ns = rounds.iter().filter_map(|r| r.0).min().unwrap_or(0);
    let signal_ns = rounds.iter().map(|r| r.1).min().unwrap_or(0);
    // 0: single steps do not work here.
    let step_ns = rounds.iter().filter_map(|r| r.2).min().unwrap_or(0);
    RUNNING.store(0, Ordering::Release);
    drop(cell);
    let (t1, c1) = (task::monotonic_ns(), task::cycles());
    let ns_per_cycle = if c1 > c0 { t1.saturating_sub(t0) as f64 / (c1 - c0) as f64 } else { 0.0 };
    Costs { trap_ns, signal_ns, step_ns, ns_per_cycle }
}
