//! fork + exec under witch (tests/programs/forker.c and exec_target.c): the
//! child keeps profiling after fork with its own state, exec starts a fresh
//! profile for the new image, and the program behaves as without witch.

use witch_tests::*;

#[test]
fn fork_and_exec_each_leave_a_profile() {
    let dir = Scratch::new("fork-exec");
    let forker = Program::build("forker", dir.path());
    let target = Program::build("exec_target", dir.path());
    let (xw, xk) = (target.line("@xw"), target.line("@xk"));
    let target_arg = target.exe.to_str().unwrap();

    let native = forker.run_native(&[target_arg]);
    assert_eq!(native.code(), Some(5), "native run:\n{}", native.describe());
    assert_eq!(native.stdout_str().lines().count(), 3, "native run:\n{}", native.describe());

    let out = dir.join("fe.json");
    let run = WitchCmd::new("dead").args(&["-p", "100000", "-q"]).out(&out).run(&forker.exe, &[target_arg]);
    assert_same_behaviour(&native, &run);

    let files = profiles_near(&out);
    let listing = std::fs::read_dir(dir.path())
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect::<Vec<_>>())
        .unwrap_or_default();
    assert!(
        out.is_file() && files.len() >= 3,
        "expected >= 3 profiles (parent at {}, child before exec and the exec'd image next to it as \
         fe.<pid>[.<k>].json); found {files:?}; directory holds {listing:?}\n{}",
        out.display(),
        run.describe()
    );

    let mut forker_profiles = 0;
    let mut target_reports = vec![];
    for p in &files {
        let rep = report(p);
        let prog = rep.program();
        if prog.contains("exec_target") {
            target_reports.push(rep);
        } else if prog.contains("forker") {
            forker_profiles += 1;
        } else {
            panic!("profile {} names program {prog:?}, neither forker nor exec_target\n{}", p.display(), rep.dump());
        }
    }
    assert!(
        forker_profiles >= 2,
        "expected profiles of the parent and of the child before exec, both naming forker; got {forker_profiles} among {files:?}"
    );
    assert_eq!(target_reports.len(), 1, "expected exactly one profile naming exec_target among {files:?}");

    // The exec'd image was profiled for real: its own dead pair is there.
    let rep = &target_reports[0];
    rep.assert_samples(200.0);
    let f = &target.file;
    let pair = rep.pair(f, xw, xk);
    let from = rep.watched_at(f, xw);
    let own = pair.waste / (from.waste + from.r#use).max(f64::MIN_POSITIVE);
    rep.note(&format!("profiles {files:?}; exec'd image <{xw},{xk}> own fraction {own:.3}"));
    assert!(
        own >= 0.90,
        "exec'd image: <{f}:{xw}, {f}:{xk}> should hold >= 90% of what the stores at line {xw} are worth; got {own:.3}\n{}",
        rep.dump()
    );
}
