//! `witch diff`: two profiles of one program, pair by pair.
//!
//! Pairs are matched by symbolized source location (each frame's function, file and
//! line; module file name + offset where unknown), so rebuilt binaries and different
//! load addresses still line up. Every change carries a 95% interval, the
//! difference of two independent estimates, so a change within the noise says so.

use crate::analysis::context::{Interner, KeyCtx};
use crate::analysis::interval::{self, Estimate, Sums};
use crate::analysis::{self, Analysis, SymPair};
use crate::cli::DiffArgs;
use crate::render::json::JsonContext;
use crate::render::units::{pct, printable};
use serde::Serialize;
use std::collections::HashMap;
use std::ops::Range;
use witchcraft::profile::Profile;

#[derive(Serialize)]
struct Side<'a> {
    file: String,
    program: &'a str,
    pid: u32,
    unit: &'static str,
    waste_fraction: f64,
    waste_fraction_ci: [f64; 2],
    /// The fraction is a count (an exact profile's): for the text.
    #[serde(skip)]
    exact: bool,
    waste: f64,
    r#use: f64,
    samples: u64,
    traps: u64,
}

#[derive(Serialize)]
struct PairChange<'a> {
    /// "both", "new" (only in NEW) or "vanished" (only in BASE).
    status: &'static str,
    base_share: f64,
    base_share_ci: [f64; 2],
    new_share: f64,
    new_share_ci: [f64; 2],
    /// new_share − base_share, as a fraction (×100 for points), and its 95% interval.
    share_change: f64,
    share_change_ci: [f64; 2],
    /// The change's interval excludes 0.
    beyond_noise: bool,
    base_waste: f64,
    new_waste: f64,
    watch: JsonContext<'a>,
    trap: JsonContext<'a>,
}

#[derive(Serialize)]
struct DiffJson<'a> {
    schema: u32,
    craft: &'static str,
    base: Side<'a>,
    new: Side<'a>,
    /// new − base waste fraction, as a fraction (×100 for percentage points), and its 95% interval.
    waste_fraction_change: f64,
    waste_fraction_change_ci: [f64; 2],
    /// The change is the difference of two counts: for the text.
    #[serde(skip)]
    change_exact: bool,
    beyond_noise: bool,
    pairs: Vec<PairChange<'a>>,
    /// Data objects matched by key (static objects by module and symbol,
    /// heap objects by allocation context); empty unless both profiles keep
    /// objects.
    objects: Vec<ObjectChange>,
}

#[derive(Serialize)]
struct ObjectChange {
    /// "both", "new" or "vanished", as for pairs.
    status: &'static str,
    key: String,
    name: String,
    base_share: f64,
    base_share_ci: [f64; 2],
    new_share: f64,
    new_share_ci: [f64; 2],
    share_change: f64,
    share_change_ci: [f64; 2],
    beyond_noise: bool,
}

/// The objects of two runs, matched by key, by size of change.
fn object_changes(an: &Analysis, b: Range<usize>, n: Range<usize>, bt: &Sums, nt: &Sums) -> Vec<ObjectChange> {
    use crate::analysis::objects;
    if !objects::kept_in(&an.procs[b.clone()]) || !objects::kept_in(&an.procs[n.clone()]) {
        return Vec::new();
    }
    let (bo, no) = (objects::merged_of(&an.procs[b]), objects::merged_of(&an.procs[n]));
    let zero = Estimate::default();
    let change = |status, bs: Option<&objects::Object>, ns: Option<&objects::Object>| {
        let o = ns.or(bs).expect("one side");
        let (x, y) = (bs.map_or(zero, |x| x.sums.share_of(bt)), ns.map_or(zero, |x| x.sums.share_of(nt)));
        let d = interval::difference(&x, &y);
        ObjectChange {
            status,
            key: o.key.clone(),
            name: o.name.clone(),
            base_share: x.value,
            base_share_ci: ci(&x),
            new_share: y.value,
            new_share_ci: ci(&y),
            share_change: d.value,
            share_change_ci: [d.lo, d.hi],
            beyond_noise: d.lo > 0.0 || d.hi < 0.0,
        }
    };
    let mut out: Vec<ObjectChange> = Vec::new();
    for (o, _) in &no {
        let base = bo.iter().find(|(x, _)| x.key == o.key).map(|(x, _)| x);
        out.push(change(if base.is_some() { "both" } else { "new" }, base, Some(o)));
    }
    for (o, _) in bo.iter().filter(|(x, _)| !no.iter().any(|(y, _)| y.key == x.key)) {
        out.push(change("vanished", Some(o), None));
    }
    out.retain(|c| c.base_share > 0.0 || c.new_share > 0.0);
    out.sort_by(|x, y| y.share_change.abs().total_cmp(&x.share_change.abs()).then(y.new_share.total_cmp(&x.new_share)));
    out
}

/// A pair's identity across profiles: its two contexts by frame identity.
type PairKey = (KeyCtx, KeyCtx);

/// A run's pairs merged across its processes, by identity, and their total.
fn by_key<'a>(an: &'a Analysis<'a>, procs: Range<usize>) -> (Vec<(PairKey, SymPair)>, Sums) {
    let mut index: HashMap<(KeyCtx, KeyCtx), usize> = HashMap::new();
    let mut out: Vec<(PairKey, SymPair)> = Vec::new();
    let mut total = Sums::default();
    for x in &an.procs[procs] {
        total.add(&x.total);
        for sp in &x.pairs {
            match index.get(&sp.key) {
                Some(&i) => out[i].1.sums.add(&sp.sums),
                None => {
                    index.insert(sp.key, out.len());
                    out.push((sp.key, sp.clone()));
                }
            }
        }
    }
    (out, total)
}

pub fn run(a: &DiffArgs) -> anyhow::Result<i32> {
    let base = super::report::load(&a.base)?;
    let new = super::report::load(&a.new)?;
    if base.craft != new.craft {
        anyhow::bail!("cannot compare a {} profile with a {} profile", base.craft.name(), new.craft.name());
    }
    if base.program != new.program {
        crate::say!(
            "witch: warning: the profiles are of different programs ({} and {})",
            printable(&base.program),
            printable(&new.program)
        );
    }
    if base.value_unit() != new.value_unit() {
        crate::say!(
            "witch: warning: the profiles weigh waste in different units ({} and {}): shares and fractions compare, amounts do not",
            base.value_unit().label(),
            new.value_unit().label()
        );
    }
    // One analysis over both, so the same source-level contexts have the same ids.
    let mut an = Analysis::default();
    let b = an.add(&base);
    let n = an.add(&new);
    let (bp, bt) = by_key(&an, b.clone());
    let (np, nt) = by_key(&an, n.clone());

    let mut index: HashMap<(KeyCtx, KeyCtx), usize> = HashMap::new();
    for (i, (k, _)) in bp.iter().enumerate() {
        index.insert(*k, i);
    }
    let mut seen = vec![false; bp.len()];
    let names = &an.names;
    let row = |status, b: Option<&SymPair>, n: Option<&SymPair>| row(names, status, b, n, &bt, &nt);
    let mut changes: Vec<PairChange> = Vec::new();
    for (k, p) in &np {
        match index.get(k) {
            Some(&i) => {
                seen[i] = true;
                changes.push(row("both", Some(&bp[i].1), Some(p)));
            }
            None => changes.push(row("new", None, Some(p))),
        }
    }
    for (i, (_, p)) in bp.iter().enumerate() {
        if !seen[i] {
            changes.push(row("vanished", Some(p), None));
        }
    }
    // Pairs without waste on either side are not interesting to a diff of waste.
    changes.retain(|c| c.base_waste > 0.0 || c.new_waste > 0.0);
    changes.sort_by(|x, y| y.share_change.abs().total_cmp(&x.share_change.abs()).then(y.new_share.total_cmp(&x.new_share)));
    let change = interval::difference(&bt.fraction(), &nt.fraction());
    let objects = object_changes(&an, b.clone(), n.clone(), &bt, &nt);
    let d = DiffJson {
        schema: crate::render::json::REPORT_SCHEMA,
        craft: new.craft.name(),
        base: side(&an, b, &bt, &a.base),
        new: side(&an, n, &nt, &a.new),
        waste_fraction_change: change.value,
        waste_fraction_change_ci: [change.lo, change.hi],
        change_exact: change.is_exact(),
        beyond_noise: change.lo > 0.0 || change.hi < 0.0,
        pairs: changes,
        objects,
    };
    let out = if a.format() == crate::render::Format::Json { serde_json::to_string_pretty(&d)? + "\n" } else { text(&d, &new, a.top) };
    crate::print(&out)?;
    Ok(0)
}

fn ci(e: &Estimate) -> [f64; 2] {
    [e.lo, e.hi]
}

fn row<'a>(names: &'a Interner, status: &'static str, b: Option<&SymPair>, n: Option<&SymPair>, bt: &Sums, nt: &Sums) -> PairChange<'a> {
    let sp = n.or(b).expect("one side");
    let zero = Estimate::default();
    let bs = b.map_or(zero, |x| x.sums.share_of(bt));
    let ns = n.map_or(zero, |x| x.sums.share_of(nt));
    let d = interval::difference(&bs, &ns);
    PairChange {
        status,
        base_share: bs.value,
        base_share_ci: ci(&bs),
        new_share: ns.value,
        new_share_ci: ci(&ns),
        share_change: d.value,
        share_change_ci: [d.lo, d.hi],
        beyond_noise: d.lo > 0.0 || d.hi < 0.0,
        base_waste: b.map_or(0.0, |x| x.waste()),
        new_waste: n.map_or(0.0, |x| x.waste()),
        watch: JsonContext { names, ctx: sp.watch },
        trap: JsonContext { names, ctx: sp.trap },
    }
}

fn side<'a>(an: &'a Analysis<'a>, procs: Range<usize>, t: &Sums, path: &std::path::Path) -> Side<'a> {
    let p: &Profile = an.procs[procs.start].profile;
    let f = t.fraction();
    let c = an.procs[procs].iter().fold(witchcraft::profile::Counters::default(), |mut c, x| {
        c.add(&x.counters);
        c
    });
    Side {
        file: path.display().to_string(),
        program: &p.program,
        pid: p.pid,
        unit: p.value_unit().label(),
        waste_fraction: f.value,
        waste_fraction_ci: ci(&f),
        exact: f.is_exact(),
        waste: t.waste,
        r#use: t.r#use,
        samples: c.samples,
        traps: c.traps,
    }
}

fn pp(x: f64) -> String {
    format!("{:+.1}pp", x * 100.0)
}

fn text(d: &DiffJson, new: &Profile, top: usize) -> String {
    let w = analysis::words(new.craft);
    let mut o = String::new();
    o += &format!("witch diff: {}, {}\n", d.craft, printable(d.new.program));
    for (label, s) in [("base", &d.base), ("new ", &d.new)] {
        // An exact profile's fraction is a count: no interval.
        let ci = match s.waste_fraction_ci {
            _ if s.exact => "an exact count".to_string(),
            [lo, hi] => format!("95% interval {}–{}", pct(lo), pct(hi)),
        };
        o += &format!(
            "  {label}  {}: {} {} ({ci}), {} samples, {} traps\n",
            printable(&s.file),
            pct(s.waste_fraction),
            w.waste,
            s.samples,
            s.traps
        );
    }
    let change = match d.waste_fraction_change_ci {
        _ if d.change_exact => format!("exact counts: {}", if d.beyond_noise { "a change" } else { "no change" }),
        [lo, hi] => {
            let verdict = if d.beyond_noise { "beyond the noise" } else { "within the noise" };
            format!("95% interval of the change {} to {}: {verdict}", pp(lo), pp(hi))
        }
    };
    o += &format!(
        "Waste fraction: {} → {} ({}), {change}\n",
        pct(d.base.waste_fraction),
        pct(d.new.waste_fraction),
        pp(d.waste_fraction_change),
    );
    if d.pairs.is_empty() {
        o += "\nNo pairs with waste in either profile.\n";
        return o;
    }
    let n = if top == 0 { d.pairs.len() } else { top.min(d.pairs.len()) };
    o += &format!("\nShare of waste, top {n} of {} pairs by change (~: within the noise):\n", d.pairs.len());
    o += "    base     new   change\n";
    for c in d.pairs.iter().take(n) {
        let tag = match c.status {
            "new" => " [new]",
            "vanished" => " [vanished]",
            _ => "",
        };
        let noise = if c.beyond_noise { " " } else { "~" };
        // Each side by its site, as the report's summary names it.
        let first = |f: &JsonContext| {
            crate::analysis::summary::site(f.names, f.ctx).map_or("(no context)".to_string(), |s| crate::render::text::site_of(f.names, &s))
        };
        o += &format!(
            "  {:>6}  {:>6}  {:>8}{noise} {}{tag}\n                            {} {}\n",
            pct(c.base_share),
            pct(c.new_share),
            pp(c.share_change),
            printable(&first(&c.watch)),
            w.trap,
            printable(&first(&c.trap)),
        );
    }
    let count = |s: &str| d.pairs.iter().filter(|c| c.status == s).count();
    o += &format!("\n{} pairs in both, {} new, {} vanished\n", count("both"), count("new"), count("vanished"));
    if !d.objects.is_empty() {
        let n = if top == 0 { d.objects.len() } else { top.min(d.objects.len()) };
        o += &format!("\nShare of waste, top {n} of {} data objects by change (~: within the noise):\n", d.objects.len());
        o += "    base     new   change\n";
        for c in d.objects.iter().take(n) {
            let tag = match c.status {
                "new" => " [new]",
                "vanished" => " [vanished]",
                _ => "",
            };
            let noise = if c.beyond_noise { " " } else { "~" };
            o += &format!(
                "  {:>6}  {:>6}  {:>8}{noise} {}{tag}\n",
                pct(c.base_share),
                pct(c.new_share),
                pp(c.share_change),
                printable(&c.name)
            );
        }
    }
    o
}
