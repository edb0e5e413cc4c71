//! `witchd`: watch processes for wasted memory operations, continuously.
//!
//! The work is in the library (`witchd::daemon`); this is its command line.

use clap::Parser;
use std::path::PathBuf;
use witchd::daemon::{self, config::Config};

#[derive(Parser, Debug)]
#[command(
    name = "witchd",
    version,
    about = "Watch processes for dead stores, silent stores and redundant loads, continuously",
    after_help = "\
Examples:
  witchd --config /etc/witchd.toml
  witchd --config witchd.toml --check      (validate the file, then exit)

It attaches to the processes the config names (by pid, exe or cgroup) for a short session
every so often, keeps the profiles in a bounded store, and serves them to `witch daemon ...`
(Unix socket) and over HTTP (pprof, Prometheus /metrics). SIGTERM or SIGINT detaches from
every target, then exits 0. Exit status 2: bad config or cannot start."
)]
struct Args {
    /// The configuration file (TOML)
    #[arg(short, long, value_name = "FILE", default_value = "/etc/witchd.toml")]
    config: PathBuf,
    /// Check the configuration and exit
    #[arg(long)]
    check: bool,
}

fn main() {
    let a = Args::parse();
    let cfg = match Config::load(&a.config) {
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
