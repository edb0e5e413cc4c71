//! `witchd`'s command line, here in the library so that `witch man` and
//! `witch completions` generate its manual page and completions too.

use clap::Parser;
use std::path::PathBuf;

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
(Unix socket) and over HTTP (pprof, Prometheus /metrics). SIGTERM, SIGINT or SIGHUP (no reload) detaches from
every target, then exits 0. Exit status 2: bad config or cannot start."
)]
pub struct Args {
    /// The configuration file (TOML)
    #[arg(short, long, value_name = "FILE", default_value = "/etc/witchd.toml")]
    pub config: PathBuf,
    /// Check the configuration and exit
    #[arg(long)]
    pub check: bool,
}
