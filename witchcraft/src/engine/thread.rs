//! One thread's engine state, and its life: set up, sample, stop.
//!
//! The state is a handful of parts, each with one job: the sampler that
//! interrupts the thread, the watchpoints, the clock that tells the
//! program's time from the engine's, the record (contexts, pairs, counters)
//! that becomes the profile, and the scratch space the handlers decode and
//! unwind in. Everything is reserved in [`ThreadState::new`]: the handlers
//! never allocate.

use super::burst::Burst;
use super::clock::Clock;
use super::sampler::Sampler;
use super::watch::Watchpoints;
use super::window::Window;
use super::{Engine, Event};
use crate::context::Tree;
use crate::objects::{Objects, OBJECT_ENTRIES};
use crate::pair::{ClusterSums, Pairs};
use crate::profile::{self, Counters};
use crate::sys::task;
use crate::unwind::{self, MAX_FRAMES};
use crate::x86::decode::Analyzer;
use crate::x86::precise_pc::PrecisePcCache;
use std::sync::atomic::{AtomicBool, Ordering};

/// The most calling contexts one thread's tree holds (40 bytes each, with
/// 8 bytes of index), and the most pairs of its table (120 bytes each,
/// with 16 of index). With the data-object table, the precise-PC cache and
/// the code cache (mapped at the thread's first window), they make the
/// address space a thread reserves, [`ThreadState::reserved_bytes_each`]
/// (docs/OVERHEAD.md gives the figure), of which only what the thread fills
/// becomes memory. Past them, samples and traps
/// are counted as overflow (`counters.tree_overflow`, `pair_overflow`).
pub const TREE_NODES: usize = 1 << 16;
pub const PAIRS: usize = 1 << 13;

/// What becomes this thread's part of the profile.
pub struct Record {
    pub tree: Tree,
    pub pairs: Pairs,
    /// The same credits by data object.
    pub objects: Objects,
    pub counters: Counters,
    /// Samples in a row that went unmonitored.
    pub blind: u64,
    /// The current cluster: the sampler interrupts so far. Traps credited
    /// between two interrupts form one cluster ([`profile::Clustered`]).
    pub cluster: u64,
    /// All of this thread's credits, per cluster.
    pub clusters: ClusterSums,
}

/// Where the handlers decode and unwind (preallocated).
pub struct Scratch {
    pub analyzer: Analyzer,
    pub unwind: Box<unwind::Cache>,
    pub pc: PrecisePcCache,
    pub frames: Box<[u64; MAX_FRAMES]>,
}

/// Where the thread lives: its stacks and segment bases.
#[derive(Clone, Copy, Debug, Default)]
pub struct Place {
    pub stack: (u64, u64),
    /// The alternate signal stack the handlers run on (the agent owns it;
    /// the engine only keeps samples off it).
    pub alt_stack: (u64, u64),
    pub fs_base: u64,
    pub gs_base: u64,
}

impl Place {
    /// The calling thread's place, given its stack and alternate stack:
    /// its segment bases are read now. Only system calls, so a signal
    /// handler may call it.
    pub fn here(stack: (u64, u64), alt_stack: (u64, u64)) -> Place {
        const ARCH_GET_FS: i32 = 0x1003;
        const ARCH_GET_GS: i32 = 0x1004;
        Place { stack, alt_stack, fs_base: arch_prctl_get(ARCH_GET_FS), gs_base: arch_prctl_get(ARCH_GET_GS) }
    }
}

pub struct ThreadState {
    pub tid: i32,
    /// Cleared when the thread ends or the process stops profiling.
    pub active: AtomicBool,
    pub in_handler: AtomicBool,
    pub sampler: Sampler,
    pub watch: Watchpoints,
    pub clock: Clock,
    pub burst: Burst,
    /// Bursts run as windows from the code cache.
    pub window: Window,
    pub record: Record,
    pub scratch: Scratch,
    pub place: Place,
}

/// The calling thread's stack, from the thread library (not for signal
/// handlers: it may allocate).
pub fn thread_stack() -> (u64, u64) {
    // SAFETY: pthread_getattr_np fills `attr`, which is destroyed after use.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return (0, 0);
        }
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        (addr as u64, addr as u64 + size as u64)
    }
}

fn arch_prctl_get(code: i32) -> u64 {
    let mut v: u64 = 0;
    // SAFETY: ARCH_GET_FS/GS write one u64.
    unsafe { libc::syscall(libc::SYS_arch_prctl, code, &mut v as *mut u64) };
    v
}

impl ThreadState {
    /// A thread's state, its tables reserved at their largest, or None if
    /// the address space for them cannot be had (the thread is then not
    /// profiled; the program goes on). It may be made on another thread
    /// than the one it will profile (`open_events` and `start` say which).
    pub fn try_new(engine: &Engine) -> Option<Box<ThreadState>> {
        let tree = Tree::try_with_capacity(TREE_NODES)?;
        let pairs = Pairs::try_with_capacity(PAIRS)?;
        let objects = Objects::try_with_capacity(OBJECT_ENTRIES)?;
        let pc = PrecisePcCache::try_new()?;
        Some(Self::with_tables(engine, tree, pairs, objects, pc))
    }

    /// As [`ThreadState::try_new`], but without the address space for its
    /// tables it still makes a state, whose tables hold one context and one
    /// pair (the rest counted as overflow).
    pub fn new(engine: &Engine) -> Box<ThreadState> {
        Self::try_new(engine).unwrap_or_else(|| {
            Self::with_tables(engine, Tree::with_capacity(1), Pairs::with_capacity(1), Objects::none(), PrecisePcCache::default())
        })
    }

    /// The address space the state's tables reserve, in bytes.
    pub fn reserved_bytes(&self) -> usize {
        self.record.tree.reserved_bytes()
            + self.record.pairs.reserved_bytes()
            + self.record.objects.reserved_bytes()
            + PrecisePcCache::RESERVED_BYTES
    }

    /// What [`ThreadState::try_new`] reserves, and the code cache the
    /// thread maps at its first window, in bytes.
    pub fn reserved_bytes_each() -> usize {
        let index = |cap: usize| crate::context::max_slots(cap) * std::mem::size_of::<u32>();
        TREE_NODES * std::mem::size_of::<crate::context::Node>()
            + index(TREE_NODES)
            + (PAIRS + 1) * std::mem::size_of::<crate::pair::PairEntry>()
            + index(PAIRS + 1)
            + Objects::reserved_bytes_for(OBJECT_ENTRIES)
            + PrecisePcCache::RESERVED_BYTES
            + super::cache::CACHE_BYTES
    }

    fn with_tables(engine: &Engine, tree: Tree, pairs: Pairs, objects: Objects, pc: PrecisePcCache) -> Box<ThreadState> {
        // Each state its own stream of draws, also when one thread makes
        // them all (with a fixed seed too).
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = MADE.fetch_add(1, Ordering::Relaxed).wrapping_add(1).wrapping_mul(0xD1B5_4A32_D192_ED03);
        let seed = engine.config.seed.unwrap_or_else(task::monotonic_ns) ^ (task::gettid() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ n;
        Box::new(ThreadState {
            tid: task::gettid(),
            active: AtomicBool::new(false),
            in_handler: AtomicBool::new(false),
            sampler: Sampler::None,
            watch: Watchpoints::new(engine, seed),
            clock: Clock::new(engine.trap_cost_ns, engine.step_cost_ns),
            burst: Burst::new(seed, engine),
            window: Window::new(seed, engine.config.record_fd),
            record: Record { tree, pairs, objects, counters: Counters::default(), blind: 0, cluster: 0, clusters: ClusterSums::default() },
            scratch: Scratch { analyzer: Analyzer::new(), unwind: unwind::new_cache(), pc, frames: Box::new([0; MAX_FRAMES]) },
            place: Place::default(),
        })
    }

    /// Set up the calling thread, which lives at `place`: debug registers
    /// and sampler, started. Outside any signal handler.
    pub fn start(&mut self, engine: &Engine, place: Place) -> Result<(), String> {
        self.place = place;
        self.open_events(engine, 0)?;
        self.go(engine);
        Ok(())
    }

    /// Open the debug-register slots and the sampler (stopped) for thread
    /// `tid` of this process (0: the calling thread), signalling that thread.
    pub fn open_events(&mut self, engine: &Engine, tid: i32) -> Result<(), String> {
        let target = if tid == 0 { task::gettid() } else { tid };
        self.tid = target;
        // Whole-run windows (recording, counting) come back into the cache
        // after native code at a breakpoint: it takes one debug register
        // of those the watchpoints would (they keep at least one).
        let whole_run = engine.burst.is_some_and(|b| b.counts_accesses());
        self.watch.open(engine, target, tid, usize::from(whole_run))?;
        if whole_run {
            self.window.resume.open(engine.sigtrap, engine.modify, target, tid);
        }
        self.sampler = Sampler::open(&engine.sampler, engine.period, target, tid)?;
        Ok(())
    }

    /// Start sampling (async-signal-safe).
    pub fn go(&mut self, engine: &Engine) {
        self.active.store(true, Ordering::Release);
        self.resume_sampler(engine);
    }

    /// Whether this thread has a sampler to pause or resume.
    pub fn has_sampler(&self) -> bool {
        self.sampler.is_some()
    }

    /// Stop the sampler's interrupts, keeping its kernel object.
    pub fn pause_sampler(&mut self) {
        self.sampler.pause();
    }

    pub fn resume_sampler(&mut self, engine: &Engine) {
        self.sampler.resume(engine.period);
    }

    /// Stop sampling and release the kernel resources (thread exit, exec, detach).
    pub fn stop(&mut self) {
        self.active.store(false, Ordering::Release);
        // The exact mode: the thread's last records go before it does.
        self.window.records_send();
        self.window.resume.close();
        self.sampler.pause();
        self.watch.close();
        self.sampler.close();
    }

    /// Forget what the parent gathered (fork child) and drop its kernel
    /// resources without touching the parent's events.
    pub fn reset_after_fork(&mut self) {
        self.sampler.close_after_fork();
        self.watch.reset();
        self.record.tree.clear();
        self.record.pairs.clear();
        self.record.objects.clear();
        self.record.counters = Counters::default();
        self.record.blind = 0;
        self.record.clusters = ClusterSums::default();
        self.clock.reset();
        self.burst.reset();
        self.window.reset();
        self.window.resume.close();
        self.active.store(false, Ordering::Release);
    }

    /// Debug registers this thread holds.
    pub fn debug_registers_held(&self) -> usize {
        self.watch.held()
    }

    /// Is this address the engine's own (this state, the alternate stack,
    /// the parking word)? Samples there are skipped.
    pub(crate) fn is_engine_memory(&self, addr: u64) -> bool {
        let inside = |r: (u64, u64)| addr >= r.0 && addr < r.1;
        let me = self as *const Self as u64;
        inside(self.place.alt_stack)
            || inside((me, me + std::mem::size_of::<Self>() as u64))
            || addr == self.watch.parking_addr()
            || self.window.cache.contains(addr)
    }

    /// Handle one of our signals (see [`super::classify`]) on this thread:
    /// the sample or trap path, with the time accounting around it.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub unsafe fn handle(&mut self, engine: &Engine, event: Event, uc: *mut libc::ucontext_t) {
        if !self.active.load(Ordering::Acquire) || event == Event::Stale {
            return;
        }
        self.in_handler.store(true, Ordering::Release);
        if event == Event::Step {
            // No clock system call per step: the handler is timed with the
            // cycle counter and the round trip is the clock's estimate,
            // which the burst's last step corrects with one clock read.
            let c0 = task::cycles();
            let first = self.burst.first_step();
            if let Some(map) = crate::modules::current() {
                // SAFETY: forwarded from the caller.
                unsafe { self.on_step(engine, map, uc) };
                if !self.burst.active && self.window.phase == super::window::Phase::Step {
                    // A window's pick was stepped: back into the cache.
                    // SAFETY: forwarded from the caller.
                    unsafe { self.resume_window(engine, map, uc) };
                }
            } else if self.window.active() {
                // SAFETY: forwarded from the caller.
                unsafe { self.leave_cache(uc) };
            }
            // SAFETY: forwarded from the caller.
            let rip = unsafe { (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] as u64 };
            self.clock.set_in_cache(self.window.cache.is_code(rip));
            // The burst's last step reads the clock once, to time the burst.
            let ended = !self.burst.active;
            let now = if ended { task::thread_cpu_ns() } else { 0 };
            let handler = (task::cycles().wrapping_sub(c0) as f64 * engine.ns_per_cycle) as u64;
            let cost = self.clock.step(first, handler);
            self.burst.budget.note_step(cost);
            // The burst's whole account, corrected to what it measured.
            let fix = if ended { self.clock.burst_ended(now) } else { 0 };
            let cost = (cost as i64).saturating_add(fix);
            let counters = &mut self.record.counters;
            counters.engine_ns = counters.engine_ns.saturating_add_signed(cost);
            counters.step_ns = counters.step_ns.saturating_add_signed(cost);
            self.in_handler.store(false, Ordering::Release);
            return;
        }
        let entry = task::thread_cpu_ns();
        // The steps since the last clock read, bounded by the CPU time they took.
        let fix = self.clock.settle_steps(entry);
        let counters = &mut self.record.counters;
        counters.engine_ns = counters.engine_ns.saturating_add_signed(fix);
        counters.step_ns = counters.step_ns.saturating_add_signed(fix);
        let cached = self.clock.enter(entry);
        if cached > 0 {
            let counters = &mut self.record.counters;
            counters.engine_ns += cached;
            counters.cache_ns += cached;
        }
        let cost = match event {
            Event::Sample => {
                // SAFETY: forwarded from the caller.
                unsafe { self.on_sample(engine, uc) };
                let cost = self.clock.leave(false, engine.signal_cost_ns, entry, task::thread_cpu_ns());
                self.record.counters.tick_ns += cost;
                cost
            }
            Event::Trap { slot, flags } => {
                // SAFETY: forwarded from the caller.
                unsafe { self.on_trap(engine, slot, uc, flags) };
                let cost = self.clock.leave(true, engine.signal_cost_ns, entry, task::thread_cpu_ns());
                self.record.counters.trap_ns += cost;
                cost
            }
            Event::CacheExit => {
                match crate::modules::current() {
                    // SAFETY: forwarded from the caller.
                    Some(map) => unsafe { self.on_cache_exit(engine, map, uc) },
                    // SAFETY: forwarded from the caller.
                    None => unsafe { self.leave_cache(uc) },
                }
                let cost = self.clock.leave(true, engine.signal_cost_ns, entry, task::thread_cpu_ns());
                self.record.counters.exit_ns += cost;
                cost
            }
            Event::Resume => {
                if let Some(map) = crate::modules::current() {
                    // SAFETY: forwarded from the caller.
                    unsafe { self.on_resume(engine, map, uc) };
                }
                let cost = self.clock.leave(true, engine.signal_cost_ns, entry, task::thread_cpu_ns());
                self.record.counters.exit_ns += cost;
                cost
            }
            Event::Step | Event::Stale => unreachable!("handled above"),
        };
        // SAFETY: forwarded from the caller.
        let rip = unsafe { (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] as u64 };
        self.clock.set_in_cache(self.window.cache.is_code(rip));
        self.record.counters.engine_ns += cost;
        self.in_handler.store(false, Ordering::Release);
    }

    /// This thread's part of the profile.
    pub fn to_profile(&self) -> profile::Thread {
        let mut counters = self.record.counters.clone();
        let w = &self.window.stats;
        counters.windows = w.windows;
        counters.window_instructions = w.instructions;
        counters.window_accesses = w.accesses;
        counters.window_picks = w.picks;
        counters.windows_cut = w.cut;
        counters.window_shortest = w.shortest;
        counters.window_longest = w.longest;
        counters.cache_blocks = self.window.cache.stats.blocks;
        counters.cache_flushes = self.window.cache.stats.flushes;
        counters.cache_exits = self.window.cache.stats.exits;
        counters.cache_lookups = self.window.cache.stats.lookups;
        counters.window_bridges = w.bridges;
        counters.window_resumes = w.resumes;
        counters.window_gaps = w.gaps;
        counters.object_overflow = self.record.objects.overflow;
        let mut t =
            crate::pair::thread_profile(self.tid as u32, &self.record.tree, &self.record.pairs, self.record.clusters.sums, counters);
        t.objects = self.record.objects.to_profile();
        t
    }
}
