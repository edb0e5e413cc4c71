//! `witch`: run a program under the Witch engine, and read, compare and gate its profiles.

use clap::{CommandFactory, Parser};
use witchcraft::profile::Craft;
use witchd::cli::{self, Cli, Command, Format, ReportArgs};
use witchd::{diff, doctor, flame, gate, model, pprof, print, report, run, symbolize};

fn main() {
    let cli = Cli::parse(); // usage errors exit 2, --help/--version exit 0
    let code = match dispatch(cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("witch: {e:#}");
            2
        }
    };
    std::process::exit(code);
}

fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Dead(a) => craft(Craft::Dead, &a),
        Command::SilentStore(a) => craft(Craft::SilentStore, &a),
        Command::SilentLoad(a) => craft(Craft::SilentLoad, &a),
        Command::Report(a) => report(&a),
        Command::Diff(a) => diff::run(&a),
        Command::Gate(a) => gate::run(&a),
        Command::Doctor(a) => doctor::run(&a),
        Command::Daemon(a) => witchd::daemon::client::run(&a),
    }
}

fn craft(c: Craft, a: &cli::RunArgs) -> anyhow::Result<i32> {
    // PROGRAM is optional to clap only so that `-e list` needs none.
    if a.command.is_empty() && a.pid.is_none() && a.event.as_deref() != Some("list") {
        let mut cmd = Cli::command();
        let sub = cmd.find_subcommand_mut(c.name()).expect("craft subcommand").clone();
        sub.bin_name(format!("witch {}", c.name()))
            .error(clap::error::ErrorKind::MissingRequiredArgument, format!("no PROGRAM given: try `witch {} ./app`", c.name()))
            .exit();
    }
    run::run(c, a)
}

fn report(a: &ReportArgs) -> anyhow::Result<i32> {
    let p = model::load(&a.file)?;
    let mut sym = symbolize::Symbolizer::new(&p.modules);
    let pairs = model::pairs(&p, &mut sym);
    if let Some(out) = &a.pprof {
        pprof::write(&p, &mut sym, out)?;
        eprintln!("witch: wrote pprof profile {}", out.display());
    }
    let folded = if a.folded || a.flamegraph.is_some() { flame::folded(&p, &pairs) } else { Vec::new() };
    if let Some(out) = &a.flamegraph {
        flame::svg(&p, &folded, out)?;
        eprintln!("witch: wrote flame graph {}", out.display());
    }
    if a.folded {
        let mut s = folded.join("\n");
        if !s.is_empty() {
            s.push('\n');
        }
        print(&s)?;
    } else {
        let f = if a.json { Format::Json } else { Format::Text };
        print(&report::render_pairs(&p, &pairs, a.top, f)?)?;
    }
    Ok(0)
}
