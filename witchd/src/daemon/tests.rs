//! The daemon end to end in-process, with a fake attacher: duty cycles, one
//! session per process, a target exiting mid-session, the API, /metrics,
//! pprof, store limits and shutdown. (tests/tests/daemon.rs does the same
//! with real attaches.)

use super::config::DaemonConfig;
use super::proto::Request;
use super::session::Attacher;
use super::*;
use crate::inject::{Attached, Ended, Options, SessionFacts};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use witchcraft::profile::Profile;

#[derive(Default)]
struct FakeAttacher {
    /// Sessions open per pid right now, and the most ever seen at once.
    open: Mutex<HashMap<i32, usize>>,
    max_overlap: AtomicUsize,
    /// Sessions open over all pids right now, and the most ever seen at once.
    open_total: AtomicUsize,
    max_open_total: AtomicUsize,
    attached: AtomicUsize,
    detached: AtomicUsize,
    /// Padding so profiles have a known, sizeable size.
    pad: usize,
}

struct FakeSession {
    pid: i32,
    craft: witchcraft::profile::Craft,
    fake: Arc<FakeAttacher>,
    start_ns: u64,
    /// The image the "agent" went into: an exec takes it away, as it does a real one.
    image: Option<procfs::Image>,
}

impl Attacher for Arc<FakeAttacher> {
    fn attach(&self, pid: i32, opts: &Options) -> anyhow::Result<Box<dyn Attached>> {
        // SAFETY: kill with signal 0 only checks that the pid exists.
        if unsafe { libc::kill(pid, 0) } != 0 {
            anyhow::bail!("no such process");
        }
        let mut open = self.open.lock().unwrap();
        let n = open.entry(pid).or_insert(0);
        *n += 1;
        self.max_overlap.fetch_max(*n, Ordering::SeqCst);
        let total = self.open_total.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_open_total.fetch_max(total, Ordering::SeqCst);
        self.attached.fetch_add(1, Ordering::SeqCst);
        Ok(Box::new(FakeSession { pid, craft: opts.craft, fake: self.clone(), start_ns: store::now_ns(), image: procfs::Image::of(pid) }))
    }
}

fn alive(pid: i32) -> bool {
    procfs::Proc::read(pid).is_some_and(|p| !p.is_zombie())
}

impl SessionFacts for FakeSession {
    fn target_alive(&self) -> bool {
        alive(self.pid)
    }
    fn exec_seen(&self) -> bool {
        procfs::Image::changed(self.pid, self.image)
    }
    fn agent_ended(&self) -> bool {
        false
    }
    /// No socket: the new image shows the exec.
    fn agent_closed(&self) -> bool {
        false
    }
    fn agent_gone(&self) -> bool {
        procfs::Image::of(self.pid) != self.image
    }
}

impl Attached for FakeSession {
    fn pid(&self) -> i32 {
        self.pid
    }
    fn image(&self) -> Option<procfs::Image> {
        self.image
    }
    fn start_time(&self) -> Option<u64> {
        None
    }
    fn detach(self: Box<Self>, _timeout: Duration) -> anyhow::Result<Ended> {
        *self.fake.open.lock().unwrap().get_mut(&self.pid).unwrap() -= 1;
        self.fake.open_total.fetch_sub(1, Ordering::SeqCst);
        self.fake.detached.fetch_add(1, Ordering::SeqCst);
        if !alive(self.pid) {
            return Ok(Ended { profile: None, target_exited: true });
        }
        if self.agent_gone() {
            // Its socket closed with the old image: no profile, no exit.
            return Ok(Ended { profile: None, target_exited: false });
        }
        let mut p = store::tests_support::profile(self.pid as u32, self.start_ns / 1_000_000, self.fake.pad);
        p.craft = self.craft;
        p.program = format!("/bin/sleep-{}", self.pid);
        p.duration_ns = store::now_ns() - self.start_ns;
        Ok(Ended { profile: Some(p), target_exited: false })
    }
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("witchd-daemon-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn sleeper() -> Child {
    Command::new("sleep").arg("60").spawn().unwrap()
}

fn http_get(addr: &str, path: &str) -> (u16, Vec<u8>) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut b = Vec::new();
    s.read_to_end(&mut b).unwrap();
    let end = b.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&b[..end]).to_string();
    let code = head.split(' ').nth(1).unwrap().parse().unwrap();
    assert!(!head.to_ascii_lowercase().contains("chunked"), "{head}");
    (code, b[end + 4..].to_vec())
}

#[test]
fn daemon_with_a_fake_attacher() {
    let dir = tmpdir("fake");
    let (mut a, mut b) = (sleeper(), sleeper());
    let sock = dir.join("w.sock");
    let max_bytes = 20_000;
    let cfg = DaemonConfig::parse(
        &format!(
            r#"
socket = "{}"
http = "127.0.0.1:0"
scan_every = "100ms"
[store]
dir = "{}"
max_bytes = {max_bytes}
[defaults]
every = "300ms"
duration = "150ms"
crafts = ["dead", "silent-store"]
[[watch]]
pid = {}
[[watch]]
pid = {}
"#,
            sock.display(),
            dir.join("store").display(),
            a.id(),
            b.id()
        ),
        "test.toml",
    )
    .unwrap();
    let fake = Arc::new(FakeAttacher { pad: 3000, ..Default::default() });
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let f2 = fake.clone();
    let daemon = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(serve(cfg, Arc::new(f2), async move {
            let _ = stop_rx.await;
            "test stop"
        }))
    });
    let call = |req: &Request| crate::cmd::daemon::call(&sock, req, Duration::from_secs(20));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while call(&Request::Status).is_err() {
        assert!(std::time::Instant::now() < deadline, "daemon did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let dir_bytes = || -> u64 {
        // Files may go between listing and stat: evictions run concurrently.
        std::fs::read_dir(dir.join("store")).unwrap().filter_map(|e| Some(e.ok()?.metadata().ok()?.len())).sum()
    };
    for _ in 0..15 {
        std::thread::sleep(Duration::from_millis(100));
        assert!(dir_bytes() <= max_bytes, "store over its limit");
    }

    // b exits during a session: recorded as such, once, and b is forgotten.
    loop {
        let st = call(&Request::Status).unwrap().0.status.unwrap();
        if st.targets.iter().any(|t| t.pid as u32 == b.id() && t.state.starts_with("profiling")) {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    b.kill().unwrap();
    b.wait().unwrap();
    std::thread::sleep(Duration::from_millis(700));

    let (r, _) = call(&Request::Status).unwrap();
    let st = r.status.unwrap();
    assert_eq!(st.targets.iter().map(|t| t.pid as u32).collect::<Vec<_>>(), vec![a.id()], "b forgotten: {st:?}");
    assert!(st.sessions_ok >= 4, "{st:?}");
    assert_eq!(st.sessions_failed, 0, "{st:?}");
    assert!(st.targets[0].waste.len() == 2, "both crafts took turns: {st:?}");

    let (r, _) = call(&Request::List { pid: Some(a.id()), craft: None }).unwrap();
    let list = r.profiles.unwrap();
    assert!(!list.is_empty());
    let (r, body) = call(&Request::Fetch { id: Some(list[0].id.clone()), pid: None, craft: None }).unwrap();
    let p = Profile::from_bytes(&body).unwrap();
    assert_eq!((p.pid, r.meta.unwrap().id), (a.id(), list[0].id.clone()));
    assert!(call(&Request::Fetch { id: Some("../../etc/passwd".into()), pid: None, craft: None }).is_err());
    assert!(call(&Request::List { pid: None, craft: Some("nope".into()) }).is_err());

    // An immediate session, never overlapping a scheduled one.
    let (r, body) = call(&Request::Profile { pid: a.id() as i32, craft: Some("silent-load".into()), duration_ms: Some(100) }).unwrap();
    let p = Profile::from_bytes(&body).unwrap();
    assert_eq!((p.pid, p.craft.name()), (a.id(), "silent-load"));
    assert_eq!(r.meta.unwrap().origin, "request");
    assert!(call(&Request::Profile { pid: 0x3fff_fff0, craft: None, duration_ms: None }).is_err());

    // HTTP: metrics and pprof.
    let addr = st.http.unwrap();
    let (code, m) = http_get(&addr, "/metrics");
    let m = String::from_utf8(m).unwrap();
    assert_eq!(code, 200);
    // Series by executable and slot; the pid is in the info metric.
    let info = m.lines().find(|l| l.starts_with("witchd_target_info{") && l.contains(&format!("pid=\"{}\"", a.id()))).expect("a's info");
    let slot = info.split("slot=\"").nth(1).and_then(|r| r.split('"').next()).unwrap();
    assert!(m.contains(&format!("witchd_waste_fraction{{exe=\"sleep\",slot=\"{slot}\",craft=\"dead\"}} 0.75")), "{m}");
    assert!(!m.contains(&format!("pid=\"{}\"", b.id())), "forgotten target still in metrics:\n{m}");
    assert!(!m.lines().any(|l| l.starts_with("witchd_waste_fraction") && l.contains("pid=")), "no pid label on series:\n{m}");
    assert!(m.contains("witchd_sessions_total{outcome=\"target_exited\"} 1\n"), "{m}");
    let (code, gz) = http_get(&addr, &format!("/pprof/latest?pid={}&craft=dead", a.id()));
    assert_eq!(code, 200);
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut raw).unwrap();
    let pp = <crate::render::pprof::PprofProfile as prost::Message>::decode(&raw[..]).unwrap();
    assert!(!pp.sample.is_empty());
    assert_eq!(http_get(&addr, "/pprof/latest?pid=1&craft=dead").0, 404);
    assert_eq!(http_get(&addr, "/pprof/nope").0, 404);
    assert_eq!(http_get(&addr, "/pprof/latest?craft=bogus").0, 400);
    // A bad or misspelt parameter: a line that names it, not the framework's error.
    for (q, want) in [("pid=abc", "pid=\"abc\" is not a process id"), ("pid=-1", "is not a process id"), ("pdi=5", "does not know")] {
        let (code, body) = http_get(&addr, &format!("/pprof/latest?{q}"));
        let body = String::from_utf8_lossy(&body);
        assert_eq!(code, 400, "{q}: {body}");
        assert!(body.contains(want) && body.contains("pid=PID") && !body.contains("deserialize"), "{q}: {body}");
    }

    stop_tx.send(()).unwrap();
    daemon.join().unwrap().unwrap();
    assert_eq!(fake.attached.load(Ordering::SeqCst), fake.detached.load(Ordering::SeqCst), "every attach detached");
    assert_eq!(fake.max_overlap.load(Ordering::SeqCst), 1, "two sessions on one process");
    assert!(!sock.exists(), "socket removed at exit");
    assert!(dir_bytes() <= max_bytes);
    let _ = a.kill();
    let _ = a.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A daemon serving `cfg` on its own thread, with a fake attacher, until the sender is used.
struct Running {
    sock: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl Running {
    fn start(cfg: DaemonConfig) -> Running {
        Self::start_with(cfg, Arc::new(FakeAttacher::default()))
    }

    fn start_with(cfg: DaemonConfig, fake: Arc<FakeAttacher>) -> Running {
        let sock = cfg.socket.clone();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(serve(cfg, Arc::new(fake), async move {
                let _ = stop_rx.await;
                "test stop"
            }))
        });
        let r = Running { sock, stop: Some(stop_tx), thread: Some(thread) };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while r.call(&Request::Status).is_err() {
            assert!(std::time::Instant::now() < deadline, "daemon did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        r
    }

    fn call(&self, req: &Request) -> anyhow::Result<(super::proto::Reply, Vec<u8>)> {
        crate::cmd::daemon::call(&self.sock, req, Duration::from_secs(20))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        // A failed test may have left the daemon stuck: let it go rather than hang.
        if let Some(t) = self.thread.take().filter(|_| !std::thread::panicking()) {
            let _ = t.join();
        }
    }
}

/// Runs `f` on a thread; None if it has not returned within `limit`.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}

/// A stored profile whose module files are a FIFO and /dev/zero (as the
/// target's owner can make them after the profile was stored): the
/// unauthenticated pprof export must answer, not hang on the FIFO or read
/// /dev/zero without end.
#[test]
fn pprof_export_of_a_profile_naming_a_fifo_or_dev_zero_answers() {
    let dir = tmpdir("fifo-module");
    let fifo = dir.join("libevil.so");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let store_cfg =
        super::config::StoreConfig { dir: dir.join("store"), max_bytes: 1 << 20, max_profiles: 10, max_age: Duration::from_secs(3600) };
    let id = {
        let (mut st, _) = store::Store::open(&store_cfg).unwrap();
        let mut p = store::tests_support::profile(4242, 1000, 0);
        let module = |path: &str, start: u64| witchcraft::profile::Module {
            path: path.into(),
            build_id: None,
            start,
            end: start + 0x10000,
            bias: start,
        };
        p.modules = vec![module(fifo.to_str().unwrap(), 0x400000), module("/dev/zero", 0x800000)];
        let t = &mut p.threads[0];
        t.nodes.push(witchcraft::profile::Node { parent: 0, pc: 0x401000, samples: 1 });
        t.nodes.push(witchcraft::profile::Node { parent: 1, pc: 0x801000, samples: 1 });
        t.pairs[0].watch = 2;
        t.pairs[0].trap = 1;
        st.put(&p, store::Meta::new(&p, None, false, "schedule")).unwrap().id
    };
    let cfg = DaemonConfig::parse(
        &format!("socket = \"{}\"\nhttp = \"127.0.0.1:0\"\n[store]\ndir = \"{}\"\n", dir.join("w.sock").display(), store_cfg.dir.display()),
        "test.toml",
    )
    .unwrap();
    let d = Running::start(cfg);
    let addr = d.call(&Request::Status).unwrap().0.status.unwrap().http.unwrap();
    let got = within(Duration::from_secs(60), move || http_get(&addr, &format!("/pprof/{id}")));
    let (code, gz) = got.expect("GET /pprof/ID did not answer within 60 s");
    assert_eq!(code, 200);
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut raw).unwrap();
    let pp = <crate::render::pprof::PprofProfile as prost::Message>::decode(&raw[..]).unwrap();
    assert!(!pp.sample.is_empty());
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

/// 200 idle connections from one user (nobody) leave the API answering
/// everyone else; they were enough to make it answer "busy" to all.
#[test]
fn idle_connections_of_one_user_do_not_shut_out_the_others() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("not root: cannot connect as another user; skipping");
        return;
    }
    let dir = tmpdir("idle");
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let sock = dir.join("w.sock");
    let cfg = DaemonConfig::parse(
        &format!(
            "socket = \"{}\"\nsocket_mode = 0o666\nhttp = \"off\"\n[store]\ndir = \"{}\"\n",
            sock.display(),
            dir.join("store").display()
        ),
        "test.toml",
    )
    .unwrap();
    let d = Running::start(cfg);
    // A child that becomes nobody, opens 200 connections and sends nothing.
    let path = std::ffi::CString::new(sock.to_str().unwrap()).unwrap();
    // SAFETY: the child only makes system calls (async-signal-safe) before it is killed.
    let child = unsafe { libc::fork() };
    if child == 0 {
        // SAFETY: in the forked child, which only calls async-signal-safe functions before exiting.
        unsafe {
            libc::setgroups(0, std::ptr::null());
            libc::setgid(65534);
            libc::setuid(65534);
            let mut addr: libc::sockaddr_un = std::mem::zeroed();
            addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
            for (i, b) in path.as_bytes().iter().enumerate() {
                addr.sun_path[i] = *b as libc::c_char;
            }
            for _ in 0..200 {
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                libc::connect(fd, &addr as *const _ as *const libc::sockaddr, std::mem::size_of::<libc::sockaddr_un>() as u32);
            }
            libc::pause();
            libc::_exit(0);
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let r = d.call(&Request::Status);
    // SAFETY: plain system calls on our own pid and descriptors.
    unsafe {
        libc::kill(child, libc::SIGKILL);
        libc::waitpid(child, std::ptr::null_mut(), 0);
    }
    let (reply, _) = r.expect("root's request is answered while nobody holds 200 idle connections");
    assert!(reply.ok && reply.status.is_some());
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Three targets due at once with `max_sessions = 1`: one session runs and
/// the others wait for its slot. Status showed all three as "profiling" and
/// `sessions_active` (and `witchd_sessions_active`) counted all three: it
/// counted every claimed session, waiting or not.
#[test]
fn sessions_waiting_for_a_slot_are_queued_not_profiling() {
    let dir = tmpdir("queued");
    let mut kids = [sleeper(), sleeper(), sleeper()];
    let rules: String = kids.iter().map(|k| format!("[[watch]]\npid = {}\n", k.id())).collect();
    let cfg = DaemonConfig::parse(
        &format!(
            "socket = \"{}\"\nhttp = \"127.0.0.1:0\"\nscan_every = \"100ms\"\nmax_sessions = 1\n[store]\ndir = \"{}\"\n\
             [defaults]\nevery = \"200ms\"\nduration = \"150ms\"\ncrafts = [\"dead\"]\n{rules}",
            dir.join("w.sock").display(),
            dir.join("store").display()
        ),
        "test.toml",
    )
    .unwrap();
    let fake = Arc::new(FakeAttacher::default());
    let d = Running::start_with(cfg, fake.clone());
    let addr = d.call(&Request::Status).unwrap().0.status.unwrap().http.unwrap();
    let (mut queued_seen, mut waiting_seen, mut ok) = (0, 0, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while (queued_seen < 3 || ok < 6) && std::time::Instant::now() < deadline {
        let st = d.call(&Request::Status).unwrap().0.status.unwrap();
        let profiling: Vec<_> = st.targets.iter().filter(|t| t.state.starts_with("profiling")).collect();
        let queued = st.targets.iter().filter(|t| t.state.starts_with("queued")).count();
        assert!(profiling.len() <= 1, "more targets shown profiling than max_sessions (1): {:?}", st.targets);
        assert!(st.sessions_active <= 1, "sessions_active {} > max_sessions (1): {:?}", st.sessions_active, st.targets);
        assert!(st.targets.iter().all(|t| ["idle", "queued dead", "profiling dead"].contains(&t.state.as_str())), "{:?}", st.targets);
        assert_eq!(st.sessions_waiting, queued, "queued targets and the waiting count agree: {st:?}");
        assert_eq!(st.max_sessions, 1);
        queued_seen += usize::from(queued > 0);
        waiting_seen += usize::from(st.sessions_waiting > 0);
        ok = st.sessions_ok;
        let (_, m) = http_get(&addr, "/metrics");
        let m = String::from_utf8(m).unwrap();
        let gauge = |name: &str| -> f64 {
            let line = m.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("no {name}:\n{m}"));
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        assert!(gauge("witchd_sessions_active") <= 1.0, "witchd_sessions_active > max_sessions (1):\n{m}");
        assert!(gauge("witchd_sessions_waiting") <= 2.0, "{m}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(queued_seen >= 3 && waiting_seen >= 3, "no session seen waiting for the slot ({queued_seen} times)");
    assert!(ok >= 6, "only {ok} sessions in 20 s");
    drop(d);
    assert_eq!(fake.max_open_total.load(Ordering::SeqCst), 1, "more sessions at once than max_sessions");
    for k in &mut kids {
        let _ = k.kill();
        let _ = k.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A target that replaces its program (exec) during a session: same pid, a
/// new image, and the agent gone with the old one. The session ends then (not
/// at its end), as `target_exec`, not as an exit or a failure; the process is
/// not marked exited, and it is profiled again as a fresh target.
#[test]
fn a_target_that_execs_during_a_session_is_not_taken_for_exited() {
    let dir = tmpdir("exec");
    let mut kid = Command::new("sh").args(["-c", "read line; exec sleep 60"]).stdin(std::process::Stdio::piped()).spawn().unwrap();
    let pid = kid.id() as i32;
    let cfg = DaemonConfig::parse(
        &format!(
            "socket = \"{}\"\nhttp = \"off\"\nscan_every = \"100ms\"\n[store]\ndir = \"{}\"\n\
             [defaults]\nevery = \"6s\"\nduration = \"5s\"\ncrafts = [\"dead\"]\n[[watch]]\npid = {pid}\n",
            dir.join("w.sock").display(),
            dir.join("store").display()
        ),
        "test.toml",
    )
    .unwrap();
    let d = Running::start(cfg);
    let status = || d.call(&Request::Status).unwrap().0.status.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !status().targets.iter().any(|t| t.state == "profiling dead") {
        assert!(std::time::Instant::now() < deadline, "no session started: {:?}", status());
        std::thread::sleep(Duration::from_millis(10));
    }
    let exec_at = std::time::Instant::now();
    kid.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let st = loop {
        let st = status();
        if st.sessions_target_exec + st.sessions_target_exited + st.sessions_failed + st.sessions_ok > 0 {
            break st;
        }
        assert!(exec_at.elapsed() < Duration::from_secs(10), "the session did not end: {st:?}");
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = exec_at.elapsed();
    assert_eq!(
        (st.sessions_target_exec, st.sessions_target_exited, st.sessions_failed, st.sessions_ok),
        (1, 0, 0, 0),
        "an exec is its own outcome: {st:?}"
    );
    assert!(took < Duration::from_secs(3), "the session waited out its 5 s after the exec ({took:?})");
    let t = st.targets.iter().find(|t| t.pid == pid).unwrap_or_else(|| panic!("the process is still watched: {st:?}"));
    assert_ne!(t.state, "exited", "{st:?}");
    assert_eq!(t.last_error, None, "{st:?}");
    // Profiled again: the new program, same pid.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let list = loop {
        let (r, _) = d.call(&Request::List { pid: Some(pid as u32), craft: None }).unwrap();
        let list = r.profiles.unwrap();
        if !list.is_empty() {
            break list;
        }
        assert!(std::time::Instant::now() < deadline, "not profiled again: {:?}", status());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(list[0].pid, pid as u32);
    let st = status();
    assert_eq!((st.sessions_target_exec, st.sessions_target_exited, st.sessions_failed), (1, 0, 0), "{st:?}");
    drop(d);
    let _ = kid.kill();
    let _ = kid.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A daemon with HTTP on an ephemeral port and nothing to watch; its HTTP address.
fn http_daemon(tag: &str, extra: &str) -> (PathBuf, Running, String) {
    let dir = tmpdir(tag);
    let cfg = DaemonConfig::parse(
        &format!(
            "socket = \"{}\"\nhttp = \"127.0.0.1:0\"\n{extra}\n[store]\ndir = \"{}\"\n",
            dir.join("w.sock").display(),
            dir.join("store").display()
        ),
        "test.toml",
    )
    .unwrap();
    let d = Running::start(cfg);
    let addr = d.call(&Request::Status).unwrap().0.status.unwrap().http.unwrap();
    (dir, d, addr)
}

/// Forks a child that becomes nobody and runs `f` (system calls only: the
/// parent is multi-threaded), exiting with what it returns.
fn as_nobody(f: impl FnOnce() -> i32) -> libc::pid_t {
    // SAFETY: the child only makes system calls before it exits.
    let child = unsafe { libc::fork() };
    if child == 0 {
        // SAFETY: in the forked child, which only calls async-signal-safe functions before exiting.
        unsafe {
            if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                libc::_exit(99);
            }
            libc::_exit(f());
        }
    }
    child
}

/// A TCP connection to `addr` made with system calls only (for [`as_nobody`]).
unsafe fn raw_connect(addr: &libc::sockaddr_in) -> i32 {
    let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
    if libc::connect(fd, (addr as *const libc::sockaddr_in).cast(), std::mem::size_of::<libc::sockaddr_in>() as u32) != 0 {
        return -1;
    }
    fd
}

fn sockaddr(addr: &str) -> libc::sockaddr_in {
    let a: std::net::SocketAddrV4 = addr.parse().unwrap();
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
        sin_zero: [0; 8],
    }
}

/// `GET path` as nobody: the status code and body.
fn http_get_as_nobody(addr: &str, path: &str) -> (u16, Vec<u8>) {
    let sa = sockaddr(addr);
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").into_bytes();
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let mut buf = vec![0u8; 1 << 16];
    let (b, len) = (buf.as_mut_ptr(), buf.len());
    // SAFETY: the child only makes system calls on memory it owns.
    let child = as_nobody(|| unsafe {
        libc::close(fds[0]);
        let fd = raw_connect(&sa);
        if fd < 0 || libc::write(fd, req.as_ptr().cast(), req.len()) != req.len() as isize {
            return 98;
        }
        loop {
            let n = libc::read(fd, b.cast(), len);
            if n <= 0 {
                return 0;
            }
            libc::write(fds[1], b.cast(), n as usize);
        }
    });
    // SAFETY: our write end, closed once.
    unsafe { libc::close(fds[1]) };
    let mut got = Vec::new();
    // SAFETY: the read end is ours alone, owned by the File from here.
    unsafe { std::fs::File::from_raw_fd(fds[0]) }.read_to_end(&mut got).unwrap();
    let mut st = 0;
    // SAFETY: `st` is a valid status word for our own child.
    unsafe { libc::waitpid(child, &mut st, 0) };
    assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0, "nobody's request failed ({st:#x})");
    let end = got.windows(4).position(|w| w == b"\r\n\r\n").expect("an HTTP answer");
    let head = String::from_utf8_lossy(&got[..end]).to_string();
    (head.split(' ').nth(1).unwrap().parse().unwrap(), got[end + 4..].to_vec())
}

/// GET `path` with a given `Host`.
fn http_get_host(addr: &str, path: &str, host: &str) -> u16 {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").unwrap();
    let mut b = Vec::new();
    s.read_to_end(&mut b).unwrap();
    String::from_utf8_lossy(&b).split(' ').nth(1).unwrap().parse().unwrap()
}

/// witchd's HTTP port fell to 70 idle connections from any local user: 64
/// were served at once and each lived 30 s, so `/metrics` timed out for
/// everyone (and reconnecting every 30 s kept it so). Now one user holds at
/// most 8 (root excepted), and a connection that sends no request is
/// closed after 5 s.
#[test]
fn http_survives_idle_connections_from_one_user() {
    let (dir, d, addr) = http_daemon("http-idle", "");
    if nix::unistd::geteuid().is_root() {
        // nobody opens 70 connections, sends nothing, and opens them again as they close.
        let sa = sockaddr(&addr);
        // SAFETY: the child only makes system calls on memory it owns.
        let crowd = as_nobody(|| unsafe {
            let mut fds = [-1i32; 70];
            loop {
                for fd in fds.iter_mut() {
                    let mut c = 0u8;
                    if *fd < 0 || libc::recv(*fd, (&mut c as *mut u8).cast(), 1, libc::MSG_DONTWAIT) == 0 {
                        if *fd >= 0 {
                            libc::close(*fd);
                        }
                        *fd = raw_connect(&sa);
                    }
                }
                libc::usleep(100_000);
            }
        });
        std::thread::sleep(Duration::from_millis(1500));
        let a2 = addr.clone();
        let got = within(Duration::from_secs(3), move || (0..3).map(|_| http_get(&a2, "/metrics").0).collect::<Vec<_>>());
        // SAFETY: plain system calls on our own children.
        unsafe {
            libc::kill(crowd, libc::SIGKILL);
            libc::waitpid(crowd, std::ptr::null_mut(), 0);
        }
        assert_eq!(got, Some(vec![200, 200, 200]), "/metrics did not answer root within 3 s while nobody crowded the port");
    } else {
        eprintln!("not root: cannot connect as another user; the crowd is not tried");
    }
    // Idle: closed within the idle timeout, not at the end of its 30 s.
    let t0 = std::time::Instant::now();
    let mut idle = std::net::TcpStream::connect(&addr).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut b = Vec::new();
    let _ = idle.read_to_end(&mut b);
    let took = t0.elapsed();
    assert!(took < http::IDLE_TIMEOUT + Duration::from_secs(2), "an idle connection lived {took:?}");
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

/// HTTP answered any `Host:` (a page in a local browser could read it
/// through DNS rebinding): now only this host's names.
#[test]
fn http_answers_only_requests_for_this_host() {
    let (dir, d, addr) = http_daemon("http-host", "http_hosts = [\"metrics.example.org\"]");
    let port = addr.rsplit(':').next().unwrap();
    for (host, want) in [
        (format!("localhost:{port}"), 200),
        (addr.clone(), 200),
        ("localhost".into(), 200),
        (format!("metrics.example.org:{port}"), 200),
        (format!("rebind.attacker.example:{port}"), 421),
        ("rebind.attacker.example".into(), 421),
        ("localhost:1".into(), 421),
    ] {
        assert_eq!(http_get_host(&addr, "/metrics", &host), want, "Host: {host}");
    }
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

/// HTTP gave any local user root's stored profiles, which the Unix socket
/// refuses them. By default (`http_profiles = "owner"`) a user now reads
/// only their own processes' profiles over HTTP, root all of them; "none"
/// serves none.
#[test]
fn http_serves_profiles_only_as_configured() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("not root: cannot connect as another user; skipping");
        return;
    }
    let dir = tmpdir("http-profiles");
    let store_cfg =
        super::config::StoreConfig { dir: dir.join("store"), max_bytes: 1 << 20, max_profiles: 10, max_age: Duration::from_secs(3600) };
    let (roots, nobodys) = {
        let (mut st, _) = store::Store::open(&store_cfg).unwrap();
        let p = store::tests_support::profile(4242, 1000, 0);
        let r = st.put(&p, store::Meta::new(&p, None, false, "schedule")).unwrap().id;
        let p = store::tests_support::profile(4343, 2000, 0);
        let n = st.put(&p, store::Meta::new(&p, Some((65534, 65534)), false, "schedule")).unwrap().id;
        (r, n)
    };
    for (access, nobody_sees) in [("", Some(&nobodys)), ("http_profiles = \"none\"", None)] {
        let cfg = DaemonConfig::parse(
            &format!(
                "socket = \"{}\"\nhttp = \"127.0.0.1:0\"\n{access}\n[store]\ndir = \"{}\"\n",
                dir.join("w.sock").display(),
                store_cfg.dir.display()
            ),
            "test.toml",
        )
        .unwrap();
        let d = Running::start(cfg);
        let addr = d.call(&Request::Status).unwrap().0.status.unwrap().http.unwrap();
        let listed = |(code, body): (u16, Vec<u8>)| -> Option<Vec<String>> {
            (code == 200).then(|| {
                let v: Vec<store::Meta> = serde_json::from_slice(&body).unwrap();
                v.into_iter().map(|m| m.id).collect()
            })
        };
        let root_list = listed(http_get(&addr, "/profiles"));
        let nobody_list = listed(http_get_as_nobody(&addr, "/profiles"));
        match nobody_sees {
            Some(own) => {
                assert_eq!(root_list, Some(vec![roots.clone(), nobodys.clone()]), "root lists every profile");
                assert_eq!(nobody_list, Some(vec![own.clone()]), "nobody lists only its own");
                assert_eq!(http_get_as_nobody(&addr, &format!("/pprof/{roots}")).0, 404, "nobody read root's profile");
                assert_eq!(http_get_as_nobody(&addr, &format!("/pprof/{nobodys}")).0, 200);
                assert_eq!(http_get_as_nobody(&addr, "/pprof/latest?pid=4242").0, 404);
                assert_eq!(http_get_as_nobody(&addr, "/pprof/latest").0, 200);
                assert_eq!(http_get(&addr, &format!("/pprof/{roots}")).0, 200);
            }
            None => {
                assert_eq!((root_list, nobody_list), (None, None));
                assert_eq!(http_get(&addr, &format!("/pprof/{roots}")).0, 403);
                assert_eq!(http_get(&addr, "/metrics").0, 200, "metrics are served whatever http_profiles says");
            }
        }
        drop(d);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Six `witch daemon profile --duration 5s` requests from one user held
/// both session slots (`max_sessions = 2`), and the process a rule watches
/// stayed queued all along. Now a user has at most `max_user_sessions` (2)
/// requests in flight, the rest refused at once, and requests never hold
/// the rules' last slot: the watched process is profiled on schedule
/// meanwhile.
#[test]
fn one_user_cannot_starve_the_daemon() {
    let dir = tmpdir("starve");
    let mut watched = sleeper();
    let mut own: Vec<Child> = (0..6).map(|_| sleeper()).collect();
    let cfg = DaemonConfig::parse(
        &format!(
            "socket = \"{}\"\nhttp = \"off\"\nscan_every = \"100ms\"\nmax_sessions = 2\nmax_request_duration = \"1m\"\n[store]\ndir = \"{}\"\n\
             [defaults]\nevery = \"400ms\"\nduration = \"200ms\"\ncrafts = [\"dead\"]\n[[watch]]\npid = {}\n",
            dir.join("w.sock").display(),
            dir.join("store").display(),
            watched.id()
        ),
        "test.toml",
    )
    .unwrap();
    let fake = Arc::new(FakeAttacher::default());
    let d = Arc::new(Running::start_with(cfg, fake.clone()));
    let requests: Vec<_> = own
        .iter()
        .map(|c| {
            let (d, pid) = (d.clone(), c.id() as i32);
            std::thread::spawn(move || {
                d.call(&Request::Profile { pid, craft: None, duration_ms: Some(5000) }).map(|_| ()).map_err(|e| e.to_string())
            })
        })
        .collect();
    let t0 = std::time::Instant::now();
    let mut scheduled_ok = 0;
    while t0.elapsed() < Duration::from_secs(3) {
        let st = d.call(&Request::Status).unwrap().0.status.unwrap();
        // No request ends within its 5 s: every session ended so far is the rule's.
        scheduled_ok = st.sessions_ok;
        if scheduled_ok >= 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let answers: Vec<Result<(), String>> = requests.into_iter().map(|t| t.join().unwrap()).collect();
    let refused = answers.iter().filter(|a| a.as_ref().is_err_and(|e| e.contains("max_user_sessions"))).count();
    let served = answers.iter().filter(|a| a.is_ok()).count();
    assert!(scheduled_ok >= 2, "the watched process was not profiled while one user's requests ran ({scheduled_ok} sessions in 3 s)");
    assert_eq!((served, refused), (2, 4), "two requests in flight for one user, the others refused: {answers:?}");
    drop(Arc::try_unwrap(d).ok().expect("the request threads are done"));
    assert!(fake.max_open_total.load(Ordering::SeqCst) <= 2, "more sessions at once than max_sessions");
    for k in own.iter_mut().chain([&mut watched]) {
        let _ = k.kill();
        let _ = k.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
