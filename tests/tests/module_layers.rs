//! The agent's modules, and the engine's, stand on one-way floors: no
//! module reaches (through `use crate::x`, `use super::x` or a path such as
//! `crate::x::f` in code) a module that reaches back to it, directly or
//! around a circle. A circle means no module of it can be read, tested or
//! changed without all the others.
//!
//! The graph is read from the sources (comments and `#[cfg(test)]` modules
//! left out): a module is a file; the crate root (`lib.rs`, `mod.rs`) is a
//! module too, reached by the paths to its own items, but declaring a child
//! (`mod x;`) is not a use of it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every file of `dir` (not recursive) as (module name, source); the
/// root file is named `root`.
fn modules(dir: &Path, root_file: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.expect("a directory entry").path();
        if p.extension().is_none_or(|x| x != "rs") {
            continue;
        }
        let stem = p.file_stem().expect("a file name").to_string_lossy().into_owned();
        let name = if p.file_name().is_some_and(|f| f == root_file) { "root".to_string() } else { stem };
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        out.insert(name, code_only(&text));
    }
    out
}

/// `text` without comments and without `#[cfg(test)] mod ... { ... }`.
fn code_only(text: &str) -> String {
    let mut s = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") && lines.peek().is_some_and(|l| l.trim_start().starts_with("mod ")) {
            // Skip the test module: to the line its braces close on.
            let mut depth = 0i64;
            for l in lines.by_ref() {
                depth += l.matches('{').count() as i64 - l.matches('}').count() as i64;
                if depth <= 0 && l.contains('}') {
                    break;
                }
            }
            continue;
        }
        let code = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        s.push_str(code);
        s.push('\n');
    }
    s
}

fn ident_at(s: &str) -> &str {
    let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len());
    &s[..end]
}

/// The first names of the paths in a `{a, b::c, self}` group starting
/// at `s` (just after its `{`).
fn group_heads(s: &str) -> Vec<&str> {
    let mut depth = 0;
    let mut heads = Vec::new();
    let mut at_start = true;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => at_start = true,
            c if c.is_whitespace() => {}
            _ if at_start && depth == 0 => {
                heads.push(ident_at(&s[i..]));
                at_start = false;
            }
            _ => {}
        }
    }
    heads
}

/// The names that follow each `prefix` in `code` (a group counts each of
/// its paths' first names), where `prefix` starts a path (not inside a
/// longer one, as `x::crate::`).
fn heads_after<'a>(code: &'a str, prefix: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = code[from..].find(prefix) {
        let at = from + i;
        from = at + prefix.len();
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &code[from..];
        if let Some(group) = rest.strip_prefix('{') {
            out.extend(group_heads(group));
        } else {
            out.push(ident_at(rest));
        }
    }
    out
}

/// Module `from` uses module `to`, because of `why` (the path's head).
type Edges = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// The uses between the modules of one directory: `prefixes` are the paths
/// that name the directory's own module from inside its files (`crate::`
/// for a crate root; `crate::engine::` and `super::` for a module dir).
fn graph(mods: &BTreeMap<String, String>, prefixes: &[&str]) -> Edges {
    let mut edges = Edges::new();
    for (name, code) in mods {
        let mut heads: Vec<&str> = prefixes.iter().flat_map(|p| heads_after(code, p)).collect();
        if name == "root" {
            // The root names its children directly (`pub use burst::X`),
            // or through `self::`.
            heads.extend(heads_after(code, "self::"));
            for child in mods.keys() {
                let pat = format!("{child}::");
                heads.extend(heads_after(code, &pat).into_iter().map(|_| child.as_str()));
            }
        }
        for h in heads {
            if h.is_empty() || h == "self" {
                continue;
            }
            let to = if mods.contains_key(h) && h != "root" { h.to_string() } else { "root".to_string() };
            if &to != name && mods.contains_key(&to) {
                edges.entry(name.clone()).or_default().entry(to).or_default().insert(h.to_string());
            }
        }
    }
    edges
}

/// The circles of `edges`: its strongly connected components of more than
/// one module (Tarjan's algorithm).
fn circles(edges: &Edges, nodes: &BTreeSet<String>) -> Vec<Vec<String>> {
    struct T<'a> {
        edges: &'a Edges,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        let next: Vec<&'a str> = t.edges.get(v).map(|m| m.keys().map(|k| k.as_str()).collect()).unwrap_or_default();
        for w in next {
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut c = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                c.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if c.len() > 1 {
                c.sort();
                t.out.push(c);
            }
        }
    }
    let mut t = T { edges, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), on: BTreeSet::new(), out: Vec::new() };
    for n in nodes {
        if !t.index.contains_key(n.as_str()) {
            visit(&mut t, n);
        }
    }
    t.out
}

/// A shortest circle through `start` inside `scc`, as `a -> b -> a`, with
/// what each step uses.
fn one_circle(edges: &Edges, scc: &[String], start: &str) -> String {
    let mut prev: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    let mut end = None;
    'bfs: while let Some(v) = queue.pop_front() {
        for w in edges.get(v).into_iter().flat_map(|m| m.keys()) {
            if !scc.contains(w) {
                continue;
            }
            if w == start {
                end = Some(v);
                break 'bfs;
            }
            if !prev.contains_key(w.as_str()) {
                prev.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    let mut path = vec![start.to_string()];
    let mut v = end.expect("a circle through a module of a component");
    while v != start {
        path.push(v.to_string());
        v = prev[v];
    }
    path[1..].reverse();
    path.push(start.to_string());
    path.windows(2)
        .map(|w| {
            let why: Vec<&str> = edges[&w[0]][&w[1]].iter().map(|s| s.as_str()).collect();
            format!("{} -> {} (uses {})", w[0], w[1], why.join(", "))
        })
        .collect::<Vec<_>>()
        .join("\n    ")
}

/// Each circle: its modules, one shortest way around it, and every use
/// between its modules (any of which, removed, may break it).
fn describe(edges: &Edges, found: &[Vec<String>]) -> String {
    found
        .iter()
        .map(|c| {
            let inside: Vec<String> = c
                .iter()
                .flat_map(|a| edges.get(a).into_iter().flatten().filter(|(b, _)| c.contains(b)).map(move |(b, why)| (a, b, why)))
                .map(|(a, b, why)| format!("{a} -> {b} ({})", why.iter().cloned().collect::<Vec<_>>().join(", ")))
                .collect();
            format!(
                "circle of {} modules: {}\n  one way around:\n    {}\n  every use inside it:\n    {}",
                c.len(),
                c.join(", "),
                one_circle(edges, c, &c[0]),
                inside.join("\n    ")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn check(dir: &str, root_file: &str, prefixes: &[&str]) -> (Edges, Vec<Vec<String>>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir);
    let mods = modules(&dir, root_file);
    assert!(mods.len() > 3, "no modules read in {}", dir.display());
    let edges = graph(&mods, prefixes);
    let nodes: BTreeSet<String> = mods.keys().cloned().collect();
    let found = circles(&edges, &nodes);
    (edges, found)
}

#[test]
fn the_agent_has_no_import_circle() {
    let (edges, found) = check("witchcraft/agent/src", "lib.rs", &["crate::"]);
    assert!(found.is_empty(), "import circles in the agent:\n{}", describe(&edges, &found));
    // The two modes are the top floor: nothing below calls up into them.
    let up: Vec<String> = edges
        .iter()
        .flat_map(|(from, to)| to.keys().filter(|t| ["attach", "preload"].contains(&t.as_str())).map(move |t| format!("{from} -> {t}")))
        .collect();
    assert!(up.is_empty(), "calls up into the modes: {up:?}");
}

/// Each file of the agent does one job, short enough to read whole.
#[test]
fn no_agent_file_is_over_600_lines() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../witchcraft/agent/src");
    let long: Vec<String> = std::fs::read_dir(&dir)
        .expect("the agent's sources")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .map(|p| (std::fs::read_to_string(&p).expect("a source file").lines().count(), p))
        .filter(|(n, _)| *n > 600)
        .map(|(n, p)| format!("{}: {n} lines", p.display()))
        .collect();
    assert!(long.is_empty(), "{long:?}");
}

/// A thread's engine state is reached only through the thread table's
/// entry points, one for each kind of access, each with its own safety
/// argument (`threads.rs`): no other agent file holds the state's raw
/// pointer or dereferences it.
#[test]
fn only_the_thread_table_reaches_a_state_raw() {
    let mods = modules(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../witchcraft/agent/src"), "lib.rs");
    assert!(mods.contains_key("threads") && mods.len() > 3, "the agent's sources not read: {:?}", mods.keys());
    let raw =
        ["state_ptr", "*mut ThreadState", ".state().as_mut()", ".state().as_ref()", ".state().is_null()", "*slot.state()", "(*ts)", "(*t)"];
    let found: Vec<String> = mods
        .iter()
        .filter(|(m, _)| m.as_str() != "threads")
        .flat_map(|(m, code)| raw.iter().filter(|r| code.contains(*r)).map(move |r| format!("{m}: {r}")))
        .collect();
    assert!(found.is_empty(), "a thread's state reached raw outside `threads.rs` (use its entry points): {found:?}");
}

/// The engine stands on one-way floors too: its root only names the
/// modules; the settings and the process-wide `Engine` are below the
/// thread's parts, the parts (watchpoints, the bookkeeping core `ledger`,
/// the burst, the window) below `ThreadState`, and the paths that run in
/// the signal handlers (sample, burst, trap, the window's crossings) above
/// it, calling down.
#[test]
fn the_engine_has_no_import_circle() {
    let (edges, found) = check("witchcraft/src/engine", "mod.rs", &["crate::engine::", "super::"]);
    assert!(found.is_empty(), "import circles in the engine:\n{}", describe(&edges, &found));
}

/// The configuration stands below the engine: the engine reads it and
/// makes its settings from it, and it names nothing of the engine's.
#[test]
fn the_configuration_stands_below_the_engine() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../witchcraft/src/config");
    let files: Vec<_> = std::fs::read_dir(&dir).expect("the configuration's sources").flatten().map(|e| e.path()).collect();
    assert!(files.iter().any(|p| p.ends_with("mod.rs")), "no config/mod.rs in {files:?}");
    for path in files {
        let code = code_only(&std::fs::read_to_string(&path).expect("a source file"));
        for engine in ["crate::engine", "super::engine", "witchcraft::engine"] {
            assert!(!code.contains(engine), "{} uses the engine ({engine})", path.display());
        }
    }
}

/// The methods of `ThreadState` that each module defines (in its
/// `impl ThreadState` blocks): method name to module.
fn thread_methods(mods: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (name, code) in mods {
        for (i, _) in code.match_indices("impl ThreadState {") {
            let body = &code[i + "impl ThreadState {".len()..];
            let mut depth = 1i64;
            let end = body
                .char_indices()
                .find(|&(_, c)| {
                    depth += i64::from(c == '{') - i64::from(c == '}');
                    depth == 0
                })
                .map_or(body.len(), |(j, _)| j);
            for m in heads_after(&body[..end], "fn ") {
                out.insert(m.to_string(), name.clone());
            }
        }
    }
    out
}

/// Module `from` calls a `ThreadState` method that module `to` defines
/// (`self.method(` in a module that defines such methods itself).
fn method_calls(mods: &BTreeMap<String, String>) -> Edges {
    let defined = thread_methods(mods);
    let owners: BTreeSet<&String> = defined.values().collect();
    let mut edges = Edges::new();
    for (name, code) in mods.iter().filter(|(n, _)| owners.contains(n)) {
        for m in heads_after(code, "self.") {
            let called = code.contains(&format!("self.{m}("));
            if let Some(to) = defined.get(m).filter(|to| called && *to != name) {
                edges.entry(name.clone()).or_default().entry(to.clone()).or_default().insert(m.to_string());
            }
        }
    }
    edges
}

/// The per-thread paths are `ThreadState` methods in several modules (the
/// sample path, the burst path, the trap path, the window's crossings,
/// the signal's dispatch): they call each other only downwards, and
/// `thread` (the state and its life) calls none of them.
#[test]
fn the_engine_paths_call_down() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../witchcraft/src/engine");
    let mods = modules(&dir, "mod.rs");
    let edges = method_calls(&mods);
    assert!(edges.len() > 3, "no calls between the paths read: {edges:?}");
    let nodes: BTreeSet<String> = mods.keys().cloned().collect();
    let found = circles(&edges, &nodes);
    assert!(found.is_empty(), "paths that call each other back:\n{}", describe(&edges, &found));
    assert!(!edges.contains_key("thread"), "the thread's state calls up into its paths: {:?}", edges.get("thread"));
}

/// The reader itself: a circle made of a grouped `use`, a path in code and
/// a parent's re-export is found; comments and test modules are not read.
#[test]
fn the_reader_finds_a_circle_and_skips_comments_and_tests() {
    let mods: BTreeMap<String, String> = [
        ("root", "pub mod a;\npub mod b;\npub use a::Thing;\n"),
        ("a", "use super::{b::f, Other};\n// crate::engine::c::g\nfn x() { }\n#[cfg(test)]\nmod tests {\n    use super::super::c;\n    fn t() { if true { } }\n}\nfn y() {}\n"),
        ("b", "fn f() { crate::engine::c::g() }\n"),
        ("c", "/// [`crate::engine::a`]\nfn g() {}\n"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), code_only(v)))
    .collect();
    assert!(mods["a"].contains("fn y"), "code after a test module is read: {}", mods["a"]);
    let edges = graph(&mods, &["crate::engine::", "super::"]);
    let nodes: BTreeSet<String> = mods.keys().cloned().collect();
    let found = circles(&edges, &nodes);
    assert_eq!(found, vec![vec!["a".to_string(), "root".to_string()]], "{edges:?}");
    assert!(edges["a"].contains_key("b") && edges["b"].contains_key("c"), "{edges:?}");
    assert!(!edges.contains_key("c"), "a comment read as a use: {edges:?}");
    assert!(describe(&edges, &found).contains("a -> root (uses Other)"), "{}", describe(&edges, &found));
    // Methods: `p` calls `q`'s `go` and its own `own`; `r` calls a `go`
    // of another type and defines no method of the state.
    let mods: BTreeMap<String, String> = [
        ("p", "impl ThreadState {\n    fn own(&mut self) { if true { self.go(1) } }\n    fn more(&self) { self.own() }\n}\n"),
        ("q", "impl ThreadState {\n    pub(super) fn go(&mut self, x: u32) {}\n}\nimpl Other {\n    fn stop(&self) {}\n}\n"),
        ("r", "fn f(w: &mut W) { self.go(2) }\n"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), code_only(v)))
    .collect();
    let calls = method_calls(&mods);
    assert_eq!(calls.keys().collect::<Vec<_>>(), ["p"], "{calls:?}");
    assert_eq!(calls["p"].keys().collect::<Vec<_>>(), ["q"], "{calls:?}");
    assert!(!thread_methods(&mods).contains_key("stop"), "{:?}", thread_methods(&mods));
}

/// No source file of the three crates is over 600 lines (a module's unit
/// tests may live beside it in a `tests.rs`, which is not counted; nor are
/// the end-to-end tests and benches, outside these directories).
#[test]
fn no_source_file_is_over_600_lines() {
    fn walk(dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).expect("a source directory") {
            let p = e.expect("a directory entry").path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") && p.file_name().is_some_and(|n| n != "tests.rs") {
                let n = std::fs::read_to_string(&p).expect("a source file").lines().count();
                if n > 600 {
                    out.push(format!("{}: {n} lines", p.display()));
                }
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut long = Vec::new();
    for dir in ["witchcraft/src", "witchcraft/agent/src", "witchd/src"] {
        walk(&root.join(dir), &mut long);
    }
    assert!(long.is_empty(), "{long:#?}");
}
