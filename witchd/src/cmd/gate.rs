//! `witch gate`: the CI regression gate. Exit 0 pass, 1 fail (2 for errors, in main).
//!
//! A bound fails only when the waste fraction is above it beyond the noise:
//! the whole 95% interval of the fraction (for --max-waste), or of its
//! increase over the baseline (for --max-increase), is above the bound. When
//! the interval straddles the bound the gate cannot tell, says so, and passes.
//!
//! By data object too: `--max-object-waste NAME=PERCENT` bounds the share
//! of an object's own bytes that are wasted (its interval as the report
//! gives it), and the objects with the most waste are named on stderr.

use crate::analysis::{self as model, interval};
use crate::cli::GateArgs;
use crate::render::units::printable;

/// How one bound came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BoundVerdict {
    Pass,
    Fail,
    /// The bound lies within the interval: the data cannot say.
    CannotTell,
}

/// One bound's outcome, also one JUnit test case.
struct BoundCheck {
    name: String,
    verdict: BoundVerdict,
    /// The figures, e.g. "waste 34.2% (95% interval 30.1–38.4%) > max 20.0%".
    detail: String,
}

/// Tolerance so a fraction printed as equal to the bound does not fail on float noise.
const EPS: f64 = 1e-9;

fn verdict(lo: f64, hi: f64, max: f64) -> BoundVerdict {
    if lo > max + EPS {
        BoundVerdict::Fail
    } else if hi <= max + EPS {
        BoundVerdict::Pass
    } else {
        BoundVerdict::CannotTell
    }
}

fn word(v: BoundVerdict, pass: &'static str, fail: &'static str) -> &'static str {
    match v {
        BoundVerdict::Pass => pass,
        BoundVerdict::Fail => fail,
        BoundVerdict::CannotTell => "within the noise of",
    }
}

pub fn run(a: &GateArgs) -> anyhow::Result<i32> {
    let p = super::report::load(&a.profile)?;
    let f = model::run_sums(&p).fraction();
    // A gate never passes what it cannot compute (report::load refuses
    // such sums already; this holds whatever the estimate's arithmetic).
    let cannot =
        |what: &std::path::Path| anyhow::anyhow!("{}: its waste fraction cannot be computed (it came out {:?})", what.display(), f.value);
    if !f.finite() {
        return Err(cannot(&a.profile));
    }
    let pc = |x: f64| x * 100.0;
    let mut checks = Vec::new();
    if let Some(max) = a.max_waste {
        let v = verdict(pc(f.lo), pc(f.hi), max);
        checks.push(BoundCheck {
            name: format!("max-waste {max:.1}%"),
            verdict: v,
            detail: format!("waste {:.1}% ({}) {} max {max:.1}%", pc(f.value), crate::render::units::uncertainty(&f), word(v, "<=", ">")),
        });
    }
    if let (Some(base), Some(max)) = (&a.baseline, a.max_increase) {
        let b = super::report::load(base)?;
        if b.craft != p.craft {
            anyhow::bail!(
                "baseline {} is a {} profile, {} is a {} profile",
                base.display(),
                b.craft.name(),
                a.profile.display(),
                p.craft.name()
            );
        }
        if b.program != p.program {
            crate::say!("witch: warning: baseline is of a different program ({})", printable(&b.program));
        }
        let bf = model::run_sums(&b).fraction();
        let inc = interval::difference(&bf, &f);
        if !bf.finite() || !inc.finite() {
            anyhow::bail!("{}: the waste fraction's increase over it cannot be computed", base.display());
        }
        let v = verdict(pc(inc.lo), pc(inc.hi), max);
        checks.push(BoundCheck {
            name: format!("max-increase {max:.1}pp"),
            verdict: v,
            detail: format!(
                "waste {:.1}% is {:+.1}pp ({}) over baseline {:.1}%, {} max +{max:.1}pp",
                pc(f.value),
                pc(inc.value),
                if inc.is_exact() { "exact counts".into() } else { format!("95% interval {:+.1} to {:+.1}pp", pc(inc.lo), pc(inc.hi)) },
                pc(bf.value),
                word(v, "<=", ">")
            ),
        });
    }
    let objects = objects(&p, a, &mut checks)?;
    if checks.is_empty() {
        anyhow::bail!("give a bound: --max-waste PERCENT, --max-object-waste NAME=PERCENT, or --baseline BASE with --max-increase POINTS");
    }
    let fail = checks.iter().any(|c| c.verdict == BoundVerdict::Fail);
    let unsure = checks.iter().any(|c| c.verdict == BoundVerdict::CannotTell);
    let head = match (fail, unsure) {
        (true, _) => "FAIL",
        (false, true) => "PASS (cannot tell)",
        _ => "PASS",
    };
    let details: Vec<&str> = checks.iter().map(|c| c.detail.as_str()).collect();
    let verdict = format!(
        "witch gate: {head} {} ({}, {})\n",
        details.join("; "),
        p.craft.name(),
        printable(&crate::symbolize::short_path(&p.program))
    );
    if let Some(path) = &a.junit {
        let xml = junit(&checks, p.craft.name(), &p.program);
        crate::write::bytes(path, xml.as_bytes())?;
    }
    crate::print(&verdict)?;
    for line in objects {
        crate::say!("{line}");
    }
    if unsure && !fail {
        crate::say!("witch gate: the bound lies within the 95% interval: more samples (a longer run, or a smaller -p) would tell");
    }
    Ok(if fail { crate::exit::GATE_FAILED } else { 0 })
}

/// Does the object answer to `name`: its name or key as printed, a static
/// object's symbol, or a heap object's allocation site (`file.c:LINE`, with
/// or without its directories)?
fn answers_to(o: &crate::analysis::objects::Object, name: &str) -> bool {
    if o.name == name || o.key == name || o.name.strip_prefix(name).is_some_and(|rest| rest.starts_with(" (")) {
        return true;
    }
    // "heap from main (src/app.c:38)": a heap object by its allocation site
    // (a static object's parentheses name its module, not a site).
    if o.kind != crate::analysis::objects::ObjectKind::Heap {
        return false;
    }
    let site = o.name.strip_suffix(')').and_then(|n| n.rsplit_once('(')).map(|(_, s)| s);
    site.is_some_and(|s| s == name || s.strip_suffix(name).is_some_and(|d| d.ends_with('/')))
}

/// The per-object bounds as checks, and the lines that name the three
/// objects with the most waste (for stderr; none when the profile keeps no
/// objects). An object bound that names no object of the profile is an
/// error (a misspelt name would pass forever).
fn objects(p: &witchcraft::profile::Profile, a: &GateArgs, checks: &mut Vec<BoundCheck>) -> anyhow::Result<Vec<String>> {
    use crate::analysis::objects;
    let run = model::Analysis::of(p);
    if !objects::kept(&run) {
        if a.max_object_waste.is_empty() {
            return Ok(Vec::new());
        }
        anyhow::bail!("{}: the profile keeps no data objects (an exact run, or one from before objects were kept)", a.profile.display());
    }
    let all = objects::merged(&run);
    let total = run.total();
    let pc = |x: f64| x * 100.0;
    for (name, max) in &a.max_object_waste {
        let found: Vec<_> = all.iter().map(|(o, _)| o).filter(|o| answers_to(o, name)).collect();
        if found.is_empty() {
            let names: Vec<&str> = all.iter().take(8).map(|(o, _)| o.name.as_str()).collect();
            anyhow::bail!("no data object `{name}` in {} (its objects: {})", a.profile.display(), names.join("; "));
        }
        for o in found {
            let f = o.sums.fraction();
            let v = verdict(pc(f.lo), pc(f.hi), *max);
            checks.push(BoundCheck {
                name: format!("max-object-waste {} {max:.1}%", o.name),
                verdict: v,
                detail: format!(
                    "{}: waste {:.1}% of its bytes ({}) {} max {max:.1}%",
                    printable(&o.name),
                    pc(f.value),
                    crate::render::units::uncertainty(&f),
                    word(v, "<=", ">")
                ),
            });
        }
    }
    let lines = all
        .iter()
        .filter(|(o, _)| o.sums.waste > 0.0)
        .take(3)
        .map(|(o, _)| {
            let s = o.sums.share_of(&total);
            format!(
                "witch gate: object {}: {:.1}% of all waste (95% interval {:.1}–{:.1}%), {:.1}% of its bytes wasted",
                printable(&o.name),
                pc(s.value),
                pc(s.lo),
                pc(s.hi),
                pc(o.sums.fraction().value)
            )
        })
        .collect();
    Ok(lines)
}

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            c if (c as u32) < 0x20 && !matches!(c, '\n' | '\t' | '\r') => {}
            c => o.push(c),
        }
    }
    o
}

/// One test suite, one test case per bound; a failed bound has a `<failure>`,
/// one the data cannot decide is `<skipped>` with the reason.
fn junit(checks: &[BoundCheck], craft: &str, program: &str) -> String {
    let failures = checks.iter().filter(|c| c.verdict == BoundVerdict::Fail).count();
    let skipped = checks.iter().filter(|c| c.verdict == BoundVerdict::CannotTell).count();
    let mut o = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    o += &format!(
        "<testsuite name=\"witch gate\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\" time=\"0\">\n",
        checks.len()
    );
    for c in checks {
        let class = esc(&format!("witch.{craft}.{program}"));
        o += &format!("  <testcase classname=\"{class}\" name=\"{}\" time=\"0\"", esc(&c.name));
        match c.verdict {
            BoundVerdict::Pass => o += &format!(">\n    <system-out>{}</system-out>\n  </testcase>\n", esc(&c.detail)),
            BoundVerdict::Fail => {
                o += &format!(
                    ">\n    <failure message=\"{}\" type=\"witch.gate\">{}</failure>\n  </testcase>\n",
                    esc(&c.detail),
                    esc(&format!("{} ({craft}, {program})", c.detail))
                )
            }
            BoundVerdict::CannotTell => o += &format!(">\n    <skipped message=\"cannot tell: {}\"/>\n  </testcase>\n", esc(&c.detail)),
        }
    }
    o += "</testsuite>\n";
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn junit_escapes_and_counts() {
        let c = [
            BoundCheck { name: "a".into(), verdict: BoundVerdict::Pass, detail: "x <= y".into() },
            BoundCheck { name: "b".into(), verdict: BoundVerdict::Fail, detail: "x > \"y\"".into() },
            BoundCheck { name: "c".into(), verdict: BoundVerdict::CannotTell, detail: "x ~ y".into() },
        ];
        let x = junit(&c, "dead", "./a&b");
        assert!(x.contains("tests=\"3\" failures=\"1\" errors=\"0\" skipped=\"1\""));
        assert!(x.contains("&gt; &quot;y&quot;"));
        assert!(x.contains("witch.dead../a&amp;b"));
        assert_eq!(x.matches("<failure").count(), 1);
        assert_eq!(x.matches("<skipped").count(), 1);
    }

    #[test]
    fn objects_answer_to_their_symbol_site_name_or_key() {
        use crate::analysis::objects::{Object, ObjectKind};
        let o = |kind, name: &str, key: &str| Object {
            kind,
            name: name.into(),
            key: key.into(),
            size: None,
            site: Vec::new(),
            sums: Default::default(),
        };
        let table = o(ObjectKind::Static, "table (app)", "static:app:table");
        for n in ["table", "table (app)", "static:app:table"] {
            assert!(answers_to(&table, n), "{n}");
        }
        assert!(!answers_to(&table, "tab") && !answers_to(&table, "app"));
        let heap = o(ObjectKind::Heap, "heap from main (src/app.c:38)", "heap:main@src/app.c:38");
        for n in ["app.c:38", "src/app.c:38", "heap from main (src/app.c:38)"] {
            assert!(answers_to(&heap, n), "{n}");
        }
        for n in ["p.c:38", "app.c:3", "main"] {
            assert!(!answers_to(&heap, n), "{n}");
        }
        assert!(answers_to(&o(ObjectKind::Stack, "stack", "stack"), "stack"));
    }

    #[test]
    fn a_bound_fails_only_beyond_the_noise() {
        assert_eq!(verdict(21.0, 25.0, 20.0), BoundVerdict::Fail);
        assert_eq!(verdict(15.0, 19.0, 20.0), BoundVerdict::Pass);
        assert_eq!(verdict(18.0, 23.0, 20.0), BoundVerdict::CannotTell);
    }
}
