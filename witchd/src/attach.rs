//! `witch CRAFT --pid PID`: profile a process that is already running.
//!
//! The target is stopped briefly with ptrace, made to `dlopen` the agent
//! (once; a later attach reuses it) and to call `witch_attach(config)`.
//! The agent's control thread then sets up every thread itself and, when
//! asked to detach (a file in the session directory), disarms everything,
//! restores the signal handlers and writes the profile there.

use anyhow::{bail, Result};
use std::path::PathBuf;
use std::time::Duration;
use witchcraft::profile::{Craft, Profile};

/// What to profile with; the same knobs as a run.
#[derive(Clone, Debug)]
pub struct Options {
    pub craft: Craft,
    pub period: Option<u64>,
    /// `task-clock`, `cpu-clock` or a PMU event spec; None = automatic.
    pub event: Option<String>,
    pub debug_registers: Option<u32>,
    /// `reservoir`, `oldest`, `newest` or `empty-only`.
    pub replacement: String,
    pub fp_precision: f64,
}

/// An agent session running inside a target process.
pub struct Session {
    pub pid: i32,
    pub dir: PathBuf,
}

/// How a session ended.
pub struct Ended {
    /// None when the target died before it could write one (e.g. SIGKILL).
    pub profile: Option<Profile>,
    /// The target exited during the session (its profile, if any, is its last).
    pub target_exited: bool,
}

pub fn attach(pid: i32, opts: &Options) -> Result<Session> {
    let _ = (pid, opts);
    bail!("attach is being implemented")
}

impl Session {
    pub fn target_alive(&self) -> bool {
        unsafe { libc::kill(self.pid, 0) == 0 || *libc::__errno_location() == libc::EPERM }
    }

    /// Ask the agent to stop and wait (at most `timeout`) for its profile.
    pub fn detach(self, timeout: Duration) -> Result<Ended> {
        let _ = timeout;
        bail!("attach is being implemented")
    }
}

pub fn craft_name(c: Craft) -> &'static str {
    c.name()
}
