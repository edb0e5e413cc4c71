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
