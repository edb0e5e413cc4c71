//! The process's loaded modules, prepared outside signal handlers.
//!
//! For each executable mapping we keep its path, build-id and load bias (for
//! the profile's module map), its function start addresses (to decode
//! forward to a trap's precise PC), and framehop unwind data. The whole map
//! is rebuilt after `dlopen` and published through an atomic pointer; a map
//! that was replaced is kept ("retired") while a handler may still be
//! reading it.
//!
//! Unwind data and code are read in place, in the module's own mapping, so
//! a map must never describe a module that is no longer mapped. Modules
//! loaded after the first map ("transient" ones, which `dlclose` may
//! unload) are therefore withdrawn before any unload: [`begin_unload`]
//! publishes the map without them (the caller then waits until no handler
//! can still read the previous map, and unloads); after [`end_unload`] the
//! next [`refresh`] brings back those still loaded. A map built while an
//! unload was under way is published without its transient modules. Each
//! module is parsed once, from its file: rebuilding a map reuses the
//! modules that are still mapped where they were.

pub mod critical;
mod rewrites;
pub use rewrites::{code_writes, protection_changed};

use crate::profile;
use crate::sys::procfs::{self, Mapping};
use framehop::x86_64::UnwinderX86_64;
use framehop::{ExplicitModuleSectionInfo, MustNotAllocateDuringUnwind, Unwinder};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

pub type Unwind = UnwinderX86_64<Mapped, MustNotAllocateDuringUnwind>;

/// A section as loaded in this process: unwind data and code are read in
/// place, not copied (the loader already mapped them).
/// With checked reads (see [`set_checked_reads`]), a copy from the file.
#[derive(Clone)]
pub struct Mapped {
    ptr: *const u8,
    len: usize,
    copy: Option<Arc<[u8]>>,
}
impl Default for Mapped {
    fn default() -> Self {
        Mapped { ptr: std::ptr::NonNull::<u8>::dangling().as_ptr(), len: 0, copy: None }
    }
}
// SAFETY: read-only views of mapped module memory (unwind data and code the
// loader mapped); nothing writes through them, so any thread may hold and
// read one. Valid as long as the module stays mapped (see `Deref`).
unsafe impl Send for Mapped {}
// SAFETY: as for Send: shared reads of memory nobody writes.
unsafe impl Sync for Mapped {}
impl std::ops::Deref for Mapped {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        if let Some(c) = &self.copy {
            return c;
        }
        // SAFETY: built only for SHF_ALLOC sections of a module mapped here;
        // valid while the module stays loaded.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// A read-only private mapping of a module's file, unmapped on drop.
struct FileMap {
    ptr: *mut libc::c_void,
    len: usize,
}
impl FileMap {
    fn open(path: &str) -> Option<FileMap> {
        let f = std::fs::File::open(path).ok()?;
        let len = f.metadata().ok()?.len() as usize;
        if len == 0 {
            return None;
        }
        use std::os::fd::AsRawFd;
        // A new private read-only mapping in witch's region (nothing
        // existing is replaced), checked for MAP_FAILED; it stays valid
        // after `f` is closed.
        let ptr = crate::sys::mem::map_own_fd(len, libc::PROT_READ, libc::MAP_PRIVATE, f.as_raw_fd());
        (ptr != libc::MAP_FAILED).then_some(FileMap { ptr, len })
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes until drop, and the slice
        // borrows `self`. Like any file mapping, a file truncated meanwhile
        // would raise SIGBUS past its new end (this runs outside handlers).
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}
impl Drop for FileMap {
    fn drop(&mut self) {
        // SAFETY: the mapping `open` made, unmapped once; every slice from
        // `bytes` borrowed `self` and is gone.
        unsafe { crate::sys::mem::unmap_own(self.ptr, self.len) };
    }
}

/// A module loaded in the process: its mapped code, with the function
/// starts and unwind tables read from its file (its record in a profile is
/// [`profile::Module`]).
pub struct LoadedModule {
    pub path: String,
    pub build_id: Option<String>,
    pub start: u64,
    pub end: u64,
    pub bias: u64,
    /// Sorted runtime addresses where functions start (symbols and FDEs).
    pub func_starts: Vec<u64>,
    /// Restartable sequences' critical sections in its code, sorted
    /// `[first, past)` ranges ([`critical`]).
    critical: Vec<critical::Section>,
    /// Loaded after the first map was built: `dlclose` may unload it.
    pub transient: bool,
    /// Its unwind data is a copy (see `CHECKED`).
    checked: bool,
    unwind: framehop::Module<Mapped>,
    /// What identifies the mapping (the same file, mapped at the same place).
    key: (u64, u64, u64, u64),
}

pub struct ProcessMap {
    pub modules: Vec<Arc<LoadedModule>>,
    pub unwinder: Unwind,
    /// The agent's executable mapping, left out of `modules`.
    pub own: (u64, u64),
}

/// Set by a handler that saw a PC outside every known module.
pub static STALE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

static CURRENT: AtomicPtr<ProcessMap> = AtomicPtr::new(std::ptr::null_mut());

/// The current map, if built. Safe in signal handlers.
///
/// A SeqCst load: a handler announces itself (a SeqCst write) before it
/// loads the map, and whoever replaces the map (a SeqCst swap) and then
/// sees no handler announced knows no handler holds the old one.
pub fn current() -> Option<&'static ProcessMap> {
    let p = CURRENT.load(Ordering::SeqCst);
    if p.is_null() {
        None
    } else {
        // SAFETY: CURRENT holds null or a leaked Box<ProcessMap>, published
        // after it was built and never written again; a map replaced by
        // `publish` is kept in RETIRED, and only `reclaim` and
        // `reclaim_retired` free maps, when (their contracts) no handler can
        // be reading one. An atomic load: async-signal-safe.
        Some(unsafe { &*p })
    }
}

/// An address inside the agent; its module is left out of the map (samples
/// are never taken there, so its unwind data and symbols aren't needed).
static OWN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub fn set_own_address(a: u64) {
    OWN.store(a, Ordering::Relaxed);
}

/// Checked reads: unwind data is copied from the files, and code is read
/// through the kernel, so that no handler reads a module's memory in
/// place. For an agent that cannot see unloads before they happen (an
/// attached one interposes nothing): a map may then still list a module
/// for a while after it was unmapped.
static CHECKED: AtomicBool = AtomicBool::new(false);

/// Read modules through checks (see `CHECKED`) from the next build on.
pub fn set_checked_reads(on: bool) {
    CHECKED.store(on, Ordering::Relaxed);
}

/// Are reads checked? Async-signal-safe.
pub fn checked_reads() -> bool {
    CHECKED.load(Ordering::Relaxed)
}

/// Who may publish a map, and whether unloads are under way.
struct Publishing {
    /// `begin_unload` calls not yet ended by `end_unload`.
    unloading: usize,
    /// `begin_unload` calls so far.
    unloads: u64,
}

static PUBLISHING: Mutex<Publishing> = Mutex::new(Publishing { unloading: 0, unloads: 0 });

fn publishing() -> MutexGuard<'static, Publishing> {
    PUBLISHING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Make `map` current (the caller holds PUBLISHING); the one it replaces is
/// retired.
fn publish(_: &mut Publishing, map: ProcessMap) {
    let old = CURRENT.swap(Box::into_raw(Box::new(map)), Ordering::SeqCst);
    // A handler may still be reading the old map: keep it until `reclaim`
    // or `reclaim_retired`.
    if !old.is_null() {
        RETIRED.lock().unwrap_or_else(|e| e.into_inner()).push(old as usize);
    }
}

/// Rebuild from /proc/self/maps and publish. Not for signal handlers.
pub fn refresh() {
    // An unload under way now may unmap a module after the maps are read
    // below, and finish before the map is published.
    let (busy, unloads) = {
        let p = publishing();
        (p.unloading > 0, p.unloads)
    };
    // Unreadable now (the program lowered its descriptor limit, say): the
    // map we have beats an empty one.
    let Ok(maps) = procfs::read_maps_text(None) else { return };
    let own = OWN.load(Ordering::Relaxed);
    let map = build(&maps, (own != 0).then_some(own));
    let mut p = publishing();
    if busy || p.unloading > 0 || p.unloads != unloads {
        // A module read above may be unmapped by now, or about to be.
        STALE.store(true, Ordering::Relaxed);
        let map = map.without_transient();
        publish(&mut p, map);
        return;
    }
    publish(&mut p, map);
}

/// A module may be unloaded next: withdraw every transient module from the
/// map. The caller must then wait until no handler can be reading the map
/// this replaced (and the earlier ones) before the unload, and call
/// [`end_unload`] after it. Not for signal handlers.
pub fn begin_unload() {
    let mut p = publishing();
    p.unloading += 1;
    p.unloads += 1;
    if let Some(cur) = current() {
        let map = cur.without_transient();
        publish(&mut p, map);
    }
}

/// The unload that [`begin_unload`] announced is over: the map must be
/// rebuilt ([`refresh`]) to have the transient modules still loaded back.
pub fn end_unload() {
    let mut p = publishing();
    p.unloading = p.unloading.saturating_sub(1);
    STALE.store(true, Ordering::Relaxed);
}

/// The profile's module map: the current map's modules, and those
/// unloaded during the run whose addresses nothing else held since (a
/// range that several modules held in turn is left to the one mapped
/// there now, or to none: the profile's addresses don't say which one they
/// were taken in). Outside handlers: holds the publishing lock, so the map
/// read cannot be retired and freed meanwhile (a crash handler that finds
/// the lock taken reads it anyway, and leaves the unloaded ones out).
pub fn current_profile(may_block: bool) -> Vec<profile::Module> {
    let _p = if may_block { Some(publishing()) } else { PUBLISHING.try_lock().ok() };
    let out = current().map(|m| m.to_profile()).unwrap_or_default();
    let gone = if may_block { Some(GONE.lock().unwrap_or_else(|e| e.into_inner())) } else { GONE.try_lock().ok() };
    match gone {
        Some(gone) => with_gone(out, &gone),
        None => out,
    }
}

/// `current` and those of `gone` whose range no other module held.
fn with_gone(mut current: Vec<profile::Module>, gone: &[profile::Module]) -> Vec<profile::Module> {
    let overlap = |a: &profile::Module, b: &profile::Module| a.start < b.end && b.start < a.end;
    let same = |a: &profile::Module, b: &profile::Module| a.path == b.path && a.start == b.start && a.bias == b.bias;
    let alone: Vec<profile::Module> = gone
        .iter()
        .filter(|g| !current.iter().any(|m| overlap(g, m)) && !gone.iter().any(|o| overlap(g, o) && !same(g, o)))
        .cloned()
        .collect();
    current.extend(alone);
    current.sort_by_key(|m| m.start);
    current
}

/// Transient modules no longer mapped, once each (at most `MAX_GONE`).
static GONE: Mutex<Vec<profile::Module>> = Mutex::new(Vec::new());
const MAX_GONE: usize = 4096;

fn note_gone(m: &LoadedModule) {
    let mut gone = GONE.lock().unwrap_or_else(|e| e.into_inner());
    let seen = gone.iter().any(|g| g.path == m.path && g.start == m.start && g.end == m.end && g.bias == m.bias);
    if !seen && gone.len() < MAX_GONE {
        gone.push(profile::Module { path: m.path.clone(), build_id: m.build_id.clone(), start: m.start, end: m.end, bias: m.bias });
    }
}

static RETIRED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// Free the retired maps. `grace` must return only once every handler
/// that was running when it was called has returned (handlers that start
/// later read the current map). Not for signal handlers.
pub fn reclaim_retired(grace: impl FnOnce()) {
    let old = std::mem::take(&mut *RETIRED.lock().unwrap_or_else(|e| e.into_inner()));
    if old.is_empty() {
        return;
    }
    grace();
    for p in old {
        // SAFETY: maps that `publish` replaced, so no handler that started
        // since can read them, and `grace` waited out the ones that
        // started before; outside handlers, maps are read only under the
        // publishing lock (`current_profile`), and a map under it is
        // current, never among these.
        drop(unsafe { Box::from_raw(p as *mut ProcessMap) });
    }
}

/// Free every map, current and retired, and every module kept for reuse.
///
/// # Safety
/// No signal handler may be running or start until the next `refresh`
/// (an attached agent calls this after detaching every thread).
pub unsafe fn reclaim() {
    let _p = publishing();
    let cur = CURRENT.swap(std::ptr::null_mut(), Ordering::SeqCst);
    let mut all = std::mem::take(&mut *RETIRED.lock().unwrap_or_else(|e| e.into_inner()));
    if !cur.is_null() {
        all.push(cur as usize);
    }
    for p in all {
        drop(Box::from_raw(p as *mut ProcessMap));
    }
    LOADED.lock().unwrap_or_else(|e| e.into_inner()).clear();
    GONE.lock().unwrap_or_else(|e| e.into_inner()).clear();
    FIRST_BUILT.store(false, Ordering::Relaxed);
}

/// The modules of the last map built, for reuse by the next.
static LOADED: Mutex<Vec<Arc<LoadedModule>>> = Mutex::new(Vec::new());
/// A map was built: modules first seen from now on are transient.
static FIRST_BUILT: AtomicBool = AtomicBool::new(false);

impl ProcessMap {
    fn assemble(modules: Vec<Arc<LoadedModule>>, own: (u64, u64)) -> ProcessMap {
        let mut unwinder = Unwind::new();
        for m in &modules {
            unwinder.add_module(m.unwind.clone());
        }
        ProcessMap { modules, unwinder, own }
    }

    /// This map without its transient modules.
    fn without_transient(&self) -> ProcessMap {
        ProcessMap::assemble(self.modules.iter().filter(|m| !m.transient).cloned().collect(), self.own)
    }

    pub fn module(&self, pc: u64) -> Option<&LoadedModule> {
        let i = self.modules.partition_point(|m| m.start <= pc);
        let m = self.modules.get(i.checked_sub(1)?)?;
        (pc < m.end).then_some(m)
    }

    /// The restartable sequence's critical section that holds `pc`, or
    /// that the code at `pc` runs straight into: code the cache must not
    /// run, nor stop in (see [`critical`]). Async-signal-safe.
    pub fn critical_section(&self, pc: u64) -> Option<critical::Section> {
        self.module(pc)?.critical_section(pc)
    }

    /// Start of the function containing `pc`, if known.
    pub fn function_start(&self, pc: u64) -> Option<u64> {
        let m = self.module(pc)?;
        let i = m.func_starts.partition_point(|&s| s <= pc);
        m.func_starts.get(i.checked_sub(1)?).copied()
    }

    /// Start of the function after the one at `pc` (where its code ends at most).
    pub fn next_function_start(&self, pc: u64) -> Option<u64> {
        let m = self.module(pc)?;
        let i = m.func_starts.partition_point(|&s| s <= pc);
        m.func_starts.get(i).copied()
    }

    pub fn to_profile(&self) -> Vec<profile::Module> {
        self.modules
            .iter()
            .map(|m| profile::Module { path: m.path.clone(), build_id: m.build_id.clone(), start: m.start, end: m.end, bias: m.bias })
            .collect()
    }
}

/// The executable, file-backed mappings: where code can be.
fn code_mappings(maps: &str) -> Vec<Mapping> {
    procfs::parse_maps(maps).into_iter().filter(|m| m.exec && m.is_file()).collect()
}

fn build(maps: &str, skip: Option<u64>) -> ProcessMap {
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    let transient = FIRST_BUILT.swap(true, Ordering::Relaxed);
    let mut modules = Vec::new();
    let mut own = (0, 0);
    for m in code_mappings(maps) {
        if skip.is_some_and(|a| a >= m.start && a < m.end) {
            own = (m.start, m.end);
            continue;
        }
        let key = (m.start, m.end, m.offset, m.inode);
        if let Some(known) = loaded.iter().find(|k| k.key == key && k.path == m.path && k.checked == checked_reads()) {
            modules.push(known.clone());
        } else if let Some(module) = load_module(&m, transient) {
            modules.push(Arc::new(module));
        }
    }
    modules.sort_by_key(|m| m.start);
    for old in loaded.iter().filter(|o| o.transient && !modules.iter().any(|m| Arc::ptr_eq(m, o))) {
        note_gone(old);
    }
    loaded.clone_from(&modules);
    ProcessMap::assemble(modules, own)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Load bias of a mapping. The kernel maps each PT_LOAD segment from its
/// file offset rounded down to a page, at its address rounded down alike, so
/// the segment is the one whose rounded offset is the mapping's. lld (Rust's
/// default linker) does not page-align segment offsets: `.text` at offset
/// 0x12e10 and address 0x13e10 is mapped from offset 0x12000 at base +
/// 0x13000, and the segment before it also covers offset 0x12000; taking
/// that one put every address 4 KiB off.
fn bias_of(file: &object::File, m: &Mapping) -> Option<u64> {
    const PAGE: u64 = 4096;
    let seg = file.segments().find(|s| s.file_range().0 & !(PAGE - 1) == m.offset).or_else(|| {
        file.segments().find(|s| {
            let (off, size) = s.file_range();
            off <= m.offset && m.offset < off + size.max(1)
        })
    })?;
    let (seg_off, _) = seg.file_range();
    let page_off = seg_off & !(PAGE - 1);
    // The address of the mapping's first byte in the file's address space.
    let first = seg.address().wrapping_sub(seg_off - page_off).wrapping_add(m.offset.wrapping_sub(page_off));
    Some(m.start.wrapping_sub(first))
}

/// The profile's module map for any process, from its /proc/PID/maps text
/// (used by the exact mode, which watches another process).
pub fn profile_modules(maps: &str) -> Vec<profile::Module> {
    let mut out: Vec<profile::Module> = code_mappings(maps)
        .iter()
        .filter_map(|m| {
            let fm = FileMap::open(&m.path)?;
            let file = object::File::parse(fm.bytes()).ok()?;
            let bias = bias_of(&file, m)?;
            let build_id = file.build_id().ok().flatten().map(hex);
            Some(profile::Module { path: m.path.clone(), build_id, start: m.start, end: m.end, bias })
        })
        .collect();
    out.sort_by_key(|m| m.start);
    out
}

fn load_module(m: &Mapping, transient: bool) -> Option<LoadedModule> {
    let fm = FileMap::open(&m.path)?;
    let file = object::File::parse(fm.bytes()).ok()?;
    let bias = bias_of(&file, m)?;
    let build_id = file.build_id().ok().flatten().map(hex);

    let mut starts: Vec<u64> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == object::SymbolKind::Text && s.address() != 0)
        .map(|s| s.address().wrapping_add(bias))
        .filter(|&a| a >= m.start && a < m.end)
        .collect();
    let sect = |name: &str| file.section_by_name(name);
    let range = |s: &object::Section| s.address()..s.address() + s.size();
    // Sections the loader mapped, viewed in place in this process.
    let in_memory = |s: &object::Section| -> Option<Mapped> {
        // Loaded (SHF_ALLOC) sections are the ones with an address.
        if s.address() == 0 || s.kind() == object::SectionKind::UninitializedData || s.size() == 0 {
            return None;
        }
        let copy = if checked_reads() { Some(Arc::from(s.data().ok()?)) } else { None };
        Some(Mapped { ptr: s.address().wrapping_add(bias) as *const u8, len: s.size() as usize, copy })
    };
    let eh_hdr = sect(".eh_frame_hdr");
    // Read from the file, not from the process: another thread may unload
    // the module while this runs (a map built meanwhile is not published
    // with it, but reading its memory here would fault).
    if let Some((h, d)) = eh_hdr.as_ref().and_then(|h| Some((h, h.data().ok()?))) {
        starts.extend(eh_frame_hdr_starts(d, h.address()).into_iter().map(|a| a.wrapping_add(bias)));
    }
    starts.retain(|&a| a >= m.start && a < m.end);
    starts.sort_unstable();
    starts.dedup();

    let text = sect(".text").filter(|t| {
        let a = t.address().wrapping_add(bias);
        a >= m.start && a + t.size() <= m.end
    });
    let eh = sect(".eh_frame");
    let got = sect(".got");
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        // Code for framehop's prologue and epilogue analysis is read in
        // place, so with checked reads it goes without.
        text_svma: text.as_ref().map(range),
        text: if checked_reads() { None } else { text.as_ref().and_then(in_memory) },
        got_svma: got.as_ref().map(range),
        eh_frame_svma: eh.as_ref().map(range),
        eh_frame: eh.as_ref().and_then(in_memory),
        eh_frame_hdr_svma: eh_hdr.as_ref().map(range),
        eh_frame_hdr: eh_hdr.as_ref().and_then(in_memory),
        ..Default::default()
    };
    let unwind = framehop::Module::new(m.path.clone(), m.start..m.end, bias, info);
    let key = (m.start, m.end, m.offset, m.inode);
    Some(LoadedModule {
        path: m.path.clone(),
        build_id,
        start: m.start,
        end: m.end,
        bias,
        func_starts: starts,
        critical: critical::sections(&file, bias, m.start, m.end),
        transient,
        checked: checked_reads(),
        unwind,
        key,
    })
}

/// Function start addresses (file addresses) from `.eh_frame_hdr`'s sorted
/// search table. Only the usual encodings are handled (what GNU ld and lld
/// emit); anything else yields no entries, and symbols still apply.
fn eh_frame_hdr_starts(d: &[u8], hdr_addr: u64) -> Vec<u64> {
    let rd4 = |o: usize| d.get(o..o + 4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    if d.len() < 12 || d[0] != 1 {
        return Vec::new();
    }
    let (ptr_enc, cnt_enc, tab_enc) = (d[1], d[2], d[3]);
    // eh_frame_ptr: 4 bytes for sdata4/udata4 encodings.
    if ptr_enc & 0x0f != 0x0b && ptr_enc & 0x0f != 0x03 {
        return Vec::new();
    }
    if cnt_enc != 0x03 || tab_enc != 0x3b {
        return Vec::new();
    }
    let Some(count) = rd4(8) else { return Vec::new() };
    let mut out = Vec::with_capacity(count.max(0) as usize);
    for i in 0..count.max(0) as usize {
        let Some(rel) = rd4(12 + i * 8) else { break };
        out.push(hdr_addr.wrapping_add(rel as i64 as u64));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_map_has_this_test_and_libc() {
        refresh();
        let map = current().unwrap();
        let here = own_process_map_has_this_test_and_libc as *const () as u64;
        let m = map.module(here).expect("test binary is mapped");
        assert!(m.build_id.is_some());
        let start = map.function_start(here + 3).expect("function start");
        assert!(start <= here + 3 && here + 3 - start < 4096);
        assert!(map.modules.iter().any(|m| m.path.contains("libc")));
        let ret = libc::getpid as *const () as u64;
        assert!(map.function_start(ret).is_some());
    }

    #[test]
    fn unloaded_modules_stay_in_the_profile_where_nothing_else_was() {
        let m = |path: &str, start: u64, end: u64| profile::Module { path: path.into(), build_id: None, start, end, bias: start };
        let current = vec![m("exe", 0x1000, 0x2000), m("b.so", 0x10000, 0x12000)];
        let gone = [m("a.so", 0x10000, 0x11000), m("c.so", 0x20000, 0x21000), m("d.so", 0x30000, 0x31000), m("e.so", 0x30800, 0x32000)];
        let out: Vec<String> = with_gone(current, &gone).iter().map(|m| m.path.clone()).collect();
        // a.so's range is b.so's now; d.so and e.so held the same addresses in turn.
        assert_eq!(out, ["exe", "b.so", "c.so"]);
    }

    #[test]
    fn maps_parsing_skips_anonymous_and_data() {
        let maps = "00400000-00452000 r-xp 00001000 08:02 173521 /usr/bin/app with space\n\
                    00652000-00653000 rw-p 00052000 08:02 173521 /usr/bin/app\n\
                    7ffd0000-7ffd2000 r-xp 00000000 00:00 0 [vdso]\n";
        let v = code_mappings(maps);
        assert_eq!(v.len(), 1);
        assert_eq!((v[0].start, v[0].offset, v[0].path.as_str()), (0x400000, 0x1000, "/usr/bin/app with space"));
    }
}
