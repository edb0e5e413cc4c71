//! Four threads running the dead-store loop (tests/programs/threads_dead.c).

use std::collections::HashMap;
use witch_tests::*;

#[test]
fn four_threads_each_profiled_and_merged() {
    let dir = Scratch::new("threads");
    let prog = Program::build("threads_dead", dir.path());
    let (w, k) = (prog.line("@tw"), prog.line("@tk"));
    let f = &prog.file;
    let native = prog.run_native(&[]);
    assert_eq!(native.code(), Some(3), "native run:\n{}", native.describe());

    let out = dir.join("threads.json");
    let run = WitchCmd::new("dead").args(&["-p", "100000", "-q"]).out(&out).run(&prog.exe, &[]);
    assert_same_behaviour(&native, &run);

    // The raw profile: one entry per thread, at least the four workers sampled.
    let raw = raw_profile(&out);
    let threads = raw["threads"].as_array().cloned().unwrap_or_default();
    let sampled: Vec<(u64, u64)> = threads
        .iter()
        .map(|t| {
            let c = t["counters"]["samples"].as_u64().unwrap_or(0);
            let n: u64 = t["nodes"].as_array().map(|v| v.iter().filter_map(|n| n["samples"].as_u64()).sum()).unwrap_or(0);
            (t["tid"].as_u64().unwrap_or(0), c.max(n))
        })
        .collect();
    let busy = sampled.iter().filter(|(_, s)| *s > 0).count();
    let tids: std::collections::HashSet<u64> = sampled.iter().map(|(t, _)| *t).collect();
    assert!(
        busy >= 4 && tids.len() == sampled.len(),
        "the raw profile should hold >= 4 threads with samples, each once; got (tid, samples) = {sampled:?}\n\
         top-level counters: {}",
        raw["counters"]
    );

    let rep = report(&out);
    rep.assert_samples(800.0);
    let (own, pair, _) = rep.own_fraction(f, w, k);
    rep.note(&format!("threads (tid, samples) {sampled:?}; <{w},{k}> own fraction {own:.3}, rank {:?}", pair.best_rank));
    assert!(
        own >= 0.90 && pair.best_rank.is_some_and(|r| r < 2),
        "<{f}:{w}, {f}:{k}> should be a top-two pair (the other is <{k},{w}>) with >= 90% of what the stores \
         at line {w} are worth; got {own:.3}, rank {:?}\n{}",
        pair.best_rank,
        rep.dump()
    );
    let top = &rep.pairs()[0];
    assert!(
        (side_at(top, "watch", f, w) && side_at(top, "trap", f, k)) || (side_at(top, "watch", f, k) && side_at(top, "trap", f, w)),
        "the top pair should be one of the two dead pairs <{w},{k}> / <{k},{w}>\n{}",
        rep.dump()
    );

    // Merged across threads: no two pairs with identical symbolized contexts.
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, p) in rep.pairs().iter().enumerate() {
        let key =
            format!("{}|{}", serde_json::Value::from(frames(p, "watch").to_vec()), serde_json::Value::from(frames(p, "trap").to_vec()));
        if let Some(j) = seen.insert(key, i) {
            panic!("pairs #{j} and #{i} have identical contexts: threads' pairs should be merged\n{}", rep.dump());
        }
    }
}

/// The same program at the default settings: without a PMU that is the
/// POSIX CPU-time timer (`cpu-timer`), one per thread, created by the agent
/// for each new thread.
#[test]
fn four_threads_with_the_default_sampler() {
    let dir = Scratch::new("threads-default");
    let prog = Program::build("threads_dead", dir.path());
    let (w, k) = (prog.line("@tw"), prog.line("@tk"));
    let f = &prog.file;
    let native = prog.run_native(&[]);
    let out = dir.join("threads.json");
    let run = WitchCmd::new("dead").args(&["-q"]).out(&out).run(&prog.exe, &[]);
    assert_same_behaviour(&native, &run);

    let raw = raw_profile(&out);
    if raw["sampler"]["kind"] == "software" {
        assert_eq!(raw["sampler"]["event"], "cpu-timer", "the default software sampler: {}", raw["sampler"]);
    }
    let busy =
        raw["threads"].as_array().map(|ts| ts.iter().filter(|t| t["counters"]["samples"].as_u64().unwrap_or(0) > 0).count()).unwrap_or(0);
    assert!(busy >= 4, "every worker thread should be sampled; {busy} were (counters: {})", raw["counters"]);
    let rep = report(&out);
    rep.assert_samples(100.0);
    let top = &rep.pairs()[0];
    assert!(
        (side_at(top, "watch", f, w) && side_at(top, "trap", f, k)) || (side_at(top, "watch", f, k) && side_at(top, "trap", f, w)),
        "the top pair should be one of the two dead pairs <{w},{k}> / <{k},{w}>\n{}",
        rep.dump()
    );
    // The program's contexts end at its thread function, not in the agent's
    // thread-start trampoline (an unknown address before).
    let watch = frames(top, "watch");
    assert!(
        watch.last().is_some_and(|fr| fr["function"] == "worker"),
        "the outermost frame should be the thread's start routine `worker`: {watch:?}"
    );
}

/// A worker thread that blocks every signal (tests/programs/blocked_signals.c)
/// is still sampled: the agent keeps its own two signals out of the
/// program's masks, and only those, whether the program blocks them
/// through the C library or with `syscall(SYS_rt_sigprocmask, ...)`
/// (`raw`; before, that blocked the agent's ticks too, and the run had
/// no sample at all).
#[test]
fn threads_blocking_every_signal_are_still_profiled() {
    let dir = Scratch::new("blocked-signals");
    let prog = Program::build("blocked_signals", dir.path());
    let (w, k) = (prog.line("@w"), prog.line("@k"));
    let f = &prog.file;
    for how in ["libc", "raw"] {
        let args = ["150", how];
        let native = prog.run_native(&args);
        assert!(native.stdout_str().contains("usr1_blocked=1"), "{how}: native run:\n{}", native.describe());
        let out = dir.join(&format!("blocked-{how}.json"));
        let run = WitchCmd::new("dead").args(&["-p", "100000", "-q"]).out(&out).run(&prog.exe, &args);
        assert_same_behaviour(&native, &run);
        let rep = report(&out);
        rep.note(how);
        rep.assert_samples(200.0);
        let pair = rep.pair(f, w, k);
        assert!(
            pair.best_rank.is_some_and(|r| r < 2),
            "{how}: <{f}:{w}, {f}:{k}> should be a top-two pair in the thread that blocks every signal\n{}",
            rep.dump()
        );
    }
}
