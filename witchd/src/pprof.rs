//! pprof export (perftools.profiles, gzipped), so any pprof viewer shows the pairs.
//!
//! Messages are declared by hand with prost's derive: no protoc or build script.
//! Each pair becomes samples whose stack is Witch's synthetic calling context
//! (§4.6.5): watch context, then a relation frame, then trap context. pprof stacks are
//! leaf first, so location_id = trap frames (innermost first), the relation, then watch
//! frames (innermost first): the path root→leaf reads main→…→watch→KILLED_BY→main→…→trap.

use crate::symbolize::{Frame, Symbolizer};
use flate2::write::GzEncoder;
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use witchcraft::profile::Profile as WitchProfile;

#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
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
    out: Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(String, String), u64>,
    locations: HashMap<u64, u64>,
    relations: HashMap<&'static str, u64>,
}

impl Builder {
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

    /// One location per runtime address, carrying its inlined frames.
    fn location(&mut self, addr: u64, frames: &[Frame], mapping_id: u64) -> u64 {
        if let Some(&id) = self.locations.get(&addr) {
            return id;
        }
        let id = self.out.location.len() as u64 + 1;
        let line = frames
            .iter()
            .map(|f| Line {
                function_id: self.function(&f.function, f.file.as_deref().unwrap_or("")),
                line: f.line.unwrap_or(0) as i64,
                column: 0,
            })
            .collect();
        self.out.location.push(Location { id, mapping_id, address: addr, line, is_folded: false });
        self.locations.insert(addr, id);
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

/// Builds the pprof message. Values are bytes rounded to integers.
pub fn build(p: &WitchProfile, sym: &mut Symbolizer) -> Profile {
    let mut b = Builder {
        out: Profile { string_table: vec![String::new()], ..Default::default() },
        strings: HashMap::from([(String::new(), 0)]),
        functions: HashMap::new(),
        locations: HashMap::new(),
        relations: HashMap::new(),
    };
    let bytes = b.s("bytes");
    let (waste, used) = (b.s("waste"), b.s("use"));
    b.out.sample_type = vec![ValueType { r#type: waste, unit: bytes }, ValueType { r#type: used, unit: bytes }];
    b.out.default_sample_type = waste;
    let (pt, pu) = (b.s(&p.sampler.event), b.s(&p.sampler.unit));
    b.out.period_type = Some(ValueType { r#type: pt, unit: pu });
    b.out.period = p.sampler.period as i64;
    b.out.time_nanos = p.start_unix_ns as i64;
    b.out.duration_nanos = p.duration_ns as i64;
    let comment = format!("witch {} {} (pid {})", p.craft.name(), p.program, p.pid);
    let c = b.s(&comment);
    b.out.comment.push(c);

    for (i, m) in p.modules.iter().enumerate() {
        let (f, id) = (b.s(&m.path), b.s(m.build_id.as_deref().unwrap_or("")));
        b.out.mapping.push(Mapping {
            id: i as u64 + 1,
            memory_start: m.start,
            memory_limit: m.end,
            // Where the mapping starts in the file; unknown (0) without the file. Frames
            // carry their functions and lines, so viewers need not symbolize again.
            file_offset: crate::symbolize::file_offset(Path::new(&m.path), m.start.wrapping_sub(m.bias)).unwrap_or(0),
            filename: f,
            build_id: id,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
        });
    }
    let mapping_of = |a: u64| p.modules.iter().position(|m| m.start <= a && a < m.end).map_or(0, |i| i as u64 + 1);
    let thread_key = b.s("thread");

    for t in &p.threads {
        for pair in &t.pairs {
            let mut locs = |b: &mut Builder, node: u32| -> Vec<u64> {
                WitchProfile::context(t, node)
                    .into_iter()
                    .map(|a| {
                        let fr = sym.frames(a);
                        b.location(a, &fr, mapping_of(a))
                    })
                    .collect()
            };
            let watch = locs(&mut b, pair.watch);
            let trap = locs(&mut b, pair.trap);
            let w = (pair.waste + pair.approx_waste).round() as i64;
            let u = pair.r#use.round() as i64;
            for (rel, value) in [(p.craft.relation(), [w, 0]), (USED_BY, [0, u])] {
                if value == [0, 0] {
                    continue;
                }
                let mut ids = trap.clone();
                ids.push(b.relation(rel));
                ids.extend(&watch);
                b.out.sample.push(Sample {
                    location_id: ids,
                    value: value.to_vec(),
                    label: vec![Label { key: thread_key, str: 0, num: t.tid as i64, num_unit: 0 }],
                });
            }
        }
    }
    b.out
}

/// Writes the gzipped pprof file.
pub fn write(p: &WitchProfile, sym: &mut Symbolizer, path: &Path) -> anyhow::Result<()> {
    use prost::Message;
    let msg = build(p, sym);
    let f = std::fs::File::create(path).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    let mut gz = GzEncoder::new(std::io::BufWriter::new(f), flate2::Compression::default());
    gz.write_all(&msg.encode_to_vec())?;
    gz.finish()?.flush()?;
    Ok(())
}
