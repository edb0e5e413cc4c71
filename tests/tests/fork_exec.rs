//! fork + exec under witch (tests/programs/forker.c and exec_target.c): the
//! child keeps profiling after fork with its own state, exec starts a fresh
//! section for the new image, the program behaves as without witch, and the
//! run leaves one profile holding every process.

use std::path::Path;
use witch_tests::*;

#[test]
fn fork_and_exec_each_have_a_section_in_one_profile() {
    let dir = Scratch::new("fork-exec");
    let forker = Program::build("forker", dir.path());
    let target = Program::build("exec_target", dir.path());
    let (xw, xk) = (target.line("@xw"), target.line("@xk"));
    let target_arg = target.exe.to_str().unwrap();

    let native = forker.run_native(&[target_arg]);
    assert_eq!(native.code(), Some(5), "native run:\n{}", native.describe());
    assert_eq!(native.stdout_str().lines().count(), 3, "native run:\n{}", native.describe());

    let out = dir.join("fe.json");
    let run = WitchCmd::new("dead").args(&["-p", "100000", "-q"]).out(&out).run(&forker.exe, &[target_arg]);
    assert_same_behaviour(&native, &run);

    let files = profiles_near(&out);
    let listing = std::fs::read_dir(dir.path())
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect::<Vec<_>>())
        .unwrap_or_default();
    assert!(
        out.is_file() && files.len() == 1 && !listing.iter().any(|f| f.starts_with("witch-parts")),
        "expected one profile at {} and nothing else; directory holds {listing:?}\n{}",
        out.display(),
        run.describe()
    );

    // Its sections: the parent, the child before exec, and the exec'd image.
    let rep = report(&out);
    let procs = rep.processes();
    let forkers = procs.iter().filter(|(_, p)| p.contains("forker")).count();
    let targets: Vec<u64> = procs.iter().filter(|(_, p)| p.contains("exec_target")).map(|(pid, _)| *pid).collect();
    assert!(procs.len() >= 3, "expected >= 3 process sections, got {procs:?}\n{}", rep.dump());
    assert!(forkers >= 2, "expected the parent and the child before exec, both naming forker; got {procs:?}");
    assert_eq!(targets.len(), 1, "expected exactly one section naming exec_target among {procs:?}");
    let raw = raw_profile(&out);
    assert_eq!(raw["processes"].as_array().map(Vec::len).unwrap_or(0) + 1, procs.len(), "one section per process in the raw profile");

    // The exec'd image was profiled for real: its own dead pair is there.
    let rep = rep.process(targets[0]);
    rep.assert_samples(200.0);
    let f = &target.file;
    let (own, _, _) = rep.own_fraction(f, xw, xk);
    rep.note(&format!("sections {procs:?}; exec'd image <{xw},{xk}> own fraction {own:.3}"));
    assert!(
        own >= 0.90,
        "exec'd image: <{f}:{xw}, {f}:{xk}> should hold >= 90% of what the stores at line {xw} are worth; got {own:.3}\n{}",
        rep.dump()
    );
}

/// The child execs with `fexecve` (which the C library makes an `execveat`
/// system call of, out of a preload's sight) rather than `execl`: its
/// profile before the exec is written all the same (a section of its own,
/// `ended_by: "exec"`, with its dead pair). It first tries an `fexecve`
/// that fails (a descriptor of /dev/null): its error is the one it gets
/// without witch, and profiling goes on, so the loop it runs after is in
/// its section. (Before, the child's part before the exec was lost: the
/// profile held the parent and exec_target only.)
#[test]
fn a_child_that_execs_with_fexecve_keeps_its_profile_before_the_exec() {
    let dir = Scratch::new("fork-fexecve");
    let forker = Program::build("forker", dir.path());
    let target = Program::build("exec_target", dir.path());
    let (fw, fk) = (forker.line("@fw"), forker.line("@fk"));
    let args = [target.exe.to_str().unwrap(), "300", "fexecve"];

    let native = forker.run_native(&args);
    assert_eq!(native.code(), Some(5), "native run:\n{}", native.describe());
    let lines = native.stdout_str().lines().map(str::to_string).collect::<Vec<_>>();
    assert_eq!(lines.len(), 4, "native run:\n{}", native.describe());
    assert!(lines[0].starts_with("forker child fexecve /dev/null: "), "native run:\n{}", native.describe());

    let out = dir.join("fexecve.json");
    let run = WitchCmd::new("dead").args(&["-p", "100000", "-q"]).out(&out).run(&forker.exe, &args);
    assert_same_behaviour(&native, &run);
    assert_eq!(profiles_near(&out).len(), 1, "one profile for the run\n{}", run.describe());

    // Its sections: the parent, the child before exec, and the exec'd image
    // (the child's pid).
    let rep = report(&out);
    let sections = rep.json["processes"].as_array().cloned().unwrap_or_default();
    let procs = rep.processes();
    let targets: Vec<u64> = procs.iter().filter(|(_, p)| p.contains("exec_target")).map(|(pid, _)| *pid).collect();
    assert_eq!(targets.len(), 1, "expected exactly one section naming exec_target among {procs:?}");
    let child = targets[0];
    let before = sections.iter().find(|p| p["pid"].as_u64() == Some(child) && p["program"].as_str().is_some_and(|p| p.contains("forker")));
    let before = before.unwrap_or_else(|| panic!("no section of the child before its fexecve among {procs:?}\n{}", rep.dump()));
    assert_eq!(before["ended_by"], "exec", "{before}");
    // Profiled after the fexecve that failed: its loop is there.
    let samples = before["samples"].as_f64().unwrap_or(0.0);
    let (own, pair, _) = rep.process(child).own_fraction(&forker.file, fw, fk);
    rep.note(&format!("sections {procs:?}; the child before fexecve: {samples} samples, <{fw},{fk}> own fraction {own:.3}"));
    assert!(samples >= 200.0, "the child before its fexecve: only {samples} samples\n{before}");
    assert!(
        pair.waste > 0.0 && own >= 0.90,
        "the child before its fexecve: <{fw},{fk}> should hold >= 90% of what the stores at line {fw} are worth; got {own:.3}\n{}",
        rep.dump()
    );
}

/// A program run through a shell that forks three children: one profile,
/// with a section for each process, and each child's own dead stores in its
/// section.
#[test]
fn a_shell_with_three_children_gives_one_profile_with_each_process() {
    let dir = Scratch::new("sh-three");
    let prog = Program::build("dead_loop", dir.path());
    let (w, k) = (prog.line("@w"), prog.line("@k"));
    let p = prog.exe.to_str().unwrap();
    let script = format!("{p} & {p} & {p} & wait");
    let sh = which("sh").expect("sh");
    let out = dir.join("sh.json");
    let run = WitchCmd::new("dead").args(&["-p", "100000"]).out(&out).run(&sh, &["-c", &script]);
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    assert_eq!(profiles_near(&out).len(), 1, "one profile for the run");
    let rep = report(&out);
    let procs = rep.processes();
    let loops: Vec<u64> = procs.iter().filter(|(_, prog)| prog.ends_with("/dead_loop")).map(|(pid, _)| *pid).collect();
    assert_eq!(loops.len(), 3, "three sections running dead_loop among {procs:?}\n{}", rep.dump());
    assert!(
        procs.iter().any(|(_, prog)| prog.ends_with("sh") || prog.contains("dash") || prog.contains("bash")),
        "the shell's own section: {procs:?}"
    );
    for pid in loops {
        let r = rep.process(pid);
        let (own, pair, _) = r.own_fraction(&prog.file, w, k);
        assert!(pair.waste > 0.0 && own >= 0.9, "pid {pid}: <{w},{k}> own fraction {own:.3}\n{}", r.dump());
    }
    let err = run.stderr_str().split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(err.contains("Processes with findings") && err.contains("profile of "), "the text report lists the processes:\n{err}");
}

/// The kernel's round trips (a watchpoint trap, a signal, a single step)
/// are measured once a run, by its first process; the others read them
/// from the run's directory of parts, and say whose they are.
#[test]
fn the_processes_of_a_run_share_the_first_ones_measured_round_trips() {
    let dir = Scratch::new("sh-trips");
    let prog = Program::build("dead_loop", dir.path());
    let p = prog.exe.to_str().unwrap();
    let script = format!("{p}; {p}; {p}; true");
    let sh = which("sh").expect("sh");
    let out = dir.join("trips.json");
    let run = WitchCmd::new("dead").args(&["-p", "100000", "-q"]).out(&out).run(&sh, &["-c", &script]);
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    let listing: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert!(
        !listing.iter().any(|f| f.starts_with("witch-parts")),
        "the run's parts, its round trips' file among them, are gone: {listing:?}"
    );
    let profile = raw_profile(&out);
    let first = profile["pid"].as_u64().expect("the first process's pid");
    // The profile is the first process's (the shell's), its children's
    // sections beside it.
    let sections = profile["processes"].as_array().cloned().unwrap_or_default();
    assert_eq!(sections.len(), 3, "the shell's three children: {}", sections.len());
    let trips = |s: &serde_json::Value| -> Vec<String> {
        s["notes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str())
            .filter(|n| n.starts_with("measured round trips"))
            .map(String::from)
            .collect()
    };
    assert!(profile["round_trips"]["trap_ns"].as_u64().is_some_and(|t| t > 0), "{}", profile["round_trips"]);
    let own = trips(&profile);
    assert!(own.len() == 1 && !own[0].contains("by process"), "the shell measured its own: {own:?}");
    let by = format!("(by process {first} of this run)");
    for s in &sections {
        let notes = trips(s);
        assert!(s["pid"].as_u64() != Some(first) && notes.len() == 1 && notes[0].ends_with(&by), "pid {}: {notes:?}", s["pid"]);
        assert_eq!(s["round_trips"], profile["round_trips"], "pid {}", s["pid"]);
    }
}

/// A profile asked for with a relative path, and a child that changes its
/// directory before it starts: the child still writes its part where the
/// run gathers them (its section is in the profile), and leaves nothing in
/// the directory it moved to.
#[test]
fn a_child_in_another_directory_writes_its_part_into_the_run() {
    let dir = Scratch::new("chdir-child");
    let prog = Program::build("dead_loop", dir.path());
    let elsewhere = dir.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let script = format!("cd {} && {}; true", elsewhere.display(), prog.exe.display());
    let sh = which("sh").expect("sh");
    // witch started in the scratch directory, with `-o chdir.json`.
    let cd = format!("cd {} && exec \"$0\" \"$@\"", dir.path().display());
    let run = WitchCmd::new("dead")
        .args(&["-p", "100000", "-q"])
        .out(Path::new("chdir.json"))
        .wrapper(&["sh", "-c", &cd])
        .run(&sh, &["-c", &script]);
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    let left: Vec<String> =
        std::fs::read_dir(&elsewhere).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert!(left.is_empty(), "the child left {left:?} in the directory it moved to");
    let profile = raw_profile(&dir.join("chdir.json"));
    let sections = profile["processes"].as_array().cloned().unwrap_or_default();
    let programs: Vec<&str> = sections.iter().filter_map(|s| s["program"].as_str()).collect();
    assert!(programs.iter().any(|p| p.ends_with("/dead_loop")), "the child's section is in the run's profile: {programs:?}");
}

/// A program the run starts that the agent cannot enter runs as it would
/// (unprofiled), and the report says so: a statically linked one, one
/// started with an environment that leaves out the agent (`env -i`), and a
/// `#!` script whose interpreter is the static one, each exec'd by a shell
/// (by a `vfork` child, with dash); a dynamically linked one with the
/// run's environment gets no such note. The same when a program starts
/// the first two with `posix_spawn`.
#[test]
fn programs_exec_d_without_the_agent_are_named_in_the_report() {
    let dir = Scratch::new("unprofiled-exec");
    let prog = Program::build("dead_loop", dir.path());
    let fixed = Program::build_with("dead_loop", dir.path(), "dead_loop_static", &["-static"]).expect("a static build (libc.a)");
    let (p, s) = (prog.exe.display().to_string(), fixed.exe.display().to_string());
    // A script whose interpreter is the static program (its argument the reps).
    let sf = dir.join("static.sh");
    std::fs::write(&sf, format!("#!{s} 200\n")).expect("write the script");
    std::fs::set_permissions(&sf, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("make it executable");
    let sf = sf.display().to_string();
    let script = format!("{s}; env -i {p}; {p}; {sf}; true");
    let sh = which("sh").expect("sh");
    let out = dir.join("unprofiled.json");
    let run = WitchCmd::new("dead").args(&["-p", "100000", "-q"]).out(&out).run(&sh, &["-c", &script]);
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    assert_eq!(run.stdout_str().lines().count(), 4, "each program ran: {}", run.describe());
    let rep = report(&out);
    let notes: Vec<String> = rep.json["notes"].as_array().into_iter().flatten().filter_map(|n| n.as_str().map(String::from)).collect();
    let unprofiled: Vec<&String> = notes.iter().filter(|n| n.contains("runs unprofiled")).collect();
    assert!(
        unprofiled.iter().any(|n| n.contains(&format!("exec'd {s}, which runs unprofiled: statically linked"))),
        "the static program is named: {notes:?}"
    );
    assert!(
        unprofiled.iter().any(|n| n.contains(&format!("exec'd {p}, which runs unprofiled: its environment leaves out"))),
        "the program started with env -i is named: {notes:?}"
    );
    assert!(
        unprofiled.iter().any(|n| n.contains(&format!("exec'd {sf}, which runs unprofiled: a script run by {s}, statically linked"))),
        "the script for the static program is named: {notes:?}"
    );
    assert_eq!(unprofiled.len(), 3, "the profiled run of {p} is not among them: {unprofiled:?}");

    // The same programs started with posix_spawn (whose child execs them
    // without a call the agent sees), the last with posix_spawnp and an
    // empty environment.
    let spawner = Program::build("spawner", dir.path());
    let out = dir.join("spawned.json");
    let run = WitchCmd::new("dead").args(&["-p", "100000", "-q"]).out(&out).run(&spawner.exe, &[&s, &p, &p]);
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    assert_eq!(run.stdout_str().lines().filter(|l| l.ends_with("exited 3")).count(), 3, "each program ran: {}", run.describe());
    let rep = report(&out);
    let notes: Vec<String> = rep.json["notes"].as_array().into_iter().flatten().filter_map(|n| n.as_str().map(String::from)).collect();
    let unprofiled: Vec<&String> = notes.iter().filter(|n| n.contains("runs unprofiled")).collect();
    assert!(unprofiled.iter().any(|n| n.contains(&format!("exec'd {s}, which runs unprofiled: statically linked"))), "{notes:?}");
    assert!(unprofiled.iter().any(|n| n.contains(&format!("exec'd {p}, which runs unprofiled: its environment leaves out"))), "{notes:?}");
    assert_eq!(unprofiled.len(), 2, "{unprofiled:?}");
}

/// A child that outlives the program (a background job) and starts a
/// program after the run ended, or about when it ends, leaves nothing
/// behind: the run's directory of parts is gone, and a late process stays
/// unprofiled rather than make it again or write into it as it goes.
/// (The run's end is the program's, as with `perf record`.)
#[test]
fn a_process_started_after_the_run_ended_leaves_nothing_behind() {
    let dir = Scratch::new("after-the-run");
    let prog = Program::build("dead_loop", dir.path());
    let sh = which("sh").expect("sh");
    for (i, delay) in ["0.3", "0.01", "0"].iter().enumerate() {
        let done = dir.join(&format!("done-{i}"));
        let script = format!("(sleep {delay}; {} > /dev/null; touch {}) & exit 0", prog.exe.display(), done.display());
        let out = dir.join(&format!("after-{i}.json"));
        let run = WitchCmd::new("dead").args(&["-p", "100000", "-q"]).out(&out).run(&sh, &["-c", &script]);
        assert_eq!(run.code(), Some(0), "{}", run.describe());
        let t0 = std::time::Instant::now();
        while !done.exists() && t0.elapsed() < std::time::Duration::from_secs(30) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(done.exists(), "the background job finished");
        let listing: Vec<String> =
            std::fs::read_dir(dir.path()).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        assert!(!listing.iter().any(|f| f.starts_with("witch-parts")), "after a delay of {delay} s, left behind: {listing:?}");
    }
}

/// `--no-children` profiles only the first process (here the shell), and
/// `--exe` only processes running the named executable (here its children).
#[test]
fn no_children_and_exe_choose_the_processes() {
    let dir = Scratch::new("sh-filter");
    let prog = Program::build("dead_loop", dir.path());
    let p = prog.exe.to_str().unwrap();
    let script = format!("{p} 20 & {p} 20 & {p} 20 & wait");
    let sh = which("sh").expect("sh");

    let out = dir.join("first.json");
    let run = WitchCmd::new("dead").args(&["-p", "100000", "-q", "--no-children"]).out(&out).run(&sh, &["-c", &script]);
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    let procs = report(&out).processes();
    assert_eq!(procs.len(), 1, "only the shell: {procs:?}");
    assert!(!procs[0].1.ends_with("/dead_loop"), "{procs:?}");

    let out = dir.join("exe.json");
    let run = WitchCmd::new("dead").args(&["-p", "100000", "-q", "--exe", "dead_loop"]).out(&out).run(&sh, &["-c", &script]);
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    let procs = report(&out).processes();
    assert_eq!(procs.len(), 3, "only the three dead_loop processes: {procs:?}");
    assert!(procs.iter().all(|(_, prog)| prog.ends_with("/dead_loop")), "{procs:?}");
}

/// A fork child starts its profile afresh: its thread counters, and the
/// notes the parent's run made (here, that threads past witch's share of
/// the address-space limit went unprofiled). The child had one thread, all
/// profiled; its section said "threads past 2 were not profiled" anyway.
/// The notes of the engine's set-up (the sampler chosen, the costs
/// measured) hold for the child too, and stay.
#[test]
fn a_fork_child_keeps_none_of_its_parents_run_notes() {
    let dir = Scratch::new("fork-notes");
    let prog = Program::build("fork_after_threads", dir.path());
    let native = prog.run_native(&["8", "64"]);
    assert_eq!(native.stdout_str(), "created 8\nchild 0\n", "{}", native.describe());
    let out = dir.join("fn.json");
    let run = WitchCmd::new("dead").arg("-q").out(&out).run(&prog.exe, &["8", "64"]);
    assert_same_behaviour(&native, &run);
    let p = raw_profile(&out);
    let notes = |s: &serde_json::Value| -> Vec<String> {
        s["notes"].as_array().into_iter().flatten().filter_map(|n| n.as_str().map(String::from)).collect()
    };
    let unprofiled = |s: &serde_json::Value| notes(s).into_iter().filter(|n| n.contains("were not profiled")).collect::<Vec<_>>();
    let failed = p["counters"]["threads_failed"].as_u64().unwrap_or(0);
    assert!(
        failed > 0 && !unprofiled(&p).is_empty(),
        "the parent's threads all fit (the test's premise): {failed} failed, notes {:?}",
        notes(&p)
    );
    let children = p["processes"].as_array().cloned().unwrap_or_default();
    assert_eq!(children.len(), 1, "one child section: {}", p["processes"]);
    let child = &children[0];
    assert_eq!(child["counters"]["threads_failed"].as_u64(), Some(0), "{}", child["counters"]);
    assert!(unprofiled(child).is_empty(), "the child's notes carry the parent's: {:?}", notes(child));
    let setup = |s: &serde_json::Value| notes(s).into_iter().filter(|n| n.starts_with("measured round trips")).count();
    assert_eq!((setup(&p), setup(child)), (1, 1), "the engine's set-up notes: parent {:?}, child {:?}", notes(&p), notes(child));
}
