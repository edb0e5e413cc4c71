//! Turn a profile's lookup addresses into source frames, offline.
//!
//! A profile carries raw addresses and its module map, so this may run on another
//! machine. Each module file is found by build-id first (a separate debug file under a
//! debug root, verified), then by its recorded path (used only if its build-id agrees).
//! Anything missing degrades — to the ELF symbol, then to `module+0xoffset` — and is
//! never an error: a report with fewer names beats no report.

use addr2line::Loader;
use object::{Object, ObjectSymbol, ObjectSymbolTable};
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
fn short_path(p: &str) -> String {
    if let Ok(cwd) = std::env::current_dir() {
        if let Ok(rel) = Path::new(p).strip_prefix(&cwd) {
            return rel.to_string_lossy().into_owned();
        }
    }
    p.to_string()
}

/// Debug info and symbols of one module file, loaded once.
struct Debug {
    /// DWARF (from the separate debug file when found); None when unreadable.
    dwarf: Option<Loader>,
    /// Sorted (address, size, demangled name) from the symbol table (or .dynsym).
    symbols: Vec<(u64, u64, String)>,
}

impl Debug {
    fn frames(&self, m: &Module, vaddr: u64) -> Vec<Frame> {
        let mut out = Vec::new();
        if let Some(l) = &self.dwarf {
            if let Ok(mut it) = l.find_frames(vaddr) {
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

    fn symbol(&self, vaddr: u64) -> Option<&str> {
        let i = self.symbols.partition_point(|s| s.0 <= vaddr);
        let (a, size, name) = self.symbols.get(i.checked_sub(1)?)?;
        // Size 0 is common for assembly symbols: accept them, but not far-away ones.
        let end = if *size > 0 { a + size } else { a + 0x10000 };
        (vaddr < end).then_some(name.as_str())
    }
}

/// Resolves lookup addresses of one profile; caches per module and per address.
pub struct Symbolizer {
    modules: Vec<Module>,
    debug_roots: Vec<PathBuf>,
    loaded: HashMap<(String, Option<String>), Option<Debug>>,
    cache: HashMap<u64, Vec<Frame>>,
}

impl Symbolizer {
    /// Debug roots: `$WITCH_DEBUG_DIRS` (colon-separated), then /usr/lib/debug.
    pub fn new(modules: &[Module]) -> Symbolizer {
        let mut roots: Vec<PathBuf> = std::env::var_os("WITCH_DEBUG_DIRS")
            .map(|v| std::env::split_paths(&v).filter(|p| !p.as_os_str().is_empty()).collect())
            .unwrap_or_default();
        roots.push(PathBuf::from("/usr/lib/debug"));
        Symbolizer { modules: modules.to_vec(), debug_roots: roots, loaded: HashMap::new(), cache: HashMap::new() }
    }

    /// The frames at one lookup address, innermost (most deeply inlined) first. Never empty.
    pub fn frames(&mut self, addr: u64) -> Vec<Frame> {
        if let Some(f) = self.cache.get(&addr) {
            return f.clone();
        }
        let f = self.resolve(addr);
        self.cache.insert(addr, f.clone());
        f
    }

    /// The frames of a whole context (lookup addresses innermost first).
    pub fn context(&mut self, addrs: &[u64]) -> Vec<Frame> {
        addrs.iter().flat_map(|&a| self.frames(a)).collect()
    }

    fn resolve(&mut self, addr: u64) -> Vec<Frame> {
        let Some(m) = self.modules.iter().find(|m| m.start <= addr && addr < m.end).cloned() else {
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
        if !self.loaded.contains_key(&key) {
            let d = load(&m, &self.debug_roots);
            self.loaded.insert(key.clone(), d);
        }
        match &self.loaded[&key] {
            Some(d) => d.frames(&m, vaddr),
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

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The GNU build-id of an ELF file, lowercase hex; None if unreadable or absent.
pub fn file_build_id(path: &Path) -> Option<String> {
    let data = std::fs::read(path).ok()?;
    let obj = object::File::parse(&*data).ok()?;
    obj.build_id().ok()?.filter(|b| !b.is_empty()).map(hex)
}

/// The file offset that a module's file virtual address is loaded from, by its
/// program headers (pprof mappings want file offsets, not addresses).
pub fn file_offset(path: &Path, vaddr: u64) -> Option<u64> {
    use object::ObjectSegment;
    let data = std::fs::read(path).ok()?;
    let obj = object::File::parse(&*data).ok()?;
    let seg = obj.segments().find(|s| s.address() <= vaddr && vaddr < s.address() + s.size())?;
    Some(seg.file_range().0 + (vaddr - seg.address()))
}

/// Finds and loads one module's debug info and symbols; None when no usable file exists.
fn load(m: &Module, roots: &[PathBuf]) -> Option<Debug> {
    if m.path.starts_with('[') || m.path.is_empty() {
        return None; // [vdso], [anon]: no file to read
    }
    let want = m.build_id.as_deref().map(str::to_ascii_lowercase);
    let path = Path::new(&m.path);
    // The binary at the recorded path, if it is the same build.
    let bin = std::fs::read(path).ok().filter(|data| {
        let Some(want) = &want else { return true };
        let got = object::File::parse(&**data).ok().and_then(|o| o.build_id().ok().flatten().map(hex));
        !matches!(got.as_deref(), Some(g) if g != want)
    });
    // A separate debug file: by build-id, then by the binary's .gnu_debuglink.
    let mut debug_path: Option<PathBuf> = None;
    if let Some(id) = want.as_deref().filter(|id| id.len() > 2) {
        for r in roots {
            let p = r.join(".build-id").join(&id[..2]).join(format!("{}.debug", &id[2..]));
            if p.is_file() && file_build_id(&p).as_deref() == Some(id) {
                debug_path = Some(p);
                break;
            }
        }
    }
    if debug_path.is_none() {
        if let Some(data) = &bin {
            debug_path = debuglink(path, data, roots);
        }
    }
    let dwarf_path = debug_path.clone().or_else(|| bin.as_ref().map(|_| path.to_path_buf()))?;
    let dwarf = Loader::new(&dwarf_path).ok();
    let mut symbols = Vec::new();
    for data in [debug_path.and_then(|p| std::fs::read(p).ok()), bin].into_iter().flatten() {
        symbols = read_symbols(&data);
        if !symbols.is_empty() {
            break;
        }
    }
    Some(Debug { dwarf, symbols })
}

/// The debug file named by `.gnu_debuglink`, looked up where gdb looks.
fn debuglink(path: &Path, data: &[u8], roots: &[PathBuf]) -> Option<PathBuf> {
    let obj = object::File::parse(data).ok()?;
    let (name, _crc) = obj.gnu_debuglink().ok()??;
    let name = std::str::from_utf8(name).ok()?;
    let dir = path.parent()?;
    let abs_dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut cands = vec![dir.join(name), dir.join(".debug").join(name)];
    for r in roots {
        cands.push(r.join(abs_dir.strip_prefix("/").unwrap_or(&abs_dir)).join(name));
    }
    cands.into_iter().find(|c| c.is_file() && c.as_path() != path)
}

fn read_symbols(data: &[u8]) -> Vec<(u64, u64, String)> {
    let Ok(obj) = object::File::parse(data) else { return Vec::new() };
    let table = obj.symbol_table().or_else(|| obj.dynamic_symbol_table());
    let Some(table) = table else { return Vec::new() };
    let mut v: Vec<(u64, u64, String)> = table
        .symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text && s.address() != 0 && s.is_definition())
        .filter_map(|s| {
            let n = s.name().ok()?;
            let n = addr2line::demangle_auto(n.into(), None).into_owned();
            Some((s.address(), s.size(), n))
        })
        .collect();
    // Prefer the sized (and then global) symbol at an address: sort, then dedup by address.
    v.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    v.dedup_by_key(|s| s.0);
    v
}
