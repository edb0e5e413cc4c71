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
    assert_eq!(v["schema"], 1);
    assert_eq!(v["craft"], "dead");
    assert_eq!(v["program"], fx.bin.display().to_string());
    assert_eq!(v["sampler"]["kind"], "software");
    assert_eq!(v["sampler"]["event"], "task-clock");
    assert_eq!(v["sampler"]["period"], 100_000);
    assert_eq!(v["samples"], 50);
    assert_eq!(v["traps"], 35);
    assert_eq!(v["waste_bytes"], 900.0);
    assert_eq!(v["use_bytes"], 300.0);
    assert_eq!(v["approx_waste_bytes"], 0.0);
    assert!((v["waste_fraction"].as_f64().unwrap() - 0.75).abs() < 1e-12);

    let pairs = v["pairs"].as_array().unwrap();
    // Thread 1's and thread 2's init→fill pairs merged: 3 source-level pairs.
    assert_eq!(pairs.len(), 3);
    assert_eq!(v["pair_count"], 3);
    let wastes: Vec<f64> = pairs.iter().map(|p| p["waste_bytes"].as_f64().unwrap()).collect();
    assert_eq!(wastes, vec![800.0, 100.0, 0.0], "sorted by waste");
    assert!((pairs[0]["share"].as_f64().unwrap() - 800.0 / 900.0).abs() < 1e-12);
    assert!((pairs[1]["share"].as_f64().unwrap() - 100.0 / 900.0).abs() < 1e-12);
    assert_eq!(pairs[2]["use_bytes"], 300.0);
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
    assert_eq!(v["waste_bytes"], 900.0);
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
        // Paths are shown relative to the current directory when under it.
        let t2 = t.replace(&format!("{}/", fx.dir.display()), "");
        assert!(t2.contains(&want), "missing {want:?} in\n{t}");
    }
    // Top-down: the biggest pair comes first; the use-only pair is not listed as waste.
    let i = t.find("88.9% of all waste").unwrap();
    let j = t.find("11.1% of all waste").unwrap();
    assert!(i < j);
    assert!(t.contains("Top 2 of 2 pairs"));
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
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
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
    let p = pb::Profile::decode(&*raw).unwrap();
    let s = |i: i64| p.string_table[i as usize].as_str();
    let types: Vec<(&str, &str)> = p.sample_type.iter().map(|t| (s(t.r#type), s(t.unit))).collect();
    assert_eq!(types, vec![("waste", "bytes"), ("use", "bytes")]);
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
    let o = witch(["report".as_ref(), path.as_os_str(), "--folded".as_ref()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<String> = stdout(&o).lines().map(str::to_string).collect();
    assert!(lines.contains(&"main;init;KILLED_BY;main;fill;poke 800".to_string()), "{lines:?}");
    assert!(lines.contains(&"main;fill;poke;KILLED_BY;main;fill;poke 100".to_string()), "{lines:?}");
    assert_eq!(lines.len(), 2, "use-only pairs have no waste to draw");

    let svg = fx.dir.join("out.svg");
    let _ = std::fs::remove_file(&svg);
    let o = witch(["report".as_ref(), path.as_os_str(), "--flamegraph".as_ref(), svg.as_os_str()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.starts_with("<?xml") && s.contains("<svg"));
    assert!(s.contains("init") && s.contains("KILLED_BY"));
    // The report is still printed.
    assert!(stdout(&o).contains("Waste fraction"));
}
