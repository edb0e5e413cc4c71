//! What the two burst engines pay per instruction on this machine, in the
//! process itself: `cargo bench -p witch-benches --bench window`.
//!
//! - **A single step:** the trap flag set, one instruction, the debug
//!   exception, SIGTRAP to a handler that only counts and leaves the flag
//!   set, `sigreturn`: what each instruction of a single-step burst
//!   costs before witch's own handler does anything.
//! - **Translating a block** into the code cache: `CodeCache::get` (the
//!   engine's path: decode, copy, re-aim, emit, index) on the first block of
//!   each function of the C library (cold: the cache is emptied between
//!   batches), for both counted kinds and both variants.
//!
//! What an instruction costs once it runs in the cache is the profile's to
//! say (`counters.cache_ns` over `counters.window_instructions`): see
//! `benches/window_cost.py`, which runs this and prints the ratios.
//! Figures are medians of batches of the thread's CPU time (user and
//! system: the kernel's part of a step included, other programs' time on
//! a shared machine not); one line each, `name: value unit`.

use std::sync::atomic::{AtomicU64, Ordering};
use witchcraft::engine::cache::CodeCache;
use witchcraft::modules;
use witchcraft::x86::translate::{Counted, Variant};

static STEPS: AtomicU64 = AtomicU64::new(0);
static LIMIT: AtomicU64 = AtomicU64::new(0);

/// The trap flag in RFLAGS.
const TF: i64 = 0x100;

extern "C" fn on_step(_: libc::c_int, _: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let n = STEPS.fetch_add(1, Ordering::Relaxed) + 1;
    if n >= LIMIT.load(Ordering::Relaxed) {
        // SAFETY: the kernel passes the interrupted context; clearing TF
        // in it ends the stepping at sigreturn.
        unsafe {
            let uc = &mut *(uc as *mut libc::ucontext_t);
            uc.uc_mcontext.gregs[libc::REG_EFL as usize] &= !TF;
        }
    }
}

/// The calling thread's CPU time (user and system), seconds: what the
/// thread itself spent, whoever else shares the machine.
fn cpu_secs() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// µs of the thread's CPU time per single step over `n` steps of a plain loop.
fn single_step_us(n: u64) -> f64 {
    STEPS.store(0, Ordering::Relaxed);
    LIMIT.store(n, Ordering::Relaxed);
    let t = cpu_secs();
    // SAFETY: sets TF in RFLAGS; the SIGTRAP handler installed by main
    // counts each step and clears TF after `n` of them. Nothing but flags
    // and the scratch registers named is touched.
    unsafe {
        std::arch::asm!(
            "pushfq",
            "or qword ptr [rsp], 0x100",
            "popfq",
            "2:",
            "add {x}, 1",
            "cmp {x}, {n}",
            "jb 2b",
            x = inout(reg) 0u64 => _,
            n = in(reg) n * 4,
        );
    }
    let secs = cpu_secs() - t;
    secs * 1e6 / STEPS.load(Ordering::Relaxed).max(1) as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    // SAFETY: a counting handler for SIGTRAP (async-signal-safe: atomics only).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_step as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigaction(libc::SIGTRAP, &sa, std::ptr::null_mut());
    }
    single_step_us(1000);
    let step = median((0..9).map(|_| single_step_us(2000)).collect());
    println!("single step: {step:.2} us (trap flag, SIGTRAP to a counting handler, sigreturn)");

    modules::refresh();
    let map = modules::current().expect("the process map");
    let libc_at = libc::qsort as *const () as u64;
    let m = map.module(libc_at).expect("the C library's module");
    let starts: Vec<u64> = m.func_starts.iter().copied().filter(|&s| s >= m.start && s < m.end).collect();
    assert!(starts.len() > 500, "only {} function starts in {}", starts.len(), m.path);
    let own = map.own;
    let mut cache = CodeCache::new(false);
    assert!(cache.ready(map), "no code cache (mmap of writable code refused?)");
    for (counted, cname) in [(Counted::Stores, "stores"), (Counted::Loads, "loads")] {
        for (variant, vname) in [(Variant::Fast, "fast"), (Variant::Slow, "slow")] {
            let mut per = Vec::new();
            let mut made = 0u64;
            for _ in 0..7 {
                cache.flush();
                let before = cache.stats.blocks;
                let t = cpu_secs();
                for &s in &starts {
                    let _ = cache.get(map, own, counted, s, variant);
                }
                let secs = cpu_secs() - t;
                let n = cache.stats.blocks - before;
                made = n;
                per.push(secs * 1e6 / n.max(1) as f64);
            }
            println!(
                "translate a block ({cname}, {vname} variant): {:.2} us ({made} first blocks of {} functions of {})",
                median(per),
                starts.len(),
                m.path.rsplit('/').next().unwrap_or(&m.path)
            );
        }
    }
}
