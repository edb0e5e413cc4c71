//! LoadCraft end to end (witch silent-load): tests/programs/redundant_load.c,
//! whose header says what is expected and why.

use witch_tests::*;

const PERIOD: &str = "100000";

fn load_run(prog: &Program, dir: &Scratch, mode: &str) -> Report {
    craft_run("silent-load", prog, dir, mode, &[mode], &["-p", PERIOD]).1
}

#[test]
fn loading_an_unchanged_array_is_redundant() {
    let dir = Scratch::new("load-same");
    let prog = Program::build("redundant_load", dir.path());
    let l = prog.line("@load");
    let f = &prog.file;
    let rep = load_run(&prog, &dir, "same");
    let wf = rep.waste_fraction();
    let (own, pair, _) = rep.own_fraction(f, l, l);
    rep.note(&format!("<{l},{l}> own fraction {own:.3}, rank {:?}", pair.best_rank));
    assert!(wf >= 0.90, "waste fraction {wf:.3} should be >= 0.90: every pass loads the same values again\n{}", rep.dump());
    assert!(
        own >= 0.90 && pair.best_rank == Some(0),
        "<{f}:{l}, {f}:{l}> should be the top pair with >= 90% of what the loads at line {l} are worth; \
         got {own:.3}, rank {:?}\n{}",
        pair.best_rank,
        rep.dump()
    );
}

#[test]
fn loading_a_changing_array_is_not_redundant() {
    let dir = Scratch::new("load-change");
    let prog = Program::build("redundant_load", dir.path());
    let rep = load_run(&prog, &dir, "change");
    let wf = rep.waste_fraction();
    rep.note("want waste_fraction <= 0.10");
    assert!(
        wf <= 0.10,
        "waste fraction {wf:.3} should be <= 0.10: the array is rewritten with new values between passes \
         (the rewrite's stores trap and must be ignored, not counted)\n{}",
        rep.dump()
    );
}
