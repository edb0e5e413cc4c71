//! `witch report PROFILE`: render a saved profile as text, JSON, pprof,
//! folded stacks or a flame graph.

use crate::analysis::{self, Analysis};
use crate::cli::ReportArgs;
use crate::render::{self, flame, pprof, text, Format, Recorder};
use anyhow::{bail, Context};
use std::path::Path;
use witchcraft::profile::Profile;

/// Summary lines shown in text when --top is not given.
pub const TOP_LINES: usize = 10;

/// A run's report as text or JSON. `top`: summary lines (and, for JSON, pairs)
/// kept, None for the default (10 lines in text, everything in JSON); `pairs`:
/// pairs the text shows in full.
pub fn render(p: &Profile, top: Option<usize>, pairs: usize, format: Format) -> anyhow::Result<String> {
    let run = Analysis::of(p);
    let mut r = recorder(format, top, pairs);
    let out = render::render(&mut *r, &run)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

fn recorder<'a>(format: Format, top: Option<usize>, pairs: usize) -> Box<dyn Recorder<'a> + 'a> {
    match format {
        Format::Text => Box::new(text::Text::new(top.unwrap_or(TOP_LINES)).pairs(pairs)),
        Format::Json => Box::new(render::json::Json::new(top.unwrap_or(0))),
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
        analysis::load(path)?
    };
    analysis::computable(&p).with_context(|| path.display().to_string())?;
    Ok(p)
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
        recorder(if a.json { Format::Json } else { Format::Text }, a.top, a.pairs)
    };
    main.record(&run)?;
    crate::print_with(|w| main.write(w))?;
    Ok(0)
}
