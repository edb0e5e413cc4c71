//! How a run or a session ends, and what witch says about it: every thread
//! counted, the real reason a run left no profile, a stopped target's
//! profile kept, and an output path that cannot work refused before the
//! program runs.

use std::process::Command;
use std::time::Duration;
use witch_tests::*;

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
