//! `witch`: run a program under the Witch engine, and read, compare and gate its profiles.
#![warn(clippy::undocumented_unsafe_blocks)]

use clap::{CommandFactory, Parser};
use witchcraft::profile::Craft;
use witchd::cli::{Cli, Command, RunArgs};
use witchd::{cmd, exit};

/// Does the command line run a program (a craft without --pid)? Then witch's
/// own failures must not look like the program's exit status.
fn runs_a_program(args: &[String]) -> bool {
    let craft = args.get(1).is_some_and(|c| ["dead", "silent-store", "silent", "silent-load", "load"].contains(&c.as_str()));
    craft && !args.iter().skip(2).take_while(|a| *a != "--").any(|a| a == "--pid" || a.starts_with("--pid="))
}

/// Before the Rust runtime starts (it opens `/dev/null` on any closed
/// standard descriptor, and ignores SIGPIPE): what witch was started with,
/// so that the program witch runs starts with it too.
#[used]
#[link_section = ".init_array"]
static NOTE_INHERITED: extern "C" fn() = note_inherited;

extern "C" fn note_inherited() {
    witchd::cmd::launch::note_inherited();
}

/// Out of memory, witch says so and exits with its error status.
#[global_allocator]
static ALLOCATOR: exit::OutOfMemory = exit::OutOfMemory;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let failed = if runs_a_program(&args) { exit::FAILED } else { exit::ERROR };
    exit::on_out_of_memory(failed);
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) if !e.use_stderr() => e.exit(), // --help, --version: exit 0
        Err(e) => {
            match unknown_option(&e, &args) {
                Some(line) => witchd::say!("{line}"),
                None => {
                    let _ = e.print();
                }
            }
            std::process::exit(failed);
        }
    };
    let code = match dispatch(cli) {
        Ok(c) => c,
        Err(e) => {
            witchd::say!("witch: {e:#}");
            exit::code_of(&e, failed)
        }
    };
    std::process::exit(code);
}

/// An unknown option as one line: which command refused it, the option it
/// may have meant, and, for a craft, where the program's own options go
/// (after the program: `witch dead ./app --its-flag`). clap's own message
/// (five lines, with a tip to pass it after `--`, which would make it the
/// program's name) is kept for every other error.
fn unknown_option(e: &clap::Error, args: &[String]) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else { return None };
    // The command the option was given to: the subcommands named before it.
    let mut cmd = Cli::command();
    let mut name = vec!["witch".to_string()];
    for a in args.iter().skip(1) {
        match cmd.find_subcommand(a) {
            Some(sub) => {
                name.push(sub.get_name().to_string());
                cmd = sub.clone();
            }
            None if a.starts_with('-') => {}
            None => break,
        }
    }
    let name = name.join(" ");
    let similar = match e.get(ContextKind::SuggestedArg) {
        Some(ContextValue::String(s)) => format!(" (did you mean {s}?)"),
        _ => String::new(),
    };
    let craft = ["dead", "silent-store", "silent-load"].iter().any(|c| name == format!("witch {c}"));
    Some(if craft {
        format!("{name}: unknown option {arg}{similar}; witch's options go before the program, the program's own after it: {name} [OPTIONS] PROGRAM [ARGS]...")
    } else {
        format!("{name}: unknown option {arg}{similar} (see `{name} --help`)")
    })
}

fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Dead(a) => craft(Craft::Dead, &a),
        Command::SilentStore(a) => craft(Craft::SilentStore, &a),
        Command::SilentLoad(a) => craft(Craft::SilentLoad, &a),
        Command::Report(a) => cmd::report::run(&a),
        Command::Diff(a) => cmd::diff::run(&a),
        Command::Gate(a) => cmd::gate::run(&a),
        Command::Doctor(a) => cmd::doctor::run(&a),
        Command::Daemon(a) => cmd::daemon::run(&a),
        Command::Completions(a) => cmd::generate::completions(&a),
        Command::Man(a) => cmd::generate::man(&a),
    }
}

fn craft(c: Craft, a: &RunArgs) -> anyhow::Result<i32> {
    // PROGRAM is optional to clap only so that `-e list` needs none.
    if a.command.is_empty() && a.pid.is_none() && a.event.as_deref() != Some("list") {
        let mut cmd = Cli::command();
        let sub = cmd.find_subcommand_mut(c.name()).expect("craft subcommand").clone();
        let _ = sub
            .bin_name(format!("witch {}", c.name()))
            .error(clap::error::ErrorKind::MissingRequiredArgument, format!("no PROGRAM given: try `witch {} ./app`", c.name()))
            .print();
        std::process::exit(exit::FAILED);
    }
    cmd::run::run(c, a)
}
