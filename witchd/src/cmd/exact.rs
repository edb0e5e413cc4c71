//! `witch CRAFT --exact PROGRAM`: single-step the program under ptrace and
//! judge every access (the reference the sampled modes are measured against).

use super::output::Output;
use crate::cli::RunArgs;
use crate::render::Format;
use anyhow::Result;
use std::ffi::OsString;
use std::path::Path;
use witchcraft::profile::Craft;

pub fn run(craft: Craft, a: &RunArgs, prog: &Path, program: &OsString, out: &Output) -> Result<i32> {
    out.probe()?;
    if !a.quiet {
        crate::say!("witch: exact mode single-steps every instruction; expect it to run thousands of times slower");
    }
    let exact = witchcraft::exact::Exact::new(craft, a.fp_precision);
    let env: Vec<(String, String)> = crate::agent::tunables().map(|t| ("GLIBC_TUNABLES".to_string(), t)).into_iter().collect();
    // On a terminal, a line that says it is alive: an exact run takes long.
    let stepped = exact.stepped();
    let progress = (!a.quiet).then(|| {
        super::launch::Progress::every_second(1.0, move |secs| {
            let n = stepped.load(std::sync::atomic::Ordering::Relaxed);
            format!("witch: exact, {n} instructions single-stepped in {secs:.0} s")
        })
    });
    let run = exact.run(prog, &a.command[1..], program, &env).map_err(|e| anyhow::anyhow!("cannot trace {}: {e}", prog.display()));
    drop(progress);
    let run = run?;
    let pid = run.profile.pid;
    let path = out.path(craft, prog, pid);
    out.save(&run.profile, &path)?;
    if !a.quiet {
        match a.format() {
            Format::Text => crate::say_raw!("{}", super::report::render(&run.profile, a.top, a.pairs, a.objects, Format::Text, None)?),
            Format::Json => {
                crate::print(&super::report::render(&run.profile, a.top, a.pairs, a.objects, Format::Json, Some(path.as_path()))?)?
            }
        }
        crate::say!("witch: {} instructions single-stepped; profile written to {}", run.instructions, path.display());
    }
    Ok(super::launch::pass_through(run.code, run.signal))
}
