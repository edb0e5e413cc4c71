//! Folded stacks and flame graphs of waste, over the synthetic contexts of §4.6.5.

use crate::model::SymPair;
use crate::symbolize::Frame;
use std::collections::BTreeMap;
use std::path::Path;
use witchcraft::profile::Profile;

/// A folded-stack frame name: the function only, so one function's lines merge;
/// `;` would split the frame, so it is replaced.
fn name(f: &Frame) -> String {
    f.function.replace(';', ":")
}

/// `root;…;watch;RELATION;root;…;trap waste` lines, identical stacks summed, pairs
/// whose waste rounds to 0 left out (a flame graph of waste has nothing to draw for them).
pub fn folded(p: &Profile, pairs: &[SymPair]) -> Vec<String> {
    let rel = p.craft.relation();
    let mut stacks: BTreeMap<String, u64> = BTreeMap::new();
    for sp in pairs {
        let v = sp.waste.round();
        if v < 1.0 {
            continue;
        }
        let mut parts: Vec<String> = sp.watch.iter().rev().map(name).collect();
        parts.push(rel.to_string());
        parts.extend(sp.trap.iter().rev().map(name));
        *stacks.entry(parts.join(";")).or_default() += v as u64;
    }
    stacks.into_iter().map(|(s, v)| format!("{s} {v}")).collect()
}

/// Writes an SVG flame graph of the folded stacks.
pub fn svg(p: &Profile, lines: &[String], path: &Path) -> anyhow::Result<()> {
    use inferno::flamegraph::{self, Options};
    let mut opt = Options::default();
    opt.title = format!("witch {}: {}", p.craft.name(), p.program);
    opt.subtitle = Some(format!(
        "waste fraction {:.1}%; each stack: watched context, {}, trapping context",
        p.waste_fraction() * 100.0,
        p.craft.relation()
    ));
    opt.count_name = crate::model::byte_unit(p).to_string();
    opt.name_type = "Frame:".to_string();
    let f = std::fs::File::create(path).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    let w = std::io::BufWriter::new(f);
    if lines.is_empty() {
        // inferno refuses empty input; an empty graph still says "nothing wasted".
        flamegraph::from_lines(&mut opt, ["(no waste) 1"], w)?;
    } else {
        flamegraph::from_lines(&mut opt, lines.iter().map(String::as_str), w)?;
    }
    Ok(())
}
