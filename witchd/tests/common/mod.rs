//! Shared fixture: a small C program built at -O2 -g, its known addresses (found with
//! binutils, independently of witch's symbolizer), and synthetic profiles over it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
pub use witchcraft::profile::{Counters, Craft, Module, Node, Pair, PeriodUnit, Profile, SamplerKind, SamplerSettings, Thread, SCHEMA};

pub const SOURCE: &str = r#"#include <stdio.h>

int buf[4096];

static inline __attribute__((always_inline)) void poke(int *a, int i, int v)
{
	a[i] = v; /* POKE_STORE */
}

__attribute__((noinline)) void init(int *a, int n, int v)
{
	for (int i = 0; i < n; i++)
		a[i] = v; /* INIT_STORE */
}

__attribute__((noinline)) void fill(int *a, int n)
{
	for (int i = 0; i < n; i++)
		poke(a, i, i * 3); /* FILL_CALLS_POKE */
}

__attribute__((noinline)) long sum(const int *a, int n)
{
	long s = 0;
	for (int i = 0; i < n; i++)
		s += a[i]; /* SUM_LOAD */
	return s;
}

int main(int argc, char **argv)
{
	int n = argc * 1000;
	init(buf, n, argc); /* MAIN_CALLS_INIT */
	fill(buf, n); /* MAIN_CALLS_FILL */
	long r = sum(buf, n); /* MAIN_CALLS_SUM */
	printf("%ld\n", r);
	return 0;
}
"#;

pub struct Fixture {
    pub dir: PathBuf,
    pub bin: PathBuf,
    pub build_id: String,
    /// Marker → source line.
    pub line: HashMap<&'static str, u32>,
    pub init_store: u64,
    /// Inside `poke` inlined into `fill`.
    pub fill_store: u64,
    pub sum_load: u64,
    /// Lookup addresses (return address − 1) of main's calls.
    pub main_init: u64,
    pub main_fill: u64,
    pub main_sum: u64,
}

fn sh(cmd: &mut Command) -> String {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(o.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// addr2line -a -f -i over addresses: address → [(function, line)] innermost first.
fn binutils_frames(bin: &Path, addrs: &[u64]) -> HashMap<u64, Vec<(String, u32)>> {
    let mut cmd = Command::new("addr2line");
    cmd.args(["-a", "-f", "-i", "-e"]).arg(bin);
    for a in addrs {
        cmd.arg(format!("{a:#x}"));
    }
    let out = sh(&mut cmd);
    let mut map: HashMap<u64, Vec<(String, u32)>> = HashMap::new();
    let mut cur = 0;
    let mut lines = out.lines();
    while let Some(l) = lines.next() {
        if let Some(h) = l.strip_prefix("0x") {
            cur = u64::from_str_radix(h, 16).unwrap();
            map.insert(cur, Vec::new());
        } else {
            let loc = lines.next().unwrap();
            let line: u32 = loc
                .rsplit_once(':')
                .map(|(_, r)| r.chars().take_while(|c| c.is_ascii_digit()).collect::<String>())
                .and_then(|d| d.parse().ok())
                .unwrap_or(0);
            map.get_mut(&cur).unwrap().push((l.to_string(), line));
        }
    }
    map
}

/// A fresh directory per test binary and name, so reruns don't accumulate files.
pub fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("witchd-{}-{name}", env!("CARGO_CRATE_NAME")));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = scratch("fixture");
        let src = dir.join("app.c");
        std::fs::write(&src, SOURCE).unwrap();
        let bin = dir.join("app");
        sh(Command::new("gcc").args(["-O2", "-g", "-no-pie", "-Wl,--build-id", "-o"]).arg(&bin).arg(&src));

        let mut line = HashMap::new();
        for (i, l) in SOURCE.lines().enumerate() {
            for m in ["POKE_STORE", "INIT_STORE", "FILL_CALLS_POKE", "SUM_LOAD", "MAIN_CALLS_INIT", "MAIN_CALLS_FILL", "MAIN_CALLS_SUM"] {
                if l.contains(m) {
                    line.insert(m, i as u32 + 1);
                }
            }
        }
        let build_id = sh(Command::new("readelf").arg("-n").arg(&bin))
            .lines()
            .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_string))
            .expect("build id");

        // Function ranges from nm -S.
        let mut ranges: HashMap<String, (u64, u64)> = HashMap::new();
        for l in sh(Command::new("nm").arg("-S").arg(&bin)).lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() == 4 && (f[2] == "T" || f[2] == "t") {
                let a = u64::from_str_radix(f[0], 16).unwrap();
                let s = u64::from_str_radix(f[1], 16).unwrap();
                ranges.insert(f[3].to_string(), (a, a + s));
            }
        }
        let every = |name: &str| -> Vec<u64> {
            let (a, b) = ranges[name];
            (a..b).collect()
        };
        let mut all = every("init");
        all.extend(every("fill"));
        all.extend(every("sum"));
        let frames = binutils_frames(&bin, &all);
        let find = |name: &str, want: &[(&str, u32)]| -> u64 {
            every(name)
                .into_iter()
                .find(|a| {
                    let f = &frames[a];
                    f.len() == want.len() && f.iter().zip(want).all(|(x, y)| x.0 == y.0 && x.1 == y.1)
                })
                .unwrap_or_else(|| panic!("no address in {name} with frames {want:?}"))
        };
        let init_store = find("init", &[("init", line["INIT_STORE"])]);
        let fill_store = find("fill", &[("poke", line["POKE_STORE"]), ("fill", line["FILL_CALLS_POKE"])]);
        let sum_load = find("sum", &[("sum", line["SUM_LOAD"])]);

        // main's call sites: lookup address = return address − 1.
        let dis = sh(Command::new("objdump").args(["-d", "--no-show-raw-insn"]).arg(&bin));
        let call = |callee: &str| -> u64 {
            let l = dis
                .lines()
                .find(|l| l.contains("call") && l.ends_with(&format!("<{callee}>")))
                .unwrap_or_else(|| panic!("no call to {callee}"));
            let a = u64::from_str_radix(l.trim().split(':').next().unwrap(), 16).unwrap();
            a + 4 // e8 rel32 is 5 bytes: return address is a+5
        };
        let f = Fixture {
            main_init: call("init"),
            main_fill: call("fill"),
            main_sum: call("sum"),
            dir,
            bin,
            build_id,
            line,
            init_store,
            fill_store,
            sum_load,
        };
        // The call sites symbolize to main's call lines (sanity of the fixture itself).
        let m = binutils_frames(&f.bin, &[f.main_init, f.main_fill, f.main_sum]);
        assert_eq!(m[&f.main_init][0], ("main".to_string(), f.line["MAIN_CALLS_INIT"]));
        assert_eq!(m[&f.main_fill][0], ("main".to_string(), f.line["MAIN_CALLS_FILL"]));
        assert_eq!(m[&f.main_sum][0], ("main".to_string(), f.line["MAIN_CALLS_SUM"]));
        f
    })
}

/// Bytes of each pair kind in a synthetic profile.
#[derive(Clone, Copy)]
pub struct PairBytes {
    /// init's store killed by fill's store, thread 1 and thread 2.
    pub init_fill: (f64, f64),
    /// fill's store killed by fill's store.
    pub fill_fill: f64,
    /// fill's store used by sum's load.
    pub fill_sum_use: f64,
    /// sum's load → init's store (only when > 0).
    pub sum_init: f64,
}

pub const BASE: PairBytes = PairBytes { init_fill: (600.0, 200.0), fill_fill: 100.0, fill_sum_use: 300.0, sum_init: 0.0 };

/// A dead-store profile over the fixture, all addresses shifted by `shift` (as if
/// loaded elsewhere: bias = shift), so raw addresses differ but source lines don't.
pub fn profile(fx: &Fixture, shift: u64, b: PairBytes) -> Profile {
    let s = |a: u64| a + shift;
    let node = |parent, pc| Node { parent, pc, samples: 1 };
    // Many traps per pair, so the figures are well above the noise (see `few_traps`).
    let pair =
        |watch, trap, waste: f64, r#use: f64| Pair { watch, trap, waste, approx_waste: 0.0, r#use, traps: 3000, ..Default::default() };
    let mut t1 = Thread {
        tid: 100,
        nodes: vec![
            Node { parent: 0, pc: 0, samples: 0 },
            node(0, s(fx.main_init)),
            node(1, s(fx.init_store)),
            node(0, s(fx.main_fill)),
            node(3, s(fx.fill_store)),
            node(0, s(fx.main_sum)),
            node(5, s(fx.sum_load)),
        ],
        pairs: vec![pair(2, 4, b.init_fill.0, 0.0), pair(4, 4, b.fill_fill, 0.0), pair(4, 6, 0.0, b.fill_sum_use)],
        counters: Counters { samples: 40, traps: 30, imprecise: 1, ..Default::default() },
        clusters: Default::default(),
        objects: Vec::new(),
    };
    if b.sum_init > 0.0 {
        t1.pairs.push(pair(6, 2, b.sum_init, 0.0));
    }
    // Thread 2 has the same contexts under other node numbers: must merge with thread 1.
    let t2 = Thread {
        tid: 101,
        nodes: vec![
            Node { parent: 0, pc: 0, samples: 0 },
            node(0, s(fx.main_fill)),
            node(1, s(fx.fill_store)),
            node(0, s(fx.main_init)),
            node(3, s(fx.init_store)),
        ],
        pairs: vec![pair(4, 2, b.init_fill.1, 0.0)],
        counters: Counters { samples: 10, traps: 5, ..Default::default() },
        clusters: Default::default(),
        objects: Vec::new(),
    };
    let module = Module {
        path: fx.bin.display().to_string(),
        build_id: Some(fx.build_id.clone()),
        start: 0x400000 + shift,
        end: 0x405000 + shift,
        bias: shift,
    };
    let mut p = skeleton(Craft::Dead, &fx.bin.display().to_string(), vec![module], vec![t1, t2]);
    p.counters = Counters { samples: 50, traps: 35, imprecise: 1, ..Default::default() };
    p
}

/// The same profile resting on `n` traps per pair: too few for its figures to be sure.
pub fn few_traps(mut p: Profile, n: u64) -> Profile {
    for pair in p.threads.iter_mut().flat_map(|t| &mut t.pairs) {
        pair.traps = n;
    }
    p
}

/// A profile with the usual metadata around the given modules and threads.
pub fn skeleton(craft: Craft, program: &str, modules: Vec<Module>, threads: Vec<Thread>) -> Profile {
    Profile {
        schema: SCHEMA,
        witch_version: "test".into(),
        craft,
        program: program.into(),
        args: vec![],
        pid: 4242,
        ppid: 1,
        start_unix_ns: 1_700_000_000_000_000_000,
        duration_ns: 1_500_000_000,
        sampler: SamplerSettings {
            kind: SamplerKind::Software,
            event: "task-clock".into(),
            period: 100_000,
            unit: PeriodUnit::Ns,
            ..Default::default()
        },
        replacement: "reservoir".into(),
        debug_registers: 4,
        fp_precision: 0.01,
        kernel: "6.1".into(),
        ended_by: witchcraft::profile::EndedBy::Exit,
        exec_call: None,
        round_trips: None,
        notes: vec![],
        counters: Counters::default(),
        modules,
        threads,
        processes: vec![],
    }
}

pub fn save(p: &Profile, name: &str) -> PathBuf {
    save_in(&fixture().dir, p, name)
}

pub fn save_in(dir: &Path, p: &Profile, name: &str) -> PathBuf {
    let path = dir.join(name);
    p.save(&path).unwrap();
    path
}

pub fn witch<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    // Hermetic: no debuginfod lookups from a developer's environment.
    Command::new(env!("CARGO_BIN_EXE_witch")).args(args).env_remove("DEBUGINFOD_URLS").output().unwrap()
}

pub fn sh_out(cmd: &mut Command) -> String {
    sh(cmd)
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `witch ARGS` with a time limit and an address-space limit, so a witch that
/// hangs or reads without end fails the test instead of the machine.
/// Returns the output and the wall time; None if it ran out of time.
pub fn witch_limited<S: AsRef<std::ffi::OsStr>>(args: &[S], secs: u64, max_bytes: u64) -> Option<(Output, std::time::Duration)> {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_witch"));
    cmd.args(args).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit { rlim_cur: max_bytes, rlim_max: max_bytes };
            libc::setrlimit(libc::RLIMIT_AS, &lim);
            Ok(())
        });
    }
    let start = std::time::Instant::now();
    let mut child = cmd.spawn().unwrap();
    // Drain the pipes on threads so a large output cannot block the child.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let o = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = std::io::Read::read_to_end(&mut out, &mut b);
        b
    });
    let e = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = std::io::Read::read_to_end(&mut err, &mut b);
        b
    });
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let took = start.elapsed();
            return Some((Output { status, stdout: o.join().unwrap(), stderr: e.join().unwrap() }, took));
        }
        if start.elapsed() > std::time::Duration::from_secs(secs) {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A large synthetic profile over the fixture's code: `nodes` context-tree
/// nodes (up to 40 deep) and `pairs` pairs in each of `threads` threads, with
/// pcs spread over the fixture's functions. Deterministic.
pub fn big_profile(fx: &Fixture, threads: usize, nodes: usize, pairs: usize) -> Profile {
    let mut x: u64 = 0x9e3779b97f4a7c15;
    let mut rnd = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n.max(1)
    };
    let pcs = [fx.init_store, fx.fill_store, fx.sum_load, fx.main_init, fx.main_fill, fx.main_sum];
    let mut ts = Vec::new();
    for t in 0..threads {
        let mut ns = vec![Node { parent: 0, pc: 0, samples: 0 }];
        let mut depth = vec![0u32];
        for i in 1..nodes {
            let mut parent = i as u64 - 1 - rnd(200.min(i as u64));
            if depth[parent as usize] >= 40 {
                parent = 0;
            }
            // Nearby instructions of the fixture's lines, so many distinct addresses.
            let pc = pcs[rnd(pcs.len() as u64) as usize] + rnd(4);
            ns.push(Node { parent: parent as u32, pc, samples: rnd(3) });
            depth.push(depth[parent as usize] + 1);
        }
        let ps = (0..pairs)
            .map(|_| Pair {
                watch: 1 + rnd(nodes as u64 - 1) as u32,
                trap: 1 + rnd(nodes as u64 - 1) as u32,
                waste: rnd(1000) as f64,
                approx_waste: 0.0,
                r#use: rnd(1000) as f64,
                traps: 1 + rnd(5),
                ..Default::default()
            })
            .collect();
        ts.push(Thread {
            tid: 100 + t as u32,
            nodes: ns,
            pairs: ps,
            counters: Counters { samples: 1, traps: 1, ..Default::default() },
            clusters: Default::default(),
            objects: Vec::new(),
        });
    }
    let module =
        Module { path: fx.bin.display().to_string(), build_id: Some(fx.build_id.clone()), start: 0x400000, end: 0x405000, bias: 0 };
    skeleton(Craft::Dead, &fx.bin.display().to_string(), vec![module], ts)
}
