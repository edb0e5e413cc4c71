//! One module file, read once: its build-id, debug links, segments, symbols
//! and DWARF. Files are read whole through [`super::file`] (bounded, regular
//! files only) and parsed in memory, so nothing here opens a path on its own:
//! not the split-DWARF (`.dwo`) files a compile unit names, which are not
//! read, nor a `.gnu_debugaltlink` supplement, which the caller looks up.

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, ObjectSymbolTable};
use std::borrow::Cow;
use std::ops::Deref;
use std::sync::Arc;

/// A slice of a file read into memory, shared by the DWARF sections cut from it.
#[derive(Clone, Debug)]
pub struct Bytes {
    data: Arc<Vec<u8>>,
    start: usize,
    end: usize,
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.data[self.start..self.end]
    }
}

// SAFETY: the bytes live in an `Arc<Vec<u8>>` that is never mutated, so the
// slice does not move when a `Bytes` is moved or cloned.
unsafe impl stable_deref_trait::StableDeref for Bytes {}
// SAFETY: as above; clones share the same allocation.
unsafe impl stable_deref_trait::CloneStableDeref for Bytes {}

pub type Reader = gimli::EndianReader<gimli::RunTimeEndian, Bytes>;

/// What one ELF file offers.
pub struct Elf {
    pub data: Arc<Vec<u8>>,
    pub build_id: Option<String>,
    /// `.gnu_debuglink`: a separate debug file's name.
    pub debuglink: Option<String>,
    /// `.gnu_debugaltlink`: the supplementary DWARF file (dwz) and its build-id.
    pub altlink: Option<(String, String)>,
    /// (file virtual address, size, file offset) of each loadable segment.
    pub segments: Vec<(u64, u64, u64)>,
    /// Sorted (address, size, demangled name) of functions, from .symtab or .dynsym.
    pub symbols: Vec<(u64, u64, String)>,
    /// Sorted (address, size, demangled name) of data objects (.data, .bss,
    /// .rodata), from .symtab or .dynsym.
    pub data_symbols: Vec<(u64, u64, String)>,
    pub has_dwarf: bool,
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Elf {
    pub fn parse(data: Vec<u8>) -> Option<Elf> {
        let data = Arc::new(data);
        let obj = object::File::parse(&data[..]).ok()?;
        let build_id = obj.build_id().ok().flatten().filter(|b| !b.is_empty()).map(hex);
        let debuglink = obj.gnu_debuglink().ok().flatten().and_then(|(n, _)| std::str::from_utf8(n).ok().map(str::to_string));
        let altlink = obj.gnu_debugaltlink().ok().flatten().and_then(|(n, id)| Some((std::str::from_utf8(n).ok()?.to_string(), hex(id))));
        let segments = obj.segments().map(|s| (s.address(), s.size(), s.file_range().0)).collect();
        let symbols = read_symbols(&obj, object::SymbolKind::Text);
        let data_symbols = read_symbols(&obj, object::SymbolKind::Data);
        let has_dwarf = obj.section_by_name(".debug_info").is_some_and(|s| s.size() > 0);
        drop(obj);
        Some(Elf { data, build_id, debuglink, altlink, segments, symbols, data_symbols, has_dwarf })
    }

    /// The file offset a file virtual address is loaded from (pprof mappings want it).
    pub fn file_offset(&self, vaddr: u64) -> Option<u64> {
        let &(a, _, off) = self.segments.iter().find(|&&(a, size, _)| a <= vaddr && vaddr < a + size)?;
        Some(off + (vaddr - a))
    }

    /// The DWARF sections, as slices of the file (decompressed where compressed).
    pub fn dwarf(&self) -> Option<gimli::Dwarf<Reader>> {
        let obj = object::File::parse(&self.data[..]).ok()?;
        let endian = if obj.is_little_endian() { gimli::RunTimeEndian::Little } else { gimli::RunTimeEndian::Big };
        let base = self.data.as_ptr() as usize;
        let load = |id: gimli::SectionId| -> Result<Reader, gimli::Error> {
            // Lines and inlined frames need neither the variables' location
            // lists nor the macros: those sections are not read (a
            // compressed one, as distributions ship the C library's debug
            // files, was decompressed whole for nothing).
            let unused = matches!(
                id,
                gimli::SectionId::DebugLoc
                    | gimli::SectionId::DebugLocLists
                    | gimli::SectionId::DebugMacinfo
                    | gimli::SectionId::DebugMacro
            );
            let bytes = match obj.section_by_name(id.name()).filter(|_| !unused).map(|s| s.uncompressed_data()) {
                Some(Ok(Cow::Borrowed(b))) => {
                    let start = b.as_ptr() as usize - base;
                    Bytes { data: self.data.clone(), start, end: start + b.len() }
                }
                Some(Ok(Cow::Owned(v))) => {
                    let end = v.len();
                    Bytes { data: Arc::new(v), start: 0, end }
                }
                _ => Bytes { data: Arc::new(Vec::new()), start: 0, end: 0 },
            };
            Ok(gimli::EndianReader::new(bytes, endian))
        };
        gimli::Dwarf::load(load).ok()
    }
}

fn read_symbols(obj: &object::File, kind: object::SymbolKind) -> Vec<(u64, u64, String)> {
    let table = obj.symbol_table().or_else(|| obj.dynamic_symbol_table());
    let Some(table) = table else { return Vec::new() };
    let mut v: Vec<(u64, u64, String)> = table
        .symbols()
        .filter(|s| s.kind() == kind && s.address() != 0 && s.is_definition())
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
