//! `witch CRAFT --pid PID`: attach to a running process, detach, and leave
//! it as it was (tests/programs/attach_target.c), and the clear refusals.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use witch_tests::attach::*;
use witch_tests::*;

/// attach_target.c running until its stdin closes (under `wrapper`), with
/// its four workers started.
fn start_target(exe: &Path, wrapper: &[String]) -> Target {
    let t = Target::start(exe, &["0"], wrapper);
    let name = exe.file_name().map(|n| n.to_string_lossy().into_owned());
    t.wait_ready(5, if wrapper.is_empty() { None } else { name.as_deref() });
    t
}

/// Close its stdin; returns (rounds, stdout, exit code).
fn done(t: Target) -> (u64, String, Option<i32>) {
    let end = t.finish();
    let code = end.code();
    (end.rounds, end.stdout, code)
}

#[test]
fn attach_and_detach_ten_times_leaves_the_program_as_it_was() {
    let dir = Scratch::new("attach");
    let prog = Program::build("attach_target", dir.path());
    let f = &prog.file;
    let (w, k) = (prog.line("@aw"), prog.line("@ak"));
    let target = start_target(&prog.exe, &[]);
    let pid = target.pid();
    let handlers_before = status_field(pid, "SigCgt:");
    let threads_before = status_field(pid, "Threads:");

    for i in 0..10 {
        let out = dir.join(&format!("attach{i}.json"));
        let craft = ["dead", "silent-store", "dead", "silent-load"][i % 4];
        let run = attach_cmd(&witch_bin(), &[], craft, pid, &["--duration", "400ms", "-q", "-o", out.to_str().unwrap()]);
        assert_eq!(run.code(), Some(0), "attach #{i} failed:\n{}", run.describe());
        let rep = report(&out);
        assert_eq!(rep.craft(), craft);
        rep.assert_samples(5.0);
        if craft == "dead" {
            let top = rep.pairs().first().unwrap_or_else(|| panic!("attach #{i}: no pairs\n{}", rep.dump()));
            assert!(
                side_at(top, "watch", f, w) && side_at(top, "trap", f, k),
                "attach #{i}: the top pair should be the dead store at {f}:{w} killed by {f}:{k}\n{}",
                rep.dump()
            );
        }
        // Between sessions: our control thread is gone, the handlers are the program's.
        assert_eq!(status_field(pid, "Threads:"), threads_before, "attach #{i} left a thread behind");
        assert_eq!(status_field(pid, "SigCgt:"), handlers_before, "attach #{i} left signal handlers behind");
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let loads = maps.lines().filter(|l| l.ends_with("libwitch_agent.so") && l.contains(" 00000000 ")).count();
    assert_eq!(loads, 1, "attaching again should reuse the agent already loaded:\n{maps}");

    let (rounds, text, code) = done(target);
    assert!(rounds > 0, "the target did no work: {text:?}");
    let native = prog.run_native(&[&rounds.to_string()]);
    assert_eq!(native.code(), code, "exit status differs from an unprofiled run");
    assert_eq!(native.stdout_str(), text, "the checksum differs from an unprofiled run of {rounds} rounds");
}

#[test]
fn attach_as_an_unprivileged_user() {
    let dir = Scratch::new("attach-nobody");
    let prog = Program::build("attach_target", dir.path());
    let (witch, wrapper) = match as_nobody(&dir) {
        Some(x) => x,
        None => {
            eprintln!("[witch-tests] not root or no setpriv: attaching as the current user");
            (witch_bin(), vec![])
        }
    };
    chmod(&prog.exe, 0o755);
    let target = start_target(&prog.exe, &wrapper);
    let out = dir.join("nobody.json");
    let run = attach_cmd(&witch, &wrapper, "dead", target.pid(), &["--duration", "400ms", "-q", "-o", out.to_str().unwrap()]);
    assert_eq!(run.code(), Some(0), "attach failed:\n{}", run.describe());
    report(&out).assert_samples(5.0);

    // Another user's process: nobody may not attach to one of root's.
    if !wrapper.is_empty() {
        let root_target = start_target(&prog.exe, &[]);
        // -o where nobody may write: witch checks the output before it attaches.
        let out = dir.join("refused.json");
        let run = attach_cmd(&witch, &wrapper, "dead", root_target.pid(), &["--duration", "200ms", "-o", out.to_str().unwrap()]);
        let line = error_line(&run);
        assert!(line.contains("not permitted") && line.contains(&root_target.pid().to_string()), "{line:?}");
        let (_, _, code) = done(root_target);
        assert_eq!(code, Some(7));
    } else if !is_root() {
        let run = attach_cmd(&witch, &[], "dead", 1, &["--duration", "200ms"]);
        let line = error_line(&run);
        assert!(line.contains("not permitted"), "{line:?}");
    }
    let (rounds, text, code) = done(target);
    let native = prog.run_native(&[&rounds.to_string()]);
    assert_eq!((native.code(), native.stdout_str()), (code, text));
}

#[test]
fn attach_refusals_are_clear() {
    let dir = Scratch::new("attach-refuse");
    // A pid that no longer exists.
    let gone = Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    let _ = { gone }.wait();
    let run = attach_cmd(&witch_bin(), &[], "dead", gone_pid, &["--duration", "1s"]);
    let line = error_line(&run);
    assert!(line.contains("no process") && line.contains(&gone_pid.to_string()), "{line:?}");

    // A statically linked program has no dlopen to load the agent with.
    match Program::build_with("attach_target", dir.path(), "attach_static", &["-static"]) {
        Ok(stat) => {
            let t = start_target(&stat.exe, &[]);
            let run = attach_cmd(&witch_bin(), &[], "dead", t.pid(), &["--duration", "1s"]);
            let line = error_line(&run);
            assert!(line.contains("statically linked") && line.contains("witch dead"), "{line:?}");
            let (rounds, text, code) = done(t);
            let native = stat.run_native(&[&rounds.to_string()]);
            assert_eq!((native.code(), native.stdout_str()), (code, text), "a refused attach must not disturb the program");
        }
        Err(e) => eprintln!("[witch-tests] skipping the static case: {e}"),
    }

    // Every debug register of every thread taken (as by a debugger).
    let prog = Program::build("attach_target", dir.path());
    let t = start_target(&prog.exe, &[]);
    let mut fds = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{}/task", t.pid())).unwrap().flatten() {
        let tid: i32 = task.file_name().to_str().unwrap().parse().unwrap();
        for _ in 0..4 {
            if let Some(fd) = occupy_debug_register(tid) {
                fds.push(fd);
            }
        }
    }
    let run = attach_cmd(&witch_bin(), &[], "dead", t.pid(), &["--duration", "1s"]);
    let line = error_line(&run);
    assert!(line.contains("debug registers"), "{line:?}");
    for fd in fds {
        unsafe { libc::close(fd) };
    }
    // Once they are free again, attaching works.
    let out = dir.join("after.json");
    let run = attach_cmd(&witch_bin(), &[], "dead", t.pid(), &["--duration", "300ms", "-q", "-o", out.to_str().unwrap()]);
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    let (rounds, text, code) = done(t);
    let native = prog.run_native(&[&rounds.to_string()]);
    assert_eq!((native.code(), native.stdout_str()), (code, text));
    let _ = std::io::stderr().flush();
}

/// A second attach while a session runs is refused, and leaves the running
/// session alone: its brief ptrace stop is no debugger. (The first session
/// used to take it for one and end there, 2 of 3 times, leaving its witch
/// to wait out --duration for a profile of the first seconds.)
#[test]
fn a_refused_second_attach_leaves_the_running_session_alone() {
    let dir = Scratch::new("attach-second");
    let prog = Program::build("attach_target", dir.path());
    let t = start_target(&prog.exe, &[]);
    let pid = t.pid();
    for round in 0..3 {
        let err = dir.join(&format!("first{round}.err"));
        let out = dir.join(&format!("first{round}.json"));
        let mut first = Command::new(witch_bin())
            .args(["dead", "--pid", &pid.to_string(), "--duration", "3s", "-o", out.to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        assert!(eventually(std::time::Duration::from_secs(20), || read(&err).contains("attached to pid")), "{}", read(&err));
        let run = attach_cmd(&witch_bin(), &[], "silent-store", pid, &["--duration", "500ms"]);
        let line = error_line(&run);
        assert!(line.contains("already running"), "{line:?}");
        assert!(first.wait().unwrap().success(), "{}", read(&err));
        let secs = raw_profile(&out)["duration_ns"].as_u64().unwrap_or(0) as f64 / 1e9;
        assert!(secs > 2.5, "round {round}: the first session ended after {secs:.2} s of its 3 s");
    }
    let (rounds, text, code) = done(t);
    let native = prog.run_native(&[&rounds.to_string()]);
    assert_eq!((native.code(), native.stdout_str()), (code, text));
}

/// A program that forks all the time (tests/programs/fork_loop.c), its
/// children each raising the sampler's signal (SIGRTMIN+7, which a program
/// may use for itself) at its own handler, attached to ten times: a child
/// forked while the session's control thread calibrates (the session's
/// first milliseconds) is no part of that calibration, and its signal
/// reaches its handler as in every other child. (Before, the attached agent
/// registered no fork handler: such a child inherited the calibration as
/// running, and witch's handler took the child's signal for the
/// calibration's, for good.)
#[test]
fn children_forked_while_a_session_starts_keep_their_own_signals() {
    let dir = Scratch::new("attach-fork-loop");
    let prog = Program::build("fork_loop", dir.path());
    let t = Target::start(&prog.exe, &["0"], &[]);
    let pid = t.pid();
    std::thread::sleep(std::time::Duration::from_millis(200));
    for i in 0..10 {
        let out = dir.join(&format!("fork{i}.json"));
        let run = attach_cmd(&witch_bin(), &[], "dead", pid, &["--duration", "200ms", "-q", "-o", out.to_str().unwrap()]);
        assert_eq!(run.code(), Some(0), "attach #{i} failed:\n{}", run.describe());
    }
    let end = t.finish();
    assert_eq!(end.code(), Some(0), "{}{}", end.stdout, end.stderr);
    assert!(end.rounds > 0, "{:?}", end.stdout);
    assert!(end.stdout.ends_with(" missed 0\n"), "children whose own signal never reached their handler: {:?}", end.stdout);
}

/// A program that forks a long-lived child (as a server forks a worker)
/// during an attached session (tests/programs/fork_on_input.c): the child
/// keeps no copy of the session's perf events, so the session's end gives
/// the parent's debug registers back, and the parent can be attached again
/// while the child lives; and the child, which runs no session, can be
/// attached to as well. (Before, the child held the events open, and
/// with them the parent's debug registers, for its whole life: the next
/// attach to the parent was refused, "all of its debug registers are in
/// use". And the child inherited the parent's mark of a running session,
/// so an attach to it was refused as if one ran there.)
#[test]
fn a_child_forked_during_a_session_keeps_none_of_its_events() {
    use std::time::Duration;
    let dir = Scratch::new("attach-fork-child");
    let prog = Program::build("fork_on_input", dir.path());
    let mut t = Target::start(&prog.exe, &["0"], &[]);
    let pid = t.pid();
    std::thread::sleep(Duration::from_millis(200));
    let witch = AttachedWitch::start(pid, "2s", &dir.join("first.json"), &dir.join("first.err"));
    assert!(eventually(Duration::from_secs(5), || perf_fds(pid) > 0), "no perf event in the target during the session: {}", witch.said());
    t.send(b"f");
    let children = || std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    assert!(eventually(Duration::from_secs(5), || !children().trim().is_empty()), "no child forked");
    let child: u32 = children().split_whitespace().next().and_then(|c| c.parse().ok()).unwrap();
    let said = witch.said();
    assert_eq!(witch.end_within(Duration::from_secs(30)).and_then(|s| s.code()), Some(0), "{said}");
    assert_eq!(perf_fds(child), 0, "the child {child} holds perf events of its parent's session");
    assert_eq!(socket_fds(child), 0, "the child {child} holds a socket of its parent's session (the program opens none)");
    let again = dir.join("again.json");
    let run = attach_cmd(&witch_bin(), &[], "dead", pid, &["--duration", "300ms", "-q", "-o", again.to_str().unwrap()]);
    assert_eq!(run.code(), Some(0), "attaching again while the child lives:\n{}", run.describe());
    // The child runs no session: it can be attached to itself.
    let theirs = dir.join("child.json");
    let run = attach_cmd(&witch_bin(), &[], "dead", child, &["--duration", "300ms", "-q", "-o", theirs.to_str().unwrap()]);
    assert_eq!(run.code(), Some(0), "attaching to the child forked during the first session:\n{}", run.describe());
    assert!(theirs.exists(), "no profile of the child");
    let end = t.finish();
    assert_eq!((end.code(), end.stdout.ends_with(" children 1\n")), (Some(0), true), "{}{}", end.stdout, end.stderr);
}

/// A process that is stopped (SIGSTOP), or that another tracer holds, is
/// refused at once in one line that says so, and left as it was. (Before:
/// 20 s to "did not report ready", with the agent's thread left in the
/// stopped process; and "not permitted" for a traced one, even as root.)
#[test]
fn a_stopped_or_traced_process_is_refused_at_once_and_left_alone() {
    let dir = Scratch::new("attach-stopped");
    let prog = Program::build("attach_target", dir.path());
    let tracer = Program::build("tracer", dir.path());
    let t = start_target(&prog.exe, &[]);
    let pid = t.pid();
    let threads = thread_names(pid).len();
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    assert!(eventually(std::time::Duration::from_secs(5), || status_field(pid, "State:").starts_with('T')), "not stopped");
    let run = attach_cmd(&witch_bin(), &[], "dead", pid, &["--duration", "1s"]);
    let line = error_line(&run);
    assert!(line.contains("stopped") && line.contains("kill -CONT"), "{line:?}");
    assert!(run.elapsed < std::time::Duration::from_secs(5), "refused only after {:?}", run.elapsed);
    assert!(status_field(pid, "State:").starts_with('T'), "the refused attach let the process run");
    assert_eq!(thread_names(pid).len(), threads, "the refused attach left a thread: {:?}", thread_names(pid));
    unsafe { libc::kill(pid as i32, libc::SIGCONT) };

    let mut holder =
        std::process::Command::new(&tracer.exe).args([&pid.to_string(), "30"]).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut said = [0u8; 8];
    std::io::Read::read_exact(holder.stdout.as_mut().unwrap(), &mut said).unwrap();
    let run = attach_cmd(&witch_bin(), &[], "dead", pid, &["--duration", "1s"]);
    let line = error_line(&run);
    assert!(line.contains(&format!("traced by pid {}", holder.id())), "{line:?}");
    let _ = holder.kill();
    let _ = holder.wait();

    let (rounds, text, code) = done(t);
    let native = prog.run_native(&[&rounds.to_string()]);
    assert_eq!((native.code(), native.stdout_str()), (code, text), "a refused attach must not disturb the program");
}

/// A debugger that attaches during a session, and holds the process longer
/// than a second witch's brief stop, makes the agent end the session by
/// itself: it leaves the debug registers and signals to the debugger and
/// sends its profile. witch then writes that profile at once, says why in
/// one line and exits 0; the process runs on unchanged, ready for the next
/// attach. (Before: witch waited out the rest of --duration, 20 s here,
/// and said nothing of why the profile was short.)
#[test]
fn a_debugger_that_attaches_during_the_session_ends_it_at_once() {
    use std::time::{Duration, Instant};
    let dir = Scratch::new("attach-debugger");
    let prog = Program::build("attach_target", dir.path());
    let tracer = Program::build("tracer", dir.path());
    let t = start_target(&prog.exe, &[]);
    let pid = t.pid();
    let threads = thread_names(pid).len();
    let (err, out) = (dir.join("witch.err"), dir.join("profile.json"));
    let witch = AttachedWitch::start(pid, "20s", &out, &err);
    std::thread::sleep(Duration::from_millis(500));
    let mut holder = Command::new(&tracer.exe).args([&pid.to_string(), "10"]).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut said = [0u8; 8];
    std::io::Read::read_exact(holder.stdout.as_mut().unwrap(), &mut said).unwrap();
    let traced_at = Instant::now();
    let text = || std::fs::read_to_string(&err).unwrap_or_default();
    let status = witch.end_within(Duration::from_secs(30));
    let took = traced_at.elapsed();
    let still_traced = status_field(pid, "TracerPid:") == holder.id().to_string();
    let _ = holder.kill();
    let _ = holder.wait();
    let text = text();
    assert!(took < Duration::from_secs(5), "witch returned {took:?} after the debugger attached (status {status:?}): {text}");
    assert!(still_traced, "the debugger let go before witch returned");
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{text}");
    let line = text.lines().find(|l| l.contains("ended the session by itself")).unwrap_or_else(|| panic!("no reason given: {text}"));
    assert!(line.contains(&format!("a debugger (pid {})", holder.id())) && line.contains("runs on"), "{line:?}");
    let p = raw_profile(&out);
    assert_eq!(p["ended_by"], "traced", "{p}");
    let secs = p["duration_ns"].as_u64().unwrap_or(0) as f64 / 1e9;
    assert!(secs > 0.3 && secs < 5.0, "the profile covers {secs:.2} s");

    // The process runs on, with no thread of witch's left, and takes the next attach.
    assert!(eventually(Duration::from_secs(5), || thread_names(pid).len() == threads), "{:?}", thread_names(pid));
    assert!(eventually(Duration::from_secs(5), || status_field(pid, "TracerPid:") == "0"), "the debugger's hold outlived it");
    let again = dir.join("again.json");
    let run = attach_cmd(&witch_bin(), &[], "dead", pid, &["--duration", "1s", "-o", again.to_str().unwrap()]);
    assert_eq!(run.code(), Some(0), "the next attach: {}", run.stderr_str());
    assert_eq!(raw_profile(&again)["ended_by"], "detach");
    let (rounds, text, code) = done(t);
    let native = prog.run_native(&[&rounds.to_string()]);
    assert_eq!((native.code(), native.stdout_str()), (code, text), "the session ended by a debugger must not disturb the program");
}

/// A process in a seccomp sandbox is refused in one line (its filter may
/// kill it for a system call the agent makes), and left alone.
#[test]
fn a_sandboxed_process_is_refused_and_left_alone() {
    let dir = Scratch::new("attach-sandboxed");
    let prog = Program::build("sandboxed", dir.path());
    let mut t = Target::start(&prog.exe, &["prctl", "kill", "100000", "wait"], &[]);
    let pid = t.pid();
    assert!(eventually(std::time::Duration::from_secs(10), || status_field(pid, "Seccomp:") == "2"), "the target did not sandbox itself");
    let run = attach_cmd(&witch_bin(), &[], "dead", pid, &["--duration", "1s"]);
    let line = error_line(&run);
    assert!(line.contains("seccomp sandbox") && line.contains(&pid.to_string()), "{line:?}");
    assert!(t.alive(), "the refused attach harmed the target");
    let end = t.finish();
    assert_eq!(end.code(), Some(3), "{}\n{}", end.stdout, end.stderr);
    assert!(end.stdout.contains("fork child: signal 6") && end.stdout.contains("exec'd image: exit 5"), "{}", end.stdout);
}

/// An agent the target may not read (witch installed where only root can
/// read it, the target run by nobody): refused in one line with the
/// loader's own reason, and the program undisturbed. After a failed
/// `dlopen`, `dlerror` is the one injected call whose result (a pointer)
/// must come back in `rax`, through a store on its way to the signal
/// return, so this is that path's test.
#[test]
fn an_agent_the_target_cannot_read_is_refused_with_the_loaders_reason() {
    let Some(wrapper) = nobody_wrapper() else {
        eprintln!("[witch-tests] skipping: needs root and setpriv");
        return;
    };
    let dir = Scratch::new("attach-unreadable-agent");
    chmod(dir.path(), 0o755);
    let prog = Program::build("attach_target", dir.path());
    let private = dir.join("root-only");
    std::fs::create_dir(&private).unwrap();
    for f in ["witch", "libwitch_agent.so"] {
        std::fs::copy(witch_bin().with_file_name(f), private.join(f)).unwrap();
    }
    chmod(&private, 0o700);
    let t = start_target(&prog.exe, &wrapper);
    let run = attach_cmd(&private.join("witch"), &[], "dead", t.pid(), &["--duration", "1s"]);
    let line = error_line(&run);
    assert!(line.contains("could not load the agent") && line.contains("Permission denied"), "{line:?}");
    let (rounds, text, code) = done(t);
    let native = prog.run_native(&[&rounds.to_string()]);
    assert_eq!((native.code(), native.stdout_str()), (code, text), "a refused attach must not disturb the program");
}

/// A breakpoint event on thread `tid` holding one debug register.
fn occupy_debug_register(tid: i32) -> Option<i32> {
    // perf_event_attr, PERF_TYPE_BREAKPOINT (5), HW_BREAKPOINT_W (2), len 8,
    // on an address of our own that the target never touches.
    static SPOT: u64 = 0;
    let mut attr = [0u8; 128];
    let put = |a: &mut [u8], off: usize, v: &[u8]| a[off..off + v.len()].copy_from_slice(v);
    put(&mut attr, 0, &5u32.to_le_bytes()); // type
    put(&mut attr, 4, &128u32.to_le_bytes()); // size
    put(&mut attr, 8, &0u64.to_le_bytes()); // config
    put(&mut attr, 16, &1u64.to_le_bytes()); // sample_period
    put(&mut attr, 40, &(1u64 << 5 | 1u64 << 6).to_le_bytes()); // exclude_kernel | exclude_hv
    put(&mut attr, 52, &2u32.to_le_bytes()); // bp_type
    put(&mut attr, 56, &(&SPOT as *const u64 as u64).to_le_bytes()); // bp_addr
    put(&mut attr, 64, &8u64.to_le_bytes()); // bp_len
                                             // Close-on-exec: tests run in parallel and spawn processes, which must
                                             // not inherit (and so keep holding) the register after we close it.
    const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
    let fd = unsafe { libc::syscall(libc::SYS_perf_event_open, attr.as_ptr(), tid, -1, -1, PERF_FLAG_FD_CLOEXEC) };
    (fd >= 0).then_some(fd as i32)
}

/// A minor note of the reliability issue: threads that end while the agent
/// sets them up were reported as "no free debug registers (No such
/// process)", blaming a debugger. Attach to a program whose short threads
/// come and go: no note may blame the debug registers, and the program ends
/// as an unprofiled run of as many rounds does.
#[test]
fn threads_that_end_during_set_up_are_not_blamed_on_the_debug_registers() {
    let dir = Scratch::new("thread-churn");
    let prog = Program::build("thread_churn", dir.path());
    let mut target = Target::start(&prog.exe, &["0", "8"], &[]);
    target.wait_ready(1, None);
    for i in 0..3 {
        let out = dir.join(&format!("churn{i}.json"));
        let run = attach_cmd(&witch_bin(), &[], "dead", target.pid(), &["--duration", "700ms", "-q", "-o", out.to_str().unwrap()]);
        assert!(target.alive(), "attach #{i} killed the program:\n{}", run.describe());
        assert_eq!(run.code(), Some(0), "attach #{i} failed:\n{}", run.describe());
        let notes = raw_profile(&out)["notes"].to_string();
        assert!(
            !notes.contains("debug registers") && !notes.contains("No such process"),
            "attach #{i}: threads that ended were blamed on something else: {notes}"
        );
    }
    let end = target.finish();
    let native = prog.run_native(&[&end.rounds.to_string(), "8"]);
    assert_eq!((native.code(), native.stdout_str()), (end.code(), end.stdout), "differs from an unprofiled run");
}

/// A process that replaces its program (exec) during a session in a way the
/// agent cannot see coming (an `execve` system call by a `syscall`
/// instruction of the program's own, which no import table shows) takes
/// the agent, and the profile it was gathering, with its old image. witch
/// sees that within a poll, says so in one line and exits 3 (no profile
/// written); the process runs on as its new program, as it would have
/// without witch. (Before: witch waited out its --duration, then "left no
/// profile", exit 2; without --duration, until Ctrl-C.) Cases: an exec by
/// the main thread; by another thread (the kernel gives it the pid), as
/// nobody; and with address randomization off (`setarch -R`), where the new
/// image is laid out as the old one was (same file, arguments of the same
/// length) and only the agent's closed socket and absence tell.
#[test]
fn a_process_that_execs_during_the_session_ends_it_at_once_with_its_own_status() {
    let dir = Scratch::new("attach-exec");
    let prog = Program::build("daemon_exec", dir.path());
    chmod(&prog.exe, 0o755);
    let mut cases: Vec<(&str, PathBuf, Vec<String>, &[u8])> = vec![("main thread", witch_bin(), vec![], b"e\n")];
    match as_nobody(&dir) {
        Some((witch, wrapper)) => cases.push(("another thread, as nobody", witch, wrapper, b"w\n")),
        None => eprintln!("[witch-tests] not root or no setpriv: no unprivileged case"),
    }
    match which("setarch") {
        Some(setarch) => cases.push((
            "no address randomization",
            witch_bin(),
            vec![setarch.to_string_lossy().into_owned(), "x86_64".into(), "-R".into()],
            b"e\n",
        )),
        None => eprintln!("[witch-tests] no setarch: no case without address randomization"),
    }
    for (case, witch, wrapper, command) in cases {
        // Generation 5 execs generation 6: arguments of one length.
        let mut t = Target::start(&prog.exe, &["5"], &wrapper);
        t.wait_ready(2, if wrapper.is_empty() { None } else { Some("daemon_exec") });
        let pid = t.pid();
        let layout =
            || std::fs::read_to_string(format!("/proc/{pid}/stat")).map(|s| s.split(' ').skip(25).take(3).collect::<Vec<_>>().join(" "));
        let layout_before = layout();
        let out = dir.join("exec.json");
        let err = dir.join("exec.err");
        let mut cmd = match wrapper.iter().position(|w| w.ends_with("setarch")) {
            // setarch is for the target only; setpriv runs witch as nobody too.
            Some(_) => Command::new(&witch),
            None if !wrapper.is_empty() => {
                let mut c = Command::new(&wrapper[0]);
                c.args(&wrapper[1..]).arg(&witch);
                c
            }
            None => Command::new(&witch),
        };
        cmd.args(["dead", "--pid", &pid.to_string(), "--duration", "60s", "-o", out.to_str().unwrap()]);
        let mut w = KillOnDrop(cmd.stdout(std::process::Stdio::null()).stderr(std::fs::File::create(&err).unwrap()).spawn().unwrap());
        let read = || std::fs::read_to_string(&err).unwrap_or_default();
        assert!(eventually(std::time::Duration::from_secs(20), || read().contains("attached to pid")), "{case}: {}", read());
        std::thread::sleep(std::time::Duration::from_millis(300));
        let exec_at = std::time::Instant::now();
        t.send(command);
        let mut status = None;
        assert!(
            eventually(std::time::Duration::from_secs(20), || {
                status = w.0.try_wait().unwrap();
                status.is_some()
            }),
            "{case}: witch still waits 20 s after the exec:\n{}",
            read()
        );
        let took = exec_at.elapsed();
        let same = layout().ok() == layout_before.ok();
        eprintln!(
            "[witch-tests] {case}: witch ended {took:?} after the exec (code, stack laid out {})",
            if same { "as before" } else { "anew" }
        );
        let text = read();
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(status.unwrap().code(), Some(3), "{case}: {text}");
        assert!(took < std::time::Duration::from_secs(3), "{case}: witch ended only {took:?} after the exec\n{text}");
        let last = lines.last().copied().unwrap_or_default();
        assert!(
            last.starts_with(&format!("witch: pid {pid} (daemon_exec) replaced its program (exec)")) && last.contains("runs on"),
            "{case}: {text}"
        );
        assert_eq!(lines.len(), 2, "{case}: one line said it attached, one that it ended: {text}");
        assert!(!out.exists(), "{case}: a profile was written");
        // The process runs on, as its new program, with no agent in it.
        assert!(t.alive(), "{case}: the target died");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(cmdline.ends_with(b"\x006\x00"), "{case}: not its new image: {:?}", String::from_utf8_lossy(&cmdline));
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        assert!(!maps.contains("libwitch_agent.so") && !thread_names(pid).iter().any(|n| n == "witch-agent"), "{case}: {maps}");
        std::thread::sleep(std::time::Duration::from_millis(200));
        t.send(b"q\n");
        let end = t.finish();
        assert_eq!((end.code(), end.stdout.as_str()), (Some(5), "generation 6 ran rounds\n"), "{case}: {}", end.stderr);
    }
}

fn died(t: Target, attach: usize, witch_err: &Path) -> ! {
    let end = t.finish();
    let said = std::fs::read_to_string(witch_err).unwrap_or_default();
    panic!("attach #{attach}: the target died (exit {:?}, signal {:?}); witch said: {said}", end.code(), end.signal());
}

/// A child process killed if a test fails while it runs.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `witch dead --pid PID --duration DURATION -o OUT` in the background, its
/// stderr in `err`, once it said it attached (20 s at most).
struct AttachedWitch {
    witch: KillOnDrop,
    err: PathBuf,
}

impl AttachedWitch {
    fn start(pid: u32, duration: &str, out: &Path, err: &Path) -> AttachedWitch {
        AttachedWitch::start_with(pid, duration, out, err, &[])
    }

    /// [`AttachedWitch::start`] with `extra` arguments.
    fn start_with(pid: u32, duration: &str, out: &Path, err: &Path, extra: &[&str]) -> AttachedWitch {
        let child = Command::new(witch_bin())
            .args(["dead", "--pid", &pid.to_string(), "--duration", duration, "-o", out.to_str().unwrap()])
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(err).unwrap())
            .spawn()
            .unwrap();
        let a = AttachedWitch { witch: KillOnDrop(child), err: err.to_path_buf() };
        assert!(eventually(std::time::Duration::from_secs(20), || a.said().contains("attached to pid")), "{}", a.said());
        a
    }

    /// What witch wrote to its stderr so far.
    fn said(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// witch's status once it ends, if within `limit` (else it is killed).
    fn end_within(mut self, limit: std::time::Duration) -> Option<std::process::ExitStatus> {
        let began = std::time::Instant::now();
        while began.elapsed() < limit {
            if let Some(s) = self.witch.0.try_wait().unwrap() {
                return Some(s);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        None
    }
}

/// A process that execs again and again while witch attaches (by a
/// `syscall` instruction of its own, unseen by the agent), so that the
/// exec falls at every point of the attach: the process must survive every
/// one (the addresses witch read from its maps name nothing in a new image,
/// so none may be called there), and witch end each time within seconds,
/// mostly with exit 3. (Before: the process died of SIGSEGV within 30
/// attaches, 2 runs of 2 on this machine.)
#[test]
fn a_process_that_execs_while_witch_attaches_survives_every_attach() {
    let dir = Scratch::new("attach-exec-storm");
    let prog = Program::build("daemon_exec", dir.path());
    let mut t = Target::start(&prog.exe, &["0"], &[]);
    t.wait_ready(2, None);
    let pid = t.pid();
    let mut codes = std::collections::BTreeMap::new();
    let mut execs = 0;
    for i in 0..30 {
        let err = dir.join(&format!("storm{i}.err"));
        let mut w = KillOnDrop(
            Command::new(witch_bin())
                .args(["dead", "--pid", &pid.to_string(), "--duration", "300ms", "-q", "-o", dir.join("storm.json").to_str().unwrap()])
                .stdout(std::process::Stdio::null())
                .stderr(std::fs::File::create(&err).unwrap())
                .spawn()
                .unwrap(),
        );
        let began = std::time::Instant::now();
        let status = loop {
            if let Some(st) = w.0.try_wait().unwrap() {
                break st;
            }
            assert!(began.elapsed() < std::time::Duration::from_secs(20), "attach #{i}: witch still runs after 20 s");
            if !t.alive() {
                died(t, i, &err);
            }
            t.send(b"e\n");
            execs += 1;
            std::thread::sleep(std::time::Duration::from_millis(30));
        };
        if !t.alive() {
            died(t, i, &err);
        }
        let text = std::fs::read_to_string(&err).unwrap_or_default();
        assert!(matches!(status.code(), Some(0 | 2 | 3)) && text.lines().count() <= 1, "attach #{i}: {status:?} {text}");
        *codes.entry(status.code().unwrap()).or_insert(0) += 1;
    }
    eprintln!("[witch-tests] {execs} execs; witch's exit codes: {codes:?}");
    assert!(codes.get(&3).copied().unwrap_or(0) >= 15, "exit 3 (exec) should be most of them: {codes:?}");
    // The last generation is told to quit once it has read every command
    // and its worker has run, as without witch. (Told 30 ms after the last
    // exec, under load, its worker had not started: "ran no rounds".)
    assert!(
        eventually(std::time::Duration::from_secs(20), || waits_for_input_and_ran_rounds(&t)),
        "the program did not settle after the last exec; {} bytes unread",
        t.unread_input()
    );
    t.send(b"q\n");
    let end = t.finish();
    assert_eq!(end.code(), Some(5), "{} {}", end.stdout, end.stderr);
    assert!(end.stdout.starts_with("generation ") && end.stdout.ends_with(" ran rounds\n"), "{}", end.stdout);
}

/// Has daemon_exec read every command sent, its main thread waiting in
/// `read` on its stdin for the next (so no exec is coming), and has the
/// worker of its image run 20 ms on a CPU (rounds of 0.3 ms here)?
fn waits_for_input_and_ran_rounds(t: &Target) -> bool {
    let pid = t.pid();
    let task = |tid: &str, file: &str| std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/{file}")).unwrap_or_default();
    let on_cpu_ns = |tid: &str| task(tid, "schedstat").split_whitespace().next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
    let reading = t.unread_input() == 0 && task(&pid.to_string(), "syscall").starts_with("0 0x0 ");
    let tids: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect())
        .unwrap_or_default();
    reading && tids.iter().any(|tid| *tid != pid.to_string() && on_cpu_ns(tid) >= 20_000_000)
}

/// A process that puts itself in a seccomp sandbox during an attached
/// session (with `prctl`, directly or through `syscall`; with
/// `seccomp(2)` through `syscall`, as libseccomp does; with `SECCOMP_FILTER_FLAG_TSYNC`, which puts the
/// filter on every thread, the agent's own too), whose filter kills the
/// process (or fails with EPERM) at the system calls a profiler makes: the
/// agent sees the call coming through the program's import table, ends the
/// session before the filter goes in (`ended_by: "sandbox"`, a note, its
/// profile written), and witch says so and returns at once. The program
/// behaves as without witch, in a thread, a fork child that aborts and an
/// image it execs. (Before, the filter killed the target with SIGSYS at
/// its first sample, every time.)
#[test]
fn a_process_that_sandboxes_itself_during_the_session_is_left_first() {
    use std::time::{Duration, Instant};
    let dir = Scratch::new("attach-sandboxing");
    let prog = Program::build("sandboxed", dir.path());
    for (how, action) in [("prctl", "kill"), ("sysprctl", "kill"), ("tsync", "kill"), ("seccomp", "errno")] {
        let args = [how, action, "20000000", "late"];
        let native = prog.run_native(&args);
        assert_eq!(native.code(), Some(3), "native run:\n{}", native.describe());
        let t = Target::start(&prog.exe, &args, &[]);
        let pid = t.pid();
        let (err, out) = (dir.join(&format!("{how}-{action}.err")), dir.join(&format!("{how}-{action}.json")));
        let witch = AttachedWitch::start(pid, "30s", &out, &err);
        std::thread::sleep(Duration::from_millis(700));
        // Closing its stdin sends the program into its sandbox.
        let closed = Instant::now();
        let end = t.finish();
        let text = || std::fs::read_to_string(&err).unwrap_or_default();
        let status = witch.end_within(Duration::from_secs(40));
        let text = text();
        assert_eq!(
            (end.code(), end.signal(), end.stdout.as_str()),
            (Some(3), None, native.stdout_str().as_str()),
            "{how} {action}: the program must behave as without witch\n{}\nwitch: {text}",
            end.stderr
        );
        assert!(status.is_some(), "{how} {action}: witch still ran {:?} after the sandbox: {text}", closed.elapsed());
        assert_eq!(status.and_then(|s| s.code()), Some(0), "{how} {action}: {text}");
        let line = text.lines().find(|l| l.contains("ended the session by itself")).unwrap_or_else(|| panic!("no reason given: {text}"));
        assert!(line.contains("seccomp sandbox"), "{line:?}");
        let p = raw_profile(&out);
        assert_eq!(p["ended_by"], "sandbox", "{how} {action}: {p}");
        // Ended at the sandbox, not at the 30 s asked.
        let secs = p["duration_ns"].as_f64().unwrap_or(f64::MAX) / 1e9;
        assert!(secs < 10.0, "{how} {action}: the session lasted {secs:.1} s");
        assert!(p["notes"].to_string().contains("seccomp sandbox"), "{how} {action}: {}", p["notes"]);
        assert!(p["counters"]["samples"].as_u64().unwrap_or(0) > 0, "{how} {action}: the work before the sandbox should be sampled");
    }
}

/// A process whose only thread outside the C library has 8 KiB of stack
/// left (its main thread nearly always inside memset, where witch does not
/// stop a thread): witch does not run the agent's load on that stack,
/// which it would overflow, but waits for the main thread; the program
/// runs on, attach after attach. (Before, the
/// load wrote 8.7 KiB below the worker's stack pointer, through its guard
/// page: SIGSEGV, the program killed.)
#[test]
fn a_thread_without_stack_to_spare_is_not_used_for_the_attach() {
    let dir = Scratch::new("attach-small-stack");
    let prog = Program::build("small_stack", dir.path());
    let t = Target::start(&prog.exe, &["8192"], &[]);
    t.wait_ready(2, None);
    let pid = t.pid();
    for attempt in 0..2 {
        let out = dir.join(&format!("attach-{attempt}.json"));
        let run = attach_cmd(&witch_bin(), &[], "dead", pid, &["--duration", "1s", "-q", "-o", out.to_str().unwrap()]);
        assert_eq!(run.code(), Some(0), "attach {attempt}: {}", run.describe());
        assert_eq!(raw_profile(&out)["ended_by"], "detach");
    }
    let end = t.finish();
    assert_eq!((end.code(), end.signal()), (Some(0), None), "{}\n{}", end.stdout, end.stderr);
    // What was written there is the frame of the agent's first sample on
    // the thread (2.9 KiB here: the signal frame and the handler that lends
    // it the alternate stack), not the 8.7 KiB of the load.
    let written: u64 = end.stdout.trim().strip_prefix("written ").and_then(|n| n.parse().ok()).expect("the program's report");
    assert!(written < 4096, "{written} bytes were written below the worker's stack pointer");
}

/// A process that replaces its program with `execv` (or `execve`,
/// `execvp`, `execvpe`) during a session: the agent sees the call coming
/// through the program's import table and ends the session first, so the
/// profile of the program before the exec is kept (`ended_by: "exec"`, a
/// note); witch writes it, says so and exits 0; the process runs on as its
/// new program, with no agent in it. (Before, the profile went with the
/// old image, exit 3; see the test above, whose exec the agent still
/// cannot see.)
#[test]
fn a_process_that_execs_with_execv_keeps_the_sessions_profile() {
    exec_keeps_the_sessions_profile("execv", b"v\n", Environment::Same);
}

/// As with `execv`, with `execl`: variadic, taken by a C twin of the
/// agent's that builds its argv. (Before, the profile went with the old
/// image: witch exited 3.)
#[test]
fn a_process_that_execs_with_execl_keeps_the_sessions_profile() {
    exec_keeps_the_sessions_profile("execl", b"l\n", Environment::Same);
}

/// As with `execl`, with `execlp` and a bare name found along `PATH`.
#[test]
fn a_process_that_execs_with_execlp_keeps_the_sessions_profile() {
    exec_keeps_the_sessions_profile("execlp", b"p\n", Environment::PathChanged);
}

/// As with `execl`, with `execle` and an environment of its own.
#[test]
fn a_process_that_execs_with_execle_keeps_the_sessions_profile() {
    exec_keeps_the_sessions_profile("execle", b"n\n", Environment::Given(b"DAEMON_EXEC_ENV=execle\0"));
}

/// As with `execv`, with `fexecve` (which the C library makes an
/// `execveat` system call of: only the program's import shows it).
#[test]
fn a_process_that_execs_with_fexecve_keeps_the_sessions_profile() {
    exec_keeps_the_sessions_profile("fexecve", b"f\n", Environment::Same);
}

/// What the new image's environment must be, against the old one's.
enum Environment {
    Same,
    /// The same but `PATH`, which the program put its directory in front of.
    PathChanged,
    /// Exactly these `NAME=VALUE\0` entries.
    Given(&'static [u8]),
}

/// `daemon_exec` (generation 5) replaces its program by `command` (through
/// `via`) during a session: witch writes the session's profile
/// (`ended_by: "exec"`, a note naming `via`), says so and exits 0 within a
/// poll or two; the process runs on as generation 6, with the arguments and
/// environment it asked for and no agent in it, and ends as it would have.
fn exec_keeps_the_sessions_profile(via: &str, command: &[u8], env: Environment) {
    let dir = Scratch::new(&format!("attach-{via}"));
    let prog = Program::build("daemon_exec", dir.path());
    let mut t = Target::start(&prog.exe, &["5"], &[]);
    t.wait_ready(2, None);
    let pid = t.pid();
    let cmdline = || std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let environ = || std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let (cmdline_before, environ_before) = (cmdline(), environ());
    assert!(cmdline_before.ends_with(b"\x005\x00"), "{:?}", String::from_utf8_lossy(&cmdline_before));
    let (out, err) = (dir.join(&format!("{via}.json")), dir.join(&format!("{via}.err")));
    let witch = AttachedWitch::start(pid, "60s", &out, &err);
    std::thread::sleep(std::time::Duration::from_millis(700));
    let exec_at = std::time::Instant::now();
    t.send(command);
    let text = || std::fs::read_to_string(&err).unwrap_or_default();
    let status = witch.end_within(std::time::Duration::from_secs(20));
    let took = exec_at.elapsed();
    let text = text();
    eprintln!("[witch-tests] {via}: witch ended {took:?} after the exec:\n{text}");
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{via}: {text}");
    assert!(took < std::time::Duration::from_secs(3), "{via}: witch ended only {took:?} after the exec\n{text}");
    let p = raw_profile(&out);
    assert_eq!(p["ended_by"], "exec", "{via}: {p}");
    assert!(p["notes"].to_string().contains(&format!("called {via} to replace its program")), "{via}: {}", p["notes"]);
    assert_says_the_exec_ended_the_session(&text, pid, via, &p);
    let rep = report(&out);
    rep.assert_samples(5.0);
    // The process runs on, as its new program, with the arguments and the
    // environment it asked for, and no agent in it.
    let mut cmdline_after = cmdline_before.clone();
    *cmdline_after.iter_mut().rev().nth(1).unwrap() = b'6';
    assert!(
        eventually(std::time::Duration::from_secs(5), || cmdline() == cmdline_after),
        "{via}: not its new image, or other arguments: {:?}",
        String::from_utf8_lossy(&cmdline())
    );
    let environ_after = environ();
    match env {
        Environment::Same => assert!(environ_after == environ_before, "{via}: another environment"),
        Environment::PathChanged => {
            let without_path = |e: &[u8]| e.split(|&b| b == 0).filter(|v| !v.starts_with(b"PATH=")).map(<[u8]>::to_vec).collect::<Vec<_>>();
            assert_eq!(without_path(&environ_after), without_path(&environ_before), "{via}: another environment");
            let path = format!("PATH={}:", dir.path().canonicalize().unwrap().display());
            assert!(environ_after.split(|&b| b == 0).any(|v| v.starts_with(path.as_bytes())), "{via}: PATH is not the program's");
        }
        Environment::Given(given) => {
            assert_eq!(String::from_utf8_lossy(&environ_after), String::from_utf8_lossy(given), "{via}: another environment")
        }
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    assert!(!maps.contains("libwitch_agent.so"), "{via}: {maps}");
    std::thread::sleep(std::time::Duration::from_millis(200));
    t.send(b"q\n");
    let end = t.finish();
    assert_eq!((end.code(), end.stdout.as_str()), (Some(5), "generation 6 ran rounds\n"), "{via}: {}", end.stderr);
}

/// witch's one line on a session the agent ended at an exec (`p`, its
/// profile, has the length it gives), naming the call, whether its poll
/// saw the new image first (as a rule: the exec follows the profile at
/// once) or the agent's end. (It said "replaced its program (exec) after
/// its agent had sent the profile: that profile is kept" then, without the
/// call.)
fn assert_says_the_exec_ended_the_session(text: &str, pid: u32, via: &str, p: &serde_json::Value) {
    let secs = p["duration_ns"].as_f64().unwrap_or_else(|| panic!("{via}: no duration_ns in {p}")) / 1e9;
    let line = format!(
        "witch: pid {pid} (daemon_exec) called {via} to replace its program after {secs:.1} s of the 60.0 s asked: its agent ended the session first and sent its profile, which is written; the process runs on"
    );
    let between: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("witch: attached to pid ") && !l.starts_with("witch: detached; profile written to "))
        .collect();
    assert_eq!(between, [line.as_str()], "{via}: witch should say, in one line, that the session ended at the call: {text}");
}

/// An `execl` that fails (no such file) during a session: the session ends
/// at the call with its profile (the agent cannot know the exec will fail),
/// and the call fails as without witch, with its errno; the process runs
/// on as it was, and the next session is not ended by the exec that did
/// not happen: it runs its course ("detach").
#[test]
fn a_failed_execl_keeps_the_process_and_the_next_session_as_they_were() {
    let dir = Scratch::new("attach-execl-fails");
    let prog = Program::build("daemon_exec", dir.path());
    let mut t = Target::start(&prog.exe, &["5"], &[]);
    t.wait_ready(2, None);
    let pid = t.pid();
    let (out, err) = (dir.join("failed.json"), dir.join("failed.err"));
    let witch = AttachedWitch::start(pid, "60s", &out, &err);
    std::thread::sleep(std::time::Duration::from_millis(700));
    t.send(b"x\n");
    let text = || std::fs::read_to_string(&err).unwrap_or_default();
    let status = witch.end_within(std::time::Duration::from_secs(20));
    let text = text();
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{text}");
    let p = raw_profile(&out);
    assert_eq!(p["ended_by"], "exec", "{p}");
    assert!(p["notes"].to_string().contains("called execl to replace its program"), "{}", p["notes"]);
    assert_says_the_exec_ended_the_session(&text, pid, "execl", &p);
    assert!(t.alive(), "the target died");
    // The next session runs its course.
    let again = dir.join("again.json");
    let run = attach_cmd(&witch_bin(), &[], "dead", pid, &["--duration", "1s", "-q", "-o", again.to_str().unwrap()]);
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    let p = raw_profile(&again);
    assert_eq!(p["ended_by"], "detach", "{p}");
    assert!(p["counters"]["samples"].as_u64().unwrap_or(0) > 0, "{p}");
    let end = t.finish();
    assert_eq!((end.code(), end.stdout.as_str()), (Some(5), "generation 5 ran rounds\n"), "{}", end.stderr);
    assert_eq!(end.stderr, "execl failed: No such file or directory\n");
}

/// `witch CRAFT --pid` run in the background: its exit status, waited for
/// at most `limit` (None: it had not ended, and was killed).
fn attach_within(
    pid: u32,
    craft: &str,
    duration: &str,
    out: &Path,
    limit: std::time::Duration,
) -> (Option<std::process::ExitStatus>, String) {
    let err = out.with_extension("err");
    let mut witch = Command::new(witch_bin())
        .args([craft, "--pid", &pid.to_string(), "--duration", duration, "-q", "-o"])
        .arg(out)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let ended = eventually(limit, || witch.try_wait().ok().flatten().is_some());
    if !ended {
        let _ = witch.kill();
    }
    let status = witch.wait().ok().filter(|_| ended);
    (status, std::fs::read_to_string(&err).unwrap_or_default())
}

/// An attach while another thread holds the dynamic loader's lock, in a
/// library constructor that waits for the main thread (what the main
/// thread does after 2 s): witch waits for the lock to be free before it
/// makes a thread load the agent, so the program ends as it does
/// unprofiled, about 2 s in, and witch ends too, with a profile or a
/// one-line refusal. (Before, witch made the main thread call `dlopen`,
/// which waited for the lock while the constructor waited for the main
/// thread: both waited for good, witch gave up after 30 s, and the program
/// stayed hung.)
#[test]
fn an_attach_while_a_constructor_holds_the_loader_lock_never_deadlocks_the_program() {
    let dir = Scratch::new("attach-loader-lock");
    let prog = Program::build("loader_lock", dir.path());
    let lib =
        Program::build_with("loader_lock_lib", dir.path(), "libloader_lock.so", &["-shared", "-fPIC"]).unwrap_or_else(|e| panic!("{e}"));
    let lib = lib.exe.to_str().unwrap().to_string();
    let native = prog.run_native(&[&lib]);
    assert_eq!((native.code(), native.stdout_str().as_str()), (Some(0), "loaded 42\n"), "{}", native.describe());
    let started = std::time::Instant::now();
    let mut t = Target::start(&prog.exe, &[&lib], &[]);
    t.wait_ready(2, None);
    let (witch, said) = attach_within(t.pid(), "dead", "500ms", &dir.join("lock.json"), std::time::Duration::from_secs(15));
    let ended = eventually(std::time::Duration::from_secs(6), || !t.alive());
    let took = started.elapsed();
    assert!(ended, "the program hung after the attach (witch: {witch:?} {said})");
    let end = t.finish();
    assert_eq!((end.code(), end.stdout.as_str()), (Some(0), "loaded 42\n"), "witch: {witch:?} {said}\n{}", end.stderr);
    assert!(took < std::time::Duration::from_secs(4), "the program took {took:?}, 2 s unprofiled");
    let witch = witch.unwrap_or_else(|| panic!("witch did not end: {said}"));
    let lines: Vec<&str> = said.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(witch.code() == Some(0) || (witch.code() == Some(2) && lines.len() == 1), "witch: {witch:?} {said}");
}

/// A thread waiting in `semtimedop` with a timeout of its own, the
/// process's only thread: witch stops it at once (its wait holds no lock
/// of the C library's) and only once, so the attach takes no longer than
/// any other, and the call, re-issued with its timeout in full after that
/// one stop, ends late by no more than it had waited when stopped, never
/// early. (Before, witch did not take a thread in `semtimedop`, stopped it
/// every 2 ms for 5 s looking for a better moment, re-issuing the call
/// with its full timeout each time, and then took it anyway: the attach
/// took 5.2 s and the 1.5 s wait ended after 7 s.)
///
/// "Any other" is an attach to the same program waiting in `read` on its
/// stdin instead, which witch also takes at once, made just before and
/// just after on the same machine: how long an attach takes depends on how
/// busy the machine is, the comparison does not. How often the thread was
/// stopped is counted by its voluntary context switches during the call
/// (each stop is one, as is each time the call blocks), which the
/// machine's load hardly changes.
#[test]
fn a_semtimedop_wait_is_stopped_once_and_never_holds_the_attach_up() {
    use std::time::Duration;
    let dir = Scratch::new("attach-semtimedop");
    let prog = Program::build("timed_wait", dir.path());
    let before = attach_to_a_wait(&dir, &prog, "read");
    let sem = attach_to_a_wait(&dir, &prog, "semtimedop");
    let after = attach_to_a_wait(&dir, &prog, "read");
    let (took, switches) = (before.took.max(after.took), before.switches.max(after.switches));
    // Stopped once: as often as in `read` (either call blocks again once
    // after the stop, re-issued by witch or restarted by the kernel; the
    // injected calls stop it some 200 times more). A busy machine adds a
    // switch now and then (once 213 against 212 under load: the thread
    // blocked once more during the injected calls); the old stops, one
    // every 2 ms for 5 s, added thousands (4552 against 212).
    let more = sem.switches.saturating_sub(switches);
    assert!(more <= 10, "the thread in semtimedop was stopped or blocked {} times, in read {switches}", sem.switches);
    // Not held up: the old 5 s of stops would show whatever the load.
    assert!(sem.took <= took + Duration::from_secs(1), "the attach to semtimedop took {:?}, to read {took:?}", sem.took);
    // Late by at most what it had waited when stopped (it was stopped before the session began).
    let latest = 1500 + sem.done_by.as_millis() as u64;
    assert!((1500..=latest).contains(&sem.ms), "the 1500 ms wait took {} ms (witch was done {:?} in)", sem.ms, sem.done_by);
}

/// An attach ([`attach_to_a_wait`]) to a thread in a wait.
struct WaitAttach {
    /// From witch's start to its end (the attach and its 200 ms session).
    took: std::time::Duration,
    /// From the program's start to witch's end.
    done_by: std::time::Duration,
    /// How long the program's wait took, and its voluntary context
    /// switches meanwhile.
    ms: u64,
    switches: u64,
}

/// Start `timed_wait` waiting in `call` (`semtimedop` for 1500 ms, or
/// `read` until its stdin closes), attach to it 300 ms into the wait for a
/// 200 ms session, and read what the program says once its wait is over.
fn attach_to_a_wait(dir: &Scratch, prog: &Program, call: &str) -> WaitAttach {
    let started = std::time::Instant::now();
    let t = Target::start(&prog.exe, &[if call == "read" { "read" } else { "1500" }], &[]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let out = dir.join(&format!("{call}.json"));
    let attach = std::time::Instant::now();
    let (witch, said) = attach_within(t.pid(), "dead", "200ms", &out, std::time::Duration::from_secs(15));
    let (took, done_by) = (attach.elapsed(), started.elapsed());
    assert_eq!(witch.and_then(|s| s.code()), Some(0), "{call}: {said}");
    let end = t.finish();
    let returned = if call == "read" { "0" } else { "-1 errno Resource temporarily unavailable" };
    let (ms, switches) = end
        .stdout
        .strip_prefix(&format!("{call} returned {returned} after "))
        .and_then(|r| r.trim_end().strip_suffix(" voluntary switches"))
        .and_then(|r| r.split_once(" ms, "))
        .and_then(|(ms, n)| Some((ms.parse().ok()?, n.parse().ok()?)))
        .unwrap_or_else(|| panic!("{call}: {:?}", end.stdout));
    WaitAttach { took, done_by, ms, switches }
}

/// A process that turned the time-stamp counter off for its threads
/// (`prctl(PR_SET_TSC, PR_TSC_SIGSEGV)`, before witch attaches) runs on
/// unharmed through three sessions, each sampled: the agent notes the
/// setting when it is loaded, before its first clock read. (Before, the
/// first session's wait for its settings read the counter through the
/// vDSO: SIGSEGV, the program killed.)
#[test]
fn a_process_without_the_time_stamp_counter_is_attached_unharmed() {
    let dir = Scratch::new("attach-no-tsc");
    let prog = Program::build_with("no_tsc", dir.path(), "no_tsc", &["-pthread"]).expect("build no_tsc");
    let t = Target::start(&prog.exe, &["prctl", "0"], &[]);
    t.wait_ready(3, None);
    three_sampled_sessions(t.pid(), dir.path());
    let end = t.finish();
    assert_eq!((end.code(), end.signal()), (Some(0), None), "the program must run on as without witch:\n{}\n{}", end.stdout, end.stderr);
    assert!(end.stdout.contains("state 2") && end.stdout.contains("main: "), "{}", end.stdout);
}

/// A process that opens hardware breakpoints on itself during a session
/// (`perf_event_open` through `syscall`, which the agent takes through the
/// program's import tables) gets them all, as natively: the session ends
/// first, leaving the debug registers to it, and witch says why and exits
/// 0. (Before, the opens failed with ENOSPC while the session held them.)
#[test]
fn a_process_that_opens_its_own_hardware_breakpoints_during_the_session_gets_them() {
    use std::time::Duration;
    let dir = Scratch::new("attach-own-breakpoints");
    let prog = Program::build_with("own_breakpoints", dir.path(), "own_breakpoints", &["-pthread"]).expect("build own_breakpoints");
    let t = Target::start(&prog.exe, &["0"], &[]);
    t.wait_ready(1, None);
    let pid = t.pid();
    let (err, out) = (dir.join("session.err"), dir.join("session.json"));
    let witch = AttachedWitch::start(pid, "30s", &out, &err);
    std::thread::sleep(Duration::from_millis(700));
    // Closing its stdin makes the program open its breakpoints.
    let end = t.finish();
    let status = witch.end_within(Duration::from_secs(40));
    let text = std::fs::read_to_string(&err).unwrap_or_default();
    assert_eq!((end.code(), end.signal()), (Some(0), None), "{}\n{}", end.stdout, end.stderr);
    assert!(
        end.stdout.contains("opened 4 of 4, counted 1000 1000 1000 1000") && end.stdout.contains("thread: opened, counted 500"),
        "{}",
        end.stdout
    );
    assert_eq!(status.and_then(|s| s.code()), Some(0), "witch: {text}");
    assert!(text.contains("hardware breakpoint of its own"), "witch should say why the session ended: {text}");
    let p = raw_profile(&out);
    assert_eq!(p["ended_by"], "traced", "{p}");
    assert!(p["counters"]["samples"].as_u64().unwrap_or(0) > 0, "the work before should be sampled");
}

/// A process that unmasked every floating-point exception before witch
/// attaches (tests/programs/fp_traps.c) runs on through three sessions,
/// each sampled, and no thread finds a sticky flag it did not raise: the
/// agent's load, its control thread and its threads' set-up run under
/// the default control, not the program's.
#[test]
fn a_process_that_traps_floating_point_exceptions_is_attached_unharmed() {
    let dir = Scratch::new("attach-fp-traps");
    let prog = Program::build_with("fp_traps", dir.path(), "fp_traps", &["-pthread", "-lm"]).expect("build fp_traps");
    let t = Target::start(&prog.exe, &["0"], &[]);
    t.wait_ready(3, None);
    three_sampled_sessions(t.pid(), dir.path());
    let end = t.finish();
    assert_eq!((end.code(), end.signal()), (Some(0), None), "{}\n{}", end.stdout, end.stderr);
    assert_eq!(end.stdout.matches("flags 0").count(), 3, "no flag the program did not raise:\n{}", end.stdout);
}

/// Attach to `pid` three times (dead stores, redundant loads, silent
/// stores), 400 ms each, with `extra` arguments: each session ends well.
/// Their profiles (`attach`N`.json` in `dir`), with their crafts.
fn three_sessions(pid: u32, dir: &Path, extra: &[&str]) -> Vec<(&'static str, PathBuf)> {
    let mut outs = Vec::new();
    for (i, craft) in ["dead", "silent-load", "silent-store"].into_iter().enumerate() {
        let out = dir.join(format!("attach{i}.json"));
        let mut args = vec!["--duration", "400ms", "-q", "-o", out.to_str().unwrap()];
        args.extend_from_slice(extra);
        let run = attach_cmd(&witch_bin(), &[], craft, pid, &args);
        assert_eq!(run.code(), Some(0), "attach #{i} failed:\n{}", run.describe());
        outs.push((craft, out));
    }
    outs
}

/// [`three_sessions`] without extra arguments, each sampled.
fn three_sampled_sessions(pid: u32, dir: &Path) -> Vec<(&'static str, PathBuf)> {
    let outs = three_sessions(pid, dir, &[]);
    for (_, out) in &outs {
        report(out).assert_samples(5.0);
    }
    outs
}

/// A process whose threads keep per-CPU counters with restartable
/// sequences (tests/programs/rseq_counters.c) keeps every increment
/// through sessions of every craft with a window at every 1 ms tick: the
/// code cache never runs a critical section (a copy preempted halfway is
/// not restarted by the kernel, and the threads lost each other's
/// increments).
#[test]
fn a_process_with_restartable_sequences_is_attached_without_losing_an_update() {
    let dir = Scratch::new("attach-rseq");
    let prog = Program::build_with("rseq_counters", dir.path(), "rseq_counters", &["-pthread"]).expect("build rseq_counters");
    let t = Target::start(&prog.exe, &["4", "0", "40"], &[]);
    t.wait_ready(5, None);
    for (i, (_, out)) in three_sessions(t.pid(), dir.path(), &EVERY_MS).iter().enumerate() {
        // (Its threads are nearly always in a section or on their way to
        // one, where windows end: few accesses are sampled, but windows
        // met sections.)
        let raw = raw_profile(out);
        assert!(raw["counters"]["critical_sections"].as_u64().unwrap_or(0) > 0, "attach #{i}: {}", raw["counters"]);
    }
    let end = t.finish();
    assert_eq!((end.code(), end.signal()), (Some(0), None), "{}\n{}", end.stdout, end.stderr);
    assert!(end.stdout.contains("(exact)"), "{}", end.stdout);
}

/// A process that turns on syscall user dispatch during an attached
/// session (tests/programs/syscall_dispatch.c, through `prctl` and through
/// `syscall`): the agent sees the call coming through the program's import
/// table and ends the session before it goes in, as before a seccomp
/// filter; witch says why and returns at once, and the program runs as
/// natively, its SIGSYS handler never called. (Before, the target died of
/// SIGSYS at the next sample.)
#[test]
fn a_process_that_turns_on_syscall_user_dispatch_during_the_session_is_left_first() {
    let dir = Scratch::new("attach-dispatch");
    let prog = Program::build("syscall_dispatch", dir.path());
    for how in ["prctl", "syscall"] {
        // Closing its stdin turns dispatch on.
        let c = changed_under_a_session(&prog, &dir, how, &[how, "100000", "late"], &[], 700);
        assert!(c.stdout.contains("SIGSYS caught 0"), "{how}: {}", c.stdout);
        assert_eq!(c.status.code(), Some(0), "{how}: {}", c.said);
        let line =
            c.said.lines().find(|l| l.contains("ended the session by itself")).unwrap_or_else(|| panic!("no reason given: {}", c.said));
        assert!(line.contains("syscall user dispatch"), "{line:?}");
        let p = raw_profile(&c.out);
        assert_eq!(p["ended_by"], "sandbox", "{how}: {p}");
        assert!(p["counters"]["samples"].as_u64().unwrap_or(0) > 0, "{how}: the work before should be sampled");
    }
}

/// A process that patches its own code in place during attached sessions
/// (tests/programs/hot_patch.c: mprotect, write, mprotect, through the
/// program's import of `mprotect` and through `syscall`) runs the new code
/// on every call after the patch, with a window at every 1 ms tick.
/// (Before, windows ran copies of the old code.)
#[test]
fn a_process_that_patches_its_own_code_while_attached_runs_the_new_code() {
    let dir = Scratch::new("attach-hot-patch");
    let prog = Program::build("hot_patch", dir.path());
    for how in ["libc", "syscall"] {
        // Closing its stdin makes it patch, then call the new code.
        changed_under_a_session(&prog, &dir, how, &[how, "20000000", "late"], &EVERY_MS, 500);
    }
}

/// A process that forbids itself writable code (`prctl(PR_SET_MDWE)`, as
/// systemd's MemoryDenyWriteExecute=yes does) before witch attaches gets
/// the code cache mapped twice in every thread: three sessions of every
/// craft run windows and are sampled, and the process runs on, a fork
/// child included. (Before, its bursts single-stepped without a word.)
#[test]
fn a_process_that_forbids_writable_code_is_attached_with_windows() {
    let dir = Scratch::new("attach-wx");
    let prog = Program::build_with("write_xor_exec", dir.path(), "write_xor_exec", &["-pthread"]).expect("build write_xor_exec");
    let t = Target::start(&prog.exe, &["0"], &[]);
    t.wait_ready(3, None);
    for (craft, out) in three_sampled_sessions(t.pid(), dir.path()) {
        let raw = raw_profile(&out);
        assert!(raw["counters"]["windows"].as_u64().unwrap_or(0) > 0, "{craft}: windows should run: {}", raw["counters"]);
    }
    let end = t.finish();
    assert_eq!((end.code(), end.signal()), (Some(0), None), "{}\n{}", end.stdout, end.stderr);
    assert!(end.stdout.contains("write xor execute: 1") && end.stdout.contains("child ended: 0"), "{}", end.stdout);
}

/// A process that installs a SIGTRAP handler of its own during an attached
/// session (through its import of `sigaction`, or through `syscall`) sees
/// its own trap and no other, with a window at every 1 ms tick: the
/// agent's handler stays, the program's is remembered and called for the
/// program's own traps, and after the session the program's is in place.
/// (Before, the program's handler replaced the agent's, and the code
/// cache's next exit killed the process: SIGSEGV.)
#[test]
fn a_process_that_installs_its_own_trap_handler_while_attached_sees_only_its_own_traps() {
    let dir = Scratch::new("attach-trap-handler");
    let prog = Program::build("trap_handler", dir.path());
    for how in ["libc", "syscall"] {
        // Closing its stdin makes it install its handler, work, and trap.
        let c = changed_under_a_session(&prog, &dir, how, &[how, "20000", "late"], &EVERY_MS, 500);
        assert!(c.stdout.contains("installed 0 (its own: yes), traps seen 1"), "{how}: {}", c.stdout);
    }
}

/// What [`changed_under_a_session`] saw.
struct Changed {
    /// The program's stdout.
    stdout: String,
    /// The session's profile.
    out: PathBuf,
    /// witch's stderr, and how it ended.
    said: String,
    status: std::process::ExitStatus,
}

/// Start `prog` with `args` (the last, `late`: it works until its stdin
/// closes, then does what the test is about), attach with `extra`
/// arguments, and close its stdin `settle_ms` later: it must end as
/// natively (status 0, no signal), and witch with it. Its files are
/// `tag`.err and `tag`.json in `dir`.
fn changed_under_a_session(prog: &Program, dir: &Scratch, tag: &str, args: &[&str], extra: &[&str], settle_ms: u64) -> Changed {
    use std::time::Duration;
    let t = Target::start(&prog.exe, args, &[]);
    let (err, out) = (dir.join(&format!("{tag}.err")), dir.join(&format!("{tag}.json")));
    let witch = AttachedWitch::start_with(t.pid(), "30s", &out, &err, extra);
    std::thread::sleep(Duration::from_millis(settle_ms));
    let end = t.finish();
    let status = witch.end_within(Duration::from_secs(40));
    let said = std::fs::read_to_string(&err).unwrap_or_default();
    assert_eq!((end.code(), end.signal()), (Some(0), None), "{tag}: {}\n{}\nwitch: {said}", end.stdout, end.stderr);
    let status = status.unwrap_or_else(|| panic!("{tag}: witch did not end: {said}"));
    Changed { stdout: end.stdout, out, said, status }
}

/// Windows at every 1 ms tick.
const EVERY_MS: [&str; 4] = ["--overhead", "0", "-p", "1ms"];

/// A process that installs a SIGSEGV handler of its own during an attached
/// session and then faults on purpose, its handler finding the faulting
/// instruction by the PC in its ucontext (tests/programs/fault_handler.c),
/// sees every fault at that instruction, with a window at every 1 ms
/// tick: an attached agent cannot guard the program's fault handlers, so
/// windows stop as the handler goes in. (Before, they stopped at the
/// session's next poll, up to 50 ms later, and a fault in a copy in the
/// code cache handed the handler the copy's PC: 1 fault of 100,000 in
/// each of 5 runs.)
#[test]
fn a_process_that_installs_a_fault_handler_while_attached_sees_its_faults_where_they_are() {
    let dir = Scratch::new("attach-fault-handler");
    let prog = Program::build("fault_handler", dir.path());
    for attempt in 0..2 {
        // Closing its stdin makes it install its handler and fault.
        let c = changed_under_a_session(&prog, &dir, &attempt.to_string(), &["100000", "late"], &EVERY_MS, 700);
        assert!(c.stdout.contains("faults seen 100000, elsewhere 0;"), "attempt {attempt}: {}", c.stdout);
        report(&c.out).assert_samples(5.0);
    }
}

/// A process that uses every real-time signal itself
/// (tests/programs/own_rt_signals.c), one of which witch samples with:
/// with a handler, blocked and taken with `sigwaitinfo` or a `signalfd`,
/// and blocked while queued then unblocked, through a session at the
/// defaults. None of witch's signals reaches it, each of its own comes
/// back once with its own value, and its mask reads back as it set it.
/// (Before, a thread that blocked the sampler's signal and took it with
/// `sigwaitinfo` also took witch's ticks: 23,000 of 620,000 signals came
/// back wrong.)
#[test]
fn a_process_that_takes_its_own_real_time_signals_gets_none_of_witchs() {
    use std::time::Duration;
    let dir = Scratch::new("attach-own-rt-signals");
    let prog = Program::build_with("own_rt_signals", dir.path(), "own_rt_signals", &["-pthread"]).expect("build own_rt_signals");
    for how in ["wait", "signalfd", "unblock", "handler"] {
        let t = Target::start(&prog.exe, &[how, "0"], &[]);
        std::thread::sleep(Duration::from_millis(300));
        let out = dir.join(&format!("{how}.json"));
        let run = attach_cmd(&witch_bin(), &[], "dead", t.pid(), &["--duration", "1s", "-q", "-o", out.to_str().unwrap()]);
        assert_eq!(run.code(), Some(0), "{how}: {}", run.describe());
        std::thread::sleep(Duration::from_millis(200));
        let end = t.finish();
        assert_eq!((end.code(), end.signal()), (Some(0), None), "{how}: {}\n{}", end.stdout, end.stderr);
        assert!(end.stdout.contains(&format!("{how}: all taken 1, wrong 0, mask wrong 0")), "{how}: {}", end.stdout);
        if how != "handler" {
            let p = raw_profile(&out);
            assert!(p.to_string().contains("\"signals_held\""), "{how}: the held signal should be counted: {}", p["counters"]);
        }
    }
}
