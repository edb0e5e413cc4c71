//! Reading witch's reports and profiles.

use crate::witch::witch_raw;
use serde_json::Value;
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The parsed output of `witch report FILE --json`.
pub struct Report {
    pub json: Value,
    pub path: PathBuf,
}

/// Run `witch report FILE --json` and parse its one JSON object.
pub fn report(profile: &Path) -> Report {
    report_with(profile, &[])
}

/// `witch report FILE --json EXTRA...` (e.g. `--top 0`), parsed.
pub fn report_with(profile: &Path, extra: &[&str]) -> Report {
    assert!(profile.exists(), "profile {} was not written", profile.display());
    let mut args = vec![OsStr::new("report"), profile.as_os_str(), OsStr::new("--json")];
    args.extend(extra.iter().map(OsStr::new));
    let r = witch_raw(&args);
    assert!(r.status.success(), "witch report failed:\n{}", r.describe());
    let json: Value = serde_json::from_slice(&r.stdout)
        .unwrap_or_else(|e| panic!("witch report --json did not print one JSON object: {e}\n{}", r.describe()));
    assert!(json.is_object(), "witch report --json printed a non-object:\n{}", r.describe());
    Report { json, path: profile.to_path_buf() }
}

/// Parse a raw profile file (the format of witchcraft/src/profile.rs).
pub fn raw_profile(path: &Path) -> Value {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_slice(&b).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// Waste and use summed over the pairs selected by some filter.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sum {
    pub waste: f64,
    pub r#use: f64,
    /// How many pairs matched.
    pub count: usize,
    /// Index in the report's pair list (sorted by waste, descending) of the
    /// first matching pair.
    pub best_rank: Option<usize>,
    /// The traps that found the matching pairs (observations, before any
    /// weighing).
    pub traps: u64,
}

impl Sum {
    /// waste / (waste + use), 0 when both are 0.
    pub fn fraction(&self) -> f64 {
        if self.waste + self.r#use > 0.0 {
            self.waste / (self.waste + self.r#use)
        } else {
            0.0
        }
    }
}

/// How many frames, innermost first, a context is searched for a source line.
/// The innermost frame should carry it; the next two are searched too, for
/// robustness to inlined frames.
pub const MATCH_DEPTH: usize = 3;

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

/// Frames of one side (`"watch"` or `"trap"`) of a pair, innermost first.
pub fn frames<'a>(pair: &'a Value, side: &str) -> &'a [Value] {
    pair[side]["frames"].as_array().map(Vec::as_slice).unwrap_or(&[])
}

/// Does the frame name source `file` (a bare file name such as `dead_loop.c`)?
pub fn frame_in_file(frame: &Value, file: &str) -> bool {
    match frame["file"].as_str() {
        Some(f) => f == file || f.ends_with(&format!("/{file}")),
        None => false,
    }
}

pub fn frame_line(frame: &Value) -> Option<u64> {
    frame["line"].as_u64()
}

/// Is `file:line` among the first [`MATCH_DEPTH`] frames of this side of the pair?
pub fn side_at(pair: &Value, side: &str, file: &str, line: u32) -> bool {
    frames(pair, side).iter().take(MATCH_DEPTH).any(|f| frame_in_file(f, file) && frame_line(f) == Some(line as u64))
}

fn fmt_frames(fr: &[Value]) -> String {
    let mut s = String::new();
    for (i, f) in fr.iter().take(4).enumerate() {
        if i > 0 {
            s.push_str(" <- ");
        }
        let func = f["function"].as_str().unwrap_or("?");
        let file = f["file"].as_str().map(|p| p.rsplit('/').next().unwrap_or(p)).unwrap_or("?");
        match f["line"].as_u64() {
            Some(l) => {
                let _ = write!(s, "{func} {file}:{l}");
            }
            None => {
                let _ = write!(s, "{func} {file}:?");
            }
        }
    }
    if fr.len() > 4 {
        let _ = write!(s, " <- ... ({} frames)", fr.len());
    }
    s
}

impl Report {
    fn field(&self, key: &str) -> f64 {
        self.json[key].as_f64().unwrap_or_else(|| panic!("report has no numeric `{key}`\n{}", self.dump()))
    }
    pub fn waste_fraction(&self) -> f64 {
        self.field("waste_fraction")
    }
    /// Waste over the run, in the report's `unit` (bytes or byte·ns).
    pub fn waste(&self) -> f64 {
        self.field("waste")
    }
    pub fn used(&self) -> f64 {
        self.field("use")
    }
    pub fn approx_waste(&self) -> f64 {
        self.field("approx_waste")
    }
    pub fn samples(&self) -> f64 {
        self.field("samples")
    }
    pub fn program(&self) -> String {
        self.json["program"].as_str().unwrap_or("").to_string()
    }
    pub fn craft(&self) -> String {
        self.json["craft"].as_str().unwrap_or("").to_string()
    }
    pub fn pairs(&self) -> &[Value] {
        self.json["pairs"].as_array().map(Vec::as_slice).unwrap_or(&[])
    }

    /// The process sections of the report: (pid, program) of each.
    pub fn processes(&self) -> Vec<(u64, String)> {
        self.json["processes"]
            .as_array()
            .map(|v| v.iter().map(|p| (p["pid"].as_u64().unwrap_or(0), p["program"].as_str().unwrap_or("").to_string())).collect())
            .unwrap_or_default()
    }

    /// The report cut down to one process section, by pid: its pairs, its
    /// totals and samples, as if it were alone in the profile.
    pub fn process(&self, pid: u64) -> Report {
        let mut json = self.json.clone();
        let pairs: Vec<Value> = self.pairs().iter().filter(|p| p["pid"].as_u64() == Some(pid)).cloned().collect();
        let waste: f64 = pairs.iter().map(|p| num(&p["waste"])).sum();
        let used: f64 = pairs.iter().map(|p| num(&p["use"])).sum();
        let section =
            self.json["processes"].as_array().and_then(|v| v.iter().find(|p| p["pid"].as_u64() == Some(pid)).cloned()).unwrap_or_default();
        json["pairs"] = Value::from(pairs);
        json["waste"] = waste.into();
        json["use"] = used.into();
        json["samples"] = section["samples"].clone();
        json["traps"] = section["traps"].clone();
        json["program"] = section["program"].clone();
        json["waste_fraction"] = section["waste_fraction"].clone();
        Report { json, path: self.path.clone() }
    }

    /// Sum the pairs accepted by `pred`.
    pub fn sum_where(&self, pred: impl Fn(&Value) -> bool) -> Sum {
        let mut s = Sum::default();
        for (i, p) in self.pairs().iter().enumerate() {
            if pred(p) {
                s.waste += num(&p["waste"]);
                s.r#use += num(&p["use"]);
                s.count += 1;
                s.traps += p["traps"].as_u64().unwrap_or(0);
                s.best_rank.get_or_insert(i);
            }
        }
        s
    }

    /// The pairs ⟨file:watch, file:trap⟩.
    pub fn pair(&self, file: &str, watch: u32, trap: u32) -> Sum {
        self.sum_where(|p| side_at(p, "watch", file, watch) && side_at(p, "trap", file, trap))
    }

    /// Every pair whose watch context is at file:watch, whatever the trap.
    pub fn watched_at(&self, file: &str, watch: u32) -> Sum {
        self.sum_where(|p| side_at(p, "watch", file, watch))
    }

    /// How much of what the accesses at file:watch are worth went to
    /// ⟨file:watch, file:trap⟩: the pair's waste over the waste and use of
    /// every pair watched at file:watch. Returns it with those two sums.
    pub fn own_fraction(&self, file: &str, watch: u32, trap: u32) -> (f64, Sum, Sum) {
        let pair = self.pair(file, watch, trap);
        let from = self.watched_at(file, watch);
        (pair.waste / (from.waste + from.r#use).max(f64::MIN_POSITIVE), pair, from)
    }

    /// Fails unless ⟨file:watch, file:trap⟩ holds at least `min` of what the
    /// stores at file:watch are worth ([`Report::own_fraction`]); `what`
    /// (empty, or ending in ": ") names the run in the note and the failure.
    /// Returns the fraction and the pair.
    pub fn assert_own_fraction(&self, file: &str, watch: u32, trap: u32, min: f64, what: &str) -> (f64, Sum) {
        let (own, pair, from) = self.own_fraction(file, watch, trap);
        self.note(&format!("{what}<{watch},{trap}> own fraction {own:.3}, rank {:?}", pair.best_rank));
        assert!(
            own >= min,
            "{what}<{file}:{watch}, {file}:{trap}> should hold >= {:.0}% of what the stores at line {watch} are worth; got {own:.3} \
             (pair {pair:?}, all pairs watched at {watch}: {from:?})\n{}",
            min * 100.0,
            self.dump()
        );
        (own, pair)
    }

    /// Share of all waste that went to ⟨file:watch, file:trap⟩.
    pub fn share(&self, file: &str, watch: u32, trap: u32) -> f64 {
        let total = self.waste();
        if total > 0.0 {
            self.pair(file, watch, trap).waste / total
        } else {
            0.0
        }
    }

    /// The first (largest) pair ⟨file:watch, file:trap⟩, if any.
    pub fn first_pair(&self, file: &str, watch: u32, trap: u32) -> Option<&Value> {
        self.pairs().iter().find(|p| side_at(p, "watch", file, watch) && side_at(p, "trap", file, trap))
    }

    /// Print the headline figures and `extra` (shown with `--nocapture`), so
    /// passing runs also tell how close they came to their thresholds.
    pub fn note(&self, extra: &str) {
        eprintln!(
            "[witch-tests] {}: samples {} traps {} waste_fraction {:.3} approx {:.3e} / waste {:.3e}; {extra}",
            self.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            self.json["samples"],
            self.json["traps"],
            self.json["waste_fraction"].as_f64().unwrap_or(f64::NAN),
            self.json["approx_waste"].as_f64().unwrap_or(f64::NAN),
            self.json["waste"].as_f64().unwrap_or(f64::NAN),
        );
    }

    /// Fails unless the profile holds at least `min` samples.
    pub fn assert_samples(&self, min: f64) {
        let n = self.samples();
        assert!(
            n >= min,
            "only {n} samples (want >= {min}); if witch runs fine, check that gcc still puts each \
             store right after its chase load (see the docs at the top of tests/src/lib.rs)\n{}",
            self.dump()
        );
    }

    /// A readable dump for failure messages: a table of the top pairs, then
    /// the JSON report with its pair list cut to the top pairs.
    pub fn dump(&self) -> String {
        const TOP: usize = 12;
        let mut s = format!("=== report of {} ===\n", self.path.display());
        let pairs = self.pairs();
        for (i, p) in pairs.iter().take(TOP).enumerate() {
            let _ = writeln!(
                s,
                "#{i:<2} waste={:<12.4e} use={:<12.4e} share={:.3}\n     watch: {}\n     trap:  {}",
                num(&p["waste"]),
                num(&p["use"]),
                num(&p["share"]),
                fmt_frames(frames(p, "watch")),
                fmt_frames(frames(p, "trap"))
            );
        }
        if pairs.len() > TOP {
            let _ = writeln!(s, "... {} more pairs", pairs.len() - TOP);
        }
        // The JSON report itself, with each pair on one line.
        let mut head = self.json.clone();
        if let Some(o) = head.as_object_mut() {
            o.insert("pairs".into(), Value::from(format!("[{} pairs, top {} below]", pairs.len(), pairs.len().min(TOP))));
        }
        let _ = writeln!(s, "--- JSON report ---");
        s.push_str(&serde_json::to_string_pretty(&head).unwrap_or_default());
        for p in pairs.iter().take(TOP) {
            let _ = write!(s, "\n{p}");
        }
        s
    }
}

/// The profile written at `main` (`<stem>.json`) and the ones written next to
/// it for other processes and images (`<stem>.<pid>[.<k>].json`), sorted.
pub fn profiles_near(main: &Path) -> Vec<PathBuf> {
    let dir = main.parent().unwrap_or(Path::new("."));
    let name = main.file_name().unwrap().to_string_lossy().into_owned();
    let stem = name.strip_suffix(".json").unwrap_or(&name).to_string();
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| {
                    let n = p.file_name().unwrap().to_string_lossy();
                    n == name.as_str() || (n.starts_with(&format!("{stem}.")) && n.ends_with(".json"))
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}
