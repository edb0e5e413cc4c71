//! Never harm the watched program: witch's signal handlers on a program's
//! own small alternate stacks, memory per thread, the signal queue's
//! limit, the alternate stack after a detach, `sigaction`'s flags, and the
//! cost the report claims. Each test is named after what it guards.

use witch_tests::*;

const CRAFTS: [&str; 3] = ["dead", "silent-store", "silent-load"];

/// "deepest N of SIZE bytes" from small_altstack's stderr.
fn deepest(run: &Run) -> u64 {
    let err = run.stderr_str();
    let line = err.lines().find(|l| l.starts_with("deepest ")).unwrap_or_else(|| panic!("no depth line:\n{}", run.describe()));
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("bad depth line: {line}"))
}

/// Four threads on alternate stacks of `size` bytes (a guard page below
/// each), their SA_ONSTACK handler counting, under every craft: the
/// program behaves as without witch, and witch's signals take at most
/// `extra` bytes more of those stacks than the program's own (the kernel's
/// frame and witch's entry; its handler code runs on its own stack).
fn small_stacks(size: &str, extra: u64) {
    let dir = Scratch::new(&format!("small-altstack-{size}"));
    let prog = Program::build("small_altstack", dir.path());
    let args = [size, "4", "1000"];
    let native = prog.run_native(&args);
    assert_eq!(native.code(), Some(3), "native run:\n{}", native.describe());
    assert!(native.stdout_str().contains("own stacks 4 of 4"), "{}", native.describe());
    let own = deepest(&native);
    for craft in CRAFTS {
        let out = dir.join(&format!("{craft}.json"));
        let run = WitchCmd::new(craft).arg("-q").out(&out).run(&prog.exe, &args);
        assert_same_behaviour(&native, &run);
        let used = deepest(&run);
        eprintln!("{craft}: the program's own signals took {own} bytes of its {size} stacks, with witch {used}");
        assert!(used <= own + extra, "{craft}: witch took {used} bytes of the program's {size} alternate stacks, its own signals {own}");
        report(&out).assert_samples(1.0);
    }
}

/// Item: witch's handlers overflowed a program's own small alternate
/// signal stack (they need about 13 KB and ran on it). At the smallest size
/// the kernel's frame needs here (`sysconf(_SC_MINSIGSTKSZ)`).
#[test]
fn small_alternate_stacks_are_not_overflowed_at_minsigstksz() {
    small_stacks("min", 512);
}

/// The same at `sysconf(_SC_SIGSTKSZ)`, the size most programs use.
#[test]
fn small_alternate_stacks_are_not_overflowed_at_sigstksz() {
    small_stacks("sig", 512);
}

/// The same on stacks with room for one of the program's signals and
/// hardly more (the kernel's frame and the handler's, measured, and 256
/// bytes): a sample or trap inside the program's handler must not put a
/// second kernel frame on it (witch's signals wait until such a handler
/// returns).
#[test]
fn small_alternate_stacks_with_room_for_one_signal_are_not_overflowed() {
    let dir = Scratch::new("small-altstack-one");
    let prog = Program::build("small_altstack", dir.path());
    let own = deepest(&prog.run_native(&["sig", "1", "10"]));
    let size = (own + 256).to_string();
    small_stacks(&size, 256);
}

/// gdb gives its threads alternate stacks of its own (13.5 KB on machines
/// without AVX-512) and crashed under `witch dead`. Here it runs a small
/// program under every craft, twice each, as it does without witch.
#[test]
fn gdb_runs_unharmed_under_every_craft() {
    let Some(gdb) = which("gdb") else {
        eprintln!("skipped: no gdb");
        return;
    };
    let dir = Scratch::new("gdb");
    let prog = Program::build("exit_status", dir.path());
    let args = ["-nx", "-batch", "-ex", "run", "-ex", "info inferiors", "--args", prog.exe.to_str().unwrap(), "main"];
    let native = {
        let mut c = std::process::Command::new(&gdb);
        c.args(args);
        run_cmd(c, None)
    };
    assert!(native.stdout_str().contains("exited with code 07"), "native gdb run:\n{}", native.describe());
    for craft in CRAFTS {
        for i in 0..2 {
            let out = dir.join(&format!("{craft}-{i}.json"));
            let run = WitchCmd::new(craft).arg("-q").out(&out).run(&gdb, &args);
            assert_eq!(run.code(), native.code(), "{craft} #{i}: gdb's exit differs:\n{}", run.describe());
            assert!(
                run.stdout_str().contains("exited with code 07"),
                "{craft} #{i}: gdb's inferior did not end as without witch:\n{}",
                run.describe()
            );
        }
    }
}

/// `NAME N` from many_threads' stderr line.
fn stat(run: &Run, name: &str) -> u64 {
    let err = run.stderr_str();
    let mut words = err.split_whitespace().skip_while(|w| *w != name);
    words.nth(1).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("no {name} in:\n{}", run.describe()))
}

/// Item: the cost line claimed 3.49 s of witch's CPU for a 64-thread run at
/// `-p 100us` that used 0.68 s in all (witchd exports the same number): a
/// single step's handler was timed by the cycle counter, which ran on
/// while the thread waited for a CPU. What the profile says witch cost is
/// within the CPU time the whole program used.
#[test]
fn the_cost_claimed_is_within_the_cpu_time_the_program_used() {
    let dir = Scratch::new("cost-claimed");
    let prog = Program::build("many_threads", dir.path());
    let out = dir.join("cost.json");
    let run = WitchCmd::new("dead").args(&["-p", "100us", "-q"]).out(&out).run(&prog.exe, &["64", "3000"]);
    assert_eq!(run.code(), Some(3), "{}", run.describe());
    let cpu_ns = stat(&run, "cpu_us") * 1000;
    let p = raw_profile(&out);
    let engine_ns = p["counters"]["engine_ns"].as_u64().expect("counters.engine_ns");
    eprintln!("witch's cost {:.1} ms of the program's {:.1} ms of CPU", engine_ns as f64 / 1e6, cpu_ns as f64 / 1e6);
    assert!(engine_ns > 0, "no cost at all:\n{}", run.describe());
    assert!(engine_ns <= cpu_ns, "the profile claims {engine_ns} ns of witch's CPU in a run that used {cpu_ns} ns in all");
}

/// Item: memory per thread. Under witch 2,000 threads took 1.65 GB of
/// memory against 18 MB without it (about 820 KB a thread: hashed tables
/// touched all over, and a malloc heap of its own for each thread the
/// agent allocated on). The bound stated in docs/OVERHEAD.md: at most
/// 64 KiB a thread (and 16 MiB for the agent itself) more than without
/// witch.
#[test]
fn memory_per_thread_follows_use_with_2000_threads() {
    let dir = Scratch::new("many-threads");
    let prog = Program::build("many_threads", dir.path());
    let args = ["2000", "100"];
    let native = prog.run_native(&args);
    assert_eq!(native.code(), Some(3), "{}", native.describe());
    let out = dir.join("many.json");
    let run = WitchCmd::new("dead").arg("-q").out(&out).run(&prog.exe, &args);
    assert_same_behaviour(&native, &run);
    let (n, w) = (stat(&native, "peak_rss_kib"), stat(&run, "peak_rss_kib"));
    eprintln!("2,000 threads: peak RSS {n} KiB without witch, {w} KiB with it ({} KiB a thread more)", w.saturating_sub(n) / 2000);
    assert!(w <= n + 2000 * 64 + 16 * 1024, "2,000 threads took {w} KiB under witch, {n} KiB without");
    // Threads witch could not profile (past its descriptors for watchpoints)
    // take nothing either.
    let p = raw_profile(&out);
    let failed = p["counters"]["threads_failed"].as_u64().unwrap_or(0);
    eprintln!("{} of 2,000 threads profiled; notes: {}", 2000 - failed, p["notes"]);
    assert!(failed < 2000, "no thread was profiled: {}", p["notes"]);
}

/// Item: under `ulimit -v`, where the program runs natively, it aborted
/// ("memory allocation of 2621440 bytes failed"), segfaulted, or could not
/// create its threads. witch takes at most a quarter of the limit for its
/// threads: past it, threads go unprofiled and the profile says so; the
/// program runs as without witch.
#[test]
fn under_an_address_space_limit_threads_go_unprofiled_not_the_program() {
    let dir = Scratch::new("ulimit-v");
    let prog = Program::build("many_threads", dir.path());
    let limit = ["bash", "-c", "ulimit -v 1000000 && exec \"$@\"", "sh"];
    // 64 threads with the C library's default 8 MiB stacks: half the limit.
    let args = ["64", "2000", "8192"];
    let native = {
        let mut c = std::process::Command::new(limit[0]);
        c.args(&limit[1..]).arg(&prog.exe).args(args);
        run_cmd(c, None)
    };
    assert_eq!(native.code(), Some(3), "{}", native.describe());
    let out = dir.join("limited.json");
    let run = WitchCmd::new("dead").wrapper(&limit).arg("-q").out(&out).run(&prog.exe, &args);
    assert_same_behaviour(&native, &run);
    let p = raw_profile(&out);
    let notes = p["notes"].to_string();
    let failed = p["counters"]["threads_failed"].as_u64().unwrap_or(0);
    assert!(failed < 64, "no thread was profiled: {notes}");
    if failed > 0 {
        assert!(notes.contains("RLIMIT_AS"), "{failed} threads unprofiled, and the notes do not say why: {notes}");
    }
}

/// Item: with a signal queue of one (`ulimit -i 1`), a 64-thread program at
/// `-p 1ms` died by SIGIO (exit 157): its task-clock samplers' signals
/// overflowed the queue. Now threads past what the queue holds sample with
/// the CPU-time timer, whose signal is reserved when it is made. As nobody,
/// whose queue no other process of the machine's fills.
#[test]
fn a_small_signal_queue_does_not_kill_a_many_threaded_program() {
    let dir = Scratch::new("sigpending");
    let prog = Program::build("many_threads", dir.path());
    let (witch, mut wrapper) = match Nobody::setup(&dir) {
        Some(n) => {
            chmod(dir.path(), 0o777);
            chmod(&prog.exe, 0o755);
            (n.witch, n.wrapper)
        }
        None => (witch_bin(), vec![]),
    };
    wrapper.extend(["bash", "-c", "ulimit -i 1 && exec \"$@\"", "sh"].map(String::from));
    let args = ["64", "5000"];
    let native = {
        let mut c = std::process::Command::new(&wrapper[0]);
        c.args(&wrapper[1..]).arg(&prog.exe).args(args);
        run_cmd(c, None)
    };
    assert_eq!(native.code(), Some(3), "{}", native.describe());
    for i in 0..3 {
        let out = dir.join(&format!("queue-{i}.json"));
        let run = WitchCmd::new("dead").witch(&witch).wrapper(&wrapper).args(&["-p", "1ms", "-q"]).out(&out).run(&prog.exe, &args);
        assert_same_behaviour(&native, &run);
        let notes = raw_profile(&out)["notes"].to_string();
        assert!(notes.contains("the signal queue holds 1 signals"), "run {i}: the profile does not say what the queue limits: {notes}");
    }
}

/// Item: `sigaction(SIGTRAP or SIGRTMIN+7, NULL, &old)` lost the C
/// library's `SA_RESTORER` in `sa_flags` (the program's choice was kept as
/// the program passed it). The program reads back what it set, as without
/// witch, also for an `SA_ONSTACK` handler whose mask witch extends.
#[test]
fn sigaction_reads_back_what_the_program_set() {
    let dir = Scratch::new("sigaction-readback");
    let prog = Program::build("sigaction_readback", dir.path());
    let native = prog.run_native(&[]);
    assert_eq!(native.code(), Some(3), "{}", native.describe());
    assert!(native.stdout_str().contains("flags 0x14000000"), "glibc adds SA_RESTORER:\n{}", native.describe());
    let run = WitchCmd::new("dead").arg("-q").out(&dir.join("readback.json")).run(&prog.exe, &[]);
    assert_same_behaviour(&native, &run);
}
