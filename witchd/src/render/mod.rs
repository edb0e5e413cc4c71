//! Every output format behind one trait ([`Recorder`], py-spy's model): a
//! recorder takes in an analysed run, then writes itself out.
//!
//! - [`text`]: the report a person reads top-down;
//! - [`json`]: one JSON object with stable fields;
//! - [`pprof`]: gzipped pprof (perftools.profiles);
//! - [`flame`]: folded stacks and SVG flame graphs.

pub mod flame;
pub mod json;
mod observed;
pub mod pprof;
pub mod text;
pub mod units;
mod width;

use crate::analysis::Analysis;
use std::io::Write;

/// One output format. A recorder may keep the run it was given and write
/// straight from it, so a large output is streamed, never held whole.
pub trait Recorder<'a> {
    /// Takes in an analysed run.
    fn record(&mut self, run: &'a Analysis<'a>) -> anyhow::Result<()>;
    /// Writes out what was recorded.
    fn write(&mut self, out: &mut dyn Write) -> anyhow::Result<()>;
}

/// A run's report as text or JSON, as the run commands offer it.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Human-readable report for a terminal
    Text,
    /// One JSON object (fields: see `witch report --help`)
    Json,
}

/// Records one run into a recorder and returns its output.
pub fn render<'a>(r: &mut dyn Recorder<'a>, run: &'a Analysis<'a>) -> anyhow::Result<Vec<u8>> {
    r.record(run)?;
    let mut out = Vec::new();
    r.write(&mut out)?;
    Ok(out)
}

/// Writes a recorder's output to a file (atomically, see
/// [`crate::write::file`]: a failure, a full disk too, names the file and
/// leaves nothing behind).
pub fn write_file(r: &mut dyn Recorder<'_>, path: &std::path::Path) -> anyhow::Result<()> {
    crate::write::file(path, |w| r.write(w))
}
