//! Which code a report's summary blames: the program's own, the innermost
//! frame outside the C and language runtimes, with or without source lines
//! (tests/programs/nolines_lib.c, nolines_host.c).
//!
//! A distribution's program and its libraries come without line info; the
//! C library's comes with it once its debug package is installed. The
//! summary must then name the library's functions, not the C library's
//! `memset` or its start-up code around `main`, which are the only frames
//! with lines.

use witch_tests::*;

/// Sampling period (ns of CPU time for the software sampler).
const PERIOD: &str = "100000";

/// The library (-g0, beside the host) and the host (-g0, RUNPATH $ORIGIN).
fn build(dir: &Scratch) -> Program {
    Program::build_with("nolines_lib", dir.path(), "libnolines.so", &["-shared", "-fPIC", "-g0"]).unwrap_or_else(|e| panic!("{e}"));
    let lib_dir = format!("-L{}", dir.path().display());
    Program::build_with(
        "nolines_host",
        dir.path(),
        "nolines_host",
        &["-g0", &lib_dir, "-lnolines", "-Wl,--enable-new-dtags,-rpath,$ORIGIN"],
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn without_line_info_the_summary_names_the_programs_functions() {
    let dir = Scratch::new("sites-nolines");
    let host = build(&dir);
    let (_, rep) = craft_run("dead", &host, &dir, "dead", &[], &["-p", PERIOD]);
    // The premise: the C library's frames have lines here (its debug info
    // is installed, as .ci/run does) and the library's have none.
    let frames_of = |pred: &dyn Fn(&serde_json::Value) -> bool| {
        rep.pairs().iter().flat_map(|p| frames(p, "watch").iter().chain(frames(p, "trap"))).any(pred)
    };
    let module = |f: &serde_json::Value| f["module"].as_str().unwrap_or("").to_string();
    assert!(
        frames_of(&|f| module(f).contains("libc.so") && frame_line(f).is_some()),
        "no frame of the C library has a line: install its debug info (libc6-dbg)\n{}",
        rep.dump()
    );
    assert!(!frames_of(&|f| module(f).ends_with("libnolines.so") && frame_line(f).is_some()), "the library has lines\n{}", rep.dump());

    // The summary's lines, in JSON: the library's two functions, first, by
    // function (each one row however many instructions were sampled).
    let lines = rep.json["lines"].as_array().expect("lines");
    let first: Vec<&str> = lines.iter().take(2).map(|l| l["function"].as_str().unwrap_or("")).collect();
    let mut sorted = first.clone();
    sorted.sort();
    assert_eq!(sorted, ["scrub_table", "stamp_table"], "{}", rep.dump());
    for l in lines.iter().take(2) {
        assert!(l["module"].as_str().unwrap().ends_with("libnolines.so") && l["line"].is_null(), "{l}");
    }
    let scrub = lines.iter().find(|l| l["function"] == "scrub_table").unwrap();
    assert!(scrub["via"].as_str().is_some_and(|v| v.contains("memset")), "scrub_table's waste goes through memset: {scrub}");
    let rows = |f: &str| lines.iter().filter(|l| l["function"] == f).count();
    assert_eq!((rows("scrub_table"), rows("stamp_table")), (1, 1), "{}", rep.dump());

    // The text: its first row names the library's function, and it says
    // what debug info would give.
    let text = witch_raw(&["report".as_ref(), rep.path.as_os_str()]);
    assert!(text.status.success(), "{}", text.describe());
    let out = text.stdout_str();
    let table: Vec<&str> = out.lines().skip_while(|l| !l.trim_start().starts_with("share")).skip(1).collect();
    let row = table.first().copied().unwrap_or("");
    assert!(
        (row.contains("scrub_table") || row.contains("stamp_table")) && row.contains("libnolines.so"),
        "the first row should name a function of libnolines.so:\n{out}"
    );
    let flat = out.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains("no source lines in libnolines.so"), "the report should say where lines are missing:\n{out}");
    assert!(flat.contains("debug info"), "{out}");
}
