//! Data objects end to end: the waste of a known-answer program lands on the
//! right objects (tests/programs/objects_known.c: a static array and a heap
//! buffer each hold half of the waste; a second heap buffer holds none),
//! launched and through `--pid`.

use serde_json::Value;
use witch_tests::attach::attach_cmd;
use witch_tests::*;

/// The report's object whose key or name satisfies `is`.
fn object(rep: &Report, is: impl Fn(&Value) -> bool) -> Option<&Value> {
    rep.json["objects"].as_array()?.iter().find(|o| is(o))
}

fn num(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(f64::NAN)
}

/// The heap object allocated at `marker`'s line of the program.
fn heap_at<'r>(rep: &'r Report, prog: &Program, marker: &str) -> Option<&'r Value> {
    let line = prog.line(marker);
    object(rep, |o| {
        o["kind"] == "heap" && o["site"].as_array().and_then(|s| s.first()).is_some_and(|f| f["line"] == line && f["function"] == "main")
    })
}

/// `table` and the @wasted_alloc buffer hold half of the waste each (within
/// 5 points), the @used_alloc buffer none (it is tracked: its use is seen).
fn check_the_three_objects(rep: &Report, prog: &Program) {
    let table = object(rep, |o| o["kind"] == "static" && o["name"].as_str().is_some_and(|n| n.starts_with("table ")))
        .unwrap_or_else(|| panic!("no static object `table`\n{}", rep.dump()));
    let share = num(table, "share");
    assert!((share - 0.5).abs() <= 0.05, "table's share of the waste {share:.3}, want 0.50 ± 0.05\n{table:#}");
    let wasted = heap_at(rep, prog, "@wasted_alloc").unwrap_or_else(|| panic!("no heap object from @wasted_alloc\n{}", rep.dump()));
    let share = num(wasted, "share");
    assert!((share - 0.5).abs() <= 0.05, "the wasted buffer's share {share:.3}, want 0.50 ± 0.05\n{wasted:#}");
    assert_eq!(wasted["size"], (1u64 << 16) * 8, "{wasted:#}");
    let line = prog.line("@wasted_alloc");
    assert!(wasted["name"].as_str().is_some_and(|n| n.contains(&format!("objects_known.c:{line}"))), "{wasted:#}");
    let used = heap_at(rep, prog, "@used_alloc").unwrap_or_else(|| panic!("no heap object from @used_alloc\n{}", rep.dump()));
    // None of the program's stores to it is dead. The allocator's may be:
    // `malloc` writes its bookkeeping into memory it then hands out, and
    // the program's first store there kills it (measured: one trap, 0.03%
    // of the waste, a dead store in `_int_malloc` killed at @used_alloc's
    // fill), as an exhaustive count would say too.
    let program_waste: f64 = rep
        .pairs()
        .iter()
        .filter(|p| p["object"] == used["key"])
        .filter(|p| !frames(p, "watch").first().is_some_and(|f| f["module"].as_str().is_some_and(|m| m.contains("/libc.so"))))
        .map(|p| num(p, "waste"))
        .sum();
    assert_eq!(program_waste, 0.0, "the program's stores to the used buffer have waste\n{used:#}\n{}", rep.dump());
    assert!(num(used, "share") <= 0.01, "the used buffer holds {:.3} of the waste\n{used:#}", num(used, "share"));
    assert!(num(used, "use") > 0.0, "{used:#}");
    let unknown = object(rep, |o| o["kind"] == "unknown").map_or(0.0, |o| num(o, "share"));
    assert!(unknown <= 0.05, "{unknown:.3} of the waste on no object\n{}", rep.dump());
}

#[test]
fn static_array_and_heap_buffer_get_their_shares_of_the_waste() {
    let dir = Scratch::new("objects-static");
    let prog = Program::build("objects_known", dir.path());
    let (_, rep) = craft_run("dead", &prog, &dir, "objects", &["300"], &["-p", "50000"]);
    check_the_three_objects(&rep, &prog);
    let table = object(&rep, |o| o["kind"] == "static" && o["name"].as_str().is_some_and(|n| n.starts_with("table "))).unwrap();
    // Half of its stored bytes are dead.
    let (share, frac) = (num(table, "share"), num(table, "fraction"));
    assert!((frac - 0.5).abs() <= 0.08, "table's own dead fraction {frac:.3}, want 0.50 ± 0.08\n{table:#}");
    assert_eq!(table["size"], (1u64 << 16) * 8, "{table:#}");
    let ci = table["share_ci"].as_array().unwrap();
    assert!(ci[0].as_f64().unwrap() <= share && share <= ci[1].as_f64().unwrap(), "{table:#}");
    // Each pair names its object: the pair at the table's dead line is on
    // it, the one at the wasted buffer's on that.
    let f = &prog.file;
    let line = prog.line("@table_dead");
    let p = rep.first_pair(f, line, prog.line("@table_kill")).unwrap_or_else(|| panic!("no pair at {f}:{line}\n{}", rep.dump()));
    assert_eq!(p["object"], table["key"], "{p:#}");
    let line = prog.line("@wasted_dead");
    let p = rep.first_pair(f, line, prog.line("@wasted_kill")).unwrap_or_else(|| panic!("no pair at {f}:{line}\n{}", rep.dump()));
    assert_eq!(p["object"], heap_at(&rep, &prog, "@wasted_alloc").unwrap()["key"], "{p:#}");
    // The gate by object: `table` (half its bytes dead) fails a 20% bound,
    // the used buffer (none dead) passes a 5% one, and a name that is no
    // object of the profile is an error.
    let profile = dir.join("objects.json");
    let gate = |bound: String| {
        use std::ffi::OsStr;
        witch_raw(&[OsStr::new("gate"), OsStr::new("--max-object-waste"), OsStr::new(&bound), profile.as_os_str()])
    };
    let g = gate("table=20%".into());
    assert_eq!(g.code(), Some(1), "{}", g.describe());
    assert!(g.stdout_str().contains("FAIL") && g.stdout_str().contains("table (objects_known)"), "{}", g.describe());
    assert!(g.stderr_str().contains("witch gate: object "), "the gate names the objects with the most waste\n{}", g.describe());
    let g = gate(format!("objects_known.c:{}=5%", prog.line("@used_alloc")));
    assert_eq!(g.code(), Some(0), "{}", g.describe());
    let g = gate("no_such_array=5%".into());
    assert_eq!(g.code(), Some(2), "{}", g.describe());
}

/// The same through `--pid`: the buffers are allocated again every few reps,
/// so an attached session sees them allocated.
#[test]
fn attached_session_finds_the_static_array_and_the_heap_buffers() {
    let dir = Scratch::new("objects-attach");
    let prog = Program::build("objects_known", dir.path());
    let mut child = std::process::Command::new(&prog.exe)
        .arg("1000000")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", prog.exe.display()));
    std::thread::sleep(std::time::Duration::from_millis(200));
    let out = dir.join("attached.json");
    let run = attach_cmd(&witch_bin(), &[], "dead", child.id(), &["--duration", "1s", "-p", "50000", "-q", "-o", out.to_str().unwrap()]);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(run.code(), Some(0), "attach failed:\n{}", run.describe());
    let rep = report(&out);
    rep.assert_samples(50.0);
    check_the_three_objects(&rep, &prog);
}

/// The heap object allocated at `marker`'s line, in whatever function
/// the call was inlined into.
fn heap_from<'r>(rep: &'r Report, prog: &Program, marker: &str) -> Option<&'r Value> {
    let line = prog.line(marker);
    object(rep, |o| o["kind"] == "heap" && o["site"].as_array().and_then(|s| s.first()).is_some_and(|f| f["line"] == line))
}

/// tests/programs/heap_remap.c: the rest of a mapping that mremap grew and
/// moved and munmap cut in half holds 2/3 of the waste, under its
/// allocation's name (@map_a) and the size it has left; a mapping put
/// where the first one was (@map_b) holds the other 1/3; the reservation
/// the first was moved into (@reserve), and every range unmapped, none.
/// (Before `mremap` was followed and `munmap` trimmed, A's rest went to
/// the reservation and B's waste to A.)
fn check_the_remapped_objects(rep: &Report, prog: &Program) {
    let a = heap_from(rep, prog, "@map_a").unwrap_or_else(|| panic!("no heap object from @map_a\n{}", rep.dump()));
    let share = num(a, "share");
    assert!((share - 2.0 / 3.0).abs() <= 0.07, "the remapped mapping's share {share:.3}, want 0.67 ± 0.07\n{}", rep.dump());
    assert_eq!(a["size"], 1u64 << 20, "what is left of it after the cut\n{a:#}");
    let b = heap_from(rep, prog, "@map_b").unwrap_or_else(|| panic!("no heap object from @map_b\n{}", rep.dump()));
    let share = num(b, "share");
    assert!((share - 1.0 / 3.0).abs() <= 0.07, "the second mapping's share {share:.3}, want 0.33 ± 0.07\n{}", rep.dump());
    for gone in ["@reserve", "@grow", "@move"] {
        if let Some(o) = heap_from(rep, prog, gone) {
            assert_eq!(num(o, "waste"), 0.0, "waste on the object from {gone}\n{}", rep.dump());
        }
    }
    let unknown = object(rep, |o| o["kind"] == "unknown").map_or(0.0, |o| num(o, "share"));
    assert!(unknown <= 0.05, "{unknown:.3} of the waste on no object\n{}", rep.dump());
}

#[test]
fn a_mapping_moved_by_mremap_and_cut_by_munmap_keeps_its_waste() {
    let dir = Scratch::new("objects-remap");
    let prog = Program::build("heap_remap", dir.path());
    let (_, rep) = craft_run("dead", &prog, &dir, "remap", &["200"], &["-p", "100000"]);
    check_the_remapped_objects(&rep, &prog);
    let f = &prog.file;
    for (dead, kill, on) in [("@rest_dead1", "@rest_dead2", "@map_a"), ("@b_dead", "@b_kill", "@map_b")] {
        let line = prog.line(dead);
        let p = rep.first_pair(f, line, prog.line(kill)).unwrap_or_else(|| panic!("no pair at {f}:{line}\n{}", rep.dump()));
        assert_eq!(p["object"], heap_from(&rep, &prog, on).unwrap()["key"], "{p:#}");
    }
}

/// The same through `--pid` (the mappings are made again every 4 reps).
#[test]
fn attached_session_follows_mremap_and_munmap() {
    let dir = Scratch::new("objects-remap-attach");
    let prog = Program::build("heap_remap", dir.path());
    let mut child = std::process::Command::new(&prog.exe)
        .arg("1000000")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", prog.exe.display()));
    std::thread::sleep(std::time::Duration::from_millis(100));
    let out = dir.join("attached.json");
    let run = attach_cmd(&witch_bin(), &[], "dead", child.id(), &["--duration", "1s", "-p", "100000", "-q", "-o", out.to_str().unwrap()]);
    let alive = child.try_wait().ok().flatten().is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert!(alive, "the program ended during the session:\n{}", run.describe());
    assert_eq!(run.code(), Some(0), "attach failed:\n{}", run.describe());
    let rep = report(&out);
    rep.assert_samples(50.0);
    check_the_remapped_objects(&rep, &prog);
}

/// The same stores with a loop per store line (tests/programs/objects_loops.c):
/// the exact answer is the same, so `table`'s own dead fraction is 50%. The
/// time-driven software sampler lands its windows in the first store loop
/// after the load-only read loop about a third more often than in the
/// others (natively they take the same time), and measures 55% to 60%
/// here; a PMU or `-e sw-stores` counts accesses instead.
#[test]
#[ignore = "known bias: the software sampler's windows oversample the store loop after a load-only loop"]
fn a_loop_per_store_line_keeps_the_tables_dead_fraction() {
    let dir = Scratch::new("objects-loops");
    let prog = Program::build("objects_loops", dir.path());
    let (_, rep) = craft_run("dead", &prog, &dir, "objects", &["300"], &["-p", "50000"]);
    let table = object(&rep, |o| o["kind"] == "static" && o["name"].as_str().is_some_and(|n| n.starts_with("table ")))
        .unwrap_or_else(|| panic!("no static object `table`\n{}", rep.dump()));
    let frac = num(table, "fraction");
    assert!((frac - 0.5).abs() <= 0.05, "table's own dead fraction {frac:.3}, want 0.50 ± 0.05\n{table:#}");
}
