//! `witch report` on synthetic profiles over a real -O2 -g binary.

mod common;
use common::*;
use serde_json::Value;

fn frames(v: &Value) -> Vec<(String, Option<String>, Option<u64>)> {
    v["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["function"].as_str().unwrap().to_string(), f["file"].as_str().map(str::to_string), f["line"].as_u64()))
        .collect()
}

fn check_frames(got: &Value, want: &[(&str, u32)]) {
    let f = frames(got);
    let names: Vec<(&str, Option<u64>)> = f.iter().map(|x| (x.0.as_str(), x.2)).collect();
    let want: Vec<(&str, Option<u64>)> = want.iter().map(|w| (w.0, Some(w.1 as u64))).collect();
    assert_eq!(names, want);
    for x in &f {
        assert!(x.1.as_deref().unwrap().ends_with("app.c"), "file {:?}", x.1);
    }
}

#[test]
fn json_report_fields_values_and_lines() {
    let fx = fixture();
    let path = save(&profile(fx, 0, BASE), "json.witch");
    let o = witch(["report".as_ref(), path.as_os_str(), "--json".as_ref()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("one JSON object");
    assert_eq!(v["schema"], 2);
    assert_eq!(v["craft"], "dead");
    assert_eq!(v["program"], fx.bin.display().to_string());
    assert_eq!(v["sampler"]["kind"], "software");
    assert_eq!(v["sampler"]["event"], "task-clock");
    assert_eq!(v["sampler"]["period"], 100_000);
    assert_eq!(v["samples"], 50);
    assert_eq!(v["traps"], 35);
    // The fixture's period is CPU time: the figures are byte·ns, and say so.
    assert_eq!(v["unit"], "byte·ns");
    assert_eq!(v["waste"], 900.0);
    assert_eq!(v["use"], 300.0);
    assert_eq!(v["approx_waste"], 0.0);
    let ci = v["waste_fraction_ci"].as_array().unwrap();
    assert!(ci[0].as_f64().unwrap() < 0.75 && ci[1].as_f64().unwrap() > 0.75, "{ci:?}");
    assert!((v["waste_fraction"].as_f64().unwrap() - 0.75).abs() < 1e-12);

    let pairs = v["pairs"].as_array().unwrap();
    // Thread 1's and thread 2's init→fill pairs merged: 3 source-level pairs.
    assert_eq!(pairs.len(), 3);
    assert_eq!(v["pair_count"], 3);
    let wastes: Vec<f64> = pairs.iter().map(|p| p["waste"].as_f64().unwrap()).collect();
    assert_eq!(wastes, vec![800.0, 100.0, 0.0], "sorted by waste");
    assert!((pairs[0]["share"].as_f64().unwrap() - 800.0 / 900.0).abs() < 1e-12);
    assert!((pairs[1]["share"].as_f64().unwrap() - 100.0 / 900.0).abs() < 1e-12);
    assert_eq!(pairs[2]["use"], 300.0);
    assert_eq!(pairs[2]["share"], 0.0);

    let l = &fx.line;
    check_frames(&pairs[0]["watch"], &[("init", l["INIT_STORE"]), ("main", l["MAIN_CALLS_INIT"])]);
    check_frames(&pairs[0]["trap"], &[("poke", l["POKE_STORE"]), ("fill", l["FILL_CALLS_POKE"]), ("main", l["MAIN_CALLS_FILL"])]);
    check_frames(&pairs[2]["trap"], &[("sum", l["SUM_LOAD"]), ("main", l["MAIN_CALLS_SUM"])]);
    // Frames carry module and file virtual address; inlined flag on poke only.
    let f0 = &pairs[0]["trap"]["frames"][0];
    assert_eq!(f0["module"], fx.bin.display().to_string());
    assert_eq!(f0["offset"], fx.fill_store);
    assert_eq!(f0["inlined"], true);
    assert_eq!(pairs[0]["trap"]["frames"][1]["inlined"], false);

    // --top limits the pairs, not the totals.
    let o = witch(["report".as_ref(), path.as_os_str(), "--json".as_ref(), "--top".as_ref(), "1".as_ref()]);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["pairs"].as_array().unwrap().len(), 1);
    assert_eq!(v["waste"], 900.0);
}

/// Text with every run of white space (a wrapped line's break and indent
/// included) as one space.
fn words(t: &str) -> String {
    t.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// No line of a report is wider than 80 columns (when it goes to no
/// terminal), except a single word that cannot be broken.
fn fits_80(t: &str) {
    for l in t.lines() {
        assert!(l.chars().count() <= 80 || !l.trim().contains(' '), "wider than 80 columns: {l:?}\n{t}");
    }
}

#[test]
fn text_report_reads_top_down() {
    let fx = fixture();
    let path = save(&profile(fx, 0, BASE), "text.witch");
    let o = witch(["report".as_ref(), path.as_os_str()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = stdout(&o);
    let l = &fx.line;
    for want in [
        "witch dead:".to_string(),
        "software task-clock, period 100000 ns".into(),
        "50 samples, 35 traps, 1 imprecise PCs".into(),
        "Waste fraction: 75.0%".into(),
        "exact 75.0%, approximate 0.0%".into(),
        "88.9% of all waste".into(),
        "dead store at".into(),
        "killed by".into(),
        format!("init (app.c:{})", l["INIT_STORE"]),
        format!("poke (app.c:{}) [inlined]", l["POKE_STORE"]),
        format!("fill (app.c:{})", l["FILL_CALLS_POKE"]),
        format!("main (app.c:{})", l["MAIN_CALLS_FILL"]),
    ] {
        // Paths are shown relative to the current directory when under it;
        // the text is fitted to 80 columns, so lines may wrap anywhere.
        let t2 = words(&t.replace(&format!("{}/", fx.dir.display()), ""));
        assert!(t2.contains(&words(&want)), "missing {want:?} in\n{t}");
    }
    // Top-down: the biggest pair comes first; the use-only pair is not listed as waste.
    let i = t.find("88.9% of all waste").unwrap();
    let j = t.find("11.1% of all waste").unwrap();
    assert!(i < j);
    assert!(t.contains("Top 2 of 2 pairs"));
    // Findings first: the waste fraction and the summary on the first
    // screen (24 lines), the engine's details after them.
    fits_80(&t);
    let lines: Vec<&str> = t.lines().collect();
    let at = |s: &str| lines.iter().position(|l| l.contains(s)).unwrap_or_else(|| panic!("no {s:?} in\n{t}"));
    assert!(at("Waste fraction:") < 3 && at("Lines with dead stores") < 8 && at("app.c:13 init") < 12, "{t}");
    assert!(at("How it was observed:") > at("Top 2 of 2 pairs") && at("  sampler") > at("How it was observed:"), "{t}");
    // Amounts: a time-weighted sampler's are no bytes, and the report says
    // so, and what would count bytes.
    assert!(
        words(&t).contains("waste 900 byte·ns, use 300 byte·ns (time-weighted, to compare, not bytes: -e sw-stores counts bytes)"),
        "{t}"
    );
}

/// `--pairs 0` shows every pair with waste, not only the heaviest of each
/// summary line; `--pairs N` the heaviest of the first N lines.
#[test]
fn pairs_zero_shows_every_pair() {
    let fx = fixture();
    let mut p = profile(fx, 0, BASE);
    // A second killer of init's store: two pairs at init's line, three in all.
    p.threads[0].pairs.push(Pair { watch: 2, trap: 2, waste: 50.0, traps: 3000, ..Default::default() });
    let path = save(&p, "pairs-all.witch");
    let count = |t: &str| t.lines().filter(|l| l.starts_with('#') && l.contains("of all waste")).count();
    let o = witch(["report".as_ref(), path.as_os_str(), "--pairs".as_ref(), "0".as_ref()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = stdout(&o);
    assert_eq!(count(&t), 3, "--pairs 0 does not show all three pairs:\n{t}");
    assert!(t.contains("All 3 pairs"), "{t}");
    let o = witch(["report".as_ref(), path.as_os_str(), "--pairs".as_ref(), "2".as_ref()]);
    let t = stdout(&o);
    assert_eq!(count(&t), 2, "--pairs 2 shows the heaviest of each of the two lines:\n{t}");
    let flat = t.split_whitespace().collect::<Vec<_>>().join(" "); // lines wrap to the width
    assert!(flat.contains("Top 2 of 3 pairs") && flat.contains("1 more pairs at this line"), "{t}");
    let o = witch(["report".as_ref(), path.as_os_str(), "--pairs".as_ref(), "1".as_ref()]);
    assert_eq!(count(&stdout(&o)), 1, "{}", stdout(&o));
}

#[test]
fn missing_module_file_degrades_to_module_offset() {
    let fx = fixture();
    let mut p = profile(fx, 0, BASE);
    p.modules[0].path = "/nonexistent/dir/app".into();
    let path = save(&p, "missing.witch");
    let o = witch(["report".as_ref(), path.as_os_str(), "--json".as_ref()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let f = &v["pairs"][0]["watch"]["frames"][0];
    assert_eq!(f["function"], format!("app+{:#x}", fx.init_store));
    assert!(f["file"].is_null() && f["line"].is_null());
    assert_eq!(f["module"], "/nonexistent/dir/app");
    // A present file of another build (build-id differs) is not trusted either.
    let mut p = profile(fx, 0, BASE);
    p.modules[0].build_id = Some("00112233445566778899aabbccddeeff00112233".into());
    let path = save(&p, "otherbuild.witch");
    let o = witch(["report".as_ref(), path.as_os_str(), "--json".as_ref()]);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["pairs"][0]["watch"]["frames"][0]["function"], format!("app+{:#x}", fx.init_store));
    // Text still renders, with module+offset.
    let o = witch(["report".as_ref(), path.as_os_str()]);
    assert!(o.status.success());
    assert!(stdout(&o).contains(&format!("app+{:#x}", fx.init_store)));
}

#[test]
fn stripped_binary_falls_back_to_symbols() {
    let fx = fixture();
    let stripped = fx.dir.join("app-nodebug");
    let st = std::process::Command::new("objcopy").arg("--strip-debug").arg(&fx.bin).arg(&stripped).status().unwrap();
    assert!(st.success());
    let mut p = profile(fx, 0, BASE);
    p.modules[0].path = stripped.display().to_string();
    let path = save(&p, "nodebug.witch");
    let o = witch(["report".as_ref(), path.as_os_str(), "--json".as_ref()]);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let f = &v["pairs"][0]["watch"]["frames"];
    assert_eq!(f[0]["function"], "init");
    assert!(f[0]["line"].is_null());
    assert_eq!(f[1]["function"], "main");
}

/// Decoding side of pprof, written independently of witch's encoder.
mod pb {
    /// The pprof `Profile` message.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PprofProfile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
    }
}

#[test]
fn pprof_decodes_to_the_same_totals_and_synthetic_stacks() {
    use prost::Message;
    use std::io::Read;
    let fx = fixture();
    let path = save(&profile(fx, 0, BASE), "pprof.witch");
    let out = fx.dir.join("out.pb.gz");
    let _ = std::fs::remove_file(&out);
    let o = witch(["report".as_ref(), path.as_os_str(), "--pprof".as_ref(), out.as_os_str()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&out).unwrap()).read_to_end(&mut raw).unwrap();
    let p = pb::PprofProfile::decode(&*raw).unwrap();
    let s = |i: i64| p.string_table[i as usize].as_str();
    let types: Vec<(&str, &str)> = p.sample_type.iter().map(|t| (s(t.r#type), s(t.unit))).collect();
    // The fixture's period is CPU time: its figures are byte·ns, not bytes.
    assert_eq!(types, vec![("waste", "byte·ns"), ("use", "byte·ns")]);
    let waste: i64 = p.sample.iter().map(|x| x.value[0]).sum();
    let used: i64 = p.sample.iter().map(|x| x.value[1]).sum();
    assert_eq!((waste, used), (900, 300));

    // Stack of each sample, leaf first, as outermost-function names per location.
    let fname = |fid: u64| s(p.function.iter().find(|f| f.id == fid).unwrap().name).to_string();
    let stack = |smp: &pb::Sample| -> Vec<String> {
        smp.location_id
            .iter()
            .flat_map(|id| {
                let loc = p.location.iter().find(|l| l.id == *id).unwrap();
                loc.line.iter().map(|l| fname(l.function_id)).collect::<Vec<_>>()
            })
            .collect()
    };
    let stacks: Vec<(Vec<String>, i64, i64)> = p.sample.iter().map(|x| (stack(x), x.value[0], x.value[1])).collect();
    let killed: Vec<&str> = vec!["poke", "fill", "main", "KILLED_BY", "init", "main"];
    let got: i64 = stacks.iter().filter(|(st, _, _)| *st == killed).map(|x| x.1).sum();
    assert_eq!(got, 800, "init killed by fill, leaf first: {stacks:?}");
    let used: Vec<&str> = vec!["sum", "main", "USED_BY", "poke", "fill", "main"];
    assert!(stacks.iter().any(|(st, w, u)| *st == used && *w == 0 && *u == 300), "{stacks:?}");
}

#[test]
fn folded_and_flamegraph() {
    let fx = fixture();
    let path = save(&profile(fx, 0, BASE), "flame.witch");
    let folded = |view: &[&str]| -> Vec<String> {
        let mut args = vec!["report".as_ref(), path.as_os_str(), "--folded".as_ref()];
        args.extend(view.iter().map(|v| std::ffi::OsStr::new(*v)));
        let o = witch(args);
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o).lines().map(str::to_string).collect()
    };
    // By default one side: the dead stores by their context, root first.
    let lines = folded(&[]);
    assert_eq!(lines, ["main;fill;poke 100", "main;init 800"], "use-only pairs have no waste to draw");
    assert_eq!(folded(&["--view", "waste"]), lines);
    // The other side: what killed them, weighted by the waste it killed.
    assert_eq!(folded(&["--view", "killers"]), ["main;fill;poke 900"]);
    // Both, as pairs.
    let lines = folded(&["--view", "pairs"]);
    assert!(lines.contains(&"main;init;KILLED_BY;main;fill;poke 800".to_string()), "{lines:?}");
    assert!(lines.contains(&"main;fill;poke;KILLED_BY;main;fill;poke 100".to_string()), "{lines:?}");
    assert_eq!(lines.len(), 2, "use-only pairs have no waste to draw");

    let svg = fx.dir.join("out.svg");
    for (view, has_relation) in [(None, false), (Some("killers"), false), (Some("pairs"), true)] {
        let _ = std::fs::remove_file(&svg);
        let mut args = vec!["report".as_ref(), path.as_os_str(), "--flamegraph".as_ref(), svg.as_os_str()];
        if let Some(v) = view {
            args.extend(["--view".as_ref(), std::ffi::OsStr::new(v)]);
        }
        let o = witch(args);
        assert!(o.status.success(), "{}", stderr(&o));
        let s = std::fs::read_to_string(&svg).unwrap();
        assert!(s.starts_with("<?xml") && s.contains("<svg"));
        assert!(s.contains("poke") && s.contains("waste fraction 75.0%"), "{view:?}");
        assert_eq!(s.contains("KILLED_BY"), has_relation, "{view:?}");
        assert_eq!(s.contains(">init<") || s.contains("init ("), view != Some("killers"), "{view:?}");
        // The report is still printed.
        assert!(stdout(&o).contains("Waste fraction"));
    }
}

/// A profile whose contexts are 400 frames deep (an interpreter's): the
/// built-in flame graph's first screen (the top 700 pixels, a laptop's
/// browser window) holds the wasted accesses, the widest the heaviest.
#[test]
fn a_deep_flame_graph_shows_the_waste_on_its_first_screen() {
    let fx = fixture();
    let mut p = profile(fx, 0, BASE);
    // Put 400 frames (main's call of init, over and over) under every context.
    for t in &mut p.threads {
        let base = t.nodes.len() as u32;
        let mut chain: Vec<Node> =
            (0..400).map(|i| Node { parent: if i == 0 { 0 } else { base + i - 1 }, pc: fx.main_init, samples: 0 }).collect();
        let deepest = base + 399;
        for n in t.nodes.iter_mut().skip(1) {
            if n.parent == 0 {
                n.parent = deepest;
            }
        }
        t.nodes.append(&mut chain);
    }
    let path = save(&p, "deep.witch");
    let svg = fx.dir.join("deep.svg");
    let o = witch(["report".as_ref(), path.as_os_str(), "--flamegraph".as_ref(), svg.as_os_str()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = std::fs::read_to_string(&svg).unwrap();
    // Every frame is a <g> with a <title>name (value ...)</title> and a <rect ... y="..." width="...">.
    let mut first_screen: Vec<(String, f64, f64)> = Vec::new();
    for g in s.split("<g>").skip(1) {
        let title = g.split("<title>").nth(1).and_then(|t| t.split(" (").next()).unwrap_or("").to_string();
        let attr = |name: &str| -> Option<f64> {
            let rest = g.split(&format!(" {name}=\"")).nth(1)?;
            rest.split('"').next()?.trim_end_matches('%').parse().ok()
        };
        if let (Some(y), Some(w)) = (attr("y"), attr("width")) {
            if y < 700.0 && title != "all" {
                first_screen.push((title, y, w));
            }
        }
    }
    // The row under "all": the dead stores' functions, the heaviest widest.
    let top = first_screen.iter().map(|f| f.1).fold(f64::INFINITY, f64::min);
    let mut row: Vec<&(String, f64, f64)> = first_screen.iter().filter(|f| f.1 == top).collect();
    row.sort_by(|a, b| b.2.total_cmp(&a.2));
    let names: Vec<&str> = row.iter().map(|f| f.0.as_str()).collect();
    assert_eq!(names, ["init", "poke"], "the first screen's top row: {first_screen:?}");
    let first_screen: Vec<(String, f64)> = first_screen.into_iter().map(|f| (f.0, f.2)).collect();
    assert!(first_screen.iter().any(|(t, _)| t == "poke"), "{first_screen:?}");
}

/// Module paths are the profile writer's choice: a FIFO there must not hang
/// `witch report`, nor /dev/zero make it read without end.
#[test]
fn report_of_a_profile_naming_a_fifo_or_dev_zero_finishes() {
    let fx = fixture();
    let dir = scratch("fifo-module");
    let fifo = dir.join("libfifo.so");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let mut p = profile(fx, 0, BASE);
    for (path, start) in [(fifo.display().to_string(), 0x500000), ("/dev/zero".to_string(), 0x600000)] {
        p.modules.push(Module { path, build_id: None, start, end: start + 0x10000, bias: start });
        let t = &mut p.threads[0];
        t.nodes.push(Node { parent: 0, pc: start + 0x1000, samples: 1 });
        let n = t.nodes.len() as u32 - 1;
        t.pairs.push(Pair { watch: n, trap: n, waste: 50.0, traps: 1, ..Default::default() });
    }
    let path = save_in(&dir, &p, "fifo.witch");
    let svg = dir.join("f.svg");
    let pb = dir.join("f.pb.gz");
    for extra in [vec![], vec!["--json"], vec!["--folded"], vec!["--pprof", pb.to_str().unwrap(), "--flamegraph", svg.to_str().unwrap()]] {
        let mut args = vec!["report", path.to_str().unwrap()];
        args.extend(&extra);
        let (o, took) = witch_limited(&args, 60, 2 << 30).unwrap_or_else(|| panic!("witch {args:?} did not finish within 60 s"));
        assert!(o.status.success(), "{args:?} ({took:?}): {}", stderr(&o));
    }
    let (o, _) = witch_limited(&["report", path.to_str().unwrap()], 60, 2 << 30).unwrap();
    let t = stdout(&o);
    assert!(t.contains("libfifo.so+0x1000") && t.contains("zero+0x1000"), "{t}");
}

/// A profile as large as a big program's (here 400k context nodes and 120k
/// pairs) renders in seconds, in memory proportional to it: before, every
/// pair's two contexts were symbolized and keyed frame by frame, and a 130 MB
/// profile took minutes and tens of GB.
#[test]
fn a_large_profile_renders_in_seconds_within_bounded_memory() {
    let fx = fixture();
    let dir = scratch("big");
    let p = big_profile(fx, 4, 100_000, 30_000);
    let path = save_in(&dir, &p, "big.witch");
    let mb = std::fs::metadata(&path).unwrap().len() >> 20;
    for args in [vec!["report", path.to_str().unwrap()], vec!["diff", path.to_str().unwrap(), path.to_str().unwrap()]] {
        let (o, took) = witch_limited(&args, 60, 1 << 30).unwrap_or_else(|| panic!("witch {args:?} on a {mb} MB profile took over 60 s"));
        assert!(o.status.success(), "witch {args:?} on a {mb} MB profile failed in 1 GiB of address space: {}", stderr(&o));
        eprintln!("witch {} on a {mb} MB profile: {took:.1?}", args[0]);
    }
}

/// The report starts with the program's own lines, each with the lines that
/// killed it, and `--top` limits that table; JSON keeps every line and pair.
#[test]
fn summary_of_own_lines_with_their_killers_comes_first() {
    let fx = fixture();
    let path = save(&profile(fx, 0, BASE), "summary.witch");
    let l = &fx.line;
    let o = witch(["report".as_ref(), path.as_os_str()]);
    let t = stdout(&o);
    let lines: Vec<&str> = t.lines().collect();
    let at = |needle: &str| lines.iter().position(|x| x.contains(needle)).unwrap_or_else(|| panic!("no {needle:?} in\n{t}"));
    let init = at(&format!("app.c:{} init", l["INIT_STORE"]));
    assert!(lines[init].trim_start().starts_with("88.9%"), "{}", lines[init]);
    assert!(lines[init + 1].contains(&format!("killed by app.c:{} poke", l["POKE_STORE"])), "{}", lines[init + 1]);
    let poke =
        lines.iter().position(|x| x.trim_start().starts_with("11.1%") && x.contains(&format!("app.c:{} poke", l["POKE_STORE"]))).unwrap();
    assert!(init < poke && poke < at("#1 "), "summary first, then the pairs:\n{t}");
    assert!(lines[poke + 1].contains("killed by the same line"), "{}", lines[poke + 1]);

    // --top limits the table.
    let o = witch(["report".as_ref(), path.as_os_str(), "--top".as_ref(), "1".as_ref()]);
    let t = stdout(&o);
    assert!(t.contains("(top 1 of 2; --top N for more)") && !t.contains(&format!("app.c:{} poke  ", l["POKE_STORE"])), "{t}");

    // JSON keeps every line, with its partners and intervals.
    let o = witch(["report".as_ref(), path.as_os_str(), "--json".as_ref()]);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let lines = v["lines"].as_array().unwrap();
    assert_eq!(lines.len(), 2, "the watch lines, init's and poke's: {lines:?}");
    assert_eq!(lines[1]["partners"][1]["function"], "sum", "poke's stores are used by sum: {:?}", lines[1]);
    assert_eq!(lines[1]["partners"][1]["use"], 300.0);
    assert_eq!((lines[0]["function"].as_str(), lines[0]["line"].as_u64()), (Some("init"), Some(l["INIT_STORE"] as u64)));
    assert_eq!(lines[0]["waste"], 800.0);
    assert_eq!(lines[0]["partners"][0]["function"], "poke");
    assert!((lines[0]["share"].as_f64().unwrap() - 800.0 / 900.0).abs() < 1e-12);
    let ci = lines[0]["share_ci"].as_array().unwrap();
    assert!(ci[0].as_f64().unwrap() <= 800.0 / 900.0 && ci[1].as_f64().unwrap() >= 800.0 / 900.0);
    assert_eq!(v["pairs"].as_array().unwrap().len(), 3);
    assert_eq!(v["pair_count"], 3);
}

/// Pairs resting on few traps say so, in text and JSON.
#[test]
fn pairs_resting_on_few_traps_are_marked() {
    let fx = fixture();
    let path = save(&few_traps(profile(fx, 0, BASE), 3), "few.witch");
    let t = stdout(&witch(["report".as_ref(), path.as_os_str()]));
    let w = words(&t);
    assert!(w.contains("few traps: uncertain") && w.contains("~ fewer than 10 traps"), "{t}");
    let v: Value = serde_json::from_str(&stdout(&witch(["report".as_ref(), path.as_os_str(), "--json".as_ref()]))).unwrap();
    assert_eq!(v["pairs"][0]["few_traps"], true);
    let path = save(&profile(fx, 0, BASE), "many.witch");
    let v: Value = serde_json::from_str(&stdout(&witch(["report".as_ref(), path.as_os_str(), "--json".as_ref()]))).unwrap();
    assert_eq!(v["pairs"][0]["few_traps"], false);
}

/// Escape sequences in a profile's strings reach the terminal as text, not as
/// commands to it.
#[test]
fn terminal_escapes_in_a_profile_are_shown_not_obeyed() {
    let fx = fixture();
    let mut p = profile(fx, 0, BASE);
    p.program = "/tmp/\x1b[2J\x1b]0;pwned\x07app".into();
    p.notes = vec!["\x1b[31mred\x1b[0m".into()];
    let path = save(&p, "escapes.witch");
    for args in [vec!["report"], vec!["gate", "--max-waste", "50"]] {
        let mut a: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
        a.push(path.clone().into());
        let o = witch(&a);
        let out = [o.stdout.clone(), o.stderr.clone()].concat();
        assert!(!out.iter().any(|&b| b == 0x1b || b == 0x07), "{args:?}: raw control bytes in {:?}", String::from_utf8_lossy(&out));
        assert!(String::from_utf8_lossy(&out).contains("\\e[2J"), "{args:?}: {}", String::from_utf8_lossy(&out));
    }
    let o = witch(["diff".as_ref(), path.as_os_str(), path.as_os_str()]);
    assert!(!o.stdout.contains(&0x1b), "diff: {}", stdout(&o));
}

/// `--pprof-leaf watch` puts the dead store at the leaf, so pprof's `-top`
/// ranks dead stores; the default keeps the killer there.
#[test]
fn pprof_leaf_watch_puts_the_dead_store_at_the_leaf() {
    use prost::Message;
    use std::io::Read;
    let fx = fixture();
    let path = save(&profile(fx, 0, BASE), "leaf.witch");
    let out = fx.dir.join("leaf.pb.gz");
    let o = witch(["report".as_ref(), path.as_os_str(), "--pprof".as_ref(), out.as_os_str(), "--pprof-leaf".as_ref(), "watch".as_ref()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&out).unwrap()).read_to_end(&mut raw).unwrap();
    let p = pb::PprofProfile::decode(&*raw).unwrap();
    let s = |i: i64| p.string_table[i as usize].as_str();
    let fname = |fid: u64| s(p.function.iter().find(|f| f.id == fid).unwrap().name).to_string();
    let stack = |smp: &pb::Sample| -> Vec<String> {
        smp.location_id
            .iter()
            .flat_map(|id| p.location.iter().find(|l| l.id == *id).unwrap().line.iter().map(|l| fname(l.function_id)))
            .collect()
    };
    let want: Vec<&str> = vec!["init", "main", "KILLS", "poke", "fill", "main"];
    let got: i64 = p.sample.iter().filter(|x| stack(x) == want).map(|x| x.value[0]).sum();
    assert_eq!(got, 800, "init's dead stores at the leaf, killed by fill");
    let waste: i64 = p.sample.iter().map(|x| x.value[0]).sum();
    assert_eq!(waste, 900);
}

/// `--flamegraph` (and `--pprof`) onto a disk that fills: the error named
/// no file and an empty SVG was left. Now the error names the file, and
/// nothing is left (neither the file nor a temporary one beside it). A
/// full disk is played by a file size limit (`ulimit -f`, SIGXFSZ
/// ignored): the same failed write.
#[test]
fn flamegraph_on_a_full_disk_names_the_file_and_leaves_nothing() {
    use std::os::unix::process::CommandExt;
    let fx = fixture();
    let dir = scratch("full-disk");
    let path = save_in(&dir, &profile(fx, 0, BASE), "full.witch");
    for (flag, name) in [("--flamegraph", "out.svg"), ("--pprof", "out.pb.gz")] {
        let out = dir.join(name);
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_witch"));
        cmd.args(["report".as_ref(), path.as_os_str(), flag.as_ref(), out.as_os_str()]);
        // SAFETY: setrlimit and signal are async-signal-safe; nothing else runs before exec.
        unsafe {
            cmd.pre_exec(|| {
                let lim = libc::rlimit { rlim_cur: 100, rlim_max: 100 };
                libc::setrlimit(libc::RLIMIT_FSIZE, &lim);
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                Ok(())
            });
        }
        let o = cmd.output().unwrap();
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{flag}: {e}");
        assert!(e.starts_with("witch: cannot write ") && e.contains(&out.display().to_string()) && e.lines().count() == 1, "{flag}: {e}");
        let left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "full.witch")
            .collect();
        assert!(left.is_empty(), "{flag}: left behind: {left:?}");
    }
}

/// `witch report` out of memory (here an address-space limit under a 60 MB
/// profile) aborted with status 134 and a backtrace; it exits 2 with one line.
#[test]
fn report_out_of_memory_exits_2_with_one_line() {
    let fx = fixture();
    let dir = scratch("oom");
    let mut p = profile(fx, 0, BASE);
    p.args = vec!["x".repeat(60 << 20)];
    let path = save_in(&dir, &p, "big.witch");
    let (o, _) = witch_limited(&["report".as_ref(), path.as_os_str()], 60, 120 << 20).expect("witch report ended");
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "status {:?}: {e}", o.status);
    assert!(e.starts_with("witch: out of memory") && e.lines().count() == 1, "{e}");
}

/// `report`, `gate` and `diff` on a FIFO nobody opens for writing blocked
/// for ever; they now wait a while (10 s; here, by the testing knob, 1 s)
/// and fail with one line. A FIFO that is written meanwhile is read.
#[test]
fn report_gate_diff_on_a_fifo_without_a_writer_end() {
    let fx = fixture();
    let dir = scratch("fifo-profile");
    let good = save_in(&dir, &profile(fx, 0, BASE), "good.witch");
    let fifo = dir.join("fifo.witch");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let runs: [Vec<&std::ffi::OsStr>; 3] = [
        vec!["report".as_ref(), fifo.as_os_str()],
        vec!["gate".as_ref(), "--max-waste".as_ref(), "90".as_ref(), fifo.as_os_str()],
        vec!["diff".as_ref(), good.as_os_str(), fifo.as_os_str()],
    ];
    let limited = |args: &[&std::ffi::OsStr]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_witch"));
        cmd.args(args).env("WITCH_FIFO_WAIT_MS", "1000");
        let mut child = cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
        let start = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if start.elapsed() > std::time::Duration::from_secs(20) {
                let _ = child.kill();
                panic!("{args:?} still blocked after 20 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        child.wait_with_output().unwrap()
    };
    for args in &runs {
        let o = limited(args);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert!(e.contains("fifo.witch: a FIFO nobody opened for writing") && e.lines().count() == 1, "{args:?}: {e}");
    }
    // A writer that comes is waited for.
    let bytes = std::fs::read(&good).unwrap();
    let f2 = fifo.clone();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        std::fs::write(&f2, bytes).unwrap();
    });
    let o = limited(&runs[0]);
    writer.join().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("witch dead: "), "{}", stdout(&o));
}

/// A program started through a wrapper (`env`, a version manager's shim):
/// the run's profile holds the wrapper first, without samples, then the
/// program. Every output tells the program's story: the text's header,
/// pprof's file (its first mapping) and duration, the flame graph's waste
/// fraction; the processes without findings are listed once by name.
#[test]
fn a_wrapper_started_program_is_one_story() {
    let fx = fixture();
    let program = profile(fx, 0, BASE);
    let mut wrapper = skeleton(
        Craft::Dead,
        "/usr/bin/env",
        vec![Module { path: "/usr/bin/env".into(), build_id: None, start: 0x1000, end: 0x2000, bias: 0 }],
        vec![],
    );
    wrapper.pid = 10;
    wrapper.duration_ns = 2_230_000;
    let mut shells = Vec::new();
    for i in 0..3 {
        let mut s = skeleton(Craft::Dead, "/bin/sh", vec![], vec![]);
        s.pid = 20 + i;
        shells.push(s);
    }
    let mut run = wrapper;
    run.processes.push(program);
    run.processes.extend(shells);
    let path = save(&run, "wrapper.witch");
    let pb = fx.dir.join("wrapper.pb.gz");
    let svg = fx.dir.join("wrapper.svg");
    let o = witch(["report".as_ref(), path.as_os_str(), "--pprof".as_ref(), pb.as_os_str(), "--flamegraph".as_ref(), svg.as_os_str()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let all = words(&text);
    let head = all.split("Waste fraction").next().unwrap();
    assert!(head.starts_with(&format!("witch dead: {} (pid 4242", fx.bin.display())), "{text}");
    assert!(head.contains("1.50 s") && head.contains("5 processes, 1 with findings"), "{head}");
    assert!(text.contains("Waste fraction: 75.0%"), "{text}");
    assert!(all.contains("4 without findings: env 10, sh ×3"), "{text}");
    assert!(!text.contains("no samples were taken"), "the program took samples:\n{text}");
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.contains("waste fraction 75.0%") && s.contains(&fx.bin.display().to_string()), "the SVG's title and fraction");
    // pprof: the program's mapping first (viewers name the profile after
    // it), its duration, and the waste it shows is the report's.
    use flate2::read::GzDecoder;
    use prost::Message;
    use std::io::Read;
    let mut raw = Vec::new();
    GzDecoder::new(std::fs::File::open(&pb).unwrap()).read_to_end(&mut raw).unwrap();
    let p = witchd::render::pprof::PprofProfile::decode(raw.as_slice()).unwrap();
    let first = &p.string_table[p.mapping[0].filename as usize];
    assert_eq!(first, &fx.bin.display().to_string());
    assert_eq!(p.duration_nanos, 1_500_000_000);
    let waste: i64 = p.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(waste, 900);
}

/// pprof's values are integers: a profile of many small estimates (each
/// under a byte) totals what the report says, not each one rounded up.
#[test]
fn pprof_totals_agree_with_the_report() {
    let fx = fixture();
    let small = PairBytes { init_fill: (0.6, 0.6), fill_fill: 0.6, fill_sum_use: 0.6, sum_init: 0.6 };
    let path = save(&profile(fx, 0, small), "small.witch");
    let pb = fx.dir.join("small.pb.gz");
    let o = witch(["report".as_ref(), path.as_os_str(), "--pprof".as_ref(), pb.as_os_str(), "--json".as_ref()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let want = v["waste"].as_f64().unwrap();
    use flate2::read::GzDecoder;
    use prost::Message;
    use std::io::Read;
    let mut raw = Vec::new();
    GzDecoder::new(std::fs::File::open(&pb).unwrap()).read_to_end(&mut raw).unwrap();
    let p = witchd::render::pprof::PprofProfile::decode(raw.as_slice()).unwrap();
    let waste: i64 = p.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(waste, want.round() as i64, "pprof's total waste vs the report's {want}");
    assert_eq!(p.string_table[p.sample_type[0].unit as usize], "byte·ns");
}
