//! The report's first table: the program's own code, ranked by the waste
//! watched there, each with the code that killed (or repeated) it.
//!
//! A context's *site* is its innermost frame outside the C and language
//! runtimes: not in the C library, the dynamic loader, the compiler's and
//! the languages' runtime libraries ([`RUNTIME_LIBRARIES`]), not start-up
//! code around `main` or a thread's entry ([`START_UP`]), and not a
//! toolchain's source (an inlined standard-library function, a system
//! header's inline). It is the site whether or not it has a source line: a
//! distribution's `sqlite3` shell without debug info is blamed on functions
//! of `libsqlite3`, not on the C library's start-up code that has lines
//! once the C library's debug info is installed. Runtime frames inside it
//! are folded into it and the innermost one is named (`via`): a `memset`
//! called at `regscan.c:28` is `regscan.c:28`, via
//! `__memset_avx2_unaligned_erms`. A site with a line is grouped by its
//! line; one without by its function and module ([`Interner::site_key`]),
//! since its instructions are all a person can tell apart otherwise. A
//! context made only of runtime frames keeps its innermost frame with a
//! line (or its innermost frame).

use super::context::{CtxId, FrameId, Interner};
use super::interval::Sums;
use super::Analysis;
use crate::symbolize::{module_name, Frame};
use std::collections::HashMap;

/// Where a context is, for a person: its site, and the runtime function it went through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Site {
    pub frame: FrameId,
    pub via: Option<FrameId>,
}

/// One row of the summary.
#[derive(Debug, Clone)]
pub struct LineSummary {
    /// The watch site (the first one seen with this line's identity).
    pub site: Site,
    /// Over every pair watched at this line, in every process.
    pub sums: Sums,
    pub approx_waste: f64,
    /// Trap sites (killers, repeaters, users) by waste, descending: (site, waste, use).
    pub partners: Vec<(Site, f64, f64)>,
    /// Processes (indices into the analysis) with pairs here.
    pub procs: Vec<usize>,
}

/// The C and language runtimes, by the start of their file names: the C
/// library and its parts, the dynamic loader, the compiler's support
/// libraries, the C++, Fortran and OpenMP runtimes, and witch's own agent.
pub const RUNTIME_LIBRARIES: [&str; 21] = [
    "libc.so",
    "libc-",
    "ld-linux",
    "ld64.so",
    "ld.so",
    "libm.so",
    "libmvec.so",
    "libpthread.so",
    "libdl.so",
    "librt.so",
    "libutil.so",
    "libresolv.so",
    "libstdc++.so",
    "libgcc_s.so",
    "libc++.so",
    "libc++abi.so",
    "libunwind.so",
    "libatomic.so",
    "libgfortran.so",
    "libquadmath.so",
    "libwitch_agent.so",
];

/// Start-up code around `main` and a thread's entry, in whatever module it
/// is linked (a static program's `_start` is in the program).
pub const START_UP: [&str; 16] = [
    "_start",
    "__libc_start_main",
    "__libc_start_main_impl",
    "__libc_start_call_main",
    "__libc_start_main_alias_2",
    "__libc_csu_init",
    "_init",
    "_dl_start",
    "_dl_start_user",
    "_dl_init",
    "start_thread",
    "clone",
    "clone3",
    "__clone",
    "__clone3",
    "__libc_csu_fini",
];

/// Source directories of toolchains and system headers.
const TOOLCHAIN_SOURCES: [&str; 4] = ["/rustc/", "/usr/include/", "/usr/lib/gcc/", "/.rustup/"];

/// Function name prefixes of the languages' standard libraries, compiled
/// into the program (Rust's std, core and alloc; C++'s std templates): the
/// language runtime, where no source line says so.
const RUNTIME_FUNCTIONS: [&str; 8] = ["std::", "core::", "alloc::", "<std::", "<core::", "<alloc::", "__rust_", "__cxa_"];

/// Whether a module (by its recorded path) is part of the C or a language runtime.
pub fn is_runtime_module(path: &str) -> bool {
    if path.is_empty() || path.starts_with('[') {
        return true; // [vdso], [vsyscall], [unknown]
    }
    let name = module_name(path);
    RUNTIME_LIBRARIES.iter().any(|r| name.starts_with(r))
}

/// Whether a frame is runtime code rather than the program's own.
pub fn is_runtime(f: &Frame) -> bool {
    is_runtime_module(&f.module)
        || START_UP.contains(&f.function.as_str())
        || f.file.as_deref().is_some_and(|file| TOOLCHAIN_SOURCES.iter().any(|t| file.contains(t)))
        || (f.line.is_none() && RUNTIME_FUNCTIONS.iter().any(|p| f.function.starts_with(p)))
}

/// The site of a context.
pub fn site(names: &Interner, ctx: CtxId) -> Option<Site> {
    let innermost = names.frame_ids(ctx).next()?;
    let frame = names
        .frame_ids(ctx)
        .find(|&f| !is_runtime(names.get(f)))
        .or_else(|| names.frame_ids(ctx).find(|&f| names.get(f).line.is_some()))
        .unwrap_or(innermost);
    let via = (frame != innermost && names.get(innermost).function != names.get(frame).function).then_some(innermost);
    Some(Site { frame, via })
}

/// Every watch line of the run, by waste (then use), descending.
pub fn lines(run: &Analysis) -> Vec<LineSummary> {
    let names = &run.names;
    let mut index: HashMap<u32, usize> = HashMap::new();
    let mut out: Vec<LineSummary> = Vec::new();
    let mut partner_index: Vec<HashMap<u32, usize>> = Vec::new();
    for (pi, proc) in run.procs.iter().enumerate() {
        let mut memo: HashMap<CtxId, Option<Site>> = HashMap::new();
        let mut site_of = |ctx: CtxId| *memo.entry(ctx).or_insert_with(|| site(names, ctx));
        for sp in &proc.pairs {
            let (Some(w), Some(t)) = (site_of(sp.watch), site_of(sp.trap)) else { continue };
            let key = names.site_key(w.frame);
            let i = *index.entry(key).or_insert_with(|| {
                out.push(LineSummary { site: w, sums: Sums::default(), approx_waste: 0.0, partners: Vec::new(), procs: Vec::new() });
                partner_index.push(HashMap::new());
                out.len() - 1
            });
            let line = &mut out[i];
            line.sums.add(&sp.sums);
            line.approx_waste += sp.approx_waste;
            if !line.procs.contains(&pi) {
                line.procs.push(pi);
            }
            let j = *partner_index[i].entry(names.site_key(t.frame)).or_insert_with(|| {
                line.partners.push((t, 0.0, 0.0));
                line.partners.len() - 1
            });
            line.partners[j].1 += sp.waste();
            line.partners[j].2 += sp.used();
        }
    }
    for l in &mut out {
        l.partners.sort_by(|a, b| b.1.total_cmp(&a.1).then(b.2.total_cmp(&a.2)));
    }
    out.sort_by(|a, b| b.sums.waste.total_cmp(&a.sums.waste).then(b.sums.r#use.total_cmp(&a.sums.r#use)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::context::EMPTY;

    fn f(function: &str, file: Option<&str>, line: Option<u32>, module: &str) -> Frame {
        Frame { function: function.into(), file: file.map(str::to_string), line, module: module.into(), offset: 0, inlined: false }
    }

    #[test]
    fn the_site_is_the_innermost_frame_outside_the_runtimes() {
        let mut n = Interner::new();
        let start = n.frame(f("_start", None, None, "/w/app"));
        let main = n.frame(f("main", Some("app.c"), Some(43), "/w/app"));
        let scan = n.frame(f("scan", Some("app.c"), Some(28), "/w/app"));
        let memset = n.frame(f("__memset_avx2", Some("memset.S"), Some(309), "/usr/lib/x86_64-linux-gnu/libc.so.6"));
        let mut c = n.push(EMPTY, start);
        c = n.push(c, main);
        c = n.push(c, scan);
        let in_lib = n.push(c, memset);
        assert_eq!(site(&n, in_lib), Some(Site { frame: scan, via: Some(memset) }));
        assert_eq!(site(&n, c), Some(Site { frame: scan, via: None }));
        // Nothing of the program's own: the innermost frame with a line.
        let only_lib = n.push(EMPTY, memset);
        assert_eq!(site(&n, only_lib), Some(Site { frame: memset, via: None }));
        assert_eq!(site(&n, EMPTY), None);
    }

    /// A distribution's program and its library without debug info, the C
    /// library with it (its start-up code has lines): the site is the
    /// library's function, not `__libc_start_call_main`; two instructions
    /// of one function without lines are one site.
    #[test]
    fn without_line_info_the_site_is_the_function_not_the_start_up_code() {
        let mut n = Interner::new();
        let libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
        let start = n.frame(f("_start", None, None, "/usr/bin/sqlite3"));
        let call_main = n.frame(f("__libc_start_call_main", Some("../sysdeps/nptl/libc_start_call_main.h"), Some(58), libc));
        let main = n.frame(f("main", None, None, "/usr/bin/sqlite3"));
        let step = |n: &mut Interner, offset| {
            let mut fr = f("sqlite3VdbeExec", None, None, "/usr/lib/x86_64-linux-gnu/libsqlite3.so.0.8.6");
            fr.offset = offset;
            n.frame(fr)
        };
        let (exec1, exec2) = (step(&mut n, 0x100), step(&mut n, 0x180));
        let memcpy = n.frame(f("__memmove_avx_unaligned_erms", Some("memmove-vec-unaligned-erms.S"), Some(300), libc));
        let mut c = n.push(EMPTY, start);
        c = n.push(c, call_main);
        c = n.push(c, main);
        let (a, b) = (n.push(c, exec1), n.push(c, exec2));
        let via = n.push(a, memcpy);
        assert_eq!(site(&n, a), Some(Site { frame: exec1, via: None }));
        assert_eq!(site(&n, via), Some(Site { frame: exec1, via: Some(memcpy) }));
        assert_eq!(n.site_key(exec1), n.site_key(exec2));
        assert_eq!(site(&n, b).map(|s| n.site_key(s.frame)), Some(n.site_key(exec1)));
        assert_ne!(n.frame_key(exec1), n.frame_key(exec2));
        // main itself, without a line, before the start-up code's line.
        assert_eq!(site(&n, c).map(|s| s.frame), Some(main));
        // A Rust program's inlined std and its standard library without lines are runtime.
        let std_fn = n.frame(f("core::ptr::write_bytes", Some("/rustc/abc/library/core/src/ptr/mod.rs"), Some(1), "/w/app"));
        let alloc = n.frame(f("alloc::raw_vec::finish_grow", None, None, "/w/app"));
        let own = n.frame(f("app::fill", None, None, "/w/app"));
        let r = n.push(EMPTY, own);
        let r = n.push(r, alloc);
        let r = n.push(r, std_fn);
        assert_eq!(site(&n, r).map(|s| s.frame), Some(own));
    }

    #[test]
    fn runtime_modules_are_the_c_and_language_runtimes() {
        for m in [
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            "/lib64/ld-linux-x86-64.so.2",
            "/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30",
            "/lib/x86_64-linux-gnu/libgcc_s.so.1",
            "/usr/lib/x86_64-linux-gnu/libm.so.6",
            "/opt/w/libwitch_agent.so",
            "[vdso]",
        ] {
            assert!(is_runtime_module(m), "{m}");
        }
        for m in ["/w/app", "/w/libmine.so", "/usr/lib/x86_64-linux-gnu/libsqlite3.so.0", "/usr/bin/python3.11", "/usr/lib/libcrypto.so.3"]
        {
            assert!(!is_runtime_module(m), "{m}");
        }
    }
}
