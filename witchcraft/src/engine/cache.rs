//! One thread's code cache: the memory its copies of the program's blocks
//! live in, the tables that find them, and the way back from a copy's
//! address to the program's own instruction.
//!
//! The cache is one anonymous mapping (or, in a process that forbids
//! memory both writable and executable, the same pages mapped twice: see
//! `mapping.rs`), reserved the first time the thread
//! begins a window (a system call, so a signal handler may make it) and
//! touched only as it fills, so a thread that never runs a window costs
//! nothing and one that does costs what its hot code takes:
//!
//! ```text
//!   data page   slots the copies address RIP-relatively (translate::Data)
//!   dispatch    native → copy, direct-mapped, read by the dispatch stub
//!   index       native → fast and slow copies (open addressing), the handlers'
//!   records     every copy in address order: its native block and variant
//!   stubs       the dispatch stub, the link stub; room for one instruction
//!               alone (a partial `rep`, a picked instruction); scratch
//!   code        the copies, one after another
//!   guard       one page, no access
//!   link stack  the stack the link stub switches to (see super::link)
//! ```
//!
//! Copies are kept across windows while the module map they were made
//! against stays current: a `dlopen` or `dlclose` (a new map) empties the
//! cache, and so does running out of room. Only code of the program's
//! modules is translated, never anonymous memory (a JIT's code) or the
//! agent's own. The cache belongs to its thread alone: only that thread's
//! handlers write it, and only that thread runs its copies.

use crate::modules::{self, ProcessMap};
use crate::sys::mem;
use crate::x86::translate::{
    self, Block, Counted, Data, DataAddrs, Env, Exit, Host, NativeCalls, Point, TranslateRequest, Translator, Variant, EXIT_STUB_LEN,
};

mod alone;
mod layout;
mod mapping;
mod native_calls;
use layout::{Layout, DATA_AT, DISPATCH_AT, DISPATCH_ENTRIES, INDEX_AT};

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct IndexEntry {
    native: u64,
    fast: u64,
    slow: u64,
}

/// Where one translated copy lies in the cache: its start, the native
/// address it copies, its length, and what it is ([`COPY_FAST`],
/// [`COPY_SLOW`], [`COPY_NATIVE_CALL`]).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CopyRecord {
    start: u64,
    native: u64,
    len: u32,
    what: u32,
}

const COPY_FAST: u32 = 0;
const COPY_SLOW: u32 = 1;
/// Not a copy: a native call of an entry the cache does not run
/// ([`translate::NativeCall`]).
const COPY_NATIVE_CALL: u32 = 2;

/// What translating costs and how full the cache got, for the profile.
#[derive(Clone, Copy, Debug, Default)]
pub struct CacheStats {
    pub blocks: u64,
    pub flushes: u64,
    /// Traps at the cache's exits, and dispatch-table misses among them.
    pub exits: u64,
    pub lookups: u64,
    /// Copies made and linked at an exit without a trap (the link stub).
    pub links: u64,
    /// CPU time in the link stub's calls into the engine (translating, in
    /// the main), part of a window's time in the cache.
    pub link_ns: u64,
    /// Picks taken through the link stub, without a trap, and the CPU time
    /// the engine took for them (part of a window's time in the cache, not
    /// of `link_ns`).
    pub picks: u64,
    pub pick_ns: u64,
    /// The kernel refused the cache's mapping, with this errno (0: it did
    /// not): EACCES where the process may not have memory both writable
    /// and executable (`prctl(PR_SET_MDWE)`, systemd's
    /// `MemoryDenyWriteExecute=yes`), ENOMEM at an address-space limit.
    pub refused: i32,
    /// Refused writable code, the cache was mapped twice instead
    /// ([`mem::map_own_twice`]).
    pub twice: bool,
}

pub struct CodeCache {
    layout: Layout,
    base: *mut u8,
    /// The mapping could not be made: never try again.
    failed: bool,
    /// 0: one mapping, writable and executable. Else the cache is mapped
    /// twice ([`mem::map_own_twice`]: a process that forbids writable
    /// code) and the engine writes it, and the copies keep their data,
    /// `view` bytes above where copies run.
    view: usize,
    code_pos: usize,
    records: usize,
    indexed: usize,
    /// The module map the copies were made against.
    map_id: usize,
    /// [`crate::modules::code_writes`] when the copies began to be made.
    code_writes: u64,
    /// The link stub's address, if the copies use it (0: every exit traps),
    /// fixed when the mapping is made.
    link: u64,
    /// The instruction whose copy alone is in the picked instruction's area.
    step_native: u64,
    /// The entries a window calls natively and goes on after (none for
    /// whole-run windows, which run the C library's allocator in the cache
    /// or come back at a breakpoint).
    calls: NativeCalls,
    translator: Translator,
    pub stats: CacheStats,
}

// SAFETY: the mapping is owned by one thread's state; the raw pointer is
// only dereferenced by that thread (its handlers), see the module docs.
unsafe impl Send for CodeCache {}

/// Reads code and answers translation's questions about the program.
struct ProgramHost<'a> {
    map: &'a ProcessMap,
    own: (u64, u64),
    calls: NativeCalls,
    index: *const IndexEntry,
    entries: usize,
}

impl Host for ProgramHost<'_> {
    fn code(&mut self, pc: u64, out: &mut [u8]) -> usize {
        // The module's code, or the vDSO's (mapped for the process's life).
        let end = match self.map.module(pc) {
            Some(m) => m.end,
            None if crate::sys::vdso::holds(pc) => crate::sys::vdso::code().1,
            None => return 0,
        };
        let n = ((end - pc) as usize).min(out.len());
        if !modules::checked_reads() {
            // SAFETY: [pc, pc+n) lies inside a module or the vDSO, mapped in this process.
            unsafe { std::ptr::copy_nonoverlapping(pc as *const u8, out.as_mut_ptr(), n) };
            return n;
        }
        // Attached: the map may describe a module unloaded since; read
        // through the kernel, which fails rather than faults.
        let mut len = n;
        while len > 0 {
            if mem::read_own(pc, &mut out[..len]) {
                return len;
            }
            len /= 2;
        }
        0
    }

    fn translatable(&self, pc: u64) -> bool {
        runs_from_cache(self.map, self.own, pc) || self.calls.find(pc).is_some()
    }

    fn resolve(&self, native: u64) -> Option<u64> {
        // SAFETY: `index` points at the cache's `entries` entries.
        let e = unsafe { find(self.index, self.entries, native) }?;
        (e.fast != 0).then_some(e.fast)
    }
}

/// May the code at `pc` run from the cache: the program's modules and the
/// vDSO (whose calls would otherwise leave a window, and whose accesses
/// `--exact=step` counts as the program's), never the agent's own code
/// (`own`) nor a restartable sequence's critical section (whose copy the
/// kernel would not restart: [`ProcessMap::critical_section`]).
/// Async-signal-safe.
pub fn runs_from_cache(map: &ProcessMap, own: (u64, u64), pc: u64) -> bool {
    let runs = match map.module(pc) {
        Some(m) => m.critical_section(pc).is_none(),
        None => crate::sys::vdso::holds(pc),
    };
    runs && !(pc >= own.0 && pc < own.1)
}

/// The index entry for `native`, if any.
///
/// # Safety
/// `index` must point at `entries` (a power of two) readable entries.
unsafe fn find(index: *const IndexEntry, entries: usize, native: u64) -> Option<IndexEntry> {
    let mut i = hash(native, entries);
    for _ in 0..entries {
        // SAFETY: i < entries.
        let e = unsafe { *index.add(i) };
        if e.native == native {
            return Some(e);
        }
        if e.native == 0 {
            return None;
        }
        i = (i + 1) & (entries - 1);
    }
    None
}

fn hash(native: u64, entries: usize) -> usize {
    (native.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - entries.trailing_zeros())) as usize
}

impl Default for CodeCache {
    fn default() -> Self {
        Self::new(false)
    }
}

impl CodeCache {
    /// Made outside signal handlers (the translator's buffers); the
    /// mapping comes later ([`CodeCache::ready`]).
    /// The bytes of the mapping a thread's cache reserves (see
    /// [`CodeCache::new`]).
    pub fn mapping_bytes(recording: bool) -> usize {
        Layout::of(recording).bytes()
    }

    /// `recording`: for a thread the exact mode records, which runs all of
    /// its code from the cache (a larger mapping, see [`Layout`]).
    pub fn new(recording: bool) -> CodeCache {
        CodeCache {
            layout: Layout::of(recording),
            base: std::ptr::null_mut(),
            failed: false,
            view: 0,
            code_pos: 0,
            records: 0,
            indexed: 0,
            map_id: 0,
            code_writes: 0,
            link: 0,
            step_native: 0,
            calls: NativeCalls::default(),
            translator: Translator::new(),
            stats: CacheStats::default(),
        }
    }

    /// Map the cache if it is not yet, and empty it if `map` is not the
    /// one its copies were made against, or the program may have rewritten
    /// module code since ([`crate::modules::protection_changed`]). False if there is no cache (the
    /// mapping failed: an address-space limit, or a system that forbids
    /// writable code). Async-signal-safe.
    pub fn ready(&mut self, map: &ProcessMap) -> bool {
        if self.base.is_null() {
            if self.failed {
                return false;
            }
            if !self.make_mapping() {
                return false;
            }
            self.map_id = map as *const ProcessMap as usize;
        }
        // A new map, or module code the program may have rewritten in
        // place (hot patching): no copy made before may run.
        let writes = crate::modules::code_writes();
        if self.map_id != map as *const ProcessMap as usize || self.code_writes != writes {
            self.flush();
            self.map_id = map as *const ProcessMap as usize;
            self.code_writes = writes;
        }
        true
    }

    /// Forget every copy. Only while no copy is under way except at an
    /// exit (all of them leave the program's registers whole).
    pub fn flush(&mut self) {
        if self.base.is_null() {
            return;
        }
        // SAFETY: the dispatch table and index are inside the mapping.
        unsafe {
            std::ptr::write_bytes(self.w(DISPATCH_AT), 0, INDEX_AT - DISPATCH_AT);
            std::ptr::write_bytes(self.w(INDEX_AT), 0, self.layout.records_at() - INDEX_AT);
        }
        self.code_pos = 0;
        self.records = 0;
        self.indexed = 0;
        self.stats.flushes += 1;
    }

    /// Where offset `off` of the cache is, for copies to run there.
    fn addr(&self, off: usize) -> u64 {
        self.base as u64 + off as u64
    }

    /// The data page.
    pub fn data(&mut self) -> &mut Data {
        // SAFETY: the data page is the mapping's first page, and a Data
        // fits in it; only this thread reads or writes it.
        unsafe { &mut *(self.w(DATA_AT) as *mut Data) }
    }

    pub fn has_mapping(&self) -> bool {
        !self.base.is_null()
    }

    /// Mapped, or not yet tried.
    pub fn usable(&self) -> bool {
        !self.failed
    }

    fn slots(&self) -> DataAddrs {
        DataAddrs::at(self.waddr(DATA_AT))
    }

    /// What the translator needs to know of this cache, for copies that
    /// count `counted`.
    fn env(&self, counted: Counted) -> Env {
        Env { slots: self.slots(), counted, dispatch: self.addr(self.layout.stubs_at()), link: self.link }
    }

    /// The program's code as the translator reads it (`own`: the agent's,
    /// never translated), with this cache's copies to link to.
    fn host<'a>(&self, map: &'a ProcessMap, own: (u64, u64)) -> ProgramHost<'a> {
        ProgramHost { map, own, calls: self.calls, index: self.index(), entries: self.layout.entries }
    }

    /// Is `addr` inside the cache's mapping (its memory is the engine's)?
    pub fn contains(&self, addr: u64) -> bool {
        !self.base.is_null() && addr >= self.base as u64 && addr < self.waddr(self.layout.bytes())
    }

    /// Is `addr` in the cache's code (copies and stubs)?
    pub fn is_code(&self, addr: u64) -> bool {
        !self.base.is_null() && addr >= self.addr(self.layout.stubs_at()) && addr < self.addr(self.layout.code_at() + self.code_pos)
    }

    fn index(&self) -> *mut IndexEntry {
        self.w(INDEX_AT) as *mut IndexEntry
    }

    fn record(&self, i: usize) -> CopyRecord {
        // SAFETY: i < RECORDS, inside the mapping.
        unsafe { *(self.w(self.layout.records_at()) as *const CopyRecord).add(i) }
    }

    /// The copy of `native` in `variant`, if made.
    pub fn lookup(&self, native: u64, variant: Variant) -> Option<u64> {
        if self.base.is_null() {
            return None;
        }
        // SAFETY: the index's INDEX_ENTRIES entries are in the mapping.
        let e = unsafe { find(self.index(), self.layout.entries, native) }?;
        let a = if variant == Variant::Fast { e.fast } else { e.slow };
        (a != 0).then_some(a)
    }

    /// The copy of `native` in `variant`, translated now if need be. On a
    /// full cache, empties it and tries once more.
    pub fn get(
        &mut self,
        map: &ProcessMap,
        own: (u64, u64),
        counted: Counted,
        native: u64,
        variant: Variant,
    ) -> Result<u64, translate::Error> {
        match self.get_kept(map, own, counted, native, variant) {
            Err(translate::Error::Full) => {
                self.flush();
                self.translate(map, own, counted, native, variant)
            }
            r => r,
        }
    }

    /// [`CodeCache::get`], but a full cache is left full (an error): the
    /// link stub's path returns into the copy that exited, which emptying
    /// the cache would drop (the exit's trap empties it instead).
    pub fn get_kept(
        &mut self,
        map: &ProcessMap,
        own: (u64, u64),
        counted: Counted,
        native: u64,
        variant: Variant,
    ) -> Result<u64, translate::Error> {
        if let Some(a) = self.lookup(native, variant) {
            return Ok(a);
        }
        self.translate(map, own, counted, native, variant)
    }

    fn translate(
        &mut self,
        map: &ProcessMap,
        own: (u64, u64),
        counted: Counted,
        native: u64,
        variant: Variant,
    ) -> Result<u64, translate::Error> {
        if self.code_pos + translate::MAX_BLOCK_BYTES > self.layout.code_bytes
            || self.records >= self.layout.entries
            || self.indexed * 2 >= self.layout.entries
        {
            return Err(translate::Error::Full);
        }
        let at = self.addr(self.layout.code_at() + self.code_pos);
        let env = self.env(counted);
        let mut host = self.host(map, own);
        // SAFETY: the code area from code_pos, MAX_BLOCK_BYTES of it free.
        let out = unsafe { std::slice::from_raw_parts_mut(self.w(self.layout.code_at() + self.code_pos), translate::MAX_BLOCK_BYTES) };
        let (len, what) = match self.calls.find(native) {
            Some(call) => (translate::emit_native_call(&env.slots, &call, at, env.dispatch, out)? as u32, COPY_NATIVE_CALL),
            None => {
                let b: Block = self.translator.translate(&mut host, &env, TranslateRequest { native, variant, at, points: false }, out)?;
                (b.len, if variant == Variant::Slow { COPY_SLOW } else { COPY_FAST })
            }
        };
        self.code_pos += (len as usize).next_multiple_of(16);
        // SAFETY: records < RECORDS (checked above).
        unsafe {
            *(self.w(self.layout.records_at()) as *mut CopyRecord).add(self.records) = CopyRecord { start: at, native, len, what };
        }
        self.records += 1;
        self.insert(native, variant, at);
        self.stats.blocks += 1;
        Ok(at)
    }

    fn insert(&mut self, native: u64, variant: Variant, copy: u64) {
        let index = self.index();
        let mut i = hash(native, self.layout.entries);
        loop {
            // SAFETY: i < INDEX_ENTRIES; the index is at most half full.
            let e = unsafe { &mut *index.add(i) };
            if e.native == 0 || e.native == native {
                if e.native == 0 {
                    self.indexed += 1;
                }
                e.native = native;
                if variant == Variant::Fast {
                    e.fast = copy;
                } else {
                    e.slow = copy;
                }
                return;
            }
            i = (i + 1) & (self.layout.entries - 1);
        }
    }

    /// Let the dispatch stub find `copy` for `native` from now on.
    pub fn dispatch_to(&mut self, native: u64, copy: u64) {
        let i = translate::dispatch_index(native, DISPATCH_ENTRIES);
        // SAFETY: i < DISPATCH_ENTRIES, inside the mapping.
        unsafe {
            let e = self.w(DISPATCH_AT + i * 16) as *mut u64;
            *e = native;
            *e.add(1) = copy;
        }
    }

    /// Aim the rel32 at `at` (in a copy) at `target`.
    pub fn patch(&mut self, at: u64, target: u64) {
        if !self.is_code(at) {
            return;
        }
        let rel = target.wrapping_sub(at + 4) as i64 as i32;
        // SAFETY: `at` is inside the code area (checked), 4 bytes of a
        // rel32 the translator emitted; this thread is in a handler, so no
        // copy runs while it changes.
        unsafe { std::ptr::write_unaligned((at + self.view as u64) as *mut i32, rel) };
    }

    /// The exit a trap at `rip` (just after an `int3`) took, if it is one
    /// of this cache's.
    pub fn exit_at(&self, rip: u64) -> Option<Exit> {
        let at = rip.checked_sub(1)?;
        if !self.is_code(at) || !self.contains(rip + 16) {
            return None;
        }
        // SAFETY: `at` and the 17 bytes after it are inside the mapping
        // (the code area is followed by at least a record's room).
        unsafe {
            if *(at as *const u8) != 0xCC {
                return None;
            }
            let mut r = [0u8; 17];
            std::ptr::copy_nonoverlapping(rip as *const u8, r.as_mut_ptr(), 17);
            Exit::read(&r)
        }
    }

    /// Where `addr`, inside a copy, stands in the program (see [`Point`]):
    /// `after` for a trap (the access just completed), else for a fault.
    pub fn point(&mut self, map: &ProcessMap, own: (u64, u64), counted: Counted, addr: u64, after: bool) -> Option<Point> {
        if let Some(p) = self.point_alone(map, own, counted, addr, after) {
            return p;
        }
        if !self.is_code(addr) || addr < self.addr(self.layout.code_at()) {
            return None;
        }
        let probe = if after { addr - 1 } else { addr };
        // The copy holding the address: the last one starting at or before it.
        let (mut lo, mut hi) = (0, self.records);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.record(mid).start <= probe {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let r = self.record(lo.checked_sub(1)?);
        if probe >= r.start + r.len as u64 {
            return None;
        }
        if r.what == COPY_NATIVE_CALL {
            // Only its loads of the program's return address stand for an
            // access of the program's (the entry's `ret`).
            let (arg, ret) = translate::return_loads(self.calls.find(r.native)?.ret);
            let at = addr.checked_sub(r.start)? as usize;
            let point = Point { pc: r.native, native_return: true, ..Default::default() };
            return match after {
                true if at == ret => Some(Point { target_slot: true, ..point }),
                true if Some(at) == arg => Some(Point { before: true, ..point }),
                _ => None,
            };
        }
        let env = self.env(counted);
        let mut host = self.host(map, own);
        // SAFETY: the scratch area, MAX_BLOCK_BYTES long, inside the mapping.
        let out = unsafe { std::slice::from_raw_parts_mut(self.w(self.layout.scratch_at()), translate::MAX_BLOCK_BYTES) };
        let variant = if r.what == COPY_SLOW { Variant::Slow } else { Variant::Fast };
        self.translator.translate(&mut host, &env, TranslateRequest { native: r.native, variant, at: r.start, points: true }, out).ok()?;
        self.translator.point_at(addr, after)
    }
}

impl Drop for CodeCache {
    fn drop(&mut self) {
        self.release();
    }
}

/// An exit stub's length, for tests.
pub const STUB_LEN: u64 = EXIT_STUB_LEN;
