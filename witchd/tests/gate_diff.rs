//! `witch gate` exit codes and JUnit, `witch diff` matching by source location.

mod common;
use common::*;
use serde_json::Value;

fn code(o: &std::process::Output) -> i32 {
    o.status.code().expect("exited")
}

#[test]
fn gate_passes_and_fails_on_max_waste() {
    let fx = fixture();
    let p = save(&profile(fx, 0, BASE), "gate.witch"); // 75% waste
    let pass = witch(["gate".as_ref(), "--max-waste".as_ref(), "80%".as_ref(), p.as_os_str()]);
    assert_eq!(code(&pass), 0, "{}", stderr(&pass));
    assert!(stdout(&pass).starts_with("witch gate: PASS waste 75.0% (95% interval 74.2–75.8%) <= max 80.0% (dead, "), "{}", stdout(&pass));
    let fail = witch(["gate".as_ref(), "--max-waste".as_ref(), "70".as_ref(), p.as_os_str()]);
    assert_eq!(code(&fail), 1);
    assert!(stdout(&fail).starts_with("witch gate: FAIL waste 75.0% (95% interval 74.2–75.8%) > max 70.0% (dead, "), "{}", stdout(&fail));
}

#[test]
fn gate_baseline_increase_and_junit() {
    let fx = fixture();
    let worse = save(&profile(fx, 0, BASE), "gate-worse.witch"); // 75%
    let better = PairBytes { init_fill: (50.0, 50.0), fill_fill: 100.0, ..BASE }; // 200/500 = 40%
    let base = save(&profile(fx, 0, better), "gate-base.witch");
    let junit = fx.dir.join("gate.xml");
    let _ = std::fs::remove_file(&junit);
    let o = witch([
        "gate".as_ref(),
        "--baseline".as_ref(),
        base.as_os_str(),
        "--max-increase".as_ref(),
        "2pp".as_ref(),
        "--max-waste".as_ref(),
        "90%".as_ref(),
        "--junit".as_ref(),
        junit.as_os_str(),
        worse.as_os_str(),
    ]);
    assert_eq!(code(&o), 1, "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("+35.0pp (95% interval +33.7 to +36.3pp) over baseline 40.0%, > max +2.0pp"), "{}", stdout(&o));
    let x = std::fs::read_to_string(&junit).unwrap();
    assert!(x.contains("<testsuite name=\"witch gate\" tests=\"2\" failures=\"1\""), "{x}");
    assert_eq!(x.matches("<testcase").count(), 2);
    assert_eq!(x.matches("<failure").count(), 1);

    // The other way round it improved: pass.
    let o = witch([
        "gate".as_ref(),
        "--baseline".as_ref(),
        worse.as_os_str(),
        "--max-increase".as_ref(),
        "2".as_ref(),
        "--junit".as_ref(),
        junit.as_os_str(),
        base.as_os_str(),
    ]);
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    let x = std::fs::read_to_string(&junit).unwrap();
    assert!(x.contains("tests=\"1\" failures=\"0\""), "{x}");
}

#[test]
fn bad_profiles_and_usage_exit_2() {
    let fx = fixture();
    let good = serde_json::to_string(&profile(fx, 0, BASE)).unwrap();
    let mut newer: Value = serde_json::from_str(&good).unwrap();
    newer["schema"] = 99.into();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty.witch", vec![], "empty"),
        ("truncated.witch", good.as_bytes()[..good.len() / 2].to_vec(), "corrupt or truncated"),
        ("corrupt.witch", b"\x7fELF garbage".to_vec(), "corrupt"),
        ("newer.witch", newer.to_string().into_bytes(), "newer"),
    ];
    for (name, bytes, msg) in cases {
        let path = fx.dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        for cmd in [&["gate", "--max-waste", "20%"][..], &["report"], &["report", "--json"]] {
            let mut args: Vec<std::ffi::OsString> = cmd.iter().map(Into::into).collect();
            args.push(path.clone().into());
            let o = witch(&args);
            assert_eq!(code(&o), 2, "{name} {cmd:?}");
            let e = stderr(&o);
            assert!(e.starts_with("witch: ") && e.contains(msg) && e.lines().count() == 1, "{name}: {e}");
            assert!(!e.contains("panicked"));
        }
    }
    let o = witch(["gate", "--max-waste", "20%", "/nonexistent/p.witch"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("/nonexistent/p.witch"), "{}", stderr(&o));
    let o = witch(["report", "/nonexistent/p.witch"]);
    assert_eq!(code(&o), 2);
    let p = save(&profile(fx, 0, BASE), "usage.witch");
    // Neither bound, a bad bound, a half bound: usage errors.
    for args in
        [vec!["gate"], vec!["gate", "--max-waste", "lots"], vec!["gate", "--max-increase", "2%"], vec!["gate", "--max-increase", "2pp"]]
    {
        let mut a: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
        a.push(p.clone().into());
        let o = witch(&a);
        assert_eq!(code(&o), 2, "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn diff_matches_pairs_by_source_location() {
    let fx = fixture();
    let base = save(&profile(fx, 0, BASE), "diff-base.witch");
    // Loaded 1 MiB higher: every raw address differs; the same source lines.
    let newer = PairBytes { init_fill: (50.0, 50.0), fill_fill: 100.0, fill_sum_use: 300.0, sum_init: 100.0 };
    let new = save(&profile(fx, 0x100000, newer), "diff-new.witch");
    let o = witch(["diff".as_ref(), "--json".as_ref(), base.as_os_str(), new.as_os_str()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!((v["base"]["waste_fraction"].as_f64().unwrap() - 0.75).abs() < 1e-12);
    // 300 / 600 = 50%
    assert!((v["new"]["waste_fraction"].as_f64().unwrap() - 0.5).abs() < 1e-12);
    assert!((v["waste_fraction_change"].as_f64().unwrap() + 0.25).abs() < 1e-12);
    let pairs = v["pairs"].as_array().unwrap();
    let status: Vec<&str> = pairs.iter().map(|p| p["status"].as_str().unwrap()).collect();
    assert_eq!(status.iter().filter(|s| **s == "both").count(), 2, "{status:?}");
    assert_eq!(status.iter().filter(|s| **s == "new").count(), 1, "{status:?}");
    assert_eq!(status.iter().filter(|s| **s == "vanished").count(), 0, "{status:?}");
    let init = pairs.iter().find(|p| p["watch"]["frames"][0]["function"] == "init").unwrap();
    assert_eq!(init["status"], "both");
    assert!((init["base_share"].as_f64().unwrap() - 800.0 / 900.0).abs() < 1e-12);
    assert!((init["new_share"].as_f64().unwrap() - 100.0 / 300.0).abs() < 1e-12);
    let newp = pairs.iter().find(|p| p["status"] == "new").unwrap();
    assert_eq!(newp["watch"]["frames"][0]["function"], "sum");
    // Sorted by size of change: init's share dropped most.
    assert_eq!(pairs[0]["watch"]["frames"][0]["function"], "init");

    let o = witch(["diff".as_ref(), base.as_os_str(), new.as_os_str()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = stdout(&o);
    assert!(t.contains("Waste fraction: 75.0% → 50.0% (-25.0pp)"), "{t}");
    assert!(t.contains("88.9%") && t.contains("33.3%") && t.contains("-55.6pp"), "{t}");
    assert!(t.contains("[new]"), "{t}");
    assert!(t.contains("2 pairs in both, 1 new, 0 vanished"), "{t}");

    // Without symbols the same shift would not match (module+offset is the fallback key,
    // and offsets are file addresses, so they still match): vanished stays 0 either way.
    let o = witch(["diff".as_ref(), base.as_os_str(), fx.dir.join("nope.witch").as_os_str()]);
    assert_eq!(code(&o), 2);
}

/// A gate fails only when the waste is above its bound beyond the noise: on
/// a profile resting on few traps it says it cannot tell, and passes.
#[test]
fn gate_cannot_tell_within_the_noise() {
    let fx = fixture();
    let few = save(&few_traps(profile(fx, 0, BASE), 3), "gate-few.witch"); // 75%, on 12 traps
    let o = witch(["gate".as_ref(), "--max-waste".as_ref(), "70".as_ref(), few.as_os_str()]);
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).starts_with("witch gate: PASS (cannot tell) waste 75.0% (95% interval "), "{}", stdout(&o));
    assert!(stdout(&o).contains("within the noise of max 70.0%"), "{}", stdout(&o));
    // Far enough above the bound, even few traps fail.
    let o = witch(["gate".as_ref(), "--max-waste".as_ref(), "10".as_ref(), few.as_os_str()]);
    assert_eq!(code(&o), 1, "{}", stdout(&o));
    // An increase within the noise of the difference cannot fail either.
    let base = save(&few_traps(profile(fx, 0, PairBytes { init_fill: (500.0, 200.0), ..BASE }), 3), "gate-few-base.witch");
    let junit = fx.dir.join("gate-few.xml");
    let o = witch([
        "gate".as_ref(),
        "--baseline".as_ref(),
        base.as_os_str(),
        "--max-increase".as_ref(),
        "1pp".as_ref(),
        "--junit".as_ref(),
        junit.as_os_str(),
        few.as_os_str(),
    ]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    assert!(stdout(&o).contains("PASS (cannot tell)"), "{}", stdout(&o));
    let x = std::fs::read_to_string(&junit).unwrap();
    assert!(x.contains("skipped=\"1\"") && x.contains("<skipped message=\"cannot tell: "), "{x}");
}

/// Negative waste is not a profile witch wrote: refused, not passed.
#[test]
fn negative_waste_is_refused() {
    let fx = fixture();
    let mut p = profile(fx, 0, BASE);
    p.threads[0].pairs[0].waste = -1e9;
    let path = save(&p, "negative.witch");
    for args in [&["gate", "--max-waste", "20%"][..], &["report"]] {
        let mut a: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
        a.push(path.clone().into());
        let o = witch(&a);
        assert_eq!(code(&o), 2, "{args:?}: {}", stdout(&o));
        assert!(stderr(&o).contains("corrupt"), "{}", stderr(&o));
    }
}

/// A profile whose waste sums to infinity (each figure finite, their sum
/// not): the report read "NaN%" and the gate passed it with exit 0, also
/// against a baseline. A gate never passes what it cannot compute: `gate`,
/// `report` and `diff` refuse it with one line and exit 2.
#[test]
fn waste_that_sums_to_infinity_is_refused_never_passed() {
    let fx = fixture();
    let huge = save(&profile(fx, 0, PairBytes { init_fill: (1e308, 1e308), ..BASE }), "infinite.witch");
    // Finite sums whose squares are not: no interval can be computed either.
    let wide = save(&profile(fx, 0, PairBytes { init_fill: (1e200, 1e200), ..BASE }), "unsquarable.witch");
    let good = save(&profile(fx, 0, BASE), "finite-base.witch");
    for bad in [&huge, &wide] {
        let runs: [Vec<&std::ffi::OsStr>; 5] = [
            vec!["gate".as_ref(), "--max-waste".as_ref(), "50".as_ref(), bad.as_os_str()],
            vec!["gate".as_ref(), "--baseline".as_ref(), good.as_os_str(), "--max-increase".as_ref(), "5".as_ref(), bad.as_os_str()],
            vec!["gate".as_ref(), "--baseline".as_ref(), bad.as_os_str(), "--max-increase".as_ref(), "5".as_ref(), good.as_os_str()],
            vec!["report".as_ref(), bad.as_os_str()],
            vec!["diff".as_ref(), good.as_os_str(), bad.as_os_str()],
        ];
        for args in runs {
            let o = witch(&args);
            let (out, err) = (stdout(&o), stderr(&o));
            assert_eq!(code(&o), 2, "{args:?} exited {:?}:\n{out}{err}", o.status.code());
            assert!(!out.contains("NaN") && !out.contains("PASS"), "{args:?}: {out}");
            assert!(err.starts_with("witch: ") && err.lines().count() == 1 && err.contains("cannot be computed"), "{args:?}: {err}");
        }
    }
}

/// A change of all the waste to none of it, each side from a few traps:
/// the interval of the change (diff, gate, JUnit) stays within ±100
/// points, as a difference of two fractions does.
#[test]
fn the_interval_of_a_change_stays_within_100_points() {
    let fx = fixture();
    let all = save(&few_traps(profile(fx, 0, PairBytes { fill_sum_use: 0.0, ..BASE }), 1), "bounds-all.witch");
    let none = PairBytes { init_fill: (0.0, 0.0), fill_fill: 0.0, ..BASE };
    let none = save(&few_traps(profile(fx, 0, none), 1), "bounds-none.witch");
    let pp = |s: &str| -> Vec<f64> {
        // Every "+12.3pp" or "-12.3pp" figure of a line.
        s.split(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '+' | '-' | 'p')))
            .filter_map(|w| w.strip_suffix("pp"))
            .filter_map(|w| w.parse::<f64>().ok())
            .collect()
    };
    for (base, new, sign) in [(&all, &none, -1.0), (&none, &all, 1.0)] {
        let o = witch(["diff".as_ref(), "--json".as_ref(), base.as_os_str(), new.as_os_str()]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
        assert_eq!(v["waste_fraction_change"], sign);
        let ci: Vec<f64> = v["waste_fraction_change_ci"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert!(ci[0] >= -1.0 && ci[1] <= 1.0 && ci[0] <= sign && sign <= ci[1], "{ci:?}");
        for p in v["pairs"].as_array().unwrap() {
            let c: Vec<f64> = p["share_change_ci"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
            assert!(c[0] >= -1.0 && c[1] <= 1.0, "{p}");
        }
        let o = witch(["diff".as_ref(), base.as_os_str(), new.as_os_str()]);
        let text = stdout(&o);
        let line = text.lines().find(|l| l.starts_with("Waste fraction:")).unwrap();
        let figures = pp(line);
        assert!(figures.len() >= 3 && figures.iter().all(|x| x.abs() <= 100.0), "{line}: {figures:?}");
    }
    let junit = fx.dir.join("bounds.xml");
    let o = witch([
        "gate".as_ref(),
        "--baseline".as_ref(),
        none.as_os_str(),
        "--max-increase".as_ref(),
        "2pp".as_ref(),
        "--junit".as_ref(),
        junit.as_os_str(),
        all.as_os_str(),
    ]);
    let out = stdout(&o);
    let figures = pp(&out);
    assert!(figures.len() >= 3 && figures.iter().all(|x| x.abs() <= 100.0), "{out}: {figures:?}");
    let x = std::fs::read_to_string(&junit).unwrap();
    assert!(pp(&x.replace("&gt;", ">")).iter().all(|x| x.abs() <= 100.0), "{x}");
}

/// One spelling of JSON output, `--json`, in every command (the old
/// `--format json` kept working); and every JSON witch writes is read back by
/// `report`, `diff` and `gate`, or named by them in one line with the file to
/// give instead.
#[test]
fn every_json_witch_writes_is_read_back_or_named() {
    let fx = fixture();
    let dir = scratch("json-readback");
    let prof = save_in(&dir, &profile(fx, 0, BASE), "p.json");
    let json = |args: &[&std::ffi::OsStr], name: &str| -> std::path::PathBuf {
        let o = witch(args);
        assert_eq!(code(&o), 0, "{args:?}: {}", stderr(&o));
        serde_json::from_str::<serde_json::Value>(&stdout(&o)).unwrap_or_else(|e| panic!("{args:?}: not JSON: {e}"));
        let f = dir.join(name);
        std::fs::write(&f, &o.stdout).unwrap();
        f
    };
    let p = prof.as_os_str();
    let report = json(&["report".as_ref(), p, "--json".as_ref()], "report.json");
    let old = json(&["report".as_ref(), p, "--format".as_ref(), "json".as_ref()], "report-old.json");
    assert_eq!(std::fs::read(&report).unwrap(), std::fs::read(&old).unwrap(), "--format json and --json differ");
    let diff = json(&["diff".as_ref(), p, p, "--json".as_ref()], "diff.json");
    json(&["diff".as_ref(), p, p, "--format".as_ref(), "json".as_ref()], "diff-old.json");
    let doctor = json(&["doctor".as_ref(), "--json".as_ref()], "doctor.json");
    let pprof = dir.join("p.pb.gz");
    let svg = dir.join("p.svg");
    let o = witch(["report".as_ref(), p, "--pprof".as_ref(), pprof.as_os_str(), "--flamegraph".as_ref(), svg.as_os_str()]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(v["profile"], prof.display().to_string(), "the JSON report does not name its profile");

    // The profile itself is read by all three.
    for args in [vec!["report".as_ref(), p], vec!["diff".as_ref(), p, p], vec!["gate".as_ref(), "--max-waste".as_ref(), "100%".as_ref(), p]]
    {
        let o = witch(&args);
        assert_eq!(code(&o), 0, "{args:?}: {}", stderr(&o));
    }
    // Everything else is named, with what to give instead.
    for (file, what, instead) in [
        (&report, "JSON report", prof.display().to_string()),
        (&diff, "witch diff", prof.display().to_string()),
        (&doctor, "witch doctor", String::new()),
        (&pprof, "pprof", "go tool pprof".to_string()),
        (&svg, "flame graph", String::new()),
    ] {
        let f = file.as_os_str();
        for args in [
            vec!["report".as_ref(), f],
            vec!["diff".as_ref(), p, f],
            vec!["diff".as_ref(), f, p],
            vec!["gate".as_ref(), "--max-waste".as_ref(), "20%".as_ref(), f],
            vec!["gate".as_ref(), "--max-increase".as_ref(), "2".as_ref(), "--baseline".as_ref(), f, p],
        ] {
            let o = witch(&args);
            let err = stderr(&o);
            assert_eq!(code(&o), 2, "{args:?}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: not one line: {err}");
            assert!(
                err.contains(what) && err.contains(&instead),
                "{args:?}: does not say what {} is ({what}) and to give {instead}: {err}",
                file.display()
            );
            assert!(!err.contains("invalid type"), "{args:?}: serde's message: {err}");
        }
    }
}

/// `--max-waste`: "20%" and "20" are 20 percent; a bare number below 1 is
/// refused as ambiguous (a fraction of 0 to 1, as the JSON's, or percent?),
/// with both readings in the hint.
#[test]
fn max_waste_refuses_the_ambiguous_bare_fraction() {
    let fx = fixture();
    let p = save(&profile(fx, 0, BASE), "max-waste-forms.witch");
    let p = p.as_os_str();
    for (bound, want) in [("80%", 0), ("80", 0), ("70%", 1), ("70", 1), ("0.5%", 1)] {
        let o = witch(["gate".as_ref(), "--max-waste".as_ref(), bound.as_ref(), p]);
        assert_eq!(code(&o), want, "--max-waste {bound}: {}", stderr(&o));
    }
    let o = witch(["gate".as_ref(), "--max-waste".as_ref(), "0.2".as_ref(), p]);
    let err = stderr(&o);
    assert_eq!(code(&o), 2, "{err}");
    assert!(err.contains("ambiguous") && err.contains("20%") && err.contains("0.2%"), "{err}");
}
