//! The `witch` command line and the `witchd` daemon, as a library both
//! binaries share: running and attaching, reports, diffs, gates, exports.

pub mod cli;
pub mod daemon;
pub mod diff;
pub mod doctor;
pub mod flame;
pub mod gate;
pub mod inject;
pub mod model;
pub mod pprof;
pub mod report;
pub mod run;
pub mod symbolize;

use std::io::Write;

/// Writes to stdout; a reader that went away (`| head`) is not an error.
pub fn print(s: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(s.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}
