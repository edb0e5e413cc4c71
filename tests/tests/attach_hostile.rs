//! What the owner of a target can do to a root-run `witch --pid` or witchd,
//! and what a failed attach leaves behind (docs/SECURITY.md).
//!
//! The target runs as nobody; root attaches to it. Whatever the session
//! puts in the file system where nobody can write is nobody's to replace:
//! these tests plant, there, what a hostile owner would (links to root's
//! files, FIFOs named like profiles) and check that root never reads
//! through them, writes through them, or blocks on them.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use witch_tests::attach::*;
use witch_tests::*;

/// The planters look at every directory nobody owns: one test at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Root's files a hostile target owner would aim at.
struct Vault {
    secret: PathBuf,
    secret_text: String,
    victim: PathBuf,
}

impl Vault {
    fn new(dir: &Scratch) -> Vault {
        let vault = dir.join("vault");
        std::fs::create_dir(&vault).unwrap();
        chmod(&vault, 0o700);
        let secret_text = format!("witch-test-secret-{}", std::process::id());
        let secret = vault.join("secret");
        std::fs::write(&secret, &secret_text).unwrap();
        chmod(&secret, 0o600);
        let victim = vault.join("victim");
        std::fs::write(&victim, "intact\n").unwrap();
        chmod(&victim, 0o644);
        Vault { secret, secret_text, victim }
    }
}

/// What a hostile owner plants in a directory of theirs.
#[derive(Clone, Copy)]
enum Plant {
    /// `error` -> root's secret: would root read it and send it back?
    ErrorLink,
    /// `detach` -> root's file: would root truncate it?
    DetachLink,
    /// FIFOs and an endless file named like profiles: would root block?
    Fifos,
}

/// Entries of the temporary directory that `uid` owns and may write in.
fn writable_dirs_of(uid: u32) -> Vec<PathBuf> {
    std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("witch"))
        .filter(|e| std::fs::symlink_metadata(e.path()).is_ok_and(|m| m.is_dir() && m.uid() == uid))
        .map(|e| e.path())
        .collect()
}

/// Plants `what` in every directory nobody owns under the temporary
/// directory that was not there before, until `stop`; returns where.
fn planter(vault: &Vault, what: Plant, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<PathBuf>> {
    let before = writable_dirs_of(NOBODY);
    let (secret, victim) = (vault.secret.clone(), vault.victim.clone());
    std::thread::spawn(move || {
        let mut planted = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            for d in writable_dirs_of(NOBODY) {
                if before.contains(&d) || planted.contains(&d) {
                    continue;
                }
                match what {
                    Plant::ErrorLink => {
                        let _ = std::os::unix::fs::symlink(&secret, d.join("error"));
                    }
                    Plant::DetachLink => {
                        let _ = std::os::unix::fs::symlink(&victim, d.join("detach"));
                    }
                    Plant::Fifos => {
                        for name in ["a.json", "b.json"] {
                            let c = std::ffi::CString::new(d.join(name).to_str().unwrap()).unwrap();
                            unsafe { libc::mkfifo(c.as_ptr(), 0o666) };
                        }
                        let _ = std::os::unix::fs::symlink("/dev/zero", d.join("c.json"));
                    }
                }
                planted.push(d);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        planted
    })
}

/// Runs `cmd`, killing it after `limit`; None if it had to be killed.
fn run_within(mut cmd: Command, limit: Duration) -> Option<(std::process::ExitStatus, String)> {
    let err = tempfile_path("stderr");
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(std::fs::File::create(&err).unwrap());
    let mut child = cmd.spawn().expect("spawn");
    let until = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&err).unwrap_or_default();
    let _ = std::fs::remove_file(&err);
    status.map(|s| (s, text))
}

fn tempfile_path(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    std::env::temp_dir().join(format!("witch-tests-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)))
}

/// A busy program running as nobody, and root's `witch dead --pid` on it
/// while `what` is planted wherever nobody can.
/// What one hostile session left: the scratch directory (holding the
/// vault), the vault, where things were planted, and how witch ended
/// (None: it hung and was killed).
struct Hostile {
    _dir: Scratch,
    vault: Vault,
    planted: Vec<PathBuf>,
    ended: Option<(std::process::ExitStatus, String)>,
}

fn root_attach_with(what: Plant) -> Option<Hostile> {
    let Some(wrapper) = nobody_wrapper() else {
        eprintln!("[witch-tests] not root or no setpriv: skipping");
        return None;
    };
    let _serial = one_at_a_time();
    let dir = Scratch::new("hostile");
    chmod(dir.path(), 0o755);
    let vault = Vault::new(&dir);
    let prog = Program::build("busy_single", dir.path());
    chmod(&prog.exe, 0o755);
    let target = Target::start(&prog.exe, &["0"], &wrapper);
    target.wait_ready(1, Some("busy_single"));
    let stop = Arc::new(AtomicBool::new(false));
    let plants = planter(&vault, what, stop.clone());
    let mut cmd = Command::new(witch_bin());
    cmd.args(["dead", "--pid", &target.pid().to_string(), "--duration", "1s", "-q", "-o"]).arg(dir.join("out.json"));
    let ended = run_within(cmd, Duration::from_secs(30));
    stop.store(true, Ordering::Relaxed);
    let planted = plants.join().unwrap();
    assert!(eventually(Duration::from_secs(5), || !agent_armed(target.pid())), "the session was left armed in the target");
    ends_as_unprofiled(target, &prog);
    Some(Hostile { _dir: dir, vault, planted, ended })
}

#[test]
fn root_attach_never_reads_through_a_link_the_targets_owner_planted() {
    let Some(Hostile { _dir: _keep, vault, planted, ended }) = root_attach_with(Plant::ErrorLink) else { return };
    let (_, stderr) = ended.expect("witch did not end within 30 s");
    assert!(
        !stderr.contains(&vault.secret_text),
        "root's witch read a root-only file through a link planted in {planted:?} and printed it:\n{stderr}"
    );
}

#[test]
fn root_attach_never_writes_through_a_link_the_targets_owner_planted() {
    let Some(Hostile { _dir: _keep, vault, planted, .. }) = root_attach_with(Plant::DetachLink) else { return };
    assert_eq!(
        std::fs::read_to_string(&vault.victim).unwrap(),
        "intact\n",
        "root's witch wrote to a root-owned file through a link planted in {planted:?}"
    );
}

#[test]
fn root_attach_never_blocks_on_a_fifo_the_targets_owner_planted() {
    let Some(Hostile { _dir: _keep, planted, ended, .. }) = root_attach_with(Plant::Fifos) else { return };
    let (status, stderr) = ended.unwrap_or_else(|| panic!("root's witch hung (FIFOs and /dev/zero planted in {planted:?})"));
    assert!(status.success(), "witch failed:\n{stderr}");
}

/// witchd, as root, running sessions on a nobody process whose owner plants
/// FIFOs named like profiles: SIGTERM must still end it promptly.
#[test]
fn witchd_exits_on_sigterm_whatever_the_targets_owner_planted() {
    let Some(wrapper) = nobody_wrapper() else {
        eprintln!("[witch-tests] not root or no setpriv: skipping");
        return;
    };
    let _serial = one_at_a_time();
    let dir = Scratch::new("hostile-witchd");
    chmod(dir.path(), 0o755);
    let vault = Vault::new(&dir);
    let prog = Program::build("attach_target", dir.path());
    chmod(&prog.exe, 0o755);
    let target = Target::start(&prog.exe, &["0"], &wrapper);
    target.wait_ready(5, Some("attach_target"));
    let config = dir.join("witchd.toml");
    std::fs::write(
        &config,
        format!(
            "socket = \"{}\"\nhttp = \"off\"\nscan_every = \"200ms\"\ndetach_timeout = \"3s\"\n\
             [store]\ndir = \"{}\"\n[defaults]\nevery = \"1s\"\nduration = \"500ms\"\ncrafts = [\"dead\"]\n[[watch]]\npid = {}\n",
            dir.join("witchd.sock").display(),
            dir.join("store").display(),
            target.pid()
        ),
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let plants = planter(&vault, Plant::Fifos, stop.clone());
    let log = dir.join("witchd.log");
    let mut witchd = Command::new(witchd_bin())
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(dir.join("witchd.err")).unwrap())
        .spawn()
        .expect("start witchd");
    // Two sessions' time: each gets its FIFOs, if it has a place for them.
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
    let planted = plants.join().unwrap();
    unsafe { libc::kill(witchd.id() as i32, libc::SIGTERM) };
    let ended = eventually(Duration::from_secs(15), || matches!(witchd.try_wait(), Ok(Some(_))));
    if !ended {
        let _ = witchd.kill();
        let _ = witchd.wait();
    }
    let logs = format!("{}{}", std::fs::read_to_string(&log).unwrap_or_default(), read(&dir.join("witchd.err")));
    assert!(ended, "witchd did not exit within 15 s of SIGTERM (FIFOs planted in {planted:?}); log:\n{logs}");
    assert!(logs.contains("dead"), "witchd ran no session; log:\n{logs}");
    assert!(eventually(Duration::from_secs(5), || !agent_armed(target.pid())), "witchd left a session armed in the target");
    ends_as_unprofiled(target, &prog);
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// The next attach to `pid` (`witch dead` for `duration`, its profile in
/// `dir/out`) works: it is not refused as "already running". `what`
/// starts the failure's message.
fn attach_again(dir: &Scratch, pid: u32, out: &str, duration: &str, what: &str) {
    let out = dir.join(out);
    let run = attach_cmd(&witch_bin(), &[], "dead", pid, &["--duration", duration, "-q", "-o", out.to_str().unwrap()]);
    assert_eq!(run.code(), Some(0), "{what}{}", run.describe());
}

/// The target is alive and, once its input closes, ends as an unprofiled
/// run of as many rounds does: same output, same exit.
fn ends_as_unprofiled(mut target: Target, prog: &Program) {
    assert!(target.alive(), "the target died");
    let end = target.finish();
    let native = prog.run_native(&[&end.rounds.to_string()]);
    assert_eq!((native.code(), native.stdout_str()), (end.code(), end.stdout), "differs from an unprofiled run");
}

/// The process that attached (witch here; witchd does the same) stops
/// controlling the session without detaching: it is killed, and stays a
/// zombie because its parent does not reap it, the way a long-lived
/// controller that gave up would stay around. The agent must notice and
/// leave the target as it was, ready for the next attach.
#[test]
fn a_controller_that_gives_up_leaves_the_target_as_it_was() {
    let dir = Scratch::new("gives-up");
    let prog = Program::build("busy_single", dir.path());
    let mut target = Target::start(&prog.exe, &["0"], &[]);
    target.wait_ready(1, None);
    let pid = target.pid();
    let err = dir.join("witch.err");
    let mut witch: Child = Command::new(witch_bin())
        .args(["dead", "--pid", &pid.to_string(), "--duration", "60s", "-o"])
        .arg(dir.join("never.json"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(20), || read(&err).contains("attached to pid")), "witch did not attach:\n{}", read(&err));
    assert!(agent_armed(pid), "the session is not set up in the target");
    unsafe { libc::kill(witch.id() as i32, libc::SIGKILL) };
    // Not reaped yet: the controller is a zombie.
    let left = eventually(Duration::from_secs(3), || !agent_armed(pid));
    let _ = witch.wait();
    assert!(left, "3 s after its controller went away the agent is still armed in pid {pid} (threads {:?})", thread_names(pid));
    assert!(target.alive(), "the target died");
    attach_again(&dir, pid, "next.json", "300ms", "");
    ends_as_unprofiled(target, &prog);
}

/// witch killed after its call into the agent and before its settings
/// reach it (the agent's control thread exists, waiting for them). Until
/// the settings come, the agent holds the controller's end of the socket
/// too, so the stream cannot say the controller is gone: the agent watches
/// the controller's pid and leaves when it exits, ready for the next
/// attach. (Before, it waited out its 10 s for settings and refused
/// attaches as "already running" meanwhile.)
#[test]
fn a_controller_killed_before_its_settings_leaves_the_target_ready_for_the_next_attach() {
    let _one = one_at_a_time();
    let dir = Scratch::new("killed-before-settings");
    let prog = Program::build("busy_single", dir.path());
    let target = Target::start(&prog.exe, &["0"], &[]);
    target.wait_ready(1, None);
    let pid = target.pid();
    for round in 0..4 {
        let mut witch = spawn_attach(&dir, pid);
        let until = Instant::now() + Duration::from_secs(10);
        while !thread_names(pid).iter().any(|n| n == "witch-agent") && Instant::now() < until {}
        unsafe { libc::kill(witch.id() as i32, libc::SIGKILL) };
        let _ = witch.wait();
        let left = eventually(Duration::from_secs(3), || !agent_armed(pid));
        assert!(
            left,
            "round {round}: 3 s after its controller was killed the agent is still in pid {pid} (threads {:?})",
            thread_names(pid)
        );
        attach_again(&dir, pid, &format!("next{round}.json"), "200ms", &format!("round {round}: "));
    }
    ends_as_unprofiled(target, &prog);
}

/// Is any thread of `pid` blocked in (or stopped at) system call `nr`?
fn in_syscall(pid: u32, nr: u32) -> bool {
    let prefix = format!("{nr} ");
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|t| std::fs::read_to_string(t.path().join("syscall")).is_ok_and(|s| s.starts_with(&prefix)))
}

fn state(pid: u32) -> char {
    status_field(pid, "State:").chars().next().unwrap_or('?')
}

/// witch killed while the agent's entry point runs, before the agent has
/// looked for it: the agent finds its controller gone and starts nothing,
/// so the next attach works at once. Each trial catches the thread at the
/// entry point's first system call (its debug-register probe,
/// `perf_event_open`; the agent is loaded by a first attach, so later ones
/// go straight there), freezes witch (SIGSTOP) so that the thread stays
/// there, stops the target, kills and reaps witch, and lets the target go
/// on. (Before, an agent that found its controller gone watched nothing,
/// waited its 10 s for settings that could not come and refused every
/// attach meanwhile: 2 of 75 kills 40-60 ms into an attach here, and every
/// trial caught here.)
#[test]
fn a_controller_killed_as_the_agent_starts_leaves_no_session_behind() {
    let _one = one_at_a_time();
    let dir = Scratch::new("killed-as-agent-starts");
    let prog = Program::build("busy_single", dir.path());
    let target = Target::start(&prog.exe, &["0"], &[]);
    target.wait_ready(1, None);
    let pid = target.pid();
    attach_again(&dir, pid, "first.json", "200ms", "the first attach: ");
    let (mut caught, mut trials) = (0, 0);
    while caught < 8 && trials < 40 {
        trials += 1;
        let mut witch = spawn_attach(&dir, pid);
        let wid = witch.id() as i32;
        let until = Instant::now() + Duration::from_secs(10);
        let mut at_entry = false;
        while Instant::now() < until && !thread_names(pid).iter().any(|n| n == "witch-agent") {
            if in_syscall(pid, 298) {
                unsafe { libc::kill(wid, libc::SIGSTOP) };
                at_entry = eventually(Duration::from_secs(2), || state(wid as u32) == 'T') && in_syscall(pid, 298);
                break;
            }
        }
        if at_entry {
            unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
            unsafe { libc::kill(wid, libc::SIGKILL) };
            let _ = witch.wait();
            // The thread, let go, takes the stop at its next return to user mode.
            let stopped = eventually(Duration::from_secs(2), || state(pid) == 'T');
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
            caught += stopped as u32;
        } else {
            unsafe { libc::kill(wid, libc::SIGCONT) };
            unsafe { libc::kill(wid, libc::SIGKILL) };
            let _ = witch.wait();
        }
        let left = eventually(Duration::from_secs(1), || !agent_armed(pid) && !traced(pid));
        assert!(
            left,
            "trial {trials} (caught at the entry point: {at_entry}): 1 s after its controller was killed the agent is still in pid {pid} (threads {:?})",
            thread_names(pid)
        );
    }
    eprintln!("[witch-tests] {caught} of {trials} trials caught the thread at the agent's entry point");
    assert!(caught >= 3, "only {caught} of {trials} trials caught the thread at the agent's entry point");
    attach_again(&dir, pid, "next.json", "200ms", "after the trials: ");
    ends_as_unprofiled(target, &prog);
}

/// The process is stopped (SIGSTOP) while witch holds one of its threads
/// to make it call: the stop is kept (the process stays stopped, as it
/// would without witch), witch says so, and once continued the thread
/// finishes the call it was making and puts itself back, its vector
/// registers too; the next attach works. (Before, the stop was swallowed
/// and the process ran on: 4 of 4.)
#[test]
fn a_process_stopped_while_witch_attaches_stays_stopped_and_comes_back_whole() {
    let _one = one_at_a_time();
    let dir = Scratch::new("stopped-attaching");
    let prog = Program::build("vector_spin", dir.path());
    for round in 0..4 {
        let mut target = Target::start(&prog.exe, &[] as &[&str], &[]);
        target.wait_ready(1, None);
        let pid = target.pid();
        let mut witch = spawn_attach(&dir, pid);
        let until = Instant::now() + Duration::from_secs(10);
        while !traced(pid) && Instant::now() < until {}
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        let _ = witch.wait();
        assert!(
            eventually(Duration::from_secs(3), || status_field(pid, "State:").starts_with('T')),
            "round {round}: the stop was lost: state {}",
            status_field(pid, "State:")
        );
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        attach_again(&dir, pid, &format!("after-stop{round}.json"), "200ms", &format!("round {round}: "));
        assert!(target.alive(), "round {round}: the target died");
        let end = target.finish();
        assert!(end.code() == Some(0) && end.stdout.contains(" changed 0"), "round {round}: {:?} {:?}", end.code(), end.stdout);
    }
}

/// The process is stopped (SIGSTOP) during a session: at the session's end
/// witch lends the agent's thread a run to send the profile (the whole
/// session's profile is kept, no 30 s wait), the process stays stopped,
/// and once continued the agent is gone and the program ends as without
/// witch. (Before the stopped target's profile was kept, witch said "is
/// stopped" and exited 2 here.)
#[test]
fn a_process_stopped_during_a_session_keeps_its_profile_and_is_left_stopped() {
    let _one = one_at_a_time();
    let dir = Scratch::new("stopped-session");
    let prog = Program::build("vector_spin", dir.path());
    stop_during_a_session(&dir, &prog, "1", &[], &[], Duration::ZERO);
}

/// As above, with burst windows of up to 10^8 instructions at every 1 ms
/// tick, in a program that makes no system call for 100 spins (about 15
/// ms): the stop finds the thread inside witch's code (in a window,
/// running copies from its code cache, or in a handler) in most rounds. Its state and witch's
/// handlers must outlive the session until it leaves the window, once
/// continued. (When the session's end freed them at once, such a thread
/// reached its window's exit with no state to end it, and the program
/// died of SIGTRAP: one stop in about ten.)
#[test]
fn a_process_stopped_inside_a_burst_window_is_whole_once_continued() {
    let _one = one_at_a_time();
    let dir = Scratch::new("stopped-in-window");
    let prog = Program::build("vector_spin", dir.path());
    let mut inside = 0;
    for round in 0..12u64 {
        let said = stop_during_a_session(
            &dir,
            &prog,
            "100",
            &[("WITCH_WINDOW", "100000000")],
            &["--overhead", "0", "-p", "1ms"],
            Duration::from_millis(50 + 37 * round),
        );
        let profile = read(&dir.join("never.json"));
        assert!(profile.contains("\"windows\":") && !profile.contains("\"windows\":0,"), "round {round}: no window ran: {said}");
        inside += profile.contains("still inside witch's code") as u32;
    }
    // Else the rounds did not test what they are for.
    assert!(inside >= 6, "only {inside} of 12 stops found the thread inside witch's code");
}

/// Attach to `prog` (`vector_spin SPINS`; witch's extra environment `env`
/// and arguments `args`), stop it `delay` after witch says it attached, and check the
/// session ends with its profile while the process stays stopped, and that
/// once continued the agent is gone, the next attach works and the program
/// ends as without witch. Returns what witch said.
fn stop_during_a_session(dir: &Scratch, prog: &Program, spins: &str, env: &[(&str, &str)], args: &[&str], delay: Duration) -> String {
    let mut target = Target::start(&prog.exe, &[spins], &[]);
    target.wait_ready(1, None);
    let pid = target.pid();
    let err = dir.join("witch.err");
    let _ = std::fs::remove_file(dir.join("never.json"));
    let started = Instant::now();
    let mut witch = Command::new(witch_bin())
        .args(["dead", "--pid", &pid.to_string(), "--duration", "1s"])
        .args(args)
        .arg("-o")
        .arg(dir.join("never.json"))
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(20), || read(&err).contains("attached to pid")), "witch did not attach:\n{}", read(&err));
    std::thread::sleep(delay);
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    let status = witch.wait().unwrap();
    let took = started.elapsed();
    let said = read(&err);
    assert_eq!(status.code(), Some(0), "{said}");
    assert!(said.contains("profile written"), "{said}");
    assert!(std::fs::metadata(dir.join("never.json")).is_ok_and(|m| m.len() > 0), "no profile: {said}");
    assert!(took < Duration::from_secs(10), "witch took {took:?} to end the session");
    assert!(status_field(pid, "State:").starts_with('T'), "the process should stay stopped");
    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
    assert!(
        eventually(Duration::from_secs(5), || !agent_armed(pid)),
        "the agent stayed after the process was continued: threads {:?}, {} perf events, {}\nwitch said: {said}",
        thread_names(pid),
        perf_fds(pid),
        std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default()
    );
    // And the next attach works (the session's end is complete).
    attach_again(dir, pid, "again.json", "100ms", "the next attach: ");
    assert!(target.alive(), "the target died");
    let end = target.finish();
    assert!(
        end.code() == Some(0) && end.stdout.contains(" changed 0"),
        "exit {:?} signal {:?} stdout {:?} stderr {:?}\nwitch said: {said}",
        end.code(),
        end.signal(),
        end.stdout,
        end.stderr
    );
    said
}

/// Has a thread of `pid` a tracer (witch stopped it to make it call)?
fn traced(pid: u32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten().any(|t| {
        std::fs::read_to_string(t.path().join("status"))
            .is_ok_and(|s| s.lines().any(|l| l.starts_with("TracerPid:") && l.split_whitespace().nth(1).is_some_and(|v| v != "0")))
    })
}

/// `witch dead --pid PID`, its output thrown away.
fn spawn_attach(dir: &Scratch, pid: u32) -> Child {
    Command::new(witch_bin())
        .args(["dead", "--pid", &pid.to_string(), "--duration", "5s", "-q", "-o"])
        .arg(dir.join("never.json"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Kill `witch` `delay` after it has stopped a thread of `pid`; whether it
/// was seen to.
fn kill_after_it_stops(witch: &mut Child, pid: u32, delay: Duration) -> bool {
    let until = Instant::now() + Duration::from_secs(10);
    while !traced(pid) && Instant::now() < until {
        std::thread::sleep(Duration::from_micros(200));
    }
    let was_traced = traced(pid);
    std::thread::sleep(delay);
    unsafe { libc::kill(witch.id() as i32, libc::SIGKILL) };
    let _ = witch.wait();
    was_traced
}

/// `witch --pid` killed at any moment of attaching, while the target's
/// thread is stopped or running the agent's loading for it included: the
/// thread goes on as it was, its vector registers too, and the target is
/// unharmed (tests/programs/vector_spin.c keeps all sixteen AVX registers
/// live and checks them, and on an AVX-512 machine every other spin all 32
/// at full width and the mask registers). Before injected calls returned through a
/// restoring signal frame, 6 of 15 such kills left the target to a
/// segmentation fault.
#[test]
fn a_controller_killed_while_it_loads_the_agent_leaves_the_target_as_it_was() {
    let _one = one_at_a_time();
    let dir = Scratch::new("killed-attaching");
    let prog = Program::build("vector_spin", dir.path());
    let mut harmed = Vec::new();
    for i in 0..16u64 {
        let delay = Duration::from_millis(2 * i);
        let mut target = Target::start(&prog.exe, &[] as &[&str], &[]);
        target.wait_ready(1, None);
        let pid = target.pid();
        let mut witch = spawn_attach(&dir, pid);
        let was_traced = kill_after_it_stops(&mut witch, pid, delay);
        std::thread::sleep(Duration::from_millis(100));
        let alive = target.alive();
        let end = target.finish();
        if !alive || end.code() != Some(0) || !end.stdout.contains(" changed 0") {
            harmed.push(format!(
                "killed {delay:?} after it stopped the target (seen stopped: {was_traced}): alive {alive}, exit {:?}, signal {:?}, stdout {:?}",
                end.code(),
                end.signal(),
                end.stdout
            ));
        }
    }
    assert!(harmed.is_empty(), "killing witch while it attached harmed the target:\n{}", harmed.join("\n"));
}

/// As above, on a thread blocked in a system call when witch stops it: the
/// call goes on as if nothing happened (re-issued where the kernel would
/// restart it; a wait that `restart_syscall` would continue waits in full,
/// late but never early), whenever witch is killed, and a thread stopped in
/// `ppoll` with a signal mask for the wait gets its own mask back after it.
/// (Before the frame took the mask the thread has once out of its stop, 4
/// of 5 kills left it with the wait's mask.)
#[test]
fn a_controller_killed_while_it_loads_the_agent_leaves_blocking_calls_alone() {
    let _one = one_at_a_time();
    let dir = Scratch::new("killed-attaching-blocked");
    let prog = Program::build("blocking_calls", dir.path());
    let kinds = ["nanosleep", "epoll", "ppoll", "recv", "poll", "select", "accept", "sleep", "usleep", "ppoll"];
    let targets: Vec<Target> = kinds.iter().map(|k| Target::start(&prog.exe, &[*k, "5"], &[])).collect();
    for t in &targets {
        t.wait_ready(1, None);
    }
    let mut delays = Vec::new();
    for (i, t) in targets.iter().enumerate() {
        let delay = Duration::from_millis(3 * i as u64 + 1);
        let mut witch = spawn_attach(&dir, t.pid());
        delays.push((delay, kill_after_it_stops(&mut witch, t.pid(), delay)));
    }
    let mut harmed = Vec::new();
    for ((t, k), (delay, was_traced)) in targets.into_iter().zip(kinds).zip(delays) {
        let end = t.finish();
        let native = prog.run_native(&[k, "1"]);
        if (end.code(), end.stdout.as_str()) != (native.code(), native.stdout_str().as_str()) {
            harmed.push(format!(
                "{k}: killed {delay:?} after it stopped the target (seen stopped: {was_traced}): exit {:?}, signal {:?}, stdout {:?} (unprofiled: {:?})",
                end.code(),
                end.signal(),
                end.stdout,
                native.stdout_str()
            ));
        }
    }
    assert!(harmed.is_empty(), "killing witch while it attached disturbed blocked calls:\n{}", harmed.join("\n"));
}
