//! The report a person reads top-down: what ran and how it was observed, the
//! waste fraction, a table of the program's own lines by waste with the
//! lines that killed (or repeated) them, then the heaviest pairs in full.
//! For a run of several processes, the processes with findings come next,
//! heaviest first. Every figure that is an estimate carries its 95% interval.

use super::units::{duration, human, interval, pct, printable, uncertainty};
use super::Recorder;
use crate::analysis::interval::{Sums, FEW_JUDGED};
use crate::analysis::summary::{self, Site};
use crate::analysis::{self, Analysis, Process};
use std::io::Write;
use witchcraft::profile::{Counters, Profile, SamplerKind};

/// Frames per context shown; deeper contexts end in "… N more".
const TEXT_DEPTH: usize = 12;
/// Pairs shown in full.
pub const PAIRS_SHOWN: usize = 3;

/// Outermost frames every context of a thread shares, left out of the text.
const START_UP: [&str; 10] = [
    "_start",
    "__libc_start_main",
    "__libc_start_main_impl",
    "__libc_start_call_main",
    "__libc_start_main_alias_2",
    "start_thread",
    "clone",
    "clone3",
    "__clone",
    "__clone3",
];

pub struct Text<'a> {
    /// Summary lines shown (0 = all).
    top: usize,
    pairs: usize,
    width: Option<usize>,
    run: Option<&'a Analysis<'a>>,
}

impl Text<'_> {
    /// `top` = lines of the summary shown (0 = all).
    pub fn new(top: usize) -> Self {
        Text { top, pairs: PAIRS_SHOWN, width: terminal_width(), run: None }
    }

    /// How many pairs are shown in full (0 = all).
    pub fn pairs(mut self, n: usize) -> Self {
        self.pairs = n;
        self
    }
}

impl<'a> Recorder<'a> for Text<'a> {
    fn record(&mut self, run: &'a Analysis<'a>) -> anyhow::Result<()> {
        self.run = Some(run);
        Ok(())
    }

    fn write(&mut self, out: &mut dyn Write) -> anyhow::Result<()> {
        let Some(run) = self.run else { return Ok(()) };
        let mut page = Page { width: self.width, out };
        page.run(run, self.top, self.pairs)
    }
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

struct Page<'w> {
    width: Option<usize>,
    out: &'w mut dyn Write,
}

impl Page<'_> {
    /// One line; whatever came from the profile is shown with its control characters escaped.
    fn line(&mut self, s: String) -> std::io::Result<()> {
        writeln!(self.out, "{}", clip(&printable(&s), self.width))
    }

    fn blank(&mut self) -> std::io::Result<()> {
        writeln!(self.out)
    }

    fn run(&mut self, run: &Analysis, top: usize, pairs: usize) -> anyhow::Result<()> {
        let main = run.main();
        let p = main.profile;
        let w = analysis::words(p.craft);
        let c = run.counters();
        let total = run.total();
        let unit = p.value_unit().label();
        let threads: usize = run.procs.iter().map(|x| analysis::threads(x.profile)).sum();
        let with = run.procs.iter().filter(|x| x.total.waste > 0.0).count();

        let procs = if run.procs.len() > 1 { format!(", {} processes, {with} with findings", run.procs.len()) } else { String::new() };
        self.line(format!(
            "witch {}: {} (pid {}, ended by {}), run time {}, {threads} thread{}{procs}",
            p.craft.name(),
            crate::symbolize::short_path(&p.program),
            p.pid,
            p.ended_by,
            duration(p.duration_ns),
            if threads == 1 { "" } else { "s" }
        ))?;
        if p.sampler.kind.is_exhaustive() {
            self.line(format!(
                "  sampler   none: exact, every instruction single-stepped and every {} judged (figures are counts)",
                w.access
            ))?;
        } else {
            self.line(format!(
                "  sampler   {} {}, period {} {}; {} replacement, {} debug registers",
                p.sampler.kind.name(),
                p.sampler.event,
                p.sampler.period,
                p.sampler.unit.name(),
                p.replacement,
                p.debug_registers
            ))?;
        }
        if p.sampler.burst_steps > 0 {
            let budget = match p.sampler.overhead_percent {
                Some(b) if b > 0.0 => format!(", {b}% overhead budget"),
                Some(_) => ", no overhead budget".into(),
                None => String::new(),
            };
            let mean = if c.bursts > 0 { format!(": {:.1} steps per burst", c.steps as f64 / c.bursts as f64) } else { String::new() };
            let ticks = if c.ticks_skipped > 0 {
                format!(", begun at {} of {} ticks (the budget's choice)", c.bursts, c.bursts + c.ticks_skipped)
            } else {
                String::new()
            };
            if p.sampler.window_instructions > 0 && c.windows > 0 {
                // Windows run from the code cache: how long they were, and
                // how many picks each stepped.
                let mean_len = c.window_instructions as f64 / c.windows as f64;
                let stepped = c.bursts.saturating_sub(c.windows);
                let fallback =
                    if stepped > 0 { format!("; {stepped} single-step bursts where the cache could not run") } else { String::new() };
                self.line(format!(
                    "  bursts    count-proportional: windows from the code cache of at most {} instructions (mean {:.0}, {}–{}; {:.0} accesses of the craft's kind each), {:.1} picks each{budget}{ticks}{fallback}",
                    p.sampler.window_instructions,
                    mean_len,
                    c.window_shortest,
                    c.window_longest,
                    c.window_accesses as f64 / c.windows as f64,
                    c.window_picks as f64 / c.windows as f64,
                ))?;
            } else {
                self.line(format!(
                    "  bursts    count-proportional: single steps of at most {} instructions, {} picked per burst{budget}{mean}{ticks}",
                    p.sampler.burst_steps,
                    p.sampler.burst_picks.max(1),
                ))?;
            }
        }
        let cost = if c.engine_ns > 0 {
            // Where it went, when the profile says (builds before these
            // counters wrote none).
            // Each step is timed by its burst: what one cost here.
            let per_step = if c.steps > 0 { format!(" of {:.1} µs", c.step_ns as f64 / c.steps as f64 / 1e3) } else { String::new() };
            let per_instruction = if c.window_instructions > 0 {
                format!(" ({:.1} ns an instruction)", c.cache_ns as f64 / c.window_instructions as f64)
            } else {
                String::new()
            };
            let parts: Vec<String> = [
                (c.tick_ns, "ticks", String::new()),
                (c.cache_ns, "windows in the code cache", per_instruction),
                (c.exit_ns, "its exits", String::new()),
                (c.step_ns, "single steps", per_step),
                (c.trap_ns, "traps", String::new()),
            ]
            .iter()
            .filter(|(ns, ..)| *ns > 0)
            .map(|(ns, what, each)| format!("{} at {what}{each}", duration(*ns)))
            .collect();
            let split = if parts.is_empty() { String::new() } else { format!(" ({})", parts.join(", ")) };
            format!("; cost {} of CPU in witch's handlers and the kernel's trap and signal paths{split}", duration(c.engine_ns))
        } else {
            String::new()
        };
        if p.sampler.kind.is_exhaustive() {
            self.line(format!("  observed  {} {}s, {} judgements of one by the next access to its bytes", c.samples, w.access, c.traps))?;
        } else {
            self.line(format!("  observed  {} samples, {} traps, {} imprecise PCs{cost}", c.samples, c.traps, c.imprecise))?;
        }
        for n in notes(p, &main.counters) {
            self.line(format!("  note: {n}"))?;
        }
        self.blank()?;

        let (approx, used) = (run.procs.iter().map(|x| x.totals().1).sum::<f64>(), total.r#use);
        if total.waste + used <= 0.0 {
            // Nothing was judged: no fraction to print, not 0%.
            self.line(format!(
                "Waste fraction: unknown: no sampled {} was judged ({} samples, {} traps; the notes above say why)",
                w.access, c.samples, c.traps
            ))?;
            self.blank()?;
            self.line(format!("No {} pairs found.", w.waste))?;
            return Ok(());
        }
        let frac = total.fraction();
        self.line(format!("Waste fraction: {} of observed {} bytes are {} ({})", pct(frac.value), w.access, w.waste, uncertainty(&frac)))?;
        if c.traps < FEW_JUDGED && !total.exhaustive {
            self.line(format!(
                "  from only {} judged sample{}: too few to rely on (a longer run, or a smaller -p, gives more)",
                c.traps,
                if c.traps == 1 { "" } else { "s" }
            ))?;
        }
        let fp = if p.craft == witchcraft::profile::Craft::Dead {
            String::new()
        } else {
            format!(" (floating point equal within {})", pct(p.fp_precision))
        };
        let all = total.waste + used;
        self.line(format!(
            "  exact {}, approximate {}{fp}",
            pct(analysis::ratio(total.waste - approx, all)),
            pct(analysis::ratio(approx, all))
        ))?;
        self.line(format!("  waste {} {unit}, use {} {unit}", human(total.waste), human(used)))?;

        self.blank()?;
        if total.waste <= 0.0 {
            self.line(format!("No {} pairs found.", w.waste))?;
            return Ok(());
        }
        let lines: Vec<_> = summary::lines(run).into_iter().filter(|l| l.sums.waste > 0.0).collect();
        self.lines(run, &total, &lines, top)?;
        if run.procs.len() > 1 {
            self.processes(run, &total)?;
        }
        self.pairs(run, &total, &lines, pairs)
    }

    /// The summary: the program's own lines by waste, each with its partner lines.
    fn lines(&mut self, run: &Analysis, total: &Sums, lines: &[summary::Line], top: usize) -> anyhow::Result<()> {
        let w = analysis::words(run.main().profile.craft);
        let n = if top == 0 { lines.len() } else { top.min(lines.len()) };
        let of = if n < lines.len() { format!(" (top {n} of {}; --top N for more)", lines.len()) } else { String::new() };
        self.line(format!("Lines with {} {}s, by share of all waste{of}:", w.waste, w.access))?;
        let partner = match run.main().profile.craft {
            witchcraft::profile::Craft::Dead => "killed by",
            _ => "same value again at",
        };
        // An exact count has no interval, so no interval column.
        let head = if total.exhaustive { "" } else { "95% interval  " };
        self.line(format!("   share  {head}{:>6}  traps  line", w.waste))?;
        for l in lines.iter().take(n) {
            let share = l.sums.share_of(total);
            let few = if l.sums.few() { "~" } else { " " };
            let ci = if total.exhaustive { String::new() } else { format!("{:<12}  ", interval(share.lo, share.hi)) };
            self.line(format!(
                "  {:>6}  {ci}{:>6}  {:>5}{few} {}",
                pct(share.value),
                pct(l.sums.fraction().value),
                l.sums.traps,
                site(run, &l.site)
            ))?;
            let key = run.names.frame_key(l.site.frame);
            let mut partners: Vec<String> = l
                .partners
                .iter()
                .filter(|p| p.1 > 0.0)
                .take(2)
                .map(|(s, wst, _)| {
                    let at = if run.names.frame_key(s.frame) == key { "the same line".to_string() } else { site(run, s) };
                    format!("{at} {}", pct(wst / l.sums.waste))
                })
                .collect();
            let more = l.partners.iter().filter(|p| p.1 > 0.0).count().saturating_sub(2);
            if more > 0 {
                partners.push(format!("{more} more"));
            }
            let indent = if total.exhaustive { 27 } else { 41 };
            self.line(format!("{:indent$}{partner} {}", "", partners.join(", ")))?;
        }
        if lines.iter().take(n).any(|l| l.sums.few()) {
            self.line(format!("  ~ fewer than {} traps: an uncertain figure", crate::analysis::interval::FEW_TRAPS))?;
        }
        self.blank()?;
        Ok(())
    }

    /// A run's processes with findings, heaviest first.
    fn processes(&mut self, run: &Analysis, total: &Sums) -> anyhow::Result<()> {
        let mut with: Vec<&Process> = run.procs.iter().filter(|x| x.total.waste > 0.0).collect();
        with.sort_by(|a, b| b.total.waste.total_cmp(&a.total.waste));
        self.line("Processes with findings, heaviest first:".into())?;
        for x in &with {
            let p = x.profile;
            let share = x.total.share_of(total);
            let f = x.total.fraction();
            self.line(format!(
                "  pid {:<7} {}  {} of all waste, {} {} ({}), ended by {}, {}",
                p.pid,
                crate::symbolize::short_path(&p.program),
                pct(share.value),
                pct(f.value),
                analysis::words(p.craft).waste,
                uncertainty(&f),
                p.ended_by,
                duration(p.duration_ns)
            ))?;
        }
        let without: Vec<String> = run
            .procs
            .iter()
            .filter(|x| x.total.waste <= 0.0)
            .map(|x| format!("{} {}", crate::symbolize::module_name(&x.profile.program), x.profile.pid))
            .collect();
        if !without.is_empty() {
            self.line(format!("  {} without findings: {}", without.len(), without.join(", ")))?;
        }
        self.blank()?;
        Ok(())
    }

    /// The heaviest pair of each of the top lines in full, start-up frames left out.
    fn pairs(&mut self, run: &Analysis, total: &Sums, lines: &[summary::Line], top: usize) -> anyhow::Result<()> {
        let n = if top == 0 { lines.len() } else { top.min(lines.len()) };
        let w = analysis::words(run.main().profile.craft);
        let unit = run.main().profile.value_unit().label();
        let keys: Vec<u32> = lines.iter().take(n).map(|l| run.names.frame_key(l.site.frame)).collect();
        // Each line's pairs, heaviest first: the first is shown, the others counted.
        let mut shown: Vec<Option<(usize, &analysis::SymPair)>> = vec![None; n];
        let mut others = vec![0usize; n];
        for (pi, x) in run.procs.iter().enumerate() {
            let own = summary::own_modules(x.profile);
            for sp in x.pairs.iter().filter(|sp| sp.waste() > 0.0) {
                let Some(s) = summary::site(&run.names, sp.watch, &own) else { continue };
                let Some(i) = keys.iter().position(|&k| k == run.names.frame_key(s.frame)) else { continue };
                match shown[i] {
                    Some((_, best)) if best.waste() >= sp.waste() => others[i] += 1,
                    Some(_) => {
                        others[i] += 1;
                        shown[i] = Some((pi, sp));
                    }
                    None => shown[i] = Some((pi, sp)),
                }
            }
        }
        let total_pairs: usize = run.procs.iter().map(|x| x.pairs.iter().filter(|sp| sp.waste() > 0.0).count()).sum();
        self.line(format!(
            "Top {n} of {total_pairs} pairs by {} bytes: the heaviest of each line above (start-up frames left out):",
            w.waste
        ))?;
        for (i, (pi, sp)) in shown.iter().flatten().enumerate() {
            self.blank()?;
            let share = sp.sums.share_of(total);
            let f = sp.sums.fraction();
            let few = if sp.sums.few() { " (few traps: uncertain)" } else { "" };
            let proc = if run.procs.len() > 1 {
                let p = run.procs[*pi].profile;
                format!(", pid {} {}", p.pid, crate::symbolize::module_name(&p.program))
            } else {
                String::new()
            };
            let more = match others[i] {
                0 => String::new(),
                k => format!("; {k} more pairs at this line"),
            };
            self.line(format!(
                "#{:<3} {} of all waste ({})   {} {} (waste/(waste+use))   {} {unit}, {} traps{few}{proc}{more}",
                i + 1,
                pct(share.value),
                if share.is_exact() { "exact".into() } else { interval(share.lo, share.hi) },
                pct(f.value),
                w.waste,
                human(sp.waste()),
                sp.traps()
            ))?;
            for (label, ctx) in [(w.watch, sp.watch), (w.trap, sp.trap)] {
                self.line(format!("     {label}"))?;
                let mut frames: Vec<_> = run.frames(ctx).collect();
                while frames.len() > 1 && frames.last().is_some_and(|f| START_UP.contains(&f.function.as_str())) {
                    frames.pop();
                }
                for f in frames.iter().take(TEXT_DEPTH) {
                    let inl = if f.inlined { " [inlined]" } else { "" };
                    self.line(format!("       {}{inl}", f.display()))?;
                }
                if frames.len() > TEXT_DEPTH {
                    self.line(format!("       … {} more frames", frames.len() - TEXT_DEPTH))?;
                }
                if frames.is_empty() {
                    self.line("       (no calling context)".into())?;
                }
            }
        }
        Ok(())
    }
}

/// A site as a table cell: `file:line function`, and the library function it went through.
fn site(run: &Analysis, s: &Site) -> String {
    let f = run.names.get(s.frame);
    let file = f.file.as_deref().map(|x| x.rsplit('/').next().unwrap_or(x));
    let mut out = match (file, f.line) {
        (Some(file), Some(line)) => format!("{file}:{line} {}", f.function),
        _ => f.display(),
    };
    if let Some(v) = s.via {
        out.push_str(&format!(" [{}]", run.names.get(v).function));
    }
    out
}

/// What the reader should know before trusting the figures.
pub fn notes(p: &Profile, c: &Counters) -> Vec<String> {
    let mut v = p.notes.clone();
    let access = analysis::words(p.craft).access;
    // The software sampler takes a timer interrupt's nearby access (a few
    // instructions of straight-line code), so code whose time goes elsewhere
    // (a store-free inner loop) yields interrupts but no samples.
    let missed = c.interrupts.saturating_sub(c.samples + c.skipped_self + c.overdue);
    let bursts = p.sampler.burst_steps > 0;
    let software = p.sampler.kind == SamplerKind::Software && !bursts;
    // So few interrupts say the threads ran few periods, not where the time went.
    const FEW: u64 = 5;
    if bursts && c.samples == 0 && c.bursts >= FEW {
        v.push(format!(
            "no samples: the single-step bursts that {} timer interrupts began ({} instructions stepped) met no {access}: \
             the time went to code without {access}s; try a smaller -p",
            c.bursts, c.steps
        ));
    } else if c.samples == 0 && missed >= FEW && software {
        v.push(format!(
            "no samples: none of {} timer interrupts landed within a few instructions of a {access}; \
             the time went to other code; try a smaller -p, or a host with a PMU (it samples {access}s by count)",
            c.interrupts
        ));
    } else if c.samples == 0 && c.interrupts == 0 && c.threads_failed > 0 {
        // The set-up failure's own note says why.
    } else if c.samples == 0 && matches!(p.ended_by.as_str(), "sandbox" | "traced") {
        // Profiling stopped early; its own note says why.
    } else if c.samples == 0 {
        // One short run, or many short threads: either way few periods ran.
        v.push(format!(
            "no samples were taken: the threads ran {} sampling period{} ({} {}) of their own CPU time in all \
             (a short run, or short threads); try a smaller -p",
            c.interrupts,
            if c.interrupts == 1 { "" } else { "s" },
            p.sampler.period,
            p.sampler.unit.name()
        ));
    } else if software && missed * 2 > c.interrupts {
        v.push(format!(
            "{missed} of {} timer interrupts landed away from any {access} and were not samples: \
             {access}s in code that takes little time per {access} are under-represented (see docs/ACCURACY.md)",
            c.interrupts
        ));
    }
    if bursts && c.bursts_over_budget * 2 > c.bursts {
        v.push(format!(
            "{} of {} bursts were held to the minimum of 4 steps: the period is too short for the {}% overhead budget \
             (or traps were dense), so witch cost more than the budget",
            c.bursts_over_budget,
            c.bursts,
            p.sampler.overhead_percent.unwrap_or(0.0)
        ));
    }
    if bursts && c.bursts_blocked + c.bursts_lost > 0 {
        v.push(format!(
            "{} timer ticks began no burst ({} where the program blocked SIGTRAP or stepped itself, {} bursts it cut short)",
            c.bursts_blocked + c.bursts_lost,
            c.bursts_blocked,
            c.bursts_lost
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
