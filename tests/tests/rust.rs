//! A Rust program, built by rustc as Rust programs are: with lld, whose
//! segments are not page-aligned in the file. Sampling, precise trap PCs,
//! unwinding and source lines all depend on each module's load bias, which
//! used to come out 4 KiB off for such a layout (every trap imprecise, no
//! pairs).

use witch_tests::*;

#[test]
fn rust_program_dead_stores_with_full_contexts() {
    let dir = Scratch::new("rust-dead");
    let prog = Program::build_rust("rust_dead", dir.path());
    let (w, k) = (prog.line("@w"), prog.line("@k"));
    let f = &prog.file;
    let native = prog.run_native(&[]);
    assert_eq!(native.code(), Some(3), "native run:\n{}", native.describe());
    let out = dir.join("rust.json");
    let run = WitchCmd::new("dead").args(&["-p", "100000", "-q"]).out(&out).run(&prog.exe, &[]);
    assert_same_behaviour(&native, &run);

    let raw = raw_profile(&out);
    let c = &raw["counters"];
    let (traps, imprecise) = (c["traps"].as_u64().unwrap_or(0), c["imprecise"].as_u64().unwrap_or(0));
    assert!(traps >= 100 && imprecise * 20 <= traps, "traps should be placed precisely: {c}");

    let rep = report(&out);
    rep.assert_samples(200.0);
    let (own, pair, _) = rep.own_fraction(f, w, k);
    assert!(
        own >= 0.90 && pair.best_rank.is_some_and(|r| r < 2),
        "<{f}:{w}, {f}:{k}> should be a top-two pair with >= 90% of what the stores at line {w} are worth; \
         got {own:.3}, rank {:?}\n{}",
        pair.best_rank,
        rep.dump()
    );
    // The watch context goes up through pass and run to main.
    let top = rep.pairs().iter().find(|p| side_at(p, "watch", f, w)).expect("a pair watched at @w").clone();
    let names: Vec<&str> = frames(&top, "watch").iter().filter_map(|fr| fr["function"].as_str()).collect();
    for want in ["rust_dead::first", "rust_dead::pass", "rust_dead::run", "rust_dead::main"] {
        assert!(names.iter().any(|n| n.contains(want)), "{want} missing from the watch context {names:?}");
    }
}
