//! The report as one JSON object with stable fields (see `witch report --help`).
//! Serialized straight from the analysis into the output: frames are written
//! from the interned tables, never copied, so a large report is streamed.

use super::Recorder;
use crate::analysis::context::{CtxId, Interner};
use crate::analysis::interval::{Estimate, Sums};
use crate::analysis::summary::{self, Site};
use crate::analysis::{Analysis, Process, SymPair};
use serde::ser::{SerializeSeq, SerializeStruct};
use serde::{Serialize, Serializer};
use std::io::Write;

/// Version of the JSON report's own shape (not of the profile file): bump on any
/// change a reader of the stable fields would notice.
/// 2: unit-neutral `waste`/`use` with `unit`, intervals, `lines`, `processes`, `pid` per pair.
/// (Added since, without a bump: `objects`, and each pair's `object`.)
pub const REPORT_SCHEMA: u32 = 2;

pub struct Json<'a> {
    /// Lines and pairs kept (0 = all).
    top: usize,
    run: Option<&'a Analysis<'a>>,
    /// The profile file this report is of, where there is one.
    profile: Option<String>,
}

impl Json<'_> {
    /// `top` = lines and pairs kept (0 = all).
    pub fn new(top: usize) -> Self {
        Json { top, run: None, profile: None }
    }

    /// Names the profile file the report is of (so that a reader given the
    /// report where it wants the profile can say which file to give).
    pub fn profile(mut self, path: Option<&std::path::Path>) -> Self {
        self.profile = path.map(|p| p.display().to_string());
        self
    }
}

impl<'a> Recorder<'a> for Json<'a> {
    fn record(&mut self, run: &'a Analysis<'a>) -> anyhow::Result<()> {
        self.run = Some(run);
        Ok(())
    }

    /// Serialized straight into `out`, so the output is never held whole.
    fn write(&mut self, out: &mut dyn Write) -> anyhow::Result<()> {
        let Some(run) = self.run else { return Ok(()) };
        let mut report = report(run, self.top);
        report.profile = self.profile.as_deref();
        let mut w = std::io::BufWriter::new(out);
        serde_json::to_writer_pretty(&mut w, &report)?;
        w.write_all(b"\n")?;
        w.flush()?;
        Ok(())
    }
}

fn report<'a>(run: &'a Analysis<'a>, top: usize) -> JsonReport<'a> {
    let main = run.main();
    let p = main.profile;
    let c = run.counters();
    let total = run.total();
    let keep = |n: usize| if top == 0 { n } else { top.min(n) };
    let mut pairs: Vec<(usize, &SymPair)> = run.procs.iter().enumerate().flat_map(|(i, x)| x.pairs.iter().map(move |sp| (i, sp))).collect();
    pairs.sort_by(|a, b| b.1.waste().total_cmp(&a.1.waste()).then(b.1.used().total_cmp(&a.1.used())));
    let pair_count = pairs.len();
    pairs.truncate(keep(pair_count));
    let mut lines = summary::lines(run);
    lines.truncate(keep(lines.len()));
    let approx: f64 = run.procs.iter().map(|x| x.totals().1).sum();
    JsonReport {
        schema: REPORT_SCHEMA,
        profile: None,
        craft: p.craft.name(),
        program: &p.program,
        args: &p.args,
        pid: p.pid,
        sampler: JsonSampler {
            event: &p.sampler.event,
            period: p.sampler.period,
            kind: p.sampler.kind.name(),
            unit: p.sampler.unit.name(),
        },
        unit: p.value_unit().label(),
        samples: c.samples,
        traps: c.traps,
        waste: total.waste,
        approx_waste: approx,
        r#use: total.r#use,
        waste_fraction: total.fraction().value,
        waste_fraction_ci: ci(&total.fraction()),
        duration_ns: p.duration_ns,
        threads: run.procs.iter().map(|x| crate::analysis::threads(x.profile)).sum(),
        pair_count,
        notes: super::observed::notes(p, &main.counters).into_iter().chain(run.unprofiled_notes()).chain(run.symbol_notes()).collect(),
        counters: c,
        lines: Lines { run, lines, total },
        pairs: JsonPairs { run, pairs, total },
        objects: crate::analysis::objects::merged(run)
            .into_iter()
            .map(|(o, pids)| {
                let (share, f) = (o.sums.share_of(&total), o.sums.fraction());
                JsonObject {
                    key: o.key,
                    kind: o.kind.name(),
                    name: o.name,
                    size: o.size,
                    site: o.site.iter().map(|&f| run.names.get(f).clone()).collect(),
                    pids,
                    waste: o.sums.waste,
                    r#use: o.sums.r#use,
                    share: share.value,
                    share_ci: ci(&share),
                    fraction: f.value,
                    fraction_ci: ci(&f),
                    traps: o.sums.traps,
                    few_traps: o.sums.few(),
                }
            })
            .collect(),
        processes: run.procs.iter().map(|x| JsonProcess::new(x, &total)).collect(),
    }
}

fn ci(e: &Estimate) -> [f64; 2] {
    [e.lo, e.hi]
}

/// `{"frames": [...]}`: a context's frames, innermost first.
pub struct JsonContext<'a> {
    pub names: &'a Interner,
    pub ctx: CtxId,
}

impl Serialize for JsonContext<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Frames<'a>(&'a Interner, CtxId);
        impl Serialize for Frames<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut seq = s.serialize_seq(None)?;
                for f in self.0.frames(self.1) {
                    seq.serialize_element(f)?;
                }
                seq.end()
            }
        }
        let mut st = s.serialize_struct("Context", 1)?;
        st.serialize_field("frames", &Frames(self.names, self.ctx))?;
        st.end()
    }
}

#[derive(Serialize)]
pub struct JsonPair<'a> {
    /// The process it was found in.
    pub pid: u32,
    pub waste: f64,
    pub approx_waste: f64,
    pub r#use: f64,
    /// Of all waste in the run, with its 95% interval.
    pub share: f64,
    pub share_ci: [f64; 2],
    /// This pair's own waste / (waste + use).
    pub fraction: f64,
    pub fraction_ci: [f64; 2],
    pub traps: u64,
    /// Fewer traps than make a figure reliable.
    pub few_traps: bool,
    pub watch: JsonContext<'a>,
    pub trap: JsonContext<'a>,
    /// The data object holding most of its waste (its `key` in `objects`);
    /// absent when the profile keeps no objects.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<&'a str>,
}

impl<'a> JsonPair<'a> {
    pub fn new(names: &'a Interner, pid: u32, sp: &SymPair, total: &Sums) -> Self {
        let (share, f) = (sp.sums.share_of(total), sp.sums.fraction());
        JsonPair {
            pid,
            waste: sp.waste(),
            approx_waste: sp.approx_waste,
            r#use: sp.used(),
            share: share.value,
            share_ci: ci(&share),
            fraction: f.value,
            fraction_ci: ci(&f),
            traps: sp.traps(),
            few_traps: sp.sums.few(),
            watch: JsonContext { names, ctx: sp.watch },
            trap: JsonContext { names, ctx: sp.trap },
            object: None,
        }
    }
}

/// The report's pairs, each written as a [`JsonPair`] (a sequence).
struct JsonPairs<'a> {
    run: &'a Analysis<'a>,
    pairs: Vec<(usize, &'a SymPair)>,
    total: Sums,
}

impl Serialize for JsonPairs<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.pairs.len()))?;
        for (pi, sp) in &self.pairs {
            let x = &self.run.procs[*pi];
            let mut p = JsonPair::new(&self.run.names, x.profile.pid, sp, &self.total);
            p.object = sp.object().map(|o| x.objects[o].key.as_str());
            seq.serialize_element(&p)?;
        }
        seq.end()
    }
}

/// A summary site: the frame, and the library function it went through.
#[derive(Serialize)]
struct JsonSite<'a> {
    function: &'a str,
    file: Option<&'a str>,
    line: Option<u32>,
    module: &'a str,
    via: Option<&'a str>,
}

impl<'a> JsonSite<'a> {
    fn new(names: &'a Interner, s: &Site) -> Self {
        let f = names.get(s.frame);
        JsonSite {
            function: &f.function,
            file: f.file.as_deref(),
            line: f.line,
            module: &f.module,
            via: s.via.map(|v| names.get(v).function.as_str()),
        }
    }
}

#[derive(Serialize)]
struct JsonPartner<'a> {
    #[serde(flatten)]
    site: JsonSite<'a>,
    waste: f64,
    r#use: f64,
}

#[derive(Serialize)]
struct JsonLine<'a> {
    #[serde(flatten)]
    site: JsonSite<'a>,
    pids: Vec<u32>,
    waste: f64,
    approx_waste: f64,
    r#use: f64,
    share: f64,
    share_ci: [f64; 2],
    fraction: f64,
    fraction_ci: [f64; 2],
    traps: u64,
    few_traps: bool,
    /// Where the trap side was: killers, or where the same value came again.
    partners: Vec<JsonPartner<'a>>,
}

struct Lines<'a> {
    run: &'a Analysis<'a>,
    lines: Vec<summary::LineSummary>,
    total: Sums,
}

impl Serialize for Lines<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let names = &self.run.names;
        let mut seq = s.serialize_seq(Some(self.lines.len()))?;
        for l in &self.lines {
            let (share, f) = (l.sums.share_of(&self.total), l.sums.fraction());
            seq.serialize_element(&JsonLine {
                site: JsonSite::new(names, &l.site),
                pids: l.procs.iter().map(|&i| self.run.procs[i].profile.pid).collect(),
                waste: l.sums.waste,
                approx_waste: l.approx_waste,
                r#use: l.sums.r#use,
                share: share.value,
                share_ci: ci(&share),
                fraction: f.value,
                fraction_ci: ci(&f),
                traps: l.sums.traps,
                few_traps: l.sums.few(),
                partners: l.partners.iter().map(|(s, w, u)| JsonPartner { site: JsonSite::new(names, s), waste: *w, r#use: *u }).collect(),
            })?;
        }
        seq.end()
    }
}

#[derive(Serialize)]
struct JsonProcess<'a> {
    pid: u32,
    ppid: u32,
    program: &'a str,
    args: &'a [String],
    ended_by: witchcraft::profile::EndedBy,
    duration_ns: u64,
    threads: usize,
    samples: u64,
    traps: u64,
    waste: f64,
    r#use: f64,
    /// Of all waste in the run.
    share: f64,
    waste_fraction: f64,
    waste_fraction_ci: [f64; 2],
    notes: Vec<String>,
}

impl<'a> JsonProcess<'a> {
    fn new(x: &'a Process<'a>, total: &Sums) -> Self {
        let p = x.profile;
        let f = x.total.fraction();
        JsonProcess {
            pid: p.pid,
            ppid: p.ppid,
            program: &p.program,
            args: &p.args,
            ended_by: p.ended_by,
            duration_ns: p.duration_ns,
            threads: crate::analysis::threads(p),
            samples: x.counters.samples,
            traps: x.counters.traps,
            waste: x.total.waste,
            r#use: x.total.r#use,
            share: x.total.share_of(total).value,
            waste_fraction: f.value,
            waste_fraction_ci: ci(&f),
            notes: super::observed::notes(p, &x.counters),
        }
    }
}

/// A data object and every credit that touched it.
#[derive(Serialize)]
struct JsonObject {
    /// What identifies it (pairs name their object by it): `static:MODULE:SYMBOL`,
    /// `heap:FRAMES`, `stack`, `unknown`.
    key: String,
    /// "static", "heap", "stack" or "unknown".
    kind: &'static str,
    name: String,
    /// Bytes: the symbol's size, or the largest block allocated at the site.
    #[serde(skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    /// A heap object's allocation context, innermost first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    site: Vec<crate::symbolize::Frame>,
    pids: Vec<u32>,
    waste: f64,
    r#use: f64,
    /// Of all waste in the run, with its 95% interval.
    share: f64,
    share_ci: [f64; 2],
    /// Waste / (waste + use) within the object.
    fraction: f64,
    fraction_ci: [f64; 2],
    traps: u64,
    few_traps: bool,
}

#[derive(Serialize)]
struct JsonSampler<'a> {
    event: &'a str,
    period: u64,
    kind: &'a str,
    unit: &'a str,
}

#[derive(Serialize)]
struct JsonReport<'a> {
    schema: u32,
    /// The profile file the report is of (absent when it was not written).
    #[serde(skip_serializing_if = "Option::is_none")]
    profile: Option<&'a str>,
    craft: &'static str,
    /// The run's first process.
    program: &'a str,
    args: &'a [String],
    pid: u32,
    sampler: JsonSampler<'a>,
    /// Unit of every waste and use figure: "bytes", or "byte·ns" for time-weighted estimates.
    unit: &'static str,
    samples: u64,
    traps: u64,
    /// Over every process of the run.
    waste: f64,
    approx_waste: f64,
    r#use: f64,
    waste_fraction: f64,
    waste_fraction_ci: [f64; 2],
    duration_ns: u64,
    threads: usize,
    /// Pairs over the run; `pairs` holds them all unless --top was given.
    pair_count: usize,
    counters: witchcraft::profile::Counters,
    notes: Vec<String>,
    /// The program's own source lines, by waste.
    lines: Lines<'a>,
    pairs: JsonPairs<'a>,
    /// Data objects by waste, merged over processes (empty for profiles
    /// that keep none).
    objects: Vec<JsonObject>,
    processes: Vec<JsonProcess<'a>>,
}
