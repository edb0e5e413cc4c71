//! Folded stacks and flame graphs of waste.
//!
//! Three views ([`View`]), the first the default:
//! - `waste`: each pair's watched context (the dead store, the silent store,
//!   the redundant load), weighted by its waste: where the wasted accesses are;
//! - `killers`: each pair's trapping context (the store that killed it, the
//!   access that repeated it), weighted by the same waste: what wastes them;
//! - `pairs`: both in one stack, Witch's synthetic context (the paper's
//!   §4.6.5): watched context, the relation (`KILLED_BY`, ...), trapping
//!   context, each from its root.
//!
//! Folded stacks are root first, as every flame-graph tool reads them. The
//! built-in SVG of a one-sided view is drawn leaf first and top down (an
//! icicle of the stacks reversed): its top row is the wasted accesses (or
//! their killers) by function, widest first, their callers below, so the
//! heaviest waste is on the first screen however deep the stacks (a
//! 400-frame interpreter stack drawn root up put it 6,000 pixels down).
//! The pair view is drawn root up, as its stacks join two contexts.

use super::Recorder;
use crate::analysis::Analysis;
use crate::symbolize::Frame;
use std::collections::BTreeMap;
use std::io::Write;

/// Which stacks a flame graph or folded output shows.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum View {
    /// The wasted accesses (dead stores, silent stores, redundant loads) by their calling context
    #[default]
    Waste,
    /// The accesses that wasted them (killers, repeaters) by their calling context
    Killers,
    /// Both: watched context, the relation, trapping context, in one stack
    Pairs,
}

/// A folded-stack frame name: the function only, so one function's lines merge;
/// `;` would split the frame, so it is replaced.
fn name(f: &Frame) -> String {
    f.function.replace(';', ":")
}

/// Root-first stacks with their waste, identical stacks summed, pairs whose
/// waste rounds to 0 left out (a flame graph of waste has nothing to draw
/// for them).
pub fn folded(run: &Analysis, view: View) -> Vec<String> {
    let mut stacks: BTreeMap<String, u64> = BTreeMap::new();
    let root_first = |ctx| {
        let mut parts: Vec<String> = run.frames(ctx).map(name).collect();
        parts.reverse();
        parts
    };
    for proc in &run.procs {
        let rel = proc.profile.craft.relation();
        for sp in &proc.pairs {
            let v = sp.waste().round();
            if v < 1.0 {
                continue;
            }
            let parts = match view {
                View::Waste => root_first(sp.watch),
                View::Killers => root_first(sp.trap),
                View::Pairs => {
                    let mut parts = root_first(sp.watch);
                    parts.push(rel.to_string());
                    parts.extend(root_first(sp.trap));
                    parts
                }
            };
            if parts.is_empty() {
                continue;
            }
            *stacks.entry(parts.join(";")).or_default() += v as u64;
        }
    }
    stacks.into_iter().map(|(s, v)| format!("{s} {v}")).collect()
}

/// Folded stacks, one per line (`--folded`).
pub struct Folded {
    view: View,
    lines: Vec<String>,
}

impl Folded {
    pub fn new(view: View) -> Folded {
        Folded { view, lines: Vec::new() }
    }
}

impl<'a> Recorder<'a> for Folded {
    fn record(&mut self, run: &'a Analysis<'a>) -> anyhow::Result<()> {
        self.lines.extend(folded(run, self.view));
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
pub struct FlameGraph {
    view: View,
    svg: Vec<u8>,
}

impl FlameGraph {
    pub fn new(view: View) -> FlameGraph {
        FlameGraph { view, svg: Vec::new() }
    }
}

impl<'a> Recorder<'a> for FlameGraph {
    fn record(&mut self, run: &'a Analysis<'a>) -> anyhow::Result<()> {
        use inferno::flamegraph::{self, Direction, Options};
        let p = run.main().profile;
        let w = crate::analysis::words(p.craft);
        let lines = folded(run, self.view);
        let mut opt = Options::default();
        opt.title = format!("witch {}: {}", p.craft.name(), p.program);
        let frac = run.total().fraction().value * 100.0;
        let what = match self.view {
            View::Waste => {
                format!("the {} {}s by their calling context, innermost at the top; --view killers for what wastes them", w.waste, w.access)
            }
            View::Killers => format!(
                "what wasted the {} {}s ({}), innermost at the top; --view waste for the wasted accesses",
                w.waste, w.access, w.trap
            ),
            View::Pairs => format!("each stack: watched context, {}, trapping context", p.craft.relation()),
        };
        opt.subtitle = Some(format!("waste fraction {frac:.1}%; {what}"));
        opt.count_name = format!("estimated {}", p.value_unit().label());
        opt.name_type = "Frame:".to_string();
        if self.view != View::Pairs {
            opt.reverse_stack_order = true;
            opt.direction = Direction::Inverted;
        }
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
