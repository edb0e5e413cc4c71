//! Debug files from a debuginfod server, as distributions serve them.
//!
//! The server is `tests/programs/debuginfod_server.py`, a few lines of
//! Python's `http.server` that answer the protocol's `GET
//! /buildid/<hex>/debuginfo` from a directory, on 127.0.0.1 at a port the
//! system picks (elfutils' own `debuginfod` would be the real thing, but its
//! package adds minutes of apt to CI for what this one request exercises).
//!
//! The program is dead_loop.c built with -g, its DWARF split off
//! (`objcopy --only-keep-debug`, `strip -g`) and put only on the server.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use witch_tests::*;

/// The test's debuginfod server (`debuginfod_server.py`), serving `dir`.
struct TestServer {
    child: Child,
    url: String,
    /// The request lines it printed ("404 /buildid/.../debuginfo").
    log: mpsc::Receiver<String>,
}

impl TestServer {
    fn start(dir: &Path) -> TestServer {
        let mut child = Command::new("python3")
            .arg(programs_dir().join("debuginfod_server.py"))
            .arg(dir)
            .arg("60")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let port: u16 = lines.next().expect("the server's port").unwrap().trim().parse().unwrap();
        let (tx, log) = mpsc::channel();
        std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        TestServer { child, url: format!("http://127.0.0.1:{port}"), log }
    }

    /// The requests answered so far.
    fn requests(&self) -> Vec<String> {
        // Each answer is printed before the response is complete; give the
        // line a moment to arrive.
        std::thread::sleep(Duration::from_millis(50));
        self.log.try_iter().collect()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Setup {
    dir: Scratch,
    prog: Program,
    profile: PathBuf,
    build_id: String,
    /// The directory the server serves (`<build-id>.debug`).
    served: PathBuf,
    debug: PathBuf,
}

fn setup(tag: &str) -> Setup {
    let dir = Scratch::new(tag);
    let prog = Program::build_with("dead_loop", dir.path(), "dead_loop", &["-Wl,--build-id"]).unwrap();
    let debug = dir.join("dead_loop.debug");
    let ok = |c: &mut Command| assert!(c.status().unwrap().success(), "{c:?}");
    ok(Command::new("objcopy").arg("--only-keep-debug").arg(&prog.exe).arg(&debug));
    ok(Command::new("strip").arg("-g").arg(&prog.exe));
    let notes = Command::new("readelf").arg("-n").arg(&prog.exe).output().unwrap();
    let build_id = String::from_utf8_lossy(&notes.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_string))
        .expect("a build-id");
    let served = dir.join("served");
    std::fs::create_dir_all(&served).unwrap();

    // Profiled without any debug info around: the profile has addresses only.
    let profile = dir.join("dead.json");
    let run = WitchCmd::new("dead").args(&["-q", "-p", "100000"]).out(&profile).run(&prog.exe, &["60"]);
    assert_eq!(run.code(), Some(3), "{}", run.describe());
    Setup { dir, prog, profile, build_id, served, debug }
}

/// `witch report --json` of the setup's profile with these variables (and no
/// debug root but an empty one: the program's debug file is on no disk path).
fn report_env(s: &Setup, env: &[(&str, &str)]) -> (Run, Value) {
    let mut cmd = Command::new(witch_bin());
    cmd.arg("report").arg(&s.profile).arg("--json").env("WITCH_DEBUG_DIRS", s.dir.join("no-debug-root"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let r = run_cmd(cmd, None);
    assert!(r.status.success(), "{}", r.describe());
    let v = serde_json::from_slice(&r.stdout).unwrap_or_else(|e| panic!("{e}\n{}", r.describe()));
    (r, v)
}

/// Does any frame of any pair carry a line of dead_loop.c?
fn has_program_lines(v: &Value) -> bool {
    v["pairs"].as_array().unwrap().iter().any(|p| {
        ["watch", "trap"].iter().any(|side| frames(p, side).iter().any(|f| frame_in_file(f, "dead_loop.c") && frame_line(f).is_some()))
    })
}

fn notes(v: &Value) -> String {
    v["notes"].as_array().unwrap().iter().filter_map(Value::as_str).collect::<Vec<_>>().join("\n")
}

#[test]
fn lines_come_from_the_server_then_from_its_cache() {
    let s = setup("debuginfod");
    let (w, k) = (s.prog.line("@w"), s.prog.line("@k"));
    std::fs::copy(&s.debug, s.served.join(format!("{}.debug", s.build_id))).unwrap();
    let cache = s.dir.join("cache");
    let cache_s = cache.to_str().unwrap();

    // Off without DEBUGINFOD_URLS: no lines, and nothing said about it.
    let (_, v) = report_env(&s, &[("DEBUGINFOD_CACHE_PATH", cache_s)]);
    assert!(!has_program_lines(&v), "lines without the debug file?\n{v}");
    assert!(!notes(&v).contains("debuginfod"), "{}", notes(&v));
    assert!(!cache.exists(), "the cache was touched with debuginfod off");

    // On: the debug file comes from the server, the top pair has its lines.
    let server = TestServer::start(&s.served);
    let url = server.url.clone();
    let env = [("DEBUGINFOD_URLS", url.as_str()), ("DEBUGINFOD_CACHE_PATH", cache_s), ("DEBUGINFOD_TIMEOUT", "5")];
    let (r, v) = report_env(&s, &env);
    assert!(has_program_lines(&v), "no lines with the server up\n{}", r.describe());
    // <@w, @k> and <@k, @w> are worth the same (each loop's stores are killed
    // by the other's), so either may rank first.
    let top2: Vec<&Value> = v["pairs"].as_array().unwrap().iter().take(2).collect();
    assert!(
        top2.iter().any(|p| side_at(p, "watch", "dead_loop.c", w) && side_at(p, "trap", "dead_loop.c", k)),
        "<@w, @k> not among the top two pairs:\n{top2:?}"
    );
    assert!(notes(&v).contains("debug info of 1 module came from debuginfod (1 downloaded"), "{}", notes(&v));
    let asked = server.requests();
    assert!(asked.contains(&format!("200 /buildid/{}/debuginfo", s.build_id)), "{asked:?}");
    // In elfutils' layout, so gdb and perf find it (and witch finds theirs).
    let cached = cache.join(&s.build_id).join("debuginfo");
    assert_eq!(std::fs::read(&cached).unwrap(), std::fs::read(&s.debug).unwrap());

    // The text report says it in one line.
    let mut cmd = Command::new(witch_bin());
    cmd.arg("report").arg(&s.profile).env("WITCH_DEBUG_DIRS", s.dir.join("no-debug-root"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let t = run_cmd(cmd, None);
    let text = t.stdout_str();
    assert_eq!(text.lines().filter(|l| l.contains("note:") && l.contains("debuginfod")).count(), 1, "{text}");
    assert!(text.contains("came from debuginfod (0 downloaded, 1 from the"), "{text}");

    // The server gone, the cache still serves.
    drop(server);
    let (r, v) = report_env(&s, &env);
    assert!(has_program_lines(&v), "the cached debug file was not used\n{}", r.describe());
    assert!(notes(&v).contains("0 downloaded, 1 from the cache"), "{}", notes(&v));
}

#[test]
fn a_miss_is_cached_and_a_dead_or_hostile_server_is_one_warning() {
    let s = setup("debuginfod-miss");
    let id = &s.build_id;
    let server = TestServer::start(&s.served);
    let url = server.url.clone();
    let cache = s.dir.join("cache");
    let cache_s = cache.to_str().unwrap();
    let env = [("DEBUGINFOD_URLS", url.as_str()), ("DEBUGINFOD_CACHE_PATH", cache_s), ("DEBUGINFOD_TIMEOUT", "5")];

    // 404: no lines, an empty file in the cache, and no second request.
    let (r, v) = report_env(&s, &env);
    assert!(!has_program_lines(&v));
    let asked = server.requests();
    assert_eq!(
        asked.iter().filter(|l| l.contains(id.as_str())).collect::<Vec<_>>(),
        [&format!("404 /buildid/{id}/debuginfo")],
        "{}",
        r.describe()
    );
    assert_eq!(std::fs::metadata(cache.join(id).join("debuginfo")).unwrap().len(), 0);
    let (r, _) = report_env(&s, &env);
    let again = server.requests();
    assert!(!again.iter().any(|l| l.contains(id.as_str())), "a cached miss was asked again: {again:?}\n{}", r.describe());
    assert!(r.stderr_str().is_empty(), "a miss is no failure: {}", r.describe());

    // A file of another build under the right name is refused, with a warning.
    std::fs::copy(witch_bin(), s.served.join(format!("{id}.debug"))).unwrap();
    let fresh = s.dir.join("cache2");
    let env2 = [("DEBUGINFOD_URLS", url.as_str()), ("DEBUGINFOD_CACHE_PATH", fresh.to_str().unwrap()), ("DEBUGINFOD_TIMEOUT", "5")];
    let (r, v) = report_env(&s, &env2);
    assert!(!has_program_lines(&v));
    assert!(r.stderr_str().contains("another build") || r.stderr_str().contains("not ELF"), "{}", r.describe());
    assert!(!fresh.join(id).join("debuginfo").exists(), "a refused file was cached");

    // Bigger than DEBUGINFOD_MAXSIZE: not downloaded.
    std::fs::copy(&s.debug, s.served.join(format!("{id}.debug"))).unwrap();
    let mut small = env2.to_vec();
    small.push(("DEBUGINFOD_MAXSIZE", "1000"));
    let (r, v) = report_env(&s, &small);
    assert!(!has_program_lines(&v));
    assert!(r.stderr_str().contains("more than the 1000 bytes"), "{}", r.describe());
    drop(server);

    // A server that accepts connections and never answers, and one that
    // refuses them: a warning each within the timeout, once per run (not per
    // module), the report made without them, and no miss remembered.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let refused_url = format!("http://127.0.0.1:{}", refused.local_addr().unwrap().port());
    drop(refused);
    let urls = format!("http://127.0.0.1:{} {refused_url}", silent.local_addr().unwrap().port());
    let fresh = s.dir.join("cache3");
    let t = Instant::now();
    let (r, v) =
        report_env(&s, &[("DEBUGINFOD_URLS", &urls), ("DEBUGINFOD_CACHE_PATH", fresh.to_str().unwrap()), ("DEBUGINFOD_TIMEOUT", "1")]);
    let took = t.elapsed();
    assert!(took < Duration::from_secs(4), "the report took {took:?} with a timeout of 1 s\n{}", r.describe());
    let err = r.stderr_str();
    assert_eq!(err.lines().filter(|l| l.contains("no answer within 1 s")).count(), 1, "{}", r.describe());
    assert_eq!(err.lines().filter(|l| l.contains(&refused_url)).count(), 1, "{}", r.describe());
    assert_eq!(err.lines().count(), 2, "{}", r.describe());
    assert!(notes(&v).contains("debuginfod failed"), "{}", notes(&v));
    assert!(!fresh.join(id).join("debuginfo").exists(), "a timeout was cached as a miss");
    drop(silent);
}
