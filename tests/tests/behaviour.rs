//! witch as a wrapper: exit status, signals and stdin pass through, and bad
//! input gets a one-line error and a non-zero exit.

use std::path::Path;
use witch_tests::*;

#[test]
fn exit_status_passes_through() {
    let dir = Scratch::new("exit7");
    let prog = Program::build("exit_status", dir.path());
    let native = prog.run_native(&["main"]);
    assert_eq!(native.code(), Some(7), "native run:\n{}", native.describe());
    let out = dir.join("exit7.json");
    let run = WitchCmd::new("dead").args(&["-p", "100000", "-q"]).out(&out).run(&prog.exe, &["main"]);
    assert_same_behaviour(&native, &run);
    assert!(out.is_file(), "no profile at {} after exit(7)\n{}", out.display(), run.describe());
}

#[test]
fn exit_from_a_thread_passes_through_and_leaves_a_profile() {
    let dir = Scratch::new("exit-thread");
    let prog = Program::build("exit_status", dir.path());
    let native = prog.run_native(&["thread"]);
    assert_eq!(native.code(), Some(7), "native run:\n{}", native.describe());
    let out = dir.join("exit-thread.json");
    let run = WitchCmd::new("dead").args(&["-p", "100000", "-q"]).out(&out).run(&prog.exe, &["thread"]);
    assert_same_behaviour(&native, &run);
    let rep = report(&out);
    assert!(rep.samples() > 0.0, "the exiting thread's samples should be in the profile\n{}", rep.dump());
}

#[test]
fn killed_by_a_signal_dies_the_same_way_and_leaves_a_profile() {
    let dir = Scratch::new("sigterm");
    let prog = Program::build("sigterm", dir.path());
    let native = prog.run_native(&[]);
    assert_eq!(native.signal(), Some(libc::SIGTERM), "native run:\n{}", native.describe());
    let out = dir.join("sigterm.json");
    let run = WitchCmd::new("dead").args(&["-p", "100000", "-q"]).out(&out).run(&prog.exe, &[]);
    assert!(
        run.signal() == Some(libc::SIGTERM) || run.code() == Some(128 + libc::SIGTERM),
        "witch should die of SIGTERM like the program (or exit 143)\n{}",
        run.describe()
    );
    assert_eq!(native.stdout, run.stdout, "stdout differs\nnative:\n{}\nwitch:\n{}", native.describe(), run.describe());
    // Best effort per the spec ("when possible"), but a plain SIGTERM with the
    // default action is the easy case: the profile should be there.
    assert!(out.is_file(), "no profile at {} after SIGTERM\n{}", out.display(), run.describe());
    let rep = report(&out);
    assert!(rep.samples() > 0.0, "{}", rep.dump());
}

#[test]
fn stdin_is_forwarded() {
    let dir = Scratch::new("stdin");
    let prog = Program::build("cat_like", dir.path());
    // More than a pipe buffer (64 KiB), so forwarding must stream.
    let mut input = Vec::new();
    for i in 0..20000 {
        input.extend_from_slice(format!("line {i}: the quick brown fox\n").as_bytes());
    }
    let native = prog.run_native_stdin(&[], &input);
    assert_eq!(native.code(), Some(0), "native run:\n{}", native.describe());
    assert!(native.stdout == input);
    let out = dir.join("stdin.json");
    let run = WitchCmd::new("dead").args(&["-p", "100000", "-q"]).out(&out).stdin(&input).run(&prog.exe, &[]);
    assert_same_behaviour(&native, &run);
}

/// A bad invocation: non-zero exit, nothing on stdout, exactly one line on
/// stderr (not counting clap's standard "For more information, try '--help'."
/// hint after a usage error).
fn assert_one_line_error(run: &Run, what: &str) -> String {
    let err = run.stderr_str();
    let lines: Vec<&str> =
        err.lines().filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with("For more information, try")).collect();
    assert!(
        run.code().is_some_and(|c| c != 0) && lines.len() == 1 && run.stdout.is_empty(),
        "{what}: want a non-zero exit, empty stdout and a one-line error on stderr\n{}",
        run.describe()
    );
    lines[0].to_string()
}

fn witch_dead(dir: &Scratch, opts: &[&str], program: &Path) -> Run {
    WitchCmd::new("dead").args(opts).arg("-q").out(&dir.join("bad.json")).run(program, &[])
}

#[test]
fn missing_program_is_an_error() {
    let dir = Scratch::new("missing");
    let missing = dir.join("no-such-program");
    let run = witch_dead(&dir, &[], &missing);
    let line = assert_one_line_error(&run, "missing program");
    assert!(line.contains("no-such-program"), "the error should name the program: {line:?}");
}

#[test]
fn non_executable_file_is_an_error() {
    let dir = Scratch::new("noexec");
    let file = dir.join("not-executable");
    std::fs::write(&file, "#!/bin/sh\necho should not run\n").unwrap();
    chmod(&file, 0o644);
    let run = witch_dead(&dir, &[], &file);
    let line = assert_one_line_error(&run, "non-executable file");
    assert!(line.contains("not-executable"), "the error should name the program: {line:?}");
}

#[test]
fn a_directory_is_not_a_program() {
    let dir = Scratch::new("dir-as-program");
    let run = witch_dead(&dir, &[], dir.path());
    let line = assert_one_line_error(&run, "a directory as the program");
    assert_eq!(run.code(), Some(126), "{}", run.describe());
    assert!(line.contains("is a directory"), "{line}");
}

#[test]
fn statically_linked_program_is_refused() {
    let dir = Scratch::new("static");
    let prog = match Program::build_with("exit_status", dir.path(), "exit_status_static", &["-static"]) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("[witch-tests] skipping: cannot link statically here: {e}");
            return;
        }
    };
    let run = witch_dead(&dir, &[], &prog.exe);
    let line = assert_one_line_error(&run, "statically linked program");
    assert!(
        line.to_lowercase().contains("static") && line.contains("--exact"),
        "the error should say the program is static and point to --exact: {line:?}"
    );
}

/// A bad testing knob in witch's environment (`WITCH_BURST_WEIGHT=heavy`,
/// `WITCH_LINKS=off`) is refused before the program runs, in one line that
/// names it, with witch's usage status; a good one runs as without it.
#[test]
fn a_bad_knob_in_the_environment_is_refused_before_the_run() {
    let dir = Scratch::new("bad-knob");
    let prog = Program::build("exit_status", dir.path());
    let out = dir.join("p.json");
    for (knob, bad) in [("WITCH_BURST_WEIGHT", "heavy"), ("WITCH_LINKS", "off"), ("WITCH_WINDOW", "long")] {
        let setting = format!("{knob}={bad}");
        let run = WitchCmd::new("dead").arg("-q").out(&out).wrapper(&["env", setting.as_str()]).run(&prog.exe, &["main"]);
        let line = assert_one_line_error(&run, &setting);
        assert_eq!(run.code(), Some(125), "{setting}: {}", run.describe());
        assert!(line.contains(knob) && line.contains(bad), "{setting}: {line}");
        assert!(run.stdout.is_empty(), "{setting}: the program must not have run:\n{}", run.describe());
    }
    let run = WitchCmd::new("dead").arg("-q").out(&out).wrapper(&["env", "WITCH_LINKS=0"]).run(&prog.exe, &["main"]);
    assert_same_behaviour(&prog.run_native(&["main"]), &run);
}

/// A mistyped option before the program is refused in one line with witch's
/// usage status (125), not taken as the program's name ("program not found",
/// 127); after the program, and after `--`, options are the program's own.
#[test]
fn a_mistyped_option_before_the_program_is_refused() {
    let dir = Scratch::new("mistyped");
    let prog = Program::build("exit_status", dir.path());
    for (opts, similar) in [(&["--perid", "1ms"][..], Some("--period")), (&["-x"][..], None), (&["--pairz", "3"][..], Some("--pairs"))] {
        let mut args: Vec<std::ffi::OsString> = vec!["dead".into()];
        args.extend(opts.iter().map(Into::into));
        args.push(prog.exe.clone().into());
        let run = witch_raw(&args);
        let line = assert_one_line_error(&run, &format!("{opts:?}"));
        assert_eq!(run.code(), Some(125), "{opts:?}: {}", run.describe());
        assert!(line.contains(&format!("unknown option {}", opts[0])), "{opts:?}: {line}");
        assert!(similar.is_none_or(|s| line.contains(s)), "{opts:?}: the error does not suggest {similar:?}: {line}");
        assert!(!line.contains("not found"), "{opts:?}: {line}");
    }
    let echo = which("echo").expect("echo");
    let out = dir.join("echo.json");
    for dashes in [&[][..], &["--"][..]] {
        let mut args: Vec<std::ffi::OsString> = vec!["dead".into(), "-q".into(), "-o".into(), out.clone().into()];
        args.extend(dashes.iter().map(Into::into));
        args.extend([echo.clone().into(), "--perid".into(), "-x".into()]);
        let run = witch_raw(&args);
        assert_eq!(run.code(), Some(0), "{}", run.describe());
        assert_eq!(run.stdout_str(), "--perid -x\n", "{}", run.describe());
    }
}

/// A set-user-ID program run by another user is refused before it runs
/// (status 126, as for a static program), naming the bit: the loader would
/// ignore the agent, and --exact's tracing would drop the bit.
#[test]
fn a_set_user_id_program_is_refused_up_front() {
    let dir = Scratch::new("setuid");
    let Some(nobody) = Nobody::setup(&dir) else {
        eprintln!("[witch-tests] skipping: a set-user-ID program needs root to make and setpriv to run as another user");
        return;
    };
    let prog = Program::build("exit_status", dir.path());
    chmod(dir.path(), 0o755);
    chmod(&prog.exe, 0o4755);
    for exact in [false, true] {
        let opts: &[&str] = if exact { &["-q", "--exact"] } else { &["-q"] };
        let run = WitchCmd::new("dead").nobody(&nobody).args(opts).out(Path::new("/dev/null")).run(&prog.exe, &["main"]);
        let line = assert_one_line_error(&run, "set-user-ID program");
        assert_eq!(run.code(), Some(126), "exact {exact}: {}", run.describe());
        assert!(line.contains("set-user-ID"), "exact {exact}: the error does not name the bit: {line}");
        assert!(!run.stdout_str().contains("exit_status"), "the program ran: {}", run.describe());
    }
}

#[test]
fn unknown_event_is_an_error() {
    let dir = Scratch::new("bogus-event");
    let prog = Program::build("exit_status", dir.path());
    let run = witch_dead(&dir, &["-e", "bogus"], &prog.exe);
    let line = assert_one_line_error(&run, "-e bogus");
    assert!(line.contains("bogus"), "the error should name the event: {line:?}");
}

#[test]
fn too_many_debug_registers_is_an_error() {
    let dir = Scratch::new("dr9");
    let prog = Program::build("exit_status", dir.path());
    let run = witch_dead(&dir, &["--debug-registers", "9"], &prog.exe);
    let line = assert_one_line_error(&run, "--debug-registers 9");
    assert!(line.to_lowercase().contains("debug"), "the error should be about --debug-registers: {line:?}");
}

/// A program that puts itself in a seccomp sandbox partway through (with
/// `prctl`, directly or through `syscall`, or `seccomp(2)` through
/// `syscall` as libseccomp does), whose
/// filter kills the process (or fails with EPERM) at the system calls a
/// profiler makes, behaves as without witch: after the filter it works in
/// a thread, in a fork child that aborts and in an image it execs. The
/// profile holds what came before and says why it stops. (Before the agent
/// left at the filter, the filter killed the program at once: SIGSYS.)
#[test]
fn a_program_that_sandboxes_itself_is_left_before_its_filter_goes_in() {
    let dir = Scratch::new("sandboxed");
    let prog = Program::build("sandboxed", dir.path());
    for (how, action) in [("prctl", "kill"), ("sysprctl", "kill"), ("seccomp", "kill"), ("seccomp", "errno")] {
        let args = [how, action, "20000000"];
        let native = prog.run_native(&args);
        assert_eq!(native.code(), Some(3), "native run:\n{}", native.describe());
        let out = dir.join(&format!("{how}-{action}.json"));
        let run = WitchCmd::new("dead").args(&["-p", "500000", "-q"]).out(&out).run(&prog.exe, &args);
        assert_same_behaviour(&native, &run);
        let p = raw_profile(&out);
        assert_eq!(p["ended_by"].as_str(), Some("sandbox"), "{how} {action}: {p}");
        let notes = p["notes"].to_string();
        assert!(notes.contains("seccomp sandbox"), "{how} {action}: the profile should say why it stops: {notes}");
        let rep = report(&out);
        assert!(rep.samples() > 0.0, "{how} {action}: the work before the filter should be sampled\n{}", rep.dump());
    }
    // Sandboxed before the first sample: the report says why, and does not
    // send the user after a smaller period.
    let out = dir.join("at-once.json");
    let run = WitchCmd::new("dead").args(&["-q"]).out(&out).run(&prog.exe, &["prctl", "kill", "1"]);
    assert_eq!(run.code(), Some(3), "{}", run.describe());
    let text = witch_raw(&["report", out.to_str().unwrap()]).stdout_str().split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(text.contains("seccomp sandbox") && !text.contains("smaller -p"), "{text}");
}

/// A program that turns on syscall user dispatch for itself (as emulators
/// such as Wine do), with `prctl` or through `syscall`, and flips its
/// selector to "block" around code that makes no system call: the agent
/// leaves before dispatch goes on, as before a seccomp filter, and the
/// program runs as natively, its SIGSYS handler never called. (Before, a
/// handler of witch's made a system call while the selector said "block",
/// and the program died of SIGSYS, every run.)
#[test]
fn a_program_that_turns_on_syscall_user_dispatch_is_left_before_it_does() {
    let dir = Scratch::new("syscall-dispatch");
    let prog = Program::build("syscall_dispatch", dir.path());
    for how in ["prctl", "syscall"] {
        let args = [how, "100000"];
        let native = prog.run_native(&args);
        assert_eq!(native.code(), Some(0), "native run:\n{}", native.describe());
        assert!(native.stdout_str().contains("SIGSYS caught 0"), "{}", native.describe());
        let out = dir.join(&format!("{how}.json"));
        let run = WitchCmd::new("dead").args(&["-q"]).out(&out).run(&prog.exe, &args);
        assert_same_behaviour(&native, &run);
        let p = raw_profile(&out);
        assert_eq!(p["ended_by"].as_str(), Some("sandbox"), "{how}: {p}");
        let notes = p["notes"].to_string();
        assert!(notes.contains("syscall user dispatch"), "{how}: the profile should say why it stops: {notes}");
        assert!(report(&out).samples() > 0.0, "{how}: the work before should be sampled");
    }
}

/// A program that forbids itself memory both writable and executable
/// (`prctl(PR_SET_MDWE)`, as systemd's MemoryDenyWriteExecute=yes does),
/// where the kernel refuses the code cache's one mapping: the cache is
/// mapped twice, an executable view and a writable one, and every thread
/// runs windows, sampled and in `--exact`, which records all three. The
/// program runs as natively. (Before, its threads' bursts single-stepped,
/// silently, and an exact count left out every thread started after the
/// setting.)
#[test]
fn a_program_that_forbids_writable_code_gets_its_code_cache_mapped_twice() {
    let dir = Scratch::new("write-xor-exec");
    let prog = Program::build_with("write_xor_exec", dir.path(), "write_xor_exec", &["-pthread"]).expect("build write_xor_exec");
    for (mode, args) in [(&["-q"][..], ["20000"]), (&["--exact", "-q"][..], ["200"])] {
        let out = dir.join("wx.json");
        let native = prog.run_native(&args);
        assert_eq!(native.code(), Some(0), "native run:\n{}", native.describe());
        assert!(native.stdout_str().contains("write xor execute: 1"), "{}", native.describe());
        let run = WitchCmd::new("dead").args(mode).out(&out).run(&prog.exe, &args);
        assert_same_behaviour(&native, &run);
        let raw = raw_profile(&out);
        let text = witch_raw(&["report", out.to_str().unwrap()]).stdout_str().split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(!text.contains("refused the code cache's memory"), "{mode:?}: {text}");
        let threads = raw["threads"].as_array().cloned().unwrap_or_default();
        let recorded = threads.iter().filter(|t| t["counters"]["samples"].as_u64().unwrap_or(0) > 0).count();
        if mode.len() == 1 {
            assert!(raw["counters"]["windows"].as_u64().unwrap_or(0) > 0, "windows should run: {}", raw["counters"]);
            assert!(recorded > 0, "the threads should be sampled");
        } else {
            // Each thread stores 200 x 4096 words at least.
            assert_eq!(recorded, 3, "every thread recorded: {}", raw["counters"]);
            assert!(threads.iter().all(|t| t["counters"]["samples"].as_u64().unwrap_or(0) >= 200 * 4096), "{}", raw["counters"]);
        }
    }
}

/// A program that patches its own code in place (mprotect, write,
/// mprotect, as hot-patching and function-hook libraries do; through the
/// C library and through `syscall`) runs the new code on every call after
/// the patch, sampled and in `--exact`. (Before, windows ran copies of the
/// old code: a few thousand calls of 20 million sampled, every call after
/// the patch in `--exact`, returned the old value.)
#[test]
fn a_program_that_patches_its_own_code_runs_the_new_code() {
    let dir = Scratch::new("hot-patch");
    let prog = Program::build("hot_patch", dir.path());
    for how in ["libc", "syscall"] {
        for (mode, calls) in [(&["-q"][..], "20000000"), (&["--exact", "-q"][..], "200000")] {
            let args = [how, calls];
            let native = prog.run_native(&args);
            assert_eq!(native.code(), Some(0), "native run:\n{}", native.describe());
            let out = dir.join(&format!("{how}.json"));
            let run = WitchCmd::new("dead").args(mode).out(&out).run(&prog.exe, &args);
            assert_same_behaviour(&native, &run);
        }
    }
}

/// A program that installs a SIGTRAP handler of its own partway through,
/// through the C library's `sigaction` or through
/// `syscall(SYS_rt_sigaction)`, sees its own trap and no other of witch's,
/// with a window at every 1 ms tick: the agent keeps its handler and
/// remembers the program's. (Before, the system call put the program's
/// handler in place of the agent's, and the code cache's next exit killed
/// the program: SIGSEGV.)
#[test]
fn a_program_that_installs_its_own_trap_handler_sees_only_its_own_traps() {
    let dir = Scratch::new("trap-handler");
    let prog = Program::build("trap_handler", dir.path());
    for how in ["libc", "syscall"] {
        let native = prog.run_native(&[how]);
        assert!(native.stdout_str().contains("traps seen 1"), "{}", native.describe());
        for craft in ["dead", "silent-load"] {
            let out = dir.join(&format!("{how}-{craft}.json"));
            let run = WitchCmd::new(craft).args(&["-q", "--overhead", "0", "-p", "1ms"]).out(&out).run(&prog.exe, &[how]);
            assert_same_behaviour(&native, &run);
        }
    }
}

/// A program that uses every real-time signal itself
/// (tests/programs/own_rt_signals.c), one of which witch samples with:
/// with a handler, blocked and taken with `sigwaitinfo` or a `signalfd`,
/// and blocked while queued then unblocked, each signal comes back once
/// with its own value, none of witch's reaches it, and its mask reads back
/// as it set it; at the defaults, with a window at every 1 ms tick, and in
/// `--exact`; in a child it forks, which takes them the same way after
/// the parent's mask; and across an exec that fails. A signal it blocked and took for itself is held
/// for it, and the report says so. (Before, the agent ran a handler for
/// the one it blocked, and its default action killed the program: every
/// run.)
#[test]
fn a_program_that_takes_its_own_real_time_signals_gets_each_once() {
    let dir = Scratch::new("own-rt-signals");
    let prog = Program::build_with("own_rt_signals", dir.path(), "own_rt_signals", &["-pthread"]).expect("build own_rt_signals");
    for how in ["handler", "wait", "signalfd", "unblock"] {
        let args = [how, "300", "fork"];
        let native = prog.run_native(&args);
        assert!(
            native.stdout_str().contains(&format!("child {how}: taken 9300 of 9300, wrong 0, mask wrong 0"))
                && native.stdout_str().contains(&format!("\n{how}: taken 9300 of 9300, wrong 0, mask wrong 0")),
            "{how}: native run:\n{}",
            native.describe()
        );
        for (tag, opts) in [("defaults", vec![]), ("1ms", vec!["--overhead", "0", "-p", "1ms"]), ("exact", vec!["--exact"])] {
            let out = dir.join(&format!("{how}-{tag}.json"));
            let run = WitchCmd::new("dead").arg("-q").args(&opts).out(&out).run(&prog.exe, &args);
            assert_same_behaviour(&native, &run);
            if how == "wait" && tag != "exact" {
                let rep = report(&out);
                let held = rep.json["counters"]["signals_held"].as_u64().unwrap_or(0);
                assert!(held > 0, "{how} {tag}: no held signal counted\n{}", rep.dump());
                assert!(rep.json["notes"].to_string().contains("witch left it to the program"), "{how} {tag}: {}", rep.json["notes"]);
            }
        }
        // An exec that fails halfway (the agent gives its profile first,
        // then goes on): a thread that held the signal stays unsampled.
        // (Before, its sampler started again, and its `sigwaitinfo` took
        // witch's ticks: 180 of 9,300 signals wrong.)
        let args = [how, "300", "execfail"];
        let native = prog.run_native(&args);
        let run = WitchCmd::new("dead").arg("-q").out(&dir.join(&format!("{how}-execfail.json"))).run(&prog.exe, &args);
        assert_same_behaviour(&native, &run);
    }
}

/// A program that turns the time-stamp counter off for itself
/// (`prctl(PR_SET_TSC, PR_TSC_SIGSEGV)`, with `prctl` or through
/// `syscall`, as record-and-replay tools and some sandboxes do) and then
/// works in three threads runs as natively, and its work is sampled: the
/// agent's clocks stop reading the counter first. (Before, the next read
/// of the counter in witch's handlers killed it with SIGSEGV.)
#[test]
fn a_program_that_turns_the_time_stamp_counter_off_is_unharmed() {
    let dir = Scratch::new("no-tsc");
    let prog = Program::build_with("no_tsc", dir.path(), "no_tsc", &["-pthread"]).expect("build no_tsc");
    for how in ["prctl", "syscall"] {
        let native = prog.run_native(&[how]);
        assert_eq!(native.code(), Some(0), "native run:\n{}", native.describe());
        assert!(native.stdout_str().contains("state 2"), "the counter should be off natively:\n{}", native.describe());
        for craft in ["dead", "silent-load"] {
            let out = dir.join(&format!("{how}-{craft}.json"));
            let run = WitchCmd::new(craft).args(&["-q"]).out(&out).run(&prog.exe, &[how]);
            assert_same_behaviour(&native, &run);
            // Sampled stores; for loads, which this work makes few of (one
            // a 64 stores), the engine's ticks in its threads.
            let rep = report(&out);
            let ticks = raw_profile(&out)["counters"]["interrupts"].as_u64().unwrap_or(0);
            let sampled = if craft == "dead" { rep.samples() > 0.0 } else { ticks > 0 };
            assert!(sampled, "{how} {craft}: the work after the counter went off should be sampled\n{}", rep.dump());
        }
    }
}

/// A program that opens hardware breakpoints on itself (four write
/// breakpoints with `perf_event_open`, one more in a thread, after work
/// long enough for witch to have armed its watchpoints) opens them all and
/// counts every write, as natively: witch leaves the debug registers to
/// it, as to a debugger, and its profile says so. (Before, witch held them:
/// every open failed with ENOSPC.)
#[test]
fn a_program_that_opens_its_own_hardware_breakpoints_gets_them() {
    let dir = Scratch::new("own-breakpoints");
    let prog = Program::build_with("own_breakpoints", dir.path(), "own_breakpoints", &["-pthread"]).expect("build own_breakpoints");
    let native = prog.run_native(&[]);
    assert_eq!(native.code(), Some(0), "native run:\n{}", native.describe());
    assert!(native.stdout_str().contains("opened 4 of 4, counted 1000 1000 1000 1000"), "natively:\n{}", native.describe());
    for craft in ["dead", "silent-load"] {
        let out = dir.join(&format!("{craft}.json"));
        let run = WitchCmd::new(craft).args(&["-q"]).out(&out).run(&prog.exe, &[]);
        assert_same_behaviour(&native, &run);
        let p = raw_profile(&out);
        assert_eq!(p["ended_by"].as_str(), Some("traced"), "{craft}: {p}");
        assert!(
            p["notes"].to_string().contains("hardware breakpoint of its own"),
            "{craft}: the profile should say why it stops: {}",
            p["notes"]
        );
    }
}

/// A program that unmasks every floating-point exception
/// (`feenableexcept(FE_ALL_EXCEPT)`, as Fortran's `-ffpe-trap` does) and
/// does integer work in three threads, with allocations and a fork child,
/// runs as natively, and no thread finds a sticky exception flag it did
/// not raise. (Before, the agent's start left the inexact flag set in
/// every program under witch, and its arithmetic at the program's exit
/// trapped: SIGFPE.)
#[test]
fn a_program_that_traps_floating_point_exceptions_is_unharmed() {
    let dir = Scratch::new("fp-traps");
    let prog = Program::build_with("fp_traps", dir.path(), "fp_traps", &["-pthread", "-lm"]).expect("build fp_traps");
    // About 0.15 s of CPU in all (the default reps are too short to sample
    // loads beside other tests).
    let args = ["15000"];
    let native = prog.run_native(&args);
    assert_eq!(native.code(), Some(0), "native run:\n{}", native.describe());
    assert_eq!(native.stdout_str().matches("flags 0").count(), 3, "natively no flag is raised:\n{}", native.describe());
    for craft in ["dead", "silent-load"] {
        let out = dir.join(&format!("{craft}.json"));
        let run = WitchCmd::new(craft).args(&["-q"]).out(&out).run(&prog.exe, &args);
        let sorted = |s: String| {
            let mut l: Vec<String> = s.lines().map(String::from).collect();
            l.sort();
            l
        };
        assert_eq!((run.code(), run.signal()), (Some(0), None), "{craft}:\n{}", run.describe());
        assert_eq!(
            sorted(run.stdout_str()),
            sorted(native.stdout_str()),
            "{craft}: the threads' output (in any order) differs:\n{}",
            run.describe()
        );
        // Sampled stores; for loads, which this work makes few of (one a 64
        // stores: 131 in 17 windows, none picked, in a CI run beside other
        // tests), the engine's ticks in its threads, where its code ran
        // under the program's control word.
        let ticks = raw_profile(&out)["counters"]["interrupts"].as_u64().unwrap_or(0);
        let sampled = if craft == "dead" { report(&out).samples() > 0.0 } else { ticks > 0 };
        assert!(sampled, "{craft}: the work should be sampled ({ticks} ticks)");
    }
}

/// witch itself under a seccomp filter (in a container, say), which the
/// program would inherit: refused before the program runs, in one line,
/// with the status of a program that cannot be run under witch.
#[test]
fn witch_under_a_seccomp_filter_says_so_before_it_runs_the_program() {
    let dir = Scratch::new("under-seccomp");
    let prog = Program::build("sandboxed", dir.path());
    let mut cmd = std::process::Command::new(&prog.exe);
    cmd.args(["run", "errno"]).arg(witch_bin()).args(["dead", "-q", "--"]).arg(&prog.exe).args(["exec-child", "1000"]);
    let run = run_cmd(cmd, None);
    assert_eq!(run.code(), Some(126), "{}", run.describe());
    assert!(run.stdout.is_empty(), "the program ran:\n{}", run.describe());
    let err = run.stderr_str();
    assert_eq!(err.lines().count(), 1, "one line:\n{}", run.describe());
    assert!(err.contains("seccomp filter"), "{}", run.describe());
}

/// Anything given where a profile goes (an endless device, random bytes,
/// 50 MB of garbage, an empty file, a truncated profile, a directory with
/// no profile, a missing file) gets a one-line error and exit 2 from `report`, `gate` and
/// `diff`, at once and in bounded memory: each runs under a 1 GiB
/// address-space limit. (`/dev/zero` once grew witch to the OOM killer.)
#[test]
fn bad_profiles_get_a_one_line_error_in_bounded_memory() {
    use std::os::unix::process::CommandExt;
    let dir = Scratch::new("bad-profiles");
    let prog = Program::build("exit_status", dir.path());
    let good = dir.join("good.json");
    let run = WitchCmd::new("dead").args(&["-q"]).out(&good).run(&prog.exe, &["main"]);
    assert!(good.is_file(), "{}", run.describe());
    let garbage = dir.join("garbage.bin");
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let bytes: Vec<u8> = (0..50 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect();
    std::fs::write(&garbage, bytes).unwrap();
    let empty = dir.join("empty.json");
    std::fs::write(&empty, "").unwrap();
    let truncated = dir.join("truncated.json");
    let text = std::fs::read_to_string(&good).unwrap();
    std::fs::write(&truncated, &text[..text.len() / 2]).unwrap();
    // (A directory with profiles in it is read as one: see `witch report --help`.)
    let empty_dir = dir.join("no-profiles-here");
    std::fs::create_dir(&empty_dir).unwrap();
    let inputs = [
        Path::new("/dev/zero").to_path_buf(),
        Path::new("/dev/urandom").to_path_buf(),
        garbage,
        empty,
        truncated,
        empty_dir,
        dir.join("missing.json"),
    ];
    for bad in &inputs {
        let b = bad.to_str().unwrap();
        let g = good.to_str().unwrap();
        for args in
            [vec!["report", b], vec!["report", "--json", b], vec!["gate", "--max-waste", "20%", b], vec!["diff", g, b], vec!["diff", b, g]]
        {
            let mut cmd = std::process::Command::new(witch_bin());
            cmd.args(&args);
            // SAFETY: setrlimit only, between fork and exec.
            unsafe {
                cmd.pre_exec(|| {
                    let l = libc::rlimit { rlim_cur: 1 << 30, rlim_max: 1 << 30 };
                    libc::setrlimit(libc::RLIMIT_AS, &l);
                    Ok(())
                });
            }
            let run = run_cmd(cmd, None);
            let what = format!("witch {}", args.join(" "));
            assert_eq!(run.code(), Some(2), "{what}\n{}", run.describe());
            let line = assert_one_line_error(&run, &what);
            assert!(run.elapsed < std::time::Duration::from_secs(10), "{what} took {:?}", run.elapsed);
            if b.starts_with("/dev/") {
                // Refused for what it is, not after reading to the limit.
                assert!(line.contains("not a witch profile"), "{what}: {line}");
            }
        }
    }
    // A directory of a run's parts (what an interrupted run leaves) is read
    // as one run by every command, as by `report`.
    let parts = dir.join("parts");
    std::fs::create_dir(&parts).unwrap();
    std::fs::copy(&good, parts.join("1-1.json")).unwrap();
    let p = parts.to_str().unwrap();
    for args in [vec!["report", p], vec!["gate", "--max-waste", "100%", p], vec!["diff", p, good.to_str().unwrap()]] {
        let run = witch_raw(&args);
        assert_eq!(run.code(), Some(0), "witch {}\n{}", args.join(" "), run.describe());
    }
}

/// A program started with standard descriptors closed (`<&- 2>&-`, as some
/// daemons and service managers start programs) and SIGPIPE ignored
/// starts so under witch too, in every mode: its writes to a closed
/// descriptor fail, its first `open` gets the lowest one, and a write to a
/// closed pipe returns EPIPE instead of killing it, as without witch (the
/// Rust runtime opens /dev/null on closed standard descriptors in witch
/// itself, and sets SIGPIPE back to default in a child it starts).
#[test]
fn closed_standard_descriptors_and_ignored_signals_stay_so_for_the_program() {
    let dir = Scratch::new("std-fds");
    let prog = Program::build("std_fds", dir.path());
    let exe = prog.exe.display().to_string();
    let setup = "trap '' PIPE HUP; exec";
    let native = std::process::Command::new("sh").args(["-c", &format!("{setup} {exe} <&- 2>&-")]).output().unwrap();
    let native = String::from_utf8_lossy(&native.stdout).into_owned();
    assert_eq!(native, "standard descriptors open (bits): 2; the first open gets 0\nignored signals: 1 13\n");
    for mode in [None, Some("--exact"), Some("--exact=step")] {
        let out = dir.join("std.json");
        let wrap = format!("{setup} \"$0\" \"$@\" <&- 2>&-");
        let mut cmd = WitchCmd::new("dead").arg("-q").out(&out).wrapper(&["sh", "-c", &wrap]);
        if let Some(m) = mode {
            cmd = cmd.arg(m);
        }
        let run = cmd.run(&prog.exe, &[]);
        assert_eq!(run.code(), Some(0), "{mode:?}: {}", run.describe());
        assert_eq!(run.stdout_str(), native, "{mode:?}: {}", run.describe());
    }
}

/// A program whose threads keep per-CPU counters with restartable
/// sequences (rseq), as tcmalloc's per-CPU caches do: the kernel restarts
/// a critical section only at its own addresses, so the code cache must
/// never run one (a copy preempted halfway went on, and threads sharing a
/// CPU lost each other's increments: millions of 60 million at ticks of
/// 1 ms). Every craft, at the defaults and with a window at every 1 ms
/// tick; the sum must stay exact, and the report says where the windows
/// stopped.
#[test]
fn a_program_with_restartable_sequences_keeps_its_per_cpu_counters() {
    let dir = Scratch::new("rseq");
    let prog = Program::build_with("rseq_counters", dir.path(), "rseq_counters", &["-pthread"]).expect("build rseq_counters");
    let args = ["6", "5000000", "40"];
    let native = prog.run_native(&args);
    assert_eq!(native.code(), Some(0), "natively the sum is exact (and glibc gives each thread an rseq area):\n{}", native.describe());
    for craft in ["dead", "silent-store", "silent-load"] {
        for settings in [&["-q"][..], &["-q", "--overhead", "0", "-p", "1ms"][..]] {
            let out = dir.join(&format!("{craft}.json"));
            let run = WitchCmd::new(craft).args(settings).out(&out).run(&prog.exe, &args);
            assert_same_behaviour(&native, &run);
            let raw = raw_profile(&out);
            if settings.len() > 1 {
                let reached = raw["counters"]["critical_sections"].as_u64().unwrap_or(0);
                assert!(reached > 0, "{craft} {settings:?}: windows at every tick should reach the sections:\n{}", raw["counters"]);
                let text = witch_raw(&["report", out.to_str().unwrap()]).stdout_str().split_whitespace().collect::<Vec<_>>().join(" ");
                assert!(text.contains("restartable sequence's critical section"), "{craft}: the report should say so:\n{text}");
            }
        }
    }
}
