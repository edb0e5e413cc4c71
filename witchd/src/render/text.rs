//! The report a person reads top-down: what ran and how it was observed, the
//! waste fraction, a table of the program's own lines by waste with the
//! lines that killed (or repeated) them, then the heaviest pairs in full.
//! For a run of several processes, the processes with findings come next,
//! heaviest first. Every figure that is an estimate carries its 95% interval.

use super::observed::{burst_engine, exact_cache, notes};
use super::units::{amount, duration, interval, pct, printable, uncertainty};
use super::width::{fit, terminal_width};
use super::Recorder;
use crate::analysis::interval::{Sums, FEW_JUDGED};
use crate::analysis::summary::{self, Site};
use crate::analysis::{self, Analysis, Process};
use std::io::Write;

/// Frames per context shown; deeper contexts end in "… N more".
const TEXT_DEPTH: usize = 12;
/// Pairs shown in full.
pub const PAIRS_SHOWN: usize = 3;
/// A share of all waste under which a summary line's pair is not shown in
/// full (the heaviest line's always is).
const MINOR: f64 = 0.01;

// Outermost frames every context of a thread shares, left out of the text.
use crate::analysis::summary::START_UP;

pub struct Text<'a> {
    /// Summary lines shown (0 = all).
    top: usize,
    pairs: usize,
    /// Show the data objects with the most waste.
    objects: bool,
    width: usize,
    run: Option<&'a Analysis<'a>>,
}

impl Text<'_> {
    /// `top` = lines of the summary shown (0 = all).
    pub fn new(top: usize) -> Self {
        Text { top, pairs: PAIRS_SHOWN, objects: false, width: terminal_width(), run: None }
    }

    /// Show the data objects with the most waste, and each pair's object.
    pub fn objects(mut self, on: bool) -> Self {
        self.objects = on;
        self
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
        let mut page = Page { width: self.width, out, objects: self.objects };
        page.run(run, self.top, self.pairs)
    }
}

struct Page<'w> {
    width: usize,
    out: &'w mut dyn Write,
    /// Show the data objects (`Text::objects`).
    objects: bool,
}

impl Page<'_> {
    /// One line; whatever came from the profile is shown with its control characters escaped.
    fn line(&mut self, s: String) -> std::io::Result<()> {
        for l in fit(&printable(&s), self.width) {
            writeln!(self.out, "{}", l.trim_end())?;
        }
        Ok(())
    }

    fn blank(&mut self) -> std::io::Result<()> {
        writeln!(self.out)
    }

    /// Findings first (what ran, the waste fraction, the summary, the
    /// processes, the heaviest pairs), then how they were observed: the
    /// sampler, the burst engine, what it cost, and the notes.
    fn run(&mut self, run: &Analysis, top: usize, pairs: usize) -> anyhow::Result<()> {
        self.header(run)?;
        self.findings(run, top, pairs)?;
        self.blank()?;
        self.engine(run)
    }

    /// One line: the program, how it ended, how long, how many threads and processes.
    fn header(&mut self, run: &Analysis) -> anyhow::Result<()> {
        let p = run.main().profile;
        let threads: usize = run.procs.iter().map(|x| analysis::threads(x.profile)).sum();
        let with = run.procs.iter().filter(|x| x.total.waste > 0.0).count();
        let procs = if run.procs.len() > 1 { format!(", {} processes, {with} with findings", run.procs.len()) } else { String::new() };
        self.line(format!(
            "witch {}: {} (pid {}, ended by {}), {}, {threads} thread{}{procs}",
            p.craft.name(),
            crate::symbolize::short_path(&p.program),
            p.pid,
            p.ended_by,
            duration(p.duration_ns),
            if threads == 1 { "" } else { "s" }
        ))?;
        Ok(())
    }

    /// How the run was observed: sampler, burst engine, cost, notes.
    fn engine(&mut self, run: &Analysis) -> anyhow::Result<()> {
        let main = run.main();
        let p = main.profile;
        let w = analysis::words(p.craft);
        let c = run.counters();
        self.line("How it was observed:".into())?;
        if p.sampler.kind.is_exhaustive() {
            let how = if p.sampler.event == "single-step" {
                "every instruction single-stepped"
            } else {
                "every instruction recorded in the code cache"
            };
            self.line(format!("  sampler   none: exact, {how} and every {} judged (figures are counts)", w.access))?;
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
            for l in burst_engine(p, &c) {
                self.line(l)?;
            }
        }
        let cost = if c.engine_ns > 0 {
            // Where it went, when the profile says (builds before these
            // counters wrote none). Each step is timed by its burst: what
            // one cost here.
            let per_step = if c.steps > 0 { format!(" of {:.1} µs", c.step_ns as f64 / c.steps as f64 / 1e3) } else { String::new() };
            let parts: Vec<String> = [
                (c.tick_ns, "ticks", String::new()),
                (c.cache_ns, "windows in the code cache", String::new()),
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
            if let Some(l) = exact_cache(&c) {
                self.line(l)?;
            }
        } else {
            self.line(format!("  observed  {} samples, {} traps, {} imprecise PCs{cost}", c.samples, c.traps, c.imprecise))?;
        }
        for n in notes(p, &main.counters).into_iter().chain(run.unprofiled_notes()).chain(run.symbol_notes()) {
            self.line(format!("  note: {n}"))?;
        }
        Ok(())
    }

    /// The waste fraction and the findings behind it.
    fn findings(&mut self, run: &Analysis, top: usize, pairs: usize) -> anyhow::Result<()> {
        let main = run.main();
        let p = main.profile;
        let w = analysis::words(p.craft);
        let c = run.counters();
        let total = run.total();
        let (approx, used) = (run.procs.iter().map(|x| x.totals().1).sum::<f64>(), total.r#use);
        if total.waste + used <= 0.0 {
            // Nothing was judged: no fraction to print, not 0%.
            self.line(format!(
                "Waste fraction: unknown: no sampled {} was judged ({} samples, {} traps; the notes below say why)",
                w.access, c.samples, c.traps
            ))?;
            self.blank()?;
            self.line(format!("No {} pairs found.", w.waste))?;
            return Ok(());
        }
        let frac = total.fraction();
        self.line(format!("Waste fraction: {} of {} bytes are {} ({})", pct(frac.value), w.access, w.waste, uncertainty(&frac)))?;
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
        let kind = if total.exhaustive { "counted" } else { "estimated" };
        let what = match p.value_unit() {
            witchcraft::profile::ValueUnit::Bytes => format!("{kind} bytes, 1 KiB = 1024 B"),
            // Not bytes: the accesses the samples saw, weighted by the CPU
            // time each stands for (see `Engine::unit_scale`).
            witchcraft::profile::ValueUnit::ByteNs => {
                let counter = if p.craft == witchcraft::profile::Craft::SilentLoad { "sw-loads" } else { "sw-stores" };
                format!("time-weighted, to compare, not bytes: -e {counter} counts bytes")
            }
        };
        self.line(format!("  waste {}, use {} ({what})", amount(total.waste, p.value_unit()), amount(used, p.value_unit()),))?;
        self.line(format!(
            "  exact {}, approximate {}{fp}",
            pct(analysis::ratio(total.waste - approx, all)),
            pct(analysis::ratio(approx, all))
        ))?;

        self.blank()?;
        if total.waste <= 0.0 {
            self.line(format!("No {} pairs found.", w.waste))?;
            return Ok(());
        }
        let lines: Vec<_> = summary::lines(run).into_iter().filter(|l| l.sums.waste > 0.0).collect();
        self.lines(run, &total, &lines, top)?;
        if self.objects {
            self.objects(run, &total, top)?;
        }
        if run.procs.len() > 1 {
            self.processes(run, &total)?;
        }
        self.pairs(run, &total, &lines, pairs)
    }

    /// The summary: the program's own lines by waste, each with its partner lines.
    fn lines(&mut self, run: &Analysis, total: &Sums, lines: &[summary::LineSummary], top: usize) -> anyhow::Result<()> {
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
            let bare = Site { via: None, ..l.site };
            self.line(format!(
                "  {:>6}  {ci}{:>6}  {:>5}{few} {}",
                pct(share.value),
                pct(l.sums.fraction().value),
                l.sums.traps,
                site(run, &bare)
            ))?;
            let key = run.names.site_key(l.site.frame);
            let same = if run.names.get(l.site.frame).line.is_some() { "the same line" } else { "the same function" };
            let mut partners: Vec<String> = l
                .partners
                .iter()
                .filter(|p| p.1 > 0.0)
                .take(2)
                .map(|(s, wst, _)| {
                    let at = if run.names.site_key(s.frame) == key { same.to_string() } else { site(run, &Site { via: None, ..*s }) };
                    format!("{at} {}", pct(wst / l.sums.waste))
                })
                .collect();
            let more = l.partners.iter().filter(|p| p.1 > 0.0).count().saturating_sub(2);
            if more > 0 {
                partners.push(format!("{more} more"));
            }
            // The runtime function it went through, and its partners, below it.
            let via = l.site.via.map_or(String::new(), |v| format!("in {}; ", run.names.get(v).function));
            self.line(format!("     {via}{partner} {}", partners.join(", ")))?;
        }
        if lines.iter().take(n).any(|l| l.sums.few()) {
            self.line(format!("  ~ fewer than {} traps: an uncertain figure", crate::analysis::interval::FEW_TRAPS))?;
        }
        let lineless = modules_without_lines(
            run,
            lines.iter().take(n).flat_map(|l| std::iter::once(&l.site).chain(l.partners.iter().take(2).map(|p| &p.0))),
        );
        if !lineless.is_empty() {
            self.line(format!(
                "  no source lines in {}: their functions are shown; their debug info (built with -g, or the distribution's debug package) would give lines",
                lineless.join(", ")
            ))?;
        }
        self.blank()?;
        Ok(())
    }

    /// The data objects with the most waste: each one's share of all waste
    /// and its interval, and the craft's fraction within it.
    fn objects(&mut self, run: &Analysis, total: &Sums, top: usize) -> anyhow::Result<()> {
        use crate::analysis::objects::{self, ObjectKind};
        let w = analysis::words(run.main().profile.craft);
        if !objects::kept(run) {
            self.line("Objects: this profile keeps no data objects (an exact run, or a profile from an older witch).".into())?;
            self.blank()?;
            return Ok(());
        }
        let all: Vec<_> = objects::merged(run).into_iter().filter(|(o, _)| o.sums.waste > 0.0).collect();
        let n = if top == 0 { all.len() } else { top.min(all.len()) };
        let of = if n < all.len() { format!(" (top {n} of {}; --top N for more)", all.len()) } else { String::new() };
        self.line(format!("Objects with the most waste, by share of all waste{of}:"))?;
        let head = if total.exhaustive { "" } else { "95% interval  " };
        self.line(format!("   share  {head}{:>6}  traps  object", w.waste))?;
        for (o, pids) in all.iter().take(n) {
            let share = o.sums.share_of(total);
            let few = if o.sums.few() { "~" } else { " " };
            let ci = if total.exhaustive { String::new() } else { format!("{:<12}  ", interval(share.lo, share.hi)) };
            let size = o.size.map_or(String::new(), |b| format!(", {}", super::units::size(b)));
            let kind = match o.kind {
                ObjectKind::Static => "static ",
                ObjectKind::Heap | ObjectKind::Stack | ObjectKind::Unknown => "",
            };
            let procs = if run.procs.len() > 1 {
                format!(", pid {}", pids.iter().map(u32::to_string).collect::<Vec<_>>().join(" "))
            } else {
                String::new()
            };
            self.line(format!(
                "  {:>6}  {ci}{:>6}  {:>5}{few} {kind}{}{size}{procs}",
                pct(share.value),
                pct(o.sums.fraction().value),
                o.sums.traps,
                o.name
            ))?;
        }
        let named: f64 = all.iter().map(|(o, _)| o.sums.waste).sum();
        let lost: u64 = run.procs.iter().map(|x| x.counters.object_overflow).sum();
        if lost > 0 && total.waste > named {
            self.line(format!(
                "  {} of the waste has no object: {lost} credits found the thread's object table full",
                pct(analysis::ratio(total.waste - named, total.waste))
            ))?;
        }
        if all.iter().take(n).any(|(o, _)| o.sums.few()) {
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
        // The rest by program: "sh 4242", or "python3 ×62" for many of one.
        let mut without: Vec<(&str, Vec<u32>)> = Vec::new();
        for x in run.procs.iter().filter(|x| x.total.waste <= 0.0) {
            let name = crate::symbolize::module_name(&x.profile.program);
            match without.iter_mut().find(|(n, _)| *n == name) {
                Some((_, pids)) => pids.push(x.profile.pid),
                None => without.push((name, vec![x.profile.pid])),
            }
        }
        if !without.is_empty() {
            let n: usize = without.iter().map(|(_, p)| p.len()).sum();
            let list: Vec<String> = without
                .iter()
                .map(|(name, pids)| if pids.len() == 1 { format!("{name} {}", pids[0]) } else { format!("{name} ×{}", pids.len()) })
                .collect();
            self.line(format!("  {n} without findings: {}", list.join(", ")))?;
        }
        self.blank()?;
        Ok(())
    }

    /// The heaviest pair of each of the top lines in full, start-up frames
    /// left out; `top` 0: every pair with waste, heaviest first.
    fn pairs(&mut self, run: &Analysis, total: &Sums, lines: &[summary::LineSummary], top: usize) -> anyhow::Result<()> {
        let w = analysis::words(run.main().profile.craft);
        let total_pairs: usize = run.procs.iter().map(|x| x.pairs.iter().filter(|sp| sp.waste() > 0.0).count()).sum();
        // (process, pair, other pairs at its line), in the order shown.
        let shown: Vec<(usize, &analysis::SymPair, usize)> = if top == 0 {
            let mut all: Vec<(usize, &analysis::SymPair, usize)> = run
                .procs
                .iter()
                .enumerate()
                .flat_map(|(pi, x)| x.pairs.iter().filter(|sp| sp.waste() > 0.0).map(move |sp| (pi, sp, 0)))
                .collect();
            all.sort_by(|a, b| b.1.waste().total_cmp(&a.1.waste()));
            self.line(format!("All {total_pairs} pairs, heaviest first ({} = waste/(waste+use)):", w.waste))?;
            all
        } else {
            let n = top.min(lines.len());
            let keys: Vec<u32> = lines.iter().take(n).map(|l| run.names.site_key(l.site.frame)).collect();
            // Each line's pairs, heaviest first: the first is shown, the others counted.
            let mut best: Vec<Option<(usize, &analysis::SymPair)>> = vec![None; n];
            let mut others = vec![0usize; n];
            for (pi, x) in run.procs.iter().enumerate() {
                for sp in x.pairs.iter().filter(|sp| sp.waste() > 0.0) {
                    let Some(s) = summary::site(&run.names, sp.watch) else { continue };
                    let Some(i) = keys.iter().position(|&k| k == run.names.site_key(s.frame)) else { continue };
                    match best[i] {
                        Some((_, b)) if b.waste() >= sp.waste() => others[i] += 1,
                        Some(_) => {
                            others[i] += 1;
                            best[i] = Some((pi, sp));
                        }
                        None => best[i] = Some((pi, sp)),
                    }
                }
            }
            let mut shown: Vec<_> = best.into_iter().zip(others).filter_map(|(b, k)| b.map(|(pi, sp)| (pi, sp, k))).collect();
            // A pair in full is for what is worth fixing: after the first,
            // a line's pair under MINOR of all waste is counted, not shown.
            let all = shown.len();
            let mut first = true;
            shown.retain(|(_, sp, _)| std::mem::take(&mut first) || sp.sums.share_of(total).value >= MINOR);
            self.line(format!(
                "Top {} of {total_pairs} pairs, the heaviest of each line above ({} = waste/(waste+use)):",
                shown.len(),
                w.waste
            ))?;
            if shown.len() < all {
                self.line(format!(
                    "  (the pairs of {} line{} under {} of all waste are left out: --pairs 0 shows every pair)",
                    all - shown.len(),
                    if all - shown.len() == 1 { "" } else { "s" },
                    pct(MINOR)
                ))?;
            }
            shown
        };
        for (i, &(pi, sp, others)) in shown.iter().enumerate() {
            self.blank()?;
            let share = sp.sums.share_of(total);
            let f = sp.sums.fraction();
            let few = if sp.sums.few() { " (few traps: uncertain)" } else { "" };
            let proc = if run.procs.len() > 1 {
                let p = run.procs[pi].profile;
                format!(", pid {} {}", p.pid, crate::symbolize::module_name(&p.program))
            } else {
                String::new()
            };
            let more = match others {
                0 => String::new(),
                k => format!("; {k} more pairs at this line"),
            };
            self.line(format!(
                "#{:<3} {} of all waste ({}), {} {}, {}, {} traps{few}{proc}{more}",
                i + 1,
                pct(share.value),
                if share.is_exact() { "exact".into() } else { interval(share.lo, share.hi) },
                pct(f.value),
                w.waste,
                amount(sp.waste(), run.main().profile.value_unit()),
                sp.traps()
            ))?;
            if self.objects {
                if let Some(o) = sp.object() {
                    let x = &run.procs[pi];
                    let on = &x.objects[o];
                    let part = sp.objects.iter().find(|c| c.0 == o).map_or(0.0, |c| c.1.waste);
                    let most = if part < sp.waste() * 0.999 {
                        format!(" ({} of its waste)", pct(analysis::ratio(part, sp.waste())))
                    } else {
                        String::new()
                    };
                    self.line(format!("     on {}{most}", on.name))?;
                }
            }
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

/// The modules, by file name, of the sites given that have no source line.
fn modules_without_lines<'s>(run: &Analysis, sites: impl Iterator<Item = &'s Site>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in sites {
        let f = run.names.get(s.frame);
        let m = crate::symbolize::module_name(&f.module).to_string();
        if f.line.is_none() && !out.contains(&m) {
            out.push(m);
        }
    }
    out
}

/// A site as a table cell: `file:line function`, or `function (module)`
/// where it has no line, and the runtime function it went through.
pub fn site(run: &Analysis, s: &Site) -> String {
    site_of(&run.names, s)
}

/// [`site`] over the interned frames alone.
pub fn site_of(names: &crate::analysis::context::Interner, s: &Site) -> String {
    let f = names.get(s.frame);
    let file = f.file.as_deref().map(|x| x.rsplit('/').next().unwrap_or(x));
    let mut out = match (file, f.line) {
        (Some(file), Some(line)) => format!("{file}:{line} {}", f.function),
        _ if f.function.contains("+0x") => f.function.clone(),
        _ => format!("{} ({})", f.function, crate::symbolize::module_name(&f.module)),
    };
    if let Some(v) = s.via {
        out.push_str(&format!(" [{}]", names.get(v).function));
    }
    out
}
