//! Help text, usage errors and `witch doctor`.

mod common;
use common::*;

#[test]
fn every_help_shows_an_example() {
    let o = witch(["--help"]);
    assert!(o.status.success());
    let t = stdout(&o);
    for c in ["dead", "silent-store", "silent-load", "report", "diff", "gate", "doctor", "Examples:"] {
        assert!(t.contains(c), "top help lacks {c}:\n{t}");
    }
    for sub in ["dead", "silent-store", "silent", "silent-load", "load", "report", "diff", "gate", "doctor"] {
        let o = witch([sub, "--help"]);
        assert!(o.status.success(), "{sub}");
        let t = stdout(&o);
        assert!(t.contains("Examples:") && t.contains("witch "), "{sub} help:\n{t}");
    }
    let t = stdout(&witch(["dead", "--help"]));
    for opt in
        ["--event", "--period", "--debug-registers", "--replacement", "--fp-precision", "--top", "--json", "--output", "--quiet", "--exact"]
    {
        assert!(t.contains(opt), "dead help lacks {opt}");
    }
}

/// Usage errors exit 2, except where witch runs a program: there they exit
/// 125, so that they cannot be mistaken for the program's own status.
#[test]
fn usage_errors_exit_2_or_125_where_a_program_runs() {
    for args in [vec![], vec!["frobnicate"], vec!["report"], vec!["gate", "p.json"], vec!["dead", "--pid", "x"]] {
        let o = witch(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    }
    for args in [
        vec!["dead"],
        vec!["dead", "--debug-registers", "9", "./app"],
        vec!["dead", "--replacement", "lifo", "./app"],
        vec!["silent-load", "-p", "0", "./app"],
    ] {
        let o = witch(&args);
        assert_eq!(o.status.code(), Some(125), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn doctor_runs() {
    let o = witch(["doctor"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    for l in stdout(&o).lines() {
        assert!(l.contains(" ok ") || l.contains(" degraded ") || l.contains(" missing "), "{l}");
    }
    assert!(!stdout(&o).trim().is_empty(), "doctor printed nothing");
    let o = witch(["doctor", "--json"]);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(v.is_array());
}
