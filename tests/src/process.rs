//! Running a process with piped stdio and a timeout.

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The outcome of one process run.
pub struct Run {
    pub cmdline: String,
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub elapsed: Duration,
}

impl Run {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
    pub fn signal(&self) -> Option<i32> {
        self.status.signal()
    }
    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    pub fn stderr_str(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
    /// For failure messages: the command, its status, and its output.
    pub fn describe(&self) -> String {
        let mut err = self.stderr_str();
        if err.len() > 8000 {
            let cut = err.len() - 8000;
            let cut = (cut..err.len()).find(|&i| err.is_char_boundary(i)).unwrap_or(cut);
            err = format!("[... {cut} bytes cut ...]{}", &err[cut..]);
        }
        let mut out = self.stdout_str();
        if out.len() > 4000 {
            let cut = (4000..out.len()).find(|&i| out.is_char_boundary(i)).unwrap_or(out.len());
            out.truncate(cut);
            out.push_str("[...]");
        }
        format!(
            "command: {}\nstatus: {} ({:.2}s)\n--- stdout ---\n{}\n--- stderr ---\n{}\n--------------",
            self.cmdline,
            self.status,
            self.elapsed.as_secs_f64(),
            out,
            err
        )
    }
}

fn timeout() -> Duration {
    let secs = std::env::var("WITCH_TESTS_TIMEOUT").ok().and_then(|s| s.parse().ok()).unwrap_or(300u64);
    Duration::from_secs(secs)
}

fn render(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Run a command with piped stdio, feeding `stdin` (or an empty stdin),
/// capturing stdout and stderr. The child gets its own process group, which
/// is killed if the run exceeds the timeout.
pub fn run_cmd(mut cmd: Command, stdin: Option<&[u8]>) -> Run {
    let cmdline = render(&cmd);
    // Hermetic: a developer's login shell may set DEBUGINFOD_URLS (Debian's
    // libdebuginfod-common does), and reports would then ask the network.
    if !cmd.get_envs().any(|(k, _)| k == "DEBUGINFOD_URLS") {
        cmd.env_remove("DEBUGINFOD_URLS");
    }
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.process_group(0);
    let start = Instant::now();
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {cmdline}: {e}"));
    let pgid = child.id() as i32;

    let mut child_in = child.stdin.take().unwrap();
    let input = stdin.map(|b| b.to_vec()).unwrap_or_default();
    let writer = std::thread::spawn(move || {
        // The program may not read all of it; a broken pipe is not our failure.
        let _ = child_in.write_all(&input);
        drop(child_in);
    });
    let (tx, rx) = mpsc::channel::<(u8, Vec<u8>)>();
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = out.read_to_end(&mut b);
        let _ = tx.send((1, b));
    });
    std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = err.read_to_end(&mut b);
        let _ = tx2.send((2, b));
    });

    let deadline = start + timeout();
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) => {}
            Err(e) => panic!("waiting for {cmdline}: {e}"),
        }
        if Instant::now() > deadline {
            // Kill the whole process group we created (witch and the program).
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
            let _ = child.wait();
            panic!("timed out after {:?}: {cmdline} (set WITCH_TESTS_TIMEOUT to change)", timeout());
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let elapsed = start.elapsed();
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    // A process left behind holding the pipes open would block the readers.
    let pipes_deadline = Instant::now() + Duration::from_secs(30);
    for _ in 0..2 {
        let left = pipes_deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((1, b)) => stdout = b,
            Ok((_, b)) => stderr = b,
            Err(_) => {
                unsafe {
                    libc::kill(-pgid, libc::SIGKILL);
                }
                panic!("{cmdline} exited ({status}) but left a process holding its stdout/stderr open for 30s");
            }
        }
    }
    let _ = writer.join();
    Run { cmdline, status, stdout, stderr, elapsed }
}
