//! Turn a profile's lookup addresses into source frames, offline.
//!
//! A profile carries raw addresses and its module map, so this may run on another
//! machine. Each module's debug info is found where gdb looks for it: a separate
//! debug file by build-id under a debug root (`.build-id/xx/rest.debug`, verified),
//! then by the binary's `.gnu_debuglink`, then the binary itself at its recorded path
//! (used only if its build-id agrees); DWARF compressed by dwz is completed from the
//! `.gnu_debugaltlink` file. Where none of these has DWARF and `DEBUGINFOD_URLS` is set,
//! the debug file (and a dwz supplement) is fetched by build-id from those debuginfod
//! servers into elfutils' cache, shared with gdb and perf ([`debuginfod`]). Anything missing degrades — to the ELF symbol, then to
//! `module+0xoffset` — and is never an error: a report with fewer names beats no report.
//!
//! Every file is read through [`file::read_regular`]: its path came from the profile,
//! so it is read only if it is a regular file, within a size and a time limit.
//!
//! Why not a symbolization crate (blazesym, wholesym)? Both open the paths they are
//! given themselves (and the split-DWARF or supplementary files those name), with
//! blocking opens and memory maps, so a FIFO, a device or a file truncated under the
//! map (SIGBUS) reaches them; witchd runs this as root on paths its targets' owners
//! choose. addr2line's own `Loader` has the same property. So the lookup is written
//! here over addr2line's `Context`, gimli and object, with every byte coming from a
//! checked, bounded read.

pub mod debuginfod;
pub mod elf;
pub mod file;

use elf::Elf;
use serde::Serialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use witchcraft::profile::Module;

/// One source-level frame; an address with inlined calls yields several.
#[derive(Serialize, Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    /// The module's path as recorded in the profile ("[unknown]" outside every module).
    pub module: String,
    /// File virtual address in the module (runtime address − bias), i.e. what
    /// `addr2line -e MODULE 0xOFFSET` takes.
    pub offset: u64,
    /// True when this frame was inlined into the next (outer) one at the same address.
    pub inlined: bool,
}

impl Frame {
    /// The short form for text output: `function (file:line)`, or `function (module+0xoff)`.
    pub fn display(&self) -> String {
        match (&self.file, self.line) {
            (Some(f), Some(l)) => format!("{} ({}:{})", self.function, short_path(f), l),
            (Some(f), None) => format!("{} ({})", self.function, short_path(f)),
            _ if self.function.contains("+0x") => self.function.clone(),
            _ => format!("{} ({}+{:#x})", self.function, module_name(&self.module), self.offset),
        }
    }

    /// What identifies this frame across builds and address layouts: source location when
    /// known, else the module's file name and offset.
    pub fn key(&self) -> String {
        match (&self.file, self.line) {
            (Some(f), Some(l)) => format!("{}@{}:{}", self.function, f, l),
            _ => format!("{}@{}+{:#x}", self.function, module_name(&self.module), self.offset),
        }
    }
}

/// The file name of a module path, for compact output.
pub fn module_name(path: &str) -> &str {
    path.rsplit('/').next().filter(|s| !s.is_empty()).unwrap_or(path)
}

/// Show paths under the current directory relative to it; others as they are.
pub fn short_path(p: &str) -> String {
    if let Ok(cwd) = std::env::current_dir() {
        if let Ok(rel) = Path::new(p).strip_prefix(&cwd) {
            return rel.to_string_lossy().into_owned();
        }
    }
    p.to_string()
}

/// Debug info and symbols of one module file, loaded once.
struct DebugInfo {
    /// DWARF (from the separate debug file when found); None when there is none.
    dwarf: Option<addr2line::Context<elf::Reader>>,
    /// Sorted (address, size, demangled name) from the symbol table (or .dynsym).
    symbols: Vec<(u64, u64, String)>,
    /// The binary's segments, for file offsets; None without the binary.
    bin: Option<Elf>,
    /// Data symbols and the loadable segments they live in (file virtual
    /// addresses), for static objects ([`Symbolizer::data_object`]).
    data: Vec<(u64, u64, String)>,
    segments: Vec<(u64, u64)>,
}

/// A static object: the data symbol holding an address, in its module.
#[derive(Serialize, Debug, Clone, PartialEq, Eq, Hash)]
pub struct DataSymbol {
    /// The symbol's name; None when the module's segment holds the address
    /// but no symbol does (or the module has no symbol table).
    pub name: Option<String>,
    /// The module's path as recorded in the profile.
    pub module: String,
    /// The symbol's file virtual address and size (the address's own, size
    /// 0, without a symbol).
    pub offset: u64,
    pub size: u64,
}

impl DebugInfo {
    fn frames(&self, m: &Module, vaddr: u64) -> Vec<Frame> {
        let mut out = Vec::new();
        if let Some(ctx) = &self.dwarf {
            // Split-DWARF units are skipped: their .dwo files are not read (see the module doc).
            if let Ok(mut it) = ctx.find_frames(vaddr).skip_all_loads() {
                while let Ok(Some(f)) = it.next() {
                    let function = f.function.as_ref().and_then(|n| n.demangle().ok().map(|s| s.into_owned()));
                    let (file, line) = match &f.location {
                        Some(loc) => (loc.file.map(str::to_string), loc.line.filter(|&l| l > 0)),
                        None => (None, None),
                    };
                    out.push(Frame {
                        function: function.unwrap_or_default(),
                        file,
                        line,
                        module: m.path.clone(),
                        offset: vaddr,
                        inlined: true,
                    });
                }
            }
        }
        if let Some(last) = out.last_mut() {
            last.inlined = false;
        }
        // Fill names DWARF didn't give from the symbol table.
        if out.is_empty() || out.iter().any(|f| f.function.is_empty()) {
            let sym = self.symbol(vaddr);
            if out.is_empty() {
                out.push(Frame { function: String::new(), file: None, line: None, module: m.path.clone(), offset: vaddr, inlined: false });
            }
            for f in out.iter_mut().filter(|f| f.function.is_empty()) {
                f.function = match sym {
                    Some(s) => s.to_string(),
                    None => format!("{}+{:#x}", module_name(&m.path), vaddr),
                };
            }
        }
        out
    }

    /// The data symbol holding `vaddr`, if a loadable segment does.
    fn data_symbol(&self, vaddr: u64) -> Option<Option<(u64, u64, &str)>> {
        if !self.segments.iter().any(|&(a, size)| a <= vaddr && vaddr < a.saturating_add(size)) {
            return None;
        }
        let i = self.data.partition_point(|s| s.0 <= vaddr);
        let found = i.checked_sub(1).and_then(|i| self.data.get(i)).filter(|(a, size, _)| vaddr < a + (*size).max(1));
        Some(found.map(|(a, size, name)| (*a, *size, name.as_str())))
    }

    fn symbol(&self, vaddr: u64) -> Option<&str> {
        let i = self.symbols.partition_point(|s| s.0 <= vaddr);
        let (a, size, name) = self.symbols.get(i.checked_sub(1)?)?;
        // Size 0 is common for assembly symbols: accept them, but not far-away ones.
        let end = if *size > 0 { a + size } else { a + 0x10000 };
        (vaddr < end).then_some(name.as_str())
    }
}

/// A process's modules, ordered for lookup by address.
pub struct Modules<'a> {
    list: &'a [Module],
    /// Indices into `list`, by start address.
    order: Vec<usize>,
}

impl<'a> Modules<'a> {
    pub fn new(list: &'a [Module]) -> Modules<'a> {
        let mut order: Vec<usize> = (0..list.len()).collect();
        order.sort_by_key(|&i| (list[i].start, i));
        Modules { list, order }
    }

    /// The index in the profile's list of the module whose range holds `addr`.
    pub fn index(&self, addr: u64) -> Option<usize> {
        let i = self.order.partition_point(|&i| self.list[i].start <= addr);
        // Ranges don't overlap in a real address space; look at a few in case a profile's do.
        self.order[..i].iter().rev().take(4).copied().find(|&i| addr < self.list[i].end)
    }

    /// The module whose range holds `addr`.
    pub fn find(&self, addr: u64) -> Option<&'a Module> {
        self.index(addr).map(|i| &self.list[i])
    }
}

/// Resolves lookup addresses to source frames; loads each module file's debug info once,
/// for every process and profile it serves.
pub struct Symbolizer {
    debug_roots: Vec<PathBuf>,
    loaded: HashMap<(String, Option<String>), Option<DebugInfo>>,
    /// Off (None) unless `DEBUGINFOD_URLS` names a server.
    debuginfod: Option<debuginfod::Client>,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    /// Debug roots: `$WITCH_DEBUG_DIRS` (colon-separated), then /usr/lib/debug;
    /// debuginfod servers: `$DEBUGINFOD_URLS` ([`debuginfod`]).
    pub fn new() -> Symbolizer {
        let mut roots: Vec<PathBuf> = std::env::var_os("WITCH_DEBUG_DIRS")
            .map(|v| std::env::split_paths(&v).filter(|p| !p.as_os_str().is_empty()).collect())
            .unwrap_or_default();
        roots.push(PathBuf::from("/usr/lib/debug"));
        Symbolizer { debug_roots: roots, loaded: HashMap::new(), debuginfod: debuginfod::Client::from_env() }
    }

    /// One line for a report when debuginfod was used: how many modules' debug
    /// info came from it, and what failed; None when it was off or not needed.
    pub fn debuginfod_note(&self) -> Option<String> {
        self.debuginfod.as_ref()?.note()
    }

    /// Where debug info came from over debuginfod; None when it is off.
    pub fn debuginfod_outcome(&self) -> Option<&debuginfod::Lookups> {
        self.debuginfod.as_ref().map(|c| &c.outcome)
    }

    /// The offset in its file at which a module's mapping starts (pprof mappings
    /// want it); None without the binary.
    pub fn file_offset(&mut self, m: &Module) -> Option<u64> {
        let (roots, dfd) = (&self.debug_roots, &mut self.debuginfod);
        let d = self.loaded.entry((m.path.clone(), m.build_id.clone())).or_insert_with(|| load(m, roots, dfd.as_mut())).as_ref()?;
        d.bin.as_ref()?.file_offset(m.start.wrapping_sub(m.bias))
    }

    /// The static object holding a data address of a process: the module
    /// whose loadable segment (`.data`, `.bss`, `.rodata`, ...) holds it at
    /// that module's load bias, and the data symbol there. None when no
    /// module's file (that could be read) does: the heap, an anonymous
    /// mapping, another thread's stack.
    pub fn data_object(&mut self, modules: &[Module], addr: u64) -> Option<DataSymbol> {
        let mut seen: Vec<(&str, u64)> = Vec::new();
        for m in modules {
            if seen.contains(&(m.path.as_str(), m.bias)) {
                continue;
            }
            seen.push((m.path.as_str(), m.bias));
            let vaddr = addr.wrapping_sub(m.bias);
            let (roots, dfd) = (&self.debug_roots, &mut self.debuginfod);
            let Some(d) = self.loaded.entry((m.path.clone(), m.build_id.clone())).or_insert_with(|| load(m, roots, dfd.as_mut())) else {
                continue;
            };
            if let Some(sym) = d.data_symbol(vaddr) {
                let (name, offset, size) = match sym {
                    Some((a, size, name)) => (Some(name.to_string()), a, size),
                    None => (None, vaddr, 0),
                };
                return Some(DataSymbol { name, module: m.path.clone(), offset, size });
            }
        }
        None
    }

    /// The frames at one lookup address of a process, innermost (most deeply inlined) first. Never empty.
    pub fn frames(&mut self, modules: &Modules, addr: u64) -> Vec<Frame> {
        let Some(m) = modules.find(addr) else {
            return vec![Frame {
                function: format!("{addr:#x}"),
                file: None,
                line: None,
                module: "[unknown]".into(),
                offset: addr,
                inlined: false,
            }];
        };
        let vaddr = addr.wrapping_sub(m.bias);
        let key = (m.path.clone(), m.build_id.clone());
        let (roots, dfd) = (&self.debug_roots, &mut self.debuginfod);
        match self.loaded.entry(key).or_insert_with(|| load(m, roots, dfd.as_mut())) {
            Some(d) => d.frames(m, vaddr),
            None => vec![Frame {
                function: format!("{}+{:#x}", module_name(&m.path), vaddr),
                file: None,
                line: None,
                module: m.path.clone(),
                offset: vaddr,
                inlined: false,
            }],
        }
    }
}

/// Reads and parses one file; None if it is not a usable ELF file.
fn read_elf(path: &Path) -> Option<Elf> {
    Elf::parse(file::read_regular(path).ok()?)
}

/// The GNU build-id of an ELF file, lowercase hex; None if unreadable or absent.
pub fn file_build_id(path: &Path) -> Option<String> {
    read_elf(path)?.build_id
}

/// Finds and loads one module's debug info and symbols; None when no usable file exists.
fn load(m: &Module, roots: &[PathBuf], mut dfd: Option<&mut debuginfod::Client>) -> Option<DebugInfo> {
    if m.path.starts_with('[') || m.path.is_empty() {
        return None; // [vdso], [anon]: no file to read
    }
    let want = m.build_id.as_deref().map(str::to_ascii_lowercase);
    let path = Path::new(&m.path);
    // The binary at the recorded path, if it is the same build.
    let bin = read_elf(path).filter(|e| match (&want, &e.build_id) {
        (Some(w), Some(g)) => w == g,
        _ => true,
    });
    // A separate debug file: by build-id, then by the binary's .gnu_debuglink.
    let mut debug: Option<(PathBuf, Elf)> = want.as_deref().and_then(|id| by_build_id(id, roots));
    if debug.is_none() {
        if let Some(name) = bin.as_ref().and_then(|b| b.debuglink.clone()) {
            debug = debuglink(path, &name, roots);
        }
    }
    // Nothing on disk has DWARF: ask the debuginfod servers, by build-id.
    if debug.as_ref().is_none_or(|(_, e)| !e.has_dwarf) && !bin.as_ref().is_some_and(|b| b.has_dwarf) {
        let id = want.clone().or_else(|| bin.as_ref().and_then(|b| b.build_id.clone()));
        if let (Some(id), Some(c)) = (id, dfd.as_deref_mut()) {
            if let Some(found) = c.debuginfo(&id) {
                debug = Some(found);
            }
        }
    }
    if debug.is_none() && bin.is_none() {
        return None;
    }
    let (dwarf_path, dwarf_elf) = match &debug {
        Some((p, e)) => (p.as_path(), e),
        None => (path, bin.as_ref().expect("one of them")),
    };
    let dwarf = dwarf_elf.has_dwarf.then(|| context(dwarf_path, dwarf_elf, roots, dfd)).flatten();
    let symbols = match &debug {
        Some((_, e)) if !e.symbols.is_empty() => e.symbols.clone(),
        _ => bin.as_ref().map(|b| b.symbols.clone()).unwrap_or_default(),
    };
    let data = match &debug {
        Some((_, e)) if !e.data_symbols.is_empty() => e.data_symbols.clone(),
        _ => bin.as_ref().map(|b| b.data_symbols.clone()).unwrap_or_default(),
    };
    let segments =
        bin.as_ref().or(debug.as_ref().map(|d| &d.1)).map(|e| e.segments.iter().map(|s| (s.0, s.1)).collect()).unwrap_or_default();
    // Keep the binary's segments only; its bytes are not needed any more.
    let bin = bin.map(|b| Elf { data: Default::default(), symbols: Vec::new(), data_symbols: Vec::new(), ..b });
    Some(DebugInfo { dwarf, symbols, bin, data, segments })
}

/// `ROOT/.build-id/xx/rest.debug` whose build-id is `id`.
fn by_build_id(id: &str, roots: &[PathBuf]) -> Option<(PathBuf, Elf)> {
    if id.len() <= 2 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    roots.iter().find_map(|r| {
        let p = r.join(".build-id").join(&id[..2]).join(format!("{}.debug", &id[2..]));
        let e = read_elf(&p)?;
        (e.build_id.as_deref() == Some(id)).then_some((p, e))
    })
}

/// The debug file named by `.gnu_debuglink`, looked up where gdb looks.
fn debuglink(path: &Path, name: &str, roots: &[PathBuf]) -> Option<(PathBuf, Elf)> {
    if name.contains('/') {
        return None;
    }
    let dir = path.parent()?;
    let abs_dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut cands = vec![dir.join(name), dir.join(".debug").join(name)];
    for r in roots {
        cands.push(r.join(abs_dir.strip_prefix("/").unwrap_or(&abs_dir)).join(name));
    }
    cands.into_iter().filter(|c| c.as_path() != path).find_map(|c| read_elf(&c).map(|e| (c, e)))
}

/// The DWARF context of a file, completed from its `.gnu_debugaltlink`
/// supplement (dwz) when that is found with the right build-id (on disk, or
/// from debuginfod, which serves supplements by their build-id too).
fn context(path: &Path, e: &Elf, roots: &[PathBuf], dfd: Option<&mut debuginfod::Client>) -> Option<addr2line::Context<elf::Reader>> {
    let mut dwarf = e.dwarf()?;
    if let Some((name, id)) = &e.altlink {
        let named = if Path::new(name).is_absolute() { PathBuf::from(name) } else { path.parent()?.join(name) };
        let sup = read_elf(&named)
            .filter(|s| s.build_id.as_deref() == Some(id))
            .or_else(|| by_build_id(id, roots).map(|(_, s)| s))
            .or_else(|| dfd?.debuginfo(id).map(|(_, s)| s));
        if let Some(sup) = sup.and_then(|s| s.dwarf()) {
            dwarf.sup = Some(std::sync::Arc::new(sup));
        }
    }
    dwarf.populate_abbreviations_cache(gimli::AbbreviationsCacheStrategy::Duplicates);
    addr2line::Context::from_dwarf(dwarf).ok()
}
