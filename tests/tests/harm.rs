//! Never harm the watched program: witch's signal handlers on a program's
//! own small alternate stacks, memory per thread, the signal queue's
//! limit, the alternate stack after a detach, `sigaction`'s flags, and the
//! cost the report claims. Each test is named after what it guards.

use witch_tests::attach::*;
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
            assert!(run.stdout_str().contains("exited with code 07"), "{craft} #{i}: gdb's inferior did not end as without witch:\n{}", run.describe());
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
