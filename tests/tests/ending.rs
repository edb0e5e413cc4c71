//! How a run or a session ends, and what witch says about it: every thread
//! counted, the real reason a run left no profile, a stopped target's
//! profile kept, and an output path that cannot work refused before the
//! program runs.

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;
use witch_tests::*;

/// 64 threads that take no CPU time (they sleep), and the main thread: a
/// CPU-time sampler samples none of them, and the report said "0 threads"
/// (it counted the threads with samples). It counts every thread profiled.
#[test]
fn a_report_counts_every_thread_not_only_those_with_samples() {
    let dir = Scratch::new("idle-threads");
    let prog = Program::build("idle_threads", dir.path());
    let out = dir.join("idle.json");
    let run = WitchCmd::new("dead").args(&["-q"]).out(&out).run(&prog.exe, &["64"]);
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    assert_eq!(run.stdout_str(), "64 threads\n");
    let text = witch_raw(&["report".as_ref(), out.as_os_str()]);
    // The header line, wrapped to 80 columns: its continuations are indented.
    let shown = text.stdout_str();
    let mut lines = shown.lines();
    let first = lines.next().unwrap_or_default().to_string();
    let head = std::iter::once(first.as_str()).chain(lines.take_while(|l| l.starts_with(' '))).collect::<Vec<_>>().join(" ");
    let head = head.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(head.ends_with(", 65 threads"), "{head}");
    let json = witch_raw(&["report".as_ref(), out.as_os_str(), "--json".as_ref()]);
    let v: serde_json::Value = serde_json::from_str(&json.stdout_str()).unwrap();
    assert_eq!(v["threads"], 65, "{}", json.stdout_str());
}

/// A run that left no profile was always asked "did it clear LD_PRELOAD?",
/// whatever happened. witch now says what did: the program died of a
/// signal the agent does not write at (SIGUSR1); the descriptor limit was
/// too low, or the loader would ignore the agent (a set-user-ID program):
/// witch says so before running the program.
#[test]
fn a_run_without_a_profile_says_why() {
    let dir = Scratch::new("no-profile");
    let prog = Program::build("killed_by", dir.path());
    let out = dir.join("p.json");
    let last_line = |r: &Run| r.stderr_str().lines().last().unwrap_or_default().to_string();

    let run = WitchCmd::new("dead").out(&out).run(&prog.exe, &[]);
    assert_eq!(run.signal(), Some(libc::SIGUSR1), "{}", run.describe());
    let said = last_line(&run);
    assert!(said.starts_with("witch: the program left no profile: it was killed by SIGUSR1 before its agent could write"), "{said}");
    assert!(!run.stderr_str().contains("LD_PRELOAD"), "{}", run.stderr_str());

    // A descriptor limit witch and its agent cannot work under: said before the program runs.
    let mut cmd = Command::new(witch_bin());
    cmd.args(["dead", "-o"]).arg(&out).arg("--").arg(&prog.exe);
    // SAFETY: setrlimit is async-signal-safe; nothing else runs before exec.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit { rlim_cur: 5, rlim_max: 5 };
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            Ok(())
        });
    }
    let run = run_cmd(cmd, None);
    assert_eq!(run.code(), Some(125), "{}", run.describe());
    assert!(!run.stdout_str().contains("done"), "the program ran: {}", run.describe());
    assert_eq!(
        run.stderr_str().trim(),
        "witch: the descriptor limit is 5 (ulimit -n), too low for witch and its agent, which need 6; raise it"
    );

    if !is_root() {
        eprintln!("[witch-tests] not root: cannot make a program set-user-ID to another user; that case is skipped");
        return;
    }
    let suid = dir.join("killed_by_suid");
    std::fs::copy(&prog.exe, &suid).unwrap();
    std::os::unix::fs::chown(&suid, Some(NOBODY), None).unwrap();
    chmod(&suid, 0o4755);
    chmod(dir.path(), 0o755);
    // Said before the program runs, with the status of a program that cannot be profiled.
    let run = WitchCmd::new("dead").out(&out).run(&suid, &[&libc::SIGTERM.to_string()]);
    let said = last_line(&run);
    assert_eq!(run.code(), Some(126), "{}", run.describe());
    assert!(said.contains("is set-user-ID (to uid 65534), so the dynamic loader would ignore witch's agent in it"), "{said}");
}

/// A target stopped (SIGSTOP) when its session ends: its agent's thread is
/// stopped too, and the whole profile was lost (exit 2). witch lends that
/// one thread a run: the profile is written, witch exits 0, and the target
/// is still stopped, as it was; continued, it ends as an unprofiled run does.
#[test]
fn a_target_stopped_when_the_session_ends_keeps_its_profile() {
    let dir = Scratch::new("stopped");
    let exe = Program::build("attach_target", dir.path());
    let mut target = attach::Target::start(&exe.exe, &["0"], &[]);
    target.wait_ready(5, None);
    let pid = target.pid();
    let out = dir.join("stopped.json");
    let stopper = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1000));
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    });
    let run = attach::attach_cmd(&witch_bin(), &[], "dead", pid, &["--duration", "2", "-q", "-o", out.to_str().unwrap()]);
    stopper.join().unwrap();
    let state = attach::status_field(pid, "State:");
    assert!(state.starts_with('T'), "the target is no longer stopped: {state}");
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    let p = raw_profile(&out);
    assert_eq!(p["pid"], pid);
    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
    std::thread::sleep(Duration::from_millis(200));
    assert!(target.alive());
    let ended = target.finish();
    assert_eq!(ended.code(), Some(7), "{}", ended.stderr);
    let native = Command::new(&exe.exe).arg(ended.rounds.to_string()).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&native.stdout), ended.stdout, "the target's output differs from an unprofiled run's");
}

/// `-o file/` names a directory: the program ran to its end, and only then
/// did witch fail to write. It is refused before the program runs.
#[test]
fn an_output_naming_a_directory_is_refused_before_the_program_runs() {
    let dir = Scratch::new("trailing-slash");
    let prog = Program::build("killed_by", dir.path());
    for o in ["prof.json/", "prof.json/."] {
        let out = dir.join(o);
        let run = WitchCmd::new("dead").out(&out).run(&prog.exe, &[&libc::SIGTERM.to_string()]);
        assert_eq!(run.code(), Some(125), "{o}: {}", run.describe());
        assert!(!run.stdout_str().contains("done"), "{o}: the program ran: {}", run.describe());
        assert!(run.stderr_str().contains("is a directory; give the profile a file name"), "{o}: {}", run.stderr_str());
    }
}
