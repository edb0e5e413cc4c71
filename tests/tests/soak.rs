//! Attach and detach, again and again, to programs of every shape the
//! attach has to survive: a busy single-threaded program, a busy
//! multi-threaded one, an interpreter running a loop, and a program with a
//! signal handler of its own on an alternate stack of its own. Each must
//! then end exactly as an unprofiled run of the same length does. And
//! programs blocked in calls an attach must not cut short.

use witch_tests::attach::*;
use witch_tests::*;

const CYCLES: usize = 20;
const CRAFTS: [&str; 4] = ["dead", "silent-store", "dead", "silent-load"];

/// `CYCLES` attach/detach cycles with alternating crafts to `target`, then
/// its output and exit status against `native` run for as many rounds.
fn soak(dir: &Scratch, name: &str, target: Target, native: impl Fn(u64) -> Run) {
    let pid = target.pid();
    let mut target = target;
    for i in 0..CYCLES {
        let craft = CRAFTS[i % CRAFTS.len()];
        let out = dir.join(&format!("{name}-{i}.json"));
        let run = attach_cmd(&witch_bin(), &[], craft, pid, &["--duration", "150ms", "-q", "-o", out.to_str().unwrap()]);
        if !target.alive() {
            panic!("{name}: attach #{i} ({craft}) killed the program ({}):\n{}", target.how_it_ended(), run.describe());
        }
        assert_eq!(run.code(), Some(0), "{name}: attach #{i} ({craft}) failed:\n{}", run.describe());
        assert_eq!(report(&out).craft(), craft, "{name}: attach #{i}");
        assert!(!agent_armed(pid), "{name}: attach #{i} left the agent's thread or events behind");
    }
    let end = target.finish();
    assert!(end.rounds > 0, "{name}: the program did no work: {:?} {:?}", end.stdout, end.stderr);
    let native = native(end.rounds);
    assert_eq!(
        (native.code(), native.signal(), native.stdout_str()),
        (end.code(), end.signal(), end.stdout.clone()),
        "{name}: after {CYCLES} attaches the program's output or exit differs from an unprofiled run of {} rounds\n\
         stderr: {}",
        end.rounds,
        end.stderr
    );
}

fn soak_program(program: &str, threads: usize) {
    soak_program_with(program, threads, &[]);
}

/// `program 0 EXTRA...` soaked, against `program ROUNDS EXTRA...`.
fn soak_program_with(program: &str, threads: usize, extra: &[&str]) {
    let dir = Scratch::new(&format!("soak-{program}"));
    let prog = Program::build(program, dir.path());
    let args: Vec<&str> = std::iter::once("0").chain(extra.iter().copied()).collect();
    let target = Target::start(&prog.exe, &args, &[]);
    target.wait_ready(threads, None);
    soak(&dir, program, target, |rounds| {
        let r = rounds.to_string();
        let args: Vec<&str> = std::iter::once(r.as_str()).chain(extra.iter().copied()).collect();
        prog.run_native(&args)
    });
}

#[test]
fn soak_busy_single_threaded_program() {
    soak_program("busy_single", 1);
}

#[test]
fn soak_busy_multi_threaded_program() {
    soak_program("attach_target", 5);
}

#[test]
fn soak_program_with_its_own_alternate_signal_stack() {
    soak_program("own_altstack", 1);
}

/// The first item of the reliability issue, with the program's own signal:
/// its SA_ONSTACK handler, and no alternate stack of its own. A session
/// that left the thread the agent's stack, freed at detach, made the next
/// such signal run on freed memory.
#[test]
fn soak_program_with_an_on_stack_handler_and_no_stack_of_its_own() {
    soak_program_with("own_altstack", 1, &["none"]);
}

#[test]
fn soak_python_running_a_loop() {
    let Some(python) = python3() else {
        eprintln!("[witch-tests] no python3: skipping");
        return;
    };
    let dir = Scratch::new("soak-python");
    let script = programs_dir().join("busy_loop.py");
    let target = Target::start(&python, &[script.as_os_str(), "0".as_ref()], &[]);
    let exe_name = std::fs::canonicalize(&python).ok().and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()));
    target.wait_ready(1, exe_name.as_deref());
    std::thread::sleep(std::time::Duration::from_millis(300)); // past start-up, into the loop
    soak(&dir, "python3", target, |rounds| {
        let mut cmd = std::process::Command::new(&python);
        cmd.arg(&script).arg(rounds.to_string());
        run_cmd(cmd, None)
    });
}

/// The second attach to a busy single-threaded program used to kill it: the
/// first session left the thread's alternate signal stack pointing at the
/// agent's freed one, and the next signal ran on freed memory.
#[test]
fn second_attach_to_a_busy_single_threaded_program_keeps_it_alive() {
    let dir = Scratch::new("attach-single");
    let prog = Program::build("busy_single", dir.path());
    let mut target = Target::start(&prog.exe, &["0"], &[]);
    target.wait_ready(1, None);
    for i in 0..3 {
        let out = dir.join(&format!("single{i}.json"));
        let run = attach_cmd(&witch_bin(), &[], "dead", target.pid(), &["--duration", "300ms", "-q", "-o", out.to_str().unwrap()]);
        assert!(target.alive(), "attach #{i} killed the program:\n{}", run.describe());
        assert_eq!(run.code(), Some(0), "attach #{i} failed:\n{}", run.describe());
        report(&out).assert_samples(5.0);
    }
    let end = target.finish();
    let native = prog.run_native(&[&end.rounds.to_string()]);
    assert_eq!((native.code(), native.stdout_str()), (end.code(), end.stdout), "differs from an unprofiled run");
}

/// Attaching stops a thread with ptrace and sets every thread up; neither
/// may cut short a call the program is blocked in. One process per call,
/// where the call is on the thread witch stops, and one with a thread per
/// call.
#[test]
fn attaching_does_not_interrupt_blocking_calls() {
    let dir = Scratch::new("attach-blocking");
    let prog = Program::build("blocking_calls", dir.path());
    let kinds = ["sleep", "nanosleep", "usleep", "poll", "epoll", "select", "recv", "accept", "ppoll", "all"];
    let secs = "6";
    let targets: Vec<Target> = kinds.iter().map(|k| Target::start(&prog.exe, &[*k, secs], &[])).collect();
    for (t, k) in targets.iter().zip(kinds) {
        t.wait_ready(if k == "all" { 10 } else { 1 }, None);
    }
    let mut attaches = Vec::new();
    for (t, k) in targets.iter().zip(kinds) {
        let out = dir.join(&format!("{k}.json"));
        attaches.push(attach_cmd(&witch_bin(), &[], "dead", t.pid(), &["--duration", "200ms", "-q", "-o", out.to_str().unwrap()]));
    }
    for ((t, k), run) in targets.into_iter().zip(kinds).zip(attaches) {
        let end = t.finish();
        let native = prog.run_native(&[k, "1"]);
        assert_eq!(end.stdout, native.stdout_str(), "the {k} process's calls were disturbed by the attach:\n{}", run.describe());
        assert_eq!(run.code(), Some(0), "attach to the {k} process failed:\n{}", run.describe());
        assert_eq!(end.code(), Some(0));
    }
}

/// A thread busy when a session begins and idle when it ends: its next
/// signal, with SA_ONSTACK and no stack of its own, runs as without witch
/// (once, witch's stack was left installed there and freed). Also after a
/// session that finds it idle throughout. (`harm.rs` checks each thread's
/// `sigaltstack` itself.)
#[test]
fn a_thread_idle_at_detach_keeps_its_lent_stack_until_it_runs() {
    let dir = Scratch::new("idle-thread");
    let prog = Program::build("idle_thread", dir.path());
    let mut target = Target::start(&prog.exe, &["400"], &[]);
    target.wait_ready(2, None);
    let session = |name: &str, duration: &str, target: &mut Target| {
        let out = dir.join(&format!("{name}.json"));
        let run = attach_cmd(&witch_bin(), &[], "dead", target.pid(), &["--duration", duration, "-q", "-o", out.to_str().unwrap()]);
        assert!(target.alive(), "{name} killed the program:\n{}", run.describe());
        assert_eq!(run.code(), Some(0), "{name} failed:\n{}", run.describe());
    };
    // Begins while the worker is busy, ends after it went idle.
    session("busy-then-idle", "700ms", &mut target);
    // The worker idle throughout.
    session("idle", "200ms", &mut target);
    // The worker runs again (its signal first), then goes idle.
    target.send(b"w\n");
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(target.alive(), "the worker's signal after the sessions killed the program");
    session("busy-again", "700ms", &mut target);
    let end = target.finish();
    let native = prog.run_native_stdin(&["400"], b"w\n");
    assert_eq!((native.code(), native.stdout_str()), (end.code(), end.stdout.clone()), "stderr: {}", end.stderr);
}

/// A program that raises a signal at itself every few microseconds: an
/// attach that stops it just as the signal is being delivered (a ptrace
/// signal-delivery stop) must deliver it, never drop it.
#[test]
fn soak_program_raising_signals_at_itself_loses_none() {
    soak_program("raise_loop", 1);
}

/// The same with the signal sent to the process (`kill(getpid())`): the
/// program's one thread takes each before `kill` returns, as without witch;
/// the agent's control thread never does. (Before it started with every
/// signal blocked, it took 8 of them in 12 sessions, running the program's
/// handler late on a thread the program never made.)
#[test]
fn soak_program_sending_signals_to_its_process_gets_them_on_time() {
    soak_program_with("raise_loop", 1, &["kill"]);
}
