//! witch must work without privileges (perf_event_paranoid 2, no
//! capabilities). As root with `setpriv` available, the dead-loop test runs
//! as nobody; otherwise it runs as the current, already unprivileged, user.

use witch_tests::*;

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
    let nobody = Nobody::setup(&dir);
    let as_nobody = nobody.is_some();
    if is_root() && !as_nobody {
        eprintln!("[witch-tests] running as root without setpriv: this checks nothing about privileges");
    }

    let prog = Program::build("dead_loop", dir.path());
    let (w, k) = (prog.line("@w"), prog.line("@k"));
    let (witch, wrapper) = match nobody {
        Some(n) => {
            // nobody writes its profile here and runs the program.
            chmod(dir.path(), 0o777);
            chmod(&prog.exe, 0o755);
            (n.witch, n.wrapper)
        }
        None => (witch_bin(), vec![]),
    };

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
    let who = if as_nobody { "nobody" } else { "the current user" };
    rep.assert_own_fraction(f, w, k, 0.90, &format!("as {who} (perf_event_paranoid = {paranoid}): "));
}
