//! Go programs (tests/programs/go_target.go), attached to and run under
//! witch: Go runs goroutines on small stacks it allocates and moves
//! itself, side by side in its heap, so nothing may be written below a
//! goroutine's stack pointer. Skipped, with a message, without a Go
//! toolchain (CI has one).

use std::path::Path;
use std::process::{Command, Stdio};
use witch_tests::attach::*;
use witch_tests::*;

const CRAFTS: [&str; 3] = ["dead", "silent-store", "silent-load"];

/// The program run natively with stdin closed: its stdout and exit code.
fn native(exe: &Path) -> (String, Option<i32>) {
    let out = Command::new(exe).stdin(Stdio::null()).output().expect("the Go program runs");
    (String::from_utf8_lossy(&out.stdout).into_owned(), out.status.code())
}

/// Ten attaches, through every craft, to one Go program: each gives a
/// profile or is refused in one line, and the program ends as an
/// unprofiled run does. (Before, the agent's load ran on whichever thread
/// was stopped first, here the main thread blocked in `read` on its
/// goroutine's stack: what it wrote below the stack pointer landed on the
/// stacks of other goroutines, which then crashed, "unexpected fault
/// address", SIGSEGV, or found their locals changed.)
fn attach_ten_times(cgo: bool) {
    let dir = Scratch::new(if cgo { "attach-go-cgo" } else { "attach-go" });
    let Some(exe) = go_target(dir.path(), cgo) else { return };
    let target = Target::start(&exe, &[] as &[&str], &[]);
    target.wait_ready(16, None);
    let pid = target.pid();
    let mut profiled = 0;
    for i in 0..10 {
        let craft = CRAFTS[i % CRAFTS.len()];
        let out = dir.join(&format!("attach{i}.json"));
        let run = attach_cmd(&witch_bin(), &[], craft, pid, &["--duration", "300ms", "-q", "-o", out.to_str().unwrap()]);
        if run.code() == Some(0) {
            assert_eq!(raw_profile(&out)["ended_by"], "detach", "attach #{i} ({craft})");
            profiled += 1;
        } else {
            let line = error_line(&run);
            eprintln!("[witch-tests] attach #{i} ({craft}) refused: {line}");
        }
        assert!(!is_zombie(pid) && std::path::Path::new(&format!("/proc/{pid}")).exists(), "attach #{i} ({craft}) killed the program");
    }
    let end = target.finish();
    let (stdout, code) = native(&exe);
    assert_eq!(
        (end.code(), end.signal(), end.stdout.as_str()),
        (code, None, stdout.as_str()),
        "the Go program did not end as it does unprofiled; its stderr:\n{}",
        end.stderr
    );
    assert!(profiled > 0, "no attach gave a profile");
}

#[test]
fn go_program_without_cgo_survives_ten_attaches_under_every_craft() {
    attach_ten_times(false);
}

#[test]
fn go_program_with_cgo_survives_ten_attaches_under_every_craft() {
    attach_ten_times(true);
}

/// A Go program run under every craft runs as it does unprofiled, and
/// witch says in one line why there is no profile: Go ends the process
/// with its own exit system call, never through the C library's exit,
/// where the agent writes it. (Before, the line asked whether the program
/// cleared LD_PRELOAD.)
#[test]
fn go_program_run_under_every_craft_is_unharmed_and_witch_says_why_there_is_no_profile() {
    let dir = Scratch::new("run-go");
    let Some(exe) = go_target(dir.path(), true) else { return };
    let (stdout, code) = native(&exe);
    for craft in CRAFTS {
        let out = dir.join(&format!("{craft}.json"));
        let run = WitchCmd::new(craft).out(&out).stdin(b"").run(&exe, &[]);
        assert_eq!((run.code(), run.signal(), run.stdout_str()), (code, None, stdout.clone()), "{craft}:\n{}", run.describe());
        let said: Vec<String> = run.stderr_str().lines().filter(|l| l.starts_with("witch:")).map(String::from).collect();
        assert_eq!(said.len(), 1, "{craft}: one line from witch:\n{}", run.describe());
        assert!(said[0].contains("is a Go program") && said[0].contains("--pid"), "{craft}: {}", said[0]);
    }
}
