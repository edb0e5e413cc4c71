//! Helpers for the tests that attach to running processes
//! (`witch CRAFT --pid`, witchd): a long-running target, the attach
//! command, running as `nobody`, and what a process looks like from /proc.

use crate::{chmod, run_cmd, which, Run, Scratch};
use std::ffi::OsStr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub use crate::{nobody_wrapper, NOBODY};

/// A test program that runs until its stdin closes (the programs' `0`
/// argument), then prints its rounds and checksum; killed if dropped.
pub struct Target {
    child: Option<Child>,
    pub cmdline: String,
}

/// What a target printed and how it ended.
pub struct Finished {
    pub rounds: u64,
    pub stdout: String,
    pub stderr: String,
    pub status: ExitStatus,
}

impl Finished {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
    pub fn signal(&self) -> Option<i32> {
        self.status.signal()
    }
}

impl Target {
    /// Start `exe ARGS` (under `wrapper`, e.g. setpriv, which execs it so
    /// the pid is the program's) with its stdin on a pipe.
    pub fn start<S: AsRef<OsStr>>(exe: &Path, args: &[S], wrapper: &[String]) -> Target {
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        cmd.args(args);
        let cmdline = format!("{cmd:?}");
        let child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {cmdline}: {e}"));
        Target { child: Some(child), cmdline }
    }

    /// The program's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("target running").id()
    }

    /// Wait (at most 10 s) until the program has `n` threads and, if
    /// `exe_name` is given, has exec'd it (a wrapper runs first); then a
    /// little longer, so it is in its steady state.
    pub fn wait_ready(&self, n: usize, exe_name: Option<&str>) {
        let pid = self.pid();
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.count()).unwrap_or(0);
            let exec_done = exe_name
                .is_none_or(|name| std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|p| p.file_name().is_some_and(|f| f == name)));
            if threads >= n && exec_done {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    /// Write `bytes` to the program's stdin.
    pub fn send(&mut self, bytes: &[u8]) {
        use std::io::Write;
        let stdin = self.child.as_mut().expect("target running").stdin.as_mut().expect("stdin piped");
        stdin.write_all(bytes).and_then(|_| stdin.flush()).expect("write to the target's stdin");
    }

    /// Bytes written to the program's stdin that it has not read yet.
    pub fn unread_input(&self) -> usize {
        use std::os::fd::AsRawFd;
        let Some(stdin) = self.child.as_ref().and_then(|c| c.stdin.as_ref()) else { return 0 };
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int, the bytes in the pipe.
        if unsafe { libc::ioctl(stdin.as_raw_fd(), libc::FIONREAD, &mut n) } == 0 {
            n as usize
        } else {
            0
        }
    }

    /// Is the program still running (not exited, not a zombie)?
    pub fn alive(&mut self) -> bool {
        matches!(self.child.as_mut().expect("target running").try_wait(), Ok(None)) && !is_zombie(self.pid())
    }

    /// How the program ended, once it has (for a failure's message): its
    /// wait status and what it wrote to stderr.
    pub fn how_it_ended(&mut self) -> String {
        use std::io::Read;
        let Some(child) = self.child.as_mut() else { return "not started".into() };
        match child.try_wait() {
            Ok(Some(status)) => {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                format!("{status}; its stderr: {err:?}")
            }
            Ok(None) => "still running (a zombie?)".into(),
            Err(e) => format!("cannot wait for it: {e}"),
        }
    }

    /// Close stdin and wait (at most 60 s) for the program to end.
    pub fn finish(mut self) -> Finished {
        let mut child = self.child.take().expect("target running");
        drop(child.stdin.take());
        let pid = child.id() as i32;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        let out = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(r) => r.expect("wait for target"),
            Err(_) => {
                unsafe { libc::kill(pid, libc::SIGKILL) };
                panic!("target {pid} did not end within 60 s of its stdin closing");
            }
        };
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let rounds = stdout.split_whitespace().nth(1).and_then(|r| r.parse().ok()).unwrap_or(0);
        Finished { rounds, stdout, stderr: String::from_utf8_lossy(&out.stderr).into_owned(), status: out.status }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `witch CRAFT --pid PID EXTRA...` (under `wrapper`), logged.
pub fn attach_cmd(witch: &Path, wrapper: &[String], craft: &str, pid: u32, extra: &[&str]) -> Run {
    let mut cmd = match wrapper.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(witch);
            c
        }
        None => Command::new(witch),
    };
    cmd.arg(craft).arg("--pid").arg(pid.to_string()).args(extra);
    let r = run_cmd(cmd, None);
    eprintln!("[witch-tests] {:.2}s: {}", r.elapsed.as_secs_f64(), r.cmdline);
    r
}

/// As root with setpriv: witch and its agent where nobody can run them, in
/// a `dir` nobody may write to, and the wrapper that runs a command as
/// nobody. None otherwise.
pub fn as_nobody(dir: &Scratch) -> Option<(PathBuf, Vec<String>)> {
    let n = crate::Nobody::setup(dir)?;
    chmod(dir.path(), 0o777);
    Some((n.witch, n.wrapper))
}

/// The one line of a refusal (exit 2, one non-empty line on stderr).
pub fn error_line(run: &Run) -> String {
    let err = run.stderr_str();
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(run.code(), Some(2), "expected exit 2 with one error line:\n{}", run.describe());
    assert_eq!(lines.len(), 1, "expected exactly one error line:\n{}", run.describe());
    lines[0].to_string()
}

/// A field of /proc/PID/status (e.g. `"SigCgt:"`), trimmed.
pub fn status_field(pid: u32, key: &str) -> String {
    crate::proc_status(pid, key)
}

pub fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with(['Z', 'X'])))
        .unwrap_or(true)
}

/// The names (comm) of the process's threads.
pub fn thread_names(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|s| s.trim().to_string())
        .collect()
}

/// How many perf events the process holds open.
pub fn perf_fds(pid: u32) -> usize {
    fds_to(pid, |link| link.contains("perf_event"))
}

/// How many sockets the process holds open.
pub fn socket_fds(pid: u32) -> usize {
    fds_to(pid, |link| link.starts_with("socket:"))
}

/// How many of the process's descriptors link to what `is` accepts.
fn fds_to(pid: u32, is: impl Fn(&str) -> bool) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| is(&l.to_string_lossy())))
        .count()
}

/// Whether an agent session is still set up in the process: its control
/// thread or any perf event.
pub fn agent_armed(pid: u32) -> bool {
    thread_names(pid).iter().any(|n| n == "witch-agent") || perf_fds(pid) > 0
}

/// Wait (at most `limit`) for `what`; false if it never held.
pub fn eventually(limit: Duration, mut what: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + limit;
    loop {
        if what() {
            return true;
        }
        if Instant::now() > until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A python3 interpreter from the system (dynamically linked), if any.
pub fn python3() -> Option<PathBuf> {
    ["/usr/bin/python3", "/usr/local/bin/python3"].iter().map(PathBuf::from).find(|p| p.is_file()).or_else(|| which("python3"))
}

/// `tests/programs/go_target.go` built into `dir`: linked externally with
/// the C library but without cgo of its own (`-linkmode=external`), or
/// with cgo (`go_cgo.go` beside it). None, said on stderr, when there is
/// no Go toolchain (CI installs one: `.ci/run`).
pub fn go_target(dir: &Path, cgo: bool) -> Option<PathBuf> {
    let Some(go) = which("go").or_else(|| Some(PathBuf::from("/usr/lib/go/bin/go")).filter(|p| p.is_file())) else {
        eprintln!("[witch-tests] no Go toolchain (`go`): the Go program's test is skipped (Debian: apt-get install golang-go)");
        return None;
    };
    let src = crate::programs_dir();
    let exe = dir.join(if cgo { "go_cgo" } else { "go_external" });
    let mut cmd = Command::new(go);
    cmd.arg("build").arg("-o").arg(&exe);
    if cgo {
        cmd.arg(src.join("go_target.go")).arg(src.join("go_cgo.go"));
    } else {
        cmd.arg("-ldflags=-linkmode=external").arg(src.join("go_target.go"));
    }
    // A cache and module path of the test's own; no settings of the user's.
    cmd.env("GOCACHE", dir.join("gocache")).env("GOPATH", dir.join("gopath")).env("CGO_ENABLED", "1").env_remove("GOFLAGS");
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run go: {e}"));
    assert!(out.status.success(), "go build failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    Some(exe)
}
