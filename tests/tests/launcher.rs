//! witch as a launcher: its own exit statuses, the output checked before the
//! program runs, signals meant for the program, a program that makes witch
//! its tracer, machine-readable output beside the program's own, and a run's
//! profile never lost.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use witch_tests::*;

/// witch started in the background, in its own process group, without core dumps.
fn spawn_witch(args: &[&str]) -> std::process::Child {
    let mut cmd = Command::new(witch_bin());
    cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    // SAFETY: setrlimit is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            let zero = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            libc::setrlimit(libc::RLIMIT_CORE, &zero);
            Ok(())
        });
    }
    cmd.spawn().expect("start witch")
}

/// Waits for a child up to `limit`; None (after killing its group) if it is still running.
fn wait_for(child: &mut std::process::Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    let _ = child.wait();
    None
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
    v.sort();
    v
}

fn parts_dirs(dir: &Path) -> Vec<PathBuf> {
    entries(dir).into_iter().filter(|n| n.starts_with("witch-parts-")).map(|n| dir.join(n)).collect()
}

/// A program that calls PTRACE_TRACEME makes witch its tracer: a signal it
/// takes stops it. witch resumes each stop and never takes one for the
/// program's end (it used to exit 137 and orphan the program). The agent
/// leaves such a program to its debugger, and its profile says so.
#[test]
fn a_program_that_asks_its_parent_to_trace_it_runs_as_it_would() {
    let dir = Scratch::new("traceme");
    let prog = Program::build("traceme", dir.path());
    let native = prog.run_native(&[]);
    assert_eq!(native.code(), Some(0), "native run:\n{}", native.describe());
    let out = dir.join("traceme.json");
    let run = WitchCmd::new("dead").args(&["-p", "100000", "-q"]).out(&out).run(&prog.exe, &[]);
    assert_same_behaviour(&native, &run);
    let notes = raw_profile(&out)["notes"].to_string();
    assert!(notes.contains("PTRACE_TRACEME"), "the profile says why it is empty: {notes}");

    // Signals it takes stop it for witch, which must deliver them and go on:
    // the program's own handler runs each time, as under a parent that is no debugger.
    let run = WitchCmd::new("dead").args(&["-p", "100000", "-q"]).out(&out).run(&prog.exe, &["300", "signals"]);
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    assert_eq!(run.stdout_str(), native.stdout_str().replace("caught 0", "caught 3"), "{}", run.describe());
}

/// SIGINT and SIGQUIT sent to witch's pid alone (`kill -INT`, `timeout
/// --foreground`) are passed on: the program dies of them, and so does witch.
#[test]
fn sigint_and_sigquit_sent_to_witch_alone_reach_the_program() {
    let dir = Scratch::new("sigint");
    let prog = Program::build("spin", dir.path());
    for sig in [libc::SIGINT, libc::SIGQUIT] {
        let out = dir.join(&format!("spin-{sig}.json"));
        let mut w = spawn_witch(&["dead", "-q", "-o", out.to_str().unwrap(), "--", prog.exe.to_str().unwrap(), "20"]);
        std::thread::sleep(Duration::from_millis(1500));
        unsafe { libc::kill(w.id() as i32, sig) };
        let st = wait_for(&mut w, Duration::from_secs(15)).unwrap_or_else(|| panic!("signal {sig} to witch alone did not end the program"));
        assert!(st.signal() == Some(sig) || st.code() == Some(128 + sig), "witch should end like the program, by signal {sig}: {st:?}");
    }
}

/// An unusable -o is found before the program runs: exit 125, one line
/// naming the problem, and the program never started.
#[test]
fn an_unusable_output_is_refused_before_the_program_runs() {
    let dir = Scratch::new("bad-output");
    let prog = Program::build("dead_loop", dir.path());
    let ro = dir.join("read-only");
    std::fs::create_dir(&ro).unwrap();
    let mut cases: Vec<(Vec<String>, PathBuf, &str, Vec<String>)> =
        vec![(vec![], dir.join("missing").join("p.json"), "missing", vec![]), (vec![], dir.path().to_path_buf(), "is a directory", vec![])];
    if let Some(n) = Nobody::setup(&dir) {
        chmod(dir.path(), 0o755);
        chmod(&ro, 0o555);
        chmod(&prog.exe, 0o755);
        cases.push((n.wrapper.clone(), ro.join("p.json"), "read-only", vec![n.witch.display().to_string()]));
    } else if !is_root() {
        chmod(&ro, 0o555);
        cases.push((vec![], ro.join("p.json"), "read-only", vec![]));
    }
    for (wrapper, out, what, witch) in cases {
        let mut cmd = WitchCmd::new("dead").wrapper(&wrapper).arg("-q").out(&out);
        if let Some(w) = witch.first() {
            cmd = cmd.witch(Path::new(w));
        }
        let run = cmd.run(&prog.exe, &["20"]);
        let err = run.stderr_str();
        assert_eq!(run.code(), Some(125), "-o {} ({what}): want exit 125\n{}", out.display(), run.describe());
        assert!(run.stdout.is_empty(), "-o {} ({what}): the program must not have run\n{}", out.display(), run.describe());
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.contains(what) || err.contains("denied") || err.contains("No such file"), "{what}: {err}");
    }
    assert!(parts_dirs(dir.path()).is_empty() && parts_dirs(&ro).is_empty(), "nothing left behind: {:?}", entries(dir.path()));
}

/// When the profile cannot be written at the end, the program's status still
/// passes through, witch says where the data is, and it is there, readable.
/// No temporary file is left.
#[test]
fn a_profile_that_cannot_be_written_at_the_end_is_kept_and_said_where() {
    let dir = Scratch::new("late-failure");
    let prog = Program::build("dead_loop", dir.path());
    let out = dir.join("p.json");
    // The program's own shell makes the output path a directory while it runs.
    let sh = which("sh").unwrap();
    let script = format!("mkdir {}; exec {} 20", out.display(), prog.exe.display());
    let run = WitchCmd::new("dead").args(&["-p", "100000", "-q"]).out(&out).run(&sh, &["-c", &script]);
    assert_eq!(run.code(), Some(3), "the program's status passes through\n{}", run.describe());
    let parts = parts_dirs(dir.path());
    assert_eq!(parts.len(), 1, "the parts are kept: {:?}", entries(dir.path()));
    let err = run.stderr_str();
    assert!(err.contains(&parts[0].display().to_string()) && err.contains("witch report"), "say where the data is:\n{err}");
    assert!(!entries(dir.path()).iter().any(|n| n.ends_with(".tmp")), "temporary files left: {:?}", entries(dir.path()));
    let rep = report(&parts[0]);
    rep.assert_samples(50.0);
    let saved = dir.join("saved.json");
    let r = witch_raw(&["report".as_ref(), parts[0].as_os_str(), "--save".as_ref(), saved.as_os_str()]);
    assert!(r.status.success(), "{}", r.describe());
    assert!(report(&saved).samples() > 0.0);
}

/// witch killed by SIGKILL: the program goes on, and its profile lands
/// beside the asked-for output, in a directory that says how to read it.
#[test]
fn a_killed_witch_leaves_the_profile_beside_the_output_with_how_to_read_it() {
    let dir = Scratch::new("killed");
    let prog = Program::build("spin", dir.path());
    let out = dir.join("p.json");
    let mut w = spawn_witch(&["dead", "-q", "-o", out.to_str().unwrap(), "--", prog.exe.to_str().unwrap(), "2"]);
    std::thread::sleep(Duration::from_millis(800));
    unsafe { libc::kill(w.id() as i32, libc::SIGKILL) };
    let _ = w.wait();
    // The program finishes on its own and writes its part (the agent makes
    // the file when the process starts and fills it when it ends).
    let until = Instant::now() + Duration::from_secs(20);
    let part = loop {
        let found: Vec<PathBuf> = parts_dirs(dir.path())
            .into_iter()
            .flat_map(|d| entries(&d).into_iter().filter(|n| n.ends_with(".json")).map(move |n| d.join(n)))
            .filter(|p| std::fs::read(p).is_ok_and(|b| serde_json::from_slice::<serde_json::Value>(&b).is_ok()))
            .collect();
        if let Some(p) = found.first() {
            break p.clone();
        }
        assert!(Instant::now() < until, "no profile appeared beside {}: {:?}", out.display(), entries(dir.path()));
        std::thread::sleep(Duration::from_millis(100));
    };
    let parts = part.parent().unwrap();
    let readme = std::fs::read_to_string(parts.join("README")).expect("a README in the parts directory");
    assert!(readme.contains(&format!("witch report {}", parts.display())), "{readme}");
    let rep = report(parts);
    rep.assert_samples(20.0);
}

/// witch's own failures when it runs a program are 125 (witch), 126 (cannot
/// run the program), 127 (no such program); the program's own status, 2
/// included, is witch's.
#[test]
fn witchs_own_failures_have_their_own_exit_codes() {
    let dir = Scratch::new("exit-codes");
    let witch = |args: &[&str]| witch_raw(args);
    assert_eq!(witch(&["dead", "-q", "--", "/nonexistent/program"]).code(), Some(127));
    assert_eq!(witch(&["dead", "-q", "--", "no-such-program-in-path-at-all"]).code(), Some(127));
    let file = dir.join("not-executable");
    std::fs::write(&file, "#!/bin/sh\nexit 0\n").unwrap();
    chmod(&file, 0o644);
    assert_eq!(witch(&["dead", "-q", "--", file.to_str().unwrap()]).code(), Some(126));
    if let Ok(st) = Program::build_with("exit_status", dir.path(), "exit_static", &["-static"]) {
        assert_eq!(witch(&["dead", "-q", "--", st.exe.to_str().unwrap()]).code(), Some(126));
    }
    let prog = Program::build("exit_status", dir.path());
    for bad in [&["dead", "--debug-registers", "9", "--", "x"][..], &["dead", "--replacement", "lifo", "x"], &["dead"]] {
        let r = witch(bad);
        assert_eq!(r.code(), Some(125), "{bad:?}\n{}", r.describe());
    }
    let r = witch(&["dead", "-e", "bogus", "-q", "--", prog.exe.to_str().unwrap(), "main"]);
    assert_eq!(r.code(), Some(125), "{}", r.describe());
    // The program's status, whatever it is.
    let sh = which("sh").unwrap();
    let out = dir.join("o.json");
    for code in [0, 2, 7, 125] {
        let r = WitchCmd::new("dead").args(&["-q"]).out(&out).run(&sh, &["-c", &format!("exit {code}")]);
        assert_eq!(r.code(), Some(code), "{}", r.describe());
    }
    // Other commands keep 0/1/2.
    assert_eq!(witch(&["report", "/nonexistent.json"]).code(), Some(2));
    assert_eq!(witch(&["frobnicate"]).code(), Some(2));
}

/// `--format json`: the JSON report alone on stdout, valid, while the
/// program's own stdout still reaches the user (on stderr); `--json-out`
/// leaves the program's stdout where it was.
#[test]
fn json_on_stdout_while_the_program_prints_to_its_own() {
    let dir = Scratch::new("json-stdout");
    let prog = Program::build("dead_loop", dir.path());
    let native = prog.run_native(&["20"]);
    let out = dir.join("p.json");
    let run = WitchCmd::new("dead").args(&["-p", "100000", "--format", "json"]).out(&out).run(&prog.exe, &["20"]);
    assert_eq!(run.code(), native.code());
    let v: serde_json::Value =
        serde_json::from_slice(&run.stdout).unwrap_or_else(|e| panic!("stdout is not one JSON object: {e}\n{}", run.describe()));
    assert_eq!(v["craft"], "dead");
    assert!(v["pairs"].as_array().is_some_and(|p| !p.is_empty()));
    assert!(run.stderr_str().contains(native.stdout_str().trim()), "the program's stdout goes to stderr\n{}", run.describe());

    let json = dir.join("report.json");
    let run = WitchCmd::new("dead").args(&["-p", "100000", "-q", "--json-out", json.to_str().unwrap()]).out(&out).run(&prog.exe, &["20"]);
    assert_same_behaviour(&native, &run);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["craft"], "dead");
}

/// `--duration` bounds an attach; a program run lasts until it ends, so
/// `--duration` without `--pid` is refused rather than ignored.
#[test]
fn duration_without_pid_is_refused() {
    let dir = Scratch::new("duration");
    let prog = Program::build("dead_loop", dir.path());
    let run = WitchCmd::new("dead").args(&["--duration", "1s", "-q"]).out(&dir.join("p.json")).run(&prog.exe, &["20"]);
    assert_eq!(run.code(), Some(125), "{}", run.describe());
    assert!(run.stdout.is_empty() && run.stderr_str().contains("--duration"), "{}", run.describe());
}

/// A reader of witch's stderr that went away (`witch ... 2>&1 | head -3`)
/// costs the report, not the program's exit status: witch must not die of
/// its failed write (it used to abort, exit 134).
#[test]
fn a_closed_stderr_does_not_change_the_exit_status() {
    use std::os::fd::{FromRawFd, OwnedFd};
    let dir = Scratch::new("closed-stderr");
    let prog = Program::build("dead_loop", dir.path());
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills fds with two new descriptors, owned below.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors are new and owned by nothing else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    let out = dir.join("p.json");
    let status = Command::new(witch_bin())
        .arg("dead")
        .arg("-o")
        .arg(&out)
        .arg(&prog.exe)
        .arg("20")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(write))
        .status()
        .expect("start witch");
    assert_eq!((status.code(), status.signal()), (Some(3), None), "witch must exit with the program's status 3");
    assert!(out.is_file(), "the profile is still written");
}
