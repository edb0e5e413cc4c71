//! `witch diff`: two profiles of one program, pair by pair.
//!
//! Pairs are matched by symbolized source location (each frame's function, file and
//! line; module file name + offset where unknown), so rebuilt binaries and different
//! load addresses still line up.

use crate::cli::DiffArgs;
use crate::model::{self, pct, SymPair};
use crate::report::JsonContext;
use crate::symbolize::Symbolizer;
use serde::Serialize;
use std::collections::HashMap;
use witchcraft::profile::Profile;

#[derive(Serialize)]
struct Side<'a> {
    file: String,
    program: &'a str,
    pid: u32,
    waste_fraction: f64,
    waste_bytes: f64,
    use_bytes: f64,
    samples: u64,
}

#[derive(Serialize)]
struct PairChange<'a> {
    /// "both", "new" (only in NEW) or "vanished" (only in BASE).
    status: &'static str,
    base_share: f64,
    new_share: f64,
    /// new_share − base_share, as a fraction (×100 for points).
    share_change: f64,
    base_waste_bytes: f64,
    new_waste_bytes: f64,
    watch: JsonContext<'a>,
    trap: JsonContext<'a>,
}

#[derive(Serialize)]
struct DiffJson<'a> {
    schema: u32,
    craft: &'static str,
    base: Side<'a>,
    new: Side<'a>,
    /// new − base waste fraction, as a fraction (×100 for percentage points).
    waste_fraction_change: f64,
    pairs: Vec<PairChange<'a>>,
}

pub fn run(a: &DiffArgs) -> anyhow::Result<i32> {
    let base = model::load(&a.base)?;
    let new = model::load(&a.new)?;
    if base.craft != new.craft {
        anyhow::bail!("cannot compare a {} profile with a {} profile", base.craft.name(), new.craft.name());
    }
    if base.program != new.program {
        eprintln!("witch: warning: the profiles are of different programs ({} and {})", base.program, new.program);
    }
    let bp = model::pairs(&base, &mut Symbolizer::new(&base.modules));
    let np = model::pairs(&new, &mut Symbolizer::new(&new.modules));
    let (bw, nw) = (base.totals().0, new.totals().0);

    let mut by_key: HashMap<String, usize> = HashMap::new();
    for (i, p) in bp.iter().enumerate() {
        by_key.insert(p.key(), i);
    }
    let mut seen = vec![false; bp.len()];
    let row = |status, b, n| row(status, b, n, bw, nw);
    let mut changes: Vec<PairChange> = Vec::new();
    for p in &np {
        match by_key.get(&p.key()) {
            Some(&i) => {
                seen[i] = true;
                changes.push(row("both", Some(&bp[i]), Some(p)));
            }
            None => changes.push(row("new", None, Some(p))),
        }
    }
    for (i, p) in bp.iter().enumerate() {
        if !seen[i] {
            changes.push(row("vanished", Some(p), None));
        }
    }
    // Pairs without waste on either side are not interesting to a diff of waste.
    changes.retain(|c| c.base_waste_bytes > 0.0 || c.new_waste_bytes > 0.0);
    changes.sort_by(|x, y| y.share_change.abs().total_cmp(&x.share_change.abs()).then(y.new_share.total_cmp(&x.new_share)));
    let d = DiffJson {
        schema: crate::report::REPORT_SCHEMA,
        craft: new.craft.name(),
        base: side(&base, &a.base),
        new: side(&new, &a.new),
        waste_fraction_change: new.waste_fraction() - base.waste_fraction(),
        pairs: changes,
    };
    let out = if a.json { serde_json::to_string_pretty(&d)? + "\n" } else { text(&d, &new, a.top) };
    crate::print(&out)?;
    Ok(0)
}

fn row<'a>(status: &'static str, b: Option<&'a SymPair>, n: Option<&'a SymPair>, bw: f64, nw: f64) -> PairChange<'a> {
    let sp = n.or(b).expect("one side");
    let bs = b.map_or(0.0, |x| model::ratio(x.waste, bw));
    let ns = n.map_or(0.0, |x| model::ratio(x.waste, nw));
    PairChange {
        status,
        base_share: bs,
        new_share: ns,
        share_change: ns - bs,
        base_waste_bytes: b.map_or(0.0, |x| x.waste),
        new_waste_bytes: n.map_or(0.0, |x| x.waste),
        watch: JsonContext { frames: &sp.watch },
        trap: JsonContext { frames: &sp.trap },
    }
}

fn side<'a>(p: &'a Profile, path: &std::path::Path) -> Side<'a> {
    let (w, _, u) = p.totals();
    Side {
        file: path.display().to_string(),
        program: &p.program,
        pid: p.pid,
        waste_fraction: p.waste_fraction(),
        waste_bytes: w,
        use_bytes: u,
        samples: model::counters(p).samples,
    }
}

fn pp(x: f64) -> String {
    format!("{:+.1}pp", x * 100.0)
}

fn text(d: &DiffJson, new: &Profile, top: usize) -> String {
    let w = model::words(new.craft);
    let mut o = String::new();
    o += &format!("witch diff: {}, {}\n", d.craft, d.new.program);
    for (label, s) in [("base", &d.base), ("new ", &d.new)] {
        o += &format!("  {label}  {}: {} {} ({} samples)\n", s.file, pct(s.waste_fraction), w.waste, s.samples);
    }
    o += &format!("Waste fraction: {} → {} ({})\n", pct(d.base.waste_fraction), pct(d.new.waste_fraction), pp(d.waste_fraction_change));
    if d.pairs.is_empty() {
        o += "\nNo pairs with waste in either profile.\n";
        return o;
    }
    let n = if top == 0 { d.pairs.len() } else { top.min(d.pairs.len()) };
    o += &format!("\nShare of waste, top {n} of {} pairs by change:\n", d.pairs.len());
    o += "    base     new   change\n";
    for c in d.pairs.iter().take(n) {
        let tag = match c.status {
            "new" => " [new]",
            "vanished" => " [vanished]",
            _ => "",
        };
        let first = |f: &JsonContext| f.frames.first().map_or("(no context)".to_string(), |f| f.display());
        o += &format!(
            "  {:>6}  {:>6}  {:>8}  {}{tag}\n                            {} {}\n",
            pct(c.base_share),
            pct(c.new_share),
            pp(c.share_change),
            first(&c.watch),
            w.trap,
            first(&c.trap),
        );
    }
    let count = |s: &str| d.pairs.iter().filter(|c| c.status == s).count();
    o += &format!("\n{} pairs in both, {} new, {} vanished\n", count("both"), count("new"), count("vanished"));
    o
}
