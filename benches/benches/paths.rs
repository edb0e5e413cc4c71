//! The cost of the engine's own paths, each measured alone, so slow spots
//! are visible: `cargo bench -p witch-benches`.
//!
//! Kernel paths (ioctl, trap and signal round trips, timer samples) and the
//! engine's CPU work in a sample or trap handler (decoding, the precise-PC
//! lookup, unwinding, tree insertion) are timed separately. Figures are
//! medians of several batches, in µs per operation.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use witchcraft::context::Tree;
use witchcraft::sys::perf::{self, Attr, BpType, SoftwareClock};
use witchcraft::sys::{mem, siginfo, task};
use witchcraft::x86::decode::{Analyzer, Regs};
use witchcraft::x86::precise_pc as trap;
use witchcraft::{modules, unwind};

fn median_us(mut f: impl FnMut() -> u64, batches: usize) -> f64 {
    let mut v: Vec<f64> = (0..batches)
        .map(|_| {
            let t = Instant::now();
            let n = f();
            t.elapsed().as_secs_f64() * 1e6 / n.max(1) as f64
        })
        .collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

static HITS: AtomicU64 = AtomicU64::new(0);
extern "C" fn count(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    HITS.fetch_add(1, Ordering::Relaxed);
}

fn install(sig: i32) {
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = count as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigaction(sig, &sa, std::ptr::null_mut());
    }
}

const DEPTH: u32 = 12;

type Job = *mut dyn FnMut(&Regs);

thread_local! {
    static JOB: std::cell::Cell<Option<Job>> = const { std::cell::Cell::new(None) };
}

extern "C" fn run_job(_: libc::c_int, _: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let regs = unsafe { Regs::from_ucontext(&*(uc as *const libc::ucontext_t), 0, 0) };
    if let Some(f) = JOB.with(|j| j.get()) {
        unsafe { (*f)(&regs) };
    }
}

/// Runs `f` in a signal handler taken `k` calls below the caller, with the
/// interrupted registers, as the engine's handlers see them.
#[inline(never)]
fn at_depth(k: u32, f: &mut dyn FnMut(&Regs)) {
    if k == 0 {
        // Safe: the pointer is used only by the handler, before this returns.
        let f: *mut (dyn FnMut(&Regs) + '_) = f;
        JOB.with(|j| j.set(Some(unsafe { std::mem::transmute::<*mut (dyn FnMut(&Regs) + '_), Job>(f) })));
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = run_job as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut());
            libc::syscall(libc::SYS_tgkill, libc::getpid(), task::gettid(), libc::SIGUSR2);
        }
        JOB.with(|j| j.set(None));
    } else {
        at_depth(black_box(k - 1), f);
    }
    black_box(k);
}

fn thread_cpu_ns() -> u64 {
    task::thread_cpu_ns()
}

/// A breakpoint attribute on `addr` with our sigtrap tag.
fn bp(addr: u64, ty: BpType, disabled: bool) -> Attr {
    let a = Attr::breakpoint(addr, 8, ty).unwrap().sigtrap(siginfo::TAG);
    if disabled {
        a.disabled()
    } else {
        a
    }
}

fn main() {
    let mut rows: Vec<(&str, f64)> = Vec::new();
    let cells = Box::new([0u64; 64]);
    let base = cells.as_ptr() as u64;

    // Arming: MODIFY_ATTRIBUTES vs close+reopen, and disarming.
    let fd = bp(base, BpType::RW, true).open(0).expect("breakpoint");
    let mut i = 0u64;
    rows.push((
        "arm: PERF_EVENT_IOC_MODIFY_ATTRIBUTES",
        median_us(
            || {
                for _ in 0..200 {
                    i += 1;
                    bp(base + 8 * (i % 32), BpType::RW, true).modify(fd);
                }
                200
            },
            9,
        ),
    ));
    // The handlers' real path: the breakpoint goes live in the debug
    // registers (a disabled one, above, never reaches them).
    rows.push((
        "arm: PERF_EVENT_IOC_MODIFY_ATTRIBUTES, enabled (handler's path)",
        median_us(
            || {
                for _ in 0..200 {
                    i += 1;
                    bp(base + 8 * (i % 32), BpType::RW, false).modify(fd);
                }
                200
            },
            9,
        ),
    ));
    rows.push((
        "disarm: PERF_EVENT_IOC_DISABLE",
        median_us(
            || {
                for _ in 0..200 {
                    perf::disable(fd);
                }
                200
            },
            9,
        ),
    ));
    perf::close(fd);
    rows.push((
        "arm fallback: close + perf_event_open",
        median_us(
            || {
                for k in 0..100u64 {
                    let fd = bp(base + 8 * (k % 32), BpType::RW, true).open(0).unwrap();
                    perf::close(fd);
                }
                100
            },
            9,
        ),
    ));

    // Trap round trip: a write that hits an armed watchpoint, with a handler that only counts.
    install(libc::SIGTRAP);
    let wfd = bp(base, BpType::W, false).open(0).expect("watchpoint");
    rows.push((
        "trap: watchpoint hit -> SIGTRAP -> return",
        median_us(
            || {
                HITS.store(0, Ordering::Relaxed);
                for k in 0..100 {
                    unsafe { std::ptr::write_volatile(base as *mut u64, k) };
                }
                HITS.load(Ordering::Relaxed)
            },
            9,
        ),
    ));
    perf::close(wfd);

    // Signal round trip without an exception.
    let rt = siginfo::sampler_signal();
    install(rt);
    rows.push((
        "signal: tgkill -> handler -> return",
        median_us(
            || {
                for _ in 0..100 {
                    unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), task::gettid(), rt) };
                }
                100
            },
            9,
        ),
    ));

    // Timer sample: task-clock every 100 µs over a busy loop, CPU time with and without.
    let busy = |n: u64| {
        let t = thread_cpu_ns();
        let mut x = 0u64;
        for i in 0..n {
            x = black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        black_box(x);
        thread_cpu_ns() - t
    };
    let n = 50_000_000;
    let native = busy(n).min(busy(n));
    let sfd = Attr::software_clock(SoftwareClock::Task, 100_000).open(0).expect("task-clock");
    perf::route_signal_to_thread(sfd, rt, task::gettid());
    HITS.store(0, Ordering::Relaxed);
    perf::enable(sfd);
    let with = busy(n);
    perf::disable(sfd);
    perf::close(sfd);
    let hits = HITS.load(Ordering::Relaxed).max(1);
    rows.push((
        "sample: task-clock timer signal, 100 µs period (extra CPU per sample)",
        with.saturating_sub(native) as f64 / hits as f64 / 1e3,
    ));

    // The two samplers at a realistic period: benches/sampler_cost.c (too slow for here).

    // CPU work inside the handlers.
    modules::refresh();
    let map = modules::current().unwrap();
    let mut an = Analyzer::new();
    let pc = main as *const () as u64 + 16;
    let mut uc: libc::ucontext_t = unsafe { std::mem::zeroed() };
    unsafe { libc::getcontext(&mut uc) };
    let regs = unsafe { Regs::from_ucontext(&uc, 0, 0) };
    let mut code = [0u8; 16];
    unsafe { std::ptr::copy_nonoverlapping(pc as *const u8, code.as_mut_ptr(), 16) };
    rows.push((
        "handler: decode one instruction (iced-x86 + accesses)",
        median_us(
            || {
                for _ in 0..10_000 {
                    black_box(an.decode(black_box(&code), pc, &regs, false));
                }
                10_000
            },
            9,
        ),
    ));
    let mut cache = trap::PrecisePcCache::default();
    let target = regs.rip;
    // Cold: the cache forgotten before each lookup (not reallocated, which
    // the handlers never do); the cost of forgetting is measured and taken off.
    let mut c = trap::PrecisePcCache::default();
    let forget = median_us(
        || {
            for _ in 0..200 {
                c.forget();
                black_box(&mut c);
            }
            200
        },
        5,
    );
    let cold = median_us(
        || {
            for _ in 0..200 {
                c.forget();
                black_box(trap::previous_instruction(map, &mut c, target));
            }
            200
        },
        5,
    );
    rows.push(("handler: precise PC, cold (decode the function)", cold - forget));
    let func = map.function_start(target).map(|s| (target - s, map.next_function_start(s).map(|e| e - s)));
    trap::previous_instruction(map, &mut cache, target);
    rows.push((
        "handler: precise PC, cached",
        median_us(
            || {
                for _ in 0..10_000 {
                    black_box(trap::previous_instruction(map, &mut cache, target));
                }
                10_000
            },
            9,
        ),
    ));
    let mut ucache = unwind::new_cache();
    let mut frames = Box::new([0u64; unwind::MAX_FRAMES]);
    let mut attr: libc::pthread_attr_t = unsafe { std::mem::zeroed() };
    let stack = unsafe {
        libc::pthread_getattr_np(libc::pthread_self(), &mut attr);
        let (mut a, mut s) = (std::ptr::null_mut(), 0usize);
        libc::pthread_attr_getstack(&attr, &mut a, &mut s);
        (a as u64, a as u64 + s as u64)
    };
    // A context of realistic depth: DEPTH nested calls below main.
    let mut depth = 0;
    let mut unwind_us = 0.0;
    at_depth(DEPTH, &mut |regs: &Regs| {
        unwind_us = median_us(
            || {
                for _ in 0..1000 {
                    depth = unwind::walk(map, &mut ucache, regs, regs.rip, stack, &mut frames);
                }
                1000
            },
            9,
        );
    });
    rows.push(("handler: unwind the calling context (framehop)", unwind_us));
    let mut tree = Tree::with_capacity(1 << 16);
    rows.push((
        "handler: insert the context in the tree",
        median_us(
            || {
                for _ in 0..10_000 {
                    black_box(tree.insert(&frames[..depth]));
                }
                10_000
            },
            9,
        ),
    ));
    let mut buf = [0u8; 32];
    rows.push((
        "handler: read watched bytes (process_vm_readv)",
        median_us(
            || {
                for _ in 0..1000 {
                    mem::read_own(base, &mut buf);
                }
                1000
            },
            9,
        ),
    ));

    println!("witch engine paths, median µs per operation ({} frames unwound)\n", depth);
    if let Some((off, Some(size))) = func {
        println!("(precise PC, cold: a PC {off} bytes into a {size}-byte function)\n");
    }
    println!("| path | µs |");
    println!("|---|---:|");
    for (name, us) in rows {
        println!("| {name} | {us:.2} |");
    }
}
