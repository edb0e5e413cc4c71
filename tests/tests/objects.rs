//! Data objects end to end: the waste of a known-answer program lands on the
//! right objects (tests/programs/objects_known.c: a static array and a heap
//! buffer each hold half of the waste; a second heap buffer holds none).

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

#[test]
fn static_array_gets_its_share_of_the_waste() {
    let dir = Scratch::new("objects-static");
    let prog = Program::build("objects_known", dir.path());
    let (_, rep) = craft_run("dead", &prog, &dir, "objects", &["300"], &["-p", "50000"]);
    let table = object(&rep, |o| o["kind"] == "static" && o["name"].as_str().is_some_and(|n| n.starts_with("table ")))
        .unwrap_or_else(|| panic!("no static object `table`\n{}", rep.dump()));
    // Half of all waste, by construction; half of its stored bytes are dead.
    let (share, frac) = (num(table, "share"), num(table, "fraction"));
    assert!((share - 0.5).abs() <= 0.05, "table's share of the waste {share:.3}, want 0.50 ± 0.05\n{table:#}");
    assert!((frac - 0.5).abs() <= 0.08, "table's own dead fraction {frac:.3}, want 0.50 ± 0.08\n{table:#}");
    assert_eq!(table["size"], (1u64 << 16) * 8, "{table:#}");
    let ci = table["share_ci"].as_array().unwrap();
    assert!(ci[0].as_f64().unwrap() <= share && share <= ci[1].as_f64().unwrap(), "{table:#}");
    // Each pair names its object: the pair at the table's dead line is on it.
    let f = &prog.file;
    let line = prog.line("@table_dead");
    let p = rep.first_pair(f, line, prog.line("@table_kill")).unwrap_or_else(|| panic!("no pair at {f}:{line}\n{}", rep.dump()));
    assert_eq!(p["object"], table["key"], "{p:#}");
}

/// The same through `--pid`: an attached session finds the static array.
#[test]
fn attached_session_finds_the_static_array() {
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
    let table = object(&rep, |o| o["kind"] == "static" && o["name"].as_str().is_some_and(|n| n.starts_with("table ")))
        .unwrap_or_else(|| panic!("no static object `table`\n{}", rep.dump()));
    let share = num(table, "share");
    assert!((share - 0.5).abs() <= 0.05, "table's share of the waste {share:.3}, want 0.50 ± 0.05\n{table:#}");
}
