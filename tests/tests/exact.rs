//! The exact reference mode (`--exact`) against known answers, and the
//! sampled engine against it (a fast subset of the accuracy bench): on a ground-truth
//! program, the sampled dead fraction of its two store loops must come
//! within 5 points of the exact one.

use witch_tests::*;

/// `witch report FILE --json --top 0`: every pair (the exact mode also
/// reports the loader's and libc's many small pairs).
fn report_all(profile: &std::path::Path) -> Report {
    report_with(profile, &["--top", "0"])
}

/// Waste fraction over the pairs watched at the given lines of `file`.
fn fraction_watched_at(rep: &Report, file: &str, lines: &[u32]) -> (f64, f64, f64) {
    let (mut w, mut u) = (0.0, 0.0);
    for &l in lines {
        let s = rep.watched_at(file, l);
        w += s.waste;
        u += s.r#use;
    }
    (w / (w + u).max(f64::MIN_POSITIVE), w, u)
}

#[test]
fn exact_dead_matches_construction_and_sampling_comes_close() {
    let dir = Scratch::new("exact-half-dead");
    let prog = Program::build("half_dead", dir.path());
    let f = &prog.file;
    let (first, second, read) = (prog.line("@first"), prog.line("@second"), prog.line("@read"));

    // Exact: a small instance, single-stepped.
    let native = prog.run_native(&["64", "3"]);
    let out = dir.join("exact.json");
    let run = WitchCmd::new("dead").args(&["--exact", "-q"]).out(&out).run(&prog.exe, &["64", "3"]);
    assert_same_behaviour(&native, &run);
    let exact = report_all(&out);
    assert_eq!(exact.json["sampler"]["kind"], "exact", "{}", exact.dump());
    let dead = exact.pair(f, first, second);
    let used = exact.pair(f, second, read);
    // 64 longs per loop and 3 reps: 3*64*8 bytes dead and as many used.
    assert_eq!(dead.waste, 3.0 * 64.0 * 8.0, "exact dead bytes of <{first},{second}>\n{}", exact.dump());
    assert_eq!(used.r#use, 3.0 * 64.0 * 8.0, "exact used bytes of <{second},{read}>\n{}", exact.dump());
    let (ef, _, _) = fraction_watched_at(&exact, f, &[first, second]);
    assert!(
        (ef - 0.5).abs() < 1e-9,
        "exact fraction of the stores at lines {first} and {second} should be 0.5, got {ef}\n{}",
        exact.dump()
    );

    // Sampled: the same program at full size.
    let native = prog.run_native(&[]);
    let out = dir.join("sampled.json");
    let run = WitchCmd::new("dead").args(&["-p", "100000", "-q"]).out(&out).run(&prog.exe, &[]);
    assert_same_behaviour(&native, &run);
    let sampled = report_all(&out);
    sampled.assert_samples(200.0);
    let (sf, w, u) = fraction_watched_at(&sampled, f, &[first, second]);
    sampled.note(&format!("sampled fraction of those stores {sf:.3} (waste {w:.3e}, use {u:.3e}); exact {ef:.3}"));
    assert!(
        (sf - ef).abs() <= 0.05,
        "sampled dead fraction of those stores {sf:.3} should be within 5 points of the exact {ef:.3}\n{}",
        sampled.dump()
    );
}

/// The text report shows a pair in full for what is worth fixing: with one
/// line holding nearly all the waste (counted exactly, so the shares do not
/// vary), the start-up lines under 1% of it are listed in the summary, and
/// their pairs are counted, not shown in full; `--pairs 0` shows them all.
#[test]
fn the_text_report_leaves_out_the_pairs_of_minor_lines() {
    let dir = Scratch::new("exact-minor-pairs");
    let prog = Program::build("half_dead", dir.path());
    let out = dir.join("exact.json");
    let native = prog.run_native(&["4096", "3"]);
    let run = WitchCmd::new("dead").args(&["--exact", "-q"]).out(&out).run(&prog.exe, &["4096", "3"]);
    assert_same_behaviour(&native, &run);
    let text = |extra: &[&str]| {
        let mut args = vec![std::ffi::OsStr::new("report"), out.as_os_str()];
        args.extend(extra.iter().map(std::ffi::OsStr::new));
        let r = witch_raw(&args);
        assert!(r.status.success(), "{}", r.describe());
        r.stdout_str()
    };
    let default = text(&[]);
    let flat = default.split_whitespace().collect::<Vec<_>>().join(" ");
    let first = prog.line("@first");
    assert!(flat.contains("Top 1 of "), "one pair in full (the rest under 1% of the waste):\n{default}");
    assert!(flat.contains("under 1.0% of all waste are left out: --pairs 0 shows every pair"), "{default}");
    assert_eq!(default.matches("     dead store at").count(), 1, "{default}");
    assert!(default.contains(&format!("half_dead.c:{first})")), "{default}");
    let all = text(&["--pairs", "0"]);
    assert!(all.contains("All ") && all.matches("     dead store at").count() > 1, "{all}");
    assert!(!all.contains("left out"), "{all}");
}

#[test]
fn exact_silent_store_and_load_are_exact() {
    let dir = Scratch::new("exact-silent");
    let prog = Program::build("tiny_silent", dir.path());
    let f = &prog.file;
    let (st, ld) = (prog.line("@store"), prog.line("@load"));
    let (n, passes) = (32.0, 4.0);
    for (craft, line) in [("silent-store", st), ("silent-load", ld)] {
        let out = dir.join(&format!("{craft}.json"));
        let native = prog.run_native(&["32", "4"]);
        let run = WitchCmd::new(craft).args(&["--exact", "-q"]).out(&out).run(&prog.exe, &["32", "4"]);
        assert_same_behaviour(&native, &run);
        let rep = report_all(&out);
        let pair = rep.pair(f, line, line);
        // Every pass after the first repeats n 8-byte values.
        assert_eq!(pair.waste, (passes - 1.0) * n * 8.0, "{craft}: <{line},{line}> waste\n{}", rep.dump());
        assert_eq!(pair.r#use, 0.0, "{craft}: <{line},{line}> use\n{}", rep.dump());
    }
}

#[test]
fn exact_mode_follows_threads() {
    let dir = Scratch::new("exact-threads");
    let prog = Program::build("tiny_threads", dir.path());
    let f = &prog.file;
    let (tw, tk, read) = (prog.line("@tw"), prog.line("@tk"), prog.line("@read"));
    let (n, passes, threads) = (16.0, 3.0, 2.0);
    let native = prog.run_native(&["16", "3"]);
    let out = dir.join("exact.json");
    let run = WitchCmd::new("dead").args(&["--exact", "-q"]).out(&out).run(&prog.exe, &["16", "3"]);
    assert_same_behaviour(&native, &run);
    let raw = raw_profile(&out);
    let workers = raw["threads"].as_array().map(|ts| ts.len()).unwrap_or(0);
    assert!(workers >= 3, "main and both workers should have a part in the profile, got {workers}");
    let rep = report_all(&out);
    assert_eq!(rep.pair(f, tw, tk).waste, threads * passes * n * 8.0, "<{tw},{tk}> dead bytes\n{}", rep.dump());
    assert_eq!(rep.pair(f, tk, tw).waste, threads * (passes - 1.0) * n * 8.0, "<{tk},{tw}> dead bytes\n{}", rep.dump());
    assert_eq!(rep.pair(f, tk, read).r#use, threads * n * 8.0, "<{tk},{read}> used bytes\n{}", rep.dump());
}

/// An exact profile is a count, not a sample: its figures carry no
/// interval (the text says "an exact count", the JSON's intervals have no
/// width, no pair is marked as resting on few traps), and a gate or a diff
/// between exact runs decides on the counts.
#[test]
fn exact_figures_are_counts_without_intervals() {
    let dir = Scratch::new("exact-counts");
    let prog = Program::build("tiny_silent", dir.path());
    let out = dir.join("exact.json");
    let run = WitchCmd::new("silent-store").args(&["--exact", "-q"]).out(&out).run(&prog.exe, &["32", "4"]);
    assert!(run.code() == Some(prog.run_native(&["32", "4"]).code().unwrap()), "{}", run.describe());

    let raw = raw_profile(&out);
    let start = raw["start_unix_ns"].as_u64().unwrap_or(0);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    assert!(start > now - 3_600_000_000_000 && start <= now, "start_unix_ns {start} should be when the run began (now {now})");

    let rep = report_all(&out);
    let f = rep.json["waste_fraction"].as_f64().unwrap();
    assert!(f > 0.0 && f < 1.0, "{}", rep.dump());
    assert_eq!(rep.json["waste_fraction_ci"], serde_json::json!([f, f]), "an exact fraction has no interval\n{}", rep.dump());
    for p in rep.pairs() {
        assert_eq!(p["share_ci"][0], p["share_ci"][1], "share of {p}");
        assert_eq!(p["fraction_ci"][0], p["fraction_ci"][1], "fraction of {p}");
        assert_eq!(p["few_traps"], false, "an exact pair rests on every access: {p}");
    }

    let text = witch_raw(&[std::ffi::OsStr::new("report"), out.as_os_str()]);
    let t = text.stdout_str().split_whitespace().collect::<Vec<_>>().join(" ")
        + " "
        + &text.stderr_str().split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(t.contains("(an exact count)"), "{t}");
    assert!(!t.contains("95% interval") && !t.contains("(few traps"), "an exact report shows no interval:\n{t}");

    // A gate on counts never says it cannot tell.
    let pct = format!("{:.4}%", f * 100.0 - 0.01);
    let gate = witch_raw(&[std::ffi::OsStr::new("gate"), std::ffi::OsStr::new("--max-waste"), std::ffi::OsStr::new(&pct), out.as_os_str()]);
    let g = gate.stdout_str() + &gate.stderr_str();
    assert_eq!(gate.code(), Some(1), "{:.4}% is over {pct}: FAIL\n{g}", f * 100.0);
    assert!(g.contains("an exact count") && !g.contains("cannot tell"), "{g}");
    let diff = witch_raw(&[std::ffi::OsStr::new("diff"), out.as_os_str(), out.as_os_str()]);
    let d = diff.stdout_str();
    assert!(d.contains("exact counts: no change"), "{d}");
}

/// `--exact=step` says on a terminal that it is alive (it runs thousands of
/// times slower), and writes no such line where stderr is no terminal.
#[test]
fn exact_shows_progress_on_a_terminal_only() {
    let dir = Scratch::new("exact-progress");
    let prog = Program::build("half_dead", dir.path());
    let out = dir.join("exact.json");
    let args = |w: &mut std::process::Command| {
        w.arg(witch_bin()).args(["dead", "--exact=step", "-o"]).arg(&out).arg(&prog.exe).args(["1000", "5"]);
    };
    // Under a pseudo-terminal (python3's pty.spawn copies it all to stdout).
    let mut c = std::process::Command::new("python3");
    c.args(["-c", "import pty, sys; sys.exit(pty.spawn(sys.argv[1:]) >> 8)"]);
    args(&mut c);
    let tty = run_cmd(c, Some(b""));
    assert_eq!(tty.code(), Some(0), "{}", tty.describe());
    let said = tty.stdout_str();
    assert!(said.contains("instructions single-stepped in"), "no progress line on a terminal:\n{}", tty.describe());
    // Piped: the report, and no progress line.
    let mut c = std::process::Command::new("env");
    args(&mut c);
    let piped = run_cmd(c, None);
    assert_eq!(piped.code(), Some(0), "{}", piped.describe());
    let err = piped.stderr_str();
    assert!(!err.contains("single-stepped in") && !err.contains('\r'), "a progress line without a terminal:\n{err}");
}

/// What an exact profile says of a pair: waste, of it approximate
/// (floats within the precision), use, and the accesses judged.
type Figures = [f64; 4];

/// Every pair of `profile` whose two leaf frames are in `exe`, by the two
/// leaves' offsets in it, summed over threads and over the callers above
/// the leaves (a worker's contexts begin at its start routine in the
/// code-cache mode, at the C library's thread start in the
/// single-stepping one).
fn pairs_in(profile: &std::path::Path, exe: &str) -> std::collections::BTreeMap<(u64, u64), Figures> {
    let p = raw_profile(profile);
    let m = p["modules"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["path"].as_str().is_some_and(|s| s.ends_with(exe))))
        .unwrap_or_else(|| panic!("no module {exe} in {}", profile.display()));
    let (start, end) = (m["start"].as_u64().unwrap(), m["end"].as_u64().unwrap());
    let mut out = std::collections::BTreeMap::new();
    for t in p["threads"].as_array().into_iter().flatten() {
        let nodes = t["nodes"].as_array().unwrap();
        let pc = |n: &serde_json::Value| nodes[n.as_u64().unwrap() as usize]["pc"].as_u64().unwrap();
        for pr in t["pairs"].as_array().into_iter().flatten() {
            let (w, k) = (pc(&pr["watch"]), pc(&pr["trap"]));
            if (start..end).contains(&w) && (start..end).contains(&k) {
                let e: &mut Figures = out.entry((w - start, k - start)).or_default();
                for (i, key) in ["waste", "approx_waste", "use", "traps"].iter().enumerate() {
                    e[i] += pr[key].as_f64().unwrap_or(0.0);
                }
            }
        }
    }
    out
}

/// `--exact=cache` (the program run from the code cache, every access of
/// the craft's kind recorded, with its bytes for the value crafts) and
/// `--exact=step` (single-stepped under ptrace) judge the same accesses:
/// on a program with threads, `rep` strings (a `rep stosq`, a `rep movsq`
/// between buffers, an overlapping `rep movsb`), doubles, a vector store
/// and load, calls and returns, and system calls (one that writes the
/// program's memory), every pair inside the program has the same waste,
/// approximate waste, use and accesses in both, for each craft, and the
/// program runs unharmed.
///
/// The program is bound at load time (`-z now`): with lazy binding, the
/// first call through each PLT stub pushes onto stack slots that the C
/// library's `pthread_create` wrote a moment before. The agent wraps it
/// (new threads), so in the code-cache mode the C library's part of it
/// runs natively, unrecorded, and the previous store to such a slot is an
/// earlier stub's push (a pair inside the program, not silent), where the
/// single steps see the C library's store (a pair outside it). (The
/// allocation functions the agent wraps run recorded, see
/// `exact_mode_records_the_allocator_without_a_trap`.)
#[test]
fn cache_and_step_give_the_same_bytes_per_pair() {
    let dir = Scratch::new("exact-agree");
    let prog = Program::build_with("exact_agree", dir.path(), "exact_agree", &["-Wl,-z,now"]).unwrap_or_else(|e| panic!("{e}"));
    let f = &prog.file;
    let native = prog.run_native(&["16", "3"]);
    let exe = prog.exe.file_name().unwrap().to_string_lossy().into_owned();
    let line = |m: &str| prog.line(m);
    for craft in ["dead", "silent-store", "silent-load"] {
        let (cache, step) = (dir.join(&format!("{craft}-cache.json")), dir.join(&format!("{craft}-step.json")));
        let run = WitchCmd::new(craft).args(&["--exact", "-q"]).out(&cache).run(&prog.exe, &["16", "3"]);
        assert_same_behaviour(&native, &run);
        let run = WitchCmd::new(craft).args(&["--exact=step", "-q"]).out(&step).run(&prog.exe, &["16", "3"]);
        assert_same_behaviour(&native, &run);
        assert_eq!(raw_profile(&cache)["sampler"]["event"], "code-cache", "{craft}: --exact runs from the code cache");
        let (c, s) = (pairs_in(&cache, &exe), pairs_in(&step, &exe));
        assert!(c.len() >= 6, "{craft}: the program's pairs: {c:?}");
        assert_eq!(
            c, s,
            "{craft}: pairs inside the program (waste, approximate waste, use, accesses), code cache (left) and single steps (right)"
        );
        // Known answers, from the code-cache profile.
        let rep = report_all(&cache);
        let pair = |a: &str, b: &str| rep.pair(f, line(a), line(b));
        match craft {
            "dead" => {
                assert_eq!(pair("@stos", "@over").waste, 3.0 * 16.0 * 8.0, "rep stosq's bytes, overwritten\n{}", rep.dump());
                assert_eq!(pair("@over", "@read").r#use, 3.0 * 16.0 * 8.0, "\n{}", rep.dump());
                assert_eq!(pair("@tw", "@tk").waste, 2.0 * 3.0 * 16.0 * 8.0, "\n{}", rep.dump());
                assert_eq!(pair("@tk", "@tw").waste, 2.0 * 2.0 * 16.0 * 8.0, "\n{}", rep.dump());
                assert_eq!(pair("@tk", "@tread").r#use, 2.0 * 16.0 * 8.0, "\n{}", rep.dump());
            }
            "silent-store" => {
                // Values p / 2 over passes 0, 1, 2: the same in the second
                // pass, changed in the third (but where they are 0).
                let copy = pair("@copy", "@copy");
                // (The second pass also copies 2 longs of 0 over dst[4..6],
                // silent; its copies of zero longs store nothing.)
                assert_eq!((copy.waste, copy.r#use), (64.0 + 16.0 + 8.0, 56.0), "rep movsq: 8 longs, src[i] = i * (p / 2)\n{}", rep.dump());
                let v = pair("@vstore", "@vstore");
                assert_eq!((v.waste, v.r#use), (16.0, 16.0), "the vector store\n{}", rep.dump());
                // The shift's elements store bytes[0], 'a', 'a', 'b'.
                let sh = pair("@shift", "@shift");
                assert_eq!((sh.waste, sh.r#use), (32.0, 32.0), "the overlapping rep movsb\n{}", rep.dump());
                let fl = pair("@fstore", "@fstore");
                assert_eq!((fl.waste, fl.r#use), (2.0 * 64.0, 0.0), "doubles within the precision\n{}", rep.dump());
                assert_eq!(
                    pair("@tw", "@tk").waste,
                    2.0 * 16.0 * 8.0,
                    "the workers' p * 3 + i over p + i, silent at p = 0\n{}",
                    rep.dump()
                );
            }
            _ => {
                let fl = pair("@fload", "@fload");
                assert_eq!((fl.waste, fl.r#use), (2.0 * 64.0, 0.0), "doubles within the precision\n{}", rep.dump());
                let v = pair("@vload", "@vload");
                assert_eq!((v.waste, v.r#use), (16.0, 16.0), "the vector load\n{}", rep.dump());
                let p = pair("@pipe", "@pipe");
                assert_eq!((p.waste, p.r#use), (8.0, 8.0), "what the kernel wrote, p / 2\n{}", rep.dump());
            }
        }
    }
}

/// Each recording thread's records go to one of several judging threads
/// (`WITCH_JUDGES`; one per processor by default), every record of a
/// thread to the same one: judged by one judge or by three (one for each
/// of the program's threads), every pair inside the program has the same
/// figures, for each craft, and the note says how many judged. A
/// number of judges that is not one gets a one-line error.
#[test]
fn several_judges_give_the_same_bytes_per_pair_as_one() {
    let dir = Scratch::new("exact-judges");
    let prog = Program::build_with("exact_agree", dir.path(), "exact_agree", &["-Wl,-z,now"]).unwrap_or_else(|e| panic!("{e}"));
    let native = prog.run_native(&["16", "3"]);
    let exe = prog.exe.file_name().unwrap().to_string_lossy().into_owned();
    for craft in ["dead", "silent-store", "silent-load"] {
        let mut got = vec![];
        for (judges, says) in [("1", "(one thread)"), ("3", "(3 threads)")] {
            let out = dir.join(&format!("{craft}-{judges}.json"));
            let run = WitchCmd::new(craft)
                .wrapper(&["env", &format!("WITCH_JUDGES={judges}")])
                .args(&["--exact", "-q"])
                .out(&out)
                .run(&prog.exe, &["16", "3"]);
            assert_same_behaviour(&native, &run);
            let notes = raw_profile(&out)["notes"].to_string();
            assert!(notes.contains(says), "{craft}, {judges} judges: the note says {says}: {notes}");
            got.push(pairs_in(&out, &exe));
        }
        assert!(got[0].len() >= 6, "{craft}: the program's pairs: {:?}", got[0]);
        assert_eq!(
            got[0], got[1],
            "{craft}: pairs inside the program (waste, approximate waste, use, accesses), one judge (left) and three (right)"
        );
    }
    // A bad value, and a bad testing knob, stop witch before it leaves a
    // directory of parts in the working directory.
    let cwd = dir.join("cwd");
    std::fs::create_dir(&cwd).unwrap();
    let chdir = format!("--chdir={}", cwd.display());
    for (bad, says) in [("WITCH_JUDGES=0", "WITCH_JUDGES"), ("WITCH_SEED=zz", "WITCH_SEED")] {
        let run = WitchCmd::new("dead").wrapper(&["env", chdir.as_str(), bad]).args(&["--exact", "-q"]).run(&prog.exe, &["16", "3"]);
        let err = run.stderr_str();
        assert!(run.code() != Some(0) && err.contains(says), "{bad}: {:?} {err}", run.code());
        assert_eq!(err.trim().lines().count(), 1, "{bad}: one line: {err}");
        let left: Vec<_> = std::fs::read_dir(&cwd).unwrap().flatten().map(|e| e.file_name()).collect();
        assert!(left.is_empty(), "{bad}: left behind {left:?}");
    }
}

/// A store that faults, in the code-cache mode: the program's SIGSEGV
/// handler makes the page writable and returns, and the store runs again.
/// The attempt that faulted stored nothing: its records are taken back, so
/// it is counted once, as single steps count it; and recording goes on
/// where the handler returns, not at the next tick (before, the rest of a
/// short run went unrecorded). The handler itself runs natively,
/// unrecorded.
#[test]
fn a_faulting_store_counts_once_and_recording_goes_on() {
    let dir = Scratch::new("exact-fault");
    let prog = Program::build("exact_fault", dir.path());
    let f = &prog.file;
    let (store, read) = (prog.line("@store"), prog.line("@read"));
    let (n, passes) = (16.0, 4.0);
    let native = prog.run_native(&["16", "4"]);
    assert!(native.stdout_str().contains("faults 4"), "{}", native.describe());
    for craft in ["dead", "silent-store"] {
        let out = dir.join(&format!("{craft}.json"));
        let run = WitchCmd::new(craft).args(&["--exact", "-q"]).out(&out).run(&prog.exe, &["16", "4"]);
        assert_same_behaviour(&native, &run);
        let raw = raw_profile(&out);
        assert_eq!(raw["sampler"]["event"], "code-cache");
        let rep = report_all(&out);
        if craft == "silent-store" {
            // Every pass after the first stores the same values again.
            let p = rep.pair(f, store, store);
            assert_eq!((p.waste, p.r#use), ((passes - 1.0) * n * 8.0, 0.0), "<{store},{store}>\n{}", rep.dump());
        } else {
            assert_eq!(rep.pair(f, store, read).r#use, passes * n * 8.0, "<{store},{read}> used bytes\n{}", rep.dump());
        }
    }
}

/// Calls into the vDSO (`clock_gettime`) between stores: the code cache
/// runs the vDSO too, so recording follows the thread through every call
/// and counts every store around them. (It once left the cache at the
/// vDSO's entry and meant to come back at the return address by an
/// instruction breakpoint, which on this VM reported itself at once with
/// the thread at the vDSO's entry: recording took a gap until the next
/// tick, and a short run's rest went uncounted.)
#[test]
fn exact_mode_counts_every_store_around_vdso_calls() {
    let dir = Scratch::new("exact-vdso");
    let prog = Program::build("vdso_calls", dir.path());
    let (store, read) = (prog.line("@store"), prog.line("@read"));
    let n = 20_000.0;
    let native = prog.run_native(&["20000"]);
    let out = dir.join("exact.json");
    let run = WitchCmd::new("dead").args(&["--exact", "-q"]).out(&out).run(&prog.exe, &["20000"]);
    assert_same_behaviour(&native, &run);
    let raw = raw_profile(&out);
    // The exact profile carries the recording agent's code-cache counters
    // (its other counters are the judge's); one that is zero is left out.
    assert!(raw["counters"]["cache_blocks"].as_u64().unwrap_or(0) > 0, "no code-cache counters: {}", raw["counters"]);
    assert_eq!(raw["counters"]["window_gaps"].as_u64().unwrap_or(0), 0, "recording lost the thread: {}", raw["notes"]);
    // The text report says what the cache did, gaps included.
    let text = witch_raw(&["report", out.to_str().unwrap()]).stdout_str().split_whitespace().collect::<Vec<_>>().join(" ");
    let blocks = raw["counters"]["cache_blocks"].as_u64().unwrap_or(0);
    assert!(text.contains(&format!("cache {blocks} blocks translated")), "no code-cache line:\n{text}");
    assert!(text.contains("0 stretches run natively unrecorded"), "no gaps line:\n{text}");
    // And what judging cost: the judge's CPU time, per record and as a
    // share of the run (which it cannot exceed by much: one thread).
    let judge =
        raw["notes"].as_array().into_iter().flatten().filter_map(|n| n.as_str()).find(|n| n.contains("the judge took")).unwrap_or("");
    let num = |after: &str| {
        judge.split(after).nth(1).and_then(|r| r.split_whitespace().next()).and_then(|w| w.trim_end_matches('%').parse::<f64>().ok())
    };
    let (cpu, per, busy) = (num("took "), num("), "), num("busy "));
    assert!(cpu.is_some_and(|c| c >= 0.0) && per.is_some_and(|p| p > 0.0 && p < 1e6), "no judge's cost: {judge:?}");
    assert!(busy.is_some_and(|b| b > 0.0 && b <= 110.0), "the judge's share of the run: {judge:?}");
    let rep = report_all(&out);
    let f = &prog.file;
    assert_eq!(rep.pair(f, store, store).waste, (n - 64.0) * 8.0, "<{store},{store}> dead bytes\n{}", rep.dump());
    assert_eq!(rep.pair(f, store, read).r#use, 64.0 * 8.0, "<{store},{read}> used bytes\n{}", rep.dump());
}

/// A program that calls the vDSO's `clock_gettime` in a loop ends under
/// the exact mode as natively, and in bounded time (whatever the counts:
/// the way back from the vDSO is the known gap above). The breakpoint that
/// takes a thread back into the cache once stayed enabled where it fired
/// although no window could begin there; it fired again at once, forever,
/// and the program hung at its first call.
#[test]
fn exact_mode_runs_through_vdso_calls() {
    use std::os::unix::process::CommandExt;
    let dir = Scratch::new("exact-vdso-ends");
    let prog = Program::build("vdso_calls", dir.path());
    let native = prog.run_native(&["20000"]);
    let mut witch = std::process::Command::new(witch_bin())
        .args(["dead", "--exact", "-q", "-o"])
        .arg(dir.join("exact.json"))
        .arg(&prog.exe)
        .arg("20000")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(s) = witch.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > until {
            // SAFETY: witch's own process group (the program is in it).
            unsafe { libc::kill(-(witch.id() as i32), libc::SIGKILL) };
            let _ = witch.wait();
            panic!("witch dead --exact on vdso_calls ran over 60 s (native: milliseconds)");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut out = String::new();
    std::io::Read::read_to_string(&mut witch.stdout.take().unwrap(), &mut out).unwrap();
    assert_eq!((status.code(), out), (native.code(), native.stdout_str()), "not as natively");
}

/// The exact mode follows `fork` and `exec` (tests/programs/forker.c and
/// exec_target.c): the parent, the child before its `exec` and the image
/// it execs each have a section, every access of each is judged, and the
/// program behaves as without witch. Known answers, per process, for 2
/// passes over N = 2^18 longs, each store `a[i] = c = nxt[c]` walking a
/// cycle of 1024 (so @fk stores what @fw stored, and each `nxt` entry is
/// loaded again 1024 loads later, reading the same value):
/// - dead: @fw's bytes all killed by @fk (2·N·8), @fk's by the next
///   pass's @fw (N·8);
/// - silent-store: the same bytes, all silent;
/// - silent-load: all loads but each entry's first re-read what they read
///   before: N − 1024 a loop within the loop's own line, 1024 across.
#[test]
fn exact_mode_follows_fork_and_exec() {
    let dir = Scratch::new("exact-fork-exec");
    let forker = Program::build("forker", dir.path());
    let target = Program::build("exec_target", dir.path());
    let (fw, fk) = (forker.line("@fw"), forker.line("@fk"));
    let (xw, xk) = (target.line("@xw"), target.line("@xk"));
    let args = [target.exe.to_str().unwrap(), "2"];
    let native = forker.run_native(&args);
    assert_eq!(native.code(), Some(5), "native run:\n{}", native.describe());
    let (n, cycle, passes) = (262144.0, 1024.0, 2.0);
    for craft in ["dead", "silent-store", "silent-load"] {
        let out = dir.join(&format!("{craft}.json"));
        let run = WitchCmd::new(craft).args(&["--exact", "-q"]).out(&out).run(&forker.exe, &args);
        assert_same_behaviour(&native, &run);
        let rep = report_all(&out);
        let procs = rep.processes();
        let forkers: Vec<u64> = procs.iter().filter(|(_, p)| p.contains("forker")).map(|(pid, _)| *pid).collect();
        let targets = procs.iter().filter(|(_, p)| p.contains("exec_target")).count();
        assert!(forkers.len() == 2 && targets == 1, "{craft}: the parent, the child before exec and the exec'd image: {procs:?}");
        let check = |rep: &Report, f: &str, w: u32, k: u32| {
            let pair = |a: u32, b: u32| {
                let p = rep.pair(f, a, b);
                (p.waste, p.r#use)
            };
            let what = format!("{craft}, {f} <{w},{k}>");
            match craft {
                "dead" | "silent-store" => {
                    assert_eq!(pair(w, k), (passes * n * 8.0, 0.0), "{what}\n{}", rep.dump());
                    assert_eq!(pair(k, w), ((passes - 1.0) * n * 8.0, 0.0), "{what}\n{}", rep.dump());
                }
                _ => {
                    for (a, b, bytes) in [
                        (w, w, passes * (n - cycle) * 8.0),
                        (k, k, passes * (n - cycle) * 8.0),
                        (w, k, passes * cycle * 8.0),
                        (k, w, (passes - 1.0) * cycle * 8.0),
                    ] {
                        assert_eq!(pair(a, b), (bytes, 0.0), "{what}: <{a},{b}>\n{}", rep.dump());
                    }
                }
            }
        };
        for &pid in &forkers {
            check(&rep.process(pid), &forker.file, fw, fk);
        }
        check(&rep, &target.file, xw, xk);
    }
}

/// Signals while every access is recorded (tests/programs/exact_signals.c):
/// a profiling timer every 200 µs of CPU time interrupts a store loop
/// wherever it is, and the program raises SIGUSR1 at itself between
/// passes. Each handler runs as without witch (every raised signal
/// handled once; the timer's handler sees only native PCs in its
/// ucontext, never a copy's), and the loop's bytes are all judged: @sw's
/// killed by @sk in every pass, @sk's by @sw in all but the last, which
/// @read uses. For the silent crafts, every byte of those pairs is judged
/// one way or the other.
#[test]
fn exact_mode_takes_signals_at_any_instruction() {
    let dir = Scratch::new("exact-signals");
    let prog = Program::build_with("exact_signals", dir.path(), "exact_signals", &["-ldl"]).unwrap_or_else(|e| panic!("{e}"));
    let f = &prog.file;
    let (sw, sk, read) = (prog.line("@sw"), prog.line("@sk"), prog.line("@read"));
    let (n, passes) = (65536.0, 600.0);
    let args = ["65536", "600"];
    let native = prog.run_native(&args);
    assert_eq!(native.code(), Some(0), "native run:\n{}", native.describe());
    assert!(native.stdout_str().contains("raised 600 handled 600\n"), "native run:\n{}", native.describe());
    assert!(native.stdout_str().contains("pcs: native\n"), "native run:\n{}", native.describe());
    for craft in ["dead", "silent-store", "silent-load"] {
        let out = dir.join(&format!("{craft}.json"));
        let run = WitchCmd::new(craft).args(&["--exact", "-q"]).out(&out).run(&prog.exe, &args);
        assert_same_behaviour(&native, &run);
        let rep = report_all(&out);
        let judged = |a: u32, b: u32| {
            let p = rep.pair(f, a, b);
            (p.waste, p.r#use)
        };
        match craft {
            "dead" => {
                assert_eq!(judged(sw, sk), (passes * n * 8.0, 0.0), "{craft}\n{}", rep.dump());
                assert_eq!(judged(sk, sw), ((passes - 1.0) * n * 8.0, 0.0), "{craft}\n{}", rep.dump());
                assert_eq!(judged(sk, read), (0.0, n * 8.0), "{craft}\n{}", rep.dump());
            }
            "silent-store" => {
                let ((w1, u1), (w2, u2)) = (judged(sw, sk), judged(sk, sw));
                assert_eq!(w1 + u1, passes * n * 8.0, "{craft}: <{sw},{sk}>\n{}", rep.dump());
                assert_eq!(w2 + u2, (passes - 1.0) * n * 8.0, "{craft}: <{sk},{sw}>\n{}", rep.dump());
            }
            _ => {
                // The loops only store: the one load of each value is @read's,
                // with nothing loaded before it.
                let (w, u) = judged(read, read);
                assert_eq!((w, u), (0.0, 0.0), "{craft}\n{}", rep.dump());
            }
        }
    }
}

/// Witch killed while the program records: the program runs on and ends
/// as natively (its threads, which wait for witch to judge a chunk before
/// they write over it, notice that witch is gone and stop recording; they
/// must not wait for it forever). The program is found as witch's child
/// and reaped here, this process being its subreaper.
#[test]
fn a_killed_witch_leaves_an_exact_run_to_end_as_natively() {
    use std::io::Read;
    let dir = Scratch::new("exact-killed");
    let prog = Program::build("half_dead", dir.path());
    let args = ["262144", "300"];
    let native = prog.run_native(&args);
    // SAFETY: marks this (test) process as the subreaper of its orphans.
    assert_eq!(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) }, 0);
    let mut witch = std::process::Command::new(witch_bin())
        .args(["dead", "--exact", "-q", "-o"])
        .arg(dir.join("never.json"))
        .arg(&prog.exe)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let children = format!("/proc/{}/task/{}/children", witch.id(), witch.id());
    let started = std::time::Instant::now();
    let mut program = None;
    while program.is_none() && started.elapsed() < std::time::Duration::from_secs(20) {
        program = std::fs::read_to_string(&children).ok().and_then(|c| c.split_whitespace().next().and_then(|p| p.parse::<i32>().ok()));
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let program = program.expect("witch started no program");
    // Well into the recording (the run takes seconds under witch).
    std::thread::sleep(std::time::Duration::from_millis(1500));
    witch.kill().unwrap();
    witch.wait().unwrap();
    let mut status = 0;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        // SAFETY: polls our own (adopted) child.
        let reaped = unsafe { libc::waitpid(program, &mut status, libc::WNOHANG) };
        if reaped == program {
            break;
        }
        assert_eq!(reaped, 0, "the program was not reaped here");
        if std::time::Instant::now() > until {
            // SAFETY: our own (adopted) child.
            unsafe {
                libc::kill(program, libc::SIGKILL);
                libc::waitpid(program, &mut status, 0);
            }
            panic!("the program still ran 60 s after witch was killed (native: a fraction of a second)");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut out = Vec::new();
    witch.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    assert!(libc::WIFEXITED(status), "the program did not exit: status {status:#x}");
    assert_eq!(
        (Some(libc::WEXITSTATUS(status)), String::from_utf8_lossy(&out).into_owned()),
        (native.code(), native.stdout_str()),
        "the program did not end as natively"
    );
}

/// The C library's allocator runs in the exact mode as the program's own
/// code: a program that allocates, fills and frees a block 20,000 times
/// (tests/programs/exact_malloc.c, with `calloc` and `realloc` among the
/// calls) ends as natively, every call comes back without a breakpoint's
/// trap, and the allocator's own stores and loads are judged (pairs with
/// a context in the C library, many bytes a round), as `--exact=step`
/// judges them and DeadSpy counts them. The agent's `malloc` entries once
/// ran natively, the allocator unrecorded, each return a debug exception
/// and a signal: 20,000 resumptions here, and no pair in the allocator.
/// Also a program with its own `malloc` and one allocating in threads and
/// a fork child (tests/programs/own_malloc.c, heap_churn.c), unharmed.
#[test]
fn exact_mode_records_the_allocator_without_a_trap() {
    let dir = Scratch::new("exact-malloc");
    let prog = Program::build("exact_malloc", dir.path());
    let rounds = 20000u64;
    let native = prog.run_native(&["20000"]);
    let out = dir.join("exact.json");
    let run = WitchCmd::new("dead").args(&["--exact", "-q"]).out(&out).run(&prog.exe, &["20000"]);
    assert_same_behaviour(&native, &run);
    let p = raw_profile(&out);
    let notes: Vec<String> = p["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap_or("").to_string()).collect();
    let resumes: u64 = notes
        .iter()
        .find_map(|n| n.split(" resumptions after native code").next().filter(|_| n.contains("resumptions")))
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no resumptions in the notes: {notes:?}"));
    assert!(resumes < 100, "{resumes} resumptions after native code for {rounds} rounds of malloc and free: {notes:?}");
    let libc = p["modules"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["path"].as_str().is_some_and(|s| s.contains("libc.so"))))
        .unwrap_or_else(|| panic!("no libc module in {}", out.display()));
    let (start, end) = (libc["start"].as_u64().unwrap(), libc["end"].as_u64().unwrap());
    let mut bytes = 0.0;
    for t in p["threads"].as_array().into_iter().flatten() {
        let nodes = t["nodes"].as_array().unwrap();
        let pc = |n: &serde_json::Value| nodes[n.as_u64().unwrap() as usize]["pc"].as_u64().unwrap();
        for pr in t["pairs"].as_array().into_iter().flatten() {
            if (start..end).contains(&pc(&pr["watch"])) || (start..end).contains(&pc(&pr["trap"])) {
                bytes += pr["waste"].as_f64().unwrap_or(0.0) + pr["use"].as_f64().unwrap_or(0.0);
            }
        }
    }
    assert!(bytes >= 8.0 * rounds as f64, "{bytes} bytes judged in pairs with a context in the C library, for {rounds} rounds");

    for (name, args) in [("own_malloc", &["4096", "16"][..]), ("heap_churn", &["300"][..])] {
        let prog = Program::build(name, dir.path());
        let native = prog.run_native(args);
        let run = WitchCmd::new("dead").args(&["--exact", "-q"]).out(&dir.join(&format!("{name}.json"))).run(&prog.exe, args);
        assert_same_behaviour(&native, &run);
    }
}

/// Both exact modes on a program whose threads keep per-CPU counters with
/// restartable sequences (rseq): the code-cache mode ran each critical
/// section from a copy, which the kernel does not restart (26-47% of the
/// increments lost, 8 runs of 8 with sections this long); the
/// single-stepping mode never got through one (each step's stop aborted
/// the section: the run hung). Each section now
/// runs natively to its end, and the profile says how many did.
#[test]
fn exact_modes_run_restartable_sequences_natively_and_say_so() {
    let dir = Scratch::new("exact-rseq");
    let prog = Program::build_with("rseq_counters", dir.path(), "rseq_counters", &["-pthread"]).expect("build rseq_counters");
    for (mode, args) in [("--exact", ["4", "40000", "2000"]), ("--exact=step", ["2", "150", "40"])] {
        let native = prog.run_native(&args);
        assert_eq!(native.code(), Some(0), "natively the sum is exact:\n{}", native.describe());
        let out = dir.join("exact.json");
        let run = WitchCmd::new("dead").args(&[mode, "-q"]).out(&out).run(&prog.exe, &args);
        assert_same_behaviour(&native, &run);
        let raw = raw_profile(&out);
        let notes = raw["notes"].to_string();
        let adds: u64 = args[0].parse::<u64>().unwrap() * args[1].parse::<u64>().unwrap();
        if mode == "--exact" {
            let run_natively = raw["counters"]["critical_sections"].as_u64().unwrap_or(0);
            assert!(run_natively >= adds, "{mode}: every increment's section runs natively: {run_natively} of {adds}");
        } else {
            assert!(notes.contains("restartable sequences' critical sections (rseq) ran natively"), "{mode}: {notes}");
        }
    }
}
