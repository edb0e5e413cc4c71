//! `witch daemon ...`: talk to a running witchd over its Unix socket.

use clap::Args;

/// Talk to the witchd daemon
#[derive(Args, Debug, Clone)]
pub struct DaemonArgs {
    /// status | list | fetch | profile
    pub action: String,
}

pub fn run(_a: &DaemonArgs) -> anyhow::Result<i32> {
    anyhow::bail!("witch daemon: not built yet")
}
