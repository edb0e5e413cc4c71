//! What every output shares: loading a profile with a clean error, and its pairs
//! symbolized and merged across threads.

use crate::symbolize::{Frame, Symbolizer};
use anyhow::Context as _;
use std::collections::HashMap;
use std::path::Path;
use witchcraft::profile::{Counters, Craft, Profile};

/// Loads a profile; the error names the file and says what is wrong with it.
pub fn load(path: &Path) -> anyhow::Result<Profile> {
    Profile::load(path).with_context(|| format!("{}", path.display()))
}

/// A pair at source level: every raw pair (any thread) with the same symbolized
/// contexts folds into one, since threads keep separate context trees.
#[derive(Debug, Clone)]
pub struct SymPair {
    pub watch: Vec<Frame>,
    pub trap: Vec<Frame>,
    /// Exact plus approximate waste bytes.
    pub waste: f64,
    pub approx_waste: f64,
    pub r#use: f64,
    pub traps: u64,
}

impl SymPair {
    /// Identity across profiles: source locations of both contexts.
    pub fn key(&self) -> String {
        let w: Vec<String> = self.watch.iter().map(Frame::key).collect();
        let t: Vec<String> = self.trap.iter().map(Frame::key).collect();
        format!("{}|{}", w.join(";"), t.join(";"))
    }

    /// The pair's own waste / (waste + use).
    pub fn fraction(&self) -> f64 {
        ratio(self.waste, self.waste + self.r#use)
    }
}

pub fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// All pairs, merged, sorted by waste (then use) descending.
pub fn pairs(p: &Profile, sym: &mut Symbolizer) -> Vec<SymPair> {
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut out: Vec<SymPair> = Vec::new();
    for t in &p.threads {
        for raw in &t.pairs {
            let watch = sym.context(&Profile::context(t, raw.watch));
            let trap = sym.context(&Profile::context(t, raw.trap));
            let sp = SymPair {
                watch,
                trap,
                waste: raw.waste + raw.approx_waste,
                approx_waste: raw.approx_waste,
                r#use: raw.r#use,
                traps: raw.traps,
            };
            match index.get(&sp.key()) {
                Some(&i) => {
                    let o = &mut out[i];
                    o.waste += sp.waste;
                    o.approx_waste += sp.approx_waste;
                    o.r#use += sp.r#use;
                    o.traps += sp.traps;
                }
                None => {
                    index.insert(sp.key(), out.len());
                    out.push(sp);
                }
            }
        }
    }
    out.sort_by(|a, b| b.waste.total_cmp(&a.waste).then(b.r#use.total_cmp(&a.r#use)));
    out
}

/// The process counters; summed from threads when the engine left the totals empty.
pub fn counters(p: &Profile) -> Counters {
    if p.counters != Counters::default() {
        return p.counters.clone();
    }
    let mut c = Counters::default();
    for t in &p.threads {
        c.add(&t.counters);
    }
    c
}

/// How each craft names the two contexts of a pair and its waste.
pub struct Words {
    pub watch: &'static str,
    pub trap: &'static str,
    /// Adjective for wasted bytes: "dead", "silent", "redundant".
    pub waste: &'static str,
    /// What was observed: "store" or "load".
    pub access: &'static str,
}

pub fn words(c: Craft) -> Words {
    match c {
        Craft::Dead => Words { watch: "dead store at", trap: "killed by", waste: "dead", access: "store" },
        Craft::SilentStore => Words { watch: "store", trap: "rewritten with the same value by", waste: "silent", access: "store" },
        Craft::SilentLoad => Words { watch: "load", trap: "reloaded unchanged by", waste: "redundant", access: "load" },
    }
}

/// The unit of byte figures: with a time-based period the weights are byte·ns, not bytes.
pub fn byte_unit(p: &Profile) -> &'static str {
    if p.sampler.totals_unit() == "byte·ns" {
        "byte·ns"
    } else {
        "bytes"
    }
}

/// Compact magnitude: 950, 12.3K, 4.56M, 7.89G, ...
pub fn human(v: f64) -> String {
    let units = ["", "K", "M", "G", "T", "P", "E"];
    let mut v = v;
    let mut i = 0;
    while v.abs() >= 1000.0 && i + 1 < units.len() {
        v /= 1000.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0}")
    } else if v.abs() >= 100.0 {
        format!("{v:.0}{}", units[i])
    } else if v.abs() >= 10.0 {
        format!("{v:.1}{}", units[i])
    } else {
        format!("{v:.2}{}", units[i])
    }
}

pub fn duration(ns: u64) -> String {
    let s = ns as f64 / 1e9;
    if s >= 120.0 {
        format!("{}m{:02.0}s", (s / 60.0).floor(), s % 60.0)
    } else if s >= 1.0 {
        format!("{s:.2} s")
    } else {
        format!("{:.1} ms", s * 1e3)
    }
}

pub fn pct(f: f64) -> String {
    format!("{:.1}%", f * 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(human(950.0), "950");
        assert_eq!(human(12_345.0), "12.3K");
        assert_eq!(human(4_560_000.0), "4.56M");
        assert_eq!(pct(0.3421), "34.2%");
        assert_eq!(duration(1_520_000_000), "1.52 s");
        assert_eq!(duration(3_000_000), "3.0 ms");
    }
}
