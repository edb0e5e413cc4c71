//! Folded stacks and flame graphs of waste, over the synthetic contexts of §4.6.5.

use super::Recorder;
use crate::analysis::Analysis;
use crate::symbolize::Frame;
use std::collections::BTreeMap;
use std::io::Write;

/// A folded-stack frame name: the function only, so one function's lines merge;
/// `;` would split the frame, so it is replaced.
fn name(f: &Frame) -> String {
    f.function.replace(';', ":")
}

/// `root;…;watch;RELATION;root;…;trap waste` lines, identical stacks summed, pairs
/// whose waste rounds to 0 left out (a flame graph of waste has nothing to draw for them).
pub fn folded(run: &Analysis) -> Vec<String> {
    let mut stacks: BTreeMap<String, u64> = BTreeMap::new();
    for proc in &run.procs {
        let rel = proc.profile.craft.relation();
        for sp in &proc.pairs {
            let v = sp.waste().round();
            if v < 1.0 {
                continue;
            }
            let mut parts: Vec<String> = run.frames(sp.watch).map(name).collect();
            parts.reverse();
            parts.push(rel.to_string());
            let mut trap: Vec<String> = run.frames(sp.trap).map(name).collect();
            trap.reverse();
            parts.extend(trap);
            *stacks.entry(parts.join(";")).or_default() += v as u64;
        }
    }
    stacks.into_iter().map(|(s, v)| format!("{s} {v}")).collect()
}

/// Folded stacks, one per line (`--folded`).
#[derive(Default)]
pub struct Folded {
    lines: Vec<String>,
}

impl<'a> Recorder<'a> for Folded {
    fn record(&mut self, run: &'a Analysis<'a>) -> anyhow::Result<()> {
        self.lines.extend(folded(run));
        Ok(())
    }

    fn write(&mut self, out: &mut dyn Write) -> anyhow::Result<()> {
        for l in &self.lines {
            writeln!(out, "{l}")?;
        }
        Ok(())
    }
}

/// An SVG flame graph of waste (`--flamegraph`).
#[derive(Default)]
pub struct FlameGraph {
    svg: Vec<u8>,
}

impl<'a> Recorder<'a> for FlameGraph {
    fn record(&mut self, run: &'a Analysis<'a>) -> anyhow::Result<()> {
        use inferno::flamegraph::{self, Options};
        let p = run.main().profile;
        let lines = folded(run);
        let mut opt = Options::default();
        opt.title = format!("witch {}: {}", p.craft.name(), p.program);
        opt.subtitle = Some(format!(
            "waste fraction {:.1}%; each stack: watched context, {}, trapping context",
            p.waste_fraction() * 100.0,
            p.craft.relation()
        ));
        opt.count_name = p.value_unit().label().to_string();
        opt.name_type = "Frame:".to_string();
        self.svg.clear();
        if lines.is_empty() {
            // inferno refuses empty input; an empty graph still says "nothing wasted".
            flamegraph::from_lines(&mut opt, ["(no waste) 1"], &mut self.svg)?;
        } else {
            flamegraph::from_lines(&mut opt, lines.iter().map(String::as_str), &mut self.svg)?;
        }
        Ok(())
    }

    fn write(&mut self, out: &mut dyn Write) -> anyhow::Result<()> {
        out.write_all(&self.svg)?;
        Ok(())
    }
}
