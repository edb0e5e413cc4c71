//! `witch doctor`: what this machine offers, one line per check, with what to do.

use crate::cli::DoctorArgs;
use witchcraft::probe::{checks, Check, Status};

fn word(s: &Status) -> &'static str {
    match s {
        Status::Ok => "ok",
        Status::Degraded => "degraded",
        Status::Missing => "missing",
    }
}

/// `name .... status  detail (advice)`, names dot-padded to one column.
pub fn render(cs: &[Check]) -> String {
    let width = cs.iter().map(|c| c.name.chars().count()).max().unwrap_or(0) + 4;
    let mut o = String::new();
    for c in cs {
        let dots = ".".repeat(width - c.name.chars().count());
        o += &format!("{} {dots} {:<8}  {}", c.name, word(&c.status), c.detail);
        if let Some(a) = c.advice.as_deref().filter(|a| !a.is_empty()) {
            o += &format!(" ({a})");
        }
        o.push('\n');
    }
    o
}

pub fn run(a: &DoctorArgs) -> anyhow::Result<i32> {
    let cs = checks();
    let out = if a.json {
        #[derive(serde::Serialize)]
        struct J<'a> {
            name: &'a str,
            status: &'static str,
            detail: &'a str,
            advice: Option<&'a str>,
        }
        let v: Vec<J> =
            cs.iter().map(|c| J { name: &c.name, status: word(&c.status), detail: &c.detail, advice: c.advice.as_deref() }).collect();
        serde_json::to_string_pretty(&v)? + "\n"
    } else {
        render(&cs)
    };
    crate::print(&out)?;
    Ok(0)
}
