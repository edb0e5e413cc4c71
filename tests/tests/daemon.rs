//! witchd end to end: a short duty cycle over two running programs, the
//! bounded store, the local API with its caller checks, /metrics and pprof
//! over HTTP, SIGTERM leaving the targets as they were, and a restart that
//! re-indexes the store.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use witch_tests::attach::{Finished, Target};
use witch_tests::*;

/// A witchd process, killed if the test ends early.
struct Witchd {
    child: Option<Child>,
    log: PathBuf,
}

impl Witchd {
    fn start(config: &Path, log: &Path) -> Witchd {
        let f = std::fs::File::create(log).unwrap();
        let child = Command::new(witchd_bin())
            .arg("--config")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .expect("start witchd");
        Witchd { child: Some(child), log: log.to_path_buf() }
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Still running?
    fn running(&mut self) -> bool {
        matches!(self.child.as_mut().unwrap().try_wait(), Ok(None))
    }

    /// SIGTERM, and wait (at most `limit`) for it to exit.
    fn term(&mut self, limit: Duration) -> (ExitStatus, Duration) {
        self.stop_with(libc::SIGTERM, limit)
    }

    /// Send `sig`, and wait (at most `limit`) for it to exit.
    fn stop_with(&mut self, sig: i32, limit: Duration) -> (ExitStatus, Duration) {
        let start = Instant::now();
        unsafe { libc::kill(self.pid(), sig) };
        let mut child = self.child.take().unwrap();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return (st, start.elapsed());
            }
            if start.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                panic!("witchd did not exit within {limit:?} of SIGTERM; log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Witchd {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            eprintln!("[witch-tests] witchd log:\n{}", self.log());
        }
    }
}

/// `witch daemon --socket S ARGS...`, optionally under a wrapper (setpriv).
fn client(witch: &Path, wrapper: &[String], socket: &Path, args: &[&str]) -> Run {
    let mut cmd = match wrapper.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(witch);
            c
        }
        None => Command::new(witch),
    };
    cmd.arg("daemon").arg("--socket").arg(socket).args(args);
    run_cmd(cmd, None)
}

fn json(r: &Run) -> serde_json::Value {
    assert!(r.status.success(), "{}", r.describe());
    serde_json::from_slice(&r.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", r.describe()))
}

/// Waits for `what` to hold, polling; panics with `why()` after `limit`.
fn wait_for(limit: Duration, mut what: impl FnMut() -> bool, why: impl Fn() -> String) {
    let start = Instant::now();
    while !what() {
        assert!(start.elapsed() < limit, "timed out after {limit:?}: {}", why());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A minimal HTTP/1.1 GET: (status, body); handles chunked bodies.
fn http_get(addr: &str, path: &str) -> (u16, Vec<u8>) {
    let mut s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut b = Vec::new();
    s.read_to_end(&mut b).unwrap();
    let end = b.windows(4).position(|w| w == b"\r\n\r\n").expect("HTTP header end");
    let head = String::from_utf8_lossy(&b[..end]).to_ascii_lowercase();
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).expect("HTTP status");
    let mut body = b[end + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        let (mut out, mut rest) = (Vec::new(), &body[..]);
        loop {
            let nl = rest.windows(2).position(|w| w == b"\r\n").expect("chunk size");
            let n = usize::from_str_radix(std::str::from_utf8(&rest[..nl]).unwrap().trim(), 16).unwrap();
            if n == 0 {
                break;
            }
            out.extend_from_slice(&rest[nl + 2..nl + 2 + n]);
            rest = &rest[nl + 2 + n + 2..];
        }
        body = out;
    }
    (code, body)
}

/// One sample line of the Prometheus text format.
#[derive(Debug)]
struct Series {
    name: String,
    labels: HashMap<String, String>,
    value: f64,
}

fn metric_name_ok(n: &str) -> bool {
    let mut c = n.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

fn label_name_ok(n: &str) -> bool {
    let mut c = n.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_') && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

/// Parses and checks Prometheus text exposition (format 0.0.4): comment
/// syntax, one TYPE per family before its samples, names, label escaping,
/// values, no duplicate series.
fn parse_prometheus(text: &str) -> Vec<Series> {
    let mut types: HashMap<String, String> = HashMap::new();
    let mut sampled: HashSet<String> = HashSet::new();
    let mut keys = HashSet::new();
    let mut out = Vec::new();
    assert!(text.ends_with('\n'), "exposition must end with a newline");
    for (i, line) in text.lines().enumerate() {
        let at = || format!("line {}: {line:?}", i + 1);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let mut p = rest.trim_start().splitn(3, ' ');
            match p.next() {
                Some("HELP") => {
                    let name = p.next().unwrap_or("");
                    assert!(metric_name_ok(name), "bad HELP name, {}", at());
                    let help = p.next().unwrap_or("");
                    let mut it = help.chars();
                    while let Some(c) = it.next() {
                        if c == '\\' {
                            assert!(matches!(it.next(), Some('\\' | 'n')), "bad escape in HELP, {}", at());
                        }
                    }
                }
                Some("TYPE") => {
                    let name = p.next().unwrap_or("").to_string();
                    let kind = p.next().unwrap_or("");
                    assert!(metric_name_ok(&name), "bad TYPE name, {}", at());
                    assert!(["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind), "bad type, {}", at());
                    assert!(!sampled.contains(&name), "TYPE after samples, {}", at());
                    assert!(types.insert(name, kind.to_string()).is_none(), "second TYPE, {}", at());
                }
                _ => {} // other comments are allowed
            }
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or_else(|| panic!("no value, {}", at()));
        let name = &line[..name_end];
        assert!(metric_name_ok(name), "bad metric name, {}", at());
        let mut rest = &line[name_end..];
        let mut labels = HashMap::new();
        if let Some(r) = rest.strip_prefix('{') {
            let mut r = r;
            loop {
                if let Some(after) = r.strip_prefix('}') {
                    r = after;
                    break;
                }
                let eq = r.find('=').unwrap_or_else(|| panic!("label without '=', {}", at()));
                let lname = &r[..eq];
                assert!(label_name_ok(lname), "bad label name {lname:?}, {}", at());
                r = r[eq + 1..].strip_prefix('"').unwrap_or_else(|| panic!("label value not quoted, {}", at()));
                let mut val = String::new();
                let mut chars = r.char_indices();
                let close = loop {
                    match chars.next() {
                        Some((_, '\\')) => match chars.next() {
                            Some((_, '\\')) => val.push('\\'),
                            Some((_, '"')) => val.push('"'),
                            Some((_, 'n')) => val.push('\n'),
                            _ => panic!("bad escape in label value, {}", at()),
                        },
                        Some((j, '"')) => break j,
                        Some((_, c)) => val.push(c),
                        None => panic!("unterminated label value, {}", at()),
                    }
                };
                assert!(labels.insert(lname.to_string(), val).is_none(), "repeated label, {}", at());
                r = &r[close + 1..];
                r = r.strip_prefix(',').unwrap_or(r);
            }
            rest = r;
        }
        let mut fields = rest.strip_prefix(' ').unwrap_or_else(|| panic!("no space before value, {}", at())).split(' ');
        let v = fields.next().unwrap_or("");
        let value = match v {
            "NaN" => f64::NAN,
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            _ => v.parse().unwrap_or_else(|_| panic!("bad value {v:?}, {}", at())),
        };
        if let Some(ts) = fields.next() {
            assert!(ts.parse::<i64>().is_ok(), "bad timestamp, {}", at());
        }
        assert!(fields.next().is_none(), "trailing fields, {}", at());
        assert!(types.contains_key(name), "sample before (or without) its TYPE, {}", at());
        sampled.insert(name.to_string());
        let mut key: Vec<_> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        key.sort();
        assert!(keys.insert(format!("{name}{key:?}")), "duplicate series, {}", at());
        out.push(Series { name: name.to_string(), labels, value });
    }
    out
}

fn metric<'a>(m: &'a [Series], name: &str, labels: &[(&str, &str)]) -> Option<&'a Series> {
    m.iter().find(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
}

fn dir_bytes(d: &Path) -> u64 {
    // Files may be evicted between listing and stat.
    std::fs::read_dir(d).map_or(0, |rd| rd.filter_map(|e| Some(e.ok()?.metadata().ok()?.len())).sum())
}

fn stored_ids(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| !n.starts_with('.') && !n.ends_with(".meta.json"))
        .filter_map(|n| n.strip_suffix(".json").map(str::to_string))
        .collect();
    v.sort();
    v
}

/// As root with setpriv: a wrapper that runs a command as nobody, and a witch binary nobody can run.
fn as_nobody(dir: &Scratch, _witch: &Path) -> Option<(PathBuf, Vec<String>)> {
    Nobody::setup(dir).map(|n| (n.witch, n.wrapper))
}

#[test]
fn witchd_watches_two_programs_and_leaves_them_as_they_were() {
    let dir = Scratch::new("daemon");
    chmod(dir.path(), 0o755);
    let witch = witch_bin();
    // A name of its own, so that a witchd of another test run on this machine
    // (whose rule matches by name too) leaves this one alone.
    let dead_name = format!("daemon_dead_{}", std::process::id());
    let dead = Program::build_with("daemon_dead", dir.path(), &dead_name, &[]).unwrap_or_else(|e| panic!("{e}"));
    let silent = Program::build("daemon_silent", dir.path());
    let (dw, dk, ss) = (dead.line("@dw"), dead.line("@dk"), silent.line("@ss"));
    let mut t_dead = Target::start(&dead.exe, &["0"], &[]);
    let mut t_silent = Target::start(&silent.exe, &["0"], &[]);
    std::thread::sleep(Duration::from_millis(200));

    let socket = dir.join("witchd.sock");
    let store = dir.join("store");
    // A few profiles (one is 80-120 KiB with its data objects: 400 to 900
    // samples in a second's session; 128 KiB held only one of them once a
    // window's picks no longer took a trap, never both targets').
    let max_bytes: u64 = 384 * 1024;
    let config = dir.join("witchd.toml");
    std::fs::write(
        &config,
        format!(
            r#"# witchd test config: a 1 s session every 2 s on each program
socket = "{socket}"
socket_mode = 0o666   # every request is still checked (tested as nobody below)
http = "127.0.0.1:0"
scan_every = "200ms"
detach_timeout = "10s"

[store]
dir = "{store}"
max_bytes = "384KiB"  # a few profiles: eviction must happen

[defaults]
every = "2s"
duration = "1s"
overhead = "1.5%"     # the software sampler's budget, as --overhead

[[watch]]
exe = "{dead_name}"
crafts = ["dead"]
overhead = 2          # a rule's own budget over the defaults'

[[watch]]
pid = {silent_pid}
crafts = ["silent-store"]
"#,
            socket = socket.display(),
            store = store.display(),
            silent_pid = t_silent.pid(),
            dead_name = dead_name
        ),
    )
    .unwrap();
    let mut d = Witchd::start(&config, &dir.join("witchd.log"));
    let pids = [t_dead.pid(), t_silent.pid()];

    // Up, and the socket is as configured.
    wait_for(Duration::from_secs(20), || socket.exists() && client(&witch, &[], &socket, &["status"]).status.success(), || d.log());
    assert_eq!(std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777, 0o666);
    let status = json(&client(&witch, &[], &socket, &["status", "--json"]));
    let http = status["http"].as_str().expect("http address in status").to_string();
    assert!(http.starts_with("127.0.0.1:"), "{status}");

    // Profiles of both targets appear, and evictions keep the store under its limit.
    let store_ok = |ctx: &str| {
        let b = dir_bytes(&store);
        assert!(b <= max_bytes, "store holds {b} bytes > max_bytes {max_bytes} ({ctx})");
    };
    let last_metrics = std::cell::RefCell::new(String::new());
    wait_for(
        Duration::from_secs(60),
        || {
            store_ok("while running");
            let (code, body) = http_get(&http, "/metrics");
            assert_eq!(code, 200);
            *last_metrics.borrow_mut() = String::from_utf8(body).expect("metrics are UTF-8");
            let m = parse_prometheus(&last_metrics.borrow());
            let ok = metric(&m, "witchd_sessions_total", &[("outcome", "ok")]).map_or(0.0, |s| s.value);
            let evicted = metric(&m, "witchd_store_evictions_total", &[]).map_or(0.0, |s| s.value);
            let list = json(&client(&witch, &[], &socket, &["list", "--json"]));
            let per_pid = |p: u32| list.as_array().unwrap().iter().filter(|m| m["pid"] == p).count();
            ok >= 6.0 && evicted >= 1.0 && pids.iter().all(|&p| per_pid(p) >= 1)
        },
        || {
            format!(
                "waiting for 6 sessions, an eviction and profiles of both targets\nmetrics:\n{}\nlog:\n{}",
                last_metrics.borrow(),
                d.log()
            )
        },
    );

    // /metrics: syntax checked above; now the content.
    let last_metrics = last_metrics.into_inner();
    let m = parse_prometheus(&last_metrics);
    for (pid, exe, craft) in [(t_dead.pid(), dead_name.as_str(), "dead"), (t_silent.pid(), "daemon_silent", "silent-store")] {
        // Series are named by executable and slot, stable across restarts;
        // the info metric says which pid holds a slot.
        let pid = pid.to_string();
        let info = metric(&m, "witchd_target_info", &[("pid", &pid), ("exe", exe)])
            .unwrap_or_else(|| panic!("no info for {exe}:\n{last_metrics}"));
        assert_eq!(info.value, 1.0);
        let slot = info.labels["slot"].as_str();
        let w = metric(&m, "witchd_waste_fraction", &[("exe", exe), ("slot", slot), ("craft", craft)])
            .unwrap_or_else(|| panic!("no waste fraction for {exe}:\n{last_metrics}"));
        assert!((0.0..=1.0).contains(&w.value), "{w:?}");
        assert!(!w.labels.contains_key("pid"), "no pid label on a series: {w:?}");
        let s = metric(&m, "witchd_target_samples", &[("exe", exe), ("slot", slot), ("craft", craft)]).expect("samples gauge");
        assert!(s.value > 0.0, "{s:?}");
        let o = metric(&m, "witchd_target_overhead_ratio", &[("exe", exe), ("slot", slot), ("craft", craft)]).expect("overhead gauge");
        assert!(o.value > 0.0 && o.value < 1.0, "{o:?}");
    }
    let store_bytes = metric(&m, "witchd_store_bytes", &[]).expect("store bytes").value;
    assert!(store_bytes > 0.0 && store_bytes <= max_bytes as f64, "{store_bytes}");
    assert_eq!(metric(&m, "witchd_store_max_bytes", &[]).unwrap().value, max_bytes as f64);
    assert_eq!(metric(&m, "witchd_targets", &[]).unwrap().value, 2.0);
    for kind in ["attach", "detach", "store"] {
        assert_eq!(metric(&m, "witchd_errors_total", &[("kind", kind)]).unwrap().value, 0.0, "{kind} errors:\n{}", d.log());
    }

    // The stored profiles find what the programs do by construction.
    let list = json(&client(&witch, &[], &socket, &["list", "--json"]));
    let newest = |pid: u32| list.as_array().unwrap().iter().rev().find(|m| m["pid"] == pid).unwrap()["id"].as_str().unwrap().to_string();
    let (id_dead, id_silent) = (newest(t_dead.pid()), newest(t_silent.pid()));
    let f_dead = dir.join("dead.json");
    let r = client(&witch, &[], &socket, &["fetch", &id_dead, "-o", f_dead.to_str().unwrap()]);
    assert!(r.status.success(), "{}", r.describe());
    let rep = report(&f_dead);
    assert_eq!((rep.craft().as_str(), rep.json["pid"].as_u64()), ("dead", Some(t_dead.pid() as u64)), "{}", rep.dump());
    let pair = rep.pair(&dead.file, dw, dk);
    rep.note(&format!("<@dw,@dk> fraction {:.3}, rank {:?}", pair.fraction(), pair.best_rank));
    assert_eq!(pair.best_rank, Some(0), "<@dw,@dk> should be the top pair\n{}", rep.dump());
    assert!(pair.fraction() >= 0.9, "@dw stores are all killed by @dk\n{}", rep.dump());
    // The budgets of the config reached the agents (a software sampler's bursts carry one).
    let budget_of = |f: &Path| {
        let p = raw_profile(f);
        (p["sampler"]["kind"] == "software").then(|| p["sampler"]["overhead_percent"].as_f64())
    };
    let f_silent = dir.join("silent.json");
    let r = client(&witch, &[], &socket, &["fetch", "--pid", &t_silent.pid().to_string(), "-o", f_silent.to_str().unwrap()]);
    assert!(r.status.success(), "{}", r.describe());
    let rep = report(&f_silent);
    assert_eq!(rep.craft(), "silent-store");
    rep.note("silent");
    assert!(rep.waste_fraction() >= 0.8, "every @ss store after the first round is silent\n{}", rep.dump());
    for (f, want) in [(&f_dead, 2.0), (&f_silent, 1.5)] {
        if let Some(got) = budget_of(f) {
            assert_eq!(got, Some(want), "overhead budget in {}", f.display());
        }
    }
    assert_eq!(rep.pair(&silent.file, ss, ss).best_rank, Some(0), "{}", rep.dump());

    // pprof over HTTP decodes, with the program's frames in it.
    for path in [format!("/pprof/{id_silent}"), format!("/pprof/latest?pid={}&craft=dead", t_dead.pid())] {
        let (code, gz) = http_get(&http, &path);
        assert_eq!(code, 200, "GET {path}: {}", String::from_utf8_lossy(&gz));
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut raw).unwrap_or_else(|e| panic!("GET {path}: not gzip: {e}"));
        let p = <witchd::render::pprof::PprofProfile as prost::Message>::decode(&raw[..])
            .unwrap_or_else(|e| panic!("GET {path}: not pprof: {e}"));
        assert_eq!(p.string_table.first().map(String::as_str), Some(""), "pprof string 0 must be empty");
        let types: Vec<&str> = p.sample_type.iter().map(|t| p.string_table[t.r#type as usize].as_str()).collect();
        assert_eq!(types, ["waste", "use"]);
        assert!(!p.sample.is_empty(), "GET {path}: no samples");
        assert!(p.sample.iter().all(|s| s.value.len() == 2 && s.location_id.iter().all(|&l| l >= 1 && l as usize <= p.location.len())));
        assert!(p.function.iter().any(|f| p.string_table[f.name as usize] == "worker"), "GET {path}: no `worker` frame");
    }
    assert_eq!(http_get(&http, "/pprof/latest?pid=1").0, 404);
    assert_eq!(http_get(&http, "/pprof/no-such-id").0, 404);

    // An immediate session, returned to the caller (and never overlapping a scheduled one).
    let f_now = dir.join("now.json");
    let r = client(
        &witch,
        &[],
        &socket,
        &["profile", "--pid", &t_dead.pid().to_string(), "--craft", "dead", "--duration", "1s", "-o", f_now.to_str().unwrap()],
    );
    assert!(r.status.success(), "{}", r.describe());
    assert!(r.stderr_str().contains("stored as"), "{}", r.describe());
    let rep = report(&f_now);
    assert_eq!(rep.json["pid"].as_u64(), Some(t_dead.pid() as u64));
    assert!(rep.samples() > 0.0, "{}", rep.dump());

    // A target that exits during a requested session: its last profile comes
    // back, marked as such, and it ends as an unprofiled run would.
    let t_exit = Target::start(&silent.exe, &["0"], &[]);
    std::thread::sleep(Duration::from_millis(200));
    let f_exit = dir.join("exit.json");
    let req = {
        let (witch, socket, f) = (witch.clone(), socket.clone(), f_exit.clone());
        let pid = t_exit.pid().to_string();
        std::thread::spawn(move || {
            client(
                &witch,
                &[],
                &socket,
                &["profile", "--pid", &pid, "--craft", "silent-store", "--duration", "20s", "-o", f.to_str().unwrap()],
            )
        })
    };
    std::thread::sleep(Duration::from_millis(1500));
    let Finished { rounds, stdout: out, status, .. } = t_exit.finish();
    let native = silent.run_native(&[&rounds.to_string()]);
    assert_eq!(String::from_utf8_lossy(&native.stdout), out, "a target profiled until its exit prints what an unprofiled run does");
    assert_eq!(status.code(), native.code());
    let r = req.join().unwrap();
    assert!(r.status.success(), "{}", r.describe());
    assert!(r.stderr_str().contains("exited during the session"), "{}", r.describe());
    assert!(r.elapsed < Duration::from_secs(15), "the session should end with its target: {}", r.describe());
    let rep = report(&f_exit);
    assert!(rep.samples() > 0.0, "{}", rep.dump());
    for t in [&mut t_dead, &mut t_silent] {
        if !t.alive() {
            panic!("a watched target ended while witchd profiled it: {}\n{}", t.how_it_ended(), d.log());
        }
    }
    let m = parse_prometheus(&String::from_utf8(http_get(&http, "/metrics").1).unwrap());
    let exited = metric(&m, "witchd_sessions_total", &[("outcome", "target_exited")]).map(|s| s.value);
    assert_eq!(exited, Some(1.0), "only the one target exited during a session\n{}", d.log());

    // Every request is checked: nobody sees none of root's processes or profiles.
    if let Some((nwitch, wrapper)) = as_nobody(&dir, &witch) {
        let list = json(&client(&nwitch, &wrapper, &socket, &["list", "--json"]));
        assert_eq!(list.as_array().map(Vec::len), Some(0), "nobody sees root's profiles: {list}");
        let st = json(&client(&nwitch, &wrapper, &socket, &["status", "--json"]));
        assert_eq!(st["targets"].as_array().map(Vec::len), Some(0), "{st}");
        let r = client(&nwitch, &wrapper, &socket, &["fetch", &id_dead, "-o", "/dev/null"]);
        assert_eq!(r.code(), Some(2), "{}", r.describe());
        let r = client(&nwitch, &wrapper, &socket, &["profile", "--pid", &t_dead.pid().to_string(), "--duration", "1s", "-o", "/dev/null"]);
        assert_eq!(r.code(), Some(2), "{}", r.describe());
        assert!(r.stderr_str().contains("permission denied"), "{}", r.describe());
        assert_eq!(r.stderr_str().trim().lines().count(), 1, "one-line error: {}", r.describe());
    } else {
        eprintln!("[witch-tests] not root or no setpriv: caller checks not exercised as another user");
    }

    // SIGTERM while a session is in flight: detach (profile stored), exit 0.
    wait_for(
        Duration::from_secs(20),
        || json(&client(&witch, &[], &socket, &["status", "--json"]))["sessions_active"].as_u64() > Some(0),
        || d.log(),
    );
    let (st, took) = d.term(Duration::from_secs(60));
    let log = std::fs::read_to_string(dir.join("witchd.log")).unwrap();
    eprintln!("[witch-tests] witchd exited {st} {:.2}s after SIGTERM; log:\n{log}", took.as_secs_f64());
    assert_eq!((st.code(), st.signal()), (Some(0), None), "witchd's exit after SIGTERM\n{log}");
    let after = &log[log.find("SIGTERM: detaching").expect("shutdown logged")..];
    assert!(after.contains(", stored "), "the in-flight session detached and stored its profile\n{log}");
    assert!(!socket.exists(), "socket removed at exit");
    store_ok("after exit");
    for pid in pids {
        let state = proc_status(pid, "State:");
        assert!(state.starts_with('S') || state.starts_with('R'), "target {pid} state {state:?} after witchd left");
        assert_eq!(proc_status(pid, "TracerPid:"), "0", "target {pid} still traced");
    }

    // The targets run on, then end as an unprofiled run of the same length.
    std::thread::sleep(Duration::from_millis(300));
    for (t, prog) in [(t_dead, &dead), (t_silent, &silent)] {
        let Finished { rounds, stdout: out, status, .. } = t.finish();
        assert!(rounds > 0, "{} printed {out:?}", prog.file);
        let native = prog.run_native(&[&rounds.to_string()]);
        assert_eq!(String::from_utf8_lossy(&native.stdout), out, "{} output differs from an unprofiled run", prog.file);
        assert_eq!((status.code(), status.signal()), (native.code(), native.signal()), "{} exit status", prog.file);
    }

    // Restart on the same store: re-indexed, and the default socket is owner-only.
    let before = stored_ids(&store);
    assert!(!before.is_empty());
    let config2 = dir.join("witchd2.toml");
    std::fs::write(
        &config2,
        format!("socket = \"{}\"\nhttp = \"off\"\n[store]\ndir = \"{}\"\nmax_bytes = \"384KiB\"\n", socket.display(), store.display()),
    )
    .unwrap();
    let mut d2 = Witchd::start(&config2, &dir.join("witchd2.log"));
    wait_for(Duration::from_secs(20), || socket.exists() && client(&witch, &[], &socket, &["status"]).status.success(), || d2.log());
    assert_eq!(std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777, 0o600);
    // The socket was bound in a private directory and renamed into place:
    // nothing of that is left beside it.
    let beside: Vec<_> = std::fs::read_dir(socket.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.ends_with(".bind"))
        .collect();
    assert!(beside.is_empty(), "{beside:?}");
    let list = json(&client(&witch, &[], &socket, &["list", "--json"]));
    let mut after: Vec<String> = list.as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_string()).collect();
    after.sort();
    assert_eq!(after, before, "the restarted daemon lists what the store holds");
    if let Some((nwitch, wrapper)) = as_nobody(&dir, &witch) {
        let r = client(&nwitch, &wrapper, &socket, &["status"]);
        assert_eq!(r.code(), Some(2), "{}", r.describe());
        assert!(r.stderr_str().contains("permission denied"), "{}", r.describe());
    }
    assert!(d2.running());
    let (st, _) = d2.term(Duration::from_secs(30));
    assert_eq!(st.code(), Some(0), "{}", d2.log());
}

#[test]
fn clear_errors() {
    let dir = Scratch::new("daemon-errors");
    // Not running: exit 2, one line.
    let r = client(&witch_bin(), &[], &dir.join("none.sock"), &["status"]);
    assert_eq!(r.code(), Some(2), "{}", r.describe());
    assert!(r.stderr_str().contains("witchd is not running"), "{}", r.describe());
    assert_eq!(r.stderr_str().trim().lines().count(), 1, "{}", r.describe());

    // A bad config names file, line and column.
    let cfg = dir.join("bad.toml");
    std::fs::write(&cfg, "[store]\nmax_bytes = \"lots\"\n").unwrap();
    let mut cmd = Command::new(witchd_bin());
    cmd.arg("--config").arg(&cfg);
    let r = run_cmd(cmd, None);
    assert_eq!(r.code(), Some(2), "{}", r.describe());
    let want = format!("{}:2:13: ", cfg.display());
    assert!(r.stderr_str().contains(&want), "want {want:?}: {}", r.describe());
    assert!(r.stderr_str().contains("not a size"), "{}", r.describe());

    // A bad overhead budget: the same, with what is wanted.
    std::fs::write(&cfg, "[[watch]]\nexe = \"x\"\noverhead = \"300%\"\n").unwrap();
    let mut cmd = Command::new(witchd_bin());
    cmd.arg("--config").arg(&cfg).arg("--check");
    let r = run_cmd(cmd, None);
    assert_eq!(r.code(), Some(2), "{}", r.describe());
    let want = format!("{}:3:12: overhead must be a percentage from 0 to 100", cfg.display());
    assert!(r.stderr_str().contains(&want), "want {want:?}: {}", r.describe());
    assert_eq!(r.stderr_str().trim().lines().count(), 1, "{}", r.describe());

    // --check accepts a good one.
    std::fs::write(&cfg, "[[watch]]\nexe = \"x\"\nevery = \"1s\"\nduration = \"0.5s\"\n").unwrap();
    let mut cmd = Command::new(witchd_bin());
    cmd.arg("--config").arg(&cfg).arg("--check");
    let r = run_cmd(cmd, None);
    assert!(r.status.success(), "{}", r.describe());
}

/// SIGHUP (a closed terminal, or a service manager asking for a reload)
/// stops witchd as SIGTERM does, saying so: it used to kill it without a
/// word, leaving its socket file behind.
#[test]
fn sighup_stops_witchd_cleanly() {
    let dir = Scratch::new("daemon-hup");
    let socket = dir.join("witchd.sock");
    let config = dir.join("witchd.toml");
    std::fs::write(&config, format!("socket = \"{}\"\n[store]\ndir = \"{}\"\n", socket.display(), dir.join("store").display())).unwrap();
    let mut d = Witchd::start(&config, &dir.join("witchd.log"));
    wait_for(Duration::from_secs(10), || socket.exists(), || d.log());
    let (st, _) = d.stop_with(libc::SIGHUP, Duration::from_secs(10));
    assert_eq!(st.code(), Some(0), "{}", d.log());
    assert!(d.log().contains("SIGHUP"), "{}", d.log());
    assert!(!socket.exists(), "the socket file was left behind");
}

/// Any local user can connect to the HTTP port (it has no credentials):
/// 400 idle connections that never finish a request, against a witchd
/// limited to 100 descriptors, must not take its descriptors, so its Unix
/// socket still answers; and an idle connection is closed after its
/// lifetime. (They used to exhaust its descriptors: `/metrics` and `witch
/// daemon status` hung, and one such connection stayed open for minutes.)
#[test]
fn idle_http_clients_cannot_starve_witchd() {
    use std::os::unix::process::CommandExt;
    let dir = Scratch::new("daemon-http-idle");
    let socket = dir.join("witchd.sock");
    let config = dir.join("witchd.toml");
    std::fs::write(
        &config,
        format!("socket = \"{}\"\nhttp = \"127.0.0.1:0\"\n[store]\ndir = \"{}\"\n", socket.display(), dir.join("store").display()),
    )
    .unwrap();
    let log = dir.join("witchd.log");
    let f = std::fs::File::create(&log).unwrap();
    let mut cmd = Command::new(witchd_bin());
    cmd.arg("--config").arg(&config).stdin(Stdio::null()).stdout(f.try_clone().unwrap()).stderr(f);
    // SAFETY: setrlimit only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let l = libc::rlimit { rlim_cur: 100, rlim_max: 100 };
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
            Ok(())
        });
    }
    let mut d = Witchd { child: Some(cmd.spawn().expect("start witchd")), log: log.clone() };
    wait_for(Duration::from_secs(10), || socket.exists(), || d.log());
    let witch = witch_bin();
    let status = json(&client(&witch, &[], &socket, &["status", "--json"]));
    let http = status["http"].as_str().expect("http address in status").to_string();
    // 400 at once: past the 64 served they wait in the listener's backlog.
    // Each must connect at once: with the default backlog of 128, a SYN
    // past 64 + 128 was dropped and retried after 1 s, 3 s, ... (400 took
    // 126 s), so the first connect that takes a second fails the test.
    let t0 = Instant::now();
    let addr: std::net::SocketAddr = http.parse().unwrap();
    let mut idle: Vec<std::net::TcpStream> = Vec::new();
    for i in 0..400 {
        let t = Instant::now();
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3))
            .unwrap_or_else(|e| panic!("connection #{i} failed after {:?}: {e}\n{}", t.elapsed(), d.log()));
        assert!(t.elapsed() < Duration::from_millis(900), "connection #{i} took {:?} to connect (a dropped SYN, retried)", t.elapsed());
        s.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
        idle.push(s);
    }
    eprintln!("[witch-tests] {} idle connections in {:?}", idle.len(), t0.elapsed());
    std::thread::sleep(Duration::from_millis(500));
    let timeout = vec!["timeout".to_string(), "10".to_string()];
    let r = client(&witch, &timeout, &socket, &["status"]);
    assert_eq!(r.code(), Some(0), "witchd's socket did not answer with idle HTTP clients connected\n{}\nlog:\n{}", r.describe(), d.log());
    assert!(!d.log().contains("Too many open files"), "{}", d.log());
    let mut first = idle.into_iter().next().unwrap();
    first.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let started = Instant::now();
    let mut b = [0u8; 64];
    let closed = matches!(first.read(&mut b), Ok(0) | Err(_));
    assert!(closed && started.elapsed() < Duration::from_secs(45), "an idle connection stayed open {:?}", started.elapsed());
    eprintln!("[witch-tests] the idle connection was closed after {:?}", started.elapsed());
    let (st, took) = d.term(Duration::from_secs(10));
    eprintln!("[witch-tests] witchd stopped in {took:?}");
    assert_eq!(st.code(), Some(0), "{}", d.log());
}

/// A witchd on its own socket and an HTTP port of its own, with the given
/// top-level `settings` (TOML lines) and one `[[watch]]` rule's lines,
/// answering on its socket: it, its socket and its HTTP address.
fn witchd_watching(dir: &Scratch, witch: &Path, settings: &str, watch: &str) -> (Witchd, PathBuf, String) {
    let socket = dir.join("witchd.sock");
    let config = dir.join("witchd.toml");
    std::fs::write(
        &config,
        format!(
            "socket = \"{}\"\nhttp = \"127.0.0.1:0\"\n{settings}[store]\ndir = \"{}\"\n[[watch]]\n{watch}",
            socket.display(),
            dir.join("store").display()
        ),
    )
    .unwrap();
    let d = Witchd::start(&config, &dir.join("witchd.log"));
    wait_for(Duration::from_secs(20), || socket.exists() && client(witch, &[], &socket, &["status"]).status.success(), || d.log());
    let http = json(&client(witch, &[], &socket, &["status", "--json"]))["http"].as_str().unwrap().to_string();
    (d, socket, http)
}

/// Processes with the agent's control thread in them now: the sessions
/// really attached at this moment.
fn agents_in(pids: &[u32]) -> usize {
    pids.iter()
        .filter(|p| {
            std::fs::read_dir(format!("/proc/{p}/task")).is_ok_and(|d| {
                d.flatten().any(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == "witch-agent"))
            })
        })
        .count()
}

/// Three programs due at once with `max_sessions = 1`: one is profiled, the
/// others wait for the slot. `witch daemon status` showed all three as
/// "profiling dead", and `sessions_active` (`witchd_sessions_active` too)
/// counted them all: every session claimed, waiting for a slot or not.
#[test]
fn sessions_waiting_for_a_slot_show_as_queued() {
    let dir = Scratch::new("daemon-queued");
    let witch = witch_bin();
    let name = format!("daemon_queued_{}", std::process::id());
    let prog = Program::build_with("daemon_dead", dir.path(), &name, &[]).unwrap_or_else(|e| panic!("{e}"));
    let targets: Vec<Target> = (0..3).map(|_| Target::start(&prog.exe, &["0"], &[])).collect();
    let pids: Vec<u32> = targets.iter().map(Target::pid).collect();
    let (mut d, socket, http) = witchd_watching(
        &dir,
        &witch,
        "scan_every = \"200ms\"\nmax_sessions = 1\n",
        &format!("exe = \"{name}\"\ncrafts = [\"dead\"]\nevery = \"1s\"\nduration = \"500ms\"\n"),
    );
    let (mut polls, mut queued_seen, mut most_agents) = (0, 0, 0);
    let start = Instant::now();
    loop {
        let st = json(&client(&witch, &[], &socket, &["status", "--json"]));
        let states: Vec<String> = st["targets"].as_array().unwrap().iter().map(|t| t["state"].as_str().unwrap().to_string()).collect();
        let profiling = states.iter().filter(|s| s.starts_with("profiling")).count();
        let queued = states.iter().filter(|s| s.starts_with("queued")).count();
        assert!(profiling <= 1, "{profiling} targets shown profiling with max_sessions = 1: {states:?}\n{}", d.log());
        assert!(st["sessions_active"].as_u64() <= Some(1), "sessions_active over max_sessions: {st}");
        assert!(states.iter().all(|s| ["idle", "queued dead", "profiling dead"].contains(&s.as_str())), "{states:?}");
        let m = parse_prometheus(&String::from_utf8(http_get(&http, "/metrics").1).unwrap());
        let active = metric(&m, "witchd_sessions_active", &[]).expect("witchd_sessions_active").value;
        assert!(active <= 1.0, "witchd_sessions_active {active} with max_sessions = 1\n{}", d.log());
        most_agents = most_agents.max(agents_in(&pids));
        polls += 1;
        queued_seen += usize::from(queued > 0);
        let ok = st["sessions_ok"].as_u64().unwrap_or(0);
        if queued_seen >= 3 && ok >= 6 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{queued_seen} polls saw a queued session, {ok} sessions ok\n{}", d.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "[witch-tests] {polls} polls, {queued_seen} with a queued session; at most {most_agents} targets held an agent thread at once"
    );
    let m = parse_prometheus(&String::from_utf8(http_get(&http, "/metrics").1).unwrap());
    assert!(metric(&m, "witchd_sessions_waiting", &[]).is_some(), "no witchd_sessions_waiting gauge");
    let text = client(&witch, &[], &socket, &["status"]);
    assert!(text.stdout_str().contains("running (of 1)"), "{}", text.describe());
    let (st, _) = d.term(Duration::from_secs(30));
    assert_eq!(st.code(), Some(0), "{}", d.log());
    for t in targets {
        let Finished { rounds, stdout: out, status, .. } = t.finish();
        assert!(rounds > 0 && status.code() == Some(5), "{out:?} {status}");
    }
}

/// A program that replaces itself (exec) while witchd profiles it: the same
/// pid runs a new image, and the agent (its thread, its state, what it
/// gathered) went with the old one. witchd logged "pid N exited during the
/// session" or "detached without a profile" (an error); it is an outcome of
/// its own, the session ends then rather than at its end, and the process is
/// profiled again as a fresh target.
#[test]
fn a_program_that_execs_mid_session_is_reported_and_profiled_again() {
    let mut sc = ExecScene::start("exec", &[]);
    let (pid, name) = (sc.pid, sc.name.clone());
    std::thread::sleep(Duration::from_millis(300));
    let took = sc.exec("e\n");
    let log = sc.d.log();
    eprintln!("[witch-tests] the session ended {took:?} after the exec");
    assert_eq!(sc.outcomes(), [0.0, 0.0, 0.0, 1.0], "outcomes ok, target_exited, failed, target_exec\n{log}");
    assert!(log.contains(&format!("pid {pid} ({name}) replaced its program (exec)")), "{log}");
    assert!(!log.contains("exited during") && !log.contains("without a profile"), "{log}");
    assert!(took < Duration::from_secs(6), "the session waited out its 8 s after the exec ({took:?})\n{log}");
    let st = sc.client_json(&["status", "--json"]);
    let t = st["targets"].as_array().unwrap().iter().find(|t| t["pid"] == pid).cloned();
    let t = t.unwrap_or_else(|| panic!("the process is no longer watched: {st}"));
    assert_ne!(t["state"], "exited", "{st}");
    assert_eq!(st["sessions_target_exec"], 1, "{st}");
    // The new image is profiled: a stored profile of the pid, begun after the exec.
    let after = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 - took.as_nanos() as u64;
    wait_for(
        Duration::from_secs(40),
        || {
            let list = sc.client_json(&["list", "--pid", &pid.to_string(), "--json"]);
            list.as_array().unwrap().iter().any(|m| m["start_unix_ns"].as_u64() > Some(after))
        },
        || sc.d.log(),
    );
    assert_eq!(sc.outcomes()[1..], [0.0, 0.0, 1.0], "{}", sc.d.log());
    sc.finish();
}

/// A program that replaces itself mid-session through an exec function the
/// agent takes (`execl`, by the program's import table): the agent ends
/// the session first and sends its profile, so this is no `target_exec`.
/// witchd stores the profile (outcome `ok`, `ended_by: "exec"`, a note
/// naming `execl`, not the target's last: it runs on) within a poll or two
/// of the exec rather than at the session's end, watches the process afresh
/// as its new program, profiles that again, and the program ends as it
/// would have.
#[test]
fn a_program_that_execs_through_a_call_the_agent_takes_has_its_profile_stored() {
    let mut sc = ExecScene::start("execl", &["0"]);
    let (pid, name) = (sc.pid, sc.name.clone());
    let generation = |p: &serde_json::Value| p["args"].as_array().and_then(|a| a.last()).and_then(|g| g.as_str()).map(str::to_string);
    let stored = |sc: &ExecScene| sc.client_json(&["list", "--pid", &pid.to_string(), "--json"]).as_array().cloned().unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let took = sc.exec("l\n");
    let log = sc.d.log();
    eprintln!("[witch-tests] the session ended {took:?} after the execl");
    assert_eq!(sc.outcomes(), [1.0, 0.0, 0.0, 0.0], "outcomes ok, target_exited, failed, target_exec\n{log}");
    assert!(took < Duration::from_secs(3), "the session ended only {took:?} after the execl (its time was 8 s)\n{log}");
    assert!(!log.contains("replaced its program (exec) during") && !log.contains("exited during"), "{log}");
    assert!(!log.contains("without a profile"), "{log}");
    // Stored: the profile of the program before the exec, not its last.
    let list = stored(&sc);
    assert_eq!(list.len(), 1, "{list:?}");
    let meta = &list[0];
    assert_eq!((meta["ended_by"].as_str(), meta["target_exited"].as_bool()), (Some("exec"), Some(false)), "{meta}");
    let id = meta["id"].as_str().unwrap();
    assert!(log.contains(&format!("pid {pid} ({name}): dead ")) && log.contains(&format!("stored {id}")), "{log}");
    let p = raw_profile(&sc.dir.join("store").join(format!("{id}.json")));
    assert_eq!(p["ended_by"], "exec", "{p}");
    assert!(p["notes"].to_string().contains("called execl to replace its program"), "{}", p["notes"]);
    assert_eq!(generation(&p).as_deref(), Some("0"), "generation 0's profile: {}", p["args"]);
    assert!(meta["samples"].as_u64() > Some(0), "{meta}");
    let st = sc.client_json(&["status", "--json"]);
    assert_eq!((st["sessions_ok"].as_u64(), st["sessions_target_exec"].as_u64()), (Some(1), Some(0)), "{st}");
    // Watched afresh as its new program, which is profiled in its turn.
    wait_for(
        Duration::from_secs(20),
        || sc.d.log().contains(&format!("pid {pid} ({name}) replaced its program (exec): watching it afresh as {name}")),
        || sc.d.log(),
    );
    wait_for(Duration::from_secs(40), || stored(&sc).len() >= 2, || sc.d.log());
    let list = stored(&sc);
    let later = list.iter().find(|m| m["id"].as_str() != Some(id)).unwrap();
    assert!(later["start_unix_ns"].as_u64() > meta["start_unix_ns"].as_u64(), "{list:?}");
    let p = raw_profile(&sc.dir.join("store").join(format!("{}.json", later["id"].as_str().unwrap())));
    assert_eq!(generation(&p).as_deref(), Some("1"), "generation 1's profile: {}", p["args"]);
    assert_eq!(sc.outcomes()[1..], [0.0, 0.0, 0.0], "{}", sc.d.log());
    sc.finish();
}

/// witchd watching one `daemon_exec` program (built as `NAME_PID`, run with
/// `args`, its stdin and stdout piped), profiling it for 8 s every 10 s, with
/// its `dead` sessions' outcomes read from the metrics.
struct ExecScene {
    dir: PathBuf,
    witch: PathBuf,
    name: String,
    child: Child,
    pid: u32,
    d: Witchd,
    socket: PathBuf,
    http: String,
    /// Last, so that it is dropped after witchd and the program.
    _dir: Scratch,
}

impl ExecScene {
    fn start(tag: &str, args: &[&str]) -> ExecScene {
        let dir = Scratch::new(&format!("daemon-{tag}"));
        let witch = witch_bin();
        let name = format!("daemon_{tag}_{}", std::process::id());
        let prog = Program::build_with("daemon_exec", dir.path(), &name, &[]).unwrap_or_else(|e| panic!("{e}"));
        let child = Command::new(&prog.exe).args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        let pid = child.id();
        let (d, socket, http) = witchd_watching(
            &dir,
            &witch,
            "scan_every = \"200ms\"\n",
            &format!("exe = \"{name}\"\ncrafts = [\"dead\"]\nevery = \"10s\"\nduration = \"8s\"\n"),
        );
        // The session is under way once the agent's thread is in the program.
        wait_for(Duration::from_secs(30), || agents_in(&[pid]) == 1, || d.log());
        ExecScene { dir: dir.path().to_path_buf(), _dir: dir, witch, name, child, pid, d, socket, http }
    }

    /// Sessions that ended ok, target_exited, failed, target_exec.
    fn outcomes(&self) -> [f64; 4] {
        let m = parse_prometheus(&String::from_utf8(http_get(&self.http, "/metrics").1).unwrap());
        ["ok", "target_exited", "failed", "target_exec"]
            .map(|o| metric(&m, "witchd_sessions_total", &[("outcome", o)]).map_or(0.0, |s| s.value))
    }

    /// Sends `command` to the program; returns when some session has ended,
    /// with the time that took.
    fn exec(&mut self, command: &str) -> Duration {
        let at = Instant::now();
        self.child.stdin.as_mut().unwrap().write_all(command.as_bytes()).unwrap();
        wait_for(Duration::from_secs(30), || self.outcomes().iter().sum::<f64>() > 0.0, || self.d.log());
        at.elapsed()
    }

    /// `witch client ARGS --json` against this witchd, parsed.
    fn client_json(&self, args: &[&str]) -> serde_json::Value {
        json(&client(&self.witch, &[], &self.socket, args))
    }

    /// witchd stops cleanly, and the program, run on as its new image, ends
    /// as it would have.
    fn finish(mut self) {
        let (st, _) = self.d.term(Duration::from_secs(30));
        assert_eq!(st.code(), Some(0), "{}", self.d.log());
        drop(self.child.stdin.take());
        let out = self.child.wait_with_output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "generation 1 ran rounds\n");
        assert_eq!(out.status.code(), Some(5));
    }
}

/// A debugger that attaches to a profiled program makes the agent end the
/// session by itself and hand over its profile: witchd takes it then,
/// instead of holding the session's slot for the rest of its duration (20 s
/// here), and the program runs on under its debugger.
#[test]
fn a_session_a_debugger_ends_is_taken_at_once() {
    let dir = Scratch::new("daemon-traced");
    let witch = witch_bin();
    let name = format!("daemon_traced_{}", std::process::id());
    let prog = Program::build_with("daemon_dead", dir.path(), &name, &[]).unwrap_or_else(|e| panic!("{e}"));
    let tracer = Program::build("tracer", dir.path());
    let target = Target::start(&prog.exe, &["0"], &[]);
    let pid = target.pid();
    let (mut d, socket, http) = witchd_watching(
        &dir,
        &witch,
        "scan_every = \"200ms\"\n",
        &format!("exe = \"{name}\"\ncrafts = [\"dead\"]\nevery = \"60s\"\nduration = \"20s\"\n"),
    );
    let ok = || {
        let m = parse_prometheus(&String::from_utf8(http_get(&http, "/metrics").1).unwrap());
        metric(&m, "witchd_sessions_total", &[("outcome", "ok")]).map_or(0.0, |s| s.value)
    };
    wait_for(Duration::from_secs(30), || agents_in(&[pid]) == 1, || d.log());
    std::thread::sleep(Duration::from_millis(500));
    let mut holder = Command::new(&tracer.exe).args([&pid.to_string(), "8"]).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(holder.stdout.take().unwrap()), &mut line).unwrap();
    assert_eq!(line, "tracing\n");
    let traced_at = Instant::now();
    wait_for(Duration::from_secs(25), || ok() >= 1.0, || d.log());
    let took = traced_at.elapsed();
    eprintln!("[witch-tests] the session ended {took:?} after the debugger attached");
    assert!(took < Duration::from_secs(5), "witchd held the session {took:?} after the agent ended it\n{}", d.log());
    let list = json(&client(&witch, &[], &socket, &["list", "--pid", &pid.to_string(), "--json"]));
    let stored = list.as_array().unwrap();
    assert_eq!(stored.len(), 1, "{list}");
    assert_eq!(stored[0]["target_exited"], false, "{list}");
    let profile = std::fs::read_dir(dir.join("store"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(".json") && !p.to_string_lossy().ends_with(".meta.json"))
        .expect("a stored profile");
    assert_eq!(raw_profile(&profile)["ended_by"], "traced", "{}", profile.display());
    assert!(holder.wait().unwrap().success());
    let (st, _) = d.term(Duration::from_secs(30));
    assert_eq!(st.code(), Some(0), "{}", d.log());
    let Finished { rounds, status, .. } = target.finish();
    assert!(rounds > 0 && status.code() == Some(5), "the program ran on: {rounds} rounds, {status:?}");
}

/// An exec with address randomization off (`setarch -R`): the new image is
/// laid out as the old one was (same file, arguments of the same length),
/// so only the agent's socket closing and the agent missing from the maps
/// tell. witchd saw that only when the session's time was up (8 s here);
/// its poll now asks as `witch --pid`'s does, and ends the session within a
/// poll of the socket closing.
#[test]
fn an_exec_that_keeps_the_layout_ends_the_session_within_a_poll() {
    let Some(setarch) = which("setarch") else {
        eprintln!("[witch-tests] no setarch: no case without address randomization");
        return;
    };
    let dir = Scratch::new("daemon-exec-norandom");
    let witch = witch_bin();
    let name = format!("daemon_exec_r_{}", std::process::id());
    let prog = Program::build_with("daemon_exec", dir.path(), &name, &[]).unwrap_or_else(|e| panic!("{e}"));
    // Generation 5 execs generation 6: arguments of one length.
    let mut child =
        Command::new(setarch).args(["x86_64", "-R"]).arg(&prog.exe).arg("5").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let (mut d, _socket, http) = witchd_watching(
        &dir,
        &witch,
        "scan_every = \"200ms\"\n",
        &format!("exe = \"{name}\"\ncrafts = [\"dead\"]\nevery = \"30s\"\nduration = \"8s\"\n"),
    );
    let outcomes = || {
        let m = parse_prometheus(&String::from_utf8(http_get(&http, "/metrics").1).unwrap());
        ["ok", "target_exited", "failed", "target_exec"]
            .map(|o| metric(&m, "witchd_sessions_total", &[("outcome", o)]).map_or(0.0, |s| s.value))
    };
    let layout =
        || std::fs::read_to_string(format!("/proc/{pid}/stat")).map(|s| s.split(' ').skip(25).take(3).collect::<Vec<_>>().join(" "));
    wait_for(Duration::from_secs(30), || agents_in(&[pid]) == 1, || d.log());
    std::thread::sleep(Duration::from_millis(300));
    let layout_before = layout().ok();
    let exec_at = Instant::now();
    child.stdin.as_mut().unwrap().write_all(b"e\n").unwrap();
    wait_for(Duration::from_secs(30), || outcomes().iter().sum::<f64>() > 0.0, || d.log());
    let took = exec_at.elapsed();
    let same = layout().ok() == layout_before;
    let log = d.log();
    eprintln!("[witch-tests] the session ended {took:?} after the exec (code, stack laid out {})", if same { "as before" } else { "anew" });
    assert_eq!(outcomes(), [0.0, 0.0, 0.0, 1.0], "outcomes ok, target_exited, failed, target_exec\n{log}");
    assert!(log.contains(&format!("pid {pid} ({name}) replaced its program (exec)")), "{log}");
    assert!(took < Duration::from_secs(3), "the session ended only {took:?} after the exec\n{log}");
    let (st, _) = d.term(Duration::from_secs(30));
    assert_eq!(st.code(), Some(0), "{}", d.log());
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!((String::from_utf8_lossy(&out.stdout).as_ref(), out.status.code()), ("generation 6 ran rounds\n", Some(5)));
}
