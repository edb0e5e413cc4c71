//! Measure, on this machine, the CPU cost of a watchpoint trap, of a signal
//! round trip and of one single step outside the handlers' own code
//! (exception entry, signal delivery and sigreturn; in a VM, the
//! hypervisor's part too). The engine's time accounting subtracts them
//! (`witchcraft::engine::clock`). The single step is measured by
//! `witchcraft::engine::calibrate`, as `witch doctor` measures it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use witchcraft::engine::calibrate::{self as steps, measure_steps};
use witchcraft::engine::Costs;
use witchcraft::sys::perf::{self, Attr, BpType};
use witchcraft::sys::siginfo::{self, sampler_signal, Origin};
use witchcraft::sys::task::{self, thread_cpu_ns};

static RUNNING: AtomicBool = AtomicBool::new(false);
static HITS: AtomicU64 = AtomicU64::new(0);
const TAG: u64 = 0xfe;

/// Is a calibration running (its signals are its own)?
pub fn running() -> bool {
    RUNNING.load(Ordering::Acquire)
}

/// A fork child runs no calibration: the one thread that runs it (the
/// control thread of an attach session, or a preloaded program's first
/// thread) is not the forking thread, and is not in the child. A child
/// forked during one must not inherit it as running (the handlers would
/// take the child's own SIGTRAP and sampler's signal for the calibration's,
/// for good). Async-signal-safe: a `fork` in a signal handler runs it too.
extern "C" fn none_in_fork_child() {
    RUNNING.store(false, Ordering::Release);
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

/// The round trips, measured on the calling thread with the handlers
/// installed. Runs once per engine, before sampling starts.
pub fn calibrate(sigtrap: bool) -> Costs {
    // Few: the trap cost is re-measured while the program runs (engine clock).
    const N: u64 = 16;
    const ROUNDS: usize = 4;
    RUNNING.store(true, Ordering::Release);
    let cell = Box::new(std::cell::UnsafeCell::new(0u64));
    let addr = cell.get() as u64;
    let mut trap_ns = 0;
    let a = Attr::breakpoint(addr, 8, BpType::W).expect("an aligned u64");
    let a = if sigtrap { a.sigtrap(siginfo::TAG | TAG) } else { a };
    if let Ok(fd) = a.open(0) {
        if !sigtrap {
            perf::route_signal_to_thread(fd, sampler_signal(), task::gettid());
        }
        // The least of a few rounds, as for the signal and the step below:
        // one round that the machine slowed down read 181.7 µs a trap where
        // the others read about 20, and the budget, charging each pick
        // that much, bought a third of the windows for the whole run.
        trap_ns = (0..ROUNDS)
            .map(|r| {
                HITS.store(0, Ordering::Relaxed);
                let t0 = thread_cpu_ns();
                for i in 0..N {
                    // SAFETY: `cell` is ours and alive; the write is what traps.
                    unsafe { std::ptr::write_volatile(cell.get(), i + r as u64 * N) };
                }
                let t1 = thread_cpu_ns();
                (t1 - t0) / HITS.load(Ordering::Relaxed).max(1)
            })
            .min()
            .unwrap_or(0);
        perf::close(fd);
    }
    // A signal round trip without an exception (delivery and sigreturn),
    // then single steps: the sampler's signal sets the trap flag, and each
    // step of a busy loop is one SIGTRAP with TRAP_TRACE. Each is the
    // least of a few rounds: a round that the machine slowed down (once
    // twice the real cost, which made every step's accounted cost twice its
    // own and the program's time between samples vanish) only adds to what
    // one costs. The step's is only the
    // first estimate: each burst then times its own steps.
    let rounds: [(u64, Option<u64>); ROUNDS] = std::array::from_fn(|_| {
        HITS.store(0, Ordering::Relaxed);
        let t0 = thread_cpu_ns();
        for _ in 0..N {
            task::tgkill(task::gettid(), sampler_signal());
        }
        let t1 = thread_cpu_ns();
        let signal = (t1 - t0) / HITS.load(Ordering::Relaxed).max(1);
        HITS.store(0, Ordering::Relaxed);
        let (ns, stepped) = measure_steps(32, || {
            task::tgkill(task::gettid(), sampler_signal());
        });
        (signal, ns.saturating_sub(signal).checked_div(stepped))
    });
    let signal_ns = rounds.iter().map(|r| r.0).min().unwrap_or(0);
    // 0: single steps do not work here.
    let step_ns = rounds.iter().filter_map(|r| r.1).min().unwrap_or(0);
    RUNNING.store(false, Ordering::Release);
    drop(cell);
    Costs { trap_ns, signal_ns, step_ns, ns_per_cycle: task::ns_per_cycle(500_000) }
}
