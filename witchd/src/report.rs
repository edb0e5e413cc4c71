//! The report: a text page read top-down, or one JSON object with stable fields.

use crate::cli::Format;
use crate::model::{self, human, pct, SymPair};
use crate::symbolize::{Frame, Symbolizer};
use serde::Serialize;
use witchcraft::profile::Profile;

/// Version of the JSON report's own shape (not of the profile file): bump on any
/// change a reader of the stable fields would notice.
pub const REPORT_SCHEMA: u32 = 1;

/// Frames per context shown in text; deeper contexts end in "… N more".
const TEXT_DEPTH: usize = 12;

/// Renders a profile as text or JSON. `top` = number of pairs (0 = all).
pub fn render_report(profile: &Profile, top: usize, format: Format) -> anyhow::Result<String> {
    let mut sym = Symbolizer::new(&profile.modules);
    let pairs = model::pairs(profile, &mut sym);
    render_pairs(profile, &pairs, top, format)
}

/// Like [`render_report`], for callers that already symbolized the pairs.
pub fn render_pairs(profile: &Profile, pairs: &[SymPair], top: usize, format: Format) -> anyhow::Result<String> {
    Ok(match format {
        Format::Text => text(profile, pairs, top, terminal_width()),
        Format::Json => {
            let mut s = serde_json::to_string_pretty(&json(profile, pairs, top))?;
            s.push('\n');
            s
        }
    })
}

/// The terminal's width; None (no truncation) unless both stdout and stderr are
/// terminals, since the caller may print the report on either and a file must stay whole.
fn terminal_width() -> Option<usize> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() || !std::io::stderr().is_terminal() {
        return None;
    }
    // SAFETY: TIOCGWINSZ only fills the winsize we pass.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ioctl(2, libc::TIOCGWINSZ, &mut ws) } == 0;
    if ok && ws.ws_col >= 40 {
        return Some(ws.ws_col as usize);
    }
    std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok()).filter(|&c| c >= 40).or(Some(80))
}

fn clip(s: &str, width: Option<usize>) -> String {
    match width {
        Some(w) if s.chars().count() > w => {
            let mut t: String = s.chars().take(w.saturating_sub(1)).collect();
            t.push('…');
            t
        }
        _ => s.to_string(),
    }
}

fn text(p: &Profile, pairs: &[SymPair], top: usize, width: Option<usize>) -> String {
    let w = model::words(p.craft);
    let c = model::counters(p);
    let (waste, approx, used) = p.totals();
    let unit = model::byte_unit(p);
    let mut o = String::new();
    let line = |o: &mut String, s: String| {
        o.push_str(&clip(&s, width));
        o.push('\n');
    };

    line(&mut o, format!("witch {}: {} (pid {}, ended by {})", p.craft.name(), p.program, p.pid, p.ended_by));
    line(
        &mut o,
        format!(
            "  sampler   {} {}, period {} {}; {} replacement, {} debug registers",
            p.sampler.kind, p.sampler.event, p.sampler.period, p.sampler.unit, p.replacement, p.debug_registers
        ),
    );
    line(
        &mut o,
        format!(
            "  observed  {} samples, {} traps, {} imprecise PCs, {} threads, run time {}",
            c.samples,
            c.traps,
            c.imprecise,
            p.threads.len(),
            model::duration(p.duration_ns)
        ),
    );
    if c.engine_ns > 0 {
        line(
            &mut o,
            format!(
                "  cost      {} of the threads' CPU time in witch's handlers and the kernel's trap and signal paths",
                model::duration(c.engine_ns)
            ),
        );
    }
    for n in notes(p, &c) {
        line(&mut o, format!("  note: {n}"));
    }
    o.push('\n');

    let frac = p.waste_fraction();
    let total = waste + used;
    line(&mut o, format!("Waste fraction: {} of observed {} bytes are {}", pct(frac), w.access, w.waste));
    let fp = if p.craft == witchcraft::profile::Craft::Dead {
        String::new()
    } else {
        format!(" (floating point equal within {})", pct(p.fp_precision))
    };
    line(&mut o, format!("  exact {}, approximate {}{fp}", pct(model::ratio(waste - approx, total)), pct(model::ratio(approx, total))));
    line(&mut o, format!("  waste {} {unit}, use {} {unit}", human(waste), human(used)));

    let shown: Vec<&SymPair> = pairs.iter().filter(|x| x.waste > 0.0).collect();
    let n = if top == 0 { shown.len() } else { top.min(shown.len()) };
    o.push('\n');
    if shown.is_empty() {
        line(&mut o, format!("No {} pairs found.", w.waste));
        return o;
    }
    line(&mut o, format!("Top {n} of {} pairs by {} bytes:", shown.len(), w.waste));
    for (i, sp) in shown.iter().take(n).enumerate() {
        o.push('\n');
        line(
            &mut o,
            format!(
                "#{:<3} {} of all waste   {} {} (waste/(waste+use))   {} {unit}, {} traps",
                i + 1,
                pct(model::ratio(sp.waste, waste)),
                pct(sp.fraction()),
                w.waste,
                human(sp.waste),
                sp.traps
            ),
        );
        for (label, frames) in [(w.watch, &sp.watch), (w.trap, &sp.trap)] {
            line(&mut o, format!("     {label}"));
            for f in frames.iter().take(TEXT_DEPTH) {
                let inl = if f.inlined { " [inlined]" } else { "" };
                line(&mut o, format!("       {}{inl}", f.display()));
            }
            if frames.len() > TEXT_DEPTH {
                line(&mut o, format!("       … {} more frames", frames.len() - TEXT_DEPTH));
            }
            if frames.is_empty() {
                line(&mut o, "       (no calling context)".into());
            }
        }
    }
    o
}

/// What the reader should know before trusting the figures.
fn notes(p: &Profile, c: &witchcraft::profile::Counters) -> Vec<String> {
    let mut v = p.notes.clone();
    let access = model::words(p.craft).access;
    // The software sampler takes a timer interrupt's nearby access (a few
    // instructions of straight-line code), so code whose time goes elsewhere
    // (a store-free inner loop) yields interrupts but no samples.
    let missed = c.interrupts.saturating_sub(c.samples + c.skipped_self + c.overdue);
    if c.samples == 0 && missed > 0 && p.sampler.kind == "software" {
        v.push(format!(
            "no samples: none of {} timer interrupts landed within a few instructions of a {access}; \
             the time went to other code; try a smaller -p, or a host with a PMU (it samples {access}s by count)",
            c.interrupts
        ));
    } else if c.samples == 0 && c.interrupts == 0 && c.threads_failed > 0 {
        // The set-up failure's own note says why.
    } else if c.samples == 0 {
        // One short run, or many short threads: either way no thread ran a period.
        v.push(format!(
            "no samples were taken: no thread ran one period ({} {}) of its own CPU time; try a smaller -p",
            p.sampler.period, p.sampler.unit
        ));
    } else if p.sampler.kind == "software" && missed * 2 > c.interrupts {
        v.push(format!(
            "{missed} of {} timer interrupts landed away from any {access} and were not samples: \
             {access}s in code that takes little time per {access} are under-represented (see README, Accuracy)",
            c.interrupts
        ));
    }
    if c.traps == 0 && c.samples > 0 {
        v.push("no watchpoint fired: nothing to attribute".into());
    }
    if c.tree_overflow > 0 || c.pair_overflow > 0 {
        v.push(format!("tables overflowed ({} contexts, {} pairs lost): figures are partial", c.tree_overflow, c.pair_overflow));
    }
    if c.threads_failed > 0 {
        v.push(format!("{} threads could not be profiled", c.threads_failed));
    }
    v
}

#[derive(Serialize)]
struct JsonSampler<'a> {
    event: &'a str,
    period: u64,
    kind: &'a str,
    unit: &'a str,
}

#[derive(Serialize)]
pub struct JsonContext<'a> {
    pub frames: &'a [Frame],
}

#[derive(Serialize)]
pub struct JsonPair<'a> {
    pub waste_bytes: f64,
    pub approx_waste_bytes: f64,
    pub use_bytes: f64,
    /// Of all waste in the profile.
    pub share: f64,
    /// This pair's own waste / (waste + use).
    pub fraction: f64,
    pub traps: u64,
    pub watch: JsonContext<'a>,
    pub trap: JsonContext<'a>,
}

impl<'a> JsonPair<'a> {
    pub fn new(sp: &'a SymPair, total_waste: f64) -> Self {
        JsonPair {
            waste_bytes: sp.waste,
            approx_waste_bytes: sp.approx_waste,
            use_bytes: sp.r#use,
            share: model::ratio(sp.waste, total_waste),
            fraction: sp.fraction(),
            traps: sp.traps,
            watch: JsonContext { frames: &sp.watch },
            trap: JsonContext { frames: &sp.trap },
        }
    }
}

#[derive(Serialize)]
struct JsonReport<'a> {
    schema: u32,
    craft: &'static str,
    program: &'a str,
    args: &'a [String],
    pid: u32,
    sampler: JsonSampler<'a>,
    samples: u64,
    traps: u64,
    waste_bytes: f64,
    approx_waste_bytes: f64,
    use_bytes: f64,
    waste_fraction: f64,
    /// Unit of the byte figures ("bytes", or "byte·ns" for time-based periods).
    byte_unit: &'static str,
    duration_ns: u64,
    threads: usize,
    /// Number of pairs in the profile; `pairs` holds the top ones.
    pair_count: usize,
    counters: witchcraft::profile::Counters,
    notes: Vec<String>,
    pairs: Vec<JsonPair<'a>>,
}

fn json<'a>(p: &'a Profile, pairs: &'a [SymPair], top: usize) -> JsonReport<'a> {
    let c = model::counters(p);
    let (waste, approx, used) = p.totals();
    let n = if top == 0 { pairs.len() } else { top.min(pairs.len()) };
    JsonReport {
        schema: REPORT_SCHEMA,
        craft: p.craft.name(),
        program: &p.program,
        args: &p.args,
        pid: p.pid,
        sampler: JsonSampler { event: &p.sampler.event, period: p.sampler.period, kind: &p.sampler.kind, unit: &p.sampler.unit },
        samples: c.samples,
        traps: c.traps,
        waste_bytes: waste,
        approx_waste_bytes: approx,
        use_bytes: used,
        waste_fraction: p.waste_fraction(),
        byte_unit: model::byte_unit(p),
        duration_ns: p.duration_ns,
        threads: p.threads.len(),
        pair_count: pairs.len(),
        notes: notes(p, &c),
        counters: c,
        pairs: pairs.iter().take(n).map(|sp| JsonPair::new(sp, waste)).collect(),
    }
}
