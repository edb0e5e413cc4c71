//! pprof export (perftools.profiles, gzipped), so any pprof viewer shows the pairs.
//!
//! Messages are declared by hand with prost's derive: no protoc or build script.
//! Each pair becomes samples whose stack is Witch's synthetic calling context
//! (§4.6.5): watch context, then a relation frame, then trap context. pprof stacks are
//! leaf first, so location_id = trap frames (innermost first), the relation, then watch
//! frames (innermost first): the path root→leaf reads main→…→watch→KILLED_BY→main→…→trap,
//! and pprof's flat column (`-top`) lands on the trapping access: the killer.
//! [`Leaf::Watch`] turns each stack around (main→…→trap→KILLS→main→…→watch), so `-top`
//! ranks the watched accesses: which stores are dead.
//!
//! Sample values are in the profile's unit (bytes, or byte·ns), rounded to integers;
//! each sample carries its thread and process as labels.

use super::Recorder;
use crate::analysis::context::FrameId;
use crate::analysis::{Analysis, Process};
use crate::symbolize::{Frame, Modules};
use flate2::write::GzEncoder;
use std::collections::HashMap;
use std::io::Write;
use witchcraft::profile::Profile;

/// The pprof `Profile` message (witch's own is [`Profile`]).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PprofProfile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "7")]
    pub drop_frames: i64,
    #[prost(int64, tag = "8")]
    pub keep_frames: i64,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    /// Innermost inlined function first; the last is the real (outer) function.
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
    #[prost(int64, tag = "3")]
    pub column: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

/// Interning tables; ids are 1-based as pprof wants (0 = none).
struct Builder {
    out: PprofProfile,
    strings: HashMap<String, i64>,
    functions: HashMap<(String, String), u64>,
    /// By process (index in the analysis) and runtime address.
    locations: HashMap<(usize, u64), u64>,
    relations: HashMap<&'static str, u64>,
    /// Per sample type (waste, use): the exact sum so far, and the integers
    /// given out for it (see [`Builder::rounded`]).
    sums: [f64; 2],
    given: [i64; 2],
}

impl Builder {
    /// A sample's value as an integer, pprof's only kind: the running sum
    /// rounded, less what was given out before. Every total (and every
    /// prefix of the samples) is then the exact total rounded, as the
    /// report shows it: rounding each sample alone read 557 bytes for a
    /// profile of 4.87, its many small figures each rounded up.
    fn rounded(&mut self, kind: usize, v: f64) -> i64 {
        self.sums[kind] += v;
        let r = self.sums[kind].round() as i64 - self.given[kind];
        self.given[kind] += r;
        r
    }

    fn s(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.out.string_table.len() as i64;
        self.out.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn function(&mut self, name: &str, file: &str) -> u64 {
        if let Some(&id) = self.functions.get(&(name.to_string(), file.to_string())) {
            return id;
        }
        let id = self.out.function.len() as u64 + 1;
        let (n, f) = (self.s(name), self.s(file));
        self.out.function.push(Function { id, name: n, system_name: n, filename: f, start_line: 0 });
        self.functions.insert((name.to_string(), file.to_string()), id);
        id
    }

    /// One location per process and runtime address, carrying its inlined frames.
    fn location(&mut self, run: &Analysis, proc: usize, addr: u64, frames: &[FrameId], mapping_id: u64) -> u64 {
        if let Some(&id) = self.locations.get(&(proc, addr)) {
            return id;
        }
        let id = self.out.location.len() as u64 + 1;
        let line = frames
            .iter()
            .map(|&f| {
                let f: &Frame = run.names.get(f);
                Line {
                    function_id: self.function(&f.function, f.file.as_deref().unwrap_or("")),
                    line: f.line.unwrap_or(0) as i64,
                    column: 0,
                }
            })
            .collect();
        self.out.location.push(Location { id, mapping_id, address: addr, line, is_folded: false });
        self.locations.insert((proc, addr), id);
        id
    }

    /// The synthetic frame joining the two contexts; it has no address or mapping.
    fn relation(&mut self, name: &'static str) -> u64 {
        if let Some(&id) = self.relations.get(name) {
            return id;
        }
        let id = self.out.location.len() as u64 + 1;
        let f = self.function(name, "");
        self.out.location.push(Location {
            id,
            mapping_id: 0,
            address: 0,
            line: vec![Line { function_id: f, line: 0, column: 0 }],
            is_folded: false,
        });
        self.relations.insert(name, id);
        id
    }
}

/// Relation frame for the used part of a pair: its bytes were put to use, not wasted.
pub const USED_BY: &str = "USED_BY";

/// Which side of a pair is the leaf of its stack.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Leaf {
    /// The trapping access (the killer): `go tool pprof -top` ranks killers
    #[default]
    Trap,
    /// The watched access (the dead store): `go tool pprof -top` ranks dead stores
    Watch,
}

/// The relation frame's name, read from root to leaf.
fn relation(craft: witchcraft::profile::Craft, used: bool, leaf: Leaf) -> &'static str {
    use witchcraft::profile::Craft;
    match (used, leaf, craft) {
        (true, Leaf::Trap, _) => USED_BY,
        (true, Leaf::Watch, _) => "USES",
        (false, Leaf::Trap, c) => c.relation(),
        (false, Leaf::Watch, Craft::Dead) => "KILLS",
        (false, Leaf::Watch, c) => c.relation(),
    }
}

/// Builds the pprof message of every process of a run. Values are rounded to integers.
pub fn build(run: &Analysis, leaf: Leaf) -> PprofProfile {
    let mut b = Builder {
        out: PprofProfile { string_table: vec![String::new()], ..Default::default() },
        strings: HashMap::from([(String::new(), 0)]),
        functions: HashMap::new(),
        locations: HashMap::new(),
        relations: HashMap::new(),
        sums: [0.0; 2],
        given: [0; 2],
    };
    let p = run.main().profile;
    let unit = b.s(p.value_unit().label());
    let (waste, used) = (b.s("waste"), b.s("use"));
    b.out.sample_type = vec![ValueType { r#type: waste, unit }, ValueType { r#type: used, unit }];
    b.out.default_sample_type = waste;
    let (pt, pu) = (b.s(&p.sampler.event), b.s(p.sampler.unit.name()));
    b.out.period_type = Some(ValueType { r#type: pt, unit: pu });
    b.out.period = p.sampler.period as i64;
    b.out.time_nanos = p.start_unix_ns as i64;
    b.out.duration_nanos = p.duration_ns as i64;
    let comment = format!("witch {} {} (pid {})", p.craft.name(), p.program, p.pid);
    let c = b.s(&comment);
    b.out.comment.push(c);
    // The main process first: viewers name a profile after its first mapping.
    let first = run.main_index();
    let order = std::iter::once(first).chain((0..run.procs.len()).filter(|&i| i != first));
    for i in order {
        process(&mut b, run, i, &run.procs[i], leaf);
    }
    b.out
}

/// One process's mappings and samples.
fn process(b: &mut Builder, run: &Analysis, pi: usize, proc: &Process, leaf: Leaf) {
    let p: &Profile = proc.profile;
    let first_mapping = b.out.mapping.len() as u64;
    for (i, m) in p.modules.iter().enumerate() {
        let (f, id) = (b.s(&m.path), b.s(m.build_id.as_deref().unwrap_or("")));
        b.out.mapping.push(Mapping {
            id: first_mapping + i as u64 + 1,
            memory_start: m.start,
            memory_limit: m.end,
            // Where the mapping starts in the file; unknown (0) without the file. Frames
            // carry their functions and lines, so viewers need not symbolize again.
            file_offset: run.file_offset(m).unwrap_or(0),
            filename: f,
            build_id: id,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
        });
    }
    let thread_key = b.s("thread");
    let pid_key = b.s("pid");
    let modules = Modules::new(&p.modules);
    let mapping_of = |a: u64| modules.index(a).map_or(0, |i| first_mapping + i as u64 + 1);
    let object_key = b.s("object");
    for (ti, t) in p.threads.iter().enumerate() {
        // Each pair's credits by data object, labelled with the object's
        // name (`-tagfocus object=...`); what no object holds (the object
        // table was full, or the profile keeps none) goes unlabelled.
        let mut parts: Vec<(&witchcraft::profile::Pair, f64, f64, Option<&str>)> = Vec::new();
        let mut held: std::collections::HashMap<(u32, u32), (f64, f64)> = std::collections::HashMap::new();
        for (oi, o) in t.objects.iter().enumerate() {
            let Some(obj) = proc.object_of(ti, oi) else { continue };
            let h = held.entry((o.pair.watch, o.pair.trap)).or_default();
            h.0 += o.pair.waste + o.pair.approx_waste;
            h.1 += o.pair.r#use;
            parts.push((&o.pair, o.pair.waste + o.pair.approx_waste, o.pair.r#use, Some(obj.name.as_str())));
        }
        for pair in &t.pairs {
            let (hw, hu) = held.get(&(pair.watch, pair.trap)).copied().unwrap_or_default();
            let rest = |all: f64, part: f64| if all - part <= 1e-9 * all { 0.0 } else { all - part };
            parts.push((pair, rest(pair.waste + pair.approx_waste, hw), rest(pair.r#use, hu), None));
        }
        for (pair, waste, used, object) in parts {
            let locs = |b: &mut Builder, node: u32| -> Vec<u64> {
                Profile::context(t, node).into_iter().map(|a| b.location(run, pi, a, proc.frames_at(a), mapping_of(a))).collect()
            };
            if waste == 0.0 && used == 0.0 {
                continue;
            }
            let watch = locs(b, pair.watch);
            let trap = locs(b, pair.trap);
            let w = b.rounded(0, waste);
            let u = b.rounded(1, used);
            for (used, value) in [(false, [w, 0]), (true, [0, u])] {
                if value == [0, 0] {
                    continue;
                }
                let (leaf_side, root_side) = match leaf {
                    Leaf::Trap => (&trap, &watch),
                    Leaf::Watch => (&watch, &trap),
                };
                let mut ids = leaf_side.clone();
                ids.push(b.relation(relation(p.craft, used, leaf)));
                ids.extend(root_side);
                let mut label = vec![Label { key: thread_key, str: 0, num: t.tid as i64, num_unit: 0 }];
                if run.procs.len() > 1 {
                    label.push(Label { key: pid_key, str: 0, num: p.pid as i64, num_unit: 0 });
                }
                if let Some(name) = object {
                    label.push(Label { key: object_key, str: b.s(name), num: 0, num_unit: 0 });
                }
                b.out.sample.push(Sample { location_id: ids, value: value.to_vec(), label });
            }
        }
    }
}

/// The gzipped pprof file of a run.
#[derive(Default)]
pub struct Pprof {
    leaf: Leaf,
    gz: Vec<u8>,
}

impl Pprof {
    pub fn new(leaf: Leaf) -> Pprof {
        Pprof { leaf, gz: Vec::new() }
    }
}

impl<'a> Recorder<'a> for Pprof {
    fn record(&mut self, run: &'a Analysis<'a>) -> anyhow::Result<()> {
        use prost::Message;
        let msg = build(run, self.leaf);
        let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&msg.encode_to_vec())?;
        self.gz = gz.finish()?;
        Ok(())
    }

    fn write(&mut self, out: &mut dyn Write) -> anyhow::Result<()> {
        out.write_all(&self.gz)?;
        Ok(())
    }
}

/// A profile as gzipped pprof, as `witch report --pprof` writes it.
pub fn gzipped(p: &Profile) -> anyhow::Result<Vec<u8>> {
    let run = Analysis::of(p);
    let mut r = Pprof::default();
    super::render(&mut r, &run)
}
