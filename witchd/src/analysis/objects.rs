//! Data objects at source level: the raw objects of a profile's threads
//! (`witchcraft::profile::DataRef`) resolved and merged, each with the sums
//! of the credits that touched it.
//!
//! - an address is looked up offline in the process's modules: the data
//!   symbol of the module whose loadable segment holds it (a static
//!   object), else it is unknown (heap below the tracking threshold, an
//!   anonymous mapping, another thread's stack);
//! - every thread's stack is one object, "stack";
//! - a heap block is named by the calling context of its allocation: its
//!   innermost frame outside the C and language runtimes (the program's
//!   call to `malloc`), so every block allocated there is one object.

use super::context::{FrameId, Interner};
use super::interval::Sums;
use crate::symbolize::{module_name, DataSymbol, Symbolizer};
use std::collections::HashMap;
use witchcraft::profile::{DataRef, Profile};

/// What kind of data an object is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ObjectKind {
    Static,
    Stack,
    Heap,
    Unknown,
}

impl ObjectKind {
    pub fn name(self) -> &'static str {
        match self {
            ObjectKind::Static => "static",
            ObjectKind::Stack => "stack",
            ObjectKind::Heap => "heap",
            ObjectKind::Unknown => "unknown",
        }
    }
}

/// One data object of a process, merged over its threads.
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    pub kind: ObjectKind,
    /// What people read: `table (prog)`, `stack`, `heap from main
    /// (prog.c:12)`, `unknown`.
    pub name: String,
    /// What identifies it across runs (a diff matches objects by it).
    pub key: String,
    /// Static: the symbol's size; heap: the largest block seen (bytes).
    pub size: Option<u64>,
    /// Heap: the allocation's calling context, innermost first.
    pub site: Vec<FrameId>,
    /// Every credit that touched it.
    pub sums: Sums,
}

/// Resolves a process's raw objects, once each.
pub struct Resolver<'m> {
    modules: &'m Profile,
    statics: HashMap<u64, Option<DataSymbol>>,
}

impl<'m> Resolver<'m> {
    pub fn new(p: &'m Profile) -> Resolver<'m> {
        Resolver { modules: p, statics: HashMap::new() }
    }

    /// The identity, kind, name, size and site of a raw object.
    pub fn resolve(
        &mut self,
        r: &DataRef,
        sym: &mut Symbolizer,
        names: &mut Interner,
        frames_of: &mut impl FnMut(u64, &mut Symbolizer, &mut Interner) -> Box<[FrameId]>,
    ) -> Resolved {
        match r {
            DataRef::Stack => ("stack".into(), ObjectKind::Stack, "stack".into(), None, Vec::new()),
            DataRef::Address { addr } => {
                let list = &self.modules.modules;
                let found = self.statics.entry(*addr).or_insert_with(|| sym.data_object(list, *addr)).clone();
                match found {
                    Some(d) => {
                        let m = module_name(&d.module).to_string();
                        let (name, key) = match &d.name {
                            Some(n) => (format!("{n} ({m})"), format!("static:{m}:{n}")),
                            None => (format!("{m}+{:#x}", d.offset), format!("static:{m}+{:#x}", d.offset)),
                        };
                        (key, ObjectKind::Static, name, (d.size > 0).then_some(d.size), Vec::new())
                    }
                    None => ("unknown".into(), ObjectKind::Unknown, "unknown".into(), None, Vec::new()),
                }
            }
            DataRef::Heap { size, site, .. } => {
                let frames: Vec<FrameId> = site.iter().flat_map(|&pc| frames_of(pc, sym, names).into_vec()).collect();
                let own = frames.iter().copied().find(|&f| !super::summary::is_runtime(names.get(f))).or(frames.first().copied());
                let name = match own {
                    Some(f) => format!("heap from {}", names.get(f).display()),
                    None => "heap (allocation site unknown)".into(),
                };
                let key = format!("heap:{}", frames.iter().map(|&f| names.get(f).key()).collect::<Vec<_>>().join(";"));
                (key, ObjectKind::Heap, name, Some(*size), frames)
            }
        }
    }
}

/// A raw object resolved: its key, kind, name, size and allocation site.
pub type Resolved = (String, ObjectKind, String, Option<u64>, Vec<FrameId>);

/// Adds a credit to the object `key`, made on first sight.
pub fn add(out: &mut Vec<Object>, index: &mut HashMap<String, usize>, resolved: Resolved, sums: &Sums) -> usize {
    let (key, kind, name, size, site) = resolved;
    match index.get(&key) {
        Some(&i) => {
            let o = &mut out[i];
            o.sums.add(sums);
            if kind == ObjectKind::Heap {
                o.size = o.size.max(size);
            }
            i
        }
        None => {
            index.insert(key.clone(), out.len());
            out.push(Object { kind, name, key, size, site, sums: *sums });
            out.len() - 1
        }
    }
}

/// Every process's objects merged by key (a fork child's copy of a static
/// array is the same object), heaviest first, each with the pids it was
/// seen in.
pub fn merged(run: &super::Analysis) -> Vec<(Object, Vec<u32>)> {
    merged_of(&run.procs)
}

/// [`merged`] over some processes.
pub fn merged_of(procs: &[super::Process]) -> Vec<(Object, Vec<u32>)> {
    let mut out: Vec<(Object, Vec<u32>)> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for x in procs {
        for o in &x.objects {
            match index.get(o.key.as_str()) {
                Some(&i) => {
                    out[i].0.sums.add(&o.sums);
                    out[i].0.size = out[i].0.size.max(o.size);
                    if !out[i].1.contains(&x.profile.pid) {
                        out[i].1.push(x.profile.pid);
                    }
                }
                None => {
                    index.insert(&o.key, out.len());
                    out.push((o.clone(), vec![x.profile.pid]));
                }
            }
        }
    }
    out.sort_by(|a, b| b.0.sums.waste.total_cmp(&a.0.sums.waste).then(b.0.sums.r#use.total_cmp(&a.0.sums.r#use)));
    out
}

/// Does any process of the run carry objects (profiles from before them,
/// and exact runs, do not)?
pub fn kept(run: &super::Analysis) -> bool {
    kept_in(&run.procs)
}

/// [`kept`] in some processes.
pub fn kept_in(procs: &[super::Process]) -> bool {
    procs.iter().any(|x| x.profile.threads.iter().any(|t| !t.objects.is_empty()))
}
