//! Harness for witch's end-to-end tests.
//!
//! The tests in `tests/tests/*.rs` build small C programs from
//! `tests/programs/` with `gcc -O2 -g` into a scratch directory, run them
//! natively and under the real `witch` binary, and check the profile (through
//! `witch report FILE --json`) against answers known by construction.
//!
//! The `witch` binary is taken from `$WITCH_BIN`, else from the target
//! directory of the test executable (`target/<profile>/witch`, with the agent
//! `libwitch_agent.so` beside it). Build it first with `cargo build --workspace`
//! using the same profile as the tests.
//!
//! # The test programs (`tests/programs/*.c`)
//!
//! Small C programs whose answers are known by construction, built by the tests
//! with `gcc -O2 -g` and run natively and under `witch`. Source lines that the
//! tests look for carry a marker comment such as `/* @w */`; the tests find the
//! line number by searching for the exact marker text, so moving code around is
//! safe as long as the markers move with it.
//!
//! ## Why the loops look like `a[i] = c = nxt[c];`
//!
//! The sampler on machines without a memory PMU is a per-thread `task-clock`
//! timer: it interrupts the program every P nanoseconds of CPU time and decodes
//! the instruction at (or, allowing for skid, just before) the interrupted PC.
//! Four things shape these programs:
//!
//! 1. **Where the interrupt lands.** On out-of-order x86 cores the interrupted PC
//!    is almost always the instruction right *after* the one that was stalling
//!    retirement. In a plain store loop (`a[i] = v;`) that is the `cmp` after the
//!    store, so a store sampler sees almost no stores (measured with
//!    `perf record -e task-clock`: <2% of interrupts on the store). Putting a
//!    load with a serial dependency right before each store (`c = nxt[c]`, a
//!    pointer chase through a small table that stays in L1) makes the store the
//!    interrupted instruction for ~95% of interrupts. For loads (LoadCraft) the
//!    same holds: the sampled load must come right after a load it depends on
//!    (redundant_load.c chases two loads per iteration and gets about half of
//!    all interrupts on the second one).
//! 2. **Time, not counts.** The software sampler is time-proportional, so lines
//!    that the tests compare must cost the same time per access. With the chase,
//!    every statement costs one L1 load latency, whatever it stores to; measured
//!    per-line store samples for Listing 4.3 come out at 25/25/24/25%.
//! 3. **Recomputable addresses.** A watchpoint trap arrives after the access,
//!    and the engine may check the recovered instruction by recomputing its
//!    address from the registers. A watched load like `mov (%rcx,%rdx,8),%rdx`
//!    destroys its own address register, so the watched loads here are written
//!    so that gcc gives them another destination register.
//! 4. **Skid look-back.** witch's software sampler looks back a few
//!    instructions of straight-line code from the interrupted PC for an
//!    access of the craft's kind, and otherwise takes the instruction at the
//!    PC. In these loops the look-back from a store crosses only the chase
//!    load and stops at the loop head (a branch target), so both readings
//!    credit the same store. Listing 4.3's k loop has two stores in one
//!    iteration; a never-taken branch between them keeps the look-back from
//!    crediting `*q`'s time to `*p`. Checked by replaying the same perf
//!    samples through a model of the look-back: same per-line shares.
//!
//! All variables are `long` and all indices `long` so that gcc does not place a
//! sign extension between the load and the store; `volatile` keeps gcc -O2 from
//! vectorizing, turning loops into `memset`, or deleting dead stores. Where the
//! base is a pointer rather than a global array (threads_dead.c), gcc puts the
//! pointer increment between load and store; an empty `asm volatile` after the
//! store keeps the store in place. All of this was checked with gcc 12 by
//! `perf record -e task-clock -c 100000` on the built programs: 95-99% of the
//! interrupts land on the intended store (about 50% on the intended load).
//!
//! Each program prints a checksum on stdout and exits with a fixed nonzero
//! status, so the tests can check that witch leaves both untouched.
//!
//! Environment knobs:
//! - `WITCH_BIN`: path of the witch binary to test.
//! - `WITCHD_BIN`: path of the witchd daemon to test (default: beside witch).
//! - `WITCH_TESTS_KEEP=1`: keep scratch directories (they are always kept,
//!   and their path printed, when a test fails).
//! - `WITCH_TESTS_TIMEOUT`: seconds before a run is killed (default 300).

pub mod attach;

use serde_json::Value;
use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Locating binaries and sources
// ---------------------------------------------------------------------------

/// File names the preload agent has gone by, beside the witch binary.
pub const AGENT_NAMES: [&str; 2] = ["libwitch_agent.so", "libwitchcraft.so"];

/// The agent beside a witch binary, if there is one.
pub fn agent_beside(witch: &Path) -> Option<PathBuf> {
    let dir = witch.parent()?;
    AGENT_NAMES.iter().map(|n| dir.join(n)).find(|p| p.is_file())
}

/// The witch binary under test: `$WITCH_BIN`, else `<dir of the test exe>/../witch`
/// (test executables live in `target/<profile>/deps/`).
pub fn witch_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("WITCH_BIN") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "WITCH_BIN={} does not exist", p.display());
        return p;
    }
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("unexpected test executable location {}", exe.display()))
        .to_path_buf();
    let witch = profile_dir.join("witch");
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    let how = format!(
        "run `cargo build --workspace{}` first (same profile as the tests), or set WITCH_BIN",
        if release { " --release" } else { "" }
    );
    assert!(witch.is_file(), "witch binary not found at {}: {how}", witch.display());
    assert!(
        std::env::var_os("WITCH_AGENT").is_some() || agent_beside(&witch).is_some(),
        "the preload agent ({}) is not beside {}: {how}",
        AGENT_NAMES.join(" or "),
        witch.display()
    );
    witch
}

/// The witchd daemon binary: `$WITCHD_BIN`, else beside the witch binary.
pub fn witchd_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("WITCHD_BIN") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "WITCHD_BIN={} does not exist", p.display());
        return p;
    }
    let witch = witch_bin();
    let witchd = witch.with_file_name("witchd");
    assert!(
        witchd.is_file(),
        "witchd binary not found at {}: run `cargo build --workspace` with the tests' profile, or set WITCHD_BIN",
        witchd.display()
    );
    witchd
}

/// `tests/programs/`.
pub fn programs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("programs")
}

// ---------------------------------------------------------------------------
// Scratch directories
// ---------------------------------------------------------------------------

static SCRATCH_SEQ: AtomicUsize = AtomicUsize::new(0);

/// A temporary directory, removed on drop unless the test failed or
/// `WITCH_TESTS_KEEP` is set.
pub struct Scratch {
    path: PathBuf,
}

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let n = SCRATCH_SEQ.fetch_add(1, Ordering::SeqCst);
        let path = std::env::temp_dir().join(format!("witch-tests-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        Scratch { path }
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("WITCH_TESTS_KEEP").is_some() {
            eprintln!("[witch-tests] keeping {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

// ---------------------------------------------------------------------------
// Test programs
// ---------------------------------------------------------------------------

/// A C program from `tests/programs/`, built into a scratch directory.
pub struct Program {
    /// Source file name, e.g. `dead_loop.c`; frames are matched against it.
    pub file: String,
    pub src: PathBuf,
    pub exe: PathBuf,
    text: String,
}

impl Program {
    /// Build `tests/programs/<name>.c` with `gcc -O2 -g` into `dir/<name>`.
    pub fn build(name: &str, dir: &Path) -> Program {
        Self::build_with(name, dir, name, &[]).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Build with extra gcc flags into `dir/<out_name>`; Err carries gcc's output.
    pub fn build_with(name: &str, dir: &Path, out_name: &str, extra: &[&str]) -> Result<Program, String> {
        let src = programs_dir().join(format!("{name}.c"));
        let text = std::fs::read_to_string(&src).map_err(|e| format!("read {}: {e}", src.display()))?;
        let exe = dir.join(out_name);
        let out = Command::new("gcc")
            .args(["-O2", "-g", "-o"])
            .arg(&exe)
            .arg(&src)
            .args(extra)
            .arg("-lpthread")
            .output()
            .map_err(|e| format!("cannot run gcc: {e}"))?;
        if !out.status.success() {
            return Err(format!("gcc {} {:?} failed ({}):\n{}", src.display(), extra, out.status, String::from_utf8_lossy(&out.stderr)));
        }
        Ok(Program { file: format!("{name}.c"), src, exe, text })
    }

    /// Build `programs/<name>.rs` with rustc (optimized, with line tables)
    /// into `dir/<name>`: the linker and layout Rust programs really get.
    pub fn build_rust(name: &str, dir: &Path) -> Program {
        let src = programs_dir().join(format!("{name}.rs"));
        let text = std::fs::read_to_string(&src).unwrap_or_else(|e| panic!("read {}: {e}", src.display()));
        let exe = dir.join(name);
        let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
        let out = Command::new(rustc)
            .args(["-C", "opt-level=2", "-g", "-o"])
            .arg(&exe)
            .arg(&src)
            .output()
            .unwrap_or_else(|e| panic!("cannot run rustc: {e}"));
        assert!(out.status.success(), "rustc {} failed ({}):\n{}", src.display(), out.status, String::from_utf8_lossy(&out.stderr));
        Program { file: format!("{name}.rs"), src, exe, text }
    }

    /// Line number (1-based) of the one source line carrying `/* <marker> */`.
    pub fn line(&self, marker: &str) -> u32 {
        let needle = format!("/* {marker} */");
        let hits: Vec<u32> = self.text.lines().enumerate().filter(|(_, l)| l.contains(&needle)).map(|(i, _)| i as u32 + 1).collect();
        assert_eq!(hits.len(), 1, "marker {needle} must occur on exactly one line of {}: {hits:?}", self.src.display());
        hits[0]
    }

    /// Run the program natively.
    pub fn run_native(&self, args: &[&str]) -> Run {
        let mut cmd = Command::new(&self.exe);
        cmd.args(args);
        run_cmd(cmd, None)
    }

    pub fn run_native_stdin(&self, args: &[&str], stdin: &[u8]) -> Run {
        let mut cmd = Command::new(&self.exe);
        cmd.args(args);
        run_cmd(cmd, Some(stdin))
    }
}

// ---------------------------------------------------------------------------
// Running processes
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Running witch
// ---------------------------------------------------------------------------

/// Builder for `witch <craft> [OPTIONS] -- PROGRAM [ARGS...]`.
pub struct WitchCmd {
    craft: String,
    opts: Vec<OsString>,
    stdin: Option<Vec<u8>>,
    wrapper: Vec<OsString>,
    witch: PathBuf,
}

impl WitchCmd {
    pub fn new(craft: &str) -> WitchCmd {
        WitchCmd { craft: craft.into(), opts: vec![], stdin: None, wrapper: vec![], witch: witch_bin() }
    }
    /// Use another witch binary (e.g. a copy readable by an unprivileged user).
    pub fn witch(mut self, path: &Path) -> Self {
        self.witch = path.to_path_buf();
        self
    }
    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Self {
        self.opts.push(a.as_ref().to_os_string());
        self
    }
    pub fn args<S: AsRef<OsStr>>(mut self, args: &[S]) -> Self {
        self.opts.extend(args.iter().map(|a| a.as_ref().to_os_string()));
        self
    }
    /// `-o FILE`.
    pub fn out(self, path: &Path) -> Self {
        self.arg("-o").arg(path)
    }
    pub fn stdin(mut self, bytes: &[u8]) -> Self {
        self.stdin = Some(bytes.to_vec());
        self
    }
    /// Run witch under a wrapper command, e.g. `setpriv ... --`.
    pub fn wrapper<S: AsRef<OsStr>>(mut self, prefix: &[S]) -> Self {
        self.wrapper = prefix.iter().map(|a| a.as_ref().to_os_string()).collect();
        self
    }
    pub fn run(self, program: &Path, args: &[&str]) -> Run {
        let mut cmd = if let Some((first, rest)) = self.wrapper.split_first() {
            let mut c = Command::new(first);
            c.args(rest).arg(&self.witch);
            c
        } else {
            Command::new(&self.witch)
        };
        cmd.arg(&self.craft).args(&self.opts).arg("--").arg(program).args(args);
        let r = run_cmd(cmd, self.stdin.as_deref());
        eprintln!("[witch-tests] {:.2}s: {}", r.elapsed.as_secs_f64(), r.cmdline);
        r
    }
}

/// Run witch with raw arguments (for error cases and subcommands).
pub fn witch_raw<S: AsRef<OsStr>>(args: &[S]) -> Run {
    let mut cmd = Command::new(witch_bin());
    cmd.args(args);
    run_cmd(cmd, None)
}

/// Asserts that a run under witch behaved exactly like the native run:
/// same stdout bytes, same exit status (code or signal).
pub fn assert_same_behaviour(native: &Run, witched: &Run) {
    assert_eq!(
        (native.code(), native.signal()),
        (witched.code(), witched.signal()),
        "exit status under witch differs from the native run\nnative:\n{}\nwitch:\n{}",
        native.describe(),
        witched.describe()
    );
    assert!(
        native.stdout == witched.stdout,
        "stdout under witch differs from the native run\nnative:\n{}\nwitch:\n{}",
        native.describe(),
        witched.describe()
    );
}

// ---------------------------------------------------------------------------
// Reports
// ---------------------------------------------------------------------------

/// The parsed output of `witch report FILE --json`.
pub struct Report {
    pub json: Value,
    pub path: PathBuf,
}

/// Run `witch report FILE --json` and parse its one JSON object.
pub fn report(profile: &Path) -> Report {
    assert!(profile.is_file(), "profile {} was not written", profile.display());
    let r = witch_raw(&[OsStr::new("report"), profile.as_os_str(), OsStr::new("--json")]);
    assert!(r.status.success(), "witch report failed:\n{}", r.describe());
    let json: Value = serde_json::from_slice(&r.stdout)
        .unwrap_or_else(|e| panic!("witch report --json did not print one JSON object: {e}\n{}", r.describe()));
    assert!(json.is_object(), "witch report --json printed a non-object:\n{}", r.describe());
    Report { json, path: profile.to_path_buf() }
}

/// Parse a raw profile file (the format of witchcraft/src/profile.rs).
pub fn raw_profile(path: &Path) -> Value {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_slice(&b).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// Waste and use summed over the pairs selected by some filter.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sum {
    pub waste: f64,
    pub r#use: f64,
    /// How many pairs matched.
    pub count: usize,
    /// Index in the report's pair list (sorted by waste, descending) of the
    /// first matching pair.
    pub best_rank: Option<usize>,
}

impl Sum {
    /// waste / (waste + use), 0 when both are 0.
    pub fn fraction(&self) -> f64 {
        if self.waste + self.r#use > 0.0 {
            self.waste / (self.waste + self.r#use)
        } else {
            0.0
        }
    }
}

/// How many frames, innermost first, a context is searched for a source line.
/// The innermost frame should carry it; the next two are searched too, for
/// robustness to inlined frames.
pub const MATCH_DEPTH: usize = 3;

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

/// Frames of one side (`"watch"` or `"trap"`) of a pair, innermost first.
pub fn frames<'a>(pair: &'a Value, side: &str) -> &'a [Value] {
    pair[side]["frames"].as_array().map(Vec::as_slice).unwrap_or(&[])
}

/// Does the frame name source `file` (a bare file name such as `dead_loop.c`)?
pub fn frame_in_file(frame: &Value, file: &str) -> bool {
    match frame["file"].as_str() {
        Some(f) => f == file || f.ends_with(&format!("/{file}")),
        None => false,
    }
}

pub fn frame_line(frame: &Value) -> Option<u64> {
    frame["line"].as_u64()
}

/// Is `file:line` among the first [`MATCH_DEPTH`] frames of this side of the pair?
pub fn side_at(pair: &Value, side: &str, file: &str, line: u32) -> bool {
    frames(pair, side).iter().take(MATCH_DEPTH).any(|f| frame_in_file(f, file) && frame_line(f) == Some(line as u64))
}

fn fmt_frames(fr: &[Value]) -> String {
    let mut s = String::new();
    for (i, f) in fr.iter().take(4).enumerate() {
        if i > 0 {
            s.push_str(" <- ");
        }
        let func = f["function"].as_str().unwrap_or("?");
        let file = f["file"].as_str().map(|p| p.rsplit('/').next().unwrap_or(p)).unwrap_or("?");
        match f["line"].as_u64() {
            Some(l) => {
                let _ = write!(s, "{func} {file}:{l}");
            }
            None => {
                let _ = write!(s, "{func} {file}:?");
            }
        }
    }
    if fr.len() > 4 {
        let _ = write!(s, " <- ... ({} frames)", fr.len());
    }
    s
}

impl Report {
    fn field(&self, key: &str) -> f64 {
        self.json[key].as_f64().unwrap_or_else(|| panic!("report has no numeric `{key}`\n{}", self.dump()))
    }
    pub fn waste_fraction(&self) -> f64 {
        self.field("waste_fraction")
    }
    pub fn waste_bytes(&self) -> f64 {
        self.field("waste_bytes")
    }
    pub fn use_bytes(&self) -> f64 {
        self.field("use_bytes")
    }
    pub fn approx_waste_bytes(&self) -> f64 {
        self.field("approx_waste_bytes")
    }
    pub fn samples(&self) -> f64 {
        self.field("samples")
    }
    pub fn program(&self) -> String {
        self.json["program"].as_str().unwrap_or("").to_string()
    }
    pub fn craft(&self) -> String {
        self.json["craft"].as_str().unwrap_or("").to_string()
    }
    pub fn pairs(&self) -> &[Value] {
        self.json["pairs"].as_array().map(Vec::as_slice).unwrap_or(&[])
    }

    /// Sum the pairs accepted by `pred`.
    pub fn sum_where(&self, pred: impl Fn(&Value) -> bool) -> Sum {
        let mut s = Sum::default();
        for (i, p) in self.pairs().iter().enumerate() {
            if pred(p) {
                s.waste += num(&p["waste_bytes"]);
                s.r#use += num(&p["use_bytes"]);
                s.count += 1;
                s.best_rank.get_or_insert(i);
            }
        }
        s
    }

    /// The pairs ⟨file:watch, file:trap⟩.
    pub fn pair(&self, file: &str, watch: u32, trap: u32) -> Sum {
        self.sum_where(|p| side_at(p, "watch", file, watch) && side_at(p, "trap", file, trap))
    }

    /// Every pair whose watch context is at file:watch, whatever the trap.
    pub fn watched_at(&self, file: &str, watch: u32) -> Sum {
        self.sum_where(|p| side_at(p, "watch", file, watch))
    }

    /// Share of all waste that went to ⟨file:watch, file:trap⟩.
    pub fn share(&self, file: &str, watch: u32, trap: u32) -> f64 {
        let total = self.waste_bytes();
        if total > 0.0 {
            self.pair(file, watch, trap).waste / total
        } else {
            0.0
        }
    }

    /// The first (largest) pair ⟨file:watch, file:trap⟩, if any.
    pub fn first_pair(&self, file: &str, watch: u32, trap: u32) -> Option<&Value> {
        self.pairs().iter().find(|p| side_at(p, "watch", file, watch) && side_at(p, "trap", file, trap))
    }

    /// Print the headline figures and `extra` (shown with `--nocapture`), so
    /// passing runs also tell how close they came to their thresholds.
    pub fn note(&self, extra: &str) {
        eprintln!(
            "[witch-tests] {}: samples {} traps {} waste_fraction {:.3} approx {:.3e} / waste {:.3e}; {extra}",
            self.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            self.json["samples"],
            self.json["traps"],
            self.json["waste_fraction"].as_f64().unwrap_or(f64::NAN),
            self.json["approx_waste_bytes"].as_f64().unwrap_or(f64::NAN),
            self.json["waste_bytes"].as_f64().unwrap_or(f64::NAN),
        );
    }

    /// Fails unless the profile holds at least `min` samples.
    pub fn assert_samples(&self, min: f64) {
        let n = self.samples();
        assert!(
            n >= min,
            "only {n} samples (want >= {min}); if witch runs fine, check that gcc still puts each \
             store right after its chase load (see the docs at the top of tests/src/lib.rs)\n{}",
            self.dump()
        );
    }

    /// A readable dump for failure messages: a table of the top pairs, then
    /// the JSON report with its pair list cut to the top pairs.
    pub fn dump(&self) -> String {
        const TOP: usize = 12;
        let mut s = format!("=== report of {} ===\n", self.path.display());
        let pairs = self.pairs();
        for (i, p) in pairs.iter().take(TOP).enumerate() {
            let _ = writeln!(
                s,
                "#{i:<2} waste={:<12.4e} use={:<12.4e} share={:.3}\n     watch: {}\n     trap:  {}",
                num(&p["waste_bytes"]),
                num(&p["use_bytes"]),
                num(&p["share"]),
                fmt_frames(frames(p, "watch")),
                fmt_frames(frames(p, "trap"))
            );
        }
        if pairs.len() > TOP {
            let _ = writeln!(s, "... {} more pairs", pairs.len() - TOP);
        }
        // The JSON report itself, with each pair on one line.
        let mut head = self.json.clone();
        if let Some(o) = head.as_object_mut() {
            o.insert("pairs".into(), Value::from(format!("[{} pairs, top {} below]", pairs.len(), pairs.len().min(TOP))));
        }
        let _ = writeln!(s, "--- JSON report ---");
        s.push_str(&serde_json::to_string_pretty(&head).unwrap_or_default());
        for p in pairs.iter().take(TOP) {
            let _ = write!(s, "\n{p}");
        }
        s
    }
}

// ---------------------------------------------------------------------------
// Profiles next to one another (fork, exec)
// ---------------------------------------------------------------------------

/// The profile written at `main` (`<stem>.json`) and the ones written next to
/// it for other processes and images (`<stem>.<pid>[.<k>].json`), sorted.
pub fn profiles_near(main: &Path) -> Vec<PathBuf> {
    let dir = main.parent().unwrap_or(Path::new("."));
    let name = main.file_name().unwrap().to_string_lossy().into_owned();
    let stem = name.strip_suffix(".json").unwrap_or(&name).to_string();
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| {
                    let n = p.file_name().unwrap().to_string_lossy();
                    n == name.as_str() || (n.starts_with(&format!("{stem}.")) && n.ends_with(".json"))
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

// ---------------------------------------------------------------------------
// Privileges
// ---------------------------------------------------------------------------

pub fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

/// Find an executable on PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.metadata().map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false))
}

/// Can a user who is neither owner nor in the group reach and run `path`?
pub fn others_can_run(path: &Path) -> bool {
    let Ok(m) = path.metadata() else { return false };
    if m.permissions().mode() & 0o005 != 0o005 {
        return false;
    }
    path.ancestors().skip(1).all(|d| d.as_os_str().is_empty() || d.metadata().map(|m| m.permissions().mode() & 0o001 != 0).unwrap_or(false))
}

pub fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {:o} {}: {e}", mode, path.display()));
}
