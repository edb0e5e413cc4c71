//! The agent inside programs that do things to themselves: debug a child
//! through the debug registers, lower their descriptor limit, drop their
//! privileges, end with `_exit`, close every descriptor, crash inside
//! malloc. Each program must behave exactly as it does without witch, and
//! its profile must still be delivered.

use witch_tests::*;

/// Runs `name` natively and under `witch dead` (killed after 60 s, so a
/// hang is a failure, not a stuck test), and checks they behave the same.
/// Returns the profile path and the run.
fn same_as_native(name: &str, dir: &Scratch) -> (std::path::PathBuf, Run) {
    let prog = Program::build(name, dir.path());
    let native = prog.run_native(&[]);
    let out = dir.join(&format!("{name}.json"));
    let run = WitchCmd::new("dead").wrapper(&["timeout", "-s", "KILL", "60"]).out(&out).arg("-q").run(&prog.exe, &[]);
    assert_ne!(run.signal(), Some(libc::SIGKILL), "witch hung (killed after 60 s):\n{}", run.describe());
    assert_same_behaviour(&native, &run);
    (out, run)
}

/// The notes of every process section of a profile.
fn notes(profile: &std::path::Path) -> Vec<String> {
    let p = raw_profile(profile);
    let sections = std::iter::once(&p).chain(p["processes"].as_array().into_iter().flatten());
    sections.flat_map(|s| s["notes"].as_array().into_iter().flatten()).filter_map(|n| n.as_str().map(String::from)).collect()
}

/// A debugger run under witch forks a tracee and sets a hardware watchpoint
/// in it: the tracee's debug registers must be free for it, and it must see
/// no stops but its own. The tracee's profile says why it has no samples.
#[test]
fn a_profiled_debugger_gets_the_debug_registers_and_no_extra_stops() {
    let dir = Scratch::new("debugger");
    let (out, run) = same_as_native("debugger", &dir);
    assert!(run.stdout_str().starts_with("watchpoint set, 5 traps, 6 stops"), "{}", run.describe());
    let all = profiles_near(&out);
    let said = all.iter().any(|p| notes(p).iter().any(|n| n.contains("debugger")));
    assert!(said, "no profile says the traced process was left to its debugger: {all:?}");
}

/// The program lowers RLIMIT_NOFILE (soft and hard) to 8: the agent's
/// descriptors must not take the numbers it then has, and the profile must
/// still be written.
#[test]
fn profile_survives_a_lowered_descriptor_limit() {
    let dir = Scratch::new("fd-limit");
    let (out, run) = same_as_native("fd_limit", &dir);
    assert_eq!(run.stdout_str(), "5 files openable\n");
    report(&out).assert_samples(5.0);
}

/// A root program drops to nobody: the profile must still be written.
#[test]
fn profile_survives_dropping_privileges() {
    if !is_root() {
        eprintln!("[witch-tests] not root: skipping");
        return;
    }
    let dir = Scratch::new("drop-priv");
    let (out, _) = same_as_native("drop_privileges", &dir);
    report(&out).assert_samples(5.0);
}

/// The program ends with `_exit`, which skips atexit handlers: the profile
/// must still be written.
#[test]
fn profile_survives_exit_without_atexit_handlers() {
    let dir = Scratch::new("exit-now");
    let (out, run) = same_as_native("exit_now", &dir);
    assert_eq!(run.code(), Some(5));
    report(&out).assert_samples(5.0);
}

/// The program closes every descriptor while a thread runs, then reuses the
/// numbers; the thread's end must not make the agent close the program's
/// files, and the profile (whose descriptor was closed too) still arrives.
#[test]
fn agent_never_closes_the_programs_descriptors() {
    let dir = Scratch::new("fd-reuse");
    let (out, run) = same_as_native("fd_reuse", &dir);
    assert_eq!(run.stdout_str(), "8 of 8 pipes work\n");
    assert_eq!(raw_profile(&out)["ended_by"].as_str(), Some("exit"));
}

/// Heap corruption caught inside malloc, with its lock held, aborts the
/// program: it must die by SIGABRT as without witch (no deadlock in the
/// agent's crash handler), and its profile must still be written.
#[test]
fn crash_inside_malloc_dies_as_without_witch() {
    let dir = Scratch::new("crash-malloc");
    let (out, run) = same_as_native("crash_in_malloc", &dir);
    assert_eq!(run.signal(), Some(libc::SIGABRT), "{}", run.describe());
    let p = raw_profile(&out);
    assert_eq!(p["ended_by"].as_str(), Some("signal 6"), "{p}");
}

/// The engine's handlers never allocate (they may interrupt malloc): with
/// WITCH_CHECK_HANDLER_ALLOC=1 the agent counts any allocation made in
/// them, and the profile would say so. Every craft, threads, and the
/// single-step bursts.
#[test]
fn handlers_never_allocate() {
    let dir = Scratch::new("handler-alloc");
    let cases: [(&str, &str, &[&str]); 5] = [
        ("dead", "threads_dead", &[]),
        ("silent-store", "silent_store", &[]),
        ("silent-load", "redundant_load", &[]),
        ("dead", "listing_4_3", &["WITCH_BURST=32"]),
        ("silent-load", "redundant_load", &["WITCH_BURST=32"]),
    ];
    for (i, (craft, program, env)) in cases.into_iter().enumerate() {
        let prog = Program::build(program, dir.path());
        let out = dir.join(&format!("{i}-{program}.json"));
        let mut wrapper = vec!["env", "WITCH_CHECK_HANDLER_ALLOC=1"];
        wrapper.extend_from_slice(env);
        let run = WitchCmd::new(craft).wrapper(&wrapper).out(&out).arg("-q").run(&prog.exe, &[]);
        let native = prog.run_native(&[]);
        assert_same_behaviour(&native, &run);
        let rep = report(&out);
        rep.assert_samples(5.0);
        let said: Vec<String> = notes(&out).into_iter().filter(|n| n.contains("allocations inside signal handlers")).collect();
        assert!(said.is_empty(), "{craft} on {program} {env:?}: {said:?}");
    }
}

/// A small file system of its own for the output, unmounted when dropped.
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    fn mount(dir: &Scratch, kib: u32) -> Option<SmallDisk> {
        let at = dir.join("disk");
        std::fs::create_dir(&at).ok()?;
        let st = std::process::Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"]).arg(&at).status();
        st.is_ok_and(|s| s.success()).then_some(SmallDisk(at))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The output's disk fills up while the program runs (item 12 of the
/// reliability issue: a full disk lost the run, and witch said the program
/// left no profile). The agent takes room for its profile when the process
/// starts, so it is written whatever the program does to the disk; witch,
/// which then cannot write the merged profile, says where the data is.
#[test]
fn profile_survives_a_disk_that_fills_during_the_run() {
    let dir = Scratch::new("full-disk");
    let Some(disk) = SmallDisk::mount(&dir, 4096) else {
        eprintln!("[witch-tests] cannot mount a tmpfs (not root?): skipping");
        return;
    };
    let prog = Program::build("dead_loop", dir.path());
    let native = prog.run_native(&["200"]);
    let filler = disk.0.join("filler");
    let script = format!("{} 200 & sleep 0.3; dd if=/dev/zero of={} bs=64k 2>/dev/null; wait $!", prog.exe.display(), filler.display());
    let out = disk.0.join("p.json");
    let sh = which("sh").unwrap();
    let run =
        WitchCmd::new("dead").wrapper(&["timeout", "-s", "KILL", "120"]).args(&["-p", "1ms", "-q"]).out(&out).run(&sh, &["-c", &script]);
    assert_eq!((run.code(), run.stdout_str()), (native.code(), native.stdout_str()), "{}", run.describe());
    assert!(std::fs::metadata(&filler).is_ok_and(|m| m.len() > 0), "the disk was not filled");
    // Written in full (the reserves given back at the end may make room
    // for it), or kept beside the output, with where said.
    let parts: Vec<std::path::PathBuf> = std::fs::read_dir(&disk.0)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("witch-parts-")))
        .collect();
    let profile = if out.exists() {
        assert!(parts.is_empty(), "parts left beside a written profile: {parts:?}");
        out.clone()
    } else {
        assert_eq!(parts.len(), 1, "no profile, and the parts are not kept beside the output:\n{}", run.describe());
        let err = run.stderr_str();
        assert!(err.contains(&parts[0].display().to_string()) && err.contains("witch report"), "say where the data is:\n{err}");
        parts[0].clone()
    };
    let files: Vec<std::path::PathBuf> = if profile.is_dir() {
        profile.read_dir().unwrap().flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "json")).collect()
    } else {
        vec![profile.clone()]
    };
    // A part the agent could not fill is empty.
    let all: Vec<serde_json::Value> =
        files.iter().filter_map(|f| serde_json::from_slice(&std::fs::read(f).unwrap_or_default()).ok()).collect();
    let sections = all.iter().flat_map(|p| std::iter::once(p).chain(p["processes"].as_array().into_iter().flatten()));
    let samples: u64 = sections
        .filter(|s| s["program"].as_str().is_some_and(|n| n.ends_with("dead_loop")))
        .map(|s| s["counters"]["samples"].as_u64().unwrap_or(0))
        .sum();
    assert!(samples > 0, "no samples of dead_loop in {}: {all:?}", profile.display());
}

/// The output's disk is full before the run (item 12 of the reliability
/// issue): refused before the program runs (exit 125, one line), and
/// nothing left behind (the parts directory was).
#[test]
fn a_full_disk_is_refused_before_the_run_leaving_nothing_behind() {
    let dir = Scratch::new("full-at-start");
    let Some(disk) = SmallDisk::mount(&dir, 256) else {
        eprintln!("[witch-tests] cannot mount a tmpfs (not root?): skipping");
        return;
    };
    let prog = Program::build("dead_loop", dir.path());
    let filler = disk.0.join("filler");
    let fill = std::process::Command::new("dd").arg("if=/dev/zero").arg(format!("of={}", filler.display())).arg("bs=4k").output();
    assert!(fill.is_ok() && std::fs::metadata(&filler).is_ok_and(|m| m.len() > 0), "could not fill the disk");
    let run = WitchCmd::new("dead").arg("-q").out(&disk.0.join("p.json")).run(&prog.exe, &["20"]);
    assert_eq!(run.code(), Some(125), "{}", run.describe());
    assert!(run.stdout.is_empty(), "the program must not have run:\n{}", run.describe());
    assert_eq!(run.stderr_str().lines().count(), 1, "one line:\n{}", run.describe());
    let left: Vec<String> = std::fs::read_dir(&disk.0)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "filler")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
