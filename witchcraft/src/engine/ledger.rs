//! One thread's books, and the bookkeeping every path keeps in them.
//!
//! The sample path, the burst path and the trap path ([`super::sample`],
//! [`super::burst`], [`super::trap`]) differ in how they find an access
//! and the next access to its bytes; what they then do is the same, and is
//! written here once: count a sample in its calling context (µ), claim a
//! debug register for it (the replacement policy), snapshot the watched
//! value and arm the register, judge the next access, attribute the
//! verdict to ⟨C_watch, C_trap⟩ (Witch §4.4.2), free the register, and
//! find the calling context of an instruction. The ledger owns what these
//! touch, all reserved up front (the handlers never allocate): the
//! watchpoints, the record that becomes the thread's profile (contexts,
//! pairs, data objects, counters), the scratch space the handlers decode
//! and unwind in, and where the thread lives.

use super::place::Place;
use super::process::Engine;
use super::watch::{snapshot, SelfTrap, Slot, Watchpoints};
use crate::context::Tree;
use crate::craft::{Verdict, Watched, SNAPSHOT};
use crate::modules::{self, ProcessMap};
use crate::objects::{FoundObject, ObjectTable, OBJECT_ENTRIES};
use crate::pair::{ClusterSums, Pairs};
use crate::profile::{self, Counters};
use crate::sys::mem;
use crate::unwind::{self, MAX_FRAMES};
use crate::x86::decode::{Access, Analyzer, Decoded, Regs};
use crate::x86::precise_pc::{self, PrecisePcCache, TrapAccess};

/// The most calling contexts one thread's tree holds (40 bytes each, with
/// 8 bytes of index), and the most pairs of its table (120 bytes each,
/// with 16 of index). With the data-object table, the precise-PC cache and
/// the code cache (mapped at the thread's first window), they make the
/// address space a thread reserves,
/// [`ThreadState::reserved_bytes_each`](super::thread::ThreadState::reserved_bytes_each)
/// (docs/OVERHEAD.md gives the figure), of which only what the thread fills
/// becomes memory. Past them, samples and traps are counted as overflow
/// (`counters.tree_overflow`, `pair_overflow`).
pub const TREE_NODES: usize = 1 << 16;
pub const PAIRS: usize = 1 << 13;

/// Ignored traps a watchpoint may take before it is given up. LoadCraft
/// ignores stores; a location stored to often and loaded rarely would
/// otherwise trap (a kernel round trip each; docs/OVERHEAD.md) on every
/// store until its next load.
pub(super) const MAX_IGNORED: u32 = 32;

/// One thread's books.
pub struct Ledger {
    tree: Tree,
    pairs: Pairs,
    /// The same credits by data object.
    objects: ObjectTable,
    /// The events each path counts (the profile's counters): a tally, each
    /// field its own count, with no invariant between them.
    pub(super) counters: Counters,
    /// Samples in a row that went unmonitored.
    blind: u64,
    /// The current cluster: the sampler interrupts so far. Traps credited
    /// between two interrupts form one cluster ([`profile::Clustered`]).
    cluster: u64,
    /// All of this thread's credits, per cluster.
    clusters: ClusterSums,
    watch: Watchpoints,
    analyzer: Analyzer,
    unwind: Box<unwind::Cache>,
    pc: PrecisePcCache,
    frames: Box<[u64; MAX_FRAMES]>,
    place: Place,
}

/// The tables a ledger keeps its record in, reserved.
pub(super) struct Tables {
    tree: Tree,
    pairs: Pairs,
    objects: ObjectTable,
    pc: PrecisePcCache,
}

impl Tables {
    /// The tables at their largest, or None if the address space for them
    /// cannot be had.
    pub(super) fn try_reserve() -> Option<Tables> {
        let tree = Tree::try_with_capacity(TREE_NODES)?;
        let pairs = Pairs::try_with_capacity(PAIRS)?;
        let objects = ObjectTable::try_with_capacity(OBJECT_ENTRIES)?;
        let pc = PrecisePcCache::try_new()?;
        Some(Tables { tree, pairs, objects, pc })
    }

    /// Tables that hold one context and one pair (the rest counted as
    /// overflow): for a thread the address space could not be had for.
    pub(super) fn minimal() -> Tables {
        Tables { tree: Tree::with_capacity(1), pairs: Pairs::with_capacity(1), objects: ObjectTable::none(), pc: PrecisePcCache::default() }
    }
}

impl Ledger {
    /// The books of a thread, in `tables`; `seed` seeds the replacement
    /// policy's draws.
    pub(super) fn new(engine: &Engine, seed: u64, tables: Tables) -> Ledger {
        let Tables { tree, pairs, objects, pc } = tables;
        Ledger {
            tree,
            pairs,
            objects,
            counters: Counters::default(),
            blind: 0,
            cluster: 0,
            clusters: ClusterSums::default(),
            watch: Watchpoints::new(engine, seed),
            analyzer: Analyzer::new(),
            unwind: unwind::new_cache(),
            pc,
            frames: Box::new([0; MAX_FRAMES]),
            place: Place::default(),
        }
    }

    /// The address space the tables reserve, in bytes.
    pub(super) fn reserved_bytes(&self) -> usize {
        self.tree.reserved_bytes() + self.pairs.reserved_bytes() + self.objects.reserved_bytes() + PrecisePcCache::RESERVED_BYTES
    }

    /// What [`Tables::try_reserve`] reserves, in bytes.
    pub(super) fn reserved_bytes_each() -> usize {
        let index = |cap: usize| crate::context::max_slots(cap) * std::mem::size_of::<u32>();
        TREE_NODES * std::mem::size_of::<crate::context::LiveNode>()
            + index(TREE_NODES)
            + (PAIRS + 1) * std::mem::size_of::<crate::pair::PairEntry>()
            + index(PAIRS + 1)
            + ObjectTable::reserved_bytes_for(OBJECT_ENTRIES)
            + PrecisePcCache::RESERVED_BYTES
    }

    /// Forget what the parent gathered (a fork child), and its
    /// watchpoints, keeping nothing open.
    pub(super) fn reset_after_fork(&mut self) {
        self.watch.reset();
        self.tree.clear();
        self.pairs.clear();
        self.objects.clear();
        self.counters = Counters::default();
        self.blind = 0;
        self.clusters = ClusterSums::default();
    }

    pub(super) fn place(&self) -> Place {
        self.place
    }

    pub(super) fn set_place(&mut self, place: Place) {
        self.place = place;
    }

    /// The thread's registers in the kernel's context `uc`.
    ///
    /// # Safety
    /// `uc` must be the context the kernel passed to the signal handler.
    pub(super) unsafe fn regs(&self, uc: *const libc::ucontext_t) -> Regs {
        // SAFETY: forwarded from the caller.
        unsafe { Regs::from_ucontext(uc, self.place.fs_base, self.place.gs_base) }
    }

    /// The program's registers as the cache's link stub saved them
    /// (`gpr` in hardware order, `flags`), at `rip`.
    pub(super) fn regs_at(&self, gpr: [u64; 16], rip: u64, flags: u64) -> Regs {
        Regs { gpr, rip, fs_base: self.place.fs_base, gs_base: self.place.gs_base, df: flags & (1 << 10) != 0 }
    }

    pub(super) fn watch(&self) -> &Watchpoints {
        &self.watch
    }

    /// Take the thread's debug registers ([`Watchpoints::open`]).
    pub(super) fn open_watchpoints(&mut self, engine: &Engine, tid: i32, open_tid: i32, spare: usize) -> Result<(), String> {
        self.watch.open(engine, tid, open_tid, spare)
    }

    /// Give the debug registers back.
    pub(super) fn close_watchpoints(&mut self) {
        self.watch.close();
    }

    /// A sampler interrupt: one more, and a new cluster.
    pub(super) fn note_interrupt(&mut self) {
        self.counters.interrupts += 1;
        self.next_cluster();
    }

    /// The traps credited from now on form a new cluster (see
    /// [`profile::Clustered`]).
    pub(super) fn next_cluster(&mut self) {
        self.cluster += 1;
    }

    /// The calling context of the instruction at `pc`, the thread's
    /// registers being `regs`: unwound, and found or added in the tree.
    pub(super) fn context(&mut self, map: &ProcessMap, regs: &Regs, pc: u64) -> u32 {
        let n = unwind::walk(map, &mut self.unwind, regs, pc, self.place.stack, &mut self.frames);
        self.tree.insert(&self.frames[..n])
    }

    /// A sample of weight `weight` in context `ctx`: µ(C) grows by it.
    pub(super) fn count_sample(&mut self, ctx: u32, weight: f64) {
        self.counters.samples += 1;
        let node = self.tree.node(ctx);
        node.samples += 1;
        node.mu += weight; // µ(C)
    }

    /// A sample of access `a` in context `ctx`, whose next access a debug
    /// register is to watch (if the replacement policy gives it one): the
    /// craft's piece of it, its value now, armed. `own`: its own access is
    /// still to run, and traps first.
    pub(super) fn watch_sample(&mut self, engine: &Engine, a: Access, ctx: u32, own: Option<SelfTrap>) {
        let Some(i) = self.claim() else { return };
        let (waddr, wlen) = engine.craft.piece(&a, self.watch.random());
        let mut watched = Watched::with_piece(a, (waddr, wlen));
        if engine.craft.needs_value() {
            snapshot(&mut watched);
        }
        self.arm(i, waddr, wlen, ctx, watched, own);
    }

    /// A debug register for a new sample, as the replacement policy
    /// decides (Witch §4.3): None leaves the sample unwatched (a blind
    /// spot); a slot still armed is released from its old context.
    pub(super) fn claim(&mut self) -> Option<usize> {
        let Some(i) = self.watch.choose() else {
            self.counters.dropped += 1;
            self.blind += 1;
            self.counters.longest_blind_spot = self.counters.longest_blind_spot.max(self.blind);
            return None;
        };
        let old = self.watch.slot(i);
        if old.armed {
            let node = self.tree.node(old.ctx);
            node.armed = node.armed.saturating_sub(1);
        }
        Some(i)
    }

    /// Arm slot `i` (from [`Self::claim`]) on [waddr, waddr+wlen) for the
    /// sample of context `ctx`.
    pub(super) fn arm(&mut self, i: usize, waddr: u64, wlen: u64, ctx: u32, watched: Watched, own: Option<SelfTrap>) {
        let in_place = self.watch.arms_in_place(i);
        if !self.watch.arm(i, waddr, wlen, ctx, watched, own) {
            self.counters.arm_failures += 1;
            return;
        }
        self.counters.rearms_in_place += in_place as u64;
        self.tree.node(ctx).armed += 1;
        self.counters.armed += 1;
        self.blind = 0;
    }

    /// Slot `i`, if it watches a sample now.
    pub(super) fn armed(&self, i: usize) -> Option<Slot> {
        self.watch.armed(i)
    }

    /// Slot `i`'s sampled instruction has made its own access (see
    /// [`SelfTrap`]): its next trap is the next access's.
    pub(super) fn self_trap_passed(&mut self, i: usize) {
        self.watch.self_trap_passed(i);
    }

    /// The store slot `i` watches has run: its value is what it left.
    pub(super) fn snapshot_after_store(&mut self, i: usize) {
        self.watch.snapshot_after_store(i);
    }

    /// Hold slot `i`'s breakpoint off while a single step runs the access
    /// it would trap on (the burst judges that access itself).
    pub(super) fn hold_off(&self, i: usize) {
        self.watch.hold_off(i);
    }

    /// Let slot `i`'s breakpoint fire again.
    pub(super) fn hold_on(&self, i: usize) {
        self.watch.hold_on(i);
    }

    /// The craft ignored a trap on slot `i` (LoadCraft: a store): keep
    /// watching, up to [`MAX_IGNORED`] times in a row. False if given up
    /// (the slot is then free).
    pub(super) fn ignore(&mut self, i: usize) -> bool {
        self.counters.ignored_traps += 1;
        if self.watch.note_ignored(i) >= MAX_IGNORED {
            self.counters.abandoned += 1;
            self.free(i);
            return false;
        }
        true
    }

    /// The next access to slot `i`'s bytes, made in context `trap_ctx`,
    /// was judged `verdict` (not ignored): attributed, and the slot freed.
    pub(super) fn credit(&mut self, engine: &Engine, i: usize, trap_ctx: u32, verdict: Verdict) {
        let s = self.watch.slot(i);
        self.attribute(engine, s.ctx, trap_ctx, verdict, false, s.addr);
        self.free(i);
    }

    /// Attribute a trap's verdict to ⟨C_watch, C_trap⟩. Proportional
    /// attribution (Witch §4.4.2): this trap stands for the samples of
    /// C_watch not yet accounted for, shared among the watchpoints
    /// currently armed from C_watch.
    ///
    /// `unarmed`: the verdict's own sample holds no debug register (a
    /// burst judged it in software), so it shares with the armed ones as
    /// one more. Left out, a pick judged within its burst took the weight
    /// of every armed sample of its context as well, so the fate that
    /// comes sooner (a store overwritten by the next instruction rather
    /// than read a few later) was over-counted: 78% dead where each
    /// access's count says 75% (`tests/programs/vector_index.c`).
    ///
    /// `addr`: the watched address; the credit goes to its data object too
    /// ([`crate::objects`]).
    pub(super) fn attribute(&mut self, engine: &Engine, watch_ctx: u32, trap_ctx: u32, verdict: Verdict, unarmed: bool, addr: u64) {
        self.counters.traps += 1;
        let delta = self.tree.node(watch_ctx).claim(unarmed);
        let scale = delta * engine.unit_scale();
        if let Some(p) = self.pairs.get(watch_ctx, trap_ctx) {
            let (waste, used) = p.credit(verdict, scale);
            p.cluster.add(self.cluster, waste, used);
            self.clusters.add(self.cluster, waste, used);
            let object = FoundObject::of(addr, self.place.stack);
            self.objects.credit(watch_ctx, trap_ctx, &object, verdict, scale, self.cluster);
        }
    }

    /// Free slot `i` for the next sample.
    pub(super) fn free(&mut self, i: usize) {
        let node = self.tree.node(self.watch.slot(i).ctx);
        node.armed = node.armed.saturating_sub(1);
        self.watch.free(i);
    }

    /// Decode the instruction at `pc` with registers `regs` (`after`: as
    /// they are after it ran).
    pub(super) fn decode(&mut self, map: &ProcessMap, pc: u64, regs: &Regs, after: bool) -> Option<Decoded> {
        let mut buf = [0u8; 16];
        let bytes = code_bytes(map, pc, &mut buf)?;
        self.analyzer.decode(bytes, pc, regs, after)
    }

    /// Decode `bytes`, the instruction at `pc`, as [`Ledger::decode`].
    pub(super) fn decode_bytes(&mut self, bytes: &[u8], pc: u64, regs: &Regs, after: bool) -> Option<Decoded> {
        self.analyzer.decode(bytes, pc, regs, after)
    }

    /// The instruction that ends at `end`, and whether `end` is a branch
    /// target ([`precise_pc::previous_instruction`]).
    pub(super) fn previous_instruction(&mut self, map: &ProcessMap, end: u64) -> (Option<u64>, bool) {
        precise_pc::previous_instruction(map, &mut self.pc, end)
    }

    /// The instruction and access a watchpoint trap on [addr, addr+len)
    /// with registers `regs` stands for ([`precise_pc::recover`]).
    pub(super) fn recover(&mut self, map: &ProcessMap, regs: &Regs, addr: u64, len: u64) -> Option<TrapAccess> {
        precise_pc::recover(map, &mut self.pc, &mut self.analyzer, regs, addr, len, self.place.stack)
    }

    /// This thread's part of the profile, with `counters` (the ledger's,
    /// completed by the caller).
    pub(super) fn to_profile(&self, tid: i32, mut counters: Counters) -> profile::Thread {
        counters.object_overflow = self.objects.overflow;
        let mut t = crate::pair::thread_profile(tid as u32, &self.tree, &self.pairs, self.clusters.sums, counters);
        t.objects = self.objects.to_profile();
        t
    }
}

/// The craft's verdict on `trap` touching the bytes of `w`, with those
/// bytes as they are now; None if a value craft cannot read them (each
/// path says what that means for it).
pub(super) fn judge(engine: &Engine, w: &Watched, trap: &Access) -> Option<Verdict> {
    let mut now = [0u8; SNAPSHOT];
    if engine.craft.needs_value() {
        let n = w.value_len;
        if n > 0 && !mem::read_own(w.access.addr, &mut now[..n]) {
            return None;
        }
    }
    Some(engine.craft.judge(w, trap, &now))
}

/// Instruction bytes at `pc`: directly inside a known module, otherwise via
/// a fault-proof kernel copy (JIT code, vDSO).
pub(super) fn code_bytes<'a>(map: &ProcessMap, pc: u64, buf: &'a mut [u8; 16]) -> Option<&'a [u8]> {
    let module = map.module(pc);
    if let Some(m) = module.filter(|_| !modules::checked_reads()) {
        let n = ((m.end - pc) as usize).min(16);
        // SAFETY: [pc, pc+n) lies inside a module mapped in this process.
        unsafe { std::ptr::copy_nonoverlapping(pc as *const u8, buf.as_mut_ptr(), n) };
        return Some(&buf[..n]);
    }
    if module.is_none() {
        modules::STALE.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    for n in [16usize, 8, 4] {
        if mem::read_own(pc, &mut buf[..n]) {
            return Some(&buf[..n]);
        }
    }
    None
}
