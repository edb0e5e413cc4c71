//! `witchd`: watch processes for wasted memory operations, continuously.
//!
//! The work is in the library (`witchd::daemon`); this is its command line
//! (declared in `witchd::daemon::args`).
#![warn(clippy::undocumented_unsafe_blocks)]

use clap::Parser;
use witchd::daemon::{self, args::Args, config::DaemonConfig};

fn main() {
    let a = Args::parse();
    let cfg = match DaemonConfig::load(&a.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("witchd: {e:#}");
            std::process::exit(2);
        }
    };
    if a.check {
        println!("{}: ok ({} watch rules)", a.config.display(), cfg.watch.len());
        return;
    }
    if let Err(e) = daemon::run(cfg) {
        eprintln!("witchd: {e:#}");
        std::process::exit(2);
    }
}
