//! LoadCraft end to end (witch silent-load): tests/programs/redundant_load.c,
//! whose header says what is expected and why.

use witch_tests::*;

const PERIOD: &str = "100000";

fn load_run(prog: &Program, dir: &Scratch, mode: &str) -> Report {
    let native = prog.run_native(&[mode]);
    assert_eq!(native.code(), Some(3), "native run:\n{}", native.describe());
    let out = dir.join(&format!("{mode}.json"));
    let run = WitchCmd::new("silent-load").args(&["-p", PERIOD, "-q"]).out(&out).run(&prog.exe, &[mode]);
    assert_same_behaviour(&native, &run);
    let rep = report(&out);
    assert_eq!(rep.craft(), "silent-load", "{}", rep.dump());
    rep.assert_samples(200.0);
    rep
}

#[test]
fn loading_an_unchanged_array_is_redundant() {
    let dir = Scratch::new("load-same");
    let prog = Program::build("redundant_load", dir.path());
    let l = prog.line("@load");
    let f = &prog.file;
    let rep = load_run(&prog, &dir, "same");
    let wf = rep.waste_fraction();
    let pair = rep.pair(f, l, l);
    let from = rep.watched_at(f, l);
    let own = pair.waste / (from.waste + from.r#use).max(f64::MIN_POSITIVE);
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
