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

/// Item: a thread busy when a session ended (spinning, or blocked in a
/// system call it entered after the session had lent it witch's alternate
/// signal stack) kept that stack installed after the detach. After each
/// attach, every thread's `sigaltstack` is exactly what the program set
/// (its own, or none), and a signal it raises at itself runs there; before
/// any attach, after the first, the second and the tenth. The two "block"
/// threads are busy when each session starts and blocked in `read` when it
/// ends; one thread is blocked throughout; two spin throughout.
#[test]
fn every_thread_has_its_own_alternate_stack_after_a_detach() {
    use witch_tests::attach::*;
    let dir = Scratch::new("altstack-detach");
    let prog = Program::build("altstack_detach", dir.path());
    let mut target = Target::start(&prog.exe, &[] as &[&str], &[]);
    target.wait_ready(6, None);
    target.send(b"r\n");
    let pid = target.pid();
    let agent_runs = || thread_names(pid).iter().any(|n| n == "witch-agent");
    let rounds = 10;
    for round in 1..=rounds {
        target.send(b"g\n");
        let out = dir.join(&format!("session-{round}.json"));
        let session = std::thread::spawn(move || {
            attach_cmd(&witch_bin(), &[], "dead", pid, &["--duration", "200ms", "-q", "-o", out.to_str().unwrap()])
        });
        // The busy threads are set up (and sample) while the session runs;
        // then they block, and the session ends with them blocked.
        assert!(eventually(std::time::Duration::from_secs(10), agent_runs), "session {round} did not start");
        std::thread::sleep(std::time::Duration::from_millis(100));
        target.send(b"b\n");
        let run = session.join().expect("the attach thread");
        assert!(target.alive(), "session {round} killed the program:\n{}", run.describe());
        assert_eq!(run.code(), Some(0), "session {round} failed:\n{}", run.describe());
        // Profiled meanwhile: the busy threads' samples.
        let samples = raw_profile(&dir.join(&format!("session-{round}.json")))["counters"]["samples"].as_u64().unwrap_or(0);
        assert!(samples > 0, "session {round} took no sample");
        target.send(b"r\n");
    }
    let end = target.finish();
    assert_eq!(end.code(), Some(3), "stderr: {}", end.stderr);
    let wrong: Vec<&str> = end.stdout.lines().filter(|l| l.contains("WRONG")).collect();
    assert!(wrong.is_empty(), "after a detach, threads' alternate stacks are not the program's:\n{}", end.stdout);
    assert_eq!(end.stdout.lines().filter(|l| l.ends_with("altstack ok signal ok")).count(), 5 * (rounds + 1), "{}", end.stdout);
}

/// Item: only about 255 threads were profiled: witch keeps its descriptors
/// in the top 1,024 numbers below the program's limit (at most 4,096), one
/// per debug register and thread. The range now grows upwards once full,
/// as far as the limit allows: under a limit of 8,192 every one of 1,000
/// threads is profiled. Under 1,024 (512 numbers, room for 128 threads) the
/// profile says how many were profiled and why not the others.
#[test]
fn threads_past_the_256th_are_profiled_and_a_limit_is_said() {
    let mut hard = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: fills the plain struct.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut hard) };
    if hard.rlim_max < 8192 {
        eprintln!("skipped: the hard descriptor limit is {}", hard.rlim_max);
        return;
    }
    let dir = Scratch::new("fd-threads");
    let prog = Program::build("many_threads", dir.path());
    let args = ["1000", "100"];
    for limit in [8192, 1024] {
        let wrapper = ["bash".to_string(), "-c".into(), format!("ulimit -Sn {limit} && exec \"$@\""), "sh".into()];
        let out = dir.join(&format!("limit-{limit}.json"));
        let run = WitchCmd::new("dead").wrapper(&wrapper).arg("-q").out(&out).run(&prog.exe, &args);
        assert_eq!(run.code(), Some(3), "{}", run.describe());
        let p = raw_profile(&out);
        let (threads, failed) = (p["counters"]["threads"].as_u64().unwrap_or(0), p["counters"]["threads_failed"].as_u64().unwrap_or(0));
        eprintln!("ulimit -n {limit}: profiled {} of {threads} threads", threads - failed);
        assert_eq!(threads, 1001, "every thread is counted: {}", p["counters"]);
        if limit == 8192 {
            assert_eq!(failed, 0, "threads went unprofiled: {}", p["notes"]);
        } else {
            assert!(failed > 0 && failed < threads, "{failed} of {threads} unprofiled under ulimit -n 1024");
            let notes = p["notes"].to_string();
            assert!(notes.contains("witch keeps its 512 in numbers 512 to 1023"), "the notes do not say why: {notes}");
            let text = witch_raw(&["report".as_ref(), out.as_os_str()]).stdout_str().replace("\n     ", "");
            assert!(text.contains(&format!("profiled {} of 1001 threads", threads - failed)), "{text}");
        }
    }
}

/// Item: the code cache's mapping (1.3 MiB a thread, made at the thread's
/// first window) was not counted in witch's quarter of a limited address
/// space: under `ulimit -v 1000000` with 64 threads on 8 MiB stacks, witch
/// took 302 MiB more than the program alone, past its share of 244 MiB. Now
/// what witch takes for threads (beyond what it takes with one thread)
/// stays within its share, and the program keeps the rest.
#[test]
fn code_caches_count_in_witchs_share_of_a_limited_address_space() {
    let dir = Scratch::new("ulimit-v-cache");
    let prog = Program::build("many_threads", dir.path());
    let limit_kib = 1_000_000u64;
    let limit = ["bash".to_string(), "-c".into(), format!("ulimit -v {limit_kib} && exec \"$@\""), "sh".into()];
    let peak_vm = |threads: &str, witch: bool| {
        let args = [threads, "20000", "8192"];
        let run = if witch {
            WitchCmd::new("dead").wrapper(&limit).arg("-q").out(&dir.join(&format!("{threads}.json"))).run(&prog.exe, &args)
        } else {
            let mut c = std::process::Command::new(&limit[0]);
            c.args(&limit[1..]).arg(&prog.exe).args(args);
            run_cmd(c, None)
        };
        assert_eq!(run.code(), Some(3), "{}", run.describe());
        stat(&run, "peak_vm_kib")
    };
    let base = peak_vm("1", true).saturating_sub(peak_vm("1", false));
    let many = peak_vm("64", true).saturating_sub(peak_vm("64", false));
    eprintln!("witch's address space: {base} KiB with one thread, {many} KiB with 64; its share for threads {} KiB", limit_kib / 4);
    assert!(
        many.saturating_sub(base) <= limit_kib / 4,
        "witch took {many} KiB of a {limit_kib} KiB address space ({base} KiB with one thread), past its quarter"
    );
}

/// A program that makes a hole in its own mapping and later unmaps the
/// whole range in one call (correct natively, where nothing else maps
/// memory meanwhile) survives three attaches in a row: witch's memory
/// (the agent and the libraries loaded with it, its tables, the control
/// thread's stack) is kept out of the hole or off the program's `munmap`.
/// Before, the first attach killed it (4 of 4 runs).
#[test]
fn attaching_leaves_a_program_that_unmaps_its_own_holes_running() {
    use witch_tests::attach::*;
    let dir = Scratch::new("harm-holes");
    let prog = Program::build("hole_unmap", dir.path());
    // As a user would: unprivileged where the tests can drop privileges.
    let (witch, wrapper) = as_nobody(&dir).unwrap_or_else(|| (witch_bin(), Vec::new()));
    chmod(&prog.exe, 0o755);
    let mut target = Target::start(&prog.exe, &["1000000"], &wrapper);
    target.wait_ready(1, Some("hole_unmap"));
    for attach in 0..3 {
        let out = dir.join(&format!("attach{attach}.json"));
        let run = attach_cmd(&witch, &wrapper, "dead", target.pid(), &["--duration", "500ms", "-q", "-o", out.to_str().unwrap()]);
        assert!(target.alive(), "attach #{attach} killed the program: {}\n{}", target.how_it_ended(), run.describe());
        assert_eq!(run.code(), Some(0), "attach #{attach}:\n{}", run.describe());
    }
}

/// Item: a program whose own signal handler ran for a few sampling periods
/// while a burst single-stepped the code it interrupted (code the program
/// wrote, which the code cache leaves to single steps) was killed by
/// SIGTRAP: the engine gave the burst up as lost at a tick that found no
/// step, and the trap flag the kernel kept in the handler's frame trapped
/// once the handler returned, with no burst to take it. With a SIGTRAP
/// handler of its own, the program's handler got that trap and each one
/// after it, and the program crawled. Under each craft, with the default
/// disposition and with its own handler: the same output (no trap of
/// witch's reaches the program) and exit status, bursts given up included.
#[test]
fn a_burst_given_up_in_the_programs_long_handler_leaves_no_trap_behind() {
    let dir = Scratch::new("harm-slow-handler");
    let prog = Program::build_with("slow_handler", dir.path(), "slow_handler", &["-pthread"]).expect("build slow_handler");
    // A burst is given up in the handler in about one run in eight of a
    // few tenths of a second: passes of every craft and mode until one
    // was (each pass checking the program's behaviour all the same).
    let mut lost = 0;
    for _pass in 0..4 {
        for mode in ["default", "own"] {
            let native = prog.run_native(&["2000", mode]);
            assert_eq!(native.code(), Some(0), "{}", native.describe());
            assert!(native.stdout_str().contains("handled=yes traps=0"), "{}", native.describe());
            for craft in ["dead", "silent-load"] {
                let out = dir.join(&format!("{craft}-{mode}.json"));
                let run = WitchCmd::new(craft).args(&["-q", "-p", "200000"]).out(&out).run(&prog.exe, &["2000", mode]);
                assert_same_behaviour(&native, &run);
                lost += raw_profile(&out)["counters"]["bursts_lost"].as_u64().unwrap_or(0);
            }
        }
        if lost > 0 {
            break;
        }
    }
    // The case it guards: bursts given up while the program's handler ran.
    assert!(lost > 0, "no burst was given up: the test did not reach the case it guards");
}
