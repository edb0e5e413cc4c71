//! `witch report PROFILE`: render a saved profile as text, JSON, pprof,
//! folded stacks or a flame graph.

use crate::analysis::{self, Analysis};
use crate::cli::ReportArgs;
use crate::render::{self, flame, pprof, text, Format, Recorder};
use anyhow::{bail, Context};
use std::path::Path;
use witchcraft::profile::{LoadError, Profile};

/// Summary lines shown in text when --top is not given.
pub const TOP_LINES: usize = 10;

/// A run's report as text or JSON. `top`: summary lines (and, for JSON, pairs)
/// kept, None for the default (10 lines in text, everything in JSON); `pairs`:
/// pairs the text shows in full; `file`: the profile's file, which JSON names.
/// `objects`: the text shows the data objects with the most waste.
pub fn render(p: &Profile, top: Option<usize>, pairs: usize, objects: bool, format: Format, file: Option<&Path>) -> anyhow::Result<String> {
    let run = Analysis::of(p);
    let mut r = recorder(format, top, pairs, objects, file);
    let out = render::render(&mut *r, &run)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

fn recorder<'a>(format: Format, top: Option<usize>, pairs: usize, objects: bool, file: Option<&Path>) -> Box<dyn Recorder<'a> + 'a> {
    match format {
        Format::Text => Box::new(text::Text::new(top.unwrap_or(TOP_LINES)).pairs(pairs).objects(objects)),
        Format::Json => Box::new(render::json::Json::new(top.unwrap_or(0)).profile(file)),
    }
}

/// A profile file, or the directory of parts an interrupted run left, as one
/// run: what `report`, `diff` and `gate` read.
/// A run whose figures cannot be computed is refused ([`analysis::computable`]).
pub fn load(path: &Path) -> anyhow::Result<Profile> {
    let p = if path.is_dir() {
        let parts = super::output::read_parts(path);
        match super::output::merge(parts, None) {
            Some(p) => p,
            None => bail!("{}: a directory with no readable profile in it", path.display()),
        }
    } else {
        match analysis::load(path) {
            Ok(p) => p,
            Err(e) => match e.root_cause().downcast_ref::<LoadError>() {
                Some(LoadError::Corrupt(_) | LoadError::NotProfile(_)) => match what_is(path) {
                    Some(what) => bail!("{}: {what}", path.display()),
                    None => return Err(e),
                },
                _ => return Err(e),
            },
        }
    };
    analysis::computable(&p).with_context(|| path.display().to_string())?;
    Ok(p)
}

/// What a file that is not a profile is, when witch wrote it, and what to
/// give `report`, `diff` and `gate` instead: every file witch writes is
/// either read back by them or named by this. None: not one of witch's.
pub fn what_is(path: &Path) -> Option<String> {
    use serde_json::Value;
    let m = std::fs::metadata(path).ok()?;
    if !m.is_file() || m.len() > witchcraft::profile::MAX_FILE_BYTES {
        return None;
    }
    let data = std::fs::read(path).ok()?;
    if data.starts_with(&[0x1f, 0x8b]) {
        return Some("a gzip file, such as a pprof profile from `witch report --pprof` (read it with `go tool pprof`), not a witch profile: give the profile JSON file a run wrote".into());
    }
    let text = std::str::from_utf8(&data).ok()?.trim_start();
    if text.starts_with('<') {
        return Some("an XML file, such as a flame graph (--flamegraph) or gate's JUnit report (--junit), not a witch profile: give the profile JSON file a run wrote".into());
    }
    let v: Value = serde_json::from_str(text).ok()?;
    let has = |o: &Value, keys: &[&str]| keys.iter().all(|k| o.get(k).is_some());
    let s = |o: &Value, k: &str| o.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
    let crafts = ["dead", "silent-store", "silent-load"];
    if has(&v, &["base", "new", "waste_fraction_change"]) {
        let (b, n) = (s(&v["base"], "file"), s(&v["new"], "file"));
        return Some(format!("the JSON output of `witch diff`, not a profile: give the profiles it compared ({b} and {n})"));
    }
    if has(&v, &["waste_fraction", "lines", "pairs", "craft"]) && v.get("threads").is_some_and(Value::is_u64) {
        let craft = s(&v, "craft");
        let program = s(&v, "program");
        let name = Path::new(&program).file_name().map_or(program.clone(), |n| n.to_string_lossy().into_owned());
        let pid = v.get("pid").and_then(Value::as_u64).unwrap_or(0);
        let profile = match v.get("profile").and_then(Value::as_str) {
            Some(f) => f.to_string(),
            None if crafts.contains(&craft.as_str()) => format!("witch-{craft}-{name}-{pid}.json, unless the run was given -o"),
            None => "the JSON file the run wrote".into(),
        };
        return Some(format!(
            "the JSON report of a `witch {craft}` run of {name} (pid {pid}), written by --json or --json-out, not a profile: give the profile that run wrote ({profile})"
        ));
    }
    let first = v.as_array().and_then(|a| a.first());
    if first.is_some_and(|e| has(e, &["name", "status", "detail"])) {
        return Some("the JSON output of `witch doctor`, not a profile".into());
    }
    if let Some(e) = first
        .filter(|e| has(e, &["id", "pid", "craft", "stored_unix_ns"]))
        .or(Some(&v).filter(|e| has(e, &["id", "pid", "craft", "stored_unix_ns"])))
    {
        let id = s(e, "id");
        return Some(format!(
            "witchd's record of its stored profiles (`witch daemon list --json`, or a store's .meta file), not a profile: fetch one with `witch daemon fetch {id} -o FILE`"
        ));
    }
    if v.as_array().is_some_and(Vec::is_empty) {
        return Some("an empty JSON list (`witch daemon list --json` with no profiles?), not a profile".into());
    }
    if has(&v, &["uptime_s", "store_dir", "sessions_active"]) {
        return Some("witchd's status (`witch daemon status --json`), not a profile: list its profiles with `witch daemon list`".into());
    }
    None
}

pub fn run(a: &ReportArgs) -> anyhow::Result<i32> {
    let p = load(&a.file)?;
    if let Some(out) = &a.save {
        super::output::save(&p, out)?;
        crate::say!("witch: wrote profile {}", out.display());
    }
    let run = Analysis::of(&p);
    if let Some(out) = &a.pprof {
        let mut r = pprof::Pprof::new(a.pprof_leaf);
        r.record(&run)?;
        render::write_file(&mut r, out)?;
        crate::say!("witch: wrote pprof profile {}", out.display());
    }
    if let Some(out) = &a.flamegraph {
        let mut r = flame::FlameGraph::new(a.view);
        r.record(&run)?;
        render::write_file(&mut r, out)?;
        crate::say!("witch: wrote flame graph {}", out.display());
    }
    let mut main: Box<dyn Recorder> = if a.folded {
        Box::new(flame::Folded::new(a.view))
    } else {
        recorder(a.format(), a.top, a.pairs, a.objects, Some(a.save.as_deref().unwrap_or(&a.file)))
    };
    main.record(&run)?;
    crate::print_with(|w| main.write(w))?;
    Ok(0)
}
