//! witch must work without privileges (perf_event_paranoid 2, no
//! capabilities). As root with `setpriv` available, the dead-loop test runs
//! as nobody; otherwise it runs as the current, already unprivileged, user.

use std::path::PathBuf;
use witch_tests::*;

const NOBODY: u32 = 65534;

#[test]
fn dead_loop_as_an_unprivileged_user() {
    let paranoid_raw =
        std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").expect("cannot read /proc/sys/kernel/perf_event_paranoid");
    let paranoid: i32 = paranoid_raw.trim().parse().unwrap_or_else(|e| panic!("perf_event_paranoid = {paranoid_raw:?}: {e}"));
    eprintln!("[witch-tests] kernel.perf_event_paranoid = {paranoid}");
    if paranoid < 2 {
        eprintln!("[witch-tests] note: perf_event_paranoid < 2, so this is a weaker check than the paranoid-2 requirement");
    }

    let dir = Scratch::new("unpriv");
    let setpriv = which("setpriv");
    let as_nobody = is_root() && setpriv.is_some();
    if is_root() && !as_nobody {
        eprintln!("[witch-tests] running as root without setpriv: this checks nothing about privileges");
    }

    let prog = Program::build("dead_loop", dir.path());
    let (w, k) = (prog.line("@w"), prog.line("@k"));
    let mut witch = witch_bin();
    let mut wrapper: Vec<String> = vec![];
    if as_nobody {
        chmod(dir.path(), 0o777);
        chmod(&prog.exe, 0o755);
        // nobody must reach witch and its agent; copy them if the build tree is private.
        let agent = agent_beside(&witch);
        if !others_can_run(&witch) || agent.as_ref().is_some_and(|a| !others_can_run(a)) {
            let bin = dir.join("bin");
            std::fs::create_dir_all(&bin).unwrap();
            chmod(&bin, 0o755);
            let copy = |from: &PathBuf| {
                let to = bin.join(from.file_name().unwrap());
                std::fs::copy(from, &to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
                chmod(&to, 0o755);
                to
            };
            if let Some(agent) = &agent {
                copy(agent);
            }
            witch = copy(&witch);
        }
        wrapper = vec![
            setpriv.unwrap().to_string_lossy().into_owned(),
            format!("--reuid={NOBODY}"),
            format!("--regid={NOBODY}"),
            "--clear-groups".into(),
            "--".into(),
        ];
    }

    let native = prog.run_native(&[]);
    assert_eq!(native.code(), Some(3), "native run:\n{}", native.describe());
    let out = dir.join("unpriv.json");
    let run = WitchCmd::new("dead").witch(&witch).wrapper(&wrapper).args(&["-p", "100000", "-q"]).out(&out).run(&prog.exe, &[]);
    assert_same_behaviour(&native, &run);
    if as_nobody {
        use std::os::unix::fs::MetadataExt;
        let uid = std::fs::metadata(&out).map(|m| m.uid()).unwrap_or(u32::MAX);
        assert_eq!(uid, NOBODY, "the profile should have been written by nobody");
    }

    let rep = report(&out);
    rep.assert_samples(200.0);
    let f = &prog.file;
    let pair = rep.pair(f, w, k);
    let from_w = rep.watched_at(f, w);
    let own = pair.waste / (from_w.waste + from_w.r#use).max(f64::MIN_POSITIVE);
    rep.note(&format!("as {}: <{w},{k}> own fraction {own:.3}", if as_nobody { "nobody" } else { "the current user" }));
    assert!(
        own >= 0.90,
        "as {}: <{f}:{w}, {f}:{k}> should hold >= 90% of what the stores at line {w} are worth; got {own:.3} \
         (perf_event_paranoid = {paranoid})\n{}",
        if as_nobody { "nobody" } else { "the current user" },
        rep.dump()
    );
}
