//! Code loaded with `dlopen` after the program started, and unloaded with
//! `dlclose` (tests/programs/dl_plugin.c, dl_host.c, dl_churn.c).
//!
//! The engine decodes and unwinds with a map of the process's modules, read
//! in place in their mappings. A plugin loaded after start must enter that
//! map before its code runs (or its samples and traps cannot be resolved),
//! and a plugin unloaded must leave it before its memory is unmapped (or a
//! handler could read memory that is gone, or describe the next module
//! mapped there with the old one's functions and lines).

use witch_tests::attach::*;
use witch_tests::*;

/// Sampling period (ns of CPU time for the software sampler).
const PERIOD: &str = "100000";

/// The two plugins (A: loops @aw/@ak, B: @bw/@bk), in `dir`, built with
/// `a_flags` and `b_flags` (see dl_plugin.c).
fn plugins_with(dir: &Scratch, a_flags: &[&str], b_flags: &[&str]) -> (Program, Program) {
    let build = |out: &str, flags: &[&str]| {
        let all: Vec<&str> = ["-shared", "-fPIC"].iter().chain(flags).copied().collect();
        Program::build_with("dl_plugin", dir.path(), out, &all).unwrap_or_else(|e| panic!("{e}"))
    };
    (build("libdl_plugin_a.so", a_flags), build("libdl_plugin_b.so", b_flags))
}

fn plugins(dir: &Scratch) -> (Program, Program) {
    plugins_with(dir, &[], &["-DPLUGIN_B"])
}

/// dl_churn's plugins: B is mapped where A was, over A's code, and A's
/// unwind tables lie past B's end.
fn churn_plugins(dir: &Scratch) {
    plugins_with(dir, &["-DPLUGIN_PAD"], &["-DPLUGIN_B", "-DPLUGIN_B_PAD"]);
}

/// The host, with RUNPATH `$ORIGIN` (its plugins are found beside it).
fn host(dir: &Scratch) -> Program {
    Program::build_with("dl_host", dir.path(), "dl_host", &["-ldl", "-Wl,--enable-new-dtags,-rpath,$ORIGIN"])
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A host that loads its plugin after start and spends its time in it:
/// the plugin's dead stores are found as in a program linked with it (see
/// dead.rs), whichever way the plugin is named to `dlopen`. A bare name
/// found through the host's RUNPATH and a `$ORIGIN` path must also still
/// load: the C library resolves both from the caller of `dlopen`, which
/// the agent must not become.
#[test]
fn a_plugin_loaded_after_start_is_profiled() {
    let dir = Scratch::new("dlopen-late");
    let (a, _) = plugins(&dir);
    let host = host(&dir);
    let (w, k) = (a.line("@aw"), a.line("@ak"));
    let f = &a.file;
    let path = a.exe.to_str().unwrap().to_string();
    for (tag, name) in [("path", path.as_str()), ("runpath", "libdl_plugin_a.so"), ("origin", "$ORIGIN/libdl_plugin_a.so")] {
        let (_, rep) = craft_run("dead", &host, &dir, tag, &[name, "200"], &["-p", PERIOD]);
        rep.assert_own_fraction(f, w, k, 0.90, &format!("{tag}, dlopen({name}): "));
        let wf = rep.waste_fraction();
        assert!(wf >= 0.90, "dlopen({name}): waste fraction {wf:.3} should be >= 0.90\n{}", rep.dump());
    }
}

/// A host that unloads its plugin before it exits (as plugin hosts do at
/// shutdown): the plugin's dead stores are still found at its lines (the
/// profile's module map keeps modules unloaded during the run).
#[test]
fn a_plugin_unloaded_before_exit_is_profiled() {
    let dir = Scratch::new("dlopen-close");
    let (a, _) = plugins(&dir);
    let host = host(&dir);
    let (w, k) = (a.line("@aw"), a.line("@ak"));
    let f = &a.file;
    let (_, rep) = craft_run("dead", &host, &dir, "close", &[a.exe.to_str().unwrap(), "200", "-", "close"], &["-p", PERIOD]);
    rep.assert_own_fraction(f, w, k, 0.90, "");
}

/// Plugin A is loaded, runs (while the program starts a thread), and is
/// unloaded; then B, which the loader maps exactly where A was, runs for
/// the rest of the program. B's dead stores must be found at B's lines: a
/// module map still describing A there puts B's code in A's functions.
#[test]
fn a_plugin_mapped_where_an_unloaded_one_was_is_profiled_as_itself() {
    let dir = Scratch::new("dlopen-reuse");
    let (a, b) = plugins(&dir);
    let host = host(&dir);
    let (w, k) = (b.line("@bw"), b.line("@bk"));
    let f = &b.file;
    let args = [b.exe.to_str().unwrap(), "200", a.exe.to_str().unwrap()];
    let (_, rep) = craft_run("dead", &host, &dir, "reuse", &args, &["-p", PERIOD]);
    rep.assert_own_fraction(f, w, k, 0.90, "");
    let both = rep.share(f, w, k) + rep.share(f, k, w);
    rep.note(&format!("<{w},{k}> and <{k},{w}> share {both:.3}"));
    // B runs ten times as long as A: its two loops' pairs are most of the waste.
    assert!(both >= 0.80, "B's pairs <{w},{k}> and <{k},{w}> should hold >= 80% of all waste; got {both:.3}\n{}", rep.dump());
}

/// Two plugins loaded, called and unloaded in turn, 300 times, in one and
/// in four threads at once (and short threads started meanwhile): under
/// witch the program prints and exits exactly as without it.
#[test]
fn loading_and_unloading_while_profiled_changes_nothing() {
    let dir = Scratch::new("dlopen-churn");
    churn_plugins(&dir);
    let churn = Program::build_with("dl_churn", dir.path(), "dl_churn", &["-ldl"]).unwrap_or_else(|e| panic!("{e}"));
    let here = dir.path().to_str().unwrap();
    for threads in ["1", "4"] {
        let args = [here, "300", threads];
        let native = churn.run_native(&args);
        assert_eq!(native.code(), Some(3), "native run:\n{}", native.describe());
        assert!(native.stdout_str().ends_with(" 0\n"), "the native run found wrong results:\n{}", native.describe());
        let out = dir.join(&format!("churn{threads}.json"));
        let run = WitchCmd::new("dead").args(&["-p", PERIOD, "-q"]).out(&out).run(&churn.exe, &args);
        assert_same_behaviour(&native, &run);
        let rep = report(&out);
        rep.note(&format!("{threads} threads"));
        rep.assert_samples(200.0);
    }
    // Unprivileged (as nobody, where setpriv is there): nothing the map
    // upkeep does needs a privilege.
    if let Some(n) = Nobody::setup(&dir) {
        chmod(dir.path(), 0o777);
        let args = [here, "300", "4"];
        let native = churn.run_native(&args);
        let out = dir.join("nobody.json");
        let run = WitchCmd::new("dead").witch(&n.witch).wrapper(&n.wrapper).args(&["-p", PERIOD, "-q"]).out(&out).run(&churn.exe, &args);
        assert_same_behaviour(&native, &run);
        report(&out).assert_samples(200.0);
    }
}

/// The same churn, attached to eight times while it runs (the attached
/// agent interposes nothing: it follows loads and unloads by looking, so
/// its map may list an unloaded plugin for a while; its handlers must not
/// read the plugin's memory then). Before checked reads the program died
/// at the second or third attach (framehop reading an unloaded plugin's
/// unwind table).
#[test]
fn loading_and_unloading_under_attach_changes_nothing() {
    let dir = Scratch::new("dlopen-attach");
    churn_plugins(&dir);
    let churn = Program::build_with("dl_churn", dir.path(), "dl_churn", &["-ldl"]).unwrap_or_else(|e| panic!("{e}"));
    let here = dir.path().to_str().unwrap();
    let mut target = Target::start(&churn.exe, &[here, "0", "4"], &[]);
    target.wait_ready(5, None);
    for i in 0..8 {
        let out = dir.join(&format!("attach{i}.json"));
        let run = attach_cmd(&witch_bin(), &[], "dead", target.pid(), &["--duration", "700ms", "-q", "-o", out.to_str().unwrap()]);
        assert!(target.alive(), "attach #{i} killed the program:\n{}", run.describe());
        assert_eq!(run.code(), Some(0), "attach #{i} failed:\n{}", run.describe());
    }
    let end = target.finish();
    assert!(end.rounds > 0, "no round done: {}", end.stdout);
    // What every call must return, from one unprofiled round.
    let native = churn.run_native(&[here, "1", "1"]);
    let expected = native.stdout_str().split_whitespace().nth(2).unwrap_or_default().to_string();
    assert_eq!(
        (end.code(), end.stdout.as_str()),
        (Some(3), format!("dl_churn {} {expected} 0\n", end.rounds).as_str()),
        "differs from an unprofiled run (stderr: {})",
        end.stderr
    );
}
