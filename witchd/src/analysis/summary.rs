//! The report's first table: the program's own source lines, ranked by the
//! waste watched there, each with the lines that killed (or repeated) it.
//!
//! A context's *site* is its innermost frame with a source line in the
//! program's own code: a module of the program (its executable, or a library
//! outside the system's library directories) and a source file that is not
//! the toolchain's. Library frames inside it are folded into it, and the
//! innermost one is named (`via`): a `memset` called at `regscan.c:28` is
//! `regscan.c:28`, via `__memset_avx2_unaligned_erms`. A context with no own
//! frame keeps its innermost frame with a line (or its innermost frame).

use super::context::{CtxId, FrameId, Interner};
use super::interval::Sums;
use super::Analysis;
use crate::symbolize::Frame;
use std::collections::{HashMap, HashSet};
use witchcraft::profile::Profile;

/// Where a context is, for a person: its site, and the library function it went through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Site {
    pub frame: FrameId,
    pub via: Option<FrameId>,
}

/// One row of the summary.
#[derive(Debug, Clone)]
pub struct Line {
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

/// Module directories of the system's libraries (not the program's own code).
const SYSTEM_DIRS: [&str; 5] = ["/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/", "/usr/libexec/"];
/// Source directories of toolchains and system headers.
const TOOLCHAIN_SOURCES: [&str; 4] = ["/rustc/", "/usr/include/", "/usr/lib/gcc/", "/.rustup/"];

/// The modules of a process that are its own code.
pub fn own_modules(p: &Profile) -> HashSet<&str> {
    p.modules
        .iter()
        .map(|m| m.path.as_str())
        .filter(|path| {
            *path == p.program
                || !(path.starts_with('[')
                    || path.is_empty()
                    || path.ends_with("/libwitch_agent.so")
                    || SYSTEM_DIRS.iter().any(|d| path.starts_with(d)))
        })
        .collect()
}

fn is_own(f: &Frame, own: &HashSet<&str>) -> bool {
    f.line.is_some()
        && own.contains(f.module.as_str())
        && f.file.as_deref().is_some_and(|file| !TOOLCHAIN_SOURCES.iter().any(|t| file.contains(t)))
}

/// The site of a context in a process whose own modules are `own`.
pub fn site(names: &Interner, ctx: CtxId, own: &HashSet<&str>) -> Option<Site> {
    let innermost = names.frame_ids(ctx).next()?;
    let frame = names
        .frame_ids(ctx)
        .find(|&f| is_own(names.get(f), own))
        .or_else(|| names.frame_ids(ctx).find(|&f| names.get(f).line.is_some()))
        .unwrap_or(innermost);
    let via = (frame != innermost && names.get(innermost).function != names.get(frame).function).then_some(innermost);
    Some(Site { frame, via })
}

/// Every watch line of the run, by waste (then use), descending.
pub fn lines(run: &Analysis) -> Vec<Line> {
    let names = &run.names;
    let mut index: HashMap<u32, usize> = HashMap::new();
    let mut out: Vec<Line> = Vec::new();
    let mut partner_index: Vec<HashMap<u32, usize>> = Vec::new();
    for (pi, proc) in run.procs.iter().enumerate() {
        let own = own_modules(proc.profile);
        let mut memo: HashMap<CtxId, Option<Site>> = HashMap::new();
        let mut site_of = |ctx: CtxId| *memo.entry(ctx).or_insert_with(|| site(names, ctx, &own));
        for sp in &proc.pairs {
            let (Some(w), Some(t)) = (site_of(sp.watch), site_of(sp.trap)) else { continue };
            let key = names.frame_key(w.frame);
            let i = *index.entry(key).or_insert_with(|| {
                out.push(Line { site: w, sums: Sums::default(), approx_waste: 0.0, partners: Vec::new(), procs: Vec::new() });
                partner_index.push(HashMap::new());
                out.len() - 1
            });
            let line = &mut out[i];
            line.sums.add(&sp.sums);
            line.approx_waste += sp.approx_waste;
            if !line.procs.contains(&pi) {
                line.procs.push(pi);
            }
            let j = *partner_index[i].entry(names.frame_key(t.frame)).or_insert_with(|| {
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
    fn the_site_is_the_innermost_own_line_and_the_library_is_named() {
        let own: HashSet<&str> = ["/w/app"].into_iter().collect();
        let mut n = Interner::new();
        let start = n.frame(f("_start", None, None, "/w/app"));
        let main = n.frame(f("main", Some("app.c"), Some(43), "/w/app"));
        let scan = n.frame(f("scan", Some("app.c"), Some(28), "/w/app"));
        let memset = n.frame(f("__memset_avx2", Some("memset.S"), Some(309), "/usr/lib/libc.so.6"));
        let mut c = n.push(EMPTY, start);
        c = n.push(c, main);
        c = n.push(c, scan);
        let in_lib = n.push(c, memset);
        assert_eq!(site(&n, in_lib, &own), Some(Site { frame: scan, via: Some(memset) }));
        assert_eq!(site(&n, c, &own), Some(Site { frame: scan, via: None }));
        // Nothing of the program's own: the innermost frame with a line.
        let only_lib = n.push(EMPTY, memset);
        assert_eq!(site(&n, only_lib, &own), Some(Site { frame: memset, via: None }));
        assert_eq!(site(&n, EMPTY, &own), None);
    }

    #[test]
    fn system_libraries_and_the_agent_are_not_own_code() {
        let mut p = crate::daemon::store::tests_support::profile(1, 0, 0);
        p.program = "/w/app".into();
        let m = |path: &str| witchcraft::profile::Module { path: path.into(), build_id: None, start: 0, end: 1, bias: 0 };
        p.modules =
            vec![m("/w/app"), m("/w/libmine.so"), m("/usr/lib/x86_64-linux-gnu/libc.so.6"), m("[vdso]"), m("/opt/w/libwitch_agent.so")];
        let own = own_modules(&p);
        assert_eq!(own, ["/w/app", "/w/libmine.so"].into_iter().collect());
    }
}
