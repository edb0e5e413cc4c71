//! `witch gate`: the CI regression gate. Exit 0 pass, 1 fail (2 for errors, in main).

use crate::cli::GateArgs;
use crate::model;

/// One bound's outcome, also one JUnit test case.
struct Check {
    name: String,
    passed: bool,
    /// The figures, e.g. "waste 34.2% > max 20.0%".
    detail: String,
}

/// Tolerance so a fraction printed as equal to the bound does not fail on float noise.
const EPS: f64 = 1e-9;

pub fn run(a: &GateArgs) -> anyhow::Result<i32> {
    let p = model::load(&a.profile)?;
    let frac = p.waste_fraction() * 100.0;
    let mut checks = Vec::new();
    if let Some(max) = a.max_waste {
        let passed = frac <= max + EPS;
        checks.push(Check {
            name: format!("max-waste {max:.1}%"),
            passed,
            detail: format!("waste {frac:.1}% {} max {max:.1}%", if passed { "<=" } else { ">" }),
        });
    }
    if let (Some(base), Some(max)) = (&a.baseline, a.max_increase) {
        let b = model::load(base)?;
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
            eprintln!("witch: warning: baseline is of a different program ({})", b.program);
        }
        let bf = b.waste_fraction() * 100.0;
        let inc = frac - bf;
        let passed = inc <= max + EPS;
        checks.push(Check {
            name: format!("max-increase {max:.1}pp"),
            passed,
            detail: format!("waste {frac:.1}% is {inc:+.1}pp over baseline {bf:.1}%, {} max +{max:.1}pp", if passed { "<=" } else { ">" }),
        });
    }
    if checks.is_empty() {
        anyhow::bail!("give a bound: --max-waste PERCENT, or --baseline BASE with --max-increase POINTS");
    }
    let pass = checks.iter().all(|c| c.passed);
    let details: Vec<&str> = checks.iter().map(|c| c.detail.as_str()).collect();
    let verdict =
        format!("witch gate: {} {} ({}, {})\n", if pass { "PASS" } else { "FAIL" }, details.join("; "), p.craft.name(), p.program);
    if let Some(path) = &a.junit {
        let xml = junit(&checks, p.craft.name(), &p.program);
        std::fs::write(path, xml).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    }
    crate::print(&verdict)?;
    Ok(if pass { 0 } else { 1 })
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

/// One test suite, one test case per bound; a failed bound has a `<failure>`.
fn junit(checks: &[Check], craft: &str, program: &str) -> String {
    let failures = checks.iter().filter(|c| !c.passed).count();
    let mut o = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    o += &format!(
        "<testsuite name=\"witch gate\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" skipped=\"0\" time=\"0\">\n",
        checks.len()
    );
    for c in checks {
        let class = esc(&format!("witch.{craft}.{program}"));
        o += &format!("  <testcase classname=\"{class}\" name=\"{}\" time=\"0\"", esc(&c.name));
        if c.passed {
            o += &format!(">\n    <system-out>{}</system-out>\n  </testcase>\n", esc(&c.detail));
        } else {
            o += &format!(
                ">\n    <failure message=\"{}\" type=\"witch.gate\">{}</failure>\n  </testcase>\n",
                esc(&c.detail),
                esc(&format!("{} ({craft}, {program})", c.detail))
            );
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
            Check { name: "a".into(), passed: true, detail: "x <= y".into() },
            Check { name: "b".into(), passed: false, detail: "x > \"y\"".into() },
        ];
        let x = junit(&c, "dead", "./a&b");
        assert!(x.contains("tests=\"2\" failures=\"1\""));
        assert!(x.contains("&gt; &quot;y&quot;"));
        assert!(x.contains("witch.dead../a&amp;b"));
        assert_eq!(x.matches("<failure").count(), 1);
    }
}
