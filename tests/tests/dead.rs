//! DeadCraft end to end: programs whose dead stores are known by construction
//! (tests/programs/dead_loop.c, store_load.c, listing_4_2.c, listing_4_3.c,
//! figure_4_2.c; each file's header says what is expected and why).
//!
//! The sampler here is whatever witch chooses; on machines without a memory
//! PMU that is the task-clock sampler and `-p` is nanoseconds of thread CPU
//! time. Each program runs ~0.3 s natively, which at -p 100000 is ~3000
//! interrupts, ~95% of them on a store.

use witch_tests::*;

/// Sampling period (ns of CPU time for the software sampler).
const PERIOD: &str = "100000";

/// Build, run natively, run under `witch dead` with `-q -o`, compare
/// behaviour, and load the report.
fn dead_run(prog: &Program, dir: &Scratch, tag: &str, opts: &[&str]) -> (Run, Report) {
    craft_run("dead", prog, dir, tag, &[], opts)
}

#[test]
fn overwritten_loop_is_dead() {
    let dir = Scratch::new("dead-loop");
    let prog = Program::build("dead_loop", dir.path());
    let (w, k) = (prog.line("@w"), prog.line("@k"));
    let native = prog.run_native(&[]);
    assert_eq!(native.code(), Some(3), "native run:\n{}", native.describe());

    // No -q: the report goes to stderr and the program's stdout stays identical.
    let out = dir.join("dead.json");
    let run = WitchCmd::new("dead").args(&["-p", PERIOD]).out(&out).run(&prog.exe, &[]);
    assert_same_behaviour(&native, &run);
    assert!(!run.stderr.is_empty(), "expected the report on stderr:\n{}", run.describe());

    let rep = report(&out);
    rep.assert_samples(200.0);
    let f = &prog.file;
    let (_, pair) = rep.assert_own_fraction(f, w, k, 0.90, "");
    assert!(
        pair.best_rank.is_some_and(|r| r < 2),
        "<{f}:{w}, {f}:{k}> should be one of the top two pairs (the other is <{k},{w}>); rank {:?}\n{}",
        pair.best_rank,
        rep.dump()
    );
    let wf = rep.waste_fraction();
    assert!(wf >= 0.90, "waste fraction {wf:.3} should be >= 0.90: all but the last rep's stores are dead\n{}", rep.dump());

    // The innermost frames point at the exact lines (the loops are one line each,
    // so whatever instruction of the loop is blamed, the line is right).
    let p = rep.first_pair(f, w, k).unwrap();
    let (wf0, tf0) = (&frames(p, "watch")[0], &frames(p, "trap")[0]);
    assert!(
        frame_in_file(wf0, f) && frame_line(wf0) == Some(w as u64) && frame_in_file(tf0, f) && frame_line(tf0) == Some(k as u64),
        "innermost frames of the top dead pair should be {f}:{w} and {f}:{k}; got {wf0} and {tf0}\n{}",
        rep.dump()
    );
}

#[test]
fn store_then_load_is_not_dead() {
    let dir = Scratch::new("store-load");
    let prog = Program::build("store_load", dir.path());
    let (st, ld) = (prog.line("@st"), prog.line("@ld"));
    let (_, rep) = dead_run(&prog, &dir, "store_load", &["-p", PERIOD]);
    let wf = rep.waste_fraction();
    rep.note("want waste_fraction <= 0.05");
    assert!(wf <= 0.05, "waste fraction {wf:.3} should be <= 0.05: every store is read before it is overwritten\n{}", rep.dump());
    let f = &prog.file;
    let used = rep.pair(f, st, ld);
    let total_use = rep.used();
    assert!(
        total_use > 0.0 && used.r#use >= 0.9 * total_use,
        "<{f}:{st}, {f}:{ld}> should carry >= 90% of the use ({used:?}, total use {total_use})\n{}",
        rep.dump()
    );
}

/// Listing 4.2: found with reservoir replacement, missed with "oldest".
#[test]
fn listing_4_2_reservoir_finds_what_oldest_misses() {
    let dir = Scratch::new("listing-4-2");
    let prog = Program::build("listing_4_2", dir.path());
    let (i, j) = (prog.line("@i"), prog.line("@j"));
    let f = &prog.file;
    // 50 us: ~30 store samples per loop pass over the 8 MB array, so the j loop
    // takes many samples before reaching any address sampled in the i loop.
    let period = "50000";

    let (_, res) = dead_run(&prog, &dir, "reservoir", &["-p", period]);
    let found = res.pair(f, i, j);
    let share = res.share(f, i, j);
    res.note(&format!("reservoir: <{i},{j}> share {share:.3}, rank {:?}", found.best_rank));
    assert!(
        found.waste > 0.0 && share >= 0.2 && found.best_rank.is_some_and(|r| r < 2),
        "reservoir: <{f}:{i}, {f}:{j}> should be a top-two pair with a clear share of the waste \
         (expected ~50%, want >= 20%); got share {share:.3}, {found:?}\n{}",
        res.dump()
    );

    let (_, old) = dead_run(&prog, &dir, "oldest", &["-p", period, "--replacement", "oldest"]);
    let raw = raw_profile(&old.path);
    assert_eq!(raw["replacement"].as_str(), Some("oldest"), "the raw profile should record --replacement oldest");
    let missed = old.pair(f, i, j);
    old.note(&format!(
        "oldest: <{i},{j}> {} traps (reservoir: {}), waste {:.3e} = {:.3} of reservoir's",
        missed.traps,
        found.traps,
        missed.waste,
        missed.waste / found.waste.max(f64::MIN_POSITIVE)
    ));
    // What "oldest" misses is observations. A watchpoint of the i loop
    // outlives the j loop's evictions only when fewer than four picks land
    // in one pass over the array; picks are geometric (about ten a pass, a
    // Poisson count), so that happens now and then (about one run in forty
    // here). Proportional attribution (Witch 4.4.2) then gives that one
    // trap every sample of @i not yet accounted for, so the pair's waste
    // is anywhere from nothing to all of it: a single trap's weight says
    // nothing about how often the policy sees the pair. The count does.
    assert!(
        found.traps >= 20 && missed.traps as f64 <= 0.05 * found.traps as f64,
        "oldest: <{f}:{i}, {f}:{j}> should be (nearly) missed: {} traps found it vs {} with reservoir \
         (want <= 5%, and >= 20 with reservoir)\n--- oldest ---\n{}\n--- reservoir ---\n{}",
        missed.traps,
        found.traps,
        old.dump(),
        res.dump()
    );
}

/// Listing 4.3: sparse (i/j loops) and dense (aliased *p, *q) monitoring.
#[test]
fn listing_4_3_proportional_attribution() {
    let dir = Scratch::new("listing-4-3");
    let prog = Program::build("listing_4_3", dir.path());
    let (l3, l7, l8, l11) = (prog.line("@L3"), prog.line("@L7"), prog.line("@L8"), prog.line("@L11"));
    let (_, rep) = dead_run(&prog, &dir, "listing_4_3", &["-p", PERIOD]);
    let f = &prog.file;
    let expect = [(l3, l11, "<3,11>"), (l11, l3, "<11,3>"), (l7, l8, "<7,8>"), (l8, l7, "<8,7>")];
    let shares: Vec<(String, f64)> = expect.iter().map(|&(w, t, name)| (format!("{name} = <{w},{t}>"), rep.share(f, w, t))).collect();
    rep.note(&format!(
        "shares {:?} (want 25% +- 10 each)",
        shares.iter().map(|(n, s)| format!("{n}: {:.1}%", s * 100.0)).collect::<Vec<_>>()
    ));
    for (name, s) in &shares {
        assert!(
            (s - 0.25).abs() <= 0.10,
            "pair {name} should get 25% +- 10 points of all waste; got {:.1}% (all: {:?}). \
             Natively each of the four stores gets 25% of task-clock interrupts (checked with perf), and \
             proportional attribution makes waste follow the samples per context; if the dense pairs \
             <7,8>/<8,7> are high, look for sampler time spent in witch's own handlers (traps are dense \
             there) being counted and credited where the program resumes\n{}",
            s * 100.0,
            shares.iter().map(|(n, s)| format!("{n}: {:.1}%", s * 100.0)).collect::<Vec<_>>(),
            rep.dump()
        );
    }
}

/// Figure 4.2: a[], b[] and x dead in a 3:2:1 byte ratio.
#[test]
fn figure_4_2_three_two_one() {
    let dir = Scratch::new("figure-4-2");
    let prog = Program::build("figure_4_2", dir.path());
    let (a, b, x) = (prog.line("@a"), prog.line("@b"), prog.line("@x"));
    let (_, rep) = dead_run(&prog, &dir, "figure_4_2", &["-p", PERIOD]);
    let f = &prog.file;
    let got = [("a", a, 3.0 / 6.0), ("b", b, 2.0 / 6.0), ("x", x, 1.0 / 6.0)];
    let shares: Vec<String> = got.iter().map(|&(n, l, _)| format!("{n}: {:.1}%", rep.share(f, l, l) * 100.0)).collect();
    rep.note(&format!("shares {shares:?} (want 50/33.3/16.7% +- 10)"));
    for &(name, line, want) in &got {
        let s = rep.share(f, line, line);
        assert!(
            (s - want).abs() <= 0.10,
            "pair <{name},{name}> (line {line}) should get {:.1}% +- 10 points of all waste; got {:.1}% (all: {shares:?})\n{}",
            want * 100.0,
            s * 100.0,
            rep.dump()
        );
    }
}

/// Vector stores of which the next store overwrites 12 bytes and a load
/// reads the other 4, soon after (tests/programs/vector_index.c): 75% dead
/// by bytes, exactly. The sampled fraction at the store must come close:
/// a watchpoint over a whole aligned piece let the first toucher of any of
/// its bytes decide for all (42% measured); a verdict judged within a
/// burst took the weight of armed samples of the same context too (78.1 to
/// 78.4% in 3 runs), which the unit test of `context::LiveNode::claim` checks.
#[test]
fn vector_stores_are_judged_byte_by_byte() {
    let dir = Scratch::new("dead-vector-index");
    let prog = Program::build("vector_index", dir.path());
    let (st, rd) = (prog.line("@store"), prog.line("@read"));
    let f = &prog.file;
    let fraction_at_store = |rep: &Report| {
        let from = rep.watched_at(f, st);
        from.waste / (from.waste + from.r#use).max(f64::MIN_POSITIVE)
    };

    let out = dir.join("exact.json");
    let native = prog.run_native(&["2"]);
    let run = WitchCmd::new("dead").args(&["--exact", "-q"]).out(&out).run(&prog.exe, &["2"]);
    assert_same_behaviour(&native, &run);
    let exact = report_with(&out, &["--top", "0"]);
    let ef = fraction_at_store(&exact);
    assert!((ef - 0.75).abs() < 0.001, "exact dead fraction at line {st}: {ef:.4}, by construction 0.75\n{}", exact.dump());
    assert!(exact.pair(f, st, rd).r#use > 0.0, "<{st},{rd}>: the first index is read\n{}", exact.dump());

    // The mean of twelve runs, so that the check is of the estimate's bias
    // more than of one run's noise: a run's 310-470 verdicts (900,000
    // rounds; the default 600,000 gave 250-300, and under load once 188,
    // below the 200 every run must have), each dead with probability 3/4,
    // spread it by about 2.2 points (0.6 for the mean; 48 runs measured
    // 2.15 and a mean of 75.4). Eight runs once read 78.0, every one above
    // 75, in a CI run that 48 runs here did not reproduce. The sharing
    // rule is checked exactly by a unit test (`context::tests`); at 3
    // points this catches the piece rule's error.
    let runs: Vec<f64> = (0..12)
        .map(|i| {
            let (_, rep) = craft_run("dead", &prog, &dir, &format!("vector_index-{i}"), &["900000"], &[]);
            let f = fraction_at_store(&rep);
            rep.note(&format!("run {i}: dead fraction at line {st} {f:.3}, exact {ef:.3}"));
            f
        })
        .collect();
    let sampled = runs.iter().sum::<f64>() / runs.len() as f64;
    assert!(
        (sampled - ef).abs() <= 0.03,
        "sampled dead fraction at line {st}, mean of the runs {runs:.3?}: {sampled:.3}; exact {ef:.3} (within 3 points)"
    );
}

/// A run whose time goes to a store-free loop: the software sampler's timer
/// interrupts land away from any store. With single-step bursts (a few
/// instructions from each interrupt) no store is found, and the report must
/// say that, not that the run was shorter than the period. Windows from the
/// code cache run thousands of instructions from each interrupt, so the
/// last ones reach the program's few real stores after the loop (its final
/// store, `printf`): those may be sampled, each standing for what it is (a
/// handful of stores, not the loop's time), and none is at the loop.
#[test]
fn store_free_time_is_explained() {
    let dir = Scratch::new("store-free");
    let prog = Program::build("store_free_loop", dir.path());
    let native = prog.run_native(&[]);
    assert_eq!(native.code(), Some(3), "native run:\n{}", native.describe());
    let out = dir.join("dead.json");
    let run = WitchCmd::new("dead").wrapper(&["env", "WITCH_WINDOW=0"]).args(&["-p", "1000000"]).out(&out).run(&prog.exe, &[]);
    assert_same_behaviour(&native, &run);
    let rep = report(&out);
    if rep.json["sampler"]["kind"].as_str() != Some("software") {
        rep.note("not the software sampler: nothing to check");
        return;
    }
    let err = run.stderr_str().split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(rep.samples() <= 5.0, "a store-free loop should give (almost) no store samples\n{}", rep.dump());
    assert!(
        err.contains("timer interrupts") && !err.contains("shorter than the period"),
        "the report should say the interrupts landed away from stores:\n{err}"
    );
    // The code cache's windows, at the default window length.
    let out = dir.join("dead-windows.json");
    let run = WitchCmd::new("dead").args(&["-p", "1000000"]).out(&out).run(&prog.exe, &[]);
    assert_same_behaviour(&native, &run);
    let rep = report(&out);
    let at_loop = rep.watched_at(&prog.file, prog.line("@loop"));
    assert_eq!(at_loop.waste + at_loop.r#use, 0.0, "a store at the store-free loop?\n{}", rep.dump());
    // The stores found stand for the program's few stores: far less than
    // a megabyte (a store a period of the loop's time would be a thousand
    // times more, as a time-proportional sampler would weigh them).
    // The totals are byte·ns (a window's bytes times the ns its tick
    // stands for): over the period, the bytes the windows saw.
    assert_eq!(rep.json["unit"], "byte·ns", "{}", rep.dump());
    let (waste, used) = (rep.json["waste"].as_f64().unwrap_or(0.0), rep.json["use"].as_f64().unwrap_or(0.0));
    let bytes = (waste + used) / 1e6;
    assert!(bytes < 1e6, "{bytes} bytes of stores (over the 1 ms period) estimated for a program that makes a few hundred\n{}", rep.dump());
}

/// A minor note of the reliability issue: 500 threads that each run far
/// less than a period give no samples, and the report blamed that on the
/// run being shorter than the period (it ran for a while), or on the time
/// going to other code (one timer interrupt says nothing of where it went).
/// It must say that few periods ran, in short threads.
#[test]
fn many_short_threads_without_samples_are_explained() {
    let dir = Scratch::new("short-threads");
    let prog = Program::build("thread_churn", dir.path());
    let native = prog.run_native(&["125", "4"]);
    let out = dir.join("dead.json");
    let run = WitchCmd::new("dead").out(&out).run(&prog.exe, &["125", "4"]);
    assert_same_behaviour(&native, &run);
    let rep = report(&out);
    if rep.json["sampler"]["kind"].as_str() != Some("software") || rep.samples() > 0.0 {
        rep.note("not the software sampler, or a sample after all: nothing to check");
        return;
    }
    let err = run.stderr_str().split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        err.contains("short threads") && !err.contains("shorter than the period") && !err.contains("went to other code"),
        "the report should say that few periods ran, in short threads:\n{err}"
    );
}

/// A run whose samples judged nothing has no waste fraction: the report
/// says it is unknown instead of printing 0.0%, and one resting on few
/// judged samples says they are too few to rely on.
#[test]
fn unknown_and_few_sample_fractions_say_so() {
    let dir = Scratch::new("few-samples");
    let prog = Program::build("half_dead", dir.path());
    // About 1 ms (no tick at all) and about 25 ms of CPU time natively (a
    // few ticks, each judging at most two samples: fewer than 30).
    for (name, args) in [("none", ["64", "3"]), ("few", ["65536", "50"])] {
        let out = dir.join(&format!("{name}.json"));
        let run = WitchCmd::new("dead").out(&out).run(&prog.exe, &args);
        let rep = report(&out);
        let err = run.stderr_str().split_whitespace().collect::<Vec<_>>().join(" ");
        let traps = rep.json["traps"].as_f64().unwrap_or(-1.0);
        assert!((0.0..30.0).contains(&traps), "{name}: {traps} judged samples from a short run:\n{err}");
        if traps == 0.0 {
            assert!(
                err.contains("Waste fraction: unknown") && !err.contains("Waste fraction: 0.0%"),
                "{name}: nothing was judged, so the fraction is unknown, not 0%:\n{err}"
            );
        } else {
            assert!(err.contains("too few to rely on"), "{name}: {traps} judged samples, too few:\n{err}");
        }
    }
}

/// A program that starts and ends thousands of threads (more than the
/// agent's table holds at once) runs under a 2 GiB address-space limit as
/// without witch: each new thread takes over the slot, state and stack of
/// one that ended, so the agent's memory follows the threads alive at once.
/// (Each thread used to get a fresh state of a few MiB, kept to the end:
/// the program aborted on a failed allocation after some hundreds of
/// threads, and without a limit grew by hundreds of MiB a second.)
#[test]
fn thousands_of_threads_that_come_and_go_keep_memory_bounded() {
    use std::os::unix::process::CommandExt;
    let dir = Scratch::new("thread-turnover");
    let prog = Program::build("thread_churn", dir.path());
    // 2,600 rounds of 4 threads: 10,400 threads, more than the table's 8,192.
    let native = prog.run_native(&["2600", "4"]);
    let out = dir.join("dead.json");
    let mut cmd = std::process::Command::new(witch_bin());
    cmd.args(["dead", "-q", "-p", "1ms", "-o"]).arg(&out).arg("--").arg(&prog.exe).args(["2600", "4"]);
    // SAFETY: setrlimit only, between fork and exec; witch and the program inherit it.
    unsafe {
        cmd.pre_exec(|| {
            let l = libc::rlimit { rlim_cur: 2 << 30, rlim_max: 2 << 30 };
            libc::setrlimit(libc::RLIMIT_AS, &l);
            Ok(())
        });
    }
    let run = run_cmd(cmd, None);
    assert_same_behaviour(&native, &run);
    let p = raw_profile(&out);
    assert_eq!(p["counters"]["threads_failed"].as_u64(), Some(0), "threads the agent could not set up: {}", p["notes"]);
}
