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

/// `-o /dev/null` (only the report wanted) works for a user who may not
/// write in `/dev`: the run's parts wait in the temporary directory, and
/// the device is written in place. A device that cannot take the profile
/// (`/dev/full`) gets a message that says where the parts are, and no
/// claim that the profile was written.
#[test]
fn a_device_as_the_profile_works_unprivileged() {
    let dir = Scratch::new("unpriv-devnull");
    let prog = Program::build("exit_status", dir.path());
    let (witch, wrapper) = match Nobody::setup(&dir) {
        Some(n) => {
            chmod(dir.path(), 0o755);
            chmod(&prog.exe, 0o755);
            (n.witch, n.wrapper)
        }
        None => (witch_bin(), vec![]),
    };
    let native = prog.run_native(&["main"]);
    let run = WitchCmd::new("dead")
        .witch(&witch)
        .wrapper(&wrapper)
        .args(&["-p", "100000"])
        .out(std::path::Path::new("/dev/null"))
        .run(&prog.exe, &["main"]);
    assert_same_behaviour(&native, &run);
    assert!(run.stderr_str().contains("written to /dev/null"), "{}", run.describe());
    let run = WitchCmd::new("dead")
        .witch(&witch)
        .wrapper(&wrapper)
        .args(&["-p", "100000"])
        .out(std::path::Path::new("/dev/full"))
        .run(&prog.exe, &["main"]);
    assert_same_behaviour(&native, &run);
    let err = run.stderr_str();
    assert!(err.contains("cannot write /dev/full") && !err.contains("written to /dev/full"), "{}", run.describe());
    let parts = err.split("kept in ").nth(1).and_then(|r| r.split("/ ").next()).unwrap_or("");
    assert!(!parts.is_empty() && !parts.starts_with("/dev"), "the parts should wait outside /dev: {err}");
    let _ = std::fs::remove_dir_all(parts);
}
