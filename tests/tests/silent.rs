//! SilentCraft end to end (witch silent-store): tests/programs/silent_store.c
//! and silent_float.c, whose headers say what is expected and why.

use witch_tests::*;

const PERIOD: &str = "100000";

fn silent_run(prog: &Program, dir: &Scratch, tag: &str, args: &[&str], opts: &[&str]) -> Report {
    let opts: Vec<&str> = ["-p", PERIOD].iter().chain(opts).copied().collect();
    craft_run("silent-store", prog, dir, tag, args, &opts).1
}

#[test]
fn rewriting_the_same_values_is_silent() {
    let dir = Scratch::new("silent-same");
    let prog = Program::build("silent_store", dir.path());
    let s = prog.line("@store");
    let f = &prog.file;
    let rep = silent_run(&prog, &dir, "same", &["same"], &[]);
    let wf = rep.waste_fraction();
    let (own, pair, _) = rep.own_fraction(f, s, s);
    rep.note(&format!("<{s},{s}> own fraction {own:.3}, rank {:?}", pair.best_rank));
    assert!(wf >= 0.90, "waste fraction {wf:.3} should be >= 0.90: every rep stores the values already there\n{}", rep.dump());
    assert!(
        own >= 0.90 && pair.best_rank == Some(0),
        "<{f}:{s}, {f}:{s}> should be the top pair with >= 90% of what the stores at line {s} are worth; \
         got {own:.3}, rank {:?}\n{}",
        pair.best_rank,
        rep.dump()
    );
}

#[test]
fn changing_values_are_not_silent() {
    let dir = Scratch::new("silent-change");
    let prog = Program::build("silent_store", dir.path());
    let rep = silent_run(&prog, &dir, "change", &["change"], &[]);
    let wf = rep.waste_fraction();
    rep.note("want waste_fraction <= 0.10");
    assert!(wf <= 0.10, "waste fraction {wf:.3} should be <= 0.10: every store changes the value\n{}", rep.dump());
}

#[test]
fn float_within_precision_is_approximately_silent() {
    let dir = Scratch::new("silent-float");
    let prog = Program::build("silent_float", dir.path());
    let s = prog.line("@fstore");
    let f = &prog.file;
    let rep = silent_run(&prog, &dir, "float", &[], &[]);
    let wf = rep.waste_fraction();
    let (waste, approx) = (rep.waste(), rep.approx_waste());
    let approx_part = if waste > 0.0 { approx / waste } else { 0.0 };
    rep.note(&format!("approximate part {approx_part:.3} (want >= 0.9), waste_fraction want >= 0.8"));
    assert!(
        wf >= 0.80 && approx_part >= 0.90,
        "values change by < 0.1% per rep: at the default --fp-precision 0.01 the waste fraction should be >= 0.80 \
         (got {wf:.3}) and >= 90% of the waste approximate (got {approx_part:.3} = {approx:.4e} / {waste:.4e})\n{}",
        rep.dump()
    );
    let pair = rep.pair(f, s, s);
    assert!(pair.best_rank == Some(0), "<{f}:{s}, {f}:{s}> should be the top pair; {pair:?}\n{}", rep.dump());
}

#[test]
fn float_at_precision_zero_is_not_silent() {
    let dir = Scratch::new("silent-float0");
    let prog = Program::build("silent_float", dir.path());
    let rep = silent_run(&prog, &dir, "float0", &[], &["--fp-precision", "0"]);
    let wf = rep.waste_fraction();
    rep.note("--fp-precision 0: want waste_fraction <= 0.10");
    assert!(
        wf <= 0.10,
        "with --fp-precision 0 the float stores (which always change the value) should not be silent: \
         waste fraction {wf:.3}, want <= 0.10\n{}",
        rep.dump()
    );
}

/// The whole report (`--top 0`: every pair).
fn report_all(profile: &std::path::Path) -> Report {
    let r = witch_raw(&[std::ffi::OsStr::new("report"), profile.as_os_str(), "--json".as_ref(), "--top".as_ref(), "0".as_ref()]);
    assert!(r.status.success(), "witch report failed:\n{}", r.describe());
    let json = serde_json::from_slice(&r.stdout).unwrap_or_else(|e| panic!("not JSON: {e}\n{}", r.describe()));
    Report { json, path: profile.to_path_buf() }
}

/// Silent-store fraction over the program's own stores and the C library's
/// memset (where the wide stores are).
fn own_and_memset(rep: &Report) -> f64 {
    let keep = |p: &serde_json::Value| {
        frames(p, "watch").first().and_then(|f| f["file"].as_str()).is_some_and(|f| f.ends_with("wide_stores.c") || f.contains("memset"))
    };
    let s = rep.sum_where(keep);
    s.waste / (s.waste + s.r#use).max(f64::MIN_POSITIVE)
}

/// Vector stores are watched through a randomly chosen element and compared
/// there only, so the sampled fraction estimates the exact one (96.9% by
/// construction) instead of calling every memset silent or none.
#[test]
fn wide_stores_are_judged_by_a_fair_element() {
    let dir = Scratch::new("silent-wide");
    let prog = Program::build("wide_stores", dir.path());
    let out = dir.join("exact.json");
    let run = WitchCmd::new("silent-store").args(&["--exact", "-q"]).out(&out).run(&prog.exe, &["3"]);
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    let exact = own_and_memset(&report_all(&out));
    assert!((exact - 63.0 / 65.0).abs() < 0.02, "exact silent fraction {exact:.3}, by construction 0.969");

    let native = prog.run_native(&[]);
    let out = dir.join("sampled.json");
    // Ticks every 0.5 ms of CPU time: the program runs 75-100 ms, and a
    // window at each 1 ms tick took 62-131 picks a run, near the 100 asked.
    let run = WitchCmd::new("silent-store").args(&["-p", "500000", "-q"]).out(&out).run(&prog.exe, &[]);
    assert_same_behaviour(&native, &run);
    let rep = report_all(&out);
    rep.assert_samples(100.0);
    let sampled = own_and_memset(&rep);
    rep.note(&format!("sampled {sampled:.3}, exact {exact:.3}"));
    assert!((sampled - exact).abs() <= 0.05, "sampled silent fraction {sampled:.3}, exact {exact:.3}\n{}", rep.dump());
}
